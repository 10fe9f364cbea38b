//! The table, the SQL, and the two backends behind one [`Store`]. One schema text serves both:
//! SQLite reads `BIGINT` as INTEGER and `DOUBLE PRECISION` as REAL, and takes `$n` placeholders.

use std::path::Path;
use std::time::Duration;

use postgres::types::ToSql as PgToSql;
use rusqlite::ToSql as SqliteToSql;

use super::{LedgerError, LedgerRow, LedgerTarget, SpendRow, UsageQuery, UsageRow};
use crate::rfc3339;

const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS signalbox_ledger (
    request_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    time TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    key_id TEXT,
    user_name TEXT,
    route TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    upstream_model TEXT NOT NULL,
    credential TEXT NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    cost_micro_usd BIGINT NOT NULL,
    ttfb_ms DOUBLE PRECISION,
    duration_ms DOUBLE PRECISION NOT NULL,
    absorbed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS signalbox_ledger_time_ms ON signalbox_ledger (time_ms);";

/// A ledger created before the `absorbed` column gains it (rows before it read as 0).
const ADD_ABSORBED_PG: &str =
    "ALTER TABLE signalbox_ledger ADD COLUMN IF NOT EXISTS absorbed INTEGER NOT NULL DEFAULT 0";
const ADD_ABSORBED_SQLITE: &str =
    "ALTER TABLE signalbox_ledger ADD COLUMN absorbed INTEGER NOT NULL DEFAULT 0";

/// The insert's column list; `values!` yields the values in this order.
const COLUMNS: &str = "request_id, attempt, time, time_ms, key_id, user_name, route, provider, \
    model, upstream_model, credential, outcome, status, prompt_tokens, completion_tokens, \
    cost_usd, cost_micro_usd, ttfb_ms, duration_ms, absorbed";
const NCOLS: usize = 20;

/// Rows per Postgres `INSERT` (20 parameters each, well under the protocol's 65,535).
const PG_ROWS_PER_INSERT: usize = 256;

/// A row as column values, typed as both drivers bind them (Postgres insists on `i32` for
/// INTEGER and `i64` for BIGINT).
struct Values<'a> {
    request_id: &'a str,
    attempt: i32,
    time: String,
    time_ms: i64,
    key_id: Option<&'a str>,
    user: Option<&'a str>,
    route: &'a str,
    provider: &'a str,
    model: &'a str,
    upstream_model: &'a str,
    credential: &'a str,
    outcome: &'a str,
    status: Option<i32>,
    prompt_tokens: i64,
    completion_tokens: i64,
    cost_usd: f64,
    cost_micro_usd: i64,
    ttfb_ms: Option<f64>,
    duration_ms: f64,
    absorbed: i32,
}

impl<'a> Values<'a> {
    fn of(r: &'a LedgerRow) -> Self {
        let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Values {
            request_id: &r.request_id,
            attempt: i32::try_from(r.attempt).unwrap_or(i32::MAX),
            time: rfc3339::format_ms(r.time_ms),
            time_ms: r.time_ms,
            key_id: r.key_id.as_deref(),
            user: r.user.as_deref(),
            route: &r.route,
            provider: &r.provider,
            model: &r.model,
            upstream_model: &r.upstream_model,
            credential: &r.credential,
            outcome: r.outcome,
            status: r.status.map(i32::from),
            prompt_tokens: big(r.prompt_tokens),
            completion_tokens: big(r.completion_tokens),
            cost_usd: r.cost_micro_usd as f64 / 1e6,
            cost_micro_usd: big(r.cost_micro_usd),
            ttfb_ms: r.ttfb_ms,
            duration_ms: r.duration_ms,
            absorbed: i32::from(r.absorbed),
        }
    }
}

/// The values of one row in `COLUMNS` order, as an array of either driver's `&dyn ToSql`.
macro_rules! values {
    ($v:expr) => {
        [
            &$v.request_id,
            &$v.attempt,
            &$v.time,
            &$v.time_ms,
            &$v.key_id,
            &$v.user,
            &$v.route,
            &$v.provider,
            &$v.model,
            &$v.upstream_model,
            &$v.credential,
            &$v.outcome,
            &$v.status,
            &$v.prompt_tokens,
            &$v.completion_tokens,
            &$v.cost_usd,
            &$v.cost_micro_usd,
            &$v.ttfb_ms,
            &$v.duration_ms,
            &$v.absorbed,
        ]
    };
}

fn sqlite_params<'a>(v: &'a Values<'a>) -> [&'a dyn SqliteToSql; NCOLS] {
    values!(v)
}

fn pg_params<'a>(v: &'a Values<'a>) -> [&'a (dyn PgToSql + Sync); NCOLS] {
    values!(v)
}

