#!/usr/bin/env bash
# Write system calls per request on the gateway (issue 22: one upstream send per request).
#
#   load-tests/syscalls.sh [BIN_DIR] [N]     # default target/release, 500 requests per mode
#
# Two modes, each its own gateway (one worker thread) in front of signalbox-mock:
#   driven  the 2 KiB body of scenario a, "stream": false — signalbox's own driver
#   fast    the same body, "stream": true, `failover: { first_chunk_hold: 0 }` — Pingora's
#           proxy loop
# After 50 warm-up requests, `strace -f -c` attaches to the gateway for exactly N keep-alive
# requests and counts sendto / sendmsg / write / writev (both legs: the upstream request and
# the caller's response). Loopback only; every process is stopped at the end; bounded by
# `timeout`. Needs strace, python3.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-$REPO/target/release}"
N="${2:-500}"
W="$(mktemp -d /tmp/sb-sys.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 150); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "syscalls.sh: port $1 never opened" >&2; exit 1
}

MOCK=$(port)
"$BIN/signalbox-mock" --listen "127.0.0.1:$MOCK" --no-record --threads 1 > "$W/mock.log" 2>&1 &
pids+=($!)
wait_port "$MOCK"

# run MODE EXTRA_CONFIG CLIENT_ARG
run() {
  local mode=$1 extra=$2 arg=$3 proxy admin gw st ok
  proxy=$(port); admin=$(port)
  cat > "$W/$mode.yaml" <<EOC
listen: { proxy: "127.0.0.1:$proxy", admin: "127.0.0.1:$admin" }
pingora: { threads: 1, pid_file: "$W/$mode.pid", upgrade_sock: "$W/$mode.sock", grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1 }
providers:
  p: { kind: openai, base_url: "http://127.0.0.1:$MOCK/v1", credentials: [{ id: k, key_env: LT_KEY }] }
models:
  lt-model: { deployments: [{ provider: p, model: lt-upstream-model }] }
aliases: { lt: lt-model }
$extra
EOC
  LT_KEY=sk-upstream RUST_LOG=warn "$BIN/signalbox" -c "$W/$mode.yaml" > "$W/$mode.log" 2>&1 &
  gw=$!; pids+=("$gw")
  wait_port "$proxy"
  python3 "$REPO/load-tests/lib/fixed_client.py" "$proxy" 50 $arg > /dev/null
  strace -f -c -e trace=sendto,sendmsg,write,writev -o "$W/$mode.strace" -p "$gw" 2> /dev/null &
  st=$!
  sleep 1
  ok=$(timeout 120 python3 "$REPO/load-tests/lib/fixed_client.py" "$proxy" "$N" $arg)
  kill -INT "$st"; wait "$st" 2>/dev/null || true
  kill "$gw" 2>/dev/null || true
  [ "$ok" = "$N" ] || { echo "syscalls.sh: $mode answered $ok of $N" >&2; exit 1; }
  echo "$mode ($N requests):"
  awk -v n="$N" '$NF ~ /^(sendto|sendmsg|write|writev)$/ { printf "  %-8s %7d calls  %.2f per request\n", $NF, $4, $4 / n }' "$W/$mode.strace"
}

run driven "" ""
run fast "failover: { first_chunk_hold: 0 }" stream
