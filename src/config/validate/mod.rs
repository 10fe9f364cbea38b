//! From the file format ([`schema`](super::schema)) to checked values ([`Config`]).
//!
//! [`validate`] runs every section's check and never stops at the first problem: each error
//! is collected with the key path it concerns (`models.gpt-4o.deployments[1].provider`) so
//! `signalbox -t` can list them all, and a config with any error is refused as a whole.
//! Cross references (a deployment's provider, an alias's model, a chain's entries, what
//! policies and rules name) are resolved here into indices, so later layers never look a name
//! up twice; conditions are compiled here. Secrets are not read here: a config names where a
//! key lives, `catalog` reads it.
//!
//! One file per part of the config file:
//! - `providers.rs`: `providers.*` and their `credentials`;
//! - `models.rs`: `models.*` and their `deployments`;
//! - `names.rs`: the model/alias/policy namespace, `aliases`, `chains` and `active_chain`;
//! - `policies.rs`: `policies.*`, their `select` entries, routers and `on_failure`;
//! - `rules.rs`: `rules`, the conditions and targets of `auto`;
//! - `failover.rs`: `failover` and `limits`, the bounds on one request;
//! - `health.rs`: `health`, breakers, benching, probes and degraded mode;
//! - `routing.rs`: `routing`, the ranking knobs;
//! - `server.rs`: `listen` and `pingora`, the server process;
//! - `log.rs`: `log`, how signalbox writes its log;
//! - `keys.rs`: `keys`, who may call, what each key may use and spend, and how it is routed;
//! - `storage.rs`: `ledger`, `state` and `metrics`, where usage and shared counters live;
//! - `guardrails.rs`: `guardrails`, the profiles policies mandate, and `recommend`;
//! - `knn.rs`: `routing_knn`, the knn router's settings and its entries' prices.

mod admin;
mod failover;
mod guardrails;
pub(crate) mod headers;
mod health;
mod keys;
mod knn;
mod log;
mod models;
mod names;
mod policies;
mod providers;
mod routing;
mod rules;
mod server;
mod storage;

use super::schema::ConfigFile;
use super::types::Config;
use super::{ConfigError, ConfigErrors};

/// Turn a parsed file into a checked `Config`, or every error found.
pub fn validate(file: ConfigFile) -> Result<Config, ConfigErrors> {
    let mut errs: Vec<ConfigError> = Vec::new();

    let listen = server::validate_listen(&file.listen, &mut errs);
    let failover = failover::validate_failover(&file.failover, &mut errs);
    let limits = failover::validate_limits(&file.limits, &mut errs);
    let mut providers = providers::validate_providers(&file.providers, &failover, &mut errs);
    let global_budget = file
        .budgets
        .global
        .as_ref()
        .and_then(|b| keys::validate_budget(b, "budgets.global", &mut errs));
    let user_budgets = file
        .budgets
        .users
        .iter()
        .filter_map(|(user, b)| {
            keys::validate_budget(b, &format!("budgets.users.{user}"), &mut errs)
                .map(|b| (user.clone(), b))
        })
        .collect();
    if !file.budgets.users.is_empty() && file.keys.is_none() {
        errs.push(ConfigError::new(
            "budgets.users",
            "user budgets need client keys (a `keys` section with `user`s)",
        ));
    }
    for (id, b) in &file.budgets.providers {
        let path = format!("budgets.providers.{id}");
        let budget = keys::validate_budget(b, &path, &mut errs);
        match providers.list.iter_mut().find(|p| &p.id == id) {
            Some(p) => p.budget = budget,
            None => errs.push(ConfigError::new(path, format!("no provider {id:?}"))),
        }
    }

    let mut names = names::Namespace::default();
    let models = models::validate_models(&file.models, &providers, &mut names, &mut errs);
    let aliases = names::validate_aliases(&file.aliases, &mut names, &mut errs);
    let chains = names::validate_chains(&file.chains, &models, &mut names, &mut errs);
    let active_chain =
        names::validate_active_chain(file.active_chain.as_deref(), &chains, &mut errs);
    let policies =
        policies::validate_policies(&file.policies, &models, &failover, &mut names, &mut errs);
    let rules = rules::validate_rule_set(&file.rules, &chains, &names, &mut errs);
    let glob_aliases = names::validate_glob_aliases(&file.aliases, &names, &mut errs);
    let checks = super::types::ChecksConfig {
        guardrails: guardrails::validate_guardrails(
            file.guardrails.as_ref(),
            &file.policies,
            &providers.list,
            &names,
            &mut errs,
        ),
        recommend: guardrails::validate_recommend(file.recommend.as_ref(), &names, &mut errs),
        knn: knn::validate_knn(
            file.routing_knn.as_ref(),
            &file.policies,
            &policies,
            &models,
            &names,
            &mut errs,
        ),
    };

    server::validate_pingora(&file.pingora, &mut errs);
    let health = health::validate_health(&file.health, &mut errs);
    let mut routing = routing::validate_routing(&file.routing, &mut errs);
    routing.scoring = routing::validate_scoring(&file.scoring, &mut errs);
    let admin = admin::validate_admin(&file.admin, &mut errs);
    let log = log::validate_log(&file.log, &mut errs);
    let response = super::types::ResponseConfig {
        provider_field: file.response.provider_field,
        pass_headers: headers::validate_pass_headers(
            &file.response.pass_headers,
            "response.pass_headers",
            false,
            &mut errs,
        ),
    };
    let request = super::types::RequestConfig {
        pass_headers: headers::validate_pass_headers(
            &file.request.pass_headers,
            "request.pass_headers",
            true,
            &mut errs,
        ),
    };
    let keys = file
        .keys
        .as_ref()
        .map(|k| keys::validate_keys(k, &providers, &mut errs));
    let ledger = file
        .ledger
        .as_ref()
        .and_then(|l| storage::validate_ledger(l, &mut errs));
    let state = file
        .state
        .as_ref()
        .and_then(|s| storage::validate_state(s, &mut errs));

    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }
    Ok(Config {
        listen,
        providers: providers.list,
        models,
        aliases,
        glob_aliases,
        chains,
        active_chain,
        policies,
        rules: rules.rules,
        rules_enabled: rules.enabled,
        rules_default: rules.default,
        admin,
        failover,
        limits,
        health,
        routing,
        pingora: file.pingora,
        log,
        response,
        request,
        keys,
        global_budget,
        user_budgets,
        ledger,
        state,
        metrics_per_key: file.metrics.per_key,
        checks,
    })
}
