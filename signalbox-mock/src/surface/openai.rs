//! OpenAI's surfaces: chat completions, legacy completions, embeddings, Responses.

use serde_json::{json, Value};

use super::{
    byte_piece, openai_inband, push_json, Ctx, Frames, Surface, INBAND_MESSAGE, TOOL_ARGUMENTS,
};
use crate::wire;
use crate::Dialect;

fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// `data: {"error":{...}}`.
fn inband_event(f: &mut Frames<'_>, error_type: Option<&str>) {
    f.raw(|ev| {
        ev.extend_from_slice(b"data: ");
        openai_inband(ev, error_type.unwrap_or("server_error"));
        ev.extend_from_slice(b"\n\n");
    });
}

fn done(f: &mut Frames<'_>) {
    f.raw(|ev| ev.extend_from_slice(wire::DONE_EVENT));
}

// === Chat completions ===

/// `POST .../chat/completions`: text through `wire` (the load-tested path), tool calls and
/// the rarer chunks through serde.
pub(crate) struct Chat<'a> {
    cx: Ctx<'a>,
}

impl<'a> Chat<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> Chat<'a> {
        Chat { cx }
    }

    fn answer(&self) -> wire::Answer<'_> {
        self.cx.wire_answer(self.cx.completion_tokens())
    }

    fn id(&self) -> String {
        format!("chatcmpl-mock-{}", self.cx.n)
    }

    /// A `chat.completion.chunk` with one choice.
    fn chunk(&self, delta: Value) -> Value {
        json!({
            "id": self.id(),
            "object": "chat.completion.chunk",
            "created": self.cx.created,
            "model": self.cx.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
        })
    }
}

impl Surface for Chat<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::OpenAi
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        let Some(name) = self.cx.tool else {
            wire::completion_json(out, &self.answer(), Some(self.cx.reply.escaped()));
            return;
        };
        let body = json!({
            "id": self.id(),
            "object": "chat.completion",
            "created": self.cx.created,
            "model": self.cx.model,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": format!("call_mock_{}", self.cx.n),
                        "type": "function",
                        "function": {"name": name, "arguments": TOOL_ARGUMENTS},
                    }],
                },
                "finish_reason": "tool_calls",
            }],
            "usage": usage(self.cx.prompt_tokens, self.cx.completion_tokens()),
        });
        push_json(out, &body);
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        wire::completion_json(out, &self.answer(), None);
    }

    /// A text answer opens with a role-only chunk, as OpenAI's do (openai-node's
    /// `finalChatCompletion()` needs the role); a tool call's first chunk carries the role
    /// itself, so it opens with nothing unless `forced`.
    fn start(&mut self, f: &mut Frames<'_>, forced: bool) {
        if self.cx.tool.is_none() {
            let answer = self.answer();
            f.raw(|ev| wire::role_event(ev, &answer));
        } else if forced {
            f.data(&self.chunk(json!({"role": "assistant", "content": ""})));
        }
    }

    fn contents(&self) -> usize {
        match self.cx.tool {
            None => self.cx.chunks,
            // The chunk naming the function, then the arguments.
            Some(_) => 1 + self.cx.chunks,
        }
    }

    fn content(&mut self, f: &mut Frames<'_>, i: usize) {
        match self.cx.tool {
            None => {
                let piece = self.cx.reply.piece(i, self.cx.chunks);
                let answer = self.answer();
                f.raw(|ev| wire::content_event(ev, &answer, piece));
            }
            Some(name) if i == 0 => f.data(&self.chunk(json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "index": 0,
                    "id": format!("call_mock_{}", self.cx.n),
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }],
            }))),
            Some(_) => {
                let piece = byte_piece(TOOL_ARGUMENTS, i - 1, self.cx.chunks);
                f.data(&self.chunk(json!({
                    "tool_calls": [{"index": 0, "function": {"arguments": piece}}],
                })));
            }
        }
    }

    fn finish(&mut self, f: &mut Frames<'_>) {
        let reason = if self.cx.tool.is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        let answer = self.answer();
        let include_usage = self.cx.include_usage;
        f.raw(|ev| wire::finish_event(ev, &answer, reason, !include_usage));
        if include_usage {
            f.raw(|ev| wire::usage_event(ev, &answer));
        }
        done(f);
    }

    fn error(&mut self, f: &mut Frames<'_>, error_type: Option<&str>) {
        inband_event(f, error_type);
    }

    fn empty(&mut self, f: &mut Frames<'_>) {
        let answer = self.answer();
        f.raw(|ev| wire::empty_choices_event(ev, &answer));
        done(f);
    }
}

