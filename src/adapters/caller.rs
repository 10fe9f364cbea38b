//! The caller's request in whichever dialect its surface speaks ([`CallerRequest`]): what
//! routing reads from it (model, stream, overrides, needs, size), and the body each attempt
//! sends — the same bytes with only the model rewritten on same-dialect traffic, a translation
//! when the provider speaks the other dialect.

use std::borrow::Cow;

use bytes::Bytes;

use super::anthropic::{CountTokensRequest, MessagesRequest};
use super::chat_messages::{
    chat_request_to_messages, messages_request_to_chat, ToChat, ToMessages, Unexpressible,
};
use super::estimate::Estimate;
use super::facts::{Complexity, Needs, RoutingOverride};
use super::openai::ChatRequest;
use super::tokenizer::Encoding;
use crate::catalog::surface::{Conversion, Surface};

/// The `max_tokens` a chat request translated for Anthropic gets when the caller set none
/// (Anthropic requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A caller's request, scanned once.
#[derive(Debug, Clone)]
pub enum CallerRequest {
    /// Chat Completions, legacy Completions, Responses, Embeddings: the OpenAI dialect.
    OpenAi(ChatRequest),
    /// Anthropic Messages.
    Messages(MessagesRequest),
    /// Anthropic token counting.
    CountTokens(CountTokensRequest),
}

