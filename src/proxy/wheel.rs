//! Attempt deadlines on a shared coarse timer: 10 ms buckets, fired by one thread.
//!
//! Every attempt is bounded by its first-content deadline, and its answer nearly always comes
//! first, so what such a bound costs is its setup and teardown. Pingora's fast timer (which
//! this mirrors: the same resolution, the same buckets fired by a thread that wakes every
//! 10 ms) spends ~500 instructions registering each one: a read lock on a thread's map, a
//! `BTreeMap` lookup, 128-bit arithmetic, two `Arc` clones and a boxed future, then as much
//! again on its teardown (issue 22). tokio's own timer is no cheaper per entry, and an entry
//! earlier than the driver's next wake-up writes to its eventfd (a syscall per request).
//!
//! Here a worker thread keeps the last few buckets it joined: attempts it starts in the same
//! 10 ms with the same window share one (an `Arc` clone); a new bucket (about one per 10 ms
//! per thread per window) is sent to the firing thread over a channel. No lock is taken. A bucket
//! fires no earlier than its deadline and at most one resolution (plus the thread's scheduling)
//! after it, as Pingora's. Waiting on a bucket is a `Notify` waiter, removed when the bounded
//! future ends (a waiter never keeps a finished request's task alive). Buckets live until they
//! fire, about one per 10 ms per window, as Pingora's do.
//!
//! [`until`] polls the bounded future first: a future that is ready at once never touches the
//! wheel. Tests drive a wheel of their own by hand ([`Firer::fire_through`]): no sleeping.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// The wheel's resolution: a bucket's span.
pub const RESOLUTION: Duration = Duration::from_millis(10);
const NANOS_PER_TICK: u64 = 10_000_000;
const TICKS_PER_SEC: u64 = 1_000_000_000 / NANOS_PER_TICK;

/// The deadline passed before the bounded future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// The deadlines that end in one tick.
#[derive(Debug, Default)]
struct Bucket {
    fired: AtomicBool,
    /// Shared with the waiters a poll function keeps ([`Deadline`]).
    notify: Arc<Notify>,
}

/// Where buckets are joined: ticks counted in [`RESOLUTION`]s from `zero`. New buckets go to
/// the [`Firer`] over a channel (lock-free: no worker waits on another or on the firer).
#[derive(Debug)]
pub struct Wheel {
    zero: Instant,
    joins: mpsc::Sender<(u64, Arc<Bucket>)>,
    /// Every tick up to this one has fired (0: none has; a bucket's tick is at least 1).
    fired_through: AtomicU64,
}

/// What fires a wheel's buckets: the buckets it was sent, by tick.
#[derive(Debug)]
pub struct Firer {
    joins: mpsc::Receiver<(u64, Arc<Bucket>)>,
    by_tick: BTreeMap<u64, Vec<Arc<Bucket>>>,
}

impl Wheel {
    /// A wheel, and what fires it (the process's runs on its own thread: [`global`]).
    pub fn new() -> (Self, Firer) {
        let (joins, received) = mpsc::channel();
        let wheel = Self {
            zero: Instant::now(),
            joins,
            fired_through: AtomicU64::new(0),
        };
        let firer = Firer {
            joins: received,
            by_tick: BTreeMap::new(),
        };
        (wheel, firer)
    }

    /// Whole ticks from `zero` to `at` (none before it).
    fn ticks_to(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.zero);
        // In 64 bits (`as_millis` is a u128, and its division a library call).
        d.as_secs()
            .saturating_mul(TICKS_PER_SEC)
            .saturating_add(u64::from(d.subsec_nanos()) / NANOS_PER_TICK)
    }

    /// The tick a deadline's bucket fires at: the first tick boundary after it.
    fn tick_for(&self, deadline: Instant) -> u64 {
        self.ticks_to(deadline).saturating_add(1)
    }

    /// A new bucket firing at `tick`, sent to the firer; one already over if that tick fired.
    /// (A bucket sent just as its tick fires is fired at the firer's next turn: one resolution
    /// late at most.)
    fn join(&self, tick: u64) -> Arc<Bucket> {
        let bucket = Arc::new(Bucket::default());
        if tick <= self.fired_through.load(Ordering::Acquire) {
            bucket.fired.store(true, Ordering::SeqCst);
        } else {
            // The firer outlives the wheel's users (the process's runs for good).
            let _ = self.joins.send((tick, bucket.clone()));
        }
        bucket
    }
}

