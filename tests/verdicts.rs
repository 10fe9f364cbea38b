//! One attempt, one verdict, the same on every path: each fault a provider can show is run
//! through a non-stream request (signalbox's own driver, committed when the whole answer is
//! in), a stream under the first-chunk hold (its own driver, committed at the first content)
//! and a stream with the hold off (Pingora's proxy loop, committed at the header), and each
//! must give the verdict its commit point allows: where the path can still fail over, the same
//! failover, the same `x-llm-attempts`, the same breaker effect and one ledger row per
//! attempt; where it cannot (after the header of a stream with the hold off), the stream's
//! own error event.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use signalbox_mock::{Behaviour, MockHandle, StreamShape};

/// The three ways a request's attempts are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// A non-stream request: held until the whole answer is in.
    Whole,
    /// A stream under the first-chunk hold.
    Held,
    /// A stream with the hold off (the fast path).
    Unheld,
}

const PATHS: [Path; 3] = [Path::Whole, Path::Held, Path::Unheld];

/// What the caller gets.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// `a` failed with this outcome, `b` served.
    FailedOver(&'static str),
    /// `a`'s refusal is the answer (status, code); nothing else is called.
    Refused(u16, &'static str),
    /// `a`'s answer was committed and ended with this outcome; the stream ends with this
    /// error code in-band (`None`: relayed as the provider ended it).
    Committed(&'static str, Option<&'static str>),
}

/// What health learned about `a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// One failure against the target (its breaker and its model's bench).
    TargetFailure,
    /// Its credential cools (429 with Retry-After).
    CredentialCooling,
    /// Its credential is rejected (401/403).
    CredentialRejected,
    /// Nothing.
    None,
}

struct Fault {
    /// `a`'s behaviour (`None`: nothing listens at `a`'s address).
    behaviour: Option<Behaviour>,
    /// The verdict per path, in [`PATHS`] order.
    expect: [Expect; 3],
    effect: Effect,
}

const HOLD_MS: u64 = 400;
const TTFB_MS: u64 = 800;

fn config(a_url: &str, b: &MockHandle, path: Path) -> String {
    let hold = if path == Path::Unheld {
        "0".to_string()
    } else {
        format!("{HOLD_MS}ms")
    };
    format!(
        "providers:\n  a: {{ kind: openai, base_url: \"{a_url}\" }}\n{}\
         models:\n  m:\n    strategy: priority\n    deployments: [{{ provider: a, model: up-a, priority: 1 }}, {{ provider: b, model: up-b, priority: 2 }}]\n\
         health: {{ failure_threshold: 100, bench_after: 64, respect_retry_after: true }}\n\
         failover: {{ ttfb_timeout: {TTFB_MS}ms, first_chunk_hold: {hold}, stream_idle_timeout: {HOLD_MS}ms }}\n\
         ledger: {{ sqlite: ledger.db, flush_interval: 10ms }}\n",
        provider("b", b),
    )
}

fn body(path: Path) -> Value {
    serde_json::json!({
        "model": "m",
        "stream": path != Path::Whole,
        "messages": [{"role": "user", "content": "Say hello."}]
    })
}

