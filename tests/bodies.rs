//! Request bodies: any size up to the limit is forwarded and replayed on every attempt,
//! byte-identical but for the rewritten `model` and the stripped `routing`; headers are
//! rewritten per target.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use signalbox_mock::{Behaviour, MockHandle};

/// Model `m` on a, b, c in that order, all knowing it as `up-m`.
fn three(a: &MockHandle, b: &MockHandle, c: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}{}{}models:\n  m:\n    deployments: [{{ provider: a, model: up-m, priority: 1 }}, {{ provider: b, model: up-m, priority: 2 }}, {{ provider: c, model: up-m, priority: 3 }}]\n{extra}",
        provider("a", a),
        provider("b", b),
        provider("c", c),
    )
}

/// A chat body of about `size` bytes; `model` first so the rewrite is easy to predict.
fn big_body(model: &str, size: usize) -> String {
    let filler: String = "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(size)
        .collect();
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{filler}"}}],"temperature":0.2}}"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn one_mib_body_is_replayed_byte_identical_across_two_failovers() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    a.set_default(status(503));
    b.set_default(Behaviour::Reset);
    let gw = Gateway::start(three(&a, &b, &c, ""));
    let body = big_body("m", 1 << 20);
    let expected = sha256_hex(
        body.replacen(r#""model":"m""#, r#""model":"up-m""#, 1)
            .as_bytes(),
    );
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-attempts"), "3");
    assert_eq!(header(&r, "x-llm-provider"), "c");
    for m in [&a, &b, &c] {
        let reqs = m.requests();
        assert_eq!(reqs.len(), 1, "{}", m.name());
        assert_eq!(reqs[0].body_len, body.len() + 3, "{}", m.name());
        assert_eq!(
            reqs[0].body_sha256,
            expected,
            "{} got different bytes",
            m.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_with_expect_100_continue_and_failover() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    a.set_default(status(502));
    let gw = Gateway::start(three(&a, &b, &c, ""));
    let body = big_body("m", 2 << 20);
    let path = gw.config_dir().join("body.json");
    std::fs::write(&path, &body).unwrap();
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "-i",
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
        ])
        .arg(format!("@{}", path.display()))
        .arg(gw.url("/v1/chat/completions"))
        .output()
        .expect("curl is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("HTTP/1.1 100 Continue"),
        "curl saw: {}",
        &text[..text.len().min(300)]
    );
    assert!(text.contains("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("x-llm-attempts: 2"),
        "{text}"
    );
    let expected = sha256_hex(
        body.replacen(r#""model":"m""#, r#""model":"up-m""#, 1)
            .as_bytes(),
    );
    assert_eq!(a.calls(), 1);
    assert_eq!(b.requests()[0].body_sha256, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_bodies_of_any_size_fail_over_byte_identical() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    a.set_default(status(503));
    let gw = Gateway::start(three(&a, &b, &c, ""));
    let chunked = |body: String| {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body
            .into_bytes()
            .chunks(4096)
            .map(|c| Ok(c.to_vec()))
            .collect();
        reqwest::Body::wrap_stream(futures_stream(chunks))
    };
    let small = big_body("m", 40 << 10);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .body(chunked(small.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let expected = sha256_hex(
        small
            .replacen(r#""model":"m""#, r#""model":"up-m""#, 1)
            .as_bytes(),
    );
    assert_eq!(b.requests()[0].body_sha256, expected);
    assert!(b.requests()[0].header("transfer-encoding").is_none());

    // Over Pingora's 64 KiB retry buffer: the hold path sends the body itself, on every
    // attempt. 1 MiB, failed over twice.
    b.push_script([status(503)]);
    let large = big_body("m", 1 << 20);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .body(chunked(large.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-attempts"), "3");
    let expected = sha256_hex(
        large
            .replacen(r#""model":"m""#, r#""model":"up-m""#, 1)
            .as_bytes(),
    );
    for (name, m) in [("a", &a), ("b", &b), ("c", &c)] {
        let last = m.requests().last().cloned().unwrap();
        assert_eq!(last.body_sha256, expected, "{name} got the whole body");
        assert!(last.header("transfer-encoding").is_none());
    }
}

fn futures_stream(
    chunks: Vec<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    struct Iter(std::vec::IntoIter<Result<Vec<u8>, std::io::Error>>);
    impl futures_core::Stream for Iter {
        type Item = Result<Vec<u8>, std::io::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
    Iter(chunks.into_iter())
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_over_the_limit_get_413_without_an_upstream_call() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    let gw = Gateway::start(three(&a, &b, &c, "limits: { max_request_body: 256KiB }\n"));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .body(big_body("m", 300 << 10))
        .send()
        .await
        .unwrap();
    expect_error(r, 413, "request_too_large").await;
    // Just under the limit passes.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .body(big_body("m", 200 << 10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(a.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn each_attempt_is_rewritten_for_its_target() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(status(500));
    let text = format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", priority: 1, credentials: [{{ id: k, key_env: TEST_KEY_A }}] }}\n  b: {{ kind: openai, base_url: \"http://{}/custom/prefix/\", priority: 2, credentials: [{{ id: k, key_env: TEST_KEY_B }}] }}\nmodels:\n  m: {{ deployments: [{{ provider: a, model: alpha-1 }}, {{ provider: b, model: beta-2 }}] }}\naliases: {{ fast: m }}\n",
        a.base_url(),
        b.addr(),
    );
    let gw = GatewayBuilder::new(text)
        .env("TEST_KEY_A", "sk-provider-a")
        .env("TEST_KEY_B", "sk-provider-b")
        .start();
    let body = r#"{"routing": {"providers": ["a", "b"]}, "model": "FAST", "messages": [{"role": "user", "content": "hi"}], "stream": false}"#;
    let r = client()
        .post(gw.url("/v1/chat/completions?debug=1"))
        .header("authorization", "Bearer client-key")
        .header("x-api-key", "client-key-2")
        .header("api-key", "client-key-3")
        .header("x-llm-metadata", r#"{"team":"search"}"#)
        .header("x-llm-router", "off")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-route"), "alias:fast");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["model"], "FAST", "the caller's spelling comes back");

    let ra = &a.requests()[0];
    assert_eq!(ra.path, "/v1/chat/completions");
    assert_eq!(ra.header("host"), Some(a.addr().to_string().as_str()));
    assert_eq!(ra.header("authorization"), Some("Bearer sk-provider-a"));
    assert_eq!(ra.model.as_deref(), Some("alpha-1"));
    let rb = &b.requests()[0];
    assert_eq!(rb.path, "/custom/prefix/chat/completions");
    assert_eq!(rb.header("authorization"), Some("Bearer sk-provider-b"));
    assert_eq!(rb.model.as_deref(), Some("beta-2"));
    for r in [ra, rb] {
        assert!(r.header("x-api-key").is_none());
        assert!(r.header("api-key").is_none());
        assert!(r.header("x-llm-metadata").is_none());
        assert!(r.header("x-llm-router").is_none());
        assert!(r.header("expect").is_none());
    }
    let expected_b =
        r#"{"model": "beta-2", "messages": [{"role": "user", "content": "hi"}], "stream": false}"#;
    assert_eq!(
        rb.body_sha256,
        sha256_hex(expected_b.as_bytes()),
        "routing stripped, nothing else touched"
    );
    assert_eq!(rb.body_len, expected_b.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_override_narrows_the_plan() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    let gw = Gateway::start(three(&a, &b, &c, ""));
    let body = serde_json::json!({"model": "m", "messages": [], "routing": {"providers": ["c"]}});
    let r = post_chat(&gw, &body).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!((a.calls(), b.calls(), c.calls()), (0, 0, 1));
    let bad = serde_json::json!({"model": "m", "routing": {"providers": ["nope"]}});
    expect_error(post_chat(&gw, &bad).await, 400, "invalid_request").await;
    let bad = serde_json::json!({"model": "m", "routing": {"colour": "red"}});
    expect_error(post_chat(&gw, &bad).await, 400, "invalid_request").await;
}
