//! The agent's messages: creating a run, submitting a turn, and reading its results, progress and
//! interruptions back.

use kernel_proto::canonical::to_canonical;
use kernel_proto::v1 as pb;
use serde_json::Value;

use super::outcome::{ApprovalAnswer, ApprovalDecision, Outcome};
use super::{
    AgentError, BudgetLimit, Call, CallOutcome, CallStatus, Capture, Interruption, NewRun, ProgressUpdate, TurnItem,
};
use crate::error::error_kind_from_pb;
use crate::fields::optional_json;

pub(crate) fn create_run_request(run: NewRun) -> pb::CreateRunRequest {
    pb::CreateRunRequest {
        hosted: false,
        agent: run.agent,
        input_json: to_canonical(&run.input),
        labels: run.labels.into_iter().collect(),
        idempotency_key: run.idempotency_key.unwrap_or_default(),
        max_tool_calls: run.max_tool_calls,
        non_interactive: run.non_interactive,
        permissions: run.permissions,
        max_concurrency: run.max_concurrency,
        allow: run.allow,
        budget: run.budget.into_iter().map(BudgetLimit::into_pb).collect(),
        capture: match run.capture {
            Capture::None => pb::Capture::None,
            Capture::Metadata => pb::Capture::Metadata,
            Capture::Io => pb::Capture::Io,
        } as i32,
    }
}

pub(crate) fn fork_run_request(fork: super::Fork) -> pb::ForkRunRequest {
    pb::ForkRunRequest {
        run_id: fork.run_id,
        at_step_key: fork.at.unwrap_or_default(),
        input_json: fork.input.map(|input| to_canonical(&input)).unwrap_or_default(),
        set_results: fork
            .set_results
            .into_iter()
            .map(|(key, result)| (key, to_canonical(&result)))
            .collect(),
        labels: fork.labels.into_iter().collect(),
        idempotency_key: fork.idempotency_key.unwrap_or_default(),
        budget: fork.budget.into_iter().map(BudgetLimit::into_pb).collect(),
    }
}

pub(crate) fn submit_turn_request(
    run_id: &str,
    turn: u32,
    calls: Vec<Call>,
    (offered_tools, max_concurrency): (&[String], u32),
) -> pb::SubmitTurnRequest {
    pb::SubmitTurnRequest {
        run_id: run_id.to_owned(),
        turn,
        offered_tools: offered_tools.to_vec(),
        max_concurrency,
        calls: calls.into_iter().map(tool_call).collect(),
    }
}

/// One call as the kernel takes it.
pub(crate) fn tool_call(call: Call) -> pb::ToolCall {
    pb::ToolCall {
        tool: call.tool,
        arguments_json: to_canonical(&call.arguments),
        call_id: call.id.unwrap_or_default(),
        timeout_ms: call.timeout.map(|t| t.as_millis() as u64).unwrap_or(0),
    }
}

/// Decodes one item of a turn's response stream; `None` for an empty item.
pub(crate) fn turn_item(response: pb::SubmitTurnResponse) -> Result<Option<TurnItem>, AgentError> {
    use pb::submit_turn_response::Item;
    Ok(match response.item {
        None => None,
        Some(Item::Result(result)) => Some(TurnItem::Result(call_outcome(result)?)),
        Some(Item::Progress(progress)) => Some(TurnItem::Progress(progress_update(progress))),
        Some(Item::Interrupted(interruption)) => Some(TurnItem::Interrupted(Interruption {
            position: interruption.position,
            step_key: interruption.step_key,
            tool: interruption.tool,
            reason: interruption.reason,
            approval_id: interruption.approval_id,
            arguments: optional_json(&interruption.arguments_json)?.unwrap_or(Value::Null),
            message: interruption.message,
        })),
    })
}

pub(crate) fn call_outcome(result: pb::CallResult) -> Result<CallOutcome, AgentError> {
    let status = match pb::CallStatus::try_from(result.status) {
        Ok(pb::CallStatus::Ok) => CallStatus::Ok,
        Ok(pb::CallStatus::Cancelled) => CallStatus::Cancelled,
        _ => CallStatus::Error,
    };
    let output = if status == CallStatus::Ok {
        optional_json(&result.output_json)?
    } else {
        None
    };
    Ok(CallOutcome {
        position: result.position,
        step_key: result.step_key,
        tool: result.tool,
        status,
        content: result.content,
        output,
        error_kind: error_kind_from_pb(result.error_kind),
        replayed: result.replayed,
        attempts: result.attempts,
        outcome: outcome_from_pb(result.outcome),
        decided_by: Some(result.decided_by).filter(|d| !d.is_empty()),
        approval: result.approval.and_then(approval_decision),
    })
}

fn outcome_from_pb(value: i32) -> Outcome {
    match pb::CallOutcome::try_from(value) {
        Ok(pb::CallOutcome::Ok) => Outcome::Ok,
        Ok(pb::CallOutcome::ToolError) => Outcome::ToolError,
        Ok(pb::CallOutcome::InvalidArguments) => Outcome::InvalidArguments,
        Ok(pb::CallOutcome::UnknownTool) => Outcome::UnknownTool,
        Ok(pb::CallOutcome::Denied) => Outcome::Denied,
        Ok(pb::CallOutcome::Rejected) => Outcome::Rejected,
        Ok(pb::CallOutcome::Expired) => Outcome::Expired,
        Ok(pb::CallOutcome::TimedOut) => Outcome::TimedOut,
        Ok(pb::CallOutcome::Indeterminate) => Outcome::Indeterminate,
        Ok(pb::CallOutcome::Poison) => Outcome::Poison,
        Ok(pb::CallOutcome::Cancelled) => Outcome::Cancelled,
        Ok(pb::CallOutcome::ReplayInputChanged) => Outcome::ReplayInputChanged,
        Ok(pb::CallOutcome::LimitExceeded) => Outcome::LimitExceeded,
        Ok(pb::CallOutcome::BudgetExceeded) => Outcome::BudgetExceeded,
        Ok(pb::CallOutcome::NoWorker) => Outcome::NoWorker,
        Ok(pb::CallOutcome::WriteToolBlocked) => Outcome::WriteToolBlocked,
        Ok(pb::CallOutcome::Unspecified) | Err(_) => Outcome::Unknown,
    }
}

