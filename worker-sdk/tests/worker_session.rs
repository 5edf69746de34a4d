//! The worker against a scripted in-process kernel: handshake, dispatch, progress, cancel,
//! refusal, reconnect, drain, the concurrency limit and the tool cache's requests.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};
use worker_sdk::proto::v1 as pb;
use worker_sdk::{CancellationToken, Progress, ToolContext, ToolError, Worker, WorkerError, tool};

use pb::open_session_request::Message as Up;
use pb::open_session_response::Message as Down;
use pb::worker_service_server::{WorkerService, WorkerServiceServer};

const WAIT: Duration = Duration::from_secs(5);

/// Adds two integers.
#[tool]
async fn add(_ctx: ToolContext, a: i64, b: i64) -> Result<i64, ToolError> {
    Ok(a + b)
}

/// Reports progress, then waits to be cancelled or for `ms` milliseconds.
#[tool]
async fn wait(ctx: ToolContext, ms: u64) -> Result<String, ToolError> {
    ctx.progress_with(Progress::new("waiting").step(1, 2));
    tokio::select! {
        _ = ctx.cancelled() => Err(ToolError::fatal("stopped by cancel")),
        _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok("waited".into()),
    }
}

/// Counts how many calls run at once.
#[tool]
async fn busy(ctx: ToolContext) -> Result<(), ToolError> {
    let gauge = ctx.deps::<Gauge>().expect("gauge registered");
    let now = gauge.running.fetch_add(1, Ordering::SeqCst) + 1;
    gauge.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    gauge.running.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Keeps `value` under `key` in the tool's cache for a minute, then reads the key back.
#[tool]
async fn remember(ctx: ToolContext, key: String, value: Value) -> Result<Option<Value>, ToolError> {
    let cache = ctx.cache();
    cache.set(&key, &value, Some(Duration::from_secs(60))).await?;
    cache.get_value(&key).await
}

/// Reads `key` from the tool's cache, and tells the test through its deps when that fails.
#[tool]
async fn recall(ctx: ToolContext, key: String) -> Result<Option<Value>, ToolError> {
    let found = ctx.cache().get_value(&key).await;
    if let (Err(error), Some(failures)) = (&found, ctx.deps::<Failures>()) {
        let _ = failures.0.send(error.clone());
    }
    found
}

/// Where `recall` reports its failures: a lost session's result never reaches the kernel.
struct Failures(mpsc::UnboundedSender<ToolError>);

/// Shared by the test and the tool through the worker's deps.
#[derive(Default, Clone)]
struct Gauge {
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

/// One session as the scripted kernel sees it. Like the real kernel, it ends its side of the
/// stream when the worker ends its own.
struct KernelSide {
    hello: pb::Hello,
    inbound: mpsc::UnboundedReceiver<pb::OpenSessionRequest>,
    outbound: mpsc::Sender<Result<pb::OpenSessionResponse, Status>>,
}

impl KernelSide {
    async fn send(&self, message: Down) {
        self.outbound
            .send(Ok(pb::OpenSessionResponse { message: Some(message) }))
            .await
            .unwrap();
    }

    async fn dispatch(&self, id: &str, tool: &str, args: Value) {
        self.send(Down::Dispatch(pb::Dispatch {
            dispatch_id: id.into(),
            attempt: 1,
            run_id: "run-1".into(),
            step_key: format!("id:{id}"),
            call_id: id.into(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            idempotency_key: format!("run-1/{id}"),
            ..Default::default()
        }))
        .await;
    }

    /// The next message that is not a heartbeat; `None` when the worker ended the stream.
    async fn next(&mut self) -> Option<Up> {
        loop {
            let message = tokio::time::timeout(WAIT, self.inbound.recv())
                .await
                .expect("worker message in time")?;
            match message.message {
                Some(Up::Heartbeat(_)) => continue,
                other => return other,
            }
        }
    }

    async fn result(&mut self) -> pb::DispatchResult {
        loop {
            match self.next().await {
                Some(Up::Result(result)) => return result,
                Some(Up::Progress(_)) => continue,
                other => panic!("expected a result, got {other:?}"),
            }
        }
    }
}

fn output(result: &pb::DispatchResult) -> Result<Value, (String, i32)> {
    match result.outcome.clone().expect("an outcome") {
        pb::dispatch_result::Outcome::OutputJson(text) => Ok(serde_json::from_str(&text).unwrap()),
        pb::dispatch_result::Outcome::Error(failure) => Err((failure.message, failure.kind)),
        pb::dispatch_result::Outcome::Suspended(_) => panic!("a tool call never suspends"),
    }
}

#[derive(Clone)]
struct ScriptedKernel {
    sessions: mpsc::Sender<KernelSide>,
    refuse: Option<Status>,
    heartbeat_ms: u64,
}

#[tonic::async_trait]
impl WorkerService for ScriptedKernel {
    type OpenSessionStream = Pin<Box<dyn Stream<Item = Result<pb::OpenSessionResponse, Status>> + Send>>;

    async fn open_session(
        &self,
        request: Request<Streaming<pb::OpenSessionRequest>>,
    ) -> Result<Response<Self::OpenSessionStream>, Status> {
        let mut inbound = request.into_inner();
        let Some(pb::OpenSessionRequest {
            message: Some(Up::Hello(hello)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("expected hello"));
        };
        if let Some(status) = self.refuse.clone() {
            return Err(status);
        }
        let (outbound, rx) = mpsc::channel(64);
        let welcome = pb::Welcome {
            session_id: "s-1".into(),
            heartbeat_interval_ms: self.heartbeat_ms,
            lease_ttl_ms: 10 * self.heartbeat_ms,
        };
        outbound
            .send(Ok(pb::OpenSessionResponse {
                message: Some(Down::Welcome(welcome)),
            }))
            .await
            .unwrap();
        let closed = CancellationToken::new();
        let (forward, received) = mpsc::unbounded_channel();
        let close = closed.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                if forward.send(message).is_err() {
                    break;
                }
            }
            close.cancel();
        });
        self.sessions
            .send(KernelSide {
                hello,
                inbound: received,
                outbound,
            })
            .await
            .unwrap();
        Ok(Response::new(Box::pin(
            ReceiverStream::new(rx).take_until(closed.cancelled_owned()),
        )))
    }
}

struct Harness {
    sessions: mpsc::Receiver<KernelSide>,
    shutdown: CancellationToken,
    worker: JoinHandle<Result<(), WorkerError>>,
}

impl Harness {
    async fn next_session(&mut self) -> KernelSide {
        tokio::time::timeout(WAIT, self.sessions.recv())
            .await
            .expect("a session in time")
            .unwrap()
    }

    async fn stop(self) -> Result<(), WorkerError> {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.worker)
            .await
            .expect("worker stops in time")
            .unwrap()
    }
}

