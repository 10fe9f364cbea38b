#!/usr/bin/env python3
"""Streaming (SSE) load client for the signalbox load tests. Standard library only.

Two modes, both print one JSON object on stdout:

measure  (scenario b) C keep-alive connections, each streaming one chat completion after the
         other for a bounded time. For every SSE event that carries "mock_sent_us" (the mock's
         send time stamp, unix µs) it records receive time - mock_sent_us: the pass-through
         latency of that chunk. Also the time to the response header (TTFB) and to the first
         event (TTFT). Run it against the mock directly and through a proxy; the difference
         is what the proxy adds.

hold     (scenario f) opens N streams (ramped at R new connections/s), keeps them all open
         while the mock trickles events, samples the watched process' RSS and open file
         descriptors while they are open, and again `--settle` seconds after they all ended.

Every run is bounded: `measure` by --duration, `hold` by --timeout (whatever is still open then
is cancelled and counted as an error).
"""

import argparse
import asyncio
import json
import os
import re
import resource
import sys
import time

SENT_RE = re.compile(rb'"mock_sent_us"\s*:\s*(\d+)')


def now_us():
    return time.time_ns() // 1000


def mono_us():
    return time.monotonic_ns() // 1000


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary(values):
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "p99.9": pct(values, 99.9),
        "max": max(values) if values else None,
        "mean": (sum(values) / len(values)) if values else None,
    }


def build_request(host, port, path, model, body_size=512):
    head = ('{"model":"%s","stream":true,"max_tokens":64,"messages":[{"role":"system",'
            '"content":"You are a load test."},{"role":"user","content":"' % model)
    tail = '"}]}'
    pad = max(1, body_size - len(head) - len(tail))
    body = (head + ("lorem ipsum " * (pad // 12 + 1))[:pad] + tail).encode()
    req = (
        "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer sk-load-test\r\nAccept: text/event-stream\r\n"
        "Content-Length: %d\r\n\r\n" % (path, host, port, len(body))
    ).encode() + body
    return req


class StreamResult:
    __slots__ = ("status", "ttfb_us", "ttft_us", "total_us", "deltas", "done", "keep_alive")

    def __init__(self):
        self.status = 0
        self.ttfb_us = None
        self.ttft_us = None
        self.total_us = None
        self.deltas = []
        self.done = False
        self.keep_alive = True


async def one_stream(reader, writer, req):
    """Send one request on an open connection and read the SSE answer to its end."""
    r = StreamResult()
    t0 = mono_us()
    writer.write(req)
    await writer.drain()
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed before the response header")
    r.ttfb_us = mono_us() - t0
    parts = line.split()
    r.status = int(parts[1])
    chunked = False
    length = None
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        value = value.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"content-length":
            length = int(value)
        elif name == b"connection" and value == b"close":
            r.keep_alive = False
    buf = b""

    def feed(data):
        nonlocal buf
        t = now_us()
        buf += data.replace(b"\r\n", b"\n")
        while True:
            i = buf.find(b"\n\n")
            if i < 0:
                break
            event, buf = buf[:i], buf[i + 2:]
            for ln in event.split(b"\n"):
                if not ln.startswith(b"data:"):
                    continue
                payload = ln[5:].strip()
                if payload == b"[DONE]":
                    r.done = True
                    continue
                if r.ttft_us is None:
                    r.ttft_us = mono_us() - t0
                m = SENT_RE.search(payload)
                if m:
                    r.deltas.append(t - int(m.group(1)))

    if chunked:
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers
                    t = await reader.readline()
                    if t in (b"\r\n", b"\n", b""):
                        break
                break
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            feed(data)
    elif length is not None:
        left = length
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise ConnectionError("closed inside a content-length body")
            left -= len(data)
            feed(data)
    else:
        r.keep_alive = False
        while True:
            data = await reader.read(65536)
            if not data:
                break
            feed(data)
    r.total_us = mono_us() - t0
    return r


async def measure(args):
    req = build_request(args.host, args.port, args.path, args.model)
    start = time.monotonic()
    record_from = start + args.warmup
    deadline = record_from + args.duration
    stats = {"streams": 0, "errors": 0, "error_kinds": {}, "ttfb": [], "ttft": [],
             "chunk": [], "total": []}

    def err(kind):
        if time.monotonic() >= record_from:
            stats["errors"] += 1
            stats["error_kinds"][kind] = stats["error_kinds"].get(kind, 0) + 1

    async def worker():
        reader = writer = None
        while time.monotonic() < deadline:
            try:
                if writer is None:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(args.host, args.port), 5)
                r = await asyncio.wait_for(one_stream(reader, writer, req), args.request_timeout)
            except Exception as e:  # noqa: BLE001 - every failure is counted, then reconnect
                err(type(e).__name__)
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(0.01)
                continue
            if time.monotonic() >= record_from and time.monotonic() < deadline:
                if r.status != 200 or not r.done:
                    err("status_%d" % r.status if r.status != 200 else "no_done")
                else:
                    stats["streams"] += 1
                    stats["ttfb"].append(r.ttfb_us)
                    if r.ttft_us is not None:
                        stats["ttft"].append(r.ttft_us)
                    stats["total"].append(r.total_us)
                    stats["chunk"].extend(r.deltas)
            if not r.keep_alive:
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(args.conns)))
    elapsed = time.monotonic() - record_from
    return {
        "mode": "measure",
        "duration_s": round(elapsed, 3),
        "conns": args.conns,
        "streams": stats["streams"],
        "streams_per_s": stats["streams"] / elapsed if elapsed > 0 else 0,
        "errors": stats["errors"],
        "error_kinds": stats["error_kinds"],
        "ttfb_us": summary(stats["ttfb"]),
        "ttft_us": summary(stats["ttft"]),
        "chunk_us": summary(stats["chunk"]),
        "stream_us": summary(stats["total"]),
    }


