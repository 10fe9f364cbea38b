//! Hedged first token: when the live attempt has shown no first byte (its response header; for
//! a held stream, its first content) after the route's `hedge` delay, the plan's next
//! candidate starts beside it, and the first of the two to reach its commit point serves.
//!
//! This is signalbox's own driver ([`super::driven`]) with two attempts in flight: the same
//! request rewrite, header reading, body relay and verdicts, applied through the same
//! [`super::settle`]. The attempts' own state (the live record, the relay, the body) lives in
//! a [`Lane`] each; the attempt whose event is handled has its lane swapped into the request's
//! context, so nothing downstream knows there are two. Between events, the context holds the
//! first attempt's lane.
//!
//! The rules (DESIGN §5):
//! - one hedge per request, started only before the commit point, within `max_attempts`, the
//!   deadline and the process's hedge allowance (`runtime.hedges`, `max_share`);
//! - the winner commits; the loser is closed at once (its connection dropped), settled as
//!   `hedge_lost`: no breaker effect, its reservations given back;
//! - an attempt that fails while its rival runs is settled and recorded, and the rival simply
//!   goes on as the request's attempt; when both have failed the plan moves on as usual;
//! - a caller that leaves cancels both.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora_core::connectors::http::Connector;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use tokio::time::{sleep_until, Instant};

use super::bounded::{within, within_at};

use super::ctx::{HedgeRun, Lane, RequestCtx};
use super::driven::{self, Ahead, Drive, SendError, Upstream};
use super::settle::{self, Step};
use super::{attempt, planning, response};
use crate::attempt::verdict::HELD_BODY_LIMIT;
use crate::attempt::{self as verdicts, Advance, BodyEnd, CommitAt, Outcome, Sent, Verdict};
use crate::config::{Hedge, HedgeAfter};
use crate::error::{ErrorCode, GatewayError};
use crate::snapshot::Runtime;
use crate::state::admit::SharedAdmission;

/// How long an attempt may go without a first byte before its hedge starts: the fixed delay,
/// or the target's TTFB percentile (`percentile(p)`), never below `min_after`. `None` when a
/// percentile is asked for and the target has no record yet (a target nobody has timed is not
/// called slow).
pub fn delay(hedge: &Hedge, percentile: impl FnOnce(u8) -> Option<Duration>) -> Option<Duration> {
    let after = match hedge.after {
        HedgeAfter::Fixed(d) => d,
        HedgeAfter::Percentile(p) => percentile(p)?,
    };
    Some(after.max(hedge.min_after))
}

type Sending<'c> = Pin<Box<dyn Future<Output = Result<Upstream, SendError>> + Send + 'c>>;

/// Where one attempt's I/O stands.
enum Io<'c> {
    /// Connecting, sending, reading the response header.
    Sending(Sending<'c>),
    /// Reading the body up to the commit point.
    Reading(Box<Reading>),
}

struct Reading {
    up: Upstream,
    header: response::CallerHead,
    held: BytesMut,
    upstream_bytes: usize,
    /// A refusal, read whole before it is judged: `true` when its header's verdict was
    /// pending (a policy that fails over on client errors reads it first).
    refusal: Option<bool>,
}

/// One attempt of the race.
struct Runner<'c> {
    io: Io<'c>,
    /// When it must have shown its first content.
    deadline: Instant,
}

/// What one attempt's I/O produced.
enum Event {
    /// The response header, or why none came (`None`: the first-content deadline passed).
    Sent(Box<Option<Result<Upstream, SendError>>>),
    /// A body read (`None`: it timed out).
    Body(Option<pingora_error::Result<Option<Bytes>>>),
}

impl Runner<'_> {
    async fn next(&mut self, whole: bool, idle: Duration) -> Event {
        match &mut self.io {
            Io::Sending(sending) => {
                Event::Sent(Box::new(driven::until(self.deadline, sending).await.ok()))
            }
            Io::Reading(r) => {
                let bounded_by_idle = whole || r.refusal.is_some();
                let read = r.up.read_response_body();
                let out = if bounded_by_idle {
                    within(idle, read).await
                } else {
                    within_at(self.deadline, read).await
                };
                Event::Body(out.ok())
            }
        }
    }
}

