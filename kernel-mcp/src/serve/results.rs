//! How the kernel's tools, results and errors look to an MCP client: a registered tool as an MCP
//! tool, a call's outcome (live or read back from the log) as a `CallToolResult`, and the one
//! mapping of the kernel's refusals to what the client gets.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, MetaObject, Tool, ToolAnnotations};
use serde_json::{Value, json};
use worker_sdk::proto::canonical;
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentError, CallStatus};

/// `_meta` key of a result (and of a request): the run the call is recorded in.
pub(super) const META_RUN: &str = "kernel/run";
/// `_meta` key of a result: the call's step key in its run (`kernelctl runs show`).
pub(super) const META_STEP: &str = "kernel/step";

/// A registered tool as MCP describes it: name, description, schema and its declared effect as
/// hints.
pub(super) fn mcp_tool(spec: pb::ToolSpec) -> Tool {
    let schema: JsonObject = match serde_json::from_str(&spec.input_schema_json) {
        Ok(Value::Object(mut schema)) => {
            objects_for_booleans(&mut schema);
            schema
        }
        _ => JsonObject::new(),
    };
    let options = spec.options.unwrap_or_default();
    let annotations = ToolAnnotations::new()
        .read_only(options.read_only)
        .destructive(options.writes)
        .idempotent(options.read_only || options.idempotency == pb::Idempotency::SafeToRetry as i32);
    Tool::new(spec.name, spec.description, Arc::new(schema)).with_annotations(annotations)
}

/// Rewrites boolean subschemas of properties and items (`true`: anything, `false`: nothing) as
/// the object schemas they mean. JSON Schema allows both, but MCP clients read tool schemas as
/// objects: the TypeScript SDK refuses a whole `tools/list` over one `true` (found by the MCP
/// conformance suite, on a tool taking any JSON value).
fn objects_for_booleans(schema: &mut JsonObject) {
    let as_object = |value: &mut Value| match value {
        Value::Bool(true) => *value = json!({}),
        Value::Bool(false) => *value = json!({"not": {}}),
        Value::Object(inner) => objects_for_booleans(inner),
        _ => {}
    };
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.values_mut().for_each(as_object);
    }
    if let Some(items) = schema.get_mut("items") {
        as_object(items);
    }
}

/// A call's outcome as an MCP result: a success's content (and its JSON, when an object, as
/// structured content), or an error result with the text the model reads.
pub(super) fn from_outcome(outcome: worker_sdk::CallOutcome) -> CallToolResult {
    if outcome.status != CallStatus::Ok {
        return refused(outcome.content);
    }
    success(outcome.output.unwrap_or(Value::Null), outcome.content)
}

/// A settled call as its log records it, as the same MCP result a live call gets; `None` while
/// it is not settled.
pub(super) fn from_step(step: &pb::Step) -> Option<CallToolResult> {
    match pb::StepStatus::try_from(step.status) {
        Ok(pb::StepStatus::Succeeded) => {
            let output = serde_json::from_str(&step.output_json).unwrap_or(Value::Null);
            let text = canonical::model_text(&output);
            Some(success(output, text))
        }
        Ok(pb::StepStatus::Failed | pb::StepStatus::Cancelled) => Some(refused(step.error.clone())),
        _ => None,
    }
}

fn success(output: Value, text: String) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    if output.is_object() {
        result.structured_content = Some(output);
    }
    result
}

/// Whether `step` records a call of `name` with `arguments` (compared as canonical JSON).
pub(super) fn records_call(step: &pb::Step, name: &str, arguments: &Value) -> bool {
    step.tool == name && canonical::canonicalize(&step.arguments_json).ok() == Some(canonical::to_canonical(arguments))
}

