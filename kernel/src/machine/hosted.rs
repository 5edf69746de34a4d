//! Hosted runs: a run whose handler a worker hosts. The run's own dispatch is a step of kind
//! `agent`, queued, leased and fenced exactly like a call, so every rule of [`super::dispatch`]
//! holds for it (one attempt number each, fenced messages, a lost lease redispatches). What is
//! particular to it is here:
//!
//! - [`dispatch_step`]: a hosted run is created with its dispatch pending.
//! - [`check_fence`]: every operation of the handler names the dispatch it runs under; only the
//!   attempt that holds the run's dispatch may record anything, and a hosted run takes no turn
//!   from outside its handler.
//! - [`place`]: each operation has a place in the handler's order (its `seq`; a tool turn's
//!   number is its place). An operation that reaches a place recorded with another identity is a
//!   divergence: `replay_input_changed`, nothing recorded.
//! - [`record_local`]: a finished local step is recorded with its one `step:result` before the
//!   handler sees its outcome; a step recorded before keeps its first outcome.
//! - [`finish`]: the handler's return value settles the dispatch and ends the run (an error fails
//!   it), cancelling what the handler left in flight.

use super::dispatch::{held, settle};
use super::events::{
    self, AgentResumed, AgentSuspended, ChildEnd, LocalStepResult, Next, Payload, Resumed, SessionWait, SettledBy,
    SettledStatus, StepResult, Suspended, ToolResumed, ToolSuspended,
};
use super::run::{self, EndRun, RunEnd};
use super::{NewEvent, StepChange, json_or_string};
use crate::error::KernelError;
use crate::model::{
    ApprovalRecord, DispatchId, Effect, ErrorKind, Idempotency, Millis, Outcome, RunRecord, RunStatus, StepKey,
    StepKind, StepRecord, StepStatus,
};

/// The agent a worker offers, as a hosted run records it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostedAgent {
    pub name: String,
    pub fingerprint: String,
    pub version: String,
}

/// The dispatch of a hosted run an operation of its handler claims to run under.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Fence {
    pub dispatch_id: DispatchId,
    pub attempt: u32,
}

/// The pending dispatch of a new hosted run: its handler, to run on a worker offering `agent`
/// with the run's input. It never times out (a handler may wait on people for days) and is
/// dispatched again whenever its worker is lost, since the handler replays what it recorded.
pub fn dispatch_step(run: &RunRecord, agent: &HostedAgent, now: Millis) -> StepRecord {
    let key = StepKey::agent();
    StepRecord {
        run_id: run.id.clone(),
        idempotency_key: key.idempotency_key(&run.id),
        key,
        kind: StepKind::Agent,
        effect: None,
        sealed: None,
        max_concurrency: None,
        hosted: run.hosted,
        turn: 0,
        position: 0,
        call_id: None,
        tool: agent.name.clone(),
        fingerprint: agent.fingerprint.clone(),
        version: agent.version.clone(),
        arguments: run.input.clone(),
        call_hash: String::new(),
        idempotency: Idempotency::SafeToRetry,
        timeout_ms: 0,
        status: StepStatus::Pending,
        attempts: 0,
        output: None,
        error: None,
        error_kind: None,
        worker: None,
        session_id: None,
        replica: None,
        dispatch_id: None,
        lease_expires_at: None,
        created_at: now,
        started_at: None,
        finished_at: None,
        replays: 0,
        progress_count: 0,
        retry: None,
        blocking: false,
        not_before: None,
        lease_losses: 0,
        unit_cost: 0.0,
        cost: 0.0,
        decided_by: None,
        approval_gate: None,
        cache_ttl_ms: None,
        outcome: None,
        approval: None,
        resources: Vec::new(),
        from_run: None,
        limited_by: Vec::new(),
        limit_wait_ms: 0,
        share: None,
        trace: run.trace,
    }
}

/// Refuses an operation on `run` unless it comes from the attempt that holds the run's dispatch
/// (`dispatch`, the run's agent step): a handler superseded by a redispatch, cancelled or
/// finished records nothing; a hosted run's turns come only from its handler, and a run driven
/// by its caller takes no fenced operation.
pub fn check_fence(run: &RunRecord, dispatch: Option<&StepRecord>, fence: Option<&Fence>) -> Result<(), KernelError> {
    match (run.hosted, fence) {
        (false, None) => Ok(()),
        (false, Some(_)) => Err(KernelError::FailedPrecondition(format!(
            "run {} is not hosted; its caller drives it with ToolCallService.SubmitTurn",
            run.id
        ))),
        (true, None) => Err(KernelError::FailedPrecondition(format!(
            "run {} is hosted by agent '{}': only its handler calls tools for it (HostedService), not SubmitTurn",
            run.id, run.agent
        ))),
        (true, Some(fence)) => {
            if run.status.is_terminal() {
                return Err(KernelError::FailedPrecondition(format!(
                    "run {} is {}; it accepts nothing more",
                    run.id, run.status
                )));
            }
            match dispatch {
                Some(step) if held(step, &fence.dispatch_id, fence.attempt, None) => Ok(()),
                _ => Err(KernelError::FailedPrecondition(format!(
                    "dispatch {} attempt {} no longer holds run {} (superseded by a redispatch, cancelled or \
                     finished); nothing was recorded",
                    fence.dispatch_id, fence.attempt, run.id
                ))),
            }
        }
    }
}

