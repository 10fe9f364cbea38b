//! Value parsers and name rules: one raw value in, one checked value (or an error) out.
//!
//! Durations (`30s`, `5m`, `0`), sizes (`16MiB`, `64KiB`, bytes), base URLs, listen
//! addresses, and the rules names follow (provider and credential ids, catalog names, chain
//! names, upstream model names). None of these look at any other part of the file; the
//! section checks in [`validate`](super::validate) call them with the key path to report.

use std::time::Duration;

use super::schema::SizeValue;
use super::types::{BaseUrl, Scheme};
use super::ConfigError;

/// Axis names of `auto:<axis>`; a chain may not be named like one.
pub const AXIS_NAMES: &[&str] = &[
    "smart", "smartest", "fast", "fastest", "speed", "reliable", "balanced", "cheap", "cheapest",
    "budget",
];

// === addresses ===

/// A listen address must be an `IP:port` socket address.
pub(super) fn check_listen_addr(addr: &str, path: &str, errs: &mut Vec<ConfigError>) -> String {
    if addr.parse::<std::net::SocketAddr>().is_err() {
        errs.push(ConfigError::new(
            path,
            format!("{addr:?} is not an IP:port address"),
        ));
    }
    addr.to_string()
}

// === URLs ===

/// Parse `http(s)://host[:port][/path]`.
pub fn parse_base_url(raw: &str, path: &str, errs: &mut Vec<ConfigError>) -> Option<BaseUrl> {
    let bad = |errs: &mut Vec<ConfigError>, why: &str| {
        errs.push(ConfigError::new(path, format!("{raw:?}: {why}")));
        None
    };
    let uri: http::Uri = match raw.parse() {
        Ok(u) => u,
        Err(_) => return bad(errs, "not a URL"),
    };
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return bad(errs, "the scheme must be http or https"),
    };
    let Some(authority) = uri.authority() else {
        return bad(errs, "no host");
    };
    if authority.as_str().contains('@') {
        return bad(
            errs,
            "credentials in the URL are not allowed (use credentials[])",
        );
    }
    if uri.query().is_some() {
        return bad(errs, "a query string is not allowed");
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return bad(errs, "no host");
    }
    let port = authority.port_u16().unwrap_or(match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    });
    Some(BaseUrl {
        scheme,
        host: host.to_ascii_lowercase(),
        port,
        path: uri.path().trim_end_matches('/').to_string(),
    })
}

// === durations and sizes ===

/// Parse a duration such as `30s`, `500ms` or `5m`; a bare `0` is zero (which some keys
/// read as "off").
pub(super) fn parse_duration(
    raw: &str,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<Duration> {
    if raw.trim() == "0" {
        return Some(Duration::ZERO);
    }
    match humantime::parse_duration(raw) {
        Ok(d) => Some(d),
        Err(e) => {
            errs.push(ConfigError::new(
                path,
                format!("{raw:?} is not a duration like 30s or 5m ({e})"),
            ));
            None
        }
    }
}

/// A duration that must not be zero.
pub(super) fn positive_duration(raw: &str, path: &str, errs: &mut Vec<ConfigError>) -> Duration {
    match parse_duration(raw, path, errs) {
        Some(d) if d.is_zero() => {
            errs.push(ConfigError::new(path, "must be greater than zero"));
            Duration::from_secs(1)
        }
        Some(d) => d,
        None => Duration::from_secs(1),
    }
}

/// Parse `16MiB`, `64KiB`, `1GB`, `512` (bytes).
pub fn parse_size_text(raw: &str) -> Option<u64> {
    let s = raw.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        _ => return None,
    };
    let v = num * mult;
    if v.is_finite() && (0.0..1.8e19).contains(&v) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(v as u64)
    } else {
        None
    }
}

