//! Names callers send: the catalog namespace (models and aliases share one case-insensitive
//! namespace), `aliases` (a second name for one model), `chains` (ordered lists of models
//! named as `auto:<chain>`, in their own namespace) and `active_chain` (what `auto` means).

use std::collections::{BTreeMap, HashMap};

use crate::config::types::{AliasConfig, ChainConfig};
use crate::config::values::{check_catalog_name, check_chain_name};
use crate::config::ConfigError;

/// The model and alias names seen so far, lower-cased.
#[derive(Default)]
pub(super) struct Namespace {
    /// Every claimed name, with the key path that claimed it first.
    claimed: HashMap<String, String>,
    /// Model name → index into `Config::models`.
    models: HashMap<String, usize>,
    /// Alias name → index of the model it names.
    aliases: HashMap<String, usize>,
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

pub(super) fn validate_chains(
    file: &BTreeMap<String, Vec<String>>,
    names: &Namespace,
    errs: &mut Vec<ConfigError>,
) -> Vec<ChainConfig> {
    let mut chains: Vec<ChainConfig> = Vec::with_capacity(file.len());
    for (name, entries) in file {
        let path = format!("chains.{name}");
        check_chain_name(name, &path, errs);
        if chains.iter().any(|c| c.name.eq_ignore_ascii_case(name)) {
            errs.push(ConfigError::new(
                &path,
                "another chain has the same name (names are case-insensitive)",
            ));
        }
        let mut resolved = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            match names.resolve(entry) {
                Some(m) if resolved.contains(&m) => errs.push(ConfigError::new(
                    format!("{path}[{i}]"),
                    format!("{entry:?} is already in this chain"),
                )),
                Some(m) => resolved.push(m),
                None => errs.push(ConfigError::new(
                    format!("{path}[{i}]"),
                    format!("{entry:?} is not a model or alias"),
                )),
            }
        }
        chains.push(ChainConfig {
            name: name.clone(),
            models: resolved,
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
