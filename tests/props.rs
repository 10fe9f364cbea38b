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

mod config_text {
    //! The config loader and the condition compiler: any text is refused or accepted without
    //! a panic and well within a second; conditions that are well formed compile, and match
    //! exactly when the language's rules say they do.

    use std::time::{Duration, Instant};

    use proptest::prelude::*;
    use serde_yaml::{Mapping, Value};
    use signalbox::config::compile::compile_condition;
    use signalbox::config::condition::{FactValue, Facts, Field, MAX_CLAUSES, MAX_DEPTH};

    use super::config;

    /// The bound on one load or one compile, however hostile the input.
    const BOUND: Duration = Duration::from_secs(1);

    /// The commented example config, every key in it.
    const EXAMPLE: &str = include_str!("../conf/signalbox.yaml");

    fn timed<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
        let start = Instant::now();
        let out = f();
        let took = start.elapsed();
        prop_assert!(took < BOUND, "{} took {:?}", what, took);
        Ok(out)
    }

    /// What may replace a value in the example: wrong types, extremes, YAML's own syntax.
    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(vec![
                "0",
                "-1",
                "1e400",
                "-0",
                "18446744073709551616",
                "9223372036854775807",
                "0.5",
                "nan",
                ".inf",
                "true",
                "null",
                "~",
                "\"\"",
                "[]",
                "{}",
                "[[[[]]]]",
                "{ a: }",
                "*a",
                "&a x",
                "!!binary aGk=",
                "!tag x",
                "1h",
                "0s",
                "-5s",
                "1.5ms",
                "99999999h",
                "openai",
                "anthropic",
                "http://127.0.0.1:1/v1",
                "gopher://x",
                "\"\\u0000\"",
                "'",
                "\"",
                "|",
                ">",
                "- x",
                "? x",
                "@",
                "%YAML 1.2",
                "---",
                "...",
                "é",
                "0x10",
                "0o7",
                "+1",
                "1_000",
                "2026-12-01T00:00:00Z",
                "$regex",
                "{ $and: [] }",
            ])
            .prop_map(str::to_string),
            "[ -~]{0,12}",
        ]
    }

    /// One edit of the example's lines.
    #[derive(Debug, Clone)]
    enum Edit {
        Delete(usize),
        Duplicate(usize),
        /// The text after the line's first `: ` replaced.
        Value(usize, String),
        Indent(usize, usize),
        Outdent(usize),
        Insert(usize, String),
        /// A byte cut off the end of the text.
        Truncate(usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        let at = any::<usize>();
        prop_oneof![
            1 => at.prop_map(Edit::Delete),
            1 => at.prop_map(Edit::Duplicate),
            4 => (at, token()).prop_map(|(i, t)| Edit::Value(i, t)),
            1 => (at, 1usize..4).prop_map(|(i, n)| Edit::Indent(i, n)),
            1 => at.prop_map(Edit::Outdent),
            1 => (at, token()).prop_map(|(i, t)| Edit::Insert(i, t)),
            1 => at.prop_map(Edit::Truncate),
        ]
    }

    fn edited(edits: &[Edit]) -> String {
        let mut lines: Vec<String> = EXAMPLE.lines().map(str::to_string).collect();
        let mut truncate = None;
        for e in edits {
            let n = lines.len().max(1);
            match e {
                Edit::Delete(i) if !lines.is_empty() => {
                    lines.remove(i % n);
                }
                Edit::Duplicate(i) if !lines.is_empty() => {
                    let l = lines[i % n].clone();
                    lines.insert(i % n, l);
                }
                Edit::Value(i, t) if !lines.is_empty() => {
                    let l = &mut lines[i % n];
                    if let Some(c) = l.find(": ") {
                        l.replace_range(c + 2.., t);
                    } else {
                        l.push_str(t);
                    }
                }
                Edit::Indent(i, k) if !lines.is_empty() => {
                    lines[i % n].insert_str(0, &" ".repeat(*k))
                }
                Edit::Outdent(i) if !lines.is_empty() => {
                    let l = &mut lines[i % n];
                    let trimmed = l.strip_prefix("  ").unwrap_or(l).to_string();
                    *l = trimmed;
                }
                Edit::Insert(i, t) => lines.insert(i % (lines.len() + 1), t.clone()),
                Edit::Truncate(i) => truncate = Some(*i),
                _ => {}
            }
        }
        let mut text = lines.join("\n");
        if let Some(i) = truncate {
            let mut cut = i % (text.len() + 1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        text
    }

    #[test]
    fn the_example_config_loads() {
        signalbox::config::parse(EXAMPLE).expect("conf/signalbox.yaml is valid");
    }

    /// A config of one rule whose condition is `when`, YAML lines indented under it.
    fn with_condition(when: &str) -> String {
        format!(
            "providers:\n  a: {{ kind: openai, base_url: \"http://127.0.0.1:1/v1\" }}\n\
             models:\n  m: {{ deployments: [{{ provider: a, model: up }}] }}\n\
             chains:\n  c: [m]\n\
             rules:\n  - then: auto:c\n    when:{when}\n"
        )
    }

    /// Refused, in bounded time: the fastest of three loads under [`BOUND`], or (on a machine
    /// loaded enough to slow everything) under 20 loads of the example config measured in the
    /// same run — an expansion of the aliases would take thousands of times longer either way.
    fn refused_in_bounded_time(text: &str) -> String {
        let fastest = |f: &dyn Fn()| {
            (0..3)
                .map(|_| {
                    let start = Instant::now();
                    f();
                    start.elapsed()
                })
                .min()
                .unwrap_or_default()
        };
        let took = fastest(&|| {
            let _ = signalbox::config::parse(text);
        });
        let example = fastest(&|| {
            let _ = signalbox::config::parse(EXAMPLE);
        });
        assert!(
            took < BOUND || took < example * 20,
            "{took:?} (the example config loads in {example:?})"
        );
        signalbox::config::parse(text)
            .expect_err("refused")
            .to_string()
    }

    /// YAML's alias bomb, ten aliases of ten aliases twelve deep: refused (serde_yaml stops
    /// after 100 alias jumps an event; signalbox sooner), not expanded.
    #[test]
    fn an_alias_bomb_is_refused_in_bounded_time() {
        let mut bomb = String::from("\n      a0: &a0 [x, x, x, x, x, x, x, x, x, x]");
        for i in 1..12 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            bomb.push_str(&format!("\n      a{i}: &a{i} [{refs}]"));
        }
        let e = refused_in_bounded_time(&with_condition(&bomb));
        assert!(e.contains("YAML aliases"), "{e}");
    }

    /// Found by the bound: a wide anchor replayed by many aliases stays under serde_yaml's
    /// jump limit and stood for a million values (5 s to load 8 KiB in a debug build).
    #[test]
    fn a_wide_alias_bomb_is_refused_in_bounded_time() {
        let xs = vec!["x"; 1000].join(", ");
        let refs = vec!["*a0"; 1000].join(", ");
        let text = with_condition(&format!("\n      a0: &a0 [{xs}]\n      a1: [{refs}]"));
        let e = refused_in_bounded_time(&text);
        assert!(e.contains("YAML aliases"), "{e}");
    }

    /// Aliases that stand for a few values more load as before.
    #[test]
    fn modest_aliases_still_load() {
        let text = with_condition(" { $or: [ &t { params.tools: true }, *t, *t ] }");
        signalbox::config::parse(&text).expect("valid");
    }

    // === the condition language, modelled ===

    /// A constant of a condition, or a request's value.
    #[derive(Debug, Clone, PartialEq)]
    enum V {
        S(String),
        N(f64),
        B(bool),
    }

    impl V {
        fn yaml(&self) -> Value {
            match self {
                V::S(s) => Value::String(s.clone()),
                V::N(n) => Value::Number((*n).into()),
                V::B(b) => Value::Bool(*b),
            }
        }

        fn same_type(&self, o: &V) -> bool {
            matches!(
                (self, o),
                (V::S(_), V::S(_)) | (V::N(_), V::N(_)) | (V::B(_), V::B(_))
            )
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        S,
        N,
        B,
        /// `metadata.*`: any type.
        Any,
    }

    const FIELDS: [(&str, Kind); 9] = [
        ("params.stream", Kind::B),
        ("params.tools", Kind::B),
        ("params.model", Kind::S),
        ("params.endpoint", Kind::S),
        ("params.max_tokens", Kind::N),
        ("budget.used_pct", Kind::N),
        ("key.id", Kind::S),
        ("metadata.team", Kind::Any),
        ("metadata.tier", Kind::Any),
    ];

    #[derive(Debug, Clone)]
    enum Op {
        Eq(V),
        Ne(V),
        /// `$gt`, `$gte`, `$lt`, `$lte`.
        Ord(&'static str, f64),
        In(Vec<V>, bool),
        Regex(&'static str),
    }

    impl Op {
        fn name(&self) -> &'static str {
            match self {
                Op::Eq(_) => "$eq",
                Op::Ne(_) => "$ne",
                Op::Ord(o, _) => o,
                Op::In(_, false) => "$in",
                Op::In(_, true) => "$nin",
                Op::Regex(_) => "$regex",
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Cond {
        /// A field and its operators (all must hold); a lone `$eq` may be written bare.
        Leaf(usize, Vec<Op>, bool),
        And(Vec<Cond>),
        Or(Vec<Cond>),
    }

    fn value(kind: Kind) -> BoxedStrategy<V> {
        let s = proptest::sample::select(vec!["a", "b", "ab", "chat.completions", ""])
            .prop_map(|s| V::S(s.to_string()));
        let n = proptest::sample::select(vec![-1.0, 0.0, 1.0, 2.5, 100.0]).prop_map(V::N);
        let b = any::<bool>().prop_map(V::B);
        match kind {
            Kind::S => s.boxed(),
            Kind::N => n.boxed(),
            Kind::B => b.boxed(),
            Kind::Any => prop_oneof![s, n, b].boxed(),
        }
    }

    fn op(kind: Kind) -> BoxedStrategy<Op> {
        let mut ops = vec![
            value(kind).prop_map(Op::Eq).boxed(),
            value(kind).prop_map(Op::Ne).boxed(),
            (proptest::collection::vec(value(kind), 1..4), any::<bool>())
                .prop_map(|(l, negate)| Op::In(l, negate))
                .boxed(),
        ];
        if matches!(kind, Kind::N | Kind::Any) {
            let ord = proptest::sample::select(vec!["$gt", "$gte", "$lt", "$lte"]);
            let n = proptest::sample::select(vec![-1.0, 0.0, 1.0, 2.5, 100.0]);
            ops.push((ord, n).prop_map(|(o, n)| Op::Ord(o, n)).boxed());
        }
        if matches!(kind, Kind::S | Kind::Any) {
            let p = proptest::sample::select(vec!["^a", "b$", "a|c", "^[a-c]+$", "\\.", "(?i)AB"]);
            ops.push(p.prop_map(Op::Regex).boxed());
        }
        proptest::strategy::Union::new(ops).boxed()
    }

    fn leaf() -> impl Strategy<Value = Cond> {
        (0..FIELDS.len())
            .prop_flat_map(|f| {
                (
                    Just(f),
                    proptest::collection::vec(op(FIELDS[f].1), 1..3),
                    any::<bool>(),
                )
            })
            .prop_map(|(f, mut ops, bare)| {
                // An operator appears once per field (a YAML mapping's keys are unique).
                let mut seen = Vec::new();
                ops.retain(|o| {
                    let fresh = !seen.contains(&o.name());
                    seen.push(o.name());
                    fresh
                });
                Cond::Leaf(f, ops, bare)
            })
    }

    fn condition() -> impl Strategy<Value = Cond> {
        leaf().prop_recursive(5, 48, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 1..4).prop_map(Cond::And),
                proptest::collection::vec(inner, 1..4).prop_map(Cond::Or),
            ]
        })
    }

    impl Cond {
        fn yaml(&self) -> Value {
            let mut m = Mapping::new();
            match self {
                Cond::Leaf(f, ops, bare) => {
                    let v = match ops.as_slice() {
                        [Op::Eq(v)] if *bare => v.yaml(),
                        ops => {
                            let mut o = Mapping::new();
                            for op in ops {
                                let v = match op {
                                    Op::Eq(v) | Op::Ne(v) => v.yaml(),
                                    Op::Ord(_, n) => Value::Number((*n).into()),
                                    Op::In(l, _) => {
                                        Value::Sequence(l.iter().map(V::yaml).collect())
                                    }
                                    Op::Regex(p) => Value::String((*p).to_string()),
                                };
                                o.insert(Value::String(op.name().to_string()), v);
                            }
                            Value::Mapping(o)
                        }
                    };
                    m.insert(Value::String(FIELDS[*f].0.to_string()), v);
                }
                Cond::And(parts) | Cond::Or(parts) => {
                    let key = if matches!(self, Cond::And(_)) {
                        "$and"
                    } else {
                        "$or"
                    };
                    m.insert(
                        Value::String(key.to_string()),
                        Value::Sequence(parts.iter().map(Cond::yaml).collect()),
                    );
                }
            }
            Value::Mapping(m)
        }

        /// The deepest nesting of `$and`/`$or`.
        fn groups(&self) -> usize {
            match self {
                Cond::Leaf(..) => 0,
                Cond::And(p) | Cond::Or(p) => 1 + p.iter().map(Cond::groups).max().unwrap_or(0),
            }
        }

        fn clauses(&self) -> usize {
            match self {
                Cond::Leaf(_, ops, _) => ops.len(),
                Cond::And(p) | Cond::Or(p) => p.iter().map(Cond::clauses).sum(),
            }
        }

        /// The language's rules, as the condition module's documentation states them: a
        /// missing value or one of another type makes a comparison false, `$ne` and `$nin`
        /// included.
        fn holds(&self, facts: &Req) -> bool {
            match self {
                Cond::And(p) => p.iter().all(|c| c.holds(facts)),
                Cond::Or(p) => p.iter().any(|c| c.holds(facts)),
                Cond::Leaf(f, ops, _) => {
                    let Some(v) = &facts.0[*f] else { return false };
                    ops.iter().all(|op| match op {
                        Op::Eq(c) => v == c,
                        Op::Ne(c) => v.same_type(c) && v != c,
                        Op::Ord(o, c) => match v {
                            V::N(n) => match *o {
                                "$gt" => n > c,
                                "$gte" => n >= c,
                                "$lt" => n < c,
                                _ => n <= c,
                            },
                            _ => false,
                        },
                        Op::In(l, false) => l.contains(v),
                        Op::In(l, true) => !l.contains(v) && l.iter().any(|c| c.same_type(v)),
                        Op::Regex(p) => match v {
                            V::S(s) => regex::Regex::new(p).expect("a valid pattern").is_match(s),
                            _ => false,
                        },
                    })
                }
            }
        }
    }

    /// One request's facts: a value (of any type) or none for each of [`FIELDS`].
    #[derive(Debug, Clone)]
    struct Req(Vec<Option<V>>);

    impl Facts for Req {
        fn get(&self, field: &Field) -> Option<FactValue<'_>> {
            let i = FIELDS
                .iter()
                .position(|(name, _)| Field::parse(name).as_ref() == Some(field))?;
            self.0[i].as_ref().map(|v| match v {
                V::S(s) => FactValue::Str(s),
                V::N(n) => FactValue::Num(*n),
                V::B(b) => FactValue::Bool(*b),
            })
        }
    }

    fn facts() -> impl Strategy<Value = Req> {
        proptest::collection::vec(prop::option::of(value(Kind::Any)), FIELDS.len()).prop_map(Req)
    }

    /// YAML-ish text a condition could be written in.
    fn condition_text() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                proptest::sample::select(vec![
                    "{",
                    "}",
                    "[",
                    "]",
                    ", ",
                    ": ",
                    "\n",
                    "  ",
                    "- ",
                    "$and",
                    "$or",
                    "$eq",
                    "$ne",
                    "$gt",
                    "$in",
                    "$nin",
                    "$regex",
                    "$bogus",
                    "params.stream",
                    "params.model",
                    "params.max_tokens",
                    "metadata.",
                    "metadata.x",
                    "key.id",
                    "budget.used_pct",
                    "nope.x",
                    "true",
                    "null",
                    "1e999",
                    "-3",
                    "\"(a+)+$\"",
                    "\"[\"",
                    "\"(?:a{1000}){1000}\"",
                    "&x ",
                    "*x",
                    "!!str ",
                    "? ",
                ])
                .prop_map(str::to_string),
                "[ -~]{1,6}",
            ],
            0..40,
        )
        .prop_map(|t| t.concat())
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn any_text_loads_or_is_refused_within_a_second(text in any::<String>()) {
            timed("parse", || signalbox::config::parse(&text).map(drop))?.ok();
        }

        #[test]
        fn an_edited_example_loads_or_is_refused_within_a_second(
            edits in proptest::collection::vec(edit(), 1..6),
        ) {
            let text = edited(&edits);
            timed("parse", || signalbox::config::parse(&text).map(drop))?.ok();
        }

        #[test]
        fn any_condition_text_compiles_or_is_refused_within_a_second(text in condition_text()) {
            // Text that is not YAML never reaches the compiler.
            if let Ok(raw) = serde_yaml::from_str::<Value>(&text) {
                let mut errs = Vec::new();
                let compiled = timed("compile", || compile_condition(&raw, "when", &mut errs))?;
                prop_assert_eq!(compiled.is_some(), errs.is_empty(), "{:?}", errs);
                if let Some(c) = compiled {
                    timed("match", || c.matches(&Req(vec![None; FIELDS.len()])))?;
                }
            }
        }

        #[test]
        fn well_formed_conditions_compile_and_match_by_the_rules(
            cond in condition(),
            requests in proptest::collection::vec(facts(), 1..6),
        ) {
            let text = serde_yaml::to_string(&cond.yaml()).expect("yaml");
            let raw: Value = serde_yaml::from_str(&text).expect("yaml");
            let mut errs = Vec::new();
            let compiled = timed("compile", || compile_condition(&raw, "when", &mut errs))?;
            let within = cond.groups() <= MAX_DEPTH && cond.clauses() <= MAX_CLAUSES;
            prop_assert_eq!(compiled.is_some(), within, "{}{:?}", text, errs);
            if let Some(c) = compiled {
                for r in &requests {
                    prop_assert_eq!(c.matches(r), cond.holds(r), "{}{:?}", text, r);
                }
            }
        }
    }
}

