//! Background DNS refresh for provider hosts.
//!
//! Pingora's `HttpPeer::new` resolves names on the worker thread and panics when resolution
//! fails, so the request path only ever hands it a `SocketAddr` from the
//! provider's [`AddrCell`](crate::catalog::AddrCell). This service re-resolves every host
//! name on an interval with tokio's resolver and swaps in the answer; a failed lookup keeps
//! the previous addresses (a DNS blip must not take a healthy provider away). The lookup is a
//! [`Resolver`]: the system's by default, one a test controls otherwise.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::catalog::prefer_ipv4;
use crate::snapshot::Runtime;

/// How often provider host names are re-resolved.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// Looks a provider's host name up.
#[async_trait]
pub trait Resolver: Send + Sync {
    async fn lookup(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>>;
}

/// The system's resolver (tokio's `lookup_host`, off the worker threads).
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn lookup(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

pub struct DnsRefresher {
    router: Arc<Runtime>,
    interval: Duration,
    resolver: Arc<dyn Resolver>,
}

impl DnsRefresher {
    pub fn new(router: Arc<Runtime>, interval: Duration) -> Self {
        Self::with_resolver(router, interval, Arc::new(SystemResolver))
    }

    pub fn with_resolver(
        router: Arc<Runtime>,
        interval: Duration,
        resolver: Arc<dyn Resolver>,
    ) -> Self {
        Self {
            router,
            interval,
            resolver,
        }
    }

    /// Resolve every provider host name once.
    pub async fn refresh(&self) {
        let tables = self.router.snapshot.load_full();
        for p in tables.catalog.providers.iter().filter(|p| p.needs_dns) {
            match self
                .resolver
                .lookup(&p.base_url.host, p.base_url.port)
                .await
            {
                Ok(found) => {
                    let addrs = prefer_ipv4(found);
                    if addrs.is_empty() {
                        tracing::warn!(provider = %p.id, "provider host resolved to no address; keeping the previous ones");
                    } else if *p.addrs.snapshot() != addrs {
                        tracing::info!(provider = %p.id, count = addrs.len(), "provider addresses changed");
                        p.store_addrs(addrs);
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

#[cfg(test)]
mod tests {
    use arc_swap::ArcSwapOption;

    use super::*;
    use crate::testing::Fixture;

    /// A resolver whose answer the test sets; `None`: the lookup fails.
    struct Scripted(ArcSwapOption<Vec<SocketAddr>>);

    #[async_trait]
    impl Resolver for Scripted {
        async fn lookup(&self, _: &str, _: u16) -> std::io::Result<Vec<SocketAddr>> {
            self.0
                .load_full()
                .map(|a| (*a).clone())
                .ok_or_else(|| std::io::Error::other("no such host"))
        }
    }

    #[tokio::test]
    async fn a_provider_host_whose_address_changes_is_followed_without_a_restart() {
        let router = Arc::new(
            Fixture::new(
                "providers:\n  a: { kind: openai, base_url: \"http://provider.test:9001/v1\" }\nmodels:\n  m: { deployments: [{ provider: a, model: x }] }\n",
            )
            .router(),
        );
        let moved: SocketAddr = "127.0.0.2:9001".parse().expect("addr");
        let answer = Arc::new(Scripted(ArcSwapOption::from_pointee(vec![moved])));
        let dns = DnsRefresher::with_resolver(router.clone(), REFRESH_INTERVAL, answer.clone());
        let peer_addr = || {
            let snapshot = router.snapshot.load_full();
            let provider = &snapshot.catalog.providers[0];
            provider.addrs.pick().expect("an address")
        };
        assert_eq!(
            peer_addr().ip().to_string(),
            "127.0.0.1",
            "as resolved at start"
        );
        dns.refresh().await;
        assert_eq!(
            peer_addr(),
            moved,
            "the next request goes to the new address"
        );
        // A failed lookup, or an empty answer, keeps what was known.
        answer.0.store(None);
        dns.refresh().await;
        assert_eq!(peer_addr(), moved);
        answer.0.store(Some(Arc::new(Vec::new())));
        dns.refresh().await;
        assert_eq!(peer_addr(), moved);
    }
}
