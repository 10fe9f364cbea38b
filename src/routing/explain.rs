//! `signalbox explain MODEL`: the plan a request would get, printed without calling anyone.
//! The same resolution and plan code as the request path, so what it prints is what happens.

use std::fmt::Write;

use super::plan::{Advance, Plan, PlanEnv, RequestFacts, SkipReason};
use super::{resolve, Resolution, Router};

/// A human-readable plan for `model`, as health stands now.
pub fn explain(router: &Router, model: &str) -> String {
    let t = router.tables.load_full();
    let t = &*t;
    let mut out = String::new();
    let resolution = match resolve(t, model) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(out, "{model:?} does not resolve: {e:?}");
            return out;
        }
    };
    let route = t.route(resolution.route());
    let _ = writeln!(out, "route:    {}", route.label);
    let _ = writeln!(out, "strategy: {}", route.strategy.as_str());
    let facts = RequestFacts {
        input_tokens: super::scoring::NOMINAL_INPUT_TOKENS,
        output_tokens: super::scoring::NOMINAL_OUTPUT_TOKENS,
        ..RequestFacts::default()
    };
    let mut plan = match resolution {
        Resolution::Route(r) => {
            Plan::new(router.rankings.load().order(t, r), route.strategy, facts)
        }
        Resolution::Adhoc { deployment, .. } => Plan::adhoc(deployment, facts),
    };
    let _ = writeln!(out, "candidates:");
    for pos in 0..plan.len() {
        let Some(d) = plan.deployment(&t.catalog, pos) else {
            continue;
        };
        let p = t.catalog.provider(d.provider);
        let price = d.price.map_or_else(
            || "unpriced".to_string(),
            |p| {
                format!(
                    "in ${}/Mtok out ${}/Mtok",
                    p.input_per_mtok, p.output_per_mtok
                )
            },
        );
        let usable = p.credentials.iter().filter(|c| c.usable).count();
        let state = if !p.enabled {
            "skipped: provider disabled"
        } else if usable == 0 {
            "skipped: no usable credential"
        } else if p.addrs.snapshot().is_empty() {
            "skipped: host not resolved"
        } else {
            "eligible"
        };
        let _ = writeln!(
            out,
            "  {}. {} (priority {}, {price}, {usable}/{} credentials) {state}",
            pos + 1,
            d.routed_via.to_str().unwrap_or("?"),
            d.priority,
            p.credentials.len(),
        );
    }
    let env = PlanEnv {
        catalog: &t.catalog,
        health: &router.health,
        now_ms: router.health.now_ms(),
        degraded: router.health.degraded.is_degraded(),
    };
    let first = plan.next(&env, Advance::NextDeployment);
    match first {
        Some(target) => {
            let d = plan.deployment(&t.catalog, target.position);
            let _ = writeln!(
                out,
                "first attempt: {}",
                d.and_then(|d| d.routed_via.to_str().ok()).unwrap_or("?")
            );
        }
        None => {
            let _ = writeln!(
                out,
                "no attempt possible ({} without credentials, {} disabled, {} unresolved)",
                plan.skipped(SkipReason::NoCredential),
                plan.skipped(SkipReason::ProviderDisabled),
                plan.skipped(SkipReason::Unresolved),
            );
        }
    }
    out
}
