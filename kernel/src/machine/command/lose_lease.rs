//! A lost lease ([`dispatch::lose_lease`]): a `safe_to_retry` step goes back to pending, an
//! `at_most_once` one settles as indeterminate, and one lost too often as poison.

use super::{Records, Result, held_step};
use crate::machine::dispatch::{self, LeaseLoss};
use crate::machine::effects::Effect;
use crate::model::{StepRecord, StepStatus};

/// What became of a lost lease's step.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum LossOutcome {
    /// The dispatch no longer held the step; nothing recorded.
    NotHeld,
    /// safe_to_retry: back to pending, to dispatch again.
    Requeued(StepRecord),
    /// at_most_once: failed as indeterminate.
    Indeterminate(StepRecord),
}

pub fn apply<R: Records + ?Sized>(records: &mut R, loss: LeaseLoss) -> Result<LossOutcome> {
    let Some(step) = held_step(records, &loss.dispatch_id, loss.attempt, None)? else {
        return Ok(LossOutcome::NotHeld);
    };
    let change = dispatch::lose_lease(&step, &loss, records.now());
    let step = super::apply_change(records, change)?;
    super::dependents::withdraw(records, &step)?;
    Ok(if step.status == StepStatus::Pending {
        records.effect(Effect::Dispatch(Box::new(step.clone())));
        LossOutcome::Requeued(step)
    } else {
        LossOutcome::Indeterminate(step)
    })
}
