//! Ordered rules: the first rule whose matchers all hold contributes its decision.

use ::cel::Context;

use super::cel::{Condition, call_context};
use super::glob::GlobList;
use super::{CallFacts, Decision, Risk, Verdict};

/// One rule of the policy file, validated.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    pub(crate) id: String,
    pub(crate) priority: i64,
    pub(crate) matcher: Matcher,
    /// What the rule decides when it matches.
    pub(crate) outcome: Verdict,
}

/// The matchers of a rule; an absent one matches any call.
#[derive(Clone, Debug, Default)]
pub(crate) struct Matcher {
    pub(crate) tools: Option<GlobList>,
    pub(crate) agents: Option<GlobList>,
    pub(crate) risk: Option<Vec<Risk>>,
    pub(crate) read_only: Option<bool>,
    pub(crate) writes: Option<bool>,
    /// Globs over the call's resources: one matches a resource as filled (`repo:acme/*`) or its
    /// kind alone (`repo`).
    pub(crate) resources: Option<GlobList>,
    pub(crate) when: Option<Condition>,
}

impl Matcher {
    /// The matchers that need no CEL, checked first so most rules never build a CEL context.
    fn matches_statically(&self, call: &CallFacts<'_>) -> bool {
        self.tools.as_ref().is_none_or(|g| g.is_match(call.tool))
            && self.agents.as_ref().is_none_or(|g| g.is_match(call.run_agent))
            && self.risk.as_ref().is_none_or(|r| r.contains(&call.effective_risk()))
            && self.read_only.is_none_or(|want| want == call.read_only)
            && self.writes.is_none_or(|want| want == call.writes)
            && self.resources.as_ref().is_none_or(|globs| {
                call.resources
                    .iter()
                    .any(|r| globs.is_match(r) || globs.is_match(crate::resources::kind(r)))
            })
    }
}

/// The decision of the first matching rule in `rules` (already in priority order).
///
/// A condition that cannot be evaluated fails closed: a deny or approve rule counts as
/// matching, an allow rule becomes a deny that names the rule and the error.
pub(crate) fn first_match(rules: &[Rule], call: &CallFacts<'_>) -> Option<Decision> {
    let mut context: Option<Context<'static, 'static>> = None;
    for rule in rules {
        if !rule.matcher.matches_statically(call) {
            continue;
        }
        let by = format!("rule:{}", rule.id);
        let Some(when) = &rule.matcher.when else {
            return Some(Decision::new(by, rule.outcome.clone()));
        };
        let context = context.get_or_insert_with(|| call_context(call));
        match when.eval(context) {
            Ok(true) => return Some(Decision::new(by, rule.outcome.clone())),
            Ok(false) => continue,
            Err(error) => {
                tracing::warn!(rule = %rule.id, tool = call.tool, %error, "policy condition failed, failing closed");
                let failure = format!("policy rule {} could not be evaluated: {error}", rule.id);
                let verdict = match rule.outcome.clone() {
                    Verdict::Allow => Verdict::Deny { reason: failure },
                    Verdict::Deny { reason } => Verdict::Deny {
                        reason: format!("{reason} ({failure})"),
                    },
                    Verdict::Approve {
                        timeout_ms,
                        approvers,
                        message,
                    } => Verdict::Approve {
                        timeout_ms,
                        approvers,
                        message: Some(match message {
                            Some(message) => format!("{message} ({failure})"),
                            None => failure,
                        }),
                    },
                };
                return Some(Decision::new(by, verdict));
            }
        }
    }
    None
}
