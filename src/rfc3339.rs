//! Instants as RFC 3339 text, through the `time` crate: the one reader (the admin API's
//! `since` / `until`, Anthropic's rate-limit resets) and the one writer (the ledger's `time`
//! column, the admin usage answer).
//!
//! [`parse`] reads `2026-12-01T08:00:00Z` with a fraction of any length, `z` for `Z`, a
//! `±hh:mm` offset, and any one character between the date and the time (`T`, `t` or a space,
//! as RFC 3339 allows). A leap second (`:60`) is read as the nanosecond before the next second,
//! and only where one can fall (the last second of a month, UTC). The two hand-written parsers
//! this replaced also let through dates such as February 31 (as March 3), any character in
//! place of the `:`s, and offsets past 23 hours or followed by more text; those are refused now.

use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcDateTime};

/// An RFC 3339 instant (see the module documentation for what is accepted).
pub fn parse(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

/// Unix milliseconds of an RFC 3339 instant, a fraction beyond the millisecond dropped (toward
/// the past, before 1970 too).
pub fn parse_ms(text: &str) -> Option<i64> {
    let nanos = parse(text)?.unix_timestamp_nanos();
    i64::try_from(nanos.div_euclid(1_000_000)).ok()
}

/// `2026-12-01T08:25:23.123Z` for unix milliseconds (proleptic Gregorian, UTC). An instant past
/// the years `time` names (±9999) is written as the nearest one it names.
pub fn format_ms(time_ms: i64) -> String {
    let at = utc(i128::from(time_ms) * 1_000_000, time_ms < 0);
    format!("{}.{:03}Z", seconds(at), at.millisecond())
}

/// `2026-12-01T08:25:23Z` for unix seconds, as [`format_ms`] otherwise.
pub fn format_secs(secs: i64) -> String {
    format!(
        "{}Z",
        seconds(utc(i128::from(secs) * 1_000_000_000, secs < 0))
    )
}

fn utc(nanos: i128, negative: bool) -> UtcDateTime {
    UtcDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(if negative {
        UtcDateTime::MIN
    } else {
        UtcDateTime::MAX
    })
}

/// `YYYY-MM-DDTHH:MM:SS`.
fn seconds(at: UtcDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
    )
}

