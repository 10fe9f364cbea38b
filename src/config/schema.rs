//! The file format: serde types that mirror the YAML (or JSON) config one to one.
//!
//! Nothing outside `config` reads these types. They are strict (`deny_unknown_fields`
//! everywhere) so a misspelt key is refused with its path instead of silently ignored, and
//! they hold raw values (strings for durations and sizes, names as written): turning them
//! into checked domain values is [`validate`](super::validate)'s job. A key left out takes
//! its value from [`defaults`] through the small `default_*` functions at
//! the end of this file, which only convert a default to its raw form.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::defaults;
pub use super::vocab::CapabilitySection;

/// The whole config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub listen: ListenSection,
    pub providers: BTreeMap<String, ProviderSection>,
    pub models: BTreeMap<String, ModelSection>,
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// Named chains: a list of models, or the long form with switches and backfill (seed 000).
    #[serde(default)]
    pub chains: BTreeMap<String, ListOr<ChainEntrySection, ChainSection>>,
    #[serde(default)]
    pub active_chain: Option<String>,
    #[serde(default)]
    pub failover: FailoverSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub health: HealthSection,
    #[serde(default)]
    pub routing: RoutingSection,
    /// The headroom and rate-limit multipliers of the scored strategies.
    #[serde(default)]
    pub scoring: ScoringSection,
    #[serde(default)]
    pub pingora: PingoraSection,
    /// Named routing policies, callable as a model name, by `x-llm-route` or `routing.policy`.
    #[serde(default)]
    pub policies: BTreeMap<String, PolicySection>,
    /// Conditional rules consulted when a request names `auto`, in the order written: a list,
    /// or the rule set's long form with its switches (seed 000).
    #[serde(default)]
    pub rules: ListOr<RuleSection, RuleSetSection>,
    /// Who may use the admin API.
    #[serde(default)]
    pub admin: AdminSection,
    /// How the process logs.
    #[serde(default)]
    pub log: LogSection,
    /// What signalbox adds to response bodies, and which provider headers reach the caller.
    #[serde(default)]
    pub response: ResponseSection,
    /// Which of the caller's headers reach the provider beyond those its kind needs.
    #[serde(default)]
    pub request: RequestSection,
    /// Client keys: absent, no caller auth; present, every proxied request needs one.
    #[serde(default)]
    pub keys: Option<Vec<KeySection>>,
    /// Spending limits beyond keys and deployments.
    #[serde(default)]
    pub budgets: BudgetsSection,
    /// Where every attempt is recorded (`sqlite` by default, or PostgreSQL).
    #[serde(default)]
    pub ledger: Option<LedgerSection>,
    /// Counters and cooldowns shared across replicas (Redis); absent: per instance.
    #[serde(default)]
    pub state: Option<StateSection>,
    /// What `/metrics` exports beyond the bounded defaults.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// Input checks policies and callers may ask for (DESIGN §10).
    #[serde(default)]
    pub guardrails: Option<GuardrailsSection>,
    /// `POST /v1/routing/recommend`: which catalog model decides.
    #[serde(default)]
    pub recommend: Option<RecommendSection>,
    /// The knn (learned) router's settings (DESIGN §10); needed by any `router: knn` entry.
    #[serde(default)]
    pub routing_knn: Option<RoutingKnnSection>,
}

/// `ledger`: one row per attempt, written off the request path.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerSection {
    /// The embedded database file (WAL); the default backend.
    #[serde(default)]
    pub sqlite: Option<String>,
    /// Name of an environment variable holding a PostgreSQL URL (`postgres://user:pw@host/db`).
    #[serde(default)]
    pub postgres_url_env: Option<String>,
    /// Rows waiting for the writer at most; beyond it rows are dropped (and counted).
    #[serde(default = "default_ledger_queue")]
    pub queue: usize,
    /// Rows written in one transaction at most.
    #[serde(default = "default_ledger_batch")]
    pub batch: usize,
    /// How long the writer waits to fill a batch.
    #[serde(default = "default_ledger_flush_interval")]
    pub flush_interval: String,
}

