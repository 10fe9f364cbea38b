//! A provider's response body on its way to the caller ([`Relay`]), whichever dialects the two
//! speak: the same dialect rewritten in place (the caller's `model`, and the `provider` field
//! when asked for), the other dialect translated (a JSON answer once complete, a stream event
//! by event), a refusal replaced by an error in the caller's shape. Whatever the pair, the relay
//! reports what the body showed in the same words ([`Signals`]): the first-chunk hold, the
//! stream contract, health and usage accounting read only those.

use bytes::{BufMut, Bytes, BytesMut};

use super::anthropic::AnthropicRewriter;
use super::chat_messages::{
    anthropic_error_to_openai, chat_response_to_messages, messages_response_to_chat,
    openai_error_to_anthropic, BadUpstream, ChatStreamToMessages, MessagesStreamToChat,
};
use super::cost::{CostSplice, SPLICE_MAX};
use super::openai::{self, fixed_json_length, ResponseRewriter, StreamStats};
use super::stream::{InbandError, Signals};
use crate::catalog::surface::{Conversion, Dialect, Surface};
use crate::config::Price;
use crate::error::error_json;

/// A translated JSON answer larger than this is refused as malformed (it is held whole).
const MAX_TRANSLATED_JSON: usize = 64 << 20;
/// Bytes of a refused upstream body kept to classify and translate it.
const SNIFF_BYTES: usize = 8 << 10;

/// What one attempt's answer is relayed as.
#[derive(Debug, Clone)]
pub struct Reply<'a> {
    pub surface: Surface,
    pub conversion: Conversion,
    /// The caller's `model` value, quotes included.
    pub caller_model: Bytes,
    /// `response.provider_field`: the serving provider's id, added beside every `model`.
    pub provider: Option<&'a str>,
    /// Signalbox asked for stream usage the caller did not: drop the usage chunk.
    pub strip_usage: bool,
    /// The caller asked for usage in its stream (a chat caller's `include_usage`).
    pub caller_usage: bool,
    /// The serving deployment's price: the answer's `usage` gains `cost_usd` ([`CostSplice`]).
    pub price: Option<Price>,
}

impl Reply<'_> {
    /// The bytes spliced in place of the provider's `model` value.
    fn model_splice(&self) -> Bytes {
        match self.provider {
            None => self.caller_model.clone(),
            Some(p) => {
                const MEMBER: &[u8] = b",\"provider\":";
                let mut out =
                    BytesMut::with_capacity(self.caller_model.len() + MEMBER.len() + p.len() + 2);
                out.put_slice(&self.caller_model);
                out.put_slice(MEMBER);
                // Provider ids are plain names: quoted as they are, without serde's writer.
                if p.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
                    out.put_u8(b'"');
                    out.put_slice(p.as_bytes());
                    out.put_u8(b'"');
                } else {
                    out.put_slice(&serde_json::to_vec(p).unwrap_or_default());
                }
                out.freeze()
            }
        }
    }

    fn caller_model_str(&self) -> String {
        serde_json::from_slice::<String>(&self.caller_model).unwrap_or_default()
    }
}

/// A response body's handling, one attempt.
#[derive(Debug)]
pub struct Relay {
    mode: Mode,
    signals: Signals,
    /// The answer could not be read in the dialect it claimed.
    bad: Option<BadUpstream>,
    /// The length a length-framed same-dialect JSON answer is given.
    fixed_len: Option<usize>,
    /// A same-dialect stream: the provider's own error event is reworded (translated streams
    /// are written in signalbox's words already).
    reword_errors: Option<Dialect>,
    /// A priced answer: `usage.cost_usd` written in.
    cost: Option<CostSplice>,
}

#[derive(Debug)]
enum Mode {
    Passthrough,
    /// OpenAI dialect both sides (every OpenAI surface).
    OpenAi {
        rewriter: ResponseRewriter,
        stats: StreamStats,
    },
    /// Anthropic both sides.
    Anthropic(AnthropicRewriter),
    /// An Anthropic stream for a chat caller.
    MessagesToChat(Box<MessagesStreamToChat>),
    /// A chat stream for a messages caller.
    ChatToMessages(Box<ChatStreamToMessages>),
    /// A whole JSON answer in the other dialect, translated once complete.
    TranslateJson {
        to_chat: bool,
        caller_model: String,
        provider: Option<String>,
        buf: BytesMut,
    },
    /// A refusal from a provider of the other dialect, in the caller's shape.
    TranslateRefusal {
        to_chat: bool,
        status: u16,
        sniff: BytesMut,
    },
}

