//! How the kernel stops: a SIGTERM drains (health turns to not-serving, new turns are refused,
//! calls running on workers finish and their turns get the results, then it exits), and a kernel
//! whose log reader went away serves on and still stops on a signal.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use e2e::{Kernel, KernelOptions, Watch, call, submit, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::json;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The status line and body of `GET path` on an HTTP/1.1 listener.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the http listener");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    response
}

/// The port the kernel's log says its HTTP listener took.
fn http_addr(kernel: &Kernel) -> SocketAddr {
    let line = kernel.process.log.wait_for("http listening");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no addr= in {line:?}"))
}

async fn grpc_health(kernel: &Kernel) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(kernel.url())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .expect("health answers while the kernel drains");
    ServingStatus::try_from(answer.into_inner().status).unwrap()
}

/// SIGTERM with an `at_most_once` call running on a worker: the kernel reports not-serving on
/// gRPC health and `/readyz` at once, refuses a new turn, lets the call finish, sends its result
/// to the turn that waits for it, and only then exits, successfully. The call is not
/// `indeterminate`: it ran once and its result is recorded.
#[tokio::test]
async fn sigterm_drains_running_calls_to_their_turns_before_the_kernel_exits() {
    let mut kernel = Kernel::start_with(KernelOptions {
        args: vec![
            "--drain-timeout-ms".into(),
            "20000".into(),
            "--http-listen".into(),
            "127.0.0.1:0".into(),
        ],
        ..KernelOptions::default()
    });
    let http = http_addr(&kernel);
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("draining").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = {
        let kernel_url = kernel.url();
        let run = run.clone();
        tokio::spawn(async move {
            let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(kernel_url)
                .await
                .unwrap();
            let request = pb::SubmitTurnRequest {
                run_id: run,
                turn: 0,
                calls: vec![call("charge", json!({"hold_ms": 3_000}))],
                offered_tools: Vec::new(),
                max_concurrency: 0,
            };
            let mut stream = client.submit_turn(request).await?.into_inner();
            let mut results = Vec::new();
            while let Some(item) = tokio_stream::StreamExt::next(&mut stream).await {
                if let Some(pb::submit_turn_response::Item::Result(result)) = item?.item {
                    results.push(result);
                }
            }
            Ok::<_, tonic::Status>(results)
        })
    };
    watch.event("tool:start", |_| true).await;
    wait_ledger(&kernel, "the charge started on its worker", |l| {
        l.iter().any(|l| l.what == "start" && l.tool == "charge")
    })
    .await;
    assert_eq!(grpc_health(&kernel).await, ServingStatus::Serving);
    assert!(http_get(http, "/readyz").starts_with("HTTP/1.1 200"));

    let pid = kernel.process.child.id().to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(term.success());
    kernel.process.log.wait_for("draining: new turns and sessions refused");

    assert_eq!(grpc_health(&kernel).await, ServingStatus::NotServing);
    let ready = http_get(http, "/readyz");
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(http_get(http, "/healthz").starts_with("HTTP/1.1 503"));
    let other = kernel.create_run("too-late").await;
    let refused = submit(&kernel, &other, 0, vec![call("sleepy", json!({"hold_ms": 1}))])
        .await
        .expect_err("a new turn is refused while the kernel drains");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("kernel draining to stop"), "{refused:?}");

    let results = tokio::time::timeout(Duration::from_secs(30), turn)
        .await
        .expect("the turn ends")
        .unwrap()
        .expect("the turn gets its result, not an error");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].status, pb::CallStatus::Ok as i32, "{results:?}");
    assert_eq!(results[0].outcome, pb::CallOutcome::Ok as i32, "{results:?}");
    let status = kernel
        .process
        .wait_exit(Duration::from_secs(30))
        .expect("the kernel exits once the call settled");
    assert!(status.success(), "{status:?}");
    kernel.process.log.wait_for("stopped");
    let starts = kernel.ledger().iter().filter(|l| l.what == "start").count();
    assert_eq!(starts, 1, "the charge ran once");

    // What the log holds survives the stop: the next kernel on the same database finds the call
    // settled, not in flight.
    kernel.restart();
    let events = kernel.events(&run).await;
    let results: Vec<_> = events.iter().filter(|e| e.r#type == "tool:result").collect();
    assert_eq!(results.len(), 1, "{events:?}");
    assert_eq!(e2e::payload(results[0])["outcome"], "ok", "{events:?}");
    assert!(
        !events.iter().any(|e| e.r#type == "tool:lease_lost"),
        "no lease was lost: {events:?}"
    );
}

/// `kernel 2>&1 | tee kernel.log`, then Ctrl-C kills `tee`: the kernel's log lines meet a closed
/// pipe. It serves on (a worker joins, calls run, each line it could not write is counted in
/// GetStatus), and SIGTERM still stops it, successfully.
#[tokio::test]
async fn a_kernel_whose_log_reader_went_away_serves_on_and_stops_on_sigterm() {
    let mut kernel = Kernel::start_with_log_reader_gone(KernelOptions::default());
    // The worker's join is logged by the kernel: the first line that meets the closed pipe.
    let _worker = kernel.worker("w1");
    kernel.wait_for_workers("add", 1).await;
    let run = kernel.create_run("unlogged").await;
    for turn in 0..3 {
        let outcome = submit(&kernel, &run, turn, vec![call("add", json!({"a": turn, "b": 1}))])
            .await
            .expect("the turn runs");
        assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32, "{outcome:?}");
        assert_eq!(outcome.results[0].output_json, (turn + 1).to_string());
    }
    let status = kernel.status().await;
    assert!(
        status.log_lines_dropped > 0,
        "the worker's join could not be logged: {status:?}"
    );
    let status = kernel
        .process
        .terminate(Duration::from_secs(20))
        .expect("the kernel stops on SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// An agent whose turn meets a kernel draining to stop (refused: UNAVAILABLE, "kernel draining to
/// stop") goes on submitting it through the Rust SDK's `call_turn` until the kernel is back, and
/// gets its result; the call runs once.
#[tokio::test]
async fn the_rust_agent_resubmits_a_turn_refused_while_the_kernel_drains() {
    let mut kernel = Kernel::start_with(KernelOptions {
        args: vec!["--drain-timeout-ms".into(), "20000".into()],
        ..KernelOptions::default()
    });
    let _worker = kernel.fault_worker("w1");
    // A call that keeps the kernel draining for a while.
    let held = kernel.create_run("held").await;
    let holding = e2e::submit_in_background(&kernel, &held, 0, vec![call("sleepy", json!({"hold_ms": 2_000}))]);
    wait_ledger(&kernel, "the held call started", |l| {
        l.iter().any(|l| l.what == "start")
    })
    .await;
    let agent = worker_sdk::AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent
        .create_run(worker_sdk::NewRun::new("patient", json!({})))
        .await
        .unwrap();
    kernel.process.signal_term();
    kernel.process.log.wait_for("draining: new turns and sessions refused");
    let turn = tokio::spawn(async move {
        run.call_turn(0, vec![worker_sdk::Call::new("charge", json!({"hold_ms": 1}))])
            .await
    });
    let status = kernel
        .process
        .wait_exit(Duration::from_secs(30))
        .expect("the kernel exits once the held call settled");
    assert!(status.success(), "{status:?}");
    assert!(!turn.is_finished(), "the refused turn waits for the kernel to be back");
    kernel.restart();
    let outcomes = tokio::time::timeout(Duration::from_secs(60), turn)
        .await
        .expect("the turn ends once the kernel is back")
        .unwrap()
        .expect("the turn succeeds");
    assert_eq!(outcomes.len(), 1);
    assert!(outcomes[0].outcome.is_ok(), "{outcomes:?}");
    let charges = kernel
        .ledger()
        .iter()
        .filter(|l| l.what == "start" && l.tool == "charge")
        .count();
    assert_eq!(charges, 1, "the charge ran once");
    let held = holding.await.unwrap();
    assert_eq!(held.results[0].status, pb::CallStatus::Ok as i32, "{held:?}");
}
