//! Both API dialects through one failover loop, over real loopback sockets (reqwest → gateway →
//! `signalbox_mock`): what a caller of either dialect gets from a provider of either kind.
//!
//! - A chat field Anthropic cannot express: refused naming it with no call when only an
//!   Anthropic-kind provider could serve, skipped (not failed) when an OpenAI-kind one follows.
//! - Errors in Anthropic's shape for `/v1/messages` callers (signalbox's own refusals and a
//!   provider's 400, same dialect and translated).
//! - `GET /v1/models` in the caller's dialect.
//! - `/v1/messages/count_tokens`: served by Anthropic-kind providers only.
//! - Same-dialect Anthropic passthrough: the body byte for byte but `model`, the caller's
//!   `anthropic-version`/`anthropic-beta`, the provider's key and never the caller's.
//! - Translation never forges thinking, and keeps tool call ids.
//! - `response.provider_field`.
//! - Stream usage asked of OpenAI-kind providers on the caller's behalf and stripped again.
//! - The stream contract in the Anthropic dialect: a stream that breaks after content (dies,
//!   ends early, errors, stalls) ends with `event: error`, never `message_stop`.
//! - Also: a Messages field chat cannot express (refused in Anthropic's shape, or skipped);
//!   credentials and version headers following the provider's kind in either direction; usage
//!   on translated and legacy-completions streams.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Behaviour, Endpoint, MockHandle};

/// The environment variable holding every provider's key.
const KEY_ENV: &str = "SIGNALBOX_DIALECTS_TEST_KEY";
/// The provider key signalbox sends upstream.
const PROVIDER_KEY: &str = "sk-provider-dialects-key";
/// The key a caller sends signalbox: it must never reach a provider.
const CALLER_KEY: &str = "caller-secret";
/// The mock's answer and its word count (its completion/output tokens).
const REPLY: &str = "Hello from signalbox-mock.";
const REPLY_TOKENS: u64 = 3;
/// Breakers effectively off: tests that fail a target look at each request.
const NO_BREAKERS: &str =
    "health: { failure_threshold: 1000, bench_after: 64, cooldown: 1ms, respect_retry_after: false }\n";

// ---------------------------------------------------------------------------------------------
// Config and gateway

/// A provider entry of `kind` (`openai` or `anthropic`) on a mock, with one keyed credential.
fn provider_of(id: &str, kind: &str, m: &MockHandle) -> String {
    format!(
        "  {id}: {{ kind: {kind}, base_url: \"{}\", credentials: [{{ id: k, key_env: {KEY_ENV} }}] }}\n",
        m.base_url()
    )
}

/// A model `name` served by `provider` as `up-<provider>`.
fn model_on(name: &str, provider: &str) -> String {
    format!("  {name}:\n    deployments: [{{ provider: {provider}, model: up-{provider} }}]\n")
}

/// Model `m` served by each of `targets` in order (provider `id`, kind, mock), upstream model
/// `up-<id>`, and `extra` sections.
fn one_model(targets: &[(&str, &str, &MockHandle)], extra: &str) -> String {
    let mut providers = String::new();
    let mut deployments = Vec::new();
    for (i, (id, kind, m)) in targets.iter().enumerate() {
        providers.push_str(&provider_of(id, kind, m));
        deployments.push(format!(
            "{{ provider: {id}, model: up-{id}, priority: {} }}",
            i + 1
        ));
    }
    format!(
        "providers:\n{providers}models:\n  m:\n    deployments: [{}]\n{NO_BREAKERS}{extra}",
        deployments.join(", ")
    )
}

fn start(config: String) -> Gateway {
    GatewayBuilder::new(config)
        .env(KEY_ENV, PROVIDER_KEY)
        .start()
}

// ---------------------------------------------------------------------------------------------
// Requests and reading answers

fn messages_body(model: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Say hello."}]
    })
}

/// POST raw bytes to `path` as an Anthropic caller would (its version, its own key).
async fn post_anthropic(
    gw: &Gateway,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", CALLER_KEY)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn post_messages(gw: &Gateway, body: &Value) -> reqwest::Response {
    post_anthropic(gw, "/v1/messages", body.to_string()).await
}

async fn json_of(r: reqwest::Response) -> Value {
    let text = r.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The `data:` payloads of an SSE text, in order.
fn sse_data(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .flat_map(|event| event.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

/// The `data:` payloads of an OpenAI stream, parsed (without `[DONE]`).
fn chat_chunks(text: &str) -> Vec<Value> {
    sse_data(text)
        .into_iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("chunk not JSON ({e}): {d}")))
        .collect()
}

/// The event names of an Anthropic stream, in order.
fn sse_events(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .map(str::trim)
        .collect()
}

/// An Anthropic-shaped error with `status`: exactly `{"type":"error","error":{"type","message"}}`,
/// its type the one Anthropic pairs with the status. Returns the JSON.
async fn expect_anthropic_error(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status().as_u16(), status, "status");
    let v = json_of(r).await;
    assert_anthropic_error_shape(&v, status);
    v
}

