//! `RunService`: create, read, end and watch runs.

use std::pin::Pin;

use futures_util::Stream;
use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_server::RunService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Kernel, STREAM_BUFFER, convert};
use crate::error::KernelError;
use crate::hub::{Signal, Subscription};
use crate::model::{Capture, EventType, RunId, RunRecord};
use crate::store::{EndRun, NewRun, RunFilter};

const MAX_PAGE_RUNS: u32 = 1000;
const MAX_PAGE_EVENTS: u32 = 5000;
const MAX_IDEMPOTENCY_KEY: usize = 256;

/// Implements `kernel.v1.RunService`.
pub struct RunApi(pub Kernel);

/// The agent's W3C trace context, from the request's `traceparent` metadata. One that does not
/// parse starts a trace of the run's own, as the W3C rules say, rather than failing the call.
fn traceparent(metadata: &tonic::metadata::MetadataMap) -> Option<crate::traces::TraceParent> {
    let text = metadata.get("traceparent")?.to_str().ok()?;
    match text.trim().parse() {
        Ok(parent) => Some(parent),
        Err(error) => {
            tracing::debug!(%error, "ignoring the request's traceparent");
            None
        }
    }
}

fn is_terminal_event(kind: EventType) -> bool {
    matches!(
        kind,
        EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled
    )
}

/// A client's idempotency key: none when empty, refused when too long.
pub(super) fn idempotency_key(key: String) -> Result<Option<String>, KernelError> {
    if key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(KernelError::invalid(
            "idempotency_key",
            format!("longer than {MAX_IDEMPOTENCY_KEY} bytes"),
        ));
    }
    Ok((!key.is_empty()).then_some(key))
}

impl RunApi {
    async fn load(&self, id: &RunId) -> Result<RunRecord, KernelError> {
        self.0
            .store
            .reads
            .run(id.clone())
            .await?
            .ok_or_else(|| KernelError::NotFound(format!("run {id} not found")))
    }

