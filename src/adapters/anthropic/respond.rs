//! What signalbox writes itself to an Anthropic caller: errors in Anthropic's shape, the
//! terminal error event of a broken stream, relayed refusals, and `GET /v1/models`.
//!
//! The shape is Anthropic's (`{"type":"error","error":{"type","message"}}`), so the SDKs raise
//! their usual exception classes; the words are signalbox's own, never a provider's message.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use crate::adapters::openai;

/// Anthropic's error `type` for an HTTP status, as its SDKs and docs pair them. Where signalbox
/// answers a status Anthropic does not document, the pairing is chosen for what the caller
/// should do next:
///
/// - 400 and every other 4xx not listed: `invalid_request_error` (Anthropic's own rule);
/// - 401 `authentication_error`, 402 `billing_error`, 403 `permission_error`, 404
///   `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`;
/// - 503 (every candidate ejected or ineligible, `Retry-After` set) and 529:
///   `overloaded_error` — try again later, which the SDKs do for this type;
/// - 504 (every attempt timed out): `timeout_error`;
/// - 500, 502 and every other 5xx: `api_error`.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

fn error_json(kind: &'static str, message: &str) -> Vec<u8> {
    let envelope = ErrorEnvelope {
        kind: "error",
        error: ErrorObject { kind, message },
    };
    // Two static strings and a `&str`: serialising cannot fail.
    serde_json::to_vec(&envelope).unwrap_or_default()
}

/// `{"type":"error","error":{"type":<by status>,"message":…}}`: any error signalbox answers an
/// Anthropic caller with.
pub fn error_body(status: u16, message: &str) -> Bytes {
    Bytes::from(error_json(error_type(status), message))
}

/// The event signalbox writes into an Anthropic stream it must end abnormally (the provider's
/// stream broke after the header went out): `event: error` with an `api_error`, never a
/// `message_stop`, so the SDK raises instead of returning a truncated message.
pub fn sse_error_event(message: &str) -> Bytes {
    let json = error_json("api_error", message);
    let mut out = BytesMut::with_capacity(json.len() + 22);
    out.put_slice(b"event: error\ndata: ");
    out.put_slice(&json);
    out.put_slice(b"\n\n");
    out.freeze()
}

/// Whether a provider's refusal says the prompt does not fit the model's context window:
/// Anthropic's wordings (`prompt is too long: 208310 tokens > 200000 maximum`; `input length and
/// max_tokens exceed context limit`) or the OpenAI ones (a compatible provider behind an
/// Anthropic-kind entry).
pub fn is_context_length_error(upstream_body: &[u8]) -> bool {
    static PROMPT_TOO_LONG: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"rompt is too long"));
    static CONTEXT_LIMIT: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"exceed context limit"));
    PROMPT_TOO_LONG.find(upstream_body).is_some()
        || CONTEXT_LIMIT.find(upstream_body).is_some()
        || openai::is_context_length_error(upstream_body)
}

/// The body for an upstream 4xx relayed to an Anthropic caller, in signalbox's words: a
/// context-length refusal says so (`invalid_request_error`, whatever the status), anything else
/// is typed by its status.
pub fn refusal_body(status: u16, upstream_body: &[u8]) -> Bytes {
    if is_context_length_error(upstream_body) {
        return Bytes::from(error_json(
            "invalid_request_error",
            "the prompt is longer than the model's context window",
        ));
    }
    let message = if status == 413 {
        "the provider refused the request as too large"
    } else {
        "the provider rejected the request as invalid; check the request parameters"
    };
    error_body(status, message)
}

#[derive(Serialize)]
pub struct ModelEntry<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    display_name: &'a str,
    created_at: &'a str,
}

impl<'a> ModelEntry<'a> {
    /// One caller-facing name, created at `created_at` (RFC 3339).
    pub fn new(id: &'a str, created_at: &'a str) -> Self {
        Self {
            kind: "model",
            id,
            display_name: id,
            created_at,
        }
    }
}

#[derive(Serialize)]
struct ModelList<'a> {
    data: Vec<ModelEntry<'a>>,
    has_more: bool,
    first_id: Option<&'a str>,
    last_id: Option<&'a str>,
}

/// Anthropic's list paging (`GET /v1/models?limit=&after_id=&before_id=`): at most `limit`
/// names (default 20, 1 to 1000) after `after_id` or before `before_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page<'q> {
    pub limit: usize,
    pub after_id: Option<&'q str>,
    pub before_id: Option<&'q str>,
}

impl<'q> Page<'q> {
    pub const DEFAULT_LIMIT: usize = 20;
    pub const MAX_LIMIT: usize = 1000;

    /// Read the query string; `Err` names the parameter at fault.
    pub fn parse(query: Option<&'q str>) -> Result<Self, &'static str> {
        let mut page = Page {
            limit: Self::DEFAULT_LIMIT,
            after_id: None,
            before_id: None,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "limit" => {
                    page.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=Self::MAX_LIMIT).contains(n))
                        .ok_or("limit")?;
                }
                "after_id" => page.after_id = Some(v),
                "before_id" => page.before_id = Some(v),
                _ => {}
            }
        }
        Ok(page)
    }
}

