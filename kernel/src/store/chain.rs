//! A run's events on SQLite, linked rather than indexed. The log is one table appended in commit
//! order. An index on (run, seq) put every commit's new entries in a leaf per run the commit
//! touched, about half the pages a commit wrote under load; instead each event names the row of its
//! run's previous event (`prev`) and the run row names its last (`last_event`), both written in the
//! commit that appends. A read walks back from the last event, or from the first indexed event at
//! or past the end of the range it wants: one event in 256 of a run is indexed by number
//! (`events_marks`), so a read of a long run's page walks at most 255 rows it does not return.
//! PostgreSQL keeps its index on (run, seq); nothing here runs there.

use super::rows::{self, EVENT_COLUMNS};
use super::schema::marked;
use super::sql::{Connection, Error, OptionalExtension, Result, params};
use crate::model::{EventRecord, RunId};

/// Where an event sits in its run's chain: its row and the row of the run's event before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub row: i64,
    pub prev: Option<i64>,
}

/// Deletes a run's events, walking its chain from the last.
pub const DELETE_RUN_EVENTS: &str = "DELETE FROM events WHERE id IN (\
     WITH RECURSIVE chain(row) AS (\
       SELECT last_event FROM runs WHERE id = ?1 AND last_event IS NOT NULL \
       UNION ALL \
       SELECT events.prev FROM events JOIN chain ON events.id = chain.row WHERE events.prev IS NOT NULL) \
     SELECT row FROM chain)";

/// The first marked event of run `?1` numbered `?2` or later.
const MARK_AT_OR_AFTER: &str = concat!(
    "SELECT id FROM events WHERE run_id = ?1 AND seq >= ?2 AND ",
    marked!(),
    " ORDER BY seq LIMIT 1"
);

/// The row the next appended event takes.
pub fn next_row(conn: &Connection<'_>) -> Result<i64> {
    conn.query_row("SELECT COALESCE(MAX(id), 0) + 1 FROM events", &[], |row| row.get(0))
}

/// The row of run `run`'s last event as committed (none before its first).
pub fn last_event(conn: &Connection<'_>, run: &RunId) -> Result<Option<i64>> {
    Ok(conn
        .query_row(
            "SELECT last_event FROM runs WHERE id = ?1",
            params![run.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .flatten())
}

/// Up to `limit` events of run `run` from number `from` on, in order; call inside a snapshot, so
/// the run row and the rows walked are of one commit.
pub fn events(conn: &Connection<'_>, run: &RunId, from: u64, limit: u32) -> Result<Vec<EventRecord>> {
    let Some((last_seq, last_event)) = conn
        .query_row(
            "SELECT last_seq, last_event FROM runs WHERE id = ?1",
            params![run.as_str()],
            |row| Ok((row.get::<u64>(0)?, row.get::<Option<i64>>(1)?)),
        )
        .optional()?
    else {
        return Ok(Vec::new());
    };
    let from = from.max(1);
    if limit == 0 || from > last_seq {
        return Ok(Vec::new());
    }
    let end = last_seq.min(from.saturating_add(u64::from(limit) - 1));
    let start = if end == last_seq {
        last_event
    } else {
        conn.query_row(MARK_AT_OR_AFTER, params![run.as_str(), end], |row| row.get(0))
            .optional()?
            .or(last_event)
    };
    let mut found = Vec::with_capacity(usize::try_from(end - from + 1).unwrap_or(0));
    let mut walk = conn.prepare_cached(&format!("SELECT {EVENT_COLUMNS}, prev FROM events WHERE id = ?1"))?;
    let mut next = start;
    while let Some(row) = next {
        let (event, prev) = walk
            .query_row(params![row], |row| {
                Ok((rows::event_from_row(row)?, row.get::<Option<i64>>(6)?))
            })
            .optional()?
            .ok_or_else(|| Error::Backend(format!("event row {row} of run {run}'s chain is missing")))?;
        if event.run_id != *run {
            return Err(Error::Backend(format!(
                "run {run}'s chain of events reaches row {row}, an event of run {}",
                event.run_id
            )));
        }
        if event.seq < from {
            break;
        }
        if event.seq <= end {
            found.push(event);
        }
        next = prev;
    }
    found.reverse();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk starts from the marks' index, not a scan of the log.
    #[test]
    fn a_range_starts_from_the_marks_index() {
        let conn = super::super::schema::migrated_in_memory();
        let plan: String = conn
            .query_row(&format!("EXPLAIN QUERY PLAN {MARK_AT_OR_AFTER}"), ["a", "1"], |row| {
                row.get(3)
            })
            .unwrap();
        assert!(plan.contains("INDEX events_marks"), "{plan}");
        let plan: String = conn
            .query_row("EXPLAIN QUERY PLAN SELECT prev FROM events WHERE id = 1", [], |row| {
                row.get(3)
            })
            .unwrap();
        assert!(plan.contains("INTEGER PRIMARY KEY"), "{plan}");
    }
}
