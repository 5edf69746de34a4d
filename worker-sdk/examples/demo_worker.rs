//! A worker serving a handful of demo tools: arithmetic, a confined file reader, a slow tool that
//! reports progress and honours cancellation, a streaming countdown, a tool that always fails, an echo, a blocking
//! checksum, and a refund that waits for a person's approval above 100.00; and hosting two agents,
//! `trip_planner` and its subagent `note_taker` (see `demo_worker/agents.rs`).
//!
//! ```text
//! cargo run -p worker-sdk --example demo-worker -- --kernel http://127.0.0.1:50051 --root .
//! ```
//!
//! For a kernel served over TLS, give an `https://` address and `--tls-ca`, plus `--tls-cert` and
//! `--tls-key` when the kernel requires client certificates (`--tls-client-ca`).
//!
//! It logs `worker session open` once the kernel has accepted it, and drains on SIGINT or SIGTERM.

use std::io::IsTerminal;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::Value;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;
use worker_sdk::{CancellationToken, Progress, Stream, Tls, Tool, ToolContext, ToolError, Worker, stream, tool};

#[path = "demo_worker/agents.rs"]
mod agents;

#[derive(Debug, Parser)]
#[command(name = "demo-worker", about = "Serve the demo tools to a kernel")]
struct Config {
    /// Kernel gRPC address.
    #[arg(long, env = "KERNEL_ADDR", default_value = "http://127.0.0.1:50051")]
    kernel: String,
    /// Name the kernel lists this worker under.
    #[arg(long, default_value = "demo-worker")]
    name: String,
    /// Folder `read_file` may read from.
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Calls run at once.
    #[arg(long, default_value_t = 8)]
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
    /// API key, for a kernel started with --auth-file (needs workers:connect and these tools).
    #[arg(long, env = "KERNEL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

/// The TLS settings the flags ask for, if any.
fn tls(config: &Config) -> std::io::Result<Option<Tls>> {
    let Some(ca) = &config.tls_ca else {
        return Ok(None);
    };
    let tls = Tls::from_ca_file(ca)?;
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Ok(Some(tls.identity_files(cert, key)?)),
        _ => Ok(Some(tls)),
    }
}

/// The folder `read_file` is confined to, canonical.
struct FileRoot(PathBuf);

/// Adds two integers.
#[tool(read_only, timeout = 5)]
async fn add(_ctx: ToolContext, a: i64, b: i64) -> Result<i64, ToolError> {
    a.checked_add(b)
        .ok_or_else(|| ToolError::fatal(format!("{a} + {b} overflows a 64-bit integer")))
}

/// Divides a by b.
#[tool(read_only, timeout = 5)]
async fn divide(
    _ctx: ToolContext,
    /// The dividend.
    a: f64,
    /// The divisor; must not be zero.
    b: f64,
) -> Result<f64, ToolError> {
    if b == 0.0 {
        return Err(ToolError::fatal("division by zero"));
    }
    Ok(a / b)
}

/// Reads a UTF-8 text file under the worker's root folder.
#[tool(read_only, timeout = 10, resources = ["workspace"])]
async fn read_file(
    ctx: ToolContext,
    /// Path relative to the root folder, e.g. `README.md`.
    path: String,
) -> Result<String, ToolError> {
    let root = ctx
        .deps::<FileRoot>()
        .ok_or_else(|| ToolError::fatal("read_file has no root folder"))?;
    let file = confine(&root.0, &path)?;
    Ok(tokio::fs::read_to_string(file).await?)
}

/// Resolves `path` under `root`, refusing anything that would leave it.
fn confine(root: &Path, path: &str) -> Result<PathBuf, ToolError> {
    let relative = Path::new(path);
    if relative.is_absolute() {
        return Err(ToolError::fatal(format!(
            "'{path}' is absolute; give a path relative to the root folder"
        )));
    }
    if relative
        .components()
        .any(|part| !matches!(part, Component::Normal(_) | Component::CurDir))
    {
        return Err(ToolError::fatal(format!("'{path}' leaves the root folder")));
    }
    // A symlink inside the root may still point outside it.
    let resolved = root.join(relative).canonicalize()?;
    if !resolved.starts_with(root) {
        return Err(ToolError::fatal(format!("'{path}' leaves the root folder")));
    }
    Ok(resolved)
}

