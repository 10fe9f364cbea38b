#!/usr/bin/env python3
"""signalbox load-test orchestrator. Started by load-tests/run.sh (which owns the temp dir,
the fd limit and the EXIT trap); standard library only.

For every scenario it starts fresh upstreams and, one after the other, each system under test
(direct = no proxy, nginx, HAProxy, plain Pingora, signalbox, optionally LiteLLM) with the same
worker/thread count; warms up; runs the load generator for a bounded time; reads the server's CPU time and
peak RSS from /proc; stops the system. All targets are loopback. Every process is started in
its own process group whose id is appended to $TMP/pids, so that run.sh's trap can end it even
if this script dies.
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

LT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(LT_DIR)
WRK_DIR = os.path.join(LT_DIR, "wrk")
SSE_CLIENT = os.path.join(LT_DIR, "lib", "sse_client.py")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# An OpenAI-shaped chat completion, served by the nginx "static" upstream.
STATIC_COMPLETION = (
    '{"id":"chatcmpl-lt","object":"chat.completion","created":1700000000,"model":"lt-model",'
    '"system_fingerprint":"fp_lt","choices":[{"index":0,"message":{"role":"assistant",'
    '"content":"Hello from the nginx static upstream."},"logprobs":null,"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":520,"completion_tokens":8,"total_tokens":528}}'
)

# Foreign CPU load (other jobs on the machine) above this % of a CPU flags a row.
FOREIGN_FLAG = 15.0

SB_HEALTH = "signalbox (breakers on)"
# signalbox with `failover.first_chunk_hold: 0`: streams take Pingora's own proxy loop (the fast
# path) instead of the hold path, which holds each stream's header until its first content.
SB_NO_HOLD = "signalbox (hold off)"
# The streamed answer of scenarios b and f: a word per chunk and more, so every chunk carries
# content from the first (the mock's default three-word reply leaves most chunks empty, and a
# first-chunk hold would then wait for the first word, not measure its own cost).
STREAM_REPLY = " ".join(["signalbox"] * 40)
# "pingora": examples/plain_pingora.rs, a Pingora proxy that forwards everything to one upstream
# with keep-alive and does no routing work: the floor of any Pingora-based proxy on this machine.
PLAIN_PINGORA = os.path.join("examples", "plain_pingora")
SYSTEM_ORDER = ["direct", "nginx", "haproxy", "pingora", "signalbox", SB_NO_HOLD, SB_HEALTH,
                "litellm"]


class SystemUnavailable(Exception):
    """A system could not be started (or a tool is missing): reported in the table."""


def log(msg):
    sys.stderr.write("[lt %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------------------------------------
# processes


class Proc:
    """A process started in its own process group (pgid = pid), output to $TMP/<name>.log."""

    def __init__(self, ctx, name, cmd, cpu=None, env=None, stdin=None):
        self.ctx = ctx
        self.name = name
        self.log_path = os.path.join(ctx.tmp, "%s.log" % name)
        full = (["taskset", "-c", cpu] if cpu is not None else []) + cmd
        self.cmd = full
        logf = open(self.log_path, "ab")
        self.popen = subprocess.Popen(full, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                      stdin=stdin or subprocess.DEVNULL, start_new_session=True)
        logf.close()
        self.pid = self.popen.pid
        with open(ctx.pidfile, "a") as f:
            f.write("%d\n" % self.pid)
        ctx.procs.append(self)

    def alive(self):
        return self.popen.poll() is None

    def log_tail(self, n=8):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").strip().splitlines()
            return " | ".join(lines[-n:])
        except OSError:
            return ""

    def wait_port(self, port, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise SystemUnavailable("%s exited (rc %s): %s" % (self.name, self.popen.returncode,
                                                                  self.log_tail()))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemUnavailable("%s not listening on %d after %.0fs: %s"
                                % (self.name, port, timeout, self.log_tail()))

    def tree(self):
        return tree_pids(self.pid)

    def stop(self, sig=signal.SIGTERM, timeout=8.0):
        if self.alive():
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the group (workers, children) is killed.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(3)
        except subprocess.TimeoutExpired:
            pass
        if self in self.ctx.procs:
            self.ctx.procs.remove(self)


def tree_pids(root):
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_ticks(pids):
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                st = f.read()
            fields = st[st.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            pass
    return total


def status_kb(pids, key):
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith(key + ":"):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return total


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def cpu_stat():
    """Per-CPU (busy, total) jiffies from /proc/stat, keyed 'cpu', 'cpu0', 'cpu1', ..."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            parts = line.split()
            vals = [int(v) for v in parts[1:9]]
            idle = vals[3] + vals[4]
            out[parts[0]] = (sum(vals) - idle, sum(vals))
    return out


LOADAVG_MAX = [0.0]


def loadavg():
    with open("/proc/loadavg") as f:
        v = float(f.read().split()[0])
    LOADAVG_MAX[0] = max(LOADAVG_MAX[0], v)
    return v


class Meter:
    """CPU time (utime+stime of the process tree) between start() and stop(); VmHWM at stop;
    and how busy each CPU of the host was meanwhile, minus what the server, the upstreams and
    the load generator (reaped children of this script) used: the foreign load from other jobs
    on this shared machine, which makes a row unreliable."""

    def __init__(self, proc, ctx=None):
        self.proc = proc
        self.ctx = ctx
        self.pids = proc.tree() if proc else []
        self.others = [u for u in (ctx.upstreams if ctx else []) if u is not proc and u.alive()]
        self.t0 = cpu_ticks(self.pids)
        self.o0 = cpu_ticks([p for u in self.others for p in u.tree()])
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.c0 = ru.ru_utime + ru.ru_stime
        self.s0 = cpu_stat()
        self.w0 = time.monotonic()
        self.cpu_s = None
        self.wall_s = None
        self.hwm_kb = None
        self.host = None
        self.foreign = None

    def stop(self):
        # Children may have appeared (workers forked late): include them.
        self.pids = self.proc.tree() if self.proc else []
        self.cpu_s = (cpu_ticks(self.pids) - self.t0) / float(CLK_TCK)
        self.wall_s = time.monotonic() - self.w0
        self.hwm_kb = status_kb(self.pids, "VmHWM")
        s1 = cpu_stat()
        self.host = {k: round(100.0 * (s1[k][0] - self.s0[k][0]) / max(1, s1[k][1] - self.s0[k][1]), 1)
                     for k in s1 if k in self.s0}
        others_s = (cpu_ticks([p for u in self.others for p in u.tree()]) - self.o0) / float(CLK_TCK)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        gen_s = ru.ru_utime + ru.ru_stime - self.c0
        ours = 100.0 * (self.cpu_s + others_s + gen_s) / self.wall_s if self.wall_s else 0
        if self.ctx is not None and self.ctx.pinned and "cpu0" in self.host and "cpu1" in self.host:
            # Server alone on CPU 0; upstreams and load generator on CPU 1. In a direct row
            # the measured "server" is an upstream, on CPU 1.
            srv = 100.0 * self.cpu_s / self.wall_s
            rest = ours - srv
            if self.proc in self.ctx.upstreams:
                f0, f1 = self.host["cpu0"], self.host["cpu1"] - ours
            else:
                f0, f1 = self.host["cpu0"] - srv, self.host["cpu1"] - rest
            self.foreign = {"cpu0": round(max(0.0, f0), 1), "cpu1": round(max(0.0, f1), 1)}
        else:
            ncpu = os.cpu_count() or 1
            self.foreign = {"all": round(max(0.0, self.host.get("cpu", 0) * ncpu - ours), 1)}
        loadavg()
        return self


# ---------------------------------------------------------------------------------------------
# configuration files


def nginx_common(ctx, name, workers):
    d = os.path.join(ctx.tmp, name)
    os.makedirs(d, exist_ok=True)
    return d, """worker_processes %d;
daemon off;
master_process on;
pid %s/nginx.pid;
error_log %s/error.log warn;
worker_rlimit_nofile %d;
events { worker_connections %d; multi_accept on; }
""" % (workers, d, d, ctx.fd_limit, max(1024, ctx.fd_limit - 100))


def nginx_temp_paths(d):
    return "\n".join("  %s %s/%s;" % (k, d, k.split("_")[0]) for k in (
        "client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path", "uwsgi_temp_path",
        "scgi_temp_path"))


def nginx_static_conf(ctx, port, workers=1):
    d, head = nginx_common(ctx, "nginx-static-%d" % port, workers)
    body = head + """http {
  access_log off;
%s
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_max_body_size 16m;
  client_body_buffer_size 256k;
  server {
    listen 127.0.0.1:%d backlog=4096;
    location / {
      default_type application/json;
      return 200 '%s';
    }
  }
}
""" % (nginx_temp_paths(d), port, STATIC_COMPLETION)
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write(body)
    return d, path


