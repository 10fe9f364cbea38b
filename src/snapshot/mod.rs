//! The snapshot: everything one config generation gives the request path, immutable, loaded
//! once per request and swapped whole on a reload — the route table (with its catalog and
//! health records), the request bounds (`failover`, `limits`), what signalbox adds to answers,
//! the client keys and budgets with the counters carried across reloads, and the metrics bound
//! to this generation's labels.
//!
//! - [`Snapshot`]: the generation itself; it derefs to its [`RouteTable`], so the deciding
//!   code (`crate::routing`, which knows nothing of keys, budgets or metrics) takes it as the
//!   route table it is.
//! - [`runtime`]: what every request reads ([`Runtime`]: the live snapshot, its rankings, the
//!   process-wide health state, sessions) and the [`RankerService`] that keeps the rankings
//!   current.
//! - [`explain`]: why a request would go where it goes, against the live snapshot — the same
//!   decision and plan walk as the proxy, with nothing claimed.

pub mod explain;
pub mod runtime;

use std::sync::Arc;

pub use runtime::{RankerService, Runtime};

use crate::catalog::Catalog;
use crate::config::{BudgetConfig, Config, Failover, Limits, RequestConfig, ResponseConfig};
use crate::health::HealthRegistry;
use crate::keys::KeyTable;
use crate::limits::budget::Spend;
use crate::metrics::{BoundMetrics, Metrics, RoutingLabels};
use crate::routing::plan::SkipReason;
use crate::routing::RouteTable;

/// One config generation, as the request path reads it.
pub struct Snapshot {
    /// The route table (with the catalog and health records it was built with).
    pub table: RouteTable,
    pub failover: Failover,
    pub limits: Limits,
    /// What signalbox adds to response bodies, and the provider headers relayed.
    pub response: ResponseConfig,
    /// The caller headers forwarded to providers.
    pub request: RequestConfig,
    /// Client keys (`keys`); `None`: no caller auth. Set by whoever builds the snapshot, which
    /// knows the previous one to carry the keys' counters from ([`Snapshot::with_accounts`]).
    pub keys: Option<Arc<KeyTable>>,
    /// `budgets.global`, and what the whole gateway spent (carried like the keys' counters).
    pub global_budget: Option<BudgetConfig>,
    pub global_spend: Arc<Spend>,
    /// Some deployment, provider or the gateway has a budget (spend is counted only then).
    pub has_budgets: bool,
    /// Some route hedges (`failover.hedge` or a policy's `hedge`): requests are counted for
    /// the hedge allowance only then.
    pub hedging: bool,
    pub metrics: BoundMetrics,
    /// `guardrails`, compiled; `None`: no profile defined (requests pay one check).
    pub guardrails: Option<Arc<crate::guardrails::Guardrails>>,
    /// `recommend`; `None`: `POST /v1/routing/recommend` is not served.
    pub recommend: Option<crate::config::RecommendConfig>,
    /// `routing_knn`, compiled; `None`: no knn entry (requests pay one check).
    pub knn: Option<Arc<crate::knn::Settings>>,
}

impl std::ops::Deref for Snapshot {
    type Target = RouteTable;

    fn deref(&self) -> &RouteTable {
        &self.table
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// One route as `signalbox_route_unservable` and `/admin/ready` report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteServing {
    /// The route's label (`chain:default`, `model:m`, ...), as in `signalbox_requests_total`.
    pub label: Arc<str>,
    /// Whether it is a chain (what `auto` and `auto:<chain>` name).
    pub chain: bool,
    /// Whether a candidate could serve it now ([`HealthRegistry::can_serve`]).
    pub can_serve: bool,
}

impl Snapshot {
    /// Every route with a candidate on an enabled provider, once per label, with whether
    /// anything can serve it right now. Routes without such a candidate (an ad-hoc
    /// `direct:<provider>` form, a route only switched-off providers serve) are the config's
    /// doing and left out: `-t` and `/admin/ready`'s `chains_without_a_usable_candidate` name
    /// them.
    pub fn serving(&self) -> Vec<RouteServing> {
        let (catalog, health) = (&self.table.catalog, &self.table.health);
        let now = health.now_ms();
        let mut out: Vec<RouteServing> = Vec::new();
        let mut at: std::collections::HashMap<Arc<str>, usize> = std::collections::HashMap::new();
        for route in &self.table.routes {
            let enabled = route
                .candidates
                .iter()
                .any(|d| catalog.provider(catalog.deployment(*d).provider).enabled);
            if !enabled {
                continue;
            }
            let can_serve = health.can_serve(catalog, &route.candidates, now);
            match at.get(&route.label) {
                Some(&i) => out[i].can_serve |= can_serve,
                None => {
                    at.insert(route.label.clone(), out.len());
                    out.push(RouteServing {
                        label: route.label.clone(),
                        chain: route.kind == crate::routing::RouteKind::Chain,
                        can_serve,
                    });
                }
            }
        }
        out
    }

