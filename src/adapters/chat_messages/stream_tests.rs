use bytes::BytesMut;
use serde_json::{json, Map, Value};

use super::*;
use crate::adapters::chat_messages::testing::{
    fixture, json, run_split, sse_events, Converter, Rng,
};
use crate::adapters::stream::InbandError;

const CREATED: u64 = 1_764_547_200;

fn to_chat(usage_for_caller: bool) -> MessagesStreamToChat {
    MessagesStreamToChat::new_at("smart", usage_for_caller, CREATED)
}

fn to_messages() -> ChatStreamToMessages {
    ChatStreamToMessages::new("smart", true)
}

const ANTHROPIC_STREAMS: [&[u8]; 4] = [
    fixture!("anthropic", "stream_text.sse"),
    fixture!("anthropic", "stream_tool_use.sse"),
    fixture!("anthropic", "stream_thinking.sse"),
    fixture!("anthropic", "stream_overloaded.sse"),
];

const CHAT_STREAMS: [&[u8]; 3] = [
    fixture!("openai", "chat_stream_text.sse"),
    fixture!("openai", "chat_stream_tool_calls.sse"),
    fixture!("openai", "chat_stream_error.sse"),
];

/// The input's events (split at blank lines), each with its separator.
fn input_events(input: &[u8]) -> Vec<&[u8]> {
    let mut events = Vec::new();
    let mut at = 0;
    while let Some(i) = memchr::memmem::find(&input[at..], b"\n\n") {
        events.push(&input[at..at + i + 2]);
        at += i + 2;
    }
    if at < input.len() {
        events.push(&input[at..]);
    }
    events
}

/// Chat chunks (the `choices[0]` of each, or the usage chunk) as data values.
fn chunks(out: &[u8]) -> Vec<Value> {
    sse_events(out)
        .into_iter()
        .map(|(name, data)| {
            assert_eq!(name, "", "chat streams name no events");
            data
        })
        .collect()
}

/// What a chat client assembles from a stream: content, reasoning, tool calls by index,
/// the finish reason, usage.
fn assemble_chat(chunks: &[Value]) -> Value {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    let mut signatures = Vec::new();
    for c in chunks.iter().filter(|c| !c.is_null()) {
        if !c["usage"].is_null() {
            usage = c["usage"].clone();
        }
        let Some(choice) = c["choices"].get(0) else {
            continue;
        };
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or_default());
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or_default());
        for b in d["thinking_blocks"].as_array().into_iter().flatten() {
            signatures.push(b.clone());
        }
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().expect("index") as usize;
            if calls.len() <= i {
                calls.resize(i + 1, json!({"id": null, "name": null, "arguments": ""}));
            }
            if let Some(id) = tc["id"].as_str() {
                calls[i]["id"] = json!(id);
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                calls[i]["name"] = json!(name);
            }
            let args = format!(
                "{}{}",
                calls[i]["arguments"].as_str().unwrap_or_default(),
                tc["function"]["arguments"].as_str().unwrap_or_default()
            );
            calls[i]["arguments"] = json!(args);
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    for call in &mut calls {
        let args = call["arguments"].as_str().unwrap_or_default().to_string();
        call["arguments"] = json(args.as_bytes());
    }
    json!({"content": content, "reasoning": reasoning, "thinking_blocks": signatures,
        "tool_calls": calls, "finish_reason": finish, "usage": usage})
}

