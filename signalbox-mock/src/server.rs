//! The hand-rolled HTTP/1.1 server: accept loop, request parsing, behaviours.
//!
//! One task per connection; each connection owns its buffers and reuses them between requests.
//! The hot path (no script, `record: false`) takes no lock: the script length is an atomic and
//! the default behaviour is cached per connection behind a generation counter.

use std::borrow::Cow;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::wire::{self, Answer, DateCache, Head};
use super::{lock, Behaviour, RecordedRequest, Shared, StreamShape};

/// Largest request head (request line + headers).
const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one request.
const MAX_HEADERS: usize = 128;
/// Largest request body.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// Spare capacity ensured before each read.
const READ_RESERVE: usize = 16 * 1024;
/// Longest chunk-size line (with extensions) accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;
/// Decoded chunk data is compacted out of the read buffer once this much has accumulated.
const COMPACT_AT: usize = 1 << 20;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
const JSON: &[u8] = b"application/json";
const SSE: &[u8] = b"text/event-stream";

/// A connection the mock serves: plain TCP or TLS over TCP.
pub(super) trait MockIo: AsyncRead + AsyncWrite + Unpin + Send {
    /// The underlying TCP stream (to reset it).
    fn tcp(&self) -> &TcpStream;
}

impl MockIo for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl MockIo for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// Bind a listener with a deep accept backlog (load tests open many connections at once).
pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