def nginx_proxy_conf(ctx, port, upstreams, workers, failover=False):
    d, head = nginx_common(ctx, "nginx-proxy-%d" % port, workers)
    # Failover: round-robin over the servers, retry the next one on 503 (POST included); no
    # passive health marking (max_fails=0), like signalbox, which has no breakers yet.
    servers = "\n".join("    server 127.0.0.1:%d%s;" % (u, " max_fails=0" if failover else "")
                        for u in upstreams)
    next_up = ("      proxy_next_upstream error timeout http_503 non_idempotent;\n"
               "      proxy_next_upstream_tries 3;\n") if failover else ""
    body = head + """http {
  access_log off;
%s
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_max_body_size 16m;
  client_body_buffer_size 256k;
  upstream up {
%s
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:%d backlog=4096;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 60s;
%s    }
  }
}
""" % (nginx_temp_paths(d), servers, port, next_up)
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write(body)
    return d, path


def haproxy_conf(ctx, port, upstreams, threads, failover=False):
    # HAProxy refuses to start when maxconn needs more descriptors than the limit allows.
    maxconn = max(1000, min(50000, (ctx.fd_limit - 200) // 2))
    d = os.path.join(ctx.tmp, "haproxy-%d" % port)
    os.makedirs(d, exist_ok=True)
    servers = "\n".join("  server s%d 127.0.0.1:%d" % (i, u) for i, u in enumerate(upstreams))
    retry = ("  balance roundrobin\n  option http-buffer-request\n  retry-on 503\n"
             "  retries 2\n  option redispatch 1\n") if failover else ""
    body = """global
  nbthread %d
  maxconn %d
  # no log lines: no logging

defaults
  mode http
  # Send what arrives at once (no MSG_MORE): without it HAProxy holds back SSE events.
  option http-no-delay
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 120s
  option http-keep-alive
  http-reuse always

frontend fe
  bind 127.0.0.1:%d
  maxconn %d
  default_backend be

backend be
%s%s
""" % (threads, maxconn, port, maxconn, retry, servers)
    path = os.path.join(d, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(body)
    return path


# Breakers effectively off: a target is never ejected (u32::MAX consecutive failures) and a
# model is never benched (64 failures within 1 ms), so every request whose plan starts on a
# failing provider pays the failover hop, as with nginx max_fails=0 and HAProxy without checks.
HEALTH_OFF = {"failure_threshold": 4294967295, "bench_after": 64, "bench_window": "1ms"}


def signalbox_conf(ctx, port, admin, providers, models, threads, health=None, modern=True,
                   failover=None):
    """providers: {id: port}; models: {name: [provider id, ...]} (deployment order).
    `modern`: the config has `strategy` and `health` (signalbox with health-scored routing;
    older builds reject these keys as unknown)."""
    d = os.path.join(ctx.tmp, "signalbox-%d" % port)
    os.makedirs(d, exist_ok=True)
    conf = {
        "listen": {"proxy": "127.0.0.1:%d" % port, "admin": "127.0.0.1:%d" % admin},
        "providers": {pid: {"kind": "openai", "base_url": "http://127.0.0.1:%d/v1" % pport,
                            "connect_timeout": "2s"}
                      for pid, pport in providers.items()},
        "models": {name: {"deployments": [{"provider": p, "model": "lt-upstream"} for p in deps]}
                   for name, deps in models.items()},
        "pingora": {
            "threads": threads,
            "pid_file": os.path.join(d, "signalbox.pid"),
            "upgrade_sock": os.path.join(d, "upgrade.sock"),
            "grace_period_seconds": 0,
            "graceful_shutdown_timeout_seconds": 1,
        },
    }
    if modern:
        for m in conf["models"].values():
            m["strategy"] = "priority"  # the deployments in the order written
        if health:
            conf["health"] = health
    if failover:
        conf["failover"] = failover
    path = os.path.join(d, "signalbox.json")
    with open(path, "w") as f:
        json.dump(conf, f, indent=1)
    return path


def litellm_conf(ctx, port, upstreams, failover=False):
    d = os.path.join(ctx.tmp, "litellm-%d" % port)
    os.makedirs(d, exist_ok=True)
    lines = ["model_list:"]
    names = ["lt-model"] + (["lt-mix-0", "lt-mix-1", "lt-mix-2"] if failover else [])
    for name in names:
        for u in upstreams:
            lines += ["  - model_name: %s" % name,
                      "    litellm_params:",
                      "      model: openai/lt-upstream",
                      "      api_base: http://127.0.0.1:%d/v1" % u,
                      "      api_key: sk-dummy-load-test"]
    lines += ["litellm_settings:", "  telemetry: false", "  drop_params: true",
              "  set_verbose: false", "  json_logs: false"]
    if failover:
        lines += ["router_settings:", "  num_retries: 2", "  retry_after: 0",
                  "  allowed_fails: 1000000", "  routing_strategy: simple-shuffle"]
    path = os.path.join(d, "litellm.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# starting things


class Ctx:
    def __init__(self, args):
        self.args = args
        self.tmp = args.tmp
        self.pidfile = os.path.join(self.tmp, "pids")
        self.procs = []
        self.rows = []
        self.notes = []
        self.pinned = (not args.no_pin) and (os.cpu_count() or 1) >= 2 and bool(shutil.which("taskset"))
        self.server_cpu = "0" if self.pinned else None
        self.load_cpu = "1" if self.pinned else None
        self.gen_threads = 1 if self.pinned else max(1, min(4, os.cpu_count() or 1))
        self.bin_dir = args.bin_dir
        self.tools = {}
        self.flagged = False
        self.scenario = "?"
        self.sb_modern = True
        self.quiet_budget = args.wait_quiet
        self.upstreams = []  # upstream Procs of the current scenario (for the foreign-load figure)
        self.env = dict(os.environ)
        self.env["RUST_LOG"] = "warn"
        self.dur = args.duration
        self.warm = 1.0 if args.quick else 2.0
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    def tool(self, name):
        return self.tools.get(name)


def start_mock(ctx, name, ports, extra=(), threads=1):
    cmd = [os.path.join(ctx.bin_dir, "signalbox-mock"), "--no-record", "--threads", str(threads),
           "--name", name]
    for p in ports:
        cmd += ["--listen", "127.0.0.1:%d" % p]
    cmd += list(extra)
    p = Proc(ctx, name, cmd, cpu=ctx.load_cpu, env=ctx.env)
    for port in ports:
        p.wait_port(port, 15)
    return p


def start_static_upstream(ctx):
    if not ctx.tool("nginx"):
        raise SystemUnavailable("nginx not installed (apt-get install nginx): no static upstream")
    port = free_port()
    d, conf = nginx_static_conf(ctx, port, workers=1)
    p = Proc(ctx, "upstream-nginx-static", [ctx.tool("nginx"), "-p", d, "-c", conf],
             cpu=ctx.load_cpu)
    p.wait_port(port, 15)
    return p, port


def start_system(ctx, system, upstreams, failover=False, sb_models=None, sb_providers=None,
                 sb_health=None, sb_require_health=False, sb_failover=None):
    """Start one proxy in front of `upstreams` (ports). Returns (Proc, port, info)."""
    n = ctx.args.threads
    port = free_port()
    if system == "nginx":
        if not ctx.tool("nginx"):
            raise SystemUnavailable("nginx not installed")
        d, conf = nginx_proxy_conf(ctx, port, upstreams, n, failover)
        p = Proc(ctx, "nginx-proxy-%d" % port, [ctx.tool("nginx"), "-p", d, "-c", conf],
                 cpu=ctx.server_cpu)
        p.wait_port(port)
        return p, port, {}
    if system == "haproxy":
        if not ctx.tool("haproxy"):
            raise SystemUnavailable("haproxy not installed")
        conf = haproxy_conf(ctx, port, upstreams, n, failover)
        p = Proc(ctx, "haproxy-%d" % port, [ctx.tool("haproxy"), "-db", "-f", conf],
                 cpu=ctx.server_cpu)
        p.wait_port(port)
        return p, port, {}
    if system == "pingora":
        if failover or len(upstreams) != 1:
            raise SystemUnavailable("plain Pingora forwards to one upstream: it cannot fail over")
        binary = os.path.join(ctx.bin_dir, PLAIN_PINGORA)
        if not os.access(binary, os.X_OK):
            raise SystemUnavailable(ctx.args.pingora_reason or "%s is missing (cargo build "
                                    "--release --example plain_pingora)" % binary)
        p = Proc(ctx, "pingora-%d" % port,
                 [binary, "127.0.0.1:%d" % port, "127.0.0.1:%d" % upstreams[0], str(n)],
                 cpu=ctx.server_cpu, env=ctx.env)
        p.wait_port(port)
        p.sigstop = signal.SIGINT  # Pingora: SIGINT = fast shutdown
        return p, port, {}
    if system == "signalbox":
        admin = free_port()
        providers = sb_providers or {"up": upstreams[0]}
        models = sb_models or {"lt-model": ["up"]}
        binary = os.path.join(ctx.bin_dir, "signalbox")
        conf = signalbox_conf(ctx, port, admin, providers, models, n, sb_health, ctx.sb_modern,
                              sb_failover)
        chk = subprocess.run([binary, "-t", "-c", conf], capture_output=True, text=True,
                             env=ctx.env, timeout=30)
        out = chk.stdout + chk.stderr
        if chk.returncode != 0 and ctx.sb_modern and re.search(r"(strategy|health)\b.*unknown|unknown.*\b(strategy|health)", out):
            # An older signalbox (no health-scored routing): no such keys, deployments in order.
            ctx.sb_modern = False
            ctx.notes.append("this signalbox build has no `strategy`/`health` config: "
                             "deployments are tried in the order written, no breakers")
            conf = signalbox_conf(ctx, port, admin, providers, models, n, None, False)
            chk = subprocess.run([binary, "-t", "-c", conf], capture_output=True, text=True,
                                 env=ctx.env, timeout=30)
        if sb_require_health and not ctx.sb_modern:
            raise SystemUnavailable("this signalbox build has no health/breakers to measure")
        if chk.returncode != 0:
            raise SystemUnavailable("signalbox -t rejected the generated config: %s"
                                    % (chk.stdout + chk.stderr).strip()[-400:])
        p = Proc(ctx, "signalbox-%d" % port, [binary, "-c", conf], cpu=ctx.server_cpu, env=ctx.env)
        p.wait_port(port)
        p.wait_port(admin)
        p.sigstop = signal.SIGINT  # Pingora: SIGINT = fast shutdown
        return p, port, {"admin": admin}
    if system == "litellm":
        exe = ctx.tool("litellm")
        if not exe:
            raise SystemUnavailable(ctx.tools.get("litellm_reason") or "litellm not installed")
        conf = litellm_conf(ctx, port, upstreams, failover)
        env = dict(ctx.env)
        env.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
                    # loopback-only load test without a master key
                    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
                    "LITELLM_TELEMETRY": "False", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True",
                    "PYTHONUNBUFFERED": "1"})
        p = Proc(ctx, "litellm-%d" % port,
                 [exe, "--config", conf, "--host", "127.0.0.1", "--port", str(port),
                  "--num_workers", str(n)], cpu=ctx.server_cpu, env=env)
        p.wait_port(port, timeout=240)
        return p, port, {}
    raise SystemUnavailable("unknown system %s" % system)


def stop(proc):
    if proc is None:
        return
    proc.stop(getattr(proc, "sigstop", signal.SIGTERM))
    if proc.name.startswith("signalbox-") and proc.ctx is not None:
        # Anything signalbox logged at warn or above during the run (RUST_LOG=warn).
        try:
            with open(proc.log_path, "rb") as f:
                lines = [ln for ln in f.read().decode(errors="replace").splitlines()
                         if " WARN " in ln or " ERROR " in ln]
        except OSError:
            lines = []
        if lines:
            kinds = {}
            for ln in lines:
                key = re.sub(r"^\S+\s+", "", ln)[:160]
                kinds[key] = kinds.get(key, 0) + 1
            top = sorted(kinds.items(), key=lambda kv: -kv[1])[:3]
            proc.ctx.notes.append("%s: signalbox logged %d warn/error lines, e.g. %s" % (
                proc.ctx.scenario, len(lines), "; ".join("%d× `%s`" % (n, k) for k, n in top)))


def post(port, model, stream=False, size=600, timeout=10):
    """One request; returns (status, headers dict, body bytes)."""
    body = json.dumps({"model": model, "stream": stream, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "x" * size}]})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", body=body,
                  headers={"Content-Type": "application/json",
                           "Authorization": "Bearer sk-load-test"})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def start_under_test(ctx, system, up_port, upstream, stream=False):
    """(proc, port, server) for one measured system in front of the upstream on `up_port`:
    for "direct" the upstream itself (proc None), else a freshly started proxy. Both are
    sanity-checked; on SystemUnavailable whatever was started is stopped before re-raising."""
    proc = None
    try:
        if system == "direct":
            port, server = up_port, upstream
        elif system == SB_NO_HOLD:
            proc, port, _ = start_system(ctx, "signalbox", [up_port],
                                         sb_failover={"first_chunk_hold": "0s"})
            server = proc
        else:
            proc, port, _ = start_system(ctx, system, [up_port])
            server = proc
        sanity(port, "lt-model", stream)
    except SystemUnavailable:
        stop(proc)
        raise
    return proc, port, server


