//! Cancelling one call (`ToolCallService.CancelCall`, `kernelctl runs cancel-call`) while its run
//! goes on, and idle runs failed as abandoned (`--abandon-runs-after-ms`): a running call's worker
//! is told to stop, a gated call's question is withdrawn, each call ends with one `tool:result`,
//! and a refusal writes nothing.

use e2e::{Kernel, KernelOptions, Watch, call, check_log, submit};
use kernel_proto::v1 as pb;
use serde_json::json;
use tonic::Code;

fn cancel(run: &str, key: &str, reason: &str) -> pb::CancelCallRequest {
    pb::CancelCallRequest {
        run_id: run.into(),
        step_key: key.into(),
        reason: reason.into(),
    }
}

#[tokio::test]
async fn a_running_call_is_cancelled_alone_and_its_run_takes_the_next_turn() {
    let kernel = Kernel::start();
    let worker = kernel.worker("w1");
    let run = kernel.create_run("canceller").await;
    let mut watch = Watch::open(&kernel, &run, 0, false).await;
    let turn = e2e::submit_in_background(
        &kernel,
        &run,
        0,
        vec![call("slow", json!({"steps": 600, "delay_ms": 100}))],
    );
    watch.event("tool:start", |_| true).await;

    let mut calls = kernel.calls().await;
    let step = calls
        .cancel_call(cancel(&run, "t0/p0", "the user moved on"))
        .await
        .expect("cancel the call")
        .into_inner()
        .step
        .expect("the step");
    assert_eq!(step.status, pb::StepStatus::Cancelled as i32, "{step:?}");
    assert_eq!(step.outcome, pb::CallOutcome::Cancelled as i32, "{step:?}");

    // The turn waiting on it hears the one result; the worker is told to stop.
    let outcome = turn.await.unwrap();
    assert_eq!(outcome.results.len(), 1, "{outcome:?}");
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Cancelled as i32, "{result:?}");
    assert_eq!(result.content, "cancelled: the user moved on");
    let stopped = worker.log.wait_for("dispatch cancelled");
    assert!(stopped.contains("the user moved on"), "{stopped}");

    // The run goes on.
    let next = submit(&kernel, &run, 1, vec![call("add", json!({"a": 1, "b": 1}))])
        .await
        .unwrap();
    assert_eq!(next.results[0].content, "2");
    let shown = kernel.get(&run).await;
    assert_eq!(shown.run.unwrap().status, pb::RunStatus::Running as i32);

    // Refusals name what is wrong and write nothing.
    let before = kernel.events(&run).await.len();
    let again = calls.cancel_call(cancel(&run, "t0/p0", "twice")).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    assert!(again.message().contains("already cancelled"), "{again:?}");
    let done = calls.cancel_call(cancel(&run, "t1/p0", "late")).await.unwrap_err();
    assert_eq!(done.code(), Code::FailedPrecondition);
    assert!(done.message().contains("already succeeded"), "{done:?}");
    let unknown = calls.cancel_call(cancel(&run, "t9/p0", "x")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("t9/p0"), "{unknown:?}");
    let no_run = calls
        .cancel_call(cancel("0190a0f0-0000-7000-8000-000000000000", "t0/p0", "x"))
        .await
        .unwrap_err();
    assert_eq!(no_run.code(), Code::NotFound, "{no_run:?}");
    assert_eq!(kernel.events(&run).await.len(), before, "a refusal writes nothing");

    kernel.complete(&run).await;
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_call_waiting_for_a_person_is_cancelled_by_kernelctl_and_its_question_withdrawn() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("refunder").await;
    let mut watch = Watch::open(&kernel, &run, 0, false).await;
    let turn = e2e::submit_in_background(
        &kernel,
        &run,
        0,
        vec![call("refund", json!({"customer": "c1", "cents": 25_000}))],
    );
    watch.event("run:interrupted", |_| true).await;
    assert_eq!(
        kernel.get(&run).await.run.unwrap().status,
        pb::RunStatus::Blocked as i32
    );

    let out = kernel.kernelctl(&["runs", "cancel-call", &run, "t0/p0", "--reason", "not needed"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "cancelled");

    let outcome = turn.await.unwrap();
    let result = outcome.results.last().expect("a result");
    assert_eq!(result.status, pb::CallStatus::Cancelled as i32, "{result:?}");
    assert_eq!(result.content, "cancelled: not needed");
    // No question is left open, and the run runs again.
    watch.event("run:resumed", |_| true).await;
    let listed = kernel.pending_approvals().await;
    assert!(
        listed.iter().all(|a| a.status != pb::ApprovalStatus::Pending as i32),
        "{listed:?}"
    );
    let shown = kernel.get(&run).await;
    assert_eq!(shown.run.unwrap().status, pb::RunStatus::Running as i32);
    let next = submit(&kernel, &run, 1, vec![call("add", json!({"a": 2, "b": 2}))])
        .await
        .unwrap();
    assert_eq!(next.results[0].content, "4");
    kernel.complete(&run).await;
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_run_with_no_turn_for_the_limit_fails_as_abandoned_after_its_calls_settle() {
    let kernel = Kernel::start_with(KernelOptions {
        args: vec!["--abandon-runs-after-ms".into(), "2000".into()],
        ..Default::default()
    });
    let worker = kernel.worker("w1");

    // Waiting for a person is not abandonment.
    let blocked = kernel.create_run("waiting").await;
    let mut blocked_watch = Watch::open(&kernel, &blocked, 0, false).await;
    let _waiting = e2e::submit_in_background(
        &kernel,
        &blocked,
        0,
        vec![call("refund", json!({"customer": "c1", "cents": 25_000}))],
    );
    blocked_watch.event("run:interrupted", |_| true).await;

    let idle = kernel.create_run("gone").await;
    let mut watch = Watch::open(&kernel, &idle, 0, false).await;
    let _turn = e2e::submit_in_background(
        &kernel,
        &idle,
        0,
        vec![call("slow", json!({"steps": 600, "delay_ms": 100}))],
    );
    watch.event("tool:start", |_| true).await;

    let ended = kernel.finished(&idle).await;
    assert_eq!(ended.status, pb::RunStatus::Failed as i32, "{ended:?}");
    assert_eq!(ended.reason, "abandoned");
    let step = &kernel.get(&idle).await.steps[0];
    assert_eq!(step.status, pb::StepStatus::Cancelled as i32, "{step:?}");
    worker.log.wait_for("dispatch cancelled");
    let events = kernel.events(&idle).await;
    check_log(&events, true);
    assert_eq!(events.last().unwrap().r#type, "run:failed");
    kernel.process.log.wait_for("run abandoned");

    assert_eq!(
        kernel.get(&blocked).await.run.unwrap().status,
        pb::RunStatus::Blocked as i32,
        "a run waiting for a person is left waiting"
    );
}

#[tokio::test]
async fn the_rust_agent_client_cancels_one_call_of_its_run() {
    use worker_sdk::{AgentClient, Call, NewRun, Outcome};
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent.create_run(NewRun::new("sdk", json!({}))).await.unwrap();
    let mut watch = Watch::open(&kernel, run.id(), 0, false).await;
    let turn = tokio::spawn({
        let run = run.clone();
        async move {
            run.call_turn(0, vec![Call::new("slow", json!({"steps": 600, "delay_ms": 100}))])
                .await
        }
    });
    watch.event("tool:start", |_| true).await;
    let step = run.cancel_call("t0/p0", "enough").await.unwrap();
    assert_eq!(step.status, pb::StepStatus::Cancelled as i32, "{step:?}");
    let results = turn.await.unwrap().unwrap();
    assert_eq!(results[0].outcome, Outcome::Cancelled, "{:?}", results[0]);
    assert_eq!(results[0].content, "cancelled: enough");
    let again = run.cancel_call("t0/p0", "again").await.unwrap_err();
    assert!(again.to_string().contains("already cancelled"), "{again}");
    let next = run
        .call_turn(1, vec![Call::new("add", json!({"a": 3, "b": 4}))])
        .await
        .unwrap();
    assert_eq!(next[0].content, "7");
}
