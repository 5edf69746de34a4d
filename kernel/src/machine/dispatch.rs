//! One dispatch of a step: its start on a worker, its result, the loss of its lease, its timeout;
//! and how a step settles or waits for its next attempt, whatever ends the attempt.

use super::events::{
    AgentDispatched, AgentLeaseLost, AgentResult, AttemptOf, LeaseLost, Next, Payload, SettledBy, SettledStatus,
    Settlement, Started, SubagentResult, ToolAttemptFailed, ToolLeaseLost, ToolResult, ToolStart,
};
use super::{StepChange, human_ms, json_or_string};
use crate::model::{
    DispatchId, ErrorKind, Idempotency, Millis, Outcome, RetryPolicy, RunId, SessionId, StepKey, StepKind, StepRecord,
    StepStatus,
};

/// After this many lost workers a call is failed as poison instead of dispatched again.
pub const MAX_LEASE_LOSSES: u32 = 5;

/// A lease granted to a worker, to record before the worker is told.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StartDispatch {
    pub run_id: RunId,
    pub key: StepKey,
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub worker: String,
    pub session_id: SessionId,
    pub lease_expires_at: Millis,
    /// The replica whose worker session holds the lease, and whose heartbeat dates it; `None`:
    /// the replica whose writer records the start (a start another replica sent names its own).
    #[serde(default)]
    pub replica: Option<String>,
    /// The tool limits the call's start must pass (the scheduler's reading of the policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<crate::machine::throttle::ToolLimit>,
    /// How long the call waited in the queue for those limits, in milliseconds.
    #[serde(default)]
    pub limit_wait_ms: u64,
}

/// A worker's result for a dispatch it claims to hold.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ResultReport {
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub session_id: SessionId,
    /// Canonical JSON text, or the error.
    pub outcome: Result<String, (ErrorKind, String)>,
    pub progress_count: u32,
}

/// A lease that ended without a result.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LeaseLoss {
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub reason: String,
}

/// Whether the dispatch `(dispatch_id, attempt)` of `session` (any session when `None`) still
/// holds `step`: only then may a message about it change anything.
pub fn held(step: &StepRecord, dispatch_id: &DispatchId, attempt: u32, session: Option<&SessionId>) -> bool {
    step.status == StepStatus::Running
        && step.dispatch_id.as_ref() == Some(dispatch_id)
        && step.attempts == attempt
        && session.is_none_or(|s| step.session_id.as_ref() == Some(s))
}

/// Starts attempt `start.attempt` of a pending step on its worker; `None` when the step is not
/// pending (settled meanwhile) or the start was built from a stale view of it (the attempt is
/// not the one after its last), so an attempt number is never issued twice.
pub fn start(step: &StepRecord, start: &StartDispatch, now: Millis) -> Option<StepChange> {
    if step.status != StepStatus::Pending || step.attempts.checked_add(1) != Some(start.attempt) {
        return None;
    }
    let mut started = step.clone();
    started.status = StepStatus::Running;
    started.attempts = start.attempt;
    started.dispatch_id = Some(start.dispatch_id.clone());
    started.worker = Some(start.worker.clone());
    started.session_id = Some(start.session_id.clone());
    started.lease_expires_at = Some(start.lease_expires_at);
    started.started_at = step.started_at.or(Some(now));
    started.not_before = None;
    let payload = Started {
        step_key: started.key.to_string(),
        position: started.position,
        tool: started.tool.clone(),
        attempt: start.attempt,
        dispatch_id: start.dispatch_id.clone(),
        worker: start.worker.clone(),
        session_id: start.session_id.clone(),
        idempotency_key: started.idempotency_key.clone(),
        lease_expires_at: start.lease_expires_at,
        timeout_ms: started.timeout_ms,
    };
    let event = if step.kind == StepKind::Agent {
        AgentDispatched(payload).event()
    } else {
        ToolStart(payload).event()
    };
    Some(StepChange { step: started, event })
}

/// Whether starting `step` uses up an approval: the start of an approved call consumes it, in
/// the same transaction, so one approval covers one start.
pub fn consumes_approval(step: &StepRecord) -> bool {
    step.approval
        .as_ref()
        .is_some_and(|a| a.answer == crate::model::ApprovalStatus::Approved)
}

