//! Policy: which tool calls an agent may make, which are refused, and which need a person.
//!
//! A [`Policy`] is loaded from a YAML file (see [`Policy::from_yaml`] for the format) and asked
//! one question per call: [`Policy::decide`] takes the facts of the call ([`CallFacts`]: the
//! tool's declared metadata, the arguments and the run's agent, labels and granted permissions)
//! and answers with a [`Decision`]: a [`Verdict`] (allow, deny with a reason, or ask for
//! approval) and `decided_by`, the name of the part of the policy that decided, which the
//! kernel records with the decision.
//!
//! Three kinds of contribution are combined, in this order:
//!
//! 1. **Presets**, the policies Rewyn users know. Each gives a verdict or abstains:
//!    - `allow_list` (tool-name globs): allows a matching tool, denies every other one;
//!    - `deny_list` (tool-name globs): denies a matching tool;
//!    - `max_risk` (`ceiling`, `approve_above`): denies a risk above the ceiling and asks for
//!      approval above `approve_above`; an undeclared risk counts as low;
//!    - `require_permissions`: denies a call whose tool needs a permission the run was not
//!      granted (exact names), naming the missing ones.
//! 2. **Rules**, ordered by priority (higher first, ties in file order). The first rule whose
//!    matchers all hold contributes its decision; later rules are not consulted. A rule's CEL
//!    condition that fails to evaluate fails closed: a deny or approve rule counts as matching,
//!    an allow rule turns into a deny naming the rule and the error.
//! 3. **The tool's own flag**: a tool declared `requires_approval` (or whose approval predicate
//!    held, or failed to evaluate) asks for approval.
//!
//! The strictest contribution wins: deny over approve over allow. Among equally strict ones
//! the first in the order above decides (presets in the order listed, then the rule, then the
//! tool). When the answer is approve, the approval details of every approving contribution are
//! merged: the shortest timeout, the named approvers, and the messages joined.
//!
//! The file's `default` (allow unless it says `deny`) stands in when no contribution grants or
//! denies. Two contributions are *escalations* rather than verdicts: the `max_risk` approval band
//! and the tool's own flag. They put a person in front of a call that is otherwise allowed, but
//! grant nothing, so under `default: deny` a call that no `allow_list` entry or rule allows is
//! still denied (`default:deny`), however risky. An approve rule, by contrast, is a verdict: it
//! allows the call once a person approves. Presets other than `allow_list` only restrict; a
//! kill switch that overrides every rule is `deny_list: ["*"]`.
//!
//! A tool's own `requires_approval` predicate over its arguments is compiled with
//! [`compile_predicate`] when the tool registers and evaluated per call with
//! [`Predicate::eval`]; the caller turns the outcome into [`CallFacts::tool_requires_approval`].
//!
//! This module is pure: it reads no clock, does no I/O besides [`Policy::load`] reading the
//! file (and a warning log when a condition fails closed), and knows nothing of gRPC or the
//! store.

mod cel;
mod file;
pub(crate) mod glob;
pub(crate) mod keys;
mod presets;
mod rules;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use serde_json::Value;

pub use self::cel::{Predicate, compile_predicate};
use self::presets::Presets;
use self::rules::Rule;

/// How bad a tool's mistakes can be, ordered `Low < Medium < High < Critical`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Risk {
    /// Harmless or easily undone.
    Low,
    /// Visible but recoverable.
    Medium,
    /// Costly to undo, such as moving money.
    High,
    /// Irreversible or dangerous.
    Critical,
}

impl Risk {
    /// Every level, lowest first.
    pub const ALL: [Risk; 4] = [Risk::Low, Risk::Medium, Risk::High, Risk::Critical];

    /// The lowercase name used in policy files and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
            Risk::Critical => "critical",
        }
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Risk {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Risk::ALL
            .into_iter()
            .find(|risk| risk.as_str() == text)
            .ok_or_else(|| format!("unknown risk level '{text}' (expected low, medium, high or critical)"))
    }
}

impl From<crate::model::RiskLevel> for Risk {
    fn from(level: crate::model::RiskLevel) -> Self {
        use crate::model::RiskLevel;
        match level {
            RiskLevel::Low => Risk::Low,
            RiskLevel::Medium => Risk::Medium,
            RiskLevel::High => Risk::High,
            RiskLevel::Critical => Risk::Critical,
        }
    }
}

