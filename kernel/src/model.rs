//! Domain types of the kernel: ids, statuses, tool definitions and the records the store returns.
//!
//! Nothing here knows about gRPC or SQLite; `grpc::convert` maps these to and from proto types and
//! `store` maps them to and from rows.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::KernelError;

/// Milliseconds since the Unix epoch; the store's clock unit.
pub type Millis = i64;

/// A run id: a UUIDv7 in its hyphenated text form, so ids sort by creation time.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId(String);

impl RunId {
    /// A fresh id.
    pub fn new() -> Self {
        RunId(uuid::Uuid::now_v7().hyphenated().to_string())
    }

    /// A fresh id in `shard` ([`crate::cluster::shards::shard_of`]).
    pub fn new_in_shard(shard: u32) -> Self {
        RunId(crate::cluster::shards::new_id_in_shard(shard))
    }

    /// Parses an id given by a client; `field` names the request field in the error.
    pub fn parse(text: &str, field: &str) -> Result<Self, KernelError> {
        let uuid = uuid::Uuid::parse_str(text.trim())
            .map_err(|_| KernelError::invalid(field, format!("'{}' is not a run id (a UUID)", cut(text, 64))))?;
        Ok(RunId(uuid.hyphenated().to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Declares an opaque id the kernel hands out (a UUIDv7 in its hyphenated text form) and a client
/// names back. Each kind is its own type, so one kind of id cannot be passed where another is meant;
/// the text, in rows, events and on the wire, is the id itself.
macro_rules! text_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// A fresh id.
            pub fn new() -> Self {
                $name(uuid::Uuid::now_v7().hyphenated().to_string())
            }

            /// A fresh id made in its run's shard, so a write naming only this id goes to the
            /// replica that owns the run ([`crate::cluster::shards::shard_of_text`]).
            pub fn in_shard_of(run: &RunId) -> Self {
                $name(crate::cluster::shards::new_id_in_shard(crate::cluster::shards::shard_of(run)))
            }

            /// The shard of the run this id was made for.
            pub fn shard(&self) -> u32 {
                crate::cluster::shards::shard_of_text(&self.0)
            }

            /// Reads an id a client names; `field` names the request field in the error. Only an
            /// empty id is malformed: an id the kernel never gave is a stale or forged one, which
            /// the rules refuse as such rather than as a bad request.
            pub fn parse(text: &str, field: &str) -> Result<Self, KernelError> {
                if text.is_empty() {
                    return Err(KernelError::invalid(field, "must not be empty"));
                }
                Ok($name(text.to_owned()))
            }

            /// Rebuilds an id read back from the store or named on a worker's session, as it was
            /// written.
            pub fn from_stored(text: String) -> Self {
                $name(text)
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        // Maps keyed by the id are looked up by the text a message names, before it is known to
        // be one of ours.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        // In the payloads' JSON Schema the id is a plain string, as it is in the JSON.
        impl schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> std::borrow::Cow<'static, str> {
                "String".into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string" })
            }
        }

        // Tests name ids by short literals.
        #[cfg(test)]
        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                $name(text.to_owned())
            }
        }

        #[cfg(test)]
        impl From<String> for $name {
            fn from(text: String) -> Self {
                $name(text)
            }
        }
    };
}

text_id!(
    /// The id of one attempt's dispatch to a worker: every message about the attempt names it,
    /// with the attempt's number, and only the holder of the current one may settle the step.
    DispatchId
);

text_id!(
    /// The id of a worker's session, from its hello until its stream ends: the leases it holds
    /// are its own.
    SessionId
);

text_id!(
    /// The id of a question put to a person about one call.
    ApprovalId
);

/// Declares a string-backed enum with its text form, used in rows, events and logs.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[doc = $doc:literal])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[doc = $doc])* $variant),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text form stored in rows and events.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// The value's doc comment, empty without one: what the reference pages say it means.
            pub fn doc(self) -> &'static str {
                match self { $($name::$variant => concat!($($doc, "\n"),*)),+ }
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err(format!("unknown {} '{}'", stringify!($name), other)),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        // A field of this type is a string of the enum's values in the payloads' JSON Schema.
        impl schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "enum": [$($text),+] })
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

// The event payloads' own small enums (machine::events) are text enums too.
pub(crate) use text_enum;

text_enum!(
    /// Lifecycle of a run.
    RunStatus {
        Pending => "pending",
        Running => "running",
        Blocked => "blocked",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
        Suspended => "suspended",
    }
);

impl RunStatus {
    /// Completed, failed and cancelled runs accept nothing more.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled)
    }
}

text_enum!(
    /// Lifecycle of one recorded tool call.
    StepStatus {
        Pending => "pending",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
        AwaitingApproval => "awaiting_approval",
        Suspended => "suspended",
    }
);

impl StepStatus {
    /// A terminal step has its one `tool:result` event.
    pub fn is_terminal(self) -> bool {
        matches!(self, StepStatus::Succeeded | StepStatus::Failed | StepStatus::Cancelled)
    }
}

