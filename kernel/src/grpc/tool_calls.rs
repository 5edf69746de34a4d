//! `ToolCallService`: an agent submits one turn; results come back in position order, progress
//! as it happens. The turn's calls are recorded first (one transaction), then dispatched by the
//! scheduler; this handler only waits for their `tool:result` events, so an agent that
//! disconnects loses nothing: the calls finish and a resubmission gets the recorded results.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kernel_proto::v1 as pb;
use kernel_proto::v1::tool_call_service_server::ToolCallService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::warn;

use super::{Kernel, STREAM_BUFFER, convert};
use crate::error::KernelError;
use crate::hub::{Signal, Subscription};
use crate::limits::{self, Limits};
use crate::model::{
    ApprovalId, ApprovalRecord, ApprovalStatus, Capture, EventType, RecordedResult, RunId, StepKey, StepRecord, cut,
};
use crate::registry::KnownTool;
use crate::scheduler::{ReserveCall, Written};
use crate::store::{CallDisposition, CallGate, Fence, PlannedCall, Served, StartDispatch, TurnPlan};

/// The longest call id accepted.
const MAX_CALL_ID: usize = 128;
/// A requested tool name longer than this is malformed, not merely unknown.
const MAX_REQUESTED_NAME: usize = 1024;

/// Implements `kernel.v1.ToolCallService`.
pub struct ToolCallApi(pub Kernel);

impl ToolCallApi {
    /// Step `key` of run `run` once it has settled, read again at each change of the run that
    /// `live` (subscribed before the step was written) signals.
    async fn settled(&self, run: &RunId, key: &StepKey, live: &mut Subscription) -> Result<StepRecord, KernelError> {
        loop {
            let steps = self.0.store.reads.steps(run.clone()).await?;
            let step = steps
                .into_iter()
                .find(|s| &s.key == key)
                .ok_or_else(|| KernelError::NotFound(format!("run {run} has no step {key}")))?;
            if step.status.is_terminal() {
                return Ok(step);
            }
            self.0.next_change(live).await?;
        }
    }
}

pub(super) type TurnStream = Pin<Box<dyn Stream<Item = Result<pb::SubmitTurnResponse, Status>> + Send>>;
type TurnSender = mpsc::Sender<Result<pb::SubmitTurnResponse, Status>>;

/// Where a call a tool's body makes through the kernel goes: under its caller, at the caller's
/// place in the run's order, as the body's `occurrence`-th call.
struct Nested {
    caller: StepKey,
    key: StepKey,
    position: u32,
}

impl Nested {
    fn under(caller: &StepRecord, occurrence: u32) -> Nested {
        Nested {
            caller: caller.key.clone(),
            key: StepKey::nested_call(&caller.key, occurrence),
            position: caller.position,
        }
    }
}

/// The `position`-th call of a turn as a request's field, `calls[3]`: written out only when an
/// error names it, not for every call of every turn.
#[derive(Clone, Copy)]
struct CallField(usize);

impl std::fmt::Display for CallField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "calls[{}]", self.0)
    }
}

