//! Intake: everything before the first attempt that is about the caller's request itself —
//! the endpoint and method, the header budget, `Expect: 100-continue`, reading and bounding
//! the body (arranged for replay, see [`super::body`]) and scanning it once — then handing it
//! to planning, and the planned request to its driver (signalbox's own, or Pingora's proxy
//! loop). Signalbox's own answers at this stage (`GET /v1/models`, refusals) are written here.

use http::{header, Method};
use pingora_proxy::Session;

use super::admission::{self, Admission};
use super::body::{self, BodyError, Framing};
use super::ctx::RequestCtx;
use super::{access, driven, planning, respond};
use crate::adapters::anthropic::Page;
use crate::adapters::caller::CallerRequest;
use crate::catalog::surface::Surface;
use crate::error::{ErrorCode, GatewayError};
use crate::metrics::Metrics;
use crate::snapshot::{Runtime, Snapshot};
use crate::state::admit::SharedAdmission;
use pingora_core::connectors::http::Connector;

/// `/v1/models` (or `/models`) → `""`, `/v1/models/{id}` → the id; `None` for other paths.
fn models_path(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/v1/models")
        .or_else(|| path.strip_prefix("/models"))?;
    match rest {
        "" | "/" => Some(""),
        r => r.strip_prefix('/').filter(|id| !id.is_empty()),
    }
}

/// Admit a request: `Ok(true)` when signalbox answered it itself or served it with its own
/// driver, `Ok(false)` when a first target is pending for `upstream_peer` (the fast path).
pub async fn admit(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    metrics: &Metrics,
    connector: &Connector,
    shared: Option<&SharedAdmission>,
) -> pingora_error::Result<bool> {
    let snapshot = ctx.snapshot.clone();
    metrics.in_flight.inc();
    ctx.in_flight = true;

    let req = session.req_header();
    let seen = super::headers::scan_caller(&req.headers);
    if let Some(id) = seen.request_id {
        ctx.request_id = id;
    }
    ctx.steering = seen.steering;
    // The internal token is an `x-llm-*` header.
    ctx.internal = seen.steering && runtime.internal.recognises(&req.headers);
    // The dialect of any answer, refusals included: the endpoint's, or for the model list the
    // Anthropic SDK's (it always sends its API version).
    ctx.surface = Surface::from_path(req.uri.path()).unwrap_or_default();
    if let Err(refusal) = crate::edge::check_head(req) {
        session.set_keepalive(None);
        respond::write_error(session, ctx, refusal).await?;
        return Ok(true);
    }
    let models = models_path(req.uri.path());
    // `/v1/models` is shared by both dialects: an Anthropic SDK says so with its API version,
    // and every answer under it (refusals too) is in its shape.
    if models.is_some() && req.headers.contains_key("anthropic-version") {
        ctx.surface = Surface::Messages;
    }
    if let Some(rest) = models.filter(|_| req.method == Method::GET) {
        let dialect = ctx.surface.dialect();
        if let Err(refusal) = access::authenticate(ctx, &snapshot, &req.headers) {
            respond::write_error(session, ctx, refusal).await?;
            return Ok(true);
        }
        let ask = match rest {
            "" => match Page::parse(req.uri.query()) {
                Ok(page) => Ok(respond::ModelsAsk::List(page)),
                Err(param) => Err(GatewayError::new(
                    ErrorCode::InvalidRequest,
                    format!("`{param}` must be a whole number from 1 to 1000"),
                )),
            },
            id => Ok(respond::ModelsAsk::One(id)),
        };
        // An id as the SDKs send it may be percent-encoded (`auto%3Afast`).
        let decoded;
        let ask = match ask {
            Ok(respond::ModelsAsk::One(id)) if id.contains('%') => {
                decoded = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
                Ok(respond::ModelsAsk::One(&decoded))
            }
            other => other,
        };
        let key = access::key(ctx, &snapshot);
        match ask.and_then(|ask| respond::models_answer(&snapshot, dialect, key, ask)) {
            Ok(body) => respond::write_json(session, ctx, 200, body, None).await?,
            Err(err) => respond::write_error(session, ctx, err).await?,
        }
        return Ok(true);
    }
    // The one path beside the model endpoints that signalbox answers itself (a length
    // compare for every other request).
    if session.req_header().uri.path() == crate::recommend::PATH {
        return super::heap::on_heap(|| crate::recommend::serve(session, ctx, runtime)).await;
    }
    let admitted = match check_request_line(session, ctx, &snapshot) {
        Err(refusal) => Err(refusal),
        Ok(()) => match access::authenticate(ctx, &snapshot, &session.req_header().headers) {
            Err(refusal) => {
                // The body is left unread: the connection is not reused.
                session.set_keepalive(None);
                Err(refusal)
            }
            Ok(()) => match read_request(session, ctx.surface, &snapshot).await? {
                Err(refusal) => Err(refusal),
                Ok((request, own_replay)) => {
                    let route = session
                        .req_header()
                        .headers
                        .get(&respond::names::X_LLM_ROUTE)
                        .filter(|_| ctx.steering)
                        .map(http::HeaderValue::as_bytes);
                    match access::check(ctx, &snapshot, &request, route) {
                        Err(refusal) => Err(refusal),
                        Ok(()) => match route_with_knn(session, ctx, runtime, &request).await {
                            Err(refusal) => Err(refusal),
                            Ok((routed, seed)) => planning::plan_routed(
                                session, ctx, runtime, request, routed, seed, own_replay,
                            ),
                        },
                    }
                }
            },
        },
    };
    // The admitted request moves into the context before anything is awaited: a binding
    // alive across the awaits below would keep its ~2 KiB in this future for the whole
    // request (an open stream's memory).
    let admitted = admitted.map(|admitted| {
        let driven = admitted.driven;
        ctx.admitted = Some(admitted);
        driven
    });
    let refusal = match admitted {
        Ok(driven) => {
            match planning::first_target_missing(ctx) {
                // The request's own limits (and, with exact shared limits, its first target's)
                // are admitted once it has somewhere to go: a request nothing could serve
                // consumes none of them.
                None => match first_admission(ctx, shared).await {
                    // Guardrails decide once, before either driver starts (one `Option`
                    // check when none is configured).
                    None if ctx.snapshot.guardrails.is_some() && !ctx.internal => {
                        match super::guard::check(session, ctx, runtime, connector).await {
                            Some(refusal) => refusal,
                            None if driven => {
                                return driven::serve(session, ctx, runtime, connector, shared)
                                    .await
                            }
                            None => return Ok(false),
                        }
                    }
                    None if driven => {
                        return driven::serve(session, ctx, runtime, connector, shared).await
                    }
                    None => return Ok(false),
                    Some(refusal) => refusal,
                },
                Some(refusal) => refusal,
            }
        }
        Err(refusal) => refusal,
    };
    respond::write_error(session, ctx, refusal).await?;
    Ok(true)
}

