//! The providers' own answers, through the gateway: every file of the conformance corpus
//! (`tests/fixtures/providers/`, shaped field for field as OpenAI's and Anthropic's API
//! references and SDK fixtures show them) is served by a mock provider and asked for through
//! the gateway, in the provider's own dialect and, where the surface translates (chat
//! completions ↔ Messages), in the other one. Each is run on every driver that can carry it:
//! a non-stream request on signalbox's own driver, a stream under the first-chunk hold (its own
//! driver), a stream with the hold off (Pingora's proxy loop), and both again with hedging
//! configured (the hedge's driver). For each the test checks the status, the text and tool
//! call the caller assembles, the tokens counted, and for the error bodies the failover
//! outcome DESIGN §5 gives them.
//!
//! This is the test that would have caught `"error": null` in every non-stream Responses
//! answer being judged an in-band error.

#![allow(clippy::unwrap_used)]

mod common;

use std::fmt::Write as _;

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Behaviour, MockHandle};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/providers");

/// One manifest entry (`corpus.json`; its README says what each field means).
#[derive(Debug, Clone)]
struct Entry {
    file: String,
    dialect: Dialect,
    surface: String,
    status: u16,
    stream: bool,
    kind: String,
    text: Option<String>,
    tool_call: Option<(String, Value)>,
    usage: Option<(u64, u64)>,
    error_type: Option<String>,
    retry_after: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    OpenAi,
    Anthropic,
}

impl Dialect {
    fn kind(self) -> &'static str {
        match self {
            Dialect::OpenAi => "openai",
            Dialect::Anthropic => "anthropic",
        }
    }
}

/// How the gateway drives the attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// The first-chunk hold on: non-stream requests and held streams, signalbox's driver.
    Held,
    /// The hold off: streams on Pingora's proxy loop, committed at the header.
    Unheld,
    /// Hedging configured (its delay never reached): the hedge's driver.
    Hedged,
}

fn corpus() -> Vec<Entry> {
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{CORPUS}/corpus.json")).unwrap())
            .unwrap();
    raw.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().map(str::to_string);
            let tool_call = e["tool_call"].as_object().map(|t| {
                let args = t["arguments"].as_str().unwrap();
                (
                    t["name"].as_str().unwrap().to_string(),
                    serde_json::from_str(args).unwrap(),
                )
            });
            Entry {
                file: s("file").unwrap(),
                dialect: match e["dialect"].as_str() {
                    Some("openai") => Dialect::OpenAi,
                    Some("anthropic") => Dialect::Anthropic,
                    other => panic!("dialect {other:?}"),
                },
                surface: s("surface").unwrap(),
                status: e["status"].as_u64().unwrap() as u16,
                stream: e["stream"].as_bool().unwrap(),
                kind: s("kind").unwrap(),
                text: s("text"),
                tool_call,
                usage: e["usage"]
                    .as_object()
                    .map(|u| (u["input"].as_u64().unwrap(), u["output"].as_u64().unwrap())),
                error_type: s("error_type"),
                retry_after: s("retry_after"),
            }
        })
        .collect()
}

/// The caller's side of a case: the path it posts to, in which dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Chat,
    Responses,
    Completions,
    Embeddings,
    Messages,
    CountTokens,
}

