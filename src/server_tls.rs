//! TLS on the proxy listener (`listen.proxy_tls`): the certificate chain and private key,
//! loaded from PEM files and checked against each other, and the store every TLS handshake
//! reads them from, swappable while the process runs.
//!
//! Pingora 0.9.1's rustls listener (`TlsSettings::set_cert_resolver`) takes a rustls
//! [`ResolvesServerCert`]; [`CertStore`] is that resolver, its [`CertifiedKey`] in an
//! [`ArcSwap`]. A config reload validates the new config (which loads and checks its files
//! into a [`ServerCert`]) and calls [`CertStore::swap`]: the next handshake gets the new
//! certificate, connections already open keep theirs. The ALPN list, TLS versions and cipher
//! suites are fixed when the listener is built; only the certificate is swapped.
//!
//! A leaf module: config validation loads with it, the server builds the listener with it.

use std::fmt;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why a certificate or key file cannot be served. Each message names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsFileError {
    /// The certificate file is unreadable, not PEM, or holds no usable certificate.
    #[error("{0}")]
    Cert(String),
    /// The key file is unreadable, not PEM, or holds no usable private key.
    #[error("{0}")]
    Key(String),
    /// Both files load, but the key is not the certificate's.
    #[error("{0}")]
    Mismatch(String),
}

/// A certificate chain (leaf first) with its private key, checked to belong together.
/// `Debug` shows no key material.
#[derive(Clone)]
pub struct ServerCert(Arc<CertifiedKey>);

impl fmt::Debug for ServerCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerCert")
            .field("chain_len", &self.0.cert.len())
            .finish_non_exhaustive()
    }
}

impl ServerCert {
    /// Load a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or
    /// SEC1), and check that the key is the leaf certificate's.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, TlsFileError> {
        let cert_pem = std::fs::read(cert_file)
            .map_err(|e| TlsFileError::Cert(format!("cannot read {}: {e}", cert_file.display())))?;
        let key_pem = std::fs::read(key_file)
            .map_err(|e| TlsFileError::Key(format!("cannot read {}: {e}", key_file.display())))?;
        Self::from_pem(&cert_pem, &key_pem, cert_file, key_file)
    }

    /// As [`ServerCert::load`], from PEM text; the paths only name the sources in errors.
    pub fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        cert_file: &Path,
        key_file: &Path,
    ) -> Result<Self, TlsFileError> {
        let chain = rustls_pemfile::certs(&mut BufReader::new(cert_pem))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsFileError::Cert(format!("bad PEM in {}: {e}", cert_file.display())))?;
        let Some(leaf) = chain.first() else {
            return Err(TlsFileError::Cert(format!(
                "{} holds no PEM certificate",
                cert_file.display()
            )));
        };
        x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| {
            TlsFileError::Cert(format!("bad certificate in {}: {e}", cert_file.display()))
        })?;
        let key = rustls_pemfile::private_key(&mut BufReader::new(key_pem))
            .map_err(|e| TlsFileError::Key(format!("bad PEM in {}: {e}", key_file.display())))?
            .ok_or_else(|| {
                TlsFileError::Key(format!(
                    "{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                    key_file.display()
                ))
            })?;
        let provider = rustls::crypto::ring::default_provider();
        let signing_key = provider.key_provider.load_private_key(key).map_err(|e| {
            TlsFileError::Key(format!(
                "unusable private key in {}: {e}",
                key_file.display()
            ))
        })?;
        let certified = CertifiedKey::new(chain, signing_key);
        match certified.keys_match() {
            Ok(()) => Ok(Self(Arc::new(certified))),
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                Err(TlsFileError::Mismatch(format!(
                    "the private key in {} does not match the certificate in {}",
                    key_file.display(),
                    cert_file.display()
                )))
            }
            Err(e) => Err(TlsFileError::Mismatch(format!(
                "cannot check the private key in {} against the certificate in {}: {e}",
                key_file.display(),
                cert_file.display()
            ))),
        }
    }
}

/// The certificate the proxy listener presents, replaceable at runtime. Install it once with
/// `TlsSettings::set_cert_resolver`; call [`CertStore::swap`] on reload.
#[derive(Debug)]
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
}

impl CertStore {
    pub fn new(cert: &ServerCert) -> Self {
        Self {
            current: ArcSwap::new(cert.0.clone()),
        }
    }

    /// A store serving the key pair in these files (see [`ServerCert::load`]).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, TlsFileError> {
        ServerCert::load(cert_file, key_file).map(|c| Self::new(&c))
    }

    /// Serve `cert` from the next handshake on; connections already established keep the
    /// certificate they were given.
    pub fn swap(&self, cert: &ServerCert) {
        self.current.store(cert.0.clone());
    }

    /// Re-read the files and swap; on an error the current certificate stays.
    pub fn reload(&self, cert_file: &Path, key_file: &Path) -> Result<(), TlsFileError> {
        let cert = ServerCert::load(cert_file, key_file)?;
        self.swap(&cert);
        Ok(())
    }

    /// Whether `cert` is the one served now (same loaded key pair).
    pub fn serves(&self, cert: &ServerCert) -> bool {
        Arc::ptr_eq(&self.current.load(), &cert.0)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn load(cert: &str, key: &str) -> Result<ServerCert, TlsFileError> {
        ServerCert::from_pem(
            cert.as_bytes(),
            key.as_bytes(),
            Path::new("c.pem"),
            Path::new("k.pem"),
        )
    }

    #[test]
    fn a_matching_pair_loads_and_a_foreign_key_is_refused() {
        let (cert_a, key_a) = pair("a.test");
        let (_, key_b) = pair("b.test");
        assert!(load(&cert_a, &key_a).is_ok());
        let e = load(&cert_a, &key_b).unwrap_err();
        assert!(matches!(e, TlsFileError::Mismatch(_)), "{e:?}");
        assert!(e.to_string().contains("k.pem does not match"), "{e}");
    }

    #[test]
    fn missing_or_swapped_contents_name_the_file() {
        let (cert, key) = pair("a.test");
        let e = load("", &key).unwrap_err();
        assert!(
            matches!(e, TlsFileError::Cert(ref m) if m.contains("c.pem holds no PEM certificate"))
        );
        let e = load(&cert, &cert).unwrap_err();
        assert!(
            matches!(e, TlsFileError::Key(ref m) if m.contains("k.pem holds no PEM private key"))
        );
        let e = ServerCert::load(Path::new("/nonexistent/c.pem"), Path::new("k.pem")).unwrap_err();
        assert!(
            matches!(e, TlsFileError::Cert(ref m) if m.contains("cannot read /nonexistent/c.pem"))
        );
    }

    #[test]
    fn swap_changes_what_handshakes_get() {
        let (cert_a, key_a) = pair("a.test");
        let (cert_b, key_b) = pair("b.test");
        let a = load(&cert_a, &key_a).unwrap();
        let b = load(&cert_b, &key_b).unwrap();
        let store = CertStore::new(&a);
        assert!(store.serves(&a));
        store.swap(&b);
        assert!(store.serves(&b) && !store.serves(&a));
    }
}
