//! Responses signalbox writes itself: errors in the caller's dialect (OpenAI's shape, or
//! Anthropic's for `/v1/messages` callers), `GET /v1/models` in the caller's dialect, and the
//! routing headers every proxied response carries.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use super::ctx::{Downstream, HedgeRun, RequestCtx};
use crate::adapters::anthropic::Page;
use crate::adapters::chat_messages::gateway_error_to_anthropic;
use crate::catalog::surface::Dialect;
use crate::error::{ErrorCode, GatewayError};
use crate::keys::ClientKey;
use crate::routing::decide::{Routed, Via};
use crate::routing::plan::Plan;
use crate::routing::policy::Pick;
use crate::snapshot::Snapshot;

/// Write a complete JSON response. Errors writing (the client went away) are returned so the
/// caller can log them; nothing is retried.
pub async fn write_json(
    session: &mut Session,
    ctx: &mut RequestCtx,
    status: u16,
    body: Bytes,
    retry_after: Option<u64>,
) -> pingora_error::Result<()> {
    let mut resp = ResponseHeader::build(status, Some(6))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len())?;
    resp.insert_header("x-request-id", ctx.request_id.clone())?;
    if ctx.surface.dialect() == Dialect::Anthropic {
        resp.insert_header("request-id", ctx.request_id.clone())?;
    }
    if let Some(secs) = retry_after {
        resp.insert_header("retry-after", secs)?;
    }
    let attempts = ctx.admitted.as_ref().map_or(0, |a| a.attempts.made);
    if attempts > 0 {
        resp.insert_header("x-llm-attempts", attempts)?;
    }
    if let Some(route) = route_header(ctx, &ctx.snapshot) {
        resp.insert_header("x-llm-route", route)?;
    }
    ctx.downstream = Downstream::Committed { status };
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

/// Answer with a gateway error.
pub async fn write_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    err: GatewayError,
) -> pingora_error::Result<()> {
    let body = match ctx.surface.dialect() {
        Dialect::OpenAi => err.body(),
        Dialect::Anthropic => Bytes::from(gateway_error_to_anthropic(
            err.status,
            &err.body(),
            ctx.request_id.to_str().ok(),
        )),
    };
    let (status, retry_after) = (err.status, err.retry_after);
    ctx.local_error = Some(err);
    write_json(session, ctx, status, body, retry_after).await
}

/// What a `GET` under `/v1/models` asks: the list (Anthropic callers page it), or one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelsAsk<'q> {
    List(Page<'q>),
    One(&'q str),
}

/// When this process started serving, as unix seconds and RFC 3339: the `created` /
/// `created_at` of every listed name (a catalog name has no release date; the SDKs need a
/// real time, and one that does not move between calls).
fn served_since() -> &'static (u64, String) {
    static SINCE: std::sync::LazyLock<(u64, String)> = std::sync::LazyLock::new(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        (
            secs,
            crate::rfc3339::format_secs(i64::try_from(secs).unwrap_or(0)),
        )
    });
    &SINCE
}

/// `GET /v1/models` and `GET /v1/models/{id}`: every caller-facing name, chains as
/// `auto:<name>`, in the caller's dialect (an Anthropic SDK, which sends `anthropic-version`,
/// gets Anthropic's shapes). A key sees only what it may use; a name it may not, or one that
/// does not exist, is `404 model_not_found` alike.
pub fn models_answer(
    snapshot: &Snapshot,
    dialect: Dialect,
    key: Option<&ClientKey>,
    ask: ModelsAsk<'_>,
) -> Result<Bytes, GatewayError> {
    let mut ids = snapshot.public_model_ids();
    // A key sees only the names it may send that something it may be served by stands behind
    // (a policy's models depend on the request: its name is enough).
    if let Some(key) = key {
        ids.retain(|id| {
            key.allows(id)
                && match crate::routing::resolve(snapshot, id) {
                    Ok(res) => res.route().is_none_or(|r| {
                        snapshot.route(r).candidates.iter().any(|d| {
                            snapshot
                                .catalog
                                .deployment(*d)
                                .model
                                .is_none_or(|m| key.may_use(m.get()))
                        })
                    }),
                    Err(_) => false,
                }
        });
    }
    let (created, created_at) = served_since();
    let one = |id: &str| {
        ids.iter()
            .find(|n| n.eq_ignore_ascii_case(id))
            .cloned()
            .or_else(|| {
                // A client's own model name a glob alias maps to a visible name.
                let target = snapshot.glob_alias(&id.to_ascii_lowercase())?;
                ids.iter()
                    .any(|n| n.eq_ignore_ascii_case(target))
                    .then(|| std::sync::Arc::from(id))
            })
            .ok_or_else(|| {
                // A resource that is not there (DESIGN §6), not a request naming a bad model.
                GatewayError::new(ErrorCode::ModelNotFound, "no such model is available")
                    .with_status(404)
            })
    };
    Ok(match (dialect, ask) {
        (Dialect::Anthropic, ModelsAsk::List(page)) => {
            crate::adapters::anthropic::models_list(&ids, created_at, page)
        }
        (Dialect::Anthropic, ModelsAsk::One(id)) => {
            crate::adapters::anthropic::model_object(&one(id)?, created_at)
        }
        (Dialect::OpenAi, ModelsAsk::One(id)) => Bytes::from(
            serde_json::json!({ "id": &*one(id)?, "object": "model", "created": created, "owned_by": "signalbox" })
                .to_string(),
        ),
        (Dialect::OpenAi, ModelsAsk::List(_)) => {
            let data: Vec<serde_json::Value> = ids
                .iter()
                .map(|id| serde_json::json!({ "id": &**id, "object": "model", "created": created, "owned_by": "signalbox" }))
                .collect();
            Bytes::from(serde_json::json!({ "object": "list", "data": data }).to_string())
        }
    })
}