/// `state`: shared counters on Redis.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSection {
    /// Name of an environment variable holding the Redis URL (`redis://host:6379/0`).
    pub redis_url_env: String,
    /// How often each replica pushes its counts and reads everyone's (and the cooldowns).
    #[serde(default = "default_state_sync_interval")]
    pub sync_interval: String,
    /// Prefix of every Redis key, so clusters can share one Redis.
    #[serde(default = "default_state_key_prefix")]
    pub key_prefix: String,
    /// How long one Redis call may take before the replica falls back to its local counts.
    #[serde(default = "default_state_timeout")]
    pub timeout: String,
    /// `exact`: a key's and its user's limits are admitted by one Redis check-and-add per
    /// request; `synced`: on local counters only, reconciled by the background sync.
    #[serde(default)]
    pub limits: Option<String>,
}

/// `metrics`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Label spend and tokens by client key id too (one series per key: off by default).
    #[serde(default)]
    pub per_key: bool,
}

/// `budgets`: the whole gateway's, and each provider's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsSection {
    #[serde(default)]
    pub global: Option<BudgetSection>,
    #[serde(default)]
    pub providers: BTreeMap<String, BudgetSection>,
    /// Per `user` of the client keys: every key of that user spends from it.
    #[serde(default)]
    pub users: BTreeMap<String, BudgetSection>,
}

/// One client key (`keys[]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySection {
    pub id: String,
    /// The sha256 of the key, 64 hex digits (the key itself is never in the file).
    #[serde(default)]
    pub key_sha256: Option<String>,
    /// Name of an environment variable holding the key itself.
    #[serde(default)]
    pub key_env: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Globs (`*`, `?`) over the names the key may send as `model`, `routing.policy` or
    /// `x-llm-route`; absent: every name.
    #[serde(default)]
    pub allowed_models: Option<Vec<String>>,
    /// Requests per minute (a sliding window).
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Tokens per minute (a sliding window over estimated, then reported, tokens).
    #[serde(default)]
    pub tpm: Option<u64>,
    #[serde(default)]
    pub budget: Option<BudgetSection>,
    /// How this key's requests are routed when the request does not say.
    #[serde(default)]
    pub routing: Option<KeyRoutingSection>,
}

/// `keys[].routing`: the key's own routing defaults (seed 002's organisation policy, per key).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRoutingSection {
    /// A strategy name, as a request's `routing.strategy` may give it.
    #[serde(default)]
    pub strategy: Option<String>,
    /// Provider ids whose candidates come first, in this order.
    #[serde(default)]
    pub provider_order: Option<Vec<String>>,
    /// Provider ids never called for this key.
    #[serde(default)]
    pub exclude_providers: Option<Vec<String>>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

/// A spending limit: `{usd: 50, period: month}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    pub usd: f64,
    /// `day | week | month | total` (UTC calendar; weeks start on Monday).
    pub period: String,
}

/// What signalbox adds to response bodies (`response`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseSection {
    /// A top-level `provider` (the serving provider's id) beside `model` in every response
    /// object and stream chunk: on by default (seed 002).
    #[serde(default = "default_provider_field")]
    pub provider_field: bool,
    /// Globs of provider response headers relayed to the caller (everything else of the
    /// provider's is dropped but framing and `content-type`).
    #[serde(default)]
    pub pass_headers: Vec<String>,
}

impl Default for ResponseSection {
    fn default() -> Self {
        Self {
            provider_field: default_provider_field(),
            pass_headers: Vec::new(),
        }
    }
}

/// What of the caller's request travels to the provider (`request`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSection {
    /// Globs of caller headers forwarded to the provider beyond those its kind needs
    /// (credential headers can never be named).
    #[serde(default)]
    pub pass_headers: Vec<String>,
}

