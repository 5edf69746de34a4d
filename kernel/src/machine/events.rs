//! The typed log: one payload type per event kind, each field documented, from which the event
//! reference (`docs/reference/events.md`) and the payloads' JSON Schema
//! (`docs/reference/events.schema.json`) are generated.
//!
//! A transition builds its event's payload as one of these types and turns it into a
//! [`NewEvent`] with [`Payload::event`], so the JSON the store appends (and every reader sees) is
//! exactly what the type says: a field that is always written is a plain field (an `Option`
//! without `skip_serializing_if` is written as `null` when it has no value), a field written only
//! in some situations is an `Option` left out when `None`. A kind written in several shapes (a
//! `tool:result` of a call that ran, of one settled at once, of a step a branch replayed) is an
//! untagged enum of those shapes, so its schema says precisely which fields come together.
//!
//! Kinds that share a shape share its type: `tool:start` and `agent:dispatched` are both a
//! [`Started`], a settled dispatch of any kind is a [`Settlement`], a new call's naming fields are
//! one [`CallNamed`] flattened into each event that names it.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings};
use serde::Serialize;
use serde_json::Value;

use super::NewEvent;
use crate::model::{
    ApprovalId, ApprovalStatus, DispatchId, Effect, ErrorKind, EventType, Idempotency, Millis, Outcome, RetryPolicy,
    RunStatus, SessionId, text_enum,
};

/// An event payload: the one type that every event of kind [`Payload::KIND`] is written as.
pub trait Payload: Serialize + JsonSchema {
    /// The kind of event this payload is written as.
    const KIND: EventType;

    /// The event to append, with this payload as its JSON.
    fn event(&self) -> NewEvent {
        // The payloads are structs of strings, numbers and JSON values with string keys, which
        // always serialize.
        let payload = serde_json::to_value(self).expect("an event payload serializes");
        // Every event the kernel's own tests write (the machine's, the store's) is held to the
        // schema the reference publishes, so a type and its schema cannot part.
        #[cfg(test)]
        tests::assert_fits(Self::KIND, &payload);
        NewEvent {
            kind: Self::KIND,
            payload,
        }
    }
}

/// Ties each kind to its payload type (named as the kind's variant) and gives the schema of every
/// kind; the `match` makes a new kind without a payload type a compile error.
macro_rules! payloads {
    ($($kind:ident),+ $(,)?) => {
        $(impl Payload for $kind {
            const KIND: EventType = EventType::$kind;
        })+

        /// The JSON Schema of the payload of events of `kind`, every subschema inlined.
        pub fn schema(kind: EventType) -> Schema {
            let mut generator = generator();
            let mut schema = match kind {
                $(EventType::$kind => generator.root_schema_for::<$kind>(),)+
            };
            close(schema.as_object_mut());
            schema
        }
    };
}

payloads!(
    RunCreated,
    RunStarted,
    ToolScheduled,
    ToolStart,
    ToolLeaseLost,
    ToolAttemptFailed,
    ToolDenied,
    RunInterrupted,
    RunResumed,
    ApprovalAnswered,
    ToolResult,
    RunCompleted,
    RunFailed,
    RunCancelled,
    AgentDispatched,
    AgentLeaseLost,
    AgentResult,
    StepResult,
    AgentSuspended,
    AgentResumed,
    SubagentStart,
    SubagentResult,
    ToolSuspended,
    ToolResumed,
    QuestionAsked,
);

/// Says of a payload's object (or of each of its shapes) that it has no field besides those
/// listed: the kernel writes exactly what a payload type declares.
fn close(schema: Option<&mut serde_json::Map<String, Value>>) {
    let Some(schema) = schema else { return };
    if let Some(Value::Array(shapes)) = schema.get_mut("anyOf") {
        for shape in shapes {
            close(shape.as_object_mut());
        }
    }
    if schema.contains_key("properties") {
        schema.insert("additionalProperties".into(), Value::Bool(false));
    }
}

/// Schemas of what the kernel writes (an `Option` always written is required and may be `null`),
/// with no `$ref`s, so each kind's schema reads alone.
fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .for_serialize()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator()
}

text_enum!(
    /// How a settled step ended, in the few words a reader of the log matches on.
    SettledStatus {
        /// It succeeded.
        Ok => "ok",
        /// It failed, or was refused.
        Error => "error",
        /// It was cancelled.
        Cancelled => "cancelled",
    }
);

