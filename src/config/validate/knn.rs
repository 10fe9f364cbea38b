//! `routing_knn` (DESIGN §10): the knn router's settings, and what its entries need beyond
//! their own keys (`validate::policies` checks those: `targets`, `default`).
//!
//! - A `router: knn` entry needs the section (its `embedding_model` is required).
//! - `embedding_model` is a catalog model (or an alias of one): it is asked through the plan.
//! - `k` ≥ 1, `warmup` ≥ 1, `max_examples_per_pool` ≥ `warmup` (a pool must be able to warm up),
//!   `alpha` finite and not negative, `confidence_floor` in 0..=1, `granularity` `request` or
//!   `conversation`, `embed_timeout` a positive duration.
//! - Prices: the utility weighs each target's cost against the dearest's, and an unpriced
//!   deployment counts as free. A knn entry whose targets are partly priced would therefore
//!   always favour the unpriced ones, so it is refused: every target's deployments are priced,
//!   or none are (then the cost term is 0 and quality alone ranks).

use std::collections::BTreeMap;

use super::names::{Named, Namespace};
use crate::config::schema::{PolicySection, RouterKindSection, RoutingKnnSection};
use crate::config::types::{KnnConfig, KnnGranularity, ModelConfig, PolicyConfig, RouterConfig};
use crate::config::values::positive_duration;
use crate::config::{defaults, ConfigError};

/// The most neighbours a decision may consult.
pub const MAX_K: u64 = 100;
/// The largest pool bound accepted (the exact scan stops at 10,000; an ANN index serves past it).
pub const MAX_EXAMPLES_PER_POOL: u64 = 1_000_000;

/// Check `routing_knn` and the knn entries' needs; `None` when the section is absent (or
/// invalid: the errors say why).
pub(super) fn validate_knn(
    file: Option<&RoutingKnnSection>,
    sections: &BTreeMap<String, PolicySection>,
    policies: &[PolicyConfig],
    models: &[ModelConfig],
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> Option<KnnConfig> {
    if file.is_none() {
        for (name, p) in sections {
            for (i, e) in p.select.iter().enumerate() {
                if e.router == RouterKindSection::Knn {
                    errs.push(ConfigError::new(
                        format!("policies.{name}.select[{i}].router"),
                        "router knn needs the `routing_knn` section (at least its \
                         `embedding_model`)",
                    ));
                }
            }
        }
    }
    check_prices(policies, models, errs);
    let s = file?;
    let before = errs.len();
    let embedding_model = match names.lookup(&s.embedding_model) {
        Named::Model(m) => models.get(m).map(|m| m.name.clone()),
        Named::Policy => {
            errs.push(ConfigError::new(
                "routing_knn.embedding_model",
                format!(
                    "{:?} is a policy; the embedding model is a catalog model",
                    s.embedding_model
                ),
            ));
            None
        }
        Named::Nothing => {
            errs.push(ConfigError::new(
                "routing_knn.embedding_model",
                format!("{:?} is not a model or alias", s.embedding_model),
            ));
            None
        }
    };
    let mut count = |v: Option<u64>, key: &str, default: usize, min: u64, max: u64| -> usize {
        match v {
            None => default,
            Some(n) if (min..=max).contains(&n) => usize::try_from(n).unwrap_or(default),
            Some(_) => {
                errs.push(ConfigError::new(
                    format!("routing_knn.{key}"),
                    format!("must be between {min} and {max}"),
                ));
                default
            }
        }
    };
    let k = count(s.k, "k", defaults::KNN_K, 1, MAX_K);
    let warmup = count(
        s.warmup,
        "warmup",
        defaults::KNN_WARMUP,
        1,
        MAX_EXAMPLES_PER_POOL,
    );
    let max_examples_per_pool = count(
        s.max_examples_per_pool,
        "max_examples_per_pool",
        defaults::KNN_MAX_EXAMPLES_PER_POOL,
        1,
        MAX_EXAMPLES_PER_POOL,
    );
    if max_examples_per_pool < warmup {
        errs.push(ConfigError::new(
            "routing_knn.max_examples_per_pool",
            format!("{max_examples_per_pool} is below warmup ({warmup}): no pool could warm up"),
        ));
    }
    let alpha = s.alpha.unwrap_or(defaults::KNN_ALPHA);
    if !alpha.is_finite() || alpha < 0.0 {
        errs.push(ConfigError::new(
            "routing_knn.alpha",
            "must be a finite number, not negative",
        ));
    }
    let confidence_floor = s.confidence_floor.unwrap_or(defaults::KNN_CONFIDENCE_FLOOR);
    if !(0.0..=1.0).contains(&confidence_floor) {
        errs.push(ConfigError::new(
            "routing_knn.confidence_floor",
            "must be between 0 and 1",
        ));
    }
    let granularity = match s.granularity.as_deref() {
        None | Some("request") => KnnGranularity::Request,
        Some("conversation") => KnnGranularity::Conversation,
        Some(other) => {
            errs.push(ConfigError::new(
                "routing_knn.granularity",
                format!("unknown granularity {other:?}; one of request, conversation"),
            ));
            KnnGranularity::Request
        }
    };
    let embed_timeout = s
        .embed_timeout
        .as_deref()
        .map_or(defaults::KNN_EMBED_TIMEOUT, |t| {
            positive_duration(t, "routing_knn.embed_timeout", errs)
        });
    if errs.len() != before {
        return None;
    }
    Some(KnnConfig {
        embedding_model: embedding_model?,
        k,
        warmup,
        alpha,
        confidence_floor,
        granularity,
        max_examples_per_pool,
        embed_timeout,
    })
}

/// Every knn entry's targets are all priced or all unpriced (see the module doc).
fn check_prices(policies: &[PolicyConfig], models: &[ModelConfig], errs: &mut Vec<ConfigError>) {
    let priced = |m: usize| {
        models.get(m).map(|m| {
            (
                !m.deployments.is_empty() && m.deployments.iter().all(|d| d.price.is_some()),
                m.name.as_str(),
            )
        })
    };
    for p in policies {
        for (i, e) in p.select.iter().enumerate() {
            let RouterConfig::Knn { targets, .. } = &e.router else {
                continue;
            };
            let states: Vec<(bool, &str)> =
                targets.iter().filter_map(|t| priced(t.model)).collect();
            let unpriced: Vec<&str> = states.iter().filter(|s| !s.0).map(|s| s.1).collect();
            if !unpriced.is_empty() && unpriced.len() < states.len() {
                errs.push(ConfigError::new(
                    format!("policies.{}.select[{i}].targets", p.name),
                    format!(
                        "router knn weighs each target's price: price every deployment of {} \
                         too, or none of the targets (an unpriced deployment counts as free)",
                        unpriced.join(", ")
                    ),
                ));
            }
        }
    }
}