text_enum!(
    /// What a recorded step is.
    StepKind {
        Tool => "tool",
        Agent => "agent",
        Local => "local",
        Subagent => "subagent",
        /// A question a tool body put to a person mid-call: settled with the person's answer.
        Question => "question",
    }
);

text_enum!(
    /// What a hosted handler's local step may do, as it declares: a branch may run `read` and
    /// `pure` steps live, never `write` ones.
    Effect {
        Read => "read",
        Pure => "pure",
        Write => "write",
    }
);

text_enum!(
    /// Why a settled call ended as it did: the closed set a program matches on, beside the text
    /// the model reads.
    Outcome {
        Ok => "ok",
        ToolError => "tool_error",
        InvalidArguments => "invalid_arguments",
        UnknownTool => "unknown_tool",
        Denied => "denied",
        Rejected => "rejected",
        Expired => "expired",
        TimedOut => "timed_out",
        Indeterminate => "indeterminate",
        Poison => "poison",
        Cancelled => "cancelled",
        ReplayInputChanged => "replay_input_changed",
        LimitExceeded => "limit_exceeded",
        NoWorker => "no_worker",
        WriteToolBlocked => "write_tool_blocked",
        BudgetExceeded => "budget_exceeded",
    }
);

text_enum!(
    /// What the kernel may do with a call whose worker was lost.
    Idempotency {
        SafeToRetry => "safe_to_retry",
        AtMostOnce => "at_most_once",
    }
);

text_enum!(
    /// Classifies a failed call for retry decisions.
    ErrorKind {
        Retryable => "retryable",
        Fatal => "fatal",
        Poison => "poison",
    }
);

text_enum!(
    /// How bad a tool's mistakes can be.
    RiskLevel {
        Low => "low",
        Medium => "medium",
        High => "high",
        Critical => "critical",
    }
);

text_enum!(
    /// The closed taxonomy of events. Every event carries `schema_version`.
    EventType {
        /// A run was created: its agent, input, labels, limits, permissions and capture, and what it came
        /// from (a parent run for a subagent, the run and step it was forked from for a branch).
        RunCreated => "run:created",
        /// A pending run started: at its first turn (with the turn's number), or, for a hosted run, when its
        /// handler's dispatch first started on a worker.
        RunStarted => "run:started",
        /// A call of a turn was recorded to run: its call hash, idempotency key and idempotency, timeout,
        /// retry policy, what decided it may run, and whether it waits for a person's approval first.
        ToolScheduled => "tool:scheduled",
        /// An attempt of a call started on a worker: the attempt's number, its dispatch id, the worker and
        /// session, and when its lease expires.
        ToolStart => "tool:start",
        /// A call's worker lost its lease and the call went back to pending, to be dispatched again with the
        /// same idempotency key (an `at_most_once` call, or one that lost its worker too often, is settled by
        /// a `tool:result` instead).
        ToolLeaseLost => "tool:lease_lost",
        /// An attempt failed with a retryable error or timed out, and the call's retry policy gives it
        /// another: the error and when the next attempt is due.
        ToolAttemptFailed => "tool:attempt_failed",
        /// The policy denied a call: settled at once as `denied`, without running, naming what decided it.
        ToolDenied => "tool:denied",
        /// The run blocked to ask a person to approve a call (reason `tool_approval`): the approval's id, the
        /// call and its arguments, the approvers, and when the question expires.
        RunInterrupted => "run:interrupted",
        /// The run's approvals were all answered and it runs again (reason `tool_approval`).
        RunResumed => "run:resumed",
        /// An approval was answered (approved or rejected, by whom, why) or expired.
        ApprovalAnswered => "approval:answered",
        /// A call settled, once: its status, outcome, and output or error. Also a call refused before
        /// running (the run's call limit, an unknown tool, invalid arguments, a write in a branch), a cache
        /// hit, a call rejected or expired at approval, one cancelled, and a step a branch replayed.
        ToolResult => "tool:result",
        /// The run completed, with its output.
        RunCompleted => "run:completed",
        /// The run failed, with its reason.
        RunFailed => "run:failed",
        /// The run was cancelled, with its reason.
        RunCancelled => "run:cancelled",
        /// An attempt of a hosted run's handler started on a worker: the attempt's number, its dispatch id,
        /// the worker and session, and when its lease expires.
        AgentDispatched => "agent:dispatched",
        /// A hosted run's handler lost its worker's lease; its dispatch went back to pending, to start again
        /// on a worker and replay what it recorded (one that lost its worker too often is settled by an
        /// `agent:result` instead).
        AgentLeaseLost => "agent:lease_lost",
        /// A hosted run's handler dispatch settled: with the handler's return value or its error, or failed
        /// by the kernel (a dispatch that lost its worker too often).
        AgentResult => "agent:result",
        /// A hosted handler's local step finished (or a branch replayed one from its parent): its place,
        /// identity, declared effect and outcome, recorded before the handler sees it.
        StepResult => "step:result",
        /// A hosted run's handler gave back its worker slot to wait for steps it awaits, none of them
        /// settled yet, and the run is suspended; or a new run of a session waits, before its first
        /// dispatch, for the session's run before it to end (`session` names it). A suspension naming
        /// nothing, a settled step or a step the handler does not await is refused and writes nothing.
        AgentSuspended => "agent:suspended",
        /// A suspended handler's wait ended (a step it may await settled, or its session's run before it
        /// ended); its dispatch is pending again.
        AgentResumed => "agent:resumed",
        /// A hosted handler started a subagent: the child run's id, its agent and its input.
        SubagentStart => "subagent:start",
        /// A subagent's step settled: its child run ended (a completed child gives its output, a failed or
        /// cancelled one an error), or a branch refused to start it.
        SubagentResult => "subagent:result",
        /// A tool body waiting on its subagents gave back its worker slot; the call waits, suspended, while
        /// its run goes on.
        ToolSuspended => "tool:suspended",
        /// A suspended tool call's wait ended (a step it may await settled, or its session's run before it
        /// ended); its dispatch is pending again.
        ToolResumed => "tool:resumed",
        /// A tool body asked a person a question mid-call: its step, the asking call, the question and the
        /// JSON Schema its answer must meet. The question is put to a person as approvals are (one at a
        /// time, `run:interrupted` with reason `human_input`); the answer settles the step.
        QuestionAsked => "question:asked",
    }
);

