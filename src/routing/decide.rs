//! Deciding where one request goes, before any attempt: the same code for the proxy and for
//! explain.
//!
//! Precedence: the body's `routing.policy` › the `x-llm-route` header › the `model` string
//! (a model, alias, chain, axis, direct form, or a policy name) › for a request naming exactly
//! `auto`, the first conditional rule that holds (then the active chain). A policy then picks
//! its `select` entry (the first whose `when` holds) and, for that entry, a route: a weighted
//! draw seeded by the request, its complexity tier, or its one order; `x-llm-router: off`
//! takes the targets in the order written. `routing.strategy` re-ranks the chosen route's
//! candidates for this request (each policy segment on its own, so a policy's target order
//! stands); `smart` is taken as `priority_cheapest` (seed 002). `routing.providers` narrows
//! the candidates and, under `priority`, breaks ties in its own order. `routing.enabled:
//! false` makes every policy name name nothing.
//!
//! The caller key's `routing` ([`KeyRouting`]) sits between the request's and the route's,
//! field by field: its strategy when the request asks for none, its `provider_order` when the
//! request names no `routing.providers`. Its exclusions hold whatever the request names.
//!
//! Everything here is a pure function of the snapshot and the request. What the proxy then
//! applies — a route's round-robin turn, claimed probe slots — stays with the proxy.

use std::sync::Arc;

use super::key::KeyRouting;
use super::plan::{Plan, PlanEnv, RequestFacts};
use super::policy::{PolicyIdx, RuleDest, Selection};
use super::rank::Rankings;
use super::scoring::{rank, RankBy};
use super::table::Segment;
use super::{resolve, Resolution, ResolveError, RouteIdx, RouteTable};
use crate::adapters::caller::CallerRequest;
use crate::adapters::facts::Complexity;
use crate::adapters::tokenizer::{self, Encoding};
use crate::adapters::{agent, input};
use crate::catalog::surface::Surface;
use crate::catalog::{Catalog, Deployment, DeploymentIdx, ProviderIdx};
use crate::config::condition::{FactValue, Facts, Field};
use crate::config::{AskedStrategy, Strategy};
use crate::error::{ErrorCode, GatewayError};

/// Output tokens assumed when the request does not say (`max_tokens`).
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;

/// The largest `x-llm-metadata` header accepted.
pub const MAX_METADATA: usize = 4096;

/// The caller's labels (`x-llm-metadata`: a flat JSON object of strings, numbers and booleans).
/// Untrusted: they can only steer a request among routes the caller could name anyway.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    pairs: Vec<(Box<str>, MetaValue)>,
}

#[derive(Debug, Clone, PartialEq)]
enum MetaValue {
    Str(Box<str>),
    Num(f64),
    Bool(bool),
}

impl Metadata {
    /// Parse the header's value. `Err` says what is wrong (in signalbox's words).
    pub fn parse(raw: &[u8]) -> Result<Self, &'static str> {
        if raw.len() > MAX_METADATA {
            return Err("`x-llm-metadata` is longer than 4 KiB");
        }
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(raw).map_err(|_| "`x-llm-metadata` must be a JSON object")?;
        let mut pairs = Vec::with_capacity(map.len());
        for (k, v) in map {
            let v = match v {
                serde_json::Value::String(s) => MetaValue::Str(s.into()),
                serde_json::Value::Bool(b) => MetaValue::Bool(b),
                serde_json::Value::Number(n) => match n.as_f64() {
                    Some(f) => MetaValue::Num(f),
                    None => return Err("`x-llm-metadata` holds a number out of range"),
                },
                _ => {
                    return Err("`x-llm-metadata` must be flat: strings, numbers and booleans only")
                }
            };
            pairs.push((k.into(), v));
        }
        Ok(Self { pairs })
    }

    fn get(&self, key: &str) -> Option<FactValue<'_>> {
        self.pairs
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| match v {
                MetaValue::Str(s) => FactValue::Str(s),
                MetaValue::Num(n) => FactValue::Num(*n),
                MetaValue::Bool(b) => FactValue::Bool(*b),
            })
    }
}

