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

/// The shard a new run must be made in, if any: a subagent lives in its parent's (a run and its
/// children end in one transaction), and a run with an idempotency key in the key's, so the one
/// owner of that shard decides whether the key is taken.
pub fn shard(new: &NewRun) -> Option<u32> {
    match (&new.parent, &new.idempotency_key) {
        (Some((parent, _)), _) => Some(crate::cluster::shards::shard_of(parent)),
        (None, Some(key)) => Some(crate::cluster::shards::shard_of_key(key)),
        (None, None) => None,
    }
}

/// Creates the run, leaving its dispatch (if hosted and new) for the caller to queue or hold.
pub fn create<R: Records + ?Sized>(records: &mut R, new: NewRun) -> Result<CreatedRun> {
    let existing = match &new.idempotency_key {
        Some(key) => records.run_by_idempotency_key(key)?,
        None => None,
    };
    let id = match shard(&new).or(new.home) {
        Some(shard) => RunId::new_in_shard(shard),
        None => RunId::new(),
    };
    // A subagent's parent lives in its shard, so its budget is read in this transaction.
    let parent = match (&existing, &new.parent) {
        (None, Some((parent, _))) => Some(records.run(parent)?),
        _ => None,
    };
    match run::create((existing, parent.as_ref()), &new, id, records.now())? {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::shards::shard_of;
    use crate::machine::command::memory::Memory;
    use crate::machine::records::{NOW, new_run};

    #[test]
    fn a_subagent_is_created_in_its_parents_shard() {
        let mut memory = Memory::new(NOW);
        let (parent, _, _) = apply(&mut memory, new_run()).unwrap();
        for position in 0..5 {
            let child = NewRun {
                parent: Some((
                    parent.id.clone(),
                    crate::model::StepKey::from_stored(format!("0.{position}")),
                )),
                ..new_run()
            };
            let (child, created, _) = apply(&mut memory, child).unwrap();
            assert!(created);
            assert_eq!(shard_of(&child.id), shard_of(&parent.id));
        }
    }
}
