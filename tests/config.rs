//! The command line: `-t` validates and lists every error (policies and rules included), JSON
//! configs load, `explain` prints the plan, the shipped example configs are valid.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::*;

fn signalbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_signalbox"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

#[test]
fn test_flag_lists_every_error_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        r#"
providers:
  a: { kind: openai, base_url: "ftp://nowhere" }
models:
  m: { deployments: [{ provider: ghost, model: x }] }
aliases: { f: missing }
failover: { max_attempts: 0, transient_retries: 9 }
"#,
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "providers.a.base_url:",
        "models.m.deployments[0].provider:",
        "aliases.f:",
        "failover.max_attempts:",
        "failover.transient_retries:",
    ] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }

    std::fs::write(&path, "providers: {}\nmodels: {}\nsurprise: 1\n").unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("surprise"));

    // The scoring multipliers and the credential choice, each out of range or unknown.
    std::fs::write(
        &path,
        r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9/v1", credential_choice: most_quota }
models:
  m: { deployments: [{ provider: a, model: x }] }
scoring: { headroom_threshold: 1, headroom_floor: 1.5, rate_limit_penalty: -0.1, rate_limit_decay: soon }
"#,
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "providers.a.credential_choice: unknown credential choice \"most_quota\" (round_robin, least_remaining_quota)",
        "scoring.headroom_threshold: must be above 0 and below 1, found 1",
        "scoring.headroom_floor: must be from 0 to 1, found 1.5",
        "scoring.rate_limit_penalty: must be from 0 to 1, found -0.1",
        "scoring.rate_limit_decay: \"soon\" is not a duration",
    ] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }
    std::fs::write(
        &path,
        "providers: {}\nmodels: {}\nscoring: { headroom: 1 }\n",
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("headroom"));
}

/// A parse-level error (an unknown key, a value of the wrong type) hides nothing: every
/// section's own errors are listed, and the rest is still validated.
#[test]
fn test_flag_lists_parse_errors_of_every_section_and_validates_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", prioirty: 1 }
models:
  m: { deployments: [{ provider: a, model: x }, { provider: a, model: y, wieght: 1 }] }
aliases: { f: missing }
failover: { max_attempts: lots }
helth: { cooldown: 1s }
"#,
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "providers.a.prioirty: unknown field `prioirty`",
        "models.m.deployments[1].wieght: unknown field `wieght`",
        "failover.max_attempts:",
        "helth: unknown field `helth`",
        // Validation of what parses: the alias to nothing.
        "aliases.f:",
    ] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }
}

#[test]
fn test_flag_lists_every_policy_and_rule_error_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policies.yaml");
    let long_regex = "a".repeat(1025);
    std::fs::write(
        &path,
        format!(
            r#"
providers:
  a: {{ kind: openai, base_url: "http://127.0.0.1:9001/v1" }}
models:
  m: {{ deployments: [{{ provider: a, model: up-m }}] }}
aliases: {{ fast: m }}
chains: {{ main: [m] }}
policies:
  FAST: {{ select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ] }}
  "a/b": {{ select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ] }}
  p:
    select:
      - {{ when: {{ foo.bar: 1 }}, router: priority, targets: [ {{ model: q }} ] }}
      - {{ when: {{ metadata.x: {{ $regex: "(a{{1000}}){{1000}}" }} }}, router: weighted, targets: [ {{ model: m }} ] }}
      - {{ router: complexity, tiers: {{ simple: m, medium: m }} }}
    on_failure: [ q ]
  q: {{ select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ] }}
rules:
  - {{ when: {{ $and: [ {{ params.tools: true }}, {{ metadata.team: {{ $inn: [a] }} }} ] }}, then: auto:main }}
  - {{ when: {{ metadata.x: {{ $regex: "{long_regex}" }} }}, then: nowhere }}
  - {{ when: {{ $and: [ {{ $or: [ {{ $and: [ {{ $or: [ {{ $and: [ {{ params.stream: true }} ] }} ] }} ] }} ] }} ] }}, then: p }}
  - {{ when: {{ params.stream: {{ $gt: 3 }} }}, then: auto:fast }}
  - {{ when: {{ header.authorization: {{ $regex: "^Bearer" }} }}, then: auto:main }}
  - {{ when: {{ $or: [ {{ header.x-api-key: k }}, {{ params.task: coding }}, {{ params.agent: claude }} ] }}, then: auto:main }}
