//! Subagents, sessions and suspension with real processes: the fault worker's `parent` and
//! `child` agents, hosted on workers with few slots.

use e2e::{Kernel, assert_kept_its_one_dispatch, check_log, payload, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

/// The child runs of `parent`, oldest first.
async fn children(kernel: &Kernel, parent: &str) -> Vec<pb::Run> {
    let mut children: Vec<pb::Run> = kernel
        .list_runs("")
        .await
        .into_iter()
        .filter(|r| r.parent_run_id == parent)
        .collect();
    children.sort_by(|a, b| a.id.cmp(&b.id));
    children
}

#[tokio::test]
async fn a_one_slot_worker_hosts_a_parent_and_its_child_by_suspending_the_parent() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "1"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "one", "hold_ms": 50}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["label"], "only");
    assert!(done.suspensions >= 1, "the parent gave back the only slot: {done:?}");
    let kids = children(&kernel, &run).await;
    assert_eq!(kids.len(), 1, "one child, never a second: {kids:?}");
    assert_eq!(kids[0].parent_step_key, "subagent:child#0");
    assert_eq!(output["run_id"], kids[0].id);
    let events = kernel.events(&run).await;
    check_log(&events, true);
    for kind in ["subagent:start", "agent:suspended", "agent:resumed", "subagent:result"] {
        assert!(events.iter().any(|e| e.r#type == kind), "{kind}: {events:?}");
    }
    let created = kernel.events(&kids[0].id).await;
    assert_eq!(
        payload(&created[0])["parent_run_id"],
        run.as_str(),
        "events carry the parent"
    );

    let tree = kernel.kernelctl(&["runs", "tree", &run]);
    let tree = String::from_utf8_lossy(&tree.stdout);
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 2, "{tree}");
    assert!(lines[0].starts_with(&format!("{run} parent completed")), "{tree}");
    assert!(
        lines[1].starts_with(&format!("  {} child completed", kids[0].id)),
        "{tree}"
    );
    let listed = kernel.kernelctl(&["runs", "list", "--parent", &run]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&kids[0].id) && !listed.contains(&format!("{run} ")),
        "{listed}"
    );
    let shown = kernel.kernelctl(&["runs", "show", &run]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    for part in [
        "hosted",
        "suspended 1 times",
        "agent:parent",
        "subagent:child",
        "child run",
    ] {
        assert!(shown.contains(part), "{part} in\n{shown}");
    }
}

