//! The failure decision: what a failed attempt was, whether another attempt may run and on
//! which target, and what the caller is told when none can.
//!
//! Pingora does not stop a retry after bytes reached the client; [`committed`] (set when a
//! non-informational header goes out) is the guard, checked by every failure hook. A
//! `100 Continue` sent for `Expect` does not commit. What counts as which failure is
//! `retry`'s vocabulary; this room applies it to the request in flight.

use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_proxy::{FailToProxy, Session};

use super::ctx::{AbortReason, RequestCtx};
use super::{planning, respond};
use crate::adapters::relay::stream_error_event;
use crate::error::{ErrorCode, GatewayError};
use crate::health::{Admission, InflightGuard};
use crate::retry::{self, Advance, Outcome};

/// Whether bytes of a final response already went to the client.
pub fn committed(session: &Session, ctx: &RequestCtx) -> bool {
    ctx.committed
        || session
            .response_written()
            .is_some_and(|r| !r.status.is_informational())
}

/// After a failed attempt: record it and decide whether another attempt may run (and on
/// which target, left in `ctx.pending`). Returns whether Pingora should retry.
pub(super) fn after_failure(ctx: &mut RequestCtx, outcome: Outcome, advance: Advance) -> bool {
    let failed = ctx.current.map(|a| a.target);
    let failed_ref = ctx.guard.as_ref().map(InflightGuard::target);
    ctx.finish_attempt(outcome);
    ctx.failures.record(outcome);
    let (Some(tables), Some(router)) = (ctx.tables.clone(), ctx.router.clone()) else {
        return false;
    };
    let Some(plan) = ctx.plan.as_mut() else {
        return false;
    };
    ctx.pending = None;
    if ctx.attempts >= ctx.max_attempts {
        return false;
    }
    // The first attempt and the first retry always run; later ones only within the deadline.
    if let Some(deadline) = tables.failover.deadline {
        if ctx.attempts >= 2 && ctx.started.elapsed() >= deadline {
            return false;
        }
    }
    // Same-target retry: a transient failure, budget left, and the breaker (which has just
    // seen this failure) still admits the target. Never for a half-open probe.
    if let (Some(target), Some(target_ref)) = (failed, failed_ref) {
        // Cheapest checks first: with retries off (the default) health is not consulted.
        if ctx.transient_retries < tables.failover.transient_retries
            && !target.probe
            && retry::is_transient(outcome)
            && matches!(
                tables.health.admission(target_ref, router.health.now_ms()),
                Admission::Healthy { .. }
            )
        {
            ctx.transient_retries += 1;
            ctx.pending = Some(target);
            return true;
        }
    }
    ctx.transient_retries = 0;
    if let Some(floor) = ctx.context_floor.take() {
        plan.require_context_above(floor);
    }
    let env = planning::plan_env(&router, &tables);
    ctx.pending = planning::next_target(plan, &env, advance);
    ctx.pending.is_some()
}

/// Pass over the pending target without calling it (the hold path: its dialect cannot express
/// the request) and take the next one; whether there is one.
pub(super) fn skip_target(ctx: &mut RequestCtx) -> bool {
    let (Some(tables), Some(router)) = (ctx.tables.clone(), ctx.router.clone()) else {
        return false;
    };
    let Some(plan) = ctx.plan.as_mut() else {
        return false;
    };
    let env = planning::plan_env(&router, &tables);
    ctx.pending = planning::next_target(plan, &env, Advance::NextDeployment);
    ctx.pending.is_some()
}

/// A pooled connection the upstream had already closed is not a failure of the target: the
/// same target is called once more on a fresh connection (once per request, never a probe).
pub(super) fn may_retry_stale(ctx: &RequestCtx) -> bool {
    !ctx.retry_same && ctx.current.is_some_and(|a| !a.target.probe)
}

/// Set up that second call (the attempt is abandoned, not judged); whether it may run.
pub(super) fn retry_stale(ctx: &mut RequestCtx) -> bool {
    let Some(attempt) = ctx.current else {
        return false;
    };
    ctx.abandon_attempt(Outcome::Reset);
    ctx.retry_same = true;
    let retry = ctx.attempts < ctx.max_attempts;
    ctx.pending = retry.then_some(attempt.target);
    retry
}