/// The admin API's tokens: each names an environment variable holding it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Reads and writes (`Authorization: Bearer <token>`).
    #[serde(default)]
    pub token_env: Option<String>,
    /// Reads only.
    #[serde(default)]
    pub read_token_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenSection {
    #[serde(default = "default_proxy_listen")]
    pub proxy: String,
    #[serde(default = "default_admin_listen")]
    pub admin: String,
    /// TLS termination on the proxy listener (HTTP/2 or HTTP/1.1 by ALPN); absent: plaintext.
    #[serde(default)]
    pub proxy_tls: Option<ProxyTlsSection>,
    /// Cleartext HTTP/2 with prior knowledge on a plaintext proxy listener.
    #[serde(default)]
    pub h2c: bool,
}

impl Default for ListenSection {
    fn default() -> Self {
        Self {
            proxy: default_proxy_listen(),
            admin: default_admin_listen(),
            proxy_tls: None,
            h2c: false,
        }
    }
}

/// `listen.proxy_tls`: the PEM files the proxy listener serves.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyTlsSection {
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKindSection {
    Openai,
    Anthropic,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    pub kind: ProviderKindSection,
    pub base_url: String,
    #[serde(default)]
    pub credentials: Vec<CredentialSection>,
    /// Default priority of this provider's deployments (lower is tried first).
    #[serde(default)]
    pub priority: Option<i32>,
    /// PEM file of CA certificates that verify this provider's TLS certificate instead of the
    /// system roots.
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub connect_timeout: Option<String>,
    #[serde(default)]
    pub ttfb_timeout: Option<String>,
    #[serde(default = "default_provider_enabled")]
    pub enabled: bool,
    /// Header fields sent on every request to this provider (an API version, a project id).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How a request picks among the credentials: `round_robin` (the default) or
    /// `least_remaining_quota`.
    #[serde(default)]
    pub credential_choice: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSection {
    pub id: String,
    /// Name of the environment variable that holds the key.
    #[serde(default)]
    pub key_env: Option<String>,
    /// Path of a file whose content (trimmed) is the key.
    #[serde(default)]
    pub key_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    #[serde(default = "default_capability")]
    pub capability: u8,
    #[serde(default)]
    pub context_window: Option<u32>,
    /// What the model supports; absent = not declared, and requests are not filtered on it.
    #[serde(default)]
    pub capabilities: Option<Vec<CapabilitySection>>,
    pub deployments: Vec<DeploymentSection>,
    #[serde(default = "default_model_enabled")]
    pub enabled: bool,
    /// How this model's deployments are ordered (absent: `defaults::STRATEGY`).
    #[serde(default)]
    pub strategy: Option<String>,
    /// Consecutive failures that eject one of this model's targets (absent:
    /// `health.failure_threshold`). `0` switches this model's breaker off: its targets are
    /// never ejected or benched for failures, so a failing target is called on every request
    /// (credential cooldowns after 401/403/429 still apply).
    #[serde(default)]
    pub failure_threshold: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSection {
    pub provider: String,
    pub model: String,
    #[serde(default)]
    pub price: Option<PriceSection>,
    #[serde(default)]
    pub priority: Option<i32>,
    /// Share of traffic under the `weighted` strategy (any positive scale).
    #[serde(default)]
    pub weight: Option<f64>,
    /// Requests per minute this deployment may take; drives the headroom factor.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Tokens per minute this deployment may take (reported usage, a sliding window); full,
    /// it is skipped (`tpm_full`).
    #[serde(default)]
    pub tpm: Option<u64>,
    /// What this deployment may spend per period; over it, it is skipped (`over_budget`).
    #[serde(default)]
    pub budget: Option<BudgetSection>,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct PriceSection {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Prompt tokens the provider reports as read from its prompt cache; absent: input price.
    #[serde(default)]
    pub cached_input_per_mtok: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverSection {
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    #[serde(default = "default_deadline")]
    pub deadline: String,
    #[serde(default = "default_ttfb_timeout")]
    pub ttfb_timeout: String,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: String,
    /// Extra calls to the same target after a transient failure (reset or closed before the
    /// header, connect timeout, 5xx/529/408) before moving on; each is an attempt.
    #[serde(default = "default_transient_retries")]
    pub transient_retries: u32,
    /// The base delay of those retries: the n-th waits a random time up to `backoff × 2^n`.
    #[serde(default = "default_transient_backoff")]
    pub transient_backoff: String,
    /// Streams: hold the response header until the first content arrives, failing over when
    /// none comes within this long (`0`: off).
    #[serde(default = "default_first_chunk_hold")]
    pub first_chunk_hold: String,
    /// Streams: the longest silence between two chunks once content flows.
    #[serde(default = "default_stream_idle_timeout")]
    pub stream_idle_timeout: String,
    /// Hedged first token for every route (a policy's own `hedge` wins); off when absent.
    #[serde(default)]
    pub hedge: Option<HedgeSection>,
}

/// `hedge` (on a policy, or `failover.hedge`): when an attempt has shown no first byte after
/// `after` (a duration, or `p<NN>` of the target's own recent TTFBs, never below
/// `min_after`), the next candidate starts beside it; at most `max_share` of the process's
/// requests in the last second are hedged.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeSection {
    pub after: String,
    #[serde(default)]
    pub min_after: Option<String>,
    #[serde(default)]
    pub max_share: Option<f64>,
}

impl Default for FailoverSection {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            deadline: default_deadline(),
            ttfb_timeout: default_ttfb_timeout(),
            connect_timeout: default_connect_timeout(),
            transient_retries: default_transient_retries(),
            transient_backoff: default_transient_backoff(),
            first_chunk_hold: default_first_chunk_hold(),
            stream_idle_timeout: default_stream_idle_timeout(),
            hedge: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    #[serde(default = "default_max_request_body")]
    pub max_request_body: SizeValue,
    #[serde(default = "default_max_request_headers")]
    pub max_request_headers: SizeValue,
    #[serde(default = "default_header_timeout")]
    pub header_timeout: String,
    #[serde(default = "default_body_timeout")]
    pub body_timeout: String,
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: String,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_request_body: default_max_request_body(),
            max_request_headers: default_max_request_headers(),
            header_timeout: default_header_timeout(),
            body_timeout: default_body_timeout(),
            idle_timeout: default_idle_timeout(),
        }
    }
}

/// A size written either as a number of bytes or as text such as `16MiB`.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// Breakers, cooldowns, benching, probes and degraded mode.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    /// Consecutive failures that eject a target; `0` switches the breaker off (targets are
    /// never ejected or benched for failures; credential cooldowns still apply).
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
    #[serde(default = "default_cooldown")]
    pub cooldown: String,
    #[serde(default = "default_max_ejection")]
    pub max_ejection: String,
    #[serde(default = "default_restore_health")]
    pub restore_health: f64,
    #[serde(default = "default_health_threshold")]
    pub health_threshold: f64,
    #[serde(default = "default_respect_retry_after")]
    pub respect_retry_after: bool,
    #[serde(default = "default_probe_interval")]
    pub probe_interval: String,
    /// Model-scoped failures inside `bench_window` that bench a deployment; `0` = off.
    #[serde(default = "default_bench_after")]
    pub bench_after: u32,
    #[serde(default = "default_bench_window")]
    pub bench_window: String,
    #[serde(default = "default_bench_for")]
    pub bench_for: String,
    #[serde(default = "default_success_window")]
    pub success_window: String,
    #[serde(default)]
    pub degraded: DegradedSection,
}

