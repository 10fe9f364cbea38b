//! What a provider's own rate-limit headers say: whether the credential has exhausted a window
//! and when it resets, so signalbox routes away before the provider's 429.
//!
//! - OpenAI (and Groq, Together, vLLM behind gateways…): `x-ratelimit-remaining-requests` /
//!   `-tokens` with `x-ratelimit-reset-requests` / `-tokens` as a Go duration (`1s`, `6m0s`,
//!   `20ms`, `1h2m3.5s`).
//! - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining`
//!   with `-reset` as an RFC 3339 time.
//!
//! An exhausted window (remaining `0`) rests the key; a missing or unreadable reset is no
//! signal (the provider's 429 and `Retry-After` still cover it). For a provider whose
//! credential choice is `least_remaining_quota`, [`remaining`] also reads what is left of each
//! window, and for how long that reading holds.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use crate::rfc3339;

/// The longest pause a header may impose (a misread reset must not bench a key for a day).
const MAX_PAUSE: Duration = Duration::from_secs(3_600);

const OPENAI: [(&str, &str); 2] = [
    (
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
];
const ANTHROPIC: [(&str, &str); 4] = [
    (
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ),
    (
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ),
    (
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ),
    (
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ),
];

/// Whether `headers` has any of the remaining-quota names [`exhausted_for`] reads (one pass
/// over the names: most answers have none, and then nothing else is read, the clock included).
pub fn carries_remaining(headers: &HeaderMap) -> bool {
    headers.keys().any(|k| {
        let k = k.as_str();
        k.starts_with("x-ratelimit-remaining") || k.starts_with("anthropic-ratelimit-")
    })
}

/// How long the credential must rest: the latest reset among its exhausted windows.
pub fn exhausted_for(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    // Most answers carry none of these: one pass over the names first.
    if !carries_remaining(headers) {
        return None;
    }
    let exhausted = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() == "0")
    };
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let openai = OPENAI
        .iter()
        .filter(|(remaining, _)| exhausted(remaining))
        .filter_map(|(_, reset)| text(reset).and_then(parse_go_duration));
    let anthropic = ANTHROPIC
        .iter()
        .filter(|(remaining, _)| exhausted(remaining))
        .filter_map(|(_, reset)| rfc3339_wait(text(reset)?, now));
    openai
        .chain(anthropic)
        .max()
        .filter(|d| !d.is_zero())
        .map(|d| d.min(MAX_PAUSE))
}

/// How long a remaining-quota reading without a reset is believed.
pub const QUOTA_READING_TTL: Duration = Duration::from_secs(60);

/// What a provider's answer says is left of a credential's windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    /// Requests left in the request window, when the provider reports one.
    pub requests: Option<u64>,
    /// Tokens left (the fullest reported token window: the least left), when reported.
    pub tokens: Option<u64>,
    /// How long the reading holds: until the soonest reported window resets (then it refills),
    /// [`QUOTA_READING_TTL`] when none says, at most [`MAX_PAUSE`].
    pub holds_for: Duration,
}

/// What is left of the credential's windows, from the provider's headers; `None` when it
/// reports none.
pub fn remaining(headers: &HeaderMap, now: SystemTime) -> Option<Remaining> {
    let count =
        |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // Every reported window: (is it the request window, what is left, when it resets).
    let openai = OPENAI.iter().enumerate().filter_map(|(i, (left, reset))| {
        Some((
            i == 0,
            count(left)?,
            text(reset).and_then(parse_go_duration),
        ))
    });
    let anthropic = ANTHROPIC
        .iter()
        .enumerate()
        .filter_map(|(i, (left, reset))| {
            Some((
                i == 0,
                count(left)?,
                text(reset).and_then(|t| rfc3339_wait(t, now)),
            ))
        });
    let (mut requests, mut tokens, mut soonest) = (None, None, None::<Duration>);
    for (is_requests, left, reset) in openai.chain(anthropic) {
        let slot: &mut Option<u64> = if is_requests {
            &mut requests
        } else {
            &mut tokens
        };
        *slot = Some(slot.map_or(left, |s| s.min(left)));
        if let Some(r) = reset {
            soonest = Some(soonest.map_or(r, |s| s.min(r)));
        }
    }
    (requests.is_some() || tokens.is_some()).then(|| Remaining {
        requests,
        tokens,
        holds_for: soonest.unwrap_or(QUOTA_READING_TTL).min(MAX_PAUSE),
    })
}

