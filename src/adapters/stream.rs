//! What every dialect's response reports in the same words: token usage, and what a stream
//! has shown so far ([`Signals`]) — the facts the first-chunk hold, the stream contract, health
//! and metrics act on, whatever dialect the provider or the caller speaks.

use serde::Deserialize;

/// Token usage a provider reported. OpenAI names: `prompt_tokens`, `completion_tokens`;
/// Anthropic's `input_tokens` / `output_tokens` / `cache_read_input_tokens` /
/// `cache_creation_input_tokens` are mapped here by its adapter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    /// Prompt tokens served from the provider's prompt cache (included in `prompt_tokens`
    /// for OpenAI; Anthropic reports them apart and its adapter adds them in).
    #[serde(skip)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache (Anthropic).
    #[serde(skip)]
    pub cache_write_tokens: u64,
}

/// An error the provider sent inside a stream it had answered 200 (OpenAI: a `data:` event
/// with an `error` member; Anthropic: `event: error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InbandError {
    /// Overloaded or rate limited (Anthropic `overloaded_error`, `rate_limit_error`; OpenAI
    /// `rate_limit_exceeded`, `server_is_overloaded`): another target may serve.
    Overloaded,
    /// The provider failed (`api_error`, `server_error`, anything unrecognised).
    Server,
    /// The request itself was refused (`invalid_request_error`): another target would refuse
    /// it too.
    InvalidRequest,
}

/// What a response stream has shown so far; a stream adapter updates it as events pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// A content-bearing event passed: a text delta, a tool call (its name or an argument
    /// delta), a thinking delta. For the first-chunk hold this is the commit point: an event
    /// before it (a role-only chunk, `message_start`, a ping) is not yet an answer.
    pub content: bool,
    /// The stream's terminal event passed (OpenAI `data: [DONE]`; Anthropic `message_stop`).
    pub terminal: bool,
    /// The provider's own error event, if one passed.
    pub error: Option<InbandError>,
    /// A Chat Completions chunk or body with `"choices": []` and no usage (an answer with
    /// nothing in it).
    pub empty_choices: bool,
    /// The latest usage figures reported.
    pub usage: Option<Usage>,
}