/// A size written as a number of bytes or as text such as `16MiB`.
pub(super) fn parse_size(v: &SizeValue, path: &str, errs: &mut Vec<ConfigError>) -> u64 {
    match v {
        SizeValue::Bytes(b) => *b,
        SizeValue::Text(t) => parse_size_text(t).unwrap_or_else(|| {
            errs.push(ConfigError::new(
                path,
                format!("{t:?} is not a size like 16MiB or 65536"),
            ));
            0
        }),
    }
}

// === name rules ===

/// Provider and credential ids: lower-case letters, digits, `-` and `_`, not starting with
/// `-` or `_`.
pub(super) fn is_slug(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'))
        })
}

/// Upstream model names go into request bodies and response headers verbatim.
pub fn is_upstream_model_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// Model and alias names: what callers send as `model`.
pub(super) fn check_catalog_name(name: &str, path: &str, errs: &mut Vec<ConfigError>) {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b':');
    if !ok {
        errs.push(ConfigError::new(
            path,
            "names are 1-128 visible ASCII characters without ':', quotes or backslashes",
        ));
    }
    if name.eq_ignore_ascii_case("auto") {
        errs.push(ConfigError::new(
            path,
            "`auto` is reserved for the active chain",
        ));
    }
}

/// Policy names: callers send them as `model` (so they follow the catalog's rules) and in
/// `x-llm-route`; no `/` either, which would read as `<provider>/<upstream-model>`.
pub(super) fn check_policy_name(name: &str, path: &str, errs: &mut Vec<ConfigError>) {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b':' | b'/'));
    if !ok {
        errs.push(ConfigError::new(
            path,
            "policy names are 1-128 visible ASCII characters without ':', '/', quotes or backslashes",
        ));
    }
    if name.eq_ignore_ascii_case("auto") {
        errs.push(ConfigError::new(
            path,
            "`auto` is reserved for the active chain",
        ));
    }
}

/// Chain names: callers write them as `auto:<chain>`.
pub(super) fn check_chain_name(name: &str, path: &str, errs: &mut Vec<ConfigError>) {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !ok {
        errs.push(ConfigError::new(
            path,
            "chain names are 1-64 characters of letters, digits, '-', '_' and '.'",
        ));
    }
    if AXIS_NAMES.iter().any(|a| a.eq_ignore_ascii_case(name)) {
        errs.push(ConfigError::new(
            path,
            format!("{name:?} is an auto:<axis> name and cannot name a chain"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_text("16MiB"), Some(16 * 1024 * 1024));
        assert_eq!(parse_size_text("64KiB"), Some(65536));
        assert_eq!(parse_size_text("1000"), Some(1000));
        assert_eq!(parse_size_text("2kb"), Some(2000));
        assert_eq!(parse_size_text("lots"), None);
        assert_eq!(parse_size_text("12parsecs"), None);
    }

    #[test]
    fn base_urls() {
        let mut errs = Vec::new();
        let u = parse_base_url("https://api.openai.com/v1/", "x", &mut errs);
        assert_eq!(
            u,
            Some(BaseUrl {
                scheme: Scheme::Https,
                host: "api.openai.com".into(),
                port: 443,
                path: "/v1".into()
            })
        );
        let u = parse_base_url("http://127.0.0.1:9001", "x", &mut errs).expect("valid");
        assert_eq!(u.port, 9001);
        assert_eq!(u.path, "");
        assert_eq!(u.authority(), "127.0.0.1:9001");
        assert!(errs.is_empty());
        assert!(parse_base_url("ftp://x", "x", &mut errs).is_none());
        assert!(parse_base_url("https://user:pw@x/v1", "x", &mut errs).is_none());
        assert!(parse_base_url("https://x/v1?a=b", "x", &mut errs).is_none());
        assert_eq!(errs.len(), 3);
    }

    #[test]
    fn slugs() {
        assert!(is_slug("openai"));
        assert!(is_slug("azure-eu_2"));
        assert!(!is_slug("OpenAI"));
        assert!(!is_slug("-x"));
        assert!(!is_slug(""));
    }
}
