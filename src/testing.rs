//! Fixtures for tests and benches: a catalog, its health and its routing snapshot built from
//! config text, on a manual clock, with no network and no environment.
//!
//! The one builder the unit tests, the integration tests and the benches share (compiled for
//! `cfg(test)` and the `test-util` feature, never into the gateway binary). Hosts resolve to
//! `127.0.0.1:<port>`; a credential `key_env: NAME` reads the key `k-NAME`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::attempt::Outcome;
use crate::catalog::{Catalog, DeploymentIdx};
use crate::config::{Config, HealthPolicy, KeySource};
use crate::health::clock::ManualClock;
use crate::health::{HealthRegistry, HealthShared, Observation, TargetRef};
use crate::metrics::Metrics;
use crate::routing::plan::PlanEnv;
use crate::routing::RouteTable;
use crate::snapshot::{Runtime, Snapshot};

/// A config, its catalog and health, on a clock that only moves when told.
pub struct Fixture {
    pub config: Config,
    pub catalog: Arc<Catalog>,
    pub clock: Arc<ManualClock>,
    pub shared: Arc<HealthShared>,
    pub health: Arc<HealthRegistry>,
}

impl Fixture {
    /// Build from config text (which must be valid).
    pub fn new(text: &str) -> Self {
        Self::with_health(text, |_| {})
    }

    /// Build from config text, adjusting the health policy first.
    pub fn with_health(text: &str, edit: impl FnOnce(&mut HealthPolicy)) -> Self {
        let mut config = crate::config::parse(text).expect("a valid fixture config");
        edit(&mut config.health);
        let catalog = Arc::new(Self::catalog(&config));
        let clock = Arc::new(ManualClock::new());
        let shared = HealthShared::new(clock.clone(), &config.health);
        let health = Arc::new(HealthRegistry::new(&catalog, config.health, shared.clone()));
        Self {
            config,
            catalog,
            clock,
            shared,
            health,
        }
    }

    /// The catalog of a config, with loopback addresses and made-up keys.
    pub fn catalog(config: &Config) -> Catalog {
        let resolve = |_: &str, port: u16| vec![SocketAddr::from(([127, 0, 0, 1], port))];
        let read = |s: &KeySource| match s {
            KeySource::Env(name) => Ok(Some(format!("k-{name}"))),
            _ => Ok(None),
        };
        Catalog::build(config, &resolve, &read)
            .expect("a fixture catalog")
            .0
    }

    /// The route table of this fixture (generation 1): what the deciding code reads.
    pub fn route_table(&self) -> RouteTable {
        RouteTable::build(&self.config, self.catalog.clone(), self.health.clone(), 1)
    }

    /// The snapshot of this fixture (generation 1).
    pub fn snapshot(&self) -> Snapshot {
        let metrics = Metrics::new().expect("metrics");
        Snapshot::build(
            &self.config,
            self.catalog.clone(),
            self.health.clone(),
            &metrics,
            1,
        )
    }

    /// A router over this fixture's snapshot, its rankings built now.
    pub fn router(&self) -> Runtime {
        Runtime::new(self.snapshot(), self.shared.clone())
    }

    /// The plan's view of the world now.
    pub fn env(&self, degraded: bool) -> PlanEnv<'_> {
        PlanEnv {
            catalog: &self.catalog,
            health: &self.health,
            now_ms: self.shared.now_ms(),
            wall_s: self.shared.wall_s(),
            degraded,
        }
    }

    /// Every deployment, in catalog order.
    pub fn deployments(&self) -> Arc<[DeploymentIdx]> {
        self.catalog.deployments.iter().map(|d| d.idx).collect()
    }

    /// The target of the (first) deployment whose upstream model is `upstream`.
    pub fn target(&self, upstream: &str, credential: usize) -> TargetRef {
        let d = self
            .catalog
            .deployments
            .iter()
            .find(|d| &*d.upstream_model == upstream)
            .expect("a deployment with that upstream model");
        TargetRef {
            deployment: Some(d.idx),
            provider: d.provider,
            credential,
        }
    }

    /// Record an attempt on a target that ended with `outcome` (no timings).
    pub fn observe(&self, t: TargetRef, outcome: Outcome) -> bool {
        self.health.observe(t, &observation(outcome))
    }

    /// Record a success with these timings.
    pub fn succeed(&self, t: TargetRef, ttfb_ms: u64) -> bool {
        self.health.observe(
            t,
            &Observation {
                ttfb: Some(Duration::from_millis(ttfb_ms)),
                latency: Some(Duration::from_millis(ttfb_ms * 2)),
                output_tokens: Some(100),
                ..observation(Outcome::Ok)
            },
        )
    }
}

/// An observation of `outcome` with nothing else known.
pub fn observation(outcome: Outcome) -> Observation {
    Observation {
        outcome,
        ttfb: None,
        latency: None,
        output_tokens: None,
        retry_after: None,
        probe: false,
    }
}
