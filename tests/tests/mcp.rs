//! MCP servers as workers, end to end: `kernel-mcp` wraps real MCP servers nobody here wrote
//! (`@modelcontextprotocol/server-everything` and `server-filesystem`, installed by
//! `npm ci --prefix tests/mcp`; for the cancellation test and a form asked with `input_required`,
//! tools on the official Python SDK's server, `tests/mcp/slow_server.py` and
//! `tests/mcp/asking_server.py`), and agents call their tools through the kernel.

use e2e::mcp::{everything_over_http, npm_bin};
use e2e::{Kernel, Watch, call, check_log, submit, submit_until_done};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use serde_json::{Value, json};

/// Submits a turn in a task of its own, resubmitting until every result is in.
fn spawn_turn(kernel: &Kernel, run: &str, calls: Vec<pb::ToolCall>) -> tokio::task::JoinHandle<e2e::TurnOutcome> {
    let (url, run) = (kernel.url(), run.to_owned());
    tokio::spawn(async move { submit_until_done(&url, &run, 0, calls).await })
}

/// server-everything and server-filesystem serving `root`.
fn everything_and_files_config(root: &std::path::Path) -> String {
    format!(
        "{}  fs:\n    command: {}\n    args: [\"{}\"]\n",
        everything_config(""),
        npm_bin("mcp-server-filesystem").display(),
        root.display()
    )
}

fn everything_config(extra: &str) -> String {
    format!(
        "servers:\n  everything:\n    command: {}\n{extra}",
        npm_bin("mcp-server-everything").display()
    )
}

/// The config of server `name`, the official Python SDK's server `tests/mcp/<name>_server.py`,
/// writing what it did to `ledger`.
fn python_server(name: &str, ledger: &std::path::Path) -> String {
    let server = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("mcp/{name}_server.py"));
    format!(
        "servers:\n  {name}:\n    command: python3\n    args: [\"{}\", \"{}\"]\n",
        server.display(),
        ledger.display()
    )
}

/// The registered tools, once `ready` holds for them (a server's list may change after it starts).
async fn tools_when(kernel: &Kernel, ready: impl Fn(&[pb::RegisteredTool]) -> bool) -> Vec<pb::RegisteredTool> {
    e2e::eventually("the tools to be offered", || async {
        let tools = kernel
            .registry()
            .await
            .list_tools(pb::ListToolsRequest {})
            .await
            .unwrap()
            .into_inner()
            .tools;
        let offered: Vec<pb::RegisteredTool> = tools.into_iter().filter(|t| !t.workers.is_empty()).collect();
        if ready(&offered) {
            Ok(offered)
        } else {
            Err(names(&offered))
        }
    })
    .await
}

fn names(tools: &[pb::RegisteredTool]) -> Vec<String> {
    tools.iter().map(|t| t.spec.as_ref().unwrap().name.clone()).collect()
}

fn options<'a>(tools: &'a [pb::RegisteredTool], name: &str) -> &'a pb::ToolOptions {
    let tool = tools
        .iter()
        .find(|t| t.spec.as_ref().unwrap().name == name)
        .unwrap_or_else(|| panic!("{name} is not registered: {:?}", names(tools)));
    tool.spec.as_ref().unwrap().options.as_ref().unwrap()
}

/// Everything's tools once its list change after initialization has been registered too.
async fn everything_ready(kernel: &Kernel) -> Vec<pb::RegisteredTool> {
    tools_when(kernel, |tools| {
        names(tools).iter().any(|n| n == "everything_simulate-research-query")
    })
    .await
}

