use serde_json::{json, Value};

use super::*;
use crate::adapters::chat_messages::testing::{fixture, json};

const TO_MESSAGES: ToMessages<'static> = ToMessages {
    upstream_model: "claude-sonnet-4-5-20250929",
    default_max_tokens: 4096,
};
const TO_CHAT: ToChat<'static> = ToChat {
    upstream_model: "gpt-4o-mini",
    stream_usage: true,
};

fn to_messages(body: &Value) -> Result<Value, Unexpressible> {
    chat_request_to_messages(body.to_string().as_bytes(), &TO_MESSAGES).map(|b| json(&b))
}

fn to_chat(body: &Value) -> Result<Value, Unexpressible> {
    messages_request_to_chat(body.to_string().as_bytes(), &TO_CHAT).map(|b| json(&b))
}

/// A chat request with `extra` members over a one-message body.
fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        body[k] = v;
    }
    body
}

/// A messages request with `extra` members over a one-message body.
fn messages(extra: Value) -> Value {
    let mut body =
        json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        body[k] = v;
    }
    body
}

// === chat → messages ===

#[test]
fn the_chat_fixture_becomes_an_anthropic_request() {
    let out = json(
        &chat_request_to_messages(fixture!("openai", "chat_request.json"), &TO_MESSAGES)
            .expect("expressible"),
    );
    assert_eq!(out["model"], "claude-sonnet-4-5-20250929");
    // Two system messages (system, then developer), joined in order.
    assert_eq!(
        out["system"],
        json!([
            {"type": "text", "text": "You are a travel assistant for Acme Corp. Answer concisely."},
            {"type": "text", "text": "Today is 2025-11-30. Prices are in EUR."},
        ])
    );
    let turns = out["messages"].as_array().expect("messages");
    assert_eq!(
        turns.len(),
        3,
        "user, assistant, user (tool results merged)"
    );
    assert_eq!(turns[0]["role"], "user");
    let parts = &turns[0]["content"];
    assert_eq!(parts[0]["type"], "text");
    assert_eq!(
        parts[1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png",
            "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}})
    );
    assert_eq!(
        parts[2],
        json!({"type": "image", "source": {"type": "url",
            "url": "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}})
    );
    assert_eq!(parts[3]["type"], "document");
    assert_eq!(parts[3]["title"], "itinerary.pdf");
    assert_eq!(parts[3]["source"]["media_type"], "application/pdf");
    assert!(parts[3]["source"]["data"]
        .as_str()
        .is_some_and(|d| d.starts_with("JVBERi0")));

    assert_eq!(turns[1]["role"], "assistant");
    assert_eq!(
        turns[1]["content"],
        json!([
            {"type": "tool_use", "id": "call_Kd8fOgEVEd8cq3WJ0vUpBbcZ", "name": "get_weather",
             "input": {"location": "San Francisco, CA", "unit": "celsius"}},
            {"type": "tool_use", "id": "call_1bwdq4yO6OkXiFD5IDt1uXzl", "name": "get_weather",
             "input": {"location": "Paris, France", "unit": "celsius"}},
        ])
    );
    assert_eq!(turns[2]["role"], "user");
    assert_eq!(
        turns[2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "call_Kd8fOgEVEd8cq3WJ0vUpBbcZ", "content": "15 degrees, foggy"},
            {"type": "tool_result", "tool_use_id": "call_1bwdq4yO6OkXiFD5IDt1uXzl",
             "content": [{"type": "text", "text": "9 degrees, light rain"}]},
            {"type": "text", "text": "Which one is warmer?"},
        ])
    );
    assert_eq!(
        out["tools"],
        json!([{
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "input_schema": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["location"],
                "additionalProperties": false
            }
        }])
    );
    assert_eq!(
        out["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
    assert_eq!(out["stop_sequences"], json!(["END"]));
    assert_eq!(out["max_tokens"], 1024);
    assert_eq!(out["temperature"], 0.7);
    assert_eq!(out["top_p"], 0.9);
    assert_eq!(out["metadata"], json!({"user_id": "user-8f14e45f"}));
    assert_eq!(out["stream"], true);
    let keys: Vec<&str> = out
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "max_tokens",
            "messages",
            "metadata",
            "model",
            "stop_sequences",
            "stream",
            "system",
            "temperature",
            "tool_choice",
            "tools",
            "top_p"
        ],
        "advisory fields (stream_options, service_tier, store, metadata, seed) and defaults (n, logprobs, penalties, text format) are dropped"
    );
}

#[test]
fn one_system_string_stays_a_string_and_system_messages_anywhere_are_joined_in_order() {
    let out = to_messages(&json!({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]}))
    .expect("ok");
    assert_eq!(out["system"], "Be brief.");
    let out = to_messages(&json!({"model": "m", "messages": [
        {"role": "system", "content": "one"},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "three"}]},
        {"role": "user", "content": "again"},
    ]}))
    .expect("ok");
    assert_eq!(
        out["system"],
        json!([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}, {"type": "text", "text": "three"}])
    );
    // With the system message gone, the two user messages are one turn.
    assert_eq!(
        out["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]}])
    );
}

