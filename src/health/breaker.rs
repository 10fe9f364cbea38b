//! The breaker state machines: per target (deployment × credential), per credential, and the
//! benching window per deployment. Plain atomics; every transition takes `now` in monotonic
//! milliseconds so tests drive them with a manual clock.
//!
//! Vocabulary (one meaning throughout signalbox):
//! - **closed**: admitting traffic (`ejected_until == 0`).
//! - **open** (ejected): refusing traffic until `ejected_until`.
//! - **half-open**: the ejection window has passed but no success has been seen since: exactly
//!   one request (the probe) may be in flight; its success closes the breaker at
//!   `restore_health`, its failure re-opens it with an escalated window.
//!
//! Escalation: the n-th ejection since the last success lasts `cooldown × n`, capped by
//! `max_ejection`. A provider's own `Retry-After` replaces the window, unescalated.
//! `health` (permille) is how much of its share a target takes: a restored target starts at
//! `restore_health` and earns the rest back one success at a time.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::clock::ms;
use super::stats::{Ewma, Quantiles, SuccessWindow};
use crate::config::HealthPolicy;

/// Full health, in permille.
pub const FULL_HEALTH: u32 = 1000;
/// Health regained per success while recovering.
const HEALTH_STEP: u32 = 100;
/// The fewest attempts in the window before the success-rate floor may eject.
const MIN_SAMPLES_FOR_RATE: u32 = 10;

/// A breaker transition worth re-ranking for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Ejected { until_ms: u64 },
    Restored,
}

/// Where a target stands for selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open { until_ms: u64 },
    HalfOpen,
}

/// Health of one target (deployment × credential).
#[derive(Debug)]
pub struct TargetHealth {
    /// Consecutive failures in halves: a failure adds two, a 429 one (it counts half).
    consecutive_halves: AtomicU32,
    /// Ejections since the last success (the escalation factor).
    ejections: AtomicU32,
    ejected_until: AtomicU64,
    probe_in_flight: AtomicBool,
    health: AtomicU32,
    pub in_flight: AtomicU32,
    pub latency_ms: Ewma,
    pub ttfb_ms: Ewma,
    /// Recent TTFBs, for a hedge's `p<NN>`.
    pub ttfb_quantiles: Quantiles,
    /// Output tokens per second while streaming/generating.
    pub throughput: Ewma,
    pub window: SuccessWindow,
    /// Lifetime counters, for metrics.
    pub ejections_total: AtomicU64,
    pub last_ejection_reason: AtomicU32,
}

const EWMA_ALPHA: f64 = 0.3;

impl TargetHealth {
    pub fn new(policy: &HealthPolicy) -> Self {
        Self {
            consecutive_halves: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            probe_in_flight: AtomicBool::new(false),
            health: AtomicU32::new(FULL_HEALTH),
            in_flight: AtomicU32::new(0),
            latency_ms: Ewma::new(EWMA_ALPHA),
            ttfb_ms: Ewma::new(EWMA_ALPHA),
            ttfb_quantiles: Quantiles::default(),
            throughput: Ewma::new(EWMA_ALPHA),
            window: SuccessWindow::new(ms(policy.success_window)),
            ejections_total: AtomicU64::new(0),
            last_ejection_reason: AtomicU32::new(0),
        }
    }

