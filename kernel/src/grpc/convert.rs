//! Conversions between proto messages and domain types, in one place. Request validation that is
//! about shape (fields present, JSON parses, names well formed) happens here and names the field.

use std::collections::{BTreeMap, HashSet};

use kernel_proto::canonical;
use kernel_proto::v1 as pb;
use prost_types::Timestamp;
use serde_json::Value;

use crate::error::KernelError;
use crate::hub::ProgressUpdate;
use crate::machine::budget;
use crate::model::{
    AgentDef, ApprovalDecision, ApprovalRecord, ApprovalStatus, Capture, ErrorKind, EventRecord, Idempotency, Millis,
    Outcome, RecordedResult, RetryPolicy, RiskLevel, RunRecord, RunStatus, StepKind, StepRecord, StepStatus, ToolDef,
    ToolOptions, validate_tool_name,
};
use crate::registry::KnownTool;
use crate::scheduler::{SessionHello, WorkerSnapshot};

/// A timestamp as milliseconds since the epoch.
pub fn millis_of(time: &Timestamp) -> Millis {
    time.seconds.saturating_mul(1000) + i64::from(time.nanos) / 1_000_000
}

pub fn timestamp(ms: Millis) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

fn opt_timestamp(ms: Option<Millis>) -> Option<Timestamp> {
    ms.map(timestamp)
}

/// Parses JSON text from a request into canonical text; empty text means `default`.
pub fn canonical_json(text: &str, field: &str, default: &str) -> Result<String, KernelError> {
    canonical_value(text, field, default).map(|(_, canonical)| canonical)
}

/// JSON text parsed once: its value, and its canonical text. `field` is written out only to
/// name it in an error.
pub fn canonical_value(
    text: &str,
    field: impl std::fmt::Display,
    default: &str,
) -> Result<(Value, String), KernelError> {
    let text = if text.trim().is_empty() { default } else { text };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| KernelError::invalid(field.to_string(), format!("is not valid JSON: {e}")))?;
    let canonical = canonical::to_canonical(&value);
    Ok((value, canonical))
}

pub fn run_status(status: RunStatus) -> pb::RunStatus {
    match status {
        RunStatus::Pending => pb::RunStatus::Pending,
        RunStatus::Running => pb::RunStatus::Running,
        RunStatus::Blocked => pb::RunStatus::Blocked,
        RunStatus::Completed => pb::RunStatus::Completed,
        RunStatus::Failed => pb::RunStatus::Failed,
        RunStatus::Cancelled => pb::RunStatus::Cancelled,
        RunStatus::Suspended => pb::RunStatus::Suspended,
    }
}

pub fn run_status_filter(value: i32) -> Result<Option<RunStatus>, KernelError> {
    match pb::RunStatus::try_from(value) {
        Ok(pb::RunStatus::Unspecified) => Ok(None),
        Ok(pb::RunStatus::Pending) => Ok(Some(RunStatus::Pending)),
        Ok(pb::RunStatus::Running) => Ok(Some(RunStatus::Running)),
        Ok(pb::RunStatus::Blocked) => Ok(Some(RunStatus::Blocked)),
        Ok(pb::RunStatus::Completed) => Ok(Some(RunStatus::Completed)),
        Ok(pb::RunStatus::Failed) => Ok(Some(RunStatus::Failed)),
        Ok(pb::RunStatus::Cancelled) => Ok(Some(RunStatus::Cancelled)),
        Ok(pb::RunStatus::Suspended) => Ok(Some(RunStatus::Suspended)),
        Err(_) => Err(KernelError::invalid("status", format!("{value} is not a RunStatus"))),
    }
}

fn step_status(status: StepStatus) -> pb::StepStatus {
    match status {
        StepStatus::Pending => pb::StepStatus::Pending,
        StepStatus::Running => pb::StepStatus::Running,
        StepStatus::Succeeded => pb::StepStatus::Succeeded,
        StepStatus::Failed => pb::StepStatus::Failed,
        StepStatus::Cancelled => pb::StepStatus::Cancelled,
        StepStatus::AwaitingApproval => pb::StepStatus::AwaitingApproval,
        StepStatus::Suspended => pb::StepStatus::Suspended,
    }
}

pub fn error_kind(kind: Option<ErrorKind>) -> pb::ErrorKind {
    match kind {
        None => pb::ErrorKind::Unspecified,
        Some(ErrorKind::Retryable) => pb::ErrorKind::Retryable,
        Some(ErrorKind::Fatal) => pb::ErrorKind::Fatal,
        Some(ErrorKind::Poison) => pb::ErrorKind::Poison,
    }
}

pub fn error_kind_from(value: i32) -> ErrorKind {
    match pb::ErrorKind::try_from(value) {
        Ok(pb::ErrorKind::Fatal) => ErrorKind::Fatal,
        Ok(pb::ErrorKind::Poison) => ErrorKind::Poison,
        _ => ErrorKind::Retryable,
    }
}

