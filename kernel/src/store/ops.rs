//! The write operations. Each runs inside the writer's batch transaction (kept apart from its
//! batch-mates, see `writer::Isolation`), changes projections and appends the events that explain
//! the change, so state and log commit together or not at all.

use std::collections::HashMap;

use super::chain;
use super::sql::{self, Connection, Dialect, OptionalExtension, ToArg, params};
use serde_json::Value;

use super::cache::{Cache, Known};
use super::rows::{self, load_run, load_step, load_step_by_dispatch};
use super::{Answer, Answered, LossOutcome};
use crate::error::KernelError;
use crate::machine::StepChange;
use crate::machine::approval::{self, Ask, Decided};
use crate::machine::branch::{self, Verdict};
use crate::machine::cancel;
use crate::machine::dispatch::{self, LeaseLoss, ResultReport, StartDispatch};
use crate::machine::hosted::{self, LocalStep, Place};
use crate::machine::run::{self, Created, EndRun, NewRun};
use crate::machine::turn::{self, CallDisposition, Next, TurnPlan};
use crate::model::{
    ApprovalRecord, ApprovalStatus, EVENT_SCHEMA_VERSION, ErrorKind, EventRecord, EventType, Millis, Outcome, RunId,
    RunRecord, StepKey, StepKind, StepRecord, StepStatus, ToolDef,
};
use crate::resources;

/// An event committed by a batch, with the step it settled when there is one, so watchers need
/// no read to learn a result.
#[derive(Clone, Debug)]
pub struct Published {
    pub event: EventRecord,
    pub step: Option<StepRecord>,
}

/// The state one command sees: the connection, the batch clock, and the events it appended.
pub struct Tx<'c> {
    pub conn: &'c Connection<'c>,
    /// The replica this writer serves: a dispatch it starts is leased to it.
    pub replica: &'c str,
    pub now: Millis,
    pub published: Vec<Published>,
    /// Steps this command left waiting for a worker, by kind and tool (or agent): the other
    /// replicas' schedulers hear of them in the commit's notice.
    pub waiting: Vec<(StepKind, String)>,
    /// The last event number of each run this command read or wrote, and whether the run row
    /// still has to be told: the next event takes the next number without asking the database
    /// (nothing else changes it inside the writer's transaction), and a run's row is written once
    /// per command however many events it appended ([`Tx::finish`]).
    pub seqs: std::cell::RefCell<std::collections::HashMap<RunId, Seq>>,
    /// The writer's memory of the runs and steps it wrote (see [`Cache`]).
    pub cache: &'c std::cell::RefCell<Cache>,
}

/// A run's last event number as a command knows it.
#[derive(Clone, Copy, Debug)]
pub struct Seq {
    last: u64,
    /// Appended to since the run row was last written.
    unsaved: bool,
}

type Result<T> = std::result::Result<T, KernelError>;

/// Events written by one statement, largest first: a command's events go out in statements of
/// these sizes (a call's scheduling and start are two), so there are a handful of statement
/// shapes however many events a turn makes.
const EVENT_ROWS: [usize; 9] = [256, 128, 64, 32, 16, 8, 4, 2, 1];

/// The statement that writes `rows` events: on SQLite with their rows and links (see [`chain`]).
fn insert_events(rows: usize, dialect: Dialect) -> String {
    let (columns, width) = match dialect {
        Dialect::Sqlite => ("id, run_id, seq, type, schema_version, at, payload, prev", 8),
        Dialect::Postgres => ("run_id, seq, type, schema_version, at, payload", 6),
    };
    let values: Vec<String> = (0..rows)
        .map(|row| {
            let places: Vec<String> = (1..=width).map(|place| format!("?{}", row * width + place)).collect();
            format!("({})", places.join(", "))
        })
        .collect();
    format!("INSERT INTO events ({columns}) VALUES {}", values.join(", "))
}

impl Tx<'_> {
    /// Notes that `step` waits for a worker now.
    fn waits(&mut self, step: &StepRecord) {
        self.waiting.push((step.kind, step.tool.clone()));
    }

    fn append(&mut self, run: &RunId, kind: EventType, payload: Value, step: Option<StepRecord>) -> Result<()> {
        // Taking the next number from the run row inside this transaction keeps the sequence
        // gap-free and unique even with many writers queued in one batch.
        let known = self.seqs.borrow().get(run).map(|seq| seq.last);
        let known = known.or_else(|| self.cache.borrow().last_seq(run));
        let (seq, unsaved) = match known {
            Some(last) => (last + 1, true),
            None => {
                let seq = self
                    .conn
                    .prepare_cached(
                        "UPDATE runs SET last_seq = last_seq + 1, updated_at = ?2 WHERE id = ?1 RETURNING last_seq",
                    )?
                    .query_row(params![run.as_str(), self.now], |row| row.get(0))?;
                self.cache.borrow_mut().numbered(run, seq, self.now, None);
                (seq, false)
            }
        };
        self.seqs.borrow_mut().insert(run.clone(), Seq { last: seq, unsaved });
        // Straight into a buffer: `Value`'s `Display` writes through a formatter token by token.
        let payload = serde_json::to_string(&payload).expect("a JSON value serializes");
        // Written when the command ends ([`Tx::finish`]), with the command's other events.
        self.published.push(Published {
            event: EventRecord {
                run_id: run.clone(),
                seq,
                kind,
                schema_version: EVENT_SCHEMA_VERSION,
                at: self.now,
                payload,
            },
            step,
        });
        Ok(())
    }

    /// Saves a step as a transition of the machine left it and appends the event that records
    /// the transition; returns the step.
    fn apply(&mut self, change: StepChange) -> Result<StepRecord> {
        save_step(self, &change.step)?;
        self.record(change)
    }

    /// Appends the event of a transition whose step is already written, and wakes what waits on
    /// the step if the transition settled it; returns the step.
    fn record(&mut self, change: StepChange) -> Result<StepRecord> {
        let StepChange { step, event } = change;
        self.append(&step.run_id, event.kind, event.payload, Some(step.clone()))?;
        if step.status.is_terminal() && matches!(step.kind, StepKind::Tool | StepKind::Subagent) {
            if let Some(waiter) = step.key.waiter() {
                self.wake_step(&step.run_id, &waiter, step.key.as_str())?;
            }
            if step.hosted {
                self.wake(&step.run_id, step.key.as_str())?;
            }
        }
        Ok(step)
    }

    /// Wakes the run's suspended handler, if it has one, in the transaction that settled what it
    /// may wait on: a wake-up is never lost between a settle and a suspension.
    fn wake(&mut self, run: &RunId, because: &str) -> Result<()> {
        self.wake_step(run, &StepKey::agent(), because)
    }

    /// Wakes the suspended dispatch of step `key` (a handler, or a tool call waiting on its
    /// subagents), if it is suspended.
    fn wake_step(&mut self, run: &RunId, key: &StepKey, because: &str) -> Result<()> {
        if let Some(dispatch) = self.find_step(run, key)?
            && let Some(change) = hosted::resume(&dispatch, because)
        {
            save_step(self, &change.step)?;
            self.append(run, change.event.kind, change.event.payload, Some(change.step))?;
            if dispatch.kind == StepKind::Agent
                && let Some(running) = hosted::woken(&self.run(run)?, self.now)
            {
                save_run(self, &running)?;
            }
        }
        Ok(())
    }

    fn run(&self, id: &RunId) -> Result<RunRecord> {
        let cached = self.cache.borrow().run(id);
        let mut run = match cached {
            Some(run) => run,
            None => {
                let run =
                    load_run(self.conn, id)?.ok_or_else(|| KernelError::NotFound(format!("run {id} not found")))?;
                self.cache.borrow_mut().loaded_run(&run);
                run
            }
        };
        match self.seqs.borrow_mut().entry(run.id.clone()) {
            // The row lags what this command appended until the command ends.
            std::collections::hash_map::Entry::Occupied(known) => {
                let known = known.get();
                run.last_seq = known.last;
                if known.unsaved {
                    run.updated_at = self.now;
                }
            }
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(Seq {
                    last: run.last_seq,
                    unsaved: false,
                });
            }
        }
        Ok(run)
    }

    /// Step `key` of `run`, from the writer's memory when it holds the run.
    fn find_step(&self, run: &RunId, key: &StepKey) -> Result<Option<StepRecord>> {
        let known = self.cache.borrow().step(run, key);
        Ok(match known {
            Known::Step(step) => Some(*step),
            Known::Absent => None,
            Known::Unknown => {
                let step = load_step(self.conn, run, key)?;
                if let Some(step) = &step {
                    self.cache.borrow_mut().step_is(step);
                }
                step
            }
        })
    }

    /// Learns a run's last event number from a read, unless this command already knows a later one.
    fn knows_seq(&self, run: &RunId, last: u64) {
        self.seqs
            .borrow_mut()
            .entry(run.clone())
            .or_insert(Seq { last, unsaved: false });
    }

    /// Ends the command: its events are written, several to a statement (on SQLite each linked
    /// to its run's event before it), and each run it appended to gets its last event number
    /// written, once.
    pub fn finish(&self) -> Result<()> {
        let dialect = self.conn.dialect();
        let (links, last_events) = match dialect {
            Dialect::Sqlite => self.link()?,
            Dialect::Postgres => (Vec::new(), HashMap::new()),
        };
        let mut events = &self.published[..];
        let mut links = &links[..];
        while !events.is_empty() {
            let rows = EVENT_ROWS
                .iter()
                .copied()
                .find(|&rows| rows <= events.len())
                .unwrap_or(1);
            let (chunk, rest) = events.split_at(rows);
            let mut args = Vec::with_capacity(rows * 8);
            for (index, published) in chunk.iter().enumerate() {
                let event = &published.event;
                let link = links.get(index);
                if let Some(link) = link {
                    args.push(link.row.to_arg());
                }
                args.extend([
                    event.run_id.as_str().to_arg(),
                    event.seq.to_arg(),
                    event.kind.as_str().to_arg(),
                    event.schema_version.to_arg(),
                    event.at.to_arg(),
                    event.payload.to_arg(),
                ]);
                if let Some(link) = link {
                    args.push(link.prev.to_arg());
                }
            }
            self.conn.write(&insert_events(rows, dialect), &args)?;
            events = rest;
            links = links.get(rows..).unwrap_or_default();
        }
        self.number_runs(&last_events)
    }

    /// Writes each run's last event number (and, on SQLite, its last event's row) to its row.
    fn number_runs(&self, last_events: &HashMap<&RunId, i64>) -> Result<()> {
        for (run, seq) in self.seqs.borrow_mut().iter_mut() {
            let last_event = last_events.get(run).copied();
            // On SQLite a run appended to names its new last event, though its number was
            // already written when the command read it from the row ([`Tx::append`]).
            if !seq.unsaved && last_event.is_none() {
                continue;
            }
            match last_event {
                Some(row) => self.conn.write(
                    "UPDATE runs SET last_seq = ?2, updated_at = ?3, last_event = ?4 WHERE id = ?1",
                    params![run.as_str(), seq.last, self.now, row],
                )?,
                None => self.conn.write(
                    "UPDATE runs SET last_seq = ?2, updated_at = ?3 WHERE id = ?1",
                    params![run.as_str(), seq.last, self.now],
                )?,
            }
            self.cache.borrow_mut().numbered(run, seq.last, self.now, last_event);
            seq.unsaved = false;
        }
        Ok(())
    }

    /// The rows this command's events take, each linked to its run's event before it, and the
    /// last of each run (SQLite, see [`chain`]).
    fn link(&self) -> Result<(Vec<chain::Link>, HashMap<&RunId, i64>)> {
        let mut links = Vec::with_capacity(self.published.len());
        let mut last: HashMap<&RunId, i64> = HashMap::new();
        if self.published.is_empty() {
            return Ok((links, last));
        }
        let known = self.cache.borrow().next_event_row();
        let mut row = match known {
            Some(row) => row,
            None => chain::next_row(self.conn)?,
        };
        for published in &self.published {
            let run = &published.event.run_id;
            let prev = match last.get(run) {
                Some(&row) => Some(row),
                None => self.last_event(run)?,
            };
            links.push(chain::Link { row, prev });
            last.insert(run, row);
            row += 1;
        }
        self.cache.borrow_mut().events_written(row);
        Ok((links, last))
    }

    /// The row of run `run`'s last event before this command, from the writer's memory when it
    /// holds the run.
    fn last_event(&self, run: &RunId) -> Result<Option<i64>> {
        let known = self.cache.borrow().last_event(run);
        match known {
            Some(known) => Ok(known),
            None => Ok(chain::last_event(self.conn, run)?),
        }
    }

    fn step(&self, run: &RunId, key: &StepKey) -> Result<StepRecord> {
        self.find_step(run, key)?
            .ok_or_else(|| KernelError::Store(format!("step {key} of run {run} vanished inside its transaction")))
    }
}