def proc_sample(pids):
    """RSS, VmHWM and open descriptors, summed over the watched processes."""
    rss = hwm = fds = 0
    seen = False
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm += int(line.split()[1])
            fds += len(os.listdir("/proc/%d/fd" % pid))
            seen = True
        except (OSError, ValueError):
            continue
    if not seen:
        return None
    return {"rss_kb": rss, "hwm_kb": hwm, "fds": fds}


async def hold(args):
    req = build_request(args.host, args.port, args.path, args.model)
    counts = {"connected": 0, "open": 0, "done": 0, "errors": 0}
    kinds = {}
    peak = {"open": 0, "rss_kb": 0, "fds": 0, "at_all_open": None}
    ttfb = []
    durations = []
    t_start = time.monotonic()

    async def stream_task():
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(args.host, args.port), args.connect_timeout)
            counts["connected"] += 1
            t0 = mono_us()
            writer.write(req)
            await writer.drain()
            # Read the header first to count the stream as open, then the rest.
            r = await one_stream_open(reader, writer, req_sent_at=t0, counts=counts)
            ttfb.append(r.ttfb_us)
            durations.append(r.total_us)
            if r.status == 200 and r.done:
                counts["done"] += 1
            else:
                counts["errors"] += 1
                k = "status_%d" % r.status if r.status != 200 else "no_done"
                kinds[k] = kinds.get(k, 0) + 1
        except asyncio.CancelledError:
            counts["errors"] += 1
            kinds["timeout"] = kinds.get("timeout", 0) + 1
            raise
        except Exception as e:  # noqa: BLE001
            counts["errors"] += 1
            k = type(e).__name__
            kinds[k] = kinds.get(k, 0) + 1
        finally:
            if writer is not None:
                writer.close()

    async def sampler():
        while True:
            s = proc_sample(args.watch_pids) if args.watch_pids else None
            if s:
                peak["rss_kb"] = max(peak["rss_kb"], s["rss_kb"] or 0)
                peak["fds"] = max(peak["fds"], s["fds"])
            live = counts["open"]
            if live > peak["open"]:
                peak["open"] = live
                if live == args.streams and s and peak["at_all_open"] is None:
                    peak["at_all_open"] = s
            await asyncio.sleep(0.25)

    samp = asyncio.ensure_future(sampler())
    tasks = []
    interval = 1.0 / args.ramp_rate
    for i in range(args.streams):
        tasks.append(asyncio.ensure_future(stream_task()))
        # Pace the connection ramp (batched: sleep every 50 connections).
        if (i + 1) % 50 == 0:
            target = t_start + (i + 1) * interval
            delay = target - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
    ramp_s = time.monotonic() - t_start
    remaining = args.timeout - (time.monotonic() - t_start)
    done, pending = await asyncio.wait(tasks, timeout=max(1.0, remaining))
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)
    t_end = time.monotonic()
    await asyncio.sleep(args.settle)
    samp.cancel()
    after = proc_sample(args.watch_pids) if args.watch_pids else None
    return {
        "mode": "hold",
        "target_streams": args.streams,
        "ramp_s": round(ramp_s, 2),
        "elapsed_s": round(t_end - t_start, 2),
        "connected": counts["connected"],
        "peak_open": peak["open"],
        "completed": counts["done"],
        "errors": counts["errors"],
        "error_kinds": kinds,
        "peak_rss_kb": peak["rss_kb"],
        "peak_fds": peak["fds"],
        "at_all_open": peak["at_all_open"],
        "after": after,
        "settle_s": args.settle,
        "ttfb_us": summary(ttfb),
        "stream_us": summary(durations),
    }