"#
        ),
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "policies.FAST: the name is already used by aliases.fast",
        "policies.a/b: policy names are",
        "policies.p.select[0].when.foo.bar: unknown field family `foo`",
        "policies.p.select[0].targets[0].model: \"q\" is a policy; a policy cannot refer to another policy",
        "policies.p.select[1].when.metadata.x.$regex: the pattern compiles past the size limit",
        "policies.p.select[1].targets: router weighted needs at least one target with a positive weight",
        "policies.p.select[2].tiers: missing `complex`",
        "policies.p.on_failure[0]: \"q\" is a policy",
        "rules[0].when.$and[1].metadata.team: unknown operator `$inn`",
        "rules[1].when.metadata.x.$regex: the pattern is 1025 bytes",
        "rules[1].then: \"nowhere\" names nothing",
        "rules[2].when.$and[0].$or[0].$and[0].$or[0].$and: `$and`/`$or` nested more than 4 deep",
        "rules[3].when.params.stream.$gt: `$gt` compares numbers and `params.stream` is a boolean",
        "rules[4].when.header.authorization: `header.authorization` carries a credential and can never be read by a condition",
        "rules[5].when.$or[0].header.x-api-key: `header.x-api-key` carries a credential",
        "rules[5].when.$or[1].params.task: `params.task` is never `coding`; it is one of code, chat",
        "rules[5].when.$or[2].params.agent: `params.agent` is never `claude`",
    ] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }
}

#[test]
fn test_flag_lists_every_guardrail_and_recommend_error_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guardrails.yaml");
    let long_regex = "a".repeat(1025);
    std::fs::write(
        &path,
        format!(
            r#"
providers:
  a: {{ kind: openai, base_url: "http://127.0.0.1:9001/v1" }}
  c: {{ kind: anthropic, base_url: "http://127.0.0.1:9002/v1" }}
models:
  m: {{ deployments: [{{ provider: a, model: up-m }}] }}
guardrails:
  profiles:
    pats: {{ kind: patterns, patterns: ["(", "{long_regex}"], provider: a }}
    mod: {{ kind: moderation, provider: c, model: omni-moderation-latest, timeout: soon }}
    judge: {{ kind: classifier, model: nowhere, prompt: "safe or unsafe?" }}
    Bad: {{ kind: vibes }}
policies:
  p:
    select: [ {{ router: priority, targets: [ {{ model: m }} ] }} ]
    guardrails: [ {{ profile: missing, mode: block }}, {{ profile: pats, mode: loud, on_unavailable: maybe }} ]
recommend: {{ decision_model: nobody }}
"#
        ),
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "guardrails.profiles.pats.patterns[0]: not a valid regular expression",
        "guardrails.profiles.pats.patterns[1]: the pattern is 1025 bytes",
        "guardrails.profiles.pats.provider: a patterns profile does not take `provider`",
        "guardrails.profiles.mod.provider: moderation asks OpenAI's /moderations endpoint",
        "guardrails.profiles.mod.timeout: \"soon\" is not a duration",
        "guardrails.profiles.judge.model: no model, alias or policy \"nowhere\"",
        "guardrails.profiles.judge: a classifier profile needs `flag_on`",
        "guardrails.profiles.Bad: a profile name takes lower-case letters",
        "guardrails.profiles.Bad.kind: unknown kind \"vibes\"",
        "policies.p.guardrails[0].profile: no guardrail profile \"missing\"",
        "policies.p.guardrails[1].mode: \"loud\" is not a mode",
        "policies.p.guardrails[1].on_unavailable: \"maybe\" is not a mode",
        "recommend.decision_model: no model, alias or policy \"nobody\"",
    ] {
        assert!(err.contains(needle), "{needle} missing from:\n{err}");
    }
    // A policy entry without a mode is a parse error naming it.
    std::fs::write(
        &path,
        "providers:\n  a: { kind: openai, base_url: \"http://127.0.0.1:9001/v1\" }\nmodels:\n  m: { deployments: [{ provider: a, model: up-m }] }\nguardrails: { profiles: { x: { kind: patterns, patterns: [a] } } }\npolicies:\n  p: { select: [ { router: priority, targets: [ { model: m } ] } ], guardrails: [ { profile: x } ] }\n",
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("policies.p.guardrails[0]") && err.contains("missing field `mode`"),
        "{err}"
    );
}