/// `INSERT ... VALUES ($1, ..., $19), ($20, ...)` for `rows` rows.
fn insert_sql(rows: usize) -> String {
    let mut sql = format!("INSERT INTO signalbox_ledger ({COLUMNS}) VALUES ");
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for c in 1..=NCOLS {
            if c > 1 {
                sql.push_str(", ");
            }
            sql.push('$');
            sql.push_str(itoa::Buffer::new().format(r * NCOLS + c));
        }
        sql.push(')');
    }
    sql
}

/// Aggregates over `[since, until)`; the counts come back as BIGINT on both backends.
fn usage_sql(q: &UsageQuery) -> String {
    let col = q.by.column();
    format!(
        "SELECT {col}, COUNT(DISTINCT CASE WHEN absorbed = 0 THEN request_id END), COUNT(*), \
         CAST(SUM(CASE WHEN outcome <> 'ok' AND absorbed = 0 THEN 1 ELSE 0 END) AS BIGINT), \
         CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT), \
         CAST(SUM(cost_micro_usd) AS BIGINT) \
         FROM signalbox_ledger WHERE time_ms >= $1 AND time_ms < $2 GROUP BY {col}"
    )
}

const SPEND_SQL: &str = "SELECT time_ms / 86400000, key_id, user_name, provider, model, \
    upstream_model, CAST(SUM(cost_micro_usd) AS BIGINT) FROM signalbox_ledger \
    WHERE time_ms >= $1 GROUP BY 1, 2, 3, 4, 5, 6";

/// `[requests, attempts, failed, prompt, completion, cost_micro_usd]` as read back.
fn usage_row(group: Option<String>, n: [i64; 6]) -> UsageRow {
    let n = n.map(|x| u64::try_from(x).unwrap_or(0));
    UsageRow {
        group,
        requests: n[0],
        attempts: n[1],
        failed_attempts: n[2],
        prompt_tokens: n[3],
        completion_tokens: n[4],
        cost_usd: n[5] as f64 / 1e6,
    }
}

pub(super) enum Store {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

pub(super) struct Pg {
    config: postgres::Config,
    /// Connected lazily; dropped after an error so the next use reconnects.
    client: Option<postgres::Client>,
}

impl Store {
    /// Open or connect and create the schema. Runs on the writer thread: the synchronous
    /// Postgres client drives its own runtime and must not live inside tokio.
    pub(super) fn open(target: LedgerTarget) -> Result<Store, LedgerError> {
        match target {
            LedgerTarget::Sqlite(path) => open_sqlite(&path).map(Store::Sqlite),
            LedgerTarget::Postgres { url } => {
                let mut config: postgres::Config = url
                    .parse()
                    .map_err(|e| LedgerError::Connect(format!("invalid URL: {e}")))?;
                if config.get_connect_timeout().is_none() {
                    config.connect_timeout(Duration::from_secs(10));
                }
                // A statement stuck on the server (a lock, an overloaded disk) fails after
                // 30 s instead of holding the writer; a peer gone silent is found by keepalives.
                if config.get_options().is_none() {
                    config.options("-c statement_timeout=30000");
                }
                config.keepalives(true);
                config.keepalives_idle(Duration::from_secs(30));
                let mut pg = Pg {
                    config,
                    client: None,
                };
                pg.run(|c| {
                    c.batch_execute(SCHEMA)?;
                    c.batch_execute(ADD_ABSORBED_PG)
                })
                .map_err(|e| match e {
                    LedgerError::Query(m) => LedgerError::Schema(m),
                    e => e,
                })?;
                Ok(Store::Postgres(Box::new(pg)))
            }
        }
    }

    /// Forget a Postgres connection so the next call reconnects (a retry after an error).
    pub(super) fn reset(&mut self) {
        if let Store::Postgres(pg) = self {
            pg.client = None;
        }
    }

    /// Insert `rows` in one transaction.
    pub(super) fn insert(&mut self, rows: &[LedgerRow]) -> Result<(), LedgerError> {
        match self {
            Store::Sqlite(conn) => (|| {
                let tx = conn.transaction()?;
                {
                    let mut insert = tx.prepare_cached(&insert_sql(1))?;
                    for row in rows {
                        insert.execute(sqlite_params(&Values::of(row)))?;
                    }
                }
                tx.commit()
            })()
            .map_err(query_err),
            Store::Postgres(pg) => pg.run(|c| {
                let mut tx = c.transaction()?;
                for chunk in rows.chunks(PG_ROWS_PER_INSERT) {
                    let values: Vec<Values> = chunk.iter().map(Values::of).collect();
                    let params: Vec<_> = values.iter().flat_map(pg_params).collect();
                    tx.execute(insert_sql(chunk.len()).as_str(), &params)?;
                }
                tx.commit()
            }),
        }
    }

