//! Rate and concurrency limits on tools (the policy file's `limits`): how many calls of the tools
//! a limit names may start each second, and how many may run at once, counted across every
//! worker and replica.
//!
//! The store holds each limit's state: a token bucket for its rate, and one lock row per running
//! call for its bound on calls at once (slot `@limit:<tools>#<k>`, `k` below `at_once`). A call's
//! start takes both in the write that starts it, and the write that ends the attempt gives the
//! slot back, so no crash, restart or replica move lets more through than the limit allows. The
//! scheduler keeps its own count of the same, to try only the starts the store will admit; a
//! start the store refuses waits in the queue again.

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// What every slot's lock name starts with; `@` is no resource kind's first character.
const SLOT: &str = "@limit:";

/// Longest `tools` glob of a limit: it names the limit's state.
const MAX_TOOLS_LEN: usize = 200;

/// One limit of the policy file's `limits`: its state is named by its `tools` glob.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolLimit {
    /// Which tools it counts, by name.
    pub tools: String,
    /// Calls that may start each second, on average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<f64>,
    /// Calls that may start at once after a quiet spell (the bucket's size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Calls that may run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_once: Option<u32>,
}

impl ToolLimit {
    /// Refuses a limit that limits nothing or cannot hold: the offending field's suffix
    /// (`.per_second`) and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.tools.is_empty() || self.tools.len() > MAX_TOOLS_LEN {
            return Err((
                ".tools",
                format!("a limit names its tools in 1 to {MAX_TOOLS_LEN} characters"),
            ));
        }
        if let Err(why) = crate::policy::glob::compile(&self.tools) {
            return Err((".tools", why));
        }
        if self.per_second.is_none() && self.at_once.is_none() {
            return Err((
                "",
                "a limit sets per_second, at_once or both; this one limits nothing".into(),
            ));
        }
        if let Some(rate) = self.per_second
            && !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0)
        {
            return Err((".per_second", format!("{rate} is not a rate; write a number above 0")));
        }
        if self.burst == Some(0) {
            return Err((".burst", "0 would start nothing; write 1 or more".into()));
        }
        if self.burst.is_some() && self.per_second.is_none() {
            return Err((".burst", "a burst bounds a rate; set per_second too".into()));
        }
        if self.at_once == Some(0) {
            return Err((".at_once", "0 would run nothing; write 1 or more".into()));
        }
        Ok(())
    }

    /// How many calls may start at once after a quiet spell: `burst`, else one second's worth.
    pub fn burst(&self) -> f64 {
        match (self.burst, self.per_second) {
            (Some(burst), _) => f64::from(burst),
            (None, Some(rate)) => rate.ceil().max(1.0),
            (None, None) => 1.0,
        }
    }

    /// The lock rows of its running calls are named from this, a slot number after it; `@` is no
    /// resource kind's, so no tool's lock can take a limit's slot.
    pub fn slot_prefix(&self) -> String {
        format!("{SLOT}{}#", self.tools)
    }

    /// What it allows, for messages and listings: `'payments_*' (10 a second, 4 at once)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(rate) = self.per_second {
            parts.push(format!("{rate} a second"));
        }
        if let Some(at_once) = self.at_once {
            parts.push(format!("{at_once} at once"));
        }
        format!("'{}' ({})", self.tools, parts.join(", "))
    }
}

/// A tool's own limit, as its worker declared it: a limit of the policy file's shape on the tool's
/// name alone, whose state is named `tool:<name>` (no tool name holds a `:`, so no policy glob
/// names the same state).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeclaredLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_once: Option<u32>,
}

impl DeclaredLimit {
    /// The limit it sets on calls of `tool`.
    pub fn of(&self, tool: &str) -> ToolLimit {
        ToolLimit {
            tools: format!("{DECLARED}{tool}"),
            per_second: self.per_second,
            burst: self.burst,
            at_once: self.at_once,
        }
    }
}

/// What the name of a limit a tool declared starts with.
pub const DECLARED: &str = "tool:";

/// A rate limit's token bucket: `tokens` as of `at`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub tokens: f64,
    pub at: Millis,
}

impl Bucket {
    /// A bucket no call has drawn from yet.
    pub fn full(limit: &ToolLimit, now: Millis) -> Bucket {
        Bucket {
            tokens: limit.burst(),
            at: now,
        }
    }

    /// The bucket at `now`, refilled at the limit's rate up to its burst. A clock that went back
    /// (another replica's) refills nothing.
    pub fn refilled(self, limit: &ToolLimit, now: Millis) -> Bucket {
        let rate = limit.per_second.unwrap_or(0.0);
        let elapsed = now.saturating_sub(self.at).max(0) as f64 / 1000.0;
        Bucket {
            tokens: (self.tokens + elapsed * rate).min(limit.burst()),
            at: now.max(self.at),
        }
    }

