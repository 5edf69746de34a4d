//! The context of one dispatch of a hosted run's handler: its operations, each at its place in
//! the handler's order, answered from the run's recorded history when the place is recorded and
//! sent to the kernel (fenced by the dispatch) when it is not.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use kernel_proto::canonical::{idempotency_key, local_step_key, to_canonical};
use kernel_proto::v1 as pb;
use kernel_proto::v1::hosted_service_client::HostedServiceClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::StepEffect;
use super::wire;
use crate::agent::outcome::Outcome;
use crate::agent::{AgentError, Call, CallOutcome};
use crate::auth::ApiKey;

/// The dispatch of a hosted run a handler runs under: every operation names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostedDispatch {
    pub(crate) run_id: String,
    pub(crate) dispatch_id: String,
    pub(crate) attempt: u32,
}

/// What a local step's closure gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepInfo {
    /// The step's id, as the handler named it.
    pub id: String,
    /// How many steps with this id ran before this one in the run.
    pub occurrence: u32,
    /// Stable across every rerun of this step (after a crash it runs again): deduplicate a
    /// `write` step's effect with it.
    pub idempotency_key: String,
}

/// What the handler's order recorded, by place.
#[derive(Debug, Default)]
struct History {
    places: HashMap<u32, Vec<pb::LoadHistoryResponse>>,
    /// Where each recorded step identity sits.
    keys: HashMap<String, u32>,
}

/// The handler's place counter, the occurrences of its step ids, and whether it diverged.
#[derive(Debug, Default)]
struct Order {
    next: u32,
    occurrences: HashMap<String, u32>,
    diverged: Option<String>,
}

struct Inner {
    dispatch: HostedDispatch,
    client: HostedServiceClient<Channel>,
    api_key: Option<ApiKey>,
    history: History,
    order: Mutex<Order>,
    cancellation: CancellationToken,
}

/// What a hosted handler does its work through; cheap to clone (clones share the order).
///
/// Each operation takes the next place in the handler's order when it is called (not when it is
/// awaited), so operations joined together keep the order they were called in.
#[derive(Clone)]
pub struct AgentContext {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext")
            .field("run_id", &self.inner.dispatch.run_id)
            .field("attempt", &self.inner.dispatch.attempt)
            .finish()
    }
}

impl AgentContext {
    pub(crate) fn new(
        dispatch: HostedDispatch,
        client: HostedServiceClient<Channel>,
        api_key: Option<ApiKey>,
        recorded: Vec<pb::LoadHistoryResponse>,
        cancellation: CancellationToken,
    ) -> Self {
        let mut history = History::default();
        for entry in recorded {
            if let Some(step) = &entry.step {
                history.keys.insert(step.step_key.clone(), step.turn);
                history.places.entry(step.turn).or_default().push(entry);
            }
        }
        AgentContext {
            inner: Arc::new(Inner {
                dispatch,
                client,
                api_key,
                history,
                order: Mutex::new(Order::default()),
                cancellation,
            }),
        }
    }

    /// The run this handler executes.
    pub fn run_id(&self) -> &str {
        &self.inner.dispatch.run_id
    }

    /// Which dispatch of the run this is: 1 the first time, more after a redispatch (each one
    /// replays what the ones before recorded).
    pub fn attempt(&self) -> u32 {
        self.inner.dispatch.attempt
    }

