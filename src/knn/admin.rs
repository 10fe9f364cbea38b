//! The knn router's admin endpoints (DESIGN §9, §10), behind the admin tokens like every other
//! admin read and write:
//!
//! | endpoint | token | does |
//! |---|---|---|
//! | `POST /admin/routing/examples` | write | teach a pool scored examples |
//! | `GET /admin/routing/status` | read | every pool's size and warm state (never a prompt) |
//! | `DELETE /admin/routing/examples?policy=&user=&task=` | write | forget a pool |
//!
//! A body names its `policy` (optional when exactly one policy has a knn entry), `user`
//! (absent: the shared pool) and `task`, and `examples: [{prompt, scores: {<target>: 0..1}}]`,
//! at most [`MAX_EXAMPLES`] a call. Every score's name is one of the policy's knn targets and
//! every score is within 0..=1, else 400 naming the path (`examples[2].scores.gpt-x`). The
//! prompts are embedded through the gateway's own plan for `routing_knn.embedding_model` (in
//! batches of [`BATCH`], each within [`TEACH_TIMEOUT`]); an embedding that cannot be made is a
//! 502 and nothing is stored.

// A refusal is a whole admin response, returned by value (as in `crate::admin`).
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Response};
use pingora_core::protocols::http::ServerSession;
use serde::Deserialize;
use serde_json::{json, Value};

use super::memory::{PoolKey, TeachError};
use crate::admin::{error, json as json_response, read_body};
use crate::routing::policy::EntryRouter;
use crate::snapshot::{Runtime, Snapshot};

/// The most examples one call may teach.
pub const MAX_EXAMPLES: usize = 1_000;
/// Prompts per embedding call.
pub const BATCH: usize = 64;
/// How long one batch's embedding may take (teaching is not on any caller's clock).
pub const TEACH_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeachBody {
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    task: Option<String>,
    examples: Vec<ExampleBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExampleBody {
    prompt: String,
    scores: serde_json::Map<String, Value>,
}

fn bad(path: &str, message: &str) -> Response<Vec<u8>> {
    error(400, "invalid_request", &format!("{path}: {message}"))
}

/// `/admin/routing/...`: `parts` after `admin`.
pub async fn handle(
    runtime: &Runtime,
    session: &mut ServerSession,
    method: &Method,
    parts: &[&str],
) -> Response<Vec<u8>> {
    match (method, parts) {
        (&Method::POST, ["routing", "examples"]) => teach(runtime, session).await,
        (&Method::DELETE, ["routing", "examples"]) => {
            let query = session.req_header().uri.query().map(str::to_string);
            forget(runtime, query.as_deref()).await
        }
        (&Method::GET, ["routing", "status"]) => status(runtime),
        _ => error(404, "not_found", "no such admin endpoint"),
    }
}

/// The knn targets' names of `policy`, every knn entry's together; `None`: it has none.
fn targets(snapshot: &Snapshot, policy: &str) -> Option<BTreeSet<Arc<str>>> {
    let p = snapshot.policies.iter().find(|p| &*p.name == policy)?;
    let names: BTreeSet<Arc<str>> = p
        .entries
        .iter()
        .filter_map(|e| match &e.router {
            EntryRouter::Knn(k) => Some(k.names.iter().cloned()),
            _ => None,
        })
        .flatten()
        .collect();
    (!names.is_empty()).then_some(names)
}

/// The policy a call means: the one named (it must have a knn entry), else the only one with one.
fn policy(snapshot: &Snapshot, named: Option<&str>) -> Result<String, Response<Vec<u8>>> {
    if snapshot.knn.is_none() {
        return Err(error(
            404,
            "knn_not_configured",
            "no `routing_knn` section is configured",
        ));
    }
    match named {
        Some(name) => {
            let name = name.to_ascii_lowercase();
            if targets(snapshot, &name).is_some() {
                Ok(name)
            } else {
                Err(bad("policy", "names no policy with a knn entry"))
            }
        }
        None => {
            let with: Vec<&str> = snapshot
                .policies
                .iter()
                .filter(|p| targets(snapshot, &p.name).is_some())
                .map(|p| &*p.name)
                .collect();
            match with.as_slice() {
                [one] => Ok((*one).to_string()),
                [] => Err(bad("policy", "no policy has a knn entry")),
                _ => Err(bad(
                    "policy",
                    &format!(
                        "required: {} policies have a knn entry ({})",
                        with.len(),
                        with.join(", ")
                    ),
                )),
            }
        }
    }
}

fn pool_json(key: &PoolKey, examples: usize) -> Value {
    json!({"policy": key.policy, "user": key.user, "task": key.task, "examples": examples})
}

async fn teach(runtime: &Runtime, session: &mut ServerSession) -> Response<Vec<u8>> {
    let body = match read_body(session).await {
        Ok(b) => b,
        Err(refusal) => return refusal,
    };
    let snapshot = runtime.snapshot.load_full();
    let body: TeachBody =
        match serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body)) {
            Ok(b) => b,
            Err(e) => {
                let path = e.path().to_string();
                return bad(
                    if path == "." { "body" } else { &path },
                    &e.inner().to_string(),
                );
            }
        };
    let policy = match policy(&snapshot, body.policy.as_deref()) {
        Ok(p) => p,
        Err(refusal) => return refusal,
    };
    let Some(settings) = snapshot.knn.as_deref() else {
        return error(
            404,
            "knn_not_configured",
            "no `routing_knn` section is configured",
        );
    };
    let names = targets(&snapshot, &policy).unwrap_or_default();
    if body.examples.is_empty() {
        return bad("examples", "needs at least one example");
    }
    if body.examples.len() > MAX_EXAMPLES {
        return bad("examples", &format!("at most {MAX_EXAMPLES} a call"));
    }
    let mut scored: Vec<Vec<(Arc<str>, f32)>> = Vec::with_capacity(body.examples.len());
    for (i, e) in body.examples.iter().enumerate() {
        if e.prompt.trim().is_empty() {
            return bad(&format!("examples[{i}].prompt"), "must not be empty");
        }
        if e.scores.is_empty() {
            return bad(
                &format!("examples[{i}].scores"),
                "needs a score for at least one target",
            );
        }
        let mut scores = Vec::with_capacity(e.scores.len());
        for (name, v) in &e.scores {
            let path = format!("examples[{i}].scores.{name}");
            let Some(target) = names.iter().find(|n| ***n == *name) else {
                let known: Vec<&str> = names.iter().map(|n| &**n).collect();
                return bad(
                    &path,
                    &format!(
                        "not a target of policy {policy} (one of {})",
                        known.join(", ")
                    ),
                );
            };
            match v.as_f64() {
                Some(s) if (0.0..=1.0).contains(&s) => {
                    #[allow(clippy::cast_possible_truncation)]
                    scores.push((target.clone(), s as f32));
                }
                _ => return bad(&path, "a score is a number from 0 to 1"),
            }
        }
        scored.push(scores);
    }
    let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(body.examples.len());
    for batch in body.examples.chunks(BATCH) {
        let prompts: Vec<&str> = batch.iter().map(|e| e.prompt.as_str()).collect();
        match runtime
            .internal
            .embed(&settings.config.embedding_model, &prompts, TEACH_TIMEOUT)
            .await
        {
            Ok(v) => vectors.extend(v),
            Err(e) => {
                return error(
                    502,
                    "embedding_failed",
                    &format!(
                        "the examples could not be embedded with {}: {e}",
                        settings.config.embedding_model
                    ),
                )
            }
        }
    }
    let key = PoolKey {
        policy,
        user: body.user.filter(|u| !u.is_empty()),
        task: body.task.filter(|t| !t.is_empty()),
    };
    let n = vectors.len();
    let examples = vectors.into_iter().zip(scored).collect();
    match runtime
        .knn
        .teach(key.clone(), examples, settings.config.max_examples_per_pool)
        .await
    {
        Ok(size) => json_response(200, &json!({"stored": n, "pool": pool_json(&key, size)})),
        Err(e @ (TeachError::Dimensions { .. } | TeachError::ZeroVector)) => {
            bad("examples", &e.to_string())
        }
        Err(e) => error(500, "store_failed", &e.to_string()),
    }
}

