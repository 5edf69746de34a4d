//! A scripted agent: creates a run, submits turns of tool calls to the demo worker's tools,
//! prints each result to stderr, completes the run and prints its id to stdout.
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

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use serde_json::json;
use worker_sdk::{AgentClient, AgentError, Call, CallOutcome, CallStatus, NewRun, RunHandle, Tls, TurnItem};

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
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    /// Three turns: arithmetic and an echo, a slow call with progress, then two calls that fail.
    Tour,
    /// A small refund that runs at once and a large one that waits for a person's approval.
    Refund,
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

async fn tour(run: &RunHandle) -> Result<serde_json::Value, AgentError> {
    let mut tally = Tally::default();

    let turn0 = vec![
        Call::new("add", json!({"a": 2, "b": 3})),
        Call::new("echo", json!({"value": {"b": 2, "a": 1}})),
    ];
    let outcomes = run.call_turn(0, turn0).await?;
    tally.record(0, &outcomes);

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

    let turn2 = vec![
        Call::new("weather", json!({"city": "Paris"})),
        Call::new("add", json!({"a": "two", "b": 3})),
    ];
    let outcomes = run.call_turn(2, turn2).await?;
    tally.record(2, &outcomes);

    Ok(json!({
        "summary": "demo finished",
        "turns": 3,
        "calls_ok": tally.ok,
        "calls_failed": tally.errors,
    }))
}

async fn refund(run: &RunHandle) -> Result<serde_json::Value, AgentError> {
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
    let refunded = outcomes
        .iter()
        .filter(|outcome| outcome.status == CallStatus::Ok)
        .count();
    Ok(json!({"summary": "refunds asked", "refunded": refunded, "refused": outcomes.len() - refunded}))
}

async fn run(config: Config) -> Result<String, AgentError> {
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
    let run = client
        .create_run(NewRun::new("demo-agent", json!({"goal": goal})))
        .await?;
    eprintln!("run {} created", run.id());
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
        Err(error) => {
            // Leave no run hanging: record why it stopped, then report the original error.
            if let Err(fail_error) = run.fail(error.to_string()).await {
                eprintln!("demo-agent: could not mark the run failed: {fail_error}");
            }
            Err(error)
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
        Err(error) => {
            eprintln!("demo-agent: {error}");
            ExitCode::FAILURE
        }
    }
}