impl Default for HealthSection {
    fn default() -> Self {
        Self {
            failure_threshold: default_failure_threshold(),
            cooldown: default_cooldown(),
            max_ejection: default_max_ejection(),
            restore_health: default_restore_health(),
            health_threshold: default_health_threshold(),
            respect_retry_after: default_respect_retry_after(),
            probe_interval: default_probe_interval(),
            bench_after: default_bench_after(),
            bench_window: default_bench_window(),
            bench_for: default_bench_for(),
            success_window: default_success_window(),
            degraded: DegradedSection::default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DegradedSection {
    #[serde(default = "default_healthy_ratio")]
    pub healthy_ratio: f64,
    #[serde(default = "default_min_providers")]
    pub min_providers: u32,
    #[serde(default = "default_entry_grace")]
    pub entry_grace: String,
    #[serde(default = "default_exit_grace")]
    pub exit_grace: String,
}

impl Default for DegradedSection {
    fn default() -> Self {
        Self {
            healthy_ratio: default_healthy_ratio(),
            min_providers: default_min_providers(),
            entry_grace: default_entry_grace(),
            exit_grace: default_exit_grace(),
        }
    }
}

/// Knobs of the ranking strategies.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingSection {
    /// `false` turns policy resolution off (by name, `x-llm-route` and `routing.policy`) while
    /// the policies stay validated (seed 004).
    #[serde(default = "default_routing_enabled")]
    pub enabled: bool,
    /// How often the ranker rebuilds the scored tables (also on every breaker transition).
    #[serde(default = "default_rank_interval")]
    pub rank_interval: String,
    /// Lifetime of a sticky session (`x-llm-session`).
    #[serde(default = "default_session_ttl")]
    pub session_ttl: String,
    /// Prompt bytes hashed by `prefix_affinity`.
    #[serde(default = "default_prefix_bytes")]
    pub prefix_bytes: usize,
    /// Weights of the `custom` strategy.
    #[serde(default)]
    pub custom_weights: Option<WeightsSection>,
}

impl Default for RoutingSection {
    fn default() -> Self {
        Self {
            enabled: default_routing_enabled(),
            rank_interval: default_rank_interval(),
            session_ttl: default_session_ttl(),
            prefix_bytes: default_prefix_bytes(),
            custom_weights: None,
        }
    }
}

/// `scoring`: the multipliers of the scored strategies; each key optional.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ScoringSection {
    #[serde(default)]
    pub headroom_threshold: Option<f64>,
    #[serde(default)]
    pub headroom_floor: Option<f64>,
    #[serde(default)]
    pub rate_limit_penalty: Option<f64>,
    #[serde(default)]
    pub rate_limit_decay: Option<String>,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct WeightsSection {
    pub reliability: f64,
    pub speed: f64,
    pub capability: f64,
}

/// How signalbox writes its log (stderr).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` or `json`.
    #[serde(default = "default_log_format")]
    pub format: String,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: default_log_format(),
        }
    }
}

