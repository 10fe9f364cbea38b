//! Token estimates that read the request over sockets: an image counts by its formula, never
//! by its base64 bytes, so it neither breaks a context window nor a key's `tpm`, nor makes a
//! prompt complex; near a limit the prompt is counted exactly; a request whose estimate alone
//! exceeds a `tpm` is `413 tokens_exceed_limit` (waiting cannot help), in the caller's dialect.

#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine;
use common::*;
use serde_json::{json, Value};
use signalbox_mock::MockHandle;

const KEY: &str = "sk-estimates-client-0123456789";

/// A PNG of `w × h` as far as its header says, padded to `bytes` of file.
fn png_data_url(w: u32, h: u32, bytes: usize) -> String {
    let mut b = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[8, 6, 0, 0, 0]);
    b.resize(bytes, 0);
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(b)
    )
}

fn with_image(model: &str, url: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]
    })
}

fn config(m: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}models:\n  vision:\n    context_window: 128000\n    capabilities: [stream, tools, vision, json_mode]\n    deployments: [{{ provider: p, model: up-vision }}]\n  tiny:\n    context_window: 100\n    deployments: [{{ provider: p, model: gpt-4o-mini }}]\n  simple-one: {{ deployments: [{{ provider: p, model: up-simple }}] }}\n  complex-one: {{ deployments: [{{ provider: p, model: up-complex }}] }}\n\
         policies:\n  tiered: {{ select: [ {{ router: complexity, tiers: {{ simple: simple-one, medium: simple-one, complex: complex-one }} }} ] }}\n{extra}",
        provider("p", m)
    )
}

async fn post_key(gw: &Gateway, body: &Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .unwrap()
}

const OPEN_KEY: &str = "sk-estimates-open-9876543210";

async fn post_with_key(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_counts_by_its_formula_not_by_its_bytes() {
    let m = mock("p").await;
    let keys = format!(
        "keys:\n  - {{ id: k, key_sha256: \"{}\", tpm: 200000 }}\n  - {{ id: open, key_sha256: \"{}\" }}\n",
        sha256_hex(KEY.as_bytes()),
        sha256_hex(OPEN_KEY.as_bytes()),
    );
    let gw = Gateway::start(config(&m, &keys));
    // 1 MB of image under a 200,000 tpm key: a few hundred tokens, not 330,000 (admitted on
    // its estimate; the mock then reports a quarter of the bytes it received as usage).
    let huge = png_data_url(2048, 2048, 1_000_000);
    let r = post_key(&gw, &with_image("vision", &huge)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // 600 KB of image: as bytes / 4 it would be 200,000 tokens, over the 128,000 window.
    let big = png_data_url(1024, 1024, 600_000);
    let r = post_with_key(&gw, OPEN_KEY, &with_image("vision", &big)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // An image does not make a short prompt complex.
    let r = post_with_key(&gw, OPEN_KEY, &with_image("tiered", &huge)).await;
    assert_eq!(header(&r, "x-routed-via"), "p/up-simple");
    assert_eq!(m.calls(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn near_a_context_window_the_prompt_is_counted_exactly() {
    let m = mock("p").await;
    let gw = Gateway::start(config(&m, ""));
    // 70 × "hello " is 420 characters: estimated 105 tokens, over `tiny`'s 100; counted
    // exactly (o200k, as gpt-4o-mini) it is about 70, and fits.
    let text = "hello ".repeat(70);
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": text}]});
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Well over (no count can save it): skipped without a call.
    let text = "hello ".repeat(400);
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": text}]});
    let r = post_chat(&gw, &body).await;
    assert_eq!(r.status(), 503);
    assert_eq!(m.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_can_never_pass_is_413_without_retry_after() {
    let m = mock("p").await;
    let keys = format!(
        "keys:\n  - {{ id: k, key_sha256: \"{}\", tpm: 4000 }}\n",
        sha256_hex(KEY.as_bytes())
    );
    let gw = Gateway::start(config(&m, &keys));
    let mut body = chat("vision");
    body["max_tokens"] = json!(8192);
    let r = post_key(&gw, &body).await;
    assert!(r.headers().get("retry-after").is_none());
    expect_error(r, 413, "tokens_exceed_limit").await;
    // In the Anthropic caller's shape too.
    let r = client()
        .post(gw.url("/v1/messages"))
        .bearer_auth(KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "vision", "max_tokens": 8192, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");
    // A request the window can take is served, and the refusals consumed nothing.
    let r = post_key(&gw, &chat("vision")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(m.calls(), 1);

    // Every candidate's deployment tpm below the estimate: 413 as well.
    let m2 = mock("q").await;
    let gw = Gateway::start(format!(
        "providers:\n{}models:\n  small: {{ deployments: [{{ provider: q, model: up, tpm: 1000 }}] }}\n",
        provider("q", &m2)
    ));
    let mut body = chat("small");
    body["max_tokens"] = json!(5000);
    let r = post_chat(&gw, &body).await;
    assert!(r.headers().get("retry-after").is_none());
    expect_error(r, 413, "tokens_exceed_limit").await;
    assert_eq!(m2.calls(), 0);
}
