//! Deleting runs: only a finished run may be deleted ([`crate::machine::run::deletable`]), with
//! everything recorded under it; a cached result goes with the last run it belongs to.

use super::{Records, Result};
use crate::model::{Millis, RunId};
use crate::store::Deleted;

/// Deletes one finished run; refuses a run in flight.
pub fn delete<R: Records + ?Sized>(records: &mut R, run_id: &RunId) -> Result<Deleted> {
    crate::machine::run::deletable(&records.run(run_id)?)?;
    remove(records, run_id)
}

/// Removes a run and the cached results it alone claims. A cached result belongs to the run that
/// stored it and to each run served from it, and goes with the last of them: a deleted run's
/// results are not served to another, and no other run's entry goes with it.
fn remove<R: Records + ?Sized>(records: &mut R, run_id: &RunId) -> Result<Deleted> {
    let mut gone = 0;
    for (call_hash, claims) in records.cache_claims(run_id)? {
        if claims <= 1 && records.delete_cached_result(&call_hash)? {
            gone += 1;
        }
    }
    let mut deleted = records.remove_run(run_id)?;
    deleted.cache_entries = gone;
    Ok(deleted)
}

/// Deletes up to `limit` runs that finished before `finished_before`, oldest first.
pub fn prune<R: Records + ?Sized>(records: &mut R, finished_before: Millis, limit: usize) -> Result<Deleted> {
    let mut deleted = Deleted::default();
    for id in records.finished_runs(finished_before, limit)? {
        deleted.add(remove(records, &id)?);
    }
    Ok(deleted)
}
