//! The worker protocol spoken by a raw gRPC client: registration checks, fencing of results by
//! `(dispatch_id, attempt)`, the watch stream's seam, and reflection for grpcurl.

use std::time::Duration;

use e2e::raw::{RawWorker, tool_spec};
use e2e::{Kernel, KernelOptions, Watch, call, check_log, submit};
use kernel_proto::v1 as pb;
use kernel_proto::v1::open_session_request::Message as In;
use kernel_proto::v1::open_session_response::Message as Out;
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

#[tokio::test]
async fn results_from_a_dispatch_not_held_are_refused_and_record_nothing() {
    let kernel = Kernel::start();
    let (mut worker, welcome) = RawWorker::open(&kernel, vec![tool_spec("raw_tool", "a raw tool")])
        .await
        .unwrap();
    assert!(!welcome.session_id.is_empty());
    assert!(welcome.heartbeat_interval_ms > 0 && welcome.lease_ttl_ms > welcome.heartbeat_interval_ms);
    let run = kernel.create_run("raw").await;
    let turn = {
        let kernel_url = kernel.url();
        let run = run.clone();
        tokio::spawn(async move {
            let request = pb::SubmitTurnRequest {
                run_id: run,
                turn: 0,
                calls: vec![call("raw_tool", json!({"x": 1}))],
                offered_tools: Vec::new(),
                max_concurrency: 0,
            };
            let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(kernel_url)
                .await
                .unwrap();
            let mut stream = client.submit_turn(request).await.unwrap().into_inner();
            let mut results = Vec::new();
            while let Some(item) = stream.next().await {
                if let Some(pb::submit_turn_response::Item::Result(r)) = item.unwrap().item {
                    results.push(r);
                }
            }
            results
        })
    };
    let dispatch = worker.dispatch().await;
    assert_eq!(dispatch.tool, "raw_tool");
    assert_eq!(dispatch.attempt, 1);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&dispatch.arguments_json).unwrap(),
        json!({"x": 1})
    );
    assert!(dispatch.idempotency_key.starts_with("ik_"));
    let events_before = kernel.events(&run).await.len();

    let ack = worker.result("not-a-dispatch", 1, "1").await;
    assert!(!ack.accepted, "a dispatch this worker does not hold");
    let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt + 1, "1").await;
    assert!(!ack.accepted, "a wrong attempt");
    assert_eq!(
        kernel.events(&run).await.len(),
        events_before,
        "refused results record nothing"
    );

    let ack = worker
        .result(&dispatch.dispatch_id, dispatch.attempt, r#"{"b":2,"a":1}"#)
        .await;
    assert!(ack.accepted);
    let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt, "2").await;
    assert!(!ack.accepted, "a duplicate result");

    let results = turn.await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].status, pb::CallStatus::Ok as i32);
    assert_eq!(
        results[0].content, r#"{"a":1,"b":2}"#,
        "non-string results reach the model as sorted compact JSON"
    );
    let events = kernel.events(&run).await;
    check_log(&events, true);
    assert_eq!(events.iter().filter(|e| e.r#type == "tool:result").count(), 1);
}

/// A worker that sends its last result and closes its stream at once (as a draining one does)
/// has that result recorded: the session gives up its leases only after its results are written,
/// so the call is not taken for lost, run again, or failed for want of a worker.
#[tokio::test]
async fn a_result_sent_just_before_the_stream_closes_is_recorded() {
    let kernel = Kernel::start_with(KernelOptions {
        schedule_to_start_timeout_ms: 200,
        ..KernelOptions::default()
    });
    for round in 0..25 {
        let mut worker = RawWorker::offering(&kernel, "last_word").await.unwrap();
        let run = kernel.create_run("raw").await;
        let answer_and_close = async move {
            let dispatch = worker.dispatch().await;
            worker
                .send(In::Result(pb::DispatchResult {
                    dispatch_id: dispatch.dispatch_id,
                    attempt: dispatch.attempt,
                    outcome: Some(pb::dispatch_result::Outcome::OutputJson(round.to_string())),
                }))
                .await;
            // Our side of the stream ends; the kernel's ends once it is done with the session.
            let RawWorker { tx, mut rx, .. } = worker;
            drop(tx);
            while let Some(Ok(_)) = rx.next().await {}
        };
        let turn = submit(&kernel, &run, 0, vec![call("last_word", json!({"round": round}))]);
        let (outcome, ()) = tokio::time::timeout(e2e::WAIT, async { tokio::join!(turn, answer_and_close) })
            .await
            .expect("the turn ends");
        let outcome = outcome.unwrap();
        let [result] = &outcome.results[..] else {
            panic!("one result expected, got {:?}", outcome.results)
        };
        assert_eq!(result.status, pb::CallStatus::Ok as i32, "round {round}: {result:?}");
        assert_eq!(result.content, round.to_string());
        assert_eq!(result.attempts, 1, "round {round}: the call ran once");
    }
}

#[tokio::test]
async fn a_conflicting_registration_is_refused_naming_both_fingerprints() {
    let kernel = Kernel::start();
    let first = tool_spec("shared", "version one");
    let (_worker, _) = RawWorker::open(&kernel, vec![first.clone()]).await.unwrap();
    let (_same, _) = RawWorker::open(&kernel, vec![first.clone()])
        .await
        .expect("the same fingerprint may be shared");
    let second = tool_spec("shared", "version two");
    let status = RawWorker::open(&kernel, vec![second.clone()])
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(status.message().contains(&first.fingerprint), "{}", status.message());
    assert!(status.message().contains(&second.fingerprint), "{}", status.message());
}

#[tokio::test]
async fn malformed_hellos_get_precise_errors() {
    let kernel = Kernel::start();
    let mut bad_name = tool_spec("x", "d");
    bad_name.name = "no spaces allowed".into();
    let status = RawWorker::open(&kernel, vec![bad_name])
        .await
        .map(|_| ())
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("hello.tools[0].name"),
        "{}",
        status.message()
    );

    let mut lying = tool_spec("x", "d");
    lying.fingerprint = "0".repeat(64);
    let status = RawWorker::open(&kernel, vec![lying])
        .await
        .map(|_| ())
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("hello.tools[0].fingerprint"),
        "{}",
        status.message()
    );

    let status = RawWorker::open(&kernel, vec![]).await.map(|_| ()).expect_err("refused");
    assert!(status.message().starts_with("hello.tools"), "{}", status.message());

    // A resource instance must be filled from an argument every valid call has.
    let mut unfillable = tool_spec("x", "d");
    unfillable.options = Some(pb::ToolOptions {
        resources: vec!["workspace".into(), "repo:{repo}".into()],
        ..Default::default()
    });
    let status = RawWorker::open(&kernel, vec![unfillable])
        .await
        .map(|_| ())
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("hello.tools[0].options.resources[1]: 'repo:{repo}': {repo} is not a required argument"),
        "{}",
        status.message()
    );

    let tools = kernel
        .registry()
        .await
        .list_tools(pb::ListToolsRequest {})
        .await
        .unwrap()
        .into_inner()
        .tools;
    assert!(tools.is_empty(), "refused registrations register nothing: {tools:?}");
}

