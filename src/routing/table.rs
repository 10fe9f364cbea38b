//! The route table: every route a caller can name, with its candidate order, the compiled
//! policies and rules, and the catalog and health records it was built with. It is the
//! routing part of the snapshot (`crate::snapshot`) that requests load whole.
//!
//! A route is what a `model` string resolves to: a model, an alias, a chain (`auto`,
//! `auto:<chain>`), an axis (`auto:<axis>`), a direct `<provider>/<upstream-model>` that
//! names a configured deployment, or one way a policy can order its targets (see
//! [`super::policy`]). Its candidate list is the deployments to try, in order, deduplicated,
//! cut into *segments*: each is ranked on its own by its strategy (a policy keeps its targets'
//! order and ranks each model's deployments; a plain route is one segment). The request path
//! looks a name up (one hash lookup on a lower-cased copy in a stack buffer) on the snapshot it
//! loaded when it arrived, so a swap in the middle of a request never changes the plan under
//! it.

use std::collections::HashMap;

/// A map from a lower-cased name (the config's) to what it names, looked up once or twice per
/// request: a fast hasher, as its keys come from the config, not from callers.
pub(super) type NameMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use super::policy::{PolicyIdx, PolicyTable, RuleTable};
use super::route::Builder;
pub use super::route::{Route, RouteIdx, RouteKind, Segment};
use crate::catalog::{Catalog, DeploymentIdx, ProviderIdx};
use crate::config::{Config, RoutingKnobs, Strategy};
use crate::health::HealthRegistry;

/// The immutable route table of one config generation.
pub struct RouteTable {
    pub generation: u64,
    pub catalog: Arc<Catalog>,
    /// The health records of this catalog's targets (carried across rebuilds by identity).
    pub health: Arc<HealthRegistry>,
    pub routes: Vec<Route>,
    /// Each route's label, by its `metric` index (the label values metrics bind).
    pub route_labels: Vec<Arc<str>>,
    /// Lower-cased model and alias names.
    names: NameMap<Box<str>, RouteIdx>,
    /// Lower-cased chain names.
    chains: NameMap<Box<str>, RouteIdx>,
    /// Lower-cased axis names and synonyms.
    axes: NameMap<&'static str, RouteIdx>,
    /// `<provider>/<upstream-model>` (provider id as written, model lower-cased) of
    /// configured deployments.
    direct: NameMap<Box<str>, RouteIdx>,
    /// Per provider: the route used for direct requests to upstream models not in the catalog.
    direct_adhoc: Vec<RouteIdx>,
    /// Compiled policies, in name order, and their lower-cased names.
    pub policies: Vec<PolicyTable>,
    policy_names: NameMap<Box<str>, PolicyIdx>,
    /// Compiled rules, in the order written.
    pub rules: Vec<RuleTable>,
    pub active_chain: Option<RouteIdx>,
    /// Glob aliases (lower-cased pattern → target name), consulted only when no exact name
    /// matches.
    glob_aliases: Vec<crate::config::GlobAlias>,
    pub unresolved: RouteIdx,
    pub routing: RoutingKnobs,
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable")
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

impl RouteTable {
    pub fn build(
        config: &Config,
        catalog: Arc<Catalog>,
        health: Arc<HealthRegistry>,
        generation: u64,
    ) -> Self {
        let mut b = Builder::new(&catalog);
        let unresolved = b.push(
            RouteKind::Unresolved,
            "unresolved",
            Strategy::Priority,
            Vec::new(),
        );

        let mut names = NameMap::default();
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
        let mut chains = NameMap::default();
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

        let mut axes = NameMap::default();
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

        let mut direct: NameMap<Box<str>, RouteIdx> = NameMap::default();
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

        let route_labels = b.labels.clone();
        let routes = b.routes;

        Self {
            generation,
            catalog,
            health,
            routes,
            route_labels,
            names,
            chains,
            axes,
            direct,
            direct_adhoc,
            policies,
            policy_names,
            rules,
            active_chain,
            glob_aliases: config.glob_aliases.clone(),
            unresolved,
            routing: config.routing,
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
    /// The target of the glob alias `lower` matches, if any.
    pub fn glob_alias(&self, lower: &str) -> Option<&str> {
        self.glob_aliases
            .iter()
            .find(|g| crate::glob::matches(g.pattern.as_bytes(), lower.as_bytes()))
            .map(|g| g.target.as_str())
    }

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
        // Policies are callable names only while `routing.enabled` holds.
        if self.routing.policies {
            for p in &self.policies {
                out.push(p.name.clone());
            }
        }
        out
    }
}
