//! Hedged first token (DESIGN §5): when the first candidate shows no first byte in time, the
//! next starts beside it; the first to commit serves, the other is closed at once and counted
//! `hedge_lost`; one answer, both attempts visible. Over sockets, with the mock's delays.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Behaviour, MockHandle};

/// Where the providers' key comes from (set by [`start`]): Anthropic-kind mocks want one.
const KEY_ENV: &str = "SIGNALBOX_HEDGE_TEST_KEY";

fn start(config: String) -> Gateway {
    GatewayBuilder::new(config)
        .env(KEY_ENV, "sk-provider-hedge-key")
        .start()
}

const NO_BREAKERS: &str = "health: { failure_threshold: 1000, bench_after: 64, cooldown: 1ms }\n";

/// Model `m`: `a` first, then `b`, both of `kind`; `failover.hedge` = `hedge`.
fn config_of(kind: &str, a: &MockHandle, b: &MockHandle, hedge: &str, extra: &str) -> String {
    format!(
        "providers:\n  a: {{ kind: {kind}, base_url: \"{}\", credentials: [{{ id: k, key_env: {KEY_ENV} }}] }}\n  b: {{ kind: {kind}, base_url: \"{}\", credentials: [{{ id: k, key_env: {KEY_ENV} }}] }}\n\
         models:\n  m:\n    strategy: priority\n    deployments:\n      - {{ provider: a, model: up-a, priority: 1 }}\n      - {{ provider: b, model: up-b, priority: 2 }}\n\
         failover: {{ hedge: {hedge} }}\n{NO_BREAKERS}{extra}",
        a.base_url(),
        b.base_url(),
    )
}

fn config(a: &MockHandle, b: &MockHandle, hedge: &str) -> String {
    config_of("openai", a, b, hedge, "")
}

fn slow(ms: u64) -> Behaviour {
    Behaviour::SlowHeader { ms }
}

fn stream_chat(model: &str) -> Value {
    json!({
        "model": model,
        "stream": true,
        "messages": [{"role": "user", "content": "Say hello."}]
    })
}

async fn post_messages(gw: &Gateway, body: &Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

fn messages(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello."}]
    })
}

/// `POST /admin/explain` of a body.
async fn explain(gw: &Gateway, body: &Value) -> Value {
    admin_post_json(gw, "/admin/explain", body).await
}

