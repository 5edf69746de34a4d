//! `WorkerService`: one bidirectional stream per worker.
//!
//! The session loop forwards the scheduler's orders to the worker and the worker's messages to
//! the store and the scheduler. Every message about a dispatch carries `(dispatch_id, attempt)`;
//! progress and cache requests are checked against the dispatches this session was sent, and
//! results are fenced by the store inside the write. A cache request reaches only the entries of
//! the tool its dispatch runs. When the loop ends for any reason, the scheduler is told at once
//! and the session's leases are lost.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use kernel_proto::v1 as pb;
use kernel_proto::v1::open_session_request::Message as In;
use kernel_proto::v1::open_session_response::Message as Out;
use kernel_proto::v1::worker_service_server::WorkerService;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use super::{Kernel, STREAM_BUFFER, convert};
use crate::auth::{Caller, KeyRing};
use crate::error::KernelError;
use crate::hub::ProgressUpdate;
use crate::limits::{self, LogEvery, RateLimit};
use crate::machine::answer::{self, Answer, Owed};
use crate::model::{DispatchId, RunId, SessionId, StepKey, StepKind};
use crate::scheduler::{DispatchOrder, Outbound};
use crate::store::{ResultReport, SuspendReport, ToolCacheSet};

/// Each kind of misbehaviour of a session is logged at most once per this interval.
const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Dispatches sent in one message at most: a worker's slots bound what waits for it anyway.
const MAX_BATCH: usize = 64;

/// Implements `kernel.v1.WorkerService`.
pub struct WorkerApi(pub Kernel);

type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::OpenSessionResponse, Status>> + Send>>;
type SessionSender = mpsc::Sender<Result<pb::OpenSessionResponse, Status>>;

fn out(message: Out) -> Result<pb::OpenSessionResponse, Status> {
    Ok(pb::OpenSessionResponse { message: Some(message) })
}

/// The status a worker gets for a frame that could not be read: bytes that do not decode are the
/// worker's fault, not an internal error, and a frame over the message limit names the limit.
fn unreadable(status: Status, max_message_bytes: usize) -> Status {
    match status.code() {
        Code::Internal => Status::invalid_argument(format!("message: cannot decode: {}", status.message())),
        Code::OutOfRange | Code::ResourceExhausted => limits::exceeded(
            "message",
            status.message(),
            format!("{max_message_bytes} bytes"),
            "max-message-bytes",
        )
        .into(),
        _ => status,
    }
}

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    type OpenSessionStream = SessionStream;

    async fn open_session(
        &self,
        request: Request<Streaming<pb::OpenSessionRequest>>,
    ) -> Result<Response<Self::OpenSessionStream>, Status> {
        // Set when the kernel requires API keys: the key's globs bound the tools this worker offers.
        let caller = request.extensions().get::<Caller>().cloned();
        self.0.taking_work("open the session again")?;
        // The permit is held until the session ends, its hello included.
        let limits = self.0.limits;
        let permit = self.0.sessions.clone().try_acquire_owned().map_err(|_| {
            limits::exceeded(
                "session",
                format!("{} worker sessions are open", limits.max_sessions),
                format!("{} sessions", limits.max_sessions),
                "max-sessions",
            )
        })?;
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(limits.hello_timeout, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no hello within {} ms (--hello-timeout-ms)",
                    limits.hello_timeout.as_millis()
                ))
            })?
            .map_err(|status| unreadable(status, limits.max_message_bytes))?;
        let (hello, batches) = match first {
            Some(pb::OpenSessionRequest {
                message: Some(In::Hello(hello)),
            }) => {
                let batches = hello.batches;
                (convert::hello(hello)?, batches)
            }
            Some(_) => {
                return Err(Status::failed_precondition(
                    "the first message of a session must be a hello",
                ));
            }
            None => return Err(Status::cancelled("the worker closed the stream before its hello")),
        };
        if let Some(caller) = &caller {
            for name in hello
                .tools
                .iter()
                .map(|t| &t.name)
                .chain(hello.agents.iter().map(|a| &a.name))
            {
                caller.may_register(name)?;
            }
        }
        let agents = hello.agents.clone();
        let worker = hello.name.clone();
        let tools = hello.tools.clone();
        let ephemeral_tools = hello.ephemeral_tools;
        // Watch the keys from before the session joins, so a reload from here on is seen.
        let auth = match (&self.0.keys, caller) {
            (Some(keys), Some(caller)) => {
                let mut keys = keys.watch();
                let tools: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
                // A reload between the request's check and this watch is seen here.
                keys.borrow_and_update().still_admits(&caller, &tools)?;
                Some(SessionAuth { keys, caller, tools })
            }
            _ => None,
        };
        let (orders_tx, orders) = mpsc::unbounded_channel();
        let kernel = &self.0;
        let session_id = kernel.scheduler.join(hello, orders_tx).await?;
        if let Err(error) = kernel.store.register_tools(tools.clone()).await {
            kernel
                .scheduler
                .leave(session_id, "registration could not be stored".into());
            return Err(error.into());
        }
        if !agents.is_empty()
            && let Err(error) = kernel.store.register_agents(agents.clone()).await
        {
            kernel
                .scheduler
                .leave(session_id, "registration could not be stored".into());
            return Err(error.into());
        }
        kernel.registry.join(&tools, kernel.store.clock().now_millis());
        kernel.registry.know_agents(&agents);
        kernel.scheduler.ready(session_id.clone());

        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let config = kernel.scheduler.config();
        let welcome = pb::Welcome {
            session_id: session_id.to_string(),
            heartbeat_interval_ms: config.heartbeat_interval.as_millis() as u64,
            lease_ttl_ms: config.lease_ttl.as_millis() as u64,
        };
        tx.send(out(Out::Welcome(welcome)))
            .await
            .map_err(|_| Status::cancelled("the worker went away"))?;
        info!(%session_id, worker, "worker session open");
        let now = Instant::now();
        let session = Session {
            kernel: kernel.clone(),
            session_id,
            tx,
            batches,
            dispatches: HashMap::new(),
            questions: HashMap::new(),
            recording: JoinSet::new(),
            _permit: permit,
            progress_limit: RateLimit::per_second(limits.progress_per_second, now),
            heartbeat_limit: RateLimit::per_second(limits.heartbeats_per_second, now),
            logs: Logs::default(),
            auth,
            offered: Offered {
                tools: tools.iter().map(|t| t.name.clone()).collect(),
                ephemeral: ephemeral_tools,
            },
        };
        tokio::spawn(session.run(inbound, orders));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The dispatches of tool calls queued behind `first` (itself one), up to [`MAX_BATCH`] in all, in
