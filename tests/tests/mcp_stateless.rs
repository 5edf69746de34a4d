//! The kernel's tools served at MCP 2026-07-28, the revision without sessions, to the official
//! `mcp` Python client (`tests/mcp/client.py` with `MCP_CLIENT_REVISION`): a run per call or the
//! run a call's `_meta` names, over both transports; a call re-issued after its stream was cut
//! runs once (the tool's own ledger counts); a call parked for a person asked of the client as
//! `input_required` and answered by it, refused when its key may not answer, and answered by a
//! person elsewhere for a client that cannot show a form.

use e2e::mcp::{McpClient, result_of};
use e2e::{Kernel, KernelOptions, binary, check_log, create_key};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use serde_json::{Value, json};

/// The results among `seen`, in order.
fn results(seen: &[Value]) -> Vec<&Value> {
    seen.iter().map(result_of).filter(|r| !r.is_null()).collect()
}

/// What the client printed up to and including its line for `count` results and errors.
fn answers(client: &McpClient, count: usize) -> Vec<Value> {
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|e: &&Value| !result_of(e).is_null() || e.get("error").is_some())
        .count()
        < count
    {
        seen.push(client.next());
    }
    seen
}

/// Where a client reaches `kernel`'s MCP bridge over `mode`: `kernelctl mcp serve --listen`
/// (started here, kept alive by the returned process) or the argv of `kernelctl mcp serve` over
/// stdio.
fn bridge(kernel: &Kernel, mode: &str) -> (Option<e2e::Process>, String) {
    match mode {
        "http" => {
            let (process, url) = kernel.mcp_serve_http(&[]);
            (Some(process), url)
        }
        _ => {
            let argv = json!([binary("kernelctl"), "--addr", kernel.url(), "mcp", "serve"]);
            (None, argv.to_string())
        }
    }
}

/// A call of `tool` with `arguments` that the client may re-issue: its idempotency key `key`.
fn keyed(tool: &str, arguments: Value, key: &str) -> Value {
    json!({"tool": tool, "arguments": arguments, "meta": {"kernel/idempotency-key": key}})
}

/// `call` as a client that gives up on it after `seconds` makes it: its stream is cut then.
fn cut_after(mut call: Value, seconds: f64) -> Value {
    call["timeout"] = json!(seconds);
    call
}

fn run_of(result: &Value) -> String {
    result["meta"]["kernel/run"]
        .as_str()
        .unwrap_or_else(|| panic!("no kernel/run in {result}"))
        .to_owned()
}

