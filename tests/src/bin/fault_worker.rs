//! A worker for fault injection. Each tool writes one line to a ledger file when its body starts
//! (`start <tool> <idempotency key> <attempt>`), and another when it sees a cancel, so tests can
//! count how often an effect really ran after workers or the kernel were killed.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use worker_sdk::{CancellationToken, Idempotency, RetryPolicy, RiskLevel, ToolContext, ToolError, Worker, tool};

#[derive(Debug, Parser)]
struct Config {
    #[arg(long, env = "KERNEL_ADDR")]
    kernel: String,
    #[arg(long)]
    name: String,
    /// File the tools append their ledger lines to.
    #[arg(long)]
    ledger: PathBuf,
    #[arg(long, default_value_t = 16)]
    max_concurrency: u32,
}

struct Ledger(Mutex<std::fs::File>);

impl Ledger {
    fn write(ctx: &ToolContext, what: &str) {
        let ledger = ctx.deps::<Ledger>().expect("ledger dependency");
        let mut file = ledger.0.lock().expect("ledger lock");
        // One write per line: several worker processes append to the same file.
        let line = format!(
            "{what} {} {} {}\n",
            ctx.tool_name(),
            ctx.idempotency_key(),
            ctx.attempt()
        );
        file.write_all(line.as_bytes()).expect("ledger write");
        file.sync_data().expect("ledger sync");
    }
}

/// Waits `hold_ms` unless cancelled; the ledger records a cancel.
async fn hold(ctx: &ToolContext, hold_ms: u64) -> Result<(), ToolError> {
    tokio::select! {
        _ = ctx.cancelled() => {
            Ledger::write(ctx, "cancelled");
            Err(ToolError::fatal("cancelled"))
        }
        _ = tokio::time::sleep(Duration::from_millis(hold_ms)) => Ok(()),
    }
}

/// Record an effect, then hold for a while. Safe to run again.
#[tool]
async fn sleepy(ctx: ToolContext, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    hold(&ctx, hold_ms).await?;
    Ok(format!("slept {hold_ms}ms"))
}

/// Record an effect that must not happen twice, then hold for a while.
#[tool(idempotency = "at_most_once")]
async fn charge(ctx: ToolContext, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    hold(&ctx, hold_ms).await?;
    Ok(format!("charged once under {}", ctx.idempotency_key()))
}

/// Fail retryably until attempt `succeed_on`.
#[tool]
async fn flaky(ctx: ToolContext, succeed_on: u32) -> Result<u32, ToolError> {
    Ledger::write(&ctx, "start");
    if ctx.attempt() < succeed_on {
        return Err(ToolError::retryable(format!("attempt {} fails", ctx.attempt())));
    }
    Ok(ctx.attempt())
}

/// Sleep on a blocking thread, which no cancel can stop.
#[tool]
fn block(ctx: ToolContext, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    std::thread::sleep(Duration::from_millis(hold_ms));
    Ledger::write(&ctx, "finished");
    Ok("woke up".into())
}

/// Refund an amount in cents; big refunds need a person's approval (declared on the tool).
#[tool]
async fn refund(ctx: ToolContext, cents: i64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    Ok(format!("refunded {cents} cents"))
}

/// Delete everything; always needs a person.
#[tool]
async fn wipe(ctx: ToolContext) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    Ok("wiped".into())
}

/// Keeps `value` under `key` in this tool's cache when given (expiring after `ttl_ms` when
/// given), then returns what the cache holds under `key`.
#[tool]
async fn memo(
    ctx: ToolContext,
    key: String,
    value: Option<i64>,
    ttl_ms: Option<u64>,
) -> Result<Option<i64>, ToolError> {
    let cache = ctx.cache();
    if let Some(value) = value {
        cache.set(&key, &value, ttl_ms.map(Duration::from_millis)).await?;
    }
    cache.get(&key).await
}

/// Returns what this tool's own cache holds under `key`; never what `memo` keeps there.
#[tool]
async fn peek(ctx: ToolContext, key: String) -> Result<Option<i64>, ToolError> {
    ctx.cache().get(&key).await
}

#[tokio::main]
async fn main() {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let ledger = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&config.ledger)
        .expect("ledger file");
    let worker = Worker::builder(config.kernel)
        .name(config.name)
        .max_concurrency(config.max_concurrency)
        .tool(sleepy_tool())
        .tool(charge_tool().idempotency(Idempotency::AtMostOnce))
        .tool(flaky_tool().retry_policy(RetryPolicy::exponential(
            4,
            Duration::from_millis(400),
            Duration::from_secs(5),
        )))
        .tool(block_tool().timeout(Duration::from_millis(500)).retry(3))
        .tool(
            refund_tool()
                .writes()
                .risk(RiskLevel::High)
                .permissions(["billing:write"])
                .cost_per_call(0.25)
                .requires_approval_if("args.cents > 10000"),
        )
        .tool(wipe_tool().writes().risk(RiskLevel::Critical).requires_approval(true))
        .tool(memo_tool())
        .tool(peek_tool())
        .deps(Ledger(Mutex::new(ledger)))
        .build()
        .expect("worker config");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    if let Err(error) = worker.run(shutdown).await {
        eprintln!("fault worker stopped: {error}");
        std::process::exit(1);
    }
}
