//! Governance end to end: argument validation, policy decisions, human approval (approved,
//! rejected, expired, replayed, changed), non-interactive runs, cost, and policy reloads.

use e2e::{Kernel, KernelOptions, Watch, call, check_log, payload, submit};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::Code;

const POLICY: &str = r#"
default: allow
rules:
  - id: no-wipes-in-prod
    priority: 10
    match:
      tools: ["wipe"]
      when: "run.labels.env == 'prod'"
    decision: deny
    reason: "wiping production is never automatic"
  - id: quick-answers
    match:
      tools: ["refund"]
      agents: ["hasty-*"]
    decision: approve
    approval: { timeout: 1s, approvers: ["oncall"], message: "answer fast" }
"#;

fn governed() -> Kernel {
    Kernel::start_with(KernelOptions {
        policy: Some(POLICY.into()),
        ..Default::default()
    })
}

#[test]
fn the_kernel_says_at_start_which_policy_it_runs() {
    let kernel = governed();
    let line = kernel.process.log.wait_for("policy loaded");
    assert!(line.contains("policy.yaml") && line.contains("rules=2"), "{line}");
    let open = Kernel::start();
    open.process.log.wait_for("no --policy: every call is allowed");
}

async fn approvals(kernel: &Kernel) -> ApprovalServiceClient<tonic::transport::Channel> {
    ApprovalServiceClient::connect(kernel.url()).await.unwrap()
}

async fn create_run(kernel: &Kernel, agent: &str, labels: &[(&str, &str)], non_interactive: bool) -> String {
    let request = pb::CreateRunRequest {
        agent: agent.into(),
        input_json: "{}".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        non_interactive,
        permissions: vec!["billing:write".into()],
        ..Default::default()
    };
    kernel
        .runs()
        .await
        .create_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .id
}

/// Submits a turn and returns its stream, to read interruptions before results.
async fn open_turn(
    kernel: &Kernel,
    run: &str,
    turn: u32,
    calls: Vec<pb::ToolCall>,
) -> tonic::Streaming<pb::SubmitTurnResponse> {
    let request = pb::SubmitTurnRequest {
        run_id: run.into(),
        turn,
        calls,
        offered_tools: Vec::new(),
        max_concurrency: 0,
    };
    kernel.calls().await.submit_turn(request).await.unwrap().into_inner()
}

async fn next_item(stream: &mut tonic::Streaming<pb::SubmitTurnResponse>) -> pb::submit_turn_response::Item {
    tokio::time::timeout(e2e::WAIT, stream.next())
        .await
        .expect("turn stalled")
        .expect("more")
        .unwrap()
        .item
        .unwrap()
}

async fn interruption(stream: &mut tonic::Streaming<pb::SubmitTurnResponse>) -> pb::Interruption {
    match next_item(stream).await {
        pb::submit_turn_response::Item::Interrupted(interruption) => interruption,
        other => panic!("expected an interruption, got {other:?}"),
    }
}

