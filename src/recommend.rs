//! Recommendations (DESIGN §10): `POST /v1/routing/recommend` with `{"candidates": [names],
//! "task": "<text>"}` asks the configured decision model (`recommend.decision_model`) which
//! candidate suits the task, and answers `{"model": <one of the candidates>, "reason": "..."}`.
//!
//! The caller is a caller like any other: its key is required when keys exist, and it may
//! only name candidates its `allowed_models` allow (403 `model_not_allowed`, naming nothing)
//! that exist (400 `model_not_found`). The question goes through the gateway's own listener
//! and plan (`crate::internal`) *as the caller's key*: the decision model's call is admitted
//! against that key's limits, and its ledger row and spend land on it.
//!
//! The answer is read for the first candidate name it contains (any letter case; where one
//! name starts another at the same place, the longer one). An answer naming none (or no
//! answer) is asked once more; then the first candidate is returned with `reason: "fallback"`.
//! Nothing here is cached: each call asks.

use std::time::Duration;

use bytes::Bytes;
use pingora_proxy::Session;
use serde::Deserialize;
use serde_json::json;

use crate::error::{ErrorCode, GatewayError};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::{access, body, respond};
use crate::snapshot::Runtime;

/// The endpoint's path on the proxy listener.
pub const PATH: &str = "/v1/routing/recommend";

/// The most candidates one request may name.
pub const MAX_CANDIDATES: usize = 32;
/// The largest request body read.
const MAX_BODY: usize = 256 * 1024;
/// The longest `reason` returned, in characters.
const MAX_REASON: usize = 500;
/// How long the decision model has for each of its (at most two) answers.
const DECISION_DEADLINE: Duration = Duration::from_secs(30);

/// What the caller sends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ask {
    #[serde(default)]
    candidates: Vec<String>,
    #[serde(default)]
    task: Option<String>,
}

/// Serve `POST /v1/routing/recommend` (its answer, or a refusal, is written here).
pub async fn serve(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
) -> pingora_error::Result<bool> {
    let answer = match recommend(session, ctx, runtime).await? {
        Ok(body) => body,
        Err(refusal) => {
            respond::write_error(session, ctx, refusal).await?;
            return Ok(true);
        }
    };
    respond::write_json(session, ctx, 200, answer, None).await?;
    Ok(true)
}