/// What a request's headers say about where it goes: `x-llm-route`, `x-llm-router: off`,
/// `x-llm-metadata`. Read the same way by the proxy and by explain.
#[derive(Debug, Clone, Default)]
pub struct SteeringHeaders {
    pub route: Option<String>,
    pub router_off: bool,
    pub metadata: Metadata,
}

impl SteeringHeaders {
    /// Read them from the three headers' values (`x-llm-route`, `x-llm-router`,
    /// `x-llm-metadata`). `Err` says what is wrong, in signalbox's words.
    pub fn read(
        route: Option<&[u8]>,
        router: Option<&[u8]>,
        metadata: Option<&[u8]>,
    ) -> Result<Self, &'static str> {
        let metadata = match metadata {
            None => Metadata::default(),
            Some(v) => Metadata::parse(v)?,
        };
        let route = match route {
            None => None,
            Some(v) => Some(
                std::str::from_utf8(v)
                    .map_err(|_| "`x-llm-route` is not a policy name")?
                    .trim()
                    .to_string(),
            ),
        };
        let router_off = router.is_some_and(|v| v.eq_ignore_ascii_case(b"off"));
        Ok(Self {
            route,
            router_off,
            metadata,
        })
    }

    /// The steering of `request` with these headers.
    pub fn steer<'a>(
        &'a self,
        surface: Surface,
        request: &'a CallerRequest,
        seed: u64,
    ) -> Steering<'a> {
        Steering {
            surface,
            key: None,
            headers: None,
            request,
            route_header: self.route.as_deref(),
            router_off: self.router_off,
            metadata: &self.metadata,
            seed,
        }
    }
}

/// What a request says about where it goes, beyond its body.
#[derive(Debug, Clone, Copy)]
pub struct Steering<'a> {
    /// The endpoint the request came to.
    pub surface: Surface,
    /// The caller's key, when keys are configured (conditions on `key.*` and `budget.*`).
    pub key: Option<KeyFacts<'a>>,
    /// The request's headers (`header.<name>`, `params.agent`); `None` reads as a request
    /// without any.
    pub headers: Option<HeaderLookup<'a>>,
    pub request: &'a CallerRequest,
    /// `x-llm-route`.
    pub route_header: Option<&'a str>,
    /// `x-llm-router: off`.
    pub router_off: bool,
    pub metadata: &'a Metadata,
    /// The request's own seed (from its id): a weighted policy draw is independent of every
    /// other request's.
    pub seed: u64,
}

/// A request's headers as conditions read them: a header's value by its lower-case name (the
/// proxy's header map, or explain's). Looked up only when a condition reads a header.
#[derive(Clone, Copy)]
pub struct HeaderLookup<'a>(pub &'a dyn Fn(&str) -> Option<&'a [u8]>);

impl std::fmt::Debug for HeaderLookup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeaderLookup")
    }
}

/// What conditions may read about the caller's key.
#[derive(Debug, Clone, Copy)]
pub struct KeyFacts<'a> {
    /// `None` for a caller explained before it exists (`signalbox explain --allowed-model`).
    pub id: Option<&'a str>,
    pub user: Option<&'a str>,
    /// `budget.used_pct` and `budget.remaining_usd`, when the key has a budget.
    pub budget: Option<(f64, f64)>,
    /// The catalog models (by index) the key may be served by; `None`: all. A weighted pool
    /// draws among the ones it may use, and the plan skips the others.
    pub models: Option<&'a [bool]>,
    /// The key's own routing (`keys[].routing`), when it has one.
    pub routing: Option<&'a KeyRouting>,
}

/// The facts conditions read, from one request.
struct RequestFactsView<'v, 's> {
    steering: &'v Steering<'s>,
    model: &'v str,
    /// `params.task`, worked out the first time a condition reads it (it may parse the
    /// messages).
    task: std::cell::OnceCell<&'static str>,
}

impl<'v, 's> RequestFactsView<'v, 's> {
    fn new(steering: &'v Steering<'s>, model: &'v str) -> Self {
        Self {
            steering,
            model,
            task: std::cell::OnceCell::new(),
        }
    }

    fn header(&self, name: &str) -> Option<&'s [u8]> {
        (self.steering.headers?.0)(name)
    }
}

