//! The kernel's tools served to a real MCP client (the official `mcp` Python package, in
//! `tests/mcp/client.py`) by `kernelctl mcp serve`, over stdio and Streamable HTTP: listing with
//! hints, calls recorded in one run per session named after the client, progress, a tool error and
//! a denial as `isError` results, and an approval the request waits for.

use e2e::mcp::McpClient;
use e2e::{Kernel, KernelOptions, binary, check_log};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use serde_json::{Value, json};

fn result_of(event: &Value) -> &Value {
    &event["result"]
}

#[tokio::test]
async fn an_mcp_client_over_stdio_lists_and_calls_the_workers_tools_in_one_run() {
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(
            "rules:\n  - id: no-failing\n    match: { tools: [fail] }\n    decision: deny\n    reason: not today\n"
                .into(),
        ),
        ..Default::default()
    });
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
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();
    let pending = approvals
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .approvals;
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
/// from `tests/mcp/package.json`) against `kernelctl mcp serve`: every scenario passes but those
/// `tests/mcp/conformance-baseline.yaml` lists with the reason, and none of those passes.
#[test]
fn the_mcp_conformance_suite_passes_all_but_its_baseline() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let mcp = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp");
    let node = e2e::mcp::npm_bin("node");
    let suite = mcp.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let results = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(node)
        .arg(suite)
        .args(["server", "--url", &url, "--expected-failures"])
        .arg(mcp.join("conformance-baseline.yaml"))
        .arg("-o")
        .arg(results.path())
        .output()
        .expect("the conformance suite runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "conformance failures beyond the baseline:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("Baseline check passed"), "{text}");
}

#[tokio::test]
async fn a_client_that_gives_up_on_a_call_cancels_its_run_and_its_next_call_starts_another() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let server = json!([binary("kernelctl"), "--addr", kernel.url(), "mcp", "serve"]);
    let calls = json!([
        // The client's timeout sends notifications/cancelled for the request.
        {"tool": "slow", "arguments": {"steps": 300, "delay_ms": 100}, "timeout": 1.0},
        {"tool": "add", "arguments": {"a": 1, "b": 1}},
    ]);
    let client = McpClient::run("stdio", &server.to_string(), &calls, &json!({}));
    let seen = client.until(|e| result_of(e)["tool"] == "add");
    assert!(
        seen.iter().any(|e| e["error"]["tool"] == "slow"),
        "the client gave up: {seen:?}"
    );
    assert_eq!(result_of(seen.last().unwrap())["text"], json!(["2"]));
    let mut runs = kernel
        .runs()
        .await
        .list_runs(pb::ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .runs;
    runs.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].status, pb::RunStatus::Cancelled as i32, "{:?}", runs[0]);
    assert!(runs[0].reason.contains("cancelled by the MCP client"), "{:?}", runs[0]);
    let abandoned = &kernel.get(&runs[0].id).await.steps[0];
    assert_eq!(
        abandoned.status,
        pb::StepStatus::Cancelled as i32,
        "the call was cancelled on its worker"
    );
    assert_eq!(runs[1].status, pb::RunStatus::Running as i32);
    assert_eq!(kernel.get(&runs[1].id).await.steps[0].tool, "add");
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
