//! The response on its way back: the upstream status decides (relay, refuse in signalbox's
//! words, or fail over before anything reaches the client); the header gets the routing
//! headers and commits the request; the body gets the caller's `model` name back (JSON and
//! every SSE event) and a broken stream gets an in-band error event instead of a clean end.

use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderName, HeaderValue};
use pingora_error::{Error, ErrorType};
use pingora_http::ResponseHeader;

use super::ctx::RequestCtx;
use super::{planning, respond};
use crate::adapters::caller::CallerRequest;
use crate::adapters::relay::{is_context_length_error, stream_error_event, Relay, Reply};
use crate::limits::provider::exhausted_for;
use crate::retry::{self, Advance, Outcome, StatusVerdict};

/// Response headers of the provider that describe its account, not the answer.
static DROPPED_RESPONSE_HEADERS: [HeaderName; 3] = [
    header::SET_COOKIE,
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
];
/// Cap on an upstream `Retry-After` relayed to callers.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);

/// `upstream_response_filter`: classify the status. A failover status returns `Err` before
/// the header reaches the client, so Pingora's loop calls `upstream_peer` again.
pub fn on_upstream_header(
    ctx: &mut RequestCtx,
    upstream_response: &mut ResponseHeader,
) -> pingora_error::Result<()> {
    let status = upstream_response.status.as_u16();
    if upstream_response.status.is_informational() {
        return Ok(());
    }
    if let Some(a) = ctx.current.as_mut() {
        a.header_at = Some(Instant::now());
        a.status = Some(status);
    }
    rest_exhausted_credential(ctx, upstream_response);
    match retry::classify_status(status) {
        StatusVerdict::Success => {
            choose_relay(ctx, upstream_response);
            ctx.served = ctx.current;
            Ok(())
        }
        StatusVerdict::Relay => {
            // Under a policy that fails over on client errors, the refusal is read first (a
            // context-length error moves to a larger context window only): the decision is
            // made on the body, before the header goes out.
            ctx.client_error_pending = ctx.failover_on_client_error;
            ctx.relay = Relay::refusal(ctx.surface, ctx.conversion, status);
            let mut fresh = ResponseHeader::build(status, Some(4))?;
            fresh.insert_header("content-type", "application/json")?;
            fresh.insert_header("transfer-encoding", "chunked")?;
            *upstream_response = fresh;
            ctx.served = ctx.current;
            Ok(())
        }
        StatusVerdict::Failover { outcome, advance } => {
            let wall = ctx
                .router
                .as_ref()
                .map_or_else(SystemTime::now, |r| r.health.clock.wall());
            ctx.retry_after = upstream_response
                .headers
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry::parse_retry_after(v, wall, RETRY_AFTER_CAP));
            if let (Outcome::RateLimited, Some(wait)) = (outcome, ctx.retry_after) {
                ctx.failures.note_retry_after(wait.as_secs().max(1));
            }
            ctx.status_outcome = Some((outcome, advance));
            Err(Error::explain(
                ErrorType::HTTPStatus(status),
                "upstream status triggers failover",
            )
            .into_up())
        }
    }
}

/// A provider that says (in its rate-limit headers) that this credential has used up a window
/// gets the credential rested until the window resets: later requests take another credential
/// or candidate instead of earning the provider's 429.
fn rest_exhausted_credential(ctx: &RequestCtx, upstream_response: &ResponseHeader) {
    let (Some(router), Some(tables), Some(attempt)) = (&ctx.router, &ctx.tables, &ctx.current)
    else {
        return;
    };
    let Some(wait) = exhausted_for(&upstream_response.headers, router.health.clock.wall()) else {
        return;
    };
    let credential = attempt.target.credential;
    if let Some(c) = tables.health.credential(attempt.provider, credential) {
        let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        c.on_exhausted(router.health.now_ms().saturating_add(millis));
    }
}

