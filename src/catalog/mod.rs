//! The catalog: providers, credentials, models and deployments as the request path uses them.
//!
//! Built once from a validated [`Config`] and then immutable (a reload builds a new one).
//! Everything an attempt needs is prepared here, so the request path clones reference-counted
//! values instead of formatting strings: the `Host` header, the upstream URI, the
//! `Authorization` value, the JSON literal of the upstream model name for the body rewrite,
//! the routing header values. Entities are addressed by dense indices ([`ProviderIdx`],
//! [`DeploymentIdx`], [`ModelIdx`]) so per-request state stays small and copyable.
//!
//! Indices are positions in *this* catalog. What must survive a rebuild (health records,
//! sticky sessions, prefix affinity) is keyed by identity instead: a provider by its id, a
//! credential by its provider's id and its own, a deployment by (model name, provider id,
//! upstream model) — see [`Catalog::deployment_key`] and [`Deployment::key_hash`].
//!
//! Addresses are the one mutable part: DNS answers change, so each provider holds an
//! [`AddrCell`] that the background resolver (`dns`) swaps and the request path reads without
//! a lock. A provider whose host has not resolved yet is skipped without a call.
//!
//! [`surface`]: the endpoints (callers' and providers' alike), their dialects, and which
//! provider kinds serve them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Uri};
use pingora_core::protocols::tls::CaType;
use pingora_core::protocols::ALPN;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_core::utils::tls::{parse_x509, WrappedX509};

use crate::config::{
    BaseUrl, BudgetConfig, Capabilities, Config, KeySource, Price, ProviderKind, Scheme, Strategy,
};
use crate::limits::budget::Spend;
use crate::limits::window::Window;
use crate::secret::Secret;

pub mod surface;

use surface::Surface;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderIdx(pub u32);
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelIdx(pub u32);
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeploymentIdx(pub u32);

impl ProviderIdx {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}
impl ModelIdx {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}
impl DeploymentIdx {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

fn idx32(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// A problem found while building the catalog that does not stop the gateway (a missing
/// key makes its credential unusable; the rest keeps serving).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogWarning(pub String);

/// A fatal problem while building the catalog (an unreadable CA file).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CatalogError(pub String);

/// The resolved socket addresses of a provider's host, swapped by the resolver.
#[derive(Debug, Default)]
pub struct AddrCell {
    addrs: ArcSwap<Vec<SocketAddr>>,
    next: AtomicUsize,
}

impl AddrCell {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        Self {
            addrs: ArcSwap::from_pointee(addrs),
            next: AtomicUsize::new(0),
        }
    }

    /// The address for the next connection: rotates over the answer set.
    pub fn pick(&self) -> Option<SocketAddr> {
        let addrs = self.addrs.load();
        if addrs.is_empty() {
            return None;
        }
        addrs.get(self.turn(addrs.len())).copied()
    }

    /// The next position of the rotation over `len` addresses.
    fn turn(&self, len: usize) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % len
    }

    pub fn store(&self, addrs: Vec<SocketAddr>) {
        self.addrs.store(Arc::new(addrs));
    }

    pub fn snapshot(&self) -> Arc<Vec<SocketAddr>> {
        self.addrs.load_full()
    }

    /// Whether the host has no address yet (a guard load: no reference-count traffic).
    pub fn is_empty(&self) -> bool {
        self.addrs.load().is_empty()
    }
}

/// One API key of a provider (or none, for keyless endpoints).
#[derive(Debug, Clone)]
pub struct Credential {
    pub id: Arc<str>,
    /// `None` for a keyless endpoint.
    pub auth: Option<Secret>,
    /// False when the key was configured but could not be read: the credential is skipped.
    pub usable: bool,
}

