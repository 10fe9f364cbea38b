//! The OpenAI chat-completions dialect: reading a request, rewriting it per attempt, and
//! rewriting responses on their way back.
//!
//! Pure transforms over bytes: no I/O, no knowledge of Pingora. The request is scanned once
//! ([`ChatRequest::parse`], the chat members read on top of the [`envelope`](super::envelope)
//! every dialect shares); each attempt gets the same bytes with the `model` value replaced by
//! the deployment's upstream name and the `routing` member removed
//! ([`ChatRequest::body_for`]). Responses get the caller's model name back in `model`
//! ([`ResponseRewriter`]): a JSON body is held until complete (it is one write anyway), an
//! SSE stream is rewritten event by event as it flows, never buffered beyond a partial line.

use std::borrow::Cow;
use std::ops::Range;

use super::envelope::{non_empty_array, type_is, Envelope, RequestBodyError, COMMON_KEYS};
use super::estimate::Estimate;
use super::facts::{Complexity, Needs, RoutingOverride};
use super::json::{self, Scan};
use super::tokenizer::Encoding;
use crate::error::error_json;
use bytes::{BufMut, Bytes, BytesMut};

const WANT_STREAM: usize = 3;
const WANT_MAX_TOKENS: usize = 4;
const WANT_MAX_COMPLETION_TOKENS: usize = 5;
const WANT_TOOLS: usize = 6;
const WANT_FUNCTIONS: usize = 7;
const WANT_RESPONSE_FORMAT: usize = 8;
const WANT_STREAM_OPTIONS: usize = 9;
const WANT_MAX_OUTPUT_TOKENS: usize = 10;
/// The envelope's members, then the chat dialect's own.
const REQUEST_KEYS: &[&[u8]] = &[
    COMMON_KEYS[0],
    COMMON_KEYS[1],
    COMMON_KEYS[2],
    b"stream",
    b"max_tokens",
    b"max_completion_tokens",
    b"tools",
    b"functions",
    b"response_format",
    b"stream_options",
    // The Responses API's name for the output bound.
    b"max_output_tokens",
];

/// A chat-completions request body, scanned once.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    envelope: Envelope,
    pub stream: bool,
    pub routing: Option<RoutingOverride>,
    /// `max_completion_tokens`, `max_tokens` or (Responses) `max_output_tokens`, when a plain
    /// non-negative integer.
    pub max_tokens: Option<u64>,
    /// What the request needs from a model, but vision: a stream (`stream: true`), tools (a
    /// non-empty `tools` or `functions`), JSON mode (`response_format` of type `json_object`
    /// or `json_schema`). Vision (an image part in `messages`) is looked for when asked
    /// ([`Self::needs`]).
    known: Needs,
    /// `stream_options` as the caller sent it: absent, or whether it asks for usage.
    stream_options: Option<bool>,
}

impl ChatRequest {
    pub fn parse(body: Bytes) -> Result<Self, RequestBodyError> {
        // The strict scan accepts only what serde_json accepts and matches keys after decoding
        // their escapes, so `model`, `stream` and `routing` are what the provider will read.
        let mut scan = Scan::default();
        let mut envelope = Envelope::scan(body, REQUEST_KEYS, &mut scan)?;
        let stream = envelope.stream(&scan, WANT_STREAM)?;
        let routing = envelope.routing(&scan)?;
        let value = |w: usize| envelope.value(&scan, w);
        let int_of = |w: usize| {
            value(w)
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let max_tokens = int_of(WANT_MAX_COMPLETION_TOKENS)
            .or_else(|| int_of(WANT_MAX_TOKENS))
            .or_else(|| int_of(WANT_MAX_OUTPUT_TOKENS));
        let needs = Needs {
            stream,
            tools: [WANT_TOOLS, WANT_FUNCTIONS]
                .iter()
                .any(|&w| value(w).is_some_and(non_empty_array)),
            vision: false,
            json_mode: value(WANT_RESPONSE_FORMAT)
                .is_some_and(|v| type_is(v, &["json_object", "json_schema"])),
        };
        let stream_options = value(WANT_STREAM_OPTIONS).map(|v| {
            serde_json::from_slice::<serde_json::Value>(v)
                .ok()
                .and_then(|o| o.get("include_usage")?.as_bool())
                .unwrap_or(false)
        });
        Ok(Self {
            stream_options,
            stream,
            routing,
            max_tokens,
            known: needs,
            envelope,
        })
    }

    /// What the request needs from a model; whether it carries an image is looked for the
    /// first time this is asked (a plan whose candidates declare no capabilities never asks).
    pub fn needs(&self) -> Needs {
        Needs {
            vision: self.envelope.vision(has_image_part),
            ..self.known
        }
    }

    /// [`Self::needs`] without looking for images (`vision` false).
    pub fn needs_but_vision(&self) -> Needs {
        self.known
    }

    /// The prompt's tokens, estimated from what it says (made when first asked).
    pub fn estimate(&self) -> Estimate {
        self.envelope.estimate(None)
    }

    /// The prompt's estimated tokens for an OpenAI-kind provider (text characters over four,
    /// images by OpenAI's formula: see [`super::estimate`]).
    pub fn prompt_tokens(&self) -> u64 {
        self.estimate().openai()
    }

    /// The prompt counted exactly in `encoding` (near a limit), images by formula.
    pub fn exact_tokens(&self, encoding: Encoding) -> Option<u64> {
        self.envelope
            .exact_openai(None, encoding, self.estimate().image_tokens_openai)
    }

    /// The request's complexity tier, from a cheap heuristic over the prompt: one point each
    /// for a long prompt (over 2,000 estimated text tokens; two over 8,000: images do not make
    /// a prompt complex), code (a fenced block), tools, and a long conversation (over 6
    /// messages). 0 → simple, 1–2 → medium, 3 or more → complex.
    pub fn complexity(&self) -> Complexity {
        let prompt = self.prompt();
        let tokens = self.estimate().text_tokens();
        let mut score = u32::from(tokens > 2_000) + u32::from(tokens > 8_000);
        score += u32::from(memchr::memmem::find(prompt, b"```").is_some());
        score += u32::from(self.known.tools);
        score += u32::from(memchr::memmem::find_iter(prompt, b"\"role\"").count() > 6);
        Complexity::of_points(score)
    }

    /// The prompt as raw JSON (the `messages` value), or the whole body without one.
    pub fn prompt(&self) -> &[u8] {
        self.envelope.prompt()
    }

    /// The model name the caller sent (decoded).
    pub fn model_name(&self) -> Cow<'_, str> {
        self.envelope.model_name()
    }

