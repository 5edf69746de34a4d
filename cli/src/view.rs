//! The one place where generated proto messages become what `kernelctl` prints.
//!
//! Each `*View` is a plain serde-serializable struct: `--json` prints it as is and
//! [`crate::render`] draws tables from it, so both outputs agree field for field. The conversion
//! spells enums as lowercase words without their proto prefix (`running`, `safe_to_retry`),
//! timestamps as RFC 3339, and embeds the JSON-text fields (`input_json`, `arguments_json`, ...)
//! as parsed JSON, falling back to the raw string when the text does not parse. Proto3's "empty
//! means absent" strings and "0 means default" numbers become `null`.

use std::collections::BTreeMap;
use std::time::Duration;

use kernel_proto::v1 as pb;
use serde::Serialize;
use serde_json::Value;

use crate::error::CliError;
use crate::time::UtcTime;

/// A JSON-text field from the wire: parsed when it is valid JSON, else kept as the raw text.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Json {
    Value(Value),
    Unparsed(String),
}

impl Json {
    /// Parses a JSON-text field; `None` when the field is empty.
    pub fn parse(text: &str) -> Option<Self> {
        if text.trim().is_empty() {
            return None;
        }
        Some(match serde_json::from_str(text) {
            Ok(value) => Json::Value(value),
            Err(_) => Json::Unparsed(text.to_owned()),
        })
    }

    /// Parses a JSON-text field whose empty form means `default`.
    fn parse_or(text: &str, default: Value) -> Self {
        Self::parse(text).unwrap_or(Json::Value(default))
    }

    /// Compact JSON text (keys sorted), or the raw text when it never parsed.
    pub fn compact(&self) -> String {
        match self {
            Json::Value(value) => value.to_string(),
            Json::Unparsed(text) => text.clone(),
        }
    }
}

/// A run, as printed by `runs list` and `runs show`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunView {
    pub id: String,
    pub agent: String,
    pub status: String,
    pub reason: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub input: Json,
    pub output: Option<Json>,
    pub tool_calls: u32,
    /// `None` when unlimited.
    pub max_tool_calls: Option<u32>,
    pub last_seq: u64,
    pub created_at: Option<UtcTime>,
    pub updated_at: Option<UtcTime>,
    pub non_interactive: bool,
    pub permissions: Vec<String>,
    /// The API key that granted the permissions; `None` without an auth file (the run's claim).
    pub permissions_granted_by: Option<String>,
    /// What inspection shows of arguments and results: `io`, `metadata` or `none`.
    pub capture: String,
    /// The kernel dispatches the run's handler to workers hosting its agent.
    pub hosted: bool,
    /// Times a hosted run's handler was dispatched, and gave back its slot to wait.
    pub dispatches: u32,
    pub suspensions: u32,
    /// The run that started this one as a subagent, and its step waiting for it.
    pub parent_run_id: Option<String>,
    pub parent_step_key: Option<String>,
    pub session_key: Option<String>,
    /// The OpenTelemetry trace of its spans.
    pub trace_id: Option<String>,
    /// A branch: the run whose record it replays, and the last of that record's steps it
    /// replays (`None`: all of them).
    pub forked_from_run_id: Option<String>,
    pub fork_at_step_key: Option<String>,
    /// Steps whose recorded result the fork replaced, with the result it put in their place.
    pub fork_results: BTreeMap<String, Json>,
    /// A case run's allow tokens (`tool:<name>`, `step:<id>`): what runs live besides reads.
    pub allow: Vec<String>,
    /// What the run may spend on tool calls, each limit with what it has spent.
    pub budget: Vec<BudgetView>,
    /// A subagent whose calls are charged to its parent's budget too.
    pub budget_under_parent: bool,
}

/// One limit of a run's budget and what it has spent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetView {
    /// The tools it counts, a glob; `None`: every tool.
    pub tools: Option<String>,
    pub max_calls: Option<u64>,
    pub max_cost: Option<f64>,
    pub spent_calls: u64,
    pub spent_cost: f64,
    /// At most this much tool run time, in milliseconds.
    pub max_time_ms: Option<u64>,
    /// The run time of the attempts that ended, each at most its timeout.
    pub spent_time_ms: u64,
    /// The timeouts of the attempts running, held against `max_time_ms`.
    pub reserved_time_ms: u64,
    /// `request`, `parent`, or the policy file's `policy:budgets[i]`.
    pub set_by: Option<String>,
}

impl From<pb::BudgetLimit> for BudgetView {
    fn from(limit: pb::BudgetLimit) -> Self {
        BudgetView {
            tools: non_empty(limit.tools),
            max_calls: limit.max_calls,
            max_cost: limit.max_cost,
            spent_calls: limit.spent_calls,
            spent_cost: limit.spent_cost,
            max_time_ms: limit.max_time_ms,
            spent_time_ms: limit.spent_time_ms,
            reserved_time_ms: limit.reserved_time_ms,
            set_by: non_empty(limit.set_by),
        }
    }
}

