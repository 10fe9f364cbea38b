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
    /// Print the plan a request would get, without calling any provider: the route and how
    /// it was chosen, every candidate kept or skipped with its reason, the attempt order.
    Explain {
        /// The `model` string a caller would send (replaces the body's `model`).
        model: Option<String>,
        /// A request header, `NAME:VALUE` (`x-llm-route`, `x-llm-router`, `x-llm-metadata`);
        /// repeat for several.
        #[arg(long = "header", value_name = "NAME:VALUE")]
        headers: Vec<String>,
        /// A file holding the request body as a caller would send it (default: a one-message
        /// chat request).
        #[arg(long = "body", value_name = "FILE")]
        body: Option<PathBuf>,
        /// Print the explanation as JSON (as `POST /admin/explain` answers).
        #[arg(long)]
        json: bool,
        /// The endpoint the request is sent to (`/v1/chat/completions`, `/v1/messages`, ...):
        /// it decides which providers can serve it.
        #[arg(long, value_name = "PATH", default_value = "/v1/chat/completions")]
        endpoint: String,
        /// Explain as this client key (by its `id`): its scope, routing and budget facts.
        #[arg(long, value_name = "ID")]
        key: Option<String>,
        /// Explain for a caller whose budget is this far spent (`budget.used_pct`), as a
        /// caller that does not exist yet (or replacing `--key`'s).
        #[arg(long = "budget-used-pct", value_name = "N")]
        budget_used_pct: Option<f64>,
        /// Explain for a caller whose `allowed_models` are these globs (repeat for several).
        #[arg(long = "allowed-model", value_name = "GLOB")]
        allowed_models: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Absolute before anything else: a daemon's working directory is `/`, and a `SIGUSR2`
    // upgrade runs the binary installed where this one was started from.
    let conf = std::fs::canonicalize(&cli.conf).unwrap_or_else(|_| cli.conf.clone());
    let exe = std::env::current_exe().ok();

    // Config errors are printed plainly; logging starts once the config says how to log.
    let loaded = match signalbox::reload::load(&conf) {
        Ok(l) => l,
        Err(signalbox::reload::ReloadError::Invalid(errors)) => {
            eprintln!("signalbox: {} is invalid:", cli.conf.display());
            for e in &errors.0 {
                eprintln!("  {e}");
            }
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("signalbox: {}", e.summary());
            return ExitCode::from(2);
        }
    };
    let config = &loaded.config;
    signalbox::telemetry::init(config.log.format);
    let (state, warnings) = match signalbox::server::build_state(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "signalbox: {}",
                signalbox::secret::redact_urls(&e.to_string())
            );
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
    if let Some(Command::Explain {
        model,
        headers,
        body,
        json,
        endpoint,
        key,
        budget_used_pct,
        allowed_models,
    }) = &cli.command
    {
        let caller = signalbox::snapshot::explain::Caller {
            key: key.as_deref(),
            budget_used_pct: *budget_used_pct,
            allowed_models: (!allowed_models.is_empty()).then_some(allowed_models.as_slice()),
        };
        let Some(surface) = signalbox::catalog::surface::Surface::from_path(endpoint) else {
            eprintln!("signalbox: --endpoint {endpoint:?} is not an endpoint signalbox serves");
            return ExitCode::from(2);
        };
        return explain(
            &state.router,
            surface,
            model.as_deref(),
            headers,
            body.as_deref(),
            *json,
            caller,
        );
    }

    tracing::info!(
        proxy = %config.listen.proxy,
        admin = %config.listen.admin,
        providers = config.providers.len(),
        models = config.models.len(),
        "signalbox starting"
    );
    let reloader = std::sync::Arc::new(signalbox::reload::Reloader::new(
        &conf,
        loaded,
        state.router.clone(),
        state.metrics.clone(),
        state.proxy_tls.clone(),
    ));
    let config = &reloader.current().config;
    let launch = signalbox::lifecycle::Launch {
        exe,
        conf,
        daemon: cli.daemon,
        upgrade: cli.upgrade,
    };
    if !launch.upgrade {
        if let Err(e) = signalbox::lifecycle::check_listeners(&config.listen) {
            eprintln!("signalbox: {e}");
            return ExitCode::from(1);
        }
    }
    let accounts = match signalbox::server::open_accounts(config, &state, launch.conf.parent()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "signalbox: {}",
                signalbox::secret::redact_urls(&e.to_string())
            );
            return ExitCode::from(2);
        }
    };
    let server = signalbox::server::build_server(config, state, reloader.clone(), launch, accounts);
    server.run_forever()
}

/// `signalbox explain`: build the request, explain it, print the answer.
fn explain(
    router: &signalbox::snapshot::Runtime,
    surface: signalbox::catalog::surface::Surface,
    model: Option<&str>,
    headers: &[String],
    body: Option<&std::path::Path>,
    json: bool,
    caller: signalbox::snapshot::explain::Caller<'_>,
) -> ExitCode {
    let mut request: serde_json::Value = match body {
        None => serde_json::json!({ "messages": [{ "role": "user", "content": "Say hello." }] }),
        Some(path) => match std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                eprintln!("signalbox: cannot read the body {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    if let (Some(model), Some(obj)) = (model, request.as_object_mut()) {
        obj.insert("model".to_string(), serde_json::Value::from(model));
    }
    let mut pairs = Vec::with_capacity(headers.len());
    for h in headers {
        let Some((name, value)) = h.split_once(':') else {
            eprintln!("signalbox: --header {h:?}: write it NAME:VALUE");
            return ExitCode::from(2);
        };
        pairs.push((
            name.trim().to_ascii_lowercase(),
            value.trim().as_bytes().to_vec(),
        ));
    }
    let answer = signalbox::snapshot::explain::explain(
        router,
        surface,
        bytes::Bytes::from(request.to_string()),
        |name| {
            pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_slice())
        },
        caller,
    );
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&answer).unwrap_or_default()
        );
    } else {
        print!("{}", signalbox::snapshot::explain::render_text(&answer));
    }
    ExitCode::SUCCESS
}
