//! `guardrails`, the profiles policies mandate (`policies.<name>.guardrails`) and `recommend`
//! (DESIGN §10).
//!
//! A profile's keys depend on its `kind`: `patterns` takes `patterns` (each bounded like a
//! rule's `$regex`: [`MAX_REGEX_LEN`](crate::config::condition::MAX_REGEX_LEN) bytes, compiled under [`REGEX_SIZE_LIMIT`](crate::config::condition::REGEX_SIZE_LIMIT));
//! `moderation` takes `provider` (an OpenAI-kind provider: the endpoint is OpenAI's) and
//! `model`; `classifier` takes `model` (a catalog model, alias or policy), `prompt` and
//! `flag_on`. Every kind takes `timeout` (default 2 s). A key another kind owns is refused with
//! its path. Profile names are what callers send in `x-llm-guardrails` and what
//! `signalbox_guardrail_checks_total` labels: a slug.

use std::collections::BTreeMap;

use super::names::{Named, Namespace};
use crate::config::schema::{
    GuardrailProfileSection, GuardrailUseSection, GuardrailsSection, PolicySection,
    RecommendSection,
};
use crate::config::types::{
    GuardrailCheck, GuardrailMode, GuardrailProfile, GuardrailUse, GuardrailsConfig,
    ProviderConfig, ProviderKind, RecommendConfig,
};
use crate::config::values::positive_duration;
use crate::config::{defaults, ConfigError};

/// The most patterns one profile may hold.
pub const MAX_PATTERNS: usize = 64;
/// The most profiles a config may define.
pub const MAX_PROFILES: usize = 64;
/// The longest a profile name may be.
const MAX_NAME: usize = 64;

