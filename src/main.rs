//! The redlockd binary: parse the command line, start logging, build the app, and run it
//! until ctrl-c or SIGTERM.

use clap::Parser as _;
use redlockd::app::App;
use redlockd::config::{Cli, Command, explain_parse_error};

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            if let Some(explained) = explain_parse_error(&err) {
                eprintln!("redlockd: {explained}");
            }
            err.exit();
        }
    };
    init_logging();
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let result = async {
                let app = App::build(cli.config).await?;
                tracing::info!(address = %app.local_addr()?, "redlockd serving");
                app.run_until_stopped(shutdown_signal()).await
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