def sanity(port, model, stream=False):
    """A single request through the system before loading it; raises on anything but 200."""
    try:
        st, hdrs, body = post(port, model, stream)
    except Exception as e:  # noqa: BLE001
        raise SystemUnavailable("sanity request failed: %s" % e)
    if st != 200:
        raise SystemUnavailable("sanity request answered %d: %s" % (st, body[:200]))
    return hdrs


def metrics_text(admin):
    try:
        c = http.client.HTTPConnection("127.0.0.1", admin, timeout=5)
        c.request("GET", "/metrics")
        return c.getresponse().read().decode(errors="replace")
    except Exception:  # noqa: BLE001
        return ""


def metric_sum(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all('%s="%s"' % (k, v) in line for k, v in labels.items()):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


# ---------------------------------------------------------------------------------------------
# load generators


def run_wrk(ctx, port, script, script_args, conns, duration, timeout_s=10):
    if not ctx.tool("wrk"):
        raise SystemUnavailable("wrk not installed")
    threads = max(1, min(ctx.gen_threads, conns))
    cmd = ([ctx.tool("wrk"), "-t", str(threads), "-c", str(conns), "-d", "%ds" % max(1, round(duration)),
            "--timeout", "%ds" % timeout_s, "-s", os.path.join(WRK_DIR, script),
            "http://127.0.0.1:%d" % port, "--"] + list(script_args))
    if ctx.load_cpu is not None:
        cmd = ["taskset", "-c", ctx.load_cpu] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    for line in out.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            return json.loads(line[len("WRK_JSON "):])
    raise SystemUnavailable("wrk produced no WRK_JSON line: %s" % (out.stdout + out.stderr)[-300:])


def wrk_result(res):
    e = res["errors"]
    p = res["latency_us"]["p"]
    dur = res["duration_us"] / 1e6
    return {"requests": res["requests"], "rps": res["requests"] / dur if dur else 0,
            "p50": p["50"], "p99": p["99"], "p999": p["99.9"],
            "errors": e["connect"] + e["read"] + e["write"] + e["status"] + e["timeout"],
            "error_detail": {k: v for k, v in e.items() if v}}


def run_oha(ctx, port, rate, duration, conns=64, body_path=None, model="lt-model"):
    oha = ctx.tool("oha")
    if not oha:
        raise SystemUnavailable("oha not installed (cargo install oha --root /tmp/lt-cargo)")
    # Keep-alive is oha's default (--disable-keepalive is a plain switch: "=false" is rejected).
    cmd = [oha, "-z", "%gs" % duration, "-c", str(conns), "-q", str(rate), "--latency-correction",
           "--no-tui", ctx.tools.get("oha_json_flag", "--output-format"),
           "json" if ctx.tools.get("oha_json_flag", "--output-format") == "--output-format" else None,
           "-m", "POST", "-H", "Content-Type: application/json",
           "-H", "Authorization: Bearer sk-load-test", "-D", body_path,
           "http://127.0.0.1:%d/v1/chat/completions" % port]
    cmd = [c for c in cmd if c is not None]
    if ctx.load_cpu is not None:
        cmd = ["taskset", "-c", ctx.load_cpu] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    try:
        j = json.loads(out.stdout)
    except ValueError:
        raise SystemUnavailable("oha output is not JSON: %s" % (out.stdout + out.stderr)[-300:])
    s = j.get("summary", {})
    lp = j.get("latencyPercentiles", {})
    codes = j.get("statusCodeDistribution", {}) or {}
    errs = j.get("errorDistribution", {}) or {}
    ok = sum(v for k, v in codes.items() if str(k).startswith("2"))
    bad = sum(v for k, v in codes.items() if not str(k).startswith("2"))
    nerr = sum(errs.values())
    # oha counts "aborted due to deadline" for requests in flight when -z ends: not failures.
    deadline_aborts = sum(v for k, v in errs.items() if "deadline" in k.lower())

    def us(v):
        return None if v is None else v * 1e6
    return {"requests": ok + bad, "rps": s.get("requestsPerSec") or 0,
            "ok_rps": ok / duration if duration else 0,
            "p50": us(lp.get("p50")), "p99": us(lp.get("p99")),
            "p999": us(lp.get("p99.9")), "errors": bad + nerr - deadline_aborts,
            "error_detail": dict(errs, **{"status_%s" % k: v for k, v in codes.items()
                                          if not str(k).startswith("2")})}


def run_sse(ctx, mode, port, model="lt-model", **kw):
    cmd = [sys.executable, SSE_CLIENT, mode, "--port", str(port), "--model", model]
    for k, v in kw.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    if ctx.load_cpu is not None:
        cmd = ["taskset", "-c", ctx.load_cpu] + cmd
    bound = float(kw.get("duration", 0)) + float(kw.get("warmup", 0)) + float(kw.get("timeout", 0)) + 90
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=bound)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemUnavailable("sse_client failed: %s" % (out.stdout + out.stderr)[-400:])


