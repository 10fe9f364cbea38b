//! The hand-rolled HTTP/1.1 server: accept loop, request parsing, routing, control endpoints,
//! and the intake of provider calls (credentials, body facts, script, record) before
//! `behave::act` answers them.
//!
//! One task per connection; each connection owns its buffers and reuses them between requests.
//! The hot path (no script, `record: false`) takes no lock: the script length is an atomic and
//! the default behaviour is cached per connection behind a generation counter.

use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::behave::{self, Call, End, Meta, Writer, JSON};
use super::request::probe;
use super::surface::{self, Ctx};
use super::tls::MockIo;
use super::wire;
use super::{lock, Behaviour, Dialect, Endpoint, RecordedRequest, Shared, RECORDED_BODY_MAX};

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
    x_api_key: Option<Range<usize>>,
    anthropic_version: Option<Range<usize>>,
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
    Provider(Endpoint),
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
        p if p.ends_with(b"/chat/completions") => {
            (false, Route::Provider(Endpoint::ChatCompletions))
        }
        p if p.ends_with(b"/completions") => (false, Route::Provider(Endpoint::Completions)),
        p if p.ends_with(b"/embeddings") => (false, Route::Provider(Endpoint::Embeddings)),
        p if p.ends_with(b"/responses") => (false, Route::Provider(Endpoint::Responses)),
        p if p.ends_with(b"/moderations") => (false, Route::Provider(Endpoint::Moderations)),
        p if p.ends_with(b"/messages/count_tokens") => {
            (false, Route::Provider(Endpoint::CountTokens))
        }
        p if p.ends_with(b"/messages") => (false, Route::Provider(Endpoint::Messages)),
        p if p.ends_with(b"/models") => (true, Route::Models),
        _ => return Route::NotFound,
    };
    if (want_get && get) || (!want_get && post) {
        r
    } else {
        Route::MethodNotAllowed
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

impl Conn {
    fn new(shared: Arc<Shared>) -> Conn {
        let default = shared.current_default();
        Conn {
            shared,
            buf: Vec::with_capacity(READ_RESERVE),
            body: Vec::new(),
            hdrs: Vec::with_capacity(16),
            model: Vec::with_capacity(64),
            w: Writer::new(),
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
                crate::lock(&self.shared.hang_ups).push(std::time::Instant::now());
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
        let path = &self.buf[head.path.clone()];
        let route = route(&self.buf[head.method.clone()], path);
        if let Route::Provider(endpoint) = route {
            return self.provider_call(io, head, body, endpoint).await;
        }
        let sh = &*self.shared;
        let body: &[u8] = match body {
            BodyLoc::Buf(r) => &self.buf[r.clone()],
            BodyLoc::Decoded => &self.body,
        };
        // Errors on non-provider routes speak Anthropic to a request that does.
        let dialect = if head.anthropic_version.is_some() {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        };
        let ev = &mut self.w.ev;
        ev.clear();
        let code = match route {
            Route::Models => {
                sh.model_list_calls.fetch_add(1, Ordering::Relaxed);
                ev.extend_from_slice(match dialect {
                    Dialect::OpenAi => wire::MODELS_JSON,
                    Dialect::Anthropic => wire::ANTHROPIC_MODELS_JSON,
                });
                200
            }
            Route::Stats => {
                #[derive(serde::Serialize)]
                struct Stats<'a> {
                    name: &'a str,
                    calls: u64,
                    calls_by_endpoint: std::collections::BTreeMap<&'static str, u64>,
                    model_list_calls: u64,
                    requests: &'a [RecordedRequest],
                }
                let records = lock(&sh.records);
                let stats = Stats {
                    name: &sh.name,
                    calls: sh.calls.load(Ordering::Relaxed),
                    calls_by_endpoint: Endpoint::ALL
                        .into_iter()
                        .map(|e| (e.as_str(), sh.calls_by[e.index()].load(Ordering::Relaxed)))
                        .collect(),
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
            Route::Script => match script_scope(path) {
                Err(msg) => {
                    wire::error_json(ev, msg.as_bytes(), "invalid_request_error", "invalid_json");
                    400
                }
                Ok(scope) => match serde_json::from_slice::<Vec<Behaviour>>(body) {
                    Ok(script) => {
                        sh.push_script(scope, script);
                        ev.extend_from_slice(b"{\"ok\":true}");
                        200
                    }
                    Err(e) => bad_json(ev, &e),
                },
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
                surface::error_body(
                    dialect,
                    ev,
                    405,
                    "method not allowed",
                    "invalid_request_error",
                    "method_not_allowed",
                );
                405
            }
            Route::NotFound | Route::Provider(_) => {
                let msg = format!("unknown path {}", String::from_utf8_lossy(path));
                surface::error_body(
                    dialect,
                    ev,
                    404,
                    &msg,
                    "invalid_request_error",
                    "unknown_url",
                );
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

    /// A call to a provider endpoint: check its credential and headers, read its body, pick
    /// its behaviour, record it, answer.
    async fn provider_call<S: MockIo>(
        &mut self,
        io: &mut S,
        head: &ReqHead,
        body: &BodyLoc,
        endpoint: Endpoint,
    ) -> io::Result<End> {
        let sh = &*self.shared;
        let n = sh.calls.fetch_add(1, Ordering::Relaxed) + 1;
        sh.calls_by[endpoint.index()].fetch_add(1, Ordering::Relaxed);
        let body: &[u8] = match body {
            BodyLoc::Buf(r) => &self.buf[r.clone()],
            BodyLoc::Decoded => &self.body,
        };
        let dialect = endpoint.dialect();
        let header = |r: &Option<Range<usize>>| r.clone().map(|r| &self.buf[r]);
        // A provider checks the credential and the headers before it reads the body.
        let refused = refusal(sh.api_key.as_deref(), dialect, head, &self.buf)
            .map(|(code, msg, openai_code)| (code, msg.to_string(), openai_code));
        let facts = match refused {
            Some(refused) => Err(refused),
            None => probe(body).map_err(|msg| (400, msg, "invalid_json")),
        };
        let facts = match facts {
            Ok(facts) => facts,
            Err((code, msg, openai_code)) => {
                let ev = &mut self.w.ev;
                ev.clear();
                surface::error_body(
                    dialect,
                    ev,
                    code,
                    &msg,
                    "invalid_request_error",
                    openai_code,
                );
                if sh.record {
                    let behaviour = Behaviour::Status {
                        code,
                        retry_after: None,
                        body: Some(String::from_utf8_lossy(ev).into_owned()),
                    };
                    let rec = Record {
                        endpoint,
                        model: None,
                        stream: false,
                        behaviour,
                    };
                    record(sh, &self.buf, head, &self.hdrs, body, rec);
                }
                let meta = Meta {
                    code,
                    content_type: JSON,
                    close: head.close,
                    retry_after: None,
                    name: &sh.header_name,
                };
                self.w.send(io, &meta).await?;
                return Ok(End::KeepAlive);
            }
        };
        self.model.clear();
        match &facts.model {
            Some(m) => wire::escape_json(&mut self.model, m.as_bytes()),
            None => self.model.extend_from_slice(b"mock-model"),
        }
        let authorization = header(&head.authorization);
        let credential = match dialect {
            Dialect::OpenAi => authorization,
            Dialect::Anthropic => header(&head.x_api_key).or(authorization),
        };
        // A key with a quota: one request taken, its rate-limit headers on the answer, a 429
        // past it.
        let mut quota_headers = Vec::new();
        let mut over_quota = None;
        if let Some((_, limit, used)) = credential.and_then(|c| sh.quota_of(c)) {
            let used = used.fetch_add(1, Ordering::Relaxed) + 1;
            let left = limit.saturating_sub(used);
            quota_headers.extend_from_slice(&sh.header_name);
            quota_headers.extend_from_slice(
                format!(
                    "\r\nx-ratelimit-limit-requests: {limit}\r\nx-ratelimit-remaining-requests: {left}\r\nx-ratelimit-reset-requests: 60s"
                )
                .as_bytes(),
            );
            if used > *limit {
                over_quota = Some(Behaviour::Status {
                    code: 429,
                    retry_after: Some("60".to_string()),
                    body: None,
                });
            }
        }
        let scripted = match over_quota {
            Some(b) => Some(b),
            None => sh.pop_script(endpoint),
        };
        if scripted.is_none() {
            sh.refresh_default(&mut self.default);
        }
        let behaviour: &Behaviour = scripted.as_ref().unwrap_or(&self.default.1);
        if sh.record {
            let rec = Record {
                endpoint,
                model: facts.model.as_deref().map(str::to_string),
                stream: facts.stream,
                behaviour: behaviour.clone(),
            };
            record(sh, &self.buf, head, &self.hdrs, body, rec);
        }
        let call = Call {
            endpoint,
            stream: facts.stream,
            close: head.close,
            credential: credential.unwrap_or_default(),
            host: header(&head.host).unwrap_or_default(),
            name: if quota_headers.is_empty() {
                &sh.header_name
            } else {
                &quota_headers
            },
            shape: sh.shape,
        };
        let cx = Ctx {
            n,
            created: wire::unix_secs(),
            model_escaped: sh.echo_model.as_deref().unwrap_or(&self.model),
            model: sh
                .echo_model_raw
                .as_deref()
                .or(facts.model.as_deref())
                .unwrap_or("mock-model"),
            prompt_tokens: (body.len() / 4) as u64,
            reply: &sh.reply,
            chunks: sh.shape.chunks,
            include_usage: facts.include_usage,
            tool: facts.tool.as_deref(),
            thinking: facts.thinking,
            inputs: facts.inputs,
            flagged: match endpoint {
                Endpoint::Moderations => crate::request::moderation_flags(body, &sh.flag_words),
                _ => Vec::new(),
            },
            embedding_texts: match endpoint {
                Endpoint::Embeddings => crate::request::embedding_texts(body),
                _ => Vec::new(),
            },
            embedding_dimensions: match endpoint {
                Endpoint::Embeddings => crate::request::embedding_dimensions(body),
                _ => None,
            },
        };
        behave::act(io, &mut self.w, &call, cx, behaviour).await
    }
}

/// Why a provider call is refused before its body is read: `(status, message, OpenAI code)`.
/// See `MockConfig::api_key`.
fn refusal(
    api_key: Option<&str>,
    dialect: Dialect,
    head: &ReqHead,
    buf: &[u8],
) -> Option<(u16, &'static str, &'static str)> {
    let header = |r: &Option<Range<usize>>| r.clone().map(|r| trim(&buf[r]));
    match dialect {
        Dialect::OpenAi => {
            let key = api_key?;
            let ok = header(&head.authorization)
                .and_then(|v| v.strip_prefix(b"Bearer "))
                .is_some_and(|v| v == key.as_bytes());
            (!ok).then_some((401, "Incorrect API key provided", "invalid_api_key"))
        }
        Dialect::Anthropic => {
            match (header(&head.x_api_key), api_key) {
                (None | Some(b""), _) => {
                    return Some((401, "x-api-key header is required", "invalid_api_key"));
                }
                (Some(got), Some(key)) if got != key.as_bytes() => {
                    return Some((401, "invalid x-api-key", "invalid_api_key"));
                }
                _ => {}
            }
            match header(&head.anthropic_version) {
                None | Some(b"") => Some((
                    400,
                    "anthropic-version: header is required",
                    "invalid_request",
                )),
                Some(_) => None,
            }
        }
    }
}

/// The endpoint `POST /_mock/script?endpoint=NAME` scopes the behaviours to.
fn script_scope(path: &[u8]) -> Result<Option<Endpoint>, String> {
    let Some(q) = path.iter().position(|b| *b == b'?') else {
        return Ok(None);
    };
    let query = String::from_utf8_lossy(&path[q + 1..]);
    for pair in query.split('&') {
        if let Some(name) = pair.strip_prefix("endpoint=") {
            return Endpoint::from_name(name)
                .map(Some)
                .ok_or_else(|| format!("unknown endpoint {name:?}"));
        }
    }
    Ok(None)
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
        x_api_key: None,
        anthropic_version: None,
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
        } else if name.eq_ignore_ascii_case(b"x-api-key") && head.x_api_key.is_none() {
            head.x_api_key = Some(range(value));
        } else if name.eq_ignore_ascii_case(b"anthropic-version")
            && head.anthropic_version.is_none()
        {
            head.anthropic_version = Some(range(value));
        }
    }
    head.content_length = content_length.unwrap_or(0);
    HeadRead::Req(head)
}

fn bad_json(ev: &mut Vec<u8>, e: &serde_json::Error) -> u16 {
    ev.clear();
    let msg = format!("invalid control JSON: {e}");
    wire::error_json(ev, msg.as_bytes(), "invalid_request_error", "invalid_json");
    400
}

/// What a record says besides the request itself.
struct Record {
    endpoint: Endpoint,
    model: Option<String>,
    stream: bool,
    behaviour: Behaviour,
}

fn record(
    sh: &Shared,
    buf: &[u8],
    head: &ReqHead,
    hdrs: &[(Range<usize>, Range<usize>)],
    body: &[u8],
    rec: Record,
) {
    let text = |r: &Range<usize>| String::from_utf8_lossy(&buf[r.clone()]).into_owned();
    let rec = RecordedRequest {
        endpoint: rec.endpoint,
        method: text(&head.method),
        path: text(&head.path),
        headers: hdrs
            .iter()
            .map(|(n, v)| (text(n).to_ascii_lowercase(), text(v)))
            .collect(),
        body_len: body.len(),
        body_sha256: hex::encode(Sha256::digest(body)),
        body: body[..body.len().min(RECORDED_BODY_MAX)].to_vec(),
        model: rec.model,
        stream: rec.stream,
        behaviour: rec.behaviour,
        received: std::time::Instant::now(),
    };
    lock(&sh.records).push(rec);
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
