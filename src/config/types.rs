//! The checked configuration: the values the rest of signalbox reads.
//!
//! Everything here has passed validation: names are resolved into indices (`provider`,
//! `model`) that point into [`Config`]'s vectors, durations and sizes are numbers, optional
//! keys are resolved to their effective value unless `None` itself means something (and then
//! the field says what). Nothing here is serde; the file format lives in
//! [`schema`](super::schema) and the checks that build these values in
//! [`validate`](super::validate). Default values come from [`defaults`].

use std::path::PathBuf;
use std::time::Duration;

use super::condition::Condition;
use super::defaults;
use super::schema::PingoraSection;
pub use super::vocab::{AskedStrategy, CredentialChoice, LogFormat, Strategy, Weights};
use crate::server_tls::ServerCert;

/// A validated configuration. Indices (`provider`, `model`) point into the vectors here.
#[derive(Debug)]
pub struct Config {
    pub listen: Listen,
    pub providers: Vec<ProviderConfig>,
    pub models: Vec<ModelConfig>,
    pub aliases: Vec<AliasConfig>,
    /// Glob aliases, in the order written (no two match one name).
    pub glob_aliases: Vec<GlobAlias>,
    pub chains: Vec<ChainConfig>,
    pub active_chain: Option<usize>,
    /// Named routing policies (`policies`), in name order.
    pub policies: Vec<PolicyConfig>,
    /// Conditional rules for `auto` (`rules`), in the order written.
    pub rules: Vec<RuleConfig>,
    /// The rule set's switches (its long form): off, the rules are validated but unused.
    pub rules_enabled: bool,
    /// Where a bare `auto` goes when no rule holds; `None`: the active chain.
    pub rules_default: Option<RuleTarget>,
    /// Who may use the admin API.
    pub admin: AdminConfig,
    pub failover: Failover,
    pub limits: Limits,
    pub health: HealthPolicy,
    pub routing: RoutingKnobs,
    pub pingora: PingoraSection,
    pub log: LogConfig,
    pub response: ResponseConfig,
    pub request: RequestConfig,
    /// Client keys; `None`: no caller auth.
    pub keys: Option<Vec<ClientKeyConfig>>,
    /// `budgets.global`: what the whole gateway may spend per period.
    pub global_budget: Option<BudgetConfig>,
    /// `budgets.users`: what each user (of the client keys) may spend per period.
    pub user_budgets: Vec<(String, BudgetConfig)>,
    /// `ledger`: where attempts are recorded; `None`: nowhere.
    pub ledger: Option<LedgerConfig>,
    /// `state`: counters shared on Redis; `None`: per instance.
    pub state: Option<StateConfig>,
    /// `metrics.per_key`: spend and tokens by client key id too.
    pub metrics_per_key: bool,
    /// `guardrails` and `recommend` (DESIGN §10); `None` each when not configured.
    pub checks: ChecksConfig,
}

/// Where the ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerStore {
    /// The embedded database at this path.
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL server whose URL is in this environment variable.
    PostgresEnv(String),
}

/// The `ledger` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    pub store: LedgerStore,
    pub queue: usize,
    pub batch: usize,
    pub flush_interval: Duration,
}

/// The `state` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The environment variable holding the Redis URL.
    pub redis_url_env: String,
    pub sync_interval: Duration,
    pub key_prefix: String,
    pub timeout: Duration,
    pub limits: SharedLimits,
}

/// How a key's and its user's limits are admitted across replicas (`state.limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharedLimits {
    /// One Redis check-and-add per request (within `state.timeout`; past it, locally).
    #[default]
    Exact,
    /// Local counters only, reconciled by the background sync (replicas may overshoot by what
    /// they admit in one interval).
    Synced,
}

/// How a client key is known: its sha256, or an environment variable holding the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKeySource {
    Sha256([u8; 32]),
    Env(String),
}

/// A budget's period, UTC calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetPeriod {
    Day,
    /// Monday to Sunday.
    Week,
    Month,
    /// Never resets.
    Total,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Day => "day",
            BudgetPeriod::Week => "week",
            BudgetPeriod::Month => "month",
            BudgetPeriod::Total => "total",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// The limit in micro-USD.
    pub micro_usd: u64,
    pub period: BudgetPeriod,
}

/// One client key (`keys[]`).
#[derive(Debug, Clone)]
pub struct ClientKeyConfig {
    pub id: String,
    pub source: ClientKeySource,
    pub user: Option<String>,
    /// Lower-cased globs; `None`: every name.
    pub allowed_models: Option<Vec<String>>,
    pub rpm: Option<u32>,
    pub tpm: Option<u64>,
    pub budget: Option<BudgetConfig>,
    /// `routing`: the key's own routing, between the request's `routing` and the route's.
    pub routing: Option<KeyRoutingConfig>,
}

