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
