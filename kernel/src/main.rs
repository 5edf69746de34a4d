use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let config = kernel::Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("KERNEL_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    match kernel::server::run(config, shutdown, |_| {}).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "kernel stopped");
            ExitCode::FAILURE
        }
    }
}

async fn watch_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "stopping"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "stopping"),
    }
    shutdown.cancel();
}
