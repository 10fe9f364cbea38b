//! Running a request's profiles and deciding what their results do.
//!
//! Every profile runs at once (one future each, polled together on the request's task: no
//! spawn, no lock), each bounded by its own `timeout`; a check that errs or runs out of time is
//! `unavailable`. Then, in the order the profiles were asked for: a blocking profile that
//! flagged refuses the request (400 `guardrail_blocked`, naming it); else a profile that could
//! not run under `on_unavailable: block` refuses it (503 `guardrail_unavailable`); else the
//! request is served and `x-llm-guardrails` reports every profile's result. Each result is
//! counted once in `signalbox_guardrail_checks_total`. Why a check was unavailable is logged
//! at debug level with the profile's name (never the input text).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use http::HeaderValue;
use pingora_core::connectors::http::Connector;

use super::{classifier, moderation, patterns, Check, Guardrails, Outcome, Profile};
use crate::catalog::Catalog;
use crate::config::{GuardrailMode, GuardrailUse};
use crate::error::{ErrorCode, GatewayError};
use crate::internal::InternalClient;

/// What the checks reach: the provider connections (moderation), the catalog they are
/// described in, and the gateway's own listener (classifiers).
#[derive(Clone, Copy)]
pub struct Env<'a> {
    pub connector: &'a Connector,
    pub catalog: &'a Catalog,
    pub internal: &'a InternalClient,
}

/// What the checks decided.
#[derive(Debug)]
pub struct Decision {
    /// The caller's answer when the request may not be served.
    pub refusal: Option<GatewayError>,
    /// `x-llm-guardrails` for a served request.
    pub header: Option<HeaderValue>,
}

/// Run `wanted` over `text` and decide.
pub async fn run(g: &Guardrails, wanted: &[GuardrailUse], text: &str, env: Env<'_>) -> Decision {
    let checks: Vec<_> = wanted
        .iter()
        .filter_map(|w| g.profiles.get(w.profile))
        .map(|p| check(p, text, env))
        .collect();
    let outcomes = join_all(checks).await;
    let mut blocked = None;
    let mut unavailable = None;
    let mut header = String::new();
    for (w, outcome) in wanted.iter().zip(&outcomes) {
        let Some(p) = g.profiles.get(w.profile) else {
            continue;
        };
        p.count(*outcome);
        match outcome {
            Outcome::Flagged if w.mode == GuardrailMode::Block => {
                blocked.get_or_insert(p);
            }
            Outcome::Unavailable if w.on_unavailable == GuardrailMode::Block => {
                unavailable.get_or_insert(p);
            }
            _ => {}
        }
        if !header.is_empty() {
            header.push(',');
        }
        header.push_str(&p.name);
        header.push('=');
        header.push_str(outcome.as_str());
    }
    let refusal = match (blocked, unavailable) {
        (Some(p), _) => Some(GatewayError::new(
            ErrorCode::GuardrailBlocked,
            format!("blocked by guardrail \"{}\"", p.name),
        )),
        (None, Some(p)) => Some(GatewayError::new(
            ErrorCode::GuardrailUnavailable,
            format!("guardrail \"{}\" could not run", p.name),
        )),
        (None, None) => None,
    };
    Decision {
        refusal,
        // Profile names are slugs: always a valid header value.
        header: HeaderValue::from_str(&header)
            .ok()
            .filter(|_| !header.is_empty()),
    }
}

/// One profile's check, bounded by its timeout.
async fn check(p: &Profile, text: &str, env: Env<'_>) -> Outcome {
    let flagged = tokio::time::timeout(p.timeout, async {
        match &p.check {
            Check::Patterns(res) => Some(patterns::flags(res, text)),
            Check::Moderation {
                provider,
                path,
                model,
            } => moderation::flags(env.connector, env.catalog, *provider, path, model, text)
                .await
                .map_err(|why| tracing::debug!(profile = %p.name, ?why, "guardrail unavailable"))
                .ok(),
            Check::Classifier {
                model,
                prompt,
                flag_on,
            } => classifier::flags(env.internal, model, prompt, flag_on, text, p.timeout)
                .await
                .map_err(|why| tracing::debug!(profile = %p.name, %why, "guardrail unavailable"))
                .ok(),
        }
    })
    .await;
    match flagged {
        Ok(Some(true)) => Outcome::Flagged,
        Ok(Some(false)) => Outcome::Passed,
        Ok(None) | Err(_) => Outcome::Unavailable,
    }
}

/// Poll every future on this task until all are done; their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_future_runs_at_once_and_keeps_its_place() {
        // Each future finishes only once all three have started: polled one after another,
        // the first would never finish.
        let barrier = tokio::sync::Barrier::new(3);
        let futures: Vec<_> = [3u8, 1, 2]
            .into_iter()
            .map(|n| {
                let barrier = &barrier;
                async move {
                    barrier.wait().await;
                    n
                }
            })
            .collect();
        let joined = tokio::time::timeout(std::time::Duration::from_secs(5), join_all(futures));
        assert_eq!(joined.await.expect("together"), vec![3, 1, 2]);
    }
}
