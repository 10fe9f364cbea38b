//! Headers both ways over sockets, with canaries: a provider's headers (its credential echoed,
//! cookies, its rate-limit quota on the gateway's key, `server`, `location`) never reach the
//! caller unless `response.pass_headers` names them; a caller's headers (its organisation,
//! cookies, a user agent, signalbox's own `x-llm-*`) never reach a provider unless
//! `request.pass_headers` names them, and a credential header never does. A caller's
//! `x-request-id` is the request's id on both sides.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use signalbox_mock::MockHandle;

const PROVIDER_KEY: &str = "sk-canary-provider-7f3a";

/// A mock that demands the gateway's key and answers with every header a provider (or a proxy
/// in front of it) might add, the key itself among them.
async fn leaky(name: &str) -> MockHandle {
    mock_with(name, |c| {
        c.api_key = Some(PROVIDER_KEY.into());
        c.response_headers = vec![
            ("x-echo-auth".into(), format!("Bearer {PROVIDER_KEY}")),
            ("set-cookie".into(), "session=provider".into()),
            ("server".into(), "provider-edge/1.2".into()),
            ("location".into(), "http://10.0.0.7/internal".into()),
            ("x-ratelimit-remaining-requests".into(), "4999".into()),
            ("x-ratelimit-limit-tokens".into(), "2000000".into()),
            ("openai-processing-ms".into(), "12".into()),
            ("openai-organization".into(), "org-gateway".into()),
            ("retry-after".into(), "7".into()),
            ("cache-control".into(), "no-store".into()),
        ];
    })
    .await
}

fn config(m: &MockHandle, kind: &str, provider_extra: &str, extra: &str) -> String {
    format!(
        "providers:\n  a: {{ kind: {kind}, base_url: \"{}\", credentials: [{{ id: k, key_env: SB_TEST_PROVIDER_KEY }}]{provider_extra} }}\nmodels:\n  m: {{ deployments: [{{ provider: a, model: up }}] }}\n{extra}",
        m.base_url()
    )
}

fn start(cfg: String) -> Gateway {
    GatewayBuilder::new(cfg)
        .env("SB_TEST_PROVIDER_KEY", PROVIDER_KEY)
        .start()
}

/// The provider's canaries that must never reach a caller by default.
const PROVIDER_ONLY: [&str; 9] = [
    "x-echo-auth",
    "set-cookie",
    "server",
    "location",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-tokens",
    "openai-processing-ms",
    "openai-organization",
    "cache-control",
];

