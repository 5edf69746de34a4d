//! The kernel's key files: a 32-byte seed as 64 hex digits, created with a new seed (readable by
//! its owner only) when the file does not exist. The receipts' signing key and the secret fields'
//! key are each one.

use std::path::{Path, PathBuf};

use crate::store::Database;

/// The seed `path` holds, or a new one written there when the file does not exist.
pub fn seed(path: &Path, what: &str) -> Result<[u8; 32], String> {
    let shown = path.display();
    match std::fs::read_to_string(path) {
        Ok(text) => hex::decode(text.trim())
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .ok_or_else(|| format!("{shown}: not 64 hex digits ({what})")),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| format!("{shown}: no randomness for a key: {e}"))?;
            write_private(path, &format!("{}\n", hex::encode(seed)))
                .map_err(|e| format!("{shown}: cannot write a new key: {e}"))?;
            Ok(seed)
        }
        Err(error) => Err(format!("{shown}: {error}")),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Where a key is kept when its flag is not given: beside a SQLite file, named with `suffix`
/// (`kernel.db.receipt-key`). PostgreSQL's replicas must share one, so it is given to each.
pub fn beside(db: &Database, suffix: &str) -> Option<PathBuf> {
    match db {
        Database::Sqlite(path) => {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            Some(PathBuf::from(name))
        }
        Database::Postgres(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_gets_a_new_seed_that_reads_back_and_a_bad_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let first = seed(&path, "a test key").unwrap();
        assert_eq!(seed(&path, "a test key").unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "readable by its owner only: {mode:o}");
        }
        std::fs::write(&path, "not hex").unwrap();
        let refused = seed(&path, "a test key").unwrap_err();
        assert!(refused.contains("not 64 hex digits (a test key)"), "{refused}");
    }
}
