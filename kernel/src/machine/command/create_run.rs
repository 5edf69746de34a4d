//! Creating a run ([`run::create`]): an idempotency key gives back the run that holds it, and
//! refuses another agent or input under it. A hosted run's dispatch is created with it, waiting
//! for a worker.

use super::{Records, Result};
use crate::machine::run::{self, Created, NewRun};
use crate::model::{RunId, RunRecord, StepRecord};

/// What creating a run did: the run, whether this command created it, and a new hosted run's
/// dispatch.
pub type CreatedRun = (RunRecord, bool, Option<StepRecord>);

pub fn apply<R: Records + ?Sized>(records: &mut R, new: NewRun) -> Result<CreatedRun> {
    let existing = match &new.idempotency_key {
        Some(key) => records.run_by_idempotency_key(key)?,
        None => None,
    };
    match run::create(existing, &new, RunId::new(), records.now())? {
        Created::Existing(run) => Ok((*run, false, None)),
        Created::New { run, event, dispatch } => {
            records.insert_run(&run)?;
            records.append(&run.id, event, None)?;
            if let Some(dispatch) = &dispatch {
                records.insert_step(dispatch)?;
                records.waits(dispatch);
            }
            Ok((records.run(&run.id)?, true, dispatch.map(|d| *d)))
        }
    }
}