/// What handling an event did to its attempt.
enum Turn {
    /// Keep reading it.
    Pending,
    /// Its answer is the caller's (`true`: the body is complete).
    Committed(bool),
    /// It ended without an answer while its rival runs on.
    Out,
    /// It ended without an answer and no rival is left: the driver's next move.
    Over(Drive),
}

/// The connection, request and header of the live attempt, as a future that borrows nothing
/// of the request's context.
fn sending<'c>(
    ctx: &RequestCtx,
    connector: &'c Connector,
    peer: &HttpPeer,
    caller: &RequestHeader,
    deadline: Instant,
) -> Option<Sending<'c>> {
    let (request, body) = driven::upstream_request(ctx, caller)?;
    let peer = peer.clone();
    // The deadline was set with this window, no later than now.
    let window = driven::first_content_window(ctx);
    Some(Box::pin(async move {
        driven::send(connector, &peer, request, body, deadline, window).await
    }))
}

/// Apply a verdict on the live attempt: a failure beside a running rival only settles it.
fn decide(ctx: &mut RequestCtx, verdict: Verdict, rival: bool) -> Result<Step, Turn> {
    if rival && settle::failed_beside_rival(ctx, verdict) {
        return Err(Turn::Out);
    }
    Ok(settle::apply(ctx, verdict))
}

/// A failure's verdict applied.
fn failed(ctx: &mut RequestCtx, verdict: Verdict, rival: bool) -> Turn {
    match decide(ctx, verdict, rival) {
        Err(turn) => turn,
        Ok(step) => Turn::Over(driven::after(step)),
    }
}

/// Handle one event of the live attempt (its lane swapped in).
fn on_event(
    ctx: &mut RequestCtx,
    runner: &mut Runner<'_>,
    event: Event,
    rival: bool,
    whole: bool,
) -> Turn {
    match event {
        Event::Sent(sent) => on_sent(ctx, runner, *sent, rival),
        Event::Body(read) => match &mut runner.io {
            Io::Reading(r) => on_body(ctx, r, read, rival, whole),
            _ => Turn::Pending,
        },
    }
}

fn on_sent(
    ctx: &mut RequestCtx,
    runner: &mut Runner<'_>,
    sent: Option<Result<Upstream, SendError>>,
    rival: bool,
) -> Turn {
    let mut up = match sent {
        Some(Ok(up)) => up,
        Some(Err(SendError::Connect(e))) => {
            let verdict =
                settle::judge_sent(ctx, Sent::Connect(verdicts::classify_connect_error(&e)));
            return failed(ctx, verdict, rival);
        }
        Some(Err(SendError::Proxy {
            error,
            reused,
            written,
        })) => {
            let sent = Sent::NoHeader {
                outcome: verdicts::classify_proxy_error(&error),
                reused,
                written,
            };
            let verdict = settle::judge_sent(ctx, sent);
            return failed(ctx, verdict, rival);
        }
        None => {
            let outcome = if driven::terms(ctx).commit_at == CommitAt::FirstContent {
                Outcome::FirstChunkTimeout
            } else {
                Outcome::Timeout
            };
            let sent = Sent::NoHeader {
                outcome,
                reused: false,
                written: true,
            };
            let verdict = settle::judge_sent(ctx, sent);
            return failed(ctx, verdict, rival);
        }
    };
    let Some(header) = up.response_header() else {
        let sent = Sent::NoHeader {
            outcome: Outcome::Reset,
            reused: false,
            written: true,
        };
        let verdict = settle::judge_sent(ctx, sent);
        return failed(ctx, verdict, rival);
    };
    let (verdict, framing) = response::read_header(ctx, header);
    let header = response::caller_header(ctx, framing, header);
    match decide(ctx, verdict, rival) {
        Err(turn) => return turn,
        Ok(step @ (Step::Again | Step::Answer(_))) => return Turn::Over(driven::after(step)),
        Ok(_) => {}
    }
    up.set_read_timeout(None);
    let refusal = (!header.status().is_success()).then_some(verdict == Verdict::Pending);
    runner.io = Io::Reading(Box::new(Reading {
        up,
        header,
        held: BytesMut::new(),
        upstream_bytes: 0,
        refusal,
    }));
    Turn::Pending
}

