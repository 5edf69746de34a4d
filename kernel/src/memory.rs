//! The kernel's memory and CPU time, as `AdminService.GetStatus` reports them: what the process
//! holds resident, what the allocator has handed out, and the CPU it has used. The kernel binary
//! uses jemalloc (see `main.rs`); a program that links this library with another allocator reads
//! an allocated figure of 0.

/// Resident and allocated bytes; a figure the platform does not give is 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryFigures {
    pub resident_bytes: u64,
    pub allocated_bytes: u64,
}

/// Reads the figures now.
pub fn figures() -> MemoryFigures {
    MemoryFigures {
        resident_bytes: resident_bytes().unwrap_or(0),
        allocated_bytes: allocated_bytes().unwrap_or(0),
    }
}

/// `VmRSS` of `/proc/self/status`, on Linux.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Linux reports `/proc` times in ticks of 1/100 s (`USER_HZ`) on every architecture it supports.
const USER_HZ: u64 = 100;

/// CPU time the process has used, user plus system, in microseconds (`utime` and `stime` of
/// `/proc/self/stat`); `None` off Linux.
pub fn cpu_micros() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may hold spaces: the fields counted after it start at the
    // third (state), so utime (14th) and stime (15th) are the 12th and 13th.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) * 1_000_000 / USER_HZ)
}

/// Bytes the process has caused to be written to storage, net of what it cancelled: `write_bytes`
/// of `/proc/self/io` (counted as pages are dirtied) less `cancelled_write_bytes` (dirty pages
/// dropped before they reached the disk, when a file is truncated or deleted: they cost the disk
/// nothing). `None` off Linux or where the system keeps no I/O accounting.
pub fn disk_write_bytes() -> Option<u64> {
    net_written(&std::fs::read_to_string("/proc/self/io").ok()?)
}

/// The net bytes written by one `/proc/<pid>/io` (or a thread's) text.
fn net_written(io: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        io.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    let cancelled = field("cancelled_write_bytes").unwrap_or(0);
    Some(field("write_bytes")?.saturating_sub(cancelled))
}

