//! Tool calls end to end through the real kernel and example worker processes.

use std::time::Duration;

use e2e::{Kernel, Watch, call, check_log, payload, submit};
use kernel_proto::v1 as pb;
use serde_json::json;
use tonic::Code;

#[tokio::test]
async fn turns_of_calls_run_across_two_workers_with_results_in_order() {
    let kernel = Kernel::start();
    let _w1 = kernel.worker("w1");
    let _w2 = kernel.worker("w2");
    kernel.wait_for_workers("add", 2).await;
    let run = kernel.create_run("adder").await;

    let turn0: Vec<pb::ToolCall> = (0..8).map(|i| call("add", json!({"a": i, "b": 100}))).collect();
    let outcome = submit(&kernel, &run, 0, turn0).await.unwrap();
    let contents: Vec<&str> = outcome.results.iter().map(|r| r.content.as_str()).collect();
    let expected: Vec<String> = (0..8).map(|i| (i + 100).to_string()).collect();
    assert_eq!(contents, expected, "results come back in position order");
    assert!(
        outcome
            .results
            .iter()
            .enumerate()
            .all(|(i, r)| r.position == i as u32 && !r.replayed)
    );

    let outcome = submit(
        &kernel,
        &run,
        1,
        vec![
            call("echo", json!({"value": {"z": 1, "a": [true, null]}})),
            call("echo", json!({"value": "plain"})),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        outcome.results[0].content, r#"{"a":[true,null],"z":1}"#,
        "JSON results are compact with sorted keys"
    );
    assert_eq!(
        outcome.results[1].content, "plain",
        "string results go to the model as is"
    );

    let outcome = submit(&kernel, &run, 2, vec![call("fail", json!({"message": "backend down"}))])
        .await
        .unwrap();
    assert_eq!(outcome.results[0].status, pb::CallStatus::Error as i32);
    assert!(
        outcome.results[0].content.contains("backend down"),
        "{:?}",
        outcome.results[0]
    );

    let shown = kernel.get(&run).await;
    let workers: std::collections::HashSet<&str> = shown.steps.iter().map(|s| s.worker.as_str()).collect();
    assert!(
        workers.contains("w1") && workers.contains("w2"),
        "calls are spread across workers: {workers:?}"
    );
    assert!(shown.steps.iter().all(|s| s.attempts == 1));

    kernel
        .runs()
        .await
        .complete_run(pb::CompleteRunRequest {
            run_id: run.clone(),
            output_json: "{}".into(),
        })
        .await
        .unwrap();
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_watcher_sees_progress_while_the_call_runs() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("slowpoke").await;
    let mut watch = Watch::open(&kernel, &run, 1, true).await;
    let turn = {
        let kernel = &kernel;
        let run = run.clone();
        async move {
            submit(
                kernel,
                &run,
                0,
                vec![call("slow", json!({"steps": 4, "delay_ms": 100}))],
            )
            .await
            .unwrap()
        }
    };
    let watching = async {
        // Progress arrives before the call's result is recorded.
        let seen = watch
            .until(|w| !w.progress.is_empty() || w.events.iter().any(|e| e.r#type == "tool:result"))
            .await;
        assert!(seen);
        assert!(
            !watch.progress.is_empty(),
            "progress reached the watcher before the result"
        );
        watch.event("tool:result", |_| true).await
    };
    let (outcome, result) = tokio::join!(turn, watching);
    assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32);
    assert!(
        !outcome.progress.is_empty(),
        "the agent's turn stream carries progress too"
    );
    assert_eq!(outcome.progress[0].tool, "slow");
    assert_eq!(
        result["progress_count"], 4,
        "the result event carries the progress count"
    );
    let events = kernel.events(&run).await;
    assert!(
        events.iter().all(|e| !e.r#type.contains("progress")),
        "progress is streamed, not logged one event per update"
    );
}

#[tokio::test]
async fn a_streaming_tool_reports_every_item_but_the_last_as_progress_and_returns_the_last() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("launch").await;
    let outcome = submit(
        &kernel,
        &run,
        0,
        vec![call("countdown", json!({"from": 3, "delay_ms": 20}))],
    )
    .await
    .unwrap();
    assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32);
    assert_eq!(outcome.results[0].content, "liftoff");
    let lines: Vec<&str> = outcome.progress.iter().map(|p| p.message.as_str()).collect();
    assert_eq!(lines, ["3", "2", "1"], "each item but the last, live and in order");
    let events = kernel.events(&run).await;
    let result = events
        .iter()
        .find(|e| e.r#type == "tool:result")
        .expect("a result event");
    let payload = payload(result);
    assert_eq!(payload["progress_count"], 3, "counted as ctx.progress is");
    assert_eq!(kernel.get(&run).await.steps[0].progress_count, 3);
}

#[tokio::test]
async fn an_unknown_tool_runs_nothing_and_tells_the_model_what_exists() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("lost").await;
    let outcome = submit(
        &kernel,
        &run,
        0,
        vec![
            call("weather", json!({"city": "Oslo"})),
            call("add", json!({"a": 1, "b": 2})),
        ],
    )
    .await
    .unwrap();
    let unknown = &outcome.results[0];
    assert_eq!(unknown.status, pb::CallStatus::Error as i32);
    assert!(
        unknown.content.starts_with("unknown tool 'weather'; available: "),
        "{}",
        unknown.content
    );
    for tool in ["add", "echo", "slow"] {
        assert!(unknown.content.contains(tool), "{}", unknown.content);
    }
    assert_eq!(outcome.results[1].content, "3", "the turn goes on");

    let events = kernel.events(&run).await;
    let about_weather: Vec<&pb::Event> = events
        .iter()
        .filter(|e| e.payload_json.contains("\"weather\""))
        .collect();
    assert_eq!(
        about_weather.len(),
        1,
        "one tool:result and no tool:start: {about_weather:?}"
    );
    assert_eq!(about_weather[0].r#type, "tool:result");
    assert_eq!(e2e::payload(about_weather[0])["status"], "error");
    let run_row = kernel.get(&run).await.run.unwrap();
    assert_eq!(run_row.tool_calls, 2, "the unknown call counts toward max_tool_calls");
    check_log(&events, true);
}

#[tokio::test]
async fn a_call_whose_worker_is_killed_completes_on_the_other_worker() {
    let kernel = Kernel::start();
    let mut w1 = kernel.worker("w1");
    let mut w2 = kernel.worker("w2");
    kernel.wait_for_workers("slow", 2).await;
    let run = kernel.create_run("survivor").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = {
        let kernel = &kernel;
        let run = run.clone();
        async move {
            submit(
                kernel,
                &run,
                0,
                vec![call("slow", json!({"steps": 10, "delay_ms": 100}))],
            )
            .await
            .unwrap()
        }
    };
    let killer = async {
        let start = watch.event("tool:start", |_| true).await;
        let victim = start["worker"].as_str().unwrap().to_owned();
        match victim.as_str() {
            "w1" => w1.kill9(),
            _ => w2.kill9(),
        }
        let lost = watch.event("tool:lease_lost", |_| true).await;
        assert_eq!(lost["worker"], victim.as_str());
        let restart = watch.event("tool:start", |p| p["attempt"] == 2).await;
        assert_ne!(
            restart["worker"],
            victim.as_str(),
            "redispatched to the surviving worker"
        );
        assert_eq!(restart["idempotency_key"], start["idempotency_key"]);
    };
    let (outcome, ()) = tokio::join!(turn, killer);
    assert_eq!(
        outcome.results[0].status,
        pb::CallStatus::Ok as i32,
        "{:?}",
        outcome.results[0]
    );
    assert_eq!(outcome.results[0].attempts, 2);
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn bad_input_gets_a_precise_status_and_writes_nothing() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("careless").await;
    let before = kernel.events(&run).await.len();
    let refused = |calls: Vec<pb::ToolCall>, run: &str| {
        let kernel = &kernel;
        let run = run.to_owned();
        async move { submit(kernel, &run, 0, calls).await.expect_err("refused") }
    };

    let malformed = pb::ToolCall {
        tool: "add".into(),
        arguments_json: "{\"a\": 1,".into(),
        ..Default::default()
    };
    let status = refused(vec![call("add", json!({"a": 1, "b": 1})), malformed], &run).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("calls[1].arguments_json: is not valid JSON"),
        "{}",
        status.message()
    );

    let status = refused(vec![call("", json!({}))], &run).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "calls[0].tool: must not be empty");

    let status = refused(vec![call("add\u{0}", json!({}))], &run).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("calls[0].tool"), "{}", status.message());

    let status = refused(vec![call("add", json!([1, 2]))], &run).await;
    assert_eq!(status.message(), "calls[0].arguments_json: must be a JSON object");

    let status = refused(vec![call("add", json!({}))], "0192e4c4-8e5c-7a3f-8f5e-123456789abc").await;
    assert_eq!(status.code(), Code::NotFound);
    let status = refused(vec![call("add", json!({}))], "not-a-run").await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("run_id:"));

    assert_eq!(kernel.events(&run).await.len(), before, "refused turns wrote nothing");
    assert!(kernel.get(&run).await.steps.is_empty());

    let mut runs = kernel.runs().await;
    runs.fail_run(pb::FailRunRequest {
        run_id: run.clone(),
        reason: "gave up".into(),
    })
    .await
    .unwrap();
    let ended = kernel.events(&run).await.len();
    let status = refused(vec![call("add", json!({"a": 1, "b": 1}))], &run).await;
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("is failed"), "{}", status.message());
    let status = runs
        .complete_run(pb::CompleteRunRequest {
            run_id: run.clone(),
            output_json: "1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        kernel.events(&run).await.len(),
        ended,
        "nothing is appended to a finished run"
    );

    let status = runs
        .create_run(pb::CreateRunRequest {
            agent: "a".into(),
            input_json: "{oops".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        status.message().starts_with("input_json: is not valid JSON"),
        "{}",
        status.message()
    );
    let status = runs.create_run(pb::CreateRunRequest::default()).await.unwrap_err();
    assert_eq!(status.message(), "agent: must not be empty");
}

#[tokio::test]
async fn wrong_argument_types_are_a_recoverable_error() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("typo").await;
    let outcome = submit(&kernel, &run, 0, vec![call("add", json!({"a": "two", "b": 3}))])
        .await
        .unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Error as i32);
    assert!(
        result.content.contains("add"),
        "the error names the tool: {}",
        result.content
    );
    assert_eq!(result.error_kind, pb::ErrorKind::Fatal as i32);
}