fn on_body(
    ctx: &mut RequestCtx,
    r: &mut Reading,
    read: Option<pingora_error::Result<Option<Bytes>>>,
    rival: bool,
    whole: bool,
) -> Turn {
    if let Some(pending) = r.refusal {
        // A refusal's small body, read whole through its relay.
        let mut chunk = read.and_then(Result::ok).flatten();
        let eos = chunk.is_none();
        response::filter_body(ctx, &mut chunk, eos);
        if let Some(c) = chunk {
            r.held.extend_from_slice(&c);
        }
        if !eos {
            return Turn::Pending;
        }
        if pending {
            let verdict = settle::judge_sent(ctx, response::refusal_read(ctx));
            return failed(ctx, verdict, rival);
        }
        return Turn::Committed(true);
    }
    let (mut chunk, end) = match read {
        None if whole => (None, BodyEnd::Broken(Outcome::Timeout)),
        None => (None, BodyEnd::Broken(Outcome::FirstChunkTimeout)),
        Some(Err(e)) => (None, BodyEnd::Broken(verdicts::classify_proxy_error(&e))),
        Some(Ok(None)) => (None, BodyEnd::Complete),
        Some(Ok(Some(c))) => {
            r.upstream_bytes += c.len();
            (Some(c), BodyEnd::Open)
        }
    };
    if !matches!(end, BodyEnd::Broken(_)) {
        response::filter_body(ctx, &mut chunk, end == BodyEnd::Complete);
    }
    if let Some(c) = chunk {
        r.held.extend_from_slice(&c);
    }
    let step = match decide(ctx, response::judge_body(ctx, end), rival) {
        Err(turn) => return turn,
        Ok(step) => step,
    };
    match step {
        Step::Continue if whole && r.upstream_bytes > HELD_BODY_LIMIT => {
            // Too large to hold: it commits at its header and is relayed as it comes.
            settle::apply(ctx, Verdict::Commit);
            Turn::Committed(false)
        }
        Step::Continue => Turn::Pending,
        Step::Commit => Turn::Committed(end == BodyEnd::Complete),
        Step::Refuse => Turn::Over(Drive::Answer(GatewayError::new(
            ErrorCode::InvalidRequest,
            "the provider rejected the request as invalid; check the request parameters",
        ))),
        step => Turn::Over(driven::after(step)),
    }
}

/// The attempt's read-ahead, once it committed.
fn ahead(runner: Runner<'_>, ended: bool) -> Option<Ahead> {
    match runner.io {
        Io::Reading(r) => {
            let r = *r;
            Some(Ahead {
                upstream: r.up,
                header: r.header,
                held: r.held,
                ended,
            })
        }
        _ => None,
    }
}

async fn next_of(runner: &mut Option<Runner<'_>>, whole: bool, idle: Duration) -> Event {
    match runner {
        Some(r) => r.next(whole, idle).await,
        None => std::future::pending().await,
    }
}

