//! A fast, scriptable, OpenAI-compatible mock LLM provider.
//!
//! It is the upstream used by signalbox's tests, example configuration and load tests. It speaks
//! HTTP/1.1 (optionally over TLS) with a hand-rolled server on tokio + httparse so that it can
//! misbehave at exact points: reset a connection (SO_LINGER 0), close it before any byte, die in
//! the middle of an SSE stream, hang, answer an error status, and so on.
//!
//! Routes (any path prefix is accepted for the provider routes):
//! - `POST .../chat/completions`: answers according to the next scripted [`Behaviour`] (FIFO) or,
//!   when the script is empty, the default behaviour.
//! - `GET .../models`: a fixed one-model list.
//! - `GET /_mock/stats`, `POST /_mock/script`, `POST /_mock/default`, `POST /_mock/reset`:
//!   control endpoints, never counted as calls.

mod server;
mod tls;
mod wire;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// Configuration of one mock provider.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Echoed in the response header `x-mock-name` and in `/_mock/stats`.
    pub name: String,
    /// Used when the script queue is empty.
    pub default_behaviour: Behaviour,
    /// Default SSE shape.
    pub stream: StreamShape,
    /// Assistant text.
    pub reply: String,
    /// Record requests (true by default; load tests turn it off).
    pub record: bool,
    /// Serve HTTPS with this certificate chain and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// Answer with this `model` instead of echoing the request's, as providers that report a
    /// dated snapshot (`gpt-4o-mini-2024-07-18`) or a shortened name do. A JSON string's
    /// content, already escaped.
    pub echo_model: Option<String>,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            name: "mock".to_string(),
            default_behaviour: Behaviour::Ok,
            stream: StreamShape::default(),
            reply: "Hello from signalbox-mock.".to_string(),
            record: true,
            tls: None,
            echo_model: None,
        }
    }
}

/// PEM files for serving HTTPS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_chain_pem: PathBuf,
    pub key_pem: PathBuf,
}

/// Shape of an SSE answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamShape {
    /// Number of content chunks (events carrying a piece of the reply).
    pub chunks: usize,
    /// Pause before every event but the first (content events and the final `finish_reason`
    /// event; `[DONE]` follows the final event immediately).
    pub gap: Duration,
}

impl Default for StreamShape {
    fn default() -> Self {
        StreamShape {
            chunks: 5,
            gap: Duration::ZERO,
        }
    }
}

/// What the mock does with one chat-completion call.
///
/// JSON form: `{"kind":"<snake_case variant>", ...fields}`, e.g. `{"kind":"status","code":503}`.
/// Unknown fields are rejected for every variant (deserialization goes through a private
/// mirror enum because serde ignores extra fields on unit variants of internally tagged enums).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    deny_unknown_fields,
    from = "BehaviourRepr"
)]
pub enum Behaviour {
    /// Normal answer (JSON, or SSE if the request has `"stream": true`).
    Ok,
    /// Answer `code` with an OpenAI-shaped error body. Without `body`, the default body echoes
    /// the request's `Authorization` value and `Host` (the gateway's tests check it never leaks).
    /// `retry_after` is sent verbatim as `Retry-After`.
    Status {
        code: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    /// Wait, then behave as `Ok`.
    SlowHeader { ms: u64 },
    /// Read the request, never answer (until the client closes).
    Hang,
    /// Read the request, then reset the connection (SO_LINGER 0) before any byte.
    Reset,
    /// Read the request, then close cleanly (FIN; close_notify under TLS) before any byte.
    Close,
    /// SSE: 200 header + `after_chunks` data events, then RST (no terminal chunk, no `[DONE]`).
    /// Non-stream request: the header and half the JSON body, then RST.
    MidStreamDeath { after_chunks: usize },
    /// SSE: 200 header, then the terminal chunk with no events at all (no `[DONE]`).
    EmptyStream,
    /// 200 with `"choices": []` (JSON), or for SSE one chunk with `"choices": []` then `[DONE]`.
    EmptyChoices,
    /// Like `Ok` but with this SSE shape for this call.
    Stream { chunks: usize, gap_ms: u64 },
}

/// Deserialization mirror of [`Behaviour`] whose unit variants are empty struct variants, so that
/// `deny_unknown_fields` applies to them too.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum BehaviourRepr {
    Ok {},
    Status {
        code: u16,
        #[serde(default)]
        retry_after: Option<String>,
        #[serde(default)]
        body: Option<String>,
    },
    SlowHeader {
        ms: u64,
    },
    Hang {},
    Reset {},
    Close {},
    MidStreamDeath {
        after_chunks: usize,
    },
    EmptyStream {},
    EmptyChoices {},
    Stream {
        chunks: usize,
        gap_ms: u64,
    },
}

