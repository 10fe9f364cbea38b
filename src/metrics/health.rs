//! Health as Prometheus metrics, read from the registry at scrape time (the request path
//! pays nothing for them).
//!
//! - `signalbox_breaker_state{provider, model, credential}`: 0 closed, 1 half-open, 2 open,
//!   3 benched, 4 credential cooling.
//! - `signalbox_target_health{provider, model, credential}`: share of traffic a target takes
//!   back after a restore (1 = full).
//! - `signalbox_ejections_total{provider, scope}`: `scope` is `target` or `credential`.
//! - `signalbox_benchings_total{provider}`.
//! - `signalbox_probes_total{result}`: `ok` or `failed`.
//! - `signalbox_degraded`, `signalbox_healthy_provider_ratio`.
//! - `signalbox_providers{state}`, `signalbox_models{state}`: how many are in each derived
//!   state (`healthy`, `degraded`, `unhealthy`, `disabled`; every state always exported).
//! - `signalbox_route_unservable{route}`: 1 while nothing can serve a route (no candidate's
//!   target closed: every request to it is a 503 or a probe), 0 otherwise. Unlike the ratio,
//!   evaluated whatever the number of providers, so it alerts for a one-provider gateway.
//!
//! Labels are config names (provider ids, upstream model names, credential ids), bounded by
//! the config.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::health::breaker::{BreakerState, FULL_HEALTH};
use crate::health::derived::{derived_states, DerivedState};
use crate::health::probe::{HealthSource, ProbeCounters};
use crate::health::{Admission, Unavailable};

/// One exported family: its name, help text and label names.
struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

const TARGET_LABELS: &[&str] = &["provider", "model", "credential"];

const BREAKER_STATE: Family = Family {
    name: "signalbox_breaker_state",
    help: "Target state: 0 closed, 1 half-open, 2 open, 3 benched, 4 credential cooling.",
    labels: TARGET_LABELS,
};
const TARGET_HEALTH: Family = Family {
    name: "signalbox_target_health",
    help: "Share of its traffic a target takes (1 = full; lower while it earns it back).",
    labels: TARGET_LABELS,
};
const EJECTIONS: Family = Family {
    name: "signalbox_ejections_total",
    help: "Ejections, by provider and scope (target or credential).",
    labels: &["provider", "scope"],
};
const BENCHINGS: Family = Family {
    name: "signalbox_benchings_total",
    help: "Models benched across every credential, by provider.",
    labels: &["provider"],
};
const PROBES: Family = Family {
    name: "signalbox_probes_total",
    help: "Active health probes, by result.",
    labels: &["result"],
};
const DEGRADED: Family = Family {
    name: "signalbox_degraded",
    help: "1 while degraded mode is on.",
    labels: &[],
};
const HEALTHY_RATIO: Family = Family {
    name: "signalbox_healthy_provider_ratio",
    help: "Share of providers with at least one usable target, at the last ranker pass.",
    labels: &[],
};

const PROVIDER_STATES: Family = Family {
    name: "signalbox_providers",
    help: "Providers in each derived state (healthy, degraded, unhealthy, disabled).",
    labels: &["state"],
};
const MODEL_STATES: Family = Family {
    name: "signalbox_models",
    help: "Models in each derived state (healthy, degraded, unhealthy, disabled).",
    labels: &["state"],
};

const FAMILIES: [&Family; 9] = [
    &PROVIDER_STATES,
    &MODEL_STATES,
    &BREAKER_STATE,
    &TARGET_HEALTH,
    &EJECTIONS,
    &BENCHINGS,
    &PROBES,
    &DEGRADED,
    &HEALTHY_RATIO,
];

impl Family {
    fn desc(&self) -> prometheus::Result<Desc> {
        Desc::new(
            self.name.to_string(),
            self.help.to_string(),
            self.labels.iter().map(ToString::to_string).collect(),
            Default::default(),
        )
    }

    fn gauge(&self, values: &[&str], v: f64) -> Metric {
        let mut m = Metric::default();
        m.set_label(labels(self.labels, values));
        let mut g = Gauge::default();
        g.set_value(v);
        m.set_gauge(g);
        m
    }

    #[allow(clippy::cast_precision_loss)]
    fn counter(&self, values: &[&str], v: u64) -> Metric {
        let mut m = Metric::default();
        m.set_label(labels(self.labels, values));
        let mut c = Counter::default();
        c.set_value(v as f64);
        m.set_counter(c);
        m
    }

    fn family(&self, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
        let mut f = MetricFamily::default();
        f.set_name(self.name.to_string());
        f.set_help(self.help.to_string());
        f.set_field_type(kind);
        f.set_metric(metrics);
        f
    }
}

/// Health, read at scrape time from the registry of the snapshot serving traffic.
pub struct HealthCollector {
    source: HealthSource,
    probes: Arc<ProbeCounters>,
    descs: Vec<Desc>,
}

impl HealthCollector {
    pub fn new(source: HealthSource, probes: Arc<ProbeCounters>) -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .map(|f| f.desc())
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(Self {
            source,
            probes,
            descs,
        })
    }
}