#[tokio::test]
async fn three_subagents_at_once_on_a_two_slot_worker_all_finish() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "2"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "many", "n": 3, "hold_ms": 100}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Vec<Value> = serde_json::from_str(&done.output_json).unwrap();
    let labels: Vec<&Value> = output.iter().map(|o| &o["label"]).collect();
    assert_eq!(labels, [&json!(0), &json!(1), &json!(2)]);
    assert_eq!(children(&kernel, &run).await.len(), 3);
    let ledger = kernel.ledger();
    assert_eq!(
        ledger.iter().filter(|l| l.tool == "step:work").count(),
        3,
        "each child's step ran once: {ledger:?}"
    );
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn subagents_on_one_session_run_one_at_a_time_each_seeing_the_previous_output() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "4"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "session", "n": 3, "hold_ms": 200}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Vec<Value> = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output[0]["previous"], Value::Null, "{output:?}");
    assert_eq!(output[1]["previous"]["label"], 0, "{output:?}");
    assert_eq!(output[2]["previous"]["label"], 1, "{output:?}");
    // One at a time: each child started after the one before it ended.
    let kids = children(&kernel, &run).await;
    assert_eq!(kids.len(), 3);
    assert!(kids.iter().all(|k| k.session_key == format!("child:{run}")), "{kids:?}");
    let mut previous_end = None;
    for kid in &kids {
        let events = kernel.events(&kid.id).await;
        let started = events
            .iter()
            .find(|e| e.r#type == "agent:dispatched")
            .expect("dispatched");
        let ended = events.iter().find(|e| e.r#type == "run:completed").expect("completed");
        if let Some(end) = previous_end {
            assert!(
                timestamp(started) >= end,
                "a session run started before the one before it ended"
            );
            // Started together, the later ones waited, and their logs say for what.
            let kinds: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
            let waited = events
                .iter()
                .position(|e| e.r#type == "agent:suspended")
                .unwrap_or_else(|| panic!("a run that waited for its session says so: {kinds:?}"));
            assert_eq!(
                payload(&events[waited])["session"],
                kid.session_key.as_str(),
                "{kinds:?}"
            );
            let woken = kinds.iter().position(|k| *k == "agent:resumed").expect("woken");
            let dispatched = kinds.iter().position(|k| *k == "agent:dispatched").unwrap();
            assert!(waited < woken && woken < dispatched, "{kinds:?}");
        }
        previous_end = Some(timestamp(ended));
        check_log(&events, true);
    }
}

fn timestamp(event: &pb::Event) -> i128 {
    let at = event.at.as_ref().expect("at");
    i128::from(at.seconds) * 1_000_000_000 + i128::from(at.nanos)
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_child_first() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "2"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "one", "hold_ms": 60_000}))
        .await;
    wait_ledger(&kernel, "the child's step", |l| l.iter().any(|l| l.tool == "step:work")).await;
    let cancel = pb::CancelRunRequest {
        run_id: run.clone(),
        reason: "operator".into(),
    };
    kernel.runs().await.cancel_run(cancel).await.expect("cancel");
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Cancelled as i32);
    let kids = children(&kernel, &run).await;
    assert_eq!(kids[0].status, pb::RunStatus::Cancelled as i32, "{kids:?}");
    assert!(kids[0].reason.contains(&format!("parent run {run} ended")), "{kids:?}");
    let child_end = kernel.events(&kids[0].id).await;
    let parent_end = kernel.events(&run).await;
    let child_at = timestamp(child_end.iter().find(|e| e.r#type == "run:cancelled").unwrap());
    let parent_at = timestamp(parent_end.iter().find(|e| e.r#type == "run:cancelled").unwrap());
    assert!(child_at <= parent_at, "the child ends first");
    check_log(&parent_end, true);
    check_log(&child_end, true);
}

#[tokio::test]
async fn a_hosted_run_waiting_for_approval_is_suspended_and_holds_no_slot() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "1"]);
    let run = kernel.start_hosted("parent", json!({"mode": "approval"})).await;
    let suspended = kernel.wait_status(&run, |s| s == pb::RunStatus::Suspended).await;
    assert_eq!(suspended.suspensions, 1);
    let workers = kernel
        .registry()
        .await
        .list_workers(pb::ListWorkersRequest {})
        .await
        .unwrap()
        .into_inner()
        .workers;
    let host = workers.iter().find(|w| w.name == "host").expect("host");
    assert_eq!(host.slots_in_use, 0, "a suspended run holds no slot: {host:?}");
    let approvals = kernel.kernelctl(&["approvals", "list", "--json"]);
    let listed = String::from_utf8_lossy(&approvals.stdout);
    let id = listed
        .split('"')
        .skip_while(|part| *part != "id")
        .nth(2)
        .expect("an approval id")
        .to_owned();
    let approved = kernel.kernelctl(&["approvals", "approve", "--as", "tester", &id]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["outcome"], "ok", "{output}");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_tool_call_inside_a_step_fails_with_the_nested_operation_error() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let run = kernel.start_hosted("parent", json!({"mode": "nested"})).await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Failed as i32, "{done:?}");
    assert!(
        done.reason.contains("a tool call inside a local step"),
        "{}",
        done.reason
    );
}

