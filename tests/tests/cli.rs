//! kernelctl and the demo agent against a real kernel and worker, as a new user would run them.

use e2e::{Kernel, KernelOptions, Process, binary, call, submit};
use serde_json::{Value, json};

fn stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[tokio::test]
async fn runs_show_tells_which_tool_ran_where_with_what() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("shown").await;
    submit(
        &kernel,
        &run,
        0,
        vec![call("add", json!({"a": 20, "b": 22})), call("weather", json!({}))],
    )
    .await
    .unwrap();

    let human = stdout(&kernel.kernelctl(&["runs", "show", &run]));
    for needle in [
        run.as_str(),
        "shown",
        "add",
        "weather",
        "succeeded",
        "unknown_tool",
        "w1",
        "42",
        "unknown tool 'weather'",
    ] {
        assert!(human.contains(needle), "{needle:?} missing from:\n{human}");
    }

    let json: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "runs", "show", &run]))).unwrap();
    assert_eq!(json["run"]["id"], run.as_str());
    assert_eq!(json["run"]["status"], "running");
    let steps = json["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["tool"], "add");
    assert_eq!(steps[0]["status"], "succeeded");
    assert_eq!(steps[0]["arguments"], json!({"a": 20, "b": 22}));
    assert_eq!(steps[0]["output"], json!(42));
    assert_eq!(steps[0]["worker"], "w1");
    assert_eq!(steps[0]["attempts"], 1);
    assert_eq!(steps[1]["status"], "failed");
    assert_eq!(
        steps[1]["outcome"], "unknown_tool",
        "the JSON keeps the status and says why"
    );
    assert_eq!(steps[0]["outcome"], "ok");
    assert_eq!(steps[1]["attempts"], 0);

    let events = stdout(&kernel.kernelctl(&["--json", "runs", "events", &run]));
    let kinds: Vec<String> = events
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("run:created"));
    assert!(kinds.iter().any(|k| k == "tool:start"));

    let listed = stdout(&kernel.kernelctl(&["runs", "list"]));
    assert!(listed.contains(&run), "{listed}");
    // Found by a tool it called and by when it was created; not by a tool it never called.
    let idle = kernel.create_run("idle").await;
    let by_tool = stdout(&kernel.kernelctl(&["runs", "list", "--tool", "add", "--since", "1h"]));
    assert!(by_tool.contains(&run) && !by_tool.contains(&idle), "{by_tool}");
    let by_other = stdout(&kernel.kernelctl(&["runs", "list", "--tool", "echo"]));
    assert!(!by_other.contains(&run), "{by_other}");
    let recent = stdout(&kernel.kernelctl(&["runs", "list", "--since", "1h"]));
    assert!(recent.contains(&run) && recent.contains(&idle), "{recent}");
    let tools: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "tools", "list"]))).unwrap();
    let add = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "add")
        .expect("add is registered");
    assert_eq!(add["workers"], json!(["w1"]));
    let workers: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "workers", "list"]))).unwrap();
    assert_eq!(workers["workers"][0]["name"], "w1");

    let cancelled = stdout(&kernel.kernelctl(&["runs", "cancel", &run, "--reason", "done looking"]));
    assert!(cancelled.contains("cancelled"), "{cancelled}");
    let missing = kernel.kernelctl(&["runs", "show", "0192e4c4-8e5c-7a3f-8f5e-123456789abc"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));
    let usage = kernel.kernelctl(&["runs", "frobnicate"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[tokio::test]
async fn the_demo_agent_runs_its_turns_on_the_example_worker() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("demo-worker");
    let output = std::process::Command::new(binary("demo-agent"))
        .arg("--kernel")
        .arg(kernel.url())
        .output()
        .unwrap();
    let run = stdout(&output).trim().to_owned();
    assert!(
        !run.is_empty() && !run.contains(char::is_whitespace),
        "the agent prints only the run id: {run:?}"
    );

    let json: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "runs", "show", &run]))).unwrap();
    assert_eq!(json["run"]["status"], "completed");
    let steps = json["steps"].as_array().unwrap();
    let by_tool = |tool: &str| steps.iter().filter(|s| s["tool"] == tool).collect::<Vec<_>>();
    assert!(
        by_tool("add")
            .iter()
            .any(|s| s["status"] == "succeeded" && s["worker"] == "demo-worker")
    );
    assert!(
        by_tool("add").iter().any(|s| s["status"] == "failed"),
        "the wrong-typed call fails recoverably"
    );
    assert_eq!(by_tool("weather")[0]["status"], "failed");
    assert!(by_tool("slow")[0]["progress_count"].as_u64().unwrap() > 0);
    e2e::check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn the_demo_agent_waits_for_a_big_refund_to_be_approved() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("demo-worker");
    let mut command = std::process::Command::new(binary("demo-agent"));
    command.arg("--kernel").arg(kernel.url()).args(["--scenario", "refund"]);
    let mut agent = Process::start(command, "demo-agent");
    let created = agent.log.wait_for(" created");
    let run = created.split_whitespace().nth(1).unwrap().to_owned();

    let asked = agent.log.wait_for("waits for approval");
    let id = asked
        .rsplit("waits for approval ")
        .next()
        .unwrap()
        .trim_end_matches("; answer it with:");
    assert!(asked.contains("\"cents\":25000"), "{asked}");
    let printed = agent.log.wait_for("approvals approve");
    assert_eq!(
        printed.trim(),
        format!("cargo run -p kernelctl -- approvals approve {id} --as alice --reason \"ticket 42\"")
    );
    agent.log.wait_for("turn 0 #0 refund Ok: refunded 500 cents");
    let listed = stdout(&kernel.kernelctl(&["approvals", "list"]));
    assert!(listed.contains(id), "{listed}");

    stdout(&kernel.kernelctl(&["approvals", "approve", id, "--as", "alice", "--reason", "ticket 42"]));
    agent.log.wait_for("turn 0 #1 refund Ok: refunded 25000 cents");
    agent.log.wait_for(&format!("run {run} completed"));
    let status = agent
        .wait_exit(std::time::Duration::from_secs(10))
        .expect("the agent exits");
    assert!(status.success(), "{}", agent.log.text());

    let json: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "runs", "show", &run]))).unwrap();
    assert_eq!(json["run"]["status"], "completed");
    assert_eq!(json["steps"][1]["decided_by"], "tool:requires_approval");
    e2e::check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn runs_show_explains_a_call_waiting_for_its_retry() {
    let kernel = Kernel::start();
    let mut worker = kernel.fault_worker("w1");
    let run = kernel.create_run("stuck").await;
    let mut watch = e2e::Watch::open(&kernel, &run, 1, false).await;
    let url = kernel.url();
    let agent = tokio::spawn({
        let run = run.clone();
        async move {
            let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(url)
                .await
                .unwrap();
            let request = kernel_proto::v1::SubmitTurnRequest {
                run_id: run,
                turn: 0,
                calls: vec![call("flaky", json!({"succeed_on": 3}))],
                offered_tools: Vec::new(),
                max_concurrency: 0,
            };
            let _ = client.submit_turn(request).await;
        }
    });
    watch.event("tool:attempt_failed", |_| true).await;
    // With its only worker gone the retry cannot start: the step waits, and says why.
    worker.kill9();
    kernel.wait_for_workers("flaky", 0).await;

    let json: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "runs", "show", &run]))).unwrap();
    let step = &json["steps"][0];
    assert_eq!(step["status"], "pending");
    assert_eq!(step["attempts"], 1);
    assert_eq!(step["max_attempts"], 4);
    assert_eq!(step["error"]["message"], "attempt 1 fails");
    assert_eq!(step["worker"], "w1");
    assert!(step["next_attempt_at"].is_string(), "{step}");

    let human = stdout(&kernel.kernelctl(&["runs", "show", &run]));
    for needle in [
        "last error",
        "attempt 1 fails",
        "next attempt",
        "1 of at most 4",
        "last worker",
        "w1",
    ] {
        assert!(human.contains(needle), "{needle:?} missing from:\n{human}");
    }
    agent.abort();
}