/// A query parameter, percent-decoded (`None` when absent or empty).
fn param(query: Option<&str>, name: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
        .filter(|v| !v.is_empty())
}

async fn forget(runtime: &Runtime, query: Option<&str>) -> Response<Vec<u8>> {
    let snapshot = runtime.snapshot.load_full();
    let named = param(query, "policy").map(|p| p.to_ascii_lowercase());
    // A pool of a policy that no longer has a knn entry (loaded from the store) can still be
    // forgotten by naming it.
    let stale = named.as_ref().filter(|p| {
        runtime
            .knn
            .pools()
            .list()
            .iter()
            .any(|(k, _)| &k.policy == *p)
    });
    let policy = match stale {
        Some(p) => p.clone(),
        None => match policy(&snapshot, named.as_deref()) {
            Ok(p) => p,
            Err(refusal) => return refusal,
        },
    };
    let key = PoolKey {
        policy,
        user: param(query, "user"),
        task: param(query, "task"),
    };
    match runtime.knn.forget(&key).await {
        Ok(n) => json_response(200, &json!({"forgotten": n, "pool": pool_json(&key, 0)})),
        Err(e) => error(500, "store_failed", &e.to_string()),
    }
}

fn status(runtime: &Runtime) -> Response<Vec<u8>> {
    let snapshot = runtime.snapshot.load_full();
    let warmup = snapshot.knn.as_ref().map(|s| s.config.warmup);
    let pools = runtime.knn.pools();
    let list: Vec<Value> = pools
        .list()
        .into_iter()
        .map(|(key, pool)| {
            json!({
                "policy": key.policy,
                "user": key.user,
                "task": key.task,
                "examples": pool.len(),
                "warm": warmup.is_some_and(|w| pool.len() >= w),
                "indexed": pool.indexed(),
            })
        })
        .collect();
    json_response(
        200,
        &json!({
            "pools": list,
            "warmup": warmup,
            "stored_in": runtime.knn.store().map_or("memory", |s| s.backend()),
        }),
    )
}
