//! How a run begins and ends. A create with an idempotency key returns the run that holds it
//! (same agent and input) instead of a second one. Completing needs every call settled; failing or cancelling settles the calls
//! in flight first (and withdraws the questions still open), so the run's terminal event is the
//! last word of its log. A run ends once.

use super::dispatch::settle;
use super::events::{self, Payload, SettledBy};
use super::{NewEvent, StepChange, json_or_string};
use crate::error::KernelError;
use std::collections::BTreeMap;

use crate::model::{
    ApprovalRecord, ApprovalStatus, Capture, ErrorKind, Millis, Outcome, RunId, RunRecord, RunStatus, StepRecord,
    StepStatus,
};

/// A run to create.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NewRun {
    pub agent: String,
    /// Canonical JSON text.
    pub input: String,
    pub labels: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub max_tool_calls: u32,
    /// `false` for runs that cannot wait for a person.
    pub interactive: bool,
    /// Permissions granted to the run.
    pub permissions: Vec<String>,
    /// The API key that granted them; `None` without an auth file, where the run's claim stands.
    pub granted_by: Option<String>,
    /// What inspection shows of its arguments and results.
    pub capture: Capture,
    /// The agent a worker hosts, when the kernel dispatches the run's handler.
    pub hosted: Option<super::hosted::HostedAgent>,
    /// The run (and its step) that starts this one as a subagent.
    pub parent: Option<(RunId, crate::model::StepKey)>,
    /// Subagents with one session key run one at a time, in order of start.
    pub session_key: Option<String>,
    /// The default bound on how many calls of one turn run at once; 0: none.
    pub max_concurrency: u32,
    /// A branch: the run whose record it replays, up to where.
    pub fork: Option<crate::model::Fork>,
    /// A case run's allow tokens.
    pub allow: Vec<String>,
    /// The W3C trace context its span is a child of.
    #[serde(with = "crate::wire::traceparent")]
    pub trace: Option<crate::traces::TraceParent>,
    /// The run's own budget limits (from its request and the policy file); a subagent is also
    /// charged to its parent's budget.
    #[serde(default)]
    pub budget: Vec<super::budget::Limit>,
    /// The shard to make a run in that no parent or idempotency key places
    /// ([`crate::machine::command::create_run::shard`]): one its replica owns. `None`: any.
    #[serde(default)]
    pub home: Option<u32>,
}

/// What creating a run does: with an idempotency key a run already holds, that run (when its
/// agent and input match; anything else under the same key is refused), else a new run.
#[derive(Clone, Debug, PartialEq)]
pub enum Created {
    Existing(Box<RunRecord>),
    /// A new run; a hosted one with its own dispatch, pending.
    New {
        run: Box<RunRecord>,
        event: NewEvent,
        dispatch: Option<Box<StepRecord>>,
    },
}

/// The `run:created` event of a new run as `new` asks.
fn created_event(new: &NewRun) -> NewEvent {
    events::RunCreated {
        agent: new.agent.clone(),
        input: json_or_string(&new.input),
        labels: new.labels.clone(),
        idempotency_key: new.idempotency_key.clone(),
        max_tool_calls: new.max_tool_calls,
        interactive: new.interactive,
        permissions: new.permissions.clone(),
        permissions_granted_by: new.granted_by.clone(),
        capture: new.capture,
        hosted: new.hosted.is_some(),
        parent_run_id: new.parent.as_ref().map(|(id, _)| id.to_string()),
        parent_step_key: new.parent.as_ref().map(|(_, key)| key.to_string()),
        session_key: new.session_key.clone(),
        forked_from_run_id: new.fork.as_ref().map(|fork| fork.of.to_string()),
        fork_at_step_key: new
            .fork
            .as_ref()
            .and_then(|fork| fork.at.as_ref())
            .map(|at| at.key.to_string()),
        allow: new.allow.clone(),
        traceparent: new.trace.map(|trace| trace.to_string()),
        budget: new.budget.iter().map(events::BudgetLimit::from).collect(),
    }
    .event()
}

