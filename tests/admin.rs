//! The admin API and hot reload over real sockets: tokens, each endpoint's validation and
//! write-back, reloads that keep health and never drop a stream, and refusals that change
//! nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use signalbox_mock::MockHandle;

const WRITE: &str = "admin-write-token-1";
const READ: &str = "admin-read-token-2";

fn config(a: &MockHandle, b: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}{}models:\n  ma: {{ capability: 9, deployments: [{{ provider: a, model: up-a }}] }}\n  mb: {{ deployments: [{{ provider: b, model: up-b }}] }}\nchains:\n  main: [ma, mb]\nactive_chain: main\nadmin: {{ token_env: SB_ADMIN, read_token_env: SB_ADMIN_READ }}\nhealth: {{ failure_threshold: 1, cooldown: 1h, probe_interval: 1h }}\n{extra}",
        provider("a", a),
        provider("b", b),
    )
}

fn start(text: String) -> Gateway {
    GatewayBuilder::new(text)
        .env("SB_ADMIN", WRITE)
        .env("SB_ADMIN_READ", READ)
        .start()
}

async fn admin(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut r = client().request(method, format!("http://{}{path}", gw.admin));
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_guard_reads_and_writes() {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(config(&a, &b, ""));
    use reqwest::Method;
    // Metrics and liveness need no token.
    assert_eq!(admin(&gw, Method::GET, "/metrics", None, None).await.0, 200);
    assert_eq!(admin(&gw, Method::GET, "/healthz", None, None).await.0, 200);
    assert_eq!(
        admin(&gw, Method::GET, "/admin/ready", None, None).await.0,
        200
    );
    // With tokens configured, reads need one.
    let (s, v) = admin(&gw, Method::GET, "/admin/config", None, None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_admin_token"))
    );
    assert_eq!(
        admin(&gw, Method::GET, "/admin/config", Some("wrong"), None)
            .await
            .0,
        401
    );
    assert_eq!(
        admin(&gw, Method::GET, "/admin/config", Some(READ), None)
            .await
            .0,
        200
    );
    assert_eq!(
        admin(&gw, Method::GET, "/admin/health", Some(WRITE), None)
            .await
            .0,
        200
    );
    // The read token reads only.
    let (s, v) = admin(&gw, Method::POST, "/admin/reload", Some(READ), None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("read_only_token"))
    );
    assert_eq!(
        admin(&gw, Method::POST, "/admin/reload", None, None)
            .await
            .0,
        401
    );
    assert_eq!(
        admin(&gw, Method::POST, "/admin/reload", Some(WRITE), None)
            .await
            .0,
        200
    );
    // The tokens never show up in what the admin API or metrics say.
    let (_, cfg) = admin(&gw, Method::GET, "/admin/config", Some(READ), None).await;
    let metrics = gw.metrics().await;
    for text in [cfg.to_string(), metrics, gw.stderr()] {
        assert!(!text.contains(WRITE) && !text.contains(READ));
    }

    // No token configured: reads are served, writes refused.
    let open = config(&a, &b, "").replace(
        "admin: { token_env: SB_ADMIN, read_token_env: SB_ADMIN_READ }\n",
        "",
    );
    let gw = Gateway::start(open);
    assert_eq!(
        admin(&gw, Method::GET, "/admin/config", None, None).await.0,
        200
    );
    let (s, v) = admin(&gw, Method::POST, "/admin/reload", None, None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("writes_disabled"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sections_are_validated_written_back_and_survive_a_restart() {
    use reqwest::Method;
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(config(&a, &b, ""));
    let g0 = gw.generation();
    // A policy: refused with its key path, nothing changes...
    let bad = serde_json::json!({ "select": [ { "router": "weighted", "targets": [ { "model": "nope" } ] } ] });
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/policies/support",
        Some(WRITE),
        Some(bad),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    let paths: Vec<&str> = v["error"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(
        paths
            .iter()
            .any(|p| p.starts_with("policies.support.select[0]")),
        "{v}"
    );
    assert_eq!(gw.generation(), g0);
    expect_error(
        post_chat(&gw, &chat("support")).await,
        400,
        "model_not_found",
    )
    .await;
    // ...accepted, applied and written back.
    let good = serde_json::json!({ "select": [ { "router": "priority", "targets": [ { "model": "mb" } ] } ] });
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/policies/support",
        Some(WRITE),
        Some(good),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["select"][0]["router"], "priority");
    let r = post_chat(&gw, &chat("support")).await;
    assert_eq!(header(&r, "x-llm-route"), "policy:support");
    assert_eq!(header(&r, "x-llm-provider"), "b");
    // Rules and chains the same way.
    let rules = serde_json::json!([ { "when": { "params.stream": true }, "then": "support" } ]);
    assert_eq!(
        admin(&gw, Method::PUT, "/admin/rules", Some(WRITE), Some(rules))
            .await
            .0,
        200
    );
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/rules",
        Some(WRITE),
        Some(serde_json::json!([ { "when": { "params.stream": { "$inn": [1] } }, "then": "support" } ])),
    )
    .await;
    assert_eq!(s, 400);
    assert!(v.to_string().contains("rules[0].when.params.stream"), "{v}");
    assert_eq!(
        admin(
            &gw,
            Method::PUT,
            "/admin/chains/main",
            Some(WRITE),
            Some(serde_json::json!(["mb", "ma"]))
        )
        .await
        .0,
        200
    );
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b", "the chain's new order");
    let (s, v) = admin(
        &gw,
        Method::POST,
        "/admin/chains/main/sort/smartest",
        Some(WRITE),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        serde_json::json!(["ma", "mb"]),
        "the more capable model first"
    );
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a", "the sorted order serves");
    assert_eq!(
        admin(&gw, Method::GET, "/admin/chains/nope", Some(READ), None)
            .await
            .0,
        404
    );

    // The file holds every change: a gateway started from it serves the same.
    let written = std::fs::read_to_string(gw.config_path()).unwrap();
    assert!(written.contains("support"), "{written}");
    let (proxy, admin_port) = (free_port(), free_port());
    let text = written
        .replace(&gw.proxy.to_string(), &format!("127.0.0.1:{proxy}"))
        .replace(&gw.admin.to_string(), &format!("127.0.0.1:{admin_port}"));
    let again = GatewayBuilder::new(text)
        .verbatim()
        .listening_on(proxy, admin_port)
        .env("SB_ADMIN", WRITE)
        .env("SB_ADMIN_READ", READ)
        .start();
    let r = post_chat(&again, &chat("support")).await;
    assert_eq!(header(&r, "x-llm-route"), "policy:support");
    let mut stream = chat("auto");
    stream["stream"] = serde_json::json!(true);
    let r = post_chat(&again, &stream).await;
    assert_eq!(
        header(&r, "x-llm-route"),
        "rule:0",
        "the rule came back too"
    );
    let (s, v) = admin(&again, Method::GET, "/admin/chains/main", Some(READ), None).await;
    assert_eq!(
        (s, v),
        (200, serde_json::json!(["ma", "mb"])),
        "and the sorted chain"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_keeps_health_and_in_flight_streams() {
    let a = mock_with("a", |c| {
        c.stream = signalbox_mock::StreamShape {
            chunks: 6,
            gap: Duration::from_millis(150),
        }
    })
    .await;
    let b = mock("b").await;
    let gw = start(config(&a, &b, ""));
    // Eject b (one failure, a one-hour cooldown).
    b.push_script([status(503)]);
    let r = post_chat(&gw, &chat("mb")).await;
    assert_eq!(r.status(), 502);
    // A slow stream starts on a...
    let mut body = chat("ma");
    body["stream"] = serde_json::json!(true);
    let stream = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    // ...and the config changes under it: a new model, by SIGHUP.
    let g0 = gw.generation();
    let path = gw.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let changed = text.replace(
        "  mb: { deployments: [{ provider: b, model: up-b }] }\n",
        "  mb: { deployments: [{ provider: b, model: up-b }] }\n  mc: { deployments: [{ provider: a, model: up-c }] }\n",
    );
    assert_ne!(text, changed);
    std::fs::write(&path, changed).unwrap();
    gw.signal("HUP");
    gw.wait_generation(g0 + 1).await;
    // The stream finishes on the snapshot it started with, with its terminator.
    let text = stream.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // The new model serves; b is still ejected (its record carried over).
    assert_eq!(post_chat(&gw, &chat("mc")).await.status(), 200);
    let h: serde_json::Value = client()
        .get(format!("http://{}/admin/health", gw.admin))
        .header("authorization", format!("Bearer {READ}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b_target = h["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == "b")
        .unwrap();
    assert_eq!(b_target["state"], "ejected", "{h:#}");
    assert_eq!(b.calls(), 1);
    let m = gw
        .metrics_with(&[r#"signalbox_config_reloads_total{result="ok"} 1"#])
        .await;
    assert!(
        m.contains(r#"signalbox_config_reloads_total{result="ok"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(&format!("signalbox_config_generation {}", g0 + 1)),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_config_changes_nothing() {
    use reqwest::Method;
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(config(&a, &b, ""));
    let g0 = gw.generation();
    let path = gw.config_path();
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        good.replace("model: up-a", "model: up-a, colour: red"),
    )
    .unwrap();
    // By the admin API: 400 with the key path.
    let (s, v) = admin(&gw, Method::POST, "/admin/reload", Some(WRITE), None).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v.to_string().contains("models.ma.deployments[0].colour"),
        "{v}"
    );
    // By SIGHUP: logged, counted, and the old config keeps serving.
    gw.signal("HUP");
    let m = gw
        .metrics_with(&[r#"signalbox_config_reloads_total{result="rejected"} 2"#])
        .await;
    assert!(
        m.contains(r#"signalbox_config_reloads_total{result="rejected"} 2"#),
        "{m}"
    );
    assert!(gw
        .stderr_with("config refused")
        .await
        .contains("config refused"));
    assert_eq!(gw.generation(), g0);
    assert_eq!(post_chat(&gw, &chat("ma")).await.status(), 200);
    // A whole config by PUT: validated the same way; listen changes need an upgrade.
    let (s, _) = admin(
        &gw,
        Method::PUT,
        "/admin/config",
        Some(WRITE),
        Some(serde_json::json!({"providers": {}})),
    )
    .await;
    assert_eq!(s, 400);
    std::fs::write(&path, &good).unwrap();
    let (_, current) = admin(&gw, Method::GET, "/admin/config", Some(READ), None).await;
    let mut next = current.clone();
    next["listen"]["admin"] = serde_json::json!("127.0.0.1:1");
    let (s, v) = admin(&gw, Method::PUT, "/admin/config", Some(WRITE), Some(next)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["generation"], g0 + 1);
    assert_eq!(v["needs_upgrade"], serde_json::json!(["listen"]));
    // The admin listener is still where it was.
    assert_eq!(admin(&gw, Method::GET, "/healthz", None, None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_says_what_is_missing() {
    use reqwest::Method;
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(config(&a, &b, ""));
    let (s, v) = admin(&gw, Method::GET, "/admin/ready", None, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["proxy_listener_bound"], true);
    // A chain whose only candidate's provider is switched off: not ready, and which chain.
    let mut doc = admin(&gw, Method::GET, "/admin/config", Some(READ), None)
        .await
        .1;
    doc["providers"]["b"]["enabled"] = serde_json::json!(false);
    doc["chains"]["spare"] = serde_json::json!(["mb"]);
    let (s, v) = admin(&gw, Method::PUT, "/admin/config", Some(WRITE), Some(doc)).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = admin(&gw, Method::GET, "/admin/ready", None, None).await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(
        v["chains_without_a_usable_candidate"],
        serde_json::json!(["spare"])
    );
}

/// A credential and a token in a provider URL: refused, and never echoed by `-t`, a start-up
/// failure, a reload refusal (its answer and its log line) or a refused `PUT /admin/config`.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_in_a_url_is_redacted_wherever_the_url_is_shown() {
    use reqwest::Method;
    const CANARY: &str = "CanaryPw9";
    let (a, b) = (mock("a").await, mock("b").await);
    let bad_url = format!("http://admin:{CANARY}@127.0.0.1:1/v1?key=q{CANARY}");
    let bad = config(&a, &b, "").replace(&a.base_url(), &bad_url);
    assert!(bad.contains(CANARY));

    // `-t`, and a start that fails on the config.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, &bad).unwrap();
    for args in [vec!["-t", "-c"], vec!["-c"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_signalbox"))
            .args(&args)
            .arg(&path)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("providers.a.base_url"), "{text}");
        assert!(text.contains("http://***@127.0.0.1:1/v1?***"), "{text}");
        assert!(!text.contains(CANARY), "{args:?} echoed the secret: {text}");
    }

    // A running gateway refuses it by PUT and by reload, in words without the secret.
    let gw = start(config(&a, &b, ""));
    let doc: serde_json::Value = serde_yaml::from_str(&bad).unwrap();
    let (s, v) = admin(&gw, Method::PUT, "/admin/config", Some(WRITE), Some(doc)).await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("providers.a.base_url"), "{v}");
    assert!(!v.to_string().contains(CANARY), "{v}");
    std::fs::write(gw.config_path(), &bad).unwrap();
    let (s, v) = admin(&gw, Method::POST, "/admin/reload", Some(WRITE), None).await;
    assert_eq!(s, 400, "{v}");
    assert!(!v.to_string().contains(CANARY), "{v}");
    gw.signal("HUP");
    let log = gw.stderr_with("config refused").await;
    assert!(log.contains("config refused"), "{log}");
    assert!(!log.contains(CANARY), "{log}");
    let (_, running) = admin(&gw, Method::GET, "/admin/config", Some(READ), None).await;
    assert!(!running.to_string().contains(CANARY));
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_speak_the_list_and_the_long_form() {
    use reqwest::Method;
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(
        config(&a, &b, "chains:\n  main: [ma, mb]\n  side: [mb]\n")
            .replace("chains:\n  main: [ma, mb]\nactive_chain", "active_chain"),
    );
    let set = serde_json::json!({ "enabled": true, "default": "auto:side", "rules": [] });
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/rules",
        Some(WRITE),
        Some(set.clone()),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = admin(&gw, Method::GET, "/admin/rules", Some(READ), None).await;
    assert_eq!(v, set, "read back in the form written");
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("b", "rule:default")
    );
    // Refusals name the path inside the long form, and change nothing.
    let bad = serde_json::json!({ "enabled": false, "default": "ma", "rules": [] });
    let (s, v) = admin(&gw, Method::PUT, "/admin/rules", Some(WRITE), Some(bad)).await;
    assert_eq!(s, 400);
    assert!(v.to_string().contains("rules.default"), "{v}");
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/rules",
        Some(WRITE),
        Some(serde_json::json!({ "enabled": true, "sometimes": 1 })),
    )
    .await;
    assert_eq!(s, 400);
    assert!(v.to_string().contains("rules.sometimes"), "{v}");
    assert_eq!(
        header(&post_chat(&gw, &chat("auto")).await, "x-llm-provider"),
        "b"
    );
    // Switched off through the API: the active chain again.
    let off = serde_json::json!({ "enabled": false, "default": "auto:side", "rules": [] });
    assert_eq!(
        admin(&gw, Method::PUT, "/admin/rules", Some(WRITE), Some(off))
            .await
            .0,
        200
    );
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-route")),
        ("a", "chain:main")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chains_take_switches_and_backfill_and_presets_only_reorder() {
    use reqwest::Method;
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    let text = format!(
        "providers:\n{}{}{}models:\n  ma: {{ capability: 1, deployments: [{{ provider: a, model: up-a, budget: {{ usd: 10, period: month }} }}] }}\n  mb: {{ capability: 5, deployments: [{{ provider: b, model: up-b, price: {{ input_per_mtok: 0.1, output_per_mtok: 0.1 }} }}] }}\n  mc: {{ capability: 9, deployments: [{{ provider: c, model: up-c, budget: {{ usd: 50, period: month }} }}] }}\n  md: {{ capability: 3, enabled: false, deployments: [{{ provider: b, model: up-d, price: {{ input_per_mtok: 1, output_per_mtok: 1 }} }}] }}\nchains:\n  team: {{ models: [ma, {{ model: mc, enabled: false }}], backfill: true }}\n  pick: [mb]\nactive_chain: team\nadmin: {{ token_env: SB_ADMIN, read_token_env: SB_ADMIN_READ }}\nhealth: {{ failure_threshold: 0 }}\n",
        provider("a", &a),
        provider("b", &b),
        provider("c", &c),
    );
    let gw = start(text);
    // The chain's own enabled entry, then the backfill in catalog order (mb; md is switched
    // off in the catalog); mc is switched off in the chain and never tried.
    a.push_script([status(502)]);
    let r = post_chat(&gw, &chat("auto")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(
        (header(&r, "x-llm-provider"), header(&r, "x-llm-attempts")),
        ("b", "2")
    );
    assert_eq!(b.requests()[0].model.as_deref(), Some("up-b"));
    assert_eq!(c.calls(), 0);
    // A chain of nothing but switched-off entries is empty: a 400, never the catalogue.
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/chains/pick",
        Some(WRITE),
        Some(serde_json::json!({ "models": [{ "model": "mb", "enabled": false }] })),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    expect_error(post_chat(&gw, &chat("auto:pick")).await, 400, "chain_empty").await;
    assert_eq!(
        admin(
            &gw,
            Method::PUT,
            "/admin/chains/pick",
            Some(WRITE),
            Some(serde_json::json!(["mb"]))
        )
        .await
        .0,
        200
    );
    // Both forms read back as written; `/v1/models` lists each chain.
    let (_, v) = admin(&gw, Method::GET, "/admin/chains/team", Some(READ), None).await;
    assert_eq!(
        v,
        serde_json::json!({ "models": ["ma", { "model": "mc", "enabled": false }], "backfill": true })
    );
    let (_, v) = admin(&gw, Method::GET, "/admin/chains/pick", Some(READ), None).await;
    assert_eq!(v, serde_json::json!(["mb"]));
    let models: serde_json::Value = get_json(&gw, "/v1/models").await;
    let ids = models.to_string();
    assert!(
        ids.contains("\"auto:team\"") && ids.contains("\"auto:pick\""),
        "{ids}"
    );
    // An entry of the long form is strict too, and refused with its path.
    let (s, v) = admin(
        &gw,
        Method::PUT,
        "/admin/chains/pick",
        Some(WRITE),
        Some(serde_json::json!({ "models": ["mb", { "model": "ma", "on": false }] })),
    )
    .await;
    assert_eq!(s, 400);
    assert!(v.to_string().contains("chains.pick.models[1]"), "{v}");

    // `budget`: the largest budget left first (mc 50, ma 10), then no budget, cheapest first
    // (mb, md). Switches stay: mc off, the backfilled models as they were shown (mb on, md off).
    let (s, v) = admin(
        &gw,
        Method::POST,
        "/admin/chains/team/sort/budget",
        Some(WRITE),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        serde_json::json!({ "models": [
            { "model": "mc", "enabled": false }, "ma", "mb", { "model": "md", "enabled": false }
        ], "backfill": true })
    );
    // `smartest` on a list without backfill: every model it did not name is written in off.
    let (s, v) = admin(
        &gw,
        Method::POST,
        "/admin/chains/pick/sort/smartest",
        Some(WRITE),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        serde_json::json!({ "models": [
            { "model": "mc", "enabled": false }, "mb",
            { "model": "md", "enabled": false }, { "model": "ma", "enabled": false }
        ], "backfill": false })
    );
    let before = (a.calls(), c.calls());
    let r = post_chat(&gw, &chat("auto:pick")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b", "no entry switched on");
    assert_eq!((a.calls(), c.calls()), before);
}

/// `DELETE /admin/policies/{name}`: a policy a rule sends to is kept (400 naming the rule); once
/// no rule names it, it goes — from the running config and the file — and its name is unknown.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_no_rule_names_can_be_deleted() {
    use reqwest::Method;
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(config(
        &a,
        &b,
        "policies:\n  keep: { select: [ { router: priority, targets: [ { model: mb } ] } ] }\n  gone: { select: [ { router: priority, targets: [ { model: mb } ] } ] }\nrules:\n  - { when: { params.stream: true }, then: keep }\n",
    ));
    assert_eq!(
        header(&post_chat(&gw, &chat("gone")).await, "x-llm-route"),
        "policy:gone"
    );
    // The read token may not delete; an unknown policy is 404.
    let (s, _) = admin(
        &gw,
        Method::DELETE,
        "/admin/policies/gone",
        Some(READ),
        None,
    )
    .await;
    assert_eq!(s, 403);
    let (s, v) = admin(
        &gw,
        Method::DELETE,
        "/admin/policies/nope",
        Some(WRITE),
        None,
    )
    .await;
    assert_eq!(s, 404, "{v}");
    // A rule sends to `keep`: refused naming the rule, nothing changes.
    let (s, v) = admin(
        &gw,
        Method::DELETE,
        "/admin/policies/keep",
        Some(WRITE),
        None,
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("rules[0].then"), "{v}");
    assert_eq!(
        header(&post_chat(&gw, &chat("keep")).await, "x-llm-route"),
        "policy:keep"
    );
    // `gone` no rule names: deleted, applied and written back.
    let (s, v) = admin(
        &gw,
        Method::DELETE,
        "/admin/policies/gone",
        Some(WRITE),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["deleted"], "gone", "{v}");
    let (s, _) = admin(&gw, Method::GET, "/admin/policies/gone", Some(READ), None).await;
    assert_eq!(s, 404);
    expect_error(post_chat(&gw, &chat("gone")).await, 400, "model_not_found").await;
    let file = std::fs::read_to_string(gw.config_path()).unwrap();
    assert!(!file.contains("gone"), "{file}");
    assert!(file.contains("keep"), "{file}");
}

/// `POST /admin/explain` with `{config, request, headers}`: the request explained against an
/// unsaved draft (live health applied), nothing stored; a bad draft is 400 with every error
/// and its path.
#[tokio::test(flavor = "multi_thread")]
async fn explain_takes_a_draft_config_and_stores_nothing() {
    use reqwest::Method;
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(config(&a, &b, ""));
    let (_, running) = admin(&gw, Method::GET, "/admin/config", Some(READ), None).await;
    let mut draft = running.clone();
    draft["policies"] = serde_json::json!({
        "trial": { "select": [ { "when": { "metadata.tier": "free" }, "router": "priority", "targets": [ { "model": "mb" } ] },
                               { "router": "priority", "targets": [ { "model": "ma" } ] } ] }
    });
    let ask = |headers: serde_json::Value| serde_json::json!({ "config": draft.clone(), "request": chat("trial"), "headers": headers });
    let (s, v) = admin(
        &gw,
        Method::POST,
        "/admin/explain",
        Some(READ),
        Some(ask(serde_json::json!({}))),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["route"], "policy:trial", "{v:#}");
    assert_eq!(v["candidates"][0]["candidate"], "a/up-a", "{v:#}");
    // The draft's headers steer it.
    let (_, v) = admin(
        &gw,
        Method::POST,
        "/admin/explain",
        Some(READ),
        Some(ask(
            serde_json::json!({ "x-llm-metadata": "{\"tier\":\"free\"}" }),
        )),
    )
    .await;
    assert_eq!(v["candidates"][0]["candidate"], "b/up-b", "{v:#}");
    assert_eq!(v["via"]["entry"], 0, "{v:#}");
    // Live health applies: `a` ejected by a failure shows ejected in the draft too.
    a.set_default(signalbox_mock::Behaviour::Status {
        code: 500,
        retry_after: None,
        body: None,
    });
    assert_ne!(post_chat(&gw, &chat("ma")).await.status(), 200);
    let (_, v) = admin(
        &gw,
        Method::POST,
        "/admin/explain",
        Some(READ),
        Some(ask(serde_json::json!({}))),
    )
    .await;
    assert_eq!(v["candidates"][0]["skipped"], "ejected", "{v:#}");
    // Nothing was stored: the running config has no `trial`.
    expect_error(post_chat(&gw, &chat("trial")).await, 400, "model_not_found").await;
    let (_, now) = admin(&gw, Method::GET, "/admin/config", Some(READ), None).await;
    assert_eq!(now, running);
    // A bad draft: every error with its path.
    let mut bad = ask(serde_json::json!({}));
    bad["config"]["policies"]["trial"]["select"][0]["targets"][0]["model"] =
        serde_json::json!("nosuch");
    bad["config"]["surprise"] = serde_json::json!(1);
    let (s, v) = admin(&gw, Method::POST, "/admin/explain", Some(READ), Some(bad)).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_config", "{v}");
    let text = v["error"]["errors"].to_string();
    assert!(text.contains("surprise"), "{v}");
}
