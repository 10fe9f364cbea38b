//! The attempt engine's seams over sockets: a whole answer is held until its body is in (a
//! provider that dies after its `200` fails over, never a short 200); the half-open probe slot
//! is given back by a target passed over without a call; a plan with a candidate lacking a
//! credential still says when the others free up; attempt bounds follow a reload; a reused
//! connection that failed after the request was written moves on rather than re-sending it to
//! the same provider; same-target retries wait a jittered, doubling backoff; a 429 counts
//! half a failure and its `Retry-After` is capped; an error signalbox writes keeps the
//! connection it says it keeps.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Behaviour, MockHandle};

fn two(a: &MockHandle, b: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\n{extra}",
        provider("a", a),
        provider("b", b),
    )
}

async fn target_of(gw: &Gateway, provider: &str) -> Value {
    let h = admin_json(gw, "/admin/health").await;
    h["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == provider)
        .cloned()
        .unwrap()
}

/// Wait (with a deadline) until `provider`'s target is in `state`.
async fn wait_state(gw: &Gateway, provider: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = target_of(gw, provider).await;
        if t["state"] == state {
            return;
        }
        assert!(Instant::now() < deadline, "{provider} never {state}: {t}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_whole_answer_that_dies_after_its_header_fails_over() {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(two(&a, &b, "health: { failure_threshold: 100 }\n"));
    for behaviour in [
        // The header with the body's length, then a clean close before any body byte.
        Behaviour::OkThenEof,
        // The header and half the body, then a reset.
        Behaviour::MidStreamDeath { after_chunks: 0 },
    ] {
        a.push_script([behaviour.clone()]);
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(r.status(), 200, "{behaviour:?}");
        assert_eq!(header(&r, "x-llm-provider"), "b", "{behaviour:?}");
        assert_eq!(header(&r, "x-llm-attempts"), "2", "{behaviour:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["model"], "m", "a whole answer, b's: {behaviour:?}");
    }
    let line = r#"signalbox_attempts_total{provider="a",outcome="reset"} 2"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_probe_target_passed_over_without_a_call_gives_its_slot_back() {
    let (c, b) = (mock("c").await, mock("b").await);
    let gw = GatewayBuilder::new(format!(
        "providers:\n  c: {{ kind: anthropic, base_url: \"{}\", credentials: [{{ id: k, key_env: SB_TEST_C_KEY }}] }}\n{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: c, model: up-c, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\n\
         health: {{ failure_threshold: 1, cooldown: 200ms, bench_after: 0, probe_interval: 1h }}\n",
        c.base_url(),
        provider("b", &b),
    ))
    .env("SB_TEST_C_KEY", "sk-c")
    .start();
    // c fails once: ejected; its cooldown passes: half-open.
    c.push_script([status(500)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    wait_state(&gw, "c", "half_open").await;
    // c is this request's probe, but Anthropic's API cannot express `n: 2`: c is passed over
    // without a call, and its probe slot must be free again.
    let mut two_choices = chat("m");
    two_choices["n"] = json!(2);
    let r = post_chat(&gw, &two_choices).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(c.calls(), 1);
    assert_eq!(target_of(&gw, "c").await["state"], "half_open");
    // The next request probes c, which serves and is restored.
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(c.calls(), 2);
    wait_state(&gw, "c", "recovering").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_without_a_credential_does_not_hide_when_the_others_free_up() {
    let down = mock("down").await;
    down.set_default(status(500));
    let gw = Gateway::start(format!(
        "providers:\n  nokey: {{ kind: openai, base_url: \"http://127.0.0.1:{}/v1\", credentials: [{{ id: k, key_env: SIGNALBOX_TEST_UNSET_KEY }}] }}\n{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: nokey, model: x, priority: 1 }}, {{ provider: down, model: y, priority: 2 }}]\n\
         health: {{ failure_threshold: 1, cooldown: 30s, bench_after: 0 }}\n",
        refused_port(),
        provider("down", &down),
    ));
    // `down` fails and is ejected.
    let r = post_chat(&gw, &chat("m")).await;
    expect_error(r, 502, "upstream_error").await;
    // Now nothing can be called: `nokey` has no credential, but `down` comes back in 30 s —
    // the caller is told that (a 503 with Retry-After), not that nothing is configured.
    let r = post_chat(&gw, &chat("m")).await;
    let retry_after: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    expect_error(r, 503, "no_provider_available").await;
    assert_eq!(down.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn raising_max_attempts_by_reload_applies_to_the_fast_path() {
    let failing: Vec<MockHandle> =
        futures_util::future::join_all(["a1", "a2", "a3"].map(|n| async move {
            let m = mock(n).await;
            m.set_default(status(503));
            m
        }))
        .await;
    let ok = mock("ok").await;
    let config = |max: u32| {
        let mut providers = String::new();
        let mut deployments = Vec::new();
        for (i, m) in failing.iter().enumerate() {
            providers.push_str(&provider(m.name(), m));
            deployments.push(format!(
                "{{ provider: {}, model: up, priority: {} }}",
                m.name(),
                i + 1
            ));
        }
        providers.push_str(&provider("ok", &ok));
        deployments.push("{ provider: ok, model: up, priority: 9 }".into());
        format!(
            "providers:\n{providers}models:\n  m:\n    strategy: priority\n    deployments: [{}]\n\
             health: {{ failure_threshold: 1000, bench_after: 0 }}\n\
             failover: {{ max_attempts: {max}, first_chunk_hold: 0 }}\n",
            deployments.join(", ")
        )
    };
    let mut stream = chat("m");
    stream["stream"] = json!(true);
    let gw = Gateway::start(config(2));
    let r = post_chat(&gw, &stream).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    expect_error(r, 502, "upstream_error").await;
    // Raised by a reload (SIGHUP): the fast path now makes four calls.
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    std::fs::write(
        gw.config_path(),
        text.replace("max_attempts: 2,", "max_attempts: 4,"),
    )
    .unwrap();
    let g = gw.generation();
    gw.signal("HUP");
    gw.wait_generation(g + 1).await;
    let r = post_chat(&gw, &stream).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "ok");
    assert_eq!(header(&r, "x-llm-attempts"), "4");
    let log = gw.stderr();
    assert!(
        !log.contains("needs_upgrade=[\"failover\""),
        "attempt bounds need no restart: {log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_connection_that_fails_after_the_request_was_written_moves_on() {
    for stream in [false, true] {
        let (a, b) = (mock("a").await, mock("b").await);
        let gw = Gateway::start(two(
            &a,
            &b,
            "health: { failure_threshold: 100 }\nfailover: { first_chunk_hold: 0 }\n",
        ));
        let mut body = chat("m");
        body["stream"] = json!(stream);
        // A first answer leaves a's connection in the gateway's pool.
        let r = post_chat(&gw, &body).await;
        assert_eq!(header(&r, "x-llm-provider"), "a");
        let _ = r.text().await.unwrap();
        // a reads the next request, then resets: the request may have been billed, so it is
        // not sent to a again; b serves.
        a.set_default(Behaviour::Reset);
        let r = post_chat(&gw, &body).await;
        assert_eq!(header(&r, "x-llm-provider"), "b", "stream={stream}");
        assert_eq!(header(&r, "x-llm-attempts"), "2", "stream={stream}");
        assert_eq!(a.calls(), 2, "stream={stream}: a called once per request");
        assert_eq!(b.calls(), 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn same_target_retries_wait_a_jittered_doubling_backoff() {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\n\
         health: {{ failure_threshold: 100, bench_after: 0 }}\n\
         policies:\n  careful:\n    retry: {{ attempts: 3, backoff: 100ms, on_status: [503] }}\n    select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ]\n",
        provider("a", &a),
        provider("b", &b),
    ));
    a.push_script([status(503), status(503), status(503)]);
    let r = post_chat(&gw, &chat("careful")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "a", "{}", gw.stderr());
    // Three same-target retries, each an attempt: a's fourth call serves.
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "4");
    assert_eq!(b.calls(), 0);
    let times: Vec<Instant> = a.requests().iter().map(|r| r.received).collect();
    assert_eq!(times.len(), 4);
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // The n-th wait is uniform in [0, 100 ms × 2^n]; a call's own round trip adds a little.
    let slack = Duration::from_millis(150);
    for (n, gap) in gaps.iter().enumerate() {
        let ceiling = Duration::from_millis(100 << n) + slack;
        assert!(
            *gap <= ceiling,
            "wait {n}: {gap:?} over {ceiling:?} ({gaps:?})"
        );
    }
    let total: Duration = gaps.iter().sum();
    assert!(
        total >= Duration::from_millis(20),
        "the waits are real: {gaps:?}"
    );
    // A status the policy does not retry moves on at once.
    a.push_script([status(500)]);
    let r = post_chat(&gw, &chat("careful")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_429_counts_half_a_failure_and_its_retry_after_is_capped() {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(two(
        &a,
        &b,
        "health: { failure_threshold: 2, cooldown: 1ms, max_ejection: 2s, bench_after: 0, respect_retry_after: false }\n",
    ));
    let rate_limited = || Behaviour::Status {
        code: 429,
        retry_after: None,
        body: None,
    };
    for _ in 0..2 {
        a.push_script([rate_limited()]);
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(header(&r, "x-llm-provider"), "b");
        gw.wait_credentials_usable().await;
    }
    // Two 429s are one failure: not ejected.
    assert_eq!(target_of(&gw, "a").await["ejections_total"], 0);
    for _ in 0..2 {
        a.push_script([rate_limited()]);
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(header(&r, "x-llm-provider"), "b");
        gw.wait_credentials_usable().await;
    }
    // Four are two: ejected at the threshold.
    assert_eq!(target_of(&gw, "a").await["ejections_total"], 1);

    // Retry-After is honoured as the credential's cooldown, capped by max_ejection.
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(two(
        &a,
        &b,
        "health: { failure_threshold: 100, max_ejection: 2s, respect_retry_after: true }\n",
    ));
    a.push_script([Behaviour::Status {
        code: 429,
        retry_after: Some("600".into()),
        body: None,
    }]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let h = admin_json(&gw, "/admin/health").await;
    let cooling = h["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["provider"] == "a")
        .map(|c| c["cooling"]["in_ms"].as_u64().unwrap())
        .unwrap();
    assert!(cooling <= 2_000, "capped at max_ejection: {cooling} ms");
}

/// One HTTP/1.1 request on an open connection; the status and headers of its answer (the
/// body read by its `content-length`).
fn exchange(s: &mut std::net::TcpStream, body: &str) -> (u16, String) {
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head[9..12].parse().unwrap(), head.to_ascii_lowercase())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_signalbox_writes_keeps_the_connection_it_says_it_keeps() {
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(status(503));
    b.set_default(status(503));
    let mut stream = chat("m");
    stream["stream"] = json!(true);
    // Signalbox's own driver keeps the connection; after Pingora's proxy loop (a stream with
    // the hold off) Pingora closes it, and the answer says so.
    for (hold, body, kept) in [("15s", chat("m"), true), ("0", stream.clone(), false)] {
        let gw = Gateway::start(two(
            &a,
            &b,
            &format!(
                "health: {{ failure_threshold: 100 }}\nfailover: {{ first_chunk_hold: {hold} }}\n"
            ),
        ));
        let addr = gw.proxy;
        let text = body.to_string();
        let (status, head, second) = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (status, head) = exchange(&mut s, &text);
            // The same connection, as a pooled client (httpx) would use it.
            let second = kept.then(|| exchange(&mut s, &text).0);
            (status, head, second)
        })
        .await
        .unwrap();
        assert_eq!(status, 502, "hold {hold}");
        if kept {
            assert!(
                head.contains("connection: keep-alive"),
                "hold {hold}: {head}"
            );
            assert_eq!(
                second,
                Some(502),
                "hold {hold}: served on the same connection"
            );
        } else {
            assert!(head.contains("connection: close"), "hold {hold}: {head}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reloading_bench_after_benches_at_the_new_count() {
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(status(500));
    let gw = Gateway::start(two(
        &a,
        &b,
        "health: { failure_threshold: 100, bench_after: 0 }\n",
    ));
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    std::fs::write(
        gw.config_path(),
        text.replace("bench_after: 0 }", "bench_after: 3 }"),
    )
    .unwrap();
    let g = gw.generation();
    gw.signal("HUP");
    gw.wait_generation(g + 1).await;
    // Two failures: under the new count, a stays in the plan.
    for n in 1..=2 {
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(header(&r, "x-llm-provider"), "b");
        assert_eq!(a.calls(), n, "a is still called");
        assert_ne!(target_of(&gw, "a").await["state"], "benched", "after {n}");
    }
    // The third benches it.
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(target_of(&gw, "a").await["state"], "benched");
}
