//! The README's demo, run: every `$` command of its first section against the demo setup
//! (`conf/signalbox.yaml` with two mock providers, as `scripts/demo.sh` starts them), and
//! every output line the README shows found in what the command printed. A README example
//! that stops being true fails here.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use signalbox_mock::StreamShape;

/// One `$` command of the README and the output lines shown under it.
struct Example {
    command: String,
    expected: Vec<String>,
}

/// The `console` blocks of the README's demo section (everything before `## `).
fn examples(readme: &str) -> Vec<Example> {
    let demo = readme.split("\n## ").next().unwrap_or("");
    let mut out: Vec<Example> = Vec::new();
    let mut in_console = false;
    for line in demo.lines() {
        if line.starts_with("```") {
            in_console = line == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            out.push(Example {
                command: command.to_string(),
                expected: Vec::new(),
            });
        } else if let Some(last) = out.last_mut() {
            last.expected.push(line.to_string());
        }
    }
    out
}

/// Whether `output` shows what the README line promises. Values that change every run (ids,
/// timings, dates) and elided lines are not compared; header names compare case-insensitively.
fn shows(output: &str, line: &str) -> bool {
    let line = line.trim();
    if line.is_empty() || line.contains("...") && !line.starts_with('{') {
        return true;
    }
    if line.starts_with('{') {
        // A JSON body: the `model` the caller gets back.
        return line
            .split(',')
            .filter(|kv| kv.starts_with("\"model\":"))
            .all(|kv| output.contains(kv));
    }
    if let Some((name, value)) = line.split_once(": ") {
        if matches!(
            name.to_ascii_lowercase().as_str(),
            "x-request-id" | "server-timing" | "x-llm-response-duration-ms" | "date"
        ) {
            return true;
        }
        return output.lines().any(|l| {
            l.split_once(": ")
                .is_some_and(|(n, v)| n.eq_ignore_ascii_case(name) && v.trim() == value)
        });
    }
    output.lines().any(|l| l.trim() == line)
}

/// What `scripts/demo.sh` sets up, read from the script itself so the test cannot drift from
/// it: the environment it exports for the gateway (`export NAME="${NAME:-value}"`) and the
/// mocks' `--name`, `--chunks` and `--gap-ms`.
struct Demo {
    env: Vec<(String, String)>,
    name: String,
    shape: StreamShape,
}

