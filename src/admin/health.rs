//! `GET /admin/health`: every provider's and model's derived state (healthy, degraded,
//! unhealthy, disabled), every target with its state, counters and EWMAs, every credential's
//! cooldown, and degraded mode. A read of the registry's atomics; nothing is locked.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use crate::health::breaker::{BreakerState, FULL_HEALTH};
use crate::health::{Admission, Unavailable};
use crate::snapshot::Runtime;

fn until(router: &Runtime, now_ms: u64, until_ms: u64) -> Value {
    let left = until_ms.saturating_sub(now_ms);
    let at = router.health.clock.wall() + Duration::from_millis(left);
    json!({ "in_ms": left, "at": httpdate::fmt_http_date(at) })
}

pub fn render(router: &Runtime) -> Value {
    let tables = router.snapshot.load_full();
    let catalog = &tables.catalog;
    let reg = &tables.health;
    let now = reg.now_ms();
    let mut targets = Vec::new();
    for t in reg.targets_of(catalog) {
        let Some(d) = t.deployment else { continue };
        let dep = catalog.deployment(d);
        let provider = catalog.provider(t.provider);
        let cred = &provider.credentials[t.credential];
        let Some(th) = reg.target(t) else { continue };
        let (state, until_ms) = match reg.admission(t, now) {
            Admission::Healthy { health } if health < FULL_HEALTH => ("recovering", None),
            Admission::Healthy { .. } => ("healthy", None),
            Admission::HalfOpen => ("half_open", None),
            Admission::No(Unavailable::ProbeBusy) => ("half_open_probing", None),
            Admission::No(Unavailable::Ejected(u)) => ("ejected", Some(u)),
            Admission::No(Unavailable::Benched(u)) => ("benched", Some(u)),
            Admission::No(Unavailable::CredentialCooling(u)) => ("credential_cooling", Some(u)),
        };
        let (ok, fail) = th.window.counts(now);
        targets.push(json!({
            "provider": &*provider.id,
            "model": dep.model.map(|m| catalog.model(m).name.to_string()),
            "upstream_model": &*dep.upstream_model,
            "credential": &*cred.id,
            "usable": cred.usable,
            "state": state,
            "until": until_ms.map(|u| until(router, now, u)),
            "breaker": match th.state(now) {
                BreakerState::Closed => "closed",
                BreakerState::Open { .. } => "open",
                BreakerState::HalfOpen => "half_open",
            },
            "health": f64::from(th.health()) / f64::from(FULL_HEALTH),
            "consecutive_failures": th.consecutive_failures(),
            "ejections_since_success": th.ejections(),
            "ejections_total": th.ejections_total.load(Ordering::Relaxed),
            "in_flight": th.in_flight.load(Ordering::Relaxed),
            "window": { "successes": ok, "failures": fail, "success_rate": th.window.rate(now) },
            "ewma": {
                "latency_ms": th.latency_ms.get(),
                "ttfb_ms": th.ttfb_ms.get(),
                "throughput_tokens_per_s": th.throughput.get(),
            },
            "requests_last_minute": dep.requests.used(reg.shared.wall_s()),
        }));
    }
    let mut credentials = Vec::new();
    for p in &catalog.providers {
        for (ci, c) in p.credentials.iter().enumerate() {
            let Some(ch) = reg.credential(p.idx, ci) else {
                continue;
            };
            credentials.push(json!({
                "provider": &*p.id,
                "credential": &*c.id,
                "usable": c.usable,
                "cooling": ch.cooling_until(now).map(|u| until(router, now, u)),
                "rejected": ch.is_rejected(),
            }));
        }
    }
    let (provider_states, model_states) = crate::health::derived::derived_states(catalog, reg, now);
    let providers: Vec<Value> = catalog
        .providers
        .iter()
        .zip(&provider_states)
        .map(|(p, s)| json!({ "provider": &*p.id, "state": s.as_str() }))
        .collect();
    let models: Vec<Value> = catalog
        .models
        .iter()
        .zip(&model_states)
        .map(|(m, s)| json!({ "model": &*m.name, "state": s.as_str() }))
        .collect();
    let degraded = reg.degraded();
    let rankings = router.rankings.load();
    json!({
        "providers": providers,
        "models": models,
        "degraded": {
            "active": degraded.is_degraded(),
            "since": degraded.since_ms().map(|s| {
                let ago = now.saturating_sub(s);
                json!({
                    "ms_ago": ago,
                    "at": httpdate::fmt_http_date(reg.clock().wall() - Duration::from_millis(ago)),
                })
            }),
            "healthy_provider_ratio": degraded.last_ratio(),
        },
        "rankings": {
            "generation": rankings.tables_generation,
            "age_ms": now.saturating_sub(rankings.built_ms),
        },
        "targets": targets,
        "credentials": credentials,
    })
}
