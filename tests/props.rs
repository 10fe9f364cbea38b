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
