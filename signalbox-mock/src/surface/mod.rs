//! What each endpoint's answers look like, cut where behaviours act on them.
//!
//! A [`Surface`] knows one endpoint's bytes: its JSON answer and its SSE stream split into
//! opening events, numbered content events and the finishing events, plus its in-band error.
//! The behaviours (`behave.rs`) are written once against that split: a stream that dies after
//! two content events, stalls after one or loses its terminal event does so in every dialect.
//!
//! The chat-completions text answer is built byte by byte (`wire.rs`): load tests measure the
//! gateway's per-chunk delay against it, and it allocates nothing per event. Every other answer
//! is built with `serde_json::json!`, which is plenty for tests.

mod anthropic;
mod openai;

pub(super) use anthropic::{CountTokens, Messages};
pub(super) use openai::{Chat, Completions, Embeddings, Moderations, Responses};

use serde_json::{json, Value};

use super::wire::{self, Reply};
use super::Dialect;

/// The arguments of every tool call the mock makes (ASCII, so it splits anywhere).
pub(super) const TOOL_ARGUMENTS: &str = r#"{"query":"signalbox mock","limit":3}"#;
/// The text of a thinking block.
const THINKING: &str = "The user wants a short answer; reply briefly.";
/// The signature of every thinking block.
const SIGNATURE: &str = "bW9jay1zaWduYXR1cmU=";
/// The message of in-band errors.
const INBAND_MESSAGE: &str = "mock in-band error";

/// What one answer is made of.
pub(super) struct Ctx<'a> {
    /// The call's number on this mock (1-based): ids are `..._mock_<n>`.
    pub(super) n: u64,
    pub(super) created: u64,
    /// The model to answer with, JSON-escaped (for `wire`) and raw (for serde).
    pub(super) model_escaped: &'a [u8],
    pub(super) model: &'a str,
    pub(super) prompt_tokens: u64,
    pub(super) reply: &'a Reply,
    /// Content pieces per block (the stream shape's `chunks`).
    pub(super) chunks: usize,
    pub(super) include_usage: bool,
    /// Call this function instead of answering text.
    pub(super) tool: Option<&'a str>,
    pub(super) thinking: bool,
    /// Embeddings: how many vectors.
    pub(super) inputs: usize,
    /// Embeddings: each input's text (token ids as `t<id>` words), in order.
    pub(super) embedding_texts: Vec<String>,
    /// Embeddings: the request's `dimensions`.
    pub(super) embedding_dimensions: Option<usize>,
    /// Moderations: whether each input is flagged, in order.
    pub(super) flagged: Vec<bool>,
}

impl Ctx<'_> {
    fn wire_answer(&self, completion_tokens: u64) -> wire::Answer<'_> {
        wire::Answer {
            n: self.n,
            created: self.created,
            model: self.model_escaped,
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
        }
    }

    /// Output tokens: the words generated (reply or tool arguments, plus any thinking).
    fn completion_tokens(&self) -> u64 {
        let main = match self.tool {
            Some(_) => words(TOOL_ARGUMENTS),
            None => self.reply.words,
        };
        main + if self.thinking { words(THINKING) } else { 0 }
    }
}

fn words(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

/// Piece `i` of `s` cut into `k` pieces of about equal byte length (`s` is ASCII). Pieces past
/// `k` are empty.
fn byte_piece(s: &str, i: usize, k: usize) -> &str {
    if i >= k {
        return "";
    }
    &s[i * s.len() / k..(i + 1) * s.len() / k]
}

/// Builds SSE events, each framed as one HTTP chunk appended to `out`.
pub(super) struct Frames<'a> {
    out: &'a mut Vec<u8>,
    /// Scratch buffer for the event being built.
    ev: &'a mut Vec<u8>,
}

impl<'a> Frames<'a> {
    pub(super) fn new(out: &'a mut Vec<u8>, ev: &'a mut Vec<u8>) -> Frames<'a> {
        Frames { out, ev }
    }

    /// One event built by `build` (the whole `data: ...\n\n` text).
    fn raw(&mut self, build: impl FnOnce(&mut Vec<u8>)) {
        self.ev.clear();
        build(self.ev);
        wire::push_chunk(self.out, self.ev);
    }

    /// `data: <json>`.
    fn data(&mut self, v: &Value) {
        self.raw(|ev| {
            ev.extend_from_slice(b"data: ");
            push_json(ev, v);
            ev.extend_from_slice(b"\n\n");
        });
    }

    /// `event: <name>` + `data: <json>`.
    fn named(&mut self, name: &str, v: &Value) {
        self.raw(|ev| {
            ev.extend_from_slice(b"event: ");
            ev.extend_from_slice(name.as_bytes());
            ev.extend_from_slice(b"\ndata: ");
            push_json(ev, v);
            ev.extend_from_slice(b"\n\n");
        });
    }
}