text_enum!(
    /// What inspection shows of a run's arguments and results; replay always has them.
    Capture {
        None => "none",
        Metadata => "metadata",
        Io => "io",
    }
);

/// Keys of event payloads that carry arguments, results or inputs.
const CAPTURED_KEYS: [&str; 5] = ["arguments", "output", "tool_input", "input", "value"];

impl Capture {
    /// What inspection shows of a JSON text.
    pub fn json_text(self, text: &str) -> String {
        match self {
            Capture::Io => text.to_owned(),
            _ => self.withheld(text).to_string(),
        }
    }

    fn withheld(self, text: &str) -> serde_json::Value {
        use sha2::{Digest, Sha256};
        match self {
            Capture::Metadata => serde_json::json!({
                "withheld": "capture=metadata",
                "bytes": text.len(),
                "sha256": hex::encode(Sha256::digest(text.as_bytes())),
            }),
            _ => serde_json::json!({ "withheld": "capture=none" }),
        }
    }

    /// What inspection shows of an error text: withheld only at `none` (errors may quote arguments).
    pub fn error_text(self, text: &str) -> String {
        match self {
            Capture::None if !text.is_empty() => "withheld (capture=none)".to_owned(),
            _ => text.to_owned(),
        }
    }

    /// What inspection shows of an event payload.
    pub fn payload(self, payload: &str) -> String {
        if self == Capture::Io {
            return payload.to_owned();
        }
        let Ok(serde_json::Value::Object(mut body)) = serde_json::from_str::<serde_json::Value>(payload) else {
            return payload.to_owned();
        };
        for key in CAPTURED_KEYS {
            if let Some(value) = body.get_mut(key)
                && !value.is_null()
            {
                *value = self.withheld(&value.to_string());
            }
        }
        if self == Capture::None
            && let Some(serde_json::Value::String(error)) = body.get_mut("error")
        {
            *error = self.error_text(error);
        }
        serde_json::Value::Object(body).to_string()
    }
}

/// The version of every event body this kernel writes.
pub const EVENT_SCHEMA_VERSION: u32 = 1;

/// A step's identity within its run: `t<turn>/p<position>`, or `id:<call id>` when the agent
/// names the call. The idempotency key handed to tools is derived from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepKey(String);

impl StepKey {
    /// The identity of a call at `position` of `turn`, or of the named call.
    pub fn for_call(turn: u32, position: u32, call_id: Option<&str>) -> Self {
        StepKey(kernel_proto::canonical::call_step_key(turn, position, call_id))
    }

