//! Signalbox's own attempt driver: attempts made from `request_filter` through Pingora's
//! [`Connector`] (its pool, TLS and timeouts), so that an answer's response header is written
//! only at its commit point.
//!
//! Pingora's proxy loop writes an upstream's header the moment it arrives, batched with
//! whatever body came along: no hook can defer it. So a whole answer that dies after its `200`,
//! an answer with nothing in it, or a stream that stalls or errors before its first token
//! would be failures the caller sees. Here the caller's header waits for the commit point the
//! request's terms name: a whole answer's last byte (up to `attempt::verdict::HELD_BODY_LIMIT`,
//! larger ones commit at their header), a stream's first content event (a content delta, a
//! tool call, a reasoning delta). Until then any failure moves to the next candidate, exactly
//! as the fast path would: the target comes from the same plan, the attempt is set up and its
//! request rewritten by the same code ([`super::attempt`]), the header read and the body
//! judged by the same functions ([`super::response`], `attempt::judge`), and every verdict
//! applied by [`super::settle`]. Nothing here decides what is retryable.
//!
//! Deadlines: a whole answer's header and every read of its body are bounded by
//! `failover.ttfb_timeout` (the peer's); a held stream must show content within
//! `failover.first_chunk_hold`. After the commit a stream is relayed chunk by chunk, each read
//! bounded by `failover.stream_idle_timeout`; a stall, a broken upstream, or an end without the
//! terminal event ends the caller's stream with the dialect's error event (`stream_aborted`).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::client::HttpSession as UpstreamSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_proxy::Session;
use tokio::time::{timeout_at, Instant};

use super::admission::{self, Admission};
use super::bounded::{within, within_at};
use super::ctx::{Broke, RequestCtx};
use super::settle::{self, Step};
use super::{attempt, planning, respond, response, wire};
use crate::adapters::caller::CallerRequest;
use crate::attempt::verdict::HELD_BODY_LIMIT;
use crate::attempt::{self as verdicts, BodyEnd, CommitAt, Outcome, Sent, Verdict};
use crate::error::{ErrorCode, GatewayError};
use crate::snapshot::Runtime;
use crate::state::admit::SharedAdmission;

/// How long an idle upstream connection stays in the driver's pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// How one attempt ended, for the loop.
pub(super) enum Drive {
    /// The response went to the caller (whole, or a stream ended cleanly or in-band).
    Done,
    /// Nothing reached the caller; another attempt runs (its target is set).
    Again,
    /// No attempt is left: answer this.
    Answer(GatewayError),
    /// Bytes reached the caller and then the stream broke: end it without a clean end.
    Aborted(Box<Error>),
}

/// Serve the request with signalbox's own driver. `Ok(true)`: the response was written
/// (Pingora only logs); `Err` after a commit: the stream broke (Pingora ends the connection,
/// the caller gets the dialect's error event first).
pub async fn serve(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    connector: &Connector,
    shared: Option<&SharedAdmission>,
) -> pingora_error::Result<bool> {
    loop {
        if let Err(err) = ready_next(ctx, shared).await {
            respond::write_error(session, ctx, err).await?;
            return Ok(true);
        }
        let delay = ctx
            .admitted
            .as_ref()
            .and_then(|a| a.attempts.next.as_ref())
            .map(|n| n.delay)
            .unwrap_or_default();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let peer = {
            let RequestCtx {
                snapshot, admitted, ..
            } = &mut *ctx;
            let a = admitted
                .as_mut()
                .ok_or_else(|| Error::explain(ErrorType::InternalError, "no plan"))?;
            attempt::begin(snapshot, a)?
        };
        match drive(session, ctx, runtime, connector, &peer, shared).await {
            Drive::Done => return Ok(true),
            Drive::Aborted(e) => return Err(e),
            Drive::Again => {}
            Drive::Answer(err) => {
                respond::write_error(session, ctx, err).await?;
                return Ok(true);
            }
        }
    }
}

