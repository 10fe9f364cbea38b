//! Assembling signalbox from a config: the shared gateway state (routing snapshot, health,
//! metrics), the Pingora server settings and the services (proxy, admin, DNS refresh, ranker,
//! probes). `main` only sequences these steps; every other module receives the pieces of
//! [`GatewayState`] it needs, so dependencies point from here outwards.

use std::sync::Arc;

use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;

use crate::admin::AdminApp;
use crate::catalog::{read_key_from_env_or_file, resolve_blocking, Catalog, CatalogWarning};
use crate::config::{BudgetPeriod, Config, LedgerStore};
use crate::dns::{DnsRefresher, REFRESH_INTERVAL};
use crate::edge::EdgeApp;
use crate::error::StartupError;
use crate::health::clock::{Clock, SystemClock};
use crate::health::probe::{HealthSource, ProbeService, Prober};
use crate::health::{HealthRegistry, HealthShared};
use crate::ledger::{Ledger, LedgerOptions, LedgerTarget};
use crate::lifecycle::{DrainThenExit, Launch, ReloadOnHangup, UpgradeOnUser2};
use crate::limits::budget::period_start_day;
use crate::metrics::health::{HealthCollector, RouteCollector};
use crate::metrics::ledger::LedgerCollector;
use crate::metrics::Metrics;
use crate::proxy::Gateway;
use crate::reload::Reloader;
use crate::snapshot::RankerService;
use crate::snapshot::{Runtime, Snapshot};
use crate::state::admit::SharedAdmission;
use crate::state::redis::RedisBackend;
use crate::state::{MemoryBackend, StateBackend, StateMetrics, StateService, StateSync};

use crate::server_tls::CertStore;

/// State shared by every request and every background service: routing (snapshot, rankings,
/// health, sessions) and the metric families.
pub struct GatewayState {
    pub router: Arc<Runtime>,
    pub metrics: Arc<Metrics>,
    /// The proxy listener's certificate when it terminates TLS (`listen.proxy_tls`): the
    /// resolver its handshakes read, swapped by the reloader.
    pub proxy_tls: Option<Arc<CertStore>>,
}

impl GatewayState {
    pub fn new(router: Arc<Runtime>, metrics: Arc<Metrics>) -> Self {
        let generation = router.snapshot.load().generation;
        metrics
            .config_generation
            .set(i64::try_from(generation).unwrap_or(0));
        Self {
            router,
            metrics,
            proxy_tls: None,
        }
    }

    /// The catalog serving traffic and its health records, for background readers.
    pub fn health_source(&self) -> HealthSource {
        let router = self.router.clone();
        Arc::new(move || {
            let tables = router.snapshot.load();
            (tables.catalog.clone(), tables.health.clone())
        })
    }
}

use pingora_core::apps::HttpServerOptions;
use pingora_core::connectors::http::Connector;
use pingora_core::connectors::ConnectorOptions;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};

/// Build the shared gateway state (catalog, routing snapshot, health, metrics) from a config.
pub fn build_state(
    config: &Config,
) -> Result<(Arc<GatewayState>, Vec<CatalogWarning>), StartupError> {
    build_state_with_clock(config, Arc::new(SystemClock::new()))
}