/// A key's `routing` (seed 002's organisation policy, per key), its providers resolved to
/// indices into `providers`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRoutingConfig {
    /// Replaces the route's strategy unless the request asks for one.
    pub strategy: Option<AskedStrategy>,
    /// Providers whose candidates come first, in this order, unless the request names its own
    /// `routing.providers`.
    pub provider_order: Vec<usize>,
    /// Providers never called for this key, whatever the request names.
    pub exclude_providers: Vec<usize>,
    /// Upstream calls per request at most (the route's own bound still holds).
    pub max_attempts: Option<u32>,
}

/// What signalbox adds to response bodies (the `response` section).
#[derive(Debug, Clone)]
pub struct ResponseConfig {
    /// `provider_field`: a top-level `provider` beside `model` in every object and chunk (on
    /// unless switched off).
    pub provider_field: bool,
    /// `pass_headers`: the provider response headers relayed to the caller.
    pub pass_headers: HeaderGlobs,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        Self {
            provider_field: true,
            pass_headers: HeaderGlobs::default(),
        }
    }
}

/// What of the caller's request reaches the provider (the `request` section).
#[derive(Debug, Clone, Default)]
pub struct RequestConfig {
    /// `pass_headers`: caller headers forwarded beyond those the provider's kind needs.
    pub pass_headers: HeaderGlobs,
}

/// Header-name globs (`*` any run, `?` one character), lower-cased; empty: none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderGlobs(pub Vec<Box<str>>);

impl HeaderGlobs {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a (lower-case) header name matches any glob.
    pub fn matches(&self, name: &str) -> bool {
        self.0
            .iter()
            .any(|g| crate::glob::matches(g.as_bytes(), name.as_bytes()))
    }
}

/// How signalbox logs (the `log` section). Read once, when the process starts.
#[derive(Debug, Clone, Copy)]
pub struct LogConfig {
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: defaults::LOG_FORMAT,
        }
    }
}

/// The largest `failover.max_attempts` (and a policy's `max_attempts`) accepted: far beyond any
/// useful plan. Pingora's own retry cap is set to it, so the bound that holds is always the
/// config's, whatever a reload sets.
pub const MAX_ATTEMPTS_CEILING: u32 = 100;

/// The largest `health.bench_after` accepted: the benching ring keeps that many timestamps.
pub const BENCH_AFTER_CEILING: u32 = 64;

/// Breakers, cooldowns, benching, probes and degraded mode (the `health` section).
///
/// A target is one deployment on one credential. Failures that count against a target are
/// connect errors, timeouts, resets, 5xx/529/408 and empty streams; 401/402/403 take the
/// credential out and 429 cools it, whatever the breaker settings.
#[derive(Debug, Clone, Copy)]
pub struct HealthPolicy {
    /// Consecutive failures that eject a target. `0` switches the breaker off: targets are
    /// never ejected or benched for failures, so a failing target is called on every request
    /// (credential cooldowns after 401/403/429 still apply). A model's own
    /// [`ModelConfig::failure_threshold`] overrides this for that model's targets.
    pub failure_threshold: u32,
    pub cooldown: Duration,
    /// `None` = uncapped.
    pub max_ejection: Option<Duration>,
    pub restore_health: f64,
    /// Success-rate floor; `0` = off.
    pub health_threshold: f64,
    pub respect_retry_after: bool,
    pub probe_interval: Duration,
    /// Model-scoped failures (any credential) inside `bench_window` that bench a deployment
    /// on every credential for `bench_for`. `0` switches benching off. At most 64.
    pub bench_after: u32,
    pub bench_window: Duration,
    pub bench_for: Duration,
    pub success_window: Duration,
    pub degraded: DegradedPolicy,
}

/// Degraded mode: when too few providers have a usable target, stop exploring and follow the
/// scored order.
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
            failure_threshold: defaults::FAILURE_THRESHOLD,
            cooldown: defaults::COOLDOWN,
            max_ejection: Some(defaults::MAX_EJECTION),
            restore_health: defaults::RESTORE_HEALTH,
            health_threshold: defaults::HEALTH_THRESHOLD,
            respect_retry_after: defaults::RESPECT_RETRY_AFTER,
            probe_interval: defaults::PROBE_INTERVAL,
            bench_after: defaults::BENCH_AFTER,
            bench_window: defaults::BENCH_WINDOW,
            bench_for: defaults::BENCH_FOR,
            success_window: defaults::SUCCESS_WINDOW,
            degraded: DegradedPolicy::default(),
        }
    }
}

