//! A turn's calls: what a resubmitted call gets (its recorded result, the call in flight, or
//! `replay_input_changed`), when a run takes a turn at all, and how each new call is recorded:
//! settled at once without running (over the run's `max_tool_calls`, an unknown tool, invalid
//! arguments, denied by policy), served from the result cache, gated for a person, or scheduled.

use std::sync::Arc;

use serde_json::Value;

use super::dispatch::StartDispatch;
use super::events::{
    self, AtOnce, CachedCall, CallNamed, Payload, RefusedCall, SettledStatus, ToolDenied, ToolResult, ToolScheduled,
};
use super::{NewEvent, json_or_string};
use crate::error::KernelError;
use crate::model::{
    ApprovalGate, ErrorKind, EventType, Idempotency, Millis, Outcome, RunId, RunRecord, RunStatus, StepKey, StepKind,
    StepRecord, StepStatus, ToolDef, cut,
};

/// One call of a submitted turn, validated and resolved against the registry.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PlannedCall {
    pub position: u32,
    pub key: StepKey,
    pub call_id: Option<String>,
    pub tool_name: String,
    /// Canonical JSON text, each secret value in it marked by its keyed hash ([`crate::secrets`]).
    pub arguments: String,
    /// The secret values taken out of the arguments, sealed for the call's dispatch.
    #[serde(default)]
    pub sealed: Option<String>,
    /// `None` when no worker registered the tool, or the turn's offer leaves it out.
    pub tool: Option<Arc<ToolDef>>,
    /// The turn named the tools the model was offered, and this call's is not among them.
    pub not_offered: bool,
    /// The call's own timeout, overriding the tool's.
    pub timeout_ms: Option<u64>,
    /// Hash of tool, fingerprint and canonical arguments: what a resubmission must match.
    pub call_hash: String,
    /// What validation and policy decided.
    pub gate: CallGate,
    /// Price of one attempt.
    pub unit_cost: f64,
    /// The tool's resources, filled from the arguments.
    pub resources: Vec<String>,
    /// A worker slot the scheduler reserved for this call: if the call is recorded ready to run,
    /// its `tool:start` is recorded in the same commit as its `tool:scheduled`.
    pub start: Option<StartDispatch>,
}

/// What stands between a recorded call and its dispatch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum CallGate {
    /// Dispatch it; `decided_by` names what allowed it.
    Run { decided_by: String },
    /// Settle it at once with a recoverable error the model reads (e.g. invalid arguments).
    Refuse {
        message: String,
        #[serde(with = "crate::wire::reason")]
        reason: crate::wire::Reason,
        outcome: Outcome,
    },
    /// Denied by policy: settled under `tool:denied`.
    Deny { message: String, decided_by: String },
    /// Ask a person before it may start.
    Approve(ApprovalGate),
}

/// A turn to record.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TurnPlan {
    pub run_id: RunId,
    pub turn: u32,
    pub calls: Vec<PlannedCall>,
    /// What an unknown-tool message lists: the turn's offer, or the tools connected workers offer
    /// now (empty when every call's tool is known).
    pub available_tools: Vec<String>,
    pub default_timeout_ms: u64,
    /// Unsettled calls a run may have; checked inside the write, so concurrent turns cannot both pass.
    pub max_pending_calls: usize,
    /// Events a run's log may hold; checked inside the write against the log's true length, so
    /// concurrent turns cannot both pass.
    pub max_events: u64,
    /// The dispatch of a hosted run whose handler calls, or of the call whose body calls (with
    /// `caller`): checked inside the write.
    pub fence: Option<super::hosted::Fence>,
    /// A call a tool's body makes through the kernel (a turn of that one call): the calling
    /// step, which `fence` must hold.
    #[serde(default)]
    pub caller: Option<StepKey>,
    /// At most this many of the turn's calls run at once; `None` (or 0) takes the run's default.
    pub max_concurrency: Option<u32>,
    /// The first tool the turn says the model was offered that always asks a person
    /// (`requires_approval`), by its index in the offer.
    pub offers_approval_tool: Option<(usize, String)>,
    /// The run's share of the queue, copied to each new call ([`StepRecord::share`]).
    pub share: Option<String>,
}

/// What recording a turn decided for one call.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum CallDisposition {
    /// Already terminal: its recorded result is served again.
    Replayed(StepRecord),
    /// Already in flight: wait for its result.
    Joined(StepRecord),
    /// Recorded and settled at once without running (unknown tool, call limit).
    Settled(StepRecord),
    /// Recorded as pending: to dispatch.
    Scheduled(StepRecord),
    /// Recorded and started on the slot reserved for it, in one commit: to send to its worker.
    Started(StepRecord),
    /// Recorded as awaiting a person's answer.
    Gated(StepRecord),
    /// Same identity, different tool, fingerprint or arguments: nothing recorded.
    Diverged { step: StepRecord, message: String },
}

