#![allow(clippy::unwrap_used)]

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

mod fixtures;
mod misbehaviours;
mod surfaces;

const REPLY: &str = "Hello from signalbox-mock.";

async fn start(config: MockConfig) -> MockHandle {
    MockServer::start("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap()
}

async fn start_default() -> MockHandle {
    start(MockConfig::default()).await
}

fn chat_body(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    })
    .to_string()
}

fn post(path: &str, body: &str, extra_headers: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: mock.test\r\nAuthorization: Bearer sk-secret-123\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{extra_headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: mock.test\r\n\r\n").into_bytes()
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A minimal raw HTTP/1.1 client.
struct Client<S> {
    io: S,
    buf: Vec<u8>,
}

impl Client<TcpStream> {
    async fn connect(h: &MockHandle) -> Self {
        Client::new(TcpStream::connect(h.addr()).await.unwrap())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    fn new(io: S) -> Self {
        Client {
            io,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, raw: &[u8]) {
        self.io.write_all(raw).await.unwrap();
        self.io.flush().await.unwrap();
    }

    async fn fill(&mut self) -> io::Result<usize> {
        let mut tmp = [0u8; 8192];
        let n = self.io.read(&mut tmp).await?;
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n)
    }

    async fn fill_or_panic(&mut self) {
        assert!(self.fill().await.unwrap() > 0, "unexpected EOF");
    }

    /// Read until the peer closes or errors; returns the bytes and the error kind, if any.
    async fn read_to_end(&mut self) -> (Vec<u8>, Option<io::ErrorKind>) {
        loop {
            match self.fill().await {
                Ok(0) => return (std::mem::take(&mut self.buf), None),
                Ok(_) => {}
                Err(e) => return (std::mem::take(&mut self.buf), Some(e.kind())),
            }
        }
    }

    async fn head(&mut self) -> (u16, Vec<(String, String)>) {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(n) = resp.parse(&self.buf).unwrap() {
                let status = resp.code.unwrap();
                let headers = resp
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                self.buf.drain(..n);
                return (status, headers);
            }
            self.fill_or_panic().await;
        }
    }

    async fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            self.fill_or_panic().await;
        }
        self.buf.drain(..n).collect()
    }

    async fn line(&mut self) -> Vec<u8> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return line;
            }
            self.fill_or_panic().await;
        }
    }

    /// One chunk of a chunked body; `None` at the terminal chunk (trailers consumed).
    async fn chunk(&mut self) -> Option<Vec<u8>> {
        let line = self.line().await;
        let size = usize::from_str_radix(std::str::from_utf8(&line).unwrap().trim(), 16).unwrap();
        if size == 0 {
            while !self.line().await.is_empty() {}
            return None;
        }
        let data = self.exact(size).await;
        assert_eq!(self.exact(2).await, b"\r\n");
        Some(data)
    }

    async fn response(&mut self) -> Resp {
        let (status, headers) = self.head().await;
        let mut resp = Resp {
            status,
            headers,
            body: Vec::new(),
        };
        if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse().unwrap();
            resp.body = self.exact(len).await;
        } else if resp.header("transfer-encoding") == Some("chunked") {
            while let Some(c) = self.chunk().await {
                resp.body.extend_from_slice(&c);
            }
        }
        resp
    }

    async fn request(&mut self, raw: &[u8]) -> Resp {
        self.send(raw).await;
        self.response().await
    }
}

async fn one_shot(h: &MockHandle, raw: &[u8]) -> Resp {
    Client::connect(h).await.request(raw).await
}

async fn chat(h: &MockHandle, stream: bool) -> Resp {
    one_shot(
        h,
        &post("/v1/chat/completions", &chat_body("m", stream), ""),
    )
    .await
}

