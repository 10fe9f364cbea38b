//! Request bodies: a chat request for an Anthropic provider ([`chat_request_to_messages`]) and
//! a messages request for an OpenAI-kind provider ([`messages_request_to_chat`]).
//!
//! Each takes the caller's body apart member by member (by value: base64 images move, they
//! are not copied), builds the target's body, and refuses with an [`Unexpressible`] naming the
//! first field it cannot carry; a member left over once every known one is taken is refused
//! too, as the providers themselves refuse unknown parameters. The mapping table is in the
//! [module documentation](super).

use serde_json::{json, Map, Value};

use super::{is_anthropic_tool_id, signed_thinking, Unexpressible};

type Object = Map<String, Value>;

/// How a chat request becomes a messages request.
#[derive(Debug, Clone, Copy)]
pub struct ToMessages<'a> {
    /// The deployment's model name at Anthropic.
    pub upstream_model: &'a str,
    /// Anthropic requires `max_tokens`: used when the caller sent neither `max_tokens` nor
    /// `max_completion_tokens`.
    pub default_max_tokens: u32,
}

/// How a messages request becomes a chat request.
#[derive(Debug, Clone, Copy)]
pub struct ToChat<'a> {
    /// The deployment's model name at the OpenAI-kind provider.
    pub upstream_model: &'a str,
    /// Add `stream_options.include_usage: true` when the request streams (so the stream
    /// reports usage; the converter gives the caller Anthropic's usage fields either way).
    pub stream_usage: bool,
}

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u64 = 1024;

/// The thinking budget standing for a chat `reasoning_effort` (`None`: no thinking).
fn thinking_budget(effort: &str) -> Option<Option<u64>> {
    match effort {
        "none" | "minimal" => Some(None),
        "low" => Some(Some(1024)),
        "medium" => Some(Some(2048)),
        "high" => Some(Some(4096)),
        "xhigh" => Some(Some(8192)),
        _ => None,
    }
}

/// The chat `reasoning_effort` standing for an Anthropic thinking budget.
fn reasoning_effort(budget: u64) -> &'static str {
    match budget {
        0..2048 => "low",
        2048..4096 => "medium",
        _ => "high",
    }
}

// === chat → messages ===

/// A chat request body as an Anthropic Messages request for `opts.upstream_model`.
pub fn chat_request_to_messages(
    body: &[u8],
    opts: &ToMessages<'_>,
) -> Result<Vec<u8>, Unexpressible> {
    let mut req = parse_object(body)?;
    let mut out = Object::new();
    out.insert("model".into(), opts.upstream_model.into());

    refuse_chat_only_fields(&mut req)?;
    for dropped in [
        "stream_options",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prediction",
        "seed",
        "routing",
        // The caller's name for the model: replaced by the deployment's.
        "model",
    ] {
        req.remove(dropped);
    }

    let messages = match req.remove("messages") {
        Some(Value::Array(list)) => list,
        _ => {
            return Err(Unexpressible::new(
                "messages",
                "must be an array of messages",
            ))
        }
    };
    let (system, turns) = chat_messages_to_turns(messages)?;
    if let Some(system) = system {
        out.insert("system".into(), system);
    }
    out.insert("messages".into(), Value::Array(turns));

    // `max_completion_tokens` supersedes `max_tokens` at OpenAI.
    let max_tokens = match (
        req.remove("max_completion_tokens"),
        req.remove("max_tokens"),
    ) {
        (Some(v), _) => positive_int(&v, "max_completion_tokens")?,
        (None, Some(v)) => positive_int(&v, "max_tokens")?,
        (None, None) => u64::from(opts.default_max_tokens),
    };
    out.insert("max_tokens".into(), max_tokens.into());

    let temperature = match req.remove("temperature") {
        Some(v) => {
            let t = number(&v, "temperature")?;
            if !(0.0..=1.0).contains(&t) {
                return Err(Unexpressible::new(
                    "temperature",
                    "Anthropic accepts a temperature from 0 to 1",
                ));
            }
            out.insert("temperature".into(), v);
            Some(t)
        }
        None => None,
    };
    let top_p = match req.remove("top_p") {
        Some(v) => {
            let p = number(&v, "top_p")?;
            out.insert("top_p".into(), v);
            Some(p)
        }
        None => None,
    };
    let top_k = req.remove("top_k");
    if let Some(v) = &top_k {
        positive_int(v, "top_k")?;
        out.insert("top_k".into(), v.clone());
    }

    if let Some(stop) = req.remove("stop") {
        let list = match stop {
            Value::String(s) => vec![Value::String(s)],
            Value::Array(list) if list.iter().all(Value::is_string) => list,
            _ => {
                return Err(Unexpressible::new(
                    "stop",
                    "must be a string or an array of strings",
                ))
            }
        };
        if !list.is_empty() {
            out.insert("stop_sequences".into(), Value::Array(list));
        }
    }

    // `safety_identifier` replaces the deprecated `user`; both identify the end user.
    let user = match (req.remove("safety_identifier"), req.remove("user")) {
        (Some(v), _) => Some(("safety_identifier", v)),
        (None, Some(v)) => Some(("user", v)),
        (None, None) => None,
    };
    if let Some((name, v)) = user {
        if !v.is_string() {
            return Err(Unexpressible::new(name, "must be a string"));
        }
        out.insert("metadata".into(), json!({ "user_id": v }));
    }

    if let Some(v) = req.remove("stream") {
        if bool_value(&v, "stream")? {
            out.insert("stream".into(), Value::Bool(true));
        }
    }

    let forced_tool = chat_tools_to_messages(&mut req, &mut out)?;

    if let Some(v) = req.remove("reasoning_effort") {
        let effort = v.as_str().unwrap_or_default();
        let Some(budget) = thinking_budget(effort) else {
            return Err(Unexpressible::new(
                "reasoning_effort",
                "must be none, minimal, low, medium, high or xhigh",
            ));
        };
        if let Some(budget) = budget {
            // Anthropic's thinking constraints, checked here so the caller learns which
            // of its own fields is in the way.
            if temperature.is_some_and(|t| t != 1.0) {
                return Err(Unexpressible::new(
                    "temperature",
                    "Anthropic's extended thinking (reasoning_effort) requires temperature 1",
                ));
            }
            if top_p.is_some_and(|p| p < 0.95) {
                return Err(Unexpressible::new(
                    "top_p",
                    "Anthropic's extended thinking (reasoning_effort) requires top_p of 0.95 or more",
                ));
            }
            if top_k.is_some() {
                return Err(Unexpressible::new(
                    "top_k",
                    "Anthropic's extended thinking (reasoning_effort) does not take top_k",
                ));
            }
            if forced_tool {
                return Err(Unexpressible::new(
                    "tool_choice",
                    "Anthropic cannot force a tool call while thinking (reasoning_effort)",
                ));
            }
            // The budget is part of max_tokens at Anthropic, as reasoning tokens are part of
            // max_completion_tokens at OpenAI: keep it under the caller's bound.
            let budget = budget.min(max_tokens.saturating_sub(1));
            if budget < MIN_THINKING_BUDGET {
                return Err(Unexpressible::new(
                    "reasoning_effort",
                    "Anthropic's extended thinking needs max_tokens above 1024",
                ));
            }
            out.insert(
                "thinking".into(),
                json!({"type": "enabled", "budget_tokens": budget}),
            );
        }
    }

    refuse_leftovers(req, "a Chat Completions parameter")?;
    Ok(Value::Object(out).to_string().into_bytes())
}

