//! What a running tool knows about its call: identity, attempt, cancellation, a progress
//! emitter, the tool's own cache and the application's deps.
//!
//! The worker builds one [`ToolContext`] per dispatch. Tests build one with
//! [`ToolContext::for_test`] and call the tool function directly, no kernel needed.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use kernel_proto::v1 as pb;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::agent::AgentError;
use crate::deps::Deps;
use crate::error::ToolError;
use crate::hosted::subagent::{ChildRun, KernelLink, child_outcome, is_settled};
use crate::worker::cache::{CacheBackend, ToolCache};
use crate::worker::session::{DispatchRef, Outbound};

/// An ephemeral update from a running tool, streamed live to whoever watches the run.
///
/// Progress is not logged event by event; the kernel counts updates on the call's result.
///
/// ```
/// use worker_sdk::Progress;
///
/// let update = Progress::new("copied 3 of 10 files").step(3, 10);
/// assert_eq!(update.total, Some(10));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    /// A short human-readable status line.
    pub message: String,
    /// How far along the call is, out of `total`.
    pub current: Option<u64>,
    /// The amount of work `current` counts towards.
    pub total: Option<u64>,
    /// Optional structured detail.
    pub data: Option<Value>,
}

impl Progress {
    /// A status line with no fraction and no data.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            ..Self::default()
        }
    }

    /// Sets the fraction done: `current` of `total`.
    pub fn step(mut self, current: u64, total: u64) -> Self {
        self.current = Some(current);
        self.total = Some(total);
        self
    }

    /// Attaches structured detail.
    pub fn data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// Identity of one dispatched call, as the kernel sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallInfo {
    pub(crate) run_id: String,
    pub(crate) call_id: Option<String>,
    pub(crate) step_key: String,
    pub(crate) turn: u32,
    pub(crate) position: u32,
    pub(crate) idempotency_key: String,
    pub(crate) attempt: u32,
    pub(crate) dispatch_id: String,
    pub(crate) timeout: Option<Duration>,
    pub(crate) trace: Option<crate::TraceContext>,
}

impl CallInfo {
    fn for_test() -> Self {
        Self {
            run_id: "test-run".into(),
            call_id: None,
            step_key: "t0/p0".into(),
            turn: 0,
            position: 0,
            idempotency_key: "test-run/t0/p0".into(),
            attempt: 1,
            dispatch_id: "test-dispatch".into(),
            timeout: None,
            trace: None,
        }
    }
}

/// Where progress updates go.
#[derive(Debug, Clone)]
pub(crate) enum ProgressSink {
    /// Nowhere: a test context without a progress channel.
    Discard,
    /// The worker session's outbound stream, tagged with the dispatch they belong to.
    Session {
        tx: mpsc::Sender<Outbound>,
        dispatch: DispatchRef,
    },
    /// A channel a test reads.
    Test(mpsc::UnboundedSender<Progress>),
}

impl ProgressSink {
    fn send(&self, progress: Progress) {
        match self {
            ProgressSink::Discard => {}
            ProgressSink::Session { tx, dispatch } => {
                // Progress is best effort: keep half the queue free so heartbeats and results
                // never wait behind a chatty tool.
                if tx.capacity() * 2 <= tx.max_capacity() {
                    debug!(dispatch_id = %dispatch.id, "progress dropped, outbound queue busy");
                    return;
                }
                let message = Outbound::Progress {
                    dispatch: dispatch.clone(),
                    progress,
                };
                if tx.try_send(message).is_err() {
                    debug!(dispatch_id = %dispatch.id, "progress dropped, session closed or busy");
                }
            }
            ProgressSink::Test(tx) => {
                let _ = tx.send(progress);
            }
        }
    }
}

/// The context a tool runs in. Cloning it is cheap.
///
/// ```
/// use worker_sdk::ToolContext;
///
/// let ctx = ToolContext::for_test().with_dep(String::from("config"));
/// assert_eq!(ctx.attempt(), 1);
/// assert_eq!(ctx.deps::<String>().as_deref().map(String::as_str), Some("config"));
/// assert!(!ctx.is_cancelled());
/// ```
#[derive(Debug, Clone)]
pub struct ToolContext {
    call: Arc<CallInfo>,
    tool: Arc<str>,
    cancel: CancellationToken,
    progress: ProgressSink,
    cache: CacheBackend,
    deps: Deps,
    /// The kernel, for subagents; `None` in a test context.
    kernel: Option<KernelLink>,
    subagents: Arc<Subagents>,
}

