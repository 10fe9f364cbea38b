//! The hold path: attempts driven by signalbox itself, so that a stream's response header can
//! wait for its first content, and so that bodies Pingora's retry buffer cannot replay
//! (chunked over 64 KiB) still fail over.
//!
//! Pingora's proxy loop writes an upstream's header the moment it arrives, batched with
//! whatever body came along: no hook can defer it, so a stream that answers `200` and then
//! dies, stalls, or sends an error event before its first token is a failure the caller sees.
//! Here each attempt is an upstream call made through Pingora's [`Connector`] (its pool, TLS
//! and timeouts), and the caller's response header is written only once the first content
//! event has been read — a content delta, a tool call, a reasoning delta. Until then any
//! failure (a failover status, a reset, `200` then end of stream, an in-band error event, an
//! empty answer, no content within `failover.first_chunk_hold` or before `failover.deadline`)
//! moves to the next candidate exactly as the fast path would.
//!
//! Two paths, one policy: the target comes from the same plan ([`super::planning`]), the
//! attempt is set up and its request rewritten by the same code ([`super::attempt`]), the
//! status is classified by the same filter ([`super::response::on_upstream_header`]), the
//! body goes through the same rewriter, and every failure is recorded and the next target
//! chosen by the same decision ([`super::failure::after_failure`]). Nothing here decides what
//! is retryable. One difference, because only here can a wait be cut short: an attempt still
//! waiting for its first content is cancelled when `failover.deadline` passes, and no attempt
//! starts after it.
//!
//! After the commit the stream is relayed chunk by chunk, each read bounded by
//! `failover.stream_idle_timeout`; a stall, a broken upstream, or an end without the terminal
//! event ends the caller's stream with the dialect's error event and is counted as
//! `stream_aborted`.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::client::HttpSession as UpstreamSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_proxy::Session;
use tokio::time::{timeout, timeout_at, Instant};

use super::ctx::{AbortReason, RequestCtx};
use super::{attempt, failure, respond, response};
use crate::adapters::caller::CallerRequest;
use crate::adapters::chat_messages::BadUpstream;
use crate::adapters::stream::InbandError;
use crate::catalog::surface::Conversion;
use crate::error::{ErrorCode, GatewayError};
use crate::retry::{self, Advance, Outcome};
use crate::routing::Tables;

/// How long an idle upstream connection stays in the hold path's pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Whether this request takes the hold path: a stream while the first-chunk hold is on, a
/// body the fast path cannot replay, or a plan with a candidate of the other dialect (a
/// translated answer is read before it is committed, so an unreadable one fails over).
pub fn applies(ctx: &RequestCtx, tables: &Tables, own_replay: bool) -> bool {
    own_replay
        || ctx.translates
        || (tables.failover.first_chunk_hold.is_some()
            && ctx.request.as_ref().is_some_and(CallerRequest::stream))
}

/// How one attempt ended.
enum Step {
    /// The response went to the caller (whole, or a stream ended cleanly or in-band).
    Done,
    /// Nothing reached the caller; the attempt failed with this outcome.
    Failed(Outcome, Advance),
    /// A pooled connection the upstream had closed: call the same target again, fresh.
    Stale,
    /// Bytes reached the caller and then the stream broke: end it without a clean end.
    Aborted(Box<Error>),
}

