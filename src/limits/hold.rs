//! Reservations: what exact shared admission added to a window or a budget before the answer
//! was known (the request's estimated tokens, its estimated cost), given back when nothing was
//! used and settled to what the answer used when it arrives. Both the local counter and the
//! shared store hold a reservation; giving it back locally makes the sync's next delta
//! negative, so the store gives it back too.

use super::budget::Spend;
use super::window::Window;
use crate::config::BudgetPeriod;

/// An amount reserved at a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    pub at_s: u64,
    pub amount: u64,
}

impl Reserved {
    /// Give the reservation back to a window: nothing of it was used.
    pub fn release_window(self, window: &Window) {
        window.sub(self.at_s, self.amount);
    }

    /// Settle a window's reservation to what was used (`None`: unknown, the estimate stands).
    pub fn settle_window(self, window: &Window, now_s: u64, used: Option<u64>) {
        match used {
            Some(used) if used < self.amount => window.sub(self.at_s, self.amount - used),
            Some(used) => window.add(now_s, used - self.amount),
            None => {}
        }
    }

    /// Give the reservation back to a budget's spend: nothing was spent.
    pub fn release_spend(self, spend: &Spend, period: BudgetPeriod) {
        spend.sub(period, self.at_s, self.amount);
    }

    /// Settle a budget's reservation to what was spent (`None`: unknown, the estimate stands).
    pub fn settle_spend(self, spend: &Spend, period: BudgetPeriod, now_s: u64, spent: Option<u64>) {
        match spent {
            Some(spent) if spent < self.amount => {
                spend.sub(period, self.at_s, self.amount - spent);
            }
            Some(spent) => spend.add(period, now_s, spent - self.amount),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_settles_to_what_was_used() {
        let w = Window::default();
        w.add(100, 50);
        let r = Reserved {
            at_s: 100,
            amount: 50,
        };
        r.settle_window(&w, 101, Some(20));
        assert_eq!(w.used(101), 20);
        let w2 = Window::default();
        w2.add(100, 50);
        r.settle_window(&w2, 101, Some(70));
        assert_eq!(w2.used(101), 70);
        r.settle_window(&w2, 101, None);
        assert_eq!(w2.used(101), 70, "unknown usage: the estimate stands");

        let s = Spend::default();
        let day = BudgetPeriod::Day;
        s.add_pushed(day, 100, 1_000);
        r.release_spend(&s, day);
        assert_eq!(s.spent(day, 100), 950);
        Reserved {
            at_s: 100,
            amount: 950,
        }
        .settle_spend(&s, day, 100, Some(400));
        assert_eq!(s.spent(day, 100), 400);
        let (_, delta) = s.pending(day, 100);
        assert_eq!(
            delta, -600,
            "the store is told to give back what was released"
        );
    }
}