impl From<BehaviourRepr> for Behaviour {
    fn from(repr: BehaviourRepr) -> Behaviour {
        match repr {
            BehaviourRepr::Ok {} => Behaviour::Ok,
            BehaviourRepr::Status {
                code,
                retry_after,
                body,
            } => Behaviour::Status {
                code,
                retry_after,
                body,
            },
            BehaviourRepr::SlowHeader { ms } => Behaviour::SlowHeader { ms },
            BehaviourRepr::Hang {} => Behaviour::Hang,
            BehaviourRepr::Reset {} => Behaviour::Reset,
            BehaviourRepr::Close {} => Behaviour::Close,
            BehaviourRepr::MidStreamDeath { after_chunks } => {
                Behaviour::MidStreamDeath { after_chunks }
            }
            BehaviourRepr::EmptyStream {} => Behaviour::EmptyStream,
            BehaviourRepr::EmptyChoices {} => Behaviour::EmptyChoices,
            BehaviourRepr::Stream { chunks, gap_ms } => Behaviour::Stream { chunks, gap_ms },
        }
    }
}

/// One chat-completion request as received by the mock.
#[derive(Clone, Debug, Serialize)]
pub struct RecordedRequest {
    pub method: String,
    /// Includes the query string, if any.
    pub path: String,
    /// All request headers, lower-cased names, in order.
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
    /// Lowercase hex SHA-256 of the exact body bytes received (after chunked decoding).
    pub body_sha256: String,
    /// Top-level `"model"` of the JSON body, if it is a string.
    pub model: Option<String>,
    /// Top-level `"stream": true`.
    pub stream: bool,
    /// What the mock did with it.
    pub behaviour: Behaviour,
}

