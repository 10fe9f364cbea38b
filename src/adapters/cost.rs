//! `usage.cost_usd` (seed 004): what an answer cost — its reported usage × the serving
//! deployment's price, the same figure its budgets are charged — written into the answer's own
//! `usage` object, in either dialect, whole or streamed, translated or not.
//!
//! It runs on the bytes the relay hands the caller, after the dialect's rewriter or translator
//! ([`super::relay::Relay`]), so one splice serves every pair of dialects:
//! - a whole JSON answer (the rewriters hold it, and release it whole at its end): its
//!   top-level `usage` gains `"cost_usd"` first; a length-framed answer was announced with
//!   room for it ([`SPLICE_MAX`]) and gives back as much trailing padding as the splice took;
//! - a stream: the events that report usage — OpenAI's usage chunk, a Responses stream's final
//!   `response.usage`, Anthropic's `message_delta` — gain it, priced from the usage the stream
//!   has reported so far (Anthropic's input tokens come in `message_start`, its output tokens
//!   in `message_delta`).
//!
//! Only a priced deployment's answer is touched; an unpriced one pays nothing for this.

use bytes::{BufMut, Bytes, BytesMut};

use super::json;
use super::stream::Usage;
use crate::config::Price;
use crate::limits::budget::cost_micro_usd;

/// The most bytes the splice adds: `"cost_usd":` (11), a micro-USD `u64` as a decimal (at
/// most 20 digits and a point) and the comma (1).
pub const SPLICE_MAX: usize = 11 + 21 + 1;

const USAGE_KEYS: &[&[u8]] = &[b"usage", b"response"];
const USAGE_KEY: &[&[u8]] = &[b"usage"];

/// The splice for one attempt's answer.
#[derive(Debug, Clone)]
pub struct CostSplice {
    price: Price,
    sse: bool,
    /// Some of the answer has already been relayed (so a later chunk is not the whole body).
    relayed: bool,
}

impl CostSplice {
    pub fn new(price: Price, sse: bool) -> Self {
        Self {
            price,
            sse,
            relayed: false,
        }
    }

    /// Splice the cost into the relayed chunk: `usage` is what the answer has reported so far
    /// (after this chunk); `framed` when the response keeps a `Content-Length` (the splice then
    /// takes its bytes from the trailing padding).
    pub fn apply(
        &mut self,
        body: &mut Option<Bytes>,
        eos: bool,
        usage: Option<Usage>,
        framed: bool,
    ) {
        let Some(chunk) = body.as_ref().filter(|c| !c.is_empty()) else {
            return;
        };
        let first = !self.relayed;
        self.relayed = true;
        let Some(usage) = usage else {
            return;
        };
        let cost = cost_micro_usd(
            &self.price,
            usage.prompt_tokens,
            usage.cache_read_tokens,
            usage.completion_tokens,
        );
        if self.sse {
            if memchr::memmem::find(chunk, b"\"usage\"").is_some() {
                if let Some(out) = splice_events(chunk, cost) {
                    *body = Some(out);
                }
            }
        } else if first && eos {
            // The whole answer in one chunk: the rewriters release a held JSON body at once.
            if let Some(out) = splice_document(chunk, cost, framed) {
                *body = Some(out);
            }
        }
    }
}

/// `"cost_usd":<usd>,` for a cost in micro-USD (`0.0035`, `12`, `0`), trailing zeros dropped.
fn field(cost_micro: u64, comma: bool, out: &mut BytesMut) {
    out.put_slice(b"\"cost_usd\":");
    let mut ints = itoa::Buffer::new();
    out.put_slice(ints.format(cost_micro / 1_000_000).as_bytes());
    let frac = cost_micro % 1_000_000;
    if frac > 0 {
        let mut digits = [b'0'; 6];
        let mut f = frac;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (f % 10) as u8;
            f /= 10;
        }
        let len = 6 - digits.iter().rev().take_while(|d| **d == b'0').count();
        out.put_u8(b'.');
        out.put_slice(&digits[..len]);
    }
    if comma {
        out.put_u8(b',');
    }
}

