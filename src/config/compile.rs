//! Compiling a condition as written (`rules[].when`, `policies.<p>.select[].when`: a YAML or
//! JSON value) into a [`Condition`], refusing at load what evaluation must never meet.
//!
//! Every problem is pushed as a [`ConfigError`] with its full key path — the object that holds
//! an unknown key (`rules[2].when.$and[1].metadata.team: unknown operator `$inn``), or the
//! operator whose value is wrong (`….params.max_tokens.$gt: `$gt` takes a number`) — and
//! compiling goes on with the siblings, so one pass lists them all. What is refused: unknown
//! field families and fields, unknown operators, `null`, empty objects and lists, constants of
//! the wrong type for a typed field (`params.stream: {$gt: 3}`), a value a closed field never
//! takes (`params.task: coding`), a credential header (`header.authorization`), non-finite
//! numbers, YAML tags,
//! `$regex` patterns longer than [`MAX_REGEX_LEN`](super::condition::MAX_REGEX_LEN) or compiling past
//! [`REGEX_SIZE_LIMIT`](super::condition::REGEX_SIZE_LIMIT), `$and`
//! / `$or` nested deeper than [`MAX_DEPTH`], and more than [`MAX_CLAUSES`] comparisons.

use serde_yaml::Value;

use super::condition::{self, CmpOp, Condition, Field, Scalar, MAX_CLAUSES, MAX_DEPTH};
use super::ConfigError;
use crate::adapters::agent;

/// The values `params.agent` takes, for an error naming them.
fn agent_names() -> String {
    let mut names: Vec<&str> = agent::AGENTS.iter().map(|(n, _)| *n).collect();
    names.push(agent::UNKNOWN);
    names.join(", ")
}

/// The families a field name starts with.
const FAMILIES: &str = "params, metadata, header, key, budget";
/// The operators a field takes.
const OPERATORS: &str = "$eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $regex";

/// Compile the condition `raw` found at `path`; `None` (with errors pushed) when it is refused.
pub fn compile_condition(
    raw: &Value,
    path: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<Condition> {
    let before = errs.len();
    let compiled = Compiler { errs }.object(raw, path, 1);
    if errs.len() != before {
        return None;
    }
    let compiled = compiled?;
    let clauses = compiled.clauses();
    if clauses > MAX_CLAUSES {
        errs.push(ConfigError::new(
            path,
            format!("{clauses} comparisons; a condition holds at most {MAX_CLAUSES}"),
        ));
        return None;
    }
    Some(compiled)
}

/// The type a field's values have, when it has a fixed one (`metadata.*` has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Num,
    Bool,
}

impl Kind {
    fn of_field(field: &Field) -> Option<Kind> {
        Some(match field {
            Field::Endpoint
            | Field::Model
            | Field::KeyId
            | Field::KeyUser
            | Field::Task
            | Field::Agent
            | Field::Header(_) => Kind::Str,
            Field::Stream | Field::Tools | Field::Vision => Kind::Bool,
            Field::MaxTokens
            | Field::PromptTokens
            | Field::BudgetUsedPct
            | Field::BudgetRemainingUsd => Kind::Num,
            Field::Metadata(_) => return None,
        })
    }

    fn of_scalar(s: &Scalar) -> Kind {
        match s {
            Scalar::Str(_) => Kind::Str,
            Scalar::Num(_) => Kind::Num,
            Scalar::Bool(_) => Kind::Bool,
        }
    }

    fn article(self) -> &'static str {
        match self {
            Kind::Str => "a string",
            Kind::Num => "a number",
            Kind::Bool => "a boolean",
        }
    }
}

/// What a raw value is, for messages.
fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "an object",
        Value::Tagged(_) => "a tagged value",
    }
}

