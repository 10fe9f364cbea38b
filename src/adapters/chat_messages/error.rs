//! Provider errors in the caller's error shape.
//!
//! A provider's error (a refused request's body, or an error event inside a stream) is read
//! for its kind only — Anthropic's `error.type`, OpenAI's `error.code`/`type`, the status —
//! and answered in signalbox's own words: no provider text reaches the caller (the caller
//! contract in the README). One exception keeps clients working: a prompt too long for the
//! context window is said with each dialect's own marker (`context_length_exceeded`,
//! Anthropic's `prompt is too long`), which SDKs and agents look for.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};

use crate::adapters::stream::InbandError;

/// What went wrong, in words both dialects have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorKind {
    InvalidRequest,
    ContextLength,
    Authentication,
    Billing,
    Permission,
    NotFound,
    TooLarge,
    RateLimited,
    Overloaded,
    Timeout,
    Api,
}

impl ErrorKind {
    /// An Anthropic error body (or stream error event's data): `{"type":"error","error":{"type"}}`.
    pub(super) fn from_anthropic(status: u16, body: &[u8]) -> Self {
        let v: Value = serde_json::from_slice(body).unwrap_or_default();
        let error_type = v.pointer("/error/type").and_then(Value::as_str);
        let message = v.pointer("/error/message").and_then(Value::as_str);
        match error_type {
            Some("invalid_request_error") if message.is_some_and(is_anthropic_context_length) => {
                ErrorKind::ContextLength
            }
            Some("invalid_request_error") => ErrorKind::InvalidRequest,
            Some("authentication_error") => ErrorKind::Authentication,
            Some("billing_error") => ErrorKind::Billing,
            Some("permission_error") => ErrorKind::Permission,
            Some("not_found_error") => ErrorKind::NotFound,
            Some("request_too_large") => ErrorKind::TooLarge,
            Some("rate_limit_error") => ErrorKind::RateLimited,
            Some("overloaded_error") => ErrorKind::Overloaded,
            Some("timeout_error") => ErrorKind::Timeout,
            Some("api_error") => ErrorKind::Api,
            _ => Self::from_status(status),
        }
    }

    /// An OpenAI error body (or stream error event's data): `{"error":{"message","type","code"}}`.
    pub(super) fn from_openai(status: u16, body: &[u8]) -> Self {
        let v: Value = serde_json::from_slice(body).unwrap_or_default();
        let field = |k: &str| {
            v.get("error")
                .and_then(|e| e.get(k))
                .and_then(Value::as_str)
        };
        let message = field("message").unwrap_or_default();
        if field("code") == Some("context_length_exceeded")
            || message.contains("maximum context length")
        {
            return ErrorKind::ContextLength;
        }
        // A 413 is a request too large whatever its code says: OpenAI's TPM refusal of one
        // request comes as 413 with `code: rate_limit_exceeded`, and waiting cannot help it.
        if status == 413 {
            return ErrorKind::TooLarge;
        }
        match field("code").or(field("type")) {
            Some("insufficient_quota") => return ErrorKind::Billing,
            Some("rate_limit_exceeded" | "rate_limit_error" | "rate_limited") => {
                return ErrorKind::RateLimited
            }
            Some("server_is_overloaded" | "overloaded" | "slow_down") => {
                return ErrorKind::Overloaded
            }
            Some("invalid_api_key") => return ErrorKind::Authentication,
            Some("model_not_found") => return ErrorKind::NotFound,
            _ => {}
        }
        match status {
            // A stream's in-band error (answered 200): the type says who failed.
            200 => match field("type") {
                Some("invalid_request_error") => ErrorKind::InvalidRequest,
                _ => ErrorKind::Api,
            },
            _ => Self::from_status(status),
        }
    }

    fn from_status(status: u16) -> Self {
        match status {
            401 => ErrorKind::Authentication,
            402 => ErrorKind::Billing,
            403 => ErrorKind::Permission,
            404 => ErrorKind::NotFound,
            408 | 504 => ErrorKind::Timeout,
            413 => ErrorKind::TooLarge,
            // signalbox's own 424 (no usable credential) is the gateway's failing, not the
            // caller's.
            424 => ErrorKind::Api,
            429 => ErrorKind::RateLimited,
            503 | 529 => ErrorKind::Overloaded,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Api,
        }
    }

