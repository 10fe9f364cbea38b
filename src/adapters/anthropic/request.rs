//! Reading an Anthropic request (`/v1/messages`, `/v1/messages/count_tokens`) and rewriting it
//! per attempt.
//!
//! The body is scanned once with the strict scanner, so the fields signalbox reads are the ones
//! the provider will read (escapes decoded; a wanted key twice, or in another letter case,
//! refused). An attempt's body is the received bytes with two splices: the `model` value and the
//! removed `routing` member. Everything else — `cache_control` markers, thinking blocks and their
//! `signature`s, image data — reaches the provider byte for byte, which is what a signature check
//! and a prompt-cache hit need.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::adapters::envelope::{
    non_empty_array, type_is, Envelope, RequestBodyError, Typed, COMMON_KEYS,
};
use crate::adapters::estimate::Estimate;
use crate::adapters::facts::{Complexity, Needs, RoutingOverride};
use crate::adapters::json::Scan;
use crate::adapters::tokenizer::Encoding;

// The envelope's members, then what both endpoints read, so a count-tokens scan is a prefix.
const WANT_SYSTEM: usize = 3;
const WANT_STREAM: usize = 4;
const WANT_MAX_TOKENS: usize = 5;
const WANT_TOOLS: usize = 6;
const WANT_THINKING: usize = 7;
const WANT_OUTPUT_FORMAT: usize = 8;
const WANT_OUTPUT_CONFIG: usize = 9;
const MESSAGES_KEYS: &[&[u8]] = &[
    COMMON_KEYS[0],
    COMMON_KEYS[1],
    COMMON_KEYS[2],
    b"system",
    b"stream",
    b"max_tokens",
    b"tools",
    b"thinking",
    b"output_format",
    b"output_config",
];
const COUNT_TOKENS_KEYS: &[&[u8]] = MESSAGES_KEYS.split_at(WANT_SYSTEM + 1).0;

/// Why a Messages request body cannot be routed: what any body is refused for, or Anthropic's
/// own requirement that `max_tokens` be given (refused here, as Anthropic would, rather than
/// spending an attempt to learn it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessagesBodyError {
    Body(RequestBodyError),
    MissingMaxTokens,
    /// `max_tokens` is not an integer of at least 1.
    BadMaxTokens,
}

impl MessagesBodyError {
    pub fn message(&self) -> Cow<'static, str> {
        match self {
            MessagesBodyError::Body(e) => e.message(),
            MessagesBodyError::MissingMaxTokens => "the request body has no `max_tokens`".into(),
            MessagesBodyError::BadMaxTokens => {
                "`max_tokens` must be an integer of at least 1".into()
            }
        }
    }
}

impl From<RequestBodyError> for MessagesBodyError {
    fn from(e: RequestBodyError) -> Self {
        MessagesBodyError::Body(e)
    }
}

/// What both endpoints read: the envelope (model, routing, `messages`) and `system`.
#[derive(Debug, Clone)]
struct Prompt {
    envelope: Envelope,
    system: Option<Range<usize>>,
}

impl Prompt {
    /// Scan `body` for `keys` (a prefix of [`MESSAGES_KEYS`]) and read the common fields.
    fn read(body: Bytes, keys: &'static [&'static [u8]]) -> Result<(Self, Scan), RequestBodyError> {
        let mut scan = Scan::default();
        let envelope = Envelope::scan(body, keys, &mut scan)?;
        let system = scan.get(WANT_SYSTEM).map(|m| m.value.clone());
        Ok((Prompt { envelope, system }, scan))
    }

    fn system(&self) -> Option<&[u8]> {
        self.system.as_ref().map(|r| &self.envelope.body[r.clone()])
    }

    /// The prompt estimated from what it says: `system` and `messages`, or the whole body
    /// when it has neither (see `adapters::estimate`).
    fn estimate(&self) -> Estimate {
        self.envelope.estimate(self.system())
    }

    /// The prompt counted exactly in `encoding` (near an OpenAI-kind candidate's limit).
    fn exact_tokens(&self, encoding: Encoding, images_openai: u64) -> Option<u64> {
        self.envelope
            .exact_openai(self.system(), encoding, images_openai)
    }
}

