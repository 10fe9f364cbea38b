//! From the file format (`schema`) to checked values (`Config`).
//!
//! Validation never stops at the first problem: every error is collected with the key path
//! it concerns (`models.gpt-4o.deployments[1].provider`) so `signalbox -t` can list them
//! all. Cross references (a deployment's provider, an alias's model, a chain's entries) are
//! resolved here into indices, so later layers never look a name up twice. Secrets are not
//! read here: a config names where a key lives, `catalog` reads it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::schema::{
    CapabilitySection, ConfigFile, CredentialSection, DeploymentSection, HealthSection,
    ModelSection, PingoraSection, ProviderKindSection, ProviderSection, RoutingSection, SizeValue,
};
use super::{ConfigError, ConfigErrors};

/// Axis names of `auto:<axis>`; a chain may not be named like one.
pub const AXIS_NAMES: &[&str] = &[
    "smart", "smartest", "fast", "fastest", "speed", "reliable", "balanced", "cheap", "cheapest",
    "budget",
];

/// Priority of a deployment when neither it nor its provider sets one.
pub const DEFAULT_PRIORITY: i32 = 10;

/// A validated configuration. Indices (`provider`, `model`) point into the vectors here.
#[derive(Debug)]
pub struct Config {
    pub listen: Listen,
    pub providers: Vec<ProviderConfig>,
    pub models: Vec<ModelConfig>,
    pub aliases: Vec<AliasConfig>,
    pub chains: Vec<ChainConfig>,
    pub active_chain: Option<usize>,
    pub failover: Failover,
    pub limits: Limits,
    pub health: HealthPolicy,
    pub routing: RoutingKnobs,
    pub pingora: PingoraSection,
}

/// How candidates are ordered. DESIGN §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A chain's configured order.
    Chain,
    Priority,
    PriorityCheapest,
    Cheapest,
    Fastest,
    /// `highest_availability` / `reliable`.
    Reliable,
    Balanced,
    Smartest,
    Custom,
    RoundRobin,
    Random,
    LeastInflight,
    P2cEwma,
    /// `weighted` / `canary`.
    Weighted,
    PrefixAffinity,
}

impl Strategy {
    pub const ALL: [Strategy; 15] = [
        Strategy::Chain,
        Strategy::Priority,
        Strategy::PriorityCheapest,
        Strategy::Cheapest,
        Strategy::Fastest,
        Strategy::Reliable,
        Strategy::Balanced,
        Strategy::Smartest,
        Strategy::Custom,
        Strategy::RoundRobin,
        Strategy::Random,
        Strategy::LeastInflight,
        Strategy::P2cEwma,
        Strategy::Weighted,
        Strategy::PrefixAffinity,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "chain" => Strategy::Chain,
            "priority" => Strategy::Priority,
            "priority_cheapest" => Strategy::PriorityCheapest,
            "cheapest" => Strategy::Cheapest,
            "fastest" | "latency" => Strategy::Fastest,
            "highest_availability" | "reliable" => Strategy::Reliable,
            "balanced" => Strategy::Balanced,
            "smartest" => Strategy::Smartest,
            "custom" => Strategy::Custom,
            "round_robin" => Strategy::RoundRobin,
            "random" => Strategy::Random,
            "least_inflight" => Strategy::LeastInflight,
            "p2c_ewma" => Strategy::P2cEwma,
            "weighted" | "canary" => Strategy::Weighted,
            "prefix_affinity" => Strategy::PrefixAffinity,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Chain => "chain",
            Strategy::Priority => "priority",
            Strategy::PriorityCheapest => "priority_cheapest",
            Strategy::Cheapest => "cheapest",
            Strategy::Fastest => "fastest",
            Strategy::Reliable => "reliable",
            Strategy::Balanced => "balanced",
            Strategy::Smartest => "smartest",
            Strategy::Custom => "custom",
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
            Strategy::LeastInflight => "least_inflight",
            Strategy::P2cEwma => "p2c_ewma",
            Strategy::Weighted => "weighted",
            Strategy::PrefixAffinity => "prefix_affinity",
        }
    }

    /// Strategies that pick the first candidate per request among equivalent ones.
    pub fn is_load_balancing(self) -> bool {
        matches!(
            self,
            Strategy::RoundRobin
                | Strategy::Random
                | Strategy::LeastInflight
                | Strategy::P2cEwma
                | Strategy::Weighted
                | Strategy::PrefixAffinity
        )
    }
}

