//! The one writer thread. It owns the only write connection, takes typed commands over a
//! channel, applies everything queued as one transaction (group commit), and answers each command
//! only after the commit, so a reply always means "committed" and, but for a command that only
//! starts `safe_to_retry` calls (see [`super::sync`]), "durable". One refused command does not
//! undo its batch-mates: each command of a batch of several runs under its own savepoint, but
//! for the hot path's turns and results on SQLite, which refuse before they write and so need
//! none (see [`Isolation`]).

use std::cell::RefCell;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};

use tokio::sync::oneshot;

use super::cache::Cache;
use super::checkpoint::Checkpoints;
use super::live::LiveRuns;
use super::ops::{self, Published, Tx};
use super::sql::{Connection, PgConn};
use super::sync::SqliteSync;
use super::{
    Answer, Answered, EndRun, Fence, LeaseLoss, LocalStep, LossOutcome, NewRun, PersonAsk, PersonAsked, ResultReport,
    StartDispatch, StepGate, StepRecorded, SubagentStart, SubagentStarted, SuspendReport, TurnPlan,
};
use crate::clock::Clock;
use crate::error::KernelError;
use crate::machine::command::{self, Records};
use crate::machine::durability::must_sync;
use crate::machine::effects::Effect;
use crate::model::{AgentDef, ApprovalId, DispatchId, RunId, RunRecord, StepKey, StepKind, StepRecord, ToolDef};

/// The most commands folded into one transaction; bounds the latency of a batch.
const MAX_BATCH: usize = 512;

/// The most on PostgreSQL, where each command that writes has a savepoint, a subtransaction:
/// past 64 in one transaction a server keeps them outside its shared memory, and every snapshot
/// taken meanwhile, by any replica, looks them up on disk.
const MAX_PG_BATCH: usize = 60;

type Reply<T> = oneshot::Sender<Result<T, KernelError>>;

/// Sends a turn's started calls to their workers before the commit that starts them (see
/// `store::sync`); runs on the writer thread, so it must not block.
pub type EarlyDispatch = Box<dyn FnOnce(Vec<StepRecord>) + Send>;

/// What a command leaves to do once its batch is about to commit, or once it has committed: a
/// turn's started calls handed to their workers (see [`EarlyDispatch`]).
struct Handout {
    hand: Box<dyn FnOnce() + Send>,
    /// Only once the commit is done: the calls a budget paid for, so that none runs unpaid
    /// should the kernel die before its charge commits.
    after_commit: bool,
}

/// A write the store can perform.
pub enum Command {
    CreateRun(Box<NewRun>, Reply<(RunRecord, bool, Option<StepRecord>)>),
    ScheduleTurn(Box<TurnPlan>, Option<EarlyDispatch>, Reply<super::RecordedTurn>),
    StartDispatch(Box<StartDispatch>, Reply<Option<StepRecord>>),
    RecordResult(ResultReport, Reply<Option<(StepRecord, Vec<StepRecord>)>>),
    LoseLease(LeaseLoss, Reply<LossOutcome>),
    TimeOut {
        dispatch_id: DispatchId,
        attempt: u32,
        reply: Reply<Option<StepRecord>>,
    },
    FailPending {
        run: RunId,
        key: StepKey,
        message: String,
        reason: &'static str,
        outcome: crate::model::Outcome,
        reply: Reply<Option<StepRecord>>,
    },
    EndRun(RunId, EndRun, Reply<(RunRecord, Vec<StepRecord>)>),
    /// Cancels one call of a run for a reason; the run goes on.
    CancelCall(RunId, StepKey, String, Reply<StepRecord>),
    /// Fails at most this many runs idle for this many milliseconds as abandoned.
    AbandonRuns(u64, usize, Reply<Vec<(RunRecord, Vec<StepRecord>)>>),
    RegisterTools(Vec<ToolDef>, Reply<()>),
    ForgetTools(Vec<String>, Reply<Vec<String>>),
    DeleteRun(RunId, Reply<super::Deleted>),
    /// Deletes at most this many runs finished before this time.
    PruneRuns(crate::model::Millis, usize, Reply<super::Deleted>),
    AnswerApproval {
        id: ApprovalId,
        answer: Answer,
        decider: String,
        reason: Option<String>,
        reply: Reply<Answered>,
    },
    ExpireApprovals(Reply<Answered>),
    NoteReplays(RunId, Vec<StepKey>, Reply<()>),
    ToolCacheSet(super::ToolCacheSet, Reply<()>),
    /// Deletes at most this many expired entries of each cache.
    PurgeExpired(usize, Reply<usize>),
    RecordStep(RunId, Fence, Box<(LocalStep, StepGate)>, Reply<StepRecorded>),
    CheckStep(RunId, Fence, Box<(LocalStep, StepGate)>, Reply<StepRecorded>),
    RegisterAgents(Vec<AgentDef>, Reply<()>),
    SuspendDispatch(SuspendReport, Reply<Option<StepRecord>>),
    StartSubagent(Box<SubagentStart>, Reply<SubagentStarted>),
    AskPerson(Box<PersonAsk>, Reply<PersonAsked>),
    /// Renews this replica's row (the age of every lease it holds) with what its sessions offer.
    Beat(super::ReplicaBeat, Reply<()>),
    /// Claims waiting calls of these tools and agents, at most this many.
    ClaimPending {
        tools: Vec<String>,
        agents: Vec<String>,
        limit: usize,
        reply: Reply<Vec<StepRecord>>,
    },
    /// Takes and gives back shards (every shard this replica owns, with `all`).
    MoveShards {
        moves: crate::cluster::shards::Moves,
        all: bool,
        reply: Reply<Vec<(u32, i64)>>,
    },
    /// Removes a replica's row; with `heartbeat_at`, only if it has not beaten again since.
    ForgetReplica {
        id: String,
        heartbeat_at: Option<crate::model::Millis>,
        reply: Reply<bool>,
    },
}