impl Firer {
    /// Fire every bucket of `wheel` whose tick is `tick` or earlier; how many fired.
    pub fn fire_through(&mut self, wheel: &Wheel, tick: u64) -> usize {
        while let Ok((at, bucket)) = self.joins.try_recv() {
            self.by_tick.entry(at).or_default().push(bucket);
        }
        let later = self.by_tick.split_off(&tick.saturating_add(1));
        let due = std::mem::replace(&mut self.by_tick, later);
        let mut fired = 0;
        for bucket in due.values().flatten() {
            // Set before waking: a waiter enabled after the wake sees the flag.
            bucket.fired.store(true, Ordering::SeqCst);
            bucket.notify.notify_waiters();
            fired += 1;
        }
        wheel.fired_through.fetch_max(tick, Ordering::Release);
        fired
    }
}

/// The process's wheel, and whether its thread runs (`None`: it could not be started, and
/// deadlines fall back to tokio's timer). Started at the first wait, on a request: after
/// Pingora's daemonizing fork, which a thread started before it would not survive.
pub fn global() -> Option<&'static Wheel> {
    static WHEEL: OnceLock<Option<Wheel>> = OnceLock::new();
    WHEEL
        .get_or_init(|| {
            let (wheel, mut firer) = Wheel::new();
            let started = std::thread::Builder::new()
                .name("signalbox-deadlines".into())
                .spawn(move || loop {
                    std::thread::sleep(RESOLUTION);
                    if let Some(wheel) = global() {
                        firer.fire_through(wheel, wheel.ticks_to(Instant::now()));
                    }
                });
            match started {
                Ok(_) => Some(wheel),
                Err(e) => {
                    tracing::error!(error = %e, "the deadline thread did not start: attempt deadlines use tokio's timer");
                    None
                }
            }
        })
        .as_ref()
}

/// How many buckets a thread keeps: one per window its attempts use (a stream's first-chunk
/// hold, a whole answer's `ttfb_timeout`, a policy's own), a few at once.
const KEPT: usize = 4;

thread_local! {
    /// The buckets this thread joined last, the newest replacing the oldest.
    static JOINED: RefCell<([Option<Joined>; KEPT], usize)> =
        const { RefCell::new(([const { None }; KEPT], 0)) };
}

/// A bucket a thread joined: its wheel's address, the deadlines it holds (`[from, to)`: a
/// deadline in it needs no tick worked out), and the bucket.
struct Joined {
    wheel: usize,
    from: Instant,
    to: Instant,
    bucket: Arc<Bucket>,
}

/// The bucket for `deadline` on `wheel`: one this thread joined, when its tick is the same.
fn bucket_for(wheel: &Wheel, deadline: Instant) -> Arc<Bucket> {
    let id = std::ptr::from_ref(wheel) as usize;
    JOINED.with(|joined| {
        let (kept, next) = &mut *joined.borrow_mut();
        let held = kept
            .iter()
            .flatten()
            .find(|j| j.wheel == id && j.from <= deadline && deadline < j.to);
        if let Some(j) = held {
            return j.bucket.clone();
        }
        let tick = wheel.tick_for(deadline);
        let bucket = wheel.join(tick);
        // The deadlines of this tick: the span before its boundary.
        let span = |ticks: u64| {
            Duration::from_secs(ticks / TICKS_PER_SEC)
                + Duration::from_nanos((ticks % TICKS_PER_SEC) * NANOS_PER_TICK)
        };
        // (Past what `Instant` holds, an empty span: every such deadline works its tick out.)
        let at = |ticks: u64| wheel.zero.checked_add(span(ticks)).unwrap_or(deadline);
        kept[*next] = Some(Joined {
            wheel: id,
            from: at(tick - 1),
            to: at(tick),
            bucket: bucket.clone(),
        });
        *next = (*next + 1) % KEPT;
        bucket
    })
}

/// `future`, bounded by `deadline` on the process's wheel (see the module doc).
// An `async fn`: the waiter borrows its bucket, both kept in the future's own state.
pub async fn until<F: Future>(deadline: Instant, future: F) -> Result<F::Output, Elapsed> {
    match global() {
        Some(wheel) => until_on(wheel, deadline, future).await,
        None => tokio::time::timeout_at(deadline.into(), future)
            .await
            .map_err(|_| Elapsed),
    }
}

/// `future`, bounded by `deadline` on `wheel`: polled first; a bucket is joined only if it
/// waits.
pub async fn until_on<F: Future>(
    wheel: &Wheel,
    deadline: Instant,
    future: F,
) -> Result<F::Output, Elapsed> {
    let mut future = pin!(future);
    if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await {
        return Ok(out);
    }
    let bucket = bucket_for(wheel, deadline);
    let mut waiter = pin!(bucket.notify.notified());
    let mut waker = None;
    // The future was just polled (it waits with this task's waker): the first turn only makes
    // the waiter.
    let mut polled = true;
    poll_fn(|cx| {
        if !std::mem::take(&mut polled) {
            if let Poll::Ready(out) = future.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
        }
        bucket
            .poll_waiter(waiter.as_mut(), &mut waker, cx)
            .map(|()| Err(Elapsed))
    })
    .await
}

