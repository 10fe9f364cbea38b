//! The config through the admin API: the whole document, one section at a time, a reload, a
//! chain's order by a preset.
//!
//! Bodies are JSON in the config's own shape: a policy is its object, `rules` their array, a
//! chain its array of model names, a config the whole document. A section PUT changes that one
//! key of the running document and validates the result whole, so its errors carry the full
//! key path (`policies.support.select[0].router: ...`); nothing else in the document changes.
//! Success is 200 with the new section (`{"generation": n}` for a whole config or a reload);
//! a refusal is 400 with every error, and nothing changes.

use std::sync::Arc;

use http::{Method, Response};
use pingora_core::protocols::http::ServerSession;
use serde_json::{json, Value};

use super::{error, read_body};
use crate::config::ConfigError;
use crate::reload::{Applied, ReloadError, Reloader};

/// `parts`: the path after `admin/` (`config`, `reload`, `policies/x`, `chains/x/sort/fastest`).
pub async fn handle(
    reloader: &Arc<Reloader>,
    session: &mut ServerSession,
    method: &Method,
    parts: &[&str],
) -> Response<Vec<u8>> {
    match (method, parts) {
        (&Method::GET, ["config"]) => super::json(200, &doc_json(&reloader.current().doc)),
        (&Method::PUT, ["config"]) => {
            let body = match body_json(session).await {
                Ok(v) => v,
                Err(r) => return r,
            };
            let doc = match to_yaml(&body) {
                Ok(d) => d,
                Err(r) => return r,
            };
            let reloader = reloader.clone();
            applied(
                run(move || reloader.replace(doc)).await,
                |a| json!({ "generation": a.generation, "needs_upgrade": a.needs_upgrade }),
            )
        }
        (&Method::POST, ["reload"]) => {
            let reloader = reloader.clone();
            applied(
                run(move || reloader.reload_file()).await,
                |a| json!({ "generation": a.generation, "needs_upgrade": a.needs_upgrade }),
            )
        }
        (&Method::GET, ["rules"]) => section(reloader, &["rules"]),
        (&Method::PUT, ["rules"]) => put_section(reloader, session, vec!["rules".into()]).await,
        (&Method::GET, ["policies", name]) => section(reloader, &["policies", name]),
        (&Method::PUT, ["policies", name]) => {
            put_section(reloader, session, vec!["policies".into(), (*name).into()]).await
        }
        (&Method::DELETE, ["policies", name]) => delete_policy(reloader, name).await,
        (&Method::GET, ["chains", name]) => section(reloader, &["chains", name]),
        (&Method::PUT, ["chains", name]) => {
            put_section(reloader, session, vec!["chains".into(), (*name).into()]).await
        }
        (&Method::POST, ["chains", name, "sort", preset]) => {
            sort_chain(reloader, name, preset).await
        }
        _ => error(
            405,
            "method_not_allowed",
            "this admin endpoint does not take this method",
        ),
    }
}

/// Run a blocking config change off the async workers (it resolves provider hosts).
pub(super) async fn run(
    f: impl FnOnce() -> Result<Applied, ReloadError> + Send + 'static,
) -> Result<Applied, ReloadError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ReloadError::Io(format!("the change did not run: {e}"))))
}

/// The answer to a change: 200 with `ok(applied)`, or the refusal.
pub(super) fn applied(
    outcome: Result<Applied, ReloadError>,
    ok: impl FnOnce(&Applied) -> Value,
) -> Response<Vec<u8>> {
    match outcome {
        Ok(a) => super::json(200, &ok(&a)),
        Err(ReloadError::Invalid(errs)) => {
            let list: Vec<Value> = errs
                .0
                .iter()
                .map(|e| json!({ "path": e.path, "message": e.message }))
                .collect();
            super::json(
                400,
                &json!({ "error": {
                    "message": format!("the config was refused; nothing changed: {errs}"),
                    "type": "invalid_request_error",
                    "code": "invalid_config",
                    "errors": list,
                }}),
            )
        }
        Err(ReloadError::Busy) => error(409, "busy", &ReloadError::Busy.summary()),
        Err(e @ ReloadError::Build(_)) => error(400, "invalid_config", &e.summary()),
        Err(e @ ReloadError::Io(_)) => error(500, "config_io", &e.summary()),
    }
}

