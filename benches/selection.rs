//! Plan building and first-target selection for 10, 100 and 1,000 deployments, beside a naive
//! `Mutex<HashMap>` gateway doing the same decision; each lead pick on its own over a tier of
//! 2, 8 and 32 members; the ranker pass; and readers selecting while a writer swaps snapshots
//! (ArcSwap vs a mutex-guarded snapshot).
//!
//! Run: `cargo bench --bench selection`. Compare each signalbox figure with its baseline from
//! the same run: absolute numbers drift on shared machines.

// The baseline is a deliberately naive, lock-based gateway.
#![allow(
    clippy::disallowed_types,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

use std::collections::HashMap;
use std::fmt::Write;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use signalbox::attempt::Advance;
use signalbox::routing::lead::{self, splitmix64};
use signalbox::routing::plan::{Plan, PlanEnv, RequestFacts};
use signalbox::routing::{resolve, Resolution};
use signalbox::snapshot::Runtime;
use signalbox::testing::Fixture;

const SIZES: [usize; 3] = [10, 100, 1000];

/// One model `m` with `n` deployments over 10 providers, priorities in 4 tiers, prices varied.
fn config_text(n: usize, strategy: &str) -> String {
    let mut s = String::from("providers:\n");
    for p in 0..10 {
        let _ = writeln!(
            s,
            "  p{p}: {{ kind: openai, base_url: \"http://127.0.0.1:{}/v1\" }}",
            20000 + p
        );
    }
    let _ = writeln!(
        s,
        "models:\n  m:\n    strategy: {strategy}\n    deployments:"
    );
    for d in 0..n {
        let _ = writeln!(
            s,
            "      - {{ provider: p{}, model: up-{d}, priority: {}, weight: {}, price: {{ input_per_mtok: {}, output_per_mtok: {} }} }}",
            d % 10,
            d % 4,
            1 + d % 7,
            0.1 + (d % 13) as f64 * 0.2,
            0.4 + (d % 11) as f64 * 0.3,
        );
    }
    s
}

fn router(n: usize, strategy: &str) -> Arc<Runtime> {
    Arc::new(Fixture::new(&config_text(n, strategy)).router())
}

/// The request path's decision: snapshot load, name resolution, plan, first target.
fn select(router: &Runtime, seed: u64) -> Option<usize> {
    let tables = router.snapshot.load_full();
    let Ok(Resolution::Route(r)) = resolve(&tables, "m") else {
        return None;
    };
    let route = tables.route(r);
    let order = router.rankings.load().order(&tables, r);
    let facts = RequestFacts {
        input_tokens: 500,
        output_tokens: 256,
        round_robin: route.round_robin.fetch_add(1, Ordering::Relaxed),
        seed,
        ..RequestFacts::default()
    };
    let mut plan = Plan::new(order, route.strategy, facts);
    let env = PlanEnv {
        catalog: &tables.catalog,
        health: &tables.health,
        now_ms: router.health.now_ms(),
        wall_s: router.health.wall_s(),
        degraded: false,
    };
    plan.next(&env, Advance::NextDeployment)
        .map(|c| c.target.position)
}

/// What a naive gateway does: lock a map, look the model up, filter healthy deployments,
/// sort by priority and price, take the first.
#[derive(Clone)]
struct NaiveDeployment {
    name: String,
    priority: i32,
    price: f64,
}

struct Naive {
    models: Mutex<HashMap<String, Vec<NaiveDeployment>>>,
    healthy: Mutex<HashMap<String, bool>>,
}

fn naive(n: usize) -> Naive {
    let deps: Vec<NaiveDeployment> = (0..n)
        .map(|d| NaiveDeployment {
            name: format!("p{}/up-{d}", d % 10),
            priority: (d % 4) as i32,
            price: 0.1 + (d % 13) as f64 * 0.2,
        })
        .collect();
    let healthy = deps.iter().map(|d| (d.name.clone(), true)).collect();
    Naive {
        models: Mutex::new(HashMap::from([("m".to_string(), deps)])),
        healthy: Mutex::new(healthy),
    }
}

fn naive_select(n: &Naive) -> Option<String> {
    let mut candidates = n.models.lock().ok()?.get("m")?.clone();
    {
        let healthy = n.healthy.lock().ok()?;
        candidates.retain(|d| healthy.get(&d.name).copied().unwrap_or(false));
    }
    candidates.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(a.price.total_cmp(&b.price))
    });
    candidates.first().map(|d| d.name.clone())
}

