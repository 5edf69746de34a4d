//! Which commits wait for the disk.
//!
//! A commit is durable against a crash of the kernel process as soon as it returns: its pages are
//! in the operating system's cache. What `--durability full` adds is a sync, so that a commit also
//! survives power loss, and that sync is most of a commit's time. Almost every command's answer
//! waits for it. A command that does nothing but schedule tool calls and start `safe_to_retry`
//! ones does not: losing it to a power cut loses calls whose results nobody has seen, which the
//! agent's next submission of the turn runs again with the same idempotency keys, the promise of
//! that mode. A turn's `safe_to_retry` calls go out even before that commit, once the write has
//! decided them ([`dispatches_before_commit`]), so a call's critical path holds one commit and one
//! sync, its result's. Nor does a count of replays: the results it counts were durable before
//! they were served, and nobody waits for it. The log stays in order: a later commit that syncs
//! makes every commit before it durable too (the write-ahead log is written in order, and one sync
//! covers all of it), so a result is never durable while its start is not.

use std::fs::File;
use std::path::Path;

use super::CallDisposition;
use super::ops::Published;
use crate::model::{EventType, Idempotency, StepKind, StepRecord};

/// Whether the command that published `events` must be durable before it is answered.
pub fn must_sync(events: &[Published]) -> bool {
    events.is_empty() || !events.iter().all(may_defer)
}

/// An event whose loss to a power cut, with everything committed after it, loses nothing anyone
/// was told.
fn may_defer(published: &Published) -> bool {
    let call = published.step.as_ref().filter(|step| step.kind == StepKind::Tool);
    match published.event.kind {
        // A call recorded, not yet run (its event carries no step).
        EventType::RunStarted | EventType::ToolScheduled => true,
        // An `at_most_once` call may run only once its start survives anything: then a lost
        // worker means `indeterminate`, never a second run.
        EventType::ToolStart => call.is_some_and(goes_out_before_commit),
        _ => false,
    }
}

/// Whether a started call may go to its worker before its start commits: a `safe_to_retry` tool
/// call. If the commit then never happens (the kernel dies, the disk refuses it), the call is
/// recorded nowhere, its result is refused, and the agent's next submission of the turn runs it
/// again with the same idempotency key. Its result still commits after its start (one writer,
/// in order) and is durable before anyone sees it.
fn goes_out_before_commit(step: &StepRecord) -> bool {
    step.kind == StepKind::Tool && step.idempotency == Idempotency::SafeToRetry
}

/// The calls a turn's write started that may go to their workers before it commits.
pub fn dispatches_before_commit(calls: &[CallDisposition]) -> Vec<StepRecord> {
    calls
        .iter()
        .filter_map(|call| match call {
            CallDisposition::Started(step) if goes_out_before_commit(step) => Some(step.clone()),
            _ => None,
        })
        .collect()
}

/// How a SQLite writer makes a commit durable. SQLite cannot change `synchronous` inside a
/// transaction, and whether a batch must sync is known only once its commands ran; so the
/// connection runs at `synchronous=NORMAL` and a batch that must sync flushes the write-ahead log
/// itself once committed. That is what `FULL` adds to `NORMAL` in WAL mode (a sync of the log
/// after each commit); checkpoints sync as before.
pub struct SqliteSync {
    /// The write-ahead log, at `--durability full`; at `normal` no commit syncs. Opened once:
    /// SQLite deletes the log only when its last connection closes, and the writer's connection
    /// lives as long as this.
    wal: Option<File>,
}

impl SqliteSync {
    /// Puts the writer's connection `conn`, on the database at `path` in WAL mode, in the mode
    /// its commits run in, at `full` (or `normal`) durability.
    pub fn open(conn: &rusqlite::Connection, path: &Path, full: bool) -> Result<Self, Box<dyn std::error::Error>> {
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let wal = if full {
            let mut name = path.as_os_str().to_owned();
            name.push("-wal");
            // Created if SQLite has not yet: an empty log is a valid one, and SQLite opens it by
            // name, so both reach the same file.
            Some(
                File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(name)?,
            )
        } else {
            None
        };
        Ok(SqliteSync { wal })
    }

    /// After a commit: makes it, and every commit before it, durable if `sync` asks and the
    /// durability allows; says whether it synced.
    pub fn after_commit(&self, sync: bool) -> std::io::Result<bool> {
        match &self.wal {
            Some(wal) if sync => wal.sync_data().map(|()| true),
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventRecord, RunId, StepRecord};

    fn event(kind: EventType, step: Option<StepRecord>) -> Published {
        Published {
            event: EventRecord {
                run_id: RunId::new(),
                seq: 1,
                kind,
                schema_version: 1,
                at: 0,
                payload: "{}".into(),
            },
            step,
        }
    }

    fn call(idempotency: Idempotency) -> Option<StepRecord> {
        let mut step = crate::machine::records::step();
        step.idempotency = idempotency;
        Some(step)
    }

    #[test]
    fn a_turn_that_only_schedules_and_starts_safe_calls_does_not_wait_for_the_disk() {
        let safe = [
            event(EventType::RunStarted, None),
            event(EventType::ToolScheduled, None),
            event(EventType::ToolStart, call(Idempotency::SafeToRetry)),
            event(EventType::ToolScheduled, None),
        ];
        assert!(!must_sync(&safe));
    }

    #[test]
    fn an_at_most_once_start_a_result_or_a_command_without_events_waits_for_the_disk() {
        let scheduled = event(EventType::ToolScheduled, None);
        for other in [
            event(EventType::ToolStart, call(Idempotency::AtMostOnce)),
            event(EventType::ToolResult, call(Idempotency::SafeToRetry)),
            event(EventType::ToolDenied, call(Idempotency::SafeToRetry)),
            event(EventType::RunInterrupted, None),
            event(EventType::RunCreated, None),
            event(EventType::ToolStart, None),
        ] {
            assert!(must_sync(&[scheduled.clone(), other.clone()]), "{:?}", other.event.kind);
        }
        assert!(
            must_sync(&[]),
            "a write without events (a registration) is answered durable"
        );
        let mut agent = call(Idempotency::SafeToRetry).unwrap();
        agent.kind = StepKind::Agent;
        assert!(must_sync(&[event(EventType::ToolStart, Some(agent))]));
    }

    #[test]
    fn a_batch_that_must_sync_flushes_the_log_and_normal_durability_never_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kernel.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        let full = SqliteSync::open(&conn, &path, true).unwrap();
        let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).unwrap();
        assert_eq!(synchronous, 1, "the connection commits at NORMAL");
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1)")
            .unwrap();
        assert!(full.after_commit(true).unwrap());
        assert!(!full.after_commit(false).unwrap());
        let normal = SqliteSync::open(&conn, &path, false).unwrap();
        assert!(!normal.after_commit(true).unwrap());
        assert!(
            SqliteSync::open(&conn, &dir.path().join("gone").join("kernel.db"), true).is_err(),
            "a log that cannot be synced is an error"
        );
    }
}
