//! Errors by phase: startup (before any socket is bound) and request (what a caller sees).
//!
//! A request error is always answered in the OpenAI shape
//! `{"error":{"message","type","code"}}` in signalbox's own words: the message is a static
//! sentence or one built from config names, never upstream text, a base URL or a key. The
//! `code` strings are part of the caller contract (the README lists them) and double as
//! metric-safe labels.

use std::borrow::Cow;

use bytes::Bytes;

/// Failures that stop the gateway from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("invalid configuration:\n{0}")]
    Config(#[from] crate::config::ConfigErrors),
    #[error("{0}")]
    Catalog(#[from] crate::catalog::CatalogError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("{0}")]
    State(String),
}

/// The stable error codes of the caller contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    ModelNotFound,
    ChainEmpty,
    NotFound,
    MethodNotAllowed,
    RequestTooLarge,
    /// The request's estimated tokens alone exceed the key's (or every candidate's) `tpm`:
    /// waiting cannot help.
    TokensExceedLimit,
    HeadersTooLarge,
    /// The request is not HTTP signalbox can read: a malformed head, ambiguous framing, a
    /// broken chunked body (the edge, `crate::edge`).
    InvalidHttp,
    /// The request target is longer than the edge reads.
    UriTooLong,
    /// A transfer coding other than `chunked` (RFC 9112 §6.1: 501).
    UnsupportedTransferCoding,
    /// The request's head or body did not arrive within `limits.header_timeout` /
    /// `limits.body_timeout`.
    RequestTimeout,
    NoProviderAvailable,
    RateLimited,
    ProviderNotConfigured,
    ProviderCredentialRejected,
    AllCandidatesRejected,
    ContextLengthExceeded,
    /// A field of the request the serving provider's dialect cannot express.
    UnsupportedParameter,
    /// No key, or not one of the configured client keys.
    InvalidApiKey,
    /// The caller's key may not use the name it sent.
    ModelNotAllowed,
    /// The caller's key (or every candidate) is over its budget.
    BudgetExceeded,
    /// No candidate's provider kind serves the endpoint called (token counting on a model only
    /// OpenAI-kind providers serve): a property of the config, not an outage.
    EndpointNotSupported,
    UpstreamModelNotFound,
    UpstreamError,
    UpstreamTimeout,
    Internal,
    /// A blocking guardrail flagged the request's input (DESIGN §10).
    GuardrailBlocked,
    /// A blocking guardrail could not run (`on_unavailable: block`).
    GuardrailUnavailable,
    /// `x-llm-guardrails` names no configured profile, or a mode other than `block`/`monitor`.
    GuardrailNotFound,
    /// A recommendation request without a non-empty `candidates` list.
    CandidatesRequired,
    /// A recommendation request without a `task`.
    TaskRequired,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::ModelNotFound => "model_not_found",
            ErrorCode::ChainEmpty => "chain_empty",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::TokensExceedLimit => "tokens_exceed_limit",
            ErrorCode::HeadersTooLarge => "request_headers_too_large",
            ErrorCode::InvalidHttp => "invalid_http",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::UnsupportedTransferCoding => "unsupported_transfer_coding",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::NoProviderAvailable => "no_provider_available",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::ProviderNotConfigured => "provider_not_configured",
            ErrorCode::ProviderCredentialRejected => "provider_credential_rejected",
            ErrorCode::AllCandidatesRejected => "all_candidates_rejected",
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::UnsupportedParameter => "unsupported_parameter",
            ErrorCode::InvalidApiKey => "invalid_api_key",
            ErrorCode::ModelNotAllowed => "model_not_allowed",
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::EndpointNotSupported => "endpoint_not_supported",
            ErrorCode::UpstreamModelNotFound => "upstream_model_not_found",
            ErrorCode::UpstreamError => "upstream_error",
            ErrorCode::UpstreamTimeout => "upstream_timeout",
            ErrorCode::Internal => "internal_error",
            ErrorCode::GuardrailBlocked => "guardrail_blocked",
            ErrorCode::GuardrailUnavailable => "guardrail_unavailable",
            ErrorCode::GuardrailNotFound => "guardrail_not_found",
            ErrorCode::CandidatesRequired => "candidates_required",
            ErrorCode::TaskRequired => "task_required",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest
            | ErrorCode::ModelNotFound
            | ErrorCode::ChainEmpty
            | ErrorCode::AllCandidatesRejected
            | ErrorCode::ContextLengthExceeded
            | ErrorCode::UnsupportedParameter
            | ErrorCode::EndpointNotSupported
            | ErrorCode::InvalidHttp
            | ErrorCode::GuardrailBlocked
            | ErrorCode::GuardrailNotFound
            | ErrorCode::CandidatesRequired
            | ErrorCode::TaskRequired => 400,
            ErrorCode::InvalidApiKey => 401,
            ErrorCode::ModelNotAllowed => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::UriTooLong => 414,
            ErrorCode::RequestTooLarge | ErrorCode::TokensExceedLimit => 413,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::RateLimited | ErrorCode::BudgetExceeded => 429,
            ErrorCode::ProviderNotConfigured | ErrorCode::ProviderCredentialRejected => 424,
            ErrorCode::UpstreamModelNotFound | ErrorCode::UpstreamError => 502,
            ErrorCode::NoProviderAvailable | ErrorCode::GuardrailUnavailable => 503,
            ErrorCode::UpstreamTimeout => 504,
            ErrorCode::Internal => 500,
            ErrorCode::UnsupportedTransferCoding => 501,
        }
    }

    /// Whether the caller's HTTP itself was refused (its head, framing or pace): such an
    /// answer is counted in `http_refusals_total`, not as a request, so a 501 for a transfer
    /// coding is never a 5xx.
    pub fn is_http_refusal(self) -> bool {
        matches!(
            self,
            ErrorCode::InvalidHttp | ErrorCode::UriTooLong | ErrorCode::UnsupportedTransferCoding
        )
    }

    /// The OpenAI `type` field.
    pub fn error_type(self) -> &'static str {
        if self == ErrorCode::UnsupportedTransferCoding {
            return "invalid_request_error";
        }
        match self.status() {
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }
}

