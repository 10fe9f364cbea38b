//! The ledger's families, read from its counters at scrape time:
//! `signalbox_ledger_rows_total{result}` (`written`, `dropped` when the queue was full,
//! `failed` when a write failed twice) and `signalbox_ledger_batches_total`. Registered with
//! or without a ledger (without, every series stays 0), so the families are on `/metrics`
//! from the first scrape as the README promises and a dashboard panel shows zeros, not nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::{IntCounter, IntCounterVec, Opts};

use crate::ledger::Ledger;

pub struct LedgerCollector {
    ledger: Option<Arc<Ledger>>,
    rows: IntCounterVec,
    batches: IntCounter,
}

impl LedgerCollector {
    /// `None`: no ledger configured (every series 0).
    pub fn new(ledger: Option<Arc<Ledger>>) -> prometheus::Result<Self> {
        Ok(Self {
            ledger,
            rows: IntCounterVec::new(
                Opts::new(
                    "signalbox_ledger_rows_total",
                    "Ledger rows by result: written, dropped (queue full), failed (write error).",
                ),
                &["result"],
            )?,
            batches: IntCounter::new(
                "signalbox_ledger_batches_total",
                "Ledger transactions committed.",
            )?,
        })
    }
}

impl Collector for LedgerCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.rows.desc();
        d.extend(self.batches.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let c = self.ledger.as_deref().map(Ledger::counters);
        let read =
            |v: Option<&std::sync::atomic::AtomicU64>| v.map_or(0, |v| v.load(Ordering::Relaxed));
        for (result, v) in [
            ("written", c.map(|c| &c.written)),
            ("dropped", c.map(|c| &c.dropped)),
            ("failed", c.map(|c| &c.failed)),
        ] {
            let counter = self.rows.with_label_values(&[result]);
            counter.inc_by(read(v).saturating_sub(counter.get()));
        }
        let n = read(c.map(|c| &c.batches));
        self.batches.inc_by(n.saturating_sub(self.batches.get()));
        let mut out = self.rows.collect();
        out.extend(self.batches.collect());
        out
    }
}
