//! The kernel's tools served to a real MCP client (the official `mcp` Python package, in
//! `tests/mcp/client.py`) by `kernelctl mcp serve`, over stdio and Streamable HTTP: listing with
//! hints, calls recorded in one run per session named after the client, progress, a tool error and
//! a denial as `isError` results, an approval the request waits for, a client's cancel that
//! cancels one call while the session's run goes on, the run completed when its session ends
//! (deleted, stdin closed, or idle past its timeout), and a 401 for a request without a known key.

use e2e::mcp::{McpClient, result_of};
use e2e::{Kernel, KernelOptions, binary, check_log, create_key};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use serde_json::{Value, json};

#[tokio::test]
async fn an_mcp_client_over_stdio_lists_and_calls_the_workers_tools_in_one_run() {
    let kernel = e2e::mcp::kernel_denying_fail();
    let _worker = kernel.worker("w1");
    let server = json!([
        binary("kernelctl"),
        "--addr",
        kernel.url(),
        "mcp",
        "serve",
        "--label",
        "via=mcp"
    ]);
    let calls = json!([
        {"tool": "add", "arguments": {"a": 2, "b": 3}},
        {"tool": "slow", "arguments": {"steps": 3, "delay_ms": 20}},
        {"tool": "divide", "arguments": {"a": 1, "b": 0}},
        {"tool": "fail", "arguments": {"message": "x"}},
        {"tool": "echo", "arguments": {"value": {"k": 1}}},
    ]);
    let client = McpClient::run("stdio", &server.to_string(), &calls, &json!({}));
    let listed = client.next();
    let tools = listed["tools"].as_array().expect("a tools line");
    let add = tools.iter().find(|t| t["name"] == "add").expect("add is listed");
    assert_eq!(add["annotations"]["read_only_hint"], true, "{add}");
    assert_eq!(add["schema"]["required"], json!(["a", "b"]));
    let refund = tools.iter().find(|t| t["name"] == "refund").expect("refund is listed");
    assert_eq!(refund["annotations"]["destructive_hint"], true, "{refund}");
    assert_eq!(
        refund["annotations"]["idempotent_hint"], false,
        "at_most_once: {refund}"
    );

    let seen = client.until(|e| result_of(e)["tool"] == "echo");
    let results: Vec<&Value> = seen.iter().map(result_of).filter(|r| !r.is_null()).collect();
    assert_eq!(results[0]["text"], json!(["5"]));
    assert_eq!(results[1]["text"], json!(["finished 3 steps"]));
    let progress: Vec<&Value> = seen.iter().filter(|e| e.get("progress").is_some()).collect();
    assert_eq!(progress.len(), 3, "the call's progress reached the client: {seen:?}");
    assert_eq!(progress[2]["message"], "step 3 of 3");
    assert_eq!(
        (results[2]["is_error"].clone(), results[2]["text"].clone()),
        (json!(true), json!(["division by zero"]))
    );
    assert_eq!(results[3]["is_error"], true, "a denied call is an error result");
    assert_eq!(results[3]["text"], json!(["fail not allowed. reason: not today"]));
    assert_eq!(
        results[4]["structured"],
        json!({"k": 1}),
        "a JSON object is structured content too"
    );

    let runs = kernel
        .runs()
        .await
        .list_runs(pb::ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert_eq!(runs.len(), 1, "one run for the session: {runs:?}");
    assert_eq!(runs[0].agent, "e2e-client", "named after the client's clientInfo");
    assert_eq!(runs[0].labels["via"], "mcp");
    let shown = kernel.get(&runs[0].id).await;
    assert_eq!(shown.steps.len(), 5);
    check_log(&kernel.events(&runs[0].id).await, false);
}

#[tokio::test]
async fn an_mcp_client_over_http_waits_for_a_person_s_approval_and_hears_why() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&["--allow", "refund", "--allow", "add"]);
    let calls = json!([{"tool": "refund", "arguments": {"customer": "c1", "cents": 25_000}}]);
    let client = McpClient::run("http", &url, &calls, &json!({}));
    let listed = client.next();
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["add", "refund"], "only what --allow lets through");

    // The request stays open while the run is parked, and the client is told why.
    let waiting = client.next();
    let message = waiting["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("waiting for a person's approval of 'refund'"),
        "{waiting}"
    );
    let pending = kernel.pending_approvals().await;
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert!(
        message.contains(&pending[0].id),
        "the message names the approval: {message}"
    );
    approvals
        .approve_call(pb::ApproveCallRequest {
            approval_id: pending[0].id.clone(),
            decider: "alice".into(),
            reason: "ok".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let done = client.until(|e| !result_of(e).is_null());
    let result = result_of(done.last().unwrap());
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["text"][0]
            .as_str()
            .unwrap()
            .starts_with("refunded 25000 cents to c1"),
        "{result}"
    );
}