pub fn create_run(tx: &mut Tx<'_>, new: NewRun) -> Result<(RunRecord, bool, Option<StepRecord>)> {
    let existing = match &new.idempotency_key {
        Some(key) => tx
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM runs WHERE idempotency_key = ?1",
                rows::RUN_COLUMNS
            ))?
            .query_row(params![key], rows::run_from_row)
            .optional()?,
        None => None,
    };
    match run::create(existing, &new, RunId::new(), tx.now)? {
        Created::Existing(run) => Ok((*run, false, None)),
        Created::New { run, event, dispatch } => {
            insert_run(tx, &run)?;
            tx.knows_seq(&run.id, run.last_seq);
            tx.append(&run.id, event.kind, event.payload, None)?;
            if let Some(dispatch) = &dispatch {
                insert_step(tx, dispatch)?;
                tx.waits(dispatch);
            }
            Ok((tx.run(&run.id)?, true, dispatch.map(|d| *d)))
        }
    }
}

fn insert_run(tx: &Tx<'_>, run: &RunRecord) -> Result<()> {
    tx.cache.borrow_mut().inserted_run(run);
    tx.conn.write(
        "INSERT INTO runs (id, agent, status, input, labels, idempotency_key, max_tool_calls, created_at, updated_at, \
         interactive, permissions, capture, granted_by, hosted, parent_run_id, parent_step, session_key, \
         max_concurrency, fork, allow, trace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
         ?16, ?17, ?18, ?19, ?20, ?21)",
        params![
            run.id.as_str(),
            run.agent,
            run.status.as_str(),
            run.input,
            serde_json::to_string(&run.labels).expect("labels serialize"),
            run.idempotency_key,
            run.max_tool_calls,
            run.created_at,
            run.updated_at,
            run.interactive,
            serde_json::to_string(&run.permissions).expect("permissions serialize"),
            run.capture.as_str(),
            run.granted_by,
            run.hosted,
            run.parent.as_ref().map(|(id, _)| id.as_str()),
            run.parent.as_ref().map(|(_, key)| key.as_str()),
            run.session_key,
            run.max_concurrency,
            run.fork
                .as_ref()
                .map(|fork| serde_json::to_string(fork).expect("a fork serializes")),
            (!run.allow.is_empty()).then(|| serde_json::to_string(&run.allow).expect("strings serialize")),
            run.trace.map(|trace| trace.to_string()),
        ],
    )?;
    Ok(())
}

/// The columns a step's save writes besides its indexed ones, `?5` on.
const STEP_SAVED: &str = "attempts = ?5, output = ?6, error = ?7, error_kind = ?8, worker = ?9, session_id = ?10, \
     lease_expires_at = ?11, started_at = ?12, finished_at = ?13, progress_count = ?14, not_before = ?15, \
     lease_losses = ?16, cost = ?17, outcome = ?18, approval = ?19, replays = ?20, replica = ?21";

/// The statement that saves a step, writing its indexed columns `status` (`?3`) and `dispatch_id`
/// (`?4`) only as asked. SQLite rewrites an index's entry for each indexed column an `UPDATE` sets,
/// changed or not, so a column left as it was is left out, and its index page with it (a settled
/// call's dispatch entry, a run's status entry on each turn). The values left out are still bound,
/// unused: SQLite allows that; PostgreSQL cannot type an unused parameter, so there every save
/// writes both (it gains nothing from leaving them out).
fn save_step_sql(status: bool, dispatch: bool) -> &'static str {
    static SHAPES: std::sync::OnceLock<[String; 4]> = std::sync::OnceLock::new();
    let shapes = SHAPES.get_or_init(|| {
        std::array::from_fn(|shape| {
            format!(
                "UPDATE steps SET {}{}{STEP_SAVED} WHERE run_id = ?1 AND step_key = ?2",
                if shape & 2 == 0 { "status = ?3, " } else { "" },
                if shape & 1 == 0 { "dispatch_id = ?4, " } else { "" },
            )
        })
    });
    &shapes[2 * usize::from(!status) + usize::from(!dispatch)]
}

/// Writes what a transition may change of a step; what a call was (tool, arguments, identity,
/// policy) is written once, when it is recorded.
fn save_step(tx: &Tx<'_>, step: &StepRecord) -> Result<()> {
    let (same_status, same_dispatch) = match tx.conn.dialect() {
        Dialect::Sqlite => tx.cache.borrow().step_indexed_as(step).unwrap_or((false, false)),
        Dialect::Postgres => (false, false),
    };
    tx.cache.borrow_mut().saved_step(step);
    let conn = tx.conn;
    conn.write(
        save_step_sql(!same_status, !same_dispatch),
        params![
            step.run_id.as_str(),
            step.key.as_str(),
            step.status.as_str(),
            step.dispatch_id,
            step.attempts,
            step.output,
            step.error,
            step.error_kind.map(ErrorKind::as_str),
            step.worker,
            step.session_id,
            step.lease_expires_at,
            step.started_at,
            step.finished_at,
            step.progress_count,
            step.not_before,
            step.lease_losses,
            step.cost,
            step.outcome.map(Outcome::as_str),
            step.approval
                .as_ref()
                .map(|a| serde_json::to_string(a).expect("a decision serializes")),
            step.replays,
            step.replica,
        ],
    )?;
    // Every way out of running passes here, so no exit path can keep a lock.
    if step.status != StepStatus::Running && resources::locks(&step.resources).next().is_some() {
        conn.write(
            "DELETE FROM resource_locks WHERE run_id = ?1 AND step_key = ?2",
            params![step.run_id.as_str(), step.key.as_str()],
        )?;
    }
    Ok(())
}

/// What recording a turn did: each call's disposition, and, when the turn ended its run (a
/// branch refusing an effect, or one whose parent is gone), the steps that end settled on the way,
/// to cancel on their workers.
#[derive(Clone, Debug, Default)]
pub struct RecordedTurn {
    pub calls: Vec<CallDisposition>,
    pub ended: Vec<StepRecord>,
    /// Why the run ended with the turn, when not for `unresumable` (a divergence, a branch's
    /// refusal): what the steps of `ended` are cancelled with.
    pub ended_because: Option<&'static str>,
    /// The run could not take the turn: why (its branch's parent is gone; the run ended with it).
    pub unresumable: Option<String>,
}

