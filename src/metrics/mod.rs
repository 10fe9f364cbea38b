//! Every Prometheus metric signalbox exports, and the label values they may carry.
//!
//! Labels are bounded by construction: routes and providers come from the config, outcomes
//! and reasons are `&'static str` enums below. No label ever holds a raw client string, an
//! upstream message, a base URL or a key.
//!
//! The request path never takes a lock to count. `prometheus`' labelled vectors look children
//! up under a lock, so the multi-label counters here are [`DenseCounters`]: one `AtomicU64`
//! per label combination, indexed by the dense indices the routing tables already carry, and
//! exported by a custom collector at scrape time. Histograms are resolved per provider once,
//! when a routing snapshot is built ([`ProviderMetrics`]), and observed lock-free.
//!
//! Metrics (all prefixed `signalbox_`):
//! - `requests_total{route, provider, status_class}`: requests answered; provider `none` when
//!   no upstream served the answer.
//! - `attempts_total{provider, outcome}`: upstream calls and how each ended ([`Outcome`]).
//! - `failovers_total{provider, reason}`: moves to the next candidate, by the failed provider.
//! - `upstream_latency_seconds{provider}` / `upstream_ttfb_seconds{provider}`: per attempt that
//!   produced a response header; latency runs to the end of the response body.
//! - `requests_in_flight`: requests being handled.
//! - `config_generation`: the routing snapshot generation serving traffic.
//! - `config_reloads_total{result}`: config changes applied (`ok`) or refused (`rejected`).
//! - `http_refusals_total{code}`: requests refused as HTTP signalbox will not read (a bad
//!   head, framing or transfer coding: `code` is the answer's error code; `none` when the
//!   connection closed without one). Not requests: they are never in `requests_total`.
//! - `hedges_total{outcome}`: hedged first tokens (DESIGN §5), by which attempt served:
//!   `won` (the hedge), `lost` (the first attempt, or neither).
//! - `guardrail_checks_total{profile, result}`: guardrail checks run (DESIGN §10), by profile
//!   (a config name) and result: `flagged`, `passed`, `unavailable`.
//! - `knn_decisions_total{policy, outcome}`: knn router decisions (DESIGN §10), by policy
//!   (a config name) and outcome: `knn`, `cold`, `embed_failed`, `low_confidence`, `sticky`,
//!   `router_off`.
//! - `rule_matches_total{rule}`: requests a conditional rule sent (`rule:<n>`).
//! - `policy_selections_total{policy, entry}`: the `select` entry that held (`none`: no entry
//!   held and the policy's `on_failure` models served).
//! - `skipped_candidates_total{reason}`: candidates passed over without a call.
//! - `rate_limit_full_total{model}`: candidates skipped without a call because their
//!   deployment's `rpm` or `tpm` window was full (seed 004's spill-over), by catalog model.
//! - `tokens_total{provider, model, kind}`: tokens the serving provider reported in the
//!   response's `usage` (`kind`: `prompt`, `completion`, `cache_read`, `cache_write`; `model`
//!   is the catalog model, `direct` for a `<provider>/<name>` request); nothing when it
//!   reported none.
//! - `spend_usd_total{provider, model}`: what the answers cost (usage × the deployment's
//!   price).
//! - `key_tokens_total{key, kind}` / `key_spend_usd_total{key}`: the same by client key id,
//!   only with `metrics.per_key: true` (one series per key).
//!
//! The ledger's and the shared state's families (`ledger_*`, `state_*`) are registered by
//! their owners.
//!
//! Health's families (breaker states, ejections, probes, degraded mode) are read from the
//! registry at scrape time: [`health`].
//!
//! A dense counter family with no sample yet is still announced on `/metrics` by its `# HELP`
//! and `# TYPE` lines (the registry's gather drops empty families), so every family a
//! dashboard or an alert names is visible from the first scrape.

pub mod health;
pub mod ledger;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry,
};

use crate::attempt::Outcome;

/// The `code` labels of `http_refusals_total`.
pub const HTTP_REFUSAL_CODES: [&str; 7] = [
    "invalid_http",
    "request_headers_too_large",
    "uri_too_long",
    "unsupported_transfer_coding",
    "request_timeout",
    "method_not_allowed",
    "none",
];

