//! Health: what live traffic taught signalbox about each target, credential and deployment.
//!
//! Two parts with different lifetimes:
//! - [`HealthShared`] lives as long as the process: the clock, the notifier the ranker waits
//!   on after a breaker transition, and degraded mode.
//! - [`HealthRegistry`] holds the records of one catalog: one per target (deployment ×
//!   credential), per credential and per deployment, all atomics behind `Arc`s, in vectors
//!   indexed like that catalog so the request path reaches a record with one index. It
//!   travels with the routing snapshot, so a request always reads records of the catalog it
//!   planned with. A new catalog (a config reload) gets its registry from
//!   [`HealthRegistry::carry_over`]: every record whose identity (provider id; model name and
//!   upstream model; credential id) still exists moves over as the same `Arc`, new targets
//!   start fresh, removed ones are dropped. Positions never identify a record across catalogs.
//!
//! The request path reads records to admit or skip candidates and writes them when an attempt
//! ends; the ranker reads them to build scored tables; the prober re-admits what was ejected.
//! No lock anywhere.
//!
//! What counts: connect errors, timeouts, resets, 5xx/529/408, empty streams and empty
//! `choices` count against the target (and towards benching its deployment); 401/402/403
//! eject the credential, not the model; 429 cools the credential and counts half a failure
//! against the target. Caller errors, client cancellations and a stale pooled connection
//! never count.
//!
//! A half-open target's single probe slot is held by a [`ProbeClaim`] from the moment the plan
//! claims it: the attempt's [`InflightGuard`] takes it over, and whichever way the request
//! goes on — a verdict, a target passed over without a call, an attempt that never started —
//! dropping it gives the slot back. A model whose `failure_threshold` is 0 has its breakers off:
//! its targets are never ejected or benched for failures (credential cooldowns still apply).
//!
//! Ad-hoc direct deployments (`<provider>/<name>` outside the catalog) have no target record:
//! only their credential's health applies.

pub mod breaker;
pub mod clock;
pub mod degraded;
pub mod derived;
pub mod probe;
pub mod stats;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use self::breaker::{BreakerState, CredentialHealth, DeploymentHealth, TargetHealth, FULL_HEALTH};
use self::clock::Clock;
use self::degraded::DegradedMode;
use crate::attempt::Outcome;
use crate::catalog::{Catalog, DeploymentIdx, ProviderIdx};
use crate::config::HealthPolicy;

/// What one finished attempt showed.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    pub outcome: Outcome,
    pub ttfb: Option<Duration>,
    pub latency: Option<Duration>,
    /// Output tokens, when the response reported usage.
    pub output_tokens: Option<u64>,
    /// The provider's `Retry-After`, clamped.
    pub retry_after: Option<Duration>,
    /// This attempt held the half-open probe slot.
    pub probe: bool,
}

/// How a failure is scoped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Counts against the target and towards benching its deployment.
    Target,
    /// 401/402/403: the credential is refused.
    CredentialRejected,
    /// 429: the credential is rate limited.
    CredentialRateLimited,
    /// Caller errors and cancellations.
    Ignored,
    Success,
}

pub fn scope_of(outcome: Outcome) -> Scope {
    match outcome {
        Outcome::Ok => Scope::Success,
        Outcome::CredentialRejected => Scope::CredentialRejected,
        Outcome::RateLimited => Scope::CredentialRateLimited,
        Outcome::ClientError
        | Outcome::Cancelled
        | Outcome::HedgeLost
        | Outcome::LocalError
        | Outcome::StaleConnection => Scope::Ignored,
        Outcome::ServerError
        | Outcome::UnexpectedStatus
        | Outcome::ModelNotFound
        | Outcome::ConnectRefused
        | Outcome::ConnectTimeout
        | Outcome::TlsError
        | Outcome::Reset
        | Outcome::Timeout
        | Outcome::StreamAborted
        | Outcome::Empty
        | Outcome::FirstChunkTimeout
        | Outcome::StreamError => Scope::Target,
    }
}

/// Identifies a target inside the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRef {
    /// `None` for an ad-hoc deployment.
    pub deployment: Option<DeploymentIdx>,
    pub provider: ProviderIdx,
    pub credential: usize,
}

/// Why a target cannot take a request right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// Ejected until (monotonic ms).
    Ejected(u64),
    Benched(u64),
    CredentialCooling(u64),
    /// Half-open with its probe already in flight.
    ProbeBusy,
}