pub fn schedule_turn(tx: &mut Tx<'_>, plan: TurnPlan) -> Result<RecordedTurn> {
    let mut run = tx.run(&plan.run_id)?;
    let recorded = plan
        .calls
        .iter()
        .map(|call| tx.find_step(&run.id, &call.key))
        .collect::<Result<Vec<_>>>()?;
    if run.hosted || plan.fence.is_some() {
        let dispatch = tx.find_step(&run.id, &StepKey::agent())?;
        hosted::check_fence(&run, dispatch.as_ref(), plan.fence.as_ref())?;
        let keys: Vec<StepKey> = plan.calls.iter().map(|c| c.key.clone()).collect();
        let at_place = steps_at_place(tx.conn, &run.id, plan.turn)?;
        let elsewhere: Vec<StepRecord> = recorded.iter().flatten().cloned().collect();
        if let Err(message) = hosted::place(plan.turn, &keys, &at_place, &elsewhere) {
            let step = at_place
                .first()
                .or(elsewhere.first())
                .cloned()
                .expect("a divergence names a recorded step");
            let ended = end_diverged(tx, &run, &message)?;
            return Ok(RecordedTurn {
                calls: plan
                    .calls
                    .iter()
                    .map(|_| CallDisposition::Diverged {
                        step: step.clone(),
                        message: message.clone(),
                    })
                    .collect(),
                ended,
                ended_because: Some("replay_input_changed"),
                ..RecordedTurn::default()
            });
        }
    }
    let verdicts = if branch::guarded(&run) && turn::adds_calls(&recorded) && !run.status.is_terminal() {
        if let Some(reason) = branch::unresumable(&run, parent_exists(tx, &run)?) {
            let (_, ended) = end_tree(tx, &run, &EndRun::Fail { reason: reason.clone() })?;
            return Ok(RecordedTurn {
                calls: Vec::new(),
                ended,
                unresumable: Some(reason),
                ended_because: None,
            });
        }
        judge_calls(tx, &run, &plan, &recorded)?
    } else {
        Vec::new()
    };
    let mut blocked = None;
    let cached_unsettled = tx.cache.borrow().unsettled(&run.id);
    let unsettled = if !turn::adds_calls(&recorded) {
        None
    } else if let Some(count) = cached_unsettled {
        Some(count.saturating_sub(usize::from(run.hosted)))
    } else {
        Some(
            tx.conn
                .prepare_cached(open_steps::COUNT_CALLS)?
                .query_row(params![run.id.as_str()], |row| row.get::<usize>(0))?
                // A hosted run's own dispatch runs while its handler calls; it is not a call.
                .saturating_sub(usize::from(run.hosted)),
        )
    };
    if let Some((started, event)) = turn::admit(&run, &plan, &recorded, unsettled, tx.now)? {
        save_run(tx, &started)?;
        tx.append(&run.id, event.kind, event.payload, None)?;
        run = started;
    }
    let counted_before = run.tool_calls;
    let mut dispositions = Vec::with_capacity(plan.calls.len());
    let mut gated = false;
    let turn_blocked = verdicts.iter().find_map(|v| match v {
        Some(Verdict::Blocked(refused)) => Some(refused.clone()),
        _ => None,
    });
    for (index, (call, recorded)) in plan.calls.iter().zip(recorded).enumerate() {
        if let Some(step) = recorded {
            let disposition = turn::resubmitted(step, call);
            if let CallDisposition::Replayed(step) = &disposition {
                save_step(tx, step)?;
            }
            dispositions.push(disposition);
            continue;
        }
        let refused;
        let call = match (verdicts.get(index).cloned().flatten(), &turn_blocked) {
            (Some(Verdict::Replay(parent)), _) => {
                run.tool_calls += 1;
                let change = branch::replay(&run, &parent, (plan.turn, call.position), tx.now);
                insert_step(tx, &change.step)?;
                if run.hosted {
                    insert_place(tx.conn, &change.step)?;
                }
                tx.append(
                    &run.id,
                    change.event.kind,
                    change.event.payload,
                    Some(change.step.clone()),
                )?;
                dispositions.push(CallDisposition::Replayed(change.step));
                continue;
            }
            (Some(Verdict::Blocked(refusal)), _) => {
                refused = branch_refusal(call, refusal.message(&run), Outcome::WriteToolBlocked);
                blocked = Some(refusal);
                &refused
            }
            // Another call of the turn ended the run: this one never runs.
            (_, Some(first)) => {
                let message = format!(
                    "not run: the run ended at this turn's call to '{}' (write_tool_blocked)",
                    first.subject
                );
                refused = branch_refusal(call, message, Outcome::Cancelled);
                &refused
            }
            _ => call,
        };
        let decision = turn::decide(&run, call, &plan.available_tools);
        let cached = if decision.may_use_cache() {
            tx.conn
                .prepare_cached("SELECT output FROM result_cache WHERE call_hash = ?1 AND expires_at > ?2")?
                .query_row(params![call.call_hash, tx.now], |row| row.get(0))
                .optional()?
        } else {
            None
        };
        let looked_up = cached.is_some();
        let recorded = turn::record(
            &mut run,
            (plan.turn, plan.default_timeout_ms, plan.max_concurrency),
            call,
            decision,
            cached,
            tx.now,
        );
        let step = recorded.step;
        if looked_up && step.status == StepStatus::Succeeded {
            // Served from the cache: the entry is this run's too, and outlives any other's deletion.
            own_cached_result(tx, &step)?;
        }
        // A call that starts in the turn that records it is written once, already started.
        let started = match (&recorded.next, &call.start) {
            (Next::Scheduled, Some(start)) => dispatch::start(&step, start, tx.now).map(|mut change| {
                change.step.replica = Some(tx.replica.to_owned());
                (change, start)
            }),
            _ => None,
        };
        insert_step(tx, started.as_ref().map_or(&step, |(change, _)| &change.step))?;
        if run.hosted {
            insert_place(tx.conn, &step)?;
        }
        match recorded.next {
            Next::Settled => {
                tx.append(&run.id, recorded.event.kind, recorded.event.payload, Some(step.clone()))?;
                dispositions.push(CallDisposition::Settled(step));
            }
            Next::Gated => {
                tx.append(&run.id, recorded.event.kind, recorded.event.payload, None)?;
                gated = true;
                dispositions.push(CallDisposition::Gated(step));
            }
            Next::Scheduled => {
                tx.append(&run.id, recorded.event.kind, recorded.event.payload, None)?;
                // Pending since a moment ago in this same commit, so it starts; were it not to,
                // the scheduler gives the reserved slot back and queues the call as usual.
                dispositions.push(match started {
                    Some((change, start)) => {
                        take_locks(tx, &step, start)?;
                        CallDisposition::Started(tx.record(change)?)
                    }
                    None => {
                        tx.waits(&step);
                        CallDisposition::Scheduled(step)
                    }
                });
            }
        }
    }
    if run.tool_calls != counted_before {
        save_run(tx, &run)?;
    }
    if let Some(refused) = blocked {
        let reason = refused.run_reason(run.capture);
        let (_, ended) = end_tree(tx, &run, &EndRun::Fail { reason })?;
        return Ok(RecordedTurn {
            calls: dispositions,
            ended,
            unresumable: None,
            ended_because: Some("write_tool_blocked"),
        });
    }
    if gated {
        ask_next_approval(tx, &run.id)?;
    }
    Ok(RecordedTurn {
        calls: dispositions,
        ..RecordedTurn::default()
    })
}

/// Whether the run a branch replays still exists.
fn parent_exists(tx: &Tx<'_>, run: &RunRecord) -> Result<bool> {
    let Some(fork) = &run.fork else {
        return Ok(true);
    };
    Ok(tx
        .conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM runs WHERE id = ?1)")?
        .query_row(params![fork.of.as_str()], |row| row.get(0))?)
}

/// What the parent of branch `run` recorded at `key`; `None` for a case run.
fn parent_step(tx: &Tx<'_>, run: &RunRecord, key: &StepKey) -> Result<Option<StepRecord>> {
    match &run.fork {
        Some(fork) => tx.find_step(&fork.of, key),
        None => Ok(None),
    }
}

/// The branch rule's word on each call of a turn of guarded `run` that its own record does not
/// hold (`None` for the others, and for calls to unknown tools, which run nothing anyway).
fn judge_calls(
    tx: &Tx<'_>,
    run: &RunRecord,
    plan: &TurnPlan,
    recorded: &[Option<StepRecord>],
) -> Result<Vec<Option<Verdict>>> {
    plan.calls
        .iter()
        .zip(recorded)
        .map(|(call, own)| {
            let (None, Some(tool)) = (own, &call.tool) else {
                return Ok(None);
            };
            let subject = branch::Subject::Tool {
                name: &tool.name,
                read_only: tool.options.read_only,
                writes: tool.options.writes,
            };
            let parent = parent_step(tx, run, &call.key)?;
            Ok(Some(branch::judge(
                run,
                subject,
                parent.as_ref(),
                (&call.call_hash, &call.arguments),
            )))
        })
        .collect()
}

/// `call` settled at once with `message`, without running.
fn branch_refusal(call: &turn::PlannedCall, message: String, outcome: Outcome) -> turn::PlannedCall {
    let mut refused = call.clone();
    refused.start = None;
    refused.gate = turn::CallGate::Refuse {
        message,
        reason: "write_tool_blocked",
        outcome,
    };
    refused
}

/// Writes a call as the machine recorded it (started already, when it starts in the turn that
/// records it).
fn insert_step(tx: &Tx<'_>, step: &StepRecord) -> Result<()> {
    tx.cache.borrow_mut().saved_step(step);
    tx.conn.write(
        "INSERT INTO steps (run_id, step_key, turn, position, call_id, tool, fingerprint, version, arguments, \
         call_hash, idempotency_key, idempotency, timeout_ms, status, error, error_kind, created_at, finished_at, \
         retry, blocking, unit_cost, decided_by, approval_gate, cache_ttl_ms, output, outcome, attempts, kind, effect, \
         started_at, max_concurrency, hosted, resources, worker, session_id, dispatch_id, lease_expires_at, \
         not_before, replica, from_run, trace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
         ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35, ?36, ?37, ?38, \
         ?39, ?40, ?41)",
        params![
            step.run_id.as_str(),
            step.key.as_str(),
            step.turn,
            step.position,
            step.call_id,
            step.tool,
            step.fingerprint,
            step.version,
            step.arguments,
            step.call_hash,
            step.idempotency_key,
            step.idempotency.as_str(),
            step.timeout_ms,
            step.status.as_str(),
            step.error,
            step.error_kind.map(ErrorKind::as_str),
            step.created_at,
            step.finished_at,
            step.retry
                .as_ref()
                .map(|r| serde_json::to_string(r).expect("policy serializes")),
            step.blocking,
            step.unit_cost,
            step.decided_by,
            step.approval_gate
                .as_ref()
                .map(|g| serde_json::to_string(g).expect("gate serializes")),
            step.cache_ttl_ms,
            step.output,
            step.outcome.map(Outcome::as_str),
            step.attempts,
            step.kind.as_str(),
            step.effect.map(crate::model::Effect::as_str),
            step.started_at,
            step.max_concurrency,
            step.hosted,
            (!step.resources.is_empty()).then(|| serde_json::to_string(&step.resources).expect("strings serialize")),
            step.worker,
            step.session_id,
            step.dispatch_id,
            step.lease_expires_at,
            step.not_before,
            step.replica,
            step.from_run.as_ref().map(RunId::as_str),
            step.trace.map(|trace| trace.to_string()),
        ],
    )?;
    Ok(())
}

