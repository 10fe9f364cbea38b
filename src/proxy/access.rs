//! Access: the caller's key, checked before anything else is done for the request — who it is
//! (401), whether it may name what it named (403, naming nothing it may not see), whether its
//! request could ever fit its `tpm` (413) — then, with the first target (`proxy::admission`),
//! whether its minute and its budget and the gateway's have room (429 with `Retry-After`);
//! and, when the request ends, what it actually used and spent. With no `keys` section every
//! caller is let through.

use http::HeaderMap;

use super::ctx::{RequestAdmission, RequestCtx};
use crate::adapters::caller::CallerRequest;
use crate::adapters::tokenizer::{self, Encoding};
use crate::config::{BudgetConfig, BudgetPeriod};
use crate::error::{ErrorCode, GatewayError};
use crate::keys::{self, cost_micro_usd, ClientKey, Refusal};
use crate::limits::budget::Spend;
use crate::limits::budget::{period_of, seconds_to_reset};
use crate::limits::hold::Reserved;
use crate::routing::decide::KeyFacts;
use crate::snapshot::Snapshot;
use crate::state::{self, admit::Ask, admit::SpendAsk};

/// The wall clock in whole seconds, from the health clock (injectable).
fn now_s(ctx: &RequestCtx) -> u64 {
    ctx.snapshot.health.shared.wall_s()
}

/// The caller's key, when keys are configured.
pub fn key<'t>(ctx: &RequestCtx, snapshot: &'t Snapshot) -> Option<&'t ClientKey> {
    snapshot.keys.as_ref()?.get(ctx.key?)
}

/// The catalog models the caller's key may be served by (`None`: every model). An internal
/// call acting as a key is billed as it but not scoped by it: it names the operator's choice.
pub fn scope<'k>(ctx: &RequestCtx, key: &'k ClientKey) -> Option<&'k std::sync::Arc<[bool]>> {
    if ctx.internal {
        None
    } else {
        key.models()
    }
}

/// Who is calling: with keys configured, the request must present one of them.
pub fn authenticate(
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    headers: &HeaderMap,
) -> Result<(), GatewayError> {
    let Some(table) = &snapshot.keys else {
        return Ok(());
    };
    if ctx.internal {
        // The gateway asking itself: as the key it names (billed and limited as that key),
        // else as no key at all.
        ctx.key = headers
            .get(crate::internal::KEY_HEADER)
            .and_then(|id| std::str::from_utf8(id.as_bytes()).ok())
            .and_then(|id| table.iter().position(|k| &*k.id == id));
        return Ok(());
    }
    match keys::presented(headers).and_then(|p| table.authenticate(p)) {
        Some((i, _)) => {
            ctx.key = Some(i);
            Ok(())
        }
        None => Err(GatewayError::new(
            ErrorCode::InvalidApiKey,
            "a valid API key is required (Authorization: Bearer <key> or x-api-key)",
        )),
    }
}

/// Whether the key may send this request's names (`model`, `routing.policy`,
/// `x-llm-route`), and whether its estimated tokens could ever fit the key's `tpm`. What is
/// left — the gateway's budget, the key's windows and budgets — is admitted with the first
/// target (see `proxy::admission`), once the request is planned.
pub fn check(
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    request: &CallerRequest,
    route_header: Option<&[u8]>,
) -> Result<(), GatewayError> {
    let key = key(ctx, snapshot);
    if key.is_none() && snapshot.global_budget.is_none() {
        return Ok(());
    }
    let mut tokens = 0;
    if let Some(key) = key {
        // An internal call names what the operator configured, not what the key chose.
        if !ctx.internal && !key.allows_request(request, route_header) {
            // Says only that it is not allowed: never whether the name exists.
            return Err(GatewayError::new(
                ErrorCode::ModelNotAllowed,
                "this API key may not use the model or route it named",
            ));
        }
        let output = request
            .max_tokens()
            .unwrap_or(keys::DEFAULT_OUTPUT_ESTIMATE);
        tokens = request.prompt_tokens() + output;
        if let Some(tpm) = key.tpm {
            // Near the key's limit the estimate's error could decide: counted exactly.
            if tokenizer::near(tokens, tpm) {
                if let Some(exact) = request.exact_tokens(Encoding::O200k) {
                    tokens = exact + output;
                }
            }
            if tokens > tpm {
                // Waiting cannot help: no Retry-After, so a client does not retry it.
                return Err(GatewayError::new(
                    ErrorCode::TokensExceedLimit,
                    "this request's estimated tokens exceed the API key's tokens-per-minute limit; a smaller request can pass",
                ));
            }
        }
    }
    ctx.admission = RequestAdmission::Pending { tokens };
    Ok(())
}

