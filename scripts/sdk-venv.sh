#!/usr/bin/env bash
# The Python virtualenv the SDK integration tests (tests/sdk.rs) drive the gateway with: the
# official OpenAI and Anthropic Python SDKs from PyPI, pinned.
#
#   scripts/sdk-venv.sh [DIR]     # default: target/sdk-venv at the repository root
#
# Idempotent: a complete venv (its marker file names the pins below) is a fast no-op, without
# network. Concurrent runs (parallel test processes) serialise on DIR.lock. PYTHON picks the
# interpreter (default python3).
set -euo pipefail

OPENAI_PIN="openai==3.57.0"
ANTHROPIC_PIN="anthropic==2.14.0"
PINS="$OPENAI_PIN $ANTHROPIC_PIN"

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/target/sdk-venv}"
python="${PYTHON:-python3}"
marker="$dir/.signalbox-sdk-complete"

complete() {
  [ -x "$dir/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$PINS" ]
}

complete && exit 0

mkdir -p "$(dirname "$dir")"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$dir.lock"
  flock 9
  # Another run may have finished the venv while this one waited.
  complete && exit 0
fi

if ! command -v "$python" >/dev/null 2>&1; then
  echo "sdk-venv: $python not found: install Python 3 (Debian/Ubuntu: apt-get install python3 python3-venv)" >&2
  exit 1
fi
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "sdk-venv: '$python -m venv' is unavailable: install python3-venv (Debian/Ubuntu: apt-get install python3-venv)" >&2
  exit 1
fi

started=$SECONDS
rm -f "$marker"
if [ ! -x "$dir/bin/python" ]; then
  rm -rf "$dir"
  "$python" -m venv "$dir"
fi
# shellcheck disable=SC2086 # PINS is a list of requirement specifiers
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input $PINS
"$dir/bin/python" -c 'import openai, anthropic; print("sdk-venv: openai", openai.__version__, "anthropic", anthropic.__version__)' >&2
printf '%s' "$PINS" >"$marker"
echo "sdk-venv: $dir ready in $((SECONDS - started))s" >&2
