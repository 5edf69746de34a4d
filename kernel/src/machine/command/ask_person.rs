//! A tool body's question to a person ([`question`]): recorded under the call whose dispatch
//! asks (fenced by that dispatch), or the question recorded at the same identity given back, then
//! put to a person when its turn comes ([`super::ask::ask_next`]). A call that settles while its
//! questions are open withdraws them ([`withdraw_questions`]), so no run stays blocked on a
//! question nobody waits for.

use super::{Records, Result, apply_change, held_step};
use crate::error::KernelError;
use crate::machine::cancel;
use crate::machine::hosted::Fence;
use crate::machine::question::{self, Asked};
use crate::model::{RunId, StepKey, StepKind, StepRecord};

/// A question to ask from the body of the tool call that dispatch `fence` holds in run `run`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PersonAsk {
    pub run: RunId,
    pub fence: Fence,
    /// How many questions the body asked before this one.
    pub occurrence: u32,
    pub asked: Asked,
}

/// The question's step, and whether it was recorded before (asked by an earlier attempt).
pub type PersonAsked = (StepRecord, bool);

/// Records the question `ask` asks, or gives back the one recorded at its identity; a different
/// question at that identity is refused as `replay_input_changed`.
pub fn apply<R: Records + ?Sized>(records: &mut R, ask: PersonAsk) -> Result<PersonAsked> {
    let call = held_step(records, &ask.fence.dispatch_id, ask.fence.attempt, None)?
        .filter(|step| step.kind == StepKind::Tool && step.run_id == ask.run)
        .ok_or_else(|| {
            KernelError::FailedPrecondition(format!(
                "dispatch {} (attempt {}) holds no tool call of run {}: only a running call's body may ask a \
                 person; nothing was asked",
                ask.fence.dispatch_id, ask.fence.attempt, ask.run
            ))
        })?;
    let key = StepKey::tool_question(&call.key, ask.occurrence);
    if let Some(recorded) = records.find_step(&ask.run, &key)? {
        let (asked_before, schema_before) = question::of_step(&recorded);
        let schema: serde_json::Value = serde_json::from_str(&ask.asked.schema).unwrap_or_default();
        if asked_before != ask.asked.question || schema_before != schema {
            return Err(KernelError::FailedPrecondition(format!(
                "replay_input_changed: question {key} was asked before as {asked_before:?} with another schema or \
                 text; a call run again must ask what it asked"
            )));
        }
        return Ok((recorded, true));
    }
    let change = question::question_step(&call, ask.occurrence, &ask.asked, records.now());
    let step = change.step.clone();
    records.insert_step(&step)?;
    records.append(&ask.run, change.event, Some(step.clone()))?;
    super::ask::ask_next(records, &ask.run)?;
    Ok((step, false))
}

