//! A worker's result for a dispatch it holds ([`dispatch::record_result`]): it settles the step
//! with its one result event (caching a `cache_ttl` call's output, owned by its run), or a
//! retryable error with attempts left puts it back to pending. A hosted run's handler outcome
//! settles its dispatch and ends its run, cancelling what the handler left in flight.

use super::ending::{apply_end, cancel_children};
use super::{Records, Result, apply_change, held_step};
use crate::machine::dispatch::{self, ResultReport};
use crate::machine::effects::Effect;
use crate::machine::hosted;
use crate::model::{StepKind, StepRecord, StepStatus};

/// The step as the result left it, and the steps a handler's outcome cancelled (to cancel on
/// their workers).
pub type Recorded = (StepRecord, Vec<StepRecord>);

/// Records `report`; `None` when its dispatch no longer holds its step (nothing changes).
pub fn apply<R: Records + ?Sized>(records: &mut R, report: ResultReport) -> Result<Option<Recorded>> {
    let Some(step) = held_step(records, &report.dispatch_id, report.attempt, Some(&report.session_id))? else {
        return Ok(None);
    };
    if step.kind == StepKind::Agent {
        return finish_hosted(records, &step, &report).map(Some);
    }
    let (change, cached_until) = dispatch::record_result(&step, &report, records.now());
    if let (Some(expires_at), Ok(output)) = (cached_until, &report.outcome) {
        records.cache_result(&step, output, expires_at)?;
        records.own_cached_result(&step)?;
    }
    let step = apply_change(records, change)?;
    if step.status == StepStatus::Pending {
        records.effect(Effect::Dispatch(Box::new(step.clone())));
    }
    super::dependents::withdraw(records, &step)?;
    Ok(Some((step, Vec::new())))
}

/// A hosted handler's outcome: its dispatch settles and its run ends, cancelling what the
/// handler left in flight (returned, to cancel on their workers).
fn finish_hosted<R: Records + ?Sized>(
    records: &mut R,
    dispatch: &StepRecord,
    report: &ResultReport,
) -> Result<Recorded> {
    let run = records.run(&dispatch.run_id)?;
    let mut cancelled = cancel_children(records, &run)?;
    let in_flight = records.open_steps(&run.id)?;
    let open = records.open_approvals(&run.id)?;
    let outcome = report
        .outcome
        .as_ref()
        .map(String::as_str)
        .map_err(|(kind, message)| (*kind, message.as_str()));
    let (settled, ended) = hosted::finish(&run, dispatch, outcome, &in_flight, &open, records.now())?;
    let step = apply_change(records, settled)?;
    let (_, more) = apply_end(records, ended)?;
    cancelled.extend(more);
    Ok((step, cancelled))
}