async fn start(
    refuse: Option<Status>,
    configure: impl FnOnce(worker_sdk::WorkerBuilder) -> worker_sdk::WorkerBuilder,
) -> Harness {
    start_with(refuse, Gauge::default(), configure).await
}

async fn start_with(
    refuse: Option<Status>,
    gauge: Gauge,
    configure: impl FnOnce(worker_sdk::WorkerBuilder) -> worker_sdk::WorkerBuilder,
) -> Harness {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sessions, rx) = mpsc::channel(8);
    let kernel = ScriptedKernel {
        sessions,
        refuse,
        heartbeat_ms: 20,
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkerServiceServer::new(kernel))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let builder = Worker::builder(addr.to_string())
        .name("w1")
        .tools([add_tool(), wait_tool(), busy_tool()])
        .deps(gauge);
    let worker = configure(builder).build().unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let worker = tokio::spawn(async move { worker.run(stop).await });
    Harness {
        sessions: rx,
        shutdown,
        worker,
    }
}

#[tokio::test]
async fn hello_announces_tools_and_heartbeats_follow() {
    let mut harness = start(None, |b| b.max_concurrency(3)).await;
    let mut kernel = harness.next_session().await;
    assert_eq!(kernel.hello.worker_name, "w1");
    assert_eq!(kernel.hello.max_concurrency, 3);
    assert_eq!(kernel.hello.sdk_version, env!("CARGO_PKG_VERSION"));
    let names: Vec<_> = kernel.hello.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["add", "busy", "wait"]);
    assert_eq!(kernel.hello.tools[0].fingerprint, add_tool().fingerprint());

    let mut heartbeats = 0;
    while heartbeats < 3 {
        let message = tokio::time::timeout(WAIT, kernel.inbound.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(message.message, Some(Up::Heartbeat(_))), "{message:?}");
        heartbeats += 1;
    }
    harness.stop().await.unwrap();
}

