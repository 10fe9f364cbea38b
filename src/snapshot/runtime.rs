//! The runtime: the live snapshot, its rankings, the process-wide health state and the
//! sticky sessions — what every request reads, swapped whole behind `ArcSwap` — and the ranker
//! that keeps the rankings current.
//!
//! The [`RankerService`] rebuilds the rankings at least every `routing.rank_interval` (250 ms
//! by default), at once on every breaker transition (the registry's `transitions` notifier)
//! and when the soonest ejection or cooldown ends, evaluates degraded mode on the same pass,
//! and swaps them in. A config reload stores a whole new snapshot (`crate::reload`).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use super::Snapshot;
use crate::health::clock::ms;
use crate::health::HealthShared;
use crate::limits::share::HedgeShare;
use crate::routing::rank::Rankings;
use crate::routing::session::SessionTable;

/// What every request reads: the snapshot (with its health records), its rankings, the
/// process-wide health state (clock, transitions, degraded mode) and sessions.
pub struct Runtime {
    pub snapshot: ArcSwap<Snapshot>,
    pub rankings: ArcSwap<Rankings>,
    pub health: Arc<HealthShared>,
    pub sessions: SessionTable,
    /// How many of the last second's requests may still be hedged.
    pub hedges: HedgeShare,
    /// The gateway's calls to its own models, through its own listener and plan.
    pub internal: crate::internal::InternalClient,
    /// The knn router's pools and conversations (they outlive a reload).
    pub knn: crate::knn::memory::Memory,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    pub fn new(tables: Snapshot, health: Arc<HealthShared>) -> Self {
        let now = health.now_ms();
        let rankings = Rankings::build(&tables, now);
        let sessions = SessionTable::new(ms(tables.routing.session_ttl));
        Self {
            snapshot: ArcSwap::from_pointee(tables),
            rankings: ArcSwap::from_pointee(rankings),
            health,
            sessions,
            hedges: HedgeShare::default(),
            internal: crate::internal::InternalClient::new(),
            knn: crate::knn::memory::Memory::default(),
        }
    }

    /// One ranker pass: evaluate degraded mode, rebuild and swap the rankings.
    pub fn rerank(&self) {
        let tables = self.snapshot.load_full();
        let now = self.health.now_ms();
        self.evaluate_degraded(&tables, now);
        let rankings = Rankings::build(&tables, now);
        self.rankings.store(Arc::new(rankings));
    }

    fn evaluate_degraded(&self, tables: &Snapshot, now: u64) {
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
    router: Arc<Runtime>,
    interval: Duration,
}

impl RankerService {
    pub fn new(router: Arc<Runtime>, interval: Duration) -> Self {
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
