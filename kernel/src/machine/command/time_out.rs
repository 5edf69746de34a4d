//! Deadlines: a dispatch that outlived its timeout ([`dispatch::time_out`]: a safe step retries
//! by its policy, never a blocking one; an `at_most_once` step settles as indeterminate), and a
//! step no worker took in time ([`dispatch::fail_pending`]: it fails without having run).

use super::{Records, Result, apply_change, held_step};
use crate::machine::dispatch;
use crate::machine::effects::Effect;
use crate::model::{DispatchId, Outcome, RunId, StepKey, StepRecord, StepStatus};

/// Times out attempt `attempt` of dispatch `dispatch_id`; `None` when it no longer holds its step.
pub fn time_out<R: Records + ?Sized>(
    records: &mut R,
    dispatch_id: &DispatchId,
    attempt: u32,
) -> Result<Option<StepRecord>> {
    let Some(step) = held_step(records, dispatch_id, attempt, None)? else {
        return Ok(None);
    };
    let change = dispatch::time_out(&step, records.now());
    let step = apply_change(records, change)?;
    if step.status == StepStatus::Pending {
        records.effect(Effect::Dispatch(Box::new(step.clone())));
    }
    super::dependents::withdraw(records, &step)?;
    Ok(Some(step))
}

/// Fails step `key` of `run` if it is still waiting for a worker; `None` otherwise.
pub fn fail_pending<R: Records + ?Sized>(
    records: &mut R,
    (run, key): (&RunId, &StepKey),
    message: &str,
    why: (&str, Outcome),
) -> Result<Option<StepRecord>> {
    let Some(step) = records.find_step(run, key)? else {
        return Ok(None);
    };
    let Some(change) = dispatch::fail_pending(&step, message, why, records.now()) else {
        return Ok(None);
    };
    let step = apply_change(records, change)?;
    super::dependents::withdraw(records, &step)?;
    Ok(Some(step))
}
