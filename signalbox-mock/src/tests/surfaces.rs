//! Every endpoint's answers, JSON and SSE, over a real loopback socket.

use serde_json::json;

use super::*;

/// Concatenate a field of the data of the events named `name`.
fn joined(events: &[(Option<String>, Value)], name: &str, field: &[&str]) -> String {
    events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some(name))
        .map(|(_, d)| {
            let mut v = d;
            for f in field {
                v = &v[*f];
            }
            v.as_str().unwrap().to_string()
        })
        .collect()
}

fn names(events: &[(Option<String>, Value)]) -> Vec<&str> {
    events
        .iter()
        .map(|(n, _)| n.as_deref().unwrap_or("-"))
        .collect()
}

/// Every named event's data carries its own name as `type`.
fn assert_types_match_names(events: &[(Option<String>, Value)]) {
    for (name, data) in events {
        assert_eq!(
            Some(data["type"].as_str().unwrap()),
            name.as_deref(),
            "{data}"
        );
    }
}

// === Anthropic Messages ===

#[tokio::test]
async fn messages_json_answer_and_what_is_recorded() {
    let h = start_default().await;
    let body = body_for(Endpoint::Messages, false, json!({"model": "claude-x"}));
    let req = post(
        "/v1/messages",
        &body,
        &format!("{ANTHROPIC}anthropic-beta: tools-2024-04-04\r\n"),
    );
    let resp = one_shot(&h, &req).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let v = resp.json();
    let prompt = (body.len() / 4) as u64;
    assert_eq!(
        v,
        json!({
            "id": "msg_mock_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [{"type": "text", "text": REPLY}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {
                "input_tokens": prompt,
                "output_tokens": 3,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
        })
    );
    assert_eq!(h.calls(), 1);
    assert_eq!(h.calls_to(Endpoint::Messages), 1);
    assert_eq!(h.calls_to(Endpoint::ChatCompletions), 0);
    let r = &h.requests()[0];
    assert_eq!(r.endpoint, Endpoint::Messages);
    assert_eq!(r.endpoint.dialect(), Dialect::Anthropic);
    assert_eq!(r.header("x-api-key"), Some("sk-ant-123"));
    assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(r.header("anthropic-beta"), Some("tools-2024-04-04"));
    assert_eq!(r.body, body.as_bytes());
    assert_eq!(r.body_sha256, hex::encode(Sha256::digest(body.as_bytes())));
    assert_eq!(r.json().unwrap()["max_tokens"], 64);
    assert_eq!(r.model.as_deref(), Some("claude-x"));
    assert!(!r.stream);
}

#[tokio::test]
async fn messages_stream_follows_anthropics_event_sequence() {
    let h = start(MockConfig {
        stream: StreamShape {
            chunks: 3,
            gap: Duration::from_millis(30),
        },
        ..MockConfig::default()
    })
    .await;
    let body = body_for(Endpoint::Messages, true, json!({}));
    let mut c = Client::connect(&h).await;
    let sent = Instant::now();
    c.send(&request_to(Endpoint::Messages, &body)).await;
    let (status, headers) = c.head().await;
    assert_eq!(status, 200);
    assert!(headers.contains(&("content-type".into(), "text/event-stream".into())));
    let mut arrivals = Vec::new();
    let mut raw = Vec::new();
    while let Some(chunk) = c.chunk().await {
        arrivals.push(sent.elapsed());
        raw.extend_from_slice(&chunk);
    }
    let events = named_events(&raw);
    assert_types_match_names(&events);
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let start = &events[0].1["message"];
    assert_eq!(start["id"], "msg_mock_1");
    assert_eq!(start["model"], "m");
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    assert_eq!(start["usage"]["input_tokens"], (body.len() / 4) as u64);
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        joined(&events, "content_block_delta", &["delta", "text"]),
        REPLY
    );
    assert!(events[3..6]
        .iter()
        .all(|(_, d)| d["index"] == 0 && d["delta"]["type"] == "text_delta"));
    assert_eq!(
        events[7].1["delta"],
        json!({"stop_reason": "end_turn", "stop_sequence": null})
    );
    assert_eq!(events[7].1["usage"]["output_tokens"], 3);
    // Gaps separate the content events: the stream is not one burst.
    assert!(*arrivals.last().unwrap() - arrivals[0] >= Duration::from_millis(80));
    // Keep-alive.
    let again = c.request(&call_to(Endpoint::Messages, false)).await;
    assert_eq!(again.json()["id"], "msg_mock_2");
}

