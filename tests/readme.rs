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
            "x-request-id" | "server-timing" | "date"
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

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_demo_is_true() {
    // As scripts/demo.sh starts them: --name demo --chunks 8 --gap-ms 80, one per listener.
    let shape = StreamShape {
        chunks: 8,
        gap: Duration::from_millis(80),
    };
    let a = mock_with("demo-0", |c| c.stream = shape).await;
    let b = mock_with("demo-1", |c| c.stream = shape).await;
    let (proxy, admin, down) = (free_port(), free_port(), refused_port());
    let dir = tempfile::tempdir().unwrap();
    let ports = [
        ("127.0.0.1:8080", format!("127.0.0.1:{proxy}")),
        ("127.0.0.1:9090", format!("127.0.0.1:{admin}")),
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
    let gw = GatewayBuilder::new(conf)
        .verbatim()
        .env("DEMO_ANTHROPIC_KEY", "sk-ant-demo")
        .listening_on(proxy, admin)
        .start();

    let readme = std::fs::read_to_string("README.md").unwrap();
    let examples = examples(&readme);
    assert!(examples.len() >= 6, "the demo section lost its examples");
    for example in examples {
        let command = local(&example.command);
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(&command)
                .output()
                .unwrap()
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
