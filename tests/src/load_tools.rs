//! The tools of the load tests, run by workers in the test's own process: `step` (safe to run
//! again) and `pay` (`at_most_once`), each recording every start in a [`Ledger`] shared by all
//! the process's workers, so a test can tell whether any call ran twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use worker_sdk::{CancellationToken, Idempotency, ToolContext, ToolError, Worker, tool};

/// How often each `(tool, idempotency key)` started, across every worker of this process.
#[derive(Clone, Default)]
pub struct Ledger(pub Arc<Mutex<HashMap<(String, String), u32>>>);

impl Ledger {
    fn start(ctx: &ToolContext) {
        let ledger = ctx.deps::<Ledger>().expect("ledger dependency");
        let key = (ctx.tool_name().to_owned(), ctx.idempotency_key().to_owned());
        *ledger.0.lock().expect("ledger lock").entry(key).or_default() += 1;
    }

    /// The `at_most_once` calls that started more than once.
    pub fn paid_twice(&self) -> Vec<((String, String), u32)> {
        let ledger = self.0.lock().expect("ledger lock");
        ledger
            .iter()
            .filter(|((tool, _), n)| tool == "pay" && **n > 1)
            .map(|(key, n)| (key.clone(), *n))
            .collect()
    }
}

/// Safe to run again: record, hold, answer.
#[tool]
async fn step(ctx: ToolContext, n: u64, hold_ms: u64) -> Result<u64, ToolError> {
    Ledger::start(&ctx);
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    Ok(n)
}

/// Must not run twice.
#[tool(idempotency = "at_most_once")]
async fn pay(ctx: ToolContext, n: u64, hold_ms: u64) -> Result<u64, ToolError> {
    Ledger::start(&ctx);
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    Ok(n)
}

/// A worker named `name` on `url` offering `step` and `pay` with 32 slots; aborting its task drops
/// its session without a goodbye, as a crash would.
pub fn start_worker(url: &str, name: String, ledger: &Ledger) -> tokio::task::JoinHandle<()> {
    let worker = Worker::builder(url.to_owned())
        .name(name)
        .max_concurrency(32)
        .tool(step_tool())
        .tool(pay_tool().idempotency(Idempotency::AtMostOnce))
        .deps(ledger.clone())
        .build()
        .expect("worker config");
    tokio::spawn(async move {
        let _ = worker.run(CancellationToken::new()).await;
    })
}
