//! What stands between a recorded call and its dispatch: argument validation, the policy file, the
//! tool's own `requires_approval`, the run's interactivity, and the call's price.
//!
//! The policy is swapped whole on reload (SIGHUP or `AdminService.ReloadPolicy`): a file that does
//! not load is refused and the kernel keeps the policy it had.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde_json::Value;
use tracing::{info, warn};

use crate::error::KernelError;
use crate::model::{ApprovalGate, RunRecord, ToolDef};
use crate::policy::{CallFacts, Policy, Verdict};
use crate::registry::KnownTool;
use crate::store::CallGate;

/// The policy in force and the central unit prices; a cheap handle.
#[derive(Clone)]
pub struct Governance {
    policy: Arc<RwLock<Arc<Policy>>>,
    path: Option<PathBuf>,
    /// (tool-name prefix, price per call), longest prefix first.
    unit_prices: Arc<Vec<(String, f64)>>,
}

impl Governance {
    /// Loads the policy file (allow all without one); a file that does not load stops the kernel.
    pub fn load(path: Option<&Path>, unit_prices: Vec<(String, f64)>) -> Result<Self, KernelError> {
        let policy = match path {
            Some(path) => {
                let policy = Policy::load(path).map_err(|e| KernelError::invalid("policy", e.to_string()))?;
                info!(path = %path.display(), rules = policy.rule_count(), "policy loaded");
                policy
            }
            None => {
                info!("no --policy: every call is allowed");
                Policy::allow_all()
            }
        };
        let mut unit_prices = unit_prices;
        unit_prices.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        Ok(Governance {
            policy: Arc::new(RwLock::new(Arc::new(policy))),
            path: path.map(Path::to_owned),
            unit_prices: Arc::new(unit_prices),
        })
    }

    /// The policy file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the policy file again; on failure the current policy stays and the error says why.
    pub fn reload(&self) -> Result<usize, KernelError> {
        let Some(path) = &self.path else {
            return Err(KernelError::FailedPrecondition(
                "the kernel runs without a policy file (allow all); start it with --policy to reload one".into(),
            ));
        };
        match Policy::load(path) {
            Ok(policy) => {
                let rules = policy.rule_count();
                *self.policy.write().expect("policy lock poisoned") = Arc::new(policy);
                info!(path = %path.display(), rules, "policy reloaded");
                Ok(rules)
            }
            Err(error) => {
                warn!(path = %path.display(), %error, "policy reload refused, keeping the current policy");
                Err(KernelError::invalid("policy", error.to_string()))
            }
        }
    }

    /// A new run's budget limits: those it asks for, then those the policy's budgets give a run of
    /// `agent` with `labels`.
    pub fn budget(
        &self,
        asked: Vec<crate::machine::budget::Limit>,
        agent: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<crate::machine::budget::Limit> {
        let mut limits = asked;
        limits.extend(self.policy().budgets_for(agent, labels));
        limits
    }

    /// The policy in force now (a reload swaps it whole).
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().expect("policy lock poisoned").clone()
    }

    /// The price of one attempt: the tool's own, else the longest matching central prefix.
    pub fn unit_cost(&self, tool: &ToolDef) -> f64 {
        if tool.options.cost_per_call > 0.0 {
            return tool.options.cost_per_call;
        }
        self.unit_prices
            .iter()
            .find(|(prefix, _)| tool.name.starts_with(prefix.as_str()))
            .map_or(0.0, |(_, p)| *p)
    }

