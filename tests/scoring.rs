//! Seed 000's scoring settings and credential choice over real sockets: the headroom and
//! rate-limit multipliers follow `scoring`, and `least_remaining_quota` spends one key's
//! quota (as the provider's own `x-ratelimit-remaining-*` headers report it) before the next.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use signalbox_mock::{Behaviour, MockHandle};

/// Two models on two mocks, `big` (capability 5, on a) before `small` (capability 3, on b), in
/// a chain; a request asking for `custom` is ranked by capability alone, so only the
/// multipliers can put `small` first. `big_extra` goes into a's deployment.
fn two_models(a: &MockHandle, b: &MockHandle, big_extra: &str, scoring: &str) -> String {
    format!(
        "providers:\n{}{}models:\n  big: {{ capability: 5, deployments: [{{ provider: a, model: up-a{big_extra} }}] }}\n  small: {{ capability: 3, deployments: [{{ provider: b, model: up-b }}] }}\nchains: {{ main: [big, small] }}\nrouting: {{ custom_weights: {{ reliability: 0, speed: 0, capability: 1 }} }}\nhealth: {{ failure_threshold: 0 }}\n{scoring}",
        provider("a", a),
        provider("b", b),
    )
}

/// A request for the chain, ranked by the `custom` blend for itself.
fn custom() -> serde_json::Value {
    let mut body = chat("auto:main");
    body["routing"] = serde_json::json!({"strategy": "custom"});
    body
}

/// Where the custom-ranked chain puts its candidates now (explain lists them in ranked
/// order, whatever exploration would lead with).
async fn ranked(gw: &Gateway) -> Vec<String> {
    let v = admin_post_json(gw, "/admin/explain", &custom()).await;
    v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["candidate"].as_str().unwrap().to_string())
        .collect()
}

