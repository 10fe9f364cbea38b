//! The misbehaviours, in every dialect, over a real loopback socket: what a gateway sees.

use serde_json::json;

use super::*;

/// Three content events per stream, none of them empty.
async fn start_shaped() -> MockHandle {
    start(MockConfig {
        reply: "one two three four five six".into(),
        stream: StreamShape {
            chunks: 3,
            gap: Duration::ZERO,
        },
        ..MockConfig::default()
    })
    .await
}

/// Send `raw` and read every chunk of the answer with its arrival time since the send.
async fn timed(c: &mut Client<TcpStream>, raw: &[u8]) -> (Duration, Vec<(Duration, Vec<u8>)>) {
    let sent = Instant::now();
    c.send(raw).await;
    let (status, _) = c.head().await;
    assert_eq!(status, 200);
    let head_at = sent.elapsed();
    let mut chunks = Vec::new();
    while let Some(chunk) = c.chunk().await {
        chunks.push((sent.elapsed(), chunk));
    }
    (head_at, chunks)
}

/// The arrival times of the content events.
fn content_times(endpoint: Endpoint, chunks: &[(Duration, Vec<u8>)]) -> Vec<Duration> {
    chunks
        .iter()
        .filter(|(_, c)| kinds(endpoint, c) == [Kind::Content])
        .map(|(t, _)| *t)
        .collect()
}

fn all_data(chunks: &[(Duration, Vec<u8>)]) -> Vec<u8> {
    chunks.iter().flat_map(|(_, c)| c.clone()).collect()
}

#[tokio::test]
async fn normal_streams_have_the_same_shape_in_every_dialect() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        let resp = c.request(&call_to(endpoint, true)).await;
        assert_eq!(
            kinds(endpoint, &resp.body),
            [Kind::Content, Kind::Content, Kind::Content, Kind::Terminal],
            "{endpoint:?}"
        );
    }
}

#[tokio::test]
async fn ok_then_eof_closes_after_the_header() {
    let h = start_shaped().await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::OkThenEof]);
        let mut c = Client::connect(&h).await;
        c.send(&call_to(endpoint, true)).await;
        let (status, headers) = c.head().await;
        assert_eq!(status, 200);
        assert!(headers.contains(&("content-type".into(), "text/event-stream".into())));
        assert!(headers.contains(&("transfer-encoding".into(), "chunked".into())));
        let (rest, err) = c.read_to_end().await;
        assert!(
            rest.is_empty(),
            "{endpoint:?}: no event, no terminal chunk: {rest:?}"
        );
        assert_eq!(err, None, "{endpoint:?}: a clean FIN");
    }
    // Non-stream: a content-length the body never fills.
    for endpoint in Endpoint::ALL {
        h.push_script([Behaviour::OkThenEof]);
        let mut c = Client::connect(&h).await;
        c.send(&call_to(endpoint, false)).await;
        let (status, headers) = c.head().await;
        assert_eq!(status, 200);
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .unwrap()
            .1
            .parse()
            .unwrap();
        assert!(len > 0);
        assert_eq!(c.read_to_end().await, (Vec::new(), None), "{endpoint:?}");
    }
    // The streaming endpoints once, every endpoint once more (non-stream).
    assert_eq!(h.calls(), 4 + Endpoint::ALL.len() as u64);
}

#[tokio::test]
async fn empty_stream_is_the_terminal_chunk_alone_in_every_dialect() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::EmptyStream]);
        let resp = c.request(&call_to(endpoint, true)).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("content-type"), Some("text/event-stream"));
        assert!(resp.body.is_empty(), "{endpoint:?}");
    }
    // The connection is still good.
    assert_eq!(
        c.request(&call_to(Endpoint::Messages, false)).await.status,
        200
    );
}

