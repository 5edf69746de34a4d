//! Approvals: the gated calls of a run are put to a person one at a time, in (turn, position)
//! order; the run is blocked while one is open and runs again once none is left. An answer is
//! given once: approve lets the call go to a worker (its start consumes the approval), reject or
//! an expiry settles it without running.

use super::dispatch::settle;
use super::events::{self, Payload, RunInterrupted, RunResumed, SettledBy};
use super::{NewEvent, StepChange, json_or_string};
use crate::error::KernelError;
use crate::model::{
    ApprovalDecision, ApprovalId, ApprovalRecord, ApprovalStatus, ErrorKind, Millis, Outcome, RunRecord, RunStatus,
    StepKey, StepKind, StepRecord, StepStatus,
};

/// What asking the next gated call of a run changes.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// Nothing: a question is open already, or nothing waits and the run was not blocked.
    Nothing,
    /// Nothing waits any more: the blocked run runs again.
    Resume { run: Box<RunRecord>, event: NewEvent },
    /// Put a question to a person, blocking the run.
    Ask(Box<Question>),
}

/// A question to put to a person about one gated call.
#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    pub approval: ApprovalRecord,
    pub step: StepRecord,
    /// The run, when asking changes its status.
    pub run: Option<RunRecord>,
    pub event: NewEvent,
}

/// Decides what to ask next in `run`, which has `open` questions pending and `next` as its first
/// call awaiting approval; a new question gets the id `id`.
pub fn ask_next(run: &RunRecord, open: usize, next: Option<&StepRecord>, id: ApprovalId, now: Millis) -> Ask {
    if open > 0 {
        return Ask::Nothing;
    }
    let Some(step) = next else {
        if run.status != RunStatus::Blocked {
            return Ask::Nothing;
        }
        let mut resumed = run.clone();
        resumed.status = RunStatus::Running;
        resumed.updated_at = now;
        return Ask::Resume {
            run: Box::new(resumed),
            event: RunResumed {
                reason: "tool_approval".to_owned(),
            }
            .event(),
        };
    };
    let gate = step.approval_gate.clone().unwrap_or_default();
    let expires_at = gate.timeout_ms.map(|t| now + t as Millis);
    let event = RunInterrupted {
        reason: interrupted_for(&step.key, &gate.decided_by).to_owned(),
        approval_id: id.clone(),
        step_key: step.key.to_string(),
        position: step.position,
        tool_name: step.tool.clone(),
        tool_use_id: step.call_id.clone().unwrap_or_else(|| step.key.to_string()),
        tool_input: json_or_string(&step.arguments),
        approvers: gate.approvers.clone(),
        message: gate.message.clone(),
        decided_by: gate.decided_by.clone(),
        expires_at,
    }
    .event();
    let approval = ApprovalRecord {
        id,
        run_id: run.id.clone(),
        key: step.key.clone(),
        tool: step.tool.clone(),
        call_hash: step.call_hash.clone(),
        arguments: step.arguments.clone(),
        status: ApprovalStatus::Pending,
        approvers: gate.approvers,
        message: gate.message,
        decided_by: gate.decided_by,
        requested_at: now,
        expires_at,
        answered_at: None,
        decider: None,
        reason: None,
        capture: run.capture,
        answer: None,
    };
    let blocked = (run.status != RunStatus::Blocked).then(|| {
        let mut blocked = run.clone();
        blocked.status = RunStatus::Blocked;
        blocked.updated_at = now;
        blocked
    });
    Ask::Ask(Box::new(Question {
        approval,
        step: step.clone(),
        run: blocked,
        event,
    }))
}

/// Why a run blocks to ask about step `key` for what `decided_by` names: `human_input` for a tool
/// body's question, `budget_exceeded` for leave to raise a budget, else `tool_approval`.
pub fn interrupted_for(key: &StepKey, decided_by: &str) -> &'static str {
    if key.is_question() {
        "human_input"
    } else if super::budget::raised_by(decided_by).is_some() {
        "budget_exceeded"
    } else {
        "tool_approval"
    }
}

/// What an answer does to the gated step.
#[derive(Clone, Debug, PartialEq)]
pub enum Decided {
    /// Approved: pending again, to dispatch; its start consumes the approval.
    Approved(StepRecord),
    /// Settled without running: a call rejected or expired, or a question answered (its output the
    /// answer), declined or expired.
    Settled(StepChange),
}