    /// The model value exactly as the caller wrote it, quotes included: spliced into responses.
    pub fn model_literal(&self) -> Bytes {
        self.envelope.model_literal()
    }

    pub fn body_len(&self) -> usize {
        self.envelope.body_len()
    }

    /// Whether the caller asked for usage in its stream (`stream_options.include_usage`).
    pub fn asks_stream_usage(&self) -> bool {
        self.stream_options == Some(true)
    }

    /// Whether signalbox may ask the provider for stream usage on the caller's behalf: a
    /// stream whose caller sent no `stream_options` of its own (one it sent is left alone).
    pub fn may_add_stream_usage(&self) -> bool {
        self.stream && self.stream_options.is_none()
    }

    /// The body for one attempt: `model` set to `upstream_model_json` (a JSON string literal),
    /// `routing` removed, every other byte as received.
    pub fn body_for(&self, upstream_model_json: &[u8]) -> Bytes {
        self.body_for_upstream(upstream_model_json, false)
    }

    /// [`Self::body_for`], and with `add_stream_usage` a `stream_options` asking for usage
    /// inserted first (see [`Self::may_add_stream_usage`]), so usage is captured for every
    /// stream; the response rewriter strips the usage chunk the caller did not ask for.
    pub fn body_for_upstream(&self, upstream_model_json: &[u8], add_stream_usage: bool) -> Bytes {
        const STREAM_USAGE: &[u8] = br#""stream_options":{"include_usage":true},"#;
        let add = add_stream_usage && self.may_add_stream_usage();
        let first = if add { STREAM_USAGE } else { b"" };
        self.envelope.body_for(upstream_model_json, first)
    }
}

/// Whether `messages` holds an image part (`{"type": "image_url"}` and the like). A cheap
/// search first; only a prompt that mentions one is parsed to be sure.
fn has_image_part(messages: &[u8]) -> bool {
    // Built once: `memmem::find` would set up its searcher on every request.
    static IMAGE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"image"));
    if IMAGE.find(messages).is_none() {
        return false;
    }
    let Ok(serde_json::Value::Array(list)) = serde_json::from_slice(messages) else {
        return false;
    };
    list.iter()
        .filter_map(|m| m.get("content").and_then(|c| c.as_array()))
        .flatten()
        .filter_map(|part| part.get("type").and_then(|t| t.as_str()))
        .any(|t| matches!(t, "image_url" | "image" | "input_image"))
}

pub use super::stream::{InbandError, Usage};
use crate::catalog::surface::Surface;

/// What a response stream showed, for health and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// `data:` events carrying a JSON object.
    pub data_events: u32,
    pub done: bool,
    /// The upstream sent its own `error` event.
    pub upstream_error_event: bool,
    /// What kind of error that event was.
    pub error: Option<InbandError>,
    /// A content-bearing stream event passed (a text, tool-call, function-call or reasoning
    /// delta): the first-chunk hold's commit point. Not read from whole JSON answers.
    pub content: bool,
    pub usage: Option<Usage>,
    /// A response (or chunk) had `"choices": []`.
    pub empty_choices: bool,
}

/// How a response body is handled on its way to the client.
#[derive(Debug)]
pub enum ResponseRewriter {
    /// Relay as is.
    Passthrough,
    /// A JSON body: held until complete, then `model` replaced by the caller's name.
    Json {
        caller_model: Bytes,
        buf: BytesMut,
        /// The exact length the body must have (the upstream's `Content-Length` was kept,
        /// raised by [`fixed_json_length`]); `None` when the response is re-framed (chunked).
        fixed_len: Option<usize>,
        /// The provider's `Content-Length`, when the body may be rewritten and released as
        /// soon as that many bytes came, before its end is signalled (nothing after this
        /// rewriter needs the end: not an Anthropic answer, whose signals are read there, nor
        /// a priced one, whose cost is spliced there). `None`: held until the end.
        whole_at: Option<usize>,
    },
    /// A JSON body too large to hold and rewrite, relayed as it comes; its length-framed
    /// response is padded with trailing whitespace up to `target` bytes at its end (`sent`:
    /// the bytes relayed so far).
    PassthroughPadded { target: usize, sent: usize },
    /// An SSE stream: `model` replaced in each `data:` event as it passes; with
    /// `strip_usage`, the usage-only chunk (asked for by signalbox, not by the caller) is
    /// read and dropped.
    Sse {
        caller_model: Bytes,
        carry: BytesMut,
        strip_usage: bool,
    },
    /// An upstream refusal relayed in signalbox's words: the upstream body is read (a bounded
    /// prefix kept to recognise context-length errors) and replaced.
    Replace { status: u16, sniff: BytesMut },
}

/// The `Content-Length` to announce for a JSON body of `upstream_len` bytes whose `model`
/// value will become `caller_model` (a JSON string literal, quotes included), so the response
/// keeps its length framing whatever name the provider echoed.
///
/// The provider's echo is unknown until the body arrives, but it is a string literal of at
/// least two bytes (`""`), so the rewritten body is never longer than `upstream_len +
/// caller_model.len() - 2`. Announcing exactly that and padding the body up to it with
/// trailing whitespace (valid JSON) gives exact framing for every echo — longer, shorter or
/// missing — decided before the body is seen, as the header must be.
pub fn fixed_json_length(upstream_len: usize, caller_model: &[u8]) -> usize {
    upstream_len + caller_model.len().saturating_sub(2)
}

/// JSON bodies larger than this are relayed without the `model` rewrite.
const MAX_JSON_REWRITE: usize = 16 << 20;
/// Bytes of a refused upstream body kept to classify it.
const SNIFF_BYTES: usize = 8 << 10;