impl Caller {
    fn path(self) -> &'static str {
        match self {
            Caller::Chat => "/v1/chat/completions",
            Caller::Responses => "/v1/responses",
            Caller::Completions => "/v1/completions",
            Caller::Embeddings => "/v1/embeddings",
            Caller::Messages => "/v1/messages",
            Caller::CountTokens => "/v1/messages/count_tokens",
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Caller::Messages | Caller::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    fn body(self, model: &str, stream: bool) -> Value {
        let messages =
            json!([{"role": "user", "content": "What is the weather in San Francisco?"}]);
        match self {
            Caller::Chat => {
                let mut b = json!({"model": model, "messages": messages, "stream": stream});
                if stream {
                    b["stream_options"] = json!({"include_usage": true});
                }
                b
            }
            Caller::Responses => json!({"model": model, "input": "Hello!", "stream": stream}),
            Caller::Completions => {
                json!({"model": model, "prompt": "Say this is a test", "stream": stream})
            }
            Caller::Embeddings => json!({"model": model, "input": "The food was delicious"}),
            Caller::Messages => {
                json!({"model": model, "max_tokens": 1024, "messages": messages, "stream": stream})
            }
            Caller::CountTokens => json!({"model": model, "messages": messages}),
        }
    }
}

/// The callers an entry is asked for by: its own surface, and the other dialect where the
/// surface translates.
fn callers(e: &Entry) -> Vec<Caller> {
    match e.surface.as_str() {
        "chat_completions" => vec![Caller::Chat, Caller::Messages],
        "messages" => vec![Caller::Messages, Caller::Chat],
        "responses" => vec![Caller::Responses],
        "completions" => vec![Caller::Completions],
        "embeddings" => vec![Caller::Embeddings],
        "count_tokens" => vec![Caller::CountTokens],
        other => panic!("surface {other}"),
    }
}

/// What DESIGN §5 makes of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// `a` serves: the caller gets its text, tool call and usage.
    Served,
    /// `a` failed with this outcome and the fallback served.
    FailedOver(&'static str),
    /// `a`'s refusal is the answer, nothing else is called: the caller's status and error
    /// code (OpenAI callers) or error type (Anthropic callers).
    Refused(u16, &'static str, &'static str),
    /// `a`'s stream was committed and ended with this outcome and an error event (see
    /// [`stream_error_id`]), after the text received before the error.
    Committed(&'static str),
}

fn expect(e: &Entry, caller: Caller, driver: Driver) -> Expect {
    let error = e.error_type.as_deref().unwrap_or_default();
    // A translated stream is always converted by signalbox's own driver, which holds it to
    // its first content whatever the hold says.
    let held = driver != Driver::Unheld || caller.dialect() != e.dialect;
    match e.kind.as_str() {
        "answer" => Expect::Served,
        // An in-stream error: before any content it fails over wherever the stream is
        // held; after content, or with the hold off, the caller's stream ends with it.
        "stream_error" if e.text.is_none() && held => Expect::FailedOver("stream_error"),
        "stream_error" => Expect::Committed("stream_aborted"),
        "error" => match (e.status, error) {
            (400, "context_length_exceeded") => {
                Expect::Refused(400, "context_length_exceeded", "invalid_request_error")
            }
            (400 | 413, _) if is_prompt_too_long(e) => {
                Expect::Refused(400, "context_length_exceeded", "invalid_request_error")
            }
            // The caller's own request was refused: relayed, no failover (DESIGN §5).
            (400, _) => Expect::Refused(400, "all_candidates_rejected", "invalid_request_error"),
            (413, _) => Expect::Refused(413, "request_too_large", "request_too_large"),
            (401 | 403, _) => Expect::FailedOver("credential_rejected"),
            // Out of quota: the credential cools as for any 429 and the next one serves.
            (429, "insufficient_quota") => Expect::FailedOver("rate_limited"),
            (429, _) => Expect::FailedOver("rate_limited"),
            (404, _) => Expect::FailedOver("model_not_found"),
            (500 | 503 | 529, _) => Expect::FailedOver("server_error"),
            other => panic!("no expectation for {other:?}"),
        },
        other => panic!("kind {other}"),
    }
}

fn is_prompt_too_long(e: &Entry) -> bool {
    e.file.contains("prompt_too_long") || e.file.contains("context_length")
}

/// One request of the table.
struct Case {
    n: usize,
    entry: Entry,
    caller: Caller,
    driver: Driver,
    mock: MockHandle,
}

impl Case {
    fn provider(&self) -> String {
        format!("p{}", self.n)
    }

    fn model(&self) -> String {
        format!("m{}", self.n)
    }

    fn name(&self) -> String {
        format!(
            "{} as {:?} on {:?}",
            self.entry.file, self.caller, self.driver
        )
    }
}

/// The config of one gateway: a provider and a model per case, each model's fallback a
/// provider of the same kind on the shared fallback mock.
fn config(cases: &[Case], fallback: &MockHandle, driver: Driver) -> String {
    let mut c = String::from("providers:\n");
    for kind in ["openai", "anthropic"] {
        writeln!(
            c,
            "  fallback_{kind}: {{ kind: {kind}, base_url: \"{}\", credentials: [{{ id: k, key_env: SB_CONFORMANCE_KEY }}] }}",
            fallback.base_url()
        )
        .unwrap();
    }
    for case in cases {
        writeln!(
            c,
            "  {}: {{ kind: {}, base_url: \"{}\", credentials: [{{ id: k, key_env: SB_CONFORMANCE_KEY }}] }}",
            case.provider(),
            case.entry.dialect.kind(),
            case.mock.base_url()
        )
        .unwrap();
    }
    c.push_str("models:\n");
    for case in cases {
        writeln!(
            c,
            "  {}:\n    strategy: priority\n    deployments: [{{ provider: {}, model: up-{}, priority: 1 }}, {{ provider: fallback_{}, model: up-fallback, priority: 2 }}]",
            case.model(),
            case.provider(),
            case.n,
            case.entry.dialect.kind()
        )
        .unwrap();
    }
    let hold = match driver {
        Driver::Unheld => "0",
        Driver::Held | Driver::Hedged => "2s",
    };
    let hedge = match driver {
        Driver::Hedged => ", hedge: { after: 20s, min_after: 20s, max_share: 1.0 }",
        _ => "",
    };
    write!(
        c,
        "health: {{ failure_threshold: 100, bench_after: 64, respect_retry_after: true }}\n\
         failover: {{ ttfb_timeout: 5s, first_chunk_hold: {hold}, stream_idle_timeout: 5s{hedge} }}\n"
    )
    .unwrap();
    c
}

/// What the caller assembled from an answer.
#[derive(Debug, Default)]
struct Assembled {
    text: Option<String>,
    /// Chat's `message.content` was JSON `null` (OpenAI's shape beside tool calls).
    content_null: bool,
    tool_call: Option<(String, Value)>,
    /// The terminal marker of the caller's dialect was seen (`[DONE]`, `message_stop`,
    /// `response.completed`); for JSON, always.
    terminal: bool,
    /// The code (OpenAI) or type (Anthropic) of an error event in the stream.
    error_event: Option<String>,
    /// count_tokens' and embeddings' own fields.
    input_tokens: Option<u64>,
    embeddings: usize,
}

fn push(text: &mut Option<String>, s: &str) {
    text.get_or_insert_with(String::new).push_str(s);
}

fn sse_data(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        })
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

fn parse_args(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

fn assemble(caller: Caller, stream: bool, body: &str) -> Assembled {
    let mut a = Assembled::default();
    if !stream {
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        a.terminal = true;
        match caller {
            Caller::Chat => {
                let m = &v["choices"][0]["message"];
                a.content_null = m["content"].is_null();
                if let Some(t) = m["content"].as_str().filter(|t| !t.is_empty()) {
                    push(&mut a.text, t);
                }
                if let Some(call) = m["tool_calls"].get(0) {
                    a.tool_call = Some((
                        call["function"]["name"].as_str().unwrap().to_string(),
                        parse_args(call["function"]["arguments"].as_str().unwrap()),
                    ));
                }
            }
            Caller::Completions => push(&mut a.text, v["choices"][0]["text"].as_str().unwrap()),
            Caller::Responses => {
                for item in v["output"].as_array().unwrap() {
                    match item["type"].as_str() {
                        Some("message") => {
                            for part in item["content"].as_array().unwrap() {
                                if part["type"] == "output_text" {
                                    push(&mut a.text, part["text"].as_str().unwrap());
                                }
                            }
                        }
                        Some("function_call") if a.tool_call.is_none() => {
                            a.tool_call = Some((
                                item["name"].as_str().unwrap().to_string(),
                                parse_args(item["arguments"].as_str().unwrap()),
                            ));
                        }
                        _ => {}
                    }
                }
            }
            Caller::Messages => {
                for block in v["content"].as_array().unwrap() {
                    match block["type"].as_str() {
                        Some("text") => push(&mut a.text, block["text"].as_str().unwrap()),
                        Some("tool_use") if a.tool_call.is_none() => {
                            a.tool_call = Some((
                                block["name"].as_str().unwrap().to_string(),
                                block["input"].clone(),
                            ));
                        }
                        _ => {}
                    }
                }
            }
            Caller::Embeddings => a.embeddings = v["data"].as_array().unwrap().len(),
            Caller::CountTokens => a.input_tokens = v["input_tokens"].as_u64(),
        }
        return a;
    }
    a.terminal = match caller.dialect() {
        Dialect::OpenAi if caller == Caller::Responses => false,
        Dialect::OpenAi => body.trim_end().ends_with("data: [DONE]"),
        Dialect::Anthropic => false,
    };
    let mut tool: Option<(String, String)> = None;
    let mut content_seen = false;
    for d in sse_data(body) {
        if let Some(err) = d.get("error").filter(|e| !e.is_null()) {
            let id = err["code"].as_str().or(err["type"].as_str());
            a.error_event = id.map(str::to_string);
            continue;
        }
        match caller {
            Caller::Chat => {
                let Some(choice) = d["choices"].get(0) else {
                    continue;
                };
                let delta = &choice["delta"];
                if !content_seen && delta.get("content").is_some() {
                    content_seen = true;
                    a.content_null = delta["content"].is_null();
                }
                if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                    a.content_null = false;
                    push(&mut a.text, t);
                }
                if let Some(call) = delta["tool_calls"].get(0) {
                    if call["index"].as_u64().unwrap_or(0) == 0 {
                        let f = &call["function"];
                        let t = tool.get_or_insert_with(Default::default);
                        if let Some(name) = f["name"].as_str() {
                            t.0 = name.to_string();
                        }
                        t.1.push_str(f["arguments"].as_str().unwrap_or_default());
                    }
                }
            }
            Caller::Completions => {
                if let Some(t) = d["choices"][0]["text"].as_str() {
                    push(&mut a.text, t);
                }
            }
            Caller::Responses => match d["type"].as_str() {
                Some("error") => a.error_event = d["code"].as_str().map(str::to_string),
                Some("response.failed") => {
                    a.error_event = d["response"]["error"]["code"].as_str().map(str::to_string)
                }
                Some("response.output_text.delta") => {
                    push(&mut a.text, d["delta"].as_str().unwrap())
                }
                Some("response.output_item.added")
                    if d["item"]["type"] == "function_call" && tool.is_none() =>
                {
                    tool = Some((
                        d["item"]["name"].as_str().unwrap().to_string(),
                        String::new(),
                    ));
                }
                Some("response.function_call_arguments.delta") => {
                    if let Some(t) = tool.as_mut() {
                        t.1.push_str(d["delta"].as_str().unwrap());
                    }
                }
                Some("response.completed") => a.terminal = true,
                _ => {}
            },
            Caller::Messages => match d["type"].as_str() {
                Some("content_block_start")
                    if d["content_block"]["type"] == "tool_use" && tool.is_none() =>
                {
                    tool = Some((
                        d["content_block"]["name"].as_str().unwrap().to_string(),
                        String::new(),
                    ));
                }
                Some("content_block_delta") => match d["delta"]["type"].as_str() {
                    Some("text_delta") => push(&mut a.text, d["delta"]["text"].as_str().unwrap()),
                    Some("input_json_delta") => {
                        if let Some(t) = tool.as_mut() {
                            t.1.push_str(d["delta"]["partial_json"].as_str().unwrap());
                        }
                    }
                    _ => {}
                },
                Some("message_stop") => a.terminal = true,
                _ => {}
            },
            Caller::Embeddings | Caller::CountTokens => {}
        }
    }
    a.tool_call = tool.map(|(name, args)| (name, parse_args(&args)));
    a
}

/// Post one case and check it; the metric lines it must leave go to `lines`.
async fn check(gw: &Gateway, case: &Case, lines: &mut Vec<String>) -> Result<(), String> {
    let e = &case.entry;
    let name = case.name();
    let mut req = client()
        .post(gw.url(case.caller.path()))
        .header("authorization", "Bearer caller")
        .json(&case.caller.body(&case.model(), e.stream));
    if case.caller.dialect() == Dialect::Anthropic {
        req = req.header("anthropic-version", "2023-06-01");
    }
    let r = req.send().await.map_err(|x| format!("{name}: {x}"))?;
    let status = r.status().as_u16();
    let provider = header(&r, "x-llm-provider").to_string();
    let attempts = header(&r, "x-llm-attempts").to_string();
    let (body, cut) = read_all(r).await;
    let fail = |what: String| Err(format!("{name}: {what}\n--- body ---\n{body}"));
    let expected = expect(e, case.caller, case.driver);
    let a_line = |outcome: &str| {
        format!(
            r#"signalbox_attempts_total{{provider="{}",outcome="{outcome}"}} 1"#,
            case.provider()
        )
    };
    match expected {
        Expect::Served => {
            if status != 200 || provider != case.provider() || attempts != "1" || cut {
                return fail(format!(
                    "want 200 from {} in one attempt, got {status} from {provider:?} in {attempts} (cut: {cut})",
                    case.provider()
                ));
            }
            let got = assemble(case.caller, e.stream, &body);
            if !got.terminal {
                return fail("no clean end".into());
            }
            if let Some(err) = got.error_event {
                return fail(format!("an error event {err}"));
            }
            if got.text != e.text {
                return fail(format!("text {:?}, want {:?}", got.text, e.text));
            }
            if got.tool_call != e.tool_call {
                return fail(format!(
                    "tool call {:?}, want {:?}",
                    got.tool_call, e.tool_call
                ));
            }
            // OpenAI's shape: `content: null` beside tool calls when there is no text.
            if case.caller == Caller::Chat
                && e.tool_call.is_some()
                && e.text.is_none()
                && !got.content_null
            {
                return fail("content is not null beside a tool call".into());
            }
            match case.caller {
                Caller::Embeddings if got.embeddings == 0 => return fail("no embedding".into()),
                Caller::CountTokens => {
                    let want: Value = serde_json::from_str(
                        &std::fs::read_to_string(format!("{CORPUS}/{}", e.file)).unwrap(),
                    )
                    .unwrap();
                    if got.input_tokens != want["input_tokens"].as_u64() {
                        return fail(format!("input_tokens {:?}", got.input_tokens));
                    }
                }
                _ => {}
            }
            if let Some((input, output)) = e.usage {
                for (kind, n) in [("prompt", input), ("completion", output)] {
                    if n > 0 {
                        lines.push(format!(
                            r#"signalbox_tokens_total{{provider="{}",model="{}",kind="{kind}"}} {n}"#,
                            case.provider(),
                            case.model()
                        ));
                    }
                }
            }
            lines.push(a_line("ok"));
        }
        Expect::FailedOver(outcome) => {
            let want = format!("fallback_{}", e.dialect.kind());
            if status != 200 || provider != want || attempts != "2" {
                return fail(format!(
                    "want {outcome} then 200 from {want} in two attempts, got {status} from {provider:?} in {attempts}"
                ));
            }
            if body.contains("\"error\":{") {
                return fail("a's error reached the caller".into());
            }
            lines.push(a_line(outcome));
        }
        Expect::Refused(want, code, anthropic_type) => {
            if status != want || attempts != "1" {
                return fail(format!(
                    "want {want} after one attempt, got {status} in {attempts}"
                ));
            }
            let v: Value = serde_json::from_str(&body).map_err(|x| format!("{name}: {x}"))?;
            let got = match case.caller.dialect() {
                Dialect::OpenAi => v["error"]["code"].clone(),
                Dialect::Anthropic => v["error"]["type"].clone(),
            };
            let want_id = match case.caller.dialect() {
                Dialect::OpenAi => code,
                Dialect::Anthropic => anthropic_type,
            };
            if got != want_id {
                return fail(format!("error {got}, want {want_id}"));
            }
            if provider == format!("fallback_{}", e.dialect.kind()) {
                return fail("the fallback was called".into());
            }
            // In signalbox's words, never the provider's (its message names accounts,
            // organisations and limits).
            let sent: Value = serde_json::from_str(
                &std::fs::read_to_string(format!("{CORPUS}/{}", e.file)).unwrap(),
            )
            .unwrap();
            if let Some(message) = sent["error"]["message"].as_str() {
                if body.contains(message) {
                    return fail("the provider's message reached the caller".into());
                }
            }
        }
        Expect::Committed(outcome) => {
            if status != 200 || provider != case.provider() || attempts != "1" {
                return fail(format!(
                    "want a's committed stream, got {status} from {provider:?} in {attempts}"
                ));
            }
            let got = assemble(case.caller, true, &body);
            if got.terminal {
                return fail("a clean end after an error".into());
            }
            if got.text != e.text {
                return fail(format!("text {:?}, want {:?}", got.text, e.text));
            }
            let want = stream_error_id(e, case.caller);
            if got.error_event.as_deref() != Some(want) {
                return fail(format!("error event {:?}, want {want}", got.error_event));
            }
            lines.push(a_line(outcome));
        }
    }
    Ok(())
}

/// The error event a committed stream ends with: signalbox's own (its code for OpenAI callers,
/// its type for Anthropic ones) where the stream is relayed in the provider's dialect or
/// translated; the Responses API's own `error` / `response.failed` event (its code), which
/// signalbox relays as the provider sent it.
fn stream_error_id(e: &Entry, caller: Caller) -> &'static str {
    let overloaded = e.error_type.as_deref() == Some("overloaded_error")
        || e.error_type.as_deref() == Some("server_is_overloaded");
    match (caller, e.dialect == caller.dialect()) {
        (Caller::Responses, _) if overloaded => "server_is_overloaded",
        (Caller::Responses, _) => "server_error",
        (Caller::Chat, true) if overloaded => "upstream_overloaded",
        (Caller::Chat, true) => "upstream_stream_error",
        (Caller::Chat, false) if overloaded => "server_is_overloaded",
        (Caller::Chat, false) => "server_error",
        (_, _) if overloaded => "overloaded_error",
        (_, _) => "api_error",
    }
}

