//! What a run may spend on tool calls, and what it has spent: at most so many calls, at most so
//! much cost (each attempt at its price), at most so much tool run time, over every tool or over
//! the tools a glob names.
//!
//! A budget is checked and charged in the write that starts an attempt, so no race, retry, crash
//! or replay spends past it: the start of each attempt pays its price (a replayed or cached call
//! runs nothing and pays nothing), and an attempt that would go past a limit does not start; its
//! call settles as `budget_exceeded`, an error the model reads. A new call already past a limit
//! is refused as it is recorded, without being scheduled.
//!
//! Run time is known only when an attempt ends, so its start reserves its whole timeout (the
//! kernel ends no attempt later than that) and its end gives back what it did not use: the time
//! spent and the time reserved together never pass the limit. An attempt whose timeout does not
//! fit waits while others hold reservations that may come back, and is refused once none do; a
//! call with no timeout cannot run under a limit on time.
//!
//! A limit may ask a person instead (the policy file's `budgets[].approval`): the call waits,
//! parked as an approval whose answer is the limit's new bounds; raised, the call starts when its
//! budget can pay, and refused or expired, it settles as `budget_exceeded`.
//!
//! A subagent spends its parent's budget (and its parent's parent's): every budget up its chain
//! is checked and charged with each start, its own, if it has one, among them. A branch spends
//! its own, with its parent's limits unless it was given others.

use serde::{Deserialize, Serialize};

use crate::model::{ApprovalGate, RunId, RunRecord};

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
    /// At most this much tool run time, in milliseconds: each attempt from its start to its end,
    /// at most its timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_time_ms: Option<u64>,
    /// What set the limit (`request`, `parent`, or the policy file's `policy:budgets[i]`), for
    /// inspection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
    #[serde(default)]
    pub spent: Spent,
    /// A call that would pass the limit waits for a person who may raise it, instead of failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
}

/// Who is asked to raise a limit a call would pass, and for how long.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// How long the person may take; past it the call settles as `budget_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Shown to the person, before what was passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What a limit has counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub calls: u64,
    pub cost: f64,
    /// The run time of the attempts that ended, each at most its timeout.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub time_ms: u64,
    /// The timeouts of the attempts running: what they may still spend.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_ms: u64,
}

fn is_zero(ms: &u64) -> bool {
    *ms == 0
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
    /// The attempt's timeout, reserved as it starts (0: it has none).
    pub timeout_ms: u64,
}

/// An attempt that ended, as a budget sees it: what its start reserved and how long it ran.
#[derive(Clone, Copy, Debug)]
pub struct Ended<'a> {
    pub tool: &'a str,
    pub timeout_ms: u64,
    pub ran_ms: u64,
}

impl Ended<'_> {
    /// The run time the attempt is charged: what it ran, at most its timeout.
    fn charged_ms(&self) -> u64 {
        match self.timeout_ms {
            0 => self.ran_ms,
            timeout => self.ran_ms.min(timeout),
        }
    }
}

impl Limit {
    /// Checks that the limit limits something, by a cost that is a number >= 0: on refusal, the
    /// field at fault (`""` for the limit itself, or `.max_cost`) and why. Its glob is checked
    /// where it is read.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.max_calls.is_none() && self.max_cost.is_none() && self.max_time_ms.is_none() {
            return Err((
                "",
                "sets none of max_calls, max_cost and max_time, so it limits nothing".to_owned(),
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
        if let Some(max) = self.max_cost
            && attempt.unit_cost > 0.0
            && cost > max + COST_EPSILON
        {
            return Some(Over::Cost { would: cost, max });
        }
        let max = self.max_time_ms?;
        let spent = self.spent.time_ms;
        let held = self.spent.reserved_ms;
        if attempt.timeout_ms == 0 {
            return Some(Over::Untimed { max });
        }
        (spent + held + attempt.timeout_ms > max).then_some(Over::Time {
            spent,
            held,
            timeout: attempt.timeout_ms,
            max,
        })
    }

    fn charge(&mut self, attempt: Attempt<'_>) {
        if self.covers(attempt.tool) {
            self.spent.calls += u64::from(attempt.first);
            self.spent.cost += attempt.unit_cost;
            self.spent.reserved_ms += attempt.timeout_ms;
        }
    }

    fn settle(&mut self, ended: Ended<'_>) {
        if self.covers(ended.tool) {
            self.spent.reserved_ms = self.spent.reserved_ms.saturating_sub(ended.timeout_ms);
            self.spent.time_ms += ended.charged_ms();
        }
    }
}

/// What a limit would pass.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Over {
    Calls {
        would: u64,
        max: u64,
    },
    Cost {
        would: f64,
        max: f64,
    },
    /// The attempt's timeout does not fit beside what was spent and what running attempts hold.
    Time {
        spent: u64,
        held: u64,
        timeout: u64,
        max: u64,
    },
    /// The attempt has no timeout, so no reservation bounds it.
    Untimed {
        max: u64,
    },
}