#[tokio::test]
async fn inband_error_first_in_every_dialect() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        for after_start in [false, true] {
            h.push_script([Behaviour::InbandErrorFirst {
                error_type: None,
                after_start,
            }]);
            let resp = c.request(&call_to(endpoint, true)).await;
            assert_eq!(resp.status, 200);
            let events = named_events(&resp.body);
            assert_eq!(
                kinds(endpoint, &resp.body),
                [Kind::Error],
                "{endpoint:?} {after_start}"
            );
            let (name, error) = events.last().unwrap();
            match endpoint {
                Endpoint::Messages => {
                    assert_eq!(name.as_deref(), Some("error"));
                    assert_eq!(error["type"], "error");
                    assert_eq!(error["error"]["type"], "overloaded_error");
                    assert!(error["error"]["message"].is_string());
                }
                Endpoint::Responses => {
                    assert_eq!(name.as_deref(), Some("error"));
                    assert_eq!(error["type"], "error");
                    assert_eq!(error["code"], "server_error");
                    assert!(error["message"].is_string());
                }
                _ => {
                    assert_eq!(name, &None);
                    assert_eq!(error["error"]["type"], "server_error");
                    assert_eq!(error["error"]["code"], "server_error");
                    assert!(error["error"]["message"].is_string());
                }
            }
            if !after_start {
                assert_eq!(events.len(), 1, "{endpoint:?}: the error alone");
                continue;
            }
            let (name, opening) = &events[0];
            match endpoint {
                Endpoint::Messages => assert_eq!(name.as_deref(), Some("message_start")),
                Endpoint::Responses => assert_eq!(name.as_deref(), Some("response.created")),
                Endpoint::ChatCompletions => {
                    assert_eq!(
                        opening["choices"][0]["delta"],
                        json!({"role": "assistant", "content": ""})
                    );
                }
                _ => assert_eq!(opening["choices"][0]["text"], ""),
            }
        }
    }
    // A chosen type.
    h.push_script([Behaviour::InbandErrorFirst {
        error_type: Some("rate_limit_error".into()),
        after_start: false,
    }]);
    let resp = c.request(&call_to(Endpoint::Messages, true)).await;
    assert_eq!(
        named_events(&resp.body)[0].1["error"]["type"],
        "rate_limit_error"
    );
    // Non-stream: a 200 whose body is the error, in the dialect's shape.
    for endpoint in Endpoint::ALL {
        h.push_script([Behaviour::InbandErrorFirst {
            error_type: None,
            after_start: true,
        }]);
        let resp = c.request(&call_to(endpoint, false)).await;
        assert_eq!(resp.status, 200);
        let v = resp.json();
        match endpoint.dialect() {
            Dialect::Anthropic => assert_eq!(
                v,
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "mock in-band error"}})
            ),
            Dialect::OpenAi => assert_eq!(v["error"]["type"], "server_error", "{endpoint:?}"),
        }
    }
}

#[tokio::test]
async fn inband_error_after_content_in_every_dialect() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::InbandErrorAfter {
            chunks: 2,
            error_type: Some("overloaded_error".into()),
        }]);
        let resp = c.request(&call_to(endpoint, true)).await;
        assert_eq!(
            kinds(endpoint, &resp.body),
            [Kind::Content, Kind::Content, Kind::Error],
            "{endpoint:?}"
        );
        let events = named_events(&resp.body);
        let error = &events.last().unwrap().1;
        let kind = match endpoint {
            Endpoint::Messages => &error["error"]["type"],
            Endpoint::Responses => &error["code"],
            _ => &error["error"]["type"],
        };
        assert_eq!(kind, "overloaded_error", "{endpoint:?}");
    }
    // Anthropic: the error comes inside the open block, before any stop.
    h.push_script([Behaviour::InbandErrorAfter {
        chunks: 1,
        error_type: None,
    }]);
    let resp = c.request(&call_to(Endpoint::Messages, true)).await;
    let names: Vec<_> = named_events(&resp.body)
        .into_iter()
        .map(|(n, _)| n.unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "error"
        ]
    );
}

