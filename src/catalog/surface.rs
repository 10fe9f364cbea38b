//! The endpoints of the API ([`Surface`]): the ones callers reach and the ones an attempt
//! calls under a provider's base URL are the same six, so one type names both. Here too: the
//! dialect each speaks, and how a provider of each kind serves it ([`Conversion`]).
//!
//! One failover loop serves every surface: the surface decides which providers can take the
//! request (a candidate whose provider kind cannot serve it is skipped, reason `endpoint`),
//! which upstream endpoint an attempt calls ([`Surface::endpoint`], its path prepared per
//! provider by the catalog), and in which dialect errors and streams reach the caller.

use crate::config::ProviderKind;

/// The two API dialects signalbox speaks, to callers and to providers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI's (`Authorization: Bearer`, `{"error": {...}}`, `data: [DONE]`).
    OpenAi,
    /// Anthropic's Messages API (`x-api-key`, `{"type":"error",...}`, `event: message_stop`).
    Anthropic,
}

/// An endpoint: one a caller calls, or one an attempt calls on a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Surface {
    /// `POST /v1/chat/completions`.
    #[default]
    ChatCompletions,
    /// `POST /v1/completions` (legacy text completions).
    Completions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic).
    CountTokens,
}

/// How an attempt on a provider of some kind serves a surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// The same dialect: only the model and the credentials change (the fast path).
    Same,
    /// A Chat Completions caller, an Anthropic provider: the request goes out as Messages and
    /// the answer comes back as Chat Completions.
    ChatToMessages,
    /// A Messages caller, an OpenAI-kind provider: the reverse.
    MessagesToChat,
}

impl Surface {
    /// Every endpoint, in the order of [`Surface::index`].
    pub const ALL: [Surface; 6] = [
        Surface::ChatCompletions,
        Surface::Completions,
        Surface::Responses,
        Surface::Embeddings,
        Surface::Messages,
        Surface::CountTokens,
    ];

    /// The position in [`Surface::ALL`] (per-endpoint tables, such as a provider's URIs).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The surface a request path names (with or without the `/v1` prefix).
    pub fn from_path(path: &str) -> Option<Surface> {
        let path = path.strip_prefix("/v1").unwrap_or(path);
        Some(match path {
            "/chat/completions" => Surface::ChatCompletions,
            "/completions" => Surface::Completions,
            "/responses" => Surface::Responses,
            "/embeddings" => Surface::Embeddings,
            "/messages" => Surface::Messages,
            "/messages/count_tokens" => Surface::CountTokens,
            _ => return None,
        })
    }

    /// The dialect the caller speaks on this surface.
    pub fn dialect(self) -> Dialect {
        match self {
            Surface::Messages | Surface::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    /// How a provider of `kind` serves this surface, if it can.
    pub fn served_by(self, kind: ProviderKind) -> Option<Conversion> {
        use Conversion::{ChatToMessages, MessagesToChat, Same};
        match (self, kind) {
            (
                Surface::ChatCompletions
                | Surface::Completions
                | Surface::Responses
                | Surface::Embeddings,
                ProviderKind::OpenAi,
            )
            | (Surface::Messages | Surface::CountTokens, ProviderKind::Anthropic) => Some(Same),
            (Surface::ChatCompletions, ProviderKind::Anthropic) => Some(ChatToMessages),
            (Surface::Messages, ProviderKind::OpenAi) => Some(MessagesToChat),
            // No faithful translation (legacy completions, embeddings, the Responses API to
            // Anthropic; token counting to OpenAI, which has no such endpoint).
            _ => None,
        }
    }

    /// The upstream endpoint an attempt on this surface calls on a provider of `kind`.
    pub fn endpoint(self, kind: ProviderKind) -> Surface {
        match (self, kind) {
            (Surface::ChatCompletions, ProviderKind::Anthropic) => Surface::Messages,
            (Surface::Messages, ProviderKind::OpenAi) => Surface::ChatCompletions,
            (same, _) => same,
        }
    }

    /// Whether requests on this surface may ask for a stream.
    pub fn streams(self) -> bool {
        !matches!(self, Surface::Embeddings | Surface::CountTokens)
    }

    /// The path under a provider's base URL (which carries its own `/v1`, or whatever the
    /// provider puts there).
    pub fn upstream_path(self) -> &'static str {
        match self {
            Surface::ChatCompletions => "/chat/completions",
            Surface::Completions => "/completions",
            Surface::Responses => "/responses",
            Surface::Embeddings => "/embeddings",
            Surface::Messages => "/messages",
            Surface::CountTokens => "/messages/count_tokens",
        }
    }

    /// The caller-facing path of this surface.
    pub fn endpoint_path(self) -> &'static str {
        match self {
            Surface::ChatCompletions => "/v1/chat/completions",
            Surface::Completions => "/v1/completions",
            Surface::Responses => "/v1/responses",
            Surface::Embeddings => "/v1/embeddings",
            Surface::Messages => "/v1/messages",
            Surface::CountTokens => "/v1/messages/count_tokens",
        }
    }