/// The event signalbox writes into a stream it must end abnormally, in the caller's dialect:
/// Chat and legacy Completions streams get a `data:` event with an `error` object; Responses
/// streams an `error` event as that API sends it.
pub fn sse_error_event_for(surface: Surface, message: &str, code: &str) -> Bytes {
    if surface != Surface::Responses {
        return sse_error_event(message, code);
    }
    let event = serde_json::json!({
        "type": "error",
        "code": code,
        "message": message,
        "param": null,
    });
    let mut out = BytesMut::with_capacity(96 + message.len());
    out.put_slice(b"event: error\ndata: ");
    out.put_slice(event.to_string().as_bytes());
    out.put_slice(b"\n\n");
    out.freeze()
}

/// The Chat Completions form of [`sse_error_event_for`].
pub fn sse_error_event(message: &str, code: &str) -> Bytes {
    let json = error_json(message, "server_error", code);
    let mut out = BytesMut::with_capacity(json.len() + 8);
    out.put_slice(b"data: ");
    out.put_slice(&json);
    out.put_slice(b"\n\n");
    out.freeze()
}

impl ResponseRewriter {
    /// The refused body read so far (`Replace` only): what classifies the refusal.
    pub fn refused_body(&self) -> Option<&[u8]> {
        match self {
            ResponseRewriter::Replace { sniff, .. } => Some(sniff),
            _ => None,
        }
    }

    /// Whether the relayed body's length is not known when the header goes out, so the
    /// response must be re-framed (chunked) instead of keeping a `Content-Length`.
    pub fn changes_length(&self) -> bool {
        !matches!(
            self,
            ResponseRewriter::Passthrough
                | ResponseRewriter::PassthroughPadded { .. }
                | ResponseRewriter::Json {
                    fixed_len: Some(_),
                    ..
                }
        )
    }

    /// Filter one body chunk in place. `stats` accumulates what the stream showed.
    pub fn filter(&mut self, body: &mut Option<Bytes>, eos: bool, stats: &mut StreamStats) {
        match self {
            ResponseRewriter::Passthrough => {}
            ResponseRewriter::PassthroughPadded { target, sent } => {
                *sent += body.as_ref().map_or(0, Bytes::len);
                if eos {
                    let mut out = BytesMut::new();
                    if let Some(chunk) = body.take() {
                        out.put_slice(&chunk);
                    }
                    out.put_bytes(b' ', target.saturating_sub(*sent));
                    *body = Some(out.freeze());
                }
            }
            ResponseRewriter::Json {
                caller_model,
                buf,
                fixed_len,
                whole_at,
            } => {
                let whole = match body.take() {
                    // The common case: the whole body in one chunk, no copy. A chunk of the
                    // provider's whole `Content-Length` is complete even before its end is
                    // signalled: where nothing else waits for the end (`whole_at`), it is
                    // rewritten at once, not copied into the buffer to wait for it.
                    Some(chunk) if buf.is_empty() && (eos || Some(chunk.len()) == *whole_at) => {
                        chunk
                    }
                    Some(chunk) => {
                        if buf.len() + chunk.len() > MAX_JSON_REWRITE {
                            // Too large to hold: release what we have and stop rewriting (a
                            // length-framed response still gets its announced length).
                            let mut all = std::mem::take(buf);
                            all.put_slice(&chunk);
                            // A length-framed body still gets its announced length (see
                            // `fixed_json_length`): padded at its end.
                            *self = match *fixed_len {
                                Some(target) if eos => {
                                    all.put_bytes(b' ', target.saturating_sub(all.len()));
                                    ResponseRewriter::Passthrough
                                }
                                Some(target) => ResponseRewriter::PassthroughPadded {
                                    target,
                                    sent: all.len(),
                                },
                                None => ResponseRewriter::Passthrough,
                            };
                            *body = Some(all.freeze());
                            return;
                        }
                        buf.put_slice(&chunk);
                        if !eos {
                            return;
                        }
                        std::mem::take(buf).freeze()
                    }
                    None if eos => std::mem::take(buf).freeze(),
                    None => return,
                };
                *body = Some(rewrite_json_object(&whole, caller_model, *fixed_len, stats));
                if !eos {
                    // Read whole before its end: nothing follows (at most the end, no bytes).
                    *self = ResponseRewriter::Passthrough;
                }
            }
            ResponseRewriter::Sse {
                caller_model,
                carry,
                strip_usage,
            } => {
                let strip = *strip_usage;
                let chunk = body.take().unwrap_or_default();
                let mut out = BytesMut::with_capacity(chunk.len() + carry.len() + 32);
                let data: Cow<'_, [u8]> = if carry.is_empty() {
                    Cow::Borrowed(&chunk)
                } else {
                    carry.put_slice(&chunk);
                    Cow::Owned(std::mem::take(carry).to_vec())
                };
                let mut start = 0;
                // After a stripped usage event, its blank line goes too (a client splitting on
                // blank lines must not see an empty event).
                let mut dropped = false;
                while let Some(nl) = memchr::memchr(b'\n', &data[start..]) {
                    let line = &data[start..start + nl + 1];
                    if !(dropped && matches!(line, b"\n" | b"\r\n")) {
                        dropped = rewrite_sse_line(line, caller_model, strip, stats, &mut out);
                    } else {
                        dropped = false;
                    }
                    start += nl + 1;
                }
                let rest = &data[start..];
                if eos {
                    // A final line without its newline: pass it through as it is.
                    rewrite_sse_line(rest, caller_model, strip, stats, &mut out);
                } else {
                    carry.put_slice(rest);
                }
                *body = if out.is_empty() && !eos {
                    None
                } else {
                    Some(out.freeze())
                };
            }
            ResponseRewriter::Replace { status, sniff } => {
                if let Some(chunk) = body.take() {
                    let room = SNIFF_BYTES.saturating_sub(sniff.len());
                    sniff.put_slice(&chunk[..chunk.len().min(room)]);
                }
                if eos {
                    *body = Some(refusal_body(*status, sniff));
                }
            }
        }
    }
}

/// Whether a provider's refusal says the prompt is longer than the model's context window.
pub fn is_context_length_error(upstream_body: &[u8]) -> bool {
    contains(upstream_body, b"context_length_exceeded")
        || contains(upstream_body, b"maximum context length")
}

