//! Ordering candidates by a strategy: a pure function of the catalog, a health view and `now`.
//!
//! Every strategy sorts by its own keys only: where a candidate stands by the strategy is its
//! *ranked place*, which health does not change here. The plan applies health as it walks
//! (closed breakers are called in ranked order, a half-open target is probed in its place,
//! ejected ones are skipped), so a request always sees current health and a recovered target
//! comes back to the place it had. Health still feeds the learned scores (reliability below).
//! Load-balancing strategies order by `priority_cheapest` here; their per-request pick is the
//! plan's lead (`lead`).
//!
//! Scores: `effective = (w_r·reliability + w_s·speed + w_c·capability) × headroom ×
//! rate-limit factor`, with
//! - reliability: windowed success rate (uniform prior) × health (a recovering target is
//!   worth less until it earns its share back);
//! - speed: 0.7 × fastest TTFB / this TTFB + 0.3 × this throughput / best throughput, each
//!   0.5 when unknown;
//! - capability: the model's tier / the best tier among the candidates;
//! - headroom: 1 below `scoring.headroom_threshold` (80 %) of the fuller of the deployment's
//!   `rpm`/`tpm` windows (other replicas' counts included when state is shared), falling
//!   linearly to `scoring.headroom_floor` (0.1) at 100 %;
//! - rate-limit factor: `1 − scoring.rate_limit_penalty` (0.5) right after a 429 on one of its
//!   credentials, back to 1 over `scoring.rate_limit_decay` (a minute).

use std::cmp::Ordering;

use crate::catalog::{Catalog, Deployment, DeploymentIdx};
use crate::config::types::Scoring;
use crate::config::{Strategy, Weights};
use crate::health::breaker::FULL_HEALTH;
use crate::health::{DeploymentView, HealthRegistry};

/// Nominal request used to compare prices when the request is not known (ranker tables).
pub const NOMINAL_INPUT_TOKENS: u64 = 1000;
pub const NOMINAL_OUTPUT_TOKENS: u64 = 250;

/// Estimated cost in micro-dollars of a request with these token counts.
pub fn cost_micro(d: &Deployment, input_tokens: u64, output_tokens: u64) -> u64 {
    let Some(p) = d.price else {
        // Unpriced deployments (local servers) are taken as free.
        return 0;
    };
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let micro = (p.input_per_mtok * input_tokens as f64 + p.output_per_mtok * output_tokens as f64)
        .round() as u64;
    micro
}

/// One candidate's facts for ranking.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    pub idx: DeploymentIdx,
    pub priority: i32,
    pub cost: u64,
    pub capability: u8,
    pub view: DeploymentView,
    pub headroom: f64,
    pub rate_limit: f64,
}

/// Gather the facts for `candidates`, costs for a request of `tokens` (input, output), the
/// multipliers under `scoring`.
pub fn facts(
    catalog: &Catalog,
    health: &HealthRegistry,
    candidates: &[DeploymentIdx],
    now_ms: u64,
    tokens: (u64, u64),
    scoring: &Scoring,
) -> Vec<Facts> {
    let wall_s = health.shared.wall_s();
    candidates
        .iter()
        .map(|&idx| {
            let d = catalog.deployment(idx);
            let capability = d.model.map_or(1, |m| catalog.model(m).capability);
            let view = health.deployment_view(catalog, idx, now_ms);
            let headroom = headroom_factor(window_use(d, wall_s), scoring);
            let rate_limit = rate_limit_factor(view.rate_limited_at_ms, now_ms, scoring);
            Facts {
                idx,
                priority: d.priority,
                cost: cost_micro(d, tokens.0, tokens.1),
                capability,
                view,
                headroom,
                rate_limit,
            }
        })
        .collect()
}

/// The share of the fuller of a deployment's windows in use (`rpm` requests, `tpm` tokens,
/// as this replica sees them, other replicas' counts included): 0 when it has no limits.
pub fn window_use(d: &Deployment, wall_s: u64) -> f64 {
    let rpm = d
        .rpm
        .map_or(0.0, |l| 1.0 - d.requests.headroom(wall_s, u64::from(l)));
    let tpm = d.tpm.map_or(0.0, |l| 1.0 - d.tokens.headroom(wall_s, l));
    rpm.max(tpm)
}

/// The headroom factor of a window `u` in use (0 to 1): 1 below the threshold, falling
/// linearly to the floor at 100 %.
pub fn headroom_factor(u: f64, s: &Scoring) -> f64 {
    let t = s.headroom_threshold;
    if u < t {
        return 1.0;
    }
    let past = ((u - t) / (1.0 - t)).min(1.0);
    1.0 - past * (1.0 - s.headroom_floor)
}

