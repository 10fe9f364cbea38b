//! Observability: the access line (text and `log.format: json`), and the shipped Grafana
//! dashboard and Prometheus alert rules checked against the metric families a running gateway
//! exports.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use signalbox_mock::MockHandle;

const CANARY: &str = "sk-obs-canary-41d7e2b90c";

const DASHBOARD: &str = include_str!("../conf/grafana/signalbox.json");
const ALERTS: &str = include_str!("../conf/prometheus/signalbox-alerts.yml");
const README: &str = include_str!("../README.md");

/// `a` (keyed with the canary, tried first) and `b` (keyless) both serve `gpt-4o-mini`.
fn config(a: &MockHandle, b: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\", priority: 1, credentials: [{{ id: main, key_env: OBS_CANARY_KEY }}] }}\n\
           \x20 b: {{ kind: openai, base_url: \"{}\", priority: 2 }}\n\
         models:\n  gpt-4o-mini:\n    deployments:\n      - {{ provider: a, model: gpt-4o-mini-2024 }}\n      - {{ provider: b, model: llama-8b }}\n\
         {extra}",
        a.base_url(),
        b.base_url(),
    )
}

fn start(a: &MockHandle, b: &MockHandle, extra: &str) -> Gateway {
    GatewayBuilder::new(config(a, b, extra))
        .env("OBS_CANARY_KEY", CANARY)
        .start()
}

/// The log's complete lines (the gateway may be writing the last one as it is read).
fn complete_lines(log: &str) -> impl Iterator<Item = &str> {
    log.rsplit_once('\n').map_or("", |(done, _)| done).lines()
}

