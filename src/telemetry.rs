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
    // The cap only matters when something more verbose than `info` is on; adding it
    // otherwise would raise a stricter `RUST_LOG=warn` back to `info` for Pingora.
    let verbose = EnvFilter::try_new(&user)
        .ok()
        .and_then(|f| f.max_level_hint())
        .is_none_or(|max| max > tracing::level_filters::LevelFilter::INFO);
    let directives = if verbose {
        format!("{user},{PINGORA_CAP}")
    } else {
        user
    };
    let filter = EnvFilter::try_new(directives)
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{PINGORA_CAP}")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true)
        .try_init();
}