# ---------------------------------------------------------------------------------------------
# rows


def add_row(ctx, system, scenario, res=None, meter=None, failed=None, note=None, group=None,
            baseline_for_added=None):
    row = {"system": system, "scenario": scenario, "group": group or scenario}
    if failed:
        row["failed"] = failed
        log("%-9s %-28s FAILED: %s" % (system, scenario, failed))
    if res:
        row.update(res)
    if meter is not None and meter.cpu_s is not None:
        row["cpu_s"] = meter.cpu_s
        row["busy_pct"] = 100.0 * meter.cpu_s / meter.wall_s if meter.wall_s else None
        if res and res.get("requests"):
            row["cpu_us_per_req"] = meter.cpu_s * 1e6 / res["requests"]
        row["hwm_kb"] = meter.hwm_kb
        row["host_busy_pct"] = meter.host
        row["foreign_pct"] = meter.foreign
    if note:
        row["note"] = note
    if baseline_for_added:
        row["added_base"] = baseline_for_added
    if res and not failed:
        log("%-9s %-28s %9.0f req/s p50 %7.3f ms p99 %7.3f ms err %s cpu %s" % (
            system, scenario, res.get("rps") or 0, (res.get("p50") or 0) / 1e3,
            (res.get("p99") or 0) / 1e3, res.get("errors"),
            "%.1f us/req" % row["cpu_us_per_req"] if row.get("cpu_us_per_req") else "-"))
    ctx.rows.append(row)
    return row


def systems_for(ctx, include_litellm=True, include_pingora=False):
    """Plain Pingora only where asked (a, c): it has no failover (d) and b/f are not about
    the per-request cost it is a floor for."""
    out = ["direct", "nginx", "haproxy"] + (["pingora"] if include_pingora else []) + ["signalbox"]
    if ctx.args.with_litellm and include_litellm:
        out.append("litellm")
    return out


def host_busy(sample_s=0.5):
    s0 = cpu_stat()
    time.sleep(sample_s)
    s1 = cpu_stat()
    return 100.0 * (s1["cpu"][0] - s0["cpu"][0]) / max(1, s1["cpu"][1] - s0["cpu"][1])


def quiet_gate(ctx, per_wait=15.0):
    """Between measurements everything we run is idle: CPU use now is other jobs'. Wait a
    little (bounded per measurement and by the run's --wait-quiet budget) for it to pass."""
    if ctx.quiet_budget <= 0:
        return
    t0 = time.monotonic()
    busy = host_busy()
    if busy <= 15:
        return
    log("host %.0f%% busy with other jobs: pausing (budget left %.0fs)" % (busy, ctx.quiet_budget))
    while time.monotonic() - t0 < per_wait and ctx.quiet_budget > (time.monotonic() - t0):
        time.sleep(1.5)
        busy = host_busy()
        if busy <= 15:
            break
    ctx.quiet_budget -= time.monotonic() - t0


def measure_wrk(ctx, system, label, port, server, script, sargs, conns, note=None, group=None):
    try:
        quiet_gate(ctx)
        run_wrk(ctx, port, script, sargs, conns, ctx.warm)
        m = Meter(server, ctx)
        res = wrk_result(run_wrk(ctx, port, script, sargs, conns, ctx.dur))
        m.stop()
        return add_row(ctx, system, label, res, m, note=note, group=group)
    except (SystemUnavailable, subprocess.TimeoutExpired) as e:
        return add_row(ctx, system, label, failed=str(e), group=group)


def wrk_matrix(ctx, label, upstream, upstream_ports, script, conns, stream=False):
    """Direct and every proxy (plain Pingora included) in front of upstream_ports[0], one wrk
    run each."""
    for system in systems_for(ctx, include_pingora=True):
        try:
            proc, port, server = start_under_test(ctx, system, upstream_ports[0], upstream,
                                                  stream)
        except SystemUnavailable as e:
            add_row(ctx, system, label, failed=str(e))
            continue
        measure_wrk(ctx, system, label, port, server, script, ["lt-model"], conns)
        stop(proc)


# ---------------------------------------------------------------------------------------------
# scenarios


def scenario_a(ctx):
    log("scenario a: non-streaming, 2 KiB body, 64 connections")
    try:
        up, up_port = start_static_upstream(ctx)
    except SystemUnavailable as e:
        add_row(ctx, "all", "a 2 KiB, 64 conns", failed=str(e))
        return
    ctx.upstreams = [up]
    wrk_matrix(ctx, "a 2 KiB, 64 conns", up, [up_port], "chat-2k.lua", 64)
    stop(up)


def scenario_c(ctx):
    log("scenario c: non-streaming, 100 KiB body, 16 connections")
    try:
        up, up_port = start_static_upstream(ctx)
    except SystemUnavailable as e:
        add_row(ctx, "all", "c 100 KiB, 16 conns", failed=str(e))
        return
    ctx.upstreams = [up]
    wrk_matrix(ctx, "c 100 KiB, 16 conns", up, [up_port], "chat-100k.lua", 16)
    stop(up)


def scenario_b(ctx):
    chunks, gap = 20, 5
    log("scenario b: streaming, %d chunks, %d ms gap" % (chunks, gap))
    up_port = free_port()
    try:
        up = start_mock(ctx, "mock-stream", [up_port], ["--chunks", str(chunks), "--gap-ms", str(gap),
                                                         "--reply", STREAM_REPLY])
    except SystemUnavailable as e:
        add_row(ctx, "all", "b stream", failed=str(e))
        return
    ctx.upstreams = [up]
    sse_conns = 16
    lw = "b stream: wrk 64 conns (whole stream)"
    lt = "b stream: TTFB, %d conns" % sse_conns
    lc = "b stream: per-chunk delay"
    # signalbox twice: streams on the hold path (the default) and on the fast path (hold off).
    order = systems_for(ctx)
    order.insert(order.index("signalbox") + 1, SB_NO_HOLD)
    for system in order:
        try:
            proc, port, server = start_under_test(ctx, system, up_port, up, stream=True)
        except SystemUnavailable as e:
            for lab in (lw, lt, lc):
                add_row(ctx, system, lab, failed=str(e))
            continue
        measure_wrk(ctx, system, lw, port, server, "stream.lua", ["lt-model"], 64)
        try:
            quiet_gate(ctx)
            m = Meter(server, ctx)
            # The wrk stream run just before warmed the system up: record from the start, so
            # that the CPU time measured and the streams counted cover the same interval.
            r = run_sse(ctx, "measure", port, conns=sse_conns, duration=ctx.dur, warmup=0)
            m.stop()
            base = {"requests": r["streams"], "rps": r["streams_per_s"], "errors": r["errors"],
                    "error_detail": r["error_kinds"]}
            add_row(ctx, system, lt, dict(base, p50=r["ttfb_us"]["p50"], p99=r["ttfb_us"]["p99"],
                                          p999=r["ttfb_us"]["p99.9"]), m,
                    note="TTFT p50 %s us" % r["ttft_us"]["p50"])
            add_row(ctx, system, lc, dict(base, p50=r["chunk_us"]["p50"], p99=r["chunk_us"]["p99"],
                                          p999=r["chunk_us"]["p99.9"], chunks=r["chunk_us"]["n"]), m)
            if not r["chunk_us"]["n"] and r["streams"]:
                ctx.notes.append("b: %s's SSE events carry no `mock_sent_us` (it rebuilds each chunk "
                                 "and drops unknown fields), so its per-chunk delay cannot be "
                                 "measured" % system)
        except (SystemUnavailable, subprocess.TimeoutExpired) as e:
            add_row(ctx, system, lt, failed=str(e))
            add_row(ctx, system, lc, failed=str(e))
        stop(proc)
    stop(up)


