//! Logging: a `tracing` subscriber on stderr, with Pingora's `log` output bridged into it.
//!
//! `RUST_LOG` chooses levels (default `info`). Pingora's own crates are capped at `info`
//! whatever `RUST_LOG` says: at `debug` they print whole request headers, and those carry
//! provider credentials after the rewrite.

use tracing_subscriber::EnvFilter;

const PINGORA_CAP: &str =
    "pingora=info,pingora_core=info,pingora_proxy=info,pingora_pool=info,pingora_http=info";

pub fn init() {
    let user = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string());
    let filter = EnvFilter::try_new(format!("{user},{PINGORA_CAP}"))
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{PINGORA_CAP}")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true)
        .try_init();
}