/// Whether a target may take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed breaker; `health` permille (below 1000 while recovering).
    Healthy {
        health: u32,
    },
    /// Half-open: may take one probe if the slot can be claimed.
    HalfOpen,
    No(Unavailable),
}

/// What outlives any one catalog: the clock, the transition notifier and degraded mode.
pub struct HealthShared {
    pub clock: Arc<dyn Clock>,
    /// Poked on every breaker transition so the ranker re-ranks at once.
    pub transitions: Notify,
    pub degraded: DegradedMode,
}

impl std::fmt::Debug for HealthShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthShared").finish_non_exhaustive()
    }
}

impl HealthShared {
    pub fn new(clock: Arc<dyn Clock>, policy: &HealthPolicy) -> Arc<Self> {
        Arc::new(Self {
            clock,
            transitions: Notify::new(),
            degraded: DegradedMode::new(policy.degraded),
        })
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Wall-clock milliseconds since the epoch (instants shared with other replicas).
    pub fn wall_ms(&self) -> u64 {
        self.clock
            .wall()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    /// Wall-clock seconds since the epoch (calendar periods of budgets).
    pub fn wall_s(&self) -> u64 {
        self.clock
            .wall()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// The health records of one catalog, indexed like it.
pub struct HealthRegistry {
    pub policy: HealthPolicy,
    pub shared: Arc<HealthShared>,
    targets: Vec<Arc<TargetHealth>>,
    /// First target index of each deployment.
    target_base: Vec<usize>,
    credentials: Vec<Arc<CredentialHealth>>,
    /// First credential index of each provider.
    credential_base: Vec<usize>,
    deployments: Vec<Arc<DeploymentHealth>>,
    /// Each deployment's breaker threshold (its model's `failure_threshold`; 0 = off).
    thresholds: Vec<u32>,
}

impl std::fmt::Debug for HealthRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthRegistry")
            .field("targets", &self.targets.len())
            .finish_non_exhaustive()
    }
}

/// Where the records of a new registry come from.
trait RecordSource {
    fn target(
        &mut self,
        catalog: &Catalog,
        d: DeploymentIdx,
        credential: usize,
    ) -> Option<Arc<TargetHealth>>;
    fn credential(
        &mut self,
        catalog: &Catalog,
        p: ProviderIdx,
        credential: usize,
    ) -> Option<Arc<CredentialHealth>>;
    fn deployment(&mut self, catalog: &Catalog, d: DeploymentIdx) -> Option<Arc<DeploymentHealth>>;
}

/// Nothing to carry over: every record starts fresh.
struct Fresh;

impl RecordSource for Fresh {
    fn target(&mut self, _: &Catalog, _: DeploymentIdx, _: usize) -> Option<Arc<TargetHealth>> {
        None
    }
    fn credential(
        &mut self,
        _: &Catalog,
        _: ProviderIdx,
        _: usize,
    ) -> Option<Arc<CredentialHealth>> {
        None
    }
    fn deployment(&mut self, _: &Catalog, _: DeploymentIdx) -> Option<Arc<DeploymentHealth>> {
        None
    }
}

/// The records of a previous registry, found by identity.
struct Previous<'a> {
    registry: &'a HealthRegistry,
    /// (model, provider, upstream model) → deployment of the previous catalog.
    deployments: HashMap<(&'a str, &'a str, &'a str), DeploymentIdx>,
    /// Provider id → provider of the previous catalog.
    providers: HashMap<&'a str, &'a crate::catalog::Provider>,
}

impl<'a> Previous<'a> {
    fn new(registry: &'a HealthRegistry, catalog: &'a Catalog) -> Self {
        Self {
            registry,
            deployments: catalog
                .deployments
                .iter()
                .filter_map(|d| catalog.deployment_key(d.idx).map(|k| (k, d.idx)))
                .collect(),
            providers: catalog.providers.iter().map(|p| (&*p.id, p)).collect(),
        }
    }

    fn old_deployment(&self, catalog: &Catalog, d: DeploymentIdx) -> Option<DeploymentIdx> {
        self.deployments.get(&catalog.deployment_key(d)?).copied()
    }

    /// The previous position of credential `credential` of provider `p` (by ids).
    fn old_credential(
        &self,
        catalog: &Catalog,
        p: ProviderIdx,
        credential: usize,
    ) -> Option<(ProviderIdx, usize)> {
        let provider = catalog.provider(p);
        let old = self.providers.get(&*provider.id)?;
        let id = &provider.credentials.get(credential)?.id;
        let ci = old.credentials.iter().position(|c| c.id == *id)?;
        Some((old.idx, ci))
    }
}

impl RecordSource for Previous<'_> {
    fn target(
        &mut self,
        catalog: &Catalog,
        d: DeploymentIdx,
        credential: usize,
    ) -> Option<Arc<TargetHealth>> {
        let old_d = self.old_deployment(catalog, d)?;
        let (_, old_c) =
            self.old_credential(catalog, catalog.deployment(d).provider, credential)?;
        let base = *self.registry.target_base.get(old_d.get())?;
        self.registry.targets.get(base + old_c).cloned()
    }
    fn credential(
        &mut self,
        catalog: &Catalog,
        p: ProviderIdx,
        credential: usize,
    ) -> Option<Arc<CredentialHealth>> {
        let (old_p, old_c) = self.old_credential(catalog, p, credential)?;
        self.registry.credential_arc(old_p, old_c)
    }
    fn deployment(&mut self, catalog: &Catalog, d: DeploymentIdx) -> Option<Arc<DeploymentHealth>> {
        let old_d = self.old_deployment(catalog, d)?;
        self.registry.deployments.get(old_d.get()).cloned()
    }
}

impl HealthRegistry {
    /// Fresh records for every target, credential and deployment of `catalog`.
    pub fn new(catalog: &Catalog, policy: HealthPolicy, shared: Arc<HealthShared>) -> Self {
        Self::build(catalog, policy, shared, &mut Fresh)
    }

