//! Byte-level builders for responses: JSON bodies, SSE events, chunk framing, status lines.
//!
//! Everything appends to caller-owned buffers that connections reuse between requests.

use std::time::{SystemTime, UNIX_EPOCH};

/// The assistant reply, pre-escaped for JSON and pre-split into word tokens.
pub(super) struct Reply {
    text: String,
    escaped: Vec<u8>,
    /// Byte offsets of the start of each token, plus `text.len()` at the end. Tokens are the
    /// pieces of `split_inclusive(char::is_whitespace)`, so they concatenate back to `text`.
    offsets: Vec<usize>,
    /// Number of whitespace-separated words (the completion token count).
    pub(super) words: u64,
}

impl Reply {
    pub(super) fn new(text: &str) -> Reply {
        let mut escaped = Vec::with_capacity(text.len() + 8);
        escape_json(&mut escaped, text.as_bytes());
        let mut offsets = Vec::new();
        let mut at = 0;
        for token in text.split_inclusive(char::is_whitespace) {
            offsets.push(at);
            at += token.len();
        }
        offsets.push(text.len());
        Reply {
            text: text.to_string(),
            escaped,
            offsets,
            words: text.split_whitespace().count() as u64,
        }
    }

    pub(super) fn escaped(&self) -> &[u8] {
        &self.escaped
    }

    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Piece `i` of the reply split into `k` pieces. Pieces concatenate to the reply; when there
    /// are more pieces than tokens some are empty, and pieces past `k` are empty.
    pub(super) fn piece(&self, i: usize, k: usize) -> &str {
        let tokens = self.offsets.len() - 1;
        if i >= k {
            return "";
        }
        let start = self.offsets[i * tokens / k];
        let end = self.offsets[(i + 1) * tokens / k];
        &self.text[start..end]
    }
}

/// Append `s` as the inside of a JSON string (no surrounding quotes).
pub(super) fn escape_json(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => {
                out.extend_from_slice(&s[start..i]);
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
}

/// Append `bytes` (which may be invalid UTF-8) as the inside of a JSON string.
pub(super) fn escape_json_lossy(out: &mut Vec<u8>, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => escape_json(out, s.as_bytes()),
        Err(_) => escape_json(out, String::from_utf8_lossy(bytes).as_bytes()),
    }
}

pub(super) fn push_int<I: itoa::Integer>(out: &mut Vec<u8>, n: I) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(n).as_bytes());
}

pub(super) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(super) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The `Date` header value, recomputed at most once a second per connection.
pub(super) struct DateCache {
    secs: u64,
    value: Vec<u8>,
}

impl DateCache {
    pub(super) fn new() -> DateCache {
        DateCache {
            secs: u64::MAX,
            value: Vec::with_capacity(29),
        }
    }

    pub(super) fn get(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let secs = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if secs != self.secs {
            self.secs = secs;
            self.value.clear();
            self.value
                .extend_from_slice(httpdate::fmt_http_date(now).as_bytes());
        }
        &self.value
    }
}

pub(super) fn reason(code: u16) -> &'static str {
    match code {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Site Overloaded",
        _ => "Mock",
    }
}

/// Whether a response with this status must not carry a body.
pub(super) fn bodyless(code: u16) -> bool {
    code < 200 || code == 204 || code == 304
}

/// Common response header fields.
pub(super) struct Head<'a> {
    pub(super) code: u16,
    pub(super) content_type: &'a [u8],
    /// `Some(n)`: `content-length: n`; `None`: `transfer-encoding: chunked` (or no body framing
    /// at all for bodyless statuses).
    pub(super) content_length: Option<usize>,
    pub(super) sse: bool,
    pub(super) name: &'a [u8],
    pub(super) date: &'a [u8],
    pub(super) close: bool,
    pub(super) retry_after: Option<&'a [u8]>,
}