/// Every ledger row, as (attempt, provider, outcome, absorbed).
fn ledger_rows(path: &std::path::Path) -> Vec<(i64, String, String, i64)> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT attempt, provider, outcome, absorbed FROM signalbox_ledger ORDER BY attempt",
        )
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_first_provider_is_raced_and_the_hedge_serves_at_once() {
    let a = mock("a").await;
    let b = mock("b").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let gw = start(config_of(
        "openai",
        &a,
        &b,
        "{ after: 300ms }",
        &format!(
            "ledger: {{ sqlite: \"{}\" }}\nlog: {{ format: json }}\n",
            db.display()
        ),
    ));
    // A whole answer: the first byte would come at 4 s.
    a.push_script([slow(4_000)]);
    let started = Instant::now();
    let r = post_chat(&gw, &chat("m")).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert!(
        took < Duration::from_millis(2_000),
        "answered by the hedge: {took:?}"
    );
    assert!(
        took >= Duration::from_millis(300),
        "not before `after`: {took:?}"
    );
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(header(&r, "x-llm-hedged"), "won");
    let reason = header(&r, "x-llm-routing-reason").to_string();
    let id = header(&r, "x-request-id").to_string();
    let after: u64 = reason
        .split(" hedge=after:")
        .nth(1)
        .unwrap_or_else(|| panic!("{reason}"))
        .parse()
        .unwrap();
    assert!((300..700).contains(&after), "{reason}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "m");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    assert_eq!((a.calls(), b.calls()), (1, 1));

    // The access line names both attempts; the metric counts the win.
    let line = gw.json_access_line(&id).await;
    let tried = line["tried"].as_str().unwrap_or_default().to_string();
    assert!(
        tried.contains("a/up-a") && tried.contains("hedge_lost"),
        "{line}"
    );
    assert!(tried.contains("b/up-b") && tried.contains(":ok"), "{line}");
    gw.metrics_with(&[r#"signalbox_hedges_total{outcome="won"} 1"#])
        .await;
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"signalbox_attempts_total{provider="a",outcome="hedge_lost"} 1"#),
        "{metrics}"
    );
    // A lost hedge is no failover and no failure of a's.
    assert!(!metrics.contains(r#"signalbox_failovers_total{provider="a",reason="hedge_lost"} 1"#));
    let health = admin_json(&gw, "/admin/health").await.to_string();
    assert!(!health.contains("\"consecutive_failures\":1"), "{health}");

    // The ledger: the loser's row absorbed, the winner's the request.
    let rows = loop {
        let rows = ledger_rows(&db);
        if rows.len() == 2 {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        rows,
        vec![
            (1, "a".to_string(), "hedge_lost".to_string(), 1),
            (2, "b".to_string(), "ok".to_string(), 0),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_losers_connection_is_closed_within_100ms_of_the_win() {
    let a = mock("a").await;
    let b = mock("b").await;
    for stream in [false, true] {
        // A gateway per hedge: the share cap counts the last second's requests.
        let gw = start(config(&a, &b, "{ after: 300ms }"));
        a.reset();
        a.push_script([Behaviour::Hang]);
        let body = if stream { stream_chat("m") } else { chat("m") };
        let r = post_chat(&gw, &body).await;
        let answered = Instant::now();
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-llm-hedged"), "won", "stream {stream}");
        let (text, broken) = read_all(r).await;
        assert!(!broken && !text.is_empty(), "{text}");
        // The mock sees the hang-up (the gateway dropped the loser before it answered).
        let deadline = Instant::now() + Duration::from_secs(2);
        let closed = loop {
            if let Some(t) = a.hang_ups().first().copied() {
                break t;
            }
            assert!(
                Instant::now() < deadline,
                "the loser's connection stayed open"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(
            closed <= answered + Duration::from_millis(100),
            "closed {:?} after the answer",
            closed.saturating_duration_since(answered)
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_first_provider_that_answers_in_time_is_not_hedged() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(config(&a, &b, "{ after: 600ms }"));
    a.push_script([slow(150)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    assert_eq!(header(&r, "x-llm-hedged"), "", "no hedge ran");
    assert!(!header(&r, "x-llm-routing-reason").contains("hedge="));
    assert_eq!(b.calls(), 0);
    // A stream's header alone is no first byte for the hold: its first content came in time.
    a.push_script([Behaviour::Stream {
        chunks: 3,
        gap_ms: 150,
    }]);
    let r = post_chat(&gw, &stream_chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    assert_eq!(b.calls(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hedge_that_loses_is_closed_and_the_first_attempt_serves() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(config(&a, &b, "{ after: 100ms, min_after: 50ms }"));
    a.push_script([slow(500)]);
    b.push_script([Behaviour::Hang]);
    let r = post_chat(&gw, &chat("m")).await;
    let answered = Instant::now();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(header(&r, "x-llm-hedged"), "lost");
    assert_eq!(header(&r, "x-llm-fallback"), "false");
    assert_eq!(b.calls(), 1, "the hedge was called");
    let deadline = Instant::now() + Duration::from_secs(2);
    while b.hang_ups().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the hedge's connection stayed open"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(b.hang_ups()[0] <= answered + Duration::from_millis(100));
    gw.metrics_with(&[r#"signalbox_hedges_total{outcome="lost"} 1"#])
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn when_both_are_slow_the_faster_wins() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(config(&a, &b, "{ after: 200ms }"));
    // a answers at 3 s; b, started at 200 ms, at 700 ms.
    a.push_script([slow(3_000)]);
    b.push_script([slow(500)]);
    let started = Instant::now();
    let r = post_chat(&gw, &chat("m")).await;
    let took = started.elapsed();
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-hedged"), "won");
    assert!(took < Duration::from_millis(2_500), "{took:?}");
    // And the other way round: a answers first (a gateway per hedge: the share cap counts the
    // last second's requests).
    drop(gw);
    let gw = start(config(&a, &b, "{ after: 200ms }"));
    a.push_script([slow(700)]);
    b.push_script([slow(3_000)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-hedged"), "lost");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_that_fails_beside_its_rival_leaves_the_rival_running() {
    let a = mock("a").await;
    let b = mock("b").await;
    let c = mock("c").await;
    // a's own TTFB timeout is short (so it can fail while the hedge waits); b's is not.
    // A gateway per case: the share cap counts the last second's requests.
    let gateway = || {
        Gateway::start(format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", ttfb_timeout: 500ms }}\n{}{}models:\n  m:\n    strategy: priority\n    deployments:\n      - {{ provider: a, model: up-a, priority: 1 }}\n      - {{ provider: b, model: up-b, priority: 2 }}\n      - {{ provider: c, model: up-c, priority: 3 }}\n\
         failover: {{ hedge: {{ after: 100ms, min_after: 50ms }} }}\n{NO_BREAKERS}",
        a.base_url(),
        provider("b", &b),
        provider("c", &c),
    ))
    };
    let gw = gateway();
    // The hedge (b) fails at once; a goes on and serves; nothing else is called.
    a.push_script([slow(400)]);
    b.push_script([status(500)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(header(&r, "x-llm-hedged"), "lost");
    assert_eq!(c.calls(), 0, "the failed hedge is not replaced");
    let gw = gateway();
    // The first attempt fails (its TTFB timeout, at 500 ms) while the hedge waits: the hedge
    // is the request's attempt, and serves at 800 ms.
    a.push_script([Behaviour::Hang]);
    b.push_script([slow(700)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(header(&r, "x-llm-hedged"), "won");
    assert_eq!(c.calls(), 0);
    let gw = gateway();
    // Both fail: the plan moves on to c, which runs alone (one hedge per request).
    a.push_script([Behaviour::Hang]);
    b.push_script([status(500)]);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "c");
    assert_eq!(header(&r, "x-llm-attempts"), "3");
    assert_eq!(
        header(&r, "x-llm-hedged"),
        "lost",
        "the hedge ran and did not serve"
    );
    assert_eq!(c.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_hedge_on_first_content_in_both_dialects_translated_or_not() {
    // OpenAI callers on OpenAI-kind providers, Anthropic callers on Anthropic-kind ones, and
    // Anthropic callers translated onto OpenAI-kind ones.
    for (kind, anthropic_caller) in [("openai", false), ("anthropic", true), ("openai", true)] {
        let a = mock("a").await;
        let b = mock("b").await;
        let gw = start(config_of(kind, &a, &b, "{ after: 300ms }", ""));
        a.push_script([slow(3_000)]);
        let started = Instant::now();
        let r = if anthropic_caller {
            post_messages(&gw, &messages("m", true)).await
        } else {
            post_chat(&gw, &stream_chat("m")).await
        };
        assert_eq!(
            r.status(),
            200,
            "{kind} {anthropic_caller}: {}",
            gw.stderr()
        );
        assert_eq!(
            header(&r, "x-llm-hedged"),
            "won",
            "{kind} {anthropic_caller}"
        );
        assert_eq!(header(&r, "x-llm-attempts"), "2");
        let (text, broken) = read_all(r).await;
        assert!(started.elapsed() < Duration::from_millis(2_500), "{kind}");
        assert!(!broken, "{text}");
        if anthropic_caller {
            assert!(text.contains("message_stop"), "{text}");
            assert_eq!(
                text.matches("event: message_start").count(),
                1,
                "one answer: {text}"
            );
        } else {
            assert!(text.contains("[DONE]"), "{text}");
            assert_eq!(text.matches("[DONE]").count(), 1, "one answer: {text}");
        }
        // Non-stream too, Anthropic callers (a gateway per hedge: the share cap).
        if anthropic_caller {
            let gw = start(config_of(kind, &a, &b, "{ after: 300ms }", ""));
            a.push_script([slow(3_000)]);
            let r = post_messages(&gw, &messages("m", false)).await;
            assert_eq!(header(&r, "x-llm-hedged"), "won");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["type"], "message", "{v}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_share_cap_holds_under_200_concurrent_slow_requests() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(config(
        &a,
        &b,
        "{ after: 100ms, min_after: 50ms, max_share: 0.1 }",
    ));
    a.set_default(slow(1_500));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = gw.url("/v1/chat/completions");
    let started = Instant::now();
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let client = client.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let r = client.post(url).json(&chat("m")).send().await.unwrap();
                (r.status().as_u16(), header(&r, "x-llm-hedged").to_string())
            })
        })
        .collect();
    let mut won = 0;
    for t in tasks {
        let (status, hedged) = t.await.unwrap();
        assert_eq!(status, 200);
        won += usize::from(hedged == "won");
    }
    let spread = started.elapsed();
    let hedges = b.calls();
    assert_eq!(a.calls(), 200);
    assert_eq!(won as u64, hedges, "every hedge served (b answers at once)");
    // A tenth of the last second's requests: 20 while the burst lasts a second, a few more
    // should it straddle two (the window slides).
    assert!(hedges >= 1, "some were hedged");
    assert!(hedges <= 30, "{hedges} hedges of 200 requests ({spread:?})");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_hanging_up_cancels_both_attempts() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(config(&a, &b, "{ after: 100ms, min_after: 50ms }"));
    a.set_default(Behaviour::Hang);
    b.set_default(Behaviour::Hang);
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(600))
        .build()
        .unwrap();
    let r = quick
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("m"))
        .send()
        .await;
    assert!(r.is_err(), "the caller gave up");
    let deadline = Instant::now() + Duration::from_secs(3);
    while a.hang_ups().is_empty() || b.hang_ups().is_empty() {
        assert!(
            Instant::now() < deadline,
            "both upstream calls end with the caller: a {:?} b {:?}",
            a.hang_ups(),
            b.hang_ups()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((a.calls(), b.calls()), (1, 1));
    gw.metrics_with(&[r#"signalbox_attempts_total{provider="b",outcome="cancelled"} 1"#])
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_percentile_hedge_follows_the_targets_own_record() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = Gateway::start(format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    deployments:\n      - {{ provider: a, model: up-a, priority: 1 }}\n      - {{ provider: b, model: up-b, priority: 2 }}\n\
         policies:\n  fast:\n    hedge: {{ after: p50, min_after: 50ms }}\n    select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ]\n{NO_BREAKERS}",
        provider("a", &a),
        provider("b", &b),
    ));
    // No record yet: a target nobody has timed is not called slow.
    a.push_script([slow(500)]);
    let r = post_chat(&gw, &chat("fast")).await;
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    // Explain says so.
    let explained = explain(&gw, &chat("fast")).await;
    assert_eq!(explained["hedge"]["after"], "p50", "{explained}");
    assert_eq!(explained["hedge"]["candidate"], "b/up-b", "{explained}");
    // Its own record: a's answers take ~80 ms.
    for _ in 0..12 {
        a.push_script([slow(80)]);
        let r = post_chat(&gw, &chat("fast")).await;
        assert_eq!(header(&r, "x-llm-attempts"), "1");
    }
    let explained = explain(&gw, &chat("fast")).await;
    let starts = explained["hedge"]["starts_after_ms"].as_u64().unwrap();
    assert!((80..400).contains(&starts), "{explained}");
    // Now a is slower than half its record: the hedge starts at about that p50.
    a.push_script([slow(3_000)]);
    let started = Instant::now();
    let r = post_chat(&gw, &chat("fast")).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-hedged"), "won");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// `signalbox -t` on a config text: what it printed.
fn check_config(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_signalbox"))
        .args(["-t", "-c", path.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_hedge_settings_are_refused_naming_the_key() {
    let cfg = "providers:\n  a: { kind: openai, base_url: \"http://127.0.0.1:9/v1\" }\n\
               models:\n  m:\n    deployments: [ { provider: a, model: up-a } ]\n\
               failover: { hedge: { after: p100, max_share: 0, wait: 1s } }\n";
    let out = check_config(cfg);
    assert!(out.contains("failover.hedge.wait"), "{out}");
    let cfg = cfg.replace(", wait: 1s", "");
    let out = check_config(&cfg);
    assert!(out.contains("failover.hedge.after"), "{out}");
    assert!(out.contains("failover.hedge.max_share"), "{out}");
}