impl Facts for RequestFactsView<'_, '_> {
    fn get(&self, field: &Field) -> Option<FactValue<'_>> {
        let r = self.steering.request;
        #[allow(clippy::cast_precision_loss)]
        Some(match field {
            Field::Endpoint => FactValue::Str(self.steering.surface.rule_name()),
            Field::Stream => FactValue::Bool(r.stream()),
            Field::Tools => FactValue::Bool(r.needs().tools),
            Field::Vision => FactValue::Bool(r.needs().vision),
            Field::Model => FactValue::Str(self.model),
            Field::MaxTokens => FactValue::Num(r.max_tokens()? as f64),
            Field::PromptTokens => FactValue::Num(r.prompt_tokens() as f64),
            Field::Task => FactValue::Str(self.task.get_or_init(|| input::task(r))),
            Field::Agent => FactValue::Str(agent::of_user_agent(self.header("user-agent"))),
            Field::Metadata(k) => return self.steering.metadata.get(k),
            Field::Header(name) => FactValue::Str(std::str::from_utf8(self.header(name)?).ok()?),
            // No caller keys yet: these never match.
            Field::KeyId => FactValue::Str(self.steering.key?.id?),
            Field::KeyUser => FactValue::Str(self.steering.key?.user?),
            Field::BudgetUsedPct => FactValue::Num(self.steering.key?.budget?.0),
            Field::BudgetRemainingUsd => FactValue::Num(self.steering.key?.budget?.1),
        })
    }
}

/// How a request reached its route.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Via {
    /// The `model` string named it.
    Model,
    /// A policy chose it; `rule` when a rule sent the request to the policy.
    Policy {
        policy: PolicyIdx,
        selection: Selection,
        rule: Option<usize>,
    },
    /// A rule sent `auto` to a chain or axis.
    Rule(usize),
}

/// The decision for one request, before its plan.
#[derive(Debug, Clone)]
pub struct Routed {
    pub route: RouteIdx,
    /// A direct `<provider>/<name>` the catalog does not list.
    pub adhoc: Option<Arc<Deployment>>,
    pub via: Via,
    /// The strategy this request is ranked by.
    pub strategy: Strategy,
    /// The request (or its key) asked for a strategy other than the route's (ranked now, not
    /// from the tables).
    pub strategy_override: bool,
    /// The request (or its key) asked for `smart`, taken as `priority_cheapest`.
    pub smart_fallback: bool,
    /// `routing.providers`, resolved.
    pub providers: Option<Vec<ProviderIdx>>,
    /// A knn entry's decision, once made (`crate::knn`): what the routing reason and explain
    /// show.
    pub knn: Option<Arc<super::knn::Report>>,
}

impl Routed {
    /// The knn entry this request selected, while its order is still to be decided.
    pub fn knn_pending(&self) -> bool {
        matches!(
            self.via,
            Via::Policy {
                selection: Selection {
                    pick: super::policy::Pick::Knn(super::knn::KnnOutcome::Pending),
                    ..
                },
                ..
            }
        )
    }
}

/// Why a request cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    /// The `model` string names nothing usable.
    Resolve(ResolveError),
    /// `routing.policy` or `x-llm-route` names no policy (`header` says which).
    NoSuchPolicy {
        header: bool,
    },
    /// `routing.policy` or `x-llm-route` names a policy while `routing.enabled` is `false`.
    PoliciesOff {
        header: bool,
    },
    UnknownStrategy,
    UnknownProvider,
}

