//! The knn (learned) router over real sockets (DESIGN §10): examples taught through the admin
//! API are embedded through the gateway's own plan (the mock's bag-of-words embeddings carry
//! meaning, so prompts sharing words are near), and a request under a `router: knn` entry is
//! served by the target its nearest examples scored best — or by the entry's `default` when
//! the pool is cold, the embedding model is down, the router is unsure or switched off. Pools
//! are per (policy, user, task), a conversation keeps its decision, status never shows a
//! prompt, forget empties a pool, and a restart keeps the pools (SQLite). Every test counts
//! the calls each mock received.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use signalbox_mock::{Endpoint, MockHandle};

const ADMIN: &str = "sk-admin-knn";
const ALICE: &str = "sk-alice-knn";
const BOB: &str = "sk-bob-knn";

const CODE: [&str; 4] = [
    "write a rust function that parses json into a struct",
    "fix the compile error in this python function",
    "refactor this rust function to return a result",
    "write a python function that sorts a list of numbers",
];
const TALK: [&str; 4] = [
    "tell me a story about a dragon and a knight",
    "what should i cook for dinner tonight",
    "tell me a joke about cats and dogs",
    "how do i plan a relaxing weekend trip",
];
const CODE_ASK: &str = "write a rust function that reverses a list of numbers";
const TALK_ASK: &str = "tell me a story about a cat and a dragon";

/// Mocks: `code` serves target `coder`, `talk` serves target `chatty` (the default), `emb`
/// serves the embedding model `embed`.
struct World {
    code: MockHandle,
    talk: MockHandle,
    emb: MockHandle,
    gw: Gateway,
}

fn config(code: &MockHandle, talk: &MockHandle, emb: &MockHandle, extra: &str) -> String {
    format!(
        "providers:\n{}{}{}models:\n  coder: {{ deployments: [{{ provider: code, model: up-coder, price: {{ input_per_mtok: 1, output_per_mtok: 1 }} }}] }}\n  chatty: {{ deployments: [{{ provider: talk, model: up-chatty, price: {{ input_per_mtok: 1, output_per_mtok: 1 }} }}] }}\n  embed: {{ deployments: [{{ provider: emb, model: up-embed }}] }}\npolicies:\n  smart: {{ select: [ {{ router: knn, targets: [ {{ model: coder }}, {{ model: chatty }} ], default: chatty }} ] }}\nadmin: {{ token_env: SB_ADMIN }}\nhealth: {{ failure_threshold: 0 }}\n{extra}",
        provider("code", code),
        provider("talk", talk),
        provider("emb", emb),
    )
}

const KNN: &str = "routing_knn: { embedding_model: embed, k: 3, warmup: 4 }\n";

async fn world(extra: &str) -> World {
    let (code, talk, emb) = (mock("code").await, mock("talk").await, mock("emb").await);
    let gw = GatewayBuilder::new(config(&code, &talk, &emb, extra))
        .env("SB_ADMIN", ADMIN)
        .env("SB_ALICE", ALICE)
        .env("SB_BOB", BOB)
        .start();
    World {
        code,
        talk,
        emb,
        gw,
    }
}

fn examples(prompts: &[&str], coder: f64, chatty: f64) -> Vec<Value> {
    prompts
        .iter()
        .map(|p| json!({"prompt": p, "scores": {"coder": coder, "chatty": chatty}}))
        .collect()
}

/// Code prompts scored best on `coder`, the others on `chatty`.
fn lesson() -> Vec<Value> {
    let mut v = examples(&CODE, 0.9, 0.2);
    v.extend(examples(&TALK, 0.2, 0.9));
    v
}

