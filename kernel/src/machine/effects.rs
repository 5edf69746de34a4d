//! What must happen after a command commits, as data: the command returns it with its records
//! and events, the writer hands it out once the commit stands, and the scheduler carries it out
//! (`Scheduler::new` takes the store's effects). Nothing else queues a step or cancels one on a
//! worker after a write.

use crate::model::{RunStatus, StepRecord};

/// One thing a committed command leaves to do.
#[derive(Clone, Debug)]
pub enum Effect {
    /// The step waits for a worker now (a new call, an approved one, a retry, a lost lease's
    /// step, a new or woken hosted dispatch): queue it.
    Dispatch(Box<StepRecord>),
    /// The steps settled while a worker may hold them (their run ended, the call was cancelled):
    /// tell the workers to stop, and drop them from the queue.
    Cancel { steps: Vec<StepRecord>, reason: String },
}

/// Why a run's steps are cancelled when it ends with `status` (and `reason`, for a failed or
/// cancelled run), as the worker reads it.
pub fn run_ended(status: RunStatus, reason: Option<&str>) -> String {
    match (status, reason) {
        (RunStatus::Completed, _) => "run completed".to_owned(),
        (status, Some(reason)) => format!("run {status}: {reason}"),
        (status, None) => format!("run {status}"),
    }
}
