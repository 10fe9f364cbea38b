//! The attempt vocabulary: how an upstream call ended ([`Outcome`]), where the plan looks next
//! ([`Advance`]), why no call could be made ([`NoCall`]), how transport errors are classified,
//! and what the caller is told when every attempt failed ([`FailureLog::final_error`]).
//! Health, the plan, metrics and the ledger speak these words; what an attempt's outcome *is*
//! is decided in [`super::verdict`].

use std::time::{Duration, SystemTime};

use pingora_error::{Error, ErrorType};

use crate::error::{ErrorCode, GatewayError};

/// How one upstream call ended. The label values of `attempts_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A 2xx response header arrived and the response was relayed.
    Ok,
    /// A 4xx the caller caused (not a failover trigger); relayed in signalbox's words.
    ClientError,
    /// 429 from the upstream.
    RateLimited,
    /// 401/402/403: the credential was refused.
    CredentialRejected,
    /// 404: the upstream does not know the model.
    ModelNotFound,
    /// 5xx, 529 and 408.
    ServerError,
    /// A status signalbox does not relay (1xx leftovers, 3xx).
    UnexpectedStatus,
    ConnectRefused,
    ConnectTimeout,
    TlsError,
    /// Reset or closed before the response header.
    Reset,
    /// No response header within the TTFB timeout.
    Timeout,
    /// A stream broke, stalled past `failover.stream_idle_timeout` or ended without its
    /// terminal event after bytes reached the client.
    StreamAborted,
    /// An empty stream, empty `choices`, or (under the first-chunk hold) a stream that ended
    /// before any content.
    Empty,
    /// Under the first-chunk hold: no content within `failover.first_chunk_hold` (or before
    /// `failover.deadline`).
    FirstChunkTimeout,
    /// Under the first-chunk hold: the provider's own error event before any content.
    StreamError,
    /// The client went away.
    Cancelled,
    /// A hedge's rival committed first: this attempt was cancelled (its connection closed),
    /// never the provider's failure.
    HedgeLost,
    /// The gateway itself could not open a connection (out of file descriptors, ports or
    /// memory): not the provider's failure.
    LocalError,
    /// A pooled connection failed before the request was written: the provider never saw the
    /// request, so the same target is called again on a fresh connection. Not judged.
    StaleConnection,
}

impl Outcome {
    pub const ALL: [Outcome; 20] = [
        Outcome::Ok,
        Outcome::ClientError,
        Outcome::RateLimited,
        Outcome::CredentialRejected,
        Outcome::ModelNotFound,
        Outcome::ServerError,
        Outcome::UnexpectedStatus,
        Outcome::ConnectRefused,
        Outcome::ConnectTimeout,
        Outcome::TlsError,
        Outcome::Reset,
        Outcome::Timeout,
        Outcome::StreamAborted,
        Outcome::Empty,
        Outcome::FirstChunkTimeout,
        Outcome::StreamError,
        Outcome::Cancelled,
        Outcome::HedgeLost,
        Outcome::LocalError,
        Outcome::StaleConnection,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::RateLimited => "rate_limited",
            Outcome::CredentialRejected => "credential_rejected",
            Outcome::ModelNotFound => "model_not_found",
            Outcome::ServerError => "server_error",
            Outcome::UnexpectedStatus => "unexpected_status",
            Outcome::ConnectRefused => "connect_refused",
            Outcome::ConnectTimeout => "connect_timeout",
            Outcome::TlsError => "tls_error",
            Outcome::Reset => "reset",
            Outcome::Timeout => "timeout",
            Outcome::StreamAborted => "stream_aborted",
            Outcome::Empty => "empty",
            Outcome::FirstChunkTimeout => "first_chunk_timeout",
            Outcome::StreamError => "stream_error",
            Outcome::Cancelled => "cancelled",
            Outcome::HedgeLost => "hedge_lost",
            Outcome::LocalError => "local_error",
            Outcome::StaleConnection => "stale_connection",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Where the plan should look next after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Another credential of the same deployment, then the next deployment.
    NextCredential,
    /// The next deployment.
    NextDeployment,
}

/// Why a request ended without any upstream call: the plan had no candidate it could call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCall {
    /// Every candidate lacked a usable credential (and none was disabled or unresolved).
    NotConfigured,
    /// Candidates exist but none can take a request now (ejected, benched, disabled, ...).
    Unavailable,
    /// Every candidate's `rpm` window is full.
    RateLimited,
    /// Every candidate's deployment or provider budget is spent.
    OverBudget,
    /// The caller's key may not use the models that could serve.
    NotAllowed,
    /// The request's estimated tokens alone exceed every candidate's `tpm`.
    TokensExceedLimit,
}

/// Classify a failure to connect (`fail_to_connect`).
pub fn classify_connect_error(e: &Error) -> Outcome {
    if is_local_resource_error(e) {
        return Outcome::LocalError;
    }
    match e.etype() {
        ErrorType::ConnectTimedout => Outcome::ConnectTimeout,
        ErrorType::TLSHandshakeFailure
        | ErrorType::TLSHandshakeTimedout
        | ErrorType::InvalidCert
        | ErrorType::HandshakeError
        | ErrorType::TLSWantX509Lookup => Outcome::TlsError,
        _ => Outcome::ConnectRefused,
    }
}

