//! The routing snapshot: every route a caller can name, with its candidate order, the
//! compiled policies and rules, and the catalog and health records it was built with,
//! swapped whole behind an `ArcSwap`.
//!
//! A route is what a `model` string resolves to: a model, an alias, a chain (`auto`,
//! `auto:<chain>`), an axis (`auto:<axis>`), a direct `<provider>/<upstream-model>` that
//! names a configured deployment, or one way a policy can order its targets (see
//! [`super::policy`]). Its candidate list is the deployments to try, in order, deduplicated,
//! cut into *segments*: each is ranked on its own by its strategy (a policy keeps its targets'
//! order and ranks each model's deployments; a plain route is one segment). The request path looks a name up (one hash lookup on a lower-cased copy in a
//! stack buffer) and keeps an `Arc` of the snapshot for the request's lifetime, so a swap in
//! the middle of a request never changes the plan under it.

use std::collections::HashMap;
use std::sync::Arc;

use super::policy::{PolicyIdx, PolicyTable, RuleTable};
use super::route::Builder;
pub use super::route::{Route, RouteIdx, RouteKind, Segment};
use crate::catalog::{Catalog, DeploymentIdx, ProviderIdx};
use crate::config::{
    BudgetConfig, Config, Failover, Limits, ResponseConfig, RoutingKnobs, Strategy,
};
use crate::health::HealthRegistry;
use crate::keys::KeyTable;
use crate::limits::budget::Spend;
use crate::metrics::{BoundMetrics, Metrics, RoutingLabels};

/// The immutable routing snapshot.
pub struct Tables {
    pub generation: u64,
    pub catalog: Arc<Catalog>,
    /// The health records of this catalog's targets (carried across rebuilds by identity).
    pub health: Arc<HealthRegistry>,
    pub routes: Vec<Route>,
    /// Lower-cased model and alias names.
    names: HashMap<Box<str>, RouteIdx>,
    /// Lower-cased chain names.
    chains: HashMap<Box<str>, RouteIdx>,
    /// Lower-cased axis names and synonyms.
    axes: HashMap<&'static str, RouteIdx>,
    /// `<provider>/<upstream-model>` (provider id as written, model lower-cased) of
    /// configured deployments.
    direct: HashMap<Box<str>, RouteIdx>,
    /// Per provider: the route used for direct requests to upstream models not in the catalog.
    direct_adhoc: Vec<RouteIdx>,
    /// Compiled policies, in name order, and their lower-cased names.
    pub policies: Vec<PolicyTable>,
    policy_names: HashMap<Box<str>, PolicyIdx>,
    /// Compiled rules, in the order written.
    pub rules: Vec<RuleTable>,
    pub active_chain: Option<RouteIdx>,
    pub unresolved: RouteIdx,
    pub failover: Failover,
    pub limits: Limits,
    pub routing: RoutingKnobs,
    /// What signalbox adds to response bodies.
    pub response: ResponseConfig,
    /// Client keys (`keys`); `None`: no caller auth. Set by whoever builds the snapshot, which
    /// knows the previous one to carry the keys' counters from ([`Tables::with_accounts`]).
    pub keys: Option<Arc<KeyTable>>,
    /// `budgets.global`, and what the whole gateway spent (carried like the keys' counters).
    pub global_budget: Option<BudgetConfig>,
    pub global_spend: Arc<Spend>,
    /// Some deployment, provider or the gateway has a budget (spend is counted only then).
    pub has_budgets: bool,
    pub metrics: BoundMetrics,
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables")
            .field("generation", &self.generation)
            .field("routes", &self.routes.len())
            .finish_non_exhaustive()
    }
}

/// The `auto:<axis>` names, each with the strategy it ranks by.
const AXES: &[(&str, Strategy)] = &[
    ("smart", Strategy::Smartest),
    ("smartest", Strategy::Smartest),
    ("fast", Strategy::Fastest),
    ("fastest", Strategy::Fastest),
    ("speed", Strategy::Fastest),
    ("reliable", Strategy::Reliable),
    ("balanced", Strategy::Balanced),
    ("cheap", Strategy::Cheapest),
    ("cheapest", Strategy::Cheapest),
    ("budget", Strategy::Cheapest),
];

