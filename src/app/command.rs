//! The binary's body (`src/main.rs` only calls `main` here): parse the command line,
//! start logging, build the app, and run it until ctrl-c or SIGTERM; or run a client verb.

use std::io::IsTerminal as _;

use super::App;
use crate::auth::Role;
use crate::cli::{Cli, Command, TokenCommand, explain_parse_error};
use crate::config::LogFormat;

/// What logging needs kept until the process ends: the trace exporter, and the log
/// writer's thread (dropping the guard writes out what is left).
struct Logging {
    traces: Option<crate::telemetry::Traces>,
    _log: tracing_appender::non_blocking::WorkerGuard,
}

/// Log lines to stderr (levels from RUST_LOG), and traces to `otlp` when given. The log's
/// filter is its own, so that trace spans never change the log and log levels never
/// change the traces. Lines are written by a thread of their own through a buffer flushed
/// whenever it has nothing more to write: under load one write carries many lines (an
/// access line per request was a system call per request on the request's thread), and
/// an idle process's lines still appear at once. A full queue makes the logging thread
/// wait rather than drop lines (the access and audit logs are records).
fn init_logging(
    format: Option<LogFormat>,
    otlp: Option<crate::telemetry::Export<'_>>,
) -> anyhow::Result<Logging> {
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _};
    let filter =
        log_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let terminal = std::io::stderr().is_terminal();
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("redlockd-log")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let log = match format.unwrap_or(if terminal {
        LogFormat::Text
    } else {
        LogFormat::Json
    }) {
        LogFormat::Text => fmt.with_ansi(terminal).with_filter(filter).boxed(),
        LogFormat::Json => fmt
            .event_format(crate::logging::JsonLines)
            .with_filter(filter)
            .boxed(),
    };
    let (traces, provider) = match otlp.map(crate::telemetry::otlp_layer).transpose()? {
        Some(Some((layer, provider))) => (Some(layer), Some(provider)),
        _ => (None, None),
    };
    dispatch(log, traces).init();
    Ok(Logging {
        traces: provider,
        _log: guard,
    })
}

/// The log's own filter: `levels` (RUST_LOG's), with the trace spans' target off. The
/// trace spans are for the OTLP layer alone: the log neither shows nor pays for them. The
/// directive is a fixed target and level, so it always parses.
fn log_filter(levels: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    levels.add_directive(
        format!("{}=off", crate::telemetry::TARGET)
            .parse()
            .expect("a fixed, valid directive"),
    )
}