/// The subset of Pingora's `ServerConf` that signalbox exposes. Pingora's own loader ignores
/// unknown keys; this mirror is strict like the rest of the file.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PingoraSection {
    #[serde(default)]
    pub threads: Option<usize>,
    #[serde(default)]
    pub work_stealing: Option<bool>,
    #[serde(default)]
    pub listener_tasks_per_fd: Option<usize>,
    #[serde(default)]
    pub daemon: Option<bool>,
    #[serde(default)]
    pub pid_file: Option<String>,
    #[serde(default)]
    pub upgrade_sock: Option<String>,
    #[serde(default)]
    pub error_log: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub grace_period_seconds: Option<u64>,
    #[serde(default)]
    pub graceful_shutdown_timeout_seconds: Option<u64>,
    #[serde(default)]
    pub upstream_keepalive_pool_size: Option<usize>,
    #[serde(default)]
    pub ca_file: Option<String>,
}

/// A routing policy (`policies.<name>`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// The first entry whose `when` holds selects; an entry without `when` always holds.
    pub select: Vec<SelectSection>,
    /// Models (or aliases) tried in order after the selected ones.
    #[serde(default)]
    pub on_failure: Vec<String>,
    /// Orders each model's deployments (absent: each model's own `strategy`).
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub failover_on_client_error: bool,
    /// Upstream calls per request under this policy (absent: `failover.max_attempts`).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    /// Same-target retries under this policy (absent: `failover.transient_retries`).
    #[serde(default)]
    pub retry: Option<RetrySection>,
    /// Hedged first token under this policy (absent: `failover.hedge`).
    #[serde(default)]
    pub hedge: Option<HedgeSection>,
    /// Guardrail profiles every request under this policy runs (`guardrails.profiles`).
    #[serde(default)]
    pub guardrails: Vec<GuardrailUseSection>,
}

/// `policies.<name>.retry` (seed 003's routing retries): `attempts` extra calls to the same
/// target on the statuses `on_status` and on connection drops, waiting up to `backoff × 2^n`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    pub attempts: u32,
    #[serde(default)]
    pub backoff: Option<String>,
    #[serde(default)]
    pub on_status: Option<Vec<u16>>,
}