/// An answer to one approval: the approval answered, the event that says so, and the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub approval: ApprovalRecord,
    pub event: NewEvent,
    pub step: Decided,
    /// An approval that asked to raise a budget, approved: the limit's new bounds, for the
    /// command to write to the run holding it.
    pub raise: Option<super::budget::Raise>,
}

/// Answers `approval` about `step` with `status` (approved, rejected or expired) as `decider`;
/// an approval that is not pending any more is refused: an answer is given once. A question's
/// approval carries `given`, the answer as canonical JSON (checked against its schema before).
pub fn answer(
    approval: &ApprovalRecord,
    step: &StepRecord,
    (status, decider, reason): (ApprovalStatus, &str, Option<&str>),
    given: Option<&str>,
    now: Millis,
) -> Result<Answer, KernelError> {
    if approval.status != ApprovalStatus::Pending {
        return Err(KernelError::FailedPrecondition(format!(
            "approval {} is already {}{}",
            approval.id,
            approval.status,
            approval
                .decider
                .as_ref()
                .map(|d| format!(" by {d}"))
                .unwrap_or_default()
        )));
    }
    debug_assert!(matches!(
        status,
        ApprovalStatus::Approved | ApprovalStatus::Rejected | ApprovalStatus::Expired
    ));
    let question = step.kind == StepKind::Question;
    let raising = super::budget::raised_by(&approval.decided_by).is_some();
    let given = given.filter(|_| status == ApprovalStatus::Approved);
    // A question that expires with a default is answered with it.
    let default = (question && status == ApprovalStatus::Expired)
        .then(|| super::question::default_of(step))
        .flatten();
    let given = given.or(default.as_deref());
    let mut raise = None;
    match given {
        Some(given) if raising => {
            raise = Some(super::budget::Raise::parse(given).map_err(|why| {
                KernelError::invalid(
                    "answer_json",
                    format!("approval {} raises a budget: {why}", approval.id),
                )
            })?);
        }
        None if raising && status == ApprovalStatus::Approved => {
            return Err(KernelError::invalid(
                "answer_json",
                format!(
                    "approval {} asks to raise a budget: answer it with the new limit as JSON, such as \
                     {{\"max_cost\": 10.0}} or {{\"max_calls\": 50}}",
                    approval.id
                ),
            ));
        }
        Some(_) if !question => {
            return Err(KernelError::invalid(
                "answer_json",
                format!(
                    "approval {} is for a call, not a question: approve it without an answer",
                    approval.id
                ),
            ));
        }
        Some(given) => super::question::check_answer(step, given)?,
        None if question && status == ApprovalStatus::Approved => {
            return Err(KernelError::invalid(
                "answer_json",
                format!("approval {} asks a question: answer it with JSON", approval.id),
            ));
        }
        None => {}
    }
    let mut answered = approval.clone();
    answered.status = status;
    answered.answered_at = Some(now);
    answered.decider = Some(decider.to_owned());
    answered.reason = reason.map(str::to_owned);
    answered.answer = given.map(str::to_owned);
    let event = events::ApprovalAnswered {
        approval_id: approval.id.clone(),
        step_key: approval.key.to_string(),
        tool: approval.tool.clone(),
        answer: status,
        decider: decider.to_owned(),
        reason: reason.map(str::to_owned),
        response: given.map(json_or_string),
    }
    .event();
    let mut decided = step.clone();
    decided.approval = Some(ApprovalDecision {
        approval_id: approval.id.clone(),
        answer: status,
        decider: decider.to_owned(),
        reason: reason.map(str::to_owned),
        answered_at: now,
    });
    let step = match given {
        Some(_) if raising => {
            decided.status = StepStatus::Pending;
            Decided::Approved(decided)
        }
        Some(given) => Decided::Settled(settle(
            &decided,
            (StepStatus::Succeeded, Outcome::Ok),
            Ok(given),
            0,
            SettledBy::default(),
            now,
        )),
        None if status == ApprovalStatus::Approved => {
            decided.status = StepStatus::Pending;
            Decided::Approved(decided)
        }
        None => Decided::Settled(refuse(&decided, raising, (status, decider, reason), now)),
    };
    Ok(Answer {
        approval: answered,
        event,
        step,
        raise,
    })
}