def scenario_d(ctx):
    label = "d mixed failover (1 of 3 = 503), 64 conns"
    log("scenario d: " + label)
    a, b, f = free_port(), free_port(), free_port()
    try:
        ok = start_mock(ctx, "mock-ok", [a, b])
        bad = start_mock(ctx, "mock-503", [f], ["--behaviour", '{"kind":"status","code":503}'])
    except SystemUnavailable as e:
        add_row(ctx, "all", label, failed=str(e))
        return
    ctx.upstreams = [ok, bad]
    models = ["lt-mix-0", "lt-mix-1", "lt-mix-2"]
    sb_providers = {"ok-a": a, "fail-503": f, "ok-b": b}
    # Each model lists the three providers in a rotated order: one request in three starts on
    # the 503 provider and pays one failover hop.
    sb_models = {"lt-mix-0": ["fail-503", "ok-a", "ok-b"],
                 "lt-mix-1": ["ok-a", "ok-b", "fail-503"],
                 "lt-mix-2": ["ok-b", "fail-503", "ok-a"]}
    # signalbox runs twice: breakers off (every plan starting on the 503 provider pays the hop,
    # like the plain proxies configured without passive health checks), then with its default
    # health settings (the 503 provider gets ejected and is only probed now and then).
    order = systems_for(ctx)
    order.insert(order.index("signalbox") + 1, SB_HEALTH)
    for system in order:
        proc, info = None, {}
        try:
            if system == "direct":
                port, server = a, ok
            else:
                proc, port, info = start_system(
                    ctx, "signalbox" if system == SB_HEALTH else system, [f, a, b],
                    failover=True, sb_models=sb_models, sb_providers=sb_providers,
                    sb_health=HEALTH_OFF if system == "signalbox" else None,
                    sb_require_health=system == SB_HEALTH)
                server = proc
            note = None
            if system.startswith("signalbox"):
                h = sanity(port, "lt-mix-0")
                note = "sanity lt-mix-0: attempts=%s fallback=%s via=%s" % (
                    h.get("x-llm-attempts"), h.get("x-llm-fallback"), h.get("x-routed-via"))
                ctx.notes.append("d: %s %s" % (system, note))
            else:
                # A proxy that does not always fail over is still measured (its errors count):
                # one good answer in three sanity requests is enough to go on.
                fails = []
                for _ in range(3):
                    try:
                        sanity(port, "lt-mix-0")
                    except SystemUnavailable as e:
                        fails.append(str(e))
                if len(fails) == 3:
                    raise SystemUnavailable(fails[0])
                if fails:
                    ctx.notes.append("d: %s failed %d of 3 sanity requests: %s"
                                     % (system, len(fails), fails[0][:200]))
        except SystemUnavailable as e:
            add_row(ctx, system, label, failed=str(e))
            stop(proc)
            continue
        row = measure_wrk(ctx, system, label, port, server, "mixed.lua", models, 64)
        if system.startswith("signalbox") and not row.get("failed"):
            t = metrics_text(info["admin"])
            att = metric_sum(t, "signalbox_attempts_total")
            reqs = metric_sum(t, "signalbox_requests_total")
            fo = metric_sum(t, "signalbox_failovers_total")
            if reqs:
                row["note"] = "attempts/request %.3f, failovers %.0f of %.0f requests" % (
                    att / reqs, fo, reqs)
                ctx.notes.append("d: %s /metrics: %s" % (system, row["note"]))
        stop(proc)
    stop(ok)
    stop(bad)


def oha_body(ctx):
    path = os.path.join(ctx.tmp, "body-2k.json")
    if not os.path.exists(path):
        head = ('{"model":"lt-model","stream":false,"max_tokens":64,"messages":[{"role":"system",'
                '"content":"You are a load test."},{"role":"user","content":"')
        tail = '"}]}'
        pad = 2048 - len(head) - len(tail)
        with open(path, "w") as f:
            f.write(head + ("lorem ipsum dolor sit amet " * 100)[:pad] + tail)
    return path


