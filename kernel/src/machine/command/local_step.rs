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
use crate::model::{Effect, RunId, RunRecord, StepKey, StepRecord};

/// What the policy said of a local step, asked just before the write (the policy is the kernel's
/// memory, not a record).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StepGate {
    /// No policy file checks steps.
    Unchecked,
    Allowed {
        decided_by: String,
    },
    Denied {
        reason: String,
        decided_by: String,
    },
}

/// What recording (or checking) a local step or starting a subagent did.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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
    /// The step may run live; nothing was recorded but the allowance, which its record will
    /// name. `decided_by` names what allowed it (a policy rule or default, a case run's token),
    /// `None` when nothing was asked.
    Allowed {
        decided_by: Option<String>,
    },
    /// The branch rule refused the step (recorded so) and ended the run: `ended` are the steps
    /// that settled on the way, to cancel on their workers.
    Blocked {
        step: StepRecord,
        ended: Vec<StepRecord>,
    },
}

/// A local step as its handler sent it, before anything decided it.
pub fn sent(seq: u32, step_id: String, occurrence: u32, (effect, once): (Effect, bool)) -> LocalStep {
    LocalStep {
        seq,
        step_id,
        occurrence,
        effect,
        once,
        outcome: Ok("null".to_owned()),
        decided_by: None,
        denied: false,
        blocked: false,
    }
}

/// Records a finished local step of run `run_id`. A step checked before it ran is recorded as
/// that check allowed it; one that was not is decided now: a step the policy denies is recorded
/// as denied, whatever outcome the handler sent (it should not have run, and the audit never
/// names a deny rule for a step that ran), and in a branch or case run the branch rule judges it.
pub fn record<R: Records + ?Sized>(
    records: &mut R,
    (run_id, fence): (&RunId, &Fence),
    mut local: LocalStep,
    gate: StepGate,
) -> Result<StepRecorded> {
    let (run, key) = match place_local(records, (run_id, fence), &local)? {
        Ok(open) => open,
        Err(placed) => return Ok(placed),
    };
    match records.take_check(&run.id, &key)? {
        Some((checked_by, decided_by)) if checked_by == *fence => local.decided_by = Some(decided_by),
        _ => {
            apply_gate(&mut local, gate);
            if branch::guarded(&run) && !local.denied {
                let verdict = judge_local(records, &run, &key, &local)?;
                if !matches!(verdict, Verdict::Live) {
                    return settle_by_rule(records, &run, &local, verdict);
                }
            }
        }
    }
    let change = hosted::record_local(&run, &local, records.now());
    Ok(StepRecorded::Recorded(insert_at_place(records, change)?))
}

/// Asks whether a local step of run `run_id` may run, before it runs. A step the policy denies
/// is recorded as denied (a replay gets the denial again, whatever the policy says by then); in
/// a branch or case run the branch rule may replay it from the parent or refuse it, which ends
/// the run; otherwise [`StepRecorded::Allowed`], and the allowance is noted for its record.
/// `local`'s outcome is not used.
pub fn check<R: Records + ?Sized>(
    records: &mut R,
    (run_id, fence): (&RunId, &Fence),
    mut local: LocalStep,
    gate: StepGate,
) -> Result<StepRecorded> {
    let (run, key) = match place_local(records, (run_id, fence), &local)? {
        Ok(open) => open,
        Err(placed) => return Ok(placed),
    };
    apply_gate(&mut local, gate);
    if local.denied {
        let change = hosted::record_local(&run, &local, records.now());
        return Ok(StepRecorded::Recorded(insert_at_place(records, change)?));
    }
    if branch::guarded(&run) {
        match judge_local(records, &run, &key, &local)? {
            Verdict::Live => {
                let token = branch::allowed_by(&run, (&local.step_id, local.effect, local.once));
                local.decided_by = token.map(|token| format!("allow:{token}")).or(local.decided_by);
            }
            verdict => return settle_by_rule(records, &run, &local, verdict),
        }
    }
    if let Some(decided_by) = &local.decided_by {
        records.note_check(&run.id, &key, fence, decided_by)?;
    }
    Ok(StepRecorded::Allowed {
        decided_by: local.decided_by,
    })
}

/// Decides `local` as the policy said: a denied step's outcome is the denial.
fn apply_gate(local: &mut LocalStep, gate: StepGate) {
    match gate {
        StepGate::Unchecked => {}
        StepGate::Allowed { decided_by } => local.decided_by = Some(decided_by),
        StepGate::Denied { reason, decided_by } => {
            local.outcome = Err(reason);
            local.decided_by = Some(decided_by);
            local.denied = true;
        }
    }
}

/// The run of a local step at an open place, and the step's key; otherwise what its place says
/// (replayed, or diverged, which fails the run). Fenced by the run's dispatch.
fn place_local<R: Records + ?Sized>(
    records: &mut R,
    (run_id, fence): (&RunId, &Fence),
    local: &LocalStep,
) -> Result<std::result::Result<(RunRecord, StepKey), StepRecorded>> {
    let key = StepKey::local(&local.step_id, local.occurrence);
    let run = records.run(run_id)?;
    let dispatch = records.find_step(&run.id, &StepKey::agent())?;
    hosted::check_fence(&run, dispatch.as_ref(), Some(fence))?;
    let at_place = records.steps_at_place(&run.id, local.seq)?;
    let elsewhere: Vec<StepRecord> = records.find_step(&run.id, &key)?.into_iter().collect();
    Ok(
        match hosted::place(local.seq, std::slice::from_ref(&key), &at_place, &elsewhere) {
            Err(message) => {
                let ended = end_diverged(records, &run, &message)?;
                Err(StepRecorded::Diverged { message, ended })
            }
            Ok(Place::Recorded(mut steps)) => Err(StepRecorded::Replayed(steps.remove(0))),
            Ok(Place::Open) => Ok((run, key)),
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
        Verdict::Live | Verdict::BranchOf(_) => Ok(StepRecorded::Allowed { decided_by: None }),
    }
}
