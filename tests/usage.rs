//! Usage in every dialect, over sockets: what the provider reported for Chat Completions (JSON
//! and stream), completions, embeddings, the Responses API (JSON and stream, whose usage is
//! `input_tokens`/`output_tokens`, nested in `response.completed` on a stream) and Messages
//! (JSON and stream) reaches the access line, the token metrics, the spend and a key's `tpm`.
//!
//! The mock reports the upstream body's bytes / 4 as prompt tokens and one completion token a
//! word of its reply (`Hello from signalbox-mock.`: 3; embeddings: none).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use signalbox_mock::MockHandle;

const CLAUDE_KEY: &str = "sk-ant-usage";
/// A dollar per token, so spend in µ$ is the token count × 10⁶ and reads back exactly.
const PRICE: &str = "price: { input_per_mtok: 1000000, output_per_mtok: 1000000 }";

fn config(a: &MockHandle, c: &MockHandle) -> String {
    format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{}\" }}\n  c: {{ kind: anthropic, base_url: \"{}\", credentials: [{{ id: k, key_env: SB_USAGE_CLAUDE }}] }}\n\
         models:\n  m: {{ deployments: [{{ provider: a, model: up-m, {PRICE} }}] }}\n  claude: {{ deployments: [{{ provider: c, model: up-c, {PRICE} }}] }}\n\
         keys:\n  - {{ id: team, key_env: SB_USAGE_KEY, tpm: 100000 }}\n\
         log: {{ format: json }}\n",
        a.base_url(),
        c.base_url(),
    )
}

/// A sample's value in the exposition (0 when absent).
fn sample(metrics: &str, line_start: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

struct Surface {
    name: &'static str,
    path: &'static str,
    model: &'static str,
    body: Value,
    completion: u64,
}

fn surfaces() -> Vec<Surface> {
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "Count my tokens, please."}]});
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let responses = json!({"model": "m", "input": "Count my tokens, please."});
    let mut responses_stream = responses.clone();
    responses_stream["stream"] = json!(true);
    let messages = json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "Count my tokens, please."}]});
    let mut messages_stream = messages.clone();
    messages_stream["stream"] = json!(true);
    vec![
        Surface {
            name: "chat",
            path: "/v1/chat/completions",
            model: "m",
            body: chat,
            completion: 3,
        },
        Surface {
            name: "chat stream",
            path: "/v1/chat/completions",
            model: "m",
            body: chat_stream,
            completion: 3,
        },
        Surface {
            name: "completions",
            path: "/v1/completions",
            model: "m",
            body: json!({"model": "m", "prompt": "Count my tokens, please."}),
            completion: 3,
        },
        Surface {
            name: "embeddings",
            path: "/v1/embeddings",
            model: "m",
            body: json!({"model": "m", "input": "Count my tokens, please."}),
            completion: 0,
        },
        Surface {
            name: "responses",
            path: "/v1/responses",
            model: "m",
            body: responses,
            completion: 3,
        },
        Surface {
            name: "responses stream",
            path: "/v1/responses",
            model: "m",
            body: responses_stream,
            completion: 3,
        },
        Surface {
            name: "messages",
            path: "/v1/messages",
            model: "claude",
            body: messages,
            completion: 3,
        },
        Surface {
            name: "messages stream",
            path: "/v1/messages",
            model: "claude",
            body: messages_stream,
            completion: 3,
        },
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_surfaces_usage_reaches_the_access_line_the_metrics_and_the_spend() {
    let a = mock("a").await;
    let c = mock_with("c", |m| m.api_key = Some(CLAUDE_KEY.into())).await;
    let gw = GatewayBuilder::new(config(&a, &c))
        .env("SB_USAGE_CLAUDE", CLAUDE_KEY)
        .env("SB_USAGE_KEY", "sk-usage-caller")
        .start();
    for (i, s) in surfaces().into_iter().enumerate() {
        let (upstream, provider) = if s.model == "claude" {
            (&c, "c")
        } else {
            (&a, "a")
        };
        let before = gw.metrics().await;
        let id = format!("usage-{i}");
        let mut rb = client()
            .post(gw.url(s.path))
            .header("authorization", "Bearer sk-usage-caller")
            .header("x-request-id", &id);
        if s.path == "/v1/messages" {
            rb = rb.header("anthropic-version", "2023-06-01");
        }
        let r = rb.json(&s.body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", s.name);
        let (text, broken) = read_all(r).await;
        assert!(!broken, "{}: {text}", s.name);
        let call = upstream.requests().pop().unwrap();
        let prompt = (call.body_len / 4) as u64;
        assert!(prompt > 0);

        let line = gw.json_access_line(&id).await;
        assert_eq!(line["prompt_tokens"], prompt, "{}: {line}", s.name);
        assert_eq!(
            line["completion_tokens"], s.completion,
            "{}: {line}",
            s.name
        );

        let labels = format!("{{provider=\"{provider}\",model=\"{}\"", s.model);
        let prompt_line = format!("signalbox_tokens_total{labels},kind=\"prompt\"}}");
        // Counted before the access line was written.
        let after = gw.metrics().await;
        let delta = |name: &str| sample(&after, name) - sample(&before, name);
        assert_eq!(delta(&prompt_line), prompt as f64, "{}", s.name);
        if s.completion > 0 {
            let completion_line = format!("signalbox_tokens_total{labels},kind=\"completion\"}}");
            assert_eq!(delta(&completion_line), s.completion as f64, "{}", s.name);
        }
        let spend_line = format!("signalbox_spend_usd_total{labels}}}");
        assert_eq!(
            delta(&spend_line),
            (prompt + s.completion) as f64,
            "{}: a dollar a token",
            s.name
        );
    }
}

/// A key's `tpm` counts what a Responses stream used (its usage comes in `response.completed`,
/// in the Responses API's names), not the estimate: before, it was read as nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_keys_tpm_counts_what_a_responses_stream_used() {
    let a = mock("a").await;
    let gw = GatewayBuilder::new(format!(
        "providers:\n{}models:\n  m: {{ deployments: [{{ provider: a, model: up-m }}] }}\nkeys:\n  - {{ id: team, key_env: SB_USAGE_KEY, tpm: 20 }}\n",
        provider("a", &a)
    ))
    .env("SB_USAGE_KEY", "sk-usage-caller")
    .start();
    // Estimated at 8 tokens (the text and `max_output_tokens: 4`): two fit the minute's 20. The
    // mock reports the body's bytes / 4 (about 19) and 3 output tokens: one is over it.
    let body =
        json!({"model": "m", "input": "hi there friend", "stream": true, "max_output_tokens": 4});
    let send = || {
        client()
            .post(gw.url("/v1/responses"))
            .header("authorization", "Bearer sk-usage-caller")
            .json(&body)
            .send()
    };
    let r = send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (text, _) = read_all(r).await;
    assert!(text.contains("response.completed"), "{text}");
    let used = (a.requests().pop().unwrap().body_len / 4) as u64 + 3;
    assert!(
        used > 20,
        "the stream used more than the minute holds: {used}"
    );
    let r = send().await.unwrap();
    assert_eq!(
        r.status(),
        429,
        "the minute holds what the first stream used, not its estimate"
    );
    assert_eq!(a.calls(), 1);
}

/// The cost a text answer reports in `usage.cost_usd`: from a whole JSON body, or from the
/// stream event that carries usage (OpenAI's usage chunk, a Responses stream's
/// `response.completed`, Anthropic's `message_delta`). `None` when nothing carries it.
fn reported_cost(text: &str) -> Option<f64> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return v["usage"]["cost_usd"].as_f64();
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| {
            v["usage"]["cost_usd"]
                .as_f64()
                .or_else(|| v["response"]["usage"]["cost_usd"].as_f64())
        })
}

