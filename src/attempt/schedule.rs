//! After a failed attempt: whether another may run, and where — the same target again (after
//! a backoff), the plan's next target, or none.
//!
//! The bounds of one request: `max_attempts` calls in all (a policy's, else
//! `failover.max_attempts`; same-target retries count), and `failover.deadline`, which stops new
//! attempts once passed — but never the first attempt or the first retry. Same-target retries
//! (`failover.transient_retries`, or a policy's `retry`) wait a uniform random time in
//! `[0, backoff × 2^n]` before the n-th one (n = 0, 1, …), capped at [`MAX_BACKOFF`] ("full
//! jitter"), and never run for a half-open probe or once the target's breaker has stopped
//! admitting it. A pooled connection that failed before the request was written is called
//! again at once, on a fresh connection, once per request.

use std::time::Duration;

use super::outcome::{Advance, Outcome};
use super::verdict::Scope;

/// The longest wait before a same-target retry.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Statuses, as a set (the ones a policy's `retry.on_status` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusSet([u64; 10]);

impl StatusSet {
    /// `retry.on_status`'s default: 502, 503, 504 and 529.
    pub fn gateway_errors() -> Self {
        Self::from_codes(&[502, 503, 504, 529])
    }

    pub fn from_codes(codes: &[u16]) -> Self {
        let mut set = Self::default();
        for &c in codes {
            set.insert(c);
        }
        set
    }

    /// Statuses 0..640 fit; others are never in the set.
    pub fn insert(&mut self, status: u16) {
        if let Some(word) = self.0.get_mut(usize::from(status / 64)) {
            *word |= 1 << (status % 64);
        }
    }

    pub fn contains(self, status: u16) -> bool {
        self.0
            .get(usize::from(status / 64))
            .is_some_and(|w| w & (1 << (status % 64)) != 0)
    }
}

/// Which failures take a same-target retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOn {
    /// `failover.transient_retries`: a reset or close, a connect timeout, a 5xx/529/408.
    Transient,
    /// A policy's `retry.on_status`: these statuses, and connection drops (reset or closed).
    Statuses(StatusSet),
}

/// Same-target retries of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SameTarget {
    pub attempts: u32,
    pub backoff: Duration,
    pub on: RetryOn,
}

impl SameTarget {
    pub const OFF: SameTarget = SameTarget {
        attempts: 0,
        backoff: Duration::ZERO,
        on: RetryOn::Transient,
    };

    fn takes(self, outcome: Outcome, status: Option<u16>) -> bool {
        match self.on {
            RetryOn::Transient => matches!(
                outcome,
                Outcome::Reset | Outcome::ConnectTimeout | Outcome::ServerError
            ),
            RetryOn::Statuses(set) => match status {
                Some(s) => set.contains(s),
                None => outcome == Outcome::Reset,
            },
        }
    }
}

/// The bounds on one request's attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryRules {
    pub max_attempts: u32,
    pub deadline: Option<Duration>,
    pub same_target: SameTarget,
}

/// What a request has spent so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Upstream calls made, the failed one included.
    pub attempts: u32,
    /// Same-target retries made on the current target.
    pub same_target: u32,
    /// The one fresh-connection call after a stale pooled one was made.
    pub fresh: bool,
}

/// The failed attempt, as the schedule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    pub outcome: Outcome,
    pub scope: Scope,
    /// The upstream status, when a header arrived.
    pub status: Option<u16>,
    /// The attempt held its target's half-open probe slot.
    pub probe: bool,
}

/// Where the next attempt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The same target again, after this long.
    SameTarget { delay: Duration },
    /// The plan's next target.
    Plan(Advance),
    /// No further attempt.
    Stop,
}

/// Decide the next attempt. `elapsed` is the request's age; `admits` tells whether the failed
/// target's breaker (which has just seen the failure) still admits it, asked only when a
/// same-target retry is otherwise due; `draw` is a per-request random number for the jitter.
pub fn next(
    failed: Failed,
    rules: &RetryRules,
    spent: Spent,
    elapsed: Duration,
    admits: impl FnOnce() -> bool,
    draw: u64,
) -> Next {
    if spent.attempts >= rules.max_attempts {
        return Next::Stop;
    }
    // The first attempt and the first retry always run; later ones only within the deadline.
    if spent.attempts >= 2 && rules.deadline.is_some_and(|d| elapsed >= d) {
        return Next::Stop;
    }
    if failed.scope == Scope::Fresh {
        return if spent.fresh || failed.probe {
            Next::Plan(Advance::NextDeployment)
        } else {
            Next::SameTarget {
                delay: Duration::ZERO,
            }
        };
    }
    let same = rules.same_target;
    if spent.same_target < same.attempts
        && !failed.probe
        && same.takes(failed.outcome, failed.status)
        && admits()
    {
        return Next::SameTarget {
            delay: backoff(same.backoff, spent.same_target, draw),
        };
    }
    Next::Plan(failed.scope.advance())
}

