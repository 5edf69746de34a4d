//! The hosted side's messages: an agent's announcement, a recorded call's result, a finished
//! local step to record.

use kernel_proto::v1 as pb;

use super::{AgentDefinition, StepEffect};
use crate::agent::{AgentError, CallOutcome};

/// How a worker announces an agent it hosts.
pub(crate) fn agent_spec(agent: &AgentDefinition) -> pb::AgentSpec {
    pb::AgentSpec {
        name: agent.name.clone(),
        description: agent.description.clone(),
        input_schema_json: agent.input_schema.to_string(),
        version: agent.version.clone(),
        max_concurrency: agent.max_concurrency,
        fingerprint: agent.fingerprint(),
    }
}

/// A recorded call's result as a replayed call returns it.
pub(crate) fn recorded_outcome(result: pb::CallResult) -> Result<CallOutcome, AgentError> {
    crate::agent::wire::call_outcome(result)
}

/// A finished local step at place `seq`, occurrence `occurrence` of its id.
pub(crate) fn record_step_request(
    dispatch: pb::HostedDispatch,
    (seq, id, occurrence): (u32, &str, u32),
    effect: StepEffect,
    once: bool,
    outcome: Result<String, String>,
) -> pb::RecordStepRequest {
    pb::RecordStepRequest {
        dispatch: Some(dispatch),
        seq,
        step_id: id.to_owned(),
        occurrence,
        effect: effect.as_str().to_owned(),
        once,
        outcome: Some(match outcome {
            Ok(output) => pb::record_step_request::Outcome::OutputJson(output),
            Err(message) => pb::record_step_request::Outcome::Error(pb::StepFailure { message }),
        }),
    }
}
