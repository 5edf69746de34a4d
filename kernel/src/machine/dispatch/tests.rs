//! Table-driven tests of a dispatch's transitions: no database, just records in and changes out.

use super::*;
use crate::machine::records::{NOW, step};
use crate::model::{EventType, RetryPolicy};

fn lease(attempt: u32) -> StartDispatch {
    StartDispatch {
        run_id: step().run_id,
        key: step().key,
        dispatch_id: format!("d{attempt}").into(),
        attempt,
        worker: "w1".into(),
        session_id: "s1".into(),
        lease_expires_at: NOW + 10_000,
        replica: None,
        limits: Vec::new(),
        limit_wait_ms: 0,
    }
}

/// `step` running attempt `attempt` as dispatch `d<attempt>` on session `s1`.
fn running(mut step: StepRecord, attempt: u32) -> StepRecord {
    step.attempts = attempt - 1;
    start(&step, &lease(attempt), NOW - 100).expect("starts").step
}

fn with_retries(mut step: StepRecord, max_attempts: u32, initial_interval_ms: u64) -> StepRecord {
    step.retry = Some(RetryPolicy {
        max_attempts,
        initial_interval_ms,
        backoff_coefficient: 2.0,
        max_interval_ms: 0,
    });
    step
}

fn at_most_once(mut step: StepRecord) -> StepRecord {
    step.idempotency = Idempotency::AtMostOnce;
    step
}

fn report(attempt: u32, outcome: Result<&str, (ErrorKind, &str)>) -> ResultReport {
    ResultReport {
        dispatch_id: format!("d{attempt}").into(),
        attempt,
        session_id: "s1".into(),
        outcome: outcome.map(str::to_owned).map_err(|(kind, m)| (kind, m.to_owned())),
        progress_count: 3,
    }
}

#[test]
fn a_step_starts_only_while_pending_and_only_as_the_next_attempt() {
    let cases: &[(StepStatus, u32, u32, bool)] = &[
        // status, attempts so far, attempt asked, starts
        (StepStatus::Pending, 0, 1, true),
        (StepStatus::Pending, 0, 2, false),
        (StepStatus::Pending, 1, 1, false),
        (StepStatus::Pending, 1, 2, true),
        (StepStatus::Running, 1, 2, false),
        (StepStatus::AwaitingApproval, 0, 1, false),
        (StepStatus::Succeeded, 1, 2, false),
        (StepStatus::Failed, 1, 2, false),
        (StepStatus::Cancelled, 0, 1, false),
    ];
    for &(status, attempts, attempt, starts) in cases {
        let mut before = step();
        before.status = status;
        before.attempts = attempts;
        let change = start(&before, &lease(attempt), NOW);
        assert_eq!(
            change.is_some(),
            starts,
            "{status} after {attempts} attempts, asked {attempt}"
        );
        if let Some(change) = change {
            assert_eq!(change.step.status, StepStatus::Running);
            assert_eq!(change.step.attempts, attempt);
            assert_eq!(
                change.step.dispatch_id.as_ref().map(|id| id.as_str()),
                Some(format!("d{attempt}").as_str())
            );
            assert_eq!(change.step.started_at, Some(NOW));
            assert_eq!(change.event.kind, EventType::ToolStart);
            assert_eq!(change.event.payload["attempt"], attempt);
        }
    }
    // A later attempt keeps the time the first one started.
    let mut retried = running(step(), 1);
    retried.status = StepStatus::Pending;
    let again = start(&retried, &lease(2), NOW + 5).unwrap();
    assert_eq!(again.step.started_at, Some(NOW - 100));
}

