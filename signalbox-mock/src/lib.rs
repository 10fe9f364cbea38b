//! A fast, scriptable mock LLM provider speaking the OpenAI and Anthropic dialects.
//!
//! It is the upstream used by signalbox's tests, example configuration and load tests. It speaks
//! HTTP/1.1 (optionally over TLS) with a hand-rolled server on tokio + httparse so that it can
//! misbehave at exact points: reset a connection (SO_LINGER 0), close it before any byte, die in
//! the middle of an SSE stream, stall, send a provider error inside a 200 stream, hang, answer an
//! error status, and so on.
//!
//! Provider routes (any path prefix is accepted, so `/v1/...`, `/openai/v1/...` and `/...` all
//! work), each an [`Endpoint`]:
//!
//! | route | endpoint | dialect |
//! |---|---|---|
//! | `POST .../chat/completions` | [`Endpoint::ChatCompletions`] | OpenAI |
//! | `POST .../completions` | [`Endpoint::Completions`] (legacy text) | OpenAI |
//! | `POST .../embeddings` | [`Endpoint::Embeddings`] | OpenAI |
//! | `POST .../responses` | [`Endpoint::Responses`] | OpenAI |
//! | `POST .../messages` | [`Endpoint::Messages`] | Anthropic |
//! | `POST .../messages/count_tokens` | [`Endpoint::CountTokens`] | Anthropic |
//! | `POST .../moderations` | [`Endpoint::Moderations`] | OpenAI |
//!
//! Every provider call answers according to the next scripted [`Behaviour`] (FIFO, optionally
//! scoped to one endpoint) or, when none applies, the default behaviour. Behaviours are
//! dialect-neutral: the endpoint called decides the dialect of what is sent (error bodies,
//! stream events, in-band errors). What answers look like:
//!
//! - **Chat completions**: `chat.completion` JSON, or SSE `data:` chunks: a role-only first
//!   chunk (`"delta":{"role":"assistant","content":""}`), the content, a
//!   `finish_reason` chunk (which carries `usage`) and `data: [DONE]`. With
//!   `stream_options.include_usage: true` the finish chunk has no usage and a last chunk with
//!   `"choices": []` and `usage` comes before `[DONE]`, as OpenAI does. With `tools` (see
//!   below) the answer is one `tool_calls` entry (`call_mock_N`), finish reason `tool_calls`;
//!   streamed, a first chunk names the function (with the role) and the arguments follow
//!   over `chunks` chunks.
//! - **Completions**: `text_completion` JSON or SSE, like chat with `choices[].text`.
//! - **Embeddings**: one vector per input (a string, a token array, or an array of either) that
//!   carries meaning: a hashed bag of the input's lower-cased words (token ids as words),
//!   L2-normalised, of the request's `dimensions` (default 256), so inputs sharing words are
//!   near and the same input always gets the same vector; never streamed.
//! - **Responses**: a `response` object with one `message` output item (`output_text`), or with
//!   tools one `function_call` item; SSE `event:` + `data:` events, each with a `type` and a
//!   `sequence_number`: `response.created`, `response.in_progress`,
//!   `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
//!   × chunks (or `response.function_call_arguments.delta`), the `.done` events, and
//!   `response.completed` (with usage) as the terminal event.
//! - **Messages** (requires `x-api-key` and `anthropic-version`): a `message` object with
//!   `usage.input_tokens`/`output_tokens` and zero cache counts; SSE `message_start`,
//!   `content_block_start`, `ping`, `content_block_delta` × chunks, `content_block_stop`,
//!   `message_delta` (stop reason, `usage.output_tokens`), `message_stop`. With `thinking`
//!   enabled (`type` `enabled` or `adaptive`) a thinking block (thinking deltas then one
//!   `signature_delta`) comes first; with tools the answer is a `tool_use` block (`toolu_mock_N`,
//!   `input_json_delta` pieces), stop reason `tool_use`.
//! - **Count tokens**: `{"input_tokens": N}`; never streamed.
//! - **Moderations**: OpenAI's shape, `{"id","model","results":[{"flagged","categories",
//!   "category_scores"}]}` with one result per input (a string or a list of strings);
//!   flagged when the input contains, in any letter case, [`FLAG_WORD`] or one of
//!   [`MockConfig::flag_words`] (then category `harassment` is true and scores 0.99; every
//!   other category false, 0.0). Never streamed; scriptable like every endpoint (a status, a
//!   hang, a slow header).
//! - `GET .../models`: a fixed one-model list, in Anthropic's shape when the request carries
//!   `anthropic-version`, OpenAI's otherwise; never scripted, counted apart.
//!
//! A request asks for a tool call when it declares `tools` with at least one named tool, its
//! `tool_choice` is not `"none"` (`{"type":"none"}` for Anthropic), and its last turn is not a
//! tool result (a `tool`/`function` message, a `tool_result` block, a `function_call_output`
//! item). The tool called is the one `tool_choice` names, else the first named tool; its
//! arguments are always `{"query":"signalbox mock","limit":3}`.
//!
//! Token counts are deterministic: prompt/input tokens = body length / 4; completion/output
//! tokens = the words of what was generated.
//!
//! Control routes, never counted as calls: `GET /_mock/stats`, `POST /_mock/script`
//! (`?endpoint=<snake_case endpoint>` scopes the pushed behaviours), `POST /_mock/default`,
//! `POST /_mock/reset`.

