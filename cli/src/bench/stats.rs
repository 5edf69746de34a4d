//! Latency statistics: percentiles by nearest rank over every recorded sample.
//!
//! A benchmark run records at most a few hundred thousand latencies, so keeping them all and
//! sorting once is cheaper and more exact than a histogram.

use std::time::Duration;

use serde::Serialize;

/// The value at percentile `p` (0–100) of `sorted`, by nearest rank: the smallest sample that at
/// least `p`% of the samples do not exceed. `None` for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Milliseconds with microsecond precision, for JSON and tables.
pub fn millis(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

/// The distribution of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Latency {
    /// Summarises `samples` (sorted in place); `None` for no samples.
    pub fn of(samples: &mut [Duration]) -> Option<Latency> {
        samples.sort_unstable();
        let total: Duration = samples.iter().sum();
        let at = |p| percentile(samples, p).map(millis);
        Some(Latency {
            p50_ms: at(50.0)?,
            p90_ms: at(90.0)?,
            p99_ms: at(99.0)?,
            max_ms: millis(*samples.last()?),
            mean_ms: millis(total) / samples.len() as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().copied().map(Duration::from_millis).collect()
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let samples = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&samples, 90.0), Some(Duration::from_millis(90)));
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&samples, 99.9), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&samples, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&samples, 0.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn percentiles_of_few_samples_are_samples() {
        let samples = ms(&[10, 20, 30]);
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&samples, 34.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&samples, 33.0), Some(Duration::from_millis(10)));
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(30)));
        let one = ms(&[7]);
        assert_eq!(percentile(&one, 1.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&one, 99.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn out_of_range_percentiles_are_clamped() {
        let samples = ms(&[1, 2]);
        assert_eq!(percentile(&samples, -5.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&samples, 250.0), Some(Duration::from_millis(2)));
    }

    #[test]
    fn latency_sorts_and_summarises() {
        let mut samples = ms(&[5, 1, 4, 2, 3]);
        let latency = Latency::of(&mut samples).unwrap();
        assert_eq!(latency.p50_ms, 3.0);
        assert_eq!(latency.p90_ms, 5.0);
        assert_eq!(latency.p99_ms, 5.0);
        assert_eq!(latency.max_ms, 5.0);
        assert_eq!(latency.mean_ms, 3.0);
        assert_eq!(Latency::of(&mut []), None);
    }

    #[test]
    fn millis_keep_microseconds() {
        assert_eq!(millis(Duration::from_micros(1_234)), 1.234);
        assert_eq!(millis(Duration::from_nanos(999)), 0.0);
    }
}