impl Relay {
    fn new(mode: Mode) -> Self {
        Self {
            mode,
            signals: Signals::default(),
            bad: None,
            fixed_len: None,
            reword_errors: None,
            cost: None,
        }
    }

    /// Relay as is (a compressed body, or one that is neither JSON nor SSE).
    pub fn passthrough() -> Self {
        Self::new(Mode::Passthrough)
    }

    /// A stream.
    pub fn sse(reply: &Reply<'_>) -> Self {
        let mode = match (reply.conversion, reply.surface.dialect()) {
            (Conversion::Same, Dialect::OpenAi) => Mode::OpenAi {
                rewriter: ResponseRewriter::Sse {
                    caller_model: reply.model_splice(),
                    carry: BytesMut::new(),
                    strip_usage: reply.strip_usage,
                },
                stats: StreamStats::default(),
            },
            (Conversion::Same, Dialect::Anthropic) => {
                Mode::Anthropic(AnthropicRewriter::sse(reply.model_splice()))
            }
            (Conversion::ChatToMessages, _) => {
                let c = MessagesStreamToChat::new(&reply.caller_model_str(), reply.caller_usage);
                Mode::MessagesToChat(Box::new(match reply.provider {
                    Some(p) => c.with_provider(p),
                    None => c,
                }))
            }
            (Conversion::MessagesToChat, _) => {
                let c = ChatStreamToMessages::new(&reply.caller_model_str(), true);
                Mode::ChatToMessages(Box::new(match reply.provider {
                    Some(p) => c.with_provider(p),
                    None => c,
                }))
            }
        };
        let same = reply.conversion == Conversion::Same && reply.surface != Surface::Responses;
        Self {
            reword_errors: same.then(|| reply.surface.dialect()),
            cost: reply.price.map(|p| CostSplice::new(p, true)),
            ..Self::new(mode)
        }
    }

    /// A JSON answer; `upstream_len` is the provider's `Content-Length`. A same-dialect answer
    /// keeps a length framing (see [`Self::fixed_len`]); a translated one is re-framed.
    pub fn json(reply: &Reply<'_>, upstream_len: Option<usize>) -> Self {
        let splice = reply.model_splice();
        // A priced answer's length leaves room for `usage.cost_usd` (padding when unused).
        let room = if reply.price.is_some() { SPLICE_MAX } else { 0 };
        let fixed_len = upstream_len.map(|len| fixed_json_length(len, &splice) + room);
        let same = reply.conversion == Conversion::Same;
        let mode = match (reply.conversion, reply.surface.dialect()) {
            (Conversion::Same, Dialect::OpenAi) => Mode::OpenAi {
                rewriter: ResponseRewriter::Json {
                    caller_model: splice,
                    buf: BytesMut::new(),
                    fixed_len,
                    // A priced answer's cost is spliced in at its end ([`CostSplice`]).
                    whole_at: upstream_len.filter(|_| reply.price.is_none()),
                },
                stats: StreamStats::default(),
            },
            (Conversion::Same, Dialect::Anthropic) => {
                Mode::Anthropic(AnthropicRewriter::json(splice, fixed_len))
            }
            (conversion, _) => Mode::TranslateJson {
                to_chat: conversion == Conversion::ChatToMessages,
                caller_model: reply.caller_model_str(),
                provider: reply.provider.map(str::to_owned),
                buf: BytesMut::new(),
            },
        };
        Self {
            fixed_len: fixed_len.filter(|_| same),
            cost: reply.price.map(|p| CostSplice::new(p, false)),
            ..Self::new(mode)
        }
    }

    /// A provider's refusal (a 4xx relayed to the caller), replaced by an error in the caller's
    /// dialect and signalbox's words.
    pub fn refusal(surface: Surface, conversion: Conversion, status: u16) -> Self {
        let mode = match (conversion, surface.dialect()) {
            (Conversion::Same, Dialect::OpenAi) => Mode::OpenAi {
                rewriter: ResponseRewriter::Replace {
                    status,
                    sniff: BytesMut::new(),
                },
                stats: StreamStats::default(),
            },
            (Conversion::Same, Dialect::Anthropic) => {
                Mode::Anthropic(AnthropicRewriter::refusal(status))
            }
            (conversion, _) => Mode::TranslateRefusal {
                to_chat: conversion == Conversion::ChatToMessages,
                status,
                sniff: BytesMut::new(),
            },
        };
        Self::new(mode)
    }