/// The body for an upstream 4xx relayed to the caller.
pub fn refusal_body(status: u16, upstream_body: &[u8]) -> Bytes {
    let (code, message) = if is_context_length_error(upstream_body) {
        (
            "context_length_exceeded",
            "the prompt is longer than the model's context window",
        )
    } else if status == 413 {
        (
            "request_too_large",
            "the provider refused the request as too large",
        )
    } else {
        (
            "all_candidates_rejected",
            "the provider rejected the request as invalid; check the request parameters",
        )
    };
    error_json(message, "invalid_request_error", code)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

const RESPONSE_KEYS: &[&[u8]] = &[
    b"model",
    b"usage",
    b"choices",
    b"error",
    b"type",
    b"delta",
    b"response",
];
const MODEL_KEY: &[&[u8]] = &[b"model"];
const USAGE_KEY: &[&[u8]] = &[b"usage"];

/// Replace the top-level `model` of a JSON object (unchanged if it is not one). With
/// `fixed_len`, the result is exactly that long: trailing whitespace pads it (see
/// [`fixed_json_length`]).
fn rewrite_json_object(
    doc: &Bytes,
    caller_model: &[u8],
    fixed_len: Option<usize>,
    stats: &mut StreamStats,
) -> Bytes {
    // Scanned in place: a scan is ~550 bytes, not copied out through the return.
    let mut scan = Scan::default();
    let model = json::scan_object_lenient_into(doc, RESPONSE_KEYS, &mut scan)
        .ok()
        .and_then(|()| {
            note_stats(doc, &scan, false, stats);
            scan.get(0)
                .filter(|m| doc.get(m.value.start) == Some(&b'"'))
                .map(|m| m.value.clone())
        });
    let rewritten_len = model
        .as_ref()
        .map_or(doc.len(), |v| doc.len() - v.len() + caller_model.len());
    let target_len = fixed_len.unwrap_or(rewritten_len);
    if model.is_none() && target_len == doc.len() {
        return doc.clone();
    }
    let mut out = BytesMut::with_capacity(target_len.max(rewritten_len));
    match model {
        Some(v) => {
            out.put_slice(&doc[..v.start]);
            out.put_slice(caller_model);
            out.put_slice(&doc[v.end..]);
        }
        None => out.put_slice(doc),
    }
    // Length-framed: pad up to the announced length (never longer: it is an upper bound).
    out.put_bytes(b' ', target_len.saturating_sub(out.len()));
    out.freeze()
}

/// A stream's usage chunk: usage, and `"choices": []`.
fn is_usage_chunk(doc: &[u8], scan: &json::Scan) -> bool {
    let usage = scan
        .get(1)
        .is_some_and(|u| &doc[u.value.clone()] != b"null");
    usage
        && scan
            .get(2)
            .is_some_and(|c| is_empty_array(&doc[c.value.clone()]))
}

fn is_empty_array(v: &[u8]) -> bool {
    v.first() == Some(&b'[') && v[1..].iter().all(|b| b.is_ascii_whitespace() || *b == b']')
}

fn note_stats(doc: &[u8], scan: &json::Scan, sse: bool, stats: &mut StreamStats) {
    if let Some(u) = scan.get(1) {
        note_usage(&doc[u.value.clone()], stats);
    }
    // `"choices": []` with usage is a stream's usage chunk, not an empty answer; a whole
    // answer with no choices is empty whatever usage it reports.
    if let Some(c) = scan.get(2) {
        if is_empty_array(&doc[c.value.clone()]) && !(sse && is_usage_chunk(doc, scan)) {
            stats.empty_choices = true;
        }
    }
    // `"error": null` is no error: every Responses object carries it.
    if let Some(e) = scan.get_non_null(3, doc) {
        stats.upstream_error_event = true;
        stats.error = Some(inband_error_kind(&doc[e.value.clone()]));
    }
    // Content matters to streams only (the first-chunk hold's commit point, an empty stream);
    // a whole JSON answer is not searched for it.
    if sse && !stats.content {
        if let Some(c) = scan.get(2) {
            stats.content = carries_content(&doc[c.value.clone()]);
        }
    }
    // The Responses API's events: `{"type": "response.output_text.delta", "delta": "..."}`,
    // ended by `response.completed` (it sends no `[DONE]`).
    if let Some(t) = scan.get(4) {
        match &doc[t.value.clone()] {
            b"\"response.completed\"" | b"\"response.incomplete\"" => {
                stats.done = true;
                note_response_usage(doc, scan, stats);
            }
            b"\"response.failed\"" | b"\"error\"" => {
                stats.upstream_error_event = true;
                stats.error = Some(inband_error_kind(doc));
                note_response_usage(doc, scan, stats);
            }
            kind if kind.ends_with(b".delta\"") => {
                let delta = scan.get(5).map(|d| &doc[d.value.clone()]);
                if delta.is_some_and(|d| d != b"\"\"" && d != b"null") {
                    stats.content = true;
                }
            }
            _ => {}
        }
    }
}

/// A Responses API stream reports usage once, inside its final event's `response` object
/// (`response.completed`, `.incomplete`, `.failed`): `{"type": …, "response": {…, "usage": {…}}}`.
fn note_response_usage(doc: &[u8], scan: &json::Scan, stats: &mut StreamStats) {
    let Some(response) = scan.get(6).map(|r| r.value.clone()) else {
        return;
    };
    let inner = &doc[response];
    let Ok(nested) = json::scan_object_lenient(inner, USAGE_KEY) else {
        return;
    };
    if let Some(u) = nested.get(0) {
        note_usage(&inner[u.value.clone()], stats);
    }
}

/// A `usage` object, in either OpenAI API's names (`null` or anything unreadable is no usage).
fn note_usage(value: &[u8], stats: &mut StreamStats) {
    if let Some(usage) = Usage::read(value) {
        stats.usage = Some(usage);
    }
}

/// Whether a `choices` value carries content: a non-empty text, a tool or function call, or a
/// reasoning delta. A role-only first chunk, an empty delta, or a bare `finish_reason` does not.
/// Upstream responses are read leniently; providers write these keys plainly.
fn carries_content(choices: &[u8]) -> bool {
    const STRING_KEYS: [&[u8]; 4] = [
        b"\"content\":\"",
        b"\"reasoning_content\":\"",
        b"\"reasoning\":\"",
        b"\"text\":\"",
    ];
    const CALL_KEYS: [&[u8]; 2] = [b"\"tool_calls\":[{", b"\"function_call\":{"];
    let compact: Cow<'_, [u8]> = if choices.contains(&b' ') || choices.contains(&b'\n') {
        Cow::Owned(strip_json_space(choices))
    } else {
        Cow::Borrowed(choices)
    };
    let hay = &*compact;
    STRING_KEYS.iter().any(|k| {
        memchr::memmem::find_iter(hay, k)
            .any(|at| hay.get(at + k.len()).is_some_and(|b| *b != b'"'))
    }) || CALL_KEYS.iter().any(|k| contains(hay, k))
}