/// What the policy needs to know about one tool call.
#[derive(Clone, Copy, Debug)]
pub struct CallFacts<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The call's arguments (already validated against the tool's schema).
    pub args: &'a Value,
    /// The tool's declared risk; `None` (undeclared) is treated as [`Risk::Low`].
    pub risk: Option<Risk>,
    /// The tool declares that it only reads.
    pub read_only: bool,
    /// The tool declares that it writes.
    pub writes: bool,
    /// The permissions the tool requires.
    pub permissions: &'a [String],
    /// The resources the call may change, filled from its arguments (`repo:acme/api`).
    pub resources: &'a [String],
    /// The tool's own `requires_approval` holds for this call: declared `true`, or its predicate
    /// over the arguments evaluated to true or failed to evaluate.
    pub tool_requires_approval: bool,
    /// The run's agent name.
    pub run_agent: &'a str,
    /// The run's labels.
    pub run_labels: &'a BTreeMap<String, String>,
    /// The permissions granted to the run at its creation.
    pub run_permissions: &'a [String],
}

impl CallFacts<'_> {
    /// The declared risk, undeclared counting as low.
    fn effective_risk(&self) -> Risk {
        self.risk.unwrap_or(Risk::Low)
    }
}

/// What the policy says about a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run the call.
    Allow,
    /// Run nothing; the model reads `<tool> not allowed. reason: <reason>`.
    Deny {
        /// Why, in words meant for the model and the audit trail.
        reason: String,
    },
    /// Park the run until a person approves or rejects the call.
    Approve {
        /// How long the approval may stay open; `None` leaves it to the tool's or kernel's default.
        timeout_ms: Option<u64>,
        /// Who may answer; empty means anyone allowed to answer approvals.
        approvers: Vec<String>,
        /// A note shown to the approver.
        message: Option<String>,
    },
}

impl Verdict {
    /// `"allow"`, `"deny"` or `"approve"`, for events and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny { .. } => "deny",
            Verdict::Approve { .. } => "approve",
        }
    }

    /// Deny beats approve beats allow.
    fn strictness(&self) -> u8 {
        match self {
            Verdict::Allow => 0,
            Verdict::Approve { .. } => 1,
            Verdict::Deny { .. } => 2,
        }
    }
}

/// A verdict and the part of the policy that reached it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The answer.
    pub verdict: Verdict,
    /// Who decided: `preset:<name>` (`allow_list`, `deny_list`, `max_risk`,
    /// `require_permissions`), `rule:<id>`, `tool:requires_approval`, or `default:allow` /
    /// `default:deny` when nothing else contributed.
    pub decided_by: String,
}

impl Decision {
    fn new(decided_by: impl Into<String>, verdict: Verdict) -> Self {
        Decision {
            verdict,
            decided_by: decided_by.into(),
        }
    }

    /// The text the model reads for a denied call, `<tool> not allowed. reason: <reason>`;
    /// `None` unless the verdict is deny.
    pub fn denial_text(&self, tool: &str) -> Option<String> {
        match &self.verdict {
            Verdict::Deny { reason } => Some(format!("{tool} not allowed. reason: {reason}")),
            _ => None,
        }
    }
}

/// A policy file that could not be loaded, with the line it failed at where known.
///
/// Displays as `policy.yaml line 12: reason` (the file name, or `policy` for text that came
/// from no file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// The file the policy came from, if any.
    pub path: Option<PathBuf>,
    /// The 1-based line of the offending YAML node, when known.
    pub line: Option<usize>,
    /// What is wrong, precise enough to fix it without reading the code.
    pub reason: String,
}