#[tokio::test]
async fn a_2026_client_gets_a_run_per_call_or_the_run_it_names_over_both_transports() {
    let kernel = e2e::mcp::kernel_denying_fail();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&["--label", "via=mcp"]);
    let stdio = json!([
        binary("kernelctl"),
        "--addr",
        kernel.url(),
        "mcp",
        "serve",
        "--label",
        "via=mcp"
    ])
    .to_string();
    for (mode, target) in [("http", url.as_str()), ("stdio", stdio.as_str())] {
        let calls = json!([
            {"tool": "add", "arguments": {"a": 2, "b": 3}},
            {"tool": "add", "arguments": {"a": 1, "b": 1}, "meta": {"kernel/run": "new"}},
            {"tool": "echo", "arguments": {"value": {"k": 1}}, "meta": {"kernel/run": "$last_run", "kernel/idempotency-key": "e1"}},
            {"tool": "echo", "arguments": {"value": {"k": 1}},
             "meta": {"kernel/run": "$last_run", "kernel/idempotency-key": "e1", "kernel/end-run": true}},
            {"tool": "fail", "arguments": {"message": "x"}},
            {"tool": "add", "arguments": {"a": 1, "b": 1}, "meta": {"kernel/run": 7}},
            {"tool": "add", "arguments": {"a": 1, "b": 1}, "meta": {"kernel/run": "no-such-run"}},
        ]);
        let client = McpClient::stateless(mode, target, &calls, &json!({}), &[]);
        assert_eq!(client.next()["protocol_version"], "2026-07-28", "{mode}");
        let listed = client.next();
        assert!(
            listed["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "add")),
            "{mode}: {listed}"
        );
        let seen = answers(&client, 7);
        let done = results(&seen);
        assert_eq!(done.len(), 5, "{mode}: {seen:?}");

        // A call of its own: a run made for it and completed once it settled.
        assert_eq!(done[0]["text"], json!(["5"]));
        let own = kernel.finished(&run_of(done[0])).await;
        assert_eq!(own.status, pb::RunStatus::Completed as i32, "{mode}: {own:?}");
        assert_eq!((own.agent.as_str(), own.labels["via"].as_str()), ("e2e-client", "mcp"));
        let steps = kernel.get(&own.id).await.steps;
        assert_eq!(steps.len(), 1);
        assert_eq!(done[0]["meta"]["kernel/step"], steps[0].step_key.as_str());

        // A run opened with "new" takes the calls that name it, and ends when one asks.
        let named = run_of(done[1]);
        assert_eq!((run_of(done[2]), run_of(done[3])), (named.clone(), named.clone()));
        assert_eq!(done[2]["structured"], json!({"k": 1}));
        assert_eq!(done[3]["text"], done[2]["text"], "the same key: the recorded result");
        assert_eq!(done[3]["meta"]["kernel/step"], "id:e1");
        let ended = kernel.finished(&named).await;
        assert_eq!(ended.status, pb::RunStatus::Completed as i32, "{mode}: {ended:?}");
        let steps = kernel.get(&named).await.steps;
        assert_eq!(steps.len(), 2, "two calls, the second answered once more from the log");
        assert_eq!((steps[1].step_key.as_str(), steps[1].replays), ("id:e1", 1));
        check_log(&kernel.events(&named).await, false);

        // A denied call is a result the model reads, and its run ends too.
        assert_eq!(done[4]["is_error"], true);
        assert_eq!(done[4]["text"], json!(["fail not allowed. reason: not today"]));
        let denied = kernel.finished(&run_of(done[4])).await;
        assert_eq!(denied.status, pb::RunStatus::Completed as i32);

        // A malformed or unknown run is the request's error, naming the field; nothing recorded.
        let errors: Vec<&str> = seen.iter().filter_map(|e| e["error"]["message"].as_str()).collect();
        assert_eq!(errors.len(), 2, "{mode}: {seen:?}");
        assert!(errors[0].contains("_meta.kernel/run: must be"), "{}", errors[0]);
        assert!(errors[1].contains("no-such-run"), "{}", errors[1]);
    }
    let runs = kernel.list_runs("e2e-client").await;
    assert_eq!(runs.len(), 6, "three runs for each transport: {runs:?}");
    assert!(
        runs.iter().all(|r| r.status == pb::RunStatus::Completed as i32),
        "{runs:?}"
    );
}

#[tokio::test]
async fn a_run_a_2026_client_opens_with_a_budget_refuses_the_call_past_it_as_a_result_the_model_reads() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let calls = json!([
        {"tool": "add", "arguments": {"a": 1, "b": 1}, "meta": {"kernel/run": "new", "kernel/budget": {"max_calls": 2}}},
        {"tool": "add", "arguments": {"a": 2, "b": 2}, "meta": {"kernel/run": "$last_run"}},
        {"tool": "add", "arguments": {"a": 3, "b": 3}, "meta": {"kernel/run": "$last_run"}},
        {"tool": "add", "arguments": {"a": 1, "b": 1}, "meta": {"kernel/run": "new", "kernel/budget": {"max_calls": "two"}}},
        {"tool": "add", "arguments": {"a": 1, "b": 1}, "meta": {"kernel/run": "new", "kernel/budget": {"tools": "x"}}},
    ]);
    let client = McpClient::stateless("http", &url, &calls, &json!({}), &[]);
    assert_eq!(client.next()["protocol_version"], "2026-07-28");
    client.next();
    let seen = answers(&client, 5);
    let done = results(&seen);
    assert_eq!(done.len(), 3, "{seen:?}");
    let run = run_of(done[0]);
    assert_eq!(
        (done[0]["text"].clone(), done[1]["text"].clone()),
        (json!(["2"]), json!(["4"]))
    );
    assert_eq!(done[2]["is_error"], true);
    assert_eq!(
        done[2]["text"],
        json!([format!(
            "budget exceeded: calls 3 of 2 for run {run}; 'add' did not run"
        )])
    );
    let budget = kernel.get(&run).await.run.unwrap().budget;
    assert_eq!((budget[0].max_calls, budget[0].spent_calls), (Some(2), 2), "{budget:?}");

    // A malformed budget is the request's error naming the key; one that limits nothing, the
    // kernel's refusal of the run; nothing is recorded for either.
    let errors: Vec<&str> = seen.iter().filter_map(|e| e["error"]["message"].as_str()).collect();
    assert_eq!(errors.len(), 2, "{seen:?}");
    assert!(
        errors[0].starts_with("_meta.kernel/budget: max_calls must be"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("budget[0]: sets none of max_calls, max_cost and max_time"),
        "{}",
        errors[1]
    );
    assert_eq!(kernel.list_runs("e2e-client").await.len(), 1);
}

