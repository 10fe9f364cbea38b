//! Provider dialects as pure transforms over bytes: no I/O, no knowledge of Pingora. The
//! endpoints and the dialect each speaks are the catalog's (`catalog::surface`).
//!
//! - `json`: the strict scanner every dialect reads requests with.
//! - `envelope`: what every dialect's request body is scanned for first (model, `routing`,
//!   `messages`), the refusals they share, and the body each attempt sends.
//! - `facts`: what routing reads from any request (needs, complexity, `routing` overrides).
//! - `estimate`: a prompt's tokens from what it says (text characters, images by formula);
//!   `tokenizer`: the exact count with OpenAI's encodings, near a limit.
//! - `openai`: the OpenAI chat-completions dialect (requests, responses, streams).
//! - `anthropic`: the Anthropic Messages dialect, same-dialect fast path (requests, responses,
//!   streams, errors in Anthropic's shape).
//! - `chat_messages`: translation between the chat and Messages dialects, both directions
//!   (requests, responses, streams, errors), for a caller whose dialect the provider lacks.
//! - `caller`: the caller's request in its surface's dialect, and the body each attempt sends.
//! - `relay`: a provider's answer on its way to the caller, same dialect or translated.
//! - `stream`: what any dialect's response reports in common words (usage, stream signals).
//! - `input`: the caller's own text in a request (user and system turns), for guardrails;
//!   its last user turn and task (`params.task`), for knn and conditions.
//! - `agent`: the client a request came from, by its `user-agent` (`params.agent`).

pub mod agent;
pub mod anthropic;
pub mod caller;
pub mod chat_messages;
pub mod cost;
pub mod envelope;
pub mod estimate;
pub mod facts;
pub mod input;
pub mod json;
pub mod openai;
pub mod relay;
pub mod stream;
pub mod tokenizer;