#[test]
fn consecutive_turns_of_one_role_merge_and_tool_results_join_the_next_user_turn() {
    let out = to_messages(&json!({"model": "m", "messages": [
        {"role": "user", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
        {"role": "user", "content": "d"},
    ]}))
    .expect("ok");
    assert_eq!(
        out["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "c"},
                {"type": "tool_use", "id": "call_1", "name": "f", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "r1"},
                {"type": "text", "text": "d"},
            ]},
        ])
    );
}

#[test]
fn max_tokens_comes_from_either_field_or_the_default() {
    let mt = |extra: Value| to_messages(&chat(extra)).expect("ok")["max_tokens"].clone();
    assert_eq!(mt(json!({})), 4096);
    assert_eq!(mt(json!({"max_tokens": 50})), 50);
    assert_eq!(mt(json!({"max_completion_tokens": 70})), 70);
    assert_eq!(
        mt(json!({"max_tokens": 50, "max_completion_tokens": 70})),
        70
    );
    assert_eq!(mt(json!({"max_tokens": null})), 4096, "null is absent");
}

#[test]
fn stop_is_a_string_or_a_list() {
    let stop =
        |s: Value| to_messages(&chat(json!({"stop": s}))).expect("ok")["stop_sequences"].clone();
    assert_eq!(stop(json!("x")), json!(["x"]));
    assert_eq!(stop(json!(["x", "y"])), json!(["x", "y"]));
    assert_eq!(stop(json!([])), Value::Null);
}

