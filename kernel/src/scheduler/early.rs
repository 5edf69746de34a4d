//! Calls that go to their workers before their start commits.
//!
//! A `safe_to_retry` call reserved a slot for its turn may be sent as soon as the writer has
//! decided it started, while the commit that records it is still being written (see
//! `store::sync`). The writer hands the started calls to the function built here, which sends each
//! straight to its session and tells the scheduler, so no task stands between the decision and
//! the worker. The scheduler then treats the lease as running; the turn's answer, which comes
//! after the commit, neither sends the call again nor counts it lost.

use std::collections::HashMap;

use tokio::sync::mpsc;

use super::{DispatchOrder, Msg, Outbound, Scheduler, lease_timeout};
use crate::model::{DispatchId, StepKey, StepRecord};
use crate::store::{EarlyDispatch, StartDispatch};

/// A worker slot reserved for a new call of a turn.
#[derive(Clone, Debug)]
pub struct Reservation {
    pub start: StartDispatch,
    /// The reserved session's channel to its worker.
    outbound: mpsc::UnboundedSender<Outbound>,
}

impl Reservation {
    pub(super) fn new(start: StartDispatch, outbound: mpsc::UnboundedSender<Outbound>) -> Self {
        Reservation { start, outbound }
    }
}

impl Scheduler {
    /// What the writer runs, before the commit of a turn that started calls on `reservations`,
    /// with those of them that may go out then: each is sent to its reserved worker at once.
    pub fn dispatch_early(&self, reservations: &[Reservation]) -> EarlyDispatch {
        // The writer started each call on the dispatch reserved for it, under the call's key.
        let slots: HashMap<StepKey, (DispatchId, mpsc::UnboundedSender<Outbound>)> = reservations
            .iter()
            .map(|r| (r.start.key.clone(), (r.start.dispatch_id.clone(), r.outbound.clone())))
            .collect();
        let scheduler = self.tx.clone();
        Box::new(move |steps: Vec<StepRecord>| {
            for step in steps {
                let Some((dispatch_id, outbound)) = slots.get(&step.key) else {
                    continue;
                };
                // The scheduler hears first: the lease runs, and the turn's answer, queued after
                // this, finds it sent. A session already gone drops the order; its lease is lost
                // when the turn's answer finds it missing.
                let _ = scheduler.send(Msg::Sent {
                    dispatch_id: dispatch_id.clone(),
                    attempt: step.attempts,
                    timeout: lease_timeout(&step),
                });
                let order = DispatchOrder {
                    dispatch_id: dispatch_id.clone(),
                    attempt: step.attempts,
                    step,
                };
                let _ = outbound.send(Outbound::Dispatch(Box::new(order)));
            }
        })
    }
}
