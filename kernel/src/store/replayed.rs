//! The same commands give the same log in SQL as in memory: each of a few cases of the command
//! properties (`machine::command::properties`) is replayed against the SQL transaction on
//! SQLite and on PostgreSQL, command by command at the time it ran, and every run's log must
//! match the in-memory records' event for event (kind, number, payload), ids aside: a run or
//! approval is known by the order it was created in.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use super::cache::Cache;
use super::ops::Tx;
use super::sql::{Connection, PgConn, ToArg};
use crate::machine::command::memory::Memory;
use crate::machine::command::properties::{Traced, sample};
use crate::model::{ApprovalId, RunId};

/// A database the commands of one case run against.
enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<PgConn>),
}

impl Db {
    fn sql(&self) -> Connection<'_> {
        match self {
            Db::Sqlite(conn) => Connection::sqlite(conn),
            Db::Postgres(conn) => Connection::postgres(conn),
        }
    }

    fn begin(&self) {
        match self {
            Db::Sqlite(conn) => conn.execute_batch("BEGIN IMMEDIATE").unwrap(),
            Db::Postgres(conn) => {
                conn.batch("BEGIN").unwrap();
                conn.begin_command(0);
            }
        }
    }

    /// Commits a command that succeeded, or undoes one that failed.
    fn end(&self, ok: bool) {
        match self {
            Db::Sqlite(conn) => conn.execute_batch(if ok { "COMMIT" } else { "ROLLBACK" }).unwrap(),
            Db::Postgres(conn) => {
                if ok {
                    conn.end_command();
                    conn.flush().unwrap();
                    assert!(conn.take_undone().is_empty(), "a write failed");
                    conn.batch("COMMIT").unwrap();
                } else {
                    conn.undo_command().unwrap();
                    conn.flush().unwrap();
                    conn.batch("ROLLBACK").unwrap();
                }
            }
        }
    }
}

/// The database of one case, and its ids for the memory's.
struct Replay {
    db: Db,
    runs: BTreeMap<RunId, RunId>,
    approvals: BTreeMap<ApprovalId, ApprovalId>,
}

impl Replay {
    fn new(db: Db) -> Self {
        Replay {
            db,
            runs: BTreeMap::new(),
            approvals: BTreeMap::new(),
        }
    }

    fn ids(&self, sql: &str) -> BTreeSet<(String, String)> {
        let rows = self
            .db
            .sql()
            .prepare(sql)
            .unwrap()
            .query_map(&[], |row| Ok((row.get(0)?, row.get(1)?)));
        rows.unwrap().map(Result::unwrap).collect()
    }

    fn runs(&self) -> BTreeSet<(String, String)> {
        self.ids("SELECT id, id FROM runs")
    }

    fn approvals(&self) -> BTreeSet<(String, String)> {
        self.ids("SELECT id, run_id FROM approvals")
    }

    /// Runs one command in a transaction of its own, undone if it fails, as the writer does.
    fn apply(&mut self, traced: Traced) {
        let (runs, approvals) = (self.runs.clone(), self.approvals.clone());
        let command = traced
            .command
            .clone()
            .with_ids(&|id| runs.get(id).cloned().unwrap_or_else(|| id.clone()), &|id| {
                approvals.get(id).cloned().unwrap_or_else(|| id.clone())
            });
        let (runs_before, approvals_before) = (self.runs(), self.approvals());
        self.db.begin();
        let cache = RefCell::new(Cache::default());
        let sql = self.db.sql();
        let mut tx = Tx {
            conn: &sql,
            replica: "memory",
            now: traced.now,
            published: Vec::new(),
            waiting: Vec::new(),
            effects: Vec::new(),
            seqs: Default::default(),
            cache: &cache,
            router: None,
        };
        let applied = command.apply(&mut tx).and_then(|()| tx.finish());
        self.db.end(applied.is_ok());
        let new_runs: Vec<String> = self.runs().difference(&runs_before).map(|(id, _)| id.clone()).collect();
        assert_eq!(
            new_runs.len(),
            traced.new_runs.len(),
            "{:?} created other runs",
            traced.command
        );
        for (mine, theirs) in traced.new_runs.iter().zip(new_runs) {
            self.runs.insert(mine.clone(), RunId::parse(&theirs, "run").unwrap());
        }
        let new_approvals: Vec<(String, String)> = self.approvals().difference(&approvals_before).cloned().collect();
        assert_eq!(
            new_approvals.len(),
            traced.new_approvals.len(),
            "{:?} asked other questions",
            traced.command
        );
        for (mine, run) in &traced.new_approvals {
            let run = self.runs[run].as_str();
            let (theirs, _) = new_approvals
                .iter()
                .find(|(_, of)| of == run)
                .expect("the run's question");
            self.approvals
                .insert(mine.clone(), ApprovalId::from_stored(theirs.clone()));
        }
    }