/// Make the next target ready to call: its body prepared in its dialect and its admission
/// granted, moving on past targets that cannot express the request or are full in the
/// shared store. `Err` with the caller's answer when no target is left.
pub(super) async fn ready_next(
    ctx: &mut RequestCtx,
    shared: Option<&SharedAdmission>,
) -> Result<(), GatewayError> {
    loop {
        let prepared = {
            let RequestCtx {
                snapshot,
                admitted,
                surface,
                ..
            } = &mut *ctx;
            let Some(a) = admitted.as_mut() else {
                return Err(GatewayError::new(
                    ErrorCode::Internal,
                    "the gateway could not handle the request",
                ));
            };
            attempt::prepare_body(snapshot, *surface, a)
        };
        if let Err(unexpressible) = prepared {
            // This target's dialect cannot carry the request: the next one may (the target,
            // and a probe slot it held, are given up without a call).
            match skip_unexpressible(ctx, unexpressible) {
                Some(err) => return Err(err),
                None => continue,
            }
        }
        match admission::admit_next(ctx, shared).await {
            Admission::Ready => return Ok(()),
            // Another target: its body may differ.
            Admission::Moved => continue,
            Admission::Refused(err) => return Err(err),
        }
    }
}

/// Pass over the next target without calling it and take the plan's next; `Some` when none
/// is left (the answer: the field no candidate could express, unless an attempt failed, which
/// says more).
pub(super) fn skip_unexpressible(
    ctx: &mut RequestCtx,
    unexpressible: crate::adapters::chat_messages::Unexpressible,
) -> Option<GatewayError> {
    let RequestCtx {
        snapshot,
        admitted,
        surface,
        ..
    } = ctx;
    let a = admitted.as_mut()?;
    let env = planning::plan_env(snapshot);
    // Dropping the target gives back a probe slot it held; what its admission counted is
    // given back too.
    if let Some(next) = a.attempts.next.take() {
        if let (Some(hold), Some(d)) = (
            next.hold,
            a.plan.deployment(&snapshot.catalog, next.target.position),
        ) {
            admission::release(snapshot, d, hold, false);
        }
    }
    a.attempts.unexpressible = Some(unexpressible);
    a.attempts.next = planning::next_target(
        &mut a.plan,
        &env,
        &snapshot.health,
        verdicts::Advance::NextDeployment,
    );
    if a.attempts.next.is_some() {
        return None;
    }
    Some(match &a.attempts.unexpressible {
        Some(u) if a.attempts.made == 0 => {
            GatewayError::new(ErrorCode::UnsupportedParameter, u.to_string())
        }
        _ => planning::no_target_error(&a.plan, &a.attempts.failures, *surface, &env),
    })
}

/// Carry out a failure's step.
pub(super) fn after(step: Step) -> Drive {
    match step {
        Step::Answer(err) => Drive::Answer(err),
        _ => Drive::Again,
    }
}

pub(super) fn terms(ctx: &RequestCtx) -> verdicts::Terms {
    ctx.admitted.as_ref().map_or(
        verdicts::Terms {
            commit_at: CommitAt::WholeBody,
            failover_on_client_error: false,
        },
        |a| a.terms,
    )
}

/// When the live attempt must have shown its first content: the hold (a held stream) or the
/// TTFB timeout (a whole answer). The request's deadline does not cut it short: it only stops
/// new attempts after the first retry.
pub(super) fn first_content_deadline(ctx: &RequestCtx) -> Instant {
    deadline_after(Instant::now(), first_content_window(ctx))
}

/// How long the live attempt has to show its first content (see [`first_content_deadline`]).
pub(super) fn first_content_window(ctx: &RequestCtx) -> Duration {
    let failover = &ctx.snapshot.failover;
    let stream = ctx
        .admitted
        .as_ref()
        .is_some_and(|a| CallerRequest::stream(&a.request));
    failover
        .first_chunk_hold
        .filter(|_| stream)
        .unwrap_or(failover.ttfb_timeout)
}

/// `window` from `from`. A duration past what `Instant` holds (a config of centuries) is a
/// deadline that never comes, not a panic.
fn deadline_after(from: Instant, window: Duration) -> Instant {
    from.checked_add(window).unwrap_or(from + FAR)
}

/// `future` bounded by `deadline`, on the coarse wheel ([`super::wheel`]) rather than tokio's
/// timer, whose entry earlier than the driver's next wake-up writes to its eventfd (a `write`
/// syscall and a spurious `epoll_wait` return per request, issue 22). Ends `Err` when the
/// deadline passed first.
pub(super) fn until<F: std::future::Future>(
    deadline: Instant,
    future: F,
) -> impl std::future::Future<Output = Result<F::Output, super::wheel::Elapsed>> {
    super::wheel::until(deadline.into_std(), future)
}

