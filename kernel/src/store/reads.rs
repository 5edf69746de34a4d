//! Read-only queries, served by a small pool of read-only connections on blocking threads so the
//! writer is never in the way of a reader (WAL).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rusqlite::OpenFlags;

use super::sql::{self, Arg, Connection, Dialect, OptionalExtension, PgConn, params};

use super::live::LiveRuns;
use super::rows::{self, APPROVAL_COLUMNS, EVENT_COLUMNS, RUN_COLUMNS, STEP_COLUMNS};
use crate::clock::Clock;
use crate::error::KernelError;
use crate::model::{
    ApprovalId, ApprovalRecord, ApprovalStatus, EventRecord, Millis, RecordedResult, RunId, RunRecord, RunStatus,
    StepKey, StepRecord, StepStatus, ToolDef, ToolOptions,
};

/// A pool of reading connections.
#[derive(Clone)]
pub struct Readers {
    pool: Arc<Pool>,
    source: Arc<Source>,
    /// Reads at once, as many as the pool keeps: a read beyond them waits for a connection
    /// rather than opening one it would then close (on PostgreSQL a connection is a server
    /// process; opening one per read under load made throughput fall as concurrency rose).
    permits: Arc<tokio::sync::Semaphore>,
    /// The runs this kernel's writer created and holds (SQLite): a new turn of one plans without
    /// a read.
    live: Option<Arc<LiveRuns>>,
    /// Expiry is read on the kernel's clock.
    clock: Clock,
}

/// The most connections a pool holds, and so the most reads at once.
const READERS: usize = 16;

/// How long a read on a blocking thread waits for SQLite's lock (held only briefly in WAL mode:
/// recovering the log after a crash, say). A read on the calling thread does not wait: it moves to
/// a blocking thread instead, so no runtime thread sleeps on a lock.
pub(super) const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The idle connections.
#[derive(Default)]
struct Pool(Mutex<Vec<ReadConn>>);

/// A PostgreSQL connection drives itself on a runtime of its own, which must not be dropped on
/// another (the kernel drops its store on its runtime at shutdown): idle connections go on a
/// thread of their own.
impl Drop for Pool {
    fn drop(&mut self) {
        let idle = std::mem::take(self.0.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()));
        if idle.iter().any(|conn| matches!(conn, ReadConn::Postgres(_))) {
            let _ = std::thread::Builder::new()
                .name("store-readers-close".into())
                .spawn(move || drop(idle));
        }
    }
}

/// Where readers connect.
enum Source {
    Sqlite(std::path::PathBuf),
    /// With the replica the connections are named after.
    Postgres(Box<super::postgres::Target>, String),
}

/// One pooled reading connection.
enum ReadConn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<PgConn>),
}

impl ReadConn {
    fn sql(&self) -> Connection<'_> {
        match self {
            ReadConn::Sqlite(conn) => Connection::sqlite(conn),
            ReadConn::Postgres(conn) => Connection::postgres(conn),
        }
    }
}

/// What the store counts for the metrics' gauges.
#[derive(Clone, Debug, Default)]
pub struct StoreGauges {
    /// Runs by status text.
    pub runs: Vec<(String, i64)>,
    pub approvals_waiting: i64,
}

/// Filters of a run listing.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub agent: Option<String>,
    pub labels: Vec<(String, String)>,
    /// Only the children of this run.
    pub parent: Option<RunId>,
    /// Only the branches forked from this run.
    pub forked_from: Option<RunId>,
    /// Only runs with an id lower than this (newest first paging).
    pub before: Option<String>,
    /// Only runs that made a call of this tool.
    pub tool: Option<String>,
    /// Only runs created in `[from, until)`, in milliseconds since the epoch.
    pub created_from: Option<crate::model::Millis>,
    pub created_until: Option<crate::model::Millis>,
    pub limit: u32,
}

impl Readers {
    /// Readers of a SQLite store, with what its writer keeps of the runs it created.
    pub fn open(path: &std::path::Path, live: Option<Arc<LiveRuns>>, clock: Clock) -> Result<Self, KernelError> {
        Ok(Readers {
            pool: Arc::new(Pool::default()),
            source: Arc::new(Source::Sqlite(path.to_owned())),
            permits: Arc::new(tokio::sync::Semaphore::new(READERS)),
            live,
            clock,
        })
    }

