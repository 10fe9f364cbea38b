//! Hot reload: a new config becomes a complete new routing snapshot, swapped in atomically, or
//! nothing changes.
//!
//! Every way in — `SIGHUP` and `POST /admin/reload` (re-read the file), `PUT /admin/config`
//! (a whole document) and the section PUTs (one key of the document changed, the rest kept) —
//! goes through [`Reloader`]: the new document is validated whole (every error with its key
//! path), a catalog is built from it, the health records of targets that still exist are
//! carried over by identity (new targets start fresh, removed ones are dropped), the routing
//! snapshot is built and stored with one `ArcSwap` store. Requests and streams in flight keep
//! the snapshot they loaded; new requests get the new one. A rejected config changes nothing
//! and is reported (the error list, a log line, `signalbox_config_reloads_total{result}`).
//! Writes from the admin API are written back to the config file first (a temp file in the
//! same directory, then a rename), so a restart keeps them; the file is rewritten from the
//! document, so comments are lost.
//!
//! The proxy listener's certificate (`listen.proxy_tls`) is re-read on every reload and served
//! from the next TLS handshake on. What a reload cannot change: the listeners themselves
//! (addresses, TLS on or off, `h2c`) and Pingora's own settings are fixed for the life of the
//! process (a change there is applied to the file and reported as needing a binary upgrade),
//! and so are the sticky-session table's TTL and degraded mode's thresholds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::catalog::{read_key_from_env_or_file, resolve_blocking, Catalog};
use crate::config::{self, Config, ConfigError, ConfigErrors, KeySource};
use crate::metrics::Metrics;
use crate::server_tls::CertStore;
use crate::snapshot::{Runtime, Snapshot};

/// The config serving traffic: the document as written (for the admin API and write-back) and
/// its checked form.
#[derive(Debug)]
pub struct Loaded {
    pub doc: serde_yaml::Value,
    pub config: Config,
}

/// Why a new config was not applied.
#[derive(Debug)]
pub enum ReloadError {
    /// The document is invalid: every problem with its key path.
    Invalid(ConfigErrors),
    /// The config file could not be read or written.
    Io(String),
    /// The document is valid but the snapshot could not be built (an unreadable CA file).
    Build(String),
    /// Another change is being applied.
    Busy,
}

impl ReloadError {
    /// One line for the log or an admin body, URLs redacted.
    pub fn summary(&self) -> String {
        let text = match self {
            ReloadError::Invalid(errs) => format!("invalid config: {errs}"),
            ReloadError::Io(e) | ReloadError::Build(e) => e.clone(),
            ReloadError::Busy => "another config change is being applied; retry".to_string(),
        };
        crate::secret::redact_urls(&text).into_owned()
    }
}

/// What an applied change did.
#[derive(Debug, Clone)]
pub struct Applied {
    pub generation: u64,
    /// Sections that changed but take effect only after a binary upgrade.
    pub needs_upgrade: Vec<&'static str>,
    /// Problems that do not stop the config (a key that cannot be read).
    pub warnings: Vec<String>,
}

/// The admin API's tokens, as digests (compared in constant time).
#[derive(Debug, Default, Clone)]
pub struct AdminTokens {
    write: Option<[u8; 32]>,
    read: Option<[u8; 32]>,
}

/// What a bearer token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    Write,
    Read,
    None,
}

impl AdminTokens {
    fn from_config(admin: &config::AdminConfig) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let mut read_token = |name: &Option<String>, which: &str| {
            let name = name.as_ref()?;
            match read_key_from_env_or_file(&KeySource::Env(name.clone())) {
                Ok(Some(token)) => Some(Sha256::digest(token.trim().as_bytes()).into()),
                Ok(None) | Err(_) => {
                    warnings.push(format!(
                        "admin.{which}: environment variable {name} is not set; that token grants nothing"
                    ));
                    None
                }
            }
        };
        let tokens = Self {
            write: read_token(&admin.token_env, "token_env"),
            read: read_token(&admin.read_token_env, "read_token_env"),
        };
        (tokens, warnings)
    }

    /// Whether any token is configured (then every admin read needs one too).
    pub fn configured(&self) -> bool {
        self.write.is_some() || self.read.is_some()
    }

    /// What `Authorization: Bearer <token>` grants. Both digests are always compared, in
    /// constant time.
    pub fn grant(&self, presented: Option<&[u8]>) -> Grant {
        let Some(token) = presented else {
            return Grant::None;
        };
        let digest: [u8; 32] = Sha256::digest(token).into();
        let matches =
            |want: &Option<[u8; 32]>| want.as_ref().is_some_and(|w| bool::from(w.ct_eq(&digest)));
        let (write, read) = (matches(&self.write), matches(&self.read));
        if write {
            Grant::Write
        } else if read {
            Grant::Read
        } else {
            Grant::None
        }
    }
}

