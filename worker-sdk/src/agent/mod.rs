//! The agent's side: create a run, submit each model turn's tool calls, end the run.
//!
//! An agent (the model loop) calls [`AgentClient::create_run`] once, then for each model
//! response [`RunHandle::submit_turn`] (results and progress as they happen) or
//! [`RunHandle::call_turn`] (just the results). Submitting a turn again after a crash returns
//! the recorded results without running the tools again, as long as each call keeps its
//! position (or id) and arguments.

pub(crate) mod budget;
pub(crate) mod outcome;
pub(crate) mod question;
pub(crate) mod run_query;
pub(crate) mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::{Stream, TryStreamExt, future, stream};
use kernel_proto::v1 as pb;
use pb::approval_service_client::ApprovalServiceClient;
use pb::registry_service_client::RegistryServiceClient;
use pb::run_service_client::RunServiceClient;
use pb::tool_call_service_client::ToolCallServiceClient;
use serde_json::Value;
use tonic::transport::Channel;

use crate::auth::{self, ApiKey};
use crate::error::ErrorKind;
use crate::tls::Tls;
use crate::transport;
pub use budget::BudgetLimit;
use outcome::{ApprovalDecision, Outcome, ToolCallRejected};
pub use question::AgentQuestion;
pub use run_query::{RunPage, RunQuery};

/// Why an agent request failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The kernel answered with an error status (unknown run, run already ended, bad input).
    #[error("kernel error ({code:?}): {message}", code = .0.code(), message = .0.message())]
    Status(tonic::Status),
    /// The kernel could not be reached.
    #[error("cannot reach the kernel: {0}")]
    Transport(String),
    /// A JSON payload could not be encoded or decoded.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The kernel's answer lacked something it must carry.
    #[error("unexpected answer from the kernel: {0}")]
    Protocol(String),
    /// The client was configured with something it cannot use (such as an API key that cannot
    /// travel as metadata).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The turn gave a call an explicit id that another turn's call, still in flight, holds with
    /// another tool or other arguments (Pyrula's `ConcurrentCallIdError`); nothing was recorded.
    #[error("{0}")]
    ConcurrentCallId(String),
    /// A hosted handler failed; the run fails with this reason.
    #[error("{0}")]
    Failed(String),
    /// A hosted handler is not deterministic: a place of its order holds another step than the
    /// one recorded there. The run fails with this, whatever the handler does with it.
    #[error("{0}")]
    ReplayInputChanged(String),
    /// A subagent's child run failed or was cancelled.
    #[error("subagent '{agent}' (run {run_id}) did not complete: {message}")]
    Subagent {
        /// The child's agent.
        agent: String,
        /// The child run.
        run_id: String,
        /// How it ended.
        message: String,
    },
    /// An operation that could wait on something durable (a person, a child run) was called
    /// inside a local step, where nothing may suspend.
    #[error("{0}")]
    NestedDurableOperation(String),
    /// The policy denied a hosted handler's local step (it never ran): the handler sees this,
    /// unlike a denied tool call, which is a result the model reads.
    #[error("{message}")]
    Denied {
        /// The step's identity, `step:<id>#<occurrence>`.
        step: String,
        /// `step:<id> not allowed. reason: ...`.
        message: String,
    },
    /// A hosted handler's local step failed (now, or when it was recorded).
    #[error("step {step} failed: {message}")]
    Step {
        /// The step's identity, `step:<id>#<occurrence>`.
        step: String,
        /// The step's error.
        message: String,
    },
    /// A hosted handler's question to a person got no answer: declined, or expired without a
    /// default, or withdrawn with its run.
    #[error("{message}")]
    Unanswered {
        /// The question's identity, `question:agent#<n>`.
        question: String,
        /// Why, as the log says it (`the question of 'planner' was declined by alice`).
        message: String,
    },
}

impl AgentError {
    /// A hosted handler's own failure: the run fails with `message` as its reason.
    pub fn failed(message: impl std::fmt::Display) -> Self {
        AgentError::Failed(message.to_string())
    }
}

/// The error for a failed call to the kernel at `addr`: for a broken connection, with what to do
/// about it when [`transport::diagnose`] can tell (it may look at the address once).
async fn failed(addr: Option<&str>, status: tonic::Status) -> AgentError {
    let connection = matches!(
        status.code(),
        tonic::Code::Internal | tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    );
    if let (true, Some(addr)) = (connection, addr) {
        let described = transport::describe_status(&status);
        if let Some(hint) = transport::diagnose(addr, &described).await {
            return AgentError::Transport(format!("{described} ({hint})"));
        }
    }
    AgentError::from(status)
}

