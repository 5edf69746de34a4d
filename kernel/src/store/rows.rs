//! Row mapping shared by the writer and the readers.

use std::collections::BTreeMap;

use super::sql::{Connection, Dialect, Error, OptionalExtension, Result, Row, params};

use crate::model::{
    ApprovalId, ApprovalRecord, DispatchId, EventRecord, RecordedResult, RunId, RunRecord, StepKey, StepRecord,
};

pub const RUN_COLUMNS: &str = "id, agent, status, input, output, reason, labels, idempotency_key, \
     max_tool_calls, tool_calls, last_seq, created_at, updated_at, interactive, permissions, capture, granted_by, hosted, dispatches, parent_run_id, parent_step, \
     session_key, suspensions, max_concurrency, fork, allow, trace, budget";

pub const STEP_COLUMNS: &str = "run_id, step_key, turn, position, call_id, tool, fingerprint, version, \
     arguments, call_hash, idempotency_key, idempotency, timeout_ms, status, attempts, output, error, \
     error_kind, worker, session_id, dispatch_id, lease_expires_at, created_at, started_at, finished_at, \
     replays, progress_count, retry, blocking, not_before, lease_losses, unit_cost, cost, decided_by, approval_gate, cache_ttl_ms, outcome, approval, kind, effect, max_concurrency, hosted, resources, replica, from_run, trace, limited_by, limit_wait_ms, share, sealed";

/// The columns of a step that [`result_from_row`] reads.
pub const RESULT_COLUMNS: &str =
    "step_key, tool, call_hash, status, attempts, output, error, error_kind, outcome, decided_by, approval";

pub const APPROVAL_COLUMNS: &str = "id, run_id, step_key, tool, call_hash, arguments, status, approvers, message, \
     decided_by, requested_at, expires_at, answered_at, decider, reason, \
     (SELECT capture FROM runs WHERE runs.id = approvals.run_id), answer";

pub const EVENT_COLUMNS: &str = "run_id, seq, type, schema_version, at, payload";

fn parse<T: std::str::FromStr<Err = String>>(row: &Row<'_>, index: usize) -> Result<T> {
    let text: String = row.get(index)?;
    text.parse().map_err(|e: String| Error::conversion(index, e))
}

fn parse_opt<T: std::str::FromStr<Err = String>>(row: &Row<'_>, index: usize) -> Result<Option<T>> {
    let text: Option<String> = row.get(index)?;
    text.map(|t| t.parse().map_err(|e: String| Error::conversion(index, e)))
        .transpose()
}

pub fn run_from_row(row: &Row<'_>) -> Result<RunRecord> {
    let labels: String = row.get(6)?;
    Ok(RunRecord {
        id: RunId::parse(&row.get::<String>(0)?, "id").map_err(|e| Error::conversion(0, e.to_string()))?,
        agent: row.get(1)?,
        status: parse(row, 2)?,
        input: row.get(3)?,
        output: row.get(4)?,
        reason: row.get(5)?,
        labels: serde_json::from_str::<BTreeMap<String, String>>(&labels).unwrap_or_default(),
        idempotency_key: row.get(7)?,
        max_tool_calls: row.get(8)?,
        tool_calls: row.get(9)?,
        last_seq: row.get(10)?,
        created_at: row.get(11)?,
        updated_at: row.get(12)?,
        interactive: row.get(13)?,
        permissions: serde_json::from_str(&row.get::<String>(14)?).unwrap_or_default(),
        capture: parse(row, 15)?,
        granted_by: row.get(16)?,
        hosted: row.get(17)?,
        dispatches: row.get(18)?,
        parent: match (row.get::<Option<String>>(19)?, row.get::<Option<String>>(20)?) {
            (Some(run), Some(step)) => Some((
                RunId::parse(&run, "parent_run_id").map_err(|e| Error::conversion(19, e.to_string()))?,
                StepKey::from_stored(step),
            )),
            _ => None,
        },
        session_key: row.get(21)?,
        suspensions: row.get(22)?,
        max_concurrency: row.get(23)?,
        fork: row
            .get::<Option<String>>(24)?
            .map(|text| serde_json::from_str(&text).map_err(|e| Error::conversion(24, e.to_string())))
            .transpose()?,
        allow: row
            .get::<Option<String>>(25)?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
        trace: parse_opt(row, 26)?,
        budget: row
            .get::<Option<String>>(27)?
            .map(|text| serde_json::from_str(&text).map_err(|e| Error::conversion(27, e.to_string())))
            .transpose()?,
    })
}

