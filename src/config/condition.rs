//! The condition language of `rules[].when` and `policies.<p>.select[].when`: a compiled
//! condition, what it may read, and how it is evaluated.
//!
//! A condition is `{field: value}` (equality), `{field: {$op: value, ...}}` (every operator must
//! hold), `{$and: [...]}` / `{$or: [...]}`, or an object of several of these (all must hold),
//! with `$eq $ne $gt $gte $lt $lte $in $nin $regex`. Fields belong to five closed families:
//! `params.{endpoint,stream,tools,vision,model,max_tokens,prompt_tokens,task,agent}` (derived
//! by signalbox from the request it is serving), `metadata.<key>` (the caller's
//! `x-llm-metadata` labels: untrusted), `header.<name>` (a request header, never a credential
//! one), `key.{id,user}` and `budget.{used_pct,remaining_usd}` (the
//! caller key's).
//!
//! Evaluation never fails: a field the request does not have, or a value of another type,
//! makes that comparison false — for `$ne` and `$nin` too, so a condition never matches on
//! what is missing. Conditions are compiled when the config loads, by `config::compile`
//! (unknown operators and fields, bad regular expressions and the size limits are refused
//! there, with the key path); a compiled condition costs a bounded walk: [`MAX_DEPTH`] levels,
//! [`MAX_CLAUSES`] comparisons, regular expressions of at most [`MAX_REGEX_LEN`] bytes compiled
//! under [`REGEX_SIZE_LIMIT`] (the `regex` crate matches in linear time).

/// The deepest nesting of `$and`/`$or` (the condition itself is level 1).
pub const MAX_DEPTH: usize = 4;
/// The most comparisons one condition may hold.
pub const MAX_CLAUSES: usize = 32;
/// The longest `$regex` pattern, in bytes.
pub const MAX_REGEX_LEN: usize = 1024;
/// The compiled size limit of one `$regex` (the `regex` crate's `size_limit`).
pub const REGEX_SIZE_LIMIT: usize = 256 * 1024;
/// The most rules a config may hold.
pub const MAX_RULES: usize = 256;

/// Headers no condition may read beyond the credential headers every part of the config
/// refuses ([`CREDENTIAL_HEADERS`](super::CREDENTIAL_HEADERS)): Google's key, and the token
/// that marks the gateway's own calls. A rule matching on a secret would route by it.
const ALSO_SECRET: [&str; 2] = ["x-goog-api-key", "x-llm-internal-token"];

/// Whether a condition is refused for reading `name` (lower case).
fn is_secret_header(name: &str) -> bool {
    super::CREDENTIAL_HEADERS.contains(&name) || ALSO_SECRET.contains(&name)
}

/// The values of `params.task`: `code` when the last user turn holds a fenced code block.
pub const TASKS: &[&str] = &["code", "chat"];

/// A field a condition reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// `params.endpoint`: the surface the request arrived on (`chat.completions`, `completions`,
    /// `responses`, `embeddings`, `messages`, `messages.count_tokens`).
    Endpoint,
    /// `params.stream`: the caller asked for a stream.
    Stream,
    /// `params.tools`: the request declares tools.
    Tools,
    /// `params.vision`: the request carries images.
    Vision,
    /// `params.model`: the model string the caller sent.
    Model,
    /// `params.max_tokens`: the output limit the caller asked for, if any.
    MaxTokens,
    /// `params.prompt_tokens`: signalbox's estimate of the prompt's size.
    PromptTokens,
    /// `params.task`: `code` when the last user turn holds a fenced code block, else `chat`.
    Task,
    /// `params.agent`: the client named by `user-agent` (`crate::adapters::agent`).
    Agent,
    /// `metadata.<key>`: a label from `x-llm-metadata`.
    Metadata(Box<str>),
    /// `header.<name>`: a request header's value (its first, when repeated), by its lower-case
    /// name; never a credential's.
    Header(Box<str>),
    /// `key.id`: the caller key's id.
    KeyId,
    /// `key.user`: the caller key's user.
    KeyUser,
    /// `budget.used_pct`: share of the caller key's budget spent, 0–100.
    BudgetUsedPct,
    /// `budget.remaining_usd`: what is left of the caller key's budget.
    BudgetRemainingUsd,
}

impl Field {
    /// The field a dotted name denotes, or `None` for an unknown family or field.
    pub fn parse(name: &str) -> Option<Field> {
        let (family, rest) = name.split_once('.')?;
        Some(match (family, rest) {
            ("params", "endpoint") => Field::Endpoint,
            ("params", "stream") => Field::Stream,
            ("params", "tools") => Field::Tools,
            ("params", "vision") => Field::Vision,
            ("params", "model") => Field::Model,
            ("params", "max_tokens") => Field::MaxTokens,
            ("params", "prompt_tokens") => Field::PromptTokens,
            ("params", "task") => Field::Task,
            ("params", "agent") => Field::Agent,
            ("metadata", k) if !k.is_empty() => Field::Metadata(k.into()),
            ("header", h) if header_name_problem(h).is_none() => Field::Header(h.into()),
            ("key", "id") => Field::KeyId,
            ("key", "user") => Field::KeyUser,
            ("budget", "used_pct") => Field::BudgetUsedPct,
            ("budget", "remaining_usd") => Field::BudgetRemainingUsd,
            _ => return None,
        })
    }
}

