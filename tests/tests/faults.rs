//! Fault injection with real processes: workers and the kernel killed, hung and resumed mid-call.
//! After each case the whole event log goes through `check_log`, and the fault worker's ledger
//! says how often each effect really ran.

use std::time::Duration;

use e2e::{Kernel, KernelOptions, Watch, call, check_log, payload, submit, submit_until_done, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::json;
use tonic::Code;

async fn key_of(kernel: &Kernel, run: &str, position: u32) -> String {
    let steps = kernel.get(run).await.steps;
    steps
        .iter()
        .find(|s| s.position == position)
        .expect("step")
        .idempotency_key
        .clone()
}

#[tokio::test]
async fn a_killed_worker_s_safe_call_runs_again_elsewhere_with_the_same_key() {
    let kernel = Kernel::start();
    let mut w1 = kernel.fault_worker("w1");
    let mut w2 = kernel.fault_worker("w2");
    kernel.wait_for_workers("sleepy", 2).await;
    let run = kernel.create_run("retry-safe").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 2000}))]);
    let chaos = async {
        let start = watch.event("tool:start", |_| true).await;
        let key = start["idempotency_key"].as_str().unwrap().to_owned();
        wait_ledger(&kernel, "the first execution", |l| l.iter().any(|l| l.key == key)).await;
        if start["worker"] == "w1" {
            w1.kill9()
        } else {
            w2.kill9()
        }
        key
    };
    let (outcome, key) = tokio::join!(turn, chaos);
    let result = &outcome.unwrap().results[0];
    assert_eq!(result.status, pb::CallStatus::Ok as i32, "{result:?}");
    assert_eq!(result.attempts, 2);
    let runs: Vec<_> = kernel
        .ledger()
        .into_iter()
        .filter(|l| l.what == "start" && l.key == key)
        .collect();
    assert_eq!(
        runs.iter().map(|l| l.attempt).collect::<Vec<_>>(),
        [1, 2],
        "at least once at the tool, same key"
    );
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_killed_worker_s_at_most_once_call_is_indeterminate_and_never_runs_again() {
    let kernel = Kernel::start();
    let mut w1 = kernel.fault_worker("w1");
    let _w2 = kernel.fault_worker("w2");
    kernel.wait_for_workers("charge", 2).await;
    let run = kernel.create_run("charge-once").await;
    let calls = vec![call("charge", json!({"hold_ms": 2000}))];
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = submit(&kernel, &run, 0, calls.clone());
    let chaos = async {
        let start = watch.event("tool:start", |_| true).await;
        let key = start["idempotency_key"].as_str().unwrap().to_owned();
        wait_ledger(&kernel, "the charge", |l| l.iter().any(|l| l.key == key)).await;
        // Kill whichever worker holds it; the other stays up and must not get it.
        if start["worker"] == "w1" {
            w1.kill9();
        } else {
            drop(std::mem::replace(&mut w1, kernel.fault_worker("spare")));
        }
        key
    };
    let (outcome, key) = tokio::join!(turn, chaos);
    let result = &outcome.unwrap().results[0];
    // When w2 held it, w2 is still alive and finishes the charge normally; only a lost worker is indeterminate.
    if result.status == pb::CallStatus::Error as i32 {
        assert!(result.content.starts_with("indeterminate:"), "{}", result.content);
        assert!(
            result.content.contains("may or may not have happened"),
            "{}",
            result.content
        );
        let again = submit(&kernel, &run, 0, calls).await.unwrap();
        assert!(again.results[0].replayed, "a resubmission gets the recorded outcome");
        assert_eq!(again.results[0].content, result.content);
    }
    assert_eq!(kernel.executions(&key), 1, "an at_most_once effect ran exactly once");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn an_at_most_once_call_recorded_but_never_started_runs_when_its_agent_comes_back() {
    let kernel = Kernel::start();
    // One slot: the second charge is recorded and waits for it.
    let _w1 = kernel.fault_worker_with("w1", &["--max-concurrency", "1"]);
    kernel.wait_for_workers("charge", 1).await;
    let run = kernel.create_run("biller").await;
    let first = submit(&kernel, &run, 0, vec![call("charge", json!({"hold_ms": 1500}))]);
    let second = vec![call("charge", json!({"hold_ms": 1}))];
    let agent_goes_away = async {
        wait_ledger(&kernel, "the first charge", |l| l.len() == 1).await;
        // The agent submits the second charge and goes away once it is recorded, not started.
        let recorded = e2e::eventually("the second charge recorded and pending", || async {
            let steps = kernel.get(&run).await.steps;
            match steps.iter().find(|s| s.turn == 1) {
                Some(step) if step.status == pb::StepStatus::Pending as i32 => Ok(()),
                other => Err(other.cloned()),
            }
        });
        tokio::select! {
            outcome = submit(&kernel, &run, 1, second.clone()) => panic!("the second charge ran early: {outcome:?}"),
            () = recorded => {}
        }
    };
    let (first, ()) = tokio::join!(first, agent_goes_away);
    assert_eq!(first.unwrap().results[0].status, pb::CallStatus::Ok as i32);
    // The agent comes back: the charge it left recorded but unstarted runs, once.
    let again = submit(&kernel, &run, 1, second).await.unwrap();
    let result = &again.results[0];
    assert_eq!(
        (result.status, result.attempts),
        (pb::CallStatus::Ok as i32, 1),
        "{result:?}"
    );
    let key = kernel
        .get(&run)
        .await
        .steps
        .iter()
        .find(|s| s.turn == 1)
        .unwrap()
        .idempotency_key
        .clone();
    assert_eq!(kernel.executions(&key), 1);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_hung_worker_loses_its_lease_and_its_late_result_is_not_recorded() {
    let kernel = Kernel::start();
    let w1 = kernel.fault_worker("w1");
    let w2 = kernel.fault_worker("w2");
    kernel.wait_for_workers("sleepy", 2).await;
    let run = kernel.create_run("hung").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 2500}))]);
    let chaos = async {
        let start = watch.event("tool:start", |_| true).await;
        let key = start["idempotency_key"].as_str().unwrap().to_owned();
        wait_ledger(&kernel, "the first execution", |l| l.iter().any(|l| l.key == key)).await;
        let (hung, other) = if start["worker"] == "w1" {
            (&w1, &w2)
        } else {
            (&w2, &w1)
        };
        let _ = other;
        hung.stop();
        let lost = watch.event("tool:lease_lost", |_| true).await;
        assert!(lost["reason"].as_str().unwrap().contains("lease expired"), "{lost}");
        let restart = watch.event("tool:start", |p| p["attempt"] == 2).await;
        assert_ne!(restart["worker"], start["worker"]);
        hung.resume();
        // The resumed worker learns its session is gone, winds its call down and reconnects.
        wait_ledger(&kernel, "the hung call's cancel", |l| {
            l.iter().any(|l| l.what == "cancelled" && l.attempt == 1)
        })
        .await;
        hung.log.wait_for_after(
            hung.log.wait_for_after(0, "worker session open").0 + 1,
            "worker session open",
        );
    };
    let (outcome, ()) = tokio::join!(turn, chaos);
    let result = &outcome.unwrap().results[0];
    assert_eq!(result.status, pb::CallStatus::Ok as i32, "{result:?}");
    assert_eq!(result.attempts, 2);
    let events = kernel.events(&run).await;
    check_log(&events, true);
    let results: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "tool:result")
        .map(payload)
        .collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["attempts"], 2, "only the live attempt's result is recorded");
}

