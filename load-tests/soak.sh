#!/usr/bin/env bash
# signalbox soak: thousands of concurrent slow streams, one failing provider in the mix, 1 % of
# callers hanging up mid-stream; every stream checked, the gateway back to idle after. See
# load-tests/README.md ("Soak").
#
#   load-tests/soak.sh [--bin-dir target/release] [--streams 5000] [--duration-per-stream 8s]
#                      [--chunks 20] [--ramp 4s] [--fail-mode 503|reset|close] [--threads 2]
#                      [--rounds 2] [--out-dir DIR] [--keep-tmp] [--pin] [--nice N]
#
# Loopback only; bounded (the client has a deadline, every wait after it is a bounded poll);
# every process started here runs in its own process group recorded in $TMP/pids and is ended
# by the EXIT trap. Exit status 0 only if every stream that was not hung up ended intact or with
# its error event and the gateway's descriptors and in-flight gauge returned to idle.
set -euo pipefail

LT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$LT_DIR/.." && pwd)

usage() {
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --bin-dir DIR              where signalbox and signalbox-mock are (default: target/release of
                             the repo); built there with `cargo build --release --bins` if missing
  --streams N                concurrent streams (default 5000)
  --duration-per-stream D    how long each stream lasts, e.g. 8s (default 8s): the mock's gap
                             between events is D / chunks
  --chunks N                 content events per stream (default 20)
  --ramp D                   the streams are opened evenly over this long (default 4s)
  --fail-mode M              what the failing provider does on every call: 503 (default), reset
                             (RST before any byte) or close (FIN before any byte)
  --fail-share P             % of streams on the model whose first provider is the failing one
                             (default 30)
  --error-share P            % of streams on a provider that dies mid-stream: they must end with
                             the error event (default 5)
  --hangup-pct P             % of callers that hang up after 3 content events (default 1)
  --threads N                signalbox worker threads (default 2)
  --rounds N                 run the N streams this many times, one after the other, in the same
                             gateway (default 2): RSS after round 2 vs round 1 shows growth
  --settle S                 after the streams: wait at most S s for in-flight and descriptors to
                             return to idle (default 30)
  --pool-wait S              then at most S s for the pooled upstream connections to time out
                             (signalbox keeps them 60 s) and every descriptor to be back to idle;
                             0 = skip this check (default 80)
  --out-dir DIR              where soak.md and soak.json go (default: a new temp dir, printed)
  --pin                      gateway on CPU 0, mocks and client on CPU 1 (taskset)
  --nice N                   run everything at this nice value (e.g. -10 as root)
  --keep-tmp                 keep the temp dir (configs, logs, plan, client JSON)
EOF
}

BIN_DIR="$REPO/target/release"
STREAMS=5000
PER_STREAM=8s
CHUNKS=20
RAMP=4s
FAIL_MODE=503
FAIL_SHARE=30
ERROR_SHARE=5
HANGUP=1
THREADS=2
ROUNDS=2
SETTLE=30
POOL_WAIT=80
OUT_DIR=""
KEEP_TMP=0
PIN=0
NICE=0
CMDLINE="load-tests/soak.sh $*"

while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --bin-dir=*) BIN_DIR=${1#*=}; shift ;;
    --streams) STREAMS=$2; shift 2 ;;
    --streams=*) STREAMS=${1#*=}; shift ;;
    --duration-per-stream) PER_STREAM=$2; shift 2 ;;
    --duration-per-stream=*) PER_STREAM=${1#*=}; shift ;;
    --chunks) CHUNKS=$2; shift 2 ;;
    --chunks=*) CHUNKS=${1#*=}; shift ;;
    --ramp) RAMP=$2; shift 2 ;;
    --ramp=*) RAMP=${1#*=}; shift ;;
    --fail-mode) FAIL_MODE=$2; shift 2 ;;
    --fail-mode=*) FAIL_MODE=${1#*=}; shift ;;
    --fail-share) FAIL_SHARE=$2; shift 2 ;;
    --fail-share=*) FAIL_SHARE=${1#*=}; shift ;;
    --error-share) ERROR_SHARE=$2; shift 2 ;;
    --error-share=*) ERROR_SHARE=${1#*=}; shift ;;
    --hangup-pct) HANGUP=$2; shift 2 ;;
    --hangup-pct=*) HANGUP=${1#*=}; shift ;;
    --threads) THREADS=$2; shift 2 ;;
    --threads=*) THREADS=${1#*=}; shift ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --rounds=*) ROUNDS=${1#*=}; shift ;;
    --settle) SETTLE=$2; shift 2 ;;
    --settle=*) SETTLE=${1#*=}; shift ;;
    --pool-wait) POOL_WAIT=$2; shift 2 ;;
    --pool-wait=*) POOL_WAIT=${1#*=}; shift ;;
    --out-dir) OUT_DIR=$2; shift 2 ;;
    --out-dir=*) OUT_DIR=${1#*=}; shift ;;
    --pin) PIN=1; shift ;;
    --nice) NICE=$2; shift 2 ;;
    --nice=*) NICE=${1#*=}; shift ;;
    --keep-tmp) KEEP_TMP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "soak.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

