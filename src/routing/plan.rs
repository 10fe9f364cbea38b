//! A request's plan: the route's ranked candidates walked one target at a time, against live
//! health.
//!
//! A candidate is a deployment; a target is a deployment with one credential chosen. The walk
//! has three phases:
//! 1. **lead**: the candidate a per-request decision put first: a sticky session, a
//!    load-balancing pick (round robin, random, least in-flight, p2c, weighted draw, prefix
//!    affinity) among the healthy candidates of the best priority, or the cheapest for this
//!    request's estimated tokens;
//! 2. **healthy**: the rest in ranked order, closed breakers only. A recovering target (health
//!    below full after a restore) is admitted with probability = its health, so it earns its
//!    share back; otherwise it is deferred;
//! 3. **probe**: deferred candidates, then half-open targets, each only if it wins its single
//!    probe slot. Skipped in degraded mode (no exploration).
//!
//! Credentials are a separate, later choice (seed `000`): round-robin across a provider's
//! usable, non-cooling keys; after a credential-scoped failure (401/403/429) the same
//! deployment is tried with its next key before the walk moves on. A target is never tried
//! twice in one request. A candidate that cannot be called is skipped without a call and its
//! reason kept (and, for ejections, when it frees up: the `Retry-After` of a fail-fast 503).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::scoring::cost_micro;
use super::session::stable_hash;
use crate::catalog::{Catalog, Deployment, DeploymentIdx, ProviderIdx};
use crate::config::Strategy;
use crate::health::breaker::FULL_HEALTH;
use crate::health::{Admission, HealthRegistry, TargetRef, Unavailable};

/// Why a candidate was passed over without a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    ProviderDisabled,
    NoCredential,
    Unresolved,
    Excluded,
    Ejected,
    Benched,
    CredentialCooling,
}

const SKIP_REASONS: usize = 7;

/// One attempt's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Position of the deployment in the plan.
    pub position: usize,
    pub credential: usize,
    /// This attempt holds the target's half-open probe slot.
    pub probe: bool,
}

/// Where the plan should look next after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Another credential of the same deployment, then the next deployment.
    NextCredential,
    /// The next deployment.
    NextDeployment,
}

/// What the plan reads: the catalog, live health and the time.
#[derive(Clone, Copy)]
pub struct PlanEnv<'a> {
    pub catalog: &'a Catalog,
    pub health: &'a HealthRegistry,
    pub now_ms: u64,
    /// Degraded mode: no exploration (no load-balancing picks, no half-open probes).
    pub degraded: bool,
}

/// Per-request inputs of the lead decision.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestFacts {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Hash of the prompt prefix (`prefix_affinity`).
    pub prefix_hash: Option<u64>,
    /// The deployment a sticky session is bound to.
    pub session: Option<DeploymentIdx>,
    /// This request's turn of the route's round-robin counter.
    pub round_robin: usize,
    /// Seed of the per-request random draws.
    pub seed: u64,
}

#[derive(Debug, Clone)]
enum Candidates {
    Shared(Arc<[DeploymentIdx]>),
    Adhoc(Arc<Deployment>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Lead,
    Healthy,
    Probe,
    Done,
}

/// Per-request walk over a route's candidates.
#[derive(Debug, Clone)]
pub struct Plan {
    candidates: Candidates,
    strategy: Strategy,
    facts: RequestFacts,
    /// Providers the request allowed (`routing.providers`); `None` = all.
    allowed: Option<Vec<ProviderIdx>>,
    lead: Option<usize>,
    phase: Phase,
    cursor: usize,
    /// Position of the deployment of the last target returned.
    current: Option<usize>,
    tried: Vec<(usize, usize)>,
    deferred: Vec<usize>,
    first: Option<usize>,
    skipped: [u16; SKIP_REASONS],
    soonest_ms: Option<u64>,
    rng: u64,
}

impl Plan {
    pub fn new(candidates: Arc<[DeploymentIdx]>, strategy: Strategy, facts: RequestFacts) -> Self {
        Self::with(Candidates::Shared(candidates), strategy, facts)
    }

    pub fn adhoc(deployment: Arc<Deployment>, facts: RequestFacts) -> Self {
        Self::with(Candidates::Adhoc(deployment), Strategy::Priority, facts)
    }

