//! The response on its way back, the same for both drivers: the upstream header is read (its
//! status and time recorded, a credential the provider says is exhausted rested, a failure's
//! `Retry-After` taken) and judged; the body's relay is set up (the caller's `model` back in
//! JSON and every SSE event, a translation, a refusal in signalbox's words); the header that
//! commits gets the routing headers; a committed stream that ends badly gets the dialect's
//! error event in-band instead of a clean end.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue};
use pingora_http::ResponseHeader;

use super::ctx::{Broke, Downstream, RequestCtx};
use super::respond;
use crate::adapters::caller::CallerRequest;
use crate::adapters::chat_messages::BadUpstream;
use crate::adapters::relay::{is_context_length_error, stream_error_event, Relay, Reply};
use crate::adapters::stream::InbandError;
use crate::attempt::{self, BodyEnd, Outcome, ProviderError, Sent, Shown, Unreadable, Verdict};
use crate::catalog::surface::Conversion;
use crate::config::CredentialChoice;
use crate::limits::provider::{carries_remaining, exhausted_for, remaining};

/// Cap on a provider's `Retry-After` when `health.max_ejection` sets none.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);

/// How the caller's response header differs from the provider's, decided by
/// [`read_header`]: a refusal in signalbox's words gets a header of signalbox's own; an
/// answer may be re-framed (a fixed length, chunked) or re-typed (a translation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallerFraming {
    /// A fresh header: JSON, chunked (the refusal's body is rewritten).
    refusal: bool,
    /// `content-length` set to this (a same-dialect JSON body padded to a known bound).
    fixed_len: Option<usize>,
    /// `content-length` removed and the body chunked (its length changes).
    rechunk: bool,
    /// `content-type` set to this (a translated answer).
    content_type: Option<&'static str>,
}

impl CallerFraming {
    fn apply(self, headers: &mut http::HeaderMap) {
        if let Some(len) = self.fixed_len {
            headers.insert(header::CONTENT_LENGTH, super::headers::int_value(len));
        } else if self.rechunk {
            headers.remove(header::CONTENT_LENGTH);
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        if let Some(t) = self.content_type {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
        }
    }

    fn edits(self) -> bool {
        self.fixed_len.is_some() || self.rechunk || self.content_type.is_some()
    }
}

/// A header of signalbox's own for a refusal relayed in its words.
fn refusal_header(status: u16) -> Option<ResponseHeader> {
    let mut fresh = ResponseHeader::build(status, Some(4)).ok()?;
    let _ = fresh.insert_header("content-type", "application/json");
    let _ = fresh.insert_header("transfer-encoding", "chunked");
    Some(fresh)
}

/// The fast path's header, shaped in place for the caller by `framing` (Pingora's own copy;
/// what may not reach the caller is dropped in `response_filter`, `fast::on_header`).
pub fn shape_header(framing: CallerFraming, response: &mut ResponseHeader) {
    if framing.refusal {
        if let Some(fresh) = refusal_header(response.status.as_u16()) {
            *response = fresh;
        }
    } else if framing.edits() {
        respond::edit_response_parts(response, |parts| framing.apply(&mut parts.headers));
    }
}

/// The driven path's header for the caller, built from the provider's `upstream`: only what
/// may reach the caller is copied ([`super::headers::to_caller_from`]), then shaped by
/// `framing` (one map, built once; the provider's header is left as it came).
pub fn caller_header(
    ctx: &RequestCtx,
    framing: CallerFraming,
    upstream: &ResponseHeader,
) -> CallerHead {
    if framing.refusal {
        if let Some(fresh) = refusal_header(upstream.status.as_u16()) {
            return CallerHead::Fresh(Box::new(fresh));
        }
    }
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = upstream.status;
    parts.version = upstream.version;
    // The provider's kept headers and the routing headers (about a dozen) fit without growing.
    parts.headers = http::HeaderMap::with_capacity(ROUTED_HEADER_CAPACITY);
    super::headers::to_caller_from(
        &upstream.headers,
        &mut parts.headers,
        &ctx.snapshot.response.pass_headers,
    );
    framing.apply(&mut parts.headers);
    CallerHead::Parts(parts)
}

/// The driven path's header for the caller until its commit: the parts of one signalbox built
/// from the provider's (the routing headers go straight into its map, and it becomes Pingora's
/// header once, at the commit), or a refusal's header of signalbox's own.
#[derive(Debug)]
pub enum CallerHead {
    Parts(http::response::Parts),
    /// Built as Pingora's header (its names keep the case they were written in).
    Fresh(Box<ResponseHeader>),
}

impl CallerHead {
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::Parts(p) => p.status,
            Self::Fresh(h) => h.status,
        }
    }

    /// The header that commits the request: routing headers added, the caller's side
    /// committed; Pingora's header to write.
    pub fn commit(self, ctx: &mut RequestCtx) -> Box<ResponseHeader> {
        let header = match self {
            Self::Parts(mut parts) => {
                respond::add_routing_headers_to(&mut parts.headers, ctx, Instant::now());
                Box::new(ResponseHeader::from(parts))
            }
            Self::Fresh(mut header) => {
                respond::add_routing_headers(&mut header, ctx, Instant::now());
                header
            }
        };
        ctx.downstream = Downstream::Committed {
            status: header.status.as_u16(),
        };
        header
    }
}

