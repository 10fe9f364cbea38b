//! A test certificate authority: leaf certificates it signs for TLS mocks and the gateway's
//! TLS listener, and clients that trust only it.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct TestPki {
    pub ca_pem: String,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl TestPki {
    pub fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "signalbox test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = params.self_signed(&ca_key).unwrap();
        Self {
            ca_pem: ca_cert.pem(),
            ca_cert,
            ca_key,
        }
    }

    /// Write a leaf for `names` (DNS names or IP addresses) and its key into `dir`, as
    /// `{stem}.crt` and `{stem}.key` (a second call with the same stem replaces both).
    pub fn leaf(&self, dir: &Path, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        let (c, k) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    /// The CA certificate as `dir/ca.pem`.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let p = dir.join("ca.pem");
        std::fs::write(&p, &self.ca_pem).unwrap();
        p
    }

    /// A client trusting only this CA; `http1` limits ALPN to HTTP/1.1.
    pub fn client(&self, http1: bool) -> reqwest::Client {
        let b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap())
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(30));
        let b = if http1 { b.http1_only() } else { b };
        b.build().unwrap()
    }
}
