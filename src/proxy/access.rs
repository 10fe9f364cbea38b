//! Access: the caller's key, checked before anything else is done for the request — who it is
//! (401), whether it may name what it named (403, naming nothing it may not see), whether its
//! minute and its budget have room (429 with `Retry-After`) — and, when the request ends, what
//! it actually used and spent. With no `keys` section every caller is let through.

use http::HeaderMap;

use super::ctx::RequestCtx;
use crate::adapters::caller::CallerRequest;
use crate::adapters::tokenizer::{self, Encoding};
use crate::config::BudgetPeriod;
use crate::error::{ErrorCode, GatewayError};
use crate::keys::{self, cost_micro_usd, ClientKey, Refusal};
use crate::limits::budget::{period_of, seconds_to_reset};
use crate::routing::decide::KeyFacts;
use crate::snapshot::Snapshot;
use crate::state::{self, admit::Answer, admit::Ask, admit::SharedAdmission};

/// The wall clock in whole seconds, from the health clock (injectable).
fn now_s(ctx: &RequestCtx) -> u64 {
    ctx.snapshot.health.shared.wall_s()
}

/// The caller's key, when keys are configured.
pub fn key<'t>(ctx: &RequestCtx, snapshot: &'t Snapshot) -> Option<&'t ClientKey> {
    snapshot.keys.as_ref()?.get(ctx.key?)
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

/// Whether the key may send this request's names (`model`, `routing.policy`, `x-llm-route`),
/// then whether its limits have room; the request is counted against them when admitted.
/// With exact shared limits (`shared`), the key's and its user's limits are admitted by one
/// check-and-add in the shared store; past `state.timeout` on local counters.
pub async fn admit(
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    request: &CallerRequest,
    route_header: Option<&[u8]>,
    shared: Option<&SharedAdmission>,
) -> Result<(), GatewayError> {
    if let Some(budget) = &snapshot.global_budget {
        // The whole gateway's budget: spent, nothing is sent anywhere.
        if let Err(secs) = snapshot.global_spend.check(budget, now_s(ctx)) {
            return Err(GatewayError::new(
                ErrorCode::BudgetExceeded,
                "the gateway has spent its budget for the period",
            )
            .with_retry_after(Some(secs)));
        }
    }
    let Some(key) = key(ctx, snapshot) else {
        return Ok(());
    };
    if !key.allows_request(request, route_header) {
        // Says only that it is not allowed: never whether the name exists.
        return Err(GatewayError::new(
            ErrorCode::ModelNotAllowed,
            "this API key may not use the model or route it named",
        ));
    }
    let output = request
        .max_tokens()
        .unwrap_or(keys::DEFAULT_OUTPUT_ESTIMATE);
    let mut tokens = request.prompt_tokens() + output;
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
    let now = now_s(ctx);
    if let Some(shared) = shared {
        let (ask, budgets) = shared_ask(key, now, tokens);
        if !ask.windows.is_empty() || !ask.spends.is_empty() {
            match shared.admit(&ask).await {
                Some(Answer::Admitted) => {
                    ctx.key_reservation = Some(key.admitted_shared(now, tokens));
                    return Ok(());
                }
                Some(Answer::WindowFull { wait_s, .. }) => {
                    return Err(rate_limited(wait_s));
                }
                Some(Answer::BudgetSpent { index }) => {
                    let period = budgets.get(index).copied().unwrap_or(BudgetPeriod::Total);
                    return Err(budget_exceeded(seconds_to_reset(period, now)));
                }
                // Past state.timeout, or Redis away: the local counters decide.
                None => {}
            }
        }
    }
    match key.admit(now, tokens) {
        Ok(reservation) => {
            ctx.key_reservation = Some(reservation);
            Ok(())
        }
        Err(Refusal::RateLimited(secs)) => Err(rate_limited(secs)),
        Err(Refusal::BudgetExceeded(secs)) => Err(budget_exceeded(secs)),
    }
}

fn rate_limited(secs: u64) -> GatewayError {
    GatewayError::new(
        ErrorCode::RateLimited,
        "this API key is over its requests or tokens per minute",
    )
    .with_retry_after(Some(secs))
}