/// Puts the next gated call of the run to a person, one at a time in (turn, position) order;
/// with none left, a blocked run runs again.
fn ask_next_approval(tx: &mut Tx<'_>, run_id: &RunId) -> Result<()> {
    let open: i64 = tx
        .conn
        .prepare_cached("SELECT COUNT(*) FROM approvals WHERE run_id = ?1 AND status = 'pending'")?
        .query_row(params![run_id.as_str()], |row| row.get(0))?;
    let next = if open > 0 {
        None
    } else {
        tx.conn
            .prepare_cached(&open_steps::next_awaiting_approval(rows::STEP_COLUMNS))?
            .query_row(params![run_id.as_str()], rows::step_from_row)
            .optional()?
    };
    let run = tx.run(run_id)?;
    let id = uuid::Uuid::now_v7().to_string();
    match approval::ask_next(&run, open as usize, next.as_ref(), id, tx.now) {
        Ask::Nothing => {}
        Ask::Resume { run, event } => {
            save_run(tx, &run)?;
            tx.append(run_id, event.kind, event.payload, None)?;
        }
        Ask::Ask(question) => {
            let approval::Question {
                approval,
                step,
                run,
                event,
            } = *question;
            insert_approval(tx.conn, &approval)?;
            if let Some(run) = run {
                save_run(tx, &run)?;
            }
            tx.append(run_id, event.kind, event.payload, Some(step))?;
        }
    }
    Ok(())
}

fn insert_approval(conn: &Connection<'_>, approval: &ApprovalRecord) -> Result<()> {
    conn.write(
        "INSERT INTO approvals (id, run_id, step_key, tool, call_hash, arguments, status, approvers, message, \
         decided_by, requested_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            approval.id,
            approval.run_id.as_str(),
            approval.key.as_str(),
            approval.tool,
            approval.call_hash,
            approval.arguments,
            approval.status.as_str(),
            serde_json::to_string(&approval.approvers).expect("approvers serialize"),
            approval.message,
            approval.decided_by,
            approval.requested_at,
            approval.expires_at,
        ],
    )?;
    Ok(())
}

/// Writes what an answer or a run's end changes of an approval.
fn save_approval(conn: &Connection<'_>, approval: &ApprovalRecord) -> Result<()> {
    conn.write(
        "UPDATE approvals SET status = ?2, answered_at = ?3, decider = ?4, reason = ?5 WHERE id = ?1",
        params![
            approval.id,
            approval.status.as_str(),
            approval.answered_at,
            approval.decider,
            approval.reason
        ],
    )?;
    Ok(())
}

/// Writes what a transition may change of a run; its sequence number is the log's own.
fn save_run(tx: &Tx<'_>, run: &RunRecord) -> Result<()> {
    // As a step's save (`save_step_sql`): an unchanged status is not written, nor its index entry.
    let same_status = match tx.conn.dialect() {
        Dialect::Sqlite => tx.cache.borrow().run_status_is(&run.id, run.status).unwrap_or(false),
        Dialect::Postgres => false,
    };
    tx.cache.borrow_mut().saved_run(run);
    tx.conn.write(
        if same_status {
            "UPDATE runs SET output = ?3, reason = ?4, tool_calls = ?5, updated_at = ?6, dispatches = ?7, \
             suspensions = ?8 WHERE id = ?1"
        } else {
            "UPDATE runs SET status = ?2, output = ?3, reason = ?4, tool_calls = ?5, updated_at = ?6, \
             dispatches = ?7, suspensions = ?8 WHERE id = ?1"
        },
        params![
            run.id.as_str(),
            run.status.as_str(),
            run.output,
            run.reason,
            run.tool_calls,
            run.updated_at,
            run.dispatches,
            run.suspensions,
        ],
    )?;
    Ok(())
}

/// Records an answer to `approval` as the machine decides ([`approval::answer`]).
fn settle_approval(
    tx: &mut Tx<'_>,
    approval: &ApprovalRecord,
    answer: (ApprovalStatus, &str, Option<&str>),
    answered: &mut Answered,
) -> Result<()> {
    let step = tx.step(&approval.run_id, &approval.key)?;
    let change = approval::answer(approval, &step, answer, tx.now)?;
    save_approval(tx.conn, &change.approval)?;
    tx.append(&approval.run_id, change.event.kind, change.event.payload, None)?;
    match change.step {
        Decided::Approved(step) => {
            save_step(tx, &step)?;
            tx.waits(&step);
            answered.to_dispatch.push(step);
        }
        Decided::Refused(settled) => {
            tx.apply(settled)?;
        }
    }
    answered.approvals.push(change.approval);
    Ok(())
}

pub fn note_replays(tx: &mut Tx<'_>, run: &RunId, keys: &[StepKey]) -> Result<()> {
    let (listed, keys) = rows::key_list(tx.conn, keys);
    tx.conn.write(
        &format!("UPDATE steps SET replays = replays + 1 WHERE run_id = ?1 AND step_key IN ({listed})"),
        params![run.as_str(), keys],
    )?;
    tx.cache.borrow_mut().forget(run);
    Ok(())
}

pub fn answer_approval(
    tx: &mut Tx<'_>,
    id: &str,
    answer: Answer,
    decider: &str,
    reason: Option<&str>,
) -> Result<Answered> {
    let approval =
        rows::load_approval(tx.conn, id)?.ok_or_else(|| KernelError::NotFound(format!("approval {id} not found")))?;
    let status = match answer {
        Answer::Approve => ApprovalStatus::Approved,
        Answer::Reject => ApprovalStatus::Rejected,
    };
    let mut answered = Answered::default();
    settle_approval(tx, &approval, (status, decider, reason), &mut answered)?;
    // A branch waiting on a person resumes only while the record it replays is there.
    let run = tx.run(&approval.run_id)?;
    if let Some(reason) = branch::unresumable(&run, parent_exists(tx, &run)?) {
        let (_, ended) = end_tree(tx, &run, &EndRun::Fail { reason })?;
        answered.to_dispatch.retain(|step| step.run_id != run.id);
        answered.ended.extend(ended);
        return Ok(answered);
    }
    ask_next_approval(tx, &approval.run_id)?;
    Ok(answered)
}

pub fn expire_approvals(tx: &mut Tx<'_>) -> Result<Answered> {
    let due: Vec<ApprovalRecord> = tx
        .conn
        .prepare_cached(&format!(
            "SELECT {} FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?1",
            rows::APPROVAL_COLUMNS
        ))?
        .query_map(params![tx.now], rows::approval_from_row)?
        .collect::<sql::Result<_>>()?;
    let mut answered = Answered::default();
    for approval in due {
        settle_approval(
            tx,
            &approval,
            (ApprovalStatus::Expired, "kernel", Some("approval timeout")),
            &mut answered,
        )?;
        ask_next_approval(tx, &approval.run_id)?;
    }
    Ok(answered)
}

/// Records the start of a dispatch, as the machine decides ([`dispatch::start`]); `None` when
/// the step may not start (settled meanwhile, or a stale attempt).
pub fn start_dispatch(tx: &mut Tx<'_>, start: StartDispatch) -> Result<Option<StepRecord>> {
    let Some(step) = tx.find_step(&start.run_id, &start.key)? else {
        return Ok(None);
    };
    start_loaded(tx, &step, &start)
}

/// Starts `step`, already loaded in this transaction.
fn start_loaded(tx: &mut Tx<'_>, step: &StepRecord, start: &StartDispatch) -> Result<Option<StepRecord>> {
    let Some(mut change) = dispatch::start(step, start, tx.now) else {
        return Ok(None);
    };
    change.step.replica = Some(tx.replica.to_owned());
    if step.kind == StepKind::Agent {
        let run = tx.run(&step.run_id)?;
        // A branch resumes only while the record it replays is there.
        if let Some(reason) = branch::unresumable(&run, parent_exists(tx, &run)?) {
            end_tree(tx, &run, &EndRun::Fail { reason })?;
            return Ok(None);
        }
        let (run, event) = hosted::dispatched(&run, tx.now);
        save_run(tx, &run)?;
        if let Some(event) = event {
            tx.append(&run.id, event.kind, event.payload, None)?;
        }
    }
    take_locks(tx, step, start)?;
    if dispatch::consumes_approval(step) {
        tx.conn.write(
            "UPDATE approvals SET status = 'consumed' WHERE run_id = ?1 AND step_key = ?2 AND status = 'approved'",
            params![start.run_id.as_str(), start.key.as_str()],
        )?;
    }
    Ok(Some(tx.apply(change)?))
}

