//! Shared harness for the integration tests: mock providers in-process, the real `signalbox`
//! binary as a child process on ephemeral loopback ports, and a few client helpers.
//!
//! The gateway runs as a process (not in-process) because Pingora owns its process: signals,
//! `run_forever`, and its own runtimes. Readiness is the admin `/healthz` answering, polled
//! with a deadline, never a fixed sleep.

#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use signalbox_mock::{Behaviour, MockConfig, MockHandle, MockServer, StreamShape};

pub mod pki;

/// A test that needs a service this machine lacks (Redis, PostgreSQL, curl with HTTP/2):
/// skipped with a note on a developer's machine, failed in CI, where `.ci/run` installs every
/// such service and sets `SIGNALBOX_CI=1`, so a missing one is never a silent pass there.
pub fn skip_unless_ci(why: &str) {
    assert!(
        std::env::var_os("SIGNALBOX_CI").is_none(),
        "SIGNALBOX_CI is set and {why}: .ci/run installs it, so this test may not skip"
    );
    eprintln!("skipped: {why} (SIGNALBOX_CI unset; .ci/run installs it)");
}

/// Run `cmd` to completion, killed if it takes longer than `limit`.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let expired = finished.recv_timeout(limit) == Err(RecvTimeoutError::Timeout);
        if expired {
            // Not reaped yet: `wait_with_output` below is still waiting for it.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        expired
    });
    let out = child.wait_with_output().unwrap();
    drop(done);
    let expired = watchdog.join().unwrap();
    assert!(
        !expired,
        "{cmd:?} ran longer than {limit:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A free loopback port (bound then released; the gateway binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback port where nothing listens: connects are refused.
pub fn refused_port() -> u16 {
    free_port()
}

/// A mock provider with a name.
pub async fn mock(name: &str) -> MockHandle {
    mock_with(name, |_| {}).await
}

pub async fn mock_with(name: &str, f: impl FnOnce(&mut MockConfig)) -> MockHandle {
    let mut config = MockConfig {
        name: name.to_string(),
        stream: StreamShape {
            chunks: 3,
            gap: Duration::ZERO,
        },
        ..MockConfig::default()
    };
    f(&mut config);
    MockServer::start("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap()
}

/// A listener that never completes a TCP handshake for new connections: its accept queue is
/// full (backlog 0, filled by held connections), so further SYNs are dropped and connects to
/// it time out. Loopback only.
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: socket2::Socket,
    _held: Vec<std::net::TcpStream>,
}

impl Blackhole {
    pub fn new() -> Self {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        s.listen(0).unwrap();
        let addr = s.local_addr().unwrap().as_socket().unwrap();
        let mut held = Vec::new();
        // Fill the accept queue; the kernel allows backlog + 1 pending connections.
        for _ in 0..4 {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
        Self {
            addr,
            _listener: s,
            _held: held,
        }
    }
}

/// A running gateway process.
pub struct Gateway {
    child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    stderr_path: PathBuf,
}

pub struct GatewayBuilder {
    config: String,
    env: Vec<(String, String)>,
    file_name: String,
    listen: Option<(SocketAddr, SocketAddr)>,
    fd_limit: Option<u32>,
    verbatim: bool,
    grace: u64,
    listen_extra: String,
}

impl GatewayBuilder {
    /// `config` is YAML without `listen:` and `pingora:`; the harness adds both.
    pub fn new(config: impl Into<String>) -> Self {
        Self {
            config: config.into(),
            env: Vec::new(),
            file_name: "signalbox.yaml".to_string(),
            listen: None,
            fd_limit: None,
            verbatim: false,
            grace: 0,
            listen_extra: String::new(),
        }
    }

    /// More `listen:` keys beside the addresses the harness writes, as YAML flow mapping
    /// entries (e.g. `h2c: true`, `proxy_tls: { cert_file: …, key_file: … }`).
    pub fn listen_keys(mut self, keys: &str) -> Self {
        self.listen_extra = format!(", {keys}");
        self
    }

    /// Write the config as given (it names its own listeners: see `listening_on`).
    pub fn verbatim(mut self) -> Self {
        self.verbatim = true;
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Write the config with this file name (e.g. `x.json` for a JSON config).
    pub fn file_name(mut self, name: &str) -> Self {
        self.file_name = name.to_string();
        self
    }

    /// Run the gateway with this open-files limit (`ulimit -n`).
    pub fn fd_limit(mut self, n: u32) -> Self {
        self.fd_limit = Some(n);
        self
    }

    /// `pingora.grace_period_seconds` (the harness default is 0: tests end with a kill).
    pub fn grace(mut self, seconds: u64) -> Self {
        self.grace = seconds;
        self
    }

    /// The listeners the config itself names (for configs written whole, like JSON ones).
    pub fn listening_on(mut self, proxy: u16, admin: u16) -> Self {
        self.listen = Some((
            SocketAddr::from(([127, 0, 0, 1], proxy)),
            SocketAddr::from(([127, 0, 0, 1], admin)),
        ));
        self
    }

    pub fn start(self) -> Gateway {
        // Ports are picked free and released before the gateway binds them, so a mock (or
        // another test's gateway) starting at the same moment can take one first: then the
        // gateway cannot bind, or its "proxy" answers as someone else. Such a start is retried
        // on fresh ports.
        let mut tries = 0;
        loop {
            tries += 1;
            match self.try_start() {
                Ok(gw) => return gw,
                Err(Start::Collided(why)) if self.listen.is_none() && tries < 5 => {
                    eprintln!("gateway start collided on a port ({why}); retrying");
                }
                Err(Start::Collided(why) | Start::Failed(why)) => panic!("{why}"),
            }
        }
    }

    fn try_start(&self) -> Result<Gateway, Start> {
        let dir = tempfile::tempdir().unwrap();
        let (proxy, admin) = self.listen.unwrap_or_else(|| {
            (
                SocketAddr::from(([127, 0, 0, 1], free_port())),
                SocketAddr::from(([127, 0, 0, 1], free_port())),
            )
        });
        let text = if self.verbatim || self.file_name.ends_with(".json") {
            self.config.clone()
        } else {
            format!(
                "listen: {{ proxy: \"{proxy}\", admin: \"{admin}\"{} }}\n\
                 pingora: {{ threads: 2, pid_file: \"{pid}\", upgrade_sock: \"{sock}\", grace_period_seconds: {grace}, graceful_shutdown_timeout_seconds: 1 }}\n{}",
                self.listen_extra,
                self.config,
                grace = self.grace,
                pid = dir.path().join("pid").display(),
                sock = dir.path().join("upgrade.sock").display(),
            )
        };
        let path = dir.path().join(&self.file_name);
        std::fs::write(&path, text).unwrap();
        let stderr_path = dir.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = match self.fd_limit {
            None => Command::new(env!("CARGO_BIN_EXE_signalbox")),
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_signalbox"));
                c
            }
        };
        cmd.arg("-c")
            .arg(&path)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(stderr);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let mut gw = Gateway {
            child,
            proxy,
            admin,
            dir,
            stderr_path,
        };
        // A plain-HTTP proxy listener can be asked who it is.
        let plain = self.listen_extra.is_empty() && !self.verbatim;
        gw.wait_ready(plain)?;
        Ok(gw)
    }
}

/// The inode of the socket listening on `addr` (IPv4 loopback), from `/proc/net/tcp`.
fn listening_inode(addr: SocketAddr) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let want = format!(":{:04X}", addr.port());
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (local, state, inode) = (cols.get(1)?, cols.get(3)?, cols.get(9)?);
        (local.ends_with(&want) && *state == "0A")
            .then(|| inode.parse().ok())
            .flatten()
    })
}

