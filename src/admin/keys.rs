//! Client keys created and revoked at runtime: `POST /admin/keys` makes a key, stores its
//! sha256 in the config (validated whole, written back, applied like a reload) and returns the
//! key itself once — it is not kept anywhere signalbox can show it again; `DELETE
//! /admin/keys/{id}` removes one. Creating the first key turns caller auth on for every request,
//! as a `keys` section in the file does.

use std::io::Read;
use std::sync::Arc;

use http::{Method, Response};
use pingora_core::protocols::http::ServerSession;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::config::{applied, run};
use super::{error, read_body};
use crate::config::ConfigError;
use crate::reload::Reloader;

/// Members a created key may carry: everything a `keys[]` entry has but its secret.
const ALLOWED: [&str; 7] = [
    "id",
    "user",
    "allowed_models",
    "rpm",
    "tpm",
    "budget",
    "routing",
];

/// `parts`: the path after `admin/` (`keys`, `keys/<id>`).
pub async fn handle(
    reloader: &Arc<Reloader>,
    session: &mut ServerSession,
    method: &Method,
    parts: &[&str],
) -> Response<Vec<u8>> {
    match (method, parts) {
        (&Method::POST, ["keys"]) => create(reloader, session).await,
        (&Method::DELETE, ["keys", id]) => revoke(reloader, id).await,
        _ => error(
            405,
            "method_not_allowed",
            "this admin endpoint does not take this method",
        ),
    }
}

/// A new key: `sk-sb-` and 48 hex digits from the operating system's random source.
fn new_key() -> std::io::Result<String> {
    let mut raw = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    Ok(format!("sk-sb-{}", hex::encode(raw)))
}

async fn create(reloader: &Arc<Reloader>, session: &mut ServerSession) -> Response<Vec<u8>> {
    let body = match read_body(session).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Ok(Value::Object(entry)) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "invalid_request", "the body must be a JSON object");
    };
    if let Some(k) = entry.keys().find(|k| !ALLOWED.contains(&k.as_str())) {
        return error(
            400,
            "invalid_request",
            &format!(
                "unknown key {k:?}: a created key takes id, user, allowed_models, rpm, tpm, budget, \
                 routing"
            ),
        );
    }
    let Some(id) = entry.get("id").and_then(Value::as_str).map(str::to_owned) else {
        return error(400, "invalid_request", "`id` is required");
    };
    let key = match new_key() {
        Ok(k) => k,
        Err(e) => return error(500, "internal_error", &format!("no random source: {e}")),
    };
    let mut entry = entry;
    entry.insert(
        "key_sha256".into(),
        Value::from(hex::encode(Sha256::digest(key.as_bytes()))),
    );
    let Ok(yaml_entry) = serde_yaml::to_value(Value::Object(entry)) else {
        return error(400, "invalid_request", "the body cannot be a config value");
    };
    let r = reloader.clone();
    let outcome = run(move || {
        r.edit(move |doc| {
            let keys = keys_of(doc)?;
            if keys
                .iter()
                .any(|k| k.get("id").and_then(serde_yaml::Value::as_str) == Some(id.as_str()))
            {
                return Err(ConfigError::new(
                    "keys",
                    format!("a key {id:?} exists already"),
                ));
            }
            keys.push(yaml_entry);
            Ok(())
        })
    })
    .await;
    // The key, once: only its digest is stored.
    applied(
        outcome,
        |a| json!({ "key": key, "generation": a.generation }),
    )
}

async fn revoke(reloader: &Arc<Reloader>, id: &str) -> Response<Vec<u8>> {
    let exists = reloader
        .current()
        .doc
        .get("keys")
        .and_then(serde_yaml::Value::as_sequence)
        .is_some_and(|ks| {
            ks.iter()
                .any(|k| k.get("id").and_then(serde_yaml::Value::as_str) == Some(id))
        });
    if !exists {
        return error(404, "not_found", "no client key has that id");
    }
    let (r, id) = (reloader.clone(), id.to_owned());
    let outcome = run(move || {
        r.edit(move |doc| {
            keys_of(doc)?
                .retain(|k| k.get("id").and_then(serde_yaml::Value::as_str) != Some(id.as_str()));
            Ok(())
        })
    })
    .await;
    applied(
        outcome,
        |a| json!({ "revoked": true, "generation": a.generation }),
    )
}

/// The document's `keys` sequence, created when absent.
fn keys_of(doc: &mut serde_yaml::Value) -> Result<&mut Vec<serde_yaml::Value>, ConfigError> {
    let map = doc
        .as_mapping_mut()
        .ok_or_else(|| ConfigError::new("", "the config is not a mapping"))?;
    let keys = map
        .entry(serde_yaml::Value::from("keys"))
        .or_insert_with(|| serde_yaml::Value::Sequence(Vec::new()));
    keys.as_sequence_mut()
        .ok_or_else(|| ConfigError::new("keys", "not a list"))
}