/// Takes the locks on the resource instances `step` touches, for the attempt `start` begins. The
/// scheduler starts no call whose instance another holds; a lock held anyway (a second kernel on
/// the file) refuses the start, and the call waits for its next try.
fn take_locks(tx: &Tx<'_>, step: &StepRecord, start: &StartDispatch) -> Result<()> {
    for resource in resources::locks(&step.resources) {
        let taken = tx
            .conn
            .prepare_cached(
                "INSERT INTO resource_locks (resource, run_id, step_key, dispatch_id, attempt, acquired_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (resource) DO UPDATE SET dispatch_id = excluded.dispatch_id, \
                 attempt = excluded.attempt, acquired_at = excluded.acquired_at \
                 WHERE resource_locks.run_id = excluded.run_id AND resource_locks.step_key = excluded.step_key",
            )?
            .execute(params![
                resource,
                step.run_id.as_str(),
                step.key.as_str(),
                start.dispatch_id,
                start.attempt,
                tx.now
            ])?;
        if taken == 0 {
            let (run, key): (String, String) = tx
                .conn
                .prepare_cached("SELECT run_id, step_key FROM resource_locks WHERE resource = ?1")?
                .query_row(params![resource], |row| Ok((row.get(0)?, row.get(1)?)))?;
            return Err(KernelError::FailedPrecondition(format!(
                "resource '{resource}' is held by step {key} of run {run}; the call starts once it is released"
            )));
        }
    }
    Ok(())
}

/// Loads the step a dispatch holds, only while that exact attempt still holds it.
fn held_step(tx: &Tx<'_>, dispatch_id: &str, attempt: u32, session_id: Option<&str>) -> Result<Option<StepRecord>> {
    let cached = tx.cache.borrow().by_dispatch(dispatch_id);
    let found = match cached {
        Some(found) => Some(found),
        None => load_step_by_dispatch(tx.conn, dispatch_id)?,
    };
    let Some((step, last_seq)) = found else {
        return Ok(None);
    };
    tx.cache.borrow_mut().step_is(&step);
    tx.knows_seq(&step.run_id, last_seq);
    Ok(Some(step).filter(|step| dispatch::held(step, dispatch_id, attempt, session_id)))
}

/// Records a worker's result. A retryable error with attempts left puts the step back to pending
/// (the returned step says so); anything else settles it.
pub fn record_result(tx: &mut Tx<'_>, report: ResultReport) -> Result<Option<(StepRecord, Vec<StepRecord>)>> {
    let Some(step) = held_step(tx, &report.dispatch_id, report.attempt, Some(&report.session_id))? else {
        return Ok(None);
    };
    if step.kind == StepKind::Agent {
        return finish_hosted(tx, &step, &report).map(Some);
    }
    let (change, cached_until) = dispatch::record_result(&step, &report, tx.now);
    if let (Some(expires_at), Ok(output)) = (cached_until, &report.outcome) {
        tx.conn.write(
            "INSERT INTO result_cache (call_hash, tool, output, stored_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (call_hash) DO UPDATE SET output = ?3, stored_at = ?4, expires_at = ?5",
            params![step.call_hash, step.tool, output, tx.now, expires_at],
        )?;
        own_cached_result(tx, &step)?;
    }
    Ok(Some((tx.apply(change)?, Vec::new())))
}

/// Records that the cached result of `step`'s call belongs to its run as well.
fn own_cached_result(tx: &mut Tx<'_>, step: &StepRecord) -> Result<()> {
    tx.conn.write(
        "INSERT INTO result_cache_runs (call_hash, run_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        params![step.call_hash, step.run_id.as_str()],
    )?;
    Ok(())
}

/// What a run has in flight and the questions it has open, for ending it.
fn in_flight_and_open(tx: &Tx<'_>, run: &RunId) -> Result<(Vec<StepRecord>, Vec<ApprovalRecord>)> {
    let in_flight: Vec<StepRecord> = tx
        .conn
        .prepare_cached(&open_steps::all(rows::STEP_COLUMNS))?
        .query_map(params![run.as_str()], rows::step_from_row)?
        .collect::<sql::Result<_>>()?;
    let open: Vec<ApprovalRecord> = tx
        .conn
        .prepare_cached(&format!(
            "SELECT {} FROM approvals WHERE run_id = ?1 AND status = 'pending'",
            rows::APPROVAL_COLUMNS
        ))?
        .query_map(params![run.as_str()], rows::approval_from_row)?
        .collect::<sql::Result<_>>()?;
    Ok((in_flight, open))
}

/// Applies what ending a run changes: questions withdrawn, calls settled, the run and its event.
fn apply_end(tx: &mut Tx<'_>, ended: run::RunEnd) -> Result<(RunRecord, Vec<StepRecord>)> {
    for approval in &ended.withdrawn {
        save_approval(tx.conn, approval)?;
    }
    let mut settled = Vec::with_capacity(ended.settled.len());
    for change in ended.settled {
        settled.push(tx.apply(change)?);
    }
    save_run(tx, &ended.run)?;
    tx.append(&ended.run.id, ended.event.kind, ended.event.payload, None)?;
    let run = tx.run(&ended.run.id)?;
    if let Some((parent, key)) = &run.parent
        && let Some(step) = tx.find_step(parent, key)?
        && let Some(change) = hosted::child_ended(&step, &run, tx.now)
    {
        tx.apply(change)?;
    }
    if let Some(session) = &run.session_key {
        release_session(tx, session)?;
    }
    Ok((run, settled))
}

/// Lets the next run of a session go: the oldest one still waiting for the runs before it.
fn release_session(tx: &mut Tx<'_>, session: &str) -> Result<()> {
    let next: Option<String> = tx
        .conn
        .prepare_cached(
            "SELECT id FROM runs WHERE session_key = ?1 AND status NOT IN ('completed', 'failed', 'cancelled') \
             ORDER BY id LIMIT 1",
        )?
        .query_row(params![session], |row| row.get(0))
        .optional()?;
    if let Some(next) = next {
        let next = RunId::parse(&next, "session run")?;
        tx.wake(&next, "the session's run before it ended")?;
    }
    Ok(())
}

/// Whether a run of `session` created before now has not finished: a new one waits for it.
fn session_busy(conn: &Connection<'_>, session: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE session_key = ?1 \
             AND status NOT IN ('completed', 'failed', 'cancelled'))",
        )?
        .query_row(params![session], |row| row.get(0))?)
}

/// A hosted handler's outcome: its dispatch settles and its run ends, cancelling what the
/// handler left in flight (returned, to cancel on their workers).
fn finish_hosted(
    tx: &mut Tx<'_>,
    dispatch: &StepRecord,
    report: &ResultReport,
) -> Result<(StepRecord, Vec<StepRecord>)> {
    let run = tx.run(&dispatch.run_id)?;
    let mut cancelled = cancel_children(tx, &run)?;
    let (in_flight, open) = in_flight_and_open(tx, &run.id)?;
    let outcome = report
        .outcome
        .as_ref()
        .map(String::as_str)
        .map_err(|(kind, message)| (*kind, message.as_str()));
    let (settled, ended) = hosted::finish(&run, dispatch, outcome, &in_flight, &open, tx.now)?;
    let step = tx.apply(settled)?;
    let (_, more) = apply_end(tx, ended)?;
    cancelled.extend(more);
    Ok((step, cancelled))
}

/// A handler gave back its slot to wait on `waiting_on`: its dispatch is suspended, unless the
/// machine refuses the suspension (`Err`), which writes nothing. `None` when the dispatch no longer
/// held the run.
pub fn suspend_dispatch(tx: &mut Tx<'_>, report: SuspendReport) -> Result<Option<StepRecord>> {
    let Some(dispatch) = held_step(tx, &report.dispatch_id, report.attempt, Some(&report.session_id))? else {
        return Ok(None);
    };
    let run = tx.run(&dispatch.run_id)?;
    let waiting = report
        .waiting_on
        .into_iter()
        .map(|key| {
            let key = StepKey::from_stored(key);
            let found = tx.find_step(&run.id, &key)?;
            Ok((key, found))
        })
        .collect::<Result<Vec<_>>>()?;
    let (change, run) = hosted::suspend(&run, &dispatch, &waiting, tx.now)?;
    save_run(tx, &run)?;
    Ok(Some(tx.apply(change)?))
}

/// A handler's suspension, as its worker reported it.
#[derive(Clone, Debug)]
pub struct SuspendReport {
    pub dispatch_id: String,
    pub attempt: u32,
    pub session_id: String,
    pub waiting_on: Vec<String>,
}

/// Starts a subagent of a hosted handler at place `seq`, or returns the one recorded there: the
/// child run (hosted, linked to its parent and the step waiting for it) and that step, created
/// together. A child of a session whose earlier run has not finished waits for it.
pub fn start_subagent(tx: &mut Tx<'_>, start: SubagentStart) -> Result<SubagentStarted> {
    let parent = tx.run(&start.parent)?;
    // From a tool call's body: fenced by the call's own dispatch, keyed under the call.
    if let Some(call) = held_step(tx, &start.fence.dispatch_id, start.fence.attempt, None)?
        .filter(|step| step.kind == StepKind::Tool && step.run_id == parent.id)
    {
        let key = StepKey::tool_subagent(&call.key, &start.child.agent, start.occurrence);
        if let Some(recorded) = tx.find_step(&parent.id, &key)? {
            return Ok((StepRecorded::Replayed(recorded), None));
        }
        return start_child(tx, &parent, (call.turn, key), start.child);
    }
    let dispatch = tx.find_step(&parent.id, &StepKey::agent())?;
    hosted::check_fence(&parent, dispatch.as_ref(), Some(&start.fence))?;
    let key = StepKey::subagent(&start.child.agent, start.occurrence);
    let at_place = steps_at_place(tx.conn, &parent.id, start.seq)?;
    let elsewhere: Vec<StepRecord> = tx.find_step(&parent.id, &key)?.into_iter().collect();
    match hosted::place(start.seq, std::slice::from_ref(&key), &at_place, &elsewhere) {
        Err(message) => {
            let ended = end_diverged(tx, &parent, &message)?;
            Ok((StepRecorded::Diverged { message, ended }, None))
        }
        Ok(Place::Recorded(mut steps)) => Ok((StepRecorded::Replayed(steps.remove(0)), None)),
        Ok(Place::Open) => {
            let started = start_child(tx, &parent, (start.seq, key), start.child)?;
            if let (StepRecorded::Recorded(step) | StepRecorded::Blocked { step, .. }, _) = &started {
                insert_place(tx.conn, step)?;
            }
            Ok(started)
        }
    }
}

