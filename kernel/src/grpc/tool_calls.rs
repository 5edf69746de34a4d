//! `ToolCallService`: an agent submits one turn; results come back in position order, progress
//! as it happens. The turn's calls are recorded first (one transaction), then dispatched by the
//! scheduler; this handler only waits for their `tool:result` events, so an agent that
//! disconnects loses nothing: the calls finish and a resubmission gets the recorded results.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;

use futures_util::Stream;
use kernel_proto::v1 as pb;
use kernel_proto::v1::tool_call_service_server::ToolCallService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Kernel, STREAM_BUFFER, convert};
use crate::error::KernelError;
use crate::hub::Signal;
use crate::model::{ApprovalRecord, ApprovalStatus, EventType, RunId, StepKey, StepRecord, cut};
use crate::store::{CallDisposition, CallGate, PlannedCall, TurnPlan};

/// The most calls one turn may carry.
const MAX_CALLS_PER_TURN: usize = 256;
/// The longest call id accepted.
const MAX_CALL_ID: usize = 128;
/// A requested tool name longer than this is malformed, not merely unknown.
const MAX_REQUESTED_NAME: usize = 1024;

/// Implements `kernel.v1.ToolCallService`.
pub struct ToolCallApi(pub Kernel);

type TurnStream = Pin<Box<dyn Stream<Item = Result<pb::SubmitTurnResponse, Status>> + Send>>;
type TurnSender = mpsc::Sender<Result<pb::SubmitTurnResponse, Status>>;

/// Validates a turn as a whole before anything is written, and decides each call's gate.
async fn plan(kernel: &Kernel, req: pb::SubmitTurnRequest) -> Result<TurnPlan, KernelError> {
    let run_id = RunId::parse(&req.run_id, "run_id")?;
    let run = kernel
        .store
        .reads
        .run(run_id.clone())
        .await?
        .ok_or_else(|| KernelError::NotFound(format!("run {run_id} not found")))?;
    if req.calls.is_empty() {
        return Err(KernelError::invalid("calls", "a turn needs at least one call"));
    }
    if req.calls.len() > MAX_CALLS_PER_TURN {
        return Err(KernelError::invalid(
            "calls",
            format!(
                "{} calls; a turn may carry at most {MAX_CALLS_PER_TURN}",
                req.calls.len()
            ),
        ));
    }
    let mut ids = HashSet::new();
    let mut calls = Vec::with_capacity(req.calls.len());
    for (position, call) in req.calls.into_iter().enumerate() {
        let field = format!("calls[{position}]");
        let name = call.tool.trim();
        if name.is_empty() {
            return Err(KernelError::invalid(format!("{field}.tool"), "must not be empty"));
        }
        if name.len() > MAX_REQUESTED_NAME || name.chars().any(char::is_control) {
            return Err(KernelError::invalid(
                format!("{field}.tool"),
                format!(
                    "'{}…' is not a tool name (control characters or over {MAX_REQUESTED_NAME} bytes)",
                    cut(name, 64).escape_default()
                ),
            ));
        }
        let arguments = convert::canonical_json(&call.arguments_json, &format!("{field}.arguments_json"), "{}")?;
        if !arguments.starts_with('{') {
            return Err(KernelError::invalid(
                format!("{field}.arguments_json"),
                "must be a JSON object",
            ));
        }
        let call_id = (!call.call_id.is_empty()).then_some(call.call_id);
        if let Some(id) = &call_id {
            if id.len() > MAX_CALL_ID || id.chars().any(char::is_control) {
                return Err(KernelError::invalid(
                    format!("{field}.call_id"),
                    format!("must be at most {MAX_CALL_ID} printable characters"),
                ));
            }
            if !ids.insert(id.clone()) {
                return Err(KernelError::invalid(
                    format!("{field}.call_id"),
                    format!("'{id}' is used twice in this turn"),
                ));
            }
        }
        let position = position as u32;
        let known = kernel.registry.get(name);
        if let Some(tool) = &known
            && !run.interactive
            && tool.def.options.requires_approval
        {
            return Err(KernelError::FailedPrecondition(format!(
                "calls[{position}]: run {run_id} is non-interactive and tool '{name}' is declared requires_approval; \
                 a non-interactive run cannot wait for a person"
            )));
        }
        let (gate, unit_cost) = match &known {
            Some(tool) => {
                let args: serde_json::Value = serde_json::from_str(&arguments).expect("canonical JSON parses");
                (
                    kernel.governance.gate(tool, &args, &run),
                    kernel.governance.unit_cost(&tool.def),
                )
            }
            None => (
                CallGate::Run {
                    decided_by: String::new(),
                },
                0.0,
            ),
        };
        calls.push(PlannedCall {
            position,
            key: StepKey::for_call(req.turn, position, call_id.as_deref()),
            call_id,
            tool_name: name.to_owned(),
            arguments,
            tool: known.map(|t| t.def),
            timeout_ms: (call.timeout_ms > 0).then_some(call.timeout_ms),
            gate,
            unit_cost,
        });
    }
    Ok(TurnPlan {
        run_id,
        turn: req.turn,
        calls,
        available_tools: kernel.registry.names(),
        default_timeout_ms: kernel.default_timeout_ms,
    })
}

#[tonic::async_trait]
impl ToolCallService for ToolCallApi {
    type SubmitTurnStream = TurnStream;

