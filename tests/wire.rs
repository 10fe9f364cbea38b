//! The upstream request's bytes on the wire (issue 22): the driven path sends head and body
//! in one write, and what arrives is byte for byte what Pingora's own proxy loop (the fast
//! path, two writes) sends for the same request; pooled connections are still reused.
//!
//! The provider is a raw TCP listener that records each request's head and body as they
//! arrived and answers a fixed response, keeping the connection alive.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// One request as it arrived: the connection it came on, its head and its body.
struct Arrived {
    conn: usize,
    head: Vec<u8>,
    body: Vec<u8>,
}

struct RawProvider {
    port: u16,
    connections: Arc<AtomicUsize>,
    arrived: mpsc::UnboundedReceiver<Arrived>,
}

impl RawProvider {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let (tx, arrived) = mpsc::unbounded_channel();
        let count = connections.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let conn = count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(sock, conn, tx.clone()));
            }
        });
        RawProvider {
            port,
            connections,
            arrived,
        }
    }

    fn config(&self, extra: &str) -> String {
        format!(
            "providers:\n  a: {{ kind: openai, base_url: \"http://127.0.0.1:{}/v1\" }}\nmodels:\n  m:\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}]\n{extra}",
            self.port
        )
    }

    async fn next(&mut self) -> Arrived {
        tokio::time::timeout(Duration::from_secs(10), self.arrived.recv())
            .await
            .unwrap()
            .unwrap()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn content_length(head: &[u8]) -> usize {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    text.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// Read requests off one connection until it closes; answer each with a fixed response.
async fn serve(mut sock: TcpStream, conn: usize, tx: mpsc::UnboundedSender<Arrived>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let len = content_length(&buf[..end]);
        while buf.len() < end + len {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let head = buf[..end].to_vec();
        let body = buf[end..end + len].to_vec();
        buf.drain(..end + len);
        let stream = find(&body, b"\"stream\":true").is_some();
        let _ = tx.send(Arrived { conn, head, body });
        if sock.write_all(&answer(stream)).await.is_err() {
            return;
        }
    }
}

fn answer(stream: bool) -> Vec<u8> {
    let (kind, body) = if stream {
        (
            "text/event-stream",
            concat!(
                "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up-a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n",
                "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up-a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n"
            ),
        )
    } else {
        (
            "application/json",
            "{\"id\":\"c1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"up-a\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}",
        )
    };
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The head with the per-request id blanked (the one value that differs between requests).
fn normalised(head: &[u8]) -> String {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .map(|l| {
            if l.to_ascii_lowercase().starts_with("x-request-id:") {
                "x-request-id: *".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

fn stream_body() -> serde_json::Value {
    serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

async fn ok(r: reqwest::Response) -> String {
    assert_eq!(r.status(), 200);
    let (text, broken) = read_all(r).await;
    assert!(!broken, "{text}");
    text
}

/// The caller can have the whole answer a moment before the gateway hands the upstream
/// connection back to the pool: wait that moment, so the next request finds it there.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_driven_paths_one_write_carries_the_fast_paths_exact_bytes() {
    // The same streamed request twice: held (the driven path, one write) and with the hold
    // off (Pingora's proxy loop, its own header and body writes).
    let mut held = RawProvider::start().await;
    let gw = Gateway::start(held.config(""));
    let text = ok(post_chat(&gw, &stream_body()).await).await;
    assert!(text.contains("[DONE]"), "{text}");
    let driven = held.next().await;

    let mut open = RawProvider::start().await;
    let gw_fast = Gateway::start(open.config("failover: { first_chunk_hold: 0 }\n"));
    let text = ok(post_chat(&gw_fast, &stream_body()).await).await;
    assert!(text.contains("[DONE]"), "{text}");
    let fast = open.next().await;

    let (dh, fh) = (normalised(&driven.head), normalised(&fast.head));
    // Only the port of the provider's Host differs between the two gateways.
    assert_eq!(
        dh.replace(&held.port.to_string(), "PORT"),
        fh.replace(&open.port.to_string(), "PORT"),
    );
    assert_eq!(driven.body, fast.body);
    assert_eq!(content_length(&driven.head), driven.body.len());
    assert!(!driven.body.is_empty());
    assert!(
        dh.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{dh}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_answers_reuse_one_pooled_connection() {
    // Non-streamed requests take the driven path; sequential ones share one connection.
    let mut p = RawProvider::start().await;
    let gw = Gateway::start(p.config(""));
    let mut bodies = Vec::new();
    for i in 0..4 {
        let mut body = chat("m");
        body["messages"][0]["content"] = serde_json::json!(format!("request {i}"));
        let text = ok(post_chat(&gw, &body).await).await;
        assert!(text.contains("\"hi\""), "{text}");
        let arrived = p.next().await;
        assert_eq!(arrived.conn, 0, "request {i} came on a new connection");
        assert_eq!(content_length(&arrived.head), arrived.body.len());
        bodies.push(String::from_utf8(arrived.body).unwrap());
        settle().await;
    }
    assert_eq!(p.connections.load(Ordering::SeqCst), 1);
    for (i, b) in bodies.iter().enumerate() {
        assert!(b.contains(&format!("request {i}")), "{b}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_on_the_fast_path_reuse_one_pooled_connection() {
    let mut p = RawProvider::start().await;
    let gw = Gateway::start(p.config("failover: { first_chunk_hold: 0 }\n"));
    for _ in 0..3 {
        ok(post_chat(&gw, &stream_body()).await).await;
        assert_eq!(p.next().await.conn, 0);
        settle().await;
    }
    assert_eq!(p.connections.load(Ordering::SeqCst), 1);
}
