//! The caller's own words in a request: the text of its user and system (and developer)
//! messages, in any dialect — what guardrails check (`crate::guardrails`) — and of its last
//! user turn, which the knn router embeds and `params.task` reads.
//!
//! Read from the spans the one strict scan already found (`messages`, Anthropic's `system`, or
//! the whole body when the dialect has no `messages`: the Responses `input` and
//! `instructions`, a completion's `prompt`, an embedding's `input`), and only when a guardrail
//! applies: a request without one never gets here. What is left out is not the caller's text:
//! assistant turns, tool calls and their results, images, and the body's structure (keys,
//! roles, types). The strict scan accepted the body, so parsing it again cannot fail; a part
//! that is not the expected shape is skipped.

use serde::Deserialize;
use serde_json::Value;

use super::caller::CallerRequest;

/// The roles whose text is the caller's.
const CALLER_ROLES: &[&str] = &["user", "system", "developer"];

/// The request's caller text, its pieces newline-separated. Token counting has none (nothing
/// is generated from it).
pub fn input_text(request: &CallerRequest) -> String {
    let mut out = String::new();
    match request {
        CallerRequest::OpenAi(r) => body_text(r.prompt(), &mut out),
        CallerRequest::Messages(r) => {
            if let Some(system) = r.system() {
                if let Ok(v) = serde_json::from_slice::<Value>(system) {
                    content(&v, &mut out);
                }
            }
            body_text(r.prompt(), &mut out);
        }
        CallerRequest::CountTokens(_) => {}
    }
    out
}

/// The text of the request's last user turn (the whole caller text when it has no
/// `messages`): what the knn router embeds and `params.task` reads.
pub fn last_user_text(request: &CallerRequest) -> String {
    let span = request.prompt();
    if span.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        if let Ok(Value::Array(messages)) = serde_json::from_slice::<Value>(span) {
            let last = messages
                .iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
            let mut out = String::new();
            if let Some(c) = last.and_then(|m| m.get("content")) {
                content(c, &mut out);
            }
            return out;
        }
    }
    input_text(request)
}

/// `params.task`: `code` when the last user turn holds a fenced code block (```), else `chat`.
pub fn task(request: &CallerRequest) -> &'static str {
    // Most requests hold no fence anywhere: the whole prompt is scanned before any parse.
    if memchr::memmem::find(request.prompt(), b"```").is_none() {
        return "chat";
    }
    if memchr::memmem::find(last_user_text(request).as_bytes(), b"```").is_some() {
        "code"
    } else {
        "chat"
    }
}

/// A `messages` array, or a whole body without one.
fn body_text(json: &[u8], out: &mut String) {
    if json.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        if let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(json) {
            items.iter().for_each(|m| message(m, out));
        }
        return;
    }
    /// The members of a body without `messages` that carry the caller's text.
    #[derive(Deserialize)]
    struct Whole {
        #[serde(default)]
        instructions: Option<Value>,
        #[serde(default)]
        input: Option<Value>,
        #[serde(default)]
        prompt: Option<Value>,
    }
    let Ok(whole) = serde_json::from_slice::<Whole>(json) else {
        return;
    };
    if let Some(Value::String(s)) = &whole.instructions {
        push(s, out);
    }
    for v in [&whole.input, &whole.prompt].into_iter().flatten() {
        match v {
            Value::String(s) => push(s, out),
            // A list of strings (prompts, inputs), of token ids (no text), or of Responses
            // items (messages by role).
            Value::Array(items) => {
                for item in items {
                    match item {
                        Value::String(s) => push(s, out),
                        Value::Object(_) => message(item, out),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

/// One message (or Responses item): its content when its role is the caller's.
fn message(m: &Value, out: &mut String) {
    let role = m.get("role").and_then(Value::as_str);
    if role.is_some_and(|r| CALLER_ROLES.contains(&r)) {
        if let Some(c) = m.get("content") {
            content(c, out);
        }
    }
}

/// A content value: a string, or parts of which the text ones count.
fn content(c: &Value, out: &mut String) {
    match c {
        Value::String(s) => push(s, out),
        Value::Array(parts) => {
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str);
                if matches!(kind, Some("text" | "input_text")) {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        push(text, out);
                    }
                }
            }
        }
        _ => {}
    }
}

fn push(s: &str, out: &mut String) {
    if s.is_empty() {
        return;
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(s);
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::catalog::surface::Surface;

    fn text(surface: Surface, body: &str) -> String {
        let request =
            CallerRequest::parse(surface, Bytes::from(body.to_string())).expect("a valid body");
        input_text(&request)
    }

    #[test]
    fn chat_takes_user_and_system_turns_only() {
        let t = text(
            Surface::ChatCompletions,
            r#"{"model":"m","messages":[
                {"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hello"},{"type":"image_url","image_url":{"url":"http://x"}}]},
                {"role":"assistant","content":"assistant words"},
                {"role":"tool","content":"tool output","tool_call_id":"c"}]}"#,
        );
        assert_eq!(t, "be brief\nhello");
    }

    #[test]
    fn messages_take_system_and_user_blocks() {
        let t = text(
            Surface::Messages,
            r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"sys"}],
                "messages":[{"role":"user","content":"u1"},{"role":"assistant","content":"a1"}]}"#,
        );
        assert_eq!(t, "sys\nu1");
        let t = text(
            Surface::Messages,
            r#"{"model":"m","max_tokens":5,"system":"plain","messages":[]}"#,
        );
        assert_eq!(t, "plain");
    }

    #[test]
    fn responses_and_completions_read_input_prompt_and_instructions() {
        assert_eq!(
            text(
                Surface::Responses,
                r#"{"model":"m","instructions":"inst","input":"just text"}"#
            ),
            "inst\njust text"
        );
        assert_eq!(
            text(
                Surface::Responses,
                r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"part"}]},{"type":"function_call_output","output":"no"}]}"#
            ),
            "part"
        );
        assert_eq!(
            text(Surface::Completions, r#"{"model":"m","prompt":["a","b"]}"#),
            "a\nb"
        );
        assert_eq!(
            text(Surface::Embeddings, r#"{"model":"m","input":[1,2,3]}"#),
            ""
        );
    }

    #[test]
    fn the_task_is_code_only_when_the_last_user_turn_holds_a_fence() {
        let task_of = |surface, body: &str| {
            task(&CallerRequest::parse(surface, Bytes::from(body.to_string())).expect("a body"))
        };
        let chat = Surface::ChatCompletions;
        assert_eq!(
            task_of(
                chat,
                r#"{"model":"m","messages":[{"role":"user","content":"fix this:\n```rust\nfn main() {}\n```"}]}"#
            ),
            "code"
        );
        // A fence in an earlier turn, or in the assistant's, is not this turn's task.
        assert_eq!(
            task_of(
                chat,
                r#"{"model":"m","messages":[{"role":"user","content":"```x```"},{"role":"assistant","content":"```y```"},{"role":"user","content":"thanks!"}]}"#
            ),
            "chat"
        );
        assert_eq!(
            task_of(
                chat,
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#
            ),
            "chat"
        );
        assert_eq!(
            task_of(
                Surface::Messages,
                r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"```py\nprint(1)\n```"}]}]}"#
            ),
            "code"
        );
        assert_eq!(
            task_of(
                Surface::Responses,
                r#"{"model":"m","input":"```sh\nls\n```"}"#
            ),
            "code"
        );
    }
}
