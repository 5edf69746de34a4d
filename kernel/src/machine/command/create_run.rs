//! Creating a run ([`run::create`]): an idempotency key gives back the run that holds it, and
//! refuses another agent or input under it. A hosted run's dispatch is created with it, waiting
//! for a worker.

use super::{Records, Result};
use crate::machine::effects::Effect;
use crate::machine::run::{self, Created, NewRun};
use crate::model::{RunId, RunRecord, StepRecord};

/// What creating a run did: the run, whether this command created it, and a new hosted run's
/// dispatch.
pub type CreatedRun = (RunRecord, bool, Option<StepRecord>);

/// Creates the run; a new hosted run's dispatch is queued once the command commits.
pub fn apply<R: Records + ?Sized>(records: &mut R, new: NewRun) -> Result<CreatedRun> {
    let created = create(records, new)?;
    if let (_, true, Some(dispatch)) = &created {
        records.effect(Effect::Dispatch(Box::new(dispatch.clone())));
    }
    Ok(created)
}

/// Creates the run, leaving its dispatch (if hosted and new) for the caller to queue or hold.
pub fn create<R: Records + ?Sized>(records: &mut R, new: NewRun) -> Result<CreatedRun> {
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
            }
            Ok((records.run(&run.id)?, true, dispatch.map(|d| *d)))
        }
    }
}
