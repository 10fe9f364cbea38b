//! What every dialect's response reports in the same words: token usage, and what a stream
//! has shown so far ([`Signals`]) — the facts the first-chunk hold, the stream contract, health
//! and metrics act on, whatever dialect the provider or the caller speaks.

use serde::Deserialize;

/// Token usage a provider reported, in every OpenAI-kind shape: Chat Completions,
/// completions and embeddings name `prompt_tokens` / `completion_tokens` (with
/// `prompt_tokens_details.cached_tokens`), the Responses API `input_tokens` / `output_tokens`
/// (with `input_tokens_details.cached_tokens`). Anthropic's `input_tokens` / `output_tokens` /
/// `cache_read_input_tokens` / `cache_creation_input_tokens` are mapped here by its adapter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "WireUsage")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens served from the provider's prompt cache (included in `prompt_tokens`
    /// for OpenAI; Anthropic reports them apart and its adapter adds them in).
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache (Anthropic).
    pub cache_write_tokens: u64,
}

/// The usage object as OpenAI-kind providers write it, either API's names.
#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_tokens_details: Option<WireDetails>,
    input_tokens_details: Option<WireDetails>,
}

#[derive(Deserialize)]
struct WireDetails {
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(w: WireUsage) -> Self {
        let cached = w
            .prompt_tokens_details
            .or(w.input_tokens_details)
            .and_then(|d| d.cached_tokens);
        Usage {
            prompt_tokens: w.prompt_tokens.or(w.input_tokens).unwrap_or(0),
            completion_tokens: w.completion_tokens.or(w.output_tokens).unwrap_or(0),
            cache_read_tokens: cached.unwrap_or(0),
            cache_write_tokens: 0,
        }
    }
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