/// The first complete log line `pick` accepts, once it is written (the access line follows
/// the response: poll, with a deadline).
async fn log_line<T>(gw: &Gateway, pick: impl Fn(&str) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = gw.stderr();
        if let Some(found) = complete_lines(&log).find_map(&pick) {
            return found;
        }
        assert!(Instant::now() < deadline, "no such line in:\n{log}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_access_line_names_every_attempt_and_never_a_secret() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b, "log: { format: json }\n");
    // The mock's error body echoes the credential it received: it must not reach the log.
    a.set_default(status(503));
    let r = post_chat(&gw, &chat("gpt-4o-mini")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let id = header(&r, "x-request-id").to_string();
    r.text().await.unwrap();

    let line = gw.json_access_line(&id).await;
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["route"], "model:gpt-4o-mini", "{line}");
    assert_eq!(line["provider"], "b", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["attempts"], 2, "{line}");
    assert_eq!(
        line["tried"], "a/gpt-4o-mini-2024:main:server_error,b/llama-8b:none:ok",
        "{line}"
    );
    let ttfb = line["ttfb_ms"].as_f64().unwrap_or_else(|| panic!("{line}"));
    let total = line["duration_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("{line}"));
    assert!(ttfb > 0.0 && ttfb <= total, "{line}");
    // The mock reports usage: the prompt's estimate and three completion tokens.
    assert!(line["prompt_tokens"].as_u64().is_some(), "{line}");
    assert_eq!(line["completion_tokens"], 3, "{line}");
    assert_eq!(line["stream_broken"], false, "{line}");
    assert!(
        line.get("error").is_none(),
        "a relayed answer has no error: {line}"
    );

    // signalbox answering itself: the error code, no provider, no attempt, no TTFB.
    let r = post_chat(&gw, &chat("no-such-model")).await;
    assert_eq!(r.status(), 400);
    let id = header(&r, "x-request-id").to_string();
    r.text().await.unwrap();
    let line = gw.json_access_line(&id).await;
    assert_eq!(line["error"], "model_not_found", "{line}");
    assert_eq!(line["provider"], "none", "{line}");
    assert_eq!(line["status"], 400, "{line}");
    assert_eq!(line["tried"], "", "{line}");
    for absent in ["ttfb_ms", "prompt_tokens", "completion_tokens"] {
        assert!(line.get(absent).is_none(), "{absent} in {line}");
    }

    // The whole log is JSON (Pingora's bridged lines too), and no secret or address is in it.
    let log = gw.stderr();
    assert!(a
        .requests()
        .iter()
        .all(|r| r.header("authorization") == Some(&format!("Bearer {CANARY}"))));
    assert!(
        !log.contains(CANARY),
        "the provider key leaked into the log"
    );
    for l in complete_lines(&log).filter(|l| !l.trim().is_empty()) {
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.is_object()),
            "not a JSON object: {l}"
        );
    }
    for l in log.lines().filter(|l| l.contains("\"target\":\"access\"")) {
        for m in [&a, &b] {
            assert!(!l.contains(&m.addr().port().to_string()), "{l}");
        }
        assert!(!l.contains("http"), "{l}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn text_access_line_carries_the_same_fields() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b, "");
    a.set_default(status(503));
    let r = post_chat(&gw, &chat("gpt-4o-mini")).await;
    let id = header(&r, "x-request-id").to_string();
    r.text().await.unwrap();
    let needle = format!("request_id={id}");
    let line = log_line(&gw, |l| l.contains(&needle).then(|| l.to_string())).await;
    for field in [
        " access: ",
        "route=model:gpt-4o-mini ",
        "provider=b ",
        "status=200 ",
        "attempts=2 ",
        "tried=a/gpt-4o-mini-2024:main:server_error,b/llama-8b:none:ok ",
        "ttfb_ms=",
        "duration_ms=",
        "completion_tokens=3 ",
        "stream_broken=false",
    ] {
        assert!(line.contains(field), "{field:?} missing from {line}");
    }
    assert!(!line.contains("error="), "{line}");
    assert!(
        !gw.stderr().contains(CANARY),
        "the provider key leaked into the log"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_access_line_names_the_method_and_path_and_the_status_the_caller_got() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b, "log: { format: json }\n");
    // A HEAD of the root: signalbox's own 404, with its method and path (no query string).
    let r = client()
        .head(gw.url("/?token=secret-q"))
        .header("x-request-id", "obs-head-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let line = gw.json_access_line("obs-head-1").await;
    assert_eq!(line["method"], "HEAD", "{line}");
    assert_eq!(line["path"], "/", "{line}");
    assert_eq!(line["status"], 404, "{line}");
    assert!(!line.to_string().contains("secret-q"), "{line}");

    // A caller that gives up before the header: 499 `cancelled`, not the 200 it never got.
    a.set_default(signalbox_mock::Behaviour::SlowHeader { ms: 3000 });
    b.set_default(signalbox_mock::Behaviour::SlowHeader { ms: 3000 });
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = impatient
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "obs-gone-1")
        .json(&chat("gpt-4o-mini"))
        .send()
        .await;
    assert!(gone.is_err(), "the caller timed out");
    let line = gw.json_access_line("obs-gone-1").await;
    assert_eq!(line["status"], 499, "{line}");
    assert_eq!(line["error"], "cancelled", "{line}");
    assert_eq!(line["method"], "POST", "{line}");
    assert_eq!(line["path"], "/v1/chat/completions", "{line}");
    assert!(
        line["tried"].as_str().unwrap().ends_with(":cancelled"),
        "the attempt ended when the caller left: {line}"
    );
    assert!(
        line["duration_ms"].as_f64().unwrap() < 2500.0,
        "noticed at once, not when the provider answered: {line}"
    );

    // A stream the provider ends with its error event after content: the relayed 200, broken.
    a.set_default(signalbox_mock::Behaviour::InbandErrorAfter {
        chunks: 2,
        error_type: None,
    });
    let mut body = chat("gpt-4o-mini");
    body["stream"] = serde_json::json!(true);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "obs-broken-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (text, _) = read_all(r).await;
    assert!(text.contains("error"), "{text}");
    let line = gw.json_access_line("obs-broken-1").await;
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["stream_broken"], true, "{line}");

    // The same on Pingora's own loop (no first-chunk hold).
    let fast = start(
        &a,
        &b,
        "log: { format: json }\nfailover: { first_chunk_hold: 0 }\n",
    );
    let r = client()
        .post(fast.url("/v1/chat/completions"))
        .header("x-request-id", "obs-broken-2")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (text, _) = read_all(r).await;
    assert!(text.contains("error"), "{text}");
    let line = fast.json_access_line("obs-broken-2").await;
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["stream_broken"], true, "{line}");
}

