//! The usage ledger: one row per upstream attempt, stored in an embedded SQLite file (WAL) or
//! a PostgreSQL server, and the aggregates read back from it (admin usage, budget rebuild).
//!
//! The request path only moves a row into a bounded queue ([`Ledger::record`]): it never
//! waits on the database and never blocks. A plain thread, `signalbox-ledger`, owns the
//! connection, writes rows in batches of one transaction each, and answers queries after the
//! rows queued before them, so a caller reads its own finished requests. When the queue is
//! full rows are dropped and counted; a write that fails twice loses its batch and is
//! counted. Neither ever reaches the caller.
//!
//! - `store`: the schema and SQL, shared by both backends, and the backends themselves.
//! - `writer`: the thread's loop.

mod store;
mod writer;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use store::Store;
use writer::{Command, Msg, Writer};

/// One upstream attempt.
#[derive(Debug, Clone)]
pub struct LedgerRow {
    pub request_id: Box<str>,
    /// 1-based attempt number within the request.
    pub attempt: u32,
    /// Unix milliseconds (UTC) when the attempt started.
    pub time_ms: i64,
    /// The caller's client-key id (never the key itself).
    pub key_id: Option<Arc<str>>,
    pub user: Option<Arc<str>>,
    /// e.g. `model:gpt-4o`, `policy:support`.
    pub route: Arc<str>,
    pub provider: Arc<str>,
    /// The catalog model name.
    pub model: Arc<str>,
    pub upstream_model: Arc<str>,
    /// Credential id (never the secret).
    pub credential: Arc<str>,
    /// `ok`, `timeout`, `status_5xx`, ...
    pub outcome: &'static str,
    /// Upstream HTTP status, if one arrived.
    pub status: Option<u16>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Micro-USD (1e-6 USD).
    pub cost_micro_usd: u64,
    pub ttfb_ms: Option<f64>,
    pub duration_ms: f64,
    /// A failed (or hedge-lost) attempt before the attempt that served: no settled cost, not
    /// a request or an error of its own in `/admin/usage` (seed 004).
    pub absorbed: bool,
}

/// Where the ledger lives.
pub enum LedgerTarget {
    /// A file, created with its directory if missing.
    Sqlite(PathBuf),
    /// `postgres://user:password@host:port/db`; the URL holds a password, so `Debug` hides it.
    Postgres { url: String },
}

impl LedgerTarget {
    pub fn backend(&self) -> &'static str {
        match self {
            LedgerTarget::Sqlite(_) => "sqlite",
            LedgerTarget::Postgres { .. } => "postgres",
        }
    }
}

impl fmt::Debug for LedgerTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerTarget::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            LedgerTarget::Postgres { .. } => f
                .debug_struct("Postgres")
                .field("url", &"[redacted]")
                .finish(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Rows the queue holds before `record` drops (at least 1).
    pub queue: usize,
    /// Rows per transaction, at most.
    pub batch: usize,
    /// How long a row may wait for its batch to fill.
    pub interval: Duration,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            queue: 65_536,
            batch: 512,
            interval: Duration::from_millis(200),
        }
    }
}

#[derive(Debug, Default)]
pub struct LedgerCounters {
    /// Rows committed.
    pub written: AtomicU64,
    /// Rows refused because the queue was full (or the ledger closed).
    pub dropped: AtomicU64,
    /// Rows lost to write errors after retrying.
    pub failed: AtomicU64,
    /// Transactions committed.
    pub batches: AtomicU64,
}

/// Ledger failures. No message carries the Postgres URL or password.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger: cannot open {}: {reason}", path.display())]
    Open { path: PathBuf, reason: String },
    #[error("ledger: postgres: {0}")]
    Connect(String),
    #[error("ledger: creating the schema: {0}")]
    Schema(String),
    #[error("ledger: query: {0}")]
    Query(String),
    #[error("ledger: cannot start the writer thread: {0}")]
    Spawn(std::io::Error),
    #[error("ledger: closed")]
    Closed,
}

/// How long `Drop` waits for the queue to be written.
const DROP_FLUSH: Duration = Duration::from_secs(5);

/// The handle the gateway shares as `Arc<Ledger>`. Dropping it flushes and stops the writer
/// (waiting up to 5 s); [`Ledger::close`] does the same with a chosen timeout.
pub struct Ledger {
    rows: SyncSender<Msg>,
    commands: Sender<Command>,
    counters: Arc<LedgerCounters>,
    /// Inside an episode of refused rows (warned once, at its start).
    refusing: AtomicBool,
    closed: AtomicBool,
    queue: usize,
    backend: &'static str,
}

