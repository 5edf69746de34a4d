//! How a commit is made durable on SQLite; which commits must be is the machine's rule
//! (`machine::durability`).

use std::fs::File;
use std::path::Path;

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