/// The subagents a tool body started and waits on.
#[derive(Debug, Default)]
struct Subagents {
    /// How many of each agent the body started in this attempt.
    occurrences: Mutex<HashMap<String, u32>>,
    /// The subagent steps the body waits on now, with how many waits name each.
    waiting: Mutex<BTreeMap<String, usize>>,
    changed: Notify,
}

/// Counts a wait on a subagent step until dropped.
struct Waiting(Arc<Subagents>, String);

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiting = self.0.waiting.lock().expect("waits poisoned");
        if let Some(count) = waiting.get_mut(&self.1) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.1);
            }
        }
        drop(waiting);
        self.0.changed.notify_waiters();
    }
}

mod call;

/// How long a tool body must wait on its subagents alone before its call gives back its slot.
const SUSPEND_AFTER: Duration = Duration::from_millis(100);

/// A subagent a tool body starts; await it (see [`ToolContext::subagent`]).
#[must_use = "a subagent starts when awaited"]
pub struct ToolSubagent {
    ctx: ToolContext,
    agent: String,
    input: Value,
    session: Option<String>,
}

impl ToolSubagent {
    /// Starts it on session `key`: subagents of one session run one at a time, in order of
    /// start, each continuing from the last one that completed. Derive the key from the run's id
    /// so no other run can reuse it.
    pub fn session(mut self, key: impl Into<String>) -> Self {
        self.session = Some(key.into());
        self
    }
}

impl std::future::IntoFuture for ToolSubagent {
    type Output = Result<Value, ToolError>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.ctx.run_subagent(self.agent, self.input, self.session).await })
    }
}

/// A question a tool body puts to a person; await it (see [`ToolContext::ask`]).
#[must_use = "a question is asked when awaited"]
pub struct ToolQuestion {
    ctx: ToolContext,
    question: String,
    schema: Option<Value>,
    approvers: Vec<String>,
    timeout: Option<Duration>,
    choices: Vec<String>,
    default: Option<Value>,
    /// The call keeps its slot while it waits, whatever its idempotency.
    hold: bool,
}

impl ToolQuestion {
    /// Keeps the call's worker slot while the person answers: for a body whose state cannot
    /// survive being dropped and run again (a request in flight elsewhere).
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn holding_slot(mut self) -> Self {
        self.hold = true;
        self
    }

    /// The JSON Schema the answer must meet; without one any JSON is an answer. The kernel
    /// refuses an answer that does not meet it, so the body gets only answers that do.
    pub fn schema(mut self, schema: Value) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Who may answer (API key names or groups); without any, any key that may answer approvals.
    pub fn approvers<I, S>(mut self, approvers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.approvers = approvers.into_iter().map(Into::into).collect();
        self
    }

    /// How long the question waits unanswered before it expires (the body then gets an error,
    /// or the [`default`](Self::default)); without it, it waits until the call ends.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The answers a person picks from: the answer is one of them (and meets the schema too).
    pub fn choices<I, S>(mut self, choices: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choices = choices.into_iter().map(Into::into).collect();
        self
    }

    /// The answer recorded if the question expires unanswered; it must meet the schema. Without
    /// it, an expiry is an error.
    pub fn default(mut self, answer: Value) -> Self {
        self.default = Some(answer);
        self
    }
}

impl std::future::IntoFuture for ToolQuestion {
    type Output = Result<Value, ToolError>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let ctx = self.ctx.clone();
            ctx.run_question(self).await?.map_err(ToolError::fatal)
        })
    }
}

/// The occurrence counter questions share with subagents' (agent names never start with `?`).
const QUESTIONS: &str = "?question";

impl ToolContext {
    pub(crate) fn new(
        call: CallInfo,
        tool: &str,
        cancel: CancellationToken,
        progress: ProgressSink,
        cache: CacheBackend,
        deps: Deps,
    ) -> Self {
        Self {
            call: Arc::new(call),
            tool: tool.into(),
            cancel,
            progress,
            cache,
            deps,
            kernel: None,
            subagents: Arc::default(),
        }
    }