#[tokio::test]
async fn a_server_s_tools_appear_prefixed_with_their_hints_mapped_and_a_list_change_re_registers() {
    let kernel = Kernel::start();
    let root = tempfile::tempdir().unwrap();
    let config = everything_and_files_config(root.path());
    let mcp = kernel.mcp_worker(&config);
    // server-everything registers a tool once the session is up and says its list changed: the
    // new tool is offered without a restart of anything.
    everything_ready(&kernel).await;
    // Unless the server was quicker than the first listing, which then held the tool already.
    let log = mcp.log.text();
    let first_listing = log
        .lines()
        .find(|line| line.contains("mcp tools listed") && line.contains("server=\"everything\""))
        .unwrap_or_default();
    assert!(
        log.contains("mcp tool list changed") || first_listing.contains("everything_simulate-research-query"),
        "{log}"
    );
    let tools = tools_when(&kernel, |t| {
        let names = names(t);
        names.iter().any(|n| n == "fs_write_file") && names.iter().any(|n| n == "everything_simulate-research-query")
    })
    .await;
    let echo = options(&tools, "everything_echo");
    assert!(echo.read_only && !echo.writes && echo.strip_nulls);
    assert_eq!(echo.idempotency, pb::Idempotency::SafeToRetry as i32);
    // readOnlyHint false, destructiveHint true, idempotentHint true.
    let write = options(&tools, "fs_write_file");
    assert!(write.writes && !write.read_only);
    assert_eq!(write.idempotency, pb::Idempotency::SafeToRetry as i32);
    // Destructive and not idempotent: never run twice.
    let edit = options(&tools, "fs_edit_file");
    assert!(edit.writes);
    assert_eq!(edit.idempotency, pb::Idempotency::AtMostOnce as i32);
    // Neither read-only nor destructive: unmarked, and idempotent.
    let mkdir = options(&tools, "fs_create_directory");
    assert!(!mkdir.writes && !mkdir.read_only);
    assert_eq!(mkdir.idempotency, pb::Idempotency::SafeToRetry as i32);
    let spec = tools
        .iter()
        .find(|t| t.spec.as_ref().unwrap().name == "everything_get-sum")
        .and_then(|t| t.spec.clone())
        .unwrap();
    let schema: Value = serde_json::from_str(&spec.input_schema_json).unwrap();
    assert_eq!(
        schema["properties"]["a"]["type"], "number",
        "the MCP inputSchema: {schema}"
    );
    assert!(
        spec.version.starts_with("mcp."),
        "the version covers the MCP definition: {}",
        spec.version
    );
}

#[tokio::test]
async fn calls_go_to_the_server_by_bare_name_with_nulls_stripped_and_results_flattened() {
    let kernel = Kernel::start();
    let root = tempfile::tempdir().unwrap();
    let config = everything_and_files_config(root.path());
    let _mcp = kernel.mcp_worker(&config);
    everything_ready(&kernel).await;
    tools_when(&kernel, |t| names(t).iter().any(|n| n == "fs_read_text_file")).await;
    let run = kernel.create_run("mcp-user").await;
    let outside = "/etc/hostname";
    let calls = vec![
        call("everything_echo", json!({"message": "hi"})),
        call("everything_get-sum", json!({"a": 2, "b": 3})),
        call("everything_get-structured-content", json!({"location": "New York"})),
        call("everything_get-tiny-image", json!({})),
        call(
            "fs_write_file",
            json!({"path": root.path().join("a.txt"), "content": "hello"}),
        ),
        call("fs_read_text_file", json!({"path": outside})),
        // Models fill optional fields with null; the typed server would reject it.
        call(
            "everything_trigger-long-running-operation",
            json!({"duration": 0.2, "steps": null}),
        ),
    ];
    let outcome = submit(&kernel, &run, 0, calls).await.unwrap();
    let results = &outcome.results;
    assert_eq!(results[0].content, "Echo: hi");
    assert!(results[1].content.contains('5'), "{}", results[1].content);
    let weather: Value = serde_json::from_str(&results[2].output_json).unwrap();
    assert!(
        weather.get("temperature").is_some(),
        "structured content first: {weather}"
    );
    let image: Value = serde_json::from_str(&results[3].output_json).unwrap();
    assert!(
        image
            .as_array()
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "image")),
        "other content kinds kept as JSON: {image}"
    );
    let written: Value = serde_json::from_str(&results[4].output_json).unwrap();
    assert!(
        written["content"].as_str().unwrap().starts_with("Successfully wrote"),
        "{written}"
    );
    assert_eq!(std::fs::read_to_string(root.path().join("a.txt")).unwrap(), "hello");
    // isError: a tool error the model reads.
    assert_eq!(results[5].status, pb::CallStatus::Error as i32, "{:?}", results[5]);
    assert!(results[5].content.contains("Access denied"), "{}", results[5].content);
    assert_eq!(results[6].status, pb::CallStatus::Ok as i32, "{:?}", results[6]);
    assert!(results[6].content.contains("Long running operation completed"));
    // Live progress is best effort (an update may be dropped under load).
    let live = outcome
        .progress
        .iter()
        .filter(|p| p.tool.ends_with("long-running-operation"))
        .count();
    assert!((1..=5).contains(&live), "{live} progress updates reached the agent");
    let steps = kernel.get(&run).await.steps;
    let recorded: Value = serde_json::from_str(&steps[6].arguments_json).unwrap();
    assert_eq!(
        recorded,
        json!({"duration": 0.2}),
        "the record holds what the server was sent"
    );
    // rmcp hands notifications to the handler apart from responses, so the server's last update
    // may come in after its result, when the call no longer takes progress.
    assert!(
        (4..=5).contains(&steps[6].progress_count),
        "MCP progress is the call's progress: {}",
        steps[6].progress_count
    );
    check_log(&kernel.events(&run).await, true);
    // `kernelctl runs show` tells the story.
    let shown = kernel.kernelctl(&["runs", "show", &run]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("everything_echo") && text.contains("fs_write_file"),
        "{text}"
    );
}