/// A deadline that does not come (as tokio's own far future: about thirty years).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// One attempt: connect, send, read the header, hold it until the commit point, commit,
/// relay. Until the commit the caller is watched: one that leaves ends the attempt at once
/// (its upstream connection dropped, outcome `cancelled`).
async fn drive(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    connector: &Connector,
    peer: &HttpPeer,
    shared: Option<&SharedAdmission>,
) -> Drive {
    // A route that hedges races this attempt against the next candidate (one hedge per
    // request: once it ran, later attempts go alone).
    let hedge = ctx
        .admitted
        .as_ref()
        .filter(|a| a.attempts.hedge.is_none())
        .and_then(|a| a.hedge);
    if let Some(hedge) = hedge {
        // Both racers' headers are built from the caller's: a copy outlives the session borrow.
        // The race runs on the heap, as the single attempt's connect below.
        let request = respond::request_copy(session.req_header());
        let (ahead, hedge_peer) = match super::heap::on_heap(|| {
            super::hedge::until_commit(
                session, ctx, runtime, connector, peer, request, shared, hedge,
            )
        })
        .await
        {
            Ok(won) => won,
            Err(drive) => return drive,
        };
        let peer = hedge_peer.as_deref().unwrap_or(peer);
        return finish(session, ctx, runtime, connector, peer, ahead).await;
    }
    let Some((request, body)) = upstream_request(ctx, session.req_header()) else {
        return after(settle::on(ctx, Sent::Connect(Outcome::LocalError)));
    };
    // The connect's state lives on the heap until the commit point, not in the request's
    // future for as long as a stream is open (`super::heap::on_heap`).
    // Biased: the attempt is polled first, so the wake that brings its answer does not also
    // poll the caller's socket (a caller that left is seen at the next wait, or at the write).
    let ahead = tokio::select! {
        biased;
        ahead = super::heap::on_heap(|| until_commit(ctx, connector, peer, request, body)) => match ahead {
            Ok(ahead) => ahead,
            Err(drive) => return drive,
        },
        () = caller_gone(session) => {
            settle::cancelled(ctx);
            return Drive::Aborted(
                Error::explain(ErrorType::ConnectionClosed, "the caller left before the answer")
                    .into_down(),
            );
        }
    };
    finish(session, ctx, runtime, connector, peer, ahead).await
}

/// Commit the attempt read ahead, relay the rest, then leave its connection as the answer
/// ended. The connection is held here, once, for the whole answer: commit and relay borrow it
/// (a large by-value argument of an async fn is kept twice in its future, and a stream's
/// futures live as long as it does).
async fn finish(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    connector: &Connector,
    peer: &HttpPeer,
    ahead: Ahead,
) -> Drive {
    let Ahead {
        mut upstream,
        header,
        held,
        ended,
    } = ahead;
    let (drive, leave) = commit(session, ctx, runtime, &mut upstream, header, held, ended).await;
    leave_upstream(connector, peer, upstream, leave).await;
    drive
}

/// What becomes of an attempt's upstream connection once its answer is through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// Back to the pool: the answer ended cleanly.
    Pool,
    /// Closed: the stream ended without its terminal event.
    Close,
    /// Dropped as it is: the exchange broke on either side.
    Drop,
}

/// The end of an attempt's connection, as `leave` says, as a future made on the heap: the
/// release's ~3 KiB of state (`super::heap::on_heap`) is not part of the request's future, which a
/// stream keeps from its first chunk to its last.
fn leave_upstream<'a>(
    connector: &'a Connector,
    peer: &'a HttpPeer,
    upstream: Upstream,
    leave: Leave,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    match leave {
        Leave::Pool => super::heap::on_heap(move || {
            connector.release_http_session(*upstream, peer, Some(POOL_IDLE))
        }),
        Leave::Close => super::heap::on_heap(move || async move {
            let mut upstream = upstream;
            upstream.shutdown().await;
        }),
        Leave::Drop => Box::pin(std::future::ready(())),
    }
}

