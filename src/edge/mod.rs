//! The edge: what signalbox owns of a caller's connection outside any one request's hooks —
//! deadlines on slow clients, the answer to HTTP it will not read, and the HTTP/1.1 keep-alive
//! and pipelining loop.
//!
//! Pingora's `HttpProxy` is an `HttpServerApp`; the stock `ServerApp` over it (pingora-core
//! `apps/mod.rs`) runs the HTTP/1 keep-alive loop with no deadline on a request head, a 60 s
//! keep-alive that the first parsed HTTP/1.1 request turns into none, and Pingora's own empty
//! `400` (`Server: Pingora`) for a head it will not parse. [`EdgeApp`] is the `ServerApp`
//! instead: HTTP/2 connections go to Pingora's loop unchanged; each HTTP/1 connection is wrapped
//! in an [`EdgeStream`] (deadlines and refusals, see [`stream`]) and served by the same loop,
//! request after request, through `HttpProxy::process_new_http`, with Pingora's HTTP/1.1
//! pipelining on: a request sent behind another is answered after it, in order.
//!
//! What the hooks add (`crate::proxy`): `early_request_filter` admits the request
//! ([`admit`]); intake refuses a target longer than [`MAX_URI`] (`414`) and a transfer coding
//! other than `chunked` (`501`, [`check_head`]), bounds reading the body by
//! `limits.body_timeout` and answers a body the client broke as the client's fault
//! ([`body_refusal`]: `400`, or `408`).
//!
//! Not covered: HTTP/2 (its framing errors are h2's, its idle timeout Pingora's
//! `h2_idle_timeout`); a pipelined request Pingora parses from bytes it read with the one
//! before is not under the head deadline (it arrived already).

pub mod refusal;
pub mod stream;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::header;
use pingora_core::apps::{HttpServerApp, ServerApp};
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::Stream;
use pingora_core::protocols::ALPN;
use pingora_core::server::ShutdownWatch;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;
use pingora_proxy::{HttpProxy, Session};
use prometheus::IntCounterVec;

pub use self::stream::{EdgeStream, HeadDeadlines};
use crate::error::{ErrorCode, GatewayError};
use crate::proxy::Gateway;
use crate::snapshot::Runtime;

/// The longest request target read (`414 uri_too_long` beyond): signalbox's endpoints take
/// their parameters in the body.
pub const MAX_URI: usize = 8 * 1024;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The proxy listener's `ServerApp` (see the module doc).
pub struct EdgeApp {
    proxy: Arc<HttpProxy<Gateway>>,
    runtime: Arc<Runtime>,
    refusals: IntCounterVec,
}

impl EdgeApp {
    pub fn new(proxy: HttpProxy<Gateway>, runtime: Arc<Runtime>, refusals: IntCounterVec) -> Self {
        Self {
            proxy: Arc::new(proxy),
            runtime,
            refusals,
        }
    }

    /// Whether the connection speaks HTTP/2 (ALPN on TLS, the preface on cleartext when
    /// `h2c` is on), as Pingora's own loop decides it.
    async fn is_h2(&self, stream: &mut Stream) -> Option<bool> {
        if stream.get_ssl_digest().is_some() {
            return Some(matches!(stream.selected_alpn_proto(), Some(ALPN::H2)));
        }
        let h2c = HttpServerApp::server_options(&*self.proxy).is_some_and(|o| o.h2c);
        if !h2c {
            return Some(false);
        }
        let mut buf = [0u8; H2_PREFACE.len()];
        // A connection closed before its preface has nothing to serve.
        let peeked = stream.try_peek(&mut buf).await.ok()?;
        Some(peeked && buf == H2_PREFACE)
    }
}

#[async_trait]
impl ServerApp for EdgeApp {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        if self.is_h2(&mut stream).await? {
            return ServerApp::process_new(&self.proxy, stream, shutdown).await;
        }
        let limits = self.runtime.snapshot.load().limits;
        let deadlines = HeadDeadlines {
            header: limits.header_timeout,
            idle: limits.idle_timeout,
        };
        let mut edge = Box::new(EdgeStream::new(stream, deadlines, self.refusals.clone()));
        let keepalive_limit =
            HttpServerApp::server_options(&*self.proxy).and_then(|o| o.keepalive_request_limit);
        let mut session = ServerSession::new_http1(edge);
        // Kept alive with no timeout of Pingora's: the edge bounds the wait (`idle_timeout`).
        session.set_keepalive((!*shutdown.borrow()).then_some(0));
        session.set_keepalive_reuses_remaining(keepalive_limit);
        loop {
            session.set_pipelining_enabled(true);
            let reused = self.proxy.process_new_http(session, shutdown).await?;
            let (stream, settings) = reused.consume();
            edge = stream.into_any().downcast::<EdgeStream>().ok()?;
            edge.next_request();
            session = ServerSession::new_http1(edge);
            if let Some(settings) = settings {
                settings.apply_to_session(&mut session);
            }
        }
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await;
    }
}