#[tokio::test]
async fn status_reports_sessions_and_memory() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    kernel.wait_for_workers("add", 1).await;

    let json: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "status"]))).unwrap();
    assert_eq!(json["worker_sessions"], 1, "{json}");
    assert_eq!(json["queued_calls"], 0, "{json}");
    assert_eq!(json["leased_calls"], 0, "{json}");
    assert_eq!(json["live_runs"], 0, "{json}");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"), "{json}");
    // The kernel binary runs on jemalloc, so both memory figures are known.
    assert!(json["resident_bytes"].as_u64().unwrap() > 1 << 20, "{json}");
    assert!(json["allocated_bytes"].as_u64().unwrap() > 0, "{json}");

    let human = stdout(&kernel.kernelctl(&["status"]));
    for needle in ["worker sessions:", "resident:", "MiB", "allocated:"] {
        assert!(human.contains(needle), "{needle:?} missing from:\n{human}");
    }
}

/// `kernelctl runs events --follow` outlives a kernel restart: it says on stderr that the kernel
/// went away, reconnects, and goes on after the last event it printed, so each event is printed
/// once and none is skipped; it ends when the run does.
#[tokio::test]
async fn runs_events_follow_reconnects_after_a_kernel_restart_and_prints_each_event_once() {
    use std::io::BufRead;

    let mut kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("followed").await;
    submit(&kernel, &run, 0, vec![call("add", json!({"a": 1, "b": 2}))])
        .await
        .unwrap();
    let mut follower = std::process::Command::new(binary("kernelctl"))
        .args(["--addr", &kernel.url(), "--json", "runs", "events", &run, "--follow"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (line_tx, lines) = std::sync::mpsc::channel::<Value>();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = line_tx.send(serde_json::from_str(&line).expect("an NDJSON line"));
        }
    });
    let said = e2e::Log::default();
    said.follow_stream(follower.stderr.take().unwrap(), "kernelctl");
    let wait = std::time::Duration::from_secs(30);
    let mut seen = Vec::new();
    while !seen.iter().any(|e: &Value| e["type"] == "tool:result") {
        seen.push(lines.recv_timeout(wait).expect("the follower prints the first turn"));
    }

    kernel.restart();
    said.wait_for("the kernel went away");
    said.wait_for("reconnected; following from event");
    kernel.wait_for_workers("add", 1).await;
    submit(&kernel, &run, 1, vec![call("add", json!({"a": 3, "b": 4}))])
        .await
        .unwrap();
    kernel.complete(&run).await;
    while seen.last().is_none_or(|e| e["type"] != "run:completed") {
        seen.push(
            lines
                .recv_timeout(wait)
                .expect("the follower goes on after the restart"),
        );
    }
    let status = follower.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", said.text());
    let seqs: Vec<u64> = seen.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (1..=*seqs.last().unwrap()).collect();
    assert_eq!(seqs, expected, "each event once, in order, none skipped");
    assert_eq!(
        seen.iter().filter(|e| e["type"] == "tool:result").count(),
        2,
        "{seen:?}"
    );
}

