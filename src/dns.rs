//! Background DNS refresh for provider hosts.
//!
//! Pingora's `HttpPeer::new` resolves names on the worker thread and panics when resolution
//! fails, so the request path only ever hands it a `SocketAddr` from the
//! provider's [`AddrCell`](crate::catalog::AddrCell). This service re-resolves every host
//! name on an interval with tokio's resolver and swaps in the answer; a failed lookup keeps
//! the previous addresses (a DNS blip must not take a healthy provider away).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::catalog::prefer_ipv4;
use crate::snapshot::Runtime;

/// How often provider host names are re-resolved.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(30);

pub struct DnsRefresher {
    router: Arc<Runtime>,
    interval: Duration,
}

impl DnsRefresher {
    pub fn new(router: Arc<Runtime>, interval: Duration) -> Self {
        Self { router, interval }
    }

    /// Resolve every provider host name once.
    pub async fn refresh(&self) {
        let tables = self.router.snapshot.load_full();
        for p in tables.catalog.providers.iter().filter(|p| p.needs_dns) {
            let host = (p.base_url.host.as_str(), p.base_url.port);
            match tokio::net::lookup_host(host).await {
                Ok(found) => {
                    let addrs = prefer_ipv4(found.collect());
                    if addrs.is_empty() {
                        tracing::warn!(provider = %p.id, "provider host resolved to no address; keeping the previous ones");
                    } else if *p.addrs.snapshot() != addrs {
                        tracing::info!(provider = %p.id, count = addrs.len(), "provider addresses changed");
                        p.addrs.store(addrs);
                    }
                }
                Err(e) => {
                    tracing::warn!(provider = %p.id, error = %e, "provider host lookup failed; keeping the previous addresses");
                }
            }
        }
    }
}

#[async_trait]
impl BackgroundService for DnsRefresher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        crate::periodic::every(self.interval, &mut shutdown, || self.refresh()).await;
    }
}