impl PolicyError {
    fn new(line: Option<usize>, reason: impl Into<String>) -> Self {
        PolicyError {
            path: None,
            line,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}", path.display())?,
            None => f.write_str("policy")?,
        }
        if let Some(line) = self.line {
            write!(f, " line {line}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for PolicyError {}

/// What applies when no preset, rule or tool flag contributes a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Fallback {
    #[default]
    Allow,
    Deny,
}

/// The compiled content of a policy file.
#[derive(Debug, Default)]
struct Compiled {
    fallback: Fallback,
    presets: Presets,
    /// Sorted by priority, highest first; ties keep file order.
    rules: Vec<Rule>,
    /// In file order.
    budgets: Vec<PolicyBudget>,
    /// In file order.
    limits: Vec<PolicyLimit>,
    fair_shares: Option<FairShares>,
}

/// How queued calls share what is scarce: by the value of a run label, each value by its weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FairShares {
    /// The run label whose value names a run's share.
    pub label: String,
    /// Each value's weight; a value not listed weighs 1.
    pub weights: std::collections::BTreeMap<String, u32>,
}

impl FairShares {
    /// The weight of the share `value` (`None`: the runs without the label).
    pub fn weight(&self, value: Option<&str>) -> u32 {
        value.and_then(|value| self.weights.get(value)).copied().unwrap_or(1)
    }
}

/// A tool limit of the policy file, with its glob compiled: the scheduler asks for each call.
#[derive(Debug)]
struct PolicyLimit {
    limit: crate::machine::throttle::ToolLimit,
    matcher: globset::GlobMatcher,
}

/// A budget of the policy file: the runs it covers and the limit each gets.
#[derive(Debug)]
struct PolicyBudget {
    /// Labels a run must have, each with its value.
    labels: std::collections::BTreeMap<String, String>,
    /// Globs one of which the run's agent must match; `None`: any agent.
    agents: Option<glob::GlobList>,
    limit: crate::machine::budget::Limit,
}

/// A loaded, validated policy. Cheap to clone and share between threads.
#[derive(Clone, Debug)]
pub struct Policy {
    inner: Arc<Compiled>,
}

impl Policy {
    /// The policy of a kernel started without `--policy`: every call is allowed unless the tool
    /// itself requires approval.
    pub fn allow_all() -> Policy {
        Policy {
            inner: Arc::new(Compiled::default()),
        }
    }

    /// Parses and validates a policy written in YAML, compiling its CEL conditions.
    ///
    /// The format, every key optional:
    ///
    /// ```yaml
    /// default: allow                     # allow | deny: applies when nothing contributes
    /// allow_list: ["add", "read_*"]      # tool-name globs; other tools are denied
    /// deny_list: ["rm_*"]                # tool-name globs; matching tools are denied
    /// max_risk: { ceiling: high, approve_above: medium }
    /// require_permissions: true          # the run's permissions must cover the tool's
    /// rules:
    ///   - id: no-big-refunds             # unique; decided_by is "rule:no-big-refunds"
    ///     priority: 10                   # higher first, ties in file order; default 0
    ///     match:                         # every matcher present must hold; absent = any
    ///       tools: ["refund*"]           # globs on the tool name
    ///       agents: ["billing-*"]        # globs on the run's agent
    ///       risk: [high, critical]       # the tool's risk (undeclared = low)
    ///       read_only: false
    ///       writes: true
    ///       when: "args.cents > 10000 && run.labels.env == 'prod'"   # CEL
    ///     decision: approve              # allow | deny | approve
    ///     reason: "refunds over $100 need a person"   # required for deny
    ///     approval: { timeout: 1h, approvers: ["payments-oncall"], message: "check the ticket" }
    /// ```
    ///
    /// Globs support `*` (any run of characters), `?` (one character), `[abc]` and `{a,b}`.
    /// CEL conditions see `tool` (string), `args` (the arguments), `run.agent` (string) and
    /// `run.labels` (map of strings). Timeouts are `250ms`, `30s`, `5m`, `1h` or whole seconds.
    ///
    /// A file with any error is refused whole; the error names the line and what is wrong.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        let compiled = file::parse(text)?;
        Ok(Policy {
            inner: Arc::new(compiled),
        })
    }

