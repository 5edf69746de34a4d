//! Hostile workers and clients, driven by raw gRPC clients: floods of progress and heartbeats, a
//! session that never says hello, frames that do not decode, oversized arguments and results, and
//! the per-run limits. Each is refused or dropped, logged at most once per interval, and the kernel
//! stays responsive to everyone else.

use std::time::{Duration, Instant};

use e2e::raw::{RawWorker, tool_spec};
use e2e::{Kernel, KernelOptions, WAIT, Watch, assert_kept_its_one_dispatch, call, check_log, payload, submit};
use kernel_proto::v1 as pb;
use kernel_proto::v1::hosted_service_client::HostedServiceClient;
use kernel_proto::v1::open_session_request::Message as In;
use kernel_proto::v1::open_session_response::Message as Out;
use kernel_proto::v1::worker_service_client::WorkerServiceClient;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const MIB: usize = 1 << 20;

fn tool_spec_raw(name: &str) -> pb::ToolSpec {
    tool_spec(name, "a raw tool")
}

/// Submits a turn in the background; the handle yields what it streamed back.
fn submit_later(
    kernel: &Kernel,
    run: &str,
    turn: u32,
    calls: Vec<pb::ToolCall>,
) -> tokio::task::JoinHandle<Result<e2e::TurnOutcome, tonic::Status>> {
    let url = kernel.url();
    let run = run.to_owned();
    tokio::spawn(async move {
        let request = pb::SubmitTurnRequest {
            run_id: run,
            turn,
            calls,
            offered_tools: Vec::new(),
            max_concurrency: 0,
        };
        let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(url)
            .await
            .unwrap();
        let mut stream = client.submit_turn(request).await?.into_inner();
        let mut outcome = e2e::TurnOutcome::default();
        while let Some(item) = stream.next().await {
            match item?.item {
                Some(pb::submit_turn_response::Item::Result(result)) => outcome.results.push(result),
                Some(pb::submit_turn_response::Item::Progress(progress)) => outcome.progress.push(progress),
                _ => {}
            }
        }
        Ok(outcome)
    })
}

#[tokio::test]
async fn a_flood_of_progress_and_heartbeats_is_dropped_while_others_keep_working() {
    let kernel = Kernel::start();
    let _helper = kernel.worker("helper");
    let mut flooder = RawWorker::offering(&kernel, "flooded").await.unwrap();
    let flooded_run = kernel.create_run("flooded").await;
    let flooded_turn = submit_later(&kernel, &flooded_run, 0, vec![call("flooded", json!({}))]);
    let dispatch = flooder.dispatch().await;

    const FLOOD: usize = 100_000;
    let tx = flooder.tx.clone();
    let (dispatch_id, attempt) = (dispatch.dispatch_id.clone(), dispatch.attempt);
    let flood = tokio::spawn(async move {
        for i in 0..FLOOD {
            let progress = pb::DispatchProgress {
                dispatch_id: dispatch_id.clone(),
                attempt,
                message: format!("step {i}"),
                ..Default::default()
            };
            let frames = [In::Progress(progress), In::Heartbeat(pb::Heartbeat::default())];
            for message in frames {
                tx.send(pb::OpenSessionRequest { message: Some(message) })
                    .await
                    .unwrap();
            }
        }
    });

    // Another agent's calls keep completing, each promptly, while the flood goes on.
    let other_run = kernel.create_run("bystander").await;
    let started = Instant::now();
    let mut turns = 0;
    let mut slowest = Duration::ZERO;
    while !flood.is_finished() {
        let begun = Instant::now();
        let outcome = submit(
            &kernel,
            &other_run,
            turns,
            vec![call("add", json!({"a": turns, "b": 1}))],
        )
        .await
        .expect("a bystander's turn");
        slowest = slowest.max(begun.elapsed());
        assert_eq!(outcome.results[0].content, (turns + 1).to_string());
        turns += 1;
    }
    flood.await.unwrap();
    let flood_time = started.elapsed();
    eprintln!(
        "flood of {FLOOD} progress + {FLOOD} heartbeats took {flood_time:?}; {turns} bystander turns, slowest {slowest:?}"
    );
    assert!(turns >= 1, "the bystander completed turns during the flood");
    assert!(slowest < Duration::from_secs(5), "a bystander's turn took {slowest:?}");

    // The flooding session goes on: its result is accepted.
    let ack = flooder
        .result(
            &dispatch.dispatch_id,
            dispatch.attempt,
            &json!({"done": true}).to_string(),
        )
        .await;
    assert!(ack.accepted, "{ack:?}");
    let outcome = flooded_turn.await.unwrap().unwrap();
    assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32);
    assert!(
        outcome.progress.len() < FLOOD / 2,
        "excess progress was dropped, {} delivered",
        outcome.progress.len()
    );
    let events = kernel.events(&flooded_run).await;
    check_log(&events, true);
    let result = events.iter().find(|e| e.r#type == "tool:result").expect("tool:result");
    let counted = payload(result)["progress_count"].as_u64().unwrap_or(0);
    assert!(counted < (FLOOD / 2) as u64, "progress_count {counted}");

    // Logged once per kind per interval, not once per message.
    let log = kernel.process.log.text();
    let intervals = flood_time.as_secs() / 10 + 1;
    for kind in ["progress flood", "heartbeat flood"] {
        let lines = log.matches(kind).count() as u64;
        assert!(
            (1..=intervals + 1).contains(&lines),
            "{lines} '{kind}' lines in {flood_time:?}"
        );
    }
}

