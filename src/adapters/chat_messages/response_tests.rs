use serde_json::{json, Value};

use super::*;
use crate::adapters::chat_messages::testing::{fixture, json};

fn to_chat(body: &[u8]) -> (Value, Option<Usage>) {
    let (out, usage) = messages_response_to_chat(body, "smart").expect("translatable");
    (json(&out), usage)
}

fn to_messages(body: &[u8]) -> (Value, Option<Usage>) {
    let (out, usage) = chat_response_to_messages(body, "smart").expect("translatable");
    (json(&out), usage)
}

// === messages → chat ===

#[test]
fn an_anthropic_text_answer_is_a_chat_completion_with_usage() {
    let (out, usage) = to_chat(fixture!("anthropic", "message_text.json"));
    assert_eq!(out["id"], "msg_01XFDUDYJgAACzvnptvVoYEL");
    assert_eq!(out["object"], "chat.completion");
    assert!(out["created"].as_u64().is_some_and(|t| t > 1_700_000_000));
    assert_eq!(
        out["model"], "smart",
        "the caller's model, not the provider's"
    );
    assert_eq!(
        out["choices"],
        json!([{"index": 0, "message": {"role": "assistant",
            "content": "Hello! How can I help you today?", "refusal": null},
            "logprobs": null, "finish_reason": "stop"}])
    );
    // Anthropic counts cached input apart; chat's prompt_tokens includes it.
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": 12 + 2051 + 1024, "completion_tokens": 11,
            "total_tokens": 12 + 2051 + 1024 + 11, "prompt_tokens_details": {"cached_tokens": 1024}})
    );
    assert_eq!(
        usage,
        Some(Usage {
            prompt_tokens: 3087,
            completion_tokens: 11,
            cache_read_tokens: 1024,
            cache_write_tokens: 2051,
        })
    );
    let text = std::str::from_utf8(
        &messages_response_to_chat(fixture!("anthropic", "message_text.json"), "smart")
            .expect("ok")
            .0,
    )
    .expect("utf8")
    .to_string();
    assert!(
        text.starts_with("{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"object\":\"chat.completion\"")
    );
}