/// An attempt's upstream connection, boxed once when its request is written: it passes from
/// the send through the commit to its release, and a boxed one moves as a pointer, not as
/// Pingora's ~470-byte session (about fifteen copies per request, issue 22).
pub(super) type Upstream = Box<UpstreamSession>;

/// An attempt read up to its commit point.
pub(super) struct Ahead {
    pub(super) upstream: Upstream,
    /// The caller's header, as it will be committed.
    pub(super) header: response::CallerHead,
    /// The body read so far (held back from the caller).
    pub(super) held: BytesMut,
    /// Whether the body has ended.
    pub(super) ended: bool,
}

/// Resolves when the caller has closed its side of the connection (FIN or reset), never
/// otherwise: the next request's first bytes from a pipelining caller are kept for it.
pub(super) async fn caller_gone(session: &mut Session) {
    match session.as_mut().read_body_or_idle(true).await {
        Err(e)
            if matches!(
                e.etype(),
                ErrorType::ConnectionClosed | ErrorType::ReadError
            ) => {}
        _ => std::future::pending().await,
    }
}

/// Call the target and read its answer up to the commit point; a failure on the way is
/// judged and applied.
async fn until_commit(
    ctx: &mut RequestCtx,
    connector: &Connector,
    peer: &HttpPeer,
    request: UpstreamRequest,
    body: Bytes,
) -> Result<Ahead, Drive> {
    let window = first_content_window(ctx);
    // From the attempt's start, read a moment ago by `attempt::begin` (no clock read here).
    let started = ctx
        .admitted
        .as_ref()
        .and_then(|a| a.attempts.live.as_ref())
        .map_or_else(Instant::now, |live| Instant::from_std(live.started));
    let deadline = deadline_after(started, window);
    let mut upstream = call(request, body, ctx, connector, peer, (deadline, window)).await?;
    let Some(header) = upstream.response_header() else {
        let sent = Sent::NoHeader {
            outcome: Outcome::Reset,
            reused: false,
            written: true,
        };
        return Err(after(settle::on(ctx, sent)));
    };
    let (verdict, framing) = response::read_header(ctx, header);
    let header = response::caller_header(ctx, framing, header);
    let step = settle::apply(ctx, verdict);
    if let Step::Again | Step::Answer(_) = step {
        return Err(after(step));
    }
    // From here reads are bounded by the hold, then by the idle timeout (`send` left the
    // session no read timeout of Pingora's).
    let mut held = BytesMut::new();
    // A refusal (relayed, or read first under a policy that fails over on client errors).
    let refusal = !header.status().is_success();
    let ended = if refusal {
        read_refusal(ctx, &mut upstream, &mut held).await;
        if verdict == Verdict::Pending {
            return Err(after(settle::on(ctx, response::refusal_read(ctx))));
        }
        true
    } else {
        read_to_commit(ctx, &mut upstream, deadline, &mut held).await?
    };
    Ok(Ahead {
        upstream,
        header,
        held,
        ended,
    })
}

/// Connect (or take a pooled connection), send the request, read the response header, all
/// within the first-content deadline (`first`: the deadline and the window it was just set
/// with); a failure on the way is judged and applied.
async fn call(
    request: UpstreamRequest,
    body: Bytes,
    ctx: &mut RequestCtx,
    connector: &Connector,
    peer: &HttpPeer,
    first: (Instant, Duration),
) -> Result<Upstream, Drive> {
    let (deadline, window) = first;
    // The send's state (~10 KiB) on the heap: the bound takes it by value, and a future held
    // inline would be copied into the bound's own.
    let sending = super::heap::on_heap(|| send(connector, peer, request, body, deadline, window));
    let sent = match until(deadline, sending).await {
        Ok(Ok(up)) => return Ok(up),
        Ok(Err(SendError::Connect(e))) => return Err(after(settle::connect_failed(ctx, &e))),
        Ok(Err(SendError::Proxy {
            error,
            reused,
            written,
        })) => Sent::NoHeader {
            outcome: verdicts::classify_proxy_error(&error),
            reused,
            written,
        },
        Err(_) => Sent::NoHeader {
            outcome: if terms(ctx).commit_at == CommitAt::FirstContent {
                Outcome::FirstChunkTimeout
            } else {
                Outcome::Timeout
            },
            reused: false,
            written: true,
        },
    };
    Err(after(settle::on(ctx, sent)))
}

