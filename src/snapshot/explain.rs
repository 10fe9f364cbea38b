//! Explain: why a request would go where it goes, without calling anyone.
//!
//! The request (its body as a caller sends it, and its `x-llm-*` headers) goes through the
//! same code as on the proxy: `decide::route` (precedence, rules, the policy entry and its
//! pick) and `decide::plan`, then the plan is walked to the end with health and rpm windows as
//! they stand. Only what the proxy applies is left out (claiming a half-open probe slot,
//! advancing round-robin and credential cursors), so explaining changes nothing. The answer
//! is JSON: the route and how it was reached (which rules were tried, which `select` entry
//! held and why, the weighted shares or the complexity tier), every candidate kept or skipped
//! with its reason, and the order the attempts would take if each failed. Explained as a
//! client key (`?key=<id>`), the key's own routing is applied as on the proxy and shown
//! (`key_routing`: its fields, which of them this request left in force), and the guardrail
//! profiles it would run with their modes (`guardrails`). A knn entry's decision (`via.knn`:
//! the outcome, the neighbours' similarities, each target's predicted quality, cost term and
//! utility) is made as on the proxy, with the request embedded first by the admin endpoint
//! ([`explain_embedded`]; the command line has no listener to embed through). `POST
//! /admin/explain` returns it; `signalbox explain` prints it.

use crate::catalog::surface::Surface;
use bytes::Bytes;
use serde_json::{json, Value};

use std::sync::Arc;

use super::{Runtime, Snapshot};
use crate::adapters::caller::CallerRequest;
use crate::attempt::Advance;
use crate::catalog::{stable_hash, ProviderIdx};
use crate::error::{ErrorCode, GatewayError};
use crate::health::HealthShared;
use crate::routing::decide::{self, SteeringHeaders, Via};
use crate::routing::key::KeyRouting;
use crate::routing::plan::{Plan, PlanEnv, RequestFacts};
use crate::routing::policy::{EntryRouter, Pick};
use crate::routing::rank::Rankings;
use crate::routing::scoring::cost_micro;

/// Who a request is explained for: nobody (no key), a configured client key, or a caller that
/// does not exist yet (`signalbox explain --budget-used-pct N --allowed-model GLOB`). The
/// hypothetical fields, given with a key, replace that key's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Caller<'a> {
    /// A configured client key, by id (its `allowed_models`, routing and facts apply).
    pub key: Option<&'a str>,
    /// `budget.used_pct` (0–100 and beyond) as the caller's; `budget.remaining_usd` follows
    /// from the key's budget, and never matches without one.
    pub budget_used_pct: Option<f64>,
    /// `allowed_models` globs as the caller's (matched lower-cased, as a key's are).
    pub allowed_models: Option<&'a [String]>,
}

/// What a request is explained against: a routing snapshot, its rankings, and the live
/// process-wide health (clock, degraded mode).
struct View<'r> {
    tables: Arc<Snapshot>,
    rankings: Arc<Rankings>,
    health: &'r HealthShared,
    /// The live runtime (the knn router's pools).
    runtime: &'r Runtime,
}

/// Explain a request given as a body and its headers (by lower-case name), as `caller` would
/// send it (its rate limits and budget are not consumed). A knn entry decides without an
/// embedding here (`knn=embed_failed`, or `cold`): [`explain_embedded`] makes one first.
pub fn explain<'a>(
    router: &Runtime,
    surface: Surface,
    body: Bytes,
    header: impl Fn(&str) -> Option<&'a [u8]>,
    caller: Caller<'_>,
) -> Value {
    let view = View {
        tables: router.snapshot.load_full(),
        rankings: router.rankings.load_full(),
        health: &router.health,
        runtime: router,
    };
    explain_in(&view, surface, body, header, caller, None)
}

