//! Rewriting an Anthropic response on its way back to an Anthropic caller, and reading what it
//! shows ([`Signals`]).
//!
//! A JSON body gets the caller's name in its top-level `model` through the Chat Completions
//! rewriter itself ([`ResponseRewriter::Json`]: the same hold, the same size cap, the same
//! [`fixed_json_length`](crate::adapters::openai::fixed_json_length) padding, so a kept
//! `Content-Length` stays exact); the finished body is then scanned a second time for usage,
//! which costs a lenient scan of a body that is usually a few KiB.
//!
//! An SSE stream is rewritten line by line as it flows: `model` inside `message_start`'s
//! `message`, every other byte as received. Only a partial line is ever held (never a whole
//! event, and at most [`MAX_LINE`] bytes of it: a longer line is relayed as it comes, untouched),
//! so a split anywhere — mid-event, mid-line, mid-UTF-8 — gives the same output. A chunk that
//! neither completes a held line nor carries the `message_start` goes out as a slice of itself,
//! not a copy. The hot event, `content_block_delta`, is recognised from its leading `"type"`
//! without a scan once content has been seen; the scanner runs on the handful of events that
//! carry a model, usage, the first content or an error.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;

use super::respond::refusal_body;
use crate::adapters::envelope::non_empty_array;
use crate::adapters::json;
use crate::adapters::openai::{ResponseRewriter, StreamStats};
use crate::adapters::stream::{InbandError, Signals};

/// The longest SSE line held to be rewritten; a longer one (a large server-tool result, never a
/// `message_start`) is relayed as it arrives, untouched.
pub const MAX_LINE: usize = 1 << 20;
/// Bytes of a refused upstream body kept to classify it.
const SNIFF_BYTES: usize = 8 << 10;

/// How an Anthropic response body is handled on its way to an Anthropic caller.
#[derive(Debug)]
pub struct AnthropicRewriter {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Passthrough,
    /// The Chat Completions JSON rewriter (only ever its `Json` state or what it becomes).
    Json(ResponseRewriter),
    Sse(SseRewriter),
    /// An upstream refusal relayed in signalbox's words, in Anthropic's shape.
    Replace {
        status: u16,
        sniff: BytesMut,
    },
}

impl AnthropicRewriter {
    /// Relay as is (a compressed body, or one that is neither JSON nor SSE).
    pub fn passthrough() -> Self {
        Self {
            mode: Mode::Passthrough,
        }
    }

    /// A JSON message: held until complete, then its top-level `model` becomes `caller_model`
    /// (a JSON string literal). With `fixed_len` (from `fixed_json_length` of the upstream's
    /// `Content-Length`) the body has exactly that length; `None` when the response is
    /// re-framed.
    pub fn json(caller_model: Bytes, fixed_len: Option<usize>) -> Self {
        Self {
            mode: Mode::Json(ResponseRewriter::Json {
                caller_model,
                buf: BytesMut::new(),
                fixed_len,
                // Its signals are read from the whole document at the end.
                whole_at: None,
            }),
        }
    }

    /// An SSE stream: `model` in `message_start` becomes `caller_model`, event by event.
    pub fn sse(caller_model: Bytes) -> Self {
        Self {
            mode: Mode::Sse(SseRewriter {
                caller_model,
                carry: BytesMut::new(),
                error_event: false,
                skipping: false,
            }),
        }
    }

    /// An upstream 4xx relayed to the caller: the body is read (a bounded prefix kept, see
    /// [`Self::refused_body`]) and replaced by [`refusal_body`].
    pub fn refusal(status: u16) -> Self {
        Self {
            mode: Mode::Replace {
                status,
                sniff: BytesMut::new(),
            },
        }
    }

    /// The refused body read so far (a refusal only): what classifies it.
    pub fn refused_body(&self) -> Option<&[u8]> {
        match &self.mode {
            Mode::Replace { sniff, .. } => Some(sniff),
            _ => None,
        }
    }

    /// Whether the relayed body's length is unknown when the header goes out, so the response
    /// must be re-framed (chunked) instead of keeping a `Content-Length`.
    pub fn changes_length(&self) -> bool {
        match &self.mode {
            Mode::Passthrough => false,
            Mode::Json(inner) => inner.changes_length(),
            Mode::Sse(_) | Mode::Replace { .. } => true,
        }
    }

