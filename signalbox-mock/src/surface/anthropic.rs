//! Anthropic's surfaces: Messages and count tokens.
//!
//! A Messages answer is one or two content blocks: with thinking enabled a `thinking` block
//! (the thinking text over `chunks` `thinking_delta`s, then one `signature_delta`), then a
//! `text` block (the reply over `chunks` `text_delta`s) or a `tool_use` block (the arguments
//! over `chunks` `input_json_delta`s). Content events number the deltas of every block in order;
//! a block's `content_block_start` goes out with its first delta (the first one followed by
//! `ping`), its `content_block_stop` with the next block's start or the finish.

use serde_json::{json, Value};

use super::{
    anthropic_error, byte_piece, default_inband_type, Ctx, Frames, Surface, INBAND_MESSAGE,
    SIGNATURE, THINKING, TOOL_ARGUMENTS,
};
use crate::wire::Reply;
use crate::Dialect;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool,
}

/// `POST .../messages`.
pub(crate) struct Messages<'a> {
    cx: Ctx<'a>,
    thinking: Reply,
    /// The block whose `content_block_start` went out last.
    open: Option<usize>,
    pinged: bool,
}

impl<'a> Messages<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> Messages<'a> {
        Messages {
            cx,
            thinking: Reply::new(THINKING),
            open: None,
            pinged: false,
        }
    }

    fn blocks(&self) -> &'static [Block] {
        match (self.cx.thinking, self.cx.tool.is_some()) {
            (false, false) => &[Block::Text],
            (false, true) => &[Block::Tool],
            (true, false) => &[Block::Thinking, Block::Text],
            (true, true) => &[Block::Thinking, Block::Tool],
        }
    }

    fn deltas(&self, block: Block) -> usize {
        match block {
            Block::Thinking => self.cx.chunks + 1,
            Block::Text | Block::Tool => self.cx.chunks,
        }
    }

    fn stop_reason(&self) -> &'static str {
        if self.cx.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        }
    }

    fn tool_id(&self) -> String {
        format!("toolu_mock_{}", self.cx.n)
    }

    fn usage(&self) -> Value {
        json!({
            "input_tokens": self.cx.prompt_tokens,
            "output_tokens": self.cx.completion_tokens(),
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        })
    }

    fn message(&self, content: Value, stop_reason: Value, usage: Value) -> Value {
        json!({
            "id": format!("msg_mock_{}", self.cx.n),
            "type": "message",
            "role": "assistant",
            "model": self.cx.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": usage,
        })
    }

    /// A block as it is when complete (the JSON answer).
    fn whole(&self, block: Block) -> Value {
        match block {
            Block::Thinking => json!({
                "type": "thinking",
                "thinking": THINKING,
                "signature": SIGNATURE,
            }),
            Block::Text => json!({"type": "text", "text": self.cx.reply.text()}),
            Block::Tool => {
                let input: Value = serde_json::from_str(TOOL_ARGUMENTS).unwrap_or(Value::Null);
                json!({
                    "type": "tool_use",
                    "id": self.tool_id(),
                    "name": self.cx.tool.unwrap_or_default(),
                    "input": input,
                })
            }
        }
    }

    /// A block as `content_block_start` announces it (empty).
    fn empty_block(&self, block: Block) -> Value {
        match block {
            Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Text => json!({"type": "text", "text": ""}),
            Block::Tool => json!({
                "type": "tool_use",
                "id": self.tool_id(),
                "name": self.cx.tool.unwrap_or_default(),
                "input": {},
            }),
        }
    }

    fn delta(&self, block: Block, j: usize) -> Value {
        let k = self.cx.chunks;
        match block {
            Block::Thinking if j == k => json!({"type": "signature_delta", "signature": SIGNATURE}),
            Block::Thinking => {
                json!({"type": "thinking_delta", "thinking": self.thinking.piece(j, k)})
            }
            Block::Text => json!({"type": "text_delta", "text": self.cx.reply.piece(j, k)}),
            Block::Tool => {
                json!({"type": "input_json_delta", "partial_json": byte_piece(TOOL_ARGUMENTS, j, k)})
            }
        }
    }

    fn start_block(&mut self, f: &mut Frames<'_>, index: usize) {
        if let Some(open) = self.open {
            f.named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": open}),
            );
        }
        let block = self.empty_block(self.blocks()[index]);
        f.named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        self.open = Some(index);
        if !self.pinged {
            self.pinged = true;
            f.named("ping", &json!({"type": "ping"}));
        }
    }
}

