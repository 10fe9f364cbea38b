//! Complete (non-streamed) answers: an Anthropic message for a chat caller
//! ([`messages_response_to_chat`]) and a chat completion for a messages caller
//! ([`chat_response_to_messages`]), each with the usage it reported.
//!
//! The caller's model name replaces the provider's; ids (the answer's and every tool call's)
//! are kept byte for byte. A provider answer outside its dialect's shape is a [`BadUpstream`].

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{
    anthropic_usage_json, finish_reason_for, now_unix, openai_usage_json, signed_thinking,
    stop_reason_for, usage_from_anthropic, usage_from_openai, BadUpstream,
};
use crate::adapters::stream::Usage;

/// A chat completion, members in OpenAI's order.
#[derive(Serialize)]
struct ChatCompletion<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [ChatChoice; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Value>,
}

#[derive(Serialize)]
struct ChatChoice {
    index: u32,
    message: Value,
    logprobs: Option<Value>,
    finish_reason: Option<&'static str>,
}

/// An Anthropic message, members in Anthropic's order.
#[derive(Serialize)]
struct AnthropicMessage<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<Value>,
    stop_reason: &'static str,
    stop_sequence: Option<Value>,
    usage: Value,
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, BadUpstream> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(BadUpstream::Malformed("the body is not an object")),
        Err(_) => Err(BadUpstream::NotJson),
    }
}

fn take_id(obj: &mut Map<String, Value>) -> String {
    match obj.remove("id") {
        Some(Value::String(id)) => id,
        _ => String::new(),
    }
}

/// An Anthropic Messages answer as a chat completion for a caller that named `caller_model`.
pub fn messages_response_to_chat(
    body: &[u8],
    caller_model: &str,
) -> Result<(Vec<u8>, Option<Usage>), BadUpstream> {
    let mut msg = parse_object(body)?;
    let Some(Value::Array(blocks)) = msg.remove("content") else {
        return Err(BadUpstream::Malformed("content is not an array"));
    };
    let mut text: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut thinking_blocks = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        let Value::Object(mut block) = block else {
            return Err(BadUpstream::Malformed("a content block is not an object"));
        };
        match block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "text" => {
                let t = block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                text.get_or_insert_with(String::new).push_str(t);
            }
            "tool_use" => {
                let input = block.remove("input").unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": take_id(&mut block),
                    "type": "function",
                    "function": {
                        "name": block.remove("name").unwrap_or_default(),
                        "arguments": input.to_string(),
                    },
                }));
            }
            "thinking" => {
                let t = block
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                reasoning.get_or_insert_with(String::new).push_str(t);
                thinking_blocks.extend(signed_thinking(Value::Object(block)));
            }
            "redacted_thinking" => thinking_blocks.extend(signed_thinking(Value::Object(block))),
            // Server-tool blocks and whatever Anthropic adds next: never requested by a
            // translated request (the request side refuses server tools).
            _ => {}
        }
    }
    let mut message = json!({
        "role": "assistant",
        // Chat's convention: `null` content beside tool calls, "" for an empty answer.
        "content": match text {
            Some(t) if !t.is_empty() || tool_calls.is_empty() => Value::String(t),
            _ if !tool_calls.is_empty() => Value::Null,
            _ => Value::String(String::new()),
        },
        "refusal": null,
    });
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    if let Some(r) = reasoning {
        message["reasoning_content"] = Value::String(r);
    }
    if !thinking_blocks.is_empty() {
        message["thinking_blocks"] = Value::Array(thinking_blocks);
    }
    let usage = msg.get("usage").and_then(usage_from_anthropic);
    let finish_reason = msg
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(finish_reason_for);
    let out = ChatCompletion {
        id: take_id(&mut msg),
        object: "chat.completion",
        created: now_unix(),
        model: caller_model,
        choices: [ChatChoice {
            index: 0,
            message,
            logprobs: None,
            finish_reason: Some(finish_reason.unwrap_or("stop")),
        }],
        usage: usage.as_ref().map(openai_usage_json),
    };
    Ok((serde_json::to_vec(&out).unwrap_or_default(), usage))
}

/// A chat completion as an Anthropic Messages answer for a caller that named `caller_model`.
/// Only the first choice is read (a translated request never asks for more).
pub fn chat_response_to_messages(
    body: &[u8],
    caller_model: &str,
) -> Result<(Vec<u8>, Option<Usage>), BadUpstream> {
    let mut completion = parse_object(body)?;
    let choice = match completion.remove("choices") {
        Some(Value::Array(choices)) if choices.is_empty() => return Err(BadUpstream::EmptyChoices),
        Some(Value::Array(choices)) => choices.into_iter().next(),
        _ => None,
    };
    let Some(Value::Object(mut choice)) = choice else {
        return Err(BadUpstream::Malformed("choices is not an array of objects"));
    };
    let Some(Value::Object(mut message)) = choice.remove("message") else {
        return Err(BadUpstream::Malformed("a choice has no message"));
    };
    let finish_reason = choice.get("finish_reason").and_then(Value::as_str);

    let mut content = Vec::new();
    if let Some(Value::Array(list)) = message.remove("thinking_blocks") {
        content.extend(list.into_iter().filter_map(signed_thinking));
    }
    let mut push_text = |t: String| {
        if !t.is_empty() {
            content.push(json!({"type": "text", "text": t}));
        }
    };
    match message.remove("content") {
        Some(Value::String(t)) => push_text(t),
        Some(Value::Array(parts)) => {
            for mut part in parts {
                if let Some(Value::String(t)) = part.get_mut("text").map(Value::take) {
                    push_text(t);
                }
            }
        }
        _ => {}
    }
    if let Some(Value::String(t)) = message.remove("refusal") {
        push_text(t);
    }
    if let Some(Value::Array(calls)) = message.remove("tool_calls") {
        for call in calls {
            let Value::Object(mut call) = call else {
                return Err(BadUpstream::Malformed("a tool call is not an object"));
            };
            let f = call.remove("function").unwrap_or_default();
            let input = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) if s.trim().is_empty() => json!({}),
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(v @ Value::Object(_)) => v,
                    // Cut off by the token limit: the arguments are a prefix, and
                    // `max_tokens` tells the caller so.
                    _ if finish_reason == Some("length") => json!({}),
                    _ => {
                        return Err(BadUpstream::Malformed(
                            "tool call arguments are not a JSON object",
                        ))
                    }
                },
                Some(_) => return Err(BadUpstream::Malformed("tool call arguments")),
            };
            content.push(json!({
                "type": "tool_use",
                "id": take_id(&mut call),
                "name": f.get("name").cloned().unwrap_or_default(),
                "input": input,
            }));
        }
    }
    let usage = completion.get("usage").and_then(usage_from_openai);
    let out = AnthropicMessage {
        id: take_id(&mut completion),
        kind: "message",
        role: "assistant",
        model: caller_model,
        content,
        stop_reason: stop_reason_for(finish_reason.unwrap_or("stop")),
        stop_sequence: None,
        usage: anthropic_usage_json(&usage.unwrap_or_default()),
    };
    Ok((serde_json::to_vec(&out).unwrap_or_default(), usage))
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