/// A run as inspection shows it: its input and output only as its capture level allows.
pub fn run(run: &RunRecord) -> pb::Run {
    pb::Run {
        id: run.id.to_string(),
        agent: run.agent.clone(),
        status: run_status(run.status) as i32,
        input_json: run.capture.json_text(&run.input),
        output_json: run
            .output
            .as_deref()
            .map(|o| run.capture.json_text(o))
            .unwrap_or_default(),
        reason: run.reason.clone().unwrap_or_default(),
        labels: run.labels.clone().into_iter().collect(),
        idempotency_key: run.idempotency_key.clone().unwrap_or_default(),
        max_tool_calls: run.max_tool_calls,
        tool_calls: run.tool_calls,
        last_seq: run.last_seq,
        created_at: Some(timestamp(run.created_at)),
        updated_at: Some(timestamp(run.updated_at)),
        non_interactive: !run.interactive,
        permissions: run.permissions.clone(),
        capture: match run.capture {
            Capture::None => pb::Capture::None,
            Capture::Metadata => pb::Capture::Metadata,
            Capture::Io => pb::Capture::Io,
        } as i32,
        permissions_granted_by: run.granted_by.clone().unwrap_or_default(),
        hosted: run.hosted,
        dispatches: run.dispatches,
        parent_run_id: run.parent.as_ref().map(|(id, _)| id.to_string()).unwrap_or_default(),
        parent_step_key: run.parent.as_ref().map(|(_, key)| key.to_string()).unwrap_or_default(),
        session_key: run.session_key.clone().unwrap_or_default(),
        suspensions: run.suspensions,
        max_concurrency: run.max_concurrency,
        forked_from_run_id: run.fork.as_ref().map(|fork| fork.of.to_string()).unwrap_or_default(),
        fork_at_step_key: run
            .fork
            .as_ref()
            .and_then(|fork| fork.at.as_ref())
            .map(|at| at.key.to_string())
            .unwrap_or_default(),
        fork_results: run
            .fork
            .iter()
            .flat_map(|fork| &fork.results)
            .map(|(key, result)| (key.clone(), run.capture.json_text(result)))
            .collect(),
        allow: run.allow.clone(),
        trace_id: hex::encode(crate::traces::trace_id(&run.id, run.trace.as_ref())),
        budget: budget(run),
        budget_under_parent: run.budget.as_ref().is_some_and(|budget| budget.under_parent),
    }
}

/// Why a settled call ended as it did.
pub fn outcome(outcome: Option<Outcome>) -> pb::CallOutcome {
    match outcome {
        None => pb::CallOutcome::Unspecified,
        Some(Outcome::Ok) => pb::CallOutcome::Ok,
        Some(Outcome::ToolError) => pb::CallOutcome::ToolError,
        Some(Outcome::InvalidArguments) => pb::CallOutcome::InvalidArguments,
        Some(Outcome::UnknownTool) => pb::CallOutcome::UnknownTool,
        Some(Outcome::Denied) => pb::CallOutcome::Denied,
        Some(Outcome::Rejected) => pb::CallOutcome::Rejected,
        Some(Outcome::Expired) => pb::CallOutcome::Expired,
        Some(Outcome::TimedOut) => pb::CallOutcome::TimedOut,
        Some(Outcome::Indeterminate) => pb::CallOutcome::Indeterminate,
        Some(Outcome::Poison) => pb::CallOutcome::Poison,
        Some(Outcome::Cancelled) => pb::CallOutcome::Cancelled,
        Some(Outcome::ReplayInputChanged) => pb::CallOutcome::ReplayInputChanged,
        Some(Outcome::LimitExceeded) => pb::CallOutcome::LimitExceeded,
        Some(Outcome::NoWorker) => pb::CallOutcome::NoWorker,
        Some(Outcome::WriteToolBlocked) => pb::CallOutcome::WriteToolBlocked,
        Some(Outcome::BudgetExceeded) => pb::CallOutcome::BudgetExceeded,
    }
}

/// Most limits a request may set on a run's budget.
const MAX_BUDGET_LIMITS: usize = 32;

/// A request's budget limits, checked ([`budget::Limit::check`]), each over a glob that compiles.
/// Errors name the field (`budget[1].max_cost`).
pub fn budget_limits(limits: Vec<pb::BudgetLimit>) -> Result<Vec<budget::Limit>, KernelError> {
    if limits.len() > MAX_BUDGET_LIMITS {
        return Err(KernelError::invalid(
            "budget",
            format!("{} limits; at most {MAX_BUDGET_LIMITS}", limits.len()),
        ));
    }
    limits
        .into_iter()
        .enumerate()
        .map(|(index, limit)| {
            let field = |name: &str| format!("budget[{index}]{name}");
            let tools = match limit.tools.trim() {
                "" => None,
                glob => {
                    crate::policy::glob::compile(glob).map_err(|e| KernelError::invalid(field(".tools"), e))?;
                    Some(glob.to_owned())
                }
            };
            let read = budget::Limit {
                tools,
                max_calls: limit.max_calls,
                max_cost: limit.max_cost,
                max_time_ms: limit.max_time_ms,
                set_by: Some("request".to_owned()),
                spent: budget::Spent::default(),
                // Only the policy's budgets ask a person to raise them.
                ask: None,
            };
            read.check()
                .map_err(|(name, why)| KernelError::invalid(field(name), why))?;
            Ok(read)
        })
        .collect()
}