/// How many requests `big`'s deployment takes (asked for by name: each one in its window)
/// before its headroom factor ranks it behind `small`.
async fn taken_by_big_before_small_leads(gw: &Gateway) -> usize {
    for n in 0..10 {
        if ranked(gw).await[0] == "b/up-b" {
            return n;
        }
        let r = post_chat(gw, &chat("big")).await;
        assert_eq!(
            (r.status().as_u16(), header(&r, "x-llm-provider")),
            (200, "a")
        );
    }
    panic!("big still leads with its window full");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_headroom_threshold_and_floor_are_the_operators() {
    // big: 10 requests a minute. By default its factor is 1 up to 80 % and 0.1 at 100 %:
    // after 9 requests (0.55 × 1) it falls behind small (0.6).
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(two_models(&a, &b, ", rpm: 10", ""));
    assert_eq!(ranked(&gw).await, ["a/up-a", "b/up-b"]);
    assert_eq!(taken_by_big_before_small_leads(&gw).await, 9);
    // Held back from 20 % down to 0 at 100 %: after 6 requests (0.5) it already has.
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = Gateway::start(two_models(
        &a,
        &b,
        ", rpm: 10",
        "scoring: { headroom_threshold: 0.2, headroom_floor: 0 }\n",
    ));
    assert_eq!(taken_by_big_before_small_leads(&gw).await, 6);
}

/// After one 429 on big's key, how the chain ranks once the key may be used again.
async fn ranked_after_a_429(scoring: &str) -> Vec<String> {
    let (a, b) = (mock("a").await, mock("b").await);
    a.push_script([Behaviour::Status {
        code: 429,
        retry_after: Some("0".into()),
        body: None,
    }]);
    let gw = Gateway::start(two_models(&a, &b, "", scoring));
    assert_eq!(ranked(&gw).await, ["a/up-a", "b/up-b"]);
    let r = post_chat(&gw, &chat("big")).await;
    assert_ne!(r.status(), 200);
    assert_eq!(a.calls(), 1);
    gw.wait_credentials_usable().await;
    ranked(&gw).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rate_limit_penalty_and_its_decay_are_the_operators() {
    // By default a 429 halves big's score (1 → 0.5, behind small's 0.6) for a minute.
    assert_eq!(ranked_after_a_429("").await, ["b/up-b", "a/up-a"]);
    // A light penalty keeps it ahead (0.9), and a zero decay means no penalty at all.
    assert_eq!(
        ranked_after_a_429("scoring: { rate_limit_penalty: 0.1 }\n").await,
        ["a/up-a", "b/up-b"]
    );
    assert_eq!(
        ranked_after_a_429("scoring: { rate_limit_decay: 0s }\n").await,
        ["a/up-a", "b/up-b"]
    );
}

/// One provider on `m` with three keys (`k1`..`k3`: quotas 10, 3 and 6 at the mock), chosen
/// by `choice`.
async fn three_keys(choice: &str) -> (MockHandle, Gateway) {
    let m = mock_with("q", |c| {
        c.key_quotas = vec![
            ("key-one".into(), 10),
            ("key-two".into(), 3),
            ("key-three".into(), 6),
        ];
    })
    .await;
    let config = format!(
        "providers:\n  q: {{ kind: openai, base_url: \"{}\", credential_choice: {choice}, credentials: [{{ id: k1, key_env: SB_Q_K1 }}, {{ id: k2, key_env: SB_Q_K2 }}, {{ id: k3, key_env: SB_Q_K3 }}] }}\nmodels:\n  m: {{ deployments: [{{ provider: q, model: up-q }}] }}\nhealth: {{ failure_threshold: 0 }}\n",
        m.base_url()
    );
    let gw = GatewayBuilder::new(config)
        .env("SB_Q_K1", "key-one")
        .env("SB_Q_K2", "key-two")
        .env("SB_Q_K3", "key-three")
        .start();
    (m, gw)
}

/// The key each call to the mock presented, in order.
fn keys_used(m: &MockHandle) -> Vec<String> {
    m.requests()
        .iter()
        .map(|r| {
            r.header("authorization")
                .unwrap_or_default()
                .trim_start_matches("Bearer ")
                .to_string()
        })
        .collect()
}

/// Consecutive runs: `(key, how many in a row)`.
fn runs(keys: &[String]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for k in keys {
        match out.last_mut() {
            Some((last, n)) if last == k => *n += 1,
            _ => out.push((k.clone(), 1)),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn least_remaining_quota_spends_one_key_before_the_next() {
    let (m, gw) = three_keys("least_remaining_quota").await;
    for i in 0..19 {
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(
            header(&r, "x-llm-attempts"),
            "1",
            "request {i}: no 429 on the way"
        );
    }
    // k1 drains first (it answered first, and each answer said it had the least left), then
    // when it reports 0 it rests and one of the others, untouched so far, drains in turn.
    let used = runs(&keys_used(&m));
    assert_eq!(used[0], ("key-one".to_string(), 10), "{used:?}");
    let rest: Vec<(String, usize)> = used[1..].to_vec();
    assert!(
        rest == [("key-two".into(), 3), ("key-three".into(), 6)]
            || rest == [("key-three".into(), 6), ("key-two".into(), 3)],
        "{used:?}"
    );
    // Every quota used to its end, and never past it: the provider never had to say 429.
    assert!(
        m.requests()
            .iter()
            .all(|r| !matches!(r.behaviour, Behaviour::Status { code: 429, .. })),
        "a call past its key's quota"
    );
    // With every key at 0 the next request is refused by signalbox, without a call.
    let r = post_chat(&gw, &chat("m")).await;
    assert_ne!(r.status(), 200);
    assert_eq!(m.calls(), 19);
}

#[tokio::test(flavor = "multi_thread")]
async fn round_robin_stays_the_default_and_spreads_the_keys() {
    let (m, gw) = three_keys("round_robin").await;
    for _ in 0..6 {
        assert_eq!(post_chat(&gw, &chat("m")).await.status(), 200);
    }
    let used = keys_used(&m);
    for k in ["key-one", "key-two", "key-three"] {
        assert_eq!(used.iter().filter(|u| *u == k).count(), 2, "{used:?}");
    }
}
