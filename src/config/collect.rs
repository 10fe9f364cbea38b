//! Every error of a file that does not parse, not only the first.
//!
//! serde stops at the first problem: one misspelt key would hide a bad duration two sections
//! down, and every validation error behind both. When the strict parse fails, the document is
//! read as a plain YAML tree and the failure narrowed down: a node whose subtree, alone in an
//! otherwise empty document, fails to parse is split into its children (each alone again); an
//! error is kept at the deepest node that still reproduces it under its own path, so siblings'
//! problems are found independently. Errors a lone subtree causes only because its siblings
//! are gone (a `missing field` of its parent) name the parent's path and are not kept there.
//!
//! Then the nodes found at fault are cut out of the tree; if what is left parses, it is
//! validated too, and its errors outside the cut nodes are added. A cut that leaves a required
//! key missing does not parse: then only the parse errors are reported.
//!
//! Approximations: the search reads the tree through `serde_yaml::Value`, which deserialises as
//! the text does for signalbox's schema; if the tree's first error does not match the text's,
//! only the text's is reported. Each node is parsed once per level it sits under: a few
//! milliseconds for the example config, and only on a file that is already refused.

use serde_yaml::{Mapping, Value};

use super::schema::ConfigFile;
use super::{strip_yaml_path, validate, ConfigError, ConfigErrors};

/// One step from the root of the tree to a node.
#[derive(Debug, Clone)]
enum Step {
    Key(Value),
    Index(usize),
}

/// The parse error of a document, with its path (`""` for the root) and message.
fn parse_error(doc: Value) -> Option<ConfigError> {
    let e = serde_path_to_error::deserialize::<_, ConfigFile>(doc).err()?;
    Some(error_of(&e))
}

pub(super) fn error_of<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> ConfigError {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = strip_yaml_path(&path, &e.inner().to_string());
    ConfigError::new(path, message)
}

/// The document holding only the node at `steps`, with `node` there (a sequence element
/// stands at index 0).
fn lone(steps: &[Step], node: Value) -> Value {
    steps.iter().rev().fold(node, |inner, step| match step {
        Step::Key(k) => {
            let mut m = Mapping::new();
            m.insert(k.clone(), inner);
            Value::Mapping(m)
        }
        Step::Index(_) => Value::Sequence(vec![inner]),
    })
}

/// A path as serde_path_to_error writes it: `a.b[2].c`. `lone` documents put every element
/// at index 0, so `as_lone` writes each index as 0.
fn display(steps: &[Step], as_lone: bool) -> Option<String> {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k.as_str()?);
            }
            Step::Index(i) => {
                out.push('[');
                out.push_str(&if as_lone { 0 } else { *i }.to_string());
                out.push(']');
            }
        }
    }
    Some(out)
}

