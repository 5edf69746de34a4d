//! The agent client against a scripted in-process kernel: what it sends and how it reads answers.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentClient, AgentError, Call, CallStatus, ErrorKind, Fork, NewRun, TurnItem};

use pb::run_service_server::{RunService, RunServiceServer};
use pb::tool_call_service_server::{ToolCallService, ToolCallServiceServer};

type Items<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// What the scripted kernel was asked, for the test to check.
#[derive(Default)]
struct Seen {
    create: Vec<pb::CreateRunRequest>,
    turns: Vec<pb::SubmitTurnRequest>,
    completed: Vec<pb::CompleteRunRequest>,
    forks: Vec<pb::ForkRunRequest>,
}

#[derive(Clone, Default)]
struct ScriptedKernel {
    seen: Arc<Mutex<Seen>>,
}

fn run(id: &str) -> pb::Run {
    pb::Run {
        id: id.into(),
        agent: "a".into(),
        status: pb::RunStatus::Running as i32,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl RunService for ScriptedKernel {
    type WatchRunEventsStream = Items<pb::WatchRunEventsResponse>;

    async fn create_run(
        &self,
        request: Request<pb::CreateRunRequest>,
    ) -> Result<Response<pb::CreateRunResponse>, Status> {
        let request = request.into_inner();
        let created = request.idempotency_key != "seen-before";
        self.seen.lock().unwrap().create.push(request);
        Ok(Response::new(pb::CreateRunResponse {
            run: Some(run("run-1")),
            created,
        }))
    }

    async fn get_run(&self, request: Request<pb::GetRunRequest>) -> Result<Response<pb::GetRunResponse>, Status> {
        let id = request.into_inner().run_id;
        let step = pb::Step {
            step_key: "t0/p0".into(),
            tool: "add".into(),
            ..Default::default()
        };
        Ok(Response::new(pb::GetRunResponse {
            run: Some(run(&id)),
            steps: vec![step],
            ..Default::default()
        }))
    }

    async fn list_runs(&self, _: Request<pb::ListRunsRequest>) -> Result<Response<pb::ListRunsResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn fork_run(&self, request: Request<pb::ForkRunRequest>) -> Result<Response<pb::ForkRunResponse>, Status> {
        let request = request.into_inner();
        let branch = format!("branch-of-{}", request.run_id);
        self.seen.lock().unwrap().forks.push(request);
        Ok(Response::new(pb::ForkRunResponse {
            run: Some(run(&branch)),
            created: true,
        }))
    }

    async fn cancel_run(&self, _: Request<pb::CancelRunRequest>) -> Result<Response<pb::CancelRunResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn complete_run(
        &self,
        request: Request<pb::CompleteRunRequest>,
    ) -> Result<Response<pb::CompleteRunResponse>, Status> {
        let request = request.into_inner();
        let id = request.run_id.clone();
        self.seen.lock().unwrap().completed.push(request);
        Ok(Response::new(pb::CompleteRunResponse { run: Some(run(&id)) }))
    }

    async fn list_receipts(
        &self,
        _: Request<pb::ListReceiptsRequest>,
    ) -> Result<Response<pb::ListReceiptsResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn fail_run(&self, request: Request<pb::FailRunRequest>) -> Result<Response<pb::FailRunResponse>, Status> {
        Err(Status::not_found(format!(
            "run '{}' not found",
            request.into_inner().run_id
        )))
    }

    async fn list_run_events(
        &self,
        _: Request<pb::ListRunEventsRequest>,
    ) -> Result<Response<pb::ListRunEventsResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn watch_run_events(
        &self,
        _: Request<pb::WatchRunEventsRequest>,
    ) -> Result<Response<Self::WatchRunEventsStream>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

#[tonic::async_trait]
impl ToolCallService for ScriptedKernel {
    type SubmitTurnStream = Items<pb::SubmitTurnResponse>;

    /// The SDK drives turns with `SubmitTurn`; a call here is a mistake the test should see.
    async fn call_turn(&self, _: Request<pb::CallTurnRequest>) -> Result<Response<pb::CallTurnResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    /// Answers `add` with the sum, any other tool as unknown; progress before each result.
    async fn submit_turn(
        &self,
        request: Request<pb::SubmitTurnRequest>,
    ) -> Result<Response<Self::SubmitTurnStream>, Status> {
        use pb::submit_turn_response::Item;
        let request = request.into_inner();
        if request.run_id != "run-1" {
            return Err(Status::not_found(format!("run '{}' not found", request.run_id)));
        }
        self.seen.lock().unwrap().turns.push(request.clone());
        let mut items = Vec::new();
        for (position, call) in request.calls.iter().enumerate() {
            let position = position as u32;
            let step_key = format!("t{}/p{position}", request.turn);
            items.push(Item::Progress(pb::Progress {
                run_id: request.run_id.clone(),
                step_key: step_key.clone(),
                position,
                tool: call.tool.clone(),
                message: "working".into(),
                data_json: r#"{"k":1}"#.into(),
                current: 1,
                total: 2,
            }));
            let result = if call.tool == "add" {
                let args: serde_json::Value = serde_json::from_str(&call.arguments_json).unwrap();
                let sum = args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap();
                pb::CallResult {
                    status: pb::CallStatus::Ok as i32,
                    content: sum.to_string(),
                    output_json: sum.to_string(),
                    attempts: 1,
                    ..Default::default()
                }
            } else {
                pb::CallResult {
                    status: pb::CallStatus::Error as i32,
                    content: format!("unknown tool '{}'; available: add", call.tool),
                    error_kind: pb::ErrorKind::Fatal as i32,
                    ..Default::default()
                }
            };
            items.push(Item::Result(pb::CallResult {
                position,
                step_key,
                tool: call.tool.clone(),
                ..result
            }));
        }
        let stream = futures_util::stream::iter(items).map(|item| Ok(pb::SubmitTurnResponse { item: Some(item) }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cancel_call(&self, _: Request<pb::CancelCallRequest>) -> Result<Response<pb::CancelCallResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn ask_person(&self, _: Request<pb::AgentAskRequest>) -> Result<Response<pb::AgentAskResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

async fn start() -> (AgentClient, ScriptedKernel) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let kernel = ScriptedKernel::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RunServiceServer::new(kernel.clone()))
            .add_service(ToolCallServiceServer::new(kernel.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (AgentClient::connect(addr.to_string()).await.unwrap(), kernel)
}

#[tokio::test]
async fn create_run_sends_input_labels_and_key() {
    let (client, kernel) = start().await;
    let new_run = NewRun::new("demo", json!({"z": 1, "a": [true]}))
        .label("team", "infra")
        .idempotency_key("seen-before")
        .max_tool_calls(10);
    let run = client.create_run(new_run).await.unwrap();
    assert_eq!(run.id(), "run-1");
    assert!(!run.created());
    let seen = kernel.seen.lock().unwrap();
    let request = &seen.create[0];
    assert_eq!(request.agent, "demo");
    assert_eq!(request.input_json, r#"{"a":[true],"z":1}"#);
    assert_eq!(request.labels.get("team").map(String::as_str), Some("infra"));
    assert_eq!(
        (request.idempotency_key.as_str(), request.max_tool_calls),
        ("seen-before", 10)
    );
}

#[tokio::test]
async fn a_fork_sends_its_point_input_and_replaced_results() {
    let (client, kernel) = start().await;
    let fork = Fork::of("run-1")
        .at("t1/p0")
        .input(json!({"b": 1, "a": 2}))
        .set_result("t0/p0", json!({"price": 5}));
    let branch = client.fork_run(fork).await.unwrap();
    assert_eq!((branch.id(), branch.created()), ("branch-of-run-1", true));
    let seen = kernel.seen.lock().unwrap();
    let request = &seen.forks[0];
    assert_eq!(
        (
            request.run_id.as_str(),
            request.at_step_key.as_str(),
            request.input_json.as_str()
        ),
        ("run-1", "t1/p0", r#"{"a":2,"b":1}"#)
    );
    assert_eq!(
        request.set_results.get("t0/p0").map(String::as_str),
        Some(r#"{"price":5}"#)
    );
}

#[tokio::test]
async fn a_turn_streams_progress_then_results() {
    let (client, kernel) = start().await;
    let run = client.create_run(NewRun::new("demo", json!(null))).await.unwrap();
    let calls = vec![
        Call::new("add", json!({"b": 3, "a": 2})),
        Call::new("weather", json!({})).with_id("w"),
    ];
    let items: Vec<TurnItem> = run.submit_turn(4, calls).map(Result::unwrap).collect().await;
    assert_eq!(items.len(), 4);
    let TurnItem::Progress(progress) = &items[0] else {
        panic!("progress first")
    };
    assert_eq!((progress.current, progress.total), (Some(1), Some(2)));
    assert_eq!(progress.data, Some(json!({"k": 1})));
    let TurnItem::Result(sum) = &items[1] else {
        panic!("then a result")
    };
    assert_eq!(
        (sum.position, sum.step_key.as_str(), sum.status),
        (0, "t4/p0", CallStatus::Ok)
    );
    assert_eq!((sum.content.as_str(), sum.output.clone()), ("5", Some(json!(5))));
    let TurnItem::Result(unknown) = &items[3] else {
        panic!("then a result")
    };
    assert_eq!(unknown.status, CallStatus::Error);
    assert_eq!(unknown.error_kind, Some(ErrorKind::Fatal));
    assert_eq!(unknown.content, "unknown tool 'weather'; available: add");
    assert!(unknown.output.is_none());

    let seen = kernel.seen.lock().unwrap();
    let turn = &seen.turns[0];
    assert_eq!((turn.run_id.as_str(), turn.turn), ("run-1", 4));
    assert_eq!(turn.calls[0].arguments_json, r#"{"a":2,"b":3}"#);
    assert_eq!(
        (turn.calls[0].call_id.as_str(), turn.calls[1].call_id.as_str()),
        ("", "w")
    );
}

#[tokio::test]
async fn call_turn_keeps_only_results() {
    let (client, _kernel) = start().await;
    let run = client.run("run-1");
    let outcomes = run
        .call_turn(0, vec![Call::new("add", json!({"a": 1, "b": 1}))])
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].content, "2");
}

#[tokio::test]
async fn ending_and_reading_a_run() {
    let (client, kernel) = start().await;
    let run = client.run("run-1");
    run.complete(json!({"y": 2, "x": 1})).await.unwrap();
    assert_eq!(kernel.seen.lock().unwrap().completed[0].output_json, r#"{"x":1,"y":2}"#);
    let snapshot = run.get().await.unwrap();
    assert_eq!(snapshot.run.id, "run-1");
    assert_eq!(snapshot.steps.len(), 1);
}

#[tokio::test]
async fn kernel_statuses_surface_as_errors() {
    let (client, _kernel) = start().await;
    let missing = client.run("run-9");
    match missing.fail("boom").await {
        Err(AgentError::Status(status)) => assert_eq!(status.code(), tonic::Code::NotFound),
        other => panic!("expected a status, got {other:?}"),
    }
    let error = missing
        .call_turn(0, vec![Call::new("add", json!({}))])
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "kernel error (NotFound): run 'run-9' not found");
}

#[tokio::test]
async fn an_unreachable_kernel_is_a_transport_error() {
    let error = AgentClient::connect("127.0.0.1:1").await.unwrap_err();
    assert!(matches!(error, AgentError::Transport(_)), "{error:?}");
}