#[tokio::test]
async fn a_call_waits_for_a_slot_and_fails_clearly_when_no_worker_offers_its_tool() {
    let kernel = Kernel::start_with(e2e::KernelOptions {
        schedule_to_start_timeout_ms: 1_500,
        ..Default::default()
    });
    let mut worker = kernel.worker("w1");
    let run = kernel.create_run("orphan").await;
    // Register the tool, then take its only worker away.
    submit(&kernel, &run, 0, vec![call("add", json!({"a": 1, "b": 1}))])
        .await
        .unwrap();
    worker.kill9();
    kernel.wait_for_workers("add", 0).await;
    let outcome = submit(&kernel, &run, 1, vec![call("add", json!({"a": 1, "b": 1}))])
        .await
        .unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Error as i32);
    assert!(
        result
            .content
            .starts_with("no worker offering tool 'add' connected within"),
        "{}",
        result.content
    );
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn the_kernel_shuts_down_within_its_drain_while_worker_streams_are_open() {
    let mut kernel = Kernel::start();
    let _w1 = kernel.worker("w1");
    let run = kernel.create_run("held").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let calls = kernel.url();
    let run_id = run.clone();
    let _turn = tokio::spawn(async move {
        let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(calls)
            .await
            .unwrap();
        let request = pb::SubmitTurnRequest {
            run_id,
            turn: 0,
            calls: vec![call("slow", json!({"steps": 100, "delay_ms": 100}))],
            offered_tools: Vec::new(),
            max_concurrency: 0,
        };
        let _ = client.submit_turn(request).await;
    });
    watch.event("tool:start", |_| true).await;
    let status = kernel
        .process
        .terminate(Duration::from_secs(15))
        .expect("the kernel exits within its drain");
    assert!(status.success(), "{status:?}");
    kernel.process.log.wait_for("stopped");
}

