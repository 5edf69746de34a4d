//! The kernel's one clock: every deadline (a call's timeout, a retry's backoff, a worker's lease,
//! an approval's expiry, a cache entry's age) is measured on it.
//!
//! A kernel reads the wall clock. A test holds a [`Clock::manual`] one instead, which moves only
//! when the test advances it, so a 60-second backoff or a 30-second lease is tested in
//! microseconds, and "not yet" is a fact rather than a race against the machine's speed. Both
//! the store's timestamps (milliseconds since the epoch, written in the log) and the scheduler's
//! in-memory deadlines ([`Instant`]s) come from here, so they cannot disagree.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::model::Millis;

/// Where the kernel reads the time. Cheap to clone; clones of a manual clock move together.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<Manual>>);

/// A clock that stands still until advanced: the time it started at, plus what it was advanced by.
#[derive(Debug)]
struct Manual {
    epoch_millis: Millis,
    origin: Instant,
    advanced_ms: AtomicU64,
}

impl Clock {
    /// The wall clock: what a kernel runs on.
    pub fn wall() -> Self {
        Clock(None)
    }

    /// A clock that starts at the wall time now and moves only by [`Clock::advance`].
    pub fn manual() -> Self {
        Clock(Some(Arc::new(Manual {
            epoch_millis: wall_millis(),
            origin: Instant::now(),
            advanced_ms: AtomicU64::new(0),
        })))
    }

    /// Milliseconds since the Unix epoch: the store's timestamps and deadlines.
    pub fn now_millis(&self) -> Millis {
        match &self.0 {
            None => wall_millis(),
            Some(manual) => manual
                .epoch_millis
                .saturating_add(Millis::try_from(manual.advanced()).unwrap_or(Millis::MAX)),
        }
    }

    /// A monotonic instant: the scheduler's in-memory deadlines.
    pub fn instant(&self) -> Instant {
        match &self.0 {
            None => Instant::now(),
            Some(manual) => manual.origin + Duration::from_millis(manual.advanced()),
        }
    }

    /// Moves a manual clock forward; the wall clock cannot be moved.
    ///
    /// # Panics
    /// On the wall clock: a test that means to control time and does not is a wrong test.
    pub fn advance(&self, by: Duration) {
        let manual = self.0.as_ref().expect("only a manual clock can be advanced");
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        manual.advanced_ms.fetch_add(by, Ordering::AcqRel);
    }
}

impl Manual {
    fn advanced(&self) -> u64 {
        self.advanced_ms.load(Ordering::Acquire)
    }
}

/// The wall clock in milliseconds since the epoch.
fn wall_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stands_still_until_advanced_and_its_clones_move_with_it() {
        let clock = Clock::manual();
        let (millis, instant) = (clock.now_millis(), clock.instant());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            (clock.now_millis(), clock.instant()),
            (millis, instant),
            "no time passed"
        );
        let clone = clock.clone();
        clone.advance(Duration::from_secs(60));
        assert_eq!(clock.now_millis(), millis + 60_000);
        assert_eq!(clock.instant(), instant + Duration::from_secs(60));
    }

    #[test]
    fn the_wall_clock_moves_by_itself() {
        let clock = Clock::wall();
        let (millis, instant) = (clock.now_millis(), clock.instant());
        std::thread::sleep(Duration::from_millis(5));
        assert!(clock.now_millis() >= millis + 5);
        assert!(clock.instant() >= instant + Duration::from_millis(5));
    }
}