/// Refuses a turn the run cannot take, given what it already recorded at each call's identity
/// (`recorded`, by position) and, when the turn adds calls, how many of its calls are unsettled:
/// a finished run takes no call, a blocked run no new one, no run more unsettled calls than the
/// limit, and no turn a call id that another turn's call holds in flight with another tool or
/// other arguments. Returns the run as the turn leaves it and its event, when the turn starts it.
pub fn admit(
    run: &RunRecord,
    plan: &TurnPlan,
    recorded: &[Option<StepRecord>],
    unsettled: Option<usize>,
    now: Millis,
) -> Result<Option<(RunRecord, NewEvent)>, KernelError> {
    if run.status.is_terminal() {
        return Err(KernelError::FailedPrecondition(format!(
            "run {} is {}; it accepts no new tool calls",
            run.id, run.status
        )));
    }
    if let Some((call, step)) = concurrent_call_id(plan, recorded) {
        return Err(KernelError::AlreadyExists(format!(
            "concurrent_call_id: calls[{}] has call_id '{}', which the call '{}' of turn {} holds in flight with \
             other arguments or another tool; give this call another id, or wait for that one to settle",
            call.position,
            call.call_id.as_deref().unwrap_or_default(),
            step.tool,
            step.turn
        )));
    }
    check_interactive(run, plan, recorded)?;
    let new_calls = recorded.iter().filter(|step| step.is_none()).count();
    // A call a running body makes belongs to a call admitted before the run blocked.
    if run.status == RunStatus::Blocked
        && plan.caller.is_none()
        && let Some(call) = plan
            .calls
            .iter()
            .zip(recorded)
            .find_map(|(call, step)| step.is_none().then_some(call))
    {
        // A blocked run takes no new effects; a resubmission of calls it already holds joins them.
        return Err(KernelError::FailedPrecondition(format!(
            "run_blocked: run {} is blocked waiting for an approval; it accepts no new tool calls until it is answered \
             (calls[{}] is new)",
            run.id, call.position
        )));
    }
    // Each new call may add its events when nothing goes wrong; a replay or a join adds none.
    let added = crate::limits::EVENTS_PER_CALL * new_calls as u64;
    if new_calls > 0 && run.last_seq.saturating_add(added) > plan.max_events {
        return Err(crate::limits::exceeded(
            "calls",
            format!(
                "run {} has {} events and this turn may add {added}",
                run.id, run.last_seq
            ),
            format!("{} events per run", plan.max_events),
            "max-events-per-run",
        ));
    }
    let unsettled = unsettled.unwrap_or(0);
    if new_calls > 0 && unsettled + new_calls > plan.max_pending_calls {
        return Err(crate::limits::exceeded(
            "calls",
            format!("run {} would have {} unsettled calls", run.id, unsettled + new_calls),
            format!("{} per run", plan.max_pending_calls),
            "max-pending-calls-per-run",
        ));
    }
    Ok((run.status == RunStatus::Pending).then(|| {
        let mut started = run.clone();
        started.status = RunStatus::Running;
        started.updated_at = now;
        let event = events::RunStarted {
            turn: Some(plan.turn),
            hosted: None,
        }
        .event();
        (started, event)
    }))
}

/// A run that cannot wait for a person (non-interactive) takes no new call to a tool that always
/// asks one, and may not offer the model such a tool.
fn check_interactive(run: &RunRecord, plan: &TurnPlan, recorded: &[Option<StepRecord>]) -> Result<(), KernelError> {
    if run.interactive {
        return Ok(());
    }
    if let Some((index, name)) = &plan.offers_approval_tool {
        return Err(KernelError::FailedPrecondition(format!(
            "offered_tools[{index}]: run {} is non-interactive and tool '{name}' is declared requires_approval; \
             a non-interactive run cannot offer it",
            run.id
        )));
    }
    let asks =
        plan.calls.iter().zip(recorded).find(|(call, step)| {
            step.is_none() && call.tool.as_ref().is_some_and(|tool| tool.options.requires_approval)
        });
    match asks {
        Some((call, _)) => Err(KernelError::FailedPrecondition(format!(
            "calls[{}]: run {} is non-interactive and tool '{}' is declared requires_approval; a non-interactive \
             run cannot wait for a person",
            call.position, run.id, call.tool_name
        ))),
        None => Ok(()),
    }
}