    /// Takes one call's token at `now`: the bucket after, or how many milliseconds until a token
    /// is there.
    pub fn take(self, limit: &ToolLimit, now: Millis) -> Result<Bucket, u64> {
        let mut bucket = self.refilled(limit, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(bucket);
        }
        let rate = limit.per_second.unwrap_or(0.0);
        let missing = 1.0 - bucket.tokens;
        Err(if rate > 0.0 {
            (missing / rate * 1000.0).ceil() as u64
        } else {
            u64::MAX
        })
    }
}

/// Whether lock `name` is a tool limit's slot rather than a resource instance's lock.
pub fn is_slot(name: &str) -> bool {
    name.starts_with(SLOT)
}

/// The slot a start takes among those `held` (lock rows `prefix<k>`) of a limit of `at_once`: the
/// lowest free number, or `None` when `at_once` calls run already. Slots a larger bound handed out
/// before a reload count until their calls end.
pub fn free_slot(prefix: &str, at_once: u32, held: &[String]) -> Option<String> {
    if held.len() >= at_once as usize {
        return None;
    }
    let taken: std::collections::HashSet<u32> = held
        .iter()
        .filter_map(|name| name.strip_prefix(prefix)?.parse().ok())
        .collect();
    (0..at_once)
        .find(|k| !taken.contains(k))
        .map(|k| format!("{prefix}{k}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_second: Option<f64>, burst: Option<u32>, at_once: Option<u32>) -> ToolLimit {
        ToolLimit {
            tools: "pay_*".into(),
            per_second,
            burst,
            at_once,
        }
    }

    #[test]
    fn a_bucket_starts_full_and_refills_at_its_rate_up_to_its_burst() {
        let limit = limit(Some(10.0), None, None);
        let mut bucket = Bucket::full(&limit, 0);
        for _ in 0..10 {
            bucket = bucket.take(&limit, 0).expect("a burst of one second's worth");
        }
        assert_eq!(bucket.take(&limit, 0), Err(100), "the next token is 100 ms away");
        assert_eq!(bucket.take(&limit, 50), Err(50));
        let bucket = bucket.take(&limit, 100).expect("one token after 100 ms");
        assert!(bucket.tokens.abs() < 1e-9);
        assert_eq!(
            bucket.refilled(&limit, 60_000).tokens,
            10.0,
            "a quiet minute refills to the burst, no more"
        );
    }

    #[test]
    fn starts_over_any_window_stay_within_rate_times_window_plus_burst() {
        let limit = limit(Some(7.0), Some(3), None);
        let mut bucket = Bucket::full(&limit, 0);
        let mut started = 0u32;
        // Try a start every millisecond for 30 s.
        for now in 0..30_000 {
            if let Ok(after) = bucket.take(&limit, now) {
                bucket = after;
                started += 1;
            }
        }
        assert!(started <= 7 * 30 + 3, "{started} starts in 30 s");
        assert!(started >= 7 * 30, "{started} starts in 30 s: the rate is reached");
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let limit = limit(Some(1.0), None, None);
        let bucket = Bucket::full(&limit, 10_000).take(&limit, 10_000).unwrap();
        assert_eq!(
            bucket.refilled(&limit, 5_000),
            Bucket {
                tokens: 0.0,
                at: 10_000
            }
        );
    }

    #[test]
    fn a_start_takes_the_lowest_free_slot_and_none_when_all_are_held() {
        let held = |names: &[&str]| names.iter().map(|n| format!("@limit:pay_*#{n}")).collect::<Vec<_>>();
        assert_eq!(free_slot("@limit:pay_*#", 2, &[]).as_deref(), Some("@limit:pay_*#0"));
        assert_eq!(
            free_slot("@limit:pay_*#", 2, &held(&["0"])).as_deref(),
            Some("@limit:pay_*#1")
        );
        assert_eq!(free_slot("@limit:pay_*#", 2, &held(&["0", "1"])), None);
        assert_eq!(
            free_slot("@limit:pay_*#", 2, &held(&["5"])).as_deref(),
            Some("@limit:pay_*#0"),
            "a slot of a larger bound counts, and a free one below the bound is taken"
        );
        assert_eq!(free_slot("@limit:pay_*#", 2, &held(&["5", "7"])), None);
    }

    #[test]
    fn a_limit_that_limits_nothing_or_cannot_hold_is_refused() {
        assert_eq!(limit(None, None, None).check().unwrap_err().0, "");
        assert_eq!(limit(Some(0.0), None, None).check().unwrap_err().0, ".per_second");
        assert_eq!(limit(Some(f64::NAN), None, None).check().unwrap_err().0, ".per_second");
        assert_eq!(limit(Some(1.0), Some(0), None).check().unwrap_err().0, ".burst");
        assert_eq!(limit(None, Some(2), Some(1)).check().unwrap_err().0, ".burst");
        assert_eq!(limit(None, None, Some(0)).check().unwrap_err().0, ".at_once");
        let mut bad = limit(None, None, Some(1));
        bad.tools = "[".into();
        assert_eq!(bad.check().unwrap_err().0, ".tools");
        assert!(limit(Some(0.5), None, Some(4)).check().is_ok());
        assert_eq!(limit(Some(0.5), None, None).burst(), 1.0);
    }
}