pub(super) async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        match accepted {
            Ok((tcp, _peer)) => {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "mock: set_nodelay failed");
                }
                let shared = shared.clone();
                let tls = tls.clone();
                let mut stop = shared.shutdown.subscribe();
                tokio::spawn(async move {
                    tokio::select! {
                        () = serve(tcp, tls, shared) => {}
                        _ = stop.wait_for(|stopped| *stopped) => {}
                    }
                });
            }
            Err(e) => {
                // Typically EMFILE under load: back off a little instead of spinning.
                tracing::warn!(error = %e, "mock: accept failed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

async fn serve(tcp: TcpStream, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    match tls {
        None => Conn::new(shared).run(tcp).await,
        Some(acceptor) => match acceptor.accept(tcp).await {
            Ok(stream) => Conn::new(shared).run(stream).await,
            Err(e) => tracing::debug!(error = %e, "mock: TLS handshake failed"),
        },
    }
}

/// How a connection ends (or goes on) after a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Serve the next request (unless the request asked to close).
    KeepAlive,
    /// Close cleanly: FIN (close_notify first under TLS).
    Close,
    /// Reset: SO_LINGER 0, then drop.
    Reset,
    /// Never answer; wait until the client goes away.
    Hang,
    /// Just drop the connection (client gone, I/O error).
    Drop,
}

/// Where a request's body is.
enum BodyLoc {
    /// In the read buffer.
    Buf(Range<usize>),
    /// Decoded from chunked encoding into `Conn::body`.
    Decoded,
}

/// A parsed request head; ranges index `Conn::buf`.
struct ReqHead {
    method: Range<usize>,
    path: Range<usize>,
    head_len: usize,
    content_length: usize,
    chunked: bool,
    expect_continue: bool,
    close: bool,
    host: Option<Range<usize>>,
    authorization: Option<Range<usize>>,
}

enum HeadRead {
    Req(ReqHead),
    Eof,
    Bad(u16, &'static str),
}

enum BodyRead {
    Ready { body: BodyLoc, consumed: usize },
    Eof,
    Bad(u16, &'static str),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Models,
    Stats,
    Script,
    Default,
    Reset,
    MethodNotAllowed,
    NotFound,
}

fn route(method: &[u8], path: &[u8]) -> Route {
    let path = match path.iter().position(|b| *b == b'?') {
        Some(q) => &path[..q],
        None => path,
    };
    let get = method == b"GET";
    let post = method == b"POST";
    let (want_get, r) = match path {
        b"/_mock/stats" => (true, Route::Stats),
        b"/_mock/script" => (false, Route::Script),
        b"/_mock/default" => (false, Route::Default),
        b"/_mock/reset" => (false, Route::Reset),
        p if p.ends_with(b"/chat/completions") => (false, Route::Chat),
        p if p.ends_with(b"/models") => (true, Route::Models),
        _ => return Route::NotFound,
    };
    if (want_get && get) || (!want_get && post) {
        r
    } else {
        Route::MethodNotAllowed
    }
}

/// Response writer with reusable buffers.
struct Writer {
    /// Bytes about to be written.
    out: Vec<u8>,
    /// A body or an event being built.
    ev: Vec<u8>,
    date: DateCache,
}

/// Header fields of a response whose body is `Writer::ev`.
struct Meta<'a> {
    code: u16,
    content_type: &'a [u8],
    close: bool,
    retry_after: Option<&'a [u8]>,
    name: &'a [u8],
}

impl Writer {
    fn head(&mut self, m: &Meta<'_>, content_length: Option<usize>, sse: bool) {
        let date = self.date.get();
        wire::write_head(
            &mut self.out,
            &Head {
                code: m.code,
                content_type: m.content_type,
                content_length,
                sse,
                name: m.name,
                date,
                close: m.close,
                retry_after: m.retry_after,
            },
        );
    }

    /// Send a complete response whose body is `self.ev`, in one write.
    async fn send<S: MockIo>(&mut self, io: &mut S, m: &Meta<'_>) -> io::Result<()> {
        self.out.clear();
        self.head(m, Some(self.ev.len()), false);
        if !wire::bodyless(m.code) {
            self.out.extend_from_slice(&self.ev);
        }
        io.write_all(&self.out).await?;
        io.flush().await
    }

    /// Send `self.out` and clear it.
    async fn flush_out<S: MockIo>(&mut self, io: &mut S) -> io::Result<()> {
        io.write_all(&self.out).await?;
        io.flush().await?;
        self.out.clear();
        Ok(())
    }
}

/// One connection's state.
struct Conn {
    shared: Arc<Shared>,
    /// Read buffer: the current request head (and body, unless chunked) then any bytes after.
    buf: Vec<u8>,
    /// Decoded chunked body.
    body: Vec<u8>,
    /// Header (name, value) ranges into `buf` for the current request.
    hdrs: Vec<(Range<usize>, Range<usize>)>,
    /// The current request's model, JSON-escaped.
    model: Vec<u8>,
    w: Writer,
    /// Cached default behaviour and its generation.
    default: (u64, Arc<Behaviour>),
}

/// Values of the current chat call used by the behaviours.
struct Call<'a> {
    n: u64,
    model: &'a [u8],
    stream: bool,
    prompt_tokens: u64,
    close: bool,
    authorization: &'a [u8],
    host: &'a [u8],
}

impl Conn {
    fn new(shared: Arc<Shared>) -> Conn {
        let default = shared.current_default();
        Conn {
            shared,
            buf: Vec::with_capacity(READ_RESERVE),
            body: Vec::new(),
            hdrs: Vec::with_capacity(16),
            model: Vec::with_capacity(64),
            w: Writer {
                out: Vec::with_capacity(4096),
                ev: Vec::with_capacity(1024),
                date: DateCache::new(),
            },
            default,
        }
    }

    async fn run<S: MockIo>(mut self, mut io: S) {
        let end = match self.serve_requests(&mut io).await {
            Ok(end) => end,
            Err(e) => {
                tracing::debug!(error = %e, "mock: connection error");
                End::Drop
            }
        };
        match end {
            End::KeepAlive | End::Drop => {}
            End::Close => {
                if let Err(e) = io.shutdown().await {
                    tracing::debug!(error = %e, "mock: shutdown failed");
                }
            }
            End::Reset => {
                if let Err(e) = socket2::SockRef::from(io.tcp()).set_linger(Some(Duration::ZERO)) {
                    tracing::debug!(error = %e, "mock: set_linger failed");
                }
            }
            End::Hang => {
                // Read and discard until the client closes (or errors).
                loop {
                    self.buf.clear();
                    self.buf.reserve(READ_RESERVE);
                    match io.read_buf(&mut self.buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            }
        }
        drop(io);
    }

    async fn serve_requests<S: MockIo>(&mut self, io: &mut S) -> io::Result<End> {
        loop {
            let head = match self.read_head(io).await? {
                HeadRead::Req(head) => head,
                HeadRead::Eof => return Ok(End::Drop),
                HeadRead::Bad(code, msg) => return self.reject(io, code, msg).await,
            };
            let (body, consumed) = match self.read_body(io, &head).await? {
                BodyRead::Ready { body, consumed } => (body, consumed),
                BodyRead::Eof => return Ok(End::Drop),
                BodyRead::Bad(code, msg) => return self.reject(io, code, msg).await,
            };
            let end = self.dispatch(io, &head, &body).await?;
            self.buf.drain(..consumed);
            match end {
                End::KeepAlive if !head.close => {}
                End::KeepAlive => return Ok(End::Close),
                other => return Ok(other),
            }
        }
    }

    /// Answer a malformed request and close.
    async fn reject<S: MockIo>(&mut self, io: &mut S, code: u16, msg: &str) -> io::Result<End> {
        self.w.ev.clear();
        wire::error_json(
            &mut self.w.ev,
            msg.as_bytes(),
            "invalid_request_error",
            "bad_request",
        );
        let meta = Meta {
            code,
            content_type: JSON,
            close: true,
            retry_after: None,
            name: &self.shared.header_name,
        };
        self.w.send(io, &meta).await?;
        Ok(End::Close)
    }

    async fn read_more<S: MockIo>(&mut self, io: &mut S, reserve: usize) -> io::Result<bool> {
        self.buf.reserve(reserve);
        Ok(io.read_buf(&mut self.buf).await? > 0)
    }

    async fn read_head<S: MockIo>(&mut self, io: &mut S) -> io::Result<HeadRead> {
        loop {
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut req = httparse::Request::new(&mut headers);
                match req.parse(&self.buf) {
                    Ok(httparse::Status::Complete(head_len)) => {
                        return Ok(head_of(
                            self.buf.as_ptr() as usize,
                            &mut self.hdrs,
                            &req,
                            head_len,
                        ));
                    }
                    Ok(httparse::Status::Partial) => {
                        if self.buf.len() > MAX_HEAD {
                            return Ok(HeadRead::Bad(431, "request head too large"));
                        }
                    }
                    Err(httparse::Error::TooManyHeaders) => {
                        return Ok(HeadRead::Bad(431, "too many header fields"));
                    }
                    Err(_) => return Ok(HeadRead::Bad(400, "malformed HTTP request")),
                }
            }
            if !self.read_more(io, READ_RESERVE).await? {
                return Ok(HeadRead::Eof);
            }
        }
    }

    async fn read_body<S: MockIo>(&mut self, io: &mut S, head: &ReqHead) -> io::Result<BodyRead> {
        if head.chunked {
            return self.read_chunked(io, head).await;
        }
        if head.content_length > MAX_BODY {
            return Ok(BodyRead::Bad(413, "request body too large"));
        }
        let end = head.head_len + head.content_length;
        if self.buf.len() < end && head.expect_continue {
            io.write_all(CONTINUE).await?;
            io.flush().await?;
        }
        while self.buf.len() < end {
            let missing = end - self.buf.len();
            if !self.read_more(io, missing).await? {
                return Ok(BodyRead::Eof);
            }
        }
        Ok(BodyRead::Ready {
            body: BodyLoc::Buf(head.head_len..end),
            consumed: end,
        })
    }

    async fn read_chunked<S: MockIo>(
        &mut self,
        io: &mut S,
        head: &ReqHead,
    ) -> io::Result<BodyRead> {
        let start = head.head_len;
        self.body.clear();
        if self.buf.len() == start && head.expect_continue {
            io.write_all(CONTINUE).await?;
            io.flush().await?;
        }
        let mut pos = start;
        // Chunks.
        loop {
            if pos - start >= COMPACT_AT {
                self.buf.drain(start..pos);
                pos = start;
            }
            match httparse::parse_chunk_size(&self.buf[pos..]) {
                Ok(httparse::Status::Complete((line, size))) => {
                    pos += line;
                    if size == 0 {
                        break;
                    }
                    let size = match usize::try_from(size) {
                        Ok(size) if size <= MAX_BODY - self.body.len() => size,
                        _ => return Ok(BodyRead::Bad(413, "request body too large")),
                    };
                    let need = pos + size + 2;
                    while self.buf.len() < need {
                        let missing = need - self.buf.len();
                        if !self.read_more(io, missing).await? {
                            return Ok(BodyRead::Eof);
                        }
                    }
                    if &self.buf[pos + size..need] != b"\r\n" {
                        return Ok(BodyRead::Bad(400, "malformed chunked body"));
                    }
                    self.body.extend_from_slice(&self.buf[pos..pos + size]);
                    pos = need;
                }
                Ok(httparse::Status::Partial) => {
                    if self.buf.len() - pos > MAX_CHUNK_LINE {
                        return Ok(BodyRead::Bad(400, "malformed chunked body"));
                    }
                    if !self.read_more(io, READ_RESERVE).await? {
                        return Ok(BodyRead::Eof);
                    }
                }
                Err(_) => return Ok(BodyRead::Bad(400, "malformed chunked body")),
            }
        }
        // Trailer section, up to the empty line.
        loop {
            match find_crlf(&self.buf[pos..]) {
                Some(0) => {
                    pos += 2;
                    break;
                }
                Some(i) => pos += i + 2,
                None => {
                    if self.buf.len() - pos > MAX_HEAD {
                        return Ok(BodyRead::Bad(431, "trailer section too large"));
                    }
                    if !self.read_more(io, READ_RESERVE).await? {
                        return Ok(BodyRead::Eof);
                    }
                }
            }
        }
        Ok(BodyRead::Ready {
            body: BodyLoc::Decoded,
            consumed: pos,
        })
    }

    async fn dispatch<S: MockIo>(
        &mut self,
        io: &mut S,
        head: &ReqHead,
        body: &BodyLoc,
    ) -> io::Result<End> {
        let route = route(&self.buf[head.method.clone()], &self.buf[head.path.clone()]);
        if route == Route::Chat {
            return self.chat(io, head, body).await;
        }
        let sh = &*self.shared;
        let body: &[u8] = match body {
            BodyLoc::Buf(r) => &self.buf[r.clone()],
            BodyLoc::Decoded => &self.body,
        };
        let ev = &mut self.w.ev;
        ev.clear();
        let code = match route {
            Route::Models => {
                sh.model_list_calls.fetch_add(1, Ordering::Relaxed);
                ev.extend_from_slice(wire::MODELS_JSON);
                200
            }
            Route::Stats => {
                #[derive(serde::Serialize)]
                struct Stats<'a> {
                    name: &'a str,
                    calls: u64,
                    model_list_calls: u64,
                    requests: &'a [RecordedRequest],
                }
                let records = lock(&sh.records);
                let stats = Stats {
                    name: &sh.name,
                    calls: sh.calls.load(Ordering::Relaxed),
                    model_list_calls: sh.model_list_calls.load(Ordering::Relaxed),
                    requests: &records,
                };
                match serde_json::to_writer(&mut *ev, &stats) {
                    Ok(()) => 200,
                    Err(e) => {
                        ev.clear();
                        wire::error_json(ev, e.to_string().as_bytes(), "mock_error", "stats");
                        500
                    }
                }
            }
            Route::Script => match serde_json::from_slice::<Vec<Behaviour>>(body) {
                Ok(script) => {
                    sh.push_script(script);
                    ev.extend_from_slice(b"{\"ok\":true}");
                    200
                }
                Err(e) => bad_json(ev, &e),
            },
            Route::Default => match serde_json::from_slice::<Behaviour>(body) {
                Ok(behaviour) => {
                    sh.set_default(behaviour);
                    ev.extend_from_slice(b"{\"ok\":true}");
                    200
                }
                Err(e) => bad_json(ev, &e),
            },
            Route::Reset => {
                sh.reset();
                ev.extend_from_slice(b"{\"ok\":true}");
                200
            }
            Route::MethodNotAllowed => {
                wire::error_json(
                    ev,
                    b"method not allowed",
                    "invalid_request_error",
                    "method_not_allowed",
                );
                405
            }
            Route::NotFound | Route::Chat => {
                let mut msg = b"unknown path ".to_vec();
                msg.extend_from_slice(&self.buf[head.path.clone()]);
                wire::error_json(ev, &msg, "invalid_request_error", "unknown_url");
                404
            }
        };
        let meta = Meta {
            code,
            content_type: JSON,
            close: head.close,
            retry_after: None,
            name: &sh.header_name,
        };
        self.w.send(io, &meta).await?;
        Ok(End::KeepAlive)
    }

    async fn chat<S: MockIo>(
        &mut self,
        io: &mut S,
        head: &ReqHead,
        body: &BodyLoc,
    ) -> io::Result<End> {
        let sh = &*self.shared;
        let n = sh.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let body: &[u8] = match body {
            BodyLoc::Buf(r) => &self.buf[r.clone()],
            BodyLoc::Decoded => &self.body,
        };
        let (stream, model) = match probe(body) {
            Ok(probe) => {
                self.model.clear();
                match &probe.model {
                    Some(m) => wire::escape_json(&mut self.model, m.as_bytes()),
                    None => self.model.extend_from_slice(b"mock-model"),
                }
                let model = if sh.record {
                    probe.model.map(Cow::into_owned)
                } else {
                    None
                };
                (probe.stream, model)
            }
            Err(msg) => {
                let ev = &mut self.w.ev;
                ev.clear();
                wire::error_json(ev, msg.as_bytes(), "invalid_request_error", "invalid_json");
                if sh.record {
                    let behaviour = Behaviour::Status {
                        code: 400,
                        retry_after: None,
                        body: Some(String::from_utf8_lossy(ev).into_owned()),
                    };
                    record(
                        sh, &self.buf, head, &self.hdrs, body, None, false, behaviour,
                    );
                }
                let meta = Meta {
                    code: 400,
                    content_type: JSON,
                    close: head.close,
                    retry_after: None,
                    name: &sh.header_name,
                };
                self.w.send(io, &meta).await?;
                return Ok(End::KeepAlive);
            }
        };
        let scripted = sh.pop_script();
        if scripted.is_none() {
            sh.refresh_default(&mut self.default);
        }
        let behaviour: &Behaviour = scripted.as_ref().unwrap_or(&self.default.1);
        if sh.record {
            let b = behaviour.clone();
            record(sh, &self.buf, head, &self.hdrs, body, model, stream, b);
        }
        let call = Call {
            n,
            model: &self.model,
            stream,
            prompt_tokens: (body.len() / 4) as u64,
            close: head.close,
            authorization: head.authorization.clone().map_or(&[][..], |r| &self.buf[r]),
            host: head.host.clone().map_or(&[][..], |r| &self.buf[r]),
        };
        act(io, &mut self.w, sh, &call, behaviour).await
    }
}

/// Extract what the mock needs from a complete head, as ranges into `self.buf`.
fn head_of(
    base: usize,
    hdrs: &mut Vec<(Range<usize>, Range<usize>)>,
    req: &httparse::Request<'_, '_>,
    head_len: usize,
) -> HeadRead {
    let range = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return HeadRead::Bad(400, "malformed HTTP request");
    };
    let mut head = ReqHead {
        method: range(method.as_bytes()),
        path: range(path.as_bytes()),
        head_len,
        content_length: 0,
        chunked: false,
        expect_continue: false,
        close: version == 0,
        host: None,
        authorization: None,
    };
    let mut content_length: Option<usize> = None;
    hdrs.clear();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        hdrs.push((range(name), range(value)));
        if name.eq_ignore_ascii_case(b"content-length") {
            let Some(n) = parse_usize(value) else {
                return HeadRead::Bad(400, "invalid content-length");
            };
            if content_length.is_some_and(|m| m != n) {
                return HeadRead::Bad(400, "conflicting content-length");
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value.rsplit(|b| *b == b',').next().map(trim).unwrap_or(b"");
            if !last.eq_ignore_ascii_case(b"chunked") {
                return HeadRead::Bad(501, "unsupported transfer-encoding");
            }
            head.chunked = true;
        } else if name.eq_ignore_ascii_case(b"expect") {
            head.expect_continue = trim(value).eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|b| *b == b',').map(trim) {
                if token.eq_ignore_ascii_case(b"close") {
                    head.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == 0 {
                    head.close = false;
                }
            }
        } else if name.eq_ignore_ascii_case(b"host") && head.host.is_none() {
            head.host = Some(range(value));
        } else if name.eq_ignore_ascii_case(b"authorization") && head.authorization.is_none() {
            head.authorization = Some(range(value));
        }
    }
    head.content_length = content_length.unwrap_or(0);
    HeadRead::Req(head)
}