/// A run's budget limits with what each has spent.
fn budget(run: &RunRecord) -> Vec<pb::BudgetLimit> {
    run.budget
        .iter()
        .flat_map(|budget| &budget.limits)
        .map(|limit| pb::BudgetLimit {
            tools: limit.tools.clone().unwrap_or_default(),
            max_calls: limit.max_calls,
            max_cost: limit.max_cost,
            set_by: limit.set_by.clone().unwrap_or_default(),
            spent_calls: limit.spent.calls,
            spent_cost: limit.spent.cost,
            max_time_ms: limit.max_time_ms,
            spent_time_ms: limit.spent.time_ms,
            reserved_time_ms: limit.spent.reserved_ms,
        })
        .collect()
}

/// The answer a gated call got.
pub fn approval_decision(decision: &ApprovalDecision) -> pb::ApprovalDecision {
    pb::ApprovalDecision {
        approval_id: decision.approval_id.to_string(),
        answer: approval_status(decision.answer) as i32,
        decider: decision.decider.clone(),
        reason: decision.reason.clone().unwrap_or_default(),
        answered_at: Some(timestamp(decision.answered_at)),
    }
}

fn approval_status(status: ApprovalStatus) -> pb::ApprovalStatus {
    match status {
        ApprovalStatus::Pending => pb::ApprovalStatus::Pending,
        ApprovalStatus::Approved => pb::ApprovalStatus::Approved,
        ApprovalStatus::Consumed => pb::ApprovalStatus::Consumed,
        ApprovalStatus::Rejected => pb::ApprovalStatus::Rejected,
        ApprovalStatus::Expired => pb::ApprovalStatus::Expired,
        ApprovalStatus::Cancelled => pb::ApprovalStatus::Cancelled,
    }
}

pub fn approval_status_filter(value: i32) -> Result<ApprovalStatus, KernelError> {
    match pb::ApprovalStatus::try_from(value) {
        Ok(pb::ApprovalStatus::Unspecified | pb::ApprovalStatus::Pending) => Ok(ApprovalStatus::Pending),
        Ok(pb::ApprovalStatus::Approved) => Ok(ApprovalStatus::Approved),
        Ok(pb::ApprovalStatus::Consumed) => Ok(ApprovalStatus::Consumed),
        Ok(pb::ApprovalStatus::Rejected) => Ok(ApprovalStatus::Rejected),
        Ok(pb::ApprovalStatus::Expired) => Ok(ApprovalStatus::Expired),
        Ok(pb::ApprovalStatus::Cancelled) => Ok(ApprovalStatus::Cancelled),
        Err(_) => Err(KernelError::invalid(
            "status",
            format!("{value} is not an ApprovalStatus"),
        )),
    }
}

/// An approval as inspection shows it: arguments at capture io only.
pub fn approval(approval: &ApprovalRecord) -> pb::Approval {
    pb::Approval {
        id: approval.id.to_string(),
        run_id: approval.run_id.to_string(),
        step_key: approval.key.to_string(),
        tool: approval.tool.clone(),
        arguments_json: approval.capture.json_text(&approval.arguments),
        call_hash: approval.call_hash.clone(),
        status: approval_status(approval.status) as i32,
        approvers: approval.approvers.clone(),
        message: approval.message.clone().unwrap_or_default(),
        decided_by: approval.decided_by.clone(),
        requested_at: Some(timestamp(approval.requested_at)),
        expires_at: opt_timestamp(approval.expires_at),
        answered_at: opt_timestamp(approval.answered_at),
        decider: approval.decider.clone().unwrap_or_default(),
        reason: approval.reason.clone().unwrap_or_default(),
        question: approval.is_question(),
        answer_schema_json: if approval.is_question() {
            kernel_proto::canonical::to_canonical(&crate::machine::question::asked_in(&approval.arguments).1)
        } else if crate::machine::budget::raised_by(&approval.decided_by).is_some() {
            crate::machine::budget::RAISE_SCHEMA.to_owned()
        } else {
            String::new()
        },
        answer_json: approval
            .answer
            .as_deref()
            .map(|answer| approval.capture.json_text(answer))
            .unwrap_or_default(),
    }
}

/// Cost totals of a run's steps.
pub fn manifest(steps: &[StepRecord]) -> pb::RunManifest {
    let mut manifest = pb::RunManifest::default();
    for step in steps {
        manifest.total_cost += step.cost;
        if step.cost != 0.0 {
            *manifest.cost_by_tool.entry(step.tool.clone()).or_default() += step.cost;
        }
    }
    manifest
}

/// Tells the agent a call of its turn waits for a person: for its approval (`tool_approval`), for
/// leave to pass its budget (`budget_exceeded`), or for the answer to a question its body asked
/// (`human_input`; the step is the question's).
pub fn interruption(approval: &ApprovalRecord, position: u32) -> pb::Interruption {
    pb::Interruption {
        position,
        step_key: approval.key.to_string(),
        tool: approval.tool.clone(),
        reason: crate::machine::approval::interrupted_for(&approval.key, &approval.decided_by).into(),
        approval_id: approval.id.to_string(),
        arguments_json: approval.arguments.clone(),
        message: approval.message.clone().unwrap_or_default(),
    }
}