impl Command {
    /// The shard of the run the command writes, for a command of one run: among replicas only
    /// the shard's owner applies it. `None` for the writes of no one run (claims, sweeps, the
    /// registry, replicas' rows), which take care of shards themselves or touch none.
    fn shard(&self) -> Option<u32> {
        use crate::cluster::shards::shard_of;
        match self {
            Command::CreateRun(new, _) => crate::machine::command::create_run::shard(new).or(new.home),
            Command::ScheduleTurn(plan, ..) => Some(shard_of(&plan.run_id)),
            Command::StartDispatch(start, _) => Some(shard_of(&start.run_id)),
            Command::RecordResult(report, _) => Some(report.dispatch_id.shard()),
            Command::LoseLease(loss, _) => Some(loss.dispatch_id.shard()),
            Command::TimeOut { dispatch_id, .. } => Some(dispatch_id.shard()),
            Command::SuspendDispatch(report, _) => Some(report.dispatch_id.shard()),
            Command::ToolCacheSet(set, _) => Some(set.dispatch_id.shard()),
            Command::FailPending { run, .. }
            | Command::EndRun(run, ..)
            | Command::CancelCall(run, ..)
            | Command::DeleteRun(run, _)
            | Command::NoteReplays(run, ..)
            | Command::RecordStep(run, ..)
            | Command::CheckStep(run, ..) => Some(shard_of(run)),
            Command::StartSubagent(start, _) => Some(shard_of(&start.parent)),
            Command::AskPerson(ask, _) => Some(shard_of(&ask.run)),
            Command::AnswerApproval { .. }
            | Command::AbandonRuns(..)
            | Command::RegisterTools(..)
            | Command::ForgetTools(..)
            | Command::PruneRuns(..)
            | Command::ExpireApprovals(_)
            | Command::PurgeExpired(..)
            | Command::RegisterAgents(..)
            | Command::Beat(..)
            | Command::ClaimPending { .. }
            | Command::MoveShards { .. }
            | Command::ForgetReplica { .. } => None,
        }
    }

    /// Whether the command only marks rows of any shard for this replica (a claim: the start
    /// that follows goes to the owner), so the runs it names need not be this replica's.
    fn claims_only(&self) -> bool {
        matches!(self, Command::ClaimPending { .. })
    }

    /// Whether the command changes the tool or agent registry, which other replicas reload.
    fn changes_registry(&self) -> bool {
        matches!(
            self,
            Command::RegisterTools(..) | Command::ForgetTools(..) | Command::RegisterAgents(..)
        )
    }

    /// Whether the command writes only notes when it appends no event: a count of replays, a
    /// local step's allowance ([`crate::machine::durability::must_sync`]).
    fn notes_only(&self) -> bool {
        matches!(self, Command::NoteReplays(..) | Command::CheckStep(..))
    }

    /// Whether the command refuses only before its first write, so it can run without a
    /// savepoint of its own. A turn's refusals (an unknown run, a fence, a limit) and a result's
    /// (a stale attempt) are all decided by reads; the one exception, a turn whose call finds its
    /// resource instance locked by another kernel on the file, is caught by counting changes.
    fn decides_before_writing(&self) -> bool {
        matches!(self, Command::ScheduleTurn(..) | Command::RecordResult(..))
    }
}

/// Sends a command's answer once its batch has committed (or failed to).
type Responder = Box<dyn FnOnce(Option<&Failed>) + Send>;

/// Why a command's writes did not commit.
struct Failed {
    message: String,
    /// The connection to the database dropped: the caller may try again, here or elsewhere.
    unreachable: bool,
    /// A shard the batch wrote is no longer this replica's: nothing was written, and the caller
    /// sends the write to the new owner.
    moved: bool,
}

impl Failed {
    fn error(&self) -> KernelError {
        match (self.moved, self.unreachable) {
            (true, _) => KernelError::Moved(self.message.clone()),
            (false, true) => KernelError::Unavailable(format!("commit failed: {}", self.message)),
            (false, false) => KernelError::Store(format!("commit failed: {}", self.message)),
        }
    }
}

/// Wraps a command's result into its responder, and says whether the command succeeded.
fn respond<T: Send + 'static>(result: Result<T, KernelError>, reply: Reply<T>) -> (Responder, bool) {
    let ok = result.is_ok();
    let responder: Responder = Box::new(move |commit_error| {
        let answer = match commit_error {
            Some(failed) => Err(failed.error()),
            None => result,
        };
        // The caller may have gone away; the write stands either way.
        let _ = reply.send(answer);
    });
    (responder, ok)
}