#[tokio::test]
async fn a_call_re_issued_after_its_stream_was_cut_runs_once() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("fw");
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let charge = |hold_ms: u64| keyed("charge", json!({"hold_ms": hold_ms}), "pay-1");
    let calls = json!([
        // The client gives up while the charge runs: its stream is cut, not its call.
        cut_after(charge(1500), 0.3),
        // The same call again joins the one in flight, and once more after its run ended.
        charge(1500),
        charge(1500),
        // The same key with other arguments is not that call.
        charge(1),
        // Without a key a cut is the client's cancel.
        cut_after(json!({"tool": "sleepy", "arguments": {"hold_ms": 5000}}), 0.3),
    ]);
    let client = McpClient::stateless("http", &url, &calls, &json!({}), &[]);
    client.next();
    client.next();
    let seen = answers(&client, 5);
    let errors: Vec<&Value> = seen.iter().filter(|e| e.get("error").is_some()).collect();
    assert_eq!(errors.len(), 2, "{seen:?}");
    assert!(
        errors[0]["error"]["message"].as_str().unwrap().contains("timed out"),
        "{seen:?}"
    );
    let done = results(&seen);
    assert_eq!(done.len(), 3, "{seen:?}");
    let text = done[0]["text"][0].as_str().unwrap();
    assert!(text.starts_with("charged once under ik_"), "{text}");
    assert_eq!(done[1]["text"], done[0]["text"], "the run ended: its record answers");
    assert_eq!(run_of(done[1]), run_of(done[0]));
    assert_eq!(done[2]["is_error"], true);
    assert!(
        done[2]["text"][0].as_str().unwrap().starts_with("replay_input_changed"),
        "{}",
        done[2]
    );

    let idempotency_key = text.trim_start_matches("charged once under ");
    assert_eq!(
        kernel.executions(idempotency_key),
        1,
        "the at_most_once charge ran once: {:?}",
        kernel.ledger()
    );
    let run = kernel.finished(&run_of(done[0])).await;
    assert_eq!(run.status, pb::RunStatus::Completed as i32);
    let steps = kernel.get(&run.id).await.steps;
    assert_eq!(steps.len(), 1);
    assert_eq!((steps[0].step_key.as_str(), steps[0].attempts), ("id:pay-1", 1));
    check_log(&kernel.events(&run.id).await, false);

    // The cancelled sleepy call: cancelled in the kernel, its run completed.
    let sleepy = kernel
        .list_runs("e2e-client")
        .await
        .into_iter()
        .find(|r| r.id != run.id)
        .expect("the sleepy call's run");
    let ended = kernel.finished(&sleepy.id).await;
    assert_eq!(ended.status, pb::RunStatus::Completed as i32);
    let steps = kernel.get(&sleepy.id).await.steps;
    assert_eq!(steps[0].status, pb::StepStatus::Cancelled as i32, "{steps:?}");
}

#[tokio::test]
async fn a_call_parked_for_a_person_is_asked_of_the_client_and_answered_by_it_over_http() {
    parked_calls_answered_by_the_client("http").await;
}

#[tokio::test]
async fn a_call_parked_for_a_person_is_asked_of_the_client_and_answered_by_it_over_stdio() {
    parked_calls_answered_by_the_client("stdio").await;
}

