//! What a turn's checks need of the runs this kernel's writer created, kept from its commits
//! (on SQLite, where this writer is the only one, and among replicas for the runs of the shards
//! this replica owns, forgotten whenever they change): each run's record and which of its calls
//! may be recorded already. The common turn, new calls of a live run, then plans without a read of the
//! database, whose pages every commit leaves cold for the readers.
//!
//! It is a hint, never the truth. It answers only "this turn has a call not recorded yet", so the
//! turn is not served from the log and goes to the writer, which decides each call from the
//! database (replayed, joined, diverged or new), or "ask the database". A call it failed to
//! learn of costs a write, not a wrong answer; forgetting a run is always safe.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Published;
use super::recorded::RecordedKeys;
use crate::model::{EventType, RunId, RunRecord, StepKey};

/// Bytes of records held at most (their inputs, and the call ids seen), as the writer's own memory
/// of runs holds; past it the runs used least lately are forgotten.
const MAX_BYTES: usize = 4 << 20;
/// Keys other than calls by position remembered per run; past it, a turn with call ids of that run
/// is read.
const MAX_IDS: usize = 4_096;

/// The runs held, behind one lock that the writer takes once per commit.
#[derive(Default)]
pub struct LiveRuns(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    runs: HashMap<RunId, Live>,
    bytes: usize,
    /// Ticks once per use, to find the runs used least lately.
    clock: u64,
}

struct Live {
    /// As created, but for `last_seq`, which follows the commits.
    run: RunRecord,
    recorded: RecordedKeys,
    used: u64,
}

impl Live {
    fn bytes(&self) -> usize {
        256 + self.run.input.len() + self.recorded.bytes()
    }
}

impl LiveRuns {
    /// Takes in what a commit changed: the runs it created (`born`, as the writer holds them), then
    /// its events in order. A run that ended is forgotten.
    pub fn committed(&self, born: Vec<RunRecord>, published: &[Published]) {
        let mut inner = self.0.lock().expect("live runs poisoned");
        let inner = &mut *inner;
        inner.clock += 1;
        for run in born {
            let live = Live {
                run,
                recorded: RecordedKeys::new(MAX_IDS),
                used: inner.clock,
            };
            inner.bytes += live.bytes();
            if let Some(old) = inner.runs.insert(live.run.id.clone(), live) {
                inner.bytes = inner.bytes.saturating_sub(old.bytes());
            }
        }
        // A commit's events come run by run (a turn of a thousand calls is one run's): one look-up each.
        for events in published.chunk_by(|a, b| a.event.run_id == b.event.run_id) {
            let run = &events[0].event.run_id;
            let ended = events.iter().any(|item| {
                matches!(
                    item.event.kind,
                    EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled
                )
            });
            if ended {
                if let Some(old) = inner.runs.remove(run) {
                    inner.bytes = inner.bytes.saturating_sub(old.bytes());
                }
                continue;
            }
            let Some(live) = inner.runs.get_mut(run) else {
                continue;
            };
            let before = live.bytes();
            for item in events {
                live.run.last_seq = live.run.last_seq.max(item.event.seq);
                if let Some(step) = &item.step {
                    live.recorded.record(&step.key);
                }
            }
            inner.bytes = (inner.bytes + live.bytes()).saturating_sub(before);
        }
        if inner.bytes > MAX_BYTES {
            inner.forget_least_used();
        }
    }

    /// The run of a turn whose calls are `keys`, when it is held and one of those calls is
    /// certainly not recorded: the turn is no pure replay. Its `status` and counters are as the
    /// run was created; its `last_seq` is the last this writer committed. `None`: ask the database.
    pub fn unrecorded_turn<'k>(&self, run: &RunId, keys: impl IntoIterator<Item = &'k StepKey>) -> Option<RunRecord> {
        let mut inner = self.0.lock().expect("live runs poisoned");
        inner.clock += 1;
        let clock = inner.clock;
        let live = inner.runs.get_mut(run)?;
        live.used = clock;
        keys.into_iter()
            .any(|key| live.recorded.lacks_call(key))
            .then(|| live.run.clone())
    }

    /// Forgets every run: what this replica owns changed, and another replica may have written
    /// some of them meanwhile.
    pub fn forget_all(&self) {
        let mut inner = self.0.lock().expect("live runs poisoned");
        inner.runs.clear();
        inner.bytes = 0;
    }

    /// How many runs are held (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().expect("live runs poisoned").runs.len()
    }
}

impl Inner {
    /// Forgets the runs used least lately until a quarter of the budget is free, so a long
    /// sustained load does not pay this on every commit.
    fn forget_least_used(&mut self) {
        let mut by_use: Vec<(u64, RunId)> = self.runs.iter().map(|(id, live)| (live.used, id.clone())).collect();
        by_use.sort_unstable_by_key(|(used, _)| *used);
        for (_, id) in by_use {
            if self.bytes <= MAX_BYTES / 4 * 3 {
                break;
            }
            if let Some(old) = self.runs.remove(&id) {
                self.bytes = self.bytes.saturating_sub(old.bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests;