/// Applies `command`; what it leaves to hand out at the commit goes to `handout`.
fn apply(tx: &mut Tx<'_>, command: Command, handout: &mut Option<Handout>) -> (Responder, bool) {
    match command {
        Command::CreateRun(new, reply) => respond(command::create_run::apply(tx, *new), reply),
        Command::ScheduleTurn(plan, early, reply) => {
            let recorded = command::submit_turn::apply(tx, *plan);
            if let (Some(early), Ok(recorded)) = (early, &recorded) {
                let steps = crate::machine::durability::dispatches_before_commit(&recorded.calls);
                if !steps.is_empty() {
                    *handout = Some(Handout {
                        hand: Box::new(move || early(steps)),
                        after_commit: recorded.paid,
                    });
                }
            }
            respond(recorded, reply)
        }
        Command::StartDispatch(start, reply) => respond(command::start::apply(tx, *start), reply),
        Command::RecordResult(report, reply) => respond(command::result::apply(tx, report), reply),
        Command::LoseLease(loss, reply) => respond(command::lose_lease::apply(tx, loss), reply),
        Command::TimeOut {
            dispatch_id,
            attempt,
            reply,
        } => respond(command::time_out::time_out(tx, &dispatch_id, attempt), reply),
        Command::FailPending {
            run,
            key,
            message,
            reason,
            outcome,
            reply,
        } => respond(
            command::time_out::fail_pending(tx, (&run, &key), &message, (reason, outcome)),
            reply,
        ),
        Command::EndRun(run, end, reply) => respond(command::end_run::end(tx, &run, end), reply),
        Command::CancelCall(run, key, reason, reply) => {
            respond(command::cancel_call::cancel(tx, (&run, &key), &reason), reply)
        }
        Command::AbandonRuns(after_ms, limit, reply) => respond(command::end_run::abandon(tx, after_ms, limit), reply),
        Command::RegisterTools(tools, reply) => respond(ops::register_tools(tx, tools), reply),
        Command::ForgetTools(names, reply) => respond(ops::forget_tools(tx, &names), reply),
        Command::DeleteRun(run, reply) => respond(command::delete::delete(tx, &run), reply),
        Command::PruneRuns(before, limit, reply) => respond(command::delete::prune(tx, before, limit), reply),
        Command::AnswerApproval {
            id,
            answer,
            decider,
            reason,
            reply,
        } => respond(
            command::answer_approval::answer(tx, &id, answer, (&decider, reason.as_deref())),
            reply,
        ),
        Command::ExpireApprovals(reply) => respond(command::answer_approval::expire(tx), reply),
        Command::NoteReplays(run, keys, reply) => respond(tx.note_replays(&run, &keys), reply),
        Command::ToolCacheSet(set, reply) => respond(command::tool_cache::set(tx, set), reply),
        Command::PurgeExpired(limit, reply) => respond(ops::purge_expired(tx, limit), reply),
        Command::RecordStep(run, fence, step, reply) => {
            let (local, gate) = *step;
            respond(command::local_step::record(tx, (&run, &fence), local, gate), reply)
        }
        Command::CheckStep(run, fence, step, reply) => {
            let (local, gate) = *step;
            respond(command::local_step::check(tx, (&run, &fence), local, gate), reply)
        }
        Command::RegisterAgents(agents, reply) => respond(ops::register_agents(tx, agents), reply),
        Command::SuspendDispatch(report, reply) => respond(command::suspend::apply(tx, report), reply),
        Command::StartSubagent(start, reply) => respond(command::start_subagent::apply(tx, *start), reply),
        Command::AskPerson(ask, reply) => respond(command::ask_person::apply(tx, *ask), reply),
        Command::Beat(beat, reply) => respond(ops::beat(tx, beat), reply),
        Command::ClaimPending {
            tools,
            agents,
            limit,
            reply,
        } => respond(ops::claim_pending(tx, &tools, &agents, limit), reply),
        Command::ForgetReplica {
            id,
            heartbeat_at,
            reply,
        } => respond(ops::forget_replica(tx, &id, heartbeat_at), reply),
        Command::MoveShards { moves, all, reply } => respond(ops::move_shards(tx, &moves, all), reply),
    }
}

/// The writer's one connection, on either backend.
pub enum WriteConn {
    Sqlite(rusqlite::Connection, SqliteSync, Checkpoints),
    Postgres {
        conn: Box<PgConn>,
        target: Box<super::postgres::Target>,
        /// Which shards this replica owns, once the cluster has started.
        router: super::Routing,
        /// Where committed notices go, to be sent to the other replicas, once the cluster has
        /// started.
        notices: super::Notices,
    },
}

impl WriteConn {
    /// A PostgreSQL connection that dropped (the server restarted, the network went) is made
    /// again; until then every batch is refused as unavailable.
    fn ensure_open(&mut self, cache: &RefCell<Cache>, replica: &str) -> Result<(), String> {
        if let WriteConn::Postgres { conn, target, .. } = self
            && conn.is_closed()
        {
            cache.borrow_mut().clear();
            let reopened = super::postgres::open_writer(target, replica).map_err(|e| e.to_string())?;
            tracing::info!("store writer reconnected to postgresql");
            **conn = reopened;
        }
        Ok(())
    }

    /// Frees the pages SQLite caches for this connection (read again from the file, or the
    /// system's cache of it, when next needed); a PostgreSQL connection caches none here.
    fn release_memory(&self) {
        if let WriteConn::Sqlite(conn, ..) = self
            && let Err(error) = conn.release_memory()
        {
            tracing::debug!(%error, "store writer kept its page cache");
        }
    }

    /// Runs transaction control statements.
    fn batch(&self, sql: &str) -> Result<(), String> {
        super::sql::count_statement();
        match self {
            WriteConn::Sqlite(conn, ..) => conn.execute_batch(sql).map_err(|e| e.to_string()),
            WriteConn::Postgres { conn, .. } => conn.batch(sql).map_err(|e| e.to_string()),
        }
    }

    /// How command `index` of a batch of `commands` is kept apart from its batch-mates.
    fn isolation(&self, command: &Command, (index, commands): (usize, usize)) -> Isolation {
        match self {
            WriteConn::Sqlite(..) if commands == 1 => Isolation::Alone,
            WriteConn::Sqlite(conn, ..) if command.decides_before_writing() => {
                Isolation::Unguarded(conn.total_changes())
            }
            WriteConn::Sqlite(..) => Isolation::Savepoint,
            WriteConn::Postgres { .. } => Isolation::Command(index),
        }
    }