    /// The registry for `to`, a rebuilt catalog: records of targets, credentials and
    /// deployments that exist in both (by identity, not position) are the same records;
    /// new ones start fresh; removed ones are dropped. `from` is the catalog this registry
    /// was built for.
    pub fn carry_over(&self, from: &Catalog, to: &Catalog, policy: HealthPolicy) -> Self {
        let mut previous = Previous::new(self, from);
        Self::build(to, policy, self.shared.clone(), &mut previous)
    }

    fn build(
        catalog: &Catalog,
        policy: HealthPolicy,
        shared: Arc<HealthShared>,
        source: &mut dyn RecordSource,
    ) -> Self {
        let mut credential_base = Vec::with_capacity(catalog.providers.len());
        let mut credentials = Vec::new();
        for p in &catalog.providers {
            credential_base.push(credentials.len());
            for ci in 0..p.credentials.len() {
                credentials.push(
                    source
                        .credential(catalog, p.idx, ci)
                        .unwrap_or_else(|| Arc::new(CredentialHealth::default())),
                );
            }
        }
        let mut target_base = Vec::with_capacity(catalog.deployments.len());
        let mut targets = Vec::new();
        let mut deployments = Vec::with_capacity(catalog.deployments.len());
        let mut thresholds = Vec::with_capacity(catalog.deployments.len());
        for d in &catalog.deployments {
            target_base.push(targets.len());
            for ci in 0..catalog.provider(d.provider).credentials.len() {
                targets.push(
                    source
                        .target(catalog, d.idx, ci)
                        .unwrap_or_else(|| Arc::new(TargetHealth::new(&policy))),
                );
            }
            deployments.push(
                source
                    .deployment(catalog, d.idx)
                    .unwrap_or_else(|| Arc::new(DeploymentHealth::new(&policy))),
            );
            thresholds.push(
                d.model
                    .and_then(|m| catalog.model(m).failure_threshold)
                    .unwrap_or(policy.failure_threshold),
            );
        }
        Self {
            policy,
            shared,
            targets,
            target_base,
            credentials,
            credential_base,
            deployments,
            thresholds,
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    pub fn clock(&self) -> &dyn Clock {
        &*self.shared.clock
    }

    pub fn degraded(&self) -> &DegradedMode {
        &self.shared.degraded
    }

    pub fn target(&self, t: TargetRef) -> Option<&TargetHealth> {
        let d = t.deployment?;
        self.targets
            .get(self.target_base.get(d.get())? + t.credential)
            .map(|a| &**a)
    }

    /// The `p`-th percentile of a target's recent TTFBs (successful attempts only); `None`
    /// until it has a record.
    pub fn ttfb_percentile(&self, t: TargetRef, p: u8) -> Option<std::time::Duration> {
        let ms = self.target(t)?.ttfb_quantiles.percentile_ms(p)?;
        Some(std::time::Duration::from_secs_f64(ms / 1000.0))
    }

    pub fn credential(&self, p: ProviderIdx, credential: usize) -> Option<&CredentialHealth> {
        self.credentials
            .get(self.credential_base.get(p.get())? + credential)
            .map(|a| &**a)
    }

    fn credential_arc(&self, p: ProviderIdx, credential: usize) -> Option<Arc<CredentialHealth>> {
        self.credentials
            .get(self.credential_base.get(p.get())? + credential)
            .cloned()
    }

    pub fn deployment(&self, d: DeploymentIdx) -> Option<&DeploymentHealth> {
        self.deployments.get(d.get()).map(|a| &**a)
    }

    /// The health a target is restored at (`restore_health`), in permille.
    pub fn restore_permille(&self) -> u32 {
        breaker::restored_permille(&self.policy)
    }

    /// The breaker threshold of a deployment's targets (0: breakers off).
    pub fn threshold(&self, d: Option<DeploymentIdx>) -> u32 {
        d.and_then(|d| self.thresholds.get(d.get()).copied())
            .unwrap_or(self.policy.failure_threshold)
    }

    /// Whether a target may take a request now (without claiming a probe slot).
    pub fn admission(&self, t: TargetRef, now_ms: u64) -> Admission {
        if let Some(d) = t.deployment.and_then(|d| self.deployment(d)) {
            if let Some(until) = d.benched_until(now_ms) {
                return Admission::No(Unavailable::Benched(until));
            }
        }
        if let Some(until) = self
            .credential(t.provider, t.credential)
            .and_then(|c| c.cooling_until(now_ms))
        {
            return Admission::No(Unavailable::CredentialCooling(until));
        }
        let Some(th) = self.target(t) else {
            return Admission::Healthy {
                health: FULL_HEALTH,
            };
        };
        match th.state(now_ms) {
            BreakerState::Closed => Admission::Healthy {
                health: th.health(),
            },
            BreakerState::Open { until_ms } => Admission::No(Unavailable::Ejected(until_ms)),
            BreakerState::HalfOpen if th.probe_in_flight() => Admission::No(Unavailable::ProbeBusy),
            BreakerState::HalfOpen => Admission::HalfOpen,
        }
    }

    /// Claim the half-open probe slot of a target: held until the claim is dropped (or an
    /// attempt's verdict settles it).
    pub fn try_claim_probe(self: &Arc<Self>, t: TargetRef) -> Option<ProbeClaim> {
        self.target(t)
            .is_some_and(TargetHealth::try_claim_probe)
            .then(|| ProbeClaim {
                registry: Arc::clone(self),
                target: t,
                armed: true,
            })
    }

    /// An attempt starts: counts in-flight (released by the guard), holding the target's probe
    /// slot when it is the half-open probe.
    pub fn begin(self: &Arc<Self>, t: TargetRef, probe: Option<ProbeClaim>) -> InflightGuard {
        if let Some(th) = self.target(t) {
            th.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        InflightGuard {
            registry: Arc::clone(self),
            target: t,
            probe,
        }
    }

    /// Record how an attempt ended. Returns whether a breaker changed state.
    pub fn observe(&self, t: TargetRef, obs: &Observation) -> bool {
        let now = self.now_ms();
        let policy = &self.policy;
        let target = self.target(t);
        let mut transition = None;
        match scope_of(obs.outcome) {
            Scope::Success => {
                if let Some(th) = target {
                    transition = th.on_success(policy, obs.probe, now);
                    if let Some(ttfb) = obs.ttfb {
                        th.ttfb_ms.observe(ttfb.as_secs_f64() * 1000.0);
                        th.ttfb_quantiles.observe(ttfb.as_secs_f64() * 1000.0);
                    }
                    if let Some(latency) = obs.latency {
                        th.latency_ms.observe(latency.as_secs_f64() * 1000.0);
                        if let (Some(tokens), Some(ttfb)) = (obs.output_tokens, obs.ttfb) {
                            let gen = latency.saturating_sub(ttfb).as_secs_f64();
                            if tokens > 0 && gen > 0.001 {
                                #[allow(clippy::cast_precision_loss)]
                                th.throughput.observe(tokens as f64 / gen);
                            }
                        }
                    }
                }
                if let Some(c) = self.credential(t.provider, t.credential) {
                    c.on_success();
                }
            }
            Scope::Target => {
                let threshold = self.threshold(t.deployment);
                if let Some(th) = target {
                    transition = th.on_failure(policy, threshold, obs.probe, obs.retry_after, now);
                }
                // A model whose breaker is off is not benched either.
                if threshold > 0 {
                    if let Some(d) = t.deployment.and_then(|d| self.deployment(d)) {
                        transition = transition.or(d.on_failure(policy, now));
                    }
                }
            }
            Scope::CredentialRejected => {
                if let Some(c) = self.credential(t.provider, t.credential) {
                    transition = Some(c.on_rejected(policy, now));
                }
                if obs.probe {
                    if let Some(th) = target {
                        th.release_probe();
                    }
                }
            }
            Scope::CredentialRateLimited => {
                if let Some(c) = self.credential(t.provider, t.credential) {
                    transition = Some(c.on_rate_limited(policy, obs.retry_after, now));
                }
                if let Some(th) = target {
                    // Half a failure toward the target's threshold (seed 002): a target that
                    // only ever answers 429 is ejected after twice as many.
                    let threshold = self.threshold(t.deployment);
                    transition = th
                        .on_rate_limited(policy, threshold, obs.probe, now)
                        .or(transition);
                }
            }
            Scope::Ignored => {
                if obs.probe {
                    if let Some(th) = target {
                        th.release_probe();
                    }
                }
            }
        }
        if transition.is_some() {
            self.shared.transitions.notify_one();
        }
        transition.is_some()
    }

    /// The aggregate view of one deployment across its credentials, for ranking and display.
    pub fn deployment_view(
        &self,
        catalog: &Catalog,
        d: DeploymentIdx,
        now_ms: u64,
    ) -> DeploymentView {
        let dep = catalog.deployment(d);
        let provider = catalog.provider(dep.provider);
        let mut view = DeploymentView {
            available: false,
            health: 0,
            success_rate: 1.0,
            ttfb_ms: None,
            latency_ms: None,
            throughput: None,
            in_flight: 0,
            rate_limited_at_ms: None,
            soonest_ms: None,
        };
        let (mut ok, mut fail) = (0u32, 0u32);
        for (ci, cred) in provider.credentials.iter().enumerate() {
            if !cred.usable {
                continue;
            }
            let t = TargetRef {
                deployment: Some(d),
                provider: dep.provider,
                credential: ci,
            };
            match self.admission(t, now_ms) {
                Admission::Healthy { health } => {
                    view.available = true;
                    view.health = view.health.max(health);
                }
                // Half-open keeps its ranked place: it is ranked as a target just restored.
                Admission::HalfOpen => {
                    view.available = true;
                    view.health = view.health.max(self.restore_permille());
                }
                Admission::No(u) => {
                    let until = match u {
                        Unavailable::Ejected(x)
                        | Unavailable::Benched(x)
                        | Unavailable::CredentialCooling(x) => Some(x),
                        Unavailable::ProbeBusy => None,
                    };
                    if let Some(x) = until {
                        view.soonest_ms = Some(view.soonest_ms.map_or(x, |s: u64| s.min(x)));
                    }
                }
            }
            if let Some(th) = self.target(t) {
                let (o, f) = th.window.counts(now_ms);
                ok = ok.saturating_add(o);
                fail = fail.saturating_add(f);
                view.ttfb_ms = min_opt(view.ttfb_ms, th.ttfb_ms.get());
                view.latency_ms = min_opt(view.latency_ms, th.latency_ms.get());
                view.throughput = max_opt(view.throughput, th.throughput.get());
                view.in_flight = view
                    .in_flight
                    .saturating_add(th.in_flight.load(Ordering::Relaxed));
            }
            if let Some(c) = self.credential(dep.provider, ci) {
                if let Some(at) = c.rate_limited_at() {
                    view.rate_limited_at_ms =
                        Some(view.rate_limited_at_ms.map_or(at, |v| v.max(at)));
                }
            }
        }
        view.success_rate = (f64::from(ok) + 1.0) / (f64::from(ok) + f64::from(fail) + 1.0);
        view
    }

    /// Every target, for probes and display.
    /// Whether one of `deployments` could serve a request now: its provider enabled, resolved
    /// and holding a usable credential whose target is closed. A half-open target does not
    /// count until its probe succeeds, so a route whose every target is ejected reads as
    /// unable to serve for the whole outage, not only between two cooldowns. Read at scrape
    /// and readiness time, never on the request path.
    pub fn can_serve(&self, catalog: &Catalog, deployments: &[DeploymentIdx], now_ms: u64) -> bool {
        deployments.iter().any(|&d| {
            let provider = catalog.provider(catalog.deployment(d).provider);
            provider.enabled
                && !provider.addrs.is_empty()
                && provider.credentials.iter().enumerate().any(|(c, cred)| {
                    let t = TargetRef {
                        deployment: Some(d),
                        provider: provider.idx,
                        credential: c,
                    };
                    cred.usable && matches!(self.admission(t, now_ms), Admission::Healthy { .. })
                })
        })
    }

    pub fn targets_of<'a>(&'a self, catalog: &'a Catalog) -> impl Iterator<Item = TargetRef> + 'a {
        catalog.deployments.iter().flat_map(move |d| {
            (0..catalog.provider(d.provider).credentials.len()).map(move |c| TargetRef {
                deployment: Some(d.idx),
                provider: d.provider,
                credential: c,
            })
        })
    }

    /// Whether a provider has at least one target that could take a request now (an unprobed
    /// target counts as healthy).
    pub fn provider_healthy(&self, catalog: &Catalog, p: ProviderIdx, now_ms: u64) -> bool {
        catalog
            .deployments
            .iter()
            .filter(|d| d.provider == p)
            .any(|d| {
                catalog
                    .provider(p)
                    .credentials
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.usable)
                    .any(|(ci, _)| {
                        let t = TargetRef {
                            deployment: Some(d.idx),
                            provider: p,
                            credential: ci,
                        };
                        matches!(
                            self.admission(t, now_ms),
                            Admission::Healthy { .. } | Admission::HalfOpen
                        )
                    })
            })
    }
}

fn min_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// One deployment's health across its credentials.
#[derive(Debug, Clone, Copy)]
pub struct DeploymentView {
    /// At least one target can take a request now (closed breaker).
    pub available: bool,
    /// The best health (permille) among available targets.
    pub health: u32,
    /// Windowed success rate across credentials, with a uniform prior.
    pub success_rate: f64,
    pub ttfb_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    pub throughput: Option<f64>,
    pub in_flight: u32,
    /// When the most recent 429 on one of its credentials came (monotonic ms); scoring turns
    /// it into the rate-limit factor.
    pub rate_limited_at_ms: Option<u64>,
    /// When the soonest unavailable target frees up.
    pub soonest_ms: Option<u64>,
}

/// A claimed half-open probe slot: given back when dropped, unless an attempt's verdict has
/// settled it (the breaker releases it then).
pub struct ProbeClaim {
    registry: Arc<HealthRegistry>,
    target: TargetRef,
    armed: bool,
}

impl ProbeClaim {
    pub fn target(&self) -> TargetRef {
        self.target
    }

    /// The verdict settled the slot: nothing to give back.
    fn settled(mut self) {
        self.armed = false;
    }
}

impl Drop for ProbeClaim {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(th) = self.registry.target(self.target) {
            th.release_probe();
        }
    }
}

impl std::fmt::Debug for ProbeClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeClaim")
            .field("target", &self.target)
            .finish()
    }
}