/// What the handler's order holds at one place.
#[derive(Clone, Debug, PartialEq)]
pub enum Place {
    /// Nothing recorded there yet: the operation runs live.
    Open,
    /// The same operation was recorded there: its recorded steps.
    Recorded(Vec<StepRecord>),
}

/// Checks an operation reaching place `seq` with identities `keys` against what is recorded
/// there (`at_place`, the run's steps with that place) and at those identities elsewhere
/// (`elsewhere`): the same identities replay or join, new ones at an open place run live, and
/// anything else is a divergence whose message names the place and what changed.
pub fn place(seq: u32, keys: &[StepKey], at_place: &[StepRecord], elsewhere: &[StepRecord]) -> Result<Place, String> {
    if let Some(step) = elsewhere.iter().find(|s| s.turn != seq) {
        return Err(format!(
            "replay_input_changed: step {} was recorded at place {} of the handler's order, now it comes at place {seq}",
            step.key, step.turn
        ));
    }
    if at_place.is_empty() {
        return Ok(Place::Open);
    }
    let mut recorded: Vec<&StepKey> = at_place.iter().map(|s| &s.key).collect();
    recorded.sort();
    let mut now: Vec<&StepKey> = keys.iter().collect();
    now.sort();
    if recorded != now {
        let was: Vec<&str> = recorded.iter().map(|k| k.as_str()).collect();
        let is: Vec<&str> = now.iter().map(|k| k.as_str()).collect();
        return Err(format!(
            "replay_input_changed: place {seq} of the handler's order was recorded as {}, now it is {}",
            was.join(", "),
            is.join(", ")
        ));
    }
    Ok(Place::Recorded(at_place.to_vec()))
}

/// Whether a subagent a handler starts again at a recorded place is the one recorded there:
/// another input is a divergence, as another call's arguments are.
pub fn same_child(recorded: &StepRecord, child: &super::run::NewRun) -> Result<(), String> {
    if recorded.arguments == child.input {
        return Ok(());
    }
    Err(format!(
        "replay_input_changed: the input of subagent step {} ('{}') differs from the recorded one",
        recorded.key, child.agent
    ))
}

/// How a run whose handler diverged from its record ends: failed with the divergence, in the write
/// that found it, whatever the handler does next (a handler that caught the error and returns an
/// output completes nothing; its dispatch is cancelled with the run).
pub fn diverged(message: &str) -> EndRun {
    EndRun::Fail {
        reason: message.to_owned(),
    }
}

/// A finished local step of a handler, to record.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LocalStep {
    pub seq: u32,
    pub step_id: String,
    pub occurrence: u32,
    pub effect: Effect,
    pub once: bool,
    /// Canonical JSON text, or the step's error.
    pub outcome: Result<String, String>,
    /// The policy's word on the step (`None` without a policy file); a denied step never ran.
    pub decided_by: Option<String>,
    pub denied: bool,
    /// Refused by a branch's rule before it ran (`write_tool_blocked`).
    pub blocked: bool,
}

