//! Settling: an attempt's verdict applied, in one place for both drivers.
//!
//! A driver (Pingora's proxy loop, or signalbox's own) describes what the provider sent, gets
//! the [`Verdict`] from `attempt::judge`, and hands it to [`apply`], which does everything the
//! verdict implies, once: the attempt's record (what metrics, the ledger and the access line
//! read at the end), the health observation (the breaker, the credential, the half-open probe
//! slot), the request's failure log, and — for a failure — the next attempt: the same target
//! after a backoff, the plan's next target, or the caller's answer. The driver is left with
//! the [`Step`] to carry out.

use std::time::Instant;

use super::ctx::{Admitted, AttemptHold, NextTarget, RequestCtx, Served};
use super::planning::{next_target, no_target_error, plan_env};
use crate::attempt::schedule::{self, Failed};
use crate::attempt::{self, CommitAt, Next, Outcome, Scope, Sent, Terms, Verdict};
use crate::error::{ErrorCode, GatewayError};
use crate::health::{Admission, Observation};
use crate::routing::lead::splitmix64;
use crate::routing::plan::Target;
use crate::snapshot::Snapshot;

/// What the driver does next.
#[derive(Debug)]
pub enum Step {
    /// Keep reading this attempt.
    Continue,
    /// Write this attempt's answer: it is the caller's.
    Commit,
    /// The attempt is over (its answer was the caller's).
    Ended,
    /// The provider refused the caller's request: relay the refusal (the attempt is settled).
    Refuse,
    /// Another attempt: its target is in `attempts.next`.
    Again,
    /// No further attempt: answer this.
    Answer(GatewayError),
}

/// Judge what the provider sent on the live attempt (under the request's terms, committed or
/// not) and apply the verdict.
pub fn on(ctx: &mut RequestCtx, sent: Sent<'_>) -> Step {
    let verdict = judge_sent(ctx, sent);
    apply(ctx, verdict)
}

/// The verdict on what the provider sent, under the request's terms.
pub fn judge_sent(ctx: &RequestCtx, sent: Sent<'_>) -> Verdict {
    let terms = ctx.admitted.as_ref().map_or(
        Terms {
            commit_at: CommitAt::WholeBody,
            failover_on_client_error: false,
        },
        |a| a.terms,
    );
    attempt::judge(sent, terms, ctx.downstream.is_committed())
}

/// The connection could not be made: classified (a local resource running out is logged, and
/// never blamed on the provider), judged and applied.
pub fn connect_failed(ctx: &mut RequestCtx, e: &pingora_error::Error) -> Step {
    let outcome = attempt::classify_connect_error(e);
    if outcome == Outcome::LocalError {
        warn_local_resource();
    }
    on(ctx, Sent::Connect(outcome))
}

/// Log that the gateway ran out of a local resource, at most once a second (it happens in
/// bursts, under exactly the load where a log flood hurts most).
fn warn_local_resource() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(
            "cannot open an upstream connection: the gateway is out of file descriptors, ports or memory (raise LimitNOFILE / ulimit -n); providers are not blamed"
        );
    }
}

/// Apply a verdict on the live attempt.
pub fn apply(ctx: &mut RequestCtx, verdict: Verdict) -> Step {
    let RequestCtx {
        snapshot,
        admitted,
        started,
        surface,
        ..
    } = ctx;
    let Some(a) = admitted.as_mut() else {
        return Step::Answer(GatewayError::new(
            ErrorCode::Internal,
            "the gateway could not handle the request",
        ));
    };
    match verdict {
        Verdict::Pending => Step::Continue,
        Verdict::Commit => {
            a.attempts.served = a.attempts.live.as_ref().map(|l| Served {
                target: l.target,
                provider: l.provider,
                started: l.started,
                header_at: l.header_at,
            });
            Step::Commit
        }
        Verdict::Ended(outcome) => {
            settle(snapshot, a, outcome, Held::Served);
            Step::Ended
        }
        Verdict::Refuse { .. } => {
            if a.attempts.served.is_none() {
                a.attempts.served = a.attempts.live.as_ref().map(|l| Served {
                    target: l.target,
                    provider: l.provider,
                    started: l.started,
                    header_at: l.header_at,
                });
            }
            settle(snapshot, a, Outcome::ClientError, Held::Released);
            Step::Refuse
        }
        Verdict::Retry { outcome, scope } => {
            let failed = a.attempts.live.as_ref().map(|l| {
                (
                    l.target,
                    l.guard.target(),
                    Failed {
                        outcome,
                        scope,
                        status: l.status,
                        probe: l.guard.is_probe(),
                    },
                )
            });
            close_failed(snapshot, a, outcome, scope);
            let env = plan_env(snapshot);
            let Some((target, target_ref, failed)) = failed else {
                return Step::Answer(no_target_error(
                    &a.plan,
                    &a.attempts.failures,
                    *surface,
                    &env,
                ));
            };
            let health = &snapshot.health;
            let draw = splitmix64(a.seed ^ u64::from(a.attempts.made));
            let next = schedule::next(
                failed,
                &a.rules,
                a.attempts.spent(),
                started.elapsed(),
                || {
                    matches!(
                        health.admission(target_ref, env.now_ms),
                        Admission::Healthy { .. }
                    )
                },
                draw,
            );
            match next {
                Next::SameTarget { delay } => {
                    if scope == Scope::Fresh {
                        a.attempts.fresh = true;
                    } else {
                        a.attempts.same_target += 1;
                    }
                    a.attempts.next = Some(NextTarget {
                        // Never a probe (the schedule refuses those): no slot to hold.
                        target: Target {
                            probe: false,
                            ..target
                        },
                        claim: None,
                        delay,
                        hold: None,
                    });
                    Step::Again
                }
                Next::Plan(advance) => {
                    a.attempts.same_target = 0;
                    a.attempts.next = next_target(&mut a.plan, &env, health, advance);
                    match a.attempts.next {
                        Some(_) => Step::Again,
                        None => Step::Answer(no_target_error(
                            &a.plan,
                            &a.attempts.failures,
                            *surface,
                            &env,
                        )),
                    }
                }
                Next::Stop => Step::Answer(no_target_error(
                    &a.plan,
                    &a.attempts.failures,
                    *surface,
                    &env,
                )),
            }
        }
    }
}

