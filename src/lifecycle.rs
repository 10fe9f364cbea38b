//! The process's life around serving: re-reading the config on `SIGHUP`, handing the
//! listeners to a new binary on `SIGUSR2`, and leaving as soon as a shutdown has drained.
//!
//! Pingora owns the primitives. `-u` makes a starting process take the listening sockets of a
//! running one over `pingora.upgrade_sock`; `SIGQUIT` makes the running one send them, keep
//! accepting for five more seconds, then stop accepting and drain; a graceful shutdown
//! (`SIGQUIT` or `SIGTERM`) then waits `pingora.grace_period_seconds` before it stops its
//! runtimes. Two things a service manager needs are missing, and live here:
//!
//! - `SIGUSR2` runs the whole upgrade from inside the service: check that the binary now at
//!   the path this process was started from accepts the config (`-t`), start it with `-u` (and
//!   `-d` when this process is a daemon), then `SIGQUIT` ourselves. The new process is our
//!   child, so it stays in the service's cgroup, and under systemd's `Type=forking` its PID
//!   file takes over as the main PID when we exit. `systemd/signalbox.service` documents it.
//! - Pingora's grace period is a fixed sleep: with a grace long enough for an LLM stream,
//!   every stop or upgrade would take that long even when idle. [`DrainThenExit`] ends the
//!   process once a shutdown has begun and no request has been in flight for a moment.
//! - Pingora retries a listener that cannot bind, then panics in that service's thread while
//!   the other services (the admin API, `/healthz`) keep the process alive.
//!   [`check_listeners`] binds each address first, so a taken port is one line and a non-zero
//!   exit before anything starts.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};

use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::reload::Reloader;
use crate::state::StateSync;

/// Can this process listen on every configured address? Each is bound (with `SO_REUSEADDR`,
/// as Pingora binds) and released at once; the first that cannot be is named with the cause:
/// `cannot listen on 0.0.0.0:8080 (listen.proxy): Address in use (os error 98)`. Skipped by
/// a process started with `-u`, which takes the running one's sockets instead.
pub fn check_listeners(listen: &crate::config::Listen) -> Result<(), String> {
    for (addr, key) in [
        (&listen.proxy, "listen.proxy"),
        (&listen.admin, "listen.admin"),
    ] {
        bind_once(addr).map_err(|e| format!("cannot listen on {addr} ({key}): {e}"))?;
    }
    Ok(())
}

fn bind_once(addr: &str) -> std::io::Result<()> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for sa in addr.to_socket_addrs()? {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(sa),
            socket2::Type::STREAM,
            None,
        )?;
        socket.set_reuse_address(true)?;
        match socket.bind(&sa.into()).and_then(|()| socket.listen(1)) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")))
}

/// How this process was started: what a `SIGUSR2` upgrade starts again.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The binary's path as started (a new build installed there is what an upgrade runs).
    pub exe: Option<PathBuf>,
    /// The config file, absolute (a daemon's working directory is `/`).
    pub conf: PathBuf,
    /// `-d`: the new process daemonizes too.
    pub daemon: bool,
    /// `-u`: this process took its listeners from another.
    pub upgrade: bool,
}

/// `SIGHUP`: re-read the config file and apply it (health kept), as `POST /admin/reload` does.
pub struct ReloadOnHangup {
    pub reloader: Arc<Reloader>,
}

#[async_trait::async_trait]
impl BackgroundService for ReloadOnHangup {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Ok(mut hangup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: reload with POST /admin/reload");
            return;
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = hangup.recv() => {
                    let reloader = self.reloader.clone();
                    // Outcomes are logged and counted by the reloader itself.
                    let _ = tokio::task::spawn_blocking(move || reloader.reload_file()).await;
                }
            }
        }
    }
}

/// `SIGUSR2`: upgrade to the binary now installed at [`Launch::exe`], without refusing a
/// connection or cutting a stream.
pub struct UpgradeOnUser2 {
    upgrader: Arc<Upgrader>,
}

impl UpgradeOnUser2 {
    pub fn new(launch: Launch) -> Self {
        Self {
            upgrader: Arc::new(Upgrader {
                launch,
                started: AtomicBool::new(false),
            }),
        }
    }
}

struct Upgrader {
    launch: Launch,
    /// Set once an upgrade has started: the listeners can be handed over once.
    started: AtomicBool,
}