/// Room for a committed answer's headers: framing, type, and the routing headers.
const ROUTED_HEADER_CAPACITY: usize = 24;

/// Read and judge the live attempt's response header (not a 1xx), as the provider sent it.
/// Sets up the relay of the body for every verdict that reads it (an answer, a refusal); a
/// failure's `Retry-After` is kept for health. With the verdict, how the caller's header
/// must differ ([`shape_header`], [`caller_header`]).
pub fn read_header(
    ctx: &mut RequestCtx,
    upstream_response: &ResponseHeader,
) -> (Verdict, CallerFraming) {
    let status = upstream_response.status.as_u16();
    let local = Verdict::Retry {
        outcome: Outcome::LocalError,
        scope: attempt::Scope::Deployment,
    };
    let Some(a) = ctx.admitted.as_mut() else {
        return (local, CallerFraming::default());
    };
    let snapshot = &ctx.snapshot;
    let health = &snapshot.health;
    let Some(live) = a.attempts.live.as_mut() else {
        return (local, CallerFraming::default());
    };
    live.header_at = Some(Instant::now());
    live.status = Some(status);
    // The wall clock, read only for what needs it (rate-limit resets, `Retry-After`).
    let wall = || health.shared.clock.wall();
    // A provider that says (in its rate-limit headers) that this credential has used up a
    // window gets it rested until the window resets: later requests take another credential
    // or candidate instead of earning the provider's 429.
    let exhausted = carries_remaining(&upstream_response.headers)
        .then(|| exhausted_for(&upstream_response.headers, wall()))
        .flatten();
    if let Some(wait) = exhausted {
        if let Some(c) = health.credential(live.provider, live.target.credential) {
            let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            c.on_exhausted(health.shared.now_ms().saturating_add(millis));
        }
    }
    // A provider whose keys are chosen by their remaining quota: note what this answer says
    // is left of this key's windows (only then are the counts read).
    if snapshot.catalog.provider(live.provider).credential_choice
        == CredentialChoice::LeastRemainingQuota
    {
        if let Some(left) = remaining(&upstream_response.headers, wall()) {
            if let Some(c) = health.credential(live.provider, live.target.credential) {
                c.note_quota(&left, health.shared.now_ms());
            }
        }
    }
    let verdict = attempt::judge(Sent::Header { status }, a.terms, false);
    let framing = match verdict {
        Verdict::Retry { outcome, .. } => {
            let cap = health.policy.max_ejection.unwrap_or(RETRY_AFTER_CAP);
            live.retry_after = upstream_response
                .headers
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| attempt::parse_retry_after(v, wall(), cap));
            if let (Outcome::RateLimited, Some(wait)) = (outcome, live.retry_after) {
                a.attempts.failures.note_retry_after(wait.as_secs().max(1));
            }
            CallerFraming::default()
        }
        Verdict::Refuse { .. } | Verdict::Pending if !upstream_response.status.is_success() => {
            // The caller's request was refused: relayed in signalbox's words, under a header
            // of signalbox's own.
            a.attempts.relay = Relay::refusal(ctx.surface, a.attempts.conversion, status);
            CallerFraming {
                refusal: true,
                ..CallerFraming::default()
            }
        }
        _ => choose_relay(ctx, upstream_response),
    };
    (verdict, framing)
}

