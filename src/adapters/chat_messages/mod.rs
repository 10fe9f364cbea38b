//! Translation between the OpenAI Chat Completions dialect ("chat") and the Anthropic Messages
//! dialect ("messages"), both directions: requests, responses, streams and errors.
//!
//! Pure functions over bytes: no I/O, no knowledge of Pingora, no state beyond one stream's.
//! The proxy calls them when a caller's dialect differs from the serving provider's kind.
//!
//! - [`request`]: a caller's request body into the provider's dialect
//!   ([`chat_request_to_messages`], [`messages_request_to_chat`]), or an [`Unexpressible`]
//!   naming the first field the target dialect cannot carry (answered 400).
//! - [`response`]: a provider's complete JSON answer into the caller's dialect, with its usage.
//! - [`stream`]: a provider's SSE stream into the caller's, event by event
//!   ([`MessagesStreamToChat`], [`ChatStreamToMessages`]), updating the stream
//!   [`Signals`](super::stream::Signals) as events pass.
//! - [`error`]: provider error bodies in the caller's error shape, in signalbox's own words.
//! - `sse`: the event reader both stream converters share (one partial event of carry).
//!
//! Bodies are handled as `serde_json::Value` (taken apart by value, so large strings such as
//! base64 images move instead of being copied); streams parse one event at a time into
//! borrowing structs and write their output by hand.
//!
//! # Mapping decisions
//!
//! Faithful where both dialects can say the same thing:
//!
//! | chat | messages |
//! |---|---|
//! | `system` / `developer` messages (anywhere; several are joined in order) | top-level `system` (a string, or text blocks) |
//! | `user` content parts `text`, `image_url` (`data:` URL / `http(s)` URL), `file` (PDF `file_data`) | `text`, `image` (source `base64` / `url`), `document` (base64 PDF) |
//! | assistant `content`, `refusal`, `tool_calls` (ids kept byte for byte) | `text` blocks, `tool_use` blocks |
//! | `tool` messages (consecutive ones, and a user message after them, merge into one user turn) | `tool_result` blocks |
//! | consecutive messages of one role | one turn (Anthropic requires alternation) |
//! | `tools` (`type: function`) | `tools` with `input_schema` |
//! | `tool_choice` `auto` / `none` / `required` / `{function}` / `allowed_tools` | `auto` / `none` / `any` / `tool` / the tools narrowed |
//! | `parallel_tool_calls: false` | `tool_choice.disable_parallel_tool_use: true` |
//! | `stop` (string or array, at most 4 toward chat) | `stop_sequences` |
//! | `max_completion_tokens` or `max_tokens` (absent: [`ToMessages::default_max_tokens`]) | `max_tokens` (toward chat: `max_completion_tokens`) |
//! | `temperature` (0–1 only toward messages), `top_p`, `top_k` (an extension some servers accept) | `temperature`, `top_p`, `top_k` (not toward chat) |
//! | `user` or `safety_identifier` | `metadata.user_id` |
//! | `reasoning_effort` `low`/`medium`/`high`/`xhigh` (`none`/`minimal`: no thinking) | `thinking` with a budget of 1024/2048/4096/8192 (and back: under 2048 low, under 4096 medium, else high; `adaptive`: the chat model's own default) |
//! | `reasoning_effort` (toward chat, when no thinking budget says more) | `output_config.effort` `low`/`medium`/`high` (`max`: `high`) |
//! | `reasoning_effort` (toward chat: the latest turn's wins over the request's) | a message's own `output_config.effort` (Anthropic's per-turn control; Claude Code 2.1 sends it on a system message) |
//! | `system` messages where they stand (toward chat) | `system`-role messages between turns, as agents (Claude Code) send them |
//! | `finish_reason` `stop` / `length` / `tool_calls` / `content_filter` | `stop_reason` `end_turn` or `stop_sequence` / `max_tokens` / `tool_use` / `refusal` |
//! | `usage` (`prompt_tokens` includes cached ones, `prompt_tokens_details.cached_tokens`) | `usage` (`input_tokens` excludes `cache_read_input_tokens` and `cache_creation_input_tokens`) |
//! | `reasoning_content` (text) plus `thinking_blocks` (the signed blocks verbatim, LiteLLM's convention) | `thinking` / `redacted_thinking` blocks |
//!
//! Thinking never gets a forged signature: toward messages, only `thinking_blocks` entries
//! that carry Anthropic's own `signature` (or `data` for `redacted_thinking`) pass, and
//! `reasoning_content` alone is dropped. Toward a messages caller, an OpenAI-kind provider's
//! unsigned `reasoning_content` is dropped too (it could not be sent back to Anthropic).
//! Toward chat, thinking blocks in the history are dropped (an OpenAI model cannot read
//! Anthropic's signed thinking), as is `cache_control` everywhere.
//!
//! Unexpressible (400 naming the field) rather than silently lost:
//! - toward messages: `n` > 1, `logprobs: true`, `top_logprobs`, a non-empty `logit_bias`,
//!   non-zero `presence_penalty` / `frequency_penalty`, `response_format` other than `text`,
//!   `modalities` other than text, `audio`, `verbosity` other than `medium`,
//!   `web_search_options`, the legacy `functions` / `function_call` and `function` role,
//!   `temperature` above 1, `input_audio` parts, `file` parts by `file_id` or not PDF,
//!   image URLs that are neither `data:` base64 nor http(s), non-function tools, tool ids
//!   outside `[A-Za-z0-9_-]`, tool-call arguments that are not a JSON object,
//!   `reasoning_effort` with a forced tool, a `temperature` other than 1, a `top_p` under
//!   0.95 or a `top_k` (Anthropic's thinking refuses them), or too small a `max_tokens`;
//! - toward chat: `top_k`, more than 4 `stop_sequences`, metadata keys other than
//!   `user_id`, Anthropic-defined tools (`bash_…`, `web_search_…`, …), image/document
//!   sources by `file` (the Files API), PDF documents by URL or by content blocks,
//!   `citations`, images inside a `tool_result`, server-tool blocks, a final assistant
//!   message (a prefill: chat models answer it instead of continuing it), `container`,
//!   `mcp_servers`, `output_config` members other than `effort` (the request's or a turn's);
//! - both ways: any field the dialect does not define (the providers refuse them too).
//!
//! Dropped, because they change nothing in the answer (or nothing the target can act on):
//! `stream_options` (the stream converters decide what usage the caller sees), `store`,
//! `metadata` (chat's, for stored completions), `service_tier`, `context_management` (toward
//! chat: it edits what Anthropic keeps of earlier turns on its side; the chat model gets the
//! whole conversation, which answers the same), `prompt_cache_key`,
//! `prompt_cache_retention`, `prediction` (latency only), `seed` (best effort at OpenAI
//! itself), `image_url.detail`, message `name`, a tool's `strict` flag (Anthropic follows the
//! schema without the grammar guarantee), a tool's `defer_loading` (toward chat: the chat model
//! sees every tool at once instead of finding deferred ones by tool search, which answers the
//! same), `thinking.display` (toward chat, with the rest of `thinking`), `is_error` on a tool
//! result (its text says so), a text document's `title`/`context`, `routing` (signalbox's own member), and in responses
//! `stop_sequence` (chat does not say which sequence matched), `citations` and `logprobs`.
//! Usage keeps its totals, but a chat caller cannot tell cache writes from other input.

