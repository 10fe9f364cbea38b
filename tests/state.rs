//! Shared state across replicas on a real `redis-server`: two gateways share one key's rpm
//! window, an ejection decided by one is honoured by the other, and a Redis that goes away
//! leaves each replica serving on its own counters (one log line, `state_backend_up 0`) until
//! it is back, when the counts are pushed again.
//!
//! Needs `redis-server` on the PATH (`.ci/run` installs Debian's); without it the tests say so
//! and pass. Replicas agree after sync rounds, which the tests wait for through
//! `signalbox_state_syncs_total` (a round that pushed, then a round of the other that pulled).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const KEY: &str = "sk-state-client-0123456789";

struct Redis {
    port: u16,
    child: Option<Child>,
}

impl Redis {
    fn start() -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            skip_unless_ci("redis-server is not installed");
            return None;
        }
        let mut r = Self {
            port: free_port(),
            child: None,
        };
        r.restart();
        Some(r)
    }

    /// Start (again) on the same port, empty: no persistence. `DEBUG` is allowed from
    /// loopback (Redis 7 refuses it otherwise), for `DEBUG SLEEP`.
    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pong() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pong(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Make the server unresponsive for `seconds` (`DEBUG SLEEP`), from a thread of its own.
    fn pause(&self, seconds: u32) -> std::thread::JoinHandle<()> {
        use std::io::{Read, Write};
        let port = self.port;
        let sleeper = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(s, "DEBUG SLEEP {seconds}\r\n").unwrap();
            let mut buf = [0u8; 5];
            let _ = s.read_exact(&mut buf);
        });
        // Paused once a PING goes unanswered.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.pong() {
            assert!(Instant::now() < deadline, "DEBUG SLEEP did not take");
        }
        sleeper
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn config(
    a: &signalbox_mock::MockHandle,
    b: &signalbox_mock::MockHandle,
    key_extra: &str,
) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    failure_threshold: 1\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\nhealth: {{ cooldown: 5m, probe_interval: 1h, bench_after: 0 }}\nkeys:\n  - {{ id: shared, key_sha256: \"{}\"{key_extra} }}\nstate: {{ redis_url_env: SB_TEST_REDIS_URL, sync_interval: 100ms }}\n",
        provider("a", a),
        provider("b", b),
        sha256_hex(KEY.as_bytes()),
    )
}

fn replica(cfg: &str, redis: &Redis) -> Gateway {
    GatewayBuilder::new(cfg)
        .env("SB_TEST_REDIS_URL", &redis.url())
        .start()
}

async fn post(gw: &Gateway) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
}

