//! Conversions between the SDK's types and the generated `kernel.v1` messages.
//!
//! This is the only module that builds or reads protocol messages field by field; the rest of
//! the crate works with SDK types. Durations travel as milliseconds, optional text as empty
//! strings, JSON as text (canonical where the kernel hashes it).

use std::time::Duration;

use kernel_proto::canonical::{to_canonical, tool_fingerprint};
use kernel_proto::v1 as pb;
use pb::open_session_request::Message as Up;
use pb::open_session_response::Message as Down;
use serde_json::Value;

use crate::agent::{
    AgentError, Call, CallOutcome, CallStatus, Capture, Interruption, NewRun, ProgressUpdate, TurnItem,
};
use crate::cache::CacheOp;
use crate::context::CallInfo;
use crate::error::{ErrorKind, ToolError};
use crate::outcome::{ApprovalAnswer, ApprovalDecision, Outcome};
use crate::session::{DispatchRef, DispatchRequest, Inbound, Outbound, Welcome};
use crate::tool::{Approval, Effect, Idempotency, RetryPolicy, RiskLevel, ToolDefinition, ToolOptions};

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn optional_millis(duration: Option<Duration>) -> u64 {
    duration.map(millis).unwrap_or(0)
}

fn optional_text(text: String) -> Option<String> {
    if text.is_empty() { None } else { Some(text) }
}

fn optional_json(text: &str) -> Result<Option<Value>, serde_json::Error> {
    if text.trim().is_empty() {
        Ok(None)
    } else {
        serde_json::from_str(text).map(Some)
    }
}

// ---- tools ---------------------------------------------------------------------------------

pub(crate) fn tool_spec(definition: &ToolDefinition) -> pb::ToolSpec {
    let ToolDefinition {
        name,
        description,
        input_schema,
        version,
        options,
    } = definition;
    pb::ToolSpec {
        name: name.clone(),
        description: description.clone(),
        input_schema_json: to_canonical(input_schema),
        version: version.clone(),
        fingerprint: tool_fingerprint(name, description, input_schema, version),
        options: Some(tool_options(options)),
    }
}

fn tool_options(options: &ToolOptions) -> pb::ToolOptions {
    // The predicate alone decides when it is set; `requires_approval` then stays false so a
    // kernel reading either field asks only when the predicate holds.
    let (requires_approval, requires_approval_expr) = match &options.approval {
        Approval::Never => (false, String::new()),
        Approval::Always => (true, String::new()),
        Approval::When(expr) => (false, expr.clone()),
    };
    pb::ToolOptions {
        timeout_ms: optional_millis(options.timeout),
        retry: options.retry.as_ref().map(retry_policy),
        idempotency: idempotency(options.idempotency) as i32,
        read_only: options.effect == Effect::ReadOnly,
        writes: options.effect == Effect::Writes,
        owner: options.owner.clone().unwrap_or_default(),
        risk: options.risk.map_or(pb::RiskLevel::Unspecified, risk_level) as i32,
        permissions: options.permissions.clone(),
        resources: options.resources.clone(),
        cost_per_call: options.cost_per_call,
        cache_ttl_ms: optional_millis(options.cache_ttl),
        requires_approval,
        requires_approval_expr,
        approval_timeout_ms: optional_millis(options.approval_timeout),
        blocking: options.blocking,
    }
}

fn retry_policy(policy: &RetryPolicy) -> pb::RetryPolicy {
    pb::RetryPolicy {
        max_attempts: policy.max_attempts,
        initial_interval_ms: millis(policy.initial_interval),
        backoff_coefficient: policy.backoff_coefficient,
        max_interval_ms: millis(policy.max_interval),
    }
}

fn idempotency(idempotency: Idempotency) -> pb::Idempotency {
    match idempotency {
        Idempotency::SafeToRetry => pb::Idempotency::SafeToRetry,
        Idempotency::AtMostOnce => pb::Idempotency::AtMostOnce,
    }
}