/// A step as inspection shows it under its run's capture level.
pub fn step(step: &StepRecord, capture: Capture) -> pb::Step {
    pb::Step {
        step_key: step.key.to_string(),
        turn: step.turn,
        position: step.position,
        call_id: step.call_id.clone().unwrap_or_default(),
        tool: step.tool.clone(),
        tool_fingerprint: step.fingerprint.clone(),
        tool_version: step.version.clone(),
        arguments_json: capture.json_text(&step.arguments),
        call_hash: step.call_hash.clone(),
        idempotency_key: step.idempotency_key.clone(),
        status: step_status(step.status) as i32,
        attempts: step.attempts,
        output_json: step.output.as_deref().map(|o| capture.json_text(o)).unwrap_or_default(),
        error: step.error.as_deref().map(|e| capture.error_text(e)).unwrap_or_default(),
        error_kind: error_kind(step.error_kind) as i32,
        worker: step.worker.clone().unwrap_or_default(),
        dispatch_id: step.dispatch_id.as_ref().map(ToString::to_string).unwrap_or_default(),
        lease_expires_at: opt_timestamp(step.lease_expires_at),
        created_at: Some(timestamp(step.created_at)),
        started_at: opt_timestamp(step.started_at),
        finished_at: opt_timestamp(step.finished_at),
        replays: step.replays,
        progress_count: step.progress_count,
        next_attempt_at: opt_timestamp(step.not_before.filter(|_| step.status == StepStatus::Pending)),
        lease_losses: step.lease_losses,
        max_attempts: RetryPolicy::attempts(step.retry.as_ref()),
        timeout_ms: step.timeout_ms,
        idempotency: step.idempotency.as_str().to_owned(),
        cost: step.cost,
        unit_cost: step.unit_cost,
        decided_by: step.decided_by.clone().unwrap_or_default(),
        outcome: outcome(step.outcome()) as i32,
        approval: step.approval.as_ref().map(approval_decision),
        kind: match step.kind {
            StepKind::Tool => pb::StepKind::Tool,
            StepKind::Agent => pb::StepKind::Agent,
            StepKind::Local => pb::StepKind::Local,
            StepKind::Subagent => pb::StepKind::Subagent,
            StepKind::Question => pb::StepKind::Question,
        } as i32,
        effect: step.effect.map(|e| e.as_str().to_owned()).unwrap_or_default(),
        max_concurrency: step.max_concurrency.unwrap_or(0),
        resources: step.resources.clone(),
        child_run_id: match step.kind {
            StepKind::Subagent => step.call_id.clone().unwrap_or_default(),
            _ => String::new(),
        },
        replayed_from_run_id: step
            .from_run
            .as_ref()
            .map(crate::model::RunId::to_string)
            .unwrap_or_default(),
        limited_by: step.limited_by.clone(),
        limit_wait_ms: step.limit_wait_ms,
        share: step.share.clone(),
        caller_step_key: step.key.caller().map(|key| key.to_string()).unwrap_or_default(),
    }
}

/// A recorded step as its handler replays it: arguments and results as recorded, whatever the
/// run's capture level.
pub fn history_step(step: &StepRecord) -> pb::Step {
    self::step(step, Capture::Io)
}

/// An event as inspection shows it under its run's capture level.
pub fn event(event: &EventRecord, capture: Capture) -> pb::Event {
    pb::Event {
        run_id: event.run_id.to_string(),
        seq: event.seq,
        r#type: event.kind.as_str().to_owned(),
        schema_version: event.schema_version,
        at: Some(timestamp(event.at)),
        payload_json: capture.payload(&event.payload),
    }
}

pub fn progress(update: &ProgressUpdate) -> pb::Progress {
    pb::Progress {
        run_id: update.run_id.to_string(),
        step_key: update.key.to_string(),
        position: update.position,
        tool: update.tool.clone(),
        message: update.message.clone(),
        data_json: update.data_json.clone(),
        current: update.current,
        total: update.total,
    }
}

/// What the agent (and the model) gets for a settled step.
pub fn call_result(result: RecordedResult, position: u32, replayed: bool) -> pb::CallResult {
    let outcome = outcome(result.outcome());
    let (status, content, output_json) = match result.status {
        StepStatus::Succeeded => {
            let output = result.output.unwrap_or_else(|| "null".into());
            let value: Value = serde_json::from_str(&output).unwrap_or(Value::Null);
            (pb::CallStatus::Ok, canonical::model_text(&value), output)
        }
        StepStatus::Cancelled => (
            pb::CallStatus::Cancelled,
            result.error.unwrap_or_default(),
            String::new(),
        ),
        _ => (pb::CallStatus::Error, result.error.unwrap_or_default(), String::new()),
    };
    pb::CallResult {
        position,
        step_key: result.key.into_string(),
        tool: result.tool,
        status: status as i32,
        content,
        output_json,
        error_kind: error_kind(result.error_kind) as i32,
        replayed,
        attempts: result.attempts,
        outcome: outcome as i32,
        decided_by: result.decided_by.unwrap_or_default(),
        approval: result.approval.as_ref().map(approval_decision),
    }
}

