//! The envelope of a caller's request body, whatever its dialect: one strict scan of the body
//! ([`json::scan_object`]) for the members routing reads, the refusals every dialect shares
//! ([`RequestBodyError`]), and the body each attempt sends — the received bytes with the
//! `model` value replaced, the `routing` member removed and, where a dialect asks, one member
//! inserted first.
//!
//! Every dialect's scan wants `COMMON_KEYS` first (`model`, `routing`, `messages`) and then
//! its own members (`openai`: `stream`, `max_completion_tokens`, `response_format`…;
//! `anthropic`: `system`, `thinking`, `output_config`…). A dialect reads its own members from
//! the [`Scan`] the envelope hands back, in its own order: the order in which a body's problems
//! are found decides which one its 400 names.

use std::borrow::Cow;
use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;

use super::estimate::{self, Estimate};
use super::facts::{RoutingOverride, MAX_ROUTING_PROVIDERS};
use super::json::{self, JsonError, Scan};
use super::tokenizer::{self, Encoding};

/// The members every dialect's scan wants, at these indices of its key list.
pub(super) const COMMON_KEYS: [&[u8]; 3] = [b"model", b"routing", b"messages"];
pub(super) const WANT_MODEL: usize = 0;
pub(super) const WANT_ROUTING: usize = 1;
pub(super) const WANT_MESSAGES: usize = 2;

/// Why a request body cannot be routed. Messages are signalbox's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestBodyError {
    NotJson,
    TooDeep,
    NotAnObject,
    MissingModel,
    ModelNotString,
    StreamNotBool,
    DuplicateKey(&'static str),
    /// A top-level key that differs from this one only in letter case.
    KeyCase(&'static str),
    BadRouting(String),
}

impl RequestBodyError {
    pub fn message(&self) -> Cow<'static, str> {
        match self {
            RequestBodyError::NotJson => "the request body is not valid JSON".into(),
            RequestBodyError::TooDeep => "the request body nests too deeply".into(),
            RequestBodyError::NotAnObject => "the request body must be a JSON object".into(),
            RequestBodyError::MissingModel => "the request body has no `model`".into(),
            RequestBodyError::ModelNotString => "`model` must be a string".into(),
            RequestBodyError::StreamNotBool => "`stream` must be true or false".into(),
            RequestBodyError::DuplicateKey(k) => format!("`{k}` appears more than once").into(),
            RequestBodyError::KeyCase(k) => {
                format!("a key that differs from `{k}` only in letter case is ambiguous").into()
            }
            RequestBodyError::BadRouting(why) => format!("`routing`: {why}").into(),
        }
    }
}

/// A caller's body, scanned once: the `model` and `messages` spans, and what removing
/// `routing` takes.
#[derive(Debug, Clone)]
pub(super) struct Envelope {
    pub(super) body: Bytes,
    /// The `model` value, quotes included.
    model: Range<usize>,
    /// Bytes to delete to strip `routing` (set by [`Envelope::routing`]).
    routing_removal: Option<Range<usize>>,
    /// The `messages` value (the prompt), if present.
    messages: Option<Range<usize>>,
    /// The prompt's estimate, made the first time something asks (a route whose candidates
    /// declare no price, window, `tpm` or budget, under a key without `tpm`, never does).
    estimate: std::sync::OnceLock<Estimate>,
    /// Whether the prompt carries an image, looked for the first time something asks (only a
    /// candidate that declares capabilities, a `params.vision` condition or explain does).
    vision: std::sync::OnceLock<bool>,
    /// Exact counts of the prompt's text, by encoding (`o200k_base`, `cl100k_base`), once
    /// asked for.
    exact: [std::sync::OnceLock<Option<u64>>; 2],
}