#[tokio::test]
async fn messages_with_thinking_start_with_a_signed_thinking_block() {
    let h = start_default().await;
    let thinking = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
    let body = body_for(Endpoint::Messages, true, thinking.clone());
    let resp = one_shot(&h, &request_to(Endpoint::Messages, &body)).await;
    let events = named_events(&resp.body);
    assert_types_match_names(&events);
    let blocks: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, d)| d)
        .collect();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["index"], 0);
    assert_eq!(blocks[0]["content_block"]["type"], "thinking");
    assert_eq!(blocks[1]["index"], 1);
    assert_eq!(blocks[1]["content_block"]["type"], "text");
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| d)
        .collect();
    // 5 thinking deltas, the signature, then 5 text deltas.
    assert_eq!(deltas.len(), 11);
    assert!(deltas[..5]
        .iter()
        .all(|d| d["index"] == 0 && d["delta"]["type"] == "thinking_delta"));
    assert_eq!(deltas[5]["delta"]["type"], "signature_delta");
    assert!(!deltas[5]["delta"]["signature"].as_str().unwrap().is_empty());
    assert!(deltas[6..]
        .iter()
        .all(|d| d["index"] == 1 && d["delta"]["type"] == "text_delta"));
    let thought: String = deltas[..5]
        .iter()
        .map(|d| d["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert!(!thought.is_empty());
    // The first block stops before the second starts.
    let order = names(&events);
    let stop0 = order
        .iter()
        .position(|n| *n == "content_block_stop")
        .unwrap();
    let start1 = order
        .iter()
        .rposition(|n| *n == "content_block_start")
        .unwrap();
    assert!(stop0 < start1);
    assert_eq!(
        order.iter().filter(|n| **n == "content_block_stop").count(),
        2
    );

    // JSON: the same two blocks, whole.
    let body = body_for(Endpoint::Messages, false, thinking);
    let v = one_shot(&h, &request_to(Endpoint::Messages, &body))
        .await
        .json();
    assert_eq!(v["content"][0]["type"], "thinking");
    assert_eq!(v["content"][0]["thinking"], thought.as_str());
    assert_eq!(
        v["content"][0]["signature"],
        deltas[5]["delta"]["signature"]
    );
    assert_eq!(v["content"][1], json!({"type": "text", "text": REPLY}));
    // Disabled thinking is plain text.
    let body = body_for(
        Endpoint::Messages,
        false,
        json!({"thinking": {"type": "disabled"}}),
    );
    let v = one_shot(&h, &request_to(Endpoint::Messages, &body))
        .await
        .json();
    assert_eq!(v["content"].as_array().unwrap().len(), 1);
}

fn anthropic_tools() -> Value {
    json!({"tools": [
        {"name": "get_weather", "description": "w", "input_schema": {"type": "object"}},
        {"name": "search", "input_schema": {"type": "object"}},
    ]})
}

#[tokio::test]
async fn messages_with_tools_answer_a_tool_use_block() {
    let h = start_default().await;
    let body = body_for(Endpoint::Messages, true, anthropic_tools());
    let events = named_events(
        &one_shot(&h, &request_to(Endpoint::Messages, &body))
            .await
            .body,
    );
    assert_types_match_names(&events);
    let start = events
        .iter()
        .find(|(n, _)| n.as_deref() == Some("content_block_start"))
        .unwrap();
    assert_eq!(
        start.1["content_block"],
        json!({"type": "tool_use", "id": "toolu_mock_1", "name": "get_weather", "input": {}})
    );
    let pieces: Vec<&str> = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "input_json_delta");
            d["delta"]["partial_json"].as_str().unwrap()
        })
        .collect();
    assert_eq!(pieces.len(), 5, "several pieces");
    assert!(pieces.iter().all(|p| !p.is_empty()));
    let input: Value = serde_json::from_str(&pieces.concat()).unwrap();
    assert_eq!(input, json!({"query": "signalbox mock", "limit": 3}));
    let delta = events
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");

    // JSON; a named tool_choice picks the tool.
    let body = merged(
        serde_json::from_str(&body_for(Endpoint::Messages, false, anthropic_tools())).unwrap(),
        json!({"tool_choice": {"type": "tool", "name": "search"}}),
    );
    let v = one_shot(&h, &request_to(Endpoint::Messages, &body))
        .await
        .json();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"],
        json!([{"type": "tool_use", "id": "toolu_mock_2", "name": "search", "input": {"query": "signalbox mock", "limit": 3}}])
    );
    // tool_choice none, or a last turn that is a tool result: text.
    let none = merged(
        serde_json::from_str(&body).unwrap(),
        json!({"tool_choice": {"type": "none"}}),
    );
    let after_result = merged(
        serde_json::from_str(&body_for(Endpoint::Messages, false, anthropic_tools())).unwrap(),
        json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ]}),
    );
    for body in [none, after_result] {
        let v = one_shot(&h, &request_to(Endpoint::Messages, &body))
            .await
            .json();
        assert_eq!(v["stop_reason"], "end_turn", "{body}");
        assert_eq!(v["content"][0]["type"], "text");
    }
}

