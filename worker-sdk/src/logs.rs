//! What a worker says when its program installed no `tracing` subscriber: a worker is a
//! program's main loop, like a server, and one that prints nothing leaves its user guessing why a
//! call waits (a wrong address, a refused key). As uvicorn does for its own loggers, the first
//! [`crate::Worker::run`] of a program without a subscriber installs one that prints the SDK's
//! lines at info and everything else at warn to stderr (`RUST_LOG` overrides that). A program
//! that installs its own subscriber first gets exactly what it configured.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the default subscriber unless the program has one.
pub(crate) fn show_by_default() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,worker_sdk=info"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // Its report of a failed write panics on a closed stderr; a worker must not die of its logs.
        .log_internal_errors(false)
        .finish();
    // Another thread may have installed one meanwhile: then that one stays.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