fn risk(value: i32) -> Option<RiskLevel> {
    match pb::RiskLevel::try_from(value) {
        Ok(pb::RiskLevel::Low) => Some(RiskLevel::Low),
        Ok(pb::RiskLevel::Medium) => Some(RiskLevel::Medium),
        Ok(pb::RiskLevel::High) => Some(RiskLevel::High),
        Ok(pb::RiskLevel::Critical) => Some(RiskLevel::Critical),
        _ => None,
    }
}

fn options(field: &str, options: Option<pb::ToolOptions>) -> Result<ToolOptions, KernelError> {
    let o = options.unwrap_or_default();
    if o.read_only && o.writes {
        return Err(KernelError::invalid(
            format!("{field}.options"),
            "read_only and writes cannot both be set",
        ));
    }
    if o.cache_ttl_ms > 0 && !o.read_only {
        return Err(KernelError::invalid(
            format!("{field}.options.cache_ttl_ms"),
            "a result cache needs read_only: only a tool without side effects may have its results served again \
             (declare the tool read_only, or drop cache_ttl)",
        ));
    }
    if !o.cost_per_call.is_finite() || o.cost_per_call < 0.0 {
        return Err(KernelError::invalid(
            format!("{field}.options.cost_per_call"),
            "must be a finite number >= 0",
        ));
    }
    let limit = o.limit.map(|limit| crate::machine::throttle::DeclaredLimit {
        per_second: limit.per_second,
        burst: limit.burst,
        at_once: limit.at_once,
    });
    if let Some(limit) = &limit {
        limit
            .of("tool")
            .check()
            .map_err(|(suffix, why)| KernelError::invalid(format!("{field}.options.limit{suffix}"), why))?;
    }
    crate::secrets::check_names(&o.secret)
        .map_err(|(index, why)| KernelError::invalid(format!("{field}.options.secret[{index}]"), why))?;
    let idempotency = match pb::Idempotency::try_from(o.idempotency) {
        Ok(pb::Idempotency::AtMostOnce) => Some(Idempotency::AtMostOnce),
        Ok(pb::Idempotency::SafeToRetry) => Some(Idempotency::SafeToRetry),
        _ => None,
    };
    Ok(ToolOptions {
        timeout_ms: (o.timeout_ms > 0).then_some(o.timeout_ms),
        retry: o.retry.map(|r| RetryPolicy {
            max_attempts: r.max_attempts,
            initial_interval_ms: r.initial_interval_ms,
            backoff_coefficient: r.backoff_coefficient,
            max_interval_ms: r.max_interval_ms,
        }),
        idempotency: idempotency.map(|i| i.as_str().to_owned()),
        read_only: o.read_only,
        writes: o.writes,
        owner: o.owner,
        risk: risk(o.risk).map(|r| r.as_str().to_owned()),
        permissions: o.permissions,
        resources: o.resources,
        cost_per_call: o.cost_per_call,
        cache_ttl_ms: (o.cache_ttl_ms > 0).then_some(o.cache_ttl_ms),
        requires_approval: o.requires_approval,
        requires_approval_expr: o.requires_approval_expr,
        approval_timeout_ms: (o.approval_timeout_ms > 0).then_some(o.approval_timeout_ms),
        blocking: o.blocking,
        strip_nulls: o.strip_nulls,
        approval_predicate_in_worker: o.approval_predicate_in_worker,
        limit,
        secret: o.secret,
    })
}

/// Validates a worker's hello: names, schemas, and the fingerprint each tool claims.
pub fn hello(hello: pb::Hello) -> Result<SessionHello, KernelError> {
    let name = hello.worker_name.trim().to_owned();
    if name.is_empty() {
        return Err(KernelError::invalid("hello.worker_name", "must not be empty"));
    }
    if hello.max_concurrency == 0 {
        return Err(KernelError::invalid("hello.max_concurrency", "must be at least 1"));
    }
    if hello.tools.is_empty() && hello.agents.is_empty() {
        return Err(KernelError::invalid(
            "hello.tools",
            "a worker must offer at least one tool or agent",
        ));
    }
    let agents = agents(hello.agents)?;
    let mut seen = HashSet::new();
    let mut tools = Vec::with_capacity(hello.tools.len());
    for (index, spec) in hello.tools.into_iter().enumerate() {
        let field = format!("hello.tools[{index}]");
        let announced = Announced {
            what: "tool",
            name: &spec.name,
            description: &spec.description,
            schema: &spec.input_schema_json,
            version: &spec.version,
            fingerprint: &spec.fingerprint,
        };
        let (input_schema, fingerprint) = announced.check(&field, "{\"type\":\"object\"}", &mut seen)?;
        if !input_schema.is_object() {
            return Err(KernelError::invalid(
                format!("{field}.input_schema_json"),
                "must be a JSON Schema object",
            ));
        }
        let options = options(&field, spec.options)?;
        crate::resources::validate(&options.resources, &input_schema)
            .map_err(|(index, message)| KernelError::invalid(format!("{field}.options.resources[{index}]"), message))?;
        let expr = options.requires_approval_expr.trim();
        if !expr.is_empty() && options.approval_predicate_in_worker {
            return Err(KernelError::invalid(
                format!("{field}.options.approval_predicate_in_worker"),
                "a tool's approval predicate is either a CEL expression (requires_approval_expr) or code in the \
                 worker, not both",
            ));
        }
        if !expr.is_empty() {
            crate::policy::compile_predicate(expr).map_err(|e| {
                KernelError::invalid(
                    format!("{field}.options.requires_approval_expr"),
                    format!("'{expr}' is not a valid CEL predicate: {e}"),
                )
            })?;
        }
        tools.push(ToolDef {
            name: spec.name,
            description: spec.description,
            input_schema,
            version: spec.version,
            fingerprint,
            options,
        });
    }
    Ok(SessionHello {
        name,
        tools,
        max_concurrency: hello.max_concurrency,
        ephemeral_tools: hello.ephemeral_tools,
        agents,
    })
}

