//! Policies, rules, eligibility and explain over real sockets: every router kind, spill-over,
//! on_failure, the precedence of what a request names, the headers and metrics that say what
//! happened, the reasons a candidate was skipped, and explain agreeing with the proxy.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use signalbox_mock::MockHandle;

/// Four providers a..d, one model each (`ma`..`md`), and `extra` YAML (policies, rules).
fn four(m: &[MockHandle; 4], models_extra: &str, extra: &str) -> String {
    format!(
        "providers:\n{}{}{}{}models:\n  ma: {{ capability: 1, deployments: [{{ provider: a, model: up-a }}] }}\n  mb: {{ capability: 2, deployments: [{{ provider: b, model: up-b }}] }}\n  mc: {{ capability: 3, deployments: [{{ provider: c, model: up-c }}] }}\n  md: {{ capability: 4, deployments: [{{ provider: d, model: up-d }}] }}\n{models_extra}{extra}health: {{ failure_threshold: 0 }}\n",
        provider("a", &m[0]),
        provider("b", &m[1]),
        provider("c", &m[2]),
        provider("d", &m[3]),
    )
}

async fn mocks() -> [MockHandle; 4] {
    [
        mock("a").await,
        mock("b").await,
        mock("c").await,
        mock("d").await,
    ]
}