/// The MCP conformance suite (`@modelcontextprotocol/conformance`, on the Node 22 it needs, both
/// from `tests/mcp/package.json`) against `kernelctl mcp serve` at `revision`: every scenario that
/// revision requires passes but those `tests/mcp/conformance-baseline-<revision>.yaml` lists with
/// the reason, and none of those passes.
fn conformance_at(revision: &str) {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let mcp = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp");
    let node = e2e::mcp::npm_bin("node");
    let suite = mcp.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let results = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(node)
        .arg(suite)
        .args([
            "server",
            "--url",
            &url,
            "--requirements",
            revision,
            "--expected-failures",
        ])
        .arg(mcp.join(format!("conformance-baseline-{revision}.yaml")))
        .arg("-o")
        .arg(results.path())
        .output()
        .expect("the conformance suite runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "conformance failures at {revision} beyond the baseline:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("Baseline check passed"), "{text}");
}

#[test]
fn the_mcp_conformance_suite_passes_all_but_its_baseline_at_2025_11_25() {
    conformance_at("2025-11-25");
}

#[test]
fn the_mcp_conformance_suite_passes_all_but_its_baseline_at_2026_07_28() {
    conformance_at("2026-07-28");
}

#[tokio::test]
async fn a_client_that_gives_up_on_a_call_cancels_that_call_and_its_next_call_runs_in_the_same_run() {
    let kernel = Kernel::start();
    let worker = kernel.worker("w1");
    let server = json!([binary("kernelctl"), "--addr", kernel.url(), "mcp", "serve"]);
    let calls = json!([
        // The client's timeout sends notifications/cancelled for the request.
        {"tool": "slow", "arguments": {"steps": 300, "delay_ms": 100}, "timeout": 1.0},
        {"tool": "add", "arguments": {"a": 1, "b": 1}},
    ]);
    let mut client = McpClient::run("stdio", &server.to_string(), &calls, &json!({}));
    let seen = client.until(|e| result_of(e)["tool"] == "add");
    assert!(
        seen.iter().any(|e| e["error"]["tool"] == "slow"),
        "the client gave up: {seen:?}"
    );
    assert_eq!(result_of(seen.last().unwrap())["text"], json!(["2"]));
    let stopped = worker.log.wait_for("dispatch cancelled");
    assert!(stopped.contains("cancelled by the MCP client"), "{stopped}");
    let runs = kernel
        .runs()
        .await
        .list_runs(pb::ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert_eq!(runs.len(), 1, "one run for the session, which went on: {runs:?}");
    let steps = kernel.get(&runs[0].id).await.steps;
    assert_eq!(steps[0].status, pb::StepStatus::Cancelled as i32, "{:?}", steps[0]);
    assert_eq!(steps[0].error, "cancelled: cancelled by the MCP client");
    assert_eq!(
        (steps[1].tool.as_str(), steps[1].status),
        ("add", pb::StepStatus::Succeeded as i32)
    );

    // The client closing its session (stdin) completes the run.
    client.process.child.wait().unwrap();
    let ended = kernel.finished(&runs[0].id).await;
    assert_eq!(ended.status, pb::RunStatus::Completed as i32, "{ended:?}");
    check_log(&kernel.events(&runs[0].id).await, true);
}

#[tokio::test]
async fn a_deleted_session_is_answered_200_and_completes_its_run() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let calls = json!([{"tool": "add", "arguments": {"a": 1, "b": 2}}]);
    let mut client = McpClient::run("http", &url, &calls, &json!({}));
    assert_eq!(
        result_of(&client.until(|e| !result_of(e).is_null()).pop().unwrap())["text"],
        json!(["3"])
    );
    assert!(client.process.child.wait().unwrap().success());
    let runs = kernel.list_runs("e2e-client").await;
    let ended = kernel.finished(&runs[0].id).await;
    assert_eq!(ended.status, pb::RunStatus::Completed as i32, "{ended:?}");
    let log = client.process.log.text();
    assert!(!log.contains("Session termination failed"), "{log}");
}

#[tokio::test]
async fn a_session_idle_past_its_timeout_is_closed_and_its_run_completed() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&["--session-idle-timeout-ms", "1000"]);
    let calls = json!([{"tool": "add", "arguments": {"a": 4, "b": 4}}]);
    let mut client = McpClient::run_with("http", &url, &calls, &json!({}), &[("MCP_CLIENT_KEEP_SESSION", "1")]);
    assert_eq!(
        result_of(&client.until(|e| !result_of(e).is_null()).pop().unwrap())["text"],
        json!(["8"])
    );
    assert!(client.process.child.wait().unwrap().success());
    let runs = kernel.list_runs("e2e-client").await;
    let ended = kernel.finished(&runs[0].id).await;
    assert_eq!(ended.status, pb::RunStatus::Completed as i32, "{ended:?}");
}