    fn with(candidates: Candidates, strategy: Strategy, facts: RequestFacts) -> Self {
        Self {
            candidates,
            strategy,
            facts,
            allowed: None,
            lead: None,
            phase: Phase::Lead,
            cursor: 0,
            current: None,
            tried: Vec::new(),
            deferred: Vec::new(),
            first: None,
            skipped: [0; SKIP_REASONS],
            soonest_ms: None,
            rng: splitmix64(facts.seed | 1),
        }
    }

    /// Restrict the plan to these providers (the request's `routing.providers`).
    pub fn restrict_to(&mut self, providers: Vec<ProviderIdx>) {
        self.allowed = Some(providers);
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    pub fn facts(&self) -> &RequestFacts {
        &self.facts
    }

    pub fn len(&self) -> usize {
        match &self.candidates {
            Candidates::Shared(c) => c.len(),
            Candidates::Adhoc(_) => 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The deployment at a plan position.
    pub fn deployment<'a>(
        &'a self,
        catalog: &'a Catalog,
        position: usize,
    ) -> Option<&'a Deployment> {
        match &self.candidates {
            Candidates::Shared(c) => c.get(position).map(|d| catalog.deployment(*d)),
            Candidates::Adhoc(d) => (position == 0).then_some(&**d),
        }
    }

    /// The position of the first target the plan returned (the "selected" candidate).
    pub fn first_position(&self) -> Option<usize> {
        self.first
    }

    /// How many candidates were skipped for a reason.
    pub fn skipped(&self, reason: SkipReason) -> u16 {
        self.skipped[reason as usize]
    }

    /// When the soonest skipped (ejected, benched or cooling) candidate frees up.
    pub fn soonest_ms(&self) -> Option<u64> {
        self.soonest_ms
    }

    /// The next target to call, or `None` when the plan is exhausted.
    pub fn next(&mut self, env: &PlanEnv<'_>, advance: Advance) -> Option<Target> {
        if let (Some(pos), Advance::NextCredential) = (self.current, advance) {
            let probe_phase = self.phase == Phase::Probe;
            if let Some(t) = self.pick_credential(env, pos, probe_phase) {
                return Some(self.returned(t));
            }
        }
        loop {
            match self.phase {
                Phase::Lead => {
                    self.phase = Phase::Healthy;
                    self.lead = self.decide_lead(env);
                    if let Some(pos) = self.lead {
                        if let Some(t) = self.pick_credential(env, pos, false) {
                            return Some(self.returned(t));
                        }
                    }
                }
                Phase::Healthy => {
                    while self.cursor < self.len() {
                        let pos = self.cursor;
                        self.cursor += 1;
                        if Some(pos) == self.lead {
                            continue;
                        }
                        match self.gate(env, pos) {
                            Err(reason) => self.skip(reason),
                            Ok(()) => {
                                if let Some(t) = self.pick_credential(env, pos, false) {
                                    return Some(self.returned(t));
                                }
                                self.note_unavailable(env, pos);
                            }
                        }
                    }
                    self.phase = Phase::Probe;
                    self.cursor = 0;
                }
                Phase::Probe => {
                    while self.cursor < self.len() {
                        let pos = self.cursor;
                        self.cursor += 1;
                        if self.gate(env, pos).is_err() {
                            continue;
                        }
                        if let Some(t) = self.pick_credential(env, pos, true) {
                            return Some(self.returned(t));
                        }
                    }
                    self.phase = Phase::Done;
                }
                Phase::Done => return None,
            }
        }
    }

    fn returned(&mut self, t: Target) -> Target {
        self.current = Some(t.position);
        self.first.get_or_insert(t.position);
        self.tried.push((t.position, t.credential));
        t
    }

    fn skip(&mut self, reason: SkipReason) {
        self.skipped[reason as usize] = self.skipped[reason as usize].saturating_add(1);
    }

    fn note_soonest(&mut self, until: u64) {
        self.soonest_ms = Some(self.soonest_ms.map_or(until, |s| s.min(until)));
    }

    /// Deployment-level checks: allowed, provider enabled and resolved, model not benched.
    fn gate(&mut self, env: &PlanEnv<'_>, pos: usize) -> Result<(), SkipReason> {
        let Some(d) = self.deployment(env.catalog, pos) else {
            return Err(SkipReason::Excluded);
        };
        let (provider_idx, dep_idx, is_adhoc) = (d.provider, d.idx, d.model.is_none());
        let p = env.catalog.provider(provider_idx);
        if let Some(allowed) = &self.allowed {
            if !allowed.contains(&provider_idx) {
                return Err(SkipReason::Excluded);
            }
        }
        if !p.enabled {
            return Err(SkipReason::ProviderDisabled);
        }
        if p.addrs.is_empty() {
            return Err(SkipReason::Unresolved);
        }
        if !is_adhoc {
            if let Some(until) = env
                .health
                .deployment(dep_idx)
                .and_then(|h| h.benched_until(env.now_ms))
            {
                self.note_soonest(until);
                return Err(SkipReason::Benched);
            }
        }
        Ok(())
    }

    /// Record why no credential of a gated candidate could take the request now.
    fn note_unavailable(&mut self, env: &PlanEnv<'_>, pos: usize) {
        let Some(d) = self.deployment(env.catalog, pos) else {
            return;
        };
        let (provider_idx, dep) = (d.provider, d.model.map(|_| d.idx));
        let p = env.catalog.provider(provider_idx);
        if !p.credentials.iter().any(|c| c.usable) {
            self.skip(SkipReason::NoCredential);
            return;
        }
        let mut reason = None;
        for (ci, c) in p.credentials.iter().enumerate() {
            if !c.usable {
                continue;
            }
            let t = TargetRef {
                deployment: dep,
                provider: provider_idx,
                credential: ci,
            };
            match env.health.admission(t, env.now_ms) {
                Admission::No(Unavailable::Ejected(u)) => {
                    self.note_soonest(u);
                    reason = reason.or(Some(SkipReason::Ejected));
                }
                Admission::No(Unavailable::CredentialCooling(u)) => {
                    self.note_soonest(u);
                    reason = reason.or(Some(SkipReason::CredentialCooling));
                }
                Admission::No(Unavailable::Benched(u)) => {
                    self.note_soonest(u);
                    reason = reason.or(Some(SkipReason::Benched));
                }
                Admission::No(Unavailable::ProbeBusy) | Admission::HalfOpen => {
                    reason = reason.or(Some(SkipReason::Ejected));
                }
                Admission::Healthy { .. } => {}
            }
        }
        if let Some(r) = reason {
            self.skip(r);
        }
    }

    /// Choose an untried credential of the deployment at `pos`. In the healthy phases only
    /// closed breakers qualify (recovering ones by a draw); in the probe phase, deferred
    /// recovering targets and half-open targets whose probe slot this request wins.
    fn pick_credential(
        &mut self,
        env: &PlanEnv<'_>,
        pos: usize,
        probe_phase: bool,
    ) -> Option<Target> {
        let d = self.deployment(env.catalog, pos)?;
        let (provider_idx, dep) = (d.provider, d.model.map(|_| d.idx));
        let p = env.catalog.provider(provider_idx);
        let n = p.credentials.len();
        if n == 0 {
            return None;
        }
        let start = p.credential_cursor.fetch_add(1, Ordering::Relaxed);
        let deferred = self.deferred.contains(&pos);
        // A recovering credential found on the way, taken only if no full-health one is.
        let mut recovering: Option<(usize, u32)> = None;
        for k in 0..n {
            let ci = (start + k) % n;
            if !p.credentials[ci].usable || self.tried.contains(&(pos, ci)) {
                continue;
            }
            let t = TargetRef {
                deployment: dep,
                provider: provider_idx,
                credential: ci,
            };
            match env.health.admission(t, env.now_ms) {
                Admission::Healthy { health } => {
                    if probe_phase {
                        if deferred || env.degraded {
                            return Some(Target {
                                position: pos,
                                credential: ci,
                                probe: false,
                            });
                        }
                        continue;
                    }
                    if health >= FULL_HEALTH || env.degraded {
                        return Some(Target {
                            position: pos,
                            credential: ci,
                            probe: false,
                        });
                    }
                    if recovering.is_none_or(|(_, h)| health > h) {
                        recovering = Some((ci, health));
                    }
                }
                // Claiming the slot is the last condition: only a request that will use it
                // may take it.
                Admission::HalfOpen
                    if probe_phase && !env.degraded && env.health.try_claim_probe(t) =>
                {
                    return Some(Target {
                        position: pos,
                        credential: ci,
                        probe: true,
                    });
                }
                _ => {}
            }
        }
        if let Some((ci, health)) = recovering {
            // One draw per candidate: a restored deployment leads with probability = health.
            if self.draw_permille() < health {
                return Some(Target {
                    position: pos,
                    credential: ci,
                    probe: false,
                });
            }
            if !self.deferred.contains(&pos) {
                self.deferred.push(pos);
            }
        }
        None
    }

    fn draw_permille(&mut self) -> u32 {
        self.rng = splitmix64(self.rng);
        u32::try_from(self.rng % u64::from(FULL_HEALTH)).unwrap_or(0)
    }

    fn draw_f64(&mut self) -> f64 {
        self.rng = splitmix64(self.rng);
        #[allow(clippy::cast_precision_loss)]
        let v = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        v
    }

    /// Whether a candidate could take a request now (a closed breaker on a usable key).
    fn healthy_now(&mut self, env: &PlanEnv<'_>, pos: usize) -> bool {
        if self.gate(env, pos).is_err() {
            return false;
        }
        let Some(d) = self.deployment(env.catalog, pos) else {
            return false;
        };
        let (provider_idx, dep) = (d.provider, d.model.map(|_| d.idx));
        let p = env.catalog.provider(provider_idx);
        p.credentials.iter().enumerate().any(|(ci, c)| {
            c.usable
                && matches!(
                    env.health.admission(
                        TargetRef {
                            deployment: dep,
                            provider: provider_idx,
                            credential: ci
                        },
                        env.now_ms
                    ),
                    Admission::Healthy { .. }
                )
        })
    }

    /// In-flight count and TTFB EWMA of a deployment, across its credentials.
    fn load(env: &PlanEnv<'_>, d: &Deployment) -> (u32, f64) {
        let p = env.catalog.provider(d.provider);
        let (mut in_flight, mut ttfb) = (0u32, f64::INFINITY);
        for ci in 0..p.credentials.len() {
            let t = TargetRef {
                deployment: d.model.map(|_| d.idx),
                provider: d.provider,
                credential: ci,
            };
            if let Some(th) = env.health.target(t) {
                in_flight = in_flight.saturating_add(th.in_flight.load(Ordering::Relaxed));
                if let Some(v) = th.ttfb_ms.get() {
                    ttfb = ttfb.min(v);
                }
            }
        }
        (in_flight, ttfb)
    }

    /// The per-request first choice, if the strategy or a session makes one.
    fn decide_lead(&mut self, env: &PlanEnv<'_>) -> Option<usize> {
        if let Candidates::Adhoc(_) = self.candidates {
            return None;
        }
        if let Some(session) = self.facts.session {
            let pos = (0..self.len()).find(|&p| {
                self.deployment(env.catalog, p)
                    .is_some_and(|d| d.idx == session)
            });
            if let Some(pos) = pos {
                if self.healthy_now(env, pos) {
                    return Some(pos);
                }
            }
        }
        if env.degraded {
            return None;
        }
        if is_learned(self.strategy) {
            return self.explore(env);
        }
        let by_cost = matches!(
            self.strategy,
            Strategy::Cheapest | Strategy::PriorityCheapest
        );
        if !(self.strategy.is_load_balancing() || by_cost) {
            return None;
        }
        // Equivalent deployments: the healthy ones of the best priority. The ranked order is
        // priority-first for these strategies, so the scan stops at the first worse priority.
        // The weighted draw and plain `cheapest` span every healthy candidate.
        let whole = matches!(self.strategy, Strategy::Weighted | Strategy::Cheapest);
        let mut tier: Vec<usize> = Vec::new();
        let mut best: Option<i32> = None;
        for pos in 0..self.len() {
            let Some(priority) = self.deployment(env.catalog, pos).map(|d| d.priority) else {
                continue;
            };
            if !whole && best.is_some_and(|b| priority > b) {
                break;
            }
            if self.healthy_now(env, pos) {
                best.get_or_insert(priority);
                tier.push(pos);
            }
        }
        if tier.is_empty() {
            return None;
        }
        // Draw before borrowing the candidates.
        self.rng = splitmix64(self.rng);
        let r = self.rng;
        let unit = self.draw_f64();
        let dep = |p: usize| self.deployment(env.catalog, p);
        match self.strategy {
            Strategy::Cheapest | Strategy::PriorityCheapest => {
                let (i, o) = (self.facts.input_tokens, self.facts.output_tokens);
                tier.iter()
                    .copied()
                    .min_by_key(|&p| dep(p).map_or(u64::MAX, |d| cost_micro(d, i, o)))
            }
            Strategy::RoundRobin => tier.get(self.facts.round_robin % tier.len()).copied(),
            Strategy::Random => tier
                .get(usize::try_from(r % tier.len() as u64).unwrap_or(0))
                .copied(),
            Strategy::LeastInflight => tier
                .iter()
                .copied()
                .min_by_key(|&p| dep(p).map_or(u32::MAX, |d| Self::load(env, d).0)),
            Strategy::P2cEwma => {
                if tier.len() == 1 {
                    return tier.first().copied();
                }
                let n = tier.len() as u64;
                let a = usize::try_from(r % n).unwrap_or(0);
                let b = usize::try_from((r >> 32) % (n - 1)).unwrap_or(0);
                let b = if b >= a { b + 1 } else { b };
                let cost = |p: usize| {
                    dep(p).map_or(f64::INFINITY, |d| {
                        let (inflight, ttfb) = Self::load(env, d);
                        // Unknown latency: assume a second, so unmeasured targets get tried.
                        let ttfb = if ttfb.is_finite() { ttfb } else { 1000.0 };
                        ttfb * f64::from(inflight + 1)
                    })
                };
                let (pa, pb) = (tier[a], tier[b]);
                Some(if cost(pb) < cost(pa) { pb } else { pa })
            }
            Strategy::Weighted => {
                let weights: Vec<(usize, f64)> = tier
                    .iter()
                    .filter_map(|&p| {
                        dep(p)
                            .and_then(|d| d.weight)
                            .filter(|w| *w > 0.0)
                            .map(|w| (p, w))
                    })
                    .collect();
                let total: f64 = weights.iter().map(|(_, w)| w).sum();
                if total <= 0.0 {
                    return None;
                }
                let mut x = unit * total;
                for (p, w) in &weights {
                    if x < *w {
                        return Some(*p);
                    }
                    x -= w;
                }
                weights.last().map(|(p, _)| *p)
            }
            Strategy::PrefixAffinity => {
                let key = self.facts.prefix_hash?;
                tier.iter().copied().max_by_key(|&p| {
                    dep(p).map_or(0, |d| {
                        splitmix64(key ^ u64::from(d.idx.0).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    })
                })
            }
            _ => None,
        }
    }
}

/// Strategies that order by what live traffic measured: they need exploration, or a
/// candidate that was never tried would never be measured.
fn is_learned(s: Strategy) -> bool {
    matches!(
        s,
        Strategy::Fastest
            | Strategy::Reliable
            | Strategy::Balanced
            | Strategy::Smartest
            | Strategy::Custom
    )
}

/// How often a learned strategy sends a request to a healthy candidate it has no latency
/// sample for, and how often to any other healthy candidate.
const EXPLORE_UNMEASURED: f64 = 0.25;
const EXPLORE_MEASURED: f64 = 0.05;

impl Plan {
    /// Exploration for learned strategies: now and then, lead with a healthy candidate other
    /// than the top one (an unmeasured one preferably) so its measurements stay current.
    fn explore(&mut self, env: &PlanEnv<'_>) -> Option<usize> {
        let roll = self.draw_f64();
        if roll >= EXPLORE_UNMEASURED {
            return None;
        }
        let healthy: Vec<usize> = (0..self.len())
            .filter(|&p| self.healthy_now(env, p))
            .collect();
        if healthy.len() < 2 {
            return None;
        }
        let unmeasured: Vec<usize> = healthy
            .iter()
            .copied()
            .filter(|&p| {
                self.deployment(env.catalog, p)
                    .is_some_and(|d| Self::load(env, d).1.is_infinite())
            })
            .collect();
        self.rng = splitmix64(self.rng);
        if !unmeasured.is_empty() {
            return unmeasured
                .get(usize::try_from(self.rng % unmeasured.len() as u64).unwrap_or(0))
                .copied();
        }
        if roll >= EXPLORE_MEASURED {
            return None;
        }
        // Any healthy candidate but the current leader.
        let others = &healthy[1..];
        others
            .get(usize::try_from(self.rng % others.len() as u64).unwrap_or(0))
            .copied()
    }
}

/// A bijective 64-bit mix, used as a tiny PRNG step and for rendezvous hashing.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The prompt-prefix hash for `prefix_affinity`.
pub fn prefix_hash(prompt: &[u8], prefix_bytes: usize) -> u64 {
    stable_hash(&prompt[..prompt.len().min(prefix_bytes)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HealthPolicy, KeySource};
    use crate::health::clock::{Clock, ManualClock};
    use crate::health::{Observation, TargetRef};
    use crate::metrics::Outcome;
    use std::collections::HashMap;
    use std::time::Duration;

    struct Kit {
        catalog: Catalog,
        health: Arc<HealthRegistry>,
        clock: Arc<ManualClock>,
    }

    impl Kit {
        fn new(text: &str) -> Self {
            let config = crate::config::parse(text).expect("valid config");
            let resolve = |_: &str, p: u16| vec![std::net::SocketAddr::from(([127, 0, 0, 1], p))];
            let read = |s: &KeySource| match s {
                KeySource::Env(n) => Ok(Some(format!("k-{n}"))),
                _ => Ok(None),
            };
            let (catalog, _) = Catalog::build(&config, &resolve, &read).expect("catalog");
            let clock = Arc::new(ManualClock::new());
            let health = Arc::new(HealthRegistry::new(
                &catalog,
                HealthPolicy {
                    failure_threshold: 1,
                    ..config.health
                },
                clock.clone(),
            ));
            Self {
                catalog,
                health,
                clock,
            }
        }

        fn env(&self, degraded: bool) -> PlanEnv<'_> {
            PlanEnv {
                catalog: &self.catalog,
                health: &self.health,
                now_ms: self.clock.now_ms(),
                degraded,
            }
        }

        fn all(&self) -> Arc<[DeploymentIdx]> {
            self.catalog.deployments.iter().map(|d| d.idx).collect()
        }

        fn plan(&self, strategy: Strategy, facts: RequestFacts) -> Plan {
            Plan::new(self.all(), strategy, facts)
        }

        fn name(&self, p: &Plan, t: Target) -> String {
            p.deployment(&self.catalog, t.position)
                .map(|d| d.upstream_model.to_string())
                .unwrap_or_default()
        }

        /// The upstream model of the first target for each of `n` requests.
        fn firsts(
            &self,
            n: usize,
            strategy: Strategy,
            facts: impl Fn(usize) -> RequestFacts,
        ) -> HashMap<String, usize> {
            let mut counts = HashMap::new();
            for i in 0..n {
                let mut p = self.plan(strategy, facts(i));
                let t = p
                    .next(&self.env(false), Advance::NextDeployment)
                    .expect("a target");
                *counts.entry(self.name(&p, t)).or_insert(0) += 1;
            }
            counts
        }

        /// Every target of a plan walked with `NextDeployment`: (upstream model, probe).
        fn walk(&self, p: &mut Plan, degraded: bool) -> Vec<(String, bool)> {
            let env = self.env(degraded);
            let mut out = Vec::new();
            while let Some(t) = p.next(&env, Advance::NextDeployment) {
                out.push((self.name(p, t), t.probe));
            }
            out
        }

        fn names(&self, p: &mut Plan, degraded: bool) -> Vec<String> {
            self.walk(p, degraded).into_iter().map(|(n, _)| n).collect()
        }

        fn fail(&self, d: u32, c: usize) {
            let p = self.catalog.deployment(DeploymentIdx(d)).provider;
            self.health.observe(
                TargetRef {
                    deployment: Some(DeploymentIdx(d)),
                    provider: p,
                    credential: c,
                },
                &Observation {
                    outcome: Outcome::ServerError,
                    ttfb: None,
                    latency: None,
                    output_tokens: None,
                    retry_after: None,
                    probe: false,
                },
            );
        }
    }

    fn seeded(i: usize) -> RequestFacts {
        RequestFacts {
            seed: i as u64 * 7919 + 1,
            round_robin: i,
            ..RequestFacts::default()
        }
    }

    const POOL: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }] }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
  c: { kind: openai, base_url: "http://127.0.0.1:3/v1" }
models:
  m:
    deployments:
      - { provider: a, model: x, weight: 7, price: { input_per_mtok: 1.0, output_per_mtok: 10.0 } }
      - { provider: b, model: y, weight: 3, price: { input_per_mtok: 3.0, output_per_mtok: 2.0 } }
      - { provider: c, model: z, priority: 20 }
"#;