impl Envelope {
    /// Scan `body` for `keys` ([`COMMON_KEYS`] first, then the dialect's own) into `scan` (a
    /// fresh one the dialect reads its own members from) and read the model. Refused: a body
    /// serde_json would not read as an object, a wanted key twice or under another letter
    /// case (the provider may read the last duplicate while we read the first, or match keys
    /// regardless of case), a missing or non-string `model`.
    pub(super) fn scan(
        body: Bytes,
        keys: &'static [&'static [u8]],
        scan: &mut Scan,
    ) -> Result<Self, RequestBodyError> {
        debug_assert!(keys.starts_with(&COMMON_KEYS));
        json::scan_object_into(&body, keys, scan).map_err(|e| match e {
            JsonError::Syntax(_) => RequestBodyError::NotJson,
            JsonError::TooDeep => RequestBodyError::TooDeep,
            JsonError::NotAnObject => RequestBodyError::NotAnObject,
        })?;
        let key_name = |w: usize| {
            keys.get(w)
                .and_then(|k| std::str::from_utf8(k).ok())
                .unwrap_or("a routing field")
        };
        if let Some(w) = scan.duplicate {
            return Err(RequestBodyError::DuplicateKey(key_name(w)));
        }
        if let Some(w) = scan.alias {
            return Err(RequestBodyError::KeyCase(key_name(w)));
        }
        let model = scan.get(WANT_MODEL).ok_or(RequestBodyError::MissingModel)?;
        if body.get(model.value.start) != Some(&b'"') {
            return Err(RequestBodyError::ModelNotString);
        }
        json::decode_string(&body[model.value.clone()]).ok_or(RequestBodyError::ModelNotString)?;
        let envelope = Envelope {
            model: model.value.clone(),
            routing_removal: None,
            messages: scan.get(WANT_MESSAGES).map(|m| m.value.clone()),
            body,
            estimate: std::sync::OnceLock::new(),
            vision: std::sync::OnceLock::new(),
            exact: Default::default(),
        };
        Ok(envelope)
    }

    /// The `routing` member, validated (`null` is no override), marked to be stripped from
    /// every attempt's body.
    pub(super) fn routing(
        &mut self,
        scan: &Scan,
    ) -> Result<Option<RoutingOverride>, RequestBodyError> {
        let Some(m) = scan.get(WANT_ROUTING) else {
            return Ok(None);
        };
        let value = &self.body[m.value.clone()];
        let routing = if value == b"null" {
            RoutingOverride::default()
        } else {
            serde_json::from_slice::<RoutingOverride>(value)
                .map_err(|e| RequestBodyError::BadRouting(routing_error_text(&e)))?
        };
        if routing
            .providers
            .as_ref()
            .is_some_and(|p| p.len() > MAX_ROUTING_PROVIDERS || p.is_empty())
        {
            return Err(RequestBodyError::BadRouting(format!(
                "providers must list 1 to {MAX_ROUTING_PROVIDERS} provider ids"
            )));
        }
        self.routing_removal = Some(scan.removal_range(&m.span));
        Ok(Some(routing))
    }

    /// The raw value of wanted key `w`, if the body has it.
    pub(super) fn value<'a>(&'a self, scan: &Scan, w: usize) -> Option<&'a [u8]> {
        scan.get(w).map(|m| &self.body[m.value.clone()])
    }

    /// `stream` (wanted key `w`): absent, `false` or `null` is no stream.
    pub(super) fn stream(&self, scan: &Scan, w: usize) -> Result<bool, RequestBodyError> {
        match self.value(scan, w) {
            None | Some(b"false" | b"null") => Ok(false),
            Some(b"true") => Ok(true),
            Some(_) => Err(RequestBodyError::StreamNotBool),
        }
    }

    /// The `messages` value as raw JSON, if any.
    pub(super) fn messages(&self) -> Option<&[u8]> {
        self.messages.as_ref().map(|r| &self.body[r.clone()])
    }

    /// The conversation as raw JSON (the `messages` value), or the whole body without one.
    pub(super) fn prompt(&self) -> &[u8] {
        self.messages().unwrap_or(&self.body)
    }

    /// The prompt estimated (see [`super::estimate`]): `messages` and `system` (a dialect's
    /// system prompt member), or the whole body when it has neither (the Responses `input`,
    /// a completion's `prompt`, an embedding's `input`). Made once, when first asked: a
    /// dialect always passes the same `system`.
    pub(super) fn estimate(&self, system: Option<&[u8]>) -> Estimate {
        *self.estimate.get_or_init(|| self.estimate_now(system))
    }

    /// Whether `messages` carries an image part, as the dialect's `find` recognises one
    /// (looked for once, when first asked).
    pub(super) fn vision(&self, find: fn(&[u8]) -> bool) -> bool {
        *self
            .vision
            .get_or_init(|| self.messages().is_some_and(find))
    }

    fn estimate_now(&self, system: Option<&[u8]>) -> Estimate {
        match (self.messages(), system) {
            (None, None) => estimate::estimate(&self.body),
            (m, s) => {
                let mut e = m.map(estimate::estimate).unwrap_or_default();
                if let Some(s) = s.map(estimate::estimate) {
                    e.text_chars += s.text_chars;
                    e.images += s.images;
                    e.image_tokens_openai += s.image_tokens_openai;
                    e.image_tokens_anthropic += s.image_tokens_anthropic;
                }
                e
            }
        }
    }

    /// The prompt's text tokens counted exactly in `encoding` (once per request and
    /// encoding), plus the images by OpenAI's formula; `None` if the encoding is unavailable.
    pub(super) fn exact_openai(
        &self,
        system: Option<&[u8]>,
        encoding: Encoding,
        images_openai: u64,
    ) -> Option<u64> {
        let slot = &self.exact[usize::from(encoding == Encoding::Cl100k)];
        let text = slot.get_or_init(|| {
            let mut text = String::new();
            for part in [system, self.messages()].into_iter().flatten() {
                text.push_str(&estimate::message_text(part));
                text.push('\n');
            }
            if system.is_none() && self.messages().is_none() {
                text = estimate::message_text(&self.body);
            }
            tokenizer::count(&text, encoding)
        });
        text.map(|t| t + images_openai)
    }

    /// The model name the caller sent (decoded).
    pub(super) fn model_name(&self) -> Cow<'_, str> {
        json::decode_string(&self.body[self.model.clone()]).unwrap_or(Cow::Borrowed(""))
    }

    /// The model value exactly as the caller wrote it, quotes included.
    pub(super) fn model_literal(&self) -> Bytes {
        self.body.slice(self.model.clone())
    }

    pub(super) fn body_len(&self) -> usize {
        self.body.len()
    }

    /// The body for one attempt: `model` set to `upstream_model_json` (a JSON string literal),
    /// `routing` removed, `first_member` (a member and its comma, or nothing) inserted just
    /// after the opening brace, every other byte as received. Without an edit, the received
    /// bytes themselves (no copy).
    pub(super) fn body_for(&self, upstream_model_json: &[u8], first_member: &[u8]) -> Bytes {
        let literal = &self.body[self.model.clone()];
        if literal == upstream_model_json
            && self.routing_removal.is_none()
            && first_member.is_empty()
        {
            return self.body.clone();
        }
        // Just after the opening brace (a scanned body is an object, so there is one).
        let open = if first_member.is_empty() {
            0
        } else {
            memchr::memchr(b'{', &self.body).map_or(0, |i| i + 1)
        };
        // The insertion first: a `routing` member removed from the same offset comes after it
        // (the sort keeps that order).
        let mut edits: [(Range<usize>, &[u8]); 3] = [
            (open..open, first_member),
            (self.model.clone(), upstream_model_json),
            (self.routing_removal.clone().unwrap_or(0..0), b""),
        ];
        edits.sort_by_key(|(r, _)| r.start);
        let mut out = BytesMut::with_capacity(
            self.body.len() + upstream_model_json.len() + first_member.len(),
        );
        let mut at = 0;
        for (range, replacement) in &edits {
            if range.is_empty() && replacement.is_empty() {
                continue;
            }
            out.put_slice(&self.body[at..range.start]);
            out.put_slice(replacement);
            at = range.end;
        }
        out.put_slice(&self.body[at..]);
        out.freeze()
    }
}

/// serde's message without its position: it names fields and types, never request content
/// beyond a key name.
fn routing_error_text(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.find(" at line") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

/// A JSON array with at least one element.
pub(super) fn non_empty_array(v: &[u8]) -> bool {
    v.first() == Some(&b'[')
        && v[1..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b != b']')
}

#[derive(Deserialize)]
pub(super) struct Typed<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Option<Cow<'a, str>>,
}

/// An object whose `type` is one of `kinds`.
pub(super) fn type_is(v: &[u8], kinds: &[&str]) -> bool {
    serde_json::from_slice::<Typed<'_>>(v)
        .ok()
        .and_then(|t| t.kind)
        .is_some_and(|k| kinds.contains(&&*k))
}
