//! The benchmark's workers: `W` sessions opened from this process through `worker-sdk`, each
//! offering `bench_noop` (returns null; `bench_noop_once` too, declared `at_most_once`) and `bench_payload` (returns a string whose JSON encoding,
//! the result the kernel records and limits, is `bytes` long).
//!
//! They live until [`BenchWorkers::stop`] (or drop) cancels their shutdown token, so no session
//! outlives the command.

use std::time::{Duration, Instant};

use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_client::RegistryServiceClient;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use worker_sdk::{CancellationToken, Idempotency, Tls, Tool, ToolError, Worker, WorkerError, wrap_tool};

use super::BenchError;
use crate::client::{Access, Authed};
use crate::error::CliError;

/// The no-op tool.
pub const NOOP: &str = "bench_noop";
/// The no-op tool declared `at_most_once`, whose start is durable before it runs.
pub const NOOP_ONCE: &str = "bench_noop_once";
/// The tool whose result is a string of the requested size.
pub const PAYLOAD: &str = "bench_payload";

/// Largest result `bench_payload` builds, so a typo cannot exhaust memory.
pub const MAX_PAYLOAD: u64 = 64 << 20;

/// The string whose JSON encoding (with its two quotes) is `bytes` long; shorter sizes get an
/// empty string.
pub fn payload_text(bytes: u64) -> String {
    "x".repeat(bytes.saturating_sub(2) as usize)
}

const SESSIONS_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

fn noop_tool(name: &str, description: &str) -> Tool {
    wrap_tool(
        name,
        description,
        json!({"type": "object", "additionalProperties": false}),
        |_ctx, _args| async { Ok::<_, ToolError>(Value::Null) },
    )
}

fn payload_tool() -> Tool {
    wrap_tool(
        PAYLOAD,
        "Returns a string whose JSON encoding is `bytes` long (kernelctl bench).",
        json!({
            "type": "object",
            "properties": {"bytes": {"type": "integer", "minimum": 0, "maximum": MAX_PAYLOAD}},
            "required": ["bytes"],
            "additionalProperties": false
        }),
        |_ctx, args| async move {
            let bytes = args["bytes"]
                .as_u64()
                .filter(|b| *b <= MAX_PAYLOAD)
                .ok_or_else(|| ToolError::fatal(format!("bytes must be an integer up to {MAX_PAYLOAD}")))?;
            Ok::<_, ToolError>(payload_text(bytes))
        },
    )
}

/// `W` worker sessions running in this process.
pub struct BenchWorkers {
    shutdown: CancellationToken,
    tasks: JoinSet<Result<(), WorkerError>>,
}

impl BenchWorkers {
    /// Opens `count` sessions of `slots` concurrent calls each, named `<prefix>-<i>`, and waits
    /// until the kernel lists them all.
    pub async fn start(
        addr: &str,
        access: &Access,
        registry: RegistryServiceClient<Authed>,
        prefix: &str,
        count: u32,
        slots: u32,
    ) -> Result<BenchWorkers, BenchError> {
        let shutdown = CancellationToken::new();
        let mut workers = BenchWorkers {
            shutdown: shutdown.clone(),
            tasks: JoinSet::new(),
        };
        let tls = match &access.tls_ca {
            Some(path) => Some(Tls::from_ca_file(path).map_err(|err| CliError::TlsCa {
                path: path.display().to_string(),
                cause: err.to_string(),
            })?),
            None => None,
        };
        for index in 0..count {
            let mut builder = Worker::builder(addr)
                .name(format!("{prefix}-{index}"))
                .max_concurrency(slots)
                .drain_timeout(Duration::from_secs(5))
                // The bench's tools leave with its sessions: no bench_* in `tools list` or in an
                // agent's unknown-tool message afterwards.
                .ephemeral_tools()
                .tool(noop_tool(NOOP, "Does nothing and returns null (kernelctl bench)."))
                .tool(
                    noop_tool(
                        NOOP_ONCE,
                        "Does nothing and returns null, declared at_most_once (kernelctl bench).",
                    )
                    .idempotency(Idempotency::AtMostOnce),
                )
                .tool(payload_tool());
            if let Some(tls) = &tls {
                builder = builder.tls(tls.clone());
            }
            if let Some(secret) = &access.api_key {
                builder = builder.api_key(secret.trim());
            }
            let worker = builder.build().map_err(BenchError::Worker)?;
            let token = shutdown.clone();
            workers.tasks.spawn(async move { worker.run(token).await });
        }
        workers.wait_for_sessions(registry, prefix, count).await?;
        Ok(workers)
    }

    async fn wait_for_sessions(
        &mut self,
        mut registry: RegistryServiceClient<Authed>,
        prefix: &str,
        count: u32,
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + SESSIONS_TIMEOUT;
        let ours = format!("{prefix}-");
        loop {
            // A worker that returned before its session opened was refused by the kernel.
            if let Some(ended) = self.tasks.try_join_next() {
                return Err(match ended {
                    Ok(Err(error)) => BenchError::Worker(error),
                    Ok(Ok(())) => BenchError::Setup("a bench worker stopped before its session opened".into()),
                    Err(panic) => BenchError::Setup(format!("a bench worker panicked: {panic}")),
                });
            }
            let listed = registry
                .list_workers(pb::ListWorkersRequest {})
                .await?
                .into_inner()
                .workers
                .iter()
                .filter(|w| w.name.starts_with(&ours) && w.tools.iter().any(|t| t == NOOP))
                .count();
            if listed >= count as usize {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Setup(format!(
                    "only {listed} of {count} bench worker sessions opened within {}s",
                    SESSIONS_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drains every session and waits (boundedly) for them to close.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let all_closed = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_TIMEOUT, all_closed).await.is_err() {
            self.tasks.abort_all();
        }
    }
}

impl Drop for BenchWorkers {
    fn drop(&mut self) {
        // On an early return the sessions still end: the token stops them, the set aborts them.
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_results_encode_to_the_requested_size() {
        for bytes in [2, 100, 10 << 10, 1 << 20] {
            assert_eq!(serde_json::to_string(&payload_text(bytes)).unwrap().len() as u64, bytes);
        }
        assert_eq!(payload_text(1), "");
    }
}