impl Tables {
    /// The accounts that outlive a snapshot: the global spend and the client keys of `config`,
    /// the counters `previous` already had carried over; with the warnings about keys that
    /// cannot be used.
    pub fn with_accounts(
        mut self,
        config: &Config,
        previous: Option<&Tables>,
    ) -> (Self, Vec<String>) {
        if let Some(p) = previous {
            self.global_spend = p.global_spend.clone();
        }
        let Some(keys) = &config.keys else {
            return (self, Vec::new());
        };
        let env = |name: &str| std::env::var(name).ok();
        let (table, warnings) = KeyTable::build(
            keys,
            &config.user_budgets,
            previous.and_then(|p| p.keys.as_deref()),
            &env,
        );
        self.keys = Some(Arc::new(table));
        (self, warnings)
    }

    pub fn build(
        config: &Config,
        catalog: Arc<Catalog>,
        health: Arc<HealthRegistry>,
        metrics: &Metrics,
        generation: u64,
    ) -> Self {
        let mut b = Builder::new(&catalog);
        let unresolved = b.push(
            RouteKind::Unresolved,
            "unresolved",
            Strategy::Priority,
            Vec::new(),
        );

        let mut names = HashMap::new();
        for m in &catalog.models {
            let r = b.push(
                RouteKind::Model,
                &m.name,
                m.strategy,
                b.usable(m.deployments.iter().copied()),
            );
            names.insert(m.name.to_ascii_lowercase().into_boxed_str(), r);
        }
        for a in &config.aliases {
            let m = &catalog.models[a.model];
            let r = b.push(
                RouteKind::Alias,
                &a.name,
                m.strategy,
                b.usable(m.deployments.iter().copied()),
            );
            names.insert(a.name.to_ascii_lowercase().into_boxed_str(), r);
        }
        let mut chains = HashMap::new();
        let mut chain_routes = Vec::with_capacity(config.chains.len());
        for c in &config.chains {
            let deps = c
                .models
                .iter()
                .flat_map(|&m| catalog.models[m].deployments.iter().copied());
            let r = b.push(RouteKind::Chain, &c.name, Strategy::Chain, b.usable(deps));
            chains.insert(c.name.to_ascii_lowercase().into_boxed_str(), r);
            chain_routes.push(r);
        }
        let active_chain = config.active_chain.map(|c| chain_routes[c]);

        let mut axes = HashMap::new();
        // Axis routes hold every enabled model's deployments; the ranker orders them.
        let every: Vec<DeploymentIdx> = catalog
            .models
            .iter()
            .filter(|m| m.enabled)
            .flat_map(|m| m.deployments.iter().copied())
            .collect();
        for &(axis, strategy) in AXES {
            let r = b.push(
                RouteKind::Axis,
                axis,
                strategy,
                b.usable(every.iter().copied()),
            );
            axes.insert(axis, r);
        }

        let mut direct: HashMap<Box<str>, RouteIdx> = HashMap::new();
        let mut direct_groups: HashMap<String, Vec<DeploymentIdx>> = HashMap::new();
        for d in &catalog.deployments {
            let key = format!(
                "{}/{}",
                catalog.provider(d.provider).id,
                d.upstream_model.to_ascii_lowercase()
            );
            direct_groups.entry(key).or_default().push(d.idx);
        }
        let mut keys: Vec<_> = direct_groups.into_iter().collect();
        keys.sort();
        for (key, deps) in keys {
            let r = b.push(
                RouteKind::Direct,
                &key,
                Strategy::Priority,
                b.usable(deps.into_iter()),
            );
            direct.insert(key.into_boxed_str(), r);
        }
        let direct_adhoc = catalog
            .providers
            .iter()
            .map(|p| b.push(RouteKind::Direct, &p.id, Strategy::Priority, Vec::new()))
            .collect();

        let policies = super::policy::compile_policies(config, &mut b);
        let policy_names = policies
            .iter()
            .map(|p| (p.name.to_ascii_lowercase().into_boxed_str(), p.idx))
            .collect();
        let rules = super::policy::compile_rules(config, &chain_routes, &axes, &policies);

        let provider_labels: Vec<Arc<str>> =
            catalog.providers.iter().map(|p| p.id.clone()).collect();
        let labels = RoutingLabels {
            routes: b.labels.clone(),
            providers: provider_labels,
            rules: rules.iter().map(|r| r.label.clone()).collect(),
            policies: policies.iter().map(|p| p.name.clone()).collect(),
            entries: policies.iter().map(|p| p.entries.len()).max().unwrap_or(0),
            skip_reasons: super::plan::SkipReason::ALL
                .iter()
                .map(|r| Arc::from(r.as_str()))
                .collect(),
            models: catalog.models.iter().map(|m| m.name.clone()).collect(),
            keys: match (&config.keys, config.metrics_per_key) {
                (Some(keys), true) => keys.iter().map(|k| Arc::from(k.id.as_str())).collect(),
                _ => Vec::new(),
            },
        };
        let bound = metrics.bind(&labels);
        let routes = b.routes;

        Self {
            generation,
            catalog,
            health,
            routes,
            names,
            chains,
            axes,
            direct,
            direct_adhoc,
            policies,
            policy_names,
            rules,
            active_chain,
            unresolved,
            failover: config.failover,
            limits: config.limits,
            routing: config.routing,
            response: config.response,
            keys: None,
            global_budget: config.global_budget,
            global_spend: Arc::default(),
            has_budgets: config.global_budget.is_some()
                || config.providers.iter().any(|p| p.budget.is_some())
                || config
                    .models
                    .iter()
                    .any(|m| m.deployments.iter().any(|d| d.budget.is_some())),
            metrics: bound,
        }
    }

