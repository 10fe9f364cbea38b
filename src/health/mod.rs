//! Health: what live traffic taught signalbox about each target, credential and deployment.
//!
//! The [`HealthRegistry`] holds one record per target (deployment × credential), per
//! credential and per deployment, all atomics, in vectors indexed like the catalog. The
//! request path reads it to admit or skip candidates and writes it when an attempt ends; the
//! ranker reads it to build scored tables; the prober re-admits what it ejected. No lock
//! anywhere.
//!
//! What counts (DESIGN §5): connect errors, timeouts, resets, 5xx/529/408, empty streams and
//! empty `choices` count against the target (and towards benching its deployment); 401/402/403
//! eject the credential, not the model; 429 cools the credential. Caller errors and client
//! cancellations never count.
//!
//! Ad-hoc direct deployments (`<provider>/<name>` outside the catalog) have no target record:
//! only their credential's health applies.

pub mod breaker;
pub mod clock;
pub mod degraded;
pub mod export;
pub mod probe;
pub mod stats;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use self::breaker::{BreakerState, CredentialHealth, DeploymentHealth, TargetHealth, FULL_HEALTH};
use self::clock::Clock;
use self::degraded::DegradedMode;
use crate::catalog::{Catalog, DeploymentIdx, ProviderIdx};
use crate::config::HealthPolicy;
use crate::metrics::Outcome;

/// How long the rate-limit factor takes to fade back to 1 after a 429.
pub const RATE_LIMIT_FADE: Duration = Duration::from_secs(60);

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
        Outcome::ClientError | Outcome::Cancelled | Outcome::LocalError => Scope::Ignored,
        Outcome::ServerError
        | Outcome::UnexpectedStatus
        | Outcome::ModelNotFound
        | Outcome::ConnectRefused
        | Outcome::ConnectTimeout
        | Outcome::TlsError
        | Outcome::Reset
        | Outcome::Timeout
        | Outcome::StreamBroken
        | Outcome::Empty => Scope::Target,
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

pub struct HealthRegistry {
    pub policy: HealthPolicy,
    pub clock: Arc<dyn Clock>,
    targets: Vec<TargetHealth>,
    /// First target index of each deployment.
    target_base: Vec<usize>,
    credentials: Vec<CredentialHealth>,
    /// First credential index of each provider.
    credential_base: Vec<usize>,
    deployments: Vec<DeploymentHealth>,
    /// Poked on every breaker transition so the ranker re-ranks at once.
    pub transitions: Notify,
    pub degraded: DegradedMode,
}

impl std::fmt::Debug for HealthRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthRegistry")
            .field("targets", &self.targets.len())
            .finish_non_exhaustive()
    }
}

