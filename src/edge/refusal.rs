//! The answers the edge writes itself, before a request reaches the proxy: a whole HTTP/1.1
//! response (status, JSON error body in the caller's dialect, `Connection: close`), built
//! only when a request is refused.

use bytes::{BufMut, Bytes, BytesMut};

use crate::adapters::chat_messages::gateway_error_to_anthropic;
use crate::error::{ErrorCode, GatewayError};

/// Why the edge refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Pingora would not parse the head.
    Malformed,
    /// More header lines or bytes than Pingora reads.
    HeadTooLarge,
    /// A request target longer than signalbox (or Pingora) reads.
    UriTooLong,
    /// `CONNECT`: signalbox is no tunnel.
    Connect,
    /// The head did not arrive within `limits.header_timeout`.
    HeadTimeout,
}

impl Refusal {
    pub fn code(self) -> ErrorCode {
        match self {
            Refusal::Malformed => ErrorCode::InvalidHttp,
            Refusal::HeadTooLarge => ErrorCode::HeadersTooLarge,
            Refusal::UriTooLong => ErrorCode::UriTooLong,
            Refusal::Connect => ErrorCode::MethodNotAllowed,
            Refusal::HeadTimeout => ErrorCode::RequestTimeout,
        }
    }

    fn message(self) -> &'static str {
        match self {
            Refusal::Malformed => "the request is not HTTP/1.1 signalbox can read",
            Refusal::HeadTooLarge => "the request headers exceed the gateway's limit",
            Refusal::UriTooLong => "the request target exceeds the gateway's limit of 8KiB",
            Refusal::Connect => "signalbox does not tunnel CONNECT requests",
            Refusal::HeadTimeout => {
                "the request headers did not arrive within the gateway's limit (limits.header_timeout)"
            }
        }
    }
}

/// The whole response for `refusal`: Anthropic's error shape when `anthropic`, else OpenAI's.
pub fn response(refusal: Refusal, anthropic: bool) -> Bytes {
    let err = GatewayError::new(refusal.code(), refusal.message());
    let body = if anthropic {
        Bytes::from(gateway_error_to_anthropic(err.status, &err.body(), None))
    } else {
        err.body()
    };
    let reason = http::StatusCode::from_u16(err.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let mut out = BytesMut::with_capacity(160 + body.len());
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(itoa::Buffer::new().format(err.status).as_bytes());
    out.put_u8(b' ');
    out.put_slice(reason.as_bytes());
    out.put_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
    out.put_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    out.put_slice(b"\r\ndate: ");
    out.put_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    out.put_slice(b"\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n");
    out.put_slice(&body);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_whole_response_in_the_callers_dialect() {
        let r = response(Refusal::HeadTooLarge, false);
        let text = std::str::from_utf8(&r).unwrap_or_default();
        assert!(
            text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{text}"
        );
        assert!(text.contains("connection: close\r\n"), "{text}");
        let (_, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(v["error"]["code"], "request_headers_too_large");
        assert!(v["error"]["param"].is_null());
        let r = response(Refusal::Malformed, true);
        let text = std::str::from_utf8(&r).unwrap_or_default();
        let (_, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}
