//! Degraded mode: when a large share of providers fails at once, probing and
//! exploring only burn retry budget on dead routes, so the router sticks to the scored order.
//!
//! The state follows the healthy-provider ratio (providers with at least one target that can
//! take traffic, an unprobed one counting as healthy, over enabled providers). Entering needs
//! the ratio below `healthy_ratio` for `entry_grace`; leaving needs it back at or above for
//! the longer `exit_grace`, so one bad pass cannot flap the state. Below `min_providers` the
//! state is not evaluated. One writer (the ranker) drives it; readers load atomics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::clock::ms;
use crate::config::DegradedPolicy;

#[derive(Debug)]
pub struct DegradedMode {
    policy: DegradedPolicy,
    degraded: AtomicBool,
    /// When the current state was entered (0: never changed).
    since_ms: AtomicU64,
    /// When the ratio first crossed against the current state (0: it has not).
    crossing_since_ms: AtomicU64,
    ratio_bits: AtomicU64,
}

impl DegradedMode {
    pub fn new(policy: DegradedPolicy) -> Self {
        Self {
            policy,
            degraded: AtomicBool::new(false),
            since_ms: AtomicU64::new(0),
            crossing_since_ms: AtomicU64::new(0),
            ratio_bits: AtomicU64::new(1f64.to_bits()),
        }
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// When the current state was entered, if it ever changed.
    pub fn since_ms(&self) -> Option<u64> {
        let s = self.since_ms.load(Ordering::Relaxed);
        (s != 0).then_some(s)
    }

    pub fn last_ratio(&self) -> f64 {
        f64::from_bits(self.ratio_bits.load(Ordering::Relaxed))
    }

    /// Feed one health pass. Returns the new state when it changed.
    pub fn evaluate(&self, healthy: u32, total: u32, now_ms: u64) -> Option<bool> {
        if total == 0 || total < self.policy.min_providers {
            self.crossing_since_ms.store(0, Ordering::Relaxed);
            return None;
        }
        let ratio = f64::from(healthy) / f64::from(total);
        self.ratio_bits.store(ratio.to_bits(), Ordering::Relaxed);
        let degraded = self.is_degraded();
        let low = ratio < self.policy.healthy_ratio;
        // Against the current state: low while normal, or healthy while degraded.
        if low != degraded {
            let since = match self.crossing_since_ms.load(Ordering::Relaxed) {
                0 => {
                    self.crossing_since_ms.store(now_ms, Ordering::Relaxed);
                    now_ms
                }
                s => s,
            };
            let grace = if degraded {
                self.policy.exit_grace
            } else {
                self.policy.entry_grace
            };
            if now_ms.saturating_sub(since) >= ms(grace) {
                self.degraded.store(!degraded, Ordering::Relaxed);
                self.since_ms.store(now_ms, Ordering::Relaxed);
                self.crossing_since_ms.store(0, Ordering::Relaxed);
                return Some(!degraded);
            }
        } else {
            self.crossing_since_ms.store(0, Ordering::Relaxed);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn mode() -> DegradedMode {
        DegradedMode::new(DegradedPolicy {
            healthy_ratio: 0.5,
            min_providers: 3,
            entry_grace: Duration::from_secs(60),
            exit_grace: Duration::from_secs(120),
        })
    }

    #[test]
    fn enters_after_the_entry_grace_and_leaves_after_the_longer_exit_grace() {
        let m = mode();
        let s = 1_000;
        assert_eq!(m.evaluate(1, 4, s), None);
        assert_eq!(m.evaluate(1, 4, s + 59_999), None);
        assert_eq!(m.evaluate(1, 4, s + 60_000), Some(true));
        assert!(m.is_degraded());
        assert_eq!(m.since_ms(), Some(s + 60_000));
        // Healthy again: not left before 120 s of health.
        let t = s + 70_000;
        assert_eq!(m.evaluate(3, 4, t), None);
        assert_eq!(m.evaluate(3, 4, t + 119_999), None);
        assert_eq!(m.evaluate(3, 4, t + 120_000), Some(false));
    }

    #[test]
    fn one_bad_pass_does_not_flap() {
        let m = mode();
        let s = 1_000;
        assert_eq!(m.evaluate(1, 4, s), None);
        // A healthy pass in between restarts the grace.
        assert_eq!(m.evaluate(4, 4, s + 30_000), None);
        assert_eq!(m.evaluate(1, 4, s + 40_000), None);
        assert_eq!(m.evaluate(1, 4, s + 90_000), None);
        assert!(!m.is_degraded());
        assert_eq!(m.evaluate(1, 4, s + 100_000), Some(true));
        // While degraded, a brief recovery does not leave.
        assert_eq!(m.evaluate(4, 4, s + 110_000), None);
        assert_eq!(m.evaluate(1, 4, s + 120_000), None);
        assert_eq!(m.evaluate(4, 4, s + 200_000), None);
        assert!(m.is_degraded());
    }

    #[test]
    fn not_evaluated_under_min_providers() {
        let m = mode();
        for i in 0..10 {
            assert_eq!(m.evaluate(0, 2, 1_000 + i * 100_000), None);
        }
        assert!(!m.is_degraded());
    }
}