/// What the mock reads from a chat-completion body.
struct Probe<'a> {
    model: Option<Cow<'a, str>>,
    stream: bool,
}

/// A top-level field of any JSON type; strings and booleans are kept.
#[derive(Deserialize)]
#[serde(untagged)]
enum Loose<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    Bool(bool),
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct RawProbe<'a> {
    #[serde(default, borrow)]
    model: Option<Loose<'a>>,
    #[serde(default, borrow)]
    stream: Option<Loose<'a>>,
}

fn probe(body: &[u8]) -> Result<Probe<'_>, String> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("invalid JSON body: expected a JSON object".to_string());
    }
    let raw: RawProbe<'_> =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    Ok(Probe {
        model: match raw.model {
            Some(Loose::Str(m)) => Some(m),
            _ => None,
        },
        stream: matches!(raw.stream, Some(Loose::Bool(true))),
    })
}

fn bad_json(ev: &mut Vec<u8>, e: &serde_json::Error) -> u16 {
    ev.clear();
    let msg = format!("invalid control JSON: {e}");
    wire::error_json(ev, msg.as_bytes(), "invalid_request_error", "invalid_json");
    400
}

#[allow(clippy::too_many_arguments)]
fn record(
    sh: &Shared,
    buf: &[u8],
    head: &ReqHead,
    hdrs: &[(Range<usize>, Range<usize>)],
    body: &[u8],
    model: Option<String>,
    stream: bool,
    behaviour: Behaviour,
) {
    let text = |r: &Range<usize>| String::from_utf8_lossy(&buf[r.clone()]).into_owned();
    let rec = RecordedRequest {
        method: text(&head.method),
        path: text(&head.path),
        headers: hdrs
            .iter()
            .map(|(n, v)| (text(n).to_ascii_lowercase(), text(v)))
            .collect(),
        body_len: body.len(),
        body_sha256: hex(&Sha256::digest(body)),
        model,
        stream,
        behaviour,
    };
    lock(&sh.records).push(rec);
}