/// How the body of a successful response is relayed, and its framing to match: an SSE stream
/// is rewritten (or translated) event by event (re-framed); a same-dialect JSON body keeps a
/// length framing when the upstream gave one (raised to the bound `fixed_json_length`
/// guarantees), a translated one is re-framed. A compressed body is relayed untouched
/// (signalbox never asks for compression, so only a provider that ignores `Accept-Encoding`
/// sends one).
fn choose_relay(ctx: &mut RequestCtx, upstream_response: &mut ResponseHeader) {
    let headers = &upstream_response.headers;
    let encoded = headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return;
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let request = ctx.request.as_ref();
    let provider_id = ctx.current.and_then(|a| {
        let tables = ctx.tables.as_ref()?;
        tables
            .response
            .provider_field
            .then(|| tables.catalog.provider(a.provider).id.clone())
    });
    let reply = Reply {
        surface: ctx.surface,
        conversion: ctx.conversion,
        caller_model: request
            .map(CallerRequest::model_literal)
            .unwrap_or_default(),
        provider: provider_id.as_deref(),
        strip_usage: request.is_some_and(|r| r.adds_stream_usage(ctx.surface)),
        caller_usage: request.is_some_and(CallerRequest::caller_wants_stream_usage),
    };
    let sse = starts_with_ignore_case(content_type, b"text/event-stream");
    if sse {
        ctx.is_sse = true;
        ctx.relay = Relay::sse(&reply);
    } else if starts_with_ignore_case(content_type, b"application/json") {
        let upstream_len = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        ctx.relay = Relay::json(&reply, upstream_len);
    }
    let translated_type = match ctx.conversion {
        crate::catalog::surface::Conversion::Same => None,
        _ if sse => Some("text/event-stream"),
        _ => Some("application/json"),
    };
    let fixed_len = ctx.relay.fixed_len();
    let changes_length = ctx.relay.changes_length();
    respond::edit_response_parts(upstream_response, |parts| {
        if let Some(len) = fixed_len {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        } else if changes_length {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        if let Some(t) = translated_type {
            parts
                .headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
        }
    });
}

/// `response_filter`: routing headers; from here on the request is committed.
pub fn on_header(ctx: &mut RequestCtx, response: &mut ResponseHeader) {
    if response.status.is_informational() {
        return;
    }
    respond::add_routing_headers(response, ctx, Instant::now(), &DROPPED_RESPONSE_HEADERS);
    ctx.status = Some(response.status.as_u16());
    // A refusal that may still fail over is committed only once its header is written.
    ctx.committed = !ctx.client_error_pending;
    if response.status.is_success() {
        planning::bind_session(ctx);
    }
}

/// `response_body_filter`: the rewrite, stream accounting, and an error event for a stream
/// the upstream ended without its terminator. A provider's refusal under a policy that fails
/// over on client errors returns `Err` instead (the next candidate is tried) when its header
/// has not been written yet (`header_written`: it went out in an earlier write, and then the
/// refusal is relayed).
pub fn on_body(
    ctx: &mut RequestCtx,
    body: &mut Option<Bytes>,
    end_of_stream: bool,
    header_written: bool,
) -> pingora_error::Result<()> {
    ctx.relay.filter(body, end_of_stream);
    if ctx.client_error_pending && end_of_stream {
        ctx.client_error_pending = false;
        if header_written {
            ctx.committed = true;
        } else {
            let context = ctx
                .relay
                .refused_body()
                .is_some_and(is_context_length_error);
            if context {
                ctx.context_floor = Some(context_floor(ctx));
                ctx.failures.note_context_exceeded();
            }
            ctx.served = None;
            ctx.status = None;
            ctx.status_outcome = Some((Outcome::ClientError, Advance::NextDeployment));
            return Err(Error::explain(
                ErrorType::HTTPStatus(400),
                "a caller error the policy fails over",
            )
            .into_up());
        }
    }
    let signals = *ctx.relay.signals();
    if end_of_stream && ctx.is_sse && !signals.terminal && signals.error.is_none() {
        // Say so in-band rather than let a truncated answer look complete.
        let (msg, code) = if !signals.content {
            (
                "the provider ended the stream without producing any output",
                "upstream_empty_stream",
            )
        } else {
            (
                "the provider ended the stream before it was complete",
                "upstream_stream_interrupted",
            )
        };
        let mut out = BytesMut::new();
        if let Some(b) = body.take() {
            out.extend_from_slice(&b);
        }
        out.extend_from_slice(&stream_error_event(ctx.surface, msg, code));
        *body = Some(out.freeze());
        ctx.stream_broken = true;
    }
    Ok(())
}

/// The context window the next candidate must exceed after a context-length refusal: the
/// refusing model's, or (when it declares none) the request's own estimate.
fn context_floor(ctx: &RequestCtx) -> u64 {
    let window = ctx.current.and_then(|a| {
        let (tables, plan) = (ctx.tables.as_ref()?, ctx.plan.as_ref()?);
        let d = plan.deployment(&tables.catalog, a.target.position)?;
        tables.catalog.model(d.model?).context_window
    });
    window.map_or_else(
        || ctx.request.as_ref().map_or(0, CallerRequest::prompt_tokens),
        u64::from,
    )
}

fn starts_with_ignore_case(hay: &[u8], prefix: &[u8]) -> bool {
    hay.len() >= prefix.len() && hay[..prefix.len()].eq_ignore_ascii_case(prefix)
}