/// What a hello says of one tool or agent: checked alike.
struct Announced<'a> {
    what: &'static str,
    name: &'a str,
    description: &'a str,
    schema: &'a str,
    version: &'a str,
    fingerprint: &'a str,
}

impl Announced<'_> {
    /// Checks the name (valid, offered once in `seen`), the input schema (JSON, usable; `default`
    /// when empty) and the claimed fingerprint; returns the schema and the fingerprint they hash to.
    fn check(&self, field: &str, default: &str, seen: &mut HashSet<String>) -> Result<(Value, String), KernelError> {
        validate_tool_name(self.name).map_err(|m| KernelError::invalid(format!("{field}.name"), m))?;
        if !seen.insert(self.name.to_owned()) {
            return Err(KernelError::invalid(
                format!("{field}.name"),
                format!("'{}' is offered twice", self.name),
            ));
        }
        let text = if self.schema.trim().is_empty() {
            default
        } else {
            self.schema
        };
        let schema: Value = serde_json::from_str(text).map_err(|e| {
            KernelError::invalid(format!("{field}.input_schema_json"), format!("is not valid JSON: {e}"))
        })?;
        crate::validation::ArgsValidator::compile(&schema).map_err(|e| {
            KernelError::invalid(
                format!("{field}.input_schema_json"),
                format!("is not a usable JSON Schema: {e}"),
            )
        })?;
        let fingerprint = canonical::tool_fingerprint(self.name, self.description, &schema, self.version);
        if !self.fingerprint.is_empty() && self.fingerprint != fingerprint {
            return Err(KernelError::invalid(
                format!("{field}.fingerprint"),
                format!(
                    "{} '{}' claims fingerprint {} but its name, description, schema and version hash to {}",
                    self.what, self.name, self.fingerprint, fingerprint
                ),
            ));
        }
        Ok((schema, fingerprint))
    }
}

/// The agents a hello announces, checked as tools are: a valid name offered once, a usable
/// input schema, and the fingerprint those hash to.
fn agents(specs: Vec<pb::AgentSpec>) -> Result<Vec<AgentDef>, KernelError> {
    let mut seen = HashSet::new();
    let mut agents = Vec::with_capacity(specs.len());
    for (index, spec) in specs.into_iter().enumerate() {
        let announced = Announced {
            what: "agent",
            name: &spec.name,
            description: &spec.description,
            schema: &spec.input_schema_json,
            version: &spec.version,
            fingerprint: &spec.fingerprint,
        };
        let (input_schema, fingerprint) = announced.check(&format!("hello.agents[{index}]"), "true", &mut seen)?;
        agents.push(AgentDef {
            name: spec.name,
            description: spec.description,
            input_schema,
            version: spec.version,
            fingerprint,
            max_concurrency: (spec.max_concurrency > 0).then_some(spec.max_concurrency),
        });
    }
    Ok(agents)
}

