//! The fast path: attempts driven by Pingora's proxy loop, for what commits at its response
//! header — a same-dialect stream with the first-chunk hold off.
//!
//! Each hook describes what it saw to the verdict core and applies the verdict through
//! [`settle`]: `upstream_peer` starts the next attempt (after its backoff); a failed connect,
//! a failover status in `upstream_response_filter` and an error before the header become a
//! `Retry` and, when another attempt may run, Pingora's loop calls `upstream_peer` again; the
//! header commits in `response_filter`; the body's end, or its break, ends the attempt.
//!
//! Pingora does not stop a retry after bytes reached the client; the caller's side
//! ([`Downstream`]) is the guard, checked by every failure hook. A `100 Continue` sent for
//! `Expect` does not commit.

use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_http::ResponseHeader;
use pingora_proxy::{FailToProxy, Session};

use super::admission::{self, Admission};
use super::ctx::{Broke, Downstream, RequestCtx};
use super::planning::{no_target_error, plan_env};
use super::settle::{self, Step};
use super::{attempt, planning, respond, response};
use crate::adapters::relay::stream_error_event;
use crate::attempt::{self as verdicts, BodyEnd, Sent, Verdict};
use crate::error::{ErrorCode, GatewayError};
use crate::snapshot::Runtime;
use crate::state::admit::SharedAdmission;

fn internal(why: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, why)
}

/// Whether bytes of a final response already went to the client.
fn committed(session: &Session, ctx: &RequestCtx) -> bool {
    ctx.downstream.is_committed()
        || session
            .response_written()
            .is_some_and(|r| !r.status.is_informational())
}

/// `upstream_peer`: the next attempt's peer, once admitted, after its backoff. A target the
/// shared store refuses is passed over for the plan's next; none left is an error, which
/// `fail_to_proxy` ([`answer`]) answers from the plan.
pub async fn peer(
    ctx: &mut RequestCtx,
    shared: Option<&SharedAdmission>,
) -> pingora_error::Result<Box<HttpPeer>> {
    loop {
        match admission::admit_next(ctx, shared).await {
            Admission::Ready => break,
            Admission::Moved => {}
            Admission::Refused(_) => return Err(internal("no target admitted")),
        }
    }
    let RequestCtx {
        snapshot,
        admitted,
        surface,
        ..
    } = ctx;
    let a = admitted
        .as_mut()
        .ok_or_else(|| internal("no plan for this request"))?;
    // The fast path never translates (a plan that would goes to the driven path), so every
    // target can carry the request.
    attempt::prepare_body(snapshot, *surface, a)
        .map_err(|_| internal("the request cannot be expressed for this target"))?;
    let delay = a
        .attempts
        .next
        .as_ref()
        .map(|n| n.delay)
        .unwrap_or_default();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    // Pingora takes its peer boxed: a copy of the provider's shared one.
    attempt::begin(snapshot, a).map(|peer| Box::new(HttpPeer::clone(&peer)))
}

/// `fail_to_connect`: classify, judge, settle.
pub fn on_connect_failure(ctx: &mut RequestCtx, mut e: Box<Error>) -> Box<Error> {
    let retry = matches!(settle::connect_failed(ctx, &e), Step::Again);
    e.set_retry(retry);
    e
}

/// `upstream_response_filter`: judge the status. A failover status returns `Err` before the
/// header reaches the client (Pingora drops the connection and, when another attempt may run,
/// calls `upstream_peer` again).
pub fn on_upstream_header(
    ctx: &mut RequestCtx,
    upstream_response: &mut ResponseHeader,
) -> pingora_error::Result<()> {
    if upstream_response.status.is_informational() {
        return Ok(());
    }
    let status = upstream_response.status.as_u16();
    let (verdict, framing) = response::read_header(ctx, upstream_response);
    if !matches!(verdict, Verdict::Retry { .. }) {
        response::shape_header(framing, upstream_response);
    }
    match verdict {
        verdict @ Verdict::Retry { .. } => {
            // Settled here; `error_while_proxy` only passes the decision on to Pingora.
            settle::apply(ctx, verdict);
            Err(Error::explain(
                ErrorType::HTTPStatus(status),
                "upstream status triggers failover",
            )
            .into_up())
        }
        verdict => {
            settle::apply(ctx, verdict);
            Ok(())
        }
    }
}

/// `response_filter`: the header commits; routing headers; a success binds the session.
pub fn on_header(runtime: &Runtime, ctx: &mut RequestCtx, response: &mut ResponseHeader) {
    if response.status.is_informational() {
        return;
    }
    // Of Pingora's copy of the provider's header, only what may reach the caller.
    response::commit_header(ctx, response);
    if response.status.is_success() {
        planning::bind_session(runtime, ctx);
    }
}

