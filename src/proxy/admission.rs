//! Admission against the limits an attempt counts against, at the attempt's start: the
//! request's own (the gateway's budget, the caller's key: once, with its first target) and its
//! target deployment's (the deployment's `rpm` and `tpm` windows, its and its provider's
//! budgets).
//!
//! Without exact shared limits, the request's own limits are admitted on this replica's
//! counters and the deployment's were already read by the plan (its call is counted when the
//! attempt begins). With them (`state.limits: exact` and a Redis), each attempt asks the store
//! once — one check-and-add for everything it counts against — and what is admitted there is
//! counted here as already in the store: the call, its estimated tokens and its estimated cost,
//! reserved. A reservation is given back when the attempt fails (the call stays counted) and
//! settles to the served answer's usage when the request ends (`access::settle`). A deployment
//! the store finds full is skipped like one this replica saw full, and the plan's next target
//! is asked for; a full limit of the request's own is the caller's 429. Past `state.timeout`,
//! or with Redis away, the local counters decide.

use super::access::{self, RequestBudget};
use super::ctx::{Admitted, AttemptHold, RequestAdmission, RequestCtx};
use super::planning::{next_target, no_target_error, plan_env};
use crate::attempt::Advance;
use crate::catalog::Deployment;
use crate::error::GatewayError;
use crate::keys::cost_micro_usd;
use crate::limits::budget::{period_of, seconds_to_reset};
use crate::limits::hold::Reserved;
use crate::routing::plan::SkipReason;
use crate::snapshot::Snapshot;
use crate::state::admit::{Answer, Ask, SharedAdmission, SpendAsk};
use crate::state::{self, spend_key, spend_ttl, window_key};

/// Where admitting the next target left the request.
#[derive(Debug)]
pub enum Admission {
    /// The next target may be called.
    Ready,
    /// The store refused the next target's deployment: the next target is another (its body
    /// may need preparing), or none (then `Refused`).
    Moved,
    /// No attempt may start: the caller's answer.
    Refused(GatewayError),
}

/// Admit the request's next target (and, the first time, the request itself).
pub async fn admit_next(ctx: &mut RequestCtx, shared: Option<&SharedAdmission>) -> Admission {
    let pending = match ctx.admission {
        RequestAdmission::Pending { tokens } => Some(tokens),
        _ => None,
    };
    let Some(shared) = shared else {
        // Local counters only: the plan read the deployment's; the request's own now.
        return match pending {
            None => Admission::Ready,
            Some(tokens) => {
                let snapshot = ctx.snapshot.clone();
                match access::admit_locally(ctx, &snapshot, tokens) {
                    Ok(()) => Admission::Ready,
                    Err(refusal) => Admission::Refused(refusal),
                }
            }
        };
    };
    let snapshot = ctx.snapshot.clone();
    let now_s = snapshot.health.shared.wall_s();
    let asked = {
        let Some(a) = ctx.admitted.as_ref() else {
            return Admission::Ready;
        };
        let Some(next) = &a.attempts.next else {
            return Admission::Refused(no_target_error(
                &a.plan,
                &a.attempts.failures,
                ctx.surface,
                &plan_env(&snapshot),
            ));
        };
        if next.hold.is_some() {
            return Admission::Ready;
        }
        let position = next.target.position;
        let Some(d) = a.plan.deployment(&snapshot.catalog, position) else {
            return Admission::Ready;
        };
        let estimate = Estimate::of(&snapshot, a, d);
        let mut ask = Ask {
            now_s,
            ..Ask::default()
        };
        let budgets = pending.map_or_else(Vec::new, |tokens| {
            access::request_ask(ctx, &snapshot, tokens, estimate.cost, &mut ask)
        });
        let own = (ask.windows.len(), ask.spends.len());
        let limits = deployment_ask(&snapshot, d, &estimate, &mut ask);
        Asked {
            position,
            estimate,
            ask,
            budgets,
            own,
            limits,
        }
    };
    if asked.ask.is_empty() {
        return admitted_locally(ctx, &snapshot, pending);
    }
    // The store's round trip on the heap (only with Redis): inline, its state would be part
    // of every request's future, for as long as a stream is open.
    let Some(answer) = super::heap::on_heap(|| shared.admit(&asked.ask)).await else {
        // Past state.timeout, or Redis away (counted): the local counters decide.
        return admitted_locally(ctx, &snapshot, pending);
    };
    let Asked {
        position,
        estimate,
        budgets,
        own,
        limits,
        ..
    } = asked;
    match answer {
        Answer::Admitted => {
            if let Some(tokens) = pending {
                access::admitted_shared(ctx, &snapshot, tokens, estimate.cost);
            }
            if let Some(a) = ctx.admitted.as_mut() {
                let hold = a
                    .plan
                    .deployment(&snapshot.catalog, position)
                    .map(|d| hold_admitted(&snapshot, d, &estimate, now_s));
                if let Some(next) = a.attempts.next.as_mut() {
                    next.hold = Some(hold.unwrap_or_default());
                }
            }
            Admission::Ready
        }
        Answer::WindowFull { index, wait_s } if index < own.0 => {
            Admission::Refused(access::rate_limited(wait_s))
        }
        Answer::BudgetSpent { index } if index < own.1 => match budgets.get(index) {
            Some(b) => Admission::Refused(access::request_budget_spent(*b, now_s)),
            None => Admission::Refused(access::budget_exceeded(3_600)),
        },
        Answer::WindowFull { index, wait_s } => {
            let reason = if Some(index - own.0) == limits.rpm {
                SkipReason::RpmFull
            } else {
                SkipReason::TpmFull
            };
            move_on(ctx, &snapshot, position, reason, wait_s)
        }
        Answer::BudgetSpent { index } => {
            let period = limits.periods.get(index - own.1).copied();
            let frees = period.map_or(3_600, |p| seconds_to_reset(p, now_s));
            move_on(ctx, &snapshot, position, SkipReason::OverBudget, frees)
        }
    }
}

