//! Streams, event by event: an Anthropic Messages stream for a chat caller
//! ([`MessagesStreamToChat`]) and a chat completion stream for a messages caller
//! ([`ChatStreamToMessages`]).
//!
//! Each converter reads its input through the shared SSE reader (one partial event of carry)
//! and writes the caller's events the moment each input event is complete: nothing is held
//! back, tool-call arguments pass on delta by delta, never accumulated. Each event is parsed
//! on its own into structs that borrow from it. What they keep between events is small and
//! bounded: the answer's id, which content block is which, the stop reason and usage.
//!
//! Both keep [`Signals`] as they go: `content` turns true at the first text, tool-call (name
//! or arguments) or thinking delta — never at `message_start`, a role-only chunk or a ping;
//! `terminal` at `message_stop` / `data: [DONE]`; `error` at the provider's in-band error
//! event (relayed in the caller's shape, in signalbox's words, and never followed by a clean
//! end); `usage` from `message_start` and `message_delta`, or the chat usage chunk;
//! `empty_choices` at a chat chunk with `"choices": []` and no usage.
//!
//! A stream that ends without its terminal event is left unterminated: `finish` completes a
//! last event that lacked its blank line, and the proxy, seeing `terminal` false, ends the
//! caller's stream with its error event.

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use super::error::ErrorKind;
use super::sse::{SseEvent, SseReader};
use super::{
    anthropic_usage_json, finish_reason_for, now_unix, openai_usage_json, stop_reason_for,
    BadUpstream,
};
use crate::adapters::stream::{Signals, Usage};

/// More content blocks than any answer has: a higher index is a broken stream.
const MAX_BLOCKS: usize = 4096;

/// A JSON string literal (quotes included) into `out`.
fn put_str(out: &mut BytesMut, s: &str) {
    // Writing to a BytesMut cannot fail.
    let _ = serde_json::to_writer(out.writer(), s);
}

fn json_literal(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_else(|_| b"\"\"".to_vec())
}

fn put_u64(out: &mut BytesMut, n: u64) {
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Why an event's data could not be read: not JSON at all, or JSON of the wrong shape.
fn unreadable(e: &serde_json::Error) -> BadUpstream {
    match e.classify() {
        serde_json::error::Category::Data => BadUpstream::Malformed("an event of the wrong shape"),
        _ => BadUpstream::NotJson,
    }
}

// === Anthropic → chat ===

/// An Anthropic event, flat: each type reads the members it has.
#[derive(Deserialize)]
struct AnthropicEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    index: Option<usize>,
    #[serde(borrow)]
    message: Option<StartMessage<'a>>,
    #[serde(borrow)]
    content_block: Option<StartBlock<'a>>,
    #[serde(borrow)]
    delta: Option<AnthropicDelta<'a>>,
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct StartMessage<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct StartBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow)]
    data: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AnthropicDelta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow)]
    signature: Option<Cow<'a, str>>,
    #[serde(borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

/// Anthropic's usage figures as reported so far (`message_delta` counts are cumulative and
/// may repeat or complete `message_start`'s).
#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct AnthropicUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

impl AnthropicUsage {
    fn merge(&mut self, later: &AnthropicUsage) {
        self.input_tokens = later.input_tokens.or(self.input_tokens);
        self.output_tokens = later.output_tokens.or(self.output_tokens);
        self.cache_read_input_tokens = later
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
        self.cache_creation_input_tokens = later
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
    }

    fn usage(&self) -> Usage {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let write = self.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            prompt_tokens: self.input_tokens.unwrap_or(0) + read + write,
            completion_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: read,
            cache_write_tokens: write,
        }
    }
}

/// What an Anthropic content block is, by its index, for the deltas that follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Unknown,
    Text,
    /// A `tool_use` block: its position among the tool calls (chat's `tool_calls[].index`).
    Tool(u32),
    Thinking,
}

/// An Anthropic Messages stream (`event: …` / `data: {…}`) as a chat completion stream
/// (`data: {chunk}` … `data: [DONE]`) for a chat caller.
///
/// `message_start` becomes the role chunk; text, thinking (`reasoning_content`) and
/// `tool_use` blocks become content, reasoning and `tool_calls[index]` deltas (the id and
/// name first, then each `input_json_delta` as an arguments delta); a thinking block's
/// `signature_delta`, and a `redacted_thinking` block, become a `thinking_blocks` delta, so a
/// caller can send the signed block back; `message_delta` becomes the finish chunk (and the
/// usage chunk when the caller asked for usage); `message_stop` becomes `data: [DONE]`; an
/// `error` event becomes chat's `data: {"error": …}`; pings are dropped.
#[derive(Debug)]
pub struct MessagesStreamToChat {
    reader: SseReader,
    state: MessagesToChatState,
}

