//! Outcomes a program can read: every way a call ends reaches the agent as a closed outcome with
//! its details (the deciding rule, the approval's decider and reason, attempts), through the
//! gRPC API and the Rust `AgentClient`, while the model still gets its text.

use std::time::Duration;

use e2e::{Kernel, KernelOptions, check_log};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use serde_json::json;
use tokio_stream::StreamExt;
use worker_sdk::{AgentClient, ApprovalAnswer, Call, NewRun, Outcome, ToolCallRejected, TurnItem};

const POLICY: &str = r#"
default: allow
deny_list: ["peek"]
rules:
  - id: big-refunds
    match: { tools: ["refund"], when: "args.cents > 10000" }
    decision: approve
    approval: { approvers: ["payments"], message: "check the ticket" }
"#;

#[tokio::test]
async fn every_way_a_call_ends_has_its_outcome_and_details() {
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(POLICY.into()),
        ..Default::default()
    });
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent.create_run(NewRun::new("outcomes", json!({}))).await.unwrap();

    let calls = vec![
        Call::new("sleepy", json!({"hold_ms": 1})),
        Call::new("no_such_tool", json!({})),
        Call::new("sleepy", json!({"hold_ms": "soon"})),
        Call::new("peek", json!({"key": "k"})),
        Call::new("sleepy", json!({"hold_ms": 10_000})).with_timeout(Duration::from_millis(100)),
        Call::new("charge", json!({"hold_ms": 10_000})).with_timeout(Duration::from_millis(100)),
    ];
    let results = run.call_turn(0, calls.clone()).await.unwrap();
    let outcomes: Vec<Outcome> = results.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Ok,
            Outcome::UnknownTool,
            Outcome::InvalidArguments,
            Outcome::Denied,
            Outcome::TimedOut,
            Outcome::Indeterminate,
        ],
        "{results:#?}"
    );
    assert_eq!(results[0].decided_by.as_deref(), Some("default:allow"));
    assert!(
        results[3]
            .decided_by
            .as_deref()
            .is_some_and(|d| d.contains("deny_list")),
        "{:?}",
        results[3]
    );
    assert!(
        results[3].content.starts_with("peek not allowed. reason:"),
        "the model still reads text"
    );
    assert!(
        results[5].content.starts_with("indeterminate:"),
        "{}",
        results[5].content
    );
    assert_eq!(
        results[5].attempts, 1,
        "an at_most_once call that timed out never runs again"
    );

    // A changed call at a recorded position.
    let mut changed = calls.clone();
    changed[0] = Call::new("sleepy", json!({"hold_ms": 2}));
    let replayed = run.call_turn(0, changed).await.unwrap();
    assert_eq!(replayed[0].outcome, Outcome::ReplayInputChanged);
    assert!(
        replayed[1..]
            .iter()
            .zip(&results[1..])
            .all(|(again, first)| again.replayed && again.outcome == first.outcome),
        "a replay carries the recorded outcome: {replayed:#?}"
    );

    // A gated call a person rejects reads as a typed rejection.
    let mut turn = Box::pin(run.submit_turn(1, vec![Call::new("refund", json!({"cents": 50_000}))]));
    let asked = loop {
        match tokio::time::timeout(e2e::WAIT, turn.next())
            .await
            .expect("turn stalled")
        {
            Some(Ok(TurnItem::Interrupted(asked))) => break asked,
            Some(Ok(TurnItem::Progress(_))) => {}
            other => panic!("expected the approval question, got {other:?}"),
        }
    };
    ApprovalServiceClient::connect(kernel.url())
        .await
        .unwrap()
        .reject_call(pb::RejectCallRequest {
            approval_id: asked.approval_id.clone(),
            decider: "bob".into(),
            reason: "no ticket".into(),
        })
        .await
        .unwrap();
    let refused = loop {
        match tokio::time::timeout(e2e::WAIT, turn.next())
            .await
            .expect("turn stalled")
        {
            Some(Ok(TurnItem::Result(result))) => break result,
            Some(Ok(_)) => {}
            other => panic!("expected the result, got {other:?}"),
        }
    };
    assert_eq!(refused.outcome, Outcome::Rejected);
    assert_eq!(refused.decided_by.as_deref(), Some("rule:big-refunds"));
    let approval = refused.approval.clone().expect("the answer");
    assert_eq!(
        (
            approval.approval_id.as_str(),
            approval.answer,
            approval.decider.as_str()
        ),
        (asked.approval_id.as_str(), ApprovalAnswer::Rejected, "bob")
    );
    assert_eq!(
        refused.rejection(),
        Some(ToolCallRejected {
            tool_name: "refund".into(),
            reason: Some("no ticket".into()),
            expired: false,
            decider: "bob".into(),
        })
    );

    // Inspection shows the same outcome and approval on each step.
    let snapshot = run.get().await.unwrap();
    let refund = snapshot.steps.iter().find(|s| s.tool == "refund").unwrap();
    assert_eq!(refund.outcome, pb::CallOutcome::Rejected as i32);
    assert_eq!(refund.approval.as_ref().map(|a| a.reason.as_str()), Some("no ticket"));
    let timed = snapshot.steps.iter().find(|s| s.position == 4 && s.turn == 0).unwrap();
    assert_eq!(timed.outcome, pb::CallOutcome::TimedOut as i32);

    // And the log's tool:result events name it.
    let events = kernel.events(run.id()).await;
    let mut named: Vec<String> = events
        .iter()
        .filter(|e| e.r#type == "tool:result" || e.r#type == "tool:denied")
        .map(|e| e2e::payload(e)["outcome"].as_str().unwrap_or("").to_owned())
        .collect();
    named.sort();
    assert_eq!(
        named,
        [
            "denied",
            "indeterminate",
            "invalid_arguments",
            "ok",
            "rejected",
            "timed_out",
            "unknown_tool"
        ]
    );
    check_log(&events, true);
}

/// A tool with a retry policy: a retryable error is retried to its last attempt, a fatal or a
/// poison one never.
#[tokio::test]
async fn fatal_and_poison_errors_are_never_retried() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("unlucky").await;
    let calls = ["retryable", "fatal", "poison"]
        .map(|kind| e2e::call("failing", json!({ "kind": kind })))
        .to_vec();
    let outcome = e2e::submit(&kernel, &run, 0, calls).await.unwrap();
    let attempts: Vec<u32> = outcome.results.iter().map(|r| r.attempts).collect();
    assert_eq!(attempts, [3, 1, 1], "{:?}", outcome.results);
    let kinds: Vec<i32> = outcome.results.iter().map(|r| r.error_kind).collect();
    assert_eq!(
        kinds,
        [
            pb::ErrorKind::Retryable as i32,
            pb::ErrorKind::Fatal as i32,
            pb::ErrorKind::Poison as i32
        ]
    );
    let runs = kernel.ledger().iter().filter(|l| l.tool == "failing").count();
    assert_eq!(runs, 5, "three attempts, then one each");
    check_log(&kernel.events(&run).await, true);
}