/// An approval's answer; `None` for one that is not an answer (pending, or unknown to this SDK).
fn approval_decision(decision: pb::ApprovalDecision) -> Option<ApprovalDecision> {
    let answer = match pb::ApprovalStatus::try_from(decision.answer) {
        Ok(pb::ApprovalStatus::Approved | pb::ApprovalStatus::Consumed) => ApprovalAnswer::Approved,
        Ok(pb::ApprovalStatus::Rejected) => ApprovalAnswer::Rejected,
        Ok(pb::ApprovalStatus::Expired) => ApprovalAnswer::Expired,
        _ => return None,
    };
    Some(ApprovalDecision {
        approval_id: decision.approval_id,
        answer,
        decider: decision.decider,
        reason: Some(decision.reason).filter(|r| !r.is_empty()),
    })
}

fn progress_update(progress: pb::Progress) -> ProgressUpdate {
    let fraction = progress.total > 0;
    ProgressUpdate {
        position: progress.position,
        step_key: progress.step_key,
        tool: progress.tool,
        message: progress.message,
        current: fraction.then_some(progress.current),
        total: fraction.then_some(progress.total),
        // Progress is advisory: detail that does not parse is dropped rather than failing the turn.
        data: optional_json(&progress.data_json).ok().flatten(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn call_results_decode_output_only_when_ok() {
        let ok = pb::CallResult {
            status: pb::CallStatus::Ok as i32,
            content: "5".into(),
            output_json: "5".into(),
            ..Default::default()
        };
        let outcome = call_outcome(ok).unwrap();
        assert_eq!((outcome.status, outcome.output), (CallStatus::Ok, Some(json!(5))));
        let failed = pb::CallResult {
            status: pb::CallStatus::Error as i32,
            content: "unknown tool 'x'; available: add".into(),
            error_kind: pb::ErrorKind::Fatal as i32,
            ..Default::default()
        };
        let outcome = call_outcome(failed).unwrap();
        assert_eq!(outcome.status, CallStatus::Error);
        assert_eq!(outcome.error_kind, Some(ErrorKind::Fatal));
        assert!(outcome.output.is_none());
        assert_eq!(outcome.outcome, Outcome::Unknown, "an outcome this SDK cannot read");
        assert!(outcome.rejection().is_none());
    }

    #[test]
    fn a_gated_call_that_was_not_approved_reads_as_a_typed_rejection() {
        let result = |outcome: pb::CallOutcome, answer: pb::ApprovalStatus, reason: &str| pb::CallResult {
            tool: "refund".into(),
            status: pb::CallStatus::Error as i32,
            content: "'refund' was not approved".into(),
            outcome: outcome as i32,
            decided_by: "rule:big-refunds".into(),
            approval: Some(pb::ApprovalDecision {
                approval_id: "ap-1".into(),
                answer: answer as i32,
                decider: "alice".into(),
                reason: reason.into(),
                answered_at: None,
            }),
            ..Default::default()
        };
        let rejected = call_outcome(result(
            pb::CallOutcome::Rejected,
            pb::ApprovalStatus::Rejected,
            "too much",
        ))
        .unwrap();
        assert_eq!(rejected.decided_by.as_deref(), Some("rule:big-refunds"));
        let rejection = rejected.rejection().expect("a rejection");
        assert_eq!(
            rejection,
            crate::ToolCallRejected {
                tool_name: "refund".into(),
                reason: Some("too much".into()),
                expired: false,
                decider: "alice".into(),
            }
        );
        assert_eq!(rejection.to_string(), "'refund' was not approved: too much");
        let expired = call_outcome(result(pb::CallOutcome::Expired, pb::ApprovalStatus::Expired, "")).unwrap();
        assert!(expired.rejection().expect("expiry is a rejection").expired);
        let approved = call_outcome(result(pb::CallOutcome::Ok, pb::ApprovalStatus::Consumed, "ok")).unwrap();
        assert!(approved.rejection().is_none());
        assert_eq!(approved.approval.unwrap().answer, ApprovalAnswer::Approved);
    }

    #[test]
    fn a_new_run_sends_everything_create_run_takes() {
        let request = create_run_request(
            NewRun::new("billing", json!({"order": 9}))
                .label("env", "prod")
                .idempotency_key("order-9")
                .max_tool_calls(20)
                .non_interactive()
                .permission("billing:write")
                .capture(Capture::Metadata),
        );
        assert_eq!(request.agent, "billing");
        assert_eq!(request.input_json, r#"{"order":9}"#);
        assert_eq!(request.labels.get("env").map(String::as_str), Some("prod"));
        assert_eq!(request.idempotency_key, "order-9");
        assert_eq!(request.max_tool_calls, 20);
        assert!(request.non_interactive);
        assert_eq!(request.permissions, ["billing:write"]);
        assert_eq!(request.capture, pb::Capture::Metadata as i32);
    }
}
