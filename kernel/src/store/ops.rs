//! A command's transaction: the records the machine's commands (`machine::command`) read and
//! write, as SQL on the writer's connection, and the events they append, written when the command
//! ends. Each command runs inside the writer's batch transaction (kept apart from its
//! batch-mates, see `writer::Isolation`), so state and log commit together or not at all. The
//! writes here that belong to no run's life (registries, caches, replicas) are here too.

use std::collections::HashMap;

use super::chain;
use super::sql::{self, Connection, Dialect, OptionalExtension, ToArg, params};

use super::cache::{Cache, Known};
use super::rows::{self, load_run, load_step, load_step_by_dispatch};
use crate::error::KernelError;
use crate::machine::NewEvent;
use crate::machine::command::Records;
use crate::machine::effects::Effect;
use crate::machine::hosted::Fence;
use crate::model::{
    ApprovalId, ApprovalRecord, DispatchId, EVENT_SCHEMA_VERSION, ErrorKind, EventRecord, Millis, Outcome, RunId,
    RunRecord, StepKey, StepKind, StepRecord, ToolDef,
};

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
    /// What must happen once this command commits, in order.
    pub effects: Vec<Effect>,
    /// The last event number of each run this command read or wrote, and whether the run row
    /// still has to be told: the next event takes the next number without asking the database
    /// (nothing else changes it inside the writer's transaction), and a run's row is written once
    /// per command however many events it appended ([`Tx::finish`]).
    pub seqs: std::cell::RefCell<std::collections::HashMap<RunId, Seq>>,
    /// The writer's memory of the runs and steps it wrote (see [`Cache`]).
    pub cache: &'c std::cell::RefCell<Cache>,
    /// Which shards this replica owns, among replicas: the sweeps (idle runs, finished runs, due
    /// approvals) take only runs of its own shards. `None`: every run is this writer's (SQLite).
    pub router: Option<&'c dyn super::forward::Router>,
}

impl Tx<'_> {
    /// Whether this writer may write `run`: its shard is this replica's, or there are no shards.
    pub fn owns(&self, run: &RunId) -> bool {
        self.owns_text(run.as_str())
    }

    fn owns_text(&self, run: &str) -> bool {
        super::forward::may_write(self.router, run)
    }
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
}