#[tokio::test]
async fn a_kernel_killed_during_a_burst_loses_nothing_and_reruns_nothing_it_must_not() {
    let mut kernel = Kernel::start();
    let _w1 = kernel.fault_worker("w1");
    let _w2 = kernel.fault_worker("w2");
    kernel.wait_for_workers("charge", 2).await;
    let calls = vec![
        call("sleepy", json!({"hold_ms": 600})),
        call("charge", json!({"hold_ms": 600})),
        call("sleepy", json!({"hold_ms": 20})),
    ];
    let mut runs = Vec::new();
    for _ in 0..12 {
        runs.push(kernel.create_run("burst").await);
    }
    let url = kernel.url();
    let agents: Vec<_> = runs
        .iter()
        .map(|run| tokio::spawn(submit_until_done_owned(url.clone(), run.clone(), calls.clone())))
        .collect();
    wait_ledger(&kernel, "a burst in flight", |l| {
        l.iter().filter(|l| l.what == "start").count() >= 8
    })
    .await;
    kernel.kill9();
    kernel.restart();

    let mut indeterminate = 0;
    for (run, agent) in runs.iter().zip(agents) {
        let outcome = agent.await.unwrap();
        assert_eq!(outcome.results.len(), 3);
        for position in [0, 2] {
            assert_eq!(
                outcome.results[position].status,
                pb::CallStatus::Ok as i32,
                "{:?}",
                outcome.results[position]
            );
        }
        let key = key_of(&kernel, run, 1).await;
        indeterminate += usize::from(charge_became_indeterminate(&kernel, &outcome.results[1], &key));
        let events = kernel.events(run).await;
        check_log(&events, true);
        let steps = kernel.get(run).await.steps;
        assert_eq!(steps.len(), 3, "every call of the run is accounted for");
        assert!(
            steps.iter().all(|s| s.status >= pb::StepStatus::Succeeded as i32),
            "{steps:?}"
        );
    }
    eprintln!("{indeterminate} of 12 charges were in flight at the crash and became indeterminate");
}