impl Default for DegradedPolicy {
    fn default() -> Self {
        Self {
            healthy_ratio: defaults::HEALTHY_RATIO,
            min_providers: defaults::MIN_PROVIDERS,
            entry_grace: defaults::ENTRY_GRACE,
            exit_grace: defaults::EXIT_GRACE,
        }
    }
}

/// Knobs of the ranking strategies (the `routing` section).
#[derive(Debug, Clone, Copy)]
pub struct RoutingKnobs {
    /// Policies are resolved (`routing.enabled`).
    pub policies: bool,
    pub rank_interval: Duration,
    pub session_ttl: Duration,
    pub prefix_bytes: usize,
    pub custom_weights: Weights,
    /// The multipliers scored strategies apply (`scoring`).
    pub scoring: Scoring,
}

/// The two multipliers of a scored strategy (`scoring`, seed 000): `effective = base ×
/// headroom factor × rate-limit factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// The share of a deployment's fuller `rpm`/`tpm` window past which its headroom factor
    /// falls (below it, 1).
    pub headroom_threshold: f64,
    /// The headroom factor of a full window: it falls linearly from 1 at the threshold to this.
    pub headroom_floor: f64,
    /// What a 429 on a credential takes off its deployments' scores at once (the factor is
    /// `1 − penalty`), fading back over `rate_limit_decay`.
    pub rate_limit_penalty: f64,
    /// How long the rate-limit penalty takes to fade away; zero: no penalty.
    pub rate_limit_decay: Duration,
}

impl Default for Scoring {
    fn default() -> Self {
        Self {
            headroom_threshold: defaults::HEADROOM_THRESHOLD,
            headroom_floor: defaults::HEADROOM_FLOOR,
            rate_limit_penalty: defaults::RATE_LIMIT_PENALTY,
            rate_limit_decay: defaults::RATE_LIMIT_DECAY,
        }
    }
}

impl Default for RoutingKnobs {
    fn default() -> Self {
        Self {
            policies: true,
            rank_interval: defaults::RANK_INTERVAL,
            session_ttl: defaults::SESSION_TTL,
            prefix_bytes: defaults::PREFIX_BYTES,
            custom_weights: defaults::CUSTOM_WEIGHTS,
            scoring: Scoring::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Listen {
    pub proxy: String,
    pub admin: String,
    /// TLS on the proxy listener; `None`: plaintext.
    pub proxy_tls: Option<ProxyTls>,
    /// Cleartext HTTP/2 (prior knowledge) on the plaintext proxy listener. Never set with
    /// `proxy_tls` (validation refuses the pair: ALPN negotiates HTTP/2 there).
    pub h2c: bool,
}

/// `listen.proxy_tls`: the files, and the key pair they held when the config was validated
/// (loaded and checked then, so a config that validates is one whose certificate can be
/// served, and a reload serves exactly what it validated).
#[derive(Debug, Clone)]
pub struct ProxyTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub cert: ServerCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI's API and every server compatible with it (vLLM, Ollama, llama.cpp, Groq,
    /// Together, ...).
    OpenAi,
    /// Anthropic's native Messages API.
    Anthropic,
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
    /// `budgets.providers.<id>`.
    pub budget: Option<BudgetConfig>,
    /// `headers`: sent on every request to this provider.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// `credential_choice`.
    pub credential_choice: CredentialChoice,
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
    /// The price of prompt tokens read from the provider's cache (`None`: the input price).
    pub cached_input_per_mtok: Option<f64>,
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
    pub tpm: Option<u64>,
    pub budget: Option<BudgetConfig>,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: String,
    pub capability: u8,
    /// `None`: not declared; requests are not filtered on capabilities.
    pub context_window: Option<u32>,
    /// `None`: not declared; requests are not filtered on capabilities.
    pub capabilities: Option<Capabilities>,
    pub deployments: Vec<DeploymentConfig>,
    pub enabled: bool,
    pub strategy: Strategy,
    /// This model's own breaker threshold (`failure_threshold` under the model); `None`
    /// follows `health.failure_threshold` (see [`ModelConfig::breaker_threshold`]). `0` =
    /// this model's breaker is off: its targets are never ejected or benched for failures, so
    /// a failing target is called on every request (credential cooldowns after 401/403/429
    /// still apply).
    pub failure_threshold: Option<u32>,
}

impl ModelConfig {
    /// The consecutive failures that eject one of this model's targets (0: breakers off).
    pub fn breaker_threshold(&self, health: &HealthPolicy) -> u32 {
        self.failure_threshold.unwrap_or(health.failure_threshold)
    }
}

#[derive(Debug, Clone)]
pub struct AliasConfig {
    pub name: String,
    pub model: usize,
}

/// A glob alias (`claude-opus-*: smart`): a name no exact name claims that matches `pattern`
/// is read as `target`, an exact name a caller could send (both lower-cased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobAlias {
    pub pattern: String,
    pub target: String,
}

#[derive(Debug, Clone)]
pub struct ChainConfig {
    pub name: String,
    /// The models tried, in order: the entries switched on, then (with `backfill`) every
    /// catalog model the chain does not name, in catalog order. A model switched off in the
    /// catalog is left out by the routes, as everywhere.
    pub models: Vec<usize>,
    /// The entries as written, each with its switch.
    pub entries: Vec<(usize, bool)>,
    pub backfill: bool,
    /// Written in the long form (`{models, backfill}`) rather than as a list.
    pub long: bool,
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
    /// The base delay before those retries (doubling, jittered, capped at 2 s).
    pub transient_backoff: Duration,
    /// The first-chunk hold on streams; `None` when off (`0`).
    pub first_chunk_hold: Option<Duration>,
    /// The longest silence between two chunks of a stream.
    pub stream_idle_timeout: Duration,
    /// Hedged first token for every route; `None` when off.
    pub hedge: Option<Hedge>,
}

/// Hedged first token: when the live attempt has shown no first byte (first content, for a
/// held stream) after [`Hedge::after`], the plan's next candidate starts beside it and the
/// first to commit serves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hedge {
    pub after: HedgeAfter,
    /// Never hedge sooner than this.
    pub min_after: Duration,
    /// At most this share of the process's requests in the last second is hedged (at least
    /// one hedge a second is always allowed).
    pub max_share: f64,
}