/// One explicit call id in two turns running together: the same call joins, another call under
/// it is refused with ALREADY_EXISTS naming the id and the call in flight, and writes nothing; a
/// repeated id within one turn is refused too.
#[tokio::test]
async fn a_call_id_held_in_flight_by_another_turn_is_refused_unless_it_is_the_same_call() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let run = kernel.create_run("careful").await;
    let slow = |delay_ms: u64| {
        let mut slow = call("slow", json!({"steps": 1, "delay_ms": delay_ms}));
        slow.call_id = "order-9".into();
        slow
    };
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let first = submit(&kernel, &run, 0, vec![slow(1500)]);
    let second = async {
        watch.event("tool:start", |_| true).await;
        let before = kernel.events(&run).await.len();
        let refused = submit(&kernel, &run, 1, vec![slow(10)]).await.expect_err("refused");
        assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
        assert!(
            refused
                .message()
                .starts_with("concurrent_call_id: calls[0] has call_id 'order-9'")
                && refused.message().contains("'slow' of turn 0"),
            "{}",
            refused.message()
        );
        assert_eq!(
            kernel.events(&run).await.len(),
            before,
            "the refused turn wrote nothing"
        );
        // The same call under the same id joins the one in flight.
        submit(&kernel, &run, 1, vec![slow(1500)]).await.expect("joined")
    };
    let (first, joined) = tokio::join!(first, second);
    assert_eq!(first.unwrap().results[0].content, joined.results[0].content);
    let mut twice = vec![slow(10), slow(10)];
    twice[1].tool = "echo".into();
    let refused = submit(&kernel, &run, 2, twice).await.expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("'order-9' is used twice in this turn"),
        "{}",
        refused.message()
    );
    check_log(&kernel.events(&run).await, true);
}