/// Settles `step`, rejected by `decider` (or expired when `status` says so), without running; a
/// call `raising` a budget settles as `budget_exceeded`.
fn refuse(
    step: &StepRecord,
    raising: bool,
    (status, decider, reason): (ApprovalStatus, &str, Option<&str>),
    now: Millis,
) -> StepChange {
    let question = step.kind == StepKind::Question;
    let (answer, outcome, mut message) = match status {
        ApprovalStatus::Expired if raising => (
            ApprovalStatus::Expired,
            Outcome::BudgetExceeded,
            format!(
                "'{}' did not run: its budget was passed and the approval to raise it expired unanswered",
                step.tool
            ),
        ),
        _ if raising => (
            ApprovalStatus::Rejected,
            Outcome::BudgetExceeded,
            format!(
                "'{}' did not run: its budget was passed and {decider} did not raise it",
                step.tool
            ),
        ),
        ApprovalStatus::Expired if question => (
            ApprovalStatus::Expired,
            Outcome::Expired,
            format!("the question of '{}' expired unanswered", step.tool),
        ),
        ApprovalStatus::Expired => (
            ApprovalStatus::Expired,
            Outcome::Expired,
            format!("'{}' was not approved: the approval expired unanswered", step.tool),
        ),
        _ if question => (
            ApprovalStatus::Rejected,
            Outcome::Rejected,
            format!("the question of '{}' was declined by {decider}", step.tool),
        ),
        _ => (
            ApprovalStatus::Rejected,
            Outcome::Rejected,
            format!("'{}' was not approved: rejected by {decider}", step.tool),
        ),
    };
    if let Some(reason) = reason.filter(|r| !r.is_empty()) {
        message.push_str(&format!(" ({reason})"));
    }
    let by = SettledBy {
        unapproved: Some(events::Unapproved {
            approval: answer,
            decider: decider.to_owned(),
            approval_reason: reason.map(str::to_owned),
        }),
        ..SettledBy::default()
    };
    settle(
        step,
        (StepStatus::Failed, outcome),
        Err((ErrorKind::Fatal, &message)),
        0,
        by,
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, run, step};
    use crate::model::ApprovalGate;
    use crate::model::EventType;

    fn gated(position: u32) -> StepRecord {
        let mut step = step();
        step.key = crate::model::StepKey::for_call(0, position, None);
        step.position = position;
        step.status = StepStatus::AwaitingApproval;
        step.approval_gate = Some(ApprovalGate {
            timeout_ms: Some(60_000),
            approvers: vec!["payments-oncall".into()],
            message: Some("check the ticket".into()),
            decided_by: "rule:big-refunds".into(),
        });
        step
    }

    fn asked(open: usize, next: Option<&StepRecord>, status: RunStatus) -> Ask {
        let mut run = run();
        run.status = status;
        ask_next(&run, open, next, "ap-1".into(), NOW)
    }

    #[test]
    fn questions_are_put_one_at_a_time_and_a_blocked_run_resumes_when_none_is_left() {
        let waiting = gated(1);
        // (open questions, next gated call, run status) -> what happens
        assert_eq!(
            asked(1, Some(&waiting), RunStatus::Blocked),
            Ask::Nothing,
            "one at a time"
        );
        assert_eq!(asked(0, None, RunStatus::Running), Ask::Nothing);
        let Ask::Resume { run, event } = asked(0, None, RunStatus::Blocked) else {
            panic!("a blocked run with nothing to ask resumes");
        };
        assert_eq!((run.status, event.kind), (RunStatus::Running, EventType::RunResumed));

        let Ask::Ask(question) = asked(0, Some(&waiting), RunStatus::Running) else {
            panic!("the next gated call is asked");
        };
        let Question {
            approval,
            step,
            run,
            event,
        } = *question;
        assert_eq!(approval.status, ApprovalStatus::Pending);
        assert_eq!(approval.key, waiting.key);
        assert_eq!(approval.expires_at, Some(NOW + 60_000));
        assert_eq!(approval.approvers, ["payments-oncall"]);
        assert_eq!(step.key, waiting.key);
        assert_eq!(run.map(|r| r.status), Some(RunStatus::Blocked));
        assert_eq!(event.kind, EventType::RunInterrupted);
        assert_eq!(event.payload["approval_id"], "ap-1");
        assert_eq!(event.payload["tool_use_id"], "t0/p1");
        let Ask::Ask(question) = asked(0, Some(&waiting), RunStatus::Blocked) else {
            panic!("asked");
        };
        assert_eq!(question.run, None, "an already blocked run stays as it is");
    }

    fn question(step: &StepRecord) -> ApprovalRecord {
        let Ask::Ask(question) = asked(0, Some(step), RunStatus::Running) else {
            panic!("asked");
        };
        question.approval
    }

    #[test]
    fn an_answer_is_given_once_and_only_approve_lets_the_call_run() {
        let waiting = gated(0);
        let open = question(&waiting);
        let cases: &[(ApprovalStatus, Option<Outcome>, &str)] = &[
            (ApprovalStatus::Approved, None, ""),
            (
                ApprovalStatus::Rejected,
                Some(Outcome::Rejected),
                "rejected by bob (no ticket)",
            ),
            (
                ApprovalStatus::Expired,
                Some(Outcome::Expired),
                "the approval expired unanswered",
            ),
        ];
        for &(status, outcome, said) in cases {
            let decider = if status == ApprovalStatus::Expired {
                "kernel"
            } else {
                "bob"
            };
            let answered = answer(&open, &waiting, (status, decider, Some("no ticket")), None, NOW).unwrap();
            assert_eq!(answered.approval.status, status);
            assert_eq!(answered.approval.decider.as_deref(), Some(decider));
            assert_eq!(answered.event.kind, EventType::ApprovalAnswered);
            match (answered.step, outcome) {
                (Decided::Approved(step), None) => {
                    assert_eq!(step.status, StepStatus::Pending, "to dispatch");
                    assert_eq!(step.approval.map(|a| a.decider), Some("bob".into()));
                }
                (Decided::Settled(change), Some(outcome)) => {
                    assert_eq!(change.step.status, StepStatus::Failed);
                    assert_eq!(change.step.outcome, Some(outcome));
                    assert_eq!(change.step.attempts, 0, "it never ran");
                    assert!(
                        change.step.error.as_deref().unwrap().contains(said),
                        "{:?}",
                        change.step.error
                    );
                    assert_eq!(change.event.kind, EventType::ToolResult);
                }
                (other, _) => panic!("{status}: {other:?}"),
            }
            let again = answer(
                &answered.approval,
                &waiting,
                (ApprovalStatus::Approved, "alice", None),
                None,
                NOW,
            );
            assert!(
                matches!(again, Err(KernelError::FailedPrecondition(ref m)) if m.contains("is already")),
                "{status}: {again:?}"
            );
        }
    }

    #[test]
    fn a_question_is_answered_with_its_json_or_settles_failed_declined_or_expired() {
        let mut call = step();
        call.status = StepStatus::Running;
        let asked = crate::machine::question::Asked {
            question: "How many?".into(),
            schema: r#"{"type":"integer"}"#.into(),
            approvers: Vec::new(),
            timeout_ms: Some(1_000),
            choices: Vec::new(),
            default: None,
        };
        let key = StepKey::tool_question(&call.key, 0);
        let waiting =
            crate::machine::question::question_step(&call, (key, (call.turn, call.position)), &asked, NOW).step;
        let Ask::Ask(put) = asked_about(&waiting) else {
            panic!("asked");
        };
        assert_eq!(put.event.payload["reason"], "human_input");
        let open = put.approval;
        assert!(open.is_question());
        assert_eq!(open.expires_at, Some(NOW + 1_000));

        let approved = (ApprovalStatus::Approved, "bob", None);
        let none = answer(&open, &waiting, approved, None, NOW);
        assert!(matches!(none, Err(KernelError::InvalidArgument { .. })), "{none:?}");
        let answered = answer(&open, &waiting, approved, Some("3"), NOW).unwrap();
        assert_eq!(answered.approval.answer.as_deref(), Some("3"));
        assert_eq!(answered.event.payload["response"], 3);
        let Decided::Settled(change) = answered.step else {
            panic!("an answered question settles");
        };
        assert_eq!(
            (change.step.status, change.step.output.as_deref()),
            (StepStatus::Succeeded, Some("3"))
        );

        for (status, said) in [
            (
                ApprovalStatus::Rejected,
                "the question of 'charge' was declined by bob (busy)",
            ),
            (ApprovalStatus::Expired, "the question of 'charge' expired unanswered"),
        ] {
            let refused = answer(&open, &waiting, (status, "bob", Some("busy")), None, NOW).unwrap();
            let Decided::Settled(change) = refused.step else {
                panic!("{status}: settled");
            };
            assert_eq!(change.step.status, StepStatus::Failed);
            let error = change.step.error.unwrap();
            assert!(error.starts_with(said), "{error}");
        }
    }

    fn asked_about(step: &StepRecord) -> Ask {
        ask_next(&run(), 0, Some(step), "ap-q".into(), NOW)
    }
}