text_enum!(
    /// What a dispatch that ended without settling its step does next.
    Next {
        /// It is pending again, to start on a worker.
        Redispatch => "redispatch",
        /// It waits, suspended, for what it awaits.
        Wait => "wait",
    }
);

text_enum!(
    /// Where a call's result came from when it did not run.
    Cache {
        /// A live entry of the result cache for the same tool, fingerprint and arguments.
        Hit => "hit",
    }
);

/// `run:created`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunCreated {
    /// The agent the run is of.
    pub agent: String,
    /// The run's input: JSON, or the text as a string when it is not JSON.
    pub input: Value,
    /// The run's labels.
    pub labels: BTreeMap<String, String>,
    /// The idempotency key the run was created with, if any.
    pub idempotency_key: Option<String>,
    /// How many tool calls the run may make; 0: no limit.
    pub max_tool_calls: u32,
    /// Whether the run may wait for a person (approvals).
    pub interactive: bool,
    /// The permissions granted to the run.
    pub permissions: Vec<String>,
    /// The API key that granted them; `null` without an auth file.
    pub permissions_granted_by: Option<String>,
    /// What inspection shows of the run's arguments and results.
    pub capture: crate::model::Capture,
    /// Whether a worker hosts the run's handler.
    pub hosted: bool,
    /// The run that started this one as a subagent.
    pub parent_run_id: Option<String>,
    /// The step of the parent run that waits for this one.
    pub parent_step_key: Option<String>,
    /// The session the run belongs to: runs of one session run one at a time, in order.
    pub session_key: Option<String>,
    /// For a branch, the run whose record it replays.
    pub forked_from_run_id: Option<String>,
    /// For a branch, the step of that run up to which it replays; `null`: the whole record.
    pub fork_at_step_key: Option<String>,
    /// A case run's allow tokens.
    pub allow: Vec<String>,
    /// The W3C trace context the run's span is a child of.
    pub traceparent: Option<String>,
    /// The run's own budget limits (a subagent's parent's budget covers it too).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budget: Vec<BudgetLimit>,
}

/// One limit of a run's budget, as set.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct BudgetLimit {
    /// The tools it counts, a glob; absent: every tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// At most this much tool run time, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_time_ms: Option<u64>,
    /// `request`, or the policy file's `budgets[i]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_by: Option<String>,
}

impl From<&super::budget::Limit> for BudgetLimit {
    fn from(limit: &super::budget::Limit) -> Self {
        BudgetLimit {
            tools: limit.tools.clone(),
            max_calls: limit.max_calls,
            max_cost: limit.max_cost,
            max_time_ms: limit.max_time_ms,
            set_by: limit.set_by.clone(),
        }
    }
}

/// `run:started`: `turn` for an external agent's run, `hosted` for a hosted one.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunStarted {
    /// The turn that started the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32")]
    pub turn: Option<u32>,
    /// `true`: the hosted run's handler first started on a worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "bool")]
    pub hosted: Option<bool>,
}

/// How every event about a new call of a turn names it.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct CallNamed {
    /// The step's identity in its run.
    pub step_key: String,
    /// The turn the call came in.
    pub turn: u32,
    /// The call's position in its turn.
    pub position: u32,
    /// The call's explicit id, when the agent gave one.
    pub call_id: Option<String>,
    /// The tool called.
    pub tool: String,
    /// The tool's version (empty for an unknown tool).
    pub version: String,
    /// The tool's fingerprint (empty for an unknown tool).
    pub fingerprint: String,
    /// The call's arguments; `null` when they are not JSON.
    pub arguments: Value,
    /// The resources the call locks, when it declares any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
}

/// `tool:scheduled`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct ToolScheduled {
    #[serde(flatten)]
    pub call: CallNamed,
    /// Hash of the tool, its fingerprint and the canonical arguments: a replay with another one
    /// is a divergence.
    pub call_hash: String,
    /// The key the tool receives, stable across retries and redispatches.
    pub idempotency_key: String,
    /// What the kernel may do with the call when its worker is lost.
    pub idempotency: Idempotency,
    /// How long one attempt may run.
    pub timeout_ms: u64,
    /// The retry policy the call runs under; `null`: no retry.
    pub retry: Option<RetryPolicy>,
    /// The policy preset, rule or tool flag that let the call run or gated it.
    pub decided_by: Option<String>,
    /// Whether a person must approve the call before it runs.
    pub requires_approval: bool,
    /// The price of one attempt.
    pub unit_cost: f64,
}

