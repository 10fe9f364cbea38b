#!/usr/bin/env python3
"""Soak client for load-tests/soak.sh: N concurrent streaming chat completions, each checked.
Standard library only (asyncio protocols on raw sockets, one connection per stream).

    soak_client.py --port P --plan PLAN.json --reply TEXT --chunks 20 --ramp-s 4 --deadline-s 60

PLAN.json: {"streams": [[model, expect, hangup_after], ...]}, one entry per stream, in start
order. `expect` is "intact" (the model's first deployment that answers serves it whole) or
"error_event" (its only provider dies mid-stream); `hangup_after` > 0: this caller hangs up
after that many content events (odd indices with an RST, even ones with a FIN).

Every stream that was not hung up ends in exactly one class:

  intact       200, every content event, their text == the reply, a `finish_reason`, then
               `data: [DONE]` as the last event, and the response ended (terminal chunk)
  error_event  200, and the last event is the dialect's error event `data: {"error": ...}`
  truncated    200, and the stream ended (terminal chunk, FIN or RST) without either
  corrupt      200 with [DONE] but missing/altered content, or events after the end
  http_error   an answer other than 200 (a whole error body: not a stream)
  failed       no answer: connect error/timeout, closed or reset before the status line
  timeout      still open at the deadline (cancelled)

Prints one JSON object on stdout: counts by class, by class and model, by class and expected
class, up to 10 examples of each bad class, TTFB/duration percentiles, peak streams open at once.
The run is bounded: the ramp, then at most --deadline-s from the first connection.
"""

import argparse
import asyncio
import json
import socket
import struct
import sys
import time

BAD = ("truncated", "corrupt", "http_error", "failed", "timeout")


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def summary_ms(values):
    return {"n": len(values), "p50": pct(values, 50), "p99": pct(values, 99),
            "max": max(values) if values else None}


class Shared:
    def __init__(self, args, plan):
        self.args = args
        self.plan = plan
        self.open = 0          # streams with a 200 header and no end yet
        self.peak_open = 0
        self.connected = 0
        self.finished = 0
        self.results = []      # (index, model, expect, cls, detail)
        self.ttfb_ms = []
        self.dur_ms = []
        self.all_done = asyncio.get_running_loop().create_future()