/// When a hedge starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeAfter {
    /// A fixed delay after the attempt started.
    Fixed(Duration),
    /// This percentile (1–99) of the target's own recent TTFBs.
    Percentile(u8),
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_body: usize,
    pub max_request_headers: usize,
    /// The whole request head (a total, not a gap between reads).
    pub header_timeout: Duration,
    /// The whole request body (a total).
    pub body_timeout: Duration,
    /// A kept-alive connection's wait for the first byte of its next request.
    pub idle_timeout: Duration,
}

/// The admin API's tokens (`admin`): the environment variables that hold them. With neither,
/// reads are served and writes refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminConfig {
    /// Reads and writes.
    pub token_env: Option<String>,
    /// Reads only.
    pub read_token_env: Option<String>,
}

/// A named routing policy (`policies.<name>`): where a request starts (`select`), what it
/// falls back to (`on_failure`), and its own limits. Callable as a model name, by
/// `x-llm-route`, or by `routing.policy`.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub name: String,
    /// Evaluated in order: the first entry whose `when` holds (or that has none) selects.
    pub select: Vec<SelectEntry>,
    /// Models (indices into `Config::models`) tried in order after the selected ones.
    pub on_failure: Vec<usize>,
    /// Orders each model's deployments; `None` = each model's own strategy.
    pub strategy: Option<Strategy>,
    /// A 400 from a provider moves on to the next candidate instead of being relayed.
    pub failover_on_client_error: bool,
    /// Upstream calls per request under this policy; `None` = `failover.max_attempts`.
    pub max_attempts: Option<u32>,
    /// Same-target retries under this policy; `None` = `failover.transient_retries`.
    pub retry: Option<PolicyRetry>,
    /// Hedged first token under this policy; `None` = `failover.hedge`.
    pub hedge: Option<Hedge>,
}

/// A policy's same-target retries (`retry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRetry {
    pub attempts: u32,
    pub backoff: Duration,
    /// The statuses that take them (connection drops always do).
    pub on_status: Vec<u16>,
}

/// One `select` entry of a policy.
#[derive(Debug, Clone)]
pub struct SelectEntry {
    /// `None`: always matches.
    pub when: Option<Condition>,
    pub router: RouterConfig,
}

/// How a `select` entry orders its targets for one request.
#[derive(Debug, Clone)]
pub enum RouterConfig {
    /// A fresh draw per request by normalised weights picks the target that leads; the other
    /// targets follow in the order written. A target without a positive weight never leads.
    Weighted(Vec<PolicyTarget>),
    /// In the order written; a target with no room (every deployment's `rpm` window full) is
    /// skipped without a call (spill-over).
    Priority(Vec<PolicyTarget>),
    /// The request's complexity tier (a heuristic over the request) leads; the other tiers
    /// follow, nearest first. Models are indices into `Config::models`.
    Complexity {
        simple: usize,
        medium: usize,
        complex: usize,
    },
    /// Every target's deployments ordered together by one strategy.
    Strategy {
        strategy: Strategy,
        targets: Vec<PolicyTarget>,
    },
    /// Targets ranked per request by predicted quality against price, from scored examples
    /// (`crate::knn`); `default` (a model index) leads whenever the router cannot decide.
    Knn {
        targets: Vec<PolicyTarget>,
        default: usize,
    },
}

