//! Starting a subagent: a hosted handler's at place `seq` of its order (fenced by the run's
//! dispatch, checked against what the place recorded), or a tool body's (fenced by the call's
//! own dispatch, keyed under the call). The child run, hosted and linked to its parent and to the
//! step waiting for it, and that step are created together; a child of a session whose earlier
//! run has not finished waits for it, suspended. In a branch or case run the branch rule decides:
//! the parent's recorded child replayed, a child that is a branch of the parent's child, a case
//! run's child with its tokens, or a refusal, which ends the run.

use super::ending::{end_diverged, end_tree};
use super::local_step::StepRecorded;
use super::{Records, Result, held_step, parent_step};
use crate::machine::branch::{self, Verdict};
use crate::machine::effects::Effect;
use crate::machine::hosted::{self, Fence, Place};
use crate::machine::run::{EndRun, NewRun};
use crate::model::{RunId, RunRecord, StepKey, StepKind, StepRecord};

/// A subagent to start.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SubagentStart {
    pub parent: RunId,
    pub fence: Fence,
    pub seq: u32,
    pub occurrence: u32,
    pub child: NewRun,
}

/// What starting a subagent did, and the child's dispatch to queue (none when the child waits
/// for its session, or when it was started before).
pub type SubagentStarted = (StepRecorded, Option<Box<StepRecord>>);

/// Starts the subagent `start` asks for, or returns the one recorded at its place.
pub fn apply<R: Records + ?Sized>(records: &mut R, start: SubagentStart) -> Result<SubagentStarted> {
    let parent = records.run(&start.parent)?;
    if let Some(call) = held_step(records, &start.fence.dispatch_id, start.fence.attempt, None)?
        .filter(|step| step.kind == StepKind::Tool && step.run_id == parent.id)
    {
        let key = StepKey::tool_subagent(&call.key, &start.child.agent, start.occurrence);
        if let Some(recorded) = records.find_step(&parent.id, &key)? {
            return Ok((StepRecorded::Replayed(recorded), None));
        }
        return start_child(records, &parent, (call.turn, key), start.child);
    }
    let dispatch = records.find_step(&parent.id, &StepKey::agent())?;
    hosted::check_fence(&parent, dispatch.as_ref(), Some(&start.fence))?;
    let key = StepKey::subagent(&start.child.agent, start.occurrence);
    let at_place = records.steps_at_place(&parent.id, start.seq)?;
    let elsewhere: Vec<StepRecord> = records.find_step(&parent.id, &key)?.into_iter().collect();
    match hosted::place(start.seq, std::slice::from_ref(&key), &at_place, &elsewhere) {
        Err(message) => {
            let ended = end_diverged(records, &parent, &message)?;
            Ok((StepRecorded::Diverged { message, ended }, None))
        }
        Ok(Place::Recorded(mut steps)) => {
            let recorded = steps.remove(0);
            match hosted::same_child(&recorded, &start.child) {
                Ok(()) => Ok((StepRecorded::Replayed(recorded), None)),
                Err(message) => {
                    let ended = end_diverged(records, &parent, &message)?;
                    Ok((StepRecorded::Diverged { message, ended }, None))
                }
            }
        }
        Ok(Place::Open) => {
            let started = start_child(records, &parent, (start.seq, key), start.child)?;
            if let (StepRecorded::Recorded(step) | StepRecorded::Blocked { step, .. }, _) = &started {
                records.insert_place(step)?;
            }
            Ok(started)
        }
    }
}

/// Starts a subagent the record of `parent` does not hold, as the branch rule says in a branch or
/// case run.
fn start_child<R: Records + ?Sized>(
    records: &mut R,
    parent: &RunRecord,
    (seq, key): (u32, StepKey),
    mut child: NewRun,
) -> Result<SubagentStarted> {
    if branch::guarded(parent) {
        let subject = branch::Subject::Subagent {
            agent: &child.agent,
            session: child.session_key.is_some(),
        };
        let recorded = parent_step(records, parent, &key)?;
        match branch::judge(parent, subject, recorded.as_ref(), ("", &child.input)) {
            Verdict::Replay(recorded) => {
                let change = branch::replay(parent, &recorded, (seq, recorded.position), records.now());
                records.insert_step(&change.step)?;
                records.append(&parent.id, change.event, Some(change.step.clone()))?;
                return Ok((StepRecorded::Recorded(change.step), None));
            }
            Verdict::Blocked(refused) => {
                let message = refused.message(parent);
                let change = branch::blocked_subagent(parent, (seq, key), &child, message, records.now());
                records.insert_step(&change.step)?;
                records.append(&parent.id, change.event, Some(change.step.clone()))?;
                let reason = refused.run_reason(parent.capture);
                let (_, ended) = end_tree(records, parent, &EndRun::Fail { reason })?;
                let step = change.step;
                return Ok((StepRecorded::Blocked { step, ended }, None));
            }
            Verdict::BranchOf(of) => {
                child.fork = Some(crate::model::Fork {
                    of,
                    at: None,
                    results: Default::default(),
                });
            }
            Verdict::Live => child.allow = parent.allow.clone(),
        }
    }
    new_subagent(records, parent, (seq, key), child)
}

/// Creates a subagent's child run and the step `key` waiting for it, at place `seq`.
fn new_subagent<R: Records + ?Sized>(
    records: &mut R,
    parent: &RunRecord,
    (seq, key): (u32, StepKey),
    mut new: NewRun,
) -> Result<SubagentStarted> {
    new.parent = Some((parent.id.clone(), key.clone()));
    let session = new.session_key.clone();
    let busy = match &session {
        Some(session) => records.next_of_session(session)?.is_some(),
        None => false,
    };
    let (child, _, dispatch) = super::create_run::create(records, new)?;
    let mut dispatch = dispatch.expect("a subagent's run is hosted");
    if let (true, Some(session)) = (busy, session) {
        let change = hosted::wait_for_session(&dispatch, &session);
        records.save_step(&change.step)?;
        // No attempt ran: the event carries no step, so no attempt's span ends on it.
        records.append(&child.id, change.event, None)?;
        dispatch = change.step;
    }
    let change = hosted::subagent_step(parent, (seq, key), &child, records.now());
    records.insert_step(&change.step)?;
    records.append(&parent.id, change.event, Some(change.step.clone()))?;
    if !busy {
        records.effect(Effect::Dispatch(Box::new(dispatch.clone())));
    }
    Ok((StepRecorded::Recorded(change.step), (!busy).then(|| Box::new(dispatch))))
}