/// Parse an SSE body into the JSON of its data events (and whether it ended with [DONE]).
fn sse_events(body: &[u8]) -> (Vec<Value>, bool) {
    let text = std::str::from_utf8(body).unwrap();
    let mut events = Vec::new();
    let mut done = false;
    for block in text.split_terminator("\n\n") {
        let data = block.strip_prefix("data: ").unwrap();
        assert!(!done, "event after [DONE]");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    (events, done)
}

fn assert_reset_or_eof(bytes: &[u8], err: Option<io::ErrorKind>) {
    assert!(bytes.is_empty(), "expected no bytes, got {bytes:?}");
    assert!(
        matches!(
            err,
            None | Some(io::ErrorKind::ConnectionReset) | Some(io::ErrorKind::UnexpectedEof)
        ),
        "unexpected error {err:?}"
    );
}

#[tokio::test]
async fn json_answer_shape_and_model_echo() {
    let h = start_default().await;
    let model = "gpt-\"quoted\"\\model";
    let body = chat_body(model, false);
    let resp = one_shot(&h, &post("/v1/chat/completions", &body, "")).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(resp.header("x-mock-name"), Some("mock"));
    assert!(resp.header("date").is_some());
    let v = resp.json();
    assert_eq!(v["id"], "chatcmpl-mock-1");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], model);
    let created = v["created"].as_u64().unwrap();
    assert!(created.abs_diff(wire::unix_secs()) <= 5);
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], REPLY);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let prompt = (body.len() / 4) as u64;
    assert_eq!(v["usage"]["prompt_tokens"], prompt);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], prompt + 3);
    assert_eq!(h.calls(), 1);
    // Any prefix is accepted, and ids count up.
    let resp = one_shot(&h, &post("/chat/completions", &chat_body("x", false), "")).await;
    assert_eq!(resp.json()["id"], "chatcmpl-mock-2");
    assert_eq!(h.calls(), 2);
    assert!(h.base_url().starts_with("http://127.0.0.1:"));
    assert!(h.base_url().ends_with("/v1"));
}

#[tokio::test]
async fn sse_events_are_spread_over_time_and_end_with_done() {
    let h = start(MockConfig {
        stream: StreamShape {
            chunks: 4,
            gap: Duration::from_millis(50),
        },
        ..MockConfig::default()
    })
    .await;
    let mut c = Client::connect(&h).await;
    let sent = Instant::now();
    c.send(&post("/v1/chat/completions", &chat_body("gpt-s", true), ""))
        .await;
    let (status, headers) = c.head().await;
    assert_eq!(status, 200);
    let hv = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(hv("content-type").as_deref(), Some("text/event-stream"));
    assert_eq!(hv("cache-control").as_deref(), Some("no-cache"));
    assert_eq!(hv("transfer-encoding").as_deref(), Some("chunked"));
    assert_eq!(hv("x-mock-name").as_deref(), Some("mock"));
    let mut arrivals = Vec::new();
    let mut chunks = Vec::new();
    while let Some(chunk) = c.chunk().await {
        arrivals.push(sent.elapsed());
        chunks.push(chunk);
    }
    // The role-only chunk, 4 content events, the finish event, [DONE]: each in its own
    // chunk.
    assert_eq!(chunks.len(), 7);
    let mut text = String::new();
    let mut last_sent_us = 0;
    for (i, chunk) in chunks.iter().enumerate() {
        let (events, done) = sse_events(chunk);
        if i == 6 {
            assert!(done && events.is_empty());
            continue;
        }
        assert_eq!(events.len(), 1, "one event per chunk");
        let e = &events[0];
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["model"], "gpt-s");
        assert_eq!(e["id"], "chatcmpl-mock-1");
        let sent_us = e["mock_sent_us"].as_u64().unwrap();
        assert!(sent_us >= last_sent_us);
        last_sent_us = sent_us;
        if i == 0 {
            // OpenAI opens with the role and empty content, nothing else.
            assert!(e["choices"][0]["finish_reason"].is_null());
            assert_eq!(
                e["choices"][0]["delta"],
                serde_json::json!({"role": "assistant", "content": ""})
            );
        } else if i < 5 {
            assert!(e["choices"][0]["finish_reason"].is_null());
            assert!(e["choices"][0]["delta"].get("role").is_none());
            text.push_str(e["choices"][0]["delta"]["content"].as_str().unwrap());
        } else {
            assert_eq!(e["choices"][0]["finish_reason"], "stop");
            assert_eq!(e["choices"][0]["delta"], serde_json::json!({}));
            assert_eq!(e["usage"]["completion_tokens"], 3);
        }
    }
    assert_eq!(text, REPLY);
    // The first event is not held back until the stream is complete: 3 gaps of 50 ms separate
    // the first content event from the last.
    assert!(
        arrivals[4] - arrivals[1] >= Duration::from_millis(140),
        "{arrivals:?}"
    );
    // Keep-alive after a chunked answer.
    let resp = c
        .request(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    assert_eq!(resp.status, 200);
}