/// Status classes of `requests_total{status_class}`; `none` when no response was written.
pub const STATUS_CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];

pub fn status_class_index(status: Option<u16>) -> usize {
    match status {
        Some(s @ 100..=599) => usize::from(s / 100),
        _ => 0,
    }
}

/// Kinds of `tokens_total{kind}`, in the order of the table's second dimension.
/// `cache_read` and `cache_write` are the parts of `prompt` served from or written to the
/// provider's prompt cache (where the provider reports them).
pub const TOKEN_KINDS: [&str; 4] = ["prompt", "completion", "cache_read", "cache_write"];
/// Index of `prompt` in [`TOKEN_KINDS`].
pub const TOKENS_PROMPT: usize = 0;
/// Index of `completion` in [`TOKEN_KINDS`].
pub const TOKENS_COMPLETION: usize = 1;
/// Index of `cache_read` in [`TOKEN_KINDS`].
pub const TOKENS_CACHE_READ: usize = 2;
/// Index of `cache_write` in [`TOKEN_KINDS`].
pub const TOKENS_CACHE_WRITE: usize = 3;

/// Label values of one dimension of a [`DenseCounters`] table.
pub type LabelValues = Arc<[Arc<str>]>;

/// A fixed-shape table of counters: one atomic per combination of label values.
#[derive(Debug)]
pub struct DenseTable {
    dims: Vec<LabelValues>,
    values: Vec<AtomicU64>,
}

