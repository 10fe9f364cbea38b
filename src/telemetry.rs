//! Logging: a `tracing` subscriber on stderr, with Pingora's `log` output bridged into it.
//!
//! `RUST_LOG` chooses levels (default `info`). Pingora's own crates are capped at `info`
//! whatever `RUST_LOG` says: at `debug` they print whole request headers, and those carry
//! provider credentials after the rewrite.
//!
//! The config's `log.format` chooses the line format: `text` (`key=value` fields after the
//! message) or `json` (one object per line, the event's fields at the top level beside
//! `timestamp`, `level` and `target`). `main` installs the subscriber once the config is
//! read, so the format applies to every line; config errors before that are printed plainly.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

const PINGORA_CAP: &str =
    "pingora=info,pingora_core=info,pingora_proxy=info,pingora_pool=info,pingora_http=info";

/// Install the process-wide subscriber (a second call does nothing).
pub fn init(format: LogFormat) {
    let filter = filter();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_ansi(false)
            .try_init(),
    };
}

fn filter() -> EnvFilter {
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
    EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new(format!("info,{PINGORA_CAP}")))
}