    /// Lets the body start subagents through `kernel`, under the call's dispatch.
    pub(crate) fn with_kernel(mut self, kernel: KernelLink) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// Starts a subagent: a child run of the hosted agent `agent`, linked to this call's run,
    /// and returns its output; a child that fails or is cancelled is a fatal error. The worker's
    /// key needs `runs:write`. The same call run again (a retry, a redispatch) gets back the child
    /// it started, never a second one.
    ///
    /// While the body waits on its subagents alone, a `safe_to_retry` call gives back its
    /// worker slot after 100 ms (so children can run on the same worker): the body is dropped,
    /// and once a child ends the call runs again from the start (next attempt, same idempotency
    /// key), getting the children's outcomes at once. So start subagents before the body's
    /// effects, or make those idempotent. An `at_most_once` call keeps its slot. When the kernel
    /// refuses to take the slot back (a child ended on the way), the body is not dropped: it goes
    /// on waiting and gets the child's outcome as it would have.
    pub fn subagent(&self, agent: impl Into<String>, input: Value) -> ToolSubagent {
        ToolSubagent {
            ctx: self.clone(),
            agent: agent.into(),
            input,
            session: None,
        }
    }

    async fn run_subagent(&self, agent: String, input: Value, session: Option<String>) -> Result<Value, ToolError> {
        let Some(kernel) = &self.kernel else {
            return Err(ToolError::fatal(format!(
                "subagent '{agent}': this context has no kernel (a test context); a dispatched call has one"
            )));
        };
        let occurrence = self.next_occurrence(&agent);
        let child = ChildRun {
            seq: 0,
            agent: &agent,
            occurrence,
            input: &input,
            session,
        };
        let failed = |error: AgentError| ToolError::fatal(format!("subagent '{agent}': {error}"));
        let response = kernel.start(child).await.map_err(failed)?;
        let step = response
            .step
            .ok_or_else(|| ToolError::fatal(format!("subagent '{agent}': the kernel returned no step")))?;
        let step = self.settled(kernel, step, true).await.map_err(failed)?;
        child_outcome(agent.clone(), step).map_err(|error| ToolError::fatal(error.to_string()))
    }

    /// Asks a person `question` mid-call and returns their answer (JSON). The run is blocked
    /// with `run:interrupted` (reason `human_input`) until someone answers with
    /// `kernelctl approvals answer ID --with JSON`, the console, `AgentClient::answer` or an MCP
    /// client's input; a decline or an expiry is a fatal error naming who declined. The worker's
    /// key needs `runs:write`.
    ///
    /// The answer is recorded: the same call run again (a retry, a redispatch after its worker was
    /// lost) gets it back at once, and the person is asked once. Questions are told apart by
    /// their order in the body, so a body asks the same questions in the same order each time; a
    /// different question in the place of a recorded one is refused (`replay_input_changed`).
    /// While the body waits on a person alone, a `safe_to_retry` call gives back its worker slot
    /// after 100 ms and runs again from the start once the answer is in, as with
    /// [`ToolContext::subagent`]; an `at_most_once` call keeps its slot, and its timeout counts
    /// the wait.
    pub fn ask(&self, question: impl Into<String>) -> ToolQuestion {
        ToolQuestion {
            ctx: self.clone(),
            question: question.into(),
            schema: None,
            approvers: Vec::new(),
            timeout: None,
            choices: Vec::new(),
            default: None,
            hold: false,
        }
    }

    /// Asks `asked`: the answer, or (`Ok(Err)`) why there is none (declined, expired, withdrawn),
    /// as the log says it; `Err` when the kernel could not be asked.
    pub(crate) async fn run_question(&self, asked: ToolQuestion) -> Result<Result<Value, String>, ToolError> {
        let Some(kernel) = &self.kernel else {
            return Err(ToolError::fatal(
                "ctx.ask: this context has no kernel (a test context); a dispatched call has one",
            ));
        };
        let occurrence = self.next_occurrence(QUESTIONS);
        let request = pb::AskPersonRequest {
            dispatch: None,
            occurrence,
            question: asked.question.clone(),
            answer_schema_json: asked
                .schema
                .as_ref()
                .map(kernel_proto::canonical::to_canonical)
                .unwrap_or_default(),
            approvers: asked.approvers.clone(),
            timeout_ms: asked.timeout.map_or(0, |t| t.as_millis().max(1) as u64),
            seq: 0,
            choices: asked.choices.clone(),
            default_answer_json: asked
                .default
                .as_ref()
                .map(kernel_proto::canonical::to_canonical)
                .unwrap_or_default(),
        };
        let failed = |error: AgentError| ToolError::fatal(format!("ctx.ask: {error}"));
        let step = kernel
            .ask(request)
            .await
            .map_err(failed)?
            .step
            .ok_or_else(|| ToolError::fatal("ctx.ask: the kernel returned no step"))?;
        let step = self.settled(kernel, step, !asked.hold).await.map_err(failed)?;
        if step.status == pb::StepStatus::Succeeded as i32 {
            serde_json::from_str(crate::hosted::subagent::output_text(&step))
                .map(Ok)
                .map_err(|error| ToolError::fatal(format!("ctx.ask: the answer is not JSON: {error}")))
        } else {
            Ok(Err(step.error))
        }
    }