/// Counts an attempt in flight until dropped; holds the probe slot of a half-open target's
/// probe, given back if the attempt ends without a verdict (a cancelled request must not hold
/// the slot forever).
pub struct InflightGuard {
    registry: Arc<HealthRegistry>,
    target: TargetRef,
    probe: Option<ProbeClaim>,
}

impl InflightGuard {
    pub fn target(&self) -> TargetRef {
        self.target
    }

    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }

    /// Record the attempt's outcome (once) and end it. Returns whether a breaker changed.
    pub fn finish(mut self, mut obs: Observation) -> bool {
        let claim = self.probe.take();
        obs.probe = claim.is_some();
        let transition = self.registry.observe(self.target, &obs);
        // `observe` settled the slot (success, re-ejection or release).
        if let Some(c) = claim {
            c.settled();
        }
        transition
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Some(th) = self.registry.target(self.target) {
            th.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        // An unsettled probe claim, dropped with the guard, gives the slot back.
    }
}

impl std::fmt::Debug for InflightGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InflightGuard")
            .field("target", &self.target)
            .field("probe", &self.probe.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::clock::{Clock, ManualClock};
    use super::*;
    use crate::testing::Fixture;

    fn registry(
        text: &str,
        policy: HealthPolicy,
    ) -> (Arc<Catalog>, Arc<HealthRegistry>, Arc<ManualClock>) {
        let k = Fixture::with_health(text, |h| *h = policy);
        (k.catalog, k.health, k.clock)
    }

    const TWO_KEYS: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }] }
