//! The request body scan and per-attempt rewrite, and the response `model` rewrite, beside
//! `serde_json` doing the same work (parse to a `Value`, edit, serialise) in the same run; a
//! number's header value beside `http`'s own; the request's parse with and without its token
//! estimate (made only when a route reads it); the caller's headers read in one pass beside
//! the hashed lookups it replaces; a provider's and a caller's headers filtered into a fresh
//! map beside the whole-map copy it replaces.
//!
//! Run: `cargo bench --bench adapters`.

use std::hint::black_box;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use signalbox::adapters::openai::{ChatRequest, ResponseRewriter, StreamStats};
use signalbox::adapters::relay::{Relay, Reply};
use signalbox::catalog::surface::{Conversion, Surface};
use signalbox::proxy::headers::int_value;

fn body(size: usize) -> Bytes {
    let filler: String = "the quick brown fox jumps over the lazy dog "
        .chars()
        .cycle()
        .take(size)
        .collect();
    Bytes::from(format!(
        r#"{{"model":"fast","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"{filler}"}}],"temperature":0.2,"stream":false,"routing":{{"providers":["a"]}}}}"#
    ))
}

fn bench_request(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_body");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for size in [2 << 10, 100 << 10, 1 << 20] {
        let b = body(size);
        g.throughput(Throughput::Bytes(b.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("scan_and_rewrite", size),
            &b,
            |bench, b| {
                bench.iter(|| {
                    let req = ChatRequest::parse(b.clone()).expect("valid");
                    black_box(req.body_for(b"\"gpt-4o-mini-2024-07-18\""))
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("baseline_serde_value", size),
            &b,
            |bench, b| {
                bench.iter(|| {
                    let mut v: serde_json::Value = serde_json::from_slice(b).expect("valid");
                    let obj = v.as_object_mut().expect("object");
                    let _model = obj
                        .get("model")
                        .and_then(|m| m.as_str())
                        .map(str::to_string);
                    obj.remove("routing");
                    obj.insert("model".into(), "gpt-4o-mini-2024-07-18".into());
                    black_box(serde_json::to_vec(&v).expect("serialise"))
                });
            },
        );
    }
    g.finish();
}

fn bench_response(c: &mut Criterion) {
    let mut g = c.benchmark_group("response_body");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let json = Bytes::from_static(br#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}"#);
    g.bench_function("json_model_rewrite", |b| {
        b.iter(|| {
            let mut rw = ResponseRewriter::Json {
                caller_model: Bytes::from_static(b"\"fast\""),
                buf: BytesMut::new(),
                fixed_len: Some(json.len()),
                whole_at: None,
            };
            let mut stats = StreamStats::default();
            let mut chunk = Some(json.clone());
            rw.filter(&mut chunk, true, &mut stats);
            black_box(chunk)
        });
    });
    let event = Bytes::from_static(b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n");
    g.bench_function("sse_event_model_rewrite", |b| {
        let mut rw = ResponseRewriter::Sse {
            caller_model: Bytes::from_static(b"\"fast\""),
            carry: BytesMut::new(),
            strip_usage: false,
        };
        let mut stats = StreamStats::default();
        b.iter(|| {
            let mut chunk = Some(event.clone());
            rw.filter(&mut chunk, false, &mut stats);
            black_box(chunk)
        });
    });
    // A header value for a number: the table or one allocation, beside `http`'s `From<u64>`.
    for n in [286u64, 70_000] {
        g.bench_with_input(BenchmarkId::new("int_header_value", n), &n, |b, &n| {
            b.iter(|| int_value(black_box(n)))
        });
        g.bench_with_input(BenchmarkId::new("int_header_value_http", n), &n, |b, &n| {
            b.iter(|| http::HeaderValue::from(black_box(n)))
        });
    }
    g.finish();
}

/// One stream event through each relay the proxy builds: same dialect, and translated each way.
fn bench_relay(c: &mut Criterion) {
    let mut g = c.benchmark_group("relay_event");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let chat = Bytes::from_static(b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n");
    let messages = Bytes::from_static(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n");
    let messages_start = Bytes::from_static(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    let cases = [
        (
            "chat_same_dialect",
            Surface::ChatCompletions,
            Conversion::Same,
            None,
            &chat,
        ),
        (
            "messages_same_dialect",
            Surface::Messages,
            Conversion::Same,
            Some(&messages_start),
            &messages,
        ),
        (
            "messages_to_chat_caller",
            Surface::ChatCompletions,
            Conversion::ChatToMessages,
            Some(&messages_start),
            &messages,
        ),
        (
            "chat_to_messages_caller",
            Surface::Messages,
            Conversion::MessagesToChat,
            None,
            &chat,
        ),
    ];
    for (name, surface, conversion, opening, event) in cases {
        let reply = Reply {
            surface,
            conversion,
            caller_model: Bytes::from_static(b"\"fast\""),
            provider: None,
            strip_usage: false,
            caller_usage: false,
            price: None,
        };
        let mut relay = Relay::sse(&reply);
        if let Some(open) = opening {
            let mut chunk = Some(open.clone());
            relay.filter(&mut chunk, false);
        }
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut chunk = Some(event.clone());
                relay.filter(&mut chunk, false);
                black_box(chunk)
            });
        });
    }
    g.finish();
}

/// The prompt's token estimate (text characters, images by formula) against an exact count
/// with `o200k_base`, for a 2 KiB and a 200 KiB prompt: what the request path pays on every
/// request, and what it pays only near a limit.
fn bench_estimate(c: &mut Criterion) {
    use signalbox::adapters::estimate;
    use signalbox::adapters::tokenizer::{self, Encoding};
    let mut g = c.benchmark_group("prompt_tokens");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    // Loaded once, off the measurement (as it is once per process).
    let _ = tokenizer::count("warm", Encoding::O200k);
    for size in [2 << 10, 200 << 10] {
        let b = body(size);
        let req = ChatRequest::parse(b.clone()).expect("valid");
        let prompt = req.prompt().to_vec();
        g.throughput(Throughput::Bytes(prompt.len() as u64));
        g.bench_with_input(BenchmarkId::new("estimate", size), &prompt, |bench, p| {
            bench.iter(|| black_box(estimate::estimate(p)));
        });
        g.bench_with_input(
            BenchmarkId::new("exact_o200k", size),
            &prompt,
            |bench, p| {
                bench.iter(|| {
                    let text = estimate::message_text(p);
                    black_box(tokenizer::count(&text, Encoding::O200k))
                });
            },
        );
    }
    g.finish();
}

/// What a request pays for its estimate when nothing reads it (now) and when a route does: the
/// 2 KiB chat body parsed, then its estimate asked for.
fn bench_lazy_estimate(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_parse");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let b = body(2 << 10);
    g.bench_function("parse_only", |bench| {
        bench.iter(|| black_box(ChatRequest::parse(b.clone()).expect("valid")));
    });
    g.bench_function("parse_and_estimate", |bench| {
        bench.iter(|| {
            let req = ChatRequest::parse(b.clone()).expect("valid");
            black_box(req.estimate())
        });
    });
    g.finish();
}

/// A header map of these entries, in order.
fn header_map(entries: &[(&'static str, &'static str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in entries {
        h.append(
            http::HeaderName::from_static(k),
            http::HeaderValue::from_static(v),
        );
    }
    h
}

/// The headers an SDK sends with a chat request (no `x-llm-*` among them).
fn sdk_headers() -> http::HeaderMap {
    header_map(&[
        ("host", "127.0.0.1:8080"),
        ("user-agent", "OpenAI/Python 1.54.0"),
        ("accept", "application/json"),
        ("accept-encoding", "gzip, deflate"),
        ("content-type", "application/json"),
        ("content-length", "2048"),
        ("authorization", "Bearer sk-test"),
        ("x-stainless-lang", "python"),
        ("x-stainless-retry-count", "0"),
    ])
}

/// Intake's header reads: one pass (`scan_caller`) beside the hashed lookups of every
/// steering header and the request id it replaces.
fn bench_caller_headers(c: &mut Criterion) {
    use signalbox::proxy::headers::scan_caller;
    let mut g = c.benchmark_group("caller_headers");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let h = sdk_headers();
    g.bench_function("one_pass", |bench| {
        bench.iter(|| black_box(scan_caller(black_box(&h))));
    });
    let names = [
        "x-request-id",
        "x-llm-internal-token",
        "x-llm-route",
        "x-llm-route",
        "x-llm-router",
        "x-llm-metadata",
        "x-llm-session",
    ]
    .map(http::HeaderName::from_static);
    g.bench_function("hashed_lookups", |bench| {
        bench.iter(|| {
            let h = black_box(&h);
            black_box(names.iter().filter(|n| h.get(*n).is_some()).count())
        });
    });
    g.finish();
}

/// A provider's request header and a caller's response header: the kept entries cloned into
/// a fresh map (now) beside the whole-map copy the old path started from (before its filter).
fn bench_header_filters(c: &mut Criterion) {
    use signalbox::config::{HeaderGlobs, ProviderKind};
    use signalbox::proxy::headers::{to_caller_from, to_provider_from};
    let mut g = c.benchmark_group("header_filters");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let caller = sdk_headers();
    let pass = HeaderGlobs::default();
    g.bench_function("to_provider_fresh", |bench| {
        bench.iter(|| {
            let mut out = http::HeaderMap::with_capacity(16);
            to_provider_from(
                black_box(&caller),
                &mut out,
                ProviderKind::OpenAi,
                false,
                &pass,
            );
            black_box(out)
        });
    });
    g.bench_function("whole_map_copy", |bench| {
        bench.iter(|| black_box(black_box(&caller).clone()));
    });
    let answer = header_map(&[
        ("date", "Fri, 04 Dec 2026 19:00:00 GMT"),
        ("content-type", "application/json"),
        ("content-length", "270"),
        ("openai-organization", "org-1"),
        ("openai-processing-ms", "312"),
        ("x-ratelimit-remaining-requests", "9999"),
        ("x-ratelimit-remaining-tokens", "199000"),
        ("x-request-id", "req_1"),
        ("set-cookie", "__cf_bm=1"),
    ]);
    g.bench_function("to_caller_fresh", |bench| {
        bench.iter(|| {
            let mut out = http::HeaderMap::with_capacity(24);
            to_caller_from(black_box(&answer), &mut out, &pass);
            black_box(out)
        });
    });
    g.bench_function("answer_whole_map_copy", |bench| {
        bench.iter(|| black_box(black_box(&answer).clone()));
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_request,
    bench_response,
    bench_relay,
    bench_estimate,
    bench_lazy_estimate,
    bench_caller_headers,
    bench_header_filters
);
criterion_main!(benches);
