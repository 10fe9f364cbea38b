//! Failover before the first byte: every trigger moves to the next candidate; a caller error
//! does not; budgets bound the walk.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use signalbox_mock::{Behaviour, MockHandle};

/// Breakers effectively off: these tests look at one request's failover, so what earlier
/// requests taught the health registry must not change the next plan (the health tests cover
/// that).
const NO_BREAKERS: &str =
    "health: { failure_threshold: 1000, bench_after: 64, cooldown: 1ms, respect_retry_after: false }\n";

/// Model `m` served by `a` first, then `b`. `a_extra` is added to a's provider entry.
fn config(a_url: &str, a_extra: &str, b: &MockHandle) -> String {
    format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{a_url}\", priority: 1 {a_extra} }}\n{}\
         models:\n  m:\n    deployments:\n      - {{ provider: a, model: up-a }}\n      - {{ provider: b, model: up-b }}\n{NO_BREAKERS}",
        provider("b", b).replace("}\n", ", priority: 2 }\n"),
    )
}

async fn assert_failed_over(gw: &Gateway, b: &MockHandle) {
    let r = post_chat(gw, &chat("m")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-routed-via"), "b/up-b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["model"], "m", "the caller's name comes back");
    assert_eq!(b.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_refused_fails_over() {
    let b = mock("b").await;
    let url = format!("http://127.0.0.1:{}/v1", refused_port());
    let gw = Gateway::start(config(&url, "", &b));
    assert_failed_over(&gw, &b).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_timeout_fails_over() {
    let b = mock("b").await;
    let hole = Blackhole::new();
    let url = format!("http://{}/v1", hole.addr);
    let gw = Gateway::start(config(&url, ", connect_timeout: 300ms", &b));
    let started = Instant::now();
    assert_failed_over(&gw, &b).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "the connect timeout was waited for: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_and_close_before_header_fail_over() {
    for behaviour in [Behaviour::Reset, Behaviour::Close] {
        let a = mock("a").await;
        let b = mock("b").await;
        a.set_default(behaviour.clone());
        let gw = Gateway::start(config(&a.base_url(), "", &b));
        assert_failed_over(&gw, &b).await;
        assert_eq!(a.calls(), 1, "{behaviour:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ttfb_timeout_fails_over() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(Behaviour::Hang);
    let gw = Gateway::start(config(&a.base_url(), ", ttfb_timeout: 400ms", &b));
    let started = Instant::now();
    assert_failed_over(&gw, &b).await;
    assert!(started.elapsed() >= Duration::from_millis(350));
    assert_eq!(a.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_statuses() {
    for code in [500, 502, 503, 504, 529, 429, 408, 401, 403, 404] {
        // A fresh gateway per status: 401/403/429 cool the credential, which is health's
        // business (tests/health.rs), not this test's.
        let a = mock("a").await;
        let b = mock("b").await;
        let gw = Gateway::start(config(&a.base_url(), "", &b));
        a.set_default(status(code));
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(r.status(), 200, "status {code} should fail over");
        assert_eq!(header(&r, "x-llm-provider"), "b", "{code}");
        assert_eq!(header(&r, "x-llm-attempts"), "2", "{code}");
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("mock failure"),
            "{code}: upstream text leaked: {body}"
        );
        assert_eq!((a.calls(), b.calls()), (1, 1), "{code}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn caller_error_is_relayed_not_retried() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(status(400));
    let gw = Gateway::start(config(&a.base_url(), "", &b));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    let v = expect_error(r, 400, "all_candidates_rejected").await;
    assert!(
        !v.to_string().contains("mock failure"),
        "upstream text leaked: {v}"
    );
    assert_eq!(b.calls(), 0);

    // A context-length refusal keeps a recognisable code.
    a.set_default(Behaviour::Status {
        code: 400,
        retry_after: None,
        body: Some(r#"{"error":{"message":"maximum context length is 10","code":"context_length_exceeded"}}"#.into()),
    });
    let r = post_chat(&gw, &chat("m")).await;
    expect_error(r, 400, "context_length_exceeded").await;
    assert_eq!(b.calls(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn exhausted_plans_answer_in_signalboxs_words() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(config(&a.base_url(), "", &b));

    a.set_default(status(503));
    b.set_default(status(500));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let v = expect_error(r, 502, "upstream_error").await;
    assert!(!v.to_string().contains("mock"), "{v}");

    a.set_default(Behaviour::Status {
        code: 429,
        retry_after: Some("7".into()),
        body: None,
    });
    b.set_default(Behaviour::Status {
        code: 429,
        retry_after: Some("3".into()),
        body: None,
    });
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "retry-after"), "3");
    expect_error(r, 429, "rate_limited").await;

    a.set_default(status(401));
    b.set_default(status(403));
    gw.wait_credentials_usable().await;
    expect_error(
        post_chat(&gw, &chat("m")).await,
        424,
        "provider_credential_rejected",
    )
    .await;

    a.set_default(status(404));
    b.set_default(status(404));
    gw.wait_credentials_usable().await;
    expect_error(
        post_chat(&gw, &chat("m")).await,
        502,
        "upstream_model_not_found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_attempts_bounds_the_walk() {
    let mocks = [mock("a").await, mock("b").await, mock("c").await];
    for m in &mocks {
        m.set_default(status(503));
    }
    let text = format!(
        "providers:\n{}{}{}models:\n  m:\n    deployments: [{{ provider: a, model: x, priority: 1 }}, {{ provider: b, model: x, priority: 2 }}, {{ provider: c, model: x, priority: 3 }}]\nfailover: {{ max_attempts: 2 }}\n",
        provider("a", &mocks[0]),
        provider("b", &mocks[1]),
        provider("c", &mocks[2]),
    );
    let gw = Gateway::start(text);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    expect_error(r, 502, "upstream_error").await;
    assert_eq!(
        mocks.iter().map(MockHandle::calls).collect::<Vec<_>>(),
        [1, 1, 0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_stops_new_attempts_but_the_first_retry_always_runs() {
    let mocks = [mock("a").await, mock("b").await, mock("c").await];
    mocks[0].set_default(Behaviour::Hang);
    mocks[1].set_default(status(503));
    let text = format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", ttfb_timeout: 400ms }}\n{}{}models:\n  m:\n    deployments: [{{ provider: a, model: x, priority: 1 }}, {{ provider: b, model: x, priority: 2 }}, {{ provider: c, model: x, priority: 3 }}]\nfailover: {{ deadline: 200ms }}\n",
        mocks[0].base_url(),
        provider("b", &mocks[1]),
        provider("c", &mocks[2]),
    );
    let gw = Gateway::start(text);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(r.status(), 502);
    assert_eq!(
        mocks.iter().map(MockHandle::calls).collect::<Vec<_>>(),
        [1, 1, 0],
        "the first retry runs past the deadline; nothing after it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn credential_failures_try_the_next_key_first() {
    let a = mock("a").await;
    let b = mock("b").await;
    // Provider a has two keys; the first answer is a 401, whichever key it used.
    a.push_script([status(401)]);
    let text = format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", priority: 1, credentials: [{{ id: k1, key_env: TEST_K1 }}, {{ id: k2, key_env: TEST_K2 }}] }}\n{}models:\n  m:\n    deployments: [{{ provider: a, model: x }}, {{ provider: b, model: y }}]\n",
        a.base_url(),
        provider("b", &b).replace("}\n", ", priority: 2 }\n"),
    );
    let gw = GatewayBuilder::new(text)
        .env("TEST_K1", "key-one")
        .env("TEST_K2", "key-two")
        .start();
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(
        header(&r, "x-llm-fallback"),
        "false",
        "same deployment, other key"
    );
    let auths: Vec<String> = a
        .requests()
        .iter()
        .map(|r| r.header("authorization").unwrap_or("").to_string())
        .collect();
    assert_eq!(auths.len(), 2);
    assert_ne!(auths[0], auths[1], "the second attempt used the other key");
    assert_eq!(b.calls(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn unusable_candidates_fail_fast_without_calls() {
    let a = mock("a").await;
    let text = format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", credentials: [{{ id: k, key_env: SIGNALBOX_TEST_UNSET_KEY }}] }}\n  off: {{ kind: openai, base_url: \"{}\", enabled: false }}\nmodels:\n  keyless: {{ deployments: [{{ provider: a, model: x }}] }}\n  disabled: {{ deployments: [{{ provider: off, model: x }}] }}\n",
        a.base_url(),
        a.base_url(),
    );
    let gw = Gateway::start(text);
    let r = post_chat(&gw, &chat("keyless")).await;
    expect_error(r, 424, "provider_not_configured").await;
    let r = post_chat(&gw, &chat("disabled")).await;
    expect_error(r, 503, "no_provider_available").await;
    assert_eq!(a.calls(), 0);
}

/// `failover.transient_retries`: a reset or a 5xx calls the same target again (each call an
/// attempt, none a failover); a refused connect or a credential refusal moves on at once; the
/// budget is per target.
#[tokio::test(flavor = "multi_thread")]
async fn transient_retries_call_the_same_target_again() {
    let with_retries = |conf: String| conf + "failover: { transient_retries: 2 }\n";

    // One reset, then an answer: served by `a` on its second call.
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(with_retries(config(&a.base_url(), "", &b)));
    a.push_script([Behaviour::Reset]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(
        header(&r, "x-llm-fallback"),
        "false",
        "a retry is not a fallback"
    );
    assert_eq!((a.calls(), b.calls()), (2, 0));
    // The request is counted in `logging`, after the response went out: wait for its attempts
    // (recorded together with any failover) before reading what it counted.
    let metrics = gw
        .metrics_with(&[
            r#"signalbox_attempts_total{provider="a",outcome="reset"} 1"#,
            r#"signalbox_attempts_total{provider="a",outcome="ok"} 1"#,
        ])
        .await;
    assert!(
        metrics.contains(r#"signalbox_attempts_total{provider="a",outcome="ok"} 1"#),
        "the request was never counted:\n{metrics}"
    );
    let failovers_from_a: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("signalbox_failovers_total{provider=\"a\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        failovers_from_a, 0.0,
        "a same-target retry is not a failover:\n{metrics}"
    );

    // 503 three times: the first call and two retries on `a`, then `b`.
    a.set_default(status(503));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "4");
    assert_eq!((a.calls(), b.calls()), (5, 1));

    // A credential refusal is not transient: straight to `b`.
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(with_retries(config(&a.base_url(), "", &b)));
    a.set_default(status(401));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!((a.calls(), b.calls()), (1, 1));

    // A breaker that ejects on the first failure wins over the retry budget.
    let a = mock("a").await;
    let b = mock("b").await;
    let ejecting = config(&a.base_url(), "", &b).replace(
        NO_BREAKERS,
        "health: { failure_threshold: 1, respect_retry_after: false }\n",
    );
    let gw = Gateway::start(with_retries(ejecting));
    a.set_default(status(503));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!((a.calls(), b.calls()), (1, 1));

    // Nothing listening: no point calling again.
    let b = mock("b").await;
    let url = format!("http://127.0.0.1:{}/v1", refused_port());
    let gw = Gateway::start(with_retries(config(&url, "", &b)));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_and_embeddings_fail_over_through_the_gateway() {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(format!(
        "providers:\n{}{}models:\n  m: {{ deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}] }}\nhealth: {{ failure_threshold: 0 }}\n",
        provider("a", &a),
        provider("b", &b),
    ));
    for (path, body) in [
        (
            "/v1/responses",
            serde_json::json!({"model": "m", "input": "hi"}),
        ),
        (
            "/v1/embeddings",
            serde_json::json!({"model": "m", "input": "hi"}),
        ),
    ] {
        a.push_script([status(502)]);
        let r = client()
            .post(gw.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}: {}", gw.stderr());
        assert_eq!(
            (header(&r, "x-llm-provider"), header(&r, "x-llm-attempts")),
            ("b", "2"),
            "{path}"
        );
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["model"], "m", "{path}: {v}");
        assert_eq!(v["provider"], "b", "{path}: {v}");
        let seen = b.requests().pop().unwrap();
        assert!(seen.path.ends_with(&path[3..]), "{path}: {}", seen.path);
        assert_eq!(seen.model.as_deref(), Some("up-b"), "{path}");
    }
    assert_eq!(a.calls(), 2);
}