/// The records of a command, read and written in the writer's transaction, through the writer's
/// memory of the runs and steps it wrote ([`Cache`]).
impl Records for Tx<'_> {
    fn now(&self) -> Millis {
        self.now
    }

    fn replica(&self) -> &str {
        self.replica
    }

    fn effect(&mut self, effect: Effect) {
        // A step that never ran is news to the other replicas (the commit's notice); a retry or
        // a woken dispatch is this replica's to run again, and their scans find it if not.
        if let Effect::Dispatch(step) = &effect
            && step.attempts == 0
        {
            self.waiting.push((step.kind, step.tool.clone()));
        }
        self.effects.push(effect);
    }

    fn append(&mut self, run: &RunId, event: NewEvent, step: Option<StepRecord>) -> Result<()> {
        let NewEvent { kind, payload } = event;
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

    fn budgeted(&self, id: &RunId) -> Result<bool> {
        let held = self.cache.borrow().budgeted(id);
        match held {
            Some(budgeted) => Ok(budgeted),
            None => Ok(self.run(id)?.budget.is_some()),
        }
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

    fn run_by_idempotency_key(&self, key: &str) -> Result<Option<RunRecord>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM runs WHERE idempotency_key = ?1",
                rows::RUN_COLUMNS
            ))?
            .query_row(params![key], rows::run_from_row)
            .optional()?)
    }

    fn run_exists(&self, id: &RunId) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM runs WHERE id = ?1)")?
            .query_row(params![id.as_str()], |row| row.get(0))?)
    }

    fn insert_run(&mut self, run: &RunRecord) -> Result<()> {
        insert_run(self, run)?;
        self.knows_seq(&run.id, run.last_seq);
        Ok(())
    }

    fn save_run(&mut self, run: &RunRecord) -> Result<()> {
        save_run(self, run)
    }

    fn live_children(&self, run: &RunId) -> Result<Vec<RunId>> {
        let ids: Vec<String> = self
            .conn
            .prepare_cached(
                "SELECT id FROM runs WHERE parent_run_id = ?1 AND status NOT IN ('completed', 'failed', 'cancelled') \
                 ORDER BY id",
            )?
            .query_map(params![run.as_str()], |row| row.get(0))?
            .collect::<sql::Result<_>>()?;
        ids.iter().map(|id| RunId::parse(id, "child run")).collect()
    }

    fn next_of_session(&self, session: &str) -> Result<Option<RunId>> {
        let next: Option<String> = self
            .conn
            .prepare_cached(
                "SELECT id FROM runs WHERE session_key = ?1 AND status NOT IN ('completed', 'failed', 'cancelled') \
                 ORDER BY id LIMIT 1",
            )?
            .query_row(params![session], |row| row.get(0))
            .optional()?;
        next.map(|id| RunId::parse(&id, "session run")).transpose()
    }

    fn idle_runs(&self, cutoff: Millis, limit: usize) -> Result<Vec<(RunId, Option<Millis>)>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // An external run's steps are its turns' calls, so its last turn is its latest step's creation.
        let idle: Vec<(String, Option<Millis>)> = self
            .conn
            .prepare_cached(
                "SELECT r.id, (SELECT MAX(s.created_at) FROM steps s WHERE s.run_id = r.id) FROM runs r \
                 WHERE r.status IN ('pending', 'running') AND r.hosted = 0 AND r.created_at <= ?1 \
                 AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id AND s.created_at > ?1) \
                 ORDER BY r.updated_at LIMIT ?2",
            )?
            .query_map(params![cutoff, limit], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<sql::Result<_>>()?;
        let idle: Vec<(String, Option<Millis>)> = idle.into_iter().filter(|(id, _)| self.owns_text(id)).collect();
        idle.into_iter()
            .map(|(id, last)| Ok((RunId::parse(&id, "run")?, last)))
            .collect()
    }

    fn finished_runs(&self, before: Millis, limit: usize) -> Result<Vec<RunId>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let ids: Vec<String> = self
            .conn
            .prepare_cached(
                "SELECT id FROM runs WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < ?1 \
                 ORDER BY updated_at LIMIT ?2",
            )?
            .query_map(params![before, limit], |row| row.get(0))?
            .collect::<sql::Result<_>>()?;
        ids.iter()
            .map(|id| RunId::parse(id, "id"))
            .filter(|id| id.as_ref().map_or(true, |id| self.owns(id)))
            .collect()
    }

    fn remove_run(&mut self, run: &RunId) -> Result<super::Deleted> {
        remove_run(self, run)
    }

    fn cache_claims(&self, run: &RunId) -> Result<Vec<(String, usize)>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT mine.call_hash, (SELECT COUNT(*) FROM result_cache_runs every \
                 WHERE every.call_hash = mine.call_hash) FROM result_cache_runs mine WHERE mine.run_id = ?1 \
                 ORDER BY mine.call_hash",
            )?
            .query_map(params![run.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<sql::Result<_>>()?)
    }

    fn delete_cached_result(&mut self, call_hash: &str) -> Result<bool> {
        let deleted = self
            .conn
            .prepare_cached("DELETE FROM result_cache WHERE call_hash = ?1")?
            .execute(params![call_hash])?;
        Ok(deleted > 0)
    }

    fn step_by_dispatch(&self, dispatch_id: &DispatchId) -> Result<Option<StepRecord>> {
        let cached = self.cache.borrow().by_dispatch(dispatch_id);
        let found = match cached {
            Some(found) => Some(found),
            None => load_step_by_dispatch(self.conn, dispatch_id)?,
        };
        let Some((step, last_seq)) = found else {
            return Ok(None);
        };
        self.cache.borrow_mut().step_is(&step);
        self.knows_seq(&step.run_id, last_seq);
        Ok(Some(step))
    }

    fn insert_step(&mut self, step: &StepRecord) -> Result<()> {
        insert_step(self, step)
    }

    fn write_step(&mut self, step: &StepRecord) -> Result<()> {
        save_step(self, step)
    }

    fn release_locks(&mut self, step: &StepRecord) -> Result<()> {
        self.conn.write(
            "DELETE FROM resource_locks WHERE run_id = ?1 AND step_key = ?2",
            params![step.run_id.as_str(), step.key.as_str()],
        )?;
        Ok(())
    }

    fn open_steps(&self, run: &RunId) -> Result<Vec<StepRecord>> {
        if let Some(open) = self.cache.borrow().open_steps_where(run, |_| true) {
            return Ok(open);
        }
        Ok(self
            .conn
            .prepare_cached(&open_steps::all(rows::STEP_COLUMNS))?
            .query_map(params![run.as_str()], rows::step_from_row)?
            .collect::<sql::Result<_>>()?)
    }

    fn open_dependents(&self, run: &RunId, caller: &StepKey) -> Result<Vec<StepRecord>> {
        // Every settle asks: a run held here answers without a statement, and clones only those.
        if let Some(open) = self.cache.borrow().open_dependents(run, caller) {
            return Ok(open);
        }
        let mut open = self.open_steps(run)?;
        open.retain(|step| step.key.began_by(caller));
        Ok(open)
    }

    fn count_active_steps(&self, run: &RunId) -> Result<usize> {
        if let Some(count) = self.cache.borrow().unsettled(run) {
            return Ok(count);
        }
        Ok(self
            .conn
            .prepare_cached(open_steps::COUNT_CALLS)?
            .query_row(params![run.as_str()], |row| row.get::<usize>(0))?)
    }

    fn next_awaiting_approval(&self, run: &RunId) -> Result<Option<StepRecord>> {
        Ok(self
            .conn
            .prepare_cached(&open_steps::next_awaiting_approval(rows::STEP_COLUMNS))?
            .query_row(params![run.as_str()], rows::step_from_row)
            .optional()?)
    }

    fn note_replays(&mut self, run: &RunId, keys: &[StepKey]) -> Result<()> {
        let (listed, keys) = rows::key_list(self.conn, keys);
        self.conn.write(
            &format!("UPDATE steps SET replays = replays + 1 WHERE run_id = ?1 AND step_key IN ({listed})"),
            params![run.as_str(), keys],
        )?;
        self.cache.borrow_mut().forget(run);
        Ok(())
    }

    fn steps_at_place(&self, run: &RunId, seq: u32) -> Result<Vec<StepRecord>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM steps WHERE run_id = ?1 AND step_key IN \
                 (SELECT step_key FROM places WHERE run_id = ?1 AND seq = ?2) ORDER BY position",
                rows::STEP_COLUMNS
            ))?
            .query_map(params![run.as_str(), seq], rows::step_from_row)?
            .collect::<sql::Result<_>>()?)
    }

    fn insert_place(&mut self, step: &StepRecord) -> Result<()> {
        self.conn.write(
            "INSERT INTO places (run_id, seq, step_key) VALUES (?1, ?2, ?3)",
            params![step.run_id.as_str(), step.turn, step.key.as_str()],
        )?;
        Ok(())
    }

    fn note_check(&mut self, run: &RunId, key: &StepKey, fence: &Fence, decided_by: &str) -> Result<()> {
        self.conn.write(
            "INSERT INTO step_checks (run_id, step_key, dispatch_id, attempt, decided_by) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (run_id, step_key) DO UPDATE SET dispatch_id = excluded.dispatch_id, \
             attempt = excluded.attempt, decided_by = excluded.decided_by",
            params![run.as_str(), key.as_str(), fence.dispatch_id, fence.attempt, decided_by],
        )?;
        Ok(())
    }

    fn take_check(&mut self, run: &RunId, key: &StepKey) -> Result<Option<(Fence, String)>> {
        let check = self
            .conn
            .prepare_cached(
                "DELETE FROM step_checks WHERE run_id = ?1 AND step_key = ?2 RETURNING dispatch_id, attempt, decided_by",
            )?
            .query_row(params![run.as_str(), key.as_str()], |row| {
                Ok((
                    Fence {
                        dispatch_id: row.get(0)?,
                        attempt: row.get(1)?,
                    },
                    row.get(2)?,
                ))
            })
            .optional()?;
        Ok(check)
    }

    fn approval(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>> {
        Ok(rows::load_approval(self.conn, id)?)
    }

    fn open_approvals(&self, run: &RunId) -> Result<Vec<ApprovalRecord>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM approvals WHERE run_id = ?1 AND status = 'pending'",
                rows::APPROVAL_COLUMNS
            ))?
            .query_map(params![run.as_str()], rows::approval_from_row)?
            .collect::<sql::Result<_>>()?)
    }

    fn open_approval_of(&self, run: &RunId, key: &StepKey) -> Result<Option<ApprovalRecord>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM approvals WHERE run_id = ?1 AND step_key = ?2 AND status = 'pending'",
                rows::APPROVAL_COLUMNS
            ))?
            .query_row(params![run.as_str(), key.as_str()], rows::approval_from_row)
            .optional()?)
    }

    fn due_approvals(&self) -> Result<Vec<ApprovalRecord>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {} FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?1",
                rows::APPROVAL_COLUMNS
            ))?
            .query_map(params![self.now], rows::approval_from_row)?
            .collect::<sql::Result<Vec<_>>>()?
            .into_iter()
            .filter(|approval| self.owns(&approval.run_id))
            .collect())
    }

    fn insert_approval(&mut self, approval: &ApprovalRecord) -> Result<()> {
        insert_approval(self.conn, approval)
    }

    fn save_approval(&mut self, approval: &ApprovalRecord) -> Result<()> {
        save_approval(self.conn, approval)
    }

    fn consume_approval(&mut self, run: &RunId, key: &StepKey) -> Result<()> {
        self.conn.write(
            "UPDATE approvals SET status = 'consumed' WHERE run_id = ?1 AND step_key = ?2 AND status = 'approved'",
            params![run.as_str(), key.as_str()],
        )?;
        Ok(())
    }

    fn cached_result(&self, call_hash: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .prepare_cached("SELECT output FROM result_cache WHERE call_hash = ?1 AND expires_at > ?2")?
            .query_row(params![call_hash, self.now], |row| row.get(0))
            .optional()?)
    }

    fn cache_result(&mut self, step: &StepRecord, output: &str, expires_at: Millis) -> Result<()> {
        self.conn.write(
            "INSERT INTO result_cache (call_hash, tool, output, stored_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (call_hash) DO UPDATE SET output = ?3, stored_at = ?4, expires_at = ?5",
            params![step.call_hash, step.tool, output, self.now, expires_at],
        )?;
        Ok(())
    }

    fn write_tool_cache(&mut self, tool: &str, set: &super::ToolCacheSet) -> Result<()> {
        self.conn.write(
            "INSERT INTO tool_cache (tool, key, value, expires_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (tool, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
            params![tool, set.key, set.value, set.expires_at],
        )?;
        Ok(())
    }

    fn own_cached_result(&mut self, step: &StepRecord) -> Result<()> {
        self.conn.write(
            "INSERT INTO result_cache_runs (call_hash, run_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![step.call_hash, step.run_id.as_str()],
        )?;
        Ok(())
    }

    fn held_locks(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .conn
            .prepare_cached(HELD_LOCKS)?
            .query_map(params![prefix, prefix.chars().count() as i64], |row| {
                row.get::<String>(0)
            })?
            .collect::<sql::Result<_>>()?)
    }

    fn lock_bucket(
        &mut self,
        name: &str,
        fresh: crate::machine::throttle::Bucket,
    ) -> Result<crate::machine::throttle::Bucket> {
        // The upsert takes the row's lock (PostgreSQL waits here for another replica's start to
        // commit, then reads the row as that start left it), and returns the row: one statement.
        Ok(self
            .conn
            .prepare_cached(
                "INSERT INTO limit_buckets (name, tokens, at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING tokens, at",
            )?
            .query_row(params![name, fresh.tokens, fresh.at], |row| {
                Ok(crate::machine::throttle::Bucket {
                    tokens: row.get(0)?,
                    at: row.get(1)?,
                })
            })?)
    }

    fn save_bucket(&mut self, name: &str, bucket: crate::machine::throttle::Bucket) -> Result<()> {
        self.conn.write(
            "UPDATE limit_buckets SET tokens = ?2, at = ?3 WHERE name = ?1",
            params![name, bucket.tokens, bucket.at],
        )?;
        Ok(())
    }

    fn take_lock(
        &mut self,
        resource: &str,
        step: &StepRecord,
        (dispatch_id, attempt): (&DispatchId, u32),
    ) -> Result<std::result::Result<(), (String, String)>> {
        let taken = self
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
                dispatch_id,
                attempt,
                self.now
            ])?;
        if taken > 0 {
            return Ok(Ok(()));
        }
        Ok(Err(self
            .conn
            .prepare_cached("SELECT run_id, step_key FROM resource_locks WHERE resource = ?1")?
            .query_row(params![resource], |row| Ok((row.get(0)?, row.get(1)?)))?))
    }
}