#[test]
fn tool_choice_maps_each_way_of_choosing() {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                       {"type": "function", "function": {"name": "g"}}]);
    let choice = |c: Value, parallel: Option<bool>| {
        let mut extra = json!({"tools": tools, "tool_choice": c});
        if let Some(p) = parallel {
            extra["parallel_tool_calls"] = Value::Bool(p);
        }
        to_messages(&chat(extra)).expect("ok")
    };
    assert_eq!(
        choice(json!("auto"), None)["tool_choice"],
        json!({"type": "auto"})
    );
    assert_eq!(
        choice(json!("none"), None)["tool_choice"],
        json!({"type": "none"})
    );
    assert_eq!(
        choice(json!("required"), None)["tool_choice"],
        json!({"type": "any"})
    );
    assert_eq!(
        choice(
            json!({"type": "function", "function": {"name": "g"}}),
            Some(false)
        )["tool_choice"],
        json!({"type": "tool", "name": "g", "disable_parallel_tool_use": true})
    );
    assert_eq!(
        choice(json!("none"), Some(false))["tool_choice"],
        json!({"type": "none"}),
        "none takes no parallel flag"
    );
    let narrowed = choice(
        json!({"type": "allowed_tools", "allowed_tools": {"mode": "required",
            "tools": [{"type": "function", "function": {"name": "g"}}]}}),
        None,
    );
    assert_eq!(narrowed["tool_choice"], json!({"type": "any"}));
    assert_eq!(
        narrowed["tools"],
        json!([{"name": "g", "input_schema": {"type": "object", "properties": {}}}])
    );
    // No choice, parallel calls off: auto without parallel use.
    let out =
        to_messages(&chat(json!({"tools": tools, "parallel_tool_calls": false}))).expect("ok");
    assert_eq!(
        out["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
    assert_eq!(out["tools"][0]["input_schema"], json!({"type": "object"}));
    // Without tools, auto/none/parallel say nothing.
    let out = to_messages(&chat(
        json!({"tool_choice": "none", "parallel_tool_calls": false}),
    ))
    .expect("ok");
    assert!(out.get("tool_choice").is_none() && out.get("tools").is_none());
}

#[test]
fn the_end_user_is_anthropics_metadata_user_id() {
    let out = to_messages(&chat(json!({"user": "u-1"}))).expect("ok");
    assert_eq!(out["metadata"], json!({"user_id": "u-1"}));
    let out = to_messages(&chat(json!({"user": "u-1", "safety_identifier": "s-2"}))).expect("ok");
    assert_eq!(out["metadata"], json!({"user_id": "s-2"}));
}

#[test]
fn sampling_parameters_pass_where_anthropic_has_them() {
    let out = to_messages(&chat(json!({"temperature": 1, "top_p": 0.5, "top_k": 40}))).expect("ok");
    assert_eq!(
        (
            out["temperature"].clone(),
            out["top_p"].clone(),
            out["top_k"].clone()
        ),
        (json!(1), json!(0.5), json!(40))
    );
}

#[test]
fn reasoning_effort_becomes_a_thinking_budget_within_max_tokens() {
    let thinking = |extra: Value| to_messages(&chat(extra)).map(|o| o["thinking"].clone());
    assert_eq!(
        thinking(json!({"reasoning_effort": "low"})),
        Ok(json!({"type": "enabled", "budget_tokens": 1024}))
    );
    assert_eq!(
        thinking(json!({"reasoning_effort": "medium"})),
        Ok(json!({"type": "enabled", "budget_tokens": 2048}))
    );
    assert_eq!(
        thinking(json!({"reasoning_effort": "high", "max_tokens": 3000})),
        Ok(json!({"type": "enabled", "budget_tokens": 2999})),
        "the budget stays under max_tokens"
    );
    assert_eq!(
        thinking(json!({"reasoning_effort": "minimal"})),
        Ok(Value::Null)
    );
    assert_eq!(
        thinking(json!({"reasoning_effort": "low", "temperature": 1, "top_p": 0.95})),
        Ok(json!({"type": "enabled", "budget_tokens": 1024}))
    );
}

#[test]
fn reasoning_never_reaches_anthropic_without_anthropics_signature() {
    let history = |assistant: Value| {
        to_messages(&json!({"model": "m", "messages": [
            {"role": "user", "content": "q"}, assistant, {"role": "user", "content": "more"}]}))
        .expect("ok")["messages"][1]["content"]
            .clone()
    };
    // Reasoning text alone (from any OpenAI-kind model): dropped.
    assert_eq!(
        history(json!({"role": "assistant", "content": "a", "reasoning_content": "I think..."})),
        json!([{"type": "text", "text": "a"}])
    );
    // Signed blocks (as this module gave them to the caller) lead the turn; unsigned and
    // unknown ones are dropped.
    assert_eq!(
        history(
            json!({"role": "assistant", "content": "a", "reasoning_content": "t", "thinking_blocks": [
                {"type": "thinking", "thinking": "t", "signature": "EqQBCgIY"},
                {"type": "thinking", "thinking": "forged", "signature": ""},
                {"type": "thinking", "thinking": "forged"},
                {"type": "redacted_thinking", "data": "EmwKAhgB"},
                {"type": "redacted_thinking"},
                {"type": "reasoning.text", "text": "x", "signature": "s"},
            ]})
        ),
        json!([
            {"type": "thinking", "thinking": "t", "signature": "EqQBCgIY"},
            {"type": "redacted_thinking", "data": "EmwKAhgB"},
            {"type": "text", "text": "a"},
        ])
    );
}

#[test]
fn images_and_files_take_anthropics_sources() {
    let part = |p: Value| {
        to_messages(&json!({"model": "m", "messages": [{"role": "user", "content": [p]}]}))
            .map(|o| o["messages"][0]["content"][0].clone())
    };
    assert_eq!(
        part(json!({"type": "image_url", "image_url": {"url": "data:image/jpg;base64,/9j/4AAQ"}})),
        Ok(
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}})
        )
    );
    assert_eq!(
        part(json!({"type": "image_url", "image_url": {"url": "http://example.com/a.webp"}})),
        Ok(json!({"type": "image", "source": {"type": "url", "url": "http://example.com/a.webp"}}))
    );
    assert_eq!(
        part(json!({"type": "text", "text": "cached", "cache_control": {"type": "ephemeral"}})),
        Ok(json!({"type": "text", "text": "cached", "cache_control": {"type": "ephemeral"}})),
        "cache_control is Anthropic's and passes to it"
    );
    // A message-level cache_control marks the message's last block.
    let out = to_messages(&json!({"model": "m", "messages": [
        {"role": "user", "content": "long document", "cache_control": {"type": "ephemeral"}}]}))
    .expect("ok");
    assert_eq!(
        out["messages"][0]["content"],
        json!([{"type": "text", "text": "long document", "cache_control": {"type": "ephemeral"}}])
    );
}

