//! The presets Rewyn users know: allow list, deny list, a risk ceiling with a band that asks for
//! approval, and required permissions. Each contributes a verdict or abstains.

use super::glob::GlobList;
use super::{CallFacts, Contribution, Decision, Risk, Verdict};

/// The presets a policy file switched on; all off is the allow-all policy.
#[derive(Clone, Debug, Default)]
pub(crate) struct Presets {
    pub(crate) allow_list: Option<GlobList>,
    pub(crate) deny_list: Option<GlobList>,
    pub(crate) max_risk: Option<MaxRisk>,
    pub(crate) require_permissions: bool,
}

/// Above `ceiling` denied; above `approve_above` (at most the ceiling) asks a person.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaxRisk {
    pub(crate) ceiling: Risk,
    pub(crate) approve_above: Option<Risk>,
}

impl Presets {
    /// Appends each preset's verdict, in the fixed order that breaks ties between equally
    /// strict presets: allow_list, deny_list, max_risk, require_permissions.
    pub(crate) fn contribute(&self, call: &CallFacts<'_>, out: &mut Vec<Contribution>) {
        if let Some(list) = &self.allow_list {
            let verdict = if list.is_match(call.tool) {
                Verdict::Allow
            } else {
                Verdict::Deny {
                    reason: format!("not on the policy's allow_list ({})", list.describe()),
                }
            };
            out.push(Contribution::verdict(Decision::new("preset:allow_list", verdict)));
        }
        if let Some(entry) = self.deny_list.as_ref().and_then(|list| list.first_match(call.tool)) {
            out.push(Contribution::verdict(Decision::new(
                "preset:deny_list",
                Verdict::Deny {
                    reason: format!("matches the policy's deny_list entry '{entry}'"),
                },
            )));
        }
        if let Some(max) = self.max_risk
            && let Some(verdict) = max.judge(call.effective_risk())
        {
            // Its approval band only escalates an otherwise allowed call; its ceiling denies.
            let escalation = matches!(verdict, Verdict::Approve { .. });
            let decision = Decision::new("preset:max_risk", verdict);
            out.push(if escalation {
                Contribution::escalation(decision)
            } else {
                Contribution::verdict(decision)
            });
        }
        if self.require_permissions {
            let mut missing: Vec<&str> = Vec::new();
            for needed in call.permissions {
                if !call.run_permissions.contains(needed) && !missing.contains(&needed.as_str()) {
                    missing.push(needed);
                }
            }
            if !missing.is_empty() {
                out.push(Contribution::verdict(Decision::new(
                    "preset:require_permissions",
                    Verdict::Deny {
                        reason: format!("the run lacks required permission(s): {}", missing.join(", ")),
                    },
                )));
            }
        }
    }
}

impl MaxRisk {
    fn judge(self, risk: Risk) -> Option<Verdict> {
        if risk > self.ceiling {
            return Some(Verdict::Deny {
                reason: format!("risk {risk} is above the policy's ceiling ({})", self.ceiling),
            });
        }
        let band = self.approve_above.filter(|above| risk > *above)?;
        Some(Verdict::Approve {
            timeout_ms: None,
            approvers: Vec::new(),
            message: Some(format!("risk {risk} is above {band}, so a person must approve")),
        })
    }
}
