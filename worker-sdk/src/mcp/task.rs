//! What an MCP server of 2026-07-28 may answer a call with instead of its result: a task (the
//! tasks extension), followed here until it ends, its requests for input put to a person.

use std::time::Duration;

use rmcp::model::{
    CallToolResult, CancelTaskParams, CreateTaskResult, GetTaskParams, InputRequests, TaskPayload, UpdateTaskParams,
};
use serde_json::Value;

use super::connection::McpConnection;
use super::wrap::{flatten_result, lost};
use crate::error::ToolError;
use crate::tool::Idempotency;

/// The poll interval when the server suggests none, and the bounds put on one it suggests.
const DEFAULT_POLL: Duration = Duration::from_secs(1);
const MIN_POLL: Duration = Duration::from_millis(50);
const MAX_POLL: Duration = Duration::from_secs(10);

/// Polls the task the server made of call `name` until it ends: its status messages are the
/// call's progress, a completed task's result is the call's, and a kernel cancel cancels the task.
/// A poll that fails is the call's error as a request that failed would be.
pub(super) async fn follow(
    server: &McpConnection,
    name: &str,
    idempotency: Idempotency,
    ctx: &crate::ToolContext,
    created: CreateTaskResult,
) -> Result<Value, ToolError> {
    let id = created.task.task_id;
    let mut poll = interval(created.task.poll_interval_ms);
    let mut said = created.task.status_message;
    let mut answered = std::collections::BTreeSet::new();
    if let Some(message) = &said {
        ctx.progress(message.clone());
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = ctx.cancelled() => {
                let _ = server.peer().cancel_task(CancelTaskParams::new(id.clone())).await;
                return Err(ToolError::fatal(format!("'{name}' was cancelled")));
            }
        }
        let task = match server.peer().get_task(GetTaskParams::new(id.clone())).await {
            Ok(got) => got.task,
            Err(error) => return lost(server, name, idempotency, ctx, &error).await,
        };
        poll = interval(task.task.poll_interval_ms);
        if task.task.status_message.is_some() && task.task.status_message != said {
            said = task.task.status_message.clone();
            ctx.progress(said.clone().unwrap_or_default());
        }
        match task.payload {
            TaskPayload::Completed { result } => {
                let result: CallToolResult = serde_json::from_value(Value::Object(result)).map_err(|error| {
                    ToolError::fatal(format!(
                        "MCP server '{}' completed task {id} of '{name}' with a result that is not a tool's: {error}",
                        server.name()
                    ))
                })?;
                return flatten_result(result);
            }
            TaskPayload::Failed { error } => {
                let message = error.get("message").and_then(Value::as_str).unwrap_or("no message");
                return Err(ToolError::fatal(format!(
                    "MCP server '{}' failed task {id} of '{name}': {message}",
                    server.name()
                )));
            }
            TaskPayload::Cancelled => {
                return Err(ToolError::fatal(format!(
                    "MCP server '{}' cancelled task {id} of '{name}'",
                    server.name()
                )));
            }
            TaskPayload::InputRequired { input_requests } => {
                // Each request is answered once: a poll that still shows it (the server has not
                // taken the update yet) does not ask again.
                let new: InputRequests = input_requests
                    .into_iter()
                    .filter(|(key, _)| answered.insert(key.clone()))
                    .collect();
                if new.is_empty() {
                    continue;
                }
                let responses = match super::input::answer(server, name, ctx, &new).await {
                    Ok(responses) => responses,
                    Err(error) => {
                        let _ = server.peer().cancel_task(CancelTaskParams::new(id.clone())).await;
                        return Err(error);
                    }
                };
                if let Err(error) = server
                    .peer()
                    .update_task(UpdateTaskParams::new(id.clone(), responses))
                    .await
                {
                    return lost(server, name, idempotency, ctx, &error).await;
                }
            }
            _ => {}
        }
    }
}

fn interval(suggested: Option<u64>) -> Duration {
    suggested
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_POLL)
        .clamp(MIN_POLL, MAX_POLL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suggested_poll_interval_is_kept_within_bounds() {
        assert_eq!(interval(None), DEFAULT_POLL);
        assert_eq!(interval(Some(250)), Duration::from_millis(250));
        assert_eq!(interval(Some(0)), MIN_POLL);
        assert_eq!(interval(Some(3_600_000)), MAX_POLL);
    }
}