    #[test]
    fn walks_candidates_then_credentials() {
        let k = Kit::new(POOL);
        let mut p = k.plan(Strategy::Priority, RequestFacts::default());
        let first = p
            .next(&k.env(false), Advance::NextDeployment)
            .expect("first");
        assert_eq!(k.name(&p, first), "x");
        // A credential failure on a two-key provider tries its other key first.
        let second = p
            .next(&k.env(false), Advance::NextCredential)
            .expect("second");
        assert_eq!(
            (second.position, k.name(&p, second)),
            (first.position, "x".into())
        );
        assert_ne!(second.credential, first.credential);
        // Both keys used: the walk moves on.
        let third = p
            .next(&k.env(false), Advance::NextCredential)
            .expect("third");
        assert_eq!(k.name(&p, third), "y");
        let fourth = p
            .next(&k.env(false), Advance::NextDeployment)
            .expect("fourth");
        assert_eq!(k.name(&p, fourth), "z");
        assert_eq!(p.next(&k.env(false), Advance::NextDeployment), None);
        assert_eq!(p.first_position(), Some(first.position));
    }

    #[test]
    fn ejected_candidates_are_skipped_then_probed_last_one_at_a_time() {
        let k = Kit::new(POOL);
        k.fail(1, 0); // y ejected (threshold 1)
        let mut p = k.plan(Strategy::Priority, RequestFacts::default());
        let names = k.names(&mut p, false);
        assert_eq!(names, ["x", "z"], "inside its cooldown y is not called");
        assert_eq!(p.skipped(SkipReason::Ejected), 1);
        // After the cooldown, y is half-open: reached after the healthy ones, once.
        k.clock.advance(Duration::from_secs(31));
        let mut p1 = k.plan(Strategy::Priority, RequestFacts::default());
        let order = k.walk(&mut p1, false);
        assert_eq!(order.last(), Some(&("y".to_string(), true)), "{order:?}");
        // A concurrent request cannot take the same probe.
        let mut p2 = k.plan(Strategy::Priority, RequestFacts::default());
        let order2 = k.names(&mut p2, false);
        assert!(!order2.contains(&"y".to_string()), "{order2:?}");
    }