// === the dashboard and the alert rules against /metrics ===

/// `signalbox_*` metric names in a PromQL expression.
fn metric_names(expr: &str, out: &mut BTreeSet<String>) {
    let re = regex::Regex::new(r"\bsignalbox_[a-zA-Z0-9_]+").unwrap();
    for m in re.find_iter(expr) {
        out.insert(m.as_str().to_string());
    }
}

/// Every PromQL expression of the dashboard: panel targets (`expr`, rows' nested panels
/// included) and the template variables' queries.
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(xs) => xs.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

fn dashboard_metrics() -> BTreeSet<String> {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    // Importable: a Prometheus data source variable that every panel and query uses.
    let vars = d["templating"]["list"].as_array().expect("templating");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a Prometheus data source variable"
    );
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate id"
        );
        assert!(p["gridPos"]["w"].as_u64().is_some(), "{p}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            assert!(t["refId"].is_string() && t["expr"].is_string(), "{t}");
        }
    }
    let mut exprs = Vec::new();
    dashboard_exprs(&d, &mut exprs);
    let mut names = BTreeSet::new();
    for e in &exprs {
        metric_names(e, &mut names);
    }
    names
}

fn alert_metrics() -> BTreeSet<String> {
    let doc: serde_yaml::Value = serde_yaml::from_str(ALERTS).expect("the alert rules are YAML");
    let groups = doc["groups"].as_sequence().expect("groups");
    let mut names = BTreeSet::new();
    let mut alerts = BTreeSet::new();
    for g in groups {
        assert!(g["name"].as_str().is_some(), "a group has a name");
        for r in g["rules"].as_sequence().expect("rules") {
            let alert = r["alert"].as_str().expect("an alerting rule");
            assert!(alerts.insert(alert.to_string()), "duplicate alert {alert}");
            assert!(
                r["labels"]["severity"].as_str().is_some(),
                "{alert}: severity"
            );
            assert!(
                r["annotations"]["summary"].as_str().is_some(),
                "{alert}: summary"
            );
            if let Some(d) = r["for"].as_str() {
                assert!(humantime::parse_duration(d).is_ok(), "{alert}: for {d}");
            }
            metric_names(r["expr"].as_str().expect("expr"), &mut names);
        }
    }
    for a in [
        "SignalboxTargetEjected",
        "SignalboxHighErrorRatio",
        "SignalboxNoHealthyProvider",
        "SignalboxDegradedMode",
        "SignalboxConfigReloadFailed",
    ] {
        assert!(alerts.contains(a), "{a} missing from {alerts:?}");
    }
    names
}

/// Families on `/metrics` by their `# TYPE` lines, each checked to have a `# HELP` line too.
/// Dense counters without a sample yet are announced by these lines alone (see `metrics`), so
/// every registered family counts, whether or not traffic reached it.
fn exported_families(scrape: &str) -> BTreeMap<String, String> {
    let mut families = BTreeMap::new();
    for l in scrape.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(
                scrape.contains(&format!("# HELP {name} ")),
                "{name} has no HELP line"
            );
            families.insert(name.to_string(), kind.to_string());
        }
    }
    families
}