impl From<pb::Run> for RunView {
    fn from(run: pb::Run) -> Self {
        Self {
            status: run_status_name(run.status),
            reason: non_empty(run.reason),
            labels: run.labels.into_iter().collect(),
            idempotency_key: non_empty(run.idempotency_key),
            input: Json::parse_or(&run.input_json, Value::Null),
            output: Json::parse(&run.output_json),
            tool_calls: run.tool_calls,
            max_tool_calls: non_zero(run.max_tool_calls),
            last_seq: run.last_seq,
            created_at: run.created_at.map(UtcTime::from),
            updated_at: run.updated_at.map(UtcTime::from),
            non_interactive: run.non_interactive,
            permissions: run.permissions,
            permissions_granted_by: non_empty(run.permissions_granted_by),
            capture: match pb::Capture::try_from(run.capture) {
                Ok(pb::Capture::None) => "none",
                Ok(pb::Capture::Metadata) => "metadata",
                _ => "io",
            }
            .to_owned(),
            hosted: run.hosted,
            dispatches: run.dispatches,
            suspensions: run.suspensions,
            parent_run_id: non_empty(run.parent_run_id),
            parent_step_key: non_empty(run.parent_step_key),
            session_key: non_empty(run.session_key),
            trace_id: non_empty(run.trace_id),
            forked_from_run_id: non_empty(run.forked_from_run_id),
            fork_at_step_key: non_empty(run.fork_at_step_key),
            fork_results: run
                .fork_results
                .into_iter()
                .map(|(step, text)| (step, Json::parse_or(&text, Value::Null)))
                .collect(),
            allow: run.allow,
            budget: run.budget.into_iter().map(BudgetView::from).collect(),
            budget_under_parent: run.budget_under_parent,
            id: run.id,
            agent: run.agent,
        }
    }
}

/// Why a step failed, and how the kernel classifies it for retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepError {
    pub message: String,
    /// `retryable`, `fatal` or `poison`; `None` when the kernel did not classify it.
    pub kind: Option<String>,
}

/// One recorded tool call of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    pub key: String,
    /// `tool`, `agent` (a hosted run's own dispatch), `local` (a handler's step) or `subagent`.
    pub kind: String,
    /// A local step's declared effect: `read`, `pure` or `write`.
    pub effect: Option<String>,
    /// A subagent step's child run.
    pub child_run_id: Option<String>,
    /// What the call may change, instances filled from its arguments (`repo:acme/api` is a lock
    /// it holds while it runs).
    pub resources: Vec<String>,
    /// The tool limits its last attempt's start passed (the policy file's `limits`, by glob).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limited_by: Vec<String>,
    /// How long that start waited in the queue for those limits, in milliseconds.
    pub limit_wait_ms: u64,
    /// The run's fair share when the call was recorded (its value of the fair-share label).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<String>,
    /// A call a tool's body made through the kernel (`ctx.call`): the calling step's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller_step_key: Option<String>,
    pub turn: u32,
    pub position: u32,
    pub call_id: Option<String>,
    pub tool: String,
    pub tool_version: Option<String>,
    pub tool_fingerprint: String,
    pub arguments: Json,
    pub call_hash: String,
    pub idempotency_key: String,
    pub status: String,
    pub attempts: u32,
    pub output: Option<Json>,
    pub error: Option<StepError>,
    pub worker: Option<String>,
    pub dispatch_id: Option<String>,
    pub lease_expires_at: Option<UtcTime>,
    pub created_at: Option<UtcTime>,
    pub started_at: Option<UtcTime>,
    pub finished_at: Option<UtcTime>,
    /// From start to finish; `None` until the step has finished.
    pub duration_ms: Option<u64>,
    pub replays: u32,
    pub progress_count: u32,
    /// When a failed attempt will be tried again.
    pub next_attempt_at: Option<UtcTime>,
    /// Attempts the call may take in all (1 = no retry).
    pub max_attempts: u32,
    /// Times the worker holding the call was lost.
    pub lease_losses: u32,
    /// "safe_to_retry" or "at_most_once".
    pub idempotency: Option<String>,
    pub timeout_ms: u64,
    /// What the attempts that ran cost.
    pub cost: f64,
    pub unit_cost: f64,
    /// The policy preset, rule or tool flag that allowed, denied or gated the call.
    pub decided_by: Option<String>,
    /// Why the call ended as it did (`ok`, `denied`, `indeterminate`, ...); `None` until settled.
    pub outcome: Option<String>,
    /// The answer to the call's approval, when it was gated and answered.
    pub approval: Option<StepApproval>,
    /// In a branch: the run whose recorded outcome this step replays (nothing ran); `decided_by`
    /// is then `branch:parent`, or `branch:set_result` when the fork replaced that outcome.
    pub replayed_from_run_id: Option<String>,
}

/// The answer a gated call got, as `runs show` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepApproval {
    pub approval_id: String,
    /// `approved`, `rejected` or `expired`.
    pub answer: String,
    pub decider: String,
    pub reason: Option<String>,
}

impl StepView {
    /// The status people read: a settled call that did not succeed shows why (`denied`,
    /// `rejected`, `timed_out`, `indeterminate`, ...), and `failed` only for a tool's own error.
    pub fn shown_status(&self) -> &str {
        match self.outcome.as_deref() {
            None | Some("ok" | "cancelled") => &self.status,
            Some("tool_error") => "failed",
            Some(outcome) => outcome,
        }
    }

    /// From start to finish; `None` until the step has finished.
    pub fn duration(&self) -> Option<Duration> {
        self.finished_at?.since(self.started_at?)
    }

    /// Whether the step is leased to a worker right now.
    pub fn is_running(&self) -> bool {
        self.status == "running"
    }
}