/// Whether process `pid` holds the socket listening on `addr` (its `/proc/PID/fd` links to
/// it): a port taken by someone else first is not the gateway's.
fn listens_on(pid: u32, addr: SocketAddr) -> bool {
    let Some(inode) = listening_inode(addr) else {
        return false;
    };
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy() == want)
        })
    })
}

/// Why a gateway did not start.
enum Start {
    /// One of its ports was taken by someone else: worth another try on fresh ports.
    Collided(String),
    Failed(String),
}

impl Gateway {
    pub fn start(config: impl Into<String>) -> Self {
        GatewayBuilder::new(config).start()
    }

    /// Wait until the admin listener answers and the proxy listener accepts (and, when `ask`,
    /// is this process's own socket, not another's that took the port first).
    fn wait_ready(&mut self, ask: bool) -> Result<(), Start> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = self.stderr();
                let why = format!("gateway exited during startup ({status}):\n{log}");
                return Err(if log.contains("in use") {
                    Start::Collided(why)
                } else {
                    Start::Failed(why)
                });
            }
            let admin_up = http_get_blocking(self.admin, "/healthz").is_some_and(|(s, _)| s == 200);
            let proxy_up =
                std::net::TcpStream::connect_timeout(&self.proxy, Duration::from_millis(100))
                    .is_ok();
            if admin_up && proxy_up {
                if !ask || listens_on(self.child.id(), self.proxy) {
                    return Ok(());
                }
                if listening_inode(self.proxy).is_some() {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(Start::Collided(format!(
                        "the proxy port {} is another process's",
                        self.proxy
                    )));
                }
            }
            if Instant::now() >= deadline {
                let why = format!("gateway not ready:\n{}", self.stderr());
                return Err(if self.stderr().contains("in use") {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    Start::Collided(why)
                } else {
                    Start::Failed(why)
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy)
    }

    pub fn stderr(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.stderr_path) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// The admin `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The metrics once every line in `lines` is present. Metrics are recorded in the
    /// request's `logging` phase, just after the response is written, so a scrape right after
    /// a response may precede them: poll, with a deadline.
    pub async fn metrics_with(&self, lines: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let m = self.metrics().await;
            if lines.iter().all(|l| m.contains(l)) || Instant::now() > deadline {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The JSON access line (`log: { format: json }`) of the request with this id, once it
    /// is written (it follows the response: polled, with a deadline).
    pub async fn json_access_line(&self, request_id: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.stderr();
            // Complete lines only: the gateway may be writing the last one as it is read.
            let done = log.rsplit_once('\n').map_or("", |(d, _)| d);
            if let Some(v) = done
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["target"] == "access" && v["request_id"] == request_id)
            {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "no access line for {request_id}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The log once it contains `needle` (or the deadline passed).
    pub async fn stderr_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.stderr();
            if s.contains(needle) || Instant::now() > deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Wait until no credential is cooling (tests that turn breakers off still cool a key for
    /// a millisecond after a 401/403/429).
    pub async fn wait_credentials_usable(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let h: serde_json::Value = reqwest::get(format!("http://{}/admin/health", self.admin))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let cooling = h["credentials"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| !c["cooling"].is_null()));
            if !cooling {
                return;
            }
            assert!(Instant::now() < deadline, "credentials still cooling: {h}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub fn config_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The config file the gateway runs on.
    pub fn config_path(&self) -> PathBuf {
        let dir = self.dir.path();
        ["signalbox.yaml", "signalbox.json"]
            .iter()
            .map(|n| dir.join(n))
            .find(|p| p.exists())
            .unwrap_or_else(|| dir.join("signalbox.yaml"))
    }

    /// Send a signal to the gateway process (`HUP`, `QUIT`, ...).
    pub fn signal(&self, name: &str) {
        signal_pid(self.child.id(), name);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait (with a deadline) for the gateway process to exit by itself; its status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of the process answering `/healthz` (during an upgrade: the old or the new).
    pub fn serving_pid(&self) -> Option<u32> {
        http_get_blocking(self.admin, "/healthz")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|v| v["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok())
    }

    /// Start a second gateway on the same config in upgrade mode (`-u`): it waits on the
    /// upgrade socket for this one's listeners (sent on `SIGQUIT`).
    pub fn spawn_upgrade(&self) -> Upgraded {
        let stderr_path = self.dir.path().join("stderr-upgraded.log");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_signalbox"))
            .arg("-u")
            .arg("-c")
            .arg(self.config_path())
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        Upgraded { child, stderr_path }
    }

    /// The config generation `/healthz` reports.
    pub fn generation(&self) -> u64 {
        http_get_blocking(self.admin, "/healthz")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|v| v["config_generation"].as_u64())
            .unwrap_or(0)
    }

    /// Wait until the config generation reaches `n` (a reload was applied).
    pub async fn wait_generation(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.generation() < n {
            assert!(
                Instant::now() < deadline,
                "config generation stuck at {}:\n{}",
                self.generation(),
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Send a signal (`HUP`, `QUIT`, `USR2`, ...) to a process.
pub fn signal_pid(pid: u32, name: &str) {
    use nix::sys::signal::{kill, Signal};
    let signal: Signal = format!("SIG{name}").parse().unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    kill(pid, signal).unwrap_or_else(|e| panic!("kill -{name} {pid}: {e}"));
}

/// A gateway started in upgrade mode by a test; killed when dropped.
pub struct Upgraded {
    pub child: Child,
    stderr_path: PathBuf,
}

impl Upgraded {
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for Upgraded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process the test did not start itself (a gateway's own upgrade child): killed when
/// dropped.
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Already gone is fine.
        if let Ok(pid) = i32::try_from(self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Minimal blocking GET for readiness checks.
pub fn http_get_blocking(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// A provider section pointing at a mock.
pub fn provider(id: &str, m: &MockHandle) -> String {
    format!(
        "  {id}: {{ kind: openai, base_url: \"{}\" }}\n",
        m.base_url()
    )
}

/// A chat body.
pub fn chat(model: &str) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}]
    })
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POST a JSON body to the gateway's chat endpoint.
pub async fn post_chat(gw: &Gateway, body: &serde_json::Value) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The whole body as text, and whether it ended with a transport error (a stream cut short).
pub async fn read_all(mut r: reqwest::Response) -> (String, bool) {
    let mut text = String::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => return (text, false),
            Err(_) => return (text, true),
        }
    }
}

/// An admin endpoint's JSON (`/admin/health`, `/admin/usage?…`).
pub async fn admin_json(gw: &Gateway, path: &str) -> serde_json::Value {
    reqwest::get(format!("http://{}{path}", gw.admin))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// What an admin endpoint answers a JSON body with (`/admin/explain`, say).
pub async fn admin_post_json(
    gw: &Gateway,
    path: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    client()
        .post(format!("http://{}{path}", gw.admin))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Assert a response is an OpenAI-shaped error with `code`, and return its JSON.
pub async fn expect_error(r: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(r.status().as_u16(), status, "status");
    let text = r.text().await.unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    assert_eq!(v["error"]["code"], code, "{text}");
    assert!(v["error"]["message"].is_string(), "{text}");
    assert!(v["error"]["type"].is_string(), "{text}");
    v
}

pub fn status(code: u16) -> Behaviour {
    Behaviour::Status {
        code,
        retry_after: None,
        body: None,
    }
}

pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(b);
    d.iter().map(|x| format!("{x:02x}")).collect()
}

/// A provider kind as the tests configure it, with what the mock does for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    OpenAi,
    Anthropic,
}

impl Kind {
    /// Its `kind:` in a config.
    pub fn name(self) -> &'static str {
        match self {
            Kind::OpenAi => "openai",
            Kind::Anthropic => "anthropic",
        }
    }

    /// The other dialect.
    pub fn other(self) -> Kind {
        match self {
            Kind::OpenAi => Kind::Anthropic,
            Kind::Anthropic => Kind::OpenAi,
        }
    }

    /// The mock endpoint a provider of this kind is called on.
    pub fn endpoint(self) -> signalbox_mock::Endpoint {
        match self {
            Kind::OpenAi => signalbox_mock::Endpoint::ChatCompletions,
            Kind::Anthropic => signalbox_mock::Endpoint::Messages,
        }
    }

    /// How the mock names its tool calls in this dialect (ids pass through the gateway).
    pub fn tool_id_prefix(self) -> &'static str {
        match self {
            Kind::OpenAi => "call_mock_",
            Kind::Anthropic => "toolu_mock_",
        }
    }
}

/// A GET's JSON answer (`/v1/models`, ...).
pub async fn get_json(gw: &Gateway, path: &str) -> serde_json::Value {
    client()
        .get(gw.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
