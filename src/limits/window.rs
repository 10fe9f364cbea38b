//! A sliding one-minute window of counts (requests, or tokens), lock-free.
//!
//! Sixty one-second buckets, each an `AtomicU64` packing (second, count). Adding finds the
//! bucket of the current second and either adds to it or, if it still holds a second a minute
//! old, takes it over; the window's sum is every bucket whose second lies in the last sixty.
//! Why buckets and not a token bucket: the contract is "N per minute" as callers and providers
//! state it, with `Retry-After` = when enough of the window frees up, which a window of
//! per-second counts answers exactly (to the second); a token bucket answers a different
//! question (a refill rate) and would let a full minute's burst through after a pause.
//!
//! Admission is check-then-add, not atomic across the two: concurrent requests racing for the
//! last unit can overshoot by at most the number racing, never by a whole window.

use std::sync::atomic::{AtomicU64, Ordering};

const SECONDS: u64 = 60;

/// A per-minute window.
#[derive(Debug)]
pub struct Window {
    buckets: [AtomicU64; SECONDS as usize],
}

impl Default for Window {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Pack a second (low 32 bits are enough: they wrap every 136 years) and a count.
fn pack(second: u64, count: u64) -> u64 {
    ((second & 0xFFFF_FFFF) << 32) | count.min(0xFFFF_FFFF)
}

fn unpack(v: u64) -> (u64, u64) {
    (v >> 32, v & 0xFFFF_FFFF)
}

impl Window {
    /// The count over the minute ending at `now_s` (whole seconds).
    pub fn used(&self, now_s: u64) -> u64 {
        let now = now_s & 0xFFFF_FFFF;
        self.buckets
            .iter()
            .map(|b| unpack(b.load(Ordering::Relaxed)))
            .filter(|(s, _)| now.wrapping_sub(*s) & 0xFFFF_FFFF < SECONDS)
            .map(|(_, c)| c)
            .sum()
    }

    /// Add `n` at `now_s`.
    pub fn add(&self, now_s: u64, n: u64) {
        if n == 0 {
            return;
        }
        let second = now_s & 0xFFFF_FFFF;
        let bucket = &self.buckets[(now_s % SECONDS) as usize];
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let (s, c) = unpack(cur);
            let next = if s == second {
                pack(second, c.saturating_add(n))
            } else {
                pack(second, n)
            };
            match bucket.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Take back `n` added at a second still in the window (a reservation the answer proved too
    /// large): from the bucket of `at_s` if it still holds that second.
    pub fn sub(&self, at_s: u64, n: u64) {
        let second = at_s & 0xFFFF_FFFF;
        let bucket = &self.buckets[(at_s % SECONDS) as usize];
        let mut cur = bucket.load(Ordering::Relaxed);
        loop {
            let (s, c) = unpack(cur);
            if s != second {
                return;
            }
            let next = pack(second, c.saturating_sub(n));
            match bucket.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Whether `n` more fit under `limit` at `now_s`: `Ok(())`, or the seconds until enough of
    /// the window has aged out for them to (at least 1). More than the limit itself never fits:
    /// the answer is then a full minute.
    pub fn check(&self, now_s: u64, limit: u64, n: u64) -> Result<(), u64> {
        let used = self.used(now_s);
        if used.saturating_add(n) <= limit {
            return Ok(());
        }
        if n > limit {
            return Err(SECONDS);
        }
        // Oldest first: how long until the counts that must leave have left.
        let now = now_s & 0xFFFF_FFFF;
        let mut live: Vec<(u64, u64)> = self
            .buckets
            .iter()
            .map(|b| unpack(b.load(Ordering::Relaxed)))
            .filter(|(s, c)| *c > 0 && now.wrapping_sub(*s) & 0xFFFF_FFFF < SECONDS)
            .map(|(s, c)| (now.wrapping_sub(s) & 0xFFFF_FFFF, c))
            .collect();
        live.sort_unstable_by_key(|l| std::cmp::Reverse(l.0));
        let must_leave = used.saturating_add(n) - limit;
        let mut left = 0;
        for (age, c) in live {
            left += c;
            if left >= must_leave {
                // A bucket `age` seconds old leaves the window in `SECONDS - age` seconds.
                return Err((SECONDS - age).max(1));
            }
        }
        Err(SECONDS)
    }

    /// The fraction of `limit` still free at `now_s` (0 to 1).
    #[allow(clippy::cast_precision_loss)]
    pub fn headroom(&self, now_s: u64, limit: u64) -> f64 {
        if limit == 0 {
            return 0.0;
        }
        1.0 - (self.used(now_s) as f64 / limit as f64).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_slide_out_after_a_minute() {
        let w = Window::default();
        w.add(1_000, 3);
        w.add(1_030, 2);
        assert_eq!(w.used(1_030), 5);
        assert_eq!(w.used(1_059), 5);
        assert_eq!(w.used(1_060), 2, "the first second left the window");
        assert_eq!(w.used(1_090), 0);
    }

    #[test]
    fn a_full_window_says_when_enough_frees() {
        let w = Window::default();
        w.add(100, 2);
        w.add(120, 1);
        // 3 of 3 used: one more fits when the two at second 100 leave (at 160).
        assert_eq!(w.check(130, 3, 1), Err(30));
        // Two more need the same two to leave; three more need all three (at 180).
        assert_eq!(w.check(130, 3, 3), Err(50));
        assert_eq!(w.check(160, 3, 1), Ok(()));
        // More than the limit itself never fits.
        assert_eq!(w.check(130, 3, 4), Err(60));
        assert!(w.check(130, 10, 7).is_ok());
    }

    #[test]
    fn a_reused_bucket_forgets_its_old_second() {
        let w = Window::default();
        w.add(5, 9);
        w.add(65, 1);
        assert_eq!(w.used(65), 1);
        w.sub(65, 5);
        assert_eq!(w.used(65), 0, "never below zero");
        w.sub(5, 1);
        assert_eq!(
            w.used(65),
            0,
            "a second that left the window is not touched"
        );
    }

    #[test]
    fn concurrent_adds_are_all_counted() {
        let w = std::sync::Arc::new(Window::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        w.add(42, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("joined");
        }
        assert_eq!(w.used(42), 4000);
        assert!((w.headroom(42, 8000) - 0.5).abs() < 1e-9);
    }
}