    pub fn state(&self, now_ms: u64) -> BreakerState {
        match self.ejected_until.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            until if now_ms < until => BreakerState::Open { until_ms: until },
            _ => BreakerState::HalfOpen,
        }
    }

    pub fn health(&self) -> u32 {
        self.health.load(Ordering::Relaxed)
    }

    /// Until when the breaker is open (monotonic ms; 0: closed). For the shared state.
    pub fn ejected_until_ms(&self) -> u64 {
        self.ejected_until.load(Ordering::Acquire)
    }

    /// Another replica ejected this target until `until_ms` (this replica's monotonic ms):
    /// open the breaker until then unless it already is for longer. Its half-open probe
    /// afterwards is this replica's own.
    pub fn adopt_ejection(&self, until_ms: u64) {
        self.ejected_until.fetch_max(until_ms, Ordering::AcqRel);
    }

    /// Consecutive failures (a 429 counts half; rounded down).
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_halves.load(Ordering::Relaxed) / 2
    }

    pub fn ejections(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }

    pub fn probe_in_flight(&self) -> bool {
        self.probe_in_flight.load(Ordering::Acquire)
    }

    /// Claim the single half-open probe slot. Exactly one caller wins until it is released.
    pub fn try_claim_probe(&self) -> bool {
        self.probe_in_flight
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Give the probe slot back without a verdict (the client cancelled).
    pub fn release_probe(&self) {
        self.probe_in_flight.store(false, Ordering::Release);
    }

    /// A success. Closes a half-open breaker at `restore_health`; clears the escalation.
    pub fn on_success(
        &self,
        policy: &HealthPolicy,
        was_probe: bool,
        now_ms: u64,
    ) -> Option<Transition> {
        self.window.record(true, now_ms);
        self.consecutive_halves.store(0, Ordering::Relaxed);
        self.ejections.store(0, Ordering::Relaxed);
        let until = self.ejected_until.load(Ordering::Acquire);
        if until != 0 && (was_probe || now_ms >= until) {
            self.restore(policy);
            if was_probe {
                self.release_probe();
            }
            return Some(Transition::Restored);
        }
        if was_probe {
            self.release_probe();
        }
        let h = self.health.load(Ordering::Relaxed);
        if h < FULL_HEALTH {
            self.health
                .store((h + HEALTH_STEP).min(FULL_HEALTH), Ordering::Relaxed);
        }
        None
    }

    /// Re-admit at `restore_health` (a probe answered, or a half-open request succeeded). A
    /// probe slot still marked as taken is cleared: the target is closed, not half-open.
    pub fn restore(&self, policy: &HealthPolicy) {
        self.health
            .store(restored_permille(policy), Ordering::Relaxed);
        self.consecutive_halves.store(0, Ordering::Relaxed);
        self.ejected_until.store(0, Ordering::Release);
        self.release_probe();
    }

    /// A failure counted against the target. `threshold` is the model's `failure_threshold`
    /// (0: the breaker is off and never ejects). `retry_after` is the provider's own wait,
    /// already clamped; it ejects at once for exactly that long when the policy respects it.
    pub fn on_failure(
        &self,
        policy: &HealthPolicy,
        threshold: u32,
        was_probe: bool,
        retry_after: Option<Duration>,
        now_ms: u64,
    ) -> Option<Transition> {
        self.window.record(false, now_ms);
        let halves = self.consecutive_halves.fetch_add(2, Ordering::Relaxed) + 2;
        if threshold == 0 {
            // Breaker off. A target ejected before the breaker was switched off comes back.
            if was_probe {
                self.release_probe();
            }
            if self.ejected_until.load(Ordering::Acquire) != 0 {
                self.restore(policy);
                return Some(Transition::Restored);
            }
            return None;
        }
        if was_probe {
            // The half-open probe failed: re-open with escalation.
            let t = self.eject(policy, None, now_ms, true);
            self.release_probe();
            return t;
        }
        if let (Some(wait), true) = (retry_after, policy.respect_retry_after) {
            return self.eject(policy, Some(wait), now_ms, false);
        }
        if halves >= threshold.saturating_mul(2) {
            return self.eject(policy, None, now_ms, false);
        }
        if policy.health_threshold > 0.0 {
            let (ok, fail) = self.window.counts(now_ms);
            let n = ok + fail;
            if n >= MIN_SAMPLES_FOR_RATE && f64::from(ok) / f64::from(n) < policy.health_threshold {
                return self.eject(policy, None, now_ms, false);
            }
        }
        None
    }

    /// A 429 on this target's credential (which cools the credential itself): half a failure
    /// toward `threshold`. A probe's 429 gives the slot back; it neither restores nor re-ejects.
    pub fn on_rate_limited(
        &self,
        policy: &HealthPolicy,
        threshold: u32,
        was_probe: bool,
        now_ms: u64,
    ) -> Option<Transition> {
        if was_probe {
            self.release_probe();
            return None;
        }
        if threshold == 0 {
            return None;
        }
        let halves = self.consecutive_halves.fetch_add(1, Ordering::Relaxed) + 1;
        if halves >= threshold.saturating_mul(2) {
            return self.eject(policy, None, now_ms, false);
        }
        None
    }

    fn eject(
        &self,
        policy: &HealthPolicy,
        retry_after: Option<Duration>,
        now_ms: u64,
        reopen: bool,
    ) -> Option<Transition> {
        let current = self.ejected_until.load(Ordering::Acquire);
        if !reopen && current != 0 && now_ms < current {
            // Already open: a concurrent failure of the same request wave.
            return None;
        }
        let window = match retry_after {
            Some(wait) => ms(wait),
            None => {
                let n = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
                escalated_window(policy, n)
            }
        };
        let until = now_ms.saturating_add(window.max(1));
        if self
            .ejected_until
            .compare_exchange(current, until, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        self.consecutive_halves.store(0, Ordering::Relaxed);
        self.ejections_total.fetch_add(1, Ordering::Relaxed);
        Some(Transition::Ejected { until_ms: until })
    }

    pub fn reset_stats(&self) {
        self.latency_ms.reset();
        self.ttfb_ms.reset();
        self.throughput.reset();
        self.window.reset();
    }
}

/// `restore_health` in permille: the share a re-admitted target starts with.
pub fn restored_permille(policy: &HealthPolicy) -> u32 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let restored = (policy.restore_health * f64::from(FULL_HEALTH)).round() as u32;
    restored.clamp(1, FULL_HEALTH)
}

