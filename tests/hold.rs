//! The first-chunk hold over real sockets: a stream's header waits for its first content, so a
//! stream that fails before its first token fails over with the caller receiving only the
//! good stream; the hold is a time-to-first-token deadline; after the commit a stall ends the
//! stream with an error event (`stream_aborted`).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use signalbox_mock::{Behaviour, MockHandle, StreamShape};

fn two(a: &MockHandle, b: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\n{extra}",
        provider("a", a),
        provider("b", b),
    )
}

fn stream_body() -> serde_json::Value {
    serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

/// A good stream from b: every event a normal answer has, and the terminator.
fn assert_good_stream_from_b(text: &str) {
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "only the good stream: {text}");
    assert!(text.contains("\"model\":\"m\""), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_fails_before_its_first_token_fails_over() {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(two(&a, &b, ""));
    // Each way a stream can fail after its 200 and before any content.
    for (case, behaviour, outcome) in [
        ("empty stream", Behaviour::EmptyStream, "empty"),
        ("no choices", Behaviour::EmptyChoices, "empty"),
        (
            "dies before content",
            Behaviour::MidStreamDeath { after_chunks: 0 },
            "reset",
        ),
    ] {
        a.push_script([behaviour]);
        let r = post_chat(&gw, &stream_body()).await;
        assert_eq!(r.status(), 200, "{case}");
        assert_eq!(header(&r, "x-llm-provider"), "b", "{case}");
        assert_eq!(header(&r, "x-llm-attempts"), "2", "{case}");
        assert_eq!(header(&r, "x-llm-fallback"), "true", "{case}");
        let (text, broken) = read_all(r).await;
        assert!(!broken, "{case}");
        assert_good_stream_from_b(&text);
        let line = format!(r#"signalbox_attempts_total{{provider="a",outcome="{outcome}"}}"#);
        let m = gw.metrics_with(&[&line]).await;
        assert!(m.contains(&line), "{case}: {m}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hold_is_a_time_to_first_token_deadline() {
    let a = mock_with("a", |c| {
        c.stream = StreamShape {
            chunks: 3,
            gap: Duration::ZERO,
        }
    })
    .await;
    let b = mock("b").await;
    // a answers nothing for far longer than the hold (its TTFB timeout is 30 s).
    a.push_script([Behaviour::SlowHeader { ms: 5_000 }]);
    let gw = Gateway::start(two(&a, &b, "failover: { first_chunk_hold: 300ms }\n"));
    let started = Instant::now();
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let (text, _) = read_all(r).await;
    assert_good_stream_from_b(&text);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "moved on at the hold, not at a's answer: {:?}",
        started.elapsed()
    );
    let line = r#"signalbox_attempts_total{provider="a",outcome="first_chunk_timeout"} 1"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

/// Providers a, b and c in that order.
fn three(a: &MockHandle, b: &MockHandle, c: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}{}{}models:\n  m:\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}, {{ provider: c, model: up-c, priority: 3 }}]\n{extra}",
        provider("a", a),
        provider("b", b),
        provider("c", c),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_retry_runs_whatever_the_deadline() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    a.set_default(Behaviour::Hang);
    let gw = Gateway::start(three(
        &a,
        &b,
        &c,
        "failover: { first_chunk_hold: 300ms, deadline: 100ms }\n",
    ));
    // a holds past the deadline; b, the first retry, still runs and serves.
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let (text, _) = read_all(r).await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(c.calls(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_attempt_after_the_first_retry_starts_past_the_deadline() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    a.set_default(Behaviour::Hang);
    b.set_default(Behaviour::Hang);
    let gw = Gateway::start(three(
        &a,
        &b,
        &c,
        "failover: { first_chunk_hold: 300ms, deadline: 100ms }\n",
    ));
    let started = Instant::now();
    let r = post_chat(&gw, &stream_body()).await;
    // Each attempt waited out its own hold; the third would start after the deadline.
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    expect_error(r, 504, "upstream_timeout").await;
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stall_after_the_first_token_ends_the_stream_with_an_error_event() {
    let a = mock_with("a", |c| {
        c.stream = StreamShape {
            chunks: 3,
            gap: Duration::from_millis(1_500),
        }
    })
    .await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, "failover: { stream_idle_timeout: 300ms }\n"));
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let (text, _) = read_all(r).await;
    assert!(text.contains("upstream_stream_stalled"), "{text}");
    assert!(!text.contains("[DONE]"), "never a clean end: {text}");
    assert_eq!(b.calls(), 0, "no attempt after the first byte");
    let line = r#"signalbox_attempts_total{provider="a",outcome="stream_aborted"} 1"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_flow_through_the_hold_chunk_by_chunk() {
    let a = mock_with("a", |c| {
        c.stream = StreamShape {
            chunks: 5,
            gap: Duration::from_millis(200),
        }
    })
    .await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, ""));
    let mut r = post_chat(&gw, &stream_body()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    // Chunks arrive as the provider sends them, not at the end.
    let mut arrivals = Vec::new();
    let mut text = String::new();
    while let Some(c) = r.chunk().await.unwrap() {
        arrivals.push(Instant::now());
        text.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let spread = *arrivals.last().unwrap() - arrivals[0];
    assert!(
        arrivals.len() >= 4 && spread >= Duration::from_millis(600),
        "{} chunks over {spread:?}",
        arrivals.len()
    );
    // One access line, its attempt and its outcome.
    let log = gw.stderr_with("tried=a/up-a").await;
    assert!(
        log.contains("tried=a/up-a:main:ok") || log.contains("tried=a/up-a:"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_error_event_after_content_is_an_aborted_stream() {
    let a = mock("a").await;
    a.set_default(Behaviour::InbandErrorAfter {
        chunks: 2,
        error_type: None,
    });
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, ""));
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let (text, _) = read_all(r).await;
    assert!(
        text.contains("\"error\""),
        "the provider's error reaches the caller: {text}"
    );
    assert!(!text.contains("[DONE]"), "never a clean end: {text}");
    assert_eq!(b.calls(), 0, "no attempt after the first byte");
    let line = r#"signalbox_attempts_total{provider="a",outcome="stream_aborted"} 1"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_hanging_up_mid_stream_never_count_against_the_provider() {
    let a = mock_with("a", |c| {
        c.stream = StreamShape {
            chunks: 8,
            gap: Duration::from_millis(300),
        }
    })
    .await;
    let b = mock("b").await;
    // A hair-trigger breaker: one failure would eject `a`.
    let gw = Gateway::start(two(&a, &b, "health: { failure_threshold: 1 }\n"));
    for _ in 0..4 {
        let mut r = post_chat(&gw, &stream_body()).await;
        assert_eq!(header(&r, "x-llm-provider"), "a");
        // The first content arrived (the header is out), then the caller goes away.
        let first = r.chunk().await.expect("a chunk").expect("not the end");
        assert!(!first.is_empty());
        drop(r);
    }
    let line = r#"signalbox_attempts_total{provider="a",outcome="cancelled"} 4"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
    assert!(
        !m.contains(r#"outcome="stream_aborted""#),
        "a caller's hang-up is not the provider's failure: {m}"
    );
    // `a` is still healthy and still serves.
    let r = post_chat(&gw, &stream_body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(b.calls(), 0);
}