// === Legacy completions ===

/// `POST .../completions`: `text_completion` objects; tools do not apply.
pub(crate) struct Completions<'a> {
    cx: Ctx<'a>,
}

impl<'a> Completions<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> Completions<'a> {
        Completions { cx }
    }

    fn completion_tokens(&self) -> u64 {
        self.cx.reply.words
    }

    fn object(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": format!("cmpl-mock-{}", self.cx.n),
            "object": "text_completion",
            "created": self.cx.created,
            "model": self.cx.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    fn usage(&self) -> Value {
        usage(self.cx.prompt_tokens, self.completion_tokens())
    }

    fn chunk(&self, text: &str, finish_reason: Option<&str>, usage: Option<Value>) -> Value {
        self.object(
            json!([{"text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason}]),
            usage,
        )
    }
}

impl Surface for Completions<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::OpenAi
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        let v = self.chunk(self.cx.reply.text(), Some("stop"), Some(self.usage()));
        push_json(out, &v);
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        push_json(out, &self.object(json!([]), Some(self.usage())));
    }

    fn start(&mut self, f: &mut Frames<'_>, forced: bool) {
        if forced {
            f.data(&self.chunk("", None, None));
        }
    }

    fn contents(&self) -> usize {
        self.cx.chunks
    }

    fn content(&mut self, f: &mut Frames<'_>, i: usize) {
        f.data(&self.chunk(self.cx.reply.piece(i, self.cx.chunks), None, None));
    }

    fn finish(&mut self, f: &mut Frames<'_>) {
        if self.cx.include_usage {
            f.data(&self.chunk("", Some("stop"), None));
            f.data(&self.object(json!([]), Some(self.usage())));
        } else {
            f.data(&self.chunk("", Some("stop"), Some(self.usage())));
        }
        done(f);
    }

    fn error(&mut self, f: &mut Frames<'_>, error_type: Option<&str>) {
        inband_event(f, error_type);
    }

    fn empty(&mut self, f: &mut Frames<'_>) {
        f.data(&self.object(json!([]), None));
        done(f);
    }
}

// === Embeddings ===

/// Dimensions of an embedding when the request names none (`dimensions`).
pub(crate) const EMBEDDING_DIMENSIONS: usize = 256;
/// The most dimensions a request may ask for.
pub(crate) const MAX_EMBEDDING_DIMENSIONS: usize = 4096;

/// `POST .../embeddings`: never streamed.
pub(crate) struct Embeddings<'a> {
    cx: Ctx<'a>,
}

impl<'a> Embeddings<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> Embeddings<'a> {
        Embeddings { cx }
    }

    fn list(&self, count: usize) -> Value {
        let dims = self
            .cx
            .embedding_dimensions
            .unwrap_or(EMBEDDING_DIMENSIONS)
            .clamp(1, MAX_EMBEDDING_DIMENSIONS);
        let data: Vec<Value> = (0..count)
            .map(|i| {
                let text = self.cx.embedding_texts.get(i).map_or("", String::as_str);
                json!({"object": "embedding", "index": i, "embedding": bag_of_words(text, dims)})
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": self.cx.model,
            "usage": {"prompt_tokens": self.cx.prompt_tokens, "total_tokens": self.cx.prompt_tokens},
        })
    }
}