/// What every event of a call settled at once, without running, says.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct AtOnce {
    #[serde(flatten)]
    pub call: CallNamed,
    /// Attempts run: 0.
    pub attempts: u32,
    /// What the call cost: 0.
    pub cost: f64,
    /// `error` for a refusal, `ok` for a cache hit.
    pub status: SettledStatus,
    /// Why the step ended as it did.
    pub outcome: Outcome,
    /// What decided the call (the deny rule of a denied one); `null` when nothing did.
    pub decided_by: Option<String>,
}

/// A call refused before running: over its run's call limit, to an unknown tool, with invalid
/// arguments, a write in a branch, or denied by the policy.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RefusedCall {
    #[serde(flatten)]
    pub at_once: AtOnce,
    /// What the model reads of the refusal.
    pub error: String,
    /// The refusal's error kind (`fatal`).
    pub error_kind: ErrorKind,
    /// What refused the call (`max_tool_calls`, `unknown_tool`, `denied`, ...).
    pub reason: String,
}

/// A call served from the result cache.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct CachedCall {
    #[serde(flatten)]
    pub at_once: AtOnce,
    /// The cached output.
    pub output: Value,
    /// `hit`: the output came from the result cache.
    pub cache: Cache,
}

/// `tool:start` and `agent:dispatched`: an attempt started on a worker.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Started {
    /// The step's identity in its run.
    pub step_key: String,
    /// The call's position in its turn (0 for a hosted run's own dispatch).
    pub position: u32,
    /// The tool, or the hosted agent, that runs.
    pub tool: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// The dispatch's id, which fences every message about it.
    pub dispatch_id: DispatchId,
    /// The worker that holds the lease.
    pub worker: String,
    /// The worker's session.
    pub session_id: SessionId,
    /// The key the tool receives, stable across attempts.
    pub idempotency_key: String,
    /// When the lease expires unless the worker's heartbeats renew it (ms since the epoch).
    pub lease_expires_at: Millis,
    /// How long the attempt may run.
    pub timeout_ms: u64,
}

/// `tool:start`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ToolStart(pub Started);

/// `agent:dispatched`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct AgentDispatched(pub Started);

/// Which attempt an event of an attempt that ended without settling its step is about.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct AttemptOf {
    /// The step's identity in its run.
    pub step_key: String,
    /// The call's position in its turn (0 for a hosted run's own dispatch).
    pub position: u32,
    /// The tool, or the hosted agent.
    pub tool: String,
    /// The attempt that ended.
    pub attempt: u32,
    /// The attempt's dispatch.
    pub dispatch_id: Option<DispatchId>,
    /// The worker it ran on.
    pub worker: Option<String>,
}

impl AttemptOf {
    /// The last attempt of `step`.
    pub fn of(step: &crate::model::StepRecord) -> AttemptOf {
        AttemptOf {
            step_key: step.key.to_string(),
            position: step.position,
            tool: step.tool.clone(),
            attempt: step.attempts,
            dispatch_id: step.dispatch_id.clone(),
            worker: step.worker.clone(),
        }
    }
}

/// `tool:lease_lost` and `agent:lease_lost`: a dispatch lost its worker and is pending again.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct LeaseLost {
    #[serde(flatten)]
    pub attempt: AttemptOf,
    /// Why the lease ended.
    pub reason: String,
    /// `redispatch`.
    pub next: Next,
}

/// `tool:lease_lost`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ToolLeaseLost(pub LeaseLost);

/// `agent:lease_lost`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct AgentLeaseLost(pub LeaseLost);

/// `tool:attempt_failed`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct ToolAttemptFailed {
    #[serde(flatten)]
    pub attempt: AttemptOf,
    /// The attempt's error.
    pub error: String,
    /// The error's kind (`retryable`).
    pub error_kind: ErrorKind,
    /// `error` (the tool's) or `timeout`.
    pub reason: String,
    /// When the next attempt is due (ms since the epoch).
    pub next_attempt_at: Millis,
}

/// `tool:denied`: always a call the policy refused, settled at once.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ToolDenied(pub RefusedCall);