/// Applies config changes; shared by the admin API and the `SIGHUP` service.
pub struct Reloader {
    path: PathBuf,
    router: Arc<Runtime>,
    metrics: Arc<Metrics>,
    current: ArcSwap<Loaded>,
    tokens: ArcSwap<AdminTokens>,
    /// The proxy listener's certificate, when it terminates TLS.
    proxy_tls: Option<Arc<CertStore>>,
    /// One change at a time (admin writes and `SIGHUP` can race).
    writing: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The `listen` section as far as the bound listeners are concerned: which files hold the
/// certificate does not matter (it is re-read and swapped), whether TLS is on does.
fn listener_shape(doc: &serde_yaml::Value) -> Option<serde_yaml::Value> {
    let mut listen = doc.get("listen")?.clone();
    if let Some(map) = listen.as_mapping_mut() {
        if let Some(tls) = map.get_mut("proxy_tls") {
            *tls = serde_yaml::Value::Bool(true);
        }
    }
    Some(listen)
}

/// Read a config file as a document and its checked form.
pub fn load(path: &Path) -> Result<Loaded, ReloadError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ReloadError::Io(format!("cannot read {}: {e}", path.display())))?;
    let config = config::parse(&text).map_err(ReloadError::Invalid)?;
    let doc = serde_yaml::from_str(&text)
        .map_err(|e| ReloadError::Io(format!("cannot read {}: {e}", path.display())))?;
    Ok(Loaded { doc, config })
}

impl Reloader {
    /// A reloader for the config at `path`, serving `loaded` now; `proxy_tls` is the store
    /// the proxy listener's handshakes read (a reload swaps the certificate in it).
    pub fn new(
        path: &Path,
        loaded: Loaded,
        router: Arc<Runtime>,
        metrics: Arc<Metrics>,
        proxy_tls: Option<Arc<CertStore>>,
    ) -> Self {
        let (tokens, warnings) = AdminTokens::from_config(&loaded.config.admin);
        for w in warnings {
            tracing::warn!("{w}");
        }
        Self {
            path: path.to_path_buf(),
            router,
            metrics,
            current: ArcSwap::from_pointee(loaded),
            tokens: ArcSwap::from_pointee(tokens),
            proxy_tls,
            writing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The config serving traffic.
    pub fn current(&self) -> Arc<Loaded> {
        self.current.load_full()
    }

    pub fn tokens(&self) -> Arc<AdminTokens> {
        self.tokens.load_full()
    }

    pub fn router(&self) -> &Arc<Runtime> {
        &self.router
    }

    /// Re-read the config file and apply it (`SIGHUP`, `POST /admin/reload`). Blocking: it
    /// resolves provider hosts.
    pub fn reload_file(&self) -> Result<Applied, ReloadError> {
        let _turn = self.turn()?;
        let outcome = load(&self.path).and_then(|loaded| self.apply(loaded));
        self.report(&outcome, "file");
        outcome
    }

    /// Replace the whole document (`PUT /admin/config`): validated, written back, applied.
    pub fn replace(&self, doc: serde_yaml::Value) -> Result<Applied, ReloadError> {
        self.edit(|d| {
            *d = doc;
            Ok(())
        })
    }

    /// Change the document (`edit` returns the error of a change it cannot make), validate the
    /// result whole, write it back, apply it. Nothing changes when any step fails.
    pub fn edit(
        &self,
        edit: impl FnOnce(&mut serde_yaml::Value) -> Result<(), ConfigError>,
    ) -> Result<Applied, ReloadError> {
        let _turn = self.turn()?;
        let outcome = self.edit_locked(edit);
        self.report(&outcome, "admin");
        outcome
    }

    fn edit_locked(
        &self,
        edit: impl FnOnce(&mut serde_yaml::Value) -> Result<(), ConfigError>,
    ) -> Result<Applied, ReloadError> {
        let mut doc = self.current.load().doc.clone();
        edit(&mut doc).map_err(|e| ReloadError::Invalid(ConfigErrors(vec![e])))?;
        let text = self.render(&doc)?;
        let config = config::parse(&text).map_err(ReloadError::Invalid)?;
        // Build before writing: a document that cannot serve is not written either.
        let built = self.build(&config)?;
        self.write_back(&text)?;
        Ok(self.install(Loaded { doc, config }, built))
    }

    /// A snapshot for a draft document (`POST /admin/explain` with `config`): validated whole
    /// and built as a reload would build it, live health and spend carried over, but never
    /// installed or written. Its metric handles are a throwaway registry's, so a draft's names
    /// never reach `/metrics`. Blocking: it resolves provider hosts.
    pub fn draft(&self, doc: &serde_yaml::Value) -> Result<Snapshot, ReloadError> {
        let text = serde_yaml::to_string(doc).map_err(|e| ReloadError::Io(e.to_string()))?;
        let config = config::parse(&text).map_err(ReloadError::Invalid)?;
        let metrics = Metrics::new().map_err(|e| ReloadError::Build(e.to_string()))?;
        Ok(self.build_with(&config, &metrics)?.tables)
    }

    /// Take the writer's turn, or say another change is under way.
    fn turn(&self) -> Result<Turn<'_>, ReloadError> {
        use std::sync::atomic::Ordering;
        self.writing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| ReloadError::Busy)?;
        Ok(Turn(&self.writing))
    }

