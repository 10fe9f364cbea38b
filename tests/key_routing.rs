//! A client key's own routing over sockets (`keys[].routing`, seed 002's organisation policy
//! per key): its provider order and strategy decide unless the request's `routing` says
//! otherwise, field by field; its excluded providers are never called, whatever the request
//! names; its `max_attempts` lowers the route's bound, never raises it; explain as the key
//! shows all of it.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use signalbox_mock::MockHandle;

/// One client key per routing under test, each the key string `sk-<id>`.
const KEYS: &[(&str, &str)] = &[
    ("plain", ""),
    ("ordered", "routing: { provider_order: [c, b] }"),
    ("cheap", "routing: { strategy: cheapest }"),
    ("fenced", "routing: { exclude_providers: [a, b] }"),
    ("single", "routing: { max_attempts: 1 }"),
    ("generous", "routing: { max_attempts: 10 }"),
];

/// Model `m` on `a` (priority 1, the priciest), `b` (priority 2, the cheapest) and `c`
/// (priority 3): by its default `priority_cheapest`, a then b then c. Policy `two` serves `m`
/// with at most two attempts. Breakers off: these tests look at single requests.
fn config(a: &MockHandle, b: &MockHandle, c: &MockHandle) -> String {
    let keys: String = KEYS
        .iter()
        .map(|(id, routing)| {
            let digest = hex::encode(Sha256::digest(format!("sk-{id}").as_bytes()));
            let sep = if routing.is_empty() { "" } else { ", " };
            format!("  - {{ id: {id}, key_sha256: \"{digest}\"{sep}{routing} }}\n")
        })
        .collect();
    format!(
        "providers:\n{}{}{}models:\n  m:\n    deployments:\n      - {{ provider: a, model: up-a, priority: 1, price: {{ input_per_mtok: 5.0, output_per_mtok: 15.0 }} }}\n      - {{ provider: b, model: up-b, priority: 2, price: {{ input_per_mtok: 0.1, output_per_mtok: 0.4 }} }}\n      - {{ provider: c, model: up-c, priority: 3, price: {{ input_per_mtok: 1.0, output_per_mtok: 2.0 }} }}\n\
         policies:\n  two: {{ select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ], max_attempts: 2 }}\n\
         health: {{ failure_threshold: 0, respect_retry_after: false }}\nkeys:\n{keys}",
        provider("a", a),
        provider("b", b),
        provider("c", c),
    )
}

async fn mocks() -> (MockHandle, MockHandle, MockHandle) {
    (mock("a").await, mock("b").await, mock("c").await)
}