/// Whether `path` is `at` or below it.
fn under(path: &str, at: &str) -> bool {
    at.is_empty()
        || path
            .strip_prefix(at)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// The errors of the subtree `node` at `steps`, each with the steps of the node it was found
/// at. `err` is the lone document's error (already known to fail).
fn narrow(
    steps: &mut Vec<Step>,
    node: &Value,
    err: ConfigError,
    out: &mut Vec<(Vec<Step>, ConfigError)>,
) {
    let (Some(lone_path), Some(real_path)) = (display(steps, true), display(steps, false)) else {
        return;
    };
    let before = out.len();
    let children: Vec<(Step, &Value)> = match node {
        Value::Mapping(m) => m.iter().map(|(k, v)| (Step::Key(k.clone()), v)).collect(),
        Value::Sequence(s) => s
            .iter()
            .enumerate()
            .map(|(i, v)| (Step::Index(i), v))
            .collect(),
        _ => Vec::new(),
    };
    for (step, child) in children {
        steps.push(step);
        if let Some(child_lone) = display(steps, true) {
            if let Some(e) = parse_error(lone(steps, child.clone())) {
                if under(&e.path, &child_lone) {
                    narrow(steps, child, e, out);
                }
            }
        }
        steps.pop();
    }
    if out.len() == before && under(&err.path, &lone_path) {
        // No child alone reproduces an error of its own: the problem is this node's.
        let path = format!("{real_path}{}", &err.path[lone_path.len()..]);
        out.push((steps.clone(), ConfigError::new(path, err.message)));
    }
}

/// Remove the node at `steps` from `tree` (nothing if it is gone already).
fn cut(tree: &mut Value, steps: &[Step]) {
    let Some((last, parents)) = steps.split_last() else {
        return;
    };
    let mut node = tree;
    for step in parents {
        let next = match (step, node) {
            (Step::Key(k), Value::Mapping(m)) => m.get_mut(k),
            (Step::Index(i), Value::Sequence(s)) => s.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else { return };
        node = next;
    }
    match (last, node) {
        (Step::Key(k), Value::Mapping(m)) => {
            m.remove(k);
        }
        (Step::Index(i), Value::Sequence(s)) if *i < s.len() => {
            s.remove(*i);
        }
        _ => {}
    }
}

/// Every error of `text`, whose strict parse failed with `first`.
pub(super) fn every_error(text: &str, first: ConfigError) -> ConfigErrors {
    let single = || ConfigErrors(vec![first.clone()]);
    let Ok(tree) = serde_yaml::from_str::<Value>(text) else {
        return single();
    };
    match parse_error(tree.clone()) {
        Some(e) if e.path == first.path => {}
        _ => return single(),
    }
    let mut found = Vec::new();
    let root = parse_error(tree.clone()).unwrap_or_else(|| first.clone());
    narrow(&mut Vec::new(), &tree, root, &mut found);
    if found.is_empty() {
        return single();
    }
    // Cut the nodes at fault, deepest and last first (indices of earlier siblings stay put).
    let mut pruned = tree;
    let mut at_fault: Vec<Vec<Step>> = found.iter().map(|(s, _)| s.clone()).collect();
    at_fault.sort_by_key(|s| std::cmp::Reverse(order_key(s)));
    for steps in &at_fault {
        cut(&mut pruned, steps);
    }
    let cut_paths: Vec<String> = at_fault.iter().filter_map(|s| display(s, false)).collect();
    let mut errors: Vec<ConfigError> = found.into_iter().map(|(_, e)| e).collect();
    match serde_path_to_error::deserialize::<_, ConfigFile>(pruned) {
        Ok(file) => {
            if let Err(more) = validate::validate(file) {
                errors.extend(
                    more.0
                        .into_iter()
                        .filter(|e| !cut_paths.iter().any(|c| under(&e.path, c))),
                );
            }
        }
        // Still no parse: a key the file lacks (a required section), unless the cut made it
        // so (the key cut was the one at fault).
        Err(e) => {
            let e = error_of(&e);
            let missing = e
                .message
                .strip_prefix("missing field `")
                .and_then(|m| m.split_once('`'))
                .map(|(key, _)| {
                    if e.path.is_empty() {
                        key.to_string()
                    } else {
                        format!("{}.{key}", e.path)
                    }
                });
            let caused_by_cut = missing.is_some_and(|m| cut_paths.contains(&m))
                || cut_paths.iter().any(|c| under(&e.path, c));
            if !caused_by_cut {
                errors.push(e);
            }
        }
    }
    ConfigErrors(errors)
}

/// Sort key putting later sequence elements after earlier ones at every depth.
fn order_key(steps: &[Step]) -> Vec<usize> {
    steps
        .iter()
        .map(|s| match s {
            Step::Index(i) => *i,
            Step::Key(_) => 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::errors;

    const MINIMAL: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1" }
  b: { kind: openai, base_url: "http://127.0.0.1:9002/v1" }
models:
  m: { deployments: [{ provider: a, model: up-m }, { provider: b, model: up-n }] }
"#;

    #[test]
    fn one_bad_section_does_not_hide_another() {
        let text = MINIMAL
            .replace(
                "kind: openai, base_url: \"http://127.0.0.1:9001",
                "kind: openai, colour: red, base_url: \"http://127.0.0.1:9001",
            )
            .replace("model: up-n }", "model: up-n, wieght: 2 }")
            + "failover: { deadline: soon }\nlimits: { max_request_bodee: 1 }\n";
        let e = errors(&text);
        for needle in [
            "providers.a.colour: unknown field `colour`",
            "models.m.deployments[1].wieght: unknown field `wieght`",
            "failover.deadline:",
            "limits.max_request_bodee: unknown field",
        ] {
            assert!(e.iter().any(|l| l.starts_with(needle)), "{needle} in {e:?}");
        }
        assert_eq!(e.len(), 4, "nothing else, no parent repeated: {e:?}");
    }

    #[test]
    fn validation_runs_on_what_parses_once_the_bad_keys_are_cut() {
        // A typo and a reference to a model that does not exist: both reported.
        let text = format!("{MINIMAL}aliases: {{ fast: ghost }}\nhealth: {{ cooldwn: 1s }}\n");
        let e = errors(&text);
        assert!(
            e.iter()
                .any(|l| l.starts_with("health.cooldwn: unknown field")),
            "{e:?}"
        );
        assert!(e.iter().any(|l| l.starts_with("aliases.fast:")), "{e:?}");
    }

    #[test]
    fn an_unknown_top_level_key_and_a_missing_section() {
        let e = errors("providers: {}\nmodlels: {}\n");
        assert!(
            e.iter().any(|l| l.starts_with("modlels: unknown field")),
            "{e:?}"
        );
        // `models` is required: named too, at the root, beside the typo.
        let e = errors("providers:\n  a: { kind: openai, base_url: \"http://x/v1\", colur: 1 }\n");
        assert!(
            e.iter().any(|l| l.starts_with("providers.a.colur:")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|l| l.starts_with("missing field `models`")),
            "{e:?}"
        );
        // A bad value of a required key: named once, not again as missing once cut.
        let e = errors(&MINIMAL.replace(
            "kind: openai, base_url: \"http://127.0.0.1:9002",
            "kind: gopher, base_url: \"http://127.0.0.1:9002",
        ));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].starts_with("providers.b.kind:"), "{e:?}");
    }

    #[test]
    fn a_yaml_syntax_error_is_one_error() {
        let e = errors("providers: [\n");
        assert_eq!(e.len(), 1, "{e:?}");
    }
}
