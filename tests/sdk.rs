//! The official SDKs as callers: the OpenAI Python SDK and the Anthropic Python SDK (pinned, from
//! PyPI, in the virtualenv `scripts/sdk-venv.sh` builds) drive the gateway, which talks to mock
//! providers of either kind over loopback. Each test runs one of the small scripts in
//! `tests/sdk/`, which prints what the SDK saw (text, tool calls, stop reason, usage, model, the
//! gateway's headers, or the exception it raised) as one JSON object.
//!
//! Covered: each SDK against each provider kind (same dialect and translated), JSON, streams and
//! tool calls; failover across dialects; the first-chunk hold (a stream that fails before its
//! first content reaches the SDK only as the next target's good stream); and the stream contract
//! (a stream that breaks after content makes the SDK raise, and counts as `stream_aborted`).
//!
//! The venv: `SIGNALBOX_SDK_PYTHON` names its python, else `target/sdk-venv/bin/python`, which
//! the first test of each process builds by running `scripts/sdk-venv.sh` (a fast no-op once
//! complete; it serialises concurrent builds on a file lock).

#![allow(clippy::unwrap_used)]

mod common;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Behaviour, MockHandle};

/// The model name the SDKs send; each deployment's upstream name differs from it.
const MODEL: &str = "m";
/// The mock's answer (chunked into 3 content events by `common::mock`).
const REPLY: &str = "Hello from signalbox-mock.";
/// Its word count: the mock's completion/output tokens for `REPLY`.
const REPLY_TOKENS: u64 = 3;
/// The environment variable holding the provider key (Anthropic endpoints require one).
const KEY_ENV: &str = "SIGNALBOX_SDK_TEST_KEY";
/// How long one SDK script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Breakers effectively off: the tests that fail a target repeatedly look at each request.
const NO_BREAKERS: &str =
    "health: { failure_threshold: 1000, bench_after: 64, cooldown: 1ms, respect_retry_after: false }\n";

fn tool_args() -> Value {
    json!({"query": "signalbox mock", "limit": 3})
}

// ---------------------------------------------------------------------------------------------
// The venv and the scripts

/// The venv's python (built on first use in this process).
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("SIGNALBOX_SDK_PYTHON") {
                return PathBuf::from(p);
            }
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let venv = root.join("target/sdk-venv");
            // A no-op when the venv is complete; other test processes building it at the same
            // time wait on the script's lock.
            let out = Command::new("bash")
                .arg(root.join("scripts/sdk-venv.sh"))
                .arg(&venv)
                .stdin(Stdio::null())
                .output()
                .expect("run scripts/sdk-venv.sh");
            assert!(
                out.status.success(),
                "scripts/sdk-venv.sh failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            venv.join("bin/python")
        })
        .clone()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sdk {
    OpenAi,
    Anthropic,
}

/// What one SDK call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Json,
    Stream,
    Tools,
    StreamTools,
}

impl Mode {
    fn streams(self) -> bool {
        matches!(self, Mode::Stream | Mode::StreamTools)
    }

    fn tools(self) -> bool {
        matches!(self, Mode::Tools | Mode::StreamTools)
    }
}

impl Sdk {
    fn script(self) -> &'static str {
        match self {
            Sdk::OpenAi => "openai_client.py",
            Sdk::Anthropic => "anthropic_client.py",
        }
    }

    /// The script's case name for `mode`.
    fn case(self, mode: Mode) -> &'static str {
        match (self, mode) {
            (Sdk::OpenAi, Mode::Json) => "chat",
            (Sdk::OpenAi, Mode::Tools) => "chat_tools",
            (Sdk::Anthropic, Mode::Json) => "message",
            (Sdk::Anthropic, Mode::Tools) => "message_tools",
            (_, Mode::Stream) => "stream",
            (_, Mode::StreamTools) => "stream_tools",
        }
    }
}

/// What the SDK saw, with the gateway's log for the assertion messages.
struct Seen {
    v: Value,
    log: String,
}

impl Seen {
    fn header(&self, name: &str) -> &str {
        self.v["headers"][name].as_str().unwrap_or("")
    }

    fn error(&self) -> &Value {
        &self.v["error"]
    }

    fn list(&self, key: &str) -> Vec<&str> {
        self.v[key]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.log.as_str();
        let mut from = log.len().saturating_sub(3000);
        while !log.is_char_boundary(from) {
            from += 1;
        }
        write!(
            f,
            "the SDK saw: {:#}\n--- gateway log (end) ---\n{}",
            self.v,
            &log[from..]
        )
    }
}

