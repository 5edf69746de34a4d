//! [`Records`] in memory, for the property tests of whole commands: the same semantics as the
//! store's transaction (`store::ops`, `impl Records for Tx`), row for row: what each save writes
//! and leaves, which statuses each query counts, the order of its rows, a run's events numbered
//! from its `last_seq`, and a cached result kept while a run it belongs to remains.
//!
//! Where SQL leaves an order open (rows tied on `ORDER BY`), rows come here by key, so a run of
//! the tests is deterministic.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{Records, Result};
use crate::error::KernelError;
use crate::machine::NewEvent;
use crate::machine::effects::Effect;
use crate::machine::hosted::Fence;
use crate::model::{
    ApprovalId, ApprovalRecord, ApprovalStatus, DispatchId, EventType, Millis, RunId, RunRecord, RunStatus, StepKey,
    StepRecord, StepStatus,
};
use crate::store::Deleted;

/// One appended event: what the store writes to `events`, and the step the command named with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub seq: u64,
    pub kind: EventType,
    pub at: Millis,
    pub payload: Value,
    pub step: Option<StepKey>,
}

/// A cached result (`result_cache`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cached {
    pub tool: String,
    pub output: String,
    pub stored_at: Millis,
    pub expires_at: Millis,
}

/// A held resource lock (`resource_locks`).
#[derive(Clone, Debug, PartialEq)]
pub struct Lock {
    pub run: RunId,
    pub key: StepKey,
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub acquired_at: Millis,
}

/// Every row the store would hold: what a command may change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub runs: BTreeMap<RunId, RunRecord>,
    pub steps: BTreeMap<(RunId, StepKey), StepRecord>,
    /// `places`: (run, seq, step key).
    pub places: BTreeSet<(RunId, u32, StepKey)>,
    pub approvals: BTreeMap<ApprovalId, ApprovalRecord>,
    pub cache: BTreeMap<String, Cached>,
    /// `result_cache_runs`: (call hash, run).
    pub cache_runs: BTreeSet<(String, RunId)>,
    pub locks: BTreeMap<String, Lock>,
    pub log: BTreeMap<RunId, Vec<Logged>>,
    /// `step_checks`: a local step's allowance, by (run, step key).
    pub checks: BTreeMap<(RunId, StepKey), (Fence, String)>,
    /// `tool_cache`: (tool, key) to (value, expiry).
    pub tool_cache: BTreeMap<(String, String), (String, Option<Millis>)>,
    /// `limit_buckets`: each rate limit's token bucket, by name.
    pub buckets: BTreeMap<String, crate::machine::throttle::Bucket>,
}

/// The records of one store, with its clock; each command runs against it as inside the
/// writer's transaction.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    pub now: Millis,
    pub state: State,
    /// Runs appended to by the command under way: the store writes their `updated_at` when the
    /// command ends ([`Memory::finish`]).
    appended: BTreeSet<RunId>,
    /// What the commands left to do after their commits, in order.
    pub effects: Vec<Effect>,
}

impl Memory {
    pub fn new(now: Millis) -> Self {
        Memory {
            now,
            ..Memory::default()
        }
    }

    /// Ends a command as the store's `Tx::finish` does: each run it appended to was updated now.
    pub fn finish(&mut self) {
        for id in std::mem::take(&mut self.appended) {
            if let Some(run) = self.state.runs.get_mut(&id) {
                run.updated_at = self.now;
            }
        }
    }

    fn steps_of<'a>(&'a self, run: &'a RunId) -> impl Iterator<Item = &'a StepRecord> + 'a {
        self.state
            .steps
            .range((run.clone(), StepKey::from_stored(String::new()))..)
            .take_while(move |((id, _), _)| id == run)
            .map(|(_, step)| step)
    }

    /// The run's unsettled steps in (turn, position) order.
    fn unsettled(&self, run: &RunId) -> Vec<StepRecord> {
        let mut open: Vec<StepRecord> = self
            .steps_of(run)
            .filter(|step| !step.status.is_terminal())
            .cloned()
            .collect();
        open.sort_by(|a, b| (a.turn, a.position, &a.key).cmp(&(b.turn, b.position, &b.key)));
        open
    }
}

fn not_found(id: &RunId) -> KernelError {
    KernelError::NotFound(format!("run {id} not found"))
}

impl Records for Memory {
    fn now(&self) -> Millis {
        self.now
    }

    fn replica(&self) -> &str {
        "memory"
    }

    fn run(&self, id: &RunId) -> Result<RunRecord> {
        let mut run = self.state.runs.get(id).cloned().ok_or_else(|| not_found(id))?;
        // The row lags what this command appended until it ends.
        if self.appended.contains(id) {
            run.updated_at = self.now;
        }
        Ok(run)
    }