async fn at(when: Option<Instant>) {
    match when {
        Some(t) => sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn internal() -> Drive {
    Drive::Answer(GatewayError::new(
        ErrorCode::Internal,
        "the gateway could not handle the request",
    ))
}

/// The live attempt (begun on `peer`), raced against a hedge if it shows no first byte in
/// time, read up to the commit point. `Ok` with the winner's read-ahead, and the hedge's peer
/// when the hedge won; `Err` with the driver's next move when neither served.
#[allow(clippy::too_many_arguments)]
pub(super) async fn until_commit<'c>(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    connector: &'c Connector,
    peer: &HttpPeer,
    request: RequestHeader,
    shared: Option<&SharedAdmission>,
    hedge: Hedge,
) -> Result<(Ahead, Option<Arc<HttpPeer>>), Drive> {
    let whole = driven::terms(ctx).commit_at == CommitAt::WholeBody;
    let idle = ctx.snapshot.failover.ttfb_timeout;
    let started = Instant::now();
    let mut hedge_at = {
        let health = &ctx.snapshot.health;
        ctx.admitted
            .as_ref()
            .and_then(|a| a.attempts.live.as_ref())
            .and_then(|live| delay(&hedge, |p| health.ttfb_percentile(live.guard.target(), p)))
            .map(|d| started + d)
    };
    let deadline = driven::first_content_deadline(ctx);
    let Some(first) = sending(ctx, connector, peer, &request, deadline) else {
        let verdict = settle::judge_sent(ctx, Sent::Connect(Outcome::LocalError));
        return Err(driven::after(settle::apply(ctx, verdict)));
    };
    let mut a = Some(Runner {
        io: Io::Sending(first),
        deadline,
    });
    let mut b: Option<Runner<'c>> = None;
    let mut lane_b = Lane::new(None);
    let mut b_peer: Option<Arc<HttpPeer>> = None;
    loop {
        // A whole answer's first byte is its header: once it came, no hedge.
        if whole && a.as_ref().is_some_and(|r| matches!(r.io, Io::Reading(_))) {
            hedge_at = None;
        }
        enum Which {
            A(Event),
            B(Event),
            Hedge,
            Gone,
        }
        let hedge_when = hedge_at.filter(|_| b.is_none() && a.is_some());
        let which = tokio::select! {
            ev = next_of(&mut a, whole, idle) => Which::A(ev),
            ev = next_of(&mut b, whole, idle) => Which::B(ev),
            () = at(hedge_when) => Which::Hedge,
            () = driven::caller_gone(session) => Which::Gone,
        };
        match which {
            Which::Gone => {
                settle::cancelled(ctx);
                if b.is_some() {
                    with_lane(ctx, &mut lane_b, settle::cancelled);
                }
                return Err(Drive::Aborted(
                    Error::explain(
                        ErrorType::ConnectionClosed,
                        "the caller left before the answer",
                    )
                    .into_down(),
                ));
            }
            Which::Hedge => {
                hedge_at = None;
                if let Some((runner, p)) = start_hedge(
                    ctx,
                    runtime,
                    connector,
                    &request,
                    shared,
                    &hedge,
                    &mut lane_b,
                    started,
                )
                .await
                {
                    b = Some(runner);
                    b_peer = Some(p);
                }
            }
            Which::A(event) => {
                let Some(runner) = a.as_mut() else {
                    continue;
                };
                match on_event(ctx, runner, event, b.is_some(), whole) {
                    Turn::Pending => {}
                    Turn::Out => a = None,
                    Turn::Over(drive) => {
                        lose(ctx, &mut lane_b, &mut b);
                        return Err(drive);
                    }
                    Turn::Committed(ended) => {
                        lose(ctx, &mut lane_b, &mut b);
                        won(ctx, false);
                        let runner = a.take();
                        return runner
                            .and_then(|r| ahead(r, ended))
                            .map(|ahead| (ahead, None))
                            .ok_or_else(internal);
                    }
                }
            }
            Which::B(event) => {
                let Some(runner) = b.as_mut() else {
                    continue;
                };
                // The hedge's lane in, the first attempt's out.
                let rival = a.is_some();
                swap(ctx, &mut lane_b);
                let turn = on_event(ctx, runner, event, rival, whole);
                match turn {
                    Turn::Pending => swap(ctx, &mut lane_b),
                    Turn::Out => {
                        swap(ctx, &mut lane_b);
                        b = None;
                    }
                    Turn::Over(drive) => {
                        // `lane_b` holds the first attempt now.
                        lose(ctx, &mut lane_b, &mut a);
                        return Err(drive);
                    }
                    Turn::Committed(ended) => {
                        lose(ctx, &mut lane_b, &mut a);
                        won(ctx, true);
                        let runner = b.take();
                        return runner
                            .and_then(|r| ahead(r, ended))
                            .map(|ahead| (ahead, b_peer.take()))
                            .ok_or_else(internal);
                    }
                }
            }
        }
    }
}

/// Exchange the context's attempt with the one in `lane`.
fn swap(ctx: &mut RequestCtx, lane: &mut Lane) {
    if let Some(a) = ctx.admitted.as_mut() {
        a.attempts.swap_lane(lane);
    }
}

/// Run `f` on the attempt in `lane` (swapped in, then back out).
fn with_lane(ctx: &mut RequestCtx, lane: &mut Lane, f: impl FnOnce(&mut RequestCtx)) {
    swap(ctx, lane);
    f(ctx);
    swap(ctx, lane);
}

/// The rival in `lane` (still running when `runner` is `Some`) lost: closed at once (its
/// connection dropped with its runner) and settled as `hedge_lost`.
fn lose(ctx: &mut RequestCtx, lane: &mut Lane, runner: &mut Option<Runner<'_>>) {
    if runner.take().is_some() && !lane.is_idle() {
        with_lane(ctx, lane, settle::hedge_lost);
    }
}

/// Record which attempt served, when a hedge ran.
fn won(ctx: &mut RequestCtx, by_hedge: bool) {
    if let Some(run) = ctx
        .admitted
        .as_mut()
        .and_then(|a| a.attempts.hedge.as_mut())
    {
        run.won = Some(by_hedge);
    }
}

/// Start the hedge: the plan's next candidate (never the live target), admitted, its body
/// prepared and its attempt begun in `lane` — `None` (no hedge) when the attempt budget, the
/// deadline or the process's allowance says no, or no candidate is left. The context holds
/// the first attempt again when this returns.
#[allow(clippy::too_many_arguments)]
async fn start_hedge<'c>(
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    connector: &'c Connector,
    request: &RequestHeader,
    shared: Option<&SharedAdmission>,
    hedge: &Hedge,
    lane: &mut Lane,
    started: Instant,
) -> Option<(Runner<'c>, Arc<HttpPeer>)> {
    {
        let a = ctx.admitted.as_ref()?;
        if a.attempts.made >= a.rules.max_attempts
            || a.rules.deadline.is_some_and(|d| ctx.started.elapsed() >= d)
        {
            return None;
        }
    }
    if !runtime
        .hedges
        .try_hedge(runtime.health.now_ms(), hedge.max_share)
    {
        return None;
    }
    // The hedge's own lane in; it starts with the first attempt's body, reused when its
    // target takes the same one.
    let body = ctx.admitted.as_ref().and_then(|a| a.attempts.body.clone());
    *lane = Lane::new(body);
    swap(ctx, lane);
    let begun = begin_hedge(ctx, connector, request, shared).await;
    if begun.is_some() {
        if let Some(a) = ctx.admitted.as_mut() {
            a.attempts.hedge = Some(HedgeRun {
                after: started.elapsed(),
                won: None,
            });
        }
    }
    swap(ctx, lane);
    let (io, peer, deadline) = begun?;
    Some((
        Runner {
            io: Io::Sending(io),
            deadline,
        },
        peer,
    ))
}