// === impl MessagesRequest ===

/// A Messages request body (`POST /v1/messages`), scanned once.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    prompt: Prompt,
    pub stream: bool,
    pub routing: Option<RoutingOverride>,
    /// The output limit; Anthropic requires one, so a parsed request always has it.
    pub max_tokens: u64,
    /// Extended thinking is on (`thinking.type` is `enabled` or `adaptive`).
    pub thinking: bool,
    /// What the request needs from a model, but vision: a stream, tools (a non-empty
    /// `tools`), JSON mode (structured outputs: `output_format` or `output_config.format` of
    /// type `json_schema`). Vision (an image block in `messages`, tool results included) is
    /// looked for when asked ([`Self::needs`]).
    known: Needs,
}

impl MessagesRequest {
    pub fn parse(body: Bytes) -> Result<Self, MessagesBodyError> {
        let (mut prompt, scan) = Prompt::read(body, MESSAGES_KEYS)?;
        let envelope = &mut prompt.envelope;
        let routing = envelope.routing(&scan)?;
        let stream = envelope.stream(&scan, WANT_STREAM)?;
        let value = |w: usize| envelope.value(&scan, w);
        let max_tokens = match value(WANT_MAX_TOKENS) {
            None | Some(b"null") => return Err(MessagesBodyError::MissingMaxTokens),
            // Digits only: Anthropic validates an integer, and `1e3` or `-1` is not one here.
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|n| *n >= 1)
                .ok_or(MessagesBodyError::BadMaxTokens)?,
        };
        let thinking = value(WANT_THINKING).is_some_and(|v| type_is(v, &["enabled", "adaptive"]));
        let json_mode = value(WANT_OUTPUT_FORMAT).is_some_and(|v| type_is(v, &["json_schema"]))
            || value(WANT_OUTPUT_CONFIG).is_some_and(output_config_is_json);
        let needs = Needs {
            stream,
            tools: value(WANT_TOOLS).is_some_and(non_empty_array),
            // Looked for when asked (`Self::needs`).
            vision: false,
            json_mode,
        };
        Ok(Self {
            prompt,
            stream,
            routing,
            max_tokens,
            thinking,
            known: needs,
        })
    }

    /// What the request needs from a model; whether it carries an image is looked for the
    /// first time this is asked (a plan whose candidates declare no capabilities never asks).
    pub fn needs(&self) -> Needs {
        Needs {
            vision: self.prompt.envelope.vision(has_image_block),
            ..self.known
        }
    }

    /// [`Self::needs`] without looking for images (`vision` false).
    pub fn needs_but_vision(&self) -> Needs {
        self.known
    }

    /// The prompt's tokens, estimated from what it says (made when first asked).
    pub fn estimate(&self) -> Estimate {
        self.prompt.estimate()
    }

    /// The prompt's estimated tokens for an Anthropic-kind provider (text characters over
    /// four, images by Anthropic's formula).
    pub fn prompt_tokens(&self) -> u64 {
        self.estimate().anthropic()
    }

    /// The prompt counted exactly in an OpenAI encoding (near a translated candidate's limit).
    pub fn exact_tokens(&self, encoding: Encoding) -> Option<u64> {
        self.prompt
            .exact_tokens(encoding, self.estimate().image_tokens_openai)
    }

    /// The complexity tier, by the Chat Completions heuristic: one point each for a long
    /// prompt (over 2,000 estimated tokens; two over 8,000), a fenced code block in `system`
    /// or `messages`, tools, and more than 6 messages.
    pub fn complexity(&self) -> Complexity {
        let tokens = self.estimate().text_tokens();
        let messages = self.prompt.envelope.messages();
        let fenced =
            |part: Option<&[u8]>| part.is_some_and(|p| memchr::memmem::find(p, b"```").is_some());
        let mut score = u32::from(tokens > 2_000) + u32::from(tokens > 8_000);
        score += u32::from(fenced(self.system()) || fenced(messages));
        score += u32::from(self.known.tools);
        score += u32::from(
            messages.is_some_and(|m| memchr::memmem::find_iter(m, b"\"role\"").count() > 6),
        );
        Complexity::of_points(score)
    }

    /// The conversation as raw JSON (the `messages` value), or the whole body without one:
    /// what prefix affinity and sticky seeds hash, as for Chat Completions.
    pub fn prompt(&self) -> &[u8] {
        self.prompt.envelope.prompt()
    }

    /// The `system` value as raw JSON (a string or a list of text blocks), if any.
    pub fn system(&self) -> Option<&[u8]> {
        self.prompt.system()
    }

    /// The model name the caller sent (decoded).
    pub fn model_name(&self) -> Cow<'_, str> {
        self.prompt.envelope.model_name()
    }

    /// The model value exactly as the caller wrote it, quotes included: spliced into responses.
    pub fn model_literal(&self) -> Bytes {
        self.prompt.envelope.model_literal()
    }

    pub fn body_len(&self) -> usize {
        self.prompt.envelope.body_len()
    }

    /// The body for one attempt: `model` set to `upstream_model_json` (a JSON string literal),
    /// `routing` removed, every other byte as received.
    pub fn body_for(&self, upstream_model_json: &[u8]) -> Bytes {
        self.prompt.envelope.body_for(upstream_model_json, b"")
    }
}

