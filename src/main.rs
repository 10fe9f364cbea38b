//! `signalbox`: parse flags, load and validate the config, build the services, run.
//! A bad config exits non-zero before any socket is bound.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc: returns freed memory to the system on its own (decay), so a burst of
/// concurrent streams does not leave the process at its peak size; measured against glibc
/// malloc in `load-tests/` (scenario f).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(name = "signalbox", version, about = "An LLM gateway on Pingora")]
struct Cli {
    /// The config file (YAML or JSON).
    #[arg(
        short = 'c',
        long = "conf",
        default_value = "conf/signalbox.yaml",
        global = true
    )]
    conf: PathBuf,
    /// Validate the config, list every error, and exit (non-zero if invalid).
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Run in the background (Pingora daemon mode).
    #[arg(short = 'd', long = "daemon")]
    daemon: bool,
    /// Take over the listening sockets of a running instance (Pingora graceful upgrade).
    #[arg(short = 'u', long = "upgrade")]
    upgrade: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the plan a request naming MODEL would get, without calling any provider.
    Explain {
        /// The `model` string a caller would send.
        model: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    signalbox::telemetry::init();

    let config = match signalbox::config::load(&cli.conf) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("signalbox: {} is invalid:", cli.conf.display());
            for e in &errors.0 {
                eprintln!("  {e}");
            }
            return ExitCode::from(2);
        }
    };
    let (state, warnings) = match signalbox::server::build_state(&config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("signalbox: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.test {
        println!("signalbox: {} is valid", cli.conf.display());
        for w in &warnings {
            println!("  warning: {}", w.0);
        }
        return ExitCode::SUCCESS;
    }
    for w in &warnings {
        tracing::warn!("{}", w.0);
    }
    if let Some(Command::Explain { model }) = &cli.command {
        print!(
            "{}",
            signalbox::routing::explain::explain(&state.router, model)
        );
        return ExitCode::SUCCESS;
    }

    tracing::info!(
        proxy = %config.listen.proxy,
        admin = %config.listen.admin,
        providers = config.providers.len(),
        models = config.models.len(),
        "signalbox starting"
    );
    let server = signalbox::server::build_server(&config, state, cli.upgrade, cli.daemon);
    server.run_forever()
}
