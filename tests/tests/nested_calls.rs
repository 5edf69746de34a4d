//! A tool calling a tool through the kernel (`ctx.call`), with real processes: the fault worker's
//! `relay` (read-only itself) calls the tool its arguments name and returns how that call ended.
//! The nested call is a step of the run under its caller, checked against its own declaration
//! (a gated `refund` waits for a person; a branch refuses a write its parent never recorded),
//! recorded once across a replay and a kernel SIGKILL, and cancelled with its caller.

use e2e::{Kernel, Watch, call, check_log, submit, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

fn relay(tool: &str, arguments: Value) -> pb::ToolCall {
    call("relay", json!({ "tool": tool, "arguments": arguments }))
}

/// What `relay` returned: how the nested call ended.
fn relayed(result: &pb::CallResult) -> Value {
    assert_eq!(result.outcome, pb::CallOutcome::Ok as i32, "{result:?}");
    serde_json::from_str(&result.content).unwrap()
}

fn step<'a>(run: &'a pb::GetRunResponse, key: &str) -> &'a pb::Step {
    run.steps
        .iter()
        .find(|s| s.step_key == key)
        .unwrap_or_else(|| panic!("no step {key} in {:#?}", run.steps))
}

fn starts(kernel: &Kernel, tool: &str) -> usize {
    kernel
        .ledger()
        .iter()
        .filter(|l| l.tool == tool && l.what == "start")
        .count()
}

#[tokio::test]
async fn a_tool_calls_a_tool_recorded_under_it_and_a_replay_runs_neither_again() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("relay", 1).await;
    let run = kernel.create_run("nesting").await;
    let turn = vec![relay("lookup", json!({"q": "order 9", "hold_ms": 0}))];
    let done = submit(&kernel, &run, 0, turn.clone()).await.unwrap();
    let nested = relayed(&done.results[0]);
    assert_eq!(nested["outcome"], "ok", "{nested}");
    assert_eq!(nested["output"], "found order 9");
    assert_eq!(nested["step_key"], "call:t0/p0#0");

    let got = kernel.get(&run).await;
    let caller = step(&got, "t0/p0");
    let callee = step(&got, "call:t0/p0#0");
    assert_eq!(callee.caller_step_key, "t0/p0");
    assert_eq!(caller.caller_step_key, "");
    assert_eq!((callee.tool.as_str(), callee.turn, callee.position), ("lookup", 0, 0));
    assert_eq!(callee.status, pb::StepStatus::Succeeded as i32);
    assert_ne!(callee.idempotency_key, caller.idempotency_key);
    assert_eq!(
        got.run.as_ref().unwrap().tool_calls,
        2,
        "the nested call counts as a call of the run"
    );

    // The agent's turn again: both results come from the log, and no body runs again.
    let again = submit(&kernel, &run, 0, turn).await.unwrap();
    assert!(again.results[0].replayed, "{:?}", again.results[0]);
    assert_eq!((starts(&kernel, "relay"), starts(&kernel, "lookup")), (1, 1));

    // `runs show` prints the nested call under its caller.
    let shown = kernel.kernelctl_ok(&["runs", "show", &run]);
    let caller_line = shown.lines().position(|l| l.contains("t0/p0") && l.contains("relay"));
    let callee_line = shown
        .lines()
        .position(|l| l.contains("call:t0/p0#0") && l.contains("lookup"));
    match (caller_line, callee_line) {
        (Some(caller), Some(callee)) => assert!(callee > caller, "{shown}"),
        _ => panic!("both calls in:\n{shown}"),
    }
    assert!(shown.contains("└"), "the callee is drawn under its caller:\n{shown}");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_tool_calling_a_gated_tool_waits_for_a_person_and_its_body_reads_the_rejection() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("relay", 1).await;
    let run = kernel.create_run("nesting").await;
    let turn = e2e::submit_in_background(&kernel, &run, 0, vec![relay("refund", json!({"cents": 50_000}))]);
    let mut watch = Watch::open(&kernel, &run, 0, false).await;
    let interrupted = watch.event("run:interrupted", |p| p["reason"] == "tool_approval").await;
    assert_eq!(interrupted["step_key"], "call:t0/p0#0", "{interrupted}");
    let asked = kernel
        .pending_approvals()
        .await
        .into_iter()
        .find(|a| a.run_id == run)
        .expect("the nested call's approval");
    assert_eq!(
        (asked.tool.as_str(), asked.step_key.as_str()),
        ("refund", "call:t0/p0#0")
    );
    assert!(!asked.question, "an approval of the call, not a question: {asked:?}");
    assert_eq!(
        kernel.get(&run).await.run.unwrap().status,
        pb::RunStatus::Blocked as i32,
        "the run waits for the person"
    );
    kernel.kernelctl_ok(&[
        "approvals",
        "reject",
        &asked.id,
        "--as",
        "alice",
        "--reason",
        "too much",
    ]);

    let done = turn.await.unwrap();
    let nested = relayed(&done.results[0]);
    assert_eq!(nested["outcome"], "rejected", "{nested}");
    assert_eq!(nested["rejected_by"], "alice");
    assert_eq!(starts(&kernel, "refund"), 0, "a rejected call never runs");
    let got = kernel.get(&run).await;
    let callee = step(&got, "call:t0/p0#0");
    assert_eq!(callee.outcome, pb::CallOutcome::Rejected as i32);
    assert_eq!(callee.approval.as_ref().unwrap().decider, "alice");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_branch_replays_a_recorded_nested_write_and_refuses_one_its_parent_never_made() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("relay", 1).await;
    let parent = kernel.create_run("nesting").await;
    submit(&kernel, &parent, 0, vec![call("whoami", json!({}))])
        .await
        .unwrap();
    let refund = relay("refund", json!({"cents": 500}));
    let done = submit(&kernel, &parent, 1, vec![refund.clone()]).await.unwrap();
    assert_eq!(relayed(&done.results[0])["outcome"], "ok");
    kernel.complete(&parent).await;
    assert_eq!(starts(&kernel, "refund"), 1);

    // A branch of the whole record replays the relay and what it called.
    let whole = fork(&kernel, &[&parent]);
    let replayed = submit(&kernel, &whole, 1, vec![refund.clone()]).await.unwrap();
    assert_eq!(relayed(&replayed.results[0])["output"], "refunded 500 cents");
    assert_eq!(starts(&kernel, "refund"), 1, "replayed, not run");

    // A branch forked before turn 1 runs the read-only relay live, but not the write it calls:
    // the branch ends, and refund's body never runs.
    let early = fork(&kernel, &[&parent, "--at", "t0/p0"]);
    let refused = submit(&kernel, &early, 1, vec![refund]).await.unwrap();
    assert_ne!(refused.results[0].outcome, pb::CallOutcome::Ok as i32, "{refused:?}");
    let ended = kernel.finished(&early).await;
    assert_eq!(ended.status, pb::RunStatus::Failed as i32, "{ended:?}");
    assert!(ended.reason.contains("write_tool_blocked"), "{}", ended.reason);
    assert!(ended.reason.contains("refund"), "{}", ended.reason);
    assert_eq!(starts(&kernel, "refund"), 1, "the branch never ran the write");
    let got = kernel.get(&early).await;
    let callee = step(&got, "call:t1/p0#0");
    assert_eq!(callee.outcome, pb::CallOutcome::WriteToolBlocked as i32, "{callee:?}");
}