/// Whether `error` says the kernel went away (it is stopping, restarting, or unreachable) rather
/// than refused the request: then the same request, sent again, may succeed.
fn kernel_went_away(error: &AgentError) -> bool {
    match error {
        AgentError::Transport(_) => true,
        AgentError::Status(status) => matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown),
        _ => false,
    }
}

impl From<tonic::Status> for AgentError {
    /// A status the channel made from a failed connection (not an answer of the kernel) is a
    /// transport error, with what to do about it when that is known (a plaintext client on a TLS
    /// kernel sees only `h2 protocol error`).
    fn from(status: tonic::Status) -> Self {
        let described = transport::describe_status(&status);
        if status.code() == tonic::Code::AlreadyExists && status.message().starts_with("concurrent_call_id:") {
            return AgentError::ConcurrentCallId(status.message().to_owned());
        }
        match transport::connection_hint("", &described) {
            Some(hint)
                if matches!(
                    status.code(),
                    tonic::Code::Internal | tonic::Code::Unavailable | tonic::Code::Unknown
                ) =>
            {
                AgentError::Transport(format!("{described} ({hint})"))
            }
            _ => AgentError::Status(status),
        }
    }
}

impl From<tonic::transport::Error> for AgentError {
    fn from(error: tonic::transport::Error) -> Self {
        AgentError::Transport(transport::describe(&error))
    }
}

/// A run to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// Name of the agent, for listing and policy.
    pub agent: String,
    /// The run's input.
    pub input: Value,
    /// Free-form labels to filter runs by.
    pub labels: BTreeMap<String, String>,
    /// With a key, creating the run again returns the first run instead of a new one.
    pub idempotency_key: Option<String>,
    /// Cap on tool calls in the run; 0 means unlimited.
    pub max_tool_calls: u32,
    /// The run cannot wait for a person: calls that need approval are refused or denied.
    pub non_interactive: bool,
    /// Permissions the run asks for, for policies that require them. With API keys, each must be
    /// among the creating key's grants.
    pub permissions: Vec<String>,
    /// What inspection (`runs show`, events, approvals) shows of the run's arguments and results.
    pub capture: Capture,
    /// At most this many calls of one of the run's turns run at once, unless a turn says
    /// otherwise; 0: only the workers' slots bound them.
    pub max_concurrency: u32,
    /// A case run's allow tokens (see [`NewRun::allow`]).
    pub allow: Vec<String>,
    /// The W3C `traceparent` of the agent's current span, which parents the run's spans (see
    /// [`NewRun::traceparent`]).
    pub traceparent: Option<String>,
    /// What the run may spend on tool calls (see [`NewRun::budget`]).
    pub budget: Vec<BudgetLimit>,
}

/// What inspection shows of a run's arguments, results, input and error texts; replay always has
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Capture {
    /// Nothing: not even sizes or error texts.
    None,
    /// Their size and hash, not their content.
    Metadata,
    /// Everything (the default).
    #[default]
    Io,
}

impl NewRun {
    /// A run of `agent` on `input`, without labels, key, limit or permissions, interactive, with
    /// everything captured.
    pub fn new(agent: impl Into<String>, input: Value) -> Self {
        Self {
            agent: agent.into(),
            input,
            labels: BTreeMap::new(),
            idempotency_key: None,
            non_interactive: false,
            permissions: Vec::new(),
            max_tool_calls: 0,
            max_concurrency: 0,
            capture: Capture::Io,
            allow: Vec::new(),
            traceparent: None,
            budget: Vec::new(),
        }
    }

    /// Adds a limit to the run's budget (repeatable): each holds, beside those the kernel's policy
    /// gives runs with these labels.
    pub fn budget(mut self, limit: BudgetLimit) -> Self {
        self.budget.push(limit);
        self
    }

