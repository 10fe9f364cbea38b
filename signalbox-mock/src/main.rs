//! `signalbox-mock`: one or more mock LLM providers (OpenAI and Anthropic dialects) in one
//! process.
//!
//! Prints `signalbox-mock <name> listening on http://ADDR` (https under TLS) per listener once it
//! is bound, then serves until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use signalbox_mock::{Behaviour, MockConfig, MockHandle, MockServer, StreamShape, TlsFiles};

#[derive(Parser, Debug)]
#[command(
    name = "signalbox-mock",
    version,
    about = "Mock LLM provider (OpenAI and Anthropic dialects) for signalbox tests and load tests"
)]
struct Args {
    /// Address to listen on; repeat to serve several independent providers (named NAME-0, NAME-1, ...).
    #[arg(long = "listen", value_name = "ADDR", default_value = "127.0.0.1:9001")]
    listen: Vec<SocketAddr>,

    /// Provider name (x-mock-name header, /_mock/stats).
    #[arg(long, default_value = "mock")]
    name: String,

    /// SSE content chunks per streamed answer.
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,

    /// Pause between SSE events, in milliseconds.
    #[arg(long = "gap-ms", value_name = "DURATION_MS")]
    gap_ms: Option<u64>,

    /// Assistant reply text.
    #[arg(long, value_name = "TEXT")]
    reply: Option<String>,

    /// Default behaviour as JSON, e.g. '{"kind":"status","code":503}' or
    /// '{"kind":"inband_error_after","chunks":2,"error_type":"overloaded_error"}'.
    #[arg(long, value_name = "JSON", value_parser = parse_behaviour)]
    behaviour: Option<Behaviour>,

    /// A header field added to every response, `NAME: VALUE` (repeatable), e.g. a provider's
    /// `x-ratelimit-remaining-requests: 0`.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    header: Vec<String>,

    /// Do not record requests (for load tests).
    #[arg(long)]
    no_record: bool,

    /// Tokio worker threads (default: available parallelism).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,

    /// PEM certificate chain: serve HTTPS (requires --tls-key).
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// PEM private key (requires --tls-cert).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Answer with this `model` instead of echoing the request's (like a provider that reports
    /// a dated or shortened name).
    #[arg(long, value_name = "NAME")]
    echo_model: Option<String>,

    /// Require this provider key: `Authorization: Bearer KEY` on OpenAI endpoints, `x-api-key:
    /// KEY` on Anthropic ones (without it, Anthropic endpoints accept any non-empty x-api-key).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,

    /// A word that makes a moderation input flagged (repeatable; `mock-flagged` always does).
    #[arg(long = "flag-word", value_name = "WORD")]
    flag_words: Vec<String>,
}

fn parse_behaviour(s: &str) -> Result<Behaviour, String> {
    serde_json::from_str(s).map_err(|e| format!("invalid behaviour JSON: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();

    let threads = args.threads.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("signalbox-mock: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("signalbox-mock: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> std::io::Result<()> {
    let defaults = MockConfig::default();
    let base = MockConfig {
        name: args.name.clone(),
        default_behaviour: args.behaviour.unwrap_or(defaults.default_behaviour),
        stream: StreamShape {
            chunks: args.chunks.unwrap_or(defaults.stream.chunks),
            gap: args
                .gap_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.stream.gap),
        },
        reply: args.reply.unwrap_or(defaults.reply),
        record: !args.no_record,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert_chain_pem), Some(key_pem)) => Some(TlsFiles {
                cert_chain_pem,
                key_pem,
            }),
            _ => None,
        },
        // An escaped JSON string's content: a name a provider could send.
        echo_model: args
            .echo_model
            .map(|n| serde_json::to_string(&n).map_or(n, |s| s[1..s.len() - 1].to_string())),
        api_key: args.api_key,
        response_headers: args
            .header
            .iter()
            .filter_map(|h| h.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
        flag_words: args.flag_words.clone(),
        key_quotas: Vec::new(),
    };
    // Install the signal handlers before announcing anything: a script may signal as soon as it
    // reads the first "listening" line.
    let signals = Signals::new()?;
    let scheme = if base.tls.is_some() { "https" } else { "http" };
    let several = args.listen.len() > 1;
    let mut handles: Vec<MockHandle> = Vec::with_capacity(args.listen.len());
    for (i, addr) in args.listen.iter().enumerate() {
        let name = if several {
            format!("{}-{i}", args.name)
        } else {
            args.name.clone()
        };
        let config = MockConfig {
            name: name.clone(),
            ..base.clone()
        };
        let handle = MockServer::start(*addr, config)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start on {addr}: {e}")))?;
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "signalbox-mock {name} listening on {scheme}://{}",
            handle.addr()
        )?;
        stdout.flush()?;
        handles.push(handle);
    }

    signals.wait().await;
    tracing::info!("signalbox-mock: shutting down");
    for handle in &handles {
        handle.shutdown();
    }
    Ok(())
}

/// SIGINT / SIGTERM, registered up front.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    #[cfg(unix)]
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    #[cfg(unix)]
    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    #[cfg(not(unix))]
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {})
    }

    #[cfg(not(unix))]
    async fn wait(self) {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot wait for ctrl-c");
            std::future::pending::<()>().await;
        }
    }
}