#[tokio::test]
async fn stream_behaviour_overrides_the_shape() {
    let h = start_default().await;
    h.push_script([Behaviour::Stream {
        chunks: 8,
        gap_ms: 0,
    }]);
    let resp = chat(&h, true).await;
    let (events, done) = sse_events(&resp.body);
    assert!(done);
    // The role-only chunk, 8 content chunks, the finish chunk.
    assert_eq!(events.len(), 10);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = events[1..9]
        .iter()
        .map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, REPLY);
    // A non-stream request under Stream is a JSON answer.
    h.push_script([Behaviour::Stream {
        chunks: 2,
        gap_ms: 0,
    }]);
    assert_eq!(chat(&h, false).await.json()["object"], "chat.completion");
}

#[tokio::test]
async fn status_sets_retry_after_and_default_body_echoes_credentials() {
    let h = start_default().await;
    h.push_script([
        Behaviour::Status {
            code: 429,
            retry_after: Some("7".into()),
            body: None,
        },
        Behaviour::Status {
            code: 500,
            retry_after: None,
            body: Some("{\"custom\":true}".into()),
        },
    ]);
    let mut c = Client::connect(&h).await;
    let resp = c
        .request(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), Some("7"));
    assert_eq!(resp.header("x-mock-name"), Some("mock"));
    let v = resp.json();
    assert_eq!(
        v["error"]["message"],
        "mock failure; Incorrect API key provided: Bearer sk-secret-123 at mock.test"
    );
    assert_eq!(v["error"]["type"], "mock_error");
    assert_eq!(v["error"]["code"], "mock_429");
    // Same connection: the error answer keeps it alive.
    let resp = c
        .request(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    assert_eq!(resp.status, 500);
    assert!(resp.header("retry-after").is_none());
    assert_eq!(resp.body, b"{\"custom\":true}");
    assert_eq!(h.calls(), 2);
}

#[tokio::test]
async fn script_is_fifo_then_default() {
    let h = start_default().await;
    let status = |code| Behaviour::Status {
        code,
        retry_after: None,
        body: None,
    };
    h.push_script([status(500), status(502)]);
    h.push_script([status(504)]);
    let mut c = Client::connect(&h).await;
    let req = post("/v1/chat/completions", &chat_body("m", false), "");
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(c.request(&req).await.status);
    }
    assert_eq!(codes, [500, 502, 504, 200]);
    // A new default applies to live connections too.
    h.set_default(status(503));
    assert_eq!(c.request(&req).await.status, 503);
    h.push_script([Behaviour::Ok]);
    assert_eq!(c.request(&req).await.status, 200);
    assert_eq!(c.request(&req).await.status, 503);
    let recorded: Vec<_> = h.requests().into_iter().map(|r| r.behaviour).collect();
    assert_eq!(
        recorded,
        [
            status(500),
            status(502),
            status(504),
            Behaviour::Ok,
            status(503),
            Behaviour::Ok,
            status(503)
        ]
    );
    // reset: counters, script, records and default.
    h.push_script([status(500)]);
    h.reset();
    assert_eq!(h.calls(), 0);
    assert!(h.requests().is_empty());
    assert_eq!(c.request(&req).await.status, 200);
    assert_eq!(h.calls(), 1);
}

