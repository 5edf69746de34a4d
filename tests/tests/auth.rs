//! API keys end to end: keys made by `kernelctl keys create`, a kernel started with `--auth-file`,
//! and every kind of refusal (no key, wrong key, missing scope, a worker offering a tool outside
//! its globs) answered with the right code and writing nothing; the approver recorded is the
//! key's name; without an auth file the kernel stays on loopback unless `--insecure`; SIGHUP puts
//! a new auth file in force and closes the sessions of keys it removed.

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::{Kernel, KernelOptions, Process, WAIT, binary, call, with_key};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use kernel_proto::v1::registry_service_client::RegistryServiceClient;
use kernel_proto::v1::run_service_client::RunServiceClient;
use kernel_proto::v1::tool_call_service_client::ToolCallServiceClient;
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::Code;

/// A key as `kernelctl keys create` prints it.
struct Key {
    secret: String,
    entry: String,
}

fn create_key(name: &str, scopes: &[&str], tools: &[&str]) -> Key {
    create_key_with(name, scopes, tools, &[])
}

/// A key with more `keys create` flags (`--grants`, `--group`).
fn create_key_with(name: &str, scopes: &[&str], tools: &[&str], extra: &[&str]) -> Key {
    let mut command = Command::new(binary("kernelctl"));
    command.args(["keys", "create", "--name", name]).args(extra);
    for scope in scopes {
        command.args(["--scope", scope]);
    }
    for tool in tools {
        command.args(["--tools", tool]);
    }
    let output = command.output().expect("kernelctl runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let secret = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert!(!stderr.contains(&secret), "the secret goes to stdout only");
    let entry = stderr
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    Key { secret, entry }
}

/// The keys of these tests and a kernel that requires them.
struct Secured {
    kernel: Kernel,
    admin: String,
    reader: String,
    agent: String,
    approver: String,
    worker: String,
    adder: String,
    files: tempfile::TempDir,
}

const APPROVE_ADD: &str = r#"
rules:
  - id: ask-before-adding
    match: { tools: ["add"] }
    decision: approve
"#;

fn secured() -> Secured {
    secured_with(Some(APPROVE_ADD))
}

fn secured_with(policy: Option<&str>) -> Secured {
    let admin = create_key("root", &["admin"], &[]);
    let reader = create_key("auditor", &["runs:read"], &[]);
    let agent = create_key("agent-1", &["runs:write", "tools:call", "runs:read"], &[]);
    let approver = create_key("oncall-alice", &["approvals:write", "runs:read"], &[]);
    let worker = create_key("demo-workers", &["workers:connect"], &["*"]);
    let adder = create_key("math-team", &["workers:connect"], &["add", "divide"]);
    let files = tempfile::tempdir().unwrap();
    let path: PathBuf = files.path().join("auth.yaml");
    let entries = [&admin, &reader, &agent, &approver, &worker, &adder].map(|k| k.entry.as_str());
    std::fs::write(&path, format!("keys:\n{}\n", entries.join("\n"))).unwrap();
    std::fs::write(files.path().join("reader.yaml"), &reader.entry).unwrap();
    let kernel = Kernel::start_with(KernelOptions {
        policy: policy.map(str::to_owned),
        args: vec!["--auth-file".into(), path.to_str().unwrap().into()],
        ..Default::default()
    });
    kernel.process.log.wait_for("api keys required");
    Secured {
        kernel,
        admin: admin.secret,
        reader: reader.secret,
        agent: agent.secret,
        approver: approver.secret,
        worker: worker.secret,
        adder: adder.secret,
        files,
    }
}

fn new_run() -> pb::CreateRunRequest {
    pb::CreateRunRequest {
        agent: "a".into(),
        input_json: "{}".into(),
        ..Default::default()
    }
}

async fn runs(kernel: &Kernel) -> RunServiceClient<tonic::transport::Channel> {
    RunServiceClient::connect(kernel.url()).await.unwrap()
}

async fn run_count(secured: &Secured) -> usize {
    runs(&secured.kernel)
        .await
        .list_runs(with_key(pb::ListRunsRequest::default(), &secured.admin))
        .await
        .unwrap()
        .into_inner()
        .runs
        .len()
}

/// Starts the demo worker with `key`, without waiting for a session it may be refused.
fn demo_worker(kernel: &Kernel, name: &str, key: &str) -> Process {
    let mut command = Command::new(binary("demo-worker"));
    command
        .arg("--kernel")
        .arg(kernel.url())
        .arg("--name")
        .arg(name)
        .env("KERNEL_API_KEY", key)
        .env("RUST_LOG", "info");
    Process::start(command, "worker")
}

/// Opens a turn of run `run` calling `add` (gated by this file's policies), with `key`.
async fn add_turn(kernel: &Kernel, run: &str, key: &str) -> tonic::Streaming<pb::SubmitTurnResponse> {
    turn_of(kernel, run, key, call("add", json!({"a": 2, "b": 3}))).await
}

/// Turn 0 of `run`, its one call `one`, submitted with `key`.
async fn turn_of(kernel: &Kernel, run: &str, key: &str, one: pb::ToolCall) -> tonic::Streaming<pb::SubmitTurnResponse> {
    ToolCallServiceClient::connect(kernel.url())
        .await
        .unwrap()
        .submit_turn(with_key(
            pb::SubmitTurnRequest {
                run_id: run.into(),
                turn: 0,
                calls: vec![one],
                offered_tools: Vec::new(),
                max_concurrency: 0,
            },
            key,
        ))
        .await
        .unwrap()
        .into_inner()
}

/// The turn's next interruption (the approval question).
async fn interrupted(turn: &mut tonic::Streaming<pb::SubmitTurnResponse>) -> pb::Interruption {
    loop {
        let item = tokio::time::timeout(WAIT, turn.next()).await.unwrap().unwrap().unwrap();
        if let Some(pb::submit_turn_response::Item::Interrupted(asked)) = item.item {
            return asked;
        }
    }
}

/// The turn's next result.
async fn result_of(turn: &mut tonic::Streaming<pb::SubmitTurnResponse>) -> pb::CallResult {
    loop {
        let item = tokio::time::timeout(WAIT, turn.next()).await.unwrap().unwrap().unwrap();
        if let Some(pb::submit_turn_response::Item::Result(result)) = item.item {
            return result;
        }
    }
}

#[tokio::test]
async fn no_key_or_a_wrong_key_is_unauthenticated_and_writes_nothing() {
    let secured = secured();
    let kernel = &secured.kernel;
    let mut client = runs(kernel).await;

    let status = client.create_run(new_run()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("Bearer"), "{status:?}");
    for wrong in ["nope", &format!("{}x", secured.agent)] {
        let status = client.create_run(with_key(new_run(), wrong)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }
    let mut turn = ToolCallServiceClient::connect(kernel.url()).await.unwrap();
    let status = turn
        .submit_turn(pb::SubmitTurnRequest {
            run_id: "0190a0a0-0000-7000-8000-000000000000".into(),
            turn: 0,
            calls: vec![call("add", json!({"a": 1, "b": 2}))],
            offered_tools: Vec::new(),
            max_concurrency: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = RegistryServiceClient::connect(kernel.url())
        .await
        .unwrap()
        .list_tools(pb::ListToolsRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    assert_eq!(run_count(&secured).await, 0, "refused requests write nothing");
    assert!(
        !kernel.process.log.text().contains(&secured.agent),
        "secrets never reach the log"
    );
}

#[tokio::test]
async fn a_key_without_the_scope_is_permission_denied() {
    let secured = secured();
    let kernel = &secured.kernel;
    let mut client = runs(kernel).await;

    let status = client
        .create_run(with_key(new_run(), &secured.reader))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("auditor") && status.message().contains("runs:write"),
        "{status:?}"
    );
    assert_eq!(run_count(&secured).await, 0, "a denied request writes nothing");

    // Reading is what the reader may do; an agent key may create runs; admin may do anything.
    client
        .list_runs(with_key(pb::ListRunsRequest::default(), &secured.reader))
        .await
        .unwrap();
    let run = client
        .create_run(with_key(new_run(), &secured.agent))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    let status = client
        .cancel_run(with_key(
            pb::CancelRunRequest {
                run_id: run.id.clone(),
                reason: "no".into(),
            },
            &secured.approver,
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();
    let status = approvals
        .approve_call(with_key(
            pb::ApproveCallRequest {
                approval_id: "x".into(),
                decider: "me".into(),
                reason: String::new(),
                ..Default::default()
            },
            &secured.agent,
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    client
        .cancel_run(with_key(
            pb::CancelRunRequest {
                run_id: run.id,
                reason: "admin".into(),
            },
            &secured.admin,
        ))
        .await
        .unwrap();
    assert_eq!(run_count(&secured).await, 1);
}

#[tokio::test]
async fn a_worker_key_registers_only_the_tools_its_globs_allow() {
    let secured = secured();
    let kernel = &secured.kernel;

    // The demo worker offers more than add and divide: its hello is refused, it stops for good.
    let mut refused = demo_worker(kernel, "sneaky", &secured.adder);
    let line = refused.log.wait_for("kernel refused the worker session");
    assert!(
        line.contains("PermissionDenied") && line.contains("math-team"),
        "{line}"
    );
    assert!(refused.wait_exit(WAIT).is_some(), "a refused worker does not retry");
    // A key without workers:connect cannot open a session at all.
    let mut reader = demo_worker(kernel, "reader", &secured.reader);
    let line = reader.log.wait_for("kernel refused the worker session");
    assert!(
        line.contains("PermissionDenied") && line.contains("workers:connect"),
        "{line}"
    );
    assert!(reader.wait_exit(WAIT).is_some());

    let mut registry = RegistryServiceClient::connect(kernel.url()).await.unwrap();
    let tools = registry
        .list_tools(with_key(pb::ListToolsRequest {}, &secured.reader))
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert!(tools.is_empty(), "a refused hello registers nothing: {tools:?}");

    let worker = demo_worker(kernel, "trusted", &secured.worker);
    worker.log.wait_for("worker session open");
    let workers = registry
        .list_workers(with_key(pb::ListWorkersRequest {}, &secured.reader))
        .await
        .unwrap()
        .into_inner()
        .workers;
    assert_eq!(workers.len(), 1, "{workers:?}");
}

#[tokio::test]
async fn the_approver_recorded_is_the_keys_name_and_kernelctl_sends_its_key() {
    let secured = secured();
    let kernel = &secured.kernel;
    let worker = demo_worker(kernel, "trusted", &secured.worker);
    worker.log.wait_for("worker session open");

    let run = runs(kernel)
        .await
        .create_run(with_key(new_run(), &secured.agent))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .id;
    let mut turn = add_turn(kernel, &run, &secured.agent).await;
    let asked = interrupted(&mut turn).await;

    // kernelctl without a key is refused; with one it lists and answers.
    let refused = kernel.kernelctl(&["approvals", "list"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unauthenticated"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--api-key or KERNEL_API_KEY"),
        "a missing key says how to give one: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let listed = kernel.kernelctl(&["--api-key", &secured.approver, "--json", "approvals", "list"]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["approvals"][0]["id"], asked.approval_id.as_str());

    let denied = kernel.kernelctl(&[
        "--api-key",
        &secured.reader,
        "approvals",
        "approve",
        &asked.approval_id,
        "--as",
        "auditor",
    ]);
    assert_eq!(denied.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&denied.stderr).contains("permission denied"));

    // The key speaks for its holder: `--as` cannot name someone else.
    let answer = Command::new(binary("kernelctl"))
        .args(["--addr", &kernel.url(), "approvals", "approve", &asked.approval_id])
        .args(["--as", "mallory", "--reason", "looks fine"])
        .env("KERNEL_API_KEY", &secured.approver)
        .output()
        .unwrap();
    assert!(answer.status.success(), "{}", String::from_utf8_lossy(&answer.stderr));
    assert!(
        String::from_utf8_lossy(&answer.stdout).contains("approved by oncall-alice"),
        "{}",
        String::from_utf8_lossy(&answer.stdout)
    );
    let result = result_of(&mut turn).await;
    assert_eq!(result.content, "5");

    let shown = kernel.kernelctl(&["--api-key", &secured.reader, "--json", "runs", "show", &run]);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let approvals = ApprovalServiceClient::connect(kernel.url())
        .await
        .unwrap()
        .list_approvals(with_key(
            pb::ListApprovalsRequest {
                run_id: run.clone(),
                status: pb::ApprovalStatus::Consumed as i32,
            },
            &secured.reader,
        ))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].decider, "oncall-alice");
}

fn kernel_on(listen: &str, extra: &[&str]) -> (Process, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(binary("kernel"));
    command
        .args(["--listen", listen, "--db"])
        .arg(dir.path().join("kernel.db"))
        .args(extra)
        .env_remove("KERNEL_AUTH_FILE")
        .env_remove("KERNEL_INSECURE");
    (Process::start(command, "kernel"), dir)
}

#[test]
fn without_an_auth_file_the_kernel_stays_on_loopback_unless_insecure() {
    let (mut public, _dir) = kernel_on("0.0.0.0:0", &[]);
    let status = public.wait_exit(WAIT).expect("the kernel refuses to start");
    assert!(!status.success());
    // The process may exit before the harness has read its last line.
    public.log.wait_for("not a loopback address");
    let text = public.log.text();
    assert!(
        text.contains("not a loopback address") && text.contains("--insecure") && text.contains("--auth-file"),
        "{text}"
    );

    let (insecure, _insecure_dir) = kernel_on("0.0.0.0:0", &["--insecure"]);
    insecure.log.wait_for("listening");
    assert!(insecure.log.text().contains("--insecure"));

    let (local, _local_dir) = kernel_on("127.0.0.1:0", &[]);
    local.log.wait_for("listening");
    assert!(local.log.text().contains("loopback only"));
}

#[tokio::test]
async fn the_demo_worker_and_agent_take_their_keys_from_the_environment() {
    let secured = secured_with(None);
    let kernel = &secured.kernel;
    let worker = demo_worker(kernel, "demo-worker", &secured.worker);
    worker.log.wait_for("worker session open");
    let agent = |key: &str| {
        Command::new(binary("demo-agent"))
            .arg("--kernel")
            .arg(kernel.url())
            .env("KERNEL_API_KEY", key)
            .output()
            .unwrap()
    };
    let refused = agent(&secured.reader);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("PermissionDenied"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let output = agent(&secured.agent);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let run = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let shown = kernel.kernelctl(&["--api-key", &secured.reader, "--json", "runs", "show", &run]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["run"]["status"], "completed");
}

#[tokio::test]
async fn sighup_puts_a_new_auth_file_in_force_and_closes_sessions_of_removed_keys() {
    let secured = secured_with(None);
    let kernel = &secured.kernel;
    let path = secured.files.path().join("auth.yaml");
    let mut worker = demo_worker(kernel, "trusted", &secured.worker);
    worker.log.wait_for("worker session open");
    let mut registry = RegistryServiceClient::connect(kernel.url()).await.unwrap();
    let workers = |key: &str| with_key(pb::ListWorkersRequest {}, key);
    assert_eq!(
        registry
            .list_workers(workers(&secured.reader))
            .await
            .unwrap()
            .into_inner()
            .workers
            .len(),
        1
    );

    // A file that does not load is refused; the keys in force stay.
    std::fs::write(&path, "keys: [ {name: broken").unwrap();
    let seen = kernel.process.log.len();
    kernel.process.hangup();
    kernel.process.log.wait_for_after(seen, "api keys not reloaded");
    assert!(registry.list_workers(workers(&secured.reader)).await.is_ok());

    // The new file keeps the reader and drops the worker's key, and adds one.
    let auditor = create_key("auditor-2", &["runs:read"], &[]);
    let reader_entry = std::fs::read_to_string(secured.files.path().join("reader.yaml")).unwrap();
    std::fs::write(&path, format!("keys:\n{reader_entry}\n{}\n", auditor.entry)).unwrap();
    let seen = kernel.process.log.len();
    kernel.process.hangup();
    kernel.process.log.wait_for_after(seen, "api keys reloaded");

    // The open session of the removed key is closed, and the worker cannot come back with it.
    let (_, line) = kernel
        .process
        .log
        .wait_for_after(seen, "worker session closed: its key no longer admits it");
    assert!(line.contains("demo-workers"), "{line}");
    worker.log.wait_for("kernel refused the worker session");
    assert!(worker.wait_exit(WAIT).is_some(), "a refused worker does not retry");
    e2e::eventually("the session of the removed key to close", || {
        let mut registry = registry.clone();
        let request = workers(&auditor.secret);
        async move {
            let workers = registry.list_workers(request).await.unwrap().into_inner().workers;
            if workers.is_empty() { Ok(()) } else { Err(workers) }
        }
    })
    .await;

    // The new key is in force, the kept one still works, a removed one is refused.
    assert!(registry.list_workers(workers(&secured.reader)).await.is_ok());
    let refused = registry.list_workers(workers(&secured.admin)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
}

const APPROVE_ADD_BY_ONCALL: &str = r#"
rules:
  - id: oncall-adds
    match: { tools: ["add"] }
    decision: approve
    approval: { approvers: ["payments-oncall"], message: "check the ticket", timeout: 1h }
"#;

/// With keys, a run holds only permissions its creating key may grant, and an approval whose
/// rule lists approvers takes an answer only from a key named there or in a group named there;
/// every refusal is PERMISSION_DENIED and writes nothing.
#[tokio::test]
async fn permissions_come_from_the_key_and_only_listed_approvers_may_answer() {
    let admin = create_key("root", &["admin"], &[]);
    let billing = create_key_with(
        "billing-agent",
        &["runs:write", "tools:call", "runs:read"],
        &[],
        &["--grants", "billing:*"],
    );
    let plain = create_key("plain-agent", &["runs:write", "tools:call"], &[]);
    let alice = create_key_with(
        "alice",
        &["approvals:write", "runs:read"],
        &[],
        &["--group", "payments-oncall"],
    );
    let bob = create_key("bob", &["approvals:write", "runs:read"], &[]);
    let worker = create_key("workers", &["workers:connect"], &["*"]);
    let files = tempfile::tempdir().unwrap();
    let path = files.path().join("auth.yaml");
    let entries = [&admin, &billing, &plain, &alice, &bob, &worker].map(|k| k.entry.as_str());
    std::fs::write(&path, format!("keys:\n{}\n", entries.join("\n"))).unwrap();
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(APPROVE_ADD_BY_ONCALL.into()),
        args: vec!["--auth-file".into(), path.to_str().unwrap().into()],
        ..Default::default()
    });
    let demo = demo_worker(&kernel, "trusted", &worker.secret);
    demo.log.wait_for("worker session open");

    let claim = |key: &str| {
        with_key(
            pb::CreateRunRequest {
                permissions: vec!["billing:write".into()],
                ..new_run()
            },
            key,
        )
    };
    let refused = runs(&kernel).await.create_run(claim(&plain.secret)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("permissions[0]") && refused.message().contains("'billing:write'"),
        "{}",
        refused.message()
    );
    let listed = runs(&kernel)
        .await
        .list_runs(with_key(pb::ListRunsRequest::default(), &admin.secret))
        .await
        .unwrap()
        .into_inner()
        .runs;
    assert!(listed.is_empty(), "a refused create writes nothing");

    let run = runs(&kernel)
        .await
        .create_run(claim(&billing.secret))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(run.permissions, ["billing:write"]);
    assert_eq!(run.permissions_granted_by, "billing-agent");
    let shown = kernel.kernelctl(&["--api-key", &admin.secret, "runs", "show", &run.id]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("billing:write (granted by key billing-agent)"),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );

    let mut turn = add_turn(&kernel, &run.id, &billing.secret).await;
    let asked = interrupted(&mut turn).await;
    let pending = kernel.kernelctl(&["--api-key", &bob.secret, "approvals", "list"]);
    let pending = String::from_utf8_lossy(&pending.stdout).into_owned();
    assert!(
        pending.contains("payments-oncall") && pending.contains("check the ticket"),
        "approvals list shows who may answer and what they are told:\n{pending}"
    );

    let events_before = kernel.events_with_key(&run.id, &admin.secret).await;
    let mut approvals = ApprovalServiceClient::connect(kernel.url()).await.unwrap();
    let not_listed = approvals
        .approve_call(with_key(
            pb::ApproveCallRequest {
                approval_id: asked.approval_id.clone(),
                decider: "payments-oncall".into(),
                reason: "I'll allow it".into(),
                ..Default::default()
            },
            &bob.secret,
        ))
        .await
        .unwrap_err();
    assert_eq!(not_listed.code(), Code::PermissionDenied, "{not_listed:?}");
    assert!(not_listed.message().contains("key 'bob'"), "{}", not_listed.message());
    assert_eq!(
        kernel.events_with_key(&run.id, &admin.secret).await.len(),
        events_before.len(),
        "a refused answer writes nothing"
    );

    approvals
        .approve_call(with_key(
            pb::ApproveCallRequest {
                approval_id: asked.approval_id.clone(),
                decider: String::new(),
                reason: "ticket 42".into(),
                ..Default::default()
            },
            &alice.secret,
        ))
        .await
        .expect("a member of a listed group answers");
    let result = result_of(&mut turn).await;
    assert_eq!(result.content, "5");
    assert_eq!(result.approval.map(|a| a.decider), Some("alice".to_owned()));
}

/// Starting a subagent creates a run: a hosting worker whose key lacks `runs:write` is refused
/// with PERMISSION_DENIED naming the scope, no child run is created, and the parent fails with it.
#[tokio::test]
async fn a_subagent_needs_runs_write_on_the_hosting_worker_s_key() {
    let secured = secured_with(None);
    let kernel = &secured.kernel;
    let worker = demo_worker(kernel, "hosts", &secured.worker);
    worker.log.wait_for("worker session open");
    let request = pb::CreateRunRequest {
        agent: "trip_planner".into(),
        input_json: json!({"destination": "Porto", "days": 1}).to_string(),
        hosted: true,
        ..Default::default()
    };
    let run = runs(kernel)
        .await
        .create_run(with_key(request, &secured.agent))
        .await
        .expect("a key with runs:write creates the hosted run")
        .into_inner()
        .run
        .unwrap()
        .id;
    let done = e2e::eventually("the run to end", || async {
        let got = runs(kernel)
            .await
            .get_run(with_key(pb::GetRunRequest { run_id: run.clone() }, &secured.admin))
            .await
            .unwrap()
            .into_inner()
            .run
            .unwrap();
        let ended = got.status == pb::RunStatus::Failed as i32 || got.status == pb::RunStatus::Completed as i32;
        if ended { Ok(got) } else { Err(got) }
    })
    .await;
    assert_eq!(done.status, pb::RunStatus::Failed as i32, "{done:?}");
    assert!(
        done.reason.contains("key 'demo-workers' needs the scope runs:write"),
        "{}",
        done.reason
    );
    assert_eq!(run_count(&secured).await, 1, "no child run was created");
}

/// A tool's body calling a tool makes a call of the run: a worker whose key lacks `tools:call`
/// is refused with PERMISSION_DENIED naming the scope, and no nested call is recorded.
#[tokio::test]
async fn a_tool_calling_a_tool_needs_tools_call_on_its_worker_s_key() {
    let secured = secured_with(None);
    let kernel = &secured.kernel;
    let _worker = kernel.fault_worker_with("relays", &["--api-key", &secured.worker]);
    let run = runs(kernel)
        .await
        .create_run(with_key(new_run(), &secured.agent))
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .id;
    let relay = call(
        "relay",
        json!({"tool": "lookup", "arguments": {"q": "x", "hold_ms": 0}}),
    );
    let mut turn = turn_of(kernel, &run, &secured.agent, relay).await;
    let result = result_of(&mut turn).await;
    assert_eq!(result.outcome, pb::CallOutcome::ToolError as i32, "{result:?}");
    assert!(
        result.content.contains("key 'demo-workers' needs the scope tools:call"),
        "{}",
        result.content
    );
    let got = runs(kernel)
        .await
        .get_run(with_key(pb::GetRunRequest { run_id: run }, &secured.admin))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.steps.len(), 1, "no nested call recorded: {:?}", got.steps);
}

/// `kernelctl mcp serve --listen`: an MCP client's bearer token is the key its calls are made with.
#[tokio::test]
async fn an_mcp_client_s_bearer_token_is_the_key_of_its_calls() {
    let secured = secured_with(None);
    let kernel = &secured.kernel;
    let _worker = kernel.worker_with("w1", &["--api-key", &secured.worker]);
    let (_server, url) = kernel.mcp_serve_http(&[]);
    let calls = json!([{"tool": "add", "arguments": {"a": 1, "b": 2}}]);

    let authorized = json!({"Authorization": format!("Bearer {}", secured.agent)});
    let client = e2e::mcp::McpClient::run("http", &url, &calls, &authorized);
    assert!(client.next()["tools"].as_array().is_some_and(|t| !t.is_empty()));
    let answered = client.next();
    assert_eq!(answered["result"]["text"], json!(["3"]), "{answered}");
    assert_eq!(run_count(&secured).await, 1);

    // No key: the bridge answers the session's first request 401 before any MCP processing (the
    // official client reads it as an error response), and nothing is recorded.
    let anonymous = e2e::mcp::McpClient::run("http", &url, &calls, &json!({}));
    anonymous.process.log.wait_for("Server returned an error response");
    assert_eq!(run_count(&secured).await, 1, "no run without a key");
}

/// An access token of the authorization server the auth file names (`oauth:`), signed with the
/// test issuer's key, for the kernel at `audience`, for `sub` with `scope`, expiring in `ttl_secs`
/// (negative: expired).
fn access_token(audience: &str, sub: &str, scope: &str, ttl_secs: i64) -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/oauth");
    let der = std::fs::read(fixtures.join("issuer-key.der")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let claims = json!({
        "iss": "https://idp.test/realms/agents",
        "aud": audience,
        "sub": sub,
        "scope": format!("openid {scope}"),
        "exp": now + ttl_secs,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("test-issuer-1".into());
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_ec_der(&der)).unwrap()
}

/// The whole answer to a GET of `path` at `addr`: status line, headers and body.
fn get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// With an authorization server in the auth file, the kernel's MCP listener is an OAuth protected
/// resource as the MCP specification asks: it publishes its metadata (RFC 9728) naming that
/// server, names it in each 401, and serves an MCP client whose bearer is one of the server's
/// access tokens for it, with that token's scopes; an expired token, or one without the scope to
/// list tools, is refused saying why.
#[tokio::test]
async fn an_authorization_server_s_access_token_is_an_mcp_client_s_key_and_the_listener_publishes_its_metadata() {
    let worker = create_key("demo-workers", &["workers:connect"], &["*"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let audience = format!("http://{addr}/mcp");
    let jwks = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/oauth/jwks.json");
    let files = tempfile::tempdir().unwrap();
    let path = files.path().join("auth.yaml");
    std::fs::write(
        &path,
        format!(
            "keys:\n{}\noauth:\n  issuer: https://idp.test/realms/agents\n  audience: {audience}\n  jwks_file: {}\n",
            worker.entry,
            jwks.display()
        ),
    )
    .unwrap();
    let kernel = Kernel::start_with(KernelOptions {
        args: vec![
            "--auth-file".into(),
            path.to_str().unwrap().into(),
            "--mcp-listen".into(),
            addr.clone(),
        ],
        ..Default::default()
    });
    let accepted = kernel.process.log.wait_for("oauth access tokens accepted");
    assert!(
        accepted.contains(r#"issuer="https://idp.test/realms/agents""#),
        "{accepted}"
    );
    kernel.process.log.wait_for("mcp listening");
    let _worker = kernel.worker_with("w1", &["--api-key", &worker.secret]);

    let metadata = get(&addr, "/.well-known/oauth-protected-resource/mcp");
    assert!(metadata.starts_with("HTTP/1.1 200"), "{metadata}");
    let document: Value = serde_json::from_str(metadata.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(document["resource"], audience.as_str());
    assert_eq!(
        document["authorization_servers"],
        json!(["https://idp.test/realms/agents"])
    );
    assert_eq!(document["bearer_methods_supported"], json!(["header"]));

    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let anonymous = e2e::mcp::post_head(&addr, None, initialize);
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
    let named = format!(r#"resource_metadata="http://{addr}/.well-known/oauth-protected-resource/mcp""#);
    assert!(anonymous.contains(&named), "{anonymous}");

    let token = access_token(&audience, "dana", "runs:read runs:write tools:call", 300);
    let calls = json!([{"tool": "add", "arguments": {"a": 1, "b": 2}}]);
    let bearer = json!({"Authorization": format!("Bearer {token}")});
    let client = e2e::mcp::McpClient::run("http", &audience, &calls, &bearer);
    assert!(client.next()["tools"].as_array().is_some_and(|t| !t.is_empty()));
    let answered = client.next();
    assert_eq!(answered["result"]["text"], json!(["3"]), "{answered}");

    let expired = access_token(&audience, "dana", "runs:read runs:write tools:call", -3600);
    let refused = e2e::mcp::post_head(&addr, Some(&format!("Bearer {expired}")), initialize);
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(
        refused.contains(r#"error="invalid_token""#) && refused.contains("expired"),
        "{refused}"
    );
    let elsewhere = access_token("https://other.test/mcp", "dana", "runs:read", 300);
    let refused = e2e::mcp::post_head(&addr, Some(&format!("Bearer {elsewhere}")), initialize);
    assert!(refused.contains("issued for another resource"), "{refused}");

    // kernelctl's bridge in front of the same kernel (behind a proxy that serves it at the
    // kernel's resource URL) publishes the same metadata, and the same token passes through it.
    let (_bridge, bridge_url) = kernel.mcp_serve_http(&[
        "--resource",
        &audience,
        "--authorization-server",
        "https://idp.test/realms/agents",
    ]);
    let bridge_addr = bridge_url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let published = get(&bridge_addr, "/.well-known/oauth-protected-resource/mcp");
    assert!(
        published.ends_with(metadata.split("\r\n\r\n").nth(1).unwrap()),
        "{published}"
    );
    let through = e2e::mcp::McpClient::run("http", &bridge_url, &calls, &bearer);
    assert!(through.next()["tools"].as_array().is_some_and(|t| !t.is_empty()));
    assert_eq!(through.next()["result"]["text"], json!(["3"]));

    let blind = access_token(&audience, "erin", "runs:write tools:call", 300);
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
    let forbidden = e2e::mcp::post_head(&addr, Some(&format!("Bearer {blind}")), list);
    assert!(forbidden.starts_with("HTTP/1.1 403"), "{forbidden}");
    assert!(
        forbidden.contains(r#"error="insufficient_scope", scope="runs:read""#),
        "{forbidden}"
    );
}
