//! The context of one dispatch of a hosted run's handler: its operations, each at its place in
//! the handler's order, answered from the run's recorded history when the place is recorded and
//! sent to the kernel (fenced by the dispatch) when it is not.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use kernel_proto::canonical::{call_step_key, idempotency_key, local_step_key, to_canonical};
use kernel_proto::v1 as pb;
use kernel_proto::v1::hosted_service_client::HostedServiceClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::StepEffect;
use super::subagent::{ChildRun, KernelLink, child_outcome, is_settled, output_text};
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
    pub(crate) trace: Option<crate::TraceContext>,
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
    waits: Mutex<Waits>,
    changed: tokio::sync::Notify,
    context: pb::RunContext,
    /// Places of subagents called and not started yet: they start in place order, so a
    /// session's runs go in the order the handler started them.
    starting: Mutex<std::collections::BTreeSet<u32>>,
    started: tokio::sync::Notify,
}

/// What the handler's operations are doing now, to tell when all of them wait on something
/// durable (then the handler may give back its slot).
#[derive(Debug, Default)]
struct Waits {
    /// Operations called and not finished.
    active: usize,
    /// Of those, the ones waiting on something durable (a call in flight, a person, a child).
    durable: usize,
    /// Of those, the ones that may wait long (a person, a child): only these suspend.
    long: usize,
    /// Local steps running now: nothing inside one may wait durably.
    in_step: usize,
    /// The steps waited on, with how many waits name each.
    keys: std::collections::BTreeMap<String, usize>,
}

/// Counts an operation as active until dropped.
struct Active(AgentContext);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.inner.waits.lock().expect("waits poisoned").active -= 1;
        self.0.inner.changed.notify_waiters();
    }
}

/// Counts an active operation as waiting durably on `keys` until dropped.
struct Durable {
    ctx: AgentContext,
    keys: Vec<String>,
    long: bool,
}

impl Drop for Durable {
    fn drop(&mut self) {
        let mut waits = self.ctx.inner.waits.lock().expect("waits poisoned");
        waits.durable -= 1;
        if self.long {
            waits.long -= 1;
        }
        for key in &self.keys {
            if let Some(count) = waits.keys.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    waits.keys.remove(key);
                }
            }
        }
        drop(waits);
        self.ctx.inner.changed.notify_waiters();
    }
}

impl Durable {
    /// `key` has its result: what the handler waits on no longer includes it, so a suspension
    /// does not name a settled step (which would send the run out again at once, and again).
    fn resolved(&mut self, key: &str) {
        let Some(at) = self.keys.iter().position(|k| k == key) else {
            return;
        };
        self.keys.swap_remove(at);
        let mut waits = self.ctx.inner.waits.lock().expect("waits poisoned");
        if let Some(count) = waits.keys.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                waits.keys.remove(key);
            }
        }
        drop(waits);
        // A handler holding its slot after a refused suspension may offer the rest now.
        self.ctx.inner.changed.notify_waiters();
    }
}

/// Counts a running local step until dropped.
struct InStep(AgentContext);

impl Drop for InStep {
    fn drop(&mut self) {
        self.0.inner.waits.lock().expect("waits poisoned").in_step -= 1;
    }
}

/// How long every operation must wait durably before the handler gives back its slot: a child
/// or an answer that comes quickly costs no redispatch.
const SUSPEND_AFTER: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a handler waits on tool calls alone before it gives back its slot.
const SUSPEND_AFTER_CALLS: std::time::Duration = std::time::Duration::from_secs(1);