    async fn end(&self, run_id: &str, end: EndRun) -> Result<RunRecord, KernelError> {
        let id = RunId::parse(run_id, "run_id")?;
        // What the end settled is cancelled on its workers by the commit's effects.
        let (run, _) = self.0.store.end_run(id, end).await?;
        Ok(run)
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchRunEventsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RunService for RunApi {
    async fn create_run(
        &self,
        request: Request<pb::CreateRunRequest>,
    ) -> Result<Response<pb::CreateRunResponse>, Status> {
        let caller = request.extensions().get::<crate::auth::Caller>().cloned();
        let trace = traceparent(request.metadata());
        let req = request.into_inner();
        let agent = req.agent.trim().to_owned();
        if agent.is_empty() {
            return Err(KernelError::invalid("agent", "must not be empty").into());
        }
        // With keys a run holds only what its creating key may grant; without them (loopback
        // development) its claim stands.
        if let Some(caller) = &caller {
            caller.may_grant(&req.permissions)?;
        }
        let idempotency_key = idempotency_key(req.idempotency_key)?;
        let allow = super::fork::allow_tokens(req.allow)?;
        let input = convert::canonical_json(&req.input_json, "input_json", "null")?;
        let hosted = match self.0.registry.agent(&agent) {
            Some(known) => {
                known.check_input(&input)?;
                Some(known.hosted())
            }
            None if req.hosted => {
                return Err(KernelError::NotFound(format!(
                    "no worker offers or has offered agent '{agent}'; start a worker that hosts it, or create the \
                     run without hosted to drive it with SubmitTurn"
                ))
                .into());
            }
            None => None,
        };
        let labels = convert::labels(req.labels)?;
        let budget = self
            .0
            .governance
            .budget(convert::budget_limits(req.budget)?, &agent, &labels);
        let new = NewRun {
            agent,
            input,
            labels,
            budget,
            idempotency_key,
            max_tool_calls: req.max_tool_calls,
            interactive: !req.non_interactive,
            permissions: req.permissions,
            granted_by: caller.map(|c| c.name().to_owned()),
            capture: convert::capture(req.capture)?,
            hosted,
            parent: None,
            session_key: None,
            max_concurrency: req.max_concurrency,
            fork: None,
            allow,
            trace,
            home: None,
        };
        // A hosted run's dispatch is queued by the commit's effects.
        let (run, created, _) = self.0.store.create_run_dispatching(new).await?;
        Ok(Response::new(pb::CreateRunResponse {
            run: Some(convert::run(&run)),
            created,
        }))
    }

    async fn list_receipts(
        &self,
        request: Request<pb::ListReceiptsRequest>,
    ) -> Result<Response<pb::ListReceiptsResponse>, Status> {
        let id = RunId::parse(&request.into_inner().run_id, "run_id")?;
        let key = self.0.receipt_key.clone().ok_or_else(|| {
            KernelError::FailedPrecondition(
                "this kernel has no key to sign receipts with: start it with --receipt-key FILE".to_owned(),
            )
        })?;
        let run = self.load(&id).await?;
        let steps = self.0.store.reads.steps(id).await?;
        let lines = kernel_proto::receipt::chain(crate::receipts::of_run(&run, &steps), &key);
        Ok(Response::new(pb::ListReceiptsResponse {
            receipts_json: lines.iter().map(kernel_proto::canonical::to_canonical).collect(),
            key: hex::encode(key.verifying_key().to_bytes()),
        }))
    }

    async fn fork_run(&self, request: Request<pb::ForkRunRequest>) -> Result<Response<pb::ForkRunResponse>, Status> {
        let caller = request.extensions().get::<crate::auth::Caller>().cloned();
        let trace = traceparent(request.metadata());
        let req = request.into_inner();
        let id = RunId::parse(&req.run_id, "run_id")?;
        let parent = self.load(&id).await?;
        let steps = self.0.store.reads.steps(id).await?;
        let mut new = super::fork::branch(&self.0, &parent, &steps, req, caller.as_ref())?;
        new.trace = trace;
        // A hosted run's dispatch is queued by the commit's effects.
        let (run, created, _) = self.0.store.create_run_dispatching(new).await?;
        Ok(Response::new(pb::ForkRunResponse {
            run: Some(convert::run(&run)),
            created,
        }))
    }

    async fn get_run(&self, request: Request<pb::GetRunRequest>) -> Result<Response<pb::GetRunResponse>, Status> {
        let id = RunId::parse(&request.into_inner().run_id, "run_id")?;
        let run = self.load(&id).await?;
        let steps = self.0.store.reads.steps(id.clone()).await?;
        let approvals = self.0.store.reads.run_approvals(id).await?;
        Ok(Response::new(pb::GetRunResponse {
            run: Some(convert::run(&run)),
            manifest: Some(convert::manifest(&steps)),
            steps: steps.iter().map(|step| convert::step(step, run.capture)).collect(),
            approvals: approvals.iter().map(convert::approval).collect(),
        }))
    }

    async fn list_runs(&self, request: Request<pb::ListRunsRequest>) -> Result<Response<pb::ListRunsResponse>, Status> {
        let req = request.into_inner();
        let limit = match req.page_size {
            0 => 50,
            n => n.min(MAX_PAGE_RUNS),
        };
        let before = if req.page_token.is_empty() {
            None
        } else {
            Some(RunId::parse(&req.page_token, "page_token")?.to_string())
        };
        let filter = RunFilter {
            status: convert::run_status_filter(req.status)?,
            agent: (!req.agent.is_empty()).then_some(req.agent),
            labels: convert::label_filters(&req.labels)?,
            parent: match req.parent_run_id.trim() {
                "" => None,
                id => Some(RunId::parse(id, "parent_run_id")?),
            },
            forked_from: match req.forked_from_run_id.trim() {
                "" => None,
                id => Some(RunId::parse(id, "forked_from_run_id")?),
            },
            before,
            tool: Some(req.tool.trim().to_owned()).filter(|tool| !tool.is_empty()),
            created_from: req.created_after.as_ref().map(convert::millis_of),
            created_until: req.created_before.as_ref().map(convert::millis_of),
            limit: limit + 1,
        };
        let mut runs = self.0.store.reads.runs(filter).await?;
        let next_page_token = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(|r| r.id.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListRunsResponse {
            runs: runs.iter().map(convert::run).collect(),
            next_page_token,
        }))
    }

    async fn cancel_run(
        &self,
        request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        let req = request.into_inner();
        let reason = if req.reason.trim().is_empty() {
            "cancelled by request".to_owned()
        } else {
            req.reason
        };
        let run = self.end(&req.run_id, EndRun::Cancel { reason }).await?;
        Ok(Response::new(pb::CancelRunResponse {
            run: Some(convert::run(&run)),
        }))
    }

    async fn complete_run(
        &self,
        request: Request<pb::CompleteRunRequest>,
    ) -> Result<Response<pb::CompleteRunResponse>, Status> {
        let req = request.into_inner();
        let output = convert::canonical_json(&req.output_json, "output_json", "null")?;
        let run = self
            .end(
                &req.run_id,
                EndRun::Complete {
                    output,
                    settle_in_flight: false,
                },
            )
            .await?;
        Ok(Response::new(pb::CompleteRunResponse {
            run: Some(convert::run(&run)),
        }))
    }

    async fn fail_run(&self, request: Request<pb::FailRunRequest>) -> Result<Response<pb::FailRunResponse>, Status> {
        let req = request.into_inner();
        if req.reason.trim().is_empty() {
            return Err(KernelError::invalid("reason", "must say why the run failed").into());
        }
        let run = self.end(&req.run_id, EndRun::Fail { reason: req.reason }).await?;
        Ok(Response::new(pb::FailRunResponse {
            run: Some(convert::run(&run)),
        }))
    }

    async fn list_run_events(
        &self,
        request: Request<pb::ListRunEventsRequest>,
    ) -> Result<Response<pb::ListRunEventsResponse>, Status> {
        let req = request.into_inner();
        let id = RunId::parse(&req.run_id, "run_id")?;
        let run = self.load(&id).await?;
        let limit = match req.page_size {
            0 => 500,
            n => n.min(MAX_PAGE_EVENTS),
        };
        let from = req.from_seq.max(1);
        let events = self.0.store.reads.events(id, from, limit).await?;
        let next_seq = match events.last() {
            Some(last) if last.seq < run.last_seq => last.seq + 1,
            _ => 0,
        };
        Ok(Response::new(pb::ListRunEventsResponse {
            events: events.iter().map(|event| convert::event(event, run.capture)).collect(),
            next_seq,
        }))
    }

    type WatchRunEventsStream = WatchStream;

    async fn watch_run_events(
        &self,
        request: Request<pb::WatchRunEventsRequest>,
    ) -> Result<Response<Self::WatchRunEventsStream>, Status> {
        let req = request.into_inner();
        let id = RunId::parse(&req.run_id, "run_id")?;
        // Subscribe before reading, so every event after the read is also in the channel; the
        // seam is then de-duplicated by sequence number.
        let live = self.0.hub.subscribe(&id);
        let capture = self.load(&id).await?.capture;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let kernel = self.0.clone();
        let from = req.from_seq.max(1);
        tokio::spawn(watch(kernel, id, capture, from, req.include_progress, live, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type WatchSender = mpsc::Sender<Result<pb::WatchRunEventsResponse, Status>>;

/// Sends stored events from `next` on; returns the next sequence number wanted and whether the
/// run's terminal event went out.
async fn catch_up(
    kernel: &Kernel,
    id: &RunId,
    capture: Capture,
    mut next: u64,
    tx: &WatchSender,
) -> Result<(u64, bool), KernelError> {
    loop {
        let page = kernel.store.reads.events(id.clone(), next, 500).await?;
        let full = page.len() == 500;
        for event in page {
            next = event.seq + 1;
            let terminal = is_terminal_event(event.kind);
            let item = pb::watch_run_events_response::Item::Event(convert::event(&event, capture));
            if tx
                .send(Ok(pb::WatchRunEventsResponse { item: Some(item) }))
                .await
                .is_err()
            {
                return Ok((next, true));
            }
            if terminal {
                return Ok((next, true));
            }
        }
        if !full {
            return Ok((next, false));
        }
    }
}

async fn watch(
    kernel: Kernel,
    id: RunId,
    capture: Capture,
    from: u64,
    include_progress: bool,
    mut live: Subscription,
    tx: WatchSender,
) {
    let mut next = from;
    let mut need_catch_up = true;
    loop {
        if need_catch_up {
            match catch_up(&kernel, &id, capture, next, &tx).await {
                Ok((after, done)) => {
                    next = after;
                    if done {
                        return;
                    }
                }
                Err(error) => {
                    let _ = tx.send(Err(error.into())).await;
                    return;
                }
            }
            need_catch_up = false;
        }
        let signal = tokio::select! {
            _ = kernel.shutdown.cancelled() => {
                let _ = tx.send(Err(Status::unavailable("kernel shutting down"))).await;
                return;
            }
            _ = tx.closed() => return,
            signal = live.recv() => signal,
        };
        match signal {
            Ok(Signal::Events(events)) => {
                for event in events.iter().map(|item| &item.event) {
                    if event.seq < next {
                        continue;
                    }
                    if event.seq > next {
                        // Something between is only in the store: read it from there.
                        need_catch_up = true;
                        break;
                    }
                    next = event.seq + 1;
                    let item = pb::watch_run_events_response::Item::Event(convert::event(event, capture));
                    if tx
                        .send(Ok(pb::WatchRunEventsResponse { item: Some(item) }))
                        .await
                        .is_err()
                        || is_terminal_event(event.kind)
                    {
                        return;
                    }
                }
            }
            Ok(Signal::Progress(update)) => {
                if include_progress {
                    let item = pb::watch_run_events_response::Item::Progress(convert::progress(&update));
                    if tx
                        .send(Ok(pb::WatchRunEventsResponse { item: Some(item) }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => need_catch_up = true,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