async fn act<S: MockIo>(
    io: &mut S,
    w: &mut Writer,
    sh: &Shared,
    call: &Call<'_>,
    behaviour: &Behaviour,
) -> io::Result<End> {
    let meta = Meta {
        code: 200,
        content_type: if call.stream { SSE } else { JSON },
        close: call.close,
        retry_after: None,
        name: &sh.header_name,
    };
    let answer = Answer {
        n: call.n,
        created: wire::unix_secs(),
        model: sh.echo_model.as_deref().unwrap_or(call.model),
        prompt_tokens: call.prompt_tokens,
        completion_tokens: sh.reply.words,
    };
    match behaviour {
        Behaviour::Ok => ok(io, w, sh, call, &meta, &answer, sh.shape).await,
        Behaviour::Stream { chunks, gap_ms } => {
            let shape = StreamShape {
                chunks: *chunks,
                gap: Duration::from_millis(*gap_ms),
            };
            ok(io, w, sh, call, &meta, &answer, shape).await
        }
        Behaviour::SlowHeader { ms } => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            let answer = Answer {
                created: wire::unix_secs(),
                ..answer
            };
            ok(io, w, sh, call, &meta, &answer, sh.shape).await
        }
        Behaviour::Status {
            code,
            retry_after,
            body,
        } => {
            w.ev.clear();
            match body {
                Some(body) => w.ev.extend_from_slice(body.as_bytes()),
                None => wire::status_default_json(&mut w.ev, *code, call.authorization, call.host),
            }
            let meta = Meta {
                code: *code,
                content_type: JSON,
                retry_after: retry_after.as_deref().map(str::as_bytes),
                ..meta
            };
            w.send(io, &meta).await?;
            Ok(End::KeepAlive)
        }
        Behaviour::Hang => Ok(End::Hang),
        Behaviour::Reset => Ok(End::Reset),
        Behaviour::Close => Ok(End::Close),
        Behaviour::MidStreamDeath { after_chunks } => {
            if call.stream {
                sse(io, w, sh, &meta, &answer, sh.shape, Some(*after_chunks)).await?;
            } else {
                w.ev.clear();
                wire::completion_json(&mut w.ev, &answer, Some(sh.reply.escaped()));
                w.out.clear();
                w.head(&meta, Some(w.ev.len()), false);
                let half = w.ev.len() / 2;
                w.out.extend_from_slice(&w.ev[..half]);
                w.flush_out(io).await?;
            }
            Ok(End::Reset)
        }
        Behaviour::EmptyStream => {
            let meta = Meta {
                content_type: SSE,
                ..meta
            };
            w.out.clear();
            w.head(&meta, None, true);
            w.out.extend_from_slice(wire::LAST_CHUNK);
            w.flush_out(io).await?;
            Ok(End::KeepAlive)
        }
        Behaviour::EmptyChoices => {
            if call.stream {
                w.out.clear();
                w.head(&meta, None, true);
                w.ev.clear();
                wire::empty_choices_event(&mut w.ev, &answer);
                wire::push_chunk(&mut w.out, &w.ev);
                wire::push_chunk(&mut w.out, wire::DONE_EVENT);
                w.out.extend_from_slice(wire::LAST_CHUNK);
                w.flush_out(io).await?;
            } else {
                w.ev.clear();
                wire::completion_json(&mut w.ev, &answer, None);
                w.send(io, &meta).await?;
            }
            Ok(End::KeepAlive)
        }
    }
}

