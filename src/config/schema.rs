//! The file format: serde types that mirror the YAML (or JSON) config one to one.
//!
//! Nothing outside `config` reads these types. They are strict (`deny_unknown_fields`
//! everywhere) so a misspelt key is refused with its path instead of silently ignored, and
//! they hold raw values (strings for durations and sizes, names as written): turning them
//! into checked domain values is `validate.rs`'s job. Defaults are named functions so the
//! commented example in `conf/signalbox.yaml` can quote them.

use std::collections::BTreeMap;

use serde::Deserialize;

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
    #[serde(default)]
    pub chains: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub active_chain: Option<String>,
    #[serde(default)]
    pub failover: FailoverSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub pingora: PingoraSection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenSection {
    #[serde(default = "default_proxy_listen")]
    pub proxy: String,
    #[serde(default = "default_admin_listen")]
    pub admin: String,
}

impl Default for ListenSection {
    fn default() -> Self {
        Self {
            proxy: default_proxy_listen(),
            admin: default_admin_listen(),
        }
    }
}

pub fn default_proxy_listen() -> String {
    "0.0.0.0:8080".to_string()
}

pub fn default_admin_listen() -> String {
    "127.0.0.1:9090".to_string()
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
    #[serde(default = "default_true")]
    pub enabled: bool,
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

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum CapabilitySection {
    Stream,
    Tools,
    Vision,
    JsonMode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    #[serde(default = "default_capability")]
    pub capability: u8,
    #[serde(default)]
    pub context_window: Option<u32>,
    #[serde(default = "default_capabilities")]
    pub capabilities: Vec<CapabilitySection>,
    pub deployments: Vec<DeploymentSection>,
    #[serde(default = "default_true")]
    pub enabled: bool,
}

pub fn default_capability() -> u8 {
    1
}

pub fn default_capabilities() -> Vec<CapabilitySection> {
    vec![CapabilitySection::Stream]
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
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct PriceSection {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
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
}

impl Default for FailoverSection {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            deadline: default_deadline(),
            ttfb_timeout: default_ttfb_timeout(),
            connect_timeout: default_connect_timeout(),
        }
    }
}

pub fn default_max_attempts() -> u32 {
    20
}
pub fn default_deadline() -> String {
    "45s".to_string()
}
pub fn default_ttfb_timeout() -> String {
    "30s".to_string()
}
pub fn default_connect_timeout() -> String {
    "5s".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    #[serde(default = "default_max_request_body")]
    pub max_request_body: SizeValue,
    #[serde(default = "default_max_request_headers")]
    pub max_request_headers: SizeValue,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_request_body: default_max_request_body(),
            max_request_headers: default_max_request_headers(),
        }
    }
}

pub fn default_max_request_body() -> SizeValue {
    SizeValue::Text("16MiB".to_string())
}
pub fn default_max_request_headers() -> SizeValue {
    SizeValue::Text("64KiB".to_string())
}

/// A size written either as a number of bytes or as text such as `16MiB`.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
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

fn default_true() -> bool {
    true
}