/// An upstream API endpoint family and how to reach it.
#[derive(Debug)]
pub struct Provider {
    pub idx: ProviderIdx,
    pub id: Arc<str>,
    pub id_header: HeaderValue,
    pub kind: ProviderKind,
    pub base_url: BaseUrl,
    pub tls: bool,
    /// SNI and certificate name: the URL's host.
    pub sni: String,
    pub host_header: HeaderValue,
    /// The upstream path of each [`Surface`] (by [`Surface::index`]), under the base URL.
    uris: Vec<Uri>,
    pub models_uri: Uri,
    pub addrs: Arc<AddrCell>,
    /// A peer per address of `addrs`, in the same order, built when the addresses are stored
    /// ([`Provider::store_addrs`]): an attempt shares one instead of building its own (an SNI
    /// string and Pingora's options, a box, and their drop: ~600 instructions per request).
    peers: ArcSwap<Vec<Arc<HttpPeer>>>,
    /// Whether the host is a name the resolver must refresh (not an IP literal).
    pub needs_dns: bool,
    pub ca: Option<Arc<CaType>>,
    pub connect_timeout: Duration,
    pub ttfb_timeout: Duration,
    /// `headers`: set on every request to this provider.
    pub headers: Vec<(http::HeaderName, HeaderValue)>,
    pub credentials: Vec<Credential>,
    /// Round-robin start for credential choice, so load spreads across keys (and ties are
    /// broken under `least_remaining_quota`).
    pub credential_cursor: AtomicUsize,
    /// `credential_choice`: how a request picks among the usable credentials.
    pub credential_choice: crate::config::CredentialChoice,
    pub enabled: bool,
    /// `budgets.providers.<id>`, and what the provider spent (shared with the catalog it was
    /// rebuilt from, by id).
    pub budget: Option<BudgetConfig>,
    pub spend: Arc<Spend>,
}

/// How long an idle upstream connection stays pooled.
pub const UPSTREAM_IDLE: Duration = Duration::from_secs(60);

impl Provider {
    /// The request path for an upstream endpoint.
    pub fn uri(&self, endpoint: Surface) -> &Uri {
        &self.uris[endpoint.index()]
    }

    pub fn has_usable_credential(&self) -> bool {
        self.credentials.iter().any(|c| c.usable)
    }

    /// The `HttpPeer` for this provider on its next resolved address (rotating over them):
    /// TLS and SNI from the base URL, the provider's CA, connect and read deadlines. `None`
    /// while the host has no address. Never resolves DNS itself (Pingora's `HttpPeer::new`
    /// would, blocking).
    pub fn peer(&self) -> Option<Arc<HttpPeer>> {
        let peers = self.peers.load();
        if peers.is_empty() {
            return None;
        }
        peers.get(self.addrs.turn(peers.len())).cloned()
    }

    /// Store the host's resolved addresses, with their peers. The peers go first when there
    /// are addresses, last when there are none: whoever sees addresses finds their peers.
    pub fn store_addrs(&self, addrs: Vec<SocketAddr>) {
        let peers: Vec<Arc<HttpPeer>> = addrs
            .iter()
            .map(|a| Arc::new(self.build_peer(*a)))
            .collect();
        if addrs.is_empty() {
            self.addrs.store(addrs);
            self.peers.store(Arc::new(peers));
        } else {
            self.peers.store(Arc::new(peers));
            self.addrs.store(addrs);
        }
    }

    fn build_peer(&self, addr: SocketAddr) -> HttpPeer {
        let mut peer = HttpPeer::new(addr, self.tls, self.sni.clone());
        peer.options.connection_timeout = Some(self.connect_timeout);
        peer.options.total_connection_timeout = Some(self.connect_timeout);
        // Per read: the header deadline, and the longest gap allowed between stream chunks.
        peer.options.read_timeout = Some(self.ttfb_timeout);
        peer.options.write_timeout = Some(self.ttfb_timeout);
        peer.options.idle_timeout = Some(UPSTREAM_IDLE);
        peer.options.alpn = ALPN::H1;
        peer.options.ca.clone_from(&self.ca);
        peer
    }
}

/// A catalog entry callers may name.
#[derive(Debug)]
pub struct Model {
    pub idx: ModelIdx,
    pub name: Arc<str>,
    pub name_header: HeaderValue,
    pub capability: u8,
    pub context_window: Option<u32>,
    /// `None`: not declared (requests are not filtered on capabilities).
    pub capabilities: Option<Capabilities>,
    /// Deployments in priority order (stable: ties keep the configured order).
    pub deployments: Vec<DeploymentIdx>,
    pub enabled: bool,
    pub strategy: Strategy,
    /// Its own breaker threshold; `None` follows the health policy's (0: breakers off).
    pub failure_threshold: Option<u32>,
}