#[tokio::test]
async fn reset_sends_rst_before_any_byte() {
    let h = start_default().await;
    h.push_script([Behaviour::Reset]);
    let mut c = Client::connect(&h).await;
    c.send(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    let (bytes, err) = c.read_to_end().await;
    assert!(bytes.is_empty());
    assert_eq!(err, Some(io::ErrorKind::ConnectionReset));
    assert_eq!(h.calls(), 1);
    assert_eq!(h.requests()[0].behaviour, Behaviour::Reset);
}

#[tokio::test]
async fn close_sends_fin_before_any_byte() {
    let h = start_default().await;
    h.push_script([Behaviour::Close]);
    let mut c = Client::connect(&h).await;
    c.send(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    let (bytes, err) = c.read_to_end().await;
    assert!(bytes.is_empty());
    assert_eq!(err, None, "clean EOF expected");
    assert_eq!(h.calls(), 1);
}

#[tokio::test]
async fn mid_stream_death_sends_n_events_then_resets() {
    let h = start_default().await;
    h.push_script([Behaviour::MidStreamDeath { after_chunks: 2 }]);
    let mut c = Client::connect(&h).await;
    c.send(&post("/v1/chat/completions", &chat_body("m", true), ""))
        .await;
    let (status, _) = c.head().await;
    assert_eq!(status, 200);
    let (rest, err) = c.read_to_end().await;
    assert_eq!(err, Some(io::ErrorKind::ConnectionReset));
    // Exactly three complete chunks, the role-only chunk then two content events; no
    // terminal chunk, no [DONE].
    let mut c2 = Client::new(tokio::io::empty());
    c2.buf = rest;
    let mut events = Vec::new();
    for _ in 0..3 {
        let chunk = c2.chunk().await.unwrap();
        let (e, done) = sse_events(&chunk);
        assert!(!done);
        events.extend(e);
    }
    assert!(c2.buf.is_empty(), "trailing bytes: {:?}", c2.buf);
    assert_eq!(events.len(), 3);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(events[1..]
        .iter()
        .all(|e| e["choices"][0]["delta"]["content"].is_string()));
    assert!(events
        .iter()
        .all(|e| e["choices"][0]["finish_reason"].is_null()));
}

#[tokio::test]
async fn mid_stream_death_non_stream_sends_half_the_body() {
    let h = start_default().await;
    h.push_script([Behaviour::MidStreamDeath { after_chunks: 1 }]);
    let mut c = Client::connect(&h).await;
    c.send(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    let (status, headers) = c.head().await;
    assert_eq!(status, 200);
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let (rest, err) = c.read_to_end().await;
    assert_eq!(err, Some(io::ErrorKind::ConnectionReset));
    assert_eq!(rest.len(), len / 2);
}

#[tokio::test]
async fn empty_stream_and_empty_choices() {
    let h = start_default().await;
    h.push_script([
        Behaviour::EmptyStream,
        Behaviour::EmptyChoices,
        Behaviour::EmptyChoices,
    ]);
    let mut c = Client::connect(&h).await;
    let req = post("/v1/chat/completions", &chat_body("m", true), "");
    c.send(&req).await;
    let (status, headers) = c.head().await;
    assert_eq!(status, 200);
    assert!(headers.contains(&("content-type".into(), "text/event-stream".into())));
    assert_eq!(c.chunk().await, None, "no events at all");
    // EmptyChoices, SSE: one chunk with no choices, then [DONE].
    let resp = c.request(&req).await;
    let (events, done) = sse_events(&resp.body);
    assert!(done);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["choices"], serde_json::json!([]));
    // EmptyChoices, JSON.
    let resp = c
        .request(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["choices"], serde_json::json!([]));
    assert_eq!(h.calls(), 3);
}

#[tokio::test]
async fn records_headers_body_hash_model_and_stream() {
    let h = start_default().await;
    let big = "x".repeat(300_000);
    let body = serde_json::json!({"model": "gpt-rec", "stream": true, "pad": big}).to_string();
    let req = post(
        "/v1/chat/completions?api-version=1",
        &body,
        "X-Custom: One\r\n",
    );
    let resp = one_shot(&h, &req).await;
    assert_eq!(resp.status, 200);
    let recs = h.requests();
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/v1/chat/completions?api-version=1");
    assert_eq!(r.body_len, body.len());
    assert_eq!(r.body_sha256, hex::encode(Sha256::digest(body.as_bytes())));
    assert!(
        r.body_sha256.len() == 64
            && r.body_sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "lowercase hex, as the gateway's tests compare it"
    );
    assert_eq!(r.model.as_deref(), Some("gpt-rec"));
    assert!(r.stream);
    assert_eq!(r.behaviour, Behaviour::Ok);
    assert_eq!(r.header("AUTHORIZATION"), Some("Bearer sk-secret-123"));
    assert_eq!(r.header("x-custom"), Some("One"));
    let names: Vec<_> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "host",
            "authorization",
            "content-type",
            "content-length",
            "x-custom"
        ]
    );

    // record: false still counts calls but keeps nothing.
    let h = start(MockConfig {
        record: false,
        ..MockConfig::default()
    })
    .await;
    assert_eq!(chat(&h, false).await.status, 200);
    assert_eq!(h.calls(), 1);
    assert!(h.requests().is_empty());
}