models:
  m: { deployments: [{ provider: a, model: x }] }
  n: { deployments: [{ provider: a, model: y }] }
"#;

    use crate::testing::observation as obs;

    fn t(d: u32, c: usize) -> TargetRef {
        TargetRef {
            deployment: Some(DeploymentIdx(d)),
            provider: ProviderIdx(0),
            credential: c,
        }
    }

    #[test]
    fn credential_failures_do_not_touch_the_model() {
        let (_, reg, clock) = registry(TWO_KEYS, HealthPolicy::default());
        let now = clock.now_ms();
        reg.observe(t(0, 0), &obs(Outcome::CredentialRejected));
        // Key 1 is out for every deployment that uses it; key 2 still serves model m.
        assert!(matches!(
            reg.admission(t(0, 0), now),
            Admission::No(Unavailable::CredentialCooling(_))
        ));
        assert!(matches!(
            reg.admission(t(1, 0), now),
            Admission::No(Unavailable::CredentialCooling(_))
        ));
        assert!(matches!(
            reg.admission(t(0, 1), now),
            Admission::Healthy { .. }
        ));
        assert_eq!(
            reg.target(t(0, 0)).map(TargetHealth::consecutive_failures),
            Some(0)
        );
    }

    #[test]
    fn model_failures_bench_the_deployment_on_every_credential() {
        let policy = HealthPolicy {
            failure_threshold: 10,
            ..HealthPolicy::default()
        };
        let (_, reg, clock) = registry(TWO_KEYS, policy);
        reg.observe(t(0, 0), &obs(Outcome::ServerError));
        reg.observe(t(0, 1), &obs(Outcome::Timeout));
        clock.advance(Duration::from_secs(60));
        assert!(
            reg.observe(t(0, 0), &obs(Outcome::Reset)),
            "the third failure benches"
        );
        let now = clock.now_ms();
        for c in 0..2 {
            assert!(matches!(
                reg.admission(t(0, c), now),
                Admission::No(Unavailable::Benched(_))
            ));
        }
        assert!(
            matches!(reg.admission(t(1, 0), now), Admission::Healthy { .. }),
            "other models unaffected"
        );
        clock.advance(Duration::from_secs(600));
        assert!(matches!(
            reg.admission(t(0, 0), clock.now_ms()),
            Admission::Healthy { .. }
        ));
    }

    #[test]
    fn caller_errors_and_cancellations_never_count() {
        let policy = HealthPolicy {
            failure_threshold: 1,
            ..HealthPolicy::default()
        };
        let (_, reg, clock) = registry(TWO_KEYS, policy);
        for _ in 0..10 {
            reg.observe(t(0, 0), &obs(Outcome::ClientError));
            reg.observe(t(0, 0), &obs(Outcome::Cancelled));
        }
        assert!(matches!(
            reg.admission(t(0, 0), clock.now_ms()),
            Admission::Healthy {
                health: FULL_HEALTH
            }
        ));
        assert_eq!(
            reg.target(t(0, 0))
                .map(|th| th.window.counts(clock.now_ms())),
            Some((0, 0))
        );
    }

    #[test]
    fn a_cancelled_probe_gives_the_slot_back() {
        let policy = HealthPolicy {
            failure_threshold: 1,
            ..HealthPolicy::default()
        };
        let (_, reg, clock) = registry(TWO_KEYS, policy);
        reg.observe(t(0, 0), &obs(Outcome::ServerError));
        clock.advance(Duration::from_secs(31));
        assert_eq!(reg.admission(t(0, 0), clock.now_ms()), Admission::HalfOpen);
        let claim = reg.try_claim_probe(t(0, 0)).expect("free");
        let guard = reg.begin(t(0, 0), Some(claim));
        assert_eq!(
            reg.admission(t(0, 0), clock.now_ms()),
            Admission::No(Unavailable::ProbeBusy)
        );
        assert_eq!(
            reg.target(t(0, 0))
                .map(|th| th.in_flight.load(Ordering::Relaxed)),
            Some(1)
        );
        drop(guard);
        assert_eq!(reg.admission(t(0, 0), clock.now_ms()), Admission::HalfOpen);
        assert_eq!(
            reg.target(t(0, 0))
                .map(|th| th.in_flight.load(Ordering::Relaxed)),
            Some(0)
        );
        // A claim dropped before any attempt started gives the slot back too.
        let claim = reg.try_claim_probe(t(0, 0)).expect("free");
        assert!(
            reg.try_claim_probe(t(0, 0)).is_none(),
            "one probe at a time"
        );
        drop(claim);
        assert_eq!(reg.admission(t(0, 0), clock.now_ms()), Admission::HalfOpen);
        // A probe that succeeds restores the target.
        let claim = reg.try_claim_probe(t(0, 0)).expect("free");
        let guard = reg.begin(t(0, 0), Some(claim));
        assert!(guard.finish(obs(Outcome::Ok)));
        assert_eq!(
            reg.admission(t(0, 0), clock.now_ms()),
            Admission::Healthy { health: 500 }
        );
    }

    #[test]
    fn a_rebuilt_catalog_keeps_the_records_of_the_targets_that_survive() {
        let before = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }] }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