impl Upgrader {
    /// Check, start the new process, hand over. Blocking (runs the new binary's `-t`).
    fn upgrade(&self) {
        let Some(exe) = &self.launch.exe else {
            tracing::error!("upgrade refused: the path of this binary is unknown");
            return;
        };
        let conf = &self.launch.conf;
        match Command::new(exe)
            .arg("-t")
            .arg("-c")
            .arg(conf)
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let said = String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .replace('\n', "; ");
                tracing::error!(binary = %exe.display(), said = %said, "upgrade refused: the new binary rejects the config; this process keeps serving");
                return;
            }
            Err(e) => {
                tracing::error!(binary = %exe.display(), error = %e, "upgrade refused: cannot run the new binary");
                return;
            }
        }
        if self.started.swap(true, Ordering::AcqRel) {
            tracing::warn!("upgrade already under way");
            return;
        }
        let mut cmd = Command::new(exe);
        cmd.arg("-u").arg("-c").arg(conf).stdin(Stdio::null());
        if self.launch.daemon {
            cmd.arg("-d");
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                self.started.store(false, Ordering::Release);
                tracing::error!(binary = %exe.display(), error = %e, "upgrade failed: cannot start the new binary; this process keeps serving");
                return;
            }
        };
        tracing::info!(
            pid = child.id(),
            binary = %exe.display(),
            "upgrade: new process started; handing it the listeners"
        );
        if self.launch.daemon {
            // The process we started forks the daemon and exits: reap it.
            std::thread::spawn(move || child.wait());
        }
        // Pingora's SIGQUIT handler sends the listening sockets to the new process (retrying
        // while it comes up), then drains this one.
        if let Err(e) = nix::sys::signal::raise(nix::sys::signal::Signal::SIGQUIT) {
            tracing::error!(error = %e, "upgrade: cannot signal this process to hand over its listeners");
        }
    }
}

#[async_trait::async_trait]
impl BackgroundService for UpgradeOnUser2 {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Ok(mut user2) = signal(SignalKind::user_defined2()) else {
            tracing::warn!("cannot listen for SIGUSR2: upgrade with `-u` and SIGQUIT");
            return;
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = user2.recv() => {
                    let upgrader = self.upgrader.clone();
                    let _ = tokio::task::spawn_blocking(move || upgrader.upgrade()).await;
                }
            }
        }
    }
}

/// Once a graceful shutdown has begun (the listeners no longer accept), exit as soon as no
/// request has been in flight for [`DrainThenExit::QUIET`], instead of sleeping out the whole
/// grace period. Streams still running keep the process up until they end or the grace
/// period does.
pub struct DrainThenExit {
    pub metrics: Arc<Metrics>,
    /// Written out before the process leaves (every row of the drained requests).
    pub ledger: Option<Arc<Ledger>>,
    /// Pushed once more before the process leaves, so the other replicas keep its counts.
    pub state: Option<Arc<StateSync>>,
}

impl DrainThenExit {
    /// How long the process must be idle before it leaves: covers a connection accepted just
    /// before the listeners closed whose request has not been read yet.
    pub const QUIET: Duration = Duration::from_secs(1);
    const TICK: Duration = Duration::from_millis(50);
    /// How long the ledger may take to write its queue on the way out.
    const FLUSH: Duration = Duration::from_secs(10);
}

#[async_trait::async_trait]
impl BackgroundService for DrainThenExit {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        tracing::info!(
            in_flight = self.metrics.in_flight.get(),
            "shutting down: draining requests in flight"
        );
        let mut quiet = Duration::ZERO;
        loop {
            tokio::time::sleep(Self::TICK).await;
            if self.metrics.in_flight.get() > 0 {
                quiet = Duration::ZERO;
                continue;
            }
            quiet += Self::TICK;
            if quiet >= Self::QUIET {
                if let Some(state) = &self.state {
                    let _ = state.sync_once().await;
                }
                if let Some(ledger) = self.ledger.clone() {
                    // The writer commits what the drained requests queued, then stops.
                    let _ = tokio::task::spawn_blocking(move || ledger.close(Self::FLUSH)).await;
                }
                tracing::info!("drained: exiting");
                std::process::exit(0);
            }
        }
    }
}
