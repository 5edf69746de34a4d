//! `HostedService`: what a hosted run's handler does, from the worker holding the run's dispatch.
//!
//! Every request names that dispatch; the store checks it inside each write, so a handler that was
//! superseded (its worker lost, the run redispatched) or whose run ended records nothing. History
//! is read without a write: a stale handler may read it, which changes nothing.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use kernel_proto::v1 as pb;
use kernel_proto::v1::hosted_service_server::HostedService;
use tonic::{Request, Response, Status};

use super::{Kernel, convert, tool_calls};
use crate::auth::Scope;
use crate::error::KernelError;
use crate::limits::Limits;
use crate::machine::command::local_step;
use crate::machine::hosted;
use crate::machine::question::Asked;
use crate::model::{DispatchId, Effect, RunId, RunRecord, StepKey, StepKind, StepRecord};
use crate::store::{Fence, NewRun, PersonAsk, StepGate, StepRecorded, SubagentStart};

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
    let dispatch_id = DispatchId::parse(&dispatch.dispatch_id, "dispatch.dispatch_id")?;
    if dispatch.attempt == 0 {
        return Err(KernelError::invalid("dispatch.attempt", "must be at least 1"));
    }
    Ok((
        run,
        Fence {
            dispatch_id,
            attempt: dispatch.attempt,
        },
    ))
}

/// Refuses an operation of a hosted handler or tool body that does `what` unless the worker's key
/// (when the kernel has keys) also holds `scope`, beyond workers:connect.
fn needs(caller: Option<&crate::auth::Caller>, scope: Scope, what: &str) -> Result<(), KernelError> {
    match caller {
        Some(caller) if !caller.has(scope) => Err(KernelError::PermissionDenied(format!(
            "{what}: key '{}' needs the scope {scope}",
            caller.name()
        ))),
        _ => Ok(()),
    }
}

