//! Guard: the request's guardrails (`crate::guardrails`), once, between admission and the
//! first attempt — after its key and limits admitted it, before either driver starts — so no
//! driver can call a provider for a request a guardrail refuses. Intake calls it only when the
//! snapshot defines profiles and the request is not the gateway's own.
//!
//! The profiles are the selected policy's and those the caller adds (`x-llm-guardrails`). A
//! refusal gives back what the first target's admission held (it was never called), so a
//! blocked request leaves no upstream call, no ledger row and no spend. A served request
//! carries the results to the response header (`RequestCtx::guardrails`).

use pingora_core::connectors::http::Connector;
use pingora_proxy::Session;

use super::admission;
use super::ctx::RequestCtx;
use crate::adapters::caller::CallerRequest;
use crate::error::GatewayError;
use crate::guardrails::{self, run::Env};
use crate::routing::decide::Via;
use crate::snapshot::Runtime;

/// Run the request's guardrails; `Some` is the caller's answer.
pub async fn check(
    session: &Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
    connector: &Connector,
) -> Option<GatewayError> {
    let g = ctx.snapshot.guardrails.clone()?;
    let a = ctx.admitted.as_ref()?;
    // Token counting generates nothing from the text: no check runs for it.
    if matches!(a.request, CallerRequest::CountTokens(_)) {
        return None;
    }
    let policy = match a.routed.via {
        Via::Policy { policy, .. } => Some(policy.get()),
        _ => None,
    };
    let header = session
        .req_header()
        .headers
        .get(guardrails::HEADER)
        .map(http::HeaderValue::as_bytes);
    let wanted = match g.wanted(policy, header) {
        Ok(w) if w.is_empty() => return None,
        Ok(w) => w,
        Err(refusal) => return Some(refused(ctx, refusal)),
    };
    let text = crate::adapters::input::input_text(&a.request);
    let env = Env {
        connector,
        catalog: &ctx.snapshot.catalog,
        internal: &runtime.internal,
    };
    let decision = guardrails::run(&g, &wanted, &text, env).await;
    match decision.refusal {
        Some(refusal) => Some(refused(ctx, refusal)),
        None => {
            ctx.guardrails = decision.header;
            None
        }
    }
}

/// The request will not be served: give back the first target (a probe slot it held) and
/// what its admission counted, as for a target never called.
fn refused(ctx: &mut RequestCtx, refusal: GatewayError) -> GatewayError {
    let RequestCtx {
        snapshot, admitted, ..
    } = ctx;
    if let Some(a) = admitted.as_mut() {
        if let Some(next) = a.attempts.next.take() {
            if let (Some(hold), Some(d)) = (
                next.hold,
                a.plan.deployment(&snapshot.catalog, next.target.position),
            ) {
                admission::release(snapshot, d, hold, false);
            }
        }
    }
    refusal
}
