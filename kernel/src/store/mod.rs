//! The store: SQLite behind one writer thread (group commit) and a pool of readers.
//!
//! The store is the system of record. Every write is a typed [`writer::Command`]; the writer folds
//! whatever is queued into one transaction and answers after `COMMIT`, then publishes the
//! committed events to the [`Hub`] so watchers and waiting agents learn of them. Only this module
//! imports rusqlite.

mod cache;
mod chain;
mod checkpoint;
pub mod forward;
mod live;
mod location;
mod lock;
mod ops;
pub mod postgres;
mod reads;
mod recorded;
#[cfg(test)]
mod replayed;
mod rows;
mod schema;
mod sql;
mod sync;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use rusqlite::Connection;
use tokio::sync::oneshot;

pub use crate::machine::command::answer_approval::{Answer, Answered};
pub use crate::machine::command::ask_person::{PersonAsk, PersonAsked};
pub use crate::machine::command::local_step::{StepGate, StepRecorded};
pub use crate::machine::command::lose_lease::LossOutcome;
pub use crate::machine::command::start_subagent::{SubagentStart, SubagentStarted};
pub use crate::machine::command::submit_turn::RecordedTurn;
pub use crate::machine::command::suspend::SuspendReport;
pub use crate::machine::dispatch::{LeaseLoss, ResultReport, StartDispatch};
pub use crate::machine::hosted::{Fence, HostedAgent, LocalStep};
pub use crate::machine::run::{EndRun, NewRun};
pub use crate::machine::turn::unknown_tool_message;
pub use crate::machine::turn::{CallDisposition, CallGate, PlannedCall, TurnPlan};
pub use location::Database;
pub use lock::{DbLock, lock_path};
pub use ops::Published;
pub use reads::{Readers, RunFilter, Served, StoreGauges};
pub use sql::describe as describe_postgres_error;
use writer::Command;
pub use writer::EarlyDispatch;
use writer::WriteConn;

use crate::clock::Clock;
use crate::error::KernelError;
use crate::hub::Hub;
pub use crate::machine::effects::Effect;
use crate::model::{
    AgentDef, ApprovalId, DispatchId, Millis, RunId, RunRecord, SessionId, StepKey, StepRecord, ToolDef,
};

/// How hard each commit waits for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// `synchronous=FULL`: a committed write survives power loss (the default).
    Full,
    /// `synchronous=NORMAL`: faster; in WAL mode a power loss may drop the last commits, a crash
    /// of the kernel process does not.
    Normal,
}

/// What deleting runs removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Deleted {
    pub runs: u64,
    pub events: u64,
    pub steps: u64,
    pub approvals: u64,
    pub cache_entries: u64,
}

impl Deleted {
    pub fn add(&mut self, other: Deleted) {
        self.runs += other.runs;
        self.events += other.events;
        self.steps += other.steps;
        self.approvals += other.approvals;
        self.cache_entries += other.cache_entries;
    }
}

/// The longest key of a tool's cache entry, in bytes.
pub const TOOL_CACHE_MAX_KEY_BYTES: usize = 256;
/// The largest value of a tool's cache entry, in bytes of JSON text.
pub const TOOL_CACHE_MAX_VALUE_BYTES: usize = 1 << 20;

/// One entry of a tool's own cache (`ctx.cache`), to write or replace. The cache is keyed by
/// `(tool, key)` and is not part of any run's log.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ToolCacheSet {
    /// The dispatch that asks, fenced inside the write like a result: an attempt that timed out,
    /// was lost or was superseded writes nothing. Its tool is the namespace, never a name a
    /// worker sends.
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub session_id: SessionId,
    pub key: String,
    /// JSON text.
    pub value: String,
    /// `None` for an entry that never expires.
    pub expires_at: Option<Millis>,
}

impl ToolCacheSet {
    /// Refuses an empty or overlong key and a value that is too big or not JSON.
    pub fn validate(&self) -> Result<(), KernelError> {
        check_tool_cache_key(&self.key)?;
        if self.value.len() > TOOL_CACHE_MAX_VALUE_BYTES {
            return Err(KernelError::invalid(
                "value_json",
                format!(
                    "{} bytes is over the limit of {TOOL_CACHE_MAX_VALUE_BYTES} bytes (1 MiB)",
                    self.value.len()
                ),
            ));
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&self.value)
            .map_err(|e| KernelError::invalid("value_json", format!("not valid JSON: {e}")))?;
        Ok(())
    }
}