/// Checks an `at_most_once` charge's outcome against the ledger: one that succeeded ran exactly
/// once, one that did not is `indeterminate` and never ran again. Says whether it is indeterminate.
fn charge_became_indeterminate(kernel: &Kernel, charge: &pb::CallResult, key: &str) -> bool {
    if charge.status == pb::CallStatus::Ok as i32 {
        assert_eq!(kernel.executions(key), 1, "a charge that succeeded ran exactly once");
        return false;
    }
    assert!(charge.content.starts_with("indeterminate:"), "{}", charge.content);
    assert!(kernel.executions(key) <= 1, "an indeterminate charge was not run again");
    true
}

async fn submit_until_done_owned(url: String, run: String, calls: Vec<pb::ToolCall>) -> e2e::TurnOutcome {
    submit_until_done(&url, &run, 0, calls).await
}

#[tokio::test]
async fn the_same_turn_submitted_by_two_agents_at_once_runs_each_call_once() {
    let kernel = Kernel::start();
    let _w1 = kernel.fault_worker("w1");
    let run = kernel.create_run("twins").await;
    let calls: Vec<pb::ToolCall> = (0..4).map(|i| call("sleepy", json!({"hold_ms": 200 + i}))).collect();
    let (a, b) = tokio::join!(
        submit(&kernel, &run, 0, calls.clone()),
        submit(&kernel, &run, 0, calls.clone())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    for (x, y) in a.results.iter().zip(&b.results) {
        assert_eq!(x.status, pb::CallStatus::Ok as i32);
        assert_eq!(x.content, y.content);
        assert_eq!(x.step_key, y.step_key);
    }
    for position in 0..4 {
        let key = key_of(&kernel, &run, position).await;
        assert_eq!(kernel.executions(&key), 1, "call {position} ran once");
    }
    let again = submit(&kernel, &run, 0, calls).await.unwrap();
    assert!(
        again.results.iter().all(|r| r.replayed),
        "a later resubmission is served from the log"
    );
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_retry_with_backoff_survives_a_kernel_restart() {
    let mut kernel = Kernel::start();
    let _w1 = kernel.fault_worker("w1");
    let run = kernel.create_run("flaky").await;
    let url = kernel.url();
    let calls = vec![call("flaky", json!({"succeed_on": 3}))];
    let agent = tokio::spawn({
        let run = run.clone();
        async move { submit_until_done(&url, &run, 0, calls).await }
    });
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let failed = watch.event("tool:attempt_failed", |p| p["attempt"] == 1).await;
    assert!(failed["next_attempt_at"].as_i64().is_some(), "{failed}");
    assert_eq!(failed["error"], "attempt 1 fails");
    // The retry timer is in the store: kill the kernel while the call waits for it.
    kernel.kill9();
    kernel.restart();
    let outcome = agent.await.unwrap();
    assert_eq!(
        outcome.results[0].status,
        pb::CallStatus::Ok as i32,
        "{:?}",
        outcome.results[0]
    );
    assert_eq!(outcome.results[0].content, "3");
    assert_eq!(outcome.results[0].attempts, 3);

    let events = kernel.events(&run).await;
    check_log(&events, true);
    let failures: Vec<_> = events
        .iter()
        .filter(|e| e.r#type == "tool:attempt_failed")
        .map(payload)
        .collect();
    assert_eq!(failures.len(), 2, "each failed attempt is an event");
    for failure in &failures {
        let due = failure["next_attempt_at"].as_i64().unwrap();
        let next = events
            .iter()
            .find(|e| e.r#type == "tool:start" && payload(e)["attempt"] == failure["attempt"].as_u64().unwrap() + 1)
            .expect("the next attempt started");
        let started = next.at.as_ref().unwrap();
        let started_ms = started.seconds * 1000 + started.nanos as i64 / 1_000_000;
        assert!(
            started_ms >= due,
            "attempt started at {started_ms}, before its backoff ended at {due}"
        );
    }
    let attempts: Vec<u32> = kernel.ledger().iter().map(|l| l.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
}

#[tokio::test]
async fn an_async_call_past_its_timeout_is_cancelled_and_its_late_result_discarded() {
    let kernel = Kernel::start();
    let _w1 = kernel.fault_worker("w1");
    let run = kernel.create_run("slowpoke").await;
    let mut timed = call("sleepy", json!({"hold_ms": 5000}));
    timed.timeout_ms = 400;
    let outcome = submit(&kernel, &run, 0, vec![timed]).await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Error as i32);
    assert!(
        result.content.starts_with("tool 'sleepy' timed out after 400ms"),
        "{}",
        result.content
    );
    wait_ledger(&kernel, "the worker's cancel", |l| {
        l.iter().any(|l| l.what == "cancelled")
    })
    .await;
    kernel.process.log.wait_for("stale result refused");
    let events = kernel.events(&run).await;
    check_log(&events, true);
    assert_eq!(events.iter().filter(|e| e.r#type == "tool:result").count(), 1);
}

#[tokio::test]
async fn a_blocking_call_past_its_timeout_is_not_retried() {
    let kernel = Kernel::start();
    let _w1 = kernel.fault_worker("w1");
    let run = kernel.create_run("blocked").await;
    let outcome = submit(&kernel, &run, 0, vec![call("block", json!({"hold_ms": 1500}))])
        .await
        .unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Error as i32);
    assert!(
        result.content.contains("blocking tool's thread cannot be stopped"),
        "{}",
        result.content
    );
    assert_eq!(
        result.attempts, 1,
        "declared retry = 3, yet a blocking timeout is not retried"
    );
    wait_ledger(&kernel, "the thread finishing anyway", |l| {
        l.iter().any(|l| l.what == "finished")
    })
    .await;
    assert_eq!(kernel.ledger().iter().filter(|l| l.what == "start").count(), 1);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn cancelling_a_run_during_a_long_call_settles_the_call_then_the_run() {
    let kernel = Kernel::start_with(KernelOptions::default());
    let _w1 = kernel.fault_worker("w1");
    let run = kernel.create_run("cancelled").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 20_000}))]);
    let cancel = async {
        watch.event("tool:start", |_| true).await;
        let mut runs = kernel.runs().await;
        let request = pb::CancelRunRequest {
            run_id: run.clone(),
            reason: "user pressed stop".into(),
        };
        let cancelled = runs.cancel_run(request).await.unwrap().into_inner().run.unwrap();
        assert_eq!(cancelled.status, pb::RunStatus::Cancelled as i32);
    };
    let (outcome, ()) = tokio::join!(turn, cancel);
    let result = &outcome.unwrap().results[0];
    assert_eq!(result.status, pb::CallStatus::Cancelled as i32);
    assert!(result.content.contains("user pressed stop"), "{}", result.content);
    wait_ledger(&kernel, "the tool seeing its cancel", |l| {
        l.iter().any(|l| l.what == "cancelled")
    })
    .await;

    let events = kernel.events(&run).await;
    check_log(&events, true);
    let kinds: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["tool:result", "run:cancelled"],
        "the call settles before the run"
    );
    let refused = submit(&kernel, &run, 1, vec![call("sleepy", json!({"hold_ms": 1}))])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    let _ = Duration::ZERO;
}

