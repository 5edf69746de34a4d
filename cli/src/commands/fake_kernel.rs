//! An in-process stand-in for the kernel's `RunService` and `RegistryService`, so command tests
//! exercise the real gRPC client, paging and streaming against canned data on a port-0 server.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_server::{RegistryService, RegistryServiceServer};
use kernel_proto::v1::run_service_server::{RunService, RunServiceServer};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use crate::args::KernelAddr;

/// Page size the fake uses for `ListRunEvents`, small so tests cross pages.
pub const EVENTS_PAGE: usize = 2;

#[derive(Debug, Default)]
pub struct Data {
    pub runs: Vec<pb::Run>,
    /// The steps `GetRun` answers with for a run not in `run_steps`.
    pub steps: Vec<pb::Step>,
    /// Steps of one run, by its id.
    pub run_steps: HashMap<String, Vec<pb::Step>>,
    pub events: Vec<pb::Event>,
    pub tools: Vec<pb::RegisteredTool>,
    pub workers: Vec<pb::WorkerInfo>,
    /// Every `ListRuns` request received, to check paging.
    pub list_runs_requests: Vec<pb::ListRunsRequest>,
    /// Every `ListRunEvents` request received.
    pub list_events_requests: Vec<pb::ListRunEventsRequest>,
    /// Every `ForkRun` request received.
    pub fork_requests: Vec<pb::ForkRunRequest>,
}

/// The id of the run the fake's `ForkRun` answers with.
pub const BRANCH_ID: &str = "0192f0c1-branch";

#[derive(Debug, Clone, Default)]
pub struct FakeKernel {
    pub data: Arc<Mutex<Data>>,
}

impl FakeKernel {
    pub fn new(data: Data) -> Self {
        Self {
            data: Arc::new(Mutex::new(data)),
        }
    }

