//! Commands end to end against [`FakeKernel`]: real channel, real paging, captured stdout.

use clap::Parser;
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

use super::fake_kernel::{BRANCH_ID, Data, EVENTS_PAGE, FakeKernel};
use super::run;
use crate::args::{Cli, KernelAddr};
use crate::error::CliError;
use crate::view::tests::{sample_run, sample_step, ts};

async fn kernelctl(addr: &KernelAddr, args: &[&str]) -> Result<String, CliError> {
    let argv = ["kernelctl", "--addr", addr.as_str()];
    let cli = Cli::try_parse_from(argv.into_iter().chain(args.iter().copied())).unwrap();
    let mut out = Vec::new();
    run(cli, &mut out).await?;
    Ok(String::from_utf8(out).unwrap())
}

fn numbered_runs(count: usize) -> Vec<pb::Run> {
    (0..count)
        .map(|i| pb::Run {
            id: format!("run-{i:04}"),
            ..sample_run()
        })
        .collect()
}

fn events(run_id: &str, count: u64) -> Vec<pb::Event> {
    (1..=count)
        .map(|seq| pb::Event {
            run_id: run_id.into(),
            seq,
            r#type: if seq == count { "run:completed" } else { "tool:result" }.into(),
            schema_version: 1,
            at: ts(1_700_000_000 + seq as i64, 0),
            payload_json: format!(r#"{{"n": {seq}}}"#),
        })
        .collect()
}

#[tokio::test]
async fn runs_list_stops_at_the_limit_and_reports_where() {
    let fake = FakeKernel::new(Data {
        runs: numbered_runs(7),
        ..Default::default()
    });
    let addr = fake.serve().await;

    let text = kernelctl(&addr, &["runs", "list", "--limit", "5"]).await.unwrap();
    assert_eq!(text.lines().count(), 6, "{text}");
    assert!(text.lines().nth(1).unwrap().starts_with("run-0000 "));

    let doc: Value = serde_json::from_str(
        &kernelctl(&addr, &["runs", "list", "--limit", "5", "--json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["runs"].as_array().unwrap().len(), 5);
    assert_eq!(doc["next_page_token"], "5");
    assert_eq!(doc["runs"][0]["input"], json!({"budget": 300, "task": "book a flight"}));

    let rest: Value = serde_json::from_str(
        &kernelctl(&addr, &["runs", "list", "--page-token", "5", "--json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(rest["runs"].as_array().unwrap().len(), 2);
    assert_eq!(rest["next_page_token"], Value::Null);
}

#[tokio::test]
async fn runs_list_all_follows_every_page() {
    let fake = FakeKernel::new(Data {
        runs: numbered_runs(2_005),
        ..Default::default()
    });
    let addr = fake.serve().await;
    let doc: Value =
        serde_json::from_str(&kernelctl(&addr, &["runs", "list", "--all", "--json"]).await.unwrap()).unwrap();
    assert_eq!(doc["runs"].as_array().unwrap().len(), 2_005);
    assert_eq!(doc["runs"][2_004]["id"], "run-2004");
    assert_eq!(doc["next_page_token"], Value::Null);
    let data = fake.data.lock().unwrap();
    let sizes: Vec<u32> = data.list_runs_requests.iter().map(|r| r.page_size).collect();
    assert_eq!(sizes, [1_000, 1_000, 1_000]);
}

#[tokio::test]
async fn runs_list_sends_its_filters() {
    let fake = FakeKernel::default();
    let addr = fake.serve().await;
    let text = kernelctl(
        &addr,
        &[
            "runs",
            "list",
            "--status",
            "blocked",
            "--agent",
            "planner",
            "--label",
            "team=travel",
        ],
    )
    .await
    .unwrap();
    assert_eq!(text, "");
    let data = fake.data.lock().unwrap();
    let request = &data.list_runs_requests[0];
    assert_eq!(request.status, pb::RunStatus::Blocked as i32);
    assert_eq!(request.agent, "planner");
    assert_eq!(request.labels, ["team=travel"]);
    assert_eq!(request.page_size, 50);
}

#[tokio::test]
async fn runs_show_prints_run_and_steps() {
    let fake = FakeKernel::new(Data {
        runs: vec![sample_run()],
        steps: vec![sample_step(0, 1), sample_step(0, 0)],
        ..Default::default()
    });
    let addr = fake.serve().await;

    let text = kernelctl(&addr, &["runs", "show", "0192f0c1-run"]).await.unwrap();
    assert!(text.starts_with("run:"), "{text}");
    assert!(text.contains("\nKEY "), "{text}");
    assert!(text.find("\nt0/p0 search").unwrap() < text.find("\nt0/p1 search").unwrap());

    let doc: Value = serde_json::from_str(
        &kernelctl(&addr, &["runs", "show", "0192f0c1-run", "--json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["run"]["status"], "running");
    assert_eq!(doc["steps"][0]["key"], "t0/p0");
    assert_eq!(doc["steps"][1]["arguments"], json!({"max": 5, "q": "flights"}));
}

#[tokio::test]
async fn a_grpc_error_is_worded_with_its_code() {
    let addr = FakeKernel::default().serve().await;
    let err = kernelctl(&addr, &["runs", "show", "nope"]).await.unwrap_err();
    assert_eq!(err.to_string(), "not found: run nope not found");
}

#[tokio::test]
async fn runs_events_pages_until_next_seq_is_zero() {
    let fake = FakeKernel::new(Data {
        runs: vec![sample_run()],
        events: events("0192f0c1-run", 5),
        ..Default::default()
    });
    let addr = fake.serve().await;

    let text = kernelctl(&addr, &["runs", "events", "0192f0c1-run"]).await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(lines[0].starts_with("  SEQ  AT"));
    assert!(lines[1].starts_with("    1  2023-11-14T22:13:21.000Z  tool:result"));
    assert!(lines[5].contains("run:completed"));
    let froms: Vec<u64> = fake
        .data
        .lock()
        .unwrap()
        .list_events_requests
        .iter()
        .map(|r| r.from_seq)
        .collect();
    assert_eq!(froms, [1, 1 + EVENTS_PAGE as u64, 1 + 2 * EVENTS_PAGE as u64]);

    let ndjson = kernelctl(&addr, &["runs", "events", "0192f0c1-run", "--from", "4", "--json"])
        .await
        .unwrap();
    let objects: Vec<Value> = ndjson.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objects.len(), 2);
    assert_eq!(
        objects[0],
        json!({
            "run_id": "0192f0c1-run",
            "seq": 4,
            "type": "tool:result",
            "schema_version": 1,
            "at": "2023-11-14T22:13:24Z",
            "payload": {"n": 4},
        })
    );
}

#[tokio::test]
async fn runs_events_follow_streams_until_the_kernel_ends_it() {
    let fake = FakeKernel::new(Data {
        runs: vec![sample_run()],
        events: events("0192f0c1-run", 3),
        ..Default::default()
    });
    let addr = fake.serve().await;

    let text = kernelctl(&addr, &["runs", "events", "0192f0c1-run", "-f", "--progress"])
        .await
        .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[2].contains("progress"), "{text}");
    assert!(lines[2].ends_with("t0/p0 search: halfway (1/2)"), "{text}");

    let ndjson = kernelctl(&addr, &["runs", "events", "0192f0c1-run", "--follow", "--json"])
        .await
        .unwrap();
    let seqs: Vec<u64> = ndjson
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
}

#[tokio::test]
async fn runs_cancel_prints_the_new_status() {
    let fake = FakeKernel::new(Data {
        runs: vec![sample_run()],
        ..Default::default()
    });
    let addr = fake.serve().await;
    let text = kernelctl(&addr, &["runs", "cancel", "0192f0c1-run"]).await.unwrap();
    assert_eq!(text, "cancelled\n");
    let doc: Value = serde_json::from_str(
        &kernelctl(&addr, &["runs", "cancel", "0192f0c1-run", "--reason", "stop", "--json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["run"]["status"], "cancelled");
    assert_eq!(doc["run"]["reason"], "stop");
}

#[tokio::test]
async fn tools_and_workers_are_listed_sorted() {
    let tool = |name: &str| pb::RegisteredTool {
        spec: Some(pb::ToolSpec {
            name: name.into(),
            fingerprint: "00112233445566778899".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let worker = |name: &str| pb::WorkerInfo {
        session_id: format!("s-{name}"),
        name: name.into(),
        max_concurrency: 4,
        ..Default::default()
    };
    let fake = FakeKernel::new(Data {
        tools: vec![tool("zeta"), tool("alpha")],
        workers: vec![worker("w2"), worker("w1")],
        ..Default::default()
    });
    let addr = fake.serve().await;

    let text = kernelctl(&addr, &["tools", "list"]).await.unwrap();
    let names: Vec<&str> = text.lines().skip(1).map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(names, ["alpha", "zeta"]);
    assert!(text.contains("001122334455 "));
    let doc: Value = serde_json::from_str(&kernelctl(&addr, &["tools", "list", "--json"]).await.unwrap()).unwrap();
    assert_eq!(doc["tools"][0]["name"], "alpha");

    let text = kernelctl(&addr, &["workers", "list"]).await.unwrap();
    assert!(text.lines().nth(1).unwrap().starts_with("s-w1 "), "{text}");
    assert!(text.contains("0/4"));
    let doc: Value = serde_json::from_str(&kernelctl(&addr, &["workers", "list", "--json"]).await.unwrap()).unwrap();
    assert_eq!(doc["workers"][1]["session_id"], "s-w2");
}

#[tokio::test]
async fn an_unreachable_kernel_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let addr: KernelAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let err = kernelctl(&addr, &["tools", "list"]).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, CliError::Connect { .. }), "{text}");
    assert!(
        text.starts_with(&format!("cannot reach kernel at http://127.0.0.1:{port}: ")),
        "{text}"
    );
    assert!(text.to_lowercase().contains("refused"), "{text}");
}

const PARENT_ID: &str = "0192f0c1-run";

/// A parent run and a branch of it forked at t0/p1 with that step's result replaced: the branch
/// replays t0/p0, replays the replaced t0/p1, runs the read at t1/p0 live (with other arguments),
/// is refused the write at t1/p1 and so never reaches t2/p0.
fn parent_and_branch() -> Data {
    let step = |key: &str, tool: &str, arguments: &str, output: &str| {
        let turn = key[1..2].parse().unwrap();
        let position = key[4..5].parse().unwrap();
        pb::Step {
            step_key: key.into(),
            tool: tool.into(),
            arguments_json: arguments.into(),
            output_json: output.into(),
            ..sample_step(turn, position)
        }
    };
    let parent_steps = vec![
        pb::Step {
            kind: pb::StepKind::Agent as i32,
            step_key: "agent".into(),
            tool: "planner".into(),
            ..sample_step(0, 0)
        },
        step("t0/p0", "search", r#"{"q": "flights"}"#, r#"["AF12"]"#),
        step("t0/p1", "weather", r#"{"city": "Oslo"}"#, r#"{"temp": 12}"#),
        step("t1/p0", "search", r#"{"q": "hotels"}"#, r#"["Grand"]"#),
        step("t1/p1", "book", r#"{"flight": "AF12"}"#, r#""booked""#),
        step("t2/p0", "notify", r#"{"to": "ann"}"#, r#""sent""#),
    ];
    let replayed = |step: pb::Step, decided_by: &str| pb::Step {
        replayed_from_run_id: PARENT_ID.into(),
        decided_by: decided_by.into(),
        attempts: 0,
        worker: String::new(),
        dispatch_id: String::new(),
        ..step
    };
    let branch_steps = vec![
        replayed(parent_steps[1].clone(), "branch:parent"),
        replayed(
            step("t0/p1", "weather", r#"{"city": "Oslo"}"#, r#"{"temp": -3}"#),
            "branch:set_result",
        ),
        step("t1/p0", "search", r#"{"q": "cabins"}"#, r#"["Hut"]"#),
        pb::Step {
            status: pb::StepStatus::Failed as i32,
            outcome: pb::CallOutcome::WriteToolBlocked as i32,
            output_json: String::new(),
            error: "write_tool_blocked: 'book' is not read_only and the parent never recorded this call".into(),
            error_kind: pb::ErrorKind::Fatal as i32,
            ..step("t1/p1", "book", r#"{"flight": "AF12"}"#, "")
        },
    ];
    let parent = pb::Run {
        status: pb::RunStatus::Completed as i32,
        output_json: r#""booked""#.into(),
        ..sample_run()
    };
    let branch = pb::Run {
        id: BRANCH_ID.into(),
        status: pb::RunStatus::Failed as i32,
        reason: "write_tool_blocked: t1/p1 book".into(),
        forked_from_run_id: PARENT_ID.into(),
        fork_at_step_key: "t0/p1".into(),
        fork_results: [("t0/p1".to_owned(), r#"{"temp": -3}"#.to_owned())]
            .into_iter()
            .collect(),
        allow: vec!["tool:notify".into()],
        ..sample_run()
    };
    Data {
        runs: vec![parent, branch],
        run_steps: [
            (PARENT_ID.to_owned(), parent_steps),
            (BRANCH_ID.to_owned(), branch_steps),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn runs_fork_sends_what_the_flags_say() {
    let fake = FakeKernel::new(parent_and_branch());
    let addr = fake.serve().await;
    let text = kernelctl(
        &addr,
        &[
            "runs",
            "fork",
            PARENT_ID,
            "--at",
            "t0/p1",
            "--input",
            r#"{"task": "book a cabin"}"#,
            "--set-result",
            r#"t0/p1={"temp": -3}"#,
            "--set-result",
            r#"t0/p0=["BA7"]"#,
            "--label",
            "case=cold",
            "--idempotency-key",
            "cold-1",
        ],
    )
    .await
    .unwrap();
    assert_eq!(text, format!("{BRANCH_ID}\n"));
    {
        let data = fake.data.lock().unwrap();
        let request = &data.fork_requests[0];
        assert_eq!(request.run_id, PARENT_ID);
        assert_eq!(request.at_step_key, "t0/p1");
        assert_eq!(request.input_json, r#"{"task": "book a cabin"}"#);
        assert_eq!(request.set_results.len(), 2);
        assert_eq!(request.set_results["t0/p1"], r#"{"temp": -3}"#);
        assert_eq!(request.set_results["t0/p0"], r#"["BA7"]"#);
        assert_eq!(request.labels.len(), 1);
        assert_eq!(request.labels["case"], "cold");
        assert_eq!(request.idempotency_key, "cold-1");
    }

    let doc: Value = serde_json::from_str(
        &kernelctl(
            &addr,
            &["runs", "fork", PARENT_ID, "--set-result", "t0/p1=null", "--json"],
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["run"]["id"], BRANCH_ID);
    assert_eq!(doc["run"]["status"], "pending");
    assert_eq!(doc["run"]["forked_from_run_id"], PARENT_ID);
    assert_eq!(doc["run"]["fork_at_step_key"], Value::Null, "no --at: the whole record");
    assert_eq!(doc["run"]["fork_results"], json!({"t0/p1": null}));
    assert_eq!(doc["run"]["input"], json!({"budget": 300, "task": "book a flight"}));
    let data = fake.data.lock().unwrap();
    let request = &data.fork_requests[1];
    assert_eq!(
        (
            request.at_step_key.as_str(),
            request.input_json.as_str(),
            request.idempotency_key.as_str()
        ),
        ("", "", "")
    );
    assert!(request.labels.is_empty());
}

#[tokio::test]
async fn runs_fork_of_an_unknown_run_is_the_kernels_error() {
    let addr = FakeKernel::default().serve().await;
    let err = kernelctl(&addr, &["runs", "fork", "nope"]).await.unwrap_err();
    assert_eq!(err.to_string(), "not found: run nope not found");
}

#[tokio::test]
async fn runs_show_of_a_branch_says_where_it_came_from() {
    let fake = FakeKernel::new(parent_and_branch());
    let addr = fake.serve().await;
    let text = kernelctl(&addr, &["runs", "show", BRANCH_ID]).await.unwrap();
    assert!(
        text.contains(&format!("branch:            forked from {PARENT_ID} at t0/p1\n")),
        "{text}"
    );
    assert!(text.contains("replaced results:  t0/p1 = {\"temp\":-3}\n"), "{text}");
    assert!(text.contains("allow:             tool:notify (a case run"), "{text}");
    assert!(text.contains("\nt1/p1 book (write_tool_blocked)\n"), "{text}");
    let replayed = text.find("\nt0/p0 search (succeeded)\n").unwrap();
    let block = &text[replayed + 1..];
    let block = &block[..block.find("\n\n").unwrap() + 1];
    assert!(
        block.contains(&format!(
            "  replayed from:    {PARENT_ID} (its recorded outcome; nothing ran)\n"
        )),
        "{block}"
    );
    assert!(block.contains("  decided by:       branch:parent\n"), "{block}");
    assert!(
        text.contains(&format!(
            "  replayed from:    {PARENT_ID} (the result the fork put in place of its own; nothing ran)\n"
        )),
        "{text}"
    );

    let doc: Value =
        serde_json::from_str(&kernelctl(&addr, &["runs", "show", BRANCH_ID, "--json"]).await.unwrap()).unwrap();
    assert_eq!(doc["run"]["forked_from_run_id"], PARENT_ID);
    assert_eq!(doc["run"]["allow"], json!(["tool:notify"]));
    assert_eq!(doc["steps"][1]["replayed_from_run_id"], PARENT_ID);
    assert_eq!(doc["steps"][1]["decided_by"], "branch:set_result");
    assert_eq!(doc["steps"][2]["replayed_from_run_id"], Value::Null);
    assert_eq!(doc["steps"][3]["outcome"], "write_tool_blocked");
}

#[tokio::test]
async fn runs_diff_marks_each_step_of_a_branch() {
    let fake = FakeKernel::new(parent_and_branch());
    let addr = fake.serve().await;
    let text = kernelctl(&addr, &["runs", "diff", PARENT_ID, BRANCH_ID]).await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("   RUN") && lines[0].ends_with("REASON"), "{text}");
    assert!(
        lines[1].starts_with(&format!("A  {PARENT_ID}     planner  completed")) && lines[1].ends_with('-'),
        "{text}"
    );
    assert!(
        lines[2].starts_with(&format!("B  {BRANCH_ID}  planner  failed")),
        "{text}"
    );
    assert!(lines[2].ends_with("write_tool_blocked: t1/p1 book"), "{text}");
    assert!(text.contains("\nB is a branch of A at t0/p1\n"), "{text}");
    assert!(
        text.contains("\nthe branch stopped at t1/p1 (write_tool_blocked)\n"),
        "{text}"
    );

    let table = &text[text.find("\nKEY").unwrap() + 1..];
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|cell| !cell.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(rows[0], ["KEY", "TOOL", "A", "B", "MARK", "DIFFERS"], "{text}");
    assert_eq!(
        rows[1..],
        [
            vec!["t0/p0", "search", "succeeded", "succeeded", "replayed", "-"],
            vec!["t0/p1", "weather", "succeeded", "succeeded", "set", "result"],
            vec!["t1/p0", "search", "succeeded", "succeeded", "live", "arguments, result"],
            vec![
                "t1/p1",
                "book",
                "succeeded",
                "write_tool_blocked",
                "blocked",
                "result, status"
            ],
            vec!["t2/p0", "notify", "succeeded", "-", "only in A", "-"],
        ],
        "{text}"
    );
    assert!(
        !table.contains("agent"),
        "a hosted run's own dispatch is left out: {text}"
    );

    // The other way round, the header says who branched from whom; the marks are B's, the parent's.
    let text = kernelctl(&addr, &["runs", "diff", BRANCH_ID, PARENT_ID]).await.unwrap();
    assert!(text.contains("\nA is a branch of B at t0/p1\n"), "{text}");
    assert!(
        text.contains("\nthe branch stopped at t1/p1 (write_tool_blocked)\n"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("t2/p0") && l.contains("only in B")),
        "{text}"
    );
}

#[tokio::test]
async fn runs_diff_json_has_both_sides_of_every_step() {
    let fake = FakeKernel::new(parent_and_branch());
    let addr = fake.serve().await;
    let doc: Value = serde_json::from_str(
        &kernelctl(&addr, &["runs", "diff", PARENT_ID, BRANCH_ID, "--json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        doc["a"],
        json!({
            "id": PARENT_ID,
            "agent": "planner",
            "status": "completed",
            "reason": null,
            "capture": "io",
            "forked_from_run_id": null,
            "fork_at_step_key": null,
        })
    );
    assert_eq!(doc["b"]["forked_from_run_id"], PARENT_ID);
    assert_eq!(doc["b"]["fork_at_step_key"], "t0/p1");
    assert_eq!(doc["b"]["reason"], "write_tool_blocked: t1/p1 book");
    assert_eq!(doc["stopped_at"], "t1/p1");

    let steps = doc["steps"].as_array().unwrap();
    let marks: Vec<&str> = steps.iter().map(|s| s["mark"].as_str().unwrap()).collect();
    assert_eq!(marks, ["replayed", "set", "live", "blocked", "only_in_a"]);
    assert_eq!(
        steps[1],
        json!({
            "step_key": "t0/p1",
            "tool": "weather",
            "a": {
                "status": "succeeded",
                "outcome": null,
                "arguments": {"city": "Oslo"},
                "result": {"temp": 12},
                "error": null,
            },
            "b": {
                "status": "succeeded",
                "outcome": null,
                "arguments": {"city": "Oslo"},
                "result": {"temp": -3},
                "error": null,
            },
            "mark": "set",
            "differs": ["result"],
        })
    );
    assert_eq!(steps[0]["differs"], json!([]));
    assert_eq!(steps[2]["differs"], json!(["arguments", "result"]));
    assert_eq!(steps[2]["b"]["arguments"], json!({"q": "cabins"}));
    assert_eq!(steps[3]["b"]["status"], "failed");
    assert_eq!(steps[3]["b"]["outcome"], "write_tool_blocked");
    assert_eq!(steps[3]["b"]["result"], Value::Null);
    assert!(
        steps[3]["b"]["error"]
            .as_str()
            .unwrap()
            .starts_with("write_tool_blocked"),
        "{doc}"
    );
    assert_eq!(steps[3]["differs"], json!(["result", "status"]));
    assert_eq!(steps[4]["step_key"], "t2/p0");
    assert_eq!(steps[4]["a"]["result"], "sent");
    assert_eq!(steps[4]["b"], Value::Null);
}