/// Refuses a cache key that is empty or longer than [`TOOL_CACHE_MAX_KEY_BYTES`].
pub fn check_tool_cache_key(key: &str) -> Result<(), KernelError> {
    if key.is_empty() || key.len() > TOOL_CACHE_MAX_KEY_BYTES {
        return Err(KernelError::invalid(
            "key",
            format!("must be 1 to {TOOL_CACHE_MAX_KEY_BYTES} bytes, got {}", key.len()),
        ));
    }
    Ok(())
}

/// Where writes of runs go among replicas, once the cluster has set it (shared by the store's
/// handles and its writer).
type Routing = Arc<std::sync::OnceLock<Arc<dyn forward::Router>>>;

/// Where the writer hands each commit's notice for the other replicas, once the cluster's feed
/// has taken them ([`Store::announce_commits`]).
type Notices = Arc<std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<postgres::notice::Notice>>>;

/// A cheap handle on the store.
#[derive(Clone)]
pub struct Store {
    commands: mpsc::Sender<writer::Order>,
    /// Read-only queries.
    pub reads: Readers,
    /// This kernel's replica id, new at every start: the holder of the leases its writer records.
    replica: Arc<str>,
    /// The time every timestamp and deadline is written in.
    clock: Clock,
    /// Who carries out what committed commands leave to do.
    effects: Effects,
    /// Where writes of runs whose shard another replica owns go (replicas only).
    router: Routing,
    /// Where commits' notices go (replicas only).
    notices: Notices,
}

/// Where the writer hands out each commit's effects: to whoever took them ([`Store::on_effects`]),
/// else nowhere.
#[derive(Clone, Default)]
struct Effects(Arc<std::sync::Mutex<Option<EffectSink>>>);

type EffectSink = Box<dyn Fn(Vec<Effect>) + Send>;

impl Effects {
    fn hand_out(&self, effects: Vec<Effect>) {
        if let Some(sink) = self.0.lock().expect("effects poisoned").as_ref() {
            sink(effects);
        }
    }

    /// What the writer does after each commit: publish its events, then hand out its effects.
    fn after_commit(&self, hub: Hub) -> impl Fn(Vec<Published>, Vec<Effect>) + use<> {
        let effects = self.clone();
        move |published, handed| {
            if !published.is_empty() {
                hub.publish_committed(published);
            }
            if !handed.is_empty() {
                effects.hand_out(handed);
            }
        }
    }
}

/// A replica's renewal of its row.
#[derive(Clone, Debug)]
pub struct ReplicaBeat {
    pub started_at: Millis,
    /// JSON: what the replica's worker sessions offer ([`crate::cluster::Offers`]).
    pub offers: String,
    /// Where other replicas and clients reach it.
    pub address: String,
}

/// A replica's row, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRow {
    pub id: String,
    pub started_at: Millis,
    pub heartbeat_at: Millis,
    pub offers: String,
    pub address: String,
}

/// The writer thread; joining it waits for the last batch to commit.
pub struct WriterThread {
    thread: std::thread::JoinHandle<()>,
    ended: tokio_util::sync::CancellationToken,
}

impl WriterThread {
    fn spawn(write: impl FnOnce() + Send + 'static) -> Result<WriterThread, KernelError> {
        let ended = tokio_util::sync::CancellationToken::new();
        // Dropped however the thread ends, a panic included.
        let guard = ended.clone().drop_guard();
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                let _ended = guard;
                write();
            })
            .map_err(|e| KernelError::Store(format!("cannot start the writer thread: {e}")))?;
        Ok(WriterThread { thread, ended })
    }

    /// Completes when the thread has ended: at shutdown once every [`Store`] is dropped, or
    /// earlier if it failed.
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.ended.clone().cancelled_owned()
    }

    /// Waits for the writer to drain and exit (all [`Store`] handles must be dropped first).
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// The writer's connection, migrated (at the configured durability), then left in the mode its
/// batches commit in (see [`sync::SqliteSync`]).
fn open_writer(
    path: &Path,
    durability: Durability,
) -> Result<(Connection, sync::SqliteSync, checkpoint::Checkpoints), Box<dyn std::error::Error>> {
    let mut conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(
        None,
        "synchronous",
        match durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        },
    )?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Each command of a batch runs under a savepoint, whose journal keeps the pages the command
    // changes until it ends; on a file, that journal was written more than the log itself
    // (strace under load: 17 MB of journal writes against 11.6 MB of log in 3 s).
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    schema::migrate(&mut conn)?;
    raise_malloc_trim_threshold(&conn)?;
    let sync = sync::SqliteSync::open(&conn, path, durability == Durability::Full)?;
    let checkpoints = checkpoint::Checkpoints::start(&conn, path)?;
    Ok((conn, sync, checkpoints))
}