impl Surface for Messages<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Anthropic
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        let content: Vec<Value> = self.blocks().iter().map(|b| self.whole(*b)).collect();
        let v = self.message(json!(content), json!(self.stop_reason()), self.usage());
        super::push_json(out, &v);
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        let v = self.message(json!([]), json!("end_turn"), self.usage());
        super::push_json(out, &v);
    }

    fn start(&mut self, f: &mut Frames<'_>, _forced: bool) {
        let usage = json!({
            "input_tokens": self.cx.prompt_tokens,
            "output_tokens": 1,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        });
        let message = self.message(json!([]), Value::Null, usage);
        f.named(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
    }

    fn contents(&self) -> usize {
        self.blocks().iter().map(|b| self.deltas(*b)).sum()
    }

    fn content(&mut self, f: &mut Frames<'_>, i: usize) {
        let blocks = self.blocks();
        let mut index = 0;
        let mut j = i;
        while index + 1 < blocks.len() && j >= self.deltas(blocks[index]) {
            j -= self.deltas(blocks[index]);
            index += 1;
        }
        if self.open != Some(index) {
            self.start_block(f, index);
        }
        let delta = self.delta(blocks[index], j);
        f.named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
    }

    fn finish(&mut self, f: &mut Frames<'_>) {
        // Blocks without a delta (no chunks) still open and close.
        let next = self.open.map_or(0, |o| o + 1);
        for index in next..self.blocks().len() {
            self.start_block(f, index);
        }
        if let Some(open) = self.open.take() {
            f.named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": open}),
            );
        }
        f.named(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                // Cumulative, the input counts repeated, as the API sends them now.
                "usage": {
                    "input_tokens": self.cx.prompt_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": self.cx.completion_tokens(),
                },
            }),
        );
        f.named("message_stop", &json!({"type": "message_stop"}));
    }

    fn error(&mut self, f: &mut Frames<'_>, error_type: Option<&str>) {
        let kind = error_type.unwrap_or(default_inband_type(Dialect::Anthropic));
        f.named("error", &anthropic_error(kind, INBAND_MESSAGE));
    }

    fn empty(&mut self, f: &mut Frames<'_>) {
        self.start(f, false);
        f.named("message_stop", &json!({"type": "message_stop"}));
    }
}

/// `POST .../messages/count_tokens`: never streamed.
pub(crate) struct CountTokens<'a> {
    cx: Ctx<'a>,
}

impl<'a> CountTokens<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> CountTokens<'a> {
        CountTokens { cx }
    }
}

impl Surface for CountTokens<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Anthropic
    }

    fn streams(&self) -> bool {
        false
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        super::push_json(out, &json!({"input_tokens": self.cx.prompt_tokens}));
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        super::push_json(out, &json!({"input_tokens": 0}));
    }

    // Never streamed (`streams` is false): no events.
    fn start(&mut self, _: &mut Frames<'_>, _: bool) {}
    fn contents(&self) -> usize {
        0
    }
    fn content(&mut self, _: &mut Frames<'_>, _: usize) {}
    fn finish(&mut self, _: &mut Frames<'_>) {}
    fn error(&mut self, _: &mut Frames<'_>, _: Option<&str>) {}
    fn empty(&mut self, _: &mut Frames<'_>) {}
}
