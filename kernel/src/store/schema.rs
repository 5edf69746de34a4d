//! Numbered migrations. Each runs once, in order, inside the writer's first transaction; the
//! applied version is kept in `PRAGMA user_version`.

use rusqlite::Connection;

/// The condition of the `events_marks` index: the events of a run indexed by number, one in 256,
/// where a read of a range starts its walk back (see `store::chain`). Queries repeat it word for
/// word to use the index.
macro_rules! marked {
    () => {
        "seq % 256 = 0"
    };
}
pub(crate) use marked;

/// The condition of the `steps_unsettled` index: a step not yet succeeded, failed or cancelled.
/// SQLite uses a partial index only for a query that repeats its condition, so queries for a run's
/// open steps include this text.
macro_rules! unsettled {
    () => {
        "status <> 'succeeded' AND status <> 'failed' AND status <> 'cancelled'"
    };
}
pub(crate) use unsettled;

const MIGRATIONS: &[&str] = &[
    // 1: runs, their event log, steps, and the tool registry.
    r#"
    CREATE TABLE runs (
        id              TEXT PRIMARY KEY,
        agent           TEXT NOT NULL,
        status          TEXT NOT NULL,
        input           TEXT NOT NULL,
        output          TEXT,
        reason          TEXT,
        labels          TEXT NOT NULL,
        idempotency_key TEXT UNIQUE,
        max_tool_calls  INTEGER NOT NULL,
        interactive     INTEGER NOT NULL DEFAULT 1,
        capture         TEXT NOT NULL DEFAULT 'io',
        permissions     TEXT NOT NULL DEFAULT '[]',
        tool_calls      INTEGER NOT NULL DEFAULT 0,
        last_seq        INTEGER NOT NULL DEFAULT 0,
        created_at      INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX runs_by_status ON runs (status, id);
    CREATE INDEX runs_by_agent ON runs (agent, id);

    CREATE TABLE events (
        run_id         TEXT NOT NULL REFERENCES runs (id),
        seq            INTEGER NOT NULL,
        type           TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        at             INTEGER NOT NULL,
        payload        TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE steps (
        run_id           TEXT NOT NULL REFERENCES runs (id),
        step_key         TEXT NOT NULL,
        turn             INTEGER NOT NULL,
        position         INTEGER NOT NULL,
        call_id          TEXT,
        tool             TEXT NOT NULL,
        fingerprint      TEXT NOT NULL,
        version          TEXT NOT NULL,
        arguments        TEXT NOT NULL,
        call_hash        TEXT NOT NULL,
        idempotency_key  TEXT NOT NULL,
        idempotency      TEXT NOT NULL,
        timeout_ms       INTEGER NOT NULL,
        status           TEXT NOT NULL,
        attempts         INTEGER NOT NULL DEFAULT 0,
        output           TEXT,
        error            TEXT,
        error_kind       TEXT,
        worker           TEXT,
        session_id       TEXT,
        dispatch_id      TEXT,
        lease_expires_at INTEGER,
        created_at       INTEGER NOT NULL,
        started_at       INTEGER,
        finished_at      INTEGER,
        replays          INTEGER NOT NULL DEFAULT 0,
        progress_count   INTEGER NOT NULL DEFAULT 0,
        retry            TEXT,
        blocking         INTEGER NOT NULL DEFAULT 0,
        not_before       INTEGER,
        lease_losses     INTEGER NOT NULL DEFAULT 0,
        unit_cost        REAL NOT NULL DEFAULT 0,
        cost             REAL NOT NULL DEFAULT 0,
        decided_by       TEXT,
        approval_gate    TEXT,
        cache_ttl_ms     INTEGER,
        PRIMARY KEY (run_id, step_key)
    ) STRICT;
    CREATE INDEX steps_by_dispatch ON steps (dispatch_id) WHERE dispatch_id IS NOT NULL;
    CREATE INDEX steps_in_flight ON steps (status) WHERE status IN ('pending', 'running');

    CREATE TABLE approvals (
        id           TEXT PRIMARY KEY,
        run_id       TEXT NOT NULL REFERENCES runs (id),
        step_key     TEXT NOT NULL,
        tool         TEXT NOT NULL,
        call_hash    TEXT NOT NULL,
        arguments    TEXT NOT NULL,
        status       TEXT NOT NULL,
        approvers    TEXT NOT NULL,
        message      TEXT,
        decided_by   TEXT NOT NULL,
        requested_at INTEGER NOT NULL,
        expires_at   INTEGER,
        answered_at  INTEGER,
        decider      TEXT,
        reason       TEXT
    ) STRICT;
    CREATE INDEX approvals_pending ON approvals (status, expires_at) WHERE status = 'pending';
    CREATE INDEX approvals_by_run ON approvals (run_id, step_key);

    -- Results of read_only tools with a cache TTL, keyed by call hash (tool, fingerprint, canonical
    -- arguments); and the values tools keep through ctx.cache, namespaced per tool.
    CREATE TABLE result_cache (
        call_hash  TEXT PRIMARY KEY,
        tool       TEXT NOT NULL,
        output     TEXT NOT NULL,
        stored_at  INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE tool_cache (
        tool       TEXT NOT NULL,
        key        TEXT NOT NULL,
        value      TEXT NOT NULL,
        expires_at INTEGER,
        PRIMARY KEY (tool, key)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE tools (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        version       TEXT NOT NULL,
        fingerprint   TEXT NOT NULL,
        options       TEXT NOT NULL,
        first_seen_at INTEGER NOT NULL,
        last_seen_at  INTEGER NOT NULL
    ) STRICT;
    "#,
    // 2: expired cache entries are purged in the background; these find them without a scan. A
    // turn counts its run's open calls (the pending-calls limit): without an index on the run and
    // status that count read every call the run ever made, so a long run's turns grew slower one
    // by one. (Not a partial index on status: SQLite then updates a step's status in two passes
    // through a temporary table, and freeing it made glibc trim and regrow the writer's heap.)
    r#"
    CREATE INDEX result_cache_expiry ON result_cache (expires_at);
    CREATE INDEX tool_cache_expiry ON tool_cache (expires_at) WHERE expires_at IS NOT NULL;
    CREATE INDEX steps_by_run_status ON steps (run_id, status);
    "#,
    // 3: a settled step's outcome (why it ended so, for programs) and the answer to its approval.
    // Steps settled before this read their outcome from what they recorded.
    r#"
    ALTER TABLE steps ADD COLUMN outcome TEXT;
    ALTER TABLE steps ADD COLUMN approval TEXT;
    UPDATE steps SET outcome = CASE
        WHEN status = 'succeeded' THEN 'ok'
        WHEN status = 'cancelled' THEN 'cancelled'
        WHEN error LIKE 'indeterminate:%' THEN 'indeterminate'
        WHEN error_kind = 'poison' THEN 'poison'
        WHEN error LIKE 'unknown tool %' THEN 'unknown_tool'
        WHEN error LIKE 'invalid arguments for tool %' THEN 'invalid_arguments'
        WHEN error LIKE 'max_tool_calls reached:%' THEN 'limit_exceeded'
        WHEN error LIKE '% was not approved: the approval expired%' THEN 'expired'
        WHEN error LIKE '% was not approved: rejected by %' THEN 'rejected'
        WHEN error LIKE '% not allowed. reason: %' THEN 'denied'
        WHEN error LIKE 'tool % timed out after %' THEN 'timed_out'
        WHEN error LIKE 'no worker offering tool %' THEN 'no_worker'
        ELSE 'tool_error' END
    WHERE status IN ('succeeded', 'failed', 'cancelled');
    "#,
    // 4: which API key granted a run its permissions (NULL: no auth file, the run's own claim).
    r#"
    ALTER TABLE runs ADD COLUMN granted_by TEXT;
    "#,
    // 5: hosted runs. A run whose handler a worker hosts has one step of kind 'agent' (its own
    // dispatch, leased like a call's), and its handler's local steps are steps of kind 'local'.
    // Agents workers have offered are kept, so a run created while none is connected still waits
    // for one.
    r#"
    ALTER TABLE runs ADD COLUMN hosted INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN dispatches INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE steps ADD COLUMN kind TEXT NOT NULL DEFAULT 'tool';
    ALTER TABLE steps ADD COLUMN effect TEXT;
    -- Where each step of a hosted handler sits in its order, for the replay check; written only
    -- for hosted runs, so other runs' calls maintain no index for it.
    CREATE TABLE places (
        run_id   TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        step_key TEXT NOT NULL,
        PRIMARY KEY (run_id, seq, step_key)
    ) STRICT, WITHOUT ROWID;
    CREATE TABLE agents (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        version       TEXT NOT NULL,
        fingerprint   TEXT NOT NULL,
        first_seen_at INTEGER NOT NULL,
        last_seen_at  INTEGER NOT NULL
    ) STRICT;
    "#,
    // 6: subagents and sessions. A child run names its parent and the parent's step waiting for
    // it; runs of one session key run one at a time, in order of creation.
    r#"
    ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
    ALTER TABLE runs ADD COLUMN parent_step TEXT;
    ALTER TABLE runs ADD COLUMN session_key TEXT;
    ALTER TABLE runs ADD COLUMN suspensions INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_by_parent ON runs (parent_run_id, id) WHERE parent_run_id IS NOT NULL;
    CREATE INDEX runs_by_session ON runs (session_key, id) WHERE session_key IS NOT NULL;
    "#,
    // 7: a bound on how many calls of one turn run at once, for a run (its default) and per call
    // as its turn had it, so a restart keeps holding the rest back.
    r#"
    ALTER TABLE runs ADD COLUMN max_concurrency INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE steps ADD COLUMN max_concurrency INTEGER;
    -- A step of a hosted run may wake its handler when it settles; only those look the handler up.
    ALTER TABLE steps ADD COLUMN hosted INTEGER NOT NULL DEFAULT 0;
    UPDATE steps SET hosted = 1 WHERE run_id IN (SELECT id FROM runs WHERE hosted = 1);
    "#,
    // 8: the resources a call may change, filled from its arguments, and the locks on resource
    // instances held by running calls: a row exists exactly while its step runs.
    r#"
    ALTER TABLE steps ADD COLUMN resources TEXT;
    CREATE TABLE resource_locks (
        resource    TEXT PRIMARY KEY,
        run_id      TEXT NOT NULL,
        step_key    TEXT NOT NULL,
        dispatch_id TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        acquired_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX resource_locks_by_step ON resource_locks (run_id, step_key);
    "#,
    // 9: replicas on one database. A running step names the replica whose writer started it (its
    // lease's holder); each replica keeps a row it renews while it lives, whose age is the age of
    // every lease it holds, and lists what its worker sessions offer.
    r#"
    ALTER TABLE steps ADD COLUMN replica TEXT;
    -- A waiting call another replica claimed is left to it until then (milliseconds).
    ALTER TABLE steps ADD COLUMN claimed_until INTEGER;
    CREATE INDEX steps_by_replica ON steps (replica) WHERE status = 'running';
    CREATE TABLE replicas (
        id           TEXT PRIMARY KEY,
        started_at   INTEGER NOT NULL,
        heartbeat_at INTEGER NOT NULL,
        offers       TEXT NOT NULL
    ) STRICT;
    "#,
    // 10: branches and case runs. A branch names the run whose record it replays (with its fork
    // point and the results it replaced, as JSON); a case run its allow tokens; a branch's step
    // the run whose outcome it replays.
    r#"
    ALTER TABLE runs ADD COLUMN fork TEXT;
    ALTER TABLE runs ADD COLUMN allow TEXT;
    ALTER TABLE steps ADD COLUMN from_run TEXT;
    "#,
    // 11: trace context. A run keeps the W3C traceparent its spans are children of, and each
    // step a copy, so dispatching a call needs no read of its run.
    r#"
    ALTER TABLE runs ADD COLUMN trace TEXT;
    ALTER TABLE steps ADD COLUMN trace TEXT;
    "#,
    // 12: fewer pages written per commit. Events were a b-tree keyed by (run, seq), so every
    // commit rewrote a leaf, and its long-keyed parents, per run it touched; they are now a rowid
    // table, appended in commit order, found by a small index. A run's open steps are indexed alone:
    // settled ones made up nearly all of the old (run, status) index and each settling moved an
    // entry within it. Its condition avoids IN lists, which SQLite builds a temporary table for on
    // every update of a step; queries repeat it word for word (`unsettled!`) to use it.
    concat!(
        r#"
    CREATE TABLE events_appended (
        run_id         TEXT NOT NULL REFERENCES runs (id),
        seq            INTEGER NOT NULL,
        type           TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        at             INTEGER NOT NULL,
        payload        TEXT NOT NULL
    ) STRICT;
    INSERT INTO events_appended (run_id, seq, type, schema_version, at, payload)
        SELECT run_id, seq, type, schema_version, at, payload FROM events ORDER BY run_id, seq;
    DROP TABLE events;
    ALTER TABLE events_appended RENAME TO events;
    CREATE UNIQUE INDEX events_by_run ON events (run_id, seq);
    DROP INDEX steps_by_run_status;
    CREATE INDEX steps_unsettled ON steps (run_id, status) WHERE "#,
        unsettled!(),
        ";"
    ),
    // 13: one index fewer on each write of a step, two fewer on a start or a settling. The steps in
    // flight (read at start-up and by the periodic scan) and a replica's running steps (read when it
    // is found dead) are open steps, read by scanning `steps_unsettled`, which those writes keep anyway.
    r#"
    DROP INDEX steps_in_flight;
    DROP INDEX steps_by_replica;
    "#,
    // 14: a run's events linked instead of indexed. The index on (run, seq) still put each commit's
    // new entries in a leaf per run it touched: about half the pages a commit wrote under load.
    // Each event names the row of its run's previous event, the run row its last, and one event
    // in 256 of a run is indexed by number, where a read of a range starts its walk back. The
    // rows keep their numbers, now an `INTEGER PRIMARY KEY` (a plain rowid may change in a VACUUM).
    concat!(
        r#"
    CREATE TABLE events_linked (
        id             INTEGER PRIMARY KEY,
        run_id         TEXT NOT NULL REFERENCES runs (id),
        seq            INTEGER NOT NULL,
        type           TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        at             INTEGER NOT NULL,
        payload        TEXT NOT NULL,
        prev           INTEGER
    ) STRICT;
    INSERT INTO events_linked (id, run_id, seq, type, schema_version, at, payload, prev)
        SELECT rowid, run_id, seq, type, schema_version, at, payload,
               LAG(rowid) OVER (PARTITION BY run_id ORDER BY seq)
        FROM events ORDER BY rowid;
    ALTER TABLE runs ADD COLUMN last_event INTEGER;
    UPDATE runs SET last_event = latest.id
        FROM (SELECT run_id, id, ROW_NUMBER() OVER (PARTITION BY run_id ORDER BY seq DESC) AS place
              FROM events_linked) AS latest
        WHERE latest.run_id = runs.id AND latest.place = 1;
    DROP TABLE events;
    ALTER TABLE events_linked RENAME TO events;
    CREATE INDEX events_marks ON events (run_id, seq) WHERE "#,
        marked!(),
        ";"
    ),
    // 15: the runs each cached result belongs to: the run that stored it and every run served
    // from it. Deleting a run deletes an entry only once no run it belongs to is left; until
    // now it deleted every entry its calls' hashes matched, though another run had stored it.
    // Existing entries belong to every run with a call of their hash.
    r#"
    CREATE TABLE result_cache_runs (
        call_hash TEXT NOT NULL REFERENCES result_cache (call_hash) ON DELETE CASCADE,
        run_id    TEXT NOT NULL,
        PRIMARY KEY (call_hash, run_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX result_cache_runs_by_run ON result_cache_runs (run_id);
    INSERT INTO result_cache_runs (call_hash, run_id)
        SELECT DISTINCT steps.call_hash, steps.run_id FROM steps JOIN result_cache USING (call_hash);
    "#,
    // 16: a local step a handler checked before running it, and what allowed it, for the
    // dispatch that asked: its record names that decision, whatever the policy says by then.
    r#"
    CREATE TABLE step_checks (
        run_id      TEXT NOT NULL,
        step_key    TEXT NOT NULL,
        dispatch_id TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        decided_by  TEXT NOT NULL,
        PRIMARY KEY (run_id, step_key)
    ) STRICT, WITHOUT ROWID;
    "#,
    // 17: the shards runs are spread over among replicas, each with its owner and the epoch that
    // every change of owner raises, and the address each replica advertises. A kernel on SQLite
    // is one replica; the tables keep the two schemas alike.
    r#"
    CREATE TABLE shards (
        id         INTEGER PRIMARY KEY,
        owner      TEXT,
        epoch      INTEGER NOT NULL DEFAULT 0,
        changed_at INTEGER NOT NULL DEFAULT 0
    ) STRICT;
    WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 255)
    INSERT INTO shards (id) SELECT i FROM n;
    ALTER TABLE replicas ADD COLUMN address TEXT NOT NULL DEFAULT '';
    "#,
    // 18: a question a tool body puts to a person is answered with JSON, kept with its approval.
    r#"
    ALTER TABLE approvals ADD COLUMN answer TEXT;
    "#,
    r#"
    -- 19: what a run may spend on tool calls, and what it has spent (JSON; NULL: no budget).
    ALTER TABLE runs ADD COLUMN budget TEXT;
    "#,
    r#"
    -- 20: rate and concurrency limits on tools (the policy file's `limits`): each rate's token
    -- bucket, and on a step the limits its last start passed (JSON; NULL: none) and how long it
    -- waited for them. A running call's slot of a limit is a row of resource_locks.
    CREATE TABLE limit_buckets (
        name   TEXT PRIMARY KEY,
        tokens REAL NOT NULL,
        at     INTEGER NOT NULL
    ) STRICT;
    ALTER TABLE steps ADD COLUMN limited_by TEXT;
    ALTER TABLE steps ADD COLUMN limit_wait_ms INTEGER;
    "#,
    r#"
    -- 21: the run's share of the queue (the policy's `fair_shares`), copied to a call when it is
    -- recorded, so a restart serves the calls it finds queued by the same shares.
    ALTER TABLE steps ADD COLUMN share TEXT;
    "#,
    r#"
    -- 22: a call's secret argument values, sealed with the kernel's secret key until its dispatch
    -- (hex; NULL: none). The arguments column holds their keyed hashes.
    ALTER TABLE steps ADD COLUMN sealed TEXT;
    "#,
];

/// Brings the database to the newest schema.
pub fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    migrate_to(conn, latest())
}

fn migrate_to(conn: &mut Connection, version: usize) -> rusqlite::Result<()> {
    let current: usize = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for (index, sql) in MIGRATIONS.iter().enumerate().take(version).skip(current) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", index + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// The schema version this build writes.
pub fn latest() -> usize {
    MIGRATIONS.len()
}

/// A database in memory at the newest schema, for tests.
#[cfg(test)]
pub(super) fn migrated_in_memory() -> Connection {
    let mut conn = Connection::open_in_memory().expect("an in-memory database");
    migrate(&mut conn).expect("the migrations apply");
    conn
}

/// Inserts a running run with only the columns every schema version requires, for tests that
/// build a database by hand.
#[cfg(test)]
pub(super) fn insert_bare_run(conn: &Connection, id: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO runs (id, agent, status, input, labels, max_tool_calls, created_at, updated_at) \
         VALUES (?1, 'agent', 'running', '{}', '{}', 0, 0, 0)",
        [id],
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(conn: &Connection) -> Vec<(String, i64, String)> {
        conn.prepare("SELECT run_id, seq, payload FROM events ORDER BY run_id, seq")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn events_recorded_before_the_append_layout_keep_their_runs_order_and_uniqueness() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_to(&mut conn, 11).unwrap();
        for run in ["a", "b"] {
            insert_bare_run(&conn, run).unwrap();
        }
        for (run, seq) in [("b", 1), ("a", 2), ("b", 2), ("a", 1)] {
            conn.execute(
                "INSERT INTO events (run_id, seq, type, schema_version, at, payload) VALUES (?1, ?2, 'x', 1, 0, ?3)",
                rusqlite::params![run, seq, format!("{run}{seq}")],
            )
            .unwrap();
        }
        let before = events(&conn);
        migrate_to(&mut conn, 12).unwrap();
        assert_eq!(events(&conn), before);
        let duplicate = conn.execute(
            "INSERT INTO events (run_id, seq, type, schema_version, at, payload) VALUES ('a', 2, 'x', 1, 0, '')",
            [],
        );
        assert!(duplicate.is_err(), "a run's sequence number is taken once");
        let plan: String = conn
            .query_row(
                "EXPLAIN QUERY PLAN SELECT payload FROM events WHERE run_id = 'a' AND seq >= 1 ORDER BY seq",
                [],
                |row| row.get(3),
            )
            .unwrap();
        assert!(plan.contains("events_by_run"), "{plan}");
    }

    /// Events recorded under the index are linked in the migration: each names its run's event
    /// before it, each run its last, the rows keep their numbers, and a run's events read in order.
    #[test]
    fn events_recorded_under_the_run_index_are_linked_in_order() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate_to(&mut conn, 13).unwrap();
        for run in ["a", "b", "c"] {
            insert_bare_run(&conn, run).unwrap();
        }
        // Rows out of each run's order, as a log written by several writers' batches may be.
        for (row, run, seq) in [(1, "b", 1), (2, "a", 2), (3, "b", 2), (4, "a", 1), (5, "a", 3)] {
            conn.execute(
                "INSERT INTO events (rowid, run_id, seq, type, schema_version, at, payload) VALUES (?1, ?2, ?3, 'x', 1, 0, '')",
                rusqlite::params![row, run, seq],
            )
            .unwrap();
        }
        migrate(&mut conn).unwrap();
        let links: Vec<(i64, String, i64, Option<i64>)> = conn
            .prepare("SELECT id, run_id, seq, prev FROM events ORDER BY id")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected = [
            (1, "b", 1, None),
            (2, "a", 2, Some(4)),
            (3, "b", 2, Some(1)),
            (4, "a", 1, None),
            (5, "a", 3, Some(2)),
        ];
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(row, run, seq, prev)| (row, run.to_string(), seq, prev))
            .collect();
        assert_eq!(links, expected);
        let last: Vec<(String, Option<i64>)> = conn
            .prepare("SELECT id, last_event FROM runs ORDER BY id")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            last,
            [
                ("a".to_string(), Some(5)),
                ("b".to_string(), Some(3)),
                ("c".to_string(), None)
            ]
        );
    }
}
