//! [`EdgeStream`]: the caller's HTTP/1 connection as Pingora's session reads it, with the two
//! things Pingora's reader lacks — a deadline on the whole request head (Pingora's own
//! `read_timeout` is per read, and a kept-alive HTTP/1.1 session has none at all), and the
//! last word on what reaches the wire before a request is admitted.
//!
//! A request is *admitted* when the proxy's `early_request_filter` runs ([`EdgeStream::admit`],
//! an atomic store): Pingora parsed its head and accepted it. Until then:
//! - reads run against a deadline: the next request's first byte within `idle_timeout` on a
//!   kept-alive connection, then the whole head within `header_timeout` (on a new connection,
//!   the head within `header_timeout` of the accept). At the deadline, a connection that sent
//!   nothing of the request reads as closed (Pingora closes it quietly); one that sent part of
//!   it fails the read, and the connection's shutdown answers `408 request_timeout` first.
//! - writes can only be Pingora's own refusal (`respond_error(400)` for a head it will not
//!   parse, `405` for `CONNECT`: `pingora-proxy` `HttpProxy::handle_new_request`), an empty
//!   body with `Server: Pingora`. They are swallowed, and the shutdown Pingora calls next
//!   writes signalbox's answer instead, in the caller's dialect when the request line says
//!   `/v1/messages`, classified by what was read: a request line past `MAX_URI` is `414`
//!   (Pingora refuses targets past 64 KiB, the `http` crate's bound), more than Pingora's 256
//!   header lines or 1 MiB of head `431`, anything else `400 invalid_http`.
//!
//! After admission every call goes straight through. What it costs an admitted request: one
//! `memchr` count over the head's bytes as they are read, at most one timer reset per request
//! (none when the next head is already there), and an atomic load per read and write. A
//! request Pingora parses from bytes it already held (the next pipelined request) is not seen
//! by the deadline, and its refusal (rare) is classified from nothing read: `400`, or `405`.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Buf, Bytes};
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::{SslDigest, TlsRef};
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use prometheus::IntCounterVec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::refusal::{self, Refusal};

/// Pingora's bounds on a request head (`MAX_HEADERS`, `MAX_HEADER_SIZE` in pingora-core's
/// `protocols/http/v1/common.rs`): past either it refuses the head with `400`.
const PINGORA_MAX_HEADERS: usize = 256;
const PINGORA_MAX_HEADER_SIZE: usize = 1_048_575;
/// How much of a request's first bytes is kept to tell its dialect.
const START: usize = 32;

/// The deadlines on reading a request head.
#[derive(Debug, Clone, Copy)]
pub struct HeadDeadlines {
    pub header: Duration,
    pub idle: Duration,
}

/// What was read of the current request's head, for classifying a refusal.
#[derive(Default)]
struct HeadSeen {
    bytes: usize,
    /// Complete lines of the head (the request line and header lines).
    lines: usize,
    /// Bytes of the line being read.
    line: usize,
    /// Bytes of the request line, once read.
    request_line: usize,
    /// The last byte of the previous read (a `\r` split from its `\n`).
    last: u8,
    /// The blank line ending the head was seen: what follows is body.
    ended: bool,
    start: [u8; START],
}

impl HeadSeen {
    fn observe(&mut self, fresh: &[u8]) {
        if self.bytes < START {
            let n = (START - self.bytes).min(fresh.len());
            self.start[self.bytes..self.bytes + n].copy_from_slice(&fresh[..n]);
        }
        self.bytes += fresh.len();
        if self.ended || fresh.is_empty() {
            return;
        }
        let mut from = 0;
        for nl in memchr::memchr_iter(b'\n', fresh) {
            let len = self.line + (nl - from);
            let before = if nl > 0 { fresh[nl - 1] } else { self.last };
            let blank = len == 0 || (len == 1 && before == b'\r');
            if blank && self.lines > 0 {
                self.ended = true;
                return;
            }
            if self.lines == 0 {
                self.request_line = len;
            }
            self.lines += 1;
            self.line = 0;
            from = nl + 1;
        }
        self.line += fresh.len() - from;
        if let Some(&b) = fresh.last() {
            self.last = b;
        }
    }

    /// Whether the request line names the Messages API (its errors are Anthropic-shaped).
    fn anthropic(&self) -> bool {
        let start = &self.start[..self.bytes.min(START)];
        let Some(space) = memchr::memchr(b' ', start) else {
            return false;
        };
        start[space + 1..].starts_with(b"/v1/messages")
    }

    /// A request line past [`super::MAX_URI`] (or still unended past it).
    fn uri_too_long(&self) -> bool {
        let line = if self.lines == 0 {
            self.line
        } else {
            self.request_line
        };
        line > super::MAX_URI
    }

