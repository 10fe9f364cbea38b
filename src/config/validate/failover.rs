//! The bounds on one request: `failover` (attempts, deadline, timeouts, same-target retries
//! and their backoff)
//! and `limits` (request body and header sizes, and the deadlines on reading a request).

use std::time::Duration;

use crate::config::schema::{FailoverSection, HedgeSection, LimitsSection};
use crate::config::types::{Failover, Hedge, HedgeAfter, Limits};
use crate::config::values::{parse_duration, parse_size, positive_duration};
use crate::config::ConfigError;

/// The largest `failover.transient_retries` accepted: more only hammers a failing target.
const TRANSIENT_RETRIES_CEILING: u32 = 5;
pub(super) use crate::config::types::MAX_ATTEMPTS_CEILING;
/// The largest `limits.max_request_body` accepted: bodies are held in memory per request.
const BODY_CEILING: u64 = 1 << 30;
/// The smallest `limits.max_request_headers` accepted.
const HEADERS_FLOOR: u64 = 1024;

pub(super) fn validate_failover(f: &FailoverSection, errs: &mut Vec<ConfigError>) -> Failover {
    if f.max_attempts == 0 || f.max_attempts > MAX_ATTEMPTS_CEILING {
        errs.push(ConfigError::new(
            "failover.max_attempts",
            format!("must be between 1 and {MAX_ATTEMPTS_CEILING}"),
        ));
    }
    if f.transient_retries > TRANSIENT_RETRIES_CEILING {
        errs.push(ConfigError::new(
            "failover.transient_retries",
            format!("must be between 0 and {TRANSIENT_RETRIES_CEILING}"),
        ));
    }
    let deadline = parse_duration(&f.deadline, "failover.deadline", errs);
    let backoff = parse_duration(&f.transient_backoff, "failover.transient_backoff", errs);
    let hold = parse_duration(&f.first_chunk_hold, "failover.first_chunk_hold", errs);
    Failover {
        transient_retries: f.transient_retries.min(TRANSIENT_RETRIES_CEILING),
        transient_backoff: backoff.unwrap_or_default(),
        max_attempts: f.max_attempts.clamp(1, MAX_ATTEMPTS_CEILING),
        deadline: deadline.filter(|d| !d.is_zero()),
        ttfb_timeout: positive_duration(&f.ttfb_timeout, "failover.ttfb_timeout", errs),
        connect_timeout: positive_duration(&f.connect_timeout, "failover.connect_timeout", errs),
        first_chunk_hold: hold.filter(|d| !d.is_zero()),
        stream_idle_timeout: positive_duration(
            &f.stream_idle_timeout,
            "failover.stream_idle_timeout",
            errs,
        ),
        hedge: f
            .hedge
            .as_ref()
            .map(|h| validate_hedge(h, "failover.hedge", errs)),
    }
}

/// `hedge.min_after` when absent.
const DEFAULT_HEDGE_MIN_AFTER: Duration = Duration::from_millis(200);
/// `hedge.max_share` when absent.
const DEFAULT_HEDGE_MAX_SHARE: f64 = 0.1;

/// A `hedge` section (a policy's, or `failover.hedge`) at `path`.
pub(super) fn validate_hedge(h: &HedgeSection, path: &str, errs: &mut Vec<ConfigError>) -> Hedge {
    let after_path = format!("{path}.after");
    let raw = h.after.trim();
    let after = match raw.strip_prefix('p') {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            match n.parse::<u8>() {
                Ok(p) if (1..=99).contains(&p) => HedgeAfter::Percentile(p),
                _ => {
                    errs.push(ConfigError::new(
                        &after_path,
                        "a percentile must be between p1 and p99",
                    ));
                    HedgeAfter::Percentile(90)
                }
            }
        }
        _ => HedgeAfter::Fixed(positive_duration(raw, &after_path, errs)),
    };
    let min_after = h.min_after.as_deref().map_or(DEFAULT_HEDGE_MIN_AFTER, |m| {
        parse_duration(m, &format!("{path}.min_after"), errs).unwrap_or(DEFAULT_HEDGE_MIN_AFTER)
    });
    let max_share = h.max_share.unwrap_or(DEFAULT_HEDGE_MAX_SHARE);
    if !(max_share > 0.0 && max_share <= 1.0) {
        errs.push(ConfigError::new(
            format!("{path}.max_share"),
            "must be above 0 and at most 1",
        ));
    }
    Hedge {
        after,
        min_after,
        max_share: max_share.clamp(f64::MIN_POSITIVE, 1.0),
    }
}

pub(super) fn validate_limits(l: &LimitsSection, errs: &mut Vec<ConfigError>) -> Limits {
    let body = parse_size(&l.max_request_body, "limits.max_request_body", errs);
    let headers = parse_size(&l.max_request_headers, "limits.max_request_headers", errs);
    if body == 0 || body > BODY_CEILING {
        errs.push(ConfigError::new(
            "limits.max_request_body",
            "must be between 1 byte and 1GiB",
        ));
    }
    if headers < HEADERS_FLOOR {
        errs.push(ConfigError::new(
            "limits.max_request_headers",
            "must be at least 1KiB",
        ));
    }
    Limits {
        max_request_body: usize::try_from(body.min(BODY_CEILING)).unwrap_or(usize::MAX),
        max_request_headers: usize::try_from(headers).unwrap_or(usize::MAX),
        header_timeout: positive_duration(&l.header_timeout, "limits.header_timeout", errs),
        body_timeout: positive_duration(&l.body_timeout, "limits.body_timeout", errs),
        idle_timeout: positive_duration(&l.idle_timeout, "limits.idle_timeout", errs),
    }
}