/// Makes a branch with `kernelctl runs fork`, returning its id.
fn fork(kernel: &Kernel, args: &[&str]) -> String {
    let mut all = vec!["runs", "fork"];
    all.extend_from_slice(args);
    kernel.kernelctl_ok(&all).trim().to_owned()
}

#[tokio::test]
async fn cancelling_the_caller_cancels_the_call_it_made_on_its_worker() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("relay", 1).await;
    let run = kernel.create_run("nesting").await;
    let turn = e2e::submit_in_background(&kernel, &run, 0, vec![relay("sleepy", json!({"hold_ms": 60_000}))]);
    wait_ledger(&kernel, "sleepy to start", |ledger| {
        ledger.iter().any(|l| l.tool == "sleepy" && l.what == "start")
    })
    .await;
    kernel.kernelctl_ok(&["runs", "cancel-call", &run, "t0/p0", "--reason", "not needed"]);
    let done = turn.await.unwrap();
    assert_eq!(done.results[0].outcome, pb::CallOutcome::Cancelled as i32);
    let got = kernel.get(&run).await;
    let callee = step(&got, "call:t0/p0#0");
    assert_eq!(callee.status, pb::StepStatus::Cancelled as i32, "{callee:?}");
    assert!(callee.error.contains("call t0/p0 settled"), "{}", callee.error);
    // Its worker was told: the lease ends long before sleepy's minute is up.
    e2e::eventually("no call to hold a lease", || async {
        let status = kernel.status().await;
        if status.leased_calls == 0 && status.queued_calls == 0 {
            Ok(())
        } else {
            Err(status)
        }
    })
    .await;
}

#[tokio::test]
async fn a_nested_call_in_flight_across_a_kernel_sigkill_is_recorded_once_and_reaches_its_caller() {
    let mut kernel = Kernel::start();
    let worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("relay", 1).await;
    let run = kernel.create_run("nesting").await;
    let calls = vec![relay("sleepy", json!({"hold_ms": 1_500}))];
    // Killed once both bodies have started: the relay's and the sleepy it called.
    let done = kernel.turn_across_a_sigkill(&run, calls, worker, 2).await;
    let nested = relayed(&done.results[0]);
    assert_eq!(nested["outcome"], "ok", "{nested}");
    assert_eq!(nested["output"], "slept 1500ms");
    let got = kernel.get(&run).await;
    let nested: Vec<&pb::Step> = got.steps.iter().filter(|s| !s.caller_step_key.is_empty()).collect();
    assert_eq!(nested.len(), 1, "one nested call, whatever ran again: {nested:#?}");
    assert_eq!(nested[0].step_key, "call:t0/p0#0");
    check_log(&kernel.events(&run).await, true);
}