/// The most calls of one run running at once, read from its log.
fn most_running_at_once(events: &[pb::Event]) -> (usize, Vec<String>) {
    let mut running = std::collections::HashSet::new();
    let mut most = 0;
    let mut started = Vec::new();
    for event in events {
        let key = e2e::payload(event)["step_key"].as_str().unwrap_or_default().to_owned();
        match event.r#type.as_str() {
            "tool:start" => {
                running.insert(key.clone());
                started.push(key);
                most = most.max(running.len());
            }
            "tool:result" => {
                running.remove(&key);
            }
            _ => {}
        }
    }
    (most, started)
}

/// A turn's max_concurrency (and a run's, as the default) bounds how many of its calls run at
/// once; the others wait in the kernel and start in position order, results in position order.
#[tokio::test]
async fn a_turn_runs_at_most_its_max_concurrency_of_calls_at_once() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let calls = || {
        (0..4)
            .map(|_| call("slow", json!({"steps": 1, "delay_ms": 150})))
            .collect::<Vec<_>>()
    };
    let run = kernel.create_run("bounded").await;
    let request = pb::SubmitTurnRequest {
        run_id: run.clone(),
        turn: 0,
        calls: calls(),
        offered_tools: Vec::new(),
        max_concurrency: 2,
    };
    let mut stream = kernel.calls().await.submit_turn(request).await.unwrap().into_inner();
    let mut positions = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        if let Some(pb::submit_turn_response::Item::Result(result)) = item.item {
            assert_eq!(result.status, pb::CallStatus::Ok as i32, "{result:?}");
            positions.push(result.position);
        }
    }
    assert_eq!(positions, [0, 1, 2, 3], "results in position order");
    let (most, started) = most_running_at_once(&kernel.events(&run).await);
    assert_eq!(most, 2, "two at once, never more");
    assert_eq!(
        started,
        ["t0/p0", "t0/p1", "t0/p2", "t0/p3"],
        "the waiting ones start in position order"
    );

    // A run's max_concurrency is its turns' default.
    let request = pb::CreateRunRequest {
        agent: "one-at-a-time".into(),
        input_json: "{}".into(),
        max_concurrency: 1,
        ..Default::default()
    };
    let serial = kernel
        .runs()
        .await
        .create_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(serial.max_concurrency, 1);
    submit(&kernel, &serial.id, 0, calls()).await.unwrap();
    let (most, _) = most_running_at_once(&kernel.events(&serial.id).await);
    assert_eq!(most, 1, "one at a time");
    check_log(&kernel.events(&run).await, true);
}