/// The previous run of a subagent's session, as the subagent continues from it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    /// The session key the subagent was started with.
    pub key: String,
    /// The last run of the session that completed before this one.
    pub previous_run_id: Option<String>,
    /// That run's output.
    pub previous_output: Option<serde_json::Value>,
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
        let mut context = pb::RunContext::default();
        for mut entry in recorded {
            if let Some(found) = entry.context.take() {
                context = found;
            }
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
                waits: Mutex::new(Waits::default()),
                changed: tokio::sync::Notify::new(),
                context,
                starting: Mutex::new(std::collections::BTreeSet::new()),
                started: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The run that started this one as a subagent.
    pub fn parent_run_id(&self) -> Option<&str> {
        Some(self.inner.context.parent_run_id.as_str()).filter(|id| !id.is_empty())
    }

    /// For a subagent started on a session: the session and the run it continues from.
    pub fn session(&self) -> Option<SessionInfo> {
        let context = &self.inner.context;
        (!context.session_key.is_empty()).then(|| SessionInfo {
            key: context.session_key.clone(),
            previous_run_id: Some(context.previous_run_id.clone()).filter(|id| !id.is_empty()),
            previous_output: (!context.previous_output_json.is_empty())
                .then(|| serde_json::from_str(&context.previous_output_json).ok())
                .flatten(),
        })
    }

    fn active(&self) -> Active {
        self.inner.waits.lock().expect("waits poisoned").active += 1;
        Active(self.clone())
    }

    fn durable(&self, keys: Vec<String>, long: bool) -> Durable {
        let mut waits = self.inner.waits.lock().expect("waits poisoned");
        waits.durable += 1;
        if long {
            waits.long += 1;
        }
        for key in &keys {
            *waits.keys.entry(key.clone()).or_default() += 1;
        }
        drop(waits);
        self.inner.changed.notify_waiters();
        Durable {
            ctx: self.clone(),
            keys,
            long,
        }
    }

    /// Refuses an operation that could wait durably from inside a local step.
    fn not_in_step(&self, what: &str) -> Result<(), AgentError> {
        if self.inner.waits.lock().expect("waits poisoned").in_step > 0 {
            return Err(AgentError::NestedDurableOperation(format!(
                "{what} inside a local step: nothing inside a step may wait on something durable; call it from \
                 the handler, between steps"
            )));
        }
        Ok(())
    }

    /// Resolves with the steps waited on once every active operation has waited durably for
    /// [`SUSPEND_AFTER`] (at least one of them on a person or a child) or [`SUSPEND_AFTER_CALLS`]
    /// (on tool calls alone): the handler may then give back its slot. Never with `refused`, the
    /// steps of a suspension the kernel refused: the handler waits on, holding its slot, until
    /// what it awaits changes.
    pub(crate) async fn suspendable(&self, refused: &[String]) -> Vec<String> {
        loop {
            let changed = self.inner.changed.notified();
            match self.waits_durably() {
                Some(after) => {
                    let again = self.inner.changed.notified();
                    tokio::select! {
                        _ = changed => continue,
                        _ = tokio::time::sleep(after) => {
                            if self.waits_durably() == Some(after) {
                                let keys: Vec<String> =
                                    self.inner.waits.lock().expect("waits poisoned").keys.keys().cloned().collect();
                                if keys != refused {
                                    return keys;
                                }
                                again.await;
                            }
                        }
                    }
                }
                None => changed.await,
            }
        }
    }

    /// How long the handler may wait as it waits now before it gives back its slot: `None` while
    /// something it awaits is not durable (a local step running, a call not yet recorded).
    fn waits_durably(&self) -> Option<std::time::Duration> {
        let waits = self.inner.waits.lock().expect("waits poisoned");
        if waits.active == 0 || waits.durable < waits.active {
            return None;
        }
        // Tool calls alone usually answer quickly; they suspend the handler only when they take
        // long (or cannot start: their worker's slots are what the handler holds).
        Some(if waits.long > 0 {
            SUSPEND_AFTER
        } else {
            SUSPEND_AFTER_CALLS
        })
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

    /// The W3C trace context the handler's own spans should join: its dispatch's span when the
    /// kernel exports traces, else the agent's `traceparent`; `None` when there is neither.
    pub fn trace_context(&self) -> Option<&crate::TraceContext> {
        self.inner.dispatch.trace.as_ref()
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

    fn link(&self) -> KernelLink {
        KernelLink {
            client: self.inner.client.clone(),
            api_key: self.inner.api_key.clone(),
            dispatch: self.dispatch_pb(),
        }
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
    /// At most the run's `max_concurrency` of them run at once, when it has one.
    pub fn call_turn(
        &self,
        calls: Vec<Call>,
    ) -> impl Future<Output = Result<Vec<CallOutcome>, AgentError>> + Send + 'static {
        self.call_turn_bounded(calls, 0)
    }

    /// Calls a turn of tools as [`AgentContext::call_turn`] does, running at most
    /// `max_concurrency` of them at once (Rewyn's `max_concurrency`; 0 takes the run's default).
    /// The others wait in the kernel and start in position order; results come back in position
    /// order.
    pub fn call_turn_bounded(
        &self,
        calls: Vec<Call>,
        max_concurrency: u32,
    ) -> impl Future<Output = Result<Vec<CallOutcome>, AgentError>> + Send + 'static {
        let ctx = self.clone();
        let place = self.next_place(None);
        // A call inside a step would take a place the step's replay does not take again.
        let nested = self.not_in_step("a tool call");
        let active = self.active();
        async move {
            let _active = active;
            nested?;
            let (seq, _) = place?;
            if let Some(recorded) = ctx.recorded_turn(seq, &calls) {
                return Ok(recorded);
            }
            let keys: Vec<String> = calls
                .iter()
                .enumerate()
                .map(|(position, call)| call_step_key(seq, position as u32, call.id.as_deref()))
                .collect();
            let request = pb::CallToolsRequest {
                dispatch: Some(ctx.dispatch_pb()),
                turn: Some(crate::agent::wire::submit_turn_request(
                    ctx.run_id(),
                    seq,
                    calls,
                    (&[], max_concurrency),
                )),
            };
            let mut client = ctx.inner.client.clone();
            let mut stream = client
                .call_tools(crate::auth::request(request, ctx.inner.api_key.as_ref()))
                .await
                .map_err(AgentError::from)?
                .into_inner();
            // Recorded now: the calls wait on their workers, and a gated one on a person. A call
            // the history has settled is not waited on, even before the stream (in position
            // order) reaches it.
            let settled = ctx.settled_at(seq);
            let mut pending: Vec<String> = keys.iter().filter(|k| !settled.contains(*k)).cloned().collect();
            let mut waiting = Some(ctx.durable(pending.clone(), false));
            let mut outcomes = Vec::new();
            while let Some(response) = stream.message().await.map_err(AgentError::from)? {
                match response.item.map(crate::agent::wire::turn_item).transpose()?.flatten() {
                    Some(crate::agent::TurnItem::Result(outcome)) => {
                        if let Some(key) = keys.get(outcomes.len()) {
                            pending.retain(|k| k != key);
                            if let Some(waiting) = waiting.as_mut() {
                                waiting.resolved(key);
                            }
                        }
                        outcomes.push(outcome);
                    }
                    // A call waits for a person: the turn may wait long now.
                    Some(crate::agent::TurnItem::Interrupted(_)) => {
                        drop(waiting.take());
                        waiting = Some(ctx.durable(pending.clone(), true));
                    }
                    _ => {}
                }
            }
            drop(waiting);
            if let Some(diverged) = outcomes.iter().find(|o| o.outcome == Outcome::ReplayInputChanged) {
                return Err(ctx.diverge(diverged.content.clone()));
            }
            Ok(outcomes)
        }
    }

    /// The keys of the steps the loaded history has settled at place `seq`.
    fn settled_at(&self, seq: u32) -> Vec<String> {
        self.inner
            .history
            .places
            .get(&seq)
            .map(|recorded| {
                recorded
                    .iter()
                    .filter(|entry| entry.result.is_some())
                    .filter_map(|entry| entry.step.as_ref().map(|step| step.step_key.clone()))
                    .collect()
            })
            .unwrap_or_default()
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
            let key = call_step_key(seq, position as u32, call.id.as_deref());
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
        let nested = self.not_in_step(&format!("step '{id}'"));
        let active = self.active();
        async move {
            let _active = active;
            nested?;
            let (seq, occurrence) = place?;
            let key = local_step_key(&id, occurrence);
            if let Some(recorded) = ctx.recorded_step(seq, &key)? {
                return decode_step(recorded);
            }
            if ctx.inner.context.check_steps {
                let request = pb::CheckStepRequest {
                    dispatch: Some(ctx.dispatch_pb()),
                    seq,
                    step_id: id.clone(),
                    occurrence,
                    effect: effect.as_str().to_owned(),
                    once,
                };
                let mut client = ctx.inner.client.clone();
                let checked = client
                    .check_step(crate::auth::request(request, ctx.inner.api_key.as_ref()))
                    .await
                    .map_err(AgentError::from)?
                    .into_inner();
                if !checked.diverged.is_empty() {
                    return Err(ctx.diverge(checked.diverged));
                }
                if !checked.allowed {
                    let step = checked
                        .step
                        .ok_or_else(|| AgentError::Protocol("the kernel denied a step without recording it".into()))?;
                    return decode_step(step);
                }
            }
            let info = StepInfo {
                idempotency_key: idempotency_key(ctx.run_id(), &key),
                id: id.clone(),
                occurrence,
            };
            let running = {
                ctx.inner.waits.lock().expect("waits poisoned").in_step += 1;
                InStep(ctx.clone())
            };
            let outcome = match f(info).await {
                Ok(value) => Ok(to_canonical(&serde_json::to_value(value)?)),
                Err(error) => Err(error.to_string()),
            };
            drop(running);
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

    /// Asks a person `question` (Pyrula's `ctx.interrupt`) and returns the answer, checked by the
    /// kernel against the question's [`schema`](HandlerQuestion::schema) and
    /// [`choices`](HandlerQuestion::choices). The run blocks with `run:interrupted` (reason
    /// `human_input`) until someone answers: `kernelctl runs answer RUN question:agent#N --with JSON`,
    /// `kernelctl approvals answer`, the console, [`AgentClient::answer`](crate::AgentClient::answer)
    /// or an MCP client's input. Declined, or expired without a
    /// [`default`](HandlerQuestion::default), it is [`AgentError::Unanswered`].
    ///
    /// The question takes the next place in the handler's order, as a subagent does: on replay
    /// the recorded answer is returned and nobody is asked again, and another question in its
    /// place fails the run (`replay_input_changed`). While the person takes their time the
    /// handler may give back its slot (the run is suspended) and runs again once answered. Inside
    /// a local step it is [`AgentError::NestedDurableOperation`].
    pub fn ask(&self, question: impl Into<String>) -> HandlerQuestion {
        HandlerQuestion {
            ctx: self.clone(),
            question: question.into(),
            schema: None,
            choices: Vec::new(),
            default: None,
            approvers: Vec::new(),
            timeout: None,
        }
    }

    fn put_question(
        &self,
        asked: HandlerQuestion,
    ) -> impl Future<Output = Result<serde_json::Value, AgentError>> + Send + 'static {
        let ctx = self.clone();
        let nested = self.not_in_step("a question to a person");
        let place = self.next_place(Some("?question"));
        let active = self.active();
        async move {
            let _active = active;
            nested?;
            let (seq, occurrence) = place?;
            let key = format!("question:agent#{occurrence}");
            let step = match ctx.recorded_step(seq, &key)? {
                Some(step) => step,
                None => {
                    let request = pb::AskPersonRequest {
                        dispatch: None,
                        occurrence,
                        seq,
                        question: asked.question,
                        answer_schema_json: asked.schema.as_ref().map(to_canonical).unwrap_or_default(),
                        approvers: asked.approvers,
                        timeout_ms: asked.timeout.map_or(0, |t| t.as_millis().max(1) as u64),
                        choices: asked.choices,
                        default_answer_json: asked.default.as_ref().map(to_canonical).unwrap_or_default(),
                    };
                    let response = ctx.link().ask(request).await?;
                    if !response.diverged.is_empty() {
                        return Err(ctx.diverge(response.diverged));
                    }
                    response
                        .step
                        .ok_or_else(|| AgentError::Protocol("the kernel asked a question without its step".into()))?
                }
            };
            let step = if is_settled(&step) {
                step
            } else {
                let _waiting = ctx.durable(vec![key.clone()], true);
                ctx.link().await_step(&key).await?
            };
            if step.status == pb::StepStatus::Succeeded as i32 {
                Ok(serde_json::from_str(output_text(&step))?)
            } else {
                Err(AgentError::Unanswered {
                    question: key,
                    message: step.error,
                })
            }
        }
    }

    /// Starts a subagent: a child run of `agent` (hosted on any worker offering it), linked to
    /// this run, and returns its output; a failed or cancelled child is [`AgentError::Subagent`].
    /// Await the returned [`Subagent`], optionally after [`Subagent::session`]. On replay the
    /// recorded child is returned (its output, or the child still running is joined), never a
    /// second one. While it waits, the handler may give back its slot (the run is suspended).
    pub fn subagent(&self, agent: impl Into<String>, input: serde_json::Value) -> Subagent {
        Subagent {
            ctx: self.clone(),
            agent: agent.into(),
            input,
            session: None,
        }
    }

    fn start_subagent(
        &self,
        agent: String,
        input: serde_json::Value,
        session: Option<String>,
    ) -> impl Future<Output = Result<serde_json::Value, AgentError>> + Send + 'static {
        let ctx = self.clone();
        let nested = self.not_in_step(&format!("subagent '{agent}'"));
        let place = self.next_place(Some(&format!("subagent:{agent}")));
        if let Ok((seq, _)) = &place {
            self.inner.starting.lock().expect("starting poisoned").insert(*seq);
        }
        let active = self.active();
        async move {
            let _active = active;
            nested?;
            let (seq, occurrence) = place?;
            let key = format!("subagent:{agent}#{occurrence}");
            let recorded = ctx.recorded_step(seq, &key);
            let turn = ctx.start_in_order(seq).await;
            let step = match recorded? {
                Some(step) => step,
                None => {
                    let child = ChildRun {
                        seq,
                        agent: &agent,
                        occurrence,
                        input: &input,
                        session,
                    };
                    let response = ctx.link().start(child).await?;
                    if !response.diverged.is_empty() {
                        return Err(ctx.diverge(response.diverged));
                    }
                    response
                        .step
                        .ok_or_else(|| AgentError::Protocol("the kernel started a subagent without its step".into()))?
                }
            };
            drop(turn);
            let step = if is_settled(&step) {
                step
            } else {
                let _waiting = ctx.durable(vec![key.clone()], true);
                ctx.link().await_step(&key).await?
            };
            child_outcome(agent, step)
        }
    }

    /// Waits until every subagent called before place `seq` has started; the start at `seq`
    /// goes next, and lets the ones after it go when the returned guard drops.
    async fn start_in_order(&self, seq: u32) -> StartTurn {
        loop {
            let started = self.inner.started.notified();
            let first = self.inner.starting.lock().expect("starting poisoned").first().copied();
            if first.is_none_or(|first| first >= seq) {
                return StartTurn(self.clone(), seq);
            }
            started.await;
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

/// A subagent's turn to start; the next one's comes when it drops.
struct StartTurn(AgentContext, u32);

impl Drop for StartTurn {
    fn drop(&mut self) {
        self.0.inner.starting.lock().expect("starting poisoned").remove(&self.1);
        self.0.inner.started.notify_waiters();
    }
}

/// A subagent to start; await it (see [`AgentContext::subagent`]).
#[must_use = "a subagent starts when awaited"]
pub struct Subagent {
    ctx: AgentContext,
    agent: String,
    input: serde_json::Value,
    session: Option<String>,
}

impl Subagent {
    /// Starts it on session `key`: subagents of one session run one at a time, in order of
    /// start, and each continues from the last one that completed ([`AgentContext::session`]).
    /// The key must differ from this run's own session; derive it from this run's id
    /// (`format!("researcher:{}", ctx.run_id())`) so no other parent can reuse it.
    pub fn session(mut self, key: impl Into<String>) -> Self {
        self.session = Some(key.into());
        self
    }
}

impl std::future::IntoFuture for Subagent {
    type Output = Result<serde_json::Value, AgentError>;
    type IntoFuture = std::pin::Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.ctx.start_subagent(self.agent, self.input, self.session))
    }
}

/// A recorded local step's outcome as the handler gets it.
fn decode_step<T: DeserializeOwned>(step: pb::Step) -> Result<T, AgentError> {
    if step.status == pb::StepStatus::Succeeded as i32 {
        Ok(serde_json::from_str(output_text(&step))?)
    } else if step.outcome == pb::CallOutcome::Denied as i32 {
        Err(AgentError::Denied {
            step: step.step_key,
            message: step.error,
        })
    } else {
        Err(AgentError::Step {
            step: step.step_key,
            message: step.error,
        })
    }
}

/// A question a hosted handler puts to a person ([`AgentContext::ask`]); await it for the answer.
#[must_use = "a question asks nothing until it is awaited"]
pub struct HandlerQuestion {
    ctx: AgentContext,
    question: String,
    schema: Option<serde_json::Value>,
    choices: Vec<String>,
    default: Option<serde_json::Value>,
    approvers: Vec<String>,
    timeout: Option<std::time::Duration>,
}

impl HandlerQuestion {
    /// The JSON Schema the answer must meet; without one any JSON is an answer.
    pub fn schema(mut self, schema: serde_json::Value) -> Self {
        self.schema = Some(schema);
        self
    }

    /// The answers a person picks from: the answer is one of them.
    pub fn choices<I, S>(mut self, choices: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choices = choices.into_iter().map(Into::into).collect();
        self
    }

    /// The answer recorded if nobody answers within the [`timeout`](Self::timeout); it must meet
    /// the schema.
    pub fn default(mut self, answer: serde_json::Value) -> Self {
        self.default = Some(answer);
        self
    }

    /// Who may answer (API key names or groups); without any, any key that may answer approvals.
    pub fn approvers<I, S>(mut self, approvers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.approvers = approvers.into_iter().map(Into::into).collect();
        self
    }

    /// How long the question waits unanswered; then it records its default, or fails. Without
    /// it, it waits until the run ends.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl std::future::IntoFuture for HandlerQuestion {
    type Output = Result<serde_json::Value, AgentError>;
    type IntoFuture = std::pin::Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        let ctx = self.ctx.clone();
        Box::pin(ctx.put_question(self))
    }
}
