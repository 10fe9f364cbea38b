//! Accounting: the one place a request is counted. `logging` runs once per request, after the
//! answer; it settles the last attempt's outcome and the spend, then records the metrics,
//! queues one ledger row per attempt and writes the access line. Nothing on the request path
//! counts anywhere else.

use std::fmt;
use std::time::Duration;

use pingora_error::{Error, ErrorSource};

use super::ctx::{AttemptRecord, RequestCtx};
use crate::attempt::{BodyEnd, Outcome};
use crate::ledger::{Ledger, LedgerRow};
use crate::metrics::{
    status_class_index, Metrics, TOKENS_CACHE_READ, TOKENS_CACHE_WRITE, TOKENS_COMPLETION,
    TOKENS_PROMPT,
};
use crate::routing::decide::Via;
use crate::routing::plan::Plan;
use crate::snapshot::Snapshot;

/// What the caller's side of a finished request saw, read from Pingora's session: the request
/// line, and the status of the header actually written to the caller.
pub struct Wire<'a> {
    pub method: &'a http::Method,
    /// The path, without its query string (which may carry a secret).
    pub path: &'a str,
    /// `None`: the caller got no header at all (it left first).
    pub written: Option<u16>,
}

/// The status an access line and the request counter give a request whose caller got no
/// header (nginx's "client closed request").
pub const CANCELLED_STATUS: u16 = 499;

/// Settle, count, record and log a finished request.
pub fn emit(
    ctx: &mut RequestCtx,
    wire: &Wire<'_>,
    e: Option<&Error>,
    metrics: &Metrics,
    ledger: Option<&Ledger>,
) {
    settle_open_attempt(ctx, e);
    let cost = super::access::settle(ctx);
    if ctx.in_flight {
        metrics.in_flight.dec();
    }
    let status = wire.written.unwrap_or(CANCELLED_STATUS);
    match ctx
        .local_error
        .as_ref()
        .filter(|e| e.code.is_http_refusal())
    {
        // HTTP signalbox will not read is no request: counted on its own, never as a 5xx.
        Some(e) => metrics
            .http_refusals
            .with_label_values(&[e.code.as_str()])
            .inc(),
        None => count(ctx, cost, status),
    }
    if let Some(hedge) = ctx.admitted.as_ref().and_then(|a| a.attempts.hedge) {
        let counter = if hedge.won == Some(true) {
            &metrics.hedges_won
        } else {
            &metrics.hedges_lost
        };
        counter.inc();
    }
    if let Some(ledger) = ledger {
        record(ctx, cost, ledger);
    }
    access_line(ctx, wire, status);
}

/// An attempt no driver judged before the request ended: the caller went away (or, once its
/// answer was committed, the provider broke it).
fn settle_open_attempt(ctx: &mut RequestCtx, e: Option<&Error>) {
    let open = ctx
        .admitted
        .as_ref()
        .is_some_and(|a| a.attempts.live.is_some());
    if !open {
        return;
    }
    let upstream_broke = e.is_some_and(|e| e.esource() != &ErrorSource::Downstream);
    if upstream_broke && ctx.downstream.is_committed() {
        let verdict = super::response::judge_body(ctx, BodyEnd::Broken(Outcome::Reset));
        super::settle::apply(ctx, verdict);
    } else {
        super::settle::cancelled(ctx);
    }
}