/// An error result: the model reads `text`.
pub(super) fn refused(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// `result` saying where the call is recorded: `_meta` `kernel/run` and `kernel/step`.
pub(super) fn placed(mut result: CallToolResult, run_id: &str, step_key: &str) -> CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.insert(META_RUN.into(), json!(run_id));
    meta.insert(META_STEP.into(), json!(step_key));
    result.meta = Some(MetaObject(meta.0));
    result
}

/// What a client gets when the kernel refuses a call: a refusal the model can act on (the run is
/// finished or blocked waiting for a person, the key may not call the tool, a limit, an id held
/// by another call) is an error result it reads; a request naming something that does not exist
/// or that is malformed is `invalid params`; anything else an internal error.
pub(super) fn call_refusal(error: AgentError) -> Result<CallToolResult, ErrorData> {
    if let AgentError::Status(status) = &error {
        match status.code() {
            tonic::Code::FailedPrecondition
            | tonic::Code::AlreadyExists
            | tonic::Code::ResourceExhausted
            | tonic::Code::PermissionDenied => return Ok(refused(status.message().to_owned())),
            _ => {}
        }
    }
    if let AgentError::ConcurrentCallId(message) = &error {
        return Ok(refused(message.clone()));
    }
    Err(kernel_error(error))
}

/// The one mapping of a kernel error to an MCP error.
pub(super) fn kernel_error(error: AgentError) -> ErrorData {
    match &error {
        AgentError::Status(status) if matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::NotFound) => {
            ErrorData::invalid_params(status.message().to_owned(), None)
        }
        _ => ErrorData::internal_error(format!("kernel: {error}"), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boolean_subschemas_become_the_objects_they_mean() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "value": true,
                "never": false,
                "list": {"type": "array", "items": true},
                "nested": {"type": "object", "properties": {"any": true}}
            },
            "additionalProperties": false
        });
        let Value::Object(object) = &mut schema else {
            unreachable!()
        };
        objects_for_booleans(object);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "value": {},
                    "never": {"not": {}},
                    "list": {"type": "array", "items": {}},
                    "nested": {"type": "object", "properties": {"any": {}}}
                },
                "additionalProperties": false
            })
        );
    }

    fn step(status: pb::StepStatus) -> pb::Step {
        pb::Step {
            status: status as i32,
            output_json: r#"{"b":2,"a":1}"#.into(),
            error: "refund not allowed. reason: no".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_settled_step_reads_back_as_the_result_a_live_call_got() {
        let ok = from_step(&step(pb::StepStatus::Succeeded)).expect("settled");
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(ok.structured_content, Some(json!({"a": 1, "b": 2})));
        let text = serde_json::to_value(&ok.content).unwrap();
        assert_eq!(text[0]["text"], r#"{"a":1,"b":2}"#, "the model's text: canonical JSON");
        for status in [pb::StepStatus::Failed, pb::StepStatus::Cancelled] {
            let refused = from_step(&step(status)).expect("settled");
            assert_eq!(refused.is_error, Some(true));
            let text = serde_json::to_value(&refused.content).unwrap();
            assert_eq!(text[0]["text"], "refund not allowed. reason: no");
        }
        for status in [
            pb::StepStatus::Running,
            pb::StepStatus::AwaitingApproval,
            pb::StepStatus::Pending,
        ] {
            assert!(from_step(&step(status)).is_none(), "{status:?} is not settled");
        }
    }

    #[test]
    fn refusals_the_model_can_act_on_are_results_and_bad_requests_are_errors() {
        let refused = call_refusal(AgentError::Status(tonic::Status::failed_precondition(
            "run_blocked: run r1 is blocked",
        )))
        .expect("a result");
        assert_eq!(refused.is_error, Some(true));
        let error = call_refusal(AgentError::Status(tonic::Status::not_found("run r9 not found"))).unwrap_err();
        assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert_eq!(error.message, "run r9 not found");
        let error = call_refusal(AgentError::Transport("refused".into())).unwrap_err();
        assert_eq!(error.code, rmcp::model::ErrorCode::INTERNAL_ERROR);
    }
}