#[tokio::test]
async fn a_call_that_crashes_its_worker_five_times_fails_as_poison_and_goes_out_no_more() {
    let kernel = Kernel::start();
    let run = kernel.create_run("crasher").await;
    let turn = tokio::spawn(submit_until_done_owned(
        kernel.url(),
        run.clone(),
        vec![call("crash", json!({}))],
    ));
    for attempt in 1..=5 {
        let mut worker = kernel.fault_worker(&format!("w{attempt}"));
        wait_ledger(&kernel, "the crash", |l| {
            l.iter().filter(|l| l.tool == "crash").count() == attempt
        })
        .await;
        assert!(
            worker.wait_exit(Duration::from_secs(10)).is_some(),
            "the call aborted its worker"
        );
    }
    let outcome = turn.await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.outcome, pb::CallOutcome::Poison as i32, "{result:?}");
    assert_eq!(result.error_kind, pb::ErrorKind::Poison as i32);
    assert!(result.content.contains("lost its worker 5 times"), "{}", result.content);
    let step = &kernel.get(&run).await.steps[0];
    assert_eq!(step.attempts, 5, "the fifth loss settles it");
    // A healthy worker connecting afterwards gets no sixth dispatch.
    let _spare = kernel.fault_worker("spare");
    let status = kernel.status().await;
    assert_eq!((status.queued_calls, status.leased_calls), (0, 0));
    assert_eq!(kernel.ledger().iter().filter(|l| l.tool == "crash").count(), 5);
    check_log(&kernel.events(&run).await, true);
}