impl HealthRegistry {
    pub fn new(catalog: &Catalog, policy: HealthPolicy, clock: Arc<dyn Clock>) -> Self {
        let mut credential_base = Vec::with_capacity(catalog.providers.len());
        let mut n_creds = 0;
        for p in &catalog.providers {
            credential_base.push(n_creds);
            n_creds += p.credentials.len();
        }
        let mut target_base = Vec::with_capacity(catalog.deployments.len());
        let mut n_targets = 0;
        for d in &catalog.deployments {
            target_base.push(n_targets);
            n_targets += catalog.provider(d.provider).credentials.len();
        }
        Self {
            targets: (0..n_targets).map(|_| TargetHealth::new(&policy)).collect(),
            target_base,
            credentials: (0..n_creds).map(|_| CredentialHealth::default()).collect(),
            credential_base,
            deployments: (0..catalog.deployments.len())
                .map(|_| DeploymentHealth::new(&policy))
                .collect(),
            transitions: Notify::new(),
            degraded: DegradedMode::new(policy.degraded),
            policy,
            clock,
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn target(&self, t: TargetRef) -> Option<&TargetHealth> {
        let d = t.deployment?;
        self.targets
            .get(self.target_base.get(d.get())? + t.credential)
    }

    pub fn credential(&self, p: ProviderIdx, credential: usize) -> Option<&CredentialHealth> {
        self.credentials
            .get(self.credential_base.get(p.get())? + credential)
    }

    pub fn deployment(&self, d: DeploymentIdx) -> Option<&DeploymentHealth> {
        self.deployments.get(d.get())
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

    /// Claim the half-open probe slot of a target.
    pub fn try_claim_probe(&self, t: TargetRef) -> bool {
        self.target(t).is_some_and(TargetHealth::try_claim_probe)
    }

    /// An attempt starts: counts in-flight (released by the guard) and the request rate.
    pub fn begin(self: &Arc<Self>, t: TargetRef, probe: bool) -> InflightGuard {
        let now = self.now_ms();
        if let Some(th) = self.target(t) {
            th.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(d) = t.deployment.and_then(|d| self.deployment(d)) {
            d.requests.add(now);
        }
        InflightGuard {
            registry: Arc::clone(self),
            target: t,
            probe,
            settled: false,
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
                if let Some(th) = target {
                    transition = th.on_failure(policy, obs.probe, obs.retry_after, now);
                }
                if let Some(d) = t.deployment.and_then(|d| self.deployment(d)) {
                    transition = transition.or(d.on_failure(policy, now));
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
                if obs.probe {
                    if let Some(th) = target {
                        th.release_probe();
                    }
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
            self.transitions.notify_one();
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
            rate_limit_factor: 1.0,
            soonest_ms: None,
        };
        let (mut ok, mut fail) = (0u32, 0u32);
        let fade = clock::ms(RATE_LIMIT_FADE);
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
                Admission::HalfOpen => {}
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
                view.rate_limit_factor = view
                    .rate_limit_factor
                    .min(c.rate_limit_factor(now_ms, fade));
            }
        }
        view.success_rate = (f64::from(ok) + 1.0) / (f64::from(ok) + f64::from(fail) + 1.0);
        view
    }

    /// Requests sent to a deployment in the last minute (rate-limit headroom).
    pub fn requests_last_minute(&self, d: DeploymentIdx, now_ms: u64) -> u32 {
        self.deployment(d)
            .map_or(0, |h| h.requests.last_minute(now_ms))
    }

    /// Every target, for probes and display.
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
    pub rate_limit_factor: f64,
    /// When the soonest unavailable target frees up.
    pub soonest_ms: Option<u64>,
}

/// Counts an attempt in flight until dropped; settles a claimed probe slot if the attempt
/// ended without a verdict (a cancelled request must not hold the slot forever).
pub struct InflightGuard {
    registry: Arc<HealthRegistry>,
    target: TargetRef,
    probe: bool,
    settled: bool,
}

impl InflightGuard {
    pub fn target(&self) -> TargetRef {
        self.target
    }

    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Record the attempt's outcome (once) and end it.
    pub fn finish(mut self, mut obs: Observation) -> bool {
        obs.probe = self.probe;
        self.settled = true;
        self.registry.observe(self.target, &obs)
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Some(th) = self.registry.target(self.target) {
            th.in_flight.fetch_sub(1, Ordering::Relaxed);
            if self.probe && !self.settled {
                th.release_probe();
            }
        }
    }
}

impl std::fmt::Debug for InflightGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InflightGuard")
            .field("target", &self.target)
            .field("probe", &self.probe)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::clock::{Clock, ManualClock};
    use super::*;
    use crate::config::KeySource;

    pub(crate) fn registry(
        text: &str,
        policy: HealthPolicy,
    ) -> (Catalog, Arc<HealthRegistry>, Arc<ManualClock>) {
        let config = crate::config::parse(text).expect("valid");
        let resolve = |_: &str, p: u16| vec![std::net::SocketAddr::from(([127, 0, 0, 1], p))];
        let read = |s: &KeySource| match s {
            KeySource::Env(n) => Ok(Some(format!("k-{n}"))),
            _ => Ok(None),
        };
        let (catalog, _) = Catalog::build(&config, &resolve, &read).expect("catalog");
        let clock = Arc::new(ManualClock::new());
        let reg = Arc::new(HealthRegistry::new(&catalog, policy, clock.clone()));
        (catalog, reg, clock)
    }

    const TWO_KEYS: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }] }
models:
  m: { deployments: [{ provider: a, model: x }] }
  n: { deployments: [{ provider: a, model: y }] }
"#;

    fn obs(outcome: Outcome) -> Observation {
        Observation {
            outcome,
            ttfb: None,
            latency: None,
            output_tokens: None,
            retry_after: None,
            probe: false,
        }
    }

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
        assert!(reg.try_claim_probe(t(0, 0)));
        let guard = reg.begin(t(0, 0), true);
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
        // A probe that succeeds restores the target.
        assert!(reg.try_claim_probe(t(0, 0)));
        let guard = reg.begin(t(0, 0), true);
        assert!(guard.finish(obs(Outcome::Ok)));
        assert_eq!(
            reg.admission(t(0, 0), clock.now_ms()),
            Admission::Healthy { health: 500 }
        );
    }
}
