//! One worker session: a single bidirectional stream to the kernel, from Hello to close.
//!
//! The session task owns all of its state (the calls in flight and their cancellation tokens,
//! the cache requests awaiting an answer) and selects over the inbound stream, finished calls,
//! newly registered cache requests and shutdown; nothing is shared behind a lock. Each dispatch
//! runs on its own task, which sends its result on the outbound channel; a separate task sends
//! heartbeats so a busy tool never starves the lease. A tool's cache request registers its reply
//! with the session task, then goes out on the outbound channel; the task routes the kernel's
//! answer back by request id, and a lost session fails whatever is still waiting. A suspension
//! is registered the same way: its task waits for the kernel's answer, and goes on with the
//! handler (or tool body) it kept when the kernel refuses the suspension but leaves it the
//! dispatch.
//!
//! A session ends in one of three ways: drained after shutdown (`Ok`), refused by the kernel
//! before its Welcome (permanent), or lost (transient: the worker reconnects). Results of calls
//! from a lost session are dropped; the kernel has already redispatched or settled those calls.

use std::collections::HashMap;
use std::future::ready;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kernel_proto::v1::hosted_service_client::HostedServiceClient;
use kernel_proto::v1::worker_service_client::WorkerServiceClient;
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tracing::{Instrument, debug, info, info_span, warn};

use super::wire;
use crate::auth::ApiKey;
use crate::error::ToolError;
use crate::hosted::subagent::KernelLink;
use crate::hosted::{Agent, AgentContext, AgentDefinition, HostedDispatch};
use crate::tool::{Tool, ToolDefinition};
use crate::transport;
use crate::worker::WorkerConfig;
use crate::worker::cache::{CacheBackend, CacheOp, CacheReply, PendingCache};
use crate::worker::context::{CallInfo, Progress, ProgressSink, ToolContext};

/// Messages queued on the outbound stream; half the queue is kept for heartbeats and results.
const OUTBOUND_CAPACITY: usize = 256;
/// How long the kernel has to answer Hello with Welcome.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cancelled call may take to stop on its own before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for the kernel to close its side after a drained session ends ours.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Heartbeat period when the kernel does not say.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// The pair that fences every message about one attempt of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DispatchRef {
    pub(crate) id: String,
    pub(crate) attempt: u32,
}

/// What the worker sends on its stream.
#[derive(Debug)]
pub(crate) enum Outbound {
    Hello {
        worker_name: String,
        tools: Vec<ToolDefinition>,
        agents: Vec<AgentDefinition>,
        max_concurrency: u32,
        ephemeral_tools: bool,
    },
    Heartbeat,
    Progress {
        dispatch: DispatchRef,
        progress: Progress,
    },
    Result {
        dispatch: DispatchRef,
        outcome: Result<Value, ToolError>,
    },
    /// A hosted handler gave back its slot, waiting on these steps.
    Suspended {
        dispatch: DispatchRef,
        waiting_on: Vec<String>,
    },
    /// A tool's cache request, answered by [`Inbound::Cache`] with the same id.
    Cache {
        dispatch: DispatchRef,
        request_id: u64,
        op: CacheOp,
    },
    Drain,
    /// The answer to [`Inbound::ApprovalQuestion`].
    ApprovalAnswer {
        question_id: String,
        required: bool,
        error: String,
    },
    /// Ends the stream once everything queued before it has been sent.
    Close,
}

/// The kernel's answer to Hello.
#[derive(Debug)]
pub(crate) struct Welcome {
    pub(crate) session_id: String,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) lease_ttl: Duration,
}

/// One attempt of one call to run.
#[derive(Debug)]
pub(crate) struct DispatchRequest {
    pub(crate) call: CallInfo,
    pub(crate) tool: String,
    /// The arguments, or why their JSON text did not parse.
    pub(crate) arguments: Result<Value, String>,
}

/// One attempt of a hosted run's handler to run.
#[derive(Debug)]
pub(crate) struct RunRequest {
    pub(crate) dispatch: HostedDispatch,
    pub(crate) agent: String,
    /// The run's input, or why its JSON text did not parse.
    pub(crate) input: Result<Value, String>,
}

