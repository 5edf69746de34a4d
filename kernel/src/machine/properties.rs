//! Properties of the state machine: any sequence of commands, in any order, with stale and
//! foreign messages mixed in, keeps the invariants of a step's life: one terminal event, no way
//! back from it, attempt numbers never issued twice, an `at_most_once` call never started again
//! after an attempt whose effect is unknown, messages heard only from the dispatch that holds the
//! step, and an approval answered once.

use proptest::prelude::*;

use super::approval::{self, Ask};
use super::dispatch::{self, LeaseLoss, ResultReport, StartDispatch};
use super::records::{NOW, run, step};
use super::run::{self as run_end, EndRun};
use super::turn;
use crate::model::{
    ApprovalGate, ApprovalStatus, DispatchId, ErrorKind, EventType, Idempotency, RetryPolicy, RunStatus, SessionId,
    StepRecord, StepStatus,
};

/// Which dispatch a message claims to come from.
#[derive(Clone, Copy, Debug)]
enum From {
    /// The latest one started.
    Current,
    /// An earlier attempt.
    Stale,
    /// The latest attempt, from another session.
    OtherSession,
}

#[derive(Clone, Debug)]
enum Command {
    /// Start the attempt after the last one, plus `offset` (a stale or early view of the step).
    Start {
        offset: i8,
    },
    Result {
        from: From,
        outcome: Option<ErrorKind>,
    },
    LoseLease {
        from: From,
    },
    TimeOut {
        from: From,
    },
    FailPending,
    Cancel,
}

fn from() -> impl Strategy<Value = From> {
    prop_oneof![Just(From::Current), Just(From::Stale), Just(From::OtherSession)]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        3 => (-1i8..=1).prop_map(|offset| Command::Start { offset }),
        3 => (from(), prop_oneof![
            Just(None),
            Just(Some(ErrorKind::Retryable)),
            Just(Some(ErrorKind::Fatal)),
            Just(Some(ErrorKind::Poison)),
        ])
            .prop_map(|(from, outcome)| Command::Result { from, outcome }),
        2 => from().prop_map(|from| Command::LoseLease { from }),
        2 => from().prop_map(|from| Command::TimeOut { from }),
        1 => Just(Command::FailPending),
        1 => Just(Command::Cancel),
    ]
}

/// A call with a random idempotency mode, retry policy and blocking flag.
fn a_step() -> impl Strategy<Value = StepRecord> {
    (any::<bool>(), 1u32..=4, any::<bool>()).prop_map(|(at_most_once, max_attempts, blocking)| {
        let mut step = step();
        if at_most_once {
            step.idempotency = Idempotency::AtMostOnce;
        }
        step.retry = Some(RetryPolicy {
            max_attempts,
            initial_interval_ms: 10,
            backoff_coefficient: 2.0,
            max_interval_ms: 0,
        });
        step.blocking = blocking;
        step
    })
}

/// One step driven by commands, with what it recorded.
struct Life {
    step: StepRecord,
    events: Vec<EventType>,
    /// The dispatches started, in order: (dispatch id, attempt).
    started: Vec<(DispatchId, u32)>,
}

impl Life {
    /// The dispatch a message claims to come from, and its session.
    fn sender(&self, from: From) -> Option<(DispatchId, u32, SessionId)> {
        let (id, attempt) = match from {
            From::Current | From::OtherSession => self.started.last()?.clone(),
            From::Stale => self.started.iter().rev().nth(1)?.clone(),
        };
        let session = if matches!(from, From::OtherSession) { "s2" } else { "s1" };
        Some((id, attempt, session.into()))
    }

    fn apply(&mut self, change: super::StepChange) {
        self.events.push(change.event.kind);
        self.step = change.step;
    }

