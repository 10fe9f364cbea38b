//! Configuration: load a file, check it, and hand back a [`Config`] or every error found.
//!
//! Two layers: [`schema`] mirrors the file and is all serde (strict: an unknown key is an
//! error naming its path); [`validate`] turns it into the checked values of [`types`], with
//! cross references resolved, collecting every error rather than stopping at the first. A
//! config that fails here never reaches the rest of the program, so a bad file cannot
//! replace a good one.
//!
//! - this file: [`load`] / [`parse`] and the error types;
//! - `collect`: when the strict parse fails, every section's parse errors, not only the first,
//!   and the validation of what parses once the keys at fault are cut;
//! - [`schema`]: the file format, serde types that mirror it one to one;
//! - [`defaults`]: every default value, the only place one is written;
//! - [`types`]: the checked domain types the rest of signalbox reads;
//! - [`values`]: parsers of single values (durations, sizes, URLs, addresses) and name rules;
//! - [`condition`]: the condition language of `rules` and policies, compiled and evaluated;
//!   `compile` turns a condition as written into it;
//! - [`validate`]: the checks, one file per section, and [`validate::validate`].

mod collect;
// Public for the property tests (`tests/props.rs`): the condition compiler on any input.
#[doc(hidden)]
pub mod compile;
pub mod condition;
pub mod defaults;
pub mod schema;
pub mod types;
pub mod validate;
pub mod values;
pub mod vocab;

use std::fmt;
use std::path::Path;

pub use defaults::PRIORITY as DEFAULT_PRIORITY;
pub use types::{
    AdminConfig, AliasConfig, AskedStrategy, BaseUrl, BudgetConfig, BudgetPeriod, Capabilities,
    ChainConfig, ClientKeyConfig, ClientKeySource, Config, CredentialChoice, CredentialConfig,
    DegradedPolicy, DeploymentConfig, Failover, GlobAlias, HeaderGlobs, HealthPolicy, Hedge,
    HedgeAfter, KeyRoutingConfig, KeySource, LedgerConfig, LedgerStore, Limits, Listen, LogConfig,
    LogFormat, ModelConfig, PolicyConfig, PolicyTarget, Price, ProviderConfig, ProviderKind,
    RequestConfig, ResponseConfig, RouterConfig, RoutingKnobs, RuleConfig, RuleTarget, Scheme,
    SelectEntry, StateConfig, Strategy, Weights,
};
pub use types::{
    ChecksConfig, GuardrailCheck, GuardrailMode, GuardrailProfile, GuardrailUse, GuardrailsConfig,
    RecommendConfig,
};
pub use types::{KnnConfig, KnnGranularity};
pub use validate::headers::{CREDENTIAL_HEADERS, GATEWAY_WRITTEN_HEADERS};
pub use values::{is_upstream_model_name, parse_base_url, parse_size_text, AXIS_NAMES};

/// One problem in a config file, with the key path it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    /// A URL in the message loses its userinfo and query string ([`crate::secret::redact_urls`]):
    /// errors reach `-t`, the log and admin bodies.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = match crate::secret::redact_urls(&message) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(redacted) => redacted,
        };
        Self {
            path: path.into(),
            message,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Read and validate a config file. JSON files load too: JSON is YAML.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError::new(
            "",
            format!("cannot read {}: {e}", path.display()),
        )])
    })?;
    parse(&text)
}

/// Parse and validate config text.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let max = text.len() + ALIASED_VALUES;
    if expands_past(text, max) {
        return Err(ConfigErrors(vec![ConfigError::new(
            "",
            format!(
                "the config stands for more than {max} values, its length plus {ALIASED_VALUES} \
                 (YAML aliases repeat what their anchor holds)"
            ),
        )]));
    }
    let de = serde_yaml::Deserializer::from_str(text);
    let file: schema::ConfigFile = serde_path_to_error::deserialize(de)
        .map_err(|e| collect::every_error(text, collect::error_of(&e)))?;
    validate::validate(file)
}

/// How many more values (scalars, lists, maps) than its length in bytes a config may stand
/// for once its YAML aliases are replayed. Text without aliases holds at most one value per two
/// bytes (`-\n`, `a,`), so only aliases reach the bound. serde_yaml bounds alias jumps (100 per
/// event), not what each jump replays: 8 KiB of `a0: &a0 [x, x, …]` and `a1: [*a0, *a0, …]`
/// stood for a million values and took seconds to load (`tests/props.rs`); refused now after
/// 24,000, so a load takes time in proportion to the text.
const ALIASED_VALUES: usize = 1 << 14;

