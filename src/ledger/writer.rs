//! The writer thread: batches rows into transactions and answers commands in queue order.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::store::Store;
use super::{
    LedgerCounters, LedgerError, LedgerOptions, LedgerRow, SpendRow, UsageQuery, UsageRow,
};

/// What the bounded queue carries. `Wake` rouses a writer idling in `recv_timeout` when a
/// command arrives; when the queue is full it is not sent, and not needed: the writer is busy.
/// (`Wake` fits in the row's niche, so it costs no size; boxing the row would cost an
/// allocation per row.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Msg {
    Row(LedgerRow),
    Wake,
}

pub(super) enum Command {
    Usage(
        UsageQuery,
        tokio::sync::oneshot::Sender<Result<Vec<UsageRow>, LedgerError>>,
    ),
    Spend(i64, SyncSender<Result<Vec<SpendRow>, LedgerError>>),
    Flush(SyncSender<()>),
    /// Acknowledged once the store is closed.
    Close(SyncSender<()>),
}

pub(super) struct Writer {
    store: Store,
    rows: Receiver<Msg>,
    commands: Receiver<Command>,
    counters: Arc<LedgerCounters>,
    queue: usize,
    batch: usize,
    interval: Duration,
    pending: Vec<LedgerRow>,
    /// Inside an episode of failed writes (warned once, at its start).
    failing: bool,
}

impl Writer {
    pub(super) fn new(
        store: Store,
        rows: Receiver<Msg>,
        commands: Receiver<Command>,
        counters: Arc<LedgerCounters>,
        opts: &LedgerOptions,
    ) -> Self {
        Writer {
            store,
            rows,
            commands,
            counters,
            queue: opts.queue,
            batch: opts.batch.max(1),
            interval: opts.interval,
            pending: Vec::with_capacity(opts.batch.max(1)),
            failing: false,
        }
    }

    /// Run until closed (or the `Ledger` is gone); returns the close acknowledgement, to be
    /// sent once the store has been dropped.
    pub(super) fn run(mut self) -> Option<SyncSender<()>> {
        // When the oldest pending row must be written by.
        let mut deadline: Option<Instant> = None;
        loop {
            match self.commands.try_recv() {
                Ok(Command::Close(ack)) => {
                    self.drain();
                    return Some(ack);
                }
                Ok(command) => {
                    self.drain();
                    deadline = None;
                    self.answer(command);
                    continue;
                }
                Err(TryRecvError::Disconnected) => {
                    self.drain();
                    return None;
                }
                Err(TryRecvError::Empty) => {}
            }
            let wait = deadline.map_or(self.interval, |d| {
                d.saturating_duration_since(Instant::now())
            });
            match self.rows.recv_timeout(wait) {
                Ok(Msg::Row(row)) => {
                    deadline.get_or_insert_with(|| Instant::now() + self.interval);
                    self.pending.push(row);
                    if self.pending.len() >= self.batch {
                        self.write();
                        deadline = None;
                    }
                }
                Ok(Msg::Wake) => {}
                Err(RecvTimeoutError::Timeout) => {
                    self.write();
                    deadline = None;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.write();
                    return None;
                }
            }
        }
    }

    /// Write everything queued before the command being answered: those rows are at the
    /// front of a queue that never holds more than `queue` messages, so this ends even while
    /// callers keep recording.
    fn drain(&mut self) {
        for _ in 0..self.queue {
            match self.rows.try_recv() {
                Ok(Msg::Row(row)) => {
                    self.pending.push(row);
                    if self.pending.len() >= self.batch {
                        self.write();
                    }
                }
                Ok(Msg::Wake) => {}
                Err(_) => break,
            }
        }
        self.write();
    }

    fn answer(&mut self, command: Command) {
        // A caller that stopped waiting is no error.
        match command {
            Command::Usage(q, reply) => {
                let _ = reply.send(retry(&mut self.store, |s| s.usage(&q)));
            }
            Command::Spend(since_ms, reply) => {
                let _ = reply.send(retry(&mut self.store, |s| s.spend(since_ms)));
            }
            Command::Flush(ack) | Command::Close(ack) => {
                let _ = ack.send(());
            }
        }
    }

    /// Write the pending rows as one transaction, retried once; rows that still fail are
    /// counted, and warned about once per episode.
    fn write(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let n = self.pending.len() as u64;
        match retry(&mut self.store, |s| s.insert(&self.pending)) {
            Ok(()) => {
                self.counters.written.fetch_add(n, Relaxed);
                self.counters.batches.fetch_add(1, Relaxed);
                if self.failing {
                    self.failing = false;
                    tracing::info!("ledger: writes succeed again");
                }
            }
            Err(error) => {
                self.counters.failed.fetch_add(n, Relaxed);
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(%error, rows = n, "ledger: rows lost to a write error; counting further losses in failed");
                }
            }
        }
        self.pending.clear();
    }
}

/// Once more after an error, on a fresh connection for Postgres.
fn retry<T>(
    store: &mut Store,
    mut f: impl FnMut(&mut Store) -> Result<T, LedgerError>,
) -> Result<T, LedgerError> {
    f(store).or_else(|_| {
        store.reset();
        f(store)
    })
}