#[test]
fn what_anthropic_cannot_express_is_refused_by_name() {
    let user =
        |content: Value| json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    let with_call = |call: Value| {
        json!({"model": "m", "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [call]}]})
    };
    let cases = [
        (chat(json!({"n": 2})), "n"),
        (chat(json!({"logprobs": true})), "logprobs"),
        (chat(json!({"top_logprobs": 3})), "top_logprobs"),
        (chat(json!({"logit_bias": {"50256": -100}})), "logit_bias"),
        (chat(json!({"presence_penalty": 0.5})), "presence_penalty"),
        (chat(json!({"frequency_penalty": -1})), "frequency_penalty"),
        (
            chat(json!({"response_format": {"type": "json_object"}})),
            "response_format.type",
        ),
        (
            chat(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            ),
            "response_format.type",
        ),
        (chat(json!({"modalities": ["text", "audio"]})), "modalities"),
        (
            chat(json!({"audio": {"voice": "alloy", "format": "wav"}})),
            "audio",
        ),
        (chat(json!({"verbosity": "low"})), "verbosity"),
        (
            chat(json!({"web_search_options": {}})),
            "web_search_options",
        ),
        (chat(json!({"functions": [{"name": "f"}]})), "functions"),
        (chat(json!({"function_call": "auto"})), "function_call"),
        (chat(json!({"temperature": 1.5})), "temperature"),
        (chat(json!({"frobnicate": true})), "frobnicate"),
        (chat(json!({"messages": "hi"})), "messages"),
        (chat(json!({"tool_choice": "required"})), "tool_choice"),
        (
            chat(json!({"reasoning_effort": "maximal"})),
            "reasoning_effort",
        ),
        (
            chat(json!({"reasoning_effort": "low", "temperature": 0.5})),
            "temperature",
        ),
        (
            chat(json!({"reasoning_effort": "low", "top_p": 0.5})),
            "top_p",
        ),
        (
            chat(json!({"reasoning_effort": "low", "top_k": 5})),
            "top_k",
        ),
        (
            chat(json!({"reasoning_effort": "low", "max_tokens": 1000})),
            "reasoning_effort",
        ),
        (
            chat(json!({"reasoning_effort": "low", "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f"}}]})),
            "tool_choice",
        ),
        (
            chat(json!({"tools": [{"type": "custom", "custom": {"name": "grammar"}}]})),
            "tools[0].type",
        ),
        (
            user(
                json!([{"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}}]),
            ),
            "messages[0].content[0].type",
        ),
        (
            user(json!([{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}])),
            "messages[0].content[0].image_url.url",
        ),
        (
            user(
                json!([{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}]),
            ),
            "messages[0].content[0].image_url.url",
        ),
        (
            user(json!([{"type": "file", "file": {"file_id": "file-abc123"}}])),
            "messages[0].content[0].file.file_id",
        ),
        (
            user(
                json!([{"type": "file", "file": {"file_data": "data:text/csv;base64,YSxi", "filename": "a.csv"}}]),
            ),
            "messages[0].content[0].file.file_data",
        ),
        (
            with_call(json!({"id": "functions.get_weather:0", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}})),
            "messages[1].tool_calls[0].id",
        ),
        (
            with_call(json!({"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": "}})),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            with_call(json!({"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": "[1, 2]"}})),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            json!({"model": "m", "messages": [{"role": "function", "name": "f", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": [{"role": "assistant", "audio": {"id": "audio_abc"}}]}),
            "messages[0].audio",
        ),
        (
            json!({"model": "m", "messages": [{"role": "tool", "tool_call_id": "call 1", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
    ];
    for (body, field) in cases {
        let err = to_messages(&body).expect_err(field);
        assert_eq!(err.field, field, "{body}");
        assert!(!err.reason.is_empty());
    }
    let err = chat_request_to_messages(b"[1]", &TO_MESSAGES).expect_err("not an object");
    assert_eq!(err.field, "body");
    let err = chat_request_to_messages(b"{", &TO_MESSAGES).expect_err("not JSON");
    assert_eq!(err.field, "body");
}

#[test]
fn unexpressible_answers_name_the_field_in_either_shape() {
    let err = to_messages(&chat(json!({"n": 3}))).expect_err("n");
    let openai = json(&err.openai_body());
    assert_eq!(openai["error"]["param"], "n");
    assert_eq!(openai["error"]["type"], "invalid_request_error");
    assert!(openai["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("`n`")));
    let anthropic = json(&err.anthropic_body());
    assert_eq!(anthropic["error"]["type"], "invalid_request_error");
    assert!(anthropic["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("`n`")));
}

// === messages → chat ===

#[test]
fn the_messages_fixture_becomes_a_chat_request() {
    let out = json(
        &messages_request_to_chat(fixture!("anthropic", "messages_request.json"), &TO_CHAT)
            .expect("expressible"),
    );
    assert_eq!(out["model"], "gpt-4o-mini");
    assert_eq!(out["max_completion_tokens"], 4096);
    let msgs = out["messages"].as_array().expect("messages");
    assert_eq!(
        msgs[0],
        json!({"role": "system", "content": [
            {"type": "text", "text": "You are a travel assistant for Acme Corp. Answer concisely."},
            {"type": "text", "text": "Today is 2025-11-30. Prices are in EUR."},
        ]})
    );
    assert_eq!(msgs[1]["role"], "user");
    assert_eq!(
        msgs[1]["content"][1],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}})
    );
    assert_eq!(
        msgs[1]["content"][2],
        json!({"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}})
    );
    // The thinking is dropped; text and tool calls stay, ids byte for byte.
    assert_eq!(msgs[2]["role"], "assistant");
    assert_eq!(msgs[2]["content"], "I'll look up both cities.");
    let calls = msgs[2]["tool_calls"].as_array().expect("calls");
    assert_eq!(calls[0]["id"], "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        json(
            calls[0]["function"]["arguments"]
                .as_str()
                .expect("string")
                .as_bytes()
        ),
        json!({"location": "San Francisco, CA", "unit": "celsius"})
    );
    assert_eq!(calls[1]["id"], "toolu_01KGWJt5dbrDqsPwqYfJnPxb");
    // Each tool result is a tool message, then the rest of the turn a user message.
    assert_eq!(
        msgs[3..],
        [
            json!({"role": "tool", "tool_call_id": "toolu_01A09q90qw90lq917835lq9", "content": "15 degrees, foggy"}),
            json!({"role": "tool", "tool_call_id": "toolu_01KGWJt5dbrDqsPwqYfJnPxb", "content": "9 degrees, light rain"}),
            json!({"role": "user", "content": "Which one is warmer?"}),
        ]
    );
    assert_eq!(
        out["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["location"]
            }
        }}])
    );
    assert_eq!(out["tool_choice"], "auto");
    assert_eq!(out["parallel_tool_calls"], false);
    assert_eq!(out["stop"], json!(["\n\nHuman:", "END"]));
    assert_eq!(out["top_p"], 0.99);
    assert_eq!(out["user"], "8f14e45f-ceea-467a-9575-6a0f0d1c2e5b");
    assert_eq!(out["stream"], true);
    assert_eq!(out["stream_options"], json!({"include_usage": true}));
    assert_eq!(out["reasoning_effort"], "medium");
    assert!(
        !out.to_string().contains("cache_control"),
        "cache_control is Anthropic-only"
    );
}

#[test]
fn stream_usage_is_asked_for_only_when_wanted() {
    let body = messages(json!({"stream": true}));
    let out = json(
        &messages_request_to_chat(
            body.to_string().as_bytes(),
            &ToChat {
                upstream_model: "x",
                stream_usage: false,
            },
        )
        .expect("ok"),
    );
    assert_eq!(out["stream"], true);
    assert!(out.get("stream_options").is_none());
    let out = to_chat(&messages(json!({"stream": false}))).expect("ok");
    assert!(out.get("stream").is_none() && out.get("stream_options").is_none());
}

#[test]
fn anthropic_tool_choice_and_thinking_map_to_chat() {
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let choice =
        |c: Value| to_chat(&messages(json!({"tools": tools, "tool_choice": c}))).expect("ok");
    assert_eq!(choice(json!({"type": "auto"}))["tool_choice"], "auto");
    assert_eq!(choice(json!({"type": "any"}))["tool_choice"], "required");
    assert_eq!(choice(json!({"type": "none"}))["tool_choice"], "none");
    let named = choice(json!({"type": "tool", "name": "f", "disable_parallel_tool_use": true}));
    assert_eq!(
        named["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(named["parallel_tool_calls"], false);
    assert!(choice(json!({"type": "auto"}))
        .get("parallel_tool_calls")
        .is_none());
    let effort = |budget: u64| {
        to_chat(&messages(
            json!({"thinking": {"type": "enabled", "budget_tokens": budget}}),
        ))
        .expect("ok")["reasoning_effort"]
            .clone()
    };
    assert_eq!(
        (effort(1024), effort(2048), effort(4096), effort(32000)),
        (json!("low"), json!("medium"), json!("high"), json!("high"))
    );
    let off = to_chat(&messages(json!({"thinking": {"type": "disabled"}}))).expect("ok");
    assert!(off.get("reasoning_effort").is_none());
    let out = to_chat(&messages(
        json!({"temperature": 0.2, "service_tier": "auto"}),
    ))
    .expect("ok");
    assert_eq!(out["temperature"], 0.2);
    assert!(out.get("service_tier").is_none(), "advisory: dropped");
}

#[test]
fn documents_and_tool_results_map_to_chat_parts() {
    let out = to_chat(&json!({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}, "title": "report.pdf"},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}},
            {"type": "text", "text": "summarise"},
        ]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, {"b": null}]}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true, "content": "boom"}]},
    ]}))
    .expect("ok");
    assert_eq!(
        out["messages"][0]["content"],
        json!([
            {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"}},
            {"type": "text", "text": "plain words"},
            {"type": "text", "text": "summarise"},
        ])
    );
    assert_eq!(out["messages"][1]["content"], Value::Null);
    assert_eq!(
        json(
            out["messages"][1]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .expect("s")
                .as_bytes()
        ),
        json!({"a": [1, {"b": null}]})
    );
    assert_eq!(
        out["messages"][2],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "boom"})
    );
}

