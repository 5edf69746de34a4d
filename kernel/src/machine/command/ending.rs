//! A run's end, as every command that ends one applies it: its running children cancelled first
//! (their own children before them), then its calls in flight settled and its open questions
//! withdrawn, then the run with its one terminal event; then the parent's step waiting for it
//! settles and its session's next run may go.

use super::{Records, Result, apply_change};
use crate::machine::effects::{self, Effect};
use crate::machine::hosted;
use crate::machine::run::{self, EndRun};
use crate::model::{RunRecord, StepRecord};

/// Ends `run` after its subagents, as `end` says. Returns the run and every step settled on the
/// way, to cancel on their workers.
pub fn end_tree<R: Records + ?Sized>(
    records: &mut R,
    run: &RunRecord,
    end: &EndRun,
) -> Result<(RunRecord, Vec<StepRecord>)> {
    // Refused before anything is written: a finished run, or one completed with calls in flight
    // (a running child's step among them), is not touched, its children included.
    let in_flight = records.open_steps(&run.id)?;
    let open = records.open_approvals(&run.id)?;
    let mut ended = run::end(run, &in_flight, &open, end, records.now())?;
    let children = records.live_children(&run.id)?;
    let mut settled = Vec::new();
    if !children.is_empty() {
        settled = cancel(records, run, children)?;
        // Their ends settled the steps waiting for them: the run ends with what is left.
        let in_flight = records.open_steps(&run.id)?;
        let open = records.open_approvals(&run.id)?;
        ended = run::end(run, &in_flight, &open, end, records.now())?;
    }
    let (run, more) = apply_end(records, ended)?;
    settled.extend(more);
    Ok((run, settled))
}

/// Fails a hosted run whose handler diverged ([`hosted::diverged`]), unless it ended already;
/// returns the steps that settled on the way.
pub fn end_diverged<R: Records + ?Sized>(records: &mut R, run: &RunRecord, message: &str) -> Result<Vec<StepRecord>> {
    if run.status.is_terminal() {
        return Ok(Vec::new());
    }
    Ok(end_tree(records, run, &hosted::diverged(message))?.1)
}

/// Cancels the children of `run` still running, deepest first.
pub fn cancel_children<R: Records + ?Sized>(records: &mut R, run: &RunRecord) -> Result<Vec<StepRecord>> {
    let children = records.live_children(&run.id)?;
    cancel(records, run, children)
}

/// Cancels `children` of `run`, each after its own children.
fn cancel<R: Records + ?Sized>(
    records: &mut R,
    run: &RunRecord,
    children: Vec<crate::model::RunId>,
) -> Result<Vec<StepRecord>> {
    let mut settled = Vec::new();
    for child in children {
        let child = records.run(&child)?;
        let reason = format!("parent run {} ended", run.id);
        let (_, steps) = end_tree(records, &child, &EndRun::Cancel { reason })?;
        settled.extend(steps);
    }
    Ok(settled)
}

/// Applies what ending a run changes: questions withdrawn, calls settled, the run and its event;
/// then the parent's step waiting for it, and its session's next run.
pub fn apply_end<R: Records + ?Sized>(records: &mut R, ended: run::RunEnd) -> Result<(RunRecord, Vec<StepRecord>)> {
    for approval in &ended.withdrawn {
        records.save_approval(approval)?;
    }
    let mut settled = Vec::with_capacity(ended.settled.len());
    for change in ended.settled {
        settled.push(apply_change(records, change)?);
    }
    // Settling a running call gave back the time its budget held, in the run as stored now; the
    // end changes nothing of the budget, so it keeps the stored one.
    let mut ending = ended.run;
    ending.budget = records.run(&ending.id)?.budget;
    records.save_run(&ending)?;
    records.append(&ending.id, ended.event, None)?;
    let run = records.run(&ending.id)?;
    if !settled.is_empty() {
        let reason = effects::run_ended(run.status, run.reason.as_deref());
        records.effect(Effect::Cancel {
            steps: settled.clone(),
            reason,
        });
    }
    if let Some((parent, key)) = &run.parent
        && let Some(step) = records.find_step(parent, key)?
        && let Some(change) = hosted::child_ended(&step, &run, records.now())
    {
        apply_change(records, change)?;
    }
    if let Some(session) = &run.session_key {
        release_session(records, session)?;
    }
    Ok((run, settled))
}

/// Lets the next run of a session go: the oldest one still waiting for the runs before it.
fn release_session<R: Records + ?Sized>(records: &mut R, session: &str) -> Result<()> {
    if let Some(next) = records.next_of_session(session)? {
        super::wake_step(
            records,
            &next,
            &crate::model::StepKey::agent(),
            "the session's run before it ended",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::command::memory::Memory;
    use crate::machine::records::{NOW, run, step};
    use crate::model::{RunId, StepKey, StepKind, StepStatus};

    /// Completing a run whose call waits on a running child is refused before anything is
    /// written: the child is not cancelled on the way to the refusal.
    #[test]
    fn a_refused_end_writes_nothing_not_even_its_childrens_end() {
        let mut records = Memory::new(NOW);
        let parent = run();
        records.insert_run(&parent).unwrap();
        let mut call = step();
        call.status = StepStatus::Running;
        records.insert_step(&call).unwrap();
        let mut child = run();
        child.id = RunId::new();
        child.parent = Some((parent.id.clone(), StepKey::tool_subagent(&call.key, "researcher", 0)));
        records.insert_run(&child).unwrap();
        let mut waiting = step();
        waiting.kind = StepKind::Subagent;
        waiting.key = StepKey::tool_subagent(&call.key, "researcher", 0);
        records.insert_step(&waiting).unwrap();
        let before = records.state.clone();
        let complete = EndRun::Complete {
            output: "{}".into(),
            settle_in_flight: false,
        };
        assert!(end_tree(&mut records, &parent, &complete).is_err());
        assert_eq!(records.state, before, "nothing written, the child still running");
        let (ended, settled) = end_tree(&mut records, &parent, &EndRun::Cancel { reason: "stop".into() }).unwrap();
        assert_eq!(ended.status, crate::model::RunStatus::Cancelled);
        assert_eq!(
            records.run(&child.id).unwrap().status,
            crate::model::RunStatus::Cancelled
        );
        assert!(settled.iter().any(|s| s.key == call.key));
    }
}
