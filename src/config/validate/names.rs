//! Names callers send: the catalog namespace (models, aliases and policies share one
//! case-insensitive namespace, which a policy name may not share with a chain either),
//! `aliases` (a second name for one model), `chains` (ordered lists of models named as
//! `auto:<chain>`) and `active_chain` (what `auto` means). Policies themselves are checked in
//! `policies`, which claims their names here.

use std::collections::{BTreeMap, HashMap};

use crate::config::schema::{ChainEntrySection, ChainSection, ListOr};
use crate::config::types::{AliasConfig, ChainConfig, GlobAlias, ModelConfig};
use crate::config::values::{check_catalog_name, check_chain_name, check_policy_name};
use crate::config::ConfigError;

/// The model, alias, chain and policy names seen so far, lower-cased.
#[derive(Default)]
pub(super) struct Namespace {
    /// Every claimed model, alias and policy name, with the key path that claimed it first.
    claimed: HashMap<String, String>,
    /// Model name → index into `Config::models`.
    models: HashMap<String, usize>,
    /// Alias name → index of the model it names.
    aliases: HashMap<String, usize>,
    /// Chain name → the key path that declared it (chains may share a model's name, not a
    /// policy's).
    chains: HashMap<String, String>,
    /// Policy name → index into `Config::policies`.
    policies: HashMap<String, usize>,
}

/// What a name a policy refers to means.
pub(super) enum Named {
    /// A model, or an alias resolved to its model: an index into `Config::models`.
    Model(usize),
    /// A policy.
    Policy,
    Nothing,
}

impl Namespace {
    /// Record model `index` under `name` (checking the name and that it is not taken).
    pub(super) fn add_model(
        &mut self,
        name: &str,
        index: usize,
        path: &str,
        errs: &mut Vec<ConfigError>,
    ) {
        check_catalog_name(name, path, errs);
        self.claim(name, path, errs);
        self.models.insert(name.to_ascii_lowercase(), index);
    }

    fn claim(&mut self, name: &str, path: &str, errs: &mut Vec<ConfigError>) {
        if let Some(prev) = self
            .claimed
            .insert(name.to_ascii_lowercase(), path.to_string())
        {
            errs.push(ConfigError::new(
                path,
                format!("the name is already used by {prev} (names are case-insensitive)"),
            ));
        }
    }

    /// Record policy `index` under `name`: the policy name rules, and no model, alias, chain
    /// or other policy of the same name.
    pub(super) fn add_policy(
        &mut self,
        name: &str,
        index: usize,
        path: &str,
        errs: &mut Vec<ConfigError>,
    ) {
        let before = errs.len();
        check_policy_name(name, path, errs);
        let key = name.to_ascii_lowercase();
        if let Some(chain) = self.chains.get(&key) {
            errs.push(ConfigError::new(
                path,
                format!("the name is already used by {chain} (names are case-insensitive)"),
            ));
        }
        self.claim(name, path, errs);
        // A refused name means nothing: whatever else it was is what references find.
        if errs.len() == before {
            self.policies.insert(key, index);
        }
    }

    /// What `name` means where a policy names a model.
    pub(super) fn lookup(&self, name: &str) -> Named {
        if let Some(m) = self.resolve(name) {
            Named::Model(m)
        } else if self.policies.contains_key(&name.to_ascii_lowercase()) {
            Named::Policy
        } else {
            Named::Nothing
        }
    }

    /// The index of the policy `name` names (case-insensitive).
    pub(super) fn policy(&self, name: &str) -> Option<usize> {
        self.policies.get(&name.to_ascii_lowercase()).copied()
    }

    /// Whether `name` is a model or an alias.
    pub(super) fn is_model(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }

    /// The model a model or alias name means.
    fn resolve(&self, name: &str) -> Option<usize> {
        let key = name.to_ascii_lowercase();
        self.models
            .get(&key)
            .or_else(|| self.aliases.get(&key))
            .copied()
    }
}

