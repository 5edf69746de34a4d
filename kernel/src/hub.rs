//! Live fan-out of what happens to a run: committed events (published by the store writer after
//! each commit) and ephemeral progress (published by worker sessions, never logged).
//!
//! Subscribers are agents waiting for their turn's results and event watchers. A subscriber that
//! falls behind is told it lagged and re-reads from the store, which is the truth.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::model::{EventRecord, RunId, StepKey, StepRecord};
use crate::store::Published;

/// Per-run buffer, allocated when a run gets its first subscriber; a subscriber further behind
/// than this re-reads from the store.
const CAPACITY: usize = 256;
/// Above this many channels, those nobody listens to any more are dropped.
const PRUNE_ABOVE: usize = 1024;

/// An ephemeral progress update of a running call.
#[derive(Clone, Debug)]
pub struct ProgressUpdate {
    pub run_id: RunId,
    pub key: StepKey,
    pub position: u32,
    pub tool: String,
    pub message: String,
    pub data_json: String,
    pub current: u64,
    pub total: u64,
}

/// What a run's subscribers receive.
#[derive(Clone, Debug)]
pub enum Signal {
    /// A committed event, with the step it changed when there is one.
    Event(Arc<EventRecord>, Option<Arc<StepRecord>>),
    Progress(Arc<ProgressUpdate>),
}

/// The registry of per-run channels; a cheap handle.
#[derive(Clone, Default)]
pub struct Hub {
    runs: Arc<Mutex<HashMap<RunId, broadcast::Sender<Signal>>>>,
}

impl Hub {
    /// Subscribes to a run's signals; subscribe before reading the store so nothing falls between.
    pub fn subscribe(&self, run: &RunId) -> broadcast::Receiver<Signal> {
        let mut runs = self.runs.lock().expect("hub poisoned");
        if runs.len() > PRUNE_ABOVE {
            runs.retain(|_, sender| sender.receiver_count() > 0);
        }
        runs.entry(run.clone())
            .or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe()
    }

    fn send(&self, run: &RunId, signal: Signal) {
        let mut runs = self.runs.lock().expect("hub poisoned");
        if let Some(sender) = runs.get(run)
            && (sender.send(signal).is_err() || sender.receiver_count() == 0)
        {
            runs.remove(run);
        }
    }

    /// Publishes what a store batch committed.
    pub fn publish_committed(&self, published: Vec<Published>) {
        for item in published {
            let run = item.event.run_id.clone();
            self.send(&run, Signal::Event(Arc::new(item.event), item.step.map(Arc::new)));
        }
    }

    /// Publishes a progress update.
    pub fn publish_progress(&self, update: ProgressUpdate) {
        let run = update.run_id.clone();
        self.send(&run, Signal::Progress(Arc::new(update)));
    }
}
