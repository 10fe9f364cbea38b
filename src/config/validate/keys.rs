//! The `keys` section: client keys, each known by its sha256 or an environment variable, with
//! what it may name (`allowed_models` globs), its rate limits and its budget.

use super::admin::is_env_name;
use crate::config::schema::{BudgetSection, KeySection};
use crate::config::types::{BudgetConfig, BudgetPeriod, ClientKeyConfig, ClientKeySource};
use crate::config::values::is_slug;
use crate::config::ConfigError;

/// The most client keys one config may hold (each is looked up per request, and listed).
pub const MAX_KEYS: usize = 10_000;
/// The most globs one key may list.
const MAX_GLOBS: usize = 256;

pub(super) fn validate_keys(
    keys: &[KeySection],
    errs: &mut Vec<ConfigError>,
) -> Vec<ClientKeyConfig> {
    if keys.len() > MAX_KEYS {
        errs.push(ConfigError::new("keys", format!("at most {MAX_KEYS} keys")));
    }
    let mut out: Vec<ClientKeyConfig> = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        let path = format!("keys[{i}]");
        if !is_slug(&k.id) {
            errs.push(ConfigError::new(
                format!("{path}.id"),
                "key ids are lower-case letters, digits, '-' and '_'",
            ));
        }
        if out.iter().any(|o| o.id == k.id) {
            errs.push(ConfigError::new(
                format!("{path}.id"),
                format!("duplicate key id {:?}", k.id),
            ));
        }
        let source = match (&k.key_sha256, &k.key_env) {
            (Some(_), Some(_)) | (None, None) => {
                errs.push(ConfigError::new(
                    &path,
                    "give exactly one of key_sha256 and key_env",
                ));
                ClientKeySource::Sha256([0; 32])
            }
            (Some(hex_digest), None) => {
                let mut digest = [0u8; 32];
                if hex_digest.len() != 64 || hex::decode_to_slice(hex_digest, &mut digest).is_err()
                {
                    errs.push(ConfigError::new(
                        format!("{path}.key_sha256"),
                        "not a sha256 digest (64 hex digits)",
                    ));
                }
                ClientKeySource::Sha256(digest)
            }
            (None, Some(env)) => {
                if !is_env_name(env) {
                    errs.push(ConfigError::new(
                        format!("{path}.key_env"),
                        format!("{env:?} is not an environment variable name"),
                    ));
                }
                ClientKeySource::Env(env.clone())
            }
        };
        if let Some(user) = &k.user {
            if user.is_empty() || user.len() > 128 || user.chars().any(char::is_control) {
                errs.push(ConfigError::new(
                    format!("{path}.user"),
                    "1 to 128 printable characters",
                ));
            }
        }
        let allowed_models = k.allowed_models.as_ref().map(|globs| {
            if globs.len() > MAX_GLOBS {
                errs.push(ConfigError::new(
                    format!("{path}.allowed_models"),
                    format!("at most {MAX_GLOBS} globs"),
                ));
            }
            globs
                .iter()
                .enumerate()
                .map(|(g, glob)| {
                    if glob.is_empty() || glob.len() > 256 || glob.chars().any(char::is_control) {
                        errs.push(ConfigError::new(
                            format!("{path}.allowed_models[{g}]"),
                            "a glob of 1 to 256 printable characters (`*` and `?` are wildcards)",
                        ));
                    }
                    glob.to_lowercase()
                })
                .collect()
        });
        if k.rpm == Some(0) {
            errs.push(ConfigError::new(
                format!("{path}.rpm"),
                "must be at least 1",
            ));
        }
        if k.tpm == Some(0) {
            errs.push(ConfigError::new(
                format!("{path}.tpm"),
                "must be at least 1",
            ));
        }
        let budget = k
            .budget
            .as_ref()
            .and_then(|b| validate_budget(b, &format!("{path}.budget"), errs));
        out.push(ClientKeyConfig {
            id: k.id.clone(),
            source,
            user: k.user.clone(),
            allowed_models,
            rpm: k.rpm,
            tpm: k.tpm,
            budget,
        });
    }
    out
}

/// `{usd, period}`: a positive finite amount (kept in micro-USD) and a calendar period.
pub(super) fn validate_budget(
    b: &BudgetSection,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<BudgetConfig> {
    let period = match b.period.as_str() {
        "day" => BudgetPeriod::Day,
        "week" => BudgetPeriod::Week,
        "month" => BudgetPeriod::Month,
        "total" => BudgetPeriod::Total,
        other => {
            errs.push(ConfigError::new(
                format!("{path}.period"),
                format!("{other:?} is not one of day, week, month, total"),
            ));
            return None;
        }
    };
    if !b.usd.is_finite() || b.usd <= 0.0 || b.usd > 1e9 {
        errs.push(ConfigError::new(
            format!("{path}.usd"),
            "a positive amount of US dollars (at most 1e9)",
        ));
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let micro_usd = (b.usd * 1e6).round() as u64;
    Some(BudgetConfig { micro_usd, period })
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, BudgetPeriod, ClientKeySource};

    const BASE: &str = "providers: { p: { kind: openai, base_url: \"http://127.0.0.1:1/v1\" } }\nmodels: { m: { deployments: [ { provider: p, model: m } ] } }\n";

    fn errors(keys: &str) -> String {
        match parse(&format!("{BASE}keys:\n{keys}")) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn keys_are_read_with_their_limits() {
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let c = parse(&format!(
            "{BASE}keys:\n  - {{ id: team, key_sha256: \"{digest}\", user: alice, allowed_models: [\"GPT-*\"], rpm: 60, tpm: 1000, budget: {{ usd: 50, period: month }} }}\n  - {{ id: ops, key_env: OPS_KEY }}\n"
        ))
        .expect("valid");
        let keys = c.keys.expect("keys");
        assert_eq!(keys[0].allowed_models, Some(vec!["gpt-*".to_string()]));
        assert_eq!(
            keys[0].budget.map(|b| (b.micro_usd, b.period)),
            Some((50_000_000, BudgetPeriod::Month))
        );
        assert!(matches!(keys[1].source, ClientKeySource::Env(ref n) if n == "OPS_KEY"));
        assert!(
            parse(BASE).expect("valid").keys.is_none(),
            "no section: no caller auth"
        );
    }

    #[test]
    fn bad_keys_are_named() {
        for (keys, expect) in [
            (
                "  - { id: a }\n",
                "keys[0]: give exactly one of key_sha256 and key_env",
            ),
            ("  - { id: a, key_sha256: abc }\n", "keys[0].key_sha256"),
            (
                "  - { id: a, key_env: X, key_sha256: abc }\n",
                "exactly one",
            ),
            ("  - { id: A!, key_env: X }\n", "keys[0].id"),
            (
                "  - { id: a, key_env: X }\n  - { id: a, key_env: Y }\n",
                "duplicate key id",
            ),
            ("  - { id: a, key_env: X, rpm: 0 }\n", "keys[0].rpm"),
            (
                "  - { id: a, key_env: X, budget: { usd: 5, period: year } }\n",
                "keys[0].budget.period",
            ),
            (
                "  - { id: a, key_env: X, budget: { usd: -1, period: day } }\n",
                "keys[0].budget.usd",
            ),
            ("  - { id: a, key_env: X, secret: 1 }\n", "secret"),
        ] {
            let e = errors(keys);
            assert!(e.contains(expect), "{keys}: {e}");
        }
    }
}