/// The log layer, and the trace layer when traces are sent. An absent trace layer is left
/// out, not added as `None`: tracing-subscriber takes a `None` layer as interested in every
/// callsite, so the log's filter alone could not turn the trace spans off, and each
/// request's span was built in the registry (and entered at every poll) for nobody.
fn dispatch<L, T>(log: L, traces: Option<T>) -> tracing::Dispatch
where
    L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync,
    T: tracing_subscriber::Layer<
            tracing_subscriber::layer::Layered<L, tracing_subscriber::Registry>,
        > + Send
        + Sync,
{
    use tracing_subscriber::layer::SubscriberExt as _;
    let logged = tracing_subscriber::registry().with(log);
    match traces {
        Some(traces) => logged.with(traces).into(),
        None => logged.into(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// Whether the command line asks for a client verb, whose bad usage exits 64 (as
/// documented for `redlockd lock`) rather than clap's 2.
fn client_verb() -> bool {
    let args: Vec<String> = std::env::args().collect();
    matches!(Cli::verb_of(&args), "lock" | "inspect" | "list" | "token")
}

// Not `#[tokio::main]`: the trace exporter's blocking HTTP client is built, and its last
// spans sent, outside the runtime, where blocking is allowed.
pub fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(err) => {
            if let Some(explained) = explain_parse_error(&err) {
                eprintln!("redlockd: {explained}");
            }
            if err.use_stderr() && client_verb() {
                let args: Vec<String> = std::env::args().collect();
                eprint!(
                    "{}",
                    crate::cli::usage_error_text(&err, Cli::verb_of(&args))
                );
                return std::process::ExitCode::from(crate::client::lock::exit::USAGE);
            }
            err.exit();
        }
    };
    let (format, otlp) = match &cli.command {
        Command::Serve(config) => (
            config.log_format,
            Some(crate::telemetry::Export {
                endpoint: config.otlp_endpoint.as_deref(),
                ca_file: config.ca_file.as_deref(),
            }),
        ),
        Command::Recover(args) => (args.config.log_format, None),
        _ => (None, None),
    };
    let logging = match init_logging(format, otlp) {
        Ok(logging) => logging,
        Err(e) => {
            eprintln!("redlockd: traces: {e:#}");
            return std::process::ExitCode::from(crate::client::lock::exit::USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("redlockd: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli.command));
    drop(runtime);
    if let Some(traces) = logging.traces {
        traces.shutdown();
    }
    code
}

async fn run(command: Command) -> std::process::ExitCode {
    match command {
        Command::Openapi => {
            print!("{}", crate::http::openapi_json());
        }
        Command::Healthcheck(args) => {
            return match crate::app::healthcheck(&args.listen, args.tls_cert.is_some()).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("redlockd healthcheck: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Command::Recover(args) => {
            return match crate::app::recover(args.config, args.fence_floor, args.force).await {
                Ok(report) => {
                    for line in report {
                        println!("{line}");
                    }
                    println!("recovered: every master votes again");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("redlockd recover: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Command::Lock(args) => {
            return std::process::ExitCode::from(crate::client::lock::run(args).await);
        }
        Command::Inspect(args) => {
            return std::process::ExitCode::from(crate::client::show::inspect(args).await);
        }
        Command::List(args) => {
            return std::process::ExitCode::from(crate::client::show::list(args).await);
        }
        Command::Token(TokenCommand::New {
            name,
            role,
            prefixes,
        }) => {
            let role = match role.as_str() {
                "admin" => Role::Admin,
                "reader" => Role::Reader,
                _ => Role::Client,
            };
            if role != Role::Admin && prefixes.is_empty() {
                eprintln!(
                    "redlockd token new: a {role} token needs at least one --prefix (\"\" for every name)"
                );
                return std::process::ExitCode::from(crate::client::lock::exit::USAGE);
            }
            let (token, entry) = crate::auth::new_token(&name, role, prefixes);
            println!("token (shown once; give it to the client, keep it secret): {token}");
            println!("add to the REDLOCKD_AUTH_FILE's \"tokens\" list:");
            println!("{}", serde_json::to_string(&entry).unwrap_or_default());
        }
        Command::Serve(config) => {
            let result = async {
                let app = App::new(config).await?;
                let listener = app.bind().await?;
                tracing::info!(address = %listener.local_addr()?, "redlockd serving");
                app.serve(listener, shutdown_signal()).await
            }
            .await;
            if let Err(e) = result {
                eprintln!("redlockd: {e:#}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::Layer as _;

    /// A request's trace span as the access log's middleware opens it.
    fn request_span() -> tracing::Span {
        tracing::info_span!(target: crate::telemetry::TARGET, "request")
    }

    fn log() -> impl tracing_subscriber::Layer<tracing_subscriber::Registry> {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(super::log_filter(tracing_subscriber::EnvFilter::new(
                "info",
            )))
    }

    #[test]
    fn with_no_traces_sent_no_trace_span_is_built() {
        let dispatch = super::dispatch(log(), None::<tracing_subscriber::layer::Identity>);
        let span = tracing::dispatcher::with_default(&dispatch, request_span);
        assert!(span.is_disabled(), "built for nobody: {span:?}");
    }

    #[test]
    fn with_traces_sent_the_trace_layer_gets_the_span() {
        let dispatch = super::dispatch(log(), Some(tracing_subscriber::layer::Identity::new()));
        let span = tracing::dispatcher::with_default(&dispatch, request_span);
        assert!(!span.is_disabled());
    }
}