    /// Signalbox's sentence for it.
    fn message(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => {
                "the provider rejected the request as invalid; check the request parameters"
            }
            ErrorKind::ContextLength => "the prompt is longer than the model's context window",
            ErrorKind::Authentication => "the provider rejected the gateway's credential",
            ErrorKind::Billing => "the provider refused the request for billing reasons",
            ErrorKind::Permission => "the provider refused access to this model",
            ErrorKind::NotFound => "the provider does not know the requested model",
            ErrorKind::TooLarge => "the provider refused the request as too large",
            ErrorKind::RateLimited => "the provider is rate limiting requests; retry later",
            ErrorKind::Overloaded => "the provider is overloaded; retry later",
            ErrorKind::Timeout => "the provider timed out",
            ErrorKind::Api => "the provider failed to answer",
        }
    }

    /// OpenAI's `type` and `code`.
    fn openai(self) -> (&'static str, &'static str) {
        match self {
            // The caller's request was refused by the provider: DESIGN §6's code for it,
            // whichever provider kind refused it.
            ErrorKind::InvalidRequest => ("invalid_request_error", "all_candidates_rejected"),
            ErrorKind::ContextLength => ("invalid_request_error", "context_length_exceeded"),
            ErrorKind::Authentication => ("invalid_request_error", "invalid_api_key"),
            ErrorKind::Billing => ("insufficient_quota", "insufficient_quota"),
            ErrorKind::Permission => ("invalid_request_error", "permission_denied"),
            ErrorKind::NotFound => ("invalid_request_error", "model_not_found"),
            ErrorKind::TooLarge => ("invalid_request_error", "request_too_large"),
            ErrorKind::RateLimited => ("rate_limit_error", "rate_limit_exceeded"),
            ErrorKind::Overloaded => ("server_error", "server_is_overloaded"),
            ErrorKind::Timeout => ("server_error", "timeout"),
            ErrorKind::Api => ("server_error", "server_error"),
        }
    }

    /// Anthropic's `error.type`.
    fn anthropic_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Billing => "billing_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Overloaded => "overloaded_error",
            ErrorKind::Timeout => "timeout_error",
            ErrorKind::Api => "api_error",
        }
    }

    /// The message for an Anthropic caller: Anthropic's own marker for a prompt too long,
    /// which its clients look for.
    fn anthropic_message(self) -> &'static str {
        match self {
            ErrorKind::ContextLength => {
                "prompt is too long: the prompt is longer than the model's context window"
            }
            _ => self.message(),
        }
    }

    /// The stream-signal kind of an in-band error.
    pub(super) fn inband(self) -> InbandError {
        match self {
            ErrorKind::RateLimited | ErrorKind::Overloaded => InbandError::Overloaded,
            ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::TooLarge => {
                InbandError::InvalidRequest
            }
            _ => InbandError::Server,
        }
    }

    pub(super) fn openai_body(self) -> Vec<u8> {
        let (error_type, code) = self.openai();
        json!({"error": {"message": self.message(), "type": error_type, "code": code}})
            .to_string()
            .into_bytes()
    }

    pub(super) fn anthropic_body(self) -> Vec<u8> {
        anthropic_body(self.anthropic_type(), self.anthropic_message())
    }
}

/// Anthropic's phrasing of a prompt over the context window (`prompt is too long: 208310
/// tokens > 200000 maximum`).
fn is_anthropic_context_length(message: &str) -> bool {
    message.contains("prompt is too long") || message.contains("context window")
}

fn anthropic_body(error_type: &str, message: &str) -> Vec<u8> {
    json!({"type": "error", "error": {"type": error_type, "message": message}})
        .to_string()
        .into_bytes()
}

/// An Anthropic provider's error (its status and body) as the OpenAI error shape
/// `{"error":{"message","type","code"}}`, in signalbox's words.
pub fn anthropic_error_to_openai(status: u16, body: &[u8]) -> Vec<u8> {
    ErrorKind::from_anthropic(status, body).openai_body()
}

