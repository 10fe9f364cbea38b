//! Time for health logic, injectable so every breaker and window test is deterministic.
//!
//! Health state stores instants as milliseconds on a monotonic clock (so they fit in an
//! `AtomicU64`); `0` means "never". [`SystemClock`] counts from process start (plus one, so
//! its first reading is not `0`); [`ManualClock`] only moves when a test moves it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub trait Clock: Send + Sync + 'static {
    /// Monotonic milliseconds; never `0`.
    fn now_ms(&self) -> u64;
    /// Wall-clock time, for HTTP dates (`Retry-After`) and display.
    fn wall(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    ms: AtomicU64,
    wall_base: SystemTime,
}

impl ManualClock {
    pub fn new() -> Self {
        Self {
            ms: AtomicU64::new(1_000),
            wall_base: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        }
    }

    pub fn advance(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::SeqCst)
    }
    fn wall(&self) -> SystemTime {
        self.wall_base + Duration::from_millis(self.now_ms())
    }
}

/// Milliseconds of a duration, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