    fn apply(&self, loaded: Loaded) -> Result<Applied, ReloadError> {
        let built = self.build(&loaded.config)?;
        Ok(self.install(loaded, built))
    }

    /// The document as the file's format (JSON for a `.json` file, YAML otherwise).
    fn render(&self, doc: &serde_yaml::Value) -> Result<String, ReloadError> {
        let json = self.path.extension().is_some_and(|e| e == "json");
        if json {
            serde_json::to_string_pretty(doc).map_err(|e| ReloadError::Io(e.to_string()))
        } else {
            serde_yaml::to_string(doc).map_err(|e| ReloadError::Io(e.to_string()))
        }
    }

    /// Replace the config file atomically: a temp file beside it, then a rename.
    fn write_back(&self, text: &str) -> Result<(), ReloadError> {
        use std::io::Write;
        let dir = self.path.parent().unwrap_or_else(|| Path::new("."));
        let name = self
            .path
            .file_name()
            .map_or_else(|| "config".into(), |n| n.to_string_lossy().into_owned());
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let io = |e: std::io::Error| {
            ReloadError::Io(format!("cannot write {}: {e}", self.path.display()))
        };
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)
    }

    /// A new snapshot for `config`, health carried over from the one serving now.
    fn build(&self, config: &Config) -> Result<Built, ReloadError> {
        self.build_with(config, &self.metrics)
    }

    fn build_with(&self, config: &Config, metrics: &Metrics) -> Result<Built, ReloadError> {
        let (catalog, warnings) =
            Catalog::build(config, &resolve_blocking, &read_key_from_env_or_file)
                .map_err(|e| ReloadError::Build(e.to_string()))?;
        let old = self.router.snapshot.load_full();
        let mut catalog = catalog;
        catalog.carry_spend(&old.catalog);
        let health = old.health.carry_over(&old.catalog, &catalog, config.health);
        let catalog = Arc::new(catalog);
        let (tables, key_warnings) = Snapshot::build(
            config,
            catalog,
            Arc::new(health),
            metrics,
            old.generation + 1,
        )
        .with_accounts(config, Some(&old));
        let (tokens, token_warnings) = AdminTokens::from_config(&config.admin);
        let mut all: Vec<String> = warnings.into_iter().map(|w| w.0).collect();
        all.extend(token_warnings);
        all.extend(key_warnings);
        Ok(Built {
            tables,
            tokens,
            warnings: all,
        })
    }

    /// Swap the new snapshot in.
    fn install(&self, loaded: Loaded, built: Built) -> Applied {
        let previous = self.current.load();
        let mut needs_upgrade = Vec::new();
        if listener_shape(&previous.doc) != listener_shape(&loaded.doc) {
            needs_upgrade.push("listen");
        }
        if previous.doc.get("pingora") != loaded.doc.get("pingora") {
            needs_upgrade.push("pingora");
        }
        // Opened at start: the ledger's store and the shared state's backend.
        for section in ["ledger", "state"] {
            if previous.doc.get(section) != loaded.doc.get(section) {
                needs_upgrade.push(section);
            }
        }
        let generation = built.tables.generation;
        self.router.snapshot.store(Arc::new(built.tables));
        self.router.rerank();
        self.tokens.store(Arc::new(built.tokens));
        // The certificate the new config validated (files read then): the next handshake
        // presents it; open connections keep theirs.
        if let (Some(store), Some(tls)) = (&self.proxy_tls, &loaded.config.listen.proxy_tls) {
            store.swap(&tls.cert);
        }
        self.current.store(Arc::new(loaded));
        self.metrics
            .config_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        Applied {
            generation,
            needs_upgrade,
            warnings: built.warnings,
        }
    }

    fn report(&self, outcome: &Result<Applied, ReloadError>, source: &'static str) {
        match outcome {
            Ok(applied) => {
                self.metrics.config_reloads.with_label_values(&["ok"]).inc();
                for w in &applied.warnings {
                    tracing::warn!("{w}");
                }
                tracing::info!(
                    source,
                    generation = applied.generation,
                    needs_upgrade = ?applied.needs_upgrade,
                    "config applied"
                );
            }
            Err(ReloadError::Busy) => {}
            Err(e) => {
                self.metrics
                    .config_reloads
                    .with_label_values(&["rejected"])
                    .inc();
                tracing::warn!(source, error = %e.summary(), "config refused; the running config keeps serving");
            }
        }
    }
}

/// A snapshot built and ready to swap in.
struct Built {
    tables: Snapshot,
    tokens: AdminTokens,
    warnings: Vec<String>,
}

/// The writer's turn, released on drop.
struct Turn<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_what_they_are_for() {
        let tokens = AdminTokens {
            write: Some(Sha256::digest(b"w-token").into()),
            read: Some(Sha256::digest(b"r-token").into()),
        };
        assert_eq!(tokens.grant(Some(b"w-token")), Grant::Write);
        assert_eq!(tokens.grant(Some(b"r-token")), Grant::Read);
        assert_eq!(tokens.grant(Some(b"w-tokenx")), Grant::None);
        assert_eq!(tokens.grant(None), Grant::None);
        assert!(tokens.configured());
        assert!(!AdminTokens::default().configured());
    }
}