/// Starts a subagent the record of `parent` does not hold; in a branch or case run, as the branch
/// rule says: the parent's recorded child replayed, a child that is a branch of the parent's
/// child, a case run's child (with its tokens), or a refusal, which ends the run.
fn start_child(
    tx: &mut Tx<'_>,
    parent: &RunRecord,
    (seq, key): (u32, StepKey),
    mut child: NewRun,
) -> Result<SubagentStarted> {
    if branch::guarded(parent) {
        let subject = branch::Subject::Subagent {
            agent: &child.agent,
            session: child.session_key.is_some(),
        };
        let recorded = parent_step(tx, parent, &key)?;
        match branch::judge(parent, subject, recorded.as_ref(), ("", &child.input)) {
            Verdict::Replay(recorded) => {
                let change = branch::replay(parent, &recorded, (seq, recorded.position), tx.now);
                insert_step(tx, &change.step)?;
                tx.append(
                    &parent.id,
                    change.event.kind,
                    change.event.payload,
                    Some(change.step.clone()),
                )?;
                return Ok((StepRecorded::Recorded(change.step), None));
            }
            Verdict::Blocked(refused) => {
                let change = branch::blocked_subagent(parent, (seq, key), &child, refused.message(parent), tx.now);
                insert_step(tx, &change.step)?;
                tx.append(
                    &parent.id,
                    change.event.kind,
                    change.event.payload,
                    Some(change.step.clone()),
                )?;
                let reason = refused.run_reason(parent.capture);
                let (_, ended) = end_tree(tx, parent, &EndRun::Fail { reason })?;
                return Ok((
                    StepRecorded::Blocked {
                        step: change.step,
                        ended,
                    },
                    None,
                ));
            }
            Verdict::BranchOf(of) => {
                child.fork = Some(crate::model::Fork {
                    of,
                    at: None,
                    results: Default::default(),
                });
            }
            Verdict::Live => child.allow = parent.allow.clone(),
        }
    }
    new_subagent(tx, parent, (seq, key), child)
}

/// Creates a subagent's child run (hosted, linked to `parent` and to the step `key` waiting for
/// it) and that step, at place `seq`. A child of a session whose earlier run has not finished
/// waits for it.
fn new_subagent(
    tx: &mut Tx<'_>,
    parent: &RunRecord,
    (seq, key): (u32, StepKey),
    mut new: NewRun,
) -> Result<SubagentStarted> {
    new.parent = Some((parent.id.clone(), key.clone()));
    let waits = match &new.session_key {
        Some(session) => session_busy(tx.conn, session)?,
        None => false,
    };
    let session = new.session_key.clone();
    let (child, _, dispatch) = create_run(tx, new)?;
    let mut dispatch = dispatch.expect("a subagent's run is hosted");
    if let (true, Some(session)) = (waits, session) {
        let change = hosted::wait_for_session(&dispatch, &session);
        save_step(tx, &change.step)?;
        // No attempt ran: the event carries no step, so no attempt's span ends on it.
        tx.append(&child.id, change.event.kind, change.event.payload, None)?;
        dispatch = change.step;
    }
    let change = hosted::subagent_step(parent, (seq, key), &child, tx.now);
    insert_step(tx, &change.step)?;
    tx.append(
        &parent.id,
        change.event.kind,
        change.event.payload,
        Some(change.step.clone()),
    )?;
    if !waits {
        tx.waits(&dispatch);
    }
    Ok((
        StepRecorded::Recorded(change.step),
        (!waits).then(|| Box::new(dispatch)),
    ))
}

/// A subagent to start.
#[derive(Clone, Debug)]
pub struct SubagentStart {
    pub parent: RunId,
    pub fence: hosted::Fence,
    pub seq: u32,
    pub occurrence: u32,
    pub child: NewRun,
}

/// What starting a subagent did, and the child's dispatch to queue (none when the child waits
/// for its session, or when it was started before).
pub type SubagentStarted = (StepRecorded, Option<Box<StepRecord>>);

pub fn lose_lease(tx: &mut Tx<'_>, loss: LeaseLoss) -> Result<LossOutcome> {
    let Some(step) = held_step(tx, &loss.dispatch_id, loss.attempt, None)? else {
        return Ok(LossOutcome::NotHeld);
    };
    let step = tx.apply(dispatch::lose_lease(&step, &loss, tx.now))?;
    Ok(if step.status == StepStatus::Pending {
        LossOutcome::Requeued(step)
    } else {
        LossOutcome::Indeterminate(step)
    })
}

/// Records a dispatch that outlived its timeout, as the machine decides ([`dispatch::time_out`]);
/// `None` when the dispatch no longer held its step.
pub fn time_out(tx: &mut Tx<'_>, dispatch_id: &str, attempt: u32) -> Result<Option<StepRecord>> {
    let Some(step) = held_step(tx, dispatch_id, attempt, None)? else {
        return Ok(None);
    };
    Ok(Some(tx.apply(dispatch::time_out(&step, tx.now))?))
}

pub fn fail_pending(
    tx: &mut Tx<'_>,
    run: &RunId,
    key: &StepKey,
    message: &str,
    why: (&str, Outcome),
) -> Result<Option<StepRecord>> {
    let Some(step) = tx.find_step(run, key)? else {
        return Ok(None);
    };
    dispatch::fail_pending(&step, message, why, tx.now)
        .map(|change| tx.apply(change))
        .transpose()
}

pub fn end_run(tx: &mut Tx<'_>, run_id: &RunId, end: EndRun) -> Result<(RunRecord, Vec<StepRecord>)> {
    let run = tx.run(run_id)?;
    if run.hosted && matches!(end, EndRun::Complete { .. }) && !run.status.is_terminal() {
        return Err(KernelError::FailedPrecondition(format!(
            "run {} is hosted by agent '{}': its handler's return value completes it (fail or cancel it instead)",
            run.id, run.agent
        )));
    }
    end_tree(tx, &run, &end)
}

/// Cancels one call of a run, as the machine decides ([`cancel::cancel_call`]); the run goes on.
/// A gated call's question is withdrawn and the run's next gated call asked (or the run resumed
/// when none waits). Returns the settled step, to cancel on its worker.
pub fn cancel_call(tx: &mut Tx<'_>, run_id: &RunId, key: &StepKey, reason: &str) -> Result<StepRecord> {
    tx.run(run_id)?;
    let step = tx
        .find_step(run_id, key)?
        .ok_or_else(|| KernelError::NotFound(format!("call {key} not found in run {run_id}")))?;
    let open: Option<ApprovalRecord> = tx
        .conn
        .prepare_cached(&format!(
            "SELECT {} FROM approvals WHERE run_id = ?1 AND step_key = ?2 AND status = 'pending'",
            rows::APPROVAL_COLUMNS
        ))?
        .query_row(params![run_id.as_str(), key.as_str()], rows::approval_from_row)
        .optional()?;
    let change = cancel::cancel_call(&step, open.as_ref(), reason, tx.now)?;
    if let Some(withdrawn) = &change.withdrawn {
        save_approval(tx.conn, withdrawn)?;
    }
    let settled = tx.apply(change.settled)?;
    if step.status == StepStatus::AwaitingApproval {
        ask_next_approval(tx, run_id)?;
    }
    Ok(settled)
}

/// Fails, as abandoned, up to `limit` external agents' runs that made no turn for `after_ms`
/// ([`run::abandoned`]), their calls settled first; returns each run with the steps settled, to
/// cancel on their workers.
pub fn abandon_runs(tx: &mut Tx<'_>, after_ms: u64, limit: usize) -> Result<Vec<(RunRecord, Vec<StepRecord>)>> {
    let cutoff = tx.now.saturating_sub(after_ms as Millis);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    // An external run's steps are its turns' calls, so its last turn is its latest step's creation.
    let idle: Vec<(String, Option<Millis>)> = tx
        .conn
        .prepare_cached(
            "SELECT r.id, (SELECT MAX(s.created_at) FROM steps s WHERE s.run_id = r.id) FROM runs r \
             WHERE r.status IN ('pending', 'running') AND r.hosted = 0 AND r.created_at <= ?1 \
             AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id AND s.created_at > ?1) \
             ORDER BY r.updated_at LIMIT ?2",
        )?
        .query_map(params![cutoff, limit], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<sql::Result<_>>()?;
    let mut ended = Vec::new();
    for (id, last_turn_at) in idle {
        let run = tx.run(&RunId::parse(&id, "run")?)?;
        if let Some(end) = run::abandoned(&run, last_turn_at.unwrap_or(run.created_at), after_ms, tx.now) {
            ended.push(end_tree(tx, &run, &end)?);
        }
    }
    Ok(ended)
}

/// Ends a run after its subagents: each child still running is cancelled first (its own children
/// before it), which settles the step waiting for it; then the run's own calls, then the run.
/// Returns the run and every step settled on the way, to cancel on their workers.
fn end_tree(tx: &mut Tx<'_>, run: &RunRecord, end: &EndRun) -> Result<(RunRecord, Vec<StepRecord>)> {
    let mut settled = cancel_children(tx, run)?;
    let (in_flight, open) = in_flight_and_open(tx, &run.id)?;
    let ended = run::end(run, &in_flight, &open, end, tx.now)?;
    let (run, more) = apply_end(tx, ended)?;
    settled.extend(more);
    Ok((run, settled))
}

/// Fails a hosted run whose handler diverged ([`hosted::diverged`]), unless it ended already;
/// returns the steps that settled on the way.
fn end_diverged(tx: &mut Tx<'_>, run: &RunRecord, message: &str) -> Result<Vec<StepRecord>> {
    if run.status.is_terminal() {
        return Ok(Vec::new());
    }
    Ok(end_tree(tx, run, &hosted::diverged(message))?.1)
}

/// Cancels the children of `run` still running, deepest first.
fn cancel_children(tx: &mut Tx<'_>, run: &RunRecord) -> Result<Vec<StepRecord>> {
    let children: Vec<String> = tx
        .conn
        .prepare_cached(
            "SELECT id FROM runs WHERE parent_run_id = ?1 AND status NOT IN ('completed', 'failed', 'cancelled') \
             ORDER BY id",
        )?
        .query_map(params![run.id.as_str()], |row| row.get(0))?
        .collect::<sql::Result<_>>()?;
    let mut settled = Vec::new();
    for child in children {
        let child = tx.run(&RunId::parse(&child, "child run")?)?;
        let reason = format!("parent run {} ended", run.id);
        let (_, steps) = end_tree(tx, &child, &EndRun::Cancel { reason })?;
        settled.extend(steps);
    }
    Ok(settled)
}

/// The steps a hosted handler recorded at place `seq` of its order.
fn steps_at_place(conn: &Connection<'_>, run: &RunId, seq: u32) -> Result<Vec<StepRecord>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {} FROM steps WHERE run_id = ?1 AND step_key IN \
             (SELECT step_key FROM places WHERE run_id = ?1 AND seq = ?2) ORDER BY position",
            rows::STEP_COLUMNS
        ))?
        .query_map(params![run.as_str(), seq], rows::step_from_row)?
        .collect::<sql::Result<_>>()?)
}

