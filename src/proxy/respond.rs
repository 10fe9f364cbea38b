//! Responses signalbox writes itself: errors in the OpenAI shape, `GET /v1/models`, and the
//! routing headers every proxied response carries.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use super::ctx::RequestCtx;
use crate::error::GatewayError;
use crate::routing::Tables;

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
    if let Some(secs) = retry_after {
        resp.insert_header("retry-after", secs)?;
    }
    if ctx.attempts > 0 {
        resp.insert_header("x-llm-attempts", ctx.attempts)?;
    }
    if let Some(route) = ctx
        .route
        .and_then(|r| ctx.tables.as_ref().map(|t| t.route(r).header.clone()))
    {
        resp.insert_header("x-llm-route", route)?;
    }
    ctx.status = Some(status);
    ctx.committed = true;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

/// Answer with a gateway error.
pub async fn write_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    err: GatewayError,
) -> pingora_error::Result<()> {
    let body = err.body();
    let (status, retry_after) = (err.status, err.retry_after);
    ctx.local_error = Some(err);
    write_json(session, ctx, status, body, retry_after).await
}

/// `GET /v1/models`: every caller-facing name, chains as `auto:<name>`.
pub fn models_body(tables: &Tables) -> Bytes {
    let data: Vec<serde_json::Value> = tables
        .public_model_ids()
        .iter()
        .map(|id| serde_json::json!({ "id": &**id, "object": "model", "owned_by": "signalbox" }))
        .collect();
    Bytes::from(serde_json::json!({ "object": "list", "data": data }).to_string())
}

/// Header names signalbox sets, built once (`HeaderName::from_static` is const): inserting
/// through these skips the parse and the allocation a `&str` name costs on every request.
pub mod names {
    use http::HeaderName;

    pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    pub const X_ROUTED_VIA: HeaderName = HeaderName::from_static("x-routed-via");
    pub const X_LLM_PROVIDER: HeaderName = HeaderName::from_static("x-llm-provider");
    pub const X_LLM_MODEL: HeaderName = HeaderName::from_static("x-llm-model");
    pub const X_LLM_ROUTE: HeaderName = HeaderName::from_static("x-llm-route");
    pub const X_LLM_ROUTING_REASON: HeaderName = HeaderName::from_static("x-llm-routing-reason");
    pub const X_LLM_ATTEMPTS: HeaderName = HeaderName::from_static("x-llm-attempts");
    pub const X_LLM_FALLBACK: HeaderName = HeaderName::from_static("x-llm-fallback");
    pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");
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

/// [`edit_response_parts`] for the upstream request header.
pub fn edit_request_parts<R>(
    req: &mut pingora_http::RequestHeader,
    edit: impl FnOnce(&mut http::request::Parts) -> R,
) -> R {
    let placeholder = pingora_http::RequestHeader::from(http::Request::new(()).into_parts().0);
    let mut parts: http::request::Parts = std::mem::replace(req, placeholder).into();
    let out = edit(&mut parts);
    *req = pingora_http::RequestHeader::from(parts);
    out
}

/// Add the routing headers to a relayed response (and drop `dropped` provider headers).
pub fn add_routing_headers(
    resp: &mut ResponseHeader,
    ctx: &RequestCtx,
    now: Instant,
    dropped: &[HeaderName],
) {
    edit_response_parts(resp, |parts| {
        let headers = &mut parts.headers;
        for name in dropped {
            headers.remove(name);
        }
        headers.insert(names::X_REQUEST_ID, ctx.request_id.clone());
        let (Some(tables), Some(served), Some(plan)) = (&ctx.tables, &ctx.served, &ctx.plan) else {
            return;
        };
        let catalog = &tables.catalog;
        let Some(deployment) = plan.deployment(catalog, served.target.position) else {
            return;
        };
        let provider = catalog.provider(deployment.provider);
        headers.insert(names::X_ROUTED_VIA, deployment.routed_via.clone());
        headers.insert(names::X_LLM_PROVIDER, provider.id_header.clone());
        headers.insert(names::X_LLM_MODEL, deployment.model_header.clone());
        if let Some(route) = ctx.route {
            let route = tables.route(route);
            headers.insert(names::X_LLM_ROUTE, route.header.clone());
            if let Some(reason) = routing_reason(ctx, tables, route.strategy.as_str()) {
                headers.insert(names::X_LLM_ROUTING_REASON, reason);
            }
        }
        headers.insert(names::X_LLM_ATTEMPTS, HeaderValue::from(ctx.attempts));
        headers.insert(
            names::X_LLM_FALLBACK,
            HeaderValue::from_static(if served.target.position == 0 {
                "false"
            } else {
                "true"
            }),
        );
        if let Some(timing) = server_timing(ctx, now) {
            headers.insert(names::SERVER_TIMING, timing);
        }
    })
}

/// A header value assembled on the stack (one allocation, when it becomes a `HeaderValue`).
struct ValueBuf {
    buf: [u8; 192],
    len: usize,
}

impl ValueBuf {
    fn new() -> Self {
        Self {
            buf: [0; 192],
            len: 0,
        }
    }