/// A vector that carries meaning: the input's lower-cased word tokens (runs of letters and
/// digits; a token-array input's ids are words `t<id>`) each hashed (FNV-1a) into one of
/// `dims` buckets with a hashed sign, then L2-normalised. Deterministic; inputs sharing words
/// are near (their cosine similarity grows with the words they share), inputs sharing none are
/// about orthogonal. An input without a word hashes as the empty word.
pub(crate) fn bag_of_words(text: &str, dims: usize) -> Vec<f64> {
    let mut v = vec![0.0f64; dims];
    let mut add = |word: &str| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in word.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[(h % dims as u64) as usize] += sign;
    };
    let lower = text.to_lowercase();
    let mut any = false;
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        add(word);
        any = true;
    }
    if !any {
        add("");
    }
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

impl Surface for Embeddings<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::OpenAi
    }

    fn streams(&self) -> bool {
        false
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        push_json(out, &self.list(self.cx.inputs));
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        push_json(out, &self.list(0));
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

// === Moderations ===

/// The categories of every moderation result (OpenAI's names).
const MODERATION_CATEGORIES: [&str; 6] = [
    "harassment",
    "hate",
    "self-harm",
    "sexual",
    "violence",
    "illicit",
];

/// `POST .../moderations`: one result per input; never streamed.
pub(crate) struct Moderations<'a> {
    cx: Ctx<'a>,
}

impl<'a> Moderations<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> Moderations<'a> {
        Moderations { cx }
    }

    fn answer(&self, flagged: &[bool]) -> Value {
        let results: Vec<Value> = flagged
            .iter()
            .map(|&f| {
                let categories: serde_json::Map<String, Value> = MODERATION_CATEGORIES
                    .iter()
                    .map(|c| ((*c).to_string(), Value::Bool(f && *c == "harassment")))
                    .collect();
                let scores: serde_json::Map<String, Value> = MODERATION_CATEGORIES
                    .iter()
                    .map(|c| {
                        let score = if f && *c == "harassment" { 0.99 } else { 0.0 };
                        ((*c).to_string(), json!(score))
                    })
                    .collect();
                json!({"flagged": f, "categories": categories, "category_scores": scores})
            })
            .collect();
        json!({"id": format!("modr_mock_{}", self.cx.n), "model": self.cx.model, "results": results})
    }
}

impl Surface for Moderations<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::OpenAi
    }

    fn streams(&self) -> bool {
        false
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        push_json(out, &self.answer(&self.cx.flagged));
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        push_json(out, &self.answer(&[]));
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

// === Responses ===

/// `POST .../responses`: one output item, a `message` or a `function_call`; every SSE event
/// is `event: <type>` + `data:` with that `type` and a `sequence_number`.
pub(crate) struct Responses<'a> {
    cx: Ctx<'a>,
    sequence: u64,
    /// `response.output_item.added` went out.
    item_added: bool,
}

