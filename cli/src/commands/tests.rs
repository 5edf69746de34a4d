//! Commands end to end against [`FakeKernel`]: real channel, real paging, captured stdout.

use clap::Parser;
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

use super::fake_kernel::{Data, EVENTS_PAGE, FakeKernel};
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