/// Decide the route of a request: precedence, rules, the policy entry and route.
pub fn route(tables: &RouteTable, steering: &Steering<'_>) -> Result<Routed, DecideError> {
    let request = steering.request;
    let model = request.model_name();
    let facts = RequestFactsView::new(steering, &model);
    let overrides = request.routing();
    let named_policy = match (
        overrides.and_then(|r| r.policy.as_deref()),
        steering.route_header,
    ) {
        (Some(p), _) => Some(
            tables
                .policy_by_name(&p.to_ascii_lowercase())
                .ok_or(DecideError::NoSuchPolicy { header: false })?,
        ),
        (None, Some(h)) => Some(
            tables
                .policy_by_name(&h.to_ascii_lowercase())
                .ok_or(DecideError::NoSuchPolicy { header: true })?,
        ),
        (None, None) => None,
    };
    if named_policy.is_some() && !tables.routing.policies {
        return Err(DecideError::PoliciesOff {
            header: overrides.and_then(|r| r.policy.as_deref()).is_none(),
        });
    }
    let (route, adhoc, via) = match named_policy {
        Some(p) => policy_route(tables, p, &facts, steering, None),
        None => match resolve_with_rules(tables, &model, &facts)? {
            Target::Route(r, via) => (r, None, via),
            Target::Adhoc(r, d) => (r, Some(d), Via::Model),
            Target::Policy(p, rule) => policy_route(tables, p, &facts, steering, rule),
        },
    };
    let base = tables.route(route).strategy;
    // The request's strategy, else the key's, else the route's.
    let asked = match overrides.and_then(|r| r.strategy.as_deref()) {
        Some(name) => Some(AskedStrategy::parse(name).ok_or(DecideError::UnknownStrategy)?),
        None => steering.key.and_then(|k| k.routing?.strategy),
    };
    let (strategy, smart_fallback) =
        asked.map_or((base, false), |a| (a.strategy, a.smart_fallback));
    let providers = match overrides.and_then(|r| r.providers.as_ref()) {
        None => None,
        Some(ids) => Some(
            ids.iter()
                .map(|id| tables.catalog.provider_by_id(id).map(|p| p.idx))
                .collect::<Option<Vec<_>>>()
                .ok_or(DecideError::UnknownProvider)?,
        ),
    };
    Ok(Routed {
        route,
        adhoc,
        via,
        strategy,
        strategy_override: strategy != base,
        smart_fallback,
        providers,
        knn: None,
    })
}

/// Whether each rule holds for this request (explain shows the rules a request for `auto` was
/// checked against; the request path stops at the first that holds).
pub fn rules_holding(tables: &RouteTable, steering: &Steering<'_>) -> Vec<bool> {
    let model = steering.request.model_name();
    let facts = RequestFactsView::new(steering, &model);
    tables
        .rules
        .iter()
        .map(|r| r.when.matches(&facts))
        .collect()
}

enum Target {
    Route(RouteIdx, Via),
    Adhoc(RouteIdx, Arc<Deployment>),
    Policy(PolicyIdx, Option<usize>),
}

/// The `model` string, with the rules for `auto`.
fn resolve_with_rules(
    tables: &RouteTable,
    model: &str,
    facts: &dyn Facts,
) -> Result<Target, DecideError> {
    if model.eq_ignore_ascii_case("auto") {
        if let Some((n, rule)) = tables
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.when.matches(facts))
        {
            return Ok(match rule.dest {
                RuleDest::Route(r) => Target::Route(r, Via::Rule(n)),
                RuleDest::Policy(p) => Target::Policy(p, Some(n)),
            });
        }
    }
    match resolve(tables, model).map_err(DecideError::Resolve)? {
        Resolution::Route(r) => Ok(Target::Route(r, Via::Model)),
        Resolution::Adhoc { route, deployment } => Ok(Target::Adhoc(route, deployment)),
        Resolution::Policy(p) => Ok(Target::Policy(p, None)),
    }
}

fn policy_route(
    tables: &RouteTable,
    p: PolicyIdx,
    facts: &dyn Facts,
    steering: &Steering<'_>,
    rule: Option<usize>,
) -> (RouteIdx, Option<Arc<Deployment>>, Via) {
    let request = steering.request;
    let unit = unit_draw(steering.seed);
    let models = steering.key.as_ref().and_then(|k| k.models);
    let may_use = |m: usize| models.is_none_or(|ms| ms.get(m).copied().unwrap_or(false));
    let selection = tables.policy(p).select(
        facts,
        steering.router_off,
        unit,
        || match request.complexity() {
            Complexity::Simple => 0,
            Complexity::Medium => 1,
            Complexity::Complex => 2,
        },
        &may_use,
    );
    (
        selection.route,
        None,
        Via::Policy {
            policy: p,
            selection,
            rule,
        },
    )
}