/// [`explain`], with the embedding a knn entry needs made first (through the gateway's own
/// plan, as on the proxy) when the request would be decided by one: the admin endpoint's.
pub async fn explain_embedded(
    router: &Runtime,
    surface: Surface,
    body: Bytes,
    headers: &http::HeaderMap,
    caller: Caller<'_>,
) -> Value {
    let header = |name: &str| headers.get(name).map(http::HeaderValue::as_bytes);
    let mut vector = None;
    if router.snapshot.load().knn.is_some() {
        if let Ok(request) = CallerRequest::parse(surface, body.clone()) {
            let tables = router.snapshot.load_full();
            let pending = SteeringHeaders::read(
                header("x-llm-route"),
                header("x-llm-router"),
                header("x-llm-metadata"),
            )
            .ok()
            .and_then(|h| {
                let mut steering = h.steer(surface, &request, 0);
                let lookup = |name: &str| header(name);
                steering.headers = Some(decide::HeaderLookup(&lookup));
                decide::route(&tables, &steering).ok()
            })
            .is_some_and(|r| r.knn_pending());
            vector = crate::knn::explain_vector(router, &request, pending).await;
        }
    }
    let view = View {
        tables: router.snapshot.load_full(),
        rankings: router.rankings.load_full(),
        health: &router.health,
        runtime: router,
    };
    explain_in(&view, surface, body, header, caller, Some(vector))
}

/// [`explain`] against a draft snapshot (`POST /admin/explain` with `config`): built from a
/// validated document with the live health carried over, never installed.
pub fn explain_draft<'a>(
    router: &Runtime,
    draft: Snapshot,
    surface: Surface,
    body: Bytes,
    header: impl Fn(&str) -> Option<&'a [u8]>,
    caller: Caller<'_>,
) -> Value {
    let rankings = Rankings::build(&draft, router.health.now_ms());
    let view = View {
        tables: Arc::new(draft),
        rankings: Arc::new(rankings),
        health: &router.health,
        runtime: router,
    };
    explain_in(&view, surface, body, header, caller, None)
}

/// Per catalog model (by index): whether `globs` (lower-cased) match its name.
fn models_matching(tables: &Snapshot, globs: &[String]) -> Arc<[bool]> {
    tables
        .catalog
        .models
        .iter()
        .map(|m| {
            let name = m.name.to_ascii_lowercase();
            globs
                .iter()
                .any(|g| crate::glob::matches(g.as_bytes(), name.as_bytes()))
        })
        .collect()
}