/// The document as JSON (what `GET /admin/config` answers). Secrets are never in it: keys are
/// named by environment variable or file, never written inline.
fn doc_json(doc: &serde_yaml::Value) -> Value {
    let mut v = serde_json::to_value(doc).unwrap_or(Value::Null);
    redact_strings(&mut v);
    v
}

/// Every string of the document with its URLs redacted ([`crate::secret::redact_urls`]).
fn redact_strings(v: &mut Value) {
    match v {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(r) = crate::secret::redact_urls(s) {
                *s = r;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_strings),
        Value::Object(map) => map.values_mut().for_each(redact_strings),
        _ => {}
    }
}

fn to_yaml(v: &Value) -> Result<serde_yaml::Value, Response<Vec<u8>>> {
    serde_yaml::to_value(v)
        .map_err(|_| error(400, "invalid_request", "the body cannot be a config value"))
}

async fn body_json(session: &mut ServerSession) -> Result<Value, Response<Vec<u8>>> {
    let body = read_body(session).await?;
    serde_json::from_slice(&body)
        .map_err(|_| error(400, "invalid_request", "the body must be JSON"))
}

/// The value at `path` in the running document, or 404.
fn section(reloader: &Reloader, path: &[&str]) -> Response<Vec<u8>> {
    let loaded = reloader.current();
    let mut v = &loaded.doc;
    for key in path {
        match v.get(*key) {
            Some(next) => v = next,
            None if path.len() == 1 => return super::json(200, &json!([])),
            None => {
                return error(
                    404,
                    "not_found",
                    &format!("no {} named {:?}", singular(path[0]), path[path.len() - 1]),
                )
            }
        }
    }
    super::json(200, &doc_json(v))
}

fn singular(section: &str) -> &str {
    section.strip_suffix('s').unwrap_or(section)
}