    async fn submit_turn(
        &self,
        request: Request<pb::SubmitTurnRequest>,
    ) -> Result<Response<Self::SubmitTurnStream>, Status> {
        let plan = plan(&self.0, request.into_inner()).await?;
        let run_id = plan.run_id.clone();
        let positions: Vec<u32> = plan.calls.iter().map(|c| c.position).collect();
        // Subscribe before recording, so no result can slip between the write and the wait.
        let live = self.0.hub.subscribe(&run_id);
        let dispositions = self.0.store.schedule_turn(plan).await?;
        for disposition in &dispositions {
            if let CallDisposition::Scheduled(step) = disposition {
                self.0.scheduler.enqueue(step.clone());
            }
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(stream_results(
            self.0.clone(),
            run_id,
            positions,
            dispositions,
            live,
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn diverged(step: &StepRecord, position: u32, message: &str) -> pb::CallResult {
    pb::CallResult {
        position,
        step_key: step.key.to_string(),
        tool: step.tool.clone(),
        status: pb::CallStatus::Error as i32,
        content: message.to_owned(),
        output_json: String::new(),
        error_kind: pb::ErrorKind::Fatal as i32,
        replayed: false,
        attempts: step.attempts,
    }
}

/// Results of one turn, released strictly in position order.
struct Ordered {
    results: Vec<Option<pb::CallResult>>,
    next: usize,
    waiting: HashMap<StepKey, usize>,
    positions: Vec<u32>,
}

impl Ordered {
    fn settle(&mut self, step: &StepRecord) {
        if let Some(index) = self.waiting.remove(&step.key) {
            self.results[index] = Some(convert::call_result(step, self.positions[index], false));
        }
    }

    async fn flush(&mut self, tx: &TurnSender) -> bool {
        while let Some(Some(result)) = self.results.get_mut(self.next).map(Option::take) {
            self.next += 1;
            let item = pb::submit_turn_response::Item::Result(result);
            if tx.send(Ok(pb::SubmitTurnResponse { item: Some(item) })).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Reports a pending approval of one of this turn's calls, once.
    async fn interrupt(&self, approval: &ApprovalRecord, told: &mut HashSet<String>, tx: &TurnSender) -> bool {
        let Some(index) = self.waiting.get(&approval.key) else {
            return true;
        };
        if !told.insert(approval.id.clone()) {
            return true;
        }
        let item = pb::submit_turn_response::Item::Interrupted(convert::interruption(approval, self.positions[*index]));
        tx.send(Ok(pb::SubmitTurnResponse { item: Some(item) })).await.is_ok()
    }

    fn done(&self) -> bool {
        self.next >= self.results.len()
    }
}

async fn stream_results(
    kernel: Kernel,
    run_id: RunId,
    positions: Vec<u32>,
    dispositions: Vec<CallDisposition>,
    mut live: broadcast::Receiver<Signal>,
    tx: TurnSender,
) {
    let mut ordered = Ordered {
        results: vec![None; dispositions.len()],
        next: 0,
        waiting: HashMap::new(),
        positions,
    };
    for (index, disposition) in dispositions.into_iter().enumerate() {
        let position = ordered.positions[index];
        ordered.results[index] = match disposition {
            CallDisposition::Replayed(step) => Some(convert::call_result(&step, position, true)),
            CallDisposition::Settled(step) => Some(convert::call_result(&step, position, false)),
            CallDisposition::Diverged { step, message } => Some(diverged(&step, position, &message)),
            CallDisposition::Joined(step) | CallDisposition::Scheduled(step) | CallDisposition::Gated(step) => {
                ordered.waiting.insert(step.key, index);
                None
            }
        };
    }
    // A resubmitted turn whose calls already wait for a person is told so at once; later questions
    // arrive as run:interrupted events.
    let mut told = HashSet::new();
    if let Ok(pending) = kernel
        .store
        .reads
        .approvals(ApprovalStatus::Pending, Some(run_id.clone()))
        .await
    {
        for approval in pending {
            if !ordered.interrupt(&approval, &mut told, &tx).await {
                return;
            }
        }
    }
    loop {
        if !ordered.flush(&tx).await || ordered.done() {
            return;
        }
        let signal = tokio::select! {
            _ = kernel.shutdown.cancelled() => {
                let _ = tx.send(Err(Status::unavailable("kernel shutting down; resubmit the turn to get its results"))).await;
                return;
            }
            _ = tx.closed() => return,
            signal = live.recv() => signal,
        };
        match signal {
            Ok(Signal::Event(event, Some(step)))
                if matches!(event.kind, EventType::ToolResult | EventType::ToolDenied) =>
            {
                ordered.settle(&step)
            }
            Ok(Signal::Event(event, Some(step))) if event.kind == EventType::RunInterrupted => {
                if ordered.waiting.contains_key(&step.key)
                    && let Ok(pending) = kernel
                        .store
                        .reads
                        .approvals(ApprovalStatus::Pending, Some(run_id.clone()))
                        .await
                {
                    for approval in pending {
                        if !ordered.interrupt(&approval, &mut told, &tx).await {
                            return;
                        }
                    }
                }
            }
            Ok(Signal::Event(..)) => {}
            Ok(Signal::Progress(update)) => {
                if ordered.waiting.contains_key(&update.key) {
                    let item = pb::submit_turn_response::Item::Progress(convert::progress(&update));
                    if tx.send(Ok(pb::SubmitTurnResponse { item: Some(item) })).await.is_err() {
                        return;
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Missed signals: the store knows which of our steps have settled.
                match kernel.store.reads.steps(run_id.clone()).await {
                    Ok(steps) => {
                        for step in steps.iter().filter(|s| s.status.is_terminal()) {
                            ordered.settle(step);
                        }
                    }
                    Err(error) => {
                        let _ = tx.send(Err(error.into())).await;
                        return;
                    }
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
