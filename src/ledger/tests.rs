//! The core checks run on SQLite always and on PostgreSQL when `SIGNALBOX_TEST_POSTGRES_URL`
//! names a server (each test in a fresh database of its own, dropped at the end).

use std::sync::atomic::AtomicU32;
use std::time::Instant;

use super::*;

/// 2026-12-01T08:25:23.123Z
const T0: i64 = 1_796_113_523_123;
const DAY: i64 = 86_400_000;

fn base(request_id: &str, time_ms: i64) -> LedgerRow {
    LedgerRow {
        request_id: request_id.into(),
        attempt: 1,
        time_ms,
        key_id: None,
        user: None,
        route: "model:gpt".into(),
        provider: "openai".into(),
        model: "gpt".into(),
        upstream_model: "gpt-4o".into(),
        credential: "c1".into(),
        outcome: "ok",
        status: Some(200),
        prompt_tokens: 0,
        completion_tokens: 0,
        cost_micro_usd: 0,
        ttfb_ms: Some(12.5),
        duration_ms: 40.0,
        absorbed: false,
    }
}

/// Three requests over two days: r1 failed over from openai to anthropic, r2 succeeded at
/// once, r3 (no key, no user) was retried on day two.
fn fixture() -> Vec<LedgerRow> {
    let k1 = Some(Arc::<str>::from("k1"));
    let alice = Some(Arc::<str>::from("alice"));
    vec![
        LedgerRow {
            key_id: k1.clone(),
            user: alice.clone(),
            outcome: "timeout",
            status: None,
            ttfb_ms: None,
            ..base("r1", T0)
        },
        LedgerRow {
            attempt: 2,
            key_id: k1,
            user: alice,
            provider: "anthropic".into(),
            upstream_model: "claude".into(),
            prompt_tokens: 100,
            completion_tokens: 50,
            cost_micro_usd: 1_500,
            ..base("r1", T0 + 10)
        },
        LedgerRow {
            key_id: Some("k2".into()),
            prompt_tokens: 10,
            completion_tokens: 5,
            cost_micro_usd: 250,
            ..base("r2", T0 + 1_000)
        },
        LedgerRow {
            model: "mini".into(),
            upstream_model: "gpt-4o-mini".into(),
            outcome: "status_5xx",
            status: Some(503),
            ..base("r3", T0 + DAY)
        },
        LedgerRow {
            attempt: 2,
            model: "mini".into(),
            upstream_model: "gpt-4o-mini".into(),
            prompt_tokens: 7,
            completion_tokens: 3,
            cost_micro_usd: 40,
            ..base("r3", T0 + DAY + 5)
        },
    ]
}

type Summary = (Option<String>, u64, u64, u64, u64, u64, f64);

