//! Provider dialects as pure transforms over bytes: no I/O, no knowledge of Pingora.
//!
//! - `json`: the strict scanner every dialect reads requests with.
//! - `openai`: the OpenAI chat-completions dialect (requests, responses, streams).
//! - `stream`: what any dialect's response reports in common words (usage, stream signals).
//! - `surface`: the endpoints callers reach, their dialect, and which providers serve them.

pub mod json;
pub mod openai;
pub mod stream;
pub mod surface;