/// A call of `plan` whose explicit id another turn's call holds in flight, as something else:
/// two calls running together under one id would share one record (Pyrula's
/// `ConcurrentCallIdError`). The same call again joins it; a settled one is a replay or a
/// divergence as usual.
fn concurrent_call_id<'a>(
    plan: &'a TurnPlan,
    recorded: &'a [Option<StepRecord>],
) -> Option<(&'a PlannedCall, &'a StepRecord)> {
    plan.calls.iter().zip(recorded).find_map(|(call, step)| {
        let step = step.as_ref()?;
        (call.call_id.is_some()
            && !step.status.is_terminal()
            && step.turn != plan.turn
            && step.call_hash != call.call_hash)
            .then_some((call, step))
    })
}

/// Whether a turn adds calls, so the limit on unsettled calls needs their count.
pub fn adds_calls(recorded: &[Option<StepRecord>]) -> bool {
    recorded.iter().any(Option::is_none)
}

/// What a resubmitted call gets from the step recorded at its identity: its result again when
/// settled (counted as a replay), the call in flight to join, or `replay_input_changed` when the
/// tool, its fingerprint or the arguments differ (then nothing is recorded).
pub fn resubmitted(step: StepRecord, call: &PlannedCall) -> CallDisposition {
    if step.call_hash != call.call_hash {
        let message = divergence(&step, call);
        CallDisposition::Diverged { step, message }
    } else if step.status.is_terminal() {
        let mut replayed = step;
        replayed.replays += 1;
        CallDisposition::Replayed(replayed)
    } else {
        CallDisposition::Joined(step)
    }
}

/// Explains how a resubmitted call differs from the recorded one.
fn divergence(step: &StepRecord, call: &PlannedCall) -> String {
    let tool = call.tool_name.as_str();
    let fingerprint = call.tool.as_ref().map_or("", |t| t.fingerprint.as_str());
    if call.not_offered && step.tool == tool {
        format!(
            "replay_input_changed: step {} was recorded as a call to '{tool}', which this turn does not offer",
            step.key
        )
    } else if step.tool != tool {
        format!(
            "replay_input_changed: step {} was recorded as a call to '{}', now '{}'",
            step.key, step.tool, tool
        )
    } else if step.fingerprint != fingerprint {
        format!(
            "replay_input_changed: tool '{}' changed since step {} was recorded (fingerprint {} then, {} now)",
            tool, step.key, step.fingerprint, fingerprint
        )
    } else {
        format!(
            "replay_input_changed: the arguments of step {} ('{}') differ from the recorded ones",
            step.key, tool
        )
    }
}

/// The message the model reads for a call to a tool nobody registered.
pub fn unknown_tool_message(name: &str, available: &[String]) -> String {
    let shown: Vec<&str> = available.iter().take(20).map(String::as_str).collect();
    let mut list = shown.join(", ");
    if available.len() > shown.len() {
        list.push_str(&format!(" (and {} more)", available.len() - shown.len()));
    }
    if list.is_empty() {
        list.push_str("none");
    }
    format!("unknown tool '{}'; available: {}", cut(name, 64), list)
}

/// How a new call is settled at once, without running: the message, why, and under which event.
#[derive(Clone, Debug, PartialEq)]
struct Refusal {
    message: String,
    reason: &'static str,
    outcome: Outcome,
    event: EventType,
    decided_by: Option<String>,
}

/// What the kernel decided about a new call before it is recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    refusal: Option<Refusal>,
    approval: Option<ApprovalGate>,
    decided_by: Option<String>,
    cache_ttl_ms: Option<u64>,
    /// The call counts toward the run's `max_tool_calls` (every call does, but one over it).
    counted: bool,
}

impl Decision {
    /// Whether nothing refused the call: it runs, once a person approves it if it is gated.
    pub fn runs(&self) -> bool {
        self.refusal.is_none()
    }

    /// The call's first attempt would pass a limit of its run's budget: refused, or, when the
    /// limit asks a person, gated on an approval whose answer raises it. A call the policy gates
    /// already is asked that first; its start then finds the budget passed and asks again.
    pub fn over_budget(&mut self, exceeded: crate::machine::budget::Exceeded) {
        self.cache_ttl_ms = None;
        if let Some(gate) = exceeded.ask {
            self.approval.get_or_insert(gate);
            return;
        }
        self.refusal = Some(Refusal {
            message: exceeded.message,
            reason: "budget_exceeded",
            outcome: Outcome::BudgetExceeded,
            event: EventType::ToolResult,
            decided_by: None,
        });
        self.approval = None;
    }