/// What an Anthropic client (its SDK's accumulator) assembles from a stream.
fn assemble_anthropic(events: &[(String, Value)]) -> Value {
    let mut message = Value::Null;
    let mut partial: Map<String, Value> = Map::new();
    for (name, data) in events {
        assert_eq!(
            name,
            data["type"].as_str().expect("type"),
            "event name is its type"
        );
        let index = data["index"].as_u64().unwrap_or(0) as usize;
        match name.as_str() {
            "message_start" => message = data["message"].clone(),
            "content_block_start" => {
                let blocks = message["content"].as_array_mut().expect("content");
                assert_eq!(blocks.len(), index, "blocks start in order");
                blocks.push(data["content_block"].clone());
            }
            "content_block_delta" => {
                let block = &mut message["content"][index];
                let d = &data["delta"];
                match d["type"].as_str().expect("delta type") {
                    "text_delta" => {
                        block["text"] = json!(format!(
                            "{}{}",
                            block["text"].as_str().expect("text"),
                            d["text"].as_str().expect("s")
                        ));
                    }
                    "thinking_delta" => {
                        block["thinking"] = json!(format!(
                            "{}{}",
                            block["thinking"].as_str().expect("t"),
                            d["thinking"].as_str().expect("s")
                        ));
                    }
                    "signature_delta" => block["signature"] = d["signature"].clone(),
                    "input_json_delta" => {
                        let so_far = partial.entry(index.to_string()).or_insert(json!(""));
                        *so_far = json!(format!(
                            "{}{}",
                            so_far.as_str().expect("s"),
                            d["partial_json"].as_str().expect("s")
                        ));
                    }
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                if let Some(args) = partial.remove(&index.to_string()) {
                    message["content"][index]["input"] = json(args.as_str().expect("s").as_bytes());
                }
            }
            "message_delta" => {
                message["stop_reason"] = data["delta"]["stop_reason"].clone();
                for (k, v) in data["usage"].as_object().expect("usage") {
                    message["usage"][k] = v.clone();
                }
            }
            "message_stop" | "ping" | "error" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    message
}

// === Anthropic → chat ===

#[test]
fn an_anthropic_text_stream_becomes_chat_chunks() {
    let out = run_split(
        &mut to_chat(true),
        fixture!("anthropic", "stream_text.sse"),
        &[],
    );
    let head = |delta: Value, finish: Value| {
        json!({"id": "msg_01PyVbUQtWwSMj1M5QNmMvZp", "object": "chat.completion.chunk",
            "created": CREATED, "model": "smart",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    };
    assert_eq!(
        chunks(&out),
        vec![
            head(
                json!({"role": "assistant", "content": "", "refusal": null}),
                Value::Null
            ),
            head(json!({"content": "Hello"}), Value::Null),
            head(
                json!({"content": "! Grüße aus Zürich 👋 — \"quoted\"\nnew line."}),
                Value::Null
            ),
            head(json!({}), json!("stop")),
            json!({"id": "msg_01PyVbUQtWwSMj1M5QNmMvZp", "object": "chat.completion.chunk",
                "created": CREATED, "model": "smart", "choices": [],
                "usage": {"prompt_tokens": 2069, "completion_tokens": 15, "total_tokens": 2084,
                    "prompt_tokens_details": {"cached_tokens": 2048}}}),
            Value::Null,
        ]
    );
    assert!(out.ends_with(b"data: [DONE]\n\n"));
}

#[test]
fn signals_follow_the_anthropic_stream_event_by_event() {
    let mut conv = to_chat(true);
    let mut out = BytesMut::new();
    let events = input_events(fixture!("anthropic", "stream_text.sse"));
    // message_start, content_block_start (empty text), ping: no content yet.
    for ev in &events[..3] {
        conv.feed(ev, &mut out).expect("feed");
        assert!(!conv.signals().content, "{}", String::from_utf8_lossy(ev));
    }
    assert_eq!(
        conv.signals().usage,
        Some(Usage {
            prompt_tokens: 2069,
            completion_tokens: 1,
            cache_read_tokens: 2048,
            cache_write_tokens: 0
        })
    );
    conv.feed(events[3], &mut out).expect("first text delta");
    assert!(conv.signals().content);
    assert!(!conv.signals().terminal);
    for ev in &events[4..events.len() - 1] {
        conv.feed(ev, &mut out).expect("feed");
    }
    assert!(!conv.signals().terminal, "not before message_stop");
    assert_eq!(conv.signals().usage.map(|u| u.completion_tokens), Some(15));
    conv.feed(events[events.len() - 1], &mut out)
        .expect("message_stop");
    let s = conv.signals();
    assert!(s.terminal && s.error.is_none() && !s.empty_choices);
}

#[test]
fn without_usage_asked_for_no_usage_chunk_is_sent_but_usage_is_recorded() {
    let mut conv = to_chat(false);
    let out = run_split(&mut conv, fixture!("anthropic", "stream_text.sse"), &[]);
    let all = chunks(&out);
    assert!(
        all.iter().all(|c| c.get("usage").is_none()),
        "no usage chunk"
    );
    assert_eq!(all.len(), 5, "role, two contents, finish, [DONE]");
    assert_eq!(
        conv.signals().usage,
        Some(Usage {
            prompt_tokens: 2069,
            completion_tokens: 15,
            cache_read_tokens: 2048,
            cache_write_tokens: 0
        })
    );
}

#[test]
fn tool_use_streams_as_tool_call_deltas_passed_on_one_by_one() {
    let out = run_split(
        &mut to_chat(true),
        fixture!("anthropic", "stream_tool_use.sse"),
        &[],
    );
    let all = chunks(&out);
    let tool_deltas: Vec<Value> = all
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter(|c| !c["delta"]["tool_calls"].is_null())
        .map(|c| c["delta"]["tool_calls"][0].clone())
        .collect();
    assert_eq!(
        tool_deltas,
        vec![
            json!({"index": 0, "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}),
            json!({"index": 0, "function": {"arguments": "{\"location\":"}}),
            json!({"index": 0, "function": {"arguments": " \"San Francisco, CA\""}}),
            json!({"index": 0, "function": {"arguments": ", \"unit\": \"celsius\"}"}}),
            json!({"index": 1, "id": "toolu_01KGWJt5dbrDqsPwqYfJnPxb", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}),
            json!({"index": 1, "function": {"arguments": "{\"location\": \"Paris, France\"}"}}),
        ]
    );
    let assembled = assemble_chat(&all);
    assert_eq!(assembled["finish_reason"], "tool_calls");
    assert_eq!(
        assembled["content"],
        "Okay, let's check the weather for San Francisco and Paris:"
    );
    assert_eq!(
        assembled["tool_calls"][0]["arguments"],
        json!({"location": "San Francisco, CA", "unit": "celsius"})
    );
}

#[test]
fn a_tool_call_is_content_from_its_start() {
    let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}}\n\n";
    let events = input_events(stream);
    let mut conv = to_chat(true);
    let mut out = BytesMut::new();
    conv.feed(events[0], &mut out).expect("start");
    assert!(!conv.signals().content);
    assert!(out.is_empty(), "the role chunk waits for the first delta");
    conv.feed(events[1], &mut out).expect("tool start");
    assert!(conv.signals().content, "the tool's name is content");
    // An answer that opens with a tool call: one chunk, role and `content: null` beside the
    // call, as OpenAI streams it (openai-node then assembles `content: null`).
    let all = chunks(&out);
    assert_eq!(all.len(), 1);
    assert_eq!(
        all[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
            "id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": ""}}]})
    );
}

#[test]
fn thinking_streams_as_reasoning_content_with_its_signature() {
    let mut conv = to_chat(true);
    let mut out = BytesMut::new();
    let events = input_events(fixture!("anthropic", "stream_thinking.sse"));
    conv.feed(events[0], &mut out).expect("message_start");
    conv.feed(events[1], &mut out)
        .expect("thinking block start");
    assert!(
        !conv.signals().content,
        "an empty thinking block is not content yet"
    );
    conv.feed(events[2], &mut out).expect("thinking delta");
    assert!(conv.signals().content, "a thinking delta is content");
    for ev in &events[3..] {
        conv.feed(ev, &mut out).expect("feed");
    }
    let assembled = assemble_chat(&chunks(&out));
    assert_eq!(
        assembled["reasoning"],
        "Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3"
    );
    assert_eq!(assembled["content"], "27 * 453 = 12,231");
    assert_eq!(
        assembled["thinking_blocks"],
        json!([
            {"type": "thinking", "thinking": "", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+Ap4+jOZzT0+HLfLjCJ+/wn9G+7j9LZN4hfNOWPQIJrAHtR6rvGd92tZp0fAiQiI5dSTLWx4xxsBFDq4eQE1YUuO0aJuvGwg=="},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"},
        ])
    );
    assert!(conv.signals().terminal);
}

#[test]
fn an_anthropic_error_event_is_a_chat_error_event_and_no_clean_end() {
    let mut conv = to_chat(true);
    let out = run_split(
        &mut conv,
        fixture!("anthropic", "stream_overloaded.sse"),
        &[],
    );
    let all = chunks(&out);
    // The role chunk is owed until the first delta: an error before any content is the
    // only chunk the caller sees.
    assert_eq!(all.len(), 1, "the error alone");
    assert_eq!(all[0]["error"]["code"], "server_is_overloaded");
    assert_eq!(all[0]["error"]["type"], "server_error");
    assert!(
        !String::from_utf8_lossy(&out).contains("Overloaded\""),
        "signalbox's words"
    );
    assert!(!out.ends_with(b"[DONE]\n\n"));
    let s = conv.signals();
    assert_eq!(s.error, Some(InbandError::Overloaded));
    assert!(!s.terminal && !s.content);
    for (kind, expected) in [
        ("rate_limit_error", InbandError::Overloaded),
        ("api_error", InbandError::Server),
        ("invalid_request_error", InbandError::InvalidRequest),
        ("something_new", InbandError::Server),
    ] {
        let mut conv = to_chat(true);
        let ev = format!("event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\",\"message\":\"x\"}}}}\n\n");
        conv.feed(ev.as_bytes(), &mut BytesMut::new())
            .expect("feed");
        assert_eq!(conv.signals().error, Some(expected), "{kind}");
    }
}

#[test]
fn each_anthropic_event_is_converted_as_soon_as_it_is_complete() {
    for input in ANTHROPIC_STREAMS {
        let mut conv = to_chat(true);
        let mut out = BytesMut::new();
        for ev in input_events(input) {
            let before = out.len();
            // All of the event but its last byte: nothing can be written yet.
            conv.feed(&ev[..ev.len() - 1], &mut out).expect("feed");
            assert_eq!(out.len(), before, "nothing before the event is complete");
            conv.feed(&ev[ev.len() - 1..], &mut out).expect("feed");
            let data = json(&ev[memchr::memmem::find(ev, b"data: ").expect("data") + 6..]);
            let block = &data["content_block"];
            // message_start is silent: its role chunk goes out with the first delta.
            let silent = ["ping", "content_block_stop", "message_start"]
                .contains(&data["type"].as_str().unwrap_or_default())
                || data["delta"]["partial_json"] == ""
                || (block["type"] == "text" && block["text"] == "")
                || (block["type"] == "thinking" && block["thinking"] == "");
            assert_eq!(
                out.len() > before,
                !silent,
                "{}",
                String::from_utf8_lossy(ev)
            );
        }
    }
}

// === chat → Anthropic ===

#[test]
fn a_chat_text_stream_becomes_anthropic_events() {
    let mut conv = to_messages();
    let out = run_split(&mut conv, fixture!("openai", "chat_stream_text.sse"), &[]);
    let events = sse_events(&out);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[0].1,
        json!({"type": "message_start", "message": {"id": "chatcmpl-C9KxT5G6WkZ0bNq2VgH1rM3pLdEo",
            "type": "message", "role": "assistant", "model": "smart", "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0}}})
    );
    assert_eq!(
        events[1].1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(
        events[3].1,
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "! Grüße aus Zürich 👋 — \"quoted\"\nnew line."}})
    );
    assert_eq!(
        events[5].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"input_tokens": 21, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2048, "output_tokens": 15}})
    );
    let s = conv.signals();
    assert!(s.content && s.terminal && !s.empty_choices && s.error.is_none());
    assert_eq!(
        s.usage,
        Some(Usage {
            prompt_tokens: 2069,
            completion_tokens: 15,
            cache_read_tokens: 2048,
            cache_write_tokens: 0
        })
    );
}