fn bench_selection(c: &mut Criterion) {
    let mut g = c.benchmark_group("select");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for n in SIZES {
        for strategy in ["priority_cheapest", "round_robin", "weighted", "fastest"] {
            let r = router(n, strategy);
            let mut seed = 1u64;
            g.bench_with_input(BenchmarkId::new(strategy, n), &n, |b, _| {
                b.iter(|| {
                    seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    black_box(select(&r, seed))
                });
            });
        }
        let nv = naive(n);
        g.bench_with_input(BenchmarkId::new("baseline_mutex_hashmap", n), &n, |b, _| {
            b.iter(|| black_box(naive_select(&nv)));
        });
    }
    g.finish();
}

/// Each lead pick alone, over tiers of 2, 8 and 32 members (the facts a closure returns are
/// what the plan would read from health).
fn bench_lead_picks(c: &mut Criterion) {
    let mut g = c.benchmark_group("lead");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for n in [2usize, 8, 32] {
        let tier: Vec<usize> = (0..n).collect();
        let mut r = 1u64;
        let mut next = move || {
            r = splitmix64(r);
            r
        };
        g.bench_with_input(BenchmarkId::new("round_robin", n), &n, |b, _| {
            let mut turn = 0usize;
            b.iter(|| {
                turn += 1;
                black_box(lead::round_robin(&tier, turn))
            });
        });
        g.bench_with_input(BenchmarkId::new("random", n), &n, |b, _| {
            b.iter(|| black_box(lead::random(&tier, next())));
        });
        g.bench_with_input(BenchmarkId::new("least_inflight", n), &n, |b, _| {
            b.iter(|| black_box(lead::least_inflight(&tier, |p| (p as u32 * 7) % 5)));
        });
        g.bench_with_input(BenchmarkId::new("p2c", n), &n, |b, _| {
            b.iter(|| black_box(lead::p2c(&tier, next(), |p| p as f64 * 1.5)));
        });
        g.bench_with_input(BenchmarkId::new("weighted", n), &n, |b, _| {
            b.iter(|| {
                let unit = (next() >> 11) as f64 / (1u64 << 53) as f64;
                black_box(lead::weighted(&tier, |p| Some(1.0 + (p % 3) as f64), unit))
            });
        });
        g.bench_with_input(BenchmarkId::new("prefix_affinity", n), &n, |b, _| {
            b.iter(|| black_box(lead::prefix_affinity(&tier, next(), |p| p as u64 * 31)));
        });
        g.bench_with_input(BenchmarkId::new("cheapest", n), &n, |b, _| {
            b.iter(|| black_box(lead::cheapest(&tier, |p| (p as u64 * 13) % 7)));
        });
        g.bench_with_input(BenchmarkId::new("sticky", n), &n, |b, _| {
            b.iter(|| black_box(lead::sticky(&tier, |p| p + 1 == n)));
        });
        g.bench_with_input(BenchmarkId::new("explore", n), &n, |b, _| {
            b.iter(|| {
                let roll = (next() >> 11) as f64 / (1u64 << 53) as f64;
                black_box(lead::explore(&tier, |p| p % 2 == 0, roll, next()))
            });
        });
    }
    g.finish();
}