impl RecordedRequest {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Starts mock providers.
pub struct MockServer;

impl MockServer {
    /// Bind and start serving in the background on the current tokio runtime. Returns once
    /// listening. The server runs until [`MockHandle::shutdown`] (or until the runtime ends).
    pub async fn start(bind: SocketAddr, config: MockConfig) -> std::io::Result<MockHandle> {
        let acceptor = match &config.tls {
            Some(files) => Some(tls::acceptor(files)?),
            None => None,
        };
        let listener = server::bind(bind)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        tokio::spawn(server::accept_loop(listener, acceptor, shared.clone()));
        Ok(MockHandle { addr, shared })
    }
}

/// Handle on a running mock provider. Cheap to clone.
#[derive(Clone)]
pub struct MockHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl MockHandle {
    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1` (`https` under TLS). An unspecified bind address is shown as loopback.
    pub fn base_url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let scheme = if self.shared.tls { "https" } else { "http" };
        format!("{scheme}://{}/v1", SocketAddr::new(ip, self.addr.port()))
    }

    /// The provider's name (as in `x-mock-name`).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Chat-completion calls received (requests fully read), including misbehaving ones.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// `GET .../models` calls.
    pub fn model_list_calls(&self) -> u64 {
        self.shared.model_list_calls.load(Ordering::Relaxed)
    }

    /// Append behaviours to the script; each chat call consumes one (FIFO) before the default.
    pub fn push_script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.shared.push_script(behaviours);
    }

    /// Replace the default behaviour (used when the script is empty).
    pub fn set_default(&self, behaviour: Behaviour) {
        self.shared.set_default(behaviour);
    }

    /// Recorded chat-completion requests, in arrival order (empty unless `record`).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.records).clone()
    }

    /// Clear counters, script and records; the default goes back to the configured one.
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Stop accepting and close live connections.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }
}

/// State shared by the accept loop, all connections and all handles of one mock provider.
struct Shared {
    name: String,
    /// `name` made safe for a header value.
    header_name: Vec<u8>,
    reply: wire::Reply,
    shape: StreamShape,
    record: bool,
    tls: bool,
    echo_model: Option<Vec<u8>>,
    config_default: Behaviour,
    /// The current default; connections cache it and re-read it when `default_gen` changes.
    default: Mutex<Arc<Behaviour>>,
    default_gen: AtomicU64,
    calls: AtomicU64,
    model_list_calls: AtomicU64,
    script: Mutex<VecDeque<Behaviour>>,
    /// Mirrors `script.len()` so that the empty case never takes the lock.
    script_len: AtomicUsize,
    records: Mutex<Vec<RecordedRequest>>,
    shutdown: watch::Sender<bool>,
}

impl Shared {
    fn new(config: MockConfig) -> Shared {
        let header_name = config
            .name
            .bytes()
            .filter(|b| *b == b'\t' || (*b >= 0x20 && *b != 0x7f))
            .collect();
        Shared {
            header_name,
            reply: wire::Reply::new(&config.reply),
            shape: config.stream,
            record: config.record,
            tls: config.tls.is_some(),
            echo_model: config.echo_model.map(String::into_bytes),
            default: Mutex::new(Arc::new(config.default_behaviour.clone())),
            config_default: config.default_behaviour,
            default_gen: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            model_list_calls: AtomicU64::new(0),
            script: Mutex::new(VecDeque::new()),
            script_len: AtomicUsize::new(0),
            records: Mutex::new(Vec::new()),
            shutdown: watch::Sender::new(false),
            name: config.name,
        }
    }

    fn push_script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        let mut script = lock(&self.script);
        script.extend(behaviours);
        self.script_len.store(script.len(), Ordering::Release);
    }

    /// The next scripted behaviour, if any. Lock-free when the script is empty.
    fn pop_script(&self) -> Option<Behaviour> {
        if self.script_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut script = lock(&self.script);
        let next = script.pop_front();
        self.script_len.store(script.len(), Ordering::Release);
        next
    }

    fn set_default(&self, behaviour: Behaviour) {
        let mut default = lock(&self.default);
        *default = Arc::new(behaviour);
        self.default_gen.fetch_add(1, Ordering::Release);
    }

    /// Refresh a connection's cached default if it changed since `cache.0`.
    fn refresh_default(&self, cache: &mut (u64, Arc<Behaviour>)) {
        let gen = self.default_gen.load(Ordering::Acquire);
        if gen != cache.0 {
            let default = lock(&self.default);
            // Read the generation again under the lock so that the pair is consistent.
            *cache = (self.default_gen.load(Ordering::Acquire), default.clone());
        }
    }

    fn current_default(&self) -> (u64, Arc<Behaviour>) {
        let default = lock(&self.default);
        (self.default_gen.load(Ordering::Acquire), default.clone())
    }

    fn reset(&self) {
        {
            let mut script = lock(&self.script);
            script.clear();
            self.script_len.store(0, Ordering::Release);
        }
        lock(&self.records).clear();
        self.set_default(self.config_default.clone());
        self.calls.store(0, Ordering::Relaxed);
        self.model_list_calls.store(0, Ordering::Relaxed);
    }
}

/// Lock a mutex, ignoring poisoning (the protected data stays consistent: every critical
/// section is a single push/pop/clear).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
