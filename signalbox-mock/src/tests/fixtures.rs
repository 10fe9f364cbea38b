//! The mock's streams against streams recorded from the providers' documentation
//! (`tests/fixtures/` at the workspace root): the same events in the same order, and in each
//! event the fields the provider sends (a client's parser may need any of them), none invented.

use std::collections::BTreeSet;

use serde_json::json;

use super::*;

macro_rules! fixture {
    ($dialect:literal, $name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/",
            $dialect,
            "/",
            $name
        ))
    };
}

/// Fields a provider sends that the mock leaves out, knowingly: routing and abuse-prevention
/// extras, log probabilities (never asked for), usage details, and the request's settings a
/// Responses object echoes back (the mock echoes none of them). Clients treat each as optional.
const OPTIONAL: &[&str] = &[
    "service_tier",
    "system_fingerprint",
    "obfuscation",
    "logprobs",
    "refusal",
    "prompt_tokens_details",
    "completion_tokens_details",
    "input_tokens_details",
    "output_tokens_details",
    "cache_creation",
    "background",
    "parallel_tool_calls",
    "reasoning",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "metadata",
];

/// What an event is, for the comparison: its name (with the block or delta type for
/// Anthropic's block events), or for an unnamed OpenAI chat chunk what it carries.
fn kind(name: Option<&str>, data: &Value) -> String {
    match name {
        Some(n @ "content_block_start") => {
            format!(
                "{n}:{}",
                data["content_block"]["type"].as_str().unwrap_or("")
            )
        }
        Some(n @ "content_block_delta") => {
            format!("{n}:{}", data["delta"]["type"].as_str().unwrap_or(""))
        }
        Some(n) => n.to_string(),
        None if data == "[DONE]" => "[DONE]".to_string(),
        None => {
            let Some(choice) = data["choices"].as_array().and_then(|c| c.first()) else {
                return "usage".to_string();
            };
            let delta = &choice["delta"];
            let role = delta.get("role").is_some();
            let call = &delta["tool_calls"][0];
            match () {
                _ if !choice["finish_reason"].is_null() => "finish".to_string(),
                _ if role && call.get("id").is_some() => "role+tool_call".to_string(),
                _ if role => "role".to_string(),
                _ if call.get("id").is_some() => "tool_call".to_string(),
                _ if call.is_object() => "tool_arguments".to_string(),
                _ => "content".to_string(),
            }
        }
    }
}

/// The events' kinds, runs of the same kind (deltas) counted once.
fn kinds(events: &[(Option<String>, Value)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (name, data) in events {
        let k = kind(name.as_deref(), data);
        if out.last() != Some(&k) {
            out.push(k);
        }
    }
    out
}

fn parse(sse: &str) -> Vec<(Option<String>, Value)> {
    named_events(sse.as_bytes())
}

/// `mock` has every field `recorded` has (but the optional ones and those recorded as null)
/// and none it lacks, at every depth; `at` names the place for the message.
fn assert_same_fields(recorded: &Value, mock: &Value, at: &str) {
    match (recorded, mock) {
        (Value::Object(r), Value::Object(m)) => {
            let rk: BTreeSet<&str> = r.keys().map(String::as_str).collect();
            let mk: BTreeSet<&str> = m.keys().map(String::as_str).collect();
            let invented: Vec<_> = mk
                .difference(&rk)
                .filter(|k| **k != "mock_sent_us")
                .collect();
            assert!(invented.is_empty(), "{at}: the mock invents {invented:?}");
            let missing: Vec<_> = rk
                .difference(&mk)
                .filter(|k| !OPTIONAL.contains(k) && !r[**k].is_null())
                .collect();
            assert!(missing.is_empty(), "{at}: the mock lacks {missing:?}");
            for k in rk.intersection(&mk) {
                assert_same_fields(&r[*k], &m[*k], &format!("{at}.{k}"));
            }
        }
        (Value::Array(r), Value::Array(m)) => {
            for (i, (r, m)) in r.iter().zip(m).enumerate() {
                assert_same_fields(r, m, &format!("{at}[{i}]"));
            }
        }
        _ => {}
    }
}

/// The mock's stream and the recorded one: the same kinds of event in the same order, and the
/// first event of each kind with the same fields.
fn assert_conforms(recorded: &[(Option<String>, Value)], mock: &[(Option<String>, Value)]) {
    assert_eq!(kinds(mock), kinds(recorded), "the event order");
    for (name, r) in recorded {
        let k = kind(name.as_deref(), r);
        let m = mock
            .iter()
            .find(|(n, d)| kind(n.as_deref(), d) == k)
            .map(|(_, d)| d)
            .unwrap();
        assert_same_fields(r, m, &k);
    }
}

async fn mock_stream(endpoint: Endpoint, extra: Value) -> Vec<(Option<String>, Value)> {
    let h = start_default().await;
    let body = body_for(endpoint, true, extra);
    let resp = one_shot(&h, &request_to(endpoint, &body)).await;
    assert_eq!(resp.status, 200);
    named_events(&resp.body)
}

#[tokio::test]
async fn chat_text_stream_opens_with_the_role_as_openai_does() {
    let recorded = parse(fixture!("openai", "chat_stream_text.sse"));
    let mock = mock_stream(
        Endpoint::ChatCompletions,
        json!({"stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(
        mock[0].1["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_conforms(&recorded, &mock);
}

#[tokio::test]
async fn chat_tool_call_stream_matches_the_recorded_one() {
    // The recording makes two parallel calls, the mock one: compare with the first.
    let recorded: Vec<_> = parse(fixture!("openai", "chat_stream_tool_calls.sse"))
        .into_iter()
        .filter(|(_, d)| {
            let index = &d["choices"][0]["delta"]["tool_calls"][0]["index"];
            index.is_null() || index == 0
        })
        .collect();
    let tools = json!({
        "stream_options": {"include_usage": true},
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    });
    let mock = mock_stream(Endpoint::ChatCompletions, tools).await;
    assert_conforms(&recorded, &mock);
}

#[tokio::test]
async fn responses_text_stream_follows_the_documented_event_order() {
    let recorded = parse(fixture!("openai", "responses_stream_text.sse"));
    let mock = mock_stream(Endpoint::Responses, json!({})).await;
    assert_eq!(
        kinds(&mock),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_conforms(&recorded, &mock);
}

#[tokio::test]
async fn responses_function_call_stream_matches_the_recorded_one() {
    let recorded = parse(fixture!("openai", "responses_stream_function_call.sse"));
    let tools = json!({"tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]});
    let mock = mock_stream(Endpoint::Responses, tools).await;
    assert_conforms(&recorded, &mock);
}

#[tokio::test]
async fn messages_text_stream_follows_the_documented_event_order() {
    let recorded = parse(fixture!("anthropic", "stream_text.sse"));
    let mock = mock_stream(Endpoint::Messages, json!({})).await;
    assert_eq!(
        kinds(&mock),
        [
            "message_start",
            "content_block_start:text",
            "ping",
            "content_block_delta:text_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert_conforms(&recorded, &mock);
}