/// An admin read with the token.
async fn admin_get(gw: &Gateway, path: &str) -> Value {
    client()
        .get(format!("http://{}{path}", gw.admin))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn teach(gw: &Gateway, body: &Value) -> reqwest::Response {
    client()
        .post(format!("http://{}/admin/routing/examples", gw.admin))
        .bearer_auth(ADMIN)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn taught(gw: &Gateway, body: Value) -> Value {
    let r = teach(gw, &body).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// Ask `smart` with one user turn (and extra headers); the response.
async fn ask(gw: &Gateway, text: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = client().post(gw.url("/v1/chat/completions")).json(&json!({
        "model": "smart",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}],
    }));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

/// The provider that served, and the routing reason, of a successful answer.
async fn served(gw: &Gateway, text: &str, headers: &[(&str, &str)]) -> (String, String) {
    let r = ask(gw, text, headers).await;
    assert_eq!(r.status(), 200, "{}", header(&r, "x-llm-routing-reason"));
    let out = (
        header(&r, "x-llm-provider").to_string(),
        header(&r, "x-llm-routing-reason").to_string(),
    );
    let _ = r.text().await;
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_pool_routes_code_to_the_coder_and_talk_to_the_other_target() {
    let w = world(KNN).await;
    let v = taught(&w.gw, json!({"examples": lesson()})).await;
    assert_eq!(
        v,
        json!({"stored": 8, "pool": {"policy": "smart", "user": null, "task": null, "examples": 8}})
    );
    assert_eq!(w.emb.calls_to(Endpoint::Embeddings), 1, "one batch");
    let (provider, reason) = served(&w.gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "code", "{reason}");
    assert!(reason.contains("knn=knn pool=shared nn="), "{reason}");
    assert!(reason.contains(" coder:q="), "{reason}");
    let (provider, reason) = served(&w.gw, TALK_ASK, &[]).await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=knn"), "{reason}");
    assert_eq!((w.code.calls(), w.talk.calls()), (1, 1));
    // Each request's last user turn was embedded through the plan (the mock saw it).
    assert_eq!(w.emb.calls_to(Endpoint::Embeddings), 3);
    // The quality ranking shows in the figures: the coder's predicted quality leads for code.
    let q = |reason: &str, name: &str| -> f64 {
        let at = reason.find(&format!(" {name}:q=")).unwrap() + name.len() + 4;
        reason[at..at + 4].parse().unwrap()
    };
    let (_, reason) = served(&w.gw, CODE_ASK, &[]).await;
    assert!(q(&reason, "coder") > q(&reason, "chatty") + 0.3, "{reason}");
    let m =
        w.gw.metrics_with(&["signalbox_knn_decisions_total{outcome=\"knn\",policy=\"smart\"} 3"])
            .await;
    assert!(m.contains("outcome=\"knn\""), "{m}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cold_pool_serves_the_default_without_embedding() {
    let w = world(KNN).await;
    // Three examples: colder than `warmup: 4`.
    taught(&w.gw, json!({"examples": examples(&CODE[..3], 0.9, 0.1)})).await;
    let embeds = w.emb.calls_to(Endpoint::Embeddings);
    let (provider, reason) = served(&w.gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "talk", "the default: {reason}");
    assert!(reason.contains("knn=cold pool=none"), "{reason}");
    assert_eq!(w.code.calls(), 0);
    assert_eq!(
        w.emb.calls_to(Endpoint::Embeddings),
        embeds,
        "a cold pool needs no embedding"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_embedding_model_serves_the_default_and_the_request_still_succeeds() {
    let w = world(KNN).await;
    taught(&w.gw, json!({"examples": lesson()})).await;
    w.emb.set_default(status(500));
    let (provider, reason) = served(&w.gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=embed_failed"), "{reason}");
    assert_eq!(w.code.calls(), 0);
    assert!(w.emb.calls_to(Endpoint::Embeddings) >= 2, "it was asked");
    // Down for good (connections refused): the same.
    w.emb.shutdown();
    let (provider, reason) = served(&w.gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=embed_failed"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn targets_the_examples_cannot_tell_apart_serve_the_default() {
    let w = world(KNN).await;
    let mut lesson = examples(&CODE, 0.6, 0.6);
    lesson.extend(examples(&TALK, 0.6, 0.6));
    taught(&w.gw, json!({"examples": lesson})).await;
    let (provider, reason) = served(&w.gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=low_confidence"), "{reason}");
    assert_eq!(w.code.calls(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn router_off_serves_the_default_without_embedding() {
    let w = world(KNN).await;
    taught(&w.gw, json!({"examples": lesson()})).await;
    let (provider, reason) = served(&w.gw, CODE_ASK, &[("x-llm-router", "off")]).await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=router_off"), "{reason}");
    assert_eq!(w.code.calls(), 0);
    assert_eq!(w.emb.calls_to(Endpoint::Embeddings), 1, "the lesson's only");
    // A request that names a model, not the knn policy, is not embedded either.
    let r = post_chat(&w.gw, &chat("coder")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-llm-provider"), "code");
    assert!(!header(&r, "x-llm-routing-reason").contains("knn="));
    assert_eq!(w.emb.calls_to(Endpoint::Embeddings), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_keeps_its_first_decision_under_conversation_granularity() {
    let w = world(
        "routing_knn: { embedding_model: embed, k: 3, warmup: 4, granularity: conversation }\n",
    )
    .await;
    taught(&w.gw, json!({"examples": lesson()})).await;
    let conv = [("x-llm-conversation-id", "conv-1")];
    let (provider, reason) = served(&w.gw, CODE_ASK, &conv).await;
    assert_eq!(provider, "code", "{reason}");
    // New examples make the same prompt a chatty one: many, identical to the question.
    taught(
        &w.gw,
        json!({"examples": examples(&[CODE_ASK, CODE_ASK, CODE_ASK, CODE_ASK], 0.0, 1.0)}),
    )
    .await;
    let embeds = w.emb.calls_to(Endpoint::Embeddings);
    let (provider, reason) = served(&w.gw, CODE_ASK, &conv).await;
    assert_eq!(provider, "code", "the conversation's decision: {reason}");
    assert!(reason.contains("knn=sticky"), "{reason}");
    assert_eq!(
        w.emb.calls_to(Endpoint::Embeddings),
        embeds,
        "no embedding for it"
    );
    // Another conversation (or none) decides afresh.
    let (provider, reason) = served(&w.gw, CODE_ASK, &[("x-llm-conversation-id", "conv-2")]).await;
    assert_eq!(provider, "talk", "{reason}");
    let (provider, _) = served(&w.gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "talk");
}

#[tokio::test(flavor = "multi_thread")]
async fn pools_are_per_user_and_per_task_with_the_shared_pool_behind_them() {
    let keys = format!(
        "keys:\n  - {{ id: a, key_env: SB_ALICE, user: alice }}\n  - {{ id: b, key_env: SB_BOB, user: bob }}\n{KNN}"
    );
    let w = world(&keys).await;
    // Alice's own pool: code goes to the coder. Bob's: code goes to chatty.
    taught(&w.gw, json!({"user": "alice", "examples": lesson()})).await;
    let mut flipped = examples(&CODE, 0.1, 0.9);
    flipped.extend(examples(&TALK, 0.9, 0.1));
    let v = taught(&w.gw, json!({"user": "bob", "examples": flipped})).await;
    assert_eq!(v["pool"]["user"], "bob");
    let alice = [("authorization", "Bearer sk-alice-knn")];
    let bob = [("authorization", "Bearer sk-bob-knn")];
    let (provider, reason) = served(&w.gw, CODE_ASK, &alice).await;
    assert_eq!(provider, "code", "{reason}");
    assert!(reason.contains("pool=user"), "{reason}");
    let (provider, reason) = served(&w.gw, CODE_ASK, &bob).await;
    assert_eq!(provider, "talk", "{reason}");
    // A task has its own pools: none is warm for `review`, so the default serves.
    let (provider, reason) = served(
        &w.gw,
        CODE_ASK,
        &[alice[0], ("x-llm-router-task", "review")],
    )
    .await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=cold"), "{reason}");
    // The shared pool of that task serves a user without one of their own.
    taught(&w.gw, json!({"task": "review", "examples": lesson()})).await;
    let (provider, reason) =
        served(&w.gw, CODE_ASK, &[bob[0], ("x-llm-router-task", "review")]).await;
    assert_eq!(provider, "code", "{reason}");
    assert!(reason.contains("pool=shared"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn status_never_shows_a_prompt_and_forget_empties_the_pool() {
    let w = world(KNN).await;
    taught(&w.gw, json!({"task": "t1", "examples": lesson()})).await;
    taught(&w.gw, json!({"examples": examples(&CODE[..2], 0.5, 0.5)})).await;
    let status = admin_get(&w.gw, "/admin/routing/status").await;
    assert_eq!(
        status["pools"],
        json!([
            {"policy": "smart", "user": null, "task": null, "examples": 2, "warm": false, "indexed": false},
            {"policy": "smart", "user": null, "task": "t1", "examples": 8, "warm": true, "indexed": false},
        ])
    );
    assert_eq!(status["stored_in"], "memory", "no ledger configured");
    let text = status.to_string();
    for p in CODE.iter().chain(&TALK) {
        assert!(!text.contains(p), "a prompt in the status: {text}");
    }
    let r = client()
        .delete(format!(
            "http://{}/admin/routing/examples?task=t1",
            w.gw.admin
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["forgotten"], 8);
    let status = admin_get(&w.gw, "/admin/routing/status").await;
    assert_eq!(status["pools"].as_array().unwrap().len(), 1);
    let (provider, reason) = served(&w.gw, CODE_ASK, &[("x-llm-router-task", "t1")]).await;
    assert_eq!(provider, "talk", "{reason}");
    assert!(reason.contains("knn=cold"), "{reason}");
    // Writes need the write token.
    let r = client()
        .delete(format!("http://{}/admin/routing/examples", w.gw.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn examples_survive_a_restart_in_the_sqlite_ledger() {
    let (code, talk, emb) = (mock("code").await, mock("talk").await, mock("emb").await);
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!(
        "{KNN}ledger: {{ sqlite: \"{}\" }}\n",
        dir.path().join("ledger.db").display()
    );
    let cfg = config(&code, &talk, &emb, &ledger);
    {
        let gw = GatewayBuilder::new(cfg.clone())
            .env("SB_ADMIN", ADMIN)
            .start();
        taught(&gw, json!({"examples": lesson()})).await;
        let status = admin_get(&gw, "/admin/routing/status").await;
        assert_eq!(status["stored_in"], "sqlite");
    }
    let gw = GatewayBuilder::new(cfg).env("SB_ADMIN", ADMIN).start();
    let status = admin_get(&gw, "/admin/routing/status").await;
    assert_eq!(status["pools"][0]["examples"], 8, "{status}");
    assert_eq!(status["pools"][0]["warm"], true);
    let (provider, reason) = served(&gw, CODE_ASK, &[]).await;
    assert_eq!(provider, "code", "{reason}");
    assert_eq!(code.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_examples_are_a_400_naming_the_path_and_nothing_is_stored() {
    let w = world(KNN).await;
    let cases = [
        (
            json!({"examples": [{"prompt": "x", "scores": {"gpt-9": 0.5}}]}),
            "examples[0].scores.gpt-9",
        ),
        (
            json!({"examples": [{"prompt": "x", "scores": {"coder": 0.5}}, {"prompt": "y", "scores": {"coder": 1.5}}]}),
            "examples[1].scores.coder",
        ),
        (json!({"policy": "nope", "examples": lesson()}), "policy"),
        (json!({"examples": []}), "examples"),
        (
            json!({"examples": [{"prompt": "x", "scores": {"coder": 0.5}, "extra": 1}]}),
            "examples[0]",
        ),
    ];
    for (body, path) in cases {
        let r = teach(&w.gw, &body).await;
        let v = expect_error(r, 400, "invalid_request").await;
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(path), "{path}: {message}");
    }
    let status = admin_get(&w.gw, "/admin/routing/status").await;
    assert_eq!(status["pools"], json!([]));
    assert_eq!(w.emb.calls(), 0, "nothing was embedded");
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_shows_the_neighbours_and_each_targets_figures() {
    let w = world(KNN).await;
    taught(&w.gw, json!({"examples": lesson()})).await;
    let v: Value = client()
        .post(format!("http://{}/admin/explain", w.gw.admin))
        .bearer_auth(ADMIN)
        .json(&json!({"model": "smart", "messages": [{"role": "user", "content": CODE_ASK}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let knn = &v["via"]["knn"];
    assert_eq!(knn["outcome"], "knn", "{v}");
    assert_eq!(knn["neighbours"].as_array().unwrap().len(), 3, "k = 3");
    assert_eq!(knn["targets"][0]["model"], "coder");
    for t in knn["targets"].as_array().unwrap() {
        for f in ["predicted_quality", "cost_term", "utility"] {
            assert!(t[f].is_number(), "{t}");
        }
    }
    assert_eq!(knn["order"], json!(["coder", "chatty"]));
    assert_eq!(v["first"]["candidate"], "code/up-coder", "{v}");
    assert_eq!(
        w.code.calls() + w.talk.calls(),
        0,
        "explain calls no target"
    );
}

#[test]
fn config_errors_name_the_key() {
    let base = "providers:\n  p: { kind: openai, base_url: \"http://127.0.0.1:1/v1\" }\nmodels:\n  a: { deployments: [{ provider: p, model: a, price: { input_per_mtok: 1, output_per_mtok: 1 } }] }\n  b: { deployments: [{ provider: p, model: b, price: { input_per_mtok: 1, output_per_mtok: 1 } }] }\n  free: { deployments: [{ provider: p, model: f }] }\n  e: { deployments: [{ provider: p, model: e }] }\n";
    let knn_policy = "policies:\n  s: { select: [ { router: knn, targets: [ { model: a }, { model: b } ], default: b } ] }\n";
    let errors = |extra: &str| -> Vec<(String, String)> {
        match signalbox::config::parse(&format!("{base}{extra}")) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.into_iter().map(|e| (e.path, e.message)).collect(),
        }
    };
    assert_eq!(
        errors(&format!(
            "{knn_policy}routing_knn: {{ embedding_model: e }}\n"
        )),
        []
    );
    let cases: Vec<(String, &str)> = vec![
        (knn_policy.to_string(), "policies.s.select[0].router"),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: nope }}\n"),
            "routing_knn.embedding_model",
        ),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: e, k: 0 }}\n"),
            "routing_knn.k",
        ),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: e, confidence_floor: 2 }}\n"),
            "routing_knn.confidence_floor",
        ),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: e, alpha: -1 }}\n"),
            "routing_knn.alpha",
        ),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: e, granularity: trace }}\n"),
            "routing_knn.granularity",
        ),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: e, embed_timeout: soon }}\n"),
            "routing_knn.embed_timeout",
        ),
        (
            format!("{knn_policy}routing_knn: {{ embedding_model: e, warmup: 50, max_examples_per_pool: 10 }}\n"),
            "routing_knn.max_examples_per_pool",
        ),
        (
            "policies:\n  s: { select: [ { router: knn, targets: [ { model: a } ], default: zz } ] }\nrouting_knn: { embedding_model: e }\n".to_string(),
            "policies.s.select[0].default",
        ),
        (
            "policies:\n  s: { select: [ { router: knn, targets: [ { model: a } ] } ] }\nrouting_knn: { embedding_model: e }\n".to_string(),
            "policies.s.select[0]",
        ),
        (
            "policies:\n  s: { select: [ { router: priority, targets: [ { model: a } ], default: a } ] }\n".to_string(),
            "policies.s.select[0].default",
        ),
        (
            "policies:\n  s: { select: [ { router: knn, targets: [ { model: a }, { model: free } ], default: a } ] }\nrouting_knn: { embedding_model: e }\n".to_string(),
            "policies.s.select[0].targets",
        ),
    ];
    for (extra, path) in cases {
        let errs = errors(&extra);
        assert!(
            errs.iter().any(|(p, _)| p == path),
            "{path} not among {errs:?}"
        );
    }
    // Unknown keys are refused with their path.
    let errs = errors(&format!(
        "{knn_policy}routing_knn: {{ embedding_model: e, neighbours: 3 }}\n"
    ));
    assert!(
        errs.iter()
            .any(|(p, m)| p.starts_with("routing_knn") && m.contains("neighbours")),
        "{errs:?}"
    );
}
