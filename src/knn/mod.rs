//! The knn (learned) router at work (DESIGN §10): what a request under a `router: knn` entry
//! goes through before its plan is built, what examples are taught with, and where they live.
//!
//! - This file: the per-request step ([`route`]) and the compiled settings a snapshot holds
//!   ([`Settings`]). Intake calls [`route`] only when the snapshot has `routing_knn` (one
//!   `Option` check for every other request) and the request is not an internal call (the
//!   embedding is itself a request through the gateway: it must not recurse). For a request
//!   whose selected entry is knn it embeds the last user turn through the gateway's own plan
//!   for `embedding_model` (so the embedding fails over like any request), bounded by
//!   `embed_timeout`, picks the caller's pool (the key's user's when warm, else the shared
//!   pool of the `x-llm-router-task`, else none), and lets `routing::knn::decide` rank the
//!   targets; the route of that order replaces the default's. Under `granularity:
//!   conversation` an `x-llm-conversation-id` reuses its first decision for an hour (a failed
//!   embedding is not kept: the next turn tries again). Nothing here fails a request: every
//!   failure is the default's route with its reason.
//! - [`memory`]: pools and conversations (on the runtime: they outlive a reload).
//! - [`store`]: the examples' table in the ledger database.
//! - [`admin`]: `POST`/`DELETE /admin/routing/examples`, `GET /admin/routing/status`.

pub mod admin;
pub mod memory;
pub mod store;

use std::sync::Arc;

use http::HeaderMap;
use prometheus::{IntCounter, IntCounterVec};
use serde_json::Value;

use crate::adapters::caller::CallerRequest;
use crate::config::{KnnConfig, KnnGranularity};
use crate::routing::decide::{Routed, Via};
use crate::routing::knn::{self as rule, Candidate, KnnOutcome, PoolUsed, Report, TopK};
use crate::routing::policy::{EntryRouter, KnnRoutes, Pick};
use crate::routing::scoring::cost_micro;
use crate::routing::RouteTable;
use crate::snapshot::{Runtime, Snapshot};

/// `x-llm-router-task`: the caller's task partition.
pub const TASK_HEADER: http::HeaderName = http::HeaderName::from_static("x-llm-router-task");
/// `x-llm-conversation-id`: one decision per conversation under `granularity: conversation`.
pub const CONVERSATION_HEADER: http::HeaderName =
    http::HeaderName::from_static("x-llm-conversation-id");
/// The longest task or conversation id read (longer: ignored).
const MAX_ID: usize = 256;

/// `routing_knn` compiled for one snapshot, with the decision counters resolved per policy.
pub struct Settings {
    pub config: KnnConfig,
    pub rule: rule::Rule,
    /// By policy index: `signalbox_knn_decisions_total{policy, outcome}` in
    /// [`KnnOutcome::LABELS`] order (`None` for a policy without a knn entry).
    counters: Vec<Option<[IntCounter; 6]>>,
    generation: u64,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Settings {
    pub fn build(config: &KnnConfig, table: &RouteTable, decisions: &IntCounterVec) -> Self {
        let counters = table
            .policies
            .iter()
            .map(|p| {
                let has_knn = p
                    .entries
                    .iter()
                    .any(|e| matches!(e.router, EntryRouter::Knn(_)));
                has_knn.then(|| {
                    KnnOutcome::LABELS.map(|o| decisions.with_label_values(&[&*p.name, o]))
                })
            })
            .collect();
        Self {
            config: config.clone(),
            rule: rule::Rule {
                k: config.k,
                alpha: config.alpha,
                confidence_floor: config.confidence_floor,
            },
            counters,
            generation: table.generation,
        }
    }

    fn count(&self, policy: usize, label: usize) {
        if let Some(Some(c)) = self.counters.get(policy) {
            if let Some(c) = c.get(label) {
                c.inc();
            }
        }
    }
}

/// What a request's headers and key say about its pool and conversation.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    pub user: Option<String>,
    pub task: Option<String>,
    pub conversation: Option<Vec<u8>>,
}

impl Ask {
    pub fn read(headers: &HeaderMap, user: Option<&str>) -> Self {
        let text = |name: &http::HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= MAX_ID)
        };
        Self {
            user: user.map(str::to_string),
            task: text(&TASK_HEADER).map(str::to_string),
            conversation: text(&CONVERSATION_HEADER).map(|c| c.as_bytes().to_vec()),
        }
    }

    /// From explain's header lookup.
    pub fn from_lookup<'a>(header: impl Fn(&str) -> Option<&'a [u8]>, user: Option<&str>) -> Self {
        let text = |name: &str| {
            header(name)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= MAX_ID)
        };
        Self {
            user: user.map(str::to_string),
            task: text(TASK_HEADER.as_str()).map(str::to_string),
            conversation: text(CONVERSATION_HEADER.as_str()).map(|c| c.as_bytes().to_vec()),
        }
    }
}