/// Whether a connect failed for a reason local to the gateway (no file descriptor, no port,
/// no buffer memory): the provider is not to blame, so health must not count it.
pub fn is_local_resource_error(e: &Error) -> bool {
    if matches!(e.etype(), ErrorType::BindError | ErrorType::SocketError) {
        return true;
    }
    // Pingora nests its own errors as causes (`InternalError` ← `SocketError` ← io::Error).
    let mut cause: Option<&(dyn std::error::Error + 'static)> = e
        .cause
        .as_deref()
        .map(|c| c as &(dyn std::error::Error + 'static));
    while let Some(err) = cause {
        let nested = err
            .downcast_ref::<Error>()
            .or_else(|| err.downcast_ref::<Box<Error>>().map(|b| &**b));
        if let Some(inner) = nested {
            if matches!(inner.etype(), ErrorType::BindError | ErrorType::SocketError) {
                return true;
            }
            cause = inner
                .cause
                .as_deref()
                .map(|c| c as &(dyn std::error::Error + 'static));
            continue;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.raw_os_error(),
                Some(
                    libc::EMFILE
                        | libc::ENFILE
                        | libc::ENOBUFS
                        | libc::ENOMEM
                        | libc::EADDRNOTAVAIL
                )
            ) {
                return true;
            }
        }
        cause = err.source();
    }
    false
}

/// Classify an error after the connection was made, before any response byte reached the
/// client (`error_while_proxy`), when no status was recorded.
pub fn classify_proxy_error(e: &Error) -> Outcome {
    match e.etype() {
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => Outcome::Timeout,
        ErrorType::TLSHandshakeFailure | ErrorType::InvalidCert => Outcome::TlsError,
        _ => Outcome::Reset,
    }
}

/// Parse `Retry-After`: delta-seconds or an HTTP-date. Garbage gives `None`; negative or past
/// values give zero; absurd values are capped at `cap`.
pub fn parse_retry_after(value: &str, now: SystemTime, cap: Duration) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() {
        return None;
    }
    let d = if let Ok(secs) = v.parse::<i64>() {
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    } else if let Ok(secs) = v.parse::<f64>() {
        if !secs.is_finite() {
            return None;
        }
        Duration::from_secs_f64(secs.clamp(0.0, cap.as_secs_f64()))
    } else {
        let at = httpdate::parse_http_date(v).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(d.min(cap))
}

/// The attempts of one request and how each ended, for the final answer.
#[derive(Debug, Clone, Default)]
pub struct FailureLog {
    counts: [u16; Outcome::ALL.len()],
    failures: u16,
    /// The smallest upstream `Retry-After` seen on a 429, in seconds.
    pub retry_after: Option<u64>,
    /// A provider refused the prompt as longer than its context window.
    context_exceeded: bool,
}

impl FailureLog {
    pub fn record(&mut self, outcome: Outcome) {
        self.counts[outcome.index()] = self.counts[outcome.index()].saturating_add(1);
        self.failures = self.failures.saturating_add(1);
    }

    pub fn note_context_exceeded(&mut self) {
        self.context_exceeded = true;
    }

    pub fn note_retry_after(&mut self, secs: u64) {
        self.retry_after = Some(self.retry_after.map_or(secs, |r| r.min(secs)));
    }

    pub fn count(&self, o: Outcome) -> u16 {
        self.counts[o.index()]
    }

    pub fn failures(&self) -> u16 {
        self.failures
    }

    fn all(&self, outcomes: &[Outcome]) -> bool {
        self.failures > 0 && outcomes.iter().map(|o| self.count(*o)).sum::<u16>() == self.failures
    }

    /// What the caller is told when no attempt produced a relayable answer. `no_call` says
    /// why, when no attempt was made at all.
    pub fn final_error(&self, no_call: NoCall) -> GatewayError {
        if self.failures == 0 {
            if no_call == NoCall::NotConfigured {
                return GatewayError::new(
                    ErrorCode::ProviderNotConfigured,
                    "no candidate for this model has a usable provider credential configured",
                );
            }
            if no_call == NoCall::OverBudget {
                return GatewayError::new(
                    ErrorCode::BudgetExceeded,
                    "every candidate for this model is over its budget for the period",
                );
            }
            if no_call == NoCall::TokensExceedLimit {
                return GatewayError::new(
                    ErrorCode::TokensExceedLimit,
                    "the request's estimated tokens exceed every candidate's tokens-per-minute limit; a smaller request can pass",
                );
            }
            if no_call == NoCall::NotAllowed {
                // Says only that it is not allowed: never what would have served.
                return GatewayError::new(
                    ErrorCode::ModelNotAllowed,
                    "this API key may not use the model or route it named",
                );
            }
            if no_call == NoCall::RateLimited {
                return GatewayError::new(
                    ErrorCode::RateLimited,
                    "every candidate for this model is at its requests-per-minute limit; retry later",
                );
            }
            return GatewayError::new(
                ErrorCode::NoProviderAvailable,
                "no provider is available for this model right now",
            );
        }
        let n = self.failures;
        let attempts = if n == 1 { "attempt" } else { "attempts" };
        if self.all(&[Outcome::CredentialRejected]) {
            return GatewayError::new(
                ErrorCode::ProviderCredentialRejected,
                format!("every provider credential tried was rejected ({n} {attempts})"),
            );
        }
        if self.all(&[Outcome::RateLimited]) {
            return GatewayError::new(
                ErrorCode::RateLimited,
                format!("every candidate is rate limited ({n} {attempts}); retry later"),
            )
            .with_retry_after(Some(self.retry_after.unwrap_or(1)));
        }
        if self.all(&[Outcome::ModelNotFound]) {
            return GatewayError::new(
                ErrorCode::UpstreamModelNotFound,
                format!("no provider recognised the model it was sent ({n} {attempts})"),
            );
        }
        if self.all(&[Outcome::ClientError]) && self.context_exceeded {
            return GatewayError::new(
                ErrorCode::ContextLengthExceeded,
                format!(
                    "the prompt is longer than every candidate's context window ({n} {attempts})"
                ),
            );
        }
        if self.all(&[Outcome::ClientError]) {
            return GatewayError::new(
                ErrorCode::AllCandidatesRejected,
                format!("every candidate rejected the request as invalid ({n} {attempts})"),
            );
        }
        if self.all(&[Outcome::LocalError]) {
            return GatewayError::new(
                ErrorCode::NoProviderAvailable,
                "the gateway could not open an upstream connection (a local resource limit was reached); retry shortly",
            )
            .with_retry_after(Some(1));
        }
        if self.all(&[
            Outcome::Timeout,
            Outcome::ConnectTimeout,
            Outcome::FirstChunkTimeout,
        ]) {
            return GatewayError::new(
                ErrorCode::UpstreamTimeout,
                format!("every upstream attempt timed out ({n} {attempts})"),
            );
        }
        if n == 1 {
            return GatewayError::new(
                ErrorCode::UpstreamError,
                "the upstream attempt failed and no other candidate was available",
            );
        }
        GatewayError::new(
            ErrorCode::UpstreamError,
            format!("every upstream attempt failed ({n} {attempts}); no provider could serve the request"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cap = Duration::from_secs(600);
        assert_eq!(
            parse_retry_after("7", now, cap),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse_retry_after("-5", now, cap), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("99999999", now, cap), Some(cap));
        assert_eq!(parse_retry_after("soon", now, cap), None);
        assert_eq!(parse_retry_after("", now, cap), None);
        assert_eq!(
            parse_retry_after("1.5", now, cap),
            Some(Duration::from_millis(1500))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&date, now, cap),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&past, now, cap), Some(Duration::ZERO));
    }

    #[test]
    fn local_resource_errors_are_recognised() {
        let emfile = Error::because(
            ErrorType::ConnectError,
            "connect",
            std::io::Error::from_raw_os_error(libc::EMFILE),
        );
        assert!(is_local_resource_error(&emfile));
        assert_eq!(classify_connect_error(&emfile), Outcome::LocalError);
        // As Pingora reports it: InternalError caused by SocketError caused by EMFILE.
        let nested = Error::because(
            ErrorType::InternalError,
            "Fail to connect",
            Error::because(
                ErrorType::SocketError,
                "failed to create socket",
                std::io::Error::from_raw_os_error(libc::EMFILE),
            ),
        );
        assert_eq!(classify_connect_error(&nested), Outcome::LocalError);
        let refused = Error::because(
            ErrorType::ConnectRefused,
            "connect",
            std::io::Error::from_raw_os_error(libc::ECONNREFUSED),
        );
        assert!(!is_local_resource_error(&refused));
        assert_eq!(classify_connect_error(&refused), Outcome::ConnectRefused);
        let mut log = FailureLog::default();
        log.record(Outcome::LocalError);
        assert_eq!(log.final_error(NoCall::Unavailable).status, 503);
    }

    #[test]
    fn final_errors() {
        let mut log = FailureLog::default();
        assert_eq!(
            log.final_error(NoCall::Unavailable).code,
            ErrorCode::NoProviderAvailable
        );
        log.record(Outcome::RateLimited);
        log.note_retry_after(9);
        log.note_retry_after(4);
        let e = log.final_error(NoCall::Unavailable);
        assert_eq!((e.code, e.retry_after), (ErrorCode::RateLimited, Some(4)));
        log.record(Outcome::ServerError);
        assert_eq!(
            log.final_error(NoCall::Unavailable).code,
            ErrorCode::UpstreamError
        );
        let mut t = FailureLog::default();
        t.record(Outcome::Timeout);
        t.record(Outcome::ConnectTimeout);
        assert_eq!(
            t.final_error(NoCall::Unavailable).code,
            ErrorCode::UpstreamTimeout
        );
        let mut c = FailureLog::default();
        c.record(Outcome::CredentialRejected);
        assert_eq!(c.final_error(NoCall::Unavailable).status, 424);
    }
}