#[tokio::test]
async fn messages_require_a_key_and_a_version() {
    let h = start_default().await;
    let body = body_for(Endpoint::Messages, false, json!({}));
    h.push_script([Behaviour::Status {
        code: 529,
        retry_after: None,
        body: None,
    }]);
    let mut c = Client::connect(&h).await;
    for (headers, code, message) in [
        (
            "anthropic-version: 2023-06-01\r\n",
            401,
            "x-api-key header is required",
        ),
        (
            "x-api-key: \r\nanthropic-version: 2023-06-01\r\n",
            401,
            "x-api-key header is required",
        ),
        (
            "x-api-key: k\r\n",
            400,
            "anthropic-version: header is required",
        ),
    ] {
        let resp = c.request(&post("/v1/messages", &body, headers)).await;
        assert_eq!(resp.status, code, "{headers}");
        let kind = if code == 401 {
            "authentication_error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(
            resp.json(),
            json!({"type": "error", "error": {"type": kind, "message": message}})
        );
    }
    // Invalid JSON is an Anthropic-shaped 400 too.
    let resp = c.request(&post("/v1/messages", "{nope", ANTHROPIC)).await;
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json()["error"]["type"], "invalid_request_error");
    // All counted and recorded, none consumed the script.
    assert_eq!(h.calls_to(Endpoint::Messages), 4);
    let recs = h.requests();
    assert!(recs.iter().all(|r| matches!(
        r.behaviour,
        Behaviour::Status {
            code: 400 | 401,
            ..
        }
    )));
    assert_eq!(
        c.request(&post("/v1/messages", &body, ANTHROPIC))
            .await
            .status,
        529
    );

    // A configured key: exactly that key, in each dialect's header.
    let h = start(MockConfig {
        api_key: Some("sk-right".into()),
        ..MockConfig::default()
    })
    .await;
    let mut c = Client::connect(&h).await;
    let anthropic = |key: &str| format!("x-api-key: {key}\r\nanthropic-version: 2023-06-01\r\n");
    let resp = c
        .request(&post("/v1/messages", &body, &anthropic("sk-wrong")))
        .await;
    assert_eq!(resp.status, 401);
    assert_eq!(resp.json()["error"]["type"], "authentication_error");
    let resp = c
        .request(&post("/v1/messages", &body, &anthropic("sk-right")))
        .await;
    assert_eq!(resp.status, 200);
    // `post` sends `Authorization: Bearer sk-secret-123`.
    let chat = chat_body("m", false);
    let resp = c.request(&post("/v1/chat/completions", &chat, "")).await;
    assert_eq!(resp.status, 401);
    assert_eq!(resp.json()["error"]["code"], "invalid_api_key");
    let resp = c
        .request(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-right\r\n\
                 Content-Length: {}\r\n\r\n{chat}",
                chat.len()
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(h.calls(), 4);
}