/// The explanation; `knn_vector` is the embedding a knn entry decides by: `Some(None)` when
/// one was asked for and could not be made, `None` when none was asked for.
fn explain_in<'a>(
    view: &View<'_>,
    surface: Surface,
    body: Bytes,
    header: impl Fn(&str) -> Option<&'a [u8]>,
    caller: Caller<'_>,
    knn_vector: Option<Option<Vec<f32>>>,
) -> Value {
    let tables = view.tables.clone();
    let request = match CallerRequest::parse(surface, body) {
        Ok(r) => r,
        Err(message) => return error(&GatewayError::new(ErrorCode::InvalidRequest, message)),
    };
    let key = match caller.key {
        None => None,
        Some(id) => match tables.keys.as_ref().and_then(|k| k.by_id(id)) {
            Some(k) => Some(k),
            None => {
                return error(&GatewayError::new(
                    ErrorCode::InvalidRequest,
                    "no client key has that id",
                ))
            }
        },
    };
    let not_allowed = || {
        error(&GatewayError::new(
            ErrorCode::ModelNotAllowed,
            "this API key may not use the model or route it named",
        ))
    };
    // The caller's scope: `--allowed-model` globs, else the key's.
    let globs: Option<Vec<String>> = caller
        .allowed_models
        .map(|g| g.iter().map(|s| s.to_ascii_lowercase()).collect());
    let scope: Option<Arc<[bool]>> = match &globs {
        Some(g) => Some(models_matching(&tables, g)),
        None => key.and_then(|k| k.models().cloned()),
    };
    if let Some(g) = &globs {
        let policy = request.routing().and_then(|r| r.policy.as_deref());
        let route = header("x-llm-route").and_then(|h| std::str::from_utf8(h).ok());
        let allows = |name: &str| {
            let name = name.to_ascii_lowercase();
            g.iter()
                .any(|glob| crate::glob::matches(glob.as_bytes(), name.as_bytes()))
        };
        if ![Some(&*request.model_name()), policy, route]
            .iter()
            .flatten()
            .all(|n| allows(n))
        {
            return not_allowed();
        }
    } else if let Some(key) = key {
        if !key.allows_request(&request, header("x-llm-route")) {
            return not_allowed();
        }
    }
    let headers = match SteeringHeaders::read(
        header("x-llm-route"),
        header("x-llm-router"),
        header("x-llm-metadata"),
    ) {
        Ok(h) => h,
        Err(why) => return error(&GatewayError::new(ErrorCode::InvalidRequest, why)),
    };
    // A fixed seed per body: the same request explains the same way twice.
    let seed = stable_hash(request.prompt());
    let mut steering = headers.steer(surface, &request, seed);
    let lookup = |name: &str| header(name);
    steering.headers = Some(decide::HeaderLookup(&lookup));
    let now_s = view.health.wall_s();
    let budget = match caller.budget_used_pct {
        Some(pct) => {
            #[allow(clippy::cast_precision_loss)]
            let usd = key.and_then(|k| k.budget.map(|b| b.micro_usd as f64 / 1e6));
            Some((pct, usd.map_or(f64::NAN, |usd| usd * (1.0 - pct / 100.0))))
        }
        None => key.and_then(|k| k.budget_facts(now_s)),
    };
    let hypothetical = caller.budget_used_pct.is_some() || caller.allowed_models.is_some();
    if key.is_some() || hypothetical {
        steering.key = Some(decide::KeyFacts {
            id: key.map(|k| &*k.id),
            user: key.and_then(|k| k.user.as_deref()),
            budget,
            models: scope.as_deref(),
            routing: key.and_then(|k| k.routing.as_ref()),
        });
    }
    let key_routing = key.and_then(|k| k.routing.as_ref());
    let mut routed = match decide::route(&tables, &steering) {
        Ok(r) => r,
        Err(e) => return error(&e.answer(&request)),
    };
    if routed.knn_pending() {
        let ask = crate::knn::Ask::from_lookup(&header, key.and_then(|k| k.user.as_deref()));
        let vector = knn_vector.flatten();
        crate::knn::explain_decide(
            view.runtime,
            &tables,
            &request,
            &ask,
            vector.as_deref(),
            &mut routed,
        );
    }
    let env = PlanEnv {
        catalog: &tables.catalog,
        health: &tables.health,
        now_ms: view.health.now_ms(),
        wall_s: view.health.wall_s(),
        degraded: view.health.degraded.is_degraded(),
    };
    let (input_tokens, input_tokens_anthropic) = decide::input_tokens(&tables, &routed, &request);
    let facts = RequestFacts {
        input_tokens,
        input_tokens_anthropic,
        output_tokens: request
            .max_tokens()
            .unwrap_or(decide::DEFAULT_OUTPUT_TOKENS),
        prefix_hash: None,
        session: None,
        round_robin: 0,
        seed,
        needs: request.needs(),
        surface,
    };
    let mut plan =
        decide::plan(&tables, &view.rankings, &env, &routed, facts, key_routing).explaining();
    if let Some(models) = &scope {
        plan.restrict_models(models.clone());
    }
    let mut order = Vec::new();
    while let Some(choice) = plan.next(&env, Advance::NextDeployment) {
        plan.commit(&choice);
        order.push(choice.target);
    }
    let name = |pos: usize| {
        plan.deployment(&tables.catalog, pos)
            .and_then(|d| d.routed_via.to_str().ok())
            .unwrap_or("?")
            .to_string()
    };
    let candidates: Vec<Value> = (0..plan.len())
        .map(|pos| candidate(&tables, &plan, pos, &order))
        .collect();
    // For `auto`, every rule and whether it held (the first that held decided).
    let rules: Vec<Value> = if request.model_name().eq_ignore_ascii_case("auto") {
        decide::rules_holding(&tables, &steering)
            .into_iter()
            .enumerate()
            .map(|(n, held)| json!({ "rule": n, "held": held }))
            .collect()
    } else {
        Vec::new()
    };
    json!({
        "model": &*request.model_name(),
        "route": route_header(&tables, &routed),
        "rules": rules,
        "via": via(&tables, &routed, &request, scope.as_deref()),
        "strategy": routed.strategy.as_str(),
        "strategy_from": strategy_from(&request, key_routing),
        "smart_fallback": routed.smart_fallback,
        "max_attempts": max_attempts(&tables, &routed, key_routing),
        "key_routing": key.and_then(|k| Some(key_routing_json(&tables, &k.id, k.routing.as_ref()?, &request))),
        "needs": {
            "stream": request.needs().stream,
            "tools": request.needs().tools,
            "vision": request.needs().vision,
            "json_mode": request.needs().json_mode,
            "prompt_tokens": request.prompt_tokens(),
            "task": crate::adapters::input::task(&request),
            "agent": crate::adapters::agent::of_user_agent(header("user-agent")),
        },
        "first": plan.first_position().map(|p| json!({
            "candidate": name(p),
            "healthy": plan.first_was_healthy(),
        })),
        "candidates": candidates,
        "order": order.iter().map(|t| json!({
            "candidate": name(t.position),
            "probe": t.probe,
        })).collect::<Vec<_>>(),
        "degraded": env.degraded,
        "hedge": hedge(&tables, &plan, &routed, &order),
        "guardrails": guardrails(&tables, &routed, &request, header("x-llm-guardrails")),
    })
}