/// The error `type` Anthropic pairs with an HTTP status.
fn anthropic_type_for(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// `{"type":"error","error":{"type","message"}}` (and the `request_id` signalbox's own answers
/// carry) and nothing else, typed as Anthropic types `status`.
fn assert_anthropic_error_shape(v: &Value, status: u16) {
    assert_anthropic_error_envelope(v);
    assert_eq!(v["error"]["type"], anthropic_type_for(status), "{v}");
}

/// `{"type":"error","error":{"type","message"}}`, with a `request_id` string or without, and
/// nothing else.
fn assert_anthropic_error_envelope(v: &Value) {
    assert_eq!(v["type"], "error", "{v}");
    let keys: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert!(
        keys.iter()
            .all(|k| ["type", "error", "request_id"].contains(k)),
        "only `type`, `error` and `request_id`: {v}"
    );
    assert!(v.get("request_id").is_none_or(Value::is_string), "{v}");
    assert!(
        v["error"]["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("_error")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(
        v.get("code").is_none() && v["error"].get("code").is_none(),
        "{v}"
    );
}

/// Every value in `v` (recursively) with key `type` equal to one of `types`.
fn blocks_of_type<'a>(v: &'a Value, types: &[&str], out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(map) => {
            if map
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| types.contains(&t))
            {
                out.push(v);
            }
            for child in map.values() {
                blocks_of_type(child, types, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                blocks_of_type(child, types, out);
            }
        }
        _ => {}
    }
}