#[tokio::test]
async fn a_silent_worker_loses_its_session_and_its_call_goes_to_another() {
    let kernel = Kernel::start();
    let (mut silent, welcome) = RawWorker::open(&kernel, vec![tool_spec("raw_tool", "a raw tool")])
        .await
        .unwrap();
    let run = kernel.create_run("raw").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let kernel_ref = &kernel;
    let run_ref = run.clone();
    let turn = async move {
        submit(kernel_ref, &run_ref, 0, vec![call("raw_tool", json!({}))])
            .await
            .unwrap()
    };
    let drive = async {
        let first = silent.dispatch().await;
        // Never heartbeat: the lease runs out and the session is ended by the kernel.
        let lost = watch.event("tool:lease_lost", |_| true).await;
        assert_eq!(lost["dispatch_id"], first.dispatch_id.as_str());
        assert!(lost["reason"].as_str().unwrap().contains("lease expired"), "{lost}");
        let (mut second, _) = RawWorker::open(kernel_ref, vec![tool_spec("raw_tool", "a raw tool")])
            .await
            .unwrap();
        let redispatch = second.dispatch().await;
        assert_eq!(redispatch.attempt, 2);
        assert_eq!(
            redispatch.idempotency_key, first.idempotency_key,
            "the key is stable across redispatch"
        );
        let heartbeat = tokio::spawn({
            let tx = second.tx.clone();
            let every = Duration::from_millis(welcome.heartbeat_interval_ms);
            async move {
                while tx
                    .send(pb::OpenSessionRequest {
                        message: Some(In::Heartbeat(pb::Heartbeat {})),
                    })
                    .await
                    .is_ok()
                {
                    tokio::time::sleep(every).await;
                }
            }
        });
        assert!(second.result(&redispatch.dispatch_id, 2, "\"done\"").await.accepted);
        heartbeat.abort();
    };
    let (outcome, ()) = tokio::join!(turn, drive);
    assert_eq!(
        outcome.results[0].content, "done",
        "a string result reaches the model as is"
    );
    assert_eq!(outcome.results[0].attempts, 2);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn the_watch_stream_has_no_gap_and_no_duplicate_at_its_seam() {
    let kernel = Kernel::start();
    let run = kernel.create_run("seam").await;
    // Appends race the watch's catch-up: unknown-tool calls settle at once, each turn several events.
    let writer = {
        let url = kernel.url();
        let run = run.clone();
        tokio::spawn(async move {
            let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(url.clone())
                .await
                .unwrap();
            for turn in 0..60 {
                let request = pb::SubmitTurnRequest {
                    run_id: run.clone(),
                    turn,
                    calls: vec![call("nope", json!({})); 3],
                    offered_tools: Vec::new(),
                    max_concurrency: 0,
                };
                let mut stream = client.submit_turn(request).await.unwrap().into_inner();
                while stream.next().await.is_some() {}
            }
            let mut runs = kernel_proto::v1::run_service_client::RunServiceClient::connect(url)
                .await
                .unwrap();
            runs.complete_run(pb::CompleteRunRequest {
                run_id: run,
                output_json: "\"ok\"".into(),
            })
            .await
            .unwrap();
        })
    };
    let mut watchers = Vec::new();
    for _ in 0..4 {
        let mut watch = Watch::open(&kernel, &run, 1, false).await;
        watchers.push(tokio::spawn(async move {
            let ended = watch.until(|_| false).await;
            assert!(!ended);
            watch.events
        }));
        tokio::task::yield_now().await;
    }
    writer.await.unwrap();
    let expected = kernel.events(&run).await;
    for watcher in watchers {
        let seen = watcher.await.unwrap();
        let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
        let want: Vec<u64> = expected.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, want, "the watch saw every event once, in order");
        assert_eq!(
            seen.last().unwrap().r#type,
            "run:completed",
            "the watch ends after the terminal event"
        );
    }
    check_log(&expected, true);
}