/// What health says about `a`.
async fn effect(gw: &Gateway) -> Effect {
    let h = admin_json(gw, "/admin/health").await;
    let target = h["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == "a")
        .cloned()
        .unwrap();
    let credential = h["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["provider"] == "a")
        .cloned()
        .unwrap();
    let failures = target["window"]["failures"].as_u64().unwrap();
    match (
        failures,
        credential["rejected"].as_bool(),
        credential["cooling"].is_null(),
    ) {
        (1, Some(false), true) => Effect::TargetFailure,
        (0, Some(true), false) => Effect::CredentialRejected,
        (0, Some(false), false) => Effect::CredentialCooling,
        (0, Some(false), true) => Effect::None,
        _ => panic!("unexpected health for a: {target} {credential}"),
    }
}

/// Ledger rows by provider, once they add up to `attempts`.
async fn ledger_rows(gw: &Gateway, attempts: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = admin_json(gw, "/admin/usage?by=provider").await;
        let rows = |p: &str| {
            v["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|g| g["group"] == p)
                .map(|g| g["attempts"].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        let (a, b) = (rows("a"), rows("b"));
        if a + b >= attempts || Instant::now() > deadline {
            return (a, b);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(name: &str, fault: Fault) {
    for (path, expect) in PATHS.into_iter().zip(fault.expect) {
        let case = format!("{name} on {path:?}");
        let a = mock_with("a", |c| {
            c.stream = StreamShape {
                chunks: 3,
                gap: Duration::from_millis(20),
            }
        })
        .await;
        let b = mock("b").await;
        let a_url = match &fault.behaviour {
            Some(behaviour) => {
                a.set_default(behaviour.clone());
                a.base_url()
            }
            None => format!("http://127.0.0.1:{}/v1", refused_port()),
        };
        let gw = Gateway::start(config(&a_url, &b, path));
        let r = post_chat(&gw, &body(path)).await;
        let status = r.status().as_u16();
        let provider = header(&r, "x-llm-provider").to_string();
        let attempts = header(&r, "x-llm-attempts").to_string();
        let (text, _) = read_all(r).await;
        let calls = match expect {
            Expect::FailedOver(outcome) => {
                assert_eq!(status, 200, "{case}: {text}");
                assert_eq!(provider, "b", "{case}");
                assert_eq!(attempts, "2", "{case}");
                assert!(
                    !text.contains("\"error\""),
                    "{case}: only b's answer: {text}"
                );
                if path == Path::Whole {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(v["model"], "m", "{case}");
                } else {
                    assert!(text.trim_end().ends_with("data: [DONE]"), "{case}: {text}");
                }
                assert_eq!(b.calls(), 1, "{case}");
                let line =
                    format!(r#"signalbox_attempts_total{{provider="a",outcome="{outcome}"}} 1"#);
                let m = gw.metrics_with(&[&line]).await;
                assert!(m.contains(&line), "{case}: {m}");
                (1, 1)
            }
            Expect::Refused(want, code) => {
                assert_eq!(status, want, "{case}: {text}");
                assert_eq!(attempts, "1", "{case}");
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["error"]["code"], code, "{case}: {text}");
                assert_eq!(b.calls(), 0, "{case}");
                (1, 0)
            }
            Expect::Committed(outcome, event) => {
                assert_eq!(status, 200, "{case}");
                assert_eq!(provider, "a", "{case}: {}", gw.stderr());
                assert_eq!(attempts, "1", "{case}");
                if let Some(code) = event {
                    assert!(text.contains(code), "{case}: {text}");
                }
                assert!(
                    !text.contains("[DONE]") || event.is_none(),
                    "{case}: {text}"
                );
                assert_eq!(b.calls(), 0, "{case}: no attempt after the commit");
                let line =
                    format!(r#"signalbox_attempts_total{{provider="a",outcome="{outcome}"}} 1"#);
                let m = gw.metrics_with(&[&line]).await;
                assert!(m.contains(&line), "{case}: {m}");
                (1, 0)
            }
        };
        assert_eq!(effect(&gw).await, fault.effect, "{case}");
        assert_eq!(
            ledger_rows(&gw, calls.0 + calls.1).await,
            calls,
            "{case}: ledger rows"
        );
    }
}

fn same(e: Expect) -> [Expect; 3] {
    [e, e, e]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connect_fails_over_on_every_path() {
    run(
        "refused",
        Fault {
            behaviour: None,
            expect: same(Expect::FailedOver("connect_refused")),
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_before_the_header_fails_over_on_every_path() {
    run(
        "reset",
        Fault {
            behaviour: Some(Behaviour::Reset),
            expect: same(Expect::FailedOver("reset")),
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn silence_fails_over_at_the_paths_deadline() {
    run(
        "silence",
        Fault {
            behaviour: Some(Behaviour::Hang),
            expect: [
                Expect::FailedOver("timeout"),
                Expect::FailedOver("first_chunk_timeout"),
                Expect::FailedOver("timeout"),
            ],
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_fail_over_on_every_path() {
    for code in [503, 529] {
        run(
            &code.to_string(),
            Fault {
                behaviour: Some(status(code)),
                expect: same(Expect::FailedOver("server_error")),
                effect: Effect::TargetFailure,
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_429_cools_its_credential_and_fails_over_on_every_path() {
    run(
        "429",
        Fault {
            behaviour: Some(Behaviour::Status {
                code: 429,
                retry_after: Some("7".into()),
                body: None,
            }),
            expect: same(Expect::FailedOver("rate_limited")),
            effect: Effect::CredentialCooling,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rejected_credential_fails_over_on_every_path() {
    for code in [401, 403] {
        run(
            &code.to_string(),
            Fault {
                behaviour: Some(status(code)),
                expect: same(Expect::FailedOver("credential_rejected")),
                effect: Effect::CredentialRejected,
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_callers_400_is_relayed_on_every_path() {
    run(
        "400",
        Fault {
            behaviour: Some(status(400)),
            expect: same(Expect::Refused(400, "all_candidates_rejected")),
            effect: Effect::None,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_upstream_model_fails_over_on_every_path() {
    run(
        "404",
        Fault {
            behaviour: Some(status(404)),
            expect: same(Expect::FailedOver("model_not_found")),
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_without_choices_fails_over_where_it_is_held() {
    run(
        "empty choices",
        Fault {
            behaviour: Some(Behaviour::EmptyChoices),
            expect: [
                Expect::FailedOver("empty"),
                Expect::FailedOver("empty"),
                Expect::Committed("empty", None),
            ],
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_stream_fails_over_where_it_is_held() {
    run(
        "empty stream",
        Fault {
            behaviour: Some(Behaviour::EmptyStream),
            expect: [
                Expect::FailedOver("empty"),
                Expect::FailedOver("empty"),
                Expect::Committed("empty", Some("upstream_empty_stream")),
            ],
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_error_before_content_fails_over_where_it_is_held() {
    run(
        "in-band error first",
        Fault {
            behaviour: Some(Behaviour::InbandErrorFirst {
                error_type: None,
                after_start: true,
            }),
            expect: [
                Expect::FailedOver("server_error"),
                Expect::FailedOver("stream_error"),
                Expect::Committed("stream_aborted", Some("upstream_stream_error")),
            ],
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn death_after_content_fails_over_only_before_the_commit() {
    run(
        "death after content",
        Fault {
            behaviour: Some(Behaviour::MidStreamDeath { after_chunks: 2 }),
            expect: [
                Expect::FailedOver("reset"),
                Expect::Committed("stream_aborted", Some("upstream_stream_interrupted")),
                Expect::Committed("stream_aborted", Some("upstream_stream_interrupted")),
            ],
            effect: Effect::TargetFailure,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stall_after_content_fails_over_only_before_the_commit() {
    run(
        "stall after content",
        Fault {
            behaviour: Some(Behaviour::StallMidStream {
                after_chunks: 1,
                ms: 3_000,
            }),
            expect: [
                Expect::FailedOver("timeout"),
                Expect::Committed("stream_aborted", Some("upstream_stream_stalled")),
                Expect::Committed("stream_aborted", Some("upstream_stream_stalled")),
            ],
            effect: Effect::TargetFailure,
        },
    )
    .await;
}
