//! Deciding where a request goes: resolve the `model` string to a route, then walk the
//! route's candidates one target (deployment × credential) at a time.
//!
//! Everything here is a pure function of the routing snapshot ([`table::RouteTable`]), live
//! health and the request's facts: [`scoring`] orders candidates by a strategy, [`lead`]
//! makes the per-request first pick, [`plan`] walks them; [`route`] is what a name resolves
//! to; [`rank`] keeps the shared orders current in the background; [`key`] is a caller key's
//! own routing, compiled once per snapshot; [`knn`] is the knn router's decision (the search
//! over a pool of scored examples and the utility rule; `crate::knn` feeds it). `proxy` only connects it to Pingora's hooks and
//! applies what the plan claims. That keeps the decisions unit-testable and benchable without
//! a socket, and lets `explain` run the very same walk.

pub mod decide;
pub mod key;
pub mod knn;
pub mod lead;
pub mod plan;
pub mod policy;
pub mod rank;
pub mod route;
pub mod scoring;
pub mod session;
pub mod table;

use std::sync::Arc;

use crate::catalog::{Deployment, ProviderIdx};
pub use crate::config::Strategy;
pub use plan::{Choice, Plan, PlanEnv, RequestFacts, SkipReason, Target};
pub use rank::Rankings;
pub use table::{Route, RouteIdx, RouteKind, RouteTable};

/// What a `model` string resolved to.
#[derive(Debug, Clone)]
pub enum Resolution {
    Route(RouteIdx),
    /// `<provider>/<upstream-model>` for an upstream model the catalog does not list.
    Adhoc {
        route: RouteIdx,
        deployment: Arc<Deployment>,
    },
    /// A policy named as a model.
    Policy(policy::PolicyIdx),
}