impl From<pb::Step> for StepView {
    fn from(step: pb::Step) -> Self {
        let error = non_empty(step.error).map(|message| StepError {
            message,
            kind: match pb::ErrorKind::try_from(step.error_kind) {
                Ok(pb::ErrorKind::Unspecified) => None,
                _ => Some(error_kind_name(step.error_kind)),
            },
        });
        let started_at = step.started_at.map(UtcTime::from);
        let finished_at = step.finished_at.map(UtcTime::from);
        let duration_ms = finished_at
            .zip(started_at)
            .and_then(|(end, start)| end.since(start))
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            kind: match pb::StepKind::try_from(step.kind) {
                Ok(pb::StepKind::Agent) => "agent",
                Ok(pb::StepKind::Local) => "local",
                Ok(pb::StepKind::Subagent) => "subagent",
                Ok(pb::StepKind::Question) => "question",
                _ => "tool",
            }
            .to_owned(),
            effect: non_empty(step.effect),
            child_run_id: non_empty(step.child_run_id),
            resources: step.resources,
            limited_by: step.limited_by,
            limit_wait_ms: step.limit_wait_ms,
            share: step.share,
            caller_step_key: non_empty(step.caller_step_key),
            status: step_status_name(step.status),
            call_id: non_empty(step.call_id),
            tool_version: non_empty(step.tool_version),
            arguments: Json::parse_or(&step.arguments_json, Value::Object(Default::default())),
            output: Json::parse(&step.output_json),
            error,
            worker: non_empty(step.worker),
            dispatch_id: non_empty(step.dispatch_id),
            lease_expires_at: step.lease_expires_at.map(UtcTime::from),
            created_at: step.created_at.map(UtcTime::from),
            started_at,
            finished_at,
            duration_ms,
            key: step.step_key,
            turn: step.turn,
            position: step.position,
            tool: step.tool,
            tool_fingerprint: step.tool_fingerprint,
            call_hash: step.call_hash,
            idempotency_key: step.idempotency_key,
            attempts: step.attempts,
            replays: step.replays,
            progress_count: step.progress_count,
            next_attempt_at: step.next_attempt_at.map(UtcTime::from),
            max_attempts: step.max_attempts.max(1),
            lease_losses: step.lease_losses,
            idempotency: non_empty(step.idempotency),
            timeout_ms: step.timeout_ms,
            cost: step.cost,
            unit_cost: step.unit_cost,
            decided_by: non_empty(step.decided_by),
            outcome: outcome_name(step.outcome),
            replayed_from_run_id: non_empty(step.replayed_from_run_id),
            approval: step.approval.map(|a| StepApproval {
                approval_id: a.approval_id,
                answer: approval_answer_name(a.answer),
                decider: a.decider,
                reason: non_empty(a.reason),
            }),
        }
    }
}

/// A run with its steps in (turn, position) order: what `runs show` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunDetail {
    pub run: RunView,
    pub steps: Vec<StepView>,
    pub manifest: ManifestView,
    pub approvals: Vec<ApprovalView>,
}

impl TryFrom<pb::GetRunResponse> for RunDetail {
    type Error = CliError;

    fn try_from(response: pb::GetRunResponse) -> Result<Self, Self::Error> {
        let run = response
            .run
            .ok_or(CliError::MalformedResponse("GetRun returned no run"))?;
        let mut steps: Vec<StepView> = response.steps.into_iter().map(StepView::from).collect();
        steps.sort_by(|a, b| (a.turn, a.position, &a.key).cmp(&(b.turn, b.position, &b.key)));
        let manifest = response
            .manifest
            .map(|m| ManifestView {
                total_cost: m.total_cost,
                cost_by_tool: m.cost_by_tool.into_iter().collect(),
            })
            .unwrap_or_default();
        let approvals = response.approvals.into_iter().map(ApprovalView::from).collect();
        Ok(Self {
            run: run.into(),
            steps,
            manifest,
            approvals,
        })
    }
}

/// One entry of a run's event log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventView {
    pub run_id: String,
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: String,
    pub schema_version: u32,
    pub at: Option<UtcTime>,
    pub payload: Json,
}

impl From<pb::Event> for EventView {
    fn from(event: pb::Event) -> Self {
        Self {
            payload: Json::parse_or(&event.payload_json, Value::Null),
            at: event.at.map(UtcTime::from),
            run_id: event.run_id,
            seq: event.seq,
            kind: event.r#type,
            schema_version: event.schema_version,
        }
    }
}

/// A live progress update of a running tool; streamed with `--follow --progress`, never logged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgressView {
    /// Always `"progress"`, so NDJSON readers can tell it from a logged event.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub run_id: String,
    pub step_key: String,
    pub position: u32,
    pub tool: String,
    pub message: String,
    pub data: Option<Json>,
    pub current: u64,
    pub total: u64,
}

impl From<pb::Progress> for ProgressView {
    fn from(progress: pb::Progress) -> Self {
        Self {
            kind: "progress",
            data: Json::parse(&progress.data_json),
            run_id: progress.run_id,
            step_key: progress.step_key,
            position: progress.position,
            tool: progress.tool,
            message: progress.message,
            current: progress.current,
            total: progress.total,
        }
    }
}

/// A tool the kernel has seen, with the workers offering it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolView {
    pub name: String,
    pub version: Option<String>,
    pub fingerprint: String,
    pub description: String,
    pub input_schema: Option<Json>,
    pub options: ToolOptionsView,
    pub workers: Vec<String>,
    pub first_seen_at: Option<UtcTime>,
    pub last_seen_at: Option<UtcTime>,
}