/// Deciding and planning one request the way the proxy does (`decide::route`, then
/// `decide::plan` and the first target), for 10 models of 10 deployments: a model named
/// directly (what every request did before policies and rules), `auto` past 20 rules of which
/// only the last holds, and a 3-entry policy whose third entry (weighted) holds.
fn bench_decide(c: &mut Criterion) {
    use signalbox::adapters::caller::CallerRequest;
    use signalbox::adapters::openai::ChatRequest;
    use signalbox::catalog::surface::Surface;
    use signalbox::routing::decide::{self, Metadata, SteeringHeaders};

    let mut text = String::from("providers:\n");
    for p in 0..10 {
        let _ = writeln!(
            text,
            "  p{p}: {{ kind: openai, base_url: \"http://127.0.0.1:{}/v1\" }}",
            20000 + p
        );
    }
    text.push_str("models:\n");
    for m in 0..10 {
        let _ = writeln!(text, "  m{m}:\n    deployments:");
        for d in 0..10 {
            let _ = writeln!(
                text,
                "      - {{ provider: p{d}, model: up-{m}-{d}, priority: {}, price: {{ input_per_mtok: {}, output_per_mtok: 1 }} }}",
                d % 3,
                1 + (m + d) % 5
            );
        }
    }
    text.push_str(
        "chains: { main: [m0, m1] }\nactive_chain: main\npolicies:\n  three:\n    select:\n",
    );
    text.push_str(
        "      - { when: { metadata.tier: gold }, router: priority, targets: [ { model: m1 } ] }\n",
    );
    text.push_str("      - { when: { $and: [ { params.stream: true }, { metadata.team: { $in: [a, b, c] } } ] }, router: priority, targets: [ { model: m2 } ] }\n");
    text.push_str("      - { router: weighted, targets: [ { model: m3, weight: 7 }, { model: m4, weight: 3 } ] }\n");
    text.push_str("    on_failure: [ m5, m6 ]\nrules:\n");
    for r in 0..19 {
        let _ = writeln!(
            text,
            "  - {{ when: {{ $or: [ {{ metadata.team: t{r} }}, {{ params.max_tokens: {{ $gt: {} }} }} ] }}, then: three }}",
            100_000 + r
        );
    }
    text.push_str("  - { when: { metadata.team: { $regex: \"^sea.ch$\" } }, then: auto:main }\n");
    let router = Fixture::new(&text).router();
    let headers = SteeringHeaders {
        route: None,
        router_off: false,
        metadata: Metadata::parse(br#"{"team":"search","tier":"free"}"#).expect("metadata"),
    };
    let body = |model: &str| {
        CallerRequest::OpenAi(
            ChatRequest::parse(bytes::Bytes::from(format!(
                r#"{{"model":"{model}","max_tokens":64,"messages":[{{"role":"user","content":"hello there"}}]}}"#
            )))
            .expect("body"),
        )
    };
    let mut g = c.benchmark_group("decide_and_plan");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for (name, request) in [
        ("model_named_directly", body("m0")),
        ("auto_past_20_rules", body("auto")),
        ("policy_3_entries", body("three")),
    ] {
        let mut seed = 1u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let tables = router.snapshot.load();
                let steering = headers.steer(Surface::ChatCompletions, &request, seed);
                let routed = decide::route(&tables, &steering).expect("routed");
                let env = PlanEnv {
                    catalog: &tables.catalog,
                    health: &tables.health,
                    now_ms: router.health.now_ms(),
                    wall_s: router.health.wall_s(),
                    degraded: false,
                };
                let facts = RequestFacts {
                    input_tokens: request.prompt_tokens(),
                    output_tokens: 64,
                    seed,
                    needs: request.needs(),
                    ..RequestFacts::default()
                };
                let mut plan =
                    decide::plan(&tables, &router.rankings.load(), &env, &routed, facts, None);
                black_box(
                    plan.next(&env, Advance::NextDeployment)
                        .map(|c| c.target.position),
                )
            });
        });
    }
    g.finish();
}

fn bench_ranker(c: &mut Criterion) {
    let mut g = c.benchmark_group("rank_pass");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for n in SIZES {
        let r = router(n, "balanced");
        g.bench_with_input(BenchmarkId::new("rerank_and_swap", n), &n, |b, _| {
            b.iter(|| r.rerank());
        });
    }
    g.finish();
}

/// Readers select while one writer re-ranks and swaps as fast as it can.
fn bench_contention(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention");
    g.measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    g.sample_size(20);
    let n = 100;
    let readers = 2;
    let r = router(n, "priority_cheapest");
    g.bench_function(BenchmarkId::new("arcswap_select_during_swaps", n), |b| {
        b.iter_custom(|iters| {
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let (r, stop) = (r.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        r.rerank();
                    }
                })
            };
            let per = iters / readers + 1;
            let start = Instant::now();
            let handles: Vec<_> = (0..readers)
                .map(|i| {
                    let r = r.clone();
                    std::thread::spawn(move || {
                        for k in 0..per {
                            black_box(select(&r, k ^ i));
                        }
                    })
                })
                .collect();
            for h in handles {
                let _ = h.join();
            }
            let took = start.elapsed();
            stop.store(true, Ordering::Relaxed);
            let _ = writer.join();
            took / u32::try_from(readers).unwrap_or(1)
        });
    });
    // Baseline: the same selection against a snapshot behind a mutex the writer replaces.
    let locked = Arc::new(Mutex::new(router(n, "priority_cheapest")));
    g.bench_function(
        BenchmarkId::new("baseline_mutex_select_during_swaps", n),
        |b| {
            b.iter_custom(|iters| {
                let stop = Arc::new(AtomicBool::new(false));
                let writer = {
                    let (locked, stop) = (locked.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            if let Ok(g) = locked.lock() {
                                g.rerank();
                            }
                        }
                    })
                };
                let per = iters / readers + 1;
                let start = Instant::now();
                let handles: Vec<_> = (0..readers)
                    .map(|i| {
                        let locked = locked.clone();
                        std::thread::spawn(move || {
                            for k in 0..per {
                                if let Ok(g) = locked.lock() {
                                    black_box(select(&g, k ^ i));
                                }
                            }
                        })
                    })
                    .collect();
                for h in handles {
                    let _ = h.join();
                }
                let took = start.elapsed();
                stop.store(true, Ordering::Relaxed);
                let _ = writer.join();
                took / u32::try_from(readers).unwrap_or(1)
            });
        },
    );
    g.finish();
}

criterion_group!(
    benches,
    bench_selection,
    bench_decide,
    bench_lead_picks,
    bench_ranker,
    bench_contention
);
criterion_main!(benches);
