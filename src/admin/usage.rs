//! `GET /admin/usage?by=key|user|model|provider&since=…&until=…`: the ledger's aggregates.
//!
//! `since` (inclusive) and `until` (exclusive) are RFC 3339 instants (`2026-12-01T00:00:00Z`)
//! or unix seconds; both optional. Answered by the ledger's writer after the rows queued
//! before the call, so a request that finished is counted.

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
    let v = percent_decoded(v)?;
    if let Ok(secs) = v.parse::<i64>() {
        return secs.checked_mul(1000);
    }
    rfc3339::parse_ms(&v)
}

/// A query value with its `%XX` escapes decoded (`None`: a broken escape or not UTF-8).
fn percent_decoded(v: &str) -> Option<String> {
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
}