/// Whether `name` is an exported family, or a `_bucket`/`_sum`/`_count` series of an exported
/// histogram.
fn is_exported(name: &str, families: &BTreeMap<String, String>) -> bool {
    if families.contains_key(name) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .and_then(|base| families.get(base))
            .is_some_and(|kind| kind == "histogram")
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_and_alerts_name_only_exported_metrics() {
    let dashboard = dashboard_metrics();
    let alerts = alert_metrics();
    // The extraction found what the files are about.
    for name in [
        "signalbox_requests_total",
        "signalbox_failovers_total",
        "signalbox_breaker_state",
        "signalbox_ejections_total",
        "signalbox_upstream_latency_seconds_bucket",
        "signalbox_upstream_ttfb_seconds_bucket",
        "signalbox_requests_in_flight",
        "signalbox_rule_matches_total",
        "signalbox_policy_selections_total",
        "signalbox_skipped_candidates_total",
        "signalbox_config_generation",
        "signalbox_config_reloads_total",
        "signalbox_tokens_total",
        "signalbox_spend_usd_total",
        "signalbox_ledger_rows_total",
        "signalbox_state_backend_up",
        "signalbox_route_unservable",
    ] {
        assert!(dashboard.contains(name), "the dashboard lacks {name}");
    }
    for name in [
        "signalbox_breaker_state",
        "signalbox_requests_total",
        "signalbox_healthy_provider_ratio",
        "signalbox_route_unservable",
        "signalbox_degraded",
        "signalbox_config_reloads_total",
    ] {
        assert!(alerts.contains(name), "the alerts lack {name}");
    }

    // A gateway with a little traffic: a success, then a failover.
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b, "");
    let r = post_chat(&gw, &chat("gpt-4o-mini")).await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    a.set_default(status(503));
    let r = post_chat(&gw, &chat("gpt-4o-mini")).await;
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    r.text().await.unwrap();
    let scrape = gw
        .metrics_with(&[r#"signalbox_failovers_total{provider="a",reason="server_error"} 1"#])
        .await;
    let families = exported_families(&scrape);

    let mut missing = Vec::new();
    for (source, names) in [("dashboard", &dashboard), ("alert rules", &alerts)] {
        for name in names {
            if !is_exported(name, &families) {
                missing.push(format!("{source}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "referenced but not exported: {missing:?}\nexported: {:?}",
        families.keys().collect::<Vec<_>>()
    );

    // The README's catalogue lists every exported family, and every family it lists is
    // announced by this gateway, which has neither a ledger nor Redis.
    for name in families.keys() {
        assert!(
            README.contains(&format!("`{name}")),
            "{name} is not in README.md's metrics catalogue"
        );
    }
    let catalogue = readme_catalogue();
    assert!(catalogue.len() > 20, "{catalogue:?}");
    let absent: Vec<&String> = catalogue
        .iter()
        .filter(|n| !families.contains_key(*n))
        .collect();
    assert!(
        absent.is_empty(),
        "the README lists them, a gateway without a ledger or Redis does not export them: {absent:?}"
    );

    // No 5xx yet: the 5xx series do not exist (dense counters export what was counted), so a
    // share whose numerator selects them must fall back to 0 or its panel and the alert's
    // expression are empty instead of 0.
    assert!(
        !scrape.contains(r#"status_class="5xx""#),
        "a 5xx series before any 5xx"
    );
    let mut shares = Vec::new();
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    dashboard_exprs(&d, &mut shares);
    let doc: serde_yaml::Value = serde_yaml::from_str(ALERTS).unwrap();
    for g in doc["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            shares.push(r["expr"].as_str().unwrap().to_string());
        }
    }
    let shares: Vec<&String> = shares
        .iter()
        .filter(|e| e.contains(r#"status_class="5xx""#) && e.contains('/'))
        .collect();
    assert!(
        shares.len() >= 3,
        "the two 5xx panels and the alert: {shares:?}"
    );
    for e in shares {
        assert!(
            e.contains("or vector(0)")
                || e.contains("or 0 *")
                || e.contains("or\n") && e.contains("0 * sum"),
            "a 5xx share without a fallback to 0: {e}"
        );
    }
}

/// The metric family names of the README's catalogue table (`| `signalbox_…` | kind | …`).
fn readme_catalogue() -> Vec<String> {
    let re = regex::Regex::new(r"`(signalbox_[a-z0-9_]+)`").unwrap();
    README
        .lines()
        .filter(|l| l.starts_with("| `signalbox_"))
        .filter_map(|l| l.split(" | ").next())
        .flat_map(|cell| {
            re.captures_iter(cell)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One provider, failing: `signalbox_healthy_provider_ratio` stays 1 (it is evaluated only
/// from `health.degraded.min_providers` providers), so the route-level gauge is what tells
/// that nothing can serve, and `/admin/ready` says so too.
#[tokio::test(flavor = "multi_thread")]
async fn a_one_provider_gateway_that_cannot_serve_says_so_in_metrics_and_readiness() {
    let a = mock("a").await;
    let gw = GatewayBuilder::new(format!(
        "providers:\n{}models:\n  m:\n    deployments: [{{ provider: a, model: up-m }}]\n\
         chains: {{ default: [m] }}\nactive_chain: default\n\
         health: {{ failure_threshold: 1, cooldown: 10m, max_ejection: 10m, probe_interval: 1h }}\n",
        provider("a", &a)
    ))
    .start();
    let ready = || async {
        let r = client()
            .get(format!("http://{}/admin/ready", gw.admin))
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.unwrap(),
        )
    };
    let serving = gw
        .metrics_with(&[r#"signalbox_route_unservable{route="model:m"} 0"#])
        .await;
    assert!(
        serving.contains(r#"signalbox_route_unservable{route="chain:default"} 0"#),
        "{serving}"
    );
    let (code, v) = ready().await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["nothing_can_serve"], false, "{v}");

    // The provider fails once: its only target is ejected for 10 minutes.
    a.set_default(status(503));
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 502);
    r.text().await.unwrap();
    let down = gw
        .metrics_with(&[
            r#"signalbox_route_unservable{route="model:m"} 1"#,
            r#"signalbox_route_unservable{route="chain:default"} 1"#,
        ])
        .await;
    assert!(
        down.contains("signalbox_healthy_provider_ratio 1"),
        "the ratio cannot tell below min_providers: {down}"
    );
    let (code, v) = ready().await;
    assert_eq!(code, 503, "every request would be a 503: {v}");
    assert_eq!(v["nothing_can_serve"], true, "{v}");
    assert_eq!(v["proxy_listener_bound"], true, "{v}");
    let cannot = v["routes_that_cannot_serve"].as_array().unwrap();
    assert!(cannot.contains(&serde_json::json!("chain:default")), "{v}");
    // And requests are indeed refused without a call.
    let calls = a.calls();
    expect_error(
        post_chat(&gw, &chat("m")).await,
        503,
        "no_provider_available",
    )
    .await;
    assert_eq!(a.calls(), calls, "no upstream call");
}

/// `HEAD /metrics`: the head a `GET` would get (no token, the exposition's content type and
/// length), no body.
#[tokio::test(flavor = "multi_thread")]
async fn head_metrics_answers_the_head_without_the_body() {
    let a = mock("a").await;
    let b = mock("b").await;
    let gw = start(&a, &b, "");
    let url = format!("http://{}/metrics", gw.admin);
    let r = client().head(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/plain; version=0.0.4");
    let length: usize = header(&r, "content-length").parse().unwrap();
    assert!(length > 1000, "the exposition's length: {length}");
    assert!(r.bytes().await.unwrap().is_empty());
    // The GET of the same families is about as long (gauges may change in between).
    let body = client()
        .get(&url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.len().abs_diff(length) < body.len() / 10,
        "{length} vs {}",
        body.len()
    );
}
