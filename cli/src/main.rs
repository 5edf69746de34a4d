//! `kernelctl`: the command-line client of the kernel.
//!
//! `main` only parses arguments (clap exits 2 on a usage error), runs the command and maps the
//! outcome to an exit code: 0 ok, 1 failed. The pieces, in the order data flows through them:
//! [`args`] (grammar) → [`client`] (gRPC channel) → [`commands`] (calls and paging) → [`view`]
//! (proto → serializable views) → [`render`] (tables) or JSON on stdout; [`error`] words every
//! failure for stderr.

mod args;
mod client;
mod commands;
mod error;
mod render;
mod time;
mod view;

use std::process::ExitCode;

use clap::Parser;

use crate::args::Cli;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout();
    match commands::run(cli, &mut stdout).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is_broken_pipe() => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
