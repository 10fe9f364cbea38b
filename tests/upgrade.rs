//! Graceful binary upgrade, scripted: a slow stream is in flight on the old process while a
//! new one takes the listeners; the stream ends whole on the old process, new requests land
//! on the new one, and the old process leaves once drained. Both ways in: Pingora's own
//! (`-u`, then `SIGQUIT` to the old) and the `SIGUSR2` the systemd unit documents.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use signalbox_mock::{MockHandle, StreamShape};

/// Chunks of the slow stream: 40 × 250 ms outlasts Pingora's five seconds of overlap, when
/// both processes accept, with time to spare.
const CHUNKS: usize = 40;

async fn slow_provider() -> MockHandle {
    mock_with("a", |c| {
        c.stream = StreamShape {
            chunks: CHUNKS,
            gap: Duration::from_millis(250),
        }
    })
    .await
}

fn start(a: &MockHandle) -> Gateway {
    GatewayBuilder::new(format!(
        "providers:\n{}models:\n  ma: {{ deployments: [{{ provider: a, model: up-a }}] }}\n",
        provider("a", a)
    ))
    .grace(60)
    .start()
}

async fn open_stream(gw: &Gateway) -> (reqwest::Response, String) {
    let mut body = chat("ma");
    body["stream"] = serde_json::json!(true);
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Flowing: the first chunk is here.
    let first = r.chunk().await.unwrap().unwrap();
    (r, String::from_utf8_lossy(&first).into_owned())
}

/// Poll until `f` holds (a deadline, not a sleep).
async fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The rest of the stream: every event, then the terminator.
async fn finish((mut r, mut text): (reqwest::Response, String)) {
    while let Some(c) = r.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // The role-only chunk, every content event and the final one.
    assert_eq!(text.matches("data: {").count(), 1 + CHUNKS + 1, "{text}");
    assert!(
        text.starts_with("data: {")
            && text.contains(r#""delta":{"role":"assistant","content":""}"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pingora_upgrade_keeps_the_stream_and_moves_new_requests() {
    let a = slow_provider().await;
    let mut old = start(&a);
    let stream = open_stream(&old).await;

    // The new process waits for the sockets; SIGQUIT makes the old one send them.
    let new = old.spawn_upgrade();
    old.signal("QUIT");
    // Pingora lets both processes accept for five seconds, then the old one stops.
    until(
        "the old process to stop accepting",
        Duration::from_secs(15),
        || old.stderr().contains("shutting down: draining"),
    )
    .await;

    // The old process no longer accepts: new requests land on the new one.
    assert_eq!(old.serving_pid(), Some(new.child.id()));
    for _ in 0..5 {
        let r = post_chat(&old, &chat("ma")).await;
        assert_eq!(r.status(), 200);
        let id = header(&r, "x-request-id").to_string();
        let _ = r.text().await;
        until(
            "the new process's access line",
            Duration::from_secs(5),
            || new.stderr().contains(&id),
        )
        .await;
        assert!(!old.stderr().contains(&id));
    }

    // The stream ends whole on the old process, which then leaves by itself, well before
    // its 60 s grace period.
    finish(stream).await;
    let status = old
        .wait_exit(Duration::from_secs(20))
        .expect("old process drained and exited");
    assert!(status.success(), "{status}");
    assert!(old.stderr().contains("drained: exiting"));
    assert_eq!(post_chat(&old, &chat("ma")).await.status(), 200);
    assert_eq!(old.serving_pid(), Some(new.child.id()));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigusr2_upgrades_to_the_installed_binary() {
    let a = slow_provider().await;
    let mut old = start(&a);
    let old_pid = old.pid();
    let stream = open_stream(&old).await;

    old.signal("USR2");
    let log = old.stderr_with("upgrade: new process started").await;
    let line = log
        .lines()
        .find(|l| l.contains("upgrade: new process started"))
        .unwrap_or_else(|| panic!("{log}"));
    let new_pid: u32 = line
        .split("pid=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let _new = KillOnDrop(new_pid);
    assert_ne!(new_pid, old_pid);
    // Pingora lets both processes accept for five seconds, then the old one stops.
    until(
        "the old process to stop accepting",
        Duration::from_secs(15),
        || old.stderr().contains("shutting down: draining"),
    )
    .await;

    assert_eq!(old.serving_pid(), Some(new_pid));
    assert_eq!(post_chat(&old, &chat("ma")).await.status(), 200);
    finish(stream).await;
    let status = old
        .wait_exit(Duration::from_secs(20))
        .expect("old process drained and exited");
    assert!(status.success(), "{status}");
    // Only the new process is left, and it serves.
    assert_eq!(old.serving_pid(), Some(new_pid));
    assert_eq!(post_chat(&old, &chat("ma")).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigusr2_with_a_config_the_binary_rejects_changes_nothing() {
    let a = mock("a").await;
    let old = start(&a);
    let path = old.config_path();
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        good.replace("model: up-a", "model: up-a, colour: red"),
    )
    .unwrap();
    old.signal("USR2");
    let log = old.stderr_with("upgrade refused").await;
    assert!(log.contains("upgrade refused"), "{log}");
    assert!(log.contains("colour"), "the refusal says why: {log}");
    assert!(!log.contains("upgrade: new process started"));
    assert_eq!(old.serving_pid(), Some(old.pid()));
    assert_eq!(post_chat(&old, &chat("ma")).await.status(), 200);
}