/// Header names signalbox sets or reads, built once (`HeaderName::from_static` is const): inserting
/// through these skips the parse and the allocation a `&str` name costs on every request.
pub mod names {
    use http::HeaderName;

    pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    /// Anthropic's name for the request id, on Anthropic-dialect answers.
    pub const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
    pub const X_ROUTED_VIA: HeaderName = HeaderName::from_static("x-routed-via");
    pub const X_LLM_PROVIDER: HeaderName = HeaderName::from_static("x-llm-provider");
    pub const X_LLM_MODEL: HeaderName = HeaderName::from_static("x-llm-model");
    pub const X_LLM_ROUTE: HeaderName = HeaderName::from_static("x-llm-route");
    /// Request: the caller's sticky-session id.
    pub const X_LLM_SESSION: HeaderName = HeaderName::from_static("x-llm-session");
    /// Request: `off` turns weighted/complexity selection off.
    pub const X_LLM_ROUTER: HeaderName = HeaderName::from_static("x-llm-router");
    /// Request: the caller's labels for routing rules.
    pub const X_LLM_METADATA: HeaderName = HeaderName::from_static("x-llm-metadata");
    pub const X_LLM_ROUTING_REASON: HeaderName = HeaderName::from_static("x-llm-routing-reason");
    pub const X_LLM_ATTEMPTS: HeaderName = HeaderName::from_static("x-llm-attempts");
    pub const X_LLM_FALLBACK: HeaderName = HeaderName::from_static("x-llm-fallback");
    /// Response: `won` (the hedge served) or `lost` (the first attempt did), when a hedge ran.
    pub const X_LLM_HEDGED: HeaderName = HeaderName::from_static("x-llm-hedged");
    pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");
    /// Response: whole milliseconds from the request's arrival to its response header (the
    /// provider's answer, or a stream's opening), failed attempts included (seed 004).
    pub const X_LLM_RESPONSE_DURATION_MS: HeaderName =
        HeaderName::from_static("x-llm-response-duration-ms");
}

/// Edit a header's `http` parts in place.
///
/// Pingora's `insert_header` re-parses the name, allocates it twice and keeps a second,
/// case-preserving map in step: about 2,400 instructions a header, a tenth of a request's
/// cost with the routing headers. Taking the parts out (a move, no copy) and putting them
/// back drops the case map instead; names are then written lower-case (standard ones
/// title-cased), which HTTP/1.1 and every client treat the same.
pub fn edit_response_parts<R>(
    resp: &mut ResponseHeader,
    edit: impl FnOnce(&mut http::response::Parts) -> R,
) -> R {
    let placeholder = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let mut parts: http::response::Parts = std::mem::replace(resp, placeholder).into();
    let out = edit(&mut parts);
    *resp = ResponseHeader::from(parts);
    out
}