impl Ledger {
    /// Open or connect, create the schema (idempotent) and start the writer thread. Blocks
    /// until the database is ready: call it at startup.
    pub fn open(target: LedgerTarget, opts: LedgerOptions) -> Result<Arc<Ledger>, LedgerError> {
        let opts = LedgerOptions {
            queue: opts.queue.max(1),
            ..opts
        };
        let backend = target.backend();
        let (rows, row_rx) = mpsc::sync_channel(opts.queue);
        let (commands, command_rx) = mpsc::channel();
        let (ready, ready_rx) = mpsc::sync_channel(1);
        let counters = Arc::new(LedgerCounters::default());
        let writer_counters = counters.clone();
        let queue = opts.queue;
        std::thread::Builder::new()
            .name("signalbox-ledger".into())
            .spawn(move || {
                // The store is opened here: the Postgres client must live on this thread.
                let store = match Store::open(target) {
                    Ok(store) => store,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                let writer = Writer::new(store, row_rx, command_rx, writer_counters, &opts);
                if let Some(ack) = writer.run() {
                    let _ = ack.send(());
                }
            })
            .map_err(LedgerError::Spawn)?;
        ready_rx.recv().map_err(|_| LedgerError::Closed)??;
        Ok(Arc::new(Ledger {
            rows,
            commands,
            counters,
            refusing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            queue,
            backend,
        }))
    }

    /// Queue a row for writing. Never blocks: when the queue is full the row is dropped and
    /// counted, with one warning per episode of drops.
    pub fn record(&self, row: LedgerRow) {
        match self.rows.try_send(Msg::Row(row)) {
            Ok(()) => {
                if self.refusing.load(Relaxed) {
                    self.refusing.store(false, Relaxed);
                }
            }
            Err(refused) => {
                self.counters.dropped.fetch_add(1, Relaxed);
                if !self.refusing.swap(true, Relaxed) {
                    let why = match refused {
                        TrySendError::Full(_) => "the queue is full",
                        TrySendError::Disconnected(_) => "the ledger is closed",
                    };
                    tracing::warn!(
                        queue = self.queue,
                        "ledger: dropping usage rows ({why}); counting them in dropped"
                    );
                }
            }
        }
    }

    pub fn counters(&self) -> &LedgerCounters {
        &self.counters
    }

    /// Aggregates by `q.by` over `[since, until)`, sorted by cost (highest first) then group,
    /// answered after every row queued before the call was written.
    pub async fn usage(&self, q: UsageQuery) -> Result<Vec<UsageRow>, LedgerError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.command(Command::Usage(q, reply))?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }

    /// Spend per UTC day since `since_ms` (inclusive), grouped by (day, key, user, provider,
    /// model, upstream model), in no particular order: the budget rebuild at startup.
    ///
    /// Blocks until the writer answers (after the rows queued before the call). The reply
    /// comes over a std channel, so calling it from inside a tokio runtime does not panic, but
    /// it does hold that worker thread: from async code prefer `spawn_blocking`.
    pub fn spend_by_day(&self, since_ms: i64) -> Result<Vec<SpendRow>, LedgerError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.command(Command::Spend(since_ms, reply))?;
        answer.recv().map_err(|_| LedgerError::Closed)?
    }

    /// Block until every row queued before the call was handled (committed, or counted in
    /// `failed`), or `timeout` passes. True when flushed; false on timeout or once closed.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        self.command(Command::Flush(ack)).is_ok() && done.recv_timeout(timeout).is_ok()
    }

    /// Flush, then stop the writer and close the database, waiting up to `timeout`.
    /// Idempotent; rows recorded afterwards are dropped and counted.
    pub fn close(&self, timeout: Duration) {
        if self.closed.swap(true, Relaxed) {
            return;
        }
        let (ack, done) = mpsc::sync_channel(1);
        if self.command(Command::Close(ack)).is_ok() && done.recv_timeout(timeout).is_err() {
            tracing::warn!(
                ?timeout,
                "ledger: the writer did not finish in time; rows still queued may be lost"
            );
        }
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    fn command(&self, command: Command) -> Result<(), LedgerError> {
        self.commands
            .send(command)
            .map_err(|_| LedgerError::Closed)?;
        // Rouse a writer waiting for rows; a full queue means it is busy and will look anyway.
        let _ = self.rows.try_send(Msg::Wake);
        Ok(())
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.close(DROP_FLUSH);
    }
}

/// The dimension usage is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    Key,
    User,
    Model,
    Provider,
}

impl UsageBy {
    /// `key`, `user`, `model` or `provider`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "key" => Some(UsageBy::Key),
            "user" => Some(UsageBy::User),
            "model" => Some(UsageBy::Model),
            "provider" => Some(UsageBy::Provider),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UsageBy::Key => "key",
            UsageBy::User => "user",
            UsageBy::Model => "model",
            UsageBy::Provider => "provider",
        }
    }

    fn column(self) -> &'static str {
        match self {
            UsageBy::Key => "key_id",
            UsageBy::User => "user_name",
            UsageBy::Model => "model",
            UsageBy::Provider => "provider",
        }
    }
}

/// `since_ms` inclusive, `until_ms` exclusive; `None` is unbounded.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    pub by: UsageBy,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct UsageRow {
    /// The key id, user, model or provider; `None` for rows without one (no key, no user).
    pub group: Option<String>,
    /// Distinct request ids.
    pub requests: u64,
    pub attempts: u64,
    /// Attempts whose outcome is not `ok`.
    pub failed_attempts: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}

#[derive(Debug, Clone)]
pub struct SpendRow {
    /// Unix day: `time_ms / 86_400_000`.
    pub day: i64,
    pub key_id: Option<String>,
    pub user: Option<String>,
    pub provider: String,
    pub model: String,
    pub upstream_model: String,
    pub cost_micro_usd: u64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
