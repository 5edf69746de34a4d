//! Command handlers: each makes its gRPC calls, turns the answer into [`crate::view`] structs and
//! prints them through [`Output`], as tables or as JSON.
//!
//! Handlers stay thin on purpose: paging and streaming live here, layout lives in
//! [`crate::render`], and the proto-to-view conversion in [`crate::view`].

mod approvals;
pub mod bench;
pub mod keys;
pub mod mcp;
pub mod receipts;
mod replicas;
mod runs;
mod status;
mod tools;
mod workers;

use std::io::{self, Write};

use serde::Serialize;

use crate::args::{ApprovalsCommand, Cli, Command, ReplicasCommand, RunsCommand, ToolsCommand, WorkersCommand};
use crate::client::Kernel;
use crate::error::CliError;

/// Runs the parsed command against the kernel at `cli.addr`, writing data to `out`.
pub async fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    let mut kernel = Kernel::connect(&cli.addr, &cli.access()).await?;
    let mut out = Output::new(out, cli.json);
    match cli.command {
        Command::Runs(RunsCommand::Start {
            agent,
            input,
            follow,
            budget,
            label,
        }) => runs::start(&mut kernel, &mut out, (agent, input, budget, label), follow).await,
        Command::Runs(RunsCommand::List(args)) => runs::list(&mut kernel, &mut out, args).await,
        Command::Runs(RunsCommand::Show { id }) => runs::show(&mut kernel, &mut out, id).await,
        Command::Runs(RunsCommand::Tree { id }) => runs::tree(&mut kernel, &mut out, id).await,
        Command::Runs(RunsCommand::Events(args)) => runs::events(&mut kernel, &mut out, args).await,
        Command::Runs(RunsCommand::Fork(args)) => runs::fork(&mut kernel, &mut out, args).await,
        Command::Runs(RunsCommand::Diff { a, b }) => runs::diff(&mut kernel, &mut out, (a, b)).await,
        Command::Runs(RunsCommand::Cancel { id, reason }) => runs::cancel(&mut kernel, &mut out, id, reason).await,
        Command::Runs(RunsCommand::CancelCall { run, step, reason }) => {
            runs::cancel_call(&mut kernel, &mut out, run, step, reason).await
        }
        Command::Runs(RunsCommand::Answer {
            run,
            question,
            answer,
            decider,
            reason,
        }) => {
            let who = crate::args::AnswerArgs {
                id: question,
                decider,
                reason,
            };
            approvals::answer_run_question(&mut kernel, &mut out, run, who, answer).await
        }
        Command::Runs(RunsCommand::Receipts { run }) => receipts::list(&mut kernel, &mut out, run).await,
        Command::Runs(RunsCommand::Delete { id }) => runs::delete(&mut kernel, &mut out, id).await,
        Command::Runs(RunsCommand::Prune { finished_before }) => {
            runs::prune(&mut kernel, &mut out, finished_before).await
        }
        Command::Tools(ToolsCommand::List) => tools::list(&mut kernel, &mut out).await,
        Command::Tools(ToolsCommand::Forget { name }) => tools::forget(&mut kernel, &mut out, name).await,
        Command::Workers(WorkersCommand::List) => workers::list(&mut kernel, &mut out).await,
        Command::Replicas(ReplicasCommand::List) => replicas::list(&mut kernel, &mut out).await,
        Command::Approvals(ApprovalsCommand::List { run }) => approvals::list(&mut kernel, &mut out, run).await,
        Command::Approvals(ApprovalsCommand::Approve(args)) => {
            approvals::answer(&mut kernel, &mut out, args.id, true, args.decider, args.reason).await
        }
        Command::Approvals(ApprovalsCommand::Reject(args)) => {
            approvals::answer(&mut kernel, &mut out, args.id, false, args.decider, args.reason).await
        }
        Command::Approvals(ApprovalsCommand::Answer { who, answer }) => {
            approvals::answer_question(&mut kernel, &mut out, who, answer).await
        }
        Command::Status => status::show(&mut kernel, &mut out).await,
        Command::Limits => status::limits(&mut kernel, &mut out).await,
        Command::Shares => status::shares(&mut kernel, &mut out).await,
        Command::Bench(_) => unreachable!("main runs `bench` through commands::bench::main"),
        Command::Keys(_) => unreachable!("main runs `keys` without a kernel"),
        Command::Receipts(_) => unreachable!("main runs `receipts verify` without a kernel"),
        Command::Mcp(_) => unreachable!("main runs `mcp serve` through commands::mcp::serve"),
    }?;
    out.flush()?;
    Ok(())
}

/// Where data goes, and in which form.
pub struct Output<'a> {
    writer: &'a mut dyn Write,
    json: bool,
}

impl<'a> Output<'a> {
    pub fn new(writer: &'a mut dyn Write, json: bool) -> Self {
        Self { writer, json }
    }

    /// Whether `--json` asked for machine output.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// One pretty-printed JSON document.
    pub fn document<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        serde_json::to_writer_pretty(&mut *self.writer, value).map_err(io::Error::from)?;
        writeln!(self.writer)
    }

    /// One compact JSON object on its own line (NDJSON), flushed so a follower sees it at once.
    pub fn json_line<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        serde_json::to_writer(&mut *self.writer, value).map_err(io::Error::from)?;
        writeln!(self.writer)?;
        self.writer.flush()
    }

    /// Text as is (tables already end with a newline).
    pub fn text(&mut self, text: &str) -> io::Result<()> {
        self.writer.write_all(text.as_bytes())
    }

    /// One line of text, flushed.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        writeln!(self.writer, "{line}")?;
        self.writer.flush()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

#[cfg(test)]
mod fake_kernel;
#[cfg(test)]
mod tests;
