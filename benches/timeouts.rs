//! A request-path timeout around a future that is ready at once (the common case: the body
//! came with the head, the answer with its header): `proxy::bounded::within` beside
//! `tokio::time::timeout`, which reads the clock and takes the runtime's timer handle before
//! it polls anything. Both on a current-thread runtime with its timer enabled, as a worker's.
//!
//! And around a future that waits once (an attempt's send, whose answer comes a moment later):
//! `proxy::wheel::until` beside Pingora's fast timer and tokio's, each making its timer at the
//! wait and dropping it at the end.
//!
//! Run: `cargo bench --bench timeouts`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use signalbox::proxy::bounded::{within, within_at};
use signalbox::proxy::wheel::until;

/// A current-thread runtime with its timer enabled, as a worker's.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn bench_ready(c: &mut Criterion) {
    let rt = runtime();
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

fn bench_waits_once(c: &mut Criterion) {
    let rt = runtime();
    let limit = Duration::from_secs(30);
    let mut g = c.benchmark_group("timeout_of_a_future_that_waits_once");
    g.bench_function("wheel_until", |b| {
        b.iter(|| {
            rt.block_on(async {
                let deadline = std::time::Instant::now() + limit;
                until(deadline, tokio::task::yield_now()).await
            })
        })
    });
    g.bench_function("pingora_fast_timeout", |b| {
        b.iter(|| {
            rt.block_on(async {
                pingora_timeout::fast_timeout::fast_timeout(limit, tokio::task::yield_now()).await
            })
        })
    });
    g.bench_function("tokio_timeout", |b| {
        b.iter(|| {
            rt.block_on(async { tokio::time::timeout(limit, tokio::task::yield_now()).await })
        })
    });
    g.bench_function("no_timeout", |b| {
        b.iter(|| rt.block_on(tokio::task::yield_now()))
    });
    g.finish();
}

criterion_group!(benches, bench_ready, bench_waits_once);
criterion_main!(benches);
