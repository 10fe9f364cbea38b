//! Policies and rules, compiled into routes when the snapshot is built.
//!
//! A policy's `select` entry can order its targets in a few fixed ways, so each way is a
//! route built once: a weighted entry has one route per target that can lead (that target
//! first, the others in the order written), a complexity entry one per tier (that tier first,
//! then the others, more capable first), a priority or strategy entry one. Each route is the
//! entry's targets followed by the policy's `on_failure` models, every model a segment ranked
//! by the policy's strategy (or the model's own); a `strategy` entry ranks all its targets'
//! deployments together. Per request, choosing is then a condition walk and, for a weighted
//! entry, one draw: no allocation, no ranking. A policy whose entries all have a `when` that
//! does not hold falls back to a route of its `on_failure` models alone.
//!
//! Rules are compiled to where they send a request: a chain or axis route, or a policy.

use std::sync::Arc;

use http::HeaderValue;

use super::route::{Builder, RouteIdx, RouteKind};
use crate::attempt::{RetryOn, SameTarget, StatusSet};
use crate::catalog::DeploymentIdx;
use crate::config::condition::{Condition, Facts};
use crate::config::{Config, PolicyConfig, RouterConfig, RuleTarget, Strategy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyIdx(pub u32);

impl PolicyIdx {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

/// A compiled policy.
#[derive(Debug)]
pub struct PolicyTable {
    pub idx: PolicyIdx,
    pub name: Arc<str>,
    pub entries: Vec<PolicyEntry>,
    /// The route of the `on_failure` models alone (when no entry holds).
    pub fallback: RouteIdx,
    /// Upstream calls per request under this policy (`None`: `failover.max_attempts`).
    pub max_attempts: Option<u32>,
    /// A provider's 400 moves on to the next candidate instead of being relayed.
    pub failover_on_client_error: bool,
    /// Same-target retries under this policy (`None`: `failover.transient_retries`).
    pub retry: Option<SameTarget>,
    /// Hedged first token under this policy (`None`: `failover.hedge`).
    pub hedge: Option<crate::config::Hedge>,
}

/// One `select` entry.
#[derive(Debug)]
pub struct PolicyEntry {
    pub when: Option<Condition>,
    pub router: EntryRouter,
}

/// The routes one entry can produce, and how a request picks among them.
#[derive(Debug)]
pub enum EntryRouter {
    /// One route per target, that target first; `weights[i]` is route `i`'s share (normalised,
    /// 0 for a target without a weight: it never leads); `models[i]` is its target's model.
    Weighted {
        routes: Vec<RouteIdx>,
        weights: Vec<f64>,
        models: Vec<usize>,
    },
    /// Priority and strategy entries: one order.
    Fixed(RouteIdx),
    /// One route per tier (simple, medium, complex), that tier first.
    Complexity([RouteIdx; 3]),
    /// A knn entry: one route per order of its targets, chosen per request by `crate::knn`.
    Knn(KnnRoutes),
}

/// A knn entry's routes: every order of its targets (`orders[rank(order)]`, see
/// [`super::knn::rank`]; at most 5! = 120), and the route the `default` leads (then the
/// targets in the order written), taken whenever the router cannot decide.
#[derive(Debug)]
pub struct KnnRoutes {
    /// The targets' models (indices into the catalog's models), in the order written.
    pub models: Vec<usize>,
    /// Their names, in the same order (what examples score).
    pub names: Vec<Arc<str>>,
    pub default: usize,
    pub orders: Vec<RouteIdx>,
    pub fallback: RouteIdx,
}

impl KnnRoutes {
    /// The route that tries the targets in `order` (indices into `models`); the fallback for
    /// an order that is not a whole permutation.
    pub fn route(&self, order: &[usize]) -> RouteIdx {
        if order.len() != self.models.len() {
            return self.fallback;
        }
        self.orders
            .get(super::knn::rank(order))
            .copied()
            .unwrap_or(self.fallback)
    }
}

/// How an entry's route was chosen for one request, for explain and the routing reason.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// A weighted draw led with target `index`, whose share is `share`.
    Drawn { index: usize, share: f64 },
    /// The complexity tier (0 simple, 1 medium, 2 complex) led.
    Tier(usize),
    /// The only order of a priority or strategy entry.
    Fixed,
    /// `x-llm-router: off`: the targets in the order written (a knn entry: its `default`).
    RouterOff,
    /// A knn entry: how its order was chosen (`Pending` until `crate::knn` decides).
    Knn(super::knn::KnnOutcome),
}

/// What a policy chose for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    pub route: RouteIdx,
    /// The `select` entry that held; `None` when none did (the `on_failure` route).
    pub entry: Option<usize>,
    pub pick: Pick,
}