#[test]
fn tool_use_blocks_are_tool_calls_with_their_ids() {
    let (out, _) = to_chat(fixture!("anthropic", "message_tool_use.json"));
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(
        choice["message"]["content"],
        "I'll check the current weather in both cities for you."
    );
    let calls = choice["message"]["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2);
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
}

#[test]
fn thinking_is_reasoning_content_and_the_signed_blocks_ride_along() {
    let (out, _) = to_chat(fixture!("anthropic", "message_thinking.json"));
    let message = &out["choices"][0]["message"];
    assert_eq!(
        message["content"],
        "No, 27 is not a prime number: it is 3 × 9."
    );
    assert_eq!(
        message["reasoning_content"],
        "To approach this, let's think about what we know about prime numbers. 27 = 3 x 9, so it is not prime."
    );
    assert_eq!(
        message["thinking_blocks"],
        json!([
            {"type": "thinking", "thinking": "To approach this, let's think about what we know about prime numbers. 27 = 3 x 9, so it is not prime.",
             "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP..."},
        ])
    );
}

#[test]
fn stop_reasons_become_finish_reasons() {
    let finish = |body: &[u8]| to_chat(body).0["choices"][0]["finish_reason"].clone();
    assert_eq!(finish(fixture!("anthropic", "message_text.json")), "stop");
    assert_eq!(
        finish(fixture!("anthropic", "message_stop_sequence.json")),
        "stop"
    );
    assert_eq!(
        finish(fixture!("anthropic", "message_max_tokens.json")),
        "length"
    );
    assert_eq!(
        finish(fixture!("anthropic", "message_tool_use.json")),
        "tool_calls"
    );
    assert_eq!(
        finish(fixture!("anthropic", "message_refusal.json")),
        "content_filter"
    );
    let (refusal, _) = to_chat(fixture!("anthropic", "message_refusal.json"));
    assert_eq!(
        refusal["choices"][0]["message"]["content"], "",
        "no text: an empty answer"
    );
}

#[test]
fn a_broken_anthropic_answer_is_a_bad_upstream() {
    assert_eq!(
        messages_response_to_chat(b"<html>", "m").err(),
        Some(BadUpstream::NotJson)
    );
    assert!(matches!(
        messages_response_to_chat(b"{\"type\":\"message\"}", "m").err(),
        Some(BadUpstream::Malformed(_))
    ));
    assert!(matches!(
        messages_response_to_chat(b"[]", "m").err(),
        Some(BadUpstream::Malformed(_))
    ));
}

// === chat → messages ===

#[test]
fn a_chat_text_answer_is_an_anthropic_message_with_usage() {
    let (out, usage) = to_messages(fixture!("openai", "chat_completion_text.json"));
    assert_eq!(
        out,
        json!({
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "type": "message",
            "role": "assistant",
            "model": "smart",
            "content": [{"type": "text", "text": "Hello! How can I assist you today?"}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": 2079 - 1920, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 1920, "output_tokens": 10},
        })
    );
    assert_eq!(
        usage,
        Some(Usage {
            prompt_tokens: 2079,
            completion_tokens: 10,
            cache_read_tokens: 1920,
            cache_write_tokens: 0,
        })
    );
}

#[test]
fn tool_calls_are_tool_use_blocks_with_their_ids() {
    let (out, _) = to_messages(fixture!("openai", "chat_completion_tool_calls.json"));
    assert_eq!(out["stop_reason"], "tool_use");
    assert_eq!(
        out["content"],
        json!([
            {"type": "tool_use", "id": "call_Kd8fOgEVEd8cq3WJ0vUpBbcZ", "name": "get_weather",
             "input": {"location": "San Francisco, CA", "unit": "celsius"}},
            {"type": "tool_use", "id": "call_1bwdq4yO6OkXiFD5IDt1uXzl", "name": "get_weather",
             "input": {"location": "Paris, France"}},
        ])
    );
}

#[test]
fn finish_reasons_become_stop_reasons() {
    let stop = |body: &[u8]| to_messages(body).0["stop_reason"].clone();
    assert_eq!(
        stop(fixture!("openai", "chat_completion_text.json")),
        "end_turn"
    );
    assert_eq!(
        stop(fixture!("openai", "chat_completion_length.json")),
        "max_tokens"
    );
    assert_eq!(
        stop(fixture!("openai", "chat_completion_tool_calls.json")),
        "tool_use"
    );
    let (filtered, _) = to_messages(fixture!("openai", "chat_completion_content_filter.json"));
    assert_eq!(filtered["stop_reason"], "refusal");
    assert_eq!(
        filtered["content"],
        json!([{"type": "text", "text": "I'm sorry, I can't help with that."}])
    );
}

#[test]
fn unsigned_reasoning_is_not_turned_into_anthropic_thinking() {
    let body = json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "deepseek-reasoner",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
            "content": "42", "reasoning_content": "Let me think."}}]});
    let (out, usage) = to_messages(body.to_string().as_bytes());
    assert_eq!(out["content"], json!([{"type": "text", "text": "42"}]));
    assert_eq!(usage, None);
    assert_eq!(
        out["usage"],
        json!({"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0})
    );
}

#[test]
fn truncated_tool_arguments_are_empty_only_when_the_answer_was_cut() {
    let body = |finish: &str| {
        json!({"id": "c1", "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant",
            "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": "{\"city\": \"Par"}}]}}]})
        .to_string()
    };
    let (out, _) = to_messages(body("length").as_bytes());
    assert_eq!(out["content"][0]["input"], json!({}));
    assert_eq!(out["stop_reason"], "max_tokens");
    assert!(matches!(
        chat_response_to_messages(body("tool_calls").as_bytes(), "m").err(),
        Some(BadUpstream::Malformed(_))
    ));
}