#[test]
fn only_the_holding_dispatch_attempt_and_session_are_heard() {
    let held_step = running(step(), 2);
    let cases: &[(&str, u32, Option<&str>, bool)] = &[
        ("d2", 2, Some("s1"), true),
        ("d2", 2, None, true),
        ("d2", 1, Some("s1"), false),
        ("d1", 2, Some("s1"), false),
        ("d2", 2, Some("s2"), false),
    ];
    for &(dispatch, attempt, session, heard) in cases {
        assert_eq!(
            held(
                &held_step,
                &dispatch.into(),
                attempt,
                session.map(SessionId::from).as_ref()
            ),
            heard,
            "{dispatch} {attempt} {session:?}"
        );
    }
    let (settled, _) = record_result(&held_step, &report(2, Ok("1")), NOW);
    assert!(
        !held(&settled.step, &"d2".into(), 2, Some(&"s1".into())),
        "a settled step is held by no one"
    );
}

#[test]
fn a_result_settles_or_waits_for_the_next_attempt() {
    struct Case {
        name: &'static str,
        step: StepRecord,
        outcome: Result<&'static str, (ErrorKind, &'static str)>,
        status: StepStatus,
        why: Option<Outcome>,
        event: EventType,
    }
    let retrying = with_retries(step(), 3, 400);
    let cases = [
        Case {
            name: "success",
            step: running(step(), 1),
            outcome: Ok(r#"{"ok":true}"#),
            status: StepStatus::Succeeded,
            why: Some(Outcome::Ok),
            event: EventType::ToolResult,
        },
        Case {
            name: "retryable with attempts left",
            step: running(retrying.clone(), 2),
            outcome: Err((ErrorKind::Retryable, "busy")),
            status: StepStatus::Pending,
            why: None,
            event: EventType::ToolAttemptFailed,
        },
        Case {
            name: "retryable on the last attempt",
            step: running(retrying.clone(), 3),
            outcome: Err((ErrorKind::Retryable, "busy")),
            status: StepStatus::Failed,
            why: Some(Outcome::ToolError),
            event: EventType::ToolResult,
        },
        Case {
            name: "fatal is never retried",
            step: running(retrying.clone(), 1),
            outcome: Err((ErrorKind::Fatal, "bad card")),
            status: StepStatus::Failed,
            why: Some(Outcome::ToolError),
            event: EventType::ToolResult,
        },
        Case {
            name: "poison is never retried",
            step: running(retrying, 1),
            outcome: Err((ErrorKind::Poison, "crashes the parser")),
            status: StepStatus::Failed,
            why: Some(Outcome::ToolError),
            event: EventType::ToolResult,
        },
    ];
    for case in cases {
        let attempt = case.step.attempts;
        let (change, _) = record_result(&case.step, &report(attempt, case.outcome), NOW);
        assert_eq!(change.step.status, case.status, "{}", case.name);
        assert_eq!(change.step.outcome, case.why, "{}", case.name);
        assert_eq!(change.event.kind, case.event, "{}", case.name);
        assert_eq!(
            change.step.progress_count, 3,
            "{}: the attempt's progress is counted",
            case.name
        );
        assert_eq!(
            change.step.lease_expires_at, None,
            "{}: no lease after the attempt",
            case.name
        );
        match case.status {
            StepStatus::Pending => {
                // Backoff 400 ms, doubled after the first retry.
                assert_eq!(change.step.not_before, Some(NOW + 800), "{}", case.name);
                assert_eq!(change.event.payload["next_attempt_at"], NOW + 800);
                assert_eq!(change.step.finished_at, None);
            }
            _ => {
                assert_eq!(change.step.finished_at, Some(NOW), "{}", case.name);
                assert_eq!(
                    change.step.cost,
                    0.5 * f64::from(attempt),
                    "{}: cost per attempt run",
                    case.name
                );
                assert_eq!(change.event.payload["outcome"], case.why.unwrap().as_str());
            }
        }
    }
}

#[test]
fn a_success_of_a_cached_tool_is_kept_for_its_ttl() {
    let mut cached = step();
    cached.cache_ttl_ms = Some(60_000);
    let (change, until) = record_result(&running(cached, 1), &report(1, Ok("42")), NOW);
    assert_eq!(until, Some(NOW + 60_000));
    assert_eq!(change.step.output.as_deref(), Some("42"));
    let (_, not_kept) = record_result(&running(step(), 1), &report(1, Ok("42")), NOW);
    assert_eq!(not_kept, None);
}

