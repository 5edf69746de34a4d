//! A question to a person ([`question`]) from a tool body, a hosted handler or an external
//! agent's code: recorded under the call whose dispatch asks (fenced by that dispatch), under the
//! handler at its place in the handler's order (fenced by the run's dispatch), or under the id the
//! agent gave it (`question:run#<id>`), or the question recorded at the same identity given back;
//! then put to a person when its turn comes ([`super::ask::ask_next`]). A
//! call that settles while its questions are open withdraws them ([`super::dependents::withdraw`]), so no
//! run stays blocked on a question nobody waits for; a handler's go with its run.

use super::ending::end_diverged;
use super::local_step::StepRecorded;
use super::{Records, Result, held_step};
use crate::error::KernelError;
use crate::machine::hosted::{self, Fence, Place};
use crate::machine::question::{self, Asked};
use crate::model::{RunId, StepKey, StepKind, StepRecord};

/// A question to ask from the body of the tool call that dispatch `fence` holds in run `run`,
/// from the run's hosted handler when `fence` is the run's own dispatch, or, with no `fence`, from
/// the code of the external agent driving the run, under `question_id`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PersonAsk {
    pub run: RunId,
    pub fence: Option<Fence>,
    /// An external agent's question: its identity in the run, which the agent keeps across its
    /// restarts.
    #[serde(default)]
    pub question_id: String,
    /// A handler's question: its place in the handler's order.
    #[serde(default)]
    pub seq: u32,
    /// How many questions the body (or handler) asked before this one.
    pub occurrence: u32,
    pub asked: Asked,
}

/// The question's step: recorded now, recorded before (asked by an earlier attempt), or, for a
/// handler whose place holds something else, the run's end.
pub type PersonAsked = StepRecorded;

/// Records the question `ask` asks, or gives back the one recorded at its identity; a different
/// question at that identity is refused as `replay_input_changed` (and ends a handler's run, as
/// any divergence of a handler does).
pub fn apply<R: Records + ?Sized>(records: &mut R, ask: PersonAsk) -> Result<PersonAsked> {
    let Some(fence) = ask.fence.clone() else {
        return ask_from_agent(records, ask);
    };
    let call = held_step(records, &fence.dispatch_id, fence.attempt, None)?
        .filter(|step| step.kind == StepKind::Tool && step.run_id == ask.run);
    let Some(call) = call else {
        return ask_from_handler(records, ask, &fence);
    };
    let key = StepKey::tool_question(&call.key, ask.occurrence);
    if let Some(recorded) = asked_before(records, &ask.run, &key, &ask.asked)? {
        return Ok(recorded);
    }
    let place = (call.turn, call.position);
    Ok(StepRecorded::Recorded(record(
        records,
        &call,
        (key, place),
        &ask.asked,
    )?))
}

/// Records a hosted handler's question at place `ask.seq` of its order, or gives back the one
/// recorded there.
fn ask_from_handler<R: Records + ?Sized>(records: &mut R, ask: PersonAsk, fence: &Fence) -> Result<PersonAsked> {
    let run = records.run(&ask.run)?;
    let dispatch = records.find_step(&run.id, &StepKey::agent())?;
    let fenced = run.hosted && hosted::check_fence(&run, dispatch.as_ref(), Some(fence)).is_ok();
    let Some(dispatch) = dispatch.filter(|_| fenced) else {
        return Err(KernelError::FailedPrecondition(format!(
            "dispatch {} (attempt {}) holds neither a tool call of run {} nor its handler: only a running call's \
             body or the run's handler may ask a person; nothing was asked",
            fence.dispatch_id, fence.attempt, ask.run
        )));
    };
    let key = StepKey::tool_question(&dispatch.key, ask.occurrence);
    let at_place = records.steps_at_place(&run.id, ask.seq)?;
    let elsewhere: Vec<StepRecord> = records.find_step(&run.id, &key)?.into_iter().collect();
    let diverged = match hosted::place(ask.seq, std::slice::from_ref(&key), &at_place, &elsewhere) {
        Ok(Place::Open) => {
            let step = match replayed_from_parent(records, &run, (&key, (ask.seq, 0)), &ask.asked)? {
                Some(step) => step,
                None => record(records, &dispatch, (key, (ask.seq, 0)), &ask.asked)?,
            };
            records.insert_place(&step)?;
            return Ok(StepRecorded::Recorded(step));
        }
        Ok(Place::Recorded(mut steps)) => {
            let recorded = steps.remove(0);
            match same_question(&recorded, &ask.asked) {
                Ok(()) => return Ok(StepRecorded::Replayed(recorded)),
                Err(message) => message,
            }
        }
        Err(message) => message,
    };
    let ended = end_diverged(records, &run, &diverged)?;
    Ok(StepRecorded::Diverged {
        message: diverged,
        ended,
    })
}