/// The rate-limit factor of a deployment whose credential last saw a 429 at `at_ms`:
/// `1 − penalty` at once, back to 1 linearly over the decay (none without a 429, or with a
/// zero decay).
pub fn rate_limit_factor(at_ms: Option<u64>, now_ms: u64, s: &Scoring) -> f64 {
    let decay = u64::try_from(s.rate_limit_decay.as_millis()).unwrap_or(u64::MAX);
    let Some(at) = at_ms.filter(|_| decay > 0) else {
        return 1.0;
    };
    let since = now_ms.saturating_sub(at);
    if since >= decay {
        return 1.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let faded = since as f64 / decay as f64;
    1.0 - s.rate_limit_penalty * (1.0 - faded)
}

/// The blend weights of a scored strategy; `None` for strategies with their own order.
pub fn weights_of(strategy: Strategy, custom: Weights) -> Option<Weights> {
    match strategy {
        Strategy::Balanced => Some(Weights::BALANCED),
        Strategy::Smartest => Some(Weights::SMARTEST),
        Strategy::Custom => Some(custom),
        _ => None,
    }
}

/// Reliability in [0, 1].
pub fn reliability(f: &Facts) -> f64 {
    let health = if f.view.available {
        f64::from(f.view.health) / f64::from(FULL_HEALTH)
    } else {
        0.0
    };
    f.view.success_rate * health
}

/// Effective scores of every candidate under `w`.
pub fn effective_scores(all: &[Facts], w: Weights) -> Vec<f64> {
    let best_ttfb = all
        .iter()
        .filter_map(|f| f.view.ttfb_ms)
        .fold(f64::INFINITY, f64::min);
    let best_tp = all
        .iter()
        .filter_map(|f| f.view.throughput)
        .fold(0.0_f64, f64::max);
    let best_cap = all.iter().map(|f| f.capability).max().unwrap_or(1).max(1);
    all.iter()
        .map(|f| {
            let ttfb_part = match f.view.ttfb_ms {
                Some(t) if t > 0.0 && best_ttfb.is_finite() => (best_ttfb / t).min(1.0),
                Some(_) => 1.0,
                None => 0.5,
            };
            let tp_part = match f.view.throughput {
                Some(t) if best_tp > 0.0 => (t / best_tp).min(1.0),
                _ => 0.5,
            };
            let speed = 0.7 * ttfb_part + 0.3 * tp_part;
            let capability = f64::from(f.capability) / f64::from(best_cap);
            let base = w.reliability * reliability(f) + w.speed * speed + w.capability * capability;
            base * f.headroom * f.rate_limit
        })
        .collect()
}

fn unknown_last(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::INFINITY)
}

/// How a ranking is asked for: the strategy, the custom blend, the time and the request size
/// costs are estimated for ([`NOMINAL_INPUT_TOKENS`]/[`NOMINAL_OUTPUT_TOKENS`] for the
/// shared tables, the request's own for a per-request strategy).
#[derive(Debug, Clone, Copy)]
pub struct RankBy {
    pub strategy: Strategy,
    pub custom: Weights,
    pub scoring: Scoring,
    pub now_ms: u64,
    pub tokens: (u64, u64),
}

impl RankBy {
    /// The shared tables' ranking: a nominal request.
    pub fn nominal(strategy: Strategy, custom: Weights, scoring: Scoring, now_ms: u64) -> Self {
        Self {
            strategy,
            custom,
            scoring,
            now_ms,
            tokens: (NOMINAL_INPUT_TOKENS, NOMINAL_OUTPUT_TOKENS),
        }
    }
}

