//! Tasks (the `io.modelcontextprotocol/tasks` extension of 2026-07-28) backed by the log. A call
//! that is slow or waits for a person is returned to a client that declared the extension as a
//! task, and the task is the recorded call: its id names the run and the call, and `tasks/get`
//! reads the call back from the kernel, so any replica answers it, after any restart, until
//! retention deletes the run. Its status follows the call: `working` while it waits for a worker
//! or runs, `input_required` while it waits for a person (the approval's form, answered with
//! `tasks/update` as a retry's answer is), `completed` once it settled with a result (an error
//! result the model reads included), `cancelled` once cancelled. `tasks/cancel` cancels that
//! call only.

use std::time::Duration;

use rmcp::model::{
    CreateTaskResult, DetailedTask, GetTaskResult, InputRequests, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentClient, AgentError, RunSnapshot};

use super::approval::{self, Question};
use super::follow::cancel_call;
use super::results::{from_step, kernel_error, placed};
use super::stateless::{complete, is_own};

/// How long a call is followed before a client that takes tasks gets one instead.
pub(super) const TASK_AFTER: Duration = Duration::from_secs(1);
/// How often a client is asked to poll.
const POLL_INTERVAL_MS: u64 = 1000;
/// The prefix of a task's input request for the approval it waits on.
const APPROVAL_INPUT: &str = "approval:";

/// Whether the request's client declared the tasks extension (on this request: a server infers
/// nothing from earlier ones).
pub(super) fn client_takes_tasks(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

/// The task id of call `step` of `run`. A run id is a UUIDv7 with 74 random bits, so a task id
/// cannot be guessed; every task request is also made with the client's key, which must be able
/// to read the run.
fn task_id(run: &str, step: &str) -> String {
    format!("{run}:{step}")
}

/// The run and the call a task id names.
fn parse(task_id: &str) -> Result<(&str, &str), ErrorData> {
    task_id
        .split_once(':')
        .filter(|(run, step)| !run.is_empty() && !step.is_empty())
        .ok_or_else(|| ErrorData::invalid_params(format!("taskId: '{task_id}' is not a task of this server"), None))
}

/// The task of call `step` of `run`, once the kernel holds the call (a task is returned only
/// when a `tasks/get` of it would find it).
pub(super) async fn created(client: &AgentClient, run: &str, step: &str) -> Result<CreateTaskResult, ErrorData> {
    let (snapshot, call) = read(client, run, step).await?;
    let detailed = detailed(client, &snapshot.run, &call).await;
    Ok(CreateTaskResult::new(detailed.task))
}

/// `tasks/get`: the call as the log holds it now.
pub(super) async fn get(client: &AgentClient, task_id: &str) -> Result<GetTaskResult, ErrorData> {
    let (run, step) = parse(task_id)?;
    let (snapshot, call) = read(client, run, step).await?;
    let detailed = detailed(client, &snapshot.run, &call).await;
    if detailed.task.status.is_terminal() {
        settle_own_run(client, &snapshot, step).await;
    }
    Ok(GetTaskResult::new(detailed))
}

/// `tasks/update`: the answers to the approval the task waits on, made with the client's key.
pub(super) async fn update(
    client: &AgentClient,
    task_id: &str,
    responses: &rmcp::model::InputResponses,
    context: &RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    let (run, step) = parse(task_id)?;
    read(client, run, step).await?;
    for (key, response) in responses {
        // A key that is not an approval of this task's is not outstanding: ignored, as the
        // extension asks.
        if let Some(approval_id) = key.strip_prefix(APPROVAL_INPUT) {
            approval::answer(client, run, step, approval_id, response, context).await;
        }
    }
    Ok(())
}

/// `tasks/cancel`: cancels the task's call, and nothing else of its run.
pub(super) async fn cancel(client: &AgentClient, task_id: &str) -> Result<(), ErrorData> {
    let (run, step) = parse(task_id)?;
    let (snapshot, _) = read(client, run, step).await?;
    let handle = client.run(run);
    cancel_call(&handle, step, "cancelled by the MCP client (tasks/cancel)").await;
    settle_own_run(client, &snapshot, step).await;
    Ok(())
}

/// The run of a task and its call; an unknown run or call is `invalid params`, as the extension
/// asks for an unknown task.
async fn read(client: &AgentClient, run: &str, step: &str) -> Result<(RunSnapshot, pb::Step), ErrorData> {
    let snapshot = client.run(run).get().await.map_err(|error| match &error {
        AgentError::Status(status) if status.code() == tonic::Code::NotFound => unknown(run, step),
        _ => kernel_error(error),
    })?;
    let call = snapshot
        .steps
        .iter()
        .find(|s| s.step_key == step)
        .cloned()
        .ok_or_else(|| unknown(run, step))?;
    Ok((snapshot, call))
}

fn unknown(run: &str, step: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "taskId: no task {} (no call {step} in run {run}, or its run was deleted)",
            task_id(run, step)
        ),
        None,
    )
}