    /// Decides what happens to a call before it may run. `asked` is the answer of the tool's
    /// approval predicate where that is code in the worker (see `grpc::tool_calls`); a tool with
    /// such a predicate and no answer asks a person.
    pub fn gate(
        &self,
        tool: &KnownTool,
        args: &Value,
        resources: &[String],
        run: &RunRecord,
        asked: Option<bool>,
    ) -> CallGate {
        let def = &tool.def;
        if let Some(validator) = &tool.validator
            && let Err(message) = validator.check(&def.name, args)
        {
            return CallGate::Refuse {
                message,
                reason: "invalid_arguments",
                outcome: crate::model::Outcome::InvalidArguments,
            };
        }
        // A predicate that cannot be evaluated asks a person: it fails closed.
        let tool_requires_approval = def.options.requires_approval
            || (def.options.approval_predicate_in_worker && asked.unwrap_or(true))
            || tool
                .approval_predicate
                .as_ref()
                .is_some_and(|predicate| match predicate {
                    Ok(predicate) => predicate.eval(args).unwrap_or(true),
                    Err(_) => true,
                });
        let risk = def.options.risk.as_deref().and_then(|r| r.parse().ok());
        let facts = CallFacts {
            tool: &def.name,
            args,
            risk,
            read_only: def.options.read_only,
            writes: def.options.writes,
            permissions: &def.options.permissions,
            resources,
            tool_requires_approval,
            run_agent: &run.agent,
            run_labels: &run.labels,
            run_permissions: &run.permissions,
        };
        let decision = self.policy().decide(&facts);
        match decision.verdict {
            Verdict::Allow => CallGate::Run {
                decided_by: decision.decided_by,
            },
            Verdict::Deny { reason } => CallGate::Deny {
                message: format!("{} not allowed. reason: {reason}", def.name),
                decided_by: decision.decided_by,
            },
            Verdict::Approve { .. } if !run.interactive => CallGate::Deny {
                message: format!(
                    "{} not allowed. reason: it needs a person's approval ({}) and run {} is non-interactive",
                    def.name, decision.decided_by, run.id
                ),
                decided_by: decision.decided_by,
            },
            Verdict::Approve {
                timeout_ms,
                approvers,
                message,
            } => CallGate::Approve(ApprovalGate {
                timeout_ms: timeout_ms.or(def.options.approval_timeout_ms),
                approvers,
                message,
                decided_by: decision.decided_by,
            }),
        }
    }
}

impl Governance {
    /// Whether a policy file is in force: only then may a local step be denied, so only then does
    /// a hosted handler check each live step before running it.
    pub fn checks_steps(&self) -> bool {
        self.path.is_some()
    }