/// SQLite allocates through the C library's malloc, not the kernel's allocator. Each command runs
/// under a savepoint whose in-memory journal is freed when it ends, and with glibc's default trim
/// threshold (128 KiB) each such free gave the writer thread's heap back to the system and the
/// next command faulted it in again: about one `madvise` per call, 15% of throughput under load.
/// glibc raises its mmap and trim thresholds when a block it allocated with mmap is freed
/// (mallopt(3), "dynamic mmap threshold"), so one 1 MiB SQLite allocation freed at start lifts the
/// trim threshold to 2 MiB for the life of the process: the churn stays in the heap, and at most
/// that much free memory stays with each C heap. Harmless with another C library.
fn raise_malloc_trim_threshold(conn: &Connection) -> rusqlite::Result<()> {
    const BLOCK: i64 = 1 << 20;
    // `substr` reads the blob, so SQLite materializes it (`length` alone would not).
    conn.query_row("SELECT length(substr(zeroblob(?1), 1, 1))", [BLOCK], |row| {
        row.get::<_, i64>(0)
    })?;
    Ok(())
}

/// The schema versions a migration went between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The schema version before.
    pub from: usize,
    /// The schema version now (this build's newest).
    pub to: usize,
}

/// Brings `db` to this build's newest schema and returns (`kernel migrate`). A SQLite file is
/// claimed first, so no kernel is serving it meanwhile; PostgreSQL migrates under its advisory
/// lock, which replicas starting together take in turn.
pub async fn migrate(db: &Database) -> Result<Migrated, KernelError> {
    match db {
        Database::Sqlite(path) => {
            let _lock = DbLock::acquire(path)?;
            let open = |e: rusqlite::Error| KernelError::Store(format!("cannot open database {}: {e}", path.display()));
            let mut conn = Connection::open(path).map_err(open)?;
            let from: usize = conn
                .query_row("PRAGMA user_version", [], |row| row.get(0))
                .map_err(open)?;
            if from > schema::latest() {
                return Err(KernelError::FailedPrecondition(format!(
                    "the database's schema is at version {from}, newer than this kernel's {}: upgrade the kernel",
                    schema::latest()
                )));
            }
            schema::migrate(&mut conn).map_err(open)?;
            Ok(Migrated {
                from,
                to: schema::latest(),
            })
        }
        Database::Postgres(url) => {
            let target = postgres::Target::with_defaults(url)?;
            let mut client = target.connect(postgres::Role::Migrate, "migrate").await?;
            postgres::migrate(&mut client).await
        }
    }
}

/// A replica id: time-ordered, so the replicas table lists them by age.
fn new_replica_id() -> Arc<str> {
    uuid::Uuid::now_v7().to_string().into()
}

impl Store {
    /// Hands what every commit leaves to do to `carry_out`, from now on (replacing whoever took
    /// it before); the scheduler takes it when it starts.
    pub fn on_effects(&self, carry_out: impl Fn(Vec<Effect>) + Send + 'static) {
        *self.effects.0.lock().expect("effects poisoned") = Some(Box::new(carry_out));
    }