#[derive(Debug)]
struct MessagesToChatState {
    caller_model: Vec<u8>,
    usage_for_caller: bool,
    created: u64,
    /// Every chunk's opening, up to `"choices":` (rebuilt when `message_start` names the id).
    head: Vec<u8>,
    blocks: Vec<BlockKind>,
    tool_calls: u32,
    /// `message_start` was seen and its role chunk not yet sent: it goes out with the first
    /// delta, shaped as OpenAI's (`"content": ""` before text, `"content": null` merged into
    /// the first tool call's delta when the answer opens with a tool call).
    role_pending: bool,
    usage: AnthropicUsage,
    signals: Signals,
}

impl MessagesStreamToChat {
    /// `caller_model` goes in every chunk's `model`; `usage_for_caller` is whether the caller
    /// asked for usage (`stream_options.include_usage`): without it no usage chunk is sent,
    /// but the usage is still recorded in [`signals`](Self::signals).
    pub fn new(caller_model: &str, usage_for_caller: bool) -> Self {
        Self::new_at(caller_model, usage_for_caller, now_unix())
    }

    fn new_at(caller_model: &str, usage_for_caller: bool, created: u64) -> Self {
        let mut state = MessagesToChatState {
            caller_model: json_literal(caller_model),
            usage_for_caller,
            created,
            head: Vec::new(),
            blocks: Vec::new(),
            tool_calls: 0,
            role_pending: false,
            usage: AnthropicUsage::default(),
            signals: Signals::default(),
        };
        state.set_head("");
        Self {
            reader: SseReader::default(),
            state,
        }
    }

    /// Read a chunk of the provider's stream and write what it completes, converted, to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream> {
        let Self { reader, state } = self;
        reader.feed(chunk, &mut |ev| state.event(ev, out))
    }

    /// The provider's stream ended: a last event that lacked its blank line is converted.
    pub fn finish(&mut self, out: &mut BytesMut) {
        let Self { reader, state } = self;
        // An unreadable remnant at the very end is dropped: `terminal` tells the proxy the
        // stream did not end properly.
        let _ = reader.finish(&mut |ev| state.event(ev, out));
    }

    pub fn signals(&self) -> &Signals {
        &self.state.signals
    }

    /// Every object that names the model names the provider too (`response.provider_field`):
    /// `"provider": provider` follows the `model` member.
    pub fn with_provider(mut self, provider: &str) -> Self {
        self.state.caller_model.extend_from_slice(b",\"provider\":");
        self.state
            .caller_model
            .extend_from_slice(&json_literal(provider));
        self.state.set_head("");
        self
    }
}

impl MessagesToChatState {
    fn set_head(&mut self, id: &str) {
        let mut head = BytesMut::with_capacity(96 + id.len() + self.caller_model.len());
        head.put_slice(b"{\"id\":");
        put_str(&mut head, id);
        head.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        put_u64(&mut head, self.created);
        head.put_slice(b",\"model\":");
        head.put_slice(&self.caller_model);
        head.put_slice(b",\"choices\":");
        self.head = head.to_vec();
    }

    /// One chunk with one choice: `delta` writes the delta object.
    fn chunk(
        &self,
        out: &mut BytesMut,
        finish_reason: Option<&str>,
        delta: impl FnOnce(&mut BytesMut),
    ) {
        out.put_slice(b"data: ");
        out.put_slice(&self.head);
        out.put_slice(b"[{\"index\":0,\"delta\":");
        delta(out);
        out.put_slice(b",\"logprobs\":null,\"finish_reason\":");
        match finish_reason {
            Some(r) => put_str(out, r),
            None => out.put_slice(b"null"),
        }
        out.put_slice(b"}]}\n\n");
    }

    /// The role chunk, if it is still owed: before any other delta.
    fn open(&mut self, out: &mut BytesMut) {
        if std::mem::take(&mut self.role_pending) {
            self.chunk(out, None, |o| {
                o.put_slice(b"{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}");
            });
        }
    }

    /// A delta with one string member.
    fn string_delta(&mut self, out: &mut BytesMut, key: &[u8], value: &str) {
        self.open(out);
        self.chunk(out, None, |o| {
            o.put_slice(key);
            put_str(o, value);
            o.put_slice(b"}");
        });
    }