/// A chat request for `m` as key `id`, with `routing` in the body when given.
async fn send(gw: &Gateway, id: &str, model: &str, routing: Option<Value>) -> reqwest::Response {
    let mut body = chat(model);
    if let Some(r) = routing {
        body["routing"] = r;
    }
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{id}"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Who served a request as key `id` (`x-llm-provider`), after a 200.
async fn served_by(gw: &Gateway, id: &str, routing: Option<Value>) -> String {
    let r = send(gw, id, "m", routing.clone()).await;
    let provider = header(&r, "x-llm-provider").to_string();
    assert_eq!(
        r.status(),
        200,
        "{id} {routing:?}: {}",
        r.text().await.unwrap()
    );
    provider
}

fn calls(a: &MockHandle, b: &MockHandle, c: &MockHandle) -> (u64, u64, u64) {
    (a.calls(), b.calls(), c.calls())
}

async fn explain(gw: &Gateway, id: &str, routing: Option<Value>) -> Value {
    let mut body = chat("m");
    if let Some(r) = routing {
        body["routing"] = r;
    }
    admin_post_json(gw, &format!("/admin/explain?key={id}"), &body).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keys_order_and_strategy_decide_unless_the_request_says_otherwise() {
    let (a, b, c) = mocks().await;
    let gw = Gateway::start(config(&a, &b, &c));
    assert_eq!(
        served_by(&gw, "plain", None).await,
        "a",
        "the route's order"
    );
    // The key's provider order: c first, though last by priority; nothing else called.
    let r = send(&gw, "ordered", "m", None).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(header(&r, "x-llm-fallback"), "false");
    assert!(
        header(&r, "x-llm-routing-reason").ends_with("fallbacks=b,a"),
        "{}",
        header(&r, "x-llm-routing-reason")
    );
    assert_eq!(calls(&a, &b, &c), (1, 0, 1));
    // A request that sets only its strategy keeps the key's provider order ...
    let cheapest = json!({"strategy": "cheapest"});
    assert_eq!(served_by(&gw, "ordered", Some(cheapest.clone())).await, "c");
    // ... and one that names its providers replaces it (the route's order among them).
    let named = json!({"providers": ["a", "b"]});
    assert_eq!(served_by(&gw, "ordered", Some(named)).await, "a");
    // The key's strategy replaces the route's; the request's replaces the key's.
    assert_eq!(served_by(&gw, "cheap", None).await, "b");
    let priority = json!({"strategy": "priority"});
    assert_eq!(served_by(&gw, "cheap", Some(priority)).await, "a");
    assert_eq!(served_by(&gw, "plain", Some(cheapest)).await, "b");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_excluded_provider_is_never_called_even_when_the_request_names_it() {
    let (a, b, c) = mocks().await;
    let gw = Gateway::start(config(&a, &b, &c));
    let r = send(&gw, "fenced", "m", None).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(
        header(&r, "x-llm-fallback"),
        "false",
        "c is the key's first"
    );
    assert!(
        header(&r, "x-llm-routing-reason").ends_with("fallbacks="),
        "an excluded provider is no fallback: {}",
        header(&r, "x-llm-routing-reason")
    );
    // Named by the request with a provider left: the excluded one stays out.
    let r = send(&gw, "fenced", "m", Some(json!({"providers": ["a", "c"]}))).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    // Only excluded providers named: nothing left, the plan's 503 with its reasons, no call.
    let r = send(&gw, "fenced", "m", Some(json!({"providers": ["b", "a"]}))).await;
    let v = expect_error(r, 503, "no_provider_available").await;
    assert_eq!(v["error"]["skipped"]["excluded_by_key"], 2, "{v}");
    assert_eq!(v["error"]["skipped"]["routing_override"], 1, "{v}");
    // The direct forms, configured or not, cannot reach it either.
    for direct in ["a/up-a", "b/some-new-model"] {
        let r = send(&gw, "fenced", direct, None).await;
        let v = expect_error(r, 503, "no_provider_available").await;
        assert_eq!(v["error"]["skipped"]["excluded_by_key"], 1, "{direct}: {v}");
    }
    assert_eq!(calls(&a, &b, &c), (0, 0, 2), "a and b never called");
    // Another key is not fenced.
    let r = send(&gw, "plain", "a/up-a", None).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let line = r#"signalbox_skipped_candidates_total{reason="excluded_by_key"}"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keys_max_attempts_lowers_the_routes_bound_never_raises_it() {
    let (a, b, c) = mocks().await;
    a.set_default(status(500));
    b.set_default(status(500));
    let gw = Gateway::start(config(&a, &b, &c));
    // Without a bound of its own: a and b fail, c serves.
    assert_eq!(served_by(&gw, "plain", None).await, "c");
    assert_eq!(calls(&a, &b, &c), (1, 1, 1));
    // One attempt: a fails, and that is the answer.
    let r = send(&gw, "single", "m", None).await;
    assert!(r.status().is_server_error(), "{}", r.status());
    assert_eq!(calls(&a, &b, &c), (2, 1, 1), "one call only");
    // Ten attempts under a policy of two: two calls, the policy's bound holds.
    let r = send(&gw, "generous", "two", None).await;
    assert!(r.status().is_server_error(), "{}", r.status());
    assert_eq!(calls(&a, &b, &c), (3, 2, 1), "the smaller bound");
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_as_a_key_shows_its_routing_applied() {
    let (a, b, c) = mocks().await;
    let gw = Gateway::start(config(&a, &b, &c));
    let order = |v: &Value| -> Vec<String> {
        v["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["candidate"].as_str().unwrap().to_string())
            .collect()
    };
    let v = explain(&gw, "ordered", None).await;
    assert_eq!(order(&v), ["c/up-c", "b/up-b", "a/up-a"], "{v}");
    assert_eq!(v["key_routing"]["provider_order"], json!(["c", "b"]), "{v}");
    assert_eq!(v["key_routing"]["provider_order_applied"], true, "{v}");
    assert_eq!(v["strategy_from"], "route", "{v}");
    let v = explain(&gw, "ordered", Some(json!({"providers": ["a", "b"]}))).await;
    assert_eq!(order(&v), ["a/up-a", "b/up-b"], "{v}");
    assert_eq!(v["key_routing"]["provider_order_applied"], false, "{v}");
    let v = explain(&gw, "cheap", None).await;
    assert_eq!(
        (&v["strategy"], &v["strategy_from"]),
        (&json!("cheapest"), &json!("key"))
    );
    // The excluded candidates, each with its reason; nothing left to call.
    let v = explain(&gw, "fenced", Some(json!({"providers": ["a"]}))).await;
    assert_eq!(
        v["key_routing"]["exclude_providers"],
        json!(["a", "b"]),
        "{v}"
    );
    let skipped: Vec<(String, String)> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["provider"].as_str().unwrap().to_string(),
                c["skipped"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want = [
        ("a", "excluded_by_key"),
        ("b", "excluded_by_key"),
        ("c", "routing_override"),
    ];
    for (provider, reason) in want {
        assert!(
            skipped.iter().any(|(p, r)| p == provider && r == reason),
            "{provider}: {reason} in {skipped:?}"
        );
    }
    assert!(order(&v).is_empty(), "{v}");
    // The attempt bound the request would run under.
    assert_eq!(explain(&gw, "single", None).await["max_attempts"], 1);
    assert_eq!(explain(&gw, "plain", None).await["max_attempts"], 20);
    assert!(explain(&gw, "plain", None).await["key_routing"].is_null());
    assert_eq!(calls(&a, &b, &c), (0, 0, 0), "explaining calls no one");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_made_at_runtime_takes_its_routing_and_an_unknown_provider_is_refused() {
    let (a, b, c) = mocks().await;
    let gw = GatewayBuilder::new(config(&a, &b, &c) + "admin: { token_env: SB_ADMIN }\n")
        .env("SB_ADMIN", "admin-secret")
        .start();
    let create = |body: Value| {
        client()
            .post(format!("http://{}/admin/keys", gw.admin))
            .bearer_auth("admin-secret")
            .json(&body)
            .send()
    };
    let routing = json!({"provider_order": ["b"], "exclude_providers": ["a"]});
    let r = create(json!({"id": "runtime", "routing": routing}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let key = v["key"].as_str().unwrap().to_string();
    let as_runtime = |routing: Option<Value>| {
        let mut body = chat("m");
        if let Some(r) = routing {
            body["routing"] = r;
        }
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };
    let r = as_runtime(None).await.unwrap();
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let r = as_runtime(Some(json!({"providers": ["a"]}))).await.unwrap();
    expect_error(r, 503, "no_provider_available").await;
    assert_eq!(calls(&a, &b, &c), (0, 1, 0));
    // A provider that does not exist: refused with its path, nothing changes.
    let r = create(json!({"id": "typo", "routing": {"exclude_providers": ["nope"]}}))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("routing.exclude_providers[0]") && text.contains("not a configured provider"),
        "{text}"
    );
}
