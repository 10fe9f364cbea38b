//! `Secret`: a provider key that cannot be printed.
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

#[cfg(test)]
mod tests {
    use super::*;

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
