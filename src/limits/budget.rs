//! Spend against a budget over a UTC calendar period (`day`, `week` from Monday, `month`,
//! `total`), lock-free: the period's index and the spend in it, micro-USD, in one `AtomicU64`
//! pair updated with a compare-and-swap when the period turns over.
//!
//! Across replicas (`state`) a spend also holds what of it the shared store was told (`pushed`)
//! and what the other replicas spent in the same period (`others`), both set by the state
//! sync only; the spend a budget is checked against is the sum.

use std::sync::atomic::{AtomicU64, Ordering};

use time::{Date, OffsetDateTime};

use crate::config::{BudgetConfig, BudgetPeriod, Price};

const DAY: u64 = 86_400;
/// The `Retry-After` of a `total` budget, which never resets (DESIGN §8).
const TOTAL_RETRY_AFTER: u64 = 3_600;

/// The Julian day `time` numbers 1970-01-01 with.
const EPOCH_JULIAN_DAY: i32 = OffsetDateTime::UNIX_EPOCH.date().to_julian_day();

/// The UTC date of `day` (days since 1970-01-01); `None` outside the years `time` names
/// (±9999).
fn date_of_day(day: i64) -> Option<Date> {
    let julian = i32::try_from(day.checked_add(i64::from(EPOCH_JULIAN_DAY))?).ok()?;
    Date::from_julian_day(julian).ok()
}

/// The UTC calendar month containing `day` (days since 1970-01-01): its index (year × 12 +
/// month), its first day and the first day of the next. `None` past 9999-12-31, the last date
/// `time` names (no clock reads that).
fn month_of(day: u64) -> Option<(u64, u64, u64)> {
    let date = date_of_day(i64::try_from(day).ok()?)?;
    let first = day - u64::from(date.day() - 1);
    let next = first + u64::from(date.month().length(date.year()));
    let index = u64::try_from(date.year()).ok()? * 12 + u64::from(u8::from(date.month()));
    Some((index, first, next))
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
        // Past 9999 (see `month_of`) the month never ends.
        BudgetPeriod::Month => match month_of(day) {
            Some((index, _, next)) => (index, Some(next * DAY)),
            None => (u64::MAX, None),
        },
        BudgetPeriod::Total => (0, None),
    }
}

/// The first day (days since 1970-01-01) of the period containing `now_s` (0 for `total`).
pub fn period_start_day(period: BudgetPeriod, now_s: u64) -> u64 {
    let day = now_s / DAY;
    match period {
        BudgetPeriod::Day => day,
        BudgetPeriod::Week => day - (day + 3) % 7,
        BudgetPeriod::Month => month_of(day).map_or(day, |(_, first, _)| first),
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

    /// Add `micro_usd` the shared store already holds (reserved there by a check-and-add):
    /// counted here, and never pushed again by the sync.
    pub fn add_pushed(&self, period: BudgetPeriod, now_s: u64, micro_usd: u64) {
        self.turn(period_of(period, now_s).0);
        self.micro_usd.fetch_add(micro_usd, Ordering::AcqRel);
        self.pushed.fetch_add(micro_usd, Ordering::AcqRel);
    }

    /// Take back `micro_usd` added at `at_s` (a reservation the answer proved too large, or
    /// an attempt that cost nothing), if its period is still the current one. What the store
    /// already held of it is taken back there by the next sync.
    pub fn sub(&self, period: BudgetPeriod, at_s: u64, micro_usd: u64) {
        if self.period.load(Ordering::Acquire) != period_of(period, at_s).0 {
            return;
        }
        let _ = self
            .micro_usd
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(micro_usd))
            });
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
    /// the last push (negative when a reservation was given back; marked pushed by
    /// [`commit`](Self::commit) once the store has it).
    #[allow(clippy::cast_possible_wrap)]
    pub fn pending(&self, period: BudgetPeriod, now_s: u64) -> (u64, i64) {
        let (index, _) = period_of(period, now_s);
        self.turn(index);
        let spent = self.micro_usd.load(Ordering::Acquire);
        let pushed = self.pushed.load(Ordering::Acquire);
        (index, spent as i64 - pushed as i64)
    }

    /// The store took `delta` of period `index` (from [`pending`](Self::pending)).
    pub fn commit(&self, index: u64, delta: i64) {
        if self.period.load(Ordering::Acquire) == index {
            let _ = self
                .pushed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    Some(v.saturating_add_signed(delta))
                });
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
    use time::macros::date;

    use super::*;

    /// 2026-12-01T12:00:00Z, a Tuesday.
    const NOW: u64 = 1_796_126_400;

    /// Days since 1970-01-01 of `date`.
    fn day_of(date: Date) -> u64 {
        u64::try_from(date.to_julian_day() - EPOCH_JULIAN_DAY).expect("after 1970")
    }

    #[test]
    fn periods_end_on_the_utc_calendar() {
        assert_eq!(date_of_day((NOW / DAY) as i64), Some(date!(2026 - 12 - 01)));
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
        let feb = day_of(date!(2028 - 02 - 10)) * DAY;
        assert_eq!(
            period_of(BudgetPeriod::Month, feb).1,
            Some(day_of(date!(2028 - 03 - 01)) * DAY)
        );
        for days in [-1000_i64, 0, 59, 365, 20_000, 60_000] {
            let date = date_of_day(days).expect("in range");
            assert_eq!(i64::from(date.to_julian_day() - EPOCH_JULIAN_DAY), days);
        }
    }

    #[test]
    fn a_month_past_what_time_names_never_ends() {
        let last = day_of(Date::MAX);
        assert_eq!(
            period_of(BudgetPeriod::Month, last * DAY).1,
            Some((last + 1) * DAY)
        );
        let past = (last + 1) * DAY;
        assert_eq!(period_of(BudgetPeriod::Month, past), (u64::MAX, None));
        assert_eq!(
            seconds_to_reset(BudgetPeriod::Month, past),
            TOTAL_RETRY_AFTER
        );
        assert_eq!(period_start_day(BudgetPeriod::Month, past), last + 1);
    }

    proptest::proptest! {
        /// Month periods through `time` agree with the civil-date formulas they replaced, from
        /// 1970 to 9999.
        #[test]
        fn months_agree_with_the_civil_formulas(now_s in 0u64..253_402_300_800) {
            use crate::rfc3339::hinnant::{civil_from_days, days_from_civil};
            let day = now_s / DAY;
            #[allow(clippy::cast_possible_wrap)]
            let (y, m, _) = civil_from_days(day as i64);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            #[allow(clippy::cast_sign_loss)]
            let (start, end) = (
                days_from_civil(y, m, 1) as u64,
                days_from_civil(ny, nm, 1) as u64 * DAY,
            );
            #[allow(clippy::cast_sign_loss)]
            let index = y as u64 * 12 + u64::from(m);
            proptest::prop_assert_eq!(period_of(BudgetPeriod::Month, now_s), (index, Some(end)));
            proptest::prop_assert_eq!(period_start_day(BudgetPeriod::Month, now_s), start);
            proptest::prop_assert_eq!(
                seconds_to_reset(BudgetPeriod::Month, now_s),
                (end - now_s).max(1)
            );
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
