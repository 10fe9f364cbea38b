//! `routing`: whether policies are resolved at all (`enabled`), and the knobs of the ranking
//! strategies (how often scored tables are rebuilt, sticky sessions, prefix affinity, the
//! `custom` blend).

use std::time::Duration;

use crate::config::schema::{RoutingSection, ScoringSection};
use crate::config::types::{RoutingKnobs, Scoring, Weights};
use crate::config::values::{parse_duration, positive_duration};
use crate::config::{defaults, ConfigError};

/// The largest `routing.rank_interval` accepted.
const RANK_INTERVAL_CEILING: Duration = Duration::from_secs(10);

pub(super) fn validate_routing(r: &RoutingSection, errs: &mut Vec<ConfigError>) -> RoutingKnobs {
    let rank_interval = positive_duration(&r.rank_interval, "routing.rank_interval", errs);
    if rank_interval > RANK_INTERVAL_CEILING {
        errs.push(ConfigError::new(
            "routing.rank_interval",
            "at most 10s: the scored tables must follow health closely",
        ));
    }
    if r.prefix_bytes == 0 {
        errs.push(ConfigError::new("routing.prefix_bytes", "must be positive"));
    }
    let custom_weights = match r.custom_weights {
        None => defaults::CUSTOM_WEIGHTS,
        Some(w) => {
            let parts = [w.reliability, w.speed, w.capability];
            if parts.iter().any(|v| !v.is_finite() || *v < 0.0) || parts.iter().sum::<f64>() <= 0.0
            {
                errs.push(ConfigError::new(
                    "routing.custom_weights",
                    "weights must be finite, not negative, and not all zero",
                ));
                defaults::CUSTOM_WEIGHTS
            } else {
                // Normalised to sum to one.
                let sum: f64 = parts.iter().sum();
                Weights {
                    reliability: w.reliability / sum,
                    speed: w.speed / sum,
                    capability: w.capability / sum,
                }
            }
        }
    };
    RoutingKnobs {
        policies: r.enabled,
        rank_interval,
        session_ttl: positive_duration(&r.session_ttl, "routing.session_ttl", errs),
        prefix_bytes: r.prefix_bytes.max(1),
        custom_weights,
        scoring: Scoring::default(),
    }
}

/// `scoring`: each multiplier's setting, in its range (a threshold below 1 so the factor has
/// room to fall; shares and factors between 0 and 1).
pub(super) fn validate_scoring(s: &ScoringSection, errs: &mut Vec<ConfigError>) -> Scoring {
    let mut out = Scoring::default();
    let mut share = |v: Option<f64>, key: &str, ok: fn(f64) -> bool, range: &str| -> Option<f64> {
        let v = v?;
        if v.is_finite() && ok(v) {
            Some(v)
        } else {
            errs.push(ConfigError::new(
                format!("scoring.{key}"),
                format!("must be {range}, found {v}"),
            ));
            None
        }
    };
    if let Some(v) = share(
        s.headroom_threshold,
        "headroom_threshold",
        |v| v > 0.0 && v < 1.0,
        "above 0 and below 1",
    ) {
        out.headroom_threshold = v;
    }
    if let Some(v) = share(
        s.headroom_floor,
        "headroom_floor",
        |v| (0.0..=1.0).contains(&v),
        "from 0 to 1",
    ) {
        out.headroom_floor = v;
    }
    if let Some(v) = share(
        s.rate_limit_penalty,
        "rate_limit_penalty",
        |v| (0.0..=1.0).contains(&v),
        "from 0 to 1",
    ) {
        out.rate_limit_penalty = v;
    }
    if let Some(text) = &s.rate_limit_decay {
        if let Some(d) = parse_duration(text, "scoring.rate_limit_decay", errs) {
            out.rate_limit_decay = d;
        }
    }
    out
}
