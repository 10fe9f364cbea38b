//! Responses signalbox writes itself: errors in the OpenAI shape, `GET /v1/models`, and the
//! routing headers every proxied response carries.

use std::time::Instant;

use bytes::Bytes;
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

/// Add the routing headers to a relayed response.
pub fn add_routing_headers(
    resp: &mut ResponseHeader,
    ctx: &RequestCtx,
    now: Instant,
) -> pingora_error::Result<()> {
    resp.insert_header("x-request-id", ctx.request_id.clone())?;
    let (Some(tables), Some(served), Some(plan)) = (&ctx.tables, &ctx.served, &ctx.plan) else {
        return Ok(());
    };
    let catalog = &tables.catalog;
    let Some(deployment) = plan.deployment(catalog, served.target.position) else {
        return Ok(());
    };
    let provider = catalog.provider(deployment.provider);
    resp.insert_header("x-routed-via", deployment.routed_via.clone())?;
    resp.insert_header("x-llm-provider", provider.id_header.clone())?;
    resp.insert_header("x-llm-model", deployment.model_header.clone())?;
    if let Some(route) = ctx.route {
        let route = tables.route(route);
        resp.insert_header("x-llm-route", route.header.clone())?;
        resp.insert_header(
            "x-llm-routing-reason",
            routing_reason(ctx, tables, route.strategy.as_str()),
        )?;
    }
    resp.insert_header("x-llm-attempts", ctx.attempts)?;
    resp.insert_header(
        "x-llm-fallback",
        if served.target.position == 0 {
            "false"
        } else {
            "true"
        },
    )?;
    resp.insert_header("server-timing", server_timing(ctx, now))?;
    Ok(())
}

/// `strategy=… selected=… priority=… cost_micro=… healthy=… fallbacks=…`: the decision as it
/// stood before the first attempt.
fn routing_reason(ctx: &RequestCtx, tables: &Tables, default_strategy: &str) -> String {
    use std::fmt::Write;
    let catalog = &tables.catalog;
    let mut out = String::with_capacity(96);
    let Some(plan) = &ctx.plan else {
        let _ = write!(out, "strategy={default_strategy}");
        return out;
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
        let mut listed: Vec<crate::catalog::ProviderIdx> = vec![first.provider];
        let mut sep = "";
        for pos in (0..plan.len()).filter(|p| *p != first_pos) {
            if listed.len() > 8 {
                break;
            }
            if let Some(d) = plan.deployment(catalog, pos) {
                if !listed.contains(&d.provider) {
                    listed.push(d.provider);
                    let _ = write!(out, "{sep}{}", catalog.provider(d.provider).id);
                    sep = ",";
                }
            }
        }
    }
    out
}

/// A rough token count from body bytes (about four bytes a token for English JSON).
pub fn estimate_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(4)
}

/// `gateway;dur=…, upstream;dur=…, total;dur=…` in milliseconds to a tenth.
fn server_timing(ctx: &RequestCtx, now: Instant) -> String {
    let total = now.duration_since(ctx.started);
    let first = ctx.first_attempt_at.unwrap_or(now);
    let gateway = first.duration_since(ctx.started);
    let upstream = now.saturating_duration_since(first);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    format!(
        "gateway;dur={:.1}, upstream;dur={:.1}, total;dur={:.1}",
        ms(gateway),
        ms(upstream),
        ms(total)
    )
}