    /// The exact length a length-framed same-dialect JSON answer will have.
    pub fn fixed_len(&self) -> Option<usize> {
        self.fixed_len
    }

    /// Whether the relayed body's length is unknown when the header goes out (re-framed).
    pub fn changes_length(&self) -> bool {
        match &self.mode {
            Mode::Passthrough => false,
            Mode::OpenAi { rewriter, .. } => rewriter.changes_length(),
            Mode::Anthropic(a) => a.changes_length(),
            _ => true,
        }
    }

    /// The refused body read so far (a refusal only): what classifies it.
    pub fn refused_body(&self) -> Option<&[u8]> {
        match &self.mode {
            Mode::OpenAi { rewriter, .. } => rewriter.refused_body(),
            Mode::Anthropic(a) => a.refused_body(),
            Mode::TranslateRefusal { sniff, .. } => Some(sniff),
            _ => None,
        }
    }

    /// What the body has shown so far.
    pub fn signals(&self) -> &Signals {
        &self.signals
    }

    /// The answer could not be read (not JSON, the wrong shape, no choices): set once a
    /// translated JSON answer is complete, or when a translated stream's event was unreadable.
    pub fn bad_upstream(&self) -> Option<BadUpstream> {
        self.bad
    }

    /// Filter one body chunk in place.
    pub fn filter(&mut self, body: &mut Option<Bytes>, eos: bool) {
        let had_error = self.signals.error.is_some();
        self.filter_mode(body, eos);
        if let Some(cost) = &mut self.cost {
            cost.apply(body, eos, self.signals.usage, self.fixed_len.is_some());
        }
        if let (Some(dialect), Some(kind), false) =
            (self.reword_errors, self.signals.error, had_error)
        {
            // The provider's error event passed in this chunk (the rewriters hold partial
            // lines, so it is whole here): in signalbox's words, as every other error.
            if let Some(chunk) = body.take() {
                *body = Some(reword_error_events(chunk, dialect, kind));
            }
        }
    }

    fn filter_mode(&mut self, body: &mut Option<Bytes>, eos: bool) {
        match &mut self.mode {
            Mode::Passthrough => {}
            Mode::OpenAi { rewriter, stats } => {
                rewriter.filter(body, eos, stats);
                self.signals = Signals {
                    content: stats.content,
                    terminal: stats.done,
                    error: stats
                        .error
                        .or(stats.upstream_error_event.then_some(InbandError::Server)),
                    empty_choices: stats.empty_choices,
                    usage: stats.usage,
                };
            }
            Mode::Anthropic(a) => a.filter(body, eos, &mut self.signals),
            Mode::MessagesToChat(c) => {
                convert(&mut **c, body, eos, &mut self.signals, &mut self.bad);
            }
            Mode::ChatToMessages(c) => {
                convert(&mut **c, body, eos, &mut self.signals, &mut self.bad);
            }
            Mode::TranslateJson {
                to_chat,
                caller_model,
                provider,
                buf,
            } => {
                if let Some(chunk) = body.take() {
                    if buf.len() + chunk.len() > MAX_TRANSLATED_JSON {
                        self.bad = Some(BadUpstream::Malformed("the answer is too large"));
                    } else {
                        buf.put_slice(&chunk);
                    }
                }
                if !eos {
                    return;
                }
                let translated = if *to_chat {
                    messages_response_to_chat(buf, caller_model)
                } else {
                    chat_response_to_messages(buf, caller_model)
                };
                let out = match translated {
                    Ok((doc, usage)) if self.bad.is_none() => {
                        self.signals.usage = usage;
                        self.signals.content = true;
                        self.signals.terminal = true;
                        with_provider(doc, provider.as_deref())
                    }
                    Ok(_) => Bytes::new(),
                    Err(e) => {
                        self.signals.empty_choices = e == BadUpstream::EmptyChoices;
                        self.bad = Some(e);
                        Bytes::new()
                    }
                };
                if self.bad.is_some() {
                    // Only ever relayed when nothing else can be (the hold path fails over on
                    // it): the caller gets signalbox's error, in its dialect.
                    let msg = "the provider's answer could not be read";
                    *body = Some(if *to_chat {
                        error_json(msg, "server_error", "upstream_bad_response")
                    } else {
                        super::anthropic::error_body(502, msg)
                    });
                } else {
                    *body = Some(out);
                }
            }
            Mode::TranslateRefusal {
                to_chat,
                status,
                sniff,
            } => {
                if let Some(chunk) = body.take() {
                    let room = SNIFF_BYTES.saturating_sub(sniff.len());
                    sniff.put_slice(&chunk[..chunk.len().min(room)]);
                }
                if eos {
                    *body = Some(Bytes::from(if *to_chat {
                        anthropic_error_to_openai(*status, sniff)
                    } else {
                        openai_error_to_anthropic(*status, sniff)
                    }));
                }
            }
        }
    }
}