/// The offset just inside the `{` of a `usage` object value, and whether it has members.
fn object_start(doc: &[u8], value: std::ops::Range<usize>) -> Option<(usize, bool)> {
    let v = doc.get(value.clone())?;
    if v.first() != Some(&b'{') {
        return None;
    }
    let empty = v[1..].iter().all(|b| b.is_ascii_whitespace() || *b == b'}');
    Some((value.start + 1, !empty))
}

/// Where in `doc` (a JSON object) the cost goes: its top-level `usage`, else a Responses
/// event's `response.usage`.
fn insertion(doc: &[u8]) -> Option<(usize, bool)> {
    let scan = json::scan_object_lenient(doc, USAGE_KEYS).ok()?;
    if let Some(u) = scan.get(0) {
        return object_start(doc, u.value.clone());
    }
    let response = scan.get(1)?.value.clone();
    let inner = doc.get(response.clone())?;
    let nested = json::scan_object_lenient(inner, USAGE_KEY).ok()?;
    let u = nested.get(0)?.value.clone();
    let (at, members) = object_start(inner, u)?;
    Some((response.start + at, members))
}

/// A whole JSON answer with the cost spliced into its usage; `None` to leave it as it is (no
/// usage object, or a framed body without the padding to give back).
fn splice_document(doc: &[u8], cost: u64, framed: bool) -> Option<Bytes> {
    let (at, members) = insertion(doc)?;
    let mut field_bytes = BytesMut::with_capacity(SPLICE_MAX);
    field(cost, members, &mut field_bytes);
    let mut end = doc.len();
    if framed {
        let pad = doc.iter().rev().take_while(|b| **b == b' ').count();
        if pad < field_bytes.len() {
            return None;
        }
        end -= field_bytes.len();
    }
    let mut out = BytesMut::with_capacity(end + field_bytes.len());
    out.put_slice(&doc[..at]);
    out.put_slice(&field_bytes);
    out.put_slice(&doc[at..end]);
    Some(out.freeze())
}