    fn run(&mut self, command: &Command) {
        match command {
            Command::Start { offset } => {
                let attempt = (i64::from(self.step.attempts) + 1 + i64::from(*offset)).max(1) as u32;
                let start = StartDispatch {
                    run_id: self.step.run_id.clone(),
                    key: self.step.key.clone(),
                    dispatch_id: format!("d{}", self.started.len()).into(),
                    attempt,
                    worker: "w".into(),
                    session_id: "s1".into(),
                    lease_expires_at: NOW + 1,
                    replica: None,
                    limits: Vec::new(),
                    limit_wait_ms: 0,
                };
                if let Some(change) = dispatch::start(&self.step, &start, NOW) {
                    assert!(
                        self.started.iter().all(|(_, a)| *a != attempt),
                        "attempt {attempt} issued twice: {:?}",
                        self.started
                    );
                    self.started.push((start.dispatch_id, attempt));
                    self.apply(change);
                }
            }
            Command::Result { from, outcome } => {
                let Some((id, attempt, session)) = self.sender(*from) else {
                    return;
                };
                if !dispatch::held(&self.step, &id, attempt, Some(&session)) {
                    return;
                }
                assert!(
                    matches!(from, From::Current),
                    "a stale or foreign message was heard: {from:?}"
                );
                let report = ResultReport {
                    dispatch_id: id,
                    attempt,
                    session_id: session,
                    outcome: match outcome {
                        None => Ok("1".into()),
                        Some(kind) => Err((*kind, "no".into())),
                    },
                    progress_count: 1,
                };
                let (change, _) = dispatch::record_result(&self.step, &report, NOW);
                self.apply(change);
            }
            Command::LoseLease { from } | Command::TimeOut { from } => {
                let Some((id, attempt, _)) = self.sender(*from) else {
                    return;
                };
                if !dispatch::held(&self.step, &id, attempt, None) {
                    return;
                }
                assert!(!matches!(from, From::Stale), "a stale attempt was heard");
                let change = match command {
                    Command::LoseLease { .. } => dispatch::lose_lease(
                        &self.step,
                        &LeaseLoss {
                            dispatch_id: id,
                            attempt,
                            reason: "gone".into(),
                        },
                        NOW,
                    ),
                    _ => dispatch::time_out(&self.step, NOW),
                };
                self.apply(change);
            }
            Command::FailPending => {
                let why = ("schedule_to_start_timeout", crate::model::Outcome::NoWorker);
                if let Some(change) = dispatch::fail_pending(&self.step, "no worker", why, NOW) {
                    self.apply(change);
                }
            }
            Command::Cancel => {
                if self.step.status.is_terminal() {
                    return;
                }
                let ended = run_end::end(
                    &run(),
                    std::slice::from_ref(&self.step),
                    &[],
                    &EndRun::Cancel { reason: "stop".into() },
                    NOW,
                )
                .expect("a running run can be cancelled");
                for change in ended.settled {
                    self.apply(change);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_step_keeps_its_invariants_whatever_comes(start in a_step(), commands in prop::collection::vec(command(), 1..40)) {
        let mut life = Life { step: start, events: Vec::new(), started: Vec::new() };
        let max_attempts = RetryPolicy::attempts(life.step.retry.as_ref());
        for command in &commands {
            let before = life.step.clone();
            life.run(command);
            // Monotonic: a settled step is final, and attempts never go down.
            if before.status.is_terminal() {
                prop_assert_eq!(&life.step, &before, "a settled step changed after {:?}", command);
            }
            prop_assert!(life.step.attempts >= before.attempts);
            let terminal = life.events.iter().filter(|e| **e == EventType::ToolResult).count();
            prop_assert_eq!(terminal, usize::from(life.step.status.is_terminal()), "one terminal event: {:?}", life.events);
            let starts = life.events.iter().filter(|e| **e == EventType::ToolStart).count();
            prop_assert_eq!(starts as u32, life.step.attempts, "one tool:start per attempt");
            if life.step.idempotency == Idempotency::AtMostOnce {
                // Started again only after the tool's own retryable error, never after an attempt
                // whose effect is unknown (lost worker, timeout): those settle it.
                let own_errors = life.events.iter().filter(|e| **e == EventType::ToolAttemptFailed).count();
                prop_assert!(starts <= 1 + own_errors, "an at_most_once call started {} times: {:?}", starts, life.events);
                prop_assert!(!life.events.contains(&EventType::ToolLeaseLost), "an at_most_once call was requeued");
            }
            // Retries are bounded by the policy; redispatches after lost workers by the poison limit.
            prop_assert!(life.step.attempts <= max_attempts + life.step.lease_losses);
            prop_assert!(life.step.lease_losses < dispatch::MAX_LEASE_LOSSES);
            if life.step.status.is_terminal() {
                prop_assert!(life.step.outcome.is_some(), "a settled step says why");
                prop_assert_eq!(life.step.lease_expires_at, None);
            }
        }
    }

    #[test]
    fn an_approval_is_answered_once(answers in prop::collection::vec(0u8..3, 1..6)) {
        let mut gated = step();
        gated.status = StepStatus::AwaitingApproval;
        gated.approval_gate = Some(ApprovalGate::default());
        let Ask::Ask(question) = approval::ask_next(&run(), 0, Some(&gated), "ap".into(), NOW) else {
            panic!("asked");
        };
        let mut approval = question.approval;
        let mut accepted = 0;
        for answer in answers {
            let status = [ApprovalStatus::Approved, ApprovalStatus::Rejected, ApprovalStatus::Expired][answer as usize];
            if let Ok(answered) = approval::answer(&approval, &gated, (status, "bob", None), None, NOW) {
                accepted += 1;
                approval = answered.approval;
            }
        }
        prop_assert_eq!(accepted, 1);
        prop_assert_ne!(approval.status, ApprovalStatus::Pending);
    }
}

/// The properties above start from a pending step; a turn's refusals settle a call with its one
/// terminal event before any start, and such a call can then never start.
#[test]
fn a_call_settled_when_recorded_never_starts() {
    let mut run = run();
    run.status = RunStatus::Running;
    let call = turn::PlannedCall {
        position: 0,
        key: step().key,
        call_id: None,
        tool_name: "nosuch".into(),
        arguments: "{}".into(),
        sealed: None,
        tool: None,
        not_offered: false,
        timeout_ms: None,
        call_hash: "h".into(),
        gate: turn::CallGate::Run {
            decided_by: String::new(),
        },
        unit_cost: 0.0,
        resources: Vec::new(),
        start: None,
    };
    let decision = turn::decide(&run, &call, &[]);
    let recorded = turn::record(&mut run, (0, 30_000, None, None), &call, decision, None, NOW);
    assert!(recorded.step.status.is_terminal());
    let start = StartDispatch {
        run_id: recorded.step.run_id.clone(),
        key: recorded.step.key.clone(),
        dispatch_id: "d".into(),
        attempt: 1,
        worker: "w".into(),
        session_id: "s".into(),
        lease_expires_at: NOW,
        replica: None,
        limits: Vec::new(),
        limit_wait_ms: 0,
    };
    assert!(dispatch::start(&recorded.step, &start, NOW).is_none());
}
