//! A request-path timeout around a future that is ready at once (the common case: the body
//! came with the head, the answer with its header): `proxy::bounded::within` beside
//! `tokio::time::timeout`, which reads the clock and takes the runtime's timer handle before
//! it polls anything. Both on a current-thread runtime with its timer enabled, as a worker's.
//!
//! Run: `cargo bench --bench timeouts`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use signalbox::proxy::bounded::{within, within_at};

fn bench_ready(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let limit = Duration::from_secs(30);
    let mut g = c.benchmark_group("timeout_of_a_ready_future");
    g.bench_function("bounded_within", |b| {
        b.iter(|| rt.block_on(async { within(limit, async { black_box(1) }).await }))
    });
    g.bench_function("bounded_within_at", |b| {
        let deadline = tokio::time::Instant::now() + limit;
        b.iter(|| rt.block_on(async { within_at(deadline, async { black_box(1) }).await }))
    });
    g.bench_function("tokio_timeout", |b| {
        b.iter(|| rt.block_on(async { tokio::time::timeout(limit, async { black_box(1) }).await }))
    });
    g.bench_function("no_timeout", |b| {
        b.iter(|| rt.block_on(async { black_box(1) }))
    });
    g.finish();
}

criterion_group!(benches, bench_ready);
criterion_main!(benches);
