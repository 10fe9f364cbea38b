//! Planning: from a scanned request to its plan and first target, and from a failure to the
//! next target.
//!
//! Reads what the request says about where it goes (`x-llm-route`, `x-llm-router`,
//! `x-llm-metadata`, the body's `routing`), has `routing::decide` choose the route and build
//! the plan from the request's snapshot, fixes the rules its attempts run under (attempt
//! bounds, same-target retries, the commit point, which driver runs them), and asks the plan
//! for targets. The plan decides without side effects; this room applies what it claims — a
//! half-open target's probe slot (held by the next attempt from here; a request that loses the
//! race moves on), the provider's credential-rotation cursor — and commits the choice.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pingora_proxy::Session;

use super::ctx::{Admitted, Attempts, NextTarget, RequestCtx};
use super::{access, respond};
use crate::adapters::caller::CallerRequest;
use crate::attempt::{
    Advance, CommitAt, FailureLog, NoCall, RetryOn, RetryRules, SameTarget, Terms,
};
use crate::catalog::stable_hash;
use crate::catalog::surface::{Conversion, Surface};
use crate::error::{ErrorCode, GatewayError};
use crate::health::HealthRegistry;
use crate::routing::decide::{self, SteeringHeaders, Via};
use crate::routing::plan::{prefix_hash, session_tag, Plan, PlanEnv, RequestFacts, SkipReason};
use crate::routing::Strategy;
use crate::snapshot::{Runtime, Snapshot};

/// The plan's view of the world for one decision: the snapshot's catalog and health, now.
pub fn plan_env(snapshot: &Snapshot) -> PlanEnv<'_> {
    let shared = &snapshot.health.shared;
    PlanEnv {
        catalog: &snapshot.catalog,
        health: &snapshot.health,
        now_ms: shared.now_ms(),
        wall_s: shared.wall_s(),
        degraded: shared.degraded.is_degraded(),
    }
}

/// The next target of the plan, with what the plan claimed applied: the half-open probe slot
/// (held by the returned target; lost to a concurrent request: skip the target and ask again)
/// and the credential cursor.
pub fn next_target(
    plan: &mut Plan,
    env: &PlanEnv<'_>,
    health: &Arc<HealthRegistry>,
    mut advance: Advance,
) -> Option<NextTarget> {
    loop {
        let choice = plan.next(env, advance)?;
        let claim = if choice.target.probe {
            let Some(claim) = health.try_claim_probe(choice.health_ref) else {
                plan.probe_lost(&choice);
                advance = Advance::NextDeployment;
                continue;
            };
            Some(claim)
        } else {
            None
        };
        env.catalog
            .provider(choice.rotate)
            .credential_cursor
            .fetch_add(1, Ordering::Relaxed);
        plan.commit(&choice);
        return Some(NextTarget {
            target: choice.target,
            claim,
            delay: std::time::Duration::ZERO,
            hold: None,
        });
    }
}

/// Decide the route, build the plan from the request's snapshot, fix its rules and pick the
/// first target (none when nothing can be called: see [`first_target_missing`]). `own_replay`:
/// only signalbox's own driver can replay the body. A refusal is the answer to send.
pub fn plan_request(
    session: &Session,
    ctx: &RequestCtx,
    runtime: &Runtime,
    request: CallerRequest,
    own_replay: bool,
) -> Result<Admitted, GatewayError> {
    let (routed, seed) = route_request(session, ctx, &request)?;
    plan_routed(session, ctx, runtime, request, routed, seed, own_replay)
}

/// The first half of [`plan_request`]: the route the request's headers, body and key lead to
/// (a knn entry's order is decided between the halves, by `crate::knn`), with the request's
/// seed (its draws').
pub fn route_request(
    session: &Session,
    ctx: &RequestCtx,
    request: &CallerRequest,
) -> Result<(decide::Routed, u64), GatewayError> {
    let snapshot = &*ctx.snapshot;
    let headers = &session.req_header().headers;
    // Without any `x-llm-*` header from the caller there is nothing to look up.
    let value = |name: &http::HeaderName| {
        ctx.steering
            .then(|| headers.get(name))
            .flatten()
            .map(http::HeaderValue::as_bytes)
    };
    let steering_headers = SteeringHeaders::read(
        value(&respond::names::X_LLM_ROUTE),
        value(&respond::names::X_LLM_ROUTER),
        value(&respond::names::X_LLM_METADATA),
    )
    .map_err(|why| GatewayError::new(ErrorCode::InvalidRequest, why))?;
    // The draws' seed: any good mix of the request's id does (it is unique per request). Not
    // `stable_hash` (SipHash, ~280 instructions): nothing outside this process reads it.
    let seed = request_seed(ctx.request_id.as_bytes());
    let mut steering = steering_headers.steer(ctx.surface, request, seed);
    steering.key = access::facts(ctx, snapshot);
    let lookup = |name: &str| headers.get(name).map(http::HeaderValue::as_bytes);
    steering.headers = Some(decide::HeaderLookup(&lookup));
    let routed = decide::route(snapshot, &steering).map_err(|e| e.answer(request))?;
    Ok((routed, seed))
}