fn insert_run(tx: &Tx<'_>, run: &RunRecord) -> Result<()> {
    tx.cache.borrow_mut().inserted_run(run);
    tx.conn.write(
        "INSERT INTO runs (id, agent, status, input, labels, idempotency_key, max_tool_calls, created_at, updated_at, \
         interactive, permissions, capture, granted_by, hosted, parent_run_id, parent_step, session_key, \
         max_concurrency, fork, allow, trace, budget) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, \
         ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
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
            budget_json(run),
        ],
    )?;
    Ok(())
}

/// A run's budget as its column holds it.
fn budget_json(run: &RunRecord) -> Option<String> {
    run.budget
        .as_ref()
        .map(|budget| serde_json::to_string(budget).expect("a budget serializes"))
}

/// The names of the locks held that start with `?1` (of `?2` characters): a tool limit's slots.
/// Not LIKE, whose `_` and `%` a glob holds; not a range, which a collation may reorder. The table
/// holds only what running calls lock: a scan is short.
pub(super) const HELD_LOCKS: &str = "SELECT resource FROM resource_locks WHERE substr(resource, 1, ?2) = ?1";

/// The columns a step's save writes besides its indexed ones, `?5` on.
const STEP_SAVED: &str = "attempts = ?5, output = ?6, error = ?7, error_kind = ?8, worker = ?9, session_id = ?10, \
     lease_expires_at = ?11, started_at = ?12, finished_at = ?13, progress_count = ?14, not_before = ?15, \
     lease_losses = ?16, cost = ?17, outcome = ?18, approval = ?19, replays = ?20, replica = ?21, limited_by = ?22, limit_wait_ms = ?23, \
     approval_gate = ?24, sealed = ?25";

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
            (!step.limited_by.is_empty()).then(|| serde_json::to_string(&step.limited_by).expect("names serialize")),
            (step.limit_wait_ms > 0).then_some(step.limit_wait_ms),
            // A call its budget parks at its start is gated then, not when it was recorded.
            step.approval_gate
                .as_ref()
                .map(|g| serde_json::to_string(g).expect("gate serializes")),
            // A settled call is never dispatched again: its sealed secrets go with its last attempt.
            step.sealed.as_ref().filter(|_| !step.status.is_terminal()),
        ],
    )?;
    Ok(())
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
         not_before, replica, from_run, trace, share, limited_by, limit_wait_ms, sealed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, \
         ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, \
         ?30, ?31, ?32, ?33, ?34, ?35, ?36, ?37, ?38, ?39, ?40, ?41, ?42, ?43, ?44, ?45)",
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
            step.share,
            // A call started in the turn that records it holds its limits' slots from its insert.
            (!step.limited_by.is_empty()).then(|| serde_json::to_string(&step.limited_by).expect("names serialize")),
            (step.limit_wait_ms > 0).then_some(step.limit_wait_ms),
            step.sealed,
        ],
    )?;
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
        "UPDATE approvals SET status = ?2, answered_at = ?3, decider = ?4, reason = ?5, answer = ?6 WHERE id = ?1",
        params![
            approval.id,
            approval.status.as_str(),
            approval.answered_at,
            approval.decider,
            approval.reason,
            approval.answer
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
             suspensions = ?8, budget = ?9 WHERE id = ?1"
        } else {
            "UPDATE runs SET status = ?2, output = ?3, reason = ?4, tool_calls = ?5, updated_at = ?6, \
             dispatches = ?7, suspensions = ?8, budget = ?9 WHERE id = ?1"
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
            budget_json(run),
        ],
    )?;
    Ok(())
}

