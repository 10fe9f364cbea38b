//! `models`: the catalog entries callers name, each with its `deployments` (the ways to serve
//! it: a provider and the upstream model name it knows), ordering strategy and breaker
//! threshold.

use std::collections::BTreeMap;

use super::names::Namespace;
use super::providers::Providers;
use crate::config::defaults;
use crate::config::schema::{CapabilitySection, DeploymentSection, ModelSection};
use crate::config::types::{Capabilities, DeploymentConfig, ModelConfig, Price, Strategy};
use crate::config::values::is_upstream_model_name;
use crate::config::ConfigError;

/// Check every model, claiming its name in the shared model/alias namespace.
pub(super) fn validate_models(
    file: &BTreeMap<String, ModelSection>,
    providers: &Providers,
    names: &mut Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<ModelConfig> {
    if file.is_empty() {
        errs.push(ConfigError::new("models", "at least one model is required"));
    }
    let mut models = Vec::with_capacity(file.len());
    for (name, section) in file {
        let path = format!("models.{name}");
        names.add_model(name, models.len(), &path, errs);
        let model = validate_model(name, section, providers, &path, errs);
        models.push(model);
    }
    models
}

fn validate_model(
    name: &str,
    s: &ModelSection,
    providers: &Providers,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> ModelConfig {
    let capabilities = s.capabilities.as_ref().map(|list| {
        let mut capabilities = Capabilities::default();
        for c in list {
            match c {
                CapabilitySection::Stream => capabilities.stream = true,
                CapabilitySection::Tools => capabilities.tools = true,
                CapabilitySection::Vision => capabilities.vision = true,
                CapabilitySection::JsonMode => capabilities.json_mode = true,
            }
        }
        capabilities
    });
    if s.deployments.is_empty() {
        errs.push(ConfigError::new(
            format!("{path}.deployments"),
            "a model needs at least one deployment",
        ));
    }
    if s.context_window == Some(0) {
        errs.push(ConfigError::new(
            format!("{path}.context_window"),
            "must be positive",
        ));
    }
    let mut deployments: Vec<DeploymentConfig> = Vec::with_capacity(s.deployments.len());
    for (i, d) in s.deployments.iter().enumerate() {
        let dpath = format!("{path}.deployments[{i}]");
        if let Some(dep) = validate_deployment(d, providers, &dpath, errs) {
            if deployments
                .iter()
                .any(|o| o.provider == dep.provider && o.upstream_model == dep.upstream_model)
            {
                errs.push(ConfigError::new(
                    &dpath,
                    "the same provider and upstream model are listed twice",
                ));
            }
            deployments.push(dep);
        }
    }
    let strategy = match &s.strategy {
        None => defaults::STRATEGY,
        Some(name) => Strategy::parse(name).unwrap_or_else(|| {
            errs.push(ConfigError::new(
                format!("{path}.strategy"),
                format!("unknown strategy {name:?}; one of {}", strategy_names()),
            ));
            defaults::STRATEGY
        }),
    };
    if strategy == Strategy::Weighted
        && !deployments
            .iter()
            .any(|d| d.weight.is_some_and(|w| w > 0.0))
    {
        errs.push(ConfigError::new(
            format!("{path}.strategy"),
            "the weighted strategy needs at least one deployment with a positive weight",
        ));
    }
    if strategy == Strategy::Chain {
        errs.push(ConfigError::new(
            format!("{path}.strategy"),
            "`chain` orders chains; a model's deployments use priority or another strategy",
        ));
    }
    ModelConfig {
        name: name.to_string(),
        capability: s.capability,
        context_window: s.context_window,
        capabilities,
        deployments,
        enabled: s.enabled,
        strategy,
        // Every value is accepted: 0 switches this model's breaker off.
        failure_threshold: s.failure_threshold,
    }
}

/// The strategies that order a model's deployments (every one but `chain`), for messages.
pub(super) fn strategy_names() -> String {
    Strategy::ALL
        .iter()
        .filter(|s| **s != Strategy::Chain)
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn validate_deployment(
    d: &DeploymentSection,
    providers: &Providers,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<DeploymentConfig> {
    let provider = match providers.index.get(&d.provider) {
        Some(&p) => Some(p),
        None => {
            errs.push(ConfigError::new(
                format!("{path}.provider"),
                format!("{:?} is not a configured provider", d.provider),
            ));
            None
        }
    };
    if !is_upstream_model_name(&d.model) {
        errs.push(ConfigError::new(
            format!("{path}.model"),
            "upstream model names are 1-256 visible ASCII characters without quotes or backslashes",
        ));
    }
    let price = d.price.map(|p| Price {
        input_per_mtok: p.input_per_mtok,
        output_per_mtok: p.output_per_mtok,
        cached_input_per_mtok: p.cached_input_per_mtok,
    });
    if let Some(p) = price {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(p.input_per_mtok)
            || !ok(p.output_per_mtok)
            || !p.cached_input_per_mtok.is_none_or(ok)
        {
            errs.push(ConfigError::new(
                format!("{path}.price"),
                "prices must be finite and not negative",
            ));
        }
    }
    if let Some(w) = d.weight {
        if !w.is_finite() || w < 0.0 {
            errs.push(ConfigError::new(
                format!("{path}.weight"),
                "weights must be finite and not negative",
            ));
        }
    }
    if d.rpm == Some(0) {
        errs.push(ConfigError::new(format!("{path}.rpm"), "must be positive"));
    }
    if d.tpm == Some(0) {
        errs.push(ConfigError::new(format!("{path}.tpm"), "must be positive"));
    }
    let budget = d
        .budget
        .as_ref()
        .and_then(|b| super::keys::validate_budget(b, &format!("{path}.budget"), errs));
    let provider = provider?;
    Some(DeploymentConfig {
        provider,
        upstream_model: d.model.clone(),
        price,
        priority: d.priority.unwrap_or_else(|| {
            providers
                .list
                .get(provider)
                .map_or(defaults::PRIORITY, |p| p.priority)
        }),
        weight: d.weight,
        rpm: d.rpm,
        tpm: d.tpm,
        budget,
    })
}