async fn result(stream: &mut tonic::Streaming<pb::SubmitTurnResponse>) -> pb::CallResult {
    loop {
        match next_item(stream).await {
            pb::submit_turn_response::Item::Result(result) => return result,
            pb::submit_turn_response::Item::Progress(_) => {}
            other => panic!("expected a result, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn invalid_arguments_list_every_bad_field_and_run_nothing() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("typo").await;
    let outcome = submit(
        &kernel,
        &run,
        0,
        vec![call("sleepy", json!({"hold_ms": "soon", "extra": 1}))],
    )
    .await
    .unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Error as i32);
    assert!(
        result.content.starts_with("invalid arguments for tool 'sleepy': "),
        "{}",
        result.content
    );
    assert!(result.content.contains("/hold_ms"), "{}", result.content);
    assert!(result.content.contains("extra"), "{}", result.content);
    let events = kernel.events(&run).await;
    assert!(!events.iter().any(|e| e.r#type == "tool:start"), "nothing ran");
    assert!(kernel.ledger().is_empty());
    check_log(&events, true);
}

#[tokio::test]
async fn a_big_refund_waits_for_approval_and_runs_once_approved() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "billing", &[], false).await;
    let calls = vec![
        call("refund", json!({"cents": 500})),
        call("refund", json!({"cents": 25_000})),
    ];
    let mut turn = open_turn(&kernel, &run, 0, calls.clone()).await;
    // The question is reported when it is asked; results still come in position order.
    let (mut first, mut asked) = (None, None);
    while first.is_none() || asked.is_none() {
        match next_item(&mut turn).await {
            pb::submit_turn_response::Item::Result(result) => first = Some(result),
            pb::submit_turn_response::Item::Interrupted(interruption) => asked = Some(interruption),
            pb::submit_turn_response::Item::Progress(_) => {}
        }
    }
    let (first, asked) = (first.unwrap(), asked.unwrap());
    assert_eq!(first.content, "refunded 500 cents", "a small refund runs at once");
    assert_eq!(
        (asked.position, asked.tool.as_str(), asked.reason.as_str()),
        (1, "refund", "tool_approval")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&asked.arguments_json).unwrap(),
        json!({"cents": 25_000})
    );

    let shown = kernel.get(&run).await;
    assert_eq!(shown.run.unwrap().status, pb::RunStatus::Blocked as i32);
    let events = kernel.events(&run).await;
    let interrupted = events
        .iter()
        .find(|e| e.r#type == "run:interrupted")
        .map(payload)
        .unwrap();
    assert_eq!(interrupted["reason"], "tool_approval");
    assert_eq!(interrupted["tool_name"], "refund");
    assert_eq!(interrupted["tool_input"], json!({"cents": 25_000}));
    assert_eq!(interrupted["decided_by"], "tool:requires_approval");
    assert!(
        !events
            .iter()
            .any(|e| e.r#type == "tool:start" && payload(e)["position"] == 1),
        "parked before tool:start"
    );

    let refused = submit(&kernel, &run, 1, vec![call("refund", json!({"cents": 1}))])
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::FailedPrecondition,
        "a blocked run takes no new calls"
    );

    let approved = approvals(&kernel)
        .await
        .approve_call(pb::ApproveCallRequest {
            approval_id: asked.approval_id.clone(),
            decider: "alice".into(),
            reason: "ticket 42".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(approved.decider, "alice");
    let done = result(&mut turn).await;
    assert_eq!(done.content, "refunded 25000 cents");

    let again = approvals(&kernel)
        .await
        .reject_call(pb::RejectCallRequest {
            approval_id: asked.approval_id.clone(),
            decider: "bob".into(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "an approval is answered once");

    // Resubmitted: the recorded answer stands; nothing is asked or run again.
    let replay = submit(&kernel, &run, 0, calls).await.unwrap();
    assert!(replay.results.iter().all(|r| r.replayed));
    assert_eq!(kernel.ledger().len(), 2);
    // The same position with other arguments is a divergence, not a new question.
    let changed = submit(
        &kernel,
        &run,
        0,
        vec![
            call("refund", json!({"cents": 500})),
            call("refund", json!({"cents": 99_999})),
        ],
    )
    .await
    .unwrap();
    assert!(
        changed.results[1].content.starts_with("replay_input_changed"),
        "{}",
        changed.results[1].content
    );

    let shown = kernel.get(&run).await;
    let approval = &shown.approvals[0];
    assert_eq!(
        approval.status,
        pb::ApprovalStatus::Consumed as i32,
        "consumed by the call's start"
    );
    assert_eq!(shown.run.unwrap().status, pb::RunStatus::Running as i32);
    let manifest = shown.manifest.unwrap();
    assert_eq!(manifest.total_cost, 0.5);
    assert_eq!(manifest.cost_by_tool["refund"], 0.5);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_rejected_call_tells_the_model_it_was_not_approved() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "billing", &[], false).await;
    let mut turn = open_turn(&kernel, &run, 0, vec![call("refund", json!({"cents": 50_000}))]).await;
    let asked = interruption(&mut turn).await;
    approvals(&kernel)
        .await
        .reject_call(pb::RejectCallRequest {
            approval_id: asked.approval_id,
            decider: "bob".into(),
            reason: "too much".into(),
        })
        .await
        .unwrap();
    let refused = result(&mut turn).await;
    assert_eq!(refused.status, pb::CallStatus::Error as i32);
    assert_eq!(refused.content, "'refund' was not approved: rejected by bob (too much)");
    let events = kernel.events(&run).await;
    let answer = events
        .iter()
        .find(|e| e.r#type == "approval:answered")
        .map(payload)
        .unwrap();
    assert_eq!(
        (answer["answer"].as_str(), answer["decider"].as_str()),
        (Some("rejected"), Some("bob"))
    );
    let settled = events.iter().find(|e| e.r#type == "tool:result").map(payload).unwrap();
    assert_eq!(settled["approval"], "rejected");
    assert!(!events.iter().any(|e| e.r#type == "tool:start"));
    assert!(kernel.ledger().is_empty(), "only approve runs the tool");
    check_log(&events, true);
}

#[tokio::test]
async fn an_unanswered_approval_expires_as_a_rejection() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "hasty-bot", &[], false).await;
    let mut turn = open_turn(&kernel, &run, 0, vec![call("refund", json!({"cents": 5}))]).await;
    let asked = interruption(&mut turn).await;
    assert_eq!(asked.message, "answer fast");
    let expired = result(&mut turn).await;
    assert_eq!(
        expired.content,
        "'refund' was not approved: the approval expired unanswered (approval timeout)"
    );
    let settled = kernel
        .events(&run)
        .await
        .iter()
        .find(|e| e.r#type == "tool:result")
        .map(payload)
        .unwrap();
    assert_eq!(settled["approval"], "expired");
    assert!(kernel.ledger().is_empty());
}

#[tokio::test]
async fn a_denied_call_reads_not_allowed_with_the_rule_s_reason() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "janitor", &[("env", "prod")], false).await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let outcome = submit(&kernel, &run, 0, vec![call("wipe", json!({}))]).await.unwrap();
    assert_eq!(
        outcome.results[0].content,
        "wipe not allowed. reason: wiping production is never automatic"
    );
    let denied = watch.event("tool:denied", |_| true).await;
    assert_eq!(denied["decided_by"], "rule:no-wipes-in-prod");
    assert_eq!(denied["status"], "error");
    let events = kernel.events(&run).await;
    assert!(
        !events.iter().any(|e| e.r#type == "tool:result"),
        "a denial is its own terminal event, not a second one"
    );
    assert!(kernel.ledger().is_empty());
    check_log(&events, true);
}

#[tokio::test]
async fn a_non_interactive_run_cannot_wait_for_a_person() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "stream-consumer", &[], true).await;
    let refused = submit(
        &kernel,
        &run,
        0,
        vec![call("sleepy", json!({"hold_ms": 1})), call("wipe", json!({}))],
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("calls[1]") && refused.message().contains("non-interactive"),
        "{}",
        refused.message()
    );
    assert!(
        kernel.get(&run).await.steps.is_empty(),
        "the refused turn wrote nothing"
    );
    // Nor may it offer the model such a tool, whatever it calls: refused before anything is recorded.
    let offering = pb::SubmitTurnRequest {
        run_id: run.clone(),
        turn: 0,
        calls: vec![call("sleepy", json!({"hold_ms": 1}))],
        offered_tools: vec!["sleepy".into(), "wipe".into()],
        max_concurrency: 0,
    };
    let refused = kernel.calls().await.submit_turn(offering).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("offered_tools[1]") && refused.message().contains("'wipe'"),
        "{}",
        refused.message()
    );
    assert!(
        kernel.get(&run).await.steps.is_empty(),
        "the refused offer wrote nothing"
    );
    // A call that only a predicate gates is denied rather than parked.
    let outcome = submit(&kernel, &run, 0, vec![call("refund", json!({"cents": 20_000}))])
        .await
        .unwrap();
    assert!(
        outcome.results[0]
            .content
            .starts_with("refund not allowed. reason: it needs a person's approval")
    );
}

#[test]
fn a_policy_file_that_does_not_load_stops_the_kernel_and_a_bad_reload_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, "default: allow\nrules:\n  - id: x\n    decision: maybe\n").unwrap();
    let output = std::process::Command::new(e2e::binary("kernel"))
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("k.db"))
        .arg("--policy")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 4"), "{stderr}");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let kernel = governed();
        let _worker = kernel.fault_worker("w1");
        std::fs::write(kernel.dir.path().join("policy.yaml"), "rules: [oops").unwrap();
        let mut admin = kernel_proto::v1::admin_service_client::AdminServiceClient::connect(kernel.url())
            .await
            .unwrap();
        let status = admin.reload_policy(pb::ReloadPolicyRequest {}).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        let run = create_run(&kernel, "janitor", &[("env", "prod")], false).await;
        let outcome = submit(&kernel, &run, 0, vec![call("wipe", json!({}))]).await.unwrap();
        assert!(
            outcome.results[0].content.starts_with("wipe not allowed"),
            "the old policy still holds"
        );

        std::fs::write(kernel.dir.path().join("policy.yaml"), "default: deny\n").unwrap();
        let reloaded = admin
            .reload_policy(pb::ReloadPolicyRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(reloaded.path.ends_with("policy.yaml"));
        let run = create_run(&kernel, "anyone", &[], false).await;
        let outcome = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 1}))])
            .await
            .unwrap();
        assert!(
            outcome.results[0].content.starts_with("sleepy not allowed"),
            "{}",
            outcome.results[0].content
        );
    });
}