/// Creates a run as `new` asks, given the run that holds its idempotency key, if any; a new run
/// gets the id `id`.
/// A subagent's `parent` is its parent run, whose budget covers it too.
pub fn create(
    (existing, parent): (Option<RunRecord>, Option<&RunRecord>),
    new: &NewRun,
    id: RunId,
    now: Millis,
) -> Result<Created, KernelError> {
    if let Some(run) = existing {
        if run.agent == new.agent && run.input == new.input {
            return Ok(Created::Existing(Box::new(run)));
        }
        return Err(KernelError::AlreadyExists(format!(
            "idempotency_key '{}' is already used by run {} with a different agent or input",
            new.idempotency_key.as_deref().unwrap_or_default(),
            run.id
        )));
    }
    let event = created_event(new);
    let run = RunRecord {
        id,
        agent: new.agent.clone(),
        status: RunStatus::Pending,
        input: new.input.clone(),
        output: None,
        reason: None,
        labels: new.labels.clone(),
        idempotency_key: new.idempotency_key.clone(),
        max_tool_calls: new.max_tool_calls,
        interactive: new.interactive,
        permissions: new.permissions.clone(),
        capture: new.capture,
        granted_by: new.granted_by.clone(),
        hosted: new.hosted.is_some(),
        dispatches: 0,
        parent: new.parent.clone(),
        session_key: new.session_key.clone(),
        suspensions: 0,
        max_concurrency: new.max_concurrency,
        fork: new.fork.clone(),
        allow: new.allow.clone(),
        trace: new.trace,
        tool_calls: 0,
        budget: super::budget::for_new_run(new.budget.clone(), parent),
        last_seq: 0,
        created_at: now,
        updated_at: now,
    };
    let dispatch = new
        .hosted
        .as_ref()
        .map(|agent| Box::new(super::hosted::dispatch_step(&run, agent, now)));
    Ok(Created::New {
        run: Box::new(run),
        event,
        dispatch,
    })
}

/// Refuses to delete a run still in flight: only a finished run may go.
pub fn deletable(run: &RunRecord) -> Result<(), KernelError> {
    if run.status.is_terminal() {
        return Ok(());
    }
    Err(KernelError::FailedPrecondition(format!(
        "run {} is {}; only a finished run can be deleted (cancel it first: kernelctl runs cancel {})",
        run.id, run.status, run.id
    )))
}

/// How a run ends.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum EndRun {
    /// With `settle_in_flight`, calls still in flight are cancelled (a hosted handler returned
    /// without awaiting them); without, they must have settled.
    Complete {
        output: String,
        settle_in_flight: bool,
    },
    Fail {
        reason: String,
    },
    Cancel {
        reason: String,
    },
}

/// What ending a run changes, in the order the store applies it: questions withdrawn, calls
/// settled, then the run and its terminal event.
#[derive(Clone, Debug, PartialEq)]
pub struct RunEnd {
    pub withdrawn: Vec<ApprovalRecord>,
    pub settled: Vec<StepChange>,
    pub run: RunRecord,
    pub event: NewEvent,
}

/// The run's terminal event, after `cancelled_steps` of its calls were cancelled.
fn ended_event(end: &EndRun, cancelled_steps: usize) -> NewEvent {
    match end {
        EndRun::Complete { output, .. } => events::RunCompleted {
            output: json_or_string(output),
            cancelled_steps,
        }
        .event(),
        EndRun::Fail { reason } => events::RunFailed {
            reason: reason.clone(),
            cancelled_steps,
        }
        .event(),
        EndRun::Cancel { reason } => events::RunCancelled {
            reason: reason.clone(),
            cancelled_steps,
        }
        .event(),
    }
}

