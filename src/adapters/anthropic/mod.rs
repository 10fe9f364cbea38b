//! The Anthropic Messages dialect for same-dialect traffic: an Anthropic-SDK caller served by an
//! Anthropic-kind provider. This is the fast path — the request is forwarded as received with
//! only `model` (and credentials, which the proxy owns) rewritten and `routing` stripped, and the
//! response comes back as the provider wrote it with the caller's model name restored.
//! Translation between dialects is not here (`chat_messages`).
//!
//! Pure transforms over bytes, no I/O, no Pingora, as [`openai`](super::openai):
//!
//! - [`request`]: reading `/v1/messages` and `/v1/messages/count_tokens` bodies with the strict
//!   scanner ([`MessagesRequest`], [`CountTokensRequest`]), and the body for each attempt.
//! - [`response`]: the response rewriter ([`AnthropicRewriter`]): `model` in a JSON message or in
//!   a stream's `message_start`, and the [`Signals`](super::stream::Signals) the stream shows
//!   (content, `message_stop`, `event: error`, usage with the cache counts folded in).
//! - [`respond`]: what signalbox writes itself — errors in Anthropic's shape, the terminal
//!   `event: error` of a broken stream, relayed refusals (with Anthropic's context-length
//!   wording recognised), and `GET /v1/models`.
//!
//! The vocabulary is shared with Chat Completions: the body's envelope (its scan, the
//! [`RequestBodyError`](super::envelope::RequestBodyError) refusals and the body rewrite) is
//! [`envelope`](super::envelope)'s, and what routing reads —
//! [`RoutingOverride`](super::facts::RoutingOverride), [`Needs`](super::facts::Needs),
//! [`Complexity`](super::facts::Complexity) — is [`facts`](super::facts)'.

/// The Anthropic API version signalbox writes translated requests (and health probes) for, and
/// sends when an Anthropic caller named none.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

pub mod request;
pub mod respond;
pub mod response;

pub use request::{CountTokensRequest, MessagesBodyError, MessagesRequest};
pub use respond::{
    error_body, error_type, is_context_length_error, model_object, models_list, refusal_body,
    sse_error_event, ModelEntry, Page,
};
pub use response::{AnthropicRewriter, MAX_LINE};