/// What keeps `name` from being a `header.<name>` field, or `None` when it may be one: it must
/// be a lower-case header name and not a credential's.
pub fn header_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("`header.` needs a header name, such as header.x-team".to_string());
    }
    if is_secret_header(&name.to_ascii_lowercase()) {
        return Some(format!(
            "`header.{name}` carries a credential and can never be read by a condition"
        ));
    }
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Some(format!("`{name}` is not a header name"));
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(format!(
            "header names are written in lower case: header.{}",
            name.to_ascii_lowercase()
        ));
    }
    None
}

/// Compile a pattern under the condition language's bounds (at most [`MAX_REGEX_LEN`] bytes,
/// compiled under [`REGEX_SIZE_LIMIT`]); the error says what is wrong, for the key's path. Rule
/// `$regex` clauses and guardrail `patterns` share it.
pub fn bounded_regex(pattern: &str) -> Result<regex::Regex, String> {
    if pattern.len() > MAX_REGEX_LEN {
        return Err(format!(
            "the pattern is {} bytes; at most {MAX_REGEX_LEN}",
            pattern.len()
        ));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => format!(
                "the pattern compiles past the size limit ({} KiB); simplify it",
                REGEX_SIZE_LIMIT / 1024
            ),
            e => {
                // The syntax error's last line says what is wrong; the lines above draw it.
                let text = e.to_string();
                let why = text
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim_start_matches("error: ")
                    .to_string();
                format!("not a valid regular expression: {why}")
            }
        })
}

/// A constant a field is compared with.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Str(Box<str>),
    Num(f64),
    Bool(bool),
}

/// A field's value in one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FactValue<'a> {
    Str(&'a str),
    Num(f64),
    Bool(bool),
}

/// What a condition reads: one request's facts.
pub trait Facts {
    /// The value of `field` in this request, or `None` when it has none.
    fn get(&self, field: &Field) -> Option<FactValue<'_>>;
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

/// A compiled condition.
#[derive(Debug, Clone)]
pub enum Condition {
    /// Every part holds (an empty list always holds).
    All(Vec<Condition>),
    /// At least one part holds.
    Any(Vec<Condition>),
    Cmp {
        field: Field,
        op: CmpOp,
        value: Scalar,
    },
    /// `$in` (or `$nin` with `negate`).
    In {
        field: Field,
        values: Vec<Scalar>,
        negate: bool,
    },
    Regex {
        field: Field,
        regex: regex::Regex,
    },
}

impl Condition {
    /// Whether the request's facts satisfy the condition. Never fails.
    pub fn matches(&self, facts: &dyn Facts) -> bool {
        match self {
            Condition::All(parts) => parts.iter().all(|c| c.matches(facts)),
            Condition::Any(parts) => parts.iter().any(|c| c.matches(facts)),
            Condition::Cmp { field, op, value } => {
                facts.get(field).is_some_and(|v| compare(v, *op, value))
            }
            Condition::In {
                field,
                values,
                negate,
            } => facts.get(field).is_some_and(|v| {
                let found = values.iter().any(|s| compare(v, CmpOp::Eq, s));
                // `$nin` on a value of another type than the list's holds no information.
                if *negate {
                    !found && values.iter().any(|s| same_type(v, s))
                } else {
                    found
                }
            }),
            Condition::Regex { field, regex } => match facts.get(field) {
                Some(FactValue::Str(s)) => regex.is_match(s),
                _ => false,
            },
        }
    }

    /// The number of comparisons (leaves) it holds.
    pub fn clauses(&self) -> usize {
        match self {
            Condition::All(p) | Condition::Any(p) => p.iter().map(Condition::clauses).sum(),
            _ => 1,
        }
    }
}

fn same_type(v: FactValue<'_>, s: &Scalar) -> bool {
    matches!(
        (v, s),
        (FactValue::Str(_), Scalar::Str(_))
            | (FactValue::Num(_), Scalar::Num(_))
            | (FactValue::Bool(_), Scalar::Bool(_))
    )
}

/// `v op s`; false when the types differ (so `$ne` against another type is false too) or
/// when the operator has no meaning for the type (`$gt` on booleans).
fn compare(v: FactValue<'_>, op: CmpOp, s: &Scalar) -> bool {
    use std::cmp::Ordering;
    let ord = match (v, s) {
        (FactValue::Str(a), Scalar::Str(b)) => a.cmp(b),
        (FactValue::Num(a), Scalar::Num(b)) => match a.partial_cmp(b) {
            Some(o) => o,
            None => return false,
        },
        (FactValue::Bool(a), Scalar::Bool(b)) => {
            return match op {
                CmpOp::Eq => a == *b,
                CmpOp::Ne => a != *b,
                _ => false,
            }
        }
        _ => return false,
    };
    match op {
        CmpOp::Eq => ord == Ordering::Equal,
        CmpOp::Ne => ord != Ordering::Equal,
        CmpOp::Gt => ord == Ordering::Greater,
        CmpOp::Gte => ord != Ordering::Less,
        CmpOp::Lt => ord == Ordering::Less,
        CmpOp::Lte => ord != Ordering::Greater,
    }
}