mod behave;
mod request;
mod server;
mod surface;
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

/// The word that makes a moderation input flagged on every mock (any letter case).
pub const FLAG_WORD: &str = "mock-flagged";

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
    /// The provider key callers must present. `Some(k)`: OpenAI endpoints require
    /// `Authorization: Bearer k` and Anthropic endpoints `x-api-key: k` (401 otherwise, in the
    /// endpoint's dialect). `None`: OpenAI endpoints take any credential or none; Anthropic
    /// endpoints still require a non-empty `x-api-key`, as Anthropic does. A refused call counts
    /// and is recorded (as `Status { code: 401, .. }`) but does not consume the script.
    pub api_key: Option<String>,
    /// Header fields added to every response (a provider's `x-ratelimit-*`, say). Names and
    /// values holding CR or LF are left out.
    pub response_headers: Vec<(String, String)>,
    /// Words (besides [`FLAG_WORD`]) that make a moderation input flagged, matched in any
    /// letter case.
    pub flag_words: Vec<String>,
    /// Request quotas per provider key, as a provider's rate limits: `(key, requests)`. A
    /// call presenting the key (`Authorization: Bearer key` or `x-api-key: key`) takes one
    /// request from its quota and is answered with `x-ratelimit-limit-requests`,
    /// `x-ratelimit-remaining-requests` (what is left after it) and
    /// `x-ratelimit-reset-requests: 60s`; past the quota the call is a 429 (`Retry-After: 60`)
    /// with remaining `0`. The quotas never refill while the mock runs.
    pub key_quotas: Vec<(String, u64)>,
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
            api_key: None,
            response_headers: Vec::new(),
            flag_words: Vec::new(),
            key_quotas: Vec::new(),
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
    /// Number of content chunks (events carrying a piece of the reply) per content block: the
    /// reply, a tool call's arguments, a thinking block (which adds its signature delta). An
    /// OpenAI chat tool call adds one chunk naming the function.
    pub chunks: usize,
    /// Pause before every content event but the first and before the finishing events (OpenAI
    /// chat: the final `finish_reason` event, then `[DONE]` at once; Anthropic: the block stop,
    /// `message_delta` and `message_stop` together). Opening events go out with the first
    /// content event.
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