/// `run:interrupted`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunInterrupted {
    /// `tool_approval` (leave for a call to run), `budget_exceeded` (leave to raise the budget a
    /// call would pass: `decided_by` is `budget:<run>#<limit>`, the answer its new bounds), or
    /// `human_input` (a tool body's question).
    pub reason: String,
    /// The approval's id, to answer it with.
    pub approval_id: ApprovalId,
    /// The gated call's identity in its run.
    pub step_key: String,
    /// The call's position in its turn.
    pub position: u32,
    /// The tool called.
    pub tool_name: String,
    /// The call's explicit id, else its step key.
    pub tool_use_id: String,
    /// The call's arguments: JSON, or the text as a string when it is not JSON.
    pub tool_input: Value,
    /// Who may answer.
    pub approvers: Vec<String>,
    /// What the approver is told.
    pub message: Option<String>,
    /// The rule or flag that asked; for a budget, `budget:<run>#<limit>`, the run holding it and
    /// its place among that run's limits.
    pub decided_by: String,
    /// When the question expires unanswered (ms since the epoch); `null`: never.
    pub expires_at: Option<Millis>,
}

/// `run:resumed`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunResumed {
    /// `tool_approval`.
    pub reason: String,
}

/// `approval:answered`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct ApprovalAnswered {
    /// The approval answered.
    pub approval_id: ApprovalId,
    /// The gated call's identity in its run.
    pub step_key: String,
    /// The tool called.
    pub tool: String,
    /// `approved`, `rejected` or `expired`.
    pub answer: ApprovalStatus,
    /// Who answered (the clock for an expiry).
    pub decider: String,
    /// Why, as the decider said.
    pub reason: Option<String>,
    /// A question's answer (when `approved`): the JSON the person gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<Value>,
}

/// A person's answer that settled a call without running it.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Unapproved {
    /// `rejected` or `expired`.
    pub approval: ApprovalStatus,
    /// Who answered.
    pub decider: String,
    /// Why, as the decider said.
    pub approval_reason: Option<String>,
}

/// The child run whose end settled a subagent's step.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct ChildEnd {
    /// The child run.
    pub child_run_id: String,
    /// How it ended.
    pub child_status: RunStatus,
}

/// What settled a dispatched step besides its worker's result: each field is there only when it
/// applies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
pub struct SettledBy {
    /// What ended the step without its worker's result: `indeterminate`, `lease_lost`,
    /// `timeout`, `call_cancelled`, `run_ended`, `schedule_to_start_timeout`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub reason: Option<String>,
    /// What made an indeterminate step so: `timeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub cause: Option<String>,
    /// Why the call was cancelled, as the canceller said.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub cancel_reason: Option<String>,
    #[serde(flatten)]
    pub unapproved: Option<Unapproved>,
    #[serde(flatten)]
    pub child: Option<ChildEnd>,
}

impl SettledBy {
    /// Settled for `reason`, nothing else to say.
    pub fn reason(reason: &str) -> Self {
        SettledBy {
            reason: Some(reason.to_owned()),
            ..SettledBy::default()
        }
    }
}

/// A dispatched step settled (`tool:result`, `agent:result`, `subagent:result`): by its
/// worker's result, or by what ended it without one.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Settlement {
    /// The step's identity in its run.
    pub step_key: String,
    /// The call's position in its turn.
    pub position: u32,
    /// The tool, the hosted agent or the subagent.
    pub tool: String,
    /// `ok`, `error` or `cancelled`.
    pub status: SettledStatus,
    /// Why the step ended as it did.
    pub outcome: Outcome,
    /// Attempts started.
    pub attempts: u32,
    /// The last attempt's dispatch; `null` when none started.
    pub dispatch_id: Option<DispatchId>,
    /// The worker of the last attempt; `null` when none started.
    pub worker: Option<String>,
    /// Progress messages its attempts reported.
    pub progress_count: u32,
    /// From its first start to its end; `null` when it never started.
    pub duration_ms: Option<Millis>,
    /// What its attempts cost.
    pub cost: f64,
    /// The output of a success: JSON, or the text as a string when it is not JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Value")]
    pub output: Option<Value>,
    /// What the model reads of a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub error: Option<String>,
    /// A failure's kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "ErrorKind")]
    pub error_kind: Option<ErrorKind>,
    #[serde(flatten)]
    pub by: SettledBy,
}