/// What the kernel sends on the stream.
#[derive(Debug)]
pub(crate) enum Inbound {
    Welcome(Welcome),
    Dispatch(DispatchRequest),
    /// Dispatches the kernel sent in one message (it does only to a worker that asked).
    Dispatches(Vec<DispatchRequest>),
    Run(RunRequest),
    Cancel {
        dispatch: DispatchRef,
        reason: String,
    },
    ResultAck {
        dispatch: DispatchRef,
        accepted: bool,
        reason: String,
        /// On a refused suspension: the dispatch is still ours, and its task goes on.
        still_held: bool,
    },
    Cache {
        request_id: u64,
        reply: CacheReply,
    },
    /// Whether a call of `tool` needs a person's approval, by a predicate in the worker.
    ApprovalQuestion {
        question_id: String,
        tool: String,
    },
}

/// How a session that did not fail ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// Shutdown came before the session opened.
    Stopped,
    /// Shutdown drained the open session.
    Drained,
}

/// How a session failed.
#[derive(Debug)]
pub(crate) enum SessionError {
    /// The kernel refused the registration; trying again will not help.
    Refused(tonic::Status),
    /// The connection or the stream broke; `opened` tells whether a Welcome came first.
    Lost { error: String, opened: bool },
}

impl SessionError {
    fn lost(error: impl ToString, opened: bool) -> Self {
        SessionError::Lost {
            error: error.to_string(),
            opened,
        }
    }
}

/// Whether a status answering Hello is a verdict on the registration rather than a fault of
/// the connection.
fn is_refusal(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::InvalidArgument
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}

/// Names for a log line: `a,b,c`, or `-` for none.
fn names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let joined = names.map(String::as_str).collect::<Vec<_>>().join(",");
    if joined.is_empty() { "-".to_owned() } else { joined }
}

fn before_welcome(addr: &str, status: tonic::Status) -> SessionError {
    if is_refusal(&status) {
        SessionError::Refused(status)
    } else {
        SessionError::lost(transport::with_hint(addr, transport::describe_status(&status)), false)
    }
}

/// Runs one session to its end.
pub(crate) async fn run(
    config: &Arc<WorkerConfig>,
    slots: &Arc<Semaphore>,
    shutdown: &CancellationToken,
) -> Result<SessionEnd, SessionError> {
    let channel = tokio::select! {
        channel = transport::connect_secure(&config.endpoint, config.tls.as_ref()) => channel.map_err(|e| SessionError::lost(e, false))?,
        _ = shutdown.cancelled() => return Ok(SessionEnd::Stopped),
    };
    // Hosted handlers call the kernel on the session's connection.
    let hosted = HostedServiceClient::new(channel.clone());
    let mut client = WorkerServiceClient::new(channel);

    // Cancelled on every exit from this function: stops the heartbeat task, ends the outbound
    // stream and tells calls still running that their session is gone.
    let session_token = CancellationToken::new();
    let _stop_session = session_token.clone().drop_guard();

    let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
    let hello = Outbound::Hello {
        worker_name: config.name.clone(),
        tools: config.tools.values().map(|tool| tool.definition().clone()).collect(),
        agents: config.agents.values().map(|agent| agent.definition().clone()).collect(),
        max_concurrency: config.max_concurrency,
        ephemeral_tools: config.ephemeral_tools,
    };
    tx.send(hello)
        .await
        .expect("the receiver is alive until the stream is handed over");
    let outbound = ReceiverStream::new(rx)
        .take_while(|message| ready(!matches!(message, Outbound::Close)))
        .take_until(session_token.clone().cancelled_owned())
        .map(wire::outbound);

    let opening = async {
        let mut inbound = client
            .open_session(crate::auth::request(outbound, config.api_key.as_ref()))
            .await
            .map_err(|status| before_welcome(&config.endpoint, status))?
            .into_inner();
        let first = inbound
            .message()
            .await
            .map_err(|status| before_welcome(&config.endpoint, status))?;
        match first.and_then(wire::inbound) {
            Some(Inbound::Welcome(welcome)) => Ok((inbound, welcome)),
            Some(other) => Err(SessionError::lost(format!("expected welcome, got {other:?}"), false)),
            None => Err(SessionError::lost(
                "kernel closed the session before its welcome",
                false,
            )),
        }
    };
    let (inbound, welcome) = tokio::select! {
        opened = tokio::time::timeout(HANDSHAKE_TIMEOUT, opening) => match opened {
            Ok(opened) => opened?,
            Err(_) => return Err(SessionError::lost("no welcome from the kernel in time", false)),
        },
        _ = shutdown.cancelled() => return Ok(SessionEnd::Stopped),
    };
    info!(
        session_id = %welcome.session_id,
        worker = %config.name,
        kernel = %config.endpoint,
        tools = %names(config.tools.keys()),
        agents = %names(config.agents.keys()),
        heartbeat_ms = welcome.heartbeat_interval.as_millis() as u64,
        lease_ttl_ms = welcome.lease_ttl.as_millis() as u64,
        "worker session open"
    );

    let heartbeat = if welcome.heartbeat_interval.is_zero() {
        DEFAULT_HEARTBEAT
    } else {
        welcome.heartbeat_interval
    };
    tokio::spawn(send_heartbeats(tx.clone(), heartbeat, session_token.clone()));

    let (cache_tx, cache_rx) = mpsc::unbounded_channel();
    let (suspend_tx, suspend_rx) = mpsc::unbounded_channel();
    let session = Session {
        config: Arc::clone(config),
        slots: Arc::clone(slots),
        tx,
        token: session_token,
        running: HashMap::new(),
        tasks: JoinSet::new(),
        cache_tx,
        cache_rx,
        cache_pending: HashMap::new(),
        suspend_tx,
        suspend_rx,
        suspensions: HashMap::new(),
        hosted,
    };
    session
        .serve(inbound, shutdown)
        .instrument(info_span!("session", session_id = %welcome.session_id))
        .await
}