// === impl CountTokensRequest ===

/// A token-counting request (`POST /v1/messages/count_tokens`): routed by its `model` like a
/// Messages request, with no `max_tokens` and nothing generated.
#[derive(Debug, Clone)]
pub struct CountTokensRequest {
    prompt: Prompt,
    pub routing: Option<RoutingOverride>,
}

impl CountTokensRequest {
    pub fn parse(body: Bytes) -> Result<Self, RequestBodyError> {
        let (mut prompt, scan) = Prompt::read(body, COUNT_TOKENS_KEYS)?;
        let routing = prompt.envelope.routing(&scan)?;
        Ok(Self { prompt, routing })
    }

    /// The prompt's tokens, estimated from what it says (made when first asked).
    pub fn estimate(&self) -> Estimate {
        self.prompt.estimate()
    }

    /// The same estimate as [`MessagesRequest::prompt_tokens`].
    pub fn prompt_tokens(&self) -> u64 {
        self.estimate().anthropic()
    }

    pub fn model_name(&self) -> Cow<'_, str> {
        self.prompt.envelope.model_name()
    }

    pub fn model_literal(&self) -> Bytes {
        self.prompt.envelope.model_literal()
    }

    pub fn body_len(&self) -> usize {
        self.prompt.envelope.body_len()
    }

    /// As [`MessagesRequest::body_for`].
    pub fn body_for(&self, upstream_model_json: &[u8]) -> Bytes {
        self.prompt.envelope.body_for(upstream_model_json, b"")
    }
}

// === helpers ===

/// `output_config` asks for JSON: `{"format": {"type": "json_schema", ...}, ...}`.
fn output_config_is_json(v: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct OutputConfig<'a> {
        #[serde(borrow)]
        format: Option<Typed<'a>>,
    }
    serde_json::from_slice::<OutputConfig<'_>>(v)
        .ok()
        .and_then(|c| c.format?.kind)
        .is_some_and(|k| k == "json_schema")
}

/// Whether `messages` holds an image block: `{"type": "image"}` in a message's `content`, or
/// in the `content` of a block inside it (a `tool_result` returning an image). Only a prompt
/// that mentions `image` — or escapes ASCII, which could spell it — is walked, and the walk
/// borrows: base64 image data is skipped, never copied.
fn has_image_block(messages: &[u8]) -> bool {
    // Built once: `memmem::find` would set up its searcher on every request.
    static IMAGE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"image"));
    static ASCII_ESCAPE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\u00"));
    if IMAGE.find(messages).is_none() && ASCII_ESCAPE.find(messages).is_none() {
        return false;
    }
    serde_json::from_slice::<Blocks>(messages).is_ok_and(|b| b.0)
}