secs() {  # "8s", "8", "500ms" -> seconds (decimal)
  case "$1" in
    *ms) awk -v v="${1%ms}" 'BEGIN { printf "%g", v / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}
PER_STREAM_S=$(secs "$PER_STREAM")
RAMP_S=$(secs "$RAMP")
for v in "$PER_STREAM_S" "$RAMP_S" "$FAIL_SHARE" "$ERROR_SHARE" "$HANGUP" "$SETTLE" "$POOL_WAIT"; do
  case "$v" in ''|*[!0-9.]*) echo "soak.sh: not a number: $v" >&2; exit 2 ;; esac
done
for v in "$STREAMS" "$CHUNKS" "$THREADS" "$ROUNDS"; do
  case "$v" in ''|*[!0-9]*|0) echo "soak.sh: not a positive integer: $v" >&2; exit 2 ;; esac
done
GAP_MS=$(awk -v d="$PER_STREAM_S" -v c="$CHUNKS" 'BEGIN { g = int(d * 1000 / c + 0.5); if (g < 1) g = 1; print g }')
case "$BIN_DIR" in /*) ;; *) BIN_DIR="$PWD/$BIN_DIR" ;; esac

TMP=$(mktemp -d /tmp/signalbox-soak.XXXXXX)
: > "$TMP/pids"
if [ -z "$OUT_DIR" ]; then OUT_DIR="$TMP/out"; KEEP_OUT=1; else KEEP_OUT=0; fi
case "$OUT_DIR" in /*) ;; *) OUT_DIR="$PWD/$OUT_DIR" ;; esac

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "${RUNNER_PID:-}" ]; then kill -TERM "$RUNNER_PID" 2>/dev/null || true; fi
  # End every process group this run started (soak.py records each pgid), TERM then KILL.
  if [ -s "$TMP/pids" ]; then
    while read -r pid; do
      [ -n "$pid" ] && kill -TERM -- "-$pid" 2>/dev/null || true
    done < "$TMP/pids"
    sleep 1
    while read -r pid; do
      [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null || true
    done < "$TMP/pids"
  fi
  if [ "$KEEP_TMP" = 1 ]; then
    echo "soak.sh: temp dir kept: $TMP" >&2
  elif [ "$KEEP_OUT" = 1 ]; then
    # The results live in the temp dir: keep them (and the logs beside them), drop the rest.
    rm -f "$TMP/plan.json"
    echo "soak.sh: results in $OUT_DIR (logs in $TMP)" >&2
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Each stream holds two descriptors in the gateway (caller side, upstream side) and one in the
# client and in the mock: raise the limit for everything started from here.
ulimit -n 200000 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
FD_LIMIT=$(ulimit -n)
echo "soak.sh: open files limit $FD_LIMIT" >&2
if [ "$FD_LIMIT" != unlimited ] && [ $((STREAMS * 2 + 200)) -gt "$FD_LIMIT" ]; then
  echo "soak.sh: $STREAMS streams need ~$((STREAMS * 2 + 200)) descriptors in the gateway; the" \
       "limit is $FD_LIMIT (its hard limit): lower --streams" >&2
  exit 2
fi

if [ ! -x "$BIN_DIR/signalbox" ] || [ ! -x "$BIN_DIR/signalbox-mock" ]; then
  if [ "$(basename "$BIN_DIR")" != release ]; then
    echo "soak.sh: $BIN_DIR has no signalbox binaries and is not a cargo target/release dir" >&2
    exit 1
  fi
  echo "soak.sh: building signalbox into $BIN_DIR (cargo build --release --bins)" >&2
  (cd "$REPO" && CARGO_TARGET_DIR="$(dirname "$BIN_DIR")" cargo build --release --bins)
fi

if [ "$NICE" != 0 ]; then
  renice -n "$NICE" -p $$ >/dev/null || echo "soak.sh: renice $NICE failed; running at nice 0" >&2
fi

ARGS=(--bin-dir "$BIN_DIR" --tmp "$TMP" --out-dir "$OUT_DIR" --streams "$STREAMS"
      --chunks "$CHUNKS" --gap-ms "$GAP_MS" --ramp-s "$RAMP_S" --threads "$THREADS"
      --fail-mode "$FAIL_MODE" --fail-share "$FAIL_SHARE" --error-share "$ERROR_SHARE"
      --hangup-pct "$HANGUP" --rounds "$ROUNDS" --settle "$SETTLE" --pool-wait "$POOL_WAIT"
      --fd-limit "${FD_LIMIT/unlimited/0}" --command "$CMDLINE")
[ "$PIN" = 1 ] && ARGS+=(--pin)

PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
"$PY" "$LT_DIR/lib/soak.py" "${ARGS[@]}" &
RUNNER_PID=$!
set +e
wait "$RUNNER_PID"
RC=$?
set -e
RUNNER_PID=""
exit "$RC"
