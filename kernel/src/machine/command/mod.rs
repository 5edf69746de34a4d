//! The write commands, one module each: the order in which a command applies the machine's
//! rules, and the rules that need more than one record. A command reads and writes records only
//! through [`Records`], which each store implements inside its write transaction (and the
//! property tests in memory); the store holds no rule of a call's life.
//!
//! - [`create_run`]: a run, or the one its idempotency key names.
//! - [`submit_turn`]: a turn's calls: fence, place, branch rule, admission, then per call replay,
//!   refusal, decision, cache, record and an early start; then the next question to a person.
//! - [`start`], [`result`], [`lose_lease`], [`time_out`]: one dispatch of a step.
//! - [`answer_approval`]: a person's answer, or an expiry.
//! - [`end_run`]: a run's end asked from outside, and abandoned runs.
//! - [`cancel_call`]: one call of a run.
//! - [`local_step`]: a hosted handler's local step, checked before it runs or recorded after.
//! - [`suspend`]: a dispatch giving back its slot to wait.
//! - [`start_subagent`]: a hosted handler's (or a tool body's) subagent.
//! - [`ask_person`]: a tool body's question to a person; a settled call's questions withdrawn.
//! - [`spend`]: an attempt paid for by the budgets over its run as it starts, or its call settled
//!   as `budget_exceeded`.
//! - [`delete`]: a finished run and what it alone holds.
//! - [`tool_cache`]: an entry of a tool's own cache, from the dispatch running it.
//!
//! What many commands share: [`ending`] (a run's end: children first, then calls, then the run,
//! its parent's step and its session's next run) and [`ask`] (questions one at a time).
//!
//! Tests: `memory` holds the records in memory as the SQL transaction does; `properties` runs
//! random sequences of every command against it, checking the log and the rules after each one,
//! and `store::replayed` replays them on SQLite and PostgreSQL to compare the logs.

pub mod answer_approval;
pub mod ask;
pub mod ask_person;
pub mod cancel_call;
pub mod create_run;
pub mod delete;
pub mod dependents;
pub mod end_run;
pub mod ending;
pub mod local_step;
pub mod lose_lease;
#[cfg(test)]
pub(crate) mod memory;
#[cfg(test)]
pub(crate) mod properties;
pub mod result;
pub mod spend;
pub mod start;
pub mod start_subagent;
pub mod submit_turn;
pub mod suspend;
pub mod throttle;
pub mod time_out;
pub mod tool_cache;

use crate::error::KernelError;
use crate::machine::effects::Effect;
use crate::machine::{NewEvent, StepChange, dispatch, hosted};
use crate::model::{
    ApprovalId, ApprovalRecord, DispatchId, Millis, RunId, RunRecord, SessionId, StepKey, StepKind, StepRecord,
    StepStatus,
};

pub type Result<T> = std::result::Result<T, KernelError>;

/// The records a command reads and writes, inside one write transaction. Reads see the
/// command's own writes. Nothing here decides: each method loads, saves or appends.
pub trait Records {
    /// The batch's time: every transition of the command happens at it.
    fn now(&self) -> Millis;
    /// The replica this store's writer serves: a dispatch started here is leased to it.
    fn replica(&self) -> &str;

    /// Run `id`; `NotFound` when there is none.
    fn run(&self, id: &RunId) -> Result<RunRecord>;
    /// Whether a budget covers run `id` (its own or a parent's), without loading the whole run
    /// where the store holds that much in memory: every tool call's start asks.
    fn budgeted(&self, id: &RunId) -> Result<bool> {
        Ok(self.run(id)?.budget.is_some())
    }
    /// The run holding idempotency key `key`.
    fn run_by_idempotency_key(&self, key: &str) -> Result<Option<RunRecord>>;
    fn run_exists(&self, id: &RunId) -> Result<bool>;
    fn insert_run(&mut self, run: &RunRecord) -> Result<()>;
    /// Writes what a transition may change of a run.
    fn save_run(&mut self, run: &RunRecord) -> Result<()>;
    /// The children of `run` not finished, oldest first.
    fn live_children(&self, run: &RunId) -> Result<Vec<RunId>>;
    /// The oldest run of `session` not finished.
    fn next_of_session(&self, session: &str) -> Result<Option<RunId>>;
    /// External agents' runs pending or running with no step created after `cutoff` (and
    /// created at or before it), least recently updated first, with their last step's creation.
    fn idle_runs(&self, cutoff: Millis, limit: usize) -> Result<Vec<(RunId, Option<Millis>)>>;
    /// Finished runs last updated before `before`, oldest first.
    fn finished_runs(&self, before: Millis, limit: usize) -> Result<Vec<RunId>>;
    /// Removes a run's rows, its claims on cached results among them, but no cached result
    /// (`cache_entries` is 0).
    fn remove_run(&mut self, run: &RunId) -> Result<crate::store::Deleted>;
    /// The cached results `run` stored or was served, each with how many runs claim it (`run`
    /// among them).
    fn cache_claims(&self, run: &RunId) -> Result<Vec<(String, usize)>>;
    /// Deletes the cached result of `call_hash`; whether there was one.
    fn delete_cached_result(&mut self, call_hash: &str) -> Result<bool>;