impl DenseTable {
    fn new(dims: Vec<LabelValues>) -> Self {
        let size = dims.iter().map(|d| d.len()).product();
        Self {
            dims,
            values: (0..size).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn offset(&self, idx: &[usize]) -> Option<usize> {
        let mut off = 0;
        for (d, &i) in self.dims.iter().zip(idx) {
            if i >= d.len() {
                return None;
            }
            off = off * d.len() + i;
        }
        Some(off)
    }

    /// Add one. Out-of-range indices are ignored (they cannot happen with indices from the
    /// same snapshot; ignoring beats panicking on the request path).
    #[inline]
    pub fn inc(&self, idx: &[usize]) {
        self.add(idx, 1);
    }

    /// Add `n` (out-of-range indices are ignored, as for [`inc`](Self::inc)).
    #[inline]
    pub fn add(&self, idx: &[usize], n: u64) {
        if let Some(off) = self.offset(idx) {
            self.values[off].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(&self, idx: &[usize]) -> u64 {
        self.offset(idx)
            .map_or(0, |off| self.values[off].load(Ordering::Relaxed))
    }

    fn labels_of(&self, mut off: usize) -> Vec<&str> {
        let mut out = vec![""; self.dims.len()];
        for (slot, d) in out.iter_mut().zip(self.dims.iter()).rev() {
            *slot = &d[off % d.len()];
            off /= d.len();
        }
        out
    }
}

/// A counter family backed by a [`DenseTable`], replaceable when the routing snapshot's
/// label sets change (values carry over by label values).
pub struct DenseCounters {
    desc: Desc,
    label_names: Vec<&'static str>,
    table: ArcSwap<DenseTable>,
    /// Exported value per count (micro-USD counted, USD exported: 1e-6).
    scale: f64,
}

impl DenseCounters {
    fn new(name: &str, help: &str, label_names: &[&'static str]) -> prometheus::Result<Self> {
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            label_names.iter().map(ToString::to_string).collect(),
            Default::default(),
        )?;
        let dims = label_names
            .iter()
            .map(|_| LabelValues::from(Vec::<Arc<str>>::new()))
            .collect();
        Ok(Self {
            desc,
            label_names: label_names.to_vec(),
            table: ArcSwap::from_pointee(DenseTable::new(dims)),
            scale: 1.0,
        })
    }

    /// A family whose counts are exported times `scale`.
    fn scaled(mut self, scale: f64) -> Self {
        self.scale = scale;
        self
    }

    /// Install a table with new label values, carrying counts over by label values.
    pub fn rebind(&self, dims: Vec<LabelValues>) -> Arc<DenseTable> {
        let new = DenseTable::new(dims);
        let old = self.table.load();
        for (off, v) in old.values.iter().enumerate() {
            let n = v.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let labels = old.labels_of(off);
            let idx: Option<Vec<usize>> = new
                .dims
                .iter()
                .zip(&labels)
                .map(|(d, l)| d.iter().position(|x| &**x == *l))
                .collect();
            if let Some(off) = idx.and_then(|idx| new.offset(&idx)) {
                new.values[off].store(n, Ordering::Relaxed);
            }
        }
        let new = Arc::new(new);
        self.table.store(new.clone());
        new
    }
}

impl Collector for DenseCounters {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let table = self.table.load();
        let mut mf = MetricFamily::default();
        mf.set_name(self.desc.fq_name.clone());
        mf.set_help(self.desc.help.clone());
        mf.set_field_type(MetricType::COUNTER);
        let mut metrics = Vec::new();
        for (off, v) in table.values.iter().enumerate() {
            let n = v.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let mut m = Metric::default();
            let labels = table.labels_of(off);
            let pairs = self
                .label_names
                .iter()
                .zip(labels)
                .map(|(name, value)| {
                    let mut lp = LabelPair::default();
                    lp.set_name((*name).to_string());
                    lp.set_value(value.to_string());
                    lp
                })
                .collect::<Vec<_>>();
            m.set_label(pairs);
            let mut c = Counter::default();
            #[allow(clippy::cast_precision_loss)]
            c.set_value(n as f64 * self.scale);
            m.set_counter(c);
            metrics.push(m);
        }
        mf.set_metric(metrics);
        vec![mf]
    }
}

/// Histograms of one provider, resolved once per snapshot.
#[derive(Debug, Clone)]
pub struct ProviderMetrics {
    pub latency: Histogram,
    pub ttfb: Histogram,
}

/// The label values a routing snapshot binds: all from the config or fixed lists.
#[derive(Debug, Clone, Default)]
pub struct RoutingLabels {
    /// Distinct route labels (`model:m`, `policy:p`, ...).
    pub routes: Vec<Arc<str>>,
    pub providers: Vec<Arc<str>>,
    /// `rule:<n>` of every rule.
    pub rules: Vec<Arc<str>>,
    /// Policy names.
    pub policies: Vec<Arc<str>>,
    /// The most `select` entries a policy has.
    pub entries: usize,
    /// The reasons a candidate can be skipped for.
    pub skip_reasons: Vec<Arc<str>>,
    /// Catalog model names (`tokens_total`, `spend_usd_total`); `direct` is added after them.
    pub models: Vec<Arc<str>>,
    /// Client key ids, only with `metrics.per_key` (empty otherwise: no per-key series).
    pub keys: Vec<Arc<str>>,
}

/// Per-snapshot handles: what the request path touches.
#[derive(Debug, Clone)]
pub struct BoundMetrics {
    /// `[route, provider, status_class]`; provider index `providers.len()` is `none`.
    pub requests: Arc<DenseTable>,
    /// `[provider, outcome]`.
    pub attempts: Arc<DenseTable>,
    /// `[provider, reason]` where reason is an [`Outcome`].
    pub failovers: Arc<DenseTable>,
    /// `[rule]`.
    pub rule_matches: Arc<DenseTable>,
    /// `[policy, entry]`; entry index `entries` is `none`.
    pub policy_selections: Arc<DenseTable>,
    /// `[reason]`.
    pub skipped: Arc<DenseTable>,
    /// `[model]`: skips for a full rpm/tpm window.
    pub rate_limit_full: Arc<DenseTable>,
    /// `[provider, model, kind]`, kind indexed by [`TOKEN_KINDS`]; model index
    /// `models.len()` is `direct`.
    pub tokens: Arc<DenseTable>,
    /// `[provider, model]`, micro-USD.
    pub spend: Arc<DenseTable>,
    /// `[key, kind]` (empty without `metrics.per_key`).
    pub key_tokens: Arc<DenseTable>,
    /// `[key]`, micro-USD (empty without `metrics.per_key`).
    pub key_spend: Arc<DenseTable>,
    pub providers: Vec<ProviderMetrics>,
}

/// The metric families, registered once per process.
pub struct Metrics {
    registry: Registry,
    requests: Arc<DenseCounters>,
    attempts: Arc<DenseCounters>,
    failovers: Arc<DenseCounters>,
    rule_matches: Arc<DenseCounters>,
    policy_selections: Arc<DenseCounters>,
    skipped: Arc<DenseCounters>,
    rate_limit_full: Arc<DenseCounters>,
    tokens: Arc<DenseCounters>,
    spend: Arc<DenseCounters>,
    key_tokens: Arc<DenseCounters>,
    key_spend: Arc<DenseCounters>,
    latency: HistogramVec,
    ttfb: HistogramVec,
    pub in_flight: IntGauge,
    pub config_generation: IntGauge,
    /// `result` = `ok` | `rejected`. Not on the request path (a labelled vector is fine here).
    pub config_reloads: IntCounterVec,
    /// `code` = one of [`HTTP_REFUSAL_CODES`]. Counted only when a request is refused (never
    /// on an admitted request's path).
    pub http_refusals: IntCounterVec,
    /// `hedges_total{outcome="won"}` and `{outcome="lost"}`, resolved once (lock-free).
    pub hedges_won: IntCounter,
    pub hedges_lost: IntCounter,
    /// `profile` = a `guardrails.profiles` name, `result` = flagged | passed | unavailable.
    /// Resolved per profile when a snapshot is built (`crate::guardrails`), counted lock-free.
    pub guardrail_checks: IntCounterVec,
    /// `policy` = a policy with a knn entry, `outcome` = knn | cold | embed_failed |
    /// low_confidence | sticky | router_off. Resolved per policy when a snapshot is built
    /// (`crate::knn::Settings`), counted lock-free.
    pub knn_decisions: IntCounterVec,
    /// Probe results, counted by the prober and exported with the health families.
    pub probes: Arc<crate::health::probe::ProbeCounters>,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = Arc::new(DenseCounters::new(
            "signalbox_requests_total",
            "Requests answered, by route, serving provider and status class.",
            &["route", "provider", "status_class"],
        )?);
        let attempts = Arc::new(DenseCounters::new(
            "signalbox_attempts_total",
            "Upstream calls, by provider and outcome.",
            &["provider", "outcome"],
        )?);
        let failovers = Arc::new(DenseCounters::new(
            "signalbox_failovers_total",
            "Moves to the next candidate, by the provider that failed and why.",
            &["provider", "reason"],
        )?);
        let rule_matches = Arc::new(DenseCounters::new(
            "signalbox_rule_matches_total",
            "Requests for `auto` a conditional rule sent elsewhere, by rule.",
            &["rule"],
        )?);
        let policy_selections = Arc::new(DenseCounters::new(
            "signalbox_policy_selections_total",
            "Requests a policy served, by the select entry that held (none: on_failure only).",
            &["policy", "entry"],
        )?);
        let skipped = Arc::new(DenseCounters::new(
            "signalbox_skipped_candidates_total",
            "Candidates passed over without a call, by reason.",
            &["reason"],
        )?);
        let rate_limit_full = Arc::new(DenseCounters::new(
            "signalbox_rate_limit_full_total",
            "Candidates skipped without a call because their rpm or tpm window was full, by model.",
            &["model"],
        )?);
        let tokens = Arc::new(DenseCounters::new(
            "signalbox_tokens_total",
            "Tokens the serving provider reported in the response's usage, by provider, model and kind.",
            &["provider", "model", "kind"],
        )?);
        let spend = Arc::new(
            DenseCounters::new(
                "signalbox_spend_usd_total",
                "What answers cost (reported usage times the deployment's price), by provider and model.",
                &["provider", "model"],
            )?
            .scaled(1e-6),
        );
        let key_tokens = Arc::new(DenseCounters::new(
            "signalbox_key_tokens_total",
            "Tokens reported, by client key id and kind (metrics.per_key only).",
            &["key", "kind"],
        )?);
        let key_spend = Arc::new(
            DenseCounters::new(
                "signalbox_key_spend_usd_total",
                "What answers cost, by client key id (metrics.per_key only).",
                &["key"],
            )?
            .scaled(1e-6),
        );
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "signalbox_upstream_latency_seconds",
                "Upstream call duration, from sending the request to the end of the response.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["provider"],
        )?;
        let ttfb = HistogramVec::new(
            HistogramOpts::new(
                "signalbox_upstream_ttfb_seconds",
                "Time from sending the request upstream to the response header.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["provider"],
        )?;
        let in_flight = IntGauge::new(
            "signalbox_requests_in_flight",
            "Requests being handled right now.",
        )?;
        let config_generation = IntGauge::new(
            "signalbox_config_generation",
            "Generation of the routing snapshot serving traffic.",
        )?;
        registry.register(Box::new(ArcCollector(requests.clone())))?;
        registry.register(Box::new(ArcCollector(attempts.clone())))?;
        registry.register(Box::new(ArcCollector(failovers.clone())))?;
        registry.register(Box::new(ArcCollector(rule_matches.clone())))?;
        registry.register(Box::new(ArcCollector(policy_selections.clone())))?;
        registry.register(Box::new(ArcCollector(skipped.clone())))?;
        registry.register(Box::new(ArcCollector(rate_limit_full.clone())))?;
        registry.register(Box::new(ArcCollector(tokens.clone())))?;
        registry.register(Box::new(ArcCollector(spend.clone())))?;
        registry.register(Box::new(ArcCollector(key_tokens.clone())))?;
        registry.register(Box::new(ArcCollector(key_spend.clone())))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(ttfb.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(config_generation.clone()))?;
        let config_reloads = IntCounterVec::new(
            prometheus::Opts::new(
                "signalbox_config_reloads_total",
                "Config changes (file reloads and admin writes), by result: ok or rejected.",
            ),
            &["result"],
        )?;
        // Both series exist from the start, so a dashboard or alert sees zeros, not nothing.
        config_reloads.with_label_values(&["ok"]);
        config_reloads.with_label_values(&["rejected"]);
        registry.register(Box::new(config_reloads.clone()))?;
        let http_refusals = IntCounterVec::new(
            prometheus::Opts::new(
                "signalbox_http_refusals_total",
                "Requests refused as HTTP signalbox will not read, by the answer's error code.",
            ),
            &["code"],
        )?;
        // Every code's series from the start (zeros), as for the reloads.
        for code in HTTP_REFUSAL_CODES {
            http_refusals.with_label_values(&[code]);
        }
        registry.register(Box::new(http_refusals.clone()))?;
        let hedges = IntCounterVec::new(
            prometheus::Opts::new(
                "signalbox_hedges_total",
                "Hedged first tokens, by which attempt served: won (the hedge) or lost.",
            ),
            &["outcome"],
        )?;
        let hedges_won = hedges.with_label_values(&["won"]);
        let hedges_lost = hedges.with_label_values(&["lost"]);
        registry.register(Box::new(hedges))?;
        let guardrail_checks = IntCounterVec::new(
            prometheus::Opts::new(
                "signalbox_guardrail_checks_total",
                "Guardrail checks run, by profile and result: flagged, passed or unavailable.",
            ),
            &["profile", "result"],
        )?;
        registry.register(Box::new(guardrail_checks.clone()))?;
        let knn_decisions = IntCounterVec::new(
            prometheus::Opts::new(
                "signalbox_knn_decisions_total",
                "knn router decisions, by policy and outcome: knn, cold, embed_failed, low_confidence, sticky or router_off.",
            ),
            &["policy", "outcome"],
        )?;
        registry.register(Box::new(knn_decisions.clone()))?;
        Ok(Self {
            registry,
            requests,
            attempts,
            failovers,
            rule_matches,
            policy_selections,
            skipped,
            rate_limit_full,
            tokens,
            spend,
            key_tokens,
            key_spend,
            latency,
            ttfb,
            in_flight,
            config_generation,
            config_reloads,
            http_refusals,
            hedges_won,
            hedges_lost,
            guardrail_checks,
            knn_decisions,
            probes: Arc::default(),
        })
    }

    /// Register a collector that reads state at scrape time (health).
    pub fn register(&self, c: Box<dyn Collector>) -> prometheus::Result<()> {
        self.registry.register(c)
    }

    /// Resolve handles for a snapshot's label values.
    pub fn bind(&self, labels: &RoutingLabels) -> BoundMetrics {
        let providers = &labels.providers;
        let provider_values: LabelValues = providers.iter().cloned().collect();
        let mut with_none: Vec<Arc<str>> = providers.clone();
        with_none.push(Arc::from("none"));
        let with_none: LabelValues = with_none.into();
        let classes: LabelValues = STATUS_CLASSES.iter().map(|s| Arc::from(*s)).collect();
        let outcomes: LabelValues = Outcome::ALL.iter().map(|o| Arc::from(o.as_str())).collect();
        let routes: LabelValues = labels.routes.iter().cloned().collect();
        let mut entries: Vec<Arc<str>> = (0..labels.entries)
            .map(|i| Arc::from(itoa::Buffer::new().format(i)))
            .collect();
        entries.push(Arc::from("none"));
        let mut models: Vec<Arc<str>> = labels.models.clone();
        models.push(Arc::from("direct"));
        let models: LabelValues = models.into();
        let kinds: LabelValues = TOKEN_KINDS.iter().map(|k| Arc::from(*k)).collect();
        let keys: LabelValues = labels.keys.iter().cloned().collect();
        BoundMetrics {
            requests: self.requests.rebind(vec![routes, with_none, classes]),
            attempts: self
                .attempts
                .rebind(vec![provider_values.clone(), outcomes.clone()]),
            failovers: self
                .failovers
                .rebind(vec![provider_values.clone(), outcomes]),
            rule_matches: self
                .rule_matches
                .rebind(vec![labels.rules.iter().cloned().collect()]),
            policy_selections: self.policy_selections.rebind(vec![
                labels.policies.iter().cloned().collect(),
                entries.into(),
            ]),
            skipped: self
                .skipped
                .rebind(vec![labels.skip_reasons.iter().cloned().collect()]),
            rate_limit_full: self.rate_limit_full.rebind(vec![models.clone()]),
            tokens: self.tokens.rebind(vec![
                provider_values.clone(),
                models.clone(),
                kinds.clone(),
            ]),
            spend: self.spend.rebind(vec![provider_values.clone(), models]),
            key_tokens: self.key_tokens.rebind(vec![keys.clone(), kinds]),
            key_spend: self.key_spend.rebind(vec![keys]),
            providers: providers
                .iter()
                .map(|p| ProviderMetrics {
                    latency: self.latency.with_label_values(&[&**p]),
                    ttfb: self.ttfb.with_label_values(&[&**p]),
                })
                .collect(),
        }
    }

    /// The Prometheus text exposition of every family, sorted by name. A dense counter
    /// family without samples yet (the registry's gather drops it) is announced by its
    /// `# HELP` and `# TYPE` lines alone.
    pub fn render(&self) -> String {
        let families = self.registry.gather();
        let mut empty: Vec<&Desc> = self
            .dense()
            .into_iter()
            .map(|c| &c.desc)
            // Labelled by profile: without guardrails configured it has no series at all.
            .chain(self.guardrail_checks.desc())
            // Labelled by policy: without a knn entry it has no series at all.
            .chain(self.knn_decisions.desc())
            .filter(|d| !families.iter().any(|f| f.name() == d.fq_name))
            .collect();
        empty.sort_by(|a, b| a.fq_name.cmp(&b.fq_name));
        let encoder = prometheus::TextEncoder::new();
        let mut out = String::new();
        let mut empty = empty.into_iter().peekable();
        for mf in &families {
            while let Some(d) = empty.next_if(|d| d.fq_name.as_str() < mf.name()) {
                announce(&mut out, d);
            }
            if let Err(e) = encoder.encode_utf8(std::slice::from_ref(mf), &mut out) {
                tracing::warn!(error = %e, "metrics encoding failed");
            }
        }
        for d in empty {
            announce(&mut out, d);
        }
        out
    }

    fn dense(&self) -> [&DenseCounters; 11] {
        [
            &self.rate_limit_full,
            &self.spend,
            &self.key_tokens,
            &self.key_spend,
            &self.requests,
            &self.attempts,
            &self.failovers,
            &self.rule_matches,
            &self.policy_selections,
            &self.skipped,
            &self.tokens,
        ]
    }
}

/// `# HELP` and `# TYPE` of a counter family that has no sample yet (help escaped as the
/// exposition format wants: backslash and newline).
fn announce(out: &mut String, d: &Desc) {
    let help = d.help.replace('\\', r"\\").replace('\n', r"\n");
    let _ = writeln!(out, "# HELP {} {help}", d.fq_name);
    let _ = writeln!(out, "# TYPE {} counter", d.fq_name);
}

/// `Registry::register` wants an owned collector; ours are shared with the request path.
struct ArcCollector(Arc<DenseCounters>);

impl Collector for ArcCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }
    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(v: &[&str]) -> Vec<Arc<str>> {
        v.iter().map(|s| Arc::from(*s)).collect()
    }

