//! A plain Pingora reverse proxy with no routing work: the floor signalbox's own overhead is
//! measured against in `load-tests/` (same Pingora version, same thread count, same upstream
//! pool settings, same allocator). Not part of the product.
//!
//! `cargo run --release --example plain_pingora -- LISTEN UPSTREAM [THREADS]`

use async_trait::async_trait;

/// The same allocator as `signalbox`, so the floor differs from it only by the routing work.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

struct Plain {
    upstream: std::net::SocketAddr,
}

#[async_trait]
impl ProxyHttp for Plain {
    type CTX = ();
    fn new_ctx(&self) {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_error::Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        peer.options.idle_timeout = Some(std::time::Duration::from_secs(60));
        Ok(Box::new(peer))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18200".to_string());
    let upstream = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 18101)));
    let threads = args.next().and_then(|t| t.parse().ok()).unwrap_or(1);
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: format!("/tmp/plain_pingora_{}.sock", std::process::id()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc = pingora_proxy::http_proxy_service(&server.configuration, Plain { upstream });
    svc.add_tcp(&listen);
    server.add_service(svc);
    server.run_forever();
}
