//! Accounting: the one place a request is counted. `logging` runs once per request, after the
//! answer; it settles the last attempt's outcome, then records the metrics and writes the
//! access line. Nothing on the request path counts anywhere else.

use pingora_error::{Error, ErrorSource};

use super::ctx::RequestCtx;
use crate::adapters::openai::ResponseRewriter;
use crate::metrics::{status_class_index, Metrics};
use crate::retry::Outcome;
use crate::routing::decide::Via;

/// Settle, count and log a finished request.
pub fn emit(ctx: &mut RequestCtx, e: Option<&Error>, metrics: &Metrics) {
    settle_last_attempt(ctx, e);
    if ctx.in_flight {
        metrics.in_flight.dec();
    }
    count(ctx);
    access_line(ctx);
}

/// The attempt whose response was relayed (or that ended with the request) gets its outcome.
fn settle_last_attempt(ctx: &mut RequestCtx, e: Option<&Error>) {
    if ctx.current.is_none() {
        return;
    }
    let empty = ctx.stream.empty_choices || (ctx.is_sse && ctx.stream.data_events == 0);
    let outcome = if ctx.served.is_some() && empty && !ctx.stream.upstream_error_event {
        Outcome::Empty
    } else if ctx.stream_broken && ctx.served.is_some() {
        Outcome::StreamBroken
    } else if e.is_some_and(|e| e.esource() == &ErrorSource::Downstream) {
        Outcome::Cancelled
    } else if matches!(ctx.rewriter, ResponseRewriter::Replace { .. }) {
        Outcome::ClientError
    } else if ctx.served.is_some() {
        Outcome::Ok
    } else {
        Outcome::Cancelled
    };
    ctx.finish_attempt(outcome);
}

fn count(ctx: &RequestCtx) {
    let Some(tables) = ctx.tables.as_ref() else {
        return;
    };
    let metrics = &tables.metrics;
    let none = tables.catalog.providers.len();
    let served_provider = ctx.served.map_or(none, |a| a.provider.get());
    let route = tables.route(ctx.route.unwrap_or(tables.unresolved)).metric;
    metrics
        .requests
        .inc(&[route, served_provider, status_class_index(ctx.status)]);
    if let Some(routed) = &ctx.routed {
        match routed.via {
            Via::Rule(n) => metrics.rule_matches.inc(&[n]),
            Via::Policy {
                policy,
                selection,
                rule,
            } => {
                if let Some(n) = rule {
                    metrics.rule_matches.inc(&[n]);
                }
                let entries = tables.policies.iter().map(|p| p.entries.len()).max();
                let entry = selection.entry.unwrap_or(entries.unwrap_or(0));
                metrics.policy_selections.inc(&[policy.get(), entry]);
            }
            Via::Model => {}
        }
    }
    if let Some(plan) = &ctx.plan {
        for (reason, n) in plan.skip_counts() {
            metrics.skipped.add(&[reason.index()], u64::from(n));
        }
    }
    for rec in &ctx.log {
        let p = rec.provider.get();
        metrics.attempts.inc(&[p, rec.outcome.index()]);
        if rec.followed {
            metrics.failovers.inc(&[p, rec.outcome.index()]);
        }
        if let Some(pm) = metrics.providers.get(p) {
            if let Some(ttfb) = rec.ttfb {
                pm.ttfb.observe(ttfb.as_secs_f64());
                pm.latency.observe(rec.duration.as_secs_f64());
            }
        }
    }
}

/// One `access` line: request id, route, serving provider, status, attempts and how each
/// ended. Never a secret, a header value or request content.
fn access_line(ctx: &RequestCtx) {
    if !tracing::enabled!(target: "access", tracing::Level::INFO) {
        return;
    }
    let Some(tables) = ctx.tables.as_ref() else {
        return;
    };
    let provider = ctx
        .served
        .map(|a| tables.catalog.provider(a.provider).id.clone());
    let route = tables.route(ctx.route.unwrap_or(tables.unresolved));
    let mut tried = String::new();
    for rec in &ctx.log {
        if !tried.is_empty() {
            tried.push(',');
        }
        tried.push_str(&tables.catalog.provider(rec.provider).id);
        tried.push(':');
        tried.push_str(rec.outcome.as_str());
    }
    tracing::info!(
        target: "access",
        request_id = %ctx.request_id.to_str().unwrap_or(""),
        route = %route.label,
        provider = %provider.as_deref().unwrap_or("none"),
        status = ctx.status.unwrap_or(0),
        attempts = ctx.attempts,
        tried = %tried,
        error = %ctx.local_error.as_ref().map_or("-", |e| e.code.as_str()),
        stream_broken = ctx.stream_broken,
        ms = ctx.started.elapsed().as_secs_f64() * 1000.0,
    );
}
