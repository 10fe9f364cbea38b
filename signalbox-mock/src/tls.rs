//! The connections the mock serves ([`MockIo`]: plain TCP or TLS over TCP), and the TLS
//! acceptor, built from PEM files with the ring provider (no process-global crypto provider
//! needed).

use std::fs::File;
use std::io::{self, BufReader};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::TlsFiles;

/// A connection the mock serves: plain TCP or TLS over TCP.
pub(super) trait MockIo:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send
{
    /// The underlying TCP stream (to reset it).
    fn tcp(&self) -> &tokio::net::TcpStream;
}

impl MockIo for tokio::net::TcpStream {
    fn tcp(&self) -> &tokio::net::TcpStream {
        self
    }
}

impl MockIo for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn tcp(&self) -> &tokio::net::TcpStream {
        self.get_ref().0
    }
}

fn open(path: &Path) -> io::Result<BufReader<File>> {
    File::open(path)
        .map(BufReader::new)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}", path.display()),
    )
}

fn load_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = rustls_pemfile::certs(&mut open(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, e))?;
    if certs.is_empty() {
        return Err(invalid(path, "no certificate in PEM file"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    rustls_pemfile::private_key(&mut open(path)?)
        .map_err(|e| invalid(path, e))?
        .ok_or_else(|| invalid(path, "no private key in PEM file"))
}

/// A TLS acceptor serving `files`, ALPN `http/1.1` only.
pub(super) fn acceptor(files: &TlsFiles) -> io::Result<TlsAcceptor> {
    let certs = load_certs(&files.cert_chain_pem)?;
    let key = load_key(&files.key_pem)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid(&files.key_pem, e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