fn assert_no_provider_headers(r: &reqwest::Response) {
    for name in PROVIDER_ONLY {
        assert!(
            r.headers().get(name).is_none(),
            "{name} reached the caller: {:?}",
            r.headers()
        );
    }
    assert!(
        r.headers().get("retry-after").is_none(),
        "a provider's Retry-After on a 200"
    );
    for (name, value) in r.headers() {
        let v = value.to_str().unwrap_or_default();
        assert!(
            !v.contains(PROVIDER_KEY),
            "{name} carries the provider's key"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_headers_never_reach_the_caller_json_or_stream() {
    let a = leaky("a").await;
    let gw = start(config(&a, "openai", "", ""));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_no_provider_headers(&r);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert!(header(&r, "content-type").starts_with("application/json"));
    assert!(!r.text().await.unwrap().contains(PROVIDER_KEY));

    let mut body = chat("m");
    body["stream"] = json!(true);
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 200);
    assert_no_provider_headers(&r);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    let (text, broken) = read_all(r).await;
    assert!(!broken && text.contains("[DONE]"), "{text}");
    assert_eq!(a.calls(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn pass_headers_name_the_provider_headers_a_caller_may_see() {
    let a = leaky("a").await;
    let gw = start(config(
        &a,
        "openai",
        "",
        "response: { pass_headers: [\"x-ratelimit-*\", Cache-Control] }\n",
    ));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), "4999");
    assert_eq!(header(&r, "x-ratelimit-limit-tokens"), "2000000");
    assert_eq!(header(&r, "cache-control"), "no-store");
    for name in ["x-echo-auth", "set-cookie", "server", "location"] {
        assert!(r.headers().get(name).is_none(), "{name} passed");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relayed_refusal_carries_only_signalboxs_headers() {
    let a = leaky("a").await;
    a.set_default(status(400));
    let gw = start(config(&a, "openai", "", ""));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 400);
    assert_no_provider_headers(&r);
    assert!(!r.text().await.unwrap().contains(PROVIDER_KEY));
}

/// Every header a caller might send that must not reach a provider of either kind.
const CALLER_ONLY: [(&str, &str); 9] = [
    ("openai-organization", "org-caller"),
    ("openai-project", "proj-caller"),
    ("cookie", "caller=1"),
    ("user-agent", "caller-sdk/9"),
    ("x-custom-trace", "trace-canary"),
    ("x-llm-metadata", "{\"team\":\"ads\"}"),
    ("proxy-authorization", "Basic Y2FsbGVyOnB3"),
    ("api-key", "caller-azure-key"),
    ("x-forwarded-for", "10.1.2.3"),
];

fn with_caller_headers(rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    CALLER_ONLY
        .iter()
        .fold(rb, |rb, (k, v)| rb.header(*k, *v))
        .header("authorization", "Bearer caller-own-key")
        .header("openai-beta", "assistants=v2")
}

fn recorded_names(m: &MockHandle) -> Vec<String> {
    let reqs = m.requests();
    let last = reqs.last().expect("a call");
    last.headers.iter().map(|(k, _)| k.clone()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_callers_headers_never_reach_an_openai_kind_provider() {
    let a = leaky("a").await;
    let gw = start(config(
        &a,
        "openai",
        ", headers: { OpenAI-Organization: org-gateway, x-api-version: \"7\" }",
        "",
    ));
    let r = with_caller_headers(client().post(gw.url("/v1/chat/completions")))
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the provider took the gateway's key");
    let call = a.requests().pop().unwrap();
    assert_eq!(
        call.header("authorization"),
        Some(&*format!("Bearer {PROVIDER_KEY}"))
    );
    assert_eq!(call.header("openai-organization"), Some("org-gateway"));
    assert_eq!(call.header("x-api-version"), Some("7"));
    assert_eq!(call.header("openai-beta"), Some("assistants=v2"));
    for (name, value) in CALLER_ONLY {
        if name == "openai-organization" {
            continue; // the provider's own value, checked above
        }
        assert!(call.header(name).is_none(), "{name} reached the provider");
        assert!(
            !call.headers.iter().any(|(_, v)| v.contains(value)),
            "{value} reached the provider"
        );
    }
    let mut names = recorded_names(&a);
    names.sort();
    assert_eq!(
        names,
        [
            "accept",
            "authorization",
            "content-length",
            "content-type",
            "host",
            "openai-beta",
            "openai-organization",
            "x-api-version",
            "x-request-id"
        ],
        "nothing else of the caller's"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn request_pass_headers_forward_what_they_name_and_never_a_credential() {
    let a = leaky("a").await;
    let gw = start(config(
        &a,
        "openai",
        "",
        "request: { pass_headers: [\"x-custom-*\", \"*-for\", User-Agent] }\n",
    ));
    let r = with_caller_headers(client().post(gw.url("/v1/chat/completions")))
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let call = a.requests().pop().unwrap();
    assert_eq!(call.header("x-custom-trace"), Some("trace-canary"));
    assert_eq!(call.header("x-forwarded-for"), Some("10.1.2.3"));
    assert_eq!(call.header("user-agent"), Some("caller-sdk/9"));
    assert!(call.header("openai-organization").is_none());
    assert!(call.header("cookie").is_none());
    assert!(call.header("api-key").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anthropic_kind_provider_gets_its_version_and_a_same_dialect_callers_betas() {
    let a = mock_with("a", |c| c.api_key = Some(PROVIDER_KEY.into())).await;
    let gw = start(config(&a, "anthropic", "", ""));
    let body =
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let r = with_caller_headers(client().post(gw.url("/v1/messages")))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "tools-2024-04-04")
        .header("x-request-id", "caller-trace-42")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-request-id"), "caller-trace-42");
    assert_eq!(
        header(&r, "request-id"),
        "caller-trace-42",
        "Anthropic's own name"
    );
    let call = a.requests().pop().unwrap();
    assert_eq!(call.header("x-api-key"), Some(PROVIDER_KEY));
    assert_eq!(call.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(call.header("anthropic-beta"), Some("tools-2024-04-04"));
    assert_eq!(call.header("x-request-id"), Some("caller-trace-42"));
    assert!(call.header("openai-beta").is_none());
    assert!(call.header("authorization").is_none());
    for (name, _) in CALLER_ONLY {
        assert!(call.header(name).is_none(), "{name} reached the provider");
    }

    // An OpenAI caller translated to Anthropic: signalbox's version, no caller betas.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("anthropic-beta", "tools-2024-04-04")
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("request-id").is_none(), "OpenAI dialect");
    let call = a.requests().pop().unwrap();
    assert!(call.header("anthropic-version").is_some());
    assert!(call.header("anthropic-beta").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_callers_request_id_is_kept_and_an_unfit_one_replaced() {
    let a = mock("a").await;
    let gw = Gateway::start(format!(
        "providers:\n{}models:\n  m: {{ deployments: [{{ provider: a, model: up }}] }}\n",
        provider("a", &a)
    ));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "trace-0001")
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "x-request-id"), "trace-0001");
    assert_eq!(
        a.requests().pop().unwrap().header("x-request-id"),
        Some("trace-0001")
    );
    // Signalbox's own answers keep it too.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "trace-0002")
        .json(&chat("nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-request-id"), "trace-0002");
    let long = "x".repeat(129);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", &long)
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    let id = header(&r, "x-request-id");
    assert!(!id.is_empty() && id != long, "{id}");
    let v: Value = r.json().await.unwrap();
    assert!(v["choices"].is_array());
}
