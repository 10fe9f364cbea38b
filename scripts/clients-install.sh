#!/usr/bin/env bash
# The real clients the conformance suite (tests/clients.rs) drives the gateway with, at pinned
# versions, from the npm registry and PyPI:
#
#   DIR/node    tests/clients/package.json + package-lock.json, by `npm ci`: Claude Code, the
#               Codex CLI, openai-node and the Anthropic Node SDK
#   DIR/aider   a virtualenv of tests/clients/aider.txt (aider-chat, locked with everything it pulls)
#   DIR/python  a virtualenv of tests/clients/python.txt (LiteLLM, langchain-openai and
#               langchain-anthropic, locked likewise)
#
#   scripts/clients-install.sh [DIR]    # default: target/clients at the repository root
#   scripts/clients-install.sh --lock   # re-lock tests/clients/*.in into *.txt (after a pin moves)
#
# The Python packages go in with uv (itself pinned, from PyPI, into DIR/uv): pip took six
# minutes over aider's ~230 packages on a CI-sized machine, uv seconds. Idempotent: a part whose
# marker holds the hash of its lock file is complete and skipped, without network. Concurrent
# runs serialise on DIR.lock. Caches live in a temporary directory under DIR, removed on exit
# (the clients take about 2 GB; their caches would double it). PYTHON picks the interpreter
# (default python3).
set -euo pipefail

UV_PIN="uv==0.13.9"

root="$(cd "$(dirname "$0")/.." && pwd)"
spec="$root/tests/clients"
python="${PYTHON:-python3}"
# uv uses this interpreter and never fetches one of its own.
export UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1

lock=false
if [ "${1:-}" = "--lock" ]; then
  lock=true
  shift
fi
dir="${1:-$root/target/clients}"
mkdir -p "$dir"

if command -v flock >/dev/null 2>&1; then
  exec 9>"$dir.lock"
  flock 9
fi

started=$SECONDS
scratch="$(mktemp -d "$dir/.cache.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
export npm_config_cache="$scratch/npm" UV_CACHE_DIR="$scratch/uv"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

hash_of() {
  cat "$@" | sha256sum | cut -d' ' -f1
}

# Whether part $1 is complete for the files after it.
complete() {
  local part="$1"
  shift
  [ -f "$dir/$part/.signalbox-complete" ] && [ "$(cat "$dir/$part/.signalbox-complete")" = "$(hash_of "$@")" ]
}

mark() {
  local part="$1"
  shift
  hash_of "$@" >"$dir/$part/.signalbox-complete"
}

uv_bin() {
  if ! complete uv "$0"; then
    if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
      echo "clients-install: '$python -m venv' is unavailable: install python3-venv" >&2
      exit 1
    fi
    rm -rf "$dir/uv"
    "$python" -m venv "$dir/uv"
    "$dir/uv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-cache-dir "$UV_PIN"
    mark uv "$0"
  fi
  echo "$dir/uv/bin/uv"
}

if $lock; then
  uv="$(uv_bin)"
  for part in aider python; do
    "$uv" pip compile --quiet --python "$python" --custom-compile-command "scripts/clients-install.sh --lock" \
      "$spec/$part.in" -o "$spec/$part.txt"
  done
  (cd "$spec" && npm install --package-lock-only --ignore-scripts --omit-lockfile-registry-resolved)
  echo "clients-install: locked tests/clients/{aider,python}.txt and package-lock.json" >&2
  exit 0
fi

# --- npm: Claude Code, Codex, openai-node, the Anthropic Node SDK ---
if ! complete node "$spec/package.json" "$spec/package-lock.json"; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "clients-install: npm not found: install Node.js and npm (Debian/Ubuntu: apt-get install nodejs npm)" >&2
    exit 1
  fi
  rm -rf "$dir/node"
  mkdir -p "$dir/node"
  cp "$spec/package.json" "$spec/package-lock.json" "$dir/node/"
  # Claude Code's postinstall puts its native binary in place of bin/claude.exe.
  (cd "$dir/node" && npm ci --no-audit --no-fund --loglevel=error)
  "$dir/node/node_modules/.bin/claude" --version >/dev/null
  "$dir/node/node_modules/.bin/codex" --version >/dev/null
  mark node "$spec/package.json" "$spec/package-lock.json"
fi

# --- PyPI: aider; LiteLLM and LangChain ---
for part in aider python; do
  if complete "$part" "$spec/$part.txt"; then
    continue
  fi
  uv="$(uv_bin)"
  rm -rf "${dir:?}/$part"
  "$uv" venv --quiet --python "$python" "$dir/$part"
  VIRTUAL_ENV="$dir/$part" "$uv" pip sync --quiet "$spec/$part.txt"
  case "$part" in
    aider) "$dir/aider/bin/aider" --version >/dev/null ;;
    python) LITELLM_LOCAL_MODEL_COST_MAP=True "$dir/python/bin/python" -c 'import litellm, langchain_openai, langchain_anthropic' ;;
  esac
  mark "$part" "$spec/$part.txt"
done

echo "clients-install: $dir ready in $((SECONDS - started))s" >&2