    /// The turn of a call the agent made at a position without naming it (`t3/p0` is turn 3's).
    pub fn positional_turn(&self) -> Option<u32> {
        let (turn, position) = self.0.strip_prefix('t')?.split_once("/p")?;
        let number = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| s.parse::<u32>().ok())
                .flatten()
        };
        number(position)?;
        number(turn)
    }

    /// The identity of a hosted run's own dispatch, one per run.
    pub fn agent() -> Self {
        StepKey("agent".to_owned())
    }

    /// The identity of a hosted handler's subagent: the agent and how many it started before.
    pub fn subagent(agent: &str, occurrence: u32) -> Self {
        StepKey(format!("subagent:{agent}#{occurrence}"))
    }

    /// The identity of a subagent a tool call's body started: the call's key, the agent and how
    /// many of it the body started before (`subagent:t3/p0/researcher#0`).
    pub fn tool_subagent(call: &StepKey, agent: &str, occurrence: u32) -> Self {
        StepKey(format!("subagent:{}/{agent}#{occurrence}", call.0))
    }

    /// The identity of a question a tool call's body put to a person: the call's key and how many
    /// the body asked before (`question:t3/p0#0`).
    pub fn tool_question(call: &StepKey, occurrence: u32) -> Self {
        StepKey(format!("question:{}#{occurrence}", call.0))
    }

    /// The identity of a question an external agent's code put to a person under its own id
    /// (`question:run#confirm-refund`).
    pub fn run_question(id: &str) -> Self {
        StepKey(format!("question:run#{id}"))
    }

    /// The identity of a call a tool call's body made through the kernel (`ctx.call`): the
    /// caller's key and how many calls the body made before (`call:t3/p0#0`). The callee's
    /// idempotency key derives from it, so it is stable across the caller's attempts.
    pub fn nested_call(caller: &StepKey, occurrence: u32) -> Self {
        StepKey(format!("call:{}#{occurrence}", caller.0))
    }

    /// For a call a tool call's body made through the kernel, the caller's key.
    pub fn caller(&self) -> Option<StepKey> {
        let rest = self.0.strip_prefix("call:")?;
        rest.rfind('#').map(|end| StepKey(rest[..end].to_owned()))
    }

    /// Whether this is a question `caller`'s body asked or a call it made through the kernel: what
    /// the caller leaves open when it settles is withdrawn.
    pub fn began_by(&self, caller: &StepKey) -> bool {
        ["question:", "call:"].iter().any(|kind| {
            self.0
                .strip_prefix(kind)
                .and_then(|rest| rest.strip_prefix(caller.as_str()))
                .and_then(|rest| rest.strip_prefix('#'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    }

    /// Whether a call's body began this step: a question it asked or a call it made.
    pub fn is_dependent(&self) -> bool {
        self.0.starts_with("question:") || self.0.starts_with("call:")
    }

    /// For a question a tool call's body asked, that call's key.
    pub fn asking_call(&self) -> Option<StepKey> {
        let rest = self.0.strip_prefix("question:")?;
        rest.rfind('#').map(|end| StepKey(rest[..end].to_owned()))
    }

    /// Whether this is a question a tool call's body asked.
    pub fn is_question(&self) -> bool {
        self.asking_call().is_some()
    }

    /// For a subagent a tool call started, a question it asked or a call it made, that call's
    /// key: the step to wake when it settles.
    pub fn waiter(&self) -> Option<StepKey> {
        if let Some(call) = self.asking_call().or_else(|| self.caller()) {
            return Some(call);
        }
        let rest = self.0.strip_prefix("subagent:")?;
        rest.rfind('/').map(|end| StepKey(rest[..end].to_owned()))
    }

    /// The identity of a hosted handler's local step.
    pub fn local(step_id: &str, occurrence: u32) -> Self {
        StepKey(kernel_proto::canonical::local_step_key(step_id, occurrence))
    }

    /// Rebuilds a key read back from the store.
    pub fn from_stored(text: String) -> Self {
        StepKey(text)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's text, taken.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The key a tool receives to deduplicate its effect: stable across retries, redispatches and
    /// resubmissions of the same call.
    pub fn idempotency_key(&self, run: &RunId) -> String {
        kernel_proto::canonical::idempotency_key(run.as_str(), &self.0)
    }
}

impl fmt::Display for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a failed call is tried again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RetryPolicy {
    /// Total attempts including the first.
    pub max_attempts: u32,
    /// Wait before the second attempt.
    pub initial_interval_ms: u64,
    /// Growth of the wait per attempt.
    pub backoff_coefficient: f64,
    /// Cap on the wait.
    pub max_interval_ms: u64,
}

impl RetryPolicy {
    /// Attempts allowed in all, at least one.
    pub fn attempts(policy: Option<&RetryPolicy>) -> u32 {
        policy.map(|p| p.max_attempts.max(1)).unwrap_or(1)
    }

    /// The wait after failed attempt `attempt` (1-based): initial × coefficient^(attempt-1), capped.
    pub fn delay_ms(&self, attempt: u32) -> u64 {
        let coefficient = if self.backoff_coefficient.is_finite() && self.backoff_coefficient >= 1.0 {
            self.backoff_coefficient
        } else {
            1.0
        };
        let raw = self.initial_interval_ms as f64 * coefficient.powi(attempt.saturating_sub(1).min(64) as i32);
        let capped = if self.max_interval_ms > 0 {
            raw.min(self.max_interval_ms as f64)
        } else {
            raw
        };
        capped.min(u64::MAX as f64 / 2.0) as u64
    }
}

/// A tool's declared behaviour and metadata, as announced by its workers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolOptions {
    /// Per-call timeout; `None` means the kernel default.
    pub timeout_ms: Option<u64>,
    /// Retry policy; `None` means no retry.
    pub retry: Option<RetryPolicy>,
    /// `safe_to_retry` unless declared.
    pub idempotency: Option<String>,
    /// Free of side effects.
    pub read_only: bool,
    /// Has side effects.
    pub writes: bool,
    /// Team or person who owns the tool.
    pub owner: String,
    /// Risk rating, if declared.
    pub risk: Option<String>,
    /// Permissions a run needs to call the tool.
    pub permissions: Vec<String>,
    /// External resources the tool may change.
    pub resources: Vec<String>,
    /// Cost of one call.
    pub cost_per_call: f64,
    /// Result cache lifetime.
    pub cache_ttl_ms: Option<u64>,
    /// Always ask a person.
    pub requires_approval: bool,
    /// CEL predicate over `args` deciding whether to ask.
    pub requires_approval_expr: String,
    /// How long a person may take to answer.
    pub approval_timeout_ms: Option<u64>,
    /// Runs on a thread that cannot be interrupted.
    pub blocking: bool,
    /// Null-valued optional arguments are dropped before the call is validated and recorded.
    #[serde(default)]
    pub strip_nulls: bool,
    /// The approval predicate is code in the worker: a worker offering the tool is asked before
    /// each new call is recorded.
    #[serde(default)]
    pub approval_predicate_in_worker: bool,
    /// The tool's own rate and concurrency limit, beside the policy file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<crate::machine::throttle::DeclaredLimit>,
    /// Top-level argument and result fields kept out of the record ([`crate::secrets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret: Vec<String>,
}

impl ToolOptions {
    /// The declared idempotency mode, `safe_to_retry` by default.
    pub fn idempotency(&self) -> Idempotency {
        self.idempotency
            .as_deref()
            .and_then(|text| text.parse().ok())
            .unwrap_or(Idempotency::SafeToRetry)
    }
}

/// A registered tool: what a worker announced, checked by the kernel.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolDef {
    /// `[a-zA-Z0-9_-]{1,64}`.
    pub name: String,
    /// What the model reads about the tool.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Value,
    /// Declared version; empty when none.
    pub version: String,
    /// sha256 over the canonical JSON of name, description, schema and version.
    pub fingerprint: String,
    /// Declared behaviour.
    pub options: ToolOptions,
}

/// An agent a worker hosts, as it announced it: the kernel dispatches runs of it to such workers.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentDef {
    /// `[a-zA-Z0-9_-]{1,64}`, as tool names.
    pub name: String,
    pub description: String,
    /// JSON Schema of a run's input; `true` accepts any.
    pub input_schema: Value,
    pub version: String,
    /// sha256 over the canonical JSON of name, description, schema and version.
    pub fingerprint: String,
    /// Runs of it one worker hosts at once; `None` bounds them only by the worker's slots.
    pub max_concurrency: Option<u32>,
}

/// The longest tool name a worker may register.
pub const MAX_TOOL_NAME: usize = 64;

/// Checks a tool name against `[a-zA-Z0-9_-]{1,64}`.
pub fn validate_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_TOOL_NAME {
        return Err(format!(
            "'{}…' is longer than {MAX_TOOL_NAME} characters",
            cut(name, 64)
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "'{name}' has the character {bad:?}; allowed are a-z, A-Z, 0-9, _ and -"
        ));
    }
    Ok(())
}