#[test]
fn a_lost_lease_requeues_a_safe_call_and_ends_one_that_may_not_run_again() {
    let loss = LeaseLoss {
        dispatch_id: "d1".into(),
        attempt: 1,
        reason: "worker w1 closed its stream".into(),
    };
    let requeued = lose_lease(&running(step(), 1), &loss, NOW);
    assert_eq!(requeued.step.status, StepStatus::Pending);
    assert_eq!(requeued.step.lease_losses, 1);
    assert_eq!(requeued.event.kind, EventType::ToolLeaseLost);
    assert_eq!(requeued.event.payload["next"], "redispatch");

    let lost = lose_lease(&running(at_most_once(step()), 1), &loss, NOW);
    assert_eq!(lost.step.status, StepStatus::Failed);
    assert_eq!(lost.step.outcome, Some(Outcome::Indeterminate));
    assert!(lost.step.error.as_deref().unwrap().starts_with("indeterminate:"));
    assert_eq!(lost.event.payload["reason"], "indeterminate");

    let mut crashing = running(step(), 5);
    crashing.lease_losses = MAX_LEASE_LOSSES - 1;
    let poison = lose_lease(&crashing, &loss, NOW);
    assert_eq!(poison.step.outcome, Some(Outcome::Poison));
    assert_eq!(poison.step.error_kind, Some(ErrorKind::Poison));
}

#[test]
fn a_timeout_retries_a_safe_call_and_never_reruns_a_blocking_or_at_most_once_one() {
    let blocking = {
        let mut s = with_retries(step(), 3, 0);
        s.blocking = true;
        s
    };
    let cases: &[(&str, StepRecord, StepStatus, Option<Outcome>)] = &[
        (
            "safe, with retries",
            with_retries(step(), 3, 0),
            StepStatus::Pending,
            None,
        ),
        ("safe, no retry", step(), StepStatus::Failed, Some(Outcome::TimedOut)),
        ("blocking", blocking, StepStatus::Failed, Some(Outcome::TimedOut)),
        (
            "at_most_once, with retries",
            at_most_once(with_retries(step(), 3, 0)),
            StepStatus::Failed,
            Some(Outcome::Indeterminate),
        ),
    ];
    for (name, before, status, why) in cases {
        let change = time_out(&running(before.clone(), 1), NOW);
        assert_eq!(change.step.status, *status, "{name}");
        assert_eq!(change.step.outcome, *why, "{name}");
    }
}

#[test]
fn only_a_pending_step_fails_for_want_of_a_worker() {
    let why = ("schedule_to_start_timeout", Outcome::NoWorker);
    let failed = fail_pending(&step(), "no worker offering tool 'charge'", why, NOW).unwrap();
    assert_eq!(failed.step.status, StepStatus::Failed);
    assert_eq!(failed.step.outcome, Some(Outcome::NoWorker));
    assert_eq!(failed.step.attempts, 0, "it never ran");
    assert_eq!(failed.event.payload["reason"], "schedule_to_start_timeout");
    assert!(fail_pending(&running(step(), 1), "x", why, NOW).is_none());
    let mut dispatch = step();
    dispatch.kind = StepKind::Agent;
    assert!(
        fail_pending(&dispatch, "x", why, NOW).is_none(),
        "a hosted run waits for its host"
    );
}

#[test]
fn a_settled_step_goes_nowhere_else() {
    let (settled, _) = record_result(&running(step(), 1), &report(1, Err((ErrorKind::Fatal, "no"))), NOW);
    let settled = settled.step;
    assert!(start(&settled, &lease(2), NOW).is_none());
    assert!(fail_pending(&settled, "x", ("r", Outcome::NoWorker), NOW).is_none());
    for (dispatch, attempt) in [("d1", 1), ("d2", 2)] {
        assert!(
            !held(&settled, &dispatch.into(), attempt, None),
            "no message about it is heard"
        );
    }
}