    #[test]
    fn every_candidate_ejected_fails_fast_with_the_soonest_end() {
        let k = Kit::new(POOL);
        k.fail(0, 0);
        k.fail(0, 1);
        k.clock.advance(Duration::from_secs(5));
        k.fail(1, 0);
        k.fail(2, 0);
        let mut p = k.plan(Strategy::Priority, RequestFacts::default());
        assert_eq!(p.next(&k.env(false), Advance::NextDeployment), None);
        let soonest = p.soonest_ms().expect("soonest");
        assert_eq!(
            soonest - k.clock.now_ms(),
            25_000,
            "x frees first, 25 s from now"
        );
        assert!(p.skipped(SkipReason::Ejected) >= 3);
    }

    #[test]
    fn weighted_splits_seven_to_three() {
        let k = Kit::new(POOL);
        let counts = k.firsts(2000, Strategy::Weighted, seeded);
        let x = counts.get("x").copied().unwrap_or(0);
        let y = counts.get("y").copied().unwrap_or(0);
        assert_eq!(x + y, 2000, "the unweighted z never leads: {counts:?}");
        let share = x as f64 / 2000.0;
        assert!((share - 0.7).abs() < 0.04, "x share {share}");
        // The failure order continues through the rest, unweighted z included.
        let mut p = k.plan(Strategy::Weighted, seeded(1));
        let all = k.names(&mut p, false);
        assert!(all.contains(&"z".to_string()), "{all:?}");
    }