async fn parked_calls_answered_by_the_client(mode: &str) {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = bridge(&kernel, mode);
    let refund = |customer: &str, answer: &str| json!({"tool": "refund", "arguments": {"customer": customer, "cents": 25_000}, "answer": answer});
    let calls = json!([refund("c1", "approve"), refund("c2", "reject"), refund("c3", "decline")]);
    let client = McpClient::stateless(mode, &url, &calls, &json!({}), &[]);
    client.next();
    client.next();
    let seen = answers(&client, 3);
    let asked: Vec<&str> = seen.iter().filter_map(|e| e["asked"]["message"].as_str()).collect();
    assert_eq!(asked.len(), 3, "{seen:?}");
    assert!(
        asked[0].starts_with("Approve the call of 'refund' with {\"cents\":25000,\"customer\":\"c1\"}?"),
        "{}",
        asked[0]
    );
    assert!(
        asked[0].contains("may be answered by any key with approvals:write"),
        "{}",
        asked[0]
    );
    let done = results(&seen);
    assert_eq!(done[0]["is_error"], false, "{seen:?}");
    assert!(
        done[0]["text"][0]
            .as_str()
            .unwrap()
            .starts_with("refunded 25000 cents to c1")
    );
    for (result, why) in [
        (done[1], "from the e2e client"),
        (done[2], "declined by the MCP client's user"),
    ] {
        assert_eq!(result["is_error"], true, "{result}");
        let text = result["text"][0].as_str().unwrap();
        assert!(text.starts_with("'refund' was not approved"), "{text}");
        assert!(text.contains(why), "{text}");
    }

    // Each answer is recorded as the kernel records any: by whom, bound to the call, used once.
    let run = kernel.finished(&run_of(done[0])).await;
    assert_eq!(run.status, pb::RunStatus::Completed as i32);
    let step = &kernel.get(&run.id).await.steps[0];
    let approval = step.approval.as_ref().expect("the step's approval");
    assert_eq!(approval.decider, "mcp client e2e-client");
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();
    let consumed = approvals
        .list_approvals(pb::ListApprovalsRequest {
            status: pb::ApprovalStatus::Consumed as i32,
            run_id: run.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(consumed.len(), 1, "{consumed:?}");
    assert_eq!(consumed[0].call_hash, step.call_hash);
    check_log(&kernel.events(&run.id).await, false);
}

#[tokio::test]
async fn a_key_s_scopes_hold_and_a_client_that_may_not_answer_or_has_no_forms_waits_for_a_person_elsewhere() {
    let (agent, agent_entry) = create_key("mcp-agent", &["runs:write", "tools:call", "runs:read"]);
    let (worker, worker_entry) = create_key("workers", &["workers:connect"]);
    let (approver, approver_entry) = create_key("approver", &["approvals:write", "runs:read"]);
    let (reader, reader_entry) = create_key("reader", &["runs:read", "runs:write"]);
    let files = tempfile::tempdir().unwrap();
    let auth = files.path().join("auth.yaml");
    let entries = [agent_entry, worker_entry, approver_entry, reader_entry].join("\n");
    std::fs::write(&auth, format!("keys:\n{entries}\n")).unwrap();
    let kernel = Kernel::start_with(KernelOptions {
        args: vec!["--auth-file".into(), auth.to_str().unwrap().into()],
        ..Default::default()
    });
    let mut command = std::process::Command::new(binary("demo-worker"));
    command
        .args(["--kernel", &kernel.url(), "--name", "w1"])
        .env("KERNEL_API_KEY", &worker)
        .env("RUST_LOG", "info");
    let worker_process = e2e::Process::start(command, "worker");
    worker_process.log.wait_for("worker session open");
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let headers = json!({"Authorization": format!("Bearer {agent}")});
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();

    // A key that may list but not call: the call is refused, and the model reads why.
    let calls = json!([{"tool": "add", "arguments": {"a": 1, "b": 2}}]);
    let reading = json!({"Authorization": format!("Bearer {reader}")});
    let client = McpClient::stateless("http", &url, &calls, &reading, &[]);
    client.next();
    assert!(client.next()["tools"].as_array().is_some_and(|t| !t.is_empty()));
    let refused = result_of(&client.next()).clone();
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(refused["text"][0].as_str().unwrap().contains("tools:call"), "{refused}");

    for env in [vec![], vec![("MCP_CLIENT_NO_FORMS", "1")]] {
        let calls = json!([{"tool": "refund", "arguments": {"customer": "c9", "cents": 25_000}, "answer": "approve"}]);
        let client = McpClient::stateless("http", &url, &calls, &headers, &env);
        client.next();
        client.next();
        // The client's approval (if it is asked) is refused for its key; the request waits.
        let waiting = client.until(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("waiting for a person's approval of 'refund'"))
        });
        let forms = waiting.iter().filter(|e| e.get("asked").is_some()).count();
        assert_eq!(forms, usize::from(env.is_empty()), "{env:?}: {waiting:?}");
        let pending = approvals
            .list_approvals(e2e::with_key(pb::ListApprovalsRequest::default(), &approver))
            .await
            .unwrap()
            .into_inner()
            .approvals;
        assert_eq!(pending.len(), 1, "{env:?}: the call still waits: {pending:?}");

        let mut approve = std::process::Command::new(binary("kernelctl"));
        let output = approve
            .args([
                "--addr",
                &kernel.url(),
                "--api-key",
                &approver,
                "approvals",
                "approve",
                "--as",
                "oncall",
                &pending[0].id,
            ])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let done = client.until(|e| !result_of(e).is_null());
        let result = result_of(done.last().unwrap());
        assert_eq!(result["is_error"], false, "{result}");
        let run = kernel
            .runs()
            .await
            .get_run(e2e::with_key(pb::GetRunRequest { run_id: run_of(result) }, &approver))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(run.steps[0].approval.as_ref().unwrap().decider, "approver");
    }
}