    /// Cancelled when the run is cancelled or this dispatch no longer holds it.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.inner.cancellation
    }

    /// The divergence this handler ran into, if any: once set, every operation fails with it
    /// and the run fails with it, whatever the handler returns.
    pub(crate) fn diverged(&self) -> Option<String> {
        self.inner.order.lock().expect("order poisoned").diverged.clone()
    }

    fn diverge(&self, message: String) -> AgentError {
        let mut order = self.inner.order.lock().expect("order poisoned");
        order.diverged.get_or_insert(message.clone());
        AgentError::ReplayInputChanged(message)
    }

    /// Takes the next place; refuses once the handler diverged.
    fn next_place(&self, step_id: Option<&str>) -> Result<(u32, u32), AgentError> {
        let mut order = self.inner.order.lock().expect("order poisoned");
        if let Some(message) = &order.diverged {
            return Err(AgentError::ReplayInputChanged(message.clone()));
        }
        let seq = order.next;
        order.next += 1;
        let occurrence = match step_id {
            Some(id) => {
                let count = order.occurrences.entry(id.to_owned()).or_default();
                *count += 1;
                *count - 1
            }
            None => 0,
        };
        Ok((seq, occurrence))
    }

    fn dispatch_pb(&self) -> pb::HostedDispatch {
        pb::HostedDispatch {
            run_id: self.inner.dispatch.run_id.clone(),
            dispatch_id: self.inner.dispatch.dispatch_id.clone(),
            attempt: self.inner.dispatch.attempt,
        }
    }

    /// Calls one tool through the kernel (validation, policy, approval and replay as for any
    /// agent) and returns its result once recorded. A denied call is a result the model reads,
    /// not an error.
    pub fn call(&self, call: Call) -> impl Future<Output = Result<CallOutcome, AgentError>> + Send + 'static {
        let turn = self.call_turn(vec![call]);
        async move {
            let mut outcomes = turn.await?;
            outcomes
                .pop()
                .ok_or_else(|| AgentError::Protocol("the kernel answered a call with no result".into()))
        }
    }

    /// Calls a turn of tools at once (one model response); results come back in position order.
    pub fn call_turn(
        &self,
        calls: Vec<Call>,
    ) -> impl Future<Output = Result<Vec<CallOutcome>, AgentError>> + Send + 'static {
        let ctx = self.clone();
        let place = self.next_place(None);
        async move {
            let (seq, _) = place?;
            if let Some(recorded) = ctx.recorded_turn(seq, &calls) {
                return Ok(recorded);
            }
            let request = pb::CallToolsRequest {
                dispatch: Some(ctx.dispatch_pb()),
                turn: Some(crate::agent::wire::submit_turn_request(ctx.run_id(), seq, calls, &[])),
            };
            let mut client = ctx.inner.client.clone();
            let mut stream = client
                .call_tools(crate::auth::request(request, ctx.inner.api_key.as_ref()))
                .await
                .map_err(AgentError::from)?
                .into_inner();
            let mut outcomes = Vec::new();
            while let Some(response) = stream.message().await.map_err(AgentError::from)? {
                if let Some(item) = response.item
                    && let Some(crate::agent::TurnItem::Result(outcome)) = crate::agent::wire::turn_item(item)?
                {
                    outcomes.push(outcome);
                }
            }
            if let Some(diverged) = outcomes.iter().find(|o| o.outcome == Outcome::ReplayInputChanged) {
                return Err(ctx.diverge(diverged.content.clone()));
            }
            Ok(outcomes)
        }
    }

    /// The recorded results of the turn at `seq`, when the same calls were recorded there and
    /// all settled; `None` sends the turn to the kernel, which joins, replays or diverges.
    fn recorded_turn(&self, seq: u32, calls: &[Call]) -> Option<Vec<CallOutcome>> {
        let recorded = self.inner.history.places.get(&seq)?;
        if recorded.len() != calls.len() {
            return None;
        }
        let mut outcomes = Vec::with_capacity(calls.len());
        for (position, (entry, call)) in recorded.iter().zip(calls).enumerate() {
            let step = entry.step.as_ref()?;
            let key = match &call.id {
                Some(id) => format!("id:{id}"),
                None => format!("t{seq}/p{position}"),
            };
            let same = step.kind == pb::StepKind::Tool as i32
                && !entry.tool_changed
                && step.step_key == key
                && step.tool == call.tool
                && step.arguments_json == to_canonical(&call.arguments);
            if !same {
                return None;
            }
            outcomes.push(wire::recorded_outcome(entry.result.clone()?).ok()?);
        }
        Some(outcomes)
    }

    /// Runs a local step with effect `write`: see [`AgentContext::step_with`].
    pub fn step<T, E, F, Fut>(
        &self,
        id: impl Into<String>,
        f: F,
    ) -> impl Future<Output = Result<T, AgentError>> + Send + 'static
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: FnOnce(StepInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.local(id.into(), StepEffect::Write, false, f)
    }

    /// Runs `f` as a local step: its value (or error) is recorded before the handler sees it,
    /// and on replay the recorded outcome comes back without running `f` again. The id names
    /// the step; a handler may run steps of one id many times (each occurrence is its own step).
    /// A failed step is recorded too and replays as the same [`AgentError::Step`].
    pub fn step_with<T, E, F, Fut>(
        &self,
        id: impl Into<String>,
        effect: StepEffect,
        f: F,
    ) -> impl Future<Output = Result<T, AgentError>> + Send + 'static
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: FnOnce(StepInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.local(id.into(), effect, false, f)
    }

    /// Runs `f` once per run for what must not be decided twice (a model's answer, an id, the
    /// time): a local step with effect `write`, which every branch of the run refuses to run
    /// again.
    pub fn once<T, E, F, Fut>(
        &self,
        id: impl Into<String>,
        f: F,
    ) -> impl Future<Output = Result<T, AgentError>> + Send + 'static
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: FnOnce(StepInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.local(id.into(), StepEffect::Write, true, f)
    }

    fn local<T, E, F, Fut>(
        &self,
        id: String,
        effect: StepEffect,
        once: bool,
        f: F,
    ) -> impl Future<Output = Result<T, AgentError>> + Send + 'static
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: FnOnce(StepInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let ctx = self.clone();
        let place = self.next_place(Some(&id));
        async move {
            let (seq, occurrence) = place?;
            let key = local_step_key(&id, occurrence);
            if let Some(recorded) = ctx.recorded_step(seq, &key)? {
                return decode_step(recorded);
            }
            let info = StepInfo {
                idempotency_key: idempotency_key(ctx.run_id(), &key),
                id: id.clone(),
                occurrence,
            };
            let outcome = match f(info).await {
                Ok(value) => Ok(to_canonical(&serde_json::to_value(value)?)),
                Err(error) => Err(error.to_string()),
            };
            let request = wire::record_step_request(ctx.dispatch_pb(), (seq, &id, occurrence), effect, once, outcome);
            let mut client = ctx.inner.client.clone();
            let response = client
                .record_step(crate::auth::request(request, ctx.inner.api_key.as_ref()))
                .await
                .map_err(AgentError::from)?
                .into_inner();
            if !response.diverged.is_empty() {
                return Err(ctx.diverge(response.diverged));
            }
            let step = response
                .step
                .ok_or_else(|| AgentError::Protocol("the kernel recorded a step without returning it".into()))?;
            decode_step(step)
        }
    }

    /// The recorded step at `seq` when it is this one; a divergence when the place (or this
    /// step's identity) holds something else; `None` when neither is recorded.
    fn recorded_step(&self, seq: u32, key: &str) -> Result<Option<pb::Step>, AgentError> {
        let history = &self.inner.history;
        let at_place = history.places.get(&seq);
        let elsewhere = history.keys.get(key).filter(|place| **place != seq);
        match (at_place, elsewhere) {
            (None, None) => Ok(None),
            (_, Some(place)) => Err(self.diverge(format!(
                "replay_input_changed: step {key} was recorded at place {place} of the handler's order, now it comes \
                 at place {seq}"
            ))),
            (Some(entries), None) => match entries.as_slice() {
                [entry] if entry.step.as_ref().is_some_and(|s| s.step_key == key) => Ok(entry.step.clone()),
                _ => {
                    let was: Vec<&str> = entries
                        .iter()
                        .filter_map(|e| e.step.as_ref().map(|s| s.step_key.as_str()))
                        .collect();
                    Err(self.diverge(format!(
                        "replay_input_changed: place {seq} of the handler's order was recorded as {}, now it is {key}",
                        was.join(", ")
                    )))
                }
            },
        }
    }
}

/// A recorded local step's outcome as the handler gets it.
fn decode_step<T: DeserializeOwned>(step: pb::Step) -> Result<T, AgentError> {
    if step.status == pb::StepStatus::Succeeded as i32 {
        let text = if step.output_json.is_empty() {
            "null"
        } else {
            &step.output_json
        };
        Ok(serde_json::from_str(text)?)
    } else {
        Err(AgentError::Step {
            step: step.step_key,
            message: step.error,
        })
    }
}