/// `early_request_filter`: Pingora accepted the request's head; the edge lets it through.
pub fn admit(session: &Session) {
    let edge = session
        .as_downstream()
        .stream()
        .and_then(|s| s.as_any().downcast_ref::<EdgeStream>());
    if let Some(edge) = edge {
        edge.admit();
    }
}

/// The refusals of a head Pingora accepted: a target past [`MAX_URI`], a transfer coding
/// other than `chunked` (Pingora refuses a final coding other than `chunked` itself and
/// ignores the others: RFC 9112 §6.1 asks for `501`).
pub fn check_head(req: &RequestHeader) -> Result<(), GatewayError> {
    if req.raw_path().len() > MAX_URI {
        return Err(GatewayError::new(
            ErrorCode::UriTooLong,
            "the request target exceeds the gateway's limit of 8KiB",
        ));
    }
    let mut codings = req.headers.get_all(header::TRANSFER_ENCODING).iter();
    let only_chunked = codings.all(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .map(<[u8]>::trim_ascii)
            .all(|c| c.is_empty() || c.eq_ignore_ascii_case(b"chunked"))
    });
    if !only_chunked {
        return Err(GatewayError::new(
            ErrorCode::UnsupportedTransferCoding,
            "signalbox reads no transfer coding but chunked",
        ));
    }
    Ok(())
}

/// How a failed read of the request body is answered: `Ok` with the caller's refusal when
/// the client broke it (bad chunked framing, a body cut short, too slow: `408`), `Err` when
/// the client is gone (the error marked downstream, so nothing is answered).
pub fn body_refusal(mut e: Box<Error>, timeout: Duration) -> Result<GatewayError, Box<Error>> {
    let framing = matches!(
        e.etype(),
        ErrorType::Custom("InvalidChunk" | "InvalidTrailerEnd" | "PrematureBodyEnd")
            | ErrorType::ConnectionClosed
            | ErrorType::InvalidHTTPHeader
    );
    if framing {
        return Ok(GatewayError::new(
            ErrorCode::InvalidHttp,
            "the request body is not framed as its headers say (chunked framing, or shorter than its content-length)",
        ));
    }
    if matches!(e.etype(), ErrorType::ReadTimedout) {
        return Ok(body_timeout(timeout));
    }
    e.as_down();
    Err(e)
}

/// The answer to a body that did not arrive within `limits.body_timeout`.
pub fn body_timeout(timeout: Duration) -> GatewayError {
    GatewayError::new(
        ErrorCode::RequestTimeout,
        format!(
            "the request body did not arrive within the gateway's limit of {} (limits.body_timeout)",
            humantime::format_duration(timeout)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(te: &[&str], path: &str) -> RequestHeader {
        let mut req = RequestHeader::build("POST", path.as_bytes(), None).unwrap_or_else(|e| {
            panic!("{e}");
        });
        for v in te {
            let _ = req.append_header(header::TRANSFER_ENCODING, *v);
        }
        req
    }

    #[test]
    fn only_chunked_is_read() {
        assert!(check_head(&head(&[], "/v1/chat/completions")).is_ok());
        assert!(check_head(&head(&["chunked"], "/")).is_ok());
        assert!(check_head(&head(&["Chunked "], "/")).is_ok());
        for te in [
            &["gzip, chunked"][..],
            &["gzip", "chunked"],
            &["identity,chunked"],
        ] {
            let e = check_head(&head(te, "/")).err().map(|e| e.code);
            assert_eq!(e, Some(ErrorCode::UnsupportedTransferCoding), "{te:?}");
        }
        let long = format!("/v1/chat/completions?q={}", "a".repeat(MAX_URI));
        let e = check_head(&head(&[], &long)).err().map(|e| e.status);
        assert_eq!(e, Some(414));
    }

    #[test]
    fn body_faults_are_the_callers() {
        let timeout = Duration::from_secs(30);
        for etype in [
            ErrorType::Custom("InvalidChunk"),
            ErrorType::ConnectionClosed,
            ErrorType::ReadTimedout,
        ] {
            let refusal = body_refusal(Error::new(etype), timeout)
                .ok()
                .map(|e| e.status);
            assert!(matches!(refusal, Some(400 | 408)), "{refusal:?}");
        }
        let gone = body_refusal(Error::new(ErrorType::ReadError), timeout);
        assert!(gone.is_err_and(|e| e.esource() == &pingora_error::ErrorSource::Downstream));
    }
}