/// The client's lines up to its first result, with the task statuses it saw.
fn task_statuses(seen: &[Value]) -> Vec<&str> {
    seen.iter().filter_map(|e| e["task"]["status"].as_str()).collect()
}

#[tokio::test]
async fn a_slow_call_is_a_task_polled_from_the_log_across_a_kernel_sigkill_and_restart_over_http() {
    task_across_a_kernel_sigkill("http").await;
}

#[tokio::test]
async fn a_slow_call_is_a_task_polled_from_the_log_across_a_kernel_sigkill_and_restart_over_stdio() {
    task_across_a_kernel_sigkill("stdio").await;
}

async fn task_across_a_kernel_sigkill(mode: &str) {
    let mut kernel = Kernel::start_on_sqlite();
    let _worker = kernel.fault_worker("fw");
    let (_server, url) = bridge(&kernel, mode);
    let calls =
        json!([{"tool": "sleepy", "arguments": {"hold_ms": 4000}, "meta": {"kernel/idempotency-key": "nap-1"}}]);
    let client = McpClient::stateless(mode, &url, &calls, &json!({}), &[("MCP_CLIENT_TASKS", "1")]);
    client.next();
    client.next();
    let began = client.until(|e| e["task"]["status"] == "working");
    let task_id = began.last().unwrap()["task"]["id"].as_str().unwrap().to_owned();
    let (run_id, step) = task_id.split_once(':').unwrap();
    assert_eq!(step, "id:nap-1", "the task is the recorded call: {task_id}");

    kernel.kill9();
    // The client keeps polling while the kernel is gone, and after it is back.
    client.until(|e| e.get("poll_error").is_some());
    kernel.restart();
    let seen = client.until(|e| !result_of(e).is_null());
    let result = result_of(seen.last().unwrap());
    assert_eq!(result["is_error"], false, "{seen:?}");
    assert_eq!(result["text"], json!(["slept 4000ms"]));
    assert_eq!(task_statuses(&seen).last(), Some(&"completed"), "{seen:?}");
    assert_eq!(
        (run_of(result).as_str(), result["meta"]["kernel/step"].as_str()),
        (run_id, Some(step))
    );
    // Nobody was left to complete the call's run but the poll that saw it settled.
    let run = kernel.finished(run_id).await;
    assert_eq!(run.status, pb::RunStatus::Completed as i32, "{run:?}");
    check_log(&kernel.events(run_id).await, false);
}

#[tokio::test]
async fn a_task_waits_for_a_person_answered_with_tasks_update_and_a_cancelled_task_cancels_its_call_over_http() {
    tasks_answered_and_cancelled("http").await;
}

#[tokio::test]
async fn a_task_waits_for_a_person_answered_with_tasks_update_and_a_cancelled_task_cancels_its_call_over_stdio() {
    tasks_answered_and_cancelled("stdio").await;
}