impl PolicyTable {
    /// The first entry whose `when` holds, and the route it gives this request. `unit` is a
    /// fresh draw in [0, 1); `tier` gives the request's complexity tier (asked only by a
    /// complexity entry); `router_off` takes the targets in the order written; `may_use` says
    /// which models (by index) the caller may be served by: a weighted draw is among those
    /// only, their weights normalised again without the others.
    pub fn select(
        &self,
        facts: &dyn Facts,
        router_off: bool,
        unit: f64,
        tier: impl FnOnce() -> usize,
        may_use: &dyn Fn(usize) -> bool,
    ) -> Selection {
        let Some((i, entry)) = self
            .entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.when.as_ref().is_none_or(|w| w.matches(facts)))
        else {
            return Selection {
                route: self.fallback,
                entry: None,
                pick: Pick::Fixed,
            };
        };
        let (route, pick) = match &entry.router {
            EntryRouter::Fixed(r) => (*r, Pick::Fixed),
            EntryRouter::Weighted { routes, .. } if router_off => (routes[0], Pick::RouterOff),
            EntryRouter::Complexity(routes) if router_off => (routes[0], Pick::RouterOff),
            EntryRouter::Knn(k) if router_off => (k.fallback, Pick::RouterOff),
            // The default's route until the request path has decided (it awaits an embedding).
            EntryRouter::Knn(k) => (k.fallback, Pick::Knn(super::knn::KnnOutcome::Pending)),
            EntryRouter::Weighted {
                routes,
                weights,
                models,
            } => {
                let shares = shares(weights, models, may_use);
                let index = draw(&shares, unit);
                let share = shares.get(index).copied().unwrap_or(0.0);
                (routes[index], Pick::Drawn { index, share })
            }
            EntryRouter::Complexity(routes) => {
                let t = tier().min(2);
                (routes[t], Pick::Tier(t))
            }
        };
        Selection {
            route,
            entry: Some(i),
            pick,
        }
    }
}

/// A weighted entry's shares for a caller who may use only the models `may_use` allows (by
/// index): the configured weights without the others', normalised again. None usable: all
/// zero (nothing leads; the plan skips what the caller may not use).
pub fn shares<'w>(
    weights: &'w [f64],
    models: &[usize],
    may_use: &dyn Fn(usize) -> bool,
) -> std::borrow::Cow<'w, [f64]> {
    if models.iter().all(|&m| may_use(m)) {
        return std::borrow::Cow::Borrowed(weights);
    }
    let usable: Vec<f64> = weights
        .iter()
        .zip(models)
        .map(|(w, &m)| if may_use(m) { *w } else { 0.0 })
        .collect();
    let total: f64 = usable.iter().sum();
    std::borrow::Cow::Owned(
        usable
            .iter()
            .map(|w| if total > 0.0 { w / total } else { 0.0 })
            .collect(),
    )
}

/// The index `unit` falls on among normalised `weights` (positive ones only).
fn draw(weights: &[f64], unit: f64) -> usize {
    let mut x = unit;
    let mut last = 0;
    for (i, w) in weights.iter().enumerate() {
        if *w <= 0.0 {
            continue;
        }
        if x < *w {
            return i;
        }
        x -= w;
        last = i;
    }
    last
}

/// A compiled rule.
#[derive(Debug)]
pub struct RuleTable {
    pub when: Condition,
    pub dest: RuleDest,
    /// `rule:<n>`: the `x-llm-route` of a request the rule sent, and the metrics label.
    pub label: Arc<str>,
    pub header: HeaderValue,
}

/// Where a rule sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleDest {
    Route(RouteIdx),
    Policy(PolicyIdx),
}

/// Every model's deployments in order, as segments ranked by `strategy` (or each model's own).
fn model_parts(
    b: &Builder<'_>,
    models: impl Iterator<Item = usize>,
    strategy: Option<Strategy>,
) -> Vec<(Strategy, Vec<DeploymentIdx>)> {
    models
        .filter_map(|m| b.catalog.models.get(m))
        .map(|m| (strategy.unwrap_or(m.strategy), m.deployments.clone()))
        .collect()
}