/// A copy of `req` without Pingora's header-case map: what a hedge's two attempts build their
/// upstream headers from (`attempt::upstream_request_header` writes no case map, so copying
/// it would be two allocations, and their frees, for nothing).
pub fn request_copy(req: &pingora_http::RequestHeader) -> pingora_http::RequestHeader {
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = req.method.clone();
    parts.uri = req.uri.clone();
    parts.version = req.version;
    parts.headers = req.headers.clone();
    pingora_http::RequestHeader::from(parts)
}

/// Add the routing headers to a header that holds only what may reach the caller.
pub fn add_routing_headers(resp: &mut ResponseHeader, ctx: &RequestCtx, now: Instant) {
    edit_response_parts(resp, |parts| {
        add_routing_headers_to(&mut parts.headers, ctx, now)
    });
}

/// [`add_routing_headers`] into a header's map (the driven path's caller header is still
/// its parts at the commit: no round trip through Pingora's header).
pub fn add_routing_headers_to(headers: &mut http::HeaderMap, ctx: &RequestCtx, now: Instant) {
    headers.insert(names::X_REQUEST_ID, ctx.request_id.clone());
    if ctx.surface.dialect() == Dialect::Anthropic {
        headers.insert(names::REQUEST_ID, ctx.request_id.clone());
    }
    if let Some(results) = &ctx.guardrails {
        headers.insert(crate::guardrails::HEADER, results.clone());
    }
    let snapshot = &*ctx.snapshot;
    let Some(a) = &ctx.admitted else {
        return;
    };
    let Some(served) = &a.attempts.served else {
        return;
    };
    let plan = &a.plan;
    let catalog = &snapshot.catalog;
    let Some(deployment) = plan.deployment(catalog, served.target.position) else {
        return;
    };
    let provider = catalog.provider(deployment.provider);
    headers.insert(names::X_ROUTED_VIA, deployment.routed_via.clone());
    headers.insert(names::X_LLM_PROVIDER, provider.id_header.clone());
    headers.insert(names::X_LLM_MODEL, deployment.model_header.clone());
    if let Some(route) = route_header(ctx, snapshot) {
        headers.insert(names::X_LLM_ROUTE, route);
        if let Some(reason) = routing_reason(snapshot, plan, Some(&a.routed), a.attempts.hedge) {
            headers.insert(names::X_LLM_ROUTING_REASON, reason);
        }
    }
    headers.insert(
        names::X_LLM_ATTEMPTS,
        super::headers::int_value(a.attempts.made),
    );
    // `lost` whenever a hedge ran and did not serve (the first attempt did, or a later one).
    if let Some(won) = a.attempts.hedge.map(|h| h.won == Some(true)) {
        headers.insert(
            names::X_LLM_HEDGED,
            HeaderValue::from_static(if won { "won" } else { "lost" }),
        );
    }
    // A fallback: another candidate than the plan's first served (the first failed, or
    // was skipped without a call). Another key of the same deployment is not one.
    let fallback = plan.first_position() != Some(served.target.position);
    headers.insert(
        names::X_LLM_FALLBACK,
        HeaderValue::from_static(if fallback { "true" } else { "false" }),
    );
    let (timing, total) = server_timing(ctx, now);
    if let Some(timing) = timing {
        headers.insert(names::SERVER_TIMING, timing);
    }
    let total_ms = total.as_millis();
    headers.insert(
        names::X_LLM_RESPONSE_DURATION_MS,
        super::headers::int_value(total_ms),
    );
}

/// A header value assembled on the stack (one allocation, when it becomes a `HeaderValue`), of
/// at most `N` bytes: [`REASON_BYTES`] for the routing reason (a knn decision's figures come
/// after the rest), [`TIMING_BYTES`] for `server-timing` (every buffer is zeroed first).
struct ValueBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

/// The routing reason's buffer.
const REASON_BYTES: usize = 384;
/// `server-timing`'s buffer: three durations of up to 20 digits each fit.
const TIMING_BYTES: usize = 128;

impl<const N: usize> ValueBuf<N> {
    fn new() -> Self {
        Self {
            buf: [0; N],
            len: 0,
        }
    }

    fn value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(&self.buf[..self.len]).ok()
    }

    /// Append bytes, cut off at the end of the buffer.
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// Append a number in decimal, without the formatting machinery.
    fn push_int(&mut self, v: impl itoa::Integer) {
        self.push(itoa::Buffer::new().format(v).as_bytes());
    }

    /// Append a duration in milliseconds rounded to a tenth (`12.3`).
    fn push_tenths_ms(&mut self, d: Duration) {
        // In 64 bits (`as_micros` is a u128, and its division a library call): a duration
        // past 584,000 years saturates.
        let micros = d
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(d.subsec_micros()));
        let tenths = micros.saturating_add(50) / 100;
        self.push_int(tenths / 10);
        self.push(&[b'.', b'0' + (tenths % 10) as u8]);
    }
}