/// Removes a run's rows, its claims on cached results among them (which entries go with it is the
/// delete command's to say).
fn remove_run(tx: &Tx<'_>, run_id: &RunId) -> Result<super::Deleted> {
    tx.cache.borrow_mut().forget(run_id);
    let id = run_id.as_str();
    let delete = |sql: &str| -> Result<u64> { Ok(tx.conn.prepare_cached(sql)?.execute(params![id])? as u64) };
    delete("DELETE FROM result_cache_runs WHERE run_id = ?1")?;
    let approvals = delete("DELETE FROM approvals WHERE run_id = ?1")?;
    let steps = delete("DELETE FROM steps WHERE run_id = ?1")?;
    delete("DELETE FROM places WHERE run_id = ?1")?;
    delete("DELETE FROM step_checks WHERE run_id = ?1")?;
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
        cache_entries: 0,
    })
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
        "INSERT INTO replicas (id, started_at, heartbeat_at, offers, address) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, offers = excluded.offers, \
             address = excluded.address",
        params![tx.replica, beat.started_at, tx.now, beat.offers, beat.address],
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

/// Takes the shards of `moves.take` and hands on those of `moves.hand`, each only if its epoch is
/// still the one it was read at (and, handed on, if this replica still owns it); `all` gives back
/// every shard this replica owns, to no one. The shards taken, with their new epochs.
pub fn move_shards(tx: &mut Tx<'_>, moves: &crate::cluster::shards::Moves, all: bool) -> Result<Vec<(u32, i64)>> {
    let mut taken = Vec::new();
    for (id, epoch) in &moves.take {
        let won = tx
            .conn
            .prepare_cached(
                "UPDATE shards SET owner = ?1, epoch = epoch + 1, changed_at = ?2 WHERE id = ?3 AND epoch = ?4 \
                 RETURNING epoch",
            )?
            .query_row(params![tx.replica, tx.now, i64::from(*id), *epoch], |row| row.get(0))
            .optional()?;
        taken.extend(won.map(|epoch: i64| (*id, epoch)));
    }
    for (id, epoch, to) in &moves.hand {
        tx.conn.write(
            "UPDATE shards SET owner = ?5, epoch = epoch + 1, changed_at = ?2 WHERE owner = ?1 AND id = ?3 \
             AND epoch = ?4",
            params![tx.replica, tx.now, i64::from(*id), *epoch, to],
        )?;
    }
    if all {
        tx.conn.write(
            "UPDATE shards SET owner = NULL, epoch = epoch + 1, changed_at = ?2 WHERE owner = ?1",
            params![tx.replica, tx.now],
        )?;
    }
    Ok(taken)
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
    // Among replicas a claim marks steps of any shard: one whose row the owner's transaction holds
    // is passed over, not waited for, so an owner frozen inside a transaction holds up no claim.
    let skip_locked = match tx.conn.dialect() {
        sql::Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
        sql::Dialect::Sqlite => "",
    };
    let sql = format!(
        "UPDATE steps SET claimed_until = ?1 WHERE (run_id, step_key) IN (SELECT run_id, step_key FROM steps \
         WHERE status = 'pending' AND (claimed_until IS NULL OR claimed_until < ?2) AND ({}) ORDER BY created_at \
         LIMIT ?{}{skip_locked}) RETURNING {}",
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
             ORDER BY turn, position, step_key LIMIT 1",
            unsettled!()
        )
    }

    /// Every open step, in the run's order.
    pub fn all(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM steps WHERE run_id = ?1 AND {} ORDER BY turn, position, step_key",
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

    /// The running steps whose lease ran out before `?1` and whose replica has no row: it removed
    /// its row without handing back every call (a start it asked another replica for committed
    /// after it looked), so no replica would ever judge it dead.
    pub fn orphaned(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM steps WHERE {} AND status = 'running' AND replica IS NOT NULL \
             AND lease_expires_at < ?1 AND NOT EXISTS (SELECT 1 FROM replicas WHERE replicas.id = steps.replica) \
             ORDER BY created_at",
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
                (super::orphaned("*"), ""),
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
                assert_eq!(conn.prepare(sql).unwrap().parameter_count(), 25, "{sql}");
            }
        }
    }
}
