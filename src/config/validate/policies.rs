//! `policies`: named routing policies. Each has `select` entries (a condition and a router over
//! models: `weighted`, `priority`, `complexity` or `strategy`, each with exactly its own keys),
//! `on_failure` models, and its own deployment `strategy`, client-error failover and attempt
//! limit. Names are claimed in the shared catalog namespace (see `names`); every model a
//! policy names is resolved to its index, and a policy never names another policy.

use std::collections::BTreeMap;

use super::failover::MAX_ATTEMPTS_CEILING;
use super::models::strategy_names;
use super::names::{Named, Namespace};
use crate::attempt::verdict::{classify_status, StatusClass};
use crate::config::compile::compile_condition;
use crate::config::defaults;
use crate::config::schema::{
    PolicySection, RetrySection, RouterKindSection, SelectSection, TargetSection,
};
use crate::config::types::{
    Failover, ModelConfig, PolicyConfig, PolicyRetry, PolicyTarget, RouterConfig, SelectEntry,
    Strategy,
};
use crate::config::values::parse_duration;
use crate::config::ConfigError;

/// Check every policy, claiming all their names first (so a policy naming another one is
/// recognised whatever the order).
pub(super) fn validate_policies(
    file: &BTreeMap<String, PolicySection>,
    models: &[ModelConfig],
    failover: &Failover,
    names: &mut Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<PolicyConfig> {
    for (index, name) in file.keys().enumerate() {
        names.add_policy(name, index, &format!("policies.{name}"), errs);
    }
    let ctx = Ctx {
        models,
        names,
        failover,
    };
    file.iter()
        .map(|(name, section)| ctx.policy(name, section, errs))
        .collect()
}

/// The most targets a knn entry ranks (its routes are every order of them: 5! = 120).
pub(crate) const KNN_MAX_TARGETS: usize = 5;

/// The largest `retry.attempts` accepted (as `failover.transient_retries`).
const RETRY_ATTEMPTS_CEILING: u32 = 5;

/// A policy's same-target retries: at most [`RETRY_ATTEMPTS_CEILING`], a backoff, statuses
/// that are failures (a 2xx or a caller's 4xx cannot take a retry).
fn retry(r: &RetrySection, path: &str, errs: &mut Vec<ConfigError>) -> PolicyRetry {
    if r.attempts > RETRY_ATTEMPTS_CEILING {
        errs.push(ConfigError::new(
            format!("{path}.attempts"),
            format!("must be between 0 and {RETRY_ATTEMPTS_CEILING}"),
        ));
    }
    let backoff = match &r.backoff {
        Some(text) => parse_duration(text, &format!("{path}.backoff"), errs).unwrap_or_default(),
        None => defaults::TRANSIENT_BACKOFF,
    };
    let on_status = r
        .on_status
        .clone()
        .unwrap_or_else(|| defaults::RETRY_ON_STATUS.to_vec());
    for (i, &code) in on_status.iter().enumerate() {
        // The verdict's own table says which statuses are failures.
        let failure = matches!(classify_status(code), StatusClass::Failure { .. });
        if !failure || !(100..=599).contains(&code) {
            errs.push(ConfigError::new(
                format!("{path}.on_status[{i}]"),
                format!("{code} is not a failure status (a 2xx or a caller's 4xx never retries)"),
            ));
        }
    }
    PolicyRetry {
        attempts: r.attempts.min(RETRY_ATTEMPTS_CEILING),
        backoff,
        on_status,
    }
}

/// What a policy's checks read.
struct Ctx<'a> {
    models: &'a [ModelConfig],
    names: &'a Namespace,
    failover: &'a Failover,
}