/// The knn entry a routed request selected: where it is, and its routes.
struct Selected<'s> {
    policy: usize,
    entry: usize,
    routes: &'s KnnRoutes,
}

fn selected<'s>(snapshot: &'s Snapshot, routed: &Routed) -> Option<Selected<'s>> {
    let Via::Policy {
        policy, selection, ..
    } = routed.via
    else {
        return None;
    };
    let entry = selection.entry?;
    match &snapshot.policy(policy).entries.get(entry)?.router {
        EntryRouter::Knn(routes) => Some(Selected {
            policy: policy.get(),
            entry,
            routes,
        }),
        _ => None,
    }
}

/// Whether the request selected a knn entry (to decide, or switched off): only then does
/// [`route`] have anything to do.
pub fn applies(snapshot: &Snapshot, routed: &Routed) -> bool {
    selected(snapshot, routed).is_some()
}

/// The request path's step (see the module doc). Runs only when the snapshot has `routing_knn`.
pub async fn route(
    runtime: &Runtime,
    snapshot: &Snapshot,
    request: &CallerRequest,
    ask: Ask,
    routed: &mut Routed,
) {
    let Some(settings) = snapshot.knn.as_deref() else {
        return;
    };
    if !routed.knn_pending() {
        // `x-llm-router: off` on a knn entry: the default, counted.
        if let (Via::Policy { selection, .. }, Some(s)) = (routed.via, selected(snapshot, routed)) {
            if selection.pick == Pick::RouterOff {
                settings.count(s.policy, 5);
            }
        }
        return;
    }
    let Some(sel) = selected(snapshot, routed) else {
        return;
    };
    let now = runtime.health.now_ms();
    let conversation = match (settings.config.granularity, &ask.conversation) {
        (KnnGranularity::Conversation, Some(c)) => Some(memory::Conversations::tag(
            settings.generation,
            sel.policy,
            sel.entry,
            c,
        )),
        _ => None,
    };
    if let Some(tag) = conversation {
        if let Some((order, _)) = runtime.knn.conversations.get(tag, now) {
            let order = order.map(|rank| rule::unrank(rank, sel.routes.models.len()));
            let report = Report {
                outcome: KnnOutcome::Sticky,
                pool: PoolUsed::None,
                examples: 0,
                neighbours: Vec::new(),
                scored: Vec::new(),
                order: order.unwrap_or_default(),
            };
            settings.count(sel.policy, KnnOutcome::Sticky.label_index());
            apply(routed, sel.routes, report);
            return;
        }
    }
    let policy_name = &snapshot.policies[sel.policy].name;
    let (pool, used, seen) = choose_pool(runtime, &settings.config, policy_name, &ask);
    let vector = match &pool {
        None => None,
        Some(_) => embed(runtime, &settings.config, request).await,
    };
    let candidates = candidates(snapshot, sel.routes, request);
    let mut top = TopK::new();
    let report = rule::decide(
        settings.rule,
        pool.as_deref().map(|p| (p, used)),
        seen,
        vector.as_deref(),
        &candidates,
        &mut top,
    );
    settings.count(sel.policy, report.outcome.label_index());
    if let Some(tag) = conversation.filter(|_| report.outcome != KnnOutcome::EmbedFailed) {
        let rank = (!report.order.is_empty()).then(|| rule::rank(&report.order));
        runtime
            .knn
            .conversations
            .put(tag, rank, report.outcome, now);
    }
    apply(routed, sel.routes, report);
}

/// The pool a request uses: its user's when warm, else the shared pool of its task when warm;
/// with the most examples seen when neither is (for the cold report).
fn choose_pool(
    runtime: &Runtime,
    config: &KnnConfig,
    policy: &str,
    ask: &Ask,
) -> (Option<Arc<rule::Pool>>, PoolUsed, usize) {
    let pools = runtime.knn.pools();
    let task = ask.task.as_deref();
    let user = ask
        .user
        .as_deref()
        .and_then(|u| pools.get(policy, Some(u), task));
    let shared = pools.get(policy, None, task);
    let seen = user
        .map_or(0, |p| p.len())
        .max(shared.map_or(0, |p| p.len()));
    if let Some(p) = user.filter(|p| p.len() >= config.warmup) {
        return (Some(p.clone()), PoolUsed::User, seen);
    }
    if let Some(p) = shared.filter(|p| p.len() >= config.warmup) {
        return (Some(p.clone()), PoolUsed::Shared, seen);
    }
    (None, PoolUsed::None, seen)
}