models:
  m: { deployments: [{ provider: a, model: x }, { provider: b, model: y }] }
  gone: { deployments: [{ provider: b, model: z }] }
"#;
        // The rebuilt config: a new provider first (every position shifts), `gone` removed,
        // a new model added, key k1 removed from `a`.
        let after = r#"
providers:
  aa: { kind: openai, base_url: "http://127.0.0.1:3/v1" }
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k2, key_env: K2 }] }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
models:
  added: { deployments: [{ provider: aa, model: w }] }
  m: { deployments: [{ provider: b, model: y }, { provider: a, model: x }] }
"#;
        let k = Fixture::with_health(before, |h| h.failure_threshold = 2);
        let x_k2 = k.target("x", 1);
        k.observe(x_k2, Outcome::ServerError);
        k.observe(k.target("y", 0), Outcome::ServerError);
        k.observe(k.target("y", 0), Outcome::ServerError);
        k.observe(k.target("z", 0), Outcome::ServerError);
        k.health.observe(
            TargetRef {
                credential: 1,
                ..x_k2
            },
            &crate::testing::observation(Outcome::RateLimited),
        );
        let now = k.shared.now_ms();

        let config = crate::config::parse(after).expect("valid");
        let rebuilt = Fixture::catalog(&config);
        let reg = k.health.carry_over(&k.catalog, &rebuilt, config.health);
        let find = |upstream: &str| {
            rebuilt
                .deployments
                .iter()
                .find(|d| &*d.upstream_model == upstream)
                .expect("deployment")
        };
        let (x, y, w) = (find("x"), find("y"), find("w"));
        let t = |d: &crate::catalog::Deployment, c| TargetRef {
            deployment: Some(d.idx),
            provider: d.provider,
            credential: c,
        };
        // x's k2 record moved with it, though x, a and k2 all changed position.
        let xk2 = reg.target(t(x, 0)).expect("x k2");
        assert_eq!(xk2.consecutive_failures(), 1);
        assert!(reg
            .credential(x.provider, 0)
            .expect("k2")
            .cooling_until(now)
            .is_some());
        // y stayed ejected; the new target w starts fresh.
        assert!(matches!(
            reg.admission(t(y, 0), now),
            Admission::No(Unavailable::Ejected(_))
        ));
        let fresh = reg.target(t(w, 0)).expect("w");
        assert_eq!(fresh.consecutive_failures(), 0);
        assert_eq!(
            reg.admission(t(w, 0), now),
            Admission::Healthy {
                health: FULL_HEALTH
            }
        );
        // The surviving records are the same records, not copies: what the old registry sees
        // next, the new one sees too.
        k.observe(x_k2, Outcome::Timeout);
        assert!(matches!(xk2.state(now), BreakerState::Open { .. }));
    }

    #[test]
    fn a_model_whose_breaker_is_off_is_never_ejected_or_benched() {
        let text = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
models:
  off: { failure_threshold: 0, deployments: [{ provider: a, model: x }] }
  on: { deployments: [{ provider: a, model: y }] }
"#;
        let k = Fixture::with_health(text, |h| h.failure_threshold = 1);
        for _ in 0..20 {
            k.observe(k.target("x", 0), Outcome::ServerError);
        }
        // A Retry-After would eject a target with a breaker; this one has none.
        k.health.observe(
            k.target("x", 0),
            &Observation {
                retry_after: Some(Duration::from_secs(60)),
                ..crate::testing::observation(Outcome::ServerError)
            },
        );
        let now = k.shared.now_ms();
        assert!(matches!(
            k.health.admission(k.target("x", 0), now),
            Admission::Healthy { .. }
        ));
        k.observe(k.target("y", 0), Outcome::ServerError);
        assert!(matches!(
            k.health.admission(k.target("y", 0), now),
            Admission::No(Unavailable::Ejected(_))
        ));
    }
}
