//! Numbered migrations. Each runs once, in order, inside the writer's first transaction; the
//! applied version is kept in `PRAGMA user_version`.

use rusqlite::Connection;

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
];

/// Brings the database to the newest schema.
pub fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let current: usize = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current) {
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
