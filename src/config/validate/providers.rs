//! `providers`: each upstream endpoint (kind, base URL, TLS trust, timeouts, priority) and
//! its `credentials` (where each API key lives; keys themselves are read by `catalog`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::config::defaults;
use crate::config::schema::{CredentialSection, ProviderKindSection, ProviderSection};
use crate::config::types::{
    CredentialChoice, CredentialConfig, Failover, KeySource, ProviderConfig, ProviderKind, Scheme,
};
use crate::config::values::{is_slug, parse_base_url, positive_duration};
use crate::config::ConfigError;

/// The providers that passed their checks, and where each id landed in `list`. A provider
/// with an error is left out (the config is refused anyway), so a deployment naming it also
/// reports "not a configured provider".
pub(super) struct Providers {
    pub list: Vec<ProviderConfig>,
    pub index: HashMap<String, usize>,
}

pub(super) fn validate_providers(
    file: &BTreeMap<String, ProviderSection>,
    failover: &Failover,
    errs: &mut Vec<ConfigError>,
) -> Providers {
    if file.is_empty() {
        errs.push(ConfigError::new(
            "providers",
            "at least one provider is required",
        ));
    }
    let mut out = Providers {
        list: Vec::with_capacity(file.len()),
        index: HashMap::new(),
    };
    for (id, section) in file {
        let path = format!("providers.{id}");
        if let Some(p) = validate_provider(id, section, failover, &path, errs) {
            out.index.insert(id.clone(), out.list.len());
            out.list.push(p);
        }
    }
    out
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
        ProviderKindSection::Anthropic => ProviderKind::Anthropic,
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
    let headers = super::headers::validate_provider_headers(&s.headers, path, errs);
    let credential_choice = match s.credential_choice.as_deref() {
        None => CredentialChoice::RoundRobin,
        Some(name) => CredentialChoice::parse(name).unwrap_or_else(|| {
            errs.push(ConfigError::new(
                format!("{path}.credential_choice"),
                format!(
                    "unknown credential choice {name:?} ({})",
                    CredentialChoice::NAMES
                ),
            ));
            CredentialChoice::RoundRobin
        }),
    };
    if errs.len() != before {
        return None;
    }
    Some(ProviderConfig {
        id: id.to_string(),
        kind,
        base_url: base_url?,
        credentials,
        priority: s.priority.unwrap_or(defaults::PRIORITY),
        ca_file: s.ca_file.as_ref().map(PathBuf::from),
        connect_timeout,
        ttfb_timeout,
        enabled: s.enabled,
        budget: None,
        headers,
        credential_choice,
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
