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
//!
//! Across replicas (`state`), a window has two more sets of buckets that only the state sync
//! touches: `pushed`, what of each second the shared store has been told, and `others`, what
//! the other replicas counted in each second as of the last sync. The window's count is its
//! own plus the others', per second, so `Retry-After` stays exact to the second of the sync.

use std::sync::atomic::{AtomicU64, Ordering};

const SECONDS: u64 = 60;

/// A per-minute window.
#[derive(Debug)]
pub struct Window {
    buckets: [AtomicU64; SECONDS as usize],
    /// Per second: this replica's count the shared store already holds.
    pushed: [AtomicU64; SECONDS as usize],
    /// Per second: the other replicas' count, as of the last sync.
    others: [AtomicU64; SECONDS as usize],
}

impl Default for Window {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            pushed: std::array::from_fn(|_| AtomicU64::new(0)),
            others: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Whether `second` lies in the minute ending at `now` (both masked to 32 bits).
fn live(now: u64, second: u64) -> bool {
    now.wrapping_sub(second) & 0xFFFF_FFFF < SECONDS
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
            .chain(&self.others)
            .map(|b| unpack(b.load(Ordering::Relaxed)))
            .filter(|(s, _)| live(now, *s))
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

    /// Add `n` at `now_s` that the shared store already holds (admitted there by a
    /// check-and-add): counted here, and never pushed again by the sync.
    pub fn add_pushed(&self, now_s: u64, n: u64) {
        self.add(now_s, n);
        let second = now_s & 0xFFFF_FFFF;
        let pushed = &self.pushed[(now_s % SECONDS) as usize];
        let mut cur = pushed.load(Ordering::Relaxed);
        loop {
            let (s, c) = unpack(cur);
            let next = pack(second, if s == second { c.saturating_add(n) } else { n });
            match pushed.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
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
        let mut counted: Vec<(u64, u64)> = self
            .buckets
            .iter()
            .chain(&self.others)
            .map(|b| unpack(b.load(Ordering::Relaxed)))
            .filter(|(s, c)| *c > 0 && live(now, *s))
            .map(|(s, c)| (now.wrapping_sub(s) & 0xFFFF_FFFF, c))
            .collect();
        counted.sort_unstable_by_key(|l| std::cmp::Reverse(l.0));
        let must_leave = used.saturating_add(n) - limit;
        let mut left = 0;
        for (age, c) in counted {
            left += c;
            if left >= must_leave {
                // A bucket `age` seconds old leaves the window in `SECONDS - age` seconds.
                return Err((SECONDS - age).max(1));
            }
        }
        Err(SECONDS)
    }

    /// For the state sync: what this replica counted since the last push, per live second
    /// (`(second, delta)`; a refund makes a delta negative). Marked pushed by
    /// [`commit`](Self::commit) once the store has it.
    pub fn pending(&self, now_s: u64, out: &mut Vec<(u64, i64)>) {
        let now = now_s & 0xFFFF_FFFF;
        for (bucket, pushed) in self.buckets.iter().zip(&self.pushed) {
            let (s, c) = unpack(bucket.load(Ordering::Relaxed));
            if !live(now, s) {
                continue;
            }
            let (ps, pc) = unpack(pushed.load(Ordering::Relaxed));
            let before = if ps == s { pc } else { 0 };
            if c != before {
                #[allow(clippy::cast_possible_wrap)]
                out.push((s, c as i64 - before as i64));
            }
        }
    }

    /// The store took these deltas (from [`pending`](Self::pending)).
    pub fn commit(&self, deltas: &[(u64, i64)]) {
        for &(s, d) in deltas {
            let s = s & 0xFFFF_FFFF;
            let pushed = &self.pushed[(s % SECONDS) as usize];
            let (ps, pc) = unpack(pushed.load(Ordering::Relaxed));
            let before = if ps == s { pc } else { 0 };
            pushed.store(pack(s, before.saturating_add_signed(d)), Ordering::Relaxed);
        }
    }

    /// For the state sync: the whole window's count per second as the shared store holds it
    /// (every replica's pushes); what is not this replica's becomes the others' count.
    pub fn set_shared(&self, now_s: u64, shared: &[(u64, u64)]) {
        let now = now_s & 0xFFFF_FFFF;
        for (i, other) in self.others.iter().enumerate() {
            let found = shared
                .iter()
                .map(|&(s, c)| (s & 0xFFFF_FFFF, c))
                .find(|&(s, _)| s % SECONDS == i as u64 && live(now, s));
            let value = found.map_or(0, |(s, total)| {
                let (ps, pc) = unpack(self.pushed[i].load(Ordering::Relaxed));
                let mine = if ps == s { pc } else { 0 };
                pack(s, total.saturating_sub(mine))
            });
            other.store(value, Ordering::Relaxed);
        }
    }

    /// The shared store is unreachable: only this replica's counts hold until it is back.
    pub fn clear_shared(&self) {
        for o in &self.others {
            o.store(0, Ordering::Relaxed);
        }
    }

    /// The shared store lost what it held (a restarted Redis): push every live count again.
    pub fn forget_pushed(&self) {
        for p in &self.pushed {
            p.store(0, Ordering::Relaxed);
        }
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
    fn a_count_the_store_already_holds_is_not_pushed_again() {
        let w = Window::default();
        w.add_pushed(100, 1);
        w.add(100, 2);
        assert_eq!(w.used(100), 3);
        let mut d = Vec::new();
        w.pending(100, &mut d);
        assert_eq!(d, [(100, 2)], "only what the store has not been told");
    }

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

    #[test]
    fn shared_counts_join_the_window_and_pushes_are_deltas() {
        let w = Window::default();
        w.add(100, 2);
        w.add(101, 1);
        let mut d = Vec::new();
        w.pending(101, &mut d);
        d.sort_unstable();
        assert_eq!(d, [(100, 2), (101, 1)]);
        w.commit(&d);
        // The store now holds ours plus 4 from another replica at second 101.
        w.set_shared(101, &[(100, 2), (101, 5)]);
        assert_eq!(w.used(101), 7);
        assert_eq!(w.check(101, 7, 1), Err(59), "our two at 100 must leave");
        // Only what changed since is pushed; a refund pushes a negative delta.
        w.add(101, 3);
        w.sub(100, 1);
        let mut d = Vec::new();
        w.pending(102, &mut d);
        d.sort_unstable();
        assert_eq!(d, [(100, -1), (101, 3)]);
        let mut again = Vec::new();
        w.pending(102, &mut again);
        assert_eq!(again, d, "not pushed until committed");
        w.commit(&d);
        let mut d = Vec::new();
        w.pending(102, &mut d);
        assert!(d.is_empty(), "nothing new");
        // Unreachable store: our own counts only; then it comes back empty: push all again.
        w.clear_shared();
        assert_eq!(w.used(102), 5);
        w.forget_pushed();
        let mut d = Vec::new();
        w.pending(102, &mut d);
        d.sort_unstable();
        assert_eq!(d, [(100, 1), (101, 4)]);
        w.commit(&d);
        // Others' counts slide out of the window like ours.
        w.set_shared(102, &[(100, 1), (101, 8)]);
        assert_eq!(w.used(102), 9);
        assert_eq!(w.used(161), 0);
    }
}
