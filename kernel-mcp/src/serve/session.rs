//! Calls of a 2025-11-25 MCP session (one that began with `initialize`): the session has one run,
//! created at its first call and completed when the session ends; each call is a turn of it, and
//! a call parked for a person keeps its request open.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rmcp::model::{CallToolResult, Implementation};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use worker_sdk::proto::canonical;
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentClient, AgentError, Call, NewRun, RunHandle};

use super::Bridge;
use super::follow::{AtPark, Followed, cancel_call, follow};
use super::results::{call_refusal, from_outcome, kernel_error, refused};

/// A session's run and the number of its next turn.
#[derive(Default)]
pub(super) struct Session {
    /// The session's run, created at its first call.
    pub(super) run: Arc<OnceCell<RunHandle>>,
    turn: AtomicU32,
}

/// Completes a session's run when the session goes (its client deleted it, or it idled out),
/// unless the bridge is stopping (`stopping` cancelled) or the run was ended already.
pub(super) struct EndOnDrop {
    pub(super) run: Arc<OnceCell<RunHandle>>,
    pub(super) stopping: CancellationToken,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if self.stopping.is_cancelled() {
            return;
        }
        if let (Some(run), Ok(runtime)) = (self.run.get(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(end_run(run.clone()));
        }
    }
}

/// Ends a session's run: each call still in flight is cancelled, then the run completes.
pub(super) async fn end_run(run: RunHandle) {
    for _ in 0..3 {
        let steps = match run.get().await {
            Ok(snapshot) => snapshot.steps,
            Err(error) => {
                tracing::warn!(run_id = run.id(), %error, "the mcp session's run not ended");
                return;
            }
        };
        for step in steps.iter().filter(|s| in_flight(s.status)) {
            cancel_call(&run, &step.step_key, "the MCP session ended").await;
        }
        match run.complete(json!({"mcp_session": "ended"})).await {
            Ok(()) => {
                tracing::info!(run_id = run.id(), "mcp session ended; its run completed");
                return;
            }
            // A call came in between: settle it too.
            Err(AgentError::Status(status)) if status.message().contains("in flight") => continue,
            Err(error) => {
                tracing::warn!(run_id = run.id(), %error, "the mcp session's run not completed");
                return;
            }
        }
    }
}

fn in_flight(status: i32) -> bool {
    !matches!(
        pb::StepStatus::try_from(status),
        Ok(pb::StepStatus::Succeeded | pb::StepStatus::Failed | pb::StepStatus::Cancelled)
    )
}

impl Session {
    /// Calls `name` as the session's next turn and waits for its result; a cancelled request
    /// cancels that one call.
    pub(super) async fn call(
        &self,
        client: &AgentClient,
        bridge: &Bridge,
        name: String,
        arguments: Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        // The call is position 0 of its own turn: its step key is known before it is recorded.
        let key = canonical::call_step_key(turn, 0, None);
        let run = self.run(client, bridge, context.client_info()).await?;
        let items = run.submit_turn(turn, vec![Call::new(name, arguments)]);
        match follow(items, context, AtPark::Wait).await {
            Ok(Followed::Settled(outcome)) => Ok(from_outcome(outcome)),
            Ok(Followed::Left | Followed::Parked(_)) => {
                cancel_call(&run, &key, "cancelled by the MCP client").await;
                Ok(refused("cancelled by the client".to_owned()))
            }
            Err(error) => call_refusal(error),
        }
    }

    /// The session's run, created at its first call.
    async fn run(
        &self,
        client: &AgentClient,
        bridge: &Bridge,
        info: Option<Implementation>,
    ) -> Result<RunHandle, ErrorData> {
        let run = self
            .run
            .get_or_try_init(|| async {
                let (name, version) = info.map(|i| (i.name, i.version)).unwrap_or_default();
                let new = bridge.new_run(&name, json!({"mcp_client": {"name": name, "version": version}}));
                client.create_run(new).await.map_err(kernel_error)
            })
            .await?;
        Ok(run.clone())
    }
}

impl Bridge {
    /// A run for an MCP client named `client` (its `clientInfo` name; `mcp-client` when it gives
    /// none), with the bridge's labels.
    pub(super) fn new_run(&self, client: &str, input: Value) -> NewRun {
        let agent = if client.trim().is_empty() { "mcp-client" } else { client };
        let mut new = NewRun::new(agent, input);
        for (key, value) in &self.labels {
            new = new.label(key.clone(), value.clone());
        }
        new
    }
}
