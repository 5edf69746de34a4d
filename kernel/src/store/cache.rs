//! The writer's memory of the rows it wrote: runs and their steps, so a command reads a run, a
//! step, the step a dispatch holds or a run's unsettled calls without a statement. It only ever
//! holds what the database holds inside the writer's transaction, because:
//! - every write to those rows goes through the operations that keep it ([`Cache::saved_run`],
//!   [`Cache::saved_step`] and their kin), which write the database in the same breath;
//! - a command undone forgets the runs it touched, a batch rolled back forgets everything;
//! - among replicas on PostgreSQL, only the owner of a run's shard writes the run: a run of another
//!   replica's shard that a command read is forgotten when the command ends
//!   ([`Cache::forget_touched_unless`]), and everything is forgotten whenever what this replica
//!   owns changes.
//!
//! What it does not hold it reads from the database, which is always right; forgetting is always
//! safe. It holds runs not finished and their calls not settled (a settled call is read again only
//! to replay it), within a budget of bytes. A run created by this writer is *complete* (each of its
//! steps has been seen here), so a step whose key it knows not recorded does not exist; which keys
//! are recorded is kept small ([`RecordedKeys`]), and a key it cannot rule out is looked for.

use std::collections::{HashMap, HashSet};

use super::recorded::RecordedKeys;
use crate::model::{DispatchId, RunId, RunRecord, StepKey, StepRecord, StepStatus};

/// Bytes of runs and steps held at most (their inputs, arguments and outputs, and a little for the
/// rest); past it the cache starts over.
const MAX_BYTES: usize = 4 << 20;
/// Keys other than calls by position told apart per run (a run's hashes count toward
/// [`MAX_BYTES`]); past it, a new such key of that run is looked for in the database.
const MAX_HASHED_KEYS: usize = 65_536;

#[derive(Default)]
pub struct Cache {
    runs: HashMap<RunId, Cached>,
    dispatches: HashMap<DispatchId, (RunId, StepKey)>,
    /// Runs the command now applying changed: forgotten if it is undone.
    touched: HashSet<RunId>,
    /// The row the next event takes on SQLite (see `store::chain`), once read. A command undone
    /// gives its rows back to the database but not to this count: those rows are skipped, never
    /// taken twice.
    next_event_row: Option<i64>,
    /// Roughly what the runs and steps held take.
    bytes: usize,
}

struct Cached {
    run: RunRecord,
    /// The run's steps not settled that are held.
    steps: HashMap<StepKey, StepRecord>,
    /// The keys of the steps seen, settled or not (a settled one is read from the database when
    /// wanted): kept small, as a run may make millions of calls.
    recorded: RecordedKeys,
    /// Every step of the run has been seen here, so one `recorded` lacks does not exist.
    complete: bool,
    /// How many of `steps` a call's body began (its questions, the calls it made): with none, a
    /// settle finds nothing to withdraw without looking.
    open_dependents: usize,
    /// The row of the run's last event on SQLite (see `store::chain`): `None` when not known
    /// here, `Some(None)` when the run has no events.
    last_event: Option<Option<i64>>,
}

fn run_bytes(run: &RunRecord) -> usize {
    256 + run.input.len() + run.output.as_ref().map_or(0, String::len)
}

fn step_bytes(step: &StepRecord) -> usize {
    512 + step.arguments.len()
        + step.output.as_ref().map_or(0, String::len)
        + step.error.as_ref().map_or(0, String::len)
}

/// What the cache knows of one step.
pub enum Known {
    Step(Box<StepRecord>),
    /// The run is complete here and has no such step.
    Absent,
    Unknown,
}

impl Cache {
    /// Forgets everything: a batch rolled back, a write failed after its command ended, the
    /// connection was made again.
    pub fn clear(&mut self) {
        self.runs.clear();
        self.dispatches.clear();
        self.touched.clear();
        self.next_event_row = None;
        self.bytes = 0;
    }

    /// The row the next event takes, if known here.
    pub fn next_event_row(&self) -> Option<i64> {
        self.next_event_row
    }

    /// Events were written up to the row before `next`.
    pub fn events_written(&mut self, next: i64) {
        self.next_event_row = Some(next);
    }