impl Resolution {
    /// The route, for a name that has one (a policy's route is chosen per request).
    pub fn route(&self) -> Option<RouteIdx> {
        match self {
            Resolution::Route(r) | Resolution::Adhoc { route: r, .. } => Some(*r),
            Resolution::Policy(_) => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveError {
    /// No model, alias, chain or provider of that name.
    ModelNotFound,
    /// `auto` without an `active_chain`.
    NoActiveChain,
    /// The chain exists but lists no usable model.
    ChainEmpty,
    /// The model exists but is disabled (or all its deployments are).
    ModelDisabled,
}

/// Names longer than this cannot exist in a valid config.
const MAX_NAME: usize = 384;

/// Resolve a caller's `model` string (case-insensitive). Exact model and alias names win over
/// the `<provider>/<upstream-model>` form, since catalog names may contain `/`.
pub fn resolve(t: &RouteTable, model: &str) -> Result<Resolution, ResolveError> {
    if model.is_empty() || model.len() > MAX_NAME {
        return Err(ResolveError::ModelNotFound);
    }
    let mut buf = [0u8; MAX_NAME];
    let lower = &mut buf[..model.len()];
    lower.copy_from_slice(model.as_bytes());
    lower.make_ascii_lowercase();
    // Lower-casing ASCII bytes keeps UTF-8 valid.
    let lower = std::str::from_utf8(lower).map_err(|_| ResolveError::ModelNotFound)?;
    match resolve_lower(t, model, lower) {
        // No exact name: a glob alias may read it as another name (one step: a glob alias
        // names an exact name, never another glob).
        Err(ResolveError::ModelNotFound) => match t.glob_alias(lower) {
            Some(target) => resolve_lower(t, target, target),
            None => Err(ResolveError::ModelNotFound),
        },
        other => other,
    }
}

/// [`resolve`] of exact names: `lower` is `model` lower-cased.
fn resolve_lower(t: &RouteTable, model: &str, lower: &str) -> Result<Resolution, ResolveError> {
    if let Some(r) = t.by_name(lower) {
        return non_empty(t, r, ResolveError::ModelDisabled);
    }
    if let Some(p) = t.policy_by_name(lower) {
        // `routing.enabled: false`: a policy's name names nothing.
        if !t.routing.policies {
            return Err(ResolveError::ModelNotFound);
        }
        return Ok(Resolution::Policy(p));
    }
    if lower == "auto" {
        let r = t.active_chain.ok_or(ResolveError::NoActiveChain)?;
        return non_empty(t, r, ResolveError::ChainEmpty);
    }
    if let Some(rest) = lower.strip_prefix("auto:") {
        if let Some(r) = t.chain(rest) {
            return non_empty(t, r, ResolveError::ChainEmpty);
        }
        if let Some(r) = t.axis(rest) {
            return non_empty(t, r, ResolveError::ModelNotFound);
        }
        return Err(ResolveError::ModelNotFound);
    }
    if let Some((provider, _)) = lower.split_once('/') {
        if let Some(r) = t.direct(lower) {
            return non_empty(t, r, ResolveError::ModelDisabled);
        }
        let Some(p) = t.catalog.provider_by_id(provider) else {
            return Err(ResolveError::ModelNotFound);
        };
        // The upstream name keeps the caller's case: providers' names are case-sensitive.
        let upstream = &model[provider.len() + 1..];
        let deployment = Deployment::adhoc(p, upstream).ok_or(ResolveError::ModelNotFound)?;
        return Ok(Resolution::Adhoc {
            route: t.direct_adhoc(ProviderIdx(p.idx.0)),
            deployment: Arc::new(deployment),
        });
    }
    Err(ResolveError::ModelNotFound)
}

fn non_empty(t: &RouteTable, r: RouteIdx, empty: ResolveError) -> Result<Resolution, ResolveError> {
    if t.route(r).candidates.is_empty() {
        Err(empty)
    } else {
        Ok(Resolution::Route(r))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::Fixture;

    pub const CONFIG: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }] }
  b: { kind: openai, base_url: "http://127.0.0.1:9002/v1", priority: 5 }
  c: { kind: openai, base_url: "http://127.0.0.1:9003/v1", enabled: false }
models:
  gpt-4o-mini:
    capability: 2
    deployments:
      - { provider: a, model: gpt-4o-mini }
      - { provider: b, model: llama-8b }
  big:
    capability: 5
    deployments: [{ provider: a, model: big-1 }, { provider: c, model: big-c }]
  meta/llama-3.1-70b:
    deployments: [{ provider: b, model: llama-70b }]
  off:
    enabled: false
    deployments: [{ provider: a, model: off-1 }]
aliases: { fast: gpt-4o-mini }
chains:
  default: [fast, big]
  nothing: [off]
active_chain: default
"#;

    pub fn tables_from(text: &str) -> RouteTable {
        Fixture::new(text).route_table()
    }

    fn routed_via(t: &RouteTable, res: &Resolution) -> Vec<String> {
        t.route(res.route().unwrap())
            .candidates
            .iter()
            .map(|d| {
                t.catalog
                    .deployment(*d)
                    .routed_via
                    .to_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn names_resolve_case_insensitively() {
        let t = tables_from(CONFIG);
        let r = resolve(&t, "GPT-4o-Mini").expect("model");
        assert_eq!(
            t.route(r.route().unwrap()).label.as_ref(),
            "model:gpt-4o-mini"
        );
        // Priority: provider b (5) before a (10).
        assert_eq!(routed_via(&t, &r), ["b/llama-8b", "a/gpt-4o-mini"]);
        let r = resolve(&t, "FAST").expect("alias");
        assert_eq!(t.route(r.route().unwrap()).label.as_ref(), "alias:fast");
    }

    #[test]
    fn chains_keep_order_and_never_repeat_a_target() {
        let t = tables_from(CONFIG);
        let r = resolve(&t, "auto").expect("active chain");
        assert_eq!(t.route(r.route().unwrap()).label.as_ref(), "chain:default");
        // fast = gpt-4o-mini (b, a), then big (a; c's deployment is kept: the provider switch is
        // checked per attempt).
        assert_eq!(
            routed_via(&t, &r),
            ["b/llama-8b", "a/gpt-4o-mini", "a/big-1", "c/big-c"]
        );
        assert_eq!(
            resolve(&t, "auto:DEFAULT").map(|r| r.route().unwrap()).ok(),
            Some(r.route().unwrap())
        );
    }

    #[test]
    fn unknown_and_empty() {
        let t = tables_from(CONFIG);
        assert_eq!(resolve(&t, "nope").err(), Some(ResolveError::ModelNotFound));
        assert_eq!(
            resolve(&t, "auto:nope").err(),
            Some(ResolveError::ModelNotFound)
        );
        assert_eq!(
            resolve(&t, "auto:nothing").err(),
            Some(ResolveError::ChainEmpty)
        );
        assert_eq!(resolve(&t, "off").err(), Some(ResolveError::ModelDisabled));
        assert_eq!(resolve(&t, "").err(), Some(ResolveError::ModelNotFound));
        assert_eq!(resolve(&t, "zz/x").err(), Some(ResolveError::ModelNotFound));
        let t2 = tables_from(&CONFIG.replace("active_chain: default", ""));
        assert_eq!(
            resolve(&t2, "auto").err(),
            Some(ResolveError::NoActiveChain)
        );
    }

    #[test]
    fn exact_names_win_over_direct() {
        let t = tables_from(CONFIG);
        let r = resolve(&t, "meta/llama-3.1-70b").expect("model with a slash");
        assert_eq!(
            t.route(r.route().unwrap()).label.as_ref(),
            "model:meta/llama-3.1-70b"
        );
    }

    #[test]
    fn direct_forms() {
        let t = tables_from(CONFIG);
        let r = resolve(&t, "a/GPT-4o-mini").expect("configured direct");
        assert_eq!(routed_via(&t, &r), ["a/gpt-4o-mini"]);
        match resolve(&t, "b/Some-New-Model").expect("ad hoc") {
            Resolution::Adhoc { route, deployment } => {
                assert_eq!(t.route(route).label.as_ref(), "direct:b");
                assert_eq!(&*deployment.upstream_model, "Some-New-Model");
            }
            other => panic!("expected an ad-hoc deployment, got {other:?}"),
        }
        assert!(resolve(&t, "b/bad\"name").is_err());
    }

    #[test]
    fn axes_cover_every_enabled_model() {
        let t = tables_from(CONFIG);
        let r = resolve(&t, "auto:Smartest").expect("axis");
        let route = t.route(r.route().unwrap());
        assert_eq!(route.strategy, Strategy::Smartest);
        assert!(routed_via(&t, &r).contains(&"a/big-1".to_string()));
        assert!(!routed_via(&t, &r).contains(&"a/off-1".to_string()));
        assert_eq!(
            t.route(resolve(&t, "auto:speed").expect("axis").route().unwrap())
                .strategy,
            Strategy::Fastest
        );
        assert_eq!(
            t.route(resolve(&t, "auto:budget").expect("axis").route().unwrap())
                .strategy,
            Strategy::Cheapest
        );
    }
}