/// the order they were made. The first other order met comes back, to be sent right after them.
fn take_batch(
    first: DispatchOrder,
    orders: &mut mpsc::UnboundedReceiver<Outbound>,
) -> (Vec<DispatchOrder>, Option<Outbound>) {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match orders.try_recv() {
            Ok(Outbound::Dispatch(more)) if more.step.kind != StepKind::Agent => batch.push(*more),
            Ok(other) => return (batch, Some(other)),
            Err(_) => break,
        }
    }
    (batch, None)
}

/// What the session knows of a dispatch it forwarded.
struct Held {
    attempt: u32,
    run_id: RunId,
    key: StepKey,
    position: u32,
    tool: String,
    /// A tool call, or a hosted run's handler (whose `tool` is its agent).
    kind: StepKind,
    progress: u32,
}

/// Records a worker's result. Among replicas the owner of the call's run may be out of reach for a
/// while (it stopped and its shards have not moved yet, or it is frozen and each try waits a TTL
/// for it): the result is sent again until it is recorded or three lease TTLs have passed, rather
/// than dropped (which would run a `safe_to_retry` call again and make an `at_most_once` one
/// indeterminate though it finished).
/// A try whose answer was lost may have stood: a later try refused as stale is then read back,
/// and counts as recorded if the call settled with this very attempt.
async fn record_result(
    kernel: &Kernel,
    report: ResultReport,
    (run, key): (RunId, StepKey),
) -> Result<Option<(crate::model::StepRecord, Vec<crate::model::StepRecord>)>, KernelError> {
    let deadline = tokio::time::Instant::now() + kernel.scheduler.config().lease_ttl * 3;
    let mut pause = Duration::from_millis(100);
    let mut unsure = false;
    loop {
        match kernel.store.record_outcome(report.clone()).await {
            Err(KernelError::Unavailable(why) | KernelError::Moved(why))
                if kernel.scheduler.config().replicated && tokio::time::Instant::now() < deadline =>
            {
                debug!(dispatch_id = %report.dispatch_id, why, "result not recorded yet; sending it again");
                unsure = true;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Ok(None) if unsure => {
                let stood = kernel
                    .store
                    .reads
                    .steps_at(run.clone(), vec![key.clone()])
                    .await?
                    .into_iter()
                    .find(|step| {
                        let same = match &report.outcome {
                            Ok(output) => step.output.as_ref() == Some(output),
                            Err((_, message)) => step.error.as_ref() == Some(message),
                        };
                        step.status.is_terminal()
                            && step.dispatch_id.as_ref() == Some(&report.dispatch_id)
                            && step.attempts == report.attempt
                            && same
                    });
                return Ok(stood.map(|step| (step, Vec::new())));
            }
            recorded => return recorded,
        }
    }
}

/// What admitted a session when the kernel requires keys, checked again on every reload.
struct SessionAuth {
    keys: watch::Receiver<Arc<KeyRing>>,
    caller: Caller,
    tools: Vec<String>,
}

/// Resolves when a reload puts in force keys that no longer admit the session (its key removed,
/// or no longer allowing a tool it offers); never when the kernel runs without keys. It checks only
/// on a reload, not each time the session loop polls it.
async fn key_revoked(auth: &mut Option<SessionAuth>) -> KernelError {
    let Some(auth) = auth else {
        return std::future::pending().await;
    };
    loop {
        if auth.keys.changed().await.is_err() {
            return std::future::pending().await;
        }
        let ring = auth.keys.borrow_and_update().clone();
        if let Err(refusal) = ring.still_admits(&auth.caller, &auth.tools) {
            return refusal;
        }
    }
}

struct Session {
    kernel: Kernel,
    session_id: SessionId,
    tx: SessionSender,
    /// The worker reads `Dispatches`: dispatches waiting together go in one message.
    batches: bool,
    dispatches: HashMap<DispatchId, Held>,
    /// Approval questions asked of the worker, by question id, and who waits for each answer. An
    /// answer never given (the session ends) drops its sender: the asker hears so.
    questions: HashMap<String, oneshot::Sender<Result<bool, String>>>,
    /// Results and suspensions being recorded. The session gives up its leases only once they
    /// are written: a worker that sends its last result and closes at once (as a draining one
    /// does) would otherwise see the call lost and run again (found by the Python drain test).
    /// A suspension's task yields the dispatch it gave up, if the store took it.
    recording: JoinSet<Option<(DispatchId, u32)>>,
    /// This session's place under `--max-sessions`, released when it ends.
    _permit: OwnedSemaphorePermit,
    progress_limit: RateLimit,
    heartbeat_limit: RateLimit,
    logs: Logs,
    auth: Option<SessionAuth>,
    offered: Offered,
}

/// The tools a session offers, withdrawn from the registry when it ends.
struct Offered {
    tools: Vec<String>,
    /// Forget them once no session offers them.
    ephemeral: bool,
}

impl Offered {
    /// Withdraws the session's offer; ephemeral tools nobody offers any more are forgotten, in the
    /// store first, then in the registry (which keeps any a new session offers meanwhile).
    fn withdraw(self, kernel: &Kernel) {
        let unoffered = kernel.registry.leave(&self.tools);
        if !self.ephemeral || unoffered.is_empty() {
            return;
        }
        let kernel = kernel.clone();
        tokio::spawn(async move {
            match kernel.store.forget_tools(unoffered).await {
                Ok(forgotten) => {
                    let forgotten = kernel.registry.forget(&forgotten);
                    debug!(tools = ?forgotten, "ephemeral tools forgotten with their last session");
                }
                Err(error) => warn!(%error, "ephemeral tools not forgotten"),
            }
        });
    }
}

/// One rate-limited log per kind of misbehaviour, so a hostile worker cannot flood the log.
struct Logs {
    progress_flood: LogEvery,
    heartbeat_flood: LogEvery,
    progress_not_held: LogEvery,
    result_not_held: LogEvery,
    oversized_result: LogEvery,
}

impl Default for Logs {
    fn default() -> Self {
        Logs {
            progress_flood: LogEvery::new(LOG_INTERVAL),
            heartbeat_flood: LogEvery::new(LOG_INTERVAL),
            progress_not_held: LogEvery::new(LOG_INTERVAL),
            result_not_held: LogEvery::new(LOG_INTERVAL),
            oversized_result: LogEvery::new(LOG_INTERVAL),
        }
    }
}

impl Session {
    async fn run(
        mut self,
        mut inbound: Streaming<pb::OpenSessionRequest>,
        mut orders: mpsc::UnboundedReceiver<Outbound>,
    ) {
        let reason = loop {
            tokio::select! {
                _ = self.kernel.shutdown.cancelled() => {
                    let _ = self.tx.send(Err(Status::unavailable("kernel shutting down"))).await;
                    break "kernel shutting down".to_owned();
                }
                Some(done) = self.recording.join_next(), if !self.recording.is_empty() => {
                    if let Ok(Some((dispatch_id, attempt))) = done {
                        self.release(&dispatch_id, attempt);
                    }
                }
                message = inbound.message() => match message {
                    Ok(Some(message)) => {
                        if let Err(status) = self.on_message(message).await {
                            let reason = status.message().to_owned();
                            let _ = self.tx.send(Err(status)).await;
                            break reason;
                        }
                    }
                    Ok(None) => break "closed its stream".to_owned(),
                    Err(status) => {
                        let status = unreadable(status, self.kernel.limits.max_message_bytes);
                        let reason = format!("stream broke: {}", status.message());
                        let _ = self.tx.send(Err(status)).await;
                        break reason;
                    }
                },
                refusal = key_revoked(&mut self.auth) => {
                    let reason = refusal.to_string();
                    warn!(session_id = %self.session_id, reason, "worker session closed: its key no longer admits it");
                    let _ = self.tx.send(Err(refusal.into())).await;
                    break reason;
                }
                order = orders.recv() => match order {
                    Some(order) => {
                        if let Err(reason) = self.deliver(order, &mut orders).await {
                            break reason;
                        }
                    }
                    None => break "scheduler stopped".to_owned(),
                },
            }
        };
        // Bounded: an acknowledgement to a worker that stopped reading must not hold its leases.
        let grace = self.kernel.scheduler.config().lease_ttl;
        let recorded = async { while self.recording.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, recorded).await.is_err() {
            warn!(
                session_id = %self.session_id,
                "results still being recorded when the session ended"
            );
            self.recording.detach_all();
        }
        // At shutdown the session's leases stay as they are in the store: the hand-back among
        // replicas, or boot recovery alone, settles them once, with the reason that is true.
        if !self.kernel.shutdown.is_cancelled() {
            self.kernel.scheduler.leave(self.session_id.clone(), reason);
        }
        let offered = std::mem::replace(
            &mut self.offered,
            Offered {
                tools: Vec::new(),
                ephemeral: false,
            },
        );
        offered.withdraw(&self.kernel);
    }

    /// Sends `order` to the worker, with the dispatches of tool calls queued behind it in the same
    /// message when the worker reads batches (one message instead of many costs a busy worker
    /// less). Tells why the session ends, when it does.
    async fn deliver(&mut self, order: Outbound, orders: &mut mpsc::UnboundedReceiver<Outbound>) -> Result<(), String> {
        let mut next = Some(order);
        while let Some(order) = next.take() {
            let order = match order {
                Outbound::Close(error) => {
                    let reason = error.to_string();
                    let _ = self.tx.send(Err(error.into())).await;
                    return Err(reason);
                }
                Outbound::Dispatch(first) if self.batches && first.step.kind != StepKind::Agent => {
                    let (orders_taken, after) = take_batch(*first, orders);
                    next = after;
                    let mut batch: Vec<pb::Dispatch> = orders_taken
                        .into_iter()
                        .filter_map(|order| self.tool_dispatch(order))
                        .collect();
                    if batch.is_empty() {
                        continue;
                    }
                    let message = if batch.len() == 1 {
                        Out::Dispatch(batch.pop().expect("one dispatch"))
                    } else {
                        Out::Dispatches(pb::Dispatches { dispatches: batch })
                    };
                    if self.tx.send(out(message)).await.is_err() {
                        return Err("stopped reading its stream".to_owned());
                    }
                    continue;
                }
                order => order,
            };
            if !self.forward(order).await {
                return Err("stopped reading its stream".to_owned());
            }
        }
        Ok(())
    }

    /// Keeps what the session must know of a dispatch it forwards (to fence its progress and
    /// result).
    fn hold(&mut self, dispatch_id: &DispatchId, attempt: u32, step: &crate::model::StepRecord) {
        self.dispatches.insert(
            dispatch_id.clone(),
            Held {
                attempt,
                run_id: step.run_id.clone(),
                key: step.key.clone(),
                position: step.position,
                tool: step.tool.clone(),
                kind: step.kind,
                progress: 0,
            },
        );
    }

    /// A tool call's dispatch message, its secret arguments unsealed; `None` when they cannot be
    /// (the call fails instead).
    fn tool_dispatch(&mut self, order: DispatchOrder) -> Option<pb::Dispatch> {
        match crate::secrets::dispatched(&order.step, self.kernel.secret_key.as_deref()) {
            Ok(arguments) => Some(self.call_dispatch(order, arguments)),
            Err(why) => {
                self.unsealable(order, why);
                None
            }
        }
    }

    /// A call whose secret arguments this kernel cannot unseal (its key changed, or is missing)
    /// fails at once, never sent to the worker: it would run without them.
    fn unsealable(&mut self, order: DispatchOrder, why: String) {
        let DispatchOrder {
            dispatch_id,
            attempt,
            step,
        } = order;
        warn!(run_id = %step.run_id, step = %step.key, tool = step.tool, why, "a call's secret arguments cannot be unsealed; it fails");
        let owed = Owed {
            kind: step.kind,
            name: &step.tool,
        };
        let answer = Answer::Error {
            kind: crate::model::ErrorKind::Fatal,
            message: why,
        };
        let report = ResultReport {
            dispatch_id: dispatch_id.clone(),
            attempt,
            session_id: self.session_id.clone(),
            outcome: answer::outcome(answer, owed, self.kernel.limits.max_result_bytes),
            progress_count: 0,
        };
        let kernel = self.kernel.clone();
        let place = (step.run_id.clone(), step.key.clone());
        self.recording.spawn(async move {
            if let Err(error) = record_result(&kernel, report, place).await {
                warn!(%dispatch_id, %error, "cannot record the failure of a call whose secrets cannot be unsealed");
            }
            kernel.scheduler.settled(dispatch_id, attempt);
            None
        });
    }

    /// Holds a tool call's dispatch for the session and makes its message, with `arguments`.
    fn call_dispatch(&mut self, order: DispatchOrder, arguments: String) -> pb::Dispatch {
        let DispatchOrder {
            dispatch_id,
            attempt,
            step,
        } = order;
        self.hold(&dispatch_id, attempt, &step);
        pb::Dispatch {
            dispatch_id: dispatch_id.to_string(),
            attempt,
            run_id: step.run_id.to_string(),
            step_key: step.key.to_string(),
            call_id: step.call_id.clone().unwrap_or_default(),
            turn: step.turn,
            position: step.position,
            tool: step.tool.clone(),
            arguments_json: arguments,
            idempotency_key: step.idempotency_key.clone(),
            timeout_ms: step.timeout_ms,
            traceparent: crate::traces::handed_to_worker(&step, attempt, self.kernel.hub.exports_traces()),
        }
    }

    async fn forward(&mut self, order: Outbound) -> bool {
        let message = match order {
            Outbound::Dispatch(order) => {
                if order.step.kind != StepKind::Agent {
                    let Some(dispatch) = self.tool_dispatch(*order) else {
                        return true;
                    };
                    return self.tx.send(out(Out::Dispatch(dispatch))).await.is_ok();
                }
                let DispatchOrder {
                    dispatch_id,
                    attempt,
                    step,
                } = *order;
                self.hold(&dispatch_id, attempt, &step);
                Out::Run(pb::RunDispatch {
                    dispatch_id: dispatch_id.to_string(),
                    attempt,
                    run_id: step.run_id.to_string(),
                    agent: step.tool.clone(),
                    input_json: step.arguments.clone(),
                    traceparent: crate::traces::handed_to_worker(&step, attempt, self.kernel.hub.exports_traces()),
                })
            }
            Outbound::Cancel {
                dispatch_id,
                attempt,
                reason,
            } => Out::Cancel(pb::CancelDispatch {
                dispatch_id: dispatch_id.to_string(),
                attempt,
                reason,
            }),
            Outbound::AskApproval {
                tool,
                arguments_json,
                reply,
            } => {
                let question_id = uuid::Uuid::now_v7().to_string();
                self.questions.insert(question_id.clone(), reply);
                Out::ApprovalQuestion(pb::ApprovalQuestion {
                    question_id,
                    tool,
                    arguments_json,
                })
            }
            Outbound::Close(_) => unreachable!("handled by the loop"),
        };
        self.tx.send(out(message)).await.is_ok()
    }

    async fn on_message(&mut self, message: pb::OpenSessionRequest) -> Result<(), Status> {
        match message.message {
            Some(In::Heartbeat(_)) => {
                let now = Instant::now();
                if self.heartbeat_limit.allow(now) {
                    self.kernel.scheduler.heartbeat(self.session_id.clone());
                } else if let Some(suppressed) = self.logs.heartbeat_flood.hit(now) {
                    warn!(
                        session_id = %self.session_id,
                        limit = self.kernel.limits.heartbeats_per_second,
                        suppressed,
                        "heartbeat flood: dropping heartbeats over the limit per second"
                    );
                }
            }
            Some(In::Drain(_)) => self.kernel.scheduler.drain(self.session_id.clone()),
            Some(In::Progress(progress)) => self.on_progress(progress),
            Some(In::Result(result)) => self.on_result(result),
            Some(In::Results(batch)) => {
                for result in batch.results {
                    self.on_result(result);
                }
            }
            Some(In::Cache(request)) => self.on_cache(request),
            Some(In::ApprovalAnswer(answer)) => {
                // An answer to no question (a duplicate, or one this session never asked) is ignored.
                if let Some(reply) = self.questions.remove(&answer.question_id) {
                    let _ = reply.send(if answer.error.is_empty() {
                        Ok(answer.required)
                    } else {
                        Err(answer.error)
                    });
                }
            }
            Some(In::Hello(_)) => return Err(Status::failed_precondition("hello may be sent only once per session")),
            None => return Err(Status::invalid_argument("message: empty session message")),
        }
        Ok(())
    }

    fn on_progress(&mut self, progress: pb::DispatchProgress) {
        let now = Instant::now();
        if !self.progress_limit.allow(now) {
            if let Some(suppressed) = self.logs.progress_flood.hit(now) {
                warn!(
                    session_id = %self.session_id,
                    limit = self.kernel.limits.progress_per_second,
                    suppressed,
                    "progress flood: dropping progress over the limit per second"
                );
            }
            return;
        }
        let Some(held) = self
            .dispatches
            .get_mut(progress.dispatch_id.as_str())
            .filter(|h| h.attempt == progress.attempt)
        else {
            if let Some(suppressed) = self.logs.progress_not_held.hit(now) {
                warn!(
                    session_id = %self.session_id,
                    dispatch_id = progress.dispatch_id,
                    suppressed,
                    "progress for a dispatch this session does not hold, dropped"
                );
            }
            return;
        };
        held.progress += 1;
        self.kernel.hub.publish_progress(ProgressUpdate {
            run_id: held.run_id.clone(),
            key: held.key.clone(),
            position: held.position,
            tool: held.tool.clone(),
            message: progress.message,
            data_json: progress.data_json,
            current: progress.current,
            total: progress.total,
        });
    }

    fn on_result(&mut self, result: pb::DispatchResult) {
        // Only the attempt this session was sent may report; anything else (never sent here, a
        // wrong attempt, a second result) is refused without reaching the store, which would
        // refuse it too.
        let Some(dispatch_id) = self
            .dispatches
            .get_key_value(result.dispatch_id.as_str())
            .filter(|(_, held)| held.attempt == result.attempt)
            .map(|(id, _)| id.clone())
        else {
            if let Some(suppressed) = self.logs.result_not_held.hit(Instant::now()) {
                info!(
                    session_id = %self.session_id,
                    dispatch_id = result.dispatch_id,
                    attempt = result.attempt,
                    suppressed,
                    "result for a dispatch this session does not hold refused, nothing recorded"
                );
            }
            self.ack(
                result.dispatch_id,
                result.attempt,
                "this dispatch no longer holds its call (stale attempt, timed out, cancelled or not yours)",
            );
            return;
        };
        // A suspension leaves the dispatch in this session's hands until the store takes it, so
        // a refused one changes nothing here either.
        let outcome = match result.outcome {
            Some(pb::dispatch_result::Outcome::Suspended(suspended)) => {
                self.on_suspended(dispatch_id, result.attempt, suspended.waiting_on);
                return;
            }
            outcome => outcome,
        };
        let held = self
            .dispatches
            .remove(&dispatch_id)
            .expect("held at this attempt, checked above");
        let max = self.kernel.limits.max_result_bytes;
        let answer = match outcome {
            Some(pb::dispatch_result::Outcome::OutputJson(text)) => {
                if text.len() > max
                    && let Some(suppressed) = self.logs.oversized_result.hit(Instant::now())
                {
                    warn!(
                        session_id = %self.session_id,
                        tool = held.tool,
                        bytes = text.len(),
                        limit = max,
                        suppressed,
                        "oversized result: the call fails, the session goes on"
                    );
                }
                Answer::Output(self.recorded_output(&held, text))
            }
            Some(pb::dispatch_result::Outcome::Error(failure)) => Answer::Error {
                kind: convert::error_kind_from(failure.kind),
                message: failure.message,
            },
            Some(pb::dispatch_result::Outcome::Suspended(_)) => unreachable!("handled above"),
            None => Answer::Nothing,
        };
        let owed = Owed {
            kind: held.kind,
            name: &held.tool,
        };
        let outcome = answer::outcome(answer, owed, max);
        let report = ResultReport {
            dispatch_id: dispatch_id.clone(),
            attempt: result.attempt,
            session_id: self.session_id.clone(),
            outcome,
            progress_count: held.progress,
        };
        // Recording waits for a commit; the session keeps reading meanwhile.
        let kernel = self.kernel.clone();
        let tx = self.tx.clone();
        let session_id = self.session_id.clone();
        let place = (held.run_id.clone(), held.key.clone());
        self.recording.spawn(async move {
            // A retry is queued, and what a handler's return left in flight cancelled, by the
            // commit's effects; the slot is this session's to give back.
            let (accepted, reason) = match record_result(&kernel, report, place).await {
                Ok(Some((step, _))) => {
                    debug!(run_id = %step.run_id, step = %step.key, tool = step.tool, status = %step.status, "result recorded");
                    if step.kind == StepKind::Agent {
                        info!(run_id = %step.run_id, agent = step.tool, status = %step.status, "hosted run finished");
                    }
                    (true, String::new())
                }
                Ok(None) => {
                    info!(
                        %session_id,
                        %dispatch_id,
                        attempt = result.attempt,
                        "stale result refused, nothing recorded"
                    );
                    (
                        false,
                        "this dispatch no longer holds its call (stale attempt, timed out, cancelled or not yours)"
                            .to_owned(),
                    )
                }
                Err(error) => {
                    warn!(%session_id, %dispatch_id, %error, "cannot record a result");
                    (false, error.to_string())
                }
            };
            kernel.scheduler.settled(dispatch_id, result.attempt);
            let ack = pb::ResultAck {
                dispatch_id: result.dispatch_id,
                attempt: result.attempt,
                accepted,
                reason,
                still_held: false,
            };
            let _ = tx.send(out(Out::ResultAck(ack))).await;
            None
        });
    }

    /// A tool's output as the record keeps it: its secret result fields marked ([`crate::secrets`]).
    fn recorded_output(&self, held: &Held, text: String) -> String {
        let (StepKind::Tool, Some(key)) = (held.kind, &self.kernel.secret_key) else {
            return text;
        };
        match self.kernel.registry.get(&held.tool) {
            Some(tool) => crate::secrets::recorded_output(text, &tool.secrets, key),
            None => text,
        }
    }

    /// Refuses a worker's answer for `reason` without recording anything.
    fn ack(&self, dispatch_id: String, attempt: u32, reason: &str) {
        let ack = pb::ResultAck {
            dispatch_id,
            attempt,
            accepted: false,
            reason: reason.to_owned(),
            still_held: false,
        };
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(out(Out::ResultAck(ack))).await;
        });
    }

    /// A handler (or a tool body) gave back its slot: its dispatch is suspended (fenced, and
    /// checked by the machine, in the write) and the slot freed. A suspension the store refuses
    /// changes nothing: the dispatch keeps its lease, its slot and its place in this session, and
    /// the worker hears why, and that it still holds the dispatch.
    fn on_suspended(&mut self, dispatch_id: DispatchId, attempt: u32, waiting_on: Vec<String>) {
        let report = SuspendReport {
            dispatch_id: dispatch_id.clone(),
            attempt,
            session_id: self.session_id.clone(),
            waiting_on,
        };
        let kernel = self.kernel.clone();
        let tx = self.tx.clone();
        let session_id = self.session_id.clone();
        self.recording.spawn(async move {
            let (accepted, still_held, reason) = match kernel.store.suspend_dispatch(report).await {
                Ok(Some(step)) => {
                    info!(run_id = %step.run_id, step = %step.key, tool = step.tool, "dispatch suspended");
                    kernel.scheduler.settled(dispatch_id.clone(), attempt);
                    (true, false, String::new())
                }
                Ok(None) => {
                    kernel.scheduler.settled(dispatch_id.clone(), attempt);
                    (false, false, "this dispatch no longer holds its run".to_owned())
                }
                Err(error) => {
                    info!(%session_id, %dispatch_id, attempt, %error, "suspension refused, the dispatch keeps its lease");
                    (false, true, error.to_string())
                }
            };
            let ack = pb::ResultAck {
                dispatch_id: dispatch_id.to_string(),
                attempt,
                accepted,
                reason,
                still_held,
            };
            let _ = tx.send(out(Out::ResultAck(ack))).await;
            (!still_held).then_some((dispatch_id, attempt))
        });
    }

    /// Forgets a dispatch the store no longer has this session hold, unless a later attempt of it
    /// was sent here meanwhile.
    fn release(&mut self, dispatch_id: &DispatchId, attempt: u32) {
        if self
            .dispatches
            .get(dispatch_id)
            .is_some_and(|held| held.attempt == attempt)
        {
            self.dispatches.remove(dispatch_id);
        }
    }

    /// Serves a tool's cache request. The namespace is the tool of the dispatch the request names,
    /// which this session must hold at that attempt; a worker cannot reach another tool's entries.
    fn on_cache(&mut self, request: pb::CacheRequest) {
        let request_id = request.request_id;
        let Some((dispatch_id, held)) = self
            .dispatches
            .get_key_value(request.dispatch_id.as_str())
            .filter(|(_, h)| h.attempt == request.attempt)
        else {
            debug!(
                session_id = %self.session_id,
                dispatch_id = request.dispatch_id,
                attempt = request.attempt,
                "cache request for a dispatch this session does not hold, refused"
            );
            let error = format!(
                "dispatch {} attempt {} is not held by this session (finished, superseded or never sent here)",
                request.dispatch_id, request.attempt
            );
            self.answer_cache(cache_refusal(request_id, error));
            return;
        };
        let (dispatch_id, tool) = (dispatch_id.clone(), held.tool.clone());
        // Reads and commits wait on the store; the session keeps reading meanwhile.
        let kernel = self.kernel.clone();
        let tx = self.tx.clone();
        let session_id = self.session_id.clone();
        tokio::spawn(async move {
            let response = match request.op {
                Some(pb::cache_request::Op::Get(get)) => match kernel.store.reads.tool_cache_get(tool, get.key).await {
                    Ok(Some(value_json)) => pb::CacheResponse {
                        request_id,
                        found: true,
                        value_json,
                        error: String::new(),
                    },
                    Ok(None) => pb::CacheResponse {
                        request_id,
                        ..Default::default()
                    },
                    Err(error) => cache_refusal(request_id, error.to_string()),
                },
                Some(pb::cache_request::Op::Set(set)) => {
                    let expires_at = (set.ttl_ms > 0).then(|| {
                        kernel
                            .store
                            .clock()
                            .now_millis()
                            .saturating_add(i64::try_from(set.ttl_ms).unwrap_or(i64::MAX))
                    });
                    let entry = ToolCacheSet {
                        dispatch_id,
                        attempt: request.attempt,
                        session_id: session_id.clone(),
                        key: set.key,
                        value: set.value_json,
                        expires_at,
                    };
                    match kernel.store.tool_cache_set(entry).await {
                        Ok(()) => pb::CacheResponse {
                            request_id,
                            ..Default::default()
                        },
                        Err(error) => cache_refusal(request_id, error.to_string()),
                    }
                }
                None => cache_refusal(request_id, "op: neither get nor set".to_owned()),
            };
            if !response.error.is_empty() {
                debug!(%session_id, request_id, error = response.error, "cache request refused");
            }
            let _ = tx.send(out(Out::Cache(response))).await;
        });
    }

    /// Answers without waiting: a refusal needs no store, and the session loop must not block.
    fn answer_cache(&self, response: pb::CacheResponse) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(out(Out::Cache(response))).await;
        });
    }
}

