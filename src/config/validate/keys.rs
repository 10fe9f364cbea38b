//! The `keys` section: client keys, each known by its sha256 or an environment variable, with
//! what it may name (`allowed_models` globs), its rate limits, its budget and its own routing
//! (`routing`: strategy, provider order and exclusions, attempt bound; providers resolved to
//! indices here).

use super::admin::is_env_name;
use super::models::strategy_names;
use super::providers::Providers;
use crate::config::schema::{BudgetSection, KeyRoutingSection, KeySection};
use crate::config::types::{
    AskedStrategy, BudgetConfig, BudgetPeriod, ClientKeyConfig, ClientKeySource, KeyRoutingConfig,
    MAX_ATTEMPTS_CEILING,
};
use crate::config::values::is_slug;
use crate::config::ConfigError;

/// The most client keys one config may hold (each is looked up per request, and listed).
pub const MAX_KEYS: usize = 10_000;
/// The most globs one key may list.
const MAX_GLOBS: usize = 256;

pub(super) fn validate_keys(
    keys: &[KeySection],
    providers: &Providers,
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
        let routing = k
            .routing
            .as_ref()
            .map(|r| validate_key_routing(r, providers, &format!("{path}.routing"), errs));
        out.push(ClientKeyConfig {
            id: k.id.clone(),
            source,
            user: k.user.clone(),
            allowed_models,
            rpm: k.rpm,
            tpm: k.tpm,
            budget,
            routing,
        });
    }
    out
}

/// `keys[].routing`: a strategy a request could ask for, provider ids that exist (each listed
/// once, none both ordered and excluded), and an attempt bound of at least one.
fn validate_key_routing(
    r: &KeyRoutingSection,
    providers: &Providers,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> KeyRoutingConfig {
    let strategy = r.strategy.as_deref().and_then(|name| {
        let asked = AskedStrategy::parse(name);
        if asked.is_none() {
            errs.push(ConfigError::new(
                format!("{path}.strategy"),
                format!(
                    "unknown strategy {name:?}; one of smart, {}",
                    strategy_names()
                ),
            ));
        }
        asked
    });
    let ids = |field: &str, list: Option<&Vec<String>>, errs: &mut Vec<ConfigError>| {
        let mut out: Vec<usize> = Vec::new();
        for (i, id) in list.into_iter().flatten().enumerate() {
            let at = format!("{path}.{field}[{i}]");
            match providers.index.get(id) {
                None => errs.push(ConfigError::new(
                    at,
                    format!("{id:?} is not a configured provider"),
                )),
                Some(p) if out.contains(p) => {
                    errs.push(ConfigError::new(at, format!("{id:?} is listed twice")));
                }
                Some(&p) => out.push(p),
            }
        }
        out
    };
    let provider_order = ids("provider_order", r.provider_order.as_ref(), errs);
    let exclude_providers = ids("exclude_providers", r.exclude_providers.as_ref(), errs);
    for (i, p) in exclude_providers.iter().enumerate() {
        if provider_order.contains(p) {
            errs.push(ConfigError::new(
                format!("{path}.exclude_providers[{i}]"),
                format!(
                    "{:?} is in provider_order too; a provider is ordered or excluded, not both",
                    providers.list[*p].id
                ),
            ));
        }
    }
    if let Some(n) = r.max_attempts {
        if n == 0 || n > MAX_ATTEMPTS_CEILING {
            errs.push(ConfigError::new(
                format!("{path}.max_attempts"),
                format!("1 to {MAX_ATTEMPTS_CEILING}"),
            ));
        }
    }
    KeyRoutingConfig {
        strategy,
        provider_order,
        exclude_providers,
        max_attempts: r
            .max_attempts
            .filter(|n| (1..=MAX_ATTEMPTS_CEILING).contains(n)),
    }
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
    use crate::config::{
        parse, AskedStrategy, BudgetPeriod, ClientKeySource, KeyRoutingConfig, Strategy,
    };

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
        assert_eq!(keys[0].routing, None, "no routing of its own");
        assert!(
            parse(BASE).expect("valid").keys.is_none(),
            "no section: no caller auth"
        );
    }

    #[test]
    fn a_keys_routing_is_read_with_its_providers_resolved() {
        let two = BASE.replace(
            "providers: { p:",
            "providers: { q: { kind: openai, base_url: \"http://127.0.0.1:2/v1\" }, p:",
        );
        let c = parse(&format!(
            "{two}keys:\n  - {{ id: a, key_env: X, routing: {{ strategy: smart, provider_order: [q], exclude_providers: [p], max_attempts: 2 }} }}\n  - {{ id: b, key_env: Y, routing: {{}} }}\n"
        ))
        .expect("valid");
        let keys = c.keys.expect("keys");
        let (p, q) = (
            c.providers.iter().position(|x| x.id == "p").expect("p"),
            c.providers.iter().position(|x| x.id == "q").expect("q"),
        );
        let r = keys[0].routing.as_ref().expect("routing");
        assert_eq!(
            r.strategy,
            Some(AskedStrategy {
                strategy: Strategy::PriorityCheapest,
                smart_fallback: true
            }),
            "the names a request's routing.strategy accepts, smart among them"
        );
        assert_eq!(
            (
                &r.provider_order[..],
                &r.exclude_providers[..],
                r.max_attempts
            ),
            (&[q][..], &[p][..], Some(2))
        );
        assert_eq!(keys[1].routing, Some(KeyRoutingConfig::default()));
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
            (
                "  - { id: a, key_env: X, routing: { strategy: cheapest, order: [p] } }\n",
                "unknown field `order`",
            ),
            (
                "  - { id: a, key_env: X, routing: { provider_order: [p, nope] } }\n",
                "keys[0].routing.provider_order[1]: \"nope\" is not a configured provider",
            ),
            (
                "  - { id: a, key_env: X, routing: { exclude_providers: [gone] } }\n",
                "keys[0].routing.exclude_providers[0]: \"gone\" is not a configured provider",
            ),
            (
                "  - { id: a, key_env: X, routing: { strategy: quickest } }\n",
                "keys[0].routing.strategy: unknown strategy \"quickest\"",
            ),
            (
                "  - { id: a, key_env: X, routing: { max_attempts: 0 } }\n",
                "keys[0].routing.max_attempts",
            ),
            (
                "  - { id: a, key_env: X, routing: { provider_order: [p, p] } }\n",
                "keys[0].routing.provider_order[1]: \"p\" is listed twice",
            ),
            (
                "  - { id: a, key_env: X, routing: { provider_order: [p], exclude_providers: [p] } }\n",
                "keys[0].routing.exclude_providers[0]",
            ),
        ] {
            let e = errors(keys);
            assert!(e.contains(expect), "{keys}: {e}");
        }
    }
}