#[test]
fn signals_follow_the_chat_stream_event_by_event() {
    let mut conv = to_messages();
    let mut out = BytesMut::new();
    let events = input_events(fixture!("openai", "chat_stream_text.sse"));
    conv.feed(events[0], &mut out).expect("role chunk");
    assert!(!conv.signals().content, "a role-only chunk is not content");
    assert!(!out.is_empty(), "message_start goes out at once");
    conv.feed(events[1], &mut out).expect("first content");
    assert!(conv.signals().content);
    for ev in &events[2..events.len() - 1] {
        conv.feed(ev, &mut out).expect("feed");
        assert!(!conv.signals().terminal);
    }
    assert!(conv.signals().usage.is_some(), "from the usage chunk");
    assert!(
        !conv.signals().empty_choices,
        "the usage chunk's empty choices carry usage"
    );
    conv.feed(events[events.len() - 1], &mut out)
        .expect("[DONE]");
    assert!(conv.signals().terminal);
}

#[test]
fn chat_tool_calls_become_tool_use_blocks_with_their_ids() {
    let mut conv = to_messages();
    let out = run_split(
        &mut conv,
        fixture!("openai", "chat_stream_tool_calls.sse"),
        &[],
    );
    let events = sse_events(&out);
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(
        deltas,
        [
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"lo"}}),
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta",
                "partial_json": "cation\": \"San Francisco, CA\", \"unit\": \"celsius\"}"}}),
            &json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                "partial_json": "{\"location\": \"Paris, France\"}"}}),
        ]
    );
    let message = assemble_anthropic(&events);
    assert_eq!(
        message["content"],
        json!([
            {"type": "tool_use", "id": "call_Kd8fOgEVEd8cq3WJ0vUpBbcZ", "name": "get_weather",
             "input": {"location": "San Francisco, CA", "unit": "celsius"}},
            {"type": "tool_use", "id": "call_1bwdq4yO6OkXiFD5IDt1uXzl", "name": "get_weather",
             "input": {"location": "Paris, France"}},
        ])
    );
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(message["usage"]["input_tokens"], 82);
    assert_eq!(message["usage"]["output_tokens"], 51);
}