/// Validates a turn as a whole before anything is written, and decides each call's gate; a turn
/// `nested` under a running call is that one call, made by the call's body. A turn every call of
/// which is recorded and settled is to be served from the log, as `T` (whole steps or results).
async fn plan<T: Served>(
    kernel: &Kernel,
    req: pb::SubmitTurnRequest,
    fence: Option<Fence>,
    nested: Option<Nested>,
) -> Result<Planned<T>, KernelError> {
    let run_id = RunId::parse(&req.run_id, "run_id")?;
    if req.calls.is_empty() {
        return Err(KernelError::invalid("calls", "a turn needs at least one call"));
    }
    let limits = &kernel.limits;
    if req.calls.len() > limits.max_calls_per_turn {
        return Err(limits::exceeded(
            "calls",
            format!("{} calls", req.calls.len()),
            format!("{} calls per turn", limits.max_calls_per_turn),
            "max-calls-per-turn",
        ));
    }
    if req.turn >= limits.max_turns_per_run {
        return Err(limits::exceeded(
            "turn",
            format!("turn {}", req.turn),
            format!(
                "{} turns per run (turns 0 to {})",
                limits.max_turns_per_run,
                limits.max_turns_per_run - 1
            ),
            "max-turns-per-run",
        ));
    }
    let offer = offered_tools(&req.offered_tools)?;
    let req_offer = req.offered_tools;
    let req_max_concurrency = req.max_concurrency;
    let mut ids = HashSet::new();
    let mut calls = Vec::with_capacity(req.calls.len());
    let mut checks = Vec::with_capacity(req.calls.len());
    for (position, call) in req.calls.into_iter().enumerate() {
        let field = CallField(position);
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
        Limits::check_bytes(
            format_args!("{field}.arguments_json"),
            call.arguments_json.len(),
            limits.max_argument_bytes,
            "max-argument-bytes",
        )?;
        let (mut args, arguments) =
            convert::canonical_value(&call.arguments_json, format_args!("{field}.arguments_json"), "{}")?;
        if !args.is_object() {
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
        let position = nested.as_ref().map_or(position as u32, |nested| nested.position);
        // A tool the model was not offered is unknown to this turn, registered or not.
        let not_offered = offer.as_ref().is_some_and(|offer| !offer.contains(name));
        let known = if not_offered { None } else { kernel.registry.get(name) };
        // Models fill optional fields with null, and typed tools reject it: a tool that asks has
        // them dropped before anything sees the arguments, the record and the replay identity included.
        let arguments = match &known {
            Some(tool) if tool.def.options.strip_nulls && strip_nulls(&mut args, &tool.def.input_schema) => {
                kernel_proto::canonical::to_canonical(&args)
            }
            _ => arguments,
        };
        let key = match &nested {
            Some(nested) => nested.key.clone(),
            None => StepKey::for_call(req.turn, position, call_id.as_deref()),
        };
        // Validation and policy see the values; the record, the replay identity and the
        // resources see their keyed hashes.
        let hidden = match &known {
            Some(tool) if !tool.secrets.is_empty() => hide(kernel, tool, &args, field)?,
            _ => None,
        };
        let recorded = hidden.as_ref().map_or(&args, |hidden| &hidden.recorded);
        let fingerprint = known.as_ref().map_or("", |tool| tool.def.fingerprint.as_str());
        let call_hash = kernel_proto::canonical::call_hash(name, fingerprint, recorded);
        let resources = known
            .as_ref()
            .map(|tool| crate::resources::resolve(&tool.def.options.resources, recorded))
            .unwrap_or_default();
        let (arguments, sealed) = match (&hidden, &kernel.secret_key) {
            (Some(hidden), Some(secret_key)) => (
                kernel_proto::canonical::to_canonical(&hidden.recorded),
                Some(hidden.seal(secret_key, (&run_id, &key))),
            ),
            _ => (arguments, None),
        };
        checks.push((known.clone(), args));
        calls.push(PlannedCall {
            position,
            key,
            call_id,
            tool_name: name.to_owned(),
            arguments,
            sealed,
            tool: known.map(|t| t.def.clone()),
            not_offered,
            timeout_ms: (call.timeout_ms > 0).then_some(call.timeout_ms),
            // Decided by `decide` once the turn is known not to be a pure replay.
            gate: CallGate::Run {
                decided_by: String::new(),
            },
            unit_cost: 0.0,
            resources,
            call_hash,
            start: None,
        });
    }
    // One read for the run and for whether the turn is recorded already (then it is replayed).
    let identities = calls.iter().map(|c| (c.key.clone(), c.call_hash.clone())).collect();
    let (run, replayable) = kernel.store.reads.turn(run_id.clone(), identities).await?;
    let run = run.ok_or_else(|| KernelError::NotFound(format!("run {run_id} not found")))?;
    // A fact about the offer; whether the run may make it is the write's (`turn::admit`).
    let offers_approval_tool = req_offer
        .iter()
        .enumerate()
        .find(|(_, name)| {
            kernel
                .registry
                .get(name)
                .is_some_and(|tool| tool.def.options.requires_approval)
        })
        .map(|(index, name)| (index, name.clone()));
    // Listed only for a turn with an unknown call: the offer, or what connected workers offer now.
    let available_tools = match (&offer, calls.iter().any(|c| c.tool.is_none())) {
        (_, false) => Vec::new(),
        (Some(offer), true) => {
            let mut names: Vec<String> = offer.iter().cloned().collect();
            names.sort();
            names
        }
        (None, true) => kernel.registry.offered_names(),
    };
    let plan = TurnPlan {
        run_id,
        turn: req.turn,
        calls,
        available_tools,
        default_timeout_ms: kernel.default_timeout_ms,
        max_pending_calls: kernel.limits.max_pending_calls_per_run,
        max_events: kernel.limits.max_events_per_run,
        fence,
        // The turn's own bound, else the run's default; a nested call runs within its caller's.
        max_concurrency: [req_max_concurrency, run.max_concurrency]
            .into_iter()
            .find(|n| *n > 0)
            .filter(|_| nested.is_none()),
        caller: nested.map(|nested| nested.caller),
        offers_approval_tool,
        share: kernel.governance.policy().share_of(&run.labels),
    };
    Ok(Planned {
        plan,
        checks,
        run,
        replayable,
    })
}

/// The arguments of a call of `tool` with its secret values taken out; `None` when it holds none.
/// A kernel without a secret key refuses such a call, recording nothing: it would have to write
/// the values in clear.
fn hide(
    kernel: &Kernel,
    tool: &KnownTool,
    args: &serde_json::Value,
    field: CallField,
) -> Result<Option<crate::secrets::Hidden>, KernelError> {
    let Some(secret_key) = &kernel.secret_key else {
        return match tool.secrets.present_in(args) {
            true => Err(KernelError::FailedPrecondition(format!(
                "{field}: tool '{}' has secret fields ({}) and this kernel has no secret key to keep them with: \
                 start it with --secret-key FILE; nothing was recorded",
                tool.def.name,
                tool.secrets.names().join(", ")
            ))),
            false => Ok(None),
        };
    };
    Ok(crate::secrets::hide(args, &tool.secrets, secret_key))
}

/// Drops the null-valued fields of `args` that `schema` does not require; whether any went.
fn strip_nulls(args: &mut serde_json::Value, schema: &serde_json::Value) -> bool {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    let Some(fields) = args.as_object_mut() else {
        return false;
    };
    let before = fields.len();
    fields.retain(|name, value| !value.is_null() || required.contains(&name.as_str()));
    fields.len() != before
}

/// The most tools a turn may say the model was offered.
const MAX_OFFERED_TOOLS: usize = 1024;

/// The tools the model was offered for a turn, checked; `None` when the turn names none.
fn offered_tools(names: &[String]) -> Result<Option<HashSet<String>>, KernelError> {
    if names.is_empty() {
        return Ok(None);
    }
    if names.len() > MAX_OFFERED_TOOLS {
        return Err(KernelError::invalid(
            "offered_tools",
            format!("{} tools; at most {MAX_OFFERED_TOOLS}", names.len()),
        ));
    }
    let mut offer = HashSet::with_capacity(names.len());
    for (index, name) in names.iter().enumerate() {
        crate::model::validate_tool_name(name)
            .map_err(|message| KernelError::invalid(format!("offered_tools[{index}]"), message))?;
        offer.insert(name.clone());
    }
    Ok(Some(offer))
}

/// Records a new turn and sets its calls going. Calls ready to run get a worker slot reserved
/// before the write, so their `tool:start` is in the same commit as their `tool:scheduled` (one
/// commit fewer per call); the others are queued as they are recorded.
async fn schedule(kernel: &Kernel, mut plan: TurnPlan) -> Result<Vec<CallDisposition>, KernelError> {
    // A turn of a run another replica owns is recorded there, and its calls queued there: no
    // slot here is reserved for them.
    let owned = kernel.store.owns(&plan.run_id);
    let runnable: Vec<usize> = (0..plan.calls.len())
        .filter(|_| owned)
        .filter(|&i| plan.calls[i].tool.is_some() && matches!(plan.calls[i].gate, CallGate::Run { .. }))
        .collect();
    let wanted = runnable
        .iter()
        .map(|&i| ReserveCall {
            key: plan.calls[i].key.clone(),
            tool: plan.calls[i].tool_name.clone(),
            locks: crate::resources::locks(&plan.calls[i].resources).cloned().collect(),
        })
        .collect();
    let reservations = if runnable.is_empty() {
        Vec::new()
    } else {
        let turn = (plan.turn, plan.max_concurrency);
        kernel.scheduler.reserve(plan.run_id.clone(), turn, wanted).await
    };
    let mut reserved = Vec::new();
    for (&i, reservation) in runnable.iter().zip(reservations) {
        if let Some(reservation) = reservation {
            plan.calls[i].start = Some(reservation.start.clone());
            reserved.push(reservation);
        }
    }
    let written = if reserved.is_empty() {
        kernel.store.record_turn(plan).await
    } else {
        let early = kernel.scheduler.dispatch_early(&reserved);
        kernel.store.record_turn_dispatching(plan, early).await
    };
    let mut outcome: Vec<(StartDispatch, Option<StepRecord>)> = reserved.into_iter().map(|r| (r.start, None)).collect();
    // What the write left to do (queue the calls it scheduled, cancel what an ending run
    // settled) the store handed out with the commit; here only the reserved slots are settled.
    if let Ok(recorded) = &written {
        for disposition in &recorded.calls {
            if let CallDisposition::Started(step) | CallDisposition::Scheduled(step) = disposition
                && let Some(slot) = outcome.iter_mut().find(|(s, _)| s.key == step.key)
            {
                slot.1 = Some(step.clone());
            }
        }
    }
    let how = match &written {
        Ok(_) => Written::Committed,
        Err(KernelError::Unavailable(_)) => Written::Unknown,
        Err(_) => Written::Failed,
    };
    kernel.scheduler.reserved(outcome, how);
    let recorded = written?;
    match recorded.unresumable {
        Some(reason) => Err(KernelError::FailedPrecondition(reason)),
        None => Ok(recorded.calls),
    }
}

/// A validated turn, with what its calls still have to pass before they may be recorded.
struct Planned<T> {
    plan: TurnPlan,
    /// Per call: the registered tool (if any) and the parsed arguments.
    checks: Vec<(Option<Arc<KnownTool>>, serde_json::Value)>,
    run: crate::model::RunRecord,
    /// Set when every call of the turn is recorded and settled: the turn is served from the log.
    replayable: Option<Vec<T>>,
}

/// Decides each call's gate (argument validation, policy, approval) and price. Skipped for a turn
/// that only replays recorded results.
async fn decide<T>(kernel: &Kernel, planned: Planned<T>) -> Result<TurnPlan, KernelError> {
    let Planned {
        mut plan, checks, run, ..
    } = planned;
    let answers = ask_workers(kernel, &checks).await;
    for ((call, (known, args)), asked) in plan.calls.iter_mut().zip(checks).zip(answers) {
        if let Some(tool) = known {
            call.gate = kernel.governance.gate(&tool, &args, &call.resources, &run, asked);
            call.unit_cost = kernel.governance.unit_cost(&tool.def);
            // A refusal the model reads may quote the arguments (a schema error names the value).
            if call.sealed.is_some() {
                call.gate = scrubbed(call.gate.clone(), &tool.secrets, &args);
            }
        }
    }
    Ok(plan)
}

/// `gate` with each secret value of `args` cut out of the message it records.
fn scrubbed(gate: CallGate, fields: &crate::secrets::SecretFields, args: &serde_json::Value) -> CallGate {
    match gate {
        CallGate::Refuse {
            message,
            reason,
            outcome,
        } => CallGate::Refuse {
            message: fields.scrub(&message, args),
            reason,
            outcome,
        },
        CallGate::Deny { message, decided_by } => CallGate::Deny {
            message: fields.scrub(&message, args),
            decided_by,
        },
        gate => gate,
    }
}

/// How long a worker may take to evaluate a tool's approval predicate before the call is asked
/// about anyway.
const ASK_WORKER_TIMEOUT: Duration = Duration::from_secs(5);

/// Per call: the answer of the tool's approval predicate where it is code in the worker (asked of
/// a worker offering the tool, all calls at once); `None` where the tool has none, or the call's
/// arguments fail its schema (it is refused before any predicate). A predicate that raised, a
/// worker that did not answer in time, or none connected: `Some(true)`, the call is asked about.
async fn ask_workers(kernel: &Kernel, checks: &[(Option<Arc<KnownTool>>, serde_json::Value)]) -> Vec<Option<bool>> {
    let asking = checks.iter().map(|(known, args)| async move {
        let tool = known.as_ref().filter(|t| t.def.options.approval_predicate_in_worker)?;
        if tool
            .validator
            .as_ref()
            .is_some_and(|v| v.check(&tool.def.name, args).is_err())
        {
            return None;
        }
        let asked = kernel.scheduler.ask_approval(tool.def.name.clone(), args.to_string());
        let answer = match tokio::time::timeout(ASK_WORKER_TIMEOUT, asked).await {
            Ok(Ok(required)) => required,
            Ok(Err(why)) => {
                warn!(
                    tool = tool.def.name,
                    why, "no answer from the tool's approval predicate; the call is asked about"
                );
                true
            }
            Err(_) => {
                warn!(
                    tool = tool.def.name,
                    timeout_ms = ASK_WORKER_TIMEOUT.as_millis() as u64,
                    "the tool's approval predicate did not answer in time; the call is asked about"
                );
                true
            }
        };
        Some(answer)
    });
    futures_util::future::join_all(asking).await
}

#[tonic::async_trait]
impl ToolCallService for ToolCallApi {
    type SubmitTurnStream = TurnStream;

    async fn submit_turn(
        &self,
        request: Request<pb::SubmitTurnRequest>,
    ) -> Result<Response<Self::SubmitTurnStream>, Status> {
        Ok(Response::new(submit(&self.0, request.into_inner(), None).await?))
    }

    async fn call_turn(&self, request: Request<pb::CallTurnRequest>) -> Result<Response<pb::CallTurnResponse>, Status> {
        let turn = request
            .into_inner()
            .turn
            .ok_or_else(|| KernelError::invalid("turn", "must carry the turn's calls"))?;
        let mut items = submit(&self.0, turn, None).await?;
        let mut response = pb::CallTurnResponse::default();
        let mut progress = VecDeque::new();
        while let Some(item) = items.next().await {
            match item?.item {
                Some(pb::submit_turn_response::Item::Result(result)) => response.results.push(result),
                Some(pb::submit_turn_response::Item::Progress(report)) => {
                    if progress.len() == CALL_TURN_PROGRESS_KEPT {
                        progress.pop_front();
                    }
                    progress.push_back(report);
                }
                Some(pb::submit_turn_response::Item::Interrupted(interruption)) => {
                    response.interruptions.push(interruption)
                }
                None => {}
            }
        }
        response.progress = progress.into();
        Ok(Response::new(response))
    }

    async fn ask_person(
        &self,
        request: Request<pb::AgentAskRequest>,
    ) -> Result<Response<pb::AgentAskResponse>, Status> {
        let req = request.into_inner();
        let run_id = RunId::parse(&req.run_id, "run_id")?;
        let id = req.question_id.trim();
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        if id.is_empty() || id.len() > 128 || !id.chars().all(valid) {
            return Err(KernelError::invalid("question_id", "must be 1 to 128 of A-Z a-z 0-9 _ . -").into());
        }
        let asked = super::hosted::asked(
            req.question,
            (&req.answer_schema_json, req.choices, &req.default_answer_json),
            req.approvers,
            req.timeout_ms,
        )?;
        let ask = crate::machine::command::ask_person::PersonAsk {
            run: run_id.clone(),
            fence: None,
            question_id: id.to_owned(),
            seq: 0,
            occurrence: 0,
            asked,
        };
        // Subscribe before writing, so an answer between the write and the wait is seen.
        let mut live = self.0.hub.subscribe(&run_id);
        let (step, replayed) = match self.0.store.ask_person(ask).await? {
            crate::store::StepRecorded::Recorded(step) => (step, false),
            crate::store::StepRecorded::Replayed(step) => (step, true),
            other => return Err(KernelError::Store(format!("an agent's question recorded as {other:?}")).into()),
        };
        let settled = self.settled(&run_id, &step.key, &mut live).await?;
        // The agent that asked gets its answer whatever the run's capture, as a turn's results.
        Ok(Response::new(pb::AgentAskResponse {
            step: Some(convert::history_step(&settled)),
            replayed,
        }))
    }

    async fn cancel_call(
        &self,
        request: Request<pb::CancelCallRequest>,
    ) -> Result<Response<pb::CancelCallResponse>, Status> {
        let req = request.into_inner();
        let run_id = RunId::parse(&req.run_id, "run_id")?;
        if req.step_key.trim().is_empty() {
            return Err(
                KernelError::invalid("step_key", "must name the call (t<turn>/p<position> or id:<call id>)").into(),
            );
        }
        let key = StepKey::from_stored(req.step_key);
        let reason = if req.reason.trim().is_empty() {
            "cancelled by request".to_owned()
        } else {
            req.reason
        };
        let kernel = &self.0;
        // Cancelled on its worker by the commit's effect.
        let step = kernel.store.cancel_call(run_id.clone(), key, reason).await?;
        tracing::info!(run_id = %run_id, step_key = %step.key, tool = %step.tool, "call cancelled");
        let capture = kernel
            .store
            .reads
            .run(run_id)
            .await?
            .map_or(Capture::None, |run| run.capture);
        Ok(Response::new(pb::CancelCallResponse {
            step: Some(convert::step(&step, capture)),
        }))
    }
}

/// Records a turn (or serves it from the log) and streams its results: for an agent's
/// SubmitTurn, and for a hosted handler's calls under `fence`, the dispatch of its run.
pub(super) async fn submit(
    kernel: &Kernel,
    request: pb::SubmitTurnRequest,
    fence: Option<Fence>,
) -> Result<TurnStream, KernelError> {
    let mut planned = plan::<RecordedResult>(kernel, request, fence, None).await?;
    let run_id = planned.plan.run_id.clone();
    let positions: Vec<u32> = planned.plan.calls.iter().map(|c| c.position).collect();
    if let Some(results) = served(kernel, &mut planned) {
        // Every result is known: the stream yields them as fast as it is read, with no task
        // or channel between, and the transport encodes as many as are ready into one write.
        let items = results.into_iter().zip(positions).map(|(result, position)| {
            let result = convert::call_result(result, position, true);
            Ok(pb::SubmitTurnResponse {
                item: Some(pb::submit_turn_response::Item::Result(result)),
            })
        });
        return Ok(Box::pin(tokio_stream::iter(items)));
    }
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    // Subscribe before recording, so no result can slip between the write and the wait.
    let live = kernel.hub.subscribe(&run_id);
    let dispositions = record(kernel, planned).await?;
    tokio::spawn(stream_results(
        kernel.clone(),
        run_id,
        positions,
        dispositions,
        live,
        tx,
    ));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// What a turn whose every call settled already is served from the log, taken from `planned`;
/// `None` for a turn to record. The results are durable, so only the replay counter is written,
/// without waiting for it.
fn served<T: Served>(kernel: &Kernel, planned: &mut Planned<T>) -> Option<Vec<T>> {
    let served = planned.replayable.take()?;
    kernel.store.note_replays(
        planned.plan.run_id.clone(),
        served.iter().map(|call| call.identity().0.clone()).collect(),
    );
    Some(served)
}

/// Records a planned turn that is not served from the log ([`served`]).
async fn record<T>(kernel: &Kernel, planned: Planned<T>) -> Result<Vec<CallDisposition>, KernelError> {
    // A hosted handler's calls (and a running body's) are its run's, already dispatched: they
    // are recorded while the kernel drains (and run once it is back); an agent's new turn is
    // refused.
    if planned.plan.fence.is_none() {
        kernel.taking_work("resubmit the turn")?;
    }
    let plan = decide(kernel, planned).await?;
    // Runs to the end even if the agent goes away meanwhile: slots reserved for the turn must
    // come back to the scheduler whatever happens.
    let kernel = kernel.clone();
    tokio::spawn(async move { schedule(&kernel, plan).await })
        .await
        .map_err(|e| KernelError::Store(format!("scheduling the turn failed: {e}")))?
}

/// Records the call `caller`'s body makes as its `occurrence`-th through the kernel, or finds
/// the one recorded at that identity; with its result once it has settled.
pub(super) async fn call_nested(
    kernel: &Kernel,
    caller: &StepRecord,
    occurrence: u32,
    call: pb::ToolCall,
    fence: Fence,
) -> Result<pb::CallToolResponse, KernelError> {
    let request = pb::SubmitTurnRequest {
        run_id: caller.run_id.to_string(),
        turn: caller.turn,
        calls: vec![call],
        offered_tools: Vec::new(),
        max_concurrency: 0,
    };
    let nested = Nested::under(caller, occurrence);
    let position = nested.position;
    let mut planned = plan::<StepRecord>(kernel, request, Some(fence), Some(nested))
        .await
        .map_err(|error| error.renamed("calls[0]", "call"))?;
    let disposition = match served(kernel, &mut planned) {
        Some(steps) => steps.into_iter().map(CallDisposition::Replayed).next(),
        None => record(kernel, planned).await?.into_iter().next(),
    };
    let Some(disposition) = disposition else {
        return Err(KernelError::Store("recording a nested call gave no disposition".into()));
    };
    let (step, result) = match disposition {
        CallDisposition::Diverged { step, message } => {
            let result = diverged(&step, position, &message);
            (step, Some(result))
        }
        CallDisposition::Replayed(step) => {
            let result = convert::call_result(step.result(), position, true);
            (step, Some(result))
        }
        CallDisposition::Settled(step)
        | CallDisposition::Joined(step)
        | CallDisposition::Scheduled(step)
        | CallDisposition::Started(step)
        | CallDisposition::Gated(step) => {
            let result = step
                .status
                .is_terminal()
                .then(|| convert::call_result(step.result(), position, false));
            (step, result)
        }
    };
    Ok(pb::CallToolResponse {
        step: Some(convert::history_step(&step)),
        result,
    })
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
        outcome: pb::CallOutcome::ReplayInputChanged as i32,
        decided_by: String::new(),
        approval: None,
    }
}

/// How many progress reports a `CallTurn` answer keeps, the latest: a long tool reports up to
/// `progress_per_second` a second, which a stream hands on as they come but one answer would
/// have to hold.
const CALL_TURN_PROGRESS_KEPT: usize = 1000;

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
            self.results[index] = Some(convert::call_result(step.result(), self.positions[index], false));
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

    /// Reports a pending approval of one of this turn's calls (or a question one asked), once.
    async fn interrupt(&self, approval: &ApprovalRecord, told: &mut HashSet<ApprovalId>, tx: &TurnSender) -> bool {
        let call = approval.key.asking_call();
        let Some(index) = self.waiting.get(call.as_ref().unwrap_or(&approval.key)) else {
            return true;
        };
        if !told.insert(approval.id.clone()) {
            return true;
        }
        let item = pb::submit_turn_response::Item::Interrupted(convert::interruption(approval, self.positions[*index]));
        tx.send(Ok(pb::SubmitTurnResponse { item: Some(item) })).await.is_ok()
    }

    /// Reports each pending approval of this turn's calls not reported yet; `false` once the agent
    /// has gone. A failed read reports nothing now: the next `run:interrupted` tries again.
    async fn interrupt_pending(
        &self,
        kernel: &Kernel,
        run_id: &RunId,
        told: &mut HashSet<ApprovalId>,
        tx: &TurnSender,
    ) -> bool {
        let pending = match kernel
            .store
            .reads
            .approvals(ApprovalStatus::Pending, Some(run_id.clone()))
            .await
        {
            Ok(pending) => pending,
            Err(error) => {
                // The question also reaches the agent as the run's next run:interrupted event.
                warn!(run_id = %run_id, %error, "cannot read the run's pending approvals");
                return true;
            }
        };
        for approval in pending {
            if !self.interrupt(&approval, told, tx).await {
                return false;
            }
        }
        true
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
    mut live: Subscription,
    tx: TurnSender,
) {
    let mut ordered = Ordered {
        results: vec![None; dispositions.len()],
        next: 0,
        waiting: HashMap::new(),
        positions,
    };
    // Only a joined call may have a question this stream has not seen as an event: its approval,
    // or one its body asked while it runs.
    let parked = dispositions
        .iter()
        .any(|d| matches!(d, CallDisposition::Joined(step) if !step.status.is_terminal()));
    for (index, disposition) in dispositions.into_iter().enumerate() {
        let position = ordered.positions[index];
        ordered.results[index] = match disposition {
            CallDisposition::Replayed(step) => Some(convert::call_result(step.result(), position, true)),
            CallDisposition::Settled(step) => Some(convert::call_result(step.result(), position, false)),
            CallDisposition::Diverged { step, message } => Some(diverged(&step, position, &message)),
            CallDisposition::Joined(step)
            | CallDisposition::Scheduled(step)
            | CallDisposition::Started(step)
            | CallDisposition::Gated(step) => {
                ordered.waiting.insert(step.key, index);
                None
            }
        };
    }
    // A resubmitted turn whose calls already wait for a person is told so at once; later questions
    // arrive as run:interrupted events.
    let mut told = HashSet::new();
    if parked && !ordered.interrupt_pending(&kernel, &run_id, &mut told, &tx).await {
        return;
    }
    // Among replicas another replica may write the results, and they arrive through its commit
    // notice; a notice lost with a connection, or a run whose shard moved between two replicas'
    // notices, costs at most this long: the store is asked again whenever nothing came for it.
    let recheck = kernel
        .scheduler
        .config()
        .replicated
        .then(|| kernel.scheduler.config().lease_ttl);
    loop {
        if !ordered.flush(&tx).await || ordered.done() {
            return;
        }
        // Results already published go out before a shutdown ends the stream: a drain waits for
        // the calls to settle, then shuts down, and their turns must still get them.
        let signal = tokio::select! {
            biased;
            signal = live.recv() => signal,
            _ = kernel.shutdown.cancelled() => {
                let _ = tx.send(Err(Status::unavailable("kernel shutting down; resubmit the turn to get its results"))).await;
                return;
            }
            _ = tx.closed() => return,
            () = tokio::time::sleep(recheck.unwrap_or_default()), if recheck.is_some() => {
                Err(broadcast::error::RecvError::Lagged(0))
            }
        };
        match signal {
            Ok(Signal::Events(events)) => {
                let mut asked = false;
                for item in events.iter() {
                    let Some(step) = &item.step else { continue };
                    match item.event.kind {
                        EventType::ToolResult | EventType::ToolDenied => ordered.settle(step),
                        EventType::RunInterrupted => {
                            let call = step.key.asking_call();
                            asked |= ordered.waiting.contains_key(call.as_ref().unwrap_or(&step.key));
                        }
                        _ => {}
                    }
                }
                if asked && !ordered.interrupt_pending(&kernel, &run_id, &mut told, &tx).await {
                    return;
                }
            }
            Ok(Signal::Progress(update)) => {
                if ordered.waiting.contains_key(&update.key) {
                    let item = pb::submit_turn_response::Item::Progress(convert::progress(&update));
                    if tx.send(Ok(pb::SubmitTurnResponse { item: Some(item) })).await.is_err() {
                        return;
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Missed signals (or, among replicas, none for a while): the store knows which of
                // our steps have settled.
                let keys = ordered.waiting.keys().cloned().collect();
                match kernel.store.reads.steps_at(run_id.clone(), keys).await {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::strip_nulls;

    #[test]
    fn nulls_of_optional_fields_go_and_required_ones_stay() {
        let schema = json!({"type": "object", "required": ["key"]});
        let mut args = json!({"key": null, "value": null, "ttl_ms": 5, "note": null});
        assert!(strip_nulls(&mut args, &schema));
        assert_eq!(args, json!({"key": null, "ttl_ms": 5}));
        assert!(!strip_nulls(&mut args, &schema), "nothing more to drop");
    }
}