#[tokio::test]
async fn chunked_request_body_and_expect_continue() {
    let h = start_default().await;
    let body = chat_body("gpt-chunked", false);
    let (a, b) = body.split_at(10);
    let mut c = Client::connect(&h).await;
    c.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: mock.test\r\n\
          Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
    )
    .await;
    assert_eq!(c.exact(25).await, b"HTTP/1.1 100 Continue\r\n\r\n");
    let mut raw = Vec::new();
    raw.extend_from_slice(format!("{:x};ext=1\r\n{a}\r\n", a.len()).as_bytes());
    raw.extend_from_slice(format!("{:X}\r\n{b}\r\n", b.len()).as_bytes());
    raw.extend_from_slice(b"0\r\nX-Trailer: t\r\n\r\n");
    c.send(&raw).await;
    let resp = c.response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["model"], "gpt-chunked");
    let r = &h.requests()[0];
    assert_eq!(r.body_len, body.len());
    assert_eq!(r.body_sha256, hex::encode(Sha256::digest(body.as_bytes())));

    // Content-Length with Expect: the 100 comes before the body is sent.
    c.send(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: mock.test\r\n\
             Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(c.exact(25).await, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.send(body.as_bytes()).await;
    assert_eq!(c.response().await.status, 200);
    assert_eq!(h.calls(), 2);
}

#[tokio::test]
async fn control_endpoints() {
    let h = start(MockConfig {
        name: "ctl".into(),
        ..MockConfig::default()
    })
    .await;
    let mut c = Client::connect(&h).await;
    let resp = c
        .request(&post(
            "/_mock/script",
            r#"[{"kind":"status","code":418},{"kind":"ok"}]"#,
            "",
        ))
        .await;
    assert_eq!(resp.status, 200);
    let chat_req = post("/v1/chat/completions", &chat_body("m", false), "");
    assert_eq!(c.request(&chat_req).await.status, 418);
    let resp = c
        .request(&post(
            "/_mock/default",
            r#"{"kind":"status","code":503}"#,
            "",
        ))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(c.request(&chat_req).await.status, 200);
    assert_eq!(c.request(&chat_req).await.status, 503);
    let stats = c.request(&get("/_mock/stats")).await;
    assert_eq!(stats.status, 200);
    let v = stats.json();
    assert_eq!(v["name"], "ctl");
    assert_eq!(v["calls"], 3);
    assert_eq!(v["model_list_calls"], 0);
    assert_eq!(v["requests"].as_array().unwrap().len(), 3);
    assert_eq!(v["requests"][0]["behaviour"]["kind"], "status");
    assert_eq!(v["requests"][0]["behaviour"]["code"], 418);
    assert_eq!(v["requests"][0]["model"], "m");
    // Bad control JSON.
    for (path, body) in [
        ("/_mock/script", "nope"),
        ("/_mock/script", r#"{"kind":"ok"}"#),
        ("/_mock/default", r#"{"kind":"ok","extra":1}"#),
        ("/_mock/default", r#"{"kind":"explode"}"#),
    ] {
        let resp = c.request(&post(path, body, "")).await;
        assert_eq!(resp.status, 400, "{path} {body}");
        assert_eq!(resp.json()["error"]["code"], "invalid_json");
    }
    assert_eq!(c.request(&post("/_mock/reset", "", "")).await.status, 200);
    assert_eq!(h.calls(), 0);
    assert_eq!(c.request(&chat_req).await.status, 200);
    // Control calls never count.
    assert_eq!(h.calls(), 1);
    assert_eq!(h.model_list_calls(), 0);
}

#[tokio::test]
async fn keep_alive_and_connection_close() {
    let h = start_default().await;
    let mut c = Client::connect(&h).await;
    let body = chat_body("m", false);
    let r1 = c.request(&post("/v1/chat/completions", &body, "")).await;
    assert_eq!(r1.status, 200);
    assert!(r1.header("connection").is_none());
    let r2 = c
        .request(&post(
            "/v1/chat/completions",
            &body,
            "Connection: close\r\n",
        ))
        .await;
    assert_eq!(r2.status, 200);
    assert_eq!(r2.header("connection"), Some("close"));
    assert_eq!(r2.json()["id"], "chatcmpl-mock-2");
    let (rest, err) = c.read_to_end().await;
    assert!(rest.is_empty());
    assert_eq!(err, None);
    assert_eq!(h.calls(), 2);
}

#[tokio::test]
async fn models_endpoint_counts_and_leaves_the_script() {
    let h = start_default().await;
    h.push_script([Behaviour::Status {
        code: 500,
        retry_after: None,
        body: None,
    }]);
    let resp = one_shot(&h, &get("/v1/models")).await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.json(),
        serde_json::json!({"object":"list","data":[{"id":"mock-model","object":"model","owned_by":"signalbox-mock"}]})
    );
    assert_eq!(h.model_list_calls(), 1);
    assert_eq!(h.calls(), 0);
    assert_eq!(chat(&h, false).await.status, 500);
}

#[tokio::test]
async fn bad_requests_and_unknown_paths() {
    let h = start_default().await;
    let mut c = Client::connect(&h).await;
    let resp = c
        .request(&post("/v1/chat/completions", "{not json", ""))
        .await;
    assert_eq!(resp.status, 400);
    let v = resp.json();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "invalid_json");
    let resp = c.request(&post("/v1/chat/completions", "[1,2]", "")).await;
    assert_eq!(resp.status, 400);
    // Invalid JSON counts as a call but does not consume the script.
    assert_eq!(h.calls(), 2);
    let resp = c.request(&get("/v1/nothing-here")).await;
    assert_eq!(resp.status, 404);
    assert!(resp.json()["error"]["message"].is_string());
    assert_eq!(c.request(&get("/v1/chat/completions")).await.status, 405);
    // Still usable.
    assert_eq!(
        c.request(&post("/v1/chat/completions", &chat_body("m", false), ""))
            .await
            .status,
        200
    );
    // Garbage is a 400 and a close.
    let mut c = Client::connect(&h).await;
    let resp = c.request(b"\x01\x02 nonsense\r\n\r\n").await;
    assert_eq!(resp.status, 400);
    assert_eq!(c.read_to_end().await, (Vec::new(), None));
}

#[tokio::test]
async fn hang_never_answers_and_slow_header_waits() {
    let h = start_default().await;
    h.push_script([Behaviour::Hang, Behaviour::SlowHeader { ms: 100 }]);
    let mut c = Client::connect(&h).await;
    c.send(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    let waited = tokio::time::timeout(Duration::from_millis(150), c.fill()).await;
    assert!(waited.is_err(), "hang answered: {waited:?}");
    assert_eq!(h.calls(), 1);
    assert_eq!(h.requests()[0].behaviour, Behaviour::Hang);
    drop(c);
    let started = Instant::now();
    let resp = chat(&h, false).await;
    assert_eq!(resp.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(100));
}

#[tokio::test]
async fn shutdown_closes_live_connections_and_stops_accepting() {
    let h = start_default().await;
    let mut c = Client::connect(&h).await;
    assert_eq!(
        c.request(&post("/v1/chat/completions", &chat_body("m", false), ""))
            .await
            .status,
        200
    );
    h.shutdown();
    let (rest, _) = tokio::time::timeout(Duration::from_secs(2), c.read_to_end())
        .await
        .unwrap();
    assert!(rest.is_empty());
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if TcpStream::connect(h.addr()).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting");
        tokio::task::yield_now().await;
    }
}

fn tls_files(dir: &std::path::Path) -> (TlsFiles, rustls::pki_types::CertificateDer<'static>) {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let files = TlsFiles {
        cert_chain_pem: dir.join("cert.pem"),
        key_pem: dir.join("key.pem"),
    };
    std::fs::write(&files.cert_chain_pem, cert.pem()).unwrap();
    std::fs::write(&files.key_pem, key_pair.serialize_pem()).unwrap();
    (files, cert.der().clone())
}

async fn tls_client(
    h: &MockHandle,
    root: &rustls::pki_types::CertificateDer<'static>,
) -> Client<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    Client::new(tls)
}