/// The guardrail profiles the request would run, in order, with their modes (the policy's
/// and those its `x-llm-guardrails` adds); `[]` when none, the caller's refusal for a header
/// naming an unknown profile.
fn guardrails(
    tables: &Snapshot,
    routed: &decide::Routed,
    request: &CallerRequest,
    header: Option<&[u8]>,
) -> Value {
    let Some(g) = &tables.guardrails else {
        return json!([]);
    };
    if matches!(request, CallerRequest::CountTokens(_)) {
        return json!([]);
    }
    let policy = match routed.via {
        Via::Policy { policy, .. } => Some(policy.get()),
        _ => None,
    };
    match g.wanted(policy, header) {
        Ok(wanted) => wanted
            .iter()
            .filter_map(|w| {
                let p = g.profiles.get(w.profile)?;
                Some(json!({
                    "profile": &*p.name,
                    "mode": w.mode.as_str(),
                    "on_unavailable": w.on_unavailable.as_str(),
                }))
            })
            .collect(),
        Err(e) => error(&e),
    }
}

/// When this route's hedge would start: its setting, the delay for the first candidate now
/// (`null` for a percentile while the target has no TTFB record: no hedge then), and the
/// candidate it would start.
fn hedge(
    tables: &Snapshot,
    plan: &Plan,
    routed: &decide::Routed,
    order: &[crate::routing::plan::Target],
) -> Value {
    let mut setting = tables.failover.hedge;
    if let Via::Policy { policy, .. } = routed.via {
        setting = tables.policy(policy).hedge.or(setting);
    }
    let Some(h) = setting else {
        return Value::Null;
    };
    let after = match h.after {
        crate::config::HedgeAfter::Fixed(d) => format!("{}ms", d.as_millis()),
        crate::config::HedgeAfter::Percentile(p) => format!("p{p}"),
    };
    let first = order.first().and_then(|t| {
        let d = plan.deployment(&tables.catalog, t.position)?;
        Some(crate::health::TargetRef {
            deployment: d.model.map(|_| d.idx),
            provider: d.provider,
            credential: t.credential,
        })
    });
    let starts =
        first.and_then(|t| crate::proxy::hedge::delay(&h, |p| tables.health.ttfb_percentile(t, p)));
    let with = order.get(1).and_then(|t| {
        plan.deployment(&tables.catalog, t.position)
            .and_then(|d| d.routed_via.to_str().ok())
            .map(str::to_string)
    });
    json!({
        "after": after,
        "min_after_ms": h.min_after.as_millis(),
        "max_share": h.max_share,
        "starts_after_ms": starts.map(|d| d.as_millis()),
        "candidate": with,
    })
}

/// Who chose the strategy: the request's `routing.strategy`, the key's `routing.strategy`, or
/// the route.
fn strategy_from(request: &CallerRequest, key: Option<&KeyRouting>) -> &'static str {
    if request.routing().is_some_and(|r| r.strategy.is_some()) {
        "request"
    } else if key.is_some_and(|k| k.strategy.is_some()) {
        "key"
    } else {
        "route"
    }
}

/// The attempt bound the request would run under: the policy's, else `failover`'s, lowered by
/// the key's (as the proxy sets it).
fn max_attempts(tables: &Snapshot, routed: &decide::Routed, key: Option<&KeyRouting>) -> u32 {
    let route_max = match routed.via {
        Via::Policy { policy, .. } => tables.policy(policy).max_attempts,
        _ => None,
    }
    .unwrap_or(tables.failover.max_attempts);
    key.map_or(route_max, |k| k.max_attempts(route_max))
}