/// Append `v` as JSON with every object's `type` member first, as Anthropic and the Responses
/// API write it (`Value` objects are otherwise in key order).
pub(super) fn push_json(out: &mut Vec<u8>, v: &Value) {
    // Writing a `Value` into a `Vec` cannot fail.
    if serde_json::to_writer(&mut *out, &TypeFirst(v)).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// Serializes a `Value` with `type` leading in every object.
struct TypeFirst<'a>(&'a Value);

impl serde::Serialize for TypeFirst<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                if let Some(kind) = members.get("type") {
                    map.serialize_entry("type", &TypeFirst(kind))?;
                }
                for (k, v) in members.iter().filter(|(k, _)| *k != "type") {
                    map.serialize_entry(k, &TypeFirst(v))?;
                }
                map.end()
            }
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&TypeFirst(item))?;
                }
                seq.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// One endpoint's answer to one call.
///
/// The SSE methods are called in stream order: `start`, `content(0..k)`, then `finish` or
/// `error` (or `empty` alone). Every method appends whole events.
pub(super) trait Surface {
    fn dialect(&self) -> Dialect;

    /// Whether the endpoint streams when asked to (embeddings and count tokens never do).
    fn streams(&self) -> bool {
        true
    }

    /// The JSON answer.
    fn json(&mut self, out: &mut Vec<u8>);

    /// The JSON answer with nothing in it.
    fn json_empty(&mut self, out: &mut Vec<u8>);

    /// The events before the first content event. `forced`: send an opening event even where
    /// this stream normally has none (OpenAI chat and completions).
    fn start(&mut self, f: &mut Frames<'_>, forced: bool);

    /// How many content events the whole answer has.
    fn contents(&self) -> usize;

    /// Content event `i` (preceded by whatever opens its block). Past `contents()`, an empty
    /// delta of the last block.
    fn content(&mut self, f: &mut Frames<'_>, i: usize);

    /// Everything after the content events, the terminal event included.
    fn finish(&mut self, f: &mut Frames<'_>);

    /// The in-band error event.
    fn error(&mut self, f: &mut Frames<'_>, error_type: Option<&str>);

    /// A whole stream without content (`Behaviour::EmptyChoices`).
    fn empty(&mut self, f: &mut Frames<'_>);
}

// === Errors, by dialect ===

/// The `type` Anthropic uses for an HTTP status.
pub(super) fn anthropic_error_type(code: u16) -> &'static str {
    match code {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        c if c >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

fn default_inband_type(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::OpenAi => "server_error",
        Dialect::Anthropic => "overloaded_error",
    }
}

/// `{"type":"error","error":{"type":..,"message":..}}`.
fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// An error body for status `code` in `dialect`, with `message`; OpenAI bodies take
/// `openai_type` and `openai_code` too.
pub(super) fn error_body(
    dialect: Dialect,
    out: &mut Vec<u8>,
    code: u16,
    message: &str,
    openai_type: &str,
    openai_code: &str,
) {
    match dialect {
        Dialect::OpenAi => wire::error_json(out, message.as_bytes(), openai_type, openai_code),
        Dialect::Anthropic => push_json(out, &anthropic_error(anthropic_error_type(code), message)),
    }
}

/// The default body of `Behaviour::Status`: it echoes the credential and host on purpose.
pub(super) fn status_body(
    dialect: Dialect,
    out: &mut Vec<u8>,
    code: u16,
    credential: &[u8],
    host: &[u8],
) {
    match dialect {
        Dialect::OpenAi => wire::status_default_json(out, code, credential, host),
        Dialect::Anthropic => {
            let message = format!(
                "mock failure; Incorrect API key provided: {} at {}",
                String::from_utf8_lossy(credential),
                String::from_utf8_lossy(host)
            );
            push_json(out, &anthropic_error(anthropic_error_type(code), &message));
        }
    }
}

/// The JSON body of a 200 that carries an error (in-band errors asked of a non-stream call).
pub(super) fn inband_json(dialect: Dialect, out: &mut Vec<u8>, error_type: Option<&str>) {
    let kind = error_type.unwrap_or(default_inband_type(dialect));
    match dialect {
        Dialect::OpenAi => openai_inband(out, kind),
        Dialect::Anthropic => push_json(out, &anthropic_error(kind, INBAND_MESSAGE)),
    }
}

/// `{"error":{"message","type","code"}}` with `type` = `code` = `kind`.
fn openai_inband(out: &mut Vec<u8>, kind: &str) {
    wire::error_json(out, INBAND_MESSAGE.as_bytes(), kind, kind);
}