    /// Step `key` of `run`.
    fn find_step(&self, run: &RunId, key: &StepKey) -> Result<Option<StepRecord>>;
    /// The step whose current dispatch is `dispatch_id`, whichever attempt.
    fn step_by_dispatch(&self, dispatch_id: &DispatchId) -> Result<Option<StepRecord>>;
    /// Writes a step as recorded, with what it was (tool, arguments, identity, policy).
    fn insert_step(&mut self, step: &StepRecord) -> Result<()>;
    /// Writes what a transition may change of a step (use [`Records::save_step`]).
    fn write_step(&mut self, step: &StepRecord) -> Result<()>;
    /// Releases the resource locks `step` holds.
    fn release_locks(&mut self, step: &StepRecord) -> Result<()>;

    /// Writes what a transition may change of a step. Every way out of running passes here, so
    /// no exit path keeps a resource lock or a tool limit's slot, or the run time its budget
    /// reserved.
    fn save_step(&mut self, step: &StepRecord) -> Result<()> {
        if step.kind == StepKind::Tool
            && self.budgeted(&step.run_id)?
            && let Some(was) = self.find_step(&step.run_id, &step.key)?
            && was.status == StepStatus::Running
            && (step.status != StepStatus::Running || step.attempts != was.attempts)
        {
            spend::end_attempt(self, &was)?;
        }
        self.write_step(step)?;
        let holds = !step.limited_by.is_empty() || crate::resources::locks(&step.resources).next().is_some();
        if step.status != StepStatus::Running && holds {
            self.release_locks(step)?;
        }
        Ok(())
    }
    /// The run's steps not settled (a hosted run's own dispatch among them).
    fn open_steps(&self, run: &RunId) -> Result<Vec<StepRecord>>;
    /// The steps of `run` not settled that `caller`'s body began (its questions, the calls it made
    /// through the kernel), in the run's order.
    fn open_dependents(&self, run: &RunId, caller: &StepKey) -> Result<Vec<StepRecord>> {
        let mut open = self.open_steps(run)?;
        open.retain(|step| step.key.began_by(caller));
        Ok(open)
    }
    /// How many of the run's steps are pending, running or awaiting approval (a suspended one
    /// waits on others), a hosted run's own dispatch among them.
    fn count_active_steps(&self, run: &RunId) -> Result<usize>;
    /// The run's first call, in (turn, position) order, waiting for a person's approval.
    fn next_awaiting_approval(&self, run: &RunId) -> Result<Option<StepRecord>>;
    /// Counts one more replay of each step of `keys`.
    fn note_replays(&mut self, run: &RunId, keys: &[StepKey]) -> Result<()>;

    /// The steps a hosted handler recorded at place `seq` of its order, by position.
    fn steps_at_place(&self, run: &RunId, seq: u32) -> Result<Vec<StepRecord>>;
    /// Records that `step` sits at place `step.turn` of its handler's order.
    fn insert_place(&mut self, step: &StepRecord) -> Result<()>;

    /// Notes that local step `key` was allowed to run (by `decided_by`) when the dispatch `fence`
    /// holds asked, before it ran.
    fn note_check(&mut self, run: &RunId, key: &StepKey, fence: &hosted::Fence, decided_by: &str) -> Result<()>;
    /// Removes and returns what was noted of step `key`'s check: the dispatch that asked and what
    /// allowed it.
    fn take_check(&mut self, run: &RunId, key: &StepKey) -> Result<Option<(hosted::Fence, String)>>;