impl From<pb::RegisteredTool> for ToolView {
    fn from(tool: pb::RegisteredTool) -> Self {
        let spec = tool.spec.unwrap_or_default();
        Self {
            input_schema: Json::parse(&spec.input_schema_json),
            options: spec.options.unwrap_or_default().into(),
            version: non_empty(spec.version),
            name: spec.name,
            fingerprint: spec.fingerprint,
            description: spec.description,
            workers: tool.workers,
            first_seen_at: tool.first_seen_at.map(UtcTime::from),
            last_seen_at: tool.last_seen_at.map(UtcTime::from),
        }
    }
}

/// A tool's declared behaviour; `null` numbers mean the kernel default (or "none").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolOptionsView {
    pub timeout_ms: Option<u64>,
    pub retry: Option<RetryView>,
    pub idempotency: String,
    pub read_only: bool,
    pub writes: bool,
    pub owner: Option<String>,
    pub risk: String,
    pub permissions: Vec<String>,
    pub resources: Vec<String>,
    /// Fields the kernel keeps out of its record (the tool's `secret` option).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret: Vec<String>,
    pub cost_per_call: f64,
    pub cache_ttl_ms: Option<u64>,
    pub requires_approval: bool,
    pub requires_approval_expr: Option<String>,
    pub approval_timeout_ms: Option<u64>,
    pub blocking: bool,
}

impl From<pb::ToolOptions> for ToolOptionsView {
    fn from(options: pb::ToolOptions) -> Self {
        Self {
            timeout_ms: non_zero(options.timeout_ms),
            retry: options.retry.map(RetryView::from),
            idempotency: idempotency_name(options.idempotency),
            read_only: options.read_only,
            writes: options.writes,
            owner: non_empty(options.owner),
            risk: risk_name(options.risk),
            permissions: options.permissions,
            resources: options.resources,
            secret: options.secret,
            cost_per_call: options.cost_per_call,
            cache_ttl_ms: non_zero(options.cache_ttl_ms),
            requires_approval: options.requires_approval,
            requires_approval_expr: non_empty(options.requires_approval_expr),
            approval_timeout_ms: non_zero(options.approval_timeout_ms),
            blocking: options.blocking,
        }
    }
}

/// How often and how fast a failed call is tried again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryView {
    pub max_attempts: u32,
    pub initial_interval_ms: u64,
    pub backoff_coefficient: f64,
    pub max_interval_ms: u64,
}

impl From<pb::RetryPolicy> for RetryView {
    fn from(retry: pb::RetryPolicy) -> Self {
        Self {
            max_attempts: retry.max_attempts,
            initial_interval_ms: retry.initial_interval_ms,
            backoff_coefficient: retry.backoff_coefficient,
            max_interval_ms: retry.max_interval_ms,
        }
    }
}

/// A kernel replica, as its row in the database says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaView {
    pub id: String,
    pub address: String,
    pub started_at: Option<UtcTime>,
    pub heartbeat_at: Option<UtcTime>,
    /// Renewed within the lease TTL of the replica that answered.
    pub alive: bool,
    /// The shards of runs it owns, of 256.
    pub shards: u32,
    pub worker_sessions: u32,
    /// The replica that answered.
    pub answering: bool,
}

impl From<pb::Replica> for ReplicaView {
    fn from(replica: pb::Replica) -> Self {
        Self {
            id: replica.id,
            address: replica.address,
            started_at: replica.started_at.map(UtcTime::from),
            heartbeat_at: replica.heartbeat_at.map(UtcTime::from),
            alive: replica.alive,
            shards: replica.shards,
            worker_sessions: replica.worker_sessions,
            answering: replica.answering,
        }
    }
}

/// A connected worker session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerView {
    pub session_id: String,
    pub name: String,
    pub tools: Vec<String>,
    /// The agents the worker hosts.
    pub agents: Vec<String>,
    pub max_concurrency: u32,
    pub slots_in_use: u32,
    pub draining: bool,
    pub connected_at: Option<UtcTime>,
    pub last_heartbeat_at: Option<UtcTime>,
    /// The kernel replica the session is connected to.
    pub replica: String,
}

impl From<pb::WorkerInfo> for WorkerView {
    fn from(worker: pb::WorkerInfo) -> Self {
        Self {
            session_id: worker.session_id,
            name: worker.name,
            tools: worker.tools,
            agents: worker.agents,
            max_concurrency: worker.max_concurrency,
            slots_in_use: worker.slots_in_use,
            draining: worker.draining,
            connected_at: worker.connected_at.map(UtcTime::from),
            last_heartbeat_at: worker.last_heartbeat_at.map(UtcTime::from),
            replica: worker.replica,
        }
    }
}

/// What the kernel holds in memory now. Byte figures the kernel could not read are `null`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusView {
    pub version: String,
    pub started_at: Option<UtcTime>,
    pub worker_sessions: u32,
    pub queued_calls: u32,
    pub leased_calls: u32,
    pub live_runs: u32,
    pub resident_bytes: Option<u64>,
    pub allocated_bytes: Option<u64>,
    pub in_flight_scans: u64,
    pub lost_calls_found: u64,
    /// CPU time the kernel process has used, in microseconds; `null` when it could not tell.
    pub cpu_micros: Option<u64>,
    /// Transactions the store's writer committed since the kernel started.
    pub store_commits: u64,
    /// Of those, the ones that waited for the disk.
    pub store_syncs: u64,
    /// SQL statements the store's writer ran.
    pub store_statements: u64,
    /// Bytes the kernel process wrote to storage; `null` when it could not tell.
    pub disk_write_bytes: Option<u64>,
    /// Log lines the kernel could not write (its standard error closed).
    pub log_lines_dropped: u64,
    /// Writes of runs this replica sent to the replica owning the run's shard.
    pub writes_forwarded: u64,
    /// Writes of runs in this replica's shards that another replica sent here.
    pub writes_applied_for_others: u64,
    /// Locks running calls hold on resource instances.
    pub resource_locks: Vec<ResourceLockView>,
    /// The policy file's tool limits, with what each holds now.
    pub tool_limits: Vec<ToolLimitView>,
    /// The policy file's fair shares, with the calls of each waiting; `null` when it sets none.
    pub fair_shares: Option<FairSharesView>,
}

