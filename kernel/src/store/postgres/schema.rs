//! The PostgreSQL schema, as numbered migrations of its own. Migration 1 is the SQLite schema at
//! its version 8, in PostgreSQL's types: `BIGINT` for SQLite's integers (times in milliseconds,
//! counters, 0/1 flags), `DOUBLE PRECISION` for its reals, `TEXT` for JSON and names, so one row
//! reads the same from either store.

pub(super) const MIGRATIONS: &[&str] = &[
    // 1: runs, their event log, steps, approvals, caches, the tool and agent registries, hosted
    // handlers' places, and resource locks.
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
        max_tool_calls  BIGINT NOT NULL,
        interactive     BIGINT NOT NULL DEFAULT 1,
        capture         TEXT NOT NULL DEFAULT 'io',
        permissions     TEXT NOT NULL DEFAULT '[]',
        tool_calls      BIGINT NOT NULL DEFAULT 0,
        last_seq        BIGINT NOT NULL DEFAULT 0,
        created_at      BIGINT NOT NULL,
        updated_at      BIGINT NOT NULL,
        granted_by      TEXT,
        hosted          BIGINT NOT NULL DEFAULT 0,
        dispatches      BIGINT NOT NULL DEFAULT 0,
        parent_run_id   TEXT,
        parent_step     TEXT,
        session_key     TEXT,
        suspensions     BIGINT NOT NULL DEFAULT 0,
        max_concurrency BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_by_status ON runs (status, id);
    CREATE INDEX runs_by_agent ON runs (agent, id);
    CREATE INDEX runs_by_parent ON runs (parent_run_id, id) WHERE parent_run_id IS NOT NULL;
    CREATE INDEX runs_by_session ON runs (session_key, id) WHERE session_key IS NOT NULL;

    CREATE TABLE events (
        run_id         TEXT NOT NULL REFERENCES runs (id),
        seq            BIGINT NOT NULL,
        type           TEXT NOT NULL,
        schema_version BIGINT NOT NULL,
        at             BIGINT NOT NULL,
        payload        TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );

    CREATE TABLE steps (
        run_id           TEXT NOT NULL REFERENCES runs (id),
        step_key         TEXT NOT NULL,
        turn             BIGINT NOT NULL,
        position         BIGINT NOT NULL,
        call_id          TEXT,
        tool             TEXT NOT NULL,
        fingerprint      TEXT NOT NULL,
        version          TEXT NOT NULL,
        arguments        TEXT NOT NULL,
        call_hash        TEXT NOT NULL,
        idempotency_key  TEXT NOT NULL,
        idempotency      TEXT NOT NULL,
        timeout_ms       BIGINT NOT NULL,
        status           TEXT NOT NULL,
        attempts         BIGINT NOT NULL DEFAULT 0,
        output           TEXT,
        error            TEXT,
        error_kind       TEXT,
        worker           TEXT,
        session_id       TEXT,
        dispatch_id      TEXT,
        lease_expires_at BIGINT,
        created_at       BIGINT NOT NULL,
        started_at       BIGINT,
        finished_at      BIGINT,
        replays          BIGINT NOT NULL DEFAULT 0,
        progress_count   BIGINT NOT NULL DEFAULT 0,
        retry            TEXT,
        blocking         BIGINT NOT NULL DEFAULT 0,
        not_before       BIGINT,
        lease_losses     BIGINT NOT NULL DEFAULT 0,
        unit_cost        DOUBLE PRECISION NOT NULL DEFAULT 0,
        cost             DOUBLE PRECISION NOT NULL DEFAULT 0,
        decided_by       TEXT,
        approval_gate    TEXT,
        cache_ttl_ms     BIGINT,
        outcome          TEXT,
        approval         TEXT,
        kind             TEXT NOT NULL DEFAULT 'tool',
        effect           TEXT,
        max_concurrency  BIGINT,
        hosted           BIGINT NOT NULL DEFAULT 0,
        resources        TEXT,
        PRIMARY KEY (run_id, step_key)
    );
    CREATE INDEX steps_by_dispatch ON steps (dispatch_id) WHERE dispatch_id IS NOT NULL;
    CREATE INDEX steps_in_flight ON steps (status) WHERE status IN ('pending', 'running');
    CREATE INDEX steps_by_run_status ON steps (run_id, status);

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
        requested_at BIGINT NOT NULL,
        expires_at   BIGINT,
        answered_at  BIGINT,
        decider      TEXT,
        reason       TEXT
    );
    CREATE INDEX approvals_pending ON approvals (status, expires_at) WHERE status = 'pending';
    CREATE INDEX approvals_by_run ON approvals (run_id, step_key);

    CREATE TABLE result_cache (
        call_hash  TEXT PRIMARY KEY,
        tool       TEXT NOT NULL,
        output     TEXT NOT NULL,
        stored_at  BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE INDEX result_cache_expiry ON result_cache (expires_at);

    CREATE TABLE tool_cache (
        tool       TEXT NOT NULL,
        key        TEXT NOT NULL,
        value      TEXT NOT NULL,
        expires_at BIGINT,
        PRIMARY KEY (tool, key)
    );
    CREATE INDEX tool_cache_expiry ON tool_cache (expires_at) WHERE expires_at IS NOT NULL;

    CREATE TABLE tools (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        version       TEXT NOT NULL,
        fingerprint   TEXT NOT NULL,
        options       TEXT NOT NULL,
        first_seen_at BIGINT NOT NULL,
        last_seen_at  BIGINT NOT NULL
    );

    CREATE TABLE places (
        run_id   TEXT NOT NULL,
        seq      BIGINT NOT NULL,
        step_key TEXT NOT NULL,
        PRIMARY KEY (run_id, seq, step_key)
    );

    CREATE TABLE agents (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        version       TEXT NOT NULL,
        fingerprint   TEXT NOT NULL,
        first_seen_at BIGINT NOT NULL,
        last_seen_at  BIGINT NOT NULL
    );

    CREATE TABLE resource_locks (
        resource    TEXT PRIMARY KEY,
        run_id      TEXT NOT NULL,
        step_key    TEXT NOT NULL,
        dispatch_id TEXT NOT NULL,
        attempt     BIGINT NOT NULL,
        acquired_at BIGINT NOT NULL
    );
    CREATE INDEX resource_locks_by_step ON resource_locks (run_id, step_key);
    "#,
    // 2: replicas (SQLite's 9). A running step names the replica holding its lease; a replica's
    // row, renewed while it lives, dates every lease it holds and lists what its sessions offer.
    r#"
    ALTER TABLE steps ADD COLUMN replica TEXT;
    ALTER TABLE steps ADD COLUMN claimed_until BIGINT;
    CREATE INDEX steps_by_replica ON steps (replica) WHERE status = 'running';
    CREATE INDEX steps_pending_by_tool ON steps (tool, created_at) WHERE status = 'pending';
    CREATE TABLE replicas (
        id           TEXT PRIMARY KEY,
        started_at   BIGINT NOT NULL,
        heartbeat_at BIGINT NOT NULL,
        offers       TEXT NOT NULL
    );
    "#,
    // 3: a counter every writer's commit raises, so a writer knows whether anyone else committed
    // since its own last commit (and whether what it remembers of its rows still holds).
    r#"
    CREATE TABLE writer_commits (
        id BIGINT PRIMARY KEY,
        n  BIGINT NOT NULL
    );
    INSERT INTO writer_commits (id, n) VALUES (1, 0);
    "#,
    // 4: branches and case runs (SQLite's 10).
    r#"
    ALTER TABLE runs ADD COLUMN fork TEXT;
    ALTER TABLE runs ADD COLUMN allow TEXT;
    ALTER TABLE steps ADD COLUMN from_run TEXT;
    "#,
    // 5: trace context (SQLite's 11).
    r#"
    ALTER TABLE runs ADD COLUMN trace TEXT;
    ALTER TABLE steps ADD COLUMN trace TEXT;
    "#,
    // 6: the runs each cached result belongs to (SQLite's 15).
    r#"
    CREATE TABLE result_cache_runs (
        call_hash TEXT NOT NULL REFERENCES result_cache (call_hash) ON DELETE CASCADE,
        run_id    TEXT NOT NULL,
        PRIMARY KEY (call_hash, run_id)
    );
    CREATE INDEX result_cache_runs_by_run ON result_cache_runs (run_id);
    INSERT INTO result_cache_runs (call_hash, run_id)
        SELECT DISTINCT steps.call_hash, steps.run_id FROM steps JOIN result_cache USING (call_hash);
    "#,
    // 7: the local steps checked before they ran, and what allowed each (SQLite's 16).
    r#"
    CREATE TABLE step_checks (
        run_id      TEXT NOT NULL,
        step_key    TEXT NOT NULL,
        dispatch_id TEXT NOT NULL,
        attempt     BIGINT NOT NULL,
        decided_by  TEXT NOT NULL,
        PRIMARY KEY (run_id, step_key)
    );
    "#,
    // 8: the shards runs are spread over among replicas, 256 of them for the database's life,
    // each with its owner and the epoch that every change of owner raises, and the address each
    // replica advertises (SQLite's 17).
    r#"
    CREATE TABLE shards (
        id         BIGINT PRIMARY KEY,
        owner      TEXT,
        epoch      BIGINT NOT NULL DEFAULT 0,
        changed_at BIGINT NOT NULL DEFAULT 0
    );
    INSERT INTO shards (id) SELECT generate_series(0, 255);
    ALTER TABLE replicas ADD COLUMN address TEXT NOT NULL DEFAULT '';
    "#,
    // 9: the key replicas show each other on their links (no SQLite counterpart: one kernel per
    // file has no other to talk to), drawn once by the database's strong random generator.
    r#"
    CREATE TABLE cluster (
        id       SMALLINT PRIMARY KEY CHECK (id = 1),
        link_key TEXT NOT NULL
    );
    INSERT INTO cluster (id, link_key)
        VALUES (1, replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
    -- Writers no longer count commits to learn whether another wrote: each writes only its shards.
    DROP TABLE writer_commits;
    "#,
    // 10: a question a tool body puts to a person is answered with JSON, kept with its approval.
    r#"
    ALTER TABLE approvals ADD COLUMN answer TEXT;
    "#,
    r#"
    -- 11: what a run may spend on tool calls, and what it has spent (JSON; NULL: no budget).
    ALTER TABLE runs ADD COLUMN budget TEXT;
    "#,
    r#"
    -- 12: rate and concurrency limits on tools (the policy file's `limits`): each rate's token
    -- bucket, and on a step the limits its last start passed (JSON; NULL: none) and how long it
    -- waited for them. A running call's slot of a limit is a row of resource_locks.
    CREATE TABLE limit_buckets (
        name   TEXT PRIMARY KEY,
        tokens DOUBLE PRECISION NOT NULL,
        at     BIGINT NOT NULL
    );
    ALTER TABLE steps ADD COLUMN limited_by TEXT;
    ALTER TABLE steps ADD COLUMN limit_wait_ms BIGINT;
    "#,
    r#"
    -- 13: the run's share of the queue (the policy's `fair_shares`), copied to a call when it is
    -- recorded, so a restart serves the calls it finds queued by the same shares.
    ALTER TABLE steps ADD COLUMN share TEXT;
    "#,
    r#"
    -- 14: a call's secret argument values, sealed with the kernel's secret key until its dispatch
    -- (hex; NULL: none). The arguments column holds their keyed hashes.
    ALTER TABLE steps ADD COLUMN sealed TEXT;
    "#,
];
