//! The process's hedge allowance: how many of its requests in the last second may be hedged
//! (`hedge.max_share`), so that a provider-wide slowdown cannot double the load on the rest.
//!
//! Ten 100 ms buckets each pack (tick, count) in one `AtomicU64`, for the requests and for the
//! hedges: counting a request is one relaxed add on the current bucket (it takes the bucket
//! over when it holds a tick a second old); a hedge sums the live buckets of both. A hedge
//! is allowed when the hedges of the last second stay under `max(1, max_share × requests)`.
//! Check-then-add: hedges racing for the last unit may overshoot by the number racing.

use std::sync::atomic::{AtomicU64, Ordering};

const BUCKETS: u64 = 10;
const TICK_MS: u64 = 100;

/// A one-second window in 100 ms buckets.
#[derive(Debug)]
struct Tenths {
    buckets: [AtomicU64; BUCKETS as usize],
}

impl Default for Tenths {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn pack(tick: u64, count: u64) -> u64 {
    ((tick & 0xFFFF_FFFF) << 32) | count.min(0xFFFF_FFFF)
}

impl Tenths {
    fn add(&self, now_ms: u64) {
        let tick = now_ms / TICK_MS;
        let bucket = &self.buckets[(tick % BUCKETS) as usize];
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let next = if cur >> 32 == tick & 0xFFFF_FFFF {
                cur + 1
            } else {
                pack(tick, 1)
            };
            match bucket.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The count over the second ending at `now_ms`.
    fn sum(&self, now_ms: u64) -> u64 {
        let tick = (now_ms / TICK_MS) & 0xFFFF_FFFF;
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .filter(|v| tick.wrapping_sub(v >> 32) & 0xFFFF_FFFF < BUCKETS)
            .map(|v| v & 0xFFFF_FFFF)
            .sum()
    }
}

/// Requests and hedges over the last second.
#[derive(Debug, Default)]
pub struct HedgeShare {
    requests: Tenths,
    hedges: Tenths,
}

impl HedgeShare {
    /// A request the process serves (counted whether or not it could hedge).
    pub fn note_request(&self, now_ms: u64) {
        self.requests.add(now_ms);
    }

    /// Take one hedge if the last second's hedges stay within `max_share` of its requests
    /// (at least one a second).
    pub fn try_hedge(&self, now_ms: u64, max_share: f64) -> bool {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let allowed = ((self.requests.sum(now_ms) as f64 * max_share).floor() as u64).max(1);
        if self.hedges.sum(now_ms) >= allowed {
            return false;
        }
        self.hedges.add(now_ms);
        true
    }

    /// Hedges in the last second (explain, tests).
    pub fn hedged(&self, now_ms: u64) -> u64 {
        self.hedges.sum(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenth_of_the_last_seconds_requests_may_hedge() {
        let share = HedgeShare::default();
        let t = 50_000;
        for i in 0..200 {
            share.note_request(t + i * 4); // 200 requests over 0.8 s
        }
        let granted = (0..200).filter(|_| share.try_hedge(t + 800, 0.1)).count();
        assert_eq!(granted, 20);
        // A second later the window has moved on: the old requests no longer count, one a
        // second is still allowed.
        assert!(share.try_hedge(t + 2_000, 0.1));
        assert!(!share.try_hedge(t + 2_000, 0.1));
    }

    #[test]
    fn the_window_slides_by_tenths() {
        let share = HedgeShare::default();
        for i in 0..10 {
            share.note_request(1_000 + i * 100);
        }
        assert_eq!(share.requests.sum(1_950), 10);
        assert_eq!(
            share.requests.sum(2_050),
            9,
            "the first tenth left the window"
        );
        assert_eq!(share.requests.sum(5_000), 0);
    }
}