/// Works through a number of steps, reporting progress after each; stops when cancelled.
#[tool(read_only, timeout = 120)]
async fn slow(
    ctx: ToolContext,
    /// How many steps to take.
    steps: u32,
    /// Milliseconds per step.
    delay_ms: u64,
) -> Result<String, ToolError> {
    for step in 1..=steps {
        tokio::select! {
            _ = ctx.cancelled() => {
                return Err(ToolError::fatal(format!("cancelled at step {step} of {steps}")));
            }
            _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
        }
        ctx.progress_with(Progress::new(format!("step {step} of {steps}")).step(step.into(), steps.into()));
    }
    Ok(format!("finished {steps} steps"))
}

/// Counts down to a launch, one line per tick: a streaming tool, whose every item but the last is
/// progress and whose last item is the result.
#[tool(read_only, timeout = 120)]
fn countdown(
    _ctx: ToolContext,
    /// Where to start counting.
    from: u32,
    /// Milliseconds per tick.
    delay_ms: u64,
) -> impl Stream<Item = Result<String, ToolError>> {
    stream::unfold(Some(from), move |left| async move {
        let n = left?;
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        Some(match n {
            0 => (Ok("liftoff".to_owned()), None),
            n => (Ok(format!("{n}")), Some(n - 1)),
        })
    })
}

/// Always fails with a retryable error carrying the given message.
#[tool]
async fn fail(_ctx: ToolContext, message: String) -> Result<(), ToolError> {
    Err(ToolError::retryable(message))
}

/// Returns its input unchanged.
#[tool(read_only)]
async fn echo(_ctx: ToolContext, value: Value) -> Result<Value, ToolError> {
    Ok(value)
}

/// Computes the 64-bit FNV-1a hash of a text, as 16 hex digits.
#[tool(read_only, cache_ttl = 300)]
fn checksum(text: String) -> Result<String, ToolError> {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let hash = text
        .bytes()
        .fold(OFFSET, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME));
    Ok(format!("{hash:016x}"))
}

/// Refunds a customer (pretend: nothing leaves the worker); more than 10000 cents needs approval.
#[tool(
    writes,
    idempotency = "at_most_once",
    timeout = 10,
    requires_approval = "args.cents > 10000"
)]
async fn refund(
    ctx: ToolContext,
    /// Who gets the money back.
    customer: String,
    /// The amount, in cents.
    cents: u64,
) -> Result<String, ToolError> {
    // A real refund would send the idempotency key to the payment system as its dedup key.
    Ok(format!(
        "refunded {cents} cents to {customer} (idempotency key {})",
        ctx.idempotency_key()
    ))
}

fn tools() -> Vec<Tool> {
    vec![
        add_tool(),
        divide_tool(),
        read_file_tool(),
        slow_tool(),
        countdown_tool(),
        fail_tool(),
        echo_tool(),
        checksum_tool(),
        refund_tool(),
    ]
}