/// `cooldown × n`, capped by `max_ejection`.
pub fn escalated_window(policy: &HealthPolicy, n: u32) -> u64 {
    let w = ms(policy.cooldown).saturating_mul(u64::from(n.max(1)));
    match policy.max_ejection {
        Some(cap) => w.min(ms(cap)),
        None => w,
    }
}

/// Health of one credential (a provider's key), shared by every deployment that uses it.
#[derive(Debug, Default)]
pub struct CredentialHealth {
    cooling_until: AtomicU64,
    ejections: AtomicU32,
    /// When the last 429 arrived (the rate-limit factor fades from it).
    pub last_rate_limited: AtomicU64,
    /// Whether the current cooldown comes from a rejection (401/402/403) rather than a 429.
    rejected: AtomicBool,
    pub ejections_total: AtomicU64,
    /// What the provider last said is left of this key's windows (`least_remaining_quota`).
    quota: QuotaReading,
}

/// A credential's last remaining-quota reading: requests and tokens left (`u64::MAX`: not
/// reported) and until when it holds (monotonic ms; 0: never read). Written by the answers
/// that carry one, read by the credential choice; three relaxed words, so a reader may see
/// one answer's requests beside another's tokens — both recent, which is all the choice
/// needs.
#[derive(Debug, Default)]
struct QuotaReading {
    requests: AtomicU64,
    tokens: AtomicU64,
    until_ms: AtomicU64,
}

impl CredentialHealth {
    /// `Some(until)` while the credential must not be used.
    pub fn cooling_until(&self, now_ms: u64) -> Option<u64> {
        let until = self.cooling_until.load(Ordering::Acquire);
        (until != 0 && now_ms < until).then_some(until)
    }

    /// Until when the key rests (monotonic ms; 0 or past: usable). For the shared state.
    pub fn cooling_until_ms(&self) -> u64 {
        self.cooling_until.load(Ordering::Acquire)
    }

    pub fn is_rejected(&self) -> bool {
        self.rejected.load(Ordering::Relaxed)
    }

    /// 401/402/403: the key was refused. Ejected with escalation.
    pub fn on_rejected(&self, policy: &HealthPolicy, now_ms: u64) -> Transition {
        let n = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let until = now_ms.saturating_add(escalated_window(policy, n));
        self.cooling_until.store(until, Ordering::Release);
        self.rejected.store(true, Ordering::Relaxed);
        self.ejections_total.fetch_add(1, Ordering::Relaxed);
        Transition::Ejected { until_ms: until }
    }