/// Why `name` is not a field.
fn unknown_field(name: &str) -> String {
    let (family, rest) = name.split_once('.').unwrap_or((name, ""));
    match family {
        "params" => format!(
            "unknown field `{name}` (params.endpoint, params.stream, params.tools, params.vision, \
             params.model, params.max_tokens, params.prompt_tokens, params.task, params.agent)"
        ),
        "header" => condition::header_name_problem(rest)
            .unwrap_or_else(|| format!("unknown field `{name}`")),
        "metadata" if rest.is_empty() => {
            "`metadata.` needs a label name, such as metadata.tier".to_string()
        }
        "key" => format!("unknown field `{name}` (key.id, key.user)"),
        "budget" => format!("unknown field `{name}` (budget.used_pct, budget.remaining_usd)"),
        _ => format!("unknown field family `{family}` ({FAMILIES})"),
    }
}

/// Every part holds: the part itself when there is one.
fn all(mut parts: Vec<Condition>) -> Condition {
    if parts.len() == 1 {
        if let Some(only) = parts.pop() {
            return only;
        }
    }
    Condition::All(parts)
}

struct Compiler<'e> {
    errs: &'e mut Vec<ConfigError>,
}

impl Compiler<'_> {
    fn err(&mut self, path: &str, message: impl Into<String>) {
        self.errs.push(ConfigError::new(path, message));
    }

    /// A condition object at nesting level `depth` (the condition itself is level 1): all of
    /// its entries must hold.
    fn object(&mut self, v: &Value, path: &str, depth: usize) -> Option<Condition> {
        let map = match v {
            Value::Mapping(m) if !m.is_empty() => m,
            Value::Mapping(_) => {
                self.err(path, "an empty condition; write a field or `$and`/`$or`");
                return None;
            }
            other => {
                self.err(
                    path,
                    format!(
                        "a condition is an object such as {{ params.stream: true }}, found {}",
                        describe(other)
                    ),
                );
                return None;
            }
        };
        let mut parts = Vec::with_capacity(map.len());
        let mut ok = true;
        for (k, v) in map {
            let Some(key) = k.as_str() else {
                self.err(
                    path,
                    format!(
                        "condition keys are field names or `$and`/`$or`, found {}",
                        describe(k)
                    ),
                );
                ok = false;
                continue;
            };
            let kpath = format!("{path}.{key}");
            let part = match key {
                "$and" | "$or" => self.group(key, v, &kpath, depth),
                "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$in" | "$nin" | "$regex" => {
                    self.err(
                        path,
                        format!("`{key}` compares a field: write {{ <field>: {{ {key}: ... }} }}"),
                    );
                    None
                }
                op if op.starts_with('$') => {
                    self.err(
                        path,
                        format!("unknown operator `{op}` ($and, $or, or a field)"),
                    );
                    None
                }
                name => self.field(name, v, &kpath),
            };
            match part {
                Some(p) => parts.push(p),
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        Some(all(parts))
    }

    /// `$and` / `$or` written in an object at level `depth`.
    fn group(&mut self, op: &str, v: &Value, path: &str, depth: usize) -> Option<Condition> {
        if depth > MAX_DEPTH {
            self.err(
                path,
                format!("`$and`/`$or` nested more than {MAX_DEPTH} deep"),
            );
            return None;
        }
        let list = match v {
            Value::Sequence(l) if !l.is_empty() => l,
            other => {
                self.err(
                    path,
                    format!(
                        "`{op}` takes a non-empty list of conditions, found {}",
                        if matches!(other, Value::Sequence(_)) {
                            "an empty list"
                        } else {
                            describe(other)
                        }
                    ),
                );
                return None;
            }
        };
        let mut parts = Vec::with_capacity(list.len());
        let mut ok = true;
        for (i, item) in list.iter().enumerate() {
            match self.object(item, &format!("{path}[{i}]"), depth + 1) {
                Some(c) => parts.push(c),
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        Some(if op == "$and" {
            Condition::All(parts)
        } else {
            Condition::Any(parts)
        })
    }

    /// `name: value` (equality) or `name: {$op: value, ...}` (every operator holds).
    fn field(&mut self, name: &str, v: &Value, path: &str) -> Option<Condition> {
        let Some(field) = Field::parse(name) else {
            self.err(path, unknown_field(name));
            return None;
        };
        let Value::Mapping(ops) = v else {
            let value = self.typed_scalar(&field, name, v, path)?;
            return Some(Condition::Cmp {
                field,
                op: CmpOp::Eq,
                value,
            });
        };
        if ops.is_empty() {
            self.err(
                path,
                format!("no operator; write a value or one of {OPERATORS}"),
            );
            return None;
        }
        let mut parts = Vec::with_capacity(ops.len());
        let mut ok = true;
        for (k, v) in ops {
            let Some(op) = k.as_str() else {
                self.err(
                    path,
                    format!("operators are strings such as `$eq`, found {}", describe(k)),
                );
                ok = false;
                continue;
            };
            match self.operator(&field, name, op, v, path) {
                Some(c) => parts.push(c),
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        Some(all(parts))
    }

    /// One `$op: value` under field `name` (written at `path`).
    fn operator(
        &mut self,
        field: &Field,
        name: &str,
        op: &str,
        v: &Value,
        path: &str,
    ) -> Option<Condition> {
        let opath = format!("{path}.{op}");
        let cmp = match op {
            "$eq" => Some(CmpOp::Eq),
            "$ne" => Some(CmpOp::Ne),
            "$gt" => Some(CmpOp::Gt),
            "$gte" => Some(CmpOp::Gte),
            "$lt" => Some(CmpOp::Lt),
            "$lte" => Some(CmpOp::Lte),
            _ => None,
        };
        match (op, cmp) {
            (_, Some(op @ (CmpOp::Eq | CmpOp::Ne))) => {
                let value = self.typed_scalar(field, name, v, &opath)?;
                Some(Condition::Cmp {
                    field: field.clone(),
                    op,
                    value,
                })
            }
            (written, Some(op)) => {
                let kind = Kind::of_field(field);
                if let Some(k) = kind.filter(|k| *k != Kind::Num) {
                    self.err(
                        &opath,
                        format!(
                            "`{written}` compares numbers and `{name}` is {}",
                            k.article()
                        ),
                    );
                    return None;
                }
                match self.scalar(v, &opath)? {
                    value @ Scalar::Num(_) => Some(Condition::Cmp {
                        field: field.clone(),
                        op,
                        value,
                    }),
                    other => {
                        self.err(
                            &opath,
                            format!(
                                "`{written}` takes a number, found {}",
                                Kind::of_scalar(&other).article()
                            ),
                        );
                        None
                    }
                }
            }
            ("$in" | "$nin", None) => {
                let list = match v {
                    Value::Sequence(l) if !l.is_empty() => l,
                    other => {
                        self.err(
                            &opath,
                            format!(
                                "`{op}` takes a non-empty list of strings, numbers or booleans, \
                                 found {}",
                                if matches!(other, Value::Sequence(_)) {
                                    "an empty list"
                                } else {
                                    describe(other)
                                }
                            ),
                        );
                        return None;
                    }
                };
                let mut values = Vec::with_capacity(list.len());
                let mut ok = true;
                for (i, item) in list.iter().enumerate() {
                    match self.typed_scalar(field, name, item, &format!("{opath}[{i}]")) {
                        Some(s) => values.push(s),
                        None => ok = false,
                    }
                }
                ok.then(|| Condition::In {
                    field: field.clone(),
                    values,
                    negate: op == "$nin",
                })
            }
            ("$regex", None) => self.regex(field, name, v, &opath),
            _ => {
                self.err(path, format!("unknown operator `{op}` ({OPERATORS})"));
                None
            }
        }
    }

    fn regex(&mut self, field: &Field, name: &str, v: &Value, path: &str) -> Option<Condition> {
        if let Some(k) = Kind::of_field(field).filter(|k| *k != Kind::Str) {
            self.err(
                path,
                format!("`$regex` matches strings and `{name}` is {}", k.article()),
            );
            return None;
        }
        let Value::String(pattern) = v else {
            self.err(
                path,
                format!("`$regex` takes a string, found {}", describe(v)),
            );
            return None;
        };
        match super::condition::bounded_regex(pattern) {
            Ok(regex) => Some(Condition::Regex {
                field: field.clone(),
                regex,
            }),
            Err(why) => {
                self.err(path, why);
                None
            }
        }
    }

    /// A constant compared with `field`: refused when the field has a fixed type it lacks.
    fn typed_scalar(&mut self, field: &Field, name: &str, v: &Value, path: &str) -> Option<Scalar> {
        let value = self.scalar(v, path)?;
        if let Some(k) = Kind::of_field(field) {
            let found = Kind::of_scalar(&value);
            if found != k {
                self.err(
                    path,
                    format!(
                        "expected {} for `{name}`, found {}",
                        k.article(),
                        found.article()
                    ),
                );
                return None;
            }
        }
        // The fields of a closed set of values: a value outside it could never match.
        if let Scalar::Str(text) = &value {
            let known = match field {
                Field::Task => condition::TASKS.contains(&&**text),
                Field::Agent => agent::is_agent(text),
                _ => true,
            };
            if !known {
                let names = match field {
                    Field::Task => condition::TASKS.join(", "),
                    _ => agent_names(),
                };
                self.err(
                    path,
                    format!("`{name}` is never `{text}`; it is one of {names}"),
                );
                return None;
            }
        }
        Some(value)
    }

    /// A string, a finite number or a boolean.
    fn scalar(&mut self, v: &Value, path: &str) -> Option<Scalar> {
        match v {
            Value::String(s) => Some(Scalar::Str(s.as_str().into())),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Number(n) => match n.as_f64().filter(|f| f.is_finite()) {
                Some(f) => Some(Scalar::Num(f)),
                None => {
                    self.err(path, "numbers must be finite");
                    None
                }
            },
            Value::Null => {
                self.err(
                    path,
                    "null is not a value (a field the request lacks never matches)",
                );
                None
            }
            Value::Sequence(_) => {
                self.err(
                    path,
                    "a list is not a value here; to match one of several, use { $in: [...] }",
                );
                None
            }
            other => {
                self.err(
                    path,
                    format!(
                        "expected a string, a number or a boolean, found {}",
                        describe(other)
                    ),
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::condition::{FactValue, Facts};

    /// One request's facts, written as `(field, value)` pairs.
    #[derive(Default)]
    struct Req(Vec<(Field, Fact)>);

    #[derive(Clone, Copy)]
    enum Fact {
        S(&'static str),
        N(f64),
        B(bool),
    }

    impl Facts for Req {
        fn get(&self, field: &Field) -> Option<FactValue<'_>> {
            self.0
                .iter()
                .find(|(f, _)| f == field)
                .map(|(_, v)| match v {
                    Fact::S(s) => FactValue::Str(s),
                    Fact::N(n) => FactValue::Num(*n),
                    Fact::B(b) => FactValue::Bool(*b),
                })
        }
    }

    fn req(facts: &[(&str, Fact)]) -> Req {
        Req(facts
            .iter()
            .map(|(name, v)| (Field::parse(name).expect("a field"), *v))
            .collect())
    }

    fn compile(text: &str) -> Result<Condition, Vec<String>> {
        let raw: Value = serde_yaml::from_str(text).expect("yaml");
        let mut errs = Vec::new();
        match compile_condition(&raw, "when", &mut errs) {
            Some(c) if errs.is_empty() => Ok(c),
            _ => Err(errs.iter().map(ToString::to_string).collect()),
        }
    }

    fn holds(cond: &str, facts: &Req) -> bool {
        match compile(cond) {
            Ok(c) => c.matches(facts),
            Err(e) => panic!("{cond}: {e:?}"),
        }
    }

    use Fact::{B, N, S};

    /// A request with a value of each type.
    fn sample() -> Req {
        req(&[
            ("params.stream", B(true)),
            ("params.tools", B(false)),
            ("params.model", S("auto")),
            ("params.max_tokens", N(512.0)),
            ("params.prompt_tokens", N(1200.0)),
            ("metadata.tier", S("free")),
            ("metadata.level", N(3.0)),
            ("metadata.beta", B(true)),
            ("key.id", S("search-team")),
            ("budget.used_pct", N(80.0)),
        ])
    }

    #[test]
    fn each_operator_on_each_type() {
        let r = sample();
        let table: &[(&str, bool)] = &[
            // shorthand equality
            ("{ metadata.tier: free }", true),
            ("{ metadata.tier: paid }", false),
            ("{ params.stream: true }", true),
            ("{ params.tools: true }", false),
            ("{ params.max_tokens: 512 }", true),
            ("{ metadata.level: 3 }", true),
            ("{ metadata.beta: true }", true),
            // $eq / $ne on strings, numbers, booleans
            ("{ key.id: { $eq: search-team } }", true),
            ("{ key.id: { $ne: search-team } }", false),
            ("{ key.id: { $ne: ads } }", true),
            ("{ params.max_tokens: { $eq: 512 } }", true),
            ("{ params.max_tokens: { $ne: 512 } }", false),
            ("{ params.max_tokens: { $ne: 100 } }", true),
            ("{ params.stream: { $eq: false } }", false),
            ("{ params.stream: { $ne: false } }", true),
            // ordering on numbers
            ("{ params.prompt_tokens: { $gt: 1000 } }", true),
            ("{ params.prompt_tokens: { $gt: 1200 } }", false),
            ("{ params.prompt_tokens: { $gte: 1200 } }", true),
            ("{ params.prompt_tokens: { $lt: 1200 } }", false),
            ("{ params.prompt_tokens: { $lte: 1200 } }", true),
            ("{ params.prompt_tokens: { $lt: 1200.5 } }", true),
            ("{ budget.used_pct: { $gte: 80, $lt: 90 } }", true),
            ("{ budget.used_pct: { $gte: 80, $lt: 80 } }", false),
            ("{ metadata.level: { $gt: 2 } }", true),
            // $in / $nin on strings, numbers, booleans
            ("{ metadata.tier: { $in: [free, trial] } }", true),
            ("{ metadata.tier: { $in: [paid, trial] } }", false),
            ("{ metadata.tier: { $nin: [paid, trial] } }", true),
            ("{ metadata.tier: { $nin: [free] } }", false),
            ("{ params.max_tokens: { $in: [256, 512] } }", true),
            ("{ params.max_tokens: { $nin: [256, 512] } }", false),
            ("{ params.stream: { $in: [true] } }", true),
            ("{ params.stream: { $nin: [true] } }", false),
            // $regex (unanchored unless the pattern anchors)
            ("{ key.id: { $regex: '^search-' } }", true),
            ("{ key.id: { $regex: team } }", true),
            ("{ key.id: { $regex: '^team' } }", false),
            ("{ metadata.tier: { $regex: '^(free|trial)$' } }", true),
            // an object: all of its entries
            ("{ params.stream: true, metadata.tier: free }", true),
            ("{ params.stream: true, metadata.tier: paid }", false),
        ];
        for (cond, want) in table {
            assert_eq!(holds(cond, &r), *want, "{cond}");
        }
    }

    #[test]
    fn missing_fields_never_match() {
        let empty = Req::default();
        for cond in [
            "{ metadata.tier: free }",
            "{ metadata.tier: { $eq: free } }",
            "{ metadata.tier: { $ne: free } }",
            "{ params.max_tokens: { $gt: 0 } }",
            "{ params.max_tokens: { $gte: 0 } }",
            "{ params.max_tokens: { $lt: 1 } }",
            "{ params.max_tokens: { $lte: 1 } }",
            "{ metadata.tier: { $in: [free] } }",
            "{ metadata.tier: { $nin: [free] } }",
            "{ metadata.tier: { $regex: '.*' } }",
            "{ params.stream: { $ne: true } }",
        ] {
            assert!(!holds(cond, &empty), "{cond}");
        }
    }

    #[test]
    fn a_value_of_another_type_never_matches() {
        // `metadata.*` has no fixed type: the label is a string, the constant a number.
        let r = req(&[("metadata.level", S("3")), ("metadata.beta", S("true"))]);
        for cond in [
            "{ metadata.level: 3 }",
            "{ metadata.level: { $ne: 4 } }",
            "{ metadata.level: { $gt: 1 } }",
            "{ metadata.level: { $in: [3, 4] } }",
            "{ metadata.level: { $nin: [4, 5] } }",
            "{ metadata.beta: true }",
            "{ metadata.beta: { $ne: false } }",
        ] {
            assert!(!holds(cond, &r), "{cond}");
        }
        // The same label as a number does match; a quoted constant is a string.
        let n = req(&[("metadata.level", N(3.0))]);
        assert!(holds("{ metadata.level: { $nin: [4, 5] } }", &n));
        assert!(!holds("{ metadata.level: '3' }", &n));
        assert!(holds("{ metadata.level: '3' }", &r));
    }

    #[test]
    fn and_or_combine() {
        let r = sample();
        let table: &[(&str, bool)] = &[
            ("{ $and: [ { params.stream: true }, { metadata.tier: free } ] }", true),
            ("{ $and: [ { params.stream: true }, { metadata.tier: paid } ] }", false),
            ("{ $or: [ { params.tools: true }, { metadata.tier: free } ] }", true),
            ("{ $or: [ { params.tools: true }, { metadata.tier: paid } ] }", false),
            ("{ $or: [ { metadata.absent: x }, { metadata.tier: free } ] }", true),
            (
                "{ $and: [ { params.stream: true }, { $or: [ { key.id: x }, { budget.used_pct: { $gt: 50 } } ] } ] }",
                true,
            ),
            // Beside other keys, `$or` is one more entry that must hold.
            ("{ params.stream: true, $or: [ { params.tools: true }, { metadata.tier: paid } ] }", false),
            ("{ params.stream: true, $or: [ { params.tools: true }, { metadata.tier: free } ] }", true),
        ];
        for (cond, want) in table {
            assert_eq!(holds(cond, &r), *want, "{cond}");
        }
    }

    /// `$and` nested `levels` deep around one comparison.
    fn nested(levels: usize) -> String {
        let mut s = "{ params.stream: true }".to_string();
        for i in 0..levels {
            let op = if i % 2 == 0 { "$and" } else { "$or" };
            s = format!("{{ {op}: [ {s} ] }}");
        }
        s
    }

    #[test]
    fn nesting_and_clause_limits() {
        assert!(holds(&nested(MAX_DEPTH), &sample()));
        let e = compile(&nested(MAX_DEPTH + 1)).expect_err("too deep");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with(
                "when.$and[0].$or[0].$and[0].$or[0].$and: `$and`/`$or` nested more than 4 deep"
            ),
            "{e:?}"
        );

        let clauses = |n: usize| {
            let list: Vec<String> = (0..n).map(|i| format!("{{ metadata.k{i}: v }}")).collect();
            format!("{{ $or: [ {} ] }}", list.join(", "))
        };
        assert!(compile(&clauses(MAX_CLAUSES)).is_ok());
        let e = compile(&clauses(MAX_CLAUSES + 1)).expect_err("too many");
        assert_eq!(
            e,
            vec!["when: 33 comparisons; a condition holds at most 32".to_string()]
        );
        // `$in` counts once, whatever its length.
        let list: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        assert!(compile(&format!(
            "{{ metadata.n: {{ $in: [{}] }} }}",
            list.join(",")
        ))
        .is_ok());
    }

    #[test]
    fn hostile_conditions_are_refused_with_their_path() {
        let long = "a".repeat(crate::config::condition::MAX_REGEX_LEN + 1);
        let table: Vec<(String, &str)> = vec![
            (
                "{ metadata.team: { $inn: [a] } }".into(),
                "when.metadata.team: unknown operator `$inn`",
            ),
            (
                "{ $and: [ { params.stream: true }, { metadata.team: { $inn: [a] } } ] }".into(),
                "when.$and[1].metadata.team: unknown operator `$inn`",
            ),
            (
                "{ $not: { params.stream: true } }".into(),
                "when: unknown operator `$not`",
            ),
            (
                "{ $eq: 3 }".into(),
                "when: `$eq` compares a field",
            ),
            (
                "{ metadata.team: { eq: a } }".into(),
                "when.metadata.team: unknown operator `eq`",
            ),
            (
                "{ foo.bar: 1 }".into(),
                "when.foo.bar: unknown field family `foo` (params, metadata, header, key, budget)",
            ),
            (
                "{ tier: free }".into(),
                "when.tier: unknown field family `tier`",
            ),
            (
                "{ params.colour: red }".into(),
                "when.params.colour: unknown field `params.colour` (params.endpoint",
            ),
            ("{ key.secret: x }".into(), "when.key.secret: unknown field `key.secret`"),
            // credential headers can never be read; header names are written in lower case
            ("{ header.authorization: { $regex: '^Bearer sk-' } }".into(), "when.header.authorization: `header.authorization` carries a credential and can never be read by a condition"),
            ("{ header.x-api-key: k }".into(), "when.header.x-api-key: `header.x-api-key` carries a credential"),
            ("{ header.Cookie: k }".into(), "when.header.Cookie: `header.Cookie` carries a credential"),
            ("{ header.proxy-authorization: k }".into(), "when.header.proxy-authorization: `header.proxy-authorization` carries a credential"),
            ("{ header.X-Team: ads }".into(), "when.header.X-Team: header names are written in lower case: header.x-team"),
            ("{ header.: ads }".into(), "when.header.: `header.` needs a header name"),
            ("{ header.a b: ads }".into(), "when.header.a b: `a b` is not a header name"),
            // closed fields refuse a value they never take, naming the ones they do
            ("{ params.task: coding }".into(), "when.params.task: `params.task` is never `coding`; it is one of code, chat"),
            ("{ params.agent: { $in: [codex, claude] } }".into(), "when.params.agent.$in[1]: `params.agent` is never `claude`; it is one of claude-code, codex, aider, cursor, langchain, litellm, openai-sdk, anthropic-sdk, unknown"),
            ("{ params.agent: { $gt: 1 } }".into(), "when.params.agent.$gt: `$gt` compares numbers and `params.agent` is a string"),
            ("{ metadata.: x }".into(), "when.metadata.: `metadata.` needs a label name"),
            ("{}".into(), "when: an empty condition"),
            ("null".into(), "when: a condition is an object"),
            ("[ { params.stream: true } ]".into(), "when: a condition is an object"),
            ("{ metadata.tier: {} }".into(), "when.metadata.tier: no operator"),
            ("{ metadata.tier: null }".into(), "when.metadata.tier: null is not a value"),
            ("{ metadata.tier: ~ }".into(), "when.metadata.tier: null is not a value"),
            ("{ metadata.tier: { $eq: null } }".into(), "when.metadata.tier.$eq: null is not a value"),
            ("{ metadata.tier: [a, b] }".into(), "when.metadata.tier: a list is not a value"),
            ("{ metadata.tier: { $eq: { a: 1 } } }".into(), "when.metadata.tier.$eq: expected a string, a number or a boolean, found an object"),
            ("{ metadata.n: .nan }".into(), "when.metadata.n: numbers must be finite"),
            ("{ metadata.n: { $gt: .inf } }".into(), "when.metadata.n.$gt: numbers must be finite"),
            ("{ $and: [] }".into(), "when.$and: `$and` takes a non-empty list of conditions, found an empty list"),
            ("{ $or: { params.stream: true } }".into(), "when.$or: `$or` takes a non-empty list of conditions, found an object"),
            ("{ $and: [ {} ] }".into(), "when.$and[0]: an empty condition"),
            ("{ $and: [ true ] }".into(), "when.$and[0]: a condition is an object"),
            ("{ metadata.t: { $in: [] } }".into(), "when.metadata.t.$in: `$in` takes a non-empty list"),
            ("{ metadata.t: { $nin: a } }".into(), "when.metadata.t.$nin: `$nin` takes a non-empty list of strings, numbers or booleans, found a string"),
            ("{ metadata.t: { $in: [a, [b]] } }".into(), "when.metadata.t.$in[1]: a list is not a value"),
            ("{ metadata.t: { $in: [a, null] } }".into(), "when.metadata.t.$in[1]: null is not a value"),
            ("{ metadata.n: { $gt: '3' } }".into(), "when.metadata.n.$gt: `$gt` takes a number, found a string"),
            ("{ metadata.n: { $lte: true } }".into(), "when.metadata.n.$lte: `$lte` takes a number, found a boolean"),
            // typed params refuse constants of another type, naming the expected one
            ("{ params.stream: { $gt: 3 } }".into(), "when.params.stream.$gt: `$gt` compares numbers and `params.stream` is a boolean"),
            ("{ params.model: { $lt: 3 } }".into(), "when.params.model.$lt: `$lt` compares numbers and `params.model` is a string"),
            ("{ params.max_tokens: x }".into(), "when.params.max_tokens: expected a number for `params.max_tokens`, found a string"),
            ("{ params.stream: 'yes' }".into(), "when.params.stream: expected a boolean for `params.stream`, found a string"),
            ("{ params.endpoint: 3 }".into(), "when.params.endpoint: expected a string for `params.endpoint`, found a number"),
            ("{ params.tools: { $ne: 1 } }".into(), "when.params.tools.$ne: expected a boolean"),
            ("{ budget.used_pct: { $in: [50, high] } }".into(), "when.budget.used_pct.$in[1]: expected a number for `budget.used_pct`, found a string"),
            ("{ key.user: { $nin: [true] } }".into(), "when.key.user.$nin[0]: expected a string"),
            ("{ params.vision: { $regex: t } }".into(), "when.params.vision.$regex: `$regex` matches strings and `params.vision` is a boolean"),
            ("{ metadata.t: { $regex: 3 } }".into(), "when.metadata.t.$regex: `$regex` takes a string, found a number"),
            ("{ metadata.t: { $regex: '(a' } }".into(), "when.metadata.t.$regex: not a valid regular expression: unclosed group"),
            (
                format!("{{ metadata.t: {{ $regex: '{long}' }} }}"),
                "when.metadata.t.$regex: the pattern is 1025 bytes; at most 1024",
            ),
            (
                "{ metadata.t: { $regex: '(a{1000}){1000}' } }".into(),
                "when.metadata.t.$regex: the pattern compiles past the size limit (256 KiB)",
            ),
            (
                "{ metadata.t: { $regex: '\\w{500}\\w{500}' } }".into(),
                "when.metadata.t.$regex: the pattern compiles past the size limit",
            ),
            ("{ 1: x }".into(), "when: condition keys are field names or `$and`/`$or`, found a number"),
            ("{ metadata.t: { 1: x } }".into(), "when.metadata.t: operators are strings"),
            ("{ metadata.t: !custom x }".into(), "when.metadata.t: expected a string, a number or a boolean, found a tagged value"),
        ];
        for (cond, want) in &table {
            let e = compile(cond).expect_err(cond);
            assert!(
                e.iter().any(|l| l.starts_with(want)),
                "{cond}: want {want}, got {e:?}"
            );
        }
    }

    #[test]
    fn every_error_of_one_condition_is_listed() {
        let e = compile(
            "{ $or: [ { foo.x: 1 }, { metadata.a: { $inn: 1, $gt: x } } ], params.stream: 3 }",
        )
        .expect_err("bad");
        assert_eq!(e.len(), 4, "{e:?}");
    }

    #[test]
    fn a_json_condition_compiles_too() {
        let c = compile(
            r#"{"$and": [{"params.tools": true}, {"metadata.team": {"$in": ["search", "ads"]}}]}"#,
        )
        .expect("valid");
        assert!(c.matches(&req(&[
            ("params.tools", B(true)),
            ("metadata.team", S("ads"))
        ])));
        assert!(!c.matches(&req(&[
            ("params.tools", B(true)),
            ("metadata.team", S("web"))
        ])));
    }
}
