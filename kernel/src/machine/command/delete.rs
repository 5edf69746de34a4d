//! Deleting runs: only a finished run may be deleted ([`run::deletable`]), with everything
//! recorded under it; a cached result goes with the last run it belongs to.

use super::{Records, Result};
use crate::model::{Millis, RunId};
use crate::store::Deleted;

/// Deletes one finished run; refuses a run in flight.
pub fn delete<R: Records + ?Sized>(records: &mut R, run_id: &RunId) -> Result<Deleted> {
    crate::machine::run::deletable(&records.run(run_id)?)?;
    records.remove_run(run_id)
}

/// Deletes up to `limit` runs that finished before `finished_before`, oldest first.
pub fn prune<R: Records + ?Sized>(records: &mut R, finished_before: Millis, limit: usize) -> Result<Deleted> {
    let mut deleted = Deleted::default();
    for id in records.finished_runs(finished_before, limit)? {
        deleted.add(records.remove_run(&id)?);
    }
    Ok(deleted)
}