    /// How many subagents of `agent` (or questions, for [`QUESTIONS`]) the body started before
    /// this one: its identity within the call.
    fn next_occurrence(&self, agent: &str) -> u32 {
        let mut occurrences = self.subagents.occurrences.lock().expect("occurrences poisoned");
        let count = occurrences.entry(agent.to_owned()).or_default();
        *count += 1;
        *count - 1
    }

    /// `step` once it has settled, awaited from the kernel; while it waits, the call may give back
    /// its slot when `suspendable`.
    async fn settled(&self, kernel: &KernelLink, step: pb::Step, suspendable: bool) -> Result<pb::Step, AgentError> {
        if is_settled(&step) {
            return Ok(step);
        }
        let _waiting = suspendable.then(|| self.waiting(step.step_key.clone()));
        kernel.await_step(&step.step_key).await
    }

    fn waiting(&self, key: String) -> Waiting {
        *self
            .subagents
            .waiting
            .lock()
            .expect("waits poisoned")
            .entry(key.clone())
            .or_default() += 1;
        self.subagents.changed.notify_waiters();
        Waiting(Arc::clone(&self.subagents), key)
    }

    /// Resolves with the subagent steps waited on once the body has waited on subagents for
    /// [`SUSPEND_AFTER`] without a change: the call may then give back its slot. Never with
    /// `refused`, the steps of a suspension the kernel refused: the body waits on, holding its
    /// slot, until what it awaits changes.
    pub(crate) async fn suspendable(&self, refused: &[String]) -> Vec<String> {
        loop {
            let changed = self.subagents.changed.notified();
            let waiting: Vec<String> = self
                .subagents
                .waiting
                .lock()
                .expect("waits poisoned")
                .keys()
                .cloned()
                .collect();
            if waiting.is_empty() || waiting == refused {
                changed.await;
                continue;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(SUSPEND_AFTER) => return waiting,
            }
        }
    }

    /// A context for calling a tool function in a unit test: run `test-run`, step `t0/p0`,
    /// attempt 1, a fresh cancellation token, no deps, progress discarded, and an empty
    /// in-memory [`cache`](ToolContext::cache) shared by the context's clones. Its tool name is
    /// empty until it goes through [`Tool::call`](crate::Tool::call).
    pub fn for_test() -> Self {
        Self::new(
            CallInfo::for_test(),
            "",
            CancellationToken::new(),
            ProgressSink::Discard,
            CacheBackend::memory(),
            Deps::default(),
        )
    }