/// Cuts text to at most `max` characters, on a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((index, _)) => &text[..index],
        None => text,
    }
}

/// A run as the store holds it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    pub id: RunId,
    pub agent: String,
    pub status: RunStatus,
    /// Canonical JSON text.
    pub input: String,
    /// Canonical JSON text, once completed.
    pub output: Option<String>,
    pub reason: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub max_tool_calls: u32,
    /// A non-interactive run cannot wait for a person.
    pub interactive: bool,
    /// Permissions granted to the run, for policies that require them.
    pub permissions: Vec<String>,
    /// What inspection shows of its arguments and results.
    pub capture: Capture,
    /// The API key that granted the run its permissions; `None` without an auth file.
    pub granted_by: Option<String>,
    /// The kernel dispatches the run's handler to workers offering its agent.
    pub hosted: bool,
    /// Times a hosted run's handler was dispatched.
    pub dispatches: u32,
    /// The run that started this one as a subagent, and its step waiting for it.
    pub parent: Option<(RunId, StepKey)>,
    /// Subagents with one session key run one at a time, in order of start.
    pub session_key: Option<String>,
    /// Times a hosted run's handler gave back its slot to wait.
    pub suspensions: u32,
    /// The default bound on how many calls of one turn run at once; 0: none.
    pub max_concurrency: u32,
    /// A branch: the run whose record it replays, up to where.
    pub fork: Option<Fork>,
    /// A case run's allow tokens (`tool:<name>`, `step:<id>`): what runs live despite the
    /// branch rule.
    pub allow: Vec<String>,
    /// The W3C trace context the run's span is a child of: the agent's `traceparent`, or for a
    /// subagent its parent run's span.
    #[serde(with = "crate::wire::traceparent")]
    pub trace: Option<crate::traces::TraceParent>,
    pub tool_calls: u32,
    /// What the run may spend on tool calls and has spent; `None`: no budget covers it.
    pub budget: Option<crate::machine::budget::Budget>,
    pub last_seq: u64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// What a branch replays: its parent's record, up to its fork point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fork {
    /// The run whose record the branch replays.
    pub of: RunId,
    /// The last step of that record the branch replays; `None`: all of it.
    pub at: Option<ForkPoint>,
    /// Recorded results the fork replaced: step key → canonical JSON text.
    #[serde(default)]
    pub results: std::collections::BTreeMap<String, String>,
}