impl Over {
    /// Whether the attempt may fit once running attempts give back what they hold.
    fn may_fit_later(&self) -> bool {
        matches!(self, Over::Time { spent, held, timeout, max } if *held > 0 && spent + timeout <= *max)
    }
}

/// Why an attempt may not start: the message the model reads, and the person to ask when the
/// limit passed asks for one.
#[derive(Clone, Debug, PartialEq)]
pub struct Exceeded {
    pub message: String,
    pub ask: Option<ApprovalGate>,
    /// The attempt's timeout passes a limit on time only by what running attempts hold: it waits
    /// for them to end instead of failing (nobody is asked yet).
    pub waits: bool,
}

/// What an approval that asks to raise a limit names as what asked: the run holding the limit and
/// its place among that run's limits (a run's limits are fixed when it is created).
const RAISE: &str = "budget:";

/// The limit an approval asks to raise, from what the approval says asked (`decided_by`); `None`
/// for an approval of anything else.
pub fn raised_by(decided_by: &str) -> Option<(RunId, usize)> {
    let (run, index) = decided_by.strip_prefix(RAISE)?.rsplit_once('#')?;
    Some((RunId::parse(run, "decided_by").ok()?, index.parse().ok()?))
}

/// A person's raise of a limit: its new bounds, each that is given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Raise {
    pub max_calls: Option<u64>,
    pub max_cost: Option<f64>,
    pub max_time_ms: Option<u64>,
}

/// The JSON Schema of the answer to an approval that asks to raise a limit.
pub const RAISE_SCHEMA: &str = r#"{"type":"object","properties":{"max_calls":{"type":"integer","minimum":0},"max_cost":{"type":"number","minimum":0},"max_time_ms":{"type":"integer","minimum":0}},"minProperties":1,"additionalProperties":false}"#;

impl Raise {
    /// Reads an answer (canonical JSON) as a raise, or says what is wrong with it.
    pub fn parse(answer: &str) -> Result<Raise, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Given {
            #[serde(default)]
            max_calls: Option<u64>,
            #[serde(default)]
            max_cost: Option<f64>,
            #[serde(default)]
            max_time_ms: Option<u64>,
        }
        let shape =
            "answer with the new limit, such as {\"max_cost\": 10.0}, {\"max_calls\": 50} or {\"max_time_ms\": 600000}";
        let given: Given = serde_json::from_str(answer).map_err(|e| format!("{e}; {shape}"))?;
        if given.max_calls.is_none() && given.max_cost.is_none() && given.max_time_ms.is_none() {
            return Err(format!("the answer raises nothing; {shape}"));
        }
        if let Some(cost) = given.max_cost
            && !(cost.is_finite() && cost >= 0.0)
        {
            return Err(format!("max_cost {cost} is not a cost >= 0"));
        }
        Ok(Raise {
            max_calls: given.max_calls,
            max_cost: given.max_cost,
            max_time_ms: given.max_time_ms,
        })
    }
}

/// Raises limit `index` of `run`'s budget as `decider` answered; what set it keeps its name, so a
/// branch tells a raised policy limit from one its request asked for.
pub fn raise(run: &mut RunRecord, index: usize, raise: Raise, decider: &str) -> Result<(), String> {
    let limit = run
        .budget
        .as_mut()
        .and_then(|budget| budget.limits.get_mut(index))
        .ok_or_else(|| format!("run {} has no budget limit {index} to raise", run.id))?;
    never_lower("max_calls", raise.max_calls, limit.max_calls)?;
    never_lower("max_cost", raise.max_cost, limit.max_cost)?;
    never_lower("max_time_ms", raise.max_time_ms, limit.max_time_ms)?;
    limit.max_calls = raise.max_calls.or(limit.max_calls);
    limit.max_cost = raise.max_cost.or(limit.max_cost);
    limit.max_time_ms = raise.max_time_ms.or(limit.max_time_ms);
    let by = limit.set_by.take().unwrap_or_else(|| "request".to_owned());
    limit.set_by = Some(format!("{by}, raised by {decider}"));
    Ok(())
}