    /// Readers of a PostgreSQL store, each its own connection (made on first use). `live` is what
    /// this replica's writer committed of the runs of its own shards, which no other replica writes
    /// while it owns them (the writer forgets it all whenever they change).
    pub fn open_postgres(
        target: &super::postgres::Target,
        replica: &str,
        (live, clock): (Arc<LiveRuns>, Clock),
    ) -> Self {
        Readers {
            pool: Arc::new(Pool::default()),
            source: Arc::new(Source::Postgres(Box::new(target.clone()), replica.to_owned())),
            permits: Arc::new(tokio::sync::Semaphore::new(READERS)),
            live: Some(live),
            clock,
        }
    }

    fn connect(&self) -> sql::Result<ReadConn> {
        Ok(match &*self.source {
            Source::Sqlite(path) => {
                let conn = rusqlite::Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
                )?;
                conn.busy_timeout(BUSY_WAIT)?;
                ReadConn::Sqlite(conn)
            }
            Source::Postgres(target, replica) => {
                let config = target.config(super::postgres::Role::Reader, replica);
                ReadConn::Postgres(Box::new(PgConn::connect(&config)?))
            }
        })
    }

    /// Runs `query` on a pooled connection on a blocking thread.
    pub async fn with<T, F>(&self, query: F) -> Result<T, KernelError>
    where
        T: Send + 'static,
        F: FnOnce(Connection<'_>) -> sql::Result<T> + Send + 'static,
    {
        let readers = self.clone();
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the readers' semaphore is never closed");
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let result = readers.pooled(BUSY_WAIT, query);
            // A blocking thread never parks as the runtime's do: it gives its allocation cache
            // back after its read instead, once per time the kernel went idle, as they do.
            crate::memory::on_park();
            result
        })
        .await
        .map_err(|e| KernelError::Store(format!("reader task failed: {e}")))?
        .map_err(KernelError::from)
    }

    /// Runs `query`, a read of a few rows by key, on a pooled connection: on SQLite on the
    /// calling thread, where it takes microseconds from pages in memory (readers never wait for
    /// the writer in WAL mode), less than the hand-off to a blocking thread and back; on
    /// PostgreSQL, a network round trip, on a blocking thread as [`Readers::with`] does. A
    /// SQLite read that finds the database locked runs again on a blocking thread, which waits.
    pub async fn with_point<T, F>(&self, query: F) -> Result<T, KernelError>
    where
        T: Send + 'static,
        F: Fn(Connection<'_>) -> sql::Result<T> + Send + 'static,
    {
        if matches!(*self.source, Source::Postgres(..)) {
            return self.with(query).await;
        }
        let inline = {
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the readers' semaphore is never closed");
            self.pooled(std::time::Duration::ZERO, &query)
        };
        match inline {
            Err(sql::Error::Busy(message)) => {
                tracing::debug!(%message, "database locked, reading on a blocking thread");
                self.with(query).await
            }
            other => other.map_err(KernelError::from),
        }
    }

    /// Runs `query` on a connection from the pool (or a new one), waiting up to `wait` for
    /// SQLite's lock, and gives the connection back.
    fn pooled<T>(
        &self,
        wait: std::time::Duration,
        query: impl FnOnce(Connection<'_>) -> sql::Result<T>,
    ) -> sql::Result<T> {
        let pooled = self.pool.0.lock().expect("reader pool poisoned").pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => self.connect()?,
        };
        if let ReadConn::Sqlite(conn) = &conn {
            conn.busy_timeout(wait)?;
        }
        let result = query(conn.sql());
        let mut pool = self.pool.0.lock().expect("reader pool poisoned");
        // A connection whose query failed may be broken (a PostgreSQL restart): not kept.
        if result.is_ok() && pool.len() < READERS {
            pool.push(conn);
        }
        result
    }

    /// Frees the page caches of the pooled SQLite connections. They leave the pool meanwhile, so
    /// a read never waits on the pool's lock for it (one that finds the pool empty connects).
    pub(super) fn release_memory(&self) {
        let idle = std::mem::take(&mut *self.pool.0.lock().expect("reader pool poisoned"));
        for conn in &idle {
            if let ReadConn::Sqlite(conn) = conn
                && let Err(error) = conn.release_memory()
            {
                tracing::debug!(%error, "store reader kept its page cache");
            }
        }
        let mut pool = self.pool.0.lock().expect("reader pool poisoned");
        let room = READERS.saturating_sub(pool.len());
        pool.extend(idle.into_iter().take(room));
    }

    /// Pooled connections left inside a transaction (for tests: a read must never leave one, or
    /// it would hold its snapshot, and the log, forever).
    #[cfg(test)]
    pub fn idle_in_transaction(&self) -> usize {
        let pool = self.pool.0.lock().expect("reader pool poisoned");
        pool.iter()
            .filter(|conn| matches!(conn, ReadConn::Sqlite(conn) if !conn.is_autocommit()))
            .count()
    }

    pub async fn run(&self, id: RunId) -> Result<Option<RunRecord>, KernelError> {
        self.with(move |conn| rows::load_run(&conn, &id)).await
    }

    pub async fn steps(&self, id: RunId) -> Result<Vec<StepRecord>, KernelError> {
        self.with(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?1 ORDER BY turn, position, created_at"
            ))?
            .query_map(params![id.as_str()], rows::step_from_row)?
            .collect()
        })
        .await
    }

    /// The steps of `id` under these keys, those it has, in no particular order: a stream that
    /// missed signals re-reads its own calls, however many steps the run has.
    pub async fn steps_at(&self, id: RunId, keys: Vec<StepKey>) -> Result<Vec<StepRecord>, KernelError> {
        self.with(move |conn| conn.snapshot(|| rows::load_steps(&conn, &id, &keys)))
            .await
    }

    pub async fn runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, KernelError> {
        self.with(move |conn| {
            let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE 1 = 1");
            let parent = filter.parent.as_ref().map(ToString::to_string);
            let forked_from = filter.forked_from.as_ref().map(ToString::to_string);
            let mut args: Vec<Arg<'_>> = Vec::new();
            if let Some(status) = filter.status {
                sql.push_str(" AND status = ?");
                args.push(Arg::Text(status.as_str()));
            }
            if let Some(agent) = &filter.agent {
                sql.push_str(" AND agent = ?");
                args.push(Arg::Text(agent));
            }
            for (key, value) in &filter.labels {
                sql.push_str(match conn.dialect() {
                    Dialect::Sqlite => {
                        " AND EXISTS (SELECT 1 FROM json_each(runs.labels) WHERE json_each.key = ? AND json_each.value = ?)"
                    }
                    Dialect::Postgres => " AND (runs.labels::jsonb ->> ?) = ?",
                });
                args.push(Arg::Text(key));
                args.push(Arg::Text(value));
            }
            if let Some(parent) = &parent {
                sql.push_str(" AND parent_run_id = ?");
                args.push(Arg::Text(parent));
            }
            if let Some(of) = &forked_from {
                sql.push_str(match conn.dialect() {
                    Dialect::Sqlite => " AND json_extract(fork, '$.of') = ?",
                    Dialect::Postgres => " AND (fork::jsonb ->> 'of') = ?",
                });
                args.push(Arg::Text(of));
            }
            if let Some(before) = &filter.before {
                sql.push_str(" AND id < ?");
                args.push(Arg::Text(before));
            }
            if let Some(tool) = &filter.tool {
                sql.push_str(" AND EXISTS (SELECT 1 FROM steps WHERE steps.run_id = runs.id AND steps.tool = ?)");
                args.push(Arg::Text(tool));
            }
            if let Some(from) = filter.created_from {
                sql.push_str(" AND created_at >= ?");
                args.push(Arg::Int(from));
            }
            if let Some(until) = filter.created_until {
                sql.push_str(" AND created_at < ?");
                args.push(Arg::Int(until));
            }
            sql.push_str(" ORDER BY id DESC LIMIT ?");
            args.push(Arg::Int(i64::from(filter.limit)));
            conn.prepare(&sql)?.query_map(&args, rows::run_from_row)?.collect()
        })
        .await
    }

    pub async fn events(&self, id: RunId, from_seq: u64, limit: u32) -> Result<Vec<EventRecord>, KernelError> {
        self.with(move |conn| match conn.dialect() {
            Dialect::Sqlite => conn.snapshot(|| super::chain::events(&conn, &id, from_seq, limit)),
            Dialect::Postgres => conn
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3"
                ))?
                .query_map(params![id.as_str(), from_seq, limit], rows::event_from_row)?
                .collect(),
        })
        .await
    }

    /// A turn's run, and its recorded calls (whole steps, or only their results) when every call
    /// `(key, call_hash)` is recorded with the same hash and settled (the turn is then a pure
    /// replay), in one read. A run this kernel's writer holds with a call of the turn not recorded
    /// needs no read: its record comes from memory, with `status` and counters as created and
    /// `last_seq` as last committed.
    pub async fn turn<T: Served>(
        &self,
        run: RunId,
        calls: Vec<(crate::model::StepKey, String)>,
    ) -> Result<(Option<RunRecord>, Option<Vec<T>>), KernelError> {
        if let Some(live) = &self.live
            && let Some(record) = live.unrecorded_turn(&run, calls.iter().map(|(key, _)| key))
        {
            return Ok((Some(record), None));
        }
        self.with_point(move |conn| {
            conn.snapshot(|| {
                let Some(record) = rows::load_run(&conn, &run)? else {
                    return Ok((None, None));
                };
                let keys: Vec<&StepKey> = calls.iter().map(|(key, _)| key).collect();
                let asked: HashMap<&StepKey, usize> = keys.iter().enumerate().map(|(at, key)| (*key, at)).collect();
                let mut found: Vec<Option<T>> = std::iter::repeat_with(|| None).take(calls.len()).collect();
                for step in rows::load_turn_keyed(&conn, T::COLUMNS, T::from_row, &run, &keys)? {
                    if let Some(at) = asked.get(step.identity().0) {
                        found[*at] = Some(step);
                    }
                }
                let mut steps = Vec::with_capacity(calls.len());
                for (step, (_, hash)) in found.into_iter().zip(&calls) {
                    let Some(step) = step else {
                        return Ok((Some(record), None));
                    };
                    // Served again as it is only if it settled under the same identity.
                    let (_, status, recorded) = step.identity();
                    if !status.is_terminal() || recorded != hash {
                        return Ok((Some(record), None));
                    }
                    steps.push(step);
                }
                Ok((Some(record), Some(steps)))
            })
        })
        .await
    }

    /// Approvals with a status, optionally of one run, oldest first.
    pub async fn approvals(
        &self,
        status: ApprovalStatus,
        run: Option<RunId>,
    ) -> Result<Vec<ApprovalRecord>, KernelError> {
        self.with(move |conn| {
            let run = run.map(|r| r.to_string());
            conn.prepare_cached(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = ?1 AND (CAST(?2 AS TEXT) IS NULL OR run_id = ?2) \
                 ORDER BY requested_at, id LIMIT 1000"
            ))?
            .query_map(params![status.as_str(), run], rows::approval_from_row)?
            .collect()
        })
        .await
    }

    /// One approval.
    pub async fn approval(&self, id: ApprovalId) -> Result<Option<ApprovalRecord>, KernelError> {
        self.with(move |conn| rows::load_approval(&conn, &id)).await
    }

    /// Every approval of a run.
    pub async fn run_approvals(&self, run: RunId) -> Result<Vec<ApprovalRecord>, KernelError> {
        self.with(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run_id = ?1 ORDER BY requested_at, id"
            ))?
            .query_map(params![run.as_str()], rows::approval_from_row)?
            .collect()
        })
        .await
    }

    /// How many runs the store holds in each status, and how many approvals wait for an answer:
    /// counted where they are kept, so a restart or a deletion cannot make them drift.
    pub async fn gauges(&self) -> Result<StoreGauges, KernelError> {
        self.with(|conn| {
            let runs = conn
                .prepare_cached("SELECT status, COUNT(*) FROM runs GROUP BY status")?
                .query_map(params![], |row| Ok((row.get::<String>(0)?, row.get::<i64>(1)?)))?
                .collect::<sql::Result<Vec<_>>>()?;
            let approvals_waiting = conn.query_row(
                "SELECT COUNT(*) FROM approvals WHERE status = 'pending'",
                params![],
                |row| row.get::<i64>(0),
            )?;
            Ok(StoreGauges {
                runs,
                approvals_waiting,
            })
        })
        .await
    }

    /// Whether the store answers a query at all (readiness).
    pub async fn ping(&self) -> Result<(), KernelError> {
        self.with(|conn| {
            conn.query_row("SELECT 1", params![], |row| row.get::<i64>(0))
                .map(|_| ())
        })
        .await
    }

    /// Whether a pending approval's deadline is at or before `now` (the one `expire_approvals`
    /// compares with).
    pub async fn approvals_due(&self, now: Millis) -> Result<bool, KernelError> {
        self.with_point(move |conn| {
            conn.prepare_cached(
                "SELECT 1 FROM approvals WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?1 LIMIT 1",
            )?
            .query_row(params![now], |_| Ok(()))
            .optional()
            .map(|due| due.is_some())
        })
        .await
    }

    /// Steps that were pending or leased when the kernel last stopped.
    pub async fn in_flight_steps(&self) -> Result<Vec<StepRecord>, KernelError> {
        self.with(|conn| {
            conn.prepare(&super::ops::open_steps::in_flight(STEP_COLUMNS))?
                .query_map(params![], rows::step_from_row)?
                .collect()
        })
        .await
    }

    /// Every replica's row, oldest first.
    pub async fn replicas(&self) -> Result<Vec<super::ReplicaRow>, KernelError> {
        self.with(|conn| {
            conn.prepare_cached("SELECT id, started_at, heartbeat_at, offers, address FROM replicas ORDER BY id")?
                .query_map(params![], |row| {
                    Ok(super::ReplicaRow {
                        id: row.get(0)?,
                        started_at: row.get(1)?,
                        heartbeat_at: row.get(2)?,
                        offers: row.get(3)?,
                        address: row.get(4)?,
                    })
                })?
                .collect()
        })
        .await
    }

    /// Every shard with its owner and epoch, by id.
    pub async fn shards(&self) -> Result<Vec<crate::cluster::shards::ShardRow>, KernelError> {
        self.with(|conn| {
            conn.prepare_cached("SELECT id, owner, epoch FROM shards ORDER BY id")?
                .query_map(params![], |row| {
                    let id: i64 = row.get(0)?;
                    Ok(crate::cluster::shards::ShardRow {
                        id: u32::try_from(id).map_err(|e| sql::Error::conversion(0, e))?,
                        owner: row.get(1)?,
                        epoch: row.get(2)?,
                    })
                })?
                .collect()
        })
        .await
    }

    /// The key replicas show each other on their links (PostgreSQL only: the table is not on SQLite).
    pub async fn link_key(&self) -> Result<String, KernelError> {
        self.with(|conn| {
            conn.prepare_cached("SELECT link_key FROM cluster WHERE id = 1")?
                .query_row(params![], |row| row.get(0))
        })
        .await
    }

    /// The running steps whose lease replica `replica` holds.
    pub async fn held_by(&self, replica: String) -> Result<Vec<StepRecord>, KernelError> {
        self.with(move |conn| {
            conn.prepare_cached(&super::ops::open_steps::held_by(STEP_COLUMNS))?
                .query_map(params![replica], rows::step_from_row)?
                .collect()
        })
        .await
    }

    /// The running steps whose lease ran out before `now` and whose replica has no row
    /// ([`super::ops::open_steps::orphaned`]).
    pub async fn orphaned_leases(&self, now: Millis) -> Result<Vec<StepRecord>, KernelError> {
        self.with(move |conn| {
            conn.prepare_cached(&super::ops::open_steps::orphaned(STEP_COLUMNS))?
                .query_map(params![now], rows::step_from_row)?
                .collect()
        })
        .await
    }

    /// The locks running calls hold on resource instances, by resource.
    pub async fn resource_locks(&self) -> Result<Vec<crate::model::ResourceLock>, KernelError> {
        self.with(|conn| {
            conn.prepare_cached(
                "SELECT l.resource, l.run_id, l.step_key, s.tool, l.attempt, l.acquired_at FROM resource_locks l \
                 JOIN steps s ON s.run_id = l.run_id AND s.step_key = l.step_key ORDER BY l.resource",
            )?
            .query_map(params![], |row| {
                Ok(crate::model::ResourceLock {
                    resource: row.get(0)?,
                    run_id: row.get(1)?,
                    step_key: row.get(2)?,
                    tool: row.get(3)?,
                    attempt: row.get(4)?,
                    acquired_at: row.get(5)?,
                })
            })?
            .collect()
        })
        .await
    }

    /// For each tool limit, the calls holding one of its slots and its bucket as the last start
    /// left it (`None`: no start has drawn from it).
    pub async fn tool_limits(
        &self,
        limits: Vec<crate::machine::throttle::ToolLimit>,
    ) -> Result<Vec<(u32, Option<crate::machine::throttle::Bucket>)>, KernelError> {
        self.with(move |conn| {
            limits
                .iter()
                .map(|limit| {
                    let prefix = limit.slot_prefix();
                    let running = conn
                        .prepare_cached(super::ops::HELD_LOCKS)?
                        .query_map(params![prefix, prefix.chars().count() as i64], |row| {
                            row.get::<String>(0)
                        })?
                        .count() as u32;
                    let bucket = conn
                        .prepare_cached("SELECT tokens, at FROM limit_buckets WHERE name = ?1")?
                        .query_row(params![limit.tools], |row| {
                            Ok(crate::machine::throttle::Bucket {
                                tokens: row.get(0)?,
                                at: row.get(1)?,
                            })
                        })
                        .optional()?;
                    Ok((running, bucket))
                })
                .collect()
        })
        .await
    }

    /// The last run of `session` created before `before` that completed.
    pub async fn previous_in_session(&self, session: String, before: RunId) -> Result<Option<RunRecord>, KernelError> {
        self.with(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE session_key = ?1 AND id < ?2 AND status = 'completed' \
                 ORDER BY id DESC LIMIT 1"
            ))?
            .query_row(params![session, before.as_str()], rows::run_from_row)
            .optional()
        })
        .await
    }

    /// Every agent a worker ever offered.
    pub async fn agents(&self) -> Result<Vec<crate::model::AgentDef>, KernelError> {
        self.with(|conn| {
            conn.prepare("SELECT name, description, input_schema, version, fingerprint FROM agents ORDER BY name")?
                .query_map(params![], |row| {
                    Ok(crate::model::AgentDef {
                        name: row.get(0)?,
                        description: row.get(1)?,
                        input_schema: serde_json::from_str(&row.get::<String>(2)?)
                            .unwrap_or(serde_json::Value::Bool(true)),
                        version: row.get(3)?,
                        fingerprint: row.get(4)?,
                        max_concurrency: None,
                    })
                })?
                .collect()
        })
        .await
    }

    /// Every tool ever registered, with when it was first and last seen.
    pub async fn tools(&self) -> Result<Vec<(ToolDef, i64, i64)>, KernelError> {
        self.with(|conn| {
            conn.prepare(
                "SELECT name, description, input_schema, version, fingerprint, options, first_seen_at, last_seen_at \
                 FROM tools ORDER BY name",
            )?
            .query_map(params![], |row| {
                let schema: String = row.get(2)?;
                let options: String = row.get(5)?;
                Ok((
                    ToolDef {
                        name: row.get(0)?,
                        description: row.get(1)?,
                        input_schema: serde_json::from_str(&schema).unwrap_or_default(),
                        version: row.get(3)?,
                        fingerprint: row.get(4)?,
                        options: serde_json::from_str::<ToolOptions>(&options).unwrap_or_default(),
                    },
                    row.get(6)?,
                    row.get(7)?,
                ))
            })?
            .collect()
        })
        .await
    }

    /// The value a tool keeps under `key` in its cache, unless absent or expired.
    pub async fn tool_cache_get(&self, tool: String, key: String) -> Result<Option<String>, KernelError> {
        super::check_tool_cache_key(&key)?;
        let now = self.clock.now_millis();
        self.with(move |conn| {
            conn.prepare_cached(
                "SELECT value FROM tool_cache WHERE tool = ?1 AND key = ?2 AND (expires_at IS NULL OR expires_at > ?3)",
            )?
            .query_row(params![tool, key, now], |row| row.get(0))
            .optional()
        })
        .await
    }
}