/// One way to serve a model: a provider and the upstream model name it knows it by.
#[derive(Debug)]
pub struct Deployment {
    pub idx: DeploymentIdx,
    /// The catalog model served; `None` for an ad-hoc direct deployment (`<provider>/<name>`
    /// naming an upstream model the catalog does not list).
    pub model: Option<ModelIdx>,
    pub provider: ProviderIdx,
    pub upstream_model: Arc<str>,
    /// The upstream model name as a JSON string literal (with quotes), spliced into bodies.
    pub upstream_model_json: Bytes,
    /// `x-routed-via` value: `<provider>/<upstream-model>`.
    pub routed_via: HeaderValue,
    /// `x-llm-model` value: the catalog model this deployment serves.
    pub model_header: HeaderValue,
    pub priority: i32,
    pub price: Option<Price>,
    /// Share under the `weighted` strategy; `None` = only in the failure order.
    pub weight: Option<f64>,
    /// Requests per minute it may take, and the attempts it took (shared with the catalog it
    /// was rebuilt from, by identity, and with other replicas through the shared state).
    pub rpm: Option<u32>,
    pub requests: Arc<Window>,
    /// Tokens per minute it may take, and the tokens it took (reported usage; shared like
    /// `requests`).
    pub tpm: Option<u64>,
    pub tokens: Arc<Window>,
    /// What the deployment may spend per period, and what it spent (shared with the catalog it
    /// was rebuilt from, by identity).
    pub budget: Option<BudgetConfig>,
    pub spend: Arc<Spend>,
    /// A stable hash of the deployment's identity (model, provider, upstream model): the same
    /// in every catalog and every replica (sticky sessions and prefix affinity use it).
    pub key_hash: u64,
}

/// The immutable catalog.
#[derive(Debug)]
pub struct Catalog {
    pub providers: Vec<Provider>,
    pub models: Vec<Model>,
    pub deployments: Vec<Deployment>,
}

impl Catalog {
    pub fn provider(&self, i: ProviderIdx) -> &Provider {
        &self.providers[i.get()]
    }
    pub fn model(&self, i: ModelIdx) -> &Model {
        &self.models[i.get()]
    }
    pub fn deployment(&self, i: DeploymentIdx) -> &Deployment {
        &self.deployments[i.get()]
    }
    /// Whether planning a request for `d` reads the prompt's token estimate: a price (costs,
    /// `cheapest`, budgets), a `tpm` window, a budget of its own or its provider's, or its
    /// model's context window. A deployment with none of them never needs the estimate.
    pub fn reads_tokens(&self, d: &Deployment) -> bool {
        d.price.is_some()
            || d.tpm.is_some()
            || d.budget.is_some()
            || self.provider(d.provider).budget.is_some()
            || d.model
                .is_some_and(|m| self.model(m).context_window.is_some())
    }

    /// Whether planning a request for `d` compares the request's needs: only with its model's
    /// declared `capabilities` (an ad-hoc deployment has no model).
    pub fn reads_needs(&self, d: &Deployment) -> bool {
        d.model
            .is_some_and(|m| self.model(m).capabilities.is_some())
    }