/// The two stream converters, one way to drive them.
trait StreamConverter {
    fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream>;
    fn finish(&mut self, out: &mut BytesMut);
    fn signals(&self) -> &Signals;
}

macro_rules! stream_converter {
    ($t:ty) => {
        impl StreamConverter for $t {
            fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream> {
                <$t>::feed(self, chunk, out)
            }
            fn finish(&mut self, out: &mut BytesMut) {
                <$t>::finish(self, out);
            }
            fn signals(&self) -> &Signals {
                <$t>::signals(self)
            }
        }
    };
}
stream_converter!(MessagesStreamToChat);
stream_converter!(ChatStreamToMessages);

/// One chunk of a translated stream: converted as far as it completes events, the rest of the
/// provider's stream finished at its end; the first unreadable event is remembered.
fn convert(
    c: &mut dyn StreamConverter,
    body: &mut Option<Bytes>,
    eos: bool,
    signals: &mut Signals,
    bad: &mut Option<BadUpstream>,
) {
    let mut out = BytesMut::new();
    if let Some(chunk) = body.take() {
        if let Err(e) = c.feed(&chunk, &mut out) {
            bad.get_or_insert(e);
        }
    }
    if eos {
        c.finish(&mut out);
    }
    *signals = *c.signals();
    *body = (!out.is_empty() || eos).then(|| out.freeze());
}

/// A stream chunk with every `data:` line whose JSON carries a top-level `error` replaced by
/// signalbox's own error of that kind, in the caller's dialect.
fn reword_error_events(chunk: Bytes, dialect: Dialect, kind: InbandError) -> Bytes {
    const MESSAGE: &str = "the provider reported an error in the stream";
    let payload = match dialect {
        Dialect::OpenAi => {
            let (error_type, code) = match kind {
                InbandError::Overloaded => ("rate_limit_error", "upstream_overloaded"),
                InbandError::InvalidRequest => ("invalid_request_error", "all_candidates_rejected"),
                InbandError::Server => ("server_error", "upstream_stream_error"),
            };
            error_json(MESSAGE, error_type, code)
        }
        Dialect::Anthropic => {
            let error_type = match kind {
                InbandError::Overloaded => "overloaded_error",
                InbandError::InvalidRequest => "invalid_request_error",
                InbandError::Server => "api_error",
            };
            Bytes::from(
                serde_json::json!({"type": "error", "error": {"type": error_type, "message": MESSAGE}})
                    .to_string(),
            )
        }
    };
    let mut out = BytesMut::with_capacity(chunk.len() + payload.len());
    let mut rest = &chunk[..];
    while !rest.is_empty() {
        let end = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
        let line = &rest[..end];
        let data = line
            .strip_prefix(b"data:")
            .map(|d| d.strip_prefix(b" ").unwrap_or(d));
        let is_error = data.is_some_and(|d| {
            d.first() == Some(&b'{')
                && super::json::scan_object_lenient(d, &[b"error"])
                    .is_ok_and(|scan| scan.get_non_null(0, d).is_some())
        });
        if is_error {
            out.put_slice(b"data: ");
            out.put_slice(&payload);
            out.put_slice(if line.ends_with(b"\r\n") {
                b"\r\n"
            } else {
                b"\n"
            });
        } else {
            out.put_slice(line);
        }
        rest = &rest[end..];
    }
    out.freeze()
}

