//! The usage ledger: rows per second through `record` + `flush` into a SQLite file (the
//! writer's batched transactions, at two batch sizes), and the caller's cost of `record`
//! alone (the queue large enough that nothing is dropped; flushing outside the measurement).
//!
//! Run: `cargo bench --bench ledger`. Disk speed dominates the first figure: compare runs on
//! the same machine only.

use std::hint::black_box;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use signalbox::ledger::{Ledger, LedgerOptions, LedgerRow, LedgerTarget};

/// Rows per measured iteration of the write benchmark.
const ROWS: u64 = 10_000;
const FLUSH: Duration = Duration::from_secs(60);

fn row() -> LedgerRow {
    LedgerRow {
        request_id: "0190f3b2-7c4e-7a31-9a55-6f1c2d3e4b5a".into(),
        attempt: 1,
        time_ms: 1_796_113_523_123,
        key_id: Some("team-search".into()),
        user: Some("alice".into()),
        route: "model:gpt-4o".into(),
        provider: "openai".into(),
        model: "gpt-4o".into(),
        upstream_model: "gpt-4o-2024-08-06".into(),
        credential: "openai-main".into(),
        outcome: "ok",
        status: Some(200),
        prompt_tokens: 812,
        completion_tokens: 256,
        cost_micro_usd: 4_590,
        ttfb_ms: Some(312.5),
        duration_ms: 2_204.0,
        absorbed: false,
    }
}

fn open(dir: &tempfile::TempDir, batch: usize) -> Arc<Ledger> {
    let opts = LedgerOptions {
        batch,
        ..LedgerOptions::default()
    };
    Ledger::open(LedgerTarget::Sqlite(dir.path().join("ledger.db")), opts).expect("ledger")
}

fn check_nothing_lost(ledger: &Ledger) {
    let c = ledger.counters();
    let (dropped, failed) = (c.dropped.load(Relaxed), c.failed.load(Relaxed));
    assert_eq!((dropped, failed), (0, 0), "rows dropped or failed");
}

fn bench_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("ledger_write");
    g.throughput(Throughput::Elements(ROWS))
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    for batch in [64, 512] {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = open(&dir, batch);
        let template = row();
        g.bench_with_input(
            BenchmarkId::new("record_and_flush", batch),
            &batch,
            |b, _| {
                b.iter(|| {
                    for _ in 0..ROWS {
                        ledger.record(template.clone());
                    }
                    assert!(ledger.flush(FLUSH), "flush timed out");
                });
            },
        );
        check_nothing_lost(&ledger);
    }
    g.finish();
}

fn bench_record(c: &mut Criterion) {
    // Half the default queue, flushed between chunks, so no row is ever refused.
    const CHUNK: u64 = 32_768;
    let mut g = c.benchmark_group("ledger_record");
    g.throughput(Throughput::Elements(1))
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open(&dir, 512);
    let template = row();
    g.bench_function("record_only", |b| {
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK);
                let rows: Vec<LedgerRow> = (0..n).map(|_| template.clone()).collect();
                let start = Instant::now();
                for r in rows {
                    ledger.record(black_box(r));
                }
                measured += start.elapsed();
                assert!(ledger.flush(FLUSH), "flush timed out");
                left -= n;
            }
            measured
        });
    });
    check_nothing_lost(&ledger);
    g.finish();
}

criterion_group!(benches, bench_write, bench_record);
criterion_main!(benches);