    pub fn begin_command(&mut self) {
        self.touched.clear();
    }

    /// The command was undone: what it changed is forgotten.
    pub fn undo_command(&mut self) {
        for run in std::mem::take(&mut self.touched) {
            self.forget(&run);
        }
    }

    /// Forgets the runs the command now ending touched that `keep` refuses: among replicas, the
    /// runs of shards another replica owns, which that one writes.
    pub fn forget_touched_unless(&mut self, keep: impl Fn(&RunId) -> bool) {
        let strays: Vec<RunId> = self.touched.iter().filter(|run| !keep(run)).cloned().collect();
        for run in strays {
            self.forget(&run);
        }
    }

    pub fn forget(&mut self, run: &RunId) {
        if let Some(cached) = self.runs.remove(run) {
            self.bytes = self
                .bytes
                .saturating_sub(run_bytes(&cached.run) + cached.recorded.bytes());
            for step in cached.steps.values() {
                self.bytes = self.bytes.saturating_sub(step_bytes(step));
                if let Some(dispatch) = &step.dispatch_id {
                    self.dispatches.remove(dispatch);
                }
            }
        }
    }

    /// The runs held that a commit's events created (`run:created`).
    pub fn born(&self, published: &[super::Published]) -> Vec<RunRecord> {
        published
            .iter()
            .filter(|item| item.event.kind == crate::model::EventType::RunCreated)
            .filter_map(|item| self.run(&item.event.run_id))
            .collect()
    }

    pub fn run(&self, id: &RunId) -> Option<RunRecord> {
        self.runs.get(id).map(|cached| cached.run.clone())
    }

    /// Whether a budget covers a held run: `None` when the run is not held.
    pub fn budgeted(&self, id: &RunId) -> Option<bool> {
        self.runs.get(id).map(|cached| cached.run.budget.is_some())
    }

    /// A held run's last event number.
    pub fn last_seq(&self, run: &RunId) -> Option<u64> {
        self.runs.get(run).map(|cached| cached.run.last_seq)
    }

    /// The row of a held run's last event, when known here (`Some(None)`: it has none).
    pub fn last_event(&self, run: &RunId) -> Option<Option<i64>> {
        self.runs.get(run).and_then(|cached| cached.last_event)
    }

    pub fn step(&self, run: &RunId, key: &StepKey) -> Known {
        match self.runs.get(run) {
            Some(cached) => match cached.steps.get(key) {
                Some(step) => Known::Step(Box::new(step.clone())),
                None if cached.complete && cached.recorded.lacks(key) => Known::Absent,
                None => Known::Unknown,
            },
            None => Known::Unknown,
        }
    }

    /// The step `dispatch_id` names, if it still holds it, with its run's last event number.
    pub fn by_dispatch(&self, dispatch_id: &DispatchId) -> Option<(StepRecord, u64)> {
        let (run, key) = self.dispatches.get(dispatch_id)?;
        let cached = self.runs.get(run)?;
        let step = cached.steps.get(key)?;
        (step.dispatch_id.as_ref() == Some(dispatch_id)).then(|| (step.clone(), cached.run.last_seq))
    }

    /// The steps of a complete run not settled yet that `caller`'s body began, in the run's order;
    /// `None` when the run is not held complete here. Asked at every settle: a run with none open
    /// answers without looking at its steps.
    pub fn open_dependents(&self, run: &RunId, caller: &StepKey) -> Option<Vec<StepRecord>> {
        let cached = self.runs.get(run).filter(|cached| cached.complete)?;
        if cached.open_dependents == 0 {
            return Some(Vec::new());
        }
        self.open_steps_where(run, |step| step.key.began_by(caller))
    }

    /// The steps of a complete run not settled yet that `keep` keeps, in the run's order; `None`
    /// when the run is not held complete here.
    pub fn open_steps_where(&self, run: &RunId, keep: impl Fn(&StepRecord) -> bool) -> Option<Vec<StepRecord>> {
        let cached = self.runs.get(run).filter(|cached| cached.complete)?;
        let mut open: Vec<StepRecord> = cached.steps.values().filter(|s| keep(s)).cloned().collect();
        open.sort_by(|a, b| (a.turn, a.position, &a.key).cmp(&(b.turn, b.position, &b.key)));
        Some(open)
    }