/// One attempt's ask, with what its answer is read against.
struct Asked {
    position: usize,
    estimate: Estimate,
    ask: Ask,
    /// The request's own budgets, in the ask's order.
    budgets: Vec<RequestBudget>,
    /// How many windows and spends of the ask are the request's own (the deployment's follow).
    own: (usize, usize),
    limits: DeploymentLimits,
}

/// What one attempt on a deployment is estimated to take: tokens (prompt by the provider's
/// kind, plus the output bound) and their cost at the deployment's price.
struct Estimate {
    tokens: u64,
    cost: u64,
}

impl Estimate {
    fn of(snapshot: &Snapshot, a: &Admitted, d: &Deployment) -> Self {
        let facts = a.plan.facts();
        let input = facts.input_for(snapshot.catalog.provider(d.provider).kind);
        let output = facts.output_tokens;
        Self {
            tokens: input + output,
            cost: d
                .price
                .map_or(0, |price| cost_micro_usd(&price, input, 0, output)),
        }
    }
}

/// Where the deployment's limits sit in an ask.
#[derive(Default)]
struct DeploymentLimits {
    /// Its `rpm` window's index among the deployment's windows.
    rpm: Option<usize>,
    /// The periods of its budgets (its own, its provider's), in the ask's order.
    periods: Vec<crate::config::BudgetPeriod>,
}

/// Add what an attempt on `d` asks of the store: its call and estimated tokens in its
/// windows, its estimated cost in its and its provider's budgets.
fn deployment_ask(
    snapshot: &Snapshot,
    d: &Deployment,
    estimate: &Estimate,
    ask: &mut Ask,
) -> DeploymentLimits {
    let mut limits = DeploymentLimits::default();
    if d.model.is_none() {
        // An ad-hoc deployment has no limits.
        return limits;
    }
    let catalog = &snapshot.catalog;
    let stem = state::deployment_counter(catalog, d);
    let first = ask.windows.len();
    if let Some(rpm) = d.rpm {
        limits.rpm = Some(ask.windows.len() - first);
        ask.windows
            .push((window_key(&format!("{stem}:rpm")), u64::from(rpm), 1));
    }
    if let Some(tpm) = d.tpm {
        ask.windows
            .push((window_key(&format!("{stem}:tpm")), tpm, estimate.tokens));
    }
    let provider = catalog.provider(d.provider);
    let budgets = [
        d.budget.map(|b| (stem.clone(), b)),
        provider
            .budget
            .map(|b| (state::provider_counter(&provider.id), b)),
    ];
    for (counter, b) in budgets.into_iter().flatten() {
        let (index, _) = period_of(b.period, ask.now_s);
        ask.spends.push(SpendAsk {
            name: spend_key(&counter, b.period, index),
            budget: b.micro_usd,
            reserve: estimate.cost,
            ttl: spend_ttl(b.period),
        });
        limits.periods.push(b.period);
    }
    limits
}