    #[test]
    fn round_robin_and_random_spread_across_the_best_tier() {
        let k = Kit::new(POOL);
        let rr = k.firsts(100, Strategy::RoundRobin, seeded);
        assert_eq!(
            (rr.get("x"), rr.get("y"), rr.get("z")),
            (Some(&50), Some(&50), None),
            "{rr:?}"
        );
        let random = k.firsts(2000, Strategy::Random, seeded);
        let x = random.get("x").copied().unwrap_or(0);
        assert!((900..=1100).contains(&x), "{random:?}");
    }

    #[test]
    fn least_inflight_and_p2c_prefer_the_less_loaded() {
        let k = Kit::new(POOL);
        let busy = TargetRef {
            deployment: Some(DeploymentIdx(0)),
            provider: k.catalog.deployment(DeploymentIdx(0)).provider,
            credential: 0,
        };
        let _guards: Vec<_> = (0..3).map(|_| k.health.begin(busy, false)).collect();
        let least = k.firsts(50, Strategy::LeastInflight, seeded);
        assert_eq!(least.get("y"), Some(&50), "{least:?}");
        // p2c over two candidates always compares both: the idle one wins.
        let p2c = k.firsts(50, Strategy::P2cEwma, seeded);
        assert_eq!(p2c.get("y"), Some(&50), "{p2c:?}");
    }