#[tokio::test]
async fn a_session_that_never_says_hello_is_closed_and_frees_its_place() {
    let kernel = Kernel::start_with(KernelOptions {
        args: ["--max-sessions", "1", "--hello-timeout-ms", "1500"]
            .map(Into::into)
            .into(),
        ..KernelOptions::default()
    });
    let started = Instant::now();
    // Two sessions that never say hello: the first to arrive takes the only place and is closed
    // after the hello timeout; the other is refused while the first still holds it.
    let silent = |url: String| {
        tokio::spawn(async move {
            let (tx, outbound) = mpsc::channel::<pb::OpenSessionRequest>(1);
            let mut client = WorkerServiceClient::connect(url).await.unwrap();
            let status = client
                .open_session(ReceiverStream::new(outbound))
                .await
                .expect_err("a silent session is refused");
            drop(tx);
            (status, started.elapsed())
        })
    };
    let (first, second) = (silent(kernel.url()), silent(kernel.url()));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    let (mut refused, mut closed) = (first, second);
    if refused.0.code() != Code::ResourceExhausted {
        std::mem::swap(&mut refused, &mut closed);
    }
    assert_eq!(refused.0.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.0.message(),
        "session: 1 worker sessions are open; the limit is 1 sessions (--max-sessions)"
    );
    let (status, waited) = closed;
    assert!(
        refused.1 < waited,
        "refused after {:?}, while the first held the place",
        refused.1
    );
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), "no hello within 1500 ms (--hello-timeout-ms)");
    assert!(
        waited >= Duration::from_millis(1500),
        "closed after {waited:?}, not before the timeout"
    );
    // Its place is free again.
    RawWorker::offering(&kernel, "late")
        .await
        .expect("a session after the silent one");
}

/// A frame that is valid protobuf but not a valid session message: field 1 (`hello`) and
/// field 3 (`progress`) are messages on the wire, sent here as varints; field 99 does not exist.
#[derive(Clone, PartialEq, prost::Message)]
struct Frame {
    #[prost(message, optional, tag = "1")]
    hello: Option<pb::Hello>,
    #[prost(uint64, tag = "3")]
    progress_as_varint: u64,
    #[prost(string, tag = "99")]
    from_the_future: String,
}

