//! Timeouts that cost nothing when what they bound is ready at once.
//!
//! `tokio::time::timeout` reads the clock and makes its timer entry (the runtime's handle,
//! an `Arc` cloned and dropped) when it is called, before it polls what it bounds. On the
//! request path what it bounds usually is ready on the first poll: the body came with the
//! head, the provider's answer with its header, the request fits the socket's buffer. Four
//! such timeouts were four clock reads and timer entries per request for nothing (issue 22).
//! [`within`] polls first and starts its timer only when the bounded future waits: the limit
//! then runs from that first wait, a few microseconds later than tokio's, which no limit
//! measured in seconds can tell apart.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::task::{unconstrained, Unconstrained};
use tokio::time::Instant;

/// The limit passed before the bounded future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

/// `future`, bounded by `limit` from the first time it waits (see the module doc).
// Plain functions returning the bounding future: an `async fn` wrapper would move `future`
// once more, into its own state.
pub fn within<F: Future>(
    limit: Duration,
    future: F,
) -> impl Future<Output = Result<F::Output, TimedOut>> {
    bounded(future, move || tokio::time::sleep(limit))
}

/// `future`, bounded by `deadline` (its timer made only if it waits).
pub fn within_at<F: Future>(
    deadline: Instant,
    future: F,
) -> impl Future<Output = Result<F::Output, TimedOut>> {
    bounded(future, move || tokio::time::sleep_until(deadline))
}

async fn bounded<F: Future>(
    future: F,
    timer_for: impl Fn() -> tokio::time::Sleep,
) -> Result<F::Output, TimedOut> {
    let mut future = pin!(future);
    let mut timer = pin!(None::<Unconstrained<tokio::time::Sleep>>);
    poll_fn(|cx| {
        if let Poll::Ready(out) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if timer.is_none() {
            // Outside the task's cooperative budget, as tokio's own timeout polls its timer
            // when the bounded future used the budget up: a future that always does cannot
            // keep the limit from firing.
            timer.set(Some(unconstrained(timer_for())));
        }
        match timer.as_mut().as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(TimedOut)),
            _ => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_ready_future_is_not_timed() {
        assert_eq!(within(Duration::ZERO, async { 7 }).await, Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_future_is_cut_at_the_limit() {
        let started = tokio::time::Instant::now();
        let never = std::future::pending::<()>();
        assert_eq!(within(Duration::from_secs(5), never).await, Err(TimedOut));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_kept_from_before_the_first_wait() {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(3);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let never = std::future::pending::<()>();
        assert_eq!(within_at(deadline, never).await, Err(TimedOut));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        // A deadline already past: a ready future is still answered, a waiting one cut.
        assert_eq!(within_at(started, async { 1 }).await, Ok(1));
        let never = std::future::pending::<()>();
        assert_eq!(within_at(started, never).await, Err(TimedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_that_ends_in_time_is_answered() {
        let slow = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            "done"
        };
        assert_eq!(within(Duration::from_secs(5), slow).await, Ok("done"));
    }
}