    /// 429: the key is rate limited. Cooled for the provider's `Retry-After` (when respected)
    /// or one cooldown.
    pub fn on_rate_limited(
        &self,
        policy: &HealthPolicy,
        retry_after: Option<Duration>,
        now_ms: u64,
    ) -> Transition {
        let window = match (retry_after, policy.respect_retry_after) {
            (Some(wait), true) => ms(wait).max(1),
            _ => ms(policy.cooldown),
        };
        let until = now_ms.saturating_add(window);
        self.cooling_until.store(until, Ordering::Release);
        self.rejected.store(false, Ordering::Relaxed);
        self.last_rate_limited.store(now_ms, Ordering::Relaxed);
        self.ejections_total.fetch_add(1, Ordering::Relaxed);
        Transition::Ejected { until_ms: until }
    }

    /// The provider said (its rate-limit headers) that a window of this key is exhausted until
    /// `until_ms`: rest it until then, without counting a failure or an ejection.
    pub fn on_exhausted(&self, until_ms: u64) {
        self.cooling_until.fetch_max(until_ms, Ordering::AcqRel);
    }

    /// A success with this key clears its escalation.
    pub fn on_success(&self) {
        self.ejections.store(0, Ordering::Relaxed);
        if self.rejected.load(Ordering::Relaxed) {
            self.rejected.store(false, Ordering::Relaxed);
        }
    }

    /// A probe with this key answered: usable again.
    pub fn readmit(&self) {
        self.cooling_until.store(0, Ordering::Release);
        self.rejected.store(false, Ordering::Relaxed);
    }

    /// Note what the provider says is left of this key's windows at `now_ms`.
    pub fn note_quota(&self, r: &crate::limits::provider::Remaining, now_ms: u64) {
        let q = &self.quota;
        q.requests
            .store(r.requests.unwrap_or(u64::MAX), Ordering::Relaxed);
        q.tokens
            .store(r.tokens.unwrap_or(u64::MAX), Ordering::Relaxed);
        let holds = u64::try_from(r.holds_for.as_millis()).unwrap_or(u64::MAX);
        q.until_ms
            .store(now_ms.saturating_add(holds).max(1), Ordering::Relaxed);
    }

    /// What is left of this key's windows as last read — `(requests, tokens)`, `u64::MAX` for
    /// a window not reported — or `(MAX, MAX)`, a full key, when there is no reading or it
    /// has expired (its window has reset since).
    pub fn quota_left(&self, now_ms: u64) -> (u64, u64) {
        let q = &self.quota;
        if now_ms >= q.until_ms.load(Ordering::Relaxed) {
            return (u64::MAX, u64::MAX);
        }
        (
            q.requests.load(Ordering::Relaxed),
            q.tokens.load(Ordering::Relaxed),
        )
    }

    /// When the last 429 with this key came (monotonic ms), if one has.
    pub fn rate_limited_at(&self) -> Option<u64> {
        let at = self.last_rate_limited.load(Ordering::Relaxed);
        (at != 0).then_some(at)
    }
}

/// The most `health.bench_after` can be (validation refuses more): the ring's size, fixed so
/// that a reload changing `bench_after` reads the same ring with the new count.
pub const BENCH_RING: usize = crate::config::types::BENCH_AFTER_CEILING as usize;

/// Per deployment: the benching window across credentials.
#[derive(Debug)]
pub struct DeploymentHealth {
    /// Timestamps of the last [`BENCH_RING`] model-scoped failures (a ring; 0 = empty).
    failures: Box<[AtomicU64]>,
    next: AtomicUsize,
    benched_until: AtomicU64,
    pub benchings_total: AtomicU64,
}

impl DeploymentHealth {
    pub fn new(_policy: &HealthPolicy) -> Self {
        Self {
            failures: (0..BENCH_RING).map(|_| AtomicU64::new(0)).collect(),
            next: AtomicUsize::new(0),
            benched_until: AtomicU64::new(0),
            benchings_total: AtomicU64::new(0),
        }
    }