    fn too_large(&self) -> bool {
        self.lines > PINGORA_MAX_HEADERS + 1 || self.bytes > PINGORA_MAX_HEADER_SIZE
    }
}

/// The caller's connection under Pingora's HTTP/1 session (see the module doc).
pub struct EdgeStream {
    inner: Stream,
    /// Set by the proxy once Pingora accepted the request's head.
    admitted: AtomicBool,
    /// The wait for `due`, set to it only before a read waits (a head that arrives in one
    /// read, most of them, never touches a timer), on the attempts' coarse wheel
    /// (`crate::proxy::wheel`: no tokio timer, whose entry would make every park of the
    /// worker work out its timeout).
    deadline: crate::proxy::wheel::Deadline,
    /// When the head (or, while idle, its first byte) is due.
    due: Instant,
    /// `due` is this long from the next read that waits, and is set then: a head that comes
    /// whole in the read that brings its first byte (most heads), like a request already
    /// there when the connection is kept alive, costs no clock read.
    due_in: Option<Duration>,
    /// `deadline` is set to `due`.
    armed: bool,
    deadlines: HeadDeadlines,
    /// The deadline is the idle one: no byte of the next request yet.
    idle: bool,
    head: HeadSeen,
    timed_out: bool,
    /// Pingora's refusal status, swallowed.
    refused: Option<u16>,
    /// The answer still to write, while shutting down after a refusal.
    pending: Option<Bytes>,
    refusals: IntCounterVec,
}

impl EdgeStream {
    /// A new connection: its first head is due within `header` of now.
    pub fn new(inner: Stream, deadlines: HeadDeadlines, refusals: IntCounterVec) -> Self {
        Self {
            inner,
            admitted: AtomicBool::new(false),
            deadline: crate::proxy::wheel::Deadline::default(),
            due: Instant::now() + deadlines.header,
            due_in: None,
            armed: false,
            deadlines,
            idle: false,
            head: HeadSeen::default(),
            timed_out: false,
            refused: None,
            pending: None,
            refusals,
        }
    }

    /// A kept-alive connection waits for its next request.
    pub fn next_request(&mut self) {
        self.admitted.store(false, Ordering::Relaxed);
        // From when the connection first waits for it: at once, when nothing is there yet.
        self.due_in = Some(self.deadlines.idle);
        self.armed = false;
        self.idle = true;
        self.head = HeadSeen::default();
        self.timed_out = false;
        self.refused = None;
        self.pending = None;
    }

    /// Pingora accepted the head: from here on the stream is transparent.
    pub fn admit(&self) {
        self.admitted.store(true, Ordering::Relaxed);
    }

    fn in_head(&self) -> bool {
        !self.admitted.load(Ordering::Relaxed)
    }

    /// What signalbox answers in place of Pingora's refusal or silence, if anything.
    fn answer(&self) -> Option<(Refusal, Bytes)> {
        let refusal = if self.timed_out {
            Refusal::HeadTimeout
        } else {
            match self.refused? {
                405 => Refusal::Connect,
                _ if self.head.uri_too_long() => Refusal::UriTooLong,
                _ if self.head.too_large() => Refusal::HeadTooLarge,
                _ => Refusal::Malformed,
            }
        };
        Some((refusal, refusal::response(refusal, self.head.anthropic())))
    }
}

impl fmt::Debug for EdgeStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EdgeStream")
            .field("inner", &self.inner)
            .field("admitted", &self.admitted)
            .finish_non_exhaustive()
    }
}

/// The status of a serialised response head (`HTTP/1.1 400 …`).
fn status_of(buf: &[u8]) -> Option<u16> {
    let digits = buf.strip_prefix(b"HTTP/1.")?.get(2..5)?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

impl AsyncRead for EdgeStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.in_head() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        // Bytes already there are read; the deadline is judged before a read would wait (and
        // its timer wakes that wait): a caller sending slower than it is read always waits,
        // so a head trickled in past its deadline still fails at the next wait.
        let before = buf.filled().len();
        if let Poll::Ready(read) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            read?;
            let fresh = &buf.filled()[before..];
            if !fresh.is_empty() {
                if this.idle {
                    this.idle = false;
                    // The head's deadline runs from its first byte; read with it when a later
                    // read waits (the next poll, microseconds on).
                    this.due_in = Some(this.deadlines.header);
                    this.armed = false;
                }
                this.head.observe(fresh);
            }
            return Poll::Ready(Ok(()));
        }
        if !this.armed {
            if let Some(within) = this.due_in.take() {
                this.due = Instant::now() + within;
            }
            this.deadline.set(this.due.into_std());
            this.armed = true;
        }
        if this.deadline.poll(cx).is_ready() {
            if this.head.bytes == 0 {
                // Nothing of a request: read as a close, which Pingora ends quietly.
                return Poll::Ready(Ok(()));
            }
            this.timed_out = true;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head deadline",
            )));
        }
        Poll::Pending
    }
}