#[tokio::test]
async fn a_read_only_tool_with_a_cache_ttl_is_served_from_the_store() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let first = kernel.create_run("hasher").await;
    let outcome = submit(&kernel, &first, 0, vec![call("checksum", json!({"text": "abc"}))])
        .await
        .unwrap();
    let fresh = &outcome.results[0];
    assert_eq!((fresh.status, fresh.attempts), (pb::CallStatus::Ok as i32, 1));

    let second = kernel.create_run("hasher").await;
    let outcome = submit(
        &kernel,
        &second,
        0,
        vec![
            call("checksum", json!({"text": "abc"})),
            call("checksum", json!({"text": "abd"})),
        ],
    )
    .await
    .unwrap();
    let hit = &outcome.results[0];
    assert_eq!(
        hit.content, fresh.content,
        "the same tool, fingerprint and arguments get the stored result"
    );
    assert_eq!(hit.attempts, 0, "nothing ran");
    assert_eq!(outcome.results[1].attempts, 1, "other arguments are a miss");
    let events = kernel.events(&second).await;
    let hit_event = events
        .iter()
        .find(|e| e.r#type == "tool:result" && payload(e)["position"] == 0)
        .unwrap();
    assert_eq!(payload(hit_event)["cache"], "hit");
    assert!(
        !events
            .iter()
            .any(|e| e.r#type == "tool:start" && payload(e)["position"] == 0)
    );
    check_log(&events, true);
}

#[tokio::test]
async fn capture_decides_what_inspection_shows_while_replay_keeps_everything() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let mut runs = kernel.runs().await;
    let mut ids = Vec::new();
    // The planted value holds letters no hex id can, so a random id never looks like a leak.
    for capture in [pb::Capture::None, pb::Capture::Metadata] {
        let request = pb::CreateRunRequest {
            agent: "secretive".into(),
            input_json: r#"{"card":"card-QZ-4111"}"#.into(),
            capture: capture as i32,
            ..Default::default()
        };
        let run = runs.create_run(request).await.unwrap().into_inner().run.unwrap().id;
        let calls = vec![call("echo", json!({"value": "card-QZ-4111"}))];
        let outcome = submit(&kernel, &run, 0, calls.clone()).await.unwrap();
        assert_eq!(
            outcome.results[0].content, "card-QZ-4111",
            "the agent gets its result whatever the capture"
        );
        let replay = submit(&kernel, &run, 0, calls).await.unwrap();
        assert_eq!(replay.results[0].content, "card-QZ-4111", "replay has what it needs");
        ids.push(run);
    }
    for (run, level) in ids.iter().zip(["capture=none", "capture=metadata"]) {
        let shown = kernel.get(run).await;
        let text = format!("{:?}{:?}", shown.run, shown.steps);
        assert!(!text.contains("card-QZ"), "{level} leaks through GetRun: {text}");
        assert!(text.contains(level), "{text}");
        let events = kernel.events(run).await;
        assert!(
            events.iter().all(|e| !e.payload_json.contains("card-QZ")),
            "{level} leaks through the event log"
        );
        let output = kernel.kernelctl(&["runs", "show", run]);
        assert!(!String::from_utf8_lossy(&output.stdout).contains("card-QZ"));
    }
}

