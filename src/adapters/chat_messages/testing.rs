//! What the tests of every translation share: fixtures (recorded-style bodies and streams
//! under `tests/fixtures/`), a JSON reader, stream drivers and a seeded generator.

use bytes::BytesMut;
use serde_json::Value;

use super::BadUpstream;

/// A fixture's bytes: `fixture!("openai", "chat_request.json")`.
macro_rules! fixture {
    ($dialect:literal, $name:literal) => {{
        let bytes: &'static [u8] = include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/",
            $dialect,
            "/",
            $name
        ));
        bytes
    }};
}
pub(crate) use fixture;

pub(crate) fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

/// Something that converts a stream.
pub(crate) trait Converter {
    fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream>;
    fn finish(&mut self, out: &mut BytesMut);
}

impl Converter for super::MessagesStreamToChat {
    fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream> {
        super::MessagesStreamToChat::feed(self, chunk, out)
    }
    fn finish(&mut self, out: &mut BytesMut) {
        super::MessagesStreamToChat::finish(self, out);
    }
}

impl Converter for super::ChatStreamToMessages {
    fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream> {
        super::ChatStreamToMessages::feed(self, chunk, out)
    }
    fn finish(&mut self, out: &mut BytesMut) {
        super::ChatStreamToMessages::finish(self, out);
    }
}

/// Feed `input` cut at `cuts` (sorted offsets), then finish; the whole output.
pub(crate) fn run_split<C: Converter>(conv: &mut C, input: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        conv.feed(&input[at..cut], &mut out).expect("feed");
        at = cut;
    }
    conv.finish(&mut out);
    out.to_vec()
}

/// A small seeded generator (xorshift64*): reproducible random splits and garbage.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Sorted cut offsets into a buffer of `len` bytes.
    pub(crate) fn cuts(&mut self, len: usize) -> Vec<usize> {
        let n = self.below(len / 3 + 2);
        let mut cuts: Vec<usize> = (0..n).map(|_| self.below(len + 1)).collect();
        cuts.sort_unstable();
        cuts
    }
}

/// SSE output as (event name, data JSON) pairs; `[DONE]` as `("", null)`.
pub(crate) fn sse_events(out: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(out).expect("utf8 output");
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "every event ends with a blank line: {text}"
    );
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            let mut name = String::new();
            let mut data = None;
            for line in event.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(if d == "[DONE]" {
                        Value::Null
                    } else {
                        json(d.as_bytes())
                    });
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            (name, data.expect("a data line"))
        })
        .collect()
}
