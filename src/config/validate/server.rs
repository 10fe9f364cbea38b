//! The server process: `listen` (where signalbox accepts traffic) and `pingora` (the subset
//! of Pingora's own server settings signalbox exposes, passed on as written once checked).

use std::path::PathBuf;

use crate::config::schema::{ListenSection, PingoraSection, ProxyTlsSection};
use crate::config::types::{Listen, ProxyTls};
use crate::config::values::check_listen_addr;
use crate::config::ConfigError;
use crate::server_tls::{ServerCert, TlsFileError};

pub(super) fn validate_listen(l: &ListenSection, errs: &mut Vec<ConfigError>) -> Listen {
    let proxy_tls = l
        .proxy_tls
        .as_ref()
        .and_then(|t| validate_proxy_tls(t, errs));
    if l.h2c && l.proxy_tls.is_some() {
        errs.push(ConfigError::new(
            "listen.h2c",
            "applies to a plaintext proxy listener only; with listen.proxy_tls, HTTP/2 is negotiated by ALPN",
        ));
    }
    Listen {
        proxy: check_listen_addr(&l.proxy, "listen.proxy", errs),
        admin: check_listen_addr(&l.admin, "listen.admin", errs),
        proxy_tls,
        h2c: l.h2c,
    }
}

/// Load the certificate and key now: a config that validates is one whose certificate the
/// listener can serve.
fn validate_proxy_tls(t: &ProxyTlsSection, errs: &mut Vec<ConfigError>) -> Option<ProxyTls> {
    let mut ok = true;
    for (value, key) in [
        (&t.cert_file, "listen.proxy_tls.cert_file"),
        (&t.key_file, "listen.proxy_tls.key_file"),
    ] {
        if value.trim().is_empty() {
            errs.push(ConfigError::new(key, "must name a PEM file"));
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    let (cert_file, key_file) = (PathBuf::from(&t.cert_file), PathBuf::from(&t.key_file));
    match ServerCert::load(&cert_file, &key_file) {
        Ok(cert) => Some(ProxyTls {
            cert_file,
            key_file,
            cert,
        }),
        Err(e) => {
            let key = match e {
                TlsFileError::Cert(_) => "listen.proxy_tls.cert_file",
                TlsFileError::Key(_) | TlsFileError::Mismatch(_) => "listen.proxy_tls.key_file",
            };
            errs.push(ConfigError::new(key, e.to_string()));
            None
        }
    }
}

pub(super) fn validate_pingora(p: &PingoraSection, errs: &mut Vec<ConfigError>) {
    if p.threads == Some(0) {
        errs.push(ConfigError::new("pingora.threads", "must be at least 1"));
    }
    if p.listener_tasks_per_fd == Some(0) {
        errs.push(ConfigError::new(
            "pingora.listener_tasks_per_fd",
            "must be at least 1",
        ));
    }
    if let Some(ca) = &p.ca_file {
        if !std::path::Path::new(ca).is_file() {
            errs.push(ConfigError::new(
                "pingora.ca_file",
                format!("{ca:?} is not a readable file"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    const MINIMAL: &str = "providers:\n  a: { kind: openai, base_url: \"http://127.0.0.1:9001/v1\" }\nmodels:\n  m: { deployments: [{ provider: a, model: up-m }] }\n";

    fn errors(listen: &str) -> Vec<String> {
        match parse(&format!("listen: {listen}\n{MINIMAL}")) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    /// A self-signed certificate for `name` and its key, written into `dir`.
    fn write_pair(dir: &std::path::Path, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c.display().to_string(), k.display().to_string())
    }

    #[test]
    fn tls_and_h2c_default_off() {
        let c = parse(MINIMAL).unwrap();
        assert!(c.listen.proxy_tls.is_none());
        assert!(!c.listen.h2c);
        let c = parse(&format!("listen: {{ h2c: true }}\n{MINIMAL}")).unwrap();
        assert!(c.listen.h2c);
    }

    #[test]
    fn proxy_tls_loads_a_matching_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write_pair(dir.path(), "localhost");
        let text = format!(
            "listen: {{ proxy_tls: {{ cert_file: \"{cert}\", key_file: \"{key}\" }} }}\n{MINIMAL}"
        );
        let c = parse(&text).unwrap();
        let tls = c.listen.proxy_tls.unwrap();
        assert_eq!(tls.cert_file.display().to_string(), cert);
    }

    #[test]
    fn proxy_tls_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = write_pair(dir.path(), "one");
        let (_, other_key) = write_pair(dir.path(), "two");
        let e = errors(&format!(
            "{{ proxy_tls: {{ cert_file: \"{cert}\", key_file: \"{other_key}\" }} }}"
        ));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("listen.proxy_tls.key_file: the private key in")
                && e[0].contains("does not match the certificate in"),
            "{e:?}"
        );
        let e = errors(&format!(
            "{{ proxy_tls: {{ cert_file: \"/nonexistent.crt\", key_file: \"{other_key}\" }} }}"
        ));
        assert!(
            e[0].starts_with("listen.proxy_tls.cert_file: cannot read /nonexistent.crt"),
            "{e:?}"
        );
        let e = errors(&format!(
            "{{ proxy_tls: {{ cert_file: \"{cert}\", key_file: \"{cert}\" }} }}"
        ));
        assert!(
            e[0].starts_with("listen.proxy_tls.key_file:") && e[0].contains("no PEM private key"),
            "{e:?}"
        );
        let e = errors(&format!("{{ proxy_tls: {{ cert_file: \"{cert}\" }} }}"));
        assert!(
            e[0].starts_with("listen.proxy_tls: missing field `key_file`"),
            "{e:?}"
        );
        let e = errors(&format!(
            "{{ proxy_tls: {{ cert_file: \"{cert}\", key_file: \"{other_key}\", ca: x }} }}"
        ));
        assert!(
            e[0].starts_with("listen.proxy_tls.ca: unknown field `ca`"),
            "{e:?}"
        );
    }

    #[test]
    fn h2c_with_tls_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write_pair(dir.path(), "localhost");
        let e = errors(&format!(
            "{{ h2c: true, proxy_tls: {{ cert_file: \"{cert}\", key_file: \"{key}\" }} }}"
        ));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("listen.h2c: applies to a plaintext"),
            "{e:?}"
        );
    }
}