/// Serve the request through the hold path. `Ok(true)`: the response was written (Pingora
/// only logs); `Err` after a commit: the stream broke (Pingora ends the connection, the
/// caller gets the dialect's error event first).
pub async fn serve(
    session: &mut Session,
    ctx: &mut RequestCtx,
    connector: &Connector,
) -> pingora_error::Result<bool> {
    let Some(tables) = ctx.tables.clone() else {
        return Err(Error::explain(
            ErrorType::InternalError,
            "no routing snapshot",
        ));
    };
    loop {
        if let Err(unexpressible) = attempt::prepare_body(ctx) {
            // This target's dialect cannot carry the request: the next one may.
            ctx.unexpressible = Some(unexpressible);
            if failure::skip_target(ctx) {
                continue;
            }
            let err = ctx
                .unexpressible
                .as_ref()
                .map(|u| GatewayError::new(ErrorCode::UnsupportedParameter, u.to_string()));
            let err = match (err, &ctx.plan) {
                // Only when no attempt failed otherwise: that failure says more.
                (Some(e), _) if ctx.attempts == 0 => e,
                (_, Some(plan)) => ctx.failures.final_error(plan.no_call()),
                _ => GatewayError::new(ErrorCode::Internal, "no plan"),
            };
            respond::write_error(session, ctx, err).await?;
            return Ok(true);
        }
        let peer = attempt::begin(ctx)?;
        // What an earlier attempt's response showed does not carry over.
        ctx.is_sse = false;
        ctx.served = None;
        let step = drive(session, ctx, connector, &peer, &tables).await;
        let retry = match step {
            Step::Done => return Ok(true),
            Step::Aborted(e) => return Err(e),
            Step::Failed(outcome, advance) => {
                ctx.served = None;
                ctx.status = None;
                failure::after_failure(ctx, outcome, advance)
            }
            Step::Stale => failure::retry_stale(ctx),
        };
        // The deadline is when the caller gets an answer: no attempt starts after it.
        let late = tables
            .failover
            .deadline
            .is_some_and(|d| ctx.started.elapsed() >= d);
        if !retry || late {
            let err = match &ctx.plan {
                Some(plan) => ctx.failures.final_error(plan.no_call()),
                None => GatewayError::new(ErrorCode::Internal, "no plan"),
            };
            respond::write_error(session, ctx, err).await?;
            return Ok(true);
        }
    }
}

/// When the current attempt must have produced its first content: the hold (a stream) or the
/// TTFB timeout (a whole answer), cut short by the request's deadline.
fn first_content_deadline(ctx: &RequestCtx, tables: &Tables) -> Instant {
    let now = Instant::now();
    let stream = ctx.request.as_ref().is_some_and(CallerRequest::stream);
    let hold = tables
        .failover
        .first_chunk_hold
        .filter(|_| stream)
        .unwrap_or(tables.failover.ttfb_timeout);
    let mut deadline = now + hold;
    if let Some(d) = tables.failover.deadline {
        deadline = deadline.min(Instant::from_std(ctx.started) + d);
    }
    deadline
}