fn options_proto(o: &ToolOptions) -> pb::ToolOptions {
    pb::ToolOptions {
        timeout_ms: o.timeout_ms.unwrap_or(0),
        retry: o.retry.as_ref().map(|r| pb::RetryPolicy {
            max_attempts: r.max_attempts,
            initial_interval_ms: r.initial_interval_ms,
            backoff_coefficient: r.backoff_coefficient,
            max_interval_ms: r.max_interval_ms,
        }),
        idempotency: match o.idempotency() {
            Idempotency::SafeToRetry => pb::Idempotency::SafeToRetry,
            Idempotency::AtMostOnce => pb::Idempotency::AtMostOnce,
        } as i32,
        read_only: o.read_only,
        writes: o.writes,
        owner: o.owner.clone(),
        risk: match o.risk.as_deref().and_then(|r| r.parse::<RiskLevel>().ok()) {
            None => pb::RiskLevel::Unspecified,
            Some(RiskLevel::Low) => pb::RiskLevel::Low,
            Some(RiskLevel::Medium) => pb::RiskLevel::Medium,
            Some(RiskLevel::High) => pb::RiskLevel::High,
            Some(RiskLevel::Critical) => pb::RiskLevel::Critical,
        } as i32,
        permissions: o.permissions.clone(),
        resources: o.resources.clone(),
        cost_per_call: o.cost_per_call,
        cache_ttl_ms: o.cache_ttl_ms.unwrap_or(0),
        requires_approval: o.requires_approval,
        requires_approval_expr: o.requires_approval_expr.clone(),
        approval_timeout_ms: o.approval_timeout_ms.unwrap_or(0),
        blocking: o.blocking,
        strip_nulls: o.strip_nulls,
        approval_predicate_in_worker: o.approval_predicate_in_worker,
        limit: o.limit.as_ref().map(|limit| pb::ToolLimitOptions {
            per_second: limit.per_second,
            burst: limit.burst,
            at_once: limit.at_once,
        }),
        secret: o.secret.clone(),
    }
}

/// A tool as its worker registered it.
pub fn tool_spec(def: &ToolDef) -> pb::ToolSpec {
    pb::ToolSpec {
        name: def.name.clone(),
        description: def.description.clone(),
        input_schema_json: canonical::to_canonical(&def.input_schema),
        version: def.version.clone(),
        fingerprint: def.fingerprint.clone(),
        options: Some(options_proto(&def.options)),
    }
}

pub fn registered_tool(tool: &KnownTool, workers: Vec<String>) -> pb::RegisteredTool {
    pb::RegisteredTool {
        spec: Some(tool_spec(&tool.def)),
        workers,
        first_seen_at: Some(timestamp(tool.first_seen_at)),
        last_seen_at: Some(timestamp(tool.last_seen_at)),
    }
}

pub fn worker(worker: &WorkerSnapshot) -> pb::WorkerInfo {
    pb::WorkerInfo {
        session_id: worker.session_id.to_string(),
        name: worker.name.clone(),
        tools: worker.tools.clone(),
        agents: worker.agents.clone(),
        max_concurrency: worker.max_concurrency,
        slots_in_use: worker.slots_in_use,
        draining: worker.draining,
        connected_at: Some(timestamp(worker.connected_at)),
        last_heartbeat_at: Some(timestamp(worker.last_heartbeat_at)),
        replica: worker.replica.clone(),
    }
}

/// Parses `key=value` label filters.
pub fn label_filters(labels: &[String]) -> Result<Vec<(String, String)>, KernelError> {
    labels
        .iter()
        .enumerate()
        .map(|(i, pair)| match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(KernelError::invalid(
                format!("labels[{i}]"),
                format!("'{pair}' is not key=value"),
            )),
        })
        .collect()
}

pub fn labels(labels: std::collections::HashMap<String, String>) -> Result<BTreeMap<String, String>, KernelError> {
    if let Some(key) = labels.keys().find(|k| k.trim().is_empty()) {
        return Err(KernelError::invalid(
            "labels",
            format!("label key '{key}' must not be empty"),
        ));
    }
    Ok(labels.into_iter().collect())
}