/// Check `guardrails` and every policy's `guardrails` list (policies in name order, as
/// `Config::policies`). `None` when no profile is defined (a policy naming one is an error).
pub(super) fn validate_guardrails(
    file: Option<&GuardrailsSection>,
    policies: &BTreeMap<String, PolicySection>,
    providers: &[ProviderConfig],
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> Option<GuardrailsConfig> {
    let empty = BTreeMap::new();
    let sections = file.map_or(&empty, |g| &g.profiles);
    if sections.len() > MAX_PROFILES {
        errs.push(ConfigError::new(
            "guardrails.profiles",
            format!("{} profiles; at most {MAX_PROFILES}", sections.len()),
        ));
    }
    let profiles: Vec<GuardrailProfile> = sections
        .iter()
        .map(|(name, s)| profile(name, s, providers, names, errs))
        .collect();
    let uses: Vec<Vec<GuardrailUse>> = policies
        .iter()
        .map(|(policy, p)| {
            p.guardrails
                .iter()
                .enumerate()
                .filter_map(|(i, u)| {
                    let path = format!("policies.{policy}.guardrails[{i}]");
                    use_of(u, &path, &profiles, errs)
                })
                .collect()
        })
        .collect();
    if profiles.is_empty() {
        return None;
    }
    Some(GuardrailsConfig {
        profiles,
        policies: uses,
    })
}

/// A profile name: lower-case letters, digits, `-`, `_` and `.`, at most [`MAX_NAME`] bytes
/// (it is split out of a header on `,` and `:`, and is a metric label).
fn is_profile_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

fn profile(
    name: &str,
    s: &GuardrailProfileSection,
    providers: &[ProviderConfig],
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> GuardrailProfile {
    let path = format!("guardrails.profiles.{name}");
    if !is_profile_name(name) {
        errs.push(ConfigError::new(
            &path,
            format!(
                "a profile name takes lower-case letters, digits, `-`, `_` and `.` (at most {MAX_NAME})"
            ),
        ));
    }
    let timeout = s
        .timeout
        .as_deref()
        .map_or(defaults::GUARDRAIL_TIMEOUT, |t| {
            positive_duration(t, &format!("{path}.timeout"), errs)
        });
    // Which keys each kind takes; any other one set is refused with its path.
    let given: [(&str, bool); 5] = [
        ("patterns", s.patterns.is_some()),
        ("provider", s.provider.is_some()),
        ("model", s.model.is_some()),
        ("prompt", s.prompt.is_some()),
        ("flag_on", s.flag_on.is_some()),
    ];
    let takes: &[&str] = match s.kind.as_str() {
        "patterns" => &["patterns"],
        "moderation" => &["provider", "model"],
        "classifier" => &["model", "prompt", "flag_on"],
        other => {
            errs.push(ConfigError::new(
                format!("{path}.kind"),
                format!("unknown kind {other:?}; one of patterns, moderation, classifier"),
            ));
            &[]
        }
    };
    if !takes.is_empty() {
        for (key, set) in given {
            if set && !takes.contains(&key) {
                errs.push(ConfigError::new(
                    format!("{path}.{key}"),
                    format!("a {} profile does not take `{key}`", s.kind),
                ));
            }
        }
        for key in takes {
            if !given.iter().any(|(k, set)| k == key && *set) {
                errs.push(ConfigError::new(
                    &path,
                    format!("a {} profile needs `{key}`", s.kind),
                ));
            }
        }
    }
    let check = match s.kind.as_str() {
        "patterns" => GuardrailCheck::Patterns(patterns(
            s.patterns.as_deref().unwrap_or_default(),
            &path,
            errs,
        )),
        "moderation" => {
            let provider = s.provider.as_deref().unwrap_or_default();
            let at = providers.iter().position(|p| p.id == provider);
            match at {
                None if s.provider.is_some() => errs.push(ConfigError::new(
                    format!("{path}.provider"),
                    format!("no provider {provider:?}"),
                )),
                Some(i) if providers[i].kind != ProviderKind::OpenAi => {
                    errs.push(ConfigError::new(
                        format!("{path}.provider"),
                        "moderation asks OpenAI's /moderations endpoint: the provider must be of kind openai",
                    ));
                }
                _ => {}
            }
            let model = s.model.clone().unwrap_or_default();
            if s.model.is_some() && !crate::config::is_upstream_model_name(&model) {
                errs.push(ConfigError::new(
                    format!("{path}.model"),
                    "not a model name a provider can take",
                ));
            }
            GuardrailCheck::Moderation {
                provider: at.unwrap_or(0),
                model,
            }
        }
        "classifier" => {
            let model = s.model.clone().unwrap_or_default();
            if s.model.is_some() {
                callable(&model, &format!("{path}.model"), names, errs);
            }
            let flag_on = s
                .flag_on
                .as_deref()
                .unwrap_or_default()
                .trim()
                .to_lowercase();
            if s.flag_on.is_some() && flag_on.is_empty() {
                errs.push(ConfigError::new(
                    format!("{path}.flag_on"),
                    "must not be empty (every answer would flag)",
                ));
            }
            if s.prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
                errs.push(ConfigError::new(
                    format!("{path}.prompt"),
                    "must not be empty",
                ));
            }
            GuardrailCheck::Classifier {
                model,
                prompt: s.prompt.clone().unwrap_or_default(),
                flag_on,
            }
        }
        _ => GuardrailCheck::Patterns(Vec::new()),
    };
    GuardrailProfile {
        name: name.to_string(),
        check,
        timeout,
    }
}

/// Compile `patterns`, each bounded as a rule's `$regex` is.
fn patterns(raw: &[String], path: &str, errs: &mut Vec<ConfigError>) -> Vec<regex::Regex> {
    if raw.is_empty() {
        errs.push(ConfigError::new(
            format!("{path}.patterns"),
            "needs at least one pattern",
        ));
    }
    if raw.len() > MAX_PATTERNS {
        errs.push(ConfigError::new(
            format!("{path}.patterns"),
            format!("{} patterns; at most {MAX_PATTERNS}", raw.len()),
        ));
    }
    raw.iter()
        .enumerate()
        .filter_map(|(i, pattern)| {
            let at = format!("{path}.patterns[{i}]");
            match crate::config::condition::bounded_regex(pattern) {
                Ok(re) => Some(re),
                Err(why) => {
                    errs.push(ConfigError::new(at, why));
                    None
                }
            }
        })
        .collect()
}

/// `block` or `monitor`.
fn parse_mode(raw: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<GuardrailMode> {
    match raw {
        "block" => Some(GuardrailMode::Block),
        "monitor" => Some(GuardrailMode::Monitor),
        other => {
            errs.push(ConfigError::new(
                path,
                format!("{other:?} is not a mode; block or monitor"),
            ));
            None
        }
    }
}

fn use_of(
    u: &GuardrailUseSection,
    path: &str,
    profiles: &[GuardrailProfile],
    errs: &mut Vec<ConfigError>,
) -> Option<GuardrailUse> {
    let profile = profiles.iter().position(|p| p.name == u.profile);
    if profile.is_none() {
        errs.push(ConfigError::new(
            format!("{path}.profile"),
            format!("no guardrail profile {:?} (guardrails.profiles)", u.profile),
        ));
    }
    let mode = parse_mode(&u.mode, &format!("{path}.mode"), errs);
    let on_unavailable = match &u.on_unavailable {
        Some(raw) => parse_mode(raw, &format!("{path}.on_unavailable"), errs),
        None => Some(GuardrailMode::Block),
    };
    Some(GuardrailUse {
        profile: profile?,
        mode: mode?,
        on_unavailable: on_unavailable?,
    })
}

/// A name an internal call may ask: a model, an alias or a policy.
fn callable(name: &str, path: &str, names: &Namespace, errs: &mut Vec<ConfigError>) {
    if matches!(names.lookup(name), Named::Nothing) {
        errs.push(ConfigError::new(
            path,
            format!("no model, alias or policy {name:?}"),
        ));
    }
}

/// `recommend`: its decision model is a catalog model (or alias, or policy).
pub(super) fn validate_recommend(
    file: Option<&RecommendSection>,
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> Option<RecommendConfig> {
    let r = file?;
    callable(&r.decision_model, "recommend.decision_model", names, errs);
    Some(RecommendConfig {
        decision_model: r.decision_model.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_are_header_and_label_safe() {
        for good in ["no-secrets", "a.b_c", "x1"] {
            assert!(is_profile_name(good), "{good}");
        }
        for bad in ["", "A", "a,b", "a:monitor", "a b", &"x".repeat(65)] {
            assert!(!is_profile_name(bad), "{bad}");
        }
    }
}
