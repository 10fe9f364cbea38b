//! `ledger`, `state` and `metrics`: where usage is recorded, where counters are shared, and
//! what `/metrics` adds to its bounded defaults.

use super::admin::is_env_name;
use crate::config::schema::{LedgerSection, StateSection};
use crate::config::types::{LedgerConfig, LedgerStore, SharedLimits, StateConfig};
use crate::config::values::parse_duration;
use crate::config::ConfigError;

pub(super) fn validate_ledger(
    s: &LedgerSection,
    errs: &mut Vec<ConfigError>,
) -> Option<LedgerConfig> {
    let store = match (&s.sqlite, &s.postgres_url_env) {
        (Some(_), Some(_)) => {
            errs.push(ConfigError::new(
                "ledger",
                "set one of `sqlite` and `postgres_url_env`, not both",
            ));
            None
        }
        (None, None) => {
            errs.push(ConfigError::new(
                "ledger",
                "set `sqlite: <file>` (the embedded database) or `postgres_url_env: <NAME>`",
            ));
            None
        }
        (Some(path), None) if path.trim().is_empty() => {
            errs.push(ConfigError::new("ledger.sqlite", "a file path is required"));
            None
        }
        (Some(path), None) => Some(LedgerStore::Sqlite(path.into())),
        (None, Some(env)) if !is_env_name(env) => {
            errs.push(ConfigError::new(
                "ledger.postgres_url_env",
                format!("{env:?} is not an environment variable name"),
            ));
            None
        }
        (None, Some(env)) => Some(LedgerStore::PostgresEnv(env.clone())),
    };
    if s.queue == 0 {
        errs.push(ConfigError::new("ledger.queue", "must be positive"));
    }
    if s.batch == 0 {
        errs.push(ConfigError::new("ledger.batch", "must be positive"));
    }
    let flush_interval = parse_duration(&s.flush_interval, "ledger.flush_interval", errs);
    if flush_interval.is_some_and(|d| d.is_zero()) {
        errs.push(ConfigError::new(
            "ledger.flush_interval",
            "must be positive",
        ));
    }
    Some(LedgerConfig {
        store: store?,
        queue: s.queue,
        batch: s.batch,
        flush_interval: flush_interval?,
    })
}

pub(super) fn validate_state(s: &StateSection, errs: &mut Vec<ConfigError>) -> Option<StateConfig> {
    if !is_env_name(&s.redis_url_env) {
        errs.push(ConfigError::new(
            "state.redis_url_env",
            format!("{:?} is not an environment variable name", s.redis_url_env),
        ));
    }
    let sync_interval = parse_duration(&s.sync_interval, "state.sync_interval", errs);
    if sync_interval.is_some_and(|d| d.is_zero() || d.as_secs() >= 1) {
        // Cooldowns must reach every replica within a second (DESIGN §8).
        errs.push(ConfigError::new(
            "state.sync_interval",
            "must be above 0 and under 1s",
        ));
    }
    let timeout = parse_duration(&s.timeout, "state.timeout", errs);
    if timeout.is_some_and(|d| d.is_zero()) {
        errs.push(ConfigError::new("state.timeout", "must be positive"));
    }
    if s.key_prefix.len() > 64 || s.key_prefix.chars().any(|c| c.is_whitespace()) {
        errs.push(ConfigError::new(
            "state.key_prefix",
            "at most 64 characters, no whitespace",
        ));
    }
    let limits = match s.limits.as_deref() {
        None | Some("exact") => SharedLimits::Exact,
        Some("synced") => SharedLimits::Synced,
        Some(other) => {
            errs.push(ConfigError::new(
                "state.limits",
                format!("{other:?} is not one of exact, synced"),
            ));
            SharedLimits::Exact
        }
    };
    Some(StateConfig {
        redis_url_env: s.redis_url_env.clone(),
        sync_interval: sync_interval?,
        key_prefix: s.key_prefix.clone(),
        timeout: timeout?,
        limits,
    })
}