#[tokio::test]
async fn status_answers_in_the_dialect_of_the_endpoint() {
    let h = start_default().await;
    let mut c = Client::connect(&h).await;
    let status = |code| Behaviour::Status {
        code,
        retry_after: Some("3".into()),
        body: None,
    };
    for (code, kind) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "api_error"),
        (529, "overloaded_error"),
    ] {
        h.push_script([status(code)]);
        let resp = c.request(&call_to(Endpoint::Messages, true)).await;
        assert_eq!(resp.status, code);
        assert_eq!(resp.header("retry-after"), Some("3"));
        assert_eq!(resp.header("content-type"), Some("application/json"));
        let v = resp.json();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], kind, "{code}");
        // The default body echoes the credential the call carried, as the OpenAI one does.
        assert_eq!(
            v["error"]["message"],
            "mock failure; Incorrect API key provided: sk-ant-123 at mock.test"
        );
    }
    // OpenAI endpoints keep the OpenAI shape.
    for endpoint in [
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
    ] {
        h.push_script([status(503)]);
        let v = c.request(&call_to(endpoint, false)).await.json();
        assert_eq!(v["error"]["code"], "mock_503", "{endpoint:?}");
        assert_eq!(
            v["error"]["message"],
            "mock failure; Incorrect API key provided: Bearer sk-secret-123 at mock.test"
        );
    }
    h.push_script([status(529)]);
    assert_eq!(
        c.request(&call_to(Endpoint::CountTokens, false))
            .await
            .json()["error"]["type"],
        "overloaded_error"
    );
    // Unknown paths and methods speak Anthropic to a request that does.
    let resp = c
        .request(format!("GET /v1/messages HTTP/1.1\r\nHost: t\r\n{ANTHROPIC}\r\n").as_bytes())
        .await;
    assert_eq!(resp.status, 405);
    assert_eq!(resp.json()["type"], "error");
    let resp = c
        .request(&post("/v1/messages/batches", "{}", ANTHROPIC))
        .await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.json()["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn count_tokens_and_the_anthropic_model_list() {
    let h = start_default().await;
    let body = body_for(Endpoint::CountTokens, false, json!({}));
    let resp = one_shot(&h, &request_to(Endpoint::CountTokens, &body)).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json(), json!({"input_tokens": body.len() / 4}));
    // Never streamed.
    let body = body_for(Endpoint::CountTokens, false, json!({"stream": true}));
    let resp = one_shot(&h, &request_to(Endpoint::CountTokens, &body)).await;
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(h.calls_to(Endpoint::CountTokens), 2);
    assert_eq!(h.calls_to(Endpoint::Messages), 0);
    assert_eq!(h.requests()[0].endpoint, Endpoint::CountTokens);

    let v = one_shot(
        &h,
        format!("GET /v1/models HTTP/1.1\r\nHost: t\r\n{ANTHROPIC}\r\n").as_bytes(),
    )
    .await
    .json();
    assert_eq!(v["data"][0]["type"], "model");
    assert_eq!(v["data"][0]["id"], "mock-model");
    assert_eq!(v["has_more"], false);
    assert_eq!(h.model_list_calls(), 1);
    assert_eq!(h.calls(), 2);
}

// === OpenAI surfaces ===

