#!/usr/bin/env bash
# Instructions per request, counted by callgrind: repeatable whatever else the machine does, so
# two builds (or signalbox and plain Pingora) compare exactly where a wall-clock run is noise.
#
#   load-tests/instructions.sh [BIN_DIR]    # default target/release (signalbox, signalbox-mock,
#                                           # examples/plain_pingora)
#   load-tests/instructions.sh --check [BIN_DIR]
#                                           # also fail (exit 3) when signalbox ÷ plain Pingora
#                                           # exceeds the ceiling in load-tests/instructions-ceiling
#                                           # (the guard against drift .ci/run runs)
#   SB_KEEP_DIR=/tmp/prof load-tests/instructions.sh
#                                           # keep the callgrind files there (callgrind_annotate)
#   SB_EXTRA_CONFIG='ledger: { sqlite: "@TMP@/ledger.db" }' load-tests/instructions.sh
#                                           # more config for signalbox (@TMP@: the run's temp
#                                           # dir); SB_SKIP_PINGORA=1: signalbox only
#
# For each of signalbox and plain Pingora: one worker thread, signalbox-mock as the upstream
# (no recording), 300 warm-up requests, counters zeroed, then exactly 2,000 keep-alive
# requests of 2 KiB (the body of scenario a) and a dump: total instructions / 2,000. Loopback
# only; every process is stopped at the end. Needs valgrind (callgrind_control), python3, curl.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CHECK=""
if [ "${1:-}" = "--check" ]; then CHECK=1; shift; fi
BIN="${1:-$REPO/target/release}"
N=2000
EXTRA="${SB_EXTRA_CONFIG:-}"
if [ -n "${SB_KEEP_DIR:-}" ]; then W="$SB_KEEP_DIR"; mkdir -p "$W"; else W="$(mktemp -d /tmp/sb-instr.XXXXXX)"; fi
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true; sleep 0.5; kill -9 "${pids[@]}" 2>/dev/null || true
  [ -n "${SB_KEEP_DIR:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 300); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "instructions.sh: port $1 never opened" >&2; exit 1
}
# measure NAME PROXY_PORT: warm up, zero, N requests, dump; prints instructions per request.
measure() {
  local name=$1 proxy=$2 vpid
  wait_port "$proxy"
  python3 "$REPO/load-tests/lib/fixed_client.py" "$proxy" 300 > /dev/null
  vpid=$(pgrep -f "valgrind.*$W/$name" | head -1)
  callgrind_control -z "$vpid" > /dev/null
  local ok
  ok=$(python3 "$REPO/load-tests/lib/fixed_client.py" "$proxy" "$N")
  callgrind_control -d "$vpid" > /dev/null
  sleep 1
  local total
  total=$(grep -h -m1 '^summary:' "$W/$name".*.1 | awk '{print $2}')
  [ "$ok" = "$N" ] || { echo "instructions.sh: $name answered $ok of $N" >&2; exit 1; }
  echo "$name: $((total / N)) instructions per request"
  eval "PER_${name}=$((total / N))"
}

MOCK=$(port)
"$BIN/signalbox-mock" --listen "127.0.0.1:$MOCK" --no-record --threads 1 > "$W/mock.log" 2>&1 &
pids+=($!)
wait_port "$MOCK"

PROXY=$(port); ADMIN=$(port)
cat > "$W/signalbox.yaml" <<EOC
listen: { proxy: "127.0.0.1:$PROXY", admin: "127.0.0.1:$ADMIN" }
pingora: { threads: 1, pid_file: "$W/pid", upgrade_sock: "$W/sock", grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1 }
providers:
  p: { kind: openai, base_url: "http://127.0.0.1:$MOCK/v1", credentials: [{ id: k, key_env: LT_KEY }] }
models:
  lt-model: { deployments: [{ provider: p, model: lt-upstream-model }] }
aliases: { lt: lt-model }
${EXTRA//@TMP@/$W}
EOC
LT_KEY=sk-upstream RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$W/signalbox.%p" \
  "$BIN/signalbox" -c "$W/signalbox.yaml" > "$W/signalbox.log" 2>&1 &
pids+=($!)
measure signalbox "$PROXY"

[ -n "${SB_SKIP_PINGORA:-}" ] && [ -z "$CHECK" ] && exit 0
PLAIN=$(port)
valgrind --tool=callgrind --callgrind-out-file="$W/pingora.%p" \
  "$BIN/examples/plain_pingora" "127.0.0.1:$PLAIN" "127.0.0.1:$MOCK" 1 > "$W/pingora.log" 2>&1 &
pids+=($!)
measure pingora "$PLAIN"

# The ratio, and with --check the guard: the ceiling is a ratio to plain Pingora measured in
# the same run (absolute counts move a little with the CPU's memcpy variant; the ratio does not).
ratio=$(python3 -c "print(f'{$PER_signalbox / $PER_pingora:.3f}')")
echo "signalbox / pingora: ${ratio}x"
if [ -n "$CHECK" ]; then
  ceiling=$(grep -v '^#' "$REPO/load-tests/instructions-ceiling" | head -1 | tr -d '[:space:]')
  if python3 -c "import sys; sys.exit(0 if $ratio <= $ceiling else 1)"; then
    echo "instructions.sh: ${ratio}x is within the ceiling of ${ceiling}x"
  else
    echo "instructions.sh: ${ratio}x plain Pingora exceeds the ceiling of ${ceiling}x (load-tests/instructions-ceiling): find what the request path added (SB_KEEP_DIR + callgrind_annotate), or raise the ceiling with a reason in the commit" >&2
    exit 3
  fi
fi