/// As [`build_state`], with the clock health logic reads.
pub fn build_state_with_clock(
    config: &Config,
    clock: Arc<dyn Clock>,
) -> Result<(Arc<GatewayState>, Vec<CatalogWarning>), StartupError> {
    let (catalog, warnings) =
        Catalog::build(config, &resolve_blocking, &read_key_from_env_or_file)?;
    let catalog = Arc::new(catalog);
    let metrics = Arc::new(Metrics::new()?);
    let shared = HealthShared::new(clock, &config.health);
    let health = Arc::new(HealthRegistry::new(&catalog, config.health, shared.clone()));
    let (tables, key_warnings) =
        Snapshot::build(config, catalog, health, &metrics, 1).with_accounts(config, None);
    let mut warnings = warnings;
    warnings.extend(key_warnings.into_iter().map(CatalogWarning));
    let router = Arc::new(Runtime::new(tables, shared));
    let mut state = GatewayState::new(router, metrics);
    state.proxy_tls = config
        .listen
        .proxy_tls
        .as_ref()
        .map(|tls| Arc::new(CertStore::new(&tls.cert)));
    state.metrics.register(Box::new(HealthCollector::new(
        state.health_source(),
        state.metrics.probes.clone(),
    )?))?;
    let router = state.router.clone();
    state
        .metrics
        .register(Box::new(RouteCollector::new(Arc::new(move || {
            let tables = router.snapshot.load();
            tables
                .serving()
                .into_iter()
                .map(|r| (r.label, !r.can_serve))
                .collect()
        }))?))?;
    Ok((Arc::new(state), warnings))
}

/// What a running gateway records and shares beyond one request: the ledger (`ledger`) and
/// the shared state (`state`, or the in-process backend).
pub struct Accounts {
    pub ledger: Option<Arc<Ledger>>,
    pub state: Arc<StateSync>,
    /// Exact admission of keys' limits on Redis (`state.limits: exact`, the default).
    pub shared: Option<Arc<SharedAdmission>>,
}

/// Open the ledger and rebuild every budget's spend from it, and set up the shared state.
/// Only for a gateway that will serve (`-t` and `explain` touch neither). A relative
/// `ledger.sqlite` lies beside the config file (`config_dir`), not in the working directory (a
/// daemon's is `/`).
pub fn open_accounts(
    config: &Config,
    state: &GatewayState,
    config_dir: Option<&std::path::Path>,
) -> Result<Accounts, StartupError> {
    let ledger = match &config.ledger {
        None => None,
        Some(l) => {
            let target = ledger_target(&l.store, config_dir)?;
            let options = LedgerOptions {
                queue: l.queue,
                batch: l.batch,
                interval: l.flush_interval,
            };
            let ledger = Ledger::open(target, options)?;
            let rebuilt = rebuild_spend(&state.router, &ledger)?;
            tracing::info!(
                backend = ledger.backend(),
                rows = rebuilt,
                "ledger open; budgets' spend rebuilt from it"
            );
            Some(ledger)
        }
    };
    // The knn router's examples live beside the ledger (memory only without one).
    if let Some(l) = &config.ledger {
        let store = crate::knn::store::ExampleStore::open(ledger_target(&l.store, config_dir)?)
            .map_err(|e| StartupError::State(e.to_string()))?;
        let knn = &state.router.knn;
        knn.set_store(Arc::new(store));
        let max = config
            .checks
            .knn
            .as_ref()
            .map_or(crate::config::defaults::KNN_MAX_EXAMPLES_PER_POOL, |k| {
                k.max_examples_per_pool
            });
        let loaded = knn.load(max).map_err(StartupError::State)?;
        tracing::info!(examples = loaded, "knn router: examples loaded");
    }
    state
        .metrics
        .register(Box::new(LedgerCollector::new(ledger.clone())?))?;
    let redis = match &config.state {
        None => None,
        Some(s) => {
            let url = std::env::var(&s.redis_url_env).map_err(|_| {
                StartupError::State(format!(
                    "state.redis_url_env: environment variable {} is not set",
                    s.redis_url_env
                ))
            })?;
            Some(Arc::new(
                RedisBackend::new(&url, &s.key_prefix, s.timeout)
                    .map_err(|e| StartupError::State(format!("state: {e}")))?,
            ))
        }
    };
    let backend: Arc<dyn StateBackend> = match &redis {
        None => Arc::new(MemoryBackend::default()),
        Some(r) => r.clone(),
    };
    let (interval, timeout) = config.state.as_ref().map_or(
        (
            crate::config::defaults::STATE_SYNC_INTERVAL,
            crate::config::defaults::STATE_TIMEOUT,
        ),
        |s| (s.sync_interval, s.timeout),
    );
    let metrics = StateMetrics::register(&state.metrics)?;
    let exact = config
        .state
        .as_ref()
        .is_some_and(|s| s.limits == crate::config::types::SharedLimits::Exact);
    let shared = redis
        .filter(|_| exact)
        .map(|r| Arc::new(SharedAdmission::new(r, timeout, metrics.fallbacks.clone())));
    let sync = StateSync::new(state.router.clone(), backend, interval, timeout, metrics);
    Ok(Accounts {
        ledger,
        state: Arc::new(sync),
        shared,
    })
}

