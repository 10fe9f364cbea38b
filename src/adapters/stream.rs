//! What every dialect's response reports in the same words: token usage, and what a stream
//! has shown so far ([`Signals`]) — the facts the first-chunk hold, the stream contract, health
//! and metrics act on, whatever dialect the provider or the caller speaks.

use serde::Deserialize;

/// Token usage a provider reported, in every OpenAI-kind shape: Chat Completions,
/// completions and embeddings name `prompt_tokens` / `completion_tokens` (with
/// `prompt_tokens_details.cached_tokens`), the Responses API `input_tokens` / `output_tokens`
/// (with `input_tokens_details.cached_tokens`). Anthropic's `input_tokens` / `output_tokens` /
/// `cache_read_input_tokens` / `cache_creation_input_tokens` are mapped here by its adapter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "WireUsage")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens served from the provider's prompt cache (included in `prompt_tokens`
    /// for OpenAI; Anthropic reports them apart and its adapter adds them in).
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache (Anthropic).
    pub cache_write_tokens: u64,
}

/// The usage object as OpenAI-kind providers write it, either API's names.
#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_tokens_details: Option<WireDetails>,
    input_tokens_details: Option<WireDetails>,
}

#[derive(Deserialize)]
struct WireDetails {
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(w: WireUsage) -> Self {
        let cached = w
            .prompt_tokens_details
            .or(w.input_tokens_details)
            .and_then(|d| d.cached_tokens);
        Usage {
            prompt_tokens: w.prompt_tokens.or(w.input_tokens).unwrap_or(0),
            completion_tokens: w.completion_tokens.or(w.output_tokens).unwrap_or(0),
            cache_read_tokens: cached.unwrap_or(0),
            cache_write_tokens: 0,
        }
    }
}

impl Usage {
    /// Read an OpenAI-kind usage object, as `serde_json::from_slice::<Usage>` reads it. The
    /// common shape (the counts OpenAI-kind providers write, as integers or `null`, with flat
    /// `*_details` objects of counts) is read directly, at a fraction of serde's cost on a
    /// chat answer's usage; anything else (another key, an escape, a float, a duplicate
    /// field...) is handed to serde_json, so the answer is always serde's.
    pub fn read(value: &[u8]) -> Option<Usage> {
        match fast_usage(value) {
            Some(usage) => Some(usage),
            None => serde_json::from_slice::<Usage>(value).ok(),
        }
    }
}

/// A usage member's key, as [`fast_usage`] knows it.
#[derive(Clone, Copy)]
enum UsageKey {
    /// `prompt_tokens`, `completion_tokens`, `input_tokens`, `output_tokens`, by index.
    Tokens(usize),
    /// `prompt_tokens_details`, `input_tokens_details`, by index.
    Details(usize),
    /// A member read past: an integer (`total_tokens`) or a flat object of integers (the
    /// other details).
    Other,
}

/// [`Usage::read`]'s fast path: `None` whenever the document is not of the common shape (then
/// serde decides, whatever the document is). Only the keys OpenAI-kind providers write are
/// read; any other goes to serde.
fn fast_usage(doc: &[u8]) -> Option<Usage> {
    let mut r = FlatReader { b: doc, i: 0 };
    let mut seen = [false; 6];
    let mut tokens = [None::<u64>; 4];
    // Per details object: present (`Some`), with its `cached_tokens`.
    let mut cached = [None::<Option<u64>>; 2];
    r.ws();
    r.eat(b'{')?;
    r.ws();
    if !r.eat_if(b'}') {
        loop {
            r.ws();
            let key = r.usage_key()?;
            r.ws();
            r.eat(b':')?;
            r.ws();
            match key {
                UsageKey::Tokens(n) | UsageKey::Details(n) => {
                    let slot = if matches!(key, UsageKey::Tokens(_)) {
                        n
                    } else {
                        4 + n
                    };
                    // serde refuses a duplicate field: let it say so.
                    if std::mem::replace(&mut seen[slot], true) {
                        return None;
                    }
                    if slot < 4 {
                        tokens[n] = r.int_or_null()?;
                    } else {
                        cached[n] = r.details()?;
                    }
                }
                UsageKey::Other => r.skip_int_or_flat()?,
            }
            r.ws();
            if r.eat_if(b'}') {
                break;
            }
            r.eat(b',')?;
        }
    }
    r.ws();
    if r.i != doc.len() {
        return None;
    }
    // `prompt_tokens_details` wins when present (even without `cached_tokens`), as
    // `From<WireUsage>`'s `Option::or` of the two details objects.
    let cached = match cached {
        [Some(c), _] | [None, Some(c)] => c,
        [None, None] => None,
    };
    Some(Usage {
        prompt_tokens: tokens[0].or(tokens[2]).unwrap_or(0),
        completion_tokens: tokens[1].or(tokens[3]).unwrap_or(0),
        cache_read_tokens: cached.unwrap_or(0),
        cache_write_tokens: 0,
    })
}

