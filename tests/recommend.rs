//! `POST /v1/routing/recommend` over real sockets (DESIGN §10): the decision model is asked
//! through the gateway's own plan as the caller's key, its answer's first candidate name is
//! returned, an answer naming none is asked once more and then falls back; the call is billed
//! to the caller's key; the caller is authenticated and scoped like any other.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use signalbox_mock::MockHandle;

const KEY: &str = "sk-team-recommend";

/// `work` serves the candidates `m1` and `claude-x`; `dm` serves the decision model
/// `decider` (priced: spend lands on the key). With `keys`, one key `team` that may use
/// `allowed`.
fn config(work: &MockHandle, dm: &MockHandle, ledger: &std::path::Path, allowed: &str) -> String {
    format!(
        "providers:\n{}{}models:\n  m1: {{ deployments: [{{ provider: work, model: up-1 }}] }}\n  claude-x: {{ deployments: [{{ provider: work, model: up-2 }}] }}\n  decider: {{ deployments: [{{ provider: dm, model: up-d, price: {{ input_per_mtok: 1000000, output_per_mtok: 1000000 }} }}] }}\nkeys:\n  - {{ id: team, key_sha256: \"{}\", user: alice, allowed_models: {allowed} }}\nledger: {{ sqlite: \"{}\" }}\nrecommend: {{ decision_model: decider }}\n",
        provider("work", work),
        provider("dm", dm),
        sha256_hex(KEY.as_bytes()),
        ledger.display(),
    )
}

struct World {
    work: MockHandle,
    dm: MockHandle,
    gw: Gateway,
    _dir: tempfile::TempDir,
}

async fn world(reply: &str, allowed: &str) -> World {
    let work = mock("work").await;
    let dm = mock_with("dm", |c| c.reply = reply.to_string()).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(config(&work, &dm, &dir.path().join("ledger.db"), allowed));
    World {
        work,
        dm,
        gw,
        _dir: dir,
    }
}

async fn recommend(gw: &Gateway, key: Option<&str>, body: &str) -> reqwest::Response {
    let mut r = client()
        .post(gw.url("/v1/routing/recommend"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

const ASK: &str = r#"{"candidates": ["m1", "claude-x"], "task": "summarise a 40-page contract"}"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_candidate_the_decision_model_names_is_returned() {
    let w = world("CLAUDE-X: it reads long documents best.", "[\"*\"]").await;
    let r = recommend(&w.gw, Some(KEY), ASK).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"model": "claude-x", "reason": "it reads long documents best."})
    );
    assert_eq!(w.dm.calls(), 1);
    assert_eq!(w.work.calls(), 0, "no candidate is called");
    let asked = w.dm.requests()[0].json().unwrap();
    let system = asked["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("- m1\n") && system.contains("- claude-x\n"),
        "{system}"
    );
    assert_eq!(
        asked["messages"][1]["content"],
        "summarise a 40-page contract"
    );
    assert_eq!(asked["model"], "up-d", "asked through the plan");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_naming_no_candidate_is_asked_again_then_falls_back() {
    let w = world("I would rather not say.", "[\"*\"]").await;
    let r = recommend(&w.gw, Some(KEY), ASK).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"model": "m1", "reason": "fallback"}));
    assert_eq!(w.dm.calls(), 2, "asked once more, then the fallback");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_decision_is_billed_to_the_callers_key() {
    let w = world("m1 is enough", "[\"*\"]").await;
    let r = recommend(&w.gw, Some(KEY), ASK).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["model"], "m1");
    // The ledger row of the decision model's call is the key's, with its cost.
    let deadline = Instant::now() + Duration::from_secs(10);
    let team = loop {
        let v: Value = client()
            .get(format!("http://{}/admin/usage?by=key", w.gw.admin))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let team = v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == "team")
            .cloned();
        if let Some(team) = team {
            break team;
        }
        assert!(Instant::now() < deadline, "no usage for the key: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(team["requests"].as_u64(), Some(1), "{team}");
    assert!(team["cost_usd"].as_f64().unwrap() > 0.0, "{team}");
}

#[tokio::test(flavor = "multi_thread")]
async fn callers_are_authenticated_and_scoped_and_bodies_checked() {
    let w = world("m1", "[m1, decider]").await;
    expect_error(recommend(&w.gw, None, ASK).await, 401, "invalid_api_key").await;
    expect_error(
        recommend(&w.gw, Some("sk-wrong"), ASK).await,
        401,
        "invalid_api_key",
    )
    .await;
    // `claude-x` is outside the key's scope.
    expect_error(
        recommend(&w.gw, Some(KEY), ASK).await,
        403,
        "model_not_allowed",
    )
    .await;
    for (body, code) in [
        ("", "invalid_request"),
        ("not json", "invalid_request"),
        (r#"{"task": "t"}"#, "candidates_required"),
        (r#"{"candidates": [], "task": "t"}"#, "candidates_required"),
        (r#"{"candidates": ["m1"]}"#, "task_required"),
        (
            r#"{"candidates": ["nope"], "task": "t"}"#,
            "model_not_found",
        ),
    ] {
        expect_error(recommend(&w.gw, Some(KEY), body).await, 400, code).await;
    }
    assert_eq!(w.dm.calls(), 0, "nothing was asked for a refused request");
    let r = recommend(&w.gw, Some(KEY), r#"{"candidates": ["m1"], "task": "t"}"#).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_recommend_section_the_endpoint_is_not_found() {
    let work = mock("work").await;
    let gw = Gateway::start(format!(
        "providers:\n{}models:\n  m1: {{ deployments: [{{ provider: work, model: up-1 }}] }}\n",
        provider("work", &work)
    ));
    expect_error(recommend(&gw, None, ASK).await, 404, "not_found").await;
    let r = client()
        .post(gw.url("/v1/routing/elsewhere"))
        .body("{}")
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "not_found").await;
}