pub(super) fn validate_aliases(
    file: &BTreeMap<String, String>,
    names: &mut Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<AliasConfig> {
    let mut aliases = Vec::with_capacity(file.len());
    for (name, target) in file {
        if is_glob(name) {
            // Checked once every name is known (`validate_glob_aliases`).
            continue;
        }
        let path = format!("aliases.{name}");
        check_catalog_name(name, &path, errs);
        names.claim(name, &path, errs);
        match names.models.get(&target.to_ascii_lowercase()) {
            Some(&model) => aliases.push(AliasConfig {
                name: name.clone(),
                model,
            }),
            None => errs.push(ConfigError::new(
                &path,
                format!(
                    "alias target {target:?} is not a model (aliases name models, not other aliases)"
                ),
            )),
        }
    }
    // Registered only once all are read: an alias never names another alias.
    for a in &aliases {
        names.aliases.insert(a.name.to_ascii_lowercase(), a.model);
    }
    aliases
}

/// A glob alias's name: `claude-opus-*`, `gpt-5?`.
fn is_glob(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// The glob aliases (`claude-opus-*: smart`, `gpt-5*: auto:fast`): each names any exact name
/// a caller may send — a model, an alias, `auto`, `auto:<chain>`, `auto:<axis>`, a policy —
/// and no two may match one name (which would win would depend on the order they are read).
/// Exact names always win over globs. Run once every name is known.
pub(super) fn validate_glob_aliases(
    file: &BTreeMap<String, String>,
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<GlobAlias> {
    let mut globs: Vec<GlobAlias> = Vec::new();
    for (name, target) in file.iter().filter(|(n, _)| is_glob(n)) {
        let path = format!("aliases.{name}");
        let pattern = name.to_ascii_lowercase();
        let plain = pattern
            .bytes()
            .all(|b| b == b'*' || b == b'?' || (b.is_ascii_graphic() && b != b'"'));
        if !plain || pattern.bytes().all(|b| b == b'*' || b == b'?') {
            errs.push(ConfigError::new(
                &path,
                "a glob alias is printable characters with `*` or `?` in them, and not only those",
            ));
            continue;
        }
        let t = target.to_ascii_lowercase();
        let known = names.models.contains_key(&t)
            || names.aliases.contains_key(&t)
            || names.policies.contains_key(&t)
            || t == "auto"
            || t.strip_prefix("auto:").is_some_and(|rest| {
                names.chains.contains_key(rest)
                    || crate::config::AXIS_NAMES
                        .iter()
                        .any(|a| a.eq_ignore_ascii_case(rest))
            });
        if is_glob(&t) || !known {
            errs.push(ConfigError::new(
                &path,
                format!(
                    "glob alias target {target:?} is not a name callers can send (a model, an alias, `auto`, `auto:<chain>`, `auto:<axis>` or a policy)"
                ),
            ));
            continue;
        }
        if let Some(other) = globs.iter().find(|g| globs_overlap(&g.pattern, &pattern)) {
            errs.push(ConfigError::new(
                &path,
                format!(
                    "overlaps the glob alias {:?}: a name could match both (make one of them narrower)",
                    other.pattern
                ),
            ));
            continue;
        }
        globs.push(GlobAlias { pattern, target: t });
    }
    globs
}

/// Whether some name matches both globs (`*` any run, `?` one character).
fn globs_overlap(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // meet[i][j]: the suffixes a[i..] and b[j..] share a match.
    let mut meet = vec![vec![false; b.len() + 1]; a.len() + 1];
    meet[a.len()][b.len()] = true;
    for i in (0..=a.len()).rev() {
        for j in (0..=b.len()).rev() {
            if i == a.len() && j == b.len() {
                continue;
            }
            let star_a = a.get(i) == Some(&b'*');
            let star_b = b.get(j) == Some(&b'*');
            meet[i][j] = if star_a {
                meet[i + 1][j] || (j < b.len() && meet[i][j + 1])
            } else if star_b {
                meet[i][j + 1] || (i < a.len() && meet[i + 1][j])
            } else if i < a.len() && j < b.len() {
                let one = a[i] == b'?' || b[j] == b'?' || a[i] == b[j];
                one && meet[i + 1][j + 1]
            } else {
                false
            };
        }
    }
    meet[0][0]
}

pub(super) fn validate_chains(
    file: &BTreeMap<String, ListOr<ChainEntrySection, ChainSection>>,
    models: &[ModelConfig],
    names: &mut Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<ChainConfig> {
    let mut chains: Vec<ChainConfig> = Vec::with_capacity(file.len());
    for (name, form) in file {
        let (entries, backfill, long, path) = match form {
            ListOr::List(list) => (&list[..], false, false, format!("chains.{name}")),
            ListOr::Long(c) => (
                &c.models[..],
                c.backfill,
                true,
                format!("chains.{name}.models"),
            ),
        };
        let chain_path = format!("chains.{name}");
        check_chain_name(name, &chain_path, errs);
        check_chain_name(name, &path, errs);
        if chains.iter().any(|c| c.name.eq_ignore_ascii_case(name)) {
            errs.push(ConfigError::new(
                &chain_path,
                "another chain has the same name (names are case-insensitive)",
            ));
        } else {
            names
                .chains
                .insert(name.to_ascii_lowercase(), chain_path.clone());
        }
        let mut resolved: Vec<(usize, bool)> = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let model = &entry.model;
            match names.resolve(model) {
                Some(m) if resolved.iter().any(|(r, _)| *r == m) => errs.push(ConfigError::new(
                    format!("{path}[{i}]"),
                    format!("{model:?} is already in this chain"),
                )),
                Some(m) => resolved.push((m, entry.enabled)),
                None => errs.push(ConfigError::new(
                    format!("{path}[{i}]"),
                    format!("{model:?} is not a model or alias"),
                )),
            }
        }
        let mut tried: Vec<usize> = resolved
            .iter()
            .filter(|(_, on)| *on)
            .map(|(m, _)| *m)
            .collect();
        if backfill {
            // Catalog order; each backfilled model keeps its own switch (the routes leave out
            // a model switched off).
            tried.extend((0..models.len()).filter(|m| !resolved.iter().any(|(r, _)| r == m)));
        }
        chains.push(ChainConfig {
            name: name.clone(),
            models: tried,
            entries: resolved,
            backfill,
            long,
        });
    }
    chains
}

/// The index of the chain `active_chain` names.
pub(super) fn validate_active_chain(
    name: Option<&str>,
    chains: &[ChainConfig],
    errs: &mut Vec<ConfigError>,
) -> Option<usize> {
    let name = name?;
    let found = chains
        .iter()
        .position(|c| c.name.eq_ignore_ascii_case(name));
    if found.is_none() {
        errs.push(ConfigError::new(
            "active_chain",
            format!("{name:?} is not a chain"),
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::globs_overlap;
    use crate::config::parse;

    const BASE: &str = "providers: { p: { kind: openai, base_url: \"http://127.0.0.1:1/v1\" } }\nmodels: { m: { deployments: [ { provider: p, model: m } ] }, n: { deployments: [ { provider: p, model: n } ] } }\nchains: { main: [m] }\n";

    #[test]
    fn two_globs_overlap_when_some_name_matches_both() {
        for (a, b) in [
            ("claude-*", "claude-opus-*"),
            ("*-4", "gpt-*"),
            ("gpt-5?", "gpt-5*"),
            ("a*b", "*"),
            ("x?z", "xy*"),
        ] {
            assert!(globs_overlap(a, b) && globs_overlap(b, a), "{a} {b}");
        }
        for (a, b) in [
            ("claude-opus-*", "claude-sonnet-*"),
            ("gpt-5?", "gpt-5??"),
            ("a*", "b*"),
            ("*a", "*b"),
        ] {
            assert!(!globs_overlap(a, b) && !globs_overlap(b, a), "{a} {b}");
        }
    }

    #[test]
    fn glob_aliases_name_any_exact_name_and_never_overlap() {
        let c = parse(&format!(
            "{BASE}aliases: {{ one: m, \"Claude-Opus-*\": n, \"gpt-5*\": \"auto:main\", \"o?-mini\": auto, \"x-*\": one }}\n"
        ))
        .expect("valid");
        let pats: Vec<(&str, &str)> = c
            .glob_aliases
            .iter()
            .map(|g| (g.pattern.as_str(), g.target.as_str()))
            .collect();
        assert!(pats.contains(&("claude-opus-*", "n")), "{pats:?}");
        assert!(pats.contains(&("gpt-5*", "auto:main")), "{pats:?}");
        assert_eq!(c.aliases.len(), 1, "the exact alias stays exact");
        let e = parse(&format!(
            "{BASE}aliases: {{ \"claude-*\": m, \"claude-opus-*\": n }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("aliases.claude-opus-*") && e.contains("overlaps"),
            "{e}"
        );
        let e = parse(&format!(
            "{BASE}aliases: {{ \"gpt-*\": nope, \"o*\": \"auto:nochain\", \"*\": m }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("aliases.gpt-*"), "{e}");
        assert!(e.contains("aliases.o*"), "{e}");
        assert!(e.contains("aliases.*"), "{e}");
    }
}
