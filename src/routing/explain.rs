//! `signalbox explain MODEL`: the plan a request would get, printed without calling anyone.
//!
//! The same resolution and the same plan walk as the request path, with health as it stands
//! now; only the side effects the proxy applies (claiming a half-open probe slot, rotating a
//! credential cursor) are left out, so explaining changes nothing.

use std::fmt::Write;

use super::plan::{Plan, PlanEnv, RequestFacts, SkipReason};
use super::{resolve, Resolution, Router};
use crate::retry::Advance;

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
    let _ = writeln!(out, "candidates (ranked):");
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
        let _ = writeln!(
            out,
            "  {}. {} (priority {}, {price}, {usable}/{} credentials)",
            pos + 1,
            d.routed_via.to_str().unwrap_or("?"),
            d.priority,
            p.credentials.len(),
        );
    }
    let env = PlanEnv {
        catalog: &t.catalog,
        health: &t.health,
        now_ms: router.health.now_ms(),
        degraded: router.health.degraded.is_degraded(),
    };
    let mut order = Vec::new();
    while let Some(choice) = plan.next(&env, Advance::NextDeployment) {
        plan.commit(&choice);
        order.push(choice.target);
    }
    if let Some(first) = plan
        .first_position()
        .and_then(|p| plan.deployment(&t.catalog, p))
    {
        let _ = writeln!(
            out,
            "first:    {} ({})",
            first.routed_via.to_str().unwrap_or("?"),
            if plan.first_was_healthy() {
                "healthy"
            } else {
                "not healthy now"
            }
        );
    }
    if order.is_empty() {
        let _ = writeln!(out, "no attempt possible now");
    } else {
        let _ = writeln!(out, "attempt order if each fails:");
        for (i, target) in order.iter().enumerate() {
            let d = plan.deployment(&t.catalog, target.position);
            let _ = writeln!(
                out,
                "  {}. {}{}",
                i + 1,
                d.and_then(|d| d.routed_via.to_str().ok()).unwrap_or("?"),
                if target.probe {
                    " (half-open probe)"
                } else {
                    ""
                }
            );
        }
    }
    let skipped: Vec<String> = [
        (SkipReason::ProviderDisabled, "provider disabled"),
        (SkipReason::NoCredential, "no usable credential"),
        (SkipReason::Unresolved, "host not resolved"),
        (SkipReason::Excluded, "excluded"),
        (SkipReason::Ejected, "ejected"),
        (SkipReason::Benched, "benched"),
        (SkipReason::CredentialCooling, "credential cooling"),
    ]
    .iter()
    .filter(|(r, _)| plan.skipped(*r) > 0)
    .map(|(r, what)| format!("{} {what}", plan.skipped(*r)))
    .collect();
    if !skipped.is_empty() {
        let _ = writeln!(out, "skipped:  {}", skipped.join(", "));
    }
    out
}
