//! `Secret`: a provider key that cannot be printed; [`redact_urls`]: the one redaction of
//! URLs in text (their userinfo and query strings) before it reaches a message, a log line,
//! `-t`'s output or an admin body.
//!
//! Keys live only inside this wrapper, as the ready-made header that carries them upstream
//! (`Authorization: Bearer <key>`, or `x-api-key: <key>` for Anthropic), the value marked
//! sensitive so `http` and HPACK treat it as such. `Debug` and `Display` print
//! `[redacted]`, and there is no `Serialize`, so a key cannot reach a log line, an admin
//! page or a metric label by accident.

use std::fmt;

use http::{HeaderName, HeaderValue};

#[derive(Clone)]
pub struct Secret {
    name: HeaderName,
    header: HeaderValue,
}

impl Secret {
    /// Build the `Authorization: Bearer <key>` value. `None` if the key is empty or holds
    /// bytes a header cannot carry.
    pub fn bearer(key: &str) -> Option<Self> {
        let key = key.trim();
        if key.is_empty() {
            return None;
        }
        let mut header = HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
        header.set_sensitive(true);
        Some(Self {
            name: http::header::AUTHORIZATION,
            header,
        })
    }

    /// Build the `x-api-key: <key>` header (Anthropic). `None` as for [`Secret::bearer`].
    pub fn api_key(key: &str) -> Option<Self> {
        let key = key.trim();
        if key.is_empty() {
            return None;
        }
        let mut header = HeaderValue::from_str(key).ok()?;
        header.set_sensitive(true);
        Some(Self {
            name: HeaderName::from_static("x-api-key"),
            header,
        })
    }

    /// The header name the key travels in.
    pub fn header_name(&self) -> &HeaderName {
        &self.name
    }

    /// The header value to send upstream. The only way to read the key.
    pub fn header_value(&self) -> &HeaderValue {
        &self.header
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Text with the userinfo (`user:pass@`) and the query string of every URL in it replaced by
/// `***`: what a config error, a start-up failure or a reload refusal may print of a URL the
/// operator wrote. A URL runs from its `scheme://` to the first blank, quote or angle
/// bracket (Debug-quoted text ends one at its `"`).
pub fn redact_urls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("://") {
        return std::borrow::Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let ends_url = |b: u8| b.is_ascii_whitespace() || b"\"'`<>\\".contains(&b);
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let authority_start = from + found + 3;
        let end = bytes[authority_start..]
            .iter()
            .position(|&b| ends_url(b))
            .map_or(bytes.len(), |n| authority_start + n);
        let url = &text[authority_start..end];
        let authority_len = url.find(['/', '?', '#']).unwrap_or(url.len());
        let mut edits: Vec<(usize, usize)> = Vec::new();
        if let Some(at) = url[..authority_len].rfind('@') {
            edits.push((authority_start, authority_start + at));
        }
        if let Some(q) = url.find('?') {
            let q_end = url[q..].find('#').map_or(url.len(), |n| q + n);
            if q_end > q + 1 {
                edits.push((authority_start + q + 1, authority_start + q_end));
            }
        }
        for (a, b) in edits {
            out.push_str(&text[copied..a]);
            out.push_str("***");
            copied = b;
        }
        from = end.max(authority_start);
    }
    if copied == 0 {
        return std::borrow::Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_userinfo_and_query() {
        assert_eq!(
            redact_urls("base_url \"http://user:pa55@api.example/v1?key=sk-1#x\" is bad"),
            "base_url \"http://***@api.example/v1?***#x\" is bad"
        );
        assert_eq!(
            redact_urls("redis://:hunter2@127.0.0.1:6379/0 and https://a.test/x?token=t"),
            "redis://***@127.0.0.1:6379/0 and https://a.test/x?***"
        );
        let plain = "http://127.0.0.1:9/v1 stays as it is";
        assert!(matches!(redact_urls(plain), std::borrow::Cow::Borrowed(_)));
        assert_eq!(redact_urls("no url"), "no url");
        // The at-sign of a path is not userinfo.
        assert_eq!(redact_urls("http://h/a@b"), "http://h/a@b");
    }

    #[test]
    fn never_printed() {
        let s = Secret::bearer("sk-canary-123").expect("valid key");
        assert_eq!(format!("{s}"), "[redacted]");
        assert!(!format!("{s:?}").contains("canary"));
        assert_eq!(s.header_value().to_str().ok(), Some("Bearer sk-canary-123"));
        assert!(s.header_value().is_sensitive());
        assert!(Secret::bearer("  ").is_none());
        assert!(Secret::bearer("a\nb").is_none());
    }
}
