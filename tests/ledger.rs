//! The usage ledger over sockets: one row per attempt (a failover's failed attempt included),
//! written to the embedded SQLite file or a PostgreSQL server, aggregated by
//! `GET /admin/usage`, flushed when the gateway stops, and read back at start so budgets
//! survive a restart. Spend and tokens also reach `/metrics`.
//!
//! The PostgreSQL tests need a server: `SIGNALBOX_TEST_POSTGRES_URL` (a role that may create
//! databases; `.ci/run` starts one). Without it they say so and pass.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const KEY: &str = "sk-ledger-client-0123456789";
const PRICE: &str = "price: { input_per_mtok: 1000000, output_per_mtok: 1000000 }";

/// Providers a (fails with 500) and b (serves), one model `m` on both, a key for alice.
fn config(
    a: &signalbox_mock::MockHandle,
    b: &signalbox_mock::MockHandle,
    ledger: &str,
    key_extra: &str,
) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1, {PRICE} }}, {{ provider: b, model: up-b, priority: 2, {PRICE} }}]\nhealth: {{ failure_threshold: 100 }}\nkeys:\n  - {{ id: team-search, key_sha256: \"{}\", user: alice{key_extra} }}\nledger: {ledger}\n",
        provider("a", a),
        provider("b", b),
        sha256_hex(KEY.as_bytes()),
    )
}

fn body() -> Value {
    json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "Say hello."}]})
}

async fn post(gw: &Gateway) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body())
        .send()
        .await
        .unwrap()
}