def scenario_e(ctx):
    log("scenario e: fixed-rate latency with oha, and the frontier")
    if not ctx.tool("oha"):
        add_row(ctx, "all", "e fixed rate (oha)", failed="oha not installed; skipped "
                "(cargo install oha --locked --root /tmp/lt-cargo)")
        return
    try:
        up, up_port = start_static_upstream(ctx)
    except SystemUnavailable as e:
        add_row(ctx, "all", "e fixed rate", failed=str(e))
        return
    ctx.upstreams = [up]
    body = oha_body(ctx)
    rates = [1000, 5000]
    step = 2.0 if ctx.args.quick else 3.0
    max_steps = 5 if ctx.args.quick else 8
    for system in ["direct", "nginx", "haproxy", "pingora", "signalbox"]:
        proc = None
        try:
            proc, port, server = start_under_test(ctx, system, up_port, up)
            run_wrk(ctx, port, "chat-2k.lua", ["lt-model"], 16, ctx.warm)
        except (SystemUnavailable, subprocess.TimeoutExpired) as e:
            for r in rates:
                add_row(ctx, system, "e %d req/s fixed (oha)" % r, failed=str(e), group="e%d" % r)
            add_row(ctx, system, "e frontier: p99<10ms, 0 err", failed=str(e), group="efront")
            stop(proc)
            continue
        for r in rates:
            lab = "e %d req/s fixed (oha)" % r
            try:
                quiet_gate(ctx)
                m = Meter(server, ctx)
                res = run_oha(ctx, port, r, ctx.dur, body_path=body)
                m.stop()
                add_row(ctx, system, lab, res, m, group="e%d" % r)
            except (SystemUnavailable, subprocess.TimeoutExpired) as e:
                add_row(ctx, system, lab, failed=str(e), group="e%d" % r)
        # Frontier: doubling from 2,000 req/s, then bisection; at most max_steps runs.
        tried = []

        def passes(rate):
            m = Meter(server, ctx)
            res = run_oha(ctx, port, rate, step, body_path=body)
            m.stop()
            ok = (res["errors"] == 0 and res["p99"] is not None and res["p99"] < 10000
                  and res["rps"] >= 0.95 * rate)
            tried.append((rate, ok, res, m))
            log("  frontier %-9s %6d req/s -> %s (achieved %.0f, p99 %.2f ms, err %d)" % (
                system, rate, "pass" if ok else "FAIL", res["rps"], (res["p99"] or 0) / 1e3,
                res["errors"]))
            return ok
        lo, hi = None, None
        rate = 2000
        quiet_gate(ctx)
        try:
            while len(tried) < max_steps:
                if hi is None:
                    if passes(rate):
                        lo = rate
                        rate *= 2
                    else:
                        hi = rate
                else:
                    base = lo or 0
                    if hi - base <= max(250, hi // 16):
                        break
                    mid = int(round((base + hi) / 2 / 250.0)) * 250
                    if passes(mid):
                        lo = mid
                    else:
                        hi = mid
            best = [t for t in tried if t[1] and t[0] == lo]
            lab = "e frontier: p99<10ms, 0 err"
            if best:
                r_, _, res, m = best[-1]
                add_row(ctx, system, lab, dict(res, frontier=lo), m, group="efront",
                        note="frontier %d req/s (%s)" % (lo, ", ".join(
                            "%d%s" % (t[0], "+" if t[1] else "-") for t in tried)))
            else:
                add_row(ctx, system, lab, failed="no tried rate passed (%s)" % ", ".join(
                    "%d" % t[0] for t in tried), group="efront")
        except (SystemUnavailable, subprocess.TimeoutExpired) as e:
            add_row(ctx, system, "e frontier: p99<10ms, 0 err", failed=str(e), group="efront")
        stop(proc)
    stop(up)


def scenario_f(ctx):
    n = ctx.args.streams
    gap_ms = 1000 if ctx.args.quick else 2000
    chunks = 10
    label = "f %d slow streams" % n
    log("scenario f: %d concurrent slow streams (%d chunks x %d ms)" % (n, chunks, gap_ms))
    up_port = free_port()
    try:
        up = start_mock(ctx, "mock-slow", [up_port], ["--chunks", str(chunks), "--gap-ms", str(gap_ms),
                                                      "--reply", STREAM_REPLY])
    except SystemUnavailable as e:
        add_row(ctx, "all", label, failed=str(e), group="f")
        return
    ctx.upstreams = [up]
    ramp = 2000.0
    stream_s = chunks * gap_ms / 1000.0
    bound = n / ramp + stream_s + 40
    # The same client straight to the mock first: its TTFB under this connection ramp is the
    # client's own baseline (the client and the mock share the load CPU).
    for system in ("direct", "nginx", "pingora", "signalbox", SB_NO_HOLD):
        try:
            proc, port, server = start_under_test(ctx, system, up_port, up)
        except SystemUnavailable as e:
            add_row(ctx, system, label + ": TTFB", failed=str(e), group="f")
            continue
        pids = server.tree()
        idle = {"rss_kb": status_kb(pids, "VmRSS"),
                "fds": sum(fd_count(p) or 0 for p in pids)}
        # Each proxied stream holds two descriptors in the gateway (client side, upstream side).
        per_stream = 1 if system == "direct" else 2
        reachable = (ctx.fd_limit - (idle["fds"] or 0)) // per_stream
        if n > reachable:
            ctx.notes.append("f: the open-files limit here is %d (a hard limit: raising it needs "
                             "CAP_SYS_RESOURCE, which this sandbox does not grant), so %s can hold "
                             "at most ~%d streams (%d descriptor%s each); %d were attempted anyway"
                             % (ctx.fd_limit, system, reachable, per_stream,
                                "s" if per_stream > 1 else "", n))
        try:
            quiet_gate(ctx)
            m = Meter(server, ctx)
            r = run_sse(ctx, "hold", port, streams=n, ramp_rate=ramp, timeout=bound,
                        settle=12, watch_pid=",".join(str(p) for p in pids), connect_timeout=15)
            m.stop()
            after = r.get("after") or {}
            note = ("%s: %d/%d streams open at once, %d completed, %d errors; %s idle %s fds / "
                    "%.0f MiB RSS, peak %s fds / %.0f MiB, %ss after the end %s fds / %.0f MiB" % (
                        system, r["peak_open"], n, r["completed"], r["errors"], system, idle["fds"],
                        (idle["rss_kb"] or 0) / 1024.0, r["peak_fds"], r["peak_rss_kb"] / 1024.0,
                        r["settle_s"], after.get("fds"), (after.get("rss_kb") or 0) / 1024.0))
            res = {"requests": r["completed"], "rps": None, "p50": r["ttfb_us"]["p50"],
                   "p99": r["ttfb_us"]["p99"], "p999": r["ttfb_us"]["p99.9"],
                   "errors": r["errors"], "error_detail": r["error_kinds"], "hold": r, "idle": idle}
            add_row(ctx, system, label + ": TTFB", res, m, note=note, group="f")
            ctx.notes.append("f: " + note + (("; error kinds " + json.dumps(r["error_kinds"]))
                                             if r["errors"] else ""))
        except (SystemUnavailable, subprocess.TimeoutExpired) as e:
            add_row(ctx, system, label + ": TTFB", failed=str(e), group="f")
        stop(proc)
    stop(up)


def scenario_g(ctx):
    log("scenario g: failover cost at 1 connection")
    okp, failp, refused = free_port(), free_port(), free_port()
    proc = None
    try:
        ok = start_mock(ctx, "mock-ok-g", [okp])
        bad = start_mock(ctx, "mock-503-g", [failp], ["--behaviour", '{"kind":"status","code":503}'])
    except SystemUnavailable as e:
        add_row(ctx, "all", "g failover cost", failed=str(e), group="g")
        return
    ctx.upstreams = [ok, bad]
    clean = "g clean, 1 conn"
    labels = {"lt-clean": clean, "lt-refused": "g +1 hop: refused port, 1 conn",
              "lt-503": "g +1 hop: 503, 1 conn"}
    # Reference: the same single connection direct and through the plain proxies (plain Pingora
    # included), to show what a proxy hop costs on this VM at this (low, wake-up dominated) rate.
    for system in ("direct", "nginx", "haproxy", "pingora"):
        try:
            proc, port, server = start_under_test(ctx, system, okp, ok)
        except SystemUnavailable as e:
            add_row(ctx, system, clean, failed=str(e), group="g")
            continue
        measure_wrk(ctx, system, clean, port, server, "chat-2k.lua", ["lt-model"], 1, group="g")
        stop(proc)
        proc = None
    try:
        proc, port, info = start_system(
            ctx, "signalbox", [okp],
            sb_providers={"ok": okp, "fail-503": failp, "refused": refused},
            sb_models={"lt-clean": ["ok"], "lt-refused": ["refused", "ok"], "lt-503": ["fail-503", "ok"]},
            sb_health=HEALTH_OFF)
        for model in ("lt-clean", "lt-refused", "lt-503"):
            h = sanity(port, model)
            ctx.notes.append("g: signalbox %s: x-llm-attempts=%s x-llm-fallback=%s server-timing=%s"
                             % (model, h.get("x-llm-attempts"), h.get("x-llm-fallback"),
                                h.get("server-timing")))
    except SystemUnavailable as e:
        for model in ("lt-clean", "lt-refused", "lt-503"):
            add_row(ctx, "signalbox", labels[model], failed=str(e), group="g")
        stop(proc)
        stop(ok)
        stop(bad)
        return
    for model in ("lt-clean", "lt-refused", "lt-503"):
        row = measure_wrk(ctx, "signalbox", labels[model], port, proc, "chat-2k.lua", [model], 1,
                          group="g")
        if model != "lt-clean":
            row["added_base"] = ("signalbox", clean)
    t = metrics_text(info["admin"])
    ctx.notes.append("g: signalbox /metrics after the runs: attempts %.0f, failovers %.0f, "
                     "requests %.0f" % (metric_sum(t, "signalbox_attempts_total"),
                                        metric_sum(t, "signalbox_failovers_total"),
                                        metric_sum(t, "signalbox_requests_total")))
    stop(proc)
    stop(ok)
    stop(bad)


def scenario_h(ctx):
    """Hedged first token: a pool of two where the first provider has a slow tail (every 10th
    call waits 800 ms, the rest answer at once). p50/p99 latency (a whole answer's first byte
    is its header, so latency is the TTFB) with hedging off and on (after 100 ms, max_share
    0.2), and the extra upstream calls hedging cost (attempts per request from /metrics)."""
    log("scenario h: one slow-tailed provider in a pool of two, hedging off vs on")
    slowp, fastp = free_port(), free_port()
    proc = None
    try:
        slow = start_mock(ctx, "mock-tail-h", [slowp],
                          ["--behaviour", '{"kind":"slow_every","ms":800,"every":10}'])
        fast = start_mock(ctx, "mock-ok-h", [fastp])
    except SystemUnavailable as e:
        add_row(ctx, "signalbox", "h hedging", failed=str(e), group="h")
        return
    ctx.upstreams = [slow, fast]
    hedges = {"h hedge off, 16 conns": None,
              "h hedge after 100ms, 16 conns": {"hedge": {"after": "100ms", "max_share": 0.2}}}
    for label, failover in hedges.items():
        try:
            proc, port, info = start_system(
                ctx, "signalbox", [slowp],
                sb_providers={"tail": slowp, "ok": fastp},
                sb_models={"lt-model": ["tail", "ok"]},
                sb_health=HEALTH_OFF, sb_failover=failover)
        except SystemUnavailable as e:
            add_row(ctx, "signalbox", label, failed=str(e), group="h")
            continue
        measure_wrk(ctx, "signalbox", label, port, proc, "chat-2k.lua", ["lt-model"], 16,
                    group="h")
        t = metrics_text(info["admin"])
        requests = metric_sum(t, "signalbox_requests_total") or 1.0
        ctx.notes.append("h: %s: %.3f upstream calls per request, hedges won %.0f lost %.0f "
                         "(of %.0f requests)" % (
                             label, metric_sum(t, "signalbox_attempts_total") / requests,
                             metric_sum(t, "signalbox_hedges_total", outcome="won"),
                             metric_sum(t, "signalbox_hedges_total", outcome="lost"), requests))
        stop(proc)
        proc = None
    stop(slow)
    stop(fast)


SCENARIOS = {"a": scenario_a, "b": scenario_b, "c": scenario_c, "d": scenario_d,
             "e": scenario_e, "f": scenario_f, "g": scenario_g, "h": scenario_h}


# ---------------------------------------------------------------------------------------------
# report


def fmt_ms(us):
    if us is None:
        return "-"
    ms = us / 1000.0
    if ms < 1:
        return "%.3f" % ms
    if ms < 100:
        return "%.2f" % ms
    return "%.0f" % ms


def ratio(v, base):
    if v is None or not base:
        return "n/a"
    x = v / base
    return ("%.2f×" % x) if x >= 0.1 else ("%.3f×" % x)


def find(rows, system, group):
    for r in rows:
        if r["system"] == system and r["group"] == group and not r.get("failed"):
            return r
    return None


def find_label(rows, system, label):
    for r in rows:
        if r["system"] == system and r["scenario"] == label and not r.get("failed"):
            return r
    return None


def table(ctx):
    hdr = ("| system | scenario | requests/s (× nginx) | p50 ms (× direct) | p99 ms (× direct) "
           "| p99.9 ms (× direct) | added p50 / p99 ms vs direct | server CPU µs/req (× nginx) "
           "| server busy % | peak RSS MiB (× nginx) | errors |")
    sep = "|" + "---|" * 11
    out = [hdr, sep]
    groups = []
    for r in ctx.rows:
        if r["group"] not in groups:
            groups.append(r["group"])
    for g in groups:
        rows = [r for r in ctx.rows if r["group"] == g]
        rows.sort(key=lambda r: (r["scenario"], SYSTEM_ORDER.index(r["system"])
                                 if r["system"] in SYSTEM_ORDER else 99))
        if g == "g":
            rows.sort(key=lambda r: (SYSTEM_ORDER.index(r["system"]) if r["system"] in SYSTEM_ORDER
                                     else 99, r["scenario"] != "g clean, 1 conn"))
        for r in rows:
            if r.get("failed"):
                out.append("| %s | %s | **not measured:** %s | | | | | | | | |" % (
                    r["system"], r["scenario"], r["failed"].replace("|", "/").replace("\n", " ")[:300]))
                continue
            ngx = find_label(ctx.rows, "nginx", r["scenario"])
            if r.get("added_base"):
                bsys, blab = r["added_base"]
                base = find_label(ctx.rows, bsys, blab)
                base_name = "clean"
            else:
                base = find_label(ctx.rows, "direct", r["scenario"])
                base_name = "direct"
            rps = r.get("rps")
            if r.get("frontier"):
                rps_cell = "**%s** frontier (%s)" % ("{:,}".format(r["frontier"]), ratio(
                    r["frontier"], ngx.get("frontier") if ngx else None))
            elif rps is None:
                rps_cell = "-"
            else:
                rps_cell = "%s (%s)" % ("{:,.0f}".format(rps), ratio(rps, ngx.get("rps") if ngx else None))

            def lat(key):
                v = r.get(key)
                if v is None:
                    return "-"
                if r["system"] == "direct" or not base or r.get("frontier"):
                    return fmt_ms(v)
                return "%s (%s)" % (fmt_ms(v), ratio(v, base.get(key)))
            if r.get("frontier"):
                added = "- (rates differ)"
            elif r.get("p50") is None:
                added = "n/a"
            elif base and r is not base and r["system"] != "direct" or (base and r.get("added_base")):
                a50 = (r.get("p50") or 0) - (base.get("p50") or 0)
                a99 = (r.get("p99") or 0) - (base.get("p99") or 0)
                added = "%+.3f / %+.3f%s" % (a50 / 1e3, a99 / 1e3, " vs clean" if base_name == "clean" else "")
            elif r["system"] == "direct":
                added = "(baseline)"
            else:
                added = "n/a"
            cpu = r.get("cpu_us_per_req")
            cpu_cell = "-" if cpu is None else "%.1f (%s)" % (
                cpu, ratio(cpu, ngx.get("cpu_us_per_req") if ngx else None))
            busy = r.get("busy_pct")
            busy_cell = "-" if busy is None else "%.0f" % busy
            foreign = max((r.get("foreign_pct") or {}).values() or [0])
            if busy is not None and foreign >= FOREIGN_FLAG:
                busy_cell += " ⚠%.0f" % foreign
                ctx.flagged = True
            hwm = r.get("hwm_kb")
            hwm_cell = "-" if not hwm else "%.1f (%s)" % (hwm / 1024.0, ratio(
                hwm, ngx.get("hwm_kb") if ngx else None))
            errs = r.get("errors") or 0
            reqs = r.get("requests") or 0
            err_cell = "0" if not errs else "**%d** (%.2f%%)%s" % (
                errs, 100.0 * errs / max(1, reqs + errs),
                " " + ",".join("%s=%s" % kv for kv in sorted((r.get("error_detail") or {}).items()))[:80])
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["system"], r["scenario"], rps_cell, lat("p50"), lat("p99"), lat("p999"), added,
                cpu_cell, busy_cell, hwm_cell, err_cell))
    return "\n".join(out)


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def bin_mtime(ctx):
    try:
        t = os.path.getmtime(os.path.join(ctx.bin_dir, "signalbox"))
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
    except OSError:
        return "?"