/// Howard Hinnant's civil-date formulas, which signalbox used before `time`: the reference the
/// differential tests (here and in the budget periods) compare `time` against.
#[cfg(test)]
pub(crate) mod hinnant {
    /// Days since 1970-01-01 as (year, month 1–12, day 1–31).
    pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        (yoe + era * 400 + i64::from(m <= 2), m, d)
    }

    /// The inverse: (year, month, day) to days since 1970-01-01.
    pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(m);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn whole_seconds_have_no_fraction() {
        assert_eq!(super::format_secs(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::format_secs(1_764_644_400), "2025-12-02T03:00:00Z");
        assert_eq!(
            super::format_ms(1_764_644_400_123),
            "2025-12-02T03:00:00.123Z"
        );
    }

    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use proptest::prelude::*;

    use super::hinnant::{civil_from_days, days_from_civil};
    use super::*;

    /// The writer `time` replaced (`ledger::store::rfc3339_ms`).
    fn format_ms_by_hand(time_ms: i64) -> String {
        let days = time_ms.div_euclid(86_400_000);
        let ms = time_ms.rem_euclid(86_400_000);
        let (y, m, d) = civil_from_days(days);
        let (h, mi, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{frac:03}Z")
    }

    /// The admin usage parser `time` replaced, to unix milliseconds.
    fn usage_parse_by_hand(v: &str) -> Option<i64> {
        let b = v.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
            return None;
        }
        let num = |r: std::ops::Range<usize>| v.get(r)?.parse::<i64>().ok();
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
            return None;
        }
        let mut rest = &v[19..];
        let mut ms = 0;
        if let Some(frac) = rest.strip_prefix('.') {
            let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
            let f = &frac[..digits];
            ms = format!("{f:0<3}").get(..3)?.parse::<i64>().ok()?;
            rest = &frac[digits..];
        }
        let offset_s = match rest {
            "Z" | "z" => 0,
            _ => {
                let sign = match rest.as_bytes().first()? {
                    b'+' => 1,
                    b'-' => -1,
                    _ => return None,
                };
                let oh = rest.get(1..3)?.parse::<i64>().ok()?;
                let om = rest.get(4..6)?.parse::<i64>().ok()?;
                sign * (oh * 3600 + om * 60)
            }
        };
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let days = days_from_civil(y, mo as u32, d as u32);
        Some(((days * 86_400 + h * 3600 + mi * 60 + s - offset_s) * 1000) + ms)
    }

    /// The rate-limit reset parser `time` replaced (`limits::provider`).
    fn reset_parse_by_hand(s: &str) -> Option<SystemTime> {
        let s = s.trim();
        let b = s.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
            return None;
        }
        let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<u32>().ok();
        let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
            return None;
        }
        let mut rest = &s[19..];
        let mut frac = 0.0;
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            frac = format!("0.{}", &r[..end]).parse().ok()?;
            rest = &r[end..];
        }
        let offset: i64 = match rest {
            "Z" | "z" => 0,
            o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => {
                let oh: i64 = o.get(1..3)?.parse().ok()?;
                let om: i64 = o.get(4..6)?.parse().ok()?;
                let v = oh * 3_600 + om * 60;
                if o.starts_with('-') {
                    -v
                } else {
                    v
                }
            }
            _ => return None,
        };
        let days = days_from_civil(i64::from(y), mo, d);
        let secs =
            days * 86_400 + i64::from(h) * 3_600 + i64::from(mi) * 60 + i64::from(sec) - offset;
        let secs = u64::try_from(secs).ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_secs_f64(frac))
    }

    /// Well-formed RFC 3339 text, as providers and operators write it: a real date, a second
    /// below 60, any fraction, `Z`/`z` or an offset, `T`/`t`/space.
    fn rfc3339_text() -> impl Strategy<Value = String> {
        (
            (1970i32..=9998, 1u8..=12, 1u8..=31),
            (0u8..24, 0u8..60, 0u8..60),
            proptest::option::of("[0-9]{1,12}"),
            prop_oneof![
                Just("Z".to_string()),
                Just("z".to_string()),
                (any::<bool>(), 0u8..24, 0u8..60).prop_map(|(minus, h, m)| format!(
                    "{}{h:02}:{m:02}",
                    if minus { '-' } else { '+' }
                )),
            ],
            prop::sample::select(vec!['T', 't', ' ']),
        )
            .prop_map(|((y, mo, d), (h, mi, s), frac, offset, sep)| {
                let d = d.min(time::Month::try_from(mo).expect("1 to 12").length(y));
                let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
                format!("{y:04}-{mo:02}-{d:02}{sep}{h:02}:{mi:02}:{s:02}{frac}{offset}")
            })
    }

    #[test]
    fn reads_fractions_offsets_and_separators() {
        assert_eq!(parse_ms("2026-12-01T12:00:00Z"), Some(1_796_126_400_000));
        assert_eq!(parse_ms("2026-12-01t12:00:00z"), Some(1_796_126_400_000));
        assert_eq!(parse_ms("2026-12-01 12:00:00Z"), Some(1_796_126_400_000));
        assert_eq!(
            parse_ms("2026-12-01T13:00:00.2509+01:00"),
            Some(1_796_126_400_250)
        );
        assert_eq!(parse_ms("1969-12-31T23:59:59.9999Z"), Some(-1));
        assert_eq!(parse_ms("2026-12-01T12:00:00"), None, "no offset");
        assert_eq!(
            parse_ms("2026-12-01T12:00:00+01:00 "),
            None,
            "trailing text"
        );
    }

    #[test]
    fn what_the_hand_written_parsers_let_through_is_refused() {
        for text in [
            "2026-02-31T00:00:00Z",
            "2026-12-01T12x00x00Z",
            "2026-12-01T12:00:00+24:00",
            "2026-12-01T12:00:00+01:00junk",
            "2026-12-01T12:00:60Z",
        ] {
            assert!(usage_parse_by_hand(text).is_some(), "{text}");
            assert_eq!(parse(text), None, "{text}");
        }
        // A leap second where one can fall is the nanosecond before the next second.
        assert_eq!(
            parse_ms("2016-12-31T23:59:60Z"),
            Some(1_483_228_799_999),
            "2017-01-01T00:00:00Z less a millisecond"
        );
    }

    #[test]
    fn pre_epoch_and_out_of_range_instants_are_written() {
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_ms(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_ms(i64::MIN), "-9999-01-01T00:00:00.000Z");
    }

    proptest! {
        #[test]
        fn writes_what_the_hand_written_formatter_wrote(
            ms in -62_135_596_800_000i64..253_402_300_800_000,
        ) {
            prop_assert_eq!(format_ms(ms), format_ms_by_hand(ms));
            prop_assert_eq!(parse_ms(&format_ms(ms)), Some(ms));
        }

        #[test]
        fn reads_what_the_hand_written_parsers_read(text in rfc3339_text()) {
            let ms = parse_ms(&text);
            prop_assert!(ms.is_some(), "{}", text);
            prop_assert_eq!(ms, usage_parse_by_hand(&text), "{}", text);
            let new = parse(&text).map(SystemTime::from);
            match (new, reset_parse_by_hand(&text)) {
                // The old reader added the fraction as an f64: equal to the microsecond.
                (Some(new), Some(old)) => {
                    let gap = new.duration_since(old).unwrap_or_else(|e| e.duration());
                    prop_assert!(gap < Duration::from_micros(1), "{}", text);
                }
                // The old reader refused instants before 1970 (an offset can reach there).
                (Some(new), None) => prop_assert!(new < UNIX_EPOCH, "{}", text),
                (None, old) => prop_assert!(false, "{} refused, was {:?}", text, old),
            }
        }

        #[test]
        fn days_are_the_dates_of_the_civil_formulas(days in -719_162i64..2_932_896) {
            let (y, m, d) = civil_from_days(days);
            prop_assert_eq!(days_from_civil(y, m, d), days);
            let date = OffsetDateTime::UNIX_EPOCH.date() + time::Duration::days(days);
            prop_assert_eq!(
                (i64::from(date.year()), u32::from(u8::from(date.month())), u32::from(date.day())),
                (y, m, d)
            );
        }
    }
}