pub fn step_from_row(row: &Row<'_>) -> Result<StepRecord> {
    Ok(StepRecord {
        run_id: RunId::parse(&row.get::<String>(0)?, "run_id").map_err(|e| Error::conversion(0, e.to_string()))?,
        key: StepKey::from_stored(row.get(1)?),
        kind: parse(row, 38)?,
        effect: parse_opt(row, 39)?,
        max_concurrency: row.get(40)?,
        hosted: row.get(41)?,
        turn: row.get(2)?,
        position: row.get(3)?,
        call_id: row.get(4)?,
        tool: row.get(5)?,
        fingerprint: row.get(6)?,
        version: row.get(7)?,
        arguments: row.get(8)?,
        call_hash: row.get(9)?,
        idempotency_key: row.get(10)?,
        idempotency: parse(row, 11)?,
        timeout_ms: row.get(12)?,
        status: parse(row, 13)?,
        attempts: row.get(14)?,
        output: row.get(15)?,
        error: row.get(16)?,
        error_kind: parse_opt(row, 17)?,
        worker: row.get(18)?,
        session_id: row.get(19)?,
        dispatch_id: row.get(20)?,
        lease_expires_at: row.get(21)?,
        created_at: row.get(22)?,
        started_at: row.get(23)?,
        finished_at: row.get(24)?,
        replays: row.get(25)?,
        progress_count: row.get(26)?,
        retry: row
            .get::<Option<String>>(27)?
            .and_then(|text| serde_json::from_str(&text).ok()),
        blocking: row.get(28)?,
        not_before: row.get(29)?,
        lease_losses: row.get(30)?,
        unit_cost: row.get(31)?,
        cost: row.get(32)?,
        decided_by: row.get(33)?,
        approval_gate: row
            .get::<Option<String>>(34)?
            .and_then(|text| serde_json::from_str(&text).ok()),
        cache_ttl_ms: row.get(35)?,
        outcome: parse_opt(row, 36)?,
        approval: row
            .get::<Option<String>>(37)?
            .and_then(|text| serde_json::from_str(&text).ok()),
        resources: row
            .get::<Option<String>>(42)?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
        replica: row.get(43)?,
        from_run: row
            .get::<Option<String>>(44)?
            .map(|text| RunId::parse(&text, "from_run").map_err(|e| Error::conversion(44, e.to_string())))
            .transpose()?,
        trace: parse_opt(row, 45)?,
        limited_by: row
            .get::<Option<String>>(46)?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
        limit_wait_ms: row.get::<Option<u64>>(47)?.unwrap_or(0),
        share: row.get(48)?,
        sealed: row.get(49)?,
    })
}

pub fn result_from_row(row: &Row<'_>) -> Result<RecordedResult> {
    Ok(RecordedResult {
        key: StepKey::from_stored(row.get(0)?),
        tool: row.get(1)?,
        call_hash: row.get(2)?,
        status: parse(row, 3)?,
        attempts: row.get(4)?,
        output: row.get(5)?,
        error: row.get(6)?,
        error_kind: parse_opt(row, 7)?,
        outcome: parse_opt(row, 8)?,
        decided_by: row.get(9)?,
        approval: row
            .get::<Option<String>>(10)?
            .and_then(|text| serde_json::from_str(&text).ok()),
    })
}

pub fn approval_from_row(row: &Row<'_>) -> Result<ApprovalRecord> {
    Ok(ApprovalRecord {
        id: row.get(0)?,
        run_id: RunId::parse(&row.get::<String>(1)?, "run_id").map_err(|e| Error::conversion(1, e.to_string()))?,
        key: StepKey::from_stored(row.get(2)?),
        tool: row.get(3)?,
        call_hash: row.get(4)?,
        arguments: row.get(5)?,
        status: parse(row, 6)?,
        approvers: serde_json::from_str(&row.get::<String>(7)?).unwrap_or_default(),
        message: row.get(8)?,
        decided_by: row.get(9)?,
        requested_at: row.get(10)?,
        expires_at: row.get(11)?,
        answered_at: row.get(12)?,
        decider: row.get(13)?,
        reason: row.get(14)?,
        capture: parse(row, 15)?,
        answer: row.get(16)?,
    })
}