/// Chat parameters with no Anthropic counterpart: refused unless set to their default (then
/// removed).
fn refuse_chat_only_fields(req: &mut Object) -> Result<(), Unexpressible> {
    let refuse = |field: &str, reason: &str| Err(Unexpressible::new(field, reason));
    if let Some(v) = req.remove("n") {
        if v.as_u64() != Some(1) {
            return refuse("n", "Anthropic returns one choice per request");
        }
    }
    if let Some(v) = req.remove("logprobs") {
        if v != Value::Bool(false) {
            return refuse("logprobs", "Anthropic does not return log probabilities");
        }
    }
    if let Some(v) = req.remove("top_logprobs") {
        if v.as_u64() != Some(0) {
            return refuse(
                "top_logprobs",
                "Anthropic does not return log probabilities",
            );
        }
    }
    if let Some(v) = req.remove("logit_bias") {
        if v.as_object().is_none_or(|m| !m.is_empty()) {
            return refuse("logit_bias", "Anthropic has no logit bias");
        }
    }
    for penalty in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = req.remove(penalty) {
            if v.as_f64() != Some(0.0) {
                return refuse(penalty, "Anthropic has no presence or frequency penalty");
            }
        }
    }
    if let Some(v) = req.remove("response_format") {
        if v.get("type").and_then(Value::as_str) != Some("text") {
            return refuse(
                "response_format.type",
                "Anthropic has no JSON mode or JSON schema output",
            );
        }
    }
    if let Some(v) = req.remove("modalities") {
        let text_only = v
            .as_array()
            .is_some_and(|m| m.iter().all(|x| x.as_str() == Some("text")));
        if !text_only {
            return refuse("modalities", "Anthropic answers in text only");
        }
    }
    if req.remove("audio").is_some() {
        return refuse("audio", "Anthropic answers in text only");
    }
    if let Some(v) = req.remove("verbosity") {
        if v.as_str() != Some("medium") {
            return refuse("verbosity", "Anthropic has no verbosity setting");
        }
    }
    if req.remove("web_search_options").is_some() {
        return refuse(
            "web_search_options",
            "web search is not carried to Anthropic",
        );
    }
    for legacy in ["functions", "function_call"] {
        if req.remove(legacy).is_some() {
            return refuse(
                legacy,
                "the legacy function-calling fields are not carried; use tools and tool_choice",
            );
        }
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls` into `out`. Returns whether the choice
/// forces a tool (which Anthropic's thinking refuses).
fn chat_tools_to_messages(req: &mut Object, out: &mut Object) -> Result<bool, Unexpressible> {
    let mut tools = match req.remove("tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .into_iter()
            .enumerate()
            .map(|(i, t)| chat_tool_to_messages(t, i))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(Unexpressible::new("tools", "must be an array")),
    };
    let parallel = match req.remove("parallel_tool_calls") {
        Some(v) => bool_value(&v, "parallel_tool_calls")?,
        None => true,
    };
    let mut choice = match req.remove("tool_choice") {
        None => None,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Some(json!({"type": "auto"})),
            "none" => Some(json!({"type": "none"})),
            "required" => Some(json!({"type": "any"})),
            _ => {
                return Err(Unexpressible::new(
                    "tool_choice",
                    "must be auto, none, required or a named function",
                ))
            }
        },
        Some(Value::Object(c)) => match c.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = c
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        Unexpressible::new("tool_choice.function.name", "must be a string")
                    })?;
                Some(json!({"type": "tool", "name": name}))
            }
            Some("allowed_tools") => {
                // The allowed subset is the tool list Anthropic sees.
                let allowed = c.get("allowed_tools");
                let names: Vec<&str> = allowed
                    .and_then(|a| a.get("tools"))
                    .and_then(Value::as_array)
                    .map(|l| {
                        l.iter()
                            .filter_map(|t| t.get("function")?.get("name")?.as_str())
                            .collect()
                    })
                    .unwrap_or_default();
                tools.retain(|t| {
                    t.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| names.contains(&n))
                });
                match allowed.and_then(|a| a.get("mode")).and_then(Value::as_str) {
                    Some("required") => Some(json!({"type": "any"})),
                    _ => Some(json!({"type": "auto"})),
                }
            }
            _ => {
                return Err(Unexpressible::new(
                    "tool_choice.type",
                    "only function tools are carried to Anthropic",
                ))
            }
        },
        Some(_) => {
            return Err(Unexpressible::new(
                "tool_choice",
                "must be a string or an object",
            ))
        }
    };
    if tools.is_empty() {
        // Without tools, `auto`/`none` say nothing; a forced tool names one that is not there.
        return match choice.as_ref().and_then(|c| c.get("type")?.as_str()) {
            Some("any" | "tool") => Err(Unexpressible::new(
                "tool_choice",
                "forces a tool but the request declares none",
            )),
            _ => Ok(false),
        };
    }
    if !parallel {
        let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
        if c.get("type").and_then(Value::as_str) != Some("none") {
            c["disable_parallel_tool_use"] = Value::Bool(true);
        }
    }
    let forced = choice
        .as_ref()
        .and_then(|c| c.get("type")?.as_str())
        .is_some_and(|t| matches!(t, "any" | "tool"));
    out.insert("tools".into(), Value::Array(tools));
    if let Some(c) = choice {
        out.insert("tool_choice".into(), c);
    }
    Ok(forced)
}

fn chat_tool_to_messages(tool: Value, i: usize) -> Result<Value, Unexpressible> {
    let at = format!("tools[{i}]");
    let Value::Object(mut tool) = tool else {
        return Err(Unexpressible::new(at, "must be an object"));
    };
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(Unexpressible::new(
            format!("{at}.type"),
            "only function tools are carried to Anthropic",
        ));
    }
    let Some(Value::Object(mut f)) = tool.remove("function") else {
        return Err(Unexpressible::new(
            format!("{at}.function"),
            "must be an object",
        ));
    };
    let mut t = Object::new();
    match f.remove("name") {
        Some(name @ Value::String(_)) => t.insert("name".into(), name),
        _ => {
            return Err(Unexpressible::new(
                format!("{at}.function.name"),
                "must be a string",
            ))
        }
    };
    if let Some(d) = f.remove("description").filter(|d| !d.is_null()) {
        t.insert("description".into(), d);
    }
    let schema = f
        .remove("parameters")
        .filter(|p| !p.is_null())
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    t.insert("input_schema".into(), schema);
    if let Some(cc) = tool.remove("cache_control") {
        t.insert("cache_control".into(), cc);
    }
    Ok(Value::Object(t))
}

/// Chat `messages` as Anthropic's `system` and alternating turns.
fn chat_messages_to_turns(
    messages: Vec<Value>,
) -> Result<(Option<Value>, Vec<Value>), Unexpressible> {
    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match turns.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    };
    for (i, msg) in messages.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(mut msg) = msg else {
            return Err(Unexpressible::new(at, "must be an object"));
        };
        msg.retain(|_, v| !v.is_null());
        // Dropped: a participant name has no Anthropic counterpart; unsigned reasoning must
        // not reach Anthropic (see the module documentation); annotations are output only.
        for dropped in ["name", "reasoning_content", "annotations"] {
            msg.remove(dropped);
        }
        let role = match msg.remove("role") {
            Some(Value::String(r)) => r,
            _ => return Err(Unexpressible::new(format!("{at}.role"), "must be a string")),
        };
        // A message-level `cache_control` (Anthropic-only, as some callers write it) marks
        // the message's last block, which is where Anthropic reads it.
        let cache_control = msg.remove("cache_control");
        let (role, mut blocks) = match role.as_str() {
            "system" | "developer" => {
                let content = msg.remove("content").unwrap_or(Value::Null);
                ("system", text_blocks(content, &format!("{at}.content"))?)
            }
            "user" => {
                let content = msg.remove("content").unwrap_or(Value::Null);
                ("user", user_blocks(content, &format!("{at}.content"))?)
            }
            "assistant" => ("assistant", assistant_blocks(&mut msg, &at)?),
            "tool" => ("user", vec![tool_result_block(&mut msg, &at)?]),
            "function" => {
                return Err(Unexpressible::new(
                    format!("{at}.role"),
                    "the legacy function role is not carried; use tool messages",
                ))
            }
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.role"),
                    "must be system, developer, user, assistant or tool",
                ))
            }
        };
        if let (Some(cc), Some(Value::Object(last))) = (cache_control, blocks.last_mut()) {
            last.insert("cache_control".into(), cc);
        }
        if role == "system" {
            system.append(&mut blocks);
        } else {
            push(role, blocks);
        }
        refuse_leftovers(msg, "a message field").map_err(|e| Unexpressible {
            field: format!("{at}.{}", e.field),
            ..e
        })?;
    }
    let system = match system.len() {
        0 => None,
        // One plain text block: the string form, as most callers write it.
        1 if system[0].as_object().is_some_and(|b| b.len() == 2) => system
            .pop()
            .and_then(|mut b| b.get_mut("text").map(Value::take)),
        _ => Some(Value::Array(system)),
    };
    let turns = turns
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": blocks}))
        .collect();
    Ok((system, turns))
}

fn text_block(text: String) -> Value {
    json!({"type": "text", "text": text})
}

/// A part's `cache_control` carried over (Anthropic-only; some callers send it to gateways).
fn keep_cache_control(part: &mut Object, block: &mut Value) {
    if let (Some(cc), Value::Object(b)) = (part.remove("cache_control"), block) {
        b.insert("cache_control".into(), cc);
    }
}

/// System (or tool) content: a string or text parts, as text blocks. Empty text is skipped
/// (Anthropic refuses empty text blocks; there is nothing in them to lose).
fn text_blocks(content: Value, at: &str) -> Result<Vec<Value>, Unexpressible> {
    match content {
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(vec![text_block(s)]),
        Value::Array(parts) => {
            let mut blocks = Vec::with_capacity(parts.len());
            for (j, part) in parts.into_iter().enumerate() {
                let at = format!("{at}[{j}]");
                let mut part = match part {
                    Value::Object(p) if p.get("type").and_then(Value::as_str) == Some("text") => p,
                    _ => {
                        return Err(Unexpressible::new(
                            format!("{at}.type"),
                            "only text parts are carried here",
                        ))
                    }
                };
                let text = take_string(&mut part, "text", &at)?;
                if !text.is_empty() {
                    let mut block = text_block(text);
                    keep_cache_control(&mut part, &mut block);
                    blocks.push(block);
                }
            }
            Ok(blocks)
        }
        _ => Err(Unexpressible::new(
            at,
            "must be a string or an array of text parts",
        )),
    }
}

fn user_blocks(content: Value, at: &str) -> Result<Vec<Value>, Unexpressible> {
    let parts = match content {
        Value::Array(parts) => parts,
        other => return text_blocks(other, at),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        let Value::Object(mut part) = part else {
            return Err(Unexpressible::new(at, "must be an object"));
        };
        let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
        let mut block = match kind {
            "text" => {
                let text = take_string(&mut part, "text", &at)?;
                if text.is_empty() {
                    continue;
                }
                text_block(text)
            }
            "image_url" => {
                let url = match part.remove("image_url") {
                    Some(Value::Object(mut img)) => {
                        take_string(&mut img, "url", &format!("{at}.image_url"))?
                    }
                    Some(Value::String(url)) => url,
                    _ => {
                        return Err(Unexpressible::new(
                            format!("{at}.image_url"),
                            "must be an object with a url",
                        ))
                    }
                };
                image_block(url, &format!("{at}.image_url.url"))?
            }
            "file" => match part.remove("file") {
                Some(Value::Object(mut file)) => file_block(&mut file, &format!("{at}.file"))?,
                _ => {
                    return Err(Unexpressible::new(
                        format!("{at}.file"),
                        "must be an object",
                    ))
                }
            },
            "input_audio" => {
                return Err(Unexpressible::new(
                    format!("{at}.type"),
                    "Anthropic models take no audio input",
                ))
            }
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.type"),
                    "not a content part Anthropic accepts",
                ))
            }
        };
        keep_cache_control(&mut part, &mut block);
        blocks.push(block);
    }
    Ok(blocks)
}

/// An image URL as an Anthropic image block: a base64 `data:` URL becomes a base64 source,
/// an http(s) URL a url source.
fn image_block(mut url: String, at: &str) -> Result<Value, Unexpressible> {
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({"type": "image", "source": {"type": "url", "url": url}}));
    }
    let Some((media_type, data_start)) = parse_data_url(&url) else {
        return Err(Unexpressible::new(
            at,
            "Anthropic takes images as base64 data: URLs or http(s) URLs",
        ));
    };
    let media_type = match media_type.to_ascii_lowercase().as_str() {
        "image/jpeg" | "image/jpg" => "image/jpeg",
        "image/png" => "image/png",
        "image/gif" => "image/gif",
        "image/webp" => "image/webp",
        _ => {
            return Err(Unexpressible::new(
                at,
                "Anthropic accepts JPEG, PNG, GIF and WebP images",
            ))
        }
    };
    // The data is moved down in place: no second copy of a large image.
    url.replace_range(..data_start, "");
    Ok(
        json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": url}}),
    )
}

/// A chat `file` part as an Anthropic document block (PDFs sent as base64 `file_data`).
fn file_block(file: &mut Object, at: &str) -> Result<Value, Unexpressible> {
    if file.contains_key("file_id") {
        return Err(Unexpressible::new(
            format!("{at}.file_id"),
            "an OpenAI file id means nothing to Anthropic; send file_data",
        ));
    }
    let mut data = take_string(file, "file_data", at)?;
    let Some((media_type, data_start)) = parse_data_url(&data) else {
        return Err(Unexpressible::new(
            format!("{at}.file_data"),
            "must be a base64 data: URL",
        ));
    };
    if !media_type.eq_ignore_ascii_case("application/pdf") {
        return Err(Unexpressible::new(
            format!("{at}.file_data"),
            "only PDF files are carried to Anthropic",
        ));
    }
    data.replace_range(..data_start, "");
    let mut doc = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}});
    if let Some(Value::String(name)) = file.remove("filename") {
        doc["title"] = Value::String(name);
    }
    Ok(doc)
}

/// `data:<media type>;base64,<data>`: the media type and where the data starts.
fn parse_data_url(url: &str) -> Option<(&str, usize)> {
    let rest = url.strip_prefix("data:")?;
    let comma = rest.find(',')?;
    let media_type = rest[..comma].strip_suffix(";base64")?;
    Some((media_type, "data:".len() + comma + 1))
}

/// An assistant message as blocks: signed thinking first (Anthropic requires it to lead),
/// then text, then tool calls.
fn assistant_blocks(msg: &mut Object, at: &str) -> Result<Vec<Value>, Unexpressible> {
    let mut blocks = Vec::new();
    if let Some(list) = msg.remove("thinking_blocks") {
        let Value::Array(list) = list else {
            return Err(Unexpressible::new(
                format!("{at}.thinking_blocks"),
                "must be an array",
            ));
        };
        blocks.extend(list.into_iter().filter_map(signed_thinking));
    }
    match msg.remove("content") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => blocks.push(text_block(s)),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.into_iter().enumerate() {
                let at = format!("{at}.content[{j}]");
                let Value::Object(mut part) = part else {
                    return Err(Unexpressible::new(at, "must be an object"));
                };
                let key = match part.get("type").and_then(Value::as_str) {
                    Some("text") => "text",
                    Some("refusal") => "refusal",
                    _ => {
                        return Err(Unexpressible::new(
                            format!("{at}.type"),
                            "an assistant message carries text and refusal parts only",
                        ))
                    }
                };
                let text = take_string(&mut part, key, &at)?;
                if !text.is_empty() {
                    let mut block = text_block(text);
                    keep_cache_control(&mut part, &mut block);
                    blocks.push(block);
                }
            }
        }
        Some(_) => {
            return Err(Unexpressible::new(
                format!("{at}.content"),
                "must be a string or an array of parts",
            ))
        }
    }
    if let Some(refusal) = msg.remove("refusal") {
        match refusal {
            Value::String(s) if s.is_empty() => {}
            Value::String(s) => blocks.push(text_block(s)),
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.refusal"),
                    "must be a string",
                ))
            }
        }
    }
    if let Some(calls) = msg.remove("tool_calls") {
        let Value::Array(calls) = calls else {
            return Err(Unexpressible::new(
                format!("{at}.tool_calls"),
                "must be an array",
            ));
        };
        for (j, call) in calls.into_iter().enumerate() {
            blocks.push(tool_use_block(call, &format!("{at}.tool_calls[{j}]"))?);
        }
    }
    Ok(blocks)
}

fn tool_use_block(call: Value, at: &str) -> Result<Value, Unexpressible> {
    let Value::Object(mut call) = call else {
        return Err(Unexpressible::new(at, "must be an object"));
    };
    if call
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t != "function")
    {
        return Err(Unexpressible::new(
            format!("{at}.type"),
            "only function calls are carried to Anthropic",
        ));
    }
    let id = take_string(&mut call, "id", at)?;
    if !is_anthropic_tool_id(&id) {
        return Err(Unexpressible::new(
            format!("{at}.id"),
            "Anthropic accepts tool ids of letters, digits, '_' and '-' only",
        ));
    }
    let Some(Value::Object(mut f)) = call.remove("function") else {
        return Err(Unexpressible::new(
            format!("{at}.function"),
            "must be an object",
        ));
    };
    let name = take_string(&mut f, "name", &format!("{at}.function"))?;
    let input = match f.remove("arguments") {
        None => json!({}),
        Some(Value::String(s)) if s.trim().is_empty() => json!({}),
        Some(Value::String(s)) => serde_json::from_str::<Value>(&s)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| {
                Unexpressible::new(
                    format!("{at}.function.arguments"),
                    "Anthropic needs tool arguments that are a JSON object",
                )
            })?,
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Err(Unexpressible::new(
                format!("{at}.function.arguments"),
                "must be a string",
            ))
        }
    };
    Ok(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
}

fn tool_result_block(msg: &mut Object, at: &str) -> Result<Value, Unexpressible> {
    let id = take_string(msg, "tool_call_id", at)?;
    if !is_anthropic_tool_id(&id) {
        return Err(Unexpressible::new(
            format!("{at}.tool_call_id"),
            "Anthropic accepts tool ids of letters, digits, '_' and '-' only",
        ));
    }
    let mut block = json!({"type": "tool_result", "tool_use_id": id});
    match msg.remove("content") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => block["content"] = Value::String(s),
        Some(content) => {
            let blocks = text_blocks(content, &format!("{at}.content"))?;
            if !blocks.is_empty() {
                block["content"] = Value::Array(blocks);
            }
        }
    }
    Ok(block)
}

// === messages → chat ===

/// A messages request body as a chat request for `opts.upstream_model`.
pub fn messages_request_to_chat(body: &[u8], opts: &ToChat<'_>) -> Result<Vec<u8>, Unexpressible> {
    let mut req = parse_object(body)?;
    let mut out = Object::new();
    out.insert("model".into(), opts.upstream_model.into());
    // `context_management` edits what Anthropic keeps of earlier turns on its side; a chat
    // model gets the whole conversation instead, which answers the same.
    for dropped in ["service_tier", "routing", "model", "context_management"] {
        req.remove(dropped);
    }

    let mut messages = Vec::new();
    if let Some(system) = req.remove("system") {
        if let Some(content) = system_content(system)? {
            messages.push(json!({"role": "system", "content": content}));
        }
    }
    let Some(Value::Array(turns)) = req.remove("messages") else {
        return Err(Unexpressible::new(
            "messages",
            "must be an array of messages",
        ));
    };
    let last = turns.len().saturating_sub(1);
    // The effort of the latest turn that set one (Anthropic's per-turn control, as Claude Code
    // sends it on a system message): it overrides the request's from that turn on.
    let mut turn_effort = None;
    for (i, turn) in turns.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(mut turn) = turn else {
            return Err(Unexpressible::new(at, "must be an object"));
        };
        let content = turn.remove("content").unwrap_or(Value::Null);
        let role = turn.remove("role");
        if let Some(config) = turn.remove("output_config") {
            if let Some(effort) = output_config_effort(config, &format!("{at}.output_config"))? {
                turn_effort = Some(effort);
            }
        }
        refuse_leftovers(turn, "a message field").map_err(|e| Unexpressible {
            field: format!("{at}.{}", e.field),
            ..e
        })?;
        match role.as_ref().and_then(Value::as_str) {
            Some("user") => user_turn_to_chat(content, &at, &mut messages)?,
            Some("assistant") if i == last => {
                return Err(Unexpressible::new(
                    at,
                    "a final assistant message is a prefill, which chat models do not continue",
                ))
            }
            Some("assistant") => messages.push(assistant_turn_to_chat(content, &at)?),
            // Agents (Claude Code) put system text between turns; chat keeps a system
            // message where it stands.
            Some("system") => {
                if let Some(content) = system_content(content)? {
                    messages.push(json!({"role": "system", "content": content}));
                }
            }
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.role"),
                    "must be user, assistant or system",
                ))
            }
        }
    }
    out.insert("messages".into(), Value::Array(messages));

    match req.remove("max_tokens") {
        Some(v) => {
            positive_int(&v, "max_tokens")?;
            out.insert("max_completion_tokens".into(), v);
        }
        None => return Err(Unexpressible::new("max_tokens", "is required")),
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = req.remove(key) {
            number(&v, key)?;
            out.insert(key.into(), v);
        }
    }
    if req.remove("top_k").is_some() {
        return Err(Unexpressible::new(
            "top_k",
            "chat completions have no top_k",
        ));
    }
    if let Some(stop) = req.remove("stop_sequences") {
        match stop {
            Value::Array(list) if list.iter().all(Value::is_string) => {
                if list.len() > 4 {
                    return Err(Unexpressible::new(
                        "stop_sequences",
                        "chat completions take at most 4 stop sequences",
                    ));
                }
                if !list.is_empty() {
                    out.insert("stop".into(), Value::Array(list));
                }
            }
            _ => {
                return Err(Unexpressible::new(
                    "stop_sequences",
                    "must be an array of strings",
                ))
            }
        }
    }
    if let Some(meta) = req.remove("metadata") {
        let Value::Object(meta) = meta else {
            return Err(Unexpressible::new("metadata", "must be an object"));
        };
        for (k, v) in meta {
            match (k.as_str(), v) {
                ("user_id", Value::Null) => {}
                ("user_id", v @ Value::String(_)) => {
                    out.insert("user".into(), v);
                }
                ("user_id", _) => {
                    return Err(Unexpressible::new("metadata.user_id", "must be a string"))
                }
                _ => {
                    return Err(Unexpressible::new(
                        format!("metadata.{k}"),
                        "only metadata.user_id is carried",
                    ))
                }
            }
        }
    }
    if let Some(v) = req.remove("stream") {
        if bool_value(&v, "stream")? {
            out.insert("stream".into(), Value::Bool(true));
            if opts.stream_usage {
                out.insert("stream_options".into(), json!({"include_usage": true}));
            }
        }
    }
    messages_tools_to_chat(&mut req, &mut out)?;
    if let Some(thinking) = req.remove("thinking") {
        match thinking.get("type").and_then(Value::as_str) {
            Some("disabled") => {}
            // The model decides how much to reason: the chat model's own default.
            Some("adaptive") => {}
            Some("enabled") => {
                let budget = thinking
                    .get("budget_tokens")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| {
                        Unexpressible::new("thinking.budget_tokens", "must be an integer")
                    })?;
                out.insert("reasoning_effort".into(), reasoning_effort(budget).into());
            }
            _ => {
                return Err(Unexpressible::new(
                    "thinking.type",
                    "must be enabled, adaptive or disabled",
                ))
            }
        }
    }
    let request_effort = match req.remove("output_config") {
        Some(config) => output_config_effort(config, "output_config")?,
        None => None,
    };
    if let Some(effort) = turn_effort.or(request_effort) {
        // A thinking budget says more than an effort.
        out.entry("reasoning_effort").or_insert(effort.into());
    }
    refuse_leftovers(req, "a Messages parameter")?;
    Ok(Value::Object(out).to_string().into_bytes())
}

/// An `output_config` (the request's or a turn's, at `at`) as the chat `reasoning_effort` its
/// `effort` stands for; any other member is refused.
fn output_config_effort(config: Value, at: &str) -> Result<Option<&'static str>, Unexpressible> {
    let Value::Object(mut config) = config else {
        return Err(Unexpressible::new(at, "must be an object"));
    };
    let effort = match config.remove("effort") {
        None => None,
        Some(effort) => Some(match effort.as_str() {
            Some("low") => "low",
            Some("medium") => "medium",
            Some("high") => "high",
            Some("max") => "high",
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.effort"),
                    "must be low, medium, high or max",
                ))
            }
        }),
    };
    refuse_leftovers(config, "an output_config member").map_err(|e| Unexpressible {
        field: format!("{at}.{}", e.field),
        ..e
    })?;
    Ok(effort)
}

/// Anthropic's `system` (a string or text blocks) as a chat system message's content.
fn system_content(system: Value) -> Result<Option<Value>, Unexpressible> {
    match system {
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(Value::String(s))),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.into_iter().enumerate() {
                let at = format!("system[{j}]");
                let Value::Object(mut block) = block else {
                    return Err(Unexpressible::new(at, "must be an object"));
                };
                if block.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(Unexpressible::new(
                        format!("{at}.type"),
                        "system blocks must be text",
                    ));
                }
                let text = take_string(&mut block, "text", &at)?;
                parts.push(json!({"type": "text", "text": text}));
            }
            Ok(collapse_text_parts(parts))
        }
        _ => Err(Unexpressible::new(
            "system",
            "must be a string or an array of text blocks",
        )),
    }
}

/// Text parts as chat content: one part is the plain string form, several stay parts.
fn collapse_text_parts(mut parts: Vec<Value>) -> Option<Value> {
    match parts.len() {
        0 => None,
        1 => parts
            .pop()
            .and_then(|mut p| p.get_mut("text").map(Value::take)),
        _ => Some(Value::Array(parts)),
    }
}

/// A user turn: its `tool_result` blocks become `tool` messages (first, as Anthropic puts
/// them first), the rest one user message after them.
fn user_turn_to_chat(content: Value, at: &str, out: &mut Vec<Value>) -> Result<(), Unexpressible> {
    let blocks = match content {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => {
            return Err(Unexpressible::new(
                format!("{at}.content"),
                "must be a string or an array of blocks",
            ))
        }
    };
    let mut parts = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let Value::Object(mut block) = block else {
            return Err(Unexpressible::new(at, "must be an object"));
        };
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match kind {
            "text" => {
                refuse_citations(&block, &at)?;
                let text = take_string(&mut block, "text", &at)?;
                parts.push(json!({"type": "text", "text": text}));
            }
            "image" => parts.push(image_part(&mut block, &at)?),
            "document" => parts.push(document_part(&mut block, &at)?),
            "tool_result" => out.push(tool_message(&mut block, &at)?),
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.type"),
                    "not a block chat completions can carry",
                ))
            }
        }
    }
    let all_text = parts
        .iter()
        .all(|p| p.get("type").and_then(Value::as_str) == Some("text"));
    let content = if all_text {
        collapse_text_parts(parts)
    } else {
        Some(Value::Array(parts))
    };
    if let Some(content) = content {
        out.push(json!({"role": "user", "content": content}));
    }
    Ok(())
}

fn refuse_citations(block: &Object, at: &str) -> Result<(), Unexpressible> {
    match block.get("citations") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(c)) if c.is_empty() => Ok(()),
        Some(c) if c.get("enabled") == Some(&Value::Bool(false)) => Ok(()),
        Some(_) => Err(Unexpressible::new(
            format!("{at}.citations"),
            "chat completions have no citations",
        )),
    }
}

fn image_part(block: &mut Object, at: &str) -> Result<Value, Unexpressible> {
    let Some(Value::Object(mut source)) = block.remove("source") else {
        return Err(Unexpressible::new(
            format!("{at}.source"),
            "must be an object",
        ));
    };
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media_type = take_string(&mut source, "media_type", &format!("{at}.source"))?;
            let data = take_string(&mut source, "data", &format!("{at}.source"))?;
            format!("data:{media_type};base64,{data}")
        }
        Some("url") => take_string(&mut source, "url", &format!("{at}.source"))?,
        _ => {
            return Err(Unexpressible::new(
                format!("{at}.source.type"),
                "chat completions take images as base64 or by URL",
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn document_part(block: &mut Object, at: &str) -> Result<Value, Unexpressible> {
    refuse_citations(block, at)?;
    let Some(Value::Object(mut source)) = block.remove("source") else {
        return Err(Unexpressible::new(
            format!("{at}.source"),
            "must be an object",
        ));
    };
    match source.get("type").and_then(Value::as_str) {
        Some("base64")
            if source.get("media_type").and_then(Value::as_str) == Some("application/pdf") =>
        {
            let data = take_string(&mut source, "data", &format!("{at}.source"))?;
            let filename = match block.remove("title") {
                Some(Value::String(t)) => t,
                _ => "document.pdf".to_string(),
            };
            Ok(json!({"type": "file", "file": {
                "filename": filename,
                "file_data": format!("data:application/pdf;base64,{data}"),
            }}))
        }
        Some("text") => {
            let text = take_string(&mut source, "data", &format!("{at}.source"))?;
            Ok(json!({"type": "text", "text": text}))
        }
        _ => Err(Unexpressible::new(
            format!("{at}.source.type"),
            "chat completions take documents as base64 PDF or plain text only",
        )),
    }
}

fn tool_message(block: &mut Object, at: &str) -> Result<Value, Unexpressible> {
    let id = take_string(block, "tool_use_id", at)?;
    let content = match block.remove("content") {
        None | Some(Value::Null) => Value::String(String::new()),
        Some(s @ Value::String(_)) => s,
        Some(Value::Array(inner)) => {
            let mut parts = Vec::with_capacity(inner.len());
            for (k, b) in inner.into_iter().enumerate() {
                let at = format!("{at}.content[{k}]");
                let Value::Object(mut b) = b else {
                    return Err(Unexpressible::new(at, "must be an object"));
                };
                if b.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(Unexpressible::new(
                        format!("{at}.type"),
                        "a chat tool message carries text only",
                    ));
                }
                let text = take_string(&mut b, "text", &at)?;
                parts.push(json!({"type": "text", "text": text}));
            }
            collapse_text_parts(parts).unwrap_or_else(|| Value::String(String::new()))
        }
        Some(_) => {
            return Err(Unexpressible::new(
                format!("{at}.content"),
                "must be a string or an array of blocks",
            ))
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// An assistant turn: text blocks as content, `tool_use` blocks as tool calls; thinking is
/// dropped (see the module documentation).
fn assistant_turn_to_chat(content: Value, at: &str) -> Result<Value, Unexpressible> {
    let blocks = match content {
        Value::String(s) => return Ok(json!({"role": "assistant", "content": s})),
        Value::Array(blocks) => blocks,
        _ => {
            return Err(Unexpressible::new(
                format!("{at}.content"),
                "must be a string or an array of blocks",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let Value::Object(mut block) = block else {
            return Err(Unexpressible::new(at, "must be an object"));
        };
        match block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "text" => {
                let text = take_string(&mut block, "text", &at)?;
                parts.push(json!({"type": "text", "text": text}));
            }
            "tool_use" => {
                let id = take_string(&mut block, "id", &at)?;
                let name = take_string(&mut block, "name", &at)?;
                let input = block.remove("input").unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function", "function": {
                    "name": name,
                    "arguments": input.to_string(),
                }}));
            }
            "thinking" | "redacted_thinking" => {}
            _ => {
                return Err(Unexpressible::new(
                    format!("{at}.type"),
                    "not a block chat completions can carry",
                ))
            }
        }
    }
    let mut msg = json!({"role": "assistant", "content": collapse_text_parts(parts)});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    Ok(msg)
}

fn messages_tools_to_chat(req: &mut Object, out: &mut Object) -> Result<(), Unexpressible> {
    let tools = match req.remove("tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => {
            let mut tools = Vec::with_capacity(list.len());
            for (i, tool) in list.into_iter().enumerate() {
                let at = format!("tools[{i}]");
                let Value::Object(mut tool) = tool else {
                    return Err(Unexpressible::new(at, "must be an object"));
                };
                if tool
                    .get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t != "custom")
                {
                    return Err(Unexpressible::new(
                        format!("{at}.type"),
                        "Anthropic-defined tools have no chat counterpart",
                    ));
                }
                let name = take_string(&mut tool, "name", &at)?;
                let mut f = json!({"name": name});
                if let Some(d @ Value::String(_)) = tool.remove("description") {
                    f["description"] = d;
                }
                f["parameters"] = tool
                    .remove("input_schema")
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
                tools.push(json!({"type": "function", "function": f}));
            }
            tools
        }
        Some(_) => return Err(Unexpressible::new("tools", "must be an array")),
    };
    let Some(choice) = req.remove("tool_choice") else {
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
        return Ok(());
    };
    let chat_choice = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| Unexpressible::new("tool_choice.name", "must be a string"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(Unexpressible::new(
                "tool_choice.type",
                "must be auto, any, tool or none",
            ))
        }
    };
    if !tools.is_empty() {
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
        out.insert("tools".into(), Value::Array(tools));
        out.insert("tool_choice".into(), chat_choice);
    }
    Ok(())
}

// === shared helpers ===

/// The body as an object, members set to `null` removed (both dialects read `null` as
/// absent).
fn parse_object(body: &[u8]) -> Result<Object, Unexpressible> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut m)) => {
            m.retain(|_, v| !v.is_null());
            Ok(m)
        }
        Ok(_) => Err(Unexpressible::new("body", "must be a JSON object")),
        Err(_) => Err(Unexpressible::new("body", "is not valid JSON")),
    }
}

/// What is left once every known member is taken: the first one is refused.
fn refuse_leftovers(rest: Object, what: &str) -> Result<(), Unexpressible> {
    match rest.into_iter().find(|(_, v)| !v.is_null()) {
        Some((k, _)) => Err(Unexpressible::new(
            k,
            format!("not {what} signalbox can carry to the other dialect"),
        )),
        None => Ok(()),
    }
}

fn take_string(obj: &mut Object, key: &str, at: &str) -> Result<String, Unexpressible> {
    match obj.remove(key) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(Unexpressible::new(
            format!("{at}.{key}"),
            "must be a string",
        )),
    }
}

fn positive_int(v: &Value, field: &str) -> Result<u64, Unexpressible> {
    v.as_u64()
        .filter(|n| *n > 0)
        .ok_or_else(|| Unexpressible::new(field, "must be a positive integer"))
}

fn number(v: &Value, field: &str) -> Result<f64, Unexpressible> {
    v.as_f64()
        .ok_or_else(|| Unexpressible::new(field, "must be a number"))
}

fn bool_value(v: &Value, field: &str) -> Result<bool, Unexpressible> {
    v.as_bool()
        .ok_or_else(|| Unexpressible::new(field, "must be true or false"))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
