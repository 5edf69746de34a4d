//! `HostedService`: what a hosted run's handler does, from the worker holding the run's dispatch.
//!
//! Every request names that dispatch; the store checks it inside each write, so a handler that was
//! superseded (its worker lost, the run redispatched) or whose run ended records nothing. History
//! is read without a write: a stale handler may read it, which changes nothing.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use kernel_proto::v1 as pb;
use kernel_proto::v1::hosted_service_server::HostedService;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Kernel, convert, tool_calls};
use crate::error::KernelError;
use crate::limits::Limits;
use crate::machine::hosted;
use crate::model::{Effect, RunId, StepKey, StepKind};
use crate::store::{Fence, LocalStep, StepRecorded};

/// The longest local step id accepted.
const MAX_STEP_ID: usize = 128;

/// Implements `kernel.v1.HostedService`.
pub struct HostedApi(pub Kernel);

type HistoryStream = Pin<Box<dyn Stream<Item = Result<pb::LoadHistoryResponse, Status>> + Send>>;
type CallStream = Pin<Box<dyn Stream<Item = Result<pb::CallToolsResponse, Status>> + Send>>;

/// The run and the fence a request names, checked for shape (not yet against the store).
fn fence(dispatch: Option<pb::HostedDispatch>) -> Result<(RunId, Fence), KernelError> {
    let dispatch = dispatch.ok_or_else(|| KernelError::invalid("dispatch", "must name the run's dispatch"))?;
    let run = RunId::parse(&dispatch.run_id, "dispatch.run_id")?;
    if dispatch.dispatch_id.is_empty() {
        return Err(KernelError::invalid("dispatch.dispatch_id", "must not be empty"));
    }
    if dispatch.attempt == 0 {
        return Err(KernelError::invalid("dispatch.attempt", "must be at least 1"));
    }
    Ok((
        run,
        Fence {
            dispatch_id: dispatch.dispatch_id,
            attempt: dispatch.attempt,
        },
    ))
}

/// Checks a local step id against `[a-zA-Z0-9_.:-]{1,128}`.
fn check_step_id(id: &str) -> Result<(), KernelError> {
    if id.is_empty() || id.len() > MAX_STEP_ID {
        return Err(KernelError::invalid(
            "step_id",
            format!("must be 1 to {MAX_STEP_ID} characters"),
        ));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(KernelError::invalid(
            "step_id",
            format!("'{id}' has the character {bad:?}; allowed are a-z, A-Z, 0-9, _, -, . and :"),
        ));
    }
    Ok(())
}

impl HostedApi {
    /// Refuses a read from a dispatch that does not hold its run, as a write would be refused.
    async fn check_holds(&self, run_id: &RunId, fence: &Fence) -> Result<(), KernelError> {
        let run = self
            .0
            .store
            .reads
            .run(run_id.clone())
            .await?
            .ok_or_else(|| KernelError::NotFound(format!("run {run_id} not found")))?;
        let steps = self.0.store.reads.steps(run_id.clone()).await?;
        let dispatch = steps.iter().find(|s| s.key == StepKey::agent());
        hosted::check_fence(&run, dispatch, Some(fence))
    }
}

#[tonic::async_trait]
impl HostedService for HostedApi {
    type LoadHistoryStream = HistoryStream;
    type CallToolsStream = CallStream;

    async fn load_history(
        &self,
        request: Request<pb::LoadHistoryRequest>,
    ) -> Result<Response<Self::LoadHistoryStream>, Status> {
        let (run_id, fence) = fence(request.into_inner().dispatch)?;
        self.check_holds(&run_id, &fence).await?;
        let steps = self.0.store.reads.history(run_id).await?;
        let registry = self.0.registry.clone();
        let items = steps.into_iter().map(move |step| {
            // A tool whose definition changed since its call was recorded cannot be replayed: the
            // handler sends that turn to the kernel, which answers replay_input_changed.
            let tool_changed = step.kind == StepKind::Tool
                && registry
                    .get(&step.tool)
                    .is_none_or(|known| known.def.fingerprint != step.fingerprint);
            let result = (step.kind == StepKind::Tool && step.status.is_terminal())
                .then(|| convert::call_result(&step, step.position, true));
            Ok(pb::LoadHistoryResponse {
                step: Some(convert::history_step(&step)),
                tool_changed,
                result,
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }

    async fn call_tools(
        &self,
        request: Request<pb::CallToolsRequest>,
    ) -> Result<Response<Self::CallToolsStream>, Status> {
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        let turn = req
            .turn
            .ok_or_else(|| KernelError::invalid("turn", "must carry the turn's calls"))?;
        if turn.run_id.trim() != run_id.as_str() {
            return Err(KernelError::invalid("turn.run_id", format!("must be the dispatch's run {run_id}")).into());
        }
        let rx = tool_calls::submit(&self.0, turn, Some(fence)).await?;
        let items = ReceiverStream::new(rx).map(|item| item.map(|item| pb::CallToolsResponse { item: Some(item) }));
        Ok(Response::new(Box::pin(items)))
    }

    async fn record_step(
        &self,
        request: Request<pb::RecordStepRequest>,
    ) -> Result<Response<pb::RecordStepResponse>, Status> {
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        check_step_id(&req.step_id)?;
        let effect = match req.effect.trim() {
            "" => Effect::Write,
            text => text
                .parse()
                .map_err(|_| KernelError::invalid("effect", format!("'{text}' is not read, pure or write")))?,
        };
        let limits = &self.0.limits;
        let outcome = match req.outcome {
            Some(pb::record_step_request::Outcome::OutputJson(text)) => {
                Limits::check_bytes("output_json", text.len(), limits.max_result_bytes, "max-result-bytes")?;
                Ok(convert::canonical_json(&text, "output_json", "null")?)
            }
            Some(pb::record_step_request::Outcome::Error(failure)) => {
                Limits::check_bytes(
                    "error.message",
                    failure.message.len(),
                    limits.max_result_bytes,
                    "max-result-bytes",
                )?;
                Err(failure.message)
            }
            None => return Err(KernelError::invalid("outcome", "must be output_json or error").into()),
        };
        let local = LocalStep {
            seq: req.seq,
            step_id: req.step_id,
            occurrence: req.occurrence,
            effect,
            once: req.once,
            outcome,
        };
        let response = match self.0.store.record_step(run_id, fence, local).await? {
            StepRecorded::Recorded(step) => pb::RecordStepResponse {
                step: Some(convert::history_step(&step)),
                replayed: false,
                diverged: String::new(),
            },
            StepRecorded::Replayed(step) => pb::RecordStepResponse {
                step: Some(convert::history_step(&step)),
                replayed: true,
                diverged: String::new(),
            },
            StepRecorded::Diverged(message) => pb::RecordStepResponse {
                step: None,
                replayed: false,
                diverged: message,
            },
        };
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ids_follow_the_pattern() {
        assert!(check_step_id("fetch.page:2").is_ok());
        assert!(check_step_id("").is_err());
        assert!(check_step_id("has space").unwrap_err().to_string().contains("' '"));
        assert!(check_step_id(&"x".repeat(129)).is_err());
    }
}