/// `x-llm-route`: the rule that sent the request (`rule:<n>`), else its route's label
/// (`policy:<name>`, `model:<name>`, ...).
fn route_header(ctx: &RequestCtx, snapshot: &Snapshot) -> Option<HeaderValue> {
    let routed = &ctx.admitted.as_ref()?.routed;
    let rule = match routed.via {
        Via::Rule(n) | Via::Policy { rule: Some(n), .. } => snapshot.rules.get(n),
        _ => None,
    };
    match rule {
        Some(r) => Some(r.header.clone()),
        None => Some(snapshot.route(routed.route).header.clone()),
    }
}

/// `strategy=… selected=… priority=… cost_micro=… healthy=… fallbacks=…`: the decision as it
/// stood before the first attempt: the plan's first (what the strategy put first), whether
/// its breaker was closed, and the providers behind it; then how the route was reached:
/// `policy=… entry=…` (the `select` entry that held, `none` for `on_failure` only),
/// `rule=…`, and `reason=smart_fallback` when `smart` was asked for.
fn routing_reason(
    snapshot: &Snapshot,
    plan: &Plan,
    routed: Option<&Routed>,
    hedge: Option<HedgeRun>,
) -> Option<HeaderValue> {
    let catalog = &snapshot.catalog;
    let mut out = ValueBuf::<REASON_BYTES>::new();
    out.push(b"strategy=");
    out.push(plan.strategy().as_str().as_bytes());
    let first_pos = plan.first_position().unwrap_or(0);
    if let Some(first) = plan.deployment(catalog, first_pos) {
        let facts = plan.facts();
        let cost =
            crate::routing::scoring::cost_micro(first, facts.input_tokens, facts.output_tokens);
        out.push(b" selected=");
        out.push(catalog.provider(first.provider).id.as_bytes());
        out.push(b" priority=");
        out.push_int(first.priority);
        out.push(b" cost_micro=");
        out.push_int(cost);
        out.push(if plan.first_was_healthy() {
            b" healthy=true fallbacks="
        } else {
            b" healthy=false fallbacks="
        });
        // Remaining candidates' providers, in order, each once (bounded: a header, not a dump);
        // a provider the request's `routing.providers` removed is not one of them.
        let mut listed = [first.provider; 9];
        let mut n_listed = 1;
        for pos in (0..plan.len()).filter(|p| *p != first_pos) {
            if n_listed == listed.len() {
                break;
            }
            if let Some(d) = plan.deployment(catalog, pos) {
                if !listed[..n_listed].contains(&d.provider) && plan.allows_provider(d.provider) {
                    if n_listed > 1 {
                        out.push(b",");
                    }
                    listed[n_listed] = d.provider;
                    n_listed += 1;
                    out.push(catalog.provider(d.provider).id.as_bytes());
                }
            }
        }
    }
    if let Some(routed) = routed {
        match routed.via {
            Via::Policy {
                policy,
                selection,
                rule,
            } => {
                out.push(b" policy=");
                out.push(snapshot.policy(policy).name.as_bytes());
                out.push(b" entry=");
                match selection.entry {
                    Some(e) => out.push_int(e),
                    None => out.push(b"none"),
                }
                if let Some(n) = rule {
                    out.push(b" rule=");
                    out.push_int(n);
                }
                // A knn entry: its outcome, neighbours and each target's figures.
                if let Some(names) = crate::knn::target_names(snapshot, routed) {
                    match &routed.knn {
                        Some(report) => {
                            out.push(b" ");
                            out.push(report.reason(names).as_bytes());
                        }
                        None if selection.pick == Pick::RouterOff => out.push(b" knn=router_off"),
                        None => {}
                    }
                }
            }
            Via::Rule(n) => {
                out.push(b" rule=");
                out.push_int(n);
            }
            Via::Model => {}
        }
        if routed.smart_fallback {
            out.push(b" reason=smart_fallback");
        }
    }
    if let Some(h) = hedge {
        // How long the first attempt had gone without a first byte when the hedge started.
        out.push(b" hedge=after:");
        out.push_int(h.after.as_millis());
    }
    out.value()
}

