//! A hosted handler's local step, fenced by the run's dispatch and checked against what its place
//! in the handler's order recorded: a step recorded before keeps its first outcome, one that
//! differs from its place fails the run ([`hosted::place`]). In a branch or case run the branch
//! rule judges a step the run's record does not hold, before it runs ([`check`]) and again when
//! it is recorded ([`record`], for a handler that did not ask first): replayed from the parent,
//! run live, or refused, which ends the run.

use super::ending::{end_diverged, end_tree};
use super::{Records, Result, insert_at_place, parent_step};
use crate::machine::branch::{self, Verdict};
use crate::machine::hosted::{self, Fence, LocalStep, Place};
use crate::machine::run::EndRun;
use crate::model::{RunId, RunRecord, StepKey, StepRecord};

/// What recording (or checking) a local step or starting a subagent did.
#[derive(Clone, Debug)]
pub enum StepRecorded {
    Recorded(StepRecord),
    /// Recorded before (by an earlier attempt of the handler): that outcome stands.
    Replayed(StepRecord),
    /// The handler is not deterministic: its place holds another step. The run ended failed with
    /// it: `ended` are the steps that settled on the way, to cancel on their workers.
    Diverged {
        message: String,
        ended: Vec<StepRecord>,
    },
    /// The branch rule lets the step run live; nothing was recorded.
    Allowed,
    /// The branch rule refused the step (recorded so) and ended the run: `ended` are the steps
    /// that settled on the way, to cancel on their workers.
    Blocked {
        step: StepRecord,
        ended: Vec<StepRecord>,
    },
}

/// Records a finished local step of run `run_id`.
pub fn record<R: Records + ?Sized>(
    records: &mut R,
    run_id: &RunId,
    fence: &Fence,
    local: LocalStep,
) -> Result<StepRecorded> {
    let key = StepKey::local(&local.step_id, local.occurrence);
    let run = match place_local(records, run_id, fence, local.seq, &key)? {
        Ok(run) => run,
        Err(placed) => return Ok(placed),
    };
    if branch::guarded(&run) && !local.denied {
        let verdict = judge_local(records, &run, &key, &local)?;
        if !matches!(verdict, Verdict::Live) {
            return settle_by_rule(records, &run, &local, verdict);
        }
    }
    let change = hosted::record_local(&run, &local, records.now());
    Ok(StepRecorded::Recorded(insert_at_place(records, change)?))
}

/// Asks the branch rule whether a local step of run `run_id` may run, before it runs:
/// [`StepRecorded::Allowed`] when it may (a read, or allowed by a token, or no branch at all),
/// else the step as the rule settles it. `local`'s outcome is not used.
pub fn check<R: Records + ?Sized>(
    records: &mut R,
    run_id: &RunId,
    fence: &Fence,
    local: LocalStep,
) -> Result<StepRecorded> {
    let key = StepKey::local(&local.step_id, local.occurrence);
    let run = match place_local(records, run_id, fence, local.seq, &key)? {
        Ok(run) => run,
        Err(placed) => return Ok(placed),
    };
    if !branch::guarded(&run) {
        return Ok(StepRecorded::Allowed);
    }
    match judge_local(records, &run, &key, &local)? {
        Verdict::Live => Ok(StepRecorded::Allowed),
        verdict => settle_by_rule(records, &run, &local, verdict),
    }
}

/// The run of a local step at an open place; otherwise what its place says (replayed, or
/// diverged, which fails the run).
fn place_local<R: Records + ?Sized>(
    records: &mut R,
    run_id: &RunId,
    fence: &Fence,
    seq: u32,
    key: &StepKey,
) -> Result<std::result::Result<RunRecord, StepRecorded>> {
    let run = records.run(run_id)?;
    let dispatch = records.find_step(&run.id, &StepKey::agent())?;
    hosted::check_fence(&run, dispatch.as_ref(), Some(fence))?;
    let at_place = records.steps_at_place(&run.id, seq)?;
    let elsewhere: Vec<StepRecord> = records.find_step(&run.id, key)?.into_iter().collect();
    Ok(
        match hosted::place(seq, std::slice::from_ref(key), &at_place, &elsewhere) {
            Err(message) => {
                let ended = end_diverged(records, &run, &message)?;
                Err(StepRecorded::Diverged { message, ended })
            }
            Ok(Place::Recorded(mut steps)) => Err(StepRecorded::Replayed(steps.remove(0))),
            Ok(Place::Open) => Ok(run),
        },
    )
}

fn judge_local<R: Records + ?Sized>(records: &R, run: &RunRecord, key: &StepKey, local: &LocalStep) -> Result<Verdict> {
    let subject = branch::Subject::Step {
        id: &local.step_id,
        effect: local.effect,
        once: local.once,
    };
    let parent = parent_step(records, run, key)?;
    Ok(branch::judge(run, subject, parent.as_ref(), ("", "null")))
}

/// Records a local step as the branch rule settled it: the parent's outcome replayed, or a
/// refusal, which ends the run.
fn settle_by_rule<R: Records + ?Sized>(
    records: &mut R,
    run: &RunRecord,
    local: &LocalStep,
    verdict: Verdict,
) -> Result<StepRecorded> {
    match verdict {
        Verdict::Replay(parent) => {
            let change = branch::replay(run, &parent, (local.seq, local.occurrence), records.now());
            Ok(StepRecorded::Recorded(insert_at_place(records, change)?))
        }
        Verdict::Blocked(refused) => {
            let blocked = LocalStep {
                outcome: Err(refused.message(run)),
                decided_by: Some("branch".to_owned()),
                denied: false,
                blocked: true,
                ..local.clone()
            };
            let change = hosted::record_local(run, &blocked, records.now());
            let step = insert_at_place(records, change)?;
            let reason = refused.run_reason(run.capture);
            let (_, ended) = end_tree(records, run, &EndRun::Fail { reason })?;
            Ok(StepRecorded::Blocked { step, ended })
        }
        Verdict::Live | Verdict::BranchOf(_) => Ok(StepRecorded::Allowed),
    }
}