#[tokio::test]
async fn an_approval_round_trip_through_kernelctl() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "billing", &[], false).await;
    let mut turn = open_turn(&kernel, &run, 0, vec![call("refund", json!({"cents": 30_000}))]).await;
    let asked = interruption(&mut turn).await;

    let listed = kernel.kernelctl(&["--json", "approvals", "list"]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let pending = &listed["approvals"][0];
    assert_eq!(pending["id"], asked.approval_id.as_str());
    assert_eq!(pending["tool"], "refund");
    assert_eq!(
        pending["arguments"],
        json!({"cents": 30_000}),
        "the approver sees exactly what will run"
    );
    let table = String::from_utf8(kernel.kernelctl(&["approvals", "list"]).stdout).unwrap();
    assert!(
        table.contains(&asked.approval_id) && table.contains("tool:requires_approval"),
        "{table}"
    );

    let answer = kernel.kernelctl(&[
        "approvals",
        "approve",
        &asked.approval_id,
        "--as",
        "carol",
        "--reason",
        "checked",
    ]);
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    assert!(String::from_utf8_lossy(&answer.stdout).contains("approved by carol"));
    assert_eq!(result(&mut turn).await.content, "refunded 30000 cents");

    let twice = kernel.kernelctl(&["approvals", "reject", &asked.approval_id, "--as", "dave"]);
    assert_eq!(
        twice.status.code(),
        Some(1),
        "an answered approval cannot be answered again"
    );

    let shown: Value = serde_json::from_slice(&kernel.kernelctl(&["--json", "runs", "show", &run]).stdout).unwrap();
    let step = &shown["steps"][0];
    assert_eq!(step["decided_by"], "tool:requires_approval");
    assert_eq!(step["cost"], 0.25);
    assert_eq!(shown["manifest"]["total_cost"], 0.25);
    assert_eq!(shown["manifest"]["cost_by_tool"]["refund"], 0.25);
    assert_eq!(shown["approvals"][0]["decider"], "carol");
    assert_eq!(shown["approvals"][0]["status"], "consumed");
    let human = String::from_utf8(kernel.kernelctl(&["runs", "show", &run]).stdout).unwrap();
    for needle in ["decided by", "tool:requires_approval", "cost", "carol", "approvals:"] {
        assert!(human.contains(needle), "{needle:?} missing from:\n{human}");
    }
}

