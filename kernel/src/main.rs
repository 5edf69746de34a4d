use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// jemalloc with its background thread hands pages freed after a burst of calls back to the system
/// within seconds; glibc's malloc kept them (RSS stayed at three times its baseline after the load
/// test, with 8 MB of it live). It serves C's `malloc` too (the workspace builds it unprefixed), so
/// SQLite's page caches and row buffers are returned the same way.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(kernel::memory::on_park)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(serve()),
        Err(error) => {
            eprintln!("kernel: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> ExitCode {
    let config = kernel::Config::parse();
    kernel::logs::install(
        EnvFilter::try_from_env("KERNEL_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        std::io::stderr().is_terminal(),
    );
    // The background thread purges freed pages on its own clock, so memory goes back to the
    // system after a burst even when the threads that freed it have gone quiet.
    if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(%error, "jemalloc background thread unavailable; freed memory is returned only as the kernel allocates");
    }

    if let Some(kernel::KernelCommand::Migrate) = config.command {
        return match kernel::store::migrate(&config.db).await {
            Ok(migrated) => {
                println!(
                    "{}: schema at version {} (was {})",
                    config.db, migrated.to, migrated.from
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                tracing::error!(%error, db = %config.db, "migration failed");
                ExitCode::FAILURE
            }
        };
    }

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
    // A second signal while the kernel drains means now: what was in flight is settled at the
    // next start, as after a crash.
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::warn!("a second signal: stopping now, without waiting for the drain");
    std::process::exit(1);
}