/// One `select` entry. Which of `targets`, `tiers` and `strategy` it takes depends on its
/// `router`; validation checks the combination (so every misplaced key is reported at once).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectSection {
    /// A condition as written; compiled by validation. `when: null` is kept (as `Some(Null)`)
    /// so it is refused rather than read as "no condition".
    #[serde(default, deserialize_with = "raw_present")]
    pub when: Option<serde_yaml::Value>,
    pub router: RouterKindSection,
    #[serde(default)]
    pub targets: Option<Vec<TargetSection>>,
    #[serde(default)]
    pub tiers: Option<TiersSection>,
    #[serde(default)]
    pub strategy: Option<String>,
    /// Router `knn`: the model that serves while the router cannot decide (a cold pool, a
    /// failed embedding, low confidence, `x-llm-router: off`).
    #[serde(default)]
    pub default: Option<String>,
}

/// `select[].router`.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RouterKindSection {
    Weighted,
    Priority,
    Complexity,
    Strategy,
    Knn,
}

impl RouterKindSection {
    pub fn as_str(self) -> &'static str {
        match self {
            RouterKindSection::Weighted => "weighted",
            RouterKindSection::Priority => "priority",
            RouterKindSection::Complexity => "complexity",
            RouterKindSection::Strategy => "strategy",
            RouterKindSection::Knn => "knn",
        }
    }
}

/// A model (or alias) a `select` entry names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSection {
    pub model: String,
    /// Share of draws under router `weighted` (any positive scale); refused elsewhere.
    #[serde(default)]
    pub weight: Option<f64>,
}

/// `select[].tiers` of router `complexity`: a model (or alias) per tier, all three required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TiersSection {
    #[serde(default)]
    pub simple: Option<String>,
    #[serde(default)]
    pub medium: Option<String>,
    #[serde(default)]
    pub complex: Option<String>,
}

/// A conditional rule (`rules[n]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSection {
    /// A condition as written; compiled by validation.
    pub when: serde_yaml::Value,
    /// `auto:<chain>`, `auto:<axis>` or a policy name.
    pub then: String,
}

/// A chain in its long form (`chains.<name>`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainSection {
    #[serde(default)]
    pub models: Vec<ChainEntrySection>,
    /// Append every catalog model the chain does not name, after its own, in catalog order.
    #[serde(default)]
    pub backfill: bool,
}

/// One model of a chain: its name, or `{model, enabled}`.
#[derive(Debug)]
pub struct ChainEntrySection {
    pub model: String,
    pub enabled: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainEntryLong {
    model: String,
    #[serde(default = "default_chain_entry_enabled")]
    enabled: bool,
}

impl<'de> Deserialize<'de> for ChainEntrySection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = ChainEntrySection;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a model name, or { model, enabled }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(ChainEntrySection {
                    model: v.to_string(),
                    enabled: true,
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                let e =
                    ChainEntryLong::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ChainEntrySection {
                    model: e.model,
                    enabled: e.enabled,
                })
            }
        }
        d.deserialize_any(Entry)
    }
}

/// `rules` in its long form: the switches of the rule set (seed 000).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSetSection {
    /// `false`: the rules (and `default`) stay validated but are never consulted.
    #[serde(default = "default_rules_enabled")]
    pub enabled: bool,
    /// Where a bare `auto` goes when no rule holds (`auto:<chain>`, `auto:<axis>` or a
    /// policy); `null`: the active chain.
    #[serde(default)]
    pub default: Option<String>,
    #[serde(default)]
    pub rules: Vec<RuleSection>,
}

/// A section written either as a list (its short form) or as a map (its long form). Read by
/// hand rather than as an untagged enum, so an error inside either form keeps its key path.
#[derive(Debug)]
pub enum ListOr<T, L> {
    List(Vec<T>),
    Long(L),
}