fn demo_script() -> Demo {
    let script = std::fs::read_to_string("scripts/demo.sh").unwrap();
    let export =
        regex::Regex::new(r#"(?m)^export ([A-Z0-9_]+)="\$\{([A-Z0-9_]+):-([^}]*)\}"$"#).unwrap();
    let env: Vec<(String, String)> = export
        .captures_iter(&script)
        .map(|c| {
            assert_eq!(c[1], c[2], "demo.sh: {}", &c[0]);
            (c[1].to_string(), c[3].to_string())
        })
        .collect();
    let flag = |name: &str| {
        regex::Regex::new(&format!(r"signalbox-mock [^\n]*?--{name} (\S+)"))
            .unwrap()
            .captures(&script.replace("\\\n", " "))
            .unwrap_or_else(|| panic!("demo.sh starts the mocks without --{name}"))[1]
            .to_string()
    };
    Demo {
        env,
        name: flag("name"),
        shape: StreamShape {
            chunks: flag("chunks").parse().unwrap(),
            gap: Duration::from_millis(flag("gap-ms").parse().unwrap()),
        },
    }
}

#[test]
fn the_demo_script_is_read_as_it_runs() {
    let demo = demo_script();
    let names: Vec<&str> = demo.env.iter().map(|(k, _)| k.as_str()).collect();
    // The admin token is what makes `/admin/health` need a token in the demo.
    assert!(names.contains(&"SIGNALBOX_ADMIN_TOKEN"), "{names:?}");
    assert!(names.contains(&"DEMO_ANTHROPIC_KEY"), "{names:?}");
    assert_eq!(demo.name, "demo");
    assert!(demo.shape.chunks > 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_demo_is_true() {
    // As scripts/demo.sh starts them: its --name, --chunks and --gap-ms, one per listener.
    let demo = demo_script();
    let shape = demo.shape;
    let a = mock_with(&format!("{}-0", demo.name), |c| c.stream = shape).await;
    let b = mock_with(&format!("{}-1", demo.name), |c| c.stream = shape).await;
    let (proxy, admin, down) = (free_port(), free_port(), refused_port());
    let dir = tempfile::tempdir().unwrap();
    let ports = [
        ("127.0.0.1:8080", format!("127.0.0.1:{proxy}")),
        ("127.0.0.1:9901", format!("127.0.0.1:{admin}")),
        ("127.0.0.1:9001", a.addr().to_string()),
        ("127.0.0.1:9002", b.addr().to_string()),
        ("127.0.0.1:9003", format!("127.0.0.1:{down}")),
    ];
    let local = |text: &str| {
        ports
            .iter()
            .fold(text.to_string(), |t, (from, to)| t.replace(from, to))
    };
    let conf = local(&std::fs::read_to_string("conf/signalbox.yaml").unwrap())
        .replace(
            "/tmp/signalbox.pid",
            &dir.path().join("pid").display().to_string(),
        )
        .replace(
            "/tmp/signalbox_upgrade.sock",
            &dir.path().join("sock").display().to_string(),
        );
    // The gateway gets exactly the environment demo.sh exports.
    let gw = demo
        .env
        .iter()
        .fold(GatewayBuilder::new(conf).verbatim(), |g, (k, v)| {
            g.env(k, v)
        })
        .listening_on(proxy, admin)
        .start();

    let readme = std::fs::read_to_string("README.md").unwrap();
    let examples = examples(&readme);
    assert!(examples.len() >= 6, "the demo section lost its examples");
    for example in examples {
        let command = local(&example.command);
        // "From another terminal": the demo's exports are not in the reader's shell.
        let unset: Vec<String> = demo.env.iter().map(|(k, _)| k.clone()).collect();
        let output = tokio::task::spawn_blocking(move || {
            let mut sh = std::process::Command::new("sh");
            for k in &unset {
                sh.env_remove(k);
            }
            sh.arg("-c").arg(&command).output().unwrap()
        })
        .await
        .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        for line in &example.expected {
            assert!(
                shows(&printed, line),
                "README: `{}`\nshows  {line}\nprinted:\n{printed}\n{}",
                example.command,
                gw.stderr()
            );
        }
    }
}

/// The Guardrails section's example (profiles of every kind, a policy mandating two, a
/// decision model) is a valid config with the demo's providers and models.
#[test]
fn the_readme_guardrails_example_is_valid() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme.split("\n## Guardrails\n").nth(1).unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .unwrap();
    assert!(yaml.contains("kind: patterns") && yaml.contains("kind: moderation"));
    assert!(yaml.contains("kind: classifier") && yaml.contains("recommend:"));
    let conf = std::fs::read_to_string("conf/signalbox.yaml").unwrap();
    // The shipped config's policies and rules (which name them), guardrails and recommend
    // replaced by the README's.
    let policies = conf.find("\npolicies:").unwrap();
    let bounds = conf.find("\n# Bounds on one request").unwrap();
    let guardrails = conf.find("\n# Guardrails:").unwrap();
    let text = format!("{}\n{yaml}{}", &conf[..policies], &conf[bounds..guardrails]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("readme-guardrails.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_signalbox"))
        .args(["-t", "-c", path.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Learned routing section's example (`routing_knn` with every key, a knn policy) is a
/// valid config with the demo's providers and models (its embedding model included).
#[test]
fn the_readme_learned_routing_example_is_valid() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme.split("\n## Learned routing\n").nth(1).unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .unwrap();
    assert!(yaml.contains("routing_knn:") && yaml.contains("router: knn"));
    let conf = std::fs::read_to_string("conf/signalbox.yaml").unwrap();
    // The shipped config's policies and rules (which name them) replaced by the README's, and
    // its own `routing_knn` (at the end, after the guardrails) left out.
    let policies = conf.find("\npolicies:").unwrap();
    let bounds = conf.find("\n# Bounds on one request").unwrap();
    let guardrails = conf.find("\n# Guardrails:").unwrap();
    let text = format!("{}\n{yaml}{}", &conf[..policies], &conf[bounds..guardrails]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("readme-knn.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_signalbox"))
        .args(["-t", "-c", path.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let broken = format!(
        "{}\n{}{}",
        &conf[..policies],
        yaml.replace("embedding_model: text-embed", "embedding_model: nope"),
        &conf[bounds..guardrails]
    );
    std::fs::write(&path, broken).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_signalbox"))
        .args(["-t", "-c", path.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("routing_knn.embedding_model"), "{text}");
}