    fn approval(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>>;
    /// The run's pending approvals.
    fn open_approvals(&self, run: &RunId) -> Result<Vec<ApprovalRecord>>;
    /// The pending approval of step `key`.
    fn open_approval_of(&self, run: &RunId, key: &StepKey) -> Result<Option<ApprovalRecord>>;
    /// Pending approvals whose expiry is at or before now.
    fn due_approvals(&self) -> Result<Vec<ApprovalRecord>>;
    fn insert_approval(&mut self, approval: &ApprovalRecord) -> Result<()>;
    /// Writes what an answer or a run's end changes of an approval.
    fn save_approval(&mut self, approval: &ApprovalRecord) -> Result<()>;
    /// Marks the approved approval of step `key` consumed by its start.
    fn consume_approval(&mut self, run: &RunId, key: &StepKey) -> Result<()>;

    /// The unexpired cached output of a call of `call_hash`.
    fn cached_result(&self, call_hash: &str) -> Result<Option<String>>;
    /// Caches `step`'s output until `expires_at`.
    fn cache_result(&mut self, step: &StepRecord, output: &str, expires_at: Millis) -> Result<()>;
    /// Notes that the cached result of `step`'s call belongs to its run too.
    fn own_cached_result(&mut self, step: &StepRecord) -> Result<()>;
    /// Writes (or replaces) an entry of tool `tool`'s own cache (`ctx.cache`).
    fn write_tool_cache(&mut self, tool: &str, set: &crate::store::ToolCacheSet) -> Result<()>;

    /// Takes the lock on `resource` for `step`'s attempt `(dispatch_id, attempt)`; `Err` with the
    /// holder's (run, step key) when another step holds it.
    fn take_lock(
        &mut self,
        resource: &str,
        step: &StepRecord,
        attempt: (&DispatchId, u32),
    ) -> Result<std::result::Result<(), (String, String)>>;

    /// The names of the locks held whose names start with `prefix` (a tool limit's slots).
    fn held_locks(&self, prefix: &str) -> Result<Vec<String>>;
    /// Locks the token bucket of rate limit `name` for the rest of this write (creating it as
    /// `fresh` when there is none) and returns it: two replicas' starts take its tokens in turn.
    fn lock_bucket(
        &mut self,
        name: &str,
        fresh: crate::machine::throttle::Bucket,
    ) -> Result<crate::machine::throttle::Bucket>;
    /// Writes the token bucket of rate limit `name`.
    fn save_bucket(&mut self, name: &str, bucket: crate::machine::throttle::Bucket) -> Result<()>;

    /// Appends `event` to `run`'s log, with the step it concerns when it has one (so watchers
    /// learn a result without a read).
    fn append(&mut self, run: &RunId, event: NewEvent, step: Option<StepRecord>) -> Result<()>;
    /// Leaves `effect` to be carried out once the command commits (dropped if it does not).
    fn effect(&mut self, effect: Effect);
}

/// Saves a step as a transition of the machine left it and appends the event that records the
/// transition; returns the step.
pub fn apply_change<R: Records + ?Sized>(records: &mut R, change: StepChange) -> Result<StepRecord> {
    records.save_step(&change.step)?;
    record_change(records, change)
}

/// Appends the event of a transition whose step is already written, and wakes what waits on the
/// step if the transition settled it; returns the step.
pub fn record_change<R: Records + ?Sized>(records: &mut R, change: StepChange) -> Result<StepRecord> {
    let StepChange { step, event } = change;
    records.append(&step.run_id, event, Some(step.clone()))?;
    if step.status.is_terminal() {
        for waiting in hosted::wakes(&step) {
            wake_step(records, &step.run_id, &waiting, step.key.as_str())?;
        }
    }
    Ok(step)
}

/// Wakes the suspended dispatch of step `key` (a handler, or a tool call waiting on its
/// subagents), if it is suspended, in the transaction that settled what it may wait on: a
/// wake-up is never lost between a settle and a suspension.
pub fn wake_step<R: Records + ?Sized>(records: &mut R, run: &RunId, key: &StepKey, because: &str) -> Result<()> {
    if let Some(dispatch) = records.find_step(run, key)?
        && let Some(change) = hosted::resume(&dispatch, because)
    {
        records.save_step(&change.step)?;
        records.append(run, change.event, Some(change.step.clone()))?;
        records.effect(Effect::Dispatch(Box::new(change.step)));
        if dispatch.kind == StepKind::Agent
            && let Some(running) = hosted::woken(&records.run(run)?, records.now())
        {
            records.save_run(&running)?;
        }
    }
    Ok(())
}

/// Step `key` of `run`, which the command knows is there.
pub fn step<R: Records + ?Sized>(records: &R, run: &RunId, key: &StepKey) -> Result<StepRecord> {
    records
        .find_step(run, key)?
        .ok_or_else(|| KernelError::Store(format!("step {key} of run {run} vanished inside its transaction")))
}

/// The step a dispatch holds, only while that exact attempt (on that session, when given) still
/// holds it ([`dispatch::held`]): every message about a dispatch is fenced here.
pub fn held_step<R: Records + ?Sized>(
    records: &R,
    dispatch_id: &DispatchId,
    attempt: u32,
    session_id: Option<&SessionId>,
) -> Result<Option<StepRecord>> {
    Ok(records
        .step_by_dispatch(dispatch_id)?
        .filter(|step| dispatch::held(step, dispatch_id, attempt, session_id)))
}

/// What the parent of branch `run` recorded at `key`; `None` for a case run.
pub fn parent_step<R: Records + ?Sized>(records: &R, run: &RunRecord, key: &StepKey) -> Result<Option<StepRecord>> {
    match &run.fork {
        Some(fork) => records.find_step(&fork.of, key),
        None => Ok(None),
    }
}

/// Whether the run a branch replays still exists (always, for a run that is no branch).
pub fn parent_exists<R: Records + ?Sized>(records: &R, run: &RunRecord) -> Result<bool> {
    match &run.fork {
        Some(fork) => records.run_exists(&fork.of),
        None => Ok(true),
    }
}

/// Writes a step the machine recorded at its place in its handler's order, with its event.
pub fn insert_at_place<R: Records + ?Sized>(records: &mut R, change: StepChange) -> Result<StepRecord> {
    records.insert_step(&change.step)?;
    records.insert_place(&change.step)?;
    records.append(&change.step.run_id.clone(), change.event, Some(change.step.clone()))?;
    Ok(change.step)
}