fn hello_frame() -> Frame {
    Frame {
        hello: Some(pb::Hello {
            worker_name: "raw".into(),
            tools: vec![tool_spec_raw("framed")],
            max_concurrency: 1,
            sdk_version: "test".into(),
            ephemeral_tools: false,
            agents: Vec::new(),
            batches: false,
        }),
        ..Frame::default()
    }
}

/// Opens a session that sends `frames` and keeps its side open.
async fn raw_session(
    kernel: &Kernel,
    frames: Vec<Frame>,
) -> (
    Result<tonic::Streaming<pb::OpenSessionResponse>, tonic::Status>,
    mpsc::Sender<Frame>,
) {
    let (tx, outbound) = mpsc::channel(8);
    for frame in frames {
        tx.send(frame).await.unwrap();
    }
    let channel = tonic::transport::Channel::from_shared(kernel.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/kernel.v1.WorkerService/OpenSession");
    let codec = tonic_prost::ProstCodec::<Frame, pb::OpenSessionResponse>::default();
    let response = grpc
        .streaming(tonic::Request::new(ReceiverStream::new(outbound)), path, codec)
        .await
        .map(tonic::Response::into_inner);
    (response, tx)
}

/// The status that ends a session after its welcome.
async fn closing_status(mut stream: tonic::Streaming<pb::OpenSessionResponse>) -> tonic::Status {
    let welcome = stream.next().await.expect("welcome").expect("welcome");
    assert!(matches!(welcome.message, Some(Out::Welcome(_))), "{welcome:?}");
    tokio::time::timeout(WAIT, async {
        loop {
            match stream.next().await {
                Some(Ok(_)) => {}
                Some(Err(status)) => return status,
                None => panic!("the session ended without a status"),
            }
        }
    })
    .await
    .expect("the session was closed")
}

#[tokio::test]
async fn frames_that_do_not_decode_are_refused_with_a_status() {
    let kernel = Kernel::start();

    let garbage = Frame {
        progress_as_varint: 7,
        ..Frame::default()
    };
    let (response, _tx) = raw_session(&kernel, vec![garbage.clone()]).await;
    let status = response.expect_err("a garbage first frame is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("message: cannot decode"),
        "{}",
        status.message()
    );

    let (response, _tx) = raw_session(&kernel, vec![hello_frame(), garbage]).await;
    let status = closing_status(response.expect("hello accepted")).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("message: cannot decode"),
        "{}",
        status.message()
    );

    let unknown = Frame {
        from_the_future: "x".into(),
        ..Frame::default()
    };
    let (response, _tx) = raw_session(&kernel, vec![hello_frame(), unknown]).await;
    let status = closing_status(response.expect("hello accepted")).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "message: empty session message");

    // Everyone else is served as before.
    let _worker = RawWorker::offering(&kernel, "framed")
        .await
        .expect("a well-behaved worker");
    let run = kernel.create_run("after-garbage").await;
    assert!(!kernel.events(&run).await.is_empty());
}

#[tokio::test]
async fn oversized_arguments_are_refused_and_an_oversized_result_fails_only_its_call() {
    let kernel = Kernel::start();
    let mut worker = RawWorker::offering(&kernel, "big").await.unwrap();
    let run = kernel.create_run("big").await;
    let before = kernel.events(&run).await.len();

    let huge = json!({"blob": "x".repeat(MIB)});
    let status = submit(
        &kernel,
        &run,
        0,
        vec![call("big", json!({})), call("big", huge.clone())],
    )
    .await
    .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "calls[1].arguments_json: {} bytes; the limit is 1048576 bytes (--max-argument-bytes)",
            huge.to_string().len()
        )
    );
    assert_eq!(kernel.events(&run).await.len(), before, "a refused turn writes nothing");

    let turn = submit_later(&kernel, &run, 0, vec![call("big", json!({"n": 1}))]);
    let dispatch = worker.dispatch().await;
    let output = json!("y".repeat(2 * MIB)).to_string();
    let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt, &output).await;
    assert!(ack.accepted, "recorded as the call's error: {ack:?}");
    let outcome = turn.await.unwrap().unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Error as i32);
    assert_eq!(result.error_kind, pb::ErrorKind::Fatal as i32);
    assert_eq!(
        result.content,
        format!(
            "tool 'big' returned a result of {} bytes; the limit is 1048576 bytes (--max-result-bytes)",
            output.len()
        )
    );

    // The session goes on.
    let turn = submit_later(&kernel, &run, 1, vec![call("big", json!({"n": 2}))]);
    let dispatch = worker.dispatch().await;
    assert!(
        worker
            .result(&dispatch.dispatch_id, dispatch.attempt, "\"small\"")
            .await
            .accepted
    );
    let outcome = turn.await.unwrap().unwrap();
    assert_eq!(outcome.results[0].content, "small");
    check_log(&kernel.events(&run).await, true);
}