def pingora_version(ctx):
    binary = os.path.join(ctx.bin_dir, PLAIN_PINGORA)
    try:
        t = datetime.datetime.fromtimestamp(os.path.getmtime(binary)).strftime("%Y-%m-%d %H:%M")
    except OSError:
        return "unavailable (%s)" % (ctx.args.pingora_reason or "%s missing" % binary)
    return "%s (built %s from the repo's examples/plain_pingora.rs)" % (binary, t)


def pingora_notes(ctx):
    """signalbox ÷ plain Pingora, same run: how much of signalbox's cost is Pingora itself."""
    out = []
    for label in ("a 2 KiB, 64 conns", "c 100 KiB, 16 conns", "e frontier: p99<10ms, 0 err",
                  "g clean, 1 conn"):
        sb, pp = find_label(ctx.rows, "signalbox", label), find_label(ctx.rows, "pingora", label)
        if not sb or not pp:
            continue
        key = "frontier" if label.startswith("e frontier") else "rps"
        out.append("%s: signalbox vs plain Pingora, same run: %s throughput, %s CPU per request "
                   "(%s vs %s %s; %s vs %s µs/req)" % (
                       label, ratio(sb.get(key), pp.get(key)),
                       ratio(sb.get("cpu_us_per_req"), pp.get("cpu_us_per_req")),
                       "{:,.0f}".format(sb.get(key) or 0), "{:,.0f}".format(pp.get(key) or 0),
                       "req/s frontier" if key == "frontier" else "req/s",
                       fmt_cpu(sb.get("cpu_us_per_req")), fmt_cpu(pp.get("cpu_us_per_req"))))
    return out


def fmt_cpu(v):
    return "-" if v is None else "%.1f" % v


def machine_spec(ctx):
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    model = sh("lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1")
    hyp = sh("lscpu | sed -n 's/^Hypervisor vendor:[[:space:]]*//p' | head -1")
    rev = sh("git -C %s rev-parse --short HEAD" % REPO)
    dirty = sh("git -C %s status --porcelain -- src Cargo.toml Cargo.lock | head -1" % REPO)
    versions = [
        ("signalbox", "binaries %s (built %s%s)%s" % (
            ctx.bin_dir, bin_mtime(ctx), ", " + ctx.args.bin_label if ctx.args.bin_label else "",
            ("; repo HEAD %s%s" % (rev, ", work tree has uncommitted src changes" if dirty else ""))
            if os.path.abspath(ctx.bin_dir).startswith(REPO + os.sep) else "")),
        ("plain_pingora", pingora_version(ctx)),
        ("rustc", sh("rustc --version")),
        ("wrk", sh("wrk -v 2>&1 | head -1") if ctx.tool("wrk") else "missing"),
        ("oha", sh("%s --version" % ctx.tool("oha")) if ctx.tool("oha") else "missing"),
        ("nginx", sh("nginx -v 2>&1") if ctx.tool("nginx") else "missing"),
        ("haproxy", sh("haproxy -v | head -1") if ctx.tool("haproxy") else "missing"),
        ("python", sys.version.split()[0]),
    ]
    if ctx.args.with_litellm:
        versions.append(("litellm", ctx.tools.get("litellm_version") or "unavailable"))
    pin = ("server (proxy under test) on CPU %s; load generator and upstreams on CPU %s"
           % (ctx.server_cpu, ctx.load_cpu)) if ctx.pinned else "not pinned (--no-pin or < 2 CPUs)"
    lines = [
        "- machine: %s%s, %d CPUs, %.1f GiB RAM, kernel %s (%s)" % (
            model, " (%s VM)" % hyp if hyp else "", os.cpu_count() or 0, mem_kb / 1048576.0,
            platform.release(), sh(". /etc/os-release && echo $PRETTY_NAME")),
        "- tools: " + "; ".join("%s %s" % kv for kv in versions),
        "- host load: %.0f%% CPU busy just before the run; 1-min load average %.2f at the start, "
        "%.2f at most during the run (other jobs on this shared machine add noise: see ⚠ below; "
        "per-CPU busy %% of every measurement is in the .json)" % (
            ctx.busy_start, ctx.load_start, LOADAVG_MAX[0]),
        "- run: threads/workers per system %d; %s; duration %gs per measurement (+%gs warm-up)%s; "
        "scenarios %s" % (ctx.args.threads, pin, ctx.dur, ctx.warm,
                          " (--quick)" if ctx.args.quick else "", ",".join(ctx.args.scenarios)) +
        ("; every process of the run at nice %s" % ctx.args.nice if ctx.args.nice != "0" else ""),
    ]
    return "\n".join(lines)