/// A model a `select` entry names, with its weight under the weighted router.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyTarget {
    /// Index into `Config::models` (an alias is resolved to its model).
    pub model: usize,
    pub weight: Option<f64>,
}

/// A conditional rule (`rules[n]`): when the request names `auto` and `when` holds, it goes
/// to `then` instead of the active chain. The first rule that holds wins.
#[derive(Debug, Clone)]
pub struct RuleConfig {
    pub when: Condition,
    pub then: RuleTarget,
}

/// Where a rule sends a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleTarget {
    /// `auto:<chain>`: an index into `Config::chains`.
    Chain(usize),
    /// `auto:<axis>`: an axis name as written (lower-cased), one of `AXIS_NAMES`.
    Axis(String),
    /// A policy name: an index into `Config::policies`.
    Policy(usize),
}

// === Guardrails and recommendations (DESIGN §10) ===

/// The sections of §10 this config holds: input checks and the recommendation endpoint.
#[derive(Debug, Default)]
pub struct ChecksConfig {
    /// `guardrails`; `None`: no profile is defined (no request pays for them).
    pub guardrails: Option<GuardrailsConfig>,
    /// `recommend`; `None`: `POST /v1/routing/recommend` is a 404.
    pub recommend: Option<RecommendConfig>,
    /// `routing_knn`; `None`: no policy has a knn entry (no request pays for one).
    pub knn: Option<KnnConfig>,
}

/// `guardrails`, checked: the profiles in name order, and what each policy mandates.
#[derive(Debug)]
pub struct GuardrailsConfig {
    pub profiles: Vec<GuardrailProfile>,
    /// By policy index (`Config::policies`): the profiles it mandates.
    pub policies: Vec<Vec<GuardrailUse>>,
}

/// One profile (`guardrails.profiles.<name>`).
#[derive(Debug)]
pub struct GuardrailProfile {
    pub name: String,
    pub check: GuardrailCheck,
    pub timeout: Duration,
}

/// What a profile checks, by kind.
#[derive(Debug)]
pub enum GuardrailCheck {
    /// Flagged when any pattern matches the input text.
    Patterns(Vec<regex::Regex>),
    /// `POST <base_url>/moderations` of `provider` (an index into `Config::providers`).
    Moderation { provider: usize, model: String },
    /// A catalog chat model asked through the plan.
    Classifier {
        model: String,
        prompt: String,
        /// Lower-cased and trimmed.
        flag_on: String,
    },
}

/// What a flag (or an unavailable check) does to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GuardrailMode {
    /// Served, the result reported in `x-llm-guardrails`.
    Monitor,
    /// Refused.
    Block,
}

impl GuardrailMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardrailMode::Monitor => "monitor",
            GuardrailMode::Block => "block",
        }
    }
}

/// A profile a policy (or a caller) asks for, and what its results do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardrailUse {
    /// An index into `GuardrailsConfig::profiles`.
    pub profile: usize,
    pub mode: GuardrailMode,
    pub on_unavailable: GuardrailMode,
}

/// `recommend`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecommendConfig {
    /// A catalog model's name.
    pub decision_model: String,
}

/// `routing_knn`, checked (DESIGN §10).
#[derive(Debug, Clone, PartialEq)]
pub struct KnnConfig {
    /// The catalog model's name the examples and requests are embedded with.
    pub embedding_model: String,
    /// Neighbours consulted (at least 1).
    pub k: usize,
    /// Examples a pool needs before it is used (at least 1).
    pub warmup: usize,
    /// Weight of the cost term against predicted quality (finite, not negative).
    pub alpha: f64,
    /// The best target must beat the second by more than this (0..=1).
    pub confidence_floor: f64,
    pub granularity: KnnGranularity,
    /// A pool's bound; past it the oldest examples are dropped.
    pub max_examples_per_pool: usize,
    /// How long a request's embedding may take before the default serves.
    pub embed_timeout: Duration,
}

/// How often the knn router decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnnGranularity {
    /// Every request.
    Request,
    /// Once per `x-llm-conversation-id` (process-local, for an hour).
    Conversation,
}