    pub fn benched_until(&self, now_ms: u64) -> Option<u64> {
        let until = self.benched_until.load(Ordering::Acquire);
        (until != 0 && now_ms < until).then_some(until)
    }

    /// Until when the deployment is benched (monotonic ms; 0 or past: not). For the shared
    /// state.
    pub fn benched_until_ms(&self) -> u64 {
        self.benched_until.load(Ordering::Acquire)
    }

    /// Another replica benched this deployment until `until_ms` (this replica's clock).
    pub fn adopt_bench(&self, until_ms: u64) {
        self.benched_until.fetch_max(until_ms, Ordering::AcqRel);
    }

    /// A model-scoped failure on any credential. Benches the deployment when `bench_after`
    /// of them fall inside `bench_window`.
    /// `bench_after: 0` switches benching off.
    pub fn on_failure(&self, policy: &HealthPolicy, now_ms: u64) -> Option<Transition> {
        if policy.bench_after == 0 || self.benched_until(now_ms).is_some() {
            return None;
        }
        let ring = self.failures.len();
        let n = usize::try_from(policy.bench_after)
            .unwrap_or(ring)
            .clamp(1, ring);
        let i = self.next.fetch_add(1, Ordering::Relaxed) % ring;
        self.failures[i].store(now_ms, Ordering::Relaxed);
        // The oldest of the last n failures, this one included.
        let oldest = self.failures[(i + ring + 1 - n) % ring].load(Ordering::Relaxed);
        if oldest != 0 && now_ms.saturating_sub(oldest) <= ms(policy.bench_window) {
            let until = now_ms.saturating_add(ms(policy.bench_for));
            self.benched_until.store(until, Ordering::Release);
            for f in self.failures.iter() {
                f.store(0, Ordering::Relaxed);
            }
            self.benchings_total.fetch_add(1, Ordering::Relaxed);
            return Some(Transition::Ejected { until_ms: until });
        }
        None
    }