fn usage(
    ledger: &Ledger,
    by: UsageBy,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
) -> Vec<Summary> {
    let q = UsageQuery {
        by,
        since_ms,
        until_ms,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let rows = rt.block_on(ledger.usage(q)).unwrap();
    rows.into_iter()
        .map(|r| {
            let UsageRow {
                group,
                requests,
                attempts,
                failed_attempts,
                prompt_tokens,
                completion_tokens,
                cost_usd,
            } = r;
            (
                group,
                requests,
                attempts,
                failed_attempts,
                prompt_tokens,
                completion_tokens,
                cost_usd,
            )
        })
        .collect()
}

fn g(s: &str) -> Option<String> {
    Some(s.to_string())
}

fn opts() -> LedgerOptions {
    LedgerOptions {
        interval: Duration::from_millis(20),
        ..LedgerOptions::default()
    }
}

/// A database for one test, and a way to reach it from outside the ledger.
enum Db {
    Sqlite(tempfile::TempDir),
    Postgres(TempPg),
}

impl Db {
    fn sqlite() -> Db {
        Db::Sqlite(tempfile::tempdir().unwrap())
    }

    fn target(&self) -> LedgerTarget {
        match self {
            Db::Sqlite(dir) => LedgerTarget::Sqlite(dir.path().join("nested/ledger.db")),
            Db::Postgres(pg) => LedgerTarget::Postgres {
                url: pg.url.clone(),
            },
        }
    }

    fn execute(&self, sql: &str) {
        match self {
            Db::Sqlite(dir) => {
                let c = rusqlite::Connection::open(dir.path().join("nested/ledger.db")).unwrap();
                c.execute_batch(sql).unwrap();
            }
            Db::Postgres(pg) => {
                let mut c = postgres::Client::connect(&pg.url, postgres::NoTls).unwrap();
                c.batch_execute(sql).unwrap();
            }
        }
    }
}

/// A fresh Postgres database, dropped with the value.
struct TempPg {
    admin_url: String,
    name: String,
    url: String,
}

impl TempPg {
    fn create() -> Option<TempPg> {
        let Ok(admin_url) = std::env::var("SIGNALBOX_TEST_POSTGRES_URL") else {
            // `.ci/run` starts a server and sets SIGNALBOX_CI: there a missing one fails.
            assert!(
                std::env::var_os("SIGNALBOX_CI").is_none(),
                "SIGNALBOX_CI is set and SIGNALBOX_TEST_POSTGRES_URL is not: the PostgreSQL test may not skip"
            );
            println!("skipped: SIGNALBOX_TEST_POSTGRES_URL is not set");
            return None;
        };
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "sb_ledger_{}_{nanos}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        );
        let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        // Same server and credentials, the new database as the path.
        let (scheme, rest) = admin_url.split_once("://").unwrap();
        let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
        let query = tail.find('?').map_or("", |i| &tail[i..]);
        let url = format!("{scheme}://{authority}/{name}{query}");
        Some(TempPg {
            admin_url,
            name,
            url,
        })
    }
}

impl Drop for TempPg {
    fn drop(&mut self) {
        if let Ok(mut admin) = postgres::Client::connect(&self.admin_url, postgres::NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// Aggregates by each dimension, the time window, spend by day, and the rows still there
/// after closing and reopening.
fn aggregates_and_durability(db: &Db) {
    let ledger = Ledger::open(db.target(), opts()).unwrap();
    for row in fixture() {
        ledger.record(row);
    }
    // No flush: a query waits for the rows recorded before it.
    assert_eq!(
        usage(&ledger, UsageBy::Key, None, None),
        vec![
            (g("k1"), 1, 2, 1, 100, 50, 0.0015),
            (g("k2"), 1, 1, 0, 10, 5, 0.00025),
            (None, 1, 2, 1, 7, 3, 0.00004),
        ]
    );
    assert_eq!(
        usage(&ledger, UsageBy::User, None, None),
        vec![
            (g("alice"), 1, 2, 1, 100, 50, 0.0015),
            (None, 2, 3, 1, 17, 8, 0.00029),
        ]
    );
    assert_eq!(
        usage(&ledger, UsageBy::Model, None, None),
        vec![
            (g("gpt"), 2, 3, 1, 110, 55, 0.00175),
            (g("mini"), 1, 2, 1, 7, 3, 0.00004),
        ]
    );
    assert_eq!(
        usage(&ledger, UsageBy::Provider, None, None),
        vec![
            (g("anthropic"), 1, 1, 0, 100, 50, 0.0015),
            (g("openai"), 3, 4, 2, 17, 8, 0.00029),
        ]
    );
    // since inclusive, until exclusive.
    assert_eq!(
        usage(&ledger, UsageBy::Model, Some(T0 + 1_000), Some(T0 + DAY)),
        vec![(g("gpt"), 1, 1, 0, 10, 5, 0.00025)]
    );
    assert!(usage(&ledger, UsageBy::Model, Some(T0 + 2 * DAY), None).is_empty());

    let spend = |since| {
        let mut rows: Vec<_> = ledger
            .spend_by_day(since)
            .unwrap()
            .into_iter()
            .map(|r| {
                (
                    r.day,
                    r.key_id,
                    r.user,
                    r.provider,
                    r.model,
                    r.upstream_model,
                    r.cost_micro_usd,
                )
            })
            .collect();
        rows.sort();
        rows
    };
    let d0 = T0 / DAY;
    let s = |x: &str| x.to_string();
    assert_eq!(
        spend(0),
        vec![
            (
                d0,
                g("k1"),
                g("alice"),
                s("anthropic"),
                s("gpt"),
                s("claude"),
                1_500
            ),
            (
                d0,
                g("k1"),
                g("alice"),
                s("openai"),
                s("gpt"),
                s("gpt-4o"),
                0
            ),
            (d0, g("k2"), None, s("openai"), s("gpt"), s("gpt-4o"), 250),
            (
                d0 + 1,
                None,
                None,
                s("openai"),
                s("mini"),
                s("gpt-4o-mini"),
                40
            ),
        ]
    );
    assert_eq!(
        spend(T0 + DAY),
        vec![(
            d0 + 1,
            None,
            None,
            s("openai"),
            s("mini"),
            s("gpt-4o-mini"),
            40
        )]
    );

    ledger.record(base("r4", T0 + 2 * DAY));
    assert!(ledger.flush(Duration::from_secs(10)));
    let c = ledger.counters();
    assert_eq!(c.written.load(Relaxed), 6);
    assert_eq!(c.dropped.load(Relaxed) + c.failed.load(Relaxed), 0);
    ledger.close(Duration::from_secs(10));
    ledger.close(Duration::from_secs(10));
    assert!(!ledger.flush(Duration::from_secs(1)));
    drop(ledger);

    let reopened = Ledger::open(db.target(), opts()).unwrap();
    assert_eq!(
        usage(&reopened, UsageBy::Model, None, None),
        vec![
            (g("gpt"), 3, 4, 1, 110, 55, 0.00175),
            (g("mini"), 1, 2, 1, 7, 3, 0.00004),
        ]
    );
}

/// A batch that fails twice is counted in `failed`; the writer lives on.
fn write_errors_are_counted(db: &Db) {
    let ledger = Ledger::open(db.target(), opts()).unwrap();
    db.execute("DROP TABLE signalbox_ledger");
    for row in fixture() {
        ledger.record(row);
    }
    assert!(ledger.flush(Duration::from_secs(10)));
    assert_eq!(ledger.counters().failed.load(Relaxed), 5);
    assert_eq!(ledger.counters().written.load(Relaxed), 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let q = UsageQuery {
        by: UsageBy::Key,
        since_ms: None,
        until_ms: None,
    };
    assert!(matches!(
        rt.block_on(ledger.usage(q)),
        Err(LedgerError::Query(_))
    ));
}

#[test]
fn sqlite_aggregates_and_durability() {
    let db = Db::sqlite();
    aggregates_and_durability(&db);
    // The file as other tools see it.
    let Db::Sqlite(dir) = &db else { unreachable!() };
    let c = rusqlite::Connection::open(dir.path().join("nested/ledger.db")).unwrap();
    let (time, cost, user): (String, f64, Option<String>) = c
        .query_row(
            "SELECT time, cost_usd, user_name FROM signalbox_ledger WHERE request_id = 'r1' AND attempt = 2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (time.as_str(), cost, user.as_deref()),
        ("2026-12-01T08:25:23.133Z", 0.0015, Some("alice"))
    );
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn sqlite_write_errors_are_counted() {
    write_errors_are_counted(&Db::sqlite());
}

#[test]
fn postgres_aggregates_and_durability() {
    if let Some(pg) = TempPg::create() {
        aggregates_and_durability(&Db::Postgres(pg));
    }
}

#[test]
fn postgres_write_errors_are_counted() {
    if let Some(pg) = TempPg::create() {
        write_errors_are_counted(&Db::Postgres(pg));
    }
}

/// The server ending the writer's session costs no rows: the retry reconnects.
#[test]
fn postgres_reconnects_after_the_session_ends() {
    let Some(pg) = TempPg::create() else { return };
    let ledger = Ledger::open(
        LedgerTarget::Postgres {
            url: pg.url.clone(),
        },
        opts(),
    )
    .unwrap();
    let mut admin = postgres::Client::connect(&pg.admin_url, postgres::NoTls).unwrap();
    let ended = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            &[&pg.name],
        )
        .unwrap();
    assert_eq!(ended.len(), 1);
    for row in fixture() {
        ledger.record(row);
    }
    assert!(ledger.flush(Duration::from_secs(10)));
    assert_eq!(ledger.counters().written.load(Relaxed), 5);
    assert_eq!(ledger.counters().failed.load(Relaxed), 0);
}

/// With the writer stuck behind another connection's write lock, `record` keeps returning at
/// once and counts what the queue refuses; nothing is lost once the lock goes.
#[test]
fn full_queue_drops_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let ledger = Ledger::open(
        LedgerTarget::Sqlite(path.clone()),
        LedgerOptions {
            queue: 2,
            batch: 1,
            interval: Duration::from_millis(5),
        },
    )
    .unwrap();
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let start = Instant::now();
    for i in 0..1_000 {
        ledger.record(base(&format!("r{i}"), T0));
    }
    assert!(start.elapsed() < Duration::from_secs(1));
    let c = ledger.counters();
    // At most the two queued and one in the writer's hands were taken.
    assert!(c.dropped.load(Relaxed) >= 997, "{c:?}");
    blocker.execute_batch("COMMIT").unwrap();
    assert!(ledger.flush(Duration::from_secs(10)));
    assert_eq!(c.written.load(Relaxed) + c.dropped.load(Relaxed), 1_000);
    assert_eq!(c.failed.load(Relaxed), 0);
    // The queue accepts rows again.
    ledger.record(base("after", T0));
    assert!(ledger.flush(Duration::from_secs(10)));
    assert_eq!(c.written.load(Relaxed) + c.dropped.load(Relaxed), 1_001);
}

#[test]
fn the_postgres_url_is_never_shown() {
    let url = "postgres://sb:hunter2@127.0.0.1:1/ledger".to_string();
    let debug = format!("{:?}", LedgerTarget::Postgres { url: url.clone() });
    assert!(!debug.contains("hunter2"), "{debug}");
    let err = Ledger::open(LedgerTarget::Postgres { url }, opts())
        .err()
        .unwrap();
    let text = format!("{err} {err:?}");
    assert!(matches!(err, LedgerError::Connect(_)), "{text}");
    assert!(
        !text.contains("hunter2") && !text.contains("postgres://"),
        "{text}"
    );
}

#[test]
fn times_are_rfc3339_utc_with_milliseconds() {
    for (ms, text) in [
        (0, "1970-01-01T00:00:00.000Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (T0, "2026-12-01T08:25:23.123Z"),
        (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
        (-2_203_891_200_000, "1900-03-01T00:00:00.000Z"),
        (4_133_937_600_500, "2100-12-31T12:00:00.500Z"),
    ] {
        assert_eq!(crate::rfc3339::format_ms(ms), text);
    }
}

#[test]
fn usage_by_names_round_trip() {
    for by in [
        UsageBy::Key,
        UsageBy::User,
        UsageBy::Model,
        UsageBy::Provider,
    ] {
        assert_eq!(UsageBy::parse(by.as_str()), Some(by));
    }
    assert_eq!(UsageBy::parse("team"), None);
}

#[test]
fn a_queued_message_is_no_bigger_than_a_row() {
    assert_eq!(size_of::<Msg>(), size_of::<LedgerRow>());
}

/// Absorbed rows (a failed or hedge-lost attempt before the one that served) count as
/// attempts, never as requests or errors of their own; a ledger written before the column
/// existed gains it with its old rows read as not absorbed.
fn absorbed_attempts_are_no_requests_or_errors(db: &Db, old_schema: bool) {
    if old_schema {
        // The table as signalbox wrote it before `absorbed`, with one row in it.
        if let Db::Sqlite(dir) = db {
            std::fs::create_dir_all(dir.path().join("nested")).unwrap();
        }
        db.execute(
            "CREATE TABLE signalbox_ledger (request_id TEXT NOT NULL, attempt INTEGER NOT NULL, \
             time TEXT NOT NULL, time_ms BIGINT NOT NULL, key_id TEXT, user_name TEXT, \
             route TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, \
             upstream_model TEXT NOT NULL, credential TEXT NOT NULL, outcome TEXT NOT NULL, \
             status INTEGER, prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL, \
             cost_usd DOUBLE PRECISION NOT NULL, cost_micro_usd BIGINT NOT NULL, \
             ttfb_ms DOUBLE PRECISION, duration_ms DOUBLE PRECISION NOT NULL); \
             INSERT INTO signalbox_ledger VALUES ('old', 1, '2026-12-01T08:25:23.123Z', 1796113523123, \
             NULL, NULL, 'model:gpt', 'openai', 'gpt', 'gpt-4o', 'c1', 'timeout', NULL, 0, 0, 0, 0, \
             NULL, 10);",
        );
    }
    let ledger = Ledger::open(db.target(), opts()).unwrap();
    // h1: the first attempt lost a hedge to anthropic; f1: a timeout absorbed by a fallback.
    for row in [
        LedgerRow {
            outcome: "hedge_lost",
            status: None,
            absorbed: true,
            ..base("h1", T0)
        },
        LedgerRow {
            attempt: 2,
            provider: "anthropic".into(),
            cost_micro_usd: 100,
            ..base("h1", T0 + 1)
        },
        LedgerRow {
            outcome: "timeout",
            absorbed: true,
            ..base("f1", T0 + 2)
        },
        LedgerRow {
            attempt: 2,
            provider: "anthropic".into(),
            cost_micro_usd: 100,
            ..base("f1", T0 + 3)
        },
    ] {
        ledger.record(row);
    }
    let old = usize::from(old_schema);
    let by_provider = usage(&ledger, UsageBy::Provider, None, None);
    assert_eq!(
        by_provider,
        vec![
            (g("anthropic"), 2, 2, 0, 0, 0, 0.0002),
            // openai only lost a hedge and was failed over from: no request, no error of its
            // own (the pre-column row is a request that failed).
            (
                g("openai"),
                old as u64,
                2 + old as u64,
                old as u64,
                0,
                0,
                0.0
            ),
        ]
    );
}

#[test]
fn sqlite_absorbed_attempts_are_no_requests_or_errors() {
    absorbed_attempts_are_no_requests_or_errors(&Db::sqlite(), false);
}

#[test]
fn an_older_sqlite_ledger_gains_the_absorbed_column() {
    absorbed_attempts_are_no_requests_or_errors(&Db::sqlite(), true);
}

#[test]
fn postgres_absorbed_attempts_are_no_requests_or_errors() {
    if let Some(pg) = TempPg::create() {
        absorbed_attempts_are_no_requests_or_errors(&Db::Postgres(pg), true);
    }
}
