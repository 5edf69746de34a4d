//! One kernel per database file. Two kernels on one SQLite file would each take the other's
//! running calls for leftovers of a crash: boot recovery writes `tool:lease_lost` for calls the
//! live kernel still runs, and both dispatch the same queue. So before the kernel reads or writes
//! anything it takes an exclusive lock on a file beside the database (`<db>.lock`, holding the
//! holder's pid). The lock is the operating system's (`flock`): it dies with its process, SIGKILL
//! included, so a crashed kernel never leaves a stale lock behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::KernelError;

/// The exclusive claim of one kernel on one database file, held until dropped.
#[derive(Debug)]
pub struct DbLock {
    _file: File,
    path: PathBuf,
}

impl DbLock {
    /// Takes the lock on `db`, or says which process holds it. Refuses a `db` that is a directory
    /// or whose folder does not exist before anything is created.
    pub fn acquire(db: &Path) -> Result<DbLock, KernelError> {
        check_db_path(db)?;
        let path = lock_path(db);
        // Neither create-and-truncate nor append: a refused kernel must leave the holder's pid.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| KernelError::Store(format!("cannot open the lock file {}: {e}", path.display())))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => String::new(),
                    pid => format!(" (pid {pid})"),
                };
                return Err(KernelError::FailedPrecondition(format!(
                    "{} is in use by another kernel{holder}; stop it, or give this one another --db",
                    db.display()
                )));
            }
            Err(TryLockError::Error(e)) => {
                return Err(KernelError::Store(format!("cannot lock {}: {e}", path.display())));
            }
        }
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(pid.as_bytes()))
            .and_then(|()| file.sync_data())
            .map_err(|e| KernelError::Store(format!("cannot write the lock file {}: {e}", path.display())))?;
        Ok(DbLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `kernel.db` → `kernel.db.lock`.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    db.with_file_name(name)
}

/// Refuses a database path the kernel could only fail on later, with what to do about it.
fn check_db_path(db: &Path) -> Result<(), KernelError> {
    let shown = db.display();
    if db.is_dir() {
        return Err(KernelError::invalid(
            "--db",
            format!("'{shown}' is a directory; give the path of a database file in it, e.g. {shown}/kernel.db"),
        ));
    }
    if db.file_name().is_none() {
        return Err(KernelError::invalid("--db", format!("'{shown}' names no file")));
    }
    let folder = match db.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(KernelError::invalid(
            "--db",
            format!(
                "the folder '{}' of '{shown}' does not exist; create it first (mkdir -p {})",
                folder.display(),
                folder.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_on_one_database_names_the_holder_and_a_released_lock_can_be_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("kernel.db");
        let first = DbLock::acquire(&db).unwrap();
        assert_eq!(first.path(), dir.path().join("kernel.db.lock"));
        let refused = DbLock::acquire(&db).unwrap_err().to_string();
        assert_eq!(
            refused,
            format!(
                "{} is in use by another kernel (pid {}); stop it, or give this one another --db",
                db.display(),
                std::process::id()
            )
        );
        assert!(!db.exists(), "a lock creates no database");
        drop(first);
        let again = DbLock::acquire(&db).expect("a released lock can be taken");
        assert_eq!(
            std::fs::read_to_string(again.path()).unwrap(),
            std::process::id().to_string()
        );
    }

    #[test]
    fn a_directory_or_a_missing_folder_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let error = DbLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(error.starts_with("--db: '"), "{error}");
        assert!(error.contains("is a directory"), "{error}");
        let missing = dir.path().join("nope").join("kernel.db");
        let error = DbLock::acquire(&missing).unwrap_err().to_string();
        assert!(error.contains("does not exist; create it first"), "{error}");
        assert!(!dir.path().join("nope").exists(), "nothing created");
    }
}