    /// Calls of a complete run not settled yet (pending, running or waiting for a person).
    pub fn unsettled(&self, run: &RunId) -> Option<usize> {
        let cached = self.runs.get(run).filter(|cached| cached.complete)?;
        Some(
            cached
                .steps
                .values()
                .filter(|step| {
                    matches!(
                        step.status,
                        StepStatus::Pending | StepStatus::Running | StepStatus::AwaitingApproval
                    )
                })
                .count(),
        )
    }

    /// A run this writer just inserted: it has no steps yet.
    pub fn inserted_run(&mut self, run: &RunRecord) {
        self.hold(run, true);
    }

    /// A run read from the database inside the transaction.
    pub fn loaded_run(&mut self, run: &RunRecord) {
        if run.status.is_terminal() {
            return;
        }
        match self.runs.get_mut(&run.id) {
            Some(cached) => {
                self.bytes = self.bytes + run_bytes(run) - run_bytes(&cached.run);
                cached.run = run.clone();
            }
            None => self.hold(run, false),
        }
    }

    /// A run's changed columns written, as [`super::ops`]' `save_run` writes them (its event
    /// number is the log's own, see [`Cache::numbered`]).
    pub fn saved_run(&mut self, run: &RunRecord) {
        self.touched.insert(run.id.clone());
        if run.status.is_terminal() {
            // Finished runs take no more calls; reads of them go to the database.
            self.forget(&run.id);
            return;
        }
        if let Some(cached) = self.runs.get_mut(&run.id) {
            self.bytes = self.bytes + run_bytes(run) - run_bytes(&cached.run);
            let last_seq = cached.run.last_seq;
            cached.run = run.clone();
            cached.run.last_seq = last_seq;
        }
    }

    /// A run's last event number and update time written, and the row of its last event when
    /// that was written too.
    pub fn numbered(&mut self, run: &RunId, last_seq: u64, updated_at: i64, last_event: Option<i64>) {
        self.touched.insert(run.clone());
        if let Some(cached) = self.runs.get_mut(run) {
            cached.run.last_seq = last_seq;
            cached.run.updated_at = updated_at;
            if last_event.is_some() {
                cached.last_event = Some(last_event);
            }
        }
    }

    /// A step written (inserted or saved) or read from the database, in full.
    pub fn step_is(&mut self, step: &StepRecord) {
        let Some(cached) = self.runs.get_mut(&step.run_id) else {
            return;
        };
        if let Some(old) = cached.steps.remove(&step.key) {
            cached.open_dependents -= usize::from(old.key.is_dependent());
            self.bytes = self.bytes.saturating_sub(step_bytes(&old));
            if let Some(dispatch) = &old.dispatch_id {
                self.dispatches.remove(dispatch);
            }
        }
        let hashed = cached.recorded.bytes();
        cached.recorded.record(&step.key);
        self.bytes = (self.bytes + cached.recorded.bytes()).saturating_sub(hashed);
        if !step.status.is_terminal() {
            if let Some(dispatch) = &step.dispatch_id {
                self.dispatches
                    .insert(dispatch.clone(), (step.run_id.clone(), step.key.clone()));
            }
            self.bytes += step_bytes(step);
            cached.open_dependents += usize::from(step.key.is_dependent());
            cached.steps.insert(step.key.clone(), step.clone());
        }
        if self.bytes > MAX_BYTES {
            self.start_over();
        }
    }

    /// Whether a held run's status, as the database has it, is `status`; `None` when not held.
    pub fn run_status_is(&self, run: &RunId, status: crate::model::RunStatus) -> Option<bool> {
        self.runs.get(run).map(|cached| cached.run.status == status)
    }

    /// Whether a held step's status and dispatch, as the database has them, are `step`'s: `None`
    /// when the step is not held.
    pub fn step_indexed_as(&self, step: &StepRecord) -> Option<(bool, bool)> {
        let held = self.runs.get(&step.run_id)?.steps.get(&step.key)?;
        Some((held.status == step.status, held.dispatch_id == step.dispatch_id))
    }

