//! Hosted agents: an agent's handler runs on a worker, as a durable execution the kernel
//! dispatches.
//!
//! An [`Agent`] is a name, a description, the JSON Schema of its input, a version and a handler
//! `async fn(AgentContext, Input) -> Result<Output, AgentError>`. A worker that offers it (see
//! [`WorkerBuilder::agent`](crate::WorkerBuilder::agent)) is sent every run created for that
//! agent; the handler's return value completes the run, its error fails it.
//!
//! Everything the handler does through its [`AgentContext`] is a recorded step: tool calls
//! ([`AgentContext::call`], [`AgentContext::call_turn`]) and local steps ([`AgentContext::step`],
//! [`AgentContext::once`]), each durable before the handler sees its outcome. When the worker
//! dies or the kernel restarts, the run is dispatched again and the handler runs again from the
//! start: each recorded step returns its recorded outcome without running again, in order, and
//! the handler goes on live from the first step that was not recorded.
//!
//! **The replay rule.** Between steps a handler must be deterministic: given the same input and
//! the same step outcomes it must reach the same steps in the same order with the same
//! arguments. Anything that can differ from one run of the code to the next (the time, a random
//! number or id, a model's answer, a read of the world) belongs in a step. A handler that
//! reaches a recorded place with another step, another tool or other arguments fails the run
//! with `replay_input_changed` naming the place; it never gets a wrong recorded result. A local
//! step that was running when its worker died was never recorded, so it runs again: give a
//! `write` step's effect [`StepInfo::idempotency_key`] to deduplicate it.

mod context;
pub(crate) mod subagent;
mod wire;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub(crate) use context::HostedDispatch;
pub use context::{AgentContext, HandlerQuestion, SessionInfo, StepInfo, Subagent};
pub(crate) use wire::agent_spec;

use crate::agent::AgentError;
use crate::tool::{DEFAULT_TOOL_VERSION, ToolDefinitionError, validate_tool_name};

/// What a local step may do: a branch of a recorded run runs `read` and `pure` steps live and
/// refuses `write` steps it has no record of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StepEffect {
    /// Reads the world without changing it.
    Read,
    /// Computes from its inputs alone.
    Pure,
    /// Changes the world (the default).
    #[default]
    Write,
}

impl StepEffect {
    /// The name the kernel records.
    pub fn as_str(self) -> &'static str {
        match self {
            StepEffect::Read => "read",
            StepEffect::Pure => "pure",
            StepEffect::Write => "write",
        }
    }
}

/// The future a handler returns.
pub type AgentFuture = Pin<Box<dyn Future<Output = Result<Value, AgentError>> + Send>>;

type Handler = Arc<dyn Fn(AgentContext, Value) -> AgentFuture + Send + Sync>;

/// What a worker announces about an agent it hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDefinition {
    /// The name runs are created with: `[a-zA-Z0-9_-]{1,64}`.
    pub name: String,
    /// What the agent does.
    pub description: String,
    /// JSON Schema of a run's input.
    pub input_schema: Value,
    /// Declared version; part of the fingerprint.
    pub version: String,
    /// Runs of this agent one worker hosts at once (within its slots); 0 bounds them only by
    /// the worker's slots.
    pub max_concurrency: u32,
}

impl AgentDefinition {
    /// sha256 over the canonical JSON of name, description, input schema and version.
    pub fn fingerprint(&self) -> String {
        kernel_proto::canonical::tool_fingerprint(&self.name, &self.description, &self.input_schema, &self.version)
    }
}

/// An agent whose handler a worker hosts.
///
/// ```no_run
/// use serde_json::{json, Value};
/// use worker_sdk::{Agent, AgentContext, AgentError, Call, StepEffect};
///
/// async fn triage(ctx: AgentContext, input: Value) -> Result<Value, AgentError> {
///     // A model call happens once per run: replay returns its recorded answer.
///     let plan: String = ctx.once("plan", |_| async { Ok::<_, String>("look it up".to_owned()) }).await?;
///     let found = ctx.call(Call::new("lookup", json!({"q": input["q"]}))).await?;
///     let summary: String = ctx
///         .step_with("summarize", StepEffect::Pure, |_| async move { Ok::<_, String>(format!("{plan}: {}", found.content)) })
///         .await?;
///     Ok(json!({ "summary": summary }))
/// }
///
/// let agent = Agent::new("triage", "Looks a question up and summarizes it", triage);
/// ```
#[derive(Clone)]
pub struct Agent {
    definition: AgentDefinition,
    handler: Handler,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent").field("definition", &self.definition).finish()
    }
}

impl Agent {
    /// An agent from a handler over a typed input (its schema comes from the type) and output.
    pub fn new<I, O, F, Fut>(name: impl Into<String>, description: impl Into<String>, handler: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(AgentContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, AgentError>> + Send + 'static,
    {
        let input_schema = serde_json::to_value(schemars::schema_for!(I)).unwrap_or(Value::Bool(true));
        let name = name.into();
        let handler = Arc::new(handler);
        let agent = name.clone();
        let invoke: Handler = Arc::new(move |ctx, input| {
            let handler = Arc::clone(&handler);
            let agent = agent.clone();
            Box::pin(async move {
                let input: I = serde_json::from_value(input)
                    .map_err(|e| AgentError::Failed(format!("agent '{agent}': input does not fit its type: {e}")))?;
                let output = handler(ctx, input).await?;
                serde_json::to_value(output).map_err(|e| {
                    AgentError::Failed(format!("agent '{agent}' returned an output that is not JSON: {e}"))
                })
            })
        });
        Agent {
            definition: AgentDefinition {
                name,
                description: description.into(),
                input_schema,
                version: DEFAULT_TOOL_VERSION.to_owned(),
                max_concurrency: 0,
            },
            handler: invoke,
        }
    }

    /// Sets the declared version (it changes the fingerprint).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.definition.version = version.into();
        self
    }

    /// Bounds how many runs of this agent one worker hosts at once.
    pub fn max_concurrency(mut self, max: u32) -> Self {
        self.definition.max_concurrency = max;
        self
    }

    /// Replaces the input schema derived from the input type.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.definition.input_schema = schema;
        self
    }

    /// What the worker announces.
    pub fn definition(&self) -> &AgentDefinition {
        &self.definition
    }

    /// Checks the definition the way the kernel will.
    pub fn validate(&self) -> Result<(), ToolDefinitionError> {
        validate_tool_name(&self.definition.name)
    }

    pub(crate) fn handle(&self, ctx: AgentContext, input: Value) -> AgentFuture {
        (self.handler)(ctx, input)
    }
}

/// Reads what the run recorded, for a dispatch of its handler to replay.
pub(crate) async fn load_history(
    client: &kernel_proto::v1::hosted_service_client::HostedServiceClient<tonic::transport::Channel>,
    api_key: Option<&crate::auth::ApiKey>,
    dispatch: &HostedDispatch,
) -> Result<Vec<kernel_proto::v1::LoadHistoryResponse>, AgentError> {
    let request = kernel_proto::v1::LoadHistoryRequest {
        dispatch: Some(kernel_proto::v1::HostedDispatch {
            run_id: dispatch.run_id.clone(),
            dispatch_id: dispatch.dispatch_id.clone(),
            attempt: dispatch.attempt,
        }),
    };
    let mut stream = client
        .clone()
        .load_history(crate::auth::request(request, api_key))
        .await?
        .into_inner();
    let mut history = Vec::new();
    while let Some(entry) = stream.message().await? {
        history.push(entry);
    }
    Ok(history)
}
