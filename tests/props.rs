//! Property tests for every parser that reads what a provider or an operator wrote: the SSE
//! reader, `Retry-After` and the providers' rate-limit headers, the config loader and the
//! condition compiler, and the translators between the chat and messages dialects.
//!
//! Each property runs a bounded number of cases in `cargo test` (see [`config`]); a longer
//! run is `PROPTEST_CASES=100000 cargo test --test props`. A failing case is printed shrunk;
//! the ones that found a bug are kept as fixed `#[test]`s next to their property.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

/// `cases` unless `PROPTEST_CASES` says otherwise (a longer run), without a regressions file
/// (a case worth keeping becomes a fixed `#[test]`).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text of the characters parsers trip on: ASCII, multi-byte UTF-8, a NUL, a tab, `:`.
fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            8 => proptest::char::range('a', 'z'),
            2 => Just(' '),
            1 => Just(':'),
            1 => Just('\t'),
            1 => Just('\0'),
            1 => Just('é'),
            1 => Just('€'),
            1 => Just('🦀'),
            1 => Just('"'),
        ],
        0..max,
    )
    .prop_map(|c| c.into_iter().collect())
}

mod sse {
    //! signalbox's SSE reader against `sse-stream` (which follows the WHATWG rules): the same
    //! data, event for event, however the stream is cut into chunks.

    use std::convert::Infallible;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use futures_core::Stream;
    use proptest::prelude::*;
    use signalbox::adapters::chat_messages::sse::{SseEvent, SseReader};
    use signalbox::adapters::chat_messages::BadUpstream;

    use super::{config, text};

    /// What `sse-stream` reads from the whole stream: the data of each event that has one (it
    /// drops comments, and blocks of only `event:`/`id:`/`retry:` carry no data).
    fn reference(stream: &[u8]) -> Vec<String> {
        let chunks = futures_util::stream::iter([Ok::<_, Infallible>(
            bytes::Bytes::copy_from_slice(stream),
        )]);
        let mut events = pin!(sse_stream::SseByteStream::new(chunks));
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        loop {
            match events.as_mut().poll_next(&mut cx) {
                Poll::Ready(Some(Ok(e))) => out.extend(e.data),
                Poll::Ready(Some(Err(e))) => panic!("the reference refused the stream: {e}"),
                Poll::Ready(None) => return out,
                Poll::Pending => unreachable!("an iterator stream is always ready"),
            }
        }
    }

    /// What signalbox's reader hands on, fed `chunks` in order: the data events before the
    /// input ends, then those `finish` adds.
    fn ours<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> (Vec<String>, Vec<String>) {
        fn into<'s>(
            seen: &'s mut Vec<String>,
        ) -> impl FnMut(SseEvent<'_>) -> Result<(), BadUpstream> + 's {
            |ev| {
                if let SseEvent::Data(d) = ev {
                    seen.push(String::from_utf8(d.to_vec()).expect("data of UTF-8 lines is UTF-8"));
                }
                Ok(())
            }
        }
        let mut reader = SseReader::default();
        let (mut fed, mut at_end) = (Vec::new(), Vec::new());
        for c in chunks {
            reader.feed(c, &mut into(&mut fed)).expect("feed");
        }
        reader.finish(&mut into(&mut at_end)).expect("finish");
        (fed, at_end)
    }