/// Records that a hosted handler's step sits at place `seq` of its order.
fn insert_place(conn: &Connection<'_>, step: &StepRecord) -> Result<()> {
    conn.write(
        "INSERT INTO places (run_id, seq, step_key) VALUES (?1, ?2, ?3)",
        params![step.run_id.as_str(), step.turn, step.key.as_str()],
    )?;
    Ok(())
}

/// Records a hosted handler's finished local step, fenced by the run's dispatch; a step recorded
/// before keeps its first outcome, and one that differs from what its place holds is refused. In
/// a branch or case run a step its record does not hold is judged by the branch rule as well
/// (for a handler that ran it without asking [`check_step`] first).
pub fn record_step(tx: &mut Tx<'_>, run_id: &RunId, fence: &hosted::Fence, local: LocalStep) -> Result<StepRecorded> {
    let key = StepKey::local(&local.step_id, local.occurrence);
    let run = match place_local(tx, run_id, fence, local.seq, &key)? {
        Ok(run) => run,
        Err(placed) => return Ok(placed),
    };
    if branch::guarded(&run) && !local.denied {
        let verdict = judge_local(tx, &run, &key, &local)?;
        if !matches!(verdict, Verdict::Live) {
            return settle_by_rule(tx, &run, &local, verdict);
        }
    }
    let change = hosted::record_local(&run, &local, tx.now);
    insert_local(tx, &run, change)
}

/// Asks the branch rule whether a local step of guarded run `run_id` may run, before it runs:
/// [`StepRecorded::Allowed`] when it may (a read, or allowed by a token), else the step as the
/// rule settles it (replayed from the parent, or refused, which ends the run). `local`'s
/// outcome is not used.
pub fn check_step(tx: &mut Tx<'_>, run_id: &RunId, fence: &hosted::Fence, local: LocalStep) -> Result<StepRecorded> {
    let key = StepKey::local(&local.step_id, local.occurrence);
    let run = match place_local(tx, run_id, fence, local.seq, &key)? {
        Ok(run) => run,
        Err(placed) => return Ok(placed),
    };
    if !branch::guarded(&run) {
        return Ok(StepRecorded::Allowed);
    }
    match judge_local(tx, &run, &key, &local)? {
        Verdict::Live => Ok(StepRecorded::Allowed),
        verdict => settle_by_rule(tx, &run, &local, verdict),
    }
}

/// The run of a local step at an open place; otherwise what its place says (replayed, or
/// diverged).
fn place_local(
    tx: &mut Tx<'_>,
    run_id: &RunId,
    fence: &hosted::Fence,
    seq: u32,
    key: &StepKey,
) -> Result<std::result::Result<RunRecord, StepRecorded>> {
    let run = tx.run(run_id)?;
    let dispatch = tx.find_step(&run.id, &StepKey::agent())?;
    hosted::check_fence(&run, dispatch.as_ref(), Some(fence))?;
    let at_place = steps_at_place(tx.conn, &run.id, seq)?;
    let elsewhere: Vec<StepRecord> = tx.find_step(&run.id, key)?.into_iter().collect();
    Ok(
        match hosted::place(seq, std::slice::from_ref(key), &at_place, &elsewhere) {
            Err(message) => {
                let ended = end_diverged(tx, &run, &message)?;
                Err(StepRecorded::Diverged { message, ended })
            }
            Ok(Place::Recorded(mut steps)) => Err(StepRecorded::Replayed(steps.remove(0))),
            Ok(Place::Open) => Ok(run),
        },
    )
}

fn judge_local(tx: &Tx<'_>, run: &RunRecord, key: &StepKey, local: &LocalStep) -> Result<Verdict> {
    let subject = branch::Subject::Step {
        id: &local.step_id,
        effect: local.effect,
        once: local.once,
    };
    let parent = parent_step(tx, run, key)?;
    Ok(branch::judge(run, subject, parent.as_ref(), ("", "null")))
}

/// Records a local step as the branch rule settled it: the parent's outcome replayed, or a
/// refusal, which ends the run.
fn settle_by_rule(tx: &mut Tx<'_>, run: &RunRecord, local: &LocalStep, verdict: Verdict) -> Result<StepRecorded> {
    match verdict {
        Verdict::Replay(parent) => {
            let change = branch::replay(run, &parent, (local.seq, local.occurrence), tx.now);
            insert_local(tx, run, change)
        }
        Verdict::Blocked(refused) => {
            let blocked = LocalStep {
                outcome: Err(refused.message(run)),
                decided_by: Some("branch".to_owned()),
                denied: false,
                blocked: true,
                ..local.clone()
            };
            let change = hosted::record_local(run, &blocked, tx.now);
            let StepRecorded::Recorded(step) = insert_local(tx, run, change)? else {
                unreachable!("a local step is recorded as it is given");
            };
            let reason = refused.run_reason(run.capture);
            let (_, ended) = end_tree(tx, run, &EndRun::Fail { reason })?;
            Ok(StepRecorded::Blocked { step, ended })
        }
        Verdict::Live | Verdict::BranchOf(_) => Ok(StepRecorded::Allowed),
    }
}

/// Writes a settled local step at its place, with its event.
fn insert_local(tx: &mut Tx<'_>, run: &RunRecord, change: StepChange) -> Result<StepRecorded> {
    insert_step(tx, &change.step)?;
    insert_place(tx.conn, &change.step)?;
    tx.append(
        &run.id,
        change.event.kind,
        change.event.payload,
        Some(change.step.clone()),
    )?;
    Ok(StepRecorded::Recorded(change.step))
}

/// What recording (or checking) a local step or starting a subagent did.
#[derive(Clone, Debug)]
pub enum StepRecorded {
    Recorded(StepRecord),
    /// Recorded before (by an earlier attempt of the handler): that outcome stands.
    Replayed(StepRecord),
    /// The handler is not deterministic: its place holds another step. The run ended failed with
    /// it: `ended` are the steps that settled on the way, to cancel on their workers.
    Diverged {
        message: String,
        ended: Vec<StepRecord>,
    },
    /// The branch rule lets the step run live; nothing was recorded.
    Allowed,
    /// The branch rule refused the step (recorded so) and ended the run: `ended` are the steps
    /// that settled on the way, to cancel on their workers.
    Blocked {
        step: StepRecord,
        ended: Vec<StepRecord>,
    },
}

pub fn register_agents(tx: &mut Tx<'_>, agents: Vec<crate::model::AgentDef>) -> Result<()> {
    for agent in agents {
        tx.conn
            .prepare_cached(
                "INSERT INTO agents (name, description, input_schema, version, fingerprint, first_seen_at, last_seen_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) ON CONFLICT (name) DO UPDATE SET description = ?2, \
                 input_schema = ?3, version = ?4, fingerprint = ?5, last_seen_at = ?6",
            )?
            .execute(params![
                agent.name,
                agent.description,
                agent.input_schema.to_string(),
                agent.version,
                agent.fingerprint,
                tx.now
            ])?;
    }
    Ok(())
}

pub fn register_tools(tx: &mut Tx<'_>, tools: Vec<ToolDef>) -> Result<()> {
    for tool in tools {
        let options = serde_json::to_string(&tool.options).expect("options serialize");
        tx.conn
            .prepare_cached(
                "INSERT INTO tools (name, description, input_schema, version, fingerprint, options, first_seen_at, last_seen_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
                 ON CONFLICT (name) DO UPDATE SET description = ?2, input_schema = ?3, version = ?4, fingerprint = ?5, \
                 options = ?6, last_seen_at = ?7",
            )?
            .execute(params![
                tool.name,
                tool.description,
                tool.input_schema.to_string(),
                tool.version,
                tool.fingerprint,
                options,
                tx.now
            ])?;
    }
    Ok(())
}

pub fn forget_tools(tx: &mut Tx<'_>, names: &[String]) -> Result<Vec<String>> {
    let mut forgotten = Vec::with_capacity(names.len());
    for name in names {
        let deleted = tx
            .conn
            .prepare_cached("DELETE FROM tools WHERE name = ?1")?
            .execute(params![name])?;
        if deleted > 0 {
            tx.conn
                .prepare_cached("DELETE FROM result_cache WHERE tool = ?1")?
                .execute(params![name])?;
            tx.conn
                .prepare_cached("DELETE FROM tool_cache WHERE tool = ?1")?
                .execute(params![name])?;
            forgotten.push(name.clone());
        }
    }
    Ok(forgotten)
}

/// Deletes one finished run with everything recorded under it; refuses a run in flight.
pub fn delete_run(tx: &mut Tx<'_>, run_id: &RunId) -> Result<super::Deleted> {
    run::deletable(&tx.run(run_id)?)?;
    remove_run(tx, run_id)
}