#[test]
fn a_chat_error_event_is_an_anthropic_error_event() {
    let mut conv = to_messages();
    let out = run_split(&mut conv, fixture!("openai", "chat_stream_error.sse"), &[]);
    let events = sse_events(&out);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["message_start", "ping", "error"],
        "the keep-alive is a ping"
    );
    assert_eq!(events[2].1["type"], "error");
    assert_eq!(events[2].1["error"]["type"], "api_error");
    assert!(
        !String::from_utf8_lossy(&out).contains("help.openai.com"),
        "signalbox's words"
    );
    let s = conv.signals();
    assert_eq!(s.error, Some(InbandError::Server));
    assert!(!s.terminal && !s.content);
}

#[test]
fn a_chunk_with_no_choices_and_no_usage_is_an_empty_answer() {
    let mut conv = to_messages();
    let mut out = BytesMut::new();
    conv.feed(
        b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[]}\n\n",
        &mut out,
    )
    .expect("feed");
    assert!(conv.signals().empty_choices);
    assert!(!conv.signals().content);
    // A chunk that says nothing about choices is not an empty answer.
    let mut conv = to_messages();
    conv.feed(
        b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\"}\n\n",
        &mut out,
    )
    .expect("feed");
    assert!(!conv.signals().empty_choices);
}