/// The last step a branch replays, and its place in its run's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForkPoint {
    pub key: StepKey,
    pub turn: u32,
    pub position: u32,
}

impl Fork {
    /// Whether the parent's step is at or before the fork point, in (turn, position) order.
    pub fn covers(&self, step: &StepRecord) -> bool {
        self.at
            .as_ref()
            .is_none_or(|at| (step.turn, step.position) <= (at.turn, at.position))
    }
}

/// A lock a running call holds on a resource instance.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResourceLock {
    pub resource: String,
    pub run_id: String,
    pub step_key: String,
    pub tool: String,
    pub attempt: u32,
    pub acquired_at: Millis,
}

/// A tool call as the store holds it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    pub run_id: RunId,
    pub key: StepKey,
    pub kind: StepKind,
    /// A local step's declared effect.
    pub effect: Option<Effect>,
    /// At most this many calls of the step's turn run at once.
    pub max_concurrency: Option<u32>,
    /// The step belongs to a hosted run: settling it may wake the run's suspended handler.
    pub hosted: bool,
    pub turn: u32,
    pub position: u32,
    pub call_id: Option<String>,
    pub tool: String,
    pub fingerprint: String,
    pub version: String,
    /// Canonical JSON text of the arguments.
    pub arguments: String,
    pub call_hash: String,
    pub idempotency_key: String,
    pub idempotency: Idempotency,
    pub timeout_ms: u64,
    pub status: StepStatus,
    pub attempts: u32,
    /// Canonical JSON text of the result, when succeeded.
    pub output: Option<String>,
    pub error: Option<String>,
    pub error_kind: Option<ErrorKind>,
    pub worker: Option<String>,
    pub session_id: Option<SessionId>,
    /// The kernel replica holding the step's lease while it runs (its writer recorded the start).
    pub replica: Option<String>,
    pub dispatch_id: Option<DispatchId>,
    pub lease_expires_at: Option<Millis>,
    pub created_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub replays: u32,
    pub progress_count: u32,
    /// The retry policy captured when the call was recorded, so a restart retries the same way.
    pub retry: Option<RetryPolicy>,
    /// The tool runs on a thread that cannot be stopped: a timeout is not retried.
    pub blocking: bool,
    /// A retry waits until this time.
    pub not_before: Option<Millis>,
    /// Times a worker was lost while holding this call.
    pub lease_losses: u32,
    /// Price of one attempt, fixed when the call was recorded.
    pub unit_cost: f64,
    /// What the attempts that ran cost.
    pub cost: f64,
    /// The policy preset, rule or tool flag whose decision let the call through, denied or gated it.
    pub decided_by: Option<String>,
    /// Set while the call waits for a person (or waits to be asked).
    pub approval_gate: Option<ApprovalGate>,
    /// A read_only tool's cache TTL: a success is kept for identical calls this long.
    pub cache_ttl_ms: Option<u64>,
    /// Why the step ended as it did; `None` while it is not settled.
    pub outcome: Option<Outcome>,
    /// The answer to the step's approval, once someone (or the clock) gave one.
    pub approval: Option<ApprovalDecision>,
    /// The resources the call may change, filled from its arguments; those with an instance
    /// (`repo:acme`) are locks it holds while it runs ([`crate::resources`]).
    pub resources: Vec<String>,
    /// In a branch: the run whose recorded outcome the step replays (nothing ran).
    pub from_run: Option<RunId>,
    /// The tool limits (the policy file's `limits`, by their `tools`) its last start passed: while
    /// it runs it holds a slot of each that bounds calls at once.
    pub limited_by: Vec<String>,
    /// How long its last start waited in the queue for those limits, in milliseconds.
    pub limit_wait_ms: u64,
    /// Its run's share of the queue when it was recorded: the value of the run's label that the
    /// policy's `fair_shares.label` names (`None`: the run had no such label, or no label counted).
    pub share: Option<String>,
    /// Its run's trace context, copied when the step was recorded, so a dispatch and its spans
    /// need no read of the run.
    #[serde(with = "crate::wire::traceparent")]
    pub trace: Option<crate::traces::TraceParent>,
    /// Its secret argument values, sealed until its dispatch ([`crate::secrets`]); never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
}