    /// A step written: the command that wrote it owns the change.
    pub fn saved_step(&mut self, step: &StepRecord) {
        self.touched.insert(step.run_id.clone());
        self.step_is(step);
    }

    fn hold(&mut self, run: &RunRecord, complete: bool) {
        if run.status.is_terminal() {
            return;
        }
        if self.bytes + run_bytes(run) > MAX_BYTES {
            self.start_over();
        }
        self.touched.insert(run.id.clone());
        self.bytes += run_bytes(run);
        self.runs.insert(
            run.id.clone(),
            Cached {
                run: run.clone(),
                steps: HashMap::new(),
                recorded: RecordedKeys::new(MAX_HASHED_KEYS),
                complete,
                open_dependents: 0,
                // A run this writer inserted has no events yet; one read has them in the row.
                last_event: complete.then_some(None),
            },
        );
    }

    /// Drops what is held but not what the writer knows of its own commits.
    fn start_over(&mut self) {
        self.runs.clear();
        self.dispatches.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records;

    fn settled(key: StepKey) -> StepRecord {
        let mut step = records::step();
        step.key = key;
        step.status = StepStatus::Succeeded;
        step
    }

    #[test]
    fn a_complete_run_knows_without_looking_when_no_call_began_anything_still_open() {
        let run = records::run();
        let mut cache = Cache::default();
        cache.inserted_run(&run);
        let caller = StepKey::for_call(0, 0, None);
        let open = |key: StepKey| {
            let mut step = records::step();
            step.key = key;
            step.status = StepStatus::Pending;
            step
        };
        cache.step_is(&open(caller.clone()));
        assert_eq!(cache.open_dependents(&run.id, &caller), Some(Vec::new()));
        let nested = open(StepKey::nested_call(&caller, 3));
        cache.step_is(&nested);
        cache.step_is(&open(StepKey::tool_question(&StepKey::for_call(0, 1, None), 0)));
        let found = cache.open_dependents(&run.id, &caller).unwrap();
        assert_eq!(found.iter().map(|s| &s.key).collect::<Vec<_>>(), [&nested.key]);
        cache.step_is(&settled(nested.key.clone()));
        assert_eq!(cache.open_dependents(&run.id, &caller), Some(Vec::new()));
        assert_eq!(cache.runs[&run.id].open_dependents, 1, "the other call's question");
        assert_eq!(cache.open_dependents(&RunId::new(), &caller), None, "a run not held");
    }

    #[test]
    fn a_complete_run_rules_out_new_calls_without_keeping_every_settled_one() {
        let run = records::run();
        let mut cache = Cache::default();
        cache.inserted_run(&run);
        let held = cache.bytes;
        for turn in 0..10_000 {
            cache.step_is(&settled(StepKey::for_call(turn, 0, None)));
        }
        assert_eq!(cache.bytes, held, "settled calls by position cost nothing");
        assert!(matches!(
            cache.step(&run.id, &StepKey::for_call(10_000, 0, None)),
            Known::Absent
        ));
        assert!(
            matches!(cache.step(&run.id, &StepKey::for_call(7, 0, None)), Known::Unknown),
            "a settled call is read from the database"
        );

        for n in 0..100 {
            cache.step_is(&settled(StepKey::for_call(0, 0, Some(&format!("call_{n}")))));
        }
        assert_eq!(cache.bytes, held + 100 * super::super::recorded::HASH_BYTES);
        let named = |id: &str| cache.step(&run.id, &StepKey::for_call(0, 0, Some(id)));
        assert!(matches!(named("call_100"), Known::Absent));
        assert!(matches!(named("call_5"), Known::Unknown));

        let mut running = records::step();
        running.key = StepKey::for_call(10_000, 0, None);
        running.status = StepStatus::Running;
        cache.step_is(&running);
        assert!(matches!(cache.step(&run.id, &running.key), Known::Step(_)));
        cache.forget(&run.id);
        assert_eq!(cache.bytes, 0, "a run forgotten leaves nothing in the budget");
    }
}