/// What the mock does with one provider call.
///
/// Behaviours are dialect-neutral: the endpoint called decides what the bytes look like (see
/// [`Endpoint`] and the crate docs). "Content events" below are the events that carry a piece
/// of the answer: a text delta, a tool call's name or argument piece, a thinking or signature
/// delta. Opening events that carry none (Anthropic `message_start`, a Responses
/// `response.created`) go out with the first content event; OpenAI chat and completion
/// streams have none unless asked for ([`Behaviour::InbandErrorFirst`] `after_start`).
///
/// Variants meant for streams also answer non-stream requests (and the endpoints that never
/// stream: embeddings, count tokens), as each variant says.
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
    /// Answer `code` with an error body in the endpoint's dialect: OpenAI
    /// `{"error":{"message","type","code"}}`, Anthropic
    /// `{"type":"error","error":{"type","message"}}` with the type Anthropic uses for that
    /// status (400 `invalid_request_error`, 401 `authentication_error`, 402 `billing_error`,
    /// 403 `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429
    /// `rate_limit_error`, 500 `api_error`, 504 `timeout_error`, 529 `overloaded_error`; other
    /// 4xx `invalid_request_error`, other 5xx `api_error`). Without `body`, the default body
    /// echoes the request's credential (`Authorization`; for Anthropic `x-api-key`, else
    /// `Authorization`) and `Host`: the gateway's tests check it never leaks. OpenAI's default
    /// body has type `mock_error` and code `mock_<code>`. `body` is sent verbatim in either
    /// dialect. `retry_after` is sent verbatim as `Retry-After`.
    Status {
        code: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    /// Wait, then behave as `Ok`.
    SlowHeader { ms: u64 },
    /// A slow tail: every `every`-th call to this mock (counted over all its calls) waits `ms`
    /// and then behaves as `Ok`; the others answer at once.
    SlowEvery { ms: u64, every: u64 },
    /// Read the request, never answer (until the client closes).
    Hang,
    /// Read the request, then reset the connection (SO_LINGER 0) before any byte.
    Reset,
    /// Read the request, then close cleanly (FIN; close_notify under TLS) before any byte.
    Close,
    /// SSE: 200 header, the opening events and `after_chunks` content events, then RST (no
    /// terminal chunk, no terminal event). Non-stream request: the header and half the JSON
    /// body, then RST.
    MidStreamDeath { after_chunks: usize },
    /// SSE: 200 header, then the terminal HTTP chunk with no events at all: OpenAI, no `[DONE]`;
    /// Anthropic, no `message_start` or `message_stop`; Responses, no `response.created`. The
    /// connection stays open. A non-stream request gets the same SSE answer.
    EmptyStream,
    /// An answer with nothing in it. Chat and completions: `"choices": []` (JSON), or for SSE
    /// one chunk with `"choices": []` then `[DONE]`. Responses: `"output": []`, or SSE
    /// `response.created` then `response.completed` with no output item. Messages:
    /// `"content": []`, or SSE `message_start` then `message_stop` with no content block.
    /// Embeddings: `"data": []`. Count tokens: `{"input_tokens":0}`.
    EmptyChoices,
    /// Like `Ok` but with this SSE shape for this call.
    Stream { chunks: usize, gap_ms: u64 },
    /// SSE: 200 header (chunked), then a clean close (FIN; close_notify under TLS) without a
    /// single event and without the terminal HTTP chunk: the body ends early. (The terminal
    /// chunk with no events is [`Behaviour::EmptyStream`].) Non-stream request: the header
    /// with the `content-length` of the normal body, then the close before any body byte.
    OkThenEof,
    /// SSE: 200 header, then the provider's in-band error event before any content, then the
    /// terminal HTTP chunk (no terminal event; the connection stays open). OpenAI chat and
    /// completions: `data: {"error":{"message","type","code"}}` (`type` and `code` both
    /// `error_type`); Responses: `event: error` with `{"type":"error","code","message",
    /// "param","sequence_number"}`; Anthropic: `event: error` with
    /// `{"type":"error","error":{"type","message"}}`. With `after_start`, the stream's opening
    /// event comes first (chat: a role-only chunk; completions: a chunk with empty text;
    /// Responses: `response.created` and `response.in_progress`; Anthropic: `message_start`).
    /// `error_type` defaults to `server_error` (OpenAI) or `overloaded_error` (Anthropic).
    /// Non-stream request: 200 whose JSON body is that error in the dialect's error shape.
    InbandErrorFirst {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_type: Option<String>,
        #[serde(default)]
        after_start: bool,
    },
    /// SSE: the opening events and `chunks` content events, then the in-band error event (as
    /// in [`Behaviour::InbandErrorFirst`]) and the terminal HTTP chunk: an error mid-answer.
    /// Non-stream request: as `InbandErrorFirst`.
    InbandErrorAfter {
        chunks: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_type: Option<String>,
    },
    /// SSE: the 200 header at once (flushed on its own), then nothing for `ms`, then the whole
    /// normal stream: a slow first token (time-to-first-token deadlines, first-chunk holds).
    /// Non-stream request: the header at once, the body after `ms`.
    StallBeforeFirst { ms: u64 },
    /// SSE: the opening events and `after_chunks` content events, then nothing for `ms` (on
    /// top of the shape's gap), then the rest of the normal stream: an idle stream. Non-stream
    /// request: the header and half the body, then the rest after `ms`.
    StallMidStream { after_chunks: usize, ms: u64 },
    /// SSE: the opening events and `chunks` content events, then the terminal HTTP chunk: the
    /// framing ends cleanly but the stream's own end is missing (no finish chunk, usage or
    /// `[DONE]`; Anthropic: no `content_block_stop`, `message_delta` or `message_stop`;
    /// Responses: no `.done` events or `response.completed`). The connection stays open.
    /// Non-stream request: the first half of the JSON body with a `content-length` of that
    /// half: well framed, not valid JSON.
    NoTerminal { chunks: usize },
    /// Answer with `body` verbatim, whatever was asked: a recorded provider answer (the
    /// conformance corpus in `tests/fixtures/providers/`). With `sse`, a chunked
    /// `text/event-stream` answer sent one HTTP chunk per event (each event flushed on its
    /// own), then the terminal chunk; else a `content-length` JSON answer. `retry_after` is
    /// sent verbatim as `Retry-After`.
    Replay {
        code: u16,
        body: String,
        #[serde(default)]
        sse: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<String>,
    },
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
    SlowEvery {
        ms: u64,
        every: u64,
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
    OkThenEof {},
    InbandErrorFirst {
        #[serde(default)]
        error_type: Option<String>,
        #[serde(default)]
        after_start: bool,
    },
    InbandErrorAfter {
        chunks: usize,
        #[serde(default)]
        error_type: Option<String>,
    },
    StallBeforeFirst {
        ms: u64,
    },
    StallMidStream {
        after_chunks: usize,
        ms: u64,
    },
    NoTerminal {
        chunks: usize,
    },
    Replay {
        code: u16,
        body: String,
        #[serde(default)]
        sse: bool,
        #[serde(default)]
        retry_after: Option<String>,
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
            BehaviourRepr::SlowEvery { ms, every } => Behaviour::SlowEvery {
                ms,
                every: every.max(1),
            },
            BehaviourRepr::Hang {} => Behaviour::Hang,
            BehaviourRepr::Reset {} => Behaviour::Reset,
            BehaviourRepr::Close {} => Behaviour::Close,
            BehaviourRepr::MidStreamDeath { after_chunks } => {
                Behaviour::MidStreamDeath { after_chunks }
            }
            BehaviourRepr::EmptyStream {} => Behaviour::EmptyStream,
            BehaviourRepr::EmptyChoices {} => Behaviour::EmptyChoices,
            BehaviourRepr::Stream { chunks, gap_ms } => Behaviour::Stream { chunks, gap_ms },
            BehaviourRepr::OkThenEof {} => Behaviour::OkThenEof,
            BehaviourRepr::InbandErrorFirst {
                error_type,
                after_start,
            } => Behaviour::InbandErrorFirst {
                error_type,
                after_start,
            },
            BehaviourRepr::InbandErrorAfter { chunks, error_type } => {
                Behaviour::InbandErrorAfter { chunks, error_type }
            }
            BehaviourRepr::StallBeforeFirst { ms } => Behaviour::StallBeforeFirst { ms },
            BehaviourRepr::StallMidStream { after_chunks, ms } => {
                Behaviour::StallMidStream { after_chunks, ms }
            }
            BehaviourRepr::NoTerminal { chunks } => Behaviour::NoTerminal { chunks },
            BehaviourRepr::Replay {
                code,
                body,
                sse,
                retry_after,
            } => Behaviour::Replay {
                code,
                body,
                sse,
                retry_after,
            },
        }
    }
}