/// The live attempt lost a hedge's race: its rival committed first. Closed with outcome
/// `hedge_lost` (no breaker effect; its probe slot and reservations given back), never a
/// failure of the request.
pub fn hedge_lost(ctx: &mut RequestCtx) {
    let RequestCtx {
        snapshot, admitted, ..
    } = ctx;
    if let Some(a) = admitted.as_mut() {
        settle(snapshot, a, Outcome::HedgeLost, Held::Released);
    }
}

/// A failure verdict on the live attempt while a hedge's rival is still running: the attempt
/// is settled and its failure recorded, but no next attempt is scheduled — the rival is now
/// the request's attempt. `false` when the verdict is no failure (the caller applies it).
pub fn failed_beside_rival(ctx: &mut RequestCtx, verdict: Verdict) -> bool {
    let Verdict::Retry { outcome, scope } = verdict else {
        return false;
    };
    let RequestCtx {
        snapshot, admitted, ..
    } = ctx;
    let Some(a) = admitted.as_mut() else {
        return false;
    };
    close_failed(snapshot, a, outcome, scope);
    true
}

/// Close the live attempt as failed: a context-length refusal raises the plan's floor, and
/// the failure joins the request's log (a stale pooled connection is no failure of the
/// provider's).
fn close_failed(snapshot: &Snapshot, a: &mut Admitted, outcome: Outcome, scope: Scope) {
    if scope == Scope::LargerContext {
        let floor = context_floor(snapshot, a);
        a.plan.require_context_above(floor);
        a.attempts.failures.note_context_exceeded();
    }
    settle(snapshot, a, outcome, Held::Released);
    if outcome != Outcome::StaleConnection {
        a.attempts.failures.record(outcome);
    }
}

/// What becomes of what an attempt's admission holds in the shared limits when it ends.
#[derive(Clone, Copy)]
enum Held {
    /// Its answer is the caller's: settled to its usage when the request ends.
    Served,
    /// It failed, or relayed a refusal: its reserved tokens and cost are given back (the call
    /// stays counted).
    Released,
}

/// Close the live attempt with its outcome: its record, what health learns from it (which
/// also settles a probe slot it held), and what its admission holds.
fn settle(snapshot: &Snapshot, a: &mut Admitted, outcome: Outcome, held: Held) {
    let at = &mut a.attempts;
    let Some(live) = at.live.take() else {
        return;
    };
    match held {
        Held::Served => at.served_hold = live.hold,
        Held::Released => {
            if live.hold != AttemptHold::default() {
                if let Some(d) = a.plan.deployment(&snapshot.catalog, live.target.position) {
                    super::admission::release(snapshot, d, live.hold, true);
                }
            }
        }
    }
    let now = Instant::now();
    let target = (live.target.position, live.target.credential);
    if let Some(prev) = at.log.last_mut() {
        // A hedge's loser was not failed over from.
        prev.followed = prev.target != target && prev.outcome != Outcome::HedgeLost;
    }
    let ttfb = live.header_at.map(|h| h.duration_since(live.started));
    let duration = now.duration_since(live.started);
    at.log.push(super::ctx::AttemptRecord {
        provider: live.provider,
        target,
        outcome,
        status: live.status,
        started: live.started,
        ttfb,
        duration,
        followed: false,
    });
    live.guard.finish(Observation {
        outcome,
        ttfb,
        latency: (outcome == Outcome::Ok).then_some(duration),
        output_tokens: at.relay.signals().usage.map(|u| u.completion_tokens),
        retry_after: live.retry_after,
        probe: false,
    });
}

/// The caller went away during the live attempt (if one is open): never the provider's
/// failure.
pub fn cancelled(ctx: &mut RequestCtx) {
    on(ctx, Sent::Cancelled);
}

/// The context window the next candidate must exceed after a context-length refusal: the
/// refusing model's, or (when it declares none) the request's own estimate.
fn context_floor(snapshot: &Snapshot, a: &Admitted) -> u64 {
    let window = a.attempts.live.as_ref().and_then(|l| {
        let d = a.plan.deployment(&snapshot.catalog, l.target.position)?;
        snapshot.catalog.model(d.model?).context_window
    });
    window.map_or_else(|| a.request.prompt_tokens(), u64::from)
}
