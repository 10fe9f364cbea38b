//! Health over real sockets: ejection and fail-fast, `/admin/health`, active probes that
//! re-admit, `Retry-After`, learned strategies picking the faster provider, sticky sessions,
//! and a provider that dies and recovers under load without a lost request.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use signalbox_mock::{Behaviour, MockHandle};

fn two(a: &MockHandle, b: &MockHandle, model_extra: &str, health: &str) -> String {
    two_with(a, b, model_extra, health, 2)
}

/// `a` at priority 1, `b` at `b_priority` (equal priorities make them equivalent for load
/// balancing).
fn two_with(
    a: &MockHandle,
    b: &MockHandle,
    model_extra: &str,
    health: &str,
    b_priority: u32,
) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    {model_extra}\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: {b_priority} }}]\nhealth: {health}\nrouting: {{ rank_interval: 50ms }}\n",
        provider("a", a),
        provider("b", b),
    )
}

async fn admin_health(gw: &Gateway) -> serde_json::Value {
    admin_json(gw, "/admin/health").await
}

fn target<'a>(h: &'a serde_json::Value, provider: &str) -> &'a serde_json::Value {
    h["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == provider)
        .unwrap()
}

/// Poll `/admin/health` until `pred` holds (or panic after a deadline).
async fn wait_health(
    gw: &Gateway,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = admin_health(gw).await;
        if pred(&h) {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {h:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_candidate_ejected_fails_fast_with_retry_after_and_no_calls() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(status(503));
    b.set_default(status(500));
    let gw = Gateway::start(two(&a, &b, "", "{ failure_threshold: 1, cooldown: 30s }"));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    expect_error(r, 502, "upstream_error").await;

    let started = Instant::now();
    let r = post_chat(&gw, &chat("m")).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answered at once"
    );
    let retry_after: u64 = header(&r, "retry-after").parse().unwrap();
    assert!(
        (28..=30).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    assert_eq!(
        header(&r, "x-llm-attempts"),
        "",
        "no upstream call was made"
    );
    expect_error(r, 503, "no_provider_available").await;
    assert_eq!((a.calls(), b.calls()), (1, 1));

    let h = admin_health(&gw).await;
    for p in ["a", "b"] {
        let t = target(&h, p);
        assert_eq!(t["state"], "ejected", "{t}");
        let left = t["until"]["in_ms"].as_u64().unwrap();
        assert!(left > 25_000 && left <= 30_000, "{t}");
        assert_eq!(t["ejections_total"], 1);
    }
    let m = gw
        .metrics_with(&[
            r#"signalbox_breaker_state{provider="a",model="up-a",credential="none"} 2"#,
        ])
        .await;
    assert!(
        m.contains(r#"signalbox_breaker_state{provider="a",model="up-a",credential="none"} 2"#),
        "{m}"
    );
    assert!(
        m.contains(r#"signalbox_ejections_total{provider="b",scope="target"} 1"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_after_sets_the_ejection_window() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(Behaviour::Status {
        code: 503,
        retry_after: Some("2".into()),
        body: None,
    });
    let gw = Gateway::start(two(&a, &b, "", "{ failure_threshold: 5, cooldown: 5m }"));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let h = admin_health(&gw).await;
    let t = target(&h, "a");
    assert_eq!(
        t["state"], "ejected",
        "one 503 with Retry-After ejects at once: {t}"
    );
    assert!(t["until"]["in_ms"].as_u64().unwrap() <= 2_000, "{t}");
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_readmit_ejected_targets_and_leave_healthy_ones_alone() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.push_script([status(502)]);
    // A one-hour cooldown: only an active probe can bring `a` back within the test.
    let gw = Gateway::start(two(
        &a,
        &b,
        "",
        "{ failure_threshold: 1, cooldown: 1h, probe_interval: 100ms }",
    ));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let h = wait_health(&gw, "a re-admitted by a probe", |h| {
        target(h, "a")["breaker"] == "closed"
    })
    .await;
    let t = target(&h, "a");
    assert_eq!(
        t["state"], "recovering",
        "re-admitted at restore_health: {t}"
    );
    assert!((t["health"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    assert!(a.model_list_calls() >= 1);
    assert_eq!(b.model_list_calls(), 0, "healthy targets are never probed");
    // Traffic comes back to `a` (it earns its share: some requests may still start at b).
    let before = a.calls();
    for _ in 0..20 {
        assert_eq!(post_chat(&gw, &chat("m")).await.status(), 200);
    }
    assert!(a.calls() > before, "a serves again");
    let m = gw
        .metrics_with(&[r#"signalbox_probes_total{result="ok"}"#])
        .await;
    assert!(m.contains(r#"signalbox_probes_total{result="ok"}"#), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fastest_learns_which_provider_is_faster() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(Behaviour::SlowHeader { ms: 150 });
    let gw = Gateway::start(two(&a, &b, "strategy: fastest", "{}"));
    for _ in 0..60 {
        assert_eq!(post_chat(&gw, &chat("m")).await.status(), 200);
    }
    assert!(
        b.calls() >= 40,
        "the faster mock takes most traffic: a {} b {}",
        a.calls(),
        b.calls()
    );
    let h = admin_health(&gw).await;
    let (ta, tb) = (target(&h, "a"), target(&h, "b"));
    assert!(ta["ewma"]["ttfb_ms"].as_f64().unwrap() > tb["ewma"]["ttfb_ms"].as_f64().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn sticky_sessions_keep_a_conversation_on_one_deployment() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two_with(&a, &b, "strategy: random", "{}", 1));
    let c = client();
    let mut providers = std::collections::HashSet::new();
    for _ in 0..20 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .header("x-llm-session", "conversation-1")
            .json(&chat("m"))
            .send()
            .await
            .unwrap();
        providers.insert(header(&r, "x-llm-provider").to_string());
    }
    assert_eq!(providers.len(), 1, "{providers:?}");
    // Without a session, random spreads.
    for _ in 0..40 {
        post_chat(&gw, &chat("m")).await;
    }
    assert!(a.calls() > 0 && b.calls() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn running_out_of_file_descriptors_is_not_blamed_on_the_provider() {
    let a = mock_with("a", |c| {
        c.default_behaviour = Behaviour::Stream {
            chunks: 3,
            gap_ms: 300,
        }
    })
    .await;
    let b = mock("b").await;
    let gw = Arc::new(
        GatewayBuilder::new(two(&a, &b, "", "{ failure_threshold: 1, bench_after: 1 }"))
            .fd_limit(64)
            .start(),
    );
    // Far more concurrent streams than the gateway has descriptors for.
    let mut streams = Vec::new();
    for _ in 0..60 {
        let gw = gw.clone();
        streams.push(tokio::spawn(async move {
            let body = serde_json::json!({"model": "m", "stream": true, "messages": []});
            match client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
            {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let _ = r.bytes().await;
                    status
                }
                Err(_) => 0,
            }
        }));
    }
    for s in streams {
        let _ = s.await;
    }
    let m = gw.metrics().await;
    assert!(
        m.contains(r#"outcome="local_error""#),
        "the burst should have exhausted the gateway's descriptors: {m}"
    );
    let h = admin_health(&gw).await;
    for p in ["a", "b"] {
        let t = target(&h, p);
        assert_eq!(
            t["ejections_total"], 0,
            "{p} was blamed for the gateway's own limit: {t}"
        );
        assert_ne!(t["state"], "benched", "{t}");
    }
    // Once the burst is over, requests are served again.
    assert_eq!(post_chat(&gw, &chat("m")).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_that_dies_and_recovers_under_load_loses_no_request() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Arc::new(Gateway::start(two(
        &a,
        &b,
        "",
        "{ failure_threshold: 2, cooldown: 300ms, max_ejection: 1s, probe_interval: 100ms }",
    )));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (gw, stop) = (gw.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .post(gw.url("/v1/chat/completions"))
                    .json(&chat("m"))
                    .send()
                    .await
                    .unwrap();
                statuses.push(r.status().as_u16());
                r.bytes().await.unwrap();
            }
            statuses
        }));
    }
    let wait_calls = |m: &MockHandle, n: u64| {
        let m = m.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            while m.calls() < n {
                assert!(
                    Instant::now() < deadline,
                    "{} stuck at {} calls",
                    m.name(),
                    m.calls()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_calls(&a, 30).await;
    // `a` dies: every connection is reset before a byte.
    a.set_default(Behaviour::Reset);
    let b_before = b.calls();
    wait_calls(&b, b_before + 60).await;
    // `a` recovers: half-open probes and active probes bring it back.
    a.set_default(Behaviour::Ok);
    let a_recovered = a.calls();
    wait_calls(&a, a_recovered + 30).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for w in workers {
        let statuses = w.await.unwrap();
        total += statuses.len();
        assert!(
            statuses.iter().all(|s| *s == 200),
            "a request was lost: {statuses:?}"
        );
    }
    assert!(total > 100, "{total} requests");
    let h = admin_health(&gw).await;
    assert_eq!(target(&h, "a")["breaker"], "closed", "{h:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn failure_threshold_zero_keeps_calling_a_failing_target() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(status(503));
    // Globally off: a is called on every request, and never ejected or benched.
    let gw = Gateway::start(two(&a, &b, "", "{ failure_threshold: 0 }"));
    for _ in 0..6 {
        let r = post_chat(&gw, &chat("m")).await;
        assert_eq!(header(&r, "x-llm-provider"), "b");
        assert_eq!(header(&r, "x-llm-attempts"), "2");
    }
    assert_eq!((a.calls(), b.calls()), (6, 6));
    let h = admin_health(&gw).await;
    assert_eq!(target(&h, "a")["state"], "healthy", "{h:#}");

    // Per model: `m` keeps its breaker off while the global threshold ejects at once.
    let a = mock("a").await;
    let b = mock("b").await;
    a.set_default(status(503));
    let gw = Gateway::start(two(
        &a,
        &b,
        "failure_threshold: 0",
        "{ failure_threshold: 1 }",
    ));
    for _ in 0..4 {
        assert_eq!(post_chat(&gw, &chat("m")).await.status(), 200);
    }
    assert_eq!(a.calls(), 4);
}

/// A half-open target keeps its ranked place for one real request: with active probes an
/// hour apart, a recovered primary still gets its traffic back from its healthy fallback.
#[tokio::test(flavor = "multi_thread")]
async fn a_recovered_primary_comes_back_without_active_probes() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(two(
        &a,
        &b,
        "strategy: priority",
        "{ failure_threshold: 1, cooldown: 300ms, probe_interval: 1h }",
    ));
    a.push_script([status(503)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    wait_health(&gw, "a half-open", |h| {
        target(h, "a")["state"] == "half_open"
    })
    .await;
    // The next request is a's probe, in a's first place: it succeeds and restores a.
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    let h = admin_health(&gw).await;
    assert_eq!(target(&h, "a")["breaker"], "closed", "{h:#}");
    assert_eq!(a.model_list_calls(), 0, "no active probe was involved");
}

/// After the cooldown exactly one in-flight request probes the half-open target; the others
/// skip it to the next candidate.
#[tokio::test(flavor = "multi_thread")]
async fn one_probe_among_sixty_four_concurrent_requests() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Arc::new(Gateway::start(two(
        &a,
        &b,
        "strategy: priority",
        "{ failure_threshold: 1, cooldown: 300ms, probe_interval: 1h }",
    )));
    a.push_script([status(503)]);
    post_chat(&gw, &chat("m")).await;
    wait_health(&gw, "a half-open", |h| {
        target(h, "a")["state"] == "half_open"
    })
    .await;
    // The probe answers slowly, so all 64 requests are in flight while it is.
    a.set_default(Behaviour::SlowHeader { ms: 2_000 });
    let (a_before, b_before) = (a.calls(), b.calls());
    let mut requests = Vec::new();
    for _ in 0..64 {
        let gw = gw.clone();
        requests.push(tokio::spawn(async move {
            let r = post_chat(&gw, &chat("m")).await;
            (
                r.status().as_u16(),
                header(&r, "x-llm-provider").to_string(),
            )
        }));
    }
    let mut served = std::collections::HashMap::new();
    for r in requests {
        let (status, provider) = r.await.unwrap();
        assert_eq!(status, 200);
        *served.entry(provider).or_insert(0) += 1;
    }
    assert_eq!((a.calls() - a_before, b.calls() - b_before), (1, 63));
    assert_eq!(served.get("a"), Some(&1), "{served:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_health_zero_means_the_default_half_share() {
    let a = mock("a").await;
    let b = mock("b").await;
    a.push_script([status(502)]);
    // `restore_health: 0` is the default (0.5), not a target that never earns traffic back.
    let gw = Gateway::start(two(
        &a,
        &b,
        "",
        "{ failure_threshold: 1, cooldown: 1h, probe_interval: 100ms, restore_health: 0 }",
    ));
    assert_eq!(
        header(&post_chat(&gw, &chat("m")).await, "x-llm-provider"),
        "b"
    );
    let h = wait_health(&gw, "a re-admitted by a probe", |h| {
        target(h, "a")["breaker"] == "closed"
    })
    .await;
    let t = target(&h, "a");
    assert_eq!(t["state"], "recovering", "{t}");
    assert!((t["health"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{t}");
}

#[tokio::test(flavor = "multi_thread")]
async fn providers_and_models_have_derived_states_on_health_and_metrics() {
    let (a, b, c) = (mock("a").await, mock("b").await, mock("c").await);
    let config = format!(
        "providers:\n{}{}{}models:\n  m: {{ deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}] }}\n  mc: {{ deployments: [{{ provider: c, model: up-c }}] }}\nhealth: {{ failure_threshold: 1, cooldown: 1h, probe_interval: 1h }}\n",
        provider("a", &a),
        provider("b", &b),
        provider("c", &c).replace(" }\n", ", enabled: false }\n"),
    );
    let gw = Gateway::start(config);
    let state_of = |h: &serde_json::Value, list: &str, key: &str, name: &str| {
        h[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e[key] == name)
            .map(|e| e["state"].as_str().unwrap().to_string())
            .unwrap()
    };
    let h = admin_health(&gw).await;
    assert_eq!(state_of(&h, "providers", "provider", "a"), "healthy", "{h}");
    assert_eq!(
        state_of(&h, "providers", "provider", "c"),
        "disabled",
        "{h}"
    );
    assert_eq!(state_of(&h, "models", "model", "m"), "healthy", "{h}");
    assert_eq!(state_of(&h, "models", "model", "mc"), "disabled", "{h}");
    let m = gw
        .metrics_with(&[r#"signalbox_providers{state="healthy"} 2"#])
        .await;
    assert!(
        m.contains(r#"signalbox_providers{state="disabled"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"signalbox_models{state="degraded"} 0"#), "{m}");
    // a fails once: ejected. Its provider has nothing usable, its model some.
    a.push_script([status(502)]);
    assert_eq!(
        header(&post_chat(&gw, &chat("m")).await, "x-llm-provider"),
        "b"
    );
    let h = admin_health(&gw).await;
    assert_eq!(
        state_of(&h, "providers", "provider", "a"),
        "unhealthy",
        "{h}"
    );
    assert_eq!(state_of(&h, "providers", "provider", "b"), "healthy", "{h}");
    assert_eq!(state_of(&h, "models", "model", "m"), "degraded", "{h}");
    let m = gw
        .metrics_with(&[r#"signalbox_models{state="degraded"} 1"#])
        .await;
    assert!(
        m.contains(r#"signalbox_providers{state="unhealthy"} 1"#),
        "{m}"
    );
    // b too: the model has nothing usable.
    b.push_script([status(502)]);
    let _ = post_chat(&gw, &chat("m")).await;
    let h = admin_health(&gw).await;
    assert_eq!(state_of(&h, "models", "model", "m"), "unhealthy", "{h}");
}