/// The capture level a run asks for; unspecified means io.
pub fn capture(value: i32) -> Result<Capture, KernelError> {
    match pb::Capture::try_from(value) {
        Ok(pb::Capture::Unspecified | pb::Capture::Io) => Ok(Capture::Io),
        Ok(pb::Capture::Metadata) => Ok(Capture::Metadata),
        Ok(pb::Capture::None) => Ok(Capture::None),
        Err(_) => Err(KernelError::invalid("capture", format!("{value} is not a Capture"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> pb::ToolSpec {
        pb::ToolSpec {
            name: name.into(),
            description: "adds".into(),
            input_schema_json: r#"{"type":"object"}"#.into(),
            version: "1".into(),
            fingerprint: String::new(),
            options: None,
        }
    }

    fn hello_with(tools: Vec<pb::ToolSpec>) -> pb::Hello {
        pb::Hello {
            worker_name: "w".into(),
            tools,
            max_concurrency: 1,
            sdk_version: String::new(),
            ephemeral_tools: false,
            agents: Vec::new(),
            batches: false,
        }
    }

    #[test]
    fn hello_checks_the_claimed_fingerprint() {
        let mut good = spec("add");
        good.fingerprint = canonical::tool_fingerprint("add", "adds", &serde_json::json!({"type":"object"}), "1");
        assert!(hello(hello_with(vec![good])).is_ok());
        let mut bad = spec("add");
        bad.fingerprint = "deadbeef".into();
        let err = hello(hello_with(vec![bad])).unwrap_err().to_string();
        assert!(err.contains("hello.tools[0].fingerprint"), "{err}");
    }

    #[test]
    fn hello_refuses_bad_names_duplicates_and_contradictions() {
        assert!(
            hello(hello_with(vec![spec("bad name")]))
                .unwrap_err()
                .to_string()
                .contains("tools[0].name")
        );
        assert!(
            hello(hello_with(vec![spec("a"), spec("a")]))
                .unwrap_err()
                .to_string()
                .contains("offered twice")
        );
        let mut both = spec("a");
        both.options = Some(pb::ToolOptions {
            read_only: true,
            writes: true,
            ..Default::default()
        });
        assert!(
            hello(hello_with(vec![both]))
                .unwrap_err()
                .to_string()
                .contains("read_only and writes")
        );
    }

    #[test]
    fn hello_refuses_a_requires_approval_predicate_that_does_not_compile() {
        let mut gated = spec("refund");
        gated.options = Some(pb::ToolOptions {
            requires_approval_expr: "args.cents >".into(),
            ..Default::default()
        });
        let err = hello(hello_with(vec![gated])).unwrap_err().to_string();
        assert!(
            err.starts_with("hello.tools[0].options.requires_approval_expr"),
            "{err}"
        );
        let mut fine = spec("refund");
        fine.options = Some(pb::ToolOptions {
            requires_approval_expr: "args.cents > 10000".into(),
            ..Default::default()
        });
        assert!(hello(hello_with(vec![fine])).is_ok());
    }

    #[test]
    fn hello_takes_a_predicate_in_the_worker_or_in_cel_not_both() {
        let mut both = spec("refund");
        both.options = Some(pb::ToolOptions {
            requires_approval_expr: "args.cents > 10000".into(),
            approval_predicate_in_worker: true,
            ..Default::default()
        });
        let err = hello(hello_with(vec![both])).unwrap_err().to_string();
        assert!(
            err.starts_with("hello.tools[0].options.approval_predicate_in_worker: a tool's approval predicate"),
            "{err}"
        );
        let mut worker = spec("refund");
        worker.options = Some(pb::ToolOptions {
            approval_predicate_in_worker: true,
            ..Default::default()
        });
        let hello = hello(hello_with(vec![worker])).unwrap();
        assert!(hello.tools[0].options.approval_predicate_in_worker);
        let back = options_proto(&hello.tools[0].options);
        assert!(
            back.approval_predicate_in_worker,
            "it survives the way back to the wire"
        );
    }

    #[test]
    fn hello_takes_a_tool_s_own_limit_and_refuses_one_that_cannot_hold() {
        let limited = |limit: pb::ToolLimitOptions| {
            let mut tool = spec("charge");
            tool.options = Some(pb::ToolOptions {
                limit: Some(limit),
                ..Default::default()
            });
            hello(hello_with(vec![tool]))
        };
        let err = limited(pb::ToolLimitOptions::default()).unwrap_err().to_string();
        assert!(
            err.starts_with("hello.tools[0].options.limit: a limit sets per_second, at_once or both"),
            "{err}"
        );
        let err = limited(pb::ToolLimitOptions {
            per_second: Some(0.0),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("hello.tools[0].options.limit.per_second: 0 is not a rate"),
            "{err}"
        );
        let err = limited(pb::ToolLimitOptions {
            burst: Some(5),
            at_once: Some(2),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("hello.tools[0].options.limit.burst: a burst bounds a rate"),
            "{err}"
        );
        let fine = pb::ToolLimitOptions {
            per_second: Some(10.0),
            at_once: Some(4),
            ..Default::default()
        };
        let hello = limited(fine).unwrap();
        let declared = hello.tools[0].options.limit.clone().expect("the limit is kept");
        assert_eq!(declared.of("charge").tools, "tool:charge");
        assert_eq!(
            options_proto(&hello.tools[0].options).limit,
            Some(fine),
            "and survives the way back"
        );
    }

    #[test]
    fn hello_refuses_a_cache_ttl_on_a_tool_that_is_not_read_only() {
        let mut cached = spec("charge");
        cached.options = Some(pb::ToolOptions {
            cache_ttl_ms: 60_000,
            ..Default::default()
        });
        let err = hello(hello_with(vec![cached])).unwrap_err().to_string();
        assert!(
            err.starts_with("hello.tools[0].options.cache_ttl_ms: a result cache needs read_only"),
            "{err}"
        );
        let mut reader = spec("search");
        reader.options = Some(pb::ToolOptions {
            cache_ttl_ms: 60_000,
            read_only: true,
            ..Default::default()
        });
        assert!(hello(hello_with(vec![reader])).is_ok());
    }

    #[test]
    fn hello_refuses_a_schema_that_is_not_a_json_schema() {
        let mut broken = spec("x");
        broken.input_schema_json = r#"{"type":"nonsense"}"#.into();
        let err = hello(hello_with(vec![broken])).unwrap_err().to_string();
        assert!(
            err.starts_with("hello.tools[0].input_schema_json: is not a usable JSON Schema"),
            "{err}"
        );
    }

    #[test]
    fn canonical_json_names_the_field() {
        assert_eq!(canonical_json("", "input_json", "null").unwrap(), "null");
        let err = canonical_json("{nope", "calls[0].arguments_json", "{}")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("calls[0].arguments_json: is not valid JSON"), "{err}");
    }

    #[test]
    fn timestamps_split_millis() {
        let ts = timestamp(1_500);
        assert_eq!((ts.seconds, ts.nanos), (1, 500_000_000));
    }
}