async fn tasks_answered_and_cancelled(mode: &str) {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let (_server, url) = bridge(&kernel, mode);
    let calls = json!([
        {"tool": "refund", "arguments": {"customer": "c4", "cents": 25_000}, "answer": "approve"},
        {"tool": "slow", "arguments": {"steps": 100, "delay_ms": 100}, "cancel_after": 1.5},
        {"tool": "add", "arguments": {"a": 1, "b": 1}},
    ]);
    let client = McpClient::stateless(mode, &url, &calls, &json!({}), &[("MCP_CLIENT_TASKS", "1")]);
    client.next();
    client.next();

    let seen = client.until(|e| !result_of(e).is_null());
    // (a poll may find the approved call still running: working between the two)
    let statuses = task_statuses(&seen);
    assert_eq!(
        (statuses.first(), statuses.last()),
        (Some(&"input_required"), Some(&"completed")),
        "{seen:?}"
    );
    assert!(seen.iter().any(|e| {
        e["asked"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Approve the call of 'refund'"))
    }));
    let refunded = result_of(seen.last().unwrap());
    assert!(
        refunded["text"][0]
            .as_str()
            .unwrap()
            .starts_with("refunded 25000 cents to c4"),
        "{refunded}"
    );
    let step = &kernel.get(&run_of(refunded)).await.steps[0];
    assert_eq!(step.approval.as_ref().unwrap().decider, "mcp client e2e-client");

    // The client gives up on the task's call: it cancels the task as it goes.
    let seen = client.until(|e| e.get("error").is_some());
    assert_eq!(task_statuses(&seen), ["working"], "{seen:?}");
    let cancelled = seen
        .iter()
        .find_map(|e| e["task"]["id"].as_str())
        .and_then(|id| id.split_once(':'))
        .map(|(run, _)| run.to_owned())
        .unwrap();
    let run = kernel.finished(&cancelled).await;
    assert_eq!(run.status, pb::RunStatus::Completed as i32, "{run:?}");
    let steps = kernel.get(&cancelled).await.steps;
    assert_eq!(steps[0].status, pb::StepStatus::Cancelled as i32);
    assert!(steps[0].error.contains("tasks/cancel"), "{}", steps[0].error);

    // A quick call is no task: its result comes at once.
    let seen = client.until(|e| !result_of(e).is_null());
    assert!(task_statuses(&seen).is_empty(), "{seen:?}");
    assert_eq!(result_of(seen.last().unwrap())["text"], json!(["2"]));
}

/// The address of `kernel`'s own MCP listener (`--mcp-listen`), as its log says.
fn mcp_url(kernel: &Kernel) -> String {
    let line = kernel.process.log.wait_for("mcp listening");
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line}"));
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn on_two_replicas_a_re_issued_call_and_a_task_s_polls_go_to_the_other_one() {
    let Some(pg) = e2e::postgres::Postgres::database("mcp_on_two_replicas") else {
        return;
    };
    let replica = || {
        Kernel::start_with(KernelOptions {
            db: Some(pg.url.clone()),
            args: vec!["--mcp-listen".into(), "127.0.0.1:0".into()],
            ..Default::default()
        })
    };
    let (a, b) = (replica(), replica());
    let (url_a, url_b) = (mcp_url(&a), mcp_url(&b));
    let _worker = a.fault_worker("fw");

    // Begun on A and cut; re-issued on B, which joins the call A started.
    let charge = keyed("charge", json!({"hold_ms": 1500}), "pay-2");
    let cut = McpClient::stateless(
        "http",
        &url_a,
        &json!([cut_after(charge.clone(), 0.3)]),
        &json!({}),
        &[],
    );
    cut.until(|e| e.get("error").is_some());
    let again = McpClient::stateless("http", &url_b, &json!([charge]), &json!({}), &[]);
    let done = again.until(|e| !result_of(e).is_null());
    let result = result_of(done.last().unwrap());
    let text = result["text"][0].as_str().unwrap();
    assert!(text.starts_with("charged once under ik_"), "{result}");
    assert_eq!(
        a.executions(text.trim_start_matches("charged once under ")),
        1,
        "{:?}",
        a.ledger()
    );

    // A task of a call begun on A is polled on B: the log answers. The call runs long enough that
    // the second client, started after the first is cut, finds it still working on a loaded
    // machine (3 s was seen to pass first, the result then served with no task).
    let nap = keyed("sleepy", json!({"hold_ms": 8000}), "nap-2");
    let tasks = [("MCP_CLIENT_TASKS", "1")];
    let begun = McpClient::stateless(
        "http",
        &url_a,
        &json!([cut_after(nap.clone(), 0.3)]),
        &json!({}),
        &tasks,
    );
    begun.until(|e| e.get("error").is_some());
    let polled = McpClient::stateless("http", &url_b, &json!([nap]), &json!({}), &tasks);
    let seen = polled.until(|e| !result_of(e).is_null());
    assert_eq!(task_statuses(&seen), ["working", "completed"], "{seen:?}");
    let result = result_of(seen.last().unwrap());
    assert_eq!(result["text"], json!(["slept 8000ms"]));
    let run = b.finished(&run_of(result)).await;
    assert_eq!(run.status, pb::RunStatus::Completed as i32);
    let started = a
        .ledger()
        .iter()
        .filter(|l| l.what == "start" && l.tool == "sleepy")
        .count();
    assert_eq!(started, 1, "{:?}", a.ledger());
}

#[tokio::test]
async fn over_stdio_a_2026_client_s_cancel_cancels_even_a_call_it_could_re_issue() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let server = json!([binary("kernelctl"), "--addr", kernel.url(), "mcp", "serve"]).to_string();
    let slow = keyed("slow", json!({"steps": 100, "delay_ms": 100}), "s-1");
    let calls = json!([cut_after(slow.clone(), 0.5), slow]);
    let client = McpClient::stateless("stdio", &server, &calls, &json!({}), &[]);
    let seen = client.until(|e| !result_of(e).is_null());
    assert!(
        seen.iter().any(|e| e.get("error").is_some()),
        "the client gave up: {seen:?}"
    );
    // The same key again: the call was cancelled, and that is its recorded result.
    let result = result_of(seen.last().unwrap());
    assert_eq!(result["is_error"], true, "{result}");
    assert!(
        result["text"][0]
            .as_str()
            .unwrap()
            .contains("cancelled by the MCP client"),
        "{result}"
    );
    let steps = kernel.get(&run_of(result)).await.steps;
    assert_eq!(steps[0].status, pb::StepStatus::Cancelled as i32, "{steps:?}");
}