/// Full jitter: uniform in `[0, base × 2^n]`, capped at [`MAX_BACKOFF`].
pub fn backoff(base: Duration, n: u32, draw: u64) -> Duration {
    let ceiling = base
        .saturating_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
        .min(MAX_BACKOFF);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(draw % (nanos + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(max_attempts: u32, same: SameTarget) -> RetryRules {
        RetryRules {
            max_attempts,
            deadline: Some(Duration::from_millis(100)),
            same_target: same,
        }
    }

    fn failed(outcome: Outcome, status: Option<u16>) -> Failed {
        Failed {
            outcome,
            scope: Scope::Deployment,
            status,
            probe: false,
        }
    }

    fn spent(attempts: u32) -> Spent {
        Spent {
            attempts,
            ..Spent::default()
        }
    }

    #[test]
    fn the_first_retry_runs_whatever_the_deadline() {
        let r = rules(20, SameTarget::OFF);
        let late = Duration::from_secs(60);
        let f = failed(Outcome::Reset, None);
        assert_eq!(
            next(f, &r, spent(1), late, || true, 0),
            Next::Plan(Advance::NextDeployment)
        );
        assert_eq!(next(f, &r, spent(2), late, || true, 0), Next::Stop);
        assert_eq!(
            next(f, &r, spent(2), Duration::from_millis(10), || true, 0),
            Next::Plan(Advance::NextDeployment)
        );
        assert_eq!(
            next(f, &rules(1, SameTarget::OFF), spent(1), late, || true, 0),
            Next::Stop
        );
    }

    #[test]
    fn same_target_retries_take_what_they_are_configured_for() {
        let transient = SameTarget {
            attempts: 2,
            backoff: Duration::from_millis(100),
            on: RetryOn::Transient,
        };
        let r = rules(20, transient);
        let now = Duration::ZERO;
        assert!(matches!(
            next(
                failed(Outcome::ServerError, Some(503)),
                &r,
                spent(1),
                now,
                || true,
                7
            ),
            Next::SameTarget { .. }
        ));
        // A refused connect (nothing listens) and credential verdicts move on.
        assert_eq!(
            next(
                failed(Outcome::ConnectRefused, None),
                &r,
                spent(1),
                now,
                || true,
                7
            ),
            Next::Plan(Advance::NextDeployment)
        );
        // Retries used up, a probe, or a breaker that stopped admitting: move on.
        let used = Spent {
            attempts: 3,
            same_target: 2,
            fresh: false,
        };
        assert_eq!(
            next(failed(Outcome::Reset, None), &r, used, now, || true, 7),
            Next::Plan(Advance::NextDeployment)
        );
        let probe = Failed {
            probe: true,
            ..failed(Outcome::Reset, None)
        };
        assert_eq!(
            next(probe, &r, spent(1), now, || true, 7),
            Next::Plan(Advance::NextDeployment)
        );
        assert_eq!(
            next(failed(Outcome::Reset, None), &r, spent(1), now, || false, 7),
            Next::Plan(Advance::NextDeployment)
        );
        let on_status = SameTarget {
            on: RetryOn::Statuses(StatusSet::from_codes(&[500])),
            ..transient
        };
        let r = rules(20, on_status);
        assert!(matches!(
            next(
                failed(Outcome::ServerError, Some(500)),
                &r,
                spent(1),
                now,
                || true,
                7
            ),
            Next::SameTarget { .. }
        ));
        assert_eq!(
            next(
                failed(Outcome::ServerError, Some(503)),
                &r,
                spent(1),
                now,
                || true,
                7
            ),
            Next::Plan(Advance::NextDeployment)
        );
        assert!(
            matches!(
                next(failed(Outcome::Reset, None), &r, spent(1), now, || true, 7),
                Next::SameTarget { .. }
            ),
            "a connection drop"
        );
    }

    #[test]
    fn a_stale_pooled_connection_is_called_again_once() {
        let r = rules(20, SameTarget::OFF);
        let stale = Failed {
            outcome: Outcome::StaleConnection,
            scope: Scope::Fresh,
            status: None,
            probe: false,
        };
        assert_eq!(
            next(stale, &r, spent(1), Duration::ZERO, || true, 0),
            Next::SameTarget {
                delay: Duration::ZERO
            }
        );
        let again = Spent {
            attempts: 2,
            same_target: 0,
            fresh: true,
        };
        assert_eq!(
            next(stale, &r, again, Duration::ZERO, || true, 0),
            Next::Plan(Advance::NextDeployment)
        );
    }

    #[test]
    fn backoff_is_full_jitter_doubling_and_capped() {
        let base = Duration::from_millis(100);
        for draw in [0, 1, 12_345, u64::MAX / 3, u64::MAX] {
            assert!(backoff(base, 0, draw) <= base);
            assert!(backoff(base, 3, draw) <= base * 8);
            assert!(backoff(base, 30, draw) <= MAX_BACKOFF);
        }
        // Spread, not a constant.
        let a = backoff(base, 2, 1_000_003);
        let b = backoff(base, 2, 987_654_321_987);
        assert_ne!(a, b);
        assert_eq!(backoff(Duration::ZERO, 4, 99), Duration::ZERO);
    }

    #[test]
    fn status_sets_hold_what_they_are_given() {
        let s = StatusSet::gateway_errors();
        assert!(s.contains(502) && s.contains(529));
        assert!(!s.contains(500) && !s.contains(429));
        let mut t = StatusSet::default();
        t.insert(700);
        assert!(!t.contains(700));
    }
}