/// One route of a policy: `lead` models first (in that order), then `on_failure`.
fn policy_route(
    b: &mut Builder<'_>,
    p: &PolicyConfig,
    lead: &[usize],
    lead_strategy: Option<Strategy>,
) -> RouteIdx {
    let mut parts = match lead_strategy {
        // A strategy entry ranks all its targets' deployments together.
        Some(s) => vec![(
            s,
            lead.iter()
                .filter_map(|&m| b.catalog.models.get(m))
                .flat_map(|m| m.deployments.iter().copied())
                .collect(),
        )],
        None => model_parts(b, lead.iter().copied(), p.strategy),
    };
    parts.extend(model_parts(b, p.on_failure.iter().copied(), p.strategy));
    b.push_segments(RouteKind::Policy, &p.name, parts)
}

/// Compile every policy into its routes.
pub(super) fn compile_policies(config: &Config, b: &mut Builder<'_>) -> Vec<PolicyTable> {
    config
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let entries = p
                .select
                .iter()
                .map(|e| PolicyEntry {
                    when: e.when.clone(),
                    router: compile_router(b, p, &e.router),
                })
                .collect();
            let fallback = policy_route(b, p, &[], None);
            PolicyTable {
                idx: PolicyIdx(u32::try_from(i).unwrap_or(u32::MAX)),
                name: Arc::from(p.name.as_str()),
                entries,
                fallback,
                max_attempts: p.max_attempts,
                failover_on_client_error: p.failover_on_client_error,
                retry: p.retry.as_ref().map(|r| SameTarget {
                    attempts: r.attempts,
                    backoff: r.backoff,
                    on: RetryOn::Statuses(StatusSet::from_codes(&r.on_status)),
                }),
                hedge: p.hedge,
            }
        })
        .collect()
}

fn compile_router(b: &mut Builder<'_>, p: &PolicyConfig, router: &RouterConfig) -> EntryRouter {
    match router {
        RouterConfig::Weighted(targets) => {
            let models: Vec<usize> = targets.iter().map(|t| t.model).collect();
            let routes = (0..models.len())
                .map(|lead| {
                    let mut order = Vec::with_capacity(models.len());
                    order.push(models[lead]);
                    order.extend(
                        models
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| *i != lead)
                            .map(|(_, m)| *m),
                    );
                    policy_route(b, p, &order, None)
                })
                .collect();
            let raw: Vec<f64> = targets
                .iter()
                .map(|t| {
                    t.weight
                        .filter(|w| w.is_finite() && *w > 0.0)
                        .unwrap_or(0.0)
                })
                .collect();
            let total: f64 = raw.iter().sum();
            let weights = raw
                .iter()
                .map(|w| if total > 0.0 { w / total } else { 0.0 })
                .collect();
            EntryRouter::Weighted {
                routes,
                weights,
                models,
            }
        }
        RouterConfig::Priority(targets) => {
            let models: Vec<usize> = targets.iter().map(|t| t.model).collect();
            EntryRouter::Fixed(policy_route(b, p, &models, None))
        }
        RouterConfig::Strategy { strategy, targets } => {
            let models: Vec<usize> = targets.iter().map(|t| t.model).collect();
            EntryRouter::Fixed(policy_route(b, p, &models, Some(*strategy)))
        }
        RouterConfig::Complexity {
            simple,
            medium,
            complex,
        } => {
            // After the tier that leads, the more capable tier first: a request that failed on
            // its own tier is better served up than down.
            let orders = [
                [*simple, *medium, *complex],
                [*medium, *complex, *simple],
                [*complex, *medium, *simple],
            ];
            EntryRouter::Complexity(orders.map(|o| policy_route(b, p, &o, None)))
        }
        RouterConfig::Knn { targets, default } => {
            let models: Vec<usize> = targets.iter().map(|t| t.model).collect();
            let n = models.len();
            let orders = (0..super::knn::factorial(n))
                .map(|i| {
                    let order: Vec<usize> = super::knn::unrank(i, n)
                        .into_iter()
                        .map(|t| models[t])
                        .collect();
                    policy_route(b, p, &order, None)
                })
                .collect();
            let mut lead = vec![*default];
            lead.extend(models.iter().copied().filter(|m| m != default));
            let fallback = policy_route(b, p, &lead, None);
            let names = models
                .iter()
                .map(|&m| {
                    b.catalog
                        .models
                        .get(m)
                        .map_or_else(|| Arc::from("?"), |m| m.name.clone())
                })
                .collect();
            EntryRouter::Knn(KnnRoutes {
                models,
                names,
                default: *default,
                orders,
                fallback,
            })
        }
    }
}

