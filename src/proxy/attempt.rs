//! One attempt: turning the pending target into a connection and a request for it.
//!
//! `upstream_peer` starts the attempt (the peer on a pre-resolved address, the body for this
//! target's upstream model, the in-flight count and probe slot in health); the request header
//! is rewritten for the target (its credential replaces every client auth header, `Host` and
//! path follow its base URL); and the body Pingora replays from its retry buffer is swapped
//! for the whole rewritten body.

use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;

use super::ctx::{Attempt, AttemptBody, RequestCtx};
use super::respond;
use crate::adapters::anthropic::ANTHROPIC_VERSION;
use crate::adapters::chat_messages::Unexpressible;
use crate::adapters::relay::Relay;
use crate::catalog::surface::{Conversion, Dialect};
use crate::config::ProviderKind;
use crate::health::TargetRef;

/// Headers a client may use to authenticate to signalbox; never forwarded upstream.
static CLIENT_AUTH_HEADERS: [HeaderName; 4] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    header::PROXY_AUTHORIZATION,
];
/// Request headers that describe the caller's hop or speak to signalbox, not to the provider.
static HOP_AND_GATEWAY_HEADERS: [HeaderName; 8] = [
    header::EXPECT,
    header::TRANSFER_ENCODING,
    header::ACCEPT_ENCODING,
    respond::names::X_LLM_SESSION,
    respond::names::X_LLM_ROUTE,
    respond::names::X_LLM_ROUTER,
    respond::names::X_LLM_METADATA,
    header::COOKIE,
];

const ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
const ANTHROPIC_BETA_HEADER: HeaderName = HeaderName::from_static("anthropic-beta");

fn internal(why: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, why)
}

/// Start the attempt on the pending target: its peer, its body, its health bookkeeping.
pub fn begin(ctx: &mut RequestCtx) -> pingora_error::Result<Box<HttpPeer>> {
    if prepare_body(ctx).is_err() {
        // Only the hold path translates, and it prepares the body (and skips a target that
        // cannot express the request) before it begins an attempt.
        return Err(internal("the request cannot be expressed for this target"));
    }
    let tables = ctx
        .tables
        .clone()
        .ok_or_else(|| internal("no routing snapshot"))?;
    let target = ctx
        .pending
        .take()
        .ok_or_else(|| internal("no target left"))?;
    let deployment = ctx
        .plan
        .as_ref()
        .and_then(|plan| plan.deployment(&tables.catalog, target.position))
        .ok_or_else(|| internal("target has no deployment"))?;
    let provider = deployment.provider;
    let peer = tables
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
    ctx.first_attempt_at.get_or_insert(now);
    ctx.attempts += 1;
    ctx.current = Some(Attempt {
        target,
        provider,
        started: now,
        header_at: None,
        status: None,
    });
    ctx.guard = Some(tables.health.begin(health_ref, target.probe));
    // The deployment's request window (its `rpm`, its headroom), counted per call made.
    deployment.requests.add(tables.health.shared.wall_s(), 1);
    ctx.status_outcome = None;
    ctx.retry_after = None;
    // What an earlier attempt's response set up does not carry over.
    ctx.relay = Relay::passthrough();
    ctx.client_error_pending = false;
    Ok(Box::new(peer))
}

/// The body the pending target gets, in its dialect: rebuilt only when the upstream model or
/// the conversion changes. A target whose dialect cannot express the request is refused with
/// the field it cannot carry.
pub fn prepare_body(ctx: &mut RequestCtx) -> Result<(), Unexpressible> {
    let (Some(tables), Some(plan), Some(target), Some(request)) =
        (&ctx.tables, &ctx.plan, &ctx.pending, &ctx.request)
    else {
        return Ok(());
    };
    let Some(deployment) = plan.deployment(&tables.catalog, target.position) else {
        return Ok(());
    };
    let kind = tables.catalog.provider(deployment.provider).kind;
    let conversion = ctx.surface.served_by(kind).unwrap_or(Conversion::Same);
    let reuse = ctx.attempt_body.as_ref().is_some_and(|b| {
        b.conversion == conversion && b.upstream_model == deployment.upstream_model_json
    });
    if !reuse {
        let bytes = request.body_for(
            ctx.surface,
            conversion,
            &deployment.upstream_model,
            &deployment.upstream_model_json,
        )?;
        ctx.attempt_body = Some(AttemptBody {
            upstream_model: deployment.upstream_model_json.clone(),
            conversion,
            bytes,
        });
    }
    ctx.conversion = conversion;
    Ok(())
}

/// The request header for the current attempt's target.
pub fn rewrite_request_header(
    ctx: &RequestCtx,
    upstream_request: &mut RequestHeader,
) -> pingora_error::Result<()> {
    let (Some(tables), Some(attempt), Some(plan)) = (&ctx.tables, &ctx.current, &ctx.plan) else {
        return Err(internal("no attempt in progress"));
    };
    let deployment = plan
        .deployment(&tables.catalog, attempt.target.position)
        .ok_or_else(|| internal("no deployment"))?;
    let provider = tables.catalog.provider(deployment.provider);
    let auth = provider.credentials[attempt.target.credential]
        .auth
        .as_ref();
    let surface = ctx.surface;
    let anthropic_caller = surface.dialect() == Dialect::Anthropic;
    let len = ctx.attempt_body.as_ref().map_or(0, |b| b.bytes.len());
    respond::edit_request_parts(upstream_request, |parts| {
        let headers = &mut parts.headers;
        for name in CLIENT_AUTH_HEADERS.iter().chain(&HOP_AND_GATEWAY_HEADERS) {
            headers.remove(name);
        }
        match provider.kind {
            ProviderKind::Anthropic => {
                // The caller's own version and betas pass on a same-dialect call; a translated
                // request is written for the version signalbox speaks.
                if !anthropic_caller || !headers.contains_key(ANTHROPIC_VERSION_HEADER) {
                    headers.insert(
                        ANTHROPIC_VERSION_HEADER,
                        HeaderValue::from_static(ANTHROPIC_VERSION),
                    );
                }
                if !anthropic_caller {
                    headers.remove(ANTHROPIC_BETA_HEADER);
                }
            }
            ProviderKind::OpenAi => {
                headers.remove(ANTHROPIC_VERSION_HEADER);
                headers.remove(ANTHROPIC_BETA_HEADER);
            }
        }
        if let Some(auth) = auth {
            headers.insert(auth.header_name().clone(), auth.header_value().clone());
        }
        parts.uri = provider.uri(surface.endpoint(provider.kind)).clone();
        headers.insert(header::HOST, provider.host_header.clone());
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        headers.insert(respond::names::X_REQUEST_ID, ctx.request_id.clone());
    });
    Ok(())
}

/// Pingora hands over its retry-buffer tail (or nothing) once per attempt, with
/// `end_of_stream`: replace it with the whole rewritten body.
pub fn swap_body(ctx: &RequestCtx, body: &mut Option<Bytes>, end_of_stream: bool) {
    *body = if end_of_stream {
        ctx.attempt_body.as_ref().map(|b| b.bytes.clone())
    } else {
        None
    };
}
