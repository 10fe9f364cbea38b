//! Header names in config: the `pass_headers` globs of `request` and `response`, and a
//! provider's own `headers`. What these lists may never name (credentials, framing) is decided
//! here, at load, so the request path only matches.

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue};

use crate::config::types::HeaderGlobs;
use crate::config::ConfigError;

/// Headers that carry a caller's or a provider's credential: never forwarded from a caller,
/// never set through `headers` (a provider's credential is its `credentials`).
pub const CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
];
/// Headers signalbox writes itself on every upstream request (framing, the hop, its id): a
/// caller's are never forwarded, a provider's `headers` cannot set them.
pub const GATEWAY_WRITTEN_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
    "expect",
    "x-request-id",
];

/// `request.pass_headers` / `response.pass_headers`: header-name globs, lower-cased. In
/// `request`, a credential header can never be named (and a wildcard never matches one).
pub(super) fn validate_pass_headers(
    list: &[String],
    path: &str,
    refuse_credentials: bool,
    errs: &mut Vec<ConfigError>,
) -> HeaderGlobs {
    let mut out = Vec::with_capacity(list.len());
    for (i, glob) in list.iter().enumerate() {
        let lower = glob.to_ascii_lowercase();
        let name_chars = lower
            .bytes()
            .all(|b| b == b'*' || b == b'?' || is_token_byte(b));
        if lower.is_empty() || !name_chars {
            errs.push(ConfigError::new(
                format!("{path}[{i}]"),
                format!("{glob:?} is not a header-name glob (token characters, `*`, `?`)"),
            ));
            continue;
        }
        if refuse_credentials && CREDENTIAL_HEADERS.contains(&lower.as_str()) {
            errs.push(ConfigError::new(
                format!("{path}[{i}]"),
                format!("{glob:?} is a credential header: a caller's credential never reaches a provider"),
            ));
            continue;
        }
        out.push(lower.into_boxed_str());
    }
    HeaderGlobs(out)
}

/// `providers.<id>.headers`: fixed fields for every request to the provider.
pub(super) fn validate_provider_headers(
    map: &BTreeMap<String, String>,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(map.len());
    for (name, value) in map {
        let at = format!("{path}.headers.{name}");
        let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
            errs.push(ConfigError::new(at, "not a valid header name"));
            continue;
        };
        if CREDENTIAL_HEADERS.contains(&header.as_str()) {
            errs.push(ConfigError::new(
                at,
                "a credential header: give the provider's key in `credentials` (from an env var or a file)",
            ));
            continue;
        }
        if GATEWAY_WRITTEN_HEADERS.contains(&header.as_str()) {
            errs.push(ConfigError::new(at, "signalbox writes this header itself"));
            continue;
        }
        let Ok(value) = HeaderValue::from_str(value) else {
            errs.push(ConfigError::new(at, "not a valid header value"));
            continue;
        };
        out.push((header, value));
    }
    out
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn base(provider_extra: &str, extra: &str) -> String {
        format!("providers: {{ p: {{ kind: openai, base_url: \"http://127.0.0.1:1/v1\"{provider_extra} }} }}\nmodels: {{ m: {{ deployments: [ {{ provider: p, model: m }} ] }} }}\n{extra}")
    }

    fn errors(text: &str) -> String {
        match parse(text) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn pass_headers_are_read_lower_cased() {
        let c = parse(&base(
            ", headers: { OpenAI-Organization: org-1 }",
            "request: { pass_headers: [X-Trace-*] }\nresponse: { pass_headers: [\"x-ratelimit-*\", Vary] }\n",
        ))
        .expect("valid");
        assert!(c.request.pass_headers.matches("x-trace-id"));
        assert!(c.response.pass_headers.matches("vary"));
        assert!(!c.response.pass_headers.matches("server"));
        assert_eq!(c.providers[0].headers[0].0.as_str(), "openai-organization");
    }

    #[test]
    fn a_credential_header_can_never_be_named() {
        let e = errors(&base(
            "",
            "request: { pass_headers: [ok, Authorization] }\n",
        ));
        assert!(e.contains("request.pass_headers[1]"), "{e}");
        assert!(e.contains("credential header"), "{e}");
        let e = errors(&base(", headers: { x-api-key: sk-inline }", ""));
        assert!(e.contains("providers.p.headers.x-api-key"), "{e}");
        assert!(!e.contains("sk-inline"), "the value is never echoed: {e}");
        let e = errors(&base(", headers: { Host: other }", ""));
        assert!(e.contains("providers.p.headers.Host"), "{e}");
        let e = errors(&base("", "response: { pass_headers: [\"bad name\"] }\n"));
        assert!(e.contains("response.pass_headers[0]"), "{e}");
    }
}