impl Bucket {
    /// Whether the bucket fired, `waiter` (one of its `Notify`'s) waking the task when it
    /// does. The waiter is polled only when `waker` (the one it holds) is not the task's: its
    /// poll takes the `Notify`'s lock, a flag load does not. A bucket that fires after the
    /// waiter's first poll wakes it; one that fired before is seen by its flag (set before its
    /// waiters are woken).
    fn poll_waiter<W: Future<Output = ()>>(
        &self,
        waiter: Pin<&mut W>,
        waker: &mut Option<Waker>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            if waiter.poll(cx).is_ready() {
                return Poll::Ready(());
            }
            *waker = Some(cx.waker().clone());
        }
        if self.fired.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A deadline a poll function waits on (the edge's head deadline): set, then polled until it
/// passes or is set again. On the process's wheel, as [`until`]; without it, tokio's timer.
#[derive(Debug, Default)]
pub struct Deadline {
    wait: Wait,
}

#[derive(Debug, Default)]
enum Wait {
    /// Never set: never passes.
    #[default]
    Unset,
    Wheel {
        bucket: Arc<Bucket>,
        /// The waiter, made at the first poll (a deadline set but never waited on costs none).
        waiter: Option<Pin<Box<OwnedNotified>>>,
        /// The waker the waiter wakes (polled again only when the task's changed).
        waker: Option<Waker>,
    },
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

impl Deadline {
    /// Wait for `at` from here on.
    pub fn set(&mut self, at: Instant) {
        match global() {
            Some(wheel) => self.set_on(wheel, at),
            None => {
                self.wait = Wait::Tokio(Box::pin(tokio::time::sleep_until(at.into())));
            }
        }
    }

    /// [`Self::set`] on `wheel`.
    pub fn set_on(&mut self, wheel: &Wheel, at: Instant) {
        self.wait = Wait::Wheel {
            bucket: bucket_for(wheel, at),
            waiter: None,
            waker: None,
        };
    }

    /// `Ready` once the deadline passed (and from then on); until then the task is woken when
    /// it does.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.wait {
            Wait::Unset => Poll::Pending,
            Wait::Tokio(sleep) => sleep.as_mut().poll(cx),
            Wait::Wheel {
                bucket,
                waiter,
                waker,
            } => {
                let waiter =
                    waiter.get_or_insert_with(|| Box::pin(bucket.notify.clone().notified_owned()));
                bucket.poll_waiter(waiter.as_mut(), waker, cx)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Context;

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        let waker = std::task::Waker::noop();
        f.poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_ready_future_never_joins_a_bucket() {
        let (wheel, mut firer) = Wheel::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut f = pin!(until_on(&wheel, deadline, std::future::ready(7)));
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(Ok(7)));
        assert_eq!(
            firer.fire_through(&wheel, u64::MAX),
            0,
            "no bucket was made"
        );
    }

    #[test]
    fn a_waiting_future_ends_when_its_bucket_fires_and_not_before() {
        let (wheel, mut firer) = Wheel::new();
        let deadline = wheel.zero + Duration::from_millis(25);
        let mut f = pin!(until_on(&wheel, deadline, std::future::pending::<()>()));
        assert_eq!(poll_once(f.as_mut()), Poll::Pending);
        // 25 ms is in the third tick: its bucket fires at the boundary after it (30 ms).
        assert_eq!(wheel.tick_for(deadline), 3);
        assert_eq!(firer.fire_through(&wheel, 2), 0, "not before the deadline");
        assert_eq!(poll_once(f.as_mut()), Poll::Pending);
        assert_eq!(firer.fire_through(&wheel, 3), 1);
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(Err(Elapsed)));
    }

    #[test]
    fn a_future_that_finishes_first_is_answered_and_leaves_its_bucket() {
        let (wheel, mut firer) = Wheel::new();
        let deadline = wheel.zero + Duration::from_millis(5);
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut f = pin!(until_on(&wheel, deadline, rx));
        assert_eq!(poll_once(f.as_mut()), Poll::Pending);
        tx.send(3).expect("receiver alive");
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(Ok(Ok(3))));
        // The bucket fires with no one left waiting on it.
        assert_eq!(firer.fire_through(&wheel, 1), 1);
    }

    #[test]
    fn deadlines_in_one_tick_share_a_bucket_and_a_past_one_is_already_over() {
        let (wheel, mut firer) = Wheel::new();
        let a = bucket_for(&wheel, wheel.zero + Duration::from_millis(41));
        let b = bucket_for(&wheel, wheel.zero + Duration::from_millis(49));
        let c = bucket_for(&wheel, wheel.zero + Duration::from_millis(50));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&b, &c));
        // Two windows in turn (a stream's and a whole answer's) each keep their bucket.
        let g = bucket_for(&wheel, wheel.zero + Duration::from_millis(43));
        assert!(Arc::ptr_eq(&a, &g), "the 41-49 ms bucket is still kept");
        // A tick's first instant is its own (the span is `[40 ms, 50 ms)`).
        let e = bucket_for(&wheel, wheel.zero + Duration::from_millis(40));
        assert!(Arc::ptr_eq(&a, &e));
        assert_eq!(wheel.tick_for(wheel.zero + Duration::from_millis(40)), 5);
        assert!(!Arc::ptr_eq(&e, &c));
        // Another wheel's bucket of the same tick is its own.
        let (other, _other_firer) = Wheel::new();
        let d = bucket_for(&other, other.zero + Duration::from_millis(41));
        assert!(!Arc::ptr_eq(&a, &d));
        // A deadline whose bucket already fired ends at its first wait.
        firer.fire_through(&wheel, 5);
        let mut f = pin!(until_on(
            &wheel,
            wheel.zero + Duration::from_millis(45),
            std::future::pending::<()>()
        ));
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(Err(Elapsed)));
    }

    /// A waker that counts its wakes.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_waiter_wakes_the_waker_the_future_was_last_polled_with() {
        let (wheel, mut firer) = Wheel::new();
        let deadline = wheel.zero + Duration::from_millis(15);
        let mut f = pin!(until_on(&wheel, deadline, std::future::pending::<()>()));
        let first = Arc::new(Counting(0.into()));
        let second = Arc::new(Counting(0.into()));
        let (w1, w2) = (Waker::from(first.clone()), Waker::from(second.clone()));
        assert!(f.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        assert!(f.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        // Moved to another waker (another task, a combinator's own): the waiter follows it.
        assert!(f.as_mut().poll(&mut Context::from_waker(&w2)).is_pending());
        assert_eq!(firer.fire_through(&wheel, 2), 1);
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(
            second.0.load(Ordering::SeqCst),
            1,
            "the deadline wakes its waiter"
        );
        assert_eq!(
            f.as_mut().poll(&mut Context::from_waker(&w2)),
            Poll::Ready(Err(Elapsed))
        );
    }

    #[test]
    fn a_deadline_passes_when_its_bucket_fires_and_follows_its_setting() {
        let (wheel, mut firer) = Wheel::new();
        let counting = Arc::new(Counting(0.into()));
        let waker = Waker::from(counting.clone());
        let mut cx = Context::from_waker(&waker);
        let mut deadline = Deadline::default();
        assert!(
            deadline.poll(&mut cx).is_pending(),
            "never set: never passes"
        );
        deadline.set_on(&wheel, wheel.zero + Duration::from_millis(25));
        assert!(deadline.poll(&mut cx).is_pending());
        assert_eq!(firer.fire_through(&wheel, 2), 0);
        assert!(deadline.poll(&mut cx).is_pending());
        // Set later before it passed: the earlier bucket firing does not end it.
        deadline.set_on(&wheel, wheel.zero + Duration::from_millis(65));
        assert!(deadline.poll(&mut cx).is_pending());
        assert_eq!(firer.fire_through(&wheel, 3), 1);
        assert!(deadline.poll(&mut cx).is_pending());
        let woken = counting.0.load(Ordering::SeqCst);
        assert_eq!(firer.fire_through(&wheel, 7), 1);
        assert_eq!(
            counting.0.load(Ordering::SeqCst),
            woken + 1,
            "its waiter is woken"
        );
        assert!(deadline.poll(&mut cx).is_ready());
        assert!(deadline.poll(&mut cx).is_ready(), "and stays passed");
    }

    #[tokio::test]
    async fn the_process_wheel_ends_a_wait_past_its_deadline() {
        let started = Instant::now();
        let out = until(
            started + Duration::from_millis(30),
            std::future::pending::<()>(),
        )
        .await;
        assert_eq!(out, Err(Elapsed));
        assert!(
            started.elapsed() >= Duration::from_millis(30),
            "never early"
        );
    }
}