/// A hosted run's handler answering with an output that is not JSON, or one over the limit, fails
/// its run, and the reason names the agent, not a tool.
#[tokio::test]
async fn a_handler_output_that_is_not_json_or_too_big_fails_its_run_naming_the_agent() {
    let kernel = Kernel::start();
    let mut worker = RawWorker::hosting(&kernel, "raw-agent").await.unwrap();
    let big = json!("y".repeat(2 * MIB)).to_string();
    let cases = [
        (
            "{oops".to_owned(),
            "agent 'raw-agent' returned an output that is not valid JSON: ".to_owned(),
        ),
        (
            big.clone(),
            format!(
                "agent 'raw-agent' returned an output of {} bytes; the limit is 1048576 bytes (--max-result-bytes)",
                big.len()
            ),
        ),
    ];
    for (output, reason) in cases {
        let run = kernel.start_hosted("raw-agent", json!({})).await;
        let dispatch = worker.run_dispatch().await;
        assert_eq!(dispatch.run_id, run);
        let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt, &output).await;
        assert!(ack.accepted, "recorded as the handler's error: {ack:?}");
        let ended = kernel.finished(&run).await;
        assert_eq!(ended.status, pb::RunStatus::Failed as i32, "{ended:?}");
        assert!(ended.reason.contains(&reason), "{:?} lacks {reason:?}", ended.reason);
        assert!(!ended.reason.contains("tool '"), "{:?}", ended.reason);
    }
}

/// A handler in any language that diverges from its record fails its run there and then: the
/// kernel cancels its dispatch, and an output it sends after (as a handler that caught the error
/// would) is refused; the run stays failed with `replay_input_changed`.
#[tokio::test]
async fn a_handler_that_diverges_cannot_complete_its_run_whatever_it_sends_next() {
    let kernel = Kernel::start();
    let mut worker = RawWorker::hosting(&kernel, "raw-agent").await.unwrap();
    let run = kernel.start_hosted("raw-agent", json!({})).await;
    let dispatch = worker.run_dispatch().await;
    let mut hosted = HostedServiceClient::connect(kernel.url()).await.unwrap();
    let step = |step_id: &str| pb::RecordStepRequest {
        dispatch: Some(pb::HostedDispatch {
            run_id: run.clone(),
            dispatch_id: dispatch.dispatch_id.clone(),
            attempt: dispatch.attempt,
        }),
        seq: 0,
        step_id: step_id.into(),
        occurrence: 0,
        effect: "read".into(),
        outcome: Some(pb::record_step_request::Outcome::OutputJson("1".into())),
        once: false,
    };
    let first = hosted.record_step(step("fetch")).await.unwrap().into_inner();
    assert!(first.diverged.is_empty() && !first.replayed, "{first:?}");
    let other = hosted.record_step(step("pay")).await.unwrap().into_inner();
    assert!(other.diverged.starts_with("replay_input_changed:"), "{other:?}");

    let Out::Cancel(cancel) = worker.next().await else {
        panic!("expected the handler's dispatch to be cancelled")
    };
    assert_eq!(cancel.dispatch_id, dispatch.dispatch_id);
    let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt, "42").await;
    assert!(!ack.accepted, "the output of a cancelled dispatch is refused: {ack:?}");
    let ended = kernel.get(&run).await.run.unwrap();
    assert_eq!(ended.status, pb::RunStatus::Failed as i32, "{ended:?}");
    assert_eq!(ended.reason, other.diverged);
    check_log(&kernel.events(&run).await, true);
}