    /// A probe answered: the model serves again.
    pub fn unbench(&self) {
        self.benched_until.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> HealthPolicy {
        HealthPolicy {
            failure_threshold: 3,
            cooldown: Duration::from_secs(10),
            max_ejection: Some(Duration::from_secs(35)),
            ..HealthPolicy::default()
        }
    }

    #[test]
    fn threshold_ejects_and_escalation_is_capped() {
        let p = policy();
        let t = TargetHealth::new(&p);
        let mut now = 1_000;
        assert_eq!(
            t.on_failure(&p, p.failure_threshold, false, None, now),
            None
        );
        assert_eq!(
            t.on_failure(&p, p.failure_threshold, false, None, now),
            None
        );
        assert_eq!(
            t.on_failure(&p, p.failure_threshold, false, None, now),
            Some(Transition::Ejected {
                until_ms: now + 10_000
            })
        );
        assert_eq!(
            t.state(now + 9_999),
            BreakerState::Open {
                until_ms: now + 10_000
            }
        );
        // Each failed half-open probe escalates: 20 s, 30 s, then the 35 s cap.
        for expected in [20_000, 30_000, 35_000, 35_000] {
            now = match t.state(now) {
                BreakerState::Open { until_ms } => until_ms,
                s => panic!("expected open, got {s:?}"),
            };
            assert_eq!(t.state(now), BreakerState::HalfOpen);
            assert!(t.try_claim_probe());
            assert_eq!(
                t.on_failure(&p, p.failure_threshold, true, None, now),
                Some(Transition::Ejected {
                    until_ms: now + expected
                })
            );
        }
    }

    #[test]
    fn half_open_success_restores_at_restore_health_and_earns_the_rest() {
        let p = policy();
        let t = TargetHealth::new(&p);
        for _ in 0..3 {
            t.on_failure(&p, p.failure_threshold, false, None, 1_000);
        }
        let now = 11_000;
        assert_eq!(t.state(now), BreakerState::HalfOpen);
        assert!(t.try_claim_probe());
        assert!(!t.try_claim_probe(), "one probe at a time");
        assert_eq!(t.on_success(&p, true, now), Some(Transition::Restored));
        assert_eq!(t.state(now), BreakerState::Closed);
        assert_eq!(t.health(), 500);
        assert!(!t.probe_in_flight());
        t.on_success(&p, false, now);
        assert_eq!(t.health(), 600);
        for _ in 0..10 {
            t.on_success(&p, false, now);
        }
        assert_eq!(t.health(), FULL_HEALTH);
        // The escalation was cleared: the next ejection is one cooldown again.
        for _ in 0..3 {
            t.on_failure(&p, p.failure_threshold, false, None, now);
        }
        assert_eq!(
            t.state(now),
            BreakerState::Open {
                until_ms: now + 10_000
            }
        );
    }

    #[test]
    fn a_success_between_failures_resets_the_count() {
        let p = policy();
        let t = TargetHealth::new(&p);
        t.on_failure(&p, p.failure_threshold, false, None, 1);
        t.on_failure(&p, p.failure_threshold, false, None, 2);
        t.on_success(&p, false, 3);
        t.on_failure(&p, p.failure_threshold, false, None, 4);
        t.on_failure(&p, p.failure_threshold, false, None, 5);
        assert_eq!(t.state(6), BreakerState::Closed);
    }

    #[test]
    fn retry_after_replaces_the_window_unescalated() {
        let p = policy();
        let t = TargetHealth::new(&p);
        assert_eq!(
            t.on_failure(
                &p,
                p.failure_threshold,
                false,
                Some(Duration::from_secs(4)),
                1_000
            ),
            Some(Transition::Ejected { until_ms: 5_000 })
        );
        assert_eq!(t.ejections(), 0, "a provider-stated wait does not escalate");
        let ignoring = HealthPolicy {
            respect_retry_after: false,
            ..p
        };
        let u = TargetHealth::new(&ignoring);
        assert_eq!(
            u.on_failure(
                &ignoring,
                ignoring.failure_threshold,
                false,
                Some(Duration::from_secs(4)),
                1_000
            ),
            None
        );
    }

    #[test]
    fn success_rate_floor_ejects() {
        let p = HealthPolicy {
            failure_threshold: 100,
            health_threshold: 0.8,
            ..policy()
        };
        let t = TargetHealth::new(&p);
        let mut now = 1_000;
        for i in 0..20 {
            now += 10;
            if i % 3 == 0 {
                if let Some(Transition::Ejected { .. }) =
                    t.on_failure(&p, p.failure_threshold, false, None, now)
                {
                    assert!(i >= 9, "not before {MIN_SAMPLES_FOR_RATE} samples");
                    return;
                }
            } else {
                t.on_success(&p, false, now);
            }
        }
        panic!("a 66% success rate under an 80% floor must eject");
    }

    #[test]
    fn a_restore_clears_a_probe_slot_still_marked_taken() {
        let p = policy();
        let t = TargetHealth::new(&p);
        for _ in 0..3 {
            t.on_failure(&p, p.failure_threshold, false, None, 1_000);
        }
        assert!(t.try_claim_probe());
        // The active prober re-admits it while a request holds the slot.
        t.restore(&p);
        assert!(!t.probe_in_flight());
        assert_eq!(t.state(11_000), BreakerState::Closed);
    }

    #[test]
    fn a_429_counts_half_a_failure() {
        let p = policy();
        let t = TargetHealth::new(&p);
        let threshold = p.failure_threshold;
        for _ in 0..(2 * threshold - 1) {
            assert_eq!(t.on_rate_limited(&p, threshold, false, 1_000), None);
        }
        assert!(matches!(
            t.on_rate_limited(&p, threshold, false, 1_000),
            Some(Transition::Ejected { .. })
        ));
        // A success clears the halves too; a full failure and two 429s make two.
        t.restore(&p);
        t.on_success(&p, false, 2_000);
        t.on_failure(&p, threshold, false, None, 2_000);
        t.on_rate_limited(&p, threshold, false, 2_000);
        assert_eq!(t.consecutive_failures(), 1);
        assert_eq!(t.on_rate_limited(&p, threshold, false, 2_000), None);
        // Breakers off: never ejected.
        let off = TargetHealth::new(&p);
        for _ in 0..20 {
            assert_eq!(off.on_rate_limited(&p, 0, false, 1_000), None);
        }
    }

    #[test]
    fn the_bench_window_follows_bench_after_whatever_the_ring_was_built_for() {
        let mut p = policy();
        p.bench_after = 0;
        let d = DeploymentHealth::new(&p);
        // Reloaded to 3: one or two failures do not bench.
        p.bench_after = 3;
        assert_eq!(d.on_failure(&p, 1_000), None);
        assert_eq!(d.on_failure(&p, 1_100), None);
        assert!(matches!(
            d.on_failure(&p, 1_200),
            Some(Transition::Ejected { .. })
        ));
        // Reloaded to the most allowed: the ring holds that many.
        let mut q = policy();
        q.bench_after = BENCH_AFTER;
        let e = DeploymentHealth::new(&q);
        for i in 0..u64::from(BENCH_AFTER - 1) {
            assert_eq!(e.on_failure(&q, 1_000 + i), None, "{i}");
        }
        assert!(e.on_failure(&q, 5_000).is_some());
    }

    const BENCH_AFTER: u32 = crate::config::types::BENCH_AFTER_CEILING;

    #[test]
    fn exactly_one_probe_under_contention() {
        let p = policy();
        let t = std::sync::Arc::new(TargetHealth::new(&p));
        for _ in 0..3 {
            t.on_failure(&p, p.failure_threshold, false, None, 1_000);
        }
        let winners: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..100)
                .map(|_| {
                    let t = t.clone();
                    s.spawn(move || {
                        usize::from(
                            t.state(11_000) == BreakerState::HalfOpen && t.try_claim_probe(),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        assert_eq!(winners, 1);
    }

    #[test]
    fn credentials_cool_and_escalate() {
        let p = policy();
        let c = CredentialHealth::default();
        assert_eq!(
            c.on_rejected(&p, 1_000),
            Transition::Ejected { until_ms: 11_000 }
        );
        assert_eq!(c.cooling_until(5_000), Some(11_000));
        assert_eq!(
            c.on_rejected(&p, 11_000),
            Transition::Ejected { until_ms: 31_000 }
        );
        c.on_success();
        assert_eq!(
            c.on_rejected(&p, 31_000),
            Transition::Ejected { until_ms: 41_000 }
        );
        // A 429 with Retry-After cools for exactly that long, and is remembered (scoring
        // fades its penalty from then).
        assert_eq!(c.rate_limited_at(), None);
        c.on_rate_limited(&p, Some(Duration::from_secs(2)), 50_000);
        assert_eq!(c.cooling_until(51_999), Some(52_000));
        assert_eq!(c.cooling_until(52_000), None);
        assert_eq!(c.rate_limited_at(), Some(50_000));
    }

    #[test]
    fn benching_needs_bench_after_failures_inside_the_window() {
        let p = HealthPolicy {
            bench_after: 3,
            bench_window: Duration::from_secs(900),
            bench_for: Duration::from_secs(600),
            ..policy()
        };
        let d = DeploymentHealth::new(&p);
        let min = 60_000;
        assert_eq!(d.on_failure(&p, min), None);
        assert_eq!(d.on_failure(&p, 20 * min), None);
        // The first failure slid out of the 15-minute window: still not benched.
        assert_eq!(d.on_failure(&p, 30 * min), None);
        // Three inside 15 minutes (20, 30, 31): benched for 10 minutes.
        assert_eq!(
            d.on_failure(&p, 31 * min),
            Some(Transition::Ejected { until_ms: 41 * min })
        );
        assert_eq!(d.benched_until(40 * min), Some(41 * min));
        assert_eq!(d.benched_until(41 * min), None);
        d.on_failure(&p, 42 * min);
        d.unbench();
        assert_eq!(d.benched_until(42 * min), None);
    }
}