/// Set the value at `path` to the body, validate the whole document, write it back, apply.
async fn put_section(
    reloader: &Arc<Reloader>,
    session: &mut ServerSession,
    path: Vec<String>,
) -> Response<Vec<u8>> {
    let body = match body_json(session).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let value = match to_yaml(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let r = reloader.clone();
    let key_path = path.join(".");
    let outcome = run(move || r.edit(move |doc| set(doc, &path, value))).await;
    applied(outcome, |_| {
        let loaded = reloader.current();
        let mut v = &loaded.doc;
        for key in key_path.split('.') {
            v = v.get(key).unwrap_or(&serde_yaml::Value::Null);
        }
        doc_json(v)
    })
}

/// `DELETE /admin/policies/{name}`: remove a policy no rule names. A rule whose `then` (or the
/// rule set's `default`) is the policy refuses it, 400 naming that rule; an unknown policy is
/// 404. The rest of the document is validated as for any change (another reference, such as a
/// chain member, is refused with its path) and written back.
async fn delete_policy(reloader: &Arc<Reloader>, name: &str) -> Response<Vec<u8>> {
    let present = reloader
        .current()
        .doc
        .get("policies")
        .and_then(|p| p.get(name))
        .is_some();
    if !present {
        return error(404, "not_found", &format!("no policy named {name:?}"));
    }
    let r = reloader.clone();
    let policy = name.to_string();
    let outcome = run(move || {
        r.edit(move |doc| {
            if let Some(path) = rule_naming(doc, &policy) {
                return Err(ConfigError::new(
                    path,
                    format!("names policy {policy:?}; change or remove that rule first"),
                ));
            }
            if let Some(policies) = doc.get_mut("policies").and_then(|p| p.as_mapping_mut()) {
                policies.remove(policy.as_str());
                if policies.is_empty() {
                    if let Some(d) = doc.as_mapping_mut() {
                        d.remove("policies");
                    }
                }
            }
            Ok(())
        })
    })
    .await;
    applied(
        outcome,
        |a| json!({ "deleted": name, "generation": a.generation }),
    )
}

/// The key path of the first rule that sends requests to `policy` (`rules[2].then`, or
/// `rules.default` for the long form's default), if any. Names compare as the config does.
fn rule_naming(doc: &serde_yaml::Value, policy: &str) -> Option<String> {
    let names = |v: Option<&serde_yaml::Value>| {
        v.and_then(serde_yaml::Value::as_str)
            .is_some_and(|t| t.eq_ignore_ascii_case(policy))
    };
    let rules = doc.get("rules")?;
    let (list, prefix) = match rules {
        serde_yaml::Value::Sequence(list) => (Some(list), "rules"),
        serde_yaml::Value::Mapping(m) => {
            if names(m.get("default")) {
                return Some("rules.default".to_string());
            }
            (
                m.get("rules").and_then(serde_yaml::Value::as_sequence),
                "rules.rules",
            )
        }
        _ => (None, "rules"),
    };
    list?
        .iter()
        .position(|rule| names(rule.get("then")))
        .map(|n| format!("{prefix}[{n}].then"))
}

/// Set `doc[path...] = value`, creating the section's mapping when it is missing.
fn set(
    doc: &mut serde_yaml::Value,
    path: &[String],
    value: serde_yaml::Value,
) -> Result<(), ConfigError> {
    let Some((last, parents)) = path.split_last() else {
        return Ok(());
    };
    let mut node = doc;
    for key in parents {
        let map = node
            .as_mapping_mut()
            .ok_or_else(|| ConfigError::new("", "the config is not a mapping"))?;
        node = map
            .entry(serde_yaml::Value::from(key.as_str()))
            .or_insert_with(|| serde_yaml::Value::Mapping(serde_yaml::Mapping::new()));
    }
    let map = node
        .as_mapping_mut()
        .ok_or_else(|| ConfigError::new(path.join("."), "this section is not a mapping"))?;
    map.insert(serde_yaml::Value::from(last.as_str()), value);
    Ok(())
}

/// `POST /admin/chains/{name}/sort/{smartest|fastest|budget}`: rewrite the chain's order —
/// capability tier first (`smartest`), measured time to first byte first, unmeasured last
/// (`fastest`), or the largest budget left this period first, models without a budget after
/// them cheapest first (`budget`: a model's deployments' budgets minus their spend). Only the
/// order changes (seed 000): no entry is switched on or off, and every catalog model the chain
/// does not name is written in after its own, switched as it was shown — off, or with
/// `backfill` its model's own state. A list whose entries all stay on stays a list; otherwise
/// the chain is written in its long form.
async fn sort_chain(reloader: &Arc<Reloader>, name: &str, preset: &str) -> Response<Vec<u8>> {
    if !matches!(preset, "smartest" | "fastest" | "budget") {
        return error(
            404,
            "not_found",
            "sort presets are smartest, fastest and budget",
        );
    }
    let loaded = reloader.current();
    let Some(chain) = loaded
        .config
        .chains
        .iter()
        .find(|c| c.name.eq_ignore_ascii_case(name))
    else {
        return error(404, "not_found", &format!("no chain named {name:?}"));
    };
    let Some(written) = loaded
        .doc
        .get("chains")
        .and_then(|c| c.get(chain.name.as_str()))
        .and_then(|c| c.get("models").unwrap_or(c).as_sequence())
        .cloned()
    else {
        return error(404, "not_found", &format!("no chain named {name:?}"));
    };
    let models = &loaded.config.models;
    // Each entry as (model, switched on, the name written): the chain's own, then the rest.
    let mut order: Vec<(usize, bool, String)> = chain
        .entries
        .iter()
        .zip(&written)
        .map(|(&(m, on), v)| {
            let name = v
                .as_str()
                .or_else(|| v.get("model").and_then(serde_yaml::Value::as_str))
                .map_or_else(|| models[m].name.clone(), str::to_string);
            (m, on, name)
        })
        .collect();
    for (m, model) in models.iter().enumerate() {
        if !chain.entries.iter().any(|(e, _)| *e == m) {
            order.push((m, chain.backfill && model.enabled, model.name.clone()));
        }
    }
    let tables = reloader.router().snapshot.load_full();
    let now = tables.health.now_ms();
    let key = |model: usize| -> (f64, f64, f64) {
        let m = &models[model];
        let deployments: Vec<_> = tables
            .catalog
            .models
            .iter()
            .find(|cm| *cm.name == m.name)
            .map(|cm| cm.deployments.clone())
            .unwrap_or_default();
        #[allow(clippy::cast_precision_loss)]
        let cost = || {
            deployments
                .iter()
                .map(|d| {
                    crate::routing::scoring::cost_micro(
                        tables.catalog.deployment(*d),
                        crate::routing::scoring::NOMINAL_INPUT_TOKENS,
                        crate::routing::scoring::NOMINAL_OUTPUT_TOKENS,
                    ) as f64
                })
                .fold(f64::INFINITY, f64::min)
        };
        match preset {
            "smartest" => (-f64::from(m.capability), 0.0, 0.0),
            "fastest" => {
                let ttfb = deployments
                    .iter()
                    .filter_map(|d| {
                        tables
                            .health
                            .deployment_view(&tables.catalog, *d, now)
                            .ttfb_ms
                    })
                    .fold(f64::INFINITY, f64::min);
                (ttfb, -f64::from(m.capability), 0.0)
            }
            _ => {
                let now_s = now / 1000;
                let budgets: Vec<f64> = deployments
                    .iter()
                    .map(|d| tables.catalog.deployment(*d))
                    .filter_map(|d| Some(d.spend.remaining_usd(d.budget.as_ref()?, now_s)))
                    .collect();
                if budgets.is_empty() {
                    (1.0, cost(), -f64::from(m.capability))
                } else {
                    (0.0, -budgets.iter().sum::<f64>(), -f64::from(m.capability))
                }
            }
        }
    };
    // Stable: equal keys keep the chain's order.
    order.sort_by(|(a, ..), (b, ..)| {
        let (ka, kb) = (key(*a), key(*b));
        ka.0.total_cmp(&kb.0)
            .then(ka.1.total_cmp(&kb.1))
            .then(ka.2.total_cmp(&kb.2))
    });
    let entry = |(_, on, name): (usize, bool, String)| {
        if on {
            serde_yaml::Value::from(name)
        } else {
            let mut m = serde_yaml::Mapping::new();
            m.insert("model".into(), name.into());
            m.insert("enabled".into(), false.into());
            serde_yaml::Value::Mapping(m)
        }
    };
    let sorted = if !chain.long && order.iter().all(|(_, on, _)| *on) {
        serde_yaml::Value::Sequence(order.into_iter().map(entry).collect())
    } else {
        let mut long = serde_yaml::Mapping::new();
        long.insert(
            "models".into(),
            serde_yaml::Value::Sequence(order.into_iter().map(entry).collect()),
        );
        long.insert("backfill".into(), chain.backfill.into());
        serde_yaml::Value::Mapping(long)
    };
    let path = vec!["chains".to_string(), chain.name.clone()];
    let r = reloader.clone();
    let outcome = run(move || r.edit(move |doc| set(doc, &path, sorted))).await;
    let chain_name = chain.name.clone();
    applied(outcome, |_| {
        let loaded = reloader.current();
        doc_json(
            loaded
                .doc
                .get("chains")
                .and_then(|c| c.get(chain_name.as_str()))
                .unwrap_or(&serde_yaml::Value::Null),
        )
    })
}
