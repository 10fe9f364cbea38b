//! Periodic background work: one pass every interval until shutdown. The DNS refresher and
//! the active prober share this loop; the ranker, which also wakes on breaker transitions and
//! cooldown ends, has its own.

use std::future::Future;
use std::time::Duration;

use pingora_core::server::ShutdownWatch;

/// Run `pass` every `interval` (the first pass one interval from now: startup already did the
/// work once) until the server shuts down. A pass that overruns delays the next tick rather
/// than bunching ticks up.
pub async fn every<F, Fut>(interval: Duration, shutdown: &mut ShutdownWatch, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => pass().await,
        }
    }
}