    /// Reads and parses the policy file at `path`; the error names the path.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let named = |mut error: PolicyError| {
            error.path = Some(path.to_path_buf());
            error
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| named(PolicyError::new(None, format!("cannot read: {e}"))))?;
        Policy::from_yaml(&text).map_err(named)
    }

    /// The limits the policy's budgets give a new run of `agent` with `labels`, in file order.
    pub fn budgets_for(
        &self,
        agent: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<crate::machine::budget::Limit> {
        self.inner
            .budgets
            .iter()
            .filter(|budget| {
                budget
                    .labels
                    .iter()
                    .all(|(name, value)| labels.get(name) == Some(value))
                    && budget.agents.as_ref().is_none_or(|agents| agents.is_match(agent))
            })
            .map(|budget| budget.limit.clone())
            .collect()
    }

    /// The tool limits that count calls of `tool`, in file order.
    pub fn limits_for(&self, tool: &str) -> Vec<crate::machine::throttle::ToolLimit> {
        self.inner
            .limits
            .iter()
            .filter(|limit| limit.matcher.is_match(tool))
            .map(|limit| limit.limit.clone())
            .collect()
    }

    /// The policy's fair shares, if it sets them.
    pub fn fair_shares(&self) -> Option<&FairShares> {
        self.inner.fair_shares.as_ref()
    }

    /// The share of a run with `labels`: its value of the fair-share label, when the policy sets
    /// fair shares and the run has that label.
    pub fn share_of(&self, labels: &std::collections::BTreeMap<String, String>) -> Option<String> {
        let shares = self.inner.fair_shares.as_ref()?;
        labels.get(&shares.label).cloned()
    }

    /// Every tool limit, in file order.
    pub fn limits(&self) -> Vec<crate::machine::throttle::ToolLimit> {
        self.inner.limits.iter().map(|limit| limit.limit.clone()).collect()
    }

    /// How many rules the policy holds, for logs.
    pub fn rule_count(&self) -> usize {
        self.inner.rules.len()
    }

    /// Decides one call: the strictest contribution of the presets, the first matching rule, the
    /// tool's own `requires_approval` and, when none of them grants or denies, the default.
    pub fn decide(&self, call: &CallFacts<'_>) -> Decision {
        let mut contributions = Vec::new();
        self.inner.presets.contribute(call, &mut contributions);
        if let Some(decision) = rules::first_match(&self.inner.rules, call) {
            contributions.push(Contribution::verdict(decision));
        }
        if call.tool_requires_approval {
            contributions.push(Contribution::escalation(Decision::new(
                "tool:requires_approval",
                Verdict::Approve {
                    timeout_ms: None,
                    approvers: Vec::new(),
                    message: None,
                },
            )));
        }
        if contributions.iter().all(|c| c.escalation) {
            contributions.push(Contribution::verdict(self.inner.fallback.decision()));
        }
        strictest(contributions).unwrap_or_else(|| self.inner.fallback.decision())
    }
}

impl Fallback {
    fn decision(self) -> Decision {
        match self {
            Fallback::Allow => Decision::new("default:allow", Verdict::Allow),
            Fallback::Deny => Decision::new(
                "default:deny",
                Verdict::Deny {
                    reason: "the policy denies every call that no rule or allow_list allows".to_owned(),
                },
            ),
        }
    }
}

/// One part of the policy's answer about a call.
struct Contribution {
    decision: Decision,
    /// An escalation (the `max_risk` approval band, the tool's own `requires_approval`) only
    /// asks for a person before a call that is otherwise allowed; it neither grants nor denies,
    /// so the default still applies beside it.
    escalation: bool,
}

impl Contribution {
    fn verdict(decision: Decision) -> Self {
        Contribution {
            decision,
            escalation: false,
        }
    }

    fn escalation(decision: Decision) -> Self {
        Contribution {
            decision,
            escalation: true,
        }
    }
}

/// The strictest contribution, the first one among equals. An approval carries the merged
/// details of every approving contribution, so a rule's approvers are not lost to a preset
/// that also asked.
fn strictest(contributions: Vec<Contribution>) -> Option<Decision> {
    let mut winner: Option<Decision> = None;
    let mut approvals = Vec::new();
    for Contribution { decision, .. } in contributions {
        if let Verdict::Approve { .. } = decision.verdict {
            approvals.push(decision.verdict.clone());
        }
        if winner
            .as_ref()
            .is_none_or(|w| decision.verdict.strictness() > w.verdict.strictness())
        {
            winner = Some(decision);
        }
    }
    let mut winner = winner?;
    if let Verdict::Approve {
        timeout_ms,
        approvers,
        message,
    } = &mut winner.verdict
    {
        let mut messages: Vec<String> = Vec::new();
        for approval in approvals {
            let Verdict::Approve {
                timeout_ms: t,
                approvers: a,
                message: m,
            } = approval
            else {
                continue;
            };
            *timeout_ms = match (*timeout_ms, t) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            for approver in a {
                if !approvers.contains(&approver) {
                    approvers.push(approver);
                }
            }
            if let Some(m) = m.filter(|m| !messages.contains(m)) {
                messages.push(m);
            }
        }
        *message = (!messages.is_empty()).then(|| messages.join("; "));
    }
    Some(winner)
}