/// One attempt: connect, send, read the header, hold it until the first content, commit,
/// relay.
async fn drive(
    session: &mut Session,
    ctx: &mut RequestCtx,
    connector: &Connector,
    peer: &HttpPeer,
    tables: &Tables,
) -> Step {
    let deadline = first_content_deadline(ctx, tables);
    let mut request = session.req_header().clone();
    if attempt::rewrite_request_header(ctx, &mut request).is_err() {
        return Step::Failed(Outcome::LocalError, Advance::NextDeployment);
    }
    // The upstream leg is HTTP/1.1 whatever the caller spoke.
    request.set_version(http::Version::HTTP_11);
    let body = ctx
        .attempt_body
        .as_ref()
        .map(|b| b.bytes.clone())
        .unwrap_or_default();

    // Connect, send, and read the response header, all within the first-content deadline.
    let sent = timeout_at(deadline, send(connector, peer, request, body)).await;
    let mut upstream = match sent {
        Err(_) => return Step::Failed(Outcome::FirstChunkTimeout, Advance::NextDeployment),
        Ok(Err(SendError::Connect(e))) => {
            return Step::Failed(retry::classify_connect_error(&e), Advance::NextDeployment)
        }
        Ok(Err(SendError::Proxy(e, reused))) => {
            let outcome = retry::classify_proxy_error(&e);
            if reused && outcome == Outcome::Reset && failure::may_retry_stale(ctx) {
                return Step::Stale;
            }
            return Step::Failed(outcome, Advance::NextDeployment);
        }
        Ok(Ok(up)) => up,
    };
    let Some(header) = upstream.response_header() else {
        return Step::Failed(Outcome::Reset, Advance::NextDeployment);
    };
    let mut header = header.clone();
    if response::on_upstream_header(ctx, &mut header).is_err() {
        // A failover status: the filter classified it.
        let (outcome, advance) = ctx
            .status_outcome
            .take()
            .unwrap_or((Outcome::ServerError, Advance::NextDeployment));
        return Step::Failed(outcome, advance);
    }
    // From here reads are bounded by the hold, then by the idle timeout: not by the peer's
    // per-read TTFB timeout.
    upstream.set_read_timeout(None);

    let mut held = BytesMut::new();
    let mut ended = false;
    let translated_whole =
        !ctx.is_sse && ctx.served.is_some() && ctx.conversion != Conversion::Same;
    if ctx.client_error_pending || translated_whole {
        // A refusal the policy may fail over on, or an answer to translate: read it whole,
        // then decide.
        let idle = tables.failover.ttfb_timeout;
        loop {
            let read = timeout(idle, upstream.read_response_body()).await;
            let mut chunk = match read {
                Err(_) => return Step::Failed(Outcome::Timeout, Advance::NextDeployment),
                Ok(Err(e)) => {
                    return Step::Failed(retry::classify_proxy_error(&e), Advance::NextDeployment)
                }
                Ok(Ok(c)) => c,
            };
            let eos = chunk.is_none();
            if response::on_body(ctx, &mut chunk, eos, false).is_err() {
                let (outcome, advance) = ctx
                    .status_outcome
                    .take()
                    .unwrap_or((Outcome::ClientError, Advance::NextDeployment));
                return Step::Failed(outcome, advance);
            }
            if let Some(c) = chunk {
                held.extend_from_slice(&c);
            }
            if eos {
                ended = true;
                break;
            }
        }
        if let Some(bad) = ctx.relay.bad_upstream() {
            let outcome = if bad == BadUpstream::EmptyChoices {
                Outcome::Empty
            } else {
                Outcome::ServerError
            };
            return Step::Failed(outcome, Advance::NextDeployment);
        }
    } else if ctx.is_sse && ctx.served.is_some() {
        // The hold: read until the first content event.
        loop {
            let read = timeout_at(deadline, upstream.read_response_body()).await;
            let chunk = match read {
                Err(_) => return Step::Failed(Outcome::FirstChunkTimeout, Advance::NextDeployment),
                Ok(Err(e)) => {
                    return Step::Failed(retry::classify_proxy_error(&e), Advance::NextDeployment)
                }
                Ok(Ok(None)) => {
                    // Ended before any content: `200` then EOF, an empty stream, only a role.
                    return Step::Failed(Outcome::Empty, Advance::NextDeployment);
                }
                Ok(Ok(Some(c))) => c,
            };
            let mut out = Some(chunk);
            ctx.relay.filter(&mut out, false);
            if let Some(c) = out {
                held.extend_from_slice(&c);
            }
            let signals = *ctx.relay.signals();
            if signals.content {
                break;
            }
            if ctx.relay.bad_upstream().is_some() {
                return Step::Failed(Outcome::ServerError, Advance::NextDeployment);
            }
            match signals.error {
                Some(InbandError::InvalidRequest) => {
                    // The request itself was refused: another target would refuse it too.
                    return answer_refusal(session, ctx).await;
                }
                Some(_) => return Step::Failed(Outcome::StreamError, Advance::NextDeployment),
                None => {}
            }
            if signals.terminal || signals.empty_choices {
                return Step::Failed(Outcome::Empty, Advance::NextDeployment);
            }
        }
    }

    // Commit: the header (with the routing headers), then what was held.
    response::on_header(ctx, &mut header);
    if let Err(e) = session.write_response_header(Box::new(header), false).await {
        return Step::Aborted(e.into_down());
    }
    if ended {
        let body = (!held.is_empty()).then(|| held.freeze());
        if let Err(e) = session.write_response_body(body, true).await {
            return Step::Aborted(e.into_down());
        }
        connector
            .release_http_session(upstream, peer, Some(POOL_IDLE))
            .await;
        return Step::Done;
    }
    if !held.is_empty() {
        if let Err(e) = session
            .write_response_body(Some(held.freeze()), false)
            .await
        {
            return Step::Aborted(e.into_down());
        }
    }
    relay(session, ctx, connector, peer, tables, upstream).await
}