#[tokio::test]
async fn a_tool_the_config_says_requires_approval_parks_the_run_until_a_person_answers() {
    let kernel = Kernel::start();
    let _mcp = kernel.mcp_worker(&everything_config(
        "    requires_approval: [\"get-env\", { tool: \"echo\", when: \"args.message == 'secret'\" }]\n    risk: high\n    owner: platform\n    unit_price: 0.01\n",
    ));
    let tools = everything_ready(&kernel).await;
    let env = options(&tools, "everything_get-env");
    assert!(env.requires_approval);
    assert_eq!((env.risk, env.owner.as_str()), (pb::RiskLevel::High as i32, "platform"));
    assert_eq!(
        options(&tools, "everything_echo").requires_approval_expr,
        "args.message == 'secret'"
    );
    let run = kernel.create_run("mcp-user").await;
    let turn = spawn_turn(
        &kernel,
        &run,
        vec![
            call("everything_echo", json!({"message": "open"})),
            call("everything_get-env", json!({})),
        ],
    );
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();
    let asked = e2e::eventually("an approval to be asked", || {
        let (mut approvals, run) = (approvals.clone(), run.clone());
        async move {
            let pending = approvals
                .list_approvals(pb::ListApprovalsRequest {
                    run_id: run,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .approvals;
            pending.into_iter().next().ok_or("none pending")
        }
    })
    .await;
    assert_eq!(asked.tool, "everything_get-env");
    let shown = kernel.get(&run).await;
    assert_eq!(shown.run.unwrap().status, pb::RunStatus::Blocked as i32, "parked");
    approvals
        .approve_call(pb::ApproveCallRequest {
            approval_id: asked.id.clone(),
            decider: "alice".into(),
            reason: "debugging".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let outcome = turn.await.unwrap();
    assert_eq!(outcome.results[0].content, "Echo: open");
    assert_eq!(
        outcome.results[1].status,
        pb::CallStatus::Ok as i32,
        "{:?}",
        outcome.results[1]
    );
    let manifest = kernel.get(&run).await.manifest.unwrap();
    assert!(
        (manifest.total_cost - 0.02).abs() < 1e-9,
        "the config's unit price: {manifest:?}"
    );
}

#[tokio::test]
async fn a_server_killed_mid_call_is_restarted_and_a_safe_call_runs_again() {
    let kernel = Kernel::start();
    let mcp = kernel.mcp_worker(&everything_config(""));
    everything_ready(&kernel).await;
    let run = kernel.create_run("mcp-user").await;
    let mut watch = Watch::open(&kernel, &run, 1, true).await;
    let turn = spawn_turn(
        &kernel,
        &run,
        vec![call(
            "everything_trigger-long-running-operation",
            json!({"duration": 3, "steps": 30}),
        )],
    );
    // Kill the server process (kernel-mcp's child) once the call is running on it.
    assert!(
        watch.until(|w| !w.progress.is_empty()).await,
        "the call never reported progress"
    );
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-P", &mcp.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "the server process was found and killed");
    let outcome = turn.await.unwrap();
    assert_eq!(
        outcome.results[0].status,
        pb::CallStatus::Ok as i32,
        "{:?}",
        outcome.results[0]
    );
    let step = &kernel.get(&run).await.steps[0];
    assert_eq!(
        (step.attempts, step.lease_losses),
        (2, 1),
        "the attempt was lost with its server, as with a lost worker, and ran again once it was back"
    );
    mcp.log.wait_for("restarting the mcp server");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_server_over_streamable_http_is_wrapped_the_same() {
    let kernel = Kernel::start();
    let (_server, url) = everything_over_http();
    let mcp = kernel.mcp_worker(&format!(
        "servers:\n  remote:\n    url: {url}\n    headers: {{ X-Test: e2e }}\n    allow: [\"echo\", \"get-sum\"]\n"
    ));
    let connected = mcp.log.wait_for("mcp server connected");
    assert!(
        connected.contains(r#"revision="2025-11-25""#),
        "server-everything speaks 2025-11-25: {connected}"
    );
    let tools = tools_when(&kernel, |t| names(t).len() == 2).await;
    let mut listed = names(&tools);
    listed.sort();
    assert_eq!(
        listed,
        ["remote_echo", "remote_get-sum"],
        "only what allow lets through"
    );
    let run = kernel.create_run("mcp-user").await;
    let outcome = submit(
        &kernel,
        &run,
        0,
        vec![call("remote_echo", json!({"message": "over http"}))],
    )
    .await
    .unwrap();
    assert_eq!(outcome.results[0].content, "Echo: over http");
}

/// A kernel cancel (here, the run's) reaches the MCP server as `notifications/cancelled`: the
/// server's handler is interrupted, not left running. The server is the official Python SDK's.
#[tokio::test]
async fn a_kernel_cancel_becomes_an_mcp_cancellation_the_server_sees() {
    let kernel = Kernel::start();
    let marker = kernel.dir.path().join("slow-server.log");
    let mcp = kernel.mcp_worker(&python_server("slow", &marker));
    let connected = mcp.log.wait_for("mcp server connected");
    assert!(
        connected.contains(r#"revision="2026-07-28""#),
        "the Python SDK's server speaks 2026-07-28: {connected}"
    );
    tools_when(&kernel, |tools| names(tools).iter().any(|n| n == "slow_wait")).await;
    let run = kernel.create_run("mcp-user").await;
    let mut watch = Watch::open(&kernel, &run, 1, true).await;
    let turn = spawn_turn(&kernel, &run, vec![call("slow_wait", json!({}))]);
    assert!(
        watch.until(|w| !w.progress.is_empty()).await,
        "the call never reported the server's progress"
    );
    kernel
        .runs()
        .await
        .cancel_run(pb::CancelRunRequest {
            run_id: run.clone(),
            reason: "the user left".into(),
        })
        .await
        .unwrap();
    let outcome = turn.await.unwrap();
    assert_eq!(
        outcome.results[0].outcome,
        pb::CallOutcome::Cancelled as i32,
        "{:?}",
        outcome.results[0]
    );
    // The server writes its line when its handler is interrupted.
    e2e::eventually("the server to see the cancellation", || async {
        let seen = std::fs::read_to_string(&marker).unwrap_or_default();
        if seen.lines().any(|line| line == "cancelled") {
            Ok(())
        } else {
            Err(seen)
        }
    })
    .await;
    check_log(&kernel.events(&run).await, true);
}

/// `kernel-mcp` speaks either revision. A server of 2026-07-28 (here another kernel's MCP bridge,
/// which makes a task of a slow call) is reached with `server/discover`; the task it answers with
/// is followed to its result, its status messages the call's progress, and a kernel cancel
/// cancels the task, and only it, upstream. (server-everything, of 2025-11-25, is reached with
/// `initialize` by the other tests here.)
#[tokio::test]
async fn a_2026_server_s_task_is_followed_to_its_result_and_a_kernel_cancel_cancels_it() {
    let upstream = Kernel::start();
    let _worker = upstream.fault_worker("fw");
    let (_bridge, url) = upstream.mcp_serve_http(&["--allow", "sleepy"]);
    let kernel = Kernel::start();
    let mcp = kernel.mcp_worker(&format!("servers:\n  up:\n    url: {url}\n"));
    let connected = mcp.log.wait_for("mcp server connected");
    assert!(connected.contains(r#"revision="2026-07-28""#), "{connected}");
    tools_when(&kernel, |tools| names(tools).iter().any(|n| n == "up_sleepy")).await;

    let run = kernel.create_run("mcp-user").await;
    let mut watch = Watch::open(&kernel, &run, 1, true).await;
    let outcome = submit(&kernel, &run, 0, vec![call("up_sleepy", json!({"hold_ms": 2500}))])
        .await
        .unwrap();
    assert_eq!(outcome.results[0].content, "slept 2500ms", "{:?}", outcome.results[0]);
    assert!(
        watch
            .until(|w| w.progress.iter().any(|p| p.message.starts_with("'sleepy' runs on fw")))
            .await,
        "the task's status reached the call as progress"
    );

    let (url, cancelled_run) = (kernel.url(), run.clone());
    let turn = tokio::spawn(async move {
        let calls = vec![call("up_sleepy", json!({"hold_ms": 60_000}))];
        submit_until_done(&url, &cancelled_run, 1, calls).await
    });
    assert!(
        watch
            .until(|w| {
                w.progress
                    .iter()
                    .any(|p| p.step_key == "t1/p0" && p.message.starts_with("'sleepy' runs on fw"))
            })
            .await,
        "the second call became a task"
    );
    kernel
        .calls()
        .await
        .cancel_call(pb::CancelCallRequest {
            run_id: run.clone(),
            step_key: "t1/p0".into(),
            reason: "not needed".into(),
        })
        .await
        .unwrap();
    let outcome = turn.await.unwrap();
    assert_eq!(
        outcome.results[0].outcome,
        pb::CallOutcome::Cancelled as i32,
        "{:?}",
        outcome.results[0]
    );
    let upstream_runs = upstream.list_runs("worker-sdk").await;
    assert_eq!(
        upstream_runs.len(),
        2,
        "a run upstream for each call: {upstream_runs:?}"
    );
    e2e::eventually("the upstream call to be cancelled by tasks/cancel", || async {
        let mut cancelled = Vec::new();
        for run in &upstream_runs {
            let steps = upstream.get(&run.id).await.steps;
            cancelled.extend(
                steps
                    .into_iter()
                    .filter(|s| s.status == pb::StepStatus::Cancelled as i32),
            );
        }
        match cancelled.as_slice() {
            [step] if step.error.contains("tasks/cancel") => Ok(()),
            _ => Err(cancelled),
        }
    })
    .await;
}

/// A wrapped server's request for input is a question to a person in the kernel that wraps it.
/// The server here is another kernel's MCP bridge (2026-07-28), whose tool `confirm` asks its
/// own person mid-call: the bridge makes a task of the call, in `input_required`; `kernel-mcp`
/// puts its form to a person here, as a question of the wrapping call, and hands the answer
/// back with `tasks/update`; the upstream tool gets it, and the call completes with its result.
#[tokio::test]
async fn a_wrapped_server_s_request_for_input_is_a_question_answered_in_the_wrapping_kernel() {
    let upstream = Kernel::start();
    let _worker = upstream.fault_worker("fw");
    let (_bridge, url) = upstream.mcp_serve_http(&["--allow", "confirm"]);
    let kernel = Kernel::start();
    let _mcp = kernel.mcp_worker(&format!("servers:\n  up:\n    url: {url}\n"));
    tools_when(&kernel, |tools| names(tools).iter().any(|n| n == "up_confirm")).await;

    let run = kernel.create_run("mcp-user").await;
    let turn = spawn_turn(&kernel, &run, vec![call("up_confirm", json!({"question": "Ship it?"}))]);
    let approval = kernel.question_of(&run).await;
    assert!(approval.question, "{approval:?}");
    assert!(
        approval.message.starts_with("up asks: Ship it?"),
        "the upstream question, named by its server: {}",
        approval.message
    );
    let schema: Value = serde_json::from_str(&approval.answer_schema_json).unwrap();
    assert_eq!(schema["properties"]["ok"]["type"], "boolean", "{schema}");
    let upstream_waiting = upstream.pending_approvals().await;
    assert_eq!(upstream_waiting.len(), 1, "one question upstream: {upstream_waiting:?}");

    let out = kernel.kernelctl(&[
        "approvals",
        "answer",
        &approval.id,
        "--with",
        r#"{"ok": true}"#,
        "--as",
        "dana",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome = turn.await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.outcome, pb::CallOutcome::Ok as i32, "{result:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&result.content).unwrap(),
        json!({"ok": true})
    );

    // Upstream, the person's answer came from the wrapping kernel's MCP client, once.
    assert!(upstream.pending_approvals().await.is_empty());
    let upstream_runs = upstream.list_runs("").await;
    let mut answered = Vec::new();
    for upstream_run in &upstream_runs {
        answered.extend(
            upstream
                .events(&upstream_run.id)
                .await
                .into_iter()
                .filter(|e| e.r#type == "approval:answered")
                .map(|e| e2e::payload(&e)),
        );
    }
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["response"], json!({"ok": true}));
    assert!(
        answered[0]["decider"].as_str().unwrap().starts_with("mcp client"),
        "{answered:?}"
    );
    let answers = upstream
        .ledger()
        .iter()
        .filter(|l| l.tool == "confirm" && l.what == "answered")
        .count();
    assert_eq!(answers, 1, "the upstream tool got its answer once");
    check_log(&kernel.events(&run).await, true);
}

/// A 2026-07-28 server that answers a call with `input_required` (the official Python SDK's, whose
/// tool asks its user through a resolver: `tests/mcp/asking_server.py`): the form becomes a
/// question in the kernel; once a person answers, `kernel-mcp` retries the call with the answer
/// and the server's `requestState`, and the tool acts on it once. A declined question reaches the
/// server as a declined form.
#[tokio::test]
async fn a_server_s_input_required_form_is_a_question_whose_answer_retries_the_call() {
    let kernel = Kernel::start();
    let ledger = kernel.dir.path().join("asking-server.log");
    let mcp = kernel.mcp_worker(&python_server("asking", &ledger));
    let connected = mcp.log.wait_for("mcp server connected");
    assert!(connected.contains(r#"revision="2026-07-28""#), "{connected}");
    tools_when(&kernel, |tools| names(tools).iter().any(|n| n == "asking_ship")).await;

    for (release, answer, said) in [
        ("4.2", Some(r#"{"ok": true, "note": "green"}"#), "shipped 4.2 (green)"),
        ("4.3", None, "held 4.3: decline"),
    ] {
        let run = kernel.create_run("mcp-user").await;
        let turn = spawn_turn(&kernel, &run, vec![call("asking_ship", json!({ "release": release }))]);
        let question = kernel.question_of(&run).await;
        assert_eq!(question.message, format!("asking asks: Ship {release} to production?"));
        let schema: Value = serde_json::from_str(&question.answer_schema_json).unwrap();
        assert_eq!(schema["properties"]["ok"]["type"], "boolean", "{schema}");
        match answer {
            Some(answer) => {
                kernel.kernelctl_ok(&["approvals", "answer", &question.id, "--with", answer, "--as", "dana"])
            }
            None => kernel.kernelctl_ok(&["approvals", "reject", &question.id, "--as", "dana"]),
        };
        let outcome = turn.await.unwrap();
        // The server gives its tool's return value as structured content too.
        let result: Value = serde_json::from_str(&outcome.results[0].content).unwrap();
        assert_eq!(result, json!({ "result": said }), "{:?}", outcome.results[0]);
        check_log(&kernel.events(&run).await, true);
    }
    let acted = std::fs::read_to_string(&ledger).unwrap();
    assert_eq!(
        acted, "shipped 4.2 (green)\nheld 4.3: decline\n",
        "the tool acted once on each answer"
    );
}

/// A 2025-11-25 server (server-everything) asks for a form mid-call with `elicitation/create`:
/// with that call the only one in flight on its connection, the form is a question of the call in
/// the kernel, and the person's answer is the form's content the server gets.
#[tokio::test]
async fn a_2025_server_s_elicitation_mid_call_is_a_question_of_that_call() {
    let kernel = Kernel::start();
    let mcp = kernel.mcp_worker(&everything_config(""));
    let connected = mcp.log.wait_for("mcp server connected");
    assert!(connected.contains(r#"revision="2025-11-25""#), "{connected}");
    tools_when(&kernel, |tools| {
        names(tools)
            .iter()
            .any(|n| n == "everything_trigger-elicitation-request")
    })
    .await;
    let run = kernel.create_run("mcp-user").await;
    let turn = spawn_turn(
        &kernel,
        &run,
        vec![call("everything_trigger-elicitation-request", json!({}))],
    );
    let question = kernel.question_of(&run).await;
    assert!(
        question.message.starts_with("everything asks: Please provide inputs"),
        "{}",
        question.message
    );
    let schema: Value = serde_json::from_str(&question.answer_schema_json).unwrap();
    assert_eq!(schema["required"], json!(["name"]), "{schema}");
    let answer = r#"{"name": "Dana Scully", "check": true, "integer": 7}"#;
    kernel.kernelctl_ok(&["approvals", "answer", &question.id, "--with", answer, "--as", "dana"]);
    let outcome = turn.await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.outcome, pb::CallOutcome::Ok as i32, "{result:?}");
    assert!(
        result.content.contains("- Name: Dana Scully") && result.content.contains("- Favorite Integer: 7"),
        "{}",
        result.content
    );
    check_log(&kernel.events(&run).await, true);
}
