//! What crosses the gateway in headers, both ways, as allowlists: a provider's headers describe
//! its account (its rate-limit quota on the gateway's key, cookies, its organisation, an echo
//! of the credential), a caller's may speak for an account the gateway's credential is not
//! (`OpenAI-Organization`), so neither passes unless named.
//!
//! - To the caller: framing, `content-type` and `content-encoding` (a body relayed untouched),
//!   then signalbox's own headers (added after this filter), and what `response.pass_headers`
//!   names. A `Retry-After` reaches a caller only on answers signalbox writes itself.
//! - To the provider: `content-type`, `accept`, what its kind needs (`anthropic-version` and,
//!   for an Anthropic caller, `anthropic-beta`; `openai-beta`), what `request.pass_headers`
//!   names (never a credential header), then what signalbox sets: the provider's `headers`,
//!   its credential, `Host`, `Content-Length`, `x-request-id`.
//!
//! Each filter builds a fresh map: in place (the kept entries moved) or from a borrowed map
//! (only the kept entries cloned).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::config::{HeaderGlobs, ProviderKind, CREDENTIAL_HEADERS, GATEWAY_WRITTEN_HEADERS};

/// Keep, of a provider's response header, what may reach the caller.
pub fn to_caller(headers: &mut HeaderMap, pass: &HeaderGlobs) {
    retain(headers, |name| for_caller(name, pass));
}

/// [`to_caller`] into a fresh map: what of the provider's `from` may reach the caller is
/// appended to `into`, in order (only the kept entries are cloned).
pub fn to_caller_from(from: &HeaderMap, into: &mut HeaderMap, pass: &HeaderGlobs) {
    for (name, value) in from {
        if for_caller(name, pass) {
            into.append(name.clone(), value.clone());
        }
    }
}

/// Whether a provider's response header named `name` may reach the caller.
fn for_caller(name: &HeaderName, pass: &HeaderGlobs) -> bool {
    matches!(
        *name,
        header::CONTENT_TYPE
            | header::CONTENT_LENGTH
            | header::TRANSFER_ENCODING
            | header::CONTENT_ENCODING
    ) || (!pass.is_empty() && pass.matches(name.as_str()))
}

/// Copy, of the caller's request header `from`, what may reach a provider of this kind into
/// `into`, in order (only the kept entries are cloned). `betas`: whether the caller's
/// `anthropic-beta` travels (an Anthropic caller, same dialect).
pub fn to_provider_from(
    from: &HeaderMap,
    into: &mut HeaderMap,
    kind: ProviderKind,
    betas: bool,
    pass: &HeaderGlobs,
) {
    for (name, value) in from {
        if for_provider(name, kind, betas, pass) {
            into.append(name.clone(), value.clone());
        }
    }
}

/// Whether a caller's header named `name` may reach a provider of this kind.
pub fn for_provider(
    name: &HeaderName,
    kind: ProviderKind,
    betas: bool,
    pass: &HeaderGlobs,
) -> bool {
    let n = name.as_str();
    // The dialect's version and beta headers are decided by the provider's kind alone.
    match n {
        "anthropic-version" => return kind == ProviderKind::Anthropic,
        "anthropic-beta" => return kind == ProviderKind::Anthropic && betas,
        "openai-beta" => return kind == ProviderKind::OpenAi,
        _ => {}
    }
    matches!(*name, header::CONTENT_TYPE | header::ACCEPT)
        || (!pass.is_empty()
            && pass.matches(n)
            && !CREDENTIAL_HEADERS.contains(&n)
            && !GATEWAY_WRITTEN_HEADERS.contains(&n)
            && !n.starts_with("x-llm-"))
}