/// `gateway;dur=…, upstream;dur=…, total;dur=…` in milliseconds to a tenth (integer
/// arithmetic: float formatting costs more than the rest of the header).
/// `server-timing`'s value, and the request's whole duration so far.
fn server_timing(ctx: &RequestCtx, now: Instant) -> (Option<HeaderValue>, Duration) {
    let total = now.saturating_duration_since(ctx.started);
    let value = server_timing_value(
        ctx.started,
        ctx.admitted.as_ref().and_then(|a| a.attempts.first_at),
        total,
    );
    (value, total)
}

/// `total`: from `started` to now.
fn server_timing_value(
    started: Instant,
    first_attempt_at: Option<Instant>,
    total: Duration,
) -> Option<HeaderValue> {
    // Before the first attempt, and from it to now (no attempt: all of it is the gateway's).
    let gateway = first_attempt_at.map_or(total, |first| first.saturating_duration_since(started));
    let upstream = total.saturating_sub(gateway);
    let mut out = ValueBuf::<TIMING_BYTES>::new();
    out.push(b"gateway;dur=");
    out.push_tenths_ms(gateway);
    out.push(b", upstream;dur=");
    out.push_tenths_ms(upstream);
    out.push(b", total;dur=");
    out.push_tenths_ms(total);
    out.value()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn server_timing_is_tenths_of_a_millisecond_rounded() {
        let now = Instant::now();
        let started = now - Duration::from_micros(2_340);
        let first = Some(started + Duration::from_micros(100));
        let value = server_timing_value(started, first, now - started).expect("visible ASCII");
        assert_eq!(
            value.to_str().ok(),
            Some("gateway;dur=0.1, upstream;dur=2.2, total;dur=2.3")
        );
        // No attempt yet (an answer signalbox gave itself): all of it is gateway time.
        let started = now - Duration::from_millis(12);
        let value = server_timing_value(started, None, now - started).expect("visible ASCII");
        assert_eq!(
            value.to_str().ok(),
            Some("gateway;dur=12.0, upstream;dur=0.0, total;dur=12.0")
        );
        // Several digits, and a tenth that rounds up into the next millisecond.
        let started = now - Duration::from_micros(1_234_960);
        let first = Some(now - Duration::from_micros(1_001));
        let value = server_timing_value(started, first, now - started).expect("visible ASCII");
        assert_eq!(
            value.to_str().ok(),
            Some("gateway;dur=1234.0, upstream;dur=1.0, total;dur=1235.0")
        );
    }

    #[test]
    fn a_value_longer_than_the_buffer_is_cut_not_lost() {
        let mut buf = ValueBuf::<REASON_BYTES>::new();
        for _ in 0..50 {
            buf.push(b"abcdefgh");
        }
        buf.push_int(u64::MAX);
        let value = buf.value().expect("visible ASCII");
        assert_eq!(value.len(), REASON_BYTES);
    }

    #[test]
    fn the_callers_header_keeps_status_and_allowed_headers() {
        let mut upstream = ResponseHeader::build(201, Some(4)).unwrap();
        upstream
            .insert_header("Content-Type", "application/json")
            .unwrap();
        upstream.insert_header("Set-Cookie", "a=b").unwrap();
        let snapshot = crate::testing::Fixture::new(
            "providers:\n  a: { kind: openai, base_url: \"http://127.0.0.1:1/v1\" }\nmodels:\n  m: { deployments: [{ provider: a, model: x }] }\n",
        )
        .snapshot();
        let mut ctx = RequestCtx::new(std::sync::Arc::new(snapshot));
        ctx.request_id = HeaderValue::from_static("abc");
        let framing = crate::proxy::response::CallerFraming::default();
        let resp = crate::proxy::response::caller_header(&ctx, framing, &upstream).commit(&mut ctx);
        assert_eq!(resp.status.as_u16(), 201);
        assert_eq!(
            resp.headers.get("content-type").map(|v| v.as_bytes()),
            Some(&b"application/json"[..])
        );
        assert!(resp.headers.get("set-cookie").is_none());
        assert_eq!(
            resp.headers.get("x-request-id").map(|v| v.as_bytes()),
            Some(&b"abc"[..])
        );
        // What goes on the wire: every header once, standard names title-cased.
        let mut wire = Vec::new();
        resp.header_to_h1_wire(&mut wire);
        let wire = String::from_utf8(wire).unwrap();
        assert_eq!(
            wire,
            "Content-Type: application/json\r\nx-request-id: abc\r\n"
        );
    }
}