/// Whether `text`, its aliases replayed, holds more than `max` values: one pass of serde_yaml
/// that counts instead of building, and stops at the bound. Any other error is left to the
/// real parse, which names its path.
fn expands_past(text: &str, max: usize) -> bool {
    use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, VariantAccess, Visitor};

    /// The values left before the bound; a visit spends one.
    struct Budget<'a>(&'a mut usize);

    impl Budget<'_> {
        fn spend<E: de::Error>(&mut self) -> Result<(), E> {
            *self.0 = self
                .0
                .checked_sub(1)
                .ok_or_else(|| E::custom("past the bound"))?;
            Ok(())
        }
    }

    impl<'de> DeserializeSeed<'de> for Budget<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    macro_rules! leaf {
        ($($visit:ident: $t:ty),*) => {$(
            fn $visit<E: de::Error>(mut self, _: $t) -> Result<(), E> {
                self.spend()
            }
        )*};
    }

    impl<'de> Visitor<'de> for Budget<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any YAML value")
        }
        leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
              visit_u128: u128, visit_f64: f64, visit_str: &str, visit_bytes: &[u8]);
        fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
            self.spend()
        }
        fn visit_none<E: de::Error>(mut self) -> Result<(), E> {
            self.spend()
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            self.spend()?;
            while seq.next_element_seed(Budget(&mut *self.0))?.is_some() {}
            Ok(())
        }
        fn visit_map<A: de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            self.spend()?;
            while map.next_key_seed(Budget(&mut *self.0))?.is_some() {
                map.next_value_seed(Budget(&mut *self.0))?;
            }
            Ok(())
        }
        fn visit_enum<A: EnumAccess<'de>>(mut self, data: A) -> Result<(), A::Error> {
            // A tagged value (`!tag x`): the tag, then what it tags.
            self.spend()?;
            let ((), contents) = data.variant_seed(Budget(&mut *self.0))?;
            contents.newtype_variant_seed(Budget(self.0))
        }
    }

    let mut left = max;
    let counted = Budget(&mut left).deserialize(serde_yaml::Deserializer::from_str(text));
    counted.is_err() && left == 0
}