impl CallerRequest {
    /// Read a body sent to `surface`; the error is the message for a 400.
    pub fn parse(surface: Surface, body: Bytes) -> Result<Self, Cow<'static, str>> {
        match surface {
            Surface::Messages => MessagesRequest::parse(body)
                .map(Self::Messages)
                .map_err(|e| e.message()),
            Surface::CountTokens => CountTokensRequest::parse(body)
                .map(Self::CountTokens)
                .map_err(|e| e.message()),
            _ => ChatRequest::parse(body)
                .map(Self::OpenAi)
                .map_err(|e| e.message()),
        }
    }

    /// The model name the caller sent (decoded).
    pub fn model_name(&self) -> Cow<'_, str> {
        match self {
            Self::OpenAi(r) => r.model_name(),
            Self::Messages(r) => r.model_name(),
            Self::CountTokens(r) => r.model_name(),
        }
    }

    /// The model value exactly as the caller wrote it, quotes included.
    pub fn model_literal(&self) -> Bytes {
        match self {
            Self::OpenAi(r) => r.model_literal(),
            Self::Messages(r) => r.model_literal(),
            Self::CountTokens(r) => r.model_literal(),
        }
    }

    pub fn stream(&self) -> bool {
        match self {
            Self::OpenAi(r) => r.stream,
            Self::Messages(r) => r.stream,
            Self::CountTokens(_) => false,
        }
    }

    /// The body's `routing` member.
    pub fn routing(&self) -> Option<&RoutingOverride> {
        match self {
            Self::OpenAi(r) => r.routing.as_ref(),
            Self::Messages(r) => r.routing.as_ref(),
            Self::CountTokens(r) => r.routing.as_ref(),
        }
    }

    /// The output limit the caller set.
    pub fn max_tokens(&self) -> Option<u64> {
        match self {
            Self::OpenAi(r) => r.max_tokens,
            Self::Messages(r) => Some(r.max_tokens),
            // Nothing is generated.
            Self::CountTokens(_) => Some(0),
        }
    }

    /// What the request needs from a model (whether it carries an image is looked for when
    /// first asked).
    pub fn needs(&self) -> Needs {
        match self {
            Self::OpenAi(r) => r.needs(),
            Self::Messages(r) => r.needs(),
            Self::CountTokens(_) => Needs::default(),
        }
    }

    /// [`Self::needs`] without looking for images (`vision` false): for a plan whose
    /// candidates declare no capabilities, where needs are never compared.
    pub fn needs_but_vision(&self) -> Needs {
        match self {
            Self::OpenAi(r) => r.needs_but_vision(),
            Self::Messages(r) => r.needs_but_vision(),
            Self::CountTokens(_) => Needs::default(),
        }
    }

    /// The prompt's estimated tokens in the caller's own dialect (images by its formula).
    pub fn prompt_tokens(&self) -> u64 {
        match self {
            Self::OpenAi(r) => r.prompt_tokens(),
            Self::Messages(r) => r.prompt_tokens(),
            Self::CountTokens(r) => r.prompt_tokens(),
        }
    }

    /// The prompt estimated from what it says (see [`super::estimate`]).
    pub fn estimate(&self) -> Estimate {
        match self {
            Self::OpenAi(r) => r.estimate(),
            Self::Messages(r) => r.estimate(),
            Self::CountTokens(r) => r.estimate(),
        }
    }

    /// The prompt counted exactly in an OpenAI encoding, images by formula (once per request
    /// and encoding); `None` where no exact count is made (token counting, or an encoding that
    /// could not be loaded).
    pub fn exact_tokens(&self, encoding: Encoding) -> Option<u64> {
        match self {
            Self::OpenAi(r) => r.exact_tokens(encoding),
            Self::Messages(r) => r.exact_tokens(encoding),
            Self::CountTokens(_) => None,
        }
    }

    pub fn complexity(&self) -> Complexity {
        match self {
            Self::OpenAi(r) => r.complexity(),
            Self::Messages(r) => r.complexity(),
            Self::CountTokens(_) => Complexity::Simple,
        }
    }

    /// What prefix affinity hashes.
    pub fn prompt(&self) -> &[u8] {
        match self {
            Self::OpenAi(r) => r.prompt(),
            Self::Messages(r) => r.prompt(),
            Self::CountTokens(_) => &[],
        }
    }

    /// Whether the caller's stream must carry usage: Anthropic streams always do; a chat
    /// caller asks with `stream_options.include_usage`.
    pub fn caller_wants_stream_usage(&self) -> bool {
        match self {
            Self::OpenAi(r) => r.asks_stream_usage(),
            Self::Messages(_) | Self::CountTokens(_) => true,
        }
    }

    /// Whether signalbox asks an OpenAI-kind provider for stream usage on the caller's behalf
    /// (and strips it from the caller's stream: see [`Self::caller_wants_stream_usage`]).
    pub fn adds_stream_usage(&self, surface: Surface) -> bool {
        match self {
            Self::OpenAi(r) => {
                matches!(surface, Surface::ChatCompletions | Surface::Completions)
                    && r.may_add_stream_usage()
            }
            _ => false,
        }
    }

    /// The body for one attempt on a deployment named `upstream_model` (and
    /// `upstream_model_json`, its JSON literal), as `conversion` serves it.
    pub fn body_for(
        &self,
        surface: Surface,
        conversion: Conversion,
        upstream_model: &str,
        upstream_model_json: &[u8],
    ) -> Result<Bytes, Unexpressible> {
        match (self, conversion) {
            (Self::OpenAi(r), Conversion::Same) => {
                Ok(r.body_for_upstream(upstream_model_json, self.adds_stream_usage(surface)))
            }
            (Self::Messages(r), Conversion::Same) => Ok(r.body_for(upstream_model_json)),
            (Self::CountTokens(r), _) => Ok(r.body_for(upstream_model_json)),
            (Self::OpenAi(r), _) => {
                // Translation reads the body without `routing` (signalbox's own member).
                let body = r.body_for(upstream_model_json);
                chat_request_to_messages(
                    &body,
                    &ToMessages {
                        upstream_model,
                        default_max_tokens: DEFAULT_MAX_TOKENS,
                    },
                )
                .map(Bytes::from)
            }
            (Self::Messages(r), _) => {
                let body = r.body_for(upstream_model_json);
                messages_request_to_chat(
                    &body,
                    &ToChat {
                        upstream_model,
                        stream_usage: true,
                    },
                )
                .map(Bytes::from)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_surface_reads_its_own_dialect() {
        let chat = CallerRequest::parse(
            Surface::ChatCompletions,
            Bytes::from_static(br#"{"model":"a","stream":true,"messages":[]}"#),
        )
        .expect("chat");
        assert!(chat.stream() && !chat.caller_wants_stream_usage());
        assert!(chat.adds_stream_usage(Surface::ChatCompletions));
        assert!(!chat.adds_stream_usage(Surface::Responses));
        let missing_max = CallerRequest::parse(
            Surface::Messages,
            Bytes::from_static(br#"{"model":"a","messages":[]}"#),
        );
        assert!(missing_max.is_err(), "Messages requires max_tokens");
        let m = CallerRequest::parse(
            Surface::Messages,
            Bytes::from_static(
                br#"{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
        )
        .expect("messages");
        assert_eq!(m.max_tokens(), Some(10));
        assert_eq!(m.model_name(), "claude");
        // Translated for an OpenAI-kind provider: the upstream model, chat's shape.
        let body = m
            .body_for(
                Surface::Messages,
                Conversion::MessagesToChat,
                "gpt-4o",
                br#""gpt-4o""#,
            )
            .expect("expressible");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["model"], "gpt-4o");
        assert_eq!(v["messages"][0]["content"], "hi");
        assert_eq!(v["max_completion_tokens"], 10);
    }

    #[test]
    fn a_field_the_provider_cannot_express_is_named() {
        let chat = CallerRequest::parse(
            Surface::ChatCompletions,
            Bytes::from_static(
                br#"{"model":"a","n":2,"messages":[{"role":"user","content":"x"}]}"#,
            ),
        )
        .expect("chat");
        let err = chat
            .body_for(
                Surface::ChatCompletions,
                Conversion::ChatToMessages,
                "claude",
                br#""claude""#,
            )
            .expect_err("n > 1");
        assert_eq!(err.field, "n");
    }
}