    /// Filter one body chunk in place; `signals` accumulates what the response showed.
    pub fn filter(&mut self, body: &mut Option<Bytes>, eos: bool, signals: &mut Signals) {
        match &mut self.mode {
            Mode::Passthrough => {}
            Mode::Json(inner) => {
                inner.filter(body, eos, &mut StreamStats::default());
                // Still `Json` at the end: `body` is the whole document (a body too large to
                // hold turned the rewriter into a pass-through and is not read).
                if eos && matches!(inner, ResponseRewriter::Json { .. }) {
                    if let Some(doc) = body.as_deref() {
                        note_message(doc, signals);
                    }
                }
            }
            Mode::Sse(sse) => sse.filter(body, eos, signals),
            Mode::Replace { status, sniff } => {
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

// === JSON ===

const MESSAGE_KEYS: &[&[u8]] = &[b"type", b"usage", b"content", b"error"];

/// What a complete JSON body shows: usage, content (a non-empty `content` list), the end (a
/// `message` is the whole answer), or the provider's error object.
fn note_message(doc: &[u8], signals: &mut Signals) {
    let Ok(scan) = json::scan_object_lenient(doc, MESSAGE_KEYS) else {
        return;
    };
    let value = |w: usize| scan.get(w).map(|m| &doc[m.value.clone()]);
    if let Some(u) = value(1) {
        merge_usage(u, signals);
    }
    match value(0).and_then(string_contents) {
        Some(b"message") => {
            signals.terminal = true;
            if value(2).is_some_and(non_empty_array) {
                signals.content = true;
            }
        }
        Some(b"error") => signals.error = Some(inband_error(value(3))),
        _ => {}
    }
}

// === SSE ===

#[derive(Debug)]
struct SseRewriter {
    caller_model: Bytes,
    /// The partial line held since the last chunk.
    carry: BytesMut,
    /// The current event was named `error` (`event: error`).
    error_event: bool,
    /// Inside a line longer than [`MAX_LINE`]: relayed as it comes until its newline.
    skipping: bool,
}

impl SseRewriter {
    /// One chunk. The output is the chunk itself (a slice of it, when a partial line is held)
    /// unless a held line is completed or a `model` is replaced: most chunks are relayed
    /// without a copy.
    fn filter(&mut self, body: &mut Option<Bytes>, eos: bool, signals: &mut Signals) {
        let chunk = body.take().unwrap_or_default();
        // Output before the chunk's own bytes: the held line this chunk completes.
        let mut head = BytesMut::new();
        // The chunk's bytes relayed (`region_start..`), and where its own lines begin.
        let mut region_start = 0;
        let mut lines_from = 0;
        if self.skipping {
            // The rest of an over-long line: relayed, not read.
            match memchr::memchr(b'\n', &chunk) {
                Some(nl) => {
                    lines_from = nl + 1;
                    self.skipping = false;
                }
                None => {
                    *body = Some(chunk);
                    return;
                }
            }
        } else if !self.carry.is_empty() {
            match memchr::memchr(b'\n', &chunk) {
                Some(nl) => {
                    self.carry.put_slice(&chunk[..=nl]);
                    let model = read_line(&mut self.error_event, &self.carry, signals);
                    put_line(&mut head, &self.carry, model, &self.caller_model);
                    self.carry.clear();
                    region_start = nl + 1;
                    lines_from = nl + 1;
                }
                None => {
                    self.carry.put_slice(&chunk);
                    region_start = chunk.len();
                    lines_from = chunk.len();
                }
            }
        }
        // The chunk's complete lines (and at the end of the stream, its last one, newline or
        // not); a replaced `model` switches from slicing to copying.
        let mut edited: Option<BytesMut> = None;
        let mut copied_to = region_start;
        let mut at = lines_from;
        let mut region_end = at;
        while at < chunk.len() {
            let end = match memchr::memchr(b'\n', &chunk[at..]) {
                Some(nl) => at + nl + 1,
                None if eos => chunk.len(),
                None => break,
            };
            if let Some(model) = read_line(&mut self.error_event, &chunk[at..end], signals) {
                let out = edited.get_or_insert_with(|| {
                    BytesMut::with_capacity(chunk.len() + self.caller_model.len())
                });
                out.put_slice(&chunk[copied_to..at + model.start]);
                out.put_slice(&self.caller_model);
                copied_to = at + model.end;
            }
            at = end;
            region_end = end;
        }
        let region = match edited {
            Some(mut out) => {
                out.put_slice(&chunk[copied_to..region_end]);
                out.freeze()
            }
            None => chunk.slice(region_start..region_end),
        };
        // A partial last line is held (`at` is where it starts).
        self.carry.put_slice(&chunk[at..]);
        let mut tail = BytesMut::new();
        if eos {
            // A held line the stream ended without completing: read and relayed as it is.
            if !self.carry.is_empty() {
                let model = read_line(&mut self.error_event, &self.carry, signals);
                put_line(&mut tail, &self.carry, model, &self.caller_model);
                self.carry.clear();
            }
        } else if self.carry.len() > MAX_LINE {
            // Too long to hold. Only a content block is ever this large; the rest of the line
            // goes through untouched.
            if let Some(payload) = field_value(&self.carry, b"data:") {
                if matches!(
                    leading_type(payload),
                    Some(b"content_block_start" | b"content_block_delta")
                ) {
                    signals.content = true;
                }
            }
            tail.put_slice(&self.carry);
            self.carry.clear();
            self.skipping = true;
        }
        let out = if head.is_empty() && tail.is_empty() {
            region
        } else {
            head.reserve(region.len() + tail.len());
            head.put_slice(&region);
            head.put_slice(&tail);
            head.freeze()
        };
        *body = (!out.is_empty() || eos).then_some(out);
    }
}

/// `line` into `out`, with the `model` span replaced when there is one.
fn put_line(
    out: &mut BytesMut,
    line: &[u8],
    model: Option<std::ops::Range<usize>>,
    caller_model: &[u8],
) {
    match model {
        Some(m) => {
            out.put_slice(&line[..m.start]);
            out.put_slice(caller_model);
            out.put_slice(&line[m.end..]);
        }
        None => out.put_slice(line),
    }
}

/// Read one complete line (its newline included, if it has one) into `signals`; the span of a
/// `model` value to replace, relative to the line. `error_event` is the current event's state:
/// set by `event: error`, cleared by the blank line that ends an event.
fn read_line(
    error_event: &mut bool,
    line: &[u8],
    signals: &mut Signals,
) -> Option<std::ops::Range<usize>> {
    let text = trim_eol(line);
    if text.is_empty() {
        *error_event = false;
    } else if let Some(name) = field_value(text, b"event:") {
        *error_event = name == b"error";
    } else if let Some(payload) = field_value(text, b"data:") {
        let at = text.len() - payload.len();
        return on_data(payload, *error_event, signals).map(|m| at + m.start..at + m.end);
    }
    None
}

const EVENT_KEYS: &[&[u8]] = &[
    b"type",
    b"message",
    b"usage",
    b"content_block",
    b"delta",
    b"error",
];
const EVENT_TYPE: usize = 0;
const EVENT_MESSAGE: usize = 1;
const EVENT_USAGE: usize = 2;
const EVENT_CONTENT_BLOCK: usize = 3;
const EVENT_DELTA: usize = 4;
const EVENT_ERROR: usize = 5;

/// Read one `data:` payload into `signals`; the span of the `model` value to replace, if the
/// event is a `message_start` that has one.
fn on_data(
    payload: &[u8],
    error_event: bool,
    signals: &mut Signals,
) -> Option<std::ops::Range<usize>> {
    if !error_event {
        match leading_type(payload) {
            // The hot path: most events are deltas, and once content has passed they show
            // nothing new.
            Some(b"content_block_delta") if signals.content => return None,
            Some(b"message_stop") => {
                signals.terminal = true;
                return None;
            }
            Some(b"ping" | b"content_block_stop") => return None,
            _ => {}
        }
    }
    let Ok(scan) = json::scan_object_lenient(payload, EVENT_KEYS) else {
        if error_event {
            signals.error = Some(InbandError::Server);
        }
        return None;
    };
    let value = |w: usize| scan.get(w).map(|m| &payload[m.value.clone()]);
    let kind = value(EVENT_TYPE).and_then(string_contents);
    if error_event || kind == Some(b"error") {
        signals.error = Some(inband_error(value(EVENT_ERROR)));
        return None;
    }
    match kind? {
        b"message_start" => {
            let m = scan.get(EVENT_MESSAGE)?;
            let message = &payload[m.value.clone()];
            let inner = json::scan_object_lenient(message, &[b"model", b"usage"]).ok()?;
            if let Some(u) = inner.get(1) {
                merge_usage(&message[u.value.clone()], signals);
            }
            inner
                .get(0)
                .filter(|model| message.get(model.value.start) == Some(&b'"'))
                .map(|model| m.value.start + model.value.start..m.value.start + model.value.end)
        }
        b"message_delta" => {
            if let Some(u) = value(EVENT_USAGE) {
                merge_usage(u, signals);
            }
            None
        }
        b"content_block_start" => {
            if value(EVENT_CONTENT_BLOCK).is_some_and(block_has_content) {
                signals.content = true;
            }
            None
        }
        b"content_block_delta" => {
            let delta_type = value(EVENT_DELTA).and_then(type_of);
            if matches!(
                delta_type,
                Some(b"text_delta" | b"input_json_delta" | b"thinking_delta")
            ) {
                signals.content = true;
            }
            None
        }
        b"message_stop" => {
            signals.terminal = true;
            None
        }
        _ => None,
    }
}

/// A `content_block_start`'s block already carries an answer: a tool call (its name), opaque
/// redacted thinking, or text or thinking that is not empty. An empty text block only opens one.
fn block_has_content(block: &[u8]) -> bool {
    let Ok(scan) = json::scan_object_lenient(block, &[b"type", b"text", b"thinking"]) else {
        return false;
    };
    let value = |w: usize| scan.get(w).map(|m| &block[m.value.clone()]);
    let non_empty = |v: Option<&[u8]>| v.and_then(string_contents).is_some_and(|s| !s.is_empty());
    match value(0).and_then(string_contents) {
        Some(b"tool_use" | b"server_tool_use" | b"mcp_tool_use" | b"redacted_thinking") => true,
        Some(b"text") => non_empty(value(1)),
        Some(b"thinking") => non_empty(value(2)),
        _ => false,
    }
}

/// The in-band error's kind, from its `error.type` (`Server` when there is none to read).
fn inband_error(error: Option<&[u8]>) -> InbandError {
    match error.and_then(type_of) {
        Some(b"overloaded_error" | b"rate_limit_error") => InbandError::Overloaded,
        Some(b"invalid_request_error") => InbandError::InvalidRequest,
        _ => InbandError::Server,
    }
}

/// Anthropic's usage object: every field optional, since a `message_delta` may repeat some and
/// not others.
#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

/// Fold an Anthropic usage object into `signals.usage`. Prompt tokens are the input, cache
/// read and cache creation counts summed (Anthropic reports the cached parts apart; every other
/// dialect includes them). Counts are cumulative, so a later figure replaces an earlier one.
fn merge_usage(raw: &[u8], signals: &mut Signals) {
    let Ok(wire) = serde_json::from_slice::<WireUsage>(raw) else {
        return;
    };
    let mut usage = signals.usage.unwrap_or_default();
    let cached = usage
        .cache_read_tokens
        .saturating_add(usage.cache_write_tokens);
    let input = wire
        .input_tokens
        .unwrap_or(usage.prompt_tokens.saturating_sub(cached));
    if let Some(read) = wire.cache_read_input_tokens {
        usage.cache_read_tokens = read;
    }
    if let Some(write) = wire.cache_creation_input_tokens {
        usage.cache_write_tokens = write;
    }
    usage.prompt_tokens = input
        .saturating_add(usage.cache_read_tokens)
        .saturating_add(usage.cache_write_tokens);
    if let Some(output) = wire.output_tokens {
        usage.completion_tokens = output;
    }
    signals.usage = Some(usage);
}

// === byte helpers ===

/// A line without its `\n` / `\r\n` / `\r`.
fn trim_eol(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &line[..end]
}

/// The value of an SSE field line `name:value` (one leading space dropped, as the SSE
/// grammar says).
fn field_value<'a>(text: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = text.strip_prefix(name)?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

/// The contents of a JSON string literal without escapes (event and block types never have
/// one; an escaped one reads as unknown).
fn string_contents(v: &[u8]) -> Option<&[u8]> {
    let inner = v.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    (!inner.contains(&b'\\')).then_some(inner)
}

/// The `type` of a JSON object: from its leading member when it is first (as Anthropic writes
/// every event and block), else by a scan.
fn type_of(obj: &[u8]) -> Option<&[u8]> {
    if let Some(t) = leading_type(obj) {
        return Some(t);
    }
    let scan = json::scan_object_lenient(obj, &[b"type"]).ok()?;
    string_contents(&obj[scan.get(0)?.value.clone()])
}

/// `X` when `obj` opens with `{"type":"X"` (whitespace allowed, no escapes in `X`): the event
/// type without a scan. Only a prefix is read, so it also answers for a partial line.
fn leading_type(obj: &[u8]) -> Option<&[u8]> {
    fn ws(b: &[u8]) -> &[u8] {
        let n = b
            .iter()
            .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .unwrap_or(b.len());
        &b[n..]
    }
    let rest = ws(obj).strip_prefix(b"{")?;
    let rest = ws(rest).strip_prefix(b"\"type\"")?;
    let rest = ws(rest).strip_prefix(b":")?;
    let rest = ws(rest).strip_prefix(b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    (rest[end] == b'"').then_some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::openai::fixed_json_length;
    use crate::adapters::stream::Usage;

    const TEXT: &[u8] =
        include_bytes!("../../../tests/fixtures/anthropic/same_dialect_stream_text.sse");
    const TOOL_THINKING: &[u8] =
        include_bytes!("../../../tests/fixtures/anthropic/same_dialect_stream_tool_thinking.sse");
    const OVERLOADED: &[u8] =
        include_bytes!("../../../tests/fixtures/anthropic/same_dialect_stream_overloaded.sse");
    const MESSAGE: &[u8] =
        include_bytes!("../../../tests/fixtures/anthropic/same_dialect_message.json");

    const CALLER: &[u8] = b"\"smart\"";

    /// Run `parts` through a fresh SSE rewriter; the concatenated output and the signals.
    fn run_sse(parts: &[&[u8]]) -> (Vec<u8>, Signals) {
        let mut rw = AnthropicRewriter::sse(Bytes::from_static(CALLER));
        let mut signals = Signals::default();
        let mut out = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let mut b = Some(Bytes::copy_from_slice(part));
            rw.filter(&mut b, i + 1 == parts.len(), &mut signals);
            if let Some(b) = b {
                out.extend_from_slice(&b);
            }
        }
        (out, signals)
    }

    /// The stream with only `message_start`'s model replaced, by plain text substitution.
    fn expected(stream: &[u8], upstream_model: &str) -> Vec<u8> {
        let text = std::str::from_utf8(stream).expect("utf8");
        let from = format!("\"model\":\"{upstream_model}\"");
        assert_eq!(text.matches(&from).count(), 1);
        text.replacen(&from, "\"model\":\"smart\"", 1).into_bytes()
    }

    #[test]
    fn sse_model_is_rewritten_in_message_start_only() {
        let (out, signals) = run_sse(&[TEXT]);
        assert_eq!(
            std::str::from_utf8(&out).expect("utf8"),
            std::str::from_utf8(&expected(TEXT, "claude-sonnet-4-5-20250929")).expect("utf8")
        );
        // The text delta that quotes `"model":"x"` is content, not a field.
        assert!(memchr::memmem::find(&out, br#"the \"model\":\"x\" field"#).is_some());
        assert_eq!(
            out.len(),
            TEXT.len() + CALLER.len() - "\"claude-sonnet-4-5-20250929\"".len()
        );
        assert!(signals.content && signals.terminal && signals.error.is_none());
        assert_eq!(
            signals.usage,
            Some(Usage {
                prompt_tokens: 25 + 1200 + 4000,
                completion_tokens: 15,
                cache_read_tokens: 4000,
                cache_write_tokens: 1200,
            })
        );
    }

    #[test]
    fn a_stream_split_anywhere_gives_the_same_bytes_and_signals() {
        for stream in [TEXT, TOOL_THINKING, OVERLOADED] {
            let whole = run_sse(&[stream]);
            for cut in 0..=stream.len() {
                assert_eq!(
                    run_sse(&[&stream[..cut], &stream[cut..]]),
                    whole,
                    "cut at {cut}"
                );
            }
            // Three pieces, at a stride.
            for a in (0..stream.len()).step_by(11) {
                for b in (a..stream.len()).step_by(23) {
                    assert_eq!(
                        run_sse(&[&stream[..a], &stream[a..b], &stream[b..]]),
                        whole,
                        "cuts at {a}, {b}"
                    );
                }
            }
            // A byte at a time, with an empty end-of-stream call.
            let mut bytes: Vec<&[u8]> = stream.chunks(1).collect();
            bytes.push(b"");
            assert_eq!(run_sse(&bytes), whole);
        }
    }

    #[test]
    fn tool_and_thinking_stream_signals() {
        let (out, signals) = run_sse(&[TOOL_THINKING]);
        assert_eq!(out, expected(TOOL_THINKING, "claude-opus-4-1"));
        assert!(signals.content && signals.terminal);
        // message_delta repeats the input counts: the later figures replace the earlier.
        assert_eq!(
            signals.usage,
            Some(Usage {
                prompt_tokens: 472,
                completion_tokens: 89,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn an_error_event_is_reported_with_its_kind() {
        let (out, signals) = run_sse(&[OVERLOADED]);
        assert_eq!(out, expected(OVERLOADED, "claude-haiku-4-5"));
        assert_eq!(signals.error, Some(InbandError::Overloaded));
        assert!(!signals.content && !signals.terminal);
        assert_eq!(signals.usage.map(|u| u.prompt_tokens), Some(12));
        let kind = |event: &str| run_sse(&[event.as_bytes()]).1.error;
        for (body, want) in [
            (
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"x"}}"#,
                InbandError::Overloaded,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#,
                InbandError::InvalidRequest,
            ),
            (
                r#"{"type":"error","error":{"type":"api_error","message":"x"}}"#,
                InbandError::Server,
            ),
            (
                r#"{"type":"error","error":{"type":"something_new"}}"#,
                InbandError::Server,
            ),
            (r#"{"type":"error"}"#, InbandError::Server),
            ("not json at all", InbandError::Server),
        ] {
            assert_eq!(
                kind(&format!("event: error\ndata: {body}\n\n")),
                Some(want),
                "{body}"
            );
        }
        // Named by its data alone, or by its event line alone.
        assert_eq!(
            kind("data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n"),
            Some(InbandError::Overloaded)
        );
        assert_eq!(
            kind("event: error\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"),
            Some(InbandError::Server)
        );
        // The event name lasts until the blank line that ends its event.
        assert_eq!(kind("event: error\n\ndata: {\"type\":\"ping\"}\n\n"), None);
    }

    #[test]
    fn content_is_the_first_content_bearing_event() {
        let content = |events: &str| run_sse(&[events.as_bytes()]).1.content;
        for not_yet in [
            r#"data: {"type":"message_start","message":{"model":"m","content":[],"usage":{"input_tokens":1}}}"#,
            r#"data: {"type": "ping"}"#,
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#,
            r#"data: {"type":"content_block_stop","index":0}"#,
            r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1}}"#,
            r#"data: {"type":"message_stop"}"#,
        ] {
            assert!(!content(&format!("{not_yet}\n\n")), "{not_yet}");
        }
        for bearing in [
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":"Hi"}}"#,
            r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
            r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"server_tool_use","id":"s","name":"web_search","input":{}}}"#,
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"xyz"}}"#,
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
            // Type not first: read by a scan.
            r#"data: {"index":0,"delta":{"text":"a","type":"text_delta"},"type":"content_block_delta"}"#,
        ] {
            assert!(content(&format!("{bearing}\n\n")), "{bearing}");
        }
        // message_stop is the end; nothing else is.
        assert!(
            run_sse(&[b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"])
                .1
                .terminal
        );
        assert!(!run_sse(&[b"event: message_stop\n\n"]).1.terminal);
    }

    #[test]
    fn usage_folds_cache_counts_into_the_prompt() {
        let (_, signals) = run_sse(&[
            br#"data: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":10,"cache_read_input_tokens":100,"cache_creation_input_tokens":5,"output_tokens":1}}}
data: {"type":"message_delta","usage":{"output_tokens":42}}
"#,
        ]);
        assert_eq!(
            signals.usage,
            Some(Usage {
                prompt_tokens: 115,
                completion_tokens: 42,
                cache_read_tokens: 100,
                cache_write_tokens: 5,
            })
        );
        // A later input count replaces the earlier one; the cache counts stay.
        let (_, signals) = run_sse(&[
            br#"data: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":10,"cache_read_input_tokens":100,"cache_creation_input_tokens":null,"output_tokens":1}}}
data: {"type":"message_delta","usage":{"input_tokens":20,"output_tokens":3,"server_tool_use":{"web_search_requests":1}}}
"#,
        ]);
        assert_eq!(
            signals.usage,
            Some(Usage {
                prompt_tokens: 120,
                completion_tokens: 3,
                cache_read_tokens: 100,
                cache_write_tokens: 0,
            })
        );
    }

    #[test]
    fn crlf_lines_and_spacing_variants_are_rewritten() {
        let stream = b"event: message_start\r\ndata:{ \"type\" : \"message_start\", \"message\" : { \"model\" : \"up\" } }\r\n\r\n";
        let (out, _) = run_sse(&[stream]);
        assert_eq!(
            out,
            b"event: message_start\r\ndata:{ \"type\" : \"message_start\", \"message\" : { \"model\" : \"smart\" } }\r\n\r\n"
        );
        // A last line without its newline is still read.
        let (out, _) = run_sse(&[br#"data: {"type":"message_start","message":{"model":"up"}}"#]);
        assert_eq!(
            out,
            br#"data: {"type":"message_start","message":{"model":"smart"}}"#
        );
        // A model that is not a string, or a nested one elsewhere, is left alone.
        for same in [
            &br#"data: {"type":"message_start","message":{"model":null}}"#[..],
            br#"data: {"type":"message_delta","message":{"model":"up"}}"#,
            br#"data: {"type":"message_start","model":"up"}"#,
            b": comment\nid: 7\nretry: 100\n",
        ] {
            assert_eq!(run_sse(&[same]).0, same);
        }
    }

    #[test]
    fn a_line_too_long_to_hold_is_relayed_untouched() {
        let big = "x".repeat(MAX_LINE + 10);
        let long = format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{big}\"}}}}\n\n"
        );
        let stream = [
            &b"data: {\"type\":\"message_start\",\"message\":{\"model\":\"up\"}}\n\n"[..],
            long.as_bytes(),
            b"data: {\"type\":\"message_stop\"}\n\n",
        ]
        .concat();
        let want = [
            &b"data: {\"type\":\"message_start\",\"message\":{\"model\":\"smart\"}}\n\n"[..],
            long.as_bytes(),
            b"data: {\"type\":\"message_stop\"}\n\n",
        ]
        .concat();
        let mut rw = AnthropicRewriter::sse(Bytes::from_static(CALLER));
        let mut signals = Signals::default();
        let mut out = Vec::new();
        let mut held_most = 0;
        let chunks: Vec<&[u8]> = stream.chunks(64 << 10).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let mut b = Some(Bytes::copy_from_slice(chunk));
            rw.filter(&mut b, i + 1 == chunks.len(), &mut signals);
            out.extend_from_slice(&b.unwrap_or_default());
            if let Mode::Sse(sse) = &rw.mode {
                held_most = held_most.max(sse.carry.len());
            }
        }
        assert_eq!(out, want);
        assert!(held_most <= MAX_LINE + (64 << 10), "held {held_most}");
        assert!(signals.content && signals.terminal);
    }

    #[test]
    fn json_model_is_rewritten_with_the_announced_length() {
        for caller in [
            &b"\"s\""[..],
            b"\"a-caller-facing-name-longer-than-the-upstream-one-by-far\"",
        ] {
            let fixed = fixed_json_length(MESSAGE.len(), caller);
            let mut rw = AnthropicRewriter::json(Bytes::copy_from_slice(caller), Some(fixed));
            assert!(!rw.changes_length());
            let mut signals = Signals::default();
            let mut out = Vec::new();
            // Split mid-model: held until the end.
            let (a, b) = MESSAGE.split_at(60);
            let mut first = Some(Bytes::from_static(a));
            rw.filter(&mut first, false, &mut signals);
            assert_eq!(first, None);
            let mut rest = Some(Bytes::from_static(b));
            rw.filter(&mut rest, true, &mut signals);
            out.extend_from_slice(&rest.expect("body"));
            assert_eq!(out.len(), fixed, "exactly the announced length");
            let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
            assert_eq!(
                v["model"].as_str().map(str::as_bytes),
                Some(&caller[1..caller.len() - 1])
            );
            assert_eq!(
                v["content"][0]["text"],
                "Hello! The \"model\" field is not this one."
            );
            assert!(signals.content && signals.terminal);
            assert_eq!(
                signals.usage,
                Some(Usage {
                    prompt_tokens: 2095 + 1024,
                    completion_tokens: 503,
                    cache_read_tokens: 1024,
                    cache_write_tokens: 0,
                })
            );
        }
        // Re-framed: exactly the rewritten body, no padding.
        let mut rw = AnthropicRewriter::json(Bytes::from_static(CALLER), None);
        assert!(rw.changes_length());
        let mut b = Some(Bytes::from_static(MESSAGE));
        rw.filter(&mut b, true, &mut Signals::default());
        let out = b.expect("body");
        assert_eq!(
            out.len(),
            MESSAGE.len() - "\"claude-sonnet-4-5-20250929\"".len() + CALLER.len()
        );
        // An empty answer is a complete message with no content.
        let mut signals = Signals::default();
        let mut b = Some(Bytes::from_static(br#"{"type":"message","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":0}}"#));
        AnthropicRewriter::json(Bytes::from_static(CALLER), None).filter(
            &mut b,
            true,
            &mut signals,
        );
        assert!(signals.terminal && !signals.content);
        // A 200 carrying an error object.
        let mut signals = Signals::default();
        let mut b = Some(Bytes::from_static(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ));
        AnthropicRewriter::json(Bytes::from_static(CALLER), None).filter(
            &mut b,
            true,
            &mut signals,
        );
        assert_eq!(signals.error, Some(InbandError::Overloaded));
    }

    #[test]
    fn refusals_are_replaced_in_anthropics_shape() {
        let mut rw = AnthropicRewriter::refusal(400);
        assert!(rw.changes_length());
        let mut signals = Signals::default();
        let upstream = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum; key sk-ant-secret"}}"#;
        let (a, b) = upstream.split_at(40);
        let mut first = Some(Bytes::from_static(a));
        rw.filter(&mut first, false, &mut signals);
        assert_eq!(first, None);
        assert_eq!(rw.refused_body(), Some(a));
        let mut rest = Some(Bytes::from_static(b));
        rw.filter(&mut rest, true, &mut signals);
        assert_eq!(
            rw.refused_body()
                .map(super::super::respond::is_context_length_error),
            Some(true)
        );
        let out = rest.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("context window")));
        assert!(
            memchr::memmem::find(&out, b"sk-ant").is_none(),
            "never the provider's words"
        );
        assert_eq!(signals, Signals::default());
        assert_eq!(AnthropicRewriter::sse(Bytes::new()).refused_body(), None);
    }

    #[test]
    fn chunks_without_a_model_are_relayed_without_a_copy() {
        let mut rw = AnthropicRewriter::sse(Bytes::from_static(CALLER));
        let mut signals = Signals::default();
        let mut b = Some(Bytes::from_static(
            b"data: {\"type\":\"message_start\",\"message\":{\"model\":\"up\"}}\n\n",
        ));
        rw.filter(&mut b, false, &mut signals);
        let deltas: &'static [u8] = b"event: ping\ndata: {\"type\": \"ping\"}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\nevent: mess";
        let chunk = Bytes::from_static(deltas);
        let mut b = Some(chunk.clone());
        rw.filter(&mut b, false, &mut signals);
        let out = b.expect("complete lines");
        assert_eq!(
            out.as_ptr(),
            chunk.as_ptr(),
            "a slice of the chunk, not a copy"
        );
        assert_eq!(out.len(), deltas.len() - b"event: mess".len());
        assert!(signals.content);
        let mut b = Some(Bytes::from_static(
            b"age_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ));
        rw.filter(&mut b, true, &mut signals);
        assert_eq!(
            b.as_deref(),
            Some(&b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"[..])
        );
        assert!(signals.terminal);
    }

    #[test]
    fn passthrough_relays_as_is() {
        let mut rw = AnthropicRewriter::passthrough();
        assert!(!rw.changes_length());
        let mut b = Some(Bytes::from_static(TEXT));
        rw.filter(&mut b, true, &mut Signals::default());
        assert_eq!(b.as_deref(), Some(TEXT));
    }

    /// A tiny deterministic generator: the garbage is the same on every run.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn garbage_never_panics_and_is_relayed_unchanged() {
        let alphabet: &[u8] =
            b"{}[]\":,\\ \n\r\tdata:event: error message_start model type 0123 \xff\xc3";
        let mut state = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..400 {
            let len = usize::try_from(xorshift(&mut state) % 600).unwrap_or(0);
            let stream: Vec<u8> = (0..len)
                .map(|_| {
                    alphabet[usize::try_from(xorshift(&mut state)).unwrap_or(0) % alphabet.len()]
                })
                .collect();
            let cut = usize::try_from(xorshift(&mut state)).unwrap_or(0) % (len + 1);
            let (out, _) = run_sse(&[&stream[..cut], &stream[cut..]]);
            // Garbage has no message_start with a string model to rewrite.
            assert_eq!(out, stream);
            let mut rw =
                AnthropicRewriter::json(Bytes::from_static(CALLER), Some(stream.len() + 5));
            let mut b = Some(Bytes::from(stream.clone()));
            rw.filter(&mut b, true, &mut Signals::default());
            assert_eq!(b.map(|b| b.len()), Some(stream.len() + 5));
            let mut rw = AnthropicRewriter::refusal(422);
            let mut b = Some(Bytes::from(stream));
            rw.filter(&mut b, true, &mut Signals::default());
            assert!(b.is_some());
        }
        // Truncated and mangled versions of real events.
        for stream in [TEXT, TOOL_THINKING, OVERLOADED, MESSAGE] {
            for end in 0..stream.len() {
                let _ = run_sse(&[&stream[..end]]);
                let mut b = Some(Bytes::copy_from_slice(&stream[..end]));
                AnthropicRewriter::json(Bytes::from_static(CALLER), None).filter(
                    &mut b,
                    true,
                    &mut Signals::default(),
                );
            }
        }
    }
}