/// Records the question an external agent's code asks under `ask.question_id`, or gives back the
/// one recorded there; another question under that id is refused as `replay_input_changed`, and
/// a hosted run's code asks from its handler, a finished run's not at all.
fn ask_from_agent<R: Records + ?Sized>(records: &mut R, ask: PersonAsk) -> Result<PersonAsked> {
    let run = records.run(&ask.run)?;
    let key = StepKey::run_question(&ask.question_id);
    if let Some(recorded) = asked_before(records, &run.id, &key, &ask.asked)? {
        return Ok(recorded);
    }
    if run.hosted {
        return Err(KernelError::FailedPrecondition(format!(
            "run {} is hosted: its handler asks a person (ctx.ask); nothing was asked",
            run.id
        )));
    }
    if run.status.is_terminal() {
        return Err(KernelError::FailedPrecondition(format!(
            "run {} is {}: nobody waits for an answer; nothing was asked",
            run.id, run.status
        )));
    }
    if let Some(step) = replayed_from_parent(records, &run, (&key, (0, 0)), &ask.asked)? {
        return Ok(StepRecorded::Recorded(step));
    }
    // The agent asks as its run's dispatch would (`agent:<name>` decides), though none exists.
    let asker = hosted::dispatch_step(
        &run,
        &hosted::HostedAgent {
            name: run.agent.clone(),
            fingerprint: String::new(),
            version: String::new(),
        },
        records.now(),
    );
    let change = question::question_step(&asker, (key, (0, 0)), &ask.asked, records.now());
    // No handler waits on it: the agent's own request does.
    let step = StepRecord {
        hosted: false,
        ..change.step
    };
    records.insert_step(&step)?;
    records.append(&run.id, change.event, Some(step.clone()))?;
    super::ask::ask_next(records, &run.id)?;
    Ok(StepRecorded::Recorded(step))
}

/// In a branch, the answer its parent recorded for the same question at `key` (by the fork
/// point; or the answer the fork put in its place), recorded as the branch's own at `place`:
/// nobody is asked again. A question the parent did not answer there is asked live: asking a
/// person changes nothing outside the kernel.
fn replayed_from_parent<R: Records + ?Sized>(
    records: &mut R,
    run: &crate::model::RunRecord,
    (key, place): (&StepKey, (u32, u32)),
    asked: &Asked,
) -> Result<Option<StepRecord>> {
    let Some(fork) = &run.fork else {
        return Ok(None);
    };
    let Some(parent) = super::parent_step(records, run, key)? else {
        return Ok(None);
    };
    let answered = parent.status.is_terminal() && fork.covers(&parent) && same_question(&parent, asked).is_ok();
    if !answered {
        return Ok(None);
    }
    let change = crate::machine::branch::replay(run, &parent, place, records.now());
    records.insert_step(&change.step)?;
    records.append(&run.id, change.event, Some(change.step.clone()))?;
    Ok(Some(change.step))
}

/// The question recorded at `key` (asked by an earlier attempt, or by the agent before its
/// restart), when it asked what `asked` asks; another question there is refused.
fn asked_before<R: Records + ?Sized>(
    records: &R,
    run: &RunId,
    key: &StepKey,
    asked: &Asked,
) -> Result<Option<PersonAsked>> {
    let Some(recorded) = records.find_step(run, key)? else {
        return Ok(None);
    };
    same_question(&recorded, asked).map_err(KernelError::FailedPrecondition)?;
    Ok(Some(StepRecorded::Replayed(recorded)))
}

/// Whether `recorded` asked what `asked` asks (its text and its schema, choices among it).
fn same_question(recorded: &StepRecord, asked: &Asked) -> std::result::Result<(), String> {
    let (asked_before, schema_before) = question::of_step(recorded);
    let schema: serde_json::Value = serde_json::from_str(&asked.schema).unwrap_or_default();
    if asked_before != asked.question || schema_before != schema {
        return Err(format!(
            "replay_input_changed: question {} was asked before as {asked_before:?} with another schema or text; \
             code run again must ask what it asked",
            recorded.key
        ));
    }
    Ok(())
}