/// After the commit: relay every chunk as it comes, each read bounded by the idle timeout.
async fn relay(
    session: &mut Session,
    ctx: &mut RequestCtx,
    connector: &Connector,
    peer: &HttpPeer,
    tables: &Tables,
    mut upstream: UpstreamSession,
) -> Step {
    let idle = if ctx.is_sse {
        tables.failover.stream_idle_timeout
    } else {
        tables.failover.ttfb_timeout
    };
    loop {
        let mut chunk = match timeout(idle, upstream.read_response_body()).await {
            Err(_) => {
                ctx.abort_reason = Some(AbortReason::Stalled);
                return Step::Aborted(Error::explain(
                    ErrorType::ReadTimedout,
                    "the provider's stream stalled past stream_idle_timeout",
                ));
            }
            Ok(Err(e)) => return Step::Aborted(e.into_up()),
            Ok(Ok(c)) => c,
        };
        let eos = chunk.is_none();
        if let Err(e) = response::on_body(ctx, &mut chunk, eos, true) {
            return Step::Aborted(e);
        }
        if let Err(e) = session.write_response_body(chunk, eos).await {
            return Step::Aborted(e.into_down());
        }
        if eos {
            if ctx.stream_broken {
                // Ended without its terminal event: the error event went out in-band; the
                // connection is not reused.
                upstream.shutdown().await;
            } else {
                connector
                    .release_http_session(upstream, peer, Some(POOL_IDLE))
                    .await;
            }
            return Step::Done;
        }
    }
}

/// An in-band refusal of the request before any content: answered as the refusal it is
/// (nothing was committed, so it gets a proper status).
async fn answer_refusal(session: &mut Session, ctx: &mut RequestCtx) -> Step {
    ctx.served = None;
    ctx.finish_attempt(Outcome::ClientError);
    let err = GatewayError::new(
        ErrorCode::InvalidRequest,
        "the provider rejected the request as invalid; check the request parameters",
    );
    match respond::write_error(session, ctx, err).await {
        Ok(()) => Step::Done,
        Err(e) => Step::Aborted(e.into_down()),
    }
}

enum SendError {
    Connect(Box<Error>),
    /// After the connection was made; whether it came from the pool.
    Proxy(Box<Error>, bool),
}

/// Connect (or reuse a pooled connection), send the request, read the response header.
async fn send(
    connector: &Connector,
    peer: &HttpPeer,
    request: pingora_http::RequestHeader,
    body: Bytes,
) -> Result<UpstreamSession, SendError> {
    let (mut up, reused) = connector
        .get_http_session(peer)
        .await
        .map_err(SendError::Connect)?;
    // As Pingora's own proxy loop does: the peer's timeouts bound each read and write.
    up.set_read_timeout(peer.options.read_timeout);
    up.set_write_timeout(peer.options.write_timeout);
    let proxy = |e: Box<Error>| SendError::Proxy(e, reused);
    up.write_request_header(Box::new(request))
        .await
        .map_err(proxy)?;
    if !body.is_empty() {
        up.write_request_body(body, true).await.map_err(proxy)?;
    }
    up.finish_request_body().await.map_err(proxy)?;
    // 1xx informational headers are read past.
    loop {
        up.read_response_header().await.map_err(proxy)?;
        let informational = up
            .response_header()
            .is_some_and(|h| h.status.is_informational());
        if !informational {
            return Ok(up);
        }
    }
}