    #[test]
    fn dense_counters_render_and_carry_over() {
        let m = Metrics::new().expect("metrics");
        let b = m.bind(&RoutingLabels {
            routes: labels(&["model:m", "chain:c"]),
            providers: labels(&["a", "b"]),
            ..RoutingLabels::default()
        });
        b.requests.inc(&[1, 0, 2]);
        b.requests.inc(&[1, 0, 2]);
        b.attempts.inc(&[1, Outcome::ServerError.index()]);
        let text = m.render();
        assert!(
            text.contains(
                r#"signalbox_requests_total{route="chain:c",provider="a",status_class="2xx"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"signalbox_attempts_total{provider="b",outcome="server_error"} 1"#));
        // A new snapshot with another provider order keeps the counts.
        let b2 = m.bind(&RoutingLabels {
            routes: labels(&["chain:c"]),
            providers: labels(&["b", "a"]),
            ..RoutingLabels::default()
        });
        assert_eq!(b2.requests.get(&[0, 1, 2]), 2);
        assert_eq!(b2.attempts.get(&[0, Outcome::ServerError.index()]), 1);
        // Out-of-range indices are ignored, not a panic.
        b2.requests.inc(&[9, 9, 9]);
    }

    #[test]
    fn empty_dense_families_are_announced_in_name_order() {
        let m = Metrics::new().expect("metrics");
        let b = m.bind(&RoutingLabels {
            routes: labels(&["model:m"]),
            providers: labels(&["a"]),
            ..RoutingLabels::default()
        });
        let text = m.render();
        for name in [
            "signalbox_requests_total",
            "signalbox_rule_matches_total",
            "signalbox_tokens_total",
        ] {
            assert!(text.contains(&format!("# TYPE {name} counter\n")), "{text}");
            assert!(text.contains(&format!("# HELP {name} ")), "{text}");
            assert!(!text.contains(&format!("{name}{{")), "{text}");
        }
        // Model index 0 of none is `direct`.
        b.tokens.add(&[0, 0, TOKENS_COMPLETION], 7);
        b.spend.add(&[0, 0], 1_500_000);
        let text = m.render();
        assert!(
            text.contains(
                r#"signalbox_tokens_total{provider="a",model="direct",kind="completion"} 7"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"signalbox_spend_usd_total{provider="a",model="direct"} 1.5"#),
            "micro-USD counted, USD exported: {text}"
        );
        // Families stay sorted by name, announced or not.
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "signalbox_tokens_total")
                .count(),
            1
        );
    }

    #[test]
    fn status_classes() {
        assert_eq!(STATUS_CLASSES[status_class_index(Some(503))], "5xx");
        assert_eq!(STATUS_CLASSES[status_class_index(Some(200))], "2xx");
        assert_eq!(STATUS_CLASSES[status_class_index(None)], "none");
    }
}