/// How long until an Anthropic reset (an RFC 3339 time); zero for one in the past.
fn rfc3339_wait(text: &str, now: SystemTime) -> Option<Duration> {
    let at = rfc3339::parse(text.trim())?;
    Some(
        SystemTime::from(at)
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    )
}

/// A Go duration as OpenAI writes resets: `1s`, `6m0s`, `20ms`, `1h2m3.5s`. (Public for the
/// property tests.)
#[doc(hidden)]
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut total = 0.0_f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "h" => 3_600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * unit;
        rest = &rest[unit_end..];
    }
    // Past what a `Duration` holds (`20000000000000000000000h`) is as long as it gets: the
    // caller caps it.
    (total.is_finite() && total >= 0.0)
        .then(|| Duration::try_from_secs_f64(total).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(
            parse_go_duration("1h2m3.5s"),
            Some(Duration::from_secs_f64(3_723.5))
        );
        assert_eq!(parse_go_duration("soon"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    #[test]
    fn the_remaining_quota_and_how_long_it_holds() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_126_400); // 2026-12-01T12:00:00Z
        let openai = headers(&[
            ("x-ratelimit-remaining-requests", "42"),
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-remaining-tokens", "9000"),
            ("x-ratelimit-reset-tokens", "1m"),
        ]);
        assert_eq!(
            remaining(&openai, now),
            Some(Remaining {
                requests: Some(42),
                tokens: Some(9000),
                holds_for: Duration::from_secs(20),
            })
        );
        // Anthropic's token windows: the one with the least left counts.
        let anthropic = headers(&[
            ("anthropic-ratelimit-requests-remaining", "7"),
            ("anthropic-ratelimit-input-tokens-remaining", "500"),
            ("anthropic-ratelimit-output-tokens-remaining", "80"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-12-01T12:00:45Z",
            ),
        ]);
        assert_eq!(
            remaining(&anthropic, now),
            Some(Remaining {
                requests: Some(7),
                tokens: Some(80),
                holds_for: Duration::from_secs(45),
            })
        );
        // No reset: believed for a minute.
        let bare = headers(&[("x-ratelimit-remaining-requests", "3")]);
        assert_eq!(
            remaining(&bare, now).map(|r| (r.requests, r.holds_for)),
            Some((Some(3), QUOTA_READING_TTL))
        );
        assert_eq!(remaining(&headers(&[("x-other", "1")]), now), None);
        assert_eq!(
            remaining(&headers(&[("x-ratelimit-remaining-requests", "many")]), now),
            None
        );
    }

    #[test]
    fn only_an_exhausted_window_rests_the_key_until_its_reset() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_126_400); // 2026-12-01T12:00:00Z
        let openai = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-remaining-tokens", "1200"),
            ("x-ratelimit-reset-tokens", "59m"),
        ]);
        assert_eq!(exhausted_for(&openai, now), Some(Duration::from_secs(360)));
        let fine = headers(&[
            ("x-ratelimit-remaining-requests", "5"),
            ("x-ratelimit-reset-requests", "6m0s"),
        ]);
        assert_eq!(exhausted_for(&fine, now), None);
        let anthropic = headers(&[
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2026-12-01T12:00:30Z"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            (
                "anthropic-ratelimit-requests-reset",
                "2026-12-01T13:00:05+01:00",
            ),
        ]);
        assert_eq!(
            exhausted_for(&anthropic, now),
            Some(Duration::from_secs(30))
        );
        let far = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "30h"),
        ]);
        assert_eq!(exhausted_for(&far, now), Some(MAX_PAUSE), "capped");
        let past = headers(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-12-01T11:00:00Z"),
        ]);
        assert_eq!(
            exhausted_for(&past, now),
            None,
            "a reset in the past is no signal"
        );
    }
}