/// A cursor over a usage object for [`fast_usage`]: every method returns `None` for what it
/// does not read plainly.
struct FlatReader<'a> {
    b: &'a [u8],
    i: usize,
}

impl FlatReader<'_> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.eat_if(c).then_some(())
    }

    fn eat_if(&mut self, c: u8) -> bool {
        let hit = self.b.get(self.i) == Some(&c);
        self.i += usize::from(hit);
        hit
    }

    /// The key at the cursor, when it is one of those written plainly (no escape can be in
    /// it: each is matched whole, up to the next quote).
    fn key(&mut self) -> Option<&[u8]> {
        self.eat(b'"')?;
        let start = self.i;
        let len = memchr::memchr(b'"', &self.b[start..])?;
        self.i = start + len + 1;
        Some(&self.b[start..start + len])
    }

    fn usage_key(&mut self) -> Option<UsageKey> {
        Some(match self.key()? {
            b"prompt_tokens" => UsageKey::Tokens(0),
            b"completion_tokens" => UsageKey::Tokens(1),
            b"input_tokens" => UsageKey::Tokens(2),
            b"output_tokens" => UsageKey::Tokens(3),
            b"prompt_tokens_details" => UsageKey::Details(0),
            b"input_tokens_details" => UsageKey::Details(1),
            b"total_tokens" | b"completion_tokens_details" | b"output_tokens_details" => {
                UsageKey::Other
            }
            _ => return None,
        })
    }

    /// Whether the key at the cursor is `cached_tokens` (`Some(false)`: another count a
    /// details object holds).
    fn details_key(&mut self) -> Option<bool> {
        match self.key()? {
            b"cached_tokens" => Some(true),
            b"audio_tokens"
            | b"reasoning_tokens"
            | b"accepted_prediction_tokens"
            | b"rejected_prediction_tokens"
            | b"text_tokens"
            | b"image_tokens" => Some(false),
            _ => None,
        }
    }

    /// A non-negative integer that fits `u64`, or `null`.
    fn int_or_null(&mut self) -> Option<Option<u64>> {
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            return Some(None);
        }
        let start = self.i;
        let mut v: u64 = 0;
        while let Some(&c @ b'0'..=b'9') = self.b.get(self.i) {
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        // No digits, a leading zero (not JSON), or a fraction or exponent (serde's call).
        if digits == 0
            || (digits > 1 && self.b[start] == b'0')
            || matches!(self.b.get(self.i), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        Some(Some(v))
    }

    /// A `*_details` value: `null` (`Some(None)`: absent) or a flat object of counts, whose
    /// `cached_tokens` is read (`Some(Some(..))`).
    fn details(&mut self) -> Option<Option<Option<u64>>> {
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            return Some(None);
        }
        let mut cached = None;
        let mut seen = false;
        self.flat_object(|r| {
            let value = if r.details_key()? {
                // serde refuses a duplicate field.
                if std::mem::replace(&mut seen, true) {
                    return None;
                }
                &mut cached
            } else {
                &mut None
            };
            r.ws();
            r.eat(b':')?;
            r.ws();
            *value = r.int_or_null()?;
            Some(())
        })?;
        Some(Some(cached))
    }

    /// A member read past: an integer, `null`, or a flat object of counts.
    fn skip_int_or_flat(&mut self) -> Option<()> {
        if self.b.get(self.i) == Some(&b'{') {
            self.flat_object(|r| {
                r.details_key()?;
                r.ws();
                r.eat(b':')?;
                r.ws();
                r.int_or_null().map(|_| ())
            })
        } else {
            self.int_or_null().map(|_| ())
        }
    }

    /// `{ member, ... }` with each member (key, colon, value) read by `member`.
    fn flat_object(&mut self, mut member: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat_if(b'}') {
            return Some(());
        }
        loop {
            self.ws();
            member(self)?;
            self.ws();
            if self.eat_if(b'}') {
                return Some(());
            }
            self.eat(b',')?;
        }
    }
}

/// An error the provider sent inside a stream it had answered 200 (OpenAI: a `data:` event
/// with an `error` member; Anthropic: `event: error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InbandError {
    /// Overloaded or rate limited (Anthropic `overloaded_error`, `rate_limit_error`; OpenAI
    /// `rate_limit_exceeded`, `server_is_overloaded`): another target may serve.
    Overloaded,
    /// The provider failed (`api_error`, `server_error`, anything unrecognised).
    Server,
    /// The request itself was refused (`invalid_request_error`): another target would refuse
    /// it too.
    InvalidRequest,
}