    /// Build generation `generation` of `config` over `catalog` and its health records, with
    /// metrics bound to its labels. Its accounts (keys, spend) start fresh: see
    /// [`Snapshot::with_accounts`].
    pub fn build(
        config: &Config,
        catalog: Arc<Catalog>,
        health: Arc<HealthRegistry>,
        metrics: &Metrics,
        generation: u64,
    ) -> Self {
        let table = RouteTable::build(config, catalog, health, generation);
        let knn = config.checks.knn.as_ref().map(|k| {
            Arc::new(crate::knn::Settings::build(
                k,
                &table,
                &metrics.knn_decisions,
            ))
        });
        let labels = RoutingLabels {
            routes: table.route_labels.clone(),
            providers: table
                .catalog
                .providers
                .iter()
                .map(|p| p.id.clone())
                .collect(),
            rules: table.rules.iter().map(|r| r.label.clone()).collect(),
            policies: table.policies.iter().map(|p| p.name.clone()).collect(),
            entries: table
                .policies
                .iter()
                .map(|p| p.entries.len())
                .max()
                .unwrap_or(0),
            skip_reasons: SkipReason::ALL
                .iter()
                .map(|r| Arc::from(r.as_str()))
                .collect(),
            models: table
                .catalog
                .models
                .iter()
                .map(|m| m.name.clone())
                .collect(),
            keys: match (&config.keys, config.metrics_per_key) {
                (Some(keys), true) => keys.iter().map(|k| Arc::from(k.id.as_str())).collect(),
                _ => Vec::new(),
            },
        };
        Self {
            table,
            failover: config.failover,
            limits: config.limits,
            response: config.response.clone(),
            request: config.request.clone(),
            keys: None,
            global_budget: config.global_budget,
            global_spend: Arc::default(),
            has_budgets: config.global_budget.is_some()
                || config.providers.iter().any(|p| p.budget.is_some())
                || config
                    .models
                    .iter()
                    .any(|m| m.deployments.iter().any(|d| d.budget.is_some())),
            hedging: config.failover.hedge.is_some()
                || config.policies.iter().any(|p| p.hedge.is_some()),
            metrics: metrics.bind(&labels),
            guardrails: config.checks.guardrails.as_ref().map(|g| {
                let paths: Vec<&str> = config
                    .providers
                    .iter()
                    .map(|p| p.base_url.path.as_str())
                    .collect();
                Arc::new(crate::guardrails::Guardrails::build(
                    g,
                    &paths,
                    &metrics.guardrail_checks,
                ))
            }),
            recommend: config.checks.recommend.clone(),
            knn,
        }
    }

    /// The accounts that outlive a snapshot: the global spend and the client keys of `config`,
    /// the counters `previous` already had carried over; with the warnings about keys that
    /// cannot be used.
    pub fn with_accounts(
        mut self,
        config: &Config,
        previous: Option<&Snapshot>,
    ) -> (Self, Vec<String>) {
        if let Some(p) = previous {
            self.global_spend = p.global_spend.clone();
        }
        let Some(keys) = &config.keys else {
            return (self, Vec::new());
        };
        let env = |name: &str| std::env::var(name).ok();
        let models: Vec<&str> = self.table.catalog.models.iter().map(|m| &*m.name).collect();
        let (table, warnings) = KeyTable::build(
            keys,
            &config.user_budgets,
            &models,
            self.table.catalog.providers.len(),
            previous.and_then(|p| p.keys.as_deref()),
            &env,
        );
        self.keys = Some(Arc::new(table));
        (self, warnings)
    }
}