async fn send_heartbeats(tx: mpsc::Sender<Outbound>, every: Duration, token: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = ticks.tick() => {}
        }
        tokio::select! {
            _ = token.cancelled() => return,
            sent = tx.send(Outbound::Heartbeat) => if sent.is_err() { return },
        }
    }
}

/// A suspension sent, waiting for the kernel's answer: `true` when the kernel refused it and the
/// dispatch is still ours.
struct PendingSuspension {
    dispatch: DispatchRef,
    reply: oneshot::Sender<bool>,
}

/// How a dispatch's task gives back its slot: it sends a suspension and waits for the answer.
#[derive(Clone)]
struct Suspender {
    dispatch: DispatchRef,
    tx: mpsc::Sender<Outbound>,
    register: mpsc::UnboundedSender<PendingSuspension>,
}

/// The kernel's word on a suspension.
#[derive(Debug, PartialEq, Eq)]
enum Suspension {
    /// Taken (or the dispatch is no longer ours, or the session is gone): the task ends here,
    /// dropping the handler or body where it waits.
    GivenBack,
    /// Refused, the dispatch still ours: the task goes on as if it had never been sent.
    Kept,
}

impl Suspender {
    /// Offers the dispatch's slot back while it waits on `waiting_on`. Cancellation while the
    /// answer is awaited counts as kept, so the caller handles it as it handles any cancellation.
    async fn offer(&self, waiting_on: Vec<String>, token: &CancellationToken) -> Suspension {
        let (reply, answer) = oneshot::channel();
        let pending = PendingSuspension {
            dispatch: self.dispatch.clone(),
            reply,
        };
        if self.register.send(pending).is_err() {
            return Suspension::GivenBack;
        }
        info!(waiting_on = ?waiting_on, "dispatch waits durably, giving back its slot");
        let message = Outbound::Suspended {
            dispatch: self.dispatch.clone(),
            waiting_on,
        };
        if self.tx.send(message).await.is_err() {
            return Suspension::GivenBack;
        }
        tokio::select! {
            answer = answer => match answer {
                Ok(true) => Suspension::Kept,
                _ => Suspension::GivenBack,
            },
            _ = token.cancelled() => Suspension::Kept,
        }
    }
}

/// A call in flight, by dispatch id.
struct Running {
    attempt: u32,
    token: CancellationToken,
}