mod error;
mod request;
mod response;
// Public for the property tests (`tests/props.rs`), which compare it with another SSE parser.
#[doc(hidden)]
pub mod sse;
mod stream;

pub use error::{
    anthropic_error_to_openai, anthropic_sse_error_event, gateway_error_to_anthropic,
    openai_error_to_anthropic, openai_status_for_anthropic,
};
pub use request::{chat_request_to_messages, messages_request_to_chat, ToChat, ToMessages};
pub use response::{chat_response_to_messages, messages_response_to_chat};
pub use stream::{ChatStreamToMessages, MessagesStreamToChat};

use serde_json::{json, Value};

use super::stream::Usage;

/// A field of the caller's request that the target dialect cannot express: answered 400
/// naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct Unexpressible {
    /// A JSON path into the caller's body: `messages[2].content[0].type`, `n`.
    pub field: String,
    /// Why, in signalbox's words.
    pub reason: String,
}

impl Unexpressible {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The answer for a chat caller: `{"error":{"message","type","code","param"}}`.
    pub fn openai_body(&self) -> Vec<u8> {
        json!({"error": {
            "message": self.to_string(),
            "type": "invalid_request_error",
            "code": "unsupported_parameter",
            "param": self.field,
        }})
        .to_string()
        .into_bytes()
    }