#[test]
fn a_chat_answer_with_no_choices_is_a_bad_upstream() {
    assert_eq!(
        chat_response_to_messages(
            fixture!("openai", "chat_completion_empty_choices.json"),
            "m"
        )
        .err(),
        Some(BadUpstream::EmptyChoices)
    );
    assert_eq!(
        chat_response_to_messages(b"{", "m").err(),
        Some(BadUpstream::NotJson)
    );
    assert!(matches!(
        chat_response_to_messages(b"{\"choices\":[{\"index\":0}]}", "m").err(),
        Some(BadUpstream::Malformed(_))
    ));
    assert_eq!(BadUpstream::EmptyChoices.label(), "empty_choices");
}

// === round trips ===

#[test]
fn messages_to_chat_to_messages_keeps_content_ids_and_reasons() {
    for body in [
        fixture!("anthropic", "message_text.json"),
        fixture!("anthropic", "message_tool_use.json"),
        fixture!("anthropic", "message_thinking.json"),
        fixture!("anthropic", "message_max_tokens.json"),
        fixture!("anthropic", "message_refusal.json"),
    ] {
        let original = json(body);
        let (chat, usage_there) = messages_response_to_chat(body, "smart").expect("to chat");
        let (back, usage_back) = chat_response_to_messages(&chat, "smart").expect("back");
        let back = json(&back);
        for key in ["id", "type", "role", "content", "stop_reason"] {
            assert_eq!(back[key], original[key], "{key} of {}", original["id"]);
        }
        assert_eq!(back["model"], "smart");
        // Totals survive; a chat caller cannot tell cache writes from other input.
        let (there, back_usage) = (usage_there.expect("usage"), usage_back.expect("usage"));
        assert_eq!(there.prompt_tokens, back_usage.prompt_tokens);
        assert_eq!(there.completion_tokens, back_usage.completion_tokens);
        assert_eq!(there.cache_read_tokens, back_usage.cache_read_tokens);
    }
}

#[test]
fn chat_to_messages_to_chat_keeps_content_ids_and_reasons() {
    for body in [
        fixture!("openai", "chat_completion_text.json"),
        fixture!("openai", "chat_completion_tool_calls.json"),
        fixture!("openai", "chat_completion_length.json"),
    ] {
        let original = json(body);
        let (messages, _) = chat_response_to_messages(body, "smart").expect("to messages");
        let (back, usage) = messages_response_to_chat(&messages, "smart").expect("back");
        let back = json(&back);
        assert_eq!(back["id"], original["id"]);
        let (m, o) = (&back["choices"][0], &original["choices"][0]);
        assert_eq!(m["finish_reason"], o["finish_reason"]);
        assert_eq!(m["message"]["content"], o["message"]["content"]);
        let calls = |v: &Value| -> Vec<Value> {
            v["message"]["tool_calls"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|c| {
                            json!([
                                c["id"],
                                c["function"]["name"],
                                json(c["function"]["arguments"].as_str().expect("s").as_bytes())
                            ])
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(calls(m), calls(o));
        assert_eq!(
            back["usage"]["prompt_tokens"],
            original["usage"]["prompt_tokens"]
        );
        assert_eq!(
            back["usage"]["completion_tokens"],
            original["usage"]["completion_tokens"]
        );
        assert_eq!(
            back["usage"]["prompt_tokens_details"]["cached_tokens"],
            original["usage"]["prompt_tokens_details"]["cached_tokens"]
        );
        assert!(usage.is_some());
    }
}

#[test]
fn a_tool_call_only_answer_has_null_content_as_openai_sends_it() {
    // Anthropic's reference shape: one tool_use block, no text.
    let (out, _) = to_chat(include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/providers/anthropic/message_tool_use_only.json"
    )));
    let message = &out["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
    // An empty text block beside the call is no text either.
    let body = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1}});
    let (out, _) = to_chat(body.to_string().as_bytes());
    assert_eq!(out["choices"][0]["message"]["content"], Value::Null);
}