#[tokio::test]
async fn chat_with_tools_answers_tool_calls() {
    let h = start_default().await;
    let tools = json!({"tools": [
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "other"}},
    ]});
    let body = body_for(Endpoint::ChatCompletions, false, tools.clone());
    let v = one_shot(&h, &request_to(Endpoint::ChatCompletions, &body))
        .await
        .json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_null());
    assert_eq!(
        choice["message"]["tool_calls"],
        json!([{"id": "call_mock_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"query\":\"signalbox mock\",\"limit\":3}"}}])
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    // SSE: a chunk naming the function, the arguments over `chunks` chunks, finish
    // `tool_calls`.
    let body = body_for(Endpoint::ChatCompletions, true, tools.clone());
    let resp = one_shot(&h, &request_to(Endpoint::ChatCompletions, &body)).await;
    let (events, done) = sse_events(&resp.body);
    assert!(done);
    assert_eq!(events.len(), 1 + 5 + 1);
    let first = &events[0]["choices"][0]["delta"];
    assert_eq!(first["role"], "assistant");
    assert_eq!(first["tool_calls"][0]["id"], "call_mock_2");
    assert_eq!(first["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(first["tool_calls"][0]["function"]["arguments"], "");
    let args: String = events[1..6]
        .iter()
        .map(|e| {
            let call = &e["choices"][0]["delta"]["tool_calls"][0];
            assert_eq!(call["index"], 0);
            call["function"]["arguments"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(args, r#"{"query":"signalbox mock","limit":3}"#);
    assert_eq!(events[6]["choices"][0]["finish_reason"], "tool_calls");
    assert!(events.iter().all(|e| e["model"] == "m"));

    // A named tool_choice, tool_choice "none", a last `tool` message.
    let named = merged(
        serde_json::from_str(&body_for(Endpoint::ChatCompletions, false, tools.clone())).unwrap(),
        json!({"tool_choice": {"type": "function", "function": {"name": "other"}}}),
    );
    let v = one_shot(&h, &request_to(Endpoint::ChatCompletions, &named))
        .await
        .json();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "other"
    );
    let none = merged(
        serde_json::from_str(&named).unwrap(),
        json!({"tool_choice": "none"}),
    );
    let answered = merged(
        serde_json::from_str(&body_for(Endpoint::ChatCompletions, false, tools)).unwrap(),
        json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"},
        ]}),
    );
    for body in [none, answered] {
        let v = one_shot(&h, &request_to(Endpoint::ChatCompletions, &body))
            .await
            .json();
        assert_eq!(v["choices"][0]["message"]["content"], REPLY, "{body}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

#[tokio::test]
async fn chat_include_usage_ends_with_a_usage_chunk() {
    let h = start_default().await;
    let body = body_for(
        Endpoint::ChatCompletions,
        true,
        json!({"stream_options": {"include_usage": true}}),
    );
    let resp = one_shot(&h, &request_to(Endpoint::ChatCompletions, &body)).await;
    let (events, done) = sse_events(&resp.body);
    assert!(done);
    // The role-only chunk, 5 content chunks, the finish chunk (without usage), the usage
    // chunk.
    assert_eq!(events.len(), 8);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[6]["choices"][0]["finish_reason"], "stop");
    assert!(events[6].get("usage").is_none());
    assert_eq!(events[7]["choices"], json!([]));
    assert_eq!(events[7]["usage"]["completion_tokens"], 3);
    assert_eq!(events[7]["usage"]["prompt_tokens"], (body.len() / 4) as u64);
    // include_usage false: as without stream_options (usage on the finish chunk).
    let body = body_for(
        Endpoint::ChatCompletions,
        true,
        json!({"stream_options": {"include_usage": false}}),
    );
    let (events, _) = sse_events(
        &one_shot(&h, &request_to(Endpoint::ChatCompletions, &body))
            .await
            .body,
    );
    assert_eq!(events.len(), 7);
    assert_eq!(events[6]["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn legacy_completions_json_and_sse() {
    let h = start_default().await;
    let body = body_for(Endpoint::Completions, false, json!({"model": "davinci"}));
    let v = one_shot(&h, &request_to(Endpoint::Completions, &body))
        .await
        .json();
    assert_eq!(v["id"], "cmpl-mock-1");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "davinci");
    assert_eq!(v["choices"][0]["text"], REPLY);
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], (body.len() / 4) as u64 + 3);

    let body = body_for(
        Endpoint::Completions,
        true,
        json!({"stream_options": {"include_usage": true}}),
    );
    let resp = one_shot(&h, &request_to(Endpoint::Completions, &body)).await;
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let (events, done) = sse_events(&resp.body);
    assert!(done);
    assert_eq!(events.len(), 5 + 2);
    let text: String = events[..5]
        .iter()
        .map(|e| {
            assert_eq!(e["object"], "text_completion");
            assert!(e["choices"][0]["finish_reason"].is_null());
            e["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, REPLY);
    assert_eq!(events[5]["choices"][0]["finish_reason"], "stop");
    assert_eq!(events[6]["choices"], json!([]));
    assert_eq!(events[6]["usage"]["completion_tokens"], 3);
    assert_eq!(h.calls_to(Endpoint::Completions), 2);
    assert_eq!(h.calls_to(Endpoint::ChatCompletions), 0);
}

#[tokio::test]
async fn moderations_flag_the_marker_and_configured_words_per_input() {
    let h = start(MockConfig {
        flag_words: vec!["Forbidden".to_string()],
        ..MockConfig::default()
    })
    .await;
    let mut c = Client::connect(&h).await;
    for (input, flagged) in [
        (json!("a harmless question"), vec![false]),
        (json!("this is MOCK-FLAGGED text"), vec![true]),
        (json!(["fine", "a forbidden word"]), vec![false, true]),
    ] {
        let body = body_for(
            Endpoint::Moderations,
            false,
            json!({"input": input, "model": "omni-moderation-latest"}),
        );
        let v = c
            .request(&request_to(Endpoint::Moderations, &body))
            .await
            .json();
        assert_eq!(v["model"], "omni-moderation-latest");
        assert!(v["id"].as_str().unwrap().starts_with("modr_mock_"));
        let results = v["results"].as_array().unwrap();
        let got: Vec<bool> = results.iter().map(|r| r["flagged"] == true).collect();
        assert_eq!(got, flagged, "{input}");
        for r in results {
            let f = r["flagged"] == true;
            assert_eq!(r["categories"]["harassment"], f);
            assert_eq!(r["categories"]["hate"], false);
            assert!(r["category_scores"]["violence"].is_number());
        }
    }
    assert_eq!(h.calls_to(Endpoint::Moderations), 3);
}

#[tokio::test]
async fn embeddings_one_vector_per_input() {
    let h = start_default().await;
    let mut c = Client::connect(&h).await;
    for (input, count) in [
        (json!("one"), 1),
        (json!(["a", "b", "c"]), 3),
        (json!([1, 2, 3]), 1),
        (json!([[1, 2], [3]]), 2),
        (json!([]), 0),
    ] {
        let body = body_for(
            Endpoint::Embeddings,
            false,
            json!({"input": input, "model": "emb"}),
        );
        let v = c
            .request(&request_to(Endpoint::Embeddings, &body))
            .await
            .json();
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "emb");
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), count, "{input}");
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            assert_eq!(d["embedding"].as_array().unwrap().len(), 256);
        }
        let prompt = (body.len() / 4) as u64;
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": prompt, "total_tokens": prompt})
        );
    }
    // Vectors differ per input and are the same every time.
    let body = body_for(Endpoint::Embeddings, false, json!({"input": ["a", "b"]}));
    let a = c
        .request(&request_to(Endpoint::Embeddings, &body))
        .await
        .json();
    let b = c
        .request(&request_to(Endpoint::Embeddings, &body))
        .await
        .json();
    assert_eq!(a["data"], b["data"]);
    assert_ne!(a["data"][0]["embedding"], a["data"][1]["embedding"]);
    assert_eq!(h.calls_to(Endpoint::Embeddings), 7);
}