/// Records question `key` of `asker` at `place` and puts it to a person when its turn comes.
fn record<R: Records + ?Sized>(
    records: &mut R,
    asker: &StepRecord,
    (key, place): (StepKey, (u32, u32)),
    asked: &Asked,
) -> Result<StepRecord> {
    let change = question::question_step(asker, (key, place), asked, records.now());
    let step = change.step.clone();
    records.insert_step(&step)?;
    records.append(&asker.run_id, change.event, Some(step.clone()))?;
    super::ask::ask_next(records, &asker.run_id)?;
    Ok(step)
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
            fence: Some(fence.clone()),
            question_id: String::new(),
            seq: 0,
            occurrence: 0,
            asked: Asked {
                question: question.into(),
                schema: r#"{"type":"integer"}"#.into(),
                approvers: Vec::new(),
                timeout_ms: None,
                choices: Vec::new(),
                default: None,
            },
        }
    }

    /// The question's step, and whether it was recorded before.
    fn asked(asked: PersonAsked) -> (StepRecord, bool) {
        match asked {
            StepRecorded::Recorded(step) => (step, false),
            StepRecorded::Replayed(step) => (step, true),
            other => panic!("not asked: {other:?}"),
        }
    }

    #[test]
    fn a_question_blocks_the_run_once_and_its_answer_settles_it_and_resumes_the_run() {
        let (mut records, call, fence) = running();
        let (question, replayed) = asked(apply(&mut records, ask(&call, &fence, "How many?")).unwrap());
        assert!(!replayed);
        assert_eq!(records.run(&call.run_id).unwrap().status, RunStatus::Blocked);
        let open = records.open_approvals(&call.run_id).unwrap();
        assert_eq!(open.len(), 1);
        assert!(open[0].is_question());

        // Asked again (a redispatched body): the same step, no second question.
        let (again, replayed) = asked(apply(&mut records, ask(&call, &fence, "How many?")).unwrap());
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
        let (question, _) = asked(apply(&mut records, ask(&call, &fence, "How many?")).unwrap());
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

    /// A hosted run whose handler runs under dispatch `h-1`, attempt 1.
    fn handling() -> (Memory, RunId, Fence) {
        let mut records = Memory::new(NOW);
        let new = crate::machine::run::NewRun {
            hosted: Some(crate::machine::hosted::HostedAgent {
                name: "planner".into(),
                fingerprint: "fp".into(),
                version: "1".into(),
            }),
            ..crate::machine::records::new_run()
        };
        let (run, _, _) = crate::machine::command::create_run::apply(&mut records, new).unwrap();
        let start = crate::machine::dispatch::StartDispatch {
            run_id: run.id.clone(),
            key: StepKey::agent(),
            dispatch_id: DispatchId::from_stored("h-1".into()),
            attempt: 1,
            worker: "w".into(),
            session_id: "s".into(),
            lease_expires_at: NOW + 60_000,
            replica: None,
            limits: Vec::new(),
            limit_wait_ms: 0,
        };
        crate::machine::command::start::apply(&mut records, start)
            .unwrap()
            .unwrap();
        let fence = Fence {
            dispatch_id: DispatchId::from_stored("h-1".into()),
            attempt: 1,
        };
        (records, run.id, fence)
    }

    fn from_handler(run: &RunId, fence: &Fence, seq: u32, question: &str) -> PersonAsk {
        PersonAsk {
            run: run.clone(),
            fence: Some(fence.clone()),
            question_id: String::new(),
            seq,
            occurrence: 0,
            asked: Asked {
                question: question.into(),
                schema: r#"{"enum":["refund","replace"]}"#.into(),
                approvers: Vec::new(),
                timeout_ms: Some(1_000),
                choices: vec!["refund".into(), "replace".into()],
                default: Some(r#""replace""#.into()),
            },
        }
    }

    #[test]
    fn a_handler_asks_at_its_place_and_an_expiry_records_the_default() {
        let (mut records, run, fence) = handling();
        let (question, replayed) = asked(apply(&mut records, from_handler(&run, &fence, 2, "Refund?")).unwrap());
        assert!(!replayed);
        assert_eq!(question.key.as_str(), "question:agent#0");
        assert!(question.hosted && question.turn == 2, "{question:?}");
        assert_eq!(records.steps_at_place(&run, 2).unwrap(), vec![question.clone()]);
        assert_eq!(
            crate::machine::hosted::wakes(&question).collect::<Vec<_>>(),
            vec![StepKey::agent()],
            "its settle wakes the handler, once"
        );
        assert_eq!(records.run(&run).unwrap().status, RunStatus::Blocked);
        let (_, replayed) = asked(apply(&mut records, from_handler(&run, &fence, 2, "Refund?")).unwrap());
        assert!(replayed, "the handler run again gets the recorded question");

        // Unanswered past its timeout, the question records its default, and the run resumes.
        records.now = NOW + 2_000;
        answer_approval::expire(&mut records).unwrap();
        let settled = records.find_step(&run, &question.key).unwrap().unwrap();
        assert_eq!(
            (settled.status, settled.output.as_deref()),
            (StepStatus::Succeeded, Some(r#""replace""#))
        );
        let approval = &records.state.approvals.values().next().unwrap();
        assert_eq!(approval.status, ApprovalStatus::Expired);
        assert_eq!(records.run(&run).unwrap().status, RunStatus::Running);
    }

    #[test]
    fn another_question_at_a_handler_s_place_fails_its_run_and_a_stale_dispatch_asks_nothing() {
        let (mut records, run, fence) = handling();
        let stale = Fence {
            attempt: 2,
            ..fence.clone()
        };
        let refused = apply(&mut records, from_handler(&run, &stale, 0, "Refund?")).unwrap_err();
        assert!(matches!(refused, KernelError::FailedPrecondition(_)), "{refused}");
        assert!(records.open_approvals(&run).unwrap().is_empty(), "nothing asked");

        asked(apply(&mut records, from_handler(&run, &fence, 0, "Refund?")).unwrap());
        let diverged = apply(&mut records, from_handler(&run, &fence, 0, "Replace?")).unwrap();
        let StepRecorded::Diverged { message, .. } = diverged else {
            panic!("not diverged: {diverged:?}");
        };
        assert!(message.starts_with("replay_input_changed:"), "{message}");
        assert_eq!(records.run(&run).unwrap().status, RunStatus::Failed);
    }
}
