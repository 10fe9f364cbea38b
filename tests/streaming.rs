//! SSE streams pass through as produced, with the caller's model name, and a stream that
//! breaks after the first byte ends with an error event, never a clean `[DONE]`.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use signalbox_mock::{Behaviour, MockHandle};

fn config(a: &MockHandle, b: &MockHandle) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\n",
        provider("a", a),
        provider("b", b),
    )
}

fn stream_body() -> serde_json::Value {
    serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

/// Read a streamed response, returning each received chunk with its arrival time.
async fn read_chunks(r: reqwest::Response) -> (Vec<(Instant, Vec<u8>)>, Option<String>) {
    let mut chunks = Vec::new();
    let mut stream = r.bytes_stream();
    let mut error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(b) => chunks.push((Instant::now(), b.to_vec())),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    (chunks, error)
}

fn text_of(chunks: &[(Instant, Vec<u8>)]) -> String {
    let all: Vec<u8> = chunks.iter().flat_map(|(_, c)| c.clone()).collect();
    String::from_utf8(all).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn chunks_arrive_as_they_are_produced() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(Behaviour::Stream {
        chunks: 5,
        gap_ms: 150,
    });
    let gw = Gateway::start(config(&a, &b));
    let sent = Instant::now();
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/event-stream");
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let (chunks, err) = read_chunks(r).await;
    assert!(err.is_none(), "{err:?}");
    let text = text_of(&chunks);
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| e.starts_with("data: "))
        .collect();
    assert_eq!(
        events.len(),
        8,
        "the role-only chunk, 5 content events, the final event, [DONE]: {text}"
    );
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    for (i, e) in events[..7].iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(&e["data: ".len()..]).unwrap();
        assert_eq!(v["model"], "m", "the caller's name in every chunk: {e}");
        let delta = &v["choices"][0]["delta"];
        assert_eq!(i == 0, delta.get("role").is_some(), "the role leads: {e}");
    }
    // The stream takes about 6 gaps (900 ms). The first event must arrive long before the end,
    // and arrivals must be spread out, not delivered in one burst.
    let first = chunks.first().unwrap().0.duration_since(sent);
    let last = chunks.last().unwrap().0.duration_since(sent);
    assert!(
        first < Duration::from_millis(400),
        "first chunk after {first:?}"
    );
    assert!(
        last >= Duration::from_millis(750),
        "last chunk after {last:?}"
    );
    assert!(chunks.len() >= 5, "received in {} pieces", chunks.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_fails_before_its_header_fails_over() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(status(503));
    let gw = Gateway::start(config(&a, &b));
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let (chunks, err) = read_chunks(r).await;
    assert!(err.is_none());
    assert!(text_of(&chunks).ends_with("data: [DONE]\n\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn mid_stream_death_ends_with_an_error_event_not_done() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(Behaviour::MidStreamDeath { after_chunks: 2 });
    let gw = Gateway::start(config(&a, &b));
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(r.status(), 200);
    let (chunks, _err) = read_chunks(r).await;
    let text = text_of(&chunks);
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| e.starts_with("data: "))
        .collect();
    // The role-only chunk, 2 content events, the error event.
    assert_eq!(events.len(), 4, "{text}");
    let last: serde_json::Value = serde_json::from_str(&events[3]["data: ".len()..]).unwrap();
    assert_eq!(last["error"]["code"], "upstream_stream_interrupted");
    assert!(!text.contains("[DONE]"));
    assert_eq!(b.calls(), 0, "no attempt after the first byte");
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_stream_fails_over_under_the_hold_and_is_reported_in_band_without_it() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(Behaviour::EmptyStream);
    // The first-chunk hold (on by default): nothing reached the caller, so b serves.
    let gw = Gateway::start(config(&a, &b));
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let (chunks, _) = read_chunks(r).await;
    assert!(text_of(&chunks).trim_end().ends_with("data: [DONE]"));
    let m = gw
        .metrics_with(&[r#"signalbox_attempts_total{provider="a",outcome="empty"} 1"#])
        .await;
    assert!(
        m.contains(r#"signalbox_attempts_total{provider="a",outcome="empty"} 1"#),
        "{m}"
    );
    // Without the hold the header is already out: the caller is told in-band.
    let gw = Gateway::start(format!(
        "{}failover: {{ first_chunk_hold: 0 }}\n",
        config(&a, &b)
    ));
    let r = post_chat(&gw, &stream_body()).await;
    let (chunks, _) = read_chunks(r).await;
    let text = text_of(&chunks);
    assert!(text.contains("upstream_empty_stream"), "{text}");
    assert!(!text.contains("[DONE]"));
}