/// Ends a step with its one `tool:result` (`agent:result`, `subagent:result`): its terminal
/// status and why, its output or error, the progress its last attempt reported, and what else
/// settled it (`by`).
pub fn settle(
    step: &StepRecord,
    (status, why): (StepStatus, Outcome),
    outcome: Result<&str, (ErrorKind, &str)>,
    progress_count: u32,
    by: SettledBy,
    now: Millis,
) -> StepChange {
    debug_assert!(
        status.is_terminal() && !step.status.is_terminal(),
        "a settled step settles once"
    );
    let mut settled = step.clone();
    settled.status = status;
    settled.outcome = Some(why);
    settled.finished_at = Some(now);
    settled.progress_count += progress_count;
    settled.lease_expires_at = None;
    settled.cost = settled.unit_cost * f64::from(settled.attempts);
    match outcome {
        Ok(output) => {
            settled.output = Some(output.to_owned());
            settled.error = None;
            settled.error_kind = None;
        }
        Err((kind, message)) => {
            settled.output = None;
            settled.error = Some(message.to_owned());
            settled.error_kind = Some(kind);
        }
    }
    let payload = Settlement {
        step_key: settled.key.to_string(),
        position: settled.position,
        tool: settled.tool.clone(),
        status: match status {
            StepStatus::Succeeded => SettledStatus::Ok,
            StepStatus::Cancelled => SettledStatus::Cancelled,
            _ => SettledStatus::Error,
        },
        outcome: why,
        attempts: settled.attempts,
        dispatch_id: settled.dispatch_id.clone(),
        worker: settled.worker.clone(),
        progress_count: settled.progress_count,
        duration_ms: settled.started_at.map(|s| now - s),
        cost: settled.cost,
        output: outcome.ok().map(json_or_string),
        error: outcome.err().map(|(_, message)| message.to_owned()),
        error_kind: outcome.err().map(|(kind, _)| kind),
        by,
    };
    let event = match step.kind {
        StepKind::Agent => AgentResult(payload).event(),
        StepKind::Subagent => SubagentResult::Settled(payload).event(),
        _ => ToolResult::Settled(payload).event(),
    };
    StepChange { step: settled, event }
}

/// Whether a failed attempt of `step` gets another one, and after how long.
fn next_attempt_delay(step: &StepRecord, kind: ErrorKind) -> Option<u64> {
    let policy = step.retry.as_ref()?;
    (kind == ErrorKind::Retryable && step.attempts < RetryPolicy::attempts(Some(policy)))
        .then(|| policy.delay_ms(step.attempts))
}

/// Puts a failed attempt back to pending with its retry time, recording the attempt's error.
fn retry_later(
    step: &StepRecord,
    (kind, message): (ErrorKind, &str),
    delay_ms: u64,
    progress_count: u32,
    reason: &str,
    now: Millis,
) -> StepChange {
    let not_before = now + delay_ms as Millis;
    let mut pending = step.clone();
    pending.status = StepStatus::Pending;
    pending.error = Some(message.to_owned());
    pending.error_kind = Some(kind);
    pending.not_before = Some(not_before);
    pending.lease_expires_at = None;
    pending.progress_count += progress_count;
    let event = ToolAttemptFailed {
        attempt: AttemptOf::of(step),
        error: message.to_owned(),
        error_kind: kind,
        reason: reason.to_owned(),
        next_attempt_at: not_before,
    }
    .event();
    StepChange { step: pending, event }
}

/// What a worker's result does to the step its dispatch holds (see [`held`]): a success or a
/// final error settles it, a retryable error with attempts left waits for the next attempt.
/// The second value is how long a success stays in the result cache, for a tool that keeps one.
pub fn record_result(step: &StepRecord, report: &ResultReport, now: Millis) -> (StepChange, Option<Millis>) {
    match &report.outcome {
        Ok(output) => {
            let cached_until = step.cache_ttl_ms.map(|ttl| now + ttl as Millis);
            let change = settle(
                step,
                (StepStatus::Succeeded, Outcome::Ok),
                Ok(output),
                report.progress_count,
                SettledBy::default(),
                now,
            );
            (change, cached_until)
        }
        Err((kind, message)) => {
            let change = match next_attempt_delay(step, *kind) {
                Some(delay) => retry_later(step, (*kind, message), delay, report.progress_count, "error", now),
                None => settle(
                    step,
                    (StepStatus::Failed, Outcome::ToolError),
                    Err((*kind, message)),
                    report.progress_count,
                    SettledBy::default(),
                    now,
                ),
            };
            (change, None)
        }
    }
}