#[test]
fn what_chat_cannot_express_is_refused_by_name() {
    let user = |content: Value| json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": content}]});
    let cases = [
        (messages(json!({"top_k": 5})), "top_k"),
        (
            messages(json!({"stop_sequences": ["a", "b", "c", "d", "e"]})),
            "stop_sequences",
        ),
        (
            messages(json!({"metadata": {"user_id": "u", "tenant": "t"}})),
            "metadata.tenant",
        ),
        (
            messages(
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]}),
            ),
            "tools[0].type",
        ),
        (
            messages(json!({"tools": [{"type": "bash_20250124", "name": "bash"}]})),
            "tools[0].type",
        ),
        (
            messages(json!({"container": "container_011CN"})),
            "container",
        ),
        (messages(json!({"mcp_servers": []})), "mcp_servers"),
        (json!({"model": "m", "messages": []}), "max_tokens"),
        (
            user(json!([{"type": "image", "source": {"type": "file", "file_id": "file_011CN"}}])),
            "messages[0].content[0].source.type",
        ),
        (
            user(
                json!([{"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]),
            ),
            "messages[0].content[0].source.type",
        ),
        (
            user(
                json!([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"},
                "citations": {"enabled": true}}]),
            ),
            "messages[0].content[0].citations",
        ),
        (
            user(
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}]}]),
            ),
            "messages[0].content[0].content[0].type",
        ),
        (
            user(json!([{"type": "search_result", "source": "s", "title": "t", "content": []}])),
            "messages[0].content[0].type",
        ),
        (
            json!({"model": "m", "max_tokens": 10, "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}]},
                {"role": "user", "content": "r"}]}),
            "messages[1].content[0].type",
        ),
        (
            json!({"model": "m", "max_tokens": 10, "messages": [
                {"role": "user", "content": "Give me JSON"}, {"role": "assistant", "content": "{"}]}),
            "messages[1]",
        ),
        (
            json!({"model": "m", "max_tokens": 10, "messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            messages(json!({"output_config": {"format": {"type": "json"}}})),
            "output_config.format",
        ),
        (
            messages(json!({"thinking": {"type": "sometimes"}})),
            "thinking.type",
        ),
        (
            json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x", "name": "bob"}]}),
            "messages[0].name",
        ),
        (messages(json!({"temperature": "hot"})), "temperature"),
    ];
    for (body, field) in cases {
        let err = to_chat(&body).expect_err(field);
        assert_eq!(err.field, field, "{body}");
    }
}