/// Keep the entries whose name `keep` accepts, in order, moving them (names and values are not
/// copied; the map is rebuilt once).
fn retain(headers: &mut HeaderMap, keep: impl Fn(&HeaderName) -> bool) {
    let old = std::mem::replace(headers, HeaderMap::with_capacity(16));
    let mut kept = false;
    let mut last: Option<HeaderName> = None;
    for (name, value) in old {
        // `None`: another value of the previous name.
        if let Some(name) = name {
            kept = keep(&name);
            last = Some(name);
        }
        if kept {
            if let Some(name) = &last {
                headers.append(name.clone(), value);
            }
        }
    }
}

/// A caller's `x-request-id`, kept as the request's id when it is 1–128 visible ASCII
/// characters (anything else is replaced by signalbox's own).
pub fn caller_request_id(headers: &HeaderMap) -> Option<HeaderValue> {
    scan_caller(headers).request_id
}

/// What intake reads of a caller's headers, in one pass over them.
#[derive(Debug, Default)]
pub struct CallerHeaders {
    /// The caller's `x-request-id`, when sane ([`caller_request_id`]).
    pub request_id: Option<HeaderValue>,
    /// Whether any `x-llm-*` header came: without one (most requests), no steering header
    /// (`x-llm-route`, `-router`, `-metadata`, `-session`, the internal token) is looked up,
    /// each lookup a hash of its name.
    pub steering: bool,
}

/// Read [`CallerHeaders`] from a caller's request headers.
pub fn scan_caller(headers: &HeaderMap) -> CallerHeaders {
    let mut out = CallerHeaders::default();
    for (name, value) in headers {
        if name.as_str().starts_with("x-llm-") {
            out.steering = true;
        } else if out.request_id.is_none() && *name == crate::proxy::respond::names::X_REQUEST_ID {
            let bytes = value.as_bytes();
            let visible = bytes.iter().all(|b| (0x21..0x7f).contains(b));
            if !bytes.is_empty() && bytes.len() <= 128 && visible {
                out.request_id = Some(value.clone());
            }
        }
    }
    out
}

/// Decimal values below this come from a table built once: a `Content-Length` of most answers,
/// a duration in milliseconds, an attempt count. About 150 KiB, for two allocations saved on
/// each such header of every request.
const SMALL_INTS: u64 = 4096;

