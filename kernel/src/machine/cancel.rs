//! Cancelling one call while its run goes on. A tool call still in flight (pending, waiting for a
//! slot, awaiting approval or running) is settled as cancelled with its one `tool:result`, by the
//! transition that settles the calls of a cancelled run; its open question, if one was put to a
//! person, is withdrawn. The run is not ended: it takes further turns. A call already settled is
//! refused (`FAILED_PRECONDITION`, naming how it ended), so a cancel never rewrites a result.

use super::StepChange;
use super::dispatch::settle;
use super::events::SettledBy;
use crate::error::KernelError;
use crate::model::{ApprovalRecord, ApprovalStatus, ErrorKind, Millis, Outcome, StepKind, StepRecord, StepStatus};

/// What cancelling one call changes, in the order the store applies it: its question withdrawn,
/// then the step settled.
#[derive(Clone, Debug, PartialEq)]
pub struct CallCancel {
    pub withdrawn: Option<ApprovalRecord>,
    pub settled: StepChange,
}

/// Cancels `step` for `reason`; `open` is the question put to a person about it, if any.
pub fn cancel_call(
    step: &StepRecord,
    open: Option<&ApprovalRecord>,
    reason: &str,
    now: Millis,
) -> Result<CallCancel, KernelError> {
    if !matches!(step.kind, StepKind::Tool | StepKind::Question) {
        // A hosted run's own dispatch or a subagent is the run's (or the child's) to end.
        return Err(KernelError::FailedPrecondition(format!(
            "step {} of run {} is a {} step, not a tool call; cancel the run instead",
            step.key, step.run_id, step.kind
        )));
    }
    if step.status.is_terminal() {
        return Err(KernelError::FailedPrecondition(format!(
            "call {} of run {} is already {}; only a call in flight can be cancelled",
            step.key, step.run_id, step.status
        )));
    }
    let withdrawn = open.filter(|a| a.status == ApprovalStatus::Pending).map(|a| {
        let mut withdrawn = a.clone();
        withdrawn.status = ApprovalStatus::Cancelled;
        withdrawn.answered_at = Some(now);
        withdrawn.reason = Some(reason.to_owned());
        withdrawn
    });
    let message = format!("cancelled: {reason}");
    let settled = settle(
        step,
        (StepStatus::Cancelled, Outcome::Cancelled),
        Err((ErrorKind::Fatal, &message)),
        0,
        SettledBy {
            cancel_reason: Some(reason.to_owned()),
            ..SettledBy::reason("call_cancelled")
        },
        now,
    );
    Ok(CallCancel { withdrawn, settled })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, step};
    use crate::model::EventType;

    fn question() -> ApprovalRecord {
        crate::machine::records::approval()
    }

    #[test]
    fn a_call_in_flight_settles_cancelled_with_one_result_the_model_reads() {
        for status in [
            StepStatus::Pending,
            StepStatus::Running,
            StepStatus::AwaitingApproval,
            StepStatus::Suspended,
        ] {
            let mut live = step();
            live.status = status;
            let cancelled = cancel_call(&live, None, "the client gave up", NOW).unwrap();
            let settled = &cancelled.settled;
            assert_eq!(settled.step.status, StepStatus::Cancelled, "{status}");
            assert_eq!(settled.step.outcome, Some(Outcome::Cancelled));
            assert_eq!(settled.step.error.as_deref(), Some("cancelled: the client gave up"));
            assert_eq!(settled.event.kind, EventType::ToolResult);
            assert_eq!(settled.event.payload["reason"], "call_cancelled");
            assert_eq!(settled.event.payload["cancel_reason"], "the client gave up");
            assert!(cancelled.withdrawn.is_none());
        }
    }

    #[test]
    fn a_gated_call_s_open_question_is_withdrawn() {
        let mut gated = step();
        gated.status = StepStatus::AwaitingApproval;
        let cancelled = cancel_call(&gated, Some(&question()), "not needed", NOW).unwrap();
        let withdrawn = cancelled.withdrawn.expect("the question is withdrawn");
        assert_eq!(withdrawn.status, ApprovalStatus::Cancelled);
        assert_eq!(withdrawn.answered_at, Some(NOW));
        let mut answered = question();
        answered.status = ApprovalStatus::Approved;
        let cancelled = cancel_call(&gated, Some(&answered), "late", NOW).unwrap();
        assert!(cancelled.withdrawn.is_none(), "an answered question stays as answered");
    }

    #[test]
    fn a_settled_call_or_another_kind_of_step_is_refused() {
        for status in [StepStatus::Succeeded, StepStatus::Failed, StepStatus::Cancelled] {
            let mut done = step();
            done.status = status;
            let refused = cancel_call(&done, None, "x", NOW).unwrap_err();
            assert!(matches!(refused, KernelError::FailedPrecondition(_)), "{status}");
            assert!(refused.to_string().contains(&format!("already {status}")), "{refused}");
        }
        let mut agent = step();
        agent.kind = StepKind::Agent;
        let refused = cancel_call(&agent, None, "x", NOW).unwrap_err();
        assert!(refused.to_string().contains("cancel the run instead"), "{refused}");
    }
}