/// What a response stream has shown so far; a stream adapter updates it as events pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// A content-bearing event passed: a text delta, a tool call (its name or an argument
    /// delta), a thinking delta. For the first-chunk hold this is the commit point: an event
    /// before it (a role-only chunk, `message_start`, a ping) is not yet an answer.
    pub content: bool,
    /// The stream's terminal event passed (OpenAI `data: [DONE]`; Anthropic `message_stop`).
    pub terminal: bool,
    /// The provider's own error event, if one passed.
    pub error: Option<InbandError>,
    /// A Chat Completions chunk or body with `"choices": []` and no usage (an answer with
    /// nothing in it).
    pub empty_choices: bool,
    /// The latest usage figures reported.
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn by_serde(doc: &[u8]) -> Option<Usage> {
        serde_json::from_slice::<Usage>(doc).ok()
    }

    fn reads_as_serde(docs: &[&[u8]]) {
        for doc in docs {
            assert_eq!(
                Usage::read(doc),
                by_serde(doc),
                "{}",
                String::from_utf8_lossy(doc)
            );
        }
    }

    #[test]
    fn the_fast_reader_reads_the_common_shapes_as_serde_does() {
        let docs: [&[u8]; 12] = [
            br#"{"prompt_tokens":23,"completion_tokens":3,"total_tokens":26}"#,
            br#"{ "prompt_tokens" : 23 , "completion_tokens": 3 }"#,
            br#"{"input_tokens":5,"output_tokens":7,"input_tokens_details":{"cached_tokens":2}}"#,
            br#"{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}"#,
            br#"{"prompt_tokens_details":{"audio_tokens":1},"input_tokens_details":{"cached_tokens":3}}"#,
            br#"{"prompt_tokens_details":null,"input_tokens_details":{"cached_tokens":3}}"#,
            br#"{"prompt_tokens":null,"input_tokens":8}"#,
            br#"{}"#,
            br#"{"prompt_tokens":18446744073709551615}"#,
            br#"{"prompt_tokens":0}"#,
            br#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            br#"{"prompt_tokens":1.5}"#,
        ];
        reads_as_serde(&docs);
        // The first ten are the fast path's own; the last two are serde's refusals.
        for doc in &docs[..10] {
            assert!(
                fast_usage(doc).is_some(),
                "{}",
                String::from_utf8_lossy(doc)
            );
        }
        let chat = br#"{"prompt_tokens":23,"completion_tokens":3,"total_tokens":26}"#;
        assert_eq!(
            Usage::read(chat),
            Some(Usage {
                prompt_tokens: 23,
                completion_tokens: 3,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn what_the_fast_reader_does_not_read_is_serdes_to_judge() {
        let docs: [&[u8]; 12] = [
            br#"{"prompt_tokens":01}"#,
            br#"{"prompt_tokens":-1}"#,
            br#"{"prompt_tokens":1e3}"#,
            br#"{"prompt_tokens":18446744073709551616}"#,
            br#"{"prompt_\u0074okens":4}"#,
            br#"{"model":"x","prompt_tokens":4}"#,
            br#"{"prompt_tokens":4,}"#,
            br#"{"prompt_tokens":4} x"#,
            br#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}"#,
            br#"{"prompt_tokens_details":7}"#,
            br#"[1]"#,
            br#"{"completion_tokens_details":{"nested":{"a":1}},"prompt_tokens":2}"#,
        ];
        reads_as_serde(&docs);
        assert_eq!(
            Usage::read(br#"{"prompt_\u0074okens":4}"#).map(|u| u.prompt_tokens),
            Some(4)
        );
    }

    /// A usage-like member: a known or unknown key, with an integer, `null`, a float, a string
    /// or a details object.
    fn member() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "prompt_tokens_details",
            "input_tokens_details",
            "total_tokens",
            "cached_tokens",
            "completion_tokens_details",
        ]);
        let value = prop_oneof![
            (0u64..u64::MAX).prop_map(|v| v.to_string()),
            Just("null".to_string()),
            Just("1.5".to_string()),
            Just("\"x\"".to_string()),
            Just("007".to_string()),
            (0u64..100, 0u64..100)
                .prop_map(|(a, b)| format!("{{\"cached_tokens\": {a}, \"audio_tokens\":{b}}}")),
            (0u64..100).prop_map(|a| format!("{{\"reasoning_tokens\":{a}}}")),
        ];
        (key, value, prop::sample::select(vec!["", " ", "\n"]))
            .prop_map(|(k, v, ws)| format!("{ws}\"{k}\"{ws}:{ws}{v}{ws}"))
    }

    proptest! {
        #[test]
        fn usage_read_always_agrees_with_serde(members in prop::collection::vec(member(), 0..7)) {
            let doc = format!("{{{}}}", members.join(","));
            prop_assert_eq!(Usage::read(doc.as_bytes()), by_serde(doc.as_bytes()), "{}", doc);
        }
    }
}