/// Records a finished local step of `run`'s handler: one step, terminal at once, with its one
/// `step:result`.
pub fn record_local(run: &RunRecord, local: &LocalStep, now: Millis) -> StepChange {
    let key = StepKey::local(&local.step_id, local.occurrence);
    let (status, outcome, output, error) = match &local.outcome {
        Ok(output) => (StepStatus::Succeeded, Outcome::Ok, Some(output.clone()), None),
        Err(message) if local.denied => (StepStatus::Failed, Outcome::Denied, None, Some(message.clone())),
        Err(message) if local.blocked => (
            StepStatus::Failed,
            Outcome::WriteToolBlocked,
            None,
            Some(message.clone()),
        ),
        Err(message) => (StepStatus::Failed, Outcome::ToolError, None, Some(message.clone())),
    };
    let mut step = dispatch_step(
        run,
        &HostedAgent {
            name: local.step_id.clone(),
            fingerprint: String::new(),
            version: String::new(),
        },
        now,
    );
    step.idempotency_key = key.idempotency_key(&run.id);
    step.key = key;
    step.kind = StepKind::Local;
    step.effect = Some(local.effect);
    step.turn = local.seq;
    step.position = local.occurrence;
    step.arguments = "null".into();
    step.status = status;
    step.attempts = 1;
    step.output = output;
    step.error = error.clone();
    step.error_kind = error.as_ref().map(|_| ErrorKind::Fatal);
    step.started_at = Some(now);
    step.finished_at = Some(now);
    step.outcome = Some(outcome);
    step.decided_by = local
        .decided_by
        .clone()
        .or_else(|| Some(if local.once { "ctx.once" } else { "ctx.step" }.to_owned()));
    let event = StepResult::Local(LocalStepResult {
        step_key: step.key.to_string(),
        seq: local.seq,
        step_id: local.step_id.clone(),
        occurrence: local.occurrence,
        effect: local.effect,
        once: local.once,
        status: if error.is_none() {
            SettledStatus::Ok
        } else {
            SettledStatus::Error
        },
        outcome,
        decided_by: step.decided_by.clone().unwrap_or_default(),
        idempotency_key: step.idempotency_key.clone(),
        output: local.outcome.as_ref().ok().map(|output| json_or_string(output)),
        error: local.outcome.as_ref().err().cloned(),
    })
    .event();
    StepChange { step, event }
}

/// What the run's dispatch starting on a worker does to the run: a pending run starts, a
/// suspended one runs again, and the dispatch is counted.
pub fn dispatched(run: &RunRecord, now: Millis) -> (RunRecord, Option<NewEvent>) {
    let mut running = run.clone();
    running.dispatches += 1;
    running.updated_at = now;
    let event = match run.status {
        RunStatus::Pending => Some(
            events::RunStarted {
                turn: None,
                hosted: Some(true),
            }
            .event(),
        ),
        _ => None,
    };
    if matches!(run.status, RunStatus::Pending | RunStatus::Suspended) {
        running.status = RunStatus::Running;
    }
    (running, event)
}

/// Ends a hosted run with its handler's outcome: the dispatch settles with its one
/// `agent:result`, then the run ends (an output completes it, an error fails it) after the calls
/// the handler left in flight are cancelled and open questions withdrawn.
pub fn finish(
    run: &RunRecord,
    dispatch: &StepRecord,
    outcome: Result<&str, (ErrorKind, &str)>,
    in_flight: &[StepRecord],
    open: &[ApprovalRecord],
    now: Millis,
) -> Result<(StepChange, RunEnd), KernelError> {
    let (status, why) = match outcome {
        Ok(_) => (StepStatus::Succeeded, Outcome::Ok),
        Err(_) => (StepStatus::Failed, Outcome::ToolError),
    };
    let settled = settle(dispatch, (status, why), outcome, 0, SettledBy::default(), now);
    let end = match outcome {
        Ok(output) => EndRun::Complete {
            output: output.to_owned(),
            settle_in_flight: true,
        },
        Err((_, message)) => EndRun::Fail {
            reason: message.to_owned(),
        },
    };
    let others: Vec<StepRecord> = in_flight.iter().filter(|s| s.key != dispatch.key).cloned().collect();
    let ended = run::end(run, &others, open, &end, now)?;
    Ok((settled, ended))
}

/// The subagent step a handler records at place `seq` when it starts child run `child` of
/// `agent`: running until the child ends.
pub fn subagent_step(run: &RunRecord, (seq, key): (u32, StepKey), child: &RunRecord, now: Millis) -> StepChange {
    let mut step = dispatch_step(
        run,
        &HostedAgent {
            name: child.agent.clone(),
            fingerprint: String::new(),
            version: String::new(),
        },
        now,
    );
    step.idempotency_key = key.idempotency_key(&run.id);
    step.key = key;
    step.kind = StepKind::Subagent;
    step.turn = seq;
    step.arguments = child.input.clone();
    step.call_id = Some(child.id.to_string());
    step.status = StepStatus::Running;
    step.attempts = 1;
    step.started_at = Some(now);
    let event = events::SubagentStart {
        step_key: step.key.to_string(),
        seq,
        agent: child.agent.clone(),
        child_run_id: child.id.to_string(),
        session_key: child.session_key.clone(),
        input: json_or_string(&child.input),
    }
    .event();
    StepChange { step, event }
}