struct Session {
    config: Arc<WorkerConfig>,
    slots: Arc<Semaphore>,
    tx: mpsc::Sender<Outbound>,
    token: CancellationToken,
    running: HashMap<String, Running>,
    tasks: JoinSet<DispatchRef>,
    /// Where calls register their cache requests; dropped with the session, which fails them.
    cache_tx: mpsc::UnboundedSender<PendingCache>,
    cache_rx: mpsc::UnboundedReceiver<PendingCache>,
    /// Replies awaited, by request id.
    cache_pending: HashMap<u64, oneshot::Sender<CacheReply>>,
    /// Where dispatches register the suspensions they send; dropped with the session.
    suspend_tx: mpsc::UnboundedSender<PendingSuspension>,
    suspend_rx: mpsc::UnboundedReceiver<PendingSuspension>,
    /// Suspensions awaiting the kernel's answer, by dispatch id.
    suspensions: HashMap<String, PendingSuspension>,
    /// What hosted handlers record their operations through.
    hosted: HostedServiceClient<Channel>,
}

/// Whatever way the session ends, its calls still running are told (cancellation) and left to
/// finish on their own rather than aborted mid-effect: each stops within the cancel grace, its
/// slot is held until then, and its result goes nowhere.
impl Drop for Session {
    fn drop(&mut self) {
        self.token.cancel();
        self.tasks.detach_all();
    }
}