    /// Whether the call may be served from the result cache: a `read_only` tool with a cache
    /// TTL, the call neither refused nor gated. The store then looks for a live entry.
    pub fn may_use_cache(&self) -> bool {
        self.refusal.is_none() && self.approval.is_none() && self.cache_ttl_ms.is_some()
    }
}

/// Decides what stands before a new call of `run`: the run's call limit, an unknown tool, then
/// what validation and policy decided (its gate).
pub fn decide(run: &RunRecord, call: &PlannedCall, available: &[String]) -> Decision {
    let over_limit = run.max_tool_calls > 0 && run.tool_calls >= run.max_tool_calls;
    let refusal = if over_limit {
        Some(Refusal {
            message: format!(
                "max_tool_calls reached: run {} may make at most {} tool calls; '{}' did not run",
                run.id, run.max_tool_calls, call.tool_name
            ),
            reason: "max_tool_calls",
            outcome: Outcome::LimitExceeded,
            event: EventType::ToolResult,
            decided_by: None,
        })
    } else if call.tool.is_none() {
        Some(Refusal {
            message: unknown_tool_message(&call.tool_name, available),
            reason: "unknown_tool",
            outcome: Outcome::UnknownTool,
            event: EventType::ToolResult,
            decided_by: None,
        })
    } else {
        match &call.gate {
            CallGate::Refuse {
                message,
                reason,
                outcome,
            } => Some(Refusal {
                message: message.clone(),
                reason,
                outcome: *outcome,
                event: EventType::ToolResult,
                decided_by: None,
            }),
            CallGate::Deny { message, decided_by } => Some(Refusal {
                message: message.clone(),
                reason: "denied",
                outcome: Outcome::Denied,
                event: EventType::ToolDenied,
                decided_by: Some(decided_by.clone()),
            }),
            CallGate::Run { .. } | CallGate::Approve(_) => None,
        }
    };
    let approval = match (&refusal, &call.gate) {
        (None, CallGate::Approve(gate)) => Some(gate.clone()),
        _ => None,
    };
    let decided_by = match (&refusal, &call.gate) {
        (Some(refusal), _) => refusal.decided_by.clone(),
        (None, CallGate::Run { decided_by }) => Some(decided_by.clone()),
        (None, CallGate::Approve(gate)) => Some(gate.decided_by.clone()),
        (None, _) => None,
    };
    // A read_only tool with a cache TTL keeps its successes; an identical call (same tool,
    // fingerprint and canonical arguments) within the TTL is served from the store.
    let cache_ttl_ms = call
        .tool
        .as_ref()
        .filter(|def| def.options.read_only)
        .and_then(|def| def.options.cache_ttl_ms)
        .filter(|ttl| *ttl > 0);
    Decision {
        refusal,
        approval,
        decided_by,
        cache_ttl_ms,
        counted: !over_limit,
    }
}

/// A new call as recorded: its step, the event that records it, and what follows.
#[derive(Clone, Debug, PartialEq)]
pub struct NewCall {
    pub step: StepRecord,
    pub event: NewEvent,
    pub next: Next,
}

/// What follows the recording of a new call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Settled at once: refused, or served from the cache.
    Settled,
    /// Waits for a person: the run asks its next question.
    Gated,
    /// Pending: to dispatch (on its reserved slot, if it has one).
    Scheduled,
}

/// The one event that records a new call as `step` holds it, and what comes next for it: settled
/// at once (refused, or served from the cache as `cached`), or scheduled (gated for a person when
/// `gated`).
fn new_call_event(
    step: &StepRecord,
    call: &PlannedCall,
    refusal: Option<Refusal>,
    gated: bool,
    cached: Option<&str>,
) -> (NewEvent, Next) {
    let named = CallNamed {
        step_key: step.key.to_string(),
        turn: step.turn,
        position: call.position,
        call_id: call.call_id.clone(),
        tool: call.tool_name.clone(),
        version: step.version.clone(),
        fingerprint: step.fingerprint.clone(),
        arguments: serde_json::from_str(&call.arguments).unwrap_or(Value::Null),
        resources: call.resources.clone(),
    };
    // A call settled at once, without running, is described the same way whatever settled it.
    let at_once = |status, outcome, decided_by| AtOnce {
        call: named.clone(),
        attempts: 0,
        cost: 0.0,
        status,
        outcome,
        decided_by,
    };
    if let Some(refusal) = refusal {
        let payload = RefusedCall {
            at_once: at_once(SettledStatus::Error, refusal.outcome, refusal.decided_by),
            error: refusal.message,
            error_kind: ErrorKind::Fatal,
            reason: refusal.reason.to_owned(),
        };
        let event = match refusal.event {
            EventType::ToolDenied => ToolDenied(payload).event(),
            _ => ToolResult::Refused(payload).event(),
        };
        return (event, Next::Settled);
    }
    if let Some(output) = cached {
        let payload = CachedCall {
            at_once: at_once(SettledStatus::Ok, Outcome::Ok, step.decided_by.clone()),
            output: json_or_string(output),
            cache: events::Cache::Hit,
        };
        return (ToolResult::Cached(payload).event(), Next::Settled);
    }
    let event = ToolScheduled {
        call: named,
        call_hash: call.call_hash.clone(),
        idempotency_key: step.idempotency_key.clone(),
        idempotency: step.idempotency,
        timeout_ms: step.timeout_ms,
        retry: step.retry.clone(),
        decided_by: step.decided_by.clone(),
        requires_approval: gated,
        unit_cost: call.unit_cost,
    }
    .event();
    (event, if gated { Next::Gated } else { Next::Scheduled })
}