/// An OpenAI-kind provider's error (its status and body) as Anthropic's error shape
/// `{"type":"error","error":{"type","message"}}`, in signalbox's words.
pub fn openai_error_to_anthropic(status: u16, body: &[u8]) -> Vec<u8> {
    ErrorKind::from_openai(status, body).anthropic_body()
}

/// Signalbox's own error (the OpenAI-shaped body of a `GatewayError`) for a messages caller:
/// the message is signalbox's, so it is kept; the type follows the status, as Anthropic pairs
/// them (a 400 is always `invalid_request_error`, a 404 `not_found_error`).
pub fn gateway_error_to_anthropic(status: u16, body: &[u8], request_id: Option<&str>) -> Vec<u8> {
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map_or_else(
            || ErrorKind::from_openai(status, body).message().to_string(),
            str::to_string,
        );
    let error_type = crate::adapters::anthropic::error_type(status);
    match request_id {
        // Anthropic's shape names the request: `{"type":"error","error":{…},"request_id":…}`.
        Some(id) => json!({"type": "error", "error": {"type": error_type, "message": message}, "request_id": id})
            .to_string()
            .into_bytes(),
        None => anthropic_body(error_type, &message),
    }
}

/// The status to answer a chat caller for an Anthropic provider's status: Anthropic's 529
/// (overloaded) is not an HTTP status OpenAI clients know; 503 says the same.
pub fn openai_status_for_anthropic(status: u16) -> u16 {
    match status {
        529 => 503,
        s => s,
    }
}