impl Session {
    async fn serve(
        mut self,
        mut inbound: tonic::Streaming<kernel_proto::v1::OpenSessionResponse>,
        shutdown: &CancellationToken,
    ) -> Result<SessionEnd, SessionError> {
        let mut drain_deadline: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled(), if drain_deadline.is_none() => {
                    info!(in_flight = self.tasks.len(), "worker draining");
                    drain_deadline = Some(tokio::time::Instant::now() + self.config.drain_timeout);
                    if self.tx.send(Outbound::Drain).await.is_err() || self.tasks.is_empty() {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(drain_deadline.unwrap_or_else(tokio::time::Instant::now)),
                    if drain_deadline.is_some() =>
                {
                    warn!(in_flight = self.tasks.len(), "drain timeout, abandoning calls in flight");
                    break;
                }
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Ok(dispatch) = done {
                        self.finished(&dispatch);
                    }
                    if drain_deadline.is_some() && self.tasks.is_empty() {
                        break;
                    }
                }
                // Ahead of the inbound stream: a request is registered before it is sent, so
                // its registration is always seen before its answer.
                Some(pending) = self.cache_rx.recv() => {
                    self.cache_pending.insert(pending.request_id, pending.reply);
                }
                Some(pending) = self.suspend_rx.recv() => {
                    self.suspensions.insert(pending.dispatch.id.clone(), pending);
                }
                message = inbound.message() => match message {
                    Ok(Some(message)) => match wire::inbound(message) {
                        Some(message) => self.handle(message),
                        None => debug!("empty message from the kernel ignored"),
                    },
                    Ok(None) if drain_deadline.is_some() => return Ok(SessionEnd::Drained),
                    Ok(None) => return Err(SessionError::lost("kernel closed the session", true)),
                    Err(status) => {
                        return Err(SessionError::lost(transport::describe_status(&status), true));
                    }
                },
            }
        }
        self.close(inbound).await;
        Ok(SessionEnd::Drained)
    }

    /// Ends our side after everything queued is sent, and gives the kernel a moment to end its.
    async fn close(self, mut inbound: tonic::Streaming<kernel_proto::v1::OpenSessionResponse>) {
        let closing = async {
            if self.tx.send(Outbound::Close).await.is_err() {
                return;
            }
            while let Ok(Some(_)) = inbound.message().await {}
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, closing).await.is_err() {
            debug!("kernel did not close the session in time");
        }
        info!("worker session closed");
    }

    fn handle(&mut self, message: Inbound) {
        match message {
            // A dispatch that crossed our Drain on the wire is already leased to us: run it,
            // and the drain waits for it like any other call in flight.
            Inbound::Dispatch(request) => self.start(request),
            Inbound::Dispatches(requests) => {
                for request in requests {
                    self.start(request);
                }
            }
            Inbound::Run(request) => self.start_run(request),
            Inbound::Cancel { dispatch, reason } => match self.running.get(&dispatch.id) {
                Some(running) if running.attempt == dispatch.attempt => {
                    info!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, reason, "dispatch cancelled");
                    running.token.cancel();
                }
                _ => {
                    debug!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, "cancel for a call not running here ignored")
                }
            },
            Inbound::ResultAck {
                dispatch,
                accepted,
                reason,
                still_held,
            } => {
                let suspension = match self.suspensions.get(&dispatch.id) {
                    Some(pending) if pending.dispatch.attempt == dispatch.attempt => {
                        self.suspensions.remove(&dispatch.id)
                    }
                    _ => None,
                };
                if let Some(pending) = suspension {
                    if accepted {
                        debug!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, "suspension recorded");
                    } else if still_held {
                        info!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, reason, "suspension refused, the dispatch goes on here");
                    } else {
                        warn!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, reason, "suspension not recorded, the dispatch is no longer ours");
                    }
                    let _ = pending.reply.send(!accepted && still_held);
                } else if accepted {
                    debug!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, "result recorded");
                } else {
                    warn!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, reason, "result not recorded");
                }
            }
            Inbound::Cache { request_id, reply } => match self.cache_pending.remove(&request_id) {
                // The call may have stopped waiting; its answer then goes nowhere.
                Some(waiting) => drop(waiting.send(reply)),
                None => debug!(request_id, "cache answer for no pending request ignored"),
            },
            Inbound::Welcome(_) => warn!("second welcome on an open session ignored"),
            Inbound::ApprovalQuestion { question_id, tool } => {
                // A Rust tool's predicate is CEL, which the kernel evaluates itself; a kernel asks
                // only about a tool announced with a predicate in the worker, which this SDK never
                // announces. Answering "ask a person" fails closed.
                let answer = Outbound::ApprovalAnswer {
                    question_id,
                    required: true,
                    error: format!("this worker has no approval predicate for tool '{tool}'"),
                };
                let tx = self.tx.clone();
                tokio::spawn(async move { drop(tx.send(answer).await) });
            }
        }
    }

    fn start(&mut self, request: DispatchRequest) {
        let call = &request.call;
        if let Some(running) = self.running.get(&call.dispatch_id) {
            if running.attempt == call.attempt {
                debug!(dispatch_id = %call.dispatch_id, attempt = call.attempt, "duplicate dispatch ignored");
                return;
            }
            // A newer attempt supersedes the one still running here.
            running.token.cancel();
        }
        let token = self.token.child_token();
        self.running.insert(
            call.dispatch_id.clone(),
            Running {
                attempt: call.attempt,
                token: token.clone(),
            },
        );
        let span = info_span!(
            "dispatch",
            run_id = %call.run_id,
            step_key = %call.step_key,
            tool = %request.tool,
            attempt = call.attempt,
        );
        let kernel = KernelLink {
            client: self.hosted.clone(),
            api_key: self.config.api_key.clone(),
            dispatch: kernel_proto::v1::HostedDispatch {
                run_id: request.call.run_id.clone(),
                dispatch_id: request.call.dispatch_id.clone(),
                attempt: request.call.attempt,
            },
        };
        let suspender = self.suspender(DispatchRef {
            id: call.dispatch_id.clone(),
            attempt: call.attempt,
        });
        let job = Job {
            tool: self.config.tools.get(&request.tool).cloned(),
            request,
            token,
            suspender,
            tx: self.tx.clone(),
            cache: self.cache_tx.clone(),
            slots: Arc::clone(&self.slots),
            deps: self.config.deps.clone(),
            kernel,
        };
        self.tasks.spawn(job.run().instrument(span));
    }

    /// Starts a hosted run's handler on its own task, like a call: it holds a slot while it runs,
    /// and its outcome goes back as the dispatch's result.
    fn start_run(&mut self, request: RunRequest) {
        let dispatch = DispatchRef {
            id: request.dispatch.dispatch_id.clone(),
            attempt: request.dispatch.attempt,
        };
        if self
            .running
            .get(&dispatch.id)
            .is_some_and(|running| running.attempt == dispatch.attempt)
        {
            debug!(dispatch_id = %dispatch.id, attempt = dispatch.attempt, "duplicate run dispatch ignored");
            return;
        }
        let token = self.token.child_token();
        self.running.insert(
            dispatch.id.clone(),
            Running {
                attempt: dispatch.attempt,
                token: token.clone(),
            },
        );
        let span = info_span!(
            "run",
            run_id = %request.dispatch.run_id,
            agent = %request.agent,
            attempt = dispatch.attempt,
        );
        let job = HostedJob {
            agent: self.config.agents.get(&request.agent).cloned(),
            request,
            suspender: self.suspender(dispatch.clone()),
            dispatch,
            token,
            tx: self.tx.clone(),
            slots: Arc::clone(&self.slots),
            client: self.hosted.clone(),
            api_key: self.config.api_key.clone(),
        };
        self.tasks.spawn(job.run().instrument(span));
    }

    fn suspender(&self, dispatch: DispatchRef) -> Suspender {
        Suspender {
            dispatch,
            tx: self.tx.clone(),
            register: self.suspend_tx.clone(),
        }
    }

    fn finished(&mut self, dispatch: &DispatchRef) {
        if self
            .running
            .get(&dispatch.id)
            .is_some_and(|running| running.attempt == dispatch.attempt)
        {
            self.running.remove(&dispatch.id);
        }
    }
}