fn cache_refusal(request_id: u64, error: String) -> pb::CacheResponse {
    pb::CacheResponse {
        request_id,
        found: false,
        value_json: String::new(),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records;

    fn order(kind: StepKind) -> Outbound {
        let mut step = records::step();
        step.kind = kind;
        Outbound::Dispatch(Box::new(DispatchOrder {
            dispatch_id: DispatchId::new(),
            attempt: 1,
            step,
        }))
    }

    fn first() -> DispatchOrder {
        match order(StepKind::Tool) {
            Outbound::Dispatch(order) => *order,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_batch_takes_the_calls_queued_behind_the_first_and_stops_at_any_other_order() {
        let (tx, mut orders) = mpsc::unbounded_channel();
        tx.send(order(StepKind::Tool)).unwrap();
        tx.send(order(StepKind::Tool)).unwrap();
        tx.send(Outbound::Cancel {
            dispatch_id: DispatchId::new(),
            attempt: 1,
            reason: "cancelled".into(),
        })
        .unwrap();
        tx.send(order(StepKind::Tool)).unwrap();
        let (batch, after) = take_batch(first(), &mut orders);
        assert_eq!(batch.len(), 3, "the first and the two calls behind it");
        assert!(matches!(after, Some(Outbound::Cancel { .. })), "{after:?}");
        let (batch, after) = take_batch(first(), &mut orders);
        assert_eq!(batch.len(), 2, "the call after the cancel starts the next");
        assert!(after.is_none());
    }

    #[test]
    fn a_hosted_run_s_dispatch_ends_a_batch_and_a_batch_holds_at_most_its_bound() {
        let (tx, mut orders) = mpsc::unbounded_channel();
        tx.send(order(StepKind::Agent)).unwrap();
        let (batch, after) = take_batch(first(), &mut orders);
        assert_eq!(batch.len(), 1);
        assert!(matches!(&after, Some(Outbound::Dispatch(o)) if o.step.kind == StepKind::Agent));
        for _ in 0..MAX_BATCH + 3 {
            tx.send(order(StepKind::Tool)).unwrap();
        }
        let (batch, after) = take_batch(first(), &mut orders);
        assert_eq!(batch.len(), MAX_BATCH);
        assert!(after.is_none());
        assert_eq!(
            take_batch(first(), &mut orders).0.len(),
            5,
            "the first and the four left"
        );
    }
}