/// What a child run's end does to its parent's step waiting for it: a completed child settles it
/// with the child's output, a failed or cancelled one with an error the parent's handler sees.
/// `None` when the step settled already (the parent ended first).
pub fn child_ended(step: &StepRecord, child: &RunRecord, now: Millis) -> Option<StepChange> {
    if step.status.is_terminal() {
        return None;
    }
    let extra = SettledBy {
        child: Some(ChildEnd {
            child_run_id: child.id.to_string(),
            child_status: child.status,
        }),
        ..SettledBy::default()
    };
    Some(match (child.status, &child.output) {
        (RunStatus::Completed, Some(output)) => {
            settle(step, (StepStatus::Succeeded, Outcome::Ok), Ok(output), 0, extra, now)
        }
        (status, _) => {
            let message = format!(
                "subagent '{}' (run {}) {}: {}",
                child.agent,
                child.id,
                status,
                child.reason.as_deref().unwrap_or("")
            );
            let (settled, why) = if status == RunStatus::Cancelled {
                (StepStatus::Cancelled, Outcome::Cancelled)
            } else {
                (StepStatus::Failed, Outcome::ToolError)
            };
            settle(step, (settled, why), Err((ErrorKind::Fatal, &message)), 0, extra, now)
        }
    })
}

/// What a handler (or a tool body waiting on its subagents) giving back its slot does: its
/// dispatch waits, suspended, for one of `waiting_on` (each step it names, with what the store
/// holds under that key) to settle. A handler's run is suspended with it; a tool call's run is not
/// (its handler, if any, waits on the call).
///
/// Refused, changing nothing (the dispatch, its lease and its slot stay the handler's), unless the
/// suspension names at least one step and each is a step this dispatch may await
/// ([`may_await`]) that has not settled: a named step that settled crossed the suspension on the
/// way, and its result reaches the handler as it goes on waiting, so nothing is left to wake it
/// for; an unknown one could never wake it. An `at_most_once` call may not suspend at all, since a
/// suspended dispatch runs again.
pub fn suspend(
    run: &RunRecord,
    dispatch: &StepRecord,
    waiting_on: &[(StepKey, Option<StepRecord>)],
    now: Millis,
) -> Result<(StepChange, RunRecord), KernelError> {
    if dispatch.kind == StepKind::Tool && dispatch.idempotency == Idempotency::AtMostOnce {
        return Err(KernelError::FailedPrecondition(format!(
            "dispatch {} runs an at_most_once call, which may not run again: it cannot give back its slot; nothing \
             was recorded, the call keeps its lease",
            dispatch
                .dispatch_id
                .as_ref()
                .map(DispatchId::as_str)
                .unwrap_or_default()
        )));
    }
    let names: Vec<String> = waiting_on.iter().map(|(key, _)| key.as_str().to_owned()).collect();
    check_suspension(&names).map_err(KernelError::FailedPrecondition)?;
    for (key, found) in waiting_on {
        match found {
            Some(step) if !may_await(dispatch, step) => {
                return Err(KernelError::FailedPrecondition(format!(
                    "suspended.waiting_on: {key} is a {} step this dispatch does not await; nothing was recorded, the \
                     dispatch stays the handler's",
                    step.kind
                )));
            }
            Some(step) if step.status.is_terminal() => {
                return Err(KernelError::FailedPrecondition(format!(
                    "suspended.waiting_on: {key} has settled ({}); its result reaches the handler as it waits; \
                     nothing was recorded, the dispatch stays the handler's",
                    step.status
                )));
            }
            Some(_) => {}
            None => {
                return Err(KernelError::FailedPrecondition(format!(
                    "suspended.waiting_on: {key} is not a step of run {}; nothing was recorded, the dispatch stays \
                     the handler's",
                    run.id
                )));
            }
        }
    }
    let handler = dispatch.kind == StepKind::Agent;
    let mut waiting = dispatch.clone();
    waiting.lease_expires_at = None;
    waiting.status = StepStatus::Suspended;
    let mut run = run.clone();
    if handler {
        run.status = RunStatus::Suspended;
        run.suspensions += 1;
        run.updated_at = now;
    }
    let payload = Suspended {
        step_key: dispatch.key.to_string(),
        attempt: dispatch.attempts,
        dispatch_id: dispatch.dispatch_id.clone(),
        worker: dispatch.worker.clone(),
        waiting_on: names,
        next: Next::Wait,
    };
    let event = if handler {
        AgentSuspended::Steps(payload).event()
    } else {
        ToolSuspended(payload).event()
    };
    Ok((StepChange { step: waiting, event }, run))
}

/// Whether `dispatch` may wait on `step`: only a step whose settle wakes it ([`wakes`]): a handler
/// on its run's tool calls and subagents, a tool call's body on the subagents it started.
pub fn may_await(dispatch: &StepRecord, step: &StepRecord) -> bool {
    step.run_id == dispatch.run_id && wakes(step).any(|key| key == dispatch.key)
}

/// A new run of session `session` whose earlier run has not ended waits for it before its first
/// dispatch: the dispatch is suspended, and the log says what it waits for. The earlier run's end
/// wakes it ([`resume`]).
pub fn wait_for_session(dispatch: &StepRecord, session: &str) -> StepChange {
    let mut waiting = dispatch.clone();
    waiting.status = StepStatus::Suspended;
    StepChange {
        event: AgentSuspended::Session(SessionWait {
            step_key: dispatch.key.to_string(),
            attempt: dispatch.attempts,
            waiting_on: Vec::new(),
            session: session.to_owned(),
            next: Next::Wait,
        })
        .event(),
        step: waiting,
    }
}