// === round trips ===

/// Chat content in one comparable form: text parts joined, other parts kept.
fn chat_content(c: &Value) -> Value {
    match c {
        Value::Array(parts) if parts.iter().all(|p| p["type"] == "text") => Value::String(
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Value::Array(parts) => Value::Array(
            parts
                .iter()
                .map(|p| {
                    let mut p = p.clone();
                    if let Some(img) = p.get_mut("image_url").and_then(Value::as_object_mut) {
                        img.remove("detail");
                    }
                    p
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A chat request's meaning: system text, then each message's role, content, calls, results.
fn chat_meaning(req: &Value) -> Vec<Value> {
    let msgs = req["messages"].as_array().expect("messages");
    let system: Vec<String> = msgs
        .iter()
        .filter(|m| m["role"] == "system" || m["role"] == "developer")
        .filter_map(|m| chat_content(&m["content"]).as_str().map(str::to_string))
        .collect();
    let mut meaning = vec![json!({"system": system.join("\n")})];
    for m in msgs
        .iter()
        .filter(|m| m["role"] != "system" && m["role"] != "developer")
    {
        let calls: Vec<Value> = m["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        json!([
                            c["id"],
                            c["function"]["name"],
                            json(c["function"]["arguments"].as_str().expect("s").as_bytes())
                        ])
                    })
                    .collect()
            })
            .unwrap_or_default();
        meaning.push(json!({
            "role": m["role"],
            "content": chat_content(&m["content"]),
            "calls": calls,
            "result_for": m["tool_call_id"],
        }));
    }
    meaning
}

#[test]
fn chat_to_messages_to_chat_keeps_the_meaning() {
    let original = json(fixture!("openai", "chat_request.json"));
    let there = chat_request_to_messages(fixture!("openai", "chat_request.json"), &TO_MESSAGES)
        .expect("to messages");
    let back = json(&messages_request_to_chat(&there, &TO_CHAT).expect("back to chat"));
    assert_eq!(chat_meaning(&back), chat_meaning(&original));
    assert_eq!(back["model"], "gpt-4o-mini");
    for key in [
        "temperature",
        "top_p",
        "user",
        "stream",
        "tool_choice",
        "parallel_tool_calls",
    ] {
        assert_eq!(back[key], original[key], "{key}");
    }
    assert_eq!(
        back["max_completion_tokens"],
        original["max_completion_tokens"]
    );
    assert_eq!(back["stop"], json!([original["stop"]]));
    let mut tools = original["tools"].clone();
    tools[0]["function"]
        .as_object_mut()
        .expect("function")
        .remove("strict");
    assert_eq!(back["tools"], tools, "tools keep everything but `strict`");
}

#[test]
fn messages_to_chat_to_messages_keeps_the_meaning_and_the_ids() {
    let original = json(fixture!("anthropic", "messages_request.json"));
    let there = messages_request_to_chat(fixture!("anthropic", "messages_request.json"), &TO_CHAT)
        .expect("to chat");
    let back = json(&chat_request_to_messages(&there, &TO_MESSAGES).expect("back to messages"));

    // What a chat model cannot carry is gone: the signed thinking of the history and
    // cache_control. Everything else is as it was.
    let mut expected = original.clone();
    let strip = |v: &mut Value| {
        fn walk(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    m.remove("cache_control");
                    m.remove("is_error");
                    m.values_mut().for_each(walk);
                }
                Value::Array(a) => a.iter_mut().for_each(walk),
                _ => {}
            }
        }
        walk(v);
    };
    strip(&mut expected);
    expected["messages"][1]["content"]
        .as_array_mut()
        .expect("assistant blocks")
        .remove(0);
    // A one-block tool result comes back in its string form.
    expected["messages"][2]["content"][1]["content"] = json!("9 degrees, light rain");
    expected["model"] = json!("claude-sonnet-4-5-20250929");
    assert_eq!(back["messages"], expected["messages"]);
    assert_eq!(back["system"], expected["system"]);
    for key in [
        "max_tokens",
        "tools",
        "tool_choice",
        "stop_sequences",
        "top_p",
        "metadata",
        "thinking",
        "stream",
    ] {
        assert_eq!(back[key], expected[key], "{key}");
    }
}

