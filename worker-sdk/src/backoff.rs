//! Reconnect delays: exponential with jitter, so a fleet of workers does not reconnect in step.

use std::time::Duration;

/// Delays that double from `initial` up to `max`; each is drawn from the upper half of its step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays starting at `initial`, never above `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The next delay to wait, doubling the step for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (step * 2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
    }

    /// Starts again from `initial`, after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let steps = [100, 200, 400, 800, 1600, 3200, 5000, 5000];
        for step in steps {
            let delay = backoff.next_delay();
            let step = Duration::from_millis(step);
            assert!(delay >= step / 2 && delay <= step, "{delay:?} outside {step:?}");
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }
}