    /// Sends the agent's trace context (a W3C `traceparent`, as an OpenTelemetry propagator
    /// injects it): the run's span, and with it every call's, becomes a child of the agent's span,
    /// and tools are handed the context ([`ToolContext::trace_context`](crate::ToolContext::trace_context)).
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// Makes the run a case run allowed `token` (repeatable): `tool:<name>` lets the model's calls
    /// of that tool run live, `step:<id>` a hosted handler's local step. A case run otherwise runs
    /// only reads live (`read_only` tools, `read` and `pure` steps, subagents) and refuses any other
    /// effect with `write_tool_blocked`, which ends it: the way to test a write on purpose.
    pub fn allow(mut self, token: impl Into<String>) -> Self {
        self.allow.push(token.into());
        self
    }

    /// Marks the run as unable to wait for a person: a turn offering a tool that always needs
    /// approval is refused, and a call a policy would ask about is denied.
    pub fn non_interactive(mut self) -> Self {
        self.non_interactive = true;
        self
    }

    /// Asks for a permission (repeatable), for policies with `require_permissions`.
    pub fn permission(mut self, permission: impl Into<String>) -> Self {
        self.permissions.push(permission.into());
        self
    }

    /// Sets what inspection shows of the run's arguments and results.
    pub fn capture(mut self, capture: Capture) -> Self {
        self.capture = capture;
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets the idempotency key.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Caps the number of tool calls.
    pub fn max_tool_calls(mut self, max: u32) -> Self {
        self.max_tool_calls = max;
        self
    }

    /// Runs at most `max` calls of one turn at once (Rewyn's `max_concurrency`); the others wait
    /// in the kernel, in position order, and results still come back in position order.
    pub fn max_concurrency(mut self, max: u32) -> Self {
        self.max_concurrency = max;
        self
    }
}

/// A branch to make of a recorded run, for [`AgentClient::fork_run`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fork {
    pub(crate) run_id: String,
    pub(crate) at: Option<String>,
    pub(crate) input: Option<Value>,
    pub(crate) set_results: BTreeMap<String, Value>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) budget: Vec<BudgetLimit>,
}

impl Fork {
    /// A branch of run `run_id` replaying all of its record, with its input and labels.
    pub fn of(run_id: impl Into<String>) -> Self {
        Self {
            run_id: run_id.into(),
            at: None,
            input: None,
            set_results: BTreeMap::new(),
            labels: BTreeMap::new(),
            idempotency_key: None,
            budget: Vec::new(),
        }
    }

    /// Gives the branch a budget of its own (repeatable); with none it has its parent's limits,
    /// with nothing spent.
    pub fn budget(mut self, limit: BudgetLimit) -> Self {
        self.budget.push(limit);
        self
    }

    /// Replays the parent's record only up to and including step `step_key` (`t2/p0`,
    /// `step:plan#0`, ...); after it only reads run live.
    pub fn at(mut self, step_key: impl Into<String>) -> Self {
        self.at = Some(step_key.into());
        self
    }

    /// Runs the branch on another input.
    pub fn input(mut self, input: Value) -> Self {
        self.input = Some(input);
        self
    }

    /// Replays `result` as the recorded result of step `step_key` (at or before the fork point).
    pub fn set_result(mut self, step_key: impl Into<String>, result: Value) -> Self {
        self.set_results.insert(step_key.into(), result);
        self
    }

    /// Adds a label (with none, the branch has its parent's).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets the idempotency key: a repeated fork with it returns the first branch.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

/// One tool call of a turn, as the model asked for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The tool's name.
    pub tool: String,
    /// The arguments object.
    pub arguments: Value,
    /// Optional identity of the call instead of its position in the turn.
    pub id: Option<String>,
    /// Optional timeout of this call, overriding the tool's own.
    pub timeout: Option<std::time::Duration>,
}

impl Call {
    /// A call of `tool` with `arguments` (a JSON object), identified by its position.
    pub fn new(tool: impl Into<String>, arguments: Value) -> Self {
        Self {
            tool: tool.into(),
            arguments,
            id: None,
            timeout: None,
        }
    }

    /// Identifies the call by `id` rather than its position, so it keeps its recorded result
    /// even if a regenerated turn orders calls differently.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Gives this call its own timeout, overriding the tool's.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallStatus {
    /// The tool returned a result.
    Ok,
    /// A recoverable error: the model reads `content` and may try something else.
    Error,
    /// The call was cancelled.
    Cancelled,
}