/// The second half of [`plan_request`]: the plan of a routed request, its rules and first
/// target.
pub fn plan_routed(
    session: &Session,
    ctx: &RequestCtx,
    runtime: &Runtime,
    request: CallerRequest,
    routed: decide::Routed,
    seed: u64,
    own_replay: bool,
) -> Result<Admitted, GatewayError> {
    let snapshot = &*ctx.snapshot;
    let headers = &session.req_header().headers;
    let route = snapshot.route(routed.route);
    let failover = &snapshot.failover;
    let mut rules = RetryRules {
        max_attempts: failover.max_attempts,
        deadline: failover.deadline,
        same_target: SameTarget {
            attempts: failover.transient_retries,
            backoff: failover.transient_backoff,
            on: RetryOn::Transient,
        },
    };
    let mut failover_on_client_error = false;
    let mut hedge = failover.hedge;
    if let Via::Policy { policy, .. } = routed.via {
        let p = snapshot.policy(policy);
        hedge = p.hedge.or(hedge);
        rules.max_attempts = p.max_attempts.unwrap_or(rules.max_attempts);
        rules.same_target = p.retry.unwrap_or(rules.same_target);
        failover_on_client_error = p.failover_on_client_error;
    }
    let key = access::key(ctx, snapshot);
    let key_routing = key.and_then(|k| k.routing.as_ref());
    if let Some(r) = key_routing {
        rules.max_attempts = r.max_attempts(rules.max_attempts);
    }
    let session_hash = ctx
        .steering
        .then(|| headers.get(respond::names::X_LLM_SESSION))
        .flatten()
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(|v| stable_hash(v.as_bytes()));
    let env = plan_env(snapshot);
    // The estimate is made only when a candidate's price, window, `tpm` or budget reads it
    // (a few µs of scanning the prompt otherwise spent for nothing).
    let (reads_tokens, reads_needs) = match &routed.adhoc {
        Some(d) => (
            snapshot.catalog.reads_tokens(d),
            snapshot.catalog.reads_needs(d),
        ),
        None => (route.reads_tokens, route.reads_needs),
    };
    let (input_tokens, input_tokens_anthropic) = if reads_tokens {
        decide::input_tokens(snapshot, &routed, &request)
    } else {
        (0, 0)
    };
    let facts = RequestFacts {
        input_tokens,
        input_tokens_anthropic,
        output_tokens: request
            .max_tokens()
            .unwrap_or(decide::DEFAULT_OUTPUT_TOKENS),
        prefix_hash: (routed.strategy == Strategy::PrefixAffinity)
            .then(|| prefix_hash(request.prompt(), snapshot.routing.prefix_bytes)),
        session: session_hash.and_then(|h| runtime.sessions.get(h, env.now_ms)),
        round_robin: route.round_robin.fetch_add(1, Ordering::Relaxed),
        // Request ids are unique per request: a fresh seed for this request's draws.
        seed,
        // Compared only with a model's declared capabilities: without any, the prompt is not
        // searched for images.
        needs: if reads_needs {
            request.needs()
        } else {
            request.needs_but_vision()
        },
        surface: ctx.surface,
    };
    let rankings = runtime.rankings.load();
    let mut plan = decide::plan(snapshot, &rankings, &env, &routed, facts, key_routing);
    // The key's scope covers every candidate, wherever the route took it from.
    if let Some(models) = key.and_then(|k| access::scope(ctx, k)) {
        plan.restrict_models(models.clone());
    }
    let first = next_target(&mut plan, &env, &snapshot.health, Advance::NextDeployment);
    // Whether a candidate speaks the other dialect: only looked for when the catalog has a
    // provider that would (a handful of providers, not every candidate, on the common path).
    let translating = |kind| ctx.surface.served_by(kind) != Some(Conversion::Same);
    let translates = snapshot
        .catalog
        .providers
        .iter()
        .any(|p| translating(p.kind))
        && (0..plan.len()).any(|position| {
            plan.deployment(&snapshot.catalog, position)
                .is_some_and(|d| translating(snapshot.catalog.provider(d.provider).kind))
        });
    let stream = request.stream();
    if snapshot.hedging {
        // The hedge allowance is a share of every request the process serves.
        runtime.hedges.note_request(runtime.health.now_ms());
    }
    // Pingora's proxy loop writes an answer's header as soon as it arrives: it serves only
    // what commits there, a same-dialect stream with the first-chunk hold off. Everything else
    // (whole answers held until complete, held streams, translations, bodies only signalbox
    // can replay, refusals read before they are relayed) is driven by signalbox itself.
    // A hedge races two attempts: only signalbox's own driver can.
    let driven = !stream
        || hedge.is_some()
        || failover.first_chunk_hold.is_some()
        || translates
        || own_replay
        || failover_on_client_error;
    let commit_at = match (stream, driven) {
        (false, _) => CommitAt::WholeBody,
        (true, true) => CommitAt::FirstContent,
        (true, false) => CommitAt::Header,
    };
    Ok(Admitted {
        request,
        routed,
        plan,
        rules,
        terms: Terms {
            commit_at,
            failover_on_client_error,
        },
        driven,
        session: session_hash,
        seed,
        hedge,
        attempts: Attempts::new(first),
    })
}

