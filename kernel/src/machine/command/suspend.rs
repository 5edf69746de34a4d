//! A dispatch giving back its worker slot to wait on steps it awaits ([`hosted::suspend`]): it must
//! name what it waits on, each a step it awaits that has not settled; an `at_most_once` call may
//! not suspend (it could not run again). A refused suspension changes nothing.

use super::{Records, Result, apply_change, held_step};
use crate::machine::hosted;
use crate::model::{DispatchId, SessionId, StepKey, StepRecord};

/// A handler's suspension, as its worker reported it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SuspendReport {
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub session_id: SessionId,
    pub waiting_on: Vec<String>,
}

/// Suspends the dispatch `report` names, unless the machine refuses the suspension (`Err`: it names
/// nothing, a step the dispatch does not await, or one settled already; or the dispatch runs an
/// `at_most_once` call), which writes nothing and leaves the dispatch its lease. `None` when the
/// dispatch no longer holds its step.
pub fn apply<R: Records + ?Sized>(records: &mut R, report: SuspendReport) -> Result<Option<StepRecord>> {
    let Some(dispatch) = held_step(records, &report.dispatch_id, report.attempt, Some(&report.session_id))? else {
        return Ok(None);
    };
    let run = records.run(&dispatch.run_id)?;
    let waiting = report
        .waiting_on
        .into_iter()
        .map(|key| {
            let key = StepKey::from_stored(key);
            let found = records.find_step(&run.id, &key)?;
            Ok((key, found))
        })
        .collect::<Result<Vec<_>>>()?;
    let (change, run) = hosted::suspend(&run, &dispatch, &waiting, records.now())?;
    records.save_run(&run)?;
    Ok(Some(apply_change(records, change)?))
}