async fn post_with(
    gw: &Gateway,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut r = client().post(gw.url("/v1/chat/completions")).json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

async fn explain(
    gw: &Gateway,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> serde_json::Value {
    let mut r = client()
        .post(format!("http://{}/admin/explain", gw.admin))
        .json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn weighted_splits_seven_to_three_over_two_thousand_requests() {
    let m = mocks().await;
    let policies = "policies:\n  canary:\n    select:\n      - router: weighted\n        targets: [ { model: ma, weight: 7 }, { model: mb, weight: 3 } ]\n";
    let gw = Arc::new(Gateway::start(four(&m, "", policies)));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut counts = HashMap::new();
            for _ in 0..250 {
                let r = c
                    .post(gw.url("/v1/chat/completions"))
                    .json(&chat("canary"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                assert_eq!(header(&r, "x-llm-route"), "policy:canary");
                assert_eq!(header(&r, "x-llm-fallback"), "false");
                *counts
                    .entry(header(&r, "x-llm-provider").to_string())
                    .or_insert(0) += 1;
            }
            counts
        }));
    }
    let mut total: HashMap<String, u32> = HashMap::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            *total.entry(k).or_insert(0) += v;
        }
    }
    let a = f64::from(total.get("a").copied().unwrap_or(0)) / 2000.0;
    assert!(
        (a - 0.7).abs() < 0.04,
        "a served {a} of the requests: {total:?}"
    );
    assert_eq!(total.values().sum::<u32>(), 2000);
    // x-llm-router: off takes the targets in the order written: always a.
    for _ in 0..10 {
        let r = post_with(&gw, &chat("canary"), &[("x-llm-router", "off")]).await;
        assert_eq!(header(&r, "x-llm-provider"), "a");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn priority_spills_over_a_full_rpm_window_without_calling_it() {
    let m = mocks().await;
    let text = four(&m, "", "policies:\n  spill:\n    select: [ { router: priority, targets: [ { model: ma }, { model: mb } ] } ]\n")
        .replace("model: up-a }", "model: up-a, rpm: 3 }");
    let gw = Gateway::start(text);
    for i in 0..6 {
        let r = post_chat(&gw, &chat("spill")).await;
        assert_eq!(r.status(), 200);
        let (provider, fallback) = (header(&r, "x-llm-provider"), header(&r, "x-llm-fallback"));
        if i < 3 {
            assert_eq!((provider, fallback), ("a", "false"), "request {i}");
        } else {
            assert_eq!(
                (provider, fallback),
                ("b", "true"),
                "request {i}: a is full"
            );
            assert_eq!(
                header(&r, "x-llm-attempts"),
                "1",
                "the full target is not called"
            );
        }
    }
    assert_eq!((m[0].calls(), m[1].calls()), (3, 3));
    // Explain shows it skipped, and why.
    let v = explain(&gw, &chat("spill"), &[]).await;
    let a = &v["candidates"][0];
    assert_eq!(a["candidate"], "a/up-a", "{v:#}");
    assert_eq!(a["skipped"], "rpm_full", "{v:#}");
    assert_eq!(a["limit"], serde_json::json!({ "rpm": 3 }), "{v:#}");
    assert!(v["candidates"][1]["limit"].is_null(), "{v:#}");
    let metrics = gw
        .metrics_with(&[
            r#"signalbox_skipped_candidates_total{reason="rpm_full"} 3"#,
            r#"signalbox_rate_limit_full_total{model="ma"} 3"#,
        ])
        .await;
    assert!(
        metrics.contains(r#"signalbox_skipped_candidates_total{reason="rpm_full"} 3"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"signalbox_rate_limit_full_total{model="ma"} 3"#),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"signalbox_rate_limit_full_total{model="mb"}"#),
        "{metrics}"
    );
    // Every candidate full: 429 with the time the window frees.
    let only_a = four(&m, "", "").replace("model: up-a }", "model: up-a, rpm: 1 }");
    let gw = Gateway::start(only_a);
    assert_eq!(post_chat(&gw, &chat("ma")).await.status(), 200);
    let r = post_chat(&gw, &chat("ma")).await;
    let retry_after: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    expect_error(r, 429, "rate_limited").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn complexity_sends_each_tier_to_its_model() {
    let m = mocks().await;
    let gw = Gateway::start(four(
        &m,
        "",
        "policies:\n  tiered:\n    select: [ { router: complexity, tiers: { simple: ma, medium: mb, complex: mc } } ]\n",
    ));
    let simple = chat("tiered");
    let mut medium = chat("tiered");
    medium["messages"][0]["content"] = serde_json::json!("Fix this:\n```rust\nfn main() {}\n```");
    let mut complex = medium.clone();
    complex["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    complex["messages"][0]["content"] =
        serde_json::json!(format!("{}\n```\ncode\n```", "word ".repeat(3000)));
    for (body, provider, tier) in [
        (simple, "a", "simple"),
        (medium, "b", "medium"),
        (complex, "c", "complex"),
    ] {
        let r = post_chat(&gw, &body).await;
        assert_eq!(header(&r, "x-llm-provider"), provider, "{tier}");
        let v = explain(&gw, &body, &[]).await;
        assert_eq!(v["via"]["pick"]["tier"], tier, "{v:#}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn on_failure_serves_when_every_selected_target_fails() {
    let m = mocks().await;
    m[0].set_default(status(503));
    m[1].set_default(status(500));
    let gw = Gateway::start(four(
        &m,
        "",
        "policies:\n  support:\n    select: [ { router: priority, targets: [ { model: ma }, { model: mb } ] } ]\n    on_failure: [ mc, md ]\n",
    ));
    let r = post_chat(&gw, &chat("support")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(header(&r, "x-llm-attempts"), "3");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    let reason = header(&r, "x-llm-routing-reason");
    assert!(reason.contains(" policy=support entry=0"), "{reason}");
    assert_eq!(
        m.iter().map(MockHandle::calls).collect::<Vec<_>>(),
        [1, 1, 1, 0]
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["model"], "support", "the policy's name comes back");
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_limits_and_client_errors() {
    let m = mocks().await;
    m[0].set_default(status(400));
    m[1].set_default(status(503));
    let gw = Gateway::start(four(
        &m,
        "",
        "policies:\n  lenient:\n    select: [ { router: priority, targets: [ { model: ma }, { model: mb }, { model: mc } ] } ]\n    failover_on_client_error: true\n    max_attempts: 2\n  strict:\n    select: [ { router: priority, targets: [ { model: ma }, { model: mc } ] } ]\n",
    ));
    // A 400 moves on under `lenient`; its max_attempts stops the walk after b.
    let r = post_chat(&gw, &chat("lenient")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(m[2].calls(), 0);
    assert_eq!(r.status(), 502);
    // Under `strict` the 400 is relayed.
    let r = post_chat(&gw, &chat("strict")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    expect_error(r, 400, "all_candidates_rejected").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_context_length_refusal_moves_to_a_larger_context_window() {
    let m = mocks().await;
    m[0].set_default(signalbox_mock::Behaviour::Status {
        code: 400,
        retry_after: None,
        body: Some(
            r#"{"error":{"message":"This model's maximum context length is 100 tokens","code":"context_length_exceeded"}}"#
                .into(),
        ),
    });
    let text = four(
        &m,
        "",
        "policies:\n  long:\n    select: [ { router: priority, targets: [ { model: ma }, { model: mb }, { model: mc } ] } ]\n    failover_on_client_error: true\n",
    )
    .replace("capability: 1,", "capability: 1, context_window: 100,")
    .replace("capability: 2,", "capability: 2, context_window: 50,")
    .replace("capability: 3,", "capability: 3, context_window: 1000,");
    let gw = Gateway::start(text);
    let r = post_chat(&gw, &chat("long")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(
        header(&r, "x-llm-provider"),
        "c",
        "b's window is not larger than a's"
    );
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!((m[0].calls(), m[1].calls(), m[2].calls()), (1, 0, 1));
    // No larger window left: the caller hears it was the prompt.
    m[2].set_default(m[0].requests()[0].behaviour.clone());
    let r = post_chat(&gw, &chat("long")).await;
    expect_error(r, 400, "context_length_exceeded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_request_names_has_a_precedence() {
    let m = mocks().await;
    let gw = Gateway::start(four(
        &m,
        "",
        "policies:\n  pa: { select: [ { router: priority, targets: [ { model: ma } ] } ] }\n  pb: { select: [ { router: priority, targets: [ { model: mb } ] } ] }\n",
    ));
    let mut with_policy = chat("mc");
    with_policy["routing"] = serde_json::json!({"policy": "pa"});
    // routing.policy › x-llm-route › model.
    let r = post_with(&gw, &with_policy, &[("x-llm-route", "pb")]).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("a", "policy:pa")
    );
    let r = post_with(&gw, &chat("mc"), &[("x-llm-route", "pb")]).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("b", "policy:pb")
    );
    let r = post_chat(&gw, &chat("mc")).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("c", "model:mc")
    );
    // A policy is callable as a model name, case-insensitively.
    let r = post_chat(&gw, &chat("PB")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    // Naming a policy that does not exist is a 400, never a silent fallback.
    let r = post_with(&gw, &chat("mc"), &[("x-llm-route", "nope")]).await;
    expect_error(r, 400, "invalid_request").await;
    let mut bad = chat("mc");
    bad["routing"] = serde_json::json!({"policy": "nope"});
    expect_error(post_chat(&gw, &bad).await, 400, "invalid_request").await;
    // `smart` is taken as `priority_cheapest` (seed 002), and says so.
    let mut smart = chat("mc");
    smart["routing"] = serde_json::json!({"strategy": "smart"});
    let r = post_chat(&gw, &smart).await;
    assert_eq!(r.status(), 200);
    let reason = header(&r, "x-llm-routing-reason");
    assert!(
        reason.starts_with("strategy=priority_cheapest ")
            && reason.ends_with(" reason=smart_fallback"),
        "{reason}"
    );
    // The steering headers never reach a provider.
    let seen = m[1].requests();
    assert!(seen.iter().all(|r| r.header("x-llm-route").is_none()));
}

/// A chat body whose last user turn is `last`, after an earlier user turn `first`.
fn two_turns(model: &str, first: &str, last: &str) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [
            {"role": "user", "content": first},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": last},
        ],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_select_read_headers_the_task_and_the_agent() {
    let m = mocks().await;
    let extra = "chains: { main: [ma], team: [mb], code: [mc], agents: [md] }\nactive_chain: main\npolicies:\n  tiered:\n    select:\n      - { when: { header.x-tier: { $regex: '^gold' } }, router: priority, targets: [ { model: md } ] }\n      - { router: priority, targets: [ { model: ma } ] }\nrules:\n  - when: { header.x-team: ads }\n    then: auto:team\n  - when: { params.task: code }\n    then: auto:code\n  - when: { params.agent: { $in: [claude-code, codex] } }\n    then: auto:agents\n";
    let gw = Gateway::start(four(&m, "", extra));
    let provider = |r: &reqwest::Response| header(r, "x-llm-provider").to_string();
    // None holds: the active chain.
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(
        (provider(&r), header(&r, "x-llm-route")),
        ("a".into(), "chain:main")
    );
    // header.x-team (the name is matched whatever case the caller writes it in).
    let r = post_with(&gw, &chat("auto"), &[("X-Team", "ads")]).await;
    assert_eq!(
        (provider(&r), header(&r, "x-llm-route")),
        ("b".into(), "rule:0")
    );
    let r = post_with(&gw, &chat("auto"), &[("x-team", "search")]).await;
    assert_eq!(provider(&r), "a");
    // params.task: a fence in the last user turn is code; one in an earlier turn is not.
    let fenced = "fix this:\n```rust\nfn main() { println!(\"hi\") }\n```";
    let r = post_chat(&gw, &two_turns("auto", "hello", fenced)).await;
    assert_eq!(
        (provider(&r), header(&r, "x-llm-route")),
        ("c".into(), "rule:1")
    );
    let r = post_chat(
        &gw,
        &two_turns("auto", fenced, "thanks, and what is a monad?"),
    )
    .await;
    assert_eq!(provider(&r), "a");
    // params.agent, from the user-agent the clients send.
    for (ua, want) in [
        ("claude-cli/2.1.332 (external, cli)", "d"),
        ("codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown", "d"),
        ("OpenAI/Python 2.8.0", "a"),
        ("curl/8.5.0", "a"),
    ] {
        let r = post_with(&gw, &chat("auto"), &[("user-agent", ua)]).await;
        assert_eq!(provider(&r), want, "{ua}");
    }
    // A policy's select entry reads headers too.
    let r = post_with(&gw, &chat("tiered"), &[("x-tier", "gold-eu")]).await;
    assert_eq!(provider(&r), "d");
    assert!(header(&r, "x-llm-routing-reason").contains(" policy=tiered entry=0"));
    let r = post_chat(&gw, &chat("tiered")).await;
    assert_eq!(provider(&r), "a");
    // Explain reads the same facts and says what it read.
    let v = explain(
        &gw,
        &two_turns("auto", "hello", fenced),
        &[("user-agent", "claude-cli/2.1.332")],
    )
    .await;
    assert_eq!(v["needs"]["task"], "code", "{v:#}");
    assert_eq!(v["needs"]["agent"], "claude-code", "{v:#}");
    assert_eq!(
        v["rules"],
        serde_json::json!([{"rule": 0, "held": false}, {"rule": 1, "held": true}, {"rule": 2, "held": true}]),
        "{v:#}"
    );
    let v = explain(&gw, &chat("auto"), &[("x-team", "ads")]).await;
    assert_eq!(v["needs"]["task"], "chat", "{v:#}");
    assert_eq!(v["needs"]["agent"], "unknown", "{v:#}");
    assert_eq!(v["rules"][0]["held"], true, "{v:#}");
    gw.metrics_with(&[
        r#"signalbox_rule_matches_total{rule="rule:0"} 1"#,
        r#"signalbox_rule_matches_total{rule="rule:1"} 1"#,
        r#"signalbox_rule_matches_total{rule="rule:2"} 2"#,
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_steer_auto_and_never_an_explicit_model() {
    let m = mocks().await;
    let extra = "chains: { main: [ma], side: [mc] }\nactive_chain: main\npolicies:\n  team: { select: [ { router: priority, targets: [ { model: md } ] } ] }\nrules:\n  - when: { params.tools: true }\n    then: auto:side\n  - when: { metadata.team: { $in: [search, ads] } }\n    then: team\n";
    let gw = Gateway::start(four(&m, "", extra));
    // No rule holds: the active chain.
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("a", "chain:main")
    );
    // Tools: rule 0.
    let mut tools = chat("auto");
    tools["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    let r = post_chat(&gw, &tools).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("c", "rule:0")
    );
    // Metadata: rule 1, to a policy.
    let r = post_with(
        &gw,
        &chat("auto"),
        &[("x-llm-metadata", r#"{"team":"ads"}"#)],
    )
    .await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("d", "rule:1")
    );
    assert!(header(&r, "x-llm-routing-reason").contains(" policy=team entry=0 rule=1"));
    let v = explain(
        &gw,
        &chat("auto"),
        &[("x-llm-metadata", r#"{"team":"ads"}"#)],
    )
    .await;
    assert_eq!(
        v["rules"],
        serde_json::json!([{"rule": 0, "held": false}, {"rule": 1, "held": true}]),
        "{v:#}"
    );
    let r = post_with(
        &gw,
        &chat("auto"),
        &[("x-llm-metadata", r#"{"team":"other"}"#)],
    )
    .await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    // An explicit model is never redirected by a rule.
    let r = post_chat(&gw, &{
        let mut b = tools.clone();
        b["model"] = serde_json::json!("mb");
        b
    })
    .await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    // Bad metadata is refused.
    let r = post_with(
        &gw,
        &chat("auto"),
        &[("x-llm-metadata", r#"{"nested":{"a":1}}"#)],
    )
    .await;
    expect_error(r, 400, "invalid_request").await;
    let m = gw
        .metrics_with(&[
            r#"signalbox_rule_matches_total{rule="rule:0"} 1"#,
            r#"signalbox_rule_matches_total{rule="rule:1"} 1"#,
            r#"signalbox_policy_selections_total{policy="team",entry="0"} 1"#,
        ])
        .await;
    for line in [
        r#"signalbox_rule_matches_total{rule="rule:0"} 1"#,
        r#"signalbox_rule_matches_total{rule="rule:1"} 1"#,
        r#"signalbox_policy_selections_total{policy="team",entry="0"} 1"#,
    ] {
        assert!(m.contains(line), "{line} missing:\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn candidates_that_cannot_serve_the_request_are_skipped_with_their_reason() {
    let m = mocks().await;
    let models = "";
    let text = four(&m, models, "chains: { all: [ma, mb, mc] }\n")
        .replace("capability: 1,", "capability: 1, capabilities: [stream],")
        .replace("capability: 2,", "capability: 2, context_window: 100,")
        .replace(
            "capability: 3,",
            "capability: 3, capabilities: [stream, tools],",
        );
    let gw = Gateway::start(text);
    // Tools: ma does not declare them, mb declares nothing (not filtered), mc does.
    let mut tools = chat("auto:all");
    tools["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    let r = post_chat(&gw, &tools).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    // A long prompt: mb's context window is too small.
    tools["messages"][0]["content"] = serde_json::json!("word ".repeat(200));
    let r = post_chat(&gw, &tools).await;
    assert_eq!(header(&r, "x-llm-provider"), "c");
    let v = explain(&gw, &tools, &[]).await;
    let reasons: Vec<_> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["skipped"].clone())
        .collect();
    assert_eq!(
        reasons,
        [
            serde_json::json!("capability:tools"),
            serde_json::json!("context_window"),
            serde_json::Value::Null
        ],
        "{v:#}"
    );
    // Nothing survives: 503 listing the reasons, naming no provider.
    let mut vision = chat("auto:all");
    vision["messages"] = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    ]}]);
    vision["messages"][0]["content"][0]["text"] = serde_json::json!("word ".repeat(200));
    let r = post_chat(&gw, &vision).await;
    let body = expect_error(r, 503, "no_provider_available").await;
    assert_eq!(body["error"]["skipped"]["capability:vision"], 2, "{body}");
    assert_eq!(body["error"]["skipped"]["context_window"], 1, "{body}");
    let text = body.to_string();
    for name in ["\"a\"", "\"b\"", "\"c\"", "up-a", "up-b", "up-c"] {
        assert!(!text.contains(name), "{name} named in {text}");
    }
    assert_eq!(m.iter().map(MockHandle::calls).sum::<u64>(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_puts_first_what_the_proxy_tries_first() {
    let m = mocks().await;
    m[0].set_default(status(503));
    let extra = "chains: { main: [ma, mb, mc] }\nactive_chain: main\npolicies:\n  pool: { select: [ { router: strategy, strategy: cheapest, targets: [ { model: mc }, { model: md } ] } ] }\n  tiered: { select: [ { router: complexity, tiers: { simple: mb, medium: mc, complex: md } } ] }\nrules:\n  - when: { metadata.x: 1 }\n    then: pool\n";
    let text = four(&m, "", extra)
        .replace(
            "model: up-c }",
            "model: up-c, price: { input_per_mtok: 5, output_per_mtok: 5 } }",
        )
        .replace(
            "model: up-d }",
            "model: up-d, price: { input_per_mtok: 1, output_per_mtok: 1 } }",
        );
    let gw = Gateway::start(text);
    let cases: Vec<(serde_json::Value, Vec<(&str, &str)>)> = vec![
        (chat("auto"), vec![]),
        (chat("auto"), vec![("x-llm-metadata", r#"{"x":1}"#)]),
        (chat("tiered"), vec![]),
        (chat("pool"), vec![]),
        (chat("mb"), vec![]),
        (chat("ma"), vec![]),
    ];
    for (body, headers) in cases {
        let v = explain(&gw, &body, &headers).await;
        let first = v["order"][0]["candidate"]
            .as_str()
            .unwrap_or("none")
            .to_string();
        let before: Vec<u64> = m.iter().map(MockHandle::calls).collect();
        let r = post_with(&gw, &body, &headers).await;
        let after: Vec<u64> = m.iter().map(MockHandle::calls).collect();
        // The first upstream call went where explain put the first attempt.
        let called_first = &first[..1];
        let idx = ["a", "b", "c", "d"]
            .iter()
            .position(|p| *p == called_first)
            .unwrap();
        assert!(
            after[idx] > before[idx],
            "{body} {headers:?}: explain said {first}: {v:#}"
        );
        assert_eq!(
            header(&r, "x-llm-route"),
            v["route"].as_str().unwrap(),
            "{v:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_off_turns_policy_names_into_unknown_models() {
    let m = mocks().await;
    let extra = "chains: { main: [ma] }\nactive_chain: main\nrouting: { enabled: false }\npolicies:\n  pb: { select: [ { router: priority, targets: [ { model: mb } ] } ] }\nrules:\n  - when: { metadata.team: ads }\n    then: pb\n";
    let gw = Gateway::start(four(&m, "", extra));
    // By name, by header, by `routing.policy`: a policy is a name that names nothing.
    expect_error(post_chat(&gw, &chat("pb")).await, 400, "model_not_found").await;
    let r = post_with(&gw, &chat("mc"), &[("x-llm-route", "pb")]).await;
    let v = expect_error(r, 400, "model_not_found").await;
    assert!(v.to_string().contains("routing.enabled"), "{v}");
    let mut body = chat("mc");
    body["routing"] = serde_json::json!({"policy": "pb"});
    expect_error(post_chat(&gw, &body).await, 400, "model_not_found").await;
    // A rule to a policy never holds: `auto` takes the active chain.
    let r = post_with(
        &gw,
        &chat("auto"),
        &[("x-llm-metadata", r#"{"team":"ads"}"#)],
    )
    .await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("a", "chain:main")
    );
    // Models still serve, and the policy is not advertised.
    assert_eq!(
        header(&post_chat(&gw, &chat("mc")).await, "x-llm-provider"),
        "c"
    );
    let models: serde_json::Value = get_json(&gw, "/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"mb") && !ids.contains(&"pb"), "{ids:?}");
    assert_eq!(m[1].calls(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_set_has_a_default_and_a_switch() {
    let m = mocks().await;
    let set = |enabled: bool| {
        format!("chains: {{ main: [ma], side: [mc] }}\nactive_chain: main\npolicies:\n  team: {{ select: [ {{ router: priority, targets: [ {{ model: md }} ] }} ] }}\nrules:\n  enabled: {enabled}\n  default: auto:side\n  rules:\n    - when: {{ metadata.team: ads }}\n      then: team\n")
    };
    let ads = [("x-llm-metadata", r#"{"team":"ads"}"#)];
    let gw = Gateway::start(four(&m, "", &set(true)));
    // No rule holds: `default`, not the active chain.
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("c", "rule:default")
    );
    let r = post_with(&gw, &chat("auto"), &ads).await;
    assert_eq!(header(&r, "x-llm-provider"), "d");
    // A request that names its chain is never redirected, by a rule or the default.
    let r = post_with(&gw, &chat("auto:main"), &ads).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    // Explain agrees.
    let v = explain(&gw, &chat("auto"), &[]).await;
    assert_eq!(v["route"], "rule:default", "{v}");
    drop(gw);
    // Switched off: validated, never consulted (the default neither).
    let gw = Gateway::start(four(&m, "", &set(false)));
    for headers in [&ads[..], &[]] {
        let r = post_with(&gw, &chat("auto"), headers).await;
        assert_eq!(
            (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
            ("a", "chain:main")
        );
    }
    assert_eq!(m[3].calls(), 1);
}