async fn recommend(
    session: &mut Session,
    ctx: &mut RequestCtx,
    runtime: &Runtime,
) -> pingora_error::Result<Result<Bytes, GatewayError>> {
    let snapshot = ctx.snapshot.clone();
    let Some(config) = &snapshot.recommend else {
        return Ok(Err(GatewayError::new(
            ErrorCode::NotFound,
            "no such endpoint; recommendations need a `recommend` section in the config",
        )));
    };
    if session.req_header().method != http::Method::POST {
        return Ok(Err(GatewayError::new(
            ErrorCode::MethodNotAllowed,
            "this endpoint takes POST",
        )));
    }
    if let Err(refusal) = access::authenticate(ctx, &snapshot, &session.req_header().headers) {
        session.set_keepalive(None);
        return Ok(Err(refusal));
    }
    let framing = body::framing(session);
    let read = tokio::time::timeout(
        snapshot.limits.body_timeout,
        body::read_whole_body(session, framing, MAX_BODY, false),
    )
    .await;
    let raw = match read {
        Ok(Ok(b)) => b.bytes,
        Ok(Err(body::BodyError::TooLarge)) => {
            session.set_keepalive(None);
            return Ok(Err(GatewayError::new(
                ErrorCode::RequestTooLarge,
                format!("a recommendation request is at most {MAX_BODY} bytes"),
            )));
        }
        Ok(Err(body::BodyError::Read(e))) => {
            session.set_keepalive(None);
            return crate::edge::body_refusal(e, snapshot.limits.body_timeout).map(Err);
        }
        Err(_) => {
            session.set_keepalive(None);
            return Ok(Err(crate::edge::body_timeout(snapshot.limits.body_timeout)));
        }
    };
    let ask = match parse(&raw) {
        Ok(ask) => ask,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let (candidates, task) = ask;
    let key = access::key(ctx, &snapshot);
    for (i, name) in candidates.iter().enumerate() {
        if crate::routing::resolve(&snapshot.table, name).is_err() {
            return Ok(Err(GatewayError::new(
                ErrorCode::ModelNotFound,
                format!("`candidates[{i}]` names no model"),
            )));
        }
        if key.is_some_and(|k| !k.allows(name)) {
            // Says only that it is not allowed: never whether the name exists.
            return Ok(Err(GatewayError::new(
                ErrorCode::ModelNotAllowed,
                "this API key may not use a model the candidates name",
            )));
        }
    }
    let on_behalf = key.map(|k| k.id.clone());
    let prompt = choice_prompt(&candidates);
    for _ in 0..2 {
        let answer = runtime
            .internal
            .chat(
                &config.decision_model,
                Some(&prompt),
                &task,
                on_behalf.as_deref(),
                DECISION_DEADLINE,
            )
            .await;
        let Ok(answer) = answer else {
            continue;
        };
        if let Some((model, at)) = pick(&answer, &candidates) {
            let reason = reason_after(&answer, at + model.len());
            let v = json!({ "model": model, "reason": reason });
            return Ok(Ok(Bytes::from(v.to_string())));
        }
    }
    let v = json!({ "model": candidates[0], "reason": "fallback" });
    Ok(Ok(Bytes::from(v.to_string())))
}

/// The caller's body: a non-empty list of at most [`MAX_CANDIDATES`] names and a task.
fn parse(raw: &[u8]) -> Result<(Vec<String>, String), GatewayError> {
    let ask: Ask = serde_json::from_slice(raw).map_err(|e| {
        let text = e.to_string();
        let why = text.split(" at line").next().unwrap_or("").to_string();
        GatewayError::new(
            ErrorCode::InvalidRequest,
            format!("the body must be {{\"candidates\": [names], \"task\": text}}: {why}"),
        )
    })?;
    let candidates: Vec<String> = ask
        .candidates
        .into_iter()
        .map(|c| c.trim().to_string())
        .collect();
    if candidates.is_empty() || candidates.iter().any(String::is_empty) {
        return Err(GatewayError::new(
            ErrorCode::CandidatesRequired,
            "`candidates` must list at least one model name",
        ));
    }
    if candidates.len() > MAX_CANDIDATES {
        return Err(GatewayError::new(
            ErrorCode::CandidatesRequired,
            format!("`candidates` lists at most {MAX_CANDIDATES} names"),
        ));
    }
    match ask.task {
        Some(task) if !task.trim().is_empty() => Ok((candidates, task)),
        _ => Err(GatewayError::new(
            ErrorCode::TaskRequired,
            "`task` must say what the model is for",
        )),
    }
}

/// The system message of the choice question.
fn choice_prompt(candidates: &[String]) -> String {
    let mut prompt =
        String::from("You choose which AI model should handle a task. The candidates are:\n");
    for c in candidates {
        prompt.push_str("- ");
        prompt.push_str(c);
        prompt.push('\n');
    }
    prompt.push_str(
        "The user message is the task. Answer with the name of exactly one candidate, as \
         written above, then one sentence on why.",
    );
    prompt
}

/// The candidate the answer names first (any ASCII letter case), and where; at one place, the
/// longest.
fn pick<'c>(answer: &str, candidates: &'c [String]) -> Option<(&'c str, usize)> {
    // ASCII case folding keeps every byte where it was, so `at` indexes `answer` too.
    let lower = answer.to_ascii_lowercase();
    let mut best: Option<(&'c str, usize)> = None;
    for c in candidates {
        let Some(at) = lower.find(&c.to_ascii_lowercase()) else {
            continue;
        };
        best = match best {
            Some((b, bat)) if bat < at || (bat == at && b.len() >= c.len()) => Some((b, bat)),
            _ => Some((c.as_str(), at)),
        };
    }
    best
}

/// The answer's words after the chosen name: its reason, trimmed of separators and bounded.
fn reason_after(answer: &str, end: usize) -> String {
    let rest = answer.get(end..).unwrap_or(answer);
    let rest = rest.trim_start_matches(|c: char| {
        c.is_whitespace() || matches!(c, ':' | '-' | '.' | ',' | '*' | '`' | '"' | '\'')
    });
    let rest = rest.trim();
    if rest.is_empty() {
        return "chosen by the decision model".to_string();
    }
    rest.chars().take(MAX_REASON).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn the_first_named_candidate_is_picked_in_any_case() {
        let c = names(&["gpt-4o", "gpt-4o-mini", "claude-haiku"]);
        assert_eq!(
            pick("I'd go with CLAUDE-HAIKU: cheap", &c),
            Some(("claude-haiku", 12))
        );
        // At one place the longer name wins; an earlier name beats a later one.
        assert_eq!(
            pick("gpt-4o-mini is enough", &c).map(|p| p.0),
            Some("gpt-4o-mini")
        );
        assert_eq!(
            pick("gpt-4o, not claude-haiku", &c).map(|p| p.0),
            Some("gpt-4o")
        );
        assert_eq!(pick("none of them", &c), None);
    }

    #[test]
    fn the_reason_is_what_follows_the_name() {
        assert_eq!(
            reason_after("gpt-4o: it reasons best.", 6),
            "it reasons best."
        );
        assert_eq!(reason_after("gpt-4o", 6), "chosen by the decision model");
    }

    #[test]
    fn bodies_are_checked_with_stable_codes() {
        let code = |raw: &str| parse(raw.as_bytes()).expect_err("refused").code;
        assert_eq!(code("not json"), ErrorCode::InvalidRequest);
        assert_eq!(
            code(r#"{"candidates":["a"],"task":"t","x":1}"#),
            ErrorCode::InvalidRequest
        );
        assert_eq!(code(r#"{"task":"t"}"#), ErrorCode::CandidatesRequired);
        assert_eq!(
            code(r#"{"candidates":[""],"task":"t"}"#),
            ErrorCode::CandidatesRequired
        );
        assert_eq!(code(r#"{"candidates":["a"]}"#), ErrorCode::TaskRequired);
        assert_eq!(
            code(r#"{"candidates":["a"],"task":"  "}"#),
            ErrorCode::TaskRequired
        );
        assert!(parse(br#"{"candidates":["a","b"],"task":"write SQL"}"#).is_ok());
    }
}