/// The policy file's fair shares: the label whose value is a run's share, and the shares.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FairSharesView {
    pub label: String,
    pub shares: Vec<ShareView>,
}

/// One share of the queue: the label's value (`null`: runs without the label), its weight, and
/// its calls waiting in the queue of the kernel asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShareView {
    pub value: Option<String>,
    pub weight: u32,
    pub queued: u32,
}

impl From<pb::FairShareStatus> for FairSharesView {
    fn from(shares: pb::FairShareStatus) -> Self {
        Self {
            label: shares.label,
            shares: shares
                .shares
                .into_iter()
                .map(|share| ShareView {
                    value: share.value,
                    weight: share.weight,
                    queued: share.queued,
                })
                .collect(),
        }
    }
}

/// A tool limit of the policy file: what it allows, the calls running under it on every replica,
/// the tokens its bucket holds now and the calls waiting for it on the replica asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolLimitView {
    pub tools: String,
    pub per_second: Option<f64>,
    pub burst: Option<f64>,
    pub at_once: Option<u32>,
    pub running: u32,
    pub tokens: Option<f64>,
    pub queued: u32,
}

impl From<pb::ToolLimitStatus> for ToolLimitView {
    fn from(limit: pb::ToolLimitStatus) -> Self {
        Self {
            tools: limit.tools,
            per_second: limit.per_second,
            burst: limit.burst,
            at_once: limit.at_once,
            running: limit.running,
            tokens: limit.tokens,
            queued: limit.queued,
        }
    }
}

/// A lock a running call holds on a resource instance, and how many queued calls wait for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceLockView {
    pub resource: String,
    pub run_id: String,
    pub step_key: String,
    pub tool: String,
    pub attempt: u32,
    pub acquired_at: Option<UtcTime>,
    pub waiting: u32,
}

impl From<pb::GetStatusResponse> for StatusView {
    fn from(status: pb::GetStatusResponse) -> Self {
        Self {
            version: status.version,
            started_at: status.started_at.map(UtcTime::from),
            worker_sessions: status.worker_sessions,
            queued_calls: status.queued_calls,
            leased_calls: status.leased_calls,
            live_runs: status.live_runs,
            resident_bytes: (status.resident_bytes > 0).then_some(status.resident_bytes),
            allocated_bytes: (status.allocated_bytes > 0).then_some(status.allocated_bytes),
            in_flight_scans: status.in_flight_scans,
            lost_calls_found: status.lost_calls_found,
            cpu_micros: (status.cpu_micros > 0).then_some(status.cpu_micros),
            store_commits: status.store_commits,
            store_syncs: status.store_syncs,
            store_statements: status.store_statements,
            disk_write_bytes: (status.disk_write_bytes > 0).then_some(status.disk_write_bytes),
            log_lines_dropped: status.log_lines_dropped,
            writes_forwarded: status.writes_forwarded,
            writes_applied_for_others: status.writes_applied_for_others,
            resource_locks: status
                .resource_locks
                .into_iter()
                .map(|lock| ResourceLockView {
                    resource: lock.resource,
                    run_id: lock.run_id,
                    step_key: lock.step_key,
                    tool: lock.tool,
                    attempt: lock.attempt,
                    acquired_at: lock.acquired_at.map(UtcTime::from),
                    waiting: lock.waiting,
                })
                .collect(),
            tool_limits: status.tool_limits.into_iter().map(ToolLimitView::from).collect(),
            fair_shares: status.fair_shares.map(FairSharesView::from),
        }
    }
}

/// `ok`, `denied`, `indeterminate`, ...; `None` for a call not settled yet.
pub fn outcome_name(raw: i32) -> Option<String> {
    let name = enum_name(raw, |outcome| match outcome {
        pb::CallOutcome::Unspecified => "",
        pb::CallOutcome::Ok => "ok",
        pb::CallOutcome::ToolError => "tool_error",
        pb::CallOutcome::InvalidArguments => "invalid_arguments",
        pb::CallOutcome::UnknownTool => "unknown_tool",
        pb::CallOutcome::Denied => "denied",
        pb::CallOutcome::Rejected => "rejected",
        pb::CallOutcome::Expired => "expired",
        pb::CallOutcome::TimedOut => "timed_out",
        pb::CallOutcome::Indeterminate => "indeterminate",
        pb::CallOutcome::Poison => "poison",
        pb::CallOutcome::Cancelled => "cancelled",
        pb::CallOutcome::ReplayInputChanged => "replay_input_changed",
        pb::CallOutcome::LimitExceeded => "limit_exceeded",
        pb::CallOutcome::BudgetExceeded => "budget_exceeded",
        pb::CallOutcome::NoWorker => "no_worker",
        pb::CallOutcome::WriteToolBlocked => "write_tool_blocked",
    });
    non_empty(name)
}

fn approval_answer_name(raw: i32) -> String {
    match pb::ApprovalStatus::try_from(raw) {
        Ok(pb::ApprovalStatus::Approved | pb::ApprovalStatus::Consumed) => "approved".into(),
        Ok(pb::ApprovalStatus::Rejected) => "rejected".into(),
        Ok(pb::ApprovalStatus::Expired) => "expired".into(),
        _ => format!("unknown({raw})"),
    }
}