#[tokio::test]
async fn dispatches_run_and_results_come_back_fenced() {
    let mut harness = start(None, |b| b).await;
    let mut kernel = harness.next_session().await;

    kernel.dispatch("d1", "add", json!({"a": 2, "b": 3})).await;
    let result = kernel.result().await;
    assert_eq!((result.dispatch_id.as_str(), result.attempt), ("d1", 1));
    assert_eq!(output(&result), Ok(json!(5)));

    kernel.dispatch("d2", "weather", json!({})).await;
    let result = kernel.result().await;
    assert_eq!(
        output(&result),
        Err((
            "worker does not offer tool 'weather'".into(),
            pb::ErrorKind::Fatal as i32
        ))
    );

    kernel.dispatch("d3", "add", json!({"a": "two", "b": 3})).await;
    let (message, kind) = output(&kernel.result().await).unwrap_err();
    assert_eq!(kind, pb::ErrorKind::Fatal as i32);
    assert!(
        message.starts_with("invalid arguments for tool 'add': field `a`"),
        "{message}"
    );

    kernel.dispatch("d4", "wait", json!({"ms": 10})).await;
    let Some(Up::Progress(progress)) = kernel.next().await else {
        panic!("expected progress")
    };
    assert_eq!(
        (progress.dispatch_id.as_str(), progress.message.as_str()),
        ("d4", "waiting")
    );
    assert_eq!((progress.current, progress.total), (1, 2));
    assert_eq!(output(&kernel.result().await), Ok(json!("waited")));

    harness.stop().await.unwrap();
}