fn labels(names: &[&str], values: &[&str]) -> Vec<LabelPair> {
    names
        .iter()
        .zip(values)
        .map(|(n, v)| {
            let mut lp = LabelPair::default();
            lp.set_name((*n).to_string());
            lp.set_value((*v).to_string());
            lp
        })
        .collect()
}

impl Collector for HealthCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (catalog, reg) = (self.source)();
        let now = reg.now_ms();
        let mut states = Vec::new();
        let mut healths = Vec::new();
        for t in reg.targets_of(&catalog) {
            let Some(d) = t.deployment else { continue };
            let dep = catalog.deployment(d);
            let provider = catalog.provider(t.provider);
            let cred = &provider.credentials[t.credential];
            let values = [&*provider.id, &*dep.upstream_model, &*cred.id];
            let state = match reg.admission(t, now) {
                Admission::Healthy { .. } => 0.0,
                Admission::HalfOpen | Admission::No(Unavailable::ProbeBusy) => 1.0,
                Admission::No(Unavailable::Ejected(_)) => 2.0,
                Admission::No(Unavailable::Benched(_)) => 3.0,
                Admission::No(Unavailable::CredentialCooling(_)) => 4.0,
            };
            states.push(BREAKER_STATE.gauge(&values, state));
            if let Some(th) = reg.target(t) {
                let h = if th.state(now) == BreakerState::Closed {
                    f64::from(th.health()) / f64::from(FULL_HEALTH)
                } else {
                    0.0
                };
                healths.push(TARGET_HEALTH.gauge(&values, h));
            }
        }
        let mut ejections = Vec::new();
        let mut benchings = Vec::new();
        for p in &catalog.providers {
            let targets: u64 = reg
                .targets_of(&catalog)
                .filter(|t| t.provider == p.idx)
                .filter_map(|t| reg.target(t))
                .map(|th| th.ejections_total.load(Ordering::Relaxed))
                .sum();
            let creds: u64 = (0..p.credentials.len())
                .filter_map(|c| reg.credential(p.idx, c))
                .map(|c| c.ejections_total.load(Ordering::Relaxed))
                .sum();
            let benched: u64 = catalog
                .deployments
                .iter()
                .filter(|d| d.provider == p.idx)
                .filter_map(|d| reg.deployment(d.idx))
                .map(|d| d.benchings_total.load(Ordering::Relaxed))
                .sum();
            ejections.push(EJECTIONS.counter(&[&p.id, "target"], targets));
            ejections.push(EJECTIONS.counter(&[&p.id, "credential"], creds));
            benchings.push(BENCHINGS.counter(&[&p.id], benched));
        }
        let probes = vec![
            PROBES.counter(&["ok"], self.probes.ok.load(Ordering::Relaxed)),
            PROBES.counter(&["failed"], self.probes.failed.load(Ordering::Relaxed)),
        ];
        let degraded = reg.degraded();
        let active = if degraded.is_degraded() { 1.0 } else { 0.0 };
        let (provider_states, model_states) = derived_states(&catalog, &reg, now);
        #[allow(clippy::cast_precision_loss)]
        let per_state = |f: &Family, states: &[DerivedState]| {
            let metrics = DerivedState::ALL
                .iter()
                .map(|s| {
                    f.gauge(
                        &[s.as_str()],
                        states.iter().filter(|x| *x == s).count() as f64,
                    )
                })
                .collect();
            f.family(MetricType::GAUGE, metrics)
        };
        vec![
            per_state(&PROVIDER_STATES, &provider_states),
            per_state(&MODEL_STATES, &model_states),
            BREAKER_STATE.family(MetricType::GAUGE, states),
            TARGET_HEALTH.family(MetricType::GAUGE, healths),
            EJECTIONS.family(MetricType::COUNTER, ejections),
            BENCHINGS.family(MetricType::COUNTER, benchings),
            PROBES.family(MetricType::COUNTER, probes),
            DEGRADED.family(MetricType::GAUGE, vec![DEGRADED.gauge(&[], active)]),
            HEALTHY_RATIO.family(
                MetricType::GAUGE,
                vec![HEALTHY_RATIO.gauge(&[], degraded.last_ratio())],
            ),
        ]
    }
}

const ROUTE_UNSERVABLE: Family = Family {
    name: "signalbox_route_unservable",
    help: "1 while nothing can serve a route (no candidate's target closed), 0 otherwise.",
    labels: &["route"],
};

/// The routes of the snapshot serving traffic, each with whether nothing can serve it.
pub type RouteSource = Arc<dyn Fn() -> Vec<(Arc<str>, bool)> + Send + Sync>;

/// `signalbox_route_unservable`, read at scrape time.
pub struct RouteCollector {
    source: RouteSource,
    descs: Vec<Desc>,
}

impl RouteCollector {
    pub fn new(source: RouteSource) -> prometheus::Result<Self> {
        Ok(Self {
            source,
            descs: vec![ROUTE_UNSERVABLE.desc()?],
        })
    }
}

impl Collector for RouteCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let gauges = (self.source)()
            .iter()
            .map(|(route, unservable)| {
                ROUTE_UNSERVABLE.gauge(&[route], if *unservable { 1.0 } else { 0.0 })
            })
            .collect();
        vec![ROUTE_UNSERVABLE.family(MetricType::GAUGE, gauges)]
    }
}