/// The result of one call, in the form a model loop needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    /// The call's position in its turn.
    pub position: u32,
    /// The call's identity in the run.
    pub step_key: String,
    /// The tool's name.
    pub tool: String,
    /// How the call ended.
    pub status: CallStatus,
    /// What the model reads: a string result as is, other JSON compact with sorted keys, or the
    /// error text.
    pub content: String,
    /// The result when the call succeeded.
    pub output: Option<Value>,
    /// The error's kind when the call failed with one.
    pub error_kind: Option<ErrorKind>,
    /// Served from the log: the call had already run.
    pub replayed: bool,
    /// Attempts the call took.
    pub attempts: u32,
    /// Why the call ended as it did, for the program (the model reads `content`).
    pub outcome: Outcome,
    /// The policy preset, rule or tool flag that allowed, denied or gated the call.
    pub decided_by: Option<String>,
    /// The answer to the call's approval, when it was gated.
    pub approval: Option<ApprovalDecision>,
}

impl CallOutcome {
    /// The rejection, when the call was gated and not approved (rejected by a person, or its
    /// approval expired): match on it, or return it as the agent's error.
    pub fn rejection(&self) -> Option<ToolCallRejected> {
        let expired = match self.outcome {
            Outcome::Rejected => false,
            Outcome::Expired => true,
            _ => return None,
        };
        let approval = self.approval.as_ref();
        Some(ToolCallRejected {
            tool_name: self.tool.clone(),
            reason: approval.and_then(|a| a.reason.clone()),
            expired,
            decider: approval.map(|a| a.decider.clone()).unwrap_or_default(),
        })
    }
}

/// A progress update from a call still running.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressUpdate {
    /// The call's position in its turn.
    pub position: u32,
    /// The call's identity in the run.
    pub step_key: String,
    /// The tool's name.
    pub tool: String,
    /// The status line.
    pub message: String,
    /// How far along the call is, out of `total`.
    pub current: Option<u64>,
    /// The amount of work `current` counts towards.
    pub total: Option<u64>,
    /// Structured detail.
    pub data: Option<Value>,
}

/// One item of a turn's stream: progress while calls run, then a result per call in position order.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnItem {
    /// A running call reported progress.
    Progress(ProgressUpdate),
    /// A call waits for a person's approval; its result follows once someone answers.
    Interrupted(Interruption),
    /// A call ended.
    Result(CallOutcome),
}

/// A call of the turn parked until a person approves or rejects it.
#[derive(Debug, Clone, PartialEq)]
pub struct Interruption {
    /// The call's position in its turn.
    pub position: u32,
    /// The call's identity in the run.
    pub step_key: String,
    /// The tool that was called.
    pub tool: String,
    /// Why the call waits: `tool_approval`, `budget_exceeded` (answer with a higher limit) or
    /// `human_input`.
    pub reason: String,
    /// The approval a reviewer answers (`kernelctl approvals approve ID`).
    pub approval_id: String,
    /// The exact arguments the approval covers.
    pub arguments: Value,
    /// What the approver is told.
    pub message: String,
}

/// A run and its steps as the kernel records them.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSnapshot {
    /// The run.
    pub run: pb::Run,
    /// Its tool calls, in order.
    pub steps: Vec<pb::Step>,
}

/// A connection to the kernel for agents. Cloning it is cheap and shares the connection.
#[derive(Debug, Clone)]
pub struct AgentClient {
    runs: RunServiceClient<Channel>,
    calls: ToolCallServiceClient<Channel>,
    registry: RegistryServiceClient<Channel>,
    approvals: ApprovalServiceClient<Channel>,
    api_key: Option<ApiKey>,
    /// The address connected to, to say what to do when the connection fails.
    addr: Option<Arc<str>>,
    /// How long [`RunHandle::call_turn`] resubmits a turn the kernel went away from.
    reconnect: std::time::Duration,
}

/// How long a turn is resubmitted while the kernel is away (stopping, restarting, or a replica
/// gone), unless [`AgentClient::reconnect_for`] says otherwise.
pub const DEFAULT_RECONNECT: std::time::Duration = std::time::Duration::from_secs(60);

impl AgentClient {
    /// Connects to the kernel at `addr` (`http://127.0.0.1:50051`, or `127.0.0.1:50051`).
    pub async fn connect(addr: impl AsRef<str>) -> Result<Self, AgentError> {
        let channel = transport::connect_secure(addr.as_ref(), None)
            .await
            .map_err(AgentError::Transport)?;
        Ok(Self::from_channel(channel).at(addr.as_ref()))
    }