    /// Opens (creating and migrating) the database and starts the writer thread.
    pub fn open(
        path: &Path,
        durability: Durability,
        (hub, clock): (Hub, Clock),
    ) -> Result<(Store, WriterThread), KernelError> {
        let (conn, sync, checkpoints) = open_writer(path, durability)
            .map_err(|e| KernelError::Store(format!("cannot open database {}: {e}", path.display())))?;
        let (commands, receiver) = mpsc::channel();
        let replica = new_replica_id();
        let writer_replica = replica.clone();
        let live = Arc::new(live::LiveRuns::default());
        let writer_live = live.clone();
        let reads = Readers::open(&PathBuf::from(path), Some(live), clock.clone())?;
        let idle_reads = reads.clone();
        let writer_clock = clock.clone();
        let effects = Effects::default();
        let after_commit = effects.after_commit(hub);
        let thread = WriterThread::spawn(move || {
            writer::run(
                WriteConn::Sqlite(conn, sync, checkpoints),
                (&writer_replica, &writer_clock),
                receiver,
                (Some(&writer_live), after_commit),
                move || idle_reads.release_memory(),
            )
        })?;
        Ok((
            Store {
                commands,
                reads,
                replica,
                clock,
                effects,
                router: Default::default(),
                notices: Default::default(),
            },
            thread,
        ))
    }

    /// Opens a PostgreSQL store as a new replica: migrates it (under the migration lock), then
    /// starts the writer thread on its own connection.
    pub async fn open_postgres(
        target: &postgres::Target,
        (hub, clock): (Hub, Clock),
    ) -> Result<(Store, WriterThread), KernelError> {
        let replica = new_replica_id();
        let mut client = target.connect(postgres::Role::Migrate, &replica).await?;
        postgres::migrate(&mut client).await?;
        drop(client);
        let (commands, receiver) = mpsc::channel();
        let (ready, opened) = oneshot::channel();
        let writer_target = target.clone();
        let writer_replica = replica.clone();
        let writer_clock = clock.clone();
        let effects = Effects::default();
        let after_commit = effects.after_commit(hub);
        let router = Routing::default();
        let writer_router = router.clone();
        let notices = Notices::default();
        let writer_notices = notices.clone();
        let live = Arc::new(live::LiveRuns::default());
        let writer_live = live.clone();
        let thread = WriterThread::spawn(move || {
            let conn = match postgres::open_writer(&writer_target, &writer_replica) {
                Ok(conn) => conn,
                Err(error) => {
                    let _ = ready.send(Err(error));
                    return;
                }
            };
            let _ = ready.send(Ok(()));
            writer::run(
                WriteConn::Postgres {
                    conn: Box::new(conn),
                    target: Box::new(writer_target),
                    router: writer_router,
                    notices: writer_notices,
                },
                (&writer_replica, &writer_clock),
                receiver,
                (Some(&writer_live), after_commit),
                || {},
            )
        })?;
        opened
            .await
            .map_err(|_| KernelError::Store("the store writer stopped while opening".into()))??;
        Ok((
            Store {
                commands,
                reads: Readers::open_postgres(target, &replica, (live, clock.clone())),
                replica,
                clock,
                effects,
                router,
                notices,
            },
            thread,
        ))
    }

    /// Opens `db`, whichever backend it names; `bounds` bound a PostgreSQL connection's waits.
    pub async fn open_database(
        db: &Database,
        (durability, bounds): (Durability, postgres::Bounds),
        shared: (Hub, Clock),
    ) -> Result<(Store, WriterThread), KernelError> {
        match db {
            Database::Sqlite(path) => Store::open(path, durability, shared),
            Database::Postgres(url) => Store::open_postgres(&postgres::Target::new(url, bounds)?, shared).await,
        }
    }

    /// The schema version this build writes.
    pub fn schema_version() -> usize {
        schema::latest()
    }

    /// Hands every later commit's notice of what it wrote to `sink`, which sends them to the
    /// other replicas (PostgreSQL; on SQLite nothing is committed that another process reads).
    pub fn announce_commits(&self, sink: tokio::sync::mpsc::UnboundedSender<postgres::notice::Notice>) {
        let _ = self.notices.set(sink);
    }

    /// This kernel's replica id.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The clock this store writes its timestamps on, which every deadline is measured by.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Claims at most `limit` waiting calls of `tools` (or runs of `agents`) no other replica
    /// claimed lately, oldest first, for this replica's sessions.
    pub async fn claim_pending(
        &self,
        tools: Vec<String>,
        agents: Vec<String>,
        limit: usize,
    ) -> Result<Vec<StepRecord>, KernelError> {
        self.send(|reply| Command::ClaimPending {
            tools,
            agents,
            limit,
            reply,
        })
        .await
    }