/// A handler that skips CheckStep and records a step the policy denies gets the denial recorded,
/// not its outcome: the audit never shows a denied step as run, nor a deny rule deciding one that
/// ran.
#[tokio::test]
async fn a_denied_step_recorded_without_its_check_is_recorded_as_denied() {
    let policy = r#"
default: allow
rules:
  - id: no-pay
    match: { tools: ["step:pay"] }
    decision: deny
    reason: "paying is done by hand"
"#;
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(policy.into()),
        ..KernelOptions::default()
    });
    let mut worker = RawWorker::hosting(&kernel, "raw-agent").await.unwrap();
    let run = kernel.start_hosted("raw-agent", json!({})).await;
    let dispatch = worker.run_dispatch().await;
    let mut hosted = HostedServiceClient::connect(kernel.url()).await.unwrap();
    let recorded = hosted
        .record_step(pb::RecordStepRequest {
            dispatch: Some(pb::HostedDispatch {
                run_id: run.clone(),
                dispatch_id: dispatch.dispatch_id.clone(),
                attempt: dispatch.attempt,
            }),
            seq: 0,
            step_id: "pay".into(),
            occurrence: 0,
            effect: "write".into(),
            outcome: Some(pb::record_step_request::Outcome::OutputJson("\"paid\"".into())),
            once: false,
        })
        .await
        .unwrap()
        .into_inner();
    let step = recorded.step.expect("the step as recorded");
    assert_eq!(step.outcome, pb::CallOutcome::Denied as i32, "{step:?}");
    assert_eq!(step.decided_by, "rule:no-pay");
    assert!(
        step.output_json.is_empty(),
        "the handler's output is not recorded: {step:?}"
    );
    let shown = kernel.get(&run).await.steps;
    let pay = shown.iter().find(|s| s.step_key == "step:pay#0").expect("recorded");
    assert_eq!(
        (pay.outcome, pay.decided_by.as_str()),
        (pb::CallOutcome::Denied as i32, "rule:no-pay")
    );
}

/// A suspension that names nothing to wait on, which nothing could ever wake, is refused and
/// changes nothing: the handler keeps its dispatch, and its output then completes the run.
#[tokio::test]
async fn a_suspension_naming_nothing_is_refused_and_the_handler_keeps_its_dispatch() {
    let kernel = Kernel::start();
    let mut worker = RawWorker::hosting(&kernel, "raw-agent").await.unwrap();
    let run = kernel.start_hosted("raw-agent", json!({})).await;
    let dispatch = worker.run_dispatch().await;
    let before = kernel.events(&run).await.len();
    worker
        .send(In::Result(pb::DispatchResult {
            dispatch_id: dispatch.dispatch_id.clone(),
            attempt: dispatch.attempt,
            outcome: Some(pb::dispatch_result::Outcome::Suspended(pb::DispatchSuspended {
                waiting_on: Vec::new(),
            })),
        }))
        .await;
    let Out::ResultAck(refused) = worker.next().await else {
        panic!("expected the suspension's answer")
    };
    assert!(!refused.accepted && refused.still_held, "{refused:?}");
    assert!(refused.reason.starts_with("suspended.waiting_on: "), "{refused:?}");
    assert_eq!(kernel.events(&run).await.len(), before, "nothing was recorded");
    let shown = kernel.get(&run).await.run.unwrap();
    assert_eq!(shown.status, pb::RunStatus::Running as i32, "{shown:?}");

    let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt, "1").await;
    assert!(ack.accepted, "the dispatch is still the handler's: {ack:?}");
    let done = kernel.finished(&run).await;
    assert_eq!(
        (done.status, done.output_json.as_str()),
        (pb::RunStatus::Completed as i32, "1")
    );
}