/// The event signalbox writes into a messages caller's stream it must end abnormally (the
/// counterpart of `openai::sse_error_event`): `event: error` with Anthropic's error shape.
pub fn anthropic_sse_error_event(error_type: &str, message: &str) -> Bytes {
    let json = anthropic_body(error_type, message);
    let mut out = BytesMut::with_capacity(json.len() + 24);
    out.put_slice(b"event: error\ndata: ");
    out.put_slice(&json);
    out.put_slice(b"\n\n");
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::chat_messages::testing::{fixture, json};

    #[test]
    fn anthropic_errors_become_openai_errors_in_signalboxs_words() {
        for (status, body, error_type, code) in [
            (
                529,
                fixture!("anthropic", "error_overloaded.json"),
                "server_error",
                "server_is_overloaded",
            ),
            (
                429,
                fixture!("anthropic", "error_rate_limit.json"),
                "rate_limit_error",
                "rate_limit_exceeded",
            ),
            (
                500,
                fixture!("anthropic", "error_api.json"),
                "server_error",
                "server_error",
            ),
            (
                400,
                fixture!("anthropic", "error_invalid_request.json"),
                "invalid_request_error",
                "all_candidates_rejected",
            ),
            (
                400,
                fixture!("anthropic", "error_prompt_too_long.json"),
                "invalid_request_error",
                "context_length_exceeded",
            ),
            (
                401,
                fixture!("anthropic", "error_authentication.json"),
                "invalid_request_error",
                "invalid_api_key",
            ),
            (
                403,
                fixture!("anthropic", "error_permission.json"),
                "invalid_request_error",
                "permission_denied",
            ),
            (
                404,
                fixture!("anthropic", "error_not_found.json"),
                "invalid_request_error",
                "model_not_found",
            ),
            (
                413,
                fixture!("anthropic", "error_request_too_large.json"),
                "invalid_request_error",
                "request_too_large",
            ),
        ] {
            let out = json(&anthropic_error_to_openai(status, body));
            assert_eq!(
                out["error"]["type"], error_type,
                "{status} {error_type} {code}"
            );
            assert_eq!(out["error"]["code"], code, "{status} {error_type} {code}");
            let provider_text = json(body)["error"]["message"].clone();
            assert_ne!(
                out["error"]["message"], provider_text,
                "{status} {code}: provider text leaked"
            );
            assert!(out["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
        }
        // No body, or not JSON: the status decides.
        let out = json(&anthropic_error_to_openai(529, b"<html>"));
        assert_eq!(out["error"]["code"], "server_is_overloaded");
        assert_eq!(openai_status_for_anthropic(529), 503);
        assert_eq!(openai_status_for_anthropic(429), 429);
    }

    #[test]
    fn openai_errors_become_anthropic_errors_in_signalboxs_words() {
        for (status, body, error_type) in [
            (
                429,
                fixture!("openai", "error_rate_limit.json"),
                "rate_limit_error",
            ),
            (
                400,
                fixture!("openai", "error_context_length.json"),
                "invalid_request_error",
            ),
            (
                401,
                fixture!("openai", "error_invalid_api_key.json"),
                "authentication_error",
            ),
            (500, fixture!("openai", "error_server.json"), "api_error"),
            (
                429,
                fixture!("openai", "error_insufficient_quota.json"),
                "billing_error",
            ),
            (
                404,
                fixture!("openai", "error_model_not_found.json"),
                "not_found_error",
            ),
        ] {
            let out = json(&openai_error_to_anthropic(status, body));
            assert_eq!(out["type"], "error");
            assert_eq!(out["error"]["type"], error_type, "{status} {error_type}");
            assert_ne!(
                out["error"]["message"],
                json(body)["error"]["message"],
                "{status} {error_type}"
            );
        }
        let out = json(&openai_error_to_anthropic(
            400,
            fixture!("openai", "error_context_length.json"),
        ));
        assert!(out["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("prompt is too long")));
        for (status, error_type) in [
            (400, "invalid_request_error"),
            (403, "permission_error"),
            (413, "request_too_large"),
            (503, "overloaded_error"),
            (529, "overloaded_error"),
            (502, "api_error"),
            (504, "timeout_error"),
        ] {
            let out = json(&openai_error_to_anthropic(status, b""));
            assert_eq!(out["error"]["type"], error_type, "{status}");
        }
    }

    #[test]
    fn signalboxs_own_errors_keep_their_words_for_anthropic_callers() {
        let body = crate::error::error_json(
            "model \"nope\" is not in the catalog",
            "invalid_request_error",
            "model_not_found",
        );
        // The type follows the status (Anthropic pairs `not_found_error` with 404 only).
        let out = json(&gateway_error_to_anthropic(400, &body, None));
        assert_eq!(out["error"]["type"], "invalid_request_error");
        assert_eq!(
            out["error"]["message"],
            "model \"nope\" is not in the catalog"
        );
        let out = json(&gateway_error_to_anthropic(
            503,
            &crate::error::error_json(
                "every candidate is ejected",
                "server_error",
                "no_provider_available",
            ),
            Some("req-1"),
        ));
        assert_eq!(out["error"]["type"], "overloaded_error");
        assert_eq!(out["request_id"], "req-1");
    }

    #[test]
    fn stream_error_event_is_anthropic_sse() {
        let ev = anthropic_sse_error_event("api_error", "the stream broke");
        let text = std::str::from_utf8(&ev).expect("utf8");
        assert!(text.starts_with("event: error\ndata: {"));
        assert!(text.ends_with("}\n\n"));
        let data = json(text["event: error\ndata: ".len()..].trim_end().as_bytes());
        assert_eq!(data["error"]["type"], "api_error");
    }

    #[test]
    fn inband_kinds() {
        assert_eq!(ErrorKind::Overloaded.inband(), InbandError::Overloaded);
        assert_eq!(ErrorKind::RateLimited.inband(), InbandError::Overloaded);
        assert_eq!(
            ErrorKind::InvalidRequest.inband(),
            InbandError::InvalidRequest
        );
        assert_eq!(ErrorKind::Api.inband(), InbandError::Server);
        assert_eq!(
            ErrorKind::from_openai(200, br#"{"error":{"message":"x","type":"server_error"}}"#),
            ErrorKind::Api
        );
        assert_eq!(
            ErrorKind::from_openai(
                200,
                br#"{"error":{"message":"x","type":"invalid_request_error"}}"#
            ),
            ErrorKind::InvalidRequest
        );
    }
}