/// A stream chunk (whole events) with the cost spliced into every `data:` event that reports
/// usage; `None` when none does.
fn splice_events(chunk: &[u8], cost: u64) -> Option<Bytes> {
    let mut out: Option<BytesMut> = None;
    let mut copied = 0;
    let mut start = 0;
    while start < chunk.len() {
        let end = memchr::memchr(b'\n', &chunk[start..]).map_or(chunk.len(), |n| start + n + 1);
        let line = &chunk[start..end];
        if let Some(rest) = line.strip_prefix(b"data:") {
            let offset = start + 5 + usize::from(rest.first() == Some(&b' '));
            let mut payload_end = end;
            while payload_end > offset && matches!(chunk[payload_end - 1], b'\n' | b'\r') {
                payload_end -= 1;
            }
            let payload = &chunk[offset..payload_end];
            if payload.first() == Some(&b'{')
                && memchr::memmem::find(payload, b"\"usage\"").is_some()
            {
                if let Some((at, members)) = insertion(payload) {
                    let o = out
                        .get_or_insert_with(|| BytesMut::with_capacity(chunk.len() + SPLICE_MAX));
                    o.put_slice(&chunk[copied..offset + at]);
                    field(cost, members, o);
                    copied = offset + at;
                }
            }
        }
        start = end;
    }
    let mut o = out?;
    o.put_slice(&chunk[copied..]);
    Some(o.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price() -> Price {
        Price {
            input_per_mtok: 2.5,
            output_per_mtok: 10.0,
            cached_input_per_mtok: None,
        }
    }

    fn usage(prompt: u64, completion: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Usage::default()
        })
    }

    fn text(b: &Bytes) -> String {
        String::from_utf8(b.to_vec()).unwrap_or_default()
    }

    #[test]
    fn the_cost_is_written_in_usd_without_trailing_zeros() {
        for (micro, want) in [
            (0, "0"),
            (3_500, "0.0035"),
            (1, "0.000001"),
            (12_000_000, "12"),
            (u64::MAX, "18446744073709.551615"),
        ] {
            let mut out = BytesMut::new();
            field(micro, true, &mut out);
            assert_eq!(out.as_ref(), format!("\"cost_usd\":{want},").as_bytes());
            assert!(out.len() <= SPLICE_MAX);
        }
    }

    #[test]
    fn a_whole_answer_gains_it_in_its_usage_and_keeps_its_framed_length() {
        let doc = br#"{"id":"x","usage":{"prompt_tokens":1000,"completion_tokens":100}}"#;
        let mut body = Some(Bytes::from_static(doc));
        CostSplice::new(price(), false).apply(&mut body, true, usage(1000, 100), false);
        let v: serde_json::Value =
            serde_json::from_slice(&body.unwrap_or_default()).unwrap_or_default();
        assert_eq!(v["usage"]["cost_usd"], serde_json::json!(0.0035));
        assert_eq!(v["usage"]["prompt_tokens"], 1000);
        // Framed: padded for the splice, and exactly as long after it.
        let mut padded = doc.to_vec();
        padded.extend(std::iter::repeat_n(b' ', SPLICE_MAX));
        let len = padded.len();
        let mut body = Some(Bytes::from(padded));
        CostSplice::new(price(), false).apply(&mut body, true, usage(1000, 100), true);
        let out = body.unwrap_or_default();
        assert_eq!(out.len(), len);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v["usage"]["cost_usd"], serde_json::json!(0.0035));
        // An empty usage object, and no usage at all.
        let mut body = Some(Bytes::from_static(br#"{"usage":{}}"#));
        CostSplice::new(price(), false).apply(&mut body, true, usage(0, 0), false);
        assert_eq!(
            text(&body.unwrap_or_default()),
            r#"{"usage":{"cost_usd":0}}"#
        );
        let mut body = Some(Bytes::from_static(br#"{"id":"x"}"#));
        CostSplice::new(price(), false).apply(&mut body, true, usage(1, 1), false);
        assert_eq!(text(&body.unwrap_or_default()), r#"{"id":"x"}"#);
    }

    #[test]
    fn a_body_relayed_in_pieces_is_left_alone() {
        let mut s = CostSplice::new(price(), false);
        let mut head = Some(Bytes::from_static(br#"{"usage":"#));
        s.apply(&mut head, false, None, false);
        let mut tail = Some(Bytes::from_static(br#"{"prompt_tokens":1}}"#));
        s.apply(&mut tail, true, usage(1, 0), false);
        assert_eq!(text(&tail.unwrap_or_default()), r#"{"prompt_tokens":1}}"#);
    }

    #[test]
    fn stream_events_that_report_usage_gain_it() {
        let chunk = Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":100}}\n\ndata: [DONE]\n\n",
        );
        let mut body = Some(chunk);
        CostSplice::new(price(), true).apply(&mut body, false, usage(1000, 100), false);
        let out = text(&body.unwrap_or_default());
        assert!(
            out.starts_with("data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n"),
            "{out}"
        );
        assert!(
            out.contains("\"usage\":{\"cost_usd\":0.0035,\"prompt_tokens\":1000"),
            "{out}"
        );
        assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
        // Anthropic's message_delta, and a Responses stream's final event.
        let delta = Bytes::from_static(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":100}}\n\n");
        let mut body = Some(delta);
        CostSplice::new(price(), true).apply(&mut body, false, usage(1000, 100), false);
        assert!(text(&body.unwrap_or_default())
            .contains("\"usage\":{\"cost_usd\":0.0035,\"output_tokens\":100}"));
        let done = Bytes::from_static(b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":1000}}}\n\n");
        let mut body = Some(done);
        CostSplice::new(price(), true).apply(&mut body, false, usage(1000, 100), false);
        assert!(text(&body.unwrap_or_default())
            .contains("\"usage\":{\"cost_usd\":0.0035,\"input_tokens\":1000}"));
    }
}