/// A list of messages or content blocks: true when one of them is, or holds, an image.
/// Anything but a list (a `content` string) holds none.
struct Blocks(bool);
/// A message or content block: an image itself, or with one in its `content`.
struct Block(bool);
/// A `type` value: true when it is `"image"`.
struct ImageType(bool);

/// Visitor methods that answer `false` for scalars, so a walk accepts any JSON value.
macro_rules! scalars_are_false {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(false)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(false)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(false)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(false)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(false)
        }
    };
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<bool, A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(false)
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<bool, A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(false)
}

impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = bool;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_are_false!();
            fn visit_str<E: de::Error>(self, _: &str) -> Result<bool, E> {
                Ok(false)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
                // Every element is read: serde_json refuses a list left half-read.
                let mut any = false;
                while let Some(Block(image)) = seq.next_element()? {
                    any |= image;
                }
                Ok(any)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
                drain_map(map)
            }
        }
        d.deserialize_any(V).map(Blocks)
    }
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = bool;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_are_false!();
            fn visit_str<E: de::Error>(self, _: &str) -> Result<bool, E> {
                Ok(false)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
                drain_seq(seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
                let mut image = false;
                while let Some(key) = map.next_key::<BlockKey>()? {
                    image |= match key {
                        BlockKey::Type => map.next_value::<ImageType>()?.0,
                        BlockKey::Content => map.next_value::<Blocks>()?.0,
                        BlockKey::Other => map.next_value::<IgnoredAny>().map(|_| false)?,
                    };
                }
                Ok(image)
            }
        }
        d.deserialize_any(V).map(Block)
    }
}

impl<'de> Deserialize<'de> for ImageType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = bool;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_are_false!();
            fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
                Ok(v == "image")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
                drain_seq(seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
                drain_map(map)
            }
        }
        d.deserialize_any(V).map(ImageType)
    }
}

/// The keys of a block the walk reads (escapes decoded by serde_json, as the provider does).
enum BlockKey {
    Type,
    Content,
    Other,
}