    /// Sorted by cost (highest first), then group.
    pub(super) fn usage(&mut self, q: &UsageQuery) -> Result<Vec<UsageRow>, LedgerError> {
        let sql = usage_sql(q);
        let since = q.since_ms.unwrap_or(i64::MIN);
        let until = q.until_ms.unwrap_or(i64::MAX);
        let mut rows = match self {
            Store::Sqlite(conn) => (|| {
                let mut st = conn.prepare_cached(&sql)?;
                let rows = st.query_map([since, until], |r| {
                    let n = [
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                    ];
                    Ok(usage_row(r.get(0)?, n))
                })?;
                rows.collect::<Result<Vec<_>, _>>()
            })()
            .map_err(query_err)?,
            Store::Postgres(pg) => pg.run(|c| {
                c.query(sql.as_str(), &[&since, &until])?
                    .iter()
                    .map(|r| {
                        let n = [
                            r.try_get(1)?,
                            r.try_get(2)?,
                            r.try_get(3)?,
                            r.try_get(4)?,
                            r.try_get(5)?,
                            r.try_get(6)?,
                        ];
                        Ok(usage_row(r.try_get(0)?, n))
                    })
                    .collect()
            })?,
        };
        rows.sort_by(|a, b| {
            b.cost_usd
                .total_cmp(&a.cost_usd)
                .then_with(|| a.group.cmp(&b.group))
        });
        Ok(rows)
    }

    /// Spend per (UTC day, key, user, provider, model, upstream model) since `since_ms`.
    pub(super) fn spend(&mut self, since_ms: i64) -> Result<Vec<SpendRow>, LedgerError> {
        let micro = |n: i64| u64::try_from(n).unwrap_or(0);
        match self {
            Store::Sqlite(conn) => (|| {
                let mut st = conn.prepare_cached(SPEND_SQL)?;
                let rows = st.query_map([since_ms], |r| {
                    Ok(SpendRow {
                        day: r.get(0)?,
                        key_id: r.get(1)?,
                        user: r.get(2)?,
                        provider: r.get(3)?,
                        model: r.get(4)?,
                        upstream_model: r.get(5)?,
                        cost_micro_usd: micro(r.get(6)?),
                    })
                })?;
                rows.collect::<Result<Vec<_>, _>>()
            })()
            .map_err(query_err),
            Store::Postgres(pg) => pg.run(|c| {
                c.query(SPEND_SQL, &[&since_ms])?
                    .iter()
                    .map(|r| {
                        Ok(SpendRow {
                            day: r.try_get(0)?,
                            key_id: r.try_get(1)?,
                            user: r.try_get(2)?,
                            provider: r.try_get(3)?,
                            model: r.try_get(4)?,
                            upstream_model: r.try_get(5)?,
                            cost_micro_usd: micro(r.try_get(6)?),
                        })
                    })
                    .collect()
            }),
        }
    }
}

fn query_err(e: rusqlite::Error) -> LedgerError {
    LedgerError::Query(e.to_string())
}

fn open_sqlite(path: &Path) -> Result<rusqlite::Connection, LedgerError> {
    let open_err = |reason: String| LedgerError::Open {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| open_err(e.to_string()))?;
    }
    let conn = rusqlite::Connection::open(path).map_err(|e| open_err(e.to_string()))?;
    (|| {
        conn.busy_timeout(Duration::from_secs(5))?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(%mode, "ledger: SQLite refused WAL mode; writers will block readers");
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(SCHEMA)?;
        let has_absorbed: bool = conn.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info('signalbox_ledger') WHERE name = 'absorbed'",
            [],
            |r| r.get(0),
        )?;
        if !has_absorbed {
            conn.execute_batch(ADD_ABSORBED_SQLITE)?;
        }
        Ok::<(), rusqlite::Error>(())
    })()
    .map_err(|e| LedgerError::Schema(e.to_string()))?;
    Ok(conn)
}

impl Pg {
    /// Run `f` on the connection (connecting first if there is none). Errors are reported
    /// with the password scrubbed, should a server ever echo it.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error>,
    ) -> Result<T, LedgerError> {
        if self.client.as_ref().is_none_or(postgres::Client::is_closed) {
            self.client = None;
            let client = self
                .config
                .connect(postgres::NoTls)
                .map_err(|e| LedgerError::Connect(self.scrub(&e)))?;
            self.client = Some(client);
        }
        let client = self.client.as_mut().ok_or(LedgerError::Closed)?;
        f(client).map_err(|e| LedgerError::Query(self.scrub(&e)))
    }

    fn scrub(&self, e: &postgres::Error) -> String {
        let text = e.to_string();
        match self.config.get_password() {
            Some(p) if !p.is_empty() => text.replace(&*String::from_utf8_lossy(p), "***"),
            _ => text,
        }
    }
}