impl AsyncWrite for EdgeStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.in_head() {
            // Only Pingora writes before admission, and only to refuse the request.
            if this.refused.is_none() {
                this.refused = Some(status_of(buf).unwrap_or(400));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.in_head() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    /// Pingora shuts a refused connection down (`HttpSession::shutdown`): signalbox's answer
    /// goes out first.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_answer(cx));
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.in_head() {
            let first = bufs.iter().find(|b| !b.is_empty());
            if this.refused.is_none() {
                this.refused = Some(first.and_then(|b| status_of(b)).unwrap_or(400));
            }
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl EdgeStream {
    /// Write signalbox's answer to a refused head, once (a no-op for an admitted request).
    /// Write errors end it: the caller is gone, there is nobody to answer.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.pending.is_none() && self.in_head() {
            if let Some((refusal, answer)) = self.answer() {
                let code = refusal.code().as_str();
                self.refusals.with_label_values(&[code]).inc();
                tracing::debug!(code, "request refused at the edge");
                self.pending = Some(answer);
            }
            // Answered once: the stream is done with this request.
            self.admit();
        }
        while let Some(pending) = self.pending.as_mut() {
            if pending.is_empty() {
                if ready!(Pin::new(&mut self.inner).poll_flush(cx)).is_err() {
                    self.pending = None;
                    return Poll::Ready(());
                }
                self.pending = None;
                break;
            }
            match ready!(Pin::new(&mut self.inner).poll_write(cx, pending)) {
                Ok(0) | Err(_) => self.pending = None,
                Ok(n) => pending.advance(n),
            }
        }
        Poll::Ready(())
    }
}

#[async_trait]
impl Shutdown for EdgeStream {
    async fn shutdown(&mut self) {
        std::future::poll_fn(|cx| self.poll_answer(cx)).await;
        Shutdown::shutdown(&mut *self.inner).await;
    }
}

impl UniqueID for EdgeStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for EdgeStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for EdgeStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for EdgeStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for EdgeStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for EdgeStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(chunks: &[&[u8]]) -> HeadSeen {
        let mut h = HeadSeen::default();
        for c in chunks {
            h.observe(c);
        }
        h
    }

    #[test]
    fn head_lines_are_counted_up_to_the_blank_line_across_reads() {
        let h = seen(&[
            b"POST / HTTP/1.1\r\nA: b\r",
            b"\nC: d\r\n\r",
            b"\nbody\nmore\n",
        ]);
        assert_eq!(h.lines, 3);
        assert!(h.ended);
        let h = seen(&[b"GET / HTTP/1.1\nA: b\n\nx\n"]);
        assert_eq!(h.lines, 2);
        assert!(h.ended);
    }

    #[test]
    fn many_header_lines_are_too_large() {
        let mut head = b"POST / HTTP/1.1\r\n".to_vec();
        for _ in 0..300 {
            head.extend_from_slice(b"X: y\r\n");
        }
        let h = seen(&[&head]);
        assert!(h.too_large());
        assert!(!seen(&[b"POST / HTTP/1.1\r\nX: y\r\n\r\n"]).too_large());
    }

    #[test]
    fn a_long_request_line_is_a_long_uri() {
        let long = format!(
            "POST /?q={} HTTP/1.1\r\n",
            "a".repeat(super::super::MAX_URI)
        );
        assert!(seen(&[long.as_bytes(), b"Host: x\r\n\r\n"]).uri_too_long());
        assert!(seen(&[&long.as_bytes()[..long.len() - 2]]).uri_too_long());
        assert!(!seen(&[b"POST / HTTP/1.1\r\nX: y\r\n\r\n"]).uri_too_long());
    }

    #[test]
    fn the_dialect_comes_from_the_request_line() {
        assert!(seen(&[b"POST /v1/mes", b"sages HTTP/1.1\r\n"]).anthropic());
        assert!(!seen(&[b"POST /v1/chat/completions HTTP/1.1\r\n"]).anthropic());
        assert!(!seen(&[b"HELLO\r\n\r\n"]).anthropic());
    }

    #[test]
    fn status_of_a_serialised_head() {
        assert_eq!(status_of(b"HTTP/1.1 400 Bad Request\r\n"), Some(400));
        assert_eq!(status_of(b"HTTP/1.1 405 Method Not Allowed\r\n"), Some(405));
        assert_eq!(status_of(b"garbage"), None);
    }
}