/// `fail_to_connect`: classify, record, pick the next target.
pub fn on_connect_failure(ctx: &mut RequestCtx, mut e: Box<Error>) -> Box<Error> {
    let outcome = retry::classify_connect_error(&e);
    if outcome == Outcome::LocalError {
        warn_local_resource();
    }
    let retry = after_failure(ctx, outcome, Advance::NextDeployment);
    e.set_retry(retry);
    e
}

/// `error_while_proxy`: a failure after the connection was made. Retried only while nothing
/// reached the client.
pub fn on_proxy_error(
    session: &Session,
    ctx: &mut RequestCtx,
    mut e: Box<Error>,
    client_reused: bool,
) -> Box<Error> {
    if committed(session, ctx) {
        // Bytes reached the client: never another attempt.
        ctx.stream_broken = true;
        let outcome = if e.esource() == &ErrorSource::Downstream {
            Outcome::Cancelled
        } else {
            Outcome::StreamAborted
        };
        ctx.finish_attempt(outcome);
        e.set_retry(false);
        return e;
    }
    if e.esource() == &ErrorSource::Downstream && ctx.status_outcome.is_none() {
        // The client went away: not the upstream's fault, nothing to retry for.
        ctx.finish_attempt(Outcome::Cancelled);
        e.set_retry(false);
        return e;
    }
    if let Some((outcome, advance)) = ctx.status_outcome.take() {
        let retry = after_failure(ctx, outcome, advance);
        e.set_retry(retry);
        return e;
    }
    let outcome = retry::classify_proxy_error(&e);
    if client_reused && outcome == Outcome::Reset && may_retry_stale(ctx) {
        let retry = retry_stale(ctx);
        e.set_retry(retry);
        return e;
    }
    let retry = after_failure(ctx, outcome, Advance::NextDeployment);
    e.set_retry(retry);
    e
}

/// `fail_to_proxy`: the final answer in signalbox's words — or, after a commit, an SSE error
/// event and a closed connection.
pub async fn answer(session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
    let closed = FailToProxy {
        error_code: 0,
        can_reuse_downstream: false,
    };
    if committed(session, ctx) {
        // Mid-response failure: end an SSE stream with an error event, never [DONE]. HTTP/1.1:
        // the connection then closes without the final chunk. HTTP/2: Pingora drops the
        // unfinished stream, h2 resets it (RST_STREAM CANCEL) and discards every DATA frame
        // still queued for it, so neither this event nor the chunks just relayed would
        // arrive; the event ends the stream there (END_STREAM) so that it is delivered.
        if ctx.is_sse && !ctx.relay.signals().terminal && e.esource() != &ErrorSource::Downstream {
            let event = match ctx.abort_reason {
                Some(AbortReason::Stalled) => stream_error_event(
                    ctx.surface,
                    "the provider's stream stalled for longer than failover.stream_idle_timeout",
                    "upstream_stream_stalled",
                ),
                None => stream_error_event(
                    ctx.surface,
                    "the provider's stream broke before it was complete",
                    "upstream_stream_interrupted",
                ),
            };
            let end_stream = session.as_ref().as_http2().is_some();
            let _ = session.write_response_body(Some(event), end_stream).await;
        }
        ctx.stream_broken = true;
        return closed;
    }
    let client_gone = e.esource() == &ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::ReadError
                | ErrorType::WriteError
                | ErrorType::ConnectionClosed
                | ErrorType::ReadTimedout
        );
    if client_gone {
        return closed;
    }
    let err = match (e.esource(), &ctx.plan) {
        (ErrorSource::Downstream, _) => {
            GatewayError::new(ErrorCode::InvalidRequest, "the request could not be read")
        }
        (_, Some(plan)) => ctx.failures.final_error(plan.no_call()),
        (_, None) => GatewayError::new(
            ErrorCode::Internal,
            "the gateway could not handle the request",
        ),
    };
    let status = err.status;
    match respond::write_error(session, ctx, err).await {
        Ok(()) => FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        },
        Err(_) => closed,
    }
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
