//! What the mock reads from a provider call's body: the facts its answer depends on.
//!
//! Two passes. The first reads `model` and `stream` with borrowed strings and notes which of
//! the rarer fields are present, skipping everything else; it is all a load test's chat body
//! costs. Only when a field that shapes the answer is present (`tools`, `thinking`,
//! `stream_options`, `input`) does a second pass read those fields (and the conversation's
//! last turn) into `serde_json::Value`s: tests, not load, send them.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

/// What an answer depends on.
#[derive(Debug, Default)]
pub(super) struct Facts<'a> {
    /// Top-level `model`, if a string.
    pub(super) model: Option<Cow<'a, str>>,
    /// Top-level `"stream": true`.
    pub(super) stream: bool,
    /// `stream_options.include_usage: true`.
    pub(super) include_usage: bool,
    /// The function to call: the answer is a tool call instead of text.
    pub(super) tool: Option<String>,
    /// `thinking.type` is `enabled` or `adaptive` (Anthropic).
    pub(super) thinking: bool,
    /// Embeddings: the number of inputs (a string or one token array is one).
    pub(super) inputs: usize,
}

/// A top-level field of any JSON type; strings and booleans are kept.
#[derive(Deserialize)]
#[serde(untagged)]
enum Loose<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    Bool(bool),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct FirstPass<'a> {
    #[serde(default, borrow)]
    model: Option<Loose<'a>>,
    #[serde(default, borrow)]
    stream: Option<Loose<'a>>,
    #[serde(default)]
    stream_options: Option<IgnoredAny>,
    #[serde(default)]
    tools: Option<IgnoredAny>,
    #[serde(default)]
    thinking: Option<IgnoredAny>,
    #[serde(default)]
    input: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct SecondPass {
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    thinking: Option<Value>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    messages: Option<Value>,
}

/// Read a body. `Err` carries the message of a 400: not a JSON object, invalid JSON, or a
/// field the mock reads given twice.
pub(super) fn probe(body: &[u8]) -> Result<Facts<'_>, String> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("invalid JSON body: expected a JSON object".to_string());
    }
    let first: FirstPass<'_> =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let mut facts = Facts {
        model: match first.model {
            Some(Loose::Str(m)) => Some(m),
            _ => None,
        },
        stream: matches!(first.stream, Some(Loose::Bool(true))),
        inputs: 1,
        ..Facts::default()
    };
    let rare = first.stream_options.is_some()
        || first.tools.is_some()
        || first.thinking.is_some()
        || first.input.is_some();
    if !rare {
        return Ok(facts);
    }
    let second: SecondPass =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    facts.include_usage = second
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    facts.thinking = second
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t == "enabled" || t == "adaptive");
    facts.inputs = match &second.input {
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            usize::from(!items.is_empty())
        }
        Some(Value::Array(items)) => items.len(),
        _ => 1,
    };
    facts.tool = tool_to_call(&second);
    Ok(facts)
}

/// The name of the function the answer calls, if the request asks for one (see the crate docs).
fn tool_to_call(req: &SecondPass) -> Option<String> {
    let tools = req.tools.as_ref()?.as_array()?;
    let first = tools.iter().find_map(tool_name)?;
    let named = match &req.tool_choice {
        Some(Value::String(s)) if s == "none" => return None,
        Some(choice @ Value::Object(_)) => {
            if choice.get("type").and_then(Value::as_str) == Some("none") {
                return None;
            }
            tool_name(choice)
        }
        _ => None,
    };
    if last_turn_is_a_tool_result(req) {
        return None;
    }
    Some(named.unwrap_or(first).to_string())
}

/// `function.name` (OpenAI chat) or `name` (Responses, Anthropic) of a tool or a tool choice.
fn tool_name(v: &Value) -> Option<&str> {
    v.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| v.get("name"))
        .and_then(Value::as_str)
}

/// The conversation's last turn answers a tool call: an OpenAI `tool` (or `function`) message,
/// an Anthropic message with a `tool_result` block, a Responses `function_call_output` item.
fn last_turn_is_a_tool_result(req: &SecondPass) -> bool {
    let last_message = req
        .messages
        .as_ref()
        .and_then(Value::as_array)
        .and_then(|m| m.last());
    if let Some(m) = last_message {
        if matches!(
            m.get("role").and_then(Value::as_str),
            Some("tool" | "function")
        ) {
            return true;
        }
        let blocks = m.get("content").and_then(Value::as_array);
        if blocks.is_some_and(|b| {
            b.iter()
                .any(|block| block.get("type").and_then(Value::as_str) == Some("tool_result"))
        }) {
            return true;
        }
    }
    req.input
        .as_ref()
        .and_then(Value::as_array)
        .and_then(|items| items.last())
        .and_then(|item| item.get("type"))
        .and_then(Value::as_str)
        == Some("function_call_output")
}

/// An embeddings request's inputs as text, one per vector: a string, a list of strings, one
/// token array, or a list of token arrays (token ids become words `t<id>`).
pub(super) fn embedding_texts(body: &[u8]) -> Vec<String> {
    #[derive(Deserialize)]
    struct Embeddings {
        #[serde(default)]
        input: Option<Value>,
    }
    let tokens = |items: &[Value]| {
        items
            .iter()
            .map(|t| format!("t{t}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match serde_json::from_slice::<Embeddings>(body)
        .ok()
        .and_then(|e| e.input)
    {
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            if items.is_empty() {
                Vec::new()
            } else {
                vec![tokens(&items)]
            }
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => s.clone(),
                Value::Array(t) => tokens(t),
                _ => String::new(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An embeddings request's `dimensions`, when it names a positive number.
pub(super) fn embedding_dimensions(body: &[u8]) -> Option<usize> {
    #[derive(Deserialize)]
    struct Embeddings {
        #[serde(default)]
        dimensions: Option<u64>,
    }
    serde_json::from_slice::<Embeddings>(body)
        .ok()?
        .dimensions
        .and_then(|d| usize::try_from(d).ok())
        .filter(|d| *d > 0)
}

/// Whether each moderation input (`input`: a string, or a list of strings) contains one of
/// `words` (lower-cased), in any letter case; one entry per input.
pub(super) fn moderation_flags(body: &[u8], words: &[String]) -> Vec<bool> {
    #[derive(Deserialize)]
    struct Moderation {
        #[serde(default)]
        input: Option<Value>,
    }
    let flags = |text: &str| {
        let text = text.to_lowercase();
        words.iter().any(|w| text.contains(w.as_str()))
    };
    match serde_json::from_slice::<Moderation>(body)
        .ok()
        .and_then(|m| m.input)
    {
        Some(Value::String(s)) => vec![flags(&s)],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().is_some_and(flags))
            .collect(),
        _ => vec![false],
    }
}