/// Where the ledger (and the knn router's examples) live: a relative SQLite path beside the
/// config file, a PostgreSQL URL from its environment variable.
fn ledger_target(
    store: &LedgerStore,
    config_dir: Option<&std::path::Path>,
) -> Result<LedgerTarget, StartupError> {
    Ok(match store {
        LedgerStore::Sqlite(path) => LedgerTarget::Sqlite(match config_dir {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.clone(),
        }),
        LedgerStore::PostgresEnv(name) => LedgerTarget::Postgres {
            url: std::env::var(name).map_err(|_| {
                StartupError::State(format!(
                    "ledger.postgres_url_env: environment variable {name} is not set"
                ))
            })?,
        },
    })
}

/// Every budget's spend in its current period, from the ledger: the key's, its user's, the
/// deployment's, its provider's and the gateway's. Returns the rows read. The rebuilt spend is
/// marked as already in the shared store (a store that lived on holds it; the first round
/// against an empty one pushes it: `state`).
fn rebuild_spend(router: &Runtime, ledger: &Ledger) -> Result<usize, StartupError> {
    let tables = router.snapshot.load();
    let now_s = router.health.wall_s();
    let mut starts = Vec::new();
    let catalog = &tables.catalog;
    if let Some(keys) = &tables.keys {
        starts.extend(keys.iter().filter_map(|k| k.budget.map(|b| b.period)));
        starts.extend(keys.user_spends().map(|(_, b, _)| b.period));
    }
    starts.extend(
        catalog
            .deployments
            .iter()
            .filter_map(|d| d.budget.map(|b| b.period)),
    );
    starts.extend(
        catalog
            .providers
            .iter()
            .filter_map(|p| p.budget.map(|b| b.period)),
    );
    starts.extend(tables.global_budget.map(|b| b.period));
    let Some(first_day) = starts.iter().map(|p| period_start_day(*p, now_s)).min() else {
        return Ok(0);
    };
    let since_ms = i64::try_from(first_day.saturating_mul(86_400_000)).unwrap_or(0);
    let rows = ledger.spend_by_day(since_ms)?;
    let in_period = |period: BudgetPeriod, day: i64| {
        u64::try_from(day).is_ok_and(|d| d >= period_start_day(period, now_s))
    };
    for r in &rows {
        let cost = r.cost_micro_usd;
        if cost == 0 {
            continue;
        }
        if let Some(keys) = &tables.keys {
            if let Some(k) = r.key_id.as_deref().and_then(|id| keys.by_id(id)) {
                if let Some(b) = k.budget.filter(|b| in_period(b.period, r.day)) {
                    k.state.spend.add(b.period, now_s, cost);
                }
            }
            if let Some(user) = r.user.as_deref() {
                for (u, b, spend) in keys.user_spends() {
                    if u == user && in_period(b.period, r.day) {
                        spend.add(b.period, now_s, cost);
                    }
                }
            }
        }
        let provider = catalog.providers.iter().find(|p| *p.id == *r.provider);
        if let Some(p) = provider {
            if let Some(b) = p.budget.filter(|b| in_period(b.period, r.day)) {
                p.spend.add(b.period, now_s, cost);
            }
            let deployment = catalog.deployments.iter().find(|d| {
                d.provider == p.idx
                    && *d.upstream_model == *r.upstream_model
                    && d.model.is_some_and(|m| *catalog.model(m).name == *r.model)
            });
            if let Some(d) = deployment {
                if let Some(b) = d.budget.filter(|b| in_period(b.period, r.day)) {
                    d.spend.add(b.period, now_s, cost);
                }
            }
        }
        if let Some(b) = tables.global_budget.filter(|b| in_period(b.period, r.day)) {
            tables.global_spend.add(b.period, now_s, cost);
        }
    }
    crate::state::assume_stored(&tables);
    Ok(rows.len())
}