    pub fn provider_by_id(&self, id: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| &*p.id == id)
    }

    /// A catalog deployment's identity: (model name, provider id, upstream model). `None` for
    /// an ad-hoc deployment.
    pub fn deployment_key(&self, d: DeploymentIdx) -> Option<(&str, &str, &str)> {
        let dep = self.deployments.get(d.get())?;
        let model = self.model(dep.model?);
        Some((
            &model.name,
            &self.provider(dep.provider).id,
            &dep.upstream_model,
        ))
    }

    /// Build from a validated config. `resolve` gives the initial addresses of a host
    /// (blocking DNS is acceptable here: this runs before any socket is bound); `read_key`
    /// reads a key source. Both are parameters so tests need no environment.
    pub fn build(
        config: &Config,
        resolve: &dyn Fn(&str, u16) -> Vec<SocketAddr>,
        read_key: &dyn Fn(&KeySource) -> Result<Option<String>, String>,
    ) -> Result<(Self, Vec<CatalogWarning>), CatalogError> {
        let mut warnings = Vec::new();
        let mut providers = Vec::with_capacity(config.providers.len());
        for (i, p) in config.providers.iter().enumerate() {
            let tls = p.base_url.scheme == Scheme::Https;
            let path = &p.base_url.path;
            let mut uris = Vec::with_capacity(Surface::ALL.len());
            for e in Surface::ALL {
                let uri: Uri = format!("{path}{}", e.upstream_path())
                    .parse()
                    .map_err(|e| CatalogError(format!("providers.{}: bad path: {e}", p.id)))?;
                uris.push(uri);
            }
            let models_uri: Uri = format!("{path}/models")
                .parse()
                .map_err(|e| CatalogError(format!("providers.{}: bad path: {e}", p.id)))?;
            let host_header = HeaderValue::from_str(&p.base_url.authority())
                .map_err(|e| CatalogError(format!("providers.{}: bad host: {e}", p.id)))?;
            let ip_literal = p.base_url.host.parse::<std::net::IpAddr>().ok();
            let addrs = match ip_literal {
                Some(ip) => vec![SocketAddr::new(ip, p.base_url.port)],
                None => {
                    let found = resolve(&p.base_url.host, p.base_url.port);
                    if found.is_empty() {
                        warnings.push(CatalogWarning(format!(
                            "providers.{}: host does not resolve yet; it is skipped until it does",
                            p.id
                        )));
                    }
                    found
                }
            };
            let ca = match &p.ca_file {
                Some(path) => Some(
                    load_ca(path)
                        .map_err(|e| CatalogError(format!("providers.{}.ca_file: {e}", p.id)))?,
                ),
                None => None,
            };
            let mut credentials = Vec::with_capacity(p.credentials.len());
            for c in &p.credentials {
                let (auth, usable) = match read_key(&c.source) {
                    Ok(None) => (None, true),
                    Ok(Some(key)) => match match p.kind {
                        ProviderKind::OpenAi => Secret::bearer(&key),
                        ProviderKind::Anthropic => Secret::api_key(&key),
                    } {
                        Some(s) => (Some(s), true),
                        None => {
                            warnings.push(CatalogWarning(format!(
                                "providers.{}.credentials.{}: the key is empty or not a valid header value; the credential is unusable",
                                p.id, c.id
                            )));
                            (None, false)
                        }
                    },
                    Err(why) => {
                        warnings.push(CatalogWarning(format!(
                            "providers.{}.credentials.{}: {why}; the credential is unusable",
                            p.id, c.id
                        )));
                        (None, false)
                    }
                };
                credentials.push(Credential {
                    id: Arc::from(c.id.as_str()),
                    auth,
                    usable,
                });
            }
            let provider = Provider {
                idx: ProviderIdx(idx32(i)),
                id: Arc::from(p.id.as_str()),
                id_header: header_value(&p.id)?,
                kind: p.kind,
                base_url: p.base_url.clone(),
                tls,
                sni: p.base_url.host.clone(),
                host_header,
                uris,
                models_uri,
                addrs: Arc::default(),
                peers: ArcSwap::default(),
                needs_dns: ip_literal.is_none(),
                ca,
                connect_timeout: p.connect_timeout,
                ttfb_timeout: p.ttfb_timeout,
                headers: p.headers.clone(),
                credentials,
                credential_cursor: AtomicUsize::new(0),
                credential_choice: p.credential_choice,
                enabled: p.enabled,
                budget: p.budget,
                spend: Arc::default(),
            };
            provider.store_addrs(addrs);
            providers.push(provider);
        }

        let mut models = Vec::with_capacity(config.models.len());
        let mut deployments = Vec::new();
        for (mi, m) in config.models.iter().enumerate() {
            let model_idx = ModelIdx(idx32(mi));
            let model_header = header_value(&m.name)?;
            let mut own = Vec::with_capacity(m.deployments.len());
            for d in &m.deployments {
                let di = DeploymentIdx(idx32(deployments.len()));
                let provider = &providers[d.provider];
                deployments.push(Deployment {
                    idx: di,
                    model: Some(model_idx),
                    provider: ProviderIdx(idx32(d.provider)),
                    upstream_model: Arc::from(d.upstream_model.as_str()),
                    upstream_model_json: json_string_literal(&d.upstream_model),
                    routed_via: header_value(&format!("{}/{}", provider.id, d.upstream_model))?,
                    model_header: model_header.clone(),
                    priority: d.priority,
                    price: d.price,
                    weight: d.weight,
                    rpm: d.rpm,
                    tpm: d.tpm,
                    requests: Arc::default(),
                    tokens: Arc::default(),
                    budget: d.budget,
                    spend: Arc::default(),
                    key_hash: identity_hash(&[&m.name, &provider.id, &d.upstream_model]),
                });
                own.push(di);
            }
            // Stable sort: equal priorities keep the order the operator wrote.
            own.sort_by_key(|d| deployments[d.get()].priority);
            models.push(Model {
                idx: model_idx,
                name: Arc::from(m.name.as_str()),
                name_header: model_header,
                capability: m.capability,
                context_window: m.context_window,
                capabilities: m.capabilities,
                deployments: own,
                enabled: m.enabled,
                strategy: m.strategy,
                failure_threshold: m.failure_threshold,
            });
        }

        Ok((
            Self {
                providers,
                models,
                deployments,
            },
            warnings,
        ))
    }
}

