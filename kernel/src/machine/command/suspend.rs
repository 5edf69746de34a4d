//! A dispatch giving back its worker slot to wait on steps it awaits ([`hosted::suspend`]): its
//! dispatch is suspended, or pending again at once when one of them settled on the way. An
//! `at_most_once` call may not suspend: it could not run again; nor may a dispatch wait on a step
//! whose settle would not wake it ([`hosted::never_wakes`]).

use super::{Records, Result, apply_change, held_step};
use crate::error::KernelError;
use crate::machine::hosted;
use crate::model::{Idempotency, StepKey, StepKind, StepRecord};

/// A handler's suspension, as its worker reported it.
#[derive(Clone, Debug)]
pub struct SuspendReport {
    pub dispatch_id: String,
    pub attempt: u32,
    pub session_id: String,
    pub waiting_on: Vec<String>,
}

/// Suspends the dispatch `report` names; `None` when it no longer holds its step.
pub fn apply<R: Records + ?Sized>(records: &mut R, report: SuspendReport) -> Result<Option<StepRecord>> {
    let Some(dispatch) = held_step(records, &report.dispatch_id, report.attempt, Some(&report.session_id))? else {
        return Ok(None);
    };
    if dispatch.kind == StepKind::Tool && dispatch.idempotency == Idempotency::AtMostOnce {
        return Err(KernelError::FailedPrecondition(format!(
            "dispatch {} runs an at_most_once call, which may not run again: it cannot give back its slot",
            report.dispatch_id
        )));
    }
    let run = records.run(&dispatch.run_id)?;
    let waiting = report
        .waiting_on
        .iter()
        .map(|key| records.find_step(&run.id, &StepKey::from_stored(key.clone())))
        .collect::<Result<Vec<_>>>()?;
    if let Some(step) = hosted::never_wakes(&dispatch, &waiting) {
        return Err(KernelError::FailedPrecondition(format!(
            "dispatch {} may not wait on step {}: its result would not wake it; nothing was recorded",
            report.dispatch_id, step.key
        )));
    }
    let (change, run) = hosted::suspend(&run, &dispatch, &waiting, records.now());
    records.save_run(&run)?;
    Ok(Some(apply_change(records, change)?))
}