fn count(ctx: &RequestCtx, cost: u64, status: u16) {
    let snapshot = &*ctx.snapshot;
    let metrics = &snapshot.metrics;
    let none = snapshot.catalog.providers.len();
    let a = ctx.admitted.as_ref();
    let served = a.and_then(|a| a.attempts.served);
    let served_provider = served.map_or(none, |s| s.provider.get());
    let route = snapshot
        .route(a.map_or(snapshot.unresolved, |a| a.routed.route))
        .metric;
    metrics
        .requests
        .inc(&[route, served_provider, status_class_index(Some(status))]);
    let Some(a) = a else {
        return;
    };
    if let (Some(usage), Some(served)) = (a.attempts.relay.signals().usage, served) {
        let p = served.provider.get();
        let catalog = &snapshot.catalog;
        // Ad-hoc deployments (`<provider>/<name>`) count under `direct`, after the models.
        let model = a
            .plan
            .deployment(catalog, served.target.position)
            .and_then(|d| d.model)
            .map_or(catalog.models.len(), |m| m.get());
        let key = ctx
            .key
            .and_then(|k| snapshot.keys.as_ref()?.get(k))
            .map(|k| k.metric);
        for (kind, n) in [
            (TOKENS_PROMPT, usage.prompt_tokens),
            (TOKENS_COMPLETION, usage.completion_tokens),
            (TOKENS_CACHE_READ, usage.cache_read_tokens),
            (TOKENS_CACHE_WRITE, usage.cache_write_tokens),
        ] {
            if n > 0 {
                metrics.tokens.add(&[p, model, kind], n);
                if let Some(k) = key {
                    metrics.key_tokens.add(&[k, kind], n);
                }
            }
        }
        if cost > 0 {
            metrics.spend.add(&[p, model], cost);
            if let Some(k) = key {
                metrics.key_spend.add(&[k], cost);
            }
        }
    }
    match a.routed.via {
        Via::Rule(n) => metrics.rule_matches.inc(&[n]),
        Via::Policy {
            policy,
            selection,
            rule,
        } => {
            if let Some(n) = rule {
                metrics.rule_matches.inc(&[n]);
            }
            let entries = snapshot.policies.iter().map(|p| p.entries.len()).max();
            let entry = selection.entry.unwrap_or(entries.unwrap_or(0));
            metrics.policy_selections.inc(&[policy.get(), entry]);
        }
        Via::Model => {}
    }
    for (reason, n) in a.plan.skip_counts() {
        metrics.skipped.add(&[reason.index()], u64::from(n));
    }
    for pos in a.plan.full_positions() {
        // A direct `<provider>/<name>` deployment has no catalog model: `direct`.
        let model = a
            .plan
            .deployment(&snapshot.catalog, usize::from(*pos))
            .map(|d| d.model.map_or(snapshot.catalog.models.len(), |m| m.get()));
        if let Some(m) = model {
            metrics.rate_limit_full.inc(&[m]);
        }
    }
    for rec in &a.attempts.log {
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

/// One ledger row per attempt, the failed ones included; the serving attempt (always the last)
/// carries the reported tokens and the cost. Only what a ledger needs is allocated, and only
/// when one is configured.
fn record(ctx: &RequestCtx, cost: u64, ledger: &Ledger) {
    let snapshot = &*ctx.snapshot;
    let Some(a) = ctx.admitted.as_ref().filter(|a| !a.attempts.log.is_empty()) else {
        // Refused or answered by signalbox itself: no attempt, no row (DESIGN §8).
        return;
    };
    let catalog = &snapshot.catalog;
    let key = ctx
        .key
        .and_then(|k| snapshot.keys.as_ref().and_then(|keys| keys.get(k)));
    let route = snapshot.route(a.routed.route);
    let request_id: Box<str> = ctx.request_id.to_str().unwrap_or("").into();
    let now = std::time::Instant::now();
    let wall_ms = snapshot.health.shared.wall_ms();
    let served_any = a.attempts.served.is_some();
    let usage = a.attempts.relay.signals().usage.filter(|_| served_any);
    let last = a.attempts.log.len() - 1;
    // Shared, not allocated per row: what a row names when the catalog has no such record.
    static DIRECT: std::sync::LazyLock<std::sync::Arc<str>> =
        std::sync::LazyLock::new(|| std::sync::Arc::from("direct"));
    let direct = &*DIRECT;
    for (i, rec) in a.attempts.log.iter().enumerate() {
        let provider = catalog.provider(rec.provider);
        let (position, credential) = rec.target;
        let deployment = a.plan.deployment(catalog, position);
        let served = i == last && served_any;
        let ago = now.saturating_duration_since(rec.started);
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let time_ms = wall_ms.saturating_sub(ago.as_millis() as u64) as i64;
        ledger.record(LedgerRow {
            request_id: request_id.clone(),
            attempt: u32::try_from(i + 1).unwrap_or(u32::MAX),
            time_ms,
            key_id: key.map(|k| k.id.clone()),
            user: key.and_then(|k| k.user.clone()),
            route: route.label.clone(),
            provider: provider.id.clone(),
            model: deployment
                .and_then(|d| d.model)
                .map_or_else(|| direct.clone(), |m| catalog.model(m).name.clone()),
            upstream_model: deployment.map_or_else(|| direct.clone(), |d| d.upstream_model.clone()),
            credential: provider
                .credentials
                .get(credential)
                .map_or_else(|| direct.clone(), |c| c.id.clone()),
            outcome: rec.outcome.as_str(),
            status: rec.status,
            prompt_tokens: usage.filter(|_| served).map_or(0, |u| u.prompt_tokens),
            completion_tokens: usage.filter(|_| served).map_or(0, |u| u.completion_tokens),
            cost_micro_usd: if served { cost } else { 0 },
            ttfb_ms: rec.ttfb.map(millis),
            duration_ms: millis(rec.duration),
            absorbed: served_any && i != last,
        });
    }
}

/// One `access` line: request id, method and path, route, serving provider, the status the
/// caller got (`499` and `error=cancelled` when it left before any header), every attempt as
/// `provider/upstream_model:credential:outcome`, the serving attempt's TTFB, the total
/// duration, the tokens the response reported, the error code when signalbox answered itself,
/// and whether the stream broke (an answer cut short, or ended by the provider's error event).
/// Never a secret, a query string, a header value or request content.
///
/// Nothing is allocated unless the `access` target is on; the attempt list is written
/// straight into the line by [`Tried`].
fn access_line(ctx: &RequestCtx, wire: &Wire<'_>, status: u16) {
    if !tracing::enabled!(target: "access", tracing::Level::INFO) {
        return;
    }
    let snapshot = &*ctx.snapshot;
    let a = ctx.admitted.as_ref();
    let served = a.and_then(|a| a.attempts.served);
    let provider = served.map_or("none", |s| &*snapshot.catalog.provider(s.provider).id);
    let route = snapshot.route(a.map_or(snapshot.unresolved, |a| a.routed.route));
    let ttfb_ms = served.and_then(|s| s.header_at.map(|h| millis(h.duration_since(s.started))));
    let usage = a
        .and_then(|a| a.attempts.relay.signals().usage)
        .filter(|_| served.is_some());
    tracing::info!(
        target: "access",
        request_id = %ctx.request_id.to_str().unwrap_or(""),
        method = %wire.method,
        path = %Bounded(wire.path),
        route = %route.label,
        provider = %provider,
        status,
        attempts = a.map_or(0, |a| a.attempts.made),
        tried = %Tried {
            snapshot,
            plan: a.map(|a| &a.plan),
            log: a.map_or(&[][..], |a| &a.attempts.log),
        },
        ttfb_ms,
        duration_ms = millis(ctx.started.elapsed()),
        prompt_tokens = usage.map(|u| u.prompt_tokens),
        completion_tokens = usage.map(|u| u.completion_tokens),
        error = match (&ctx.local_error, wire.written) {
            (Some(e), _) => Some(tracing::field::display(e.code.as_str())),
            (None, None) => Some(tracing::field::display("cancelled")),
            (None, Some(_)) => None,
        },
        stream_broken = ctx.downstream.is_broken(),
    );
}

/// A request path as the access line shows it: at most 256 bytes (a hostile 100 KiB URI does
/// not become a 100 KiB log line).
struct Bounded<'a>(&'a str);

impl fmt::Display for Bounded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 256;
        if self.0.len() <= MAX {
            return f.write_str(self.0);
        }
        let mut end = MAX;
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        f.write_str(&self.0[..end])?;
        f.write_str("…")
    }
}

/// Milliseconds with microsecond precision.
fn millis(d: Duration) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let micros = d.as_micros() as f64;
    micros / 1000.0
}

/// Every attempt, comma-separated: `provider/upstream_model:credential:outcome`. Names come
/// from the config (provider id, upstream model name, credential id), never a key or a URL.
struct Tried<'a> {
    snapshot: &'a Snapshot,
    plan: Option<&'a Plan>,
    log: &'a [AttemptRecord],
}

impl fmt::Display for Tried<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let catalog = &self.snapshot.catalog;
        for (i, rec) in self.log.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let provider = catalog.provider(rec.provider);
            let (position, credential) = rec.target;
            let model = self
                .plan
                .and_then(|p| p.deployment(catalog, position))
                .map_or("?", |d| &*d.upstream_model);
            let credential = provider.credentials.get(credential).map_or("?", |c| &*c.id);
            write!(
                f,
                "{}/{model}:{credential}:{}",
                provider.id,
                rec.outcome.as_str()
            )?;
        }
        Ok(())
    }
}