/// `response_body_filter`: the relay, and at the end how the attempt ended.
pub fn on_body(ctx: &mut RequestCtx, body: &mut Option<bytes::Bytes>, end_of_stream: bool) {
    response::filter_body(ctx, body, end_of_stream);
    if end_of_stream {
        let verdict = response::end_committed_body(ctx, body);
        settle::apply(ctx, verdict);
    }
}

/// `error_while_proxy`: a failure after the connection was made. Retried only while nothing
/// reached the client.
pub fn on_proxy_error(
    session: &Session,
    ctx: &mut RequestCtx,
    mut e: Box<Error>,
    client_reused: bool,
) -> Box<Error> {
    let open = ctx
        .admitted
        .as_ref()
        .is_some_and(|a| a.attempts.live.is_some());
    if !open {
        // The header hook settled it: pass its decision on.
        let again = ctx
            .admitted
            .as_ref()
            .is_some_and(|a| a.attempts.next.is_some());
        e.set_retry(again && !committed(session, ctx));
        return e;
    }
    let downstream = e.esource() == &ErrorSource::Downstream;
    if committed(session, ctx) {
        // Bytes reached the client: never another attempt.
        let verdict = if downstream {
            settle::judge_sent(ctx, Sent::Cancelled)
        } else {
            // Pingora's per-read timeout is the idle gap between chunks here.
            ctx.downstream
                .break_with(if e.etype() == &ErrorType::ReadTimedout {
                    Broke::Stalled
                } else {
                    Broke::Interrupted
                });
            response::judge_body(ctx, BodyEnd::Broken(verdicts::classify_proxy_error(&e)))
        };
        settle::apply(ctx, verdict);
        e.set_retry(false);
        return e;
    }
    if downstream {
        // The client went away: not the upstream's fault, nothing to retry for.
        settle::cancelled(ctx);
        e.set_retry(false);
        return e;
    }
    // Pingora reports a failed upstream write as such: the request was not (wholly) written.
    let written = !matches!(e.etype(), ErrorType::WriteError | ErrorType::WriteTimedout);
    let step = settle::on(
        ctx,
        Sent::NoHeader {
            outcome: verdicts::classify_proxy_error(&e),
            reused: client_reused,
            written,
        },
    );
    e.set_retry(matches!(step, Step::Again));
    e
}

/// `fail_to_proxy`: the final answer in signalbox's words — or, after a commit, an SSE error
/// event and a closed connection. Used by both drivers (the driven one returns its errors
/// after a commit from `request_filter`).
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
        let sse = ctx
            .admitted
            .as_ref()
            .is_some_and(|a| a.attempts.sse && !a.attempts.relay.signals().terminal);
        if sse && e.esource() != &ErrorSource::Downstream {
            let stalled = matches!(
                ctx.downstream,
                Downstream::Broken {
                    reason: Broke::Stalled,
                    ..
                }
            );
            let event = if stalled {
                stream_error_event(
                    ctx.surface,
                    "the provider's stream stalled for longer than failover.stream_idle_timeout",
                    "upstream_stream_stalled",
                )
            } else {
                stream_error_event(
                    ctx.surface,
                    "the provider's stream broke before it was complete",
                    "upstream_stream_interrupted",
                )
            };
            let end_stream = session.as_ref().as_http2().is_some();
            let _ = session.write_response_body(Some(event), end_stream).await;
        }
        ctx.downstream.break_with(Broke::Interrupted);
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
    let err = match (e.esource(), &ctx.admitted) {
        (ErrorSource::Downstream, _) => {
            GatewayError::new(ErrorCode::InvalidRequest, "the request could not be read")
        }
        (_, Some(a)) => no_target_error(
            &a.plan,
            &a.attempts.failures,
            ctx.surface,
            &plan_env(&ctx.snapshot),
        ),
        (_, None) => GatewayError::new(
            ErrorCode::Internal,
            "the gateway could not handle the request",
        ),
    };
    let status = err.status;
    // After Pingora's proxy loop failed, Pingora closes the caller's connection whatever this
    // answer says (its own reuse flag is false): say so. An error before the loop (from
    // `request_filter`) keeps a connection whose request body was read whole.
    let after_proxy_loop = ctx.admitted.as_ref().is_some_and(|a| !a.driven);
    let reusable = !after_proxy_loop && session.as_mut().is_body_done();
    if !reusable {
        session.set_keepalive(None);
    }
    match respond::write_error(session, ctx, err).await {
        Ok(()) => FailToProxy {
            error_code: status,
            can_reuse_downstream: reusable,
        },
        Err(_) => closed,
    }
}
