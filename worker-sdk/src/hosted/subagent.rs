//! Starting a subagent and waiting for it, for a hosted handler and for a tool body alike, and a
//! tool body's question to a person: each calls the kernel under the dispatch it runs in.

use kernel_proto::canonical::to_canonical;
use kernel_proto::v1 as pb;
use kernel_proto::v1::hosted_service_client::HostedServiceClient;
use serde_json::Value;
use tonic::transport::Channel;

use crate::agent::AgentError;
use crate::auth::ApiKey;

/// What a context calls the kernel with: the connection, the key, and the dispatch it runs under.
#[derive(Clone)]
pub(crate) struct KernelLink {
    pub(crate) client: HostedServiceClient<Channel>,
    pub(crate) api_key: Option<ApiKey>,
    pub(crate) dispatch: pb::HostedDispatch,
}

impl std::fmt::Debug for KernelLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelLink")
            .field("dispatch_id", &self.dispatch.dispatch_id)
            .field("attempt", &self.dispatch.attempt)
            .finish()
    }
}

/// A subagent to start: which agent, with what, on which session, and the how-manieth of its
/// agent this context starts.
pub(crate) struct ChildRun<'a> {
    pub(crate) seq: u32,
    pub(crate) agent: &'a str,
    pub(crate) occurrence: u32,
    pub(crate) input: &'a Value,
    pub(crate) session: Option<String>,
}

impl KernelLink {
    /// Starts the subagent, or gets back the one recorded under the same identity.
    pub(crate) async fn start(&self, child: ChildRun<'_>) -> Result<pb::StartSubagentResponse, AgentError> {
        let request = pb::StartSubagentRequest {
            dispatch: Some(self.dispatch.clone()),
            seq: child.seq,
            agent: child.agent.to_owned(),
            input_json: to_canonical(child.input),
            session_key: child.session.unwrap_or_default(),
            occurrence: child.occurrence,
        };
        Ok(self
            .client
            .clone()
            .start_subagent(crate::auth::request(request, self.api_key.as_ref()))
            .await?
            .into_inner())
    }

    /// Asks a person `question`, or gets back the question recorded under the same identity.
    pub(crate) async fn ask(&self, question: pb::AskPersonRequest) -> Result<pb::AskPersonResponse, AgentError> {
        let request = pb::AskPersonRequest {
            dispatch: Some(self.dispatch.clone()),
            ..question
        };
        Ok(self
            .client
            .clone()
            .ask_person(crate::auth::request(request, self.api_key.as_ref()))
            .await?
            .into_inner())
    }

    /// Calls a tool from the body of the call this link's dispatch runs, as its
    /// `occurrence`-th, or gets back the call recorded under the same identity.
    pub(crate) async fn call_tool(
        &self,
        occurrence: u32,
        call: pb::ToolCall,
    ) -> Result<pb::CallToolResponse, AgentError> {
        let request = pb::CallToolRequest {
            dispatch: Some(self.dispatch.clone()),
            occurrence,
            call: Some(call),
        };
        Ok(self
            .client
            .clone()
            .call_tool(crate::auth::request(request, self.api_key.as_ref()))
            .await?
            .into_inner())
    }

    /// Waits until the step `key` of the run has settled.
    pub(crate) async fn await_step(&self, key: &str) -> Result<pb::Step, AgentError> {
        self.awaited(key)
            .await?
            .step
            .ok_or_else(|| AgentError::Protocol("the kernel answered an await without its step".into()))
    }

    /// Waits until the tool call `key` of the run has settled; its result.
    pub(crate) async fn await_call(&self, key: &str) -> Result<pb::CallResult, AgentError> {
        self.awaited(key).await?.result.ok_or_else(|| {
            AgentError::Protocol(format!("the kernel answered an await of call {key} without its result"))
        })
    }

    async fn awaited(&self, key: &str) -> Result<pb::AwaitStepResponse, AgentError> {
        let request = pb::AwaitStepRequest {
            dispatch: Some(self.dispatch.clone()),
            step_key: key.to_owned(),
        };
        Ok(self
            .client
            .clone()
            .await_step(crate::auth::request(request, self.api_key.as_ref()))
            .await?
            .into_inner())
    }
}

/// Whether a step has its one terminal outcome.
pub(crate) fn is_settled(step: &pb::Step) -> bool {
    [
        pb::StepStatus::Succeeded,
        pb::StepStatus::Failed,
        pb::StepStatus::Cancelled,
    ]
    .iter()
    .any(|s| *s as i32 == step.status)
}

/// A succeeded step's output as JSON text (`null` when it recorded none).
pub(crate) fn output_text(step: &pb::Step) -> &str {
    if step.output_json.is_empty() {
        "null"
    } else {
        &step.output_json
    }
}

/// A settled subagent step as its starter gets it: the child's output, or why it did not complete.
pub(crate) fn child_outcome(agent: String, step: pb::Step) -> Result<Value, AgentError> {
    if step.status == pb::StepStatus::Succeeded as i32 {
        Ok(serde_json::from_str(output_text(&step))?)
    } else {
        Err(AgentError::Subagent {
            agent,
            run_id: step.child_run_id,
            message: step.error,
        })
    }
}