/// Ends `run`, whose calls in flight are `in_flight` and whose open questions are `open`.
pub fn end(
    run: &RunRecord,
    in_flight: &[StepRecord],
    open: &[ApprovalRecord],
    end: &EndRun,
    now: Millis,
) -> Result<RunEnd, KernelError> {
    if run.status.is_terminal() {
        return Err(KernelError::FailedPrecondition(format!(
            "run {} is already {}",
            run.id, run.status
        )));
    }
    let (status, output, reason) = match end {
        EndRun::Complete {
            output,
            settle_in_flight,
        } => {
            if !in_flight.is_empty() && !settle_in_flight {
                return Err(KernelError::FailedPrecondition(format!(
                    "run {} has {} tool calls in flight; wait for their results or cancel the run",
                    run.id,
                    in_flight.len()
                )));
            }
            (RunStatus::Completed, Some(output.clone()), None)
        }
        EndRun::Fail { reason } => (RunStatus::Failed, None, Some(reason.clone())),
        EndRun::Cancel { reason } => (RunStatus::Cancelled, None, Some(reason.clone())),
    };
    let withdrawn = open
        .iter()
        .filter(|a| a.status == ApprovalStatus::Pending)
        .map(|a| {
            let mut withdrawn = a.clone();
            withdrawn.status = ApprovalStatus::Cancelled;
            withdrawn.answered_at = Some(now);
            withdrawn
        })
        .collect();
    let message = format!("run {}: {}", status, reason.as_deref().unwrap_or(""));
    let settled: Vec<StepChange> = in_flight
        .iter()
        .map(|step| {
            settle(
                step,
                (StepStatus::Cancelled, Outcome::Cancelled),
                Err((ErrorKind::Fatal, &message)),
                0,
                SettledBy::reason("run_ended"),
                now,
            )
        })
        .collect();
    let event = ended_event(end, settled.len());
    let mut ended = run.clone();
    ended.status = status;
    ended.output = output;
    ended.reason = reason;
    ended.updated_at = now;
    Ok(RunEnd {
        withdrawn,
        settled,
        run: ended,
        event,
    })
}

/// The reason an abandoned run fails with.
pub const ABANDONED: &str = "abandoned";