/// The dispatches a settle of `step` wakes, if they are suspended: the tool call whose body
/// started it (a subagent of a call) or asked it (a question), and its hosted run's handler.
pub fn wakes(step: &StepRecord) -> impl Iterator<Item = StepKey> {
    let awaited = matches!(step.kind, StepKind::Tool | StepKind::Subagent | StepKind::Question);
    let call = step.key.waiter().filter(|_| awaited);
    // A handler's own question names the handler as its asker already.
    let handler = (awaited && step.hosted && call != Some(StepKey::agent())).then(StepKey::agent);
    call.into_iter().chain(handler)
}

/// A suspension names what it waits on: one naming nothing could never be woken, so it is refused,
/// before anything is written, and the dispatch stays the handler's. `Err` says why.
pub fn check_suspension(waiting_on: &[String]) -> Result<(), String> {
    if waiting_on.is_empty() {
        return Err("suspended.waiting_on: a suspension names the steps it waits on; nothing was recorded".to_owned());
    }
    Ok(())
}

/// Wakes a suspended dispatch because `because` settled (a step it may await) or its session's
/// run before it ended; `None` when it is not suspended.
pub fn resume(dispatch: &StepRecord, because: &str) -> Option<StepChange> {
    (dispatch.status == StepStatus::Suspended).then(|| {
        let mut pending = dispatch.clone();
        pending.status = StepStatus::Pending;
        StepChange {
            event: {
                let payload = Resumed {
                    step_key: dispatch.key.to_string(),
                    because: because.to_owned(),
                };
                if dispatch.kind == StepKind::Agent {
                    AgentResumed(payload).event()
                } else {
                    ToolResumed(payload).event()
                }
            },
            step: pending,
        }
    })
}

