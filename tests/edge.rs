//! The edge: what a caller's connection sees before (and around) a request reaches the proxy —
//! deadlines on slow clients, refusals of bad HTTP in signalbox's words, client faults in the
//! body answered as such, and pipelined requests. Every test speaks raw bytes over a
//! `TcpStream`, as the adversarial sweep of issue 20 did.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use signalbox_mock::MockHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Model `m` on one mock, with `limits` (YAML flow-mapping entries) if any.
fn config(a: &MockHandle, limits: &str) -> String {
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!("limits: {{ {limits} }}\n")
    };
    format!(
        "providers:\n{}models:\n  m:\n    deployments: [{{ provider: a, model: up-m }}]\n{limits}",
        provider("a", a)
    )
}

/// One HTTP/1.1 response as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            panic!(
                "not JSON ({} {:?}): {}",
                self.status,
                self.headers,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// An OpenAI-shaped error with `code`, in signalbox's words (no `Server: Pingora`).
    fn assert_error(&self, status: u16, code: &str) {
        let v = self.json();
        assert_eq!(self.status, status, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        assert!(v["error"].get("param").is_some(), "{v}");
        self.assert_ours();
    }

    fn assert_ours(&self) {
        assert_eq!(self.header("server"), None, "{:?}", self.headers);
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{:?}",
            self.headers
        );
    }
}

/// A raw client connection with a read buffer (pipelined answers arrive back to back).
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect(gw: &Gateway) -> Self {
        Self {
            s: TcpStream::connect(gw.proxy).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    /// Read more bytes; `false` at EOF (or a reset).
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.s.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// The next response, `None` when the connection closed before one was complete.
    async fn answer(&mut self) -> Option<Answer> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill().await {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let status = lines.next()?.get(9..12)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        self.buf.drain(..head_end);
        let mut answer = Answer {
            status,
            headers,
            body: Vec::new(),
        };
        if let Some(len) = answer.header("content-length") {
            let len: usize = len.parse().ok()?;
            while self.buf.len() < len {
                if !self.fill().await {
                    return None;
                }
            }
            answer.body = self.buf.drain(..len).collect();
        } else if answer
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let line_end = loop {
                    if let Some(i) = find(&self.buf, b"\r\n") {
                        break i;
                    }
                    if !self.fill().await {
                        return None;
                    }
                };
                let size_text = String::from_utf8_lossy(&self.buf[..line_end]).to_string();
                let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
                while self.buf.len() < line_end + 2 + size + 2 {
                    if !self.fill().await {
                        return None;
                    }
                }
                answer
                    .body
                    .extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.buf.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break;
                }
            }
        }
        Some(answer)
    }

    /// Whether the gateway closes the connection (EOF) within `within`, nothing more sent.
    async fn closes_within(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, async { while self.fill().await {} })
            .await
            .is_ok()
            && self.buf.is_empty()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

fn chat_request(extra_headers: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra_headers}\r\n{CHAT}",
        CHAT.len()
    )
}

// === deadlines ===