impl Catalog {
    /// Share the spend counters of `old`'s deployments and providers with the same ones here
    /// (deployments by identity, providers by id): a reload neither forgets nor refunds spend.
    pub fn carry_spend(&mut self, old: &Catalog) {
        for d in &mut self.deployments {
            if let Some(o) = old.deployments.iter().find(|o| o.key_hash == d.key_hash) {
                d.spend = o.spend.clone();
                d.requests = o.requests.clone();
                d.tokens = o.tokens.clone();
            }
        }
        for p in &mut self.providers {
            if let Some(o) = old.providers.iter().find(|o| o.id == p.id) {
                p.spend = o.spend.clone();
            }
        }
    }
}

impl Deployment {
    /// A deployment for a direct request (`<provider>/<upstream-model>`) to an upstream model
    /// the catalog does not list. `None` if the name cannot be sent in a header or a body.
    pub fn adhoc(provider: &Provider, upstream_model: &str) -> Option<Self> {
        if !crate::config::is_upstream_model_name(upstream_model) {
            return None;
        }
        let routed_via =
            HeaderValue::from_str(&format!("{}/{upstream_model}", provider.id)).ok()?;
        Some(Self {
            idx: DeploymentIdx(u32::MAX),
            model: None,
            provider: provider.idx,
            upstream_model: Arc::from(upstream_model),
            upstream_model_json: json_string_literal(upstream_model),
            routed_via,
            model_header: HeaderValue::from_str(upstream_model).ok()?,
            priority: crate::config::DEFAULT_PRIORITY,
            price: None,
            weight: None,
            rpm: None,
            tpm: None,
            requests: Arc::default(),
            tokens: Arc::default(),
            budget: None,
            spend: Arc::default(),
            key_hash: identity_hash(&[&provider.id, upstream_model]),
        })
    }
}

/// The one stable 64-bit hash of signalbox (SipHash-2-4 with fixed keys): the same bytes hash
/// the same in every process and every release, so replicas agree on sticky sessions and
/// prefix affinity, and identities hash the same across config reloads.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h =
        siphasher::sip::SipHasher24::new_with_keys(0x5167_6e61_6c62_6f78, 0x7374_6963_6b79_0001);
    // Hashed as a slice (length first), as signalbox always has.
    bytes.hash(&mut h);
    h.finish()
}

/// A stable hash of an identity made of several names (NUL-separated: names never hold NUL).
fn identity_hash(parts: &[&str]) -> u64 {
    let joined = parts.join("\0");
    stable_hash(joined.as_bytes())
}

fn header_value(s: &str) -> Result<HeaderValue, CatalogError> {
    HeaderValue::from_str(s).map_err(|_| CatalogError(format!("{s:?} cannot be a header value")))
}

/// A JSON string literal for a name already checked to hold no quote, backslash or control
/// character (see `config::is_upstream_model_name`).
pub fn json_string_literal(s: &str) -> Bytes {
    let mut v = Vec::with_capacity(s.len() + 2);
    v.push(b'"');
    v.extend_from_slice(s.as_bytes());
    v.push(b'"');
    Bytes::from(v)
}

