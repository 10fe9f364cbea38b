//! Planning: from a scanned request to the first target, and from a failure to the next.
//!
//! Resolves the `model` string, applies the request's `routing` overrides (a strategy for
//! this request only, a provider allow-list that can only narrow), builds the plan from one
//! snapshot load and asks it for targets. The plan decides without side effects; this room
//! applies what it claims — a half-open target's probe slot (a request that loses the race
//! moves on), the provider's credential-rotation cursor — and commits the choice.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pingora_proxy::Session;

use super::ctx::RequestCtx;
use super::respond;
use crate::adapters::openai::{ChatRequest, RoutingOverride};
use crate::catalog::stable_hash;
use crate::error::{ErrorCode, GatewayError};
use crate::retry::Advance;
use crate::routing::plan::{prefix_hash, session_tag, Plan, PlanEnv, RequestFacts, Target};
use crate::routing::scoring::{rank, RankBy};
use crate::routing::{resolve, Resolution, ResolveError, Router, Strategy, Tables};

/// Output tokens assumed when the request does not say (`max_tokens`).
const DEFAULT_OUTPUT_TOKENS: u64 = 256;

/// The plan's view of the world for one decision.
pub fn plan_env<'a>(router: &Router, tables: &'a Tables) -> PlanEnv<'a> {
    PlanEnv {
        catalog: &tables.catalog,
        health: &tables.health,
        now_ms: router.health.now_ms(),
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

/// Resolve the model, build the plan from one snapshot and pick the first target. Records the
/// plan and the target in `ctx`; a refusal is the answer to send.
pub fn plan_request(
    session: &Session,
    ctx: &mut RequestCtx,
    router: &Router,
    tables: &Arc<Tables>,
    request: ChatRequest,
) -> Result<(), GatewayError> {
    let resolution = {
        let model = request.model_name();
        resolve(tables, &model).map_err(|e| resolve_error(e, &model))?
    };
    let route_idx = resolution.route();
    ctx.route = Some(route_idx);
    let route = tables.route(route_idx);
    let strategy = match request.routing.as_ref().and_then(|r| r.strategy.as_deref()) {
        None => route.strategy,
        Some(name) => Strategy::parse(name).ok_or_else(|| {
            GatewayError::new(
                ErrorCode::InvalidRequest,
                format!("`routing.strategy`: unknown strategy {:?}", truncate(name)),
            )
        })?,
    };
    ctx.session = session
        .req_header()
        .headers
        .get(respond::names::X_LLM_SESSION)
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(|v| stable_hash(v.as_bytes()));
    let env = plan_env(router, tables);
    let facts = RequestFacts {
        input_tokens: respond::estimate_input_tokens(request.body_len()),
        output_tokens: request.max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS),
        prefix_hash: (strategy == Strategy::PrefixAffinity)
            .then(|| prefix_hash(request.prompt(), tables.routing.prefix_bytes)),
        session: ctx.session.and_then(|h| router.sessions.get(h, env.now_ms)),
        round_robin: route.round_robin.fetch_add(1, Ordering::Relaxed),
        // Request ids are unique per request: a fresh seed for this request's draws.
        seed: stable_hash(ctx.request_id.as_bytes()),
    };
    let mut plan = match resolution {
        Resolution::Route(r) if strategy == route.strategy => {
            Plan::new(router.rankings.load().order(tables, r), strategy, facts)
        }
        // A per-request strategy: rank this route's candidates for it, and for this request's
        // size.
        Resolution::Route(_) => {
            let by = RankBy {
                strategy,
                custom: tables.routing.custom_weights,
                now_ms: env.now_ms,
                tokens: (facts.input_tokens, facts.output_tokens),
            };
            let order = rank(&tables.catalog, &tables.health, &route.candidates, by);
            Plan::new(Arc::from(order), strategy, facts)
        }
        Resolution::Adhoc { deployment, .. } => Plan::adhoc(deployment, facts),
    };
    if let Some(routing) = &request.routing {
        apply_routing_override(tables, routing, &mut plan)?;
    }
    ctx.pending = next_target(&mut plan, &env, Advance::NextDeployment);
    ctx.request = Some(request);
    let refusal = ctx.pending.is_none().then(|| {
        let err = ctx.failures.final_error(plan.no_call());
        if err.code == ErrorCode::NoProviderAvailable {
            // Fail fast: tell the caller when the soonest candidate frees up.
            let secs = plan.soonest_ms().map_or(1, |until| {
                until.saturating_sub(env.now_ms).div_ceil(1000).max(1)
            });
            err.with_retry_after(Some(secs))
        } else {
            err
        }
    });
    ctx.plan = Some(plan);
    refusal.map_or(Ok(()), Err)
}

fn resolve_error(e: ResolveError, model: &str) -> GatewayError {
    // The model name is echoed only when short and printable: it is the caller's own input.
    let shown: String = if model.len() <= 128 && model.bytes().all(|b| b.is_ascii_graphic()) {
        model.to_string()
    } else {
        "(the requested model)".to_string()
    };
    match e {
        ResolveError::ModelNotFound => GatewayError::new(
            ErrorCode::ModelNotFound,
            format!("no model, alias or chain named {shown:?}"),
        ),
        ResolveError::NoActiveChain => GatewayError::new(
            ErrorCode::ModelNotFound,
            "`auto` needs an active chain and none is configured",
        ),
        ResolveError::ChainEmpty => GatewayError::new(
            ErrorCode::ChainEmpty,
            format!("{shown:?} names a chain with no usable model"),
        ),
        ResolveError::ModelDisabled => {
            GatewayError::new(ErrorCode::ModelNotFound, format!("{shown:?} is disabled"))
        }
    }
}

/// Apply the request's `routing` object beyond its strategy (already in the plan). It can
/// narrow the plan, never widen it.
fn apply_routing_override(
    tables: &Tables,
    routing: &RoutingOverride,
    plan: &mut Plan,
) -> Result<(), GatewayError> {
    if let Some(policy) = &routing.policy {
        return Err(GatewayError::new(
            ErrorCode::InvalidRequest,
            format!("`routing.policy`: no policy named {:?}", truncate(policy)),
        ));
    }
    if let Some(providers) = &routing.providers {
        let mut allowed = Vec::with_capacity(providers.len());
        for id in providers {
            match tables.catalog.provider_by_id(id) {
                Some(p) => allowed.push(p.idx),
                None => {
                    return Err(GatewayError::new(
                        ErrorCode::InvalidRequest,
                        format!("`routing.providers`: no provider named {:?}", truncate(id)),
                    ))
                }
            }
        }
        plan.restrict_to(allowed);
    }
    Ok(())
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
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