#[tokio::test(flavor = "multi_thread")]
async fn a_slowloris_head_gets_408_at_the_header_timeout_however_often_it_sends() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "header_timeout: 1s"));
    let mut c = Raw::connect(&gw).await;
    let started = Instant::now();
    // One byte every 200 ms: each read is quick, the head never completes.
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    c.send(head).await;
    let writer = async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if c.s.write_all(b"a").await.is_err() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(1500), writer).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
        .await
        .expect("answered in time")
        .expect("an answer before the close");
    answer.assert_error(408, "request_timeout");
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(c.closes_within(Duration::from_secs(2)).await);
    assert!(a.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_sends_nothing_is_closed_at_the_header_timeout() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "header_timeout: 1s"));
    let mut c = Raw::connect(&gw).await;
    let started = Instant::now();
    assert!(c.closes_within(Duration::from_secs(4)).await);
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trickled_body_gets_408_at_the_body_timeout_however_often_it_sends() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "body_timeout: 1s"));
    let mut c = Raw::connect(&gw).await;
    let started = Instant::now();
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
        .await;
    let writer = async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if c.s.write_all(b" ").await.is_err() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(1500), writer).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
        .await
        .expect("answered in time")
        .expect("an answer before the close");
    answer.assert_error(408, "request_timeout");
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(c.closes_within(Duration::from_secs(2)).await);
    assert!(a.requests().is_empty());
    let metrics = gw.metrics_with(&[r#"status_class="4xx""#]).await;
    assert!(metrics.contains(r#"status_class="4xx""#), "{metrics}");
    assert!(!metrics.contains(r#"status_class="5xx""#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_shorter_than_its_content_length_is_408_not_500() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "body_timeout: 1s"));
    let mut c = Raw::connect(&gw).await;
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":\"m\"}")
        .await;
    let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
        .await
        .expect("answered in time")
        .expect("an answer");
    answer.assert_error(408, "request_timeout");
    // Counted once the request's logging hook ran (after the answer).
    let metrics = gw.metrics_with(&[r#"status_class="4xx""#]).await;
    assert!(!metrics.contains(r#"status_class="5xx""#), "{metrics}");
    assert!(metrics.contains(r#"status_class="4xx""#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_keepalive_connection_is_closed_at_the_idle_timeout() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "idle_timeout: 1s, header_timeout: 5s"));
    let mut c = Raw::connect(&gw).await;
    c.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let answer = c.answer().await.expect("the model list");
    assert_eq!(answer.status, 200);
    let idle_from = Instant::now();
    assert!(c.closes_within(Duration::from_secs(4)).await);
    let idle = idle_from.elapsed();
    assert!(idle >= Duration::from_millis(900), "{idle:?}");
    // The idle wait is its own: the header deadline (5 s) did not decide it.
    assert!(idle < Duration::from_secs(3), "{idle:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keepalive_request_gets_the_whole_header_timeout_after_its_first_byte() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "idle_timeout: 1s, header_timeout: 2s"));
    let mut c = Raw::connect(&gw).await;
    c.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(c.answer().await.unwrap().status, 200);
    // The next request starts inside the idle window and then trickles past it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    c.send(b"GET /v1/mod").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    c.send(b"els HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let answer = tokio::time::timeout(Duration::from_secs(4), c.answer())
        .await
        .unwrap()
        .expect("the model list");
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() < Duration::from_secs(2));
}

// === client faults in the body ===

#[tokio::test(flavor = "multi_thread")]
async fn bad_chunk_framing_is_a_400_in_our_words_never_a_5xx() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, ""));
    let cases: [&[u8]; 3] = [
        b"zz\r\nabc\r\n0\r\n\r\n",
        b"100000000000000000000\r\nabc\r\n0\r\n\r\n",
        b"3\r\nabcX0\r\n\r\n",
    ];
    for body in cases {
        let mut c = Raw::connect(&gw).await;
        let mut req =
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        req.extend_from_slice(body);
        c.send(&req).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
            .await
            .expect("answered in time")
            .unwrap_or_else(|| panic!("no answer to {}", String::from_utf8_lossy(body)));
        answer.assert_error(400, "invalid_http");
        assert_eq!(answer.header("connection"), Some("close"));
    }
    assert!(a.requests().is_empty());
    let counted = r#"signalbox_http_refusals_total{code="invalid_http"} 3"#;
    let metrics = gw.metrics_with(&[counted]).await;
    assert!(metrics.contains(counted), "{metrics}");
    assert!(!metrics.contains(r#"status_class="5xx""#), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_cut_short_by_the_client_is_a_400() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, ""));
    let mut c = Raw::connect(&gw).await;
    c.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\"",
    )
    .await;
    c.s.shutdown().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
        .await
        .expect("answered in time")
        .expect("an answer to the half-closed connection");
    answer.assert_error(400, "invalid_http");
    let counted = r#"signalbox_http_refusals_total{code="invalid_http"} 1"#;
    let metrics = gw.metrics_with(&[counted]).await;
    assert!(metrics.contains(counted), "{metrics}");
    assert!(!metrics.contains(r#"status_class="5xx""#), "{metrics}");
}

// === refusals in our words ===

/// Heads Pingora (or signalbox at the edge) refuses, with the answer each must get.
const REFUSALS: &[(&str, &[u8], u16, &str)] = &[
    ("garbage request line", b"HELLO\r\n\r\n", 400, "invalid_http"),
    ("bad version", b"POST /v1/chat/completions HTTP/7.1\r\nHost: x\r\n\r\n", 400, "invalid_http"),
    ("space in a header name", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400, "invalid_http"),
    ("header without a colon", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n", 400, "invalid_http"),
    ("NUL in a header value", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400, "invalid_http"),
    ("conflicting Content-Length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{", 400, "invalid_http"),
    ("unparseable Content-Length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "invalid_http"),
    ("chunked not final", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400, "invalid_http"),
    ("Transfer-Encoding on HTTP/1.0", b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "invalid_http"),
    ("two Host headers", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "invalid_http"),
    ("userinfo in Host", b"POST /v1/chat/completions HTTP/1.1\r\nHost: u@x\r\n\r\n", 400, "invalid_http"),
    ("absolute form against Host", b"POST http://a.example/v1/chat/completions HTTP/1.1\r\nHost: b.example\r\n\r\n", 400, "invalid_http"),
    ("CONNECT", b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n", 405, "method_not_allowed"),
    ("gzip, chunked", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501, "unsupported_transfer_coding"),
];

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_of_bad_http_is_in_our_words() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, ""));
    for (what, head, status, code) in REFUSALS {
        let mut c = Raw::connect(&gw).await;
        c.send(head).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer in time"))
            .unwrap_or_else(|| panic!("{what}: closed without an answer"));
        assert_eq!(answer.status, *status, "{what}: {answer:?}");
        answer.assert_error(*status, code);
        assert_eq!(answer.header("connection"), Some("close"), "{what}");
    }
    assert!(a.requests().is_empty());
    let metrics = gw
        .metrics_with(&[
            r#"signalbox_http_refusals_total{code="invalid_http"} 12"#,
            r#"signalbox_http_refusals_total{code="method_not_allowed"} 1"#,
        ])
        .await;
    assert!(!metrics.contains(r#"status_class="5xx""#), "{metrics}");
    assert!(
        metrics.contains(r#"signalbox_http_refusals_total{code="invalid_http"} 12"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"signalbox_http_refusals_total{code="method_not_allowed"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"signalbox_http_refusals_total{code="unsupported_transfer_coding"} 1"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn too_many_headers_are_431_and_a_huge_uri_414() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, ""));
    let mut many = String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
    for i in 0..2000 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let long_uri = format!(
        "POST /v1/chat/completions?q={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let mut huge = String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
    for i in 0..40 {
        huge.push_str(&format!("X-Big{i}: {}\r\n", "b".repeat(32 * 1024)));
    }
    huge.push_str("\r\n");
    for (what, head, status, code) in [
        (
            "2,000 small headers",
            many,
            431,
            "request_headers_too_large",
        ),
        ("a 100 KiB URI", long_uri, 414, "uri_too_long"),
        (
            "1.25 MiB of headers",
            huge,
            431,
            "request_headers_too_large",
        ),
    ] {
        let mut c = Raw::connect(&gw).await;
        // The gateway may answer (and close) before it has read everything.
        let _ = c.s.write_all(head.as_bytes()).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer in time"))
            .unwrap_or_else(|| panic!("{what}: closed without an answer"));
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        answer.assert_error(status, code);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_on_a_messages_path_is_in_anthropic_shape() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, "header_timeout: 1s"));
    for head in [
        &b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n"[..],
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Slow: ",
    ] {
        let mut c = Raw::connect(&gw).await;
        c.send(head).await;
        let answer = tokio::time::timeout(Duration::from_secs(5), c.answer())
            .await
            .unwrap()
            .expect("an answer");
        let v = answer.json();
        assert_eq!(v["type"], "error", "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        assert_eq!(answer.header("server"), None);
    }
}

// === pipelining ===

#[tokio::test(flavor = "multi_thread")]
async fn pipelined_requests_are_answered_in_order() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, ""));
    let mut c = Raw::connect(&gw).await;
    let one = chat_request("");
    let two = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    let three = chat_request("Connection: close\r\n");
    c.send(format!("{one}{two}{three}").as_bytes()).await;
    let first = tokio::time::timeout(Duration::from_secs(10), c.answer())
        .await
        .unwrap()
        .expect("the first answer");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.json()["choices"].is_array());
    let second = tokio::time::timeout(Duration::from_secs(10), c.answer())
        .await
        .unwrap()
        .expect("the second answer, after a first that did not say close");
    assert_eq!(second.status, 200);
    assert_eq!(second.json()["object"], "list");
    let third = tokio::time::timeout(Duration::from_secs(10), c.answer())
        .await
        .unwrap()
        .expect("the third answer");
    assert_eq!(third.status, 200);
    assert!(third.json()["choices"].is_array());
    assert!(c.closes_within(Duration::from_secs(2)).await);
    assert_eq!(a.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipelined_request_after_a_chunked_one_is_answered_too() {
    let a = mock("a").await;
    let gw = Gateway::start(config(&a, ""));
    let mut c = Raw::connect(&gw).await;
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{CHAT}\r\n0\r\n\r\n",
        CHAT.len()
    );
    let next = chat_request("");
    c.send(format!("{chunked}{next}").as_bytes()).await;
    for n in 0..2 {
        let answer = tokio::time::timeout(Duration::from_secs(10), c.answer())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("answer {n}"));
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    assert_eq!(a.requests().len(), 2);
}