/// `GET /v1/models` in Anthropic's shape: the caller-facing names (the list the OpenAI shape
/// is built from, e.g. `Snapshot::public_model_ids`), in order, one page of them.
pub fn models_list<S: AsRef<str>>(names: &[S], created_at: &str, page: Page<'_>) -> Bytes {
    let ids: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    let position = |id: &str| ids.iter().position(|n| *n == id);
    let (start, end) = match (page.after_id, page.before_id) {
        (Some(after), _) => {
            let start = position(after).map_or(ids.len(), |i| i + 1);
            (start, (start + page.limit).min(ids.len()))
        }
        (None, Some(before)) => {
            let end = position(before).unwrap_or(0);
            (end.saturating_sub(page.limit), end)
        }
        (None, None) => (0, page.limit.min(ids.len())),
    };
    let window = &ids[start..end.max(start)];
    let has_more = if page.before_id.is_some() && page.after_id.is_none() {
        start > 0
    } else {
        end < ids.len()
    };
    let list = ModelList {
        data: window
            .iter()
            .map(|id| ModelEntry::new(id, created_at))
            .collect(),
        has_more,
        first_id: window.first().copied(),
        last_id: window.last().copied(),
    };
    Bytes::from(serde_json::to_vec(&list).unwrap_or_default())
}

/// `GET /v1/models/{id}` in Anthropic's shape.
pub fn model_object(id: &str, created_at: &str) -> Bytes {
    Bytes::from(serde_json::to_vec(&ModelEntry::new(id, created_at)).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> serde_json::Value {
        serde_json::from_slice(b).expect("JSON")
    }

    #[test]
    fn errors_have_anthropics_shape_and_type_by_status() {
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (402, "billing_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (405, "invalid_request_error"),
            (411, "invalid_request_error"),
            (413, "request_too_large"),
            (424, "invalid_request_error"),
            (429, "rate_limit_error"),
            (431, "invalid_request_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
            (529, "overloaded_error"),
        ] {
            let v = parse(&error_body(status, "no \"luck\"\nat all"));
            assert_eq!(v["type"], "error", "{status}");
            assert_eq!(v["error"]["type"], kind, "{status}");
            assert_eq!(v["error"]["message"], "no \"luck\"\nat all");
            assert_eq!(v.as_object().map(serde_json::Map::len), Some(2));
        }
    }

    #[test]
    fn the_broken_stream_event_is_an_sse_error_event() {
        let ev = sse_error_event("the provider ended the stream before it was complete");
        let text = std::str::from_utf8(&ev).expect("utf8");
        let data = text
            .strip_prefix("event: error\ndata: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .expect("framing");
        assert!(!data.contains('\n'), "one data line");
        let v = parse(data.as_bytes());
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
        // What signalbox writes, its own stream reader takes for an error.
        let mut signals = crate::adapters::stream::Signals::default();
        let mut b = Some(ev);
        crate::adapters::anthropic::AnthropicRewriter::sse(Bytes::from_static(b"\"m\"")).filter(
            &mut b,
            true,
            &mut signals,
        );
        assert_eq!(
            signals.error,
            Some(crate::adapters::stream::InbandError::Server)
        );
    }

    #[test]
    fn context_length_refusals_are_recognised_in_either_wording() {
        for body in [
            &br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#[..],
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"Prompt is too long"}}"#,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"}}"#,
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
        ] {
            assert!(is_context_length_error(body), "{}", String::from_utf8_lossy(body));
            let v = parse(&refusal_body(400, body));
            assert_eq!(v["error"]["type"], "invalid_request_error");
            assert_eq!(v["error"]["message"], "the prompt is longer than the model's context window");
        }
        let other = br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}"#;
        assert!(!is_context_length_error(other));
        let v = parse(&refusal_body(400, other));
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.contains("alternate")));
        assert_eq!(
            parse(&refusal_body(413, b""))["error"]["type"],
            "request_too_large"
        );
        assert_eq!(
            parse(&refusal_body(422, b"garbage"))["error"]["type"],
            "invalid_request_error"
        );
    }

    #[test]
    fn models_are_listed_in_anthropics_shape_a_page_at_a_time() {
        let names: Vec<std::sync::Arc<str>> = ["claude-haiku", "fast", "auto:default", "auto"]
            .into_iter()
            .map(std::sync::Arc::from)
            .collect();
        let at = "2026-12-02T03:00:00Z";
        let all = Page::parse(None).expect("defaults");
        let v = parse(&models_list(&names, at, all));
        assert_eq!(v["has_more"], false);
        assert_eq!(v["first_id"], "claude-haiku");
        assert_eq!(v["last_id"], "auto");
        let data = v["data"].as_array().expect("list");
        assert_eq!(data.len(), 4);
        assert_eq!(
            data[2],
            serde_json::json!({
                "type": "model",
                "id": "auto:default",
                "display_name": "auto:default",
                "created_at": at,
            })
        );
        let v = parse(&models_list::<&str>(&[], at, all));
        assert_eq!(v["data"], serde_json::json!([]));
        assert!(v["first_id"].is_null() && v["last_id"].is_null());
        // Pages: two, then the next two after the last id, then two before the first.
        let page = |q: &str| parse(&models_list(&names, at, Page::parse(Some(q)).expect("ok")));
        let v = page("limit=2");
        assert_eq!(
            (v["first_id"].as_str(), v["last_id"].as_str()),
            (Some("claude-haiku"), Some("fast"))
        );
        assert_eq!(v["has_more"], true);
        let v = page("limit=2&after_id=fast");
        assert_eq!(
            (v["first_id"].as_str(), v["last_id"].as_str()),
            (Some("auto:default"), Some("auto"))
        );
        assert_eq!(v["has_more"], false);
        let v = page("limit=1&before_id=auto:default");
        assert_eq!(v["first_id"], "fast");
        assert_eq!(v["has_more"], true);
        assert_eq!(Page::parse(Some("limit=0")), Err("limit"));
        assert_eq!(Page::parse(Some("limit=1001")), Err("limit"));
        assert_eq!(parse(&model_object("fast", at))["id"], "fast");
    }
}