#[tokio::test]
async fn tls_serves_and_resets() {
    let dir = tempfile::tempdir().unwrap();
    let (files, root) = tls_files(dir.path());
    let h = start(MockConfig {
        tls: Some(files),
        ..MockConfig::default()
    })
    .await;
    assert!(h.base_url().starts_with("https://127.0.0.1:"));
    let mut c = tls_client(&h, &root).await;
    let resp = c
        .request(&post("/v1/chat/completions", &chat_body("tls-m", true), ""))
        .await;
    assert_eq!(resp.status, 200);
    let (events, done) = sse_events(&resp.body);
    assert!(done);
    // The role-only chunk, 5 content chunks, the finish chunk.
    assert_eq!(events.len(), 7);
    h.push_script([Behaviour::Reset]);
    c.send(&post("/v1/chat/completions", &chat_body("m", false), ""))
        .await;
    let (bytes, err) = c.read_to_end().await;
    assert_reset_or_eof(&bytes, err);
    assert!(err.is_some(), "a reset is not a clean close_notify");
    assert_eq!(h.calls(), 2);

    // Missing files are reported at start.
    let err = MockServer::start(
        "127.0.0.1:0".parse().unwrap(),
        MockConfig {
            tls: Some(TlsFiles {
                cert_chain_pem: dir.path().join("missing.pem"),
                key_pem: dir.path().join("key.pem"),
            }),
            ..MockConfig::default()
        },
    )
    .await
    .err()
    .unwrap();
    assert!(err.to_string().contains("missing.pem"));
}

