//! `kernelctl`: the command-line client of the kernel.
//!
//! `main` only parses arguments (clap exits 2 on a usage error), runs the command and maps the
//! outcome to an exit code: 0 ok, 1 failed. The pieces, in the order data flows through them:
//! [`args`] (grammar) → [`client`] (gRPC channel) → [`commands`] (calls and paging) → [`view`]
//! (proto → serializable views; [`diff`] aligns two runs' views) → [`render`] (tables) or JSON on
//! stdout; [`error`] words every failure for stderr. `bench` ([`commands::bench`], built from [`bench`]) runs on a
//! multi-threaded runtime of its own, since it hosts workers and an agent under load.

mod args;
mod bench;
mod client;
mod commands;
mod diff;
// One file for every crate whose tests parse the docs' command lines (the e2e docs test too).
#[cfg(test)]
#[path = "../../kernel/src/docs_commands.rs"]
mod docs_commands;
mod error;
// The reference pages' shared clap rendering, as the kernel's reference test uses it.
#[cfg(test)]
#[path = "../../kernel/src/clap_reference.rs"]
mod clap_reference;
#[cfg(test)]
mod reference;
mod render;
mod time;
mod view;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(message) = cli.check_tls() {
        Cli::command().error(ErrorKind::ArgumentConflict, message).exit();
    }
    let access = cli.access();
    match cli.command {
        Command::Bench(args) => bench(&cli.addr, &access, cli.json, args),
        Command::Keys(args::KeysCommand::Create(args)) => commands::keys::create(args, cli.json),
        Command::Receipts(args::ReceiptsCommand::Verify { file, key }) => {
            commands::receipts::verify(&file, key.as_deref())
        }
        Command::Mcp(args::McpCommand::Serve(args)) => mcp_serve(&cli.addr, &access, args),
        command => query(Cli { command, ..cli }),
    }
}

fn bench(addr: &args::KernelAddr, access: &client::Access, json: bool, args: bench::BenchArgs) -> ExitCode {
    // The bench's workers run in this process; their lines about sessions and calls would bury
    // its report, so only warnings show (`RUST_LOG` shows more).
    let levels = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(levels)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(commands::bench::main(addr, access, json, args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is_broken_pipe() => ExitCode::SUCCESS,
        Err(err) => runtime.block_on(report(addr, &err.to_string())),
    }
}

/// Serves MCP until the client goes (stdio) or SIGINT (HTTP); diagnostics go to stderr, as stdout
/// is the MCP stream.
fn mcp_serve(addr: &args::KernelAddr, access: &client::Access, args: args::McpServeArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(commands::mcp::serve(addr, access, args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => runtime.block_on(report(addr, &message)),
    }
}

/// Prints a failure, then what to do about it when the failure is a usual mistake (a plaintext
/// address for a TLS kernel, no kernel at the address).
async fn report(addr: &args::KernelAddr, error: &str) -> ExitCode {
    eprintln!("error: {error}");
    if let Some(hint) = worker_sdk::diagnose(addr.as_str(), error).await {
        eprintln!("hint: {hint}");
    }
    ExitCode::FAILURE
}

#[tokio::main(flavor = "current_thread")]
async fn query(cli: Cli) -> ExitCode {
    let mut stdout = std::io::stdout();
    let addr = cli.addr.clone();
    match commands::run(cli, &mut stdout).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is_broken_pipe() => ExitCode::SUCCESS,
        Err(err) => report(&addr, &err.to_string()).await,
    }
}
