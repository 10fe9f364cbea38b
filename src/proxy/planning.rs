//! Planning: from a scanned request to the first target, and from a failure to the next.
//!
//! Reads what the request says about where it goes (`x-llm-route`, `x-llm-router`,
//! `x-llm-metadata`, the body's `routing`), has `routing::decide` choose the route and build
//! the plan from one snapshot load, and asks the plan for targets. The plan decides without side effects; this room
//! applies what it claims — a half-open target's probe slot (a request that loses the race
//! moves on), the provider's credential-rotation cursor — and commits the choice.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pingora_proxy::Session;

use super::ctx::RequestCtx;
use super::{access, respond};
use crate::adapters::caller::CallerRequest;
use crate::catalog::stable_hash;
use crate::catalog::surface::Conversion;
use crate::error::{ErrorCode, GatewayError};
use crate::retry::Advance;
use crate::routing::decide::{self, SteeringHeaders, Via};
use crate::routing::plan::{
    prefix_hash, session_tag, Plan, PlanEnv, RequestFacts, SkipReason, Target,
};
use crate::routing::{Router, Strategy, Tables};

/// The plan's view of the world for one decision.
pub fn plan_env<'a>(router: &Router, tables: &'a Tables) -> PlanEnv<'a> {
    PlanEnv {
        catalog: &tables.catalog,
        health: &tables.health,
        now_ms: router.health.now_ms(),
        wall_s: router.health.wall_s(),
        degraded: router.health.degraded.is_degraded(),
    }
}

/// The next target of the plan, with what the plan claimed applied: the half-open probe slot
/// (lost to a concurrent request: skip the target and ask again) and the credential cursor.
pub fn next_target(plan: &mut Plan, env: &PlanEnv<'_>, mut advance: Advance) -> Option<Target> {
    loop {
        let choice = plan.next(env, advance)?;
        if choice.target.probe && !env.health.try_claim_probe(choice.health_ref) {
            plan.probe_lost(&choice);
            advance = Advance::NextDeployment;
            continue;
        }
        env.catalog
            .provider(choice.rotate)
            .credential_cursor
            .fetch_add(1, Ordering::Relaxed);
        plan.commit(&choice);
        return Some(choice.target);
    }
}

/// Decide the route, build the plan from one snapshot and pick the first target. Records the
/// decision, the plan and the target in `ctx`; a refusal is the answer to send.
pub fn plan_request(
    session: &Session,
    ctx: &mut RequestCtx,
    router: &Router,
    tables: &Arc<Tables>,
    request: CallerRequest,
) -> Result<(), GatewayError> {
    let headers = &session.req_header().headers;
    let value = |name: &http::HeaderName| headers.get(name).map(http::HeaderValue::as_bytes);
    let steering_headers = SteeringHeaders::read(
        value(&respond::names::X_LLM_ROUTE),
        value(&respond::names::X_LLM_ROUTER),
        value(&respond::names::X_LLM_METADATA),
    )
    .map_err(|why| GatewayError::new(ErrorCode::InvalidRequest, why))?;
    let seed = stable_hash(ctx.request_id.as_bytes());
    let mut steering = steering_headers.steer(ctx.surface, &request, seed);
    steering.key = access::facts(ctx, tables);
    let routed = decide::route(tables, &steering).map_err(|e| e.answer(&request))?;
    let route = tables.route(routed.route);
    ctx.route = Some(routed.route);
    if let Via::Policy { policy, .. } = routed.via {
        let p = tables.policy(policy);
        ctx.max_attempts = p.max_attempts.unwrap_or(ctx.max_attempts);
        ctx.failover_on_client_error = p.failover_on_client_error;
    }
    ctx.session = headers
        .get(respond::names::X_LLM_SESSION)
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(|v| stable_hash(v.as_bytes()));
    let env = plan_env(router, tables);
    let facts = RequestFacts {
        input_tokens: request.prompt_tokens(),
        output_tokens: request
            .max_tokens()
            .unwrap_or(decide::DEFAULT_OUTPUT_TOKENS),
        prefix_hash: (routed.strategy == Strategy::PrefixAffinity)
            .then(|| prefix_hash(request.prompt(), tables.routing.prefix_bytes)),
        session: ctx.session.and_then(|h| router.sessions.get(h, env.now_ms)),
        round_robin: route.round_robin.fetch_add(1, Ordering::Relaxed),
        // Request ids are unique per request: a fresh seed for this request's draws.
        seed,
        needs: request.needs(),
        surface: ctx.surface,
    };
    let rankings = router.rankings.load();
    let mut plan = decide::plan(tables, &rankings, &env, &routed, facts);
    ctx.pending = next_target(&mut plan, &env, Advance::NextDeployment);
    // Whether a candidate speaks the other dialect: only looked for when the catalog has a
    // provider that would (a handful of providers, not every candidate, on the common path).
    let translating = |kind| ctx.surface.served_by(kind) != Some(Conversion::Same);
    ctx.translates = tables.catalog.providers.iter().any(|p| translating(p.kind))
        && (0..plan.len()).any(|position| {
            plan.deployment(&tables.catalog, position)
                .is_some_and(|d| translating(tables.catalog.provider(d.provider).kind))
        });
    ctx.request = Some(request);
    ctx.routed = Some(routed);
    let refusal = ctx.pending.is_none().then(|| {
        let err = ctx.failures.final_error(plan.no_call());
        let only_endpoint = plan.skip_counts().all(|(r, _)| r == SkipReason::Endpoint)
            && plan.skip_counts().next().is_some();
        match err.code {
            // Every candidate's provider kind lacks this endpoint: the config says so, retrying
            // cannot help.
            ErrorCode::NoProviderAvailable if only_endpoint => GatewayError::new(
                ErrorCode::EndpointNotSupported,
                format!(
                    "no provider of this model serves {}",
                    ctx.surface.endpoint_path()
                ),
            ),
            // Fail fast: tell the caller when the soonest candidate frees up, and why none
            // could be called (reasons only: no provider is named).
            ErrorCode::NoProviderAvailable => {
                let secs = plan.soonest_ms().map_or(1, |until| {
                    until.saturating_sub(env.now_ms).div_ceil(1000).max(1)
                });
                err.with_retry_after(Some(secs))
                    .with_skipped(plan.skip_counts().map(|(r, n)| (r.as_str(), n)).collect())
            }
            ErrorCode::BudgetExceeded => {
                err.with_retry_after(Some(plan.budget_frees_s().unwrap_or(3_600)))
            }
            ErrorCode::RateLimited => {
                let secs = plan
                    .rpm_frees_ms()
                    .map_or(1, |at| at.saturating_sub(env.now_ms).div_ceil(1000).max(1));
                err.with_retry_after(Some(secs))
            }
            _ => err,
        }
    });
    ctx.plan = Some(plan);
    refusal.map_or(Ok(()), Err)
}

/// A successful answer binds the caller's session (`x-llm-session`) to the deployment that
/// served it. Done when the header goes out, so the caller's next request already sees it.
pub fn bind_session(ctx: &RequestCtx) {
    let (Some(hash), Some(router), Some(tables), Some(plan), Some(served)) = (
        ctx.session,
        &ctx.router,
        &ctx.tables,
        &ctx.plan,
        &ctx.served,
    ) else {
        return;
    };
    if let Some(d) = plan.deployment(&tables.catalog, served.target.position) {
        if d.model.is_some() {
            router
                .sessions
                .put(hash, session_tag(d.key_hash), router.health.now_ms());
        }
    }
}