impl Ctx<'_> {
    fn policy(&self, name: &str, s: &PolicySection, errs: &mut Vec<ConfigError>) -> PolicyConfig {
        let path = format!("policies.{name}");
        if s.select.is_empty() {
            errs.push(ConfigError::new(
                format!("{path}.select"),
                "a policy needs at least one select entry",
            ));
        }
        let last = s.select.len().saturating_sub(1);
        let mut select = Vec::with_capacity(s.select.len());
        for (i, entry) in s.select.iter().enumerate() {
            let epath = format!("{path}.select[{i}]");
            if entry.when.is_none() && i != last {
                errs.push(ConfigError::new(
                    &epath,
                    "only the last select entry may omit `when` (an entry without it always \
                     matches, so the entries after it could never be selected)",
                ));
            }
            let when = entry
                .when
                .as_ref()
                .and_then(|w| compile_condition(w, &format!("{epath}.when"), errs));
            if let Some(router) = self.router(entry, &epath, errs) {
                select.push(SelectEntry { when, router });
            }
        }

        let mut on_failure: Vec<usize> = Vec::with_capacity(s.on_failure.len());
        for (i, model) in s.on_failure.iter().enumerate() {
            let mpath = format!("{path}.on_failure[{i}]");
            match self.model(model, &mpath, errs) {
                Some(m) if on_failure.contains(&m) => errs.push(ConfigError::new(
                    &mpath,
                    format!("{model:?} names a model already in on_failure"),
                )),
                Some(m) => on_failure.push(m),
                None => {}
            }
        }

        let spath = format!("{path}.strategy");
        let strategy = s
            .strategy
            .as_deref()
            .and_then(|st| parse_strategy(st, &spath, errs));
        if strategy == Some(Strategy::Weighted) {
            self.check_every_model_weighted(&select, &on_failure, &spath, errs);
        }

        if let Some(n) = s.max_attempts {
            if n == 0 || n > MAX_ATTEMPTS_CEILING {
                errs.push(ConfigError::new(
                    format!("{path}.max_attempts"),
                    format!("must be between 1 and {MAX_ATTEMPTS_CEILING}"),
                ));
            } else if n > self.failover.max_attempts {
                // Never silently capped: the request-wide bound is the smaller one.
                errs.push(ConfigError::new(
                    format!("{path}.max_attempts"),
                    format!(
                        "{n} is above failover.max_attempts ({}); raise that first",
                        self.failover.max_attempts
                    ),
                ));
            }
        }
        let retry = s
            .retry
            .as_ref()
            .map(|r| retry(r, &format!("{path}.retry"), errs));

        let hedge = s
            .hedge
            .as_ref()
            .map(|h| super::failover::validate_hedge(h, &format!("{path}.hedge"), errs));

        PolicyConfig {
            name: name.to_string(),
            select,
            on_failure,
            strategy,
            failover_on_client_error: s.failover_on_client_error,
            max_attempts: s.max_attempts,
            retry,
            hedge,
        }
    }

    /// The router of one `select` entry, with exactly its own keys; `None` after an error.
    fn router(
        &self,
        e: &SelectSection,
        epath: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Option<RouterConfig> {
        let before = errs.len();
        let kind = e.router;
        let name = kind.as_str();
        if kind == RouterKindSection::Complexity {
            if e.targets.is_some() {
                errs.push(ConfigError::new(
                    format!("{epath}.targets"),
                    "router complexity takes `tiers` (simple, medium, complex), not `targets`",
                ));
            }
        } else if e.tiers.is_some() {
            errs.push(ConfigError::new(
                format!("{epath}.tiers"),
                format!("`tiers` belongs to router complexity; router {name} takes `targets`"),
            ));
        }
        if kind != RouterKindSection::Knn && e.default.is_some() {
            errs.push(ConfigError::new(
                format!("{epath}.default"),
                format!("`default` belongs to router knn, not router {name}"),
            ));
        }
        if kind != RouterKindSection::Strategy && e.strategy.is_some() {
            errs.push(ConfigError::new(
                format!("{epath}.strategy"),
                format!(
                    "`strategy` belongs to router strategy, not router {name} (the policy's own \
                     `strategy`, beside `select`, orders each model's deployments)"
                ),
            ));
        }

        let router = match kind {
            RouterKindSection::Complexity => self.tiers(e, epath, errs),
            RouterKindSection::Weighted => {
                let targets = self.targets(e, epath, errs)?;
                if !targets.iter().any(|t| t.weight.is_some_and(|w| w > 0.0)) {
                    errs.push(ConfigError::new(
                        format!("{epath}.targets"),
                        "router weighted needs at least one target with a positive weight",
                    ));
                }
                Some(RouterConfig::Weighted(targets))
            }
            RouterKindSection::Priority => {
                Some(RouterConfig::Priority(self.targets(e, epath, errs)?))
            }
            RouterKindSection::Strategy => {
                let targets = self.targets(e, epath, errs);
                let spath = format!("{epath}.strategy");
                let strategy = match &e.strategy {
                    None => {
                        errs.push(ConfigError::new(
                            epath,
                            format!(
                                "router strategy needs `strategy` (one of {})",
                                strategy_names()
                            ),
                        ));
                        None
                    }
                    Some(st) => parse_strategy(st, &spath, errs),
                };
                let targets = targets?;
                if strategy == Some(Strategy::Weighted)
                    && !targets.iter().any(|t| self.has_weight(t.model))
                {
                    errs.push(ConfigError::new(
                        &spath,
                        "the weighted strategy needs a deployment with a positive weight among \
                         the targets' deployments",
                    ));
                }
                Some(RouterConfig::Strategy {
                    strategy: strategy?,
                    targets,
                })
            }
            RouterKindSection::Knn => self.knn(e, epath, errs),
        };
        router.filter(|_| errs.len() == before)
    }

    /// `targets` of a weighted, priority or strategy router.
    fn targets(
        &self,
        e: &SelectSection,
        epath: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Option<Vec<PolicyTarget>> {
        let kind = e.router;
        let Some(list) = &e.targets else {
            errs.push(ConfigError::new(
                epath,
                format!("router {} needs `targets`", kind.as_str()),
            ));
            return None;
        };
        let tpath = format!("{epath}.targets");
        if list.is_empty() {
            errs.push(ConfigError::new(&tpath, "needs at least one target"));
            return None;
        }
        let mut out: Vec<PolicyTarget> = Vec::with_capacity(list.len());
        for (i, TargetSection { model, weight }) in list.iter().enumerate() {
            let ipath = format!("{tpath}[{i}]");
            if let Some(w) = weight {
                if kind != RouterKindSection::Weighted {
                    errs.push(ConfigError::new(
                        format!("{ipath}.weight"),
                        format!(
                            "`weight` is only for router weighted, not {}",
                            kind.as_str()
                        ),
                    ));
                } else if !w.is_finite() || *w < 0.0 {
                    errs.push(ConfigError::new(
                        format!("{ipath}.weight"),
                        "weights must be finite and not negative",
                    ));
                }
            }
            match self.model(model, &format!("{ipath}.model"), errs) {
                Some(m) if out.iter().any(|t| t.model == m) => errs.push(ConfigError::new(
                    &ipath,
                    format!("{model:?} names a model this entry already targets"),
                )),
                Some(m) => out.push(PolicyTarget {
                    model: m,
                    weight: *weight,
                }),
                None => {}
            }
        }
        Some(out)
    }

    /// A knn router: its targets (at most [`KNN_MAX_TARGETS`]: one route is compiled per order
    /// of them) and its `default`, a model. Its settings (`routing_knn`) and the targets'
    /// prices are checked with that section (`validate::knn`).
    fn knn(
        &self,
        e: &SelectSection,
        epath: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Option<RouterConfig> {
        let targets = self.targets(e, epath, errs);
        if targets.as_ref().is_some_and(|t| t.len() > KNN_MAX_TARGETS) {
            errs.push(ConfigError::new(
                format!("{epath}.targets"),
                format!(
                    "router knn ranks at most {KNN_MAX_TARGETS} targets (one route is compiled \
                     per order of them)"
                ),
            ));
        }
        let default = match &e.default {
            None => {
                errs.push(ConfigError::new(
                    epath,
                    "router knn needs `default`: the model that serves while it cannot decide",
                ));
                None
            }
            Some(d) => self.model(d, &format!("{epath}.default"), errs),
        };
        Some(RouterConfig::Knn {
            targets: targets?,
            default: default?,
        })
    }

    /// `tiers` of a complexity router: all three, each a model or alias (tiers may share one).
    fn tiers(
        &self,
        e: &SelectSection,
        epath: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Option<RouterConfig> {
        let Some(t) = &e.tiers else {
            errs.push(ConfigError::new(
                epath,
                "router complexity needs `tiers` with simple, medium and complex",
            ));
            return None;
        };
        let mut tier = |key: &str, model: &Option<String>| -> Option<usize> {
            let Some(model) = model else {
                errs.push(ConfigError::new(
                    format!("{epath}.tiers"),
                    format!("missing `{key}`: router complexity needs simple, medium and complex"),
                ));
                return None;
            };
            self.model(model, &format!("{epath}.tiers.{key}"), errs)
        };
        let simple = tier("simple", &t.simple);
        let medium = tier("medium", &t.medium);
        let complex = tier("complex", &t.complex);
        Some(RouterConfig::Complexity {
            simple: simple?,
            medium: medium?,
            complex: complex?,
        })
    }

    /// The model a target, tier or `on_failure` entry names.
    fn model(&self, name: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<usize> {
        match self.names.lookup(name) {
            Named::Model(m) => Some(m),
            Named::Policy => {
                errs.push(ConfigError::new(
                    path,
                    format!("{name:?} is a policy; a policy cannot refer to another policy"),
                ));
                None
            }
            Named::Nothing => {
                errs.push(ConfigError::new(
                    path,
                    format!("{name:?} is not a model or alias"),
                ));
                None
            }
        }
    }

    /// Whether model `m` has a deployment with a positive weight.
    fn has_weight(&self, m: usize) -> bool {
        self.models.get(m).is_some_and(|model| {
            model
                .deployments
                .iter()
                .any(|d| d.weight.is_some_and(|w| w > 0.0))
        })
    }

    /// A policy-wide `strategy: weighted` orders every model it names by deployment weights.
    fn check_every_model_weighted(
        &self,
        select: &[SelectEntry],
        on_failure: &[usize],
        path: &str,
        errs: &mut Vec<ConfigError>,
    ) {
        let mut named: Vec<usize> = on_failure.to_vec();
        for entry in select {
            match &entry.router {
                RouterConfig::Weighted(t)
                | RouterConfig::Priority(t)
                | RouterConfig::Strategy { targets: t, .. } => {
                    named.extend(t.iter().map(|t| t.model));
                }
                RouterConfig::Knn { targets, default } => {
                    named.extend(targets.iter().map(|t| t.model));
                    named.push(*default);
                }
                RouterConfig::Complexity {
                    simple,
                    medium,
                    complex,
                } => named.extend([*simple, *medium, *complex]),
            }
        }
        named.sort_unstable();
        named.dedup();
        let unweighted: Vec<&str> = named
            .into_iter()
            .filter(|m| !self.has_weight(*m))
            .filter_map(|m| self.models.get(m).map(|model| model.name.as_str()))
            .collect();
        if !unweighted.is_empty() {
            errs.push(ConfigError::new(
                path,
                format!(
                    "the weighted strategy needs a deployment with a positive weight in every \
                     model the policy names; none in {}",
                    unweighted.join(", ")
                ),
            ));
        }
    }
}

/// A strategy that orders deployments: any of [`Strategy::parse`]'s names but `chain`.
fn parse_strategy(name: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<Strategy> {
    match Strategy::parse(name) {
        Some(Strategy::Chain) => {
            errs.push(ConfigError::new(
                path,
                "`chain` orders chains, not deployments; for the order written use router \
                 priority",
            ));
            None
        }
        Some(s) => Some(s),
        None => {
            errs.push(ConfigError::new(
                path,
                format!("unknown strategy {name:?}; one of {}", strategy_names()),
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{parse, PolicyTarget, RouterConfig, Strategy};

    const BASE: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1" }
models:
  big: { deployments: [{ provider: a, model: up-big, weight: 2 }] }
  mini: { deployments: [{ provider: a, model: up-mini }] }
  small: { deployments: [{ provider: a, model: up-small, weight: 1 }] }
aliases: { fast: mini }
chains: { everything: [big, mini, small] }
"#;

    fn errors(extra: &str) -> Vec<String> {
        match parse(&format!("{BASE}{extra}")) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    /// Every `(path prefix, message fragment)` is among the errors of `extra`.
    fn refused(extra: &str, expected: &[(&str, &str)]) {
        let e = errors(extra);
        for (path, fragment) in expected {
            assert!(
                e.iter()
                    .any(|l| l.starts_with(&format!("{path}: ")) && l.contains(fragment)),
                "missing {path}: …{fragment}… in {e:#?}"
            );
        }
    }

    fn target(model: usize, weight: Option<f64>) -> PolicyTarget {
        PolicyTarget { model, weight }
    }

    #[test]
    fn every_router_kind_loads_into_checked_values() {
        let c = parse(&format!(
            "{BASE}{}",
            r#"
policies:
  support:
    select:
      - when: { metadata.tier: free }
        router: weighted
        targets: [ { model: fast, weight: 7 }, { model: small, weight: 3 }, { model: big } ]
      - router: priority
        targets: [ { model: big }, { model: SMALL } ]
    on_failure: [ small, fast ]
    strategy: priority_cheapest
    failover_on_client_error: true
    max_attempts: 6
  Tiered:
    select: [ { router: complexity, tiers: { simple: fast, medium: small, complex: big } } ]
  pool:
    select: [ { router: strategy, strategy: latency, targets: [ { model: mini }, { model: big } ] } ]
  canary:
    strategy: canary
    select: [ { router: weighted, targets: [ { model: big, weight: 0.5 }, { model: small, weight: 0 } ] } ]
"#
        ))
        .expect("valid");
        let names: Vec<&str> = c.policies.iter().map(|p| p.name.as_str()).collect();
        // In name order (byte order of the names as written).
        assert_eq!(names, ["Tiered", "canary", "pool", "support"]);
        let (big, mini, small) = (0, 1, 2);

        let tiered = &c.policies[0];
        assert_eq!(tiered.select.len(), 1);
        assert!(tiered.select[0].when.is_none());
        assert!(matches!(
            tiered.select[0].router,
            RouterConfig::Complexity { simple, medium, complex }
                if (simple, medium, complex) == (mini, small, big)
        ));
        assert_eq!(tiered.strategy, None);
        assert_eq!(tiered.max_attempts, None);
        assert!(!tiered.failover_on_client_error);
        assert!(tiered.on_failure.is_empty());

        let canary = &c.policies[1];
        assert_eq!(canary.strategy, Some(Strategy::Weighted));
        match &canary.select[0].router {
            RouterConfig::Weighted(t) => {
                assert_eq!(t, &[target(big, Some(0.5)), target(small, Some(0.0))]);
            }
            other => panic!("{other:?}"),
        }

        let pool = &c.policies[2];
        match &pool.select[0].router {
            RouterConfig::Strategy { strategy, targets } => {
                assert_eq!(*strategy, Strategy::Fastest);
                assert_eq!(targets, &[target(mini, None), target(big, None)]);
            }
            other => panic!("{other:?}"),
        }

        let support = &c.policies[3];
        assert_eq!(support.select.len(), 2);
        assert!(support.select[0].when.is_some());
        assert!(support.select[1].when.is_none());
        match &support.select[0].router {
            RouterConfig::Weighted(t) => assert_eq!(
                t,
                &[
                    target(mini, Some(7.0)),
                    target(small, Some(3.0)),
                    target(big, None)
                ]
            ),
            other => panic!("{other:?}"),
        }
        match &support.select[1].router {
            RouterConfig::Priority(t) => assert_eq!(t, &[target(big, None), target(small, None)]),
            other => panic!("{other:?}"),
        }
        assert_eq!(support.on_failure, vec![small, mini]);
        assert_eq!(support.strategy, Some(Strategy::PriorityCheapest));
        assert!(support.failover_on_client_error);
        assert_eq!(support.max_attempts, Some(6));
    }

    #[test]
    fn the_select_condition_is_compiled_and_evaluated() {
        use crate::config::condition::{FactValue, Facts, Field};
        struct Tier(&'static str);
        impl Facts for Tier {
            fn get(&self, field: &Field) -> Option<FactValue<'_>> {
                (*field == Field::Metadata("tier".into())).then_some(FactValue::Str(self.0))
            }
        }
        let c = parse(&format!(
            "{BASE}policies:\n  p:\n    select:\n      - {{ when: {{ metadata.tier: {{ $in: [free, trial] }} }}, router: priority, targets: [{{ model: mini }}] }}\n      - {{ router: priority, targets: [{{ model: big }}] }}\n"
        ))
        .expect("valid");
        let when = c.policies[0].select[0].when.as_ref().expect("a condition");
        assert!(when.matches(&Tier("trial")));
        assert!(!when.matches(&Tier("paid")));
    }

    #[test]
    fn policy_names_share_the_catalog_namespace() {
        refused(
            r#"
policies:
  BIG: { select: [ { router: priority, targets: [ { model: big } ] } ] }
  Fast: { select: [ { router: priority, targets: [ { model: big } ] } ] }
  EVERYTHING: { select: [ { router: priority, targets: [ { model: big } ] } ] }
  p: { select: [ { router: priority, targets: [ { model: big } ] } ] }
  P: { select: [ { router: priority, targets: [ { model: big } ] } ] }
  "x:y": { select: [ { router: priority, targets: [ { model: big } ] } ] }
  "meta/llama": { select: [ { router: priority, targets: [ { model: big } ] } ] }
  Auto: { select: [ { router: priority, targets: [ { model: big } ] } ] }
"#,
            &[
                ("policies.BIG", "already used by models.big"),
                ("policies.Fast", "already used by aliases.fast"),
                ("policies.EVERYTHING", "already used by chains.everything"),
                ("policies.p", "already used by policies.P"),
                ("policies.x:y", "without ':', '/'"),
                ("policies.meta/llama", "without ':', '/'"),
                ("policies.Auto", "`auto` is reserved"),
            ],
        );
    }

    #[test]
    fn a_policy_cannot_refer_to_another_policy() {
        refused(
            r#"
policies:
  a: { select: [ { router: priority, targets: [ { model: big } ] } ] }
  b:
    select:
      - { when: { params.stream: true }, router: weighted, targets: [ { model: A, weight: 1 } ] }
      - { router: complexity, tiers: { simple: a, medium: big, complex: big } }
    on_failure: [ big, a ]
"#,
            &[
                (
                    "policies.b.select[0].targets[0].model",
                    "a policy cannot refer to another policy",
                ),
                (
                    "policies.b.select[1].tiers.simple",
                    "a policy cannot refer to another policy",
                ),
                (
                    "policies.b.on_failure[1]",
                    "a policy cannot refer to another policy",
                ),
            ],
        );
    }

    #[test]
    fn unknown_models_and_repeats_are_refused() {
        refused(
            r#"
policies:
  p:
    select:
      - { when: { params.stream: true }, router: priority, targets: [ { model: big }, { model: ghost }, { model: BIG } ] }
      - { router: weighted, targets: [ { model: mini, weight: 1 }, { model: fast } ] }
    on_failure: [ small, nowhere, small ]
"#,
            &[
                (
                    "policies.p.select[0].targets[1].model",
                    "\"ghost\" is not a model or alias",
                ),
                ("policies.p.select[0].targets[2]", "already targets"),
                ("policies.p.select[1].targets[1]", "already targets"),
                (
                    "policies.p.on_failure[1]",
                    "\"nowhere\" is not a model or alias",
                ),
                ("policies.p.on_failure[2]", "already in on_failure"),
            ],
        );
        // Tiers may share a model.
        assert!(errors(
            "policies:\n  t: { select: [ { router: complexity, tiers: { simple: mini, medium: fast, complex: big } } ] }\n"
        )
        .is_empty());
    }

    #[test]
    fn each_router_takes_exactly_its_keys() {
        refused(
            r#"
policies:
  p:
    select:
      - { when: { params.stream: true }, router: weighted, targets: [ { model: big, weight: 1 } ], tiers: { simple: big, medium: big, complex: big } }
      - { when: { params.stream: true }, router: priority, targets: [ { model: big, weight: 1 } ], strategy: fastest }
      - { when: { params.stream: true }, router: complexity, targets: [ { model: big } ], tiers: { simple: big } }
      - { when: { params.stream: true }, router: complexity }
      - { when: { params.stream: true }, router: strategy, targets: [ { model: big, weight: 2 } ] }
      - { when: { params.stream: true }, router: weighted }
      - { when: { params.stream: true }, router: priority, targets: [] }
      - { router: weighted, targets: [ { model: big }, { model: small, weight: 0 } ] }
"#,
            &[
                (
                    "policies.p.select[0].tiers",
                    "`tiers` belongs to router complexity",
                ),
                (
                    "policies.p.select[1].targets[0].weight",
                    "`weight` is only for router weighted",
                ),
                (
                    "policies.p.select[1].strategy",
                    "`strategy` belongs to router strategy",
                ),
                (
                    "policies.p.select[2].targets",
                    "router complexity takes `tiers`",
                ),
                ("policies.p.select[2].tiers", "missing `medium`"),
                ("policies.p.select[2].tiers", "missing `complex`"),
                ("policies.p.select[3]", "router complexity needs `tiers`"),
                ("policies.p.select[4]", "router strategy needs `strategy`"),
                (
                    "policies.p.select[4].targets[0].weight",
                    "`weight` is only for router weighted",
                ),
                ("policies.p.select[5]", "router weighted needs `targets`"),
                ("policies.p.select[6].targets", "needs at least one target"),
                (
                    "policies.p.select[7].targets",
                    "at least one target with a positive weight",
                ),
            ],
        );
        refused(
            "policies:\n  p: { select: [ { router: weighted, targets: [ { model: big, weight: -1 }, { model: small, weight: .nan }, { model: mini, weight: 1 } ] } ] }\n",
            &[
                ("policies.p.select[0].targets[0].weight", "finite and not negative"),
                ("policies.p.select[0].targets[1].weight", "finite and not negative"),
            ],
        );
        // The router itself is read by serde: an unknown one names the choices.
        refused(
            "policies:\n  p: { select: [ { router: wheighted, targets: [ { model: big } ] } ] }\n",
            &[("policies.p.select[0].router", "unknown variant `wheighted`")],
        );
    }

    #[test]
    fn only_the_last_select_entry_may_omit_when() {
        refused(
            r#"
policies:
  p:
    select:
      - { router: priority, targets: [ { model: big } ] }
      - { when: null, router: priority, targets: [ { model: mini } ] }
      - { router: priority, targets: [ { model: small } ] }
  q: { select: [] }
"#,
            &[
                (
                    "policies.p.select[0]",
                    "only the last select entry may omit `when`",
                ),
                ("policies.p.select[1].when", "a condition is an object"),
                ("policies.q.select", "at least one select entry"),
            ],
        );
        assert_eq!(
            errors(
                "policies:\n  p: { select: [ { when: { foo.bar: 1 }, router: priority, targets: [ { model: big } ] }, { router: priority, targets: [ { model: mini } ] } ] }\n"
            ),
            vec!["policies.p.select[0].when.foo.bar: unknown field family `foo` (params, metadata, header, key, budget)"]
        );
    }

    #[test]
    fn strategies_and_limits() {
        refused(
            r#"
policies:
  p:
    strategy: smart
    max_attempts: 0
    select: [ { router: strategy, strategy: chain, targets: [ { model: big } ] } ]
  q:
    strategy: weighted
    max_attempts: 101
    select: [ { router: strategy, strategy: weighted, targets: [ { model: mini } ] } ]
  r:
    strategy: chain
    select: [ { router: priority, targets: [ { model: big }, { model: mini } ] } ]
    on_failure: [ small ]
"#,
            &[
                (
                    "policies.p.strategy",
                    "unknown strategy \"smart\"; one of priority, priority_cheapest",
                ),
                ("policies.p.max_attempts", "between 1 and 100"),
                ("policies.p.select[0].strategy", "`chain` orders chains"),
                ("policies.q.max_attempts", "between 1 and 100"),
                (
                    "policies.q.select[0].strategy",
                    "weighted strategy needs a deployment with a positive weight",
                ),
                ("policies.r.strategy", "`chain` orders chains"),
            ],
        );
        // A policy-wide weighted strategy needs weights in every model it names.
        refused(
            "policies:\n  p: { strategy: weighted, select: [ { router: priority, targets: [ { model: big }, { model: fast } ] } ], on_failure: [ small ] }\n",
            &[("policies.p.strategy", "none in mini")],
        );
        assert!(errors(
            "failover: { max_attempts: 100 }\npolicies:\n  p: { max_attempts: 100, strategy: reliable, select: [ { router: priority, targets: [ { model: big } ] } ] }\n"
        )
        .is_empty());
        // Above the request-wide bound: refused, never silently capped.
        refused(
            "policies:\n  p: { max_attempts: 30, select: [ { router: priority, targets: [ { model: big } ] } ] }\n",
            &[(
                "policies.p.max_attempts",
                "30 is above failover.max_attempts (20)",
            )],
        );
    }

    #[test]
    fn a_policys_retries_are_bounded_and_take_failure_statuses_only() {
        let ok = parse(&format!(
            "{BASE}policies:\n  p: {{ retry: {{ attempts: 2, backoff: 50ms, on_status: [500, 503] }}, select: [ {{ router: priority, targets: [ {{ model: big }} ] }} ] }}\n  q: {{ retry: {{ attempts: 1 }}, select: [ {{ router: priority, targets: [ {{ model: big }} ] }} ] }}\n"
        ))
        .expect("valid");
        let retry = |name: &str| {
            ok.policies
                .iter()
                .find(|p| p.name == name)
                .and_then(|p| p.retry.clone())
                .expect("retry")
        };
        assert_eq!(
            retry("p"),
            crate::config::types::PolicyRetry {
                attempts: 2,
                backoff: std::time::Duration::from_millis(50),
                on_status: vec![500, 503]
            }
        );
        assert_eq!(retry("q").on_status, vec![502, 503, 504, 529]);
        assert_eq!(retry("q").backoff, std::time::Duration::from_millis(100));
        refused(
            "policies:\n  p: { retry: { attempts: 9, on_status: [200, 400, 529], wait: 1s }, select: [ { router: priority, targets: [ { model: big } ] } ] }\n",
            &[("policies.p.retry.wait", "unknown field")],
        );
        refused(
            "policies:\n  p: { retry: { attempts: 9, on_status: [200, 400, 529] }, select: [ { router: priority, targets: [ { model: big } ] } ] }\n",
            &[
                ("policies.p.retry.attempts", "between 0 and 5"),
                ("policies.p.retry.on_status[0]", "200 is not a failure status"),
                ("policies.p.retry.on_status[1]", "400 is not a failure status"),
            ],
        );
    }

    #[test]
    fn policy_keys_are_strict() {
        refused(
            "policies:\n  p: { select: [ { router: priority, targets: [ { model: big } ] } ], on_fail: [ big ] }\n",
            &[("policies.p.on_fail", "unknown field `on_fail`")],
        );
        refused(
            "policies:\n  p: { select: [ { router: priority, targets: [ { model: big, wieght: 1 } ] } ] }\n",
            &[("policies.p.select[0].targets[0].wieght", "unknown field `wieght`")],
        );
    }
}