/// What Claude Code sends (print mode, 2.x), translated for an OpenAI-kind model: system text
/// blocks with cache control, a system message mid-conversation, adaptive thinking, context
/// management, an output effort, tools with cache control, `tool_choice: auto`.
#[test]
fn a_claude_code_request_reaches_a_chat_model() {
    let body = json!({
        "model": "claude-opus-4-8",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be terse."}
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": "Fix the bug.", "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "system", "content": "The user switched to plan mode."},
            {"role": "user", "content": "Go on."}
        ],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": false},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "user_abc_account_x_session_y"},
        "temperature": 1
    });
    let out = to_chat(&body).expect("a Claude Code request translates");
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(
        msgs[0]["content"],
        json!([{"type": "text", "text": "You are Claude Code."}, {"type": "text", "text": "Be terse."}])
    );
    assert_eq!(msgs[1]["role"], "user");
    assert_eq!(
        msgs[2],
        json!({"role": "system", "content": "The user switched to plan mode."})
    );
    assert_eq!(msgs[3], json!({"role": "user", "content": "Go on."}));
    assert_eq!(
        out["reasoning_effort"], "high",
        "output_config.effort carried"
    );
    assert_eq!(out["tool_choice"], "auto");
    assert_ne!(
        out["parallel_tool_calls"], false,
        "parallel calls stay allowed"
    );
    assert!(out.get("context_management").is_none());
    assert!(out.get("thinking").is_none());
    assert_eq!(out["user"], "user_abc_account_x_session_y");
    assert!(!out.to_string().contains("cache_control"));
}