/// Records a new call of turn `turn` of `run` as `decision` says, with the cached output when
/// the store found one; counts it toward the run's calls.
/// The timeout of `call`'s attempts: the call's own, else its tool's, else the turn's default.
pub fn timeout(call: &PlannedCall, default_timeout_ms: u64) -> u64 {
    let declared = call
        .tool
        .as_ref()
        .and_then(|def| def.options.timeout_ms.filter(|t| *t > 0));
    call.timeout_ms.or(declared).unwrap_or(default_timeout_ms)
}

pub fn record(
    run: &mut RunRecord,
    (turn, default_timeout_ms, limit, share): (u32, u64, Option<u32>, Option<&str>),
    call: &PlannedCall,
    decision: Decision,
    cached: Option<String>,
    now: Millis,
) -> NewCall {
    if decision.counted {
        run.tool_calls += 1;
    }
    let Decision {
        refusal,
        approval,
        decided_by,
        cache_ttl_ms,
        ..
    } = decision;
    let cached = cached.filter(|_| refusal.is_none() && approval.is_none());
    let fingerprint = call.tool.as_ref().map_or(String::new(), |t| t.fingerprint.clone());
    let (version, idempotency, retry, blocking) = match &call.tool {
        Some(def) => (
            def.version.clone(),
            def.options.idempotency(),
            def.options.retry.clone(),
            def.options.blocking,
        ),
        None => (String::new(), Idempotency::SafeToRetry, None, false),
    };
    let timeout_ms = timeout(call, default_timeout_ms);
    let (status, finished_at, outcome) = match (&refusal, &approval, &cached) {
        (Some(refusal), _, _) => (StepStatus::Failed, Some(now), Some(refusal.outcome)),
        (None, Some(_), _) => (StepStatus::AwaitingApproval, None, None),
        (None, None, Some(_)) => (StepStatus::Succeeded, Some(now), Some(Outcome::Ok)),
        (None, None, None) => (StepStatus::Pending, None, None),
    };
    let step = StepRecord {
        run_id: run.id.clone(),
        key: call.key.clone(),
        kind: StepKind::Tool,
        effect: None,
        sealed: call.sealed.clone(),
        hosted: run.hosted,
        // The turn's own bound, else the run's default.
        max_concurrency: limit
            .filter(|n| *n > 0)
            .or((run.max_concurrency > 0).then_some(run.max_concurrency)),
        turn,
        position: call.position,
        call_id: call.call_id.clone(),
        tool: call.tool_name.clone(),
        fingerprint: fingerprint.clone(),
        version: version.clone(),
        arguments: call.arguments.clone(),
        call_hash: call.call_hash.clone(),
        idempotency_key: call.key.idempotency_key(&run.id),
        idempotency,
        timeout_ms,
        status,
        attempts: 0,
        output: cached.clone(),
        error: refusal.as_ref().map(|r| r.message.clone()),
        error_kind: refusal.as_ref().map(|_| ErrorKind::Fatal),
        worker: None,
        session_id: None,
        replica: None,
        dispatch_id: None,
        lease_expires_at: None,
        created_at: now,
        started_at: None,
        finished_at,
        replays: 0,
        progress_count: 0,
        retry: retry.clone(),
        blocking,
        not_before: None,
        lease_losses: 0,
        unit_cost: call.unit_cost,
        cost: 0.0,
        decided_by: decided_by.clone(),
        approval_gate: approval.clone(),
        cache_ttl_ms,
        outcome,
        approval: None,
        resources: call.resources.clone(),
        from_run: None,
        limited_by: Vec::new(),
        limit_wait_ms: 0,
        share: share.map(str::to_owned),
        trace: run.trace,
    };
    let (event, next) = new_call_event(&step, call, refusal, approval.is_some(), cached.as_deref());
    NewCall { step, event, next }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, run, step};
    use crate::model::ToolOptions;
    use serde_json::json;

    fn tool(options: ToolOptions) -> Arc<ToolDef> {
        Arc::new(ToolDef {
            name: "lookup".into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
            version: "2".into(),
            fingerprint: "fp".into(),
            options,
        })
    }

    fn call(gate: CallGate) -> PlannedCall {
        PlannedCall {
            position: 0,
            key: StepKey::for_call(0, 0, None),
            call_id: None,
            tool_name: "lookup".into(),
            arguments: r#"{"q":"x"}"#.into(),
            sealed: None,
            tool: Some(tool(ToolOptions::default())),
            not_offered: false,
            timeout_ms: None,
            call_hash: "h".into(),
            gate,
            unit_cost: 0.25,
            resources: Vec::new(),
            start: None,
        }
    }

    fn allowed() -> PlannedCall {
        call(CallGate::Run {
            decided_by: "default:allow".into(),
        })
    }

    fn plan(calls: Vec<PlannedCall>) -> TurnPlan {
        TurnPlan {
            offers_approval_tool: None,
            share: None,
            run_id: run().id,
            turn: 0,
            calls,
            available_tools: vec!["lookup".into(), "search".into()],
            default_timeout_ms: 30_000,
            max_pending_calls: 2,
            max_events: 1_000,
            fence: None,
            caller: None,
            max_concurrency: None,
        }
    }

    #[test]
    fn a_run_takes_a_turn_only_while_it_can() {
        let turn = plan(vec![allowed()]);
        let mut pending = run();
        pending.status = RunStatus::Pending;
        let (started, event) = admit(&pending, &turn, &[None], Some(0), NOW)
            .unwrap()
            .expect("starts the run");
        assert_eq!(
            (started.status, event.kind),
            (RunStatus::Running, EventType::RunStarted)
        );
        assert_eq!(
            admit(&run(), &turn, &[None], Some(0), NOW).unwrap(),
            None,
            "running already"
        );

        for status in [RunStatus::Completed, RunStatus::Failed, RunStatus::Cancelled] {
            let mut ended = run();
            ended.status = status;
            let refused = admit(&ended, &turn, &[Some(step())], None, NOW).unwrap_err();
            assert!(
                refused.to_string().contains("accepts no new tool calls"),
                "{status}: {refused}"
            );
        }
        let mut blocked = run();
        blocked.status = RunStatus::Blocked;
        let refused = admit(&blocked, &turn, &[None], Some(0), NOW).unwrap_err();
        assert!(refused.to_string().contains("(calls[0] is new)"), "{refused}");
        // Clients recognise the refusal by its prefix (the Python SDK's hosted calls wait on it).
        assert!(
            matches!(&refused, KernelError::FailedPrecondition(message) if message.starts_with("run_blocked: ")),
            "{refused:?}"
        );
        assert!(
            admit(&blocked, &turn, &[Some(step())], None, NOW).is_ok(),
            "a resubmission joins"
        );

        let over = admit(&run(), &turn, &[None], Some(2), NOW).unwrap_err();
        assert!(matches!(over, KernelError::LimitExceeded { .. }), "{over}");
        assert!(admit(&run(), &turn, &[None], Some(1), NOW).is_ok());

        // The events limit reads the log's length in the write: three events a new call.
        let mut long = run();
        long.last_seq = 997;
        assert!(
            admit(&long, &turn, &[None], Some(0), NOW).is_ok(),
            "997 + 3 is the limit"
        );
        long.last_seq = 998;
        let over = admit(&long, &turn, &[None], Some(0), NOW).unwrap_err();
        assert!(
            over.to_string().ends_with(
                "has 998 events and this turn may add 3; the limit is 1000 events per run (--max-events-per-run)"
            ),
            "{over}"
        );
        assert!(
            admit(&long, &turn, &[Some(step())], None, NOW).is_ok(),
            "a join adds no events"
        );
        assert!(adds_calls(&[Some(step()), None]));
        assert!(!adds_calls(&[Some(step())]));
    }

    #[test]
    fn a_resubmitted_call_replays_joins_or_diverges() {
        let mut settled = step();
        settled.tool = "lookup".into();
        settled.fingerprint = "fp".into();
        settled.status = StepStatus::Succeeded;
        let same = allowed();
        let CallDisposition::Replayed(replayed) = resubmitted(settled.clone(), &same) else {
            panic!("a settled call replays");
        };
        assert_eq!(replayed.replays, 1, "counted");
        let mut running = settled.clone();
        running.status = StepStatus::Running;
        assert!(matches!(resubmitted(running, &same), CallDisposition::Joined(_)));

        let mut other_tool = same.clone();
        other_tool.tool_name = "search".into();
        let mut other_version = same.clone();
        other_version.tool = Some(Arc::new(ToolDef {
            fingerprint: "fp2".into(),
            ..(*tool(ToolOptions::default())).clone()
        }));
        let mut not_offered = same.clone();
        not_offered.not_offered = true;
        not_offered.tool = None;
        let cases = [
            (other_tool, "was recorded as a call to 'lookup', now 'search'"),
            (
                other_version,
                "changed since step t0/p0 was recorded (fingerprint fp then, fp2 now)",
            ),
            (same.clone(), "the arguments of step t0/p0 ('lookup') differ"),
            (not_offered, "which this turn does not offer"),
        ];
        for (mut call, said) in cases {
            call.call_hash = "changed".into();
            let CallDisposition::Diverged { message, .. } = resubmitted(settled.clone(), &call) else {
                panic!("{said}: diverges");
            };
            assert!(message.starts_with("replay_input_changed: "), "{message}");
            assert!(message.contains(said), "{message}");
        }
    }

    #[test]
    fn a_new_call_is_settled_gated_cached_or_scheduled() {
        let gate = ApprovalGate {
            timeout_ms: None,
            approvers: Vec::new(),
            message: None,
            decided_by: "rule:ask".into(),
        };
        let mut unknown = allowed();
        unknown.tool = None;
        unknown.tool_name = "nosuch".into();
        /// A name, the call, and the status, outcome, event and next step it is recorded with.
        type Case = (&'static str, PlannedCall, StepStatus, Option<Outcome>, EventType, Next);
        let cases: Vec<Case> = vec![
            (
                "allowed",
                allowed(),
                StepStatus::Pending,
                None,
                EventType::ToolScheduled,
                Next::Scheduled,
            ),
            (
                "unknown tool",
                unknown,
                StepStatus::Failed,
                Some(Outcome::UnknownTool),
                EventType::ToolResult,
                Next::Settled,
            ),
            (
                "invalid arguments",
                call(CallGate::Refuse {
                    message: "invalid arguments for tool 'lookup': /q: required".into(),
                    reason: "invalid_arguments",
                    outcome: Outcome::InvalidArguments,
                }),
                StepStatus::Failed,
                Some(Outcome::InvalidArguments),
                EventType::ToolResult,
                Next::Settled,
            ),
            (
                "denied",
                call(CallGate::Deny {
                    message: "lookup not allowed. reason: no".into(),
                    decided_by: "rule:no".into(),
                }),
                StepStatus::Failed,
                Some(Outcome::Denied),
                EventType::ToolDenied,
                Next::Settled,
            ),
            (
                "gated",
                call(CallGate::Approve(gate)),
                StepStatus::AwaitingApproval,
                None,
                EventType::ToolScheduled,
                Next::Gated,
            ),
        ];
        for (name, call, status, outcome, kind, next) in cases {
            let mut run = run();
            let decision = decide(&run, &call, &["lookup".into()]);
            let recorded = record(&mut run, (0, 30_000, None, None), &call, decision, None, NOW);
            assert_eq!(recorded.step.status, status, "{name}");
            assert_eq!(recorded.step.outcome, outcome, "{name}");
            assert_eq!(recorded.event.kind, kind, "{name}");
            assert_eq!(recorded.next, next, "{name}");
            assert_eq!(run.tool_calls, 1, "{name}: every call counts");
            assert_eq!(recorded.step.timeout_ms, 30_000, "{name}: the default timeout");
            assert_eq!(recorded.step.attempts, 0);
            if let Some(outcome) = outcome {
                assert_eq!(recorded.event.payload["outcome"], outcome.as_str(), "{name}");
                assert_eq!(recorded.step.finished_at, Some(NOW), "{name}");
            }
        }
    }

    #[test]
    fn a_call_over_the_limit_does_not_run_and_does_not_count() {
        let mut full = run();
        full.max_tool_calls = 1;
        full.tool_calls = 1;
        let decision = decide(&full, &allowed(), &[]);
        let recorded = record(&mut full, (0, 30_000, None, None), &allowed(), decision, None, NOW);
        assert_eq!(recorded.step.outcome, Some(Outcome::LimitExceeded));
        assert!(
            recorded
                .step
                .error
                .as_deref()
                .unwrap()
                .starts_with("max_tool_calls reached")
        );
        assert_eq!(full.tool_calls, 1);
    }

    #[test]
    fn only_an_ungated_call_of_a_read_only_tool_with_a_ttl_is_served_from_the_cache() {
        let cached_tool = |read_only| {
            tool(ToolOptions {
                read_only,
                cache_ttl_ms: Some(60_000),
                ..Default::default()
            })
        };
        let mut reader = allowed();
        reader.tool = Some(cached_tool(true));
        let mut writer = allowed();
        writer.tool = Some(cached_tool(false));
        let mut gated_reader = call(CallGate::Approve(ApprovalGate::default()));
        gated_reader.tool = Some(cached_tool(true));
        assert!(decide(&run(), &reader, &[]).may_use_cache());
        assert!(!decide(&run(), &writer, &[]).may_use_cache());
        assert!(!decide(&run(), &gated_reader, &[]).may_use_cache());
        assert!(!decide(&run(), &allowed(), &[]).may_use_cache());

        let mut run = run();
        let decision = decide(&run, &reader, &[]);
        let hit = record(
            &mut run,
            (0, 30_000, None, None),
            &reader,
            decision,
            Some("42".into()),
            NOW,
        );
        assert_eq!(hit.step.status, StepStatus::Succeeded);
        assert_eq!(hit.step.output.as_deref(), Some("42"));
        assert_eq!(hit.next, Next::Settled);
        assert_eq!(hit.event.payload["cache"], "hit");
        assert_eq!(hit.event.payload["output"], 42);
    }

    #[test]
    fn unknown_tool_message_cuts_the_name_and_lists_at_most_twenty() {
        let available: Vec<String> = (0..25).map(|i| format!("t{i:02}")).collect();
        let message = unknown_tool_message(&"x".repeat(100), &available);
        assert!(message.starts_with(&format!("unknown tool '{}';", "x".repeat(64))));
        assert!(message.contains("t19"));
        assert!(!message.contains("t20,"));
        assert!(message.ends_with("(and 5 more)"));
        assert_eq!(
            unknown_tool_message("x", &["a".into(), "b".into()]),
            "unknown tool 'x'; available: a, b"
        );
    }

    #[test]
    fn a_call_id_another_turn_holds_in_flight_as_something_else_is_refused() {
        let mut named = allowed();
        named.call_id = Some("order-9".into());
        named.key = StepKey::for_call(1, 0, Some("order-9"));
        let mut turn = plan(vec![named]);
        turn.turn = 1;
        let mut in_flight = step();
        in_flight.key = StepKey::for_call(0, 0, Some("order-9"));
        in_flight.call_id = Some("order-9".into());
        in_flight.status = StepStatus::Running;
        in_flight.call_hash = "other".into();
        let refused = admit(&run(), &turn, &[Some(in_flight.clone())], Some(1), NOW).unwrap_err();
        assert!(matches!(refused, KernelError::AlreadyExists(_)), "{refused}");
        let message = refused.to_string();
        assert!(
            message.contains("'order-9'") && message.contains("'charge' of turn 0"),
            "{message}"
        );
        // The same call again joins; a settled one is a replay or a divergence, not this refusal.
        let mut same = in_flight.clone();
        same.call_hash = "h".into();
        assert!(admit(&run(), &turn, &[Some(same)], Some(1), NOW).is_ok());
        let mut settled = in_flight;
        settled.status = StepStatus::Succeeded;
        assert!(admit(&run(), &turn, &[Some(settled)], Some(1), NOW).is_ok());
    }

    /// Checked in the write with the run it reads there: a non-interactive run neither takes a new
    /// call to a tool that always asks a person nor lets the model be offered one; an interactive
    /// run does both, and a call recorded before is not refused again.
    #[test]
    fn a_non_interactive_run_takes_no_call_that_must_ask_a_person() {
        let mut asks = allowed();
        asks.tool = Some(tool(ToolOptions {
            requires_approval: true,
            ..ToolOptions::default()
        }));
        let mut batch = run();
        batch.interactive = false;
        let refused = admit(&batch, &plan(vec![asks.clone()]), &[None], Some(0), NOW).unwrap_err();
        assert!(matches!(refused, KernelError::FailedPrecondition(_)), "{refused}");
        assert!(refused.to_string().starts_with("calls[0]: run "), "{refused}");
        assert!(admit(&run(), &plan(vec![asks.clone()]), &[None], Some(0), NOW).is_ok());
        assert!(admit(&batch, &plan(vec![asks]), &[Some(step())], Some(0), NOW).is_ok());
        let mut offering = plan(vec![allowed()]);
        offering.offers_approval_tool = Some((2, "refund".into()));
        let refused = admit(&batch, &offering, &[None], Some(0), NOW).unwrap_err();
        assert!(refused.to_string().starts_with("offered_tools[2]: "), "{refused}");
        assert!(admit(&run(), &offering, &[None], Some(0), NOW).is_ok());
    }
}