/// A uniform draw in [0, 1) from the request's seed (its own stream: not the plan's).
fn unit_draw(seed: u64) -> f64 {
    let r = super::lead::splitmix64(seed ^ 0x706f_6c69_6379_0001);
    #[allow(clippy::cast_precision_loss)]
    let v = (r >> 11) as f64 / (1u64 << 53) as f64;
    v
}

/// The prompt's tokens for OpenAI-kind and for Anthropic-kind candidates: the estimate, or
/// for OpenAI-kind ones the exact count when the estimate is within 10 % of a limit an
/// OpenAI-kind candidate of the route judges it by (its model's context window, its `tpm`
/// window), counted in that candidate's encoding.
pub fn input_tokens(tables: &RouteTable, routed: &Routed, request: &CallerRequest) -> (u64, u64) {
    let estimate = request.estimate();
    let (openai, anthropic) = (estimate.openai(), estimate.anthropic());
    let catalog = &tables.catalog;
    let output = request.max_tokens().unwrap_or(DEFAULT_OUTPUT_TOKENS);
    let near = |d: &Deployment| {
        if catalog.provider(d.provider).kind != crate::config::ProviderKind::OpenAi {
            return false;
        }
        let window = d
            .model
            .and_then(|m| catalog.model(m).context_window)
            .is_some_and(|w| tokenizer::near(openai, u64::from(w)));
        window || d.tpm.is_some_and(|t| tokenizer::near(openai + output, t))
    };
    let close = match &routed.adhoc {
        Some(d) => near(d).then(|| d.upstream_model.clone()),
        None => tables
            .route(routed.route)
            .candidates
            .iter()
            .map(|d| catalog.deployment(*d))
            .find(|d| near(d))
            .map(|d| d.upstream_model.clone()),
    };
    let openai = close
        .and_then(|model| request.exact_tokens(Encoding::for_model(&model)))
        .unwrap_or(openai);
    (openai, anthropic)
}

/// The plan of a routed request: the route's ranked order (from the shared tables, or ranked
/// now for a strategy of the request's or its key's own), narrowed and tie-broken by
/// `routing.providers`, else reordered by the key's `provider_order`; the key's exclusions
/// applied either way.
pub fn plan(
    tables: &RouteTable,
    rankings: &Rankings,
    env: &PlanEnv<'_>,
    routed: &Routed,
    facts: RequestFacts,
    key: Option<&KeyRouting>,
) -> Plan {
    let excluded = key.and_then(KeyRouting::excluded);
    if let Some(d) = &routed.adhoc {
        let mut plan = Plan::adhoc(d.clone(), facts);
        if let Some(p) = &routed.providers {
            plan.restrict_to(p.clone());
        }
        if let Some(e) = excluded {
            plan.exclude_providers(e.clone());
        }
        return plan;
    }
    let route = tables.route(routed.route);
    let mut order: Arc<[DeploymentIdx]> = if routed.strategy_override {
        let by = RankBy {
            strategy: routed.strategy,
            custom: tables.routing.custom_weights,
            scoring: tables.routing.scoring,
            now_ms: env.now_ms,
            tokens: (facts.input_tokens, facts.output_tokens),
        };
        let mut order = Vec::with_capacity(route.candidates.len());
        for s in route.segments.iter() {
            order.extend(rank(
                &tables.catalog,
                &tables.health,
                &route.candidates[s.range.clone()],
                by,
            ));
        }
        order.into()
    } else {
        rankings.order(tables, routed.route)
    };
    if let (Some(providers), Strategy::Priority) = (&routed.providers, routed.strategy) {
        // The caller's provider order breaks priority ties.
        let mut v = order.to_vec();
        v.sort_by_key(|d| {
            let d = tables.catalog.deployment(*d);
            let at = providers.iter().position(|p| *p == d.provider);
            (d.priority, at.unwrap_or(usize::MAX))
        });
        order = v.into();
    }
    let mut lead_span = route.lead_span();
    // The request's `routing.providers` replaces the key's order (field by field).
    if let (None, Some(k)) = (&routed.providers, key.filter(|k| k.orders_providers())) {
        order = by_key_order(&tables.catalog, order, &route.segments, k);
        lead_span = lead_span.min(first_provider_run(&tables.catalog, &order, k));
    }
    let mut plan = Plan::new(order, routed.strategy, facts).with_lead_span(lead_span);
    if let Some(p) = &routed.providers {
        plan.restrict_to(p.clone());
    }
    if let Some(e) = excluded {
        plan.exclude_providers(e.clone());
    }
    plan
}

