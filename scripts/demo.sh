#!/usr/bin/env bash
# One command from a fresh machine to a running gateway: installs what the build needs,
# builds, starts two signalbox-mock providers (:9001, :9002) and runs signalbox on
# conf/signalbox.yaml (:8080, admin :9901). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v cmake >/dev/null 2>&1 || need_pkgs+=(cmake)
command -v cc >/dev/null 2>&1 || need_pkgs+=(build-essential)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "demo: installing ${need_pkgs[*]} (needed to build Pingora and jemalloc)"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "${need_pkgs[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "demo: cargo not found; install Rust from https://rustup.rs first" >&2
  exit 1
fi

echo "demo: building (the first build takes a few minutes)"
cargo build --bins

# Say which port is taken before anything starts (the demo needs all four).
for port in 8080 9901 9001 9002; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "demo: port $port is already in use on 127.0.0.1; stop what holds it (ss -ltnp 'sport = :$port')" >&2
    exit 1
  fi
done

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

./target/debug/signalbox-mock --listen 127.0.0.1:9001 --listen 127.0.0.1:9002 --name demo \
  --chunks 8 --gap-ms 80 > target/demo-mock.log 2>&1 &
pids+=($!)
# The admin API's write token (conf/signalbox.yaml: admin.token_env).
export SIGNALBOX_ADMIN_TOKEN="${SIGNALBOX_ADMIN_TOKEN:-demo-admin-token}"
# The Anthropic-kind mock provider's key (conf/signalbox.yaml: mock-claude, anthropic-down).
export DEMO_ANTHROPIC_KEY="${DEMO_ANTHROPIC_KEY:-sk-ant-demo}"
./target/debug/signalbox -c conf/signalbox.yaml &
sb=$!
pids+=($sb)

# Ready means the proxy listener is bound and every chain has a callable candidate (not just
# that the admin API answers). A process that exits (a port taken) has said why on stderr.
ready=""
for _ in $(seq 1 300); do
  if ! kill -0 "$sb" 2>/dev/null; then
    echo "demo: signalbox exited before it was ready (see the line above: a port in use?)" >&2
    exit 1
  fi
  if curl -fsS --max-time 1 -o /dev/null http://127.0.0.1:9901/admin/ready 2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "demo: signalbox did not become ready in 30 s:" >&2
  curl -sS --max-time 2 http://127.0.0.1:9901/admin/ready >&2 || true
  exit 1
fi

cat <<'MSG'

signalbox is up on http://127.0.0.1:8080 (metrics on http://127.0.0.1:9901/metrics).
The `auto` chain starts with a provider that is down, so this request fails over:

MSG
curl -sS --max-time 10 -D - -o /dev/null http://127.0.0.1:8080/v1/chat/completions \
  -H 'content-type: application/json' \
  -d '{"model":"auto","messages":[{"role":"user","content":"hello"}]}' | grep -i -E '^(HTTP|x-llm|x-routed|server-timing)'
echo
echo "Try a stream:  curl -N http://127.0.0.1:8080/v1/chat/completions -d '{\"model\":\"fast\",\"stream\":true}'"
echo "Anthropic SDK: curl http://127.0.0.1:8080/v1/messages -H 'anthropic-version: 2023-06-01' -d '{\"model\":\"auto:mixed\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'"
echo "Admin API:     curl -H \"authorization: Bearer $SIGNALBOX_ADMIN_TOKEN\" http://127.0.0.1:9901/admin/health"
echo "(admin writes rewrite conf/signalbox.yaml without its comments: git checkout restores it)"
echo "Ctrl-C to stop."
wait