/// Call the gateway with `sdk` in `mode` for `MODEL`.
async fn call(sdk: Sdk, gw: &Gateway, mode: Mode) -> Seen {
    let base_url = format!("http://{}", gw.proxy);
    let case = sdk.case(mode);
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(sdk.script());
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(python());
        cmd.arg(script)
            .args([base_url.as_str(), case, MODEL])
            .env("PYTHONDONTWRITEBYTECODE", "1");
        // Loopback only: no proxy from the environment in between.
        for var in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env_remove(var);
        }
        output_within(cmd, SCRIPT_TIMEOUT)
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "{} {case}: no JSON result ({}):\n{stdout}{}\n--- gateway log ---\n{}",
                sdk.script(),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                gw.stderr()
            )
        });
    Seen {
        v,
        log: gw.stderr(),
    }
}

// ---------------------------------------------------------------------------------------------
// Providers and configs

/// A target of model `MODEL`: provider `id` of `kind` on a mock, upstream model `up-<id>`.
type Target<'a> = (&'a str, Kind, &'a MockHandle);

/// `MODEL` served by `targets` in order, and `extra` config sections.
fn config(targets: &[Target<'_>], extra: &str) -> String {
    let mut providers = String::new();
    let mut deployments = Vec::new();
    for (i, (id, kind, mock)) in targets.iter().enumerate() {
        providers.push_str(&format!(
            "  {id}: {{ kind: {}, base_url: \"{}\", credentials: [{{ id: k, key_env: {KEY_ENV} }}] }}\n",
            kind.name(),
            mock.base_url()
        ));
        deployments.push(format!(
            "{{ provider: {id}, model: up-{id}, priority: {} }}",
            i + 1
        ));
    }
    format!(
        "providers:\n{providers}models:\n  {MODEL}:\n    deployments: [{}]\n{NO_BREAKERS}{extra}",
        deployments.join(", ")
    )
}

fn start(targets: &[Target<'_>], extra: &str) -> Gateway {
    GatewayBuilder::new(config(targets, extra))
        .env(KEY_ENV, "sk-provider-key")
        .start()
}

/// `mock` got `calls` calls, all on its kind's endpoint, the last for its upstream model.
fn assert_called(mock: &MockHandle, kind: Kind, calls: u64, seen: &Seen) {
    assert_eq!(
        mock.calls_to(kind.endpoint()),
        calls,
        "calls to {} on {:?}: {seen}",
        mock.name(),
        kind.endpoint()
    );
    assert_eq!(mock.calls(), calls, "calls to {}: {seen}", mock.name());
    if calls > 0 {
        let last = mock.requests().pop().unwrap();
        let upstream = format!("up-{}", mock.name());
        assert_eq!(
            last.model.as_deref(),
            Some(upstream.as_str()),
            "the deployment's model name upstream: {seen}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// What a good answer looks like to each SDK

fn assert_no_error(seen: &Seen) {
    assert!(seen.error().is_null(), "the SDK raised: {seen}");
}

/// A complete text answer `REPLY`, under the caller's model name.
fn assert_text_answer(sdk: Sdk, streamed: bool, seen: &Seen) {
    assert_no_error(seen);
    assert_eq!(seen.v["model"], MODEL, "the caller's model name: {seen}");
    assert_eq!(seen.v["text"], REPLY, "{seen}");
    match sdk {
        Sdk::OpenAi => {
            assert_eq!(seen.v["finish_reason"], "stop", "{seen}");
            assert_eq!(seen.v["usage"]["completion_tokens"], REPLY_TOKENS, "{seen}");
            assert!(
                seen.v["tool_calls"].as_array().unwrap().is_empty(),
                "{seen}"
            );
            if streamed {
                let models = seen.list("chunk_models");
                assert!(
                    !models.is_empty() && models.iter().all(|m| *m == MODEL),
                    "the caller's model name in every chunk: {seen}"
                );
            }
        }
        Sdk::Anthropic => {
            assert_eq!(seen.v["stop_reason"], "end_turn", "{seen}");
            assert_eq!(seen.v["usage"]["output_tokens"], REPLY_TOKENS, "{seen}");
            assert_eq!(seen.v["blocks"], json!(["text"]), "{seen}");
            if streamed {
                assert_eq!(
                    seen.v["start_model"], MODEL,
                    "message_start's model: {seen}"
                );
                let events = seen.list("events");
                assert_eq!(events.first(), Some(&"message_start"), "{seen}");
                assert_eq!(events.last(), Some(&"message_stop"), "{seen}");
            }
        }
    }
    if streamed {
        assert_eq!(seen.v["streamed_text"], REPLY, "{seen}");
        assert!(
            seen.list("deltas").len() >= 2,
            "the text came in pieces: {seen}"
        );
    }
}

/// One call of the tool `search` with the mock's arguments, its id from a provider of `kind`.
fn assert_tool_answer(sdk: Sdk, kind: Kind, streamed: bool, seen: &Seen) {
    assert_no_error(seen);
    assert_eq!(seen.v["model"], MODEL, "the caller's model name: {seen}");
    let calls = seen.v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "one tool call: {seen}");
    let call = &calls[0];
    assert_eq!(call["name"], "search", "{seen}");
    let id = call["id"].as_str().unwrap_or("");
    assert!(
        id.starts_with(kind.tool_id_prefix()) && id.len() > kind.tool_id_prefix().len(),
        "the provider's tool call id: {seen}"
    );
    match sdk {
        Sdk::OpenAi => {
            assert_eq!(seen.v["finish_reason"], "tool_calls", "{seen}");
            assert_eq!(call["type"], "function", "{seen}");
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {seen}"));
            assert_eq!(args, tool_args(), "{seen}");
        }
        Sdk::Anthropic => {
            assert_eq!(seen.v["stop_reason"], "tool_use", "{seen}");
            assert_eq!(call["input"], tool_args(), "{seen}");
            if streamed {
                assert_eq!(seen.list("events").last(), Some(&"message_stop"), "{seen}");
            }
        }
    }
    if streamed {
        let pieces = seen.list("argument_deltas");
        assert!(
            pieces.len() >= 2,
            "the arguments came in pieces, the SDK put them together: {seen}"
        );
        let joined: Value = serde_json::from_str(&pieces.concat())
            .unwrap_or_else(|e| panic!("the argument pieces are not JSON together ({e}): {seen}"));
        assert_eq!(joined, tool_args(), "{seen}");
    }
}

fn assert_answer(sdk: Sdk, kind: Kind, mode: Mode, seen: &Seen) {
    if mode.tools() {
        assert_tool_answer(sdk, kind, mode.streams(), seen);
    } else {
        assert_text_answer(sdk, mode.streams(), seen);
    }
}

// ---------------------------------------------------------------------------------------------
// a, b, c: each SDK against each provider kind

/// `sdk` calls `MODEL`, served by one provider of `kind`.
async fn one_provider(sdk: Sdk, kind: Kind, mode: Mode) {
    let a = mock("a").await;
    let gw = start(&[("a", kind, &a)], "");
    let seen = call(sdk, &gw, mode).await;
    assert_answer(sdk, kind, mode, &seen);
    assert_eq!(seen.header("x-llm-provider"), "a", "{seen}");
    assert_eq!(seen.header("x-llm-attempts"), "1", "{seen}");
    let content_type = if mode.streams() {
        "text/event-stream"
    } else {
        "application/json"
    };
    assert!(
        seen.header("content-type").starts_with(content_type),
        "{seen}"
    );
    assert_called(&a, kind, 1, &seen);
    let sent = a.requests().pop().unwrap();
    assert_eq!(sent.stream, mode.streams(), "streamed upstream: {seen}");
    // The request as the provider's dialect has it (translated when the SDK speaks the other).
    let body = sent.json().unwrap();
    if kind == Kind::Anthropic {
        assert!(body["max_tokens"].is_u64(), "max_tokens upstream: {body}");
    }
    assert!(
        body["messages"][0]["content"]
            .to_string()
            .contains("Say hello."),
        "the prompt upstream: {body}"
    );
    if mode.tools() {
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 1, "the tool declared upstream: {body}");
        let (name, schema) = match kind {
            Kind::OpenAi => (
                &tools[0]["function"]["name"],
                &tools[0]["function"]["parameters"],
            ),
            Kind::Anthropic => (&tools[0]["name"], &tools[0]["input_schema"]),
        };
        assert_eq!(name, "search", "the tool upstream: {body}");
        assert_eq!(
            schema["required"],
            json!(["query"]),
            "the tool upstream: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_openai_provider_chat() {
    one_provider(Sdk::OpenAi, Kind::OpenAi, Mode::Json).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_openai_provider_stream() {
    one_provider(Sdk::OpenAi, Kind::OpenAi, Mode::Stream).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_openai_provider_tools() {
    one_provider(Sdk::OpenAi, Kind::OpenAi, Mode::Tools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_openai_provider_stream_tools() {
    one_provider(Sdk::OpenAi, Kind::OpenAi, Mode::StreamTools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_anthropic_provider_message() {
    one_provider(Sdk::Anthropic, Kind::Anthropic, Mode::Json).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_anthropic_provider_stream() {
    one_provider(Sdk::Anthropic, Kind::Anthropic, Mode::Stream).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_anthropic_provider_tools() {
    one_provider(Sdk::Anthropic, Kind::Anthropic, Mode::Tools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_anthropic_provider_stream_tools() {
    one_provider(Sdk::Anthropic, Kind::Anthropic, Mode::StreamTools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_anthropic_provider_chat() {
    one_provider(Sdk::OpenAi, Kind::Anthropic, Mode::Json).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_anthropic_provider_stream() {
    one_provider(Sdk::OpenAi, Kind::Anthropic, Mode::Stream).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_anthropic_provider_tools() {
    one_provider(Sdk::OpenAi, Kind::Anthropic, Mode::Tools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_anthropic_provider_stream_tools() {
    one_provider(Sdk::OpenAi, Kind::Anthropic, Mode::StreamTools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_openai_provider_message() {
    one_provider(Sdk::Anthropic, Kind::OpenAi, Mode::Json).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_openai_provider_stream() {
    one_provider(Sdk::Anthropic, Kind::OpenAi, Mode::Stream).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_openai_provider_tools() {
    one_provider(Sdk::Anthropic, Kind::OpenAi, Mode::Tools).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_openai_provider_stream_tools() {
    one_provider(Sdk::Anthropic, Kind::OpenAi, Mode::StreamTools).await;
}

// ---------------------------------------------------------------------------------------------
// d: failover across dialects

/// The first target (`first` kind) answers 500, then 503; the second (the other kind) serves
/// both calls, a JSON one and a stream.
async fn failover_across(sdk: Sdk, first: Kind, second: Kind) {
    let (a, b) = (mock("a").await, mock("b").await);
    a.push_script([status(500), status(503)]);
    let gw = start(&[("a", first, &a), ("b", second, &b)], "");
    for (n, mode) in [(1, Mode::Json), (2, Mode::Stream)] {
        let seen = call(sdk, &gw, mode).await;
        assert_text_answer(sdk, mode.streams(), &seen);
        assert_eq!(seen.header("x-llm-provider"), "b", "{mode:?}: {seen}");
        assert_eq!(seen.header("x-routed-via"), "b/up-b", "{mode:?}: {seen}");
        assert_eq!(seen.header("x-llm-attempts"), "2", "{mode:?}: {seen}");
        assert_eq!(seen.header("x-llm-fallback"), "true", "{mode:?}: {seen}");
        assert_called(&a, first, n, &seen);
        assert_called(&b, second, n, &seen);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_fails_over_from_openai_to_anthropic_provider() {
    failover_across(Sdk::OpenAi, Kind::OpenAi, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_fails_over_from_anthropic_to_openai_provider() {
    failover_across(Sdk::OpenAi, Kind::Anthropic, Kind::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_fails_over_from_openai_to_anthropic_provider() {
    failover_across(Sdk::Anthropic, Kind::OpenAi, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_fails_over_from_anthropic_to_openai_provider() {
    failover_across(Sdk::Anthropic, Kind::Anthropic, Kind::OpenAi).await;
}

// ---------------------------------------------------------------------------------------------
// e: the first-chunk hold

/// Each way a stream can fail after its 200 and before its first content, on the first target
/// (both targets of `kind`): the SDK's stream is the second target's, whole, without an error.
async fn hold(sdk: Sdk, kind: Kind) {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(
        &[("a", kind, &a), ("b", kind, &b)],
        "failover: { first_chunk_hold: 1s }\n",
    );
    let cases = [
        ("200 then EOF", Behaviour::OkThenEof),
        ("an empty stream", Behaviour::EmptyStream),
        (
            "an in-band error first",
            Behaviour::InbandErrorFirst {
                error_type: None,
                after_start: false,
            },
        ),
        (
            "an in-band error after the opening event",
            Behaviour::InbandErrorFirst {
                error_type: None,
                after_start: true,
            },
        ),
        ("an answer without content", Behaviour::EmptyChoices),
        (
            "death before content",
            Behaviour::MidStreamDeath { after_chunks: 0 },
        ),
        (
            "a stall longer than the hold",
            Behaviour::StallBeforeFirst { ms: 5_000 },
        ),
    ];
    for (n, (case, behaviour)) in (1..).zip(cases) {
        a.push_script([behaviour]);
        let seen = call(sdk, &gw, Mode::Stream).await;
        assert_text_answer(sdk, true, &seen);
        assert_eq!(seen.header("x-llm-provider"), "b", "{case}: {seen}");
        assert_eq!(seen.header("x-llm-attempts"), "2", "{case}: {seen}");
        assert_eq!(seen.header("x-llm-fallback"), "true", "{case}: {seen}");
        assert_called(&a, kind, n, &seen);
        assert_called(&b, kind, n, &seen);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_stream_fails_over_before_first_content_openai_providers() {
    hold(Sdk::OpenAi, Kind::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_stream_fails_over_before_first_content_anthropic_providers() {
    hold(Sdk::Anthropic, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_stream_fails_over_before_first_content_anthropic_providers() {
    hold(Sdk::OpenAi, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_stream_fails_over_before_first_content_openai_providers() {
    hold(Sdk::Anthropic, Kind::OpenAi).await;
}

// ---------------------------------------------------------------------------------------------
// f: the stream contract after the first content

/// A stream of a provider of `kind` that breaks after content: the SDK got that content, then
/// its iteration raised the gateway's error event; each counts as `stream_aborted`, and no
/// other target is tried.
async fn broken_after_content(sdk: Sdk, kind: Kind) {
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = start(
        &[("a", kind, &a), ("b", kind, &b)],
        "failover: { stream_idle_timeout: 1s }\n",
    );
    let cases = [
        (
            "death after content",
            Behaviour::MidStreamDeath { after_chunks: 2 },
            "upstream_stream_interrupted",
        ),
        (
            "no terminal event",
            Behaviour::NoTerminal { chunks: 2 },
            "upstream_stream_interrupted",
        ),
        (
            "a stall after content longer than the idle timeout",
            Behaviour::StallMidStream {
                after_chunks: 2,
                ms: 5_000,
            },
            "upstream_stream_stalled",
        ),
    ];
    for (n, (case, behaviour, code)) in (1..).zip(cases) {
        a.push_script([behaviour]);
        let seen = call(sdk, &gw, Mode::Stream).await;
        assert_eq!(seen.header("x-llm-provider"), "a", "{case}: {seen}");
        let got = seen.v["streamed_text"].as_str().unwrap_or("");
        assert!(
            !got.is_empty() && got != REPLY && REPLY.starts_with(got),
            "{case}: the content before the break, and only that: {seen}"
        );
        let error = seen.error();
        let message = error["message"].as_str().unwrap_or("");
        match sdk {
            Sdk::OpenAi => {
                // The `data: {"error":…}` event: the SDK raises APIError (not a transport error).
                assert_eq!(error["class"], "APIError", "{case}: {seen}");
                assert_eq!(error["body"]["code"], code, "{case}: {seen}");
            }
            Sdk::Anthropic => {
                // `event: error`: the SDK raises an APIStatusError with the event's body.
                assert_eq!(error["status_error"], true, "{case}: {seen}");
                assert_eq!(error["body"]["type"], "error", "{case}: {seen}");
                assert_eq!(
                    error["body"]["error"]["type"], "api_error",
                    "{case}: {seen}"
                );
                if code == "upstream_stream_stalled" {
                    assert!(message.contains("stall"), "{case}: {seen}");
                }
            }
        }
        assert!(!message.is_empty(), "{case}: {seen}");
        let line =
            format!("signalbox_attempts_total{{provider=\"a\",outcome=\"stream_aborted\"}} {n}\n");
        let m = gw.metrics_with(&[&line]).await;
        assert!(m.contains(&line), "{case}: {line} in\n{m}\n{seen}");
        assert_called(&a, kind, n, &seen);
        assert_called(&b, kind, 0, &seen);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_stream_breaking_after_content_raises_openai_provider() {
    broken_after_content(Sdk::OpenAi, Kind::OpenAi).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_stream_breaking_after_content_raises_anthropic_provider() {
    broken_after_content(Sdk::Anthropic, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_sdk_stream_breaking_after_content_raises_anthropic_provider() {
    broken_after_content(Sdk::OpenAi, Kind::Anthropic).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sdk_stream_breaking_after_content_raises_openai_provider() {
    broken_after_content(Sdk::Anthropic, Kind::OpenAi).await;
}