/// A step a branch replayed from its parent's record (or took from the fork's given results):
/// settled at once, nothing run.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Replayed {
    /// The step's identity in its run.
    pub step_key: String,
    /// The turn (for a hosted run, the place in the handler's order) it is replayed at.
    pub turn: u32,
    /// Its position there.
    pub position: u32,
    /// The tool, local step or subagent.
    pub tool: String,
    /// `ok` or `error`, as the parent's step settled.
    pub status: SettledStatus,
    /// Why the step ended as it did.
    pub outcome: Outcome,
    /// `branch:parent`, or `branch:set_result` for a result the fork gave.
    pub decided_by: String,
    /// The run whose record the branch replays.
    pub replayed_from_run_id: String,
    /// The output replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Value")]
    pub output: Option<Value>,
    /// The error replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub error: Option<String>,
}

/// `tool:result`, in each of the shapes a call settles with.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ToolResult {
    /// A call that was dispatched (or waited for a person) settled.
    Settled(Settlement),
    /// A call refused before running.
    Refused(RefusedCall),
    /// A call served from the result cache.
    Cached(CachedCall),
    /// A call a branch replayed.
    Replayed(Replayed),
}

/// `run:completed`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunCompleted {
    /// The run's output: JSON, or the text as a string when it is not JSON.
    pub output: Value,
    /// Calls still in flight that the end cancelled.
    pub cancelled_steps: usize,
}

/// `run:failed`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunFailed {
    /// Why the run failed.
    pub reason: String,
    /// Calls still in flight that the end cancelled.
    pub cancelled_steps: usize,
}

/// `run:cancelled`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct RunCancelled {
    /// Why the run was cancelled.
    pub reason: String,
    /// Calls still in flight that the end cancelled.
    pub cancelled_steps: usize,
}

/// `agent:result`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct AgentResult(pub Settlement);

/// A hosted handler's local step finished.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct LocalStepResult {
    /// The step's identity in its run.
    pub step_key: String,
    /// Its place in the handler's order.
    pub seq: u32,
    /// The id the handler gave the step.
    pub step_id: String,
    /// Which occurrence of that id it is, from 0.
    pub occurrence: u32,
    /// Its declared effect.
    pub effect: Effect,
    /// Whether it ran under `ctx.once` (recorded before the handler goes on).
    pub once: bool,
    /// `ok` or `error`.
    pub status: SettledStatus,
    /// Why it ended as it did.
    pub outcome: Outcome,
    /// What decided it: a policy rule, or `ctx.step` / `ctx.once`.
    pub decided_by: String,
    /// The key the step's code receives.
    pub idempotency_key: String,
    /// Its output: JSON, or the text as a string when it is not JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Value")]
    pub output: Option<Value>,
    /// Its error.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub error: Option<String>,
}

/// `step:result`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum StepResult {
    /// The handler ran the step.
    Local(LocalStepResult),
    /// A branch replayed it from its parent.
    Replayed(Replayed),
}

/// `tool:suspended`, and `agent:suspended` of a handler that awaits steps.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Suspended {
    /// The suspended dispatch's step.
    pub step_key: String,
    /// Its attempt.
    pub attempt: u32,
    /// Its dispatch.
    pub dispatch_id: Option<DispatchId>,
    /// The worker that gave back its slot.
    pub worker: Option<String>,
    /// The steps it awaits.
    pub waiting_on: Vec<String>,
    /// `wait` (a suspension naming a settled step is refused; logs from before that say
    /// `redispatch` for one that crossed a settle).
    pub next: Next,
}

/// A new run of a session waits for the session's run before it.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct SessionWait {
    /// The run's own dispatch.
    pub step_key: String,
    /// Its attempt (0: it never started).
    pub attempt: u32,
    /// Empty: it awaits no step.
    pub waiting_on: Vec<String>,
    /// The session whose earlier run it waits for.
    pub session: String,
    /// `wait`.
    pub next: Next,
}

/// `agent:suspended`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AgentSuspended {
    /// The handler gave back its slot to await steps.
    Steps(Suspended),
    /// The run waits for its session's run before it.
    Session(SessionWait),
}

/// `tool:suspended`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ToolSuspended(pub Suspended);

/// `agent:resumed` and `tool:resumed`: a suspended dispatch is pending again.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Resumed {
    /// The woken dispatch's step.
    pub step_key: String,
    /// What woke it: the step that settled, or the session's run that ended.
    pub because: String,
}