    /// Serves on a free port of 127.0.0.1 until the test's runtime ends.
    pub async fn serve(&self) -> KernelAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tonic::transport::Server::builder()
            .add_service(RunServiceServer::new(self.clone()))
            .add_service(RegistryServiceServer::new(self.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener));
        tokio::spawn(server);
        addr.to_string().parse().unwrap()
    }

    fn find_run(&self, id: &str) -> Result<pb::Run, Status> {
        let data = self.data.lock().unwrap();
        data.runs
            .iter()
            .find(|run| run.id == id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("run {id} not found")))
    }

    fn events_from(&self, run_id: &str, from_seq: u64) -> Vec<pb::Event> {
        let data = self.data.lock().unwrap();
        data.events
            .iter()
            .filter(|event| event.run_id == run_id && event.seq >= from_seq)
            .cloned()
            .collect()
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchRunEventsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RunService for FakeKernel {
    type WatchRunEventsStream = WatchStream;

    async fn create_run(&self, _: Request<pb::CreateRunRequest>) -> Result<Response<pb::CreateRunResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn get_run(&self, request: Request<pb::GetRunRequest>) -> Result<Response<pb::GetRunResponse>, Status> {
        let run = self.find_run(&request.get_ref().run_id)?;
        let data = self.data.lock().unwrap();
        let steps = data.run_steps.get(&run.id).unwrap_or(&data.steps).clone();
        Ok(Response::new(pb::GetRunResponse {
            run: Some(run),
            steps,
            ..Default::default()
        }))
    }

    async fn list_runs(&self, request: Request<pb::ListRunsRequest>) -> Result<Response<pb::ListRunsResponse>, Status> {
        let request = request.into_inner();
        let mut data = self.data.lock().unwrap();
        data.list_runs_requests.push(request.clone());
        let start: usize = match request.page_token.as_str() {
            "" => 0,
            token => token.parse().map_err(|_| Status::invalid_argument("bad page token"))?,
        };
        let size = if request.page_size == 0 {
            50
        } else {
            request.page_size as usize
        };
        let end = (start + size).min(data.runs.len());
        let runs = data.runs.get(start..end).unwrap_or_default().to_vec();
        let next_page_token = if end < data.runs.len() {
            end.to_string()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListRunsResponse { runs, next_page_token }))
    }

    async fn cancel_run(
        &self,
        request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        let request = request.into_inner();
        let run = pb::Run {
            status: pb::RunStatus::Cancelled as i32,
            reason: request.reason,
            ..self.find_run(&request.run_id)?
        };
        Ok(Response::new(pb::CancelRunResponse { run: Some(run) }))
    }

    /// Answers with a pending branch of the parent made as the request says, with id
    /// [`BRANCH_ID`]; `created` is false for an idempotency key seen before.
    async fn fork_run(&self, request: Request<pb::ForkRunRequest>) -> Result<Response<pb::ForkRunResponse>, Status> {
        let request = request.into_inner();
        let parent = self.find_run(&request.run_id)?;
        let mut data = self.data.lock().unwrap();
        let created = request.idempotency_key.is_empty()
            || !data
                .fork_requests
                .iter()
                .any(|earlier| earlier.idempotency_key == request.idempotency_key);
        data.fork_requests.push(request.clone());
        let run = pb::Run {
            id: BRANCH_ID.into(),
            status: pb::RunStatus::Pending as i32,
            input_json: Some(request.input_json)
                .filter(|input| !input.is_empty())
                .unwrap_or(parent.input_json),
            labels: Some(request.labels)
                .filter(|labels| !labels.is_empty())
                .unwrap_or(parent.labels),
            idempotency_key: request.idempotency_key,
            forked_from_run_id: parent.id,
            fork_at_step_key: request.at_step_key,
            fork_results: request.set_results,
            tool_calls: 0,
            output_json: String::new(),
            ..parent
        };
        Ok(Response::new(pb::ForkRunResponse {
            run: Some(run),
            created,
        }))
    }

    async fn complete_run(
        &self,
        _: Request<pb::CompleteRunRequest>,
    ) -> Result<Response<pb::CompleteRunResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn fail_run(&self, _: Request<pb::FailRunRequest>) -> Result<Response<pb::FailRunResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn list_receipts(
        &self,
        _: Request<pb::ListReceiptsRequest>,
    ) -> Result<Response<pb::ListReceiptsResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn list_run_events(
        &self,
        request: Request<pb::ListRunEventsRequest>,
    ) -> Result<Response<pb::ListRunEventsResponse>, Status> {
        let request = request.into_inner();
        self.find_run(&request.run_id)?;
        self.data.lock().unwrap().list_events_requests.push(request.clone());
        let all = self.events_from(&request.run_id, request.from_seq);
        let more = all.len() > EVENTS_PAGE;
        let events: Vec<pb::Event> = all.into_iter().take(EVENTS_PAGE).collect();
        let next_seq = match events.last() {
            Some(last) if more => last.seq + 1,
            _ => 0,
        };
        Ok(Response::new(pb::ListRunEventsResponse { events, next_seq }))
    }

    async fn watch_run_events(
        &self,
        request: Request<pb::WatchRunEventsRequest>,
    ) -> Result<Response<Self::WatchRunEventsStream>, Status> {
        use pb::watch_run_events_response::Item;
        let request = request.into_inner();
        self.find_run(&request.run_id)?;
        let mut items: Vec<Item> = self
            .events_from(&request.run_id, request.from_seq)
            .into_iter()
            .map(Item::Event)
            .collect();
        if request.include_progress {
            let progress = pb::Progress {
                run_id: request.run_id.clone(),
                step_key: "t0/p0".into(),
                tool: "search".into(),
                message: "halfway".into(),
                current: 1,
                total: 2,
                ..Default::default()
            };
            items.insert(1.min(items.len()), Item::Progress(progress));
        }
        let responses = items
            .into_iter()
            .map(|item| Ok(pb::WatchRunEventsResponse { item: Some(item) }));
        Ok(Response::new(Box::pin(tokio_stream::iter(responses))))
    }
}

#[tonic::async_trait]
impl RegistryService for FakeKernel {
    async fn list_tools(&self, _: Request<pb::ListToolsRequest>) -> Result<Response<pb::ListToolsResponse>, Status> {
        let tools = self.data.lock().unwrap().tools.clone();
        Ok(Response::new(pb::ListToolsResponse { tools }))
    }

    async fn list_workers(
        &self,
        _: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let workers = self.data.lock().unwrap().workers.clone();
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }

    async fn list_agents(&self, _: Request<pb::ListAgentsRequest>) -> Result<Response<pb::ListAgentsResponse>, Status> {
        Ok(Response::new(pb::ListAgentsResponse::default()))
    }
}