#[tokio::test]
async fn cancel_reaches_the_running_tool() {
    let mut harness = start(None, |b| b).await;
    let mut kernel = harness.next_session().await;
    kernel.dispatch("d1", "wait", json!({"ms": 60_000})).await;
    let Some(Up::Progress(_)) = kernel.next().await else {
        panic!("expected progress")
    };
    // A cancel for another attempt is stale and ignored.
    kernel
        .send(Down::Cancel(pb::CancelDispatch {
            dispatch_id: "d1".into(),
            attempt: 7,
            reason: "stale".into(),
        }))
        .await;
    kernel
        .send(Down::Cancel(pb::CancelDispatch {
            dispatch_id: "d1".into(),
            attempt: 1,
            reason: "timeout".into(),
        }))
        .await;
    let result = kernel.result().await;
    assert_eq!(
        output(&result),
        Err(("stopped by cancel".into(), pb::ErrorKind::Fatal as i32))
    );
    harness.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_registration_ends_run_with_the_kernel_message() {
    let refusal = Status::already_exists("tool 'add' is registered with another fingerprint");
    let harness = start(Some(refusal), |b| b).await;
    let result = tokio::time::timeout(WAIT, harness.worker).await.unwrap().unwrap();
    match result {
        Err(WorkerError::Refused { code, message }) => {
            assert_eq!(code, tonic::Code::AlreadyExists);
            assert_eq!(message, "tool 'add' is registered with another fingerprint");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_broken_session_is_reopened() {
    let mut harness = start(None, |b| b).await;
    let kernel = harness.next_session().await;
    kernel
        .outbound
        .send(Err(Status::unavailable("kernel restarting")))
        .await
        .unwrap();
    drop(kernel);
    let mut kernel = harness.next_session().await;
    assert_eq!(kernel.hello.worker_name, "w1");
    kernel.dispatch("d1", "add", json!({"a": 1, "b": 1})).await;
    assert_eq!(output(&kernel.result().await), Ok(json!(2)));
    harness.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_calls_in_flight() {
    let mut harness = start(None, |b| b).await;
    let mut kernel = harness.next_session().await;
    kernel.dispatch("d1", "wait", json!({"ms": 200})).await;
    let Some(Up::Progress(_)) = kernel.next().await else {
        panic!("expected progress")
    };

    harness.shutdown.cancel();
    assert!(matches!(kernel.next().await, Some(Up::Drain(_))));
    assert_eq!(output(&kernel.result().await), Ok(json!("waited")));
    assert!(
        kernel.next().await.is_none(),
        "the worker ends its stream after draining"
    );
    drop(kernel);
    tokio::time::timeout(WAIT, harness.worker)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn drain_gives_up_after_its_timeout() {
    let mut harness = start(None, |b| b.drain_timeout(Duration::from_millis(100))).await;
    let mut kernel = harness.next_session().await;
    kernel.dispatch("d1", "wait", json!({"ms": 60_000})).await;
    let Some(Up::Progress(_)) = kernel.next().await else {
        panic!("expected progress")
    };
    let started = std::time::Instant::now();
    harness.shutdown.cancel();
    assert!(matches!(kernel.next().await, Some(Up::Drain(_))));
    tokio::time::timeout(WAIT, harness.worker)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn never_more_than_max_concurrency_at_once() {
    let gauge = Gauge::default();
    let mut harness = start_with(None, gauge.clone(), |b| b.max_concurrency(2)).await;
    let mut kernel = harness.next_session().await;
    for index in 0..6 {
        kernel.dispatch(&format!("d{index}"), "busy", json!({})).await;
    }
    for _ in 0..6 {
        assert_eq!(output(&kernel.result().await), Ok(Value::Null));
    }
    assert_eq!(gauge.peak.load(Ordering::SeqCst), 2, "six calls ran two at a time");
    harness.stop().await.unwrap();
}

/// The next message, which must be a cache request.
async fn cache_request(kernel: &mut KernelSide) -> pb::CacheRequest {
    match kernel.next().await {
        Some(Up::Cache(request)) => request,
        other => panic!("expected a cache request, got {other:?}"),
    }
}

async fn answer(kernel: &KernelSide, request_id: u64, value_json: Option<&str>) {
    kernel
        .send(Down::Cache(pb::CacheResponse {
            request_id,
            found: value_json.is_some(),
            value_json: value_json.unwrap_or_default().into(),
            error: String::new(),
        }))
        .await;
}

#[tokio::test]
async fn cache_requests_carry_their_dispatch_and_answers_find_their_call() {
    let mut harness = start(None, |b| b.tool(remember_tool())).await;
    let mut kernel = harness.next_session().await;
    kernel
        .dispatch("d1", "remember", json!({"key": "one", "value": 1}))
        .await;
    kernel
        .dispatch("d2", "remember", json!({"key": "two", "value": {"n": 2}}))
        .await;

    let mut sets = [cache_request(&mut kernel).await, cache_request(&mut kernel).await];
    sets.sort_by(|a, b| a.dispatch_id.cmp(&b.dispatch_id));
    let expected = [("d1", "one", "1"), ("d2", "two", r#"{"n":2}"#)];
    for (request, (dispatch, key, value)) in sets.iter().zip(expected) {
        assert_eq!((request.dispatch_id.as_str(), request.attempt), (dispatch, 1));
        assert_eq!(
            request.op,
            Some(pb::cache_request::Op::Set(pb::CacheSet {
                key: key.into(),
                value_json: value.into(),
                ttl_ms: 60_000,
            }))
        );
    }
    assert_ne!(sets[0].request_id, sets[1].request_id);
    // Answered out of order: each answer still reaches the call that asked.
    answer(&kernel, sets[1].request_id, None).await;
    answer(&kernel, sets[0].request_id, None).await;

    let mut gets = [cache_request(&mut kernel).await, cache_request(&mut kernel).await];
    gets.sort_by(|a, b| a.dispatch_id.cmp(&b.dispatch_id));
    assert_eq!(
        gets[0].op,
        Some(pb::cache_request::Op::Get(pb::CacheGet { key: "one".into() }))
    );
    answer(&kernel, gets[1].request_id, Some(r#""kept by d2""#)).await;
    answer(&kernel, gets[0].request_id, Some(r#""kept by d1""#)).await;

    let mut results = [kernel.result().await, kernel.result().await];
    results.sort_by(|a, b| a.dispatch_id.cmp(&b.dispatch_id));
    assert_eq!(output(&results[0]), Ok(json!("kept by d1")));
    assert_eq!(output(&results[1]), Ok(json!("kept by d2")));
    harness.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_cache_request_fails_the_call_retryably() {
    let mut harness = start(None, |b| b.tool(recall_tool())).await;
    let mut kernel = harness.next_session().await;
    kernel.dispatch("d1", "recall", json!({"key": "k"})).await;
    let request = cache_request(&mut kernel).await;
    kernel
        .send(Down::Cache(pb::CacheResponse {
            request_id: request.request_id,
            error: "dispatch d1 attempt 1 is not held by this session".into(),
            ..Default::default()
        }))
        .await;
    assert_eq!(
        output(&kernel.result().await),
        Err((
            "cache request refused: dispatch d1 attempt 1 is not held by this session".into(),
            pb::ErrorKind::Retryable as i32
        ))
    );
    harness.stop().await.unwrap();
}

#[tokio::test]
async fn a_lost_session_fails_cache_requests_still_waiting() {
    let (failures, mut failed) = mpsc::unbounded_channel();
    let mut harness = start(None, |b| b.tool(recall_tool()).deps(Failures(failures))).await;
    let mut kernel = harness.next_session().await;
    kernel.dispatch("d1", "recall", json!({"key": "k"})).await;
    let _unanswered = cache_request(&mut kernel).await;
    kernel
        .outbound
        .send(Err(Status::unavailable("kernel restarting")))
        .await
        .unwrap();
    drop(kernel);

    let error = tokio::time::timeout(WAIT, failed.recv()).await.unwrap().unwrap();
    assert!(error.is_retryable(), "{error:?}");
    assert!(error.message().contains("session to the kernel was lost"), "{error}");
    let _reopened = harness.next_session().await;
    harness.stop().await.unwrap();
}