/// An attempt's upstream request, as it will be written.
pub(super) enum UpstreamRequest {
    /// Its HTTP/1.1 head, already the bytes Pingora would write: it leaves with the body in
    /// one write ([`attempt::HeaderPlan::head`]).
    Head(bytes::BytesMut),
    /// Pingora's header (boxed, as Pingora writes it: it moves as a pointer on its way): for a
    /// request Pingora writes itself (`HEAD`, a body past [`wire::COALESCE_LIMIT`]), and for a
    /// plan [`attempt::HeaderPlan::head`] declines (serialised by Pingora for the one write).
    Header(Box<pingora_http::RequestHeader>),
}

/// The live attempt's request, built for its target from the caller's header, and its body;
/// `None` when it cannot be written (a local error). The upstream leg is HTTP/1.1 whatever
/// the caller spoke.
pub(super) fn upstream_request(
    ctx: &RequestCtx,
    caller: &pingora_http::RequestHeader,
) -> Option<(UpstreamRequest, Bytes)> {
    let plan = attempt::header_plan(ctx, caller).ok()?;
    let body = ctx
        .admitted
        .as_ref()
        .and_then(|a| a.attempts.body.as_ref())
        .map(|b| b.bytes.clone())
        .unwrap_or_default();
    // What else `wire::coalescable` asks (no `Connection`, `Transfer-Encoding` or `Upgrade`,
    // a length that is the body's) a head from the plan always has: those fields are
    // gateway-written, never a caller's kept one nor a provider's (config validation), and
    // the plan writes the body's length.
    let one_write = caller.method != http::Method::HEAD && body.len() <= wire::COALESCE_LIMIT;
    let request = match one_write.then(|| plan.head()).flatten() {
        Some(head) => UpstreamRequest::Head(head),
        None => {
            let mut header = Box::new(plan.header());
            header.set_version(http::Version::HTTP_11);
            UpstreamRequest::Header(header)
        }
    };
    Some((request, body))
}

/// A refusal's body, read whole (a small error body) through its relay, which rewrites it in
/// signalbox's words. An unreadable refusal is relayed as what it was.
async fn read_refusal(ctx: &mut RequestCtx, upstream: &mut UpstreamSession, held: &mut BytesMut) {
    let idle = ctx.snapshot.failover.ttfb_timeout;
    loop {
        let mut chunk = match within(idle, upstream.read_response_body()).await {
            Ok(Ok(c)) => c,
            _ => None,
        };
        let eos = chunk.is_none();
        response::filter_body(ctx, &mut chunk, eos);
        if let Some(c) = chunk {
            held.extend_from_slice(&c);
        }
        if eos {
            return;
        }
    }
}

/// An answer read up to its commit point: `Ok(true)` when it is complete, `Ok(false)` when it
/// commits with more to come (a held stream's first content, a whole answer too large to
/// hold), `Err` when the attempt failed or was refused before it.
async fn read_to_commit(
    ctx: &mut RequestCtx,
    upstream: &mut UpstreamSession,
    deadline: Instant,
    held: &mut BytesMut,
) -> Result<bool, Drive> {
    let whole = terms(ctx).commit_at == CommitAt::WholeBody;
    let idle = ctx.snapshot.failover.ttfb_timeout;
    let mut upstream_bytes = 0usize;
    loop {
        let read = if whole {
            within(idle, upstream.read_response_body()).await
        } else {
            within_at(deadline, upstream.read_response_body()).await
        };
        let (mut chunk, end) = match read {
            Err(_) if whole => (None, BodyEnd::Broken(Outcome::Timeout)),
            Err(_) => (None, BodyEnd::Broken(Outcome::FirstChunkTimeout)),
            Ok(Err(e)) => (None, BodyEnd::Broken(verdicts::classify_proxy_error(&e))),
            Ok(Ok(None)) => (None, BodyEnd::Complete),
            Ok(Ok(Some(c))) => {
                upstream_bytes += c.len();
                (Some(c), BodyEnd::Open)
            }
        };
        if !matches!(end, BodyEnd::Broken(_)) {
            response::filter_body(ctx, &mut chunk, end == BodyEnd::Complete);
        }
        if let Some(c) = chunk {
            held.extend_from_slice(&c);
        }
        match settle::apply(ctx, response::judge_body(ctx, end)) {
            Step::Continue if whole && upstream_bytes > HELD_BODY_LIMIT => {
                // Too large to hold: it commits at its header and is relayed as it comes.
                settle::apply(ctx, Verdict::Commit);
                return Ok(false);
            }
            Step::Continue => {}
            Step::Commit => return Ok(end == BodyEnd::Complete),
            // The provider refused the request in-band, before any content: answered as the
            // refusal it is (nothing was committed, so it gets a proper status).
            Step::Refuse => {
                return Err(Drive::Answer(GatewayError::new(
                    ErrorCode::InvalidRequest,
                    "the provider rejected the request as invalid; check the request parameters",
                )))
            }
            step => return Err(after(step)),
        }
    }
}

