//! Exact admission across replicas (`state.limits: exact`).
//!
//! One Lua script per attempt checks every window the attempt counts against (a key's `rpm`,
//! its `tpm` with the request's estimate, a deployment's) and every budget it spends from (the
//! key's, its user's, the gateway's, the deployment's, its provider's) against the totals every
//! replica pushed, and only if all of them have room adds the request to the windows and its
//! estimated cost to the budgets — atomically, so replicas on one Redis never together pass a
//! limit. The replica then counts what was admitted locally as already pushed; the request
//! path (`proxy::admission`) settles reservations to the answer's usage, and the sync carries
//! the difference. The call is bounded by `state.timeout` (50 ms by default): past it, or when
//! Redis is unreachable, the request is admitted on the replica's local counters, counted in
//! `signalbox_state_fallbacks_total`, and the background sync reconciles.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;

use super::redis::RedisBackend;
use super::StateError;

/// What one request asks of the shared store.
#[derive(Debug, Default)]
pub struct Ask {
    pub now_s: u64,
    /// Window counters: store name, limit, and what this request adds.
    pub windows: Vec<(String, u64, u64)>,
    /// Spend counters, each with the budget it spends from.
    pub spends: Vec<SpendAsk>,
}

/// One budget a request spends from.
#[derive(Debug)]
pub struct SpendAsk {
    /// Store name (period and index included).
    pub name: String,
    /// The budget (micro-USD).
    pub budget: u64,
    /// The request's estimated cost, reserved when admitted (micro-USD).
    pub reserve: u64,
    /// How long the period's spend is kept in the store (`None`: forever).
    pub ttl: Option<Duration>,
}

impl Ask {
    /// Nothing to ask: no limit counts this request.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.spends.is_empty()
    }
}

/// The shared store's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Every limit had room; the windows counted the request.
    Admitted,
    /// Window `index` of the ask is full until this many seconds have passed.
    WindowFull { index: usize, wait_s: u64 },
    /// Budget `index` of the ask is spent.
    BudgetSpent { index: usize },
}

/// The request path's handle on exact admission.
pub struct SharedAdmission {
    backend: Arc<RedisBackend>,
    timeout: Duration,
    fallbacks: IntCounter,
}

impl std::fmt::Debug for SharedAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedAdmission").finish_non_exhaustive()
    }
}

impl SharedAdmission {
    pub fn new(backend: Arc<RedisBackend>, timeout: Duration, fallbacks: IntCounter) -> Self {
        Self {
            backend,
            timeout,
            fallbacks,
        }
    }

    /// Ask the store; `None` when it did not answer within `state.timeout` (counted: the
    /// caller admits locally).
    pub async fn admit(&self, ask: &Ask) -> Option<Answer> {
        match tokio::time::timeout(self.timeout, self.backend.admit(ask)).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(e)) => {
                self.fell_back(&e);
                None
            }
            Err(_) => {
                self.fell_back(&StateError::Timeout);
                None
            }
        }
    }

    fn fell_back(&self, e: &StateError) {
        self.fallbacks.inc();
        // Once a second at most: an outage is logged by the sync, this says admission took
        // the local road.
        use std::sync::atomic::{AtomicU64, Ordering};
        static LAST: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if LAST.swap(now, Ordering::Relaxed) != now {
            tracing::debug!(error = %e, "exact admission fell back to local counters");
        }
    }
}
