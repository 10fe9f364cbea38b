//! `rules`: conditional rules consulted, in the order written, when a request names `auto`.
//! Each holds a condition (`when`, compiled here) and a target (`then`): a chain as
//! `auto:<chain>`, an axis as `auto:<axis>`, or a policy name. At most [`MAX_RULES`]. Written
//! as a list, or as the rule set's long form `{enabled, default, rules}` (seed 000): a set
//! switched off is validated all the same.

use super::names::Namespace;
use crate::config::compile::compile_condition;
use crate::config::condition::MAX_RULES;
use crate::config::schema::{ListOr, RuleSection, RuleSetSection};
use crate::config::types::{ChainConfig, RuleConfig, RuleTarget};
use crate::config::values::AXIS_NAMES;
use crate::config::ConfigError;

/// The validated rule set.
pub(super) struct RuleSet {
    pub rules: Vec<RuleConfig>,
    pub enabled: bool,
    pub default: Option<RuleTarget>,
}

pub(super) fn validate_rule_set(
    file: &ListOr<RuleSection, RuleSetSection>,
    chains: &[ChainConfig],
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> RuleSet {
    match file {
        ListOr::List(list) => RuleSet {
            rules: validate_rules(list, "rules", chains, names, errs),
            enabled: true,
            default: None,
        },
        ListOr::Long(set) => RuleSet {
            rules: validate_rules(&set.rules, "rules.rules", chains, names, errs),
            enabled: set.enabled,
            default: set
                .default
                .as_deref()
                .and_then(|d| rule_target(d, chains, names, "rules.default", errs)),
        },
    }
}

fn validate_rules(
    file: &[RuleSection],
    at: &str,
    chains: &[ChainConfig],
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<RuleConfig> {
    if file.len() > MAX_RULES {
        errs.push(ConfigError::new(
            at,
            format!("{} rules; at most {MAX_RULES}", file.len()),
        ));
        return Vec::new();
    }
    let mut rules = Vec::with_capacity(file.len());
    for (i, rule) in file.iter().enumerate() {
        let path = format!("{at}[{i}]");
        let when = compile_condition(&rule.when, &format!("{path}.when"), errs);
        let then = rule_target(&rule.then, chains, names, &format!("{path}.then"), errs);
        if let (Some(when), Some(then)) = (when, then) {
            rules.push(RuleConfig { when, then });
        }
    }
    rules
}

/// What `then` names (case-insensitive, like every name callers send).
fn rule_target(
    then: &str,
    chains: &[ChainConfig],
    names: &Namespace,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<RuleTarget> {
    let lower = then.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("auto:") {
        if let Some(c) = chains
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(rest))
        {
            return Some(RuleTarget::Chain(c));
        }
        if AXIS_NAMES.contains(&rest) {
            return Some(RuleTarget::Axis(rest.to_string()));
        }
        errs.push(ConfigError::new(
            path,
            format!(
                "{then:?} names no chain and no axis (axes: {})",
                AXIS_NAMES.join(", ")
            ),
        ));
        return None;
    }
    if let Some(p) = names.policy(then) {
        return Some(RuleTarget::Policy(p));
    }
    let why = if lower == "auto" {
        "`auto` is what the rules decide for".to_string()
    } else if names.is_model(then) {
        format!("{then:?} is a model or alias, which a rule cannot name")
    } else {
        format!("{then:?} names nothing")
    };
    errs.push(ConfigError::new(
        path,
        format!("{why}; write auto:<chain>, auto:<axis> or a policy name"),
    ));
    None
}

#[cfg(test)]
mod tests {
    use crate::config::condition::MAX_RULES;
    use crate::config::{parse, RuleTarget};

    const BASE: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1" }
models:
  big: { deployments: [{ provider: a, model: up-big }] }
  mini: { deployments: [{ provider: a, model: up-mini }] }
aliases: { fast: mini }
chains: { economy: [mini], premium: [big, mini] }
policies:
  support: { select: [ { router: priority, targets: [ { model: big }, { model: mini } ] } ] }
  canary: { select: [ { router: weighted, targets: [ { model: big, weight: 1 } ] } ] }
"#;

    fn errors(extra: &str) -> Vec<String> {
        match parse(&format!("{BASE}{extra}")) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn rule_targets_resolve_in_file_order() {
        let c = parse(&format!(
            "{BASE}{}",
            r#"
rules:
  - when: { $and: [ { params.tools: true }, { metadata.team: { $in: [search, ads] } } ] }
    then: auto:Smart
  - when: { params.stream: true }
    then: Support
  - when: { key.user: alice }
    then: AUTO:premium
  - when: { budget.used_pct: { $gte: 90 } }
    then: auto:cheap
  - when: { params.model: auto }
    then: canary
"#
        ))
        .expect("valid");
        let then: Vec<RuleTarget> = c.rules.iter().map(|r| r.then.clone()).collect();
        // Policies are in name order: canary 0, support 1; chains: economy 0, premium 1.
        assert_eq!(
            then,
            vec![
                RuleTarget::Axis("smart".into()),
                RuleTarget::Policy(1),
                RuleTarget::Chain(1),
                RuleTarget::Axis("cheap".into()),
                RuleTarget::Policy(0),
            ]
        );
    }

    #[test]
    fn a_rule_then_naming_nothing_is_refused() {
        let e = errors(
            r#"
rules:
  - { when: { params.stream: true }, then: auto:nowhere }
  - { when: { params.stream: true }, then: nowhere }
  - { when: { params.stream: true }, then: fast }
  - { when: { params.stream: true }, then: auto }
  - { when: { params.stream: true }, then: "" }
"#,
        );
        for (path, fragment) in [
            (
                "rules[0].then",
                "\"auto:nowhere\" names no chain and no axis",
            ),
            ("rules[1].then", "\"nowhere\" names nothing"),
            ("rules[2].then", "\"fast\" is a model or alias"),
            ("rules[3].then", "`auto` is what the rules decide for"),
            ("rules[4].then", "names nothing"),
        ] {
            assert!(
                e.iter()
                    .any(|l| l.starts_with(&format!("{path}: ")) && l.contains(fragment)),
                "missing {path}: …{fragment}… in {e:#?}"
            );
        }
        assert_eq!(e.len(), 5, "{e:#?}");
    }

    #[test]
    fn rule_conditions_are_refused_with_their_path() {
        let e = errors(
            r#"
rules:
  - { when: { params.stream: true }, then: support }
  - { when: { params.tools: true }, then: support }
  - when: { $and: [ { params.tools: true }, { metadata.team: { $inn: [search] } } ] }
    then: support
  - { when: {}, then: support }
  - { when: null, then: support }
"#,
        );
        assert_eq!(
            e,
            vec![
                "rules[2].when.$and[1].metadata.team: unknown operator `$inn` ($eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $regex)",
                "rules[3].when: an empty condition; write a field or `$and`/`$or`",
                "rules[4].when: a condition is an object such as { params.stream: true }, found null",
            ]
        );
        // `when` is required, `then` too, and nothing else is allowed.
        let e = errors("rules:\n  - { then: support }\n");
        assert!(e[0].starts_with("rules[0]: missing field `when`"), "{e:?}");
        let e = errors("rules:\n  - { when: { params.stream: true }, then: support, else: x }\n");
        assert!(
            e[0].starts_with("rules[0].else: unknown field `else`"),
            "{e:?}"
        );
    }

    #[test]
    fn the_long_form_carries_the_switches_and_its_errors_their_paths() {
        let c = parse(&format!(
            "{BASE}rules:\n  enabled: false\n  default: auto:premium\n  rules:\n    - {{ when: {{ params.stream: true }}, then: support }}\n"
        ))
        .expect("valid");
        assert!(!c.rules_enabled);
        assert_eq!(c.rules_default, Some(RuleTarget::Chain(1)));
        assert_eq!(c.rules.len(), 1);
        let c = parse(&format!("{BASE}rules: {{ default: null }}\n")).expect("valid");
        assert!(c.rules_enabled && c.rules_default.is_none() && c.rules.is_empty());
        // Switched off, still validated; the default is checked like any `then`.
        let e = errors(
            "rules:\n  enabled: false\n  default: fast\n  rules:\n    - { when: { params.stream: true }, then: auto:nowhere }\n",
        );
        assert!(
            e.iter().any(|l| l.starts_with("rules.rules[0].then: ")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|l| l.starts_with("rules.default: ") && l.contains("is a model or alias")),
            "{e:?}"
        );
        let e = errors("rules: { enabled: true, colour: red }\n");
        assert!(e[0].starts_with("rules.colour: unknown field"), "{e:?}");
        let e = errors("rules:\n  rules:\n    - { then: support }\n");
        assert!(
            e[0].starts_with("rules.rules[0]: missing field `when`"),
            "{e:?}"
        );
        let e = errors("rules: 3\n");
        assert!(e[0].starts_with("rules: "), "{e:?}");
    }

    #[test]
    fn at_most_max_rules() {
        let rules = |n: usize| {
            let mut s = String::from("rules:\n");
            for i in 0..n {
                s.push_str(&format!(
                    "  - {{ when: {{ metadata.n: {i} }}, then: support }}\n"
                ));
            }
            s
        };
        let c = parse(&format!("{BASE}{}", rules(MAX_RULES))).expect("valid");
        assert_eq!(c.rules.len(), MAX_RULES);
        assert_eq!(
            errors(&rules(MAX_RULES + 1)),
            vec!["rules: 257 rules; at most 256"]
        );
    }

    #[test]
    fn json_policies_and_rules_load() {
        let json = r#"{"providers": {"a": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
            "models": {"m": {"deployments": [{"provider": "a", "model": "x"}]}},
            "policies": {"p": {"select": [{"when": {"metadata.tier": {"$eq": "free"}}, "router": "priority", "targets": [{"model": "m"}]},
                                         {"router": "complexity", "tiers": {"simple": "m", "medium": "m", "complex": "m"}}]}},
            "rules": [{"when": {"$or": [{"params.max_tokens": {"$gt": 1000}}, {"key.id": "k"}]}, "then": "p"}]}"#;
        let c = parse(json).expect("valid");
        assert_eq!(c.policies.len(), 1);
        assert_eq!(c.rules[0].then, RuleTarget::Policy(0));
    }
}