fn find_blocks<'a>(v: &'a Value, types: &[&str]) -> Vec<&'a Value> {
    let mut out = Vec::new();
    blocks_of_type(v, types, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// 1. A chat field Anthropic cannot express

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_field_anthropic_cannot_express_is_refused_naming_it_without_a_call() {
    let c = mock("c").await;
    let gw = start(one_model(&[("c", "anthropic", &c)], ""));
    for (field, value, stream) in [
        ("n", json!(2), false),
        ("logprobs", json!(true), false),
        ("n", json!(2), true),
    ] {
        let mut body = chat("m");
        body[field] = value;
        if stream {
            body["stream"] = json!(true);
        }
        let r = post_chat(&gw, &body).await;
        assert!(
            header(&r, "content-type").starts_with("application/json"),
            "{field}"
        );
        let v = expect_error(r, 400, "unsupported_parameter").await;
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("`{field}`")),
            "the message names the field: {v}"
        );
        assert_eq!(
            c.calls(),
            0,
            "{field}: no call to a provider that cannot take it"
        );
    }
    // The same model without the field is served by it: the refusal was the field's.
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(c.calls_to(Endpoint::Messages), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_target_that_cannot_express_a_chat_field_is_skipped_for_one_that_can() {
    let (c, o) = (mock("c").await, mock("o").await);
    let config = format!(
        "providers:\n{}{}models:\n{}{}chains:\n  mix: [claude, gpt]\n{NO_BREAKERS}",
        provider_of("c", "anthropic", &c),
        provider_of("o", "openai", &o),
        model_on("claude", "c"),
        model_on("gpt", "o"),
    );
    let gw = start(config);
    // The chain's first model serves what it can express...
    let r = post_chat(&gw, &chat("auto:mix")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(header(&r, "x-llm-fallback"), "false");
    assert_eq!(c.calls(), 1);
    // ...and is passed over, without a call, for what it cannot.
    for (field, value) in [("n", json!(2)), ("logprobs", json!(true))] {
        let mut body = chat("auto:mix");
        body[field] = value.clone();
        let r = post_chat(&gw, &body).await;
        assert_eq!(r.status(), 200, "{field}");
        assert_eq!(header(&r, "x-llm-provider"), "o", "{field}");
        assert_eq!(header(&r, "x-routed-via"), "o/up-o", "{field}");
        assert_eq!(
            header(&r, "x-llm-attempts"),
            "1",
            "skipped, not failed: {field}"
        );
        assert_eq!(header(&r, "x-llm-fallback"), "true", "{field}");
        let v = json_of(r).await;
        assert_eq!(v["model"], "auto:mix", "{v}");
        assert_eq!(v["object"], "chat.completion", "{v}");
        let sent = o.requests().pop().unwrap().json().unwrap();
        assert_eq!(
            sent[field], value,
            "same dialect: the field as sent: {sent}"
        );
    }
    assert_eq!(c.calls(), 1, "no call for a field the provider cannot take");
    assert_eq!(o.calls_to(Endpoint::ChatCompletions), 2);
    // Counted as what happened: c's one call (the first request), o's two; nothing failed.
    let m = gw
        .metrics_with(&[
            r#"signalbox_attempts_total{provider="o",outcome="ok"} 2"#,
            r#"signalbox_requests_total{route="chain:mix",provider="o",status_class="2xx"} 2"#,
        ])
        .await;
    let attempts: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("signalbox_attempts_total{") && !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        attempts,
        [
            r#"signalbox_attempts_total{provider="c",outcome="ok"} 1"#,
            r#"signalbox_attempts_total{provider="o",outcome="ok"} 2"#,
        ],
        "{m}"
    );
    assert!(
        !m.lines()
            .any(|l| l.starts_with("signalbox_failovers_total{") && !l.ends_with(" 0")),
        "a skip is not a failover: {m}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Errors in the Anthropic shape for /v1/messages callers

#[tokio::test(flavor = "multi_thread")]
async fn messages_callers_get_signalboxs_refusals_in_anthropics_shape() {
    let a = mock("a").await;
    let gw = start(one_model(&[("a", "anthropic", &a)], ""));

    // An unknown model.
    let r = post_messages(&gw, &messages_body("no-such-model")).await;
    let status = r.status().as_u16();
    assert!((400..500).contains(&status), "a caller error: {status}");
    let v = json_of(r).await;
    assert_anthropic_error_envelope(&v);
    // Anthropic itself answers an unknown model 404 `not_found_error`; signalbox keeps its
    // own 400 (its caller contract), typed as Anthropic types that status (the type and the
    // status never disagree: the SDKs choose the exception by status).
    assert_eq!(status, 400);
    assert_eq!(v["error"]["type"], anthropic_type_for(status), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-model"),
        "names the model the caller sent: {v}"
    );

    // No max_tokens (Anthropic requires it).
    let mut body = messages_body("m");
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = post_messages(&gw, &body).await;
    let v = expect_anthropic_error(r, 400).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens"),
        "{v}"
    );

    // Not JSON at all.
    let r = post_anthropic(&gw, "/v1/messages", "{not json").await;
    expect_anthropic_error(r, 400).await;

    // count_tokens speaks the same dialect.
    let r = post_anthropic(
        &gw,
        "/v1/messages/count_tokens",
        json!({"model": "no-such-model", "messages": []}).to_string(),
    )
    .await;
    let status = r.status().as_u16();
    assert!((400..500).contains(&status), "{status}");
    let v = json_of(r).await;
    assert_anthropic_error_envelope(&v);
    assert!(
        v["error"]["message"].to_string().contains("no-such-model"),
        "{v}"
    );

    assert_eq!(a.calls(), 0, "none of these reached a provider");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_refusal_reaches_a_messages_caller_in_anthropics_shape() {
    for kind in ["anthropic", "openai"] {
        let a = mock("a").await;
        // The mock's default error body echoes the credential it got: it must not pass.
        a.set_default(status(400));
        let gw = start(one_model(&[("a", kind, &a)], ""));
        let r = post_messages(&gw, &messages_body("m")).await;
        assert_eq!(header(&r, "x-llm-provider"), "a", "{kind}");
        let text = r.text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{kind}: {text}"));
        assert_anthropic_error_shape(&v, 400);
        assert!(
            !text.contains(PROVIDER_KEY),
            "{kind}: the provider's words leak: {text}"
        );
        assert!(
            !text.contains("mock"),
            "{kind}: the provider's words leak: {text}"
        );
        assert_eq!(
            a.calls(),
            1,
            "{kind}: a caller error is relayed, not retried"
        );
        let endpoint = if kind == "anthropic" {
            Endpoint::Messages
        } else {
            Endpoint::ChatCompletions
        };
        assert_eq!(a.calls_to(endpoint), 1, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_of_the_refusal_survives_and_the_chat_caller_gets_openais_shape() {
    // The reverse direction: a chat caller, an Anthropic provider refusing the request.
    let a = mock("a").await;
    a.set_default(status(400));
    let gw = start(one_model(&[("a", "anthropic", &a)], ""));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 400);
    let text = r.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert!(
        v.get("type").is_none(),
        "OpenAI's shape, not Anthropic's: {v}"
    );
    assert!(!text.contains(PROVIDER_KEY), "{text}");
    // Every attempt failing: an Anthropic caller gets a 5xx of its own dialect.
    let (x, y) = (mock("x").await, mock("y").await);
    x.set_default(status(500));
    y.set_default(status(503));
    let gw = start(one_model(
        &[("x", "anthropic", &x), ("y", "openai", &y)],
        "",
    ));
    let r = post_messages(&gw, &messages_body("m")).await;
    let status = r.status().as_u16();
    assert!((500..600).contains(&status), "{status}");
    let v = expect_anthropic_error(r, status).await;
    assert!(!v.to_string().contains(PROVIDER_KEY), "{v}");
    assert_eq!((x.calls(), y.calls()), (1, 1));
}

// ---------------------------------------------------------------------------------------------
// 3. GET /v1/models in the caller's dialect

#[tokio::test(flavor = "multi_thread")]
async fn the_model_list_speaks_the_callers_dialect() {
    let a = mock("a").await;
    let gw = start(format!(
        "{}aliases:\n  fast: m\nchains:\n  main: [m]\nactive_chain: main\n",
        one_model(&[("a", "anthropic", &a)], "")
    ));
    let r = client()
        .get(gw.url("/v1/models"))
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", CALLER_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("application/json"));
    let v = json_of(r).await;
    assert!(v.get("object").is_none(), "not OpenAI's list: {v}");
    assert_eq!(v["has_more"], false, "{v}");
    let data = v["data"].as_array().unwrap();
    assert!(!data.is_empty(), "{v}");
    for entry in data {
        assert_eq!(entry["type"], "model", "{entry}");
        assert!(entry["id"].is_string(), "{entry}");
        assert!(entry["display_name"].is_string(), "{entry}");
        let created = entry["created_at"].as_str().unwrap();
        // RFC 3339, as the Anthropic SDK parses it.
        assert!(
            created.len() >= 20 && created.as_bytes()[4] == b'-' && created.contains('T'),
            "{entry}"
        );
    }
    let ids: Vec<&str> = data.iter().filter_map(|e| e["id"].as_str()).collect();
    for name in ["m", "fast", "auto", "auto:main"] {
        assert!(ids.contains(&name), "{name} in {ids:?}");
    }
    assert_eq!(v["first_id"], ids[0], "{v}");
    assert_eq!(v["last_id"], *ids.last().unwrap(), "{v}");

    let r = client().get(gw.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v = json_of(r).await;
    assert_eq!(v["object"], "list", "{v}");
    let data = v["data"].as_array().unwrap();
    let openai_ids: Vec<&str> = data.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(openai_ids, ids, "the same names in either shape");
    for entry in data {
        assert_eq!(entry["object"], "model", "{entry}");
        assert!(entry.get("type").is_none(), "{entry}");
    }
    assert_eq!(
        a.calls() + a.model_list_calls(),
        0,
        "answered by signalbox itself"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_model_is_retrieved_and_the_list_paged_in_the_callers_dialect() {
    let a = mock("a").await;
    let gw = start(format!(
        "{}aliases:\n  fast: m\nchains:\n  main: [m]\nactive_chain: main\n",
        one_model(&[("a", "anthropic", &a)], "")
    ));
    let get = |path: &str, anthropic: bool| {
        let mut rb = client().get(gw.url(path)).header("x-api-key", CALLER_KEY);
        if anthropic {
            rb = rb.header("anthropic-version", "2023-06-01");
        }
        rb.send()
    };
    // OpenAI's shape: `models.retrieve`, with a real `created` (unix seconds, not 1970).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let v = json_of(get("/v1/models/fast", false).await.unwrap()).await;
    assert_eq!(v["id"], "fast", "{v}");
    assert_eq!(v["object"], "model", "{v}");
    let created = v["created"].as_u64().unwrap();
    assert!(created > now - 3600 && created <= now, "{v}");
    let list = json_of(get("/v1/models", false).await.unwrap()).await;
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["created"] == created));
    // A chain's name, percent-encoded as an SDK may send it.
    let v = json_of(get("/v1/models/auto%3Amain", false).await.unwrap()).await;
    assert_eq!(v["id"], "auto:main", "{v}");
    // Unknown: 404 model_not_found, OpenAI-shaped with `param`.
    let r = get("/v1/models/nope", false).await.unwrap();
    assert_eq!(r.status(), 404);
    let v = json_of(r).await;
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert!(v["error"].get("param").is_some(), "{v}");

    // Anthropic's shape: the object, the 404 with its request id, and pages.
    let v = json_of(get("/v1/models/m", true).await.unwrap()).await;
    assert_eq!(
        (v["type"].as_str(), v["id"].as_str()),
        (Some("model"), Some("m")),
        "{v}"
    );
    assert!(
        !v["created_at"].as_str().unwrap().starts_with("1970"),
        "{v}"
    );
    let r = get("/v1/models/nope", true).await.unwrap();
    assert_eq!(r.status(), 404);
    let id = header(&r, "request-id").to_string();
    let v = json_of(r).await;
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    assert_eq!(v["request_id"], id, "{v}");
    let all = json_of(get("/v1/models", true).await.unwrap()).await;
    let ids: Vec<String> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.len() >= 3, "{all}");
    let first = json_of(get("/v1/models?limit=2", true).await.unwrap()).await;
    assert_eq!(first["data"].as_array().unwrap().len(), 2, "{first}");
    assert_eq!(first["has_more"], true, "{first}");
    let next = format!(
        "/v1/models?limit=2&after_id={}",
        first["last_id"].as_str().unwrap()
    );
    let second = json_of(get(&next, true).await.unwrap()).await;
    assert_eq!(
        second["first_id"].as_str(),
        Some(ids[2].as_str()),
        "{second}"
    );
    let r = get("/v1/models?limit=0", true).await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(json_of(r).await["error"]["type"], "invalid_request_error");
    assert_eq!(
        a.calls() + a.model_list_calls(),
        0,
        "answered by signalbox itself"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. /v1/messages/count_tokens

#[tokio::test(flavor = "multi_thread")]
async fn count_tokens_is_served_by_anthropic_kind_providers_only() {
    let (a, o) = (mock("a").await, mock("o").await);
    let config = format!(
        "providers:\n{}{}models:\n{}{}{NO_BREAKERS}",
        provider_of("a", "anthropic", &a),
        provider_of("o", "openai", &o),
        model_on("claude", "a"),
        model_on("gpt", "o"),
    );
    let gw = start(config);
    let body = json!({
        "model": "claude",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}]
    });
    let r = post_anthropic(&gw, "/v1/messages/count_tokens", body.to_string()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-routed-via"), "a/up-a");
    let v = json_of(r).await;
    assert_eq!(a.calls_to(Endpoint::CountTokens), 1);
    assert_eq!(a.calls(), 1);
    let sent = a.requests().pop().unwrap();
    assert!(
        sent.path.ends_with("/messages/count_tokens"),
        "{}",
        sent.path
    );
    assert_eq!(
        sent.model.as_deref(),
        Some("up-a"),
        "the upstream model name"
    );
    assert_eq!(sent.header("x-api-key"), Some(PROVIDER_KEY));
    let mut expected = body.clone();
    expected["model"] = json!("up-a");
    assert_eq!(sent.json().unwrap(), expected, "everything else as sent");
    // The mock counts a quarter of the body it received.
    assert_eq!(
        v["input_tokens"].as_u64(),
        Some(sent.body_len as u64 / 4),
        "the provider's count: {v}"
    );

    // A model only OpenAI-kind providers serve: nothing can count its tokens. Its candidates
    // are skipped (reason `endpoint`) without a call, and since that is the config's doing,
    // not an outage, the answer is a 400 `endpoint_not_supported` (an SDK does not retry it),
    // typed `invalid_request_error` in Anthropic's shape.
    let r = post_anthropic(
        &gw,
        "/v1/messages/count_tokens",
        json!({"model": "gpt", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    )
    .await;
    let status = r.status().as_u16();
    assert_eq!(status, 400, "a property of the config, not an outage");
    let v = expect_anthropic_error(r, status).await;
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/messages/count_tokens"),
        "says why: {v}"
    );
    assert_eq!(o.calls(), 0, "no call to a provider without the endpoint");
    let line = r#"signalbox_skipped_candidates_total{reason="endpoint"} 1"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
}

// ---------------------------------------------------------------------------------------------
// 5. Same-dialect Anthropic passthrough

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_caller_reaches_an_anthropic_provider_byte_for_byte_but_the_model() {
    let a = mock("a").await;
    let gw = start(one_model(&[("a", "anthropic", &a)], ""));
    // Written by hand, with spacing and key order a serializer would not produce: only the
    // model's value may change.
    let body = concat!(
        "{ \"max_tokens\" : 2048,\n",
        "  \"model\":\t\"m\",\n",
        "  \"system\": [{\"type\": \"text\", \"text\": \"You are terse.\", \"cache_control\": {\"type\": \"ephemeral\"}}],\n",
        "  \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024},\n",
        "  \"messages\": [\n",
        "    {\"role\": \"user\", \"content\": \"What is 2+2?\"},\n",
        "    {\"role\": \"assistant\", \"content\": [\n",
        "      {\"type\": \"thinking\", \"thinking\": \"Add them.\", \"signature\": \"EqQBCkgIARABGAIiQL+sig==\"},\n",
        "      {\"type\": \"text\", \"text\": \"4\"}]},\n",
        "    {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"And 3+3?\", \"cache_control\": {\"type\": \"ephemeral\"}}]}\n",
        "  ],\n",
        "  \"metadata\": {\"user_id\": \"u-1\"}, \"temperature\": 1 }"
    );
    let beta = "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14";
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", beta)
        .header("x-api-key", CALLER_KEY)
        .header("authorization", format!("Bearer {CALLER_KEY}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let v = json_of(r).await;
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["model"], "m", "the caller's model name: {v}");
    let kinds: Vec<&str> = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["thinking", "text"],
        "thinking asked for, thinking answered: {v}"
    );

    assert_eq!(a.calls_to(Endpoint::Messages), 1);
    let sent = a.requests().pop().unwrap();
    let expected = body.replacen("\"model\":\t\"m\"", "\"model\":\t\"up-a\"", 1);
    assert_eq!(
        String::from_utf8_lossy(&sent.body),
        expected,
        "every byte but the model's value"
    );
    // Parsed, the same way round: nothing but the model differs.
    let mut got = sent.json().unwrap();
    let mut want: Value = serde_json::from_str(body).unwrap();
    assert_eq!(got["model"], "up-a");
    got.as_object_mut().unwrap().remove("model");
    want.as_object_mut().unwrap().remove("model");
    assert_eq!(got, want);

    assert_eq!(
        sent.header("anthropic-beta"),
        Some(beta),
        "the caller's betas"
    );
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        sent.header("x-api-key"),
        Some(PROVIDER_KEY),
        "the provider's key"
    );
    for (name, value) in &sent.headers {
        assert!(
            !value.contains(CALLER_KEY),
            "the caller's key reached the provider in {name}: {value}"
        );
    }
    assert!(sent.header("authorization").is_none(), "{:?}", sent.headers);

    // A caller that names no version gets signalbox's, upstream.
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CALLER_KEY)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sent = a.requests().pop().unwrap();
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert!(
        sent.header("anthropic-beta").is_none(),
        "{:?}",
        sent.headers
    );
    assert_eq!(String::from_utf8_lossy(&sent.body), expected);
}

// ---------------------------------------------------------------------------------------------
// 6. Cross-dialect: thinking is never forged, tool call ids are kept

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_history_reaches_an_anthropic_provider_without_forged_thinking() {
    let a = mock("a").await;
    let gw = start(one_model(&[("a", "anthropic", &a)], ""));
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    }]);
    let body = json!({
        "model": "m",
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": null,
                "reasoning_content": "UNSIGNED-REASONING: I should call the tool.",
                "tool_calls": [{
                    "id": "call_Abc-123_xyz",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}
                }]
            },
            {"role": "tool", "tool_call_id": "call_Abc-123_xyz", "content": "sunny, 21C"}
        ]
    });
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let v = json_of(r).await;
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["model"], "m", "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], REPLY, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");

    assert_eq!(a.calls_to(Endpoint::Messages), 1);
    let sent = a.requests().pop().unwrap();
    let raw = String::from_utf8_lossy(&sent.body).into_owned();
    let up = sent.json().unwrap();
    assert_eq!(up["model"], "up-a", "{up}");
    assert!(up["max_tokens"].is_u64(), "{up}");
    assert!(
        find_blocks(&up, &["thinking", "redacted_thinking"]).is_empty(),
        "no thinking block without Anthropic's signature: {up}"
    );
    assert!(!raw.contains("UNSIGNED-REASONING"), "{raw}");
    assert!(!raw.contains("signature"), "{raw}");
    let uses = find_blocks(&up, &["tool_use"]);
    assert_eq!(uses.len(), 1, "{up}");
    assert_eq!(
        uses[0]["id"], "call_Abc-123_xyz",
        "the id byte for byte: {up}"
    );
    assert_eq!(uses[0]["name"], "get_weather", "{up}");
    assert_eq!(uses[0]["input"], json!({"city": "Paris"}), "{up}");
    let results = find_blocks(&up, &["tool_result"]);
    assert_eq!(results.len(), 1, "{up}");
    assert_eq!(results[0]["tool_use_id"], "call_Abc-123_xyz", "{up}");
    assert!(
        results[0]["content"].to_string().contains("sunny, 21C"),
        "{up}"
    );
    // Anthropic's turn order: user, assistant (tool_use), user (tool_result).
    let roles: Vec<&str> = up["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{up}");
    assert_eq!(up["tools"][0]["name"], "get_weather", "{up}");
    assert_eq!(
        up["tools"][0]["input_schema"]["required"],
        json!(["city"]),
        "{up}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_thinking_blocks_in_a_chat_history_pass_as_they_were_signed() {
    // The counterpart: Anthropic's own signed block (LiteLLM's `thinking_blocks`) goes back.
    let a = mock("a").await;
    let gw = start(one_model(&[("a", "anthropic", &a)], ""));
    let body = json!({
        "model": "m",
        "reasoning_effort": "low",
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {
                "role": "assistant",
                "content": "4",
                "reasoning_content": "Add them.",
                "thinking_blocks": [{"type": "thinking", "thinking": "Add them.", "signature": "EqQBsig=="}]
            },
            {"role": "user", "content": "And 3+3?"}
        ]
    });
    let r = post_chat(&gw, &body).await;
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let up = a.requests().pop().unwrap().json().unwrap();
    let thinking = find_blocks(&up, &["thinking"]);
    assert_eq!(thinking.len(), 1, "{up}");
    assert_eq!(thinking[0]["signature"], "EqQBsig==", "{up}");
    assert_eq!(thinking[0]["thinking"], "Add them.", "{up}");
}