/// An error answered to the caller by signalbox itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayError {
    pub code: ErrorCode,
    pub status: u16,
    pub message: Cow<'static, str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// Why candidates were skipped, by reason (a `no_provider_available` answer): reason
    /// names and counts, never a provider.
    pub skipped: Vec<(&'static str, u16)>,
}

impl GatewayError {
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            status: code.status(),
            message: message.into(),
            retry_after: None,
            skipped: Vec::new(),
        }
    }

    /// Keep the code but answer with another status (an upstream 4xx relayed as such).
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub fn with_retry_after(mut self, secs: Option<u64>) -> Self {
        self.retry_after = secs;
        self
    }

    /// Say why candidates were skipped (reason names and counts), in the message too.
    pub fn with_skipped(mut self, skipped: Vec<(&'static str, u16)>) -> Self {
        if !skipped.is_empty() {
            let reasons: Vec<String> = skipped.iter().map(|(r, n)| format!("{n} {r}")).collect();
            self.message = format!("{} (skipped: {})", self.message, reasons.join(", ")).into();
        }
        self.skipped = skipped;
        self
    }

    /// The JSON body: the OpenAI error shape, with the skip reasons under `error.skipped`
    /// when there are any.
    pub fn body(&self) -> Bytes {
        if self.skipped.is_empty() {
            return error_json(&self.message, self.code.error_type(), self.code.as_str());
        }
        let skipped: serde_json::Map<String, serde_json::Value> = self
            .skipped
            .iter()
            .map(|(r, n)| ((*r).to_string(), serde_json::Value::from(*n)))
            .collect();
        let v = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.code.error_type(),
                "param": null,
                "code": self.code.as_str(),
                "skipped": skipped,
            }
        });
        Bytes::from(v.to_string())
    }
}

/// `{"error":{"message":…,"type":…,"param":null,"code":…}}`.
pub fn error_json(message: &str, error_type: &str, code: &str) -> Bytes {
    let v = serde_json::json!({
        "error": { "message": message, "type": error_type, "param": null, "code": code }
    });
    Bytes::from(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let e = GatewayError::new(ErrorCode::ChainEmpty, "chain \"x\" lists no usable model");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).expect("json");
        assert_eq!(v["error"]["code"], "chain_empty");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(e.status, 400);
        assert_eq!(ErrorCode::NoProviderAvailable.status(), 503);
        assert_eq!(ErrorCode::UpstreamTimeout.error_type(), "server_error");
    }
}