fn risk_level(risk: RiskLevel) -> pb::RiskLevel {
    match risk {
        RiskLevel::Low => pb::RiskLevel::Low,
        RiskLevel::Medium => pb::RiskLevel::Medium,
        RiskLevel::High => pb::RiskLevel::High,
        RiskLevel::Critical => pb::RiskLevel::Critical,
    }
}

fn error_kind_to_pb(kind: ErrorKind) -> pb::ErrorKind {
    match kind {
        ErrorKind::Retryable => pb::ErrorKind::Retryable,
        ErrorKind::Fatal => pb::ErrorKind::Fatal,
        ErrorKind::Poison => pb::ErrorKind::Poison,
    }
}

fn error_kind_from_pb(kind: i32) -> Option<ErrorKind> {
    match pb::ErrorKind::try_from(kind).ok()? {
        pb::ErrorKind::Unspecified => None,
        pb::ErrorKind::Retryable => Some(ErrorKind::Retryable),
        pb::ErrorKind::Fatal => Some(ErrorKind::Fatal),
        pb::ErrorKind::Poison => Some(ErrorKind::Poison),
    }
}

// ---- worker session ------------------------------------------------------------------------

/// Encodes one message of the worker's outbound stream. `Close` never reaches here: the
/// stream ends before it.
pub(crate) fn outbound(message: Outbound) -> pb::OpenSessionRequest {
    let message = match message {
        Outbound::Hello {
            worker_name,
            tools,
            max_concurrency,
            ephemeral_tools,
        } => Up::Hello(pb::Hello {
            worker_name,
            tools: tools.iter().map(tool_spec).collect(),
            max_concurrency,
            sdk_version: env!("CARGO_PKG_VERSION").to_owned(),
            ephemeral_tools,
        }),
        Outbound::Heartbeat | Outbound::Close => Up::Heartbeat(pb::Heartbeat {}),
        Outbound::Drain => Up::Drain(pb::Drain {}),
        Outbound::Progress { dispatch, progress } => Up::Progress(pb::DispatchProgress {
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            message: progress.message,
            data_json: progress.data.as_ref().map(to_canonical).unwrap_or_default(),
            current: progress.current.unwrap_or(0),
            total: progress.total.unwrap_or(0),
        }),
        Outbound::Result { dispatch, outcome } => Up::Result(pb::DispatchResult {
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            outcome: Some(dispatch_outcome(outcome)),
        }),
        Outbound::Cache {
            dispatch,
            request_id,
            op,
        } => Up::Cache(pb::CacheRequest {
            request_id,
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            op: Some(cache_op(op)),
        }),
    };
    pb::OpenSessionRequest { message: Some(message) }
}

fn cache_op(op: CacheOp) -> pb::cache_request::Op {
    use pb::cache_request::Op;
    match op {
        CacheOp::Get { key } => Op::Get(pb::CacheGet { key }),
        CacheOp::Set { key, value_json, ttl } => Op::Set(pb::CacheSet {
            key,
            value_json,
            ttl_ms: optional_millis(ttl),
        }),
    }
}

fn dispatch_outcome(outcome: Result<Value, ToolError>) -> pb::dispatch_result::Outcome {
    use pb::dispatch_result::Outcome;
    match outcome {
        Ok(value) => Outcome::OutputJson(to_canonical(&value)),
        Err(error) => Outcome::Error(pb::ToolFailure {
            message: error.message().to_owned(),
            kind: error_kind_to_pb(error.kind()) as i32,
        }),
    }
}

/// Decodes one message from the kernel; `None` for an empty message (a newer kernel's
/// message this SDK does not know).
pub(crate) fn inbound(message: pb::OpenSessionResponse) -> Option<Inbound> {
    Some(match message.message? {
        Down::Welcome(welcome) => Inbound::Welcome(Welcome {
            session_id: welcome.session_id,
            heartbeat_interval: Duration::from_millis(welcome.heartbeat_interval_ms),
            lease_ttl: Duration::from_millis(welcome.lease_ttl_ms),
        }),
        Down::Dispatch(dispatch) => Inbound::Dispatch(dispatch_request(dispatch)),
        Down::Cancel(cancel) => Inbound::Cancel {
            dispatch: DispatchRef {
                id: cancel.dispatch_id,
                attempt: cancel.attempt,
            },
            reason: cancel.reason,
        },
        Down::ResultAck(ack) => Inbound::ResultAck {
            dispatch: DispatchRef {
                id: ack.dispatch_id,
                attempt: ack.attempt,
            },
            accepted: ack.accepted,
            reason: ack.reason,
        },
        Down::Cache(answer) => Inbound::Cache {
            request_id: answer.request_id,
            reply: if !answer.error.is_empty() {
                Err(answer.error)
            } else if answer.found {
                Ok(Some(answer.value_json))
            } else {
                Ok(None)
            },
        },
    })
}

