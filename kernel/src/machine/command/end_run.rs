//! Ending a run from outside: completing, failing or cancelling it ([`run::end`], after its
//! subagents), and failing as abandoned the external agents' runs that made no turn for the
//! kernel's limit ([`run::abandoned`]). A hosted run is completed only by its handler.

use super::ending::end_tree;
use super::{Records, Result};
use crate::error::KernelError;
use crate::machine::run::{self, EndRun};
use crate::model::{RunId, RunRecord, StepRecord};

/// A run as it ended, and every step settled on the way, to cancel on their workers.
pub type Ended = (RunRecord, Vec<StepRecord>);

pub fn end<R: Records + ?Sized>(records: &mut R, run_id: &RunId, end: EndRun) -> Result<Ended> {
    let run = records.run(run_id)?;
    if run.hosted && matches!(end, EndRun::Complete { .. }) && !run.status.is_terminal() {
        return Err(KernelError::FailedPrecondition(format!(
            "run {} is hosted by agent '{}': its handler's return value completes it (fail or cancel it instead)",
            run.id, run.agent
        )));
    }
    end_tree(records, &run, &end)
}

/// Fails, as abandoned, up to `limit` external agents' runs that made no turn for `after_ms`,
/// their calls settled first.
pub fn abandon<R: Records + ?Sized>(records: &mut R, after_ms: u64, limit: usize) -> Result<Vec<Ended>> {
    let now = records.now();
    let cutoff = now.saturating_sub(after_ms as crate::model::Millis);
    let mut ended = Vec::new();
    for (id, last_turn_at) in records.idle_runs(cutoff, limit)? {
        let run = records.run(&id)?;
        if let Some(end) = run::abandoned(&run, last_turn_at.unwrap_or(run.created_at), after_ms, now) {
            ended.push(end_tree(records, &run, &end)?);
        }
    }
    Ok(ended)
}
