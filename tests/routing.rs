//! Steering over real sockets: the body read exactly as the provider will read it, what a
//! request's `routing` object asks for, what the routing headers report, and the caller's
//! model name coming back whatever the provider echoes.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use signalbox_mock::MockHandle;

/// Breakers off: these tests look at single requests.
const NO_BREAKERS: &str = "health: { failure_threshold: 0, respect_retry_after: false }\n";

/// Model `m` on `a` (priority 1, the pricier) then `b` (priority 2, cheaper).
fn two(a: &MockHandle, b: &MockHandle, model_extra: &str) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    {model_extra}\n    deployments:\n      - {{ provider: a, model: up-a, priority: 1, weight: 1, price: {{ input_per_mtok: 5.0, output_per_mtok: 15.0 }} }}\n      - {{ provider: b, model: up-b, priority: 2, weight: 1, price: {{ input_per_mtok: 0.1, output_per_mtok: 0.4 }} }}\n{NO_BREAKERS}",
        provider("a", a),
        provider("b", b),
    )
}

async fn post_raw(gw: &Gateway, body: &'static str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_escaped_key_cannot_smuggle_a_model_or_a_routing_object_past_the_gateway() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, ""));
    // Every JSON parser decodes `mod\u0065l` to `model` and keeps the last one: refused, or the
    // provider would serve the caller's own choice on the gateway's credential.
    let r = post_raw(
        &gw,
        r#"{"model":"m","mod\u0065l":"gpt-4-expensive","messages":[]}"#,
    )
    .await;
    let v = expect_error(r, 400, "invalid_request").await;
    assert!(v.to_string().contains("more than once"), "{v}");
    assert_eq!(a.calls() + b.calls(), 0);

    // Alone, the escaped key is the model: resolved, and its value rewritten for the provider.
    let r = post_raw(&gw, r#"{"mod\u0065l":"m","messages":[]}"#).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(a.requests()[0].model.as_deref(), Some("up-a"));

    // An escaped `routing` is applied (an unknown provider is refused) ...
    let r = post_raw(
        &gw,
        r#"{"model":"m","r\u006futing":{"providers":["nope"]}}"#,
    )
    .await;
    expect_error(r, 400, "invalid_request").await;
    // ... and stripped before the provider sees the body.
    let r = post_raw(
        &gw,
        r#"{"model":"m","r\u006futing":{"providers":["b"]},"messages":[]}"#,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(
        b.requests()[0].body_sha256,
        sha256_hex(br#"{"model":"up-b","messages":[]}"#)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_strategy_can_be_asked_for_per_request() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, ""));
    let with = |strategy: &str| {
        serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "routing": {"strategy": strategy},
        })
    };
    for strategy in [
        "priority",
        "priority_cheapest",
        "cheapest",
        "fastest",
        "latency",
        "highest_availability",
        "reliable",
        "balanced",
        "smartest",
        "custom",
        "weighted",
        "canary",
        "round_robin",
        "random",
        "least_inflight",
        "p2c_ewma",
        "prefix_affinity",
        "chain",
    ] {
        let r = post_chat(&gw, &with(strategy)).await;
        assert_eq!(r.status(), 200, "{strategy}: {}", r.text().await.unwrap());
        let reason = header(&r, "x-llm-routing-reason").to_string();
        assert!(reason.starts_with("strategy="), "{strategy}: {reason}");
    }
    // The strategy decides for this request only: `cheapest` skips the priority order (b is
    // far cheaper), `priority` keeps it.
    let r = post_chat(&gw, &with("cheapest")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert!(header(&r, "x-llm-routing-reason").starts_with("strategy=cheapest selected=b"));
    let r = post_chat(&gw, &with("priority")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(
        header(&r, "x-llm-provider"),
        "a",
        "the model's own strategy again"
    );
    expect_error(
        post_chat(&gw, &with("quickest")).await,
        400,
        "invalid_request",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_load_balancing_pick_served_on_its_first_try_is_not_a_fallback() {
    let a = mock("a").await;
    let b = mock("b").await;
    // Equal priorities: round robin alternates between a and b.
    let gw =
        Gateway::start(two(&a, &b, "strategy: round_robin").replace("priority: 2", "priority: 1"));
    for _ in 0..10 {
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-llm-attempts"), "1");
        assert_eq!(header(&r, "x-llm-fallback"), "false", "{:?}", r.headers());
        let provider = header(&r, "x-llm-provider").to_string();
        let reason = header(&r, "x-llm-routing-reason");
        assert!(
            reason.contains(&format!("selected={provider} ")),
            "{reason}"
        );
    }
    assert_eq!((a.calls(), b.calls()), (5, 5));
    // When the pick fails and the other serves, that is a fallback.
    a.set_default(status(503));
    let mut fallbacks = 0;
    for _ in 0..10 {
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(header(&r, "x-llm-provider"), "b");
        let (attempts, fallback) = (header(&r, "x-llm-attempts"), header(&r, "x-llm-fallback"));
        match attempts {
            "1" => assert_eq!(fallback, "false"),
            "2" => {
                assert_eq!(fallback, "true");
                fallbacks += 1;
            }
            other => panic!("{other} attempts"),
        }
    }
    assert_eq!(fallbacks, 5, "every other request picked a first");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_candidate_skipped_without_a_call_makes_the_answer_a_fallback() {
    let a = mock("a").await;
    let b = mock("b").await;
    let text = two(&a, &b, "strategy: priority").replace(
        NO_BREAKERS,
        "health: { failure_threshold: 1, cooldown: 1h, probe_interval: 1h }\n",
    );
    let gw = Gateway::start(text);
    a.push_script([status(503)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(
        (header(&r, "x-llm-attempts"), header(&r, "x-llm-fallback")),
        ("2", "true")
    );
    // a is ejected now: the next request does not call it, and still reports the fallback.
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    let reason = header(&r, "x-llm-routing-reason");
    assert!(
        reason.starts_with("strategy=priority selected=a priority=1 ")
            && reason.contains(" healthy=false "),
        "{reason}"
    );
    assert_eq!(a.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_callers_model_name_comes_back_whatever_the_provider_echoes() {
    // One provider answers with a shorter name than the caller's, one with a dated, longer
    // name, one echoes what it was sent.
    for echo in [Some("g"), Some("gpt-4o-mini-2024-07-18"), None] {
        let a = mock_with("a", |c| c.echo_model = echo.map(str::to_string)).await;
        let text = format!(
            "providers:\n{}models:\n  gpt-4o-mini:\n    deployments: [{{ provider: a, model: gpt-4o-mini }}]\naliases: {{ a-long-caller-facing-name: gpt-4o-mini, f: gpt-4o-mini }}\n",
            provider("a", &a)
        );
        let gw = Gateway::start(text);
        for caller in ["a-long-caller-facing-name", "f", "gpt-4o-mini"] {
            let r = post_chat(&gw, &chat(caller)).await;
            assert_eq!(r.status(), 200);
            let announced = r.content_length();
            let body = r.bytes().await.unwrap();
            if let Some(n) = announced {
                assert_eq!(n as usize, body.len(), "{echo:?} {caller}: exact framing");
            }
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["model"], caller, "echo {echo:?}");
            // Streams: every event.
            let mut stream = chat(caller);
            stream["stream"] = serde_json::json!(true);
            let text = post_chat(&gw, &stream).await.text().await.unwrap();
            let events: Vec<serde_json::Value> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            assert!(!events.is_empty(), "{text}");
            for e in &events {
                assert_eq!(e["model"], caller, "echo {echo:?}: {text}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_length_framed_answer_keeps_its_framing_with_a_short_echo() {
    let a = mock_with("a", |c| c.echo_model = Some("g".to_string())).await;
    let text = format!(
        "providers:\n{}models:\n  gpt-4o-mini:\n    deployments: [{{ provider: a, model: gpt-4o-mini }}]\naliases: {{ fast: gpt-4o-mini }}\n",
        provider("a", &a)
    );
    let gw = Gateway::start(text);
    // The mock answers with a Content-Length: the gateway keeps a length framing (no chunked
    // encoding), with the caller's longer name in the body.
    let r = post_chat(&gw, &chat("fast")).await;
    assert!(
        r.headers().get("transfer-encoding").is_none(),
        "{:?}",
        r.headers()
    );
    let n = r.content_length().unwrap() as usize;
    let body = r.bytes().await.unwrap();
    assert_eq!(body.len(), n);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["model"], "fast");
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_providers_order_breaks_priority_ties() {
    let a = mock("a").await;
    let b = mock("b").await;
    // Equal priorities: the configured order puts a first.
    let gw =
        Gateway::start(two(&a, &b, "strategy: priority").replace("priority: 2", "priority: 1"));
    let mut body = chat("m");
    body["routing"] = serde_json::json!({"strategy": "priority", "providers": ["b", "a"]});
    let r = post_chat(&gw, &body).await;
    assert_eq!(
        header(&r, "x-llm-provider"),
        "b",
        "the caller's order breaks the tie"
    );
    body["routing"] = serde_json::json!({"strategy": "priority", "providers": ["a", "b"]});
    let r = post_chat(&gw, &body).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    // Only these providers, and at most ten of them.
    body["routing"] = serde_json::json!({"providers": ["b"]});
    let r = post_chat(&gw, &body).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let reason = header(&r, "x-llm-routing-reason");
    assert!(
        reason.contains("selected=b ") && reason.ends_with(" fallbacks="),
        "the provider routing.providers removed is no fallback: {reason}"
    );
    body["routing"] = serde_json::json!({"providers": ["a"]});
    let r = post_chat(&gw, &body).await;
    let reason = header(&r, "x-llm-routing-reason");
    assert!(reason.ends_with("fallbacks="), "{reason}");
    body["routing"] = serde_json::json!({"providers": ["a", "b"]});
    let r = post_chat(&gw, &body).await;
    let reason = header(&r, "x-llm-routing-reason");
    assert!(reason.ends_with("fallbacks=b"), "both kept: {reason}");
    let eleven: Vec<String> = (0..11).map(|i| format!("p{i}")).collect();
    body["routing"] = serde_json::json!({ "providers": eleven });
    expect_error(post_chat(&gw, &body).await, 400, "invalid_request").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn smart_falls_back_to_priority_cheapest_and_says_so() {
    let a = mock("a").await;
    let b = mock("b").await;
    // The model's own strategy is `cheapest` (b); `smart` is `priority_cheapest` (a, priority 1).
    let gw = Gateway::start(two(&a, &b, "strategy: cheapest"));
    assert_eq!(
        header(&post_chat(&gw, &chat("m")).await, "x-llm-provider"),
        "b"
    );
    let mut body = chat("m");
    body["routing"] = serde_json::json!({"strategy": "smart"});
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let reason = header(&r, "x-llm-routing-reason");
    assert!(
        reason.starts_with("strategy=priority_cheapest selected=a ")
            && reason.ends_with(" reason=smart_fallback"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_providers_ignores_a_provider_that_does_not_serve_the_model() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    let config = two(&a, &b, "").replace(
        "models:\n",
        &format!(
            "{}models:\n  other: {{ deployments: [{{ provider: c, model: up-c }}] }}\n",
            provider("c", &c)
        ),
    );
    let gw = Gateway::start(config);
    let mut body = chat("m");
    // c is known but does not serve m: ignored, b serves.
    body["routing"] = serde_json::json!({"providers": ["c", "b"]});
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "b");
    // None of the listed providers serves m: 503, nothing called.
    body["routing"] = serde_json::json!({"providers": ["c"]});
    let v = expect_error(post_chat(&gw, &body).await, 503, "no_provider_available").await;
    assert!(!v.to_string().contains("up-"), "{v}");
    // An unknown name is the caller's mistake.
    body["routing"] = serde_json::json!({"providers": ["b", "zz"]});
    expect_error(post_chat(&gw, &body).await, 400, "invalid_request").await;
    assert_eq!((a.calls(), b.calls(), c.calls()), (0, 1, 0));
}

/// A client's built-in model names (Claude Code's `claude-opus-4-8`, Codex's `gpt-5-codex`)
/// reach the catalog through glob aliases; an exact name wins over a glob; the caller's name
/// comes back in the body; `models.retrieve` of such a name answers.
#[tokio::test(flavor = "multi_thread")]
async fn glob_aliases_map_a_clients_own_model_names_and_exact_names_win() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(format!(
        "providers:\n{}{}models:\n  big: {{ deployments: [{{ provider: a, model: up-big }}] }}\n  small: {{ deployments: [{{ provider: b, model: up-small }}] }}\n  claude-opus-legacy: {{ deployments: [{{ provider: b, model: up-legacy }}] }}\nchains:\n  economy: [small]\naliases:\n  \"claude-opus-*\": big\n  \"gpt-5*\": \"auto:economy\"\n",
        provider("a", &a),
        provider("b", &b),
    ));
    let r = post_chat(&gw, &chat("claude-opus-4-8")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-model"), "big");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v["model"], "claude-opus-4-8",
        "the caller's name comes back"
    );
    assert_eq!(a.requests().pop().unwrap().model.as_deref(), Some("up-big"));

    let r = post_chat(&gw, &chat("GPT-5-Codex")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-route"), "chain:economy");
    assert_eq!(header(&r, "x-llm-provider"), "b");

    // An exact name the glob would match is the exact name's.
    let r = post_chat(&gw, &chat("claude-opus-legacy")).await;
    assert_eq!(header(&r, "x-llm-model"), "claude-opus-legacy");

    // Nothing matches: still a 400.
    let r = post_chat(&gw, &chat("claude-sonnet-4")).await;
    expect_error(r, 400, "model_not_found").await;

    let v: serde_json::Value = get_json(&gw, "/v1/models/claude-opus-4-8").await;
    assert_eq!(v["id"], "claude-opus-4-8", "{v}");
}

/// The README's header table: `direct:<provider>/<upstream-model>` for a deployment the
/// config lists, `direct:<provider>` for an upstream model it does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_direct_request_names_its_provider_and_upstream_model_in_x_llm_route() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two(&a, &b, ""));
    let r = post_chat(&gw, &chat("a/up-a")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-route"), "direct:a/up-a");
    let r = post_chat(&gw, &chat("b/not-in-the-config")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-route"), "direct:b");
    assert!(
        README_HEADERS.contains("`direct:<provider>/<upstream-model>`"),
        "the README's header table says so"
    );
}

const README_HEADERS: &str = include_str!("../README.md");
