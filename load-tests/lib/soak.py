#!/usr/bin/env python3
"""The soak of load-tests/soak.sh (see load-tests/README.md, "Soak"). Standard library only.

Starts three signalbox-mock providers (healthy slow SSE; one failing every call, listed first
for part of the traffic; one dying mid-stream), signalbox in front of them with a config
written to the temp dir, then lib/soak_client.py with N streams; samples the gateway's RSS,
descriptors and in-flight gauge before (idle), during (peak) and after (idle again, bounded
polls), and writes a markdown + JSON summary. Exit status 0 only if every stream that was not
hung up ended intact or with its error event and the gateway returned to idle.
"""

import argparse
import datetime
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

LT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# signalbox's upstream pools keep an idle connection this long (src/proxy/driven.rs POOL_IDLE,
# src/catalog/mod.rs UPSTREAM_IDLE): pooled keep-alive connections to the healthy mock are
# expected right after the run, and gone once this has passed.
POOL_IDLE_S = 60
# Descriptors that are not sockets to the mocks or callers (eventfds, epoll, timers, log
# files) may differ by this many between the idle samples: runtimes create some lazily.
FD_TOL = 2
IN_FLIGHT = "signalbox_requests_in_flight"
FAIL_BEHAVIOURS = {
    "503": '{"kind":"status","code":503}',
    "reset": '{"kind":"reset"}',
    "close": '{"kind":"close"}',
}


