//! Limits of deployments, providers and the whole gateway over sockets: a candidate over its
//! budget is skipped without a call (`over_budget`) and the next one serves; when every
//! candidate is over, `429 budget_exceeded` with `Retry-After` at the period's end; a provider
//! whose rate-limit headers say a key's window is exhausted is routed around before its 429.
//!
//! Prices here are $1 a token, so one answer of the mock (its prompt is the body's bytes / 4,
//! about 20 tokens, plus 3 completion tokens) spends a $20 budget, while the estimate before the
//! first call (the prompt estimate plus `max_tokens: 1`) stays under it.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};

const PRICE: &str = "price: { input_per_mtok: 1000000, output_per_mtok: 1000000 }";

fn body() -> Value {
    json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "Say hello."}]})
}

fn two(
    a: &signalbox_mock::MockHandle,
    b: &signalbox_mock::MockHandle,
    a_extra: &str,
    extra: &str,
) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1, {PRICE}{a_extra} }}, {{ provider: b, model: up-b, priority: 2, {PRICE} }}]\n{extra}",
        provider("a", a),
        provider("b", b)
    )
}

async fn code_of(r: reqwest::Response) -> (u16, String, Option<u64>) {
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let v: Value = r.json().await.unwrap();
    (
        status,
        v["error"]["code"].as_str().unwrap_or_default().to_string(),
        retry,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_over_its_budget_spills_to_the_next() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, ", budget: { usd: 20, period: day }", ""));
    let r = post_chat(&gw, &body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let r = post_chat(&gw, &body()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "b", "a is over its budget");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    assert_eq!(a.calls(), 1, "skipped without a call");
    let line = r#"signalbox_skipped_candidates_total{reason="over_budget"} 1"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn when_every_candidate_is_over_the_caller_learns_when_budgets_reset() {
    let a = mock("a").await;
    let b = mock("b").await;
    // Both deployments live on provider a's budget... and b's: each provider has one.
    let budgets = "budgets:\n  providers:\n    a: { usd: 20, period: day }\n    b: { usd: 20, period: week }\n";
    let gw = Gateway::start(two(&a, &b, "", budgets));
    assert_eq!(
        header(&post_chat(&gw, &body()).await, "x-llm-provider"),
        "a"
    );
    assert_eq!(
        header(&post_chat(&gw, &body()).await, "x-llm-provider"),
        "b"
    );
    let (status, code, retry) = code_of(post_chat(&gw, &body()).await).await;
    assert_eq!((status, code.as_str()), (429, "budget_exceeded"));
    let retry = retry.expect("Retry-After");
    assert!(
        (1..=86_400).contains(&retry),
        "the soonest reset, a's day: {retry}"
    );
    assert_eq!((a.calls(), b.calls()), (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateways_own_budget_stops_everything() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two(
        &a,
        &b,
        "",
        "budgets:\n  global: { usd: 20, period: month }\n",
    ));
    assert_eq!(post_chat(&gw, &body()).await.status(), 200);
    let (status, code, retry) = code_of(post_chat(&gw, &body()).await).await;
    assert_eq!((status, code.as_str()), (429, "budget_exceeded"));
    assert!(retry.is_some_and(|r| (1..=31 * 86_400).contains(&r)));
    assert_eq!(a.calls() + b.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn spend_survives_a_reload() {
    let a = mock("a").await;
    let b = mock("b").await;
    let conf = two(&a, &b, ", budget: { usd: 20, period: day }", "admin: {}\n");
    let gw = Gateway::start(conf);
    assert_eq!(
        header(&post_chat(&gw, &body()).await, "x-llm-provider"),
        "a"
    );
    gw.signal("HUP");
    gw.wait_generation(2).await;
    assert_eq!(
        header(&post_chat(&gw, &body()).await, "x-llm-provider"),
        "b",
        "the reloaded deployment still remembers its spend"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_saying_a_key_is_exhausted_is_routed_around_before_its_429() {
    let a = mock_with("a", |c| {
        c.response_headers = vec![
            ("x-ratelimit-remaining-requests".into(), "0".into()),
            ("x-ratelimit-reset-requests".into(), "30s".into()),
        ];
    })
    .await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, "", ""));
    // a answers, and says this key has no requests left for 30 s.
    assert_eq!(
        header(&post_chat(&gw, &body()).await, "x-llm-provider"),
        "a"
    );
    for _ in 0..3 {
        let r = post_chat(&gw, &body()).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-llm-provider"), "b", "a's key is resting");
    }
    assert_eq!(a.calls(), 1, "no call that would have earned a 429");
    let line = r#"signalbox_skipped_candidates_total{reason="credential_cooling"} 3"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
    assert!(
        !m.contains(r#"outcome="rate_limited""#),
        "not counted as a failure: {m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_whose_token_minute_is_full_spills_to_the_next() {
    let a = mock("a").await;
    let b = mock("b").await;
    // Each answer reports 23 tokens (the mock's prompt is the body's bytes / 4, about 20, plus
    // 3); each request is estimated at 4 (the text "Say hello." and `max_tokens: 1`): after two
    // answers a's 49-token minute holds 46, and the third would pass it.
    let gw = Gateway::start(two(&a, &b, ", tpm: 49", ""));
    for _ in 0..2 {
        assert_eq!(
            header(&post_chat(&gw, &body()).await, "x-llm-provider"),
            "a"
        );
    }
    // The window settles to what an answer used once the request is logged (just after the
    // caller has it): wait for both before the third.
    gw.metrics_with(&[
        r#"signalbox_requests_total{route="model:m",provider="a",status_class="2xx"} 2"#,
    ])
    .await;
    let r = post_chat(&gw, &body()).await;
    assert_eq!(header(&r, "x-llm-provider"), "b", "a's minute is full");
    assert_eq!(a.calls(), 2);
    let line = r#"signalbox_skipped_candidates_total{reason="tpm_full"} 1"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn when_every_token_minute_is_full_the_caller_is_told_when_it_frees() {
    let a = mock("a").await;
    let conf = format!(
        "providers:\n{}models:\n  m:\n    deployments: [{{ provider: a, model: up-a, tpm: 26 }}]\n",
        provider("a", &a)
    );
    let gw = Gateway::start(conf);
    assert_eq!(post_chat(&gw, &body()).await.status(), 200);
    let (status, code, retry) = code_of(post_chat(&gw, &body()).await).await;
    assert_eq!((status, code.as_str()), (429, "rate_limited"));
    assert!(retry.is_some_and(|s| (1..=60).contains(&s)), "{retry:?}");
    assert_eq!(a.calls(), 1);
}
