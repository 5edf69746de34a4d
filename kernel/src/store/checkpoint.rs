//! Checkpoints, mostly off the writer thread.
//!
//! In WAL mode a commit appends pages to the log and a checkpoint copies them back into the
//! database file. SQLite runs its checkpoint inside the commit that takes the log past a
//! threshold, on the writer's thread: that batch's callers wait for the copy and its two syncs
//! (under load, 16% of the writer's time). Here a thread of its own, on its own connection, copies
//! what the writer committed at most every [`PERIOD`], so a page that many commits rewrote in
//! between is copied once. A passive checkpoint takes no lock the writer waits for.
//!
//! Copying alone does not keep the log short: SQLite starts the log over only when a write begins
//! with every frame copied, and under steady load the writer adds frames while the copy runs. So
//! the writer still checkpoints when the log reaches [`TAIL_FRAMES`], as SQLite's own automatic
//! checkpoint does, but by then the thread has copied all but the last few frames.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

/// The least time between two copies by the checkpoint thread.
const PERIOD: Duration = Duration::from_millis(50);

/// The log's length, in pages, at which the writer checkpoints itself so the log starts over.
const TAIL_FRAMES: u32 = 8192;

/// What a log grown longer (readers holding old snapshots kept it from starting over) is cut back
/// to once it starts over: the size [`TAIL_FRAMES`] needs, with room.
const LOG_SIZE_LIMIT: i64 = 64 << 20;

/// The checkpoint thread, woken by the writer's commits; dropping this stops and joins it.
pub struct Checkpoints {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpoints {
    /// Sets the writer's connection `writer` to checkpoint only a long log, and starts the thread
    /// that copies the rest of the database at `path`.
    pub fn start(writer: &Connection, path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(writer, path, TAIL_FRAMES)
    }

    fn start_with(writer: &Connection, path: &Path, tail_frames: u32) -> Result<Self, Box<dyn std::error::Error>> {
        writer.pragma_update(None, "wal_autocheckpoint", tail_frames)?;
        writer.pragma_update(None, "journal_size_limit", LOG_SIZE_LIMIT)?;
        let conn = Connection::open(path)?;
        // NORMAL syncs the log before a copy (the commits the writer did not sync become durable
        // first) and the database file after it, as the writer's own checkpoints do.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || copy_while_woken(&conn, &woken))?;
        Ok(Checkpoints {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// After each commit: the thread copies it with whatever else came since its last copy.
    pub fn committed(&self) {
        if let Some(wake) = &self.wake {
            // A full channel means the thread is woken already.
            let _ = wake.try_send(());
        }
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The checkpoint thread: a passive checkpoint per wake-up, at most one per [`PERIOD`]. A failed
/// one is tried again at the next commit: SQLite counts frames copied only once the database
/// file is synced, so a copy that failed is made again in full.
fn copy_while_woken(conn: &Connection, woken: &Receiver<()>) {
    let mut failing = false;
    while woken.recv().is_ok() {
        // Its first column says whether the writer was checkpointing the log's tail meanwhile.
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get::<_, i64>(0)) {
            Ok(_) => failing = false,
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "checkpoint failed; retrying at the next commit");
                }
                failing = true;
            }
        }
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wal_database(dir: &tempfile::TempDir) -> (Connection, std::path::PathBuf) {
        let path = dir.path().join("kernel.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        (conn, path)
    }

    fn file_size(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |meta| meta.len())
    }

    #[test]
    fn the_thread_copies_what_the_writer_commits_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, path) = wal_database(&dir);
        let checkpoints = Checkpoints::start(&writer, &path).unwrap();
        let before = file_size(&path);
        for _ in 0..16 {
            writer.execute("INSERT INTO t VALUES (zeroblob(65536))", []).unwrap();
            checkpoints.committed();
        }
        // 1 MiB is far below the writer's own threshold: only the thread copies it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while file_size(&path) < before + (1 << 20) {
            assert!(
                std::time::Instant::now() < deadline,
                "the database file holds {} bytes; the commits were never copied into it",
                file_size(&path)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let threshold: i64 = writer
            .query_row("PRAGMA wal_autocheckpoint", [], |row| row.get(0))
            .unwrap();
        assert_eq!(threshold, i64::from(TAIL_FRAMES));
        drop(checkpoints);
        drop(writer);
        assert!(
            !dir.path().join("kernel.db-wal").exists(),
            "the last connection to close copies the log and deletes it"
        );
    }

    #[test]
    fn the_log_starts_over_under_steady_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, path) = wal_database(&dir);
        let tail = 64;
        let checkpoints = Checkpoints::start_with(&writer, &path, tail).unwrap();
        // Writes without a pause, so the thread's copies always race the writer's next frames.
        for _ in 0..2000 {
            writer.execute("INSERT INTO t VALUES (zeroblob(100))", []).unwrap();
            checkpoints.committed();
        }
        let page: u64 = writer.query_row("PRAGMA page_size", [], |row| row.get(0)).unwrap();
        let frames = file_size(&dir.path().join("kernel.db-wal")) / (page + 24);
        // Without the writer's own checkpoint the log never starts over here: 2,000 commits make
        // about 2,100 frames. With it the log restarts every `tail` frames, except while the thread
        // holds the checkpoint lock through a slow disk sync (the writer's checkpoint then gives way
        // and the log runs on), which on a loaded machine lasts hundreds of frames: the bound is
        // what a log that starts over stays under, however long those syncs take.
        assert!(
            frames < u64::from(tail) * 16,
            "the log grew to {frames} frames against a threshold of {tail}"
        );
    }
}