/// `pending`, `running`, `blocked`, `suspended`, `completed`, `failed`, `cancelled`.
pub fn run_status_name(raw: i32) -> String {
    enum_name(raw, |status| match status {
        pb::RunStatus::Unspecified => "unspecified",
        pb::RunStatus::Pending => "pending",
        pb::RunStatus::Running => "running",
        pb::RunStatus::Blocked => "blocked",
        pb::RunStatus::Completed => "completed",
        pb::RunStatus::Failed => "failed",
        pb::RunStatus::Cancelled => "cancelled",
        pb::RunStatus::Suspended => "suspended",
    })
}

/// `pending`, `running`, `succeeded`, `failed`, `cancelled`, `awaiting_approval`, `suspended`.
pub fn step_status_name(raw: i32) -> String {
    enum_name(raw, |status| match status {
        pb::StepStatus::Unspecified => "unspecified",
        pb::StepStatus::Pending => "pending",
        pb::StepStatus::Running => "running",
        pb::StepStatus::Succeeded => "succeeded",
        pb::StepStatus::Failed => "failed",
        pb::StepStatus::Cancelled => "cancelled",
        pb::StepStatus::AwaitingApproval => "awaiting_approval",
        pb::StepStatus::Suspended => "suspended",
    })
}

/// `pending`, `approved`, `consumed`, `rejected`, `expired`, `cancelled`.
pub fn approval_status_name(raw: i32) -> String {
    enum_name(raw, |status| match status {
        pb::ApprovalStatus::Unspecified => "unspecified",
        pb::ApprovalStatus::Pending => "pending",
        pb::ApprovalStatus::Approved => "approved",
        pb::ApprovalStatus::Consumed => "consumed",
        pb::ApprovalStatus::Rejected => "rejected",
        pb::ApprovalStatus::Expired => "expired",
        pb::ApprovalStatus::Cancelled => "cancelled",
    })
}

/// A question put to a person about one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalView {
    pub id: String,
    pub run_id: String,
    pub step_key: String,
    pub tool: String,
    /// The exact arguments the approval covers.
    pub arguments: Json,
    pub status: String,
    pub approvers: Vec<String>,
    pub message: Option<String>,
    /// The rule or flag that asked.
    pub decided_by: String,
    pub requested_at: Option<UtcTime>,
    pub expires_at: Option<UtcTime>,
    pub answered_at: Option<UtcTime>,
    pub decider: Option<String>,
    pub reason: Option<String>,
    /// A tool's question to a person (its message is the question), answered with JSON.
    pub question: bool,
    /// A question's schema for its answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_schema: Option<Json>,
    /// A question's answer, once given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Json>,
}

impl From<pb::Approval> for ApprovalView {
    fn from(approval: pb::Approval) -> Self {
        Self {
            status: approval_status_name(approval.status),
            arguments: Json::parse_or(&approval.arguments_json, Value::Object(Default::default())),
            message: non_empty(approval.message),
            requested_at: approval.requested_at.map(UtcTime::from),
            expires_at: approval.expires_at.map(UtcTime::from),
            answered_at: approval.answered_at.map(UtcTime::from),
            decider: non_empty(approval.decider),
            reason: non_empty(approval.reason),
            question: approval.question,
            answer_schema: non_empty(approval.answer_schema_json).map(|text| Json::parse_or(&text, Value::Null)),
            answer: non_empty(approval.answer_json).map(|text| Json::parse_or(&text, Value::Null)),
            id: approval.id,
            run_id: approval.run_id,
            step_key: approval.step_key,
            tool: approval.tool,
            approvers: approval.approvers,
            decided_by: approval.decided_by,
        }
    }
}

/// What a run's calls cost.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct ManifestView {
    pub total_cost: f64,
    pub cost_by_tool: BTreeMap<String, f64>,
}

/// `retryable`, `fatal`, `poison`.
pub fn error_kind_name(raw: i32) -> String {
    enum_name(raw, |kind| match kind {
        pb::ErrorKind::Unspecified => "unspecified",
        pb::ErrorKind::Retryable => "retryable",
        pb::ErrorKind::Fatal => "fatal",
        pb::ErrorKind::Poison => "poison",
    })
}

/// `safe_to_retry`, `at_most_once`.
pub fn idempotency_name(raw: i32) -> String {
    enum_name(raw, |idempotency| match idempotency {
        pb::Idempotency::Unspecified => "unspecified",
        pb::Idempotency::SafeToRetry => "safe_to_retry",
        pb::Idempotency::AtMostOnce => "at_most_once",
    })
}

/// `low`, `medium`, `high`, `critical`.
pub fn risk_name(raw: i32) -> String {
    enum_name(raw, |risk| match risk {
        pb::RiskLevel::Unspecified => "unspecified",
        pb::RiskLevel::Low => "low",
        pb::RiskLevel::Medium => "medium",
        pb::RiskLevel::High => "high",
        pb::RiskLevel::Critical => "critical",
    })
}

