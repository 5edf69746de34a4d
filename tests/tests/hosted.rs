//! Hosted runs with real processes: the `pipeline` agent of the fault worker (rounds of a local
//! step and a `sleepy` call) hosted on one worker while another serves the tool, its host or the
//! kernel killed mid-run. The ledger says how often each tool body and step closure really ran.

use std::collections::HashMap;

use e2e::{Kernel, LedgerLine, check_log, payload, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

fn starts<'a>(ledger: &'a [LedgerLine], what: &str) -> Vec<&'a LedgerLine> {
    ledger.iter().filter(|l| l.what == "start" && l.tool == what).collect()
}

/// Each key that ran, with how often.
fn by_key(lines: &[&LedgerLine]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        *counts.entry(line.key.clone()).or_default() += 1;
    }
    counts
}

/// Idempotency keys of the local steps recorded so far.
async fn recorded_steps(kernel: &Kernel, run: &str) -> Vec<String> {
    kernel
        .events(run)
        .await
        .iter()
        .filter(|e| e.r#type == "step:result")
        .map(|e| payload(e)["idempotency_key"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until the host has started the `prep` step of round `round` (0-based): by then the
/// tool calls of the rounds before it are recorded and none is in flight.
async fn wait_for_prep(kernel: &Kernel, round: usize) {
    wait_ledger(kernel, "the prep step of the round", |l| {
        starts(l, "step:prep").len() > round
    })
    .await;
}

fn assert_ran_once_each(kernel: &Kernel, recorded_before: &[String], rounds: usize) {
    let ledger = kernel.ledger();
    let calls = by_key(&starts(&ledger, "sleepy"));
    assert_eq!(calls.len(), rounds, "one sleepy call per round: {ledger:?}");
    assert!(calls.values().all(|n| *n == 1), "each tool call ran once: {calls:?}");
    let steps = by_key(&starts(&ledger, "step:prep"));
    assert_eq!(steps.len(), rounds, "one prep step per round: {steps:?}");
    for key in recorded_before {
        assert_eq!(
            steps[key], 1,
            "a step recorded before the kill never runs again: {steps:?}"
        );
    }
}

#[tokio::test]
async fn a_hosted_run_whose_worker_is_killed_resumes_on_another_and_runs_nothing_twice() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let mut host1 = kernel.fault_worker_with("host1", &["--agents-only"]);
    let run = kernel
        .start_hosted("pipeline", json!({"calls": 4, "hold_ms": 300}))
        .await;
    // After its second tool call, the handler is in the third round's step.
    wait_for_prep(&kernel, 2).await;
    let recorded = recorded_steps(&kernel, &run).await;
    host1.kill9();
    let _host2 = kernel.fault_worker_with("host2", &["--agents-only"]);
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&done.output_json).unwrap(),
        json!({"rounds": 4, "total": 60})
    );
    assert!(done.dispatches >= 2, "the run was dispatched again: {done:?}");
    assert_ran_once_each(&kernel, &recorded, 4);
    let events = kernel.events(&run).await;
    check_log(&events, true);
    let dispatches: Vec<&pb::Event> = events.iter().filter(|e| e.r#type == "agent:dispatched").collect();
    assert_eq!(payload(dispatches.last().unwrap())["worker"], "host2", "{dispatches:?}");
    assert!(events.iter().any(|e| e.r#type == "agent:lease_lost"));
}

#[tokio::test]
async fn a_hosted_run_survives_a_kernel_kill_and_runs_nothing_twice() {
    let mut kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let run = kernel
        .start_hosted("pipeline", json!({"calls": 3, "hold_ms": 500}))
        .await;
    wait_for_prep(&kernel, 1).await;
    let recorded = recorded_steps(&kernel, &run).await;
    kernel.kill9();
    kernel.restart();
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    assert_ran_once_each(&kernel, &recorded, 3);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_handler_that_is_not_deterministic_fails_with_replay_input_changed_naming_the_step() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let mut host1 = kernel.fault_worker_with("host1", &["--agents-only"]);
    let run = kernel
        .start_hosted("pipeline", json!({"calls": 3, "hold_ms": 300, "diverge": true}))
        .await;
    wait_for_prep(&kernel, 1).await;
    host1.kill9();
    let _host2 = kernel.fault_worker_with("host2", &["--agents-only"]);
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Failed as i32, "{done:?}");
    assert!(
        done.reason.starts_with("replay_input_changed") && done.reason.contains("t1/p0"),
        "the reason names the place that changed: {}",
        done.reason
    );
    let ledger = kernel.ledger();
    assert_eq!(
        starts(&ledger, "sleepy").len(),
        1,
        "the changed call never ran: {ledger:?}"
    );
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_hosted_run_takes_no_turn_from_outside_its_handler_and_no_complete() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let run = kernel
        .start_hosted("pipeline", json!({"calls": 1, "hold_ms": 60_000}))
        .await;
    wait_for_prep(&kernel, 0).await;
    let turn = pb::SubmitTurnRequest {
        run_id: run.clone(),
        turn: 5,
        calls: vec![e2e::call("sleepy", json!({"hold_ms": 1}))],
        offered_tools: Vec::new(),
        max_concurrency: 0,
    };
    let refused = kernel.calls().await.submit_turn(turn).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("only its handler"), "{refused:?}");
    let complete = pb::CompleteRunRequest {
        run_id: run.clone(),
        output_json: "1".into(),
    };
    let refused = kernel.runs().await.complete_run(complete).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    // Cancelling settles the run's dispatch (the handler is dropped on its worker).
    let cancel = pb::CancelRunRequest {
        run_id: run.clone(),
        reason: "test".into(),
    };
    kernel.runs().await.cancel_run(cancel).await.expect("cancel");
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Cancelled as i32);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn kernelctl_starts_a_hosted_run_and_follows_it_to_its_end() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let started = kernel.kernelctl(&[
        "runs",
        "start",
        "pipeline",
        "--input",
        r#"{"calls": 2, "hold_ms": 10}"#,
        "--label",
        "tenant=acme",
        "--follow",
    ]);
    let stdout = String::from_utf8_lossy(&started.stdout);
    let stderr = String::from_utf8_lossy(&started.stderr);
    assert!(started.status.success(), "{stdout}\n{stderr}");
    let labelled = kernel.kernelctl_ok(&["runs", "list", "--label", "tenant=acme", "--json"]);
    let labelled: serde_json::Value = serde_json::from_str(&labelled).unwrap();
    assert_eq!(
        labelled["runs"].as_array().map(|runs| runs.len()),
        Some(1),
        "the run carries its label: {labelled}"
    );
    for event in [
        "run:created",
        "agent:dispatched",
        "step:result",
        "tool:result",
        "agent:result",
        "run:completed",
    ] {
        assert!(stdout.contains(event), "{event} in\n{stdout}");
    }
    assert!(stderr.contains("completed"), "{stderr}");
    let workers = kernel.kernelctl(&["workers", "list"]);
    let workers = String::from_utf8_lossy(&workers.stdout);
    assert!(
        workers.contains("5: child, interviewer, parent, pipeline"),
        "the host's agents are listed: {workers}"
    );
    let unknown = kernel.kernelctl(&["runs", "start", "nosuch", "--input", "{}"]);
    assert_eq!(unknown.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("no worker offers or has offered agent 'nosuch'"),
        "{stderr}"
    );
}

/// The README's quickstart: the demo worker's `trip_planner`, its worker SIGKILLed while the slow
/// call runs, finishes on another worker; the model was asked once and each note taken once.
#[tokio::test]
async fn the_demo_trip_planner_survives_a_sigkill_of_its_worker() {
    let kernel = Kernel::start();
    let mut first = kernel.worker("demo-1");
    let started = kernel.kernelctl(&[
        "runs",
        "start",
        "trip_planner",
        "--input",
        r#"{"destination": "Lisbon", "days": 3}"#,
    ]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let run = String::from_utf8_lossy(&started.stdout).trim().to_owned();
    let mut watch = e2e::Watch::open(&kernel, &run, 1, false).await;
    watch.event("tool:start", |body| body["tool"] == "slow").await;
    first.kill9();
    let _second = kernel.worker("demo-2");
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(
        output["notes"],
        json!(["book a hotel in Lisbon", "pack light"]),
        "{output}"
    );
    assert!(
        output["summary"].as_str().unwrap().starts_with("3 days and 4 nights"),
        "{output}"
    );
    let events = kernel.events(&run).await;
    check_log(&events, true);
    let recorded = |key: &str| {
        events
            .iter()
            .filter(|e| e.r#type == "step:result" && payload(e)["step_key"] == key)
            .count()
    };
    assert_eq!(recorded("step:model:plan#0"), 1, "the model was asked once");
    let model_at = events
        .iter()
        .find(|e| e.r#type == "step:result" && payload(e)["step_key"] == "step:model:plan#0")
        .map(|e| payload(e)["output"]["asked_at_ms"].clone())
        .unwrap();
    assert_eq!(
        output["plan_asked_at_ms"], model_at,
        "the replay got the recorded answer"
    );
    let starts = |tool: &str| {
        events
            .iter()
            .filter(|e| e.r#type == "tool:start" && payload(e)["tool"] == tool)
            .count()
    };
    assert_eq!((starts("add"), starts("echo")), (1, 1), "finished calls ran once");
    assert_eq!(starts("slow"), 2, "the call running on the killed worker ran again");
    let subagents = events.iter().filter(|e| e.r#type == "subagent:start").count();
    assert_eq!(subagents, 2, "one note taker per note, never a second");
    assert!(events.iter().any(|e| e.r#type == "agent:lease_lost"));
}

/// A policy rule on `step:<id>` denies a local step before it runs; the handler sees the denial
/// as an error (here it returns it), and the denial is recorded, so a replay gets it again.
#[tokio::test]
async fn a_policy_denies_a_local_step_before_it_runs() {
    let policy = r#"
default: allow
rules:
  - id: no-prep
    match: { tools: ["step:prep"] }
    decision: deny
    reason: "prep is done by hand"
"#;
    let kernel = Kernel::start_with(e2e::KernelOptions {
        policy: Some(policy.into()),
        ..Default::default()
    });
    let _tools = kernel.fault_worker("tools");
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let run = kernel
        .start_hosted("pipeline", json!({"calls": 2, "hold_ms": 10}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Failed as i32, "{done:?}");
    assert!(
        done.reason
            .contains("step:prep not allowed. reason: prep is done by hand"),
        "{}",
        done.reason
    );
    let ledger = kernel.ledger();
    assert!(
        starts(&ledger, "step:prep").is_empty(),
        "the denied step never ran: {ledger:?}"
    );
    let steps = kernel.get(&run).await.steps;
    let denied = steps
        .iter()
        .find(|s| s.step_key == "step:prep#0")
        .expect("the denial is recorded");
    assert_eq!(denied.outcome, pb::CallOutcome::Denied as i32);
    assert_eq!(denied.decided_by, "rule:no-prep");
    check_log(&kernel.events(&run).await, true);
}