impl<T, L> Default for ListOr<T, L> {
    fn default() -> Self {
        ListOr::List(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>, L: Deserialize<'de>> Deserialize<'de> for ListOr<T, L> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Form<T, L>(std::marker::PhantomData<(T, L)>);
        impl<'de, T: Deserialize<'de>, L: Deserialize<'de>> serde::de::Visitor<'de> for Form<T, L> {
            type Value = ListOr<T, L>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list, or a map (the long form)")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Vec::<T>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(ListOr::List)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                L::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ListOr::Long)
            }
        }
        d.deserialize_any(Form(std::marker::PhantomData))
    }
}

/// Deserialize a present value as `Some` even when it is `null`.
fn raw_present<'de, D>(d: D) -> Result<Option<serde_yaml::Value>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    serde_yaml::Value::deserialize(d).map(Some)
}

// === serde defaults: each hands one value of `defaults` over in the file's raw form ===

pub fn default_proxy_listen() -> String {
    defaults::PROXY_LISTEN.to_string()
}
pub fn default_admin_listen() -> String {
    defaults::ADMIN_LISTEN.to_string()
}

pub fn default_provider_enabled() -> bool {
    defaults::PROVIDER_ENABLED
}

pub fn default_capability() -> u8 {
    defaults::CAPABILITY
}
pub fn default_model_enabled() -> bool {
    defaults::MODEL_ENABLED
}

pub fn default_max_attempts() -> u32 {
    defaults::MAX_ATTEMPTS
}
pub fn default_deadline() -> String {
    defaults::duration_text(defaults::DEADLINE)
}
pub fn default_first_chunk_hold() -> String {
    defaults::duration_text(defaults::FIRST_CHUNK_HOLD)
}
pub fn default_stream_idle_timeout() -> String {
    defaults::duration_text(defaults::STREAM_IDLE_TIMEOUT)
}
pub fn default_ttfb_timeout() -> String {
    defaults::duration_text(defaults::TTFB_TIMEOUT)
}
pub fn default_connect_timeout() -> String {
    defaults::duration_text(defaults::CONNECT_TIMEOUT)
}
pub fn default_transient_retries() -> u32 {
    defaults::TRANSIENT_RETRIES
}
pub fn default_transient_backoff() -> String {
    defaults::duration_text(defaults::TRANSIENT_BACKOFF)
}

pub fn default_max_request_body() -> SizeValue {
    SizeValue::Bytes(defaults::MAX_REQUEST_BODY)
}
pub fn default_max_request_headers() -> SizeValue {
    SizeValue::Bytes(defaults::MAX_REQUEST_HEADERS)
}
pub fn default_header_timeout() -> String {
    defaults::duration_text(defaults::HEADER_TIMEOUT)
}
pub fn default_body_timeout() -> String {
    defaults::duration_text(defaults::BODY_TIMEOUT)
}
pub fn default_idle_timeout() -> String {
    defaults::duration_text(defaults::IDLE_TIMEOUT)
}

pub fn default_failure_threshold() -> u32 {
    defaults::FAILURE_THRESHOLD
}
pub fn default_cooldown() -> String {
    defaults::duration_text(defaults::COOLDOWN)
}
pub fn default_max_ejection() -> String {
    defaults::duration_text(defaults::MAX_EJECTION)
}
pub fn default_chain_entry_enabled() -> bool {
    true
}

pub fn default_rules_enabled() -> bool {
    true
}

pub fn default_provider_field() -> bool {
    true
}

pub fn default_routing_enabled() -> bool {
    true
}

pub fn default_restore_health() -> f64 {
    defaults::RESTORE_HEALTH
}
pub fn default_health_threshold() -> f64 {
    defaults::HEALTH_THRESHOLD
}
pub fn default_respect_retry_after() -> bool {
    defaults::RESPECT_RETRY_AFTER
}
pub fn default_probe_interval() -> String {
    defaults::duration_text(defaults::PROBE_INTERVAL)
}
pub fn default_bench_after() -> u32 {
    defaults::BENCH_AFTER
}
pub fn default_bench_window() -> String {
    defaults::duration_text(defaults::BENCH_WINDOW)
}
pub fn default_bench_for() -> String {
    defaults::duration_text(defaults::BENCH_FOR)
}
pub fn default_success_window() -> String {
    defaults::duration_text(defaults::SUCCESS_WINDOW)
}
pub fn default_healthy_ratio() -> f64 {
    defaults::HEALTHY_RATIO
}
pub fn default_min_providers() -> u32 {
    defaults::MIN_PROVIDERS
}
pub fn default_entry_grace() -> String {
    defaults::duration_text(defaults::ENTRY_GRACE)
}
pub fn default_exit_grace() -> String {
    defaults::duration_text(defaults::EXIT_GRACE)
}