/// JSON without the whitespace outside strings (so key patterns match however the provider
/// spaced its output).
fn strip_json_space(doc: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(doc.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in doc {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !b.is_ascii_whitespace() {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
    out
}

/// The kind of an in-band `error` object, from its `type` / `code`.
fn inband_error_kind(error: &[u8]) -> InbandError {
    if contains(error, b"invalid_request") || contains(error, b"context_length_exceeded") {
        InbandError::InvalidRequest
    } else if contains(error, b"rate_limit") || contains(error, b"overloaded") {
        InbandError::Overloaded
    } else {
        InbandError::Server
    }
}

/// One SSE line (with its newline, if any) into `out`, `model` replaced in `data:` JSON;
/// whether the line was dropped (a usage chunk the caller did not ask for).
fn rewrite_sse_line(
    line: &[u8],
    caller_model: &[u8],
    strip_usage: bool,
    stats: &mut StreamStats,
    out: &mut BytesMut,
) -> bool {
    let Some(rest) = line.strip_prefix(b"data:") else {
        out.put_slice(line);
        return false;
    };
    let payload_start = 5 + usize::from(rest.first() == Some(&b' '));
    let mut payload_end = line.len();
    while payload_end > payload_start && matches!(line[payload_end - 1], b'\n' | b'\r') {
        payload_end -= 1;
    }
    let payload = &line[payload_start..payload_end];
    if payload == b"[DONE]" {
        stats.done = true;
        out.put_slice(line);
        return false;
    }
    if payload.first() != Some(&b'{') {
        out.put_slice(line);
        return false;
    }
    let Ok(scan) = json::scan_object_lenient(payload, RESPONSE_KEYS) else {
        out.put_slice(line);
        return false;
    };
    stats.data_events += 1;
    note_stats(payload, &scan, true, stats);
    if strip_usage && is_usage_chunk(payload, &scan) {
        return true;
    }
    match model_value(payload, &scan) {
        Some(m) => {
            let at = payload_start + m.start;
            let end = payload_start + m.end;
            out.put_slice(&line[..at]);
            out.put_slice(caller_model);
            out.put_slice(&line[end..]);
        }
        None => out.put_slice(line),
    }
    false
}

/// Where an event's `model` string is: top-level (chat and completion chunks), or inside the
/// `response` object of a Responses API event (`response.created`, `response.completed`, …).
fn model_value(doc: &[u8], scan: &json::Scan) -> Option<Range<usize>> {
    let is_string = |r: &Range<usize>| doc.get(r.start) == Some(&b'"');
    if let Some(m) = scan.get(0) {
        return Some(m.value.clone()).filter(is_string);
    }
    let response = scan.get(6)?.value.clone();
    let nested = json::scan_object_lenient(&doc[response.clone()], MODEL_KEY).ok()?;
    let m = nested.get(0)?.value.clone();
    let m = response.start + m.start..response.start + m.end;
    Some(m).filter(is_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Result<ChatRequest, RequestBodyError> {
        ChatRequest::parse(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn content_is_a_text_a_call_or_reasoning_not_a_role_or_a_finish() {
        let c = |s: &str| carries_content(s.as_bytes());
        assert!(!c(
            r#"[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]"#
        ));
        assert!(!c(
            r#"[{"index":0,"delta":{"content":null},"finish_reason":"stop"}]"#
        ));
        assert!(!c(r#"[]"#));
        assert!(c(r#"[{"index":0,"delta":{"content":"Hel"}}]"#));
        assert!(c(r#"[ { "delta" : { "content" : "spaced" } } ]"#));
        assert!(c(
            r#"[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":""}}]}}]"#
        ));
        assert!(c(r#"[{"delta":{"reasoning_content":"thinking"}}]"#));
        assert!(c(
            r#"[{"message":{"role":"assistant","content":"whole answer"}}]"#
        ));
    }

    #[test]
    fn stream_usage_is_asked_for_when_the_caller_did_not_and_its_chunk_stripped() {
        let r = req(r#"{"model":"a","stream":true,"messages":[]}"#).expect("ok");
        assert!(r.may_add_stream_usage() && !r.asks_stream_usage());
        let body = r.body_for_upstream(b"\"up\"", true);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "up");
        // The caller's own stream_options is never touched.
        let own = req(r#"{"model":"a","stream":true,"stream_options":{"include_usage":false}}"#)
            .expect("ok");
        assert!(!own.may_add_stream_usage());
        assert_eq!(
            own.body_for_upstream(b"\"a\"", true),
            own.body_for(b"\"a\"")
        );
        let asks = req(r#"{"model":"a","stream":true,"stream_options":{"include_usage":true}}"#)
            .expect("ok");
        assert!(asks.asks_stream_usage());
        // Not a stream: nothing added.
        let plain = req(r#"{"model":"a"}"#).expect("ok");
        assert_eq!(
            &plain.body_for_upstream(b"\"a\"", true)[..],
            br#"{"model":"a"}"#
        );

        let usage = b"data: {\"model\":\"up\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n";
        for strip in [true, false] {
            let mut stats = StreamStats::default();
            let mut out = BytesMut::new();
            rewrite_sse_line(usage, b"\"m\"", strip, &mut stats, &mut out);
            assert_eq!(stats.usage.map(|u| u.completion_tokens), Some(5));
            assert!(!stats.empty_choices, "a usage chunk is not an empty answer");
            assert_eq!(out.is_empty(), strip);
        }
    }

    #[test]
    fn stream_usage_goes_first_even_before_a_leading_routing_member() {
        // The insertion and the removal start at the same byte; before the shared envelope
        // this order of edits sliced backwards (a panic on the request path).
        let r = req(r#"{"routing":{"providers":["a"]},"model":"m","stream":true}"#).expect("ok");
        assert_eq!(
            &r.body_for_upstream(b"\"up\"", true)[..],
            br#"{"stream_options":{"include_usage":true},"model":"up","stream":true}"#
        );
        let r = req(r#"{ "routing":null, "model":"m","stream":true}"#).expect("ok");
        assert_eq!(
            &r.body_for_upstream(b"\"up\"", true)[..],
            br#"{"stream_options":{"include_usage":true}, "model":"up","stream":true}"#
        );
    }

    #[test]
    fn responses_usage_is_read_from_the_body_and_from_the_final_event() {
        // A whole Responses answer: top-level `usage` in the Responses API's own names.
        let mut stats = StreamStats::default();
        let body = Bytes::from_static(
            br#"{"id":"r","object":"response","model":"up","output":[],"usage":{"input_tokens":11,"output_tokens":7,"total_tokens":18,"input_tokens_details":{"cached_tokens":4}}}"#,
        );
        rewrite_json_object(&body, b"\"m\"", None, &mut stats);
        let u = stats.usage.expect("usage read");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cache_read_tokens),
            (11, 7, 4)
        );
        // A stream: only the final event carries it, inside its `response`.
        let done = b"data: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"r\",\"model\":\"up\",\"status\":\"completed\",\"usage\":{\"input_tokens\":20,\"output_tokens\":3,\"total_tokens\":23}}}\n";
        let mut stats = StreamStats::default();
        let mut out = BytesMut::new();
        rewrite_sse_line(done, b"\"m\"", false, &mut stats, &mut out);
        assert!(stats.done);
        let u = stats.usage.expect("usage read from the final event");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (20, 3));
        // Chat Completions' cached prompt tokens.
        let mut stats = StreamStats::default();
        let body = Bytes::from_static(
            br#"{"model":"up","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#,
        );
        rewrite_json_object(&body, b"\"m\"", None, &mut stats);
        assert_eq!(stats.usage.map(|u| u.cache_read_tokens), Some(8));
    }

    #[test]
    fn a_responses_event_gets_the_callers_model_inside_its_response() {
        let line = b"data: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"model\":\"gpt-4o-2024\",\"status\":\"in_progress\"}}\n";
        let mut out = BytesMut::new();
        rewrite_sse_line(
            line,
            b"\"mine\"",
            false,
            &mut StreamStats::default(),
            &mut out,
        );
        assert_eq!(
            &out[..],
            &b"data: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"model\":\"mine\",\"status\":\"in_progress\"}}\n"[..]
        );
    }

    #[test]
    fn an_error_event_is_counted_with_its_kind() {
        let mut stats = StreamStats::default();
        let mut out = BytesMut::new();
        rewrite_sse_line(
            b"data: {\"error\":{\"message\":\"busy\",\"type\":\"server_error\",\"code\":\"rate_limit_exceeded\"}}\n",
            b"\"m\"",
            false,
            &mut stats,
            &mut out,
        );
        assert!(stats.upstream_error_event);
        assert_eq!(stats.error, Some(InbandError::Overloaded));
        assert!(!stats.content);
    }

    #[test]
    fn needs_are_derived_from_the_body() {
        let n = |s: &str| req(s).expect("valid").needs();
        assert_eq!(n(r#"{"model":"m","messages":[]}"#), Needs::default());
        assert!(n(r#"{"model":"m","stream":true}"#).stream);
        assert!(n(r#"{"model":"m","tools":[{"type":"function"}]}"#).tools);
        assert!(
            !n(r#"{"model":"m","tools":[ ]}"#).tools,
            "an empty list needs nothing"
        );
        assert!(n(r#"{"model":"m","functions":[{"name":"f"}]}"#).tools);
        assert!(n(r#"{"model":"m","response_format":{"type":"json_object"}}"#).json_mode);
        assert!(
            n(r#"{"model":"m","response_format":{"type":"json_schema","json_schema":{}}}"#)
                .json_mode
        );
        assert!(!n(r#"{"model":"m","response_format":{"type":"text"}}"#).json_mode);
        let image = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        assert!(n(image).vision);
        let mention =
            r#"{"model":"m","messages":[{"role":"user","content":"an image_url is a field"}]}"#;
        assert!(!n(mention).vision, "mentioning images is not sending one");
    }

    #[test]
    fn complexity_tiers_follow_the_documented_heuristic() {
        let c = |s: String| req(&s).expect("valid").complexity();
        assert_eq!(
            c(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.into()),
            Complexity::Simple
        );
        let code = r#"{"model":"m","messages":[{"role":"user","content":"```x```"}]}"#;
        assert_eq!(c(code.into()), Complexity::Medium);
        let long = format!(
            r#"{{"model":"m","tools":[{{"type":"function"}}],"messages":[{{"role":"user","content":"```x``` {}"}}]}}"#,
            "w ".repeat(5000)
        );
        assert_eq!(c(long), Complexity::Complex);
    }

    #[test]
    fn reads_the_routing_fields() {
        let r =
            req(r#"{"model":"fast","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
                .expect("valid");
        assert_eq!(r.model_name(), "fast");
        assert!(r.stream);
        assert_eq!(&r.model_literal()[..], b"\"fast\"");
        assert!(r.routing.is_none());
    }

    #[test]
    fn refuses_bad_bodies() {
        assert_eq!(req("{").err(), Some(RequestBodyError::NotJson));
        assert_eq!(req("[]").err(), Some(RequestBodyError::NotAnObject));
        assert_eq!(
            req(r#"{"messages":[]}"#).err(),
            Some(RequestBodyError::MissingModel)
        );
        assert_eq!(
            req(r#"{"model":5}"#).err(),
            Some(RequestBodyError::ModelNotString)
        );
        assert_eq!(
            req(r#"{"model":"a","stream":"yes"}"#).err(),
            Some(RequestBodyError::StreamNotBool)
        );
        assert_eq!(
            req(r#"{"model":"a","model":"b"}"#).err(),
            Some(RequestBodyError::DuplicateKey("model"))
        );
        assert!(matches!(
            req(r#"{"model":"a","routing":{"strategy":"x","colour":1}}"#).err(),
            Some(RequestBodyError::BadRouting(m)) if m.contains("colour")
        ));
        let eleven: Vec<String> = (0..11).map(|i| format!("\"p{i}\"")).collect();
        let body = format!(
            r#"{{"model":"a","routing":{{"providers":[{}]}}}}"#,
            eleven.join(",")
        );
        assert!(matches!(
            req(&body).err(),
            Some(RequestBodyError::BadRouting(_))
        ));
    }

    #[test]
    fn escaped_keys_are_read_as_the_provider_reads_them() {
        // Every JSON parser decodes the escape and keeps the last `model`: refused.
        assert_eq!(
            req(r#"{"model":"fast","mod\u0065l":"gpt-4-expensive"}"#).err(),
            Some(RequestBodyError::DuplicateKey("model"))
        );
        // Alone, an escaped `model` is the model, and it is the value that gets rewritten.
        let r = req(r#"{"mod\u0065l":"fast","messages":[]}"#).expect("valid");
        assert_eq!(r.model_name(), "fast");
        let out = r.body_for(b"\"up\"");
        assert_eq!(&out[..], br#"{"mod\u0065l":"up","messages":[]}"#);
        // An escaped `routing` is applied and stripped.
        let r = req(r#"{"model":"m","r\u006futing":{"providers":["a"]}}"#).expect("valid");
        assert_eq!(
            r.routing.as_ref().and_then(|r| r.providers.clone()),
            Some(vec!["a".to_string()])
        );
        assert_eq!(&r.body_for(b"\"up\"")[..], br#"{"model":"up"}"#);
        // Every wanted key is refused twice, whatever its spelling.
        for (body, key) in [
            (
                r#"{"model":"m","stream":true,"stre\u0061m":false}"#,
                "stream",
            ),
            (
                r#"{"model":"m","routing":null,"\u0072outing":{}}"#,
                "routing",
            ),
            (r#"{"model":"m","messages":[],"messages":[]}"#, "messages"),
            (
                r#"{"model":"m","max_tokens":1,"max\u005ftokens":2}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","max_completion_tokens":1,"max_completion_tokens":2}"#,
                "max_completion_tokens",
            ),
        ] {
            assert_eq!(req(body).err(), Some(RequestBodyError::DuplicateKey(key)));
        }
        // Case-insensitive readers (Go's encoding/json) would take these for `model`/`stream`.
        assert_eq!(
            req(r#"{"model":"fast","Model":"gpt-4-expensive"}"#).err(),
            Some(RequestBodyError::KeyCase("model"))
        );
        assert_eq!(
            req(r#"{"model":"m","\u017ftream":true}"#).err(),
            Some(RequestBodyError::KeyCase("stream"))
        );
    }

    #[test]
    fn refuses_what_serde_json_refuses() {
        for body in [
            &br#"{"model":"m","messages":[{"content":"\ud83d"}]}"#[..],
            br#"{"model":"m","messages":[{"content":"\ude00"}]}"#,
            br#"{"model":"m","temperature":1e400}"#,
            b"{\"model\":\"m\",\"user\":\"\xff\"}",
            b"\xef\xbb\xbf{\"model\":\"m\"}",
        ] {
            assert!(
                matches!(
                    ChatRequest::parse(Bytes::copy_from_slice(body)).err(),
                    Some(RequestBodyError::NotJson | RequestBodyError::NotAnObject)
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(req(r#"{"model":"m","messages":[{"content":"\ud83d\ude00"}]}"#).is_ok());
    }

    #[test]
    fn rewrites_model_and_strips_routing_byte_for_byte() {
        let original = r#"{"model": "fast", "routing": {"providers": ["a"]}, "messages": [{"role":"user","content":"x\u00e9"}], "temperature": 0.5}"#;
        let r = req(original).expect("valid");
        assert_eq!(
            r.routing.as_ref().and_then(|r| r.providers.clone()),
            Some(vec!["a".to_string()])
        );
        let out = r.body_for(b"\"gpt-4o-mini\"");
        let expected = r#"{"model": "gpt-4o-mini", "messages": [{"role":"user","content":"x\u00e9"}], "temperature": 0.5}"#;
        assert_eq!(std::str::from_utf8(&out).expect("utf8"), expected);
        // Same upstream name and no routing: the original bytes, not a copy.
        let r = req(r#"{"model":"m","messages":[]}"#).expect("valid");
        let out = r.body_for(b"\"m\"");
        assert_eq!(out.as_ptr(), r.envelope.body.as_ptr());
    }

    #[test]
    fn rewrites_json_responses() {
        let mut rw = ResponseRewriter::Json {
            caller_model: Bytes::from_static(b"\"fast\""),
            buf: BytesMut::new(),
            fixed_len: None,
            whole_at: None,
        };
        let mut stats = StreamStats::default();
        let mut first = Some(Bytes::from_static(br#"{"id":"x","model":"gpt-4o-mi"#));
        rw.filter(&mut first, false, &mut stats);
        assert_eq!(first, None);
        let mut rest = Some(Bytes::from_static(
            br#"ni-2024","choices":[{"message":{"model":"inner"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        ));
        rw.filter(&mut rest, true, &mut stats);
        let out = rest.expect("body");
        assert_eq!(
            std::str::from_utf8(&out).expect("utf8"),
            r#"{"id":"x","model":"fast","choices":[{"message":{"model":"inner"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#
        );
        assert_eq!(
            stats.usage,
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn only_a_rewrite_that_may_change_the_length_asks_for_re_framing() {
        let json = |fixed_len| ResponseRewriter::Json {
            caller_model: Bytes::from_static(b"\"m\""),
            buf: BytesMut::new(),
            fixed_len,
            whole_at: None,
        };
        assert!(!ResponseRewriter::Passthrough.changes_length());
        assert!(!json(Some(10)).changes_length());
        assert!(json(None).changes_length());
        let sse = ResponseRewriter::Sse {
            caller_model: Bytes::from_static(b"\"m\""),
            carry: BytesMut::new(),
            strip_usage: false,
        };
        assert!(sse.changes_length());
    }

    #[test]
    fn length_framed_rewrite_has_the_announced_length_whatever_the_echo() {
        let run = |doc: &'static [u8], caller: &'static [u8]| {
            let fixed = fixed_json_length(doc.len(), caller);
            let mut rw = ResponseRewriter::Json {
                caller_model: Bytes::from_static(caller),
                buf: BytesMut::new(),
                fixed_len: Some(fixed),
                whole_at: None,
            };
            let mut b = Some(Bytes::from_static(doc));
            rw.filter(&mut b, true, &mut StreamStats::default());
            let out = b.expect("body");
            assert_eq!(out.len(), fixed, "exactly the announced length");
            serde_json::from_slice::<serde_json::Value>(&out).expect("still JSON")
        };
        let long_echo = br#"{"id":"x","model":"gpt-4o-mini-2024-07-18","choices":[]}"#;
        let short_echo = br#"{"id":"x","model":"g","choices":[]}"#;
        let pretty = b"{\n  \"id\": \"x\",\n  \"model\": \"g\",\n  \"choices\": []\n}\n";
        let caller: &[u8] = b"\"a-very-long-caller-facing-model-name\"";
        assert_eq!(run(long_echo, b"\"fast\"")["model"], "fast");
        // The echo is shorter than the caller's name: the name still comes back.
        assert_eq!(
            run(short_echo, caller)["model"],
            "a-very-long-caller-facing-model-name"
        );
        assert_eq!(
            run(pretty, caller)["model"],
            "a-very-long-caller-facing-model-name"
        );
        // No `model` at all, or not JSON: the body is kept and padded to its announced length.
        assert_eq!(run(br#"{"id":"x"}"#, caller)["id"], "x");
    }

    #[test]
    fn a_length_framed_body_read_whole_before_its_end_is_rewritten_at_once() {
        let doc: &[u8] = br#"{"id":"x","model":"up-model","choices":[{"index":0}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
        let caller: &[u8] = b"\"fast\"";
        let fixed = fixed_json_length(doc.len(), caller);
        let rewriter = || ResponseRewriter::Json {
            caller_model: Bytes::from_static(caller),
            buf: BytesMut::new(),
            fixed_len: Some(fixed),
            whole_at: Some(doc.len()),
        };
        // The end signalled with the body: the reference.
        let mut with_end = rewriter();
        let mut reference_stats = StreamStats::default();
        let mut b = Some(Bytes::from_static(doc));
        with_end.filter(&mut b, true, &mut reference_stats);
        let reference = b.expect("body");
        // The body, then its end with no bytes: the same bytes, at the first call.
        let mut rw = rewriter();
        let mut stats = StreamStats::default();
        let mut b = Some(Bytes::from_static(doc));
        rw.filter(&mut b, false, &mut stats);
        assert_eq!(b.as_ref(), Some(&reference));
        assert_eq!(stats.usage, reference_stats.usage);
        assert!(stats.usage.is_some());
        let mut end = None;
        rw.filter(&mut end, true, &mut stats);
        assert!(
            end.is_none_or(|b| b.is_empty()),
            "nothing after the whole body"
        );
        // A first chunk shorter than the announced body still waits for the rest.
        let mut rw = rewriter();
        let mut stats = StreamStats::default();
        let (head, tail) = doc.split_at(10);
        let mut b = Some(Bytes::copy_from_slice(head));
        rw.filter(&mut b, false, &mut stats);
        assert!(b.is_none_or(|b| b.is_empty()));
        let mut b = Some(Bytes::copy_from_slice(tail));
        rw.filter(&mut b, true, &mut stats);
        assert_eq!(b.as_ref(), Some(&reference));
    }

    #[test]
    fn a_json_body_too_large_to_hold_still_gets_its_announced_length() {
        let caller: &[u8] = b"\"caller\"";
        let chunk = vec![b' '; MAX_JSON_REWRITE / 2 + 1];
        let upstream_len = 2 * chunk.len() + 2;
        let fixed = fixed_json_length(upstream_len, caller);
        let mut rw = ResponseRewriter::Json {
            caller_model: Bytes::copy_from_slice(caller),
            buf: BytesMut::new(),
            fixed_len: Some(fixed),
            whole_at: Some(upstream_len),
        };
        let mut total = 0;
        let mut stats = StreamStats::default();
        for (part, eos) in [
            (Bytes::from_static(b"{"), false),
            (Bytes::from(chunk.clone()), false),
            (Bytes::from(chunk), false),
            (Bytes::from_static(b"}"), true),
        ] {
            let mut b = Some(part);
            rw.filter(&mut b, eos, &mut stats);
            total += b.map_or(0, |b| b.len());
        }
        assert_eq!(total, fixed);
    }

    #[test]
    fn rewrites_sse_across_chunk_boundaries() {
        let mut rw = ResponseRewriter::Sse {
            caller_model: Bytes::from_static(b"\"fast\""),
            carry: BytesMut::new(),
            strip_usage: false,
        };
        let mut stats = StreamStats::default();
        let mut out = Vec::new();
        for (chunk, eos) in [
            (&b"data: {\"model\":\"up\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"mo"[..], false),
            (&b"del\":\"up\",\"choices\":[]}\n\n: keep-alive\n\n"[..], false),
            (&b"data: [DONE]\n\n"[..], true),
        ] {
            let mut b = Some(Bytes::copy_from_slice(chunk));
            rw.filter(&mut b, eos, &mut stats);
            if let Some(b) = b {
                out.extend_from_slice(&b);
            }
        }
        assert_eq!(
            std::str::from_utf8(&out).expect("utf8"),
            "data: {\"model\":\"fast\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"model\":\"fast\",\"choices\":[]}\n\n: keep-alive\n\ndata: [DONE]\n\n"
        );
        assert_eq!(stats.data_events, 2);
        assert!(stats.done && stats.empty_choices);
    }

    #[test]
    fn refusals_are_rewritten() {
        let mut rw = ResponseRewriter::Replace {
            status: 400,
            sniff: BytesMut::new(),
        };
        let mut stats = StreamStats::default();
        let mut b = Some(Bytes::from_static(
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens; key sk-secret","code":"context_length_exceeded"}}"#,
        ));
        rw.filter(&mut b, true, &mut stats);
        let out = b.expect("body");
        let text = std::str::from_utf8(&out).expect("utf8");
        assert!(text.contains("\"code\":\"context_length_exceeded\""));
        assert!(!text.contains("sk-secret"));
        assert!(refusal_body(400, b"nope").starts_with(b"{\"error\""));
    }
}