fn dispatch_request(dispatch: pb::Dispatch) -> DispatchRequest {
    let arguments = if dispatch.arguments_json.trim().is_empty() {
        Ok(Value::Object(Default::default()))
    } else {
        serde_json::from_str(&dispatch.arguments_json).map_err(|error| error.to_string())
    };
    DispatchRequest {
        call: CallInfo {
            run_id: dispatch.run_id,
            call_id: optional_text(dispatch.call_id),
            step_key: dispatch.step_key,
            turn: dispatch.turn,
            position: dispatch.position,
            idempotency_key: dispatch.idempotency_key,
            attempt: dispatch.attempt,
            dispatch_id: dispatch.dispatch_id,
            timeout: (dispatch.timeout_ms > 0).then(|| Duration::from_millis(dispatch.timeout_ms)),
        },
        tool: dispatch.tool,
        arguments,
    }
}

// ---- agent ---------------------------------------------------------------------------------

pub(crate) fn create_run_request(run: NewRun) -> pb::CreateRunRequest {
    pb::CreateRunRequest {
        agent: run.agent,
        input_json: to_canonical(&run.input),
        labels: run.labels.into_iter().collect(),
        idempotency_key: run.idempotency_key.unwrap_or_default(),
        max_tool_calls: run.max_tool_calls,
        non_interactive: run.non_interactive,
        permissions: run.permissions,
        capture: match run.capture {
            Capture::None => pb::Capture::None,
            Capture::Metadata => pb::Capture::Metadata,
            Capture::Io => pb::Capture::Io,
        } as i32,
    }
}

pub(crate) fn submit_turn_request(
    run_id: &str,
    turn: u32,
    calls: Vec<Call>,
    offered_tools: &[String],
) -> pb::SubmitTurnRequest {
    pb::SubmitTurnRequest {
        run_id: run_id.to_owned(),
        turn,
        offered_tools: offered_tools.to_vec(),
        calls: calls
            .into_iter()
            .map(|call| pb::ToolCall {
                tool: call.tool,
                arguments_json: to_canonical(&call.arguments),
                call_id: call.id.unwrap_or_default(),
                timeout_ms: call.timeout.map(|t| t.as_millis() as u64).unwrap_or(0),
            })
            .collect(),
    }
}

/// Decodes one item of a turn's response stream; `None` for an empty item.
pub(crate) fn turn_item(response: pb::SubmitTurnResponse) -> Result<Option<TurnItem>, AgentError> {
    use pb::submit_turn_response::Item;
    Ok(match response.item {
        None => None,
        Some(Item::Result(result)) => Some(TurnItem::Result(call_outcome(result)?)),
        Some(Item::Progress(progress)) => Some(TurnItem::Progress(progress_update(progress))),
        Some(Item::Interrupted(interruption)) => Some(TurnItem::Interrupted(Interruption {
            position: interruption.position,
            step_key: interruption.step_key,
            tool: interruption.tool,
            reason: interruption.reason,
            approval_id: interruption.approval_id,
            arguments: optional_json(&interruption.arguments_json)?.unwrap_or(Value::Null),
            message: interruption.message,
        })),
    })
}

