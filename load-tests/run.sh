#!/usr/bin/env bash
# signalbox load-test runner. See load-tests/README.md.
#
#   load-tests/run.sh [--quick] [--duration 10s] [--threads 1] [--no-pin] [--with-litellm]
#                     [--bin-dir target/release] [--scenarios a,b,c,d,e,f,g,h] [--streams 10000]
#                     [--install-tools] [--out-dir DIR] [--wait-quiet S] [--nice N]
#                     [--bin-label TEXT] [--keep-tmp]
#
# Every target is loopback; every run is bounded in time and count; every process started here
# runs in its own process group recorded in $TMP/pids and is ended by the EXIT trap.
set -euo pipefail

LT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$LT_DIR/.." && pwd)

usage() {
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --bin-dir DIR      where signalbox and signalbox-mock are (default: target/release of the
                     repo); built there with `cargo build --release --bins` if missing; the
                     plain Pingora baseline is DIR/examples/plain_pingora, built there with
                     `cargo build --release --example plain_pingora` if missing
  --threads N        worker threads/processes of every system under test (default 1)
  --duration D       seconds per measured run, e.g. 10s (default 10s; --quick: 3s)
  --quick            smoke mode: 3s runs, 1s warm-ups, 2,000 slow streams, shorter frontier
  --no-pin           do not pin with taskset (default: server on CPU 0, load + upstreams on CPU 1)
  --with-litellm     also measure LiteLLM's proxy (pip install 'litellm[proxy]' into
                     /tmp/lt-litellm-venv; skipped with a note if that fails)
  --scenarios LIST   subset of a,b,c,d,e,f,g,h (default all)
  --streams N        concurrent slow streams in scenario f (default 10000; --quick 2000)
  --install-tools    apt-get install wrk nginx haproxy jq, cargo install oha into /tmp/lt-cargo
  --out-dir DIR      where the results file goes (default load-tests/results)
  --wait-quiet S     shared machines: wait up to S seconds in all for other jobs to go quiet
                     (before the run: <10% CPU busy; between measurements: <15%, ≤15 s each)
  --nice N           run everything this run starts at this nice value (e.g. -10 on a shared
                     machine: the systems, upstreams and load generators then get the CPU
                     before other jobs; all systems alike, so the comparison stays fair)
  --bin-label TEXT   what the binaries were built from, for the report (e.g. "git archive abc123")
  --keep-tmp         keep the temp dir (configs, logs) for inspection
EOF
}

BIN_DIR="$REPO/target/release"
THREADS=1
DURATION=""
QUICK=0
NO_PIN=0
WITH_LITELLM=0
SCENARIOS="a,b,c,d,e,f,g,h"
STREAMS=""
INSTALL=0
OUT_DIR="$LT_DIR/results"
KEEP_TMP=0
WAIT_QUIET=0
BIN_LABEL=""
NICE=0

while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --bin-dir=*) BIN_DIR=${1#*=}; shift ;;
    --threads) THREADS=$2; shift 2 ;;
    --threads=*) THREADS=${1#*=}; shift ;;
    --duration) DURATION=$2; shift 2 ;;
    --duration=*) DURATION=${1#*=}; shift ;;
    --quick) QUICK=1; shift ;;
    --no-pin) NO_PIN=1; shift ;;
    --with-litellm) WITH_LITELLM=1; shift ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --scenarios=*) SCENARIOS=${1#*=}; shift ;;
    --streams) STREAMS=$2; shift 2 ;;
    --streams=*) STREAMS=${1#*=}; shift ;;
    --install-tools) INSTALL=1; shift ;;
    --out-dir) OUT_DIR=$2; shift 2 ;;
    --out-dir=*) OUT_DIR=${1#*=}; shift ;;
    --keep-tmp) KEEP_TMP=1; shift ;;
    --wait-quiet) WAIT_QUIET=$2; shift 2 ;;
    --bin-label) BIN_LABEL=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    --nice=*) NICE=${1#*=}; shift ;;
    --bin-label=*) BIN_LABEL=${1#*=}; shift ;;
    --wait-quiet=*) WAIT_QUIET=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

if [ -z "$DURATION" ]; then
  if [ "$QUICK" = 1 ]; then DURATION=3s; else DURATION=10s; fi
fi
DUR_S=${DURATION%s}
case "$DUR_S" in ''|*[!0-9.]*) echo "run.sh: --duration wants seconds, e.g. 10s" >&2; exit 2 ;; esac
case "$THREADS" in ''|*[!0-9]*|0) echo "run.sh: --threads wants a positive integer" >&2; exit 2 ;; esac
if [ -z "$STREAMS" ]; then
  if [ "$QUICK" = 1 ]; then STREAMS=2000; else STREAMS=10000; fi