fn behaviour(e: &Entry) -> Behaviour {
    Behaviour::Replay {
        code: e.status,
        body: std::fs::read_to_string(format!("{CORPUS}/{}", e.file)).unwrap(),
        sse: e.stream,
        retry_after: e.retry_after.clone(),
    }
}

/// Run every case the driver carries on one gateway; the failures, all of them.
async fn run(driver: Driver) -> Vec<String> {
    let fallback = mock("fallback").await;
    let mut cases = Vec::new();
    for entry in corpus() {
        // Non-stream requests are held whatever the hold says: run them where it is on.
        if driver == Driver::Unheld && !entry.stream {
            continue;
        }
        for caller in callers(&entry) {
            let mock = mock(&format!("p{}", cases.len())).await;
            mock.set_default(behaviour(&entry));
            cases.push(Case {
                n: cases.len(),
                entry: entry.clone(),
                caller,
                driver,
                mock,
            });
        }
    }
    let gw = GatewayBuilder::new(config(&cases, &fallback, driver))
        .env("SB_CONFORMANCE_KEY", "sk-conformance-provider-key")
        .start();
    let mut failures = Vec::new();
    let mut lines = Vec::new();
    for case in &cases {
        if let Err(f) = check(&gw, case, &mut lines).await {
            failures.push(f);
        }
    }
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let m = gw.metrics_with(&refs).await;
    for l in &lines {
        if !m.contains(l.as_str()) {
            // What was counted instead, for the reader of the failure.
            let prefix = &l[..l.find(',').unwrap_or(l.len())];
            let got: Vec<&str> = m.lines().filter(|x| x.starts_with(prefix)).collect();
            failures.push(format!("{driver:?}: missing metric {l}; got {got:?}"));
        }
    }
    if m.contains("sk-conformance-provider-key") || body_leaks(&gw) {
        failures.push(format!("{driver:?}: the provider key leaked"));
    }
    assert!(cases.len() > 10, "the corpus is read");
    failures
}