impl StepRecord {
    /// The step's outcome; for a step settled before outcomes were recorded, the best reading of
    /// its status.
    pub fn outcome(&self) -> Option<Outcome> {
        outcome_of(self.outcome, self.status)
    }

    /// What the step's caller is answered: its result as it stands.
    pub fn result(&self) -> RecordedResult {
        RecordedResult {
            key: self.key.clone(),
            tool: self.tool.clone(),
            call_hash: self.call_hash.clone(),
            status: self.status,
            attempts: self.attempts,
            output: self.output.clone(),
            error: self.error.clone(),
            error_kind: self.error_kind,
            outcome: self.outcome,
            decided_by: self.decided_by.clone(),
            approval: self.approval.clone(),
        }
    }
}

/// The part of a step its caller is answered with: what a turn served from the log reads of each
/// call, a sixth of a step's columns.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedResult {
    pub key: StepKey,
    pub tool: String,
    pub call_hash: String,
    pub status: StepStatus,
    pub attempts: u32,
    pub output: Option<String>,
    pub error: Option<String>,
    pub error_kind: Option<ErrorKind>,
    pub outcome: Option<Outcome>,
    pub decided_by: Option<String>,
    pub approval: Option<ApprovalDecision>,
}

impl RecordedResult {
    /// As [`StepRecord::outcome`].
    pub fn outcome(&self) -> Option<Outcome> {
        outcome_of(self.outcome, self.status)
    }
}

/// A step's recorded outcome, or for a step settled before outcomes were recorded, the best
/// reading of its status.
fn outcome_of(recorded: Option<Outcome>, status: StepStatus) -> Option<Outcome> {
    recorded.or(match status {
        StepStatus::Succeeded => Some(Outcome::Ok),
        StepStatus::Cancelled => Some(Outcome::Cancelled),
        StepStatus::Failed => Some(Outcome::ToolError),
        _ => None,
    })
}

/// A person's (or the clock's) answer to a gated call, kept on the step it decided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    pub approval_id: ApprovalId,
    /// `approved`, `rejected` or `expired`.
    pub answer: ApprovalStatus,
    pub decider: String,
    pub reason: Option<String>,
    pub answered_at: Millis,
}

/// What a person is asked before a gated call may start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalGate {
    /// How long the person may take; `None` waits indefinitely.
    pub timeout_ms: Option<u64>,
    /// Who may answer (advisory until API keys exist).
    pub approvers: Vec<String>,
    /// What the approver is told.
    pub message: Option<String>,
    /// The rule or flag that asked.
    pub decided_by: String,
}

text_enum!(
    /// Lifecycle of an approval.
    ApprovalStatus {
        Pending => "pending",
        Approved => "approved",
        Consumed => "consumed",
        Rejected => "rejected",
        Expired => "expired",
        Cancelled => "cancelled",
    }
);

/// A question put to a person about one call.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalRecord {
    pub id: ApprovalId,
    pub run_id: RunId,
    pub key: StepKey,
    pub tool: String,
    pub call_hash: String,
    /// Canonical JSON text of the arguments the approval covers.
    pub arguments: String,
    pub status: ApprovalStatus,
    pub approvers: Vec<String>,
    pub message: Option<String>,
    pub decided_by: String,
    pub requested_at: Millis,
    pub expires_at: Option<Millis>,
    pub answered_at: Option<Millis>,
    pub decider: Option<String>,
    pub reason: Option<String>,
    /// The run's capture level, for what inspection shows of the arguments.
    pub capture: Capture,
    /// A question's answer, as canonical JSON, once a person gave it.
    pub answer: Option<String>,
}

impl ApprovalRecord {
    /// Whether this asks a person for an answer (a tool body's question) rather than for leave to
    /// run a call.
    pub fn is_question(&self) -> bool {
        self.key.is_question()
    }
}