/// serde_yaml prefixes its messages with its own (coarser) path; ours is already in front.
fn strip_yaml_path(path: &str, message: &str) -> String {
    match message.split_once(": ") {
        Some((prefix, rest)) if !prefix.contains(' ') && path.starts_with(prefix) => {
            rest.to_string()
        }
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1" }
models:
  m: { deployments: [{ provider: a, model: up-m }] }
"#;

    /// Every error `parse` reports, as text (shared with the other config modules' tests).
    pub(super) fn errors(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn minimal_config_loads_with_defaults() {
        let c = parse(MINIMAL).expect("valid");
        assert_eq!(c.listen.proxy, "0.0.0.0:8080");
        assert_eq!(c.failover.max_attempts, 20);
        assert_eq!(c.limits.max_request_body, 16 * 1024 * 1024);
        assert_eq!(c.providers[0].credentials[0].id, "none");
        assert_eq!(c.models[0].deployments[0].priority, DEFAULT_PRIORITY);
    }

    #[test]
    fn json_loads_too() {
        let json = r#"{"providers":{"a":{"kind":"openai","base_url":"http://127.0.0.1:1/v1"}},
                      "models":{"m":{"deployments":[{"provider":"a","model":"x"}]}}}"#;
        assert!(parse(json).is_ok());
    }

    #[test]
    fn unknown_key_is_named_with_its_path() {
        let text = MINIMAL.replace("kind: openai,", "kind: openai, colour: red,");
        let e = errors(&text);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("providers.a.colour: unknown field"),
            "{e:?}"
        );
        assert!(e[0].contains("colour"), "{e:?}");
    }

    #[test]
    fn bad_value_is_named_with_its_path() {
        let text = format!("{MINIMAL}failover: {{ deadline: soon }}\n");
        let e = errors(&text);
        assert!(
            e.iter().any(|e| e.starts_with("failover.deadline:")),
            "{e:?}"
        );
    }

    #[test]
    fn every_semantic_error_is_listed() {
        let text = r#"
providers:
  a: { kind: openai, base_url: "gopher://x" }
models:
  m: { deployments: [{ provider: nope, model: "bad model" }] }
aliases: { fast: missing }
chains: { fast: [m], c: [m, ghost] }
active_chain: other
"#;
        let e = errors(text);
        for needle in [
            "providers.a.base_url:",
            "models.m.deployments[0].provider:",
            "models.m.deployments[0].model:",
            "aliases.fast:",
            "chains.fast:",
            "chains.c[1]:",
            "active_chain:",
        ] {
            assert!(
                e.iter().any(|l| l.starts_with(needle)),
                "missing {needle} in {e:?}"
            );
        }
    }

    #[test]
    fn names_are_case_insensitive_and_unique() {
        let text = format!("{MINIMAL}aliases: {{ M: m }}\n");
        let e = errors(&text);
        assert!(e.iter().any(|l| l.starts_with("aliases.M:")), "{e:?}");
    }

    #[test]
    fn chains_resolve_aliases_and_refuse_repeats() {
        let ok = parse(&format!(
            "{MINIMAL}aliases: {{ f: m }}\nchains: {{ c: [f] }}\nactive_chain: C\n"
        ))
        .expect("valid");
        assert_eq!(ok.chains[0].models, vec![0]);
        assert_eq!(ok.active_chain, Some(0));
        let e = errors(&format!(
            "{MINIMAL}aliases: {{ f: m, g: f }}\nchains: {{ c: [m, f] }}\n"
        ));
        assert!(e.iter().any(|l| l.starts_with("aliases.g:")), "{e:?}");
        assert!(e.iter().any(|l| l.starts_with("chains.c[1]:")), "{e:?}");
    }

    #[test]
    fn chain_named_like_an_axis_is_refused() {
        let text = format!("{MINIMAL}chains: {{ fastest: [m] }}\n");
        assert!(errors(&text)
            .iter()
            .any(|l| l.starts_with("chains.fastest:")));
    }

    #[test]
    fn file_defaults_are_the_checked_defaults() {
        let c = parse(MINIMAL).expect("valid");
        assert_eq!(
            format!("{:?}", c.health),
            format!("{:?}", HealthPolicy::default())
        );
        assert_eq!(
            format!("{:?}", c.routing),
            format!("{:?}", RoutingKnobs::default())
        );
        assert_eq!(c.models[0].strategy, defaults::STRATEGY);
        assert_eq!(
            c.models[0].breaker_threshold(&c.health),
            defaults::FAILURE_THRESHOLD
        );
    }

    #[test]
    fn failure_threshold_zero_is_accepted_globally() {
        let c = parse(&format!("{MINIMAL}health: {{ failure_threshold: 0 }}\n")).expect("valid");
        assert_eq!(c.health.failure_threshold, 0);
        // A model without its own threshold follows the global one.
        assert_eq!(c.models[0].breaker_threshold(&c.health), 0);
    }

    #[test]
    fn failure_threshold_is_resolved_per_model() {
        let text = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1" }
models:
  off: { failure_threshold: 0, deployments: [{ provider: a, model: x }] }
  own: { failure_threshold: 7, deployments: [{ provider: a, model: y }] }
  inherits: { deployments: [{ provider: a, model: z }] }
health: { failure_threshold: 5 }
"#;
        let c = parse(text).expect("valid");
        let threshold = |name: &str| {
            c.models
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.breaker_threshold(&c.health))
        };
        assert_eq!(threshold("off"), Some(0));
        assert_eq!(threshold("own"), Some(7));
        assert_eq!(threshold("inherits"), Some(5));
        assert_eq!(c.health.failure_threshold, 5);
    }

    #[test]
    fn bench_after_zero_is_accepted_and_the_ceiling_kept() {
        let c = parse(&format!("{MINIMAL}health: {{ bench_after: 0 }}\n")).expect("valid");
        assert_eq!(c.health.bench_after, 0);
        let e = errors(&format!("{MINIMAL}health: {{ bench_after: 65 }}\n"));
        assert!(
            e.iter().any(|l| l.starts_with("health.bench_after:")),
            "{e:?}"
        );
    }

    #[test]
    fn unknown_key_under_a_model_is_named_with_its_path() {
        let text = MINIMAL.replace(
            "m: { deployments:",
            "m: { failure_treshold: 0, deployments:",
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("models.m.failure_treshold: unknown field `failure_treshold`"),
            "{e:?}"
        );
    }

    #[test]
    fn log_format_defaults_to_text_and_is_checked_with_its_path() {
        assert_eq!(parse(MINIMAL).expect("valid").log.format, LogFormat::Text);
        let c = parse(&format!("{MINIMAL}log: {{ format: json }}\n")).expect("valid");
        assert_eq!(c.log.format, LogFormat::Json);
        let e = errors(&format!("{MINIMAL}log: {{ format: xml }}\n"));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("log.format: unknown format \"xml\": expected one of text, json"),
            "{e:?}"
        );
        let e = errors(&format!("{MINIMAL}log: {{ formats: json }}\n"));
        assert!(
            e.iter()
                .any(|l| l.starts_with("log.formats: unknown field `formats`")),
            "{e:?}"
        );
    }

    #[test]
    fn pingora_section_is_strict() {
        let text = format!("{MINIMAL}pingora: {{ threads: 2, thread: 3 }}\n");
        let e = errors(&text);
        assert!(
            e.iter()
                .any(|l| l.starts_with("pingora.thread: unknown field `thread`")),
            "{e:?}"
        );
    }
}
