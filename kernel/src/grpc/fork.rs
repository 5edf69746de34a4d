//! What a fork asks for, checked against the parent's record: the branch to create. And the allow
//! tokens of a case run.

use std::collections::BTreeMap;

use kernel_proto::v1 as pb;

use super::{Kernel, convert};
use crate::error::KernelError;
use crate::model::{Fork, ForkPoint, RunRecord, StepKind, StepRecord};
use crate::store::NewRun;

/// The most allow tokens a case run may hold.
const MAX_ALLOW: usize = 64;

/// Checks a case run's allow tokens: each `tool:<name>` with a tool name, or `step:<id>` with a
/// local step id.
pub fn allow_tokens(tokens: Vec<String>) -> Result<Vec<String>, KernelError> {
    if tokens.len() > MAX_ALLOW {
        return Err(KernelError::invalid("allow", format!("at most {MAX_ALLOW} tokens")));
    }
    let mut checked = Vec::with_capacity(tokens.len());
    for (index, token) in tokens.into_iter().enumerate() {
        let field = format!("allow[{index}]");
        let token = token.trim().to_owned();
        let valid = match token.split_once(':') {
            Some(("tool", name)) => crate::model::validate_tool_name(name),
            Some(("step", id)) => super::hosted::check_step_id(id).map_err(|e| e.to_string()),
            _ => Err(format!("'{token}' is neither tool:<name> nor step:<id>")),
        };
        valid.map_err(|message| KernelError::invalid(field, message))?;
        if !checked.contains(&token) {
            checked.push(token);
        }
    }
    Ok(checked)
}

/// The branch `req` asks for of `parent`, whose recorded steps are `steps`: its fork point and
/// replaced results must name settled steps of that record, the replaced results at or before
/// the fork point. The branch keeps what the parent was granted, so `caller` must be able to
/// grant it.
pub fn branch(
    kernel: &Kernel,
    parent: &RunRecord,
    steps: &[StepRecord],
    req: pb::ForkRunRequest,
    caller: Option<&crate::auth::Caller>,
) -> Result<NewRun, KernelError> {
    if let Some(caller) = caller {
        caller.may_grant(&parent.permissions)?;
    }
    let recorded = |key: &str, field: &str| {
        steps
            .iter()
            .find(|step| step.key.as_str() == key && step.kind != StepKind::Agent)
            .ok_or_else(|| KernelError::invalid(field, format!("run {} recorded no step '{key}'", parent.id)))
    };
    let at = match req.at_step_key.trim() {
        "" => None,
        key => {
            let step = recorded(key, "at_step_key")?;
            Some(ForkPoint {
                key: step.key.clone(),
                turn: step.turn,
                position: step.position,
            })
        }
    };
    let mut fork = Fork {
        of: parent.id.clone(),
        at,
        results: BTreeMap::new(),
    };
    for (key, result) in req.set_results {
        let field = format!("set_results[{key}]");
        let step = recorded(&key, &field)?;
        if !step.status.is_terminal() {
            return Err(KernelError::invalid(
                field,
                format!("step '{key}' is {}, not settled", step.status),
            ));
        }
        if !fork.covers(step) {
            return Err(KernelError::invalid(
                field,
                format!("step '{key}' comes after the fork point, so the branch does not replay it"),
            ));
        }
        fork.results
            .insert(key, convert::canonical_json(&result, &field, "null")?);
    }
    let input = match req.input_json.trim() {
        "" => parent.input.clone(),
        text => convert::canonical_json(text, "input_json", "null")?,
    };
    let hosted = match parent.hosted {
        false => None,
        true => {
            let known = kernel.registry.agent(&parent.agent).ok_or_else(|| {
                KernelError::NotFound(format!(
                    "no worker offers or has offered agent '{}', which hosts run {}",
                    parent.agent, parent.id
                ))
            })?;
            known.check_input(&input)?;
            Some(known.hosted())
        }
    };
    let labels = match req.labels.is_empty() {
        true => parent.labels.clone(),
        false => convert::labels(req.labels)?,
    };
    let asked = match req.budget.is_empty() {
        true => crate::machine::budget::for_branch(parent),
        false => convert::budget_limits(req.budget)?,
    };
    let budget = kernel.governance.budget(asked, &parent.agent, &labels);
    Ok(NewRun {
        agent: parent.agent.clone(),
        input,
        labels,
        budget,
        idempotency_key: super::runs::idempotency_key(req.idempotency_key)?,
        max_tool_calls: parent.max_tool_calls,
        interactive: parent.interactive,
        permissions: parent.permissions.clone(),
        granted_by: caller.map(|c| c.name().to_owned()),
        capture: parent.capture,
        hosted,
        parent: None,
        session_key: None,
        max_concurrency: parent.max_concurrency,
        fork: Some(fork),
        allow: Vec::new(),
        // A branch is a run of its own: its trace is the caller's, not its parent's.
        trace: None,
        home: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_tokens_name_a_tool_or_a_step() {
        let tokens = allow_tokens(vec![
            "tool:refund".into(),
            " step:charge.card ".into(),
            "tool:refund".into(),
        ])
        .unwrap();
        assert_eq!(tokens, ["tool:refund", "step:charge.card"]);
        let bad = allow_tokens(vec!["tool:refund".into(), "refund".into()]).unwrap_err();
        assert!(bad.to_string().contains("allow[1]"), "{bad}");
        assert!(allow_tokens(vec!["tool:has space".into()]).is_err());
        assert!(allow_tokens(vec!["step:".into()]).is_err());
    }
}
