//! Where taught examples are kept: a table beside the usage ledger's, in the same database
//! (the `ledger` section's SQLite file or PostgreSQL server), created at start. Without a
//! `ledger` section examples live in memory only and a restart forgets them (`GET
//! /admin/routing/status` says `"stored_in": "memory"`).
//!
//! One row per example: its pool (policy, user — `''` for the shared pool —, task — `''` for
//! none), when it was taught, its scores (JSON `{target: score}`), and its vector (little-endian
//! `f32`s; the prompt itself is never stored). A pool's bound is applied in the insert's own
//! transaction (the rows past the newest `max` are deleted), as memory applies it.
//!
//! The store has its own connection on its own thread (`signalbox-knn-store`): the ledger's
//! writer is never held up by a teaching batch, and the synchronous PostgreSQL client never
//! runs inside tokio. Admin writes wait for their commit; the request path never touches it.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use super::memory::PoolKey;
use crate::ledger::LedgerTarget;

const SQLITE_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS signalbox_knn_examples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    policy TEXT NOT NULL,
    user_name TEXT NOT NULL,
    task TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    scores TEXT NOT NULL,
    dims INTEGER NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS signalbox_knn_examples_pool
    ON signalbox_knn_examples (policy, user_name, task, id);";

const PG_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS signalbox_knn_examples (
    id BIGSERIAL PRIMARY KEY,
    policy TEXT NOT NULL,
    user_name TEXT NOT NULL,
    task TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    scores TEXT NOT NULL,
    dims INTEGER NOT NULL,
    vector BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS signalbox_knn_examples_pool
    ON signalbox_knn_examples (policy, user_name, task, id);";

const SELECT_ALL: &str =
    "SELECT id, policy, user_name, task, scores, vector FROM signalbox_knn_examples ORDER BY id";
const INSERT_SQLITE: &str = "INSERT INTO signalbox_knn_examples \
    (policy, user_name, task, time_ms, scores, dims, vector) VALUES ($1, $2, $3, $4, $5, $6, $7)";
const INSERT_PG: &str = "INSERT INTO signalbox_knn_examples \
    (policy, user_name, task, time_ms, scores, dims, vector) VALUES ($1, $2, $3, $4, $5, $6, $7) \
    RETURNING id";
/// Keep a pool's newest `$4` rows.
const BOUND: &str = "DELETE FROM signalbox_knn_examples WHERE policy = $1 AND user_name = $2 \
    AND task = $3 AND id NOT IN (SELECT id FROM signalbox_knn_examples WHERE policy = $1 \
    AND user_name = $2 AND task = $3 ORDER BY id DESC LIMIT $4)";
const FORGET: &str =
    "DELETE FROM signalbox_knn_examples WHERE policy = $1 AND user_name = $2 AND task = $3";

/// Why the store failed (never with a URL or password).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("routing examples store: {0}")]
    Db(String),
    #[error("routing examples store: closed")]
    Closed,
}

/// One example as stored.
#[derive(Debug, Clone)]
pub struct StoredExample {
    pub id: i64,
    pub key: PoolKey,
    pub scores: Vec<(String, f32)>,
    pub vector: Vec<f32>,
}

type Reply<T> = tokio::sync::oneshot::Sender<Result<T, StoreError>>;

enum Command {
    Load(mpsc::SyncSender<Result<Vec<StoredExample>, StoreError>>),
    Insert {
        key: PoolKey,
        rows: Vec<(String, Vec<u8>, i32)>,
        max: i64,
        reply: Reply<Vec<i64>>,
    },
    Forget {
        key: PoolKey,
        reply: Reply<()>,
    },
}

/// The handle; the thread stops when it is dropped.
pub struct ExampleStore {
    commands: mpsc::Sender<Command>,
    backend: &'static str,
}

impl std::fmt::Debug for ExampleStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExampleStore")
            .field("backend", &self.backend)
            .finish()
    }
}

enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

/// A PostgreSQL connection, made again on the next command after it broke.
struct Pg {
    config: postgres::Config,
    client: Option<postgres::Client>,
}