async def one_stream_open(reader, writer, req_sent_at, counts):
    """Like one_stream, for a request already written: counts the stream as open while it
    is between its response header and its end."""
    r = StreamResult()
    line = await reader.readline()
    if not line:
        raise ConnectionError("closed before the response header")
    r.ttfb_us = mono_us() - req_sent_at
    r.status = int(line.split()[1])
    counts["open"] += 1
    try:
        chunked = False
        length = None
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"content-length":
                length = int(value.strip())
        if not chunked and length is not None:
            # An error answer (or a non-streamed body): read exactly its length, the
            # connection stays open (keep-alive) so there is no EOF to wait for.
            await reader.readexactly(length)
            r.total_us = mono_us() - req_sent_at
            return r
        tail = b""
        while True:
            data = await reader.read(65536)
            if not data:
                break
            tail = (tail + data)[-64:]
            if b"[DONE]" in tail:
                r.done = True
                if not chunked or b"0\r\n\r\n" in tail:
                    break
            if chunked and tail.endswith(b"0\r\n\r\n"):
                break
    finally:
        counts["open"] -= 1
    r.total_us = mono_us() - req_sent_at
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["measure", "hold"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/v1/chat/completions")
    p.add_argument("--model", default="lt-model")
    p.add_argument("--conns", type=int, default=16, help="measure: concurrent connections")
    p.add_argument("--duration", type=float, default=10.0, help="measure: seconds recorded")
    p.add_argument("--warmup", type=float, default=1.0, help="measure: seconds not recorded")
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--streams", type=int, default=10000, help="hold: streams to open")
    p.add_argument("--ramp-rate", type=float, default=2000.0, help="hold: new connections/s")
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=60.0, help="hold: hard bound, seconds")
    p.add_argument("--settle", type=float, default=3.0, help="hold: wait before the after-sample")
    p.add_argument("--watch-pid", default="", help="hold: processes to sample (pid[,pid...])")
    args = p.parse_args()
    args.watch_pids = [int(x) for x in args.watch_pid.split(",") if x.strip()]
    if args.host != "localhost" and not args.host.startswith("127."):
        sys.exit("sse_client: refusing a non-loopback target %r" % args.host)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, args.streams + 1024))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    coro = measure(args) if args.mode == "measure" else hold(args)
    out = asyncio.run(coro)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