fn budget_exceeded(secs: u64) -> GatewayError {
    GatewayError::new(
        ErrorCode::BudgetExceeded,
        "this API key has spent its budget for the period",
    )
    .with_retry_after(Some(secs))
}

/// What a request under `key` asks of the shared store: its rpm and tpm windows (one request,
/// `tokens`), its and its user's budgets; with each budget's period, in the ask's order.
fn shared_ask(key: &ClientKey, now_s: u64, tokens: u64) -> (Ask, Vec<BudgetPeriod>) {
    let mut ask = Ask {
        now_s,
        ..Ask::default()
    };
    if let Some(rpm) = key.rpm {
        let name = state::window_key(&state::key_counter(&key.id, "rpm"));
        ask.windows.push((name, u64::from(rpm), 1));
    }
    if let Some(tpm) = key.tpm {
        let name = state::window_key(&state::key_counter(&key.id, "tpm"));
        ask.windows.push((name, tpm, tokens));
    }
    let mut periods = Vec::new();
    let budgets = [
        key.budget.map(|b| (state::key_counter(&key.id, ""), b)),
        key.user_budget
            .as_ref()
            .zip(key.user.as_deref())
            .map(|((b, _), user)| (state::user_counter(user), *b)),
    ];
    for (counter, budget) in budgets.into_iter().flatten() {
        let (index, _) = period_of(budget.period, now_s);
        ask.spends.push((
            state::spend_key(&counter, budget.period, index),
            budget.micro_usd,
        ));
        periods.push(budget.period);
    }
    (ask, periods)
}

/// Give back what an admitted request reserved when signalbox refused it before any call.
pub fn refund(ctx: &mut RequestCtx, snapshot: &Snapshot) {
    let (Some(key), Some(r)) = (key(ctx, snapshot), ctx.key_reservation.take()) else {
        return;
    };
    key.state.requests.sub(r.at_s, 1);
    key.state.tokens.sub(r.at_s, r.tokens);
}

/// What conditions may read about the key.
pub fn facts<'t>(ctx: &RequestCtx, snapshot: &'t Snapshot) -> Option<KeyFacts<'t>> {
    let key = key(ctx, snapshot)?;
    Some(KeyFacts {
        id: &key.id,
        user: key.user.as_deref(),
        budget: key.budget_facts(now_s(ctx)),
        models: key.models().map(|m| &m[..]),
    })
}

/// When the request ends: what the served answer cost (its usage × the serving deployment's
/// price) is spent from every budget it counts against — the deployment's, its provider's, the
/// gateway's, the key's — and the key's token window takes the reported tokens in place of the
/// estimate. Returns that cost (micro-USD; 0 when unpriced or unreported) for the metrics
/// and the ledger.
pub fn settle(ctx: &mut RequestCtx) -> u64 {
    let reservation = ctx.key_reservation.take();
    let ctx = &*ctx;
    let snapshot = &*ctx.snapshot;
    let now = now_s(ctx);
    let served = ctx.admitted.as_ref().and_then(|a| {
        let s = a.attempts.served?;
        let usage = a.attempts.relay.signals().usage;
        Some((
            a.plan.deployment(&snapshot.catalog, s.target.position),
            usage,
        ))
    });
    let (deployment, usage) = served.unwrap_or((None, None));
    if let (Some(d), Some(u)) = (deployment, usage) {
        if d.tpm.is_some() {
            d.tokens.add(now, u.prompt_tokens + u.completion_tokens);
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
    if cost > 0 {
        if let Some(d) = deployment {
            let provider = snapshot.catalog.provider(d.provider);
            let spends = [
                (d.budget, &*d.spend),
                (provider.budget, &*provider.spend),
                (snapshot.global_budget, &*snapshot.global_spend),
            ];
            for (budget, spend) in spends {
                if let Some(b) = budget {
                    spend.add(b.period, now, cost);
                }
            }
        }
    }
    let Some(reservation) = reservation else {
        return cost;
    };
    let Some(key) = key(ctx, snapshot) else {
        return cost;
    };
    let used = usage.map(|u| u.prompt_tokens + u.completion_tokens);
    key.settle(reservation, now, used, cost);
    cost
}
