//! `health`: what live traffic teaches about each target (one deployment on one credential):
//! the breaker that ejects a target after consecutive failures, the escalating cooldown,
//! benching a deployment that keeps failing, active probes of ejected targets, and degraded
//! mode. A model's own `failure_threshold` is read with the model (see `models`).

use std::time::Duration;

use crate::config::schema::HealthSection;
use crate::config::types::{DegradedPolicy, HealthPolicy};
use crate::config::values::{parse_duration, positive_duration};
use crate::config::{defaults, ConfigError};

use crate::config::types::BENCH_AFTER_CEILING;

pub(super) fn validate_health(h: &HealthSection, errs: &mut Vec<ConfigError>) -> HealthPolicy {
    // `failure_threshold` takes any value: 0 switches the breaker off.
    let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    // `restore_health: 0` means the default (seed 003), as an unset value would.
    if !unit(h.restore_health) {
        errs.push(ConfigError::new(
            "health.restore_health",
            "must be between 0 (the default, 0.5) and 1",
        ));
    }
    let restore_health = if h.restore_health == 0.0 {
        defaults::RESTORE_HEALTH
    } else {
        h.restore_health
    };
    if !unit(h.health_threshold) {
        errs.push(ConfigError::new(
            "health.health_threshold",
            "must be between 0 (off) and 1",
        ));
    }
    // `bench_after: 0` switches benching off.
    if h.bench_after > BENCH_AFTER_CEILING {
        errs.push(ConfigError::new(
            "health.bench_after",
            format!("must be between 0 (off) and {BENCH_AFTER_CEILING}"),
        ));
    }
    if !unit(h.degraded.healthy_ratio) {
        errs.push(ConfigError::new(
            "health.degraded.healthy_ratio",
            "must be between 0 and 1",
        ));
    }
    let max_ejection =
        parse_duration(&h.max_ejection, "health.max_ejection", errs).unwrap_or(Duration::ZERO);
    HealthPolicy {
        failure_threshold: h.failure_threshold,
        cooldown: positive_duration(&h.cooldown, "health.cooldown", errs),
        max_ejection: (!max_ejection.is_zero()).then_some(max_ejection),
        restore_health: restore_health.clamp(0.001, 1.0),
        health_threshold: h.health_threshold.clamp(0.0, 1.0),
        respect_retry_after: h.respect_retry_after,
        probe_interval: positive_duration(&h.probe_interval, "health.probe_interval", errs),
        bench_after: h.bench_after.min(BENCH_AFTER_CEILING),
        bench_window: positive_duration(&h.bench_window, "health.bench_window", errs),
        bench_for: positive_duration(&h.bench_for, "health.bench_for", errs),
        success_window: positive_duration(&h.success_window, "health.success_window", errs),
        degraded: DegradedPolicy {
            healthy_ratio: h.degraded.healthy_ratio.clamp(0.0, 1.0),
            min_providers: h.degraded.min_providers,
            entry_grace: parse_duration(
                &h.degraded.entry_grace,
                "health.degraded.entry_grace",
                errs,
            )
            .unwrap_or(defaults::ENTRY_GRACE),
            exit_grace: parse_duration(&h.degraded.exit_grace, "health.degraded.exit_grace", errs)
                .unwrap_or(defaults::EXIT_GRACE),
        },
    }
}
