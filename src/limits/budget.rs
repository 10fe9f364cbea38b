//! Spend against a budget over a UTC calendar period (`day`, `week` from Monday, `month`,
//! `total`), lock-free: the period's index and the spend in it, micro-USD, in one `AtomicU64`
//! pair updated with a compare-and-swap when the period turns over.
//!
//! Across replicas (`state`) a spend also holds what of it the shared store was told (`pushed`)
//! and what the other replicas spent in the same period (`others`), both set by the state
//! sync only; the spend a budget is checked against is the sum.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{BudgetConfig, BudgetPeriod, Price};

const DAY: u64 = 86_400;
/// The `Retry-After` of a `total` budget, which never resets (DESIGN §8).
const TOTAL_RETRY_AFTER: u64 = 3_600;

/// Days since 1970-01-01 as (year, month 1–12, day 1–31): Howard Hinnant's `civil_from_days`.
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The inverse: (year, month, day) to days since 1970-01-01.
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The period containing `now_s` (unix seconds): its index (comparable within one kind of
/// period) and when it ends (unix seconds; `None` for `total`).
pub fn period_of(period: BudgetPeriod, now_s: u64) -> (u64, Option<u64>) {
    let day = now_s / DAY;
    match period {
        BudgetPeriod::Day => (day, Some((day + 1) * DAY)),
        BudgetPeriod::Week => {
            // 1970-01-01 was a Thursday: Monday-based weekday = (day + 3) % 7.
            let start = day - (day + 3) % 7;
            (start, Some((start + 7) * DAY))
        }
        BudgetPeriod::Month => {
            #[allow(clippy::cast_possible_wrap)]
            let (y, m, _) = civil_from_days(day as i64);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            #[allow(clippy::cast_sign_loss)]
            let end = days_from_civil(ny, nm, 1) as u64 * DAY;
            #[allow(clippy::cast_sign_loss)]
            (y as u64 * 12 + u64::from(m), Some(end))
        }
        BudgetPeriod::Total => (0, None),
    }
}

/// The first day (days since 1970-01-01) of the period containing `now_s` (0 for `total`).
pub fn period_start_day(period: BudgetPeriod, now_s: u64) -> u64 {
    let day = now_s / DAY;
    match period {
        BudgetPeriod::Day => day,
        BudgetPeriod::Week => day - (day + 3) % 7,
        BudgetPeriod::Month => {
            #[allow(clippy::cast_possible_wrap)]
            let (y, m, _) = civil_from_days(day as i64);
            #[allow(clippy::cast_sign_loss)]
            let start = days_from_civil(y, m, 1) as u64;
            start
        }
        BudgetPeriod::Total => 0,
    }
}

/// Seconds until the period containing `now_s` ends (`Retry-After` for a spent budget).
pub fn seconds_to_reset(period: BudgetPeriod, now_s: u64) -> u64 {
    match period_of(period, now_s).1 {
        Some(end) => end.saturating_sub(now_s).max(1),
        None => TOTAL_RETRY_AFTER,
    }
}

/// The cost of an answer in micro-USD: a price per million tokens is a price in micro-USD per
/// token. `cached_tokens` are the part of `prompt_tokens` the provider read from its prompt
/// cache, billed at the cached-input price where the deployment has one.
pub fn cost_micro_usd(
    price: &Price,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
) -> u64 {
    let cached = cached_tokens.min(prompt_tokens);
    let cached_price = price.cached_input_per_mtok.unwrap_or(price.input_per_mtok);
    #[allow(clippy::cast_precision_loss)]
    let usd_micro = (prompt_tokens - cached) as f64 * price.input_per_mtok
        + cached as f64 * cached_price
        + completion_tokens as f64 * price.output_per_mtok;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let out = usd_micro.round().max(0.0) as u64;
    out
}

/// The spend of one budget in its current period.
#[derive(Debug, Default)]
pub struct Spend {
    /// The period index the spend belongs to.
    period: AtomicU64,
    micro_usd: AtomicU64,
    /// Of `micro_usd`, what the shared store holds.
    pushed: AtomicU64,
    /// What the other replicas spent in the period, as of the last sync.
    others: AtomicU64,
}

impl Spend {
    /// Micro-USD spent in the period containing `now_s`.
    pub fn spent(&self, period: BudgetPeriod, now_s: u64) -> u64 {
        let (index, _) = period_of(period, now_s);
        if self.period.load(Ordering::Acquire) == index {
            self.micro_usd
                .load(Ordering::Relaxed)
                .saturating_add(self.others.load(Ordering::Relaxed))
        } else {
            0
        }
    }

    /// Add `micro_usd` at `now_s`, starting a fresh period when it has turned over.
    pub fn add(&self, period: BudgetPeriod, now_s: u64, micro_usd: u64) {
        self.turn(period_of(period, now_s).0);
        self.micro_usd.fetch_add(micro_usd, Ordering::AcqRel);
    }

    /// Make `index` the current period; the old period's counts are gone.
    fn turn(&self, index: u64) {
        let seen = self.period.load(Ordering::Acquire);
        if seen != index
            && self
                .period
                .compare_exchange(seen, index, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.micro_usd.store(0, Ordering::Release);
            self.pushed.store(0, Ordering::Release);
            self.others.store(0, Ordering::Release);
        }
    }

    /// For the state sync: the current period's index and what this replica spent in it since
    /// the last push (marked pushed by [`commit`](Self::commit) once the store has it).
    pub fn pending(&self, period: BudgetPeriod, now_s: u64) -> (u64, u64) {
        let (index, _) = period_of(period, now_s);
        self.turn(index);
        let spent = self.micro_usd.load(Ordering::Acquire);
        (
            index,
            spent.saturating_sub(self.pushed.load(Ordering::Acquire)),
        )
    }

    /// The store took `delta` of period `index` (from [`pending`](Self::pending)).
    pub fn commit(&self, index: u64, delta: u64) {
        if self.period.load(Ordering::Acquire) == index {
            self.pushed.fetch_add(delta, Ordering::AcqRel);
        }
    }

    /// For the state sync: the period's spend as the shared store holds it (every replica's
    /// pushes); what is not this replica's becomes the others' spend.
    pub fn set_shared(&self, index: u64, total: u64) {
        self.turn(index);
        let mine = self.pushed.load(Ordering::Acquire);
        self.others
            .store(total.saturating_sub(mine), Ordering::Release);
    }

    /// The shared store is unreachable: only this replica's spend holds until it is back.
    pub fn clear_shared(&self) {
        self.others.store(0, Ordering::Release);
    }

    /// The shared store already holds everything counted here: a replica that rebuilt its
    /// spend from the ledger joins a store that lived on.
    pub fn assume_pushed(&self) {
        let spent = self.micro_usd.load(Ordering::Acquire);
        self.pushed.store(spent, Ordering::Release);
    }

    /// The shared store lost what it held (a restarted Redis): push all of it again.
    pub fn forget_pushed(&self) {
        self.pushed.store(0, Ordering::Release);
    }

    /// Whether the budget is spent at `now_s`: `Err(seconds until it resets)` when it is.
    pub fn check(&self, budget: &BudgetConfig, now_s: u64) -> Result<(), u64> {
        if self.spent(budget.period, now_s) >= budget.micro_usd {
            Err(seconds_to_reset(budget.period, now_s))
        } else {
            Ok(())
        }
    }

    /// The share of the budget spent, in percent (for `budget.used_pct` conditions).
    #[allow(clippy::cast_precision_loss)]
    pub fn used_pct(&self, budget: &BudgetConfig, now_s: u64) -> f64 {
        100.0 * self.spent(budget.period, now_s) as f64 / budget.micro_usd.max(1) as f64
    }

    /// What is left, in USD (for `budget.remaining_usd` conditions).
    #[allow(clippy::cast_precision_loss)]
    pub fn remaining_usd(&self, budget: &BudgetConfig, now_s: u64) -> f64 {
        budget
            .micro_usd
            .saturating_sub(self.spent(budget.period, now_s)) as f64
            / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T12:00:00Z, a Tuesday.
    const NOW: u64 = 1_796_126_400;

    #[test]
    fn periods_end_on_the_utc_calendar() {
        assert_eq!(civil_from_days((NOW / DAY) as i64), (2026, 12, 1));
        assert_eq!(seconds_to_reset(BudgetPeriod::Day, NOW), 12 * 3_600);
        // The week ends next Monday 00:00 UTC: the rest of Tuesday and four more days.
        assert_eq!(
            seconds_to_reset(BudgetPeriod::Week, NOW),
            5 * DAY + 12 * 3_600
        );
        // December has 31 days: 30 days and 12 hours to 2027-01-01.
        assert_eq!(
            seconds_to_reset(BudgetPeriod::Month, NOW),
            30 * DAY + 12 * 3_600
        );
        assert_eq!(seconds_to_reset(BudgetPeriod::Total, NOW), 3_600);
        let today = NOW / DAY;
        assert_eq!(period_start_day(BudgetPeriod::Day, NOW), today);
        assert_eq!(
            period_start_day(BudgetPeriod::Week, NOW),
            today - 1,
            "Monday"
        );
        assert_eq!(period_start_day(BudgetPeriod::Month, NOW), today, "the 1st");
        assert_eq!(period_start_day(BudgetPeriod::Month, NOW + 5 * DAY), today);
        assert_eq!(period_start_day(BudgetPeriod::Total, NOW), 0);
        // February in a leap year.
        let feb = days_from_civil(2028, 2, 10) as u64 * DAY;
        assert_eq!(
            period_of(BudgetPeriod::Month, feb).1,
            Some(days_from_civil(2028, 3, 1) as u64 * DAY)
        );
        for days in [-1000_i64, 0, 59, 365, 20_000, 60_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn spend_resets_when_the_period_turns() {
        let budget = BudgetConfig {
            micro_usd: 1_000,
            period: BudgetPeriod::Day,
        };
        let s = Spend::default();
        s.add(budget.period, NOW, 600);
        assert!(s.check(&budget, NOW).is_ok());
        s.add(budget.period, NOW + 60, 400);
        assert_eq!(s.check(&budget, NOW + 60), Err(12 * 3_600 - 60));
        assert!((s.used_pct(&budget, NOW) - 100.0).abs() < 1e-9);
        // The next day: a fresh period.
        assert!(s.check(&budget, NOW + DAY).is_ok());
        s.add(budget.period, NOW + DAY, 100);
        assert_eq!(s.spent(budget.period, NOW + DAY), 100);
        assert!((s.remaining_usd(&budget, NOW + DAY) - 0.0009).abs() < 1e-12);
    }

    #[test]
    fn shared_spend_counts_the_other_replicas_in_the_same_period() {
        let budget = BudgetConfig {
            micro_usd: 1_000,
            period: BudgetPeriod::Day,
        };
        let s = Spend::default();
        s.add(budget.period, NOW, 300);
        assert_eq!(s.pending(budget.period, NOW), (NOW / DAY, 300));
        s.commit(NOW / DAY, 300);
        assert_eq!(s.pending(budget.period, NOW), (NOW / DAY, 0));
        // The store holds 900: 600 of it from elsewhere.
        s.set_shared(NOW / DAY, 900);
        assert_eq!(s.spent(budget.period, NOW), 900);
        s.add(budget.period, NOW, 100);
        assert_eq!(s.check(&budget, NOW), Err(12 * 3_600));
        s.clear_shared();
        assert_eq!(s.spent(budget.period, NOW), 400);
        // The store lost everything: push all of ours again.
        s.forget_pushed();
        assert_eq!(s.pending(budget.period, NOW), (NOW / DAY, 400));
        s.assume_pushed();
        assert_eq!(s.pending(budget.period, NOW), (NOW / DAY, 0));
        // A new day: the others' spend of yesterday is gone with ours.
        s.set_shared(NOW / DAY, 1_000);
        assert_eq!(s.pending(budget.period, NOW + DAY), (NOW / DAY + 1, 0));
        assert_eq!(s.spent(budget.period, NOW + DAY), 0);
        s.set_shared(NOW / DAY + 1, 50);
        assert_eq!(s.spent(budget.period, NOW + DAY), 50);
    }
}