    fn run_by_idempotency_key(&self, key: &str) -> Result<Option<RunRecord>> {
        Ok(self
            .state
            .runs
            .values()
            .find(|run| run.idempotency_key.as_deref() == Some(key))
            .cloned())
    }

    fn run_exists(&self, id: &RunId) -> Result<bool> {
        Ok(self.state.runs.contains_key(id))
    }

    fn insert_run(&mut self, run: &RunRecord) -> Result<()> {
        if self.state.runs.contains_key(&run.id) {
            return Err(KernelError::Store(format!("run {} inserted twice", run.id)));
        }
        if let Some(key) = &run.idempotency_key
            && self.run_by_idempotency_key(key)?.is_some()
        {
            return Err(KernelError::Store(format!("idempotency key {key} taken twice")));
        }
        // The row starts with no events, whatever the record says.
        let mut row = run.clone();
        row.last_seq = 0;
        self.state.runs.insert(run.id.clone(), row);
        Ok(())
    }

    fn save_run(&mut self, run: &RunRecord) -> Result<()> {
        // As the UPDATE: these columns only, and nothing for a run that is gone.
        if let Some(row) = self.state.runs.get_mut(&run.id) {
            row.status = run.status;
            row.output.clone_from(&run.output);
            row.reason.clone_from(&run.reason);
            row.tool_calls = run.tool_calls;
            row.updated_at = run.updated_at;
            row.dispatches = run.dispatches;
            row.suspensions = run.suspensions;
            row.budget.clone_from(&run.budget);
        }
        Ok(())
    }

    fn live_children(&self, run: &RunId) -> Result<Vec<RunId>> {
        Ok(self
            .state
            .runs
            .values()
            .filter(|child| child.parent.as_ref().is_some_and(|(parent, _)| parent == run))
            .filter(|child| !child.status.is_terminal())
            .map(|child| child.id.clone())
            .collect())
    }

    fn next_of_session(&self, session: &str) -> Result<Option<RunId>> {
        Ok(self
            .state
            .runs
            .values()
            .find(|run| run.session_key.as_deref() == Some(session) && !run.status.is_terminal())
            .map(|run| run.id.clone()))
    }

    fn idle_runs(&self, cutoff: Millis, limit: usize) -> Result<Vec<(RunId, Option<Millis>)>> {
        let mut idle: Vec<(Millis, RunId, Option<Millis>)> = self
            .state
            .runs
            .values()
            .filter(|run| matches!(run.status, RunStatus::Pending | RunStatus::Running))
            .filter(|run| !run.hosted && run.created_at <= cutoff)
            .filter_map(|run| {
                let last = self.steps_of(&run.id).map(|step| step.created_at).max();
                (last.is_none_or(|last| last <= cutoff)).then(|| (run.updated_at, run.id.clone(), last))
            })
            .collect();
        idle.sort();
        Ok(idle.into_iter().take(limit).map(|(_, id, last)| (id, last)).collect())
    }