    /// A run's log in SQL, with the memory's ids for SQL's: (seq, kind, payload).
    fn log(&self, run: &RunId) -> Vec<(u64, String, serde_json::Value)> {
        let rows = self
            .db
            .sql()
            .prepare("SELECT seq, type, payload FROM events WHERE run_id = ?1 ORDER BY seq")
            .unwrap()
            .query_map(&[run.as_str().to_arg()], |row| {
                Ok((row.get::<i64>(0)? as u64, row.get(1)?, row.get::<String>(2)?))
            });
        rows.unwrap()
            .map(Result::unwrap)
            .map(|(seq, kind, payload)| (seq, kind, serde_json::from_str(&self.with_memory_ids(payload)).unwrap()))
            .collect()
    }

    fn with_memory_ids(&self, mut text: String) -> String {
        for (mine, theirs) in &self.runs {
            text = text.replace(theirs.as_str(), mine.as_str());
        }
        for (mine, theirs) in &self.approvals {
            text = text.replace(theirs.as_str(), mine.as_str());
        }
        text
    }

    /// Every run's log is the memory's, and the same runs remain; how many events matched.
    fn matches(&self, memory: &Memory, case: u8) -> usize {
        let mut matched = 0;
        assert_eq!(
            self.runs().len(),
            memory.state.runs.len(),
            "case {case}: the same runs remain"
        );
        for (mine, log) in &memory.state.log {
            let expected: Vec<(u64, String, serde_json::Value)> = log
                .iter()
                .map(|event| {
                    (
                        event.seq,
                        event.kind.as_str().to_owned(),
                        without_keys(event.payload.clone()),
                    )
                })
                .collect();
            let replayed: Vec<_> = self
                .log(&self.runs[mine])
                .into_iter()
                .map(|(seq, kind, payload)| (seq, kind, without_keys(payload)))
                .collect();
            for (index, (want, got)) in expected.iter().zip(&replayed).enumerate() {
                assert_eq!(want, got, "case {case}: event {index} of run {mine}");
            }
            assert_eq!(expected.len(), replayed.len(), "case {case}: run {mine}'s log length");
            matched += expected.len();
        }
        matched
    }
}

/// A payload without its idempotency key, which is derived from its run's id.
fn without_keys(mut payload: serde_json::Value) -> serde_json::Value {
    if let Some(key) = payload.get_mut("idempotency_key") {
        *key = serde_json::Value::Null;
    }
    payload
}

/// Replays cases `0..cases` on the databases `open` gives; how many events matched.
fn replay_cases(cases: u8, open: impl Fn() -> Db) -> usize {
    let mut matched = 0;
    for case in 0..cases {
        let (memory, trace) = sample(case);
        let mut replay = Replay::new(open());
        for traced in trace {
            replay.apply(traced);
        }
        matched += replay.matches(&memory, case);
    }
    matched
}

#[test]
fn sqlite_logs_what_the_in_memory_records_log() {
    let matched = replay_cases(64, || Db::Sqlite(super::schema::migrated_in_memory()));
    assert!(matched > 64 * 8, "the cases logged little: {matched} events");
}

/// On a database of its own on the test process's shared server; skipped (said loudly) where
/// PostgreSQL is not installed and not required.
#[tokio::test]
async fn postgres_logs_what_the_in_memory_records_log() {
    let Some(server) = tokio::task::spawn_blocking(|| e2e::postgres::Postgres::database("store::replayed"))
        .await
        .unwrap()
    else {
        return;
    };
    let url = server.url.clone();
    let target = super::postgres::Target::with_defaults(&url).unwrap();
    let mut client = target.connect(super::postgres::Role::Migrate, "test").await.unwrap();
    super::postgres::migrate(&mut client).await.unwrap();
    drop(client);
    let matched = tokio::task::spawn_blocking(move || {
        replay_cases(16, || {
            // A fresh schema per case, so each starts from no runs.
            let conn = super::postgres::open_writer(&target, "test").unwrap();
            conn.batch(
                "TRUNCATE runs, events, steps, approvals, places, result_cache, result_cache_runs, resource_locks, limit_buckets",
            )
            .unwrap();
            Db::Postgres(Box::new(conn))
        })
    })
    .await
    .unwrap();
    assert!(matched > 16 * 8, "the cases logged little: {matched} events");
    drop(server);
}