// ---------------------------------------------------------------------------------------------
// 7. response.provider_field

#[tokio::test(flavor = "multi_thread")]
async fn provider_field_names_the_serving_provider_in_every_object_and_chunk() {
    let (o, a) = (mock("o").await, mock("a").await);
    // On by default (seed 002); `provider_field: false` turns it off.
    for on in [true, false] {
        let extra = if on {
            ""
        } else {
            "response: { provider_field: false }\n"
        };
        let config = format!(
            "providers:\n{}{}models:\n{}{}{NO_BREAKERS}{extra}",
            provider_of("o", "openai", &o),
            provider_of("a", "anthropic", &a),
            model_on("gpt", "o"),
            model_on("claude", "a"),
        );
        let gw = start(config);
        let expect = |v: &Value, provider: &str, what: &str| {
            if on {
                assert_eq!(v["provider"], provider, "{what}: {v}");
            } else {
                assert!(v.get("provider").is_none(), "{what}: switched off: {v}");
            }
        };
        // JSON, both caller dialects, both provider kinds.
        for (model, provider) in [("gpt", "o"), ("claude", "a")] {
            let v = json_of(post_chat(&gw, &chat(model)).await).await;
            assert_eq!(v["model"], model, "{v}");
            expect(&v, provider, "chat JSON");
            let v = json_of(post_messages(&gw, &messages_body(model)).await).await;
            assert_eq!(v["type"], "message", "{v}");
            assert_eq!(v["model"], model, "{v}");
            expect(&v, provider, "messages JSON");
        }
        // Chat streams, same dialect and translated: every chunk.
        for (model, provider) in [("gpt", "o"), ("claude", "a")] {
            let mut body = chat(model);
            body["stream"] = json!(true);
            let r = post_chat(&gw, &body).await;
            assert_eq!(r.status(), 200);
            let (text, broken) = read_all(r).await;
            assert!(!broken, "{text}");
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            let chunks = chat_chunks(&text);
            assert!(chunks.len() >= 3, "{text}");
            for chunk in &chunks {
                assert_eq!(chunk["model"], model, "{chunk}");
                expect(chunk, provider, "chat chunk");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 8. Stream usage

#[tokio::test(flavor = "multi_thread")]
async fn stream_usage_is_asked_for_counted_and_stripped_unless_the_caller_asked() {
    let o = mock("o").await;
    let gw = start(one_model(&[("o", "openai", &o)], ""));
    let mut body = chat("m");
    body["stream"] = json!(true);
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 200);
    let (text, broken) = read_all(r).await;
    assert!(
        !broken && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    let sent = o.requests().pop().unwrap().json().unwrap();
    assert_eq!(
        sent["stream_options"]["include_usage"], true,
        "asked of the provider: {sent}"
    );
    let chunks = chat_chunks(&text);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, REPLY, "{text}");
    assert!(
        !chunks
            .iter()
            .any(|c| c["choices"].as_array().is_some_and(Vec::is_empty)),
        "no usage chunk the caller did not ask for: {text}"
    );
    assert!(
        chunks.iter().all(|c| c["usage"].is_null()),
        "no usage anywhere: {text}"
    );
    let line = format!(
        r#"signalbox_tokens_total{{provider="o",model="m",kind="completion"}} {REPLY_TOKENS}"#
    );
    let m = gw.metrics_with(&[&line]).await;
    assert!(
        m.contains(&format!("{line}\n")),
        "counted all the same: {m}"
    );
    assert!(
        m.contains(r#"signalbox_tokens_total{provider="o",model="m",kind="prompt"} "#),
        "{m}"
    );

    // The caller asks: the usage chunk is theirs.
    body["stream_options"] = json!({"include_usage": true});
    let r = post_chat(&gw, &body).await;
    let (text, _) = read_all(r).await;
    let sent = o.requests().pop().unwrap().json().unwrap();
    assert_eq!(
        sent["stream_options"],
        json!({"include_usage": true}),
        "{sent}"
    );
    let chunks = chat_chunks(&text);
    let last = chunks.last().unwrap();
    assert_eq!(
        last["choices"],
        json!([]),
        "the usage chunk comes last: {text}"
    );
    assert_eq!(last["usage"]["completion_tokens"], REPLY_TOKENS, "{text}");
    assert_eq!(last["model"], "m", "{text}");
    let line = format!(
        r#"signalbox_tokens_total{{provider="o",model="m",kind="completion"}} {}"#,
        2 * REPLY_TOKENS
    );
    let m = gw.metrics_with(&[&line]).await;
    assert!(m.contains(&format!("{line}\n")), "{m}");
}

// ---------------------------------------------------------------------------------------------
// 9. The stream contract in the Anthropic dialect

#[tokio::test(flavor = "multi_thread")]
async fn a_messages_stream_that_breaks_after_content_ends_with_an_error_event() {
    for kind in ["anthropic", "openai"] {
        let (a, b) = (mock("a").await, mock("b").await);
        let gw = start(one_model(
            &[("a", kind, &a), ("b", kind, &b)],
            "failover: { stream_idle_timeout: 500ms }\n",
        ));
        let cases = [
            ("dies", Behaviour::MidStreamDeath { after_chunks: 2 }),
            (
                "ends without its terminal event",
                Behaviour::NoTerminal { chunks: 2 },
            ),
            (
                "sends an error event",
                Behaviour::InbandErrorAfter {
                    chunks: 2,
                    error_type: None,
                },
            ),
            (
                "stalls",
                Behaviour::StallMidStream {
                    after_chunks: 2,
                    ms: 5_000,
                },
            ),
        ];
        for (n, (case, behaviour)) in (1..).zip(cases) {
            let what = format!("{kind}, {case}");
            a.push_script([behaviour]);
            let mut body = messages_body("m");
            body["stream"] = json!(true);
            let r = post_messages(&gw, &body).await;
            assert_eq!(r.status(), 200, "{what}");
            assert_eq!(header(&r, "x-llm-provider"), "a", "{what}");
            assert_eq!(header(&r, "x-llm-attempts"), "1", "{what}");
            assert!(
                header(&r, "content-type").starts_with("text/event-stream"),
                "{what}"
            );
            let (text, _) = read_all(r).await;
            let events = sse_events(&text);
            assert_eq!(events.first(), Some(&"message_start"), "{what}: {text}");
            assert!(
                events.contains(&"content_block_delta"),
                "{what}: the content before the break: {text}"
            );
            assert_eq!(events.last(), Some(&"error"), "{what}: {text}");
            assert_eq!(
                events.iter().filter(|e| **e == "error").count(),
                1,
                "{what}: one error event: {text}"
            );
            assert!(
                !text.contains("message_stop"),
                "{what}: never a clean end: {text}"
            );
            let error: Value = serde_json::from_str(sse_data(&text).last().unwrap())
                .unwrap_or_else(|e| panic!("{what}: the error event is not JSON ({e}): {text}"));
            assert_anthropic_error_envelope(&error);
            // Translated or not, the event is signalbox's: the provider's own error text
            // never reaches the caller.
            assert!(
                !text.contains("mock in-band error"),
                "{what}: signalbox's words, never the provider's: {text}"
            );
            assert!(
                text.trim_end().ends_with('}'),
                "{what}: the error event is the last thing: {text}"
            );
            let streamed: String = sse_data(&text)
                .iter()
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter(|v| v["type"] == "content_block_delta")
                .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
                .collect();
            assert!(
                !streamed.is_empty() && streamed != REPLY && REPLY.starts_with(&streamed),
                "{what}: what came before the break, and only that: {streamed:?}"
            );
            let line = format!(
                "signalbox_attempts_total{{provider=\"a\",outcome=\"stream_aborted\"}} {n}\n"
            );
            let m = gw.metrics_with(&[&line]).await;
            assert!(m.contains(&line), "{what}: {line} in {m}");
            assert_eq!(a.calls(), n, "{what}");
            assert_eq!(b.calls(), 0, "{what}: no attempt after the first byte");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_messages_field_chat_cannot_express_is_refused_in_anthropics_shape_or_skipped() {
    let (o, c) = (mock("o").await, mock("c").await);
    let config = format!(
        "providers:\n{}{}models:\n{}{}chains:\n  mix: [gpt, claude]\n{NO_BREAKERS}",
        provider_of("o", "openai", &o),
        provider_of("c", "anthropic", &c),
        model_on("gpt", "o"),
        model_on("claude", "c"),
    );
    let gw = start(config);
    let mut body = messages_body("gpt");
    body["top_k"] = json!(5);
    let r = post_messages(&gw, &body).await;
    let v = expect_anthropic_error(r, 400).await;
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`top_k`"),
        "names the field: {v}"
    );
    assert_eq!(o.calls(), 0, "no call to a provider that cannot take it");
    // In a chain, the Anthropic-kind model that can take it serves.
    body["model"] = json!("auto:mix");
    let r = post_messages(&gw, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    let v = json_of(r).await;
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["model"], "auto:mix", "{v}");
    assert_eq!(o.calls(), 0);
    let sent = c.requests().pop().unwrap().json().unwrap();
    assert_eq!(sent["top_k"], 5, "same dialect, as sent: {sent}");
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_and_version_headers_follow_the_providers_kind() {
    let (o, a) = (mock("o").await, mock("a").await);
    let config = format!(
        "providers:\n{}{}models:\n{}{}{NO_BREAKERS}",
        provider_of("o", "openai", &o),
        provider_of("a", "anthropic", &a),
        model_on("gpt", "o"),
        model_on("claude", "a"),
    );
    let gw = start(config);
    let no_caller_key = |sent: &signalbox_mock::RecordedRequest, what: &str| {
        for (name, value) in &sent.headers {
            assert!(
                !value.contains(CALLER_KEY),
                "{what}: the caller's key reached the provider in {name}"
            );
        }
    };

    // A chat caller, every client auth header set, an Anthropic-kind provider.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {CALLER_KEY}"))
        .header("x-api-key", CALLER_KEY)
        .header("api-key", CALLER_KEY)
        .header("anthropic-beta", "some-beta-2025-01-01")
        .json(&chat("claude"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    let sent = a.requests().pop().unwrap();
    assert_eq!(sent.endpoint, Endpoint::Messages);
    assert_eq!(sent.header("x-api-key"), Some(PROVIDER_KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert!(sent.header("authorization").is_none(), "{:?}", sent.headers);
    assert!(
        sent.header("anthropic-beta").is_none(),
        "a translated request is written for no beta: {:?}",
        sent.headers
    );
    no_caller_key(&sent, "chat → anthropic");

    // A messages caller, an OpenAI-kind provider.
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CALLER_KEY)
        .header("authorization", format!("Bearer {CALLER_KEY}"))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "some-beta-2025-01-01")
        .json(&messages_body("gpt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "o");
    let sent = o.requests().pop().unwrap();
    assert_eq!(sent.endpoint, Endpoint::ChatCompletions);
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    for name in [
        "x-api-key",
        "api-key",
        "anthropic-version",
        "anthropic-beta",
    ] {
        assert!(sent.header(name).is_none(), "{name}: {:?}", sent.headers);
    }
    no_caller_key(&sent, "messages → openai");

    // A messages caller that names no version: signalbox's goes upstream.
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CALLER_KEY)
        .json(&messages_body("claude"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sent = a.requests().pop().unwrap();
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("x-api-key"), Some(PROVIDER_KEY));
    no_caller_key(&sent, "messages → anthropic");
}

#[tokio::test(flavor = "multi_thread")]
async fn translated_and_legacy_streams_carry_usage_only_when_the_caller_asked() {
    let (o, a) = (mock("o").await, mock("a").await);
    let config = format!(
        "providers:\n{}{}models:\n{}{}{NO_BREAKERS}",
        provider_of("o", "openai", &o),
        provider_of("a", "anthropic", &a),
        model_on("gpt", "o"),
        model_on("claude", "a"),
    );
    let gw = start(config);

    // A chat stream translated from an Anthropic-kind provider.
    for (n, asks) in [(1u64, false), (2, true)] {
        let mut body = chat("claude");
        body["stream"] = json!(true);
        if asks {
            body["stream_options"] = json!({"include_usage": true});
        }
        let r = post_chat(&gw, &body).await;
        assert_eq!(header(&r, "x-llm-provider"), "a");
        let (text, broken) = read_all(r).await;
        assert!(
            !broken && text.trim_end().ends_with("data: [DONE]"),
            "{text}"
        );
        let chunks = chat_chunks(&text);
        let usage_chunks: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(Vec::is_empty))
            .collect();
        if asks {
            assert_eq!(usage_chunks.len(), 1, "{text}");
            assert_eq!(chunks.last(), Some(usage_chunks[0]), "last: {text}");
            assert_eq!(
                usage_chunks[0]["usage"]["completion_tokens"], REPLY_TOKENS,
                "{text}"
            );
        } else {
            assert!(usage_chunks.is_empty(), "{text}");
            assert!(chunks.iter().all(|c| c["usage"].is_null()), "{text}");
        }
        let line = format!(
            r#"signalbox_tokens_total{{provider="a",model="claude",kind="completion"}} {}"#,
            n * REPLY_TOKENS
        );
        let m = gw.metrics_with(&[&line]).await;
        assert!(m.contains(&format!("{line}\n")), "{m}");
    }

    // Legacy completions: asked for on the caller's behalf, stripped.
    let r = client()
        .post(gw.url("/v1/completions"))
        .json(&json!({"model": "gpt", "prompt": "Say hello.", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (text, _) = read_all(r).await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let sent = o.requests().pop().unwrap();
    assert_eq!(sent.endpoint, Endpoint::Completions);
    assert_eq!(
        sent.json().unwrap()["stream_options"]["include_usage"],
        true
    );
    let chunks = chat_chunks(&text);
    assert!(
        !chunks
            .iter()
            .any(|c| c["choices"].as_array().is_some_and(Vec::is_empty)),
        "{text}"
    );
    let line = format!(
        r#"signalbox_tokens_total{{provider="o",model="gpt",kind="completion"}} {REPLY_TOKENS}"#
    );
    let m = gw.metrics_with(&[&line]).await;
    assert!(m.contains(&format!("{line}\n")), "{m}");

    // A messages stream from an OpenAI-kind provider: Anthropic streams always carry usage.
    let mut body = messages_body("gpt");
    body["stream"] = json!(true);
    let r = post_messages(&gw, &body).await;
    assert_eq!(header(&r, "x-llm-provider"), "o");
    let (text, _) = read_all(r).await;
    let sent = o.requests().pop().unwrap().json().unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    let events = sse_events(&text);
    assert_eq!(events.last(), Some(&"message_stop"), "{text}");
    let delta: Value = sse_data(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "message_delta")
        .unwrap_or_else(|| panic!("no message_delta: {text}"));
    assert_eq!(delta["usage"]["output_tokens"], REPLY_TOKENS, "{text}");
    let line = format!(
        r#"signalbox_tokens_total{{provider="o",model="gpt",kind="completion"}} {}"#,
        2 * REPLY_TOKENS
    );
    let m = gw.metrics_with(&[&line]).await;
    assert!(m.contains(&format!("{line}\n")), "{m}");
}

/// Claude Code on an OpenAI-kind backend: its request (a system message between turns,
/// adaptive thinking, context management, an output effort, a model name of its own mapped by
/// a glob alias) is served, streamed in Anthropic's events, after a failover.
#[tokio::test(flavor = "multi_thread")]
async fn a_claude_code_request_is_served_by_an_openai_kind_model() {
    let down = mock("down").await;
    down.set_default(status(503));
    let o = mock("o").await;
    let gw = start(format!(
        "{}aliases:\n  \"claude-opus-*\": m\n",
        one_model(&[("down", "openai", &down), ("o", "openai", &o)], "")
    ));
    let body = json!({
        "model": "claude-opus-4-8",
        "max_tokens": 32000,
        "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the bug.", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "The user switched to plan mode."},
            {"role": "user", "content": "Go on."}
        ],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "user_abc"}
    });
    let r = post_anthropic(&gw, "/v1/messages", body.to_string()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "o");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    let (text, broken) = read_all(r).await;
    assert!(!broken && text.contains("event: message_stop"), "{text}");
    assert!(text.contains("\"model\":\"claude-opus-4-8\""), "{text}");
    let sent = o.requests().pop().unwrap().json().unwrap();
    let roles: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "system", "user"]);
    assert_eq!(sent["reasoning_effort"], "high");
    assert!(sent.get("context_management").is_none());
}