/// Blend weights of the scored strategies (`w_r·reliability + w_s·speed + w_c·capability`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub reliability: f64,
    pub speed: f64,
    pub capability: f64,
}

impl Weights {
    pub const BALANCED: Weights = Weights {
        reliability: 0.5,
        speed: 0.25,
        capability: 0.25,
    };
    pub const SMARTEST: Weights = Weights {
        reliability: 0.2,
        speed: 0.1,
        capability: 0.7,
    };
}

/// Breakers, cooldowns, benching, probes and degraded mode (DESIGN §5).
#[derive(Debug, Clone, Copy)]
pub struct HealthPolicy {
    pub failure_threshold: u32,
    pub cooldown: Duration,
    /// `None` = uncapped.
    pub max_ejection: Option<Duration>,
    pub restore_health: f64,
    /// Success-rate floor; `0` = off.
    pub health_threshold: f64,
    pub respect_retry_after: bool,
    pub probe_interval: Duration,
    pub bench_after: u32,
    pub bench_window: Duration,
    pub bench_for: Duration,
    pub success_window: Duration,
    pub degraded: DegradedPolicy,
}

#[derive(Debug, Clone, Copy)]
pub struct DegradedPolicy {
    pub healthy_ratio: f64,
    pub min_providers: u32,
    pub entry_grace: Duration,
    pub exit_grace: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            cooldown: Duration::from_secs(30),
            max_ejection: Some(Duration::from_secs(300)),
            restore_health: 0.5,
            health_threshold: 0.0,
            respect_retry_after: true,
            probe_interval: Duration::from_secs(15),
            bench_after: 3,
            bench_window: Duration::from_secs(900),
            bench_for: Duration::from_secs(600),
            success_window: Duration::from_secs(60),
            degraded: DegradedPolicy {
                healthy_ratio: 0.5,
                min_providers: 3,
                entry_grace: Duration::from_secs(60),
                exit_grace: Duration::from_secs(120),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RoutingKnobs {
    pub rank_interval: Duration,
    pub session_ttl: Duration,
    pub prefix_bytes: usize,
    pub custom_weights: Weights,
}

impl Default for RoutingKnobs {
    fn default() -> Self {
        Self {
            rank_interval: Duration::from_millis(250),
            session_ttl: Duration::from_secs(600),
            prefix_bytes: 1024,
            custom_weights: Weights::BALANCED,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Listen {
    pub proxy: String,
    pub admin: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// A provider's base URL, split into what a connection and a request need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (`/v1`, or empty).
    pub path: String,
}

impl BaseUrl {
    /// `Host` header value: the port only when it is not the scheme's default.
    pub fn authority(&self) -> String {
        let default_port = match self.scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default_port {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

#[derive(Debug, Clone)]
pub enum KeySource {
    /// A keyless endpoint (local servers): no `Authorization` header is sent.
    None,
    Env(String),
    File(PathBuf),
}

#[derive(Debug, Clone)]
pub struct CredentialConfig {
    pub id: String,
    pub source: KeySource,
}

#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub id: String,
    pub kind: ProviderKind,
    pub base_url: BaseUrl,
    pub credentials: Vec<CredentialConfig>,
    pub priority: i32,
    pub ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
    pub ttfb_timeout: Duration,
    pub enabled: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub stream: bool,
    pub tools: bool,
    pub vision: bool,
    pub json_mode: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

#[derive(Debug, Clone)]
pub struct DeploymentConfig {
    pub provider: usize,
    pub upstream_model: String,
    pub price: Option<Price>,
    pub priority: i32,
    /// Normalised by the `weighted` strategy; `None` = only in the failure order.
    pub weight: Option<f64>,
    pub rpm: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: String,
    pub capability: u8,
    pub context_window: Option<u32>,
    pub capabilities: Capabilities,
    pub deployments: Vec<DeploymentConfig>,
    pub enabled: bool,
    pub strategy: Strategy,
}

#[derive(Debug, Clone)]
pub struct AliasConfig {
    pub name: String,
    pub model: usize,
}

#[derive(Debug, Clone)]
pub struct ChainConfig {
    pub name: String,
    pub models: Vec<usize>,
}

#[derive(Debug, Clone, Copy)]
pub struct Failover {
    pub max_attempts: u32,
    /// `None` when the deadline is disabled (`0`).
    pub deadline: Option<Duration>,
    pub ttfb_timeout: Duration,
    pub connect_timeout: Duration,
    /// Same-target retries after a transient failure (0 = off).
    pub transient_retries: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_body: usize,
    pub max_request_headers: usize,
}

/// The largest `failover.transient_retries` accepted: more only hammers a failing target.
const TRANSIENT_RETRIES_CEILING: u32 = 5;
/// The largest `failover.max_attempts` accepted: far beyond any useful plan.
const MAX_ATTEMPTS_CEILING: u32 = 100;

/// Turn a parsed file into a checked `Config`, or every error found.
pub fn validate(file: ConfigFile) -> Result<Config, ConfigErrors> {
    let mut errs = Vec::new();

    let listen = Listen {
        proxy: check_listen_addr(&file.listen.proxy, "listen.proxy", &mut errs),
        admin: check_listen_addr(&file.listen.admin, "listen.admin", &mut errs),
    };

    let failover = validate_failover(&file, &mut errs);
    let limits = validate_limits(&file, &mut errs);

    if file.providers.is_empty() {
        errs.push(ConfigError::new(
            "providers",
            "at least one provider is required",
        ));
    }
    let mut provider_index = HashMap::new();
    let mut providers = Vec::with_capacity(file.providers.len());
    for (id, section) in &file.providers {
        let path = format!("providers.{id}");
        if let Some(p) = validate_provider(id, section, &failover, &path, &mut errs) {
            provider_index.insert(id.clone(), providers.len());
            providers.push(p);
        }
    }

    if file.models.is_empty() {
        errs.push(ConfigError::new("models", "at least one model is required"));
    }
    // Models and aliases share one case-insensitive namespace.
    let mut names: HashMap<String, String> = HashMap::new();
    let mut model_index = HashMap::new();
    let mut models = Vec::with_capacity(file.models.len());
    for (name, section) in &file.models {
        let path = format!("models.{name}");
        check_catalog_name(name, &path, &mut errs);
        claim_name(&mut names, name, &path, &mut errs);
        let model = validate_model(name, section, &provider_index, &providers, &path, &mut errs);
        model_index.insert(name.to_ascii_lowercase(), models.len());
        models.push(model);
    }

    let mut aliases = Vec::with_capacity(file.aliases.len());
    for (name, target) in &file.aliases {
        let path = format!("aliases.{name}");
        check_catalog_name(name, &path, &mut errs);
        claim_name(&mut names, name, &path, &mut errs);
        match model_index.get(&target.to_ascii_lowercase()) {
            Some(&model) => aliases.push(AliasConfig {
                name: name.clone(),
                model,
            }),
            None => errs.push(ConfigError::new(
                &path,
                format!("alias target {target:?} is not a model (aliases name models, not other aliases)"),
            )),
        }
    }
    let alias_index: HashMap<String, usize> = aliases
        .iter()
        .map(|a| (a.name.to_ascii_lowercase(), a.model))
        .collect();

    let mut chains = Vec::with_capacity(file.chains.len());
    let mut chain_names: HashMap<String, usize> = HashMap::new();
    for (name, entries) in &file.chains {
        let path = format!("chains.{name}");
        check_chain_name(name, &path, &mut errs);
        if chain_names
            .insert(name.to_ascii_lowercase(), chains.len())
            .is_some()
        {
            errs.push(ConfigError::new(
                &path,
                "another chain has the same name (names are case-insensitive)",
            ));
        }
        let mut resolved = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let key = entry.to_ascii_lowercase();
            match model_index.get(&key).or_else(|| alias_index.get(&key)) {
                Some(&m) => {
                    if resolved.contains(&m) {
                        errs.push(ConfigError::new(
                            format!("{path}[{i}]"),
                            format!("{entry:?} is already in this chain"),
                        ));
                    } else {
                        resolved.push(m);
                    }
                }
                None => errs.push(ConfigError::new(
                    format!("{path}[{i}]"),
                    format!("{entry:?} is not a model or alias"),
                )),
            }
        }
        chains.push(ChainConfig {
            name: name.clone(),
            models: resolved,
        });
    }

    let active_chain = match &file.active_chain {
        Some(name) => match chain_names.get(&name.to_ascii_lowercase()) {
            Some(&c) => Some(c),
            None => {
                errs.push(ConfigError::new(
                    "active_chain",
                    format!("{name:?} is not a chain"),
                ));
                None
            }
        },
        None => None,
    };

    validate_pingora(&file.pingora, &mut errs);
    let health = validate_health(&file.health, &mut errs);
    let routing = validate_routing(&file.routing, &mut errs);

    if errs.is_empty() {
        Ok(Config {
            listen,
            providers,
            models,
            aliases,
            chains,
            active_chain,
            failover,
            limits,
            health,
            routing,
            pingora: file.pingora,
        })
    } else {
        Err(ConfigErrors(errs))
    }
}

fn validate_failover(file: &ConfigFile, errs: &mut Vec<ConfigError>) -> Failover {
    let f = &file.failover;
    if f.max_attempts == 0 || f.max_attempts > MAX_ATTEMPTS_CEILING {
        errs.push(ConfigError::new(
            "failover.max_attempts",
            format!("must be between 1 and {MAX_ATTEMPTS_CEILING}"),
        ));
    }
    if f.transient_retries > TRANSIENT_RETRIES_CEILING {
        errs.push(ConfigError::new(
            "failover.transient_retries",
            format!("must be between 0 and {TRANSIENT_RETRIES_CEILING}"),
        ));
    }
    let deadline = parse_duration(&f.deadline, "failover.deadline", errs);
    Failover {
        transient_retries: f.transient_retries.min(TRANSIENT_RETRIES_CEILING),
        max_attempts: f.max_attempts.clamp(1, MAX_ATTEMPTS_CEILING),
        deadline: deadline.filter(|d| !d.is_zero()),
        ttfb_timeout: positive_duration(&f.ttfb_timeout, "failover.ttfb_timeout", errs),
        connect_timeout: positive_duration(&f.connect_timeout, "failover.connect_timeout", errs),
    }
}

fn validate_limits(file: &ConfigFile, errs: &mut Vec<ConfigError>) -> Limits {
    let l = &file.limits;
    let body = parse_size(&l.max_request_body, "limits.max_request_body", errs);
    let headers = parse_size(&l.max_request_headers, "limits.max_request_headers", errs);
    // Bodies are held in memory per request: keep the ceiling sane.
    const BODY_CEILING: u64 = 1 << 30;
    if body == 0 || body > BODY_CEILING {
        errs.push(ConfigError::new(
            "limits.max_request_body",
            "must be between 1 byte and 1GiB",
        ));
    }
    if headers < 1024 {
        errs.push(ConfigError::new(
            "limits.max_request_headers",
            "must be at least 1KiB",
        ));
    }
    Limits {
        max_request_body: usize::try_from(body.min(BODY_CEILING)).unwrap_or(usize::MAX),
        max_request_headers: usize::try_from(headers).unwrap_or(usize::MAX),
    }
}

fn validate_provider(
    id: &str,
    s: &ProviderSection,
    failover: &Failover,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<ProviderConfig> {
    let before = errs.len();
    if !is_slug(id) {
        errs.push(ConfigError::new(
            path,
            "provider ids are 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter or digit",
        ));
    }
    let kind = match s.kind {
        ProviderKindSection::Openai => ProviderKind::OpenAi,
        ProviderKindSection::Anthropic => {
            errs.push(ConfigError::new(
                format!("{path}.kind"),
                "kind `anthropic` (the native Messages API) is not available in this version; \
                 reach Anthropic through its OpenAI-compatible endpoint with `kind: openai` and \
                 `base_url: https://api.anthropic.com/v1`",
            ));
            ProviderKind::OpenAi
        }
    };
    let base_url = parse_base_url(&s.base_url, &format!("{path}.base_url"), errs);
    let credentials = validate_credentials(&s.credentials, path, errs);
    if let Some(ca) = &s.ca_file {
        if base_url.as_ref().is_some_and(|u| u.scheme == Scheme::Http) {
            errs.push(ConfigError::new(
                format!("{path}.ca_file"),
                "ca_file needs an https base_url",
            ));
        }
        if !std::path::Path::new(ca).is_file() {
            errs.push(ConfigError::new(
                format!("{path}.ca_file"),
                format!("{ca:?} is not a readable file"),
            ));
        }
    }
    let connect_timeout = match &s.connect_timeout {
        Some(t) => positive_duration(t, &format!("{path}.connect_timeout"), errs),
        None => failover.connect_timeout,
    };
    let ttfb_timeout = match &s.ttfb_timeout {
        Some(t) => positive_duration(t, &format!("{path}.ttfb_timeout"), errs),
        None => failover.ttfb_timeout,
    };
    if errs.len() != before {
        return None;
    }
    Some(ProviderConfig {
        id: id.to_string(),
        kind,
        base_url: base_url?,
        credentials,
        priority: s.priority.unwrap_or(DEFAULT_PRIORITY),
        ca_file: s.ca_file.as_ref().map(PathBuf::from),
        connect_timeout,
        ttfb_timeout,
        enabled: s.enabled,
    })
}

fn validate_credentials(
    list: &[CredentialSection],
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Vec<CredentialConfig> {
    if list.is_empty() {
        // No credentials listed: a keyless endpoint (a local server).
        return vec![CredentialConfig {
            id: "none".to_string(),
            source: KeySource::None,
        }];
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        let cpath = format!("{path}.credentials[{i}]");
        if !is_slug(&c.id) {
            errs.push(ConfigError::new(
                format!("{cpath}.id"),
                "credential ids are 1-64 characters of a-z, 0-9, '-' and '_'",
            ));
        }
        if out.iter().any(|o: &CredentialConfig| o.id == c.id) {
            errs.push(ConfigError::new(
                format!("{cpath}.id"),
                format!("duplicate credential id {:?}", c.id),
            ));
        }
        let source = match (&c.key_env, &c.key_file) {
            (Some(_), Some(_)) => {
                errs.push(ConfigError::new(
                    &cpath,
                    "give key_env or key_file, not both",
                ));
                KeySource::None
            }
            (Some(env), None) => {
                if env.is_empty() || env.contains('=') || env.contains('\0') {
                    errs.push(ConfigError::new(
                        format!("{cpath}.key_env"),
                        "not a valid environment variable name",
                    ));
                }
                KeySource::Env(env.clone())
            }
            (None, Some(file)) => KeySource::File(PathBuf::from(file)),
            (None, None) => KeySource::None,
        };
        out.push(CredentialConfig {
            id: c.id.clone(),
            source,
        });
    }
    out
}

fn validate_model(
    name: &str,
    s: &ModelSection,
    provider_index: &HashMap<String, usize>,
    providers: &[ProviderConfig],
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> ModelConfig {
    let mut capabilities = Capabilities::default();
    for c in &s.capabilities {
        match c {
            CapabilitySection::Stream => capabilities.stream = true,
            CapabilitySection::Tools => capabilities.tools = true,
            CapabilitySection::Vision => capabilities.vision = true,
            CapabilitySection::JsonMode => capabilities.json_mode = true,
        }
    }
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
        if let Some(dep) = validate_deployment(d, provider_index, providers, &dpath, errs) {
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
        None => Strategy::PriorityCheapest,
        Some(name) => Strategy::parse(name).unwrap_or_else(|| {
            errs.push(ConfigError::new(
                format!("{path}.strategy"),
                format!("unknown strategy {name:?}; one of {}", strategy_names()),
            ));
            Strategy::PriorityCheapest
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
    }
}

fn strategy_names() -> String {
    Strategy::ALL
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn validate_deployment(
    d: &DeploymentSection,
    provider_index: &HashMap<String, usize>,
    providers: &[ProviderConfig],
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<DeploymentConfig> {
    let provider = match provider_index.get(&d.provider) {
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
    });
    if let Some(p) = price {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(p.input_per_mtok) || !ok(p.output_per_mtok) {
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
    let provider = provider?;
    Some(DeploymentConfig {
        provider,
        upstream_model: d.model.clone(),
        price,
        priority: d.priority.unwrap_or_else(|| {
            providers
                .get(provider)
                .map_or(DEFAULT_PRIORITY, |p| p.priority)
        }),
        weight: d.weight,
        rpm: d.rpm,
    })
}

fn validate_pingora(p: &PingoraSection, errs: &mut Vec<ConfigError>) {
    if p.threads == Some(0) {
        errs.push(ConfigError::new("pingora.threads", "must be at least 1"));
    }
    if p.listener_tasks_per_fd == Some(0) {
        errs.push(ConfigError::new(
            "pingora.listener_tasks_per_fd",
            "must be at least 1",
        ));
    }
    if let Some(ca) = &p.ca_file {
        if !std::path::Path::new(ca).is_file() {
            errs.push(ConfigError::new(
                "pingora.ca_file",
                format!("{ca:?} is not a readable file"),
            ));
        }
    }
}

fn validate_health(h: &HealthSection, errs: &mut Vec<ConfigError>) -> HealthPolicy {
    let d = HealthPolicy::default();
    if h.failure_threshold == 0 {
        errs.push(ConfigError::new(
            "health.failure_threshold",
            "must be at least 1",
        ));
    }
    let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    if !unit(h.restore_health) || h.restore_health == 0.0 {
        errs.push(ConfigError::new(
            "health.restore_health",
            "must be greater than 0 and at most 1",
        ));
    }
    if !unit(h.health_threshold) {
        errs.push(ConfigError::new(
            "health.health_threshold",
            "must be between 0 (off) and 1",
        ));
    }
    if h.bench_after == 0 || h.bench_after > 64 {
        errs.push(ConfigError::new(
            "health.bench_after",
            "must be between 1 and 64",
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
        failure_threshold: h.failure_threshold.max(1),
        cooldown: positive_duration(&h.cooldown, "health.cooldown", errs),
        max_ejection: (!max_ejection.is_zero()).then_some(max_ejection),
        restore_health: h.restore_health.clamp(0.001, 1.0),
        health_threshold: h.health_threshold.clamp(0.0, 1.0),
        respect_retry_after: h.respect_retry_after,
        probe_interval: positive_duration(&h.probe_interval, "health.probe_interval", errs),
        bench_after: h.bench_after.clamp(1, 64),
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
            .unwrap_or(d.degraded.entry_grace),
            exit_grace: parse_duration(&h.degraded.exit_grace, "health.degraded.exit_grace", errs)
                .unwrap_or(d.degraded.exit_grace),
        },
    }
}

fn validate_routing(r: &RoutingSection, errs: &mut Vec<ConfigError>) -> RoutingKnobs {
    let rank_interval = positive_duration(&r.rank_interval, "routing.rank_interval", errs);
    if rank_interval > Duration::from_secs(10) {
        errs.push(ConfigError::new(
            "routing.rank_interval",
            "at most 10s: the scored tables must follow health closely",
        ));
    }
    if r.prefix_bytes == 0 {
        errs.push(ConfigError::new("routing.prefix_bytes", "must be positive"));
    }
    let custom_weights = match r.custom_weights {
        None => Weights::BALANCED,
        Some(w) => {
            let parts = [w.reliability, w.speed, w.capability];
            if parts.iter().any(|v| !v.is_finite() || *v < 0.0) || parts.iter().sum::<f64>() <= 0.0
            {
                errs.push(ConfigError::new(
                    "routing.custom_weights",
                    "weights must be finite, not negative, and not all zero",
                ));
                Weights::BALANCED
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
        rank_interval,
        session_ttl: positive_duration(&r.session_ttl, "routing.session_ttl", errs),
        prefix_bytes: r.prefix_bytes.max(1),
        custom_weights,
    }
}

// === value parsers ===

fn check_listen_addr(addr: &str, path: &str, errs: &mut Vec<ConfigError>) -> String {
    if addr.parse::<std::net::SocketAddr>().is_err() {
        errs.push(ConfigError::new(
            path,
            format!("{addr:?} is not an IP:port address"),
        ));
    }
    addr.to_string()
}

/// Parse `http(s)://host[:port][/path]`.
pub fn parse_base_url(raw: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<BaseUrl> {
    let bad = |errs: &mut Vec<ConfigError>, why: &str| {
        errs.push(ConfigError::new(path, format!("{raw:?}: {why}")));
        None
    };
    let uri: http::Uri = match raw.parse() {
        Ok(u) => u,
        Err(_) => return bad(errs, "not a URL"),
    };
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return bad(errs, "the scheme must be http or https"),
    };
    let Some(authority) = uri.authority() else {
        return bad(errs, "no host");
    };
    if authority.as_str().contains('@') {
        return bad(
            errs,
            "credentials in the URL are not allowed (use credentials[])",
        );
    }
    if uri.query().is_some() {
        return bad(errs, "a query string is not allowed");
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return bad(errs, "no host");
    }
    let port = authority.port_u16().unwrap_or(match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    });
    Some(BaseUrl {
        scheme,
        host: host.to_ascii_lowercase(),
        port,
        path: uri.path().trim_end_matches('/').to_string(),
    })
}

fn parse_duration(raw: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<Duration> {
    if raw.trim() == "0" {
        return Some(Duration::ZERO);
    }
    match humantime::parse_duration(raw) {
        Ok(d) => Some(d),
        Err(e) => {
            errs.push(ConfigError::new(
                path,
                format!("{raw:?} is not a duration like 30s or 5m ({e})"),
            ));
            None
        }
    }
}

fn positive_duration(raw: &str, path: &str, errs: &mut Vec<ConfigError>) -> Duration {
    match parse_duration(raw, path, errs) {
        Some(d) if d.is_zero() => {
            errs.push(ConfigError::new(path, "must be greater than zero"));
            Duration::from_secs(1)
        }
        Some(d) => d,
        None => Duration::from_secs(1),
    }
}

/// Parse `16MiB`, `64KiB`, `1GB`, `512` (bytes).
pub fn parse_size_text(raw: &str) -> Option<u64> {
    let s = raw.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        _ => return None,
    };
    let v = num * mult;
    if v.is_finite() && (0.0..1.8e19).contains(&v) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(v as u64)
    } else {
        None
    }
}

fn parse_size(v: &SizeValue, path: &str, errs: &mut Vec<ConfigError>) -> u64 {
    match v {
        SizeValue::Bytes(b) => *b,
        SizeValue::Text(t) => parse_size_text(t).unwrap_or_else(|| {
            errs.push(ConfigError::new(
                path,
                format!("{t:?} is not a size like 16MiB or 65536"),
            ));
            0
        }),
    }
}

// === name rules ===

fn is_slug(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'))
        })
}

/// Upstream model names go into request bodies and response headers verbatim.
pub fn is_upstream_model_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

fn check_catalog_name(name: &str, path: &str, errs: &mut Vec<ConfigError>) {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b':');
    if !ok {
        errs.push(ConfigError::new(
            path,
            "names are 1-128 visible ASCII characters without ':', quotes or backslashes",
        ));
    }
    if name.eq_ignore_ascii_case("auto") {
        errs.push(ConfigError::new(
            path,
            "`auto` is reserved for the active chain",
        ));
    }
}

fn check_chain_name(name: &str, path: &str, errs: &mut Vec<ConfigError>) {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !ok {
        errs.push(ConfigError::new(
            path,
            "chain names are 1-64 characters of letters, digits, '-', '_' and '.'",
        ));
    }
    if AXIS_NAMES.iter().any(|a| a.eq_ignore_ascii_case(name)) {
        errs.push(ConfigError::new(
            path,
            format!("{name:?} is an auto:<axis> name and cannot name a chain"),
        ));
    }
}

fn claim_name(
    names: &mut HashMap<String, String>,
    name: &str,
    path: &str,
    errs: &mut Vec<ConfigError>,
) {
    if let Some(prev) = names.insert(name.to_ascii_lowercase(), path.to_string()) {
        errs.push(ConfigError::new(
            path,
            format!("the name is already used by {prev} (names are case-insensitive)"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_text("16MiB"), Some(16 * 1024 * 1024));
        assert_eq!(parse_size_text("64KiB"), Some(65536));
        assert_eq!(parse_size_text("1000"), Some(1000));
        assert_eq!(parse_size_text("2kb"), Some(2000));
        assert_eq!(parse_size_text("lots"), None);
        assert_eq!(parse_size_text("12parsecs"), None);
    }

    #[test]
    fn base_urls() {
        let mut errs = Vec::new();
        let u = parse_base_url("https://api.openai.com/v1/", "x", &mut errs);
        assert_eq!(
            u,
            Some(BaseUrl {
                scheme: Scheme::Https,
                host: "api.openai.com".into(),
                port: 443,
                path: "/v1".into()
            })
        );
        let u = parse_base_url("http://127.0.0.1:9001", "x", &mut errs).expect("valid");
        assert_eq!(u.port, 9001);
        assert_eq!(u.path, "");
        assert_eq!(u.authority(), "127.0.0.1:9001");
        assert!(errs.is_empty());
        assert!(parse_base_url("ftp://x", "x", &mut errs).is_none());
        assert!(parse_base_url("https://user:pw@x/v1", "x", &mut errs).is_none());
        assert!(parse_base_url("https://x/v1?a=b", "x", &mut errs).is_none());
        assert_eq!(errs.len(), 3);
    }

    #[test]
    fn slugs() {
        assert!(is_slug("openai"));
        assert!(is_slug("azure-eu_2"));
        assert!(!is_slug("OpenAI"));
        assert!(!is_slug("-x"));
        assert!(!is_slug(""));
    }
}