/// A settled call's own run is completed by whoever sees it settled first: the request that
/// made it, its watcher, or here, on any replica after any restart.
async fn settle_own_run(client: &AgentClient, snapshot: &RunSnapshot, step: &str) {
    let running = pb::RunStatus::try_from(snapshot.run.status).is_ok_and(|s| s == pb::RunStatus::Running);
    if running && is_own(&snapshot.run) {
        complete(&client.run(snapshot.run.id.clone()), step).await;
    }
}

/// The task of `call` of `run`, with what its status carries.
async fn detailed(client: &AgentClient, run: &pb::Run, call: &pb::Step) -> DetailedTask {
    let step = call.step_key.as_str();
    let status = pb::StepStatus::try_from(call.status).unwrap_or(pb::StepStatus::Unspecified);
    let payload = match status {
        pb::StepStatus::Succeeded | pb::StepStatus::Failed => {
            let result = placed(from_step(call).expect("a settled call has a result"), &run.id, step);
            TaskPayload::Completed {
                result: object(serde_json::to_value(result).unwrap_or_default()),
            }
        }
        pb::StepStatus::Cancelled => TaskPayload::Cancelled,
        pb::StepStatus::AwaitingApproval => match waiting_on(client, &run.id, call).await {
            Some(input_requests) => TaskPayload::InputRequired { input_requests },
            // The approval was answered between the two reads: the call is about to go on.
            None => TaskPayload::Working,
        },
        // A call whose body asked a person waits on the answer (and blocks its run).
        _ if run.status == pb::RunStatus::Blocked as i32 => match waiting_on(client, &run.id, call).await {
            Some(input_requests) => TaskPayload::InputRequired { input_requests },
            None => TaskPayload::Working,
        },
        _ => TaskPayload::Working,
    };
    let mut task = Task::new(
        task_id(&run.id, step),
        TaskStatus::Working,
        timestamp(call.created_at.as_ref()),
        timestamp(
            call.finished_at
                .as_ref()
                .or(call.started_at.as_ref())
                .or(call.created_at.as_ref()),
        ),
    )
    .with_status_message(status_message(call, status))
    .with_poll_interval_ms(POLL_INTERVAL_MS);
    // Kept for as long as the run is: until retention deletes it (unlimited here).
    task.ttl_ms = None;
    DetailedTask::new(task, payload)
}

/// The form of the approval call `call` waits on, keyed by the approval; `None` when there is no
/// pending approval of it any more.
async fn waiting_on(client: &AgentClient, run_id: &str, call: &pb::Step) -> Option<InputRequests> {
    let approval = client
        .list_approvals(Some(run_id), pb::ApprovalStatus::Pending)
        .await
        .ok()?
        .into_iter()
        .find(|a| approval::concerns(a, &call.step_key))?;
    let arguments: Value = serde_json::from_str(&approval.arguments_json).unwrap_or_default();
    let question = Question {
        tool: &approval.tool,
        arguments: &arguments,
        approval_id: &approval.id,
        message: &approval.message,
        reason: if approval.question {
            approval::HUMAN_INPUT
        } else {
            "an approval"
        },
    };
    let mut requests = InputRequests::new();
    requests.insert(
        format!("{APPROVAL_INPUT}{}", approval.id),
        approval::form(&question, Some(&approval)),
    );
    Some(requests)
}

/// What a task's status message says of its call.
fn status_message(call: &pb::Step, status: pb::StepStatus) -> String {
    match status {
        pb::StepStatus::Pending => format!("'{}' waits for a worker", call.tool),
        pb::StepStatus::Running => format!("'{}' runs on {} (attempt {})", call.tool, call.worker, call.attempts),
        pb::StepStatus::AwaitingApproval => format!("'{}' waits for a person's approval", call.tool),
        pb::StepStatus::Suspended => format!("'{}' waits on what it started", call.tool),
        pb::StepStatus::Succeeded => format!("'{}' succeeded", call.tool),
        pb::StepStatus::Failed => format!("'{}' ended with an error the model reads", call.tool),
        pb::StepStatus::Cancelled => format!("'{}' {}", call.tool, call.error),
        pb::StepStatus::Unspecified => format!("'{}' is recorded", call.tool),
    }
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        _ => JsonObject::new(),
    }
}

/// A recorded time as ISO 8601 (RFC 3339, UTC).
fn timestamp(time: Option<&prost_types::Timestamp>) -> String {
    time.map_or_else(|| "1970-01-01T00:00:00Z".to_owned(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_names_its_run_and_call() {
        let id = task_id("01a2-run", "id:pay:1");
        assert_eq!(parse(&id).unwrap(), ("01a2-run", "id:pay:1"));
        for bad in ["", "run-only", ":id:x", "run:"] {
            let error = parse(bad).unwrap_err();
            assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{bad}");
            assert!(error.message.starts_with("taskId:"), "{}", error.message);
        }
    }

    #[test]
    fn a_recorded_time_is_rfc_3339() {
        let time = prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        };
        assert_eq!(timestamp(Some(&time)), "2023-11-14T22:13:20Z");
    }
}