fi
case "$BIN_DIR" in /*) ;; *) BIN_DIR="$REPO/$BIN_DIR" ;; esac
case "$OUT_DIR" in /*) ;; *) OUT_DIR="$PWD/$OUT_DIR" ;; esac

TMP=$(mktemp -d /tmp/signalbox-lt.XXXXXX)
chmod 755 "$TMP"   # nginx workers run as nobody and may need their temp paths in here
: > "$TMP/pids"

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # End every process group this run started (the runner records each pgid), TERM then KILL.
  if [ -s "$TMP/pids" ]; then
    while read -r pid; do
      [ -n "$pid" ] && kill -TERM -- "-$pid" 2>/dev/null || true
    done < "$TMP/pids"
    sleep 1
    while read -r pid; do
      [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null || true
    done < "$TMP/pids"
  fi
  if [ -n "${RUNNER_PID:-}" ]; then kill -TERM "$RUNNER_PID" 2>/dev/null || true; fi
  if [ "$KEEP_TMP" = 1 ]; then
    echo "run.sh: temp dir kept: $TMP" >&2
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 10,000 streams need ~20,000 descriptors in the gateway (client + upstream side) and 10,000 in
# the client and the mock: raise the limit for everything started from here.
ulimit -n 200000 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "run.sh: open files limit $(ulimit -n)" >&2

if [ "$INSTALL" = 1 ]; then
  echo "run.sh: installing tools" >&2
  apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx haproxy jq util-linux procps >/dev/null
  # Debian starts its own services on install: stop and disable them, the runner starts its own.
  for s in nginx haproxy; do
    service "$s" stop >/dev/null 2>&1 || true
    systemctl disable "$s" >/dev/null 2>&1 || true
  done
  if [ ! -x /tmp/lt-cargo/bin/oha ] && ! command -v oha >/dev/null; then
    cargo install oha --locked --root /tmp/lt-cargo || echo "run.sh: cargo install oha failed" >&2
  fi
fi

# The binaries under test: build them into BIN_DIR if missing.
if [ ! -x "$BIN_DIR/signalbox" ] || [ ! -x "$BIN_DIR/signalbox-mock" ]; then
  if [ "$(basename "$BIN_DIR")" != release ]; then
    echo "run.sh: $BIN_DIR has no signalbox binaries and is not a cargo target/release dir" >&2
    exit 1
  fi
  echo "run.sh: building signalbox into $BIN_DIR (cargo build --release --bins)" >&2
  (cd "$REPO" && CARGO_TARGET_DIR="$(dirname "$BIN_DIR")" cargo build --release --bins)
fi

# The plain Pingora baseline (examples/plain_pingora.rs): built the same way if missing. If that
# fails its rows say why ("not measured") and the run goes on.
PINGORA_REASON=""
if [ ! -x "$BIN_DIR/examples/plain_pingora" ]; then
  if [ "$(basename "$BIN_DIR")" != release ]; then
    PINGORA_REASON="$BIN_DIR/examples/plain_pingora is missing and $BIN_DIR is not a cargo target/release dir"
  else
    echo "run.sh: building plain_pingora into $BIN_DIR/examples (cargo build --release --example plain_pingora)" >&2
    if ! (cd "$REPO" && CARGO_TARGET_DIR="$(dirname "$BIN_DIR")" \
          cargo build --release --example plain_pingora) >"$TMP/plain-pingora-build.log" 2>&1 \
        || [ ! -x "$BIN_DIR/examples/plain_pingora" ]; then
      why=$( { grep -m1 '^error' "$TMP/plain-pingora-build.log" || tail -1 "$TMP/plain-pingora-build.log"; } \
             2>/dev/null | cut -c1-200 || true)
      PINGORA_REASON="cargo build --release --example plain_pingora failed: ${why:-no output}"
    fi
  fi
  if [ -n "$PINGORA_REASON" ]; then
    echo "run.sh: $PINGORA_REASON; the pingora rows will say so" >&2
  fi
fi

LITELLM_BIN=""
LITELLM_REASON=""
if [ "$WITH_LITELLM" = 1 ]; then
  VENV=/tmp/lt-litellm-venv
  if [ ! -x "$VENV/bin/litellm" ]; then
    echo "run.sh: installing litellm[proxy] into $VENV" >&2
    if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q 'litellm[proxy]'; } \
        >"$TMP/litellm-install.log" 2>&1; then
      LITELLM_REASON="pip install 'litellm[proxy]' failed: $(tail -1 "$TMP/litellm-install.log" | cut -c1-160)"
      echo "run.sh: $LITELLM_REASON; skipping LiteLLM" >&2
    fi
  fi
  [ -x "$VENV/bin/litellm" ] && LITELLM_BIN="$VENV/bin/litellm"
fi

ARGS=(--bin-dir "$BIN_DIR" --threads "$THREADS" --duration "$DUR_S" --scenarios "$SCENARIOS"
      --streams "$STREAMS" --out-dir "$OUT_DIR" --tmp "$TMP" --wait-quiet "$WAIT_QUIET"
      --bin-label "$BIN_LABEL" --pingora-reason "$PINGORA_REASON")
[ "$QUICK" = 1 ] && ARGS+=(--quick)
[ "$NO_PIN" = 1 ] && ARGS+=(--no-pin)
[ "$WITH_LITELLM" = 1 ] && ARGS+=(--with-litellm --litellm-bin "$LITELLM_BIN" --litellm-reason "$LITELLM_REASON")

if [ "$NICE" != 0 ]; then
  # Inherited by everything started below (the runner and all its children).
  renice -n "$NICE" -p $$ >/dev/null || echo "run.sh: renice $NICE failed; running at nice 0" >&2
fi
ARGS+=(--nice "$(nice)")

PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
"$PY" "$LT_DIR/lib/runner.py" "${ARGS[@]}" &
RUNNER_PID=$!
wait "$RUNNER_PID"