class Stream(asyncio.Protocol):
    """One request on one connection; parses the status line, headers, chunked framing and
    SSE events incrementally, and classifies the stream when the connection ends."""

    def __init__(self, sh, idx, model, expect, hangup_after, request):
        self.sh = sh
        self.idx = idx
        self.model = model
        self.expect = expect
        self.hangup_after = hangup_after
        self.request = request
        self.transport = None
        self.t0 = time.monotonic()
        self.buf = b""
        self.state = "status"     # status, headers, chunk_size, chunk_data, chunk_crlf,
                                  # trailers, body_len, body_eof, ended
        self.status = 0
        self.chunked = False
        self.length = None
        self.chunk_left = 0
        self.sse = b""
        self.body = b""           # non-200 bodies (for the report)
        self.content = []
        self.content_events = 0
        self.finish_reason = None
        self.done_seen = False
        self.error_seen = None
        self.after_end = 0        # events after [DONE] or after an error event
        self.bad_json = 0
        self.terminal = False     # the HTTP body ended properly (terminal chunk / length)
        self.hung_up = False
        self.closed = False
        self.cls = None
        self.counted_open = False

    # -- asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        self.sh.connected += 1
        transport.write(self.request)

    def data_received(self, data):
        if self.cls is not None:
            return
        self.buf += data
        try:
            self.parse()
        except ValueError as e:
            self.finish("corrupt", "framing: %s" % e)
            self.transport.abort()

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc):
        self.closed = True
        if self.cls is None:
            self.classify(exc)
        if self.counted_open:
            self.sh.open -= 1
            self.counted_open = False

    # -- parsing
    def parse(self):
        while True:
            if self.state == "status":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                line, self.buf = self.buf[:i], self.buf[i + 2:]
                parts = line.split()
                if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
                    raise ValueError("bad status line %r" % line[:80])
                self.status = int(parts[1])
                self.sh.ttfb_ms.append((time.monotonic() - self.t0) * 1000.0)
                self.state = "headers"
            elif self.state == "headers":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                line, self.buf = self.buf[:i], self.buf[i + 2:]
                if not line:
                    if self.status == 200:
                        self.sh.open += 1
                        self.counted_open = True
                        if self.sh.open > self.sh.peak_open:
                            self.sh.peak_open = self.sh.open
                    if self.chunked:
                        self.state = "chunk_size"
                    elif self.length is not None:
                        self.state = "body_len"
                    else:
                        self.state = "body_eof"
                    continue
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                value = value.strip().lower()
                if name == b"transfer-encoding" and b"chunked" in value:
                    self.chunked = True
                elif name == b"content-length":
                    self.length = int(value)
            elif self.state == "chunk_size":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                line, self.buf = self.buf[:i], self.buf[i + 2:]
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    self.state = "trailers"
                else:
                    self.chunk_left = size
                    self.state = "chunk_data"
            elif self.state == "chunk_data":
                if not self.buf:
                    return
                piece = self.buf[:self.chunk_left]
                self.buf = self.buf[len(piece):]
                self.chunk_left -= len(piece)
                self.feed(piece)
                if self.cls is not None:
                    return
                if self.chunk_left == 0:
                    self.state = "chunk_crlf"
            elif self.state == "chunk_crlf":
                if len(self.buf) < 2:
                    return
                if self.buf[:2] != b"\r\n":
                    raise ValueError("no CRLF after a chunk")
                self.buf = self.buf[2:]
                self.state = "chunk_size"
            elif self.state == "trailers":
                i = self.buf.find(b"\r\n")
                if i < 0:
                    return
                line, self.buf = self.buf[:i], self.buf[i + 2:]
                if not line:
                    self.terminal = True
                    self.state = "ended"
                    self.classify(None)
                    self.transport.close()
                    return
            elif self.state == "body_len":
                if not self.buf:
                    return
                piece = self.buf[:self.length]
                self.buf = self.buf[len(piece):]
                self.length -= len(piece)
                self.feed(piece)
                if self.cls is not None:
                    return
                if self.length == 0:
                    self.terminal = True
                    self.state = "ended"
                    self.classify(None)
                    self.transport.close()
                    return
            elif self.state == "body_eof":
                if not self.buf:
                    return
                piece, self.buf = self.buf, b""
                self.feed(piece)
                return
            else:  # ended
                return

    def feed(self, data):
        if self.status != 200:
            if len(self.body) < 600:
                self.body += data[:600]
            return
        self.sse += data
        if b"\r" in self.sse:
            self.sse = self.sse.replace(b"\r\n", b"\n")
        while True:
            i = self.sse.find(b"\n\n")
            if i < 0:
                return
            event, self.sse = self.sse[:i], self.sse[i + 2:]
            for ln in event.split(b"\n"):
                if ln.startswith(b"data:"):
                    self.on_data(ln[5:].strip())
                    if self.cls is not None:
                        return

    def on_data(self, payload):
        if self.done_seen or self.error_seen is not None:
            self.after_end += 1
            return
        if payload == b"[DONE]":
            self.done_seen = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.bad_json += 1
            return
        if isinstance(obj, dict) and "error" in obj:
            self.error_seen = obj["error"]
            return
        try:
            choice = obj["choices"][0]
        except (KeyError, IndexError, TypeError):
            return  # e.g. a usage-only chunk
        delta = choice.get("delta") or {}
        if delta.get("content") is not None:
            self.content_events += 1
            self.content.append(delta["content"])
            if self.hangup_after and self.content_events >= self.hangup_after:
                self.hang_up()
                return
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def hang_up(self):
        self.hung_up = True
        if self.idx % 2 == 1:
            # RST: SO_LINGER 0, then close.
            sock = self.transport.get_extra_info("socket")
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            self.finish("hung_up", "rst after %d content events" % self.content_events)
            self.transport.abort()
        else:
            self.finish("hung_up", "fin after %d content events" % self.content_events)
            self.transport.close()

    # -- classification
    def classify(self, exc):
        a = self.sh.args
        if self.status == 0:
            self.finish("failed", "no status line (%s)" % (type(exc).__name__ if exc else "eof"))
        elif self.status != 200:
            self.finish("http_error", "%d %s" % (self.status, self.body[:200].decode(errors="replace")))
        elif self.done_seen:
            text = "".join(self.content)
            problems = []
            if self.content_events != a.chunks:
                problems.append("%d content events, expected %d" % (self.content_events, a.chunks))
            if text != a.reply:
                problems.append("content differs from the reply (%d vs %d chars)"
                                % (len(text), len(a.reply)))
            if not self.finish_reason:
                problems.append("no finish_reason")
            if self.after_end:
                problems.append("%d events after [DONE]" % self.after_end)
            if self.bad_json:
                problems.append("%d unparsable events" % self.bad_json)
            if not self.terminal:
                problems.append("[DONE] but the body did not end (%s)"
                                % (type(exc).__name__ if exc else "connection closed"))
            if problems:
                self.finish("corrupt", "; ".join(problems))
            else:
                self.finish("intact", "")
        elif self.error_seen is not None:
            if self.after_end:
                self.finish("corrupt", "%d events after the error event" % self.after_end)
            else:
                code = self.error_seen.get("code") if isinstance(self.error_seen, dict) else None
                self.finish("error_event", str(code))
        else:
            self.finish("truncated", "%d content events, ended by %s%s" % (
                self.content_events,
                type(exc).__name__ if exc else ("terminal chunk" if self.terminal else "FIN"),
                "" if not self.sse else ", %d bytes of a partial event" % len(self.sse)))

    def finish(self, cls, detail):
        if self.cls is not None:
            return
        self.cls = cls
        sh = self.sh
        sh.finished += 1
        sh.results.append((self.idx, self.model, self.expect, cls, detail))
        if cls in ("intact", "error_event"):
            sh.dur_ms.append((time.monotonic() - self.t0) * 1000.0)
        if sh.finished == len(sh.plan) and not sh.all_done.done():
            sh.all_done.set_result(True)