/// The key's `routing` as configured, and which of its fields this request left in force (a
/// request's own `routing.strategy` and `routing.providers` replace the key's; its exclusions
/// always hold and show as `excluded_by_key` skips among the candidates).
fn key_routing_json(tables: &Snapshot, id: &str, k: &KeyRouting, request: &CallerRequest) -> Value {
    let name = |p: ProviderIdx| tables.catalog.provider(p).id.to_string();
    let overrides = request.routing();
    let excluded: Vec<String> = (0..tables.catalog.providers.len())
        .filter_map(|p| u32::try_from(p).ok().map(ProviderIdx))
        .filter(|p| k.excludes(*p))
        .map(name)
        .collect();
    json!({
        "key": id,
        "strategy": k.strategy.map(|s| s.as_str()),
        "strategy_applied": k.strategy.is_some() && overrides.is_none_or(|r| r.strategy.is_none()),
        "provider_order": k.provider_order().iter().copied().map(name).collect::<Vec<_>>(),
        "provider_order_applied": k.orders_providers() && overrides.is_none_or(|r| r.providers.is_none()),
        "exclude_providers": excluded,
        "max_attempts": k.configured_max_attempts(),
    })
}

fn error(e: &GatewayError) -> Value {
    let body: Value = serde_json::from_slice(&e.body()).unwrap_or(Value::Null);
    json!({ "status": e.status, "answer": body })
}

/// The `x-llm-route` the request would carry.
fn route_header(tables: &Snapshot, routed: &decide::Routed) -> String {
    let rule = match routed.via {
        Via::Rule(n) | Via::Policy { rule: Some(n), .. } => tables.rules.get(n),
        _ => None,
    };
    rule.map_or_else(
        || tables.route(routed.route).label.to_string(),
        |r| r.label.to_string(),
    )
}

/// How the request reached its route: rules tried, the policy entry that held and its pick.
fn via(
    tables: &Snapshot,
    routed: &decide::Routed,
    request: &CallerRequest,
    models: Option<&[bool]>,
) -> Value {
    let may_use = |m: usize| models.is_none_or(|ms| ms.get(m).copied().unwrap_or(false));
    let rule = |n: Option<usize>| n.map(|n| json!({ "rule": n, "matched": true }));
    match routed.via {
        Via::Model => json!({ "kind": "model" }),
        Via::Rule(n) => json!({ "kind": "rule", "rule": rule(Some(n)) }),
        Via::Policy {
            policy,
            selection,
            rule: r,
        } => {
            let p = tables.policy(policy);
            let entry = selection.entry.and_then(|i| p.entries.get(i));
            let shares = match entry.map(|e| &e.router) {
                Some(EntryRouter::Weighted {
                    routes,
                    weights,
                    models,
                }) => routes
                    .iter()
                    .zip(crate::routing::policy::shares(weights, models, &may_use).iter())
                    .map(|(r, w)| {
                        let lead = tables
                            .route(*r)
                            .candidates
                            .first()
                            .and_then(|d| tables.catalog.deployment(*d).model)
                            .map(|m| tables.catalog.model(m).name.to_string());
                        json!({ "model": lead, "share": w })
                    })
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            };
            let pick = match selection.pick {
                Pick::Drawn { index, share } => json!({ "drawn": index, "share": share }),
                Pick::Tier(t) => {
                    let tier = ["simple", "medium", "complex"][t.min(2)];
                    json!({ "complexity": request.complexity().as_str(), "tier": tier })
                }
                Pick::Fixed => json!("fixed"),
                Pick::RouterOff => json!("router_off"),
                Pick::Knn(outcome) => json!({ "knn": outcome.as_str() }),
            };
            json!({
                "kind": "policy",
                "policy": &*p.name,
                "rule": rule(r),
                "entry": selection.entry,
                "why": match (selection.entry, entry) {
                    (None, _) => "no select entry held: on_failure only",
                    (Some(_), Some(e)) if e.when.is_some() => "its `when` held (earlier entries' did not)",
                    _ => "it has no `when` (earlier entries' did not hold)",
                },
                "shares": shares,
                "pick": pick,
                "knn": crate::knn::explain_json(tables, routed),
                "max_attempts": p.max_attempts,
                "failover_on_client_error": p.failover_on_client_error,
            })
        }
    }
}

