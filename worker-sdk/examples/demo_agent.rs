//! A scripted agent: creates a run (or, with `--run ID`, drives an existing one), submits turns
//! of tool calls to the demo worker's tools, prints each result to stderr, completes the run and
//! prints its id to stdout.
//!
//! ```text
//! cargo run -p worker-sdk --example demo-agent -- --kernel http://127.0.0.1:50051
//! cargo run -p kernelctl -- runs show "$(cargo run -q -p worker-sdk --example demo-agent)"
//! ```
//!
//! The default scenario, `tour`, takes three turns: arithmetic and an echo, a slow call that
//! reports progress, then an unknown tool and wrongly typed arguments. `--scenario refund` asks
//! for a small refund, which runs at once, and a large one, which waits until someone answers its
//! approval (`kernelctl approvals approve ID`); the agent prints the command and waits.
//!
//! `--run ID` drives a run made elsewhere, such as a branch of a recorded run: the branch replays
//! its parent's calls up to the fork point and runs reads live, but refuses any other effect the
//! parent never recorded with `write_tool_blocked`, which ends it. The agent then prints where
//! the branch stopped and exits 1 without trying to end the run, which the kernel already did.
//!
//! ```text
//! run=$(cargo run -q -p worker-sdk --example demo-agent -- --scenario refund)  # approve the large one
//! branch=$(cargo run -q -p kernelctl -- runs fork "$run" --at t0/p0)
//! cargo run -p worker-sdk --example demo-agent -- --scenario refund --run "$branch"  # stops at t0/p1
//! cargo run -p kernelctl -- runs diff "$run" "$branch"
//! ```

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use serde_json::json;
use worker_sdk::{AgentClient, AgentError, Call, CallOutcome, CallStatus, NewRun, Outcome, RunHandle, Tls, TurnItem};

#[derive(Debug, Parser)]
#[command(name = "demo-agent", about = "Drive one demo run through the kernel")]
struct Config {
    /// Kernel gRPC address.
    #[arg(long, env = "KERNEL_ADDR", default_value = "http://127.0.0.1:50051")]
    kernel: String,
    /// CA certificate (PEM) of a kernel served over TLS (give an https:// address).
    #[arg(long, env = "KERNEL_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
    /// API key, for a kernel started with --auth-file (needs runs:write, tools:call, runs:read).
    #[arg(long, env = "KERNEL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// What the run does.
    #[arg(long, value_enum, default_value_t = Scenario::Tour)]
    scenario: Scenario,
    /// Drive this existing run (a branch from `kernelctl runs fork`, say) instead of creating one.
    #[arg(long, value_name = "ID")]
    run: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    /// Three turns: arithmetic and an echo, a slow call with progress, then two calls that fail.
    Tour,
    /// A small refund that runs at once and a large one that waits for a person's approval.
    Refund,
}

/// Why driving a run stopped before its scenario's end.
#[derive(Debug)]
enum Stop {
    /// The kernel refused this call with write_tool_blocked, and the run (a branch or a case run)
    /// ended with it.
    Blocked(Box<CallOutcome>),
    /// Anything else: the run is still open, and is failed with this.
    Error(AgentError),
}

impl From<AgentError> for Stop {
    fn from(error: AgentError) -> Self {
        Stop::Error(error)
    }
}

/// Stops at the first call the kernel refused with write_tool_blocked: nothing more can run.
fn stop_if_blocked(outcomes: &[CallOutcome]) -> Result<(), Stop> {
    match outcomes
        .iter()
        .find(|outcome| outcome.outcome == Outcome::WriteToolBlocked)
    {
        Some(blocked) => Err(Stop::Blocked(Box::new(blocked.clone()))),
        None => Ok(()),
    }
}

fn print_outcome(turn: u32, outcome: &CallOutcome) {
    let replayed = if outcome.replayed { " (replayed)" } else { "" };
    eprintln!(
        "turn {turn} #{} {} {:?}{replayed}: {}",
        outcome.position, outcome.tool, outcome.status, outcome.content
    );
}

/// Tallies outcomes for the run's output.
#[derive(Default)]
struct Tally {
    ok: u32,
    errors: u32,
}

impl Tally {
    fn record(&mut self, turn: u32, outcomes: &[CallOutcome]) {
        for outcome in outcomes {
            print_outcome(turn, outcome);
            match outcome.status {
                CallStatus::Ok => self.ok += 1,
                CallStatus::Error | CallStatus::Cancelled => self.errors += 1,
            }
        }
    }
}