#[tokio::test]
async fn a_frame_over_the_message_limit_is_refused_naming_the_limit() {
    let kernel = Kernel::start_with(KernelOptions {
        args: vec!["--max-message-bytes".into(), "65536".into()],
        ..KernelOptions::default()
    });
    let run = kernel.create_run("wordy").await;
    let before = kernel.events(&run).await.len();
    let status = submit(
        &kernel,
        &run,
        0,
        vec![call("any", json!({"blob": "x".repeat(100_000)}))],
    )
    .await
    .expect_err("refused");
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    assert_eq!(kernel.events(&run).await.len(), before);

    let mut worker = RawWorker::offering(&kernel, "wordy").await.unwrap();
    let turn = submit_later(&kernel, &run, 0, vec![call("wordy", json!({}))]);
    let dispatch = worker.dispatch().await;
    worker
        .send(In::Result(pb::DispatchResult {
            dispatch_id: dispatch.dispatch_id.clone(),
            attempt: dispatch.attempt,
            outcome: Some(pb::dispatch_result::Outcome::OutputJson(
                json!("z".repeat(100_000)).to_string(),
            )),
        }))
        .await;
    let status = tokio::time::timeout(WAIT, async {
        loop {
            match worker.rx.next().await {
                Some(Ok(_)) => {}
                Some(Err(status)) => return status,
                None => panic!("closed without a status"),
            }
        }
    })
    .await
    .expect("closed");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("(--max-message-bytes)"),
        "{}",
        status.message()
    );
    // The session is gone, so its lease is lost; the call is retried elsewhere (here: nowhere).
    drop(turn);
}

#[tokio::test]
async fn per_run_limits_refuse_a_turn_and_write_nothing() {
    let kernel = Kernel::start_with(KernelOptions {
        args: [
            "--max-calls-per-turn",
            "3",
            "--max-turns-per-run",
            "4",
            "--max-pending-calls-per-run",
            "4",
            "--max-events-per-run",
            "30",
        ]
        .map(String::from)
        .to_vec(),
        ..KernelOptions::default()
    });
    let _helper = kernel.worker("helper");
    let mut holder = RawWorker::offering(&kernel, "held").await.unwrap();
    let run = kernel.create_run("limited").await;
    let before = kernel.events(&run).await.len();

    let add = |n: i64| call("add", json!({"a": n, "b": 1}));
    let status = submit(&kernel, &run, 0, (0..4).map(add).collect())
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "calls: 4 calls; the limit is 3 calls per turn (--max-calls-per-turn)"
    );
    let status = submit(&kernel, &run, 4, vec![add(1)]).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "turn: turn 4; the limit is 4 turns per run (turns 0 to 3) (--max-turns-per-run)"
    );
    assert_eq!(kernel.events(&run).await.len(), before);

    // Three calls held by a worker that does not answer yet; two more would make five unsettled.
    let held_calls: Vec<_> = (0..3).map(|n| call("held", json!({"n": n}))).collect();
    let held_turn = submit_later(&kernel, &run, 0, held_calls.clone());
    let mut dispatches = Vec::new();
    for _ in 0..3 {
        dispatches.push(holder.dispatch().await);
    }
    // A safe call may reach its worker before its turn's commit: count once the starts are in.
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let started = watch
        .until(|w| w.events.iter().filter(|e| e.r#type == "tool:start").count() == 3)
        .await;
    assert!(started, "the three held calls started");
    let before = kernel.events(&run).await.len();
    let status = submit(&kernel, &run, 1, vec![add(1), add(2)])
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        format!("calls: run {run} would have 5 unsettled calls; the limit is 4 per run (--max-pending-calls-per-run)")
    );
    assert_eq!(kernel.events(&run).await.len(), before);
    // Resubmitting the held turn joins its calls instead of adding to them.
    let joined = submit_later(&kernel, &run, 0, held_calls);
    for dispatch in &dispatches {
        assert!(
            holder
                .result(&dispatch.dispatch_id, dispatch.attempt, "1")
                .await
                .accepted
        );
    }
    assert_eq!(held_turn.await.unwrap().unwrap().results.len(), 3);
    assert_eq!(joined.await.unwrap().unwrap().results.len(), 3);

    // Turns of three calls until the next one could pass 30 events.
    let mut refused = false;
    for turn in 1..4 {
        let events = kernel.events(&run).await.len();
        match submit(&kernel, &run, turn, (0..3).map(add).collect()).await {
            Ok(outcome) => assert_eq!(outcome.results.len(), 3),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted);
                assert!(
                    status
                        .message()
                        .ends_with("the limit is 30 events per run (--max-events-per-run)")
                );
                assert!(events + 9 > 30, "refused at {events} events");
                assert_eq!(kernel.events(&run).await.len(), events);
                refused = true;
                break;
            }
        }
    }
    assert!(refused, "the event limit refused a turn");
    check_log(&kernel.events(&run).await, true);
}