#[tokio::test]
async fn sighup_reloads_the_policy_file() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    std::fs::write(kernel.dir.path().join("policy.yaml"), "deny_list: [\"sleepy\"]\n").unwrap();
    let seen = kernel.process.log.len();
    kernel.process.hangup();
    kernel.process.log.wait_for_after(seen, "policy reloaded");
    let run = kernel.create_run("anyone").await;
    let outcome = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 1}))])
        .await
        .unwrap();
    assert!(
        outcome.results[0].content.starts_with("sleepy not allowed. reason: "),
        "{}",
        outcome.results[0].content
    );
}

/// `max_risk` and `require_permissions` end to end, against the fault worker's declared risks
/// (`refund` high, `wipe` critical, the rest undeclared, so low) and permissions (`refund` needs
/// `billing:write`).
#[tokio::test]
async fn max_risk_and_require_permissions_decide_calls_end_to_end() {
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(
            "default: allow\nmax_risk: { ceiling: high, approve_above: medium }\nrequire_permissions: true\n".into(),
        ),
        ..Default::default()
    });
    let _worker = kernel.fault_worker("w1");
    // A run without billing:write.
    let request = pb::CreateRunRequest {
        agent: "limited".into(),
        input_json: "{}".into(),
        ..Default::default()
    };
    let unprivileged = kernel
        .runs()
        .await
        .create_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .id;
    let outcome = submit(
        &kernel,
        &unprivileged,
        0,
        vec![
            call("sleepy", json!({"hold_ms": 1})),
            call("refund", json!({"cents": 5})),
            call("wipe", json!({})),
        ],
    )
    .await
    .unwrap();
    assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32, "low risk runs");
    for (index, expected) in [(1, "billing:write"), (2, "critical")] {
        let result = &outcome.results[index];
        assert_eq!(result.outcome, pb::CallOutcome::Denied as i32, "{result:?}");
        assert!(result.content.contains(expected), "{}", result.content);
    }
    // A run holding billing:write: the high-risk refund now asks a person instead.
    let privileged = create_run(&kernel, "billing", &[], false).await;
    let mut turn = open_turn(&kernel, &privileged, 0, vec![call("refund", json!({"cents": 5}))]).await;
    let first = turn.next().await.unwrap().unwrap();
    let Some(pb::submit_turn_response::Item::Interrupted(asked)) = first.item else {
        panic!("expected an approval question, got {first:?}");
    };
    assert_eq!(asked.tool, "refund");
    assert!(
        kernel.ledger().iter().all(|l| l.tool != "refund"),
        "nothing ran before the answer"
    );
}