/// Withdraws the open questions of `call`, which just settled: each settles as cancelled (its
/// approval withdrawn), and the run's next question is asked, or the run resumed. Returns the
/// questions settled.
pub fn withdraw_questions<R: Records + ?Sized>(records: &mut R, call: &StepRecord) -> Result<Vec<StepRecord>> {
    if call.kind != StepKind::Tool || !call.status.is_terminal() {
        return Ok(Vec::new());
    }
    // A body's questions are numbered from 0 in the order it asked them: a call that asked none
    // (nearly every call) costs one lookup by key.
    let mut withdrawn = Vec::new();
    for occurrence in 0.. {
        let key = StepKey::tool_question(&call.key, occurrence);
        let Some(open) = records.find_step(&call.run_id, &key)? else {
            break;
        };
        if open.status.is_terminal() {
            continue;
        }
        let approval = records.open_approval_of(&call.run_id, &open.key)?;
        let change = cancel::cancel_call(
            &open,
            approval.as_ref(),
            &format!("call {} settled ({})", call.key, call.status),
            records.now(),
        )?;
        if let Some(approval) = &change.withdrawn {
            records.save_approval(approval)?;
        }
        withdrawn.push(apply_change(records, change.settled)?);
    }
    if !withdrawn.is_empty() {
        super::ask::ask_next(records, &call.run_id)?;
    }
    Ok(withdrawn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::command::Records;
    use crate::machine::command::answer_approval::{self, Answer};
    use crate::machine::command::cancel_call;
    use crate::machine::command::memory::Memory;
    use crate::machine::records::{NOW, run, step};
    use crate::model::{ApprovalStatus, DispatchId, EventType, RunStatus, StepStatus};

    /// A run whose call `t0/p0` runs under dispatch `d-1`, attempt 1.
    fn running() -> (Memory, StepRecord, Fence) {
        let mut records = Memory::new(NOW);
        records.insert_run(&run()).unwrap();
        let mut call = step();
        call.status = StepStatus::Running;
        call.attempts = 1;
        call.dispatch_id = Some(DispatchId::from_stored("d-1".into()));
        records.insert_step(&call).unwrap();
        let fence = Fence {
            dispatch_id: DispatchId::from_stored("d-1".into()),
            attempt: 1,
        };
        (records, call, fence)
    }

    fn ask(call: &StepRecord, fence: &Fence, question: &str) -> PersonAsk {
        PersonAsk {
            run: call.run_id.clone(),
            fence: fence.clone(),
            occurrence: 0,
            asked: Asked {
                question: question.into(),
                schema: r#"{"type":"integer"}"#.into(),
                approvers: Vec::new(),
                timeout_ms: None,
            },
        }
    }

    #[test]
    fn a_question_blocks_the_run_once_and_its_answer_settles_it_and_resumes_the_run() {
        let (mut records, call, fence) = running();
        let (question, replayed) = apply(&mut records, ask(&call, &fence, "How many?")).unwrap();
        assert!(!replayed);
        assert_eq!(records.run(&call.run_id).unwrap().status, RunStatus::Blocked);
        let open = records.open_approvals(&call.run_id).unwrap();
        assert_eq!(open.len(), 1);
        assert!(open[0].is_question());

        // Asked again (a redispatched body): the same step, no second question.
        let (again, replayed) = apply(&mut records, ask(&call, &fence, "How many?")).unwrap();
        assert!(replayed);
        assert_eq!(again.key, question.key);
        assert_eq!(records.open_approvals(&call.run_id).unwrap().len(), 1);
        // Another question in its place is refused.
        let changed = apply(&mut records, ask(&call, &fence, "How few?")).unwrap_err();
        assert!(changed.to_string().contains("replay_input_changed"), "{changed}");

        // A call's approval takes no answer, and a question needs one.
        let id = open[0].id.clone();
        let none = answer_approval::answer(&mut records, &id, Answer::Approve { given: None }, ("bob", None));
        assert!(none.unwrap_err().to_string().contains("answer_json"));
        answer_approval::answer(
            &mut records,
            &id,
            Answer::Approve {
                given: Some("3".into()),
            },
            ("bob", None),
        )
        .unwrap();
        let settled = records.find_step(&call.run_id, &question.key).unwrap().unwrap();
        assert_eq!(settled.status, StepStatus::Succeeded);
        assert_eq!(settled.output.as_deref(), Some("3"));
        assert_eq!(records.approval(&id).unwrap().unwrap().answer.as_deref(), Some("3"));
        assert_eq!(records.run(&call.run_id).unwrap().status, RunStatus::Running);
        let kinds: Vec<EventType> = records.state.log[&call.run_id].iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventType::QuestionAsked,
                EventType::RunInterrupted,
                EventType::ApprovalAnswered,
                EventType::ToolResult,
                EventType::RunResumed
            ]
        );
    }

    #[test]
    fn only_the_dispatch_holding_a_running_call_may_ask() {
        let (mut records, call, fence) = running();
        let stale = Fence {
            attempt: 2,
            ..fence.clone()
        };
        let refused = apply(&mut records, ask(&call, &stale, "?")).unwrap_err();
        assert!(matches!(refused, KernelError::FailedPrecondition(_)), "{refused}");
        assert!(
            records.open_approvals(&call.run_id).unwrap().is_empty(),
            "nothing asked"
        );
    }

    #[test]
    fn a_call_that_settles_withdraws_its_open_question_and_the_run_goes_on() {
        let (mut records, call, fence) = running();
        let (question, _) = apply(&mut records, ask(&call, &fence, "How many?")).unwrap();
        let settled = cancel_call::cancel(&mut records, (&call.run_id, &call.key), "enough").unwrap();
        assert_eq!(settled.status, StepStatus::Cancelled);
        let withdrawn = records.find_step(&call.run_id, &question.key).unwrap().unwrap();
        assert_eq!(withdrawn.status, StepStatus::Cancelled);
        assert!(records.open_approvals(&call.run_id).unwrap().is_empty());
        let approval = records.state.approvals.values().next().unwrap();
        assert_eq!(approval.status, ApprovalStatus::Cancelled);
        assert_eq!(
            records.run(&call.run_id).unwrap().status,
            RunStatus::Running,
            "not blocked"
        );
    }
}