#[test]
fn shipped_example_configs_are_valid() {
    for file in ["conf/signalbox.yaml", "conf/providers.example.yaml"] {
        let out = signalbox(&["-t", "-c", file]);
        assert!(
            out.status.success(),
            "{file}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn explain_prints_the_plan() {
    let out = signalbox(&["explain", "-c", "conf/signalbox.yaml", "auto"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("route:    chain:default"), "{text}");
    assert!(
        text.contains("first:    local-down/llama-3.1-8b (healthy)"),
        "{text}"
    );
    // Every candidate of the chain, in the order the walk would try them.
    let order = text
        .split("attempt order if each fails:\n")
        .nth(1)
        .unwrap_or("");
    assert!(
        order.starts_with(
            "  1. local-down/llama-3.1-8b\n  2. mock-a/gpt-4o-mini\n  3. mock-b/gpt-4o-mini-compat\n"
        ),
        "{text}"
    );
}

/// The README's policy and rule examples load, with the example config's models.
#[test]
fn the_readme_policy_examples_are_valid() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme.split("## Policies and rules").nth(1).unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .unwrap();
    let conf = std::fs::read_to_string("conf/signalbox.yaml").unwrap();
    let start = conf.find("\npolicies:").unwrap();
    let end = conf.find("\n# Bounds on one request").unwrap();
    let text = format!("{}\n{yaml}{}", &conf[..start], &conf[end..]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("readme.yaml");
    std::fs::write(&path, text).unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn explain_takes_headers_and_a_body() {
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body.json");
    std::fs::write(
        &body,
        r#"{"model":"auto","tools":[{"type":"function","function":{"name":"f"}}],"messages":[]}"#,
    )
    .unwrap();
    // Tools: the first rule sends `auto` to the economy chain.
    let out = signalbox(&[
        "explain",
        "-c",
        "conf/signalbox.yaml",
        "--body",
        body.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("route:    rule:0"), "{text}");
    // A metadata header: the second rule sends it to the `spill` policy; --json as the admin
    // endpoint answers.
    let out = signalbox(&[
        "explain",
        "-c",
        "conf/signalbox.yaml",
        "--json",
        "--header",
        r#"x-llm-metadata: {"team":"support","tier":"free"}"#,
        "auto",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["route"], "rule:1", "{v:#}");
    assert_eq!(v["via"]["policy"], "spill", "{v:#}");
    assert_eq!(v["via"]["entry"], 0, "the free tier's entry: {v:#}");
    assert_eq!(v["order"][0]["candidate"], "mock-a/gpt-4o-mini", "{v:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_json_config_serves() {
    let m = mock("m").await;
    let proxy = free_port();
    let admin = free_port();
    let json = serde_json::json!({
        "listen": {"proxy": format!("127.0.0.1:{proxy}"), "admin": format!("127.0.0.1:{admin}")},
        "providers": {"p": {"kind": "openai", "base_url": m.base_url()}},
        "models": {"x": {"deployments": [{"provider": "p", "model": "up"}]}},
        "pingora": {"threads": 1, "grace_period_seconds": 0, "upgrade_sock": format!("/tmp/signalbox-test-{proxy}.sock")}
    });
    let gw = GatewayBuilder::new(json.to_string())
        .file_name("config.json")
        .listening_on(proxy, admin)
        .start();
    let r = post_chat(&gw, &chat("x")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(m.requests()[0].model.as_deref(), Some("up"));
}

/// A taken port: one line naming the address and the cause, a non-zero exit, nothing half
/// alive (before, the admin API answered `/healthz` while the proxy thread panicked).
#[test]
fn a_listener_that_cannot_bind_exits_with_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let other = free_port();
    let dir = tempfile::tempdir().unwrap();
    for (proxy, admin, key) in [(port, other, "listen.proxy"), (other, port, "listen.admin")] {
        let path = dir.path().join("taken.yaml");
        std::fs::write(
            &path,
            format!(
                "listen: {{ proxy: \"127.0.0.1:{proxy}\", admin: \"127.0.0.1:{admin}\" }}\nproviders:\n  a: {{ kind: openai, base_url: \"http://127.0.0.1:1/v1\" }}\nmodels:\n  m: {{ deployments: [{{ provider: a, model: x }}] }}\n"
            ),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let out = signalbox(&["-c", path.to_str().unwrap()]);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        let line = format!("signalbox: cannot listen on 127.0.0.1:{port} ({key}): ");
        assert!(err.contains(&line), "{err}");
        assert!(err.contains("in use"), "{err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", other)).is_err(),
            "nothing listens on the other port"
        );
    }
}

#[test]
fn routing_off_keeps_policies_validated_and_restore_health_zero_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("off.yaml");
    let base = "providers:\n  a: { kind: openai, base_url: \"http://127.0.0.1:9/v1\" }\nmodels:\n  m: { deployments: [{ provider: a, model: x }] }\n";
    // Switched off, a policy naming a model that does not exist is still an error.
    std::fs::write(
        &path,
        format!("{base}routing: {{ enabled: false }}\npolicies:\n  p: {{ select: [ {{ router: priority, targets: [ {{ model: ghost }} ] }} ] }}\n"),
    )
    .unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("policies.p.select[0].targets[0]"), "{err}");
    // `restore_health: 0` is the default, not an error; a value past 1 still is.
    std::fs::write(&path, format!("{base}health: {{ restore_health: 0 }}\n")).unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&path, format!("{base}health: {{ restore_health: 1.5 }}\n")).unwrap();
    let out = signalbox(&["-t", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("health.restore_health"));
}

/// `signalbox explain --key/--budget-used-pct/--allowed-model` (seed 004's `routing explain
/// thrifty --budget-used-pct 85`, `--allowed-model "anthropic:*"`): as a configured key, or as a
/// caller that does not exist yet, conditions and scope applied as on the proxy.
#[test]
fn explain_takes_a_callers_budget_and_scope() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("thrifty.yaml");
    std::fs::write(
        &path,
        "providers:\n  a: { kind: openai, base_url: \"http://127.0.0.1:9\" }\n  b: { kind: openai, base_url: \"http://127.0.0.1:9\" }\n\
         models:\n  nano: { deployments: [{ provider: a, model: up-nano }] }\n  big: { deployments: [{ provider: b, model: up-big }] }\n\
         policies:\n  thrifty:\n    select:\n      - { when: { budget.used_pct: { $gte: 80 } }, router: priority, targets: [ { model: nano } ] }\n      - { router: priority, targets: [ { model: big } ] }\n    on_failure: [ nano ]\n\
         keys:\n  - { id: team, key_env: SB_EXPLAIN_KEY, budget: { usd: 10, period: month }, allowed_models: [thrifty, big] }\n",
    )
    .unwrap();
    let conf = path.to_str().unwrap();
    let explain = |extra: &[&str]| {
        let mut args = vec!["explain", "-c", conf, "--json"];
        args.extend_from_slice(extra);
        args.push("thrifty");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_signalbox"))
            .args(&args)
            .env("SB_EXPLAIN_KEY", "sk-explain")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // Nobody: no budget, the second entry.
    let v = explain(&[]);
    assert_eq!(v["via"]["entry"], 1, "{v:#}");
    assert_eq!(v["order"][0]["candidate"], "b/up-big", "{v:#}");
    // 85 % spent, as a caller that does not exist yet: the thrifty entry.
    let v = explain(&["--budget-used-pct", "85"]);
    assert_eq!(v["via"]["entry"], 0, "{v:#}");
    assert_eq!(v["order"][0]["candidate"], "a/up-nano", "{v:#}");
    // The key as it stands (nothing spent), and its scope: `nano` is outside it.
    let v = explain(&["--key", "team"]);
    assert_eq!(v["via"]["entry"], 1, "{v:#}");
    let skipped: Vec<&str> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["skipped"].as_str())
        .collect();
    assert_eq!(skipped, ["not_allowed"], "{v:#}");
    // The key at 85 %: its scope leaves nothing of the thrifty entry but the key's refusal.
    let v = explain(&["--key", "team", "--budget-used-pct", "85"]);
    assert_eq!(v["via"]["entry"], 0, "{v:#}");
    assert!(v["order"].as_array().unwrap().is_empty(), "{v:#}");
    // A hypothetical scope: globs over what it sends and what may serve it.
    let v = explain(&["--allowed-model", "thrifty", "--allowed-model", "n*"]);
    assert_eq!(v["order"][0]["candidate"], "a/up-nano", "{v:#}");
    assert_eq!(v["candidates"][0]["skipped"], "not_allowed", "{v:#}");
    let v = explain(&["--allowed-model", "big"]);
    assert_eq!(
        v["status"], 403,
        "the name it sends is outside the scope: {v:#}"
    );
    // An unknown key is a refusal, not a plan.
    let v = explain(&["--key", "nobody"]);
    assert_eq!(v["status"], 400, "{v:#}");
}