#[tokio::test]
async fn stall_before_first_sends_the_header_then_waits() {
    let h = start_shaped().await;
    let stall = Duration::from_millis(250);
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::StallBeforeFirst { ms: 250 }]);
        let (head_at, chunks) = timed(&mut c, &call_to(endpoint, true)).await;
        assert!(
            head_at < Duration::from_millis(150),
            "{endpoint:?} {head_at:?}"
        );
        let first = chunks.first().unwrap().0;
        assert!(first >= stall, "{endpoint:?}: first event after {first:?}");
        assert_eq!(
            kinds(endpoint, &all_data(&chunks)),
            [Kind::Content, Kind::Content, Kind::Content, Kind::Terminal],
            "{endpoint:?}: then the whole stream"
        );
    }
    // Non-stream: the header at once, the body later.
    h.push_script([Behaviour::StallBeforeFirst { ms: 250 }]);
    let sent = Instant::now();
    c.send(&call_to(Endpoint::Messages, false)).await;
    let (status, _) = c.head().await;
    assert_eq!(status, 200);
    assert!(sent.elapsed() < Duration::from_millis(150));
    c.buf.clear();
    let resp_len = {
        c.fill_or_panic().await;
        sent.elapsed()
    };
    assert!(resp_len >= stall, "{resp_len:?}");
}

#[tokio::test]
async fn stall_mid_stream_goes_quiet_after_k_content_events() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::StallMidStream {
            after_chunks: 1,
            ms: 250,
        }]);
        let (_, chunks) = timed(&mut c, &call_to(endpoint, true)).await;
        let times = content_times(endpoint, &chunks);
        assert_eq!(times.len(), 3, "{endpoint:?}");
        assert!(
            times[0] < Duration::from_millis(150),
            "{endpoint:?} {times:?}"
        );
        assert!(
            times[1] - times[0] >= Duration::from_millis(250),
            "{endpoint:?} {times:?}"
        );
        assert!(times[2] - times[1] < Duration::from_millis(150));
        assert_eq!(
            kinds(endpoint, &all_data(&chunks)).last(),
            Some(&Kind::Terminal)
        );
    }
    // Past the last content event: the stall comes before the finish.
    h.push_script([Behaviour::StallMidStream {
        after_chunks: 3,
        ms: 250,
    }]);
    let (_, chunks) = timed(&mut c, &call_to(Endpoint::Messages, true)).await;
    let last_content = *content_times(Endpoint::Messages, &chunks).last().unwrap();
    assert!(chunks.last().unwrap().0 - last_content >= Duration::from_millis(250));
    // Non-stream: half the body, then the rest.
    h.push_script([Behaviour::StallMidStream {
        after_chunks: 1,
        ms: 250,
    }]);
    let sent = Instant::now();
    let resp = c.request(&call_to(Endpoint::ChatCompletions, false)).await;
    assert!(sent.elapsed() >= Duration::from_millis(250));
    assert_eq!(
        resp.json()["choices"][0]["message"]["content"],
        "one two three four five six"
    );
}

#[tokio::test]
async fn no_terminal_ends_the_framing_without_the_streams_end() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::NoTerminal { chunks: 2 }]);
        let resp = c.request(&call_to(endpoint, true)).await;
        assert_eq!(resp.status, 200);
        assert_eq!(
            kinds(endpoint, &resp.body),
            [Kind::Content, Kind::Content],
            "{endpoint:?}"
        );
        let events = named_events(&resp.body);
        for (name, data) in &events {
            assert!(
                !matches!(
                    name.as_deref(),
                    Some(
                        "content_block_stop"
                            | "message_delta"
                            | "response.output_text.done"
                            | "response.output_item.done"
                    )
                ),
                "{endpoint:?}: {name:?}"
            );
            if endpoint.dialect() == Dialect::OpenAi && endpoint != Endpoint::Responses {
                assert!(data["choices"][0]["finish_reason"].is_null());
                assert!(data.get("usage").is_none());
            }
        }
    }
    // Non-stream: well framed, half a JSON body; the connection goes on.
    h.push_script([Behaviour::NoTerminal { chunks: 2 }]);
    let resp = c.request(&call_to(Endpoint::Messages, false)).await;
    assert_eq!(resp.status, 200);
    assert!(!resp.body.is_empty());
    assert!(serde_json::from_slice::<Value>(&resp.body).is_err());
    let full = c.request(&call_to(Endpoint::Messages, false)).await;
    // The same answer (but for its id, msg_mock_5 vs msg_mock_6), cut in half.
    assert_eq!(resp.body.len(), full.body.len() / 2);
    let id_at = full
        .body
        .windows(9)
        .position(|w| w == b"msg_mock_")
        .unwrap();
    assert_eq!(full.body[..id_at], resp.body[..id_at]);
}