/// The Rust getting-started guide's tool program (`readme-tool`) installs no logging, yet says what it
/// does: against an address where no kernel listens (the default one, here free), each backoff names
/// the kernel's address and the hint, and Ctrl-C stops it with a line saying so.
#[tokio::test]
async fn the_getting_started_worker_says_when_it_cannot_reach_the_kernel_and_when_it_stops() {
    assert!(
        std::net::TcpListener::bind("127.0.0.1:50051").is_ok(),
        "this test needs 127.0.0.1:50051 free: the getting-started guide's worker connects there"
    );
    let mut worker = Process::start(std::process::Command::new(binary("readme-tool")), "readme-tool");
    let first = worker.log.wait_for("cannot reach the kernel");
    assert!(first.contains("kernel=http://127.0.0.1:50051"), "{first}");
    assert!(
        first.contains("is the kernel running at http://127.0.0.1:50051?"),
        "{first}"
    );
    let (index, _) = worker.log.wait_for_after(0, "attempt=1");
    let (_, second) = worker.log.wait_for_after(index + 1, "attempt=2");
    assert!(
        second.contains("is the kernel running"),
        "the hint comes with every backoff: {second}"
    );
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &worker.child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    worker.log.wait_for("worker stopped");
    let status = worker.wait_exit(std::time::Duration::from_secs(10)).expect("it exits");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn replicas_list_shows_a_kernel_on_sqlite_alone() {
    let kernel = Kernel::start_with(KernelOptions {
        args: vec!["--advertise".into(), "kernel.example:50051".into()],
        sqlite: true,
        ..KernelOptions::default()
    });
    let _worker = kernel.worker("w1");
    let listed: Value = serde_json::from_str(&stdout(&kernel.kernelctl(&["--json", "replicas", "list"]))).unwrap();
    let rows = listed["replicas"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        rows[0]["address"], "kernel.example:50051",
        "the address given with --advertise"
    );
    assert_eq!(rows[0]["answering"], true);
    assert_eq!(rows[0]["alive"], true);
    assert_eq!(rows[0]["worker_sessions"], 1);
    let table = stdout(&kernel.kernelctl(&["replicas", "list"]));
    assert!(
        table.contains("kernel.example:50051") && table.contains("(this)"),
        "{table}"
    );
}