/// Seed 004: a priced answer says what it cost in `usage.cost_usd` — the figure its spend was
/// charged — on every surface, whole and streamed, same dialect and translated; a length-framed
/// answer keeps an exact `Content-Length`; an unpriced one has no `cost_usd`.
#[tokio::test(flavor = "multi_thread")]
async fn a_priced_answer_reports_its_cost_in_its_usage() {
    let a = mock("a").await;
    let c = mock_with("c", |m| m.api_key = Some(CLAUDE_KEY.into())).await;
    let free = mock("free").await;
    let text = config(&a, &c).replace(
        "models:\n",
        &format!(
            "  free: {{ kind: openai, base_url: \"{}\" }}\nmodels:\n  unpriced: {{ deployments: [{{ provider: free, model: up-free }}] }}\n",
            free.base_url()
        ),
    );
    let gw = GatewayBuilder::new(text)
        .env("SB_USAGE_CLAUDE", CLAUDE_KEY)
        .env("SB_USAGE_KEY", "sk-usage-caller")
        .start();
    let mut cases: Vec<(String, &str, Value, &MockHandle)> = surfaces()
        .into_iter()
        .filter(|s| s.name != "chat stream")
        .map(|s| {
            let upstream = if s.model == "claude" { &c } else { &a };
            (s.name.to_string(), s.path, s.body, upstream)
        })
        .collect();
    // A chat stream whose caller asked for usage; and both translations, whole and streamed.
    let chat_usage = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "Count my tokens, please."}]});
    cases.push((
        "chat stream with usage".into(),
        "/v1/chat/completions",
        chat_usage.clone(),
        &a,
    ));
    let mut to_claude = chat_usage.clone();
    to_claude["model"] = json!("claude");
    cases.push((
        "chat stream on claude".into(),
        "/v1/chat/completions",
        to_claude.clone(),
        &c,
    ));
    to_claude.as_object_mut().unwrap().remove("stream");
    to_claude.as_object_mut().unwrap().remove("stream_options");
    cases.push((
        "chat on claude".into(),
        "/v1/chat/completions",
        to_claude,
        &c,
    ));
    let messages_on_m = json!({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Count my tokens, please."}]});
    cases.push((
        "messages on m".into(),
        "/v1/messages",
        messages_on_m.clone(),
        &a,
    ));
    let mut stream = messages_on_m;
    stream["stream"] = json!(true);
    cases.push(("messages stream on m".into(), "/v1/messages", stream, &a));
    for (i, (name, path, body, upstream)) in cases.into_iter().enumerate() {
        let id = format!("cost-{i}");
        let mut rb = client()
            .post(gw.url(path))
            .header("authorization", "Bearer sk-usage-caller")
            .header("x-request-id", &id);
        if path == "/v1/messages" {
            rb = rb.header("anthropic-version", "2023-06-01");
        }
        let r = rb.json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{name}");
        let length: Option<usize> = r
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let (text, broken) = read_all(r).await;
        assert!(!broken, "{name}: {text}");
        if let Some(len) = length {
            assert_eq!(text.len(), len, "{name}: the announced length");
        }
        let line = gw.json_access_line(&id).await;
        let tokens = line["prompt_tokens"].as_u64().unwrap()
            + line["completion_tokens"].as_u64().unwrap_or(0);
        assert!(upstream.calls() > 0, "{name}");
        assert_eq!(
            reported_cost(&text),
            Some(tokens as f64),
            "{name}: a dollar a token: {text}"
        );
    }
    // Unpriced: the answer is as the provider wrote it, no cost.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-usage-caller")
        .json(&json!({"model": "unpriced", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert!(v["usage"].is_object(), "{v}");
    assert!(v["usage"].get("cost_usd").is_none(), "{v}");
}