/// A handler's turn of three tool calls, each starting a subagent, on one worker with two slots
/// that offers the tools and hosts the agents: the handler gives back its slot while the calls
/// run, and each call gives back its slot while its child runs, so nothing deadlocks.
#[tokio::test]
async fn three_concurrent_tool_calls_each_start_a_subagent_on_a_two_slot_worker() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker_with("both", &["--with-agents", "--max-concurrency", "2"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "tools", "n": 3, "hold_ms": 50}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Vec<Value> = serde_json::from_str(&done.output_json).unwrap();
    let labels: Vec<&Value> = output.iter().map(|o| &o["label"]).collect();
    assert_eq!(labels, [&json!("0"), &json!("1"), &json!("2")], "{output:?}");
    let kids = children(&kernel, &run).await;
    assert_eq!(kids.len(), 3, "one child per call, never a second: {kids:?}");
    for kid in &kids {
        assert!(kid.parent_step_key.starts_with("subagent:t0/p"), "{kid:?}");
    }
    let events = kernel.events(&run).await;
    check_log(&events, true);
    assert!(
        events.iter().any(|e| e.r#type == "tool:suspended"),
        "a call gave back its slot"
    );
    let ledger = kernel.ledger();
    assert_eq!(
        ledger.iter().filter(|l| l.tool == "step:work").count(),
        3,
        "each child's step ran once: {ledger:?}"
    );
}

/// A child that fails is its starting tool body's fatal error: the call fails, never retried,
/// with the child's run and reason in the text the model reads.
#[tokio::test]
async fn a_tool_body_s_failed_subagent_fails_its_call_without_a_retry() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker_with("both", &["--with-agents"]);
    kernel.wait_for_workers("delegate", 1).await;
    let run = kernel.create_run("delegating").await;
    let args = json!({"label": "x", "hold_ms": 0, "fail": "no sources"});
    let outcome = e2e::submit(&kernel, &run, 0, vec![e2e::call("delegate", args)])
        .await
        .expect("the turn is taken");
    let result = &outcome.results[0];
    assert_eq!(result.outcome, pb::CallOutcome::ToolError as i32, "{result:?}");
    assert!(
        result.content.starts_with("subagent 'child' (run ") && result.content.ends_with("failed: no sources"),
        "{}",
        result.content
    );
    let steps = kernel.get(&run).await.steps;
    let call = steps.iter().find(|s| s.tool == "delegate").expect("the call");
    assert_eq!(call.attempts, 1, "fatal: never retried");
    let child = steps
        .iter()
        .find(|s| s.step_key.starts_with("subagent:"))
        .expect("the child's step");
    assert_eq!(child.status, pb::StepStatus::Failed as i32, "{child:?}");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_hosted_turn_with_a_bound_runs_its_calls_one_at_a_time_in_position_order() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker_with("both", &["--with-agents"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "bounded", "n": 3, "hold_ms": 30}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Vec<String> = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output, ["pushed to r0", "pushed to r1", "pushed to r2"]);
    let ledger = kernel.ledger();
    let order: Vec<&str> = ledger
        .iter()
        .filter(|l| l.tool == "push")
        .map(|l| l.what.as_str())
        .collect();
    assert_eq!(
        order,
        ["lock:r0", "unlock:r0", "lock:r1", "unlock:r1", "lock:r2", "unlock:r2"],
        "one at a time, in position order"
    );
    let steps = kernel.get(&run).await.steps;
    assert!(
        steps
            .iter()
            .filter(|s| s.tool == "push")
            .all(|s| s.max_concurrency == 1),
        "{steps:?}"
    );
    assert_eq!(
        kernel.status().await.lost_calls_found,
        0,
        "the handler's own dispatch is not one of the turn's calls"
    );
    // Counted as one of them, it would hold the turn's only place until the handler suspends.
    let events = kernel.events(&run).await;
    assert!(
        events.iter().all(|e| e.r#type != "agent:suspended"),
        "the calls waited for the handler to give back its slot"
    );
}

/// A suspension that crosses a settle is refused, and the handler goes on where it waits: the
/// result it awaited reaches it, and it completes its run on its first dispatch.
#[tokio::test]
async fn a_handler_whose_suspension_crosses_a_settle_is_refused_and_goes_on() {
    let kernel = Kernel::start();
    let worker = kernel.fault_worker_with("both", &["--with-agents"]);
    // The second call settles at once but the turn's results come in position order, and the
    // first outlasts the handler's patience: it suspends with a settled call among those it waits
    // on, which the kernel refuses, leaving it the dispatch.
    let run = kernel
        .start_hosted("parent", json!({"mode": "uneven", "holds": [1_600, 1]}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let refused = worker.log.wait_for("suspension refused, the dispatch goes on here");
    assert!(refused.contains("t0/p1 has settled"), "{refused}");
    let events = kernel.events(&run).await;
    assert_kept_its_one_dispatch(&events);
    check_log(&events, true);
    assert_eq!(
        kernel.status().await.lost_calls_found,
        0,
        "the handler kept its dispatch; nothing was left for the in-flight scan"
    );
}

#[tokio::test]
async fn a_handler_waiting_on_a_long_call_suspends_once_and_is_woken_by_its_result() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker_with("both", &["--with-agents"]);
    let run = kernel
        .start_hosted("parent", json!({"mode": "uneven", "holds": [1, 2_500]}))
        .await;
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let events = kernel.events(&run).await;
    let suspensions: Vec<_> = events.iter().filter(|e| e.r#type == "agent:suspended").collect();
    assert_eq!(suspensions.len(), 1, "{suspensions:?}");
    let suspended = payload(suspensions[0]);
    // The first call's result is in hand: waiting on it would send the run out again at once.
    assert_eq!(suspended["waiting_on"], json!(["t0/p1"]), "{suspended}");
    assert_eq!(suspended["next"], "wait");
    let dispatches = events.iter().filter(|e| e.r#type == "agent:dispatched").count();
    assert_eq!(dispatches, 2, "dispatched, then woken once by the long call's result");
    check_log(&events, true);
}