mod dialects {
    //! The translators between chat (OpenAI) and messages (Anthropic): a request translated and
    //! translated back keeps its messages, tools and tool results (up to the merges the
    //! mapping documents), and no body, valid or not, makes a translator panic.

    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};
    use signalbox::adapters::caller::CallerRequest;
    use signalbox::adapters::chat_messages::{
        anthropic_error_to_openai, chat_request_to_messages, chat_response_to_messages,
        messages_request_to_chat, messages_response_to_chat, openai_error_to_anthropic,
        ChatStreamToMessages, MessagesStreamToChat, ToChat, ToMessages,
    };
    use signalbox::catalog::surface::Surface;

    use super::{config, text};

    const TO_MESSAGES: ToMessages<'static> = ToMessages {
        upstream_model: "claude-up",
        default_max_tokens: 4096,
    };
    const TO_CHAT: ToChat<'static> = ToChat {
        upstream_model: "gpt-up",
        stream_usage: true,
    };

    // === what both dialects say, in one form ===

    /// One thing a turn holds.
    #[derive(Debug, Clone, PartialEq)]
    enum Piece {
        Text(String),
        Image(String),
        Call {
            id: String,
            name: String,
            args: Value,
        },
        Result {
            id: String,
            texts: Vec<String>,
        },
    }

    /// A request as the mapping promises to keep it: the system texts, the turns (consecutive
    /// messages of one role merged; tool results first in a user turn, tool calls last in an
    /// assistant turn, as the other dialect orders them; empty text dropped), the tools (a
    /// missing schema is the empty object schema) and the sampling bounds.
    #[derive(Debug, PartialEq)]
    struct Normal {
        system: Vec<String>,
        turns: Vec<(&'static str, Vec<Piece>)>,
        tools: Vec<(String, Option<String>, Value)>,
        /// `auto`, `none`, `required` or the forced tool's name; and whether calls may run in
        /// parallel.
        choice: Option<(String, bool)>,
        max_tokens: u64,
        stop: Vec<String>,
        stream: bool,
    }

    fn texts_of(content: Option<&Value>) -> Vec<String> {
        match content {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect()
    }

    fn push_turn(
        turns: &mut Vec<(&'static str, Vec<Piece>)>,
        role: &'static str,
        pieces: Vec<Piece>,
    ) {
        match turns.last_mut() {
            Some((r, p)) if *r == role => p.extend(pieces),
            _ if pieces.is_empty() => {}
            _ => turns.push((role, pieces)),
        }
    }

    /// The order the other dialect gives a turn's pieces.
    fn ordered(mut turns: Vec<(&'static str, Vec<Piece>)>) -> Vec<(&'static str, Vec<Piece>)> {
        turns.retain(|(_, p)| !p.is_empty());
        for (role, pieces) in &mut turns {
            let key = |p: &Piece| match (*role, p) {
                ("user", Piece::Result { .. }) => 0,
                ("assistant", Piece::Call { .. }) => 1,
                _ => usize::from(*role == "user"),
            };
            pieces.sort_by_key(key);
        }
        turns
    }

    fn default_schema() -> Value {
        json!({"type": "object", "properties": {}})
    }

    fn strings(v: Option<&Value>) -> Vec<String> {
        match v {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(l)) => l
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn chat_normal(body: &Value) -> Normal {
        let mut system = Vec::new();
        let mut turns = Vec::new();
        for m in body["messages"].as_array().into_iter().flatten() {
            let content = m.get("content");
            match m["role"].as_str().unwrap_or_default() {
                "system" | "developer" => system.extend(texts_of(content)),
                "user" => {
                    let pieces = match content {
                        Some(Value::Array(parts)) => parts
                            .iter()
                            .filter_map(|p| match p["type"].as_str() {
                                Some("image_url") => {
                                    Some(Piece::Image(p["image_url"]["url"].as_str()?.to_string()))
                                }
                                _ => Some(Piece::Text(p["text"].as_str()?.to_string())),
                            })
                            .filter(|p| *p != Piece::Text(String::new()))
                            .collect(),
                        c => texts_of(c).into_iter().map(Piece::Text).collect(),
                    };
                    push_turn(&mut turns, "user", pieces);
                }
                "assistant" => {
                    let mut pieces: Vec<Piece> =
                        texts_of(content).into_iter().map(Piece::Text).collect();
                    for c in m
                        .get("tool_calls")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let args = c["function"]["arguments"].as_str().unwrap_or("{}");
                        pieces.push(Piece::Call {
                            id: c["id"].as_str().unwrap_or_default().to_string(),
                            name: c["function"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            args: serde_json::from_str(args).expect("arguments are JSON"),
                        });
                    }
                    push_turn(&mut turns, "assistant", pieces);
                }
                "tool" => push_turn(
                    &mut turns,
                    "user",
                    vec![Piece::Result {
                        id: m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                        texts: texts_of(content),
                    }],
                ),
                r => panic!("a role the generator does not write: {r}"),
            }
        }
        let tools: Vec<_> = body
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|t| {
                let f = &t["function"];
                (
                    f["name"].as_str().unwrap_or_default().to_string(),
                    f.get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    f.get("parameters")
                        .filter(|p| !p.is_null())
                        .cloned()
                        .unwrap_or_else(default_schema),
                )
            })
            .collect();
        let parallel = body.get("parallel_tool_calls") != Some(&Value::Bool(false));
        let choice = match body.get("tool_choice") {
            _ if tools.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(c) => Some(
                c["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            None if parallel => None,
            None => Some("auto".to_string()),
        }
        .map(|c| {
            let parallel = parallel || c == "none";
            (c, parallel)
        });
        Normal {
            system,
            turns: ordered(turns),
            tools,
            choice,
            max_tokens: body
                .get("max_completion_tokens")
                .or(body.get("max_tokens"))
                .and_then(Value::as_u64)
                .unwrap_or(u64::from(TO_MESSAGES.default_max_tokens)),
            stop: strings(body.get("stop")),
            stream: body.get("stream") == Some(&Value::Bool(true)),
        }
    }

    fn messages_normal(body: &Value) -> Normal {
        let system = texts_of(body.get("system"));
        let mut turns = Vec::new();
        for t in body["messages"].as_array().into_iter().flatten() {
            let role = match t["role"].as_str() {
                Some("user") => "user",
                Some("assistant") => "assistant",
                r => panic!("a role the generator does not write: {r:?}"),
            };
            let pieces = match &t["content"] {
                Value::String(s) if s.is_empty() => Vec::new(),
                Value::String(s) => vec![Piece::Text(s.clone())],
                Value::Array(blocks) => blocks
                    .iter()
                    .filter_map(|b| match b["type"].as_str()? {
                        "text" => Some(Piece::Text(b["text"].as_str()?.to_string()))
                            .filter(|p| *p != Piece::Text(String::new())),
                        "image" => Some(Piece::Image(match b["source"]["type"].as_str()? {
                            "url" => b["source"]["url"].as_str()?.to_string(),
                            _ => format!(
                                "data:{};base64,{}",
                                b["source"]["media_type"].as_str()?,
                                b["source"]["data"].as_str()?
                            ),
                        })),
                        "tool_use" => Some(Piece::Call {
                            id: b["id"].as_str()?.to_string(),
                            name: b["name"].as_str()?.to_string(),
                            args: b.get("input").cloned().unwrap_or_else(|| json!({})),
                        }),
                        "tool_result" => Some(Piece::Result {
                            id: b["tool_use_id"].as_str()?.to_string(),
                            texts: texts_of(b.get("content")),
                        }),
                        other => panic!("a block the generator does not write: {other}"),
                    })
                    .collect(),
                other => panic!("content the generator does not write: {other}"),
            };
            push_turn(&mut turns, role, pieces);
        }
        let tools: Vec<_> = body
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or_default().to_string(),
                    t.get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    t.get("input_schema")
                        .cloned()
                        .unwrap_or_else(default_schema),
                )
            })
            .collect();
        let choice = body
            .get("tool_choice")
            .filter(|_| !tools.is_empty())
            .map(|c| {
                let name = match c["type"].as_str().unwrap_or_default() {
                    "any" => "required".to_string(),
                    "tool" => c["name"].as_str().unwrap_or_default().to_string(),
                    t => t.to_string(),
                };
                let parallel = c.get("disable_parallel_tool_use") != Some(&Value::Bool(true))
                    || name == "none";
                (name, parallel)
            });
        Normal {
            system,
            turns: ordered(turns),
            tools,
            choice,
            max_tokens: body["max_tokens"].as_u64().unwrap_or(0),
            stop: strings(body.get("stop_sequences")),
            stream: body.get("stream") == Some(&Value::Bool(true)),
        }
    }

    // === generated requests ===

    fn nonempty_text() -> impl Strategy<Value = String> {
        text(20).prop_map(|t| if t.is_empty() { "x".to_string() } else { t })
    }

    fn tool_id() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_-]{1,12}"
    }

    fn tool_name() -> impl Strategy<Value = String> {
        "[a-z_]{1,10}"
    }

    /// Small JSON: arguments, inputs and schemas.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            text(8).prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn json_object() -> impl Strategy<Value = Value> {
        proptest::collection::btree_map("[a-z]{1,6}", json_value(), 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    fn image_url() -> impl Strategy<Value = String> {
        prop_oneof![
            "https://[a-z]{1,8}\\.example/[a-z]{1,8}\\.png",
            (
                proptest::sample::select(vec![
                    "image/png",
                    "image/jpeg",
                    "image/gif",
                    "image/webp"
                ]),
                "[A-Za-z0-9+/]{4,16}={0,2}",
            )
                .prop_map(|(t, d)| format!("data:{t};base64,{d}")),
        ]
    }

    /// Content as a string or as text parts.
    fn chat_text_content(texts: Vec<String>, as_string: bool) -> Value {
        if as_string && texts.len() == 1 {
            Value::String(texts[0].clone())
        } else {
            Value::Array(
                texts
                    .into_iter()
                    .map(|t| json!({"type": "text", "text": t}))
                    .collect(),
            )
        }
    }

    fn chat_message() -> impl Strategy<Value = Value> {
        let texts = proptest::collection::vec(nonempty_text(), 1..3);
        prop_oneof![
            1 => (texts, any::<bool>(), prop::bool::weighted(0.2)).prop_map(|(t, s, dev)| {
                json!({"role": if dev { "developer" } else { "system" }, "content": chat_text_content(t, s)})
            }),
            4 => (
                proptest::collection::vec(prop_oneof![3 => nonempty_text().prop_map(Ok), 1 => image_url().prop_map(Err)], 1..4),
                any::<bool>(),
            )
                .prop_map(|(parts, as_string)| {
                    let content = match parts.as_slice() {
                        [Ok(t)] if as_string => Value::String(t.clone()),
                        parts => Value::Array(
                            parts
                                .iter()
                                .map(|p| match p {
                                    Ok(t) => json!({"type": "text", "text": t}),
                                    Err(url) => json!({"type": "image_url", "image_url": {"url": url}}),
                                })
                                .collect(),
                        ),
                    };
                    json!({"role": "user", "content": content})
                }),
            3 => (
                prop::option::of(nonempty_text()),
                proptest::collection::vec((tool_id(), tool_name(), json_object(), any::<bool>()), 0..3),
            )
                .prop_filter("an assistant message says something", |(t, c)| t.is_some() || !c.is_empty())
                .prop_map(|(text, calls)| {
                    let mut m = json!({"role": "assistant", "content": text});
                    if !calls.is_empty() {
                        m["tool_calls"] = calls
                            .into_iter()
                            .map(|(id, name, args, pretty)| {
                                let args = if pretty { serde_json::to_string_pretty(&args) } else { serde_json::to_string(&args) };
                                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.expect("json")}})
                            })
                            .collect();
                    }
                    m
                }),
            2 => (tool_id(), proptest::collection::vec(text(12), 0..3), any::<bool>()).prop_map(|(id, t, s)| {
                json!({"role": "tool", "tool_call_id": id, "content": chat_text_content(t, s)})
            }),
        ]
    }

    fn chat_tool() -> impl Strategy<Value = Value> {
        (
            tool_name(),
            prop::option::of(text(16)),
            prop::option::of(json_object()),
        )
            .prop_map(|(name, d, p)| {
                let mut f = json!({"name": name});
                if let Some(d) = d {
                    f["description"] = d.into();
                }
                if let Some(p) = p {
                    f["parameters"] = p;
                }
                json!({"type": "function", "function": f})
            })
    }

    /// A chat request of any shape the mapping carries both ways; it ends with the caller
    /// speaking (a final assistant turn is a prefill, refused toward chat).
    fn chat_request() -> impl Strategy<Value = Value> {
        (
            proptest::collection::vec(chat_message(), 0..8),
            nonempty_text(),
            proptest::collection::vec(chat_tool(), 0..3),
            prop::option::of(prop_oneof![
                Just(json!("auto")),
                Just(json!("none")),
                Just(json!("required")),
                tool_name().prop_map(|n| json!({"type": "function", "function": {"name": n}})),
            ]),
            prop::option::of(any::<bool>()),
            prop::option::of((1u64..200_000, any::<bool>())),
            prop::option::of(proptest::collection::vec(text(6), 1..4)),
            any::<bool>(),
        )
            .prop_map(
                |(mut messages, last, tools, choice, parallel, max, stop, stream)| {
                    messages.push(json!({"role": "user", "content": last}));
                    let mut req = json!({"model": "caller-model", "messages": messages});
                    if !tools.is_empty() {
                        req["tools"] = Value::Array(tools);
                        if let Some(c) = choice {
                            req["tool_choice"] = c;
                        }
                        if let Some(p) = parallel {
                            req["parallel_tool_calls"] = p.into();
                        }
                    }
                    if let Some((m, completion)) = max {
                        req[if completion {
                            "max_completion_tokens"
                        } else {
                            "max_tokens"
                        }] = m.into();
                    }
                    if let Some(s) = stop {
                        req["stop"] = s.into();
                    }
                    if stream {
                        req["stream"] = true.into();
                    }
                    req
                },
            )
    }

    fn user_block() -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => text(16).prop_map(|t| json!({"type": "text", "text": t})),
            1 => image_url().prop_map(|url| match url.strip_prefix("data:") {
                Some(rest) => {
                    let (media_type, data) = rest.split_once(";base64,").expect("a data URL");
                    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
                }
                None => json!({"type": "image", "source": {"type": "url", "url": url}}),
            }),
            2 => (tool_id(), prop::option::of(prop_oneof![
                text(12).prop_map(Value::String),
                proptest::collection::vec(text(12), 0..3)
                    .prop_map(|t| t.into_iter().map(|t| json!({"type": "text", "text": t})).collect()),
            ]))
                .prop_map(|(id, content)| {
                    let mut b = json!({"type": "tool_result", "tool_use_id": id});
                    if let Some(c) = content {
                        b["content"] = c;
                    }
                    b
                }),
        ]
    }

    fn assistant_block() -> impl Strategy<Value = Value> {
        prop_oneof![
            text(16).prop_map(|t| json!({"type": "text", "text": t})),
            (tool_id(), tool_name(), json_object())
                .prop_map(|(id, name, input)| json!({"type": "tool_use", "id": id, "name": name, "input": input})),
        ]
    }

    fn turn(role: &'static str) -> BoxedStrategy<Value> {
        let blocks = if role == "user" {
            user_block().boxed()
        } else {
            assistant_block().boxed()
        };
        prop_oneof![
            1 => text(16).prop_map(Value::String),
            3 => proptest::collection::vec(blocks, 1..4).prop_map(Value::Array),
        ]
        .prop_map(move |content| json!({"role": role, "content": content}))
        .boxed()
    }

    fn messages_tool() -> impl Strategy<Value = Value> {
        (
            tool_name(),
            prop::option::of(text(16)),
            prop::option::of(json_object()),
        )
            .prop_map(|(name, d, s)| {
                let mut t = json!({"name": name});
                if let Some(d) = d {
                    t["description"] = d.into();
                }
                if let Some(s) = s {
                    t["input_schema"] = s;
                }
                t
            })
    }

    /// A messages request of any shape the mapping carries both ways, ending with a user turn
    /// that says something.
    fn messages_request() -> impl Strategy<Value = Value> {
        (
            prop::option::of(prop_oneof![
                text(16).prop_map(Value::String),
                proptest::collection::vec(text(12), 0..3)
                    .prop_map(|t| t.into_iter().map(|t| json!({"type": "text", "text": t})).collect()),
            ]),
            proptest::collection::vec(prop_oneof![turn("user"), turn("assistant")], 0..7),
            nonempty_text(),
            proptest::collection::vec(messages_tool(), 0..3),
            prop::option::of((
                prop_oneof![
                    Just(json!({"type": "auto"})),
                    Just(json!({"type": "any"})),
                    Just(json!({"type": "none"})),
                    tool_name().prop_map(|n| json!({"type": "tool", "name": n})),
                ],
                any::<bool>(),
            )),
            1u64..200_000,
            prop::option::of(proptest::collection::vec(text(6), 0..5)),
            any::<bool>(),
        )
            .prop_map(|(system, mut turns, last, tools, choice, max_tokens, stop, stream)| {
                turns.push(json!({"role": "user", "content": [{"type": "text", "text": last}]}));
                let mut req = json!({"model": "caller-model", "messages": turns, "max_tokens": max_tokens});
                if let Some(s) = system {
                    req["system"] = s;
                }
                if !tools.is_empty() {
                    req["tools"] = Value::Array(tools);
                }
                if let Some((mut c, serial)) = choice {
                    if serial {
                        c["disable_parallel_tool_use"] = true.into();
                    }
                    req["tool_choice"] = c;
                }
                if let Some(s) = stop.filter(|s| s.len() <= 4) {
                    req["stop_sequences"] = s.into();
                }
                if stream {
                    req["stream"] = true.into();
                }
                req
            })
    }

    fn bytes_of(v: &Value) -> Vec<u8> {
        serde_json::to_vec(v).expect("json")
    }

    fn parsed(b: &[u8]) -> Value {
        serde_json::from_slice(b).expect("a translator writes JSON")
    }

    // === arbitrary bodies ===

    /// The words both dialects are made of, so arbitrary JSON reaches past the first check.
    const WORDS: [&str; 44] = [
        "model",
        "messages",
        "role",
        "content",
        "type",
        "text",
        "tool_calls",
        "id",
        "function",
        "name",
        "arguments",
        "tool_call_id",
        "system",
        "tools",
        "tool_choice",
        "max_tokens",
        "stream",
        "choices",
        "delta",
        "message",
        "finish_reason",
        "usage",
        "stop_reason",
        "input",
        "tool_use",
        "tool_result",
        "tool_use_id",
        "image_url",
        "url",
        "source",
        "data",
        "media_type",
        "index",
        "content_block",
        "user",
        "assistant",
        "tool",
        "image",
        "base64",
        "thinking",
        "signature",
        "error",
        "input_tokens",
        "message_start",
    ];

    fn word_json() -> impl Strategy<Value = Value> {
        let word = proptest::sample::select(&WORDS[..]).prop_map(str::to_string);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            prop_oneof![
                any::<i64>().prop_map(|n| json!(n)),
                any::<f64>().prop_map(|f| json!(f)),
                (0u64..5).prop_map(|n| json!(n))
            ],
            word.clone().prop_map(Value::String),
            text(8).prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 5, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((word.clone(), inner), 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    /// `v` with its `n`th node (in a walk of the tree, modulo its size) replaced by `with`.
    fn mutate(v: &mut Value, n: usize, with: Value) {
        fn size(v: &Value) -> usize {
            1 + match v {
                Value::Array(l) => l.iter().map(size).sum(),
                Value::Object(m) => m.values().map(size).sum(),
                _ => 0,
            }
        }
        fn walk(v: &mut Value, n: &mut usize, with: &mut Option<Value>) {
            if *n == 0 {
                if let Some(w) = with.take() {
                    *v = w;
                }
                return;
            }
            *n -= 1;
            match v {
                Value::Array(l) => l.iter_mut().for_each(|c| walk(c, n, with)),
                Value::Object(m) => m.values_mut().for_each(|c| walk(c, n, with)),
                _ => {}
            }
        }
        let mut n = n % size(v);
        walk(v, &mut n, &mut Some(with));
    }

    /// Every translator and reader of a body, on `body`: none may panic.
    fn translate_everything(body: &[u8]) {
        let _ = chat_request_to_messages(body, &TO_MESSAGES);
        let _ = messages_request_to_chat(body, &TO_CHAT);
        let _ = chat_response_to_messages(body, "caller-model");
        let _ = messages_response_to_chat(body, "caller-model");
        let _ = anthropic_error_to_openai(429, body);
        let _ = openai_error_to_anthropic(500, body);
        for surface in [
            Surface::ChatCompletions,
            Surface::Completions,
            Surface::Responses,
            Surface::Embeddings,
            Surface::Messages,
            Surface::CountTokens,
        ] {
            let _ = CallerRequest::parse(surface, Bytes::copy_from_slice(body));
        }
    }

    /// `events` as the two stream converters read them, cut at `cut`: none may panic.
    fn stream_everything(stream: &[u8], cut: usize) {
        let cut = cut % (stream.len() + 1);
        let mut out = BytesMut::new();
        let mut a = MessagesStreamToChat::new("caller-model", true);
        let mut b = ChatStreamToMessages::new("caller-model", true);
        for part in [&stream[..cut], &stream[cut..]] {
            let _ = a.feed(part, &mut out);
            let _ = b.feed(part, &mut out);
        }
        a.finish(&mut out);
        b.finish(&mut out);
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn chat_to_messages_and_back_keeps_messages_tools_and_results(req in chat_request()) {
            let want = chat_normal(&req);
            let messages = chat_request_to_messages(&bytes_of(&req), &TO_MESSAGES)
                .map_err(|e| TestCaseError::fail(format!("toward messages: {e}")))?;
            let messages: Value = parsed(&messages);
            prop_assert_eq!(&messages_normal(&messages), &want, "toward messages: {}", messages);
            let back = messages_request_to_chat(&bytes_of(&messages), &TO_CHAT)
                .map_err(|e| TestCaseError::fail(format!("back toward chat: {e}")))?;
            let back: Value = parsed(&back);
            prop_assert_eq!(&chat_normal(&back), &want, "back: {}", back);
        }

        #[test]
        fn messages_to_chat_and_back_keeps_messages_tools_and_results(req in messages_request()) {
            let want = messages_normal(&req);
            let chat = messages_request_to_chat(&bytes_of(&req), &TO_CHAT)
                .map_err(|e| TestCaseError::fail(format!("toward chat: {e}")))?;
            let chat: Value = parsed(&chat);
            prop_assert_eq!(&chat_normal(&chat), &want, "toward chat: {}", chat);
            let back = chat_request_to_messages(&bytes_of(&chat), &TO_MESSAGES)
                .map_err(|e| TestCaseError::fail(format!("back toward messages: {e}")))?;
            let back: Value = parsed(&back);
            prop_assert_eq!(&messages_normal(&back), &want, "back: {}", back);
        }

        #[test]
        fn an_edited_request_is_translated_or_refused_without_a_panic(
            req in prop_oneof![chat_request(), messages_request()],
            edits in proptest::collection::vec((any::<usize>(), word_json()), 1..4),
        ) {
            let mut req = req;
            for (n, with) in edits {
                mutate(&mut req, n, with);
            }
            translate_everything(&bytes_of(&req));
        }

        #[test]
        fn any_json_is_translated_or_refused_without_a_panic(body in word_json()) {
            translate_everything(&bytes_of(&body));
        }

        #[test]
        fn any_bytes_are_translated_or_refused_without_a_panic(body in proptest::collection::vec(any::<u8>(), 0..128)) {
            translate_everything(&body);
        }

        #[test]
        fn any_stream_of_json_events_is_converted_without_a_panic(
            events in proptest::collection::vec((prop::option::of(proptest::sample::select(&WORDS[..])), word_json()), 0..8),
            cut in any::<usize>(),
        ) {
            let mut stream = Vec::new();
            for (event, data) in events {
                if let Some(e) = event {
                    stream.extend_from_slice(format!("event: {e}\n").as_bytes());
                }
                stream.extend_from_slice(b"data: ");
                stream.extend_from_slice(&bytes_of(&data));
                stream.extend_from_slice(b"\n\n");
            }
            stream_everything(&stream, cut);
        }
    }
}