pub fn default_rank_interval() -> String {
    defaults::duration_text(defaults::RANK_INTERVAL)
}
pub fn default_session_ttl() -> String {
    defaults::duration_text(defaults::SESSION_TTL)
}
pub fn default_prefix_bytes() -> usize {
    defaults::PREFIX_BYTES
}

pub fn default_log_format() -> String {
    defaults::LOG_FORMAT.as_str().to_string()
}

pub fn default_ledger_queue() -> usize {
    defaults::LEDGER_QUEUE
}
pub fn default_ledger_batch() -> usize {
    defaults::LEDGER_BATCH
}
pub fn default_ledger_flush_interval() -> String {
    defaults::duration_text(defaults::LEDGER_FLUSH_INTERVAL)
}
pub fn default_state_sync_interval() -> String {
    defaults::duration_text(defaults::STATE_SYNC_INTERVAL)
}
pub fn default_state_key_prefix() -> String {
    defaults::STATE_KEY_PREFIX.to_string()
}
pub fn default_state_timeout() -> String {
    defaults::duration_text(defaults::STATE_TIMEOUT)
}

// === Guardrails and recommendations (DESIGN §10) ===

/// `guardrails`: named input checks.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardrailsSection {
    #[serde(default)]
    pub profiles: BTreeMap<String, GuardrailProfileSection>,
}

/// `guardrails.profiles.<name>`. Which keys a profile takes depends on its `kind`;
/// validation checks the combination (so every misplaced key is reported at once).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardrailProfileSection {
    /// `patterns` | `moderation` | `classifier`.
    pub kind: String,
    /// `patterns`: regular expressions over the input text.
    #[serde(default)]
    pub patterns: Option<Vec<String>>,
    /// `moderation`: the provider whose `/moderations` endpoint is asked.
    #[serde(default)]
    pub provider: Option<String>,
    /// `moderation`: the moderation model; `classifier`: the catalog chat model asked.
    #[serde(default)]
    pub model: Option<String>,
    /// `classifier`: the system message the input is judged under.
    #[serde(default)]
    pub prompt: Option<String>,
    /// `classifier`: the answer's start that flags the input.
    #[serde(default)]
    pub flag_on: Option<String>,
    /// How long the check may take (absent: 2 s).
    #[serde(default)]
    pub timeout: Option<String>,
}

/// `policies.<name>.guardrails[n]`: a profile the policy mandates.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardrailUseSection {
    pub profile: String,
    /// `block` | `monitor` (required: a policy says what a flag does).
    pub mode: String,
    /// `block` | `monitor` (absent: `block`).
    #[serde(default)]
    pub on_unavailable: Option<String>,
}

/// `recommend`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecommendSection {
    /// The catalog chat model asked which candidate suits a task.
    pub decision_model: String,
}

/// `routing_knn` (DESIGN §10): how the knn router embeds, searches and weighs. Every key but
/// `embedding_model` has a default (`config::defaults`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingKnnSection {
    /// A catalog model served over `/v1/embeddings`.
    pub embedding_model: String,
    #[serde(default)]
    pub k: Option<u64>,
    #[serde(default)]
    pub warmup: Option<u64>,
    #[serde(default)]
    pub alpha: Option<f64>,
    #[serde(default)]
    pub confidence_floor: Option<f64>,
    /// `request` | `conversation`.
    #[serde(default)]
    pub granularity: Option<String>,
    #[serde(default)]
    pub max_examples_per_pool: Option<u64>,
    #[serde(default)]
    pub embed_timeout: Option<String>,
}
