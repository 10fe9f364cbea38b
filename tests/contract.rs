//! The caller contract (DESIGN §6): routing headers, the error shape and codes, no secret or
//! upstream detail in responses, logs or metrics, and the metrics themselves.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use signalbox_mock::MockHandle;

fn config(a: &MockHandle, b: &MockHandle) -> String {
    format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", priority: 1, credentials: [{{ id: main, key_env: CANARY_KEY }}] }}\n{}\
models:\n  gpt-4o-mini:\n    deployments:\n      - {{ provider: a, model: gpt-4o-mini-2024, price: {{ input_per_mtok: 0.15, output_per_mtok: 0.6 }} }}\n      - {{ provider: b, model: llama-8b }}\n  lonely: {{ enabled: false, deployments: [{{ provider: b, model: x }}] }}\n\
aliases: {{ fast: gpt-4o-mini }}\nchains: {{ default: [fast], empty: [lonely] }}\nactive_chain: default\n",
        a.base_url(),
        provider("b", b).replace("}\n", ", priority: 2 }\n"),
    )
}

const CANARY: &str = "sk-canary-7f3a9c1e5b";

fn start(a: &MockHandle, b: &MockHandle) -> Gateway {
    GatewayBuilder::new(config(a, b))
        .env("CANARY_KEY", CANARY)
        .start()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_proxied_response_carries_the_routing_headers() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b);
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-routed-via"), "a/gpt-4o-mini-2024");
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-model"), "gpt-4o-mini");
    assert_eq!(header(&r, "x-llm-route"), "chain:default");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    assert_eq!(header(&r, "x-llm-fallback"), "false");
    let reason = header(&r, "x-llm-routing-reason");
    assert!(
        reason.starts_with("strategy=chain selected=a priority=1 cost_micro="),
        "{reason}"
    );
    assert!(reason.ends_with("healthy=true fallbacks=b"), "{reason}");
    let id = header(&r, "x-request-id").to_string();
    assert_eq!(id.len(), 32);
    let timing = header(&r, "server-timing");
    let parts: Vec<&str> = timing.split(", ").collect();
    assert_eq!(parts.len(), 3, "{timing}");
    for (part, name) in parts.iter().zip(["gateway", "upstream", "total"]) {
        let dur = part
            .strip_prefix(&format!("{name};dur="))
            .unwrap_or_else(|| panic!("{timing}"));
        assert!(dur.parse::<f64>().is_ok(), "{timing}");
    }
    // Whole milliseconds, and never more than the total the timing header states.
    let total: f64 = parts[2]
        .strip_prefix("total;dur=")
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{timing}"));
    let duration: u64 = header(&r, "x-llm-response-duration-ms")
        .parse()
        .expect("whole milliseconds");
    assert!(duration as f64 <= total + 1.0, "{duration} vs {timing}");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["model"], "auto");
    // The upstream saw our request id, not another.
    assert_eq!(a.requests()[0].header("x-request-id"), Some(id.as_str()));
    let r2 = post_chat(&gw, &chat("auto")).await;
    assert_ne!(header(&r2, "x-request-id"), id);
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_have_the_openai_shape_and_stable_codes() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b);
    let c = client();
    let post = |body: &'static str| {
        c.post(gw.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    expect_error(
        post(r#"{"model": "nope", "messages": []}"#).await.unwrap(),
        400,
        "model_not_found",
    )
    .await;
    expect_error(
        post(r#"{"model": "auto:nope"}"#).await.unwrap(),
        400,
        "model_not_found",
    )
    .await;
    expect_error(
        post(r#"{"model": "auto:empty"}"#).await.unwrap(),
        400,
        "chain_empty",
    )
    .await;
    expect_error(
        post(r#"{"model": "lonely"}"#).await.unwrap(),
        400,
        "model_not_found",
    )
    .await;
    expect_error(
        post(r#"{"model": "fast", "messages": [}"#).await.unwrap(),
        400,
        "invalid_request",
    )
    .await;
    expect_error(
        post(r#"{"messages": []}"#).await.unwrap(),
        400,
        "invalid_request",
    )
    .await;
    expect_error(
        post(r#"{"model": 12}"#).await.unwrap(),
        400,
        "invalid_request",
    )
    .await;
    expect_error(post("").await.unwrap(), 400, "invalid_request").await;
    let r = c.get(gw.url("/v1/chat/completions")).send().await.unwrap();
    expect_error(r, 405, "method_not_allowed").await;
    let r = c.post(gw.url("/v2/other")).body("{}").send().await.unwrap();
    assert!(!header(&r, "x-request-id").is_empty());
    expect_error(r, 404, "not_found").await;
    assert_eq!(
        a.calls() + b.calls(),
        0,
        "no bad request reached a provider"
    );

    // The caller's unknown model name is echoed only when printable.
    let r = post(r#"{"model": "bad\u0001name"}"#).await.unwrap();
    let v = expect_error(r, 400, "model_not_found").await;
    assert!(!v.to_string().contains("\\u0001"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn models_list_names_what_callers_may_send() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b);
    let v: serde_json::Value = get_json(&gw, "/v1/models").await;
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for id in ["gpt-4o-mini", "fast", "auto:default", "auto"] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    assert!(
        !ids.contains(&"lonely"),
        "disabled models are not advertised"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_or_upstream_detail_leaks_anywhere() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b);
    let c = client();
    let mut seen = String::new();
    async fn record(seen: &mut String, r: reqwest::Response) {
        for (k, v) in r.headers() {
            seen.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("")));
        }
        seen.push_str(&r.text().await.unwrap());
    }
    // The mock's error bodies echo the credential it received and its own address.
    a.set_default(status(401));
    record(&mut seen, post_chat(&gw, &chat("fast")).await).await;
    // Everything fails: the final error must not carry upstream text either.
    b.set_default(status(500));
    for model in ["fast", "gpt-4o-mini", "auto"] {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .header("authorization", "Bearer client-canary-key")
            .json(&serde_json::json!({"model": model, "stream": true}))
            .send()
            .await
            .unwrap();
        record(&mut seen, r).await;
    }
    // A relayed caller error, whose upstream body also echoes the key.
    a.set_default(status(400));
    record(&mut seen, post_chat(&gw, &chat("fast")).await).await;

    // The upstream really did receive the canary (so the test would catch a leak).
    assert!(a
        .requests()
        .iter()
        .all(|r| r.header("authorization") == Some(&format!("Bearer {CANARY}"))));
    assert!(a.requests().iter().all(|r| !r
        .headers
        .iter()
        .any(|(_, v)| v.contains("client-canary-key"))));

    let metrics = gw.metrics().await;
    let logs = gw.stderr_with("route=alias:fast").await;
    assert!(logs.contains("access"), "the access log is on: {logs}");
    for (what, text) in [("responses", &seen), ("metrics", &metrics), ("logs", &logs)] {
        assert!(
            !text.contains(CANARY),
            "the provider key leaked into {what}"
        );
        assert!(
            !text.contains("client-canary-key"),
            "the client key leaked into {what}"
        );
        assert!(
            !text.contains("mock failure"),
            "upstream error text leaked into {what}"
        );
        for m in [&a, &b] {
            let port = format!(":{}", m.addr().port());
            assert!(
                !text.contains(&port),
                "a provider address leaked into {what}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_describe_every_decision() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b);
    post_chat(&gw, &chat("fast")).await.text().await.unwrap();
    a.set_default(status(503));
    post_chat(&gw, &chat("auto")).await.text().await.unwrap();
    post_chat(&gw, &chat("no-such-model"))
        .await
        .text()
        .await
        .unwrap();
    let expected = [
        r#"signalbox_requests_total{route="alias:fast",provider="a",status_class="2xx"} 1"#,
        r#"signalbox_requests_total{route="chain:default",provider="b",status_class="2xx"} 1"#,
        r#"signalbox_requests_total{route="unresolved",provider="none",status_class="4xx"} 1"#,
        r#"signalbox_attempts_total{provider="a",outcome="ok"} 1"#,
        r#"signalbox_attempts_total{provider="a",outcome="server_error"} 1"#,
        r#"signalbox_attempts_total{provider="b",outcome="ok"} 1"#,
        r#"signalbox_failovers_total{provider="a",reason="server_error"} 1"#,
        r#"signalbox_upstream_ttfb_seconds_count{provider="a"} 2"#,
        r#"signalbox_upstream_latency_seconds_count{provider="b"} 1"#,
        "signalbox_requests_in_flight 0",
    ];
    let m = gw.metrics_with(&expected).await;
    for line in expected {
        assert!(m.contains(line), "missing {line} in\n{m}");
    }
    assert!(
        !m.contains("no-such-model"),
        "raw client strings never become labels"
    );
}

/// `x-llm-response-duration-ms` (seed 004): from the request's arrival to the answer's header,
/// the failed attempts included — a fast failure then a 300 ms answer is at least 300 ms, whole
/// or streamed (a stream's header goes out with its first content, after the hold).
#[tokio::test(flavor = "multi_thread")]
async fn the_response_duration_covers_every_attempt() {
    let failing = mock("failing").await;
    failing.set_default(signalbox_mock::Behaviour::Status {
        code: 500,
        retry_after: None,
        body: None,
    });
    let slow = mock("slow").await;
    slow.set_default(signalbox_mock::Behaviour::SlowHeader { ms: 300 });
    let gw = Gateway::start(format!(
        "providers:\n{}{}models:\n  m: {{ deployments: [{{ provider: f, model: up }}, {{ provider: s, model: up }}] }}\n",
        provider("f", &failing).replace("}\n", ", priority: 1 }\n"),
        provider("s", &slow).replace("}\n", ", priority: 2 }\n"),
    ));
    for stream in [false, true] {
        let mut body = chat("m");
        body["stream"] = serde_json::json!(stream);
        let r = post_chat(&gw, &body).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-llm-attempts"), "2");
        let ms: u64 = header(&r, "x-llm-response-duration-ms").parse().unwrap();
        assert!((300..5_000).contains(&ms), "stream {stream}: {ms} ms");
        let (text, broken) = read_all(r).await;
        assert!(!broken, "{text}");
    }
}
