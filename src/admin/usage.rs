//! `GET /admin/usage?by=key|user|model|provider&since=…&until=…`: the ledger's aggregates.
//!
//! `since` (inclusive) and `until` (exclusive) are RFC 3339 instants (`2026-12-01T00:00:00Z`)
//! or unix seconds; both optional. Answered by the ledger's writer after the rows queued
//! before the call, so a request that finished is counted.

use std::borrow::Cow;

use http::Response;
use serde_json::json;

use super::{error, json};
use crate::ledger::{Ledger, UsageBy, UsageQuery};
use crate::rfc3339;

pub async fn handle(ledger: Option<&Ledger>, query: Option<&str>) -> Response<Vec<u8>> {
    let Some(ledger) = ledger else {
        return error(
            404,
            "ledger_not_configured",
            "no ledger is configured (the `ledger` section): usage is not recorded",
        );
    };
    let mut by = UsageBy::Provider;
    let (mut since_ms, mut until_ms) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "by" => match UsageBy::parse(v) {
                Some(b) => by = b,
                None => {
                    return error(
                        400,
                        "invalid_request",
                        "`by` is one of key, user, model, provider",
                    )
                }
            },
            "since" | "until" => {
                let Some(ms) = parse_instant(v) else {
                    return error(
                        400,
                        "invalid_request",
                        &format!(
                            "`{k}` is an RFC 3339 instant (2026-12-01T00:00:00Z) or unix seconds"
                        ),
                    );
                };
                if k == "since" {
                    since_ms = Some(ms);
                } else {
                    until_ms = Some(ms);
                }
            }
            _ => {
                return error(
                    400,
                    "invalid_request",
                    "usage takes `by`, `since` and `until`",
                )
            }
        }
    }
    let q = UsageQuery {
        by,
        since_ms,
        until_ms,
    };
    match ledger.usage(q).await {
        Ok(rows) => {
            let cost: f64 = rows.iter().map(|r| r.cost_usd).sum();
            json(
                200,
                &json!({
                    "by": by.as_str(),
                    "since": since_ms.map(rfc3339::format_ms),
                    "until": until_ms.map(rfc3339::format_ms),
                    "backend": ledger.backend(),
                    "total_cost_usd": cost,
                    "groups": rows,
                }),
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "usage query failed");
            error(503, "ledger_unavailable", "the ledger could not be read")
        }
    }
}

/// Unix milliseconds of `2026-12-01T08:00:00Z` (fractions and `+hh:mm` offsets allowed) or
/// of unix seconds.
fn parse_instant(v: &str) -> Option<i64> {
    instant_of(&percent_decoded(v)?)
}

/// [`parse_instant`] of a decoded value.
fn instant_of(v: &str) -> Option<i64> {
    if let Ok(secs) = v.parse::<i64>() {
        return secs.checked_mul(1000);
    }
    rfc3339::parse_ms(v)
}

/// A query value with its `%XX` escapes decoded (`None`: not UTF-8 once decoded). A `+` stays
/// a `+` (the sign of an offset, not a space), and a `%` without two hex digits after it stays
/// as it is: no instant contains one, so such a value is refused all the same.
fn percent_decoded(v: &str) -> Option<Cow<'_, str>> {
    percent_encoding::percent_decode_str(v).decode_utf8().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_parse_as_rfc3339_or_unix_seconds() {
        assert_eq!(parse_instant("1796126400"), Some(1_796_126_400_000));
        assert_eq!(
            parse_instant("2026-12-01T12:00:00Z"),
            Some(1_796_126_400_000)
        );
        assert_eq!(
            parse_instant("2026-12-01T13:00:00.25%2B01:00"),
            Some(1_796_126_400_250)
        );
        assert_eq!(
            parse_instant("2026-12-01T12%3A00%3A00Z"),
            Some(1_796_126_400_000)
        );
        assert_eq!(parse_instant("yesterday"), None);
        assert_eq!(
            parse_instant("2026-12-01T12:00:00%Z"),
            None,
            "a broken escape"
        );
        assert_eq!(parse_instant("2026-13-01T00:00:00Z"), None);
    }

    #[test]
    fn a_plus_is_an_offset_sign_and_a_broken_escape_is_refused() {
        assert_eq!(
            parse_instant("2026-12-01T13:00:00+01:00"),
            Some(1_796_126_400_000),
            "`+` is not a space here"
        );
        for broken in [
            "2026-12-01T12:00:00Z%",
            "2026-12-01T12:00:00Z%2",
            "%+11796126400",
            "17961%zz26400",
            "%ff",
            "%20",
        ] {
            assert_eq!(parse_instant(broken), None, "{broken}");
        }
    }

    /// The decoder the crate replaced: `None` for a broken escape or a result not UTF-8.
    fn percent_decoded_by_hand(v: &str) -> Option<String> {
        let b = v.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).ok()
    }

    proptest::proptest! {
        /// Escaping any characters of an instant, or writing a broken escape, reads the same
        /// as with the hand-written decoder this replaced.
        #[test]
        fn decoding_agrees_with_the_hand_written_decoder(
            template in proptest::sample::select(vec![
                "2026-12-01T13:00:00.25+01:00",
                "2026-12-01T12:00:00Z",
                "1796126400",
                "2026-12-01t12:00:00.999-00:30",
            ]),
            escape in proptest::collection::vec(0u8..4, 32),
            noise in "(%|%2|%zz|%+1|%ff|%25|%3a|\\+|[0-9:TZ. -])?",
        ) {
            let mut v = String::new();
            for (c, how) in template.chars().zip(escape.iter().chain(std::iter::repeat(&0))) {
                match how {
                    1 => v.push_str(&format!("%{:02X}", u32::from(c))),
                    2 => v.push_str(&format!("%{:02x}", u32::from(c))),
                    _ => v.push(c),
                }
            }
            for at in [0, v.len() / 2, v.len()] {
                let mut noisy = v.clone();
                noisy.insert_str(at, &noise);
                let by_hand = percent_decoded_by_hand(&noisy).and_then(|d| instant_of(&d));
                proptest::prop_assert_eq!(parse_instant(&noisy), by_hand, "{}", noisy);
            }
            proptest::prop_assert_eq!(parse_instant(&v), instant_of(template));
        }
    }
}