impl Pg {
    fn client(&mut self) -> Result<&mut postgres::Client, StoreError> {
        if self.client.as_ref().is_none_or(postgres::Client::is_closed) {
            self.client = None;
            let client = self
                .config
                .connect(postgres::NoTls)
                .map_err(|e| StoreError::Db(scrub(&e, &self.config)))?;
            self.client = Some(client);
        }
        self.client.as_mut().ok_or(StoreError::Closed)
    }

    /// A query's error, the connection dropped when it is the connection's.
    fn failed(&mut self, e: &postgres::Error) -> StoreError {
        if self
            .client
            .as_ref()
            .is_some_and(postgres::Client::is_closed)
        {
            self.client = None;
        }
        StoreError::Db(scrub(e, &self.config))
    }
}

impl ExampleStore {
    /// Connect (or open the file) and create the table; blocks until ready: call at start.
    pub fn open(target: LedgerTarget) -> Result<Self, StoreError> {
        let backend = target.backend();
        let (commands, rx) = mpsc::channel::<Command>();
        let (ready, ready_rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("signalbox-knn-store".into())
            .spawn(move || {
                let mut db = match open_db(target) {
                    Ok(db) => {
                        let _ = ready.send(Ok(()));
                        db
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                while let Ok(command) = rx.recv() {
                    db.serve(command);
                }
            })
            .map_err(|e| StoreError::Db(format!("cannot start its thread: {e}")))?;
        ready_rx.recv().map_err(|_| StoreError::Closed)??;
        Ok(Self { commands, backend })
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Every example, oldest first (at start: blocks the calling thread).
    pub fn load_blocking(&self) -> Result<Vec<StoredExample>, StoreError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.commands
            .send(Command::Load(reply))
            .map_err(|_| StoreError::Closed)?;
        answer.recv().map_err(|_| StoreError::Closed)?
    }

    /// Store examples in a pool, keeping its newest `max`; their ids, in order.
    pub async fn insert(
        &self,
        key: PoolKey,
        examples: &[super::memory::Taught],
        max: usize,
    ) -> Result<Vec<i64>, StoreError> {
        let rows = examples
            .iter()
            .map(|(v, scores)| {
                let map: serde_json::Map<String, serde_json::Value> = scores
                    .iter()
                    .map(|(n, s)| (n.to_string(), serde_json::json!(s)))
                    .collect();
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                (
                    serde_json::Value::Object(map).to_string(),
                    bytes,
                    i32::try_from(v.len()).unwrap_or(i32::MAX),
                )
            })
            .collect();
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::Insert {
                key,
                rows,
                max: i64::try_from(max).unwrap_or(i64::MAX),
                reply,
            })
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Delete a pool's examples.
    pub async fn forget(&self, key: PoolKey) -> Result<(), StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::Forget { key, reply })
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

fn open_db(target: LedgerTarget) -> Result<Db, StoreError> {
    match target {
        LedgerTarget::Sqlite(path) => open_sqlite(&path).map(Db::Sqlite),
        LedgerTarget::Postgres { url } => {
            let mut config: postgres::Config = url
                .parse()
                .map_err(|e| StoreError::Db(format!("invalid URL: {e}")))?;
            if config.get_connect_timeout().is_none() {
                config.connect_timeout(Duration::from_secs(10));
            }
            let mut pg = Pg {
                config,
                client: None,
            };
            let created = pg.client()?.batch_execute(PG_SCHEMA);
            created.map_err(|e| pg.failed(&e))?;
            Ok(Db::Postgres(Box::new(pg)))
        }
    }
}

fn open_sqlite(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    let err = |e: &dyn std::fmt::Display| StoreError::Db(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
    }
    let conn = rusqlite::Connection::open(path).map_err(|e| err(&e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| err(&e))?;
    conn.execute_batch(SQLITE_SCHEMA).map_err(|e| err(&e))?;
    Ok(conn)
}

/// A Postgres error's text without the password, should a server ever echo it.
fn scrub(e: &postgres::Error, config: &postgres::Config) -> String {
    let text = e.to_string();
    match config.get_password() {
        Some(p) if !p.is_empty() => text.replace(&*String::from_utf8_lossy(p), "***"),
        _ => text,
    }
}

fn column(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn example(
    id: i64,
    policy: String,
    user: &str,
    task: &str,
    scores: &str,
    vector: &[u8],
) -> StoredExample {
    let scores = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(scores)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(n, v)| Some((n, v.as_f64()? as f32)))
        .collect();
    let vector = vector
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    StoredExample {
        id,
        key: PoolKey {
            policy,
            user: column(user),
            task: column(task),
        },
        scores,
        vector,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Db {
    fn serve(&mut self, command: Command) {
        match command {
            Command::Load(reply) => {
                let _ = reply.send(self.load());
            }
            Command::Insert {
                key,
                rows,
                max,
                reply,
            } => {
                let _ = reply.send(self.insert(&key, &rows, max));
            }
            Command::Forget { key, reply } => {
                let _ = reply.send(self.forget(&key));
            }
        }
    }

    fn load(&mut self) -> Result<Vec<StoredExample>, StoreError> {
        match self {
            Db::Sqlite(conn) => (|| {
                let mut st = conn.prepare(SELECT_ALL)?;
                let rows = st.query_map([], |r| {
                    let user: String = r.get(2)?;
                    let task: String = r.get(3)?;
                    let scores: String = r.get(4)?;
                    let vector: Vec<u8> = r.get(5)?;
                    Ok(example(
                        r.get(0)?,
                        r.get(1)?,
                        &user,
                        &task,
                        &scores,
                        &vector,
                    ))
                })?;
                rows.collect::<Result<Vec<_>, _>>()
            })()
            .map_err(|e| StoreError::Db(e.to_string())),
            Db::Postgres(pg) => {
                let answer = pg.client()?.query(SELECT_ALL, &[]).and_then(|rows| {
                    rows.iter()
                        .map(|r| {
                            let user: String = r.try_get(2)?;
                            let task: String = r.try_get(3)?;
                            let scores: String = r.try_get(4)?;
                            let vector: Vec<u8> = r.try_get(5)?;
                            Ok(example(
                                r.try_get(0)?,
                                r.try_get(1)?,
                                &user,
                                &task,
                                &scores,
                                &vector,
                            ))
                        })
                        .collect()
                });
                answer.map_err(|e| pg.failed(&e))
            }
        }
    }

    fn insert(
        &mut self,
        key: &PoolKey,
        rows: &[(String, Vec<u8>, i32)],
        max: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let user = key.user.as_deref().unwrap_or("");
        let task = key.task.as_deref().unwrap_or("");
        let time = now_ms();
        match self {
            Db::Sqlite(conn) => (|| {
                let tx = conn.transaction()?;
                let mut ids = Vec::with_capacity(rows.len());
                {
                    let mut insert = tx.prepare_cached(INSERT_SQLITE)?;
                    for (scores, vector, dims) in rows {
                        insert.execute(rusqlite::params![
                            key.policy, user, task, time, scores, dims, vector
                        ])?;
                        ids.push(tx.last_insert_rowid());
                    }
                }
                tx.execute(BOUND, rusqlite::params![key.policy, user, task, max])?;
                tx.commit()?;
                Ok(ids)
            })()
            .map_err(|e: rusqlite::Error| StoreError::Db(e.to_string())),
            Db::Postgres(pg) => {
                let c = pg.client()?;
                let answer = (|| {
                    let mut tx = c.transaction()?;
                    let mut ids = Vec::with_capacity(rows.len());
                    for (scores, vector, dims) in rows {
                        let row = tx.query_one(
                            INSERT_PG,
                            &[&key.policy, &user, &task, &time, scores, dims, vector],
                        )?;
                        ids.push(row.try_get(0)?);
                    }
                    tx.execute(BOUND, &[&key.policy, &user, &task, &max])?;
                    tx.commit()?;
                    Ok(ids)
                })();
                answer.map_err(|e: postgres::Error| pg.failed(&e))
            }
        }
    }

    fn forget(&mut self, key: &PoolKey) -> Result<(), StoreError> {
        let user = key.user.as_deref().unwrap_or("");
        let task = key.task.as_deref().unwrap_or("");
        match self {
            Db::Sqlite(conn) => conn
                .execute(FORGET, rusqlite::params![key.policy, user, task])
                .map(|_| ())
                .map_err(|e| StoreError::Db(e.to_string())),
            Db::Postgres(pg) => {
                let answer = pg.client()?.execute(FORGET, &[&key.policy, &user, &task]);
                answer.map(|_| ()).map_err(|e| pg.failed(&e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Teach, bound, forget, close, reopen: what was kept is loaded back, oldest first.
    async fn survives_a_reopen(target: impl Fn() -> LedgerTarget) {
        let key = |task: Option<&str>| PoolKey {
            policy: "smart".into(),
            user: None,
            task: task.map(str::to_string),
        };
        {
            let store = ExampleStore::open(target()).unwrap();
            let ex = |x: f32| (vec![x, 0.5], vec![(Arc::from("a"), 0.25)]);
            let ids = store
                .insert(key(None), &[ex(1.0), ex(2.0), ex(3.0)], 2)
                .await
                .unwrap();
            assert_eq!(ids.len(), 3);
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
            store
                .insert(key(Some("code")), &[ex(9.0)], 2)
                .await
                .unwrap();
            store
                .insert(key(Some("gone")), &[ex(9.0)], 2)
                .await
                .unwrap();
            store.forget(key(Some("gone"))).await.unwrap();
        }
        let store = ExampleStore::open(target()).unwrap();
        let rows = store.load_blocking().unwrap();
        let vectors: Vec<(Option<String>, Vec<f32>)> = rows
            .iter()
            .map(|r| (r.key.task.clone(), r.vector.clone()))
            .collect();
        assert_eq!(
            vectors,
            [
                (None, vec![2.0, 0.5]),
                (None, vec![3.0, 0.5]),
                (Some("code".to_string()), vec![9.0, 0.5])
            ]
        );
        assert_eq!(rows[0].scores, [("a".to_string(), 0.25)]);
    }

    #[tokio::test]
    async fn examples_survive_a_reopen_and_pools_stay_bounded_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        survives_a_reopen(|| LedgerTarget::Sqlite(path.clone())).await;
    }

    /// The same on PostgreSQL, in a database of its own (`SIGNALBOX_TEST_POSTGRES_URL`, as the
    /// ledger's tests; CI sets it).
    #[tokio::test(flavor = "multi_thread")]
    async fn examples_survive_a_reopen_and_pools_stay_bounded_on_postgres() {
        let Ok(admin_url) = std::env::var("SIGNALBOX_TEST_POSTGRES_URL") else {
            assert!(
                std::env::var_os("SIGNALBOX_CI").is_none(),
                "SIGNALBOX_CI is set and SIGNALBOX_TEST_POSTGRES_URL is not: the PostgreSQL test may not skip"
            );
            println!("skipped: SIGNALBOX_TEST_POSTGRES_URL is not set");
            return;
        };
        let name = format!("sb_knn_{}", std::process::id());
        let admin = admin_url.clone();
        let (drop_first, create) = (
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        );
        tokio::task::spawn_blocking(move || {
            let mut c = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
            c.batch_execute(&drop_first).unwrap();
            c.batch_execute(&create).unwrap();
        })
        .await
        .unwrap();
        let (scheme, rest) = admin_url.split_once("://").unwrap();
        let (authority, _) = rest.split_once('/').unwrap_or((rest, ""));
        let url = format!("{scheme}://{authority}/{name}");
        survives_a_reopen(|| LedgerTarget::Postgres { url: url.clone() }).await;
        let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        tokio::task::spawn_blocking(move || {
            if let Ok(mut c) = postgres::Client::connect(&admin_url, postgres::NoTls) {
                let _ = c.batch_execute(&drop);
            }
        })
        .await
        .unwrap();
    }
}