#[tokio::test]
async fn embeddings_carry_meaning_prompts_sharing_words_are_near() {
    let h = start_default().await;
    let mut c = Client::connect(&h).await;
    let body = body_for(
        Endpoint::Embeddings,
        false,
        json!({"input": [
            "Fix the Rust borrow checker error in this function",
            "why does the borrow checker reject this Rust function",
            "what a lovely sunny day for a picnic",
        ], "dimensions": 64}),
    );
    let v = c
        .request(&request_to(Endpoint::Embeddings, &body))
        .await
        .json();
    let vec_of = |i: usize| -> Vec<f64> {
        v["data"][i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let (a, b, far) = (vec_of(0), vec_of(1), vec_of(2));
    assert_eq!(a.len(), 64, "the request's dimensions");
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>();
    assert!((dot(&a, &a) - 1.0).abs() < 1e-9, "unit length");
    assert!(dot(&a, &b) > 0.4, "shared words: near ({})", dot(&a, &b));
    assert!(
        dot(&a, &far).abs() < dot(&a, &b) / 2.0,
        "no shared words: far"
    );
}

#[tokio::test]
async fn responses_json_and_sse() {
    let h = start_default().await;
    let body = body_for(Endpoint::Responses, false, json!({}));
    let v = one_shot(&h, &request_to(Endpoint::Responses, &body))
        .await
        .json();
    assert_eq!(v["id"], "resp_mock_1");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "m");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(
        v["output"][0]["content"],
        json!([{"type": "output_text", "text": REPLY, "annotations": []}])
    );
    let input = (body.len() / 4) as u64;
    assert_eq!(
        v["usage"],
        json!({"input_tokens": input, "output_tokens": 3, "total_tokens": input + 3})
    );

    let body = body_for(Endpoint::Responses, true, json!({}));
    let resp = one_shot(&h, &request_to(Endpoint::Responses, &body)).await;
    let events = named_events(&resp.body);
    assert_types_match_names(&events);
    assert_eq!(
        names(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (_, d)) in events.iter().enumerate() {
        assert_eq!(d["sequence_number"], i);
    }
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(
        joined(&events, "response.output_text.delta", &["delta"]),
        REPLY
    );
    assert_eq!(events[9].1["text"], REPLY);
    let done = &events[12].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], REPLY);
    assert_eq!(done["usage"]["output_tokens"], 3);
    assert!(!resp.body.windows(6).any(|w| w == b"[DONE]"));
}