/// Downstream write coalescing: a response header and a small body leave in one segment.
const DOWNSTREAM_WRITE_BUFFER: usize = 1460;

/// How long a graceful shutdown or upgrade lets streams run on (`pingora.grace_period_seconds`):
/// a long reasoning-model stream runs for minutes. An idle process leaves at once anyway
/// ([`crate::lifecycle::DrainThenExit`]), so a long grace costs nothing when nothing streams.
pub const GRACE_PERIOD_SECONDS: u64 = 600;
/// After the grace period, how long the runtimes get to stop their tasks.
pub const GRACEFUL_SHUTDOWN_TIMEOUT_SECONDS: u64 = 10;
/// Idle upstream connections kept for reuse, across all providers. Pingora's 128 is small for
/// a gateway holding thousands of concurrent streams to a handful of hosts: each connection
/// dropped from the pool is a new TCP + TLS handshake on a later request's first byte.
pub const UPSTREAM_KEEPALIVE_POOL_SIZE: usize = 1024;
/// Downstream read buffer under TLS: rustls asks its transport for 4 KiB at a time; one
/// buffered read takes a whole 16 KiB record (plus header and tag) in one syscall.
const DOWNSTREAM_TLS_READ_BUFFER: usize = 16 * 1024 + 256;

/// Pingora's server settings from the `pingora:` section. Unset values keep Pingora's
/// defaults, except `threads` (all cores rather than one), `max_retries` (the ceiling of
/// `failover.max_attempts`: signalbox bounds attempts itself, so a reload that raises them
/// needs no restart), and the three above, chosen for LLM streams.
pub fn server_conf(config: &Config) -> ServerConf {
    let p = &config.pingora;
    let mut conf = ServerConf {
        threads: p.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        max_retries: crate::config::types::MAX_ATTEMPTS_CEILING as usize,
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
    conf.grace_period_seconds = Some(p.grace_period_seconds.unwrap_or(GRACE_PERIOD_SECONDS));
    conf.graceful_shutdown_timeout_seconds = Some(
        p.graceful_shutdown_timeout_seconds
            .unwrap_or(GRACEFUL_SHUTDOWN_TIMEOUT_SECONDS),
    );
    conf.upstream_keepalive_pool_size = p
        .upstream_keepalive_pool_size
        .unwrap_or(UPSTREAM_KEEPALIVE_POOL_SIZE);
    conf.ca_file.clone_from(&p.ca_file);
    conf
}

/// The proxy listener's TLS: rustls (TLS 1.2 and 1.3), the certificate from `store` at
/// every handshake, ALPN `h2` then `http/1.1`.
fn proxy_tls_settings(store: Arc<CertStore>) -> TlsSettings {
    // With a resolver set, Pingora ignores the certificate paths (`TlsSettings::build`), and
    // `intermediate` only records them: with the rustls backend it cannot fail.
    let mut tls = match TlsSettings::intermediate("", "") {
        Ok(tls) => tls,
        Err(e) => panic!("Pingora's TLS settings: {e}"),
    };
    tls.set_cert_resolver(store);
    tls.enable_h2();
    tls
}

/// Build the Pingora server with every service. The caller runs it.
pub fn build_server(
    config: &Config,
    state: Arc<GatewayState>,
    reloader: Arc<Reloader>,
    launch: Launch,
    accounts: Accounts,
) -> Server {
    let opt = Opt {
        upgrade: launch.upgrade,
        daemon: launch.daemon,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(config));
    server.bootstrap();

    // The hold path's own upstream pool, sized and configured like Pingora's.
    let hold_connector = Arc::new(Connector::new(Some(ConnectorOptions::from_server_conf(
        &server.configuration,
    ))));
    let mut proxy = pingora_proxy::http_proxy(
        &server.configuration,
        Gateway::new(
            state.router.clone(),
            state.metrics.clone(),
            hold_connector,
            accounts.ledger.clone(),
            accounts.shared.clone(),
        ),
    );
    // Cleartext HTTP/2: Pingora peeks for the HTTP/2 preface on each plaintext connection
    // and serves HTTP/1.1 when it is absent (on TLS it follows ALPN instead).
    if config.listen.h2c {
        let mut options = HttpServerOptions::default();
        options.h2c = true;
        proxy.server_options = Some(options);
    }
    // The edge owns each connection around Pingora's proxy (deadlines, refusals in
    // signalbox's words, keep-alive and pipelining): `crate::edge`.
    let mut proxy = Service::new(
        "signalbox proxy".to_string(),
        EdgeApp::new(
            proxy,
            state.router.clone(),
            state.metrics.http_refusals.clone(),
        ),
    );
    // The gateway's calls to its own models go to this listener (`crate::internal`).
    if let Err(why) = state
        .router
        .internal
        .set_listener(&config.listen.proxy, config.listen.proxy_tls.is_some())
    {
        log::warn!("internal calls are unavailable: {why}");
    }
    match &config.listen.proxy_tls {
        // Downstream reads go straight into Pingora's own header and body buffers: the default
        // 64 KiB read-ahead buffer per connection would be one more copy of every byte and 64 KiB
        // of memory per open stream (10,000 streams: 640 MiB).
        None => proxy.add_listener(
            ListenerConfig::tcp(&config.listen.proxy)
                .l4_buffer(L4BufferSettings::new(0, DOWNSTREAM_WRITE_BUFFER)),
        ),
        Some(tls) => {
            // The state's store, so that `reload_proxy_tls` reaches this listener (a state
            // not built by `build_state` has none: the listener then keeps its own).
            let store = state
                .proxy_tls
                .clone()
                .unwrap_or_else(|| Arc::new(CertStore::new(&tls.cert)));
            proxy.add_listener(
                ListenerConfig::tcp(&config.listen.proxy)
                    .tls(proxy_tls_settings(store))
                    .l4_buffer(L4BufferSettings::new(
                        DOWNSTREAM_TLS_READ_BUFFER,
                        DOWNSTREAM_WRITE_BUFFER,
                    )),
            );
        }
    }
    let mut admin = Service::new(
        "signalbox admin".to_string(),
        AdminApp::new(
            reloader.clone(),
            state.metrics.clone(),
            &config.listen.proxy,
            accounts.ledger.clone(),
        ),
    );
    admin.add_tcp(&config.listen.admin);

    let dns = background_service(
        "signalbox dns",
        DnsRefresher::new(state.router.clone(), REFRESH_INTERVAL),
    );
    let router = state.router.clone();
    let ranker = background_service(
        "signalbox ranker",
        RankerService::new(router.clone(), config.routing.rank_interval),
    );
    let connector = Arc::new(Connector::new(Some(ConnectorOptions::from_server_conf(
        &server.configuration,
    ))));
    let prober = Prober::new(
        state.health_source(),
        connector,
        state.metrics.probes.clone(),
    );
    let probes = background_service(
        "signalbox probes",
        ProbeService::new(prober, config.health.probe_interval),
    );

    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(dns);
    server.add_service(ranker);
    server.add_service(probes);
    server.add_service(background_service(
        "signalbox shared state",
        StateService(accounts.state.clone()),
    ));
    server.add_service(background_service(
        "signalbox reload on SIGHUP",
        ReloadOnHangup { reloader },
    ));
    server.add_service(background_service(
        "signalbox upgrade on SIGUSR2",
        UpgradeOnUser2::new(launch),
    ));
    server.add_service(background_service(
        "signalbox drain then exit",
        DrainThenExit {
            metrics: state.metrics.clone(),
            ledger: accounts.ledger,
            state: Some(accounts.state),
        },
    ));
    server
}
