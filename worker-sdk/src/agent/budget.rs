//! What a run may spend on tool calls.

use std::time::Duration;

use kernel_proto::v1 as pb;

/// One limit of a run's budget: at most so many calls, at most so much cost (each attempt at its
/// tool's price), at most so much tool run time, over every tool or over the tools a glob names.
/// A call that would go past it does not run: its outcome is
/// [`Outcome::BudgetExceeded`](super::Outcome::BudgetExceeded) and the model reads why. A
/// subagent is charged to its parent's budget too.
///
/// A limit on time holds each attempt's whole timeout while it runs and spends what it ran as it
/// ends: a call whose timeout does not fit waits while running calls hold time, and does not run
/// once none do. A call with no timeout cannot run under it.
///
/// ```
/// use std::time::Duration;
/// use worker_sdk::{BudgetLimit, NewRun};
///
/// let run = NewRun::new("support", serde_json::json!({}))
///     .budget(BudgetLimit::cost(5.0).and_calls(200))
///     .budget(BudgetLimit::calls(10).on("payments_*"))
///     .budget(BudgetLimit::time(Duration::from_secs(600)));
/// assert_eq!(run.budget.len(), 3);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BudgetLimit {
    /// The tools it counts, a glob over tool names; `None`: every tool.
    pub tools: Option<String>,
    /// At most this many calls (each call once, however many attempts it takes).
    pub max_calls: Option<u64>,
    /// At most this much cost.
    pub max_cost: Option<f64>,
    /// At most this much tool run time (each attempt at most its timeout), to the millisecond.
    pub max_time: Option<Duration>,
}

impl BudgetLimit {
    /// At most `max` calls.
    pub fn calls(max: u64) -> Self {
        BudgetLimit {
            max_calls: Some(max),
            ..Self::default()
        }
    }

    /// At most `max` cost.
    pub fn cost(max: f64) -> Self {
        BudgetLimit {
            max_cost: Some(max),
            ..Self::default()
        }
    }

    /// At most `max` of tool run time.
    pub fn time(max: Duration) -> Self {
        BudgetLimit {
            max_time: Some(max),
            ..Self::default()
        }
    }

    /// At most `max` of tool run time as well.
    pub fn and_time(mut self, max: Duration) -> Self {
        self.max_time = Some(max);
        self
    }

    /// At most `max` calls as well.
    pub fn and_calls(mut self, max: u64) -> Self {
        self.max_calls = Some(max);
        self
    }

    /// At most `max` cost as well.
    pub fn and_cost(mut self, max: f64) -> Self {
        self.max_cost = Some(max);
        self
    }

    /// Counts only calls of tools whose name matches `glob` (`payments_*`).
    pub fn on(mut self, glob: impl Into<String>) -> Self {
        self.tools = Some(glob.into());
        self
    }

    pub(crate) fn into_pb(self) -> pb::BudgetLimit {
        pb::BudgetLimit {
            tools: self.tools.unwrap_or_default(),
            max_calls: self.max_calls,
            max_cost: self.max_cost,
            max_time_ms: self
                .max_time
                .map(|max| u64::try_from(max.as_millis()).unwrap_or(u64::MAX)),
            ..Default::default()
        }
    }
}