/// Refuses a new bound `new` of `name` below the limit's `old` one.
fn never_lower<T: PartialOrd + std::fmt::Display>(name: &str, new: Option<T>, old: Option<T>) -> Result<(), String> {
    match (new, old) {
        (Some(new), Some(old)) if new < old => Err(format!(
            "{name} {new} is below the limit's {old}; an answer raises a limit, never lowers it"
        )),
        _ => Ok(()),
    }
}

/// Checks `attempt` against every budget of `accounts` (the run first, then each ancestor whose
/// budget covers it); the first limit it would pass refuses it, naming the run that holds it.
pub fn check(accounts: &[&RunRecord], attempt: Attempt<'_>) -> Result<(), Exceeded> {
    let (run, over, (index, limit)) = match accounts.iter().find_map(|run| {
        let budget = run.budget.as_ref()?;
        budget
            .limits
            .iter()
            .enumerate()
            .find_map(|(index, limit)| limit.over(attempt).map(|over| (*run, over, (index, limit))))
    }) {
        Some(found) => found,
        None => return Ok(()),
    };
    let what = match over {
        Over::Calls { would, max } => format!("calls {would} of {max}"),
        Over::Cost { would, max } => format!("cost {would:.2} of {max:.2}"),
        Over::Time {
            spent,
            held,
            timeout,
            max,
        } => format!(
            "time {} spent and {} held by running calls, with {} more for this call's timeout, of {}",
            seconds(spent),
            seconds(held),
            seconds(timeout),
            seconds(max)
        ),
        Over::Untimed { max } => format!("time of {} and the call has no timeout", seconds(max)),
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
    let passed = format!("budget exceeded: {what}{scope} for {holder}");
    let waits = over.may_fit_later();
    let ask = limit.ask.as_ref().filter(|_| !waits).map(|ask| ApprovalGate {
        timeout_ms: ask.timeout_ms,
        approvers: ask.approvers.clone(),
        message: Some(match &ask.message {
            Some(message) => format!(
                "{message} ({passed}); answer with a higher limit to let '{}' run",
                attempt.tool
            ),
            None => format!("{passed}; answer with a higher limit to let '{}' run", attempt.tool),
        }),
        decided_by: format!("{RAISE}{}#{index}", run.id),
    });
    Err(Exceeded {
        message: format!("{passed}; '{}' did not run", attempt.tool),
        ask,
        waits,
    })
}

/// A span of milliseconds as the model reads it: `1.50 s`.
fn seconds(ms: u64) -> String {
    format!("{:.2} s", ms as f64 / 1000.0)
}

/// Charges `attempt` to `run`'s own limits that cover it.
pub fn charge(run: &mut RunRecord, attempt: Attempt<'_>) {
    if let Some(budget) = &mut run.budget {
        for limit in &mut budget.limits {
            limit.charge(attempt);
        }
    }
}

/// Settles `ended`'s run time with `run`'s own limits that cover it: what its start reserved
/// comes back, what it ran is spent.
pub fn settle(run: &mut RunRecord, ended: Ended<'_>) {
    if let Some(budget) = &mut run.budget {
        for limit in &mut budget.limits {
            limit.settle(ended);
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

/// A limit of `run`'s own that is passed: none, if every start was checked first. Time counts
/// what running attempts hold, as well as what ended ones spent.
pub fn overspent(run: &RunRecord) -> Option<&Limit> {
    run.budget.as_ref()?.limits.iter().find(|limit| {
        limit.max_calls.is_some_and(|max| limit.spent.calls > max)
            || limit.max_cost.is_some_and(|max| limit.spent.cost > max + COST_EPSILON)
            || limit
                .max_time_ms
                .is_some_and(|max| limit.spent.time_ms + limit.spent.reserved_ms > max)
    })
}

#[cfg(test)]
mod tests;