/// Counts the times the kernel went idle (see [`went_idle`]).
static IDLE_EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// The idle epoch this thread last gave its allocation cache back in.
    static FLUSHED_IN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Called once the kernel has gone quiet (the store's writer, after a while without a command):
/// this thread's cache of freed allocations goes back to the allocator now, and every runtime
/// thread's the next time it parks ([`on_park`]). jemalloc keeps a cache per thread that only
/// the thread's own allocations trim, so a thread that goes quiet after a burst keeps megabytes
/// of freed memory out of the allocator's reach; under load no thread flushes, as the kernel
/// never goes quiet.
pub fn went_idle() {
    let epoch = IDLE_EPOCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    FLUSHED_IN.with(|flushed| flushed.set(epoch));
    flush_thread_cache();
}

/// For the runtime's `on_thread_park`, and a blocking thread's end of a read: flushes this
/// thread's allocation cache once per idle epoch, a load and a comparison otherwise.
pub fn on_park() {
    let epoch = IDLE_EPOCH.load(std::sync::atomic::Ordering::Relaxed);
    if FLUSHED_IN.with(|flushed| flushed.replace(epoch)) != epoch {
        flush_thread_cache();
    }
}

/// Turning the calling thread's jemalloc cache off returns what it holds to the arena (and to the
/// system with the arena's next purge); turning it on again starts an empty one.
fn flush_thread_cache() {
    use tikv_jemalloc_ctl::{Access, AsName};
    let enabled = b"thread.tcache.enabled\0".name();
    if enabled.read() == Ok(true) {
        let _ = enabled.write(false);
        let _ = enabled.write(true);
    }
}

/// jemalloc's `stats.allocated`, refreshed first (jemalloc caches its statistics per epoch).
fn allocated_bytes() -> Option<u64> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    tikv_jemalloc_ctl::stats::allocated::read().ok().map(|n| n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_size_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            let figures = figures();
            assert!(figures.resident_bytes > 1024 * 1024, "{figures:?}");
        }
    }

    #[test]
    fn the_allocator_keeps_one_arena() {
        // Built in by `.cargo/config.toml`; a build that loses it grows the kernel's resident
        // memory under load by an arena's pages per allocating thread.
        if std::env::var_os("MALLOC_CONF").is_none() {
            assert_eq!(tikv_jemalloc_ctl::opt::narenas::read().unwrap(), 1);
        }
    }

    #[test]
    fn sqlite_allocates_from_jemalloc() {
        // SQLite's page cache and row buffers must come back after a burst like the kernel's own
        // memory: glibc kept them (a 1 MiB result left megabytes behind in its arenas).
        let allocated = tikv_jemalloc_ctl::thread::allocatedp::read().unwrap();
        let before = allocated.get();
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute("CREATE TABLE t (v TEXT)", []).unwrap();
        conn.execute("INSERT INTO t VALUES (?1)", ["x".repeat(1 << 20)])
            .unwrap();
        let read: String = conn.query_row("SELECT v FROM t", [], |row| row.get(0)).unwrap();
        drop(conn);
        // This test binary allocates through C's `malloc`, Rust's strings included: jemalloc counts
        // nothing for the thread unless that `malloc` is its own, and then SQLite's copies of the
        // value besides (bound, built into a record, read back).
        let counted = allocated.get() - before;
        assert_eq!(read.len(), 1 << 20);
        assert!(
            counted > 4 << 20,
            "this thread allocated {counted} bytes through jemalloc"
        );
    }

    /// Bytes the calling thread's allocation cache holds, counted in an arena of the thread's own
    /// (other tests' threads share the default one).
    struct OwnArena(u32);

    impl OwnArena {
        fn bind() -> OwnArena {
            use tikv_jemalloc_ctl::{Access, AsName};
            let arena: u32 = b"arenas.create\0".name().read().unwrap();
            b"thread.arena\0".name().write(arena).unwrap();
            OwnArena(arena)
        }

        fn cached_bytes(&self) -> usize {
            use tikv_jemalloc_ctl::{Access, AsName};
            tikv_jemalloc_ctl::epoch::advance().unwrap();
            let key = format!("stats.arenas.{}.tcache_bytes\0", self.0);
            key.as_bytes().name().read().unwrap()
        }

        /// Allocates and frees small blocks, which the thread's cache keeps.
        fn churn(&self) {
            let blocks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 256]).collect();
            drop(std::hint::black_box(blocks));
        }
    }

    #[test]
    fn going_idle_empties_the_threads_allocation_caches() {
        std::thread::spawn(|| {
            let arena = OwnArena::bind();
            arena.churn();
            assert!(arena.cached_bytes() > 0, "freed blocks are cached");
            went_idle();
            assert_eq!(arena.cached_bytes(), 0, "the idle thread's cache was flushed");
        })
        .join()
        .unwrap();

        // A runtime thread flushes when it next parks, once per time the kernel goes idle.
        std::thread::spawn(|| {
            let arena = OwnArena::bind();
            on_park();
            arena.churn();
            on_park();
            // Reading the figure allocates too, so a cache not flushed reads above 0, not the same.
            assert!(arena.cached_bytes() > 0, "no flush while the kernel stays busy");
            std::thread::spawn(went_idle).join().unwrap();
            on_park();
            assert_eq!(
                arena.cached_bytes(),
                0,
                "flushed at the park after the kernel went idle"
            );
            arena.churn();
            on_park();
            assert!(arena.cached_bytes() > 0, "and only once");
        })
        .join()
        .unwrap();
    }

    /// This thread's own net bytes written: the figure's formula on counters no other test moves.
    fn thread_written() -> Option<u64> {
        net_written(&std::fs::read_to_string("/proc/thread-self/io").ok()?)
    }

    /// On this thread's counters: the process's move with every other test of the binary (one
    /// that deletes a file before it reaches the disk takes bytes off the net figure).
    #[test]
    fn bytes_written_to_a_synced_file_are_counted() {
        let (Some(_), Some(before)) = (disk_write_bytes(), thread_written()) else {
            // No I/O accounting (off Linux, or a kernel built without it): the status says 0.
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let mut file = std::fs::File::create(dir.path().join("f")).unwrap();
        std::io::Write::write_all(&mut file, &vec![7u8; 1 << 20]).unwrap();
        file.sync_all().unwrap();
        let after = thread_written().unwrap();
        assert!(after >= before + (1 << 20), "1 MiB written shows: {before} -> {after}");
    }

    #[test]
    fn bytes_of_a_file_deleted_before_they_reach_the_disk_are_not_counted() {
        if thread_written().is_none() {
            return;
        }
        // On the repository's disk rather than a temporary directory that may be in memory, where
        // nothing is counted either way.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("f");
        // The system may write the pages back between the write and the delete (a busy machine
        // starts writeback early), and then they did reach the disk: a few tries, one must show it.
        let tries: Vec<(u64, u64, u64)> = (0..3)
            .map(|_| {
                let before = thread_written().unwrap();
                std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
                let dirtied = thread_written().unwrap();
                std::fs::remove_file(&path).unwrap();
                (before, dirtied, thread_written().unwrap())
            })
            .collect();
        assert!(
            tries.iter().all(|&(before, dirtied, _)| dirtied >= before + (4 << 20)),
            "4 MiB dirtied shows each time: {tries:?}"
        );
        assert!(
            tries.iter().any(|&(before, _, after)| after < before + (1 << 20)),
            "deleted before writeback, counted nothing: {tries:?}"
        );
    }

    #[test]
    fn the_net_figure_reads_the_proc_io_format() {
        let io =
            "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 8192\ncancelled_write_bytes: 4096\n";
        assert_eq!(net_written(io), Some(4096));
        assert_eq!(net_written("write_bytes: 10\n"), Some(10));
        assert_eq!(net_written("rchar: 1\n"), None);
    }

    #[test]
    fn cpu_time_grows_as_the_process_works() {
        if cfg!(target_os = "linux") {
            let before = cpu_micros().expect("cpu time on linux");
            let started = std::time::Instant::now();
            let mut spin = 0u64;
            while started.elapsed() < std::time::Duration::from_millis(60) {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
            let after = cpu_micros().unwrap();
            assert!(after >= before + 10_000, "60 ms of spinning shows: {before} -> {after}");
        }
    }
}