    /// The name conditions match `params.endpoint` against (the API's own names).
    pub fn rule_name(self) -> &'static str {
        match self {
            Surface::ChatCompletions => "chat.completions",
            Surface::Completions => "completions",
            Surface::Responses => "responses",
            Surface::Embeddings => "embeddings",
            Surface::Messages => "messages",
            Surface::CountTokens => "messages.count_tokens",
        }
    }

    /// The stable name (explain, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::ChatCompletions => "chat_completions",
            Surface::Completions => "completions",
            Surface::Responses => "responses",
            Surface::Embeddings => "embeddings",
            Surface::Messages => "messages",
            Surface::CountTokens => "count_tokens",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_surfaces_with_or_without_v1() {
        assert_eq!(
            Surface::from_path("/v1/chat/completions"),
            Some(Surface::ChatCompletions)
        );
        assert_eq!(
            Surface::from_path("/chat/completions"),
            Some(Surface::ChatCompletions)
        );
        assert_eq!(
            Surface::from_path("/v1/messages/count_tokens"),
            Some(Surface::CountTokens)
        );
        assert_eq!(Surface::from_path("/v1/models"), None);
        assert_eq!(Surface::from_path("/v1/chat/completions/x"), None);
    }

    #[test]
    fn each_surface_is_served_by_the_kinds_that_can_express_it() {
        use ProviderKind::{Anthropic, OpenAi};
        assert_eq!(
            Surface::ChatCompletions.served_by(Anthropic),
            Some(Conversion::ChatToMessages)
        );
        assert_eq!(
            Surface::Messages.served_by(OpenAi),
            Some(Conversion::MessagesToChat)
        );
        assert_eq!(Surface::Embeddings.served_by(Anthropic), None);
        assert_eq!(Surface::CountTokens.served_by(OpenAi), None);
        assert_eq!(
            Surface::ChatCompletions.endpoint(Anthropic),
            Surface::Messages
        );
        assert_eq!(Surface::Messages.endpoint(OpenAi), Surface::ChatCompletions);
        for s in Surface::ALL {
            for k in [OpenAi, Anthropic] {
                if s.served_by(k) == Some(Conversion::Same) {
                    assert_eq!(s.dialect() == Dialect::Anthropic, k == Anthropic);
                }
            }
        }
    }

    #[test]
    fn an_attempt_calls_its_own_endpoint_unless_translated() {
        use ProviderKind::{Anthropic, OpenAi};
        for (i, s) in Surface::ALL.into_iter().enumerate() {
            assert_eq!(s.index(), i);
            for k in [OpenAi, Anthropic] {
                let expected = match s.served_by(k) {
                    Some(Conversion::ChatToMessages) => Surface::Messages,
                    Some(Conversion::MessagesToChat) => Surface::ChatCompletions,
                    Some(Conversion::Same) | None => s,
                };
                assert_eq!(s.endpoint(k), expected, "{s:?} on {k:?}");
            }
            // A provider's base URL carries the `/v1` a caller's path has.
            assert_eq!(format!("/v1{}", s.upstream_path()), s.endpoint_path());
        }
    }
}