/// How the body of a successful response is relayed, and its framing to match: an SSE stream
/// is rewritten (or translated) event by event (re-framed); a same-dialect JSON body keeps a
/// length framing when the upstream gave one (raised to the bound `fixed_json_length`
/// guarantees), a translated one is re-framed. A compressed body is relayed untouched
/// (signalbox never asks for compression, so only a provider that ignores `Accept-Encoding`
/// sends one).
fn choose_relay(ctx: &mut RequestCtx, upstream_response: &ResponseHeader) -> CallerFraming {
    let snapshot = &ctx.snapshot;
    let Some(a) = ctx.admitted.as_mut() else {
        return CallerFraming::default();
    };
    let headers = &upstream_response.headers;
    let find = |name| headers.get(name);
    let encoded = find(&header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return CallerFraming::default();
    }
    let content_type = find(&header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let request = &a.request;
    let provider_id = a.attempts.live.as_ref().and_then(|l| {
        snapshot
            .response
            .provider_field
            .then(|| snapshot.catalog.provider(l.provider).id.clone())
    });
    let conversion = a.attempts.conversion;
    // The serving deployment's price: a priced answer reports its cost in `usage.cost_usd`.
    let price = a.attempts.live.as_ref().and_then(|l| {
        a.plan
            .deployment(&snapshot.catalog, l.target.position)
            .and_then(|d| d.price)
    });
    let reply = Reply {
        surface: ctx.surface,
        conversion,
        caller_model: request.model_literal(),
        provider: provider_id.as_deref(),
        strip_usage: request.adds_stream_usage(ctx.surface),
        caller_usage: CallerRequest::caller_wants_stream_usage(request),
        price,
    };
    let sse = starts_with_ignore_case(content_type, b"text/event-stream");
    if sse {
        a.attempts.sse = true;
        a.attempts.relay = Relay::sse(&reply);
    } else if starts_with_ignore_case(content_type, b"application/json") {
        let upstream_len = find(&header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        a.attempts.relay = Relay::json(&reply, upstream_len);
    }
    let content_type = match conversion {
        Conversion::Same => None,
        _ if sse => Some("text/event-stream"),
        _ => Some("application/json"),
    };
    let fixed_len = a.attempts.relay.fixed_len();
    CallerFraming {
        refusal: false,
        fixed_len,
        rechunk: fixed_len.is_none() && a.attempts.relay.changes_length(),
        content_type,
    }
}

/// The fast path's header that commits the request: of Pingora's copy of the provider's
/// header only what may reach the caller is kept, the routing headers are added (one round
/// trip through the header's parts for both), and the caller's side is committed.
pub fn commit_header(ctx: &mut RequestCtx, response: &mut ResponseHeader) {
    let pass = &ctx.snapshot.response.pass_headers;
    let now = Instant::now();
    respond::edit_response_parts(response, |parts| {
        super::headers::to_caller(&mut parts.headers, pass);
        respond::add_routing_headers_to(&mut parts.headers, ctx, now);
    });
    ctx.downstream = Downstream::Committed {
        status: response.status.as_u16(),
    };
}

/// Filter one chunk of the live answer's body through its relay.
pub fn filter_body(ctx: &mut RequestCtx, body: &mut Option<Bytes>, end_of_stream: bool) {
    if let Some(a) = ctx.admitted.as_mut() {
        a.attempts.relay.filter(body, end_of_stream);
    }
}

/// The body so far, judged (committed or not, as the caller's side stands).
pub fn judge_body(ctx: &RequestCtx, end: BodyEnd) -> Verdict {
    let Some(a) = &ctx.admitted else {
        return Verdict::Ended(Outcome::Cancelled);
    };
    let shown = shown(&a.attempts.relay);
    attempt::judge(
        Sent::Body {
            shown: &shown,
            sse: a.attempts.sse,
            end,
        },
        a.terms,
        ctx.downstream.is_committed(),
    )
}

/// What the relay read of the body, in the verdict's words.
fn shown(relay: &Relay) -> Shown {
    let signals = relay.signals();
    Shown {
        content: signals.content,
        terminal: signals.terminal,
        error: signals.error.map(|e| match e {
            InbandError::Overloaded => ProviderError::Overloaded,
            InbandError::Server => ProviderError::Server,
            InbandError::InvalidRequest => ProviderError::InvalidRequest,
        }),
        empty_choices: signals.empty_choices,
        unreadable: relay.bad_upstream().map(|b| match b {
            BadUpstream::EmptyChoices => Unreadable::EmptyChoices,
            BadUpstream::NotJson | BadUpstream::Malformed(_) => Unreadable::Malformed,
        }),
    }
}

/// A refusal's whole body as the verdict reads it (a policy that fails over on client errors
/// read it first): whether it says the prompt is over the context window.
pub fn refusal_read(ctx: &RequestCtx) -> Sent<'static> {
    let context_length = ctx.admitted.as_ref().is_some_and(|a| {
        a.attempts
            .relay
            .refused_body()
            .is_some_and(is_context_length_error)
    });
    Sent::Refusal { context_length }
}

/// A committed body's last chunk: how the attempt ended. A stream that ended without its
/// terminal event, or without any content, says so in-band rather than let a truncated answer
/// look complete.
pub fn end_committed_body(ctx: &mut RequestCtx, body: &mut Option<Bytes>) -> Verdict {
    let verdict = judge_body(ctx, BodyEnd::Complete);
    let Some(a) = &ctx.admitted else {
        return verdict;
    };
    let signals = *a.attempts.relay.signals();
    if a.attempts.sse && !signals.terminal && signals.error.is_none() {
        let (msg, code) = if signals.content {
            (
                "the provider ended the stream before it was complete",
                "upstream_stream_interrupted",
            )
        } else {
            (
                "the provider ended the stream without producing any output",
                "upstream_empty_stream",
            )
        };
        let mut out = BytesMut::new();
        if let Some(b) = body.take() {
            out.extend_from_slice(&b);
        }
        out.extend_from_slice(&stream_error_event(ctx.surface, msg, code));
        *body = Some(out.freeze());
        ctx.downstream.break_with(Broke::Interrupted);
    } else if verdict == Verdict::Ended(Outcome::StreamAborted) {
        // The provider's own error after content: relayed (reworded) as the stream's end.
        ctx.downstream.break_with(Broke::Interrupted);
    }
    verdict
}

fn starts_with_ignore_case(hay: &[u8], prefix: &[u8]) -> bool {
    hay.len() >= prefix.len() && hay[..prefix.len()].eq_ignore_ascii_case(prefix)
}
