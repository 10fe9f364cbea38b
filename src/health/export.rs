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
//!
//! Labels are config names (provider ids, upstream model names, credential ids), bounded by
//! the config.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::breaker::{BreakerState, FULL_HEALTH};
use super::probe::{CatalogSource, ProbeCounters};
use super::{Admission, HealthRegistry, Unavailable};

pub struct HealthCollector {
    registry: Arc<HealthRegistry>,
    catalog: CatalogSource,
    probes: Arc<ProbeCounters>,
    descs: Vec<Desc>,
}

const FAMILIES: &[(&str, &str, &[&str])] = &[
    (
        "signalbox_breaker_state",
        "Target state: 0 closed, 1 half-open, 2 open, 3 benched, 4 credential cooling.",
        &["provider", "model", "credential"],
    ),
    (
        "signalbox_target_health",
        "Share of its traffic a target takes (1 = full; lower while it earns it back).",
        &["provider", "model", "credential"],
    ),
    (
        "signalbox_ejections_total",
        "Ejections, by provider and scope (target or credential).",
        &["provider", "scope"],
    ),
    (
        "signalbox_benchings_total",
        "Models benched across every credential, by provider.",
        &["provider"],
    ),
    (
        "signalbox_probes_total",
        "Active health probes, by result.",
        &["result"],
    ),
    ("signalbox_degraded", "1 while degraded mode is on.", &[]),
    (
        "signalbox_healthy_provider_ratio",
        "Share of providers with at least one usable target, at the last ranker pass.",
        &[],
    ),
];

impl HealthCollector {
    pub fn new(
        registry: Arc<HealthRegistry>,
        catalog: CatalogSource,
        probes: Arc<ProbeCounters>,
    ) -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, labels)| {
                Desc::new(
                    (*name).to_string(),
                    (*help).to_string(),
                    labels.iter().map(ToString::to_string).collect(),
                    Default::default(),
                )
            })
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(Self {
            registry,
            catalog,
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

fn gauge(names: &[&str], values: &[&str], v: f64) -> Metric {
    let mut m = Metric::default();
    m.set_label(labels(names, values));
    let mut g = Gauge::default();
    g.set_value(v);
    m.set_gauge(g);
    m
}

#[allow(clippy::cast_precision_loss)]
fn counter(names: &[&str], values: &[&str], v: u64) -> Metric {
    let mut m = Metric::default();
    m.set_label(labels(names, values));
    let mut c = Counter::default();
    c.set_value(v as f64);
    m.set_counter(c);
    m
}

fn family(i: usize, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let (name, help, _) = FAMILIES[i];
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

impl Collector for HealthCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let catalog = (self.catalog)();
        let reg = &self.registry;
        let now = reg.now_ms();
        let target_labels = FAMILIES[0].2;
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
            states.push(gauge(target_labels, &values, state));
            if let Some(th) = reg.target(t) {
                let h = if th.state(now) == BreakerState::Closed {
                    f64::from(th.health()) / f64::from(FULL_HEALTH)
                } else {
                    0.0
                };
                healths.push(gauge(target_labels, &values, h));
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
            ejections.push(counter(FAMILIES[2].2, &[&p.id, "target"], targets));
            ejections.push(counter(FAMILIES[2].2, &[&p.id, "credential"], creds));
            benchings.push(counter(FAMILIES[3].2, &[&p.id], benched));
        }
        let probes = vec![
            counter(
                FAMILIES[4].2,
                &["ok"],
                self.probes.ok.load(Ordering::Relaxed),
            ),
            counter(
                FAMILIES[4].2,
                &["failed"],
                self.probes.failed.load(Ordering::Relaxed),
            ),
        ];
        let degraded = vec![gauge(
            &[],
            &[],
            if reg.degraded.is_degraded() { 1.0 } else { 0.0 },
        )];
        let ratio = vec![gauge(&[], &[], reg.degraded.last_ratio())];
        vec![
            family(0, MetricType::GAUGE, states),
            family(1, MetricType::GAUGE, healths),
            family(2, MetricType::COUNTER, ejections),
            family(3, MetricType::COUNTER, benchings),
            family(4, MetricType::COUNTER, probes),
            family(5, MetricType::GAUGE, degraded),
            family(6, MetricType::GAUGE, ratio),
        ]
    }
}