/// The refusal for an admitted request whose plan has no first target (nothing to call).
pub fn first_target_missing(ctx: &RequestCtx) -> Option<GatewayError> {
    let a = ctx.admitted.as_ref()?;
    a.attempts.next.is_none().then(|| {
        no_target_error(
            &a.plan,
            &a.attempts.failures,
            ctx.surface,
            &plan_env(&ctx.snapshot),
        )
    })
}

/// What the caller is told when the plan has no (further) target: the attempts' failures when
/// there were any, else why nothing could be called — a fail-fast 503 with when the soonest
/// candidate frees up, a 429 for full windows or spent budgets, an endpoint no candidate's
/// provider serves.
pub fn no_target_error(
    plan: &Plan,
    failures: &FailureLog,
    surface: Surface,
    env: &PlanEnv<'_>,
) -> GatewayError {
    let no_call = plan.no_call();
    let err = failures.final_error(no_call);
    if failures.failures() > 0 {
        return err;
    }
    let only_endpoint = plan.skip_counts().next().is_some()
        && plan.skip_counts().all(|(r, _)| r == SkipReason::Endpoint);
    match (err.code, no_call) {
        // Every candidate's provider kind lacks this endpoint: the config says so, retrying
        // cannot help.
        (ErrorCode::NoProviderAvailable, _) if only_endpoint => GatewayError::new(
            ErrorCode::EndpointNotSupported,
            format!(
                "no provider of this model serves {}",
                surface.endpoint_path()
            ),
        ),
        // Fail fast: tell the caller when the soonest candidate frees up, and why none could
        // be called (reasons only: no provider is named).
        (ErrorCode::NoProviderAvailable, _) => {
            let secs = plan.soonest_ms().map_or(1, |until| {
                until.saturating_sub(env.now_ms).div_ceil(1000).max(1)
            });
            err.with_retry_after(Some(secs))
                .with_skipped(plan.skip_counts().map(|(r, n)| (r.as_str(), n)).collect())
        }
        (ErrorCode::BudgetExceeded, NoCall::OverBudget) => {
            err.with_retry_after(Some(plan.budget_frees_s().unwrap_or(3_600)))
        }
        (ErrorCode::RateLimited, NoCall::RateLimited) => {
            let secs = plan
                .rpm_frees_ms()
                .map_or(1, |at| at.saturating_sub(env.now_ms).div_ceil(1000).max(1));
            err.with_retry_after(Some(secs))
        }
        _ => err,
    }
}

/// A successful answer binds the caller's session (`x-llm-session`) to the deployment that
/// served it. Done when the header goes out, so the caller's next request already sees it.
pub fn bind_session(runtime: &Runtime, ctx: &RequestCtx) {
    let Some(a) = &ctx.admitted else {
        return;
    };
    let (Some(hash), Some(served)) = (a.session, a.attempts.served) else {
        return;
    };
    if let Some(d) = a
        .plan
        .deployment(&ctx.snapshot.catalog, served.target.position)
    {
        if d.model.is_some() {
            runtime.sessions.put(
                hash,
                session_tag(d.key_hash),
                ctx.snapshot.health.shared.now_ms(),
            );
        }
    }
}

/// The seed of a request's draws, from its id.
fn request_seed(id: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x5167_6e61_6c62_6f78).hash_one(id)
}
