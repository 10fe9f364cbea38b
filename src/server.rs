//! Assembling signalbox from a config: the routing snapshot, the Pingora server settings and
//! the services (proxy, admin, DNS refresh). `main` only sequences these steps.

use std::sync::Arc;

use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;

use crate::admin::AdminApp;
use crate::catalog::{read_key_from_env_or_file, resolve_blocking, Catalog, CatalogWarning};
use crate::config::Config;
use crate::dns::{DnsRefresher, REFRESH_INTERVAL};
use crate::error::StartupError;
use crate::metrics::Metrics;
use crate::proxy::{Gateway, GatewayState};
use crate::routing::Tables;

/// Build the shared gateway state (catalog, routing snapshot, metrics) from a config.
pub fn build_state(
    config: &Config,
) -> Result<(Arc<GatewayState>, Vec<CatalogWarning>), StartupError> {
    let (catalog, warnings) =
        Catalog::build(config, &resolve_blocking, &read_key_from_env_or_file)?;
    let metrics = Arc::new(Metrics::new()?);
    let tables = Tables::build(config, Arc::new(catalog), &metrics, 1);
    Ok((Arc::new(GatewayState::new(tables, metrics)), warnings))
}

/// Pingora's server settings from the `pingora:` section. Unset values keep Pingora's
/// defaults, except `threads` (all cores rather than one) and `max_retries` (follows
/// `failover.max_attempts`, since each Pingora retry is one attempt).
pub fn server_conf(config: &Config) -> ServerConf {
    let p = &config.pingora;
    let mut conf = ServerConf {
        threads: p.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        max_retries: config.failover.max_attempts as usize,
        ..ServerConf::default()
    };
    if let Some(v) = p.work_stealing {
        conf.work_stealing = v;
    }
    if let Some(v) = p.listener_tasks_per_fd {
        conf.listener_tasks_per_fd = v;
    }
    if let Some(v) = p.daemon {
        conf.daemon = v;
    }
    if let Some(v) = &p.pid_file {
        conf.pid_file.clone_from(v);
    }
    if let Some(v) = &p.upgrade_sock {
        conf.upgrade_sock.clone_from(v);
    }
    conf.error_log.clone_from(&p.error_log);
    conf.user.clone_from(&p.user);
    conf.group.clone_from(&p.group);
    conf.grace_period_seconds = p.grace_period_seconds;
    conf.graceful_shutdown_timeout_seconds = p.graceful_shutdown_timeout_seconds;
    if let Some(v) = p.upstream_keepalive_pool_size {
        conf.upstream_keepalive_pool_size = v;
    }
    conf.ca_file.clone_from(&p.ca_file);
    conf
}

/// Build the Pingora server with every service. The caller runs it.
pub fn build_server(
    config: &Config,
    state: Arc<GatewayState>,
    upgrade: bool,
    daemon: bool,
) -> Server {
    let opt = Opt {
        upgrade,
        daemon,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(config));
    server.bootstrap();

    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(state.clone()),
        "signalbox proxy",
    );
    proxy.add_tcp(&config.listen.proxy);

    let mut admin = Service::new("signalbox admin".to_string(), AdminApp::new(state.clone()));
    admin.add_tcp(&config.listen.admin);

    let dns = background_service("signalbox dns", DnsRefresher::new(state, REFRESH_INTERVAL));

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(dns);
    server
}