fn body_leaks(gw: &Gateway) -> bool {
    gw.stderr().contains("sk-conformance-provider-key")
}

fn report(driver: Driver, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} {driver:?} case(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_providers_answers_pass_through_signalboxs_driver() {
    report(Driver::Held, run(Driver::Held).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_providers_streams_pass_through_pingoras_proxy_loop() {
    report(Driver::Unheld, run(Driver::Unheld).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_providers_answers_pass_through_the_hedged_driver() {
    report(Driver::Hedged, run(Driver::Hedged).await);
}

/// The corpus covers what the issue asks of it: every surface, both dialects, the error
/// statuses and in-stream error events.
#[test]
fn the_corpus_covers_every_surface_and_error_status() {
    let entries = corpus();
    for surface in [
        "chat_completions",
        "responses",
        "completions",
        "embeddings",
        "messages",
        "count_tokens",
    ] {
        assert!(entries.iter().any(|e| e.surface == surface), "{surface}");
    }
    for (dialect, statuses) in [
        (
            Dialect::OpenAi,
            &[400, 401, 403, 404, 413, 429, 500, 503][..],
        ),
        (
            Dialect::Anthropic,
            &[400, 401, 403, 404, 413, 429, 500, 529][..],
        ),
    ] {
        for status in statuses {
            assert!(
                entries
                    .iter()
                    .any(|e| e.dialect == dialect && e.kind == "error" && e.status == *status),
                "{dialect:?} {status}"
            );
        }
        assert!(entries
            .iter()
            .any(|e| e.dialect == dialect && e.kind == "stream_error"));
    }
    for e in &entries {
        let path = format!("{CORPUS}/{}", e.file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{path}"));
        if !e.stream {
            let _: Value = serde_json::from_str(&text).unwrap_or_else(|x| panic!("{path}: {x}"));
        }
    }
}