/// The request's route, a knn entry's order decided before the plan is built (`crate::knn`:
/// one `Option` check when `routing_knn` is not configured, and never for an internal call,
/// which would recurse), with the request's seed.
async fn route_with_knn(
    session: &mut Session,
    ctx: &RequestCtx,
    runtime: &Runtime,
    request: &CallerRequest,
) -> Result<(crate::routing::decide::Routed, u64), GatewayError> {
    let (mut routed, seed) = planning::route_request(session, ctx, request)?;
    let snapshot = &ctx.snapshot;
    if snapshot.knn.is_some() && !ctx.internal && crate::knn::applies(snapshot, &routed) {
        let user = access::key(ctx, snapshot).and_then(|k| k.user.as_deref());
        let ask = crate::knn::Ask::read(&session.req_header().headers, user);
        super::heap::on_heap(|| crate::knn::route(runtime, snapshot, request, ask, &mut routed))
            .await;
    }
    Ok((routed, seed))
}

/// Admit the request and its first target (moving on while the shared store finds targets
/// full); `Some` is the caller's refusal.
async fn first_admission(
    ctx: &mut RequestCtx,
    shared: Option<&SharedAdmission>,
) -> Option<GatewayError> {
    loop {
        match admission::admit_next(ctx, shared).await {
            Admission::Ready => return None,
            Admission::Moved => {}
            Admission::Refused(refusal) => return Some(refusal),
        }
    }
}