fn call_outcome(result: pb::CallResult) -> Result<CallOutcome, AgentError> {
    let status = match pb::CallStatus::try_from(result.status) {
        Ok(pb::CallStatus::Ok) => CallStatus::Ok,
        Ok(pb::CallStatus::Cancelled) => CallStatus::Cancelled,
        _ => CallStatus::Error,
    };
    let output = if status == CallStatus::Ok {
        optional_json(&result.output_json)?
    } else {
        None
    };
    Ok(CallOutcome {
        position: result.position,
        step_key: result.step_key,
        tool: result.tool,
        status,
        content: result.content,
        output,
        error_kind: error_kind_from_pb(result.error_kind),
        replayed: result.replayed,
        attempts: result.attempts,
        outcome: outcome_from_pb(result.outcome),
        decided_by: Some(result.decided_by).filter(|d| !d.is_empty()),
        approval: result.approval.and_then(approval_decision),
    })
}

fn outcome_from_pb(value: i32) -> Outcome {
    match pb::CallOutcome::try_from(value) {
        Ok(pb::CallOutcome::Ok) => Outcome::Ok,
        Ok(pb::CallOutcome::ToolError) => Outcome::ToolError,
        Ok(pb::CallOutcome::InvalidArguments) => Outcome::InvalidArguments,
        Ok(pb::CallOutcome::UnknownTool) => Outcome::UnknownTool,
        Ok(pb::CallOutcome::Denied) => Outcome::Denied,
        Ok(pb::CallOutcome::Rejected) => Outcome::Rejected,
        Ok(pb::CallOutcome::Expired) => Outcome::Expired,
        Ok(pb::CallOutcome::TimedOut) => Outcome::TimedOut,
        Ok(pb::CallOutcome::Indeterminate) => Outcome::Indeterminate,
        Ok(pb::CallOutcome::Poison) => Outcome::Poison,
        Ok(pb::CallOutcome::Cancelled) => Outcome::Cancelled,
        Ok(pb::CallOutcome::ReplayInputChanged) => Outcome::ReplayInputChanged,
        Ok(pb::CallOutcome::LimitExceeded) => Outcome::LimitExceeded,
        Ok(pb::CallOutcome::NoWorker) => Outcome::NoWorker,
        Ok(pb::CallOutcome::Unspecified) | Err(_) => Outcome::Unknown,
    }
}

/// An approval's answer; `None` for one that is not an answer (pending, or unknown to this SDK).
fn approval_decision(decision: pb::ApprovalDecision) -> Option<ApprovalDecision> {
    let answer = match pb::ApprovalStatus::try_from(decision.answer) {
        Ok(pb::ApprovalStatus::Approved | pb::ApprovalStatus::Consumed) => ApprovalAnswer::Approved,
        Ok(pb::ApprovalStatus::Rejected) => ApprovalAnswer::Rejected,
        Ok(pb::ApprovalStatus::Expired) => ApprovalAnswer::Expired,
        _ => return None,
    };
    Some(ApprovalDecision {
        approval_id: decision.approval_id,
        answer,
        decider: decision.decider,
        reason: Some(decision.reason).filter(|r| !r.is_empty()),
    })
}