/// The hedge's target taken from the plan, prepared, admitted and begun (its lane swapped in).
async fn begin_hedge<'c>(
    ctx: &mut RequestCtx,
    connector: &'c Connector,
    request: &RequestHeader,
    shared: Option<&SharedAdmission>,
) -> Option<(Sending<'c>, Arc<HttpPeer>, Instant)> {
    {
        let RequestCtx {
            snapshot, admitted, ..
        } = &mut *ctx;
        let a = admitted.as_mut()?;
        let env = planning::plan_env(snapshot);
        a.attempts.next =
            planning::next_target(&mut a.plan, &env, &snapshot.health, Advance::NextDeployment);
        a.attempts.next.as_ref()?;
    }
    // No target the request can reach: no hedge (the first attempt goes on alone).
    driven::ready_next(ctx, shared).await.ok()?;
    let peer = {
        let RequestCtx {
            snapshot, admitted, ..
        } = &mut *ctx;
        let a = admitted.as_mut()?;
        attempt::begin(snapshot, a).ok()?
    };
    // The hedge's window starts when it is sent (after its admission's round trip).
    let deadline = driven::first_content_deadline(ctx);
    match sending(ctx, connector, &peer, request, deadline) {
        Some(io) => Some((io, peer, deadline)),
        None => {
            let verdict = settle::judge_sent(ctx, Sent::Connect(Outcome::LocalError));
            if !settle::failed_beside_rival(ctx, verdict) {
                settle::apply(ctx, verdict);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hedge(after: HedgeAfter) -> Hedge {
        Hedge {
            after,
            min_after: Duration::from_millis(200),
            max_share: 0.1,
        }
    }

    #[test]
    fn the_delay_is_never_below_min_after() {
        let ms = Duration::from_millis;
        assert_eq!(
            delay(&hedge(HedgeAfter::Fixed(ms(300))), |_| None),
            Some(ms(300))
        );
        assert_eq!(
            delay(&hedge(HedgeAfter::Fixed(ms(50))), |_| None),
            Some(ms(200))
        );
        assert_eq!(
            delay(&hedge(HedgeAfter::Percentile(90)), |p| {
                assert_eq!(p, 90);
                Some(ms(800))
            }),
            Some(ms(800))
        );
        assert_eq!(
            delay(&hedge(HedgeAfter::Percentile(90)), |_| Some(ms(20))),
            Some(ms(200))
        );
        assert_eq!(
            delay(&hedge(HedgeAfter::Percentile(90)), |_| None),
            None,
            "no record: no hedge"
        );
    }
}