    /// Opens the command's savepoint, if it has one; on PostgreSQL it goes out with the
    /// command's first statement.
    fn savepoint(&self, isolation: Isolation) -> Result<(), String> {
        match (self, isolation) {
            (WriteConn::Sqlite(..), Isolation::Savepoint) => self.batch(SAVEPOINT),
            (WriteConn::Postgres { conn, .. }, Isolation::Command(index)) => {
                conn.begin_command(index);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Ends a command that succeeded. On SQLite its writes are done; on PostgreSQL its release
    /// goes out with the next statement waited for, and a write of it that fails then undoes it
    /// alone ([`WriteConn::undone`]).
    fn release(&self, isolation: Isolation) -> Result<(), String> {
        match (self, isolation) {
            (WriteConn::Sqlite(..), Isolation::Savepoint) => {
                let released = self.batch(RELEASE);
                if released.is_err() {
                    self.undo(isolation);
                }
                released
            }
            (WriteConn::Postgres { conn, .. }, _) => {
                conn.end_command();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Undoes a command that failed (nothing to undo on the server if its savepoint never left).
    /// An unguarded command has nothing to undo once [`WriteConn::wrote_since`] says it wrote
    /// nothing; one that wrote cannot be undone alone (see [`Spoiled`]).
    fn undo(&self, isolation: Isolation) {
        match (self, isolation) {
            (WriteConn::Sqlite(..), Isolation::Unguarded(_)) => {}
            // The batch goes on to commit an empty transaction, as a batch whose every command
            // was refused does.
            (WriteConn::Sqlite(..), Isolation::Alone) => self.restart(),
            (WriteConn::Sqlite(..), _) => {
                let _ = self.batch("ROLLBACK TO SAVEPOINT command");
                let _ = self.batch(RELEASE);
            }
            (WriteConn::Postgres { conn, .. }, _) => {
                let _ = conn.undo_command();
            }
        }
    }

    /// Rolls the SQLite transaction back and begins another.
    fn restart(&self) {
        let _ = self.batch("ROLLBACK");
        let _ = self.batch("BEGIN IMMEDIATE");
    }

    /// Whether an unguarded command changed any row since it began.
    fn wrote_since(&self, isolation: Isolation) -> bool {
        match (self, isolation) {
            (WriteConn::Sqlite(conn, ..), Isolation::Unguarded(before)) => conn.total_changes() != before,
            _ => false,
        }
    }

    /// After a batch's last command: sends what waits to go out, and names each command undone
    /// after it ended because one of its writes failed, with the error ([`WriteConn::undone`]).
    fn flush(&self) -> Result<Vec<(usize, String)>, String> {
        match self {
            WriteConn::Sqlite(..) => Ok(Vec::new()),
            WriteConn::Postgres { conn, .. } => {
                let flushed = conn.flush();
                let undone = conn.take_undone();
                flushed.map(|()| undone).map_err(|e| e.to_string())
            }
        }
    }

    /// Each command of the batch so far found undone after it ended because one of its writes
    /// failed (on PostgreSQL, whose writes go out with a later statement), with the error: it and
    /// every command after it were undone ([`PgConn::take_undone`]).
    fn undone(&self) -> Vec<(usize, String)> {
        match self {
            WriteConn::Sqlite(..) => Vec::new(),
            WriteConn::Postgres { conn, .. } => conn.take_undone(),
        }
    }

    fn is_closed(&self) -> bool {
        matches!(self, WriteConn::Postgres { conn, .. } if conn.is_closed())
    }

    /// Begins a batch's transaction. SQLite takes the write lock at once, so a batch never fails
    /// halfway for want of it. On PostgreSQL no writer waits for another's: each writes only the
    /// runs of the shards its replica owns, and its commit is fenced by their epochs
    /// ([`WriteConn::fence`]); the `BEGIN` goes out with the batch's first statement.
    fn begin(&self) -> Result<(), String> {
        match self {
            WriteConn::Sqlite(..) => self.batch("BEGIN IMMEDIATE"),
            WriteConn::Postgres { conn, .. } => {
                conn.defer_batch("BEGIN");
                Ok(())
            }
        }
    }

    /// Which shards this replica owns: `None` on SQLite, and before the cluster has started.
    fn router(&self) -> Option<&dyn super::forward::Router> {
        match self {
            WriteConn::Sqlite(..) => None,
            WriteConn::Postgres { router, .. } => router.get().map(|router| router.as_ref()),
        }
    }

    /// Just before the commit, among replicas: locks the rows of the shards the batch wrote
    /// (`FOR SHARE`, so no replica can take one until this transaction ends) and checks that each
    /// is still this replica's (`me`), at the epoch it knows. A replica that lost a shard while
    /// frozen or cut off (another took it after the TTL) learns it here, and commits nothing.
    fn fence(&self, me: &str, shards: &std::collections::BTreeSet<u32>) -> Result<(), String> {
        let Some(router) = self.router().filter(|_| !shards.is_empty()) else {
            return Ok(());
        };
        let ids: Vec<String> = shards.iter().map(u32::to_string).collect();
        let sql = format!(
            "SELECT id, owner, epoch FROM shards WHERE id IN ({}) FOR SHARE",
            ids.join(", ")
        );
        let rows: Vec<(i64, Option<String>, i64)> = self
            .sql()
            .prepare(&sql)
            .and_then(|mut statement| {
                statement
                    .query_map(&[], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                    .collect()
            })
            .map_err(|e| e.to_string())?;
        for shard in shards {
            let row = rows.iter().find(|(id, ..)| *id == i64::from(*shard));
            let current = row
                .is_some_and(|(_, owner, epoch)| owner.as_deref() == Some(me) && Some(*epoch) == router.epoch(*shard));
            if !current {
                return Err(format!("shard {shard} is no longer this replica's"));
            }
        }
        Ok(())
    }

    /// Commits, then hands the other replicas' notice of what the batch wrote to the feed (on
    /// PostgreSQL); waits for the disk only when `sync` (see [`super::sync`]). Says whether it
    /// waited.
    fn commit(
        &self,
        replica: &str,
        (published, waiting): (&[Published], &[(StepKind, String)]),
        (registry, sync): (bool, bool),
    ) -> Result<bool, String> {
        match self {
            WriteConn::Sqlite(_, mode, checkpoints) => {
                self.batch("COMMIT")?;
                checkpoints.committed();
                mode.after_commit(sync).or_else(|error| {
                    // After a failed sync the system may have dropped the pages it could not
                    // write, and a retry would report them written: only a restart, recovering
                    // from what the disk holds, is safe (PostgreSQL stops the same way).
                    tracing::error!(%error, "cannot sync the write-ahead log; the kernel stops so recovery starts from the disk");
                    std::process::exit(EXIT_SYNC_FAILED)
                })
            }
            WriteConn::Postgres { notices, .. } => {
                // Like SQLite's, a commit that does not wait for the WAL flush is ordered before
                // every later one: a later commit that waits makes it durable too.
                self.batch(if sync {
                    "COMMIT"
                } else {
                    "SET LOCAL synchronous_commit TO off; COMMIT"
                })?;
                if let Some(sink) = notices.get() {
                    let notice = super::postgres::notice::Notice::of(replica, (published, waiting), registry);
                    if !notice.is_empty() {
                        // Only a feed that stopped with the kernel refuses it.
                        let _ = sink.send(notice);
                    }
                }
                Ok(sync)
            }
        }
    }

    fn sql(&self) -> Connection<'_> {
        match self {
            WriteConn::Sqlite(conn, ..) => Connection::sqlite(conn),
            WriteConn::Postgres { conn, .. } => Connection::postgres(conn),
        }
    }
}

/// The kernel's exit status when the disk refused a sync (`EX_IOERR`).
const EXIT_SYNC_FAILED: i32 = 74;

const SAVEPOINT: &str = "SAVEPOINT command";
const RELEASE: &str = "RELEASE SAVEPOINT command";

/// How a command of a batch is kept apart from its batch-mates, so a refused one undoes only
/// itself.
#[derive(Clone, Copy, Debug)]
enum Isolation {
    /// The batch's only command (SQLite): undoing it is rolling the transaction back.
    Alone,
    /// Under a savepoint (SQLite), which costs two statements and a journal in memory of every
    /// page the command changes: an eighth of the writer's time under load, measured with `perf`.
    Savepoint,
    /// No savepoint, for a command that refuses before it writes (SQLite), with the connection's
    /// count of changed rows when it began: a command that fails after writing anyway spoils its
    /// batch ([`Spoiled`]).
    Unguarded(u64),
    /// Command `index` of a PostgreSQL batch, whose savepoint travels with its statements.
    Command(usize),
}

/// An unguarded command failed after it wrote (a store error, or a refusal [`Command::
/// decides_before_writing`] did not foresee): its writes cannot be undone without its
/// batch-mates'. The writer rolls the transaction back and answers every command applied before
/// it with the error, as when a commit fails; the commands after it go on in a new transaction.
struct Spoiled {
    /// The failed command, answered with its own error.
    applied: Applied,
    error: String,
}

/// What one command of a batch did, kept until the batch commits.
struct Applied {
    responder: Responder,
    published: Vec<Published>,
    waiting: Vec<(StepKind, String)>,
    /// Handed out only once the batch commits.
    effects: Vec<Effect>,
    /// The command's answer waits for the disk.
    sync: bool,
    /// Dropped unrun if the command's writes are undone.
    handout: Option<Handout>,
    /// The command wrote nothing: its answer is its refusal, whatever happens to its batch.
    refused: bool,
    /// The shards of the runs it wrote, among replicas: the commit is fenced by their epochs.
    shards: std::collections::BTreeSet<u32>,
}

impl Applied {
    fn refused(responder: Responder) -> Self {
        Applied {
            responder,
            published: Vec::new(),
            waiting: Vec::new(),
            effects: Vec::new(),
            sync: false,
            handout: None,
            refused: true,
            shards: Default::default(),
        }
    }

    /// The command's writes were undone after all: its caller hears `error`, nobody its events.
    /// A refused command keeps its own answer.
    fn undone(self, error: String) -> Self {
        self.undone_as(Failed {
            message: error,
            unreachable: false,
            moved: false,
        })
    }

    /// The command's writes were undone as `failed` says.
    fn undone_as(self, failed: Failed) -> Self {
        if self.refused {
            return self;
        }
        let responder = self.responder;
        Applied::refused(Box::new(move |_| responder(Some(&failed))))
    }
}

/// Runs a command of the batch, kept apart as `isolation` says; a refused command's rows and
/// events are undone.
fn apply_isolated(
    (conn, cache): (&WriteConn, &RefCell<Cache>),
    (replica, now): (&str, i64),
    isolation: Isolation,
    command: Command,
) -> Result<Applied, Box<Spoiled>> {
    let router = conn.router();
    if let (Some(router), Some(shard)) = (router, command.shard())
        && !router.here(shard)
    {
        let moved = KernelError::Moved(format!("shard {shard} is not this replica's"));
        return Ok(Applied::refused(fail_command(command, moved)));
    }
    let claims_only = command.claims_only();
    cache.borrow_mut().begin_command();
    let undo = || {
        conn.undo(isolation);
        cache.borrow_mut().undo_command();
    };
    if let Err(error) = conn.savepoint(isolation) {
        return Ok(Applied::refused(fail_command(command, KernelError::Store(error))));
    }
    let sql = conn.sql();
    let mut tx = Tx {
        conn: &sql,
        replica,
        now,
        published: Vec::new(),
        waiting: Vec::new(),
        effects: Vec::new(),
        seqs: Default::default(),
        cache,
        router,
    };
    let mut handout = None;
    let notes_only = command.notes_only();
    let (responder, ok) = apply(&mut tx, command, &mut handout);
    if !ok {
        if conn.wrote_since(isolation) {
            return Err(Box::new(Spoiled {
                applied: Applied::refused(responder),
                error: "a command was refused after it wrote".to_owned(),
            }));
        }
        undo();
        return Ok(Applied::refused(responder));
    }
    let finished = tx.finish();
    let shards: std::collections::BTreeSet<u32> = match router {
        Some(_) if !claims_only => tx
            .published
            .iter()
            .map(|p| crate::cluster::shards::shard_of(&p.event.run_id))
            .collect(),
        _ => Default::default(),
    };
    let stray = shards
        .iter()
        .copied()
        .find(|shard| router.is_some_and(|r| !r.here(*shard)));
    let applied = Applied {
        sync: must_sync(tx.published.iter().map(|p| (p.event.kind, p.step.as_ref())), notes_only),
        responder,
        published: tx.published,
        waiting: tx.waiting,
        effects: tx.effects,
        handout,
        refused: false,
        shards,
    };
    if let Some(shard) = stray {
        undo();
        return Ok(applied.undone_as(Failed {
            message: format!("the command wrote a run of shard {shard}, which is not this replica's"),
            unreachable: false,
            moved: true,
        }));
    }
    // The command's answer was an outcome its writes did not keep.
    if let Err(error) = finished {
        let error = error.to_string();
        if matches!(isolation, Isolation::Unguarded(_)) {
            return Err(Box::new(Spoiled {
                applied: applied.undone(error.clone()),
                error,
            }));
        }
        undo();
        return Ok(applied.undone(error));
    }
    if let Err(error) = conn.release(isolation) {
        cache.borrow_mut().undo_command();
        return Ok(applied.undone(error));
    }
    // Runs of other shards the command read are forgotten: their owners write them.
    if router.is_some() {
        cache
            .borrow_mut()
            .forget_touched_unless(|run| super::forward::may_write(router, run.as_str()));
    }
    Ok(applied)
}

/// Applies a batch's commands in order, claims last. A spoiled one rolls back the transaction (see
/// [`Spoiled`]): the commands before it are answered its error, and the rest go on in a new
/// transaction.
fn apply_batch(
    (conn, cache): (&WriteConn, &RefCell<Cache>),
    (replica, now): (&str, i64),
    mut batch: Vec<Command>,
) -> Vec<Applied> {
    // A claim's rows (of any shard) stay locked until the commit: a command after it that
    // waited for another replica's lock, while that replica waited for a claimed row of its own
    // run, would deadlock the two. Claims go last, after every command that may wait.
    batch.sort_by_key(Command::claims_only);
    let commands = batch.len();
    let mut applied: Vec<Applied> = Vec::with_capacity(commands);
    for (index, command) in batch.into_iter().enumerate() {
        let isolation = conn.isolation(&command, (index, commands));
        match apply_isolated((conn, cache), (replica, now), isolation, command) {
            Ok(done) => {
                applied.push(done);
                undo_from(&mut applied, cache, conn.undone());
            }
            Err(spoiled) => {
                let Spoiled { applied: failed, error } = *spoiled;
                tracing::warn!(%error, undone = applied.len(), "a command failed after it wrote; its batch is undone");
                conn.restart();
                cache.borrow_mut().clear();
                let message = format!("undone with its batch, in which another command failed after it wrote: {error}");
                applied = applied.into_iter().map(|a| a.undone(message.clone())).collect();
                applied.push(failed);
            }
        }
    }
    applied
}

/// Answers each command the database undid after it ended (a write of its failed, sent with a
/// later statement) with that error, and the commands after it, undone with it because they were
/// applied on what it wrote, with why.
fn undo_from(applied: &mut Vec<Applied>, cache: &RefCell<Cache>, undone: Vec<(usize, String)>) {
    if undone.is_empty() {
        return;
    }
    // Which rows the undone commands had changed is not worth tracking for so rare a case.
    cache.borrow_mut().clear();
    for (from, error) in undone {
        tracing::warn!(%error, command = from, undone = applied.len().saturating_sub(from), "a command's write failed after it ended; it and the commands after it are undone");
        let mut later = applied.split_off(from.min(applied.len())).into_iter();
        applied.extend(later.next().map(|failed| failed.undone(error.clone())));
        let message =
            format!("undone with an earlier command of its batch, whose write failed after it ended: {error}");
        applied.extend(later.map(|a| a.undone(message.clone())));
    }
}

fn fail_command(command: Command, error: KernelError) -> Responder {
    let message = error.to_string();
    // An unreachable database stays UNAVAILABLE for the caller, who may retry, and a moved shard
    // sends the write to its owner; anything else is the store's failure.
    let make = || match &error {
        KernelError::Unavailable(_) => KernelError::Unavailable(message.clone()),
        KernelError::Moved(_) => KernelError::Moved(message.clone()),
        _ => KernelError::Store(message.clone()),
    };
    let (responder, _) = match command {
        Command::CreateRun(_, reply) => respond(Err(make()), reply),
        Command::ScheduleTurn(_, _, reply) => respond(Err(make()), reply),
        Command::StartDispatch(_, reply) => respond(Err(make()), reply),
        Command::RecordResult(_, reply) => respond(Err(make()), reply),
        Command::LoseLease(_, reply) => respond(Err(make()), reply),
        Command::TimeOut { reply, .. } => respond(Err(make()), reply),
        Command::FailPending { reply, .. } => respond(Err(make()), reply),
        Command::EndRun(_, _, reply) => respond(Err(make()), reply),
        Command::CancelCall(_, _, _, reply) => respond(Err(make()), reply),
        Command::AbandonRuns(_, _, reply) => respond(Err(make()), reply),
        Command::RegisterTools(_, reply) => respond(Err(make()), reply),
        Command::ForgetTools(_, reply) => respond(Err(make()), reply),
        Command::DeleteRun(_, reply) => respond(Err(make()), reply),
        Command::PruneRuns(_, _, reply) => respond(Err(make()), reply),
        Command::AnswerApproval { reply, .. } => respond(Err(make()), reply),
        Command::ExpireApprovals(reply) => respond(Err(make()), reply),
        Command::NoteReplays(_, _, reply) => respond(Err(make()), reply),
        Command::ToolCacheSet(_, reply) => respond(Err(make()), reply),
        Command::PurgeExpired(_, reply) => respond(Err(make()), reply),
        Command::RecordStep(_, _, _, reply) | Command::CheckStep(_, _, _, reply) => respond(Err(make()), reply),
        Command::RegisterAgents(_, reply) => respond(Err(make()), reply),
        Command::SuspendDispatch(_, reply) => respond(Err(make()), reply),
        Command::StartSubagent(_, reply) => respond(Err(make()), reply),
        Command::AskPerson(_, reply) => respond(Err(make()), reply),
        Command::Beat(_, reply) => respond(Err(make()), reply),
        Command::ClaimPending { reply, .. } => respond(Err(make()), reply),
        Command::ForgetReplica { reply, .. } => respond(Err(make()), reply),
        Command::MoveShards { reply, .. } => respond(Err(make()), reply),
    };
    responder
}

/// What goes down the writer's channel.
pub enum Order {
    Write(Command),
    /// Commit what was queued before this, then exit, whoever still holds a [`super::Store`]
    /// (a stream a client stopped reading keeps one until it is dropped).
    Stop,
}

/// How long the store goes without a command before the writer gives back the memory it holds
/// for a busy kernel: the pages SQLite caches, its own connection's and (through `idle`) the
/// pooled readers' (up to 2 MB each), its memory of runs, and the threads' allocation caches,
/// which a kernel left idle after a burst would otherwise hold for good.
const IDLE_BEFORE_RELEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// Blocks for the next command, running `idle` once whenever none comes for
/// [`IDLE_BEFORE_RELEASE`]; `None` once every sender is gone or the writer is told to stop.
fn next_command(commands: &Receiver<Order>, conn: &WriteConn, idle: &impl Fn()) -> Option<Command> {
    let order = match commands.recv_timeout(IDLE_BEFORE_RELEASE) {
        Ok(order) => Some(order),
        Err(RecvTimeoutError::Disconnected) => None,
        Err(RecvTimeoutError::Timeout) => {
            conn.release_memory();
            idle();
            commands.recv().ok()
        }
    };
    match order? {
        Order::Write(command) => Some(command),
        Order::Stop => None,
    }
}

/// The writer loop: block for one command, take whatever else is queued, commit once, answer all.
/// What each commit created and appended goes to `live` (when it is the only writer), then to
/// `publish`, before any of its commands is answered; `idle` runs when the store has gone quiet.
pub fn run(
    mut conn: WriteConn,
    (replica, clock): (&str, &Clock),
    commands: Receiver<Order>,
    (live, publish): (Option<&LiveRuns>, impl Fn(Vec<Published>, Vec<Effect>)),
    idle: impl Fn(),
) {
    let cache = RefCell::new(Cache::default());
    let mut generation = None;
    let quiet = || {
        // A new cache, not a cleared one: cleared maps keep the capacity a burst gave them.
        cache.replace(Cache::default());
        idle();
        crate::memory::went_idle();
    };
    let mut stop = false;
    let most = match conn {
        WriteConn::Sqlite(..) => MAX_BATCH,
        WriteConn::Postgres { .. } => MAX_PG_BATCH,
    };
    while let Some(first) = (!stop).then(|| next_command(&commands, &conn, &quiet)).flatten() {
        let batch = take_batch(first, (&commands, most), &mut stop);
        if let Err(message) = conn.ensure_open(&cache, replica) {
            tracing::warn!(error = %message, "store unreachable, batch refused");
            let unreachable = || KernelError::Unavailable(format!("the database is unreachable: {message}"));
            refuse_batch(batch, unreachable);
            continue;
        }
        let now = clock.now_millis();
        let began = std::time::Instant::now();
        let commands = batch.len();
        // What this replica owns changed: what the writer remembers of runs may be of shards
        // another replica wrote meanwhile.
        if let Some(router) = conn.router()
            && generation.replace(router.generation()) != Some(router.generation())
        {
            cache.borrow_mut().clear();
            if let Some(live) = live {
                live.forget_all();
            }
        }
        match conn.begin() {
            Ok(()) => {}
            Err(message) => {
                let closed = conn.is_closed();
                refuse_batch(batch, || match closed {
                    true => KernelError::Unavailable(format!("the database is unreachable: {message}")),
                    false => KernelError::Store(message.clone()),
                });
                continue;
            }
        };
        let registry = batch.iter().any(Command::changes_registry);
        let applied = apply_batch((&conn, &cache), (replica, now), batch);
        let gathered = gather(&conn, &cache, applied);
        let batch = Batch {
            commands,
            began,
            registry,
        };
        commit(&conn, (&cache, replica), batch, gathered, (live, &publish));
    }
}

/// A batch as it began: how many commands, when, and whether any changes the registry.
struct Batch {
    commands: usize,
    began: std::time::Instant,
    registry: bool,
}

/// Commits what a batch gathered (rolling back on failure), publishes its events, then answers
/// its commands.
fn commit(
    conn: &WriteConn,
    (cache, replica): (&RefCell<Cache>, &str),
    batch: Batch,
    gathered: Gathered,
    (live, publish): (Option<&LiveRuns>, &impl Fn(Vec<Published>, Vec<Effect>)),
) {
    let committing = std::time::Instant::now();
    let Gathered {
        mut published,
        mut effects,
        waiting,
        responders,
        handouts,
        sync,
        flush_error,
        shards,
    } = gathered;
    let (after_commit, before_commit): (Vec<Handout>, Vec<Handout>) =
        handouts.into_iter().partition(|handout| handout.after_commit);
    let mut moved = false;
    let committed = match flush_error {
        None => match conn.fence(replica, &shards) {
            Ok(()) => {
                // Every command's writes stand now but for the commit itself failing.
                for early in before_commit {
                    (early.hand)();
                }
                conn.commit(replica, (&published, &waiting), (batch.registry, sync))
            }
            Err(error) => {
                moved = !conn.is_closed();
                Err(error)
            }
        },
        Some(error) => Err(error),
    };
    let metrics = crate::metrics::get();
    metrics.batch(
        batch.commands,
        committing.elapsed(),
        batch.began.elapsed(),
        committed.as_ref().ok().copied(),
    );
    metrics.statements(super::sql::take_statements());
    let commit_error = committed.err().map(|message| Failed {
        message,
        unreachable: conn.is_closed(),
        moved,
    });
    if commit_error.is_none() {
        // Paid calls go out the moment their charge stands, ahead of everything the commit
        // publishes.
        for paid in after_commit {
            (paid.hand)();
        }
    }
    if commit_error.is_some() {
        let _ = conn.batch("ROLLBACK");
        published.clear();
        effects.clear();
        cache.borrow_mut().clear();
    } else {
        if let Some(live) = live {
            live.committed(cache.borrow().born(&published), &published);
        }
    }
    // Watchers hear of a commit, and the scheduler of what it left to do, before its writers
    // are answered: a caller whose write returned knows every subscriber has the events.
    for item in &published {
        metrics.committed(item);
    }
    if !published.is_empty() || !effects.is_empty() {
        publish(published, effects);
    }
    for responder in responders {
        responder(commit_error.as_ref());
    }
}

/// `first` and whatever else is queued, up to `most` commands; `stop` is set when a stop order
/// came among them.
fn take_batch(first: Command, (commands, most): (&Receiver<Order>, usize), stop: &mut bool) -> Vec<Command> {
    let mut batch = vec![first];
    while batch.len() < most {
        match commands.try_recv() {
            Ok(Order::Write(next)) => batch.push(next),
            Ok(Order::Stop) => {
                *stop = true;
                break;
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
        }
    }
    batch
}

/// Answers every command of a batch that could not begin with `error`.
fn refuse_batch(batch: Vec<Command>, error: impl Fn() -> KernelError) {
    for command in batch {
        fail_command(command, error())(None);
    }
}

/// What a batch's commands left for its commit: their events, waiting steps and answers, whether
/// any must sync, and what goes out before the commit.
struct Gathered {
    published: Vec<Published>,
    effects: Vec<Effect>,
    waiting: Vec<(StepKind, String)>,
    responders: Vec<Responder>,
    handouts: Vec<Handout>,
    sync: bool,
    /// The deferred writes failed: the batch does not commit.
    flush_error: Option<String>,
    /// The shards of the runs the batch wrote, among replicas.
    shards: std::collections::BTreeSet<u32>,
}

/// Gathers what the applied commands left, each command the database undid (see [`undo_from`])
/// answered with why instead.
fn gather(conn: &WriteConn, cache: &RefCell<Cache>, mut applied: Vec<Applied>) -> Gathered {
    let flush_error = match conn.flush() {
        Ok(undone) => {
            undo_from(&mut applied, cache, undone);
            None
        }
        Err(error) => Some(error),
    };
    let mut gathered = Gathered {
        published: Vec::new(),
        effects: Vec::new(),
        waiting: Vec::new(),
        responders: Vec::with_capacity(applied.len()),
        handouts: Vec::new(),
        sync: false,
        flush_error,
        shards: Default::default(),
    };
    for mut command in applied {
        gathered.sync |= command.sync;
        gathered.shards.append(&mut command.shards);
        gathered.published.append(&mut command.published);
        gathered.effects.append(&mut command.effects);
        gathered.waiting.append(&mut command.waiting);
        gathered.responders.push(command.responder);
        gathered.handouts.extend(command.handout);
    }
    gathered
}