    fn finished_runs(&self, before: Millis, limit: usize) -> Result<Vec<RunId>> {
        let mut finished: Vec<(Millis, RunId)> = self
            .state
            .runs
            .values()
            .filter(|run| run.status.is_terminal() && run.updated_at < before)
            .map(|run| (run.updated_at, run.id.clone()))
            .collect();
        finished.sort();
        Ok(finished.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    fn remove_run(&mut self, run: &RunId) -> Result<Deleted> {
        let state = &mut self.state;
        state.cache_runs.retain(|(_, owner)| owner != run);
        let approvals = count_removed(&mut state.approvals, |a| a.run_id == *run);
        let steps = count_removed(&mut state.steps, |s| s.run_id == *run);
        state.places.retain(|(id, _, _)| id != run);
        state.checks.retain(|(id, _), _| id != run);
        state.locks.retain(|_, lock| lock.run != *run);
        let events = state.log.remove(run).map_or(0, |log| log.len() as u64);
        let runs = u64::from(state.runs.remove(run).is_some());
        Ok(Deleted {
            runs,
            events,
            steps,
            approvals,
            cache_entries: 0,
        })
    }

    fn write_tool_cache(&mut self, tool: &str, set: &crate::store::ToolCacheSet) -> Result<()> {
        let entry = (set.value.clone(), set.expires_at);
        self.state.tool_cache.insert((tool.to_owned(), set.key.clone()), entry);
        Ok(())
    }

    fn cache_claims(&self, run: &RunId) -> Result<Vec<(String, usize)>> {
        let claims = &self.state.cache_runs;
        Ok(claims
            .iter()
            .filter(|(_, owner)| owner == run)
            .map(|(hash, _)| (hash.clone(), claims.iter().filter(|(h, _)| h == hash).count()))
            .collect())
    }

    fn delete_cached_result(&mut self, call_hash: &str) -> Result<bool> {
        self.state.cache_runs.retain(|(hash, _)| hash != call_hash);
        Ok(self.state.cache.remove(call_hash).is_some())
    }

    fn find_step(&self, run: &RunId, key: &StepKey) -> Result<Option<StepRecord>> {
        Ok(self.state.steps.get(&(run.clone(), key.clone())).cloned())
    }

    fn step_by_dispatch(&self, dispatch_id: &DispatchId) -> Result<Option<StepRecord>> {
        Ok(self
            .state
            .steps
            .values()
            .find(|step| step.dispatch_id.as_ref() == Some(dispatch_id))
            .cloned())
    }

    fn insert_step(&mut self, step: &StepRecord) -> Result<()> {
        let id = (step.run_id.clone(), step.key.clone());
        if self.state.steps.contains_key(&id) {
            return Err(KernelError::Store(format!(
                "step {} of run {} inserted twice",
                step.key, step.run_id
            )));
        }
        self.state.steps.insert(id, step.clone());
        Ok(())
    }

    fn write_step(&mut self, step: &StepRecord) -> Result<()> {
        // As the UPDATE: what a transition may change; what the call was stays as recorded.
        if let Some(row) = self.state.steps.get_mut(&(step.run_id.clone(), step.key.clone())) {
            row.status = step.status;
            row.dispatch_id.clone_from(&step.dispatch_id);
            row.attempts = step.attempts;
            row.output.clone_from(&step.output);
            row.error.clone_from(&step.error);
            row.error_kind = step.error_kind;
            row.worker.clone_from(&step.worker);
            row.session_id.clone_from(&step.session_id);
            row.lease_expires_at = step.lease_expires_at;
            row.started_at = step.started_at;
            row.finished_at = step.finished_at;
            row.progress_count = step.progress_count;
            row.not_before = step.not_before;
            row.lease_losses = step.lease_losses;
            row.cost = step.cost;
            row.outcome = step.outcome;
            row.approval.clone_from(&step.approval);
            row.replays = step.replays;
            row.replica.clone_from(&step.replica);
            row.limited_by.clone_from(&step.limited_by);
            row.limit_wait_ms = step.limit_wait_ms;
            row.approval_gate.clone_from(&step.approval_gate);
        }
        Ok(())
    }

    fn release_locks(&mut self, step: &StepRecord) -> Result<()> {
        self.state
            .locks
            .retain(|_, lock| !(lock.run == step.run_id && lock.key == step.key));
        Ok(())
    }

    fn open_steps(&self, run: &RunId) -> Result<Vec<StepRecord>> {
        Ok(self.unsettled(run))
    }

    fn count_active_steps(&self, run: &RunId) -> Result<usize> {
        Ok(self
            .unsettled(run)
            .iter()
            .filter(|step| {
                matches!(
                    step.status,
                    StepStatus::Pending | StepStatus::Running | StepStatus::AwaitingApproval
                )
            })
            .count())
    }

    fn next_awaiting_approval(&self, run: &RunId) -> Result<Option<StepRecord>> {
        Ok(self
            .unsettled(run)
            .into_iter()
            .find(|step| step.status == StepStatus::AwaitingApproval))
    }

    fn note_replays(&mut self, run: &RunId, keys: &[StepKey]) -> Result<()> {
        for key in keys {
            if let Some(step) = self.state.steps.get_mut(&(run.clone(), key.clone())) {
                step.replays += 1;
            }
        }
        Ok(())
    }

    fn steps_at_place(&self, run: &RunId, seq: u32) -> Result<Vec<StepRecord>> {
        let mut steps: Vec<StepRecord> = self
            .state
            .places
            .iter()
            .filter(|(id, at, _)| id == run && *at == seq)
            .filter_map(|(id, _, key)| self.state.steps.get(&(id.clone(), key.clone())).cloned())
            .collect();
        steps.sort_by(|a, b| (a.position, &a.key).cmp(&(b.position, &b.key)));
        Ok(steps)
    }

    fn insert_place(&mut self, step: &StepRecord) -> Result<()> {
        let place = (step.run_id.clone(), step.turn, step.key.clone());
        if !self.state.places.insert(place) {
            return Err(KernelError::Store(format!(
                "place {} of run {} taken twice by {}",
                step.turn, step.run_id, step.key
            )));
        }
        Ok(())
    }

    fn approval(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>> {
        Ok(self.state.approvals.get(id).cloned())
    }

    fn open_approvals(&self, run: &RunId) -> Result<Vec<ApprovalRecord>> {
        Ok(self
            .state
            .approvals
            .values()
            .filter(|a| a.run_id == *run && a.status == ApprovalStatus::Pending)
            .cloned()
            .collect())
    }

    fn open_approval_of(&self, run: &RunId, key: &StepKey) -> Result<Option<ApprovalRecord>> {
        Ok(self
            .state
            .approvals
            .values()
            .find(|a| a.run_id == *run && a.key == *key && a.status == ApprovalStatus::Pending)
            .cloned())
    }

    fn due_approvals(&self) -> Result<Vec<ApprovalRecord>> {
        Ok(self
            .state
            .approvals
            .values()
            .filter(|a| a.status == ApprovalStatus::Pending && a.expires_at.is_some_and(|at| at <= self.now))
            .cloned()
            .collect())
    }

    fn insert_approval(&mut self, approval: &ApprovalRecord) -> Result<()> {
        if self.state.approvals.contains_key(&approval.id) {
            return Err(KernelError::Store(format!("approval {} inserted twice", approval.id)));
        }
        self.state.approvals.insert(approval.id.clone(), approval.clone());
        Ok(())
    }

    fn save_approval(&mut self, approval: &ApprovalRecord) -> Result<()> {
        if let Some(row) = self.state.approvals.get_mut(&approval.id) {
            row.status = approval.status;
            row.answered_at = approval.answered_at;
            row.decider.clone_from(&approval.decider);
            row.reason.clone_from(&approval.reason);
            row.answer.clone_from(&approval.answer);
        }
        Ok(())
    }

    fn consume_approval(&mut self, run: &RunId, key: &StepKey) -> Result<()> {
        for approval in self.state.approvals.values_mut() {
            if approval.run_id == *run && approval.key == *key && approval.status == ApprovalStatus::Approved {
                approval.status = ApprovalStatus::Consumed;
            }
        }
        Ok(())
    }

    fn cached_result(&self, call_hash: &str) -> Result<Option<String>> {
        Ok(self
            .state
            .cache
            .get(call_hash)
            .filter(|cached| cached.expires_at > self.now)
            .map(|cached| cached.output.clone()))
    }

    fn cache_result(&mut self, step: &StepRecord, output: &str, expires_at: Millis) -> Result<()> {
        let now = self.now;
        let entry = self
            .state
            .cache
            .entry(step.call_hash.clone())
            .or_insert_with(|| Cached {
                tool: step.tool.clone(),
                output: String::new(),
                stored_at: now,
                expires_at,
            });
        // The upsert keeps the first writer's tool.
        entry.output = output.to_owned();
        entry.stored_at = now;
        entry.expires_at = expires_at;
        Ok(())
    }

    fn own_cached_result(&mut self, step: &StepRecord) -> Result<()> {
        self.state
            .cache_runs
            .insert((step.call_hash.clone(), step.run_id.clone()));
        Ok(())
    }

    fn held_locks(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .state
            .locks
            .range(prefix.to_owned()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .map(|(name, _)| name.clone())
            .collect())
    }

    fn lock_bucket(
        &mut self,
        name: &str,
        fresh: crate::machine::throttle::Bucket,
    ) -> Result<crate::machine::throttle::Bucket> {
        Ok(*self.state.buckets.entry(name.to_owned()).or_insert(fresh))
    }

    fn save_bucket(&mut self, name: &str, bucket: crate::machine::throttle::Bucket) -> Result<()> {
        self.state.buckets.insert(name.to_owned(), bucket);
        Ok(())
    }

    fn take_lock(
        &mut self,
        resource: &str,
        step: &StepRecord,
        (dispatch_id, attempt): (&DispatchId, u32),
    ) -> Result<std::result::Result<(), (String, String)>> {
        let now = self.now;
        match self.state.locks.get_mut(resource) {
            Some(lock) if lock.run != step.run_id || lock.key != step.key => {
                Ok(Err((lock.run.as_str().to_owned(), lock.key.as_str().to_owned())))
            }
            Some(lock) => {
                lock.dispatch_id = dispatch_id.clone();
                lock.attempt = attempt;
                lock.acquired_at = now;
                Ok(Ok(()))
            }
            None => {
                self.state.locks.insert(
                    resource.to_owned(),
                    Lock {
                        run: step.run_id.clone(),
                        key: step.key.clone(),
                        dispatch_id: dispatch_id.clone(),
                        attempt,
                        acquired_at: now,
                    },
                );
                Ok(Ok(()))
            }
        }
    }

    fn append(&mut self, run: &RunId, event: NewEvent, step: Option<StepRecord>) -> Result<()> {
        // The next number comes from the run row, as the SQL's `last_seq + 1 ... RETURNING`.
        let row = self.state.runs.get_mut(run).ok_or_else(|| not_found(run))?;
        row.last_seq += 1;
        let seq = row.last_seq;
        self.appended.insert(run.clone());
        self.state.log.entry(run.clone()).or_default().push(Logged {
            seq,
            kind: event.kind,
            at: self.now,
            payload: event.payload,
            step: step.map(|step| step.key),
        });
        Ok(())
    }

    fn effect(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    fn note_check(&mut self, run: &RunId, key: &StepKey, fence: &Fence, decided_by: &str) -> Result<()> {
        self.state
            .checks
            .insert((run.clone(), key.clone()), (fence.clone(), decided_by.to_owned()));
        Ok(())
    }

    fn take_check(&mut self, run: &RunId, key: &StepKey) -> Result<Option<(Fence, String)>> {
        Ok(self.state.checks.remove(&(run.clone(), key.clone())))
    }
}

/// Removes the rows `gone` picks; how many went.
fn count_removed<K: Ord, V>(rows: &mut BTreeMap<K, V>, gone: impl Fn(&V) -> bool) -> u64 {
    let before = rows.len();
    rows.retain(|_, row| !gone(row));
    (before - rows.len()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, run, step};

    fn with_run() -> Memory {
        let mut memory = Memory::new(NOW);
        memory.insert_run(&run()).unwrap();
        memory
    }

    fn event() -> NewEvent {
        NewEvent {
            kind: EventType::RunStarted,
            payload: serde_json::json!({}),
        }
    }

    #[test]
    fn events_are_numbered_from_the_runs_row() {
        let mut memory = with_run();
        let id = run().id;
        memory.now = NOW + 5;
        memory.append(&id, event(), None).unwrap();
        memory.append(&id, event(), Some(step())).unwrap();
        memory.finish();
        let seqs: Vec<u64> = memory.state.log[&id].iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2]);
        let row = memory.run(&id).unwrap();
        assert_eq!(
            (row.last_seq, row.updated_at),
            (2, NOW + 5),
            "the row names its last event"
        );
        assert!(memory.append(&RunId::new(), event(), None).is_err(), "no run, no event");
    }

    /// Which entry goes with a deleted run is the delete command's rule; the records count the
    /// claims on each and delete what they are told.
    #[test]
    fn cached_results_count_the_runs_that_claim_them() {
        let mut memory = with_run();
        let mut other = run();
        other.id = RunId::new();
        memory.insert_run(&other).unwrap();
        let mine = step();
        let theirs = StepRecord {
            run_id: other.id.clone(),
            ..step()
        };
        memory.cache_result(&mine, "1", NOW + 10).unwrap();
        memory.own_cached_result(&mine).unwrap();
        memory.own_cached_result(&theirs).unwrap();
        assert_eq!(memory.cache_claims(&run().id).unwrap(), vec![("h".to_owned(), 2)]);
        assert_eq!(memory.remove_run(&run().id).unwrap().cache_entries, 0);
        assert_eq!(memory.cached_result("h").unwrap().as_deref(), Some("1"));
        assert_eq!(memory.cache_claims(&other.id).unwrap(), vec![("h".to_owned(), 1)]);
        assert!(memory.delete_cached_result("h").unwrap());
        assert_eq!(memory.cached_result("h").unwrap(), None);
        assert!(memory.cache_claims(&other.id).unwrap().is_empty());
    }

    #[test]
    fn a_lock_is_retaken_only_by_the_step_holding_it() {
        let mut memory = with_run();
        let holder = step();
        let other = StepRecord {
            key: StepKey::for_call(0, 1, None),
            ..step()
        };
        assert_eq!(
            memory.take_lock("repo:acme", &holder, (&"d1".into(), 1)).unwrap(),
            Ok(())
        );
        assert_eq!(
            memory.take_lock("repo:acme", &holder, (&"d2".into(), 2)).unwrap(),
            Ok(())
        );
        let refused = memory.take_lock("repo:acme", &other, (&"d3".into(), 1)).unwrap();
        assert_eq!(refused, Err((holder.run_id.to_string(), holder.key.to_string())));
        memory.release_locks(&holder).unwrap();
        assert_eq!(
            memory.take_lock("repo:acme", &other, (&"d3".into(), 1)).unwrap(),
            Ok(())
        );
    }
}
