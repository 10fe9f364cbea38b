//! The client conformance suite: the tools people already use, unchanged, through the gateway.
//! Claude Code (print mode) on each provider kind, the Codex CLI (`exec`, Responses wire API),
//! openai-node's and the Anthropic Node SDK's stream helpers, aider (one message), LiteLLM and
//! LangChain, each at a pinned version installed by `scripts/clients-install.sh` (which `.ci/run`
//! runs) into `target/clients` (or `SIGNALBOX_CLIENTS_DIR`).
//!
//! Every run is a failover: the model's first deployment answers 500 or is dead (nothing
//! listens on its port), so every request the client makes is served by the second, on a
//! `signalbox-mock`. Each test checks the client got the mock's answer, the serving mock saw
//! every call on its dialect's endpoint (translated when the client speaks the other), and the
//! gateway's access line of every call shows 2 attempts.
//!
//! The clients never reach the internet: base URLs point at the gateway, update checks,
//! telemetry and plugin syncs are off, `HOME` is a temporary directory, the environment is
//! cleared but for `PATH`, and every run is killed after `CLIENT_TIMEOUT`. A client that is not
//! installed skips the test with a note, or fails it under `SIGNALBOX_CI=1`.

#![allow(clippy::unwrap_used)]

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Endpoint, MockHandle};

/// The model the clients name (Claude Code names its own: the globs below map them).
const MODEL: &str = "m";
/// The mock's answer.
const REPLY: &str = "Hello from signalbox-mock.";
/// The provider key's environment variable (the gateway's, never the client's).
const KEY_ENV: &str = "SIGNALBOX_CLIENTS_TEST_KEY";
/// The key the clients send (the gateway has no client keys here: any will do).
const CLIENT_KEY: &str = "sk-signalbox-client";
/// How long one client run may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);
/// Breakers off: every request meets the failing first deployment.
const NO_BREAKERS: &str =
    "health: { failure_threshold: 1000, bench_after: 64, cooldown: 1ms, respect_retry_after: false }\n";

// ---------------------------------------------------------------------------------------------
// Where the clients are

fn clients_dir() -> PathBuf {
    std::env::var_os("SIGNALBOX_CLIENTS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("target/clients"),
        PathBuf::from,
    )
}

/// `rel` inside part `part` of the clients dir, if that part is completely installed; else
/// the test skips (or, in CI, fails).
fn installed(part: &str, rel: &str) -> Option<PathBuf> {
    let dir = clients_dir().join(part);
    let path = dir.join(rel);
    if dir.join(".signalbox-complete").is_file() && path.exists() {
        return Some(path);
    }
    skip_unless_ci(&format!(
        "{} is not installed (scripts/clients-install.sh installs the pinned clients)",
        path.display()
    ));
    None
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(name)
}

/// A client's command with nothing of this environment but `PATH` (no proxy, no provider key
/// of the developer's, no config), `HOME` in `home` and its working directory there too.
fn client_command(program: &Path, home: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("LANG", "C.UTF-8")
        .env("NO_COLOR", "1")
        .current_dir(home);
    cmd
}

/// Run a client, bounded by `CLIENT_TIMEOUT`, off the test's runtime.
async fn run(cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || output_within(cmd, CLIENT_TIMEOUT))
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The gateway and its two deployments

/// How the first deployment fails.
#[derive(Clone, Copy, Debug)]
enum First {
    /// A mock answering every call 500.
    Answers500,
    /// Nothing listens on its port.
    Dead,
}

/// A gateway serving `MODEL` from `first` (failing, of `first_kind`), then a mock of
/// `serving_kind`.
struct Setup {
    gw: Gateway,
    /// The failing mock (`First::Answers500`).
    first: Option<MockHandle>,
    serving: MockHandle,
    serving_kind: Kind,
}