def write_report(ctx, started):
    tbl = table(ctx)
    stamp = started.strftime("%Y-%m-%d-%H%M")
    out_dir = ctx.args.out_dir
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "%s.md" % stamp)
    sb_a = find_label(ctx.rows, "signalbox", "a 2 KiB, 64 conns")
    dir_a = find_label(ctx.rows, "direct", "a 2 KiB, 64 conns")
    checks = []
    if sb_a and dir_a:
        k = dir_a["rps"] / sb_a["rps"] if sb_a["rps"] else 0
        checks.append("- upstream headroom: the nginx static upstream alone (direct, same CPU layout) "
                      "served %s req/s = %.1f× signalbox's %s req/s in scenario a (%s the ≥3× "
                      "requirement)." % ("{:,.0f}".format(dir_a["rps"]), k,
                                         "{:,.0f}".format(sb_a["rps"]), "meets" if k >= 3 else
                                         "does NOT meet"))
    doc = ["# signalbox load test, %s" % started.strftime("%Y-%m-%d %H:%M"), "",
           machine_spec(ctx), "",
           "Ratios compare with the baseline measured in the same run: nginx for throughput, CPU "
           "and RSS; direct-to-upstream for latency (`added` = system minus direct at the same "
           "load; in scenario g, minus signalbox's clean request). Latency for wrk rows is closed "
           "loop; oha rows are open loop at a fixed rate with latency correction. Server CPU "
           "= utime+stime of the server's process tree ÷ requests; busy % = CPU time ÷ wall time "
           "(100 = one core saturated); peak RSS = VmHWM (summed over the process tree; for "
           "direct rows, the upstream's). `b stream` rows: wrk = whole stream, TTFB = response "
           "header, per-chunk = receive time − mock_sent_us. `pingora` = a plain Pingora proxy "
           "(examples/plain_pingora.rs: one upstream, keep-alive, no routing work), the floor of "
           "any Pingora-based proxy here; the Notes give signalbox ÷ pingora.", "",
           tbl, ""]
    checks += ["- " + n for n in pingora_notes(ctx)]
    if ctx.flagged:
        checks.append("- ⚠N in the busy column: other jobs on this machine used N % of a CPU "
                      "(on the server's CPU or the load generator's) during that measurement, "
                      "beyond the server, upstreams and load generator: treat that row as noisy.")
    if checks or ctx.notes:
        doc += ["## Notes", ""] + checks + ["- " + n for n in ctx.notes] + [""]
    with open(path, "w") as f:
        f.write("\n".join(doc))
    with open(os.path.join(out_dir, "%s.json" % stamp), "w") as f:
        json.dump({"rows": ctx.rows, "notes": ctx.notes, "args": vars(ctx.args)}, f, indent=1,
                  default=str)
    if os.path.abspath(out_dir) == os.path.join(LT_DIR, "results"):
        shutil.copyfile(path, os.path.join(out_dir, "LATEST.md"))
        readme = os.path.join(LT_DIR, "README.md")
        try:
            with open(readme) as f:
                text = f.read()
            new = re.sub(r"(<!-- latest-results -->).*?(<!-- /latest-results -->)",
                         lambda m: "%s[%s](results/%s.md) (also [results/LATEST.md](results/LATEST.md))%s"
                         % (m.group(1), stamp, stamp, m.group(2)), text, flags=re.S)
            if new != text:
                with open(readme, "w") as f:
                    f.write(new)
        except OSError:
            pass
    print(tbl)
    print()
    print("written: %s" % os.path.relpath(path, os.getcwd()))
    for c in checks:
        print(c)
    for n in ctx.notes:
        print("- " + n)


# ---------------------------------------------------------------------------------------------


def detect_tools(ctx):
    for t in ("wrk", "nginx", "haproxy", "taskset"):
        ctx.tools[t] = shutil.which(t) or (("/usr/sbin/" + t) if os.path.exists("/usr/sbin/" + t) else None)
    oha = shutil.which("oha") or ("/tmp/lt-cargo/bin/oha" if os.path.exists("/tmp/lt-cargo/bin/oha") else None)
    ctx.tools["oha"] = oha
    if oha:
        h = sh("%s --help" % oha)
        ctx.tools["oha_json_flag"] = "--output-format" if "--output-format" in h else "-j"
    if ctx.args.with_litellm:
        exe = ctx.args.litellm_bin
        if exe and os.path.exists(exe):
            ctx.tools["litellm"] = exe
            ctx.tools["litellm_version"] = sh(
                "%s -m pip show litellm 2>/dev/null | sed -n 's/^Version: //p'"
                % os.path.join(os.path.dirname(exe), "python"))
        else:
            ctx.tools["litellm_reason"] = ("litellm is not installed (%s)"
                                           % (ctx.args.litellm_reason or "pip install failed"))
    for t in ("wrk", "nginx", "haproxy", "oha"):
        if not ctx.tools.get(t):
            ctx.notes.append("tool missing: %s (its rows are marked not measured)" % t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--with-litellm", action="store_true")
    p.add_argument("--litellm-bin", default="")
    p.add_argument("--litellm-reason", default="")
    p.add_argument("--pingora-reason", default="")
    p.add_argument("--scenarios", default="a,b,c,d,e,f,g,h")
    p.add_argument("--streams", type=int, default=10000)
    p.add_argument("--out-dir", default=os.path.join(LT_DIR, "results"))
    p.add_argument("--tmp", required=True)
    p.add_argument("--wait-quiet", type=float, default=0.0)
    p.add_argument("--bin-label", default="")
    p.add_argument("--nice", default="0")
    args = p.parse_args()
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in args.scenarios:
        if s not in SCENARIOS:
            sys.exit("unknown scenario %r (a-g)" % s)
    ctx = Ctx(args)
    started = datetime.datetime.now()

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    detect_tools(ctx)
    ctx.load_start = loadavg()
    wait_until = time.monotonic() + args.wait_quiet
    t_wait = time.monotonic()
    while True:
        s0 = cpu_stat()
        time.sleep(1.0)
        s1 = cpu_stat()
        ctx.busy_start = 100.0 * (s1["cpu"][0] - s0["cpu"][0]) / max(1, s1["cpu"][1] - s0["cpu"][1])
        if ctx.busy_start <= 10 or time.monotonic() >= wait_until:
            break
        log("host %.0f%% busy: waiting for it to be quiet (at most %.0fs more)"
            % (ctx.busy_start, wait_until - time.monotonic()))
        time.sleep(4.0)
    # What is left of the budget serves the pauses between measurements (quiet_gate).
    ctx.quiet_budget = max(0.0, args.wait_quiet - (time.monotonic() - t_wait))
    if ctx.busy_start > 20:
        log("WARNING: the host is already %.0f%% busy before the run (other jobs): results will "
            "be noisy; rows with foreign load are flagged" % ctx.busy_start)
    try:
        for s in args.scenarios:
            ctx.scenario = s
            t0 = time.monotonic()
            try:
                SCENARIOS[s](ctx)
            except (SystemUnavailable, subprocess.TimeoutExpired, OSError) as e:
                add_row(ctx, "all", "scenario %s" % s, failed="aborted: %s" % e, group=s)
            finally:
                for proc in list(ctx.procs):
                    stop(proc)
            log("scenario %s took %.0fs" % (s, time.monotonic() - t0))
        write_report(ctx, started)
    finally:
        for proc in list(ctx.procs):
            stop(proc)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        log("interrupted (%s): stopped every process started" % (e or "SIGINT"))
        sys.exit(130)