pub fn load_approval(conn: &Connection<'_>, id: &ApprovalId) -> Result<Option<ApprovalRecord>> {
    conn.prepare_cached(&format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?1"))?
        .query_row(params![id], approval_from_row)
        .optional()
}

pub fn event_from_row(row: &Row<'_>) -> Result<EventRecord> {
    Ok(EventRecord {
        run_id: RunId::parse(&row.get::<String>(0)?, "run_id").map_err(|e| Error::conversion(0, e.to_string()))?,
        seq: row.get(1)?,
        kind: parse(row, 2)?,
        schema_version: row.get(3)?,
        at: row.get(4)?,
        payload: row.get(5)?,
    })
}

pub fn load_run(conn: &Connection<'_>, id: &RunId) -> Result<Option<RunRecord>> {
    conn.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"))?
        .query_row(params![id.as_str()], run_from_row)
        .optional()
}

pub fn load_step(conn: &Connection<'_>, run: &RunId, key: &StepKey) -> Result<Option<StepRecord>> {
    conn.prepare_cached(&format!(
        "SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?1 AND step_key = ?2"
    ))?
    .query_row(params![run.as_str(), key.as_str()], step_from_row)
    .optional()
}

/// The steps of `run` under `keys`, in one statement and in no particular order; a key with no
/// step has no row.
pub fn load_steps<'k>(
    conn: &Connection<'_>,
    run: &RunId,
    keys: impl IntoIterator<Item = &'k StepKey>,
) -> Result<Vec<StepRecord>> {
    load_keyed(conn, STEP_COLUMNS, step_from_row, run, keys)
}

/// The rows of `run`'s steps under `keys`, `columns` of each mapped by `from_row`, in one
/// statement and in no particular order.
fn load_keyed<'k, T>(
    conn: &Connection<'_>,
    columns: &str,
    from_row: fn(&Row<'_>) -> Result<T>,
    run: &RunId,
    keys: impl IntoIterator<Item = &'k StepKey>,
) -> Result<Vec<T>> {
    let (listed, keys) = key_list(conn, keys);
    conn.prepare_cached(&format!(
        "SELECT {columns} FROM steps WHERE run_id = ?1 AND step_key IN ({listed})"
    ))?
    .query_map(params![run.as_str(), keys], from_row)?
    .collect()
}

/// The rows of `run`'s steps under `keys` as [`load_keyed`] reads them, or on SQLite, when every
/// key is a positional call of one turn (`t3/p0`), as the one range of the key index from the
/// smallest key to the largest: a turn's calls lie side by side there, and one seek and a walk
/// cost less than a seek per key. That range may hold other calls of the turn too; the caller
/// picks out the keys it asked for.
pub fn load_turn_keyed<T>(
    conn: &Connection<'_>,
    columns: &str,
    from_row: fn(&Row<'_>) -> Result<T>,
    run: &RunId,
    keys: &[&StepKey],
) -> Result<Vec<T>> {
    let turn = keys.first().and_then(|key| key.positional_turn());
    let one_turn = turn.is_some() && keys.iter().all(|key| key.positional_turn() == turn);
    let (true, Dialect::Sqlite, Some(first), Some(last)) =
        (one_turn, conn.dialect(), keys.iter().min(), keys.iter().max())
    else {
        return load_keyed(conn, columns, from_row, run, keys.iter().copied());
    };
    conn.prepare_cached(&format!(
        "SELECT {columns} FROM steps WHERE run_id = ?1 AND step_key BETWEEN ?2 AND ?3"
    ))?
    .query_map(params![run.as_str(), first.as_str(), last.as_str()], from_row)?
    .collect()
}

/// Step keys as one argument, `?2`, with the subquery that lists them: a statement over many
/// keys is prepared once and run once, whatever their number.
pub fn key_list<'k>(conn: &Connection<'_>, keys: impl IntoIterator<Item = &'k StepKey>) -> (&'static str, String) {
    let keys: Vec<&str> = keys.into_iter().map(StepKey::as_str).collect();
    let keys = serde_json::to_string(&keys).expect("a list of strings serializes");
    let listed = match conn.dialect() {
        Dialect::Sqlite => "SELECT value FROM json_each(?2)",
        Dialect::Postgres => "SELECT jsonb_array_elements_text(CAST(CAST(?2 AS TEXT) AS jsonb))",
    };
    (listed, keys)
}

/// The step a dispatch holds, with its run's last event number (so the writer numbers the event
/// it appends for that step without a round trip of its own).
pub fn load_step_by_dispatch(conn: &Connection<'_>, dispatch_id: &DispatchId) -> Result<Option<(StepRecord, u64)>> {
    let last_seq_at = STEP_COLUMNS.split(',').count();
    conn.prepare_cached(&format!(
        "SELECT {STEP_COLUMNS}, (SELECT last_seq FROM runs WHERE runs.id = steps.run_id) FROM steps \
         WHERE dispatch_id = ?1"
    ))?
    .query_row(params![dispatch_id], |row| {
        Ok((step_from_row(row)?, row.get(last_seq_at)?))
    })
    .optional()
}
