//! One attempt's request: turning the next target into a connection and a request for it,
//! the same for both drivers.
//!
//! [`begin`] starts the attempt (the peer on a pre-resolved address, the in-flight count and
//! the probe slot in health); [`prepare_body`] builds the body for the target's upstream model
//! and dialect; the request header is rewritten for the target (only what
//! [`super::headers::to_provider_from`] allows of the caller's, then the provider's own `headers`,
//! its credential, `Host` and path from its base URL); and on the fast path the body
//! Pingora replays from its retry buffer is swapped for the whole rewritten body.

use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;

use super::ctx::{Admitted, AttemptBody, Live, RequestCtx};
use super::respond;
use crate::adapters::anthropic::ANTHROPIC_VERSION;
use crate::adapters::chat_messages::Unexpressible;
use crate::adapters::relay::Relay;
use crate::catalog::surface::{Conversion, Dialect, Surface};
use crate::config::ProviderKind;
use crate::health::TargetRef;
use crate::snapshot::Snapshot;

const ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");

fn internal(why: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, why)
}

/// Start the next attempt: its peer (a pre-resolved address, TLS/SNI, timeouts), its health
/// bookkeeping (the in-flight count, the probe slot it holds), its count. The target must
/// have been admitted (`admission::admit_next`) and the body prepared for it
/// ([`prepare_body`]).
pub fn begin(snapshot: &Snapshot, a: &mut Admitted) -> pingora_error::Result<Box<HttpPeer>> {
    let next = a
        .attempts
        .next
        .take()
        .ok_or_else(|| internal("no target left"))?;
    let target = next.target;
    let hold = next.hold.unwrap_or_default();
    let deployment = a
        .plan
        .deployment(&snapshot.catalog, target.position)
        .ok_or_else(|| internal("target has no deployment"))?;
    let provider = deployment.provider;
    let peer = snapshot
        .catalog
        .provider(provider)
        .peer()
        .ok_or_else(|| internal("target has no address"))?;
    let health_ref = TargetRef {
        deployment: deployment.model.map(|_| deployment.idx),
        provider,
        credential: target.credential,
    };
    let now = Instant::now();
    let at = &mut a.attempts;
    at.first_at.get_or_insert(now);
    at.made += 1;
    at.live = Some(Live {
        target,
        provider,
        started: now,
        header_at: None,
        status: None,
        guard: snapshot.health.begin(health_ref, next.claim),
        retry_after: None,
        hold,
    });
    if hold.request_at.is_none() {
        // The deployment's request window (its `rpm`, its headroom), counted per call made
        // (exact shared admission already counted it).
        deployment.requests.add(snapshot.health.shared.wall_s(), 1);
    }
    // What an earlier attempt's response set up does not carry over.
    at.relay = Relay::passthrough();
    at.sse = false;
    Ok(Box::new(peer))
}

/// The body the next target gets, in its dialect: rebuilt only when the upstream model or the
/// conversion changes. A target whose dialect cannot express the request is refused with the
/// field it cannot carry.
pub fn prepare_body(
    snapshot: &Snapshot,
    surface: Surface,
    a: &mut Admitted,
) -> Result<(), Unexpressible> {
    let Some(next) = &a.attempts.next else {
        return Ok(());
    };
    let Some(deployment) = a.plan.deployment(&snapshot.catalog, next.target.position) else {
        return Ok(());
    };
    let kind = snapshot.catalog.provider(deployment.provider).kind;
    let conversion = surface.served_by(kind).unwrap_or(Conversion::Same);
    let reuse = a.attempts.body.as_ref().is_some_and(|b| {
        b.conversion == conversion && b.upstream_model == deployment.upstream_model_json
    });
    if !reuse {
        let bytes = a.request.body_for(
            surface,
            conversion,
            &deployment.upstream_model,
            &deployment.upstream_model_json,
        )?;
        a.attempts.body = Some(AttemptBody {
            upstream_model: deployment.upstream_model_json.clone(),
            conversion,
            bytes,
        });
    }
    a.attempts.conversion = conversion;
    Ok(())
}

/// The request header for the live attempt's target, built from the caller's `caller`: a
/// fresh map holding only what [`super::headers::to_provider_from`] keeps of the caller's headers
/// (copied by reference, in order), then what signalbox sets. Nothing else of the caller's
/// header is copied (it is never written upstream).
pub fn upstream_request_header(
    ctx: &RequestCtx,
    caller: &RequestHeader,
) -> pingora_error::Result<RequestHeader> {
    let snapshot = &ctx.snapshot;
    let Some(a) = &ctx.admitted else {
        return Err(internal("no attempt in progress"));
    };
    let live = a
        .attempts
        .live
        .as_ref()
        .ok_or_else(|| internal("no attempt in progress"))?;
    let deployment = a
        .plan
        .deployment(&snapshot.catalog, live.target.position)
        .ok_or_else(|| internal("no deployment"))?;
    let provider = snapshot.catalog.provider(deployment.provider);
    let auth = provider
        .credentials
        .get(live.target.credential)
        .and_then(|c| c.auth.as_ref());
    let surface = ctx.surface;
    // The caller's own version and betas pass on a same-dialect call; a translated request is
    // written for the version signalbox speaks.
    let same_dialect = surface.dialect() == Dialect::Anthropic;
    let len = a.attempts.body.as_ref().map_or(0, |b| b.bytes.len());
    // The caller's kept headers, then at most these: version, the provider's own, the
    // credential, host, length, request id.
    let mut headers = HeaderMap::with_capacity(caller.headers.len() + provider.headers.len() + 6);
    super::headers::to_provider_from(
        &caller.headers,
        &mut headers,
        provider.kind,
        same_dialect,
        &snapshot.request.pass_headers,
    );
    if provider.kind == ProviderKind::Anthropic
        && (!same_dialect || !headers.contains_key(ANTHROPIC_VERSION_HEADER))
    {
        headers.insert(
            ANTHROPIC_VERSION_HEADER,
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
    }
    for (name, value) in &provider.headers {
        headers.insert(name.clone(), value.clone());
    }
    if let Some(auth) = auth {
        headers.insert(auth.header_name().clone(), auth.header_value().clone());
    }
    headers.insert(header::HOST, provider.host_header.clone());
    headers.insert(header::CONTENT_LENGTH, super::headers::int_value(len));
    headers.insert(respond::names::X_REQUEST_ID, ctx.request_id.clone());
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = caller.method.clone();
    parts.uri = provider.uri(surface.endpoint(provider.kind)).clone();
    parts.version = caller.version;
    parts.headers = headers;
    Ok(RequestHeader::from(parts))
}

/// [`upstream_request_header`] in place of Pingora's copy of the caller's header (the fast
/// path's `upstream_request_filter`).
pub fn rewrite_request_header(
    ctx: &RequestCtx,
    upstream_request: &mut RequestHeader,
) -> pingora_error::Result<()> {
    *upstream_request = upstream_request_header(ctx, upstream_request)?;
    Ok(())
}

/// Pingora hands over its retry-buffer tail (or nothing) once per attempt, with
/// `end_of_stream`: replace it with the whole rewritten body.
pub fn swap_body(ctx: &RequestCtx, body: &mut Option<Bytes>, end_of_stream: bool) {
    *body = if end_of_stream {
        ctx.admitted
            .as_ref()
            .and_then(|a| a.attempts.body.as_ref())
            .map(|b| b.bytes.clone())
    } else {
        None
    };
}