async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Box<dyn std::error::Error>> {
    let root = config
        .root
        .canonicalize()
        .map_err(|error| format!("root folder '{}': {error}", config.root.display()))?;
    info!(kernel = %config.kernel, root = %root.display(), "demo worker starting");
    let tls = tls(&config)?;
    let mut builder = Worker::builder(config.kernel)
        .name(config.name)
        .max_concurrency(config.max_concurrency)
        .tools(tools())
        .deps(FileRoot(root));
    for agent in agents::agents() {
        builder = builder.agent(agent);
    }
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    if let Some(key) = config.api_key {
        builder = builder.api_key(key);
    }
    let worker = builder.build()?;
    worker.run(shutdown).await?;
    Ok(())
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn watch_signals(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut terminate) = signal(SignalKind::terminate()) else {
            error!("cannot listen for SIGTERM");
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    info!("shutdown requested");
    shutdown.cancel();
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    match run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!(error = %error, "demo worker failed");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_demo_worker_command_line_in_the_docs_parses() {
        crate::docs_commands::assert_every_command_line_parses::<Config>("demo-worker", 1);
    }

    #[tokio::test]
    async fn arithmetic() {
        let ctx = ToolContext::for_test();
        assert_eq!(add(ctx.clone(), 2, 3).await.unwrap(), 5);
        assert!(add(ctx.clone(), i64::MAX, 1).await.is_err());
        assert_eq!(divide(ctx.clone(), 1.0, 4.0).await.unwrap(), 0.25);
        let error = divide(ctx, 1.0, 0.0).await.unwrap_err();
        assert_eq!(
            (error.kind(), error.message()),
            (worker_sdk::ErrorKind::Fatal, "division by zero")
        );
    }

    #[tokio::test]
    async fn read_file_stays_under_its_root() {
        let root = std::env::current_dir().unwrap().canonicalize().unwrap();
        let ctx = ToolContext::for_test().with_dep(FileRoot(root));
        assert!(
            read_file(ctx.clone(), "Cargo.toml".into())
                .await
                .unwrap()
                .contains("worker-sdk")
        );
        for escape in ["/etc/passwd", "../Cargo.toml", "src/../../Cargo.toml"] {
            let error = read_file(ctx.clone(), escape.into()).await.unwrap_err();
            assert_eq!(error.kind(), worker_sdk::ErrorKind::Fatal, "{escape}");
        }
        let missing = read_file(ctx, "no-such-file".into()).await.unwrap_err();
        assert_eq!(missing.kind(), worker_sdk::ErrorKind::Fatal);
    }

    #[tokio::test]
    async fn slow_reports_each_step_and_stops_when_cancelled() {
        let (ctx, mut progress) = ToolContext::for_test().with_progress_channel();
        assert_eq!(slow(ctx, 3, 1).await.unwrap(), "finished 3 steps");
        let last = std::iter::from_fn(|| progress.try_recv().ok()).last().unwrap();
        assert_eq!(
            (last.message.as_str(), last.current, last.total),
            ("step 3 of 3", Some(3), Some(3))
        );

        let token = CancellationToken::new();
        token.cancel();
        let ctx = ToolContext::for_test().with_cancellation(token);
        assert_eq!(
            slow(ctx, 5, 10_000).await.unwrap_err().message(),
            "cancelled at step 1 of 5"
        );
    }

    #[tokio::test]
    async fn the_tools_register_and_run_through_their_specs() {
        let tools = tools();
        assert!(tools.iter().all(|tool| tool.validate().is_ok()));
        let checksum = tools.iter().find(|tool| tool.definition().name == "checksum").unwrap();
        assert!(checksum.definition().options.blocking);
        let out = checksum
            .call(ToolContext::for_test(), json!({"text": "a"}))
            .await
            .unwrap();
        assert_eq!(out, json!("af63dc4c8601ec8c"));
        let echo = tools.iter().find(|tool| tool.definition().name == "echo").unwrap();
        let value = json!({"b": 2, "a": [1, null]});
        assert_eq!(
            echo.call(ToolContext::for_test(), json!({"value": value}))
                .await
                .unwrap(),
            value
        );
        let refund = tools.iter().find(|tool| tool.definition().name == "refund").unwrap();
        assert_eq!(
            refund.definition().options.approval,
            worker_sdk::Approval::When("args.cents > 10000".into())
        );
        let fail = tools.iter().find(|tool| tool.definition().name == "fail").unwrap();
        let error = fail
            .call(ToolContext::for_test(), json!({"message": "nope"}))
            .await
            .unwrap_err();
        assert_eq!(
            (error.kind(), error.message()),
            (worker_sdk::ErrorKind::Retryable, "nope")
        );
    }
}

// The docs' command lines, as the kernel's and kernelctl's tests read them.
#[cfg(test)]
#[path = "../../kernel/src/docs_commands.rs"]
mod docs_commands;