async fn usage(gw: &Gateway, query: &str) -> (u16, Value) {
    let r = client()
        .get(format!("http://{}/admin/usage?{query}", gw.admin))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The usage by `by` once it counts `attempts` attempts in all (rows are queued when a request
/// ends, just after its answer left).
async fn usage_when(gw: &Gateway, by: &str, attempts: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, v) = usage(gw, &format!("by={by}")).await;
        assert_eq!(status, 200, "{v}");
        let n: u64 = v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["attempts"].as_u64().unwrap())
            .sum();
        if n >= attempts {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "usage never counted {attempts}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn group<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == name)
        .unwrap_or_else(|| panic!("no group {name}: {v}"))
}

/// Every row of the SQLite ledger, as JSON objects, in (request, attempt) order.
fn sqlite_rows(path: &Path) -> Vec<Value> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT request_id, attempt, time, key_id, user_name, route, provider, model, \
             upstream_model, credential, outcome, status, prompt_tokens, completion_tokens, \
             cost_usd, ttfb_ms, duration_ms FROM signalbox_ledger ORDER BY time_ms, attempt",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok(json!({
                "request_id": r.get::<_, String>(0)?,
                "attempt": r.get::<_, i64>(1)?,
                "time": r.get::<_, String>(2)?,
                "key_id": r.get::<_, Option<String>>(3)?,
                "user": r.get::<_, Option<String>>(4)?,
                "route": r.get::<_, String>(5)?,
                "provider": r.get::<_, String>(6)?,
                "model": r.get::<_, String>(7)?,
                "upstream_model": r.get::<_, String>(8)?,
                "credential": r.get::<_, String>(9)?,
                "outcome": r.get::<_, String>(10)?,
                "status": r.get::<_, Option<i64>>(11)?,
                "prompt_tokens": r.get::<_, i64>(12)?,
                "completion_tokens": r.get::<_, i64>(13)?,
                "cost_usd": r.get::<_, f64>(14)?,
                "ttfb_ms": r.get::<_, Option<f64>>(15)?,
                "duration_ms": r.get::<_, f64>(16)?,
            }))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failover_writes_one_row_per_attempt_and_usage_aggregates_them() {
    let a = mock("a").await;
    a.set_default(status(500));
    let b = mock("b").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let gw = Gateway::start(config(
        &a,
        &b,
        &format!("{{ sqlite: \"{}\" }}", db.display()),
        "",
    ));
    let r = post(&gw).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "b");
    let request_id = header(&r, "x-request-id").to_string();
    let answer: Value = r.json().await.unwrap();
    let (prompt, completion) = (
        answer["usage"]["prompt_tokens"].as_u64().unwrap(),
        answer["usage"]["completion_tokens"].as_u64().unwrap(),
    );

    let by_provider = usage_when(&gw, "provider", 2).await;
    assert_eq!(by_provider["by"], "provider");
    assert_eq!(by_provider["backend"], "sqlite");
    let ga = group(&by_provider, "a");
    // a's failed attempt is absorbed by b's answer: an attempt, not a request or an error of
    // its own (DESIGN §8).
    assert_eq!(
        (
            ga["attempts"].as_u64(),
            ga["failed_attempts"].as_u64(),
            ga["requests"].as_u64()
        ),
        (Some(1), Some(0), Some(0))
    );
    assert_eq!(
        ga["cost_usd"].as_f64(),
        Some(0.0),
        "a failed attempt costs nothing"
    );
    let gb = group(&by_provider, "b");
    assert_eq!(gb["failed_attempts"].as_u64(), Some(0));
    assert_eq!(gb["prompt_tokens"].as_u64(), Some(prompt));
    assert_eq!(gb["completion_tokens"].as_u64(), Some(completion));
    // $1 a token.
    let cost = (prompt + completion) as f64;
    assert!(
        (gb["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-6,
        "{gb}"
    );

    let (_, by_key) = usage(&gw, "by=key").await;
    let k = group(&by_key, "team-search");
    assert_eq!(
        (k["requests"].as_u64(), k["attempts"].as_u64()),
        (Some(1), Some(2))
    );
    let (_, by_user) = usage(&gw, "by=user").await;
    assert!((group(&by_user, "alice")["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-6);
    let (_, by_model) = usage(&gw, "by=model").await;
    assert_eq!(group(&by_model, "m")["attempts"].as_u64(), Some(2));
    // A window that ends before the request: nothing in it.
    let (_, before) = usage(&gw, "by=provider&until=2020-01-01T00:00:00Z").await;
    assert_eq!(before["groups"], json!([]));
    let (_, since) = usage(&gw, "by=provider&since=1700000000").await;
    assert_eq!(since["groups"].as_array().unwrap().len(), 2);
    for bad in ["by=team", "since=yesterday", "limit=3"] {
        let (status, v) = usage(&gw, bad).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{bad}"
        );
    }

    // The rows themselves: DESIGN §8's columns, the failed attempt first.
    let rows = sqlite_rows(&db);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (first, second) = (&rows[0], &rows[1]);
    for row in &rows {
        assert_eq!(row["request_id"], request_id.as_str());
        assert_eq!(row["key_id"], "team-search");
        assert_eq!(row["user"], "alice");
        assert_eq!(row["route"], "model:m");
        assert_eq!(row["model"], "m");
        assert_eq!(row["credential"], "none");
        assert!(row["time"].as_str().unwrap().ends_with('Z'));
        assert!(row["duration_ms"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(
        (
            &first["attempt"],
            &first["provider"],
            &first["upstream_model"]
        ),
        (&json!(1), &json!("a"), &json!("up-a"))
    );
    assert_eq!(
        (&first["outcome"], &first["status"]),
        (&json!("server_error"), &json!(500))
    );
    assert_eq!(
        (&second["attempt"], &second["provider"]),
        (&json!(2), &json!("b"))
    );
    assert_eq!(
        (&second["outcome"], &second["status"]),
        (&json!("ok"), &json!(200))
    );
    assert_eq!(second["prompt_tokens"].as_u64(), Some(prompt));
    assert!(second["ttfb_ms"].as_f64().is_some());
    // The client key is nowhere in the ledger.
    let raw = std::fs::read(&db).unwrap();
    assert!(!raw.windows(KEY.len()).any(|w| w == KEY.as_bytes()));

    // Spend and tokens on /metrics, by provider and model.
    let spend = format!(r#"signalbox_spend_usd_total{{provider="b",model="m"}} {cost}"#);
    let tokens =
        format!(r#"signalbox_tokens_total{{provider="b",model="m",kind="prompt"}} {prompt}"#);
    let rows_written = r#"signalbox_ledger_rows_total{result="written"} 2"#;
    let m = gw.metrics_with(&[&spend, &tokens, rows_written]).await;
    assert!(
        m.contains(&spend) && m.contains(&tokens) && m.contains(rows_written),
        "{m}"
    );
    assert!(
        !m.contains("team-search"),
        "no key ids without metrics.per_key"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_requests_write_no_row_and_per_key_metrics_are_opt_in() {
    let a = mock("a").await;
    let b = mock("b").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let cfg = format!(
        "{}metrics: {{ per_key: true }}\n",
        config(
            &a,
            &b,
            &format!("{{ sqlite: \"{}\" }}", db.display()),
            ", rpm: 1"
        )
    );
    let gw = Gateway::start(cfg);
    assert_eq!(post(&gw).await.status(), 200);
    // Over its rpm, and with no key at all: refused by signalbox, no attempt, no row.
    assert_eq!(post(&gw).await.status(), 429);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v = usage_when(&gw, "key", 1).await;
    let k = group(&v, "team-search");
    assert_eq!(
        (k["requests"].as_u64(), k["attempts"].as_u64()),
        (Some(1), Some(1))
    );
    let line = r#"signalbox_key_tokens_total{key="team-search",kind="completion"}"#;
    let m = gw.metrics_with(&[line]).await;
    assert!(m.contains(line), "{m}");
    assert!(
        m.contains(r#"signalbox_key_spend_usd_total{key="team-search"}"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn spend_survives_a_restart_and_rows_survive_a_graceful_stop() {
    let a = mock("a").await;
    let b = mock("b").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    // One answer (about 23 tokens at $1) spends the key's $20 day. The writer waits an hour
    // to fill a batch: only the flush on the way out writes the row.
    let cfg = config(
        &a,
        &b,
        &format!("{{ sqlite: \"{}\", flush_interval: 1h }}", db.display()),
        ", budget: { usd: 20, period: day }",
    );
    let mut gw = GatewayBuilder::new(cfg.clone()).grace(30).start();
    assert_eq!(post(&gw).await.status(), 200);
    let (status, code) = {
        let r = post(&gw).await;
        let s = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        (s, v["error"]["code"].as_str().unwrap().to_string())
    };
    assert_eq!((status, code.as_str()), (429, "budget_exceeded"));
    // A graceful stop writes what is queued before the process leaves.
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        gw.stderr()
    );
    assert_eq!(sqlite_rows(&db).len(), 1);
    drop(gw);

    // A new process reads the day's spend back: the key is still over its budget.
    let gw = Gateway::start(cfg);
    let r = post(&gw).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "budget_exceeded");
    assert_eq!(
        a.calls() + b.calls(),
        1,
        "no upstream call after the restart"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_ledger_usage_says_so() {
    let a = mock("a").await;
    let gw = Gateway::start(format!(
        "providers:\n{}models:\n  m: {{ deployments: [{{ provider: a, model: up }}] }}\n",
        provider("a", &a)
    ));
    let (status, v) = usage(&gw, "by=provider").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("ledger_not_configured"))
    );
}

/// Run a synchronous PostgreSQL call off the test's runtime (the client starts its own).
fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().unwrap()
}

/// A fresh database on the test server, dropped with the guard.
struct PgDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl PgDatabase {
    fn create() -> Option<Self> {
        let Ok(admin_url) = std::env::var("SIGNALBOX_TEST_POSTGRES_URL") else {
            skip_unless_ci("SIGNALBOX_TEST_POSTGRES_URL is not set (no PostgreSQL server)");
            return None;
        };
        let name = format!("sb_gw_{}_{}", std::process::id(), free_port());
        let (url, create) = (admin_url.clone(), format!("CREATE DATABASE {name}"));
        off_runtime(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            c.batch_execute(&create).unwrap();
        });
        let base = admin_url.rsplit_once('/').unwrap().0;
        let url = format!("{base}/{name}");
        Some(Self {
            admin_url,
            name,
            url,
        })
    }

    fn rows(&self) -> Vec<(i32, String, String, Option<i32>)> {
        let url = self.url.clone();
        off_runtime(move || Self::read_rows(&url))
    }

    fn read_rows(url: &str) -> Vec<(i32, String, String, Option<i32>)> {
        let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
        c.query(
            "SELECT attempt::bigint, provider, outcome, status::bigint FROM signalbox_ledger ORDER BY time_ms, attempt",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| {
            (
                i32::try_from(r.get::<_, i64>(0)).unwrap(),
                r.get(1),
                r.get(2),
                r.get::<_, Option<i64>>(3).map(|s| i32::try_from(s).unwrap()),
            )
        })
        .collect()
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (url, drop) = (
            self.admin_url.clone(),
            format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        off_runtime(move || {
            if let Ok(mut c) = postgres::Client::connect(&url, postgres::NoTls) {
                let _ = c.batch_execute(&drop);
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_on_postgresql_records_attempts_and_rebuilds_spend() {
    let Some(pg) = PgDatabase::create() else {
        return;
    };
    let a = mock("a").await;
    a.set_default(status(500));
    let b = mock("b").await;
    let cfg = config(
        &a,
        &b,
        "{ postgres_url_env: SB_TEST_LEDGER_URL }",
        ", budget: { usd: 20, period: month }",
    );
    let gw = GatewayBuilder::new(cfg.clone())
        .env("SB_TEST_LEDGER_URL", &pg.url)
        .start();
    assert_eq!(post(&gw).await.status(), 200);
    let v = usage_when(&gw, "provider", 2).await;
    assert_eq!(v["backend"], "postgres");
    // Absorbed by b's answer: no error of a's own.
    assert_eq!(group(&v, "a")["failed_attempts"].as_u64(), Some(0));
    assert_eq!(group(&v, "a")["attempts"].as_u64(), Some(1));
    assert_eq!(
        pg.rows(),
        [
            (1, "a".to_string(), "server_error".to_string(), Some(500)),
            (2, "b".to_string(), "ok".to_string(), Some(200)),
        ]
    );
    // The URL (it holds the password) is never logged.
    assert!(!gw.stderr().contains(&pg.url));
    drop(gw);
    let gw = GatewayBuilder::new(cfg)
        .env("SB_TEST_LEDGER_URL", &pg.url)
        .start();
    let r = post(&gw).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["code"], "budget_exceeded",
        "the month's spend came back: {v}"
    );
}