pub(super) fn write_head(out: &mut Vec<u8>, h: &Head<'_>) {
    let code = if (100..=999).contains(&h.code) {
        h.code
    } else {
        500
    };
    out.extend_from_slice(b"HTTP/1.1 ");
    push_int(out, code);
    out.push(b' ');
    out.extend_from_slice(reason(code).as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(h.date);
    if !bodyless(code) {
        out.extend_from_slice(b"\r\ncontent-type: ");
        out.extend_from_slice(h.content_type);
        match h.content_length {
            Some(n) => {
                out.extend_from_slice(b"\r\ncontent-length: ");
                push_int(out, n);
            }
            None => out.extend_from_slice(b"\r\ntransfer-encoding: chunked"),
        }
        if h.sse {
            out.extend_from_slice(b"\r\ncache-control: no-cache");
        }
    }
    out.extend_from_slice(b"\r\nx-mock-name: ");
    out.extend_from_slice(h.name);
    if let Some(ra) = h.retry_after {
        out.extend_from_slice(b"\r\nretry-after: ");
        out.extend(ra.iter().copied().filter(|b| *b != b'\r' && *b != b'\n'));
    }
    if h.close {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n\r\n");
}

/// Append `data` framed as one HTTP/1.1 chunk.
pub(super) fn push_chunk(out: &mut Vec<u8>, data: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut n = data.len();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

pub(super) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
pub(super) const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// Per-request values that appear in answers.
pub(super) struct Answer<'a> {
    pub(super) n: u64,
    pub(super) created: u64,
    /// JSON-escaped model.
    pub(super) model: &'a [u8],
    pub(super) prompt_tokens: u64,
    pub(super) completion_tokens: u64,
}

fn push_prefix(out: &mut Vec<u8>, a: &Answer<'_>, object: &[u8]) {
    out.extend_from_slice(b"{\"id\":\"chatcmpl-mock-");
    push_int(out, a.n);
    out.extend_from_slice(b"\",\"object\":\"");
    out.extend_from_slice(object);
    out.extend_from_slice(b"\",\"created\":");
    push_int(out, a.created);
    out.extend_from_slice(b",\"model\":\"");
    out.extend_from_slice(a.model);
    out.push(b'"');
}

fn push_usage(out: &mut Vec<u8>, a: &Answer<'_>) {
    out.extend_from_slice(b"\"usage\":{\"prompt_tokens\":");
    push_int(out, a.prompt_tokens);
    out.extend_from_slice(b",\"completion_tokens\":");
    push_int(out, a.completion_tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    push_int(out, a.prompt_tokens + a.completion_tokens);
    out.push(b'}');
}

/// A `chat.completion` JSON body; `content` is the JSON-escaped reply, `None` for no choices.
pub(super) fn completion_json(out: &mut Vec<u8>, a: &Answer<'_>, content: Option<&[u8]>) {
    push_prefix(out, a, b"chat.completion");
    match content {
        Some(c) => {
            out.extend_from_slice(
                b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"",
            );
            out.extend_from_slice(c);
            out.extend_from_slice(b"\"},\"finish_reason\":\"stop\"}],");
        }
        None => out.extend_from_slice(b",\"choices\":[],"),
    }
    push_usage(out, a);
    out.push(b'}');
}

/// The opening SSE event of a text answer: a role-only delta
/// (`{"role":"assistant","content":""}`), as OpenAI sends before any content.
pub(super) fn role_event(out: &mut Vec<u8>, a: &Answer<'_>) {
    out.extend_from_slice(b"data: ");
    push_prefix(out, a, b"chat.completion.chunk");
    out.extend_from_slice(b",\"mock_sent_us\":");
    push_int(out, unix_micros());
    out.extend_from_slice(
        b",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    );
}

/// A content SSE event carrying `piece` (raw text, escaped here).
pub(super) fn content_event(out: &mut Vec<u8>, a: &Answer<'_>, piece: &str) {
    out.extend_from_slice(b"data: ");
    push_prefix(out, a, b"chat.completion.chunk");
    out.extend_from_slice(b",\"mock_sent_us\":");
    push_int(out, unix_micros());
    out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
    escape_json(out, piece.as_bytes());
    out.extend_from_slice(b"\"},\"finish_reason\":null}]}\n\n");
}

/// The final SSE event: empty delta, `finish_reason` and, with `usage`, the usage (OpenAI
/// itself sends usage only in a last chunk of its own, when asked: [`usage_event`]).
pub(super) fn finish_event(out: &mut Vec<u8>, a: &Answer<'_>, finish_reason: &str, usage: bool) {
    out.extend_from_slice(b"data: ");
    push_prefix(out, a, b"chat.completion.chunk");
    out.extend_from_slice(b",\"mock_sent_us\":");
    push_int(out, unix_micros());
    out.extend_from_slice(b",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"");
    out.extend_from_slice(finish_reason.as_bytes());
    out.extend_from_slice(b"\"}]");
    if usage {
        out.push(b',');
        push_usage(out, a);
    }
    out.extend_from_slice(b"}\n\n");
}

/// The usage chunk of `stream_options.include_usage`: `"choices": []` and usage.
pub(super) fn usage_event(out: &mut Vec<u8>, a: &Answer<'_>) {
    out.extend_from_slice(b"data: ");
    push_prefix(out, a, b"chat.completion.chunk");
    out.extend_from_slice(b",\"mock_sent_us\":");
    push_int(out, unix_micros());
    out.extend_from_slice(b",\"choices\":[],");
    push_usage(out, a);
    out.extend_from_slice(b"}\n\n");
}

/// An SSE event with `"choices": []`.
pub(super) fn empty_choices_event(out: &mut Vec<u8>, a: &Answer<'_>) {
    out.extend_from_slice(b"data: ");
    push_prefix(out, a, b"chat.completion.chunk");
    out.extend_from_slice(b",\"mock_sent_us\":");
    push_int(out, unix_micros());
    out.extend_from_slice(b",\"choices\":[]}\n\n");
}

/// `{"error":{"message":"<message>","type":"<kind>","code":"<code>"}}`; `message` is raw.
pub(super) fn error_json(out: &mut Vec<u8>, message: &[u8], kind: &str, code: &str) {
    out.extend_from_slice(b"{\"error\":{\"message\":\"");
    escape_json_lossy(out, message);
    out.extend_from_slice(b"\",\"type\":\"");
    escape_json(out, kind.as_bytes());
    out.extend_from_slice(b"\",\"code\":\"");
    escape_json(out, code.as_bytes());
    out.extend_from_slice(b"\"}}");
}

/// The default body of `Behaviour::Status`: it echoes the credential and host on purpose.
pub(super) fn status_default_json(out: &mut Vec<u8>, code: u16, authorization: &[u8], host: &[u8]) {
    out.extend_from_slice(b"{\"error\":{\"message\":\"mock failure; Incorrect API key provided: ");
    escape_json_lossy(out, authorization);
    out.extend_from_slice(b" at ");
    escape_json_lossy(out, host);
    out.extend_from_slice(b"\",\"type\":\"mock_error\",\"code\":\"mock_");
    push_int(out, code);
    out.extend_from_slice(b"\"}}");
}

pub(super) const MODELS_JSON: &[u8] =
    br#"{"object":"list","data":[{"id":"mock-model","object":"model","owned_by":"signalbox-mock"}]}"#;

/// The model list in Anthropic's shape (`GET /v1/models` with `anthropic-version`).
pub(super) const ANTHROPIC_MODELS_JSON: &[u8] = br#"{"data":[{"type":"model","id":"mock-model","display_name":"Mock Model","created_at":"2025-01-01T00:00:00Z"}],"has_more":false,"first_id":"mock-model","last_id":"mock-model"}"#;
