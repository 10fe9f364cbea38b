//! TLS and HTTP/2 for callers: `listen.proxy_tls` terminates TLS with HTTP/2 or HTTP/1.1 by
//! ALPN, `listen.h2c` accepts cleartext HTTP/2 with prior knowledge; failover, the 1 MiB body
//! replay and SSE streams work over HTTP/2; the certificate store swaps what the next
//! handshake gets.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pki::TestPki;
use common::*;
use futures_util::StreamExt;
use reqwest::Version;
use signalbox_mock::{Behaviour, MockHandle};

/// The names the gateway's test certificates are for.
const LOCAL: &[&str] = &["localhost", "127.0.0.1"];

/// A gateway whose proxy listener terminates TLS with a leaf of `pki`.
fn tls_gateway(pki: &TestPki, config: String) -> Gateway {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = pki.leaf(certs.path(), "proxy", LOCAL);
    let gw = GatewayBuilder::new(config)
        .listen_keys(&format!(
            "proxy_tls: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            cert.display(),
            key.display()
        ))
        .start();
    // The gateway read the files at startup; `certs` may go.
    gw
}

fn https(gw: &Gateway, path: &str) -> String {
    format!("https://localhost:{}{path}", gw.proxy.port())
}

/// Model `m` on a then b.
fn two(a: &MockHandle, b: &MockHandle) -> String {
    format!(
        "providers:\n{}{}models:\n  m:\n    deployments: [{{ provider: a, model: up-m, priority: 1 }}, {{ provider: b, model: up-m, priority: 2 }}]\n",
        provider("a", a),
        provider("b", b),
    )
}

/// A chat body of about `size` bytes, `model` first.
fn big_body(size: usize) -> String {
    let filler: String = "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(size)
        .collect();
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{filler}"}}],"temperature":0.2}}"#
    )
}