impl<'de> Deserialize<'de> for BlockKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = BlockKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<BlockKey, E> {
                Ok(match v {
                    "type" => BlockKey::Type,
                    "content" => BlockKey::Content,
                    _ => BlockKey::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINKING_FIXTURE: &[u8] =
        include_bytes!("../../../tests/fixtures/anthropic/same_dialect_request_thinking.json");

    fn req(s: &str) -> Result<MessagesRequest, MessagesBodyError> {
        MessagesRequest::parse(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn body_err(e: RequestBodyError) -> Option<MessagesBodyError> {
        Some(MessagesBodyError::Body(e))
    }

    #[test]
    fn reads_the_routing_fields() {
        let r = req(r#"{"model":"fast","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
            .expect("valid");
        assert_eq!(r.model_name(), "fast");
        assert_eq!(&r.model_literal()[..], b"\"fast\"");
        assert!(r.stream && r.needs().stream);
        assert_eq!(r.max_tokens, 1024);
        assert!(!r.thinking);
        assert!(r.routing.is_none());
        let r = req(
            r#"{"model":"m","max_tokens":1,"thinking":{"type":"enabled","budget_tokens":2048}}"#,
        )
        .expect("valid");
        assert!(r.thinking);
        assert!(
            req(r#"{"model":"m","max_tokens":1,"thinking":{"type":"adaptive"}}"#)
                .expect("valid")
                .thinking
        );
        assert!(
            !req(r#"{"model":"m","max_tokens":1,"thinking":{"type":"disabled"}}"#)
                .expect("valid")
                .thinking
        );
    }

    #[test]
    fn needs_are_derived_from_the_body() {
        let n = |s: &str| req(s).expect("valid").needs();
        assert_eq!(
            n(r#"{"model":"m","max_tokens":1,"messages":[]}"#),
            Needs::default()
        );
        assert!(
            n(r#"{"model":"m","max_tokens":1,"tools":[{"name":"f","input_schema":{}}]}"#).tools
        );
        assert!(
            !n(r#"{"model":"m","max_tokens":1,"tools":[ ]}"#).tools,
            "an empty list needs nothing"
        );
        let image = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}"#;
        assert!(n(image).vision);
        let in_tool_result = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}]}"#;
        assert!(
            n(in_tool_result).vision,
            "a tool's image result is an image"
        );
        let escaped = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"typ\u0065":"im\u0061ge","source":{}}]}]}"#;
        assert!(n(escaped).vision, "read as the provider decodes it");
        for no_image in [
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"an image block has type image"}]}"#,
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"image"}]}]}"#,
            // A tool's arguments are the model's own JSON, not content.
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"type":"image"}}]}]}"#,
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"image"}}]}]}"#,
            r#"{"model":"m","max_tokens":1,"system":[{"type":"image"}],"messages":"image"}"#,
        ] {
            assert!(!n(no_image).vision, "{no_image}");
        }
        assert!(
            n(r#"{"model":"m","max_tokens":1,"output_format":{"type":"json_schema","schema":{}}}"#)
                .json_mode
        );
        assert!(n(r#"{"model":"m","max_tokens":1,"output_config":{"effort":"low","format":{"type":"json_schema","schema":{}}}}"#).json_mode);
        assert!(!n(r#"{"model":"m","max_tokens":1,"output_config":{"effort":"low"}}"#).json_mode);
        let all = req(std::str::from_utf8(THINKING_FIXTURE).expect("utf8")).expect("valid");
        assert_eq!(
            all.needs(),
            Needs {
                stream: true,
                tools: true,
                vision: true,
                json_mode: false
            }
        );
        assert!(all.thinking);
    }

    #[test]
    fn max_tokens_is_required_and_positive() {
        assert_eq!(
            req(r#"{"model":"m"}"#).err(),
            Some(MessagesBodyError::MissingMaxTokens)
        );
        assert_eq!(
            req(r#"{"model":"m","max_tokens":null}"#).err(),
            Some(MessagesBodyError::MissingMaxTokens)
        );
        for bad in [
            "0",
            "-1",
            "\"10\"",
            "1.5",
            "1e3",
            "true",
            "{}",
            "18446744073709551616",
        ] {
            assert_eq!(
                req(&format!(r#"{{"model":"m","max_tokens":{bad}}}"#)).err(),
                Some(MessagesBodyError::BadMaxTokens),
                "{bad}"
            );
        }
        assert_eq!(
            req(r#"{"model":"m","max_tokens":1}"#)
                .expect("valid")
                .max_tokens,
            1
        );
        assert!(MessagesBodyError::MissingMaxTokens
            .message()
            .contains("max_tokens"));
        assert!(MessagesBodyError::BadMaxTokens
            .message()
            .contains("max_tokens"));
        // The model is checked first, as Chat Completions does.
        assert_eq!(
            req(r#"{"max_tokens":0}"#).err(),
            body_err(RequestBodyError::MissingModel)
        );
    }

    #[test]
    fn refuses_bad_bodies() {
        assert_eq!(req("{").err(), body_err(RequestBodyError::NotJson));
        assert_eq!(req("[]").err(), body_err(RequestBodyError::NotAnObject));
        assert_eq!(
            req(r#"{"max_tokens":1}"#).err(),
            body_err(RequestBodyError::MissingModel)
        );
        assert_eq!(
            req(r#"{"model":5,"max_tokens":1}"#).err(),
            body_err(RequestBodyError::ModelNotString)
        );
        assert_eq!(
            req(r#"{"model":"a","max_tokens":1,"stream":"yes"}"#).err(),
            body_err(RequestBodyError::StreamNotBool)
        );
        assert!(matches!(
            req(r#"{"model":"a","max_tokens":1,"routing":{"strategy":"x","colour":1}}"#).err(),
            Some(MessagesBodyError::Body(RequestBodyError::BadRouting(m))) if m.contains("colour")
        ));
        let eleven: Vec<String> = (0..11).map(|i| format!("\"p{i}\"")).collect();
        for providers in [eleven.join(","), String::new()] {
            let body = format!(
                r#"{{"model":"a","max_tokens":1,"routing":{{"providers":[{providers}]}}}}"#
            );
            assert!(matches!(
                req(&body).err(),
                Some(MessagesBodyError::Body(RequestBodyError::BadRouting(_)))
            ));
        }
        assert_eq!(
            req(r#"{"model":"a","max_tokens":1,"routing":5}"#)
                .err()
                .map(|e| matches!(e, MessagesBodyError::Body(RequestBodyError::BadRouting(_)))),
            Some(true)
        );
    }

    #[test]
    fn duplicate_and_case_variant_keys_are_refused() {
        for (body, key) in [
            (
                r#"{"model":"fast","max_tokens":1,"mod\u0065l":"claude-opus"}"#,
                "model",
            ),
            (
                r#"{"model":"m","max_tokens":1,"max_tokens":99999}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","max_tokens":1,"max\u005ftokens":2}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","max_tokens":1,"system":"a","sys\u0074em":"b"}"#,
                "system",
            ),
            (
                r#"{"model":"m","max_tokens":1,"messages":[],"messages":[]}"#,
                "messages",
            ),
            (
                r#"{"model":"m","max_tokens":1,"stream":true,"stre\u0061m":false}"#,
                "stream",
            ),
            (
                r#"{"model":"m","max_tokens":1,"routing":null,"\u0072outing":{}}"#,
                "routing",
            ),
            (
                r#"{"model":"m","max_tokens":1,"tools":[],"tools":[{}]}"#,
                "tools",
            ),
            (
                r#"{"model":"m","max_tokens":1,"thinking":{},"thinking":{}}"#,
                "thinking",
            ),
        ] {
            assert_eq!(
                req(body).err(),
                body_err(RequestBodyError::DuplicateKey(key)),
                "{body}"
            );
        }
        for (body, key) in [
            (
                r#"{"model":"fast","Model":"claude-opus","max_tokens":1}"#,
                "model",
            ),
            (
                r#"{"model":"m","max_tokens":1,"\u017ftream":true}"#,
                "stream",
            ),
            (
                r#"{"model":"m","max_tokens":1,"MAX_TOKENS":2}"#,
                "max_tokens",
            ),
            (r#"{"model":"m","max_tokens":1,"System":"x"}"#, "system"),
        ] {
            assert_eq!(
                req(body).err(),
                body_err(RequestBodyError::KeyCase(key)),
                "{body}"
            );
        }
        // Escaped alone, a key is the key: `model` is read and rewritten where it is.
        let r = req(r#"{"mod\u0065l":"fast","max_tokens":1,"messages":[]}"#).expect("valid");
        assert_eq!(r.model_name(), "fast");
        assert_eq!(
            &r.body_for(b"\"up\"")[..],
            br#"{"mod\u0065l":"up","max_tokens":1,"messages":[]}"#
        );
        let r = req(r#"{"model":"m","max_tokens":1,"r\u006futing":{"providers":["a"]}}"#)
            .expect("valid");
        assert_eq!(
            r.routing.and_then(|r| r.providers),
            Some(vec!["a".to_string()])
        );
        let r = req(r#"{"model":"m","max_\u0074okens":7}"#).expect("valid");
        assert_eq!(r.max_tokens, 7);
    }

    #[test]
    fn refuses_what_serde_json_refuses() {
        for body in [
            &br#"{"model":"m","max_tokens":1,"messages":[{"content":"\ud83d"}]}"#[..],
            br#"{"model":"m","max_tokens":1,"temperature":1e400}"#,
            b"{\"model\":\"m\",\"max_tokens\":1,\"metadata\":{\"user_id\":\"\xff\"}}",
            b"\xef\xbb\xbf{\"model\":\"m\",\"max_tokens\":1}",
            br#"{"model":"m","max_tokens":1,}"#,
        ] {
            assert!(
                matches!(
                    MessagesRequest::parse(Bytes::copy_from_slice(body)).err(),
                    Some(MessagesBodyError::Body(
                        RequestBodyError::NotJson | RequestBodyError::NotAnObject
                    ))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn body_for_keeps_thinking_signatures_and_cache_control_byte_for_byte() {
        let r = MessagesRequest::parse(Bytes::from_static(THINKING_FIXTURE)).expect("valid");
        assert_eq!(r.model_name(), "claude-smart");
        assert_eq!(r.max_tokens, 16_000);
        let routing = r.routing.clone().expect("routing");
        assert_eq!(routing.providers, Some(vec!["claude".to_string()]));
        assert_eq!(routing.strategy.as_deref(), Some("fastest"));
        let out = r.body_for(b"\"claude-sonnet-4-5-20250929\"");
        // Exactly two edits: the model value, and the routing line with its comma.
        let text = std::str::from_utf8(THINKING_FIXTURE).expect("utf8");
        let routing_line =
            "  \"routing\": {\"providers\": [\"claude\"], \"strategy\": \"fastest\"},\n";
        let expected = text
            .replacen("\"claude-smart\"", "\"claude-sonnet-4-5-20250929\"", 1)
            .replacen(routing_line, "", 1);
        assert_eq!(std::str::from_utf8(&out).expect("utf8"), expected);
        // What a provider checks is untouched: signatures, redacted data, cache markers, escapes.
        for kept in [
            &b"\"signature\": \"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+Ap4+jOZzT0+HLfLjCJ+/wn9G+7j9LZN4hfNOWPQIJrAHtR6rvGd92tZp0fAiQiI5dSTLWx4xxsBFDq4eQE1YUuO0aJuvGwg==\""[..],
            b"\"data\": \"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj\"",
            b"\"cache_control\": {\"type\": \"ephemeral\", \"ttl\": \"1h\"}",
            b"Z\\u00fcrich? Answer \\\"briefly\\\".",
        ] {
            assert!(memchr::memmem::find(&out, kept).is_some(), "{}", String::from_utf8_lossy(kept));
        }
        let sent: serde_json::Value = serde_json::from_slice(&out).expect("still JSON");
        let mut original: serde_json::Value =
            serde_json::from_slice(THINKING_FIXTURE).expect("JSON");
        let obj = original.as_object_mut().expect("object");
        obj.remove("routing");
        obj.insert("model".into(), "claude-sonnet-4-5-20250929".into());
        assert_eq!(sent, original);
    }

    #[test]
    fn body_for_without_edits_is_the_received_bytes() {
        let r = req(r#"{"model":"m","max_tokens":1,"messages":[]}"#).expect("valid");
        let out = r.body_for(b"\"m\"");
        assert_eq!(out.as_ptr(), r.prompt.envelope.body.as_ptr());
        let r = req(r#"{"routing":{},"model":"m","max_tokens":1}"#).expect("valid");
        assert_eq!(
            &r.body_for(b"\"up\"")[..],
            br#"{"model":"up","max_tokens":1}"#
        );
        assert_eq!(r.body_len(), 41);
    }

    #[test]
    fn prompt_estimate_counts_system_and_messages() {
        let r = req(
            r#"{"model":"m","max_tokens":1,"system":"12345678","messages":[{"role":"user","content":"abcdefghij"}]}"#,
        )
        .expect("valid");
        // The text only: 8 characters of system and 10 of the message, 18 → 5 tokens; the
        // keys, quotes and `role` are structure.
        assert_eq!(r.prompt_tokens(), 5);
        assert_eq!(r.system(), Some(&b"\"12345678\""[..]));
        let r = req(r#"{"model":"m","max_tokens":1}"#).expect("valid");
        assert_eq!(r.prompt_tokens(), 0, "no prompt: nothing to count");
    }

    #[test]
    fn complexity_tiers_follow_the_chat_heuristic() {
        let c = |s: String| req(&s).expect("valid").complexity();
        assert_eq!(
            c(
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#
                    .into()
            ),
            Complexity::Simple
        );
        // Code in the system prompt counts as code in the prompt.
        assert_eq!(
            c(r#"{"model":"m","max_tokens":1,"system":"```rust```","messages":[]}"#.into()),
            Complexity::Medium
        );
        let turns = (0..7)
            .map(|_| r#"{"role":"user","content":"x"}"#)
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            c(format!(
                r#"{{"model":"m","max_tokens":1,"messages":[{turns}]}}"#
            )),
            Complexity::Medium
        );
        let long = format!(
            r#"{{"model":"m","max_tokens":1,"tools":[{{"name":"f"}}],"system":"{}","messages":[{{"role":"user","content":"```x```"}}]}}"#,
            "w ".repeat(5000)
        );
        assert_eq!(c(long), Complexity::Complex);
    }

    #[test]
    fn count_tokens_is_routed_like_messages() {
        let parse = |s: &str| CountTokensRequest::parse(Bytes::copy_from_slice(s.as_bytes()));
        let r = parse(r#"{"model":"fast","routing":{"policy":"p"},"system":"s","messages":[{"role":"user","content":"hi"}]}"#)
            .expect("valid: no max_tokens needed");
        assert_eq!(r.model_name(), "fast");
        assert_eq!(&r.model_literal()[..], b"\"fast\"");
        assert_eq!(
            r.routing.as_ref().and_then(|r| r.policy.as_deref()),
            Some("p")
        );
        assert_eq!(
            &r.body_for(b"\"claude-haiku-4-5\"")[..],
            br#"{"model":"claude-haiku-4-5","system":"s","messages":[{"role":"user","content":"hi"}]}"#
        );
        // The text of `"s"` and `"hi"`: 3 characters.
        assert_eq!(r.prompt_tokens(), 1);
        assert!(r.body_len() > 0);
        assert_eq!(
            parse(r#"{"messages":[]}"#).err(),
            Some(RequestBodyError::MissingModel)
        );
        assert_eq!(
            parse(r#"{"model":"a","mod\u0065l":"b"}"#).err(),
            Some(RequestBodyError::DuplicateKey("model"))
        );
        assert_eq!(
            parse(r#"{"model":"a","Routing":{}}"#).err(),
            Some(RequestBodyError::KeyCase("routing"))
        );
        // Keys only a Messages request reads are not the count's business.
        assert!(parse(r#"{"model":"a","max_tokens":1,"max_tokens":2}"#).is_ok());
    }

    /// Every one-byte deletion or substitution of a real request: the parse accepts exactly
    /// what serde_json accepts (as far as the model goes), reads the model serde_json reads,
    /// and never panics.
    #[test]
    fn agrees_with_serde_json_on_mutated_bodies() {
        let base = THINKING_FIXTURE;
        let mut checked = 0;
        for at in 0..base.len() {
            for edit in [None, Some(b'"'), Some(0xff)] {
                let mut body = base.to_vec();
                match edit {
                    None => {
                        body.remove(at);
                    }
                    Some(b) => body[at] = b,
                }
                let ours = CountTokensRequest::parse(Bytes::from(body.clone()));
                let theirs = serde_json::from_slice::<serde_json::Value>(&body);
                match (&ours, &theirs) {
                    (Ok(r), Ok(v)) => assert_eq!(Some(&*r.model_name()), v["model"].as_str()),
                    (Err(_), Err(_)) => {}
                    // Refused on our own rules (duplicate key, bad routing, not a string model).
                    (Err(_), Ok(v)) => assert!(
                        !v["model"].is_string() || v.get("routing").is_some(),
                        "refused what serde_json accepts at {at}"
                    ),
                    (Ok(_), Err(e)) => panic!("accepted what serde_json refuses at {at}: {e}"),
                }
                let _ =
                    MessagesRequest::parse(Bytes::from(body)).map(|r| (r.complexity(), r.needs()));
                checked += 1;
            }
        }
        assert!(checked > 5_000);
    }
}