async fn setup(first: First, first_kind: Kind, serving_kind: Kind) -> Setup {
    let serving = mock("serving").await;
    let (first_mock, first_url) = match first {
        First::Answers500 => {
            let m = mock_with("first", |c| c.default_behaviour = status(500)).await;
            let url = m.base_url();
            (Some(m), url)
        }
        First::Dead => (None, format!("http://127.0.0.1:{}", refused_port())),
    };
    let config = format!(
        "providers:\n\
         \x20 first: {{ kind: {}, base_url: \"{first_url}\", credentials: [{{ id: k, key_env: {KEY_ENV} }}] }}\n\
         \x20 serving: {{ kind: {}, base_url: \"{}\", credentials: [{{ id: k, key_env: {KEY_ENV} }}] }}\n\
         models:\n\
         \x20 {MODEL}:\n\
         \x20   deployments: [{{ provider: first, model: up-first, priority: 1 }}, {{ provider: serving, model: up-serving, priority: 2 }}]\n\
         # The names clients have built in (Claude Code's opus/sonnet/haiku, Codex's gpt-5...).\n\
         aliases: {{ \"claude-*\": {MODEL}, \"gpt-*\": {MODEL} }}\n\
         log: {{ format: json }}\n\
         {NO_BREAKERS}",
        first_kind.name(),
        serving_kind.name(),
        serving.base_url(),
    );
    let gw = GatewayBuilder::new(config)
        .env(KEY_ENV, "sk-provider-key")
        .start();
    Setup {
        gw,
        first: first_mock,
        serving,
        serving_kind,
    }
}

impl Setup {
    fn base_url(&self) -> String {
        format!("http://{}", self.gw.proxy)
    }

    /// The serving mock's endpoint for a client's `endpoint` (chat and messages translate).
    fn upstream(&self, endpoint: Endpoint) -> Endpoint {
        match (endpoint, self.serving_kind) {
            (Endpoint::ChatCompletions | Endpoint::Messages, Kind::OpenAi) => {
                Endpoint::ChatCompletions
            }
            (Endpoint::ChatCompletions | Endpoint::Messages, Kind::Anthropic) => Endpoint::Messages,
            (other, _) => other,
        }
    }