#[test]
fn reply_pieces_concatenate_to_the_reply() {
    for text in [
        REPLY,
        "",
        "one",
        "  spaced   words here ",
        "a b c d e f g h i j",
    ] {
        let reply = wire::Reply::new(text);
        for k in 0..12 {
            let joined: String = (0..k).map(|i| reply.piece(i, k)).collect();
            assert_eq!(joined, if k == 0 { "" } else { text }, "{text:?} k={k}");
            assert_eq!(reply.piece(k, k), "");
        }
    }
    assert_eq!(wire::Reply::new(REPLY).words, 3);
}

#[test]
fn json_escaping_is_valid() {
    let nasty = "q\"b\\s\n\r\t\u{1}\u{7f}é🎉";
    let mut out = b"\"".to_vec();
    wire::escape_json(&mut out, nasty.as_bytes());
    out.push(b'"');
    let back: String = serde_json::from_slice(&out).unwrap();
    assert_eq!(back, nasty);
}

#[test]
fn behaviour_json_forms() {
    let parse = |s: &str| serde_json::from_str::<Behaviour>(s);
    assert_eq!(parse(r#"{"kind":"ok"}"#).unwrap(), Behaviour::Ok);
    assert_eq!(
        parse(r#"{"kind":"status","code":503}"#).unwrap(),
        Behaviour::Status {
            code: 503,
            retry_after: None,
            body: None
        }
    );
    assert_eq!(
        parse(r#"{"kind":"mid_stream_death","after_chunks":2}"#).unwrap(),
        Behaviour::MidStreamDeath { after_chunks: 2 }
    );
    assert_eq!(
        parse(r#"{"kind":"slow_header","ms":5}"#).unwrap(),
        Behaviour::SlowHeader { ms: 5 }
    );
    assert_eq!(
        parse(r#"{"kind":"stream","chunks":3,"gap_ms":10}"#).unwrap(),
        Behaviour::Stream {
            chunks: 3,
            gap_ms: 10
        }
    );
    for kind in ["hang", "reset", "close", "empty_stream", "empty_choices"] {
        assert!(parse(&format!(r#"{{"kind":"{kind}"}}"#)).is_ok(), "{kind}");
    }
    assert!(parse(r#"{"kind":"ok","x":1}"#).is_err());
    assert!(parse(r#"{"kind":"status"}"#).is_err());
    assert!(parse(r#"{"kind":"status","code":500,"x":1}"#).is_err());
    assert!(parse(r#"{"kind":"hang","ms":100}"#).is_err());
    assert!(parse(r#"{"code":500}"#).is_err());
    let s = serde_json::to_string(&Behaviour::Status {
        code: 429,
        retry_after: Some("1".into()),
        body: None,
    })
    .unwrap();
    assert_eq!(s, r#"{"kind":"status","code":429,"retry_after":"1"}"#);
}

// === Helpers for the dialect and misbehaviour tests ===

/// The headers an Anthropic call needs.
const ANTHROPIC: &str = "x-api-key: sk-ant-123\r\nanthropic-version: 2023-06-01\r\n";

/// `base` with the members of `extra` (an object) set.
fn merged(mut base: Value, extra: Value) -> String {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base.to_string()
}

/// A minimal body for `endpoint`, with `extra` members.
fn body_for(endpoint: Endpoint, stream: bool, extra: Value) -> String {
    let base = match endpoint {
        Endpoint::ChatCompletions => serde_json::json!({
            "model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}],
        }),
        Endpoint::Completions => {
            serde_json::json!({"model": "m", "stream": stream, "prompt": "hi"})
        }
        Endpoint::Embeddings => serde_json::json!({"model": "m", "input": "hi"}),
        Endpoint::Responses => serde_json::json!({"model": "m", "stream": stream, "input": "hi"}),
        Endpoint::Messages => serde_json::json!({
            "model": "m", "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}],
        }),
        Endpoint::CountTokens => {
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        }
        Endpoint::Moderations => serde_json::json!({"model": "m", "input": "hi"}),
    };
    merged(base, extra)
}

fn path_of(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions => "/v1/chat/completions",
        Endpoint::Completions => "/v1/completions",
        Endpoint::Embeddings => "/v1/embeddings",
        Endpoint::Responses => "/v1/responses",
        Endpoint::Messages => "/v1/messages",
        Endpoint::CountTokens => "/v1/messages/count_tokens",
        Endpoint::Moderations => "/v1/moderations",
    }
}

/// A raw request to `endpoint` with the headers its dialect needs.
fn request_to(endpoint: Endpoint, body: &str) -> Vec<u8> {
    let headers = match endpoint.dialect() {
        Dialect::OpenAi => "",
        Dialect::Anthropic => ANTHROPIC,
    };
    post(path_of(endpoint), body, headers)
}

/// A request to `endpoint` with its minimal body.
fn call_to(endpoint: Endpoint, stream: bool) -> Vec<u8> {
    request_to(endpoint, &body_for(endpoint, stream, serde_json::json!({})))
}

/// The endpoints that stream.
const STREAMING: [Endpoint; 4] = [
    Endpoint::ChatCompletions,
    Endpoint::Completions,
    Endpoint::Responses,
    Endpoint::Messages,
];

/// The events of an SSE body: `(event name, data)`; `data: [DONE]` is the string `"[DONE]"`.
fn named_events(body: &[u8]) -> Vec<(Option<String>, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    text.split_terminator("\n\n")
        .map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(if d == "[DONE]" {
                        Value::String(d.to_string())
                    } else {
                        serde_json::from_str(d).unwrap()
                    });
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (name, data.expect("an event without data"))
        })
        .collect()
}

/// What an event is, in any dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Carries a piece of the answer.
    Content,
    /// The stream's own end: `[DONE]`, `response.completed`, `message_stop`.
    Terminal,
    /// The provider's in-band error.
    Error,
    /// Anything else (opening, block boundaries, finish chunk, usage).
    Other,
}

fn kind_of(endpoint: Endpoint, name: Option<&str>, data: &Value) -> Kind {
    if data == "[DONE]" {
        return Kind::Terminal;
    }
    match endpoint.dialect() {
        Dialect::Anthropic => match name {
            Some("content_block_delta") => Kind::Content,
            Some("message_stop") => Kind::Terminal,
            Some("error") => Kind::Error,
            _ => Kind::Other,
        },
        Dialect::OpenAi if endpoint == Endpoint::Responses => match name {
            Some(n) if n.ends_with(".delta") => Kind::Content,
            Some("response.completed") => Kind::Terminal,
            Some("error") => Kind::Error,
            _ => Kind::Other,
        },
        Dialect::OpenAi => {
            if data.get("error").is_some() {
                return Kind::Error;
            }
            let choice = &data["choices"][0];
            let delta = &choice["delta"];
            let carries = delta["content"].is_string()
                || delta["tool_calls"].is_array()
                || choice["text"].is_string();
            let opening = delta["role"].is_string() && delta["content"] == "";
            let empty_text = choice["text"] == "" && data["choices"][0]["finish_reason"].is_null();
            if carries && choice["finish_reason"].is_null() && !opening && !empty_text {
                Kind::Content
            } else {
                Kind::Other
            }
        }
    }
}

/// The kinds of an SSE body's events, `Other` left out.
fn kinds(endpoint: Endpoint, body: &[u8]) -> Vec<Kind> {
    named_events(body)
        .iter()
        .map(|(n, d)| kind_of(endpoint, n.as_deref(), d))
        .filter(|k| *k != Kind::Other)
        .collect()
}

/// Split a raw chunked body that may lack its terminal chunk: the chunks' data, and whether
/// the terminal chunk came.
fn split_chunks(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    while !raw.is_empty() {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            assert_eq!(raw, b"\r\n", "bytes after the terminal chunk");
            return (data, true);
        }
        data.extend_from_slice(&raw[..size]);
        assert_eq!(&raw[size..size + 2], b"\r\n");
        raw = &raw[size + 2..];
    }
    (data, false)
}
