//! The ledger's families, read from its counters at scrape time:
//! `signalbox_ledger_rows_total{result}` (`written`, `dropped` when the queue was full,
//! `failed` when a write failed twice) and `signalbox_ledger_batches_total`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::{IntCounter, IntCounterVec, Opts};

use crate::ledger::Ledger;

pub struct LedgerCollector {
    ledger: Arc<Ledger>,
    rows: IntCounterVec,
    batches: IntCounter,
}

impl LedgerCollector {
    pub fn new(ledger: Arc<Ledger>) -> prometheus::Result<Self> {
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
        let c = self.ledger.counters();
        for (result, v) in [
            ("written", &c.written),
            ("dropped", &c.dropped),
            ("failed", &c.failed),
        ] {
            let counter = self.rows.with_label_values(&[result]);
            let n = v.load(Ordering::Relaxed);
            counter.inc_by(n.saturating_sub(counter.get()));
        }
        let n = c.batches.load(Ordering::Relaxed);
        self.batches.inc_by(n.saturating_sub(self.batches.get()));
        let mut out = self.rows.collect();
        out.extend(self.batches.collect());
        out
    }
}