/// What Claude Code 2.1.332 sends beyond that (captured from it): a per-turn effort on a system
/// message (Anthropic's per-turn control), `thinking.display`, deferred tools (tool search).
/// The latest turn's effort wins over the request's; the rest is dropped.
#[test]
fn a_per_turn_effort_overrides_the_requests() {
    let body = json!({
        "model": "claude-opus-5-5",
        "max_tokens": 128000,
        "stream": true,
        "messages": [
            {"role": "user", "content": "Say hello."},
            {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}],
             "output_config": {"effort": "low"}},
            {"role": "user", "content": "Go on."}
        ],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}, "defer_loading": true}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}
    });
    let out = to_chat(&body).expect("a Claude Code 2.1 request translates");
    assert_eq!(out["reasoning_effort"], "low", "{out}");
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(
        msgs[1],
        json!({"role": "system", "content": "# Environment"})
    );
    assert!(
        msgs.iter().all(|m| m.get("output_config").is_none()),
        "{out}"
    );
    assert_eq!(out["tools"][0]["function"]["name"], "Bash");
    assert!(!out.to_string().contains("defer_loading"), "{out}");
    assert!(out.get("thinking").is_none(), "{out}");

    // A turn's effort alone; `max` is OpenAI's `high`.
    let mut alone = body.clone();
    alone.as_object_mut().unwrap().remove("output_config");
    alone["messages"][1]["output_config"] = json!({"effort": "max"});
    assert_eq!(to_chat(&alone).unwrap()["reasoning_effort"], "high");

    // A turn's output_config member chat cannot express is refused, named where it stands.
    for (config, field) in [
        (
            json!({"format": {"type": "json_schema"}}),
            "messages[1].output_config.format",
        ),
        (
            json!({"effort": "extreme"}),
            "messages[1].output_config.effort",
        ),
        (json!("low"), "messages[1].output_config"),
    ] {
        let mut bad = body.clone();
        bad["messages"][1]["output_config"] = config;
        assert_eq!(to_chat(&bad).expect_err(field).field, field);
    }
}