/// One entry of a run's log.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRecord {
    pub run_id: RunId,
    pub seq: u64,
    pub kind: EventType,
    pub schema_version: u32,
    pub at: Millis,
    /// JSON text.
    pub payload: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_follow_the_pattern() {
        assert!(validate_tool_name("read_file-2").is_ok());
        assert!(validate_tool_name("").is_err());
        assert!(validate_tool_name("has space").unwrap_err().contains("' '"));
        assert!(validate_tool_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn step_keys_and_idempotency_keys_are_stable() {
        let run = RunId::new();
        let key = StepKey::for_call(2, 1, None);
        assert_eq!(key.as_str(), "t2/p1");
        assert_eq!(StepKey::for_call(2, 1, Some("order-9")).as_str(), "id:order-9");
        assert_eq!(key.idempotency_key(&run), key.idempotency_key(&run));
        assert_ne!(
            key.idempotency_key(&run),
            StepKey::for_call(2, 2, None).idempotency_key(&run)
        );
    }

    #[test]
    fn only_a_positional_call_key_names_its_turn() {
        assert_eq!(StepKey::for_call(12, 3, None).positional_turn(), Some(12));
        let not_positional = [
            StepKey::for_call(2, 1, Some("t2/p1")),
            StepKey::nested_call(&StepKey::for_call(2, 1, None), 0),
            StepKey::local("t2/p1", 0),
            StepKey::agent(),
        ];
        for key in not_positional {
            assert_eq!(key.positional_turn(), None, "{key:?}");
        }
        for text in [
            "t2/p",
            "t/p1",
            "t2/p1/x",
            "t2/px",
            "tt2/p1",
            "t99999999999/p0",
            "t2/p99999999999",
            "t+2/p1",
        ] {
            assert_eq!(StepKey(text.to_owned()).positional_turn(), None, "{text}");
        }
    }

    #[test]
    fn a_nested_call_names_its_caller_however_deep_and_whatever_the_caller_s_id_holds() {
        let run = RunId::new();
        let caller = StepKey::for_call(3, 0, None);
        let nested = StepKey::nested_call(&caller, 1);
        assert_eq!(nested.as_str(), "call:t3/p0#1");
        assert_eq!(nested.caller(), Some(caller.clone()));
        assert_eq!(nested.waiter(), Some(caller.clone()));
        let deeper = StepKey::nested_call(&nested, 0);
        assert_eq!(deeper.caller(), Some(nested.clone()));
        let named = StepKey::for_call(0, 0, Some("a#b/c"));
        assert_eq!(StepKey::nested_call(&named, 2).caller(), Some(named));
        assert_ne!(nested.idempotency_key(&run), caller.idempotency_key(&run));
        assert_eq!(caller.caller(), None);
        assert_eq!(StepKey::tool_question(&caller, 0).caller(), None);
        assert!(nested.began_by(&caller) && StepKey::tool_question(&caller, 3).began_by(&caller));
        assert!(!deeper.began_by(&caller), "a call's call is its callee's");
        assert!(!StepKey::nested_call(&StepKey::for_call(3, 1, None), 0).began_by(&StepKey::for_call(3, 10, None)));
        assert!(!StepKey::tool_subagent(&caller, "researcher", 0).began_by(&caller));
    }

    #[test]
    fn run_ids_parse_and_reject_garbage() {
        let id = RunId::new();
        assert_eq!(RunId::parse(id.as_str(), "run_id").unwrap(), id);
        let err = RunId::parse("nope", "run_id").unwrap_err();
        assert!(err.to_string().contains("run_id"));
    }

    #[test]
    fn dispatch_session_and_approval_ids_are_plain_text() {
        let id = DispatchId::new();
        assert!(uuid::Uuid::parse_str(id.as_str()).is_ok(), "{id}");
        assert_eq!(DispatchId::parse(id.as_str(), "dispatch_id").unwrap(), id);
        // An id the kernel never gave is no bad request: the rules refuse it as stale or forged.
        assert_eq!(
            SessionId::parse("not-a-uuid", "session_id").unwrap().as_str(),
            "not-a-uuid"
        );
        let err = ApprovalId::parse("", "approval_id").unwrap_err();
        assert_eq!(
            err.to_string(),
            KernelError::invalid("approval_id", "must not be empty").to_string()
        );
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<DispatchId>(&format!("\"{id}\"")).unwrap(), id);
    }

    #[test]
    fn retry_delays_grow_and_cap() {
        let policy = RetryPolicy {
            max_attempts: 5,
            initial_interval_ms: 100,
            backoff_coefficient: 2.0,
            max_interval_ms: 350,
        };
        assert_eq!([1, 2, 3, 4].map(|a| policy.delay_ms(a)), [100, 200, 350, 350]);
        assert_eq!(RetryPolicy::attempts(None), 1);
        assert_eq!(
            RetryPolicy::attempts(Some(&RetryPolicy {
                max_attempts: 0,
                ..policy
            })),
            1
        );
    }

    #[test]
    fn capture_withholds_what_it_must() {
        let payload = r#"{"arguments":{"card":"4111"},"error":"card 4111 declined","tool":"charge"}"#;
        assert_eq!(Capture::Io.payload(payload), payload);
        let metadata = Capture::Metadata.payload(payload);
        assert!(
            !metadata.contains("4111\"}") && metadata.contains("capture=metadata") && metadata.contains("declined")
        );
        let none = Capture::None.payload(payload);
        assert!(!none.contains("4111") && none.contains("\"tool\":\"charge\""), "{none}");
        assert_eq!(Capture::None.json_text("{}"), r#"{"withheld":"capture=none"}"#);
    }

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut("héllo", 2), "hé");
        assert_eq!(cut("ab", 5), "ab");
    }

    #[test]
    fn statuses_round_trip_through_text() {
        for status in [RunStatus::Pending, RunStatus::Cancelled] {
            assert_eq!(status.as_str().parse::<RunStatus>().unwrap(), status);
        }
        assert!(StepStatus::Succeeded.is_terminal());
        assert!(!StepStatus::Running.is_terminal());
    }
}