    /// Renews this replica's row.
    pub async fn beat(&self, beat: ReplicaBeat) -> Result<(), KernelError> {
        self.send(|reply| Command::Beat(beat, reply)).await
    }

    /// Takes and gives back shards as `moves` says, each only at the epoch it was read at (with
    /// `all`, gives back every shard this replica owns); the shards taken, with their new epochs.
    pub async fn move_shards(
        &self,
        moves: crate::cluster::shards::Moves,
        all: bool,
    ) -> Result<Vec<(u32, i64)>, KernelError> {
        self.send(|reply| Command::MoveShards { moves, all, reply }).await
    }

    /// Removes a replica's row (with `heartbeat_at`, only if it has not beaten again since); whether
    /// one was removed.
    pub async fn forget_replica(&self, id: String, heartbeat_at: Option<Millis>) -> Result<bool, KernelError> {
        self.send(|reply| Command::ForgetReplica {
            id,
            heartbeat_at,
            reply,
        })
        .await
    }

    async fn send<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, KernelError>>) -> Command,
    ) -> Result<T, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(writer::Order::Write(make(reply)))
            .map_err(|_| KernelError::Unavailable("the store writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the store writer has stopped".into()))?
    }

    pub async fn create_run(&self, new: NewRun) -> Result<(RunRecord, bool), KernelError> {
        let (run, created, _) = self.create_run_dispatching(new).await?;
        Ok((run, created))
    }

    /// Creates a run; a new hosted one comes back with its pending dispatch, to queue.
    pub async fn create_run_dispatching(
        &self,
        mut new: NewRun,
    ) -> Result<(RunRecord, bool, Option<StepRecord>), KernelError> {
        let Some(router) = self.router.get() else {
            return self.send(|reply| Command::CreateRun(Box::new(new), reply)).await;
        };
        // Made in a shard this replica owns, when nothing else places it: nothing to forward.
        let shard = match crate::machine::command::create_run::shard(&new) {
            Some(shard) => shard,
            None => match router.home() {
                Some(home) => {
                    new.home = Some(home);
                    home
                }
                None => crate::cluster::shards::shard_of(&RunId::new()),
            },
        };
        self.write(
            shard,
            new,
            |new| forward::Forwarded::CreateRun(Box::new(new)),
            |mut new, reply| {
                new.home.get_or_insert(shard);
                Command::CreateRun(Box::new(new), reply)
            },
        )
        .await
    }

    /// Records a turn: each call's disposition, and what ended with the run when the turn ended
    /// it (a branch's refusal), to cancel on workers.
    pub async fn record_turn(&self, plan: TurnPlan) -> Result<RecordedTurn, KernelError> {
        let shard = crate::cluster::shards::shard_of(&plan.run_id);
        self.write(
            shard,
            plan,
            |mut plan| {
                // The slots reserved for its calls are this replica's: the owner queues them.
                plan.calls.iter_mut().for_each(|call| call.start = None);
                forward::Forwarded::Turn(Box::new(plan))
            },
            |plan, reply| Command::ScheduleTurn(Box::new(plan), None, reply),
        )
        .await
    }

    /// Records a turn as [`Store::record_turn`] does; `early` is handed the calls it started that
    /// may go out before their start commits (`machine::durability::dispatches_before_commit`), once the write
    /// decided them and before it commits.
    pub async fn record_turn_dispatching(
        &self,
        plan: TurnPlan,
        early: EarlyDispatch,
    ) -> Result<RecordedTurn, KernelError> {
        // Among replicas, a turn whose shard moved meanwhile goes to its owner without its slots.
        let kept = self.router.get().map(|_| plan.clone());
        match self
            .send(|reply| Command::ScheduleTurn(Box::new(plan), Some(early), reply))
            .await
        {
            Err(KernelError::Moved(_)) if let Some(plan) = kept => self.record_turn(plan).await,
            answer => answer,
        }
    }

    /// Records a turn of a run that no turn can end (no branch, no case run), for tests.
    #[cfg(test)]
    pub async fn schedule_turn(&self, plan: TurnPlan) -> Result<Vec<CallDisposition>, KernelError> {
        let recorded = self.record_turn(plan).await?;
        assert!(recorded.ended.is_empty(), "the turn ended its run: use record_turn");
        Ok(recorded.calls)
    }

    /// Records `tool:start`; `None` when the step is no longer pending (settled meanwhile). The
    /// command is queued to the writer when this is called, not when the future is first polled:
    /// starts asked for in one order commit in that order.
    pub fn start_dispatch(
        &self,
        start: StartDispatch,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<StepRecord>, KernelError>> + Send + 'static>>
    {
        let store = self.clone();
        if !self.owns(&start.run_id) {
            return Box::pin(async move {
                let shard = crate::cluster::shards::shard_of(&start.run_id);
                store
                    .write(shard, start, forward::Forwarded::Start, |start, reply| {
                        Command::StartDispatch(Box::new(start), reply)
                    })
                    .await
            });
        }
        let kept = self.router.get().map(|_| start.clone());
        let (reply, answer) = oneshot::channel();
        let sent = self
            .commands
            .send(writer::Order::Write(Command::StartDispatch(Box::new(start), reply)));
        Box::pin(async move {
            let stopped = || KernelError::Unavailable("the store writer has stopped".into());
            sent.map_err(|_| stopped())?;
            match answer.await.map_err(|_| stopped())? {
                Err(KernelError::Moved(_)) if let Some(start) = kept => {
                    let shard = crate::cluster::shards::shard_of(&start.run_id);
                    store
                        .write(shard, start, forward::Forwarded::Start, |start, reply| {
                            Command::StartDispatch(Box::new(start), reply)
                        })
                        .await
                }
                answer => answer,
            }
        })
    }

    /// Records a worker's result, fenced by dispatch, attempt and session; `None` when stale.
    pub async fn record_result(&self, report: ResultReport) -> Result<Option<StepRecord>, KernelError> {
        Ok(self.record_outcome(report).await?.map(|(step, _)| step))
    }

    /// Records a worker's result as [`Store::record_result`] does, with the steps it cancelled:
    /// a hosted handler's outcome ends its run, and what the handler left in flight is cancelled.
    pub async fn record_outcome(
        &self,
        report: ResultReport,
    ) -> Result<Option<(StepRecord, Vec<StepRecord>)>, KernelError> {
        let shard = report.dispatch_id.shard();
        self.write(shard, report, forward::Forwarded::Result, Command::RecordResult)
            .await
    }

    /// Records a hosted handler's finished local step, fenced by the run's dispatch, as its
    /// check allowed it or, unchecked, as `gate` says; see [`crate::machine::command::local_step`].
    pub async fn record_step(
        &self,
        (run, fence): (RunId, Fence),
        local: LocalStep,
        gate: StepGate,
    ) -> Result<StepRecorded, KernelError> {
        let shard = crate::cluster::shards::shard_of(&run);
        self.write(
            shard,
            (run, fence, Box::new((local, gate))),
            |(run, fence, step)| forward::Forwarded::RecordStep(run, fence, step),
            |(run, fence, step), reply| Command::RecordStep(run, fence, step, reply),
        )
        .await
    }

    /// Asks whether a local step may run, before it runs (fenced): the policy's `gate`, then a
    /// branch's rule; see [`crate::machine::command::local_step`].
    pub async fn check_step(
        &self,
        (run, fence): (RunId, Fence),
        local: LocalStep,
        gate: StepGate,
    ) -> Result<StepRecorded, KernelError> {
        let shard = crate::cluster::shards::shard_of(&run);
        self.write(
            shard,
            (run, fence, Box::new((local, gate))),
            |(run, fence, step)| forward::Forwarded::CheckStep(run, fence, step),
            |(run, fence, step), reply| Command::CheckStep(run, fence, step, reply),
        )
        .await
    }

    /// Suspends a hosted handler's dispatch (fenced); `None` when it no longer held its run.
    pub async fn suspend_dispatch(&self, report: SuspendReport) -> Result<Option<StepRecord>, KernelError> {
        let shard = report.dispatch_id.shard();
        self.write(shard, report, forward::Forwarded::Suspend, Command::SuspendDispatch)
            .await
    }

    /// Starts a hosted handler's subagent, or returns the one recorded at its place.
    pub async fn start_subagent(&self, start: SubagentStart) -> Result<SubagentStarted, KernelError> {
        let shard = crate::cluster::shards::shard_of(&start.parent);
        self.write(
            shard,
            start,
            |start| forward::Forwarded::StartSubagent(Box::new(start)),
            |start, reply| Command::StartSubagent(Box::new(start), reply),
        )
        .await
    }

    /// Records a tool body's question to a person, or returns the one recorded at its identity.
    pub async fn ask_person(&self, ask: PersonAsk) -> Result<PersonAsked, KernelError> {
        let shard = crate::cluster::shards::shard_of(&ask.run);
        self.write(
            shard,
            ask,
            |ask| forward::Forwarded::AskPerson(Box::new(ask)),
            |ask, reply| Command::AskPerson(Box::new(ask), reply),
        )
        .await
    }

    /// Keeps the agents a worker offers, so runs created while none is connected are hosted.
    pub async fn register_agents(&self, agents: Vec<AgentDef>) -> Result<(), KernelError> {
        self.send(|reply| Command::RegisterAgents(agents, reply)).await
    }

    pub async fn lose_lease(&self, loss: LeaseLoss) -> Result<LossOutcome, KernelError> {
        let shard = loss.dispatch_id.shard();
        self.write(shard, loss, forward::Forwarded::LoseLease, Command::LoseLease)
            .await
    }

    /// Fails a running dispatch that outlived its timeout; `None` when it no longer held the step.
    pub async fn time_out(&self, dispatch_id: DispatchId, attempt: u32) -> Result<Option<StepRecord>, KernelError> {
        let shard = dispatch_id.shard();
        self.write(
            shard,
            dispatch_id,
            |id| forward::Forwarded::TimeOut(id, attempt),
            |dispatch_id, reply| Command::TimeOut {
                dispatch_id,
                attempt,
                reply,
            },
        )
        .await
    }

    /// Fails a step that is still waiting for a worker, saying why (`reason` in its event) and with
    /// which outcome.
    pub async fn fail_pending(
        &self,
        run: RunId,
        key: StepKey,
        message: String,
        (reason, outcome): (&'static str, crate::model::Outcome),
    ) -> Result<Option<StepRecord>, KernelError> {
        let shard = crate::cluster::shards::shard_of(&run);
        self.write(
            shard,
            (run, key, message),
            |(run, key, message)| forward::Forwarded::FailPending {
                run,
                key,
                message,
                reason,
                outcome,
            },
            |(run, key, message), reply| Command::FailPending {
                run,
                key,
                message,
                reason,
                outcome,
                reply,
            },
        )
        .await
    }

    /// Ends a run; failing or cancelling settles its in-flight steps first and returns them.
    pub async fn end_run(&self, run: RunId, end: EndRun) -> Result<(RunRecord, Vec<StepRecord>), KernelError> {
        let shard = crate::cluster::shards::shard_of(&run);
        self.write(
            shard,
            (run, end),
            |(run, end)| forward::Forwarded::EndRun(run, end),
            |(run, end), reply| Command::EndRun(run, end, reply),
        )
        .await
    }

    /// Cancels call `key` of `run` for `reason`, leaving the run going; returns the settled step,
    /// to cancel on its worker.
    pub async fn cancel_call(&self, run: RunId, key: StepKey, reason: String) -> Result<StepRecord, KernelError> {
        let shard = crate::cluster::shards::shard_of(&run);
        self.write(
            shard,
            (run, key, reason),
            |(run, key, reason)| forward::Forwarded::CancelCall(run, key, reason),
            |(run, key, reason), reply| Command::CancelCall(run, key, reason, reply),
        )
        .await
    }

    /// Fails up to `limit` external agents' runs that made no turn for `after_ms` as abandoned;
    /// returns each with the steps settled on the way, to cancel on their workers.
    pub async fn abandon_runs(
        &self,
        after_ms: u64,
        limit: usize,
    ) -> Result<Vec<(RunRecord, Vec<StepRecord>)>, KernelError> {
        self.send(|reply| Command::AbandonRuns(after_ms, limit, reply)).await
    }

    /// Answers a pending approval, as `decider`.
    pub async fn answer_approval(
        &self,
        id: ApprovalId,
        answer: Answer,
        decider: String,
        reason: Option<String>,
    ) -> Result<Answered, KernelError> {
        let answer_here = |(id, decider, reason), reply| Command::AnswerApproval {
            id,
            answer: answer.clone(),
            decider,
            reason,
            reply,
        };
        // Its run's shard, read: an approval asked before ids named their shard is answered too.
        let approval = match self.router.get() {
            Some(_) => self.reads.approval(id.clone()).await?,
            None => None,
        };
        let Some(approval) = approval else {
            return self.send(|reply| answer_here((id, decider, reason), reply)).await;
        };
        let shard = crate::cluster::shards::shard_of(&approval.run_id);
        self.write(
            shard,
            (id, decider, reason),
            |(id, decider, reason)| forward::Forwarded::AnswerApproval {
                id,
                answer: answer.clone(),
                decider,
                reason,
            },
            answer_here,
        )
        .await
    }

    /// Tells the writer to commit what is queued and exit, even while other handles on the store
    /// remain: the kernel is stopping, and a command sent after this fails as unavailable.
    pub fn stop_writer(&self) {
        let _ = self.commands.send(writer::Order::Stop);
    }

    /// Counts a replay of these settled steps. The results served are durable already, so the
    /// caller does not wait for this commit.
    pub fn note_replays(&self, run: RunId, keys: Vec<StepKey>) {
        if self.router.get().is_some() {
            let store = self.clone();
            let shard = crate::cluster::shards::shard_of(&run);
            tokio::spawn(async move {
                let noted = store
                    .write(
                        shard,
                        (run, keys),
                        |(run, keys)| forward::Forwarded::NoteReplays(run, keys),
                        |(run, keys), reply| Command::NoteReplays(run, keys, reply),
                    )
                    .await;
                if let Err(error) = noted {
                    tracing::debug!(%error, "replays not counted");
                }
            });
            return;
        }
        let (reply, _) = oneshot::channel();
        let _ = self
            .commands
            .send(writer::Order::Write(Command::NoteReplays(run, keys, reply)));
    }

    /// Expires every pending approval whose deadline has passed.
    pub async fn expire_approvals(&self) -> Result<Answered, KernelError> {
        self.send(Command::ExpireApprovals).await
    }

    pub async fn register_tools(&self, tools: Vec<ToolDef>) -> Result<(), KernelError> {
        self.send(|reply| Command::RegisterTools(tools, reply)).await
    }

    /// Deletes a finished run with its events, steps, approvals and its calls' cached results.
    pub async fn delete_run(&self, run: RunId) -> Result<Deleted, KernelError> {
        let shard = crate::cluster::shards::shard_of(&run);
        self.write(shard, run, forward::Forwarded::DeleteRun, Command::DeleteRun)
            .await
    }

    /// Deletes up to `limit` runs that finished before `finished_before` (oldest first).
    pub async fn prune_runs(&self, finished_before: Millis, limit: usize) -> Result<Deleted, KernelError> {
        self.send(|reply| Command::PruneRuns(finished_before, limit, reply))
            .await
    }

    /// Deletes registered tools with their cached results and `ctx.cache` entries; returns the
    /// names that were registered. Recorded calls of them stay in their runs.
    pub async fn forget_tools(&self, names: Vec<String>) -> Result<Vec<String>, KernelError> {
        self.send(|reply| Command::ForgetTools(names, reply)).await
    }

    /// Deletes up to `limit` expired entries of each cache; returns how many went.
    pub async fn purge_expired(&self, limit: usize) -> Result<usize, KernelError> {
        self.send(|reply| Command::PurgeExpired(limit, reply)).await
    }

    /// Writes (or replaces) an entry of a tool's cache; a refused entry is never queued.
    pub async fn tool_cache_set(&self, set: ToolCacheSet) -> Result<(), KernelError> {
        set.validate()?;
        let shard = set.dispatch_id.shard();
        self.write(shard, set, forward::Forwarded::ToolCacheSet, Command::ToolCacheSet)
            .await
    }
}

#[cfg(test)]
mod tests;
