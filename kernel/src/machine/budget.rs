//! What a run may spend on tool calls, and what it has spent: at most so many calls, at most so
//! much cost (each attempt at its price), over every tool or over the tools a glob names.
//!
//! A budget is checked and charged in the write that starts an attempt, so no race, retry, crash
//! or replay spends past it: the start of each attempt pays its price (a replayed or cached call
//! runs nothing and pays nothing), and an attempt that would go past a limit does not start; its
//! call settles as `budget_exceeded`, an error the model reads. A new call already past a limit
//! is refused as it is recorded, without being scheduled.
//!
//! A subagent spends its parent's budget (and its parent's parent's): every budget up its chain
//! is checked and charged with each start, its own, if it has one, among them. A branch spends
//! its own, with its parent's limits unless it was given others.

use serde::{Deserialize, Serialize};

use crate::model::{RunId, RunRecord};

/// A run's budget: its own limits with what each has spent, and whether its parent's budget
/// covers it too.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<Limit>,
    /// The parent run (a subagent's) has a budget, or one of its ancestors has: each call of this
    /// run is charged there too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub under_parent: bool,
}

/// One limit and what was spent against it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    /// The tools it counts, a glob over tool names; `None`: every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
    /// At most this many calls (each call once, however many attempts it takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    /// At most this much cost, each attempt at its price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// What set the limit (`request`, `parent`, or the policy file's `policy:budgets[i]`), for
    /// inspection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
    #[serde(default)]
    pub spent: Spent,
}

/// What a limit has counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub calls: u64,
    pub cost: f64,
}

/// Cost sums of prices that are not exact in binary: a limit is passed only by more than this.
const COST_EPSILON: f64 = 1e-9;

/// One attempt about to start, as a budget sees it.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    pub tool: &'a str,
    /// The price of the attempt.
    pub unit_cost: f64,
    /// The call's first attempt: it counts as a call.
    pub first: bool,
}

impl Limit {
    /// Checks that the limit limits something, by a cost that is a number >= 0: on refusal, the
    /// field at fault (`""` for the limit itself, or `.max_cost`) and why. Its glob is checked
    /// where it is read.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.max_calls.is_none() && self.max_cost.is_none() {
            return Err((
                "",
                "sets neither max_calls nor max_cost, so it limits nothing".to_owned(),
            ));
        }
        match self.max_cost {
            Some(cost) if !(cost.is_finite() && cost >= 0.0) => {
                Err((".max_cost", format!("{cost} is not a cost >= 0")))
            }
            _ => Ok(()),
        }
    }

    /// Whether the limit counts calls of `tool`.
    pub fn covers(&self, tool: &str) -> bool {
        match &self.tools {
            None => true,
            Some(glob) => crate::policy::glob::matches(glob, tool),
        }
    }

    /// What the limit would have counted with `attempt`, when that passes it.
    fn over(&self, attempt: Attempt<'_>) -> Option<Over> {
        if !self.covers(attempt.tool) {
            return None;
        }
        let calls = self.spent.calls + u64::from(attempt.first);
        if let Some(max) = self.max_calls
            && calls > max
        {
            return Some(Over::Calls { would: calls, max });
        }
        let cost = self.spent.cost + attempt.unit_cost;
        match self.max_cost {
            Some(max) if attempt.unit_cost > 0.0 && cost > max + COST_EPSILON => Some(Over::Cost { would: cost, max }),
            _ => None,
        }
    }

    fn charge(&mut self, attempt: Attempt<'_>) {
        if self.covers(attempt.tool) {
            self.spent.calls += u64::from(attempt.first);
            self.spent.cost += attempt.unit_cost;
        }
    }
}

/// What a limit would pass.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Over {
    Calls { would: u64, max: u64 },
    Cost { would: f64, max: f64 },
}

/// Why an attempt may not start: the message the model reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded(pub String);

/// Checks `attempt` against every budget of `accounts` (the run first, then each ancestor whose
/// budget covers it); the first limit it would pass refuses it, naming the run that holds it.
pub fn check(accounts: &[&RunRecord], attempt: Attempt<'_>) -> Result<(), Exceeded> {
    let (run, over, limit) = match accounts.iter().find_map(|run| {
        let budget = run.budget.as_ref()?;
        budget
            .limits
            .iter()
            .find_map(|limit| limit.over(attempt).map(|over| (*run, over, limit)))
    }) {
        Some(found) => found,
        None => return Ok(()),
    };
    let what = match over {
        Over::Calls { would, max } => format!("calls {would} of {max}"),
        Over::Cost { would, max } => format!("cost {would:.2} of {max:.2}"),
    };
    let scope = match &limit.tools {
        Some(glob) => format!(" on '{glob}'"),
        None => String::new(),
    };
    let holder = if Some(&run.id) == accounts.first().map(|own| &own.id) {
        format!("run {}", run.id)
    } else {
        format!("run {} (an ancestor of run {})", run.id, accounts[0].id)
    };
    Err(Exceeded(format!(
        "budget exceeded: {what}{scope} for {holder}; '{}' did not run",
        attempt.tool
    )))
}

/// Charges `attempt` to `run`'s own limits that cover it.
pub fn charge(run: &mut RunRecord, attempt: Attempt<'_>) {
    if let Some(budget) = &mut run.budget {
        for limit in &mut budget.limits {
            limit.charge(attempt);
        }
    }
}

/// The budget a new run starts with: its own limits (from its request and the policy), under its
/// parent's budget when that has one; `None` when no budget covers it.
pub fn for_new_run(limits: Vec<Limit>, parent: Option<&RunRecord>) -> Option<Budget> {
    let under_parent = parent.is_some_and(|parent| parent.budget.is_some());
    (under_parent || !limits.is_empty()).then_some(Budget { limits, under_parent })
}

/// The limits a branch of `parent` asks for when it was given none: those the parent asked for
/// (the policy gives the branch its own by its labels), with nothing spent: a branch spends its
/// own budget, not its parent's.
pub fn for_branch(parent: &RunRecord) -> Vec<Limit> {
    parent
        .budget
        .iter()
        .flat_map(|budget| &budget.limits)
        .filter(|limit| !limit.set_by.as_deref().is_some_and(|by| by.starts_with("policy:")))
        .map(|limit| Limit {
            set_by: Some("parent".to_owned()),
            spent: Spent::default(),
            ..limit.clone()
        })
        .collect()
}

/// The run whose budget covers `run` next up its chain: its parent, when its budget says so.
pub fn next_account(run: &RunRecord) -> Option<&RunId> {
    match (&run.budget, &run.parent) {
        (Some(budget), Some((parent, _))) if budget.under_parent => Some(parent),
        _ => None,
    }
}

/// A limit of `run`'s own that is passed: none, if every start was checked first.
pub fn overspent(run: &RunRecord) -> Option<&Limit> {
    run.budget.as_ref()?.limits.iter().find(|limit| {
        limit.max_calls.is_some_and(|max| limit.spent.calls > max)
            || limit.max_cost.is_some_and(|max| limit.spent.cost > max + COST_EPSILON)
    })
}

#[cfg(test)]
mod tests;