/// The normal answer: JSON, or SSE with `shape`.
async fn ok<S: MockIo>(
    io: &mut S,
    w: &mut Writer,
    sh: &Shared,
    call: &Call<'_>,
    meta: &Meta<'_>,
    answer: &Answer<'_>,
    shape: StreamShape,
) -> io::Result<End> {
    if call.stream {
        sse(io, w, sh, meta, answer, shape, None).await?;
    } else {
        w.ev.clear();
        wire::completion_json(&mut w.ev, answer, Some(sh.reply.escaped()));
        w.send(io, meta).await?;
    }
    Ok(End::KeepAlive)
}

/// An SSE answer. With `die_after: Some(k)`, stop after `k` content events without the final
/// event, `[DONE]` or the terminal chunk (the caller then resets the connection).
async fn sse<S: MockIo>(
    io: &mut S,
    w: &mut Writer,
    sh: &Shared,
    meta: &Meta<'_>,
    answer: &Answer<'_>,
    shape: StreamShape,
    die_after: Option<usize>,
) -> io::Result<()> {
    w.out.clear();
    w.head(meta, None, true);
    let count = die_after.unwrap_or(shape.chunks);
    for i in 0..count {
        if i > 0 && !shape.gap.is_zero() {
            tokio::time::sleep(shape.gap).await;
        }
        w.ev.clear();
        wire::content_event(&mut w.ev, answer, sh.reply.piece(i, shape.chunks));
        wire::push_chunk(&mut w.out, &w.ev);
        w.flush_out(io).await?;
    }
    if die_after.is_some() {
        if !w.out.is_empty() {
            // No event at all: still send the header.
            w.flush_out(io).await?;
        }
        return Ok(());
    }
    if count > 0 && !shape.gap.is_zero() {
        tokio::time::sleep(shape.gap).await;
    }
    w.ev.clear();
    wire::finish_event(&mut w.ev, answer);
    wire::push_chunk(&mut w.out, &w.ev);
    wire::push_chunk(&mut w.out, wire::DONE_EVENT);
    w.out.extend_from_slice(wire::LAST_CHUNK);
    w.flush_out(io).await
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

fn parse_usize(s: &[u8]) -> Option<usize> {
    let s = trim(s);
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn find_crlf(s: &[u8]) -> Option<usize> {
    s.windows(2).position(|w| w == b"\r\n")
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0xf) as usize] as char);
    }
    s
}