    pub fn route(&self, r: RouteIdx) -> &Route {
        &self.routes[r.get()]
    }

    pub fn by_name(&self, lower: &str) -> Option<RouteIdx> {
        self.names.get(lower).copied()
    }

    pub fn chain(&self, lower: &str) -> Option<RouteIdx> {
        self.chains.get(lower).copied()
    }

    pub fn axis(&self, lower: &str) -> Option<RouteIdx> {
        self.axes.get(lower).copied()
    }

    pub fn direct(&self, key: &str) -> Option<RouteIdx> {
        self.direct.get(key).copied()
    }

    pub fn direct_adhoc(&self, p: ProviderIdx) -> RouteIdx {
        self.direct_adhoc[p.get()]
    }

    /// A policy by its lower-cased name.
    pub fn policy_by_name(&self, lower: &str) -> Option<PolicyIdx> {
        self.policy_names.get(lower).copied()
    }

    pub fn policy(&self, p: PolicyIdx) -> &PolicyTable {
        &self.policies[p.get()]
    }

    /// Every caller-facing model id, for `GET /v1/models`: models, aliases and chains
    /// (`auto:<chain>`), plus `auto` when an active chain is set.
    pub fn public_model_ids(&self) -> Vec<Arc<str>> {
        let mut out: Vec<Arc<str>> = self
            .routes
            .iter()
            .filter(|r| matches!(r.kind, RouteKind::Model | RouteKind::Alias))
            .filter(|r| !r.candidates.is_empty())
            .map(|r| r.name.clone())
            .collect();
        for r in &self.routes {
            if r.kind == RouteKind::Chain {
                out.push(Arc::from(format!("auto:{}", r.name)));
            }
        }
        if self.active_chain.is_some() {
            out.push(Arc::from("auto"));
        }
        for p in &self.policies {
            out.push(p.name.clone());
        }
        out
    }
}