/// Deletes up to `limit` runs that finished before `finished_before`, oldest first.
pub fn prune_runs(tx: &mut Tx<'_>, finished_before: Millis, limit: usize) -> Result<super::Deleted> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let ids: Vec<String> = tx
        .conn
        .prepare_cached(
            "SELECT id FROM runs WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < ?1 \
             ORDER BY updated_at LIMIT ?2",
        )?
        .query_map(params![finished_before, limit], |row| row.get(0))?
        .collect::<sql::Result<_>>()?;
    let mut deleted = super::Deleted::default();
    for id in ids {
        let id = RunId::parse(&id, "id")?;
        deleted.add(remove_run(tx, &id)?);
    }
    Ok(deleted)
}

/// Removes a run's rows, children first. A cached result goes with the last run it belongs to (the
/// run that stored it, and each run served from it): a deleted run's results are not served to
/// another, and no other run's entry goes with it.
fn remove_run(tx: &mut Tx<'_>, run_id: &RunId) -> Result<super::Deleted> {
    tx.cache.borrow_mut().forget(run_id);
    let id = run_id.as_str();
    let delete = |sql: &str| -> Result<u64> { Ok(tx.conn.prepare_cached(sql)?.execute(params![id])? as u64) };
    let cache_entries = delete(
        "DELETE FROM result_cache WHERE call_hash IN (SELECT call_hash FROM result_cache_runs WHERE run_id = ?1) \
         AND NOT EXISTS (SELECT 1 FROM result_cache_runs other \
                         WHERE other.call_hash = result_cache.call_hash AND other.run_id <> ?1)",
    )?;
    delete("DELETE FROM result_cache_runs WHERE run_id = ?1")?;
    let approvals = delete("DELETE FROM approvals WHERE run_id = ?1")?;
    let steps = delete("DELETE FROM steps WHERE run_id = ?1")?;
    delete("DELETE FROM places WHERE run_id = ?1")?;
    delete("DELETE FROM resource_locks WHERE run_id = ?1")?;
    let events = delete(match tx.conn.dialect() {
        Dialect::Sqlite => chain::DELETE_RUN_EVENTS,
        Dialect::Postgres => "DELETE FROM events WHERE run_id = ?1",
    })?;
    let runs = delete("DELETE FROM runs WHERE id = ?1")?;
    Ok(super::Deleted {
        runs,
        events,
        steps,
        approvals,
        cache_entries,
    })
}

/// Writes (or replaces) one entry of the cache of the tool the asking dispatch runs, if that
/// dispatch still runs on that session. It appends no event: the cache is the tool's scratch space,
/// not part of any run's log.
pub fn tool_cache_set(tx: &mut Tx<'_>, set: super::ToolCacheSet) -> Result<()> {
    let Some(step) = held_step(tx, &set.dispatch_id, set.attempt, Some(&set.session_id))? else {
        return Err(KernelError::FailedPrecondition(format!(
            "dispatch {} attempt {} no longer runs on this session (finished, timed out or lost); \
             the cache was not written",
            set.dispatch_id, set.attempt
        )));
    };
    tx.conn.write(
        "INSERT INTO tool_cache (tool, key, value, expires_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (tool, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
        params![step.tool, set.key, set.value, set.expires_at],
    )?;
    Ok(())
}

/// Deletes up to `limit` expired entries of each cache (read_only results and `ctx.cache`), oldest
/// expiry first; returns how many went. Reads already skip them; this keeps the file from growing.
pub fn purge_expired(tx: &mut Tx<'_>, limit: usize) -> Result<usize> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let results = tx
        .conn
        .prepare_cached(
            "DELETE FROM result_cache WHERE call_hash IN \
             (SELECT call_hash FROM result_cache WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)",
        )?
        .execute(params![tx.now, limit])?;
    let entries = tx
        .conn
        .prepare_cached(
            "DELETE FROM tool_cache WHERE (tool, key) IN \
             (SELECT tool, key FROM tool_cache WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)",
        )?
        .execute(params![tx.now, limit])?;
    Ok(results + entries)
}

/// Renews this replica's row: its heartbeat dates every lease it holds.
pub fn beat(tx: &mut Tx<'_>, beat: super::ReplicaBeat) -> Result<()> {
    tx.conn.write(
        "INSERT INTO replicas (id, started_at, heartbeat_at, offers) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (id) \
             DO UPDATE SET heartbeat_at = excluded.heartbeat_at, offers = excluded.offers",
        params![tx.replica, beat.started_at, tx.now, beat.offers],
    )?;
    Ok(())
}

/// Removes a replica's row; with `heartbeat_at`, only if it has not beaten again since.
pub fn forget_replica(tx: &mut Tx<'_>, id: &str, heartbeat_at: Option<Millis>) -> Result<bool> {
    let removed = match heartbeat_at {
        Some(at) => tx
            .conn
            .prepare_cached("DELETE FROM replicas WHERE id = ?1 AND heartbeat_at = ?2")?
            .execute(params![id, at])?,
        None => tx
            .conn
            .prepare_cached("DELETE FROM replicas WHERE id = ?1")?
            .execute(params![id])?,
    };
    Ok(removed > 0)
}

/// How long a replica's claim on waiting calls keeps the other replicas off them: long enough for
/// its starts to commit, short enough that a claim lost with its replica delays nothing for long.
pub const CLAIM_MS: Millis = 2_000;

/// Claims at most `limit` waiting calls of `tools` (or dispatches of runs of `agents`), oldest
/// first, that no other replica claimed within [`CLAIM_MS`]: each replica claims its own, so
/// replicas do not all race to start the same calls (a start is fenced either way).
pub fn claim_pending(tx: &mut Tx<'_>, tools: &[String], agents: &[String], limit: usize) -> Result<Vec<StepRecord>> {
    let mut wanted = Vec::new();
    let mut args: Vec<sql::Arg<'_>> = vec![sql::Arg::Int(tx.now + CLAIM_MS), sql::Arg::Int(tx.now)];
    for (names, agent) in [(tools, false), (agents, true)] {
        if names.is_empty() {
            continue;
        }
        let places: Vec<String> = (0..names.len()).map(|i| format!("?{}", args.len() + i + 1)).collect();
        let kind = if agent { "=" } else { "<>" };
        wanted.push(format!("(kind {kind} 'agent' AND tool IN ({}))", places.join(", ")));
        args.extend(names.iter().map(|name| sql::Arg::Text(name)));
    }
    if wanted.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    args.push(sql::Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
    let sql = format!(
        "UPDATE steps SET claimed_until = ?1 WHERE (run_id, step_key) IN (SELECT run_id, step_key FROM steps \
         WHERE status = 'pending' AND (claimed_until IS NULL OR claimed_until < ?2) AND ({}) ORDER BY created_at \
         LIMIT ?{}) RETURNING {}",
        wanted.join(" OR "),
        args.len(),
        rows::STEP_COLUMNS
    );
    Ok(tx
        .conn
        .prepare(&sql)?
        .query_map(&args, rows::step_from_row)?
        .collect::<std::result::Result<Vec<_>, _>>()?)
}

/// Open steps, read through the `steps_unsettled` index, whose condition each repeats.
pub(super) mod open_steps {
    use crate::store::schema::unsettled;

    /// How many calls the run has open: the pending-calls limit counts them.
    pub const COUNT_CALLS: &str = concat!(
        "SELECT COUNT(*) FROM steps WHERE run_id = ?1 AND ",
        unsettled!(),
        " AND status IN ('pending', 'running', 'awaiting_approval')"
    );

    /// The first step awaiting its approval, in the run's order.
    pub fn next_awaiting_approval(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM steps WHERE run_id = ?1 AND {} AND status = 'awaiting_approval' \
             ORDER BY turn, position LIMIT 1",
            unsettled!()
        )
    }

    /// Every open step, in the run's order.
    pub fn all(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM steps WHERE run_id = ?1 AND {} ORDER BY turn, position",
            unsettled!()
        )
    }

    /// Every run's pending and running steps, oldest first: what the kernel had in flight. Open
    /// steps are few beside all a database holds, so scanning their index costs what a narrower
    /// index would, and each write of a step keeps one index fewer.
    pub fn in_flight(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM steps WHERE {} AND status IN ('pending', 'running') ORDER BY created_at",
            unsettled!()
        )
    }

    /// The running steps whose lease replica `?1` holds, oldest first.
    pub fn held_by(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM steps WHERE {} AND status = 'running' AND replica = ?1 ORDER BY created_at",
            unsettled!()
        )
    }

    #[cfg(test)]
    mod tests {
        /// A query that drops the index's condition would read every step the database holds.
        #[test]
        fn each_query_reads_the_open_steps_index() {
            let conn = crate::store::schema::migrated_in_memory();
            for (sql, scan) in [
                (super::COUNT_CALLS.to_string(), " (run_id=?"),
                (super::next_awaiting_approval("*"), " (run_id=?"),
                (super::all("*"), " (run_id=?"),
                (super::in_flight("*"), ""),
                (super::held_by("*"), ""),
            ] {
                let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
                let args = std::iter::repeat_n("run", explain.parameter_count());
                let plan: Vec<String> = explain
                    .query_map(rusqlite::params_from_iter(args), |row| row.get(3))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                assert!(
                    plan.iter()
                        .any(|step| step.contains(&format!("INDEX steps_unsettled{scan}"))),
                    "{sql}: {plan:?}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shape of a step's save writes exactly the indexed columns asked for, and takes all
    /// of the save's parameters, so one argument list binds every shape.
    #[test]
    fn a_steps_save_writes_only_the_indexed_columns_asked_for() {
        let conn = super::super::schema::migrated_in_memory();
        for status in [true, false] {
            for dispatch in [true, false] {
                let sql = save_step_sql(status, dispatch);
                assert_eq!(sql.contains("status = ?3"), status, "{sql}");
                assert_eq!(sql.contains("dispatch_id = ?4"), dispatch, "{sql}");
                assert_eq!(conn.prepare(sql).unwrap().parameter_count(), 21, "{sql}");
            }
        }
    }
}
