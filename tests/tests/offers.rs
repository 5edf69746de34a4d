//! Which tools an agent is told exist: the turn's offer when it names one, otherwise what connected
//! workers offer now; and a registered tool nobody offers any more can be forgotten.

use e2e::{Kernel, WAIT, call, check_log, submit};
use kernel_proto::v1 as pb;
use serde_json::json;

async fn submit_offering(
    kernel: &Kernel,
    run: &str,
    turn: u32,
    calls: Vec<pb::ToolCall>,
    offered: &[&str],
) -> Vec<pb::CallResult> {
    let request = pb::SubmitTurnRequest {
        run_id: run.into(),
        turn,
        calls,
        offered_tools: offered.iter().map(|t| t.to_string()).collect(),
        max_concurrency: 0,
    };
    let mut stream = kernel.calls().await.submit_turn(request).await.unwrap().into_inner();
    let mut results = Vec::new();
    while let Some(item) = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("turn stalled")
        .unwrap()
    {
        if let Some(pb::submit_turn_response::Item::Result(result)) = item.item {
            results.push(result);
        }
    }
    results
}

#[tokio::test]
async fn an_unknown_tool_lists_what_connected_workers_offer_now() {
    let kernel = Kernel::start();
    let mut gone = kernel.fault_worker("gone");
    kernel.wait_for_workers("sleepy", 1).await;
    gone.kill9();
    kernel.wait_for_workers("sleepy", 0).await;
    let _demo = kernel.worker("demo");
    let run = kernel.create_run("offers").await;
    let outcome = submit(&kernel, &run, 0, vec![call("nosuch", json!({}))]).await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.outcome, pb::CallOutcome::UnknownTool as i32);
    assert!(
        result.content.starts_with("unknown tool 'nosuch'; available: add, "),
        "{}",
        result.content
    );
    assert!(
        !result.content.contains("sleepy"),
        "a tool no connected worker offers is not listed: {}",
        result.content
    );
}

#[tokio::test]
async fn a_call_outside_the_turn_s_offer_is_unknown_and_a_recorded_one_no_longer_offered_diverges() {
    let kernel = Kernel::start();
    let _demo = kernel.worker("demo");
    let run = kernel.create_run("offered").await;
    let calls = vec![
        call("add", json!({"a": 1, "b": 2})),
        call("divide", json!({"a": 6, "b": 3})),
    ];
    let first = submit_offering(&kernel, &run, 0, calls.clone(), &["add", "echo"]).await;
    assert_eq!(first[0].outcome, pb::CallOutcome::Ok as i32, "{first:?}");
    assert_eq!(first[1].outcome, pb::CallOutcome::UnknownTool as i32, "{first:?}");
    assert_eq!(
        first[1].content, "unknown tool 'divide'; available: add, echo",
        "the model is told what it was offered, though a worker offers divide"
    );

    // The same turn again, with add no longer offered: its recorded call is not served.
    let again = submit_offering(&kernel, &run, 0, calls, &["echo"]).await;
    assert_eq!(
        again[0].outcome,
        pb::CallOutcome::ReplayInputChanged as i32,
        "{again:?}"
    );
    assert!(
        again[0].content.contains("which this turn does not offer"),
        "{}",
        again[0].content
    );
    assert!(again[1].replayed, "the unknown call replays its recorded outcome");

    let refused = kernel
        .calls()
        .await
        .submit_turn(pb::SubmitTurnRequest {
            run_id: run.clone(),
            turn: 1,
            calls: vec![call("add", json!({"a": 1, "b": 2}))],
            offered_tools: vec!["bad name".into()],
            max_concurrency: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("offered_tools[0]:"),
        "{}",
        refused.message()
    );
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn tools_forget_refuses_an_offered_tool_and_forgets_one_nobody_offers() {
    let kernel = Kernel::start();
    let mut worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let refused = kernel.kernelctl(&["tools", "forget", "sleepy"]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("offered by 1 connected worker"), "{stderr}");

    worker.kill9();
    kernel.wait_for_workers("sleepy", 0).await;
    let forgot = kernel.kernelctl(&["tools", "forget", "sleepy"]);
    assert!(forgot.status.success(), "{}", String::from_utf8_lossy(&forgot.stderr));
    assert_eq!(String::from_utf8_lossy(&forgot.stdout).trim(), "forgot sleepy");
    let listed = String::from_utf8_lossy(&kernel.kernelctl(&["tools", "list"]).stdout).into_owned();
    assert!(!listed.contains("sleepy"), "{listed}");
    assert!(listed.contains("charge"), "only the one tool is forgotten: {listed}");
    let again = kernel.kernelctl(&["tools", "forget", "sleepy"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("tool 'sleepy' is not registered"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // A call of it is now an unknown tool.
    let run = kernel.create_run("forgotten").await;
    let outcome = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 1}))])
        .await
        .unwrap();
    assert_eq!(outcome.results[0].outcome, pb::CallOutcome::UnknownTool as i32);
}