def log(msg):
    sys.stderr.write("[soak %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Fail(Exception):
    pass


class Proc:
    """A process in its own process group (pgid = pid), recorded in the pid file the EXIT trap
    of soak.sh reads; output to TMP/<name>.log."""

    def __init__(self, tmp, pidfile, name, cmd, env=None, cpu=None):
        self.name = name
        self.log_path = os.path.join(tmp, name + ".log")
        if cpu is not None:
            cmd = ["taskset", "-c", cpu] + cmd
        with open(self.log_path, "ab") as logf:
            self.popen = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.popen.pid
        with open(pidfile, "a") as f:
            f.write("%d\n" % self.pid)

    def alive(self):
        return self.popen.poll() is None

    def tail(self, n=6):
        try:
            with open(self.log_path, "rb") as f:
                return " | ".join(f.read().decode(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def wait_port(self, port, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.alive():
                raise Fail("%s exited (rc %s): %s" % (self.name, self.popen.returncode, self.tail()))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise Fail("%s not listening on %d after %.0f s: %s" % (self.name, port, timeout, self.tail()))

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
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(3)
        except subprocess.TimeoutExpired:
            pass


# ---------------------------------------------------------------------------------------------
# what the gateway holds


def status_kb(pid, key):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def fd_count(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def tcp_table(pid):
    """inode -> (local port, remote port, state hex) for the process' network namespace."""
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                next(f)
                for line in f:
                    p = line.split()
                    lport = int(p[1].rsplit(":", 1)[1], 16)
                    rport = int(p[2].rsplit(":", 1)[1], 16)
                    out[int(p[9])] = (lport, rport, p[3])
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return out


def fd_breakdown(pid, proxy_port, admin_port, mock_ports):
    """The process' descriptors by kind: listeners, caller connections (proxy port), admin
    connections, connections to each mock (by name), other sockets, and everything else."""
    table = tcp_table(pid)
    kinds = {"listen": 0, "callers": 0, "admin": 0, "other_sockets": 0, "non_socket": 0}
    for m in mock_ports:
        kinds["upstream_" + m] = 0
    by_port = {p: "upstream_" + m for m, p in mock_ports.items()}
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return None
    states = {}
    for n in names:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, n))
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        if not m:
            kinds["non_socket"] += 1
            continue
        entry = table.get(int(m.group(1)))
        if entry is None:
            kinds["other_sockets"] += 1
            continue
        lport, rport, st = entry
        if st == "0A":
            kinds["listen"] += 1
        elif lport == proxy_port:
            kinds["callers"] += 1
        elif lport == admin_port:
            kinds["admin"] += 1
        elif rport in by_port:
            kinds[by_port[rport]] += 1
            states.setdefault(by_port[rport], {}).setdefault(st, 0)
            states[by_port[rport]][st] += 1
        else:
            kinds["other_sockets"] += 1
    kinds["total"] = len(names)
    kinds["upstream_total"] = sum(v for k, v in kinds.items()
                                  if k.startswith("upstream_") and k != "upstream_total")
    kinds["not_pooled"] = kinds["total"] - kinds["upstream_total"]
    kinds["tcp_states"] = states
    return kinds


def scrape(admin, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", admin, timeout=timeout)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.read().decode(errors="replace")
    finally:
        c.close()


def gauges(text):
    """Every sample of the in-flight gauge family (and any other *in_flight*/*inflight* gauge),
    with the signalbox_requests_in_flight total."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = re.split(r"[{ ]", line, 1)[0]
        if "in_flight" in name or "inflight" in name:
            try:
                out[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def metric_sum(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if all('%s="%s"' % (k, v) in line for k, v in labels.items()):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


class Sampler(threading.Thread):
    """Polls the gateway every `every` s while the client runs: VmRSS, descriptors, in-flight."""

    def __init__(self, pid, admin, every=0.5):
        super().__init__(daemon=True)
        self.pid, self.admin, self.every = pid, admin, every
        self.stop_ev = threading.Event()
        self.samples = []
        self.scrape_errors = 0

    def run(self):
        t0 = time.monotonic()
        while not self.stop_ev.is_set():
            s = {"t": round(time.monotonic() - t0, 2), "rss_kb": status_kb(self.pid, "VmRSS"),
                 "fds": fd_count(self.pid)}
            try:
                s["in_flight"] = metric_sum(scrape(self.admin, 3), IN_FLIGHT)
            except Exception:  # noqa: BLE001 - counted, the sample goes on without it
                self.scrape_errors += 1
                s["in_flight"] = None
            self.samples.append(s)
            self.stop_ev.wait(self.every)

    def peak(self, key):
        vals = [s for s in self.samples if s.get(key) is not None]
        return max(vals, key=lambda s: s[key]) if vals else None


def snapshot(pid, admin, proxy, ports):
    text = ""
    try:
        text = scrape(admin)
    except Exception as e:  # noqa: BLE001
        log("cannot scrape /metrics: %s" % e)
    return {"rss_kb": status_kb(pid, "VmRSS"), "hwm_kb": status_kb(pid, "VmHWM"),
            "fds": fd_breakdown(pid, proxy, admin, ports),
            "in_flight": metric_sum(text, IN_FLIGHT) if text else None,
            "in_flight_gauges": gauges(text)}


# ---------------------------------------------------------------------------------------------
# the run


def post(port, model, stream=False, timeout=15):
    body = json.dumps({"model": model, "stream": stream, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "sanity"}]})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", body=body,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def make_plan(n, fail_share, error_share, hangup_pct, hangup_after, seed):
    """Deterministic: the same N gives the same streams. Models interleaved by index (so every
    part of the ramp has all three); hang-ups chosen by a seeded sample across all models."""
    rng = random.Random(seed)
    n_hang = int(round(n * hangup_pct / 100.0))
    hang = set(rng.sample(range(n), n_hang)) if n_hang else set()
    plan = []
    fail_every = 100.0 / fail_share if fail_share > 0 else None
    err_every = 100.0 / error_share if error_share > 0 else None
    for i in range(n):
        # Bresenham-style spreading of the shares over the indices.
        if err_every and int((i + 1) / err_every) != int(i / err_every):
            model, expect = "soak-dying", "error_event"
        elif fail_every and int((i + 1) / fail_every) != int(i / fail_every):
            model, expect = "soak-failover", "intact"
        else:
            model, expect = "soak-ok", "intact"
        plan.append([model, expect, hangup_after if i in hang else 0])
    return plan


def write_config(tmp, proxy, admin, mocks, threads, pool_size):
    d = os.path.join(tmp, "signalbox")
    os.makedirs(d, exist_ok=True)
    off = {"strategy": "priority", "failure_threshold": 0}
    conf = {
        "listen": {"proxy": "127.0.0.1:%d" % proxy, "admin": "127.0.0.1:%d" % admin},
        "providers": {name: {"kind": "openai", "base_url": "http://127.0.0.1:%d/v1" % port,
                             "connect_timeout": "2s"} for name, port in mocks.items()},
        "models": {
            "soak-ok": dict(off, deployments=[{"provider": "healthy", "model": "soak-up"}]),
            # The failing provider first: every call to this model pays one failover hop
            # (breaker off, so it is never ejected: the failover happens under the full load).
            "soak-failover": dict(off, deployments=[
                {"provider": "failing", "model": "soak-up", "priority": 1},
                {"provider": "healthy", "model": "soak-up", "priority": 2}]),
            # Only a provider that dies after a few content events: the caller must get the
            # dialect's error event, never a silent end.
            "soak-dying": dict(off, deployments=[{"provider": "dying", "model": "soak-up"}]),
        },
        "pingora": {"threads": threads, "pid_file": os.path.join(d, "signalbox.pid"),
                    "upgrade_sock": os.path.join(d, "upgrade.sock"),
                    "grace_period_seconds": 0, "graceful_shutdown_timeout_seconds": 1},
    }
    if pool_size is not None:
        conf["pingora"]["upstream_keepalive_pool_size"] = pool_size
    path = os.path.join(d, "signalbox.json")
    with open(path, "w") as f:
        json.dump(conf, f, indent=1)
    return path


def mib(kb):
    return None if kb is None else round(kb / 1024.0, 1)


def run(a):
    t_run = time.monotonic()
    loadavg_start = os.getloadavg()
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "warn")
    gap_ms = a.gap_ms
    stream_s = a.chunks * gap_ms / 1000.0
    reply = " ".join("w%02d" % (i % 100) for i in range(a.chunks * 2))  # two words a chunk
    procs = []
    verdict = {"failures": [], "notes": []}
    res = {"config": {"streams": a.streams, "chunks": a.chunks, "gap_ms": gap_ms,
                      "stream_s": stream_s, "ramp_s": a.ramp_s, "fail_mode": a.fail_mode,
                      "fail_share_pct": a.fail_share, "error_share_pct": a.error_share,
                      "hangup_pct": a.hangup_pct, "hangup_after": a.hangup_after,
                      "threads": a.threads, "settle_s": a.settle, "pool_wait_s": a.pool_wait, "rounds": a.rounds,
                      "fd_limit": a.fd_limit, "bin_dir": a.bin_dir, "pin": a.pin,
                      "mock_threads": a.mock_threads},
           "verdict": verdict, "loadavg_start": loadavg_start}
    load_cpu = "1" if a.pin else None
    srv_cpu = "0" if a.pin else None
    mocks = {"healthy": free_port(), "failing": free_port(), "dying": free_port()}
    mock_bin = os.path.join(a.bin_dir, "signalbox-mock")
    common = ["--no-record", "--threads", str(a.mock_threads), "--chunks", str(a.chunks),
              "--gap-ms", str(gap_ms), "--reply", reply]
    extra = {"healthy": [],
             "failing": ["--behaviour", FAIL_BEHAVIOURS[a.fail_mode]],
             "dying": ["--behaviour", json.dumps({"kind": "mid_stream_death",
                                                  "after_chunks": a.die_after})]}
    mock_procs = {}
    try:
        for name, port in mocks.items():
            p = Proc(a.tmp, a.pidfile, "mock-" + name,
                     [mock_bin, "--name", name, "--listen", "127.0.0.1:%d" % port] + common
                     + extra[name], env=env, cpu=load_cpu)
            procs.append(p)
            mock_procs[name] = p
        for name, port in mocks.items():
            mock_procs[name].wait_port(port, 20)

        proxy, admin = free_port(), free_port()
        conf = write_config(a.tmp, proxy, admin, mocks, a.threads, a.pool_size)
        sb_bin = os.path.join(a.bin_dir, "signalbox")
        chk = subprocess.run([sb_bin, "-t", "-c", conf], capture_output=True, text=True,
                             env=env, timeout=30)
        if chk.returncode != 0:
            raise Fail("signalbox -t rejected the generated config: %s"
                       % (chk.stdout + chk.stderr).strip()[-600:])
        gw = Proc(a.tmp, a.pidfile, "signalbox", [sb_bin, "-c", conf], env=env, cpu=srv_cpu)
        procs.append(gw)
        gw.wait_port(proxy, 30)
        gw.wait_port(admin, 30)
        # Ready: /metrics answers and has the gauge.
        end = time.monotonic() + 20
        while True:
            try:
                if IN_FLIGHT in scrape(admin, 2):
                    break
            except Exception:  # noqa: BLE001
                pass
            if time.monotonic() > end:
                raise Fail("/metrics on the admin listener never showed %s" % IN_FLIGHT)
            time.sleep(0.1)
        log("signalbox pid %d on 127.0.0.1:%d (admin %d); mocks %s" % (gw.pid, proxy, admin, mocks))

        # Sanity: one whole (non-stream) answer through each model that should answer 200; the
        # failover one must show the hop.
        for model in ("soak-ok", "soak-failover"):
            st, hdrs, body = post(proxy, model)
            if st != 200:
                raise Fail("sanity %s answered %d: %s" % (model, st, body[:200]))
            if model == "soak-failover" and hdrs.get("x-llm-fallback") != "true":
                verdict["notes"].append("sanity soak-failover: no x-llm-fallback: true (%s)"
                                        % hdrs.get("x-llm-attempts"))

        # Idle: the sanity requests' in-flight count must have gone back to 0 first (the gauge
        # drops when the gateway has logged the request, just after the caller has the answer).
        end = time.monotonic() + 10
        while True:
            idle = snapshot(gw.pid, admin, proxy, mocks)
            if idle["in_flight"] == 0 or time.monotonic() > end:
                break
            time.sleep(0.1)
        if idle["in_flight"] != 0:
            raise Fail("the idle gateway reports %s in flight" % idle["in_flight"])
        res["mock_fds_idle"] = {n: fd_count(p.pid) for n, p in mock_procs.items()}
        res["idle"] = idle
        log("idle: %s fds (%s not pooled), in-flight %s, RSS %s MiB"
            % (idle["fds"]["total"], idle["fds"]["not_pooled"], idle["in_flight"],
               mib(idle["rss_kb"])))
        try:
            metrics_before = scrape(admin)
        except Exception:  # noqa: BLE001
            metrics_before = ""

        plan = make_plan(a.streams, a.fail_share, a.error_share, a.hangup_pct, a.hangup_after,
                         a.seed)
        plan_path = os.path.join(a.tmp, "plan.json")
        with open(plan_path, "w") as f:
            json.dump({"streams": plan}, f)
        counts = {}
        for model, expect, hang in plan:
            k = "%s%s" % (model, " (hang up)" if hang else "")
            counts[k] = counts.get(k, 0) + 1
        res["plan"] = counts

        rounds = []
        res["rounds"] = rounds
        t_after = None
        for rnd in range(1, a.rounds + 1):
            r = {"round": rnd}
            rounds.append(r)
            client_deadline = stream_s + a.slack
            client_out = os.path.join(a.tmp, "client-%d.json" % rnd)
            py = sys.executable or "python3"
            sampler = Sampler(gw.pid, admin, 0.5)
            sampler.start()
            t_client = time.monotonic()
            client = Proc(a.tmp, a.pidfile, "client-%d" % rnd,
                          [py, os.path.join(LT, "lib", "soak_client.py"), "--port", str(proxy),
                           "--plan", plan_path, "--reply", reply, "--chunks", str(a.chunks),
                           "--ramp-s", str(a.ramp_s), "--deadline-s", str(client_deadline),
                           "--out", client_out], env=env, cpu=load_cpu)
            procs.append(client)
            bound = a.ramp_s + client_deadline + 30
            try:
                client.popen.wait(bound)
            except subprocess.TimeoutExpired:
                client.stop()
                raise Fail("round %d: the client did not finish within %.0f s" % (rnd, bound))
            client_s = time.monotonic() - t_client
            sampler.stop_ev.set()
            sampler.join(5)
            if client.popen.returncode != 0 or not os.path.exists(client_out):
                raise Fail("round %d: the client failed (rc %s): %s"
                           % (rnd, client.popen.returncode, client.tail()))
            with open(client_out) as f:
                cr = json.load(f)
            r["client"] = cr
            r["client_wall_s"] = round(client_s, 2)
            pk_fds, pk_rss = sampler.peak("fds"), sampler.peak("rss_kb")
            pk_if = sampler.peak("in_flight")
            r["peak"] = {"fds": pk_fds and pk_fds["fds"], "rss_kb": pk_rss and pk_rss["rss_kb"],
                         "in_flight": pk_if and pk_if["in_flight"],
                         "hwm_kb": status_kb(gw.pid, "VmHWM"), "samples": len(sampler.samples),
                         "scrape_errors": sampler.scrape_errors}
            r["samples"] = sampler.samples
            log("round %d: client done in %.1f s: %s; peak %s fds, %s in flight, %s MiB RSS"
                % (rnd, client_s, cr["classes"], r["peak"]["fds"], r["peak"]["in_flight"],
                   mib(r["peak"]["rss_kb"])))

            # After: poll until in-flight and the descriptors that are not pooled upstream
            # connections are back to their idle values, at most --settle seconds.
            t_after = time.monotonic()
            while True:
                after = snapshot(gw.pid, admin, proxy, mocks)
                back = (after["in_flight"] == idle["in_flight"] and after["fds"] is not None
                        and after["fds"]["not_pooled"] <= idle["fds"]["not_pooled"] + FD_TOL)
                if back or time.monotonic() - t_after > a.settle:
                    break
                time.sleep(0.5)
            after["seconds_after_client"] = round(time.monotonic() - t_after, 1)
            after["back_to_idle"] = back
            r["after"] = after
            r["mock_fds_after"] = {n: fd_count(p.pid) for n, p in mock_procs.items()}
            log("round %d: after %.1f s: %s fds (%s not pooled, %s pooled upstream), in-flight "
                "%s, RSS %s MiB" % (rnd, after["seconds_after_client"], after["fds"]["total"],
                                    after["fds"]["not_pooled"], after["fds"]["upstream_total"],
                                    after["in_flight"], mib(after["rss_kb"])))

        # After the pool idle timeout: the pooled upstream connections must be gone too, and
        # every descriptor back to idle (the sanity requests' pooled connections included).
        final = None
        if a.pool_wait > 0:
            t_pool = time.monotonic()
            log("waiting up to %d s for the upstream pool to drain (idle timeout %d s)"
                % (a.pool_wait, POOL_IDLE_S))
            while True:
                final = snapshot(gw.pid, admin, proxy, mocks)
                f = final["fds"]
                drained = (f is not None and f["upstream_total"] == 0
                           and f["total"] <= idle["fds"]["not_pooled"] + FD_TOL
                           and final["in_flight"] == idle["in_flight"])
                if drained or time.monotonic() - t_pool > a.pool_wait:
                    break
                time.sleep(1.0)
            final["seconds_after_client"] = round(time.monotonic() - t_after, 1)
            final["drained"] = drained
            res["final"] = final
            res["mock_fds_final"] = {n: fd_count(p.pid) for n, p in mock_procs.items()}
            log("final (%.0f s after the last streams): %s fds (%s pooled upstream), in-flight "
                "%s, RSS %s MiB" % (final["seconds_after_client"], f["total"],
                                    f["upstream_total"], final["in_flight"],
                                    mib(final["rss_kb"])))
        try:
            metrics_after = scrape(admin)
        except Exception:  # noqa: BLE001
            metrics_after = ""
        res["attempts"] = {}
        for prov in mocks:
            res["attempts"][prov] = (metric_sum(metrics_after, "signalbox_attempts_total",
                                                provider=prov)
                                     - metric_sum(metrics_before, "signalbox_attempts_total",
                                                  provider=prov))
        res["requests_total"] = (metric_sum(metrics_after, "signalbox_requests_total")
                                 - metric_sum(metrics_before, "signalbox_requests_total"))
        gw.stop(signal.SIGINT)
        res["gateway_log"] = log_summary(gw.log_path)
    finally:
        for p in reversed(procs):
            p.stop()

    # Verdict, per round.
    BADS = ("truncated", "corrupt", "http_error", "failed", "timeout")
    early = sum(1 for m, _, h in plan if h or m == "soak-dying")
    for r in rounds:
        cr, after, rnd = r["client"], r["after"], r["round"]
        tag = "round %d: " % rnd if a.rounds > 1 else ""
        cl = cr["classes"]
        for bad in BADS:
            if cl.get(bad):
                verdict["failures"].append("%s%d stream(s) %s, e.g. %s" % (
                    tag, cl[bad], bad, json.dumps(cr["examples"].get(bad, [])[:3])))
        for expect, got in cr["by_expect"].items():
            if expect == "hung_up":
                continue
            other = {k: v for k, v in got.items() if k != expect and k not in BADS}
            if other:
                verdict["notes"].append("%sexpected %s, got %s (a clean ending, not a failure)"
                                        % (tag, expect, json.dumps(other)))
        if not after["back_to_idle"]:
            verdict["failures"].append(
                "%snot back to idle %.0f s after the streams: in-flight %s (idle %s), descriptors "
                "not pooled upstream %s (idle %s, tolerance %d): %s" % (
                    tag, a.settle, after["in_flight"], idle["in_flight"],
                    after["fds"]["not_pooled"], idle["fds"]["not_pooled"], FD_TOL,
                    json.dumps(after["fds"])))
        # Streams that end early by design: hang-ups, and the dying provider's (after
        # die_after events); the rest should all have been open at once.
        if cr["peak_open"] < (a.streams - early) * 0.95:
            verdict["notes"].append(
                "%sat most %d streams were open at once (of %d, %d of which end early by "
                "design): the ramp (%.1f s) is long against a %.1f s stream, or the client "
                "lagged" % (tag, cr["peak_open"], a.streams, early, a.ramp_s, stream_s))
    if final is not None and not final["drained"]:
        verdict["failures"].append(
            "descriptors not back to idle %.0f s after the streams (pool idle timeout %d s): "
            "%s (idle: %d total, %d not pooled)" % (
                final["seconds_after_client"], POOL_IDLE_S, json.dumps(final["fds"]),
                idle["fds"]["total"], idle["fds"]["not_pooled"]))
    res["loadavg_end"] = os.getloadavg()
    res["duration_s"] = round(time.monotonic() - t_run, 1)
    res["ok"] = not verdict["failures"]
    return res


def log_summary(path):
    try:
        with open(path, "rb") as f:
            lines = [ln for ln in f.read().decode(errors="replace").splitlines()
                     if " WARN " in ln or " ERROR " in ln]
    except OSError:
        return {"lines": 0, "top": []}
    kinds = {}
    for ln in lines:
        key = re.sub(r"^\S+\s+", "", ln)
        key = re.sub(r"\b[0-9a-f]{32}\b", "<id>", key)
        key = re.sub(r"\d+(\.\d+)?", "N", key)[:200]
        kinds[key] = kinds.get(key, 0) + 1
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:5]
    return {"lines": len(lines), "top": [{"n": n, "line": k} for k, n in top]}


# ---------------------------------------------------------------------------------------------
# report


def report_md(res, a):
    rounds = res.get("rounds") or []
    idle, final = res.get("idle"), res.get("final")
    cfg = res["config"]
    L = []
    L.append("# signalbox soak, %s" % res["started"])
    L.append("")
    L.append("**%s** — %d concurrent streams × %d round%s in one gateway (%d chunks × %d ms ≈ "
             "%.1f s each, ramped over %.1f s), %s gateway threads; %g%% of streams on a model "
             "whose first provider fails every call (`%s`, breaker off: every one of them fails "
             "over), %g%% on a provider that dies after %d content events, %g%% of callers hang "
             "up after %d content events." % (
                 "PASS" if res.get("ok") else "FAIL", cfg["streams"], len(rounds),
                 "s" if len(rounds) != 1 else "", cfg["chunks"], cfg["gap_ms"], cfg["stream_s"],
                 cfg["ramp_s"], cfg["threads"], cfg["fail_share_pct"], cfg["fail_mode"],
                 cfg["error_share_pct"], a.die_after, cfg["hangup_pct"], cfg["hangup_after"]))
    L.append("")
    L.append("| round | streams | intact | error event | hung up | truncated | corrupt | http "
             "error | failed | timeout | peak open at once | TTFB p50/p99/max ms | stream "
             "p50/p99/max ms |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rounds:
        c = r["client"]
        cl = c["classes"]
        L.append("| %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s |" % (
            r["round"], c["streams"], cl.get("intact", 0), cl.get("error_event", 0),
            cl.get("hung_up", 0), cl.get("truncated", 0), cl.get("corrupt", 0),
            cl.get("http_error", 0), cl.get("failed", 0), cl.get("timeout", 0), c["peak_open"],
            fmt3(c.get("ttfb_ms")), fmt3(c.get("stream_ms"))))
    L.append("")
    if idle and rounds:
        fa = final or {}
        head = ["gateway", "idle (before)"]
        for r in rounds:
            head += ["peak r%d" % r["round"], "after r%d (%.1f s)" % (
                r["round"], r["after"]["seconds_after_client"])]
        head.append("after pool idle (%s s)" % fa.get("seconds_after_client", "—"))
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))

        def row(label, idle_v, peak_f, after_f, final_v):
            cells = [label, idle_v]
            for r in rounds:
                cells += [peak_f(r), after_f(r)]
            cells.append(final_v)
            L.append("| " + " | ".join(str(x) for x in cells) + " |")

        row("RSS MiB (VmRSS)", mib(idle["rss_kb"]), lambda r: mib(r["peak"]["rss_kb"]),
            lambda r: mib(r["after"]["rss_kb"]), mib(fa.get("rss_kb")) if fa else "—")
        row("VmHWM MiB", mib(idle["hwm_kb"]), lambda r: mib(r["peak"]["hwm_kb"]),
            lambda r: "", mib(fa.get("hwm_kb")) if fa else "—")
        row("open fds", idle["fds"]["total"], lambda r: r["peak"]["fds"],
            lambda r: r["after"]["fds"]["total"], fa["fds"]["total"] if fa else "—")
        row("… pooled upstream connections", idle["fds"]["upstream_total"], lambda r: "",
            lambda r: r["after"]["fds"]["upstream_total"],
            fa["fds"]["upstream_total"] if fa else "—")
        row("… not pooled (must return to idle ± %d)" % FD_TOL, idle["fds"]["not_pooled"],
            lambda r: "", lambda r: r["after"]["fds"]["not_pooled"],
            fa["fds"]["not_pooled"] if fa else "—")
        row("`%s`" % IN_FLIGHT, fmt_num(idle["in_flight"]),
            lambda r: fmt_num(r["peak"]["in_flight"]), lambda r: fmt_num(r["after"]["in_flight"]),
            fmt_num(fa.get("in_flight")) if fa else "—")
        row("mock fds healthy / failing / dying", mock_fds(res.get("mock_fds_idle")),
            lambda r: "", lambda r: mock_fds(r.get("mock_fds_after")),
            mock_fds(res.get("mock_fds_final")))
        L.append("")
    L.append("Duration %.1f s in all. Upstream attempts over all rounds: %s; gateway requests "
             "counted: %s. Load average (1/5/15 min) at the start %s, at the end %s (other jobs "
             "share this machine)." % (
                 res.get("duration_s", 0),
                 ", ".join("%s %d" % (k, v) for k, v in (res.get("attempts") or {}).items()),
                 fmt_num(res.get("requests_total")),
                 "/".join("%.1f" % x for x in res.get("loadavg_start", ())),
                 "/".join("%.1f" % x for x in res.get("loadavg_end", ()))))
    L.append("")
    if rounds:
        c = rounds[-1]["client"]
        L.append("By model (last round): " + "; ".join("`%s` %s" % (m, ", ".join(
            "%s %d" % (k, v) for k, v in sorted(d.items()))) for m, d in sorted(c["by_model"].items())))
        if c.get("error_codes"):
            L.append("Error events by code (last round): " + ", ".join(
                "`%s` %d" % (k.split(":", 1)[1], v) for k, v in c["error_codes"].items()))
        L.append("")
    v = res["verdict"]
    for f in v["failures"]:
        L.append("- **FAIL**: " + f)
    for n in v["notes"]:
        L.append("- note: " + n)
    gl = res.get("gateway_log") or {}
    if gl.get("lines"):
        L.append("- signalbox logged %d warn/error lines; most frequent: %s" % (
            gl["lines"], "; ".join("%d× `%s`" % (t["n"], t["line"][:160]) for t in gl["top"][:3])))
    L.append("")
    L.append("Pooled upstream connections: signalbox keeps idle keep-alive connections to a "
             "provider for %d s (up to `pingora.upstream_keepalive_pool_size` per pool), so right "
             "after each round the descriptor check leaves out the gateway's connections to the "
             "mocks (counted from `/proc/PID/net/tcp` by remote port) and requires the rest back "
             "to idle ± %d; after the pool idle timeout every descriptor must be back to the idle "
             "count without them. RSS is reported, not checked: the allocator keeps freed pages; "
             "compare the rounds' \"after\" RSS (growth from one round to the next would be a leak)."
             % (POOL_IDLE_S, FD_TOL))
    L.append("")
    L.append("Command: `%s`" % res.get("command", ""))
    return "\n".join(L) + "\n"


def fmt_num(v):
    if v is None:
        return "—"
    return "%d" % v if float(v).is_integer() else "%g" % v


def fmt3(s):
    if not s or not s.get("n"):
        return "—"
    return "/".join("%.0f" % s[k] if s.get(k) is not None else "—" for k in ("p50", "p99", "max"))


def mock_fds(d):
    if not d:
        return "—"
    return " / ".join(str(d.get(k)) for k in ("healthy", "failing", "dying"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--streams", type=int, default=5000)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--gap-ms", type=int, default=400)
    ap.add_argument("--ramp-s", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mock-threads", type=int, default=1)
    ap.add_argument("--fail-mode", choices=sorted(FAIL_BEHAVIOURS), default="503")
    ap.add_argument("--fail-share", type=float, default=30.0)
    ap.add_argument("--error-share", type=float, default=5.0)
    ap.add_argument("--die-after", type=int, default=5)
    ap.add_argument("--hangup-pct", type=float, default=1.0)
    ap.add_argument("--hangup-after", type=int, default=3)
    ap.add_argument("--settle", type=float, default=30.0)
    ap.add_argument("--pool-wait", type=float, default=POOL_IDLE_S + 20)
    ap.add_argument("--slack", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pool-size", type=int, default=None)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--fd-limit", type=int, default=0)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--command", default="")
    a = ap.parse_args()
    a.pidfile = os.path.join(a.tmp, "pids")
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    try:
        res = run(a)
    except Fail as e:
        log("FAIL: %s" % e)
        res = {"ok": False, "error": str(e), "config": vars(a), "verdict": {"failures": [str(e)],
                                                                           "notes": []}}
        os.makedirs(a.out_dir, exist_ok=True)
        with open(os.path.join(a.out_dir, "soak.json"), "w") as f:
            json.dump(res, f, indent=1)
        return 1
    res["started"] = started
    res["command"] = a.command
    md = report_md(res, a)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "soak.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out_dir, "soak.json"), "w") as f:
        json.dump(res, f, indent=1)
    sys.stdout.write(md)
    log("written %s/soak.md and soak.json" % a.out_dir)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