/// Admit the request on this replica's counters: the gateway's budget, then the key's limits;
/// the request is counted against them when admitted.
pub fn admit_locally(
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    tokens: u64,
) -> Result<(), GatewayError> {
    let now = now_s(ctx);
    if let Some(budget) = &snapshot.global_budget {
        // The whole gateway's budget: spent, nothing is sent anywhere.
        if let Err(secs) = snapshot.global_spend.check(budget, now) {
            return Err(gateway_budget_exceeded(secs));
        }
    }
    ctx.admission = RequestAdmission::Done;
    let Some(key) = key(ctx, snapshot) else {
        return Ok(());
    };
    match key.admit(now, tokens) {
        Ok(reservation) => {
            ctx.key_reservation = Some(reservation);
            Ok(())
        }
        Err(Refusal::RateLimited(secs)) => Err(rate_limited(secs)),
        Err(Refusal::BudgetExceeded(secs)) => Err(budget_exceeded(secs)),
    }
}

/// A budget of the request itself, in a shared ask.
#[derive(Debug, Clone, Copy)]
pub struct RequestBudget {
    pub period: BudgetPeriod,
    /// The gateway's (else the key's or its user's).
    pub gateway: bool,
}

/// What the request itself asks of the shared store, added to `ask`: the key's rpm and tpm
/// windows (one request, `tokens`), the key's, its user's and the gateway's budgets, each
/// reserving `cost`; returns those budgets in the ask's order.
pub fn request_ask(
    ctx: &RequestCtx,
    snapshot: &Snapshot,
    tokens: u64,
    cost: u64,
    ask: &mut Ask,
) -> Vec<RequestBudget> {
    let now_s = ask.now_s;
    let mut budgets = Vec::new();
    let mut spend = |ask: &mut Ask, counter: &str, budget: BudgetConfig, gateway: bool| {
        let (index, _) = period_of(budget.period, now_s);
        ask.spends.push(SpendAsk {
            name: state::spend_key(counter, budget.period, index),
            budget: budget.micro_usd,
            reserve: cost,
            ttl: state::spend_ttl(budget.period),
        });
        budgets.push(RequestBudget {
            period: budget.period,
            gateway,
        });
    };
    if let Some(key) = key(ctx, snapshot) {
        if let Some(rpm) = key.rpm {
            let name = state::window_key(&state::key_counter(&key.id, "rpm"));
            ask.windows.push((name, u64::from(rpm), 1));
        }
        if let Some(tpm) = key.tpm {
            let name = state::window_key(&state::key_counter(&key.id, "tpm"));
            ask.windows.push((name, tpm, tokens));
        }
        if let Some(b) = key.budget {
            spend(ask, &state::key_counter(&key.id, ""), b, false);
        }
        if let (Some((b, _)), Some(user)) = (&key.user_budget, key.user.as_deref()) {
            spend(ask, &state::user_counter(user), *b, false);
        }
    }
    if let Some(b) = snapshot.global_budget {
        spend(ask, state::GLOBAL_COUNTER, b, true);
    }
    budgets
}

/// Count a request the shared store admitted, as the store did: the key's request and
/// tokens, and `cost` reserved in every budget of the request itself.
pub fn admitted_shared(ctx: &mut RequestCtx, snapshot: &Snapshot, tokens: u64, cost: u64) {
    let now = now_s(ctx);
    ctx.admission = RequestAdmission::Done;
    let mut reserved = false;
    if let Some(key) = key(ctx, snapshot) {
        ctx.key_reservation = Some(key.admitted_shared(now, tokens, cost));
        reserved = key.budget.is_some() || key.user_budget.is_some();
    }
    if let Some(b) = &snapshot.global_budget {
        snapshot.global_spend.add_pushed(b.period, now, cost);
        reserved = true;
    }
    if reserved && cost > 0 {
        ctx.reserved_cost = Some(Reserved {
            at_s: now,
            amount: cost,
        });
    }
}

pub fn rate_limited(secs: u64) -> GatewayError {
    GatewayError::new(
        ErrorCode::RateLimited,
        "this API key is over its requests or tokens per minute",
    )
    .with_retry_after(Some(secs))
}

pub fn budget_exceeded(secs: u64) -> GatewayError {
    GatewayError::new(
        ErrorCode::BudgetExceeded,
        "this API key has spent its budget for the period",
    )
    .with_retry_after(Some(secs))
}