/// The request line and headers: the endpoint, the method, the header budget.
fn check_request_line(
    session: &Session,
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
) -> Result<(), GatewayError> {
    let req = session.req_header();
    let path = req.uri.path();
    let Some(surface) = Surface::from_path(path) else {
        let code = if matches!(path, "/v1/models" | "/models") {
            ErrorCode::MethodNotAllowed
        } else {
            ErrorCode::NotFound
        };
        return Err(GatewayError::new(
            code,
            "no such endpoint; signalbox serves POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/messages, /v1/messages/count_tokens and GET /v1/models",
        ));
    };
    ctx.surface = surface;
    if req.method != Method::POST {
        return Err(GatewayError::new(
            ErrorCode::MethodNotAllowed,
            "this endpoint does not take this method",
        ));
    }
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if header_bytes > snapshot.limits.max_request_headers {
        return Err(GatewayError::new(
            ErrorCode::HeadersTooLarge,
            "the request headers exceed the gateway's limit",
        ));
    }
    Ok(())
}

/// Read the whole body (bounded, arranged so Pingora replays it on every attempt) and scan it;
/// with it, whether only the hold path can replay it.
/// A refusal that leaves body bytes unread also closes the connection after the answer.
async fn read_request(
    session: &mut Session,
    surface: Surface,
    snapshot: &Snapshot,
) -> pingora_error::Result<Result<(CallerRequest, bool), GatewayError>> {
    let limit = snapshot.limits.max_request_body;
    let too_large = |session: &mut Session| {
        session.set_keepalive(None);
        GatewayError::new(
            ErrorCode::RequestTooLarge,
            format!("the request body exceeds the gateway's limit of {limit} bytes"),
        )
    };
    let framing = body::framing(session);
    if let Framing::Length(n) = framing {
        if n > limit {
            return Ok(Err(too_large(session)));
        }
    }
    let expects_continue = session
        .req_header()
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        session.as_mut().write_continue_response().await?;
    }
    // The whole body within `limits.body_timeout` (Pingora's own timeout is per read).
    let timeout = snapshot.limits.body_timeout;
    // With the first-chunk hold on, every request is driven by signalbox (`planning`): none
    // goes through Pingora's proxy loop, whose retry buffer would replay the body.
    let pingora_replays = snapshot.failover.first_chunk_hold.is_none();
    let read = super::bounded::within(
        timeout,
        body::read_whole_body(session, framing, limit, pingora_replays),
    );
    let body = match read.await {
        Ok(Ok(b)) => b,
        Ok(Err(BodyError::TooLarge)) => return Ok(Err(too_large(session))),
        Ok(Err(BodyError::Read(e))) => {
            session.set_keepalive(None);
            return crate::edge::body_refusal(e, timeout).map(Err);
        }
        Err(_) => {
            session.set_keepalive(None);
            return Ok(Err(crate::edge::body_timeout(timeout)));
        }
    };
    let own_replay = body.own_replay;
    Ok(CallerRequest::parse(surface, body.bytes)
        .map(|request| (request, own_replay))
        .map_err(|message| GatewayError::new(ErrorCode::InvalidRequest, message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `f` returns for these argument types, without calling it.
    fn returned_size<F, A, B, C, D, E, F2, R>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D, E, F2) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// An open stream keeps `request_filter`'s future (this one, awaited inside it) until it
    /// ends: its size is memory per open stream. The large, short-lived phases (the upstream
    /// connect, the hedge race, the knn call, the shared store, the pool release) run on the
    /// heap (`super::super::heap`); one of them awaited inline again would add its ~9 KiB
    /// here (3,224 bytes when this was written, debug and release alike; 16.6 KiB before).
    #[test]
    fn the_request_future_an_open_stream_keeps_stays_small() {
        let size = returned_size::<
            _,
            &'static mut Session,
            &'static mut RequestCtx,
            &'static Runtime,
            &'static Metrics,
            &'static Connector,
            Option<&'static SharedAdmission>,
            _,
        >(admit);
        assert!(size <= 4 * 1024, "intake::admit's future is {size} bytes");
    }
}