/// Sends a suspension of `(dispatch_id, attempt)` naming `waiting_on` and returns the kernel's answer.
async fn suspend(worker: &mut RawWorker, dispatch_id: &str, attempt: u32, waiting_on: &[&str]) -> pb::ResultAck {
    worker
        .send(In::Result(pb::DispatchResult {
            dispatch_id: dispatch_id.into(),
            attempt,
            outcome: Some(pb::dispatch_result::Outcome::Suspended(pb::DispatchSuspended {
                waiting_on: waiting_on.iter().map(|k| (*k).to_owned()).collect(),
            })),
        }))
        .await;
    match worker.next().await {
        Out::ResultAck(ack) => ack,
        other => panic!("expected the suspension's answer, got {other:?}"),
    }
}

/// A suspension naming a step that has settled (its result crossed the suspension on the way) or
/// a step the run does not have is refused and changes nothing: no `agent:suspended`, no
/// redispatch; the handler keeps its dispatch under the same attempt, told it still holds it, and
/// its output then completes the run.
#[tokio::test]
async fn a_suspension_naming_a_settled_or_unknown_step_is_refused_and_the_handler_keeps_its_dispatch() {
    let kernel = Kernel::start();
    let mut handler = RawWorker::hosting(&kernel, "raw-agent").await.unwrap();
    let mut tools = RawWorker::offering(&kernel, "lookup").await.unwrap();
    let run = kernel.start_hosted("raw-agent", json!({})).await;
    let dispatch = handler.run_dispatch().await;
    let mut hosted = HostedServiceClient::connect(kernel.url()).await.unwrap();
    let mut turn = hosted
        .call_tools(pb::CallToolsRequest {
            dispatch: Some(pb::HostedDispatch {
                run_id: run.clone(),
                dispatch_id: dispatch.dispatch_id.clone(),
                attempt: dispatch.attempt,
            }),
            turn: Some(pb::SubmitTurnRequest {
                run_id: run.clone(),
                turn: 0,
                calls: vec![call("lookup", json!({}))],
                offered_tools: Vec::new(),
                max_concurrency: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let lookup = tools.dispatch().await;
    assert!(
        tools
            .result(&lookup.dispatch_id, lookup.attempt, "\"found\"")
            .await
            .accepted
    );
    // The handler has not read its call's result yet: its suspension names the settled call.
    let before = kernel.events(&run).await;
    assert!(
        before.iter().any(|e| e.r#type == "tool:result"),
        "the call settled first"
    );
    for (waiting_on, why) in [
        (vec![lookup.step_key.as_str()], "has settled (succeeded)"),
        (vec!["t9/p0"], "is not a step of run"),
        (vec!["t9/p0", lookup.step_key.as_str()], "suspended.waiting_on: t9/p0"),
    ] {
        let refused = suspend(&mut handler, &dispatch.dispatch_id, dispatch.attempt, &waiting_on).await;
        assert!(!refused.accepted && refused.still_held, "{refused:?}");
        assert!(refused.reason.contains(why), "{waiting_on:?}: {refused:?}");
    }
    let after = kernel.events(&run).await;
    assert_eq!(after.len(), before.len(), "nothing was recorded: {after:?}");
    let shown = kernel.get(&run).await;
    assert_eq!(shown.run.unwrap().status, pb::RunStatus::Running as i32);
    let agent = shown
        .steps
        .iter()
        .find(|s| s.step_key == "agent")
        .expect("the handler's dispatch");
    assert_eq!(
        (agent.status, agent.attempts),
        (pb::StepStatus::Running as i32, dispatch.attempt)
    );

    // The handler goes on: the result it awaited reaches it, and it completes its run.
    let mut results = Vec::new();
    while let Some(item) = turn.next().await {
        if let Some(pb::submit_turn_response::Item::Result(result)) = item.unwrap().item.and_then(|i| i.item) {
            results.push(result.output_json);
        }
    }
    assert_eq!(results, ["\"found\""]);
    let ack = handler.result(&dispatch.dispatch_id, dispatch.attempt, "1").await;
    assert!(ack.accepted, "the dispatch is still the handler's: {ack:?}");
    let done = kernel.finished(&run).await;
    assert_eq!(
        (done.status, done.output_json.as_str()),
        (pb::RunStatus::Completed as i32, "1")
    );
    let events = kernel.events(&run).await;
    assert_kept_its_one_dispatch(&events);
    check_log(&events, true);
}

/// An `at_most_once` call may not give back its slot (a suspended call runs again): its
/// suspension is refused, and the call keeps its lease, neither lost nor indeterminate; its
/// result then completes it.
#[tokio::test]
async fn an_at_most_once_call_s_refused_suspension_keeps_its_lease_and_its_result_is_recorded() {
    let kernel = Kernel::start();
    let mut spec = tool_spec_raw("pay");
    spec.options = Some(pb::ToolOptions {
        idempotency: pb::Idempotency::AtMostOnce as i32,
        ..Default::default()
    });
    let (mut worker, _) = RawWorker::open(&kernel, vec![spec]).await.unwrap();
    let run = kernel.create_run("payer").await;
    let turn = submit_later(&kernel, &run, 0, vec![call("pay", json!({}))]);
    let dispatch = worker.dispatch().await;
    let before = kernel.events(&run).await.len();
    let waiting_on = format!("subagent:{}/researcher#0", dispatch.step_key);
    let refused = suspend(&mut worker, &dispatch.dispatch_id, dispatch.attempt, &[&waiting_on]).await;
    assert!(!refused.accepted && refused.still_held, "{refused:?}");
    assert!(refused.reason.contains("at_most_once"), "{refused:?}");
    assert_eq!(kernel.events(&run).await.len(), before, "nothing was recorded");
    worker.send(In::Heartbeat(pb::Heartbeat::default())).await;

    let ack = worker.result(&dispatch.dispatch_id, dispatch.attempt, "\"paid\"").await;
    assert!(ack.accepted, "the call kept its lease: {ack:?}");
    let outcome = turn.await.unwrap().unwrap();
    assert_eq!(outcome.results.len(), 1);
    let result = &outcome.results[0];
    assert_eq!(
        (result.outcome, result.output_json.as_str()),
        (pb::CallOutcome::Ok as i32, "\"paid\""),
        "{result:?}"
    );
    let events = kernel.events(&run).await;
    assert!(
        !events
            .iter()
            .any(|e| e.r#type == "tool:lease_lost" || e.r#type == "tool:suspended"),
        "{events:?}"
    );
    check_log(&events, true);
}