/// A ranked order reordered by the key's `provider_order`: within each segment (a policy's
/// targets keep their order), the candidates of the providers it lists first, in its order,
/// then the others; the strategy's order stands within each provider and among the others (a
/// stable sort). An order already in that shape is returned as it is, uncopied.
fn by_key_order(
    catalog: &Catalog,
    order: Arc<[DeploymentIdx]>,
    segments: &[Segment],
    key: &KeyRouting,
) -> Arc<[DeploymentIdx]> {
    let place = |d: &DeploymentIdx| key.rank(catalog.deployment(*d).provider);
    let in_shape = segments.iter().all(|s| {
        order
            .get(s.range.clone())
            .is_none_or(|part| part.is_sorted_by_key(place))
    });
    if in_shape {
        return order;
    }
    let mut v = order.to_vec();
    for s in segments {
        if let Some(part) = v.get_mut(s.range.clone()) {
            part.sort_by_key(place);
        }
    }
    v.into()
}

/// How many leading candidates belong to the provider the key's order put first: a lead pick
/// (load balancing, the cheapest for this request, exploration) chooses among those only, so
/// the key's order decides which provider is called first. When no listed provider serves the
/// route, every candidate is of the same (unlisted) place and the span is the whole order.
fn first_provider_run(catalog: &Catalog, order: &[DeploymentIdx], key: &KeyRouting) -> usize {
    let place = |d: &DeploymentIdx| key.rank(catalog.deployment(*d).provider);
    let Some(first) = order.first().map(place) else {
        return 0;
    };
    order.iter().take_while(|d| place(d) == first).count()
}

impl DecideError {
    /// The answer the caller gets, in signalbox's words (names echoed only when they are the
    /// caller's own input, short and printable).
    pub fn answer(&self, request: &CallerRequest) -> GatewayError {
        let e = self.clone();
        let invalid = |m: String| GatewayError::new(ErrorCode::InvalidRequest, m);
        let routing = request.routing();
        match e {
            DecideError::Resolve(e) => resolve_error(e, &request.model_name()),
            DecideError::NoSuchPolicy { header: true } => {
                invalid("`x-llm-route`: no policy of that name".to_string())
            }
            DecideError::NoSuchPolicy { header: false } => invalid(format!(
                "`routing.policy`: no policy named {:?}",
                truncate(routing.and_then(|r| r.policy.as_deref()).unwrap_or(""))
            )),
            DecideError::PoliciesOff { header } => GatewayError::new(
                ErrorCode::ModelNotFound,
                format!(
                    "{}: policies are switched off (`routing.enabled: false`)",
                    if header {
                        "`x-llm-route`"
                    } else {
                        "`routing.policy`"
                    }
                ),
            ),
            DecideError::UnknownStrategy => invalid(format!(
                "`routing.strategy`: unknown strategy {:?}",
                truncate(routing.and_then(|r| r.strategy.as_deref()).unwrap_or(""))
            )),
            DecideError::UnknownProvider => {
                invalid("`routing.providers` names a provider that does not exist".to_string())
            }
        }
    }
}