pub fn gateway_budget_exceeded(secs: u64) -> GatewayError {
    GatewayError::new(
        ErrorCode::BudgetExceeded,
        "the gateway has spent its budget for the period",
    )
    .with_retry_after(Some(secs))
}

/// The refusal for a spent budget of the request itself.
pub fn request_budget_spent(budget: RequestBudget, now_s: u64) -> GatewayError {
    let secs = seconds_to_reset(budget.period, now_s);
    if budget.gateway {
        gateway_budget_exceeded(secs)
    } else {
        budget_exceeded(secs)
    }
}

/// What conditions may read about the key.
pub fn facts<'t>(ctx: &RequestCtx, snapshot: &'t Snapshot) -> Option<KeyFacts<'t>> {
    let key = key(ctx, snapshot)?;
    Some(KeyFacts {
        id: Some(&key.id),
        user: key.user.as_deref(),
        budget: key.budget_facts(now_s(ctx)),
        models: scope(ctx, key).map(|m| &m[..]),
        routing: key.routing.as_ref(),
    })
}

/// When the request ends: what the served answer cost (its usage × the serving deployment's
/// price) is spent from every budget it counts against — the deployment's, its provider's, the
/// gateway's, the key's — and the key's token window takes the reported tokens in place of the
/// estimate. Returns that cost (micro-USD; 0 when unpriced or unreported) for the metrics
/// and the ledger.
pub fn settle(ctx: &mut RequestCtx) -> u64 {
    let reservation = ctx.key_reservation.take();
    let reserved_cost = ctx.reserved_cost.take();
    let ctx = &*ctx;
    let snapshot = &*ctx.snapshot;
    let served = ctx.admitted.as_ref().and_then(|a| {
        let s = a.attempts.served?;
        let usage = a.attempts.relay.signals().usage;
        Some((
            a.plan.deployment(&snapshot.catalog, s.target.position),
            usage,
            a.attempts.served_hold,
        ))
    });
    let (deployment, usage, hold) = served.unwrap_or_default();
    // The wall clock is read only when something below counts by it: a tokens window, a
    // budget or the key's reservation (most requests have none of them).
    let counts = hold.tokens.is_some()
        || deployment.is_some_and(|d| d.tpm.is_some())
        || snapshot.has_budgets
        || reservation.is_some();
    let now = if counts { now_s(ctx) } else { 0 };
    let used = usage.map(|u| u.prompt_tokens + u.completion_tokens);
    if let Some(d) = deployment {
        match hold.tokens {
            Some(r) => r.settle_window(&d.tokens, now, used),
            None => {
                if let (Some(used), Some(_)) = (used, d.tpm) {
                    d.tokens.add(now, used);
                }
            }
        }
    }
    let cost = match (usage, deployment.and_then(|d| d.price)) {
        (Some(u), Some(p)) => cost_micro_usd(
            &p,
            u.prompt_tokens,
            u.cache_read_tokens,
            u.completion_tokens,
        ),
        _ => 0,
    };
    if !snapshot.has_budgets && reservation.is_none() {
        // Nothing to count against.
        return cost;
    }
    // What a reservation settles to: the served answer's cost; unknown when a successful
    // answer reported no usage (the estimate stands); nothing when no answer was served.
    let spent = match (deployment, usage) {
        (Some(_), Some(_)) => Some(cost),
        // A relayed refusal cost nothing.
        (Some(_), None) if ctx.downstream.status().is_some_and(|s| s >= 300) => Some(0),
        (Some(_), None) => None,
        (None, _) => Some(0),
    };
    let spend = |budget: Option<BudgetConfig>, on: &Spend, reserved: Option<Reserved>| {
        let Some(b) = budget else { return };
        match reserved {
            Some(r) => r.settle_spend(on, b.period, now, spent),
            None if cost > 0 => on.add(b.period, now, cost),
            None => {}
        }
    };
    if let Some(d) = deployment {
        let provider = snapshot.catalog.provider(d.provider);
        spend(d.budget, &d.spend, hold.cost);
        spend(provider.budget, &provider.spend, hold.cost);
    }
    spend(
        snapshot.global_budget,
        &snapshot.global_spend,
        reserved_cost,
    );
    let Some(reservation) = reservation else {
        return cost;
    };
    let Some(key) = key(ctx, snapshot) else {
        return cost;
    };
    key.settle(reservation, now, used, spent, reserved_cost);
    cost
}