impl<'a> Responses<'a> {
    pub(crate) fn new(cx: Ctx<'a>) -> Responses<'a> {
        Responses {
            cx,
            sequence: 0,
            item_added: false,
        }
    }

    fn item_id(&self) -> String {
        match self.cx.tool {
            None => format!("msg_mock_{}", self.cx.n),
            Some(_) => format!("fc_mock_{}", self.cx.n),
        }
    }

    fn response(&self, status: &str, output: Value, with_usage: bool) -> Value {
        let completion = self.cx.completion_tokens();
        let usage = if with_usage {
            json!({
                "input_tokens": self.cx.prompt_tokens,
                "output_tokens": completion,
                "total_tokens": self.cx.prompt_tokens + completion,
            })
        } else {
            Value::Null
        };
        json!({
            "id": format!("resp_mock_{}", self.cx.n),
            "object": "response",
            "created_at": self.cx.created,
            "status": status,
            "model": self.cx.model,
            "output": output,
            "usage": usage,
        })
    }

    fn output_text(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    fn item(&self, complete: bool) -> Value {
        let status = if complete { "completed" } else { "in_progress" };
        match self.cx.tool {
            None => json!({
                "type": "message",
                "id": self.item_id(),
                "status": status,
                "role": "assistant",
                "content": if complete {
                    json!([self.output_text(self.cx.reply.text())])
                } else {
                    json!([])
                },
            }),
            Some(name) => json!({
                "type": "function_call",
                "id": self.item_id(),
                "call_id": format!("call_mock_{}", self.cx.n),
                "name": name,
                "arguments": if complete { TOOL_ARGUMENTS } else { "" },
                "status": status,
            }),
        }
    }

    /// `event: <kind>` with `v` + its `type` and the next `sequence_number`.
    fn event(&mut self, f: &mut Frames<'_>, kind: &str, mut v: Value) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        f.named(kind, &v);
    }

    fn add_item(&mut self, f: &mut Frames<'_>) {
        if self.item_added {
            return;
        }
        self.item_added = true;
        let item = self.item(false);
        self.event(
            f,
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        );
        if self.cx.tool.is_none() {
            let part = self.output_text("");
            let item_id = self.item_id();
            self.event(
                f,
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            );
        }
    }
}

impl Surface for Responses<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::OpenAi
    }

    fn json(&mut self, out: &mut Vec<u8>) {
        push_json(
            out,
            &self.response("completed", json!([self.item(true)]), true),
        );
    }

    fn json_empty(&mut self, out: &mut Vec<u8>) {
        push_json(out, &self.response("completed", json!([]), true));
    }

    fn start(&mut self, f: &mut Frames<'_>, _forced: bool) {
        let response = self.response("in_progress", json!([]), false);
        self.event(f, "response.created", json!({"response": response.clone()}));
        self.event(f, "response.in_progress", json!({"response": response}));
    }

    fn contents(&self) -> usize {
        self.cx.chunks
    }

    fn content(&mut self, f: &mut Frames<'_>, i: usize) {
        self.add_item(f);
        let item_id = self.item_id();
        match self.cx.tool {
            None => {
                let delta = self.cx.reply.piece(i, self.cx.chunks);
                self.event(
                    f,
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": delta}),
                );
            }
            Some(_) => {
                let delta = byte_piece(TOOL_ARGUMENTS, i, self.cx.chunks);
                self.event(
                    f,
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": 0, "delta": delta}),
                );
            }
        }
    }

    fn finish(&mut self, f: &mut Frames<'_>) {
        self.add_item(f);
        let item_id = self.item_id();
        match self.cx.tool {
            None => {
                let text = self.cx.reply.text();
                self.event(
                    f,
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
                );
                let part = self.output_text(text);
                self.event(
                    f,
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
                );
            }
            Some(_) => self.event(
                f,
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": 0, "arguments": TOOL_ARGUMENTS}),
            ),
        }
        let item = self.item(true);
        self.event(
            f,
            "response.output_item.done",
            json!({"output_index": 0, "item": item.clone()}),
        );
        let response = self.response("completed", json!([item]), true);
        self.event(f, "response.completed", json!({"response": response}));
    }

    fn error(&mut self, f: &mut Frames<'_>, error_type: Option<&str>) {
        let code = error_type.unwrap_or("server_error");
        self.event(
            f,
            "error",
            json!({"code": code, "message": INBAND_MESSAGE, "param": null}),
        );
    }

    fn empty(&mut self, f: &mut Frames<'_>) {
        let created = self.response("in_progress", json!([]), false);
        self.event(f, "response.created", json!({"response": created}));
        let completed = self.response("completed", json!([]), true);
        self.event(f, "response.completed", json!({"response": completed}));
    }
}
