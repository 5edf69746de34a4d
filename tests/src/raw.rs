//! A worker session driven by hand over raw gRPC, for tests of the protocol itself: fencing,
//! refusals, hostile input and the tool cache.

use kernel_proto::canonical;
use kernel_proto::v1 as pb;
use kernel_proto::v1::open_session_request::Message as In;
use kernel_proto::v1::open_session_response::Message as Out;
use kernel_proto::v1::worker_service_client::WorkerServiceClient;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::{Kernel, WAIT};

/// A tool announcement with an object schema, version "1" and its true fingerprint.
pub fn tool_spec(name: &str, description: &str) -> pb::ToolSpec {
    let schema = json!({"type": "object"});
    pb::ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema_json: schema.to_string(),
        version: "1".into(),
        fingerprint: canonical::tool_fingerprint(name, description, &schema, "1"),
        options: None,
    }
}

/// A worker session driven by hand.
pub struct RawWorker {
    /// Frames to the kernel.
    pub tx: mpsc::Sender<pb::OpenSessionRequest>,
    /// Frames from the kernel, for tests that read the stream's end themselves.
    pub rx: tonic::Streaming<pb::OpenSessionResponse>,
    next_request: u64,
}

impl RawWorker {
    /// Says hello with `tools` and waits for the welcome; a refused hello is the kernel's status.
    pub async fn open(kernel: &Kernel, tools: Vec<pb::ToolSpec>) -> Result<(RawWorker, pb::Welcome), tonic::Status> {
        RawWorker::hello(kernel, tools, Vec::new(), false).await
    }

    /// A session offering `tool` that reads batches: the kernel may send it `Dispatches`.
    pub async fn reading_batches(kernel: &Kernel, tool: &str) -> Result<RawWorker, tonic::Status> {
        Ok(
            RawWorker::hello(kernel, vec![tool_spec(tool, "a raw tool")], Vec::new(), true)
                .await?
                .0,
        )
    }

    /// A session hosting the agent `name` (any input), whose runs it is dispatched.
    pub async fn hosting(kernel: &Kernel, name: &str) -> Result<RawWorker, tonic::Status> {
        let agent = pb::AgentSpec {
            name: name.into(),
            description: "a raw agent".into(),
            input_schema_json: String::new(),
            version: "1".into(),
            max_concurrency: 0,
            // The kernel computes it.
            fingerprint: String::new(),
        };
        Ok(RawWorker::hello(kernel, Vec::new(), vec![agent], false).await?.0)
    }

    async fn hello(
        kernel: &Kernel,
        tools: Vec<pb::ToolSpec>,
        agents: Vec<pb::AgentSpec>,
        batches: bool,
    ) -> Result<(RawWorker, pb::Welcome), tonic::Status> {
        let (tx, outbound) = mpsc::channel(256);
        let hello = pb::Hello {
            worker_name: "raw".into(),
            tools,
            max_concurrency: 8,
            sdk_version: "test".into(),
            ephemeral_tools: false,
            agents,
            batches,
        };
        tx.send(pb::OpenSessionRequest {
            message: Some(In::Hello(hello)),
        })
        .await
        .unwrap();
        let mut client = WorkerServiceClient::connect(kernel.url()).await.unwrap();
        let mut rx = client.open_session(ReceiverStream::new(outbound)).await?.into_inner();
        match rx.next().await.expect("welcome")?.message {
            Some(Out::Welcome(welcome)) => Ok((
                RawWorker {
                    tx,
                    rx,
                    next_request: 1,
                },
                welcome,
            )),
            other => panic!("expected a welcome, got {other:?}"),
        }
    }

    /// A session offering one tool, described as "a raw tool".
    pub async fn offering(kernel: &Kernel, tool: &str) -> Result<RawWorker, tonic::Status> {
        Ok(RawWorker::open(kernel, vec![tool_spec(tool, "a raw tool")]).await?.0)
    }

    /// Sends one frame.
    pub async fn send(&self, message: In) {
        self.tx
            .send(pb::OpenSessionRequest { message: Some(message) })
            .await
            .unwrap();
    }

    /// The kernel's next frame.
    pub async fn next(&mut self) -> Out {
        let message = tokio::time::timeout(WAIT, self.rx.next())
            .await
            .expect("session stalled");
        message
            .expect("stream open")
            .expect("no error")
            .message
            .expect("message")
    }

    /// Waits for the next dispatch.
    pub async fn dispatch(&mut self) -> pb::Dispatch {
        match self.next().await {
            Out::Dispatch(dispatch) => dispatch,
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    /// Waits for the next dispatch of a hosted run's handler.
    pub async fn run_dispatch(&mut self) -> pb::RunDispatch {
        match self.next().await {
            Out::Run(dispatch) => dispatch,
            other => panic!("expected a run's dispatch, got {other:?}"),
        }
    }

    /// Sends a result for `(dispatch_id, attempt)` and returns the kernel's acknowledgement of it.
    pub async fn result(&mut self, dispatch_id: &str, attempt: u32, output: &str) -> pb::ResultAck {
        self.send(In::Result(pb::DispatchResult {
            dispatch_id: dispatch_id.into(),
            attempt,
            outcome: Some(pb::dispatch_result::Outcome::OutputJson(output.into())),
        }))
        .await;
        loop {
            match self.next().await {
                Out::ResultAck(ack) if ack.dispatch_id == dispatch_id => return ack,
                Out::ResultAck(_) => {}
                other => panic!("expected a result ack, got {other:?}"),
            }
        }
    }

    /// Sends one cache request for `(dispatch_id, attempt)` and returns the kernel's answer.
    pub async fn cache(&mut self, dispatch_id: &str, attempt: u32, op: pb::cache_request::Op) -> pb::CacheResponse {
        let request_id = self.next_request;
        self.next_request += 1;
        self.send(In::Cache(pb::CacheRequest {
            request_id,
            dispatch_id: dispatch_id.into(),
            attempt,
            op: Some(op),
        }))
        .await;
        match self.next().await {
            Out::Cache(answer) => {
                assert_eq!(answer.request_id, request_id);
                answer
            }
            other => panic!("expected a cache answer, got {other:?}"),
        }
    }
}