    #[test]
    fn prefix_affinity_is_stable_per_prompt_and_spreads_across_prompts() {
        let k = Kit::new(POOL);
        let facts = |i: usize| RequestFacts {
            prefix_hash: Some(prefix_hash(format!("prompt {}", i % 20).as_bytes(), 1024)),
            ..seeded(i)
        };
        let mut seen: HashMap<usize, String> = HashMap::new();
        for i in 0..200 {
            let mut p = k.plan(Strategy::PrefixAffinity, facts(i));
            let t = p
                .next(&k.env(false), Advance::NextDeployment)
                .expect("target");
            let name = k.name(&p, t);
            if let Some(prev) = seen.insert(i % 20, name.clone()) {
                assert_eq!(prev, name, "the same prefix moved");
            }
        }
        let distinct: std::collections::HashSet<_> = seen.values().collect();
        assert_eq!(
            distinct.len(),
            2,
            "20 prompts spread over both equivalent deployments"
        );
    }

    #[test]
    fn sticky_sessions_lead_while_healthy() {
        let k = Kit::new(POOL);
        let facts = RequestFacts {
            session: Some(DeploymentIdx(2)),
            ..RequestFacts::default()
        };
        let mut p = k.plan(Strategy::Priority, facts);
        let t = p
            .next(&k.env(false), Advance::NextDeployment)
            .expect("target");
        assert_eq!(k.name(&p, t), "z");
        k.fail(2, 0);
        let mut p = k.plan(Strategy::Priority, facts);
        let t = p
            .next(&k.env(false), Advance::NextDeployment)
            .expect("target");
        assert_eq!(
            k.name(&p, t),
            "x",
            "an ejected session target does not lead"
        );
    }

