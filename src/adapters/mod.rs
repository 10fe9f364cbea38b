//! Provider dialects as pure transforms over bytes. Only the OpenAI chat-completions
//! dialect exists so far; `json` is the scanner the dialects share.

pub mod json;
pub mod openai;