#[test]
fn nothing_follows_the_end_of_a_chat_stream() {
    let input = fixture!("openai", "chat_stream_text.sse");
    let whole = run_split(&mut to_messages(), input, &[]);
    let twice = [input, input].concat();
    assert_eq!(run_split(&mut to_messages(), &twice, &[]), whole);
}

#[test]
fn tool_calls_without_index_or_reusing_one_are_told_apart_by_id() {
    let stream = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":\"}}]}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n",
        "data: [DONE]\n\n",
    );
    let out = run_split(&mut to_messages(), stream.as_bytes(), &[]);
    let events = sse_events(&out);
    let message = assemble_anthropic(&events);
    assert_eq!(
        message["content"],
        json!([
            {"type": "tool_use", "id": "call_a", "name": "f", "input": {"x": 1}},
            {"type": "tool_use", "id": "call_b", "name": "g", "input": {}},
        ])
    );
    // Finish and usage in one chunk: message_delta at once, then message_stop.
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert_eq!(message["usage"]["output_tokens"], 4);
}

#[test]
fn unsigned_reasoning_is_a_sign_of_life_but_is_not_forwarded() {
    let stream = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"\"}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"reasoning_content\":\"Hmm\"}}]}\n\n",
    );
    let events = input_events(stream.as_bytes());
    let mut conv = to_messages();
    let mut out = BytesMut::new();
    conv.feed(events[0], &mut out).expect("feed");
    assert!(!conv.signals().content, "empty reasoning is nothing");
    conv.feed(events[1], &mut out).expect("feed");
    assert!(conv.signals().content);
    assert!(!String::from_utf8_lossy(&out).contains("Hmm"));
}