def build_request(port, model):
    body = json.dumps({"model": model, "stream": True, "max_tokens": 64, "messages": [
        {"role": "system", "content": "You are a soak test."},
        {"role": "user", "content": "Say something slowly."}]}).encode()
    return (("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
             "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
             "Authorization: Bearer sk-soak\r\nContent-Length: %d\r\n\r\n")
            % (port, len(body))).encode() + body


async def run(args):
    with open(args.plan) as f:
        plan = json.load(f)["streams"]
    sh = Shared(args, plan)
    loop = asyncio.get_running_loop()
    requests = {m: build_request(args.port, m) for m in {p[0] for p in plan}}
    protos = []
    t_start = time.monotonic()
    hard_end = t_start + args.ramp_s + args.deadline_s

    async def open_one(i, model, expect, hangup):
        proto = Stream(sh, i, model, expect, hangup, requests[model])
        protos.append(proto)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: proto, "127.0.0.1", args.port),
                args.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            proto.finish("failed", "connect: %s" % (type(e).__name__ if not str(e) else e))

    last_progress = t_start
    tasks = []
    n = len(plan)
    for i, (model, expect, hangup) in enumerate(plan):
        due = t_start + args.ramp_s * i / max(1, n)
        delay = due - time.monotonic()
        if delay > 0.002:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(open_one(i, model, expect, hangup)))
        if time.monotonic() - last_progress > 2:
            last_progress = time.monotonic()
            sys.stderr.write("[soak client] %.1fs: %d started, %d open, %d finished\n"
                             % (last_progress - t_start, i + 1, sh.open, sh.finished))
    ramp_done = time.monotonic() - t_start
    while not sh.all_done.done() and time.monotonic() < hard_end:
        try:
            await asyncio.wait_for(asyncio.shield(sh.all_done),
                                   min(2.0, max(0.05, hard_end - time.monotonic())))
        except asyncio.TimeoutError:
            sys.stderr.write("[soak client] %.1fs: %d open, %d finished of %d\n"
                             % (time.monotonic() - t_start, sh.open, sh.finished, n))
    # Whatever is still open at the deadline is cancelled and counted.
    for p in protos:
        if p.cls is None:
            p.finish("timeout", "open at the deadline: %d content events" % p.content_events)
            if p.transport is not None:
                p.transport.abort()
    for t in tasks:
        if not t.done():
            t.cancel()
    await asyncio.sleep(0)  # let aborted transports run connection_lost
    elapsed = time.monotonic() - t_start

    classes = {}
    by_model = {}
    by_expect = {}
    examples = {}
    for idx, model, expect, cls, detail in sh.results:
        classes[cls] = classes.get(cls, 0) + 1
        by_model.setdefault(model, {}).setdefault(cls, 0)
        by_model[model][cls] += 1
        key = "hung_up" if cls == "hung_up" else expect
        by_expect.setdefault(key, {}).setdefault(cls, 0)
        by_expect[key][cls] += 1
        if cls in BAD or (cls != "hung_up" and cls != expect):
            ex = examples.setdefault(cls, [])
            if len(ex) < 10:
                ex.append({"stream": idx, "model": model, "expect": expect, "detail": detail})
    detail_counts = {}
    for idx, model, expect, cls, detail in sh.results:
        if cls == "error_event":
            k = "error_event:" + detail
            detail_counts[k] = detail_counts.get(k, 0) + 1
    return {
        "streams": n,
        "classes": classes,
        "by_model": by_model,
        "by_expect": by_expect,
        "error_codes": detail_counts,
        "examples": examples,
        "peak_open": sh.peak_open,
        "connected": sh.connected,
        "ramp_s": round(ramp_done, 2),
        "elapsed_s": round(elapsed, 2),
        "ttfb_ms": summary_ms(sh.ttfb_ms),
        "stream_ms": summary_ms(sh.dur_ms),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--reply", required=True)
    ap.add_argument("--chunks", type=int, required=True)
    ap.add_argument("--ramp-s", type=float, default=4.0)
    ap.add_argument("--deadline-s", type=float, default=60.0)
    ap.add_argument("--connect-timeout", type=float, default=15.0)
    ap.add_argument("--out", help="write the JSON here as well as to stdout")
    args = ap.parse_args()
    res = asyncio.run(run(args))
    text = json.dumps(res)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