fn upstream_sha(body: &str) -> String {
    sha256_hex(
        body.replacen(r#""model":"m""#, r#""model":"up-m""#, 1)
            .as_bytes(),
    )
}

/// POST `body` with an explicit content length.
async fn post(client: &reqwest::Client, url: &str, body: String) -> reqwest::Response {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_serves_http1_and_http2_by_alpn() {
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    let gw = tls_gateway(&pki, two(&a, &b));
    let body = chat("m").to_string();

    let r = post(
        &pki.client(true),
        &https(&gw, "/v1/chat/completions"),
        body.clone(),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(r.version(), Version::HTTP_11);
    assert_eq!(header(&r, "x-llm-provider"), "a");

    let h2 = pki.client(false);
    let r = post(&h2, &https(&gw, "/v1/chat/completions"), body).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(r.version(), Version::HTTP_2, "ALPN chose HTTP/2");
    assert_eq!(header(&r, "x-llm-provider"), "a");
    assert_eq!(header(&r, "x-llm-attempts"), "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["model"], "m");
    // Signalbox's own answers go out over HTTP/2 too.
    let r = h2.get(https(&gw, "/v1/models")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_2));
    let r = h2.get(https(&gw, "/nope")).send().await.unwrap();
    assert_eq!(r.version(), Version::HTTP_2);
    expect_error(r, 404, "not_found").await;
    // Plaintext HTTP on the TLS port is not served.
    let plain = client()
        .post(format!(
            "http://127.0.0.1:{}/v1/chat/completions",
            gw.proxy.port()
        ))
        .json(&chat("m"))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // An HTTP/1.1 request over TLS from a client trusting another CA is refused at the handshake.
    let other = TestPki::new();
    let r = other
        .client(true)
        .get(https(&gw, "/v1/models"))
        .send()
        .await;
    assert!(r.is_err(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_with_prior_knowledge_when_enabled_only() {
    let (a, b) = (mock("a").await, mock("b").await);
    let prior = reqwest::Client::builder()
        .http2_prior_knowledge()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let gw = GatewayBuilder::new(two(&a, &b))
        .listen_keys("h2c: true")
        .start();
    let r = prior
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("m"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(r.version(), Version::HTTP_2);
    assert_eq!(header(&r, "x-llm-provider"), "a");
    // HTTP/1.1 still works on the same listener.
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_11));
    drop(gw);

    // Off (the default): the preface is not HTTP/1.1, so the connection is refused, and
    // HTTP/1.1 is served as before.
    let gw = Gateway::start(two(&a, &b));
    let r = prior
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("m"))
        .send()
        .await;
    assert!(r.is_err(), "h2c must be off by default: {r:?}");
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_11));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_fails_over_and_streams_over_http2() {
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(status(503));
    b.set_default(Behaviour::Stream {
        chunks: 5,
        gap_ms: 150,
    });
    let gw = tls_gateway(&pki, two(&a, &b));
    let body = serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let sent = Instant::now();
    let r = post(
        &pki.client(false),
        &https(&gw, "/v1/chat/completions"),
        body.to_string(),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(r.version(), Version::HTTP_2);
    assert_eq!(header(&r, "content-type"), "text/event-stream");
    assert_eq!(header(&r, "x-llm-provider"), "b");
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(header(&r, "x-llm-fallback"), "true");
    let mut chunks = Vec::new();
    let mut stream = r.bytes_stream();
    while let Some(item) = stream.next().await {
        chunks.push((Instant::now(), item.unwrap().to_vec()));
    }
    let text = String::from_utf8(chunks.iter().flat_map(|(_, c)| c.clone()).collect()).unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| e.starts_with("data: "))
        .collect();
    assert_eq!(
        events.len(),
        8,
        "the role-only chunk, 5 content events, the final one, [DONE]: {text}"
    );
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    for (i, e) in events[..7].iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(&e["data: ".len()..]).unwrap();
        assert_eq!(v["model"], "m", "the caller's name in every chunk: {e}");
        let delta = &v["choices"][0]["delta"];
        assert_eq!(i == 0, delta.get("role").is_some(), "the role leads: {e}");
    }
    // Streamed as produced (about 6 gaps of 150 ms), not buffered to the end.
    let first = chunks.first().unwrap().0.duration_since(sent);
    let last = chunks.last().unwrap().0.duration_since(sent);
    assert!(
        first < Duration::from_millis(400),
        "first chunk after {first:?}"
    );
    assert!(
        last >= Duration::from_millis(750),
        "last chunk after {last:?}"
    );
    assert!(chunks.len() >= 5, "received in {} pieces", chunks.len());
    assert_eq!(a.calls(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_one_mib_body_fails_over_byte_identical_over_http2() {
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(status(503));
    let tls = tls_gateway(&pki, two(&a, &b));
    let h2c = GatewayBuilder::new(two(&a, &b))
        .listen_keys("h2c: true")
        .start();
    let prior = reqwest::Client::builder()
        .http2_prior_knowledge()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let body = big_body(1 << 20);
    let expected = upstream_sha(&body);
    for (name, client, url) in [
        (
            "tls",
            pki.client(false),
            https(&tls, "/v1/chat/completions"),
        ),
        ("h2c", prior, h2c.url("/v1/chat/completions")),
    ] {
        a.reset();
        b.reset();
        a.set_default(status(503));
        let r = post(&client, &url, body.clone()).await;
        assert_eq!(r.status(), 200, "{name}: {}{}", tls.stderr(), h2c.stderr());
        assert_eq!(r.version(), Version::HTTP_2, "{name}");
        assert_eq!(header(&r, "x-llm-provider"), "b", "{name}");
        assert_eq!(header(&r, "x-llm-attempts"), "2", "{name}");
        for m in [&a, &b] {
            let reqs = m.requests();
            assert_eq!(reqs.len(), 1, "{name}: {}", m.name());
            assert_eq!(reqs[0].body_len, body.len() + 3, "{name}: {}", m.name());
            assert_eq!(
                reqs[0].body_sha256,
                expected,
                "{name}: {} got different bytes",
                m.name()
            );
        }
    }
}

/// An HTTP/2 request body need not declare its length (no `content-length`, and HTTP/2 has
/// no chunked coding): treated like a chunked HTTP/1.1 body, replayed up to 64 KiB, 411 above.
#[tokio::test(flavor = "multi_thread")]
async fn an_http2_body_without_a_length_is_handled_like_a_chunked_one() {
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(status(503));
    let gw = tls_gateway(&pki, two(&a, &b));
    let streamed = |body: String| {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body
            .into_bytes()
            .chunks(4096)
            .map(|c| Ok(c.to_vec()))
            .collect();
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    };
    let client = pki.client(false);
    let small = big_body(40 << 10);
    let r = client
        .post(https(&gw, "/v1/chat/completions"))
        .body(streamed(small.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), Version::HTTP_2);
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    let got = &b.requests()[0];
    assert!(
        a.requests()[0].header("content-length").is_some(),
        "the upstream request declares its length"
    );
    assert_eq!(got.body_sha256, upstream_sha(&small));

    // Past Pingora's retry buffer: the hold path replays it, over HTTP/2 as over HTTP/1.1.
    let large = big_body(1 << 20);
    let r = client
        .post(https(&gw, "/v1/chat/completions"))
        .body(streamed(large.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-attempts"), "2");
    assert_eq!(b.requests()[1].body_sha256, upstream_sha(&large));
    assert_eq!(a.requests()[1].body_sha256, upstream_sha(&large));
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_http2_over_tls_with_failover() {
    let version = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !version.contains("HTTP2") {
        skip_unless_ci(&format!(
            "`curl --version` lists no HTTP2 feature:\n{version}"
        ));
        return;
    }
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(status(503));
    let gw = tls_gateway(&pki, two(&a, &b));
    let ca = pki.write_ca(gw.config_dir());
    let body = big_body(1 << 20);
    let path = gw.config_dir().join("body.json");
    std::fs::write(&path, &body).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "--http2", "-i", "--cacert"])
        .arg(&ca)
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(format!("@{}", path.display()))
        .args(["-w", "\nhttp_version=%{http_version}"])
        .arg(https(&gw, "/v1/chat/completions"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.stderr()
    );
    assert!(text.starts_with("HTTP/2 200"), "curl saw: {text}");
    assert!(text.ends_with("http_version=2"), "{text}");
    assert!(text.contains("x-llm-attempts: 2"), "{text}");
    assert!(text.contains("x-llm-provider: b"), "{text}");
    assert_eq!(b.requests()[0].body_sha256, upstream_sha(&body));
}

/// Pingora's rustls listener consults the store at every handshake: a swap changes the
/// certificate the next connection gets (what a config reload does), with no restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_swap_applies_to_the_next_handshake() {
    use pingora_core::listeners::tls::TlsSettings;
    use signalbox::server_tls::{CertStore, ServerCert};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (TestPki::new(), TestPki::new());
    let (c1, k1) = one.leaf(dir.path(), "one", LOCAL);
    let (c2, k2) = two.leaf(dir.path(), "two", LOCAL);
    let store = Arc::new(CertStore::load(&c1, &k1).unwrap());
    let mut settings = TlsSettings::intermediate("", "").unwrap();
    settings.set_cert_resolver(store.clone());
    settings.enable_h2();
    let acceptor = Arc::new(settings.build());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let stream: pingora_core::protocols::l4::stream::Stream = tcp.into();
                let Ok(mut tls) = acceptor.tls_handshake(stream).await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = tls.read(&mut buf).await;
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = tls.flush().await;
            });
        }
    });
    let url = format!("https://localhost:{port}/");
    let works = |pki: &TestPki| {
        let c = pki.client(true);
        let url = url.clone();
        async move { c.get(url).send().await.is_ok() }
    };
    assert!(works(&one).await && !works(&two).await);
    store.swap(&ServerCert::load(&c2, &k2).unwrap());
    assert!(works(&two).await && !works(&one).await);
    // A failed re-read keeps the current certificate.
    assert!(store.reload(&c2, &k1).is_err());
    assert!(works(&two).await);
}

/// After the first byte there is no failover over HTTP/2 either: a stream that breaks ends
/// with signalbox's error event and no `[DONE]`, and the chunks relayed before it arrive
/// (an HTTP/2 stream reset would discard whatever DATA was still queued).
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_stream_ends_with_an_error_event_over_http2() {
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    a.set_default(Behaviour::MidStreamDeath { after_chunks: 2 });
    let gw = tls_gateway(&pki, two(&a, &b));
    let body = serde_json::json!({"model": "m", "stream": true, "messages": []});
    // Twice (the breaker ejects `a` at its third failure).
    for _ in 0..2 {
        let r = post(
            &pki.client(false),
            &https(&gw, "/v1/chat/completions"),
            body.to_string(),
        )
        .await;
        assert_eq!((r.status().as_u16(), r.version()), (200, Version::HTTP_2));
        let mut text = Vec::new();
        let mut stream = r.bytes_stream();
        while let Some(Ok(c)) = stream.next().await {
            text.extend_from_slice(&c);
        }
        let text = String::from_utf8(text).unwrap();
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| e.starts_with("data: "))
            .collect();
        assert_eq!(
            events.len(),
            4,
            "the role-only chunk, two content chunks and the error event: {text}"
        );
        let last: serde_json::Value = serde_json::from_str(&events[3]["data: ".len()..]).unwrap();
        assert_eq!(last["error"]["code"], "upstream_stream_interrupted");
        assert!(!text.contains("[DONE]"));
    }
    assert_eq!(b.calls(), 0, "no attempt after the first byte");
}