/// `agent:resumed`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct AgentResumed(pub Resumed);

/// `tool:resumed`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ToolResumed(pub Resumed);

/// `subagent:start`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct SubagentStart {
    /// The subagent's step in the parent run.
    pub step_key: String,
    /// Its place in the handler's order.
    pub seq: u32,
    /// The child's agent.
    pub agent: String,
    /// The child run.
    pub child_run_id: String,
    /// The child's session, if any.
    pub session_key: Option<String>,
    /// The child's input: JSON, or the text as a string when it is not JSON.
    pub input: Value,
}

/// `question:asked`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct QuestionAsked {
    /// The question's step in the run.
    pub step_key: String,
    /// The call whose body asked.
    pub call: String,
    /// The tool that asked.
    pub tool: String,
    /// What the person is asked.
    pub question: String,
    /// The JSON Schema the answer must meet.
    pub schema: Value,
    /// Who may answer; empty: anyone who may answer approvals.
    pub approvers: Vec<String>,
    /// How long the question waits unanswered before it expires (ms); `null`: until the run ends.
    pub timeout_ms: Option<u64>,
    /// The answers a person picks from; absent: any that meets the schema.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// The answer an expiry records; absent: an expiry fails the question.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// A branch refused to start a subagent.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct BlockedSubagent {
    /// The subagent's step in the branch.
    pub step_key: String,
    /// Its place in the handler's order.
    pub seq: u32,
    /// The agent it would have started.
    pub agent: String,
    /// The session it would have joined.
    pub session_key: Option<String>,
    /// The input it would have had.
    pub input: Value,
    /// `error`.
    pub status: SettledStatus,
    /// `write_tool_blocked`.
    pub outcome: Outcome,
    /// Why the branch refused it.
    pub error: String,
}

/// `subagent:result`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SubagentResult {
    /// The child run ended (`child_run_id`, `child_status`), or the parent ended first.
    Settled(Settlement),
    /// A branch replayed the step.
    Replayed(Replayed),
    /// A branch refused to start the child.
    Blocked(BlockedSubagent),
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    use serde_json::{Value, json};

    use super::*;

    /// Panics unless `payload` is valid against the schema of `kind`.
    pub(super) fn assert_fits(kind: EventType, payload: &Value) {
        static VALIDATORS: OnceLock<Mutex<HashMap<EventType, Arc<jsonschema::Validator>>>> = OnceLock::new();
        let validator = VALIDATORS
            .get_or_init(Default::default)
            .lock()
            .expect("no test panicked holding the validators")
            .entry(kind)
            .or_insert_with(|| {
                let schema = schema(kind).to_value();
                Arc::new(jsonschema::validator_for(&schema).expect("a payload schema compiles"))
            })
            .clone();
        let errors: Vec<String> = validator.iter_errors(payload).map(|error| error.to_string()).collect();
        assert!(
            errors.is_empty(),
            "a {kind} payload does not fit its schema: {errors:?}\n{payload}"
        );
    }

    #[test]
    fn every_field_of_every_kind_says_what_it_means() {
        for kind in EventType::ALL {
            let schema = schema(*kind).to_value();
            let shapes = match schema.get("anyOf").and_then(Value::as_array) {
                Some(shapes) => shapes.clone(),
                None => vec![schema],
            };
            for shape in &shapes {
                assert_eq!(shape["additionalProperties"], json!(false), "{kind}: a closed object");
                let fields = shape["properties"].as_object().expect("a payload has fields");
                for (name, field) in fields {
                    let description = field.get("description").and_then(Value::as_str).unwrap_or_default();
                    assert!(!description.trim().is_empty(), "{kind}.{name} has no doc comment");
                }
            }
        }
    }

    #[test]
    fn a_payload_that_does_not_fit_its_schema_is_caught() {
        let fits = RunResumed {
            reason: "tool_approval".to_owned(),
        }
        .event();
        assert_eq!(fits.payload, json!({ "reason": "tool_approval" }));
        let caught = std::panic::catch_unwind(|| assert_fits(EventType::RunResumed, &json!({ "reason": 1 })));
        assert!(caught.is_err(), "a number where the schema says string");
        let caught =
            std::panic::catch_unwind(|| assert_fits(EventType::RunResumed, &json!({ "reason": "x", "more": 1 })));
        assert!(caught.is_err(), "a field the schema does not declare");
    }
}