    /// Registers a dep for [`ToolContext::deps`], as [`WorkerBuilder::deps`](crate::WorkerBuilder::deps) does.
    pub fn with_dep<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.deps.insert(value);
        self
    }

    /// Uses `token` as the call's cancellation token, so a test can cancel the call.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Sends the call's progress updates to the returned receiver, so a test can read them.
    pub fn with_progress_channel(mut self) -> (Self, mpsc::UnboundedReceiver<Progress>) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.progress = ProgressSink::Test(tx);
        (self, rx)
    }

    pub(crate) fn with_tool_name(mut self, tool: &str) -> Self {
        if &*self.tool != tool {
            self.tool = tool.into();
        }
        self
    }

    /// The run the call belongs to.
    pub fn run_id(&self) -> &str {
        &self.call.run_id
    }

    /// The agent's own id for the call, when it gave one.
    pub fn call_id(&self) -> Option<&str> {
        self.call.call_id.as_deref()
    }

    /// The call's identity within its run: `t<turn>/p<position>` or `id:<call id>`.
    pub fn step_key(&self) -> &str {
        &self.call.step_key
    }

    /// The model turn that made the call.
    pub fn turn(&self) -> u32 {
        self.call.turn
    }

    /// The call's position within its turn.
    pub fn position(&self) -> u32 {
        self.call.position
    }

    /// A key that stays the same across retries, redispatches and agent restarts of this call:
    /// pass it to payment APIs and the like to make side effects happen once.
    pub fn idempotency_key(&self) -> &str {
        &self.call.idempotency_key
    }

    /// Which attempt this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.call.attempt
    }

    /// The W3C trace context the tool's own spans should join: its attempt's span when the
    /// kernel exports traces, else the agent's `traceparent`; `None` when there is neither.
    pub fn trace_context(&self) -> Option<&crate::TraceContext> {
        self.call.trace.as_ref()
    }

    /// The kernel's id for this attempt's lease.
    pub fn dispatch_id(&self) -> &str {
        &self.call.dispatch_id
    }

    /// The name of the tool being called.
    pub fn tool_name(&self) -> &str {
        &self.tool
    }

    /// How long the kernel lets this attempt run before it cancels it, when it said.
    pub fn timeout(&self) -> Option<Duration> {
        self.call.timeout
    }

    /// Cancelled when the kernel cancels the call (timeout, run cancelled) or the session ends.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether the call has been cancelled; poll it in long loops.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the call is cancelled; select on it beside slow work.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// Reports a status line to whoever watches the run. Never blocks; an update may be
    /// dropped when the connection is busy.
    pub fn progress(&self, message: impl Into<String>) {
        self.progress.send(Progress::new(message));
    }

    /// Reports a full progress update (fraction and data). Never blocks; an update may be
    /// dropped when the connection is busy.
    pub fn progress_with(&self, progress: Progress) {
        self.progress.send(progress);
    }

    /// Reports an ephemeral status line; the same as [`ToolContext::progress`].
    pub fn emit_status(&self, message: impl Into<String>) {
        self.progress(message);
    }

    /// A value registered with [`WorkerBuilder::deps`](crate::WorkerBuilder::deps), by type.
    pub fn deps<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.deps.get::<T>()
    }

    /// This tool's own key/value cache, kept by the kernel's store and shared by every call of
    /// the tool (on any worker); another tool's entries are out of reach. A test context keeps
    /// it in memory. The handle is cheap; take it per call.
    pub fn cache(&self) -> ToolCache {
        ToolCache::new(self.cache.clone(), Arc::clone(&self.tool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_context_collects_progress() {
        let (ctx, mut rx) = ToolContext::for_test().with_progress_channel();
        ctx.progress("one");
        ctx.progress_with(Progress::new("two").step(2, 3).data(serde_json::json!({"k": 1})));
        assert_eq!(rx.try_recv().unwrap(), Progress::new("one"));
        let two = rx.try_recv().unwrap();
        assert_eq!((two.current, two.total), (Some(2), Some(3)));
    }

    #[test]
    fn session_progress_is_dropped_when_the_queue_is_half_full() {
        let (tx, mut rx) = mpsc::channel(4);
        let dispatch = DispatchRef {
            id: "d1".into(),
            attempt: 1,
        };
        let sink = ProgressSink::Session {
            tx: tx.clone(),
            dispatch,
        };
        let ctx = ToolContext::new(
            CallInfo::for_test(),
            "t",
            CancellationToken::new(),
            sink,
            CacheBackend::memory(),
            Deps::default(),
        );
        for _ in 0..10 {
            ctx.progress("tick");
        }
        let mut received = 0;
        while rx.try_recv().is_ok() {
            received += 1;
        }
        assert_eq!(received, 2, "two slots of four stay free for heartbeats and results");
    }

    #[tokio::test]
    async fn a_subagent_from_a_test_context_is_a_fatal_error() {
        let error = ToolContext::for_test()
            .subagent("researcher", serde_json::json!({"topic": "tides"}))
            .await
            .expect_err("a test context has no kernel");
        assert_eq!(error.kind(), crate::ErrorKind::Fatal);
        assert!(error.message().contains("this context has no kernel"), "{error}");
    }

    #[test]
    fn cancellation_is_visible() {
        let token = CancellationToken::new();
        let ctx = ToolContext::for_test().with_cancellation(token.clone());
        assert!(!ctx.is_cancelled());
        token.cancel();
        assert!(ctx.is_cancelled());
    }
}