    /// Connects over TLS to the kernel at `addr` (`https://kernel:50051`, or `kernel:50051`).
    pub async fn connect_tls(addr: impl AsRef<str>, tls: Tls) -> Result<Self, AgentError> {
        let channel = transport::connect_secure(addr.as_ref(), Some(&tls))
            .await
            .map_err(AgentError::Transport)?;
        Ok(Self::from_channel(channel).at(addr.as_ref()))
    }

    fn at(mut self, addr: &str) -> Self {
        self.addr = Some(addr.into());
        self
    }

    /// Awaits a call and unwraps its answer; a failed connection (not a refusal by the kernel)
    /// says what to do about it when that is known, such as a plaintext address for a TLS kernel.
    async fn call<T>(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, AgentError> {
        match call.await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(failed(self.addr.as_deref(), status).await),
        }
    }

    /// Uses an existing channel.
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            runs: RunServiceClient::new(channel.clone()),
            registry: RegistryServiceClient::new(channel.clone()),
            approvals: ApprovalServiceClient::new(channel.clone()),
            calls: ToolCallServiceClient::new(channel),
            api_key: None,
            addr: None,
            reconnect: DEFAULT_RECONNECT,
        }
    }

    /// How long [`RunHandle::call_turn`] goes on resubmitting a turn while the kernel is away (it
    /// drains to stop, restarts, or the replica behind the address changes): each resubmission
    /// gets the recorded results and joins the calls in flight, so nothing runs twice.
    /// [`std::time::Duration::ZERO`] turns it off.
    pub fn reconnect_for(mut self, window: std::time::Duration) -> Self {
        self.reconnect = window;
        self
    }

    /// Sends `secret` as `authorization: Bearer <secret>` on every call, for a kernel that
    /// requires API keys (the key needs `runs:write` and `tools:call`; `runs:read` for
    /// [`RunHandle::get`]).
    pub fn api_key(mut self, secret: impl AsRef<str>) -> Result<Self, AgentError> {
        self.api_key = Some(ApiKey::new(secret.as_ref()).map_err(AgentError::Config)?);
        Ok(self)
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        auth::request(message, self.api_key.as_ref())
    }

    /// Every tool the kernel knows (`RegistryService.ListTools`), with the workers that offer it
    /// now (none: registered once, not offered); the key needs `runs:read`.
    pub async fn registered_tools(&self) -> Result<Vec<pb::RegisteredTool>, AgentError> {
        let request = self.request(pb::ListToolsRequest {});
        Ok(self.call(self.registry.clone().list_tools(request)).await?.tools)
    }

    /// Runs that meet every filter of `query`, newest first, a page at a time
    /// (`RunService.ListRuns`); the key needs `runs:read`. A malformed run id in a filter is
    /// `INVALID_ARGUMENT` naming its field.
    pub async fn list_runs(&self, query: RunQuery) -> Result<RunPage, AgentError> {
        let request = self.request(query.into_request());
        let listed = self.call(self.runs.clone().list_runs(request)).await?;
        Ok(RunPage {
            runs: listed.runs,
            next_page_token: listed.next_page_token,
        })
    }

    /// Approvals in one status (`ApprovalService.ListApprovals`), of one run or of all; the
    /// pending ones for [`pb::ApprovalStatus::Unspecified`]. The key needs `runs:read`.
    pub async fn list_approvals(
        &self,
        run_id: Option<&str>,
        status: pb::ApprovalStatus,
    ) -> Result<Vec<pb::Approval>, AgentError> {
        let request = self.request(pb::ListApprovalsRequest {
            status: status as i32,
            run_id: run_id.unwrap_or_default().to_owned(),
        });
        Ok(self
            .call(self.approvals.clone().list_approvals(request))
            .await?
            .approvals)
    }

    /// Approves a waiting call: it runs, once, with exactly the arguments the approval shows.
    /// With keys the kernel records the key's name as the decider (`decider` is for a kernel
    /// without keys); the key needs `approvals:write` and, when the approval names approvers, to
    /// be one of them (else `PERMISSION_DENIED`). An approval already answered or expired is
    /// `FAILED_PRECONDITION`.
    pub async fn approve(
        &self,
        approval_id: impl Into<String>,
        decider: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<pb::Approval, AgentError> {
        self.approve_with(approval_id.into(), (decider.into(), reason.into()), String::new())
            .await
    }

    /// Answers a tool body's question (an approval whose `question` is set) with `answer`, which
    /// must meet the question's `answer_schema_json` (else `INVALID_ARGUMENT` naming
    /// `answer_json`, and nothing is written); the body that asked gets it back. An approval that
    /// asks to raise a budget (interruption reason `budget_exceeded`) is answered the same way,
    /// with the limit's new bounds (`{"max_cost": 10.0}`), and the call runs under them. Keys and other
    /// refusals as for [`AgentClient::approve`]; [`AgentClient::reject`] declines to answer.
    pub async fn answer(
        &self,
        approval_id: impl Into<String>,
        answer: &serde_json::Value,
        decider: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<pb::Approval, AgentError> {
        let answer = kernel_proto::canonical::to_canonical(answer);
        self.approve_with(approval_id.into(), (decider.into(), reason.into()), answer)
            .await
    }

    async fn approve_with(
        &self,
        approval_id: String,
        (decider, reason): (String, String),
        answer_json: String,
    ) -> Result<pb::Approval, AgentError> {
        let request = self.request(pb::ApproveCallRequest {
            approval_id,
            decider,
            reason,
            answer_json,
        });
        let response = self.call(self.approvals.clone().approve_call(request)).await?;
        response
            .approval
            .ok_or_else(|| AgentError::Protocol("ApproveCall returned no approval".into()))
    }

    /// A signed receipt of each settled call of run `run_id`, in the order the calls settled: each
    /// `{"receipt": {...}, "hash", "signature", "key"}`, the receipt holding the call's identity,
    /// tool, version and fingerprint, the SHA-256 of its arguments and of its result, its
    /// outcome, what decided it and when, and `prev`, the hash of the receipt before it. Written
    /// one a line as canonical JSON ([`kernel_proto::canonical::to_canonical`]), they are what
    /// `kernelctl receipts verify` checks offline (and [`kernel_proto::receipt::verify`] in code).
    pub async fn receipts(&self, run_id: impl Into<String>) -> Result<Vec<serde_json::Value>, AgentError> {
        let request = self.request(pb::ListReceiptsRequest { run_id: run_id.into() });
        let response = self.call(self.runs.clone().list_receipts(request)).await?;
        response
            .receipts_json
            .iter()
            .map(|line| serde_json::from_str(line).map_err(AgentError::from))
            .collect()
    }

    /// Rejects a waiting call: the model reads that it was not approved, with `reason`. Keys and
    /// refusals as for [`AgentClient::approve`].
    pub async fn reject(
        &self,
        approval_id: impl Into<String>,
        decider: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<pb::Approval, AgentError> {
        let request = self.request(pb::RejectCallRequest {
            approval_id: approval_id.into(),
            decider: decider.into(),
            reason: reason.into(),
        });
        let response = self.call(self.approvals.clone().reject_call(request)).await?;
        response
            .approval
            .ok_or_else(|| AgentError::Protocol("RejectCall returned no approval".into()))
    }

    /// Creates a run; with an idempotency key that matches an earlier run, returns that run.
    pub async fn create_run(&self, mut run: NewRun) -> Result<RunHandle, AgentError> {
        let traceparent = run.traceparent.take();
        let mut request = self.request(wire::create_run_request(run));
        if let Some(traceparent) = traceparent {
            let value = crate::TraceContext::parse(&traceparent)
                .and_then(|context| context.traceparent().parse().ok())
                .ok_or_else(|| AgentError::Config(format!("{traceparent:?} is not a W3C traceparent")))?;
            request.metadata_mut().insert("traceparent", value);
        }
        let response = self.call(self.runs.clone().create_run(request)).await?;
        let run = response
            .run
            .ok_or_else(|| AgentError::Protocol("create run answered without a run".into()))?;
        Ok(RunHandle {
            id: run.id,
            created: response.created,
            client: self.clone(),
            offered_tools: Arc::default(),
            max_concurrency: 0,
        })
    }

    /// Makes a branch of a recorded run (`RunService.ForkRun`): a new run that replays the
    /// parent's recorded steps up to the fork point, runs only reads live, and refuses any other
    /// effect the parent never recorded with `write_tool_blocked` (which ends it). A hosted
    /// parent's branch is dispatched by the kernel; drive any other with the returned handle.
    pub async fn fork_run(&self, fork: Fork) -> Result<RunHandle, AgentError> {
        let response = self
            .call(self.runs.clone().fork_run(self.request(wire::fork_run_request(fork))))
            .await?;
        let run = response
            .run
            .ok_or_else(|| AgentError::Protocol("fork run answered without a run".into()))?;
        Ok(RunHandle {
            id: run.id,
            created: response.created,
            client: self.clone(),
            offered_tools: Arc::default(),
            max_concurrency: 0,
        })
    }

    /// A handle on an existing run, for example to resubmit its turns after a crash.
    pub fn run(&self, id: impl Into<String>) -> RunHandle {
        RunHandle {
            id: id.into(),
            created: false,
            client: self.clone(),
            offered_tools: Arc::default(),
            max_concurrency: 0,
        }
    }
}

/// One run, to submit turns to and end. Cloning it is cheap.
#[derive(Debug, Clone)]
pub struct RunHandle {
    id: String,
    created: bool,
    client: AgentClient,
    /// The tools the model is offered, sent with every turn; empty: none named.
    offered_tools: Arc<[String]>,
    /// The bound on each turn's calls running at once; 0: the run's own.
    max_concurrency: u32,
}

impl RunHandle {
    /// The same run, sending with every turn the tools the model was offered: a call to a tool
    /// outside them comes back as an unknown tool listing them, and a resubmitted call recorded
    /// for a tool no longer offered fails with `replay_input_changed`.
    pub fn offering<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.offered_tools = tools.into_iter().map(Into::into).collect();
        self
    }

    /// The same run, running at most `max` calls of each turn at once (the others wait in the
    /// kernel, in position order); 0 takes the run's own bound.
    pub fn max_concurrency(mut self, max: u32) -> Self {
        self.max_concurrency = max;
        self
    }

    /// The run's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether [`AgentClient::create_run`] made a new run (false when its idempotency key
    /// matched an earlier one, or for a handle from [`AgentClient::run`]).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Submits one turn's calls. The stream yields progress as it happens and one result per
    /// call, in position order, each after the kernel recorded it.
    pub fn submit_turn(
        &self,
        turn: u32,
        calls: Vec<Call>,
    ) -> impl Stream<Item = Result<TurnItem, AgentError>> + Send + 'static {
        let request = self.client.request(wire::submit_turn_request(
            &self.id,
            turn,
            calls,
            (&self.offered_tools, self.max_concurrency),
        ));
        let mut client = self.client.calls.clone();
        let addr = self.client.addr.clone();
        let opened = async move {
            match client.submit_turn(request).await {
                Ok(response) => Ok(response.into_inner()),
                Err(status) => Err(failed(addr.as_deref(), status).await),
            }
        };
        stream::once(opened)
            .map_ok(|responses| responses.map_err(AgentError::from))
            .try_flatten()
            .try_filter_map(|response| future::ready(wire::turn_item(response)))
    }

    /// Submits one turn's calls and returns their results in position order, ignoring progress;
    /// a call parked for approval is waited for until someone answers. When the kernel goes away
    /// meanwhile (it drains to stop, or the connection breaks), the turn is submitted again, with
    /// a backoff, for up to [`AgentClient::reconnect_for`]: the kernel answers a resubmitted turn
    /// from its record, so no call runs twice.
    pub async fn call_turn(&self, turn: u32, calls: Vec<Call>) -> Result<Vec<CallOutcome>, AgentError> {
        let deadline = tokio::time::Instant::now() + self.client.reconnect;
        let mut backoff = std::time::Duration::from_millis(100);
        loop {
            match self.collect_turn(turn, calls.clone()).await {
                Err(error) if kernel_went_away(&error) && tokio::time::Instant::now() + backoff < deadline => {
                    tracing::warn!(
                        run_id = self.id,
                        turn,
                        %error,
                        retry_in_ms = backoff.as_millis() as u64,
                        "the kernel went away during the turn; submitting it again"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(2));
                }
                outcome => return outcome,
            }
        }
    }

    async fn collect_turn(&self, turn: u32, calls: Vec<Call>) -> Result<Vec<CallOutcome>, AgentError> {
        self.submit_turn(turn, calls)
            .try_filter_map(|item| {
                future::ready(Ok(match item {
                    TurnItem::Result(outcome) => Some(outcome),
                    TurnItem::Progress(_) | TurnItem::Interrupted(_) => None,
                }))
            })
            .try_collect()
            .await
    }

    /// Ends the run as completed with its output.
    pub async fn complete(&self, output: Value) -> Result<(), AgentError> {
        let request = pb::CompleteRunRequest {
            run_id: self.id.clone(),
            output_json: kernel_proto::canonical::to_canonical(&output),
        };
        let client = &self.client;
        client
            .call(client.runs.clone().complete_run(client.request(request)))
            .await?;
        Ok(())
    }

    /// Ends the run as failed.
    pub async fn fail(&self, reason: impl Into<String>) -> Result<(), AgentError> {
        let request = pb::FailRunRequest {
            run_id: self.id.clone(),
            reason: reason.into(),
        };
        let client = &self.client;
        client
            .call(client.runs.clone().fail_run(client.request(request)))
            .await?;
        Ok(())
    }

    /// Cancels the run: its calls in flight are settled first.
    pub async fn cancel(&self, reason: impl Into<String>) -> Result<(), AgentError> {
        let request = pb::CancelRunRequest {
            run_id: self.id.clone(),
            reason: reason.into(),
        };
        let client = &self.client;
        client
            .call(client.runs.clone().cancel_run(client.request(request)))
            .await?;
        Ok(())
    }

    /// Asks a person `question` from the agent's own code (Pyrula's `ctx.interrupt`) and returns
    /// the answer, checked by the kernel against the question's schema and choices. `id` is the
    /// question's identity in the run (1 to 128 of `A-Z a-z 0-9 _ . -`), which the agent keeps
    /// across its restarts: asked again under it, the recorded answer comes back (or the open
    /// question is waited on again) and nobody is asked twice; another question under it is
    /// refused (`replay_input_changed`). The run is blocked with `run:interrupted` (reason
    /// `human_input`) until someone answers: `kernelctl runs answer RUN question:run#<id> --with
    /// JSON`, the console, [`AgentClient::answer`] or an MCP client's input. Declined, or expired
    /// without a default, it is [`AgentError::Unanswered`]. A hosted run asks from its handler
    /// ([`AgentContext::ask`](crate::AgentContext::ask)). The key needs `runs:write`.
    pub fn ask(&self, id: impl Into<String>, question: impl Into<String>) -> AgentQuestion {
        AgentQuestion::new(self.clone(), id.into(), question.into())
    }

    /// Cancels one call of the run, `step_key` (`t<turn>/p<position>`, or `id:<call id>`), and
    /// leaves the run going: a call pending, waiting for a slot or for a person, or running (its
    /// worker is told to stop) ends with one result, status cancelled, whose content the model
    /// reads as `cancelled: <reason>`; the turn waiting on it gets that result. Returns the call as
    /// it now stands. A call already settled is refused (`FAILED_PRECONDITION`, naming how it
    /// ended), an unknown one `NOT_FOUND`.
    pub async fn cancel_call(
        &self,
        step_key: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<pb::Step, AgentError> {
        let request = pb::CancelCallRequest {
            run_id: self.id.clone(),
            step_key: step_key.into(),
            reason: reason.into(),
        };
        let client = &self.client;
        let response = client
            .call(client.calls.clone().cancel_call(client.request(request)))
            .await?;
        response
            .step
            .ok_or_else(|| AgentError::Protocol("CancelCall returned no step".into()))
    }

    /// The run and its steps as recorded now.
    pub async fn get(&self) -> Result<RunSnapshot, AgentError> {
        let client = &self.client;
        let request = client.request(pb::GetRunRequest {
            run_id: self.id.clone(),
        });
        let response = client.call(client.runs.clone().get_run(request)).await?;
        let run = response
            .run
            .ok_or_else(|| AgentError::Protocol("get run answered without a run".into()))?;
        Ok(RunSnapshot {
            run,
            steps: response.steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_id_held_by_another_turn_is_its_own_error() {
        let status = tonic::Status::already_exists("concurrent_call_id: calls[0] has call_id 'order-9', ...");
        assert!(matches!(AgentError::from(status), AgentError::ConcurrentCallId(m) if m.contains("order-9")));
        let other = tonic::Status::already_exists("idempotency_key 'k' is already used");
        assert!(matches!(AgentError::from(other), AgentError::Status(_)));
    }
}