/// The status line and headers of an MCP `initialize` POSTed to `addr` with `authorization`.
fn initialize(addr: &str, authorization: Option<&str>) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    e2e::mcp::post_head(addr, authorization, body)
}

#[tokio::test]
async fn with_an_auth_file_an_mcp_request_without_a_known_key_gets_401_with_a_bearer_challenge() {
    let (agent, agent_entry) = create_key("mcp-agent", &["runs:write", "tools:call", "runs:read"]);
    let (worker, worker_entry) = create_key("workers", &["workers:connect"]);
    let (caller, caller_entry) = create_key("caller", &["runs:write", "tools:call"]);
    let files = tempfile::tempdir().unwrap();
    let auth = files.path().join("auth.yaml");
    std::fs::write(&auth, format!("keys:\n{agent_entry}\n{worker_entry}\n{caller_entry}\n")).unwrap();
    let kernel = Kernel::start_with(KernelOptions {
        args: vec![
            "--auth-file".into(),
            auth.to_str().unwrap().into(),
            "--mcp-listen".into(),
            "127.0.0.1:0".into(),
        ],
        ..Default::default()
    });
    let line = kernel.process.log.wait_for("mcp listening");
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line}"))
        .to_owned();

    let none = initialize(&addr, None);
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert!(none.contains(r#"www-authenticate: Bearer realm="kernel""#), "{none}");
    let unknown = initialize(&addr, Some("Bearer not-a-key"));
    assert!(unknown.starts_with("HTTP/1.1 401"), "{unknown}");
    assert!(unknown.contains(r#"error="invalid_token""#), "{unknown}");
    let known = initialize(&addr, Some(&format!("Bearer {agent}")));
    assert!(known.starts_with("HTTP/1.1 200"), "{known}");
    assert!(none.contains(r#"scope="runs:read runs:write tools:call""#), "{none}");

    // No OAuth protected-resource metadata: the kernel has no authorization server to name.
    let metadata = e2e::mcp::get_head(&addr, "/.well-known/oauth-protected-resource/mcp");
    assert!(metadata.starts_with("HTTP/1.1 404"), "{metadata}");

    // A known key without runs:read may not list the tools: 403 naming the scope it lacks.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let blind = e2e::mcp::post_head(&addr, Some(&format!("Bearer {caller}")), list);
    assert!(blind.starts_with("HTTP/1.1 403"), "{blind}");
    assert!(
        blind.contains(r#"error="insufficient_scope", scope="runs:read""#),
        "{blind}"
    );

    // (through the kernelctl bridge too, which asks the kernel about each key)
    let (_bridge, bridge_url) = kernel.mcp_serve_http(&[]);
    let bridge_addr = bridge_url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let refused = initialize(&bridge_addr, Some("Bearer not-a-key"));
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(refused.contains(r#"error="invalid_token""#), "{refused}");

    let mut command = std::process::Command::new(binary("demo-worker"));
    command
        .args(["--kernel", &kernel.url(), "--name", "w1"])
        .env("KERNEL_API_KEY", &worker)
        .env("RUST_LOG", "info");
    let worker_process = e2e::Process::start(command, "worker");
    worker_process.log.wait_for("worker session open");
    let calls = json!([{"tool": "add", "arguments": {"a": 20, "b": 22}}]);
    let headers = json!({"Authorization": format!("Bearer {agent}")});
    let client = McpClient::run("http", &format!("http://{addr}/mcp"), &calls, &headers);
    assert!(client.next()["tools"].as_array().is_some_and(|t| !t.is_empty()));
    assert_eq!(result_of(&client.next())["text"], json!(["42"]));
}

/// `kernel --mcp-listen`: the kernel's own MCP listener, the same bridge as `kernelctl mcp serve`.
#[tokio::test]
async fn the_kernel_s_own_mcp_listener_serves_a_client() {
    let kernel = Kernel::start_with(KernelOptions {
        args: vec!["--mcp-listen".into(), "127.0.0.1:0".into()],
        ..Default::default()
    });
    let line = kernel.process.log.wait_for("mcp listening");
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line}"));
    let _worker = kernel.worker("w1");
    let calls = json!([{"tool": "add", "arguments": {"a": 20, "b": 22}}]);
    let client = McpClient::run("http", &format!("http://{addr}/mcp"), &calls, &json!({}));
    assert!(
        client.next()["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "add"))
    );
    assert_eq!(result_of(&client.next())["text"], json!(["42"]));
}