/// The request's last user turn, embedded through the plan within `embed_timeout`.
async fn embed(runtime: &Runtime, config: &KnnConfig, request: &CallerRequest) -> Option<Vec<f32>> {
    let text = crate::adapters::input::last_user_text(request);
    if text.trim().is_empty() {
        return None;
    }
    let deadline = config.embed_timeout;
    match runtime
        .internal
        .embed(&config.embedding_model, &[&text], deadline)
        .await
    {
        Ok(mut vectors) => vectors.pop(),
        Err(e) => {
            tracing::debug!(error = %e, "knn: the request was not embedded; the default serves");
            None
        }
    }
}

/// Each target with this request's estimated cost on it (its cheapest deployment).
fn candidates(snapshot: &Snapshot, routes: &KnnRoutes, request: &CallerRequest) -> Vec<Candidate> {
    let input = request.prompt_tokens();
    let output = request
        .max_tokens()
        .unwrap_or(crate::routing::decide::DEFAULT_OUTPUT_TOKENS);
    let catalog = &snapshot.catalog;
    routes
        .models
        .iter()
        .zip(&routes.names)
        .map(|(&m, name)| Candidate {
            name: name.clone(),
            cost_micro: catalog
                .models
                .get(m)
                .and_then(|model| {
                    model
                        .deployments
                        .iter()
                        .map(|d| cost_micro(catalog.deployment(*d), input, output))
                        .min()
                })
                .unwrap_or(0),
        })
        .collect()
}

/// Put the decision into the routed request: the order's route (or the default's), the pick,
/// the report.
fn apply(routed: &mut Routed, routes: &KnnRoutes, report: Report) {
    let route = if report.order.is_empty() {
        routes.fallback
    } else {
        routes.route(&report.order)
    };
    routed.route = route;
    if let Via::Policy { selection, .. } = &mut routed.via {
        selection.route = route;
        selection.pick = Pick::Knn(report.outcome);
    }
    routed.knn = Some(Arc::new(report));
}

/// Explain's decision: as the request path's, with the embedding `vector` made beforehand
/// ([`explain_vector`]; `None`: none could be made), no conversation read or written, nothing
/// counted.
pub fn explain_decide(
    runtime: &Runtime,
    snapshot: &Snapshot,
    request: &CallerRequest,
    ask: &Ask,
    vector: Option<&[f32]>,
    routed: &mut Routed,
) {
    let Some(settings) = snapshot.knn.as_deref() else {
        return;
    };
    if !routed.knn_pending() {
        return;
    }
    let Some(sel) = selected(snapshot, routed) else {
        return;
    };
    let policy_name = &snapshot.policies[sel.policy].name;
    let (pool, used, seen) = choose_pool(runtime, &settings.config, policy_name, ask);
    let candidates = candidates(snapshot, sel.routes, request);
    let mut top = TopK::new();
    let report = rule::decide(
        settings.rule,
        pool.as_deref().map(|p| (p, used)),
        seen,
        vector,
        &candidates,
        &mut top,
    );
    apply(routed, sel.routes, report);
}

/// The embedding explain needs: made only when the request would be decided by a knn entry
/// (and the snapshot has `routing_knn`).
pub async fn explain_vector(
    runtime: &Runtime,
    request: &CallerRequest,
    pending: bool,
) -> Option<Vec<f32>> {
    let snapshot = runtime.snapshot.load_full();
    let settings = snapshot.knn.as_deref()?;
    if !pending {
        return None;
    }
    embed(runtime, &settings.config, request).await
}

/// The routing reason's and explain's names for a knn entry's targets.
pub fn target_names<'s>(snapshot: &'s Snapshot, routed: &Routed) -> Option<&'s [Arc<str>]> {
    selected(snapshot, routed).map(|s| &s.routes.names[..])
}

/// Explain's `knn` object for a routed request (`null` unless a knn entry decided it).
pub fn explain_json(snapshot: &Snapshot, routed: &Routed) -> Value {
    match (&routed.knn, target_names(snapshot, routed)) {
        (Some(report), Some(names)) => report.json(names),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::surface::Surface;
    use bytes::Bytes;

    #[test]
    fn the_last_user_turn_is_what_is_embedded() {
        let request = CallerRequest::parse(
            Surface::ChatCompletions,
            Bytes::from_static(
                br#"{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"first"},{"role":"assistant","content":"a"},{"role":"user","content":[{"type":"text","text":"second"}]}]}"#,
            ),
        )
        .unwrap();
        assert_eq!(crate::adapters::input::last_user_text(&request), "second");
        let request = CallerRequest::parse(
            Surface::Responses,
            Bytes::from_static(br#"{"model":"m","input":"just this"}"#),
        )
        .unwrap();
        assert_eq!(
            crate::adapters::input::last_user_text(&request),
            "just this"
        );
    }
}