/// One candidate: kept (and where in the order) or skipped (and why).
fn candidate(
    tables: &Snapshot,
    plan: &Plan,
    pos: usize,
    order: &[crate::routing::plan::Target],
) -> Value {
    let Some(d) = plan.deployment(&tables.catalog, pos) else {
        return Value::Null;
    };
    let facts = plan.facts();
    let tried = order.iter().position(|t| t.position == pos);
    let skipped = plan
        .skips()
        .iter()
        .find(|(p, _)| *p == pos)
        .map(|(_, r)| r.as_str());
    json!({
        "candidate": d.routed_via.to_str().unwrap_or("?"),
        "model": d.model.map(|m| tables.catalog.model(m).name.to_string()),
        "provider": &*tables.catalog.provider(d.provider).id,
        "priority": d.priority,
        "cost_micro": cost_micro(d, facts.input_tokens, facts.output_tokens),
        "attempt": tried.map(|i| i + 1),
        "skipped": if tried.is_some() { None } else { skipped.or(Some("not reached")) },
        // A full window names the limit that was full (seed 004's spill-over).
        "limit": match skipped {
            Some("rpm_full") if tried.is_none() => d.rpm.map(|n| json!({ "rpm": n })),
            Some("tpm_full" | "tokens_exceed_limit") if tried.is_none() => d.tpm.map(|n| json!({ "tpm": n })),
            _ => None,
        },
    })
}

/// `explain` as text, for the command line.
pub fn render_text(v: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if let Some(answer) = v.get("answer") {
        let _ = writeln!(out, "refused ({}): {answer}", v["status"]);
        return out;
    }
    let _ = writeln!(out, "route:    {}", v["route"].as_str().unwrap_or("?"));
    let _ = writeln!(out, "strategy: {}", v["strategy"].as_str().unwrap_or("?"));
    let _ = writeln!(out, "via:      {}", v["via"]);
    if v["key_routing"].is_object() {
        let _ = writeln!(out, "key:      {}", v["key_routing"]);
    }
    if let Some(first) = v["first"].as_object() {
        let _ = writeln!(
            out,
            "first:    {} ({})",
            first["candidate"].as_str().unwrap_or("?"),
            if first["healthy"] == true {
                "healthy"
            } else {
                "not healthy now"
            }
        );
    }
    if let Some(knn) = v["via"]["knn"].as_object() {
        let _ = writeln!(
            out,
            "knn:      {} (pool {}, {} examples)",
            knn["outcome"].as_str().unwrap_or("?"),
            knn["pool"].as_str().unwrap_or("?"),
            knn["examples"],
        );
        for t in knn["targets"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  {}: predicted quality {:.2}, cost term {:.2}, utility {:.2}",
                t["model"].as_str().unwrap_or("?"),
                t["predicted_quality"].as_f64().unwrap_or(0.0),
                t["cost_term"].as_f64().unwrap_or(0.0),
                t["utility"].as_f64().unwrap_or(0.0),
            );
        }
    }
    for g in v["guardrails"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "guardrail: {} ({}, unavailable: {})",
            g["profile"].as_str().unwrap_or("?"),
            g["mode"].as_str().unwrap_or("?"),
            g["on_unavailable"].as_str().unwrap_or("?"),
        );
    }
    let _ = writeln!(out, "candidates (ranked):");
    for (i, c) in v["candidates"].as_array().into_iter().flatten().enumerate() {
        let state = match (c["attempt"].as_u64(), c["skipped"].as_str()) {
            (Some(n), _) => format!("attempt {n}"),
            (None, Some(why)) => format!("skipped: {why}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}. {} (priority {}, cost_micro {}) {state}",
            i + 1,
            c["candidate"].as_str().unwrap_or("?"),
            c["priority"],
            c["cost_micro"],
        );
    }
    let order = v["order"].as_array().cloned().unwrap_or_default();
    if order.is_empty() {
        let _ = writeln!(out, "no attempt possible now");
    } else {
        let _ = writeln!(out, "attempt order if each fails:");
        for (i, t) in order.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. {}{}",
                i + 1,
                t["candidate"].as_str().unwrap_or("?"),
                if t["probe"] == true {
                    " (half-open probe)"
                } else {
                    ""
                }
            );
        }
    }
    out
}