fn resolve_error(e: ResolveError, model: &str) -> GatewayError {
    // The model name is echoed only when short and printable: it is the caller's own input.
    let shown: String = if model.len() <= 128 && model.bytes().all(|b| b.is_ascii_graphic()) {
        model.to_string()
    } else {
        "(the requested model)".to_string()
    };
    match e {
        ResolveError::ModelNotFound => GatewayError::new(
            ErrorCode::ModelNotFound,
            format!("no model, alias or chain named {shown:?}"),
        ),
        ResolveError::NoActiveChain => GatewayError::new(
            ErrorCode::ModelNotFound,
            "`auto` needs an active chain and none is configured",
        ),
        ResolveError::ChainEmpty => GatewayError::new(
            ErrorCode::ChainEmpty,
            format!("{shown:?} names a chain with no usable model"),
        ),
        ResolveError::ModelDisabled => {
            GatewayError::new(ErrorCode::ModelNotFound, format!("{shown:?} is disabled"))
        }
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::openai::ChatRequest;
    use crate::testing::Fixture;
    use bytes::Bytes;

    const CONFIG: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
models:
  ma: { deployments: [{ provider: a, model: x }] }
  mb: { deployments: [{ provider: b, model: y }] }
aliases: { fast: ma }
chains: { main: [ma], side: [mb] }
active_chain: main
policies:
  pa: { select: [ { router: priority, targets: [ { model: ma } ] } ] }
  pb:
    select:
      - { when: { metadata.tier: free }, router: priority, targets: [ { model: mb } ] }
      - { router: weighted, targets: [ { model: ma, weight: 1 }, { model: mb, weight: 3 } ] }
rules:
  - { when: { params.stream: true }, then: auto:side }
  - { when: { metadata.team: ads }, then: pb }
"#;

    /// (model in the body, extra body JSON, x-llm-route, metadata) → (route label, how).
    type Case = (
        &'static str,
        &'static str,
        Option<&'static str>,
        &'static str,
        &'static str,
        &'static str,
    );

    #[test]
    fn what_a_request_names_decides_in_order() {
        let t = Fixture::new(CONFIG).route_table();
        let cases: &[Case] = &[
            // model names only
            ("ma", "", None, "", "model:ma", "model"),
            ("FAST", "", None, "", "alias:fast", "model"),
            ("pa", "", None, "", "policy:pa", "policy pa entry 0"),
            // the header beats the model; routing.policy beats the header
            ("ma", "", Some("pa"), "", "policy:pa", "policy pa entry 0"),
            (
                "ma",
                r#","routing":{"policy":"pb"}"#,
                Some("pa"),
                "",
                "policy:pb",
                "policy pb entry 1",
            ),
            // rules only for exactly `auto`
            ("auto", "", None, "", "chain:main", "model"),
            (
                "auto",
                r#","stream":true"#,
                None,
                "",
                "chain:side",
                "rule 0",
            ),
            (
                "auto:main",
                r#","stream":true"#,
                None,
                "",
                "chain:main",
                "model",
            ),
            ("ma", r#","stream":true"#, None, "", "model:ma", "model"),
            (
                "auto",
                "",
                None,
                r#"{"team":"ads"}"#,
                "policy:pb",
                "policy pb entry 1 rule 1",
            ),
            // a policy entry's condition
            (
                "pb",
                "",
                None,
                r#"{"tier":"free"}"#,
                "policy:pb",
                "policy pb entry 0",
            ),
            // the header names a policy even for `auto`
            (
                "auto",
                r#","stream":true"#,
                Some("pa"),
                "",
                "policy:pa",
                "policy pa entry 0",
            ),
        ];
        for (model, extra, route, metadata, label, how) in cases {
            let body = format!(r#"{{"model":"{model}","messages":[]{extra}}}"#);
            let request =
                CallerRequest::OpenAi(ChatRequest::parse(Bytes::from(body)).expect("a valid body"));
            let headers = SteeringHeaders {
                route: route.map(str::to_string),
                router_off: false,
                metadata: if metadata.is_empty() {
                    Metadata::default()
                } else {
                    Metadata::parse(metadata.as_bytes()).expect("metadata")
                },
            };
            let routed = super::route(&t, &headers.steer(Surface::ChatCompletions, &request, 7))
                .expect("routed");
            let got = match routed.via {
                Via::Model => "model".to_string(),
                Via::Rule(n) => format!("rule {n}"),
                Via::Policy {
                    policy,
                    selection,
                    rule,
                } => format!(
                    "policy {} entry {}{}",
                    t.policy(policy).name,
                    selection
                        .entry
                        .map_or("none".to_string(), |e| e.to_string()),
                    rule.map_or(String::new(), |r| format!(" rule {r}"))
                ),
            };
            assert_eq!(
                (t.route(routed.route).label.as_ref(), got.as_str()),
                (*label, *how),
                "{model} {extra} {route:?} {metadata}"
            );
        }
    }

    #[test]
    fn names_that_do_not_exist_are_refused() {
        let t = Fixture::new(CONFIG).route_table();
        let request = CallerRequest::OpenAi(
            ChatRequest::parse(Bytes::from_static(
                br#"{"model":"ma","routing":{"policy":"nope"}}"#,
            ))
            .expect("valid"),
        );
        let headers = SteeringHeaders::default();
        assert_eq!(
            super::route(&t, &headers.steer(Surface::ChatCompletions, &request, 1)).err(),
            Some(DecideError::NoSuchPolicy { header: false })
        );
        let headers = SteeringHeaders {
            route: Some("nope".into()),
            ..SteeringHeaders::default()
        };
        let request = CallerRequest::OpenAi(
            ChatRequest::parse(Bytes::from_static(br#"{"model":"ma"}"#)).expect("ok"),
        );
        assert_eq!(
            super::route(&t, &headers.steer(Surface::ChatCompletions, &request, 1)).err(),
            Some(DecideError::NoSuchPolicy { header: true })
        );
    }

    /// The upstream models a plan would call, in order, if each failed.
    fn walk(t: &RouteTable, env: &PlanEnv<'_>, mut plan: Plan) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(choice) = plan.next(env, crate::attempt::Advance::NextDeployment) {
            plan.commit(&choice);
            let d = plan.deployment(&t.catalog, choice.target.position);
            out.push(d.map(|d| d.upstream_model.to_string()).unwrap_or_default());
        }
        out
    }

    #[test]
    fn a_keys_provider_order_holds_within_each_segment_and_leads_with_its_first_provider() {
        let k = Fixture::new(
            r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
models:
  both:
    strategy: round_robin
    deployments: [{ provider: a, model: x, priority: 1 }, { provider: b, model: y, priority: 1 }]
  solo: { deployments: [{ provider: a, model: z }] }
policies:
  backed: { select: [ { router: priority, targets: [ { model: solo } ] } ], on_failure: [both] }
"#,
        );
        let t = k.route_table();
        let env = k.env(false);
        let rankings = Rankings::build(&t, env.now_ms);
        let b = t.catalog.provider_by_id("b").expect("b").idx.get();
        let key = KeyRouting::build(
            &crate::config::KeyRoutingConfig {
                provider_order: vec![b],
                ..Default::default()
            },
            t.catalog.providers.len(),
        );
        let plan_for = |model: &str, turn: usize, key: Option<&KeyRouting>| {
            let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
            let request =
                CallerRequest::OpenAi(ChatRequest::parse(Bytes::from(body)).expect("a valid body"));
            let headers = SteeringHeaders::default();
            let routed = super::route(&t, &headers.steer(Surface::ChatCompletions, &request, 3))
                .expect("ok");
            let facts = RequestFacts {
                round_robin: turn,
                ..RequestFacts::default()
            };
            walk(&t, &env, plan(&t, &rankings, &env, &routed, facts, key))
        };
        // Round robin alone takes turns; with the key's order, b leads every turn.
        assert_eq!(plan_for("both", 0, None), ["x", "y"]);
        assert_eq!(plan_for("both", 1, None), ["y", "x"]);
        for turn in 0..3 {
            assert_eq!(
                plan_for("both", turn, Some(&key)),
                ["y", "x"],
                "turn {turn}"
            );
        }
        // A policy's selected model stays first: the order holds within its fallbacks.
        assert_eq!(plan_for("backed", 0, Some(&key)), ["z", "y", "x"]);
    }

    #[test]
    fn metadata_must_be_a_small_flat_object() {
        assert!(Metadata::parse(br#"{"a":"x","n":1.5,"b":true}"#).is_ok());
        for bad in [
            &br#"[1]"#[..],
            br#"{"a":{"b":1}}"#,
            br#"{"a":null}"#,
            b"not json",
        ] {
            assert!(
                Metadata::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(MAX_METADATA));
        assert!(Metadata::parse(big.as_bytes()).is_err());
    }
}