    #[test]
    fn cheapest_uses_this_requests_tokens() {
        let k = Kit::new(POOL);
        // Input-heavy: x is cheaper (1.0 in); output-heavy: y is cheaper (2.0 out). z is free
        // but unpriced deployments only count as free when priced equally... z is priority 20
        // and plain `cheapest` spans every candidate, so take it out of the pool.
        let cost_pool: Arc<[DeploymentIdx]> = Arc::from(vec![DeploymentIdx(0), DeploymentIdx(1)]);
        let first = |i, o| {
            let mut p = Plan::new(
                cost_pool.clone(),
                Strategy::Cheapest,
                RequestFacts {
                    input_tokens: i,
                    output_tokens: o,
                    ..RequestFacts::default()
                },
            );
            let t = p
                .next(&k.env(false), Advance::NextDeployment)
                .expect("target");
            k.name(&p, t)
        };
        assert_eq!(first(10_000, 10), "x");
        assert_eq!(first(10, 10_000), "y");
    }

    #[test]
    fn degraded_mode_turns_exploration_off() {
        let k = Kit::new(POOL);
        let counts: HashMap<String, usize> = (0..100)
            .map(|i| {
                let mut p = k.plan(Strategy::Random, seeded(i));
                let t = p
                    .next(&k.env(true), Advance::NextDeployment)
                    .expect("target");
                k.name(&p, t)
            })
            .fold(HashMap::new(), |mut m, n| {
                *m.entry(n).or_insert(0) += 1;
                m
            });
        assert_eq!(
            counts.get("x"),
            Some(&100),
            "the scored order only: {counts:?}"
        );
        // No half-open probes either.
        k.fail(2, 0);
        k.clock.advance(Duration::from_secs(31));
        let mut p = k.plan(Strategy::Priority, RequestFacts::default());
        let names = k.names(&mut p, true);
        assert!(!names.contains(&"z".to_string()), "{names:?}");
    }

    #[test]
    fn a_restored_target_earns_its_share_back() {
        let k = Kit::new(POOL);
        // Restore x at 0.5 health: it leads about half the time, the rest go to y first.
        k.fail(0, 0);
        k.fail(0, 1);
        let th = |c| {
            k.health
                .target(TargetRef {
                    deployment: Some(DeploymentIdx(0)),
                    provider: k.catalog.deployment(DeploymentIdx(0)).provider,
                    credential: c,
                })
                .expect("target")
        };
        th(0).restore(&k.health.policy);
        th(1).restore(&k.health.policy);
        let counts = k.firsts(2000, Strategy::Priority, seeded);
        let x = counts.get("x").copied().unwrap_or(0) as f64 / 2000.0;
        assert!((x - 0.5).abs() < 0.05, "x leads {x} of the time");
    }
}