/// What a turn served from the log reads of each of its calls ([`Readers::turn`]): a whole step
/// (a body's call, answered with its step), or only its result (an agent's, a sixth of the
/// columns to read).
pub trait Served: Sized + Send + 'static {
    /// The step's columns it is read from, in the order [`Served::from_row`] takes them.
    const COLUMNS: &'static str;

    fn from_row(row: &sql::Row<'_>) -> sql::Result<Self>;

    /// The step's key, its status, and the call identity (hash) it was recorded with.
    fn identity(&self) -> (&StepKey, StepStatus, &str);
}

impl Served for StepRecord {
    const COLUMNS: &'static str = STEP_COLUMNS;

    fn from_row(row: &sql::Row<'_>) -> sql::Result<Self> {
        rows::step_from_row(row)
    }

    fn identity(&self) -> (&StepKey, StepStatus, &str) {
        (&self.key, self.status, &self.call_hash)
    }
}

impl Served for RecordedResult {
    const COLUMNS: &'static str = rows::RESULT_COLUMNS;

    fn from_row(row: &sql::Row<'_>) -> sql::Result<Self> {
        rows::result_from_row(row)
    }

    fn identity(&self) -> (&StepKey, StepStatus, &str) {
        (&self.key, self.status, &self.call_hash)
    }
}