/// A sample of `/metrics`, 0 when absent.
async fn sample(gw: &Gateway, series: &str) -> u64 {
    let m = gw.metrics().await;
    m.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

const SYNCS_OK: &str = r#"signalbox_state_syncs_total{result="ok"}"#;
const SYNCS_FAILED: &str = r#"signalbox_state_syncs_total{result="failed"}"#;

/// Wait until `gw` completed `rounds` more sync rounds with this result.
async fn rounds(gw: &Gateway, series: &str, rounds: u64) {
    let start = sample(gw, series).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while sample(gw, series).await < start + rounds {
        assert!(Instant::now() < deadline, "no sync round: {}", gw.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `first` pushed what it counted, then `second` pulled it.
async fn agree(first: &Gateway, second: &Gateway) {
    rounds(first, SYNCS_OK, 2).await;
    rounds(second, SYNCS_OK, 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_share_one_keys_rpm_window() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    let b = mock("b").await;
    let cfg = config(&a, &b, ", rpm: 3");
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    assert_eq!(post(&one).await.status(), 200);
    assert_eq!(post(&one).await.status(), 200);
    agree(&one, &two).await;
    // Replica two has seen one's two requests: one more fits, then the window is full.
    assert_eq!(post(&two).await.status(), 200);
    let r = post(&two).await;
    assert_eq!(r.status(), 429);
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limited");
    agree(&two, &one).await;
    assert_eq!(post(&one).await.status(), 429, "and replica one sees two's");
    assert_eq!(a.calls(), 3, "refused requests made no upstream call");
    assert_eq!(sample(&one, "signalbox_state_backend_up").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ejection_on_one_replica_is_skipped_by_the_other() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    a.set_default(status(500));
    let b = mock("b").await;
    let cfg = config(&a, &b, "");
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    let r = post(&one).await;
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(a.calls(), 1, "a failed once: ejected on replica one");
    agree(&one, &two).await;
    let health: Value = client()
        .get(format!("http://{}/admin/health", two.admin))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let target = health["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == "a")
        .unwrap();
    assert_eq!(target["state"], "ejected", "{target}");
    let r = post(&two).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(
        header(&r, "x-llm-attempts"),
        "1",
        "a skipped without a call"
    );
    assert_eq!(a.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_serves_alone_while_redis_is_away_and_resyncs_when_it_returns() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let a = mock("a").await;
    let b = mock("b").await;
    let cfg = config(&a, &b, ", rpm: 2");
    let one = replica(&cfg, &redis);
    rounds(&one, SYNCS_OK, 1).await;
    redis.stop();
    rounds(&one, SYNCS_FAILED, 3).await;
    assert_eq!(sample(&one, "signalbox_state_backend_up").await, 0);
    // Nothing blocks or fails for it: the key's own window still counts, locally.
    let started = Instant::now();
    assert_eq!(post(&one).await.status(), 200);
    assert_eq!(post(&one).await.status(), 200);
    assert_eq!(post(&one).await.status(), 429, "the local window holds");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        sample(&one, "signalbox_state_fallbacks_total").await >= 1,
        "admission fell back to the local counters"
    );
    let log = one.stderr();
    assert_eq!(
        log.matches("shared state backend unreachable").count(),
        1,
        "logged once: {log}"
    );
    assert!(!log.contains(&redis.url()), "the URL is never logged");

    // Back, empty: the replica pushes what it counted meanwhile.
    redis.restart();
    rounds(&one, SYNCS_OK, 2).await;
    assert_eq!(sample(&one, "signalbox_state_backend_up").await, 1);
    assert!(one.stderr().contains("reachable again"));
    let two = replica(&cfg, &redis);
    rounds(&two, SYNCS_OK, 2).await;
    let r = post(&two).await;
    assert_eq!(
        r.status(),
        429,
        "replica two sees the two requests one made alone"
    );
}

/// Replicas with a sync slow enough that only exact admission can keep them in step.
fn slow_sync(cfg: &str) -> String {
    cfg.replace("sync_interval: 100ms", "sync_interval: 900ms")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keys_rpm_holds_exactly_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    let b = mock("b").await;
    let cfg = slow_sync(&config(&a, &b, ", rpm: 4"));
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    // 2 + 2, faster than any sync round: then the fifth is refused on either replica.
    for gw in [&one, &one, &two, &two] {
        assert_eq!(post(gw).await.status(), 200);
    }
    for gw in [&one, &two] {
        let r = post(gw).await;
        assert_eq!(r.status(), 429);
        let wait: u64 = header(&r, "retry-after").parse().unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
    }
    assert_eq!(a.calls(), 4, "exactly the limit reached the provider");
    assert_eq!(sample(&one, "signalbox_state_fallbacks_total").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_redis_never_holds_a_request_past_the_timeout() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    let b = mock("b").await;
    let cfg = config(&a, &b, ", rpm: 100");
    let one = replica(&cfg, &redis);
    // `state.limits: synced`: no round trip on the request path at all.
    let synced = replica(
        &cfg.replace(
            "sync_interval: 100ms }",
            "sync_interval: 100ms, limits: synced }",
        ),
        &redis,
    );
    rounds(&one, SYNCS_OK, 1).await;
    let paused = redis.pause(2);
    for gw in [&one, &synced] {
        let started = Instant::now();
        assert_eq!(post(gw).await.status(), 200);
        assert!(
            started.elapsed() < Duration::from_millis(1_000),
            "served within state.timeout, not after the pause: {:?}",
            started.elapsed()
        );
    }
    assert!(sample(&one, "signalbox_state_fallbacks_total").await >= 1);
    assert_eq!(
        sample(&synced, "signalbox_state_fallbacks_total").await,
        0,
        "synced mode never asks"
    );
    paused.join().unwrap();
}

/// Two deployments of `m` with `a_extra` on a's (priority 1) and a key with `key_extra`;
/// a slow sync, so only exact admission keeps the replicas in step.
fn deployment_config(
    a: &signalbox_mock::MockHandle,
    b: &signalbox_mock::MockHandle,
    a_extra: &str,
    key_extra: &str,
) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1{a_extra} }}, {{ provider: b, model: up-b, priority: 2 }}]\nkeys:\n  - {{ id: shared, key_sha256: \"{}\"{key_extra} }}\nstate: {{ redis_url_env: SB_TEST_REDIS_URL, sync_interval: 900ms }}\n",
        provider("a", a),
        provider("b", b),
        sha256_hex(KEY.as_bytes()),
    )
}

/// A request whose estimate is its output bound: 1,000 tokens ($0.01 at $10 per million).
async fn post_bounded(gw: &Gateway) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "m", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
}

/// Send one request to `first` (a's answer held back 1.5 s) and, once a has it — so its
/// admission is in the store — one to `second`: two requests in flight at once on two
/// replicas. Returns both answers.
async fn overlapping(
    a: &signalbox_mock::MockHandle,
    first: &Gateway,
    second: &Gateway,
) -> (reqwest::Response, reqwest::Response) {
    a.push_script([signalbox_mock::Behaviour::SlowHeader { ms: 1_500 }]);
    let url = first.url("/v1/chat/completions");
    let held = tokio::spawn(async move {
        client()
            .post(url)
            .bearer_auth(KEY)
            .json(&json!({"model": "m", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.calls() == 0 {
        assert!(
            Instant::now() < deadline,
            "the first request never reached a"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let other = post_bounded(second).await;
    (held.await.unwrap(), other)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployments_rpm_holds_exactly_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    let b = mock("b").await;
    let cfg = deployment_config(&a, &b, ", rpm: 4", "");
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    for gw in [&one, &one, &two, &two] {
        let r = post(gw).await;
        assert_eq!(header(&r, "x-llm-provider"), "a");
    }
    // a's minute is full in the store: either replica skips it without a call.
    for gw in [&one, &two] {
        let r = post(gw).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-llm-provider"), "b");
        assert_eq!(header(&r, "x-llm-attempts"), "1", "a skipped, not called");
    }
    assert_eq!(a.calls(), 4, "exactly a's rpm reached it");
    let skipped = r#"signalbox_skipped_candidates_total{reason="rpm_full"}"#;
    assert!(sample(&one, skipped).await >= 1);
    assert_eq!(sample(&one, "signalbox_state_fallbacks_total").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployments_tpm_reserves_the_estimate_across_replicas() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    let b = mock("b").await;
    // Room for one request's estimate (1,000 output tokens and the prompt), not two.
    let cfg = deployment_config(&a, &b, ", tpm: 1500", "");
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    let (first, second) = overlapping(&a, &one, &two).await;
    assert_eq!(header(&first, "x-llm-provider"), "a");
    assert_eq!(
        header(&second, "x-llm-provider"),
        "b",
        "the first's reservation filled a's minute in the store"
    );
    assert_eq!(a.calls(), 1);
    // The first's answer used a few tokens: settled, the reservation is given back, and once
    // the replicas synced a has room again.
    agree(&one, &two).await;
    let r = post_bounded(&two).await;
    assert_eq!(
        header(&r, "x-llm-provider"),
        "a",
        "the settled usage left room"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn budgets_reserve_the_estimate_and_settle_to_the_cost() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    let b = mock("b").await;
    // An estimate of $0.01 against $0.015 budgets: one reservation fits, two do not.
    let price = ", price: { input_per_mtok: 10, output_per_mtok: 10 }";
    let cfg = deployment_config(
        &a,
        &b,
        &format!("{price}, budget: {{ usd: 0.015, period: day }}"),
        "",
    );
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    let (first, second) = overlapping(&a, &one, &two).await;
    assert_eq!(header(&first, "x-llm-provider"), "a");
    assert_eq!(
        header(&second, "x-llm-provider"),
        "b",
        "a's budget is reserved by the request in flight"
    );
    agree(&one, &two).await;
    let r = post_bounded(&two).await;
    assert_eq!(
        header(&r, "x-llm-provider"),
        "a",
        "the answer cost a fraction of its estimate: settled, a's budget has room"
    );

    // A key's budget: the second request in flight is the caller's 429.
    let a = mock("a").await;
    let b = mock("b").await;
    let cfg = deployment_config(&a, &b, price, ", budget: { usd: 0.015, period: day }");
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    let (first, second) = overlapping(&a, &one, &two).await;
    assert_eq!(first.status(), 200);
    assert_eq!(second.status(), 429);
    assert!(header(&second, "retry-after").parse::<u64>().unwrap() >= 1);
    let v: Value = second.json().await.unwrap();
    assert_eq!(v["error"]["code"], "budget_exceeded");
    assert_eq!(
        b.calls(),
        0,
        "a key's spent budget is no reason to fail over"
    );
    agree(&one, &two).await;
    assert_eq!(
        post_bounded(&two).await.status(),
        200,
        "settled to the cost"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failover_target_full_in_the_store_is_passed_over_on_pingoras_loop() {
    let Some(redis) = Redis::start() else { return };
    let a = mock("a").await;
    a.set_default(status(500));
    let b = mock("b").await;
    let c = mock("c").await;
    // Streams with the hold off fail over on Pingora's loop (`upstream_peer`); the requests
    // follow each other well within a sync round, so only the store knows b's minute is full.
    let cfg = format!(
        "providers:\n{}{}{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2, rpm: 1 }}, {{ provider: c, model: up-c, priority: 3 }}]\nhealth: {{ failure_threshold: 100 }}\nfailover: {{ first_chunk_hold: 0 }}\nstate: {{ redis_url_env: SB_TEST_REDIS_URL, sync_interval: 900ms }}\n",
        provider("a", &a),
        provider("b", &b),
        provider("c", &c),
    );
    let one = replica(&cfg, &redis);
    let two = replica(&cfg, &redis);
    let stream = |gw: &Gateway| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .json(&json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let r = stream(&two).await.unwrap();
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let _ = r.text().await.unwrap();
    let r = stream(&one).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-llm-provider"),
        "c",
        "b's minute is full in the store"
    );
    assert_eq!(
        header(&r, "x-llm-attempts"),
        "2",
        "a, then c: b was not called"
    );
    assert!(r.text().await.unwrap().contains("[DONE]"));
    assert_eq!(b.calls(), 1);
}