    /// Decides whether a hosted handler's local step `step_id` may run: the policy sees it as the
    /// tool `step:<id>` (its effect `read` or `pure` as read-only, `write` as writing), so rules and
    /// lists match it by that name. A step cannot wait for a person: a rule that would ask denies
    /// it. `Err` carries the reason and what decided.
    pub fn step_gate(
        &self,
        step_id: &str,
        effect: crate::model::Effect,
        run: &RunRecord,
    ) -> Result<String, (String, String)> {
        let name = format!("step:{step_id}");
        let facts = CallFacts {
            tool: &name,
            args: &Value::Null,
            risk: None,
            read_only: effect != crate::model::Effect::Write,
            writes: effect == crate::model::Effect::Write,
            permissions: &[],
            resources: &[],
            tool_requires_approval: false,
            run_agent: &run.agent,
            run_labels: &run.labels,
            run_permissions: &run.permissions,
        };
        let decision = self.policy().decide(&facts);
        match decision.verdict {
            Verdict::Allow => Ok(decision.decided_by),
            Verdict::Deny { reason } => Err((format!("{name} not allowed. reason: {reason}"), decision.decided_by)),
            Verdict::Approve { .. } => Err((
                format!(
                    "{name} not allowed. reason: the policy would ask a person ({}), and a local step cannot wait \
                     for one",
                    decision.decided_by
                ),
                decision.decided_by,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy of a guide's first ```yaml block that opens with `opening`, loaded as shown.
    fn policy_in(guide: &str, opening: &str) -> Policy {
        let block = guide
            .split("```yaml\n")
            .skip(1)
            .map(|rest| &rest[..rest.find("```").expect("the block ends")])
            .find(|block| block.starts_with(opening))
            .unwrap_or_else(|| panic!("no ```yaml block opening with {opening}"));
        Policy::from_yaml(block).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The policy file the governance guide shows must load as shown.
    #[test]
    fn the_policy_example_in_the_docs_loads() {
        let policy = policy_in(include_str!("../../docs/guides/governance.md"), "default:");
        assert_eq!(policy.rule_count(), 3);
    }

    /// The budgets the budgets guide shows load as shown, and give each run the limits it says.
    #[test]
    fn the_budgets_example_in_the_docs_loads_and_matches_by_label_and_agent() {
        let policy = policy_in(include_str!("../../docs/guides/budgets.md"), "budgets:");
        let billing = [("team".to_owned(), "billing".to_owned())].into();
        let limits = policy.budgets_for("support", &billing);
        assert_eq!(limits.len(), 1);
        assert_eq!(limits[0].max_cost, Some(5.0));
        assert_eq!(limits[0].set_by.as_deref(), Some("policy:budgets[0]"));
        let limits = policy.budgets_for("batch-nightly", &Default::default());
        assert_eq!(
            (limits[0].tools.as_deref(), limits[0].max_calls),
            (Some("payments_*"), Some(100))
        );
        assert!(policy.budgets_for("support", &Default::default()).is_empty());
    }

    /// The budget that asks a person, as the budgets guide shows it, loads as shown.
    #[test]
    fn the_asking_budget_in_the_docs_loads_with_who_to_ask() {
        let policy = policy_in(
            include_str!("../../docs/guides/budgets.md"),
            "budgets:\n  - labels: { team: research }",
        );
        let research = std::collections::BTreeMap::from([("team".to_owned(), "research".to_owned())]);
        let limits = policy.budgets_for("any", &research);
        let ask = limits[0].ask.as_ref().expect("the budget asks a person");
        assert_eq!(
            (ask.approvers.as_slice(), ask.timeout_ms),
            (&["finance".to_owned()][..], Some(4 * 3_600_000))
        );
    }

    /// The limits the limits guide shows load as shown, and count the tools it says.
    #[test]
    fn the_limits_example_in_the_docs_loads_and_matches_its_tools() {
        let policy = policy_in(include_str!("../../docs/guides/limits.md"), "default:");
        let payments = policy.limits_for("payments_charge");
        assert_eq!(payments.len(), 1);
        assert_eq!(
            (payments[0].per_second, payments[0].burst(), payments[0].at_once),
            (Some(10.0), 10.0, Some(4))
        );
        assert_eq!(
            policy.limits_for("search")[0].burst(),
            3.0,
            "one second's worth, rounded up"
        );
        assert!(policy.limits_for("lookup").is_empty());
    }

    /// The fair shares the limits guide shows load as shown.
    #[test]
    fn the_fair_shares_example_in_the_docs_loads() {
        let policy = policy_in(include_str!("../../docs/guides/limits.md"), "fair_shares:");
        let shares = policy.fair_shares().expect("the guide sets fair shares");
        assert_eq!(shares.label, "tenant");
        assert_eq!(
            (
                shares.weight(Some("acme")),
                shares.weight(Some("globex")),
                shares.weight(None)
            ),
            (4, 1, 1)
        );
        let labels = std::collections::BTreeMap::from([("tenant".to_owned(), "acme".to_owned())]);
        assert_eq!(policy.share_of(&labels).as_deref(), Some("acme"));
        assert_eq!(policy.share_of(&Default::default()), None);
    }

    #[test]
    fn the_longest_unit_price_prefix_wins_and_a_declared_cost_beats_it() {
        let governance = Governance::load(None, vec![("mcp_".into(), 0.001), ("mcp_docs_".into(), 0.002)]).unwrap();
        let mut tool = ToolDef {
            name: "mcp_docs_search".into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            version: String::new(),
            fingerprint: String::new(),
            options: Default::default(),
        };
        assert_eq!(governance.unit_cost(&tool), 0.002);
        tool.name = "mcp_web_fetch".into();
        assert_eq!(governance.unit_cost(&tool), 0.001);
        tool.options.cost_per_call = 0.5;
        assert_eq!(governance.unit_cost(&tool), 0.5);
        tool.name = "local".into();
        tool.options.cost_per_call = 0.0;
        assert_eq!(governance.unit_cost(&tool), 0.0);
    }

    /// A tool whose predicate is code in the worker: the worker's answer decides, and no answer
    /// (none asked, none given) asks a person.
    #[test]
    fn a_predicate_in_the_worker_asks_a_person_when_it_says_so_or_gives_no_answer() {
        let governance = Governance::load(None, Vec::new()).unwrap();
        let mut def = ToolDef {
            name: "refund".into(),
            description: "Refunds.".into(),
            input_schema: serde_json::json!({"type": "object"}),
            version: "1".into(),
            fingerprint: String::new(),
            options: Default::default(),
        };
        def.options.approval_predicate_in_worker = true;
        let tool = KnownTool::new(def, 0, 0);
        let run = crate::machine::records::run();
        let args = serde_json::json!({"cents": 25_000});
        let gate = |asked| governance.gate(&tool, &args, &[], &run, asked);
        assert!(
            matches!(gate(Some(false)), CallGate::Run { .. }),
            "{:?}",
            gate(Some(false))
        );
        assert!(
            matches!(gate(Some(true)), CallGate::Approve(_)),
            "{:?}",
            gate(Some(true))
        );
        assert!(
            matches!(gate(None), CallGate::Approve(_)),
            "fails closed: {:?}",
            gate(None)
        );
    }
}
