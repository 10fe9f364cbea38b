//! The `admin` section: which environment variables hold the admin API's tokens.

use crate::config::schema::AdminSection;
use crate::config::types::AdminConfig;
use crate::config::ConfigError;

/// Environment variable names: what a shell would accept.
pub(super) fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

pub(super) fn validate_admin(s: &AdminSection, errs: &mut Vec<ConfigError>) -> AdminConfig {
    for (key, value) in [
        ("admin.token_env", &s.token_env),
        ("admin.read_token_env", &s.read_token_env),
    ] {
        if let Some(v) = value {
            if !is_env_name(v) {
                errs.push(ConfigError::new(
                    key,
                    format!("{v:?} is not an environment variable name"),
                ));
            }
        }
    }
    if s.token_env.is_some() && s.token_env == s.read_token_env {
        errs.push(ConfigError::new(
            "admin.read_token_env",
            "the read token must differ from the write token",
        ));
    }
    AdminConfig {
        token_env: s.token_env.clone(),
        read_token_env: s.read_token_env.clone(),
    }
}