#[tokio::test]
async fn responses_with_tools_answer_a_function_call() {
    let h = start_default().await;
    let tools = json!({"tools": [
        {"type": "web_search"},
        {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
    ]});
    let body = body_for(Endpoint::Responses, true, tools.clone());
    let events = named_events(
        &one_shot(&h, &request_to(Endpoint::Responses, &body))
            .await
            .body,
    );
    assert_types_match_names(&events);
    let added = &events[2].1;
    assert_eq!(added["type"], "response.output_item.added");
    assert_eq!(added["item"]["type"], "function_call");
    assert_eq!(added["item"]["name"], "lookup");
    assert_eq!(added["item"]["call_id"], "call_mock_1");
    assert_eq!(added["item"]["arguments"], "");
    let args = joined(
        &events,
        "response.function_call_arguments.delta",
        &["delta"],
    );
    assert_eq!(args, r#"{"query":"signalbox mock","limit":3}"#);
    let n = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("response.function_call_arguments.delta"))
        .count();
    assert_eq!(n, 5);
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["arguments"], args.as_str());
    assert_eq!(done["output"][0]["status"], "completed");

    // JSON; a function_call_output as the last input item answers text.
    let body = body_for(Endpoint::Responses, false, tools.clone());
    let v = one_shot(&h, &request_to(Endpoint::Responses, &body))
        .await
        .json();
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(v["output"][0]["id"], "fc_mock_2");
    let body = merged(
        serde_json::from_str(&body_for(Endpoint::Responses, false, tools)).unwrap(),
        json!({"input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
        ]}),
    );
    let v = one_shot(&h, &request_to(Endpoint::Responses, &body))
        .await
        .json();
    assert_eq!(v["output"][0]["type"], "message");
}