#[test]
fn grpcurl_lists_and_describes_through_reflection() {
    let kernel = Kernel::start();
    let grpcurl = |args: &[&str]| {
        let output = std::process::Command::new("grpcurl")
            .arg("-plaintext")
            .args(args)
            .output()
            .expect("grpcurl is on PATH (tests/run.sh puts target/venv/bin, where it installs it, first)");
        assert!(
            output.status.success(),
            "grpcurl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let addr = kernel.addr.to_string();
    let services = grpcurl(&[&addr, "list"]);
    for service in [
        "kernel.v1.RunService",
        "kernel.v1.ToolCallService",
        "kernel.v1.WorkerService",
        "kernel.v1.RegistryService",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(service), "{service} missing from:\n{services}");
    }
    let described = grpcurl(&[&addr, "describe", "kernel.v1.ToolCallService"]);
    assert!(described.contains("rpc SubmitTurn"), "{described}");
    let message = grpcurl(&[&addr, "describe", "kernel.v1.ToolCall"]);
    assert!(message.contains("arguments_json"), "{message}");
    let health = grpcurl(&[&addr, "grpc.health.v1.Health/Check"]);
    assert!(health.contains("SERVING"), "{health}");
}

#[tokio::test]
async fn a_replay_against_a_changed_tool_definition_is_a_divergence_naming_both_fingerprints() {
    let kernel = Kernel::start();
    let before = tool_spec("lookup", "version one");
    let (mut worker, _) = RawWorker::open(&kernel, vec![before.clone()]).await.unwrap();
    let run = kernel.create_run("replayer").await;
    let calls = vec![call("lookup", json!({"q": 1}))];
    let first = tokio::spawn({
        let (url, run, calls) = (kernel.url(), run.clone(), calls.clone());
        async move { e2e::submit_until_done(&url, &run, 0, calls).await }
    });
    let dispatch = worker.dispatch().await;
    worker
        .result(&dispatch.dispatch_id, dispatch.attempt, "\"found\"")
        .await;
    assert!(first.await.unwrap().results[0].content.contains("found"));
    drop(worker);

    // Same name and arguments, another description: another contract.
    let after = tool_spec("lookup", "version two");
    let _worker = loop {
        match RawWorker::open(&kernel, vec![after.clone()]).await {
            Ok((worker, _)) => break worker,
            // The first session may still be registered for a moment.
            Err(status) if status.code() == Code::AlreadyExists => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(status) => panic!("{status:?}"),
        }
    };
    let replay = submit(&kernel, &run, 0, calls).await.unwrap();
    let content = &replay.results[0].content;
    assert!(
        content.starts_with("replay_input_changed: tool 'lookup' changed since step t0/p0 was recorded"),
        "{content}"
    );
    assert!(
        content.contains(&before.fingerprint) && content.contains(&after.fingerprint),
        "{content}"
    );
    let steps = kernel.get(&run).await.steps;
    assert_eq!(
        (steps.len(), steps[0].attempts),
        (1, 1),
        "nothing ran or was recorded again"
    );
}

/// A worker that reads batches gets every call of a turn (alone or several in one message: that
/// depends on when each is ready, see `grpc::workers`' unit tests), and its results sent in one
/// message are each fenced, recorded and acknowledged as if sent alone.
#[tokio::test]
async fn a_worker_reading_batches_gets_every_call_and_its_results_sent_together_are_each_recorded() {
    let kernel = Kernel::start();
    let mut worker = RawWorker::reading_batches(&kernel, "batched").await.unwrap();
    let run = kernel.create_run("batching").await;
    let calls: Vec<_> = (0..5).map(|n| call("batched", json!({ "n": n }))).collect();
    let turn = e2e::submit_in_background(&kernel, &run, 0, calls);
    let mut dispatches = Vec::new();
    while dispatches.len() < 5 {
        match worker.next().await {
            Out::Dispatches(batch) => dispatches.extend(batch.dispatches),
            Out::Dispatch(dispatch) => dispatches.push(dispatch),
            other => panic!("expected dispatches, got {other:?}"),
        }
    }
    let results = dispatches
        .iter()
        .map(|d| pb::DispatchResult {
            dispatch_id: d.dispatch_id.clone(),
            attempt: d.attempt,
            outcome: Some(pb::dispatch_result::Outcome::OutputJson(
                serde_json::from_str::<serde_json::Value>(&d.arguments_json).unwrap()["n"].to_string(),
            )),
        })
        .collect::<Vec<_>>();
    // Each result of a batch is fenced as if alone: one for an attempt the worker does not hold
    // is refused, and the others are recorded.
    let mut stale = results[0].clone();
    stale.attempt += 1;
    let mut sent = vec![stale];
    sent.extend(results);
    worker.send(In::Results(pb::DispatchResults { results: sent })).await;
    let (mut accepted, mut refused) = (0, 0);
    while accepted + refused < 6 {
        match worker.next().await {
            Out::ResultAck(ack) if ack.accepted => accepted += 1,
            Out::ResultAck(ack) => {
                assert_eq!(ack.attempt, dispatches[0].attempt + 1, "{ack:?}");
                refused += 1;
            }
            other => panic!("expected an acknowledgement, got {other:?}"),
        }
    }
    assert_eq!((accepted, refused), (5, 1));
    let outcome = turn.await.unwrap();
    let contents: Vec<&str> = outcome.results.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(contents, ["0", "1", "2", "3", "4"]);
    check_log(&kernel.events(&run).await, true);
}