    fn content(&mut self, out: &mut BytesMut, text: &str) {
        if !text.is_empty() {
            self.signals.content = true;
            self.string_delta(out, b"{\"content\":", text);
        }
    }

    fn reasoning(&mut self, out: &mut BytesMut, text: &str) {
        if !text.is_empty() {
            self.signals.content = true;
            self.string_delta(out, b"{\"reasoning_content\":", text);
        }
    }

    fn block_kind(&self, index: Option<usize>) -> BlockKind {
        index
            .and_then(|i| self.blocks.get(i).copied())
            .unwrap_or(BlockKind::Unknown)
    }

    fn event(&mut self, ev: SseEvent<'_>, out: &mut BytesMut) -> Result<(), BadUpstream> {
        let SseEvent::Data(data) = ev else {
            return Ok(());
        };
        let e: AnthropicEvent<'_> = serde_json::from_slice(data).map_err(|e| unreadable(&e))?;
        match &*e.kind {
            "message_start" => {
                let message = e
                    .message
                    .ok_or(BadUpstream::Malformed("message_start without a message"))?;
                self.set_head(message.id.as_deref().unwrap_or_default());
                if let Some(u) = &message.usage {
                    self.usage.merge(u);
                    self.signals.usage = Some(self.usage.usage());
                }
                self.role_pending = true;
            }
            "content_block_start" => {
                let index = e
                    .index
                    .filter(|i| *i < MAX_BLOCKS)
                    .ok_or(BadUpstream::Malformed("a content block without an index"))?;
                let block = e.content_block.ok_or(BadUpstream::Malformed(
                    "content_block_start without a block",
                ))?;
                let kind = match &*block.kind {
                    "text" => {
                        self.content(out, block.text.as_deref().unwrap_or_default());
                        BlockKind::Text
                    }
                    "tool_use" => {
                        let ordinal = self.tool_calls;
                        self.tool_calls += 1;
                        self.signals.content = true;
                        // An answer that opens with a tool call: its role chunk is this one,
                        // with `content: null`, as OpenAI sends it.
                        let role = std::mem::take(&mut self.role_pending);
                        self.chunk(out, None, |o| {
                            if role {
                                o.put_slice(b"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"index\":");
                            } else {
                                o.put_slice(b"{\"tool_calls\":[{\"index\":");
                            }
                            put_u64(o, u64::from(ordinal));
                            o.put_slice(b",\"id\":");
                            put_str(o, block.id.as_deref().unwrap_or_default());
                            o.put_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                            put_str(o, block.name.as_deref().unwrap_or_default());
                            o.put_slice(b",\"arguments\":\"\"}}]}");
                        });
                        BlockKind::Tool(ordinal)
                    }
                    "thinking" => {
                        self.reasoning(out, block.thinking.as_deref().unwrap_or_default());
                        BlockKind::Thinking
                    }
                    "redacted_thinking" => {
                        self.signals.content = true;
                        self.open(out);
                        self.chunk(out, None, |o| {
                            o.put_slice(
                                b"{\"thinking_blocks\":[{\"type\":\"redacted_thinking\",\"data\":",
                            );
                            put_str(o, block.data.as_deref().unwrap_or_default());
                            o.put_slice(b"}]}");
                        });
                        BlockKind::Thinking
                    }
                    _ => BlockKind::Unknown,
                };
                if self.blocks.len() <= index {
                    self.blocks.resize(index + 1, BlockKind::Unknown);
                }
                self.blocks[index] = kind;
            }
            "content_block_delta" => {
                let delta = e.delta.ok_or(BadUpstream::Malformed(
                    "content_block_delta without a delta",
                ))?;
                match delta.kind.as_deref().unwrap_or_default() {
                    "text_delta" => self.content(out, delta.text.as_deref().unwrap_or_default()),
                    "thinking_delta" => {
                        self.reasoning(out, delta.thinking.as_deref().unwrap_or_default());
                    }
                    "input_json_delta" => {
                        let BlockKind::Tool(ordinal) = self.block_kind(e.index) else {
                            return Err(BadUpstream::Malformed(
                                "input_json_delta outside a tool_use block",
                            ));
                        };
                        let args = delta.partial_json.as_deref().unwrap_or_default();
                        if !args.is_empty() {
                            self.signals.content = true;
                            self.open(out);
                            self.chunk(out, None, |o| {
                                o.put_slice(b"{\"tool_calls\":[{\"index\":");
                                put_u64(o, u64::from(ordinal));
                                o.put_slice(b",\"function\":{\"arguments\":");
                                put_str(o, args);
                                o.put_slice(b"}}]}");
                            });
                        }
                    }
                    "signature_delta" => {
                        let signature = delta.signature.as_deref().unwrap_or_default();
                        self.open(out);
                        self.chunk(out, None, |o| {
                            o.put_slice(
                                b"{\"thinking_blocks\":[{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":",
                            );
                            put_str(o, signature);
                            o.put_slice(b"}]}");
                        });
                    }
                    // citations_delta and whatever comes next: nothing chat can show.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(u) = &e.usage {
                    self.usage.merge(u);
                    self.signals.usage = Some(self.usage.usage());
                }
                let stop_reason = e.delta.as_ref().and_then(|d| d.stop_reason.as_deref());
                let finish = finish_reason_for(stop_reason.unwrap_or("end_turn"));
                self.open(out);
                self.chunk(out, Some(finish), |o| o.put_slice(b"{}"));
                if self.usage_for_caller {
                    out.put_slice(b"data: ");
                    out.put_slice(&self.head);
                    out.put_slice(b"[],\"usage\":");
                    out.put_slice(
                        openai_usage_json(&self.usage.usage())
                            .to_string()
                            .as_bytes(),
                    );
                    out.put_slice(b"}\n\n");
                }
            }
            "message_stop" => {
                self.signals.terminal = true;
                out.put_slice(b"data: [DONE]\n\n");
            }
            "error" => {
                let kind = ErrorKind::from_anthropic(200, data);
                self.signals.error = Some(kind.inband());
                out.put_slice(b"data: ");
                out.put_slice(&kind.openai_body());
                out.put_slice(b"\n\n");
            }
            // ping, content_block_stop, and event types Anthropic may add: nothing to say.
            _ => {}
        }
        Ok(())
    }
}