/// Read a key from its configured source. Env vars and files are read once, at build.
pub fn read_key_from_env_or_file(source: &KeySource) -> Result<Option<String>, String> {
    match source {
        KeySource::None => Ok(None),
        KeySource::Env(name) => match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(v)),
            _ => Err(format!("environment variable {name} is not set")),
        },
        KeySource::File(path) => match std::fs::read_to_string(path) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_string())),
            Ok(_) => Err(format!("key file {} is empty", path.display())),
            Err(e) => Err(format!("key file {} cannot be read: {e}", path.display())),
        },
    }
}

/// Blocking resolution used at startup.
pub fn resolve_blocking(host: &str, port: u16) -> Vec<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .map(|found| prefer_ipv4(found.collect()))
        .unwrap_or_default()
}

/// Keep IPv4 answers when there are any, in a stable order. Connections rotate over the
/// answer set and there is no happy-eyeballs fallback per attempt, so a host whose IPv6
/// path is broken (common on hosts that answer AAAA for `localhost`, say) would fail every
/// other attempt.
pub fn prefer_ipv4(mut addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    if addrs.iter().any(SocketAddr::is_ipv4) {
        addrs.retain(SocketAddr::is_ipv4);
    }
    addrs.sort();
    addrs.dedup();
    addrs
}

/// Load a PEM bundle of CA certificates for a provider's TLS verification.
fn load_ca(path: &std::path::Path) -> Result<Arc<CaType>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut reader = std::io::BufReader::new(pem.as_slice());
    let mut certs = Vec::new();
    for item in rustls_pemfile::certs(&mut reader) {
        let der = item.map_err(|e| format!("bad PEM in {}: {e}", path.display()))?;
        // `parse_x509` panics on a bad certificate: check it first.
        x509_parser::parse_x509_certificate(der.as_ref())
            .map_err(|e| format!("bad certificate in {}: {e}", path.display()))?;
        certs.push(WrappedX509::new(der.as_ref().to_vec(), parse_x509));
    }
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(Arc::from(certs.into_boxed_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        crate::config::parse(
            r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:9001/v1", credentials: [{ id: k1, key_env: A_KEY }, { id: k2, key_env: MISSING }] }
  b: { kind: openai, base_url: "https://api.example.test/v1", priority: 5 }
models:
  m:
    deployments:
      - { provider: a, model: up-a }
      - { provider: b, model: up-b }
"#,
        )
        .expect("valid config")
    }

    #[test]
    fn builds_ready_made_request_parts() {
        let resolve = |_: &str, port: u16| vec![SocketAddr::from(([10, 0, 0, 1], port))];
        let read = |s: &KeySource| match s {
            KeySource::Env(n) if n == "A_KEY" => Ok(Some("sk-a".to_string())),
            KeySource::Env(n) => Err(format!("environment variable {n} is not set")),
            _ => Ok(None),
        };
        let (cat, warnings) = Catalog::build(&config(), &resolve, &read).expect("builds");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].0.contains("credentials.k2"));
        let a = &cat.providers[0];
        assert_eq!(
            a.uri(Surface::ChatCompletions).path(),
            "/v1/chat/completions"
        );
        assert_eq!(a.uri(Surface::Messages).path(), "/v1/messages");
        assert_eq!(a.host_header, "127.0.0.1:9001");
        assert!(!a.tls && !a.needs_dns);
        assert!(a.credentials[0].usable && !a.credentials[1].usable);
        let b = &cat.providers[1];
        assert!(b.tls && b.needs_dns);
        assert_eq!(b.host_header, "api.example.test");
        assert_eq!(b.addrs.pick(), Some(SocketAddr::from(([10, 0, 0, 1], 443))));
        // Provider b has priority 5, so its deployment sorts first.
        let m = &cat.models[0];
        assert_eq!(cat.deployment(m.deployments[0]).routed_via, "b/up-b");
        assert_eq!(
            &cat.deployment(m.deployments[1]).upstream_model_json[..],
            b"\"up-a\""
        );
    }
}