/// A hosted run whose handler was woken is no longer suspended: it runs (its handler waits for a
/// worker slot). `None` when the run was not suspended.
pub fn woken(run: &RunRecord, now: Millis) -> Option<RunRecord> {
    (run.status == RunStatus::Suspended).then(|| {
        let mut running = run.clone();
        running.status = RunStatus::Running;
        running.updated_at = now;
        running
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::dispatch::{StartDispatch, start};
    use crate::machine::records::{NOW, run, step};
    use crate::model::EventType;

    fn hosted_run() -> RunRecord {
        let mut run = run();
        run.hosted = true;
        run.status = RunStatus::Pending;
        run
    }

    fn agent() -> HostedAgent {
        HostedAgent {
            name: "researcher".into(),
            fingerprint: "fp".into(),
            version: "1".into(),
        }
    }

    fn started(run: &RunRecord, dispatch_id: &str, attempt: u32) -> StepRecord {
        let mut pending = dispatch_step(run, &agent(), NOW);
        pending.attempts = attempt - 1;
        let slot = StartDispatch {
            run_id: run.id.clone(),
            key: StepKey::agent(),
            dispatch_id: dispatch_id.into(),
            attempt,
            worker: "w".into(),
            session_id: "s".into(),
            lease_expires_at: NOW + 10_000,
            replica: None,
            limits: Vec::new(),
            limit_wait_ms: 0,
        };
        start(&pending, &slot, NOW).expect("a pending dispatch starts").step
    }

    #[test]
    fn a_hosted_run_dispatch_is_leased_like_a_call_and_its_events_say_agent() {
        let run = hosted_run();
        let pending = dispatch_step(&run, &agent(), NOW);
        assert_eq!(
            (pending.kind, pending.status, pending.timeout_ms),
            (StepKind::Agent, StepStatus::Pending, 0)
        );
        let slot = StartDispatch {
            run_id: run.id.clone(),
            key: StepKey::agent(),
            dispatch_id: "d1".into(),
            attempt: 1,
            worker: "w".into(),
            session_id: "s".into(),
            lease_expires_at: NOW + 10_000,
            replica: None,
            limits: Vec::new(),
            limit_wait_ms: 0,
        };
        let change = start(&pending, &slot, NOW).unwrap();
        assert_eq!(change.event.kind, EventType::AgentDispatched);
        let (running, event) = dispatched(&run, NOW);
        assert_eq!((running.status, running.dispatches), (RunStatus::Running, 1));
        assert_eq!(event.unwrap().kind, EventType::RunStarted);
        let mut suspended = running.clone();
        suspended.status = RunStatus::Suspended;
        let (again, event) = dispatched(&suspended, NOW);
        assert_eq!((again.status, again.dispatches, event), (RunStatus::Running, 2, None));
    }

    #[test]
    fn only_the_attempt_holding_the_dispatch_passes_the_fence() {
        let mut run = hosted_run();
        run.status = RunStatus::Running;
        let holding = started(&run, "d2", 2);
        let fence = |id: &str, attempt| Fence {
            dispatch_id: id.into(),
            attempt,
        };
        assert!(check_fence(&run, Some(&holding), Some(&fence("d2", 2))).is_ok());
        for (id, attempt) in [("d2", 1), ("d1", 2), ("other", 3)] {
            let refused = check_fence(&run, Some(&holding), Some(&fence(id, attempt))).unwrap_err();
            assert!(refused.to_string().contains("no longer holds"), "{refused}");
        }
        let outside = check_fence(&run, Some(&holding), None).unwrap_err();
        assert!(outside.to_string().contains("only its handler"), "{outside}");
        let external = crate::machine::records::run();
        assert!(check_fence(&external, None, None).is_ok());
        assert!(check_fence(&external, None, Some(&fence("d2", 2))).is_err());
        let mut ended = run.clone();
        ended.status = RunStatus::Cancelled;
        assert!(check_fence(&ended, Some(&holding), Some(&fence("d2", 2))).is_err());
    }

    fn local(seq: u32, id: &str, occurrence: u32) -> StepRecord {
        let local = LocalStep {
            seq,
            step_id: id.into(),
            occurrence,
            effect: Effect::Write,
            once: false,
            outcome: Ok("1".into()),
            decided_by: None,
            denied: false,
            blocked: false,
        };
        record_local(&hosted_run(), &local, NOW).step
    }

    #[test]
    fn a_place_replays_the_same_identity_and_diverges_on_another() {
        let fetched = local(3, "fetch", 0);
        assert_eq!(place(4, &[StepKey::local("fetch", 1)], &[], &[]), Ok(Place::Open));
        assert_eq!(
            place(
                3,
                std::slice::from_ref(&fetched.key),
                std::slice::from_ref(&fetched),
                std::slice::from_ref(&fetched)
            ),
            Ok(Place::Recorded(vec![fetched.clone()]))
        );
        let other = place(3, &[StepKey::local("pay", 0)], std::slice::from_ref(&fetched), &[]).unwrap_err();
        assert!(
            other.contains("place 3") && other.contains("step:fetch#0") && other.contains("step:pay#0"),
            "{other}"
        );
        let moved = place(
            5,
            std::slice::from_ref(&fetched.key),
            &[],
            std::slice::from_ref(&fetched),
        )
        .unwrap_err();
        assert!(moved.contains("place 3") && moved.contains("place 5"), "{moved}");
        let mut call = step();
        call.turn = 3;
        let turn = place(
            3,
            &[StepKey::for_call(3, 0, None), StepKey::for_call(3, 1, None)],
            &[call],
            &[],
        )
        .unwrap_err();
        assert!(turn.contains("t0/p0"), "{turn}");
    }

    #[test]
    fn a_local_step_is_recorded_settled_with_its_one_event() {
        let change = record_local(
            &hosted_run(),
            &LocalStep {
                seq: 2,
                step_id: "model".into(),
                occurrence: 0,
                effect: Effect::Write,
                once: true,
                outcome: Err("boom".into()),
                decided_by: None,
                denied: false,
                blocked: false,
            },
            NOW,
        );
        assert_eq!(change.event.kind, EventType::StepResult);
        assert_eq!(change.step.kind, StepKind::Local);
        assert_eq!(
            (change.step.status, change.step.outcome),
            (StepStatus::Failed, Some(Outcome::ToolError))
        );
        assert_eq!(change.event.payload["once"], true);
        assert_eq!(
            change.step.idempotency_key,
            StepKey::local("model", 0).idempotency_key(&hosted_run().id)
        );
    }

    fn child(status: RunStatus) -> RunRecord {
        let mut child = hosted_run();
        child.id = crate::model::RunId::new();
        child.agent = "researcher".into();
        child.status = status;
        child.output = (status == RunStatus::Completed).then(|| "\"found\"".to_owned());
        child.reason = (status != RunStatus::Completed).then(|| "gave up".to_owned());
        child
    }

    #[test]
    fn a_subagent_step_settles_with_its_child_s_end_once() {
        let mut run = hosted_run();
        run.status = RunStatus::Running;
        let started = subagent_step(
            &run,
            (4, StepKey::subagent("researcher", 0)),
            &child(RunStatus::Pending),
            NOW,
        );
        assert_eq!(started.event.kind, EventType::SubagentStart);
        assert_eq!(
            (started.step.kind, started.step.status, started.step.turn),
            (StepKind::Subagent, StepStatus::Running, 4)
        );
        let done = child_ended(&started.step, &child(RunStatus::Completed), NOW).unwrap();
        assert_eq!(done.event.kind, EventType::SubagentResult);
        assert_eq!(
            (done.step.status, done.step.output.as_deref()),
            (StepStatus::Succeeded, Some("\"found\""))
        );
        assert!(
            child_ended(&done.step, &child(RunStatus::Failed), NOW).is_none(),
            "settles once"
        );
        let failed = child_ended(&started.step, &child(RunStatus::Failed), NOW).unwrap();
        assert!(
            failed.step.error.as_deref().unwrap().contains("failed: gave up"),
            "{:?}",
            failed.step.error
        );
        let cancelled = child_ended(&started.step, &child(RunStatus::Cancelled), NOW).unwrap();
        assert_eq!(cancelled.step.status, StepStatus::Cancelled);
    }

    #[test]
    fn a_suspension_names_what_it_waits_on() {
        let refused = check_suspension(&[]).unwrap_err();
        assert!(refused.starts_with("suspended.waiting_on: "), "{refused}");
        assert!(check_suspension(&["subagent:researcher#0".to_owned()]).is_ok());
    }

    fn after_suspension(run: &RunRecord, dispatch: &StepRecord) -> RunRecord {
        let waiting = subagent_step(
            run,
            (1, StepKey::subagent("researcher", 0)),
            &child(RunStatus::Pending),
            NOW,
        )
        .step;
        suspend(run, dispatch, &[(waiting.key.clone(), Some(waiting))], NOW)
            .expect("an unsettled subagent may be waited on")
            .1
    }

    /// A running handler of a running hosted run, and a subagent it waits on.
    fn handler_waiting_on_a_child() -> (RunRecord, StepRecord, StepRecord) {
        let mut run = hosted_run();
        run.status = RunStatus::Running;
        let dispatch = started(&run, "d1", 1);
        let waiting = subagent_step(
            &run,
            (1, StepKey::subagent("researcher", 0)),
            &child(RunStatus::Pending),
            NOW,
        )
        .step;
        (run, dispatch, waiting)
    }

    fn named(step: &StepRecord) -> (StepKey, Option<StepRecord>) {
        (step.key.clone(), Some(step.clone()))
    }

    fn refusal(result: Result<(StepChange, RunRecord), KernelError>) -> String {
        match result {
            Ok((change, _)) => panic!("accepted: {:?}", change.step.status),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_suspension_naming_unsettled_steps_it_awaits_suspends_the_dispatch_and_the_run() {
        let (run, dispatch, waiting) = handler_waiting_on_a_child();
        let mut call = step();
        call.run_id = run.id.clone();
        call.hosted = true;
        call.key = StepKey::for_call(2, 0, None);
        call.status = StepStatus::AwaitingApproval;
        let (suspended, after) = suspend(&run, &dispatch, &[named(&waiting), named(&call)], NOW).unwrap();
        assert_eq!(suspended.step.status, StepStatus::Suspended);
        assert_eq!(suspended.step.lease_expires_at, None);
        assert_eq!(suspended.event.kind, EventType::AgentSuspended);
        assert_eq!(
            suspended.event.payload["waiting_on"],
            serde_json::json!(["subagent:researcher#0", "t2/p0"])
        );
        assert_eq!(suspended.event.payload["next"], "wait");
        assert_eq!((after.status, after.suspensions), (RunStatus::Suspended, 1));
    }

    #[test]
    fn a_suspension_naming_nothing_is_refused() {
        let (run, dispatch, _) = handler_waiting_on_a_child();
        let refused = refusal(suspend(&run, &dispatch, &[], NOW));
        assert!(refused.starts_with("suspended.waiting_on: "), "{refused}");
    }

    #[test]
    fn a_suspension_naming_an_unknown_step_is_refused() {
        let (run, dispatch, waiting) = handler_waiting_on_a_child();
        let unknown = (StepKey::for_call(9, 0, None), None);
        let refused = refusal(suspend(&run, &dispatch, &[unknown], NOW));
        assert!(refused.contains("t9/p0 is not a step of run"), "{refused}");
        // Steps of the run whose settle does not wake the handler: a local step, its own dispatch.
        for named_step in [local(2, "fetch", 0), dispatch.clone()] {
            let refused = refusal(suspend(&run, &dispatch, &[named(&named_step)], NOW));
            assert!(refused.contains("does not await"), "{}: {refused}", named_step.key);
        }
        // A call's subagent wakes the handler too when it settles ([`wakes`]), so it may be waited on.
        let mut other_call_child = waiting.clone();
        other_call_child.key = StepKey::tool_subagent(&StepKey::for_call(0, 0, None), "researcher", 0);
        assert!(suspend(&run, &dispatch, &[named(&other_call_child)], NOW).is_ok());
        // A tool body awaits only the subagents it started.
        let mut call = step();
        call.run_id = run.id.clone();
        call.status = StepStatus::Running;
        let mut its_child = waiting.clone();
        its_child.key = StepKey::tool_subagent(&call.key, "researcher", 0);
        assert!(suspend(&run, &call, &[named(&its_child)], NOW).is_ok());
        let refused = refusal(suspend(&run, &call, &[named(&waiting)], NOW));
        assert!(refused.contains("does not await"), "{refused}");
        let mut elsewhere = its_child.clone();
        elsewhere.run_id = crate::model::RunId::new();
        let refused = refusal(suspend(&run, &call, &[named(&elsewhere)], NOW));
        assert!(refused.contains("does not await"), "{refused}");
    }

    #[test]
    fn a_suspension_naming_a_settled_step_is_refused() {
        let (run, dispatch, waiting) = handler_waiting_on_a_child();
        let settled = child_ended(&waiting, &child(RunStatus::Completed), NOW).unwrap().step;
        let refused = refusal(suspend(&run, &dispatch, &[named(&settled)], NOW));
        assert!(
            refused.starts_with("suspended.waiting_on: subagent:researcher#0 has settled (succeeded)"),
            "{refused}"
        );
    }

    #[test]
    fn a_suspension_naming_one_settled_or_unknown_step_among_unsettled_ones_is_refused() {
        let (run, dispatch, waiting) = handler_waiting_on_a_child();
        let mut second = subagent_step(
            &run,
            (2, StepKey::subagent("researcher", 1)),
            &child(RunStatus::Pending),
            NOW,
        )
        .step;
        assert!(suspend(&run, &dispatch, &[named(&waiting), named(&second)], NOW).is_ok());
        second = child_ended(&second, &child(RunStatus::Failed), NOW).unwrap().step;
        let refused = refusal(suspend(&run, &dispatch, &[named(&waiting), named(&second)], NOW));
        assert!(
            refused.contains("subagent:researcher#1 has settled (failed)"),
            "{refused}"
        );
        let unknown = (StepKey::subagent("writer", 0), None);
        let refused = refusal(suspend(&run, &dispatch, &[named(&waiting), unknown], NOW));
        assert!(refused.contains("subagent:writer#0 is not a step"), "{refused}");
    }

    #[test]
    fn an_at_most_once_call_may_not_suspend() {
        let (run, _, waiting) = handler_waiting_on_a_child();
        let mut call = step();
        call.run_id = run.id.clone();
        call.status = StepStatus::Running;
        call.idempotency = Idempotency::AtMostOnce;
        let mut its_child = waiting;
        its_child.key = StepKey::tool_subagent(&call.key, "researcher", 0);
        let refused = refusal(suspend(&run, &call, &[named(&its_child)], NOW));
        assert!(refused.contains("at_most_once"), "{refused}");
    }

    #[test]
    fn a_suspended_dispatch_resumes_once_and_its_run_runs_again() {
        let (run, dispatch, waiting) = handler_waiting_on_a_child();
        let (suspended, _) = suspend(&run, &dispatch, &[named(&waiting)], NOW).unwrap();
        let resumed = resume(&suspended.step, "subagent:researcher#0").unwrap();
        assert_eq!(
            (resumed.step.status, resumed.event.kind),
            (StepStatus::Pending, EventType::AgentResumed)
        );
        assert!(resume(&resumed.step, "again").is_none());
        let running = woken(&after_suspension(&run, &dispatch), NOW).expect("the suspended run runs again");
        assert_eq!(
            running.status,
            RunStatus::Running,
            "after agent:resumed the run is not suspended"
        );
        assert!(woken(&running, NOW).is_none());
    }

    #[test]
    fn the_handler_outcome_settles_the_dispatch_and_ends_the_run_cancelling_what_is_left() {
        let mut run = hosted_run();
        run.status = RunStatus::Running;
        let dispatch = started(&run, "d1", 1);
        let left = step();
        let (settled, ended) = finish(&run, &dispatch, Ok("42"), &[dispatch.clone(), left], &[], NOW).unwrap();
        assert_eq!(settled.event.kind, EventType::AgentResult);
        assert_eq!(settled.step.status, StepStatus::Succeeded);
        assert_eq!(ended.run.status, RunStatus::Completed);
        assert_eq!(
            ended.settled.len(),
            1,
            "the call left in flight is cancelled, the dispatch settled once"
        );
        let (failed, ended) = finish(&run, &dispatch, Err((ErrorKind::Fatal, "no")), &[], &[], NOW).unwrap();
        assert_eq!(failed.step.status, StepStatus::Failed);
        assert_eq!(
            (ended.run.status, ended.run.reason.as_deref()),
            (RunStatus::Failed, Some("no"))
        );
    }
}