/// A tool's question to a person, asked mid-call, reaches a 2026-07-28 client as a form with the
/// question's own schema; the client's content is the answer the tool gets, and a decline
/// declines it, recorded as the client's.
#[tokio::test]
async fn a_tool_s_question_is_asked_of_the_client_with_its_own_schema_and_answered_by_it() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("fw");
    let (_server, url) = bridge(&kernel, "http");
    let confirm = |question: &str, answer: Value| json!({"tool": "confirm", "arguments": {"question": question}, "answer": answer});
    let calls = json!([
        confirm("Ship it?", json!({"ok": true})),
        confirm("And this?", json!("decline"))
    ]);
    let client = McpClient::stateless("http", &url, &calls, &json!({}), &[]);
    client.next();
    client.next();
    let seen = answers(&client, 2);
    let asked: Vec<&Value> = seen.iter().map(|e| &e["asked"]).filter(|a| !a.is_null()).collect();
    assert_eq!(asked.len(), 2, "{seen:?}");
    let message = asked[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Ship it? (asked by the tool 'confirm' mid-call; question "),
        "{message}"
    );
    assert_eq!(
        asked[0]["schema"]["properties"]["ok"]["type"], "boolean",
        "{:?}",
        asked[0]
    );
    let done = results(&seen);
    assert_eq!(done[0]["is_error"], false, "{seen:?}");
    let text: Value = serde_json::from_str(done[0]["text"][0].as_str().unwrap()).unwrap();
    assert_eq!(text, json!({"ok": true}));
    assert_eq!(done[1]["is_error"], true, "{seen:?}");
    let declined = done[1]["text"][0].as_str().unwrap();
    assert!(
        declined.contains("the question of 'confirm' was declined by mcp client e2e-client"),
        "{declined}"
    );
    let events = kernel.events(&run_of(done[0])).await;
    let answered = events
        .iter()
        .find(|e| e.r#type == "approval:answered")
        .map(e2e::payload)
        .expect("the answer in the log");
    assert_eq!(answered["response"], json!({"ok": true}));
    assert_eq!(answered["decider"], "mcp client e2e-client");
    check_log(&events, true);
}