/// Every result an agent was shown, turn by turn, across the streams a kernel kill broke.
#[derive(Default)]
struct Shown {
    /// (turn, result, ledger lines when it was shown) as each stream delivered them, complete or not.
    results: Vec<(u32, pb::CallResult, usize)>,
    /// Each turn's results from the stream that completed it.
    turns: Vec<Vec<pb::CallResult>>,
}

/// An agent that survives kernel kills: submits `turns` turns of `calls` in order, each again
/// until a stream delivers all its results, and remembers every result any stream showed, with
/// how long the workers' `ledger` was when it was shown.
async fn agent_through_kills(
    (url, ledger): (String, std::path::PathBuf),
    run: String,
    turns: u32,
    calls: Vec<pb::ToolCall>,
) -> Shown {
    let mut shown = Shown::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    for turn in 0..turns {
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "turn {turn} of {run} never completed"
            );
            let mut got = Vec::new();
            let attempt = async {
                let mut client = pb::tool_call_service_client::ToolCallServiceClient::connect(url.clone()).await?;
                let request = pb::SubmitTurnRequest {
                    run_id: run.clone(),
                    turn,
                    calls: calls.clone(),
                    ..Default::default()
                };
                let mut stream = client.submit_turn(request).await?.into_inner();
                while let Some(item) = stream.message().await? {
                    if let Some(pb::submit_turn_response::Item::Result(result)) = item.item {
                        got.push((result, e2e::read_ledger(&ledger).len()));
                    }
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            };
            let complete = attempt.await.is_ok();
            shown
                .results
                .extend(got.iter().map(|(r, seen)| (turn, r.clone(), *seen)));
            if complete && got.len() == calls.len() {
                shown.turns.push(got.into_iter().map(|(r, _)| r).collect());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    shown
}

/// SIGKILL the kernel four times while agents make turns of fast `safe_to_retry` and `at_most_once`
/// calls, each kill at a different point of the calls' lives (whenever the ledger reaches a count):
/// a result any agent was shown is the one the log keeps, never run again, and no `at_most_once`
/// call runs twice. A `safe_to_retry` call goes to its worker before its start commits, so a kill
/// may come between its run and its record: it then runs again (the same idempotency key) when its
/// turn is submitted again, but never after its result was shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_kills_at_any_point_lose_no_shown_result_and_run_no_at_most_once_call_twice() {
    const RUNS: usize = 6;
    const TURNS: u32 = 6;
    let mut kernel = Kernel::start();
    let _w1 = kernel.fault_worker("w1");
    let _w2 = kernel.fault_worker("w2");
    kernel.wait_for_workers("charge", 2).await;
    let calls = vec![
        call("sleepy", json!({"hold_ms": 1})),
        call("charge", json!({"hold_ms": 1})),
        call("sleepy", json!({"hold_ms": 4})),
    ];
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        runs.push(kernel.create_run("kills").await);
    }
    let agents: Vec<_> = runs
        .iter()
        .map(|run| {
            let to = (kernel.url(), kernel.ledger_file());
            tokio::spawn(agent_through_kills(to, run.clone(), TURNS, calls.clone()))
        })
        .collect();
    let all = RUNS * TURNS as usize * calls.len();
    for kill in 1..=4 {
        let starts = all * kill / 6;
        wait_ledger(&kernel, &format!("{starts} starts"), |l| {
            l.iter().filter(|l| l.what == "start").count() >= starts
        })
        .await;
        kernel.restart();
    }

    let mut indeterminate = 0;
    for (run, agent) in runs.iter().zip(agents) {
        let shown = agent.await.unwrap();
        // Each recorded call's idempotency key, by step key.
        let keys: std::collections::HashMap<String, String> = kernel
            .get(run)
            .await
            .steps
            .into_iter()
            .map(|s| (s.step_key, s.idempotency_key))
            .collect();
        assert_eq!(
            keys.len(),
            TURNS as usize * calls.len(),
            "every call of {run} is recorded"
        );
        let ledger = kernel.ledger();
        for (turn, result, seen) in &shown.results {
            let key = keys.get(&result.step_key).unwrap_or_else(|| {
                panic!(
                    "turn {turn}: a shown result's step {} is not in the log",
                    result.step_key
                )
            });
            let kept = &shown.turns[*turn as usize][result.position as usize];
            assert_eq!(
                (kept.status, &kept.content, kept.attempts),
                (result.status, &result.content, result.attempts),
                "a result shown before a kill is the one the log keeps ({})",
                result.step_key
            );
            assert!(
                !ledger[*seen..].iter().any(|l| l.what == "start" && &l.key == key),
                "{} ran again after its result was shown",
                result.step_key
            );
        }
        for (turn, results) in shown.turns.iter().enumerate() {
            for result in results {
                if result.position == 1 {
                    let key = &keys[&result.step_key];
                    indeterminate += usize::from(charge_became_indeterminate(&kernel, result, key));
                } else {
                    assert_eq!(result.status, pb::CallStatus::Ok as i32, "turn {turn}: {result:?}");
                }
            }
        }
        check_log(&kernel.events(run).await, true);
    }
    eprintln!(
        "{indeterminate} of {} charges were in flight at a kill and became indeterminate",
        RUNS * TURNS as usize
    );
}
