//! The scored tables and the background ranker that keeps them current.
//!
//! [`Rankings`] is an immutable snapshot: for every route, its candidates ordered by the
//! route's strategy (learned strategies from live health). The [`RankerService`] rebuilds it at
//! least every `routing.rank_interval` (250 ms by default) and at once on every breaker
//! transition (the registry's `transitions` notifier), evaluates degraded mode on the same
//! pass, and swaps the snapshot in with `ArcSwap`. The request path only loads it.
//!
//! Between two passes the order can be up to one interval stale; the plan re-checks every
//! candidate against live health as it walks, so staleness costs ordering, never a call to an
//! ejected target.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use super::scoring::{rank, RankBy};
use super::session::SessionTable;
use super::table::{RouteIdx, Tables};
use crate::catalog::DeploymentIdx;
use crate::health::clock::ms;
use crate::health::HealthShared;

/// Ranked candidate orders per route, for one `Tables` generation.
#[derive(Debug)]
pub struct Rankings {
    pub tables_generation: u64,
    pub built_ms: u64,
    pub orders: Vec<Arc<[DeploymentIdx]>>,
    /// The soonest moment an ejection, bench or cooldown seen in this pass ends: the ranker
    /// wakes then, so a recovered target regains its place without waiting for the tick.
    pub next_change_ms: Option<u64>,
}

impl Rankings {
    /// Rank every route of `tables` from its health at `now_ms`.
    pub fn build(tables: &Tables, now_ms: u64) -> Self {
        let health = &tables.health;
        let orders = tables
            .routes
            .iter()
            .map(|r| {
                if r.candidates.len() <= 1 {
                    return r.candidates.clone();
                }
                // Each segment on its own: a policy's targets keep their order.
                let mut order = Vec::with_capacity(r.candidates.len());
                for s in r.segments.iter() {
                    let part = &r.candidates[s.range.clone()];
                    if part.len() <= 1 {
                        order.extend_from_slice(part);
                    } else {
                        order.extend(rank(
                            &tables.catalog,
                            health,
                            part,
                            RankBy::nominal(s.strategy, tables.routing.custom_weights, now_ms),
                        ));
                    }
                }
                Arc::from(order)
            })
            .collect();
        let next_change_ms = tables
            .catalog
            .deployments
            .iter()
            .filter_map(|d| {
                health
                    .deployment_view(&tables.catalog, d.idx, now_ms)
                    .soonest_ms
            })
            .min();
        Self {
            tables_generation: tables.generation,
            built_ms: now_ms,
            orders,
            next_change_ms,
        }
    }

    /// The ranked order of a route, or its configured order if these rankings are for
    /// another generation of the tables.
    pub fn order(&self, tables: &Tables, route: RouteIdx) -> Arc<[DeploymentIdx]> {
        if self.tables_generation == tables.generation {
            if let Some(o) = self.orders.get(route.get()) {
                return o.clone();
            }
        }
        tables.route(route).candidates.clone()
    }
}

/// Routing state shared by every request: the snapshot (with its health records), its
/// rankings, the process-wide health state (clock, transitions, degraded mode) and sessions.
pub struct Router {
    pub tables: ArcSwap<Tables>,
    pub rankings: ArcSwap<Rankings>,
    pub health: Arc<HealthShared>,
    pub sessions: SessionTable,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").finish_non_exhaustive()
    }
}

impl Router {
    pub fn new(tables: Tables, health: Arc<HealthShared>) -> Self {
        let now = health.now_ms();
        let rankings = Rankings::build(&tables, now);
        let sessions = SessionTable::new(ms(tables.routing.session_ttl));
        Self {
            tables: ArcSwap::from_pointee(tables),
            rankings: ArcSwap::from_pointee(rankings),
            health,
            sessions,
        }
    }

    /// One ranker pass: evaluate degraded mode, rebuild and swap the rankings.
    pub fn rerank(&self) {
        let tables = self.tables.load_full();
        let now = self.health.now_ms();
        self.evaluate_degraded(&tables, now);
        let rankings = Rankings::build(&tables, now);
        self.rankings.store(Arc::new(rankings));
    }

    fn evaluate_degraded(&self, tables: &Tables, now: u64) {
        let catalog = &tables.catalog;
        let mut total = 0u32;
        let mut healthy = 0u32;
        for p in catalog.providers.iter().filter(|p| p.enabled) {
            if !catalog.deployments.iter().any(|d| d.provider == p.idx) {
                continue;
            }
            total += 1;
            if tables.health.provider_healthy(catalog, p.idx, now) {
                healthy += 1;
            }
        }
        if let Some(entered) = self.health.degraded.evaluate(healthy, total, now) {
            tracing::warn!(
                degraded = entered,
                healthy_providers = healthy,
                providers = total,
                "degraded mode {}",
                if entered {
                    "entered: exploration off"
                } else {
                    "left"
                }
            );
        }
    }
}

/// Background service: re-rank every interval and on every breaker transition.
pub struct RankerService {
    router: Arc<Router>,
    interval: Duration,
}

impl RankerService {
    pub fn new(router: Arc<Router>, interval: Duration) -> Self {
        Self { router, interval }
    }
}

#[async_trait]
impl BackgroundService for RankerService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Wake when the soonest ejection or cooldown ends, if that comes before the tick.
            let wake = self.router.rankings.load().next_change_ms.map(|at| {
                let now = self.router.health.now_ms();
                tokio::time::Instant::now() + Duration::from_millis(at.saturating_sub(now) + 1)
            });
            let expiry = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.router.rerank(),
                () = self.router.health.transitions.notified() => self.router.rerank(),
                () = expiry => self.router.rerank(),
            }
        }
    }
}