    fn value(&self) -> Option<HeaderValue> {
        HeaderValue::from_bytes(&self.buf[..self.len]).ok()
    }
}

impl std::fmt::Write for ValueBuf {
    /// Writes past the end are cut off (the value stays well formed: every caller writes
    /// visible ASCII).
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// `strategy=… selected=… priority=… cost_micro=… healthy=… fallbacks=…`: the decision as it
/// stood before the first attempt.
fn routing_reason(
    ctx: &RequestCtx,
    tables: &Tables,
    default_strategy: &str,
) -> Option<HeaderValue> {
    use std::fmt::Write;
    let catalog = &tables.catalog;
    let mut out = ValueBuf::new();
    let Some(plan) = &ctx.plan else {
        let _ = write!(out, "strategy={default_strategy}");
        return out.value();
    };
    let _ = write!(out, "strategy={}", plan.strategy().as_str());
    let first_pos = plan.first_position().unwrap_or(0);
    if let Some(first) = plan.deployment(catalog, first_pos) {
        let facts = plan.facts();
        let cost =
            crate::routing::scoring::cost_micro(first, facts.input_tokens, facts.output_tokens);
        // The selected target was healthy unless it was taken as a half-open probe.
        let healthy = !ctx.first_was_probe;
        let _ = write!(
            out,
            " selected={} priority={} cost_micro={cost} healthy={healthy} fallbacks=",
            catalog.provider(first.provider).id,
            first.priority,
        );
        // Remaining candidates' providers, in order, each once (bounded: a header, not a dump).
        let mut listed = [first.provider; 9];
        let mut n_listed = 1;
        let mut sep = "";
        for pos in (0..plan.len()).filter(|p| *p != first_pos) {
            if n_listed == listed.len() {
                break;
            }
            if let Some(d) = plan.deployment(catalog, pos) {
                if !listed[..n_listed].contains(&d.provider) {
                    listed[n_listed] = d.provider;
                    n_listed += 1;
                    let _ = write!(out, "{sep}{}", catalog.provider(d.provider).id);
                    sep = ",";
                }
            }
        }
    }
    out.value()
}

/// A rough token count from body bytes (about four bytes a token for English JSON).
pub fn estimate_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(4)
}

/// `gateway;dur=…, upstream;dur=…, total;dur=…` in milliseconds to a tenth (integer
/// arithmetic: float formatting costs more than the rest of the header).
fn server_timing(ctx: &RequestCtx, now: Instant) -> Option<HeaderValue> {
    use std::fmt::Write;
    let total = now.saturating_duration_since(ctx.started);
    let first = ctx.first_attempt_at.unwrap_or(now);
    let gateway = first.saturating_duration_since(ctx.started);
    let upstream = now.saturating_duration_since(first);
    let tenths = |d: std::time::Duration| (d.as_micros() + 50) / 100;
    let (g, u, t) = (tenths(gateway), tenths(upstream), tenths(total));
    let mut out = ValueBuf::new();
    let _ = write!(
        out,
        "gateway;dur={}.{}, upstream;dur={}.{}, total;dur={}.{}",
        g / 10,
        g % 10,
        u / 10,
        u % 10,
        t / 10,
        t % 10
    );
    out.value()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn server_timing_is_tenths_of_a_millisecond_rounded() {
        let mut ctx = RequestCtx::new();
        let now = Instant::now();
        ctx.started = now - Duration::from_micros(2_340);
        ctx.first_attempt_at = Some(ctx.started + Duration::from_micros(100));
        let value = server_timing(&ctx, now).expect("visible ASCII");
        assert_eq!(
            value.to_str().ok(),
            Some("gateway;dur=0.1, upstream;dur=2.2, total;dur=2.3")
        );
        // No attempt yet (an answer signalbox gave itself): all of it is gateway time.
        ctx.first_attempt_at = None;
        ctx.started = now - Duration::from_millis(12);
        let value = server_timing(&ctx, now).expect("visible ASCII");
        assert_eq!(
            value.to_str().ok(),
            Some("gateway;dur=12.0, upstream;dur=0.0, total;dur=12.0")
        );
    }

    #[test]
    fn a_value_longer_than_the_buffer_is_cut_not_lost() {
        use std::fmt::Write;
        let mut buf = ValueBuf::new();
        for _ in 0..50 {
            let _ = write!(buf, "abcdefgh");
        }
        let value = buf.value().expect("visible ASCII");
        assert_eq!(value.len(), 192);
    }

    #[test]
    fn editing_parts_keeps_status_and_headers_and_drops_only_what_is_asked() {
        let mut resp = ResponseHeader::build(201, Some(4)).unwrap();
        resp.insert_header("Content-Type", "application/json")
            .unwrap();
        resp.insert_header("Set-Cookie", "a=b").unwrap();
        let mut ctx = RequestCtx::new();
        ctx.request_id = HeaderValue::from_static("abc");
        add_routing_headers(&mut resp, &ctx, Instant::now(), &[http::header::SET_COOKIE]);
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