/// A provider endpoint the mock serves. Its JSON form is the snake_case name
/// (`"chat_completions"`, `"count_tokens"`, ...), as in `/_mock/stats` and
/// `POST /_mock/script?endpoint=...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `POST .../chat/completions` (OpenAI).
    ChatCompletions,
    /// `POST .../completions`, the legacy text completions (OpenAI).
    Completions,
    /// `POST .../embeddings` (OpenAI).
    Embeddings,
    /// `POST .../responses` (OpenAI Responses API).
    Responses,
    /// `POST .../messages` (Anthropic).
    Messages,
    /// `POST .../messages/count_tokens` (Anthropic).
    CountTokens,
    /// `POST .../moderations` (OpenAI).
    Moderations,
}

impl Endpoint {
    /// Every endpoint, in a fixed order.
    pub const ALL: [Endpoint; 7] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::Moderations,
    ];

    /// The API dialect this endpoint speaks.
    pub fn dialect(self) -> Dialect {
        match self {
            Endpoint::Messages | Endpoint::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::Moderations => "moderations",
        }
    }

    fn from_name(name: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.as_str() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// An API dialect: the shape of errors, stream events and credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// OpenAI: `Authorization: Bearer`, `{"error":{...}}`, `data:`-only chat streams.
    OpenAi,
    /// Anthropic: `x-api-key` + `anthropic-version`, `{"type":"error",...}`, named events.
    Anthropic,
}

