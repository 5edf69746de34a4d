//! Starting a dispatch ([`dispatch::start`]): a step starts only while pending, and only as the
//! attempt after its last. A hosted run's dispatch starts its run (a branch only while the record
//! it replays is there); a call takes the locks on the resource instances it touches, and
//! consumes its approval.

use super::ending::end_tree;
use super::{Records, Result, apply_change, parent_exists};
use crate::error::KernelError;
use crate::machine::dispatch::{self, StartDispatch};
use crate::machine::run::EndRun;
use crate::machine::{branch, hosted};
use crate::model::{StepKind, StepRecord};

/// Records the start of a dispatch; `None` when the step may not start (settled meanwhile, a
/// stale attempt, or a branch whose parent is gone, which ends the run).
pub fn apply<R: Records + ?Sized>(records: &mut R, start: StartDispatch) -> Result<Option<StepRecord>> {
    let Some(step) = records.find_step(&start.run_id, &start.key)? else {
        return Ok(None);
    };
    let Some(mut change) = dispatch::start(&step, &start, records.now()) else {
        return Ok(None);
    };
    change.step.replica = Some(start.replica.clone().unwrap_or_else(|| records.replica().to_owned()));
    if step.kind == StepKind::Agent {
        let run = records.run(&step.run_id)?;
        // A branch resumes only while the record it replays is there.
        if let Some(reason) = branch::unresumable(&run, parent_exists(records, &run)?) {
            end_tree(records, &run, &EndRun::Fail { reason })?;
            return Ok(None);
        }
        let (run, event) = hosted::dispatched(&run, records.now());
        records.save_run(&run)?;
        if let Some(event) = event {
            records.append(&run.id, event, None)?;
        }
    }
    // A call whose budget cannot pay for this attempt settles (or waits for a person to raise
    // the budget) instead of starting, before it takes anything a settled call would hold.
    if !super::spend::pay_start(records, &step)? {
        return Ok(None);
    }
    // A tool limit with no room refuses the start, and the command's savepoint undoes what was
    // written (the budget's charge among it); the call waits.
    if !start.limits.is_empty() {
        super::throttle::pass(records, &step, &start)?;
        change.step.limited_by = start.limits.iter().map(|limit| limit.tools.clone()).collect();
        change.step.limit_wait_ms = start.limit_wait_ms;
    } else if !change.step.limited_by.is_empty() {
        change.step.limited_by.clear();
        change.step.limit_wait_ms = 0;
    }
    take_locks(records, &step, &start)?;
    if dispatch::consumes_approval(&step) {
        records.consume_approval(&start.run_id, &start.key)?;
    }
    Ok(Some(apply_change(records, change)?))
}

/// Takes the locks on the resource instances `step` touches, for the attempt `start` begins. The
/// scheduler starts no call whose instance another holds; a lock held anyway (a second kernel on
/// the file) refuses the start, and the call waits for its next try.
pub fn take_locks<R: Records + ?Sized>(records: &mut R, step: &StepRecord, start: &StartDispatch) -> Result<()> {
    for resource in crate::resources::locks(&step.resources) {
        if let Err((run, key)) = records.take_lock(resource, step, (&start.dispatch_id, start.attempt))? {
            return Err(KernelError::FailedPrecondition(format!(
                "resource '{resource}' is held by step {key} of run {run}; the call starts once it is released"
            )));
        }
    }
    Ok(())
}
