//! Active probes: a background service that asks ejected, benched or rejected targets
//! `GET <base_url>/models` every `probe_interval`, with the target's own credential, and
//! re-admits them at `restore_health` when they answer 2xx. Healthy targets are never probed.
//!
//! One request per (provider, credential) per pass serves every target needing it: the models
//! endpoint says the endpoint and key work, which is what ejection, benching and rejection
//! doubt. A model still sick re-trips its breaker on live traffic. A 401/403 answer keeps a
//! rejected credential out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::connectors::http::Connector;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_http::RequestHeader;

use super::breaker::BreakerState;
use super::{HealthRegistry, TargetRef};
use crate::catalog::{Catalog, ProviderIdx};

/// Where background readers find the catalog serving traffic and its health records (both
/// change on reload, together).
pub type HealthSource = Arc<dyn Fn() -> (Arc<Catalog>, Arc<HealthRegistry>) + Send + Sync>;

/// Lifetime probe counters, by result, for metrics.
#[derive(Debug, Default)]
pub struct ProbeCounters {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
}

pub struct Prober {
    source: HealthSource,
    connector: Arc<Connector>,
    pub counters: Arc<ProbeCounters>,
}

/// The answer of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Ok,
    Rejected,
    Failed,
}

impl Prober {
    pub fn new(
        source: HealthSource,
        connector: Arc<Connector>,
        counters: Arc<ProbeCounters>,
    ) -> Self {
        Self {
            source,
            connector,
            counters,
        }
    }

    /// Targets that need a probe now, grouped by (provider, credential).
    pub fn due(
        registry: &HealthRegistry,
        catalog: &Catalog,
    ) -> HashMap<(ProviderIdx, usize), Vec<TargetRef>> {
        let now = registry.now_ms();
        let mut due: HashMap<(ProviderIdx, usize), Vec<TargetRef>> = HashMap::new();
        for t in registry.targets_of(catalog) {
            let provider = catalog.provider(t.provider);
            if !provider.enabled || !provider.credentials[t.credential].usable {
                continue;
            }
            let ejected = registry
                .target(t)
                .is_some_and(|th| th.state(now) != BreakerState::Closed);
            let benched = t
                .deployment
                .and_then(|d| registry.deployment(d))
                .is_some_and(|d| d.benched_until(now).is_some());
            let rejected = registry
                .credential(t.provider, t.credential)
                .is_some_and(|c| c.is_rejected() && c.cooling_until(now).is_some());
            if ejected || benched || rejected {
                due.entry((t.provider, t.credential)).or_default().push(t);
            }
        }
        due
    }

    /// One pass: probe everything due, apply the answers.
    pub async fn run_once(&self) {
        let (catalog, registry) = (self.source)();
        let due = Self::due(&registry, &catalog);
        let mut pending = tokio::task::JoinSet::new();
        for ((p, c), targets) in due {
            let provider_req = probe_request(&catalog, p, c);
            let peer = catalog.provider(p).peer();
            let connector = Arc::clone(&self.connector);
            pending.spawn(async move {
                let result = match (peer, provider_req) {
                    (Some(peer), Some(req)) => probe(&connector, &peer, req).await,
                    _ => ProbeResult::Failed,
                };
                (targets, result)
            });
        }
        while let Some(joined) = pending.join_next().await {
            let Ok((targets, result)) = joined else {
                continue;
            };
            self.apply(&registry, &targets, result);
        }
    }

    /// Apply a probe answer to the targets it covers.
    pub fn apply(&self, registry: &HealthRegistry, targets: &[TargetRef], result: ProbeResult) {
        let now = registry.now_ms();
        match result {
            ProbeResult::Ok => {
                self.counters.ok.fetch_add(1, Ordering::Relaxed);
                for t in targets {
                    if let Some(th) = registry.target(*t) {
                        if th.state(now) != BreakerState::Closed {
                            th.restore(&registry.policy);
                        }
                    }
                    if let Some(d) = t.deployment.and_then(|d| registry.deployment(d)) {
                        d.unbench();
                    }
                    if let Some(c) = registry.credential(t.provider, t.credential) {
                        if c.cooling_until(now).is_some() {
                            c.readmit();
                        }
                    }
                }
                registry.shared.transitions.notify_one();
            }
            ProbeResult::Rejected | ProbeResult::Failed => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

use crate::adapters::anthropic::ANTHROPIC_VERSION;

fn probe_request(catalog: &Catalog, p: ProviderIdx, credential: usize) -> Option<RequestHeader> {
    let provider = catalog.provider(p);
    let mut req =
        RequestHeader::build("GET", provider.models_uri.path().as_bytes(), Some(4)).ok()?;
    req.insert_header("host", provider.host_header.clone())
        .ok()?;
    req.insert_header("user-agent", "signalbox-probe").ok()?;
    if let Some(auth) = &provider.credentials.get(credential)?.auth {
        req.insert_header(auth.header_name().clone(), auth.header_value().clone())
            .ok()?;
    }
    if provider.kind == crate::config::ProviderKind::Anthropic {
        req.insert_header("anthropic-version", ANTHROPIC_VERSION)
            .ok()?;
    }
    Some(req)
}

async fn probe(
    connector: &Connector,
    peer: &pingora_core::upstreams::peer::HttpPeer,
    req: RequestHeader,
) -> ProbeResult {
    let Ok((mut session, _)) = connector.get_http_session(peer).await else {
        return ProbeResult::Failed;
    };
    session.set_read_timeout(peer.options.read_timeout);
    session.set_write_timeout(peer.options.write_timeout);
    if session.write_request_header(Box::new(req)).await.is_err()
        || session.finish_request_body().await.is_err()
        || session.read_response_header().await.is_err()
    {
        return ProbeResult::Failed;
    }
    let status = session.response_header().map_or(0, |h| h.status.as_u16());
    // Drain a little of the body so the connection closes cleanly; it is not reused.
    let _ = tokio::time::timeout(Duration::from_secs(1), session.read_response_body()).await;
    match status {
        200..=299 => ProbeResult::Ok,
        401..=403 => ProbeResult::Rejected,
        _ => ProbeResult::Failed,
    }
}

/// The background service around [`Prober`].
pub struct ProbeService {
    prober: Prober,
    interval: Duration,
}

impl ProbeService {
    pub fn new(prober: Prober, interval: Duration) -> Self {
        Self { prober, interval }
    }
}

#[async_trait]
impl BackgroundService for ProbeService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        crate::periodic::every(self.interval, &mut shutdown, || self.prober.run_once()).await;
    }
}