#[tokio::test]
async fn mid_stream_death_in_every_dialect() {
    let h = start_shaped().await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::MidStreamDeath { after_chunks: 2 }]);
        let mut c = Client::connect(&h).await;
        c.send(&call_to(endpoint, true)).await;
        let (status, _) = c.head().await;
        assert_eq!(status, 200);
        let (rest, err) = c.read_to_end().await;
        assert_eq!(err, Some(io::ErrorKind::ConnectionReset), "{endpoint:?}");
        let (data, terminal) = split_chunks(&rest);
        assert!(!terminal);
        assert_eq!(
            kinds(endpoint, &data),
            [Kind::Content, Kind::Content],
            "{endpoint:?}"
        );
        if endpoint == Endpoint::Messages {
            assert_eq!(named_events(&data)[0].0.as_deref(), Some("message_start"));
        }
    }
}

#[tokio::test]
async fn empty_choices_in_every_dialect() {
    let h = start_shaped().await;
    let mut c = Client::connect(&h).await;
    for endpoint in STREAMING {
        h.push_script([Behaviour::EmptyChoices]);
        let resp = c.request(&call_to(endpoint, true)).await;
        let events = named_events(&resp.body);
        let names: Vec<_> = events
            .iter()
            .map(|(n, _)| n.as_deref().unwrap_or("-"))
            .collect();
        match endpoint {
            Endpoint::Messages => assert_eq!(names, ["message_start", "message_stop"]),
            Endpoint::Responses => {
                assert_eq!(names, ["response.created", "response.completed"]);
                assert_eq!(events[1].1["response"]["output"], json!([]));
            }
            _ => {
                assert_eq!(names, ["-", "-"]);
                assert_eq!(events[0].1["choices"], json!([]));
                assert_eq!(events[1].1, "[DONE]");
            }
        }
    }
    let empties = [
        (Endpoint::ChatCompletions, "choices", json!([])),
        (Endpoint::Completions, "choices", json!([])),
        (Endpoint::Embeddings, "data", json!([])),
        (Endpoint::Responses, "output", json!([])),
        (Endpoint::Messages, "content", json!([])),
        (Endpoint::CountTokens, "input_tokens", json!(0)),
    ];
    for (endpoint, field, empty) in empties {
        h.push_script([Behaviour::EmptyChoices]);
        let v = c.request(&call_to(endpoint, false)).await.json();
        assert_eq!(v[field], empty, "{endpoint:?}");
    }
}

#[tokio::test]
async fn connection_level_behaviours_apply_to_every_endpoint() {
    let h = start_shaped().await;
    for endpoint in Endpoint::ALL {
        h.push_script([Behaviour::Reset]);
        let mut c = Client::connect(&h).await;
        c.send(&call_to(endpoint, false)).await;
        let (bytes, err) = c.read_to_end().await;
        assert!(bytes.is_empty());
        assert_eq!(err, Some(io::ErrorKind::ConnectionReset), "{endpoint:?}");
    }
    h.push_script([Behaviour::SlowHeader { ms: 100 }]);
    let started = Instant::now();
    let resp = one_shot(&h, &call_to(Endpoint::Messages, true)).await;
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(kinds(Endpoint::Messages, &resp.body).len(), 4);
    h.push_script([Behaviour::Stream {
        chunks: 6,
        gap_ms: 0,
    }]);
    let resp = one_shot(&h, &call_to(Endpoint::Responses, true)).await;
    assert_eq!(kinds(Endpoint::Responses, &resp.body).len(), 7);
}