#[test]
fn a_chat_stream_that_stops_early_is_left_unterminated() {
    let input = fixture!("openai", "chat_stream_text.sse");
    let events = input_events(input);
    let mut conv = to_messages();
    let mut out = BytesMut::new();
    for ev in &events[..3] {
        conv.feed(ev, &mut out).expect("feed");
    }
    conv.finish(&mut out);
    assert!(!conv.signals().terminal);
    assert!(!String::from_utf8_lossy(&out).contains("message_stop"));
    // A last event without its blank line is still read.
    let mut conv = to_messages();
    let mut out = BytesMut::new();
    conv.feed(b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]", &mut out)
        .expect("feed");
    assert!(!conv.signals().terminal);
    conv.finish(&mut out);
    assert!(conv.signals().terminal);
}

// === both directions ===

#[test]
fn any_split_gives_the_same_output_as_the_whole() {
    let mut rng = Rng::new(0x5eed);
    fn check<C: Converter>(make: impl Fn() -> C, input: &[u8], rng: &mut Rng) {
        let whole = run_split(&mut make(), input, &[]);
        let bytes: Vec<usize> = (1..input.len()).collect();
        assert_eq!(
            run_split(&mut make(), input, &bytes),
            whole,
            "one byte at a time"
        );
        for _ in 0..50 {
            let cuts = rng.cuts(input.len());
            assert_eq!(run_split(&mut make(), input, &cuts), whole, "cuts {cuts:?}");
        }
    }
    for input in ANTHROPIC_STREAMS {
        check(|| to_chat(true), input, &mut rng);
        check(|| to_chat(false), input, &mut rng);
    }
    for input in CHAT_STREAMS {
        check(to_messages, input, &mut rng);
    }
    // CRLF line ends read the same.
    let crlf: Vec<u8> = String::from_utf8_lossy(fixture!("anthropic", "stream_text.sse"))
        .replace('\n', "\r\n")
        .into_bytes();
    assert_eq!(
        run_split(&mut to_chat(true), &crlf, &[]),
        run_split(
            &mut to_chat(true),
            fixture!("anthropic", "stream_text.sse"),
            &[]
        )
    );
}

