//! What every dialect's response reports in the same words: token usage, and what a stream
//! has shown so far ([`Signals`]) — the facts the first-chunk hold, the stream contract, health
//! and metrics act on, whatever dialect the provider or the caller speaks.

use serde::Deserialize;

use super::json;

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

/// The fields of an OpenAI-kind `usage` object that [`Usage::read`] reads, in `WireUsage`'s
/// order.
const USAGE_FIELDS: &[&[u8]] = &[
    b"prompt_tokens",
    b"completion_tokens",
    b"input_tokens",
    b"output_tokens",
    b"prompt_tokens_details",
    b"input_tokens_details",
];

impl Usage {
    /// A `usage` object as `serde_json::from_slice::<Usage>` reads it — `None` where serde
    /// would refuse it (not an object, a field of the wrong type, a field twice) — without
    /// serde's machinery: every answer and every stream's last chunk carries one. Nested
    /// values are judged as leniently as the rest of a response ([`json::scan_object_lenient`]).
    pub fn read(value: &[u8]) -> Option<Usage> {
        let Ok(scan) = json::scan_object_lenient(value, USAGE_FIELDS) else {
            // serde also reads a struct from an array, by position: left to serde.
            return serde_in_order(value);
        };
        if scan.duplicate.is_some() {
            return None;
        }
        let field = |i: usize| scan.get(i).map(|m| &value[m.value.clone()]);
        if [field(4), field(5)]
            .into_iter()
            .flatten()
            .any(|v| v.starts_with(b"["))
        {
            return serde_json::from_slice::<Usage>(value).ok();
        }
        let count = |i: usize| field(i).map_or(Some(None), wire_count);
        let details = |i: usize| field(i).map_or(Some(None), wire_details);
        let (prompt, completion) = (count(0)?, count(1)?);
        let (input, output) = (count(2)?, count(3)?);
        let (prompt_details, input_details) = (details(4)?, details(5)?);
        let cached = prompt_details.or(input_details).and_then(|cached| cached);
        Some(Usage {
            prompt_tokens: prompt.or(input).unwrap_or(0),
            completion_tokens: completion.or(output).unwrap_or(0),
            cache_read_tokens: cached.unwrap_or(0),
            cache_write_tokens: 0,
        })
    }
}

/// The shapes [`Usage::read`] leaves to serde: a struct written as an array (no provider
/// does), or what is not an object at all.
fn serde_in_order(value: &[u8]) -> Option<Usage> {
    let starts_array = value.trim_ascii_start().starts_with(b"[");
    starts_array
        .then(|| serde_json::from_slice::<Usage>(value).ok())
        .flatten()
}

/// An `Option<u64>` field as serde reads it: `null` is `Some(None)`, an integer that fits is
/// `Some(Some(n))`, anything else (a fraction, an exponent, a sign — `-0` too — a string, an
/// overflow) is `None`: the whole object is refused.
fn wire_count(v: &[u8]) -> Option<Option<u64>> {
    if v == b"null" {
        return Some(None);
    }
    if v.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &d in v {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(Some(n))
}

/// An `Option<WireDetails>` field: `null` is `Some(None)`; an object is
/// `Some(Some(cached_tokens))`; anything else refuses the whole usage.
fn wire_details(v: &[u8]) -> Option<Option<Option<u64>>> {
    if v == b"null" {
        return Some(None);
    }
    let scan = json::scan_object_lenient(v, &[b"cached_tokens"]).ok()?;
    if scan.duplicate.is_some() {
        return None;
    }
    let cached = scan
        .get(0)
        .map_or(Some(None), |m| wire_count(&v[m.value.clone()]))?;
    Some(Some(cached))
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

    fn serde_reads(v: &[u8]) -> Option<Usage> {
        serde_json::from_slice::<Usage>(v).ok()
    }

    #[test]
    fn usage_is_read_as_serde_reads_it() {
        for v in [
            &br#"{"prompt_tokens":31,"completion_tokens":3,"total_tokens":34}"#[..],
            br#"{"input_tokens":5,"output_tokens":2,"input_tokens_details":{"cached_tokens":4}}"#,
            br#"{"prompt_tokens":9,"prompt_tokens_details":{},"input_tokens_details":{"cached_tokens":4}}"#,
            br#"{"prompt_tokens":null,"input_tokens":7}"#,
            br#"{"prompt_tokens":-0}"#,
            br#"{"prompt_tokens":1.0}"#,
            br#"{"prompt_tokens":1e2}"#,
            br#"{"prompt_tokens":-1}"#,
            br#"{"prompt_tokens":"1"}"#,
            br#"{"prompt_tokens":18446744073709551615}"#,
            br#"{"prompt_tokens":18446744073709551616}"#,
            br#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            br#"{"prompt_tokens_details":[1]}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":1}}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":true}}"#,
            br#"{}"#,
            br#"null"#,
            br#"[]"#,
        ] {
            assert_eq!(Usage::read(v), serde_reads(v), "{}", String::from_utf8_lossy(v));
        }
    }

    fn count() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..100_000).prop_map(|n| n.to_string()),
            Just("null".to_owned()),
            Just("-0".to_owned()),
            Just("-3".to_owned()),
            Just("2.5".to_owned()),
            Just("\"7\"".to_owned()),
            Just("99999999999999999999".to_owned()),
        ]
    }

    fn member() -> impl Strategy<Value = String> {
        let name = prop_oneof![
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("input_tokens"),
            Just("output_tokens"),
            Just("total_tokens"),
        ];
        let details_name = prop_oneof![Just("prompt_tokens_details"), Just("input_tokens_details")];
        let details = prop_oneof![
            Just("null".to_owned()),
            Just("{}".to_owned()),
            Just("[]".to_owned()),
            Just("[5]".to_owned()),
            count().prop_map(|c| format!(r#"{{"cached_tokens":{c},"audio_tokens":0}}"#)),
        ];
        prop_oneof![
            (name, count()).prop_map(|(n, c)| format!(r#""{n}":{c}"#)),
            (details_name, details).prop_map(|(n, d)| format!(r#""{n}":{d}"#)),
        ]
    }

    proptest! {
        #[test]
        fn any_usage_object_reads_as_serde_reads_it(members in proptest::collection::vec(member(), 0..6)) {
            let doc = format!("{{{}}}", members.join(","));
            prop_assert_eq!(Usage::read(doc.as_bytes()), serde_reads(doc.as_bytes()), "{}", doc);
        }
    }
}
