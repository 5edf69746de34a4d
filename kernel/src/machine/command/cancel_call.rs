//! Cancelling one call of a run ([`cancel::cancel_call`]): a call in flight settles as cancelled
//! and the run goes on; a gated call's question is withdrawn and the run's next one asked (or the
//! run resumed when none waits). A settled call is refused.

use super::{Records, Result, apply_change};
use crate::error::KernelError;
use crate::machine::cancel;
use crate::machine::effects::Effect;
use crate::model::{RunId, StepKey, StepRecord, StepStatus};

/// Cancels call `key` of run `run_id`; returns it settled, to cancel on its worker.
pub fn cancel<R: Records + ?Sized>(
    records: &mut R,
    (run_id, key): (&RunId, &StepKey),
    reason: &str,
) -> Result<StepRecord> {
    records.run(run_id)?;
    let step = records
        .find_step(run_id, key)?
        .ok_or_else(|| KernelError::NotFound(format!("call {key} not found in run {run_id}")))?;
    let open = records.open_approval_of(run_id, key)?;
    let change = cancel::cancel_call(&step, open.as_ref(), reason, records.now())?;
    if let Some(withdrawn) = &change.withdrawn {
        records.save_approval(withdrawn)?;
    }
    let settled = apply_change(records, change.settled)?;
    records.effect(Effect::Cancel {
        steps: vec![settled.clone()],
        reason: format!("call cancelled: {reason}"),
    });
    if step.status == StepStatus::AwaitingApproval {
        super::ask::ask_next(records, run_id)?;
    }
    super::dependents::withdraw(records, &settled)?;
    Ok(settled)
}