/// Everything one dispatch's task needs.
struct Job {
    tool: Option<Tool>,
    request: DispatchRequest,
    token: CancellationToken,
    suspender: Suspender,
    tx: mpsc::Sender<Outbound>,
    cache: mpsc::UnboundedSender<PendingCache>,
    slots: Arc<Semaphore>,
    deps: crate::deps::Deps,
    kernel: KernelLink,
}

impl Job {
    async fn run(self) -> DispatchRef {
        let dispatch = DispatchRef {
            id: self.request.call.dispatch_id.clone(),
            attempt: self.request.call.attempt,
        };
        let tx = self.tx.clone();
        let started = Instant::now();
        let outcome = self.execute(dispatch.clone()).await;
        report(&tx, dispatch, outcome, started).await
    }

    async fn execute(self, dispatch: DispatchRef) -> Result<Handled, ToolError> {
        let Job {
            tool,
            request,
            token,
            suspender,
            tx,
            cache,
            slots,
            deps,
            kernel,
        } = self;
        let Some(tool) = tool else {
            return Err(ToolError::fatal(format!(
                "worker does not offer tool '{}'",
                request.tool
            )));
        };
        let args = request
            .arguments
            .map_err(|error| ToolError::fatal(format!("invalid arguments for tool '{}': {error}", request.tool)))?;
        // The kernel never sends more than max_concurrency calls, but calls from a lost session
        // may still hold slots: wait for one rather than overrun the limit.
        let _slot = tokio::select! {
            slot = slots.acquire_owned() => slot.expect("the slot semaphore is never closed"),
            _ = token.cancelled() => return Err(cancelled()),
        };
        debug!("dispatch started");
        let cache = CacheBackend::Session {
            tx: tx.clone(),
            pending: cache,
            dispatch: dispatch.clone(),
        };
        let progress = ProgressSink::Session { tx, dispatch };
        let ctx =
            ToolContext::new(request.call, &request.tool, token.clone(), progress, cache, deps).with_kernel(kernel);
        // A call that may run again gives back its slot while its body waits on subagents alone.
        let may_suspend = tool.definition().options.idempotency != crate::tool::Idempotency::AtMostOnce;
        let mut call = tool.call(ctx.clone(), args);
        // A suspension the kernel refused leaves the body running: it goes on waiting.
        let mut refused = Vec::new();
        loop {
            tokio::select! {
                result = &mut call => return result.map(Handled::Returned),
                waiting_on = ctx.suspendable(&refused), if may_suspend => {
                    match suspender.offer(waiting_on.clone(), &token).await {
                        Suspension::GivenBack => return Ok(Handled::Suspended),
                        Suspension::Kept => refused = waiting_on,
                    }
                }
                _ = token.cancelled() => return match tokio::time::timeout(CANCEL_GRACE, call).await {
                    Ok(result) => result.map(Handled::Returned),
                    Err(_) => Err(cancelled()),
                },
            }
        }
    }
}

/// Everything one dispatch of a hosted run's handler needs.
struct HostedJob {
    agent: Option<Agent>,
    request: RunRequest,
    suspender: Suspender,
    dispatch: DispatchRef,
    token: CancellationToken,
    tx: mpsc::Sender<Outbound>,
    slots: Arc<Semaphore>,
    client: HostedServiceClient<Channel>,
    api_key: Option<ApiKey>,
}