fn progress_update(progress: pb::Progress) -> ProgressUpdate {
    let fraction = progress.total > 0;
    ProgressUpdate {
        position: progress.position,
        step_key: progress.step_key,
        tool: progress.tool,
        message: progress.message,
        current: fraction.then_some(progress.current),
        total: fraction.then_some(progress.total),
        // Progress is advisory: detail that does not parse is dropped rather than failing the turn.
        data: optional_json(&progress.data_json).ok().flatten(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::context::Progress;

    #[test]
    fn options_map_one_to_one() {
        let options = ToolOptions {
            timeout: Some(Duration::from_millis(1500)),
            retry: Some(RetryPolicy::retries(3)),
            idempotency: Idempotency::AtMostOnce,
            effect: Effect::Writes,
            owner: Some("payments".into()),
            risk: Some(RiskLevel::High),
            permissions: vec!["billing:write".into()],
            resources: vec!["ledger".into()],
            cost_per_call: 0.25,
            cache_ttl: Some(Duration::from_secs(300)),
            approval: Approval::When("args.cents > 10000".into()),
            approval_timeout: Some(Duration::from_secs(3600)),
            blocking: true,
        };
        let pb = tool_options(&options);
        assert_eq!(pb.timeout_ms, 1500);
        assert_eq!(pb.retry.unwrap().max_attempts, 4);
        assert_eq!(pb.idempotency, pb::Idempotency::AtMostOnce as i32);
        assert!(pb.writes && !pb.read_only);
        assert_eq!(pb.owner, "payments");
        assert_eq!(pb.risk, pb::RiskLevel::High as i32);
        assert_eq!(pb.permissions, ["billing:write"]);
        assert_eq!(pb.resources, ["ledger"]);
        assert_eq!(pb.cost_per_call, 0.25);
        assert_eq!(pb.cache_ttl_ms, 300_000);
        assert!(!pb.requires_approval);
        assert_eq!(pb.requires_approval_expr, "args.cents > 10000");
        assert_eq!(pb.approval_timeout_ms, 3_600_000);
        assert!(pb.blocking);

        let defaults = tool_options(&ToolOptions::default());
        assert_eq!(defaults.timeout_ms, 0);
        assert!(defaults.retry.is_none());
        assert_eq!(defaults.idempotency, pb::Idempotency::SafeToRetry as i32);
        assert_eq!(defaults.risk, pb::RiskLevel::Unspecified as i32);
    }

    #[test]
    fn results_travel_as_canonical_json() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 2,
        };
        let request = outbound(Outbound::Result {
            dispatch,
            outcome: Ok(json!({"b": 1, "a": [1, 2]})),
        });
        let Some(Up::Result(result)) = request.message else {
            panic!("not a result")
        };
        assert_eq!(result.attempt, 2);
        assert_eq!(
            result.outcome,
            Some(pb::dispatch_result::Outcome::OutputJson(r#"{"a":[1,2],"b":1}"#.into()))
        );
    }

    #[test]
    fn errors_keep_their_kind() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 1,
        };
        let request = outbound(Outbound::Result {
            dispatch,
            outcome: Err(ToolError::poison("no")),
        });
        let Some(Up::Result(result)) = request.message else {
            panic!("not a result")
        };
        let Some(pb::dispatch_result::Outcome::Error(failure)) = result.outcome else {
            panic!("not an error")
        };
        assert_eq!(
            (failure.message.as_str(), failure.kind),
            ("no", pb::ErrorKind::Poison as i32)
        );
    }

    #[test]
    fn progress_without_a_fraction_sends_zeros() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 1,
        };
        let progress = Progress::new("working").data(json!({"z": 1, "a": 2}));
        let Some(Up::Progress(sent)) = outbound(Outbound::Progress { dispatch, progress }).message else {
            panic!("not progress")
        };
        assert_eq!((sent.current, sent.total), (0, 0));
        assert_eq!(sent.data_json, r#"{"a":2,"z":1}"#);
    }

    #[test]
    fn cache_requests_and_answers_map_one_to_one() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 3,
        };
        let op = CacheOp::Set {
            key: "k".into(),
            value_json: "[1]".into(),
            ttl: None,
        };
        let Some(Up::Cache(request)) = outbound(Outbound::Cache {
            dispatch,
            request_id: 9,
            op,
        })
        .message
        else {
            panic!("not a cache request")
        };
        assert_eq!(
            (request.request_id, request.dispatch_id.as_str(), request.attempt),
            (9, "d", 3)
        );
        let Some(pb::cache_request::Op::Set(set)) = request.op else {
            panic!("not a set")
        };
        assert_eq!(set.ttl_ms, 0, "no TTL travels as 0: never expires");

        let answer = |found: bool, value_json: &str, error: &str| {
            let message = pb::OpenSessionResponse {
                message: Some(Down::Cache(pb::CacheResponse {
                    request_id: 9,
                    found,
                    value_json: value_json.into(),
                    error: error.into(),
                })),
            };
            match inbound(message) {
                Some(Inbound::Cache { request_id: 9, reply }) => reply,
                other => panic!("not a cache answer: {other:?}"),
            }
        };
        assert_eq!(answer(true, "1", ""), Ok(Some("1".into())));
        assert_eq!(answer(false, "", ""), Ok(None));
        assert_eq!(answer(false, "", "key: too long"), Err("key: too long".into()));
    }

    #[test]
    fn dispatch_arguments_default_to_an_empty_object() {
        let request = dispatch_request(pb::Dispatch {
            tool: "t".into(),
            ..Default::default()
        });
        assert_eq!(request.arguments, Ok(json!({})));
        assert!(request.call.call_id.is_none());
        assert!(request.call.timeout.is_none());
        let request = dispatch_request(pb::Dispatch {
            arguments_json: "{oops".into(),
            ..Default::default()
        });
        assert!(request.arguments.is_err());
    }

    #[test]
    fn call_results_decode_output_only_when_ok() {
        let ok = pb::CallResult {
            status: pb::CallStatus::Ok as i32,
            content: "5".into(),
            output_json: "5".into(),
            ..Default::default()
        };
        let outcome = call_outcome(ok).unwrap();
        assert_eq!((outcome.status, outcome.output), (CallStatus::Ok, Some(json!(5))));
        let failed = pb::CallResult {
            status: pb::CallStatus::Error as i32,
            content: "unknown tool 'x'; available: add".into(),
            error_kind: pb::ErrorKind::Fatal as i32,
            ..Default::default()
        };
        let outcome = call_outcome(failed).unwrap();
        assert_eq!(outcome.status, CallStatus::Error);
        assert_eq!(outcome.error_kind, Some(ErrorKind::Fatal));
        assert!(outcome.output.is_none());
        assert_eq!(outcome.outcome, Outcome::Unknown, "an outcome this SDK cannot read");
        assert!(outcome.rejection().is_none());
    }

    #[test]
    fn a_gated_call_that_was_not_approved_reads_as_a_typed_rejection() {
        let result = |outcome: pb::CallOutcome, answer: pb::ApprovalStatus, reason: &str| pb::CallResult {
            tool: "refund".into(),
            status: pb::CallStatus::Error as i32,
            content: "'refund' was not approved".into(),
            outcome: outcome as i32,
            decided_by: "rule:big-refunds".into(),
            approval: Some(pb::ApprovalDecision {
                approval_id: "ap-1".into(),
                answer: answer as i32,
                decider: "alice".into(),
                reason: reason.into(),
                answered_at: None,
            }),
            ..Default::default()
        };
        let rejected = call_outcome(result(
            pb::CallOutcome::Rejected,
            pb::ApprovalStatus::Rejected,
            "too much",
        ))
        .unwrap();
        assert_eq!(rejected.decided_by.as_deref(), Some("rule:big-refunds"));
        let rejection = rejected.rejection().expect("a rejection");
        assert_eq!(
            rejection,
            crate::ToolCallRejected {
                tool_name: "refund".into(),
                reason: Some("too much".into()),
                expired: false,
                decider: "alice".into(),
            }
        );
        assert_eq!(rejection.to_string(), "'refund' was not approved: too much");
        let expired = call_outcome(result(pb::CallOutcome::Expired, pb::ApprovalStatus::Expired, "")).unwrap();
        assert!(expired.rejection().expect("expiry is a rejection").expired);
        let approved = call_outcome(result(pb::CallOutcome::Ok, pb::ApprovalStatus::Consumed, "ok")).unwrap();
        assert!(approved.rejection().is_none());
        assert_eq!(approved.approval.unwrap().answer, ApprovalAnswer::Approved);
    }

    #[test]
    fn a_new_run_sends_everything_create_run_takes() {
        let request = create_run_request(
            NewRun::new("billing", json!({"order": 9}))
                .label("env", "prod")
                .idempotency_key("order-9")
                .max_tool_calls(20)
                .non_interactive()
                .permission("billing:write")
                .capture(Capture::Metadata),
        );
        assert_eq!(request.agent, "billing");
        assert_eq!(request.input_json, r#"{"order":9}"#);
        assert_eq!(request.labels.get("env").map(String::as_str), Some("prod"));
        assert_eq!(request.idempotency_key, "order-9");
        assert_eq!(request.max_tool_calls, 20);
        assert!(request.non_interactive);
        assert_eq!(request.permissions, ["billing:write"]);
        assert_eq!(request.capture, pb::Capture::Metadata as i32);
    }
}