/// The commit: the header (with the routing headers), then what was held; a complete answer
/// ends here, a stream is relayed on. With the answer's end, what becomes of its connection.
async fn commit(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    upstream: &mut UpstreamSession,
    header: response::CallerHead,
    held: BytesMut,
    ended: bool,
) -> (Drive, Leave) {
    let refusal = !header.status().is_success();
    let header = header.commit(ctx);
    if !refusal {
        planning::bind_session(runtime, ctx);
    }
    if let Err(e) = session.write_response_header(header, false).await {
        settle::cancelled(ctx);
        return (Drive::Aborted(e.into_down()), Leave::Drop);
    }
    if ended {
        let mut body = (!held.is_empty()).then(|| held.freeze());
        if !refusal {
            let verdict = response::end_committed_body(ctx, &mut body);
            settle::apply(ctx, verdict);
        }
        if let Err(e) = session.write_response_body(body, true).await {
            settle::cancelled(ctx);
            return (Drive::Aborted(e.into_down()), Leave::Drop);
        }
        return (Drive::Done, Leave::Pool);
    }
    if !held.is_empty() {
        if let Err(e) = session
            .write_response_body(Some(held.freeze()), false)
            .await
        {
            settle::cancelled(ctx);
            return (Drive::Aborted(e.into_down()), Leave::Drop);
        }
    }
    relay(session, ctx, upstream).await
}

/// After the commit: relay every chunk as it comes, each read bounded by the idle timeout.
async fn relay(
    session: &mut Session,
    ctx: &mut RequestCtx,
    upstream: &mut UpstreamSession,
) -> (Drive, Leave) {
    let sse = ctx.admitted.as_ref().is_some_and(|a| a.attempts.sse);
    let idle = if sse {
        ctx.snapshot.failover.stream_idle_timeout
    } else {
        ctx.snapshot.failover.ttfb_timeout
    };
    loop {
        let mut chunk = match within(idle, upstream.read_response_body()).await {
            Err(_) => {
                ctx.downstream.break_with(Broke::Stalled);
                let verdict = response::judge_body(ctx, BodyEnd::Broken(Outcome::Timeout));
                settle::apply(ctx, verdict);
                let e = Error::explain(
                    ErrorType::ReadTimedout,
                    "the provider's stream stalled past stream_idle_timeout",
                );
                return (Drive::Aborted(e), Leave::Drop);
            }
            Ok(Err(e)) => {
                let verdict =
                    response::judge_body(ctx, BodyEnd::Broken(verdicts::classify_proxy_error(&e)));
                ctx.downstream.break_with(Broke::Interrupted);
                settle::apply(ctx, verdict);
                return (Drive::Aborted(e.into_up()), Leave::Drop);
            }
            Ok(Ok(c)) => c,
        };
        let eos = chunk.is_none();
        response::filter_body(ctx, &mut chunk, eos);
        let broken = if eos {
            let verdict = response::end_committed_body(ctx, &mut chunk);
            settle::apply(ctx, verdict);
            ctx.downstream.is_broken()
        } else {
            false
        };
        if let Err(e) = session.write_response_body(chunk, eos).await {
            // The caller went away mid-stream: cancelled, never the provider's failure.
            settle::cancelled(ctx);
            return (Drive::Aborted(e.into_down()), Leave::Drop);
        }
        if eos {
            // Ended without its terminal event: the error event went out in-band; the
            // connection is not reused.
            let leave = if broken { Leave::Close } else { Leave::Pool };
            return (Drive::Done, leave);
        }
    }
}

