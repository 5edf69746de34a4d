//! The checkpointer: copies the write-ahead log back into the database on a thread of its own.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses 1,000 pages of log, on the
//! committing connection: the writer's thread, the kernel's bound under load, would stop taking
//! commands while it copies pages and syncs the database. Here the writer never checkpoints
//! (`wal_autocheckpoint=0`); this thread runs passive checkpoints, which wait for nobody and
//! which the writer does not wait for, and the writer starts the log over once one has copied it
//! all. Should readers keep a passive checkpoint from ever finishing, the log would only grow:
//! past [`RESTART_FRAMES`] a checkpoint waits for readers and writer instead, a short stall that
//! bounds the log.

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Durability;

/// How often the log is copied: at the rates the kernel reaches, about the 1,000 pages SQLite's
/// own checkpoint waits for.
const EVERY: Duration = Duration::from_millis(250);

/// A log this long (pages of 4 KiB, so about 80 MiB) is copied even if it must wait for readers.
const RESTART_FRAMES: i64 = 20_000;

/// The running checkpointer; dropping it stops the thread after its current checkpoint.
pub struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path`, syncing as `durability` says.
    pub fn start(path: &Path, durability: Durability) -> rusqlite::Result<Checkpointer> {
        let conn = rusqlite::Connection::open(path)?;
        conn.pragma_update(
            None,
            "synchronous",
            match durability {
                Durability::Full => "FULL",
                Durability::Normal => "NORMAL",
            },
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let (stop, stopped) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("store-checkpointer".into())
            .spawn(move || run(&conn, &stopped))
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(conn: &rusqlite::Connection, stopped: &Receiver<()>) {
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
        match checkpoint(conn, "PASSIVE") {
            Ok(frames) if frames >= RESTART_FRAMES => {
                tracing::warn!(frames, "write-ahead log kept from shrinking; checkpointing with a wait");
                if let Err(error) = checkpoint(conn, "RESTART") {
                    tracing::warn!(%error, "checkpoint failed");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "checkpoint failed"),
        }
    }
}

/// Runs one checkpoint; the frames the log held, copied or not.
fn checkpoint(conn: &rusqlite::Connection, mode: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| row.get(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_a_writer_leaves_is_copied_and_the_writer_starts_it_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kernel.db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        let write = |rows: usize| {
            for _ in 0..rows {
                writer.execute("INSERT INTO t VALUES (zeroblob(4000))", []).unwrap();
            }
        };
        write(300);
        let wal = dir.path().join("kernel.db-wal");
        let size = || std::fs::metadata(&wal).unwrap().len();
        assert!(size() > 300 * 4000, "{}", size());
        // Uncopied, every write makes the log longer; once the checkpointer copied it, the
        // writer starts it over and writes stop growing it.
        let checkpointer = Checkpointer::start(&path, Durability::Full).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let was = size();
            write(10);
            if size() == was {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the log was never copied");
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(checkpointer);
    }
}