/// A tool's context says which turn and position its call has, as recorded.
#[tokio::test]
async fn a_tool_s_context_knows_its_turn_and_position() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("curious").await;
    let outcome = submit(
        &kernel,
        &run,
        3,
        vec![call("sleepy", json!({"hold_ms": 1})), call("whoami", json!({}))],
    )
    .await
    .unwrap();
    let seen: Value = serde_json::from_str(&outcome.results[1].content).unwrap();
    assert_eq!(
        seen,
        json!({"turn": 3, "position": 1, "step_key": "t3/p1", "attempt": 1})
    );
}

#[tokio::test]
async fn call_turn_answers_a_whole_turn_once_with_its_interruption_and_replays_it() {
    let kernel = governed();
    let _worker = kernel.fault_worker("w1");
    let run = create_run(&kernel, "billing", &[], false).await;
    let turn = pb::SubmitTurnRequest {
        run_id: run.clone(),
        turn: 0,
        calls: vec![
            call("refund", json!({"cents": 500})),
            call("refund", json!({"cents": 25_000})),
        ],
        offered_tools: vec![],
        max_concurrency: 0,
    };
    let request = pb::CallTurnRequest { turn: Some(turn) };
    let answered = tokio::spawn({
        let (url, request) = (kernel.url(), request.clone());
        async move {
            let mut calls = pb::tool_call_service_client::ToolCallServiceClient::connect(url)
                .await
                .unwrap();
            calls.call_turn(request).await.map(tonic::Response::into_inner)
        }
    });
    let asked = e2e::eventually("the big refund to wait for a person", || async {
        let pending = approvals(&kernel)
            .await
            .list_approvals(pb::ListApprovalsRequest {
                status: 0,
                run_id: run.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .approvals;
        pending.into_iter().next().ok_or("none yet")
    })
    .await;
    approvals(&kernel)
        .await
        .approve_call(pb::ApproveCallRequest {
            approval_id: asked.id.clone(),
            decider: "alice".into(),
            reason: String::new(),
            ..Default::default()
        })
        .await
        .unwrap();
    let answer = answered.await.unwrap().unwrap();
    let contents: Vec<&str> = answer.results.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(
        contents,
        ["refunded 500 cents", "refunded 25000 cents"],
        "in position order"
    );
    assert_eq!(answer.interruptions.len(), 1, "{answer:?}");
    assert_eq!(
        (
            answer.interruptions[0].position,
            answer.interruptions[0].reason.as_str()
        ),
        (1, "tool_approval")
    );

    // The same turn again is answered from the record; nothing runs or asks again.
    let again = kernel.calls().await.call_turn(request).await.unwrap().into_inner();
    assert!(again.results.iter().all(|r| r.replayed), "{again:?}");
    assert!(again.interruptions.is_empty());

    // A request without its turn is refused, naming the field.
    let refused = kernel
        .calls()
        .await
        .call_turn(pb::CallTurnRequest { turn: None })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("turn"), "{}", refused.message());
    check_log(&kernel.events(&run).await, true);
}