async fn tour(run: &RunHandle) -> Result<serde_json::Value, Stop> {
    let mut tally = Tally::default();

    let turn0 = vec![
        Call::new("add", json!({"a": 2, "b": 3})),
        Call::new("echo", json!({"value": {"b": 2, "a": 1}})),
    ];
    let outcomes = run.call_turn(0, turn0).await?;
    tally.record(0, &outcomes);
    stop_if_blocked(&outcomes)?;

    let mut turn1 = Box::pin(run.submit_turn(1, vec![Call::new("slow", json!({"steps": 5, "delay_ms": 100}))]));
    let mut outcomes = Vec::new();
    while let Some(item) = turn1.next().await {
        match item? {
            TurnItem::Progress(update) => {
                let fraction = match (update.current, update.total) {
                    (Some(current), Some(total)) => format!(" ({current}/{total})"),
                    _ => String::new(),
                };
                eprintln!(
                    "turn 1 #{} {} progress: {}{fraction}",
                    update.position, update.tool, update.message
                );
            }
            TurnItem::Interrupted(interruption) => eprintln!(
                "turn 1 #{} {} waits for approval {}",
                interruption.position, interruption.tool, interruption.approval_id
            ),
            TurnItem::Result(outcome) => outcomes.push(outcome),
        }
    }
    tally.record(1, &outcomes);
    stop_if_blocked(&outcomes)?;

    let turn2 = vec![
        Call::new("weather", json!({"city": "Paris"})),
        Call::new("add", json!({"a": "two", "b": 3})),
    ];
    let outcomes = run.call_turn(2, turn2).await?;
    tally.record(2, &outcomes);
    stop_if_blocked(&outcomes)?;

    Ok(json!({
        "summary": "demo finished",
        "turns": 3,
        "calls_ok": tally.ok,
        "calls_failed": tally.errors,
    }))
}

async fn refund(run: &RunHandle) -> Result<serde_json::Value, Stop> {
    let calls = vec![
        Call::new("refund", json!({"customer": "cus_42", "cents": 500})),
        Call::new("refund", json!({"customer": "cus_42", "cents": 25_000})),
    ];
    let mut turn = Box::pin(run.submit_turn(0, calls));
    let mut outcomes = Vec::new();
    while let Some(item) = turn.next().await {
        match item? {
            TurnItem::Interrupted(asked) => {
                eprintln!(
                    "turn 0 #{} {} {} waits for approval {}; answer it with:",
                    asked.position, asked.tool, asked.arguments, asked.approval_id
                );
                eprintln!(
                    "    cargo run -p kernelctl -- approvals approve {} --as alice --reason \"ticket 42\"",
                    asked.approval_id
                );
                eprintln!(
                    "    cargo run -p kernelctl -- approvals reject {} --as bob --reason \"too much\"",
                    asked.approval_id
                );
            }
            TurnItem::Progress(_) => {}
            TurnItem::Result(outcome) => {
                print_outcome(0, &outcome);
                outcomes.push(outcome);
            }
        }
    }
    stop_if_blocked(&outcomes)?;
    let refunded = outcomes
        .iter()
        .filter(|outcome| outcome.status == CallStatus::Ok)
        .count();
    Ok(json!({"summary": "refunds asked", "refunded": refunded, "refused": outcomes.len() - refunded}))
}

async fn run(config: Config) -> Result<String, Stop> {
    let client = match &config.tls_ca {
        Some(ca) => {
            let tls = Tls::from_ca_file(ca).map_err(|e| AgentError::Config(e.to_string()))?;
            AgentClient::connect_tls(&config.kernel, tls).await?
        }
        None => AgentClient::connect(&config.kernel).await?,
    };
    let client = match &config.api_key {
        Some(key) => client.api_key(key)?,
        None => client,
    };
    let goal = match config.scenario {
        Scenario::Tour => "show the kernel",
        Scenario::Refund => "refund a customer",
    };
    let run = match config.run {
        Some(id) => {
            eprintln!("driving run {id}");
            client.run(id)
        }
        None => {
            let run = client
                .create_run(NewRun::new("demo-agent", json!({"goal": goal})))
                .await?;
            eprintln!("run {} created", run.id());
            run
        }
    };
    let driven = match config.scenario {
        Scenario::Tour => tour(&run).await,
        Scenario::Refund => refund(&run).await,
    };
    match driven {
        Ok(output) => {
            run.complete(output).await?;
            eprintln!("run {} completed", run.id());
            Ok(run.id().to_owned())
        }
        // The kernel ended the run with the refusal: completing or failing it would be refused.
        Err(blocked @ Stop::Blocked(_)) => Err(blocked),
        Err(Stop::Error(error)) => {
            // Leave no run hanging: record why it stopped, then report the original error.
            if let Err(fail_error) = run.fail(error.to_string()).await {
                eprintln!("demo-agent: could not mark the run failed: {fail_error}");
            }
            Err(Stop::Error(error))
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    match run(config).await {
        Ok(run_id) => {
            println!("{run_id}");
            ExitCode::SUCCESS
        }
        Err(Stop::Blocked(blocked)) => {
            eprintln!(
                "demo-agent: the branch stopped at {} ({}), refused as write_tool_blocked; the kernel ended it failed: {}",
                blocked.step_key, blocked.tool, blocked.content
            );
            ExitCode::FAILURE
        }
        Err(Stop::Error(error)) => {
            eprintln!("demo-agent: {error}");
            ExitCode::FAILURE
        }
    }
}

// The docs' command lines, as the kernel's and kernelctl's tests read them.
#[cfg(test)]
#[path = "../../kernel/src/docs_commands.rs"]
mod docs_commands;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_demo_agent_command_line_in_the_docs_parses() {
        crate::docs_commands::assert_every_command_line_parses::<Config>("demo-agent", 1);
    }
}