/// A header value holding `n` in decimal (a number past `u64` reads as `u64::MAX`).
/// `HeaderValue::from(u64)` allocates twice; a value below [`SMALL_INTS`] is a clone of a
/// static one (a pointer copy), a larger one allocates once.
pub fn int_value(n: impl TryInto<u64>) -> HeaderValue {
    let n: u64 = n.try_into().unwrap_or(u64::MAX);
    static SMALL: std::sync::LazyLock<Vec<HeaderValue>> = std::sync::LazyLock::new(|| {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SMALL_INTS as usize);
        for i in 0..SMALL_INTS {
            text.push_str(itoa::Buffer::new().format(i));
            ends.push(text.len());
        }
        // Leaked once, so each value is a `from_static`, whose clone copies a pointer.
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let v = HeaderValue::from_static(&text[start..end]);
                start = end;
                v
            })
            .collect()
    });
    match usize::try_from(n).ok().and_then(|i| SMALL.get(i)) {
        Some(v) => v.clone(),
        None => HeaderValue::from_str(itoa::Buffer::new().format(n))
            .unwrap_or_else(|_| HeaderValue::from_static("0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn int_values_read_as_their_number() {
        for n in [0, 7, 286, 2048, 4095, 4096, 70_000, u64::MAX] {
            assert_eq!(int_value(n).to_str().expect("ascii"), n.to_string());
        }
    }

    #[test]
    fn a_providers_account_headers_never_reach_the_caller() {
        let mut h = map(&[
            ("content-type", "application/json"),
            ("x-echo-auth", "Bearer sk-canary"),
            ("set-cookie", "a=b"),
            ("x-ratelimit-remaining-requests", "10"),
            ("server", "upstream"),
            ("location", "http://internal/"),
            ("openai-processing-ms", "12"),
            ("retry-after", "3"),
            ("content-length", "12"),
        ]);
        to_caller(&mut h, &HeaderGlobs::default());
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "content-length"]);
    }

    #[test]
    fn pass_headers_name_what_the_caller_may_see() {
        let mut h = map(&[
            ("x-ratelimit-remaining-requests", "10"),
            ("x-ratelimit-limit-requests", "20"),
            ("vary", "a"),
            ("vary", "b"),
            ("server", "upstream"),
        ]);
        let pass = HeaderGlobs(vec!["x-ratelimit-*".into(), "vary".into()]);
        to_caller(&mut h, &pass);
        assert_eq!(h.len(), 4);
        assert_eq!(h.get_all("vary").iter().count(), 2);
        assert!(h.get("server").is_none());
    }

    fn to_provider(h: &mut HeaderMap, kind: ProviderKind, betas: bool, pass: &HeaderGlobs) {
        let from = std::mem::take(h);
        to_provider_from(&from, h, kind, betas, pass);
    }

    #[test]
    fn a_callers_account_and_credential_headers_never_reach_a_provider() {
        let base = [
            ("authorization", "Bearer caller"),
            ("x-api-key", "caller"),
            ("openai-organization", "org-caller"),
            ("openai-project", "proj"),
            ("cookie", "c=1"),
            ("user-agent", "sdk"),
            ("content-type", "application/json"),
            ("accept", "text/event-stream"),
            ("openai-beta", "assistants=v2"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "tools"),
            ("x-llm-metadata", "{}"),
            ("x-trace", "t"),
        ];
        let mut h = map(&base);
        to_provider(&mut h, ProviderKind::OpenAi, false, &HeaderGlobs::default());
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "accept", "openai-beta"]);

        let mut h = map(&base);
        to_provider(
            &mut h,
            ProviderKind::Anthropic,
            true,
            &HeaderGlobs::default(),
        );
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "accept",
                "anthropic-version",
                "anthropic-beta"
            ]
        );

        // A wildcard never lets a credential, signalbox's own or a framing header through.
        let mut h = map(&base);
        let pass = HeaderGlobs(vec!["*".into()]);
        to_provider(&mut h, ProviderKind::Anthropic, false, &pass);
        for gone in [
            "authorization",
            "x-api-key",
            "cookie",
            "x-llm-metadata",
            "anthropic-beta",
        ] {
            assert!(h.get(gone).is_none(), "{gone} passed");
        }
        assert_eq!(h.get("x-trace").unwrap(), "t");
        assert_eq!(h.get("openai-organization").unwrap(), "org-caller");
    }

    #[test]
    fn one_pass_over_a_callers_headers_finds_the_id_and_any_steering_header() {
        let plain = map(&[
            ("content-type", "application/json"),
            ("x-request-id", "r-1"),
        ]);
        let seen = scan_caller(&plain);
        assert!(!seen.steering);
        assert_eq!(seen.request_id.unwrap(), "r-1");
        for name in [
            "x-llm-route",
            "x-llm-session",
            "x-llm-internal-token",
            "X-LLM-Metadata",
        ] {
            let h = map(&[("accept", "*/*"), (name, "v")]);
            assert!(scan_caller(&h).steering, "{name}");
        }
        let lookalike = map(&[("x-llmroute", "v"), ("x-llm", "v")]);
        assert!(!scan_caller(&lookalike).steering);
    }

    #[test]
    fn a_callers_request_id_is_kept_when_it_is_sane() {
        let ok = map(&[("x-request-id", "trace-123")]);
        assert_eq!(caller_request_id(&ok).unwrap(), "trace-123");
        let long = "a".repeat(129);
        for bad in ["", "has space", long.as_str()] {
            let h = map(&[("x-request-id", bad)]);
            assert!(caller_request_id(&h).is_none(), "{bad:?} kept");
        }
    }
}
