//! Spend against a budget over a UTC calendar period (`day`, `week` from Monday, `month`,
//! `total`), lock-free: the period's index and the spend in it, micro-USD, in one `AtomicU64`
//! pair updated with a compare-and-swap when the period turns over.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{BudgetConfig, BudgetPeriod, Price};

const DAY: u64 = 86_400;
/// The `Retry-After` of a `total` budget, which never resets (DESIGN §8).
const TOTAL_RETRY_AFTER: u64 = 3_600;

/// Days since 1970-01-01 as (year, month 1–12, day 1–31): Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
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

/// Seconds until the period containing `now_s` ends (`Retry-After` for a spent budget).
pub fn seconds_to_reset(period: BudgetPeriod, now_s: u64) -> u64 {
    match period_of(period, now_s).1 {
        Some(end) => end.saturating_sub(now_s).max(1),
        None => TOTAL_RETRY_AFTER,
    }
}

/// The cost of an answer in micro-USD: a price per million tokens is a price in micro-USD per
/// token.
pub fn cost_micro_usd(price: &Price, prompt_tokens: u64, completion_tokens: u64) -> u64 {
    #[allow(clippy::cast_precision_loss)]
    let usd_micro = prompt_tokens as f64 * price.input_per_mtok
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
}

impl Spend {
    /// Micro-USD spent in the period containing `now_s`.
    pub fn spent(&self, period: BudgetPeriod, now_s: u64) -> u64 {
        let (index, _) = period_of(period, now_s);
        if self.period.load(Ordering::Acquire) == index {
            self.micro_usd.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// Add `micro_usd` at `now_s`, starting a fresh period when it has turned over.
    pub fn add(&self, period: BudgetPeriod, now_s: u64, micro_usd: u64) {
        let (index, _) = period_of(period, now_s);
        let seen = self.period.load(Ordering::Acquire);
        if seen != index
            && self
                .period
                .compare_exchange(seen, index, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // This adder turned the period over: the old period's spend is gone.
            self.micro_usd.store(0, Ordering::Release);
        }
        self.micro_usd.fetch_add(micro_usd, Ordering::AcqRel);
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
}