#[tokio::test]
async fn echo_model_applies_to_every_surface() {
    let h = start(MockConfig {
        echo_model: Some("dated-2025".into()),
        ..MockConfig::default()
    })
    .await;
    let mut c = Client::connect(&h).await;
    for endpoint in [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Messages,
    ] {
        let v = c.request(&call_to(endpoint, false)).await.json();
        assert_eq!(v["model"], "dated-2025", "{endpoint:?}");
    }
    let resp = c.request(&call_to(Endpoint::Messages, true)).await;
    assert_eq!(
        named_events(&resp.body)[0].1["message"]["model"],
        "dated-2025"
    );
}

#[tokio::test]
async fn scripts_scoped_to_an_endpoint_and_counts_per_endpoint() {
    let h = start_default().await;
    let status = |code| Behaviour::Status {
        code,
        retry_after: None,
        body: None,
    };
    h.push_script_for(Endpoint::Messages, [status(529)]);
    h.push_script([status(500)]);
    let mut c = Client::connect(&h).await;
    // The chat call skips the Messages entry and takes the unscoped one.
    assert_eq!(
        c.request(&call_to(Endpoint::ChatCompletions, false))
            .await
            .status,
        500
    );
    assert_eq!(
        c.request(&call_to(Endpoint::ChatCompletions, false))
            .await
            .status,
        200
    );
    assert_eq!(
        c.request(&call_to(Endpoint::Messages, false)).await.status,
        529
    );
    assert_eq!(
        c.request(&call_to(Endpoint::Messages, false)).await.status,
        200
    );
    // Over HTTP: ?endpoint=.
    let resp = c
        .request(&post(
            "/_mock/script?endpoint=count_tokens",
            r#"[{"kind":"status","code":429}]"#,
            "",
        ))
        .await;
    assert_eq!(resp.status, 200);
    let resp = c
        .request(&post(
            "/_mock/script?endpoint=nope",
            r#"[{"kind":"ok"}]"#,
            "",
        ))
        .await;
    assert_eq!(resp.status, 400);
    assert_eq!(
        c.request(&call_to(Endpoint::Messages, false)).await.status,
        200
    );
    assert_eq!(
        c.request(&call_to(Endpoint::CountTokens, false))
            .await
            .status,
        429
    );
    let stats = c.request(&get("/_mock/stats")).await.json();
    assert_eq!(stats["calls"], 6);
    assert_eq!(
        stats["calls_by_endpoint"],
        json!({"chat_completions": 2, "completions": 0, "embeddings": 0, "responses": 0, "messages": 3, "count_tokens": 1, "moderations": 0})
    );
    assert_eq!(stats["requests"][2]["endpoint"], "messages");
    assert!(stats["requests"][2].get("body").is_none());
    assert_eq!(h.calls_to(Endpoint::Messages), 3);
    h.reset();
    assert_eq!(h.calls_to(Endpoint::Messages), 0);
}

#[tokio::test]
async fn large_bodies_are_recorded_up_to_the_cap() {
    let h = start_default().await;
    let pad = "x".repeat(RECORDED_BODY_MAX);
    let body = body_for(Endpoint::Messages, false, json!({"pad": pad}));
    let resp = one_shot(&h, &request_to(Endpoint::Messages, &body)).await;
    assert_eq!(resp.status, 200);
    let r = &h.requests()[0];
    assert_eq!(r.body_len, body.len());
    assert_eq!(r.body.len(), RECORDED_BODY_MAX);
    assert_eq!(r.body, body.as_bytes()[..RECORDED_BODY_MAX]);
    assert!(r.json().is_none(), "a cut body is not parsed");
    assert_eq!(r.body_sha256, hex::encode(Sha256::digest(body.as_bytes())));
}

#[tokio::test]
async fn events_lead_with_their_type() {
    let h = start_default().await;
    for endpoint in [Endpoint::Messages, Endpoint::Responses] {
        let resp = one_shot(&h, &call_to(endpoint, true)).await;
        let text = String::from_utf8(resp.body).unwrap();
        for line in text.lines().filter(|l| l.starts_with("data: ")) {
            assert!(line.starts_with("data: {\"type\":"), "{line}");
        }
    }
    let body = one_shot(&h, &call_to(Endpoint::Messages, false)).await.body;
    assert!(body.starts_with(b"{\"type\":\"message\""));
}
