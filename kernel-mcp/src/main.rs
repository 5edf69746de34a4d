//! `kernel-mcp`: offers the tools of MCP servers to a kernel as a worker, so every call
//! an agent makes to them is recorded, governed, approved and replayed like any other tool call.
//!
//! ```text
//! kernel-mcp --config mcp.yaml --kernel http://127.0.0.1:50051
//! ```
//!
//! The config names the servers (a command for stdio, or a Streamable HTTP url) and what to declare
//! of their tools; see `docs/guides/mcp.md`. Each server's tools go over a worker session of
//! their own (`supervise`). It logs `worker session open` once the kernel accepted a server's tools,
//! and drains on SIGINT or SIGTERM.

mod config;
mod declare;
mod supervise;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;
use worker_sdk::{Tls, Worker};

use crate::supervise::Session;

#[derive(Debug, Parser)]
#[command(
    name = "kernel-mcp",
    about = "Offer MCP servers' tools to a kernel as a worker",
    version
)]
struct Args {
    /// The config file: which MCP servers to wrap and what to declare of their tools.
    #[arg(long, env = "KERNEL_MCP_CONFIG")]
    config: PathBuf,
    /// Kernel gRPC address.
    #[arg(long, env = "KERNEL_ADDR", default_value = "http://127.0.0.1:50051")]
    kernel: String,
    /// Name the kernel lists this worker under, as `<name>:<server>` (a session per server).
    #[arg(long, default_value = "mcp")]
    name: String,
    /// Calls run at once, per server.
    #[arg(long, default_value_t = 16)]
    max_concurrency: u32,
    /// CA certificate (PEM) of a kernel served over TLS (give an https:// address).
    #[arg(long, env = "KERNEL_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) to present, for a kernel started with --tls-client-ca.
    #[arg(long, env = "KERNEL_TLS_CLIENT_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "KERNEL_TLS_CLIENT_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// API key, for a kernel started with --auth-file (needs workers:connect and the tools).
    #[arg(long, env = "KERNEL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn")))
        .init();
    // An https:// MCP server needs a TLS provider; rustls with ring is the one tonic already uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let servers = match config::load(&args.config) {
        Ok(servers) => servers,
        Err(message) => {
            error!(%message, "config refused");
            return ExitCode::from(2);
        }
    };
    let tls = match tls(&args) {
        Ok(tls) => tls,
        Err(message) => {
            error!(%message, "tls settings refused");
            return ExitCode::from(2);
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let session = session(&args, tls);
    let supervisors: Vec<_> = servers
        .into_iter()
        .map(|server| tokio::spawn(supervise::supervise(server, session.clone(), shutdown.clone())))
        .collect();
    for supervisor in supervisors {
        let _ = supervisor.await;
    }
    ExitCode::SUCCESS
}

/// How each server's worker session reaches the kernel: named `<name>:<server>`.
fn session(args: &Args, tls: Option<Tls>) -> Session {
    let (kernel, name, max_concurrency, api_key) = (
        args.kernel.clone(),
        args.name.clone(),
        args.max_concurrency,
        args.api_key.clone(),
    );
    Session {
        builder: Arc::new(move |server: &str| {
            let mut builder = Worker::builder(kernel.clone())
                .name(format!("{name}:{server}"))
                .max_concurrency(max_concurrency)
                // A list change drains the session: calls in flight get this long to finish.
                .drain_timeout(Duration::from_secs(60));
            if let Some(tls) = &tls {
                builder = builder.tls(tls.clone());
            }
            if let Some(key) = &api_key {
                builder = builder.api_key(key.clone());
            }
            builder
        }),
    }
}

fn tls(args: &Args) -> Result<Option<Tls>, String> {
    let Some(ca) = &args.tls_ca else {
        return Ok(None);
    };
    let tls = Tls::from_ca_file(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => tls
            .identity_files(cert, key)
            .map(Some)
            .map_err(|e| format!("--tls-cert/--tls-key: {e}")),
        _ => Ok(Some(tls)),
    }
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    info!("stopping: draining calls in flight");
    shutdown.cancel();
}

// The docs' command lines, as the kernel's and kernelctl's tests read them (the crates share no
// test utility crate).
#[cfg(test)]
#[path = "../../kernel/src/docs_commands.rs"]
mod docs_commands;

#[cfg(test)]
mod tests {

    use super::Args;

    #[test]
    fn every_kernel_mcp_command_line_in_the_docs_parses() {
        crate::docs_commands::assert_every_command_line_parses::<Args>("kernel-mcp", 1);
    }
}
