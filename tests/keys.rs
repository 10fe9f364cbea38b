//! Client keys over sockets: who may call (401), what a key may name (403, and the model list
//! it sees), its requests and tokens per minute and its budget (429 with `Retry-After`), all
//! checked before any candidate is called; the key itself never reaches a provider.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const KEY_A: &str = "sk-client-alpha-1234567890";
const KEY_B: &str = "sk-client-beta-0987654321";

fn sha(k: &str) -> String {
    hex::encode(Sha256::digest(k.as_bytes()))
}

fn config(m: &signalbox_mock::MockHandle, keys: &str) -> String {
    format!(
        "providers:\n{}models:\n  gpt-4o-mini:\n    deployments: [{{ provider: p, model: up-mini, price: {{ input_per_mtok: 1000000, output_per_mtok: 1000000 }} }}]\n  claude-haiku:\n    deployments: [{{ provider: p, model: up-haiku }}]\naliases: {{ fast: gpt-4o-mini }}\nchains: {{ team: [gpt-4o-mini] }}\nkeys:\n{keys}",
        provider("p", m)
    )
}

async fn post(gw: &Gateway, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut r = client().post(gw.url("/v1/chat/completions")).json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

/// The model ids `GET /v1/models` lists for `key`.
async fn model_ids(gw: &Gateway, key: &str) -> Vec<String> {
    let v: Value = client()
        .get(gw.url("/v1/models"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

async fn error_code(r: reqwest::Response) -> (u16, String, String) {
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    (
        status,
        v["error"]["code"].as_str().unwrap_or_default().to_string(),
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn only_a_configured_key_gets_through_and_it_never_reaches_the_provider() {
    let m = mock("p").await;
    let keys = format!(
        "  - {{ id: alpha, key_sha256: \"{}\" }}\n  - {{ id: beta, key_env: SB_TEST_KEY_BETA }}\n",
        sha(KEY_A)
    );
    let gw = GatewayBuilder::new(config(&m, &keys))
        .env("SB_TEST_KEY_BETA", KEY_B)
        .start();
    for key in [None, Some("sk-wrong")] {
        let (status, code, _) = error_code(post(&gw, key, &chat("gpt-4o-mini")).await).await;
        assert_eq!((status, code.as_str()), (401, "invalid_api_key"), "{key:?}");
    }
    assert_eq!(m.calls(), 0, "no call for a refused caller");
    // Bearer (from the digest) and x-api-key (from the environment) both work.
    let r = post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await;
    assert_eq!(r.status(), 200);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-api-key", KEY_B)
        .json(&chat("gpt-4o-mini"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for sent in m.requests() {
        for (name, value) in &sent.headers {
            assert!(
                !value.contains(KEY_A) && !value.contains(KEY_B),
                "the client key reached the provider in {name}"
            );
        }
    }
    // An Anthropic caller without a key: refused in its own dialect.
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-haiku", "max_tokens": 10, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    let logs = gw.stderr();
    assert!(
        !logs.contains(KEY_A) && !logs.contains(KEY_B),
        "a key in the log"
    );
    let metrics = gw.metrics_with(&["signalbox_requests_total"]).await;
    assert!(!metrics.contains(KEY_A) && !metrics.contains(&sha(KEY_A)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_names_only_what_it_may_and_sees_only_that() {
    let m = mock("p").await;
    let keys = format!(
        "  - {{ id: alpha, key_sha256: \"{}\", allowed_models: [\"gpt-4o*\", fast, \"auto:*\"] }}\n",
        sha(KEY_A)
    );
    let gw = Gateway::start(config(&m, &keys));
    for model in ["gpt-4o-mini", "FAST", "auto:team"] {
        let r = post(&gw, Some(KEY_A), &chat(model)).await;
        assert_eq!(r.status(), 200, "{model}");
    }
    let calls = m.calls();
    for model in ["claude-haiku", "no-such-model", "p/up-haiku"] {
        let (status, code, message) = error_code(post(&gw, Some(KEY_A), &chat(model)).await).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "model_not_allowed"),
            "{model}"
        );
        assert!(!message.contains(model), "names nothing: {message}");
    }
    // A route named by header or body is checked too.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-llm-route", "secret-policy")
        .json(&chat("gpt-4o-mini"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(r).await.1, "model_not_allowed");
    assert_eq!(m.calls(), calls, "refused without a call");
    // The list shows what the key may use, nothing else.
    let ids = model_ids(&gw, KEY_A).await;
    assert!(
        ids.iter().any(|i| i == "gpt-4o-mini") && ids.iter().any(|i| i == "fast"),
        "{ids:?}"
    );
    assert!(ids.iter().any(|i| i == "auto:team"), "{ids:?}");
    assert!(!ids.iter().any(|i| i == "claude-haiku"), "{ids:?}");
    let r = client().get(gw.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 401, "the list needs a key too");
    // Explain, as the key would send it.
    let explain = |model: &'static str| {
        let url = format!("http://{}/admin/explain?key=alpha", gw.admin);
        async move {
            client()
                .post(url)
                .json(&chat(model))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    assert!(explain("claude-haiku").await.contains("model_not_allowed"));
    let ok = explain("gpt-4o-mini").await;
    assert!(
        !ok.contains("model_not_allowed") && ok.contains("up-mini"),
        "{ok}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_and_tokens_per_minute_are_refused_before_any_call() {
    let m = mock("p").await;
    let keys = format!(
        "  - {{ id: alpha, key_sha256: \"{}\", rpm: 2 }}\n  - {{ id: beta, key_sha256: \"{}\", tpm: 300 }}\n",
        sha(KEY_A),
        sha(KEY_B)
    );
    let gw = Gateway::start(config(&m, &keys));
    for _ in 0..2 {
        assert_eq!(
            post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await.status(),
            200
        );
    }
    let r = post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await;
    let retry: u64 = header(&r, "retry-after").parse().expect("Retry-After");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(error_code(r).await.1, "rate_limited");
    assert_eq!(m.calls(), 2, "the third never reached the provider");
    // Tokens: an estimate (prompt + max_tokens) alone over the key's minute can never pass:
    // 413, not a 429 a client would retry forever.
    let mut big = chat("gpt-4o-mini");
    big["max_tokens"] = json!(1000);
    let r = post(&gw, Some(KEY_B), &big).await;
    assert!(r.headers().get("retry-after").is_none());
    let (status, code, _) = error_code(r).await;
    assert_eq!((status, code.as_str()), (413, "tokens_exceed_limit"));
    assert_eq!(m.calls(), 2);
    // One that fits (its estimate, then the 23 tokens the mock reports, counted) leaves too
    // little for a second: 429 until the minute frees.
    let mut half = chat("gpt-4o-mini");
    half["max_tokens"] = json!(290);
    assert_eq!(post(&gw, Some(KEY_B), &half).await.status(), 200);
    let r = post(&gw, Some(KEY_B), &half).await;
    let (status, code, _) = error_code(r).await;
    assert_eq!((status, code.as_str()), (429, "rate_limited"));
    assert_eq!(m.calls(), 3);
    // One key's minute is not another's.
    let mut small = chat("gpt-4o-mini");
    small["max_tokens"] = json!(16);
    assert_eq!(post(&gw, Some(KEY_B), &small).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_budget_refuses_until_the_period_ends() {
    let m = mock("p").await;
    // gpt-4o-mini costs $1 per token here: the first answer spends the key's $5.
    let keys = format!(
        "  - {{ id: alpha, key_sha256: \"{}\", budget: {{ usd: 5, period: day }} }}\n",
        sha(KEY_A)
    );
    let gw = Gateway::start(config(&m, &keys));
    assert_eq!(
        post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await.status(),
        200
    );
    let r = post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await;
    let retry: u64 = header(&r, "retry-after").parse().expect("Retry-After");
    assert!(
        (1..=86_400).contains(&retry),
        "until the UTC day ends: {retry}"
    );
    let (status, code, _) = error_code(r).await;
    assert_eq!((status, code.as_str()), (429, "budget_exceeded"));
    assert_eq!(m.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_policies_can_read_the_key() {
    let m = mock("p").await;
    let keys = format!(
        "  - {{ id: alpha, key_sha256: \"{}\", user: alice }}\n  - {{ id: beta, key_sha256: \"{}\" }}\n",
        sha(KEY_A),
        sha(KEY_B)
    );
    let rules = "rules:\n  - when: { key.user: alice }\n    then: auto:team\n";
    let conf = config(&m, &keys).replace(
        "chains: { team: [gpt-4o-mini] }",
        "chains: { team: [gpt-4o-mini], other: [claude-haiku] }\nactive_chain: other",
    ) + rules;
    let gw = Gateway::start(conf);
    let r = post(&gw, Some(KEY_A), &chat("auto")).await;
    assert_eq!(header(&r, "x-llm-route"), "rule:0", "alice's rule");
    assert_eq!(header(&r, "x-routed-via"), "p/up-mini", "to the team chain");
    let r = post(&gw, Some(KEY_B), &chat("auto")).await;
    assert_eq!(header(&r, "x-llm-route"), "chain:other", "no rule for beta");
    assert_eq!(header(&r, "x-routed-via"), "p/up-haiku");
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_made_at_runtime_work_at_once_survive_a_restart_and_can_be_revoked() {
    let m = mock("p").await;
    let keys = format!("  - {{ id: alpha, key_sha256: \"{}\" }}\n", sha(KEY_A));
    let gw = GatewayBuilder::new(config(&m, &keys) + "admin: { token_env: SB_ADMIN }\n")
        .env("SB_ADMIN", "admin-secret")
        .start();
    let admin = |path: &str| format!("http://{}{path}", gw.admin);
    let r = client()
        .post(admin("/admin/keys"))
        .bearer_auth("admin-secret")
        .json(&json!({"id": "runtime", "user": "bob", "allowed_models": ["gpt-4o-mini"], "rpm": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let key = v["key"].as_str().expect("the key, once").to_string();
    assert!(key.starts_with("sk-sb-") && key.len() > 40, "{key}");
    // Serves at once, with its limits.
    assert_eq!(
        post(&gw, Some(&key), &chat("gpt-4o-mini")).await.status(),
        200
    );
    let (_, code, _) = error_code(post(&gw, Some(&key), &chat("claude-haiku")).await).await;
    assert_eq!(code, "model_not_allowed");
    // Only the digest is written; the key appears nowhere signalbox could show it again.
    let file = std::fs::read_to_string(gw.config_path()).unwrap();
    assert!(file.contains(&sha(&key)) && !file.contains(&key));
    let shown = client()
        .get(admin("/admin/config"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!shown.contains(&key));
    assert!(!gw.stderr().contains(&key));
    // A restart reads it back from the file.
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&file).unwrap();
    let map = doc.as_mapping_mut().unwrap();
    map.remove("listen");
    map.remove("pingora");
    let restarted = GatewayBuilder::new(serde_yaml::to_string(&doc).unwrap())
        .env("SB_ADMIN", "admin-secret")
        .start();
    assert_eq!(
        post(&restarted, Some(&key), &chat("gpt-4o-mini"))
            .await
            .status(),
        200
    );
    drop(restarted);
    // The same id twice is refused; nothing changes.
    let r = client()
        .post(admin("/admin/keys"))
        .bearer_auth("admin-secret")
        .json(&json!({"id": "runtime"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Revoked: refused at once.
    let r = client()
        .delete(admin("/admin/keys/runtime"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, code, _) = error_code(post(&gw, Some(&key), &chat("gpt-4o-mini")).await).await;
    assert_eq!((status, code.as_str()), (401, "invalid_api_key"));
    let r = client()
        .delete(admin("/admin/keys/runtime"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await.status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_key_of_a_user_spends_from_the_users_budget() {
    let m = mock("p").await;
    // gpt-4o-mini costs $1 a token: one answer spends alice's $5.
    let keys = format!(
        "  - {{ id: alpha, key_sha256: \"{}\", user: alice }}\n  - {{ id: beta, key_sha256: \"{}\", user: alice }}\n",
        sha(KEY_A),
        sha(KEY_B)
    );
    let conf = config(&m, &keys) + "budgets:\n  users: { alice: { usd: 5, period: week } }\n";
    let gw = Gateway::start(conf);
    assert_eq!(
        post(&gw, Some(KEY_A), &chat("gpt-4o-mini")).await.status(),
        200
    );
    let r = post(&gw, Some(KEY_B), &chat("gpt-4o-mini")).await;
    assert!(header(&r, "retry-after")
        .parse::<u64>()
        .is_ok_and(|s| (1..=7 * 86_400).contains(&s)));
    let (status, code, _) = error_code(r).await;
    assert_eq!(
        (status, code.as_str()),
        (429, "budget_exceeded"),
        "beta is alice's too"
    );
    assert_eq!(m.calls(), 1);
}

/// Models `cheap` (on `a`), `premium` (on `b`), `spare` (on `c`): a chain, a rule that sends a
/// labelled `auto` to the premium chain, a policy with a fallback, a weighted pool.
fn scoped(
    a: &signalbox_mock::MockHandle,
    b: &signalbox_mock::MockHandle,
    c: &signalbox_mock::MockHandle,
    keys: &str,
) -> String {
    format!(
        "providers:\n{}{}{}models:\n  cheap: {{ deployments: [{{ provider: a, model: up-cheap }}] }}\n  premium: {{ deployments: [{{ provider: b, model: up-premium }}] }}\n  spare: {{ deployments: [{{ provider: c, model: up-spare }}] }}\n\
         chains: {{ everyday: [cheap], top: [premium] }}\nactive_chain: everyday\n\
         rules:\n  - {{ when: {{ metadata.team: ads }}, then: auto:top }}\n\
         policies:\n  backed: {{ select: [ {{ router: priority, targets: [ {{ model: cheap }} ] }} ], on_failure: [premium, spare] }}\n  pool: {{ select: [ {{ router: weighted, targets: [ {{ model: premium, weight: 9 }}, {{ model: cheap, weight: 1 }} ] }} ] }}\n\
         health: {{ failure_threshold: 100 }}\nkeys:\n{keys}",
        provider("a", a),
        provider("b", b),
        provider("c", c),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keys_scope_covers_every_candidate_wherever_it_came_from() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    // The key may name auto, the policies and `cheap`/`spare`: never be served by `premium`.
    let keys = format!(
        "  - {{ id: narrow, key_sha256: \"{}\", allowed_models: [auto, backed, pool, cheap, spare] }}\n",
        sha(KEY_A)
    );
    let gw = Gateway::start(scoped(&a, &b, &c, &keys));
    // A rule sends the labelled request to the premium chain: refused, naming nothing.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-llm-metadata", r#"{"team":"ads"}"#)
        .json(&chat("auto"))
        .send()
        .await
        .unwrap();
    let (refused, code, message) = error_code(r).await;
    assert_eq!((refused, code.as_str()), (403, "model_not_allowed"));
    assert!(!message.contains("premium"), "{message}");
    assert_eq!(b.calls(), 0);
    // Unlabelled, auto is the everyday chain: served.
    let r = post(&gw, Some(KEY_A), &chat("auto")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    // A policy's fallback past what the key may use: cheap fails, premium is skipped
    // without a call, spare serves.
    a.push_script([status(503)]);
    let r = post(&gw, Some(KEY_A), &chat("backed")).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(b.calls(), 0);
    // A weighted pool draws among what the key may use, before its weights are normalised:
    // premium's 9 shares are gone, every request is cheap's.
    for _ in 0..20 {
        let r = post(&gw, Some(KEY_A), &chat("pool")).await;
        assert_eq!(header(&r, "x-llm-provider"), "a");
        assert_eq!(header(&r, "x-llm-fallback"), "false");
    }
    assert_eq!(b.calls(), 0, "premium never called");
    let line = r#"signalbox_skipped_candidates_total{reason="not_allowed"}"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
    // Explain as that key shows the same skips and the pool's shares for it.
    let v: Value = client()
        .post(format!("http://{}/admin/explain?key=narrow", gw.admin))
        .json(&chat("backed"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v.to_string().contains("not_allowed"), "{v}");
    let v: Value = client()
        .post(format!("http://{}/admin/explain?key=narrow", gw.admin))
        .json(&chat("pool"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shares = v["via"]["shares"].as_array().unwrap();
    assert_eq!(shares[0]["model"], "premium");
    assert_eq!(shares[0]["share"].as_f64(), Some(0.0), "{v}");
    assert_eq!(shares[1]["share"].as_f64(), Some(1.0), "{v}");
    // The model list shows names the key can be served by.
    let ids = model_ids(&gw, KEY_A).await;
    assert!(
        ids.iter().any(|i| i == "cheap") && ids.iter().any(|i| i == "auto"),
        "{ids:?}"
    );
    assert!(!ids.iter().any(|i| i == "premium"), "{ids:?}");
}