    /// One line of a stream, without its end.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => (prop::bool::ANY, text(24)).prop_map(|(space, v)| format!("data:{}{v}", if space { " " } else { "" })),
            1 => Just("data".to_string()),
            1 => Just("data:".to_string()),
            2 => text(16).prop_map(|c| format!(":{c}")),
            1 => text(8).prop_map(|e| format!("event: {e}")),
            1 => text(8).prop_map(|i| format!("id: {i}")),
            1 => (0u32..100_000).prop_map(|r| format!("retry: {r}")),
            1 => ("(dat|datas|Data|DATA|x|event|id)", text(8)).prop_map(|(f, v)| format!("{f}:{v}")),
            1 => "[a-z ]{0,6}",
        ]
    }

    fn line_end() -> impl Strategy<Value = &'static str> {
        prop_oneof![4 => Just("\n"), 2 => Just("\r\n"), 1 => Just("\r")]
    }

    /// A stream of events: lines, each event closed by a blank line, each line ended by LF,
    /// CRLF or CR; and maybe a last event left open.
    fn stream() -> impl Strategy<Value = String> {
        let event = (
            proptest::collection::vec((line(), line_end()), 0..5),
            line_end(),
        );
        (
            proptest::collection::vec(event, 0..6),
            proptest::collection::vec((line(), line_end()), 0..3),
            prop::option::of(line()),
        )
            .prop_map(|(events, open, last)| {
                let mut s = String::new();
                for (lines, blank) in events {
                    for (l, end) in lines {
                        s.push_str(&l);
                        s.push_str(end);
                    }
                    s.push_str(blank);
                }
                for (l, end) in open {
                    s.push_str(&l);
                    s.push_str(end);
                }
                s.extend(last);
                s
            })
    }

    /// Streams of the pieces SSE is made of in any order, for what the grammar above misses.
    fn soup() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("data:"),
                Just("data: "),
                Just("data"),
                Just("\n"),
                Just("\r"),
                Just("\r\n"),
                Just(":"),
                Just(" "),
                Just("event:"),
                Just("id:"),
                Just("x"),
                Just("é"),
            ],
            0..40,
        )
        .prop_map(|p| p.concat())
    }

    /// The stream cut at `cuts` (positions, in any order, duplicates allowed).
    fn pieces<'a>(stream: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut from = 0;
        for c in cuts {
            out.push(&stream[from..c]);
            from = c;
        }
        out.push(&stream[from..]);
        out
    }

    fn agrees(stream: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
        let want = reference(stream);
        // The events a stream closed at its end would add: what `finish` hands on.
        let closed = [stream, b"\n\n"].concat();
        let want_at_end = reference(&closed).split_off(want.len());
        let whole = ours([stream]);
        prop_assert_eq!(&whole.0, &want, "whole stream");
        prop_assert_eq!(&whole.1, &want_at_end, "at the end of the whole stream");
        for cut in 0..=stream.len() {
            let split = ours([&stream[..cut], &stream[cut..]]);
            prop_assert_eq!(&split, &whole, "cut at byte {}", cut);
        }
        prop_assert_eq!(&ours(stream.chunks(1)), &whole, "byte by byte");
        let with_empty = stream.chunks(1).flat_map(|b| [b, &b""[..]]);
        prop_assert_eq!(
            &ours(with_empty),
            &whole,
            "byte by byte, empty chunks between"
        );
        prop_assert_eq!(&ours(pieces(stream, cuts)), &whole, "cut at {:?}", cuts);
        Ok(())
    }

    /// Found by the property: a lone `\r` did not end a line (the two `data:` lines here were
    /// read as one, `"\rdata:"`).
    #[test]
    fn a_lone_cr_ends_a_line() {
        let stream = b"data:\rdata:\n\n";
        assert_eq!(reference(stream), vec!["\n"]);
        assert_eq!(ours([&stream[..]]), (vec!["\n".to_string()], vec![]));
        agrees(stream, &[]).expect("agrees");
    }

    /// A `\r` at the end of one chunk and its `\n` at the start of a later one are one line
    /// end, empty chunks between them or not.
    #[test]
    fn a_crlf_split_across_chunks_is_one_line_end() {
        let parts: [&[u8]; 4] = [b"data: a\r", b"", b"\ndata: b\r", b"\n\r\n"];
        assert_eq!(ours(parts), (vec!["a\nb".to_string()], vec![]));
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn events_match_an_independent_parser_at_every_split(
            stream in stream(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            agrees(stream.as_bytes(), &cuts)?;
        }

        #[test]
        fn any_mix_of_sse_pieces_reads_as_the_independent_parser_reads_it(
            stream in soup(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            agrees(stream.as_bytes(), &cuts)?;
        }

        #[test]
        fn any_bytes_are_read_without_a_panic(
            stream in proptest::collection::vec(any::<u8>(), 0..256),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut reader = SseReader::default();
            let mut on = |_: SseEvent<'_>| Ok(());
            for p in pieces(&stream, &cuts) {
                prop_assert!(reader.feed(p, &mut on).is_ok());
            }
            prop_assert!(reader.finish(&mut on).is_ok());
        }
    }
}

mod headers {
    //! `Retry-After` and the providers' rate-limit headers: any text is read without a panic,
    //! what is read stays in range, and the forms providers write read back as written.

    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use http::{HeaderMap, HeaderValue};
    use proptest::prelude::*;
    use signalbox::attempt::outcome::parse_retry_after;
    use signalbox::limits::provider::{exhausted_for, parse_go_duration};

    use super::config;

    /// The longest pause a rate-limit header imposes (`limits::provider`).
    const MAX_PAUSE: Duration = Duration::from_secs(3_600);

    /// Header-like text: what a provider could put in a value, and then some.
    fn header_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ 0-9.:+-]{0,24}",
            "[ 0-9a-zA-Z.,:+-]{0,40}",
            "([0-9]{0,25}(\\.[0-9]{0,6})?(h|m|s|ms|us|µs|ns|x|)){0,4}",
        ]
    }

    /// An instant on a whole second, in the years providers answer in.
    fn now() -> impl Strategy<Value = SystemTime> {
        (1_500_000_000u64..2_500_000_000).prop_map(|s| UNIX_EPOCH + Duration::from_secs(s))
    }

    /// `d` as Go's `Duration.String()` writes it (OpenAI's `x-ratelimit-reset-*`): `1h2m3.5s`,
    /// `6m0s`, `20ms`, `1.5µs`, `0s`.
    fn go_format(d: Duration) -> String {
        fn trimmed(whole: u128, frac: u128, digits: usize) -> String {
            let f = format!("{frac:0digits$}");
            let f = f.trim_end_matches('0');
            if f.is_empty() {
                whole.to_string()
            } else {
                format!("{whole}.{f}")
            }
        }
        let ns = d.as_nanos();
        match ns {
            0 => "0s".to_string(),
            1..1_000 => format!("{ns}ns"),
            1_000..1_000_000 => format!("{}µs", trimmed(ns / 1_000, ns % 1_000, 3)),
            1_000_000..1_000_000_000 => {
                format!("{}ms", trimmed(ns / 1_000_000, ns % 1_000_000, 6))
            }
            _ => {
                let (h, m) = (ns / 3_600_000_000_000, ns / 60_000_000_000 % 60);
                let s = trimmed(ns / 1_000_000_000 % 60, ns % 1_000_000_000, 9);
                match (h, m) {
                    (0, 0) => format!("{s}s"),
                    (0, m) => format!("{m}m{s}s"),
                    (h, m) => format!("{h}h{m}m{s}s"),
                }
            }
        }
    }

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= Duration::from_micros(1)
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.append(*k, v);
            }
        }
        h
    }

    const NAMES: [&str; 12] = [
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ];

    /// Found by the property: a reset past what a `Duration` holds panicked (in
    /// `Duration::from_secs_f64`) on the request path; it reads as the longest pause now.
    #[test]
    fn a_reset_too_long_for_a_duration_is_the_longest_pause() {
        let huge = "20000000000000000000000h";
        assert_eq!(parse_go_duration(huge), Some(Duration::MAX));
        let h = headers(&[
            ("x-ratelimit-remaining-tokens", "0".to_string()),
            ("x-ratelimit-reset-tokens", huge.to_string()),
        ]);
        assert_eq!(exhausted_for(&h, UNIX_EPOCH), Some(MAX_PAUSE));
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn retry_after_reads_any_text_within_its_cap(
            value in header_text(),
            now in now(),
            cap_s in 0u64..100_000,
        ) {
            let cap = Duration::from_secs(cap_s);
            if let Some(d) = parse_retry_after(&value, now, cap) {
                prop_assert!(d <= cap, "{:?} over the cap {:?}", d, cap);
            }
        }

        #[test]
        fn retry_after_delta_seconds_read_back(
            secs in prop_oneof![0u64..10_000, any::<u64>()],
            pad in "[ \t]{0,2}",
            now in now(),
            cap_s in 1u64..100_000,
        ) {
            let cap = Duration::from_secs(cap_s);
            let got = parse_retry_after(&format!("{pad}{secs}{pad}"), now, cap);
            prop_assert_eq!(got, Some(Duration::from_secs(secs).min(cap)));
            let negative = parse_retry_after(&format!("-{secs}"), now, cap);
            prop_assert_eq!(negative, Some(Duration::ZERO));
        }

        #[test]
        fn retry_after_http_dates_read_back(
            offset in -100_000i64..100_000,
            now in now(),
            cap_s in 1u64..100_000,
        ) {
            let cap = Duration::from_secs(cap_s);
            let at = if offset >= 0 {
                now + Duration::from_secs(offset.unsigned_abs())
            } else {
                now - Duration::from_secs(offset.unsigned_abs())
            };
            let want = Duration::from_secs(u64::try_from(offset).unwrap_or(0)).min(cap);
            let date = httpdate::fmt_http_date(at);
            prop_assert_eq!(parse_retry_after(&date, now, cap), Some(want), "{}", date);
        }

        #[test]
        fn go_durations_read_any_text_without_a_panic(value in header_text()) {
            let _ = parse_go_duration(&value);
        }

        #[test]
        fn go_durations_read_back_as_go_writes_them(
            d in prop_oneof![
                (0u64..1_000_000).prop_map(Duration::from_nanos),
                (0u64..100_000_000).prop_map(Duration::from_micros),
                (0u64..10_000_000).prop_map(Duration::from_millis),
            ],
        ) {
            let text = go_format(d);
            let got = parse_go_duration(&text);
            prop_assert!(got.is_some_and(|g| close(g, d)), "{} read as {:?}", text, got);
        }

        #[test]
        fn rate_limit_headers_of_any_value_rest_a_key_at_most_an_hour(
            windows in proptest::collection::vec(
                (0usize..6, prop_oneof![3 => Just("0".to_string()), 1 => header_text()], header_text()),
                0..6,
            ),
            now in now(),
        ) {
            let pairs: Vec<_> = windows
                .into_iter()
                .flat_map(|(w, remaining, reset)| [(NAMES[2 * w], remaining), (NAMES[2 * w + 1], reset)])
                .collect();
            if let Some(d) = exhausted_for(&headers(&pairs), now) {
                prop_assert!(!d.is_zero() && d <= MAX_PAUSE, "{:?}", d);
            }
        }

        #[test]
        fn an_exhausted_window_rests_the_key_until_its_reset(
            window in 0usize..6,
            reset_ms in 1u64..10_000_000,
            remaining in prop_oneof![Just(0u64), 1u64..1_000],
            now in now(),
        ) {
            let (remaining_name, reset_name) = (NAMES[2 * window], NAMES[2 * window + 1]);
            let reset = Duration::from_millis(reset_ms);
            let text = if window < 2 {
                go_format(reset)
            } else {
                let now_ms = i64::try_from(now.duration_since(UNIX_EPOCH).expect("after").as_millis()).expect("ms");
                signalbox::rfc3339::format_ms(now_ms + i64::try_from(reset_ms).expect("ms"))
            };
            let got = exhausted_for(&headers(&[(remaining_name, remaining.to_string()), (reset_name, text.clone())]), now);
            if remaining == 0 {
                prop_assert!(got.is_some_and(|g| close(g, reset.min(MAX_PAUSE))), "{} read as {:?}", text, got);
            } else {
                prop_assert_eq!(got, None);
            }
        }
    }
}