pub(super) enum SendError {
    Connect(Box<Error>),
    /// After the connection was made; whether it came from the pool, and whether the whole
    /// request had been written.
    Proxy {
        error: Box<Error>,
        reused: bool,
        written: bool,
    },
}

/// Connect (or reuse a pooled connection), send the request, read the response header.
/// `deadline` is the caller's bound on all of it (the caller enforces it, with its own timer),
/// set with `window` no later than now.
pub(super) async fn send(
    connector: &Connector,
    peer: &HttpPeer,
    request: UpstreamRequest,
    body: Bytes,
    deadline: Instant,
    window: Duration,
) -> Result<Upstream, SendError> {
    let (up, reused) = connector
        .get_http_session(peer)
        .await
        .map_err(SendError::Connect)?;
    let unwritten = |error: Box<Error>| SendError::Proxy {
        error,
        reused,
        written: false,
    };
    let mut up: Upstream = match (up, request) {
        // Head and a known body in one write (issue 22), the head as Pingora writes it. The
        // connection's stream is written directly and gets a fresh session.
        (UpstreamSession::H1(h1), UpstreamRequest::Head(head)) => {
            let stream = wire::send_whole(h1.into_inner(), peer, &head, &body)
                .await
                .map_err(unwritten)?;
            wire::session_for(stream, peer)
        }
        (UpstreamSession::H1(h1), UpstreamRequest::Header(request))
            if wire::coalescable(&request, &body) =>
        {
            let head = wire::head_of(&request).map_err(unwritten)?;
            let stream = wire::send_whole(h1.into_inner(), peer, &head, &body)
                .await
                .map_err(unwritten)?;
            wire::session_for(stream, peer)
        }
        (mut up, request) => {
            let request = match request {
                UpstreamRequest::Header(request) => request,
                UpstreamRequest::Head(head) => wire::header_of(&head).map_err(unwritten)?,
            };
            // As Pingora's own proxy loop does, the peer's write timeout bounds each write.
            // Its read timeout (the provider's `ttfb_timeout`) bounds the header below, not
            // through Pingora.
            up.set_read_timeout(None);
            up.set_write_timeout(peer.options.write_timeout);
            up.write_request_header(request).await.map_err(unwritten)?;
            if !body.is_empty() {
                up.write_request_body(body, true).await.map_err(unwritten)?;
            }
            up.finish_request_body().await.map_err(unwritten)?;
            Box::new(up)
        }
    };
    let unanswered = |error: Box<Error>| SendError::Proxy {
        error,
        reused,
        written: true,
    };
    // The provider's `ttfb_timeout` bounds the whole header from here, 1xx included (Pingora's
    // per-read timeout bounded each read), failing it as `ReadTimedout` as Pingora's would. It
    // takes a timer of its own only when it ends before the caller's deadline: by default it
    // does not (both are `ttfb_timeout`, and the deadline began before the connect), and
    // Pingora's timer on the read cost ~1.5k instructions per request (issue 22).
    // A timeout no shorter than the window cannot end first (the deadline is at most the
    // window away): settled without reading the clock.
    let ttfb_by = peer
        .options
        .read_timeout
        .filter(|t| *t < window)
        .and_then(|t| Instant::now().checked_add(t))
        .filter(|by| *by < deadline);
    let read = match ttfb_by {
        // On the heap: the rare bounded read does not grow every attempt's future (whose
        // allocation must stay in one of the allocator's small size classes).
        Some(by) => super::heap::on_heap(|| timeout_at(by, read_final_header(&mut up)))
            .await
            .unwrap_or_else(|_| {
                Err(Error::explain(
                    ErrorType::ReadTimedout,
                    "the provider's ttfb_timeout passed before its response header",
                ))
            }),
        None => read_final_header(&mut up).await,
    };
    read.map_err(unanswered)?;
    Ok(up)
}

/// Read the response header, past 1xx informational ones.
async fn read_final_header(up: &mut UpstreamSession) -> pingora_error::Result<()> {
    loop {
        up.read_response_header().await?;
        let informational = up
            .response_header()
            .is_some_and(|h| h.status.is_informational());
        if !informational {
            return Ok(());
        }
    }
}
