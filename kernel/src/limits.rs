//! Limits on what one agent, worker or connection may ask of the kernel.
//!
//! Each limit has a flag (and `KERNEL_*` variable) in [`crate::config::Config`] and a sane default.
//! The gRPC boundary enforces them before anything is written: an exceeded limit is a
//! `RESOURCE_EXHAUSTED` status whose message names the field, the size and the limit (with its
//! flag). A worker's oversized result is the one exception: it fails that call with an error the
//! model reads, and the session goes on.

use std::time::{Duration, Instant};

use crate::error::KernelError;

/// One MiB, the default cap of arguments and results.
pub const MIB: usize = 1 << 20;

/// The kernel's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest `arguments_json` of one call, in bytes.
    pub max_argument_bytes: usize,
    /// Largest `output_json` (or error message) a worker may return for one call, in bytes.
    pub max_result_bytes: usize,
    /// Most calls one turn may carry.
    pub max_calls_per_turn: usize,
    /// Most turns per run: a turn's number must be below it.
    pub max_turns_per_run: u32,
    /// Most events one run's log may hold.
    pub max_events_per_run: u64,
    /// Largest gRPC message the kernel decodes, in bytes.
    pub max_message_bytes: usize,
    /// Most worker sessions open at once (including those still before their hello).
    pub max_sessions: usize,
    /// Most calls of one run not yet settled.
    pub max_pending_calls_per_run: usize,
    /// Progress messages per second one session may send; the excess is dropped.
    pub progress_per_second: u32,
    /// Heartbeats per second one session may send; the excess is dropped.
    pub heartbeats_per_second: u32,
    /// How long a worker that opens a session has to say hello; its place is held meanwhile.
    pub hello_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_argument_bytes: MIB,
            max_result_bytes: MIB,
            max_calls_per_turn: 256,
            max_turns_per_run: 10_000,
            max_events_per_run: 1_000_000,
            max_message_bytes: 8 * MIB,
            max_sessions: 1_024,
            max_pending_calls_per_run: 1_024,
            progress_per_second: 200,
            heartbeats_per_second: 20,
            hello_timeout: std::time::Duration::from_secs(10),
        }
    }
}

/// The most events one call may add to its run's log when nothing goes wrong
/// (`tool:scheduled`, `tool:start`, `tool:result`); used to refuse a turn that would overflow it.
pub const EVENTS_PER_CALL: u64 = 3;

/// A `RESOURCE_EXHAUSTED` error naming `field`, what it was and the limit with its flag.
pub fn exceeded(
    field: impl Into<String>,
    what: impl std::fmt::Display,
    limit: impl std::fmt::Display,
    flag: &str,
) -> KernelError {
    KernelError::LimitExceeded {
        field: field.into(),
        message: format!("{what}; the limit is {limit} (--{flag})"),
    }
}

impl Limits {
    /// Refuses a payload over `max` bytes.
    pub fn check_bytes(field: impl std::fmt::Display, len: usize, max: usize, flag: &str) -> Result<(), KernelError> {
        if len > max {
            return Err(exceeded(
                field.to_string(),
                format!("{len} bytes"),
                format!("{max} bytes"),
                flag,
            ));
        }
        Ok(())
    }
}

/// A token bucket: at most `rate` events per second on average, bursts up to `rate`.
/// A rate of 0 means unlimited.
#[derive(Debug)]
pub struct RateLimit {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// A full bucket.
    pub fn per_second(rate: u32, now: Instant) -> Self {
        RateLimit {
            rate: f64::from(rate),
            tokens: f64::from(rate),
            last: now,
        }
    }

    /// Takes one token; `false` when the bucket is empty and the event should be dropped.
    pub fn allow(&mut self, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Rate-limited logging of one kind of misbehaviour: the first occurrence is logged at once, later
/// ones at most once per interval, with the number suppressed since.
#[derive(Debug)]
pub struct LogEvery {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogEvery {
    pub fn new(interval: Duration) -> Self {
        LogEvery {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last log)` when this occurrence should be logged.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_rate_then_refills() {
        let start = Instant::now();
        let mut limit = RateLimit::per_second(10, start);
        assert_eq!((0..100).filter(|_| limit.allow(start)).count(), 10);
        assert!(!limit.allow(start + Duration::from_millis(50)));
        assert!(limit.allow(start + Duration::from_millis(200)));
        let mut unlimited = RateLimit::per_second(0, start);
        assert!((0..1000).all(|_| unlimited.allow(start)));
    }

    #[test]
    fn logging_is_once_per_interval_with_a_suppressed_count() {
        let start = Instant::now();
        let mut log = LogEvery::new(Duration::from_secs(10));
        assert_eq!(log.hit(start), Some(0));
        assert_eq!(log.hit(start + Duration::from_secs(1)), None);
        assert_eq!(log.hit(start + Duration::from_secs(2)), None);
        assert_eq!(log.hit(start + Duration::from_secs(11)), Some(2));
    }

    #[test]
    fn the_flags_default_to_the_documented_limits() {
        let config = crate::Config::for_tests("kernel.db".into());
        assert_eq!(config.limits(), Limits::default());
    }

    #[test]
    fn an_exceeded_limit_names_the_field_and_the_flag() {
        let error = Limits::check_bytes("calls[0].arguments_json", 11, 10, "max-argument-bytes").unwrap_err();
        let status = tonic::Status::from(error);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "calls[0].arguments_json: 11 bytes; the limit is 10 bytes (--max-argument-bytes)"
        );
        assert!(Limits::check_bytes("x", 10, 10, "f").is_ok());
    }
}