    /// Every call the client made: on `endpoint` (`/v1/…` as the client sent it), answered 200
    /// by the serving deployment on its second attempt after the first failed, and each seen by
    /// the serving mock on its dialect's endpoint for its upstream model. The access lines.
    async fn assert_every_call_failed_over(&self, endpoint: &str, out: &Output) -> Vec<Value> {
        let calls = self.serving.calls();
        assert!(
            calls > 0,
            "no call reached the serving mock{}",
            self.report(out)
        );
        let lines = self.access_lines(calls).await;
        let upstream = self.upstream(endpoint_of(endpoint));
        assert_eq!(
            self.serving.calls_to(upstream),
            calls,
            "every call on {upstream:?}{}",
            self.report(out)
        );
        for r in self.serving.requests() {
            assert_eq!(
                r.model.as_deref(),
                Some("up-serving"),
                "{}",
                self.report(out)
            );
        }
        if let Some(first) = &self.first {
            assert_eq!(
                first.calls(),
                calls,
                "the first deployment was tried each time"
            );
        }
        for line in &lines {
            let ok = line["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(endpoint))
                && line["status"] == 200
                && line["attempts"] == 2
                && line["provider"] == "serving"
                && line["tried"].as_str().is_some_and(|t| {
                    t.starts_with("first/up-first:k:") && t.ends_with(",serving/up-serving:k:ok")
                });
            assert!(
                ok,
                "a call that did not fail over: {line}{}",
                self.report(out)
            );
        }
        lines
    }

    /// The JSON access lines of proxied calls, once there are `n` of them (each is written
    /// just after its response: polled, with a deadline).
    async fn access_lines(&self, n: u64) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.gw.stderr();
            let done = log.rsplit_once('\n').map_or("", |(d, _)| d);
            let lines: Vec<Value> = done
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["target"] == "access" && v["provider"] != "none")
                .collect();
            if lines.len() as u64 >= n || Instant::now() > deadline {
                assert_eq!(lines.len() as u64, n, "access lines:\n{log}");
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The client's output and the end of the gateway's log, for assertion messages.
    fn report(&self, out: &Output) -> String {
        let log = self.gw.stderr();
        let mut from = log.len().saturating_sub(4000);
        while !log.is_char_boundary(from) {
            from += 1;
        }
        let mut s = String::new();
        let _ = write!(
            s,
            "\n--- client ({}) stdout ---\n{}\n--- client stderr ---\n{}\n--- gateway log (end) ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            tail(&String::from_utf8_lossy(&out.stderr), 4000),
            &log[from..]
        );
        s
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut from = s.len().saturating_sub(n);
    while !s.is_char_boundary(from) {
        from += 1;
    }
    &s[from..]
}

fn endpoint_of(path: &str) -> Endpoint {
    match path {
        "/v1/chat/completions" => Endpoint::ChatCompletions,
        "/v1/messages" => Endpoint::Messages,
        "/v1/responses" => Endpoint::Responses,
        other => panic!("no endpoint for {other}"),
    }
}

/// The last line of stdout as JSON.
fn last_json(setup: &Setup, out: &Output) -> Value {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON from the client{}", setup.report(out)))
}

// ---------------------------------------------------------------------------------------------
// Claude Code: `claude -p`

/// Claude Code in print mode, asked to say hello, with its default model names (mapped by the
/// alias globs). The mock first answers a tool call (Claude Code sends its tools), which
/// Claude Code answers with a tool result, then the text: a whole agent turn over the gateway.
async fn claude_code(first: First, first_kind: Kind, serving_kind: Kind) {
    let Some(claude) = installed("node", "node_modules/.bin/claude") else {
        return;
    };
    let s = setup(first, first_kind, serving_kind).await;
    let home = tempfile::tempdir().unwrap();
    let mut cmd = client_command(&claude, home.path());
    cmd.args([
        "-p",
        "Say hello.",
        "--output-format",
        "json",
        "--max-turns",
        "4",
    ])
    .env("ANTHROPIC_BASE_URL", s.base_url())
    .env("ANTHROPIC_API_KEY", CLIENT_KEY)
    // Nothing but the gateway: no update check, telemetry, error reports or other traffic.
    .env("DISABLE_AUTOUPDATER", "1")
    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    .env("DISABLE_TELEMETRY", "1")
    .env("DISABLE_ERROR_REPORTING", "1")
    // A gateway error shows at once, not after ten retries with backoff.
    .env("CLAUDE_CODE_MAX_RETRIES", "0");
    let out = run(cmd).await;
    let v = last_json(&s, &out);
    assert_eq!(v["is_error"], false, "{}", s.report(&out));
    assert_eq!(v["result"], REPLY, "{}", s.report(&out));
    let lines = s.assert_every_call_failed_over("/v1/messages", &out).await;
    assert!(
        lines.len() >= 2,
        "the tool call's turn and the answer's: {}",
        s.report(&out)
    );
    // The tool call went out in the serving dialect and its result came back in it.
    let last = s.serving.requests().pop().unwrap().json().unwrap();
    let history = last["messages"].to_string();
    let result_marker = match serving_kind {
        Kind::Anthropic => "tool_result",
        Kind::OpenAi => "\"role\":\"tool\"",
    };
    assert!(
        history.contains(result_marker),
        "the tool result upstream: {history:.2000}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_print_mode_on_an_anthropic_provider() {
    claude_code(First::Answers500, Kind::Anthropic, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_print_mode_on_an_openai_provider_through_translation() {
    claude_code(First::Dead, Kind::Anthropic, Kind::OpenAi).await;
}

// ---------------------------------------------------------------------------------------------
// Codex CLI: `codex exec`, Responses wire API

#[tokio::test(flavor = "multi_thread")]
async fn codex_exec_over_the_responses_api() {
    let Some(codex) = installed("node", "node_modules/.bin/codex") else {
        return;
    };
    // Responses are served by OpenAI-kind providers only.
    let s = setup(First::Answers500, Kind::OpenAi, Kind::OpenAi).await;
    let home = tempfile::tempdir().unwrap();
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    // A custom provider pointing at the gateway; everything that would call elsewhere (the
    // update check, analytics, the plugin and app syncs) off.
    let config = format!(
        "model = \"{MODEL}\"\n\
         model_provider = \"signalbox\"\n\
         check_for_update_on_startup = false\n\
         \n\
         [model_providers.signalbox]\n\
         name = \"signalbox\"\n\
         base_url = \"{}/v1\"\n\
         env_key = \"SIGNALBOX_KEY\"\n\
         wire_api = \"responses\"\n\
         \n\
         [analytics]\n\
         enabled = false\n\
         \n\
         [features]\n\
         plugins = false\n\
         remote_plugin = false\n\
         plugin_sharing = false\n\
         apps = false\n\
         in_app_updates = false\n",
        s.base_url()
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let last_message = home.path().join("last-message.txt");
    let mut cmd = client_command(&codex, home.path());
    cmd.arg("exec")
        .arg("--skip-git-repo-check")
        .arg("--output-last-message")
        .arg(&last_message)
        .arg("Say hello.")
        .env("CODEX_HOME", &codex_home)
        .env("SIGNALBOX_KEY", CLIENT_KEY);
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", s.report(&out));
    let said = std::fs::read_to_string(&last_message).unwrap_or_default();
    assert_eq!(said.trim(), REPLY, "{}", s.report(&out));
    let lines = s.assert_every_call_failed_over("/v1/responses", &out).await;
    // Responses usage is counted (response.completed's usage).
    for line in &lines {
        assert!(
            line["completion_tokens"].as_u64().is_some_and(|n| n > 0),
            "usage on the access line: {line}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// openai-node and the Anthropic Node SDK: the stream helpers

/// `script` (`tests/clients/*.cjs`) with the installed node modules, for `MODEL`.
async fn node_sdk(script_name: &str, endpoint: &str, caller: Kind, serving_kind: Kind) {
    let Some(modules) = installed("node", "node_modules") else {
        return;
    };
    let s = setup(First::Dead, caller, serving_kind).await;
    let home = tempfile::tempdir().unwrap();
    let mut cmd = client_command(Path::new("node"), home.path());
    cmd.arg(script(script_name))
        .args([s.base_url().as_str(), MODEL])
        .env("NODE_PATH", &modules);
    let out = run(cmd).await;
    let v = last_json(&s, &out);
    assert!(v["error"].is_null(), "the SDK raised{}", s.report(&out));
    for h in v["headers"].as_array().unwrap() {
        assert_eq!(h["x-llm-attempts"], "2", "{}", s.report(&out));
        assert_eq!(h["x-llm-provider"], "serving", "{}", s.report(&out));
    }
    let (text, tools) = (&v["text"], &v["tools"]);
    for answer in [text, tools] {
        assert_eq!(answer["model"], MODEL, "{}", s.report(&out));
        assert_eq!(answer["role"], "assistant", "{}", s.report(&out));
    }
    assert_eq!(text["text"], REPLY, "{}", s.report(&out));
    let pieces: Vec<&str> = text["deltas"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(pieces.len() >= 2, "streamed in pieces{}", s.report(&out));
    assert_eq!(pieces.concat(), REPLY, "{}", s.report(&out));
    let args = json!({"query": "signalbox mock", "limit": 3});
    match caller {
        Kind::OpenAi => {
            assert_eq!(text["finish_reason"], "stop", "{}", s.report(&out));
            assert_eq!(tools["finish_reason"], "tool_calls", "{}", s.report(&out));
            let call = &tools["tool_calls"][0];
            assert_eq!(call["name"], "search", "{}", s.report(&out));
            let got: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(got, args, "{}", s.report(&out));
        }
        Kind::Anthropic => {
            assert_eq!(text["stop_reason"], "end_turn", "{}", s.report(&out));
            assert_eq!(text["usage"]["output_tokens"], 3, "{}", s.report(&out));
            assert_eq!(tools["stop_reason"], "tool_use", "{}", s.report(&out));
            let call = &tools["tool_uses"][0];
            assert_eq!(call["name"], "search", "{}", s.report(&out));
            assert_eq!(call["input"], args, "{}", s.report(&out));
        }
    }
    let lines = s.assert_every_call_failed_over(endpoint, &out).await;
    assert_eq!(lines.len(), 2, "the text call and the tool call");
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_node_final_chat_completion_on_an_openai_provider() {
    node_sdk(
        "openai_node.cjs",
        "/v1/chat/completions",
        Kind::OpenAi,
        Kind::OpenAi,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_node_final_chat_completion_on_an_anthropic_provider() {
    node_sdk(
        "openai_node.cjs",
        "/v1/chat/completions",
        Kind::OpenAi,
        Kind::Anthropic,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_node_final_message_on_an_anthropic_provider() {
    node_sdk(
        "anthropic_node.cjs",
        "/v1/messages",
        Kind::Anthropic,
        Kind::Anthropic,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_node_final_message_on_an_openai_provider() {
    node_sdk(
        "anthropic_node.cjs",
        "/v1/messages",
        Kind::Anthropic,
        Kind::OpenAi,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// aider: one message

/// `aider --message` against `MODEL` as an OpenAI-compatible model.
async fn aider(serving_kind: Kind) {
    let Some(aider) = installed("aider", "bin/aider") else {
        return;
    };
    let s = setup(First::Answers500, Kind::OpenAi, serving_kind).await;
    let home = tempfile::tempdir().unwrap();
    // The model's metadata from a file: aider would fetch LiteLLM's price list otherwise.
    let model = format!("openai/{MODEL}");
    let metadata = home.path().join("model-metadata.json");
    let entry = json!({model.clone(): {
        "max_input_tokens": 128000, "max_output_tokens": 4096, "litellm_provider": "openai",
        "mode": "chat", "input_cost_per_token": 0, "output_cost_per_token": 0,
    }});
    std::fs::write(&metadata, entry.to_string()).unwrap();
    let mut cmd = client_command(&aider, home.path());
    cmd.args(["--model", &model])
        .arg("--openai-api-base")
        .arg(format!("{}/v1", s.base_url()))
        .args(["--openai-api-key", CLIENT_KEY])
        .arg("--model-metadata-file")
        .arg(&metadata)
        .args([
            "--yes",
            "--no-git",
            "--no-check-update",
            "--no-analytics",
            "--no-show-release-notes",
            "--no-show-model-warnings",
            "--no-pretty",
            "--no-fancy-input",
            "--map-tokens",
            "0",
            "--message",
            "Say hello.",
        ])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", s.report(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.trim() == REPLY),
        "aider printed the answer{}",
        s.report(&out)
    );
    s.assert_every_call_failed_over("/v1/chat/completions", &out)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn aider_one_message_on_an_openai_provider() {
    aider(Kind::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn aider_one_message_on_an_anthropic_provider_through_translation() {
    aider(Kind::Anthropic).await;
}

// ---------------------------------------------------------------------------------------------
// LiteLLM and LangChain as clients

/// `client` of `tests/clients/python_clients.py` (speaking `caller`'s dialect), served by a
/// provider of each kind in turn: one call and one stream each time.
async fn python_client(client: &str, caller: Kind) {
    let Some(python) = installed("python", "bin/python") else {
        return;
    };
    let endpoint = match caller {
        Kind::OpenAi => "/v1/chat/completions",
        Kind::Anthropic => "/v1/messages",
    };
    for serving_kind in [caller, caller.other()] {
        let s = setup(First::Answers500, caller, serving_kind).await;
        let home = tempfile::tempdir().unwrap();
        let mut cmd = client_command(&python, home.path());
        cmd.arg(script("python_clients.py"))
            .args([client, s.base_url().as_str(), MODEL])
            // LiteLLM's price list from the package, not from the internet.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
        let out = run(cmd).await;
        let v = last_json(&s, &out);
        let on = format!("{client} on {serving_kind:?}");
        assert!(v["error"].is_null(), "{on}: it raised{}", s.report(&out));
        assert_eq!(v["text"], REPLY, "{on}{}", s.report(&out));
        assert_eq!(v["streamed_text"], REPLY, "{on}{}", s.report(&out));
        assert!(
            v["pieces"].as_array().is_some_and(|p| p.len() >= 2),
            "{on}: streamed in pieces{}",
            s.report(&out)
        );
        assert_eq!(v["model"], MODEL, "{on}{}", s.report(&out));
        let lines = s.assert_every_call_failed_over(endpoint, &out).await;
        assert_eq!(lines.len(), 2, "{on}: the call and the stream");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn litellm_as_an_openai_client() {
    python_client("litellm-openai", Kind::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn litellm_as_an_anthropic_client() {
    python_client("litellm-anthropic", Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn langchain_openai() {
    python_client("langchain-openai", Kind::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn langchain_anthropic() {
    python_client("langchain-anthropic", Kind::Anthropic).await;
}
