//! TLS to providers: SNI and certificate verification against a provider's `ca_file` (or the
//! system roots), tested with a local TLS mock whose certificate a test CA signed.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::pki::TestPki;
use common::*;
use signalbox_mock::{MockHandle, TlsFiles};

/// A leaf for `name` that a TLS mock serves.
fn leaf(pki: &TestPki, dir: &Path, name: &str) -> TlsFiles {
    let (cert_chain_pem, key_pem) = pki.leaf(dir, name, &[name]);
    TlsFiles {
        cert_chain_pem,
        key_pem,
    }
}

async fn tls_mock(name: &str, files: TlsFiles) -> MockHandle {
    mock_with(name, |c| c.tls = Some(files)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn verified_tls_with_a_provider_ca_and_sni() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let good = tls_mock("good", leaf(&pki, dir.path(), "localhost")).await;
    let text = format!(
        "providers:\n  secure: {{ kind: openai, base_url: \"https://localhost:{}/v1\", ca_file: \"{}\" }}\nmodels:\n  m: {{ deployments: [{{ provider: secure, model: x }}] }}\n",
        good.addr().port(),
        ca.display(),
    );
    let gw = Gateway::start(text);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "secure");
    let host = format!("localhost:{}", good.addr().port());
    assert_eq!(good.requests()[0].header("host"), Some(host.as_str()));
    // Streams work over TLS too.
    let body = serde_json::json!({"model": "m", "stream": true, "messages": []});
    let text = post_chat(&gw, &body).await.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_that_does_not_match_is_refused_and_failed_over() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    // Signed by the trusted CA, but for another name.
    let wrong_name = tls_mock("wrong-name", leaf(&pki, dir.path(), "other.example")).await;
    // The right name, but the provider trusts only the system roots.
    let unknown_ca = tls_mock("unknown-ca", leaf(&pki, dir.path(), "localhost")).await;
    let fallback = mock("fallback").await;
    let text = format!(
        "providers:\n  wrong: {{ kind: openai, base_url: \"https://localhost:{}/v1\", ca_file: \"{}\", priority: 1 }}\n  system: {{ kind: openai, base_url: \"https://localhost:{}/v1\", priority: 2 }}\n{}\
models:\n  m: {{ deployments: [{{ provider: wrong, model: x }}, {{ provider: system, model: x }}, {{ provider: plain, model: x, priority: 3 }}] }}\n  only-wrong: {{ deployments: [{{ provider: wrong, model: x }}] }}\n",
        wrong_name.addr().port(),
        ca.display(),
        unknown_ca.addr().port(),
        provider("plain", &fallback),
    );
    let gw = Gateway::start(text);
    let r = post_chat(&gw, &chat("m")).await;
    assert_eq!(r.status(), 200, "{}", gw.stderr());
    assert_eq!(header(&r, "x-llm-provider"), "plain");
    assert_eq!(header(&r, "x-llm-attempts"), "3");
    assert_eq!(
        wrong_name.calls(),
        0,
        "no request went over an unverified connection"
    );
    assert_eq!(
        unknown_ca.calls(),
        0,
        "no request went over an unverified connection"
    );
    let expected = [r#"signalbox_attempts_total{provider="wrong",outcome="tls_error"} 1"#];
    let m = gw.metrics_with(&expected).await;
    assert!(m.contains(expected[0]), "{m}");
    assert!(
        m.contains(r#"signalbox_attempts_total{provider="system",outcome="tls_error"} 1"#),
        "{m}"
    );

    let r = post_chat(&gw, &chat("only-wrong")).await;
    expect_error(r, 502, "upstream_error").await;
}
