//! The kernel's memory, as `AdminService.GetStatus` reports it: what the process holds resident and
//! what the allocator has handed out. The kernel binary uses jemalloc (see `main.rs`); a program
//! that links this library with another allocator reads an allocated figure of 0.

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
}