/// Compile every rule to where it sends a request. A rule set switched off compiles to no
/// rules; its `default` becomes a last rule that always holds (`rule:default`), so the request
/// path has one walk and explain, the headers and the metrics one vocabulary.
pub(super) fn compile_rules(
    config: &Config,
    chains: &[RouteIdx],
    axes: &super::table::NameMap<&'static str, RouteIdx>,
    policies: &[PolicyTable],
) -> Vec<RuleTable> {
    if !config.rules_enabled {
        return Vec::new();
    }
    let dest = |then: &RuleTarget| match then {
        RuleTarget::Chain(c) => Some(RuleDest::Route(*chains.get(*c)?)),
        RuleTarget::Axis(a) => Some(RuleDest::Route(*axes.get(a.as_str())?)),
        // With `routing.enabled: false` a rule to a policy leads nowhere: `auto` goes on to
        // the next rule, as if this one did not hold.
        RuleTarget::Policy(_) if !config.routing.policies => None,
        RuleTarget::Policy(p) => Some(RuleDest::Policy(policies.get(*p)?.idx)),
    };
    let table = |label: String, when: Condition, dest: RuleDest| {
        let label: Arc<str> = Arc::from(label);
        let header = HeaderValue::from_str(&label).ok()?;
        Some(RuleTable {
            when,
            dest,
            label,
            header,
        })
    };
    let rules = config
        .rules
        .iter()
        .enumerate()
        .filter_map(|(n, r)| table(format!("rule:{n}"), r.when.clone(), dest(&r.then)?));
    let default = config
        .rules_default
        .as_ref()
        .and_then(dest)
        .and_then(|d| table("rule:default".into(), Condition::All(Vec::new()), d));
    rules.chain(default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knn_entry_has_a_route_per_order_and_one_led_by_its_default() {
        let t = crate::testing::Fixture::new(
            r#"
providers:
  p: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
models:
  a: { deployments: [{ provider: p, model: up-a }] }
  b: { deployments: [{ provider: p, model: up-b }] }
  c: { deployments: [{ provider: p, model: up-c }] }
  d: { deployments: [{ provider: p, model: up-d }] }
  e: { deployments: [{ provider: p, model: up-e }] }
policies:
  k:
    select: [ { router: knn, targets: [ { model: a }, { model: b }, { model: c } ], default: d } ]
    on_failure: [ e ]
routing_knn: { embedding_model: e }
"#,
        )
        .route_table();
        let p = t.policy(t.policy_by_name("k").expect("k"));
        let EntryRouter::Knn(k) = &p.entries[0].router else {
            panic!("a knn entry");
        };
        assert_eq!(k.orders.len(), 6);
        let upstream = |r: RouteIdx| -> Vec<String> {
            t.route(r)
                .candidates
                .iter()
                .map(|d| t.catalog.deployment(*d).upstream_model.to_string())
                .collect()
        };
        assert_eq!(
            upstream(k.route(&[2, 0, 1])),
            ["up-c", "up-a", "up-b", "up-e"]
        );
        assert_eq!(
            upstream(k.route(&[0, 1, 2])),
            ["up-a", "up-b", "up-c", "up-e"]
        );
        // The default first, then the targets as written, then on_failure.
        assert_eq!(
            upstream(k.fallback),
            ["up-d", "up-a", "up-b", "up-c", "up-e"]
        );
        assert_eq!(k.route(&[0, 1]), k.fallback, "not a whole order");
        let names: Vec<&str> = k.names.iter().map(|n| &**n).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn draws_follow_the_normalised_weights_and_skip_the_unweighted() {
        let weights = [0.7, 0.0, 0.3];
        let mut counts = [0; 3];
        for i in 0..1000 {
            counts[draw(&weights, (f64::from(i) + 0.5) / 1000.0)] += 1;
        }
        assert_eq!(counts, [700, 0, 300]);
        assert_eq!(draw(&weights, 0.999_999_9), 2);
    }
}