// === chat → Anthropic ===

#[derive(Deserialize)]
struct ChatChunk<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    usage: Option<Value>,
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    delta: Option<ChunkDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    refusal: Option<Cow<'a, str>>,
    /// Unsigned reasoning (DeepSeek, vLLM, OpenRouter name it either way): a sign of life,
    /// never forwarded (see the module documentation of `chat_messages`).
    reasoning_content: Option<Value>,
    reasoning: Option<Value>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCallDelta<'a>>>,
}

#[derive(Deserialize)]
struct ToolCallDelta<'a> {
    index: Option<u32>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// A tool call seen in the chat stream and the Anthropic block carrying it.
#[derive(Debug)]
struct ToolBlock {
    chat_index: u32,
    id: String,
    block: u32,
}

/// A chat completion stream as an Anthropic Messages stream for a messages caller.
///
/// The first chunk becomes `message_start`; content (and refusal) deltas a text block; each
/// new `tool_calls[index]` a `tool_use` block (id and name) whose argument deltas pass on as
/// `input_json_delta`s; a block is closed (`content_block_stop`) when another starts or the
/// choice finishes; the finish reason and the usage chunk become `message_delta`;
/// `data: [DONE]` becomes `message_stop`; a chat `error` event becomes `event: error`; a
/// keep-alive comment becomes a `ping`. Unsigned reasoning deltas are not forwarded.
#[derive(Debug)]
pub struct ChatStreamToMessages {
    reader: SseReader,
    state: ChatToMessagesState,
}

#[derive(Debug)]
struct ChatToMessagesState {
    caller_model: Vec<u8>,
    started: bool,
    next_block: u32,
    /// The block being written (its index), if one is open.
    open: Option<u32>,
    /// Whether the open block is text (a tool block otherwise).
    open_is_text: bool,
    tools: Vec<ToolBlock>,
    stop_reason: Option<&'static str>,
    /// `message_delta` was written.
    delta_sent: bool,
    usage: Option<Usage>,
    signals: Signals,
}

impl ChatStreamToMessages {
    /// `caller_model` goes in `message_start`. Anthropic's events always carry usage (the
    /// dialect requires it), so a messages caller gets usage whatever `usage_for_caller`
    /// says; it is recorded in [`signals`](Self::signals) either way.
    pub fn new(caller_model: &str, usage_for_caller: bool) -> Self {
        let _ = usage_for_caller;
        Self {
            reader: SseReader::default(),
            state: ChatToMessagesState {
                caller_model: json_literal(caller_model),
                started: false,
                next_block: 0,
                open: None,
                open_is_text: false,
                tools: Vec::new(),
                stop_reason: None,
                delta_sent: false,
                usage: None,
                signals: Signals::default(),
            },
        }
    }