/// Whether `run` is abandoned: an external agent's run (the kernel does not host its handler)
/// pending or running whose last turn (or, before any, its creation) at `last_turn_at` is at
/// least `after_ms` old. It then fails with reason [`ABANDONED`], its calls settled first as
/// [`end`] settles them. A blocked run waits for a person, not for its agent, and a hosted run's
/// handler is the kernel's to redispatch: neither is abandoned.
pub fn abandoned(run: &RunRecord, last_turn_at: Millis, after_ms: u64, now: Millis) -> Option<EndRun> {
    let live = matches!(run.status, RunStatus::Pending | RunStatus::Running);
    let idle_since = last_turn_at.max(run.created_at);
    let idle = now.saturating_sub(idle_since);
    (live && !run.hosted && idle >= after_ms as Millis).then(|| EndRun::Fail {
        reason: ABANDONED.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, run, step};
    use crate::model::EventType;

    fn open_question() -> ApprovalRecord {
        crate::machine::records::approval()
    }

    #[test]
    fn cancelling_settles_calls_and_withdraws_questions_before_the_run_ends() {
        let in_flight = [step(), {
            let mut gated = step();
            gated.status = StepStatus::AwaitingApproval;
            gated
        }];
        let ended = end(
            &run(),
            &in_flight,
            &[open_question()],
            &EndRun::Cancel {
                reason: "operator".into(),
            },
            NOW,
        )
        .unwrap();
        assert_eq!(ended.withdrawn.len(), 1);
        assert_eq!(ended.withdrawn[0].status, ApprovalStatus::Cancelled);
        assert_eq!(ended.settled.len(), 2);
        assert!(ended.settled.iter().all(|c| c.step.status == StepStatus::Cancelled
            && c.step.outcome == Some(Outcome::Cancelled)
            && c.event.kind == EventType::ToolResult));
        assert_eq!(ended.run.status, RunStatus::Cancelled);
        assert_eq!(ended.run.reason.as_deref(), Some("operator"));
        assert_eq!(ended.event.kind, EventType::RunCancelled);
        assert_eq!(ended.event.payload["cancelled_steps"], 2);
    }

    fn new_run(key: Option<&str>) -> NewRun {
        NewRun {
            idempotency_key: key.map(str::to_owned),
            ..crate::machine::records::new_run()
        }
    }

    #[test]
    fn a_key_gives_back_its_run_and_refuses_another_under_it() {
        let id = run().id;
        let Created::New {
            run: created, event, ..
        } = create((None, None), &new_run(Some("k")), id.clone(), NOW).unwrap()
        else {
            panic!("a new run");
        };
        assert_eq!((created.status, created.id.clone()), (RunStatus::Pending, id));
        assert_eq!(event.kind, EventType::RunCreated);
        let again = create((Some((*created).clone()), None), &new_run(Some("k")), RunId::new(), NOW).unwrap();
        assert_eq!(again, Created::Existing(created.clone()));
        let mut other = new_run(Some("k"));
        other.input = "[1]".into();
        let refused = create((Some(*created), None), &other, RunId::new(), NOW).unwrap_err();
        assert!(matches!(refused, KernelError::AlreadyExists(_)), "{refused}");
    }

    #[test]
    fn only_a_finished_run_may_be_deleted() {
        for status in [RunStatus::Pending, RunStatus::Running, RunStatus::Blocked] {
            let mut live = run();
            live.status = status;
            assert!(deletable(&live).is_err(), "{status}");
        }
        for status in [RunStatus::Completed, RunStatus::Failed, RunStatus::Cancelled] {
            let mut done = run();
            done.status = status;
            assert!(deletable(&done).is_ok(), "{status}");
        }
    }

    #[test]
    fn a_run_ends_once_and_completes_only_with_every_call_settled() {
        let complete = EndRun::Complete {
            output: "42".into(),
            settle_in_flight: false,
        };
        let busy = end(&run(), &[step()], &[], &complete, NOW).unwrap_err();
        assert!(busy.to_string().contains("1 tool calls in flight"), "{busy}");
        let done = end(&run(), &[], &[], &complete, NOW).unwrap();
        assert_eq!(
            (done.run.status, done.run.output.as_deref()),
            (RunStatus::Completed, Some("42"))
        );
        assert_eq!(done.event.payload["output"], 42);
        for status in [RunStatus::Completed, RunStatus::Failed, RunStatus::Cancelled] {
            let mut ended = run();
            ended.status = status;
            let again = end(&ended, &[], &[], &EndRun::Fail { reason: "x".into() }, NOW);
            assert!(matches!(again, Err(KernelError::FailedPrecondition(_))), "{status}");
        }
    }
    #[test]
    fn only_an_idle_external_run_in_flight_is_abandoned() {
        let mut idle = run();
        idle.created_at = NOW - 10_000;
        let last_turn = NOW - 5_000;
        assert!(matches!(
            abandoned(&idle, last_turn, 5_000, NOW),
            Some(EndRun::Fail { reason }) if reason == ABANDONED
        ));
        assert!(
            abandoned(&idle, last_turn, 5_001, NOW).is_none(),
            "a turn within the limit"
        );
        assert!(
            abandoned(&idle, 0, 10_001, NOW).is_none(),
            "no turn yet: its creation counts"
        );
        for status in [
            RunStatus::Blocked,
            RunStatus::Suspended,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ] {
            let mut other = idle.clone();
            other.status = status;
            assert!(abandoned(&other, last_turn, 1, NOW).is_none(), "{status}");
        }
        let mut pending = idle.clone();
        pending.status = RunStatus::Pending;
        assert!(abandoned(&pending, 0, 1, NOW).is_some(), "created and never used");
        let mut hosted = idle;
        hosted.hosted = true;
        assert!(
            abandoned(&hosted, last_turn, 1, NOW).is_none(),
            "a hosted handler is redispatched"
        );
    }
}