#[test]
fn anthropic_to_chat_to_anthropic_keeps_the_answer() {
    for input in &ANTHROPIC_STREAMS[..3] {
        let original = assemble_anthropic(&sse_events(input));
        let chat = run_split(&mut to_chat(true), input, &[]);
        let mut back = to_messages();
        let out = run_split(&mut back, &chat, &[]);
        let again = assemble_anthropic(&sse_events(&out));
        assert!(back.signals().terminal);
        assert_eq!(again["id"], original["id"]);
        assert_eq!(again["stop_reason"], original["stop_reason"]);
        // Thinking does not come back: only signed blocks may reach Anthropic, and a stream's
        // signature arrives apart from its text.
        let visible: Vec<&Value> = original["content"]
            .as_array()
            .expect("content")
            .iter()
            .filter(|b| b["type"] == "text" || b["type"] == "tool_use")
            .collect();
        let again_blocks: Vec<&Value> = again["content"]
            .as_array()
            .expect("content")
            .iter()
            .collect();
        assert_eq!(again_blocks, visible, "{}", original["id"]);
        for k in ["input_tokens", "output_tokens", "cache_read_input_tokens"] {
            assert_eq!(
                again["usage"][k].as_u64().unwrap_or(0),
                original["usage"][k].as_u64().unwrap_or(0),
                "{k}"
            );
        }
    }
}

#[test]
fn chat_to_anthropic_to_chat_keeps_the_answer() {
    for input in &CHAT_STREAMS[..2] {
        let original = assemble_chat(&chunks(input));
        let messages = run_split(&mut to_messages(), input, &[]);
        let mut back = to_chat(true);
        let again = assemble_chat(&chunks(&run_split(&mut back, &messages, &[])));
        assert!(back.signals().terminal);
        for key in ["content", "tool_calls", "finish_reason"] {
            assert_eq!(again[key], original[key], "{key}");
        }
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(again["usage"][k], original["usage"][k], "{k}");
        }
        assert_eq!(
            again["usage"]["prompt_tokens_details"]["cached_tokens"],
            original["usage"]["prompt_tokens_details"]["cached_tokens"]
        );
    }
}

#[test]
fn garbage_never_panics() {
    let mut rng = Rng::new(42);
    fn feed_all<C: Converter>(mut conv: C, input: &[u8], rng: &mut Rng) {
        let mut out = BytesMut::new();
        let cuts = rng.cuts(input.len());
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            if conv.feed(&input[at..cut], &mut out).is_err() {
                return;
            }
            at = cut;
        }
        conv.finish(&mut out);
    }
    for _ in 0..300 {
        let len = rng.below(400);
        let noise: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        feed_all(to_chat(true), &noise, &mut rng);
        feed_all(to_messages(), &noise, &mut rng);
        // Noise shaped like events.
        let framed = [b"data: ".as_slice(), &noise, b"\n\n"].concat();
        feed_all(to_chat(true), &framed, &mut rng);
        feed_all(to_messages(), &framed, &mut rng);
    }
    // Real streams with bytes flipped: valid framing, broken or surprising JSON.
    for input in ANTHROPIC_STREAMS.iter().chain(CHAT_STREAMS.iter()) {
        for _ in 0..100 {
            let mut mutated = input.to_vec();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(mutated.len());
                mutated[i] = rng.next() as u8;
            }
            feed_all(to_chat(true), &mutated, &mut rng);
            feed_all(to_messages(), &mutated, &mut rng);
        }
    }
    // Events of the right type with members of the wrong shape or out of range.
    for ev in [
        "{\"type\":\"content_block_start\",\"index\":99999999999,\"content_block\":{\"type\":\"text\"}}",
        "{\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}",
        "{\"type\":\"message_start\"}",
        "{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-1}}",
        "{\"type\":7}",
        "[]",
    ] {
        let mut conv = to_chat(true);
        assert!(conv
            .feed(format!("data: {ev}\n\n").as_bytes(), &mut BytesMut::new())
            .is_err());
    }
    for ev in [
        "{\"choices\":{}}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}",
        "7",
        "nope",
    ] {
        let mut conv = to_messages();
        assert!(conv
            .feed(format!("data: {ev}\n\n").as_bytes(), &mut BytesMut::new())
            .is_err());
    }
}