    /// The answer for a messages caller: `{"type":"error","error":{"type","message"}}`.
    pub fn anthropic_body(&self) -> Vec<u8> {
        json!({"type": "error", "error": {
            "type": "invalid_request_error",
            "message": self.to_string(),
        }})
        .to_string()
        .into_bytes()
    }
}

/// A provider answer that cannot be translated: the caller gets signalbox's own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadUpstream {
    /// The body (or a stream event's data) is not JSON.
    #[error("the provider's answer is not JSON")]
    NotJson,
    /// A chat answer with `"choices": []` (an answer with nothing in it).
    #[error("the provider answered with no choices")]
    EmptyChoices,
    /// JSON, but not in the shape the dialect defines.
    #[error("the provider's answer is malformed: {0}")]
    Malformed(&'static str),
}

impl BadUpstream {
    /// A bounded label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            BadUpstream::NotJson => "not_json",
            BadUpstream::EmptyChoices => "empty_choices",
            BadUpstream::Malformed(_) => "malformed",
        }
    }
}

// === the shared vocabulary of both directions ===

/// An Anthropic `stop_reason` in chat's words.
fn finish_reason_for(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn (a server tool's turn, never requested), and
        // whatever Anthropic adds next: the answer ended normally.
        _ => "stop",
    }
}

/// A chat `finish_reason` in Anthropic's words.
fn stop_reason_for(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Anthropic's `usage` object read into [`Usage`] (cache tokens added into the prompt).
fn usage_from_anthropic(u: &Value) -> Option<Usage> {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    if !u.is_object() {
        return None;
    }
    let (read, write) = (
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
    );
    Some(Usage {
        prompt_tokens: n("input_tokens") + read + write,
        completion_tokens: n("output_tokens"),
        cache_read_tokens: read,
        cache_write_tokens: write,
    })
}

/// Chat's `usage` object read into [`Usage`].
fn usage_from_openai(u: &Value) -> Option<Usage> {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    if !u.is_object() {
        return None;
    }
    Some(Usage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
        cache_read_tokens: u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        cache_write_tokens: 0,
    })
}

/// [`Usage`] in chat's words.
fn openai_usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
    })
}

/// [`Usage`] in Anthropic's words (`input_tokens` without the cached ones).
fn anthropic_usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cache_read_tokens + u.cache_write_tokens),
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "output_tokens": u.completion_tokens,
    })
}

/// Seconds since the epoch, for chat's `created`.
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Anthropic's rule for tool ids (`^[a-zA-Z0-9_-]+$`): an id outside it cannot be carried
/// (rewriting it would break the pairing of calls and results).
fn is_anthropic_tool_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A `thinking_blocks` entry that came from Anthropic (it carries Anthropic's signature, or
/// its encrypted `data`), rebuilt from its known members only; anything else is dropped.
fn signed_thinking(block: Value) -> Option<Value> {
    let non_empty = |k: &str| {
        block
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    match block.get("type").and_then(Value::as_str)? {
        "thinking" => Some(json!({
            "type": "thinking",
            "thinking": block.get("thinking").and_then(Value::as_str).unwrap_or_default(),
            "signature": non_empty("signature")?,
        })),
        "redacted_thinking" => {
            Some(json!({"type": "redacted_thinking", "data": non_empty("data")?}))
        }
        _ => None,
    }
}

#[cfg(test)]
mod testing;