/// Checks a local step id against `[a-zA-Z0-9_.:-]{1,128}`.
pub(super) fn check_step_id(id: &str) -> Result<(), KernelError> {
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
    /// What the policy says of local step `step_id` of run `run_id`, now.
    async fn gate(&self, run_id: &RunId, step_id: &str, effect: Effect) -> Result<StepGate, KernelError> {
        let run = self.load_run(run_id).await?;
        Ok(match self.0.governance.step_gate(step_id, effect, &run) {
            Ok(decided_by) => StepGate::Allowed { decided_by },
            Err((reason, decided_by)) => StepGate::Denied { reason, decided_by },
        })
    }

    async fn load_run(&self, run_id: &RunId) -> Result<crate::model::RunRecord, KernelError> {
        self.0
            .store
            .reads
            .run(run_id.clone())
            .await?
            .ok_or_else(|| KernelError::NotFound(format!("run {run_id} not found")))
    }

    /// What a dispatch of the run's handler knows beyond its input: its parent, and its session's
    /// last completed run with that run's output.
    async fn context(&self, run: &RunRecord) -> Result<pb::RunContext, KernelError> {
        let previous = match &run.session_key {
            Some(session) => {
                self.0
                    .store
                    .reads
                    .previous_in_session(session.clone(), run.id.clone())
                    .await?
            }
            None => None,
        };
        Ok(pb::RunContext {
            parent_run_id: run.parent.as_ref().map(|(id, _)| id.to_string()).unwrap_or_default(),
            session_key: run.session_key.clone().unwrap_or_default(),
            previous_run_id: previous.as_ref().map(|r| r.id.to_string()).unwrap_or_default(),
            previous_output_json: previous.and_then(|r| r.output).unwrap_or_default(),
            // A branch or case run answers each live step before it runs, as a policy does.
            check_steps: self.0.governance.checks_steps() || crate::machine::branch::guarded(run),
        })
    }

    /// The run and its steps, read once; refused for a dispatch that does not hold the run (nor
    /// one of its calls), as a write would be.
    async fn holding(&self, run_id: &RunId, fence: &Fence) -> Result<(RunRecord, Vec<StepRecord>), KernelError> {
        let run = self.load_run(run_id).await?;
        let steps = self.0.store.reads.steps(run_id.clone()).await?;
        // A tool call's body waiting on its subagents runs under the call's own dispatch.
        let by_call = steps.iter().any(|s| {
            s.kind == StepKind::Tool && crate::machine::dispatch::held(s, &fence.dispatch_id, fence.attempt, None)
        });
        if !by_call {
            let dispatch = steps.iter().find(|s| s.key == StepKey::agent());
            hosted::check_fence(&run, dispatch, Some(fence))?;
        }
        Ok((run, steps))
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
        let (run, steps) = self.holding(&run_id, &fence).await?;
        let context = self.context(&run).await?;
        // The handler's order, its own dispatch left out (steps come sorted by place).
        let steps: Vec<StepRecord> = steps.into_iter().filter(|s| s.kind != StepKind::Agent).collect();
        let registry = self.0.registry.clone();
        let mut context = Some(context);
        let first = steps.is_empty().then(|| {
            Ok(pb::LoadHistoryResponse {
                context: context.take(),
                ..Default::default()
            })
        });
        let items = steps.into_iter().map(move |step| {
            // A tool whose definition changed since its call was recorded cannot be replayed: the
            // handler sends that turn to the kernel, which answers replay_input_changed.
            let tool_changed = step.kind == StepKind::Tool
                && registry
                    .get(&step.tool)
                    .is_none_or(|known| known.def.fingerprint != step.fingerprint);
            let result = (step.kind == StepKind::Tool && step.status.is_terminal())
                .then(|| convert::call_result(step.result(), step.position, true));
            Ok(pb::LoadHistoryResponse {
                step: Some(convert::history_step(&step)),
                tool_changed,
                result,
                context: context.take(),
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(
            first.into_iter().chain(items),
        ))))
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
        let items = tool_calls::submit(&self.0, turn, Some(fence))
            .await?
            .map(|item| item.map(|item| pb::CallToolsResponse { item: Some(item) }));
        Ok(Response::new(Box::pin(items)))
    }

    async fn record_step(
        &self,
        request: Request<pb::RecordStepRequest>,
    ) -> Result<Response<pb::RecordStepResponse>, Status> {
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        check_step_id(&req.step_id)?;
        let effect = effect(&req.effect)?;
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
        // Asked now for a step its handler did not check first; the write decides which word
        // stands (the check's, when there was one).
        let gate = match self.0.governance.checks_steps() {
            true => self.gate(&run_id, &req.step_id, effect).await?,
            false => StepGate::Unchecked,
        };
        let mut local = local_step::sent(req.seq, req.step_id, req.occurrence, (effect, req.once));
        local.outcome = outcome;
        let recorded = self.0.store.record_step((run_id, fence), local, gate).await?;
        let (step, replayed, diverged) = placed(recorded);
        let response = pb::RecordStepResponse {
            step,
            replayed,
            diverged,
        };
        Ok(Response::new(response))
    }

    async fn start_subagent(
        &self,
        request: Request<pb::StartSubagentRequest>,
    ) -> Result<Response<pb::StartSubagentResponse>, Status> {
        let caller = request.extensions().get::<crate::auth::Caller>().cloned();
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        // A child run is a new run: the worker's key needs runs:write as well.
        needs(caller.as_ref(), Scope::RunsWrite, "starting a subagent creates a run")?;
        let agent = req.agent.trim().to_owned();
        let known = self
            .0
            .registry
            .agent(&agent)
            .ok_or_else(|| KernelError::NotFound(format!("no worker offers or has offered agent '{agent}'")))?;
        let input = convert::canonical_json(&req.input_json, "input_json", "null")?;
        known.check_input(&input)?;
        let session_key = match req.session_key.trim() {
            "" => None,
            key if key.len() > MAX_SESSION_KEY => {
                return Err(KernelError::invalid("session_key", format!("longer than {MAX_SESSION_KEY} bytes")).into());
            }
            key => Some(key.to_owned()),
        };
        let parent = self
            .0
            .store
            .reads
            .run(run_id.clone())
            .await?
            .ok_or_else(|| KernelError::NotFound(format!("run {run_id} not found")))?;
        if session_key.is_some() && session_key == parent.session_key {
            return Err(KernelError::invalid(
                "session_key",
                "must differ from the parent run's own session (derive it from the parent's run id)",
            )
            .into());
        }
        // A subagent is charged to its parent's budget; the policy's budgets give it limits of
        // its own too, by its agent and labels.
        let budget = self.0.governance.budget(Vec::new(), &agent, &parent.labels);
        let child = NewRun {
            agent,
            input,
            labels: parent.labels.clone(),
            budget,
            idempotency_key: None,
            max_tool_calls: 0,
            interactive: parent.interactive,
            permissions: parent.permissions.clone(),
            granted_by: parent.granted_by.clone(),
            capture: parent.capture,
            hosted: Some(known.hosted()),
            parent: None,
            session_key,
            max_concurrency: parent.max_concurrency,
            fork: None,
            allow: Vec::new(),
            trace: Some(crate::traces::for_subagent(&run_id, parent.trace.as_ref())),
            home: None,
        };
        let start = SubagentStart {
            parent: run_id,
            fence,
            seq: req.seq,
            occurrence: req.occurrence,
            child,
        };
        // The child's dispatch is queued by the commit's effects.
        let (recorded, _) = self.0.store.start_subagent(start).await?;
        let (step, replayed, diverged) = placed(recorded);
        let response = pb::StartSubagentResponse {
            step,
            replayed,
            diverged,
        };
        Ok(Response::new(response))
    }

    async fn check_step(
        &self,
        request: Request<pb::CheckStepRequest>,
    ) -> Result<Response<pb::CheckStepResponse>, Status> {
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        check_step_id(&req.step_id)?;
        let effect = effect(&req.effect)?;
        let gate = self.gate(&run_id, &req.step_id, effect).await?;
        let local = local_step::sent(req.seq, req.step_id, req.occurrence, (effect, req.once));
        let checked = self.0.store.check_step((run_id, fence), local, gate).await?;
        let decided_by = match &checked {
            StepRecorded::Allowed { decided_by } => Some(decided_by.clone().unwrap_or_default()),
            _ => None,
        };
        let recorded = match &checked {
            StepRecorded::Recorded(step) | StepRecorded::Replayed(step) | StepRecorded::Blocked { step, .. } => {
                step.decided_by.clone()
            }
            _ => None,
        };
        let (step, _, diverged) = placed(checked);
        Ok(Response::new(pb::CheckStepResponse {
            allowed: decided_by.is_some(),
            decided_by: decided_by.or(recorded).unwrap_or_default(),
            step,
            diverged,
        }))
    }

    async fn ask_person(
        &self,
        request: Request<pb::AskPersonRequest>,
    ) -> Result<Response<pb::AskPersonResponse>, Status> {
        let caller = request.extensions().get::<crate::auth::Caller>().cloned();
        let req = request.into_inner();
        let (run, fence) = fence(req.dispatch)?;
        // A question blocks the run until a person answers: the worker's key writes runs.
        needs(caller.as_ref(), Scope::RunsWrite, "asking a person blocks the run")?;
        let asked = asked(
            req.question,
            (&req.answer_schema_json, req.choices, &req.default_answer_json),
            req.approvers,
            req.timeout_ms,
        )?;
        let ask = PersonAsk {
            run,
            fence: Some(fence),
            question_id: String::new(),
            seq: req.seq,
            occurrence: req.occurrence,
            asked,
        };
        let (step, replayed, diverged) = placed(self.0.store.ask_person(ask).await?);
        Ok(Response::new(pb::AskPersonResponse {
            step,
            replayed,
            diverged,
        }))
    }

    async fn call_tool(&self, request: Request<pb::CallToolRequest>) -> Result<Response<pb::CallToolResponse>, Status> {
        let key = request.extensions().get::<crate::auth::Caller>().cloned();
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        // A nested call is a call of the run, as an agent's turn makes: the worker's key calls tools.
        needs(
            key.as_ref(),
            Scope::ToolsCall,
            "a tool's body calling a tool makes a call of the run",
        )?;
        let call = req
            .call
            .ok_or_else(|| KernelError::invalid("call", "must name the tool to call and its arguments"))?;
        if !call.call_id.is_empty() {
            return Err(KernelError::invalid(
                "call.call_id",
                "a nested call's identity is its caller's and its place in the body; leave it empty",
            )
            .into());
        }
        let (_, steps) = self.holding(&run_id, &fence).await?;
        let caller = steps
            .into_iter()
            .find(|s| {
                s.kind == StepKind::Tool && crate::machine::dispatch::held(s, &fence.dispatch_id, fence.attempt, None)
            })
            .ok_or_else(|| {
                KernelError::FailedPrecondition(format!(
                    "dispatch {} (attempt {}) holds no running tool call of run {run_id}: only a running call's body \
                     calls a tool through CallTool (a handler calls with CallTools); nothing was called",
                    fence.dispatch_id, fence.attempt
                ))
            })?;
        let called = tool_calls::call_nested(&self.0, &caller, req.occurrence, call, fence).await?;
        Ok(Response::new(called))
    }

    async fn await_step(
        &self,
        request: Request<pb::AwaitStepRequest>,
    ) -> Result<Response<pb::AwaitStepResponse>, Status> {
        let req = request.into_inner();
        let (run_id, fence) = fence(req.dispatch)?;
        let key = StepKey::from_stored(req.step_key);
        // Subscribe before reading, so a settle between the read and the wait is seen.
        let mut live = self.0.hub.subscribe(&run_id);
        loop {
            let (_, steps) = self.holding(&run_id, &fence).await?;
            let step = steps
                .iter()
                .find(|s| s.key == key)
                .ok_or_else(|| KernelError::NotFound(format!("run {run_id} has no step {key}")))?;
            if step.status.is_terminal() {
                return Ok(Response::new(pb::AwaitStepResponse {
                    step: Some(convert::history_step(step)),
                    result: (step.kind == StepKind::Tool)
                        .then(|| convert::call_result(step.result(), step.position, false)),
                }));
            }
            // Any change of the run may be ours (or end the dispatch); a lag re-reads too.
            self.0.next_change(&mut live).await?;
        }
    }
}

/// The longest question a tool body may ask.
const MAX_QUESTION: usize = 4096;

/// A question as the machine takes it: its text (1 to [`MAX_QUESTION`] bytes), its answer's schema
/// (a JSON Schema that compiles, narrowed to the choices when there are some; empty accepts any
/// JSON), the default an expiry records (which must meet it), who may answer, and its timeout.
pub(super) fn asked(
    question: String,
    (schema, choices, default): (&str, Vec<String>, &str),
    approvers: Vec<String>,
    timeout_ms: u64,
) -> Result<Asked, KernelError> {
    let question = question.trim().to_owned();
    if question.is_empty() || question.len() > MAX_QUESTION {
        return Err(KernelError::invalid(
            "question",
            format!("must be 1 to {MAX_QUESTION} bytes, got {}", question.len()),
        ));
    }
    if let Some(blank) = choices.iter().position(|c| c.trim().is_empty()) {
        return Err(KernelError::invalid(format!("choices[{blank}]"), "must not be empty"));
    }
    let schema = convert::canonical_json(schema, "answer_schema_json", "{}")?;
    let schema = crate::machine::question::with_choices(serde_json::from_str(&schema).unwrap_or_default(), &choices);
    let validator = crate::validation::ArgsValidator::compile(&schema)
        .map_err(|e| KernelError::invalid("answer_schema_json", format!("is not a usable JSON Schema: {e}")))?;
    let default = match default.trim() {
        "" => None,
        text => {
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| KernelError::invalid("default_answer_json", format!("is not valid JSON: {e}")))?;
            validator.check_value(&value).map_err(|problems| {
                KernelError::invalid(
                    "default_answer_json",
                    format!("does not meet the question's schema: {problems}"),
                )
            })?;
            Some(kernel_proto::canonical::to_canonical(&value))
        }
    };
    if let Some(blank) = approvers.iter().position(|a| a.trim().is_empty()) {
        return Err(KernelError::invalid(format!("approvers[{blank}]"), "must not be empty"));
    }
    Ok(Asked {
        question,
        schema: kernel_proto::canonical::to_canonical(&schema),
        approvers,
        timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
        choices,
        default,
    })
}

/// What recording a step at its place did, as the responses say it: the step, whether it was
/// recorded before, and the divergence when its place holds another. (A divergence or a refusal
/// that ended the run has what it settled cancelled by the commit's effects.)
fn placed(recorded: StepRecorded) -> (Option<pb::Step>, bool, String) {
    match recorded {
        StepRecorded::Recorded(step) => (Some(convert::history_step(&step)), false, String::new()),
        StepRecorded::Replayed(step) => (Some(convert::history_step(&step)), true, String::new()),
        StepRecorded::Diverged { message, .. } => (None, false, message),
        StepRecorded::Allowed { .. } => (None, false, String::new()),
        StepRecorded::Blocked { step, .. } => (Some(convert::history_step(&step)), false, String::new()),
    }
}

/// A local step's declared effect, `write` when empty.
fn effect(text: &str) -> Result<Effect, KernelError> {
    match text.trim() {
        "" => Ok(Effect::Write),
        text => text
            .parse()
            .map_err(|_| KernelError::invalid("effect", format!("'{text}' is not read, pure or write"))),
    }
}

/// The longest session key accepted.
const MAX_SESSION_KEY: usize = 256;

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