/// Bodies are kept in records up to this size ([`RecordedRequest::body`]).
pub const RECORDED_BODY_MAX: usize = 1 << 20;

/// One provider call as received by the mock (control calls and model lists are not recorded).
#[derive(Clone, Debug, Serialize)]
pub struct RecordedRequest {
    /// The endpoint called (its dialect: `endpoint.dialect()`).
    pub endpoint: Endpoint,
    pub method: String,
    /// Includes the query string, if any.
    pub path: String,
    /// All request headers, lower-cased names, in order.
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
    /// Lowercase hex SHA-256 of the exact body bytes received (after chunked decoding).
    pub body_sha256: String,
    /// The body bytes received, up to [`RECORDED_BODY_MAX`] (compare `body.len()` with
    /// `body_len`). Not in `/_mock/stats`.
    #[serde(skip)]
    pub body: Vec<u8>,
    /// Top-level `"model"` of the JSON body, if it is a string.
    pub model: Option<String>,
    /// Top-level `"stream": true`.
    pub stream: bool,
    /// What the mock did with it.
    pub behaviour: Behaviour,
    /// When the request's body was read in full (what a test measures gaps between calls by).
    #[serde(skip)]
    pub received: std::time::Instant,
}

impl RecordedRequest {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON, when it was recorded whole and parses.
    pub fn json(&self) -> Option<serde_json::Value> {
        if self.body.len() != self.body_len {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
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

    /// Provider calls received on every endpoint (requests fully read), including misbehaving
    /// ones and ones refused for a bad credential, header or body.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Provider calls received on one endpoint.
    pub fn calls_to(&self, endpoint: Endpoint) -> u64 {
        self.shared.calls_by[endpoint.index()].load(Ordering::Relaxed)
    }

    /// `GET .../models` calls.
    pub fn model_list_calls(&self) -> u64 {
        self.shared.model_list_calls.load(Ordering::Relaxed)
    }

    /// Append behaviours to the script; each provider call consumes one (FIFO) before the
    /// default.
    pub fn push_script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.shared.push_script(None, behaviours);
    }

    /// Append behaviours that only calls to `endpoint` consume. A call takes the first entry of
    /// the script that is unscoped or scoped to its endpoint; entries for other endpoints stay.
    pub fn push_script_for(
        &self,
        endpoint: Endpoint,
        behaviours: impl IntoIterator<Item = Behaviour>,
    ) {
        self.shared.push_script(Some(endpoint), behaviours);
    }

    /// Replace the default behaviour (used when the script is empty).
    pub fn set_default(&self, behaviour: Behaviour) {
        self.shared.set_default(behaviour);
    }

    /// Recorded provider calls, in arrival order (empty unless `record`).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.records).clone()
    }

    /// When the client closed each connection the mock held open without answering
    /// ([`Behaviour::Hang`]), in order: how a test sees that a gateway gave up a call.
    pub fn hang_ups(&self) -> Vec<std::time::Instant> {
        lock(&self.shared.hang_ups).clone()
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
    /// `name` made safe for a header value, followed by the configured response header fields
    /// (each `\r\nname: value`): written as the value of `x-mock-name`, it ends the line.
    header_name: Vec<u8>,
    reply: wire::Reply,
    shape: StreamShape,
    record: bool,
    tls: bool,
    echo_model: Option<Vec<u8>>,
    /// `echo_model` unescaped, for answers built with serde.
    echo_model_raw: Option<String>,
    api_key: Option<String>,
    /// Lower-cased: [`FLAG_WORD`] and the configured flag words.
    flag_words: Vec<String>,
    /// `MockConfig::key_quotas`: each key, its quota and the calls it has made.
    quotas: Vec<(String, u64, AtomicU64)>,
    config_default: Behaviour,
    /// The current default; connections cache it and re-read it when `default_gen` changes.
    default: Mutex<Arc<Behaviour>>,
    default_gen: AtomicU64,
    calls: AtomicU64,
    /// Per endpoint, indexed by `Endpoint::index`.
    calls_by: [AtomicU64; Endpoint::ALL.len()],
    model_list_calls: AtomicU64,
    /// Behaviours, each for any endpoint (`None`) or one.
    script: Mutex<VecDeque<(Option<Endpoint>, Behaviour)>>,
    /// Mirrors `script.len()` so that the empty case never takes the lock.
    script_len: AtomicUsize,
    records: Mutex<Vec<RecordedRequest>>,
    /// When a client closed a connection the mock was holding open ([`Behaviour::Hang`]).
    hang_ups: Mutex<Vec<std::time::Instant>>,
    shutdown: watch::Sender<bool>,
}

impl Shared {
    /// The quota of the key a call presents (its `Authorization` or `x-api-key` value).
    fn quota_of(&self, credential: &[u8]) -> Option<&(String, u64, AtomicU64)> {
        let key = credential.strip_prefix(b"Bearer ").unwrap_or(credential);
        self.quotas.iter().find(|(k, _, _)| k.as_bytes() == key)
    }