    /// Read a chunk of the provider's stream and write what it completes, converted, to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), BadUpstream> {
        let Self { reader, state } = self;
        reader.feed(chunk, &mut |ev| state.event(ev, out))
    }

    /// The provider's stream ended: a last event that lacked its blank line is converted.
    pub fn finish(&mut self, out: &mut BytesMut) {
        let Self { reader, state } = self;
        let _ = reader.finish(&mut |ev| state.event(ev, out));
    }

    pub fn signals(&self) -> &Signals {
        &self.state.signals
    }

    /// Every object that names the model names the provider too (`response.provider_field`):
    /// `"provider": provider` follows the `model` member.
    pub fn with_provider(mut self, provider: &str) -> Self {
        self.state.caller_model.extend_from_slice(b",\"provider\":");
        self.state
            .caller_model
            .extend_from_slice(&json_literal(provider));
        self
    }
}

/// `event: <name>\ndata: ` — the caller writes the JSON and `\n\n`.
fn event_head(out: &mut BytesMut, name: &str) {
    out.put_slice(b"event: ");
    out.put_slice(name.as_bytes());
    out.put_slice(b"\ndata: ");
}

impl ChatToMessagesState {
    fn start(&mut self, out: &mut BytesMut, id: &str) {
        self.started = true;
        event_head(out, "message_start");
        out.put_slice(b"{\"type\":\"message_start\",\"message\":{\"id\":");
        put_str(out, id);
        out.put_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        out.put_slice(&self.caller_model);
        out.put_slice(b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
        let usage = anthropic_usage_json(&self.usage.unwrap_or_default());
        out.put_slice(usage.to_string().as_bytes());
        out.put_slice(b"}}\n\n");
    }

    fn close_block(&mut self, out: &mut BytesMut) {
        if let Some(index) = self.open.take() {
            event_head(out, "content_block_stop");
            out.put_slice(b"{\"type\":\"content_block_stop\",\"index\":");
            put_u64(out, u64::from(index));
            out.put_slice(b"}\n\n");
        }
    }

    fn text(&mut self, out: &mut BytesMut, text: &str) {
        if text.is_empty() {
            return;
        }
        self.signals.content = true;
        let index = match self.open {
            Some(i) if self.open_is_text => i,
            _ => {
                self.close_block(out);
                let i = self.next_block;
                self.next_block += 1;
                self.open = Some(i);
                self.open_is_text = true;
                event_head(out, "content_block_start");
                out.put_slice(b"{\"type\":\"content_block_start\",\"index\":");
                put_u64(out, u64::from(i));
                out.put_slice(b",\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
                i
            }
        };
        event_head(out, "content_block_delta");
        out.put_slice(b"{\"type\":\"content_block_delta\",\"index\":");
        put_u64(out, u64::from(index));
        out.put_slice(b",\"delta\":{\"type\":\"text_delta\",\"text\":");
        put_str(out, text);
        out.put_slice(b"}}\n\n");
    }

    fn tool_call(
        &mut self,
        out: &mut BytesMut,
        call: &ToolCallDelta<'_>,
    ) -> Result<(), BadUpstream> {
        let id = call.id.as_deref().filter(|id| !id.is_empty());
        // Providers that leave `index` out send one call at a time: a call with an id is a
        // new one, a call without one continues the last.
        let chat_index = call.index.unwrap_or_else(|| match (id, self.tools.last()) {
            (None, Some(last)) => last.chat_index,
            _ => u32::try_from(self.tools.len()).unwrap_or(u32::MAX),
        });
        let known = self
            .tools
            .iter()
            .rposition(|t| t.chat_index == chat_index)
            .filter(|&at| id.is_none_or(|id| self.tools[at].id == id));
        let block = match known {
            Some(at) => self.tools[at].block,
            None => {
                if self.tools.len() >= MAX_BLOCKS {
                    return Err(BadUpstream::Malformed("too many tool calls"));
                }
                self.close_block(out);
                let block = self.next_block;
                self.next_block += 1;
                self.open = Some(block);
                self.open_is_text = false;
                let id = id.unwrap_or_default();
                let name = call
                    .function
                    .as_ref()
                    .and_then(|f| f.name.as_deref())
                    .unwrap_or_default();
                self.signals.content = true;
                event_head(out, "content_block_start");
                out.put_slice(b"{\"type\":\"content_block_start\",\"index\":");
                put_u64(out, u64::from(block));
                out.put_slice(b",\"content_block\":{\"type\":\"tool_use\",\"id\":");
                put_str(out, id);
                out.put_slice(b",\"name\":");
                put_str(out, name);
                out.put_slice(b",\"input\":{}}}\n\n");
                self.tools.push(ToolBlock {
                    chat_index,
                    id: id.to_string(),
                    block,
                });
                block
            }
        };
        let args = call
            .function
            .as_ref()
            .and_then(|f| f.arguments.as_deref())
            .unwrap_or_default();
        if !args.is_empty() {
            // A provider interleaving parallel calls sends a delta for a block already
            // closed; it still goes to its own index, which clients accumulate by.
            self.signals.content = true;
            event_head(out, "content_block_delta");
            out.put_slice(b"{\"type\":\"content_block_delta\",\"index\":");
            put_u64(out, u64::from(block));
            out.put_slice(b",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":");
            put_str(out, args);
            out.put_slice(b"}}\n\n");
        }
        Ok(())
    }

    fn message_delta(&mut self, out: &mut BytesMut) {
        self.delta_sent = true;
        event_head(out, "message_delta");
        out.put_slice(b"{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":");
        put_str(out, self.stop_reason.unwrap_or("end_turn"));
        out.put_slice(b",\"stop_sequence\":null},\"usage\":");
        let usage = anthropic_usage_json(&self.usage.unwrap_or_default());
        out.put_slice(usage.to_string().as_bytes());
        out.put_slice(b"}\n\n");
    }

    fn done(&mut self, out: &mut BytesMut) {
        if !self.started {
            self.start(out, "");
        }
        self.close_block(out);
        if !self.delta_sent {
            self.message_delta(out);
        }
        self.signals.terminal = true;
        event_head(out, "message_stop");
        out.put_slice(b"{\"type\":\"message_stop\"}\n\n");
    }

    fn event(&mut self, ev: SseEvent<'_>, out: &mut BytesMut) -> Result<(), BadUpstream> {
        let data = match ev {
            SseEvent::Comment => {
                // A keep-alive says the same as Anthropic's ping (after message_start only,
                // where Anthropic's clients expect pings).
                if self.started && !self.signals.terminal {
                    event_head(out, "ping");
                    out.put_slice(b"{\"type\":\"ping\"}\n\n");
                }
                return Ok(());
            }
            SseEvent::Data(data) => data,
        };
        if self.signals.terminal {
            // Nothing follows the end the caller was given.
            return Ok(());
        }
        if data == b"[DONE]" {
            self.done(out);
            return Ok(());
        }
        let chunk: ChatChunk<'_> = serde_json::from_slice(data).map_err(|e| unreadable(&e))?;
        if chunk.error.is_some() {
            let kind = ErrorKind::from_openai(200, data);
            self.signals.error = Some(kind.inband());
            event_head(out, "error");
            out.put_slice(&kind.anthropic_body());
            out.put_slice(b"\n\n");
            return Ok(());
        }
        let usage = chunk.usage.as_ref().and_then(super::usage_from_openai);
        if let Some(u) = usage {
            self.usage = Some(u);
            self.signals.usage = Some(u);
        }
        if !self.started {
            self.start(out, chunk.id.as_deref().unwrap_or_default());
        }
        if chunk.choices.as_ref().is_some_and(Vec::is_empty) && usage.is_none() {
            self.signals.empty_choices = true;
        }
        let choices = chunk.choices.unwrap_or_default();
        for choice in choices {
            // A translated request asks for one choice; any other is not the caller's.
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = &choice.delta {
                self.text(out, delta.content.as_deref().unwrap_or_default());
                self.text(out, delta.refusal.as_deref().unwrap_or_default());
                let reasoned = [&delta.reasoning_content, &delta.reasoning]
                    .iter()
                    .any(|r| r.as_ref().is_some_and(|v| v.as_str() != Some("")));
                if reasoned {
                    self.signals.content = true;
                }
                for call in delta.tool_calls.iter().flatten() {
                    self.tool_call(out, call)?;
                }
            }
            if let Some(reason) = choice.finish_reason.as_deref() {
                self.close_block(out);
                self.stop_reason = Some(stop_reason_for(reason));
            }
        }
        // The usage chunk follows the finish chunk when the provider reports usage; a
        // provider that puts both in one chunk is answered at once.
        if self.stop_reason.is_some() && usage.is_some() && !self.delta_sent {
            self.message_delta(out);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