impl HostedJob {
    async fn run(self) -> DispatchRef {
        let dispatch = self.dispatch.clone();
        let tx = self.tx.clone();
        let token = self.token.clone();
        let started = Instant::now();
        // A cancelled run's handler is dropped where it waits: its recorded steps stand, and
        // nothing it would still do is recorded (the kernel no longer holds the dispatch).
        let outcome = tokio::select! {
            outcome = self.execute() => outcome,
            _ = token.cancelled() => {
                info!("run dispatch cancelled, handler dropped");
                Err(cancelled())
            }
        };
        report(&tx, dispatch, outcome, started).await
    }

    async fn execute(self) -> Result<Handled, ToolError> {
        let HostedJob {
            agent,
            request,
            suspender,
            token,
            slots,
            client,
            api_key,
            ..
        } = self;
        let Some(agent) = agent else {
            return Err(ToolError::fatal(format!(
                "worker does not host agent '{}'",
                request.agent
            )));
        };
        let input = request.input.map_err(|error| {
            ToolError::fatal(format!("the input of agent '{}' is not JSON: {error}", request.agent))
        })?;
        let _slot = tokio::select! {
            slot = slots.acquire_owned() => slot.expect("the slot semaphore is never closed"),
            _ = token.cancelled() => return Err(cancelled()),
        };
        let history = crate::hosted::load_history(&client, api_key.as_ref(), &request.dispatch)
            .await
            .map_err(|error| ToolError::retryable(format!("cannot load the run's history: {error}")))?;
        debug!(recorded = history.len(), "handler starting");
        let ctx = AgentContext::new(request.dispatch, client, api_key, history, token.clone());
        // When everything the handler awaits waits on something durable, it is dropped and
        // its slot given back; the kernel dispatches the run again when one of them settles. A
        // suspension the kernel refused (a step settled on the way) leaves the handler running:
        // it goes on waiting, and gets that step's outcome as it would have.
        let handling = agent.handle(ctx.clone(), input);
        tokio::pin!(handling);
        let mut refused = Vec::new();
        let outcome = loop {
            tokio::select! {
                outcome = &mut handling => break outcome,
                waiting_on = ctx.suspendable(&refused) => {
                    match suspender.offer(waiting_on.clone(), &token).await {
                        Suspension::GivenBack => return Ok(Handled::Suspended),
                        Suspension::Kept => refused = waiting_on,
                    }
                }
            }
        };
        // A handler that diverged fails the run with the divergence, even if it caught it.
        if let Some(diverged) = ctx.diverged() {
            return Err(ToolError::fatal(diverged));
        }
        outcome
            .map(Handled::Returned)
            .map_err(|error| ToolError::fatal(error.to_string()))
    }
}

/// Tells the kernel how a dispatch (a call, or a run's handler) ended here: its outcome (a
/// suspension was sent, and answered, before).
async fn report(
    tx: &mpsc::Sender<Outbound>,
    dispatch: DispatchRef,
    outcome: Result<Handled, ToolError>,
    started: Instant,
) -> DispatchRef {
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let message = match outcome {
        // The kernel has its suspension already.
        Ok(Handled::Suspended) => {
            info!(elapsed_ms, "dispatch waits durably, slot given back");
            return dispatch;
        }
        Ok(Handled::Returned(value)) => {
            info!(elapsed_ms, "dispatch succeeded");
            Outbound::Result {
                dispatch: dispatch.clone(),
                outcome: Ok(value),
            }
        }
        Err(error) => {
            info!(elapsed_ms, kind = %error.kind(), error = %error, "dispatch failed");
            Outbound::Result {
                dispatch: dispatch.clone(),
                outcome: Err(error),
            }
        }
    };
    if tx.send(message).await.is_err() {
        debug!("session gone, outcome dropped");
    }
    dispatch
}

/// How a dispatch ended on this worker.
enum Handled {
    Returned(Value),
    /// Its slot given back: the kernel took its suspension.
    Suspended,
}

fn cancelled() -> ToolError {
    ToolError::retryable("call cancelled before it finished")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_the_registration_verdicts() {
        assert!(is_refusal(&tonic::Status::already_exists("fingerprint conflict")));
        assert!(is_refusal(&tonic::Status::invalid_argument("bad name")));
        assert!(!is_refusal(&tonic::Status::unavailable("restarting")));
        assert!(!is_refusal(&tonic::Status::internal("oops")));
    }
}