/// What the model reads of an `at_most_once` call that started and then ended without the tool's
/// own word on it.
fn indeterminate_message(step: &StepRecord, what_happened: &str) -> String {
    format!(
        "indeterminate: '{}' (at_most_once) was started on worker {} (attempt {}) and {what_happened}; \
         the effect may or may not have happened, so the kernel will not run it again",
        step.tool,
        step.worker.as_deref().unwrap_or("?"),
        step.attempts,
    )
}

/// What losing its lease does to a held step: an `at_most_once` step is settled as
/// indeterminate and one that lost its worker [`MAX_LEASE_LOSSES`] times as poison (neither may
/// run again); any other goes back to pending, to be dispatched again with the same key.
pub fn lose_lease(step: &StepRecord, loss: &LeaseLoss, now: Millis) -> StepChange {
    let ended = if step.idempotency == Idempotency::AtMostOnce {
        Some((
            ErrorKind::Fatal,
            Outcome::Indeterminate,
            "indeterminate",
            indeterminate_message(step, &format!("the lease was lost ({})", loss.reason)),
        ))
    } else if step.lease_losses + 1 >= MAX_LEASE_LOSSES {
        Some((
            ErrorKind::Poison,
            Outcome::Poison,
            "lease_lost",
            format!(
                "'{}' lost its worker {MAX_LEASE_LOSSES} times (last: {}); the call may be crashing its workers, so it \
                 is not dispatched again",
                step.tool, loss.reason
            ),
        ))
    } else {
        None
    };
    if let Some((kind, outcome, reason, message)) = ended {
        return settle(
            step,
            (StepStatus::Failed, outcome),
            Err((kind, &message)),
            0,
            SettledBy::reason(reason),
            now,
        );
    }
    let mut requeued = step.clone();
    requeued.status = StepStatus::Pending;
    requeued.lease_expires_at = None;
    requeued.lease_losses += 1;
    let payload = LeaseLost {
        attempt: AttemptOf::of(step),
        reason: loss.reason.clone(),
        next: Next::Redispatch,
    };
    let event = if step.kind == StepKind::Agent {
        AgentLeaseLost(payload).event()
    } else {
        ToolLeaseLost(payload).event()
    };
    StepChange { step: requeued, event }
}

/// What a timeout does to a held step: an `at_most_once` step is indeterminate (the tool started
/// and said nothing, as uncertain as a lost worker; its retry policy covers only errors the tool
/// returned); a blocking step fails (its thread cannot be stopped, so another attempt could run
/// beside it); any other is retried by its policy, or fails as timed out.
pub fn time_out(step: &StepRecord, now: Millis) -> StepChange {
    if step.idempotency == Idempotency::AtMostOnce {
        let message = indeterminate_message(
            step,
            &format!("timed out after {} without a result", human_ms(step.timeout_ms)),
        );
        return settle(
            step,
            (StepStatus::Failed, Outcome::Indeterminate),
            Err((ErrorKind::Fatal, &message)),
            0,
            SettledBy {
                cause: Some("timeout".to_owned()),
                ..SettledBy::reason("indeterminate")
            },
            now,
        );
    }
    let mut message = format!(
        "tool '{}' timed out after {} (attempt {})",
        step.tool,
        human_ms(step.timeout_ms),
        step.attempts
    );
    if step.blocking {
        message.push_str("; a blocking tool's thread cannot be stopped, so it is not retried");
    } else if let Some(delay) = next_attempt_delay(step, ErrorKind::Retryable) {
        return retry_later(step, (ErrorKind::Retryable, &message), delay, 0, "timeout", now);
    }
    settle(
        step,
        (StepStatus::Failed, Outcome::TimedOut),
        Err((ErrorKind::Retryable, &message)),
        0,
        SettledBy::reason("timeout"),
        now,
    )
}

/// Fails a step still waiting for a worker, without having run; `None` when it is not pending,
/// or when it is a hosted run's dispatch, which waits for a worker hosting its agent however long
/// that takes (the run is the agent's, not a call someone waits on).
pub fn fail_pending(
    step: &StepRecord,
    message: &str,
    (reason, outcome): (&str, Outcome),
    now: Millis,
) -> Option<StepChange> {
    (step.status == StepStatus::Pending && step.kind != StepKind::Agent).then(|| {
        settle(
            step,
            (StepStatus::Failed, outcome),
            Err((ErrorKind::Retryable, message)),
            0,
            SettledBy::reason(reason),
            now,
        )
    })
}

#[cfg(test)]
mod tests;
