//! Lock-free statistics: an EWMA and a windowed success counter, both plain atomics so the
//! request path records without locking.
//!
//! Races are tolerated where they only blur a statistic: two EWMA updates retry their CAS;
//! a window bucket being recycled while another thread adds to it may lose that one count.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// An exponentially weighted moving average of `f64` samples. Unknown until the first sample.
#[derive(Debug)]
pub struct Ewma {
    bits: AtomicU64,
    alpha: f64,
}

const UNKNOWN: u64 = u64::MAX; // a NaN bit pattern no real sample produces

impl Ewma {
    pub fn new(alpha: f64) -> Self {
        Self {
            bits: AtomicU64::new(UNKNOWN),
            alpha,
        }
    }

    pub fn observe(&self, x: f64) {
        if !x.is_finite() {
            return;
        }
        let mut cur = self.bits.load(Ordering::Relaxed);
        loop {
            let next = if cur == UNKNOWN {
                x
            } else {
                let old = f64::from_bits(cur);
                old + self.alpha * (x - old)
            };
            match self.bits.compare_exchange_weak(
                cur,
                next.to_bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn get(&self) -> Option<f64> {
        let b = self.bits.load(Ordering::Relaxed);
        (b != UNKNOWN).then(|| f64::from_bits(b))
    }

    pub fn reset(&self) {
        self.bits.store(UNKNOWN, Ordering::Relaxed);
    }
}

/// Successes and failures over a sliding window of `BUCKETS` time buckets.
#[derive(Debug)]
pub struct SuccessWindow {
    bucket_ms: u64,
    buckets: [Bucket; BUCKETS],
}

pub const BUCKETS: usize = 10;

#[derive(Debug, Default)]
struct Bucket {
    /// Which bucket number (now / bucket_ms) the counts belong to.
    epoch: AtomicU64,
    ok: AtomicU32,
    fail: AtomicU32,
}

impl Bucket {
    /// Make the bucket count for `epoch`: the first writer of a new epoch clears it.
    fn enter(&self, epoch: u64) -> &Self {
        let seen = self.epoch.load(Ordering::Relaxed);
        if seen != epoch
            && self
                .epoch
                .compare_exchange(seen, epoch, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.ok.store(0, Ordering::Relaxed);
            self.fail.store(0, Ordering::Relaxed);
        }
        self
    }
}

impl SuccessWindow {
    /// A window of `window_ms`, in ten buckets.
    pub fn new(window_ms: u64) -> Self {
        Self {
            bucket_ms: (window_ms / BUCKETS as u64).max(1),
            buckets: Default::default(),
        }
    }

    pub fn record(&self, ok: bool, now_ms: u64) {
        let epoch = now_ms / self.bucket_ms;
        let b = self.buckets[(epoch % BUCKETS as u64) as usize].enter(epoch);
        if ok {
            b.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            b.fail.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(successes, failures)` inside the window ending now.
    pub fn counts(&self, now_ms: u64) -> (u32, u32) {
        let epoch = now_ms / self.bucket_ms;
        let oldest = epoch.saturating_sub(BUCKETS as u64 - 1);
        let mut ok = 0u32;
        let mut fail = 0u32;
        for b in &self.buckets {
            let e = b.epoch.load(Ordering::Relaxed);
            if e >= oldest && e <= epoch {
                ok = ok.saturating_add(b.ok.load(Ordering::Relaxed));
                fail = fail.saturating_add(b.fail.load(Ordering::Relaxed));
            }
        }
        (ok, fail)
    }

    /// Success rate with a uniform prior (one success seen): `1.0` when nothing is known.
    pub fn rate(&self, now_ms: u64) -> f64 {
        let (ok, fail) = self.counts(now_ms);
        (f64::from(ok) + 1.0) / (f64::from(ok) + f64::from(fail) + 1.0)
    }

    pub fn reset(&self) {
        for b in &self.buckets {
            b.epoch.store(0, Ordering::Relaxed);
            b.ok.store(0, Ordering::Relaxed);
            b.fail.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ewma_starts_unknown_then_tracks() {
        let e = Ewma::new(0.5);
        assert_eq!(e.get(), None);
        e.observe(10.0);
        assert_eq!(e.get(), Some(10.0));
        e.observe(20.0);
        assert_eq!(e.get(), Some(15.0));
        e.observe(f64::NAN);
        assert_eq!(e.get(), Some(15.0));
    }

    #[test]
    fn window_slides() {
        let w = SuccessWindow::new(10_000); // ten 1 s buckets
        w.record(true, 1_000);
        w.record(false, 1_500);
        w.record(false, 5_000);
        assert_eq!(w.counts(5_000), (1, 2));
        // The window covers ten buckets: the first leaves once bucket 11 starts.
        assert_eq!(w.counts(10_999), (1, 2));
        assert_eq!(w.counts(11_000), (0, 1));
        assert!((w.rate(5_000) - 0.5).abs() < 1e-9);
        // A recycled bucket starts from zero.
        w.record(true, 11_200);
        assert_eq!(w.counts(11_200), (1, 1));
        assert_eq!(w.counts(30_000), (0, 0));
    }
}

/// Buckets of [`Quantiles`]: bucket `i` holds samples up to `FIRST_BOUND_MS × 1.25^i`
/// (5 ms … ~33 s), so a percentile is known to within 25 %.
const QUANTILE_BUCKETS: usize = 40;
const FIRST_BOUND_MS: f64 = 5.0;
const BUCKET_GROWTH: f64 = 1.25;
/// When this many samples are held, every bucket is halved: the record follows what the
/// target does now, not what it did an hour ago.
const QUANTILE_HALF_LIFE: u32 = 512;
/// Fewer samples than this and no percentile is given.
pub const QUANTILE_MIN_SAMPLES: u32 = 10;

/// A decaying log-bucketed histogram of millisecond samples (a target's TTFBs), for its
/// percentiles. Lock-free; concurrent halving and adding may blur a count, never more.
#[derive(Debug)]
pub struct Quantiles {
    buckets: [AtomicU32; QUANTILE_BUCKETS],
    total: AtomicU32,
}

impl Default for Quantiles {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU32::new(0)),
            total: AtomicU32::new(0),
        }
    }
}

fn bucket_bound_ms(i: usize) -> f64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
    let n = i as i32;
    FIRST_BOUND_MS * BUCKET_GROWTH.powi(n)
}

impl Quantiles {
    pub fn observe(&self, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        let i = if ms <= FIRST_BOUND_MS {
            0
        } else {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let i = ((ms / FIRST_BOUND_MS).ln() / BUCKET_GROWTH.ln()).ceil() as usize;
            i.min(QUANTILE_BUCKETS - 1)
        };
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        if self.total.fetch_add(1, Ordering::Relaxed) + 1 >= QUANTILE_HALF_LIFE {
            let mut kept = 0;
            for b in &self.buckets {
                let v = b.load(Ordering::Relaxed) / 2;
                b.store(v, Ordering::Relaxed);
                kept += v;
            }
            self.total.store(kept, Ordering::Relaxed);
        }
    }

    /// The `p`-th percentile (1–99) in milliseconds (its bucket's upper bound); `None` with
    /// fewer than [`QUANTILE_MIN_SAMPLES`] samples.
    pub fn percentile_ms(&self, p: u8) -> Option<f64> {
        let counts: [u32; QUANTILE_BUCKETS] =
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total < u64::from(QUANTILE_MIN_SAMPLES) {
            return None;
        }
        let rank = (total * u64::from(p.min(100))).div_ceil(100).max(1);
        let mut seen = 0u64;
        for (i, &c) in counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(bucket_bound_ms(i));
            }
        }
        Some(bucket_bound_ms(QUANTILE_BUCKETS - 1))
    }
}

#[cfg(test)]
mod quantile_tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_samples_within_a_bucket() {
        let q = Quantiles::default();
        assert_eq!(q.percentile_ms(90), None, "no record, no percentile");
        for _ in 0..90 {
            q.observe(100.0);
        }
        for _ in 0..10 {
            q.observe(2_000.0);
        }
        let p50 = q.percentile_ms(50).expect("p50");
        assert!((100.0..=125.0).contains(&p50), "p50 {p50}");
        let p90 = q.percentile_ms(90).expect("p90");
        assert!((100.0..=125.0).contains(&p90), "p90 {p90}");
        let p95 = q.percentile_ms(95).expect("p95");
        assert!((2_000.0..=2_500.0).contains(&p95), "p95 {p95}");
    }

    #[test]
    fn old_samples_fade() {
        let q = Quantiles::default();
        for _ in 0..400 {
            q.observe(3_000.0);
        }
        // A long run of fast answers outweighs the slow past once it has been halved.
        for _ in 0..2_000 {
            q.observe(50.0);
        }
        let p90 = q.percentile_ms(90).expect("p90");
        assert!(p90 < 100.0, "p90 {p90}");
    }
}