#[test]
fn new_behaviour_json_forms() {
    let parse = |s: &str| serde_json::from_str::<Behaviour>(s);
    let cases = [
        (r#"{"kind":"ok_then_eof"}"#, Behaviour::OkThenEof),
        (
            r#"{"kind":"inband_error_first"}"#,
            Behaviour::InbandErrorFirst {
                error_type: None,
                after_start: false,
            },
        ),
        (
            r#"{"kind":"inband_error_first","error_type":"overloaded_error","after_start":true}"#,
            Behaviour::InbandErrorFirst {
                error_type: Some("overloaded_error".into()),
                after_start: true,
            },
        ),
        (
            r#"{"kind":"inband_error_after","chunks":2}"#,
            Behaviour::InbandErrorAfter {
                chunks: 2,
                error_type: None,
            },
        ),
        (
            r#"{"kind":"inband_error_after","chunks":1,"error_type":"server_error"}"#,
            Behaviour::InbandErrorAfter {
                chunks: 1,
                error_type: Some("server_error".into()),
            },
        ),
        (
            r#"{"kind":"stall_before_first","ms":500}"#,
            Behaviour::StallBeforeFirst { ms: 500 },
        ),
        (
            r#"{"kind":"stall_mid_stream","after_chunks":2,"ms":500}"#,
            Behaviour::StallMidStream {
                after_chunks: 2,
                ms: 500,
            },
        ),
        (
            r#"{"kind":"no_terminal","chunks":3}"#,
            Behaviour::NoTerminal { chunks: 3 },
        ),
    ];
    for (text, behaviour) in cases {
        assert_eq!(parse(text).unwrap(), behaviour, "{text}");
        // Serialization reads back to the same behaviour.
        let again = serde_json::to_string(&behaviour).unwrap();
        assert_eq!(parse(&again).unwrap(), behaviour, "{again}");
    }
    for bad in [
        r#"{"kind":"ok_then_eof","ms":1}"#,
        r#"{"kind":"inband_error_after"}"#,
        r#"{"kind":"inband_error_first","chunks":1}"#,
        r#"{"kind":"stall_before_first"}"#,
        r#"{"kind":"stall_mid_stream","ms":5}"#,
        r#"{"kind":"no_terminal","chunks":1,"extra":true}"#,
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    assert_eq!(
        serde_json::to_string(&Behaviour::InbandErrorFirst {
            error_type: None,
            after_start: true
        })
        .unwrap(),
        r#"{"kind":"inband_error_first","after_start":true}"#
    );
    assert_eq!(
        serde_json::to_value(Endpoint::CountTokens).unwrap(),
        "count_tokens"
    );
}

#[tokio::test]
async fn slow_every_slows_one_call_in_n() {
    let h = start_shaped().await;
    h.set_default(
        serde_json::from_str::<Behaviour>(r#"{"kind":"slow_every","ms":300,"every":3}"#)
            .expect("slow_every parses"),
    );
    let mut slow = Vec::new();
    for _ in 0..6 {
        let started = Instant::now();
        one_shot(&h, &call_to(Endpoint::ChatCompletions, false)).await;
        slow.push(started.elapsed() >= Duration::from_millis(300));
    }
    assert_eq!(slow, [false, false, true, false, false, true]);
}

#[tokio::test]
async fn a_hang_up_on_a_held_connection_is_recorded() {
    let h = start_shaped().await;
    h.push_script([Behaviour::Hang]);
    let mut c = Client::connect(&h).await;
    c.send(&call_to(Endpoint::ChatCompletions, false)).await;
    while h.calls() == 0 {
        tokio::task::yield_now().await;
    }
    assert!(h.hang_ups().is_empty(), "still held");
    let before = Instant::now();
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(2);
    while h.hang_ups().is_empty() {
        assert!(Instant::now() < deadline, "the hang-up was not seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(h.hang_ups()[0] >= before);
}