/// A value from a newer kernel than this client knows prints as `unknown(<number>)`.
fn enum_name<E: TryFrom<i32>>(raw: i32, name: impl Fn(E) -> &'static str) -> String {
    E::try_from(raw)
        .map(|value| name(value).to_owned())
        .unwrap_or_else(|_| format!("unknown({raw})"))
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

fn non_zero<N: Default + PartialEq>(n: N) -> Option<N> {
    (n != N::default()).then_some(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn ts(seconds: i64, nanos: i32) -> Option<prost_types::Timestamp> {
        Some(prost_types::Timestamp { seconds, nanos })
    }

    pub fn sample_run() -> pb::Run {
        pb::Run {
            id: "0192f0c1-run".into(),
            agent: "planner".into(),
            status: pb::RunStatus::Running as i32,
            input_json: r#"{"task": "book a flight", "budget": 300}"#.into(),
            output_json: String::new(),
            reason: String::new(),
            labels: [
                ("team".to_owned(), "travel".to_owned()),
                ("env".to_owned(), "dev".to_owned()),
            ]
            .into_iter()
            .collect(),
            idempotency_key: String::new(),
            max_tool_calls: 10,
            tool_calls: 3,
            last_seq: 9,
            created_at: ts(1_700_000_000, 0),
            updated_at: ts(1_700_000_042, 500_000_000),
            ..Default::default()
        }
    }

    pub fn sample_step(turn: u32, position: u32) -> pb::Step {
        pb::Step {
            step_key: format!("t{turn}/p{position}"),
            turn,
            position,
            tool: "search".into(),
            tool_fingerprint: "0123456789abcdef0123".into(),
            arguments_json: r#"{"q": "flights", "max": 5}"#.into(),
            call_hash: "feedface".into(),
            idempotency_key: format!("0192f0c1-run/t{turn}/p{position}"),
            status: pb::StepStatus::Succeeded as i32,
            attempts: 1,
            output_json: r#"["AF12","BA7"]"#.into(),
            worker: "worker-a".into(),
            dispatch_id: "d-1".into(),
            created_at: ts(1_700_000_001, 0),
            started_at: ts(1_700_000_001, 0),
            finished_at: ts(1_700_000_002, 200_000_000),
            ..Default::default()
        }
    }

    #[test]
    fn status_names_are_lowercase_without_prefix() {
        assert_eq!(run_status_name(pb::RunStatus::Blocked as i32), "blocked");
        assert_eq!(run_status_name(pb::RunStatus::Cancelled as i32), "cancelled");
        assert_eq!(step_status_name(pb::StepStatus::Succeeded as i32), "succeeded");
        assert_eq!(step_status_name(pb::StepStatus::Running as i32), "running");
        assert_eq!(error_kind_name(pb::ErrorKind::Poison as i32), "poison");
        assert_eq!(idempotency_name(pb::Idempotency::SafeToRetry as i32), "safe_to_retry");
        assert_eq!(idempotency_name(pb::Idempotency::AtMostOnce as i32), "at_most_once");
        assert_eq!(risk_name(pb::RiskLevel::Critical as i32), "critical");
        assert_eq!(run_status_name(0), "unspecified");
        assert_eq!(run_status_name(42), "unknown(42)");
    }

    #[test]
    fn json_text_is_parsed_or_kept_raw() {
        assert_eq!(Json::parse(""), None);
        assert_eq!(Json::parse("  "), None);
        assert_eq!(Json::parse("null"), Some(Json::Value(Value::Null)));
        assert_eq!(Json::parse(r#"{"b":1,"a":2}"#).unwrap().compact(), r#"{"a":2,"b":1}"#);
        let raw = Json::parse("{not json").unwrap();
        assert_eq!(raw, Json::Unparsed("{not json".into()));
        assert_eq!(raw.compact(), "{not json");
        assert_eq!(serde_json::to_value(&raw).unwrap(), json!("{not json"));
    }

    #[test]
    fn run_view_parses_json_and_nulls_empty_fields() {
        let view = RunView::from(sample_run());
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(
            json,
            json!({
                "id": "0192f0c1-run",
                "agent": "planner",
                "status": "running",
                "reason": null,
                "labels": {"env": "dev", "team": "travel"},
                "idempotency_key": null,
                "input": {"budget": 300, "task": "book a flight"},
                "output": null,
                "tool_calls": 3,
                "max_tool_calls": 10,
                "last_seq": 9,
                "created_at": "2023-11-14T22:13:20Z",
                "updated_at": "2023-11-14T22:14:02.500Z",
                "non_interactive": false,
                "permissions": [],
                "permissions_granted_by": null,
                "capture": "io",
                "hosted": false,
                "dispatches": 0,
                "suspensions": 0,
                "parent_run_id": null,
                "parent_step_key": null,
                "session_key": null,
                "trace_id": null,
                "forked_from_run_id": null,
                "fork_at_step_key": null,
                "fork_results": {},
                "allow": [],
                "budget": [],
                "budget_under_parent": false,
            })
        );
    }

    #[test]
    fn run_view_of_a_branch_names_its_parent_and_replaced_results() {
        let run = pb::Run {
            forked_from_run_id: "parent".into(),
            fork_at_step_key: "t1/p0".into(),
            fork_results: [("t0/p1".to_owned(), r#"{"temp": 3}"#.to_owned())]
                .into_iter()
                .collect(),
            allow: vec!["tool:refund".into()],
            ..sample_run()
        };
        let json = serde_json::to_value(RunView::from(run)).unwrap();
        assert_eq!(json["forked_from_run_id"], "parent");
        assert_eq!(json["fork_at_step_key"], "t1/p0");
        assert_eq!(json["fork_results"], json!({"t0/p1": {"temp": 3}}));
        assert_eq!(json["allow"], json!(["tool:refund"]));
        let step = pb::Step {
            replayed_from_run_id: "parent".into(),
            decided_by: "branch:parent".into(),
            outcome: pb::CallOutcome::WriteToolBlocked as i32,
            ..sample_step(0, 0)
        };
        let json = serde_json::to_value(StepView::from(step)).unwrap();
        assert_eq!(json["replayed_from_run_id"], "parent");
        assert_eq!(json["outcome"], "write_tool_blocked");
    }

    #[test]
    fn run_view_of_a_finished_unlimited_run() {
        let run = pb::Run {
            status: pb::RunStatus::Completed as i32,
            input_json: String::new(),
            output_json: r#""done""#.into(),
            max_tool_calls: 0,
            ..sample_run()
        };
        let view = RunView::from(run);
        assert_eq!(view.input, Json::Value(Value::Null));
        assert_eq!(view.output, Some(Json::Value(json!("done"))));
        assert_eq!(view.max_tool_calls, None);
    }

    #[test]
    fn step_view_parses_json_and_computes_duration() {
        let view = StepView::from(sample_step(0, 1));
        assert_eq!(view.duration(), Some(Duration::from_millis(1_200)));
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["arguments"], json!({"max": 5, "q": "flights"}));
        assert_eq!(json["output"], json!(["AF12", "BA7"]));
        assert_eq!(json["status"], "succeeded");
        assert_eq!(json["error"], Value::Null);
        assert_eq!(json["call_id"], Value::Null);
        assert_eq!(json["tool_version"], Value::Null);
        assert_eq!(json["duration_ms"], 1_200);
        assert_eq!(json["started_at"], "2023-11-14T22:13:21Z");
        assert_eq!(json["lease_expires_at"], Value::Null);
        assert_eq!(json["key"], "t0/p1");
        assert_eq!(json["replayed_from_run_id"], Value::Null);
    }

    #[test]
    fn failed_step_carries_its_error_kind() {
        let step = pb::Step {
            status: pb::StepStatus::Failed as i32,
            output_json: String::new(),
            error: "upstream 503".into(),
            error_kind: pb::ErrorKind::Retryable as i32,
            arguments_json: String::new(),
            finished_at: None,
            ..sample_step(1, 0)
        };
        let view = StepView::from(step);
        assert_eq!(view.status, "failed");
        assert_eq!(
            view.error,
            Some(StepError {
                message: "upstream 503".into(),
                kind: Some("retryable".into()),
            })
        );
        assert_eq!(view.output, None);
        assert_eq!(view.arguments, Json::Value(json!({})));
        assert_eq!(view.duration(), None);
        assert_eq!(view.duration_ms, None);
    }

    #[test]
    fn run_detail_orders_steps_by_turn_then_position() {
        let response = pb::GetRunResponse {
            run: Some(sample_run()),
            steps: vec![sample_step(1, 0), sample_step(0, 2), sample_step(0, 1)],
            ..Default::default()
        };
        let detail = RunDetail::try_from(response).unwrap();
        let keys: Vec<&str> = detail.steps.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["t0/p1", "t0/p2", "t1/p0"]);
        let json = serde_json::to_value(&detail).unwrap();
        assert_eq!(json["run"]["id"], "0192f0c1-run");
        assert_eq!(json["steps"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn run_detail_without_a_run_is_malformed() {
        let err = RunDetail::try_from(pb::GetRunResponse::default()).unwrap_err();
        assert!(matches!(err, CliError::MalformedResponse(_)));
    }

    #[test]
    fn event_view_embeds_the_payload() {
        let event = pb::Event {
            run_id: "r".into(),
            seq: 4,
            r#type: "tool:result".into(),
            schema_version: 1,
            at: ts(1_700_000_000, 7_000_000),
            payload_json: r#"{"status":"ok","output":{"n":1}}"#.into(),
        };
        let json = serde_json::to_value(EventView::from(event)).unwrap();
        assert_eq!(
            json,
            json!({
                "run_id": "r",
                "seq": 4,
                "type": "tool:result",
                "schema_version": 1,
                "at": "2023-11-14T22:13:20.007Z",
                "payload": {"output": {"n": 1}, "status": "ok"},
            })
        );
    }

    #[test]
    fn progress_view_is_tagged() {
        let progress = pb::Progress {
            run_id: "r".into(),
            step_key: "t0/p0".into(),
            tool: "fetch".into(),
            message: "page 2".into(),
            data_json: r#"{"bytes":10}"#.into(),
            current: 2,
            total: 5,
            ..Default::default()
        };
        let json = serde_json::to_value(ProgressView::from(progress)).unwrap();
        assert_eq!(json["type"], "progress");
        assert_eq!(json["data"], json!({"bytes": 10}));
    }

    #[test]
    fn tool_view_without_options_uses_defaults() {
        let tool = pb::RegisteredTool {
            spec: Some(pb::ToolSpec {
                name: "search".into(),
                description: "Search the web".into(),
                input_schema_json: r#"{"type":"object"}"#.into(),
                fingerprint: "abc".into(),
                ..Default::default()
            }),
            workers: vec!["w1".into()],
            ..Default::default()
        };
        let json = serde_json::to_value(ToolView::from(tool)).unwrap();
        assert_eq!(json["input_schema"], json!({"type": "object"}));
        assert_eq!(json["version"], Value::Null);
        assert_eq!(json["options"]["risk"], "unspecified");
        assert_eq!(json["options"]["timeout_ms"], Value::Null);
        assert_eq!(json["options"]["retry"], Value::Null);
        assert_eq!(json["workers"], json!(["w1"]));
    }
}