/// Order `candidates` by a strategy's own keys (their ranked places).
pub fn rank(
    catalog: &Catalog,
    health: &HealthRegistry,
    candidates: &[DeploymentIdx],
    by: RankBy,
) -> Vec<DeploymentIdx> {
    let RankBy {
        strategy,
        custom,
        scoring,
        now_ms,
        tokens,
    } = by;
    let all = facts(catalog, health, candidates, now_ms, tokens, &scoring);
    let mut order: Vec<usize> = (0..all.len()).collect();
    let by = |a: &Facts, b: &Facts| -> Ordering {
        match strategy {
            Strategy::Chain => Ordering::Equal,
            Strategy::Priority => a.priority.cmp(&b.priority),
            Strategy::Cheapest => a.cost.cmp(&b.cost).then(a.priority.cmp(&b.priority)),
            Strategy::Fastest => unknown_last(a.view.ttfb_ms)
                .total_cmp(&unknown_last(b.view.ttfb_ms))
                .then_with(|| {
                    b.view
                        .throughput
                        .unwrap_or(0.0)
                        .total_cmp(&a.view.throughput.unwrap_or(0.0))
                })
                .then(a.cost.cmp(&b.cost)),
            Strategy::Reliable => reliability(b)
                .total_cmp(&reliability(a))
                .then_with(|| unknown_last(a.view.ttfb_ms).total_cmp(&unknown_last(b.view.ttfb_ms)))
                .then(a.cost.cmp(&b.cost)),
            // Scored blends are sorted below; load balancers fail over in this order.
            _ => a
                .priority
                .cmp(&b.priority)
                .then(a.cost.cmp(&b.cost))
                .then_with(|| {
                    unknown_last(a.view.ttfb_ms).total_cmp(&unknown_last(b.view.ttfb_ms))
                }),
        }
    };
    if let Some(w) = weights_of(strategy, custom) {
        let scores = effective_scores(&all, w);
        order.sort_by(|&a, &b| {
            scores[b]
                .total_cmp(&scores[a])
                .then(all[a].priority.cmp(&all[b].priority))
        });
    } else {
        order.sort_by(|&a, &b| by(&all[a], &all[b]));
    }
    order.into_iter().map(|i| all[i].idx).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::Outcome;
    use crate::testing::Fixture;
    use std::time::Duration;

    const CONFIG: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1", priority: 5 }
  c: { kind: openai, base_url: "http://127.0.0.1:3/v1" }
models:
  small: { capability: 1, deployments: [{ provider: a, model: s, price: { input_per_mtok: 0.1, output_per_mtok: 0.4 } }] }
  mid: { capability: 3, deployments: [{ provider: b, model: m, price: { input_per_mtok: 1.0, output_per_mtok: 4.0 } }] }
  big: { capability: 5, deployments: [{ provider: c, model: b, price: { input_per_mtok: 5.0, output_per_mtok: 20.0 } }] }
"#;

    fn order(k: &Fixture, strategy: Strategy, custom: Weights) -> Vec<String> {
        let by = RankBy::nominal(strategy, custom, Scoring::default(), k.shared.now_ms());
        rank(&k.catalog, &k.health, &k.deployments(), by)
            .iter()
            .map(|d| k.catalog.deployment(*d).upstream_model.to_string())
            .collect()
    }

    #[test]
    fn static_orders() {
        let k = Fixture::new(CONFIG);
        let w = Weights::BALANCED;
        // Catalog order is by model name: big (b), mid (m), small (s).
        assert_eq!(order(&k, Strategy::Priority, w), ["m", "b", "s"]);
        assert_eq!(order(&k, Strategy::Cheapest, w), ["s", "m", "b"]);
        assert_eq!(order(&k, Strategy::Smartest, w), ["b", "m", "s"]);
        assert_eq!(order(&k, Strategy::Chain, w), ["b", "m", "s"]);
    }

    #[test]
    fn a_requests_own_size_decides_its_costs() {
        let text = CONFIG.replace("output_per_mtok: 20.0", "output_per_mtok: 0.01");
        let k = Fixture::new(&text);
        let rank_for = |tokens| {
            let by = RankBy {
                tokens,
                ..RankBy::nominal(
                    Strategy::Cheapest,
                    Weights::BALANCED,
                    Scoring::default(),
                    k.shared.now_ms(),
                )
            };
            rank(&k.catalog, &k.health, &k.deployments(), by)
                .iter()
                .map(|d| k.catalog.deployment(*d).upstream_model.to_string())
                .collect::<Vec<_>>()
        };
        // Output-heavy: big's output price is the lowest.
        assert_eq!(rank_for((10, 100_000))[0], "b");
        assert_eq!(rank_for((100_000, 10))[0], "s");
    }

    #[test]
    fn fastest_prefers_measured_speed_and_puts_unknown_last() {
        let k = Fixture::new(CONFIG);
        k.succeed(k.target("b", 0), 50);
        k.succeed(k.target("m", 0), 400);
        assert_eq!(
            order(&k, Strategy::Fastest, Weights::BALANCED),
            ["b", "m", "s"]
        );
    }

    #[test]
    fn reliable_prefers_success_and_ejection_does_not_move_a_ranked_place() {
        let k = Fixture::new(CONFIG);
        for _ in 0..5 {
            k.succeed(k.target("s", 0), 100);
            k.succeed(k.target("m", 0), 100);
        }
        k.observe(k.target("m", 0), Outcome::ServerError);
        let reliable = order(&k, Strategy::Reliable, Weights::BALANCED);
        assert_eq!(
            reliable.last().map(String::as_str),
            Some("m"),
            "{reliable:?}"
        );
        // Eject `s`: by price it stays first; the plan skips it while it is out.
        for _ in 0..3 {
            k.observe(k.target("s", 0), Outcome::ServerError);
        }
        assert_eq!(
            order(&k, Strategy::Cheapest, Weights::BALANCED),
            ["s", "m", "b"]
        );
    }

    #[test]
    fn custom_weights_and_rate_limit_penalty() {
        let k = Fixture::new(CONFIG);
        let capability_only = Weights {
            reliability: 0.0,
            speed: 0.0,
            capability: 1.0,
        };
        assert_eq!(
            order(&k, Strategy::Custom, capability_only),
            ["b", "m", "s"]
        );
        // A 429 on b's credential holds it back below m in the balanced blend.
        k.health.observe(
            k.target("b", 0),
            &crate::health::Observation {
                retry_after: Some(Duration::from_millis(1)),
                ..crate::testing::observation(Outcome::RateLimited)
            },
        );
        k.clock.advance(Duration::from_millis(5));
        assert_eq!(
            order(&k, Strategy::Smartest, Weights::BALANCED),
            ["m", "b", "s"],
            "the rate-limit factor (0.5) outweighs b's capability edge"
        );
    }

    #[test]
    fn balanced_blends_and_headroom_holds_back() {
        let k = Fixture::new(CONFIG);
        // All equally reliable and unknown speed: capability decides.
        assert_eq!(
            order(&k, Strategy::Balanced, Weights::BALANCED),
            ["b", "m", "s"]
        );
        let d = Scoring::default();
        assert!((headroom_factor(0.0, &d) - 1.0).abs() < 1e-9);
        assert!((headroom_factor(0.9, &d) - 0.55).abs() < 1e-9);
        assert!((headroom_factor(1.0, &d) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn the_multipliers_follow_their_settings() {
        let s = Scoring {
            headroom_threshold: 0.5,
            headroom_floor: 0.0,
            rate_limit_penalty: 0.8,
            rate_limit_decay: Duration::from_secs(10),
        };
        assert!((headroom_factor(0.49, &s) - 1.0).abs() < 1e-9);
        assert!((headroom_factor(0.75, &s) - 0.5).abs() < 1e-9);
        assert!(headroom_factor(1.0, &s).abs() < 1e-9);
        // Past 100 % (another replica's counts) it stays at the floor.
        assert!(headroom_factor(1.3, &s).abs() < 1e-9);
        // The defaults: 0.5 right after a 429, back to 1 over a minute.
        let d = Scoring::default();
        assert!((rate_limit_factor(Some(50_000), 50_000, &d) - 0.5).abs() < 1e-9);
        assert!((rate_limit_factor(Some(50_000), 80_000, &d) - 0.75).abs() < 1e-9);
        assert!((rate_limit_factor(Some(50_000), 110_000, &d) - 1.0).abs() < 1e-9);
        assert!((rate_limit_factor(None, 50_000, &d) - 1.0).abs() < 1e-9);
        // A heavier penalty over a shorter decay.
        assert!((rate_limit_factor(Some(1_000), 1_000, &s) - 0.2).abs() < 1e-9);
        assert!((rate_limit_factor(Some(1_000), 6_000, &s) - 0.6).abs() < 1e-9);
        assert!((rate_limit_factor(Some(1_000), 11_000, &s) - 1.0).abs() < 1e-9);
        // No decay: no penalty.
        let off = Scoring {
            rate_limit_decay: Duration::ZERO,
            ..d
        };
        assert!((rate_limit_factor(Some(1_000), 1_000, &off) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_nearly_full_window_lowers_the_headroom_factor() {
        let k = Fixture::new(
            r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
  c: { kind: openai, base_url: "http://127.0.0.1:3/v1" }
models:
  mid: { capability: 3, deployments: [{ provider: a, model: m, tpm: 1000 }] }
  big: { capability: 5, deployments: [{ provider: c, model: b, rpm: 10 }] }
"#,
        );
        let w = Weights::BALANCED;
        assert_eq!(order(&k, Strategy::Balanced, w), ["b", "m"]);
        let wall = k.shared.wall_s();
        let big = k
            .catalog
            .deployments
            .iter()
            .find(|d| &*d.upstream_model == "b");
        let big = big.expect("deployment b");
        // 10 of b's 10 requests a minute used: its factor falls to 0.1 and m leads.
        big.requests.add(wall, 10);
        assert_eq!(order(&k, Strategy::Balanced, w), ["m", "b"]);
        // The tokens window counts the same way: m at 950 of 1000 tokens (factor 0.325) is
        // still ahead of b at 0.1, and behind it again once b's window has room.
        let mid = k
            .catalog
            .deployments
            .iter()
            .find(|d| &*d.upstream_model == "m");
        mid.expect("deployment m").tokens.add(wall, 950);
        assert_eq!(order(&k, Strategy::Balanced, w), ["m", "b"]);
        big.requests.sub(wall, 10);
        assert_eq!(order(&k, Strategy::Balanced, w), ["b", "m"]);
        assert!((window_use(big, wall)).abs() < 1e-9);
    }
}