    fn new(config: MockConfig) -> Shared {
        let mut header_name: Vec<u8> = config
            .name
            .bytes()
            .filter(|b| *b == b'\t' || (*b >= 0x20 && *b != 0x7f))
            .collect();
        for (k, v) in &config.response_headers {
            let clean = |s: &str| !s.bytes().any(|b| b == b'\r' || b == b'\n');
            if clean(k) && clean(v) && !k.is_empty() {
                header_name.extend_from_slice(b"\r\n");
                header_name.extend_from_slice(k.as_bytes());
                header_name.extend_from_slice(b": ");
                header_name.extend_from_slice(v.as_bytes());
            }
        }
        Shared {
            header_name,
            reply: wire::Reply::new(&config.reply),
            shape: config.stream,
            record: config.record,
            tls: config.tls.is_some(),
            echo_model_raw: config.echo_model.as_deref().map(unescape_json),
            echo_model: config.echo_model.map(String::into_bytes),
            api_key: config.api_key,
            flag_words: std::iter::once(FLAG_WORD.to_string())
                .chain(config.flag_words.iter().map(|w| w.to_lowercase()))
                .filter(|w| !w.is_empty())
                .collect(),
            quotas: config
                .key_quotas
                .iter()
                .map(|(k, n)| (k.clone(), *n, AtomicU64::new(0)))
                .collect(),
            default: Mutex::new(Arc::new(config.default_behaviour.clone())),
            config_default: config.default_behaviour,
            default_gen: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            calls_by: Default::default(),
            model_list_calls: AtomicU64::new(0),
            script: Mutex::new(VecDeque::new()),
            script_len: AtomicUsize::new(0),
            records: Mutex::new(Vec::new()),
            hang_ups: Mutex::new(Vec::new()),
            shutdown: watch::Sender::new(false),
            name: config.name,
        }
    }

    fn push_script(
        &self,
        scope: Option<Endpoint>,
        behaviours: impl IntoIterator<Item = Behaviour>,
    ) {
        let mut script = lock(&self.script);
        script.extend(behaviours.into_iter().map(|b| (scope, b)));
        self.script_len.store(script.len(), Ordering::Release);
    }

    /// The next scripted behaviour for `endpoint`, if any. Lock-free when the script is empty.
    fn pop_script(&self, endpoint: Endpoint) -> Option<Behaviour> {
        if self.script_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut script = lock(&self.script);
        let at = script
            .iter()
            .position(|(scope, _)| scope.is_none_or(|e| e == endpoint))?;
        let next = script.remove(at).map(|(_, b)| b);
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
        lock(&self.hang_ups).clear();
        self.set_default(self.config_default.clone());
        self.calls.store(0, Ordering::Relaxed);
        for c in &self.calls_by {
            c.store(0, Ordering::Relaxed);
        }
        self.model_list_calls.store(0, Ordering::Relaxed);
    }
}

/// Lock a mutex, ignoring poisoning (the protected data stays consistent: every critical
/// section is a single push/pop/clear).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The content of a JSON string given already escaped (as `MockConfig::echo_model` is); taken
/// as is when it is not valid escaped content.
fn unescape_json(escaped: &str) -> String {
    serde_json::from_str(&format!("\"{escaped}\"")).unwrap_or_else(|_| escaped.to_string())
}