/// The leaf a TLS handshake with the gateway presents (DER).
async fn presented_leaf(pki: &TestPki, gw: &Gateway) -> Vec<u8> {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap())
        .tls_info(true)
        .build()
        .unwrap();
    let r = client.get(https(gw, "/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .unwrap()
        .to_vec()
}

fn der_of(pem_file: &Path) -> Vec<u8> {
    let pem = std::fs::read(pem_file).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    pem.contents
}

/// A reload re-reads the certificate files: the next handshake presents the new leaf, with
/// no restart. Files that do not hold a matching pair are refused and the current certificate
/// stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_re_reads_the_certificate() {
    let pki = TestPki::new();
    let (a, b) = (mock("a").await, mock("b").await);
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = pki.leaf(certs.path(), "proxy", LOCAL);
    let gw = GatewayBuilder::new(two(&a, &b))
        .listen_keys(&format!(
            "proxy_tls: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            cert.display(),
            key.display()
        ))
        .start();
    let first = der_of(&cert);
    assert_eq!(presented_leaf(&pki, &gw).await, first);

    // Rotated in place (as certbot or an operator would), then SIGHUP.
    let g0 = gw.generation();
    pki.leaf(certs.path(), "proxy", LOCAL);
    let second = der_of(&cert);
    assert_ne!(first, second);
    gw.signal("HUP");
    gw.wait_generation(g0 + 1).await;
    assert_eq!(presented_leaf(&pki, &gw).await, second);

    // A key that does not belong to the certificate: refused, the current one stays.
    let other = tempfile::tempdir().unwrap();
    let (_, other_key) = pki.leaf(other.path(), "other", LOCAL);
    std::fs::copy(&other_key, &key).unwrap();
    gw.signal("HUP");
    let m = gw
        .metrics_with(&[r#"signalbox_config_reloads_total{result="rejected"} 1"#])
        .await;
    assert!(
        m.contains(r#"signalbox_config_reloads_total{result="rejected"} 1"#),
        "{m}"
    );
    assert_eq!(gw.generation(), g0 + 1);
    assert_eq!(presented_leaf(&pki, &gw).await, second);
}