/// A JSON object with `"provider": provider` added first.
fn with_provider(doc: Vec<u8>, provider: Option<&str>) -> Bytes {
    let Some(p) = provider else {
        return Bytes::from(doc);
    };
    let Some(open) = memchr::memchr(b'{', &doc) else {
        return Bytes::from(doc);
    };
    let mut out = BytesMut::with_capacity(doc.len() + p.len() + 16);
    out.put_slice(&doc[..=open]);
    out.put_slice(b"\"provider\":");
    out.put_slice(&serde_json::to_vec(p).unwrap_or_default());
    if doc[open + 1..]
        .iter()
        .any(|b| !b.is_ascii_whitespace() && *b != b'}')
    {
        out.put_u8(b',');
    }
    out.put_slice(&doc[open + 1..]);
    out.freeze()
}

/// Whether a refused body says the prompt is over the model's context window, in either
/// dialect's wording.
pub fn is_context_length_error(refused: &[u8]) -> bool {
    openai::is_context_length_error(refused) || super::anthropic::is_context_length_error(refused)
}

/// The event that ends a caller's stream abnormally, in the caller's dialect.
pub fn stream_error_event(surface: Surface, message: &str, code: &str) -> Bytes {
    match surface.dialect() {
        Dialect::Anthropic => super::anthropic::sse_error_event(message),
        Dialect::OpenAi => openai::sse_error_event_for(surface, message, code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(surface: Surface, conversion: Conversion, provider: Option<&str>) -> Reply<'_> {
        Reply {
            surface,
            conversion,
            caller_model: Bytes::from_static(b"\"my-model\""),
            provider,
            strip_usage: false,
            caller_usage: false,
            price: None,
        }
    }

    fn run(relay: &mut Relay, chunks: &[&'static [u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let mut body = Some(Bytes::from_static(c));
            relay.filter(&mut body, i + 1 == chunks.len());
            out.extend_from_slice(body.as_deref().unwrap_or_default());
        }
        out
    }

    #[test]
    fn an_anthropic_answer_reaches_a_chat_caller_as_a_completion_with_the_provider_named() {
        let r = reply(
            Surface::ChatCompletions,
            Conversion::ChatToMessages,
            Some("claude-direct"),
        );
        let mut relay = Relay::json(&r, Some(10));
        assert!(relay.changes_length());
        let out = run(
            &mut relay,
            &[br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#],
        );
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["model"], "my-model");
        assert_eq!(v["provider"], "claude-direct");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(relay.signals().usage.map(|u| u.prompt_tokens), Some(3));
        assert!(relay.signals().content && relay.bad_upstream().is_none());
    }

    #[test]
    fn a_chat_answer_without_choices_is_bad_for_a_messages_caller() {
        let r = reply(Surface::Messages, Conversion::MessagesToChat, None);
        let mut relay = Relay::json(&r, None);
        run(&mut relay, &[br#"{"id":"x","model":"m","choices":[]}"#]);
        assert_eq!(relay.bad_upstream(), Some(BadUpstream::EmptyChoices));
        assert!(relay.signals().empty_choices && !relay.signals().content);
    }

    #[test]
    fn same_dialect_json_names_the_provider_and_keeps_its_length() {
        let body: &'static [u8] =
            br#"{"id":"c","model":"gpt-4o","choices":[{"message":{"content":"x"}}]}"#;
        let r = reply(Surface::ChatCompletions, Conversion::Same, Some("p1"));
        let mut relay = Relay::json(&r, Some(body.len()));
        let fixed = relay.fixed_len().expect("length kept");
        let out = run(&mut relay, &[body]);
        assert_eq!(out.len(), fixed);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            (v["model"].as_str(), v["provider"].as_str()),
            (Some("my-model"), Some("p1"))
        );
    }

    /// A length-framed answer whose end comes after its last byte (a `Content-Length` body
    /// read whole, then the end with no bytes) relays the same bytes and signals as one whose
    /// end comes with it: an unpriced OpenAI answer is released at once, a priced one (its
    /// cost spliced at the end) and an Anthropic one (its signals read at the end) wait.
    #[test]
    fn an_answer_read_whole_before_its_end_relays_as_one_that_ends_with_it() {
        let chat: &'static [u8] = br#"{"id":"c","model":"gpt-4o","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
        let message: &'static [u8] = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;
        let price = Price {
            input_per_mtok: 2.5,
            output_per_mtok: 10.0,
            cached_input_per_mtok: None,
        };
        let cases = [
            (Surface::ChatCompletions, None, chat),
            (Surface::ChatCompletions, Some(price), chat),
            (Surface::Messages, None, message),
        ];
        for (surface, price, body) in cases {
            let r = Reply {
                price,
                ..reply(surface, Conversion::Same, Some("p1"))
            };
            let mut together = Relay::json(&r, Some(body.len()));
            let reference = run(&mut together, &[body]);
            let mut apart = Relay::json(&r, Some(body.len()));
            let mut out = Vec::new();
            let mut first = Some(Bytes::from_static(body));
            apart.filter(&mut first, false);
            let released_at_once = first.as_ref().is_some_and(|b| !b.is_empty());
            out.extend_from_slice(first.as_deref().unwrap_or_default());
            let mut end = None;
            apart.filter(&mut end, true);
            out.extend_from_slice(end.as_deref().unwrap_or_default());
            assert_eq!(out, reference, "{surface:?} priced: {}", price.is_some());
            assert_eq!(apart.signals(), together.signals(), "{surface:?}");
            assert!(apart.signals().usage.is_some(), "{surface:?}");
            assert_eq!(
                released_at_once,
                surface == Surface::ChatCompletions && price.is_none(),
                "{surface:?} priced: {}",
                price.is_some()
            );
            if price.is_some() {
                let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
                assert!(v["usage"]["cost_usd"].is_number(), "{v}");
            }
        }
    }

    #[test]
    fn a_chat_stream_reaches_a_messages_caller_event_by_event() {
        let r = reply(Surface::Messages, Conversion::MessagesToChat, None);
        let mut relay = Relay::sse(&r);
        let mut body = Some(Bytes::from_static(
            b"data: {\"id\":\"c1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        ));
        relay.filter(&mut body, false);
        assert!(!relay.signals().content, "a role is not content");
        let mut body = Some(Bytes::from_static(
            b"data: {\"id\":\"c1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        ));
        relay.filter(&mut body, false);
        assert!(relay.signals().content);
        let text = String::from_utf8(body.expect("converted").to_vec()).expect("utf8");
        assert!(
            text.contains("content_block_delta") && text.contains("Hel"),
            "{text}"
        );
    }

    #[test]
    fn refusals_take_the_callers_shape() {
        let mut relay = Relay::refusal(Surface::Messages, Conversion::MessagesToChat, 400);
        let out = run(
            &mut relay,
            &[br#"{"error":{"message":"bad","type":"invalid_request_error","code":null}}"#],
        );
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let mut relay = Relay::refusal(Surface::ChatCompletions, Conversion::ChatToMessages, 400);
        let out = run(
            &mut relay,
            &[br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 300000 tokens > 200000 maximum"}}"#],
        );
        assert!(is_context_length_error(
            relay.refused_body().expect("sniffed")
        ));
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert!(v["error"]["message"].is_string());
    }

    #[test]
    fn a_providers_error_event_is_reworded_in_the_callers_dialect() {
        let r = reply(Surface::Messages, Conversion::Same, None);
        let mut relay = Relay::sse(&r);
        let out = run(
            &mut relay,
            &[b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"internal shard 7 at 10.0.0.3\"}}\n\n"],
        );
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.starts_with("event: error\ndata: {"), "{text}");
        assert!(
            text.contains("overloaded_error") && !text.contains("10.0.0.3"),
            "{text}"
        );
        let r = reply(Surface::ChatCompletions, Conversion::Same, None);
        let mut relay = Relay::sse(&r);
        let out = run(
            &mut relay,
            &[b"data: {\"error\":{\"message\":\"secret detail\",\"type\":\"server_error\"}}\n\n"],
        );
        let text = String::from_utf8(out).expect("utf8");
        assert!(
            text.contains("upstream_stream_error") && !text.contains("secret"),
            "{text}"
        );
        assert_eq!(relay.signals().error, Some(InbandError::Server));
    }

    #[test]
    fn broken_streams_end_with_the_callers_error_event() {
        let a = stream_error_event(Surface::Messages, "gone", "upstream_stream_interrupted");
        assert!(a.starts_with(b"event: error\n"));
        let o = stream_error_event(
            Surface::ChatCompletions,
            "gone",
            "upstream_stream_interrupted",
        );
        assert!(o.starts_with(b"data: {\"error\""));
    }
}