/// Count here what the store admitted for an attempt on `d`: its call, its reserved tokens
/// and cost (all already in the store).
fn hold_admitted(
    snapshot: &Snapshot,
    d: &Deployment,
    estimate: &Estimate,
    now_s: u64,
) -> AttemptHold {
    let mut hold = AttemptHold::default();
    if d.model.is_none() {
        return hold;
    }
    if d.rpm.is_some() {
        d.requests.add_pushed(now_s, 1);
        hold.request_at = Some(now_s);
    }
    if d.tpm.is_some() {
        d.tokens.add_pushed(now_s, estimate.tokens);
        hold.tokens = Some(Reserved {
            at_s: now_s,
            amount: estimate.tokens,
        });
    }
    let provider = snapshot.catalog.provider(d.provider);
    let mut reserved = false;
    for (budget, spend) in [(d.budget, &d.spend), (provider.budget, &provider.spend)] {
        if let Some(b) = budget {
            spend.add_pushed(b.period, now_s, estimate.cost);
            reserved = true;
        }
    }
    if reserved && estimate.cost > 0 {
        hold.cost = Some(Reserved {
            at_s: now_s,
            amount: estimate.cost,
        });
    }
    hold
}

/// Nothing asked of the store, or it did not answer: the request's own limits on the local
/// counters; the deployment's call is counted when the attempt begins.
fn admitted_locally(ctx: &mut RequestCtx, snapshot: &Snapshot, pending: Option<u64>) -> Admission {
    if let Some(tokens) = pending {
        if let Err(refusal) = access::admit_locally(ctx, snapshot, tokens) {
            return Admission::Refused(refusal);
        }
    }
    if let Some(next) = ctx.admitted.as_mut().and_then(|a| a.attempts.next.as_mut()) {
        next.hold = Some(AttemptHold::default());
    }
    Admission::Ready
}

/// The store refused the target's deployment: skip it and take the plan's next target.
fn move_on(
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
    position: usize,
    reason: SkipReason,
    frees_s: u64,
) -> Admission {
    let surface = ctx.surface;
    let Some(a) = ctx.admitted.as_mut() else {
        return Admission::Ready;
    };
    let env = plan_env(snapshot);
    a.plan.refused_shared(position, reason, env.now_ms, frees_s);
    // Dropping the target gives back a probe slot it held.
    a.attempts.next = None;
    a.attempts.next = next_target(&mut a.plan, &env, &snapshot.health, Advance::NextDeployment);
    if a.attempts.next.is_some() {
        Admission::Moved
    } else {
        Admission::Refused(no_target_error(
            &a.plan,
            &a.attempts.failures,
            surface,
            &env,
        ))
    }
}

/// Give back what an attempt's admission holds: its reserved tokens and cost, and — for an
/// attempt that never called (`called: false`) — its call.
pub fn release(snapshot: &Snapshot, d: &Deployment, hold: AttemptHold, called: bool) {
    if let (Some(at), false) = (hold.request_at, called) {
        d.requests.sub(at, 1);
    }
    if let Some(r) = hold.tokens {
        r.release_window(&d.tokens);
    }
    if let Some(r) = hold.cost {
        let provider = snapshot.catalog.provider(d.provider);
        for (budget, spend) in [(d.budget, &d.spend), (provider.budget, &provider.spend)] {
            if let Some(b) = budget {
                r.release_spend(spend, b.period);
            }
        }
    }
}
