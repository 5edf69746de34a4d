//! The scheduler: one task that owns the live view of worker sessions, the queue of calls
//! waiting for a slot, and the leases of dispatched calls.
//!
//! It never awaits the store. A dispatch is reserved here (a slot taken, a lease in state
//! `Starting`), `tool:start` is written by a spawned task, and only when that commit comes back as
//! a message does the scheduler tell the worker to run: `tool:start` is committed before the
//! worker may run the tool (and synced to disk first for an `at_most_once` call: see
//! `store::sync`). The one exception is a `safe_to_retry` call with a slot reserved for its turn,
//! which the writer sends while the turn commits (`early`). Connection state here is advisory;
//! the store is the truth, and every lease loss goes through the store's fenced write.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cluster::Offers;
use crate::error::KernelError;
use crate::machine::effects::Effect;
use crate::machine::human_ms;
use crate::model::{
    AgentDef, DispatchId, Millis, RunId, SessionId, StepKey, StepKind, StepRecord, StepStatus, ToolDef,
};
use crate::store::{LeaseLoss, LossOutcome, StartDispatch, Store};

mod early;
mod queue;
mod shares;
mod throttle;

pub use early::Reservation;
use queue::Queue;
pub use throttle::PolicySource;
use throttle::Throttle;

/// Timing of sessions and leases.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// How often workers are asked to heartbeat.
    pub heartbeat_interval: Duration,
    /// A worker silent this long loses its session and its leases.
    pub lease_ttl: Duration,
    /// A call waits this long for some worker to offer its tool, then fails.
    pub schedule_to_start_timeout: Duration,
    /// How long a cancelled dispatch keeps its slot while the worker winds down.
    pub cancel_grace: Duration,
    /// How often deadlines are checked.
    pub tick: Duration,
    /// How often the store is scanned for calls the scheduler lost track of.
    pub scan_interval: Duration,
    /// Other kernel replicas share the database (PostgreSQL): a call whose tool only their
    /// sessions offer is theirs to claim, and only leases this replica holds are its to lose.
    pub replicated: bool,
    /// The tool limits and fair shares in force (the policy file's `limits` and `fair_shares`).
    pub policy: PolicySource,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            heartbeat_interval: Duration::from_secs(3),
            lease_ttl: Duration::from_secs(10),
            schedule_to_start_timeout: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
            tick: Duration::from_millis(100),
            scan_interval: Duration::from_secs(5),
            replicated: false,
            policy: PolicySource::default(),
        }
    }
}

/// A worker's announcement, validated.
#[derive(Clone, Debug)]
pub struct SessionHello {
    pub name: String,
    pub tools: Vec<ToolDef>,
    pub max_concurrency: u32,
    /// Forget the session's tools once no session offers them (benchmarks, tests).
    pub ephemeral_tools: bool,
    /// Agents whose runs the worker hosts.
    pub agents: Vec<AgentDef>,
}

/// An order to run a call, as the session forwards it to its worker.
#[derive(Clone, Debug)]
pub struct DispatchOrder {
    pub dispatch_id: DispatchId,
    pub attempt: u32,
    pub step: StepRecord,
}

/// What the scheduler asks a session to send its worker.
#[derive(Debug)]
pub enum Outbound {
    Dispatch(Box<DispatchOrder>),
    Cancel {
        dispatch_id: DispatchId,
        attempt: u32,
        reason: String,
    },
    /// End the session with this error (lease expired).
    Close(KernelError),
    /// Ask the worker whether a call of `tool` with these arguments needs a person's approval (the
    /// tool's predicate is code in the worker); the answer, or why there is none, goes to `reply`.
    AskApproval {
        tool: String,
        arguments_json: String,
        reply: oneshot::Sender<Result<bool, String>>,
    },
}

/// A connected worker, as `workers list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerSnapshot {
    pub session_id: SessionId,
    pub name: String,
    pub tools: Vec<String>,
    pub agents: Vec<String>,
    pub max_concurrency: u32,
    pub slots_in_use: u32,
    pub draining: bool,
    pub connected_at: Millis,
    pub last_heartbeat_at: Millis,
    /// The replica whose session it is.
    #[serde(default)]
    pub replica: String,
}

/// A new call of a turn that wants a slot reserved: its identity, its tool, and the resource
/// instances it must hold to run.
#[derive(Clone, Debug)]
pub struct ReserveCall {
    pub key: StepKey,
    pub tool: String,
    pub locks: Vec<String>,
}

/// What the scheduler holds in memory (the first three return to zero when the kernel is idle),
/// and what its in-flight scan has found since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerGauges {
    pub sessions: usize,
    pub queued: usize,
    pub leased: usize,
    /// In-flight scans completed.
    pub scans: u64,
    /// Calls those scans found that no in-memory path held: each one is a lost message.
    pub lost_found: u64,
}

/// How a turn's write ended, for the slots it reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Committed,
    /// It did not commit.
    Failed,
    /// The connection dropped as it committed: it may have.
    Unknown,
}

/// How long a start whose commit's outcome is unknown keeps its slot while the store is asked.
const UNSURE_FOR: Duration = Duration::from_secs(60);

/// Tool names and agent names, apart: an agent may share a tool's name.
type Names = (std::collections::BTreeSet<String>, std::collections::BTreeSet<String>);

enum Msg {
    Join {
        hello: SessionHello,
        outbound: mpsc::UnboundedSender<Outbound>,
        reply: oneshot::Sender<Result<SessionId, KernelError>>,
    },
    Leave {
        session_id: SessionId,
        reason: String,
    },
    Heartbeat {
        session_id: SessionId,
    },
    Ready {
        session_id: SessionId,
    },
    Drain {
        session_id: SessionId,
    },
    Enqueue(StepRecord),
    /// What a commit left to do, in order.
    Effects(Vec<Effect>),
    Started {
        dispatch_id: DispatchId,
        attempt: u32,
        result: Result<Option<StepRecord>, KernelError>,
    },
    Settled {
        dispatch_id: DispatchId,
        attempt: u32,
    },
    CancelSteps {
        steps: Vec<StepRecord>,
        reason: String,
    },
    Snapshot(oneshot::Sender<Vec<WorkerSnapshot>>),
    Gauges(oneshot::Sender<SchedulerGauges>),
    Reserve {
        run_id: RunId,
        /// The turn, and how many of its calls may run at once.
        turn: (u32, Option<u32>),
        calls: Vec<ReserveCall>,
        reply: oneshot::Sender<Vec<Option<Reservation>>>,
    },
    Reserved(Vec<(StartDispatch, Option<StepRecord>)>, Written),
    /// What the store holds of a start whose commit's outcome was unknown: the step, if found.
    Resolved {
        dispatch_id: DispatchId,
        attempt: u32,
        step: Option<StepRecord>,
    },
    /// A reserved call went to its worker before its start committed, with this timeout.
    Sent {
        dispatch_id: DispatchId,
        attempt: u32,
        timeout: Duration,
    },
    /// What the store says is in flight, for the periodic scan.
    Reconcile(Vec<StepRecord>),
    /// A lost dispatch's loss is recorded: the store released its locks, and so does memory.
    Unlock(DispatchId),
    /// How many queued calls wait for each held resource instance.
    LockWaits(oneshot::Sender<HashMap<String, u32>>),
    /// How many queued calls wait for each tool limit to make room.
    LimitWaits(oneshot::Sender<HashMap<String, u32>>),
    /// The queued calls of each fair share (`None`: runs without the label).
    ShareQueues(oneshot::Sender<HashMap<Option<String>, u32>>),
    /// What this replica's sessions offer.
    Offers(oneshot::Sender<Offers>),
    /// What the other live replicas' sessions offer, by replica.
    RemoteOffers(Vec<(String, Offers)>),
    /// Another replica made calls of these tools (or dispatches of these agents) wait for a worker.
    Claim {
        tools: Vec<String>,
        agents: Vec<String>,
    },
    /// Waiting steps read for a claim of `names`, which asked for at most `limit`.
    Claimed {
        steps: Vec<StepRecord>,
        names: Names,
        limit: usize,
    },
    /// Another replica wrote these runs: a lease here whose step it settled is cancelled.
    RemoteRuns(Vec<RunId>),
    /// The kernel drains: start nothing new, and answer once no call runs on a worker here.
    Quiesce(oneshot::Sender<()>),
    /// Ask a worker offering `tool` to evaluate its approval predicate.
    AskApproval {
        tool: String,
        arguments_json: String,
        reply: oneshot::Sender<Result<bool, String>>,
    },
    /// Check the deadlines now, as a tick does, and answer once checked: a test on a manual clock
    /// knows then that what was not due did not happen, without waiting for a tick.
    #[cfg(test)]
    Tick(oneshot::Sender<()>),
}

/// A cheap handle on the scheduler task.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Msg>,
    config: SchedulerConfig,
}

impl Scheduler {
    /// Starts the scheduler task; it stops when `shutdown` is cancelled.
    pub fn spawn(config: SchedulerConfig, store: Store, shutdown: CancellationToken) -> Scheduler {
        let (scheduler, task) = Scheduler::new(config, store, shutdown);
        tokio::spawn(task);
        scheduler
    }

    /// The scheduler's handle and its task, for the caller to spawn; the task ends when
    /// `shutdown` is cancelled.
    pub fn new(
        config: SchedulerConfig,
        store: Store,
        shutdown: CancellationToken,
    ) -> (Scheduler, impl std::future::Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::unbounded_channel();
        let effects = tx.clone();
        store.on_effects(move |handed| {
            let _ = effects.send(Msg::Effects(handed));
        });
        let mut actor = Actor {
            config: config.clone(),
            store,
            me: tx.clone(),
            sessions: HashMap::new(),
            queue: Queue::default(),
            leases: HashMap::new(),
            locked: HashMap::new(),
            turn: 0,
            expiring: Default::default(),
            scans: 0,
            lost_found: 0,
            unqueued: Default::default(),
            remote: Vec::new(),
            claiming: false,
            deferred: Default::default(),
            wanting: Default::default(),
            delivered: Default::default(),
            stopping: false,
            quiesced: Vec::new(),
            throttle: Throttle::new(config.policy.clone()),
        };
        // The calls a restart finds queued take their shares from the first.
        actor.read_policy();
        (Scheduler { tx, config }, actor.run(rx, shutdown))
    }

    /// The timing the scheduler runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    fn send(&self, msg: Msg) {
        // The scheduler outlives every session and request; if it has stopped, the kernel is
        // shutting down and dropping the message is what shutdown means.
        let _ = self.tx.send(msg);
    }

    /// Admits a worker session; refuses a tool whose fingerprint conflicts with a connected worker's.
    pub async fn join(
        &self,
        hello: SessionHello,
        outbound: mpsc::UnboundedSender<Outbound>,
    ) -> Result<SessionId, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::Join { hello, outbound, reply });
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))?
    }

    /// The session ended: its leases are lost at once.
    pub fn leave(&self, session_id: SessionId, reason: String) {
        self.send(Msg::Leave { session_id, reason });
    }

    pub fn heartbeat(&self, session_id: SessionId) {
        self.send(Msg::Heartbeat { session_id });
    }

    /// Checks every deadline against the clock now; returns once checked.
    #[cfg(test)]
    pub async fn tick(&self) {
        let (reply, checked) = oneshot::channel();
        self.send(Msg::Tick(reply));
        let _ = checked.await;
    }

    /// The session's tools and agents are registered: `workers list` may show it now, and a
    /// client that sees it there may use what it offers.
    pub fn ready(&self, session_id: SessionId) {
        self.send(Msg::Ready { session_id });
    }

    /// No more dispatches to this session.
    pub fn drain(&self, session_id: SessionId) {
        self.send(Msg::Drain { session_id });
    }

    /// A pending step to dispatch.
    pub fn enqueue(&self, step: StepRecord) {
        self.send(Msg::Enqueue(step));
    }

    /// A worker's result for this dispatch was handled (recorded or refused): its slot is free.
    pub fn settled(&self, dispatch_id: DispatchId, attempt: u32) {
        self.send(Msg::Settled { dispatch_id, attempt });
    }

    /// These steps were settled by the store (run ended): drop them from the queue and cancel
    /// their dispatches on the workers.
    pub fn cancel_steps(&self, steps: Vec<StepRecord>, reason: String) {
        if !steps.is_empty() {
            self.send(Msg::CancelSteps { steps, reason });
        }
    }

    /// Reserves worker slots for the calls `(key, tool)` of a new turn of `run_id`, so that each
    /// call's `tool:start` can be recorded in the same commit as its `tool:scheduled`: one slot per
    /// call whose tool has a free one, and none while calls are queued (they come first). Every
    /// reservation must come back through [`Scheduler::reserved`].
    pub async fn reserve(
        &self,
        run_id: RunId,
        turn: (u32, Option<u32>),
        calls: Vec<ReserveCall>,
    ) -> Vec<Option<Reservation>> {
        let none = calls.len();
        let (reply, answer) = oneshot::channel();
        self.send(Msg::Reserve {
            run_id,
            turn,
            calls,
            reply,
        });
        answer.await.unwrap_or_else(|_| vec![None; none])
    }

    /// What became of reserved slots once the turn was `written`: a call started on its slot goes
    /// to its worker, unless the writer sent it before the commit ([`Scheduler::dispatch_early`]);
    /// a slot whose call did not start (gated, settled at once, or the write failed) is given back
    /// (a call recorded waiting, given as a pending step, is queued), and a call sent before a
    /// write that failed is cancelled on its worker. When the write's outcome is unknown, each
    /// slot is held until the store says whether its start committed.
    pub fn reserved(&self, outcome: Vec<(StartDispatch, Option<StepRecord>)>, written: Written) {
        if !outcome.is_empty() {
            self.send(Msg::Reserved(outcome, written));
        }
    }

    /// What this replica's sessions offer, for its row in the replicas table.
    pub async fn offers(&self) -> Result<Offers, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::Offers(reply));
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))
    }

    /// What the other live replicas' sessions offer now.
    pub fn remote_offers(&self, offers: Vec<(String, Offers)>) {
        self.send(Msg::RemoteOffers(offers));
    }

    /// Another replica's commit left calls of `tools` (or runs of `agents`) waiting for a worker:
    /// if this replica's sessions offer one and have a free slot, it claims some.
    pub fn claim(&self, tools: Vec<String>, agents: Vec<String>) {
        if !tools.is_empty() || !agents.is_empty() {
            self.send(Msg::Claim { tools, agents });
        }
    }

    /// Another replica wrote these runs.
    pub fn remote_runs(&self, runs: Vec<RunId>) {
        if !runs.is_empty() {
            self.send(Msg::RemoteRuns(runs));
        }
    }

    /// How many sessions, queued calls and leases the scheduler holds.
    pub async fn gauges(&self) -> Result<SchedulerGauges, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::Gauges(reply));
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))
    }

    /// How many queued calls wait for each held resource instance.
    pub async fn lock_waits(&self) -> Result<HashMap<String, u32>, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::LockWaits(reply));
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))
    }

    /// How many calls of each fair share wait in the queue (`None`: those of runs without the
    /// fair-share label).
    pub async fn share_queues(&self) -> Result<HashMap<Option<String>, u32>, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::ShareQueues(reply));
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))
    }

    /// How many queued calls wait for each tool limit (by its `tools` glob) to make room.
    pub async fn limit_waits(&self) -> Result<HashMap<String, u32>, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::LimitWaits(reply));
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))
    }

    /// Starts nothing new from now on (queued calls stay queued, in memory and in the store, for
    /// the next kernel), and returns once no call runs on a worker of this kernel. A hosted run's
    /// own dispatch is not waited for: its handler may wait on people for days.
    pub async fn quiesce(&self) {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::Quiesce(reply));
        // A scheduler that has stopped runs nothing.
        let _ = answer.await;
    }

    /// Asks a worker offering `tool` whether a call with these arguments needs a person's
    /// approval (its predicate is code in the worker). `Err` says why there is no answer: no worker
    /// here offers the tool, the predicate raised, or the session ended first.
    pub async fn ask_approval(&self, tool: String, arguments_json: String) -> Result<bool, String> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::AskApproval {
            tool,
            arguments_json,
            reply,
        });
        answer
            .await
            .unwrap_or_else(|_| Err("the worker's session ended before it answered".into()))
    }

    /// The connected workers.
    pub async fn snapshot(&self) -> Result<Vec<WorkerSnapshot>, KernelError> {
        let (reply, answer) = oneshot::channel();
        self.send(Msg::Snapshot(reply));
        answer
            .await
            .map_err(|_| KernelError::Unavailable("the scheduler has stopped".into()))
    }
}

struct Session {
    name: String,
    tools: HashMap<String, String>,
    /// Agents hosted: fingerprint and how many runs of each at once (`None`: only the slots bound).
    agents: HashMap<String, (String, Option<u32>)>,
    /// Runs of each agent this session hosts now.
    hosting: HashMap<String, u32>,
    /// Registered: listed by `workers list` (dispatches may go to it before).
    ready: bool,
    max_concurrency: u32,
    in_use: u32,
    draining: bool,
    outbound: mpsc::UnboundedSender<Outbound>,
    connected_at: Millis,
    last_heartbeat: Instant,
    last_heartbeat_at: Millis,
}

impl Session {
    fn can_take(&self, kind: StepKind, name: &str) -> bool {
        !self.draining
            && self.in_use < self.max_concurrency
            && self.offers(kind, name)
            && (kind != StepKind::Agent || self.hosts_another(name))
    }

    /// Whether the agent's bound on this session leaves room for another of its runs.
    fn hosts_another(&self, agent: &str) -> bool {
        let hosting = self.hosting.get(agent).copied().unwrap_or(0);
        self.agents.get(agent).and_then(|a| a.1).is_none_or(|max| hosting < max)
    }

    /// Whether the session offers the tool (or, for a run's dispatch, the agent) `name`.
    fn offers(&self, kind: StepKind, name: &str) -> bool {
        match kind {
            StepKind::Agent => self.agents.contains_key(name),
            _ => self.tools.contains_key(name),
        }
    }
}

/// How long a dispatch of `step` may run. A hosted run's handler has no timeout: it may wait on
/// people for days.
fn lease_timeout(step: &StepRecord) -> Duration {
    match step.timeout_ms {
        0 => Duration::from_secs(10 * 365 * 24 * 3600),
        ms => Duration::from_millis(ms),
    }
}

enum LeaseState {
    /// `tool:start` is being written; the worker has not been told.
    Starting,
    Running {
        deadline: Instant,
    },
    /// A cancel was sent; the slot stays taken until the worker answers or the grace ends.
    Cancelling {
        until: Instant,
    },
}

struct Lease {
    session_id: SessionId,
    run_id: RunId,
    key: StepKey,
    attempt: u32,
    state: LeaseState,
    /// The agent, for the dispatch of a hosted run: it counts toward the agent's bound.
    agent: Option<String>,
    /// The call's turn: it counts toward the turn's bound.
    turn: u32,
    /// The tool limits its start passes, with the call to queue again if the store refuses it.
    limited: Option<Box<Limited>>,
}

/// A start under tool limits, as its lease keeps it.
struct Limited {
    /// The limits, by name.
    names: Vec<String>,
    /// The call, to queue again if the store refuses its start; `None` for a call of a turn that
    /// starts in the turn's write, which the store schedules instead.
    step: Option<StepRecord>,
    /// Since when it waited for the limits, when it did.
    waiting: Option<Instant>,
}

/// The resource instances a call must hold to run ([`crate::resources::locks`]).
fn locks_of(step: &StepRecord) -> Vec<String> {
    crate::resources::locks(&step.resources).cloned().collect()
}

struct Actor {
    config: SchedulerConfig,
    store: Store,
    me: mpsc::UnboundedSender<Msg>,
    sessions: HashMap<SessionId, Session>,
    queue: Queue,
    leases: HashMap<DispatchId, Lease>,
    /// Resource instances held, by the dispatch holding each. A lost dispatch keeps its locks until
    /// its loss is recorded, so no other call starts on them before the store releases them.
    locked: HashMap<String, DispatchId>,
    /// Rotates ties between equally loaded workers.
    turn: usize,
    /// An expiry pass is running.
    expiring: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// In-flight scans reconciled, and the calls they found lost.
    scans: u64,
    lost_found: u64,
    /// Waiting calls the last scan found neither queued nor leased. One is lost only if the next
    /// scan finds it so again: a call made waiting by a write whose answer is on its way here
    /// (a retry, a turn's unstarted call) is queued by that answer.
    unqueued: std::collections::HashSet<(RunId, StepKey)>,
    /// What the other live replicas offer (empty on SQLite).
    remote: Vec<(String, Offers)>,
    /// A claim's read is running: another waits for it rather than reading the same rows twice.
    claiming: bool,
    /// Tools and agents asked for while a claim's read ran: claimed when it is back.
    deferred: Names,
    /// Tools and agents whose waiting calls the store may still hold for sessions here: a claim
    /// found no free slot for them, or took as many as it had slots for. Claimed again as soon as
    /// a slot is left with nothing queued here to fill it, rather than at the next scan.
    wanting: Names,
    /// Reserved calls sent to their workers before their start committed, until their turn's
    /// write comes back: that answer must not send them again, nor lose them.
    delivered: std::collections::HashSet<DispatchId>,
    /// The kernel drains: nothing new is dispatched or reserved.
    stopping: bool,
    /// Who waits for the last call running on a worker here to end.
    quiesced: Vec<oneshot::Sender<()>>,
    /// The tool limits, and the calls running and tokens left under each as this replica counts.
    throttle: Throttle,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut approvals = tokio::time::interval(Duration::from_millis(250));
        approvals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first scan waits a whole interval: what was in flight at boot is recovered (and
        // queued) before the scheduler starts, so a scan at once would only race that recovery.
        let mut scan = tokio::time::interval_at(Instant::now() + self.config.scan_interval, self.config.scan_interval);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                msg = rx.recv() => match msg {
                    Some(msg) => self.handle(msg),
                    None => break,
                },
                _ = tick.tick() => self.on_tick(),
                _ = scan.tick() => self.scan(),
                _ = approvals.tick() => self.expire_approvals(),
            }
            if !self.quiesced.is_empty() && !self.leases.values().any(|lease| lease.agent.is_none()) {
                for waiter in self.quiesced.drain(..) {
                    let _ = waiter.send(());
                }
            }
        }
        debug!("scheduler stopped");
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Join { hello, outbound, reply } => {
                let joined = self.join(hello, outbound);
                if let (Ok(session_id), true) = (&joined, self.config.replicated) {
                    // Calls another replica recorded may be waiting for exactly this worker.
                    let session = &self.sessions[session_id];
                    let tools = session.tools.keys().cloned().collect();
                    let agents = session.agents.keys().cloned().collect();
                    self.claim(tools, agents);
                }
                let _ = reply.send(joined);
                self.dispatch_ready();
            }
            Msg::Offers(reply) => {
                let _ = reply.send(self.local_offers());
            }
            Msg::RemoteOffers(remote) => self.remote = remote,
            Msg::Claim { tools, agents } => self.claim(tools, agents),
            Msg::Claimed { steps, names, limit } => {
                self.claiming = false;
                // As many as asked for: more may wait.
                if steps.len() >= limit {
                    self.wanting.0.extend(names.0);
                    self.wanting.1.extend(names.1);
                }
                for step in steps {
                    self.enqueue(step);
                }
                let (tools, agents) = std::mem::take(&mut self.deferred);
                self.claim(tools.into_iter().collect(), agents.into_iter().collect());
                self.dispatch_ready();
            }
            Msg::RemoteRuns(runs) => self.check_remote_runs(runs),
            Msg::AskApproval {
                tool,
                arguments_json,
                reply,
            } => self.ask_approval(tool, arguments_json, reply),
            Msg::Quiesce(reply) => {
                if !self.stopping {
                    let running = self.leases.values().filter(|lease| lease.agent.is_none()).count();
                    info!(running, queued = self.queue.len(), "draining: no new dispatches");
                }
                self.stopping = true;
                self.quiesced.push(reply);
            }
            Msg::Leave { session_id, reason } => self.leave(&session_id, &reason),
            #[cfg(test)]
            Msg::Tick(reply) => {
                self.on_tick();
                let _ = reply.send(());
            }
            Msg::Heartbeat { session_id } => {
                if let Some(session) = self.sessions.get_mut(&session_id) {
                    session.last_heartbeat = self.store.clock().instant();
                    session.last_heartbeat_at = self.store.clock().now_millis();
                }
            }
            Msg::Ready { session_id } => {
                if let Some(session) = self.sessions.get_mut(&session_id) {
                    session.ready = true;
                }
            }
            Msg::Drain { session_id } => {
                if let Some(session) = self.sessions.get_mut(&session_id) {
                    info!(%session_id, worker = session.name, "worker draining");
                    session.draining = true;
                }
            }
            Msg::Enqueue(step) => {
                self.enqueue(step);
                self.dispatch_ready();
            }
            Msg::Effects(effects) => {
                for effect in effects {
                    match effect {
                        Effect::Dispatch(step) => self.enqueue_committed(*step),
                        Effect::Cancel { steps, reason } => self.cancel_steps(steps, &reason),
                    }
                }
                self.dispatch_ready();
            }
            Msg::Started {
                dispatch_id,
                attempt,
                result,
            } => self.started(dispatch_id, attempt, result),
            Msg::Settled { dispatch_id, attempt } => {
                if self.leases.get(&dispatch_id).is_some_and(|l| l.attempt == attempt) {
                    self.release(&dispatch_id);
                    self.dispatch_ready();
                }
            }
            Msg::CancelSteps { steps, reason } => self.cancel_steps(steps, &reason),
            Msg::Reconcile(steps) => self.reconcile(steps),
            Msg::Unlock(dispatch_id) => {
                self.unlock(&dispatch_id);
                self.dispatch_ready();
            }
            Msg::LockWaits(reply) => {
                let mut waits: HashMap<String, u32> = HashMap::new();
                for index in 0..self.queue.len() {
                    for lock in crate::resources::locks(&self.queue.get(index).step.resources) {
                        if self.locked.contains_key(lock) {
                            *waits.entry(lock.clone()).or_default() += 1;
                        }
                    }
                }
                let _ = reply.send(waits);
            }
            Msg::LimitWaits(reply) => {
                let _ = reply.send(self.limit_waits());
            }
            Msg::ShareQueues(reply) => {
                let mut queued: HashMap<Option<String>, u32> = HashMap::new();
                for call in self.queue.iter() {
                    *queued.entry(call.step.share.clone()).or_default() += 1;
                }
                let _ = reply.send(queued);
            }
            Msg::Reserve {
                run_id,
                turn,
                calls,
                reply,
            } => {
                let reservations = self.reserve_for_turn(&run_id, turn, calls);
                if let Err(unused) = reply.send(reservations) {
                    // The turn went away before it was written: nothing will start on these slots.
                    for reservation in unused.into_iter().flatten() {
                        self.release(&reservation.start.dispatch_id);
                    }
                    self.dispatch_ready();
                }
            }
            Msg::Sent {
                dispatch_id,
                attempt,
                timeout,
            } => self.sent(dispatch_id, attempt, timeout),
            Msg::Reserved(outcome, written) => {
                for (start, step) in outcome {
                    if written == Written::Unknown {
                        self.unsure(start.dispatch_id);
                        continue;
                    }
                    if self.delivered.remove(&start.dispatch_id) {
                        if step.is_none() {
                            // Sent, and then its start did not commit: the call is recorded nowhere.
                            self.cancel_lease(&start.dispatch_id, "its start could not be recorded");
                        }
                        continue;
                    }
                    match step {
                        // Recorded without its start: the reservation goes, and the call is
                        // queued as any other (its commit's effect found the reservation holding it).
                        Some(step) if step.status == StepStatus::Pending => {
                            self.release(&start.dispatch_id);
                            self.enqueue(step);
                        }
                        Some(step) => self.started(start.dispatch_id, start.attempt, Ok(Some(step))),
                        None => {
                            self.release(&start.dispatch_id);
                        }
                    }
                }
                self.dispatch_ready();
            }
            Msg::Resolved {
                dispatch_id,
                attempt,
                step,
            } => self.resolved(dispatch_id, attempt, step),
            Msg::Gauges(reply) => {
                let _ = reply.send(SchedulerGauges {
                    sessions: self.sessions.len(),
                    queued: self.queue.len(),
                    leased: self.leases.len(),
                    scans: self.scans,
                    lost_found: self.lost_found,
                });
            }
            Msg::Snapshot(reply) => {
                let mut workers = self.local_workers();
                for (_, offers) in &self.remote {
                    workers.extend(offers.workers.iter().cloned());
                }
                workers.sort_by(|a, b| a.name.cmp(&b.name).then(a.session_id.cmp(&b.session_id)));
                let _ = reply.send(workers);
            }
        }
    }

    fn join(
        &mut self,
        hello: SessionHello,
        outbound: mpsc::UnboundedSender<Outbound>,
    ) -> Result<SessionId, KernelError> {
        for tool in &hello.tools {
            for (id, session) in &self.sessions {
                if let Some(theirs) = session.tools.get(&tool.name)
                    && *theirs != tool.fingerprint
                {
                    return Err(KernelError::AlreadyExists(format!(
                        "tool '{}' is already offered by worker {} (session {id}) with fingerprint {theirs}; \
                         this worker announces fingerprint {}. Workers may offer the same tool only with the same \
                         name, description, schema and version",
                        tool.name, session.name, tool.fingerprint
                    )));
                }
            }
        }
        for agent in &hello.agents {
            for (id, session) in &self.sessions {
                if let Some((theirs, _)) = session.agents.get(&agent.name)
                    && *theirs != agent.fingerprint
                {
                    return Err(KernelError::AlreadyExists(format!(
                        "agent '{}' is already hosted by worker {} (session {id}) with fingerprint {theirs}; this \
                         worker announces fingerprint {}. Workers may host the same agent only with the same name, \
                         description, input schema and version",
                        agent.name, session.name, agent.fingerprint
                    )));
                }
            }
        }
        self.check_remote_conflicts(&hello)?;
        self.throttle.declare(&hello.tools);
        let session_id = SessionId::new();
        let now = self.store.clock().now_millis();
        info!(
            %session_id,
            worker = hello.name,
            tools = hello.tools.len(),
            agents = hello.agents.len(),
            slots = hello.max_concurrency,
            "worker joined"
        );
        self.sessions.insert(
            session_id.clone(),
            Session {
                name: hello.name,
                tools: hello.tools.into_iter().map(|t| (t.name, t.fingerprint)).collect(),
                agents: hello
                    .agents
                    .into_iter()
                    .map(|a| (a.name, (a.fingerprint, a.max_concurrency)))
                    .collect(),
                hosting: HashMap::new(),
                ready: false,
                max_concurrency: hello.max_concurrency,
                in_use: 0,
                draining: false,
                outbound,
                connected_at: now,
                last_heartbeat: self.store.clock().instant(),
                last_heartbeat_at: now,
            },
        );
        Ok(session_id)
    }

    /// Refuses a tool or agent whose fingerprint differs from the one another live replica's
    /// sessions offer (as its last heartbeat listed them).
    fn check_remote_conflicts(&self, hello: &SessionHello) -> Result<(), KernelError> {
        for (replica, offers) in &self.remote {
            for tool in &hello.tools {
                if let Some(theirs) = offers.tools.get(&tool.name)
                    && *theirs != tool.fingerprint
                {
                    return Err(KernelError::AlreadyExists(format!(
                        "tool '{}' is already offered through kernel replica {replica} with fingerprint {theirs}; \
                         this worker announces fingerprint {}. Workers may offer the same tool only with the same \
                         name, description, schema and version",
                        tool.name, tool.fingerprint
                    )));
                }
            }
            for agent in &hello.agents {
                if let Some(theirs) = offers.agents.get(&agent.name)
                    && *theirs != agent.fingerprint
                {
                    return Err(KernelError::AlreadyExists(format!(
                        "agent '{}' is already hosted through kernel replica {replica} with fingerprint {theirs}; \
                         this worker announces fingerprint {}. Workers may host the same agent only with the same \
                         name, description, input schema and version",
                        agent.name, agent.fingerprint
                    )));
                }
            }
        }
        Ok(())
    }

    /// The registered sessions here, as `workers list` shows them.
    fn local_workers(&self) -> Vec<WorkerSnapshot> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.ready)
            .map(|(id, s)| {
                let mut tools: Vec<String> = s.tools.keys().cloned().collect();
                tools.sort();
                let mut agents: Vec<String> = s.agents.keys().cloned().collect();
                agents.sort();
                WorkerSnapshot {
                    session_id: id.clone(),
                    name: s.name.clone(),
                    tools,
                    agents,
                    max_concurrency: s.max_concurrency,
                    slots_in_use: s.in_use,
                    draining: s.draining,
                    connected_at: s.connected_at,
                    last_heartbeat_at: s.last_heartbeat_at,
                    replica: self.store.replica().to_owned(),
                }
            })
            .collect()
    }

    /// What the sessions here offer, with fingerprints, and the sessions themselves.
    fn local_offers(&self) -> Offers {
        let mut offers = Offers {
            workers: self.local_workers(),
            ..Offers::default()
        };
        for session in self.sessions.values() {
            for (name, fingerprint) in &session.tools {
                offers.tools.insert(name.clone(), fingerprint.clone());
            }
            for (name, (fingerprint, _)) in &session.agents {
                offers.agents.insert(name.clone(), fingerprint.clone());
            }
        }
        offers
    }

    /// Whether a session here offers `name` (a tool, or an agent for a run's dispatch).
    fn offered_here(&self, kind: StepKind, name: &str) -> bool {
        self.sessions.values().any(|s| s.offers(kind, name))
    }

    /// Whether another live replica's sessions offer `name`.
    fn offered_elsewhere(&self, kind: StepKind, name: &str) -> bool {
        self.remote.iter().any(|(_, offers)| match kind {
            StepKind::Agent => offers.agents.contains_key(name),
            _ => offers.tools.contains_key(name),
        })
    }

    /// Reads waiting steps of `tools` and `agents` that sessions here offer, at most as many as
    /// they have free slots beside the calls queued here that they could run, and queues them.
    /// Another replica may claim the same step; the store starts it once (its start is fenced on
    /// the attempt), and the loser gives the slot back.
    fn claim(&mut self, tools: Vec<String>, agents: Vec<String>) {
        let free: usize = self
            .sessions
            .values()
            .filter(|s| !s.draining)
            .map(|s| s.max_concurrency.saturating_sub(s.in_use) as usize)
            .sum();
        let tools: Vec<String> = tools
            .into_iter()
            .filter(|t| self.offered_here(StepKind::Tool, t))
            .collect();
        let agents: Vec<String> = agents
            .into_iter()
            .filter(|a| self.offered_here(StepKind::Agent, a))
            .collect();
        if self.stopping || (tools.is_empty() && agents.is_empty()) {
            return;
        }
        if self.claiming {
            self.deferred.0.extend(tools);
            self.deferred.1.extend(agents);
            return;
        }
        // Queued calls no session here offers (another replica's, or no one's yet) hold no slot.
        let runnable = self
            .queue
            .iter()
            .filter(|queued| self.offered_here(queued.step.kind, &queued.step.tool))
            .take(free)
            .count();
        let limit = free - runnable;
        if limit == 0 {
            self.wanting.0.extend(tools);
            self.wanting.1.extend(agents);
            return;
        }
        for tool in &tools {
            self.wanting.0.remove(tool);
        }
        for agent in &agents {
            self.wanting.1.remove(agent);
        }
        self.claiming = true;
        let store = self.store.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            let steps = store
                .claim_pending(tools.clone(), agents.clone(), limit)
                .await
                .unwrap_or_else(|error| {
                    warn!(%error, "cannot read calls to claim; the scan claims them");
                    Vec::new()
                });
            let names = (tools.into_iter().collect(), agents.into_iter().collect());
            let _ = me.send(Msg::Claimed { steps, names, limit });
        });
    }

    /// Claims again what the store may still hold for sessions here, once a slot is free and
    /// nothing queued here takes it.
    fn claim_wanting(&mut self) {
        if self.claiming || (self.wanting.0.is_empty() && self.wanting.1.is_empty()) {
            return;
        }
        let (tools, agents) = std::mem::take(&mut self.wanting);
        self.claim(tools.into_iter().collect(), agents.into_iter().collect());
    }

    /// Cancels the leases here whose steps another replica settled or took (a run cancelled there,
    /// or this replica's leases taken over as dead): the store no longer lists their dispatch.
    fn check_remote_runs(&mut self, runs: Vec<RunId>) {
        let runs: Vec<RunId> = runs
            .into_iter()
            .filter(|run| self.leases.values().any(|l| &l.run_id == run))
            .collect();
        if runs.is_empty() {
            return;
        }
        let store = self.store.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            let mut steps = Vec::new();
            for run in runs {
                match store.reads.steps(run).await {
                    Ok(found) => steps.extend(found),
                    Err(error) => warn!(%error, "cannot read a run another replica wrote"),
                }
            }
            let _ = me.send(Msg::CancelSteps {
                steps,
                reason: "settled on another kernel replica".into(),
            });
        });
    }

    fn leave(&mut self, session_id: &SessionId, reason: &str) {
        let Some(session) = self.sessions.remove(session_id) else {
            return;
        };
        info!(%session_id, worker = session.name, reason, "worker left");
        let lost: Vec<DispatchId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.session_id == *session_id)
            .map(|(id, _)| id.clone())
            .collect();
        for dispatch_id in lost {
            let lease = self.forget(&dispatch_id).expect("listed above");
            // A lease still `Starting` is lost when its start commit comes back and finds no lease.
            if !matches!(lease.state, LeaseState::Starting) {
                self.lose(dispatch_id, lease.attempt, format!("worker {} {reason}", session.name));
            }
        }
        self.dispatch_ready();
    }

    /// Records the loss in the store (whose commit requeues what may run again).
    fn lose(&self, dispatch_id: DispatchId, attempt: u32, reason: String) {
        let store = self.store.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            match store
                .lose_lease(LeaseLoss {
                    dispatch_id: dispatch_id.clone(),
                    attempt,
                    reason: reason.clone(),
                })
                .await
            {
                // Queued again by the commit's effect.
                Ok(LossOutcome::Requeued(step)) => {
                    info!(run_id = %step.run_id, step = %step.key, tool = step.tool, %dispatch_id, reason, "lease lost, redispatching");
                }
                Ok(LossOutcome::Indeterminate(step)) => {
                    warn!(run_id = %step.run_id, step = %step.key, tool = step.tool, %dispatch_id, reason, "lease lost, at_most_once call is indeterminate");
                }
                Ok(LossOutcome::NotHeld) => debug!(%dispatch_id, "lost lease no longer held its step"),
                Err(error) => warn!(%dispatch_id, %error, "cannot record a lost lease; boot recovery will"),
            }
            let _ = me.send(Msg::Unlock(dispatch_id));
        });
    }

    /// Expires approvals past their deadline; the deadlines live in the store. A read finds
    /// whether any is due first: the writer hears of it only then, so a kernel with nothing to do
    /// commits nothing (and its writer goes quiet long enough to give back SQLite's page caches).
    fn expire_approvals(&mut self) {
        if self.expiring.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let store = self.store.clone();
        let expiring = self.expiring.clone();
        tokio::spawn(async move {
            let expired = match store.reads.approvals_due(store.clock().now_millis()).await {
                Ok(false) => Ok(Default::default()),
                Ok(true) => store.expire_approvals().await,
                Err(error) => Err(error),
            };
            match expired {
                Ok(answered) if !answered.approvals.is_empty() => {
                    info!(expired = answered.approvals.len(), "approvals expired unanswered")
                }
                Ok(_) => {}
                Err(error) => warn!(%error, "cannot expire approvals"),
            }
            expiring.store(false, std::sync::atomic::Ordering::Release);
        });
    }

    /// The safety net under every in-memory path: reads what the store says is in flight.
    fn scan(&self) {
        let store = self.store.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            match store.reads.in_flight_steps().await {
                Ok(steps) => {
                    let _ = me.send(Msg::Reconcile(steps));
                }
                Err(error) => warn!(%error, "in-flight scan failed"),
            }
        });
    }

    /// Offers again a pending step nobody queued, and records the loss of a running step whose
    /// dispatch no lease here holds (its loss could not be written when it happened).
    fn reconcile(&mut self, steps: Vec<StepRecord>) {
        let mut found = 0;
        let seen_before = std::mem::take(&mut self.unqueued);
        for step in steps {
            match step.status {
                StepStatus::Pending => {
                    let id = (step.run_id.clone(), step.key.clone());
                    if !self.would_enqueue(&step) || self.queue.contains(&id.0, &id.1) {
                        continue;
                    }
                    if !seen_before.contains(&id) {
                        self.unqueued.insert(id);
                        continue;
                    }
                    self.queue.push(step, self.store.clock());
                    // Among replicas a waiting call nobody here queued is another's to claim, or
                    // this one's to claim now: not a call this scheduler lost.
                    if !self.config.replicated {
                        found += 1;
                    }
                }
                StepStatus::Running => {
                    let held = step.dispatch_id.as_ref().is_some_and(|id| self.leases.contains_key(id));
                    // Another live replica's lease is its own; a dead one's is taken over by the
                    // cluster's heartbeat, once its row is old enough.
                    let mine = !self.config.replicated || step.replica.as_deref() == Some(self.store.replica());
                    if !held
                        && mine
                        && let Some(dispatch_id) = step.dispatch_id.clone()
                    {
                        found += 1;
                        self.lose(
                            dispatch_id,
                            step.attempts,
                            "no lease held it (found by the in-flight scan)".into(),
                        );
                    }
                }
                _ => {}
            }
        }
        self.scans += 1;
        if found > 0 {
            self.lost_found += found as u64;
            warn!(found, "in-flight scan found calls the scheduler had lost track of");
            self.dispatch_ready();
        }
    }

    /// Queues a pending step unless a lease holds it already. A lease being cancelled (its
    /// attempt timed out, the worker has not answered) keeps its slot but no longer holds the
    /// step: the retry goes out at its time, whatever the old attempt's worker does.
    fn enqueue(&mut self, step: StepRecord) {
        if self.would_enqueue(&step) {
            self.queue.push(step, self.store.clock());
        }
    }

    /// Queues a step a commit just left waiting for a worker. The commit is the truth: an attempt
    /// of it this scheduler still holds a lease on has ended in the record (its worker's answer
    /// or loss is what the commit recorded), and its slot is given back when that answer's
    /// handling reaches here; only a lease on a later attempt, already starting, holds it.
    fn enqueue_committed(&mut self, step: StepRecord) {
        let later = self
            .leases
            .values()
            .any(|l| l.run_id == step.run_id && l.key == step.key && l.attempt > step.attempts);
        if !later && !self.theirs(&step) {
            self.queue.push(step, self.store.clock());
        }
    }

    /// Whether [`Self::enqueue`] queues `step`: no lease holds it, and it is not only another
    /// replica's to claim.
    fn would_enqueue(&self, step: &StepRecord) -> bool {
        let held = self.leases.values().any(|l| {
            l.run_id == step.run_id
                && l.key == step.key
                && (l.attempt > step.attempts || !matches!(l.state, LeaseState::Cancelling { .. }))
        });
        !held && !self.theirs(step)
    }

    /// Another replica's sessions offer `step` and none here does: it is theirs to claim (their
    /// replica was told by the commit's notice, and their scan finds it too).
    fn theirs(&self, step: &StepRecord) -> bool {
        self.config.replicated
            && !self.offered_here(step.kind, &step.tool)
            && self.offered_elsewhere(step.kind, &step.tool)
    }

    /// Picks the least loaded session that can take `name` (a tool, or an agent for a run's
    /// dispatch), rotating between equals.
    /// Sends the question to the least loaded session offering `tool` (a question takes no slot).
    fn ask_approval(&mut self, tool: String, arguments_json: String, reply: oneshot::Sender<Result<bool, String>>) {
        let asked = self
            .sessions
            .values()
            .filter(|s| !s.draining && s.offers(StepKind::Tool, &tool))
            .min_by(|a, b| {
                (a.in_use as f64 / a.max_concurrency as f64).total_cmp(&(b.in_use as f64 / b.max_concurrency as f64))
            });
        let Some(session) = asked else {
            let _ = reply.send(Err(format!("no worker offering '{tool}' is connected to this kernel")));
            return;
        };
        // A send that fails drops `reply`: the asker hears the session ended.
        let _ = session.outbound.send(Outbound::AskApproval {
            tool,
            arguments_json,
            reply,
        });
    }

    fn pick(&mut self, kind: StepKind, name: &str) -> Option<SessionId> {
        let mut candidates: Vec<(&SessionId, &Session)> =
            self.sessions.iter().filter(|(_, s)| s.can_take(kind, name)).collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_by(|a, b| a.0.cmp(b.0));
        let load = |s: &Session| s.in_use as f64 / s.max_concurrency as f64;
        let best = candidates.iter().map(|(_, s)| load(s)).fold(f64::INFINITY, f64::min);
        let equals: Vec<&SessionId> = candidates
            .iter()
            .filter(|(_, s)| load(s) <= best + f64::EPSILON)
            .map(|(id, _)| *id)
            .collect();
        self.turn = self.turn.wrapping_add(1);
        Some(equals[self.turn % equals.len()].clone())
    }

    fn dispatch_ready(&mut self) {
        if self.stopping {
            return;
        }
        let now = self.store.clock().instant();
        let now_ms = self.store.clock().now_millis();
        self.read_policy();
        // Under load the queue is long and every session full: stop as soon as no slot is left, and
        // pick at most once per tool that found no session, or each event would cost a pick per
        // queued call (found by the load test: 10,000 queued calls took minutes).
        // Tools and agents that found no session, apart: an agent may share a tool's name.
        let mut no_session: [std::collections::HashSet<String>; 2] = Default::default();
        let slot = |kind: StepKind| usize::from(kind == StepKind::Agent);
        // Instances a call earlier in the queue waits for: a later call may not take them first,
        // so the calls on one instance start in queue order.
        let mut wanted: std::collections::HashSet<String> = Default::default();
        let mut index = 0;
        while index < self.queue.len() {
            if !self
                .sessions
                .values()
                .any(|s| !s.draining && s.in_use < s.max_concurrency)
            {
                break;
            }
            let queued = self.queue.get(index);
            let kind = queued.step.kind;
            if !queued.ready(now)
                || no_session[slot(kind)].contains(&queued.step.tool)
                || self.turn_full(&queued.step)
                || self.waits_for_lock(&queued.step, &mut wanted)
            {
                index += 1;
                continue;
            }
            let name = queued.step.tool.clone();
            let limits = match kind {
                StepKind::Agent => None,
                _ => self.throttle.limits(&name),
            };
            if let Some(limits) = &limits
                && !self.throttle.has_room(limits, (now, now_ms))
            {
                self.queue.get_mut(index).waiting.get_or_insert(now);
                index += 1;
                continue;
            }
            match self.pick(kind, &name) {
                Some(session_id) => {
                    let queued = self.queue.remove(index);
                    let limited = limits.map(|limits| (limits, queued.waiting));
                    self.reserve(session_id, queued.step, limited);
                }
                None => {
                    no_session[slot(kind)].insert(name);
                    index += 1;
                }
            }
        }
        self.claim_wanting();
    }

    /// Reads the policy in force (once per pass over the queue): its tool limits, and the fair
    /// shares that tag the calls queued from now on.
    fn read_policy(&mut self) {
        if let Some(policy) = self.throttle.refresh() {
            self.queue.set_shares(policy.fair_shares());
        }
    }

    /// Takes a slot of `session_id` for attempt `attempt` of a call, as a lease still `Starting`.
    fn take_slot(
        &mut self,
        session_id: SessionId,
        (run_id, key, turn, agent): (&RunId, &StepKey, u32, Option<&str>),
        attempt: u32,
        locks: Vec<String>,
    ) -> StartDispatch {
        let session = self.sessions.get_mut(&session_id).expect("picked session exists");
        session.in_use += 1;
        if let Some(agent) = agent {
            *session.hosting.entry(agent.to_owned()).or_default() += 1;
        }
        let start = StartDispatch {
            run_id: run_id.clone(),
            key: key.clone(),
            dispatch_id: DispatchId::in_shard_of(run_id),
            attempt,
            worker: session.name.clone(),
            session_id: session_id.clone(),
            lease_expires_at: self.store.clock().now_millis() + self.config.lease_ttl.as_millis() as Millis,
            replica: Some(self.store.replica().to_owned()),
            limits: Vec::new(),
            limit_wait_ms: 0,
        };
        for lock in locks {
            self.locked.insert(lock, start.dispatch_id.clone());
        }
        self.leases.insert(
            start.dispatch_id.clone(),
            Lease {
                session_id,
                run_id: run_id.clone(),
                key: key.clone(),
                attempt,
                state: LeaseState::Starting,
                agent: agent.map(str::to_owned),
                turn,
                limited: None,
            },
        );
        start
    }

    /// Starts a queued call on `session_id`: records its `tool:start`, then sends it. A call under
    /// tool limits names them, and since when it waited for them.
    fn reserve(
        &mut self,
        session_id: SessionId,
        step: StepRecord,
        limited: Option<(std::sync::Arc<[crate::machine::throttle::ToolLimit]>, Option<Instant>)>,
    ) {
        let agent = (step.kind == StepKind::Agent).then_some(step.tool.as_str());
        let mut start = self.take_slot(
            session_id,
            (&step.run_id, &step.key, step.turn, agent),
            step.attempts + 1,
            locks_of(&step),
        );
        if let Some((limits, waiting)) = limited {
            let now = self.store.clock();
            self.throttle.take(&limits, now.now_millis());
            start.limit_wait_ms = waiting.map_or(0, |since| {
                now.instant().saturating_duration_since(since).as_millis() as u64
            });
            start.limits = limits.to_vec();
            let names = limits.iter().map(|limit| limit.tools.clone()).collect();
            if let Some(lease) = self.leases.get_mut(&start.dispatch_id) {
                lease.limited = Some(Box::new(Limited {
                    names,
                    step: Some(step.clone()),
                    waiting,
                }));
            }
        }
        let (dispatch_id, attempt) = (start.dispatch_id.clone(), start.attempt);
        // Queued to the writer here, in dispatch order, so starts commit in the order given.
        let starting = self.store.start_dispatch(start);
        let me = self.me.clone();
        tokio::spawn(async move {
            let result = starting.await;
            let _ = me.send(Msg::Started {
                dispatch_id,
                attempt,
                result,
            });
        });
    }

    /// Slots for the new calls of a turn, taken only while nothing waits in the queue.
    fn reserve_for_turn(
        &mut self,
        run_id: &RunId,
        (turn, limit): (u32, Option<u32>),
        calls: Vec<ReserveCall>,
    ) -> Vec<Option<Reservation>> {
        if self.stopping {
            return calls.iter().map(|_| None).collect();
        }
        self.read_policy();
        let now = (self.store.clock().instant(), self.store.clock().now_millis());
        let mut taken = 0;
        calls
            .into_iter()
            .map(|call| {
                // A call under tool limits with no room now starts from the queue, where its wait
                // is counted; with room, in the turn's write, which passes the limits in the store.
                // Among replicas it starts from the queue: a turn's write would wait there for
                // another replica's lock on the limit's bucket, and hold up the whole turn.
                let limits = self.throttle.limits(&call.tool);
                if !self.queue.is_empty()
                    || limit.is_some_and(|n| taken >= n)
                    || call.locks.iter().any(|lock| self.locked.contains_key(lock))
                    || limits
                        .as_ref()
                        .is_some_and(|limits| self.config.replicated || !self.throttle.has_room(limits, now))
                {
                    return None;
                }
                let session_id = self.pick(StepKind::Tool, &call.tool)?;
                taken += 1;
                let outbound = self.sessions[&session_id].outbound.clone();
                // A new call's first attempt.
                let mut start = self.take_slot(session_id, (run_id, &call.key, turn, None), 1, call.locks);
                if let Some(limits) = limits {
                    self.throttle.take(&limits, now.1);
                    start.limits = limits.to_vec();
                    if let Some(lease) = self.leases.get_mut(&start.dispatch_id) {
                        lease.limited = Some(Box::new(Limited {
                            names: limits.iter().map(|limit| limit.tools.clone()).collect(),
                            step: None,
                            waiting: None,
                        }));
                    }
                }
                Some(Reservation::new(start, outbound))
            })
            .collect()
    }

    /// Whether `step` needs a resource instance that a running call holds or an earlier queued
    /// call waits for; if so, its instances join `wanted`.
    fn waits_for_lock(&self, step: &StepRecord, wanted: &mut std::collections::HashSet<String>) -> bool {
        let mut locks = crate::resources::locks(&step.resources).peekable();
        if locks.peek().is_none() {
            return false;
        }
        let locks: Vec<&String> = locks.collect();
        let waits = locks
            .iter()
            .any(|lock| self.locked.contains_key(*lock) || wanted.contains(*lock));
        if waits {
            wanted.extend(locks.into_iter().cloned());
        }
        waits
    }

    /// Frees the resource instances `dispatch_id` held.
    fn unlock(&mut self, dispatch_id: &DispatchId) {
        if !self.locked.is_empty() {
            self.locked.retain(|_, holder| holder != dispatch_id);
        }
    }

    /// Whether `step`'s turn already runs as many calls as its bound allows.
    fn turn_full(&self, step: &StepRecord) -> bool {
        let Some(limit) = step.max_concurrency else {
            return false;
        };
        let running = self
            .leases
            .values()
            .filter(|l| {
                // A hosted run's own dispatch has turn 0 too, but it is the handler, not a call.
                l.agent.is_none()
                    && l.run_id == step.run_id
                    && l.turn == step.turn
                    && !matches!(l.state, LeaseState::Cancelling { .. })
            })
            .count();
        running >= limit as usize
    }

    fn started(&mut self, dispatch_id: DispatchId, attempt: u32, result: Result<Option<StepRecord>, KernelError>) {
        match result {
            Ok(Some(step)) => {
                let live = self
                    .leases
                    .get_mut(&dispatch_id)
                    .and_then(|lease| self.sessions.get(&lease.session_id).map(|s| (lease, s)));
                match live {
                    Some((lease, session)) => {
                        // Running before sending: if the session is already gone, its Leave finds a
                        // running lease and records the loss.
                        lease.state = LeaseState::Running {
                            deadline: self.store.clock().instant() + lease_timeout(&step),
                        };
                        let order = DispatchOrder {
                            dispatch_id: dispatch_id.clone(),
                            attempt,
                            step,
                        };
                        let _ = session.outbound.send(Outbound::Dispatch(Box::new(order)));
                    }
                    None => {
                        // The session ended while tool:start was being written.
                        self.forget(&dispatch_id);
                        self.lose(
                            dispatch_id,
                            attempt,
                            "worker session ended before the dispatch was delivered".into(),
                        );
                    }
                }
            }
            Ok(None) => {
                // The step was settled meanwhile (run cancelled): nothing to run.
                self.release(&dispatch_id);
                self.dispatch_ready();
            }
            Err(KernelError::Unavailable(error)) => {
                warn!(%dispatch_id, %error, "tool:start may not have been recorded; asking the store");
                self.unsure(dispatch_id);
            }
            Err(KernelError::LimitExceeded { field, message })
                if self.leases.get(&dispatch_id).is_some_and(|l| l.limited.is_some()) =>
            {
                // The store counts calls this replica does not (another replica's, or those that
                // ran before a restart): the call waits in the queue again.
                debug!(%dispatch_id, limit = field, message, "a tool limit refused a start; the call waits");
                if let Some(limited) = self.release(&dispatch_id).and_then(|lease| lease.limited) {
                    let now = (self.store.clock().instant(), self.store.clock().now_millis());
                    self.throttle.refused(&limited.names, now);
                    if let Some(step) = limited.step
                        && self.would_enqueue(&step)
                        && let Some(queued) = self.queue.push(step, self.store.clock())
                    {
                        queued.waiting = Some(limited.waiting.unwrap_or(now.0));
                    }
                }
                self.dispatch_ready();
            }
            Err(KernelError::LimitExceeded { field, message })
                if field == crate::machine::command::spend::WAITS_FOR_TIME =>
            {
                // Its budget's time is held by the run's running calls; one of them ends soon.
                debug!(%dispatch_id, message, "a budget's time refused a start; the call waits");
                self.try_again_later(&dispatch_id);
            }
            Err(error) => {
                warn!(%dispatch_id, %error, "cannot record tool:start; the call waits for the next try");
                self.try_again_later(&dispatch_id);
            }
        }
    }

    /// Frees the slot of `dispatch_id`, whose start was refused, and queues its step again after
    /// a pause if it is still pending then.
    fn try_again_later(&mut self, dispatch_id: &DispatchId) {
        let Some(lease) = self.leases.get(dispatch_id) else {
            return;
        };
        let (run, key) = (lease.run_id.clone(), lease.key.clone());
        self.release(dispatch_id);
        let store = self.store.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Ok(steps) = store.reads.steps(run).await
                && let Some(step) = steps
                    .into_iter()
                    .find(|s| s.key == key && s.status == StepStatus::Pending)
            {
                let _ = me.send(Msg::Enqueue(step));
            }
        });
    }

    /// A start whose commit's outcome is unknown (the connection dropped as it committed): its slot
    /// stays held while the store is asked, again until it answers (for at most
    /// [`UNSURE_FOR`]). Releasing it at once would leave a start that did commit to the scan,
    /// which would record its lease lost: a `safe_to_retry` call run again beside the attempt its
    /// worker may hold, an `at_most_once` call made indeterminate though it never ran.
    fn unsure(&mut self, dispatch_id: DispatchId) {
        let Some(lease) = self.leases.get(&dispatch_id) else {
            return;
        };
        let (run, key, attempt) = (lease.run_id.clone(), lease.key.clone(), lease.attempt);
        let store = self.store.clone();
        let me = self.me.clone();
        tokio::spawn(async move {
            let until = Instant::now() + UNSURE_FOR;
            let mut backoff = Duration::from_millis(100);
            let step = loop {
                match store.reads.steps_at(run.clone(), vec![key.clone()]).await {
                    Ok(steps) => break steps.into_iter().next(),
                    Err(error) if Instant::now() < until => {
                        debug!(%error, "store unreachable; asking again whether a start committed");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                    Err(error) => {
                        warn!(%error, "cannot learn whether a start committed; the scan settles it");
                        break None;
                    }
                }
            };
            let _ = me.send(Msg::Resolved {
                dispatch_id,
                attempt,
                step,
            });
        });
    }

    /// The store's answer for a start whose commit's outcome was unknown: a start that committed
    /// goes on as if its write had answered (sent now, or kept running where it was sent early);
    /// one that did not gives its slot back (cancelled where it was sent early) and its call, if
    /// waiting, is queued.
    fn resolved(&mut self, dispatch_id: DispatchId, attempt: u32, step: Option<StepRecord>) {
        let committed = step.as_ref().is_some_and(|s| {
            s.status == StepStatus::Running && s.dispatch_id.as_ref() == Some(&dispatch_id) && s.attempts == attempt
        });
        let sent = self.delivered.remove(&dispatch_id);
        if committed {
            if !sent {
                self.started(dispatch_id, attempt, Ok(step));
            }
            return;
        }
        if sent {
            self.cancel_lease(&dispatch_id, "its start could not be recorded");
        } else {
            self.release(&dispatch_id);
        }
        if let Some(step) = step.filter(|s| s.status == StepStatus::Pending) {
            self.enqueue(step);
        }
        self.dispatch_ready();
    }

    /// A reserved call went to its worker before its start committed: its lease runs from now. A
    /// lease already gone (its session left while it was `Starting`) is lost when its turn's write
    /// comes back, as one that was never sent.
    fn sent(&mut self, dispatch_id: DispatchId, attempt: u32, timeout: Duration) {
        let Some(lease) = self.leases.get_mut(&dispatch_id).filter(|l| l.attempt == attempt) else {
            return;
        };
        if matches!(lease.state, LeaseState::Starting) {
            lease.state = LeaseState::Running {
                deadline: self.store.clock().instant() + timeout,
            };
        }
        self.delivered.insert(dispatch_id);
    }

    /// Tells the worker holding `dispatch_id` to stop; its slot stays taken until it answers or
    /// the grace ends.
    fn cancel_lease(&mut self, dispatch_id: &DispatchId, reason: &str) {
        let until = self.store.clock().instant() + self.config.cancel_grace;
        let Some(lease) = self.leases.get_mut(dispatch_id) else {
            return;
        };
        if let Some(session) = self.sessions.get(&lease.session_id) {
            let _ = session.outbound.send(Outbound::Cancel {
                dispatch_id: dispatch_id.to_owned(),
                attempt: lease.attempt,
                reason: reason.to_owned(),
            });
        }
        lease.state = LeaseState::Cancelling { until };
    }

    /// Drops a lease, and its count under the tool limits it passed.
    fn forget(&mut self, dispatch_id: &DispatchId) -> Option<Lease> {
        let lease = self.leases.remove(dispatch_id)?;
        if let Some(limited) = &lease.limited {
            self.throttle.give_back(&limited.names);
        }
        Some(lease)
    }

    /// Gives a lease's slot, resource instances and tool limits' count back; returns the lease.
    fn release(&mut self, dispatch_id: &DispatchId) -> Option<Lease> {
        self.unlock(dispatch_id);
        let lease = self.forget(dispatch_id)?;
        if let Some(session) = self.sessions.get_mut(&lease.session_id) {
            session.in_use = session.in_use.saturating_sub(1);
            if let Some(hosting) = lease.agent.as_ref().and_then(|agent| session.hosting.get_mut(agent)) {
                *hosting = hosting.saturating_sub(1);
            }
        }
        Some(lease)
    }

    fn cancel_steps(&mut self, steps: Vec<StepRecord>, reason: &str) {
        for step in steps {
            match step.status {
                // Read from another replica's write and still running on a lease here: it stays.
                StepStatus::Running
                    if step
                        .dispatch_id
                        .as_ref()
                        .and_then(|id| self.leases.get(id))
                        .is_some_and(|l| l.attempt == step.attempts) => {}
                // Waiting again: the lease here was lost (taken over as dead); the step may be queued.
                // A read taken before this replica's own start committed shows the step waiting
                // too: only leases on attempts the read has seen are lost (found by the burst
                // test: a call cancelled on its way to the worker, its error recorded as the result).
                StepStatus::Pending | StepStatus::Running => self.cancel_leases_through(&step, step.attempts, reason),
                _ => {
                    self.queue
                        .retain(|q| !(q.step.run_id == step.run_id && q.step.key == step.key));
                    self.cancel_leases_of(&step, reason);
                }
            }
        }
    }

    /// Tells the workers holding dispatches of `step` to stop; their slots stay taken until they
    /// answer or the grace ends.
    fn cancel_leases_of(&mut self, step: &StepRecord, reason: &str) {
        self.cancel_leases_through(step, u32::MAX, reason);
    }

    /// Cancels the leases of `step` on attempts up to `attempt`; a lease on a later attempt
    /// started after what the caller read.
    fn cancel_leases_through(&mut self, step: &StepRecord, attempt: u32, reason: &str) {
        let cancelled: Vec<DispatchId> = self
            .leases
            .iter()
            .filter(|(_, lease)| {
                lease.run_id == step.run_id
                    && lease.key == step.key
                    && lease.attempt <= attempt
                    && !matches!(lease.state, LeaseState::Cancelling { .. })
            })
            .map(|(dispatch_id, _)| dispatch_id.clone())
            .collect();
        for dispatch_id in cancelled {
            self.cancel_lease(&dispatch_id, reason);
        }
    }

    /// How many queued calls wait for each tool limit: those whose wait began and that the limit
    /// still holds back.
    fn limit_waits(&mut self) -> HashMap<String, u32> {
        let mut waits: HashMap<String, u32> = HashMap::new();
        let waiting: Vec<String> = self
            .queue
            .iter()
            .filter(|queued| queued.waiting.is_some())
            .map(|queued| queued.step.tool.clone())
            .collect();
        if waiting.is_empty() {
            return waits;
        }
        self.read_policy();
        let now = (self.store.clock().instant(), self.store.clock().now_millis());
        for tool in waiting {
            let Some(limits) = self.throttle.limits(&tool) else {
                continue;
            };
            for limit in limits.iter() {
                if !self.throttle.has_room(std::slice::from_ref(limit), now) {
                    *waits.entry(limit.tools.clone()).or_default() += 1;
                }
            }
        }
        waits
    }

    /// Takes from the queue the calls a tool limit has held back longer than `limit` and still
    /// holds: a call waits no longer for a limit than for a worker. Each comes with why it fails.
    fn held_too_long(&mut self, now: Instant, limit: Duration) -> Vec<(StepRecord, String, crate::model::Outcome)> {
        let overdue: Vec<(RunId, StepKey, String)> = self
            .queue
            .iter()
            .filter(|queued| {
                queued
                    .waiting
                    .is_some_and(|since| now.saturating_duration_since(since) > limit)
            })
            .map(|queued| {
                (
                    queued.step.run_id.clone(),
                    queued.step.key.clone(),
                    queued.step.tool.clone(),
                )
            })
            .collect();
        if overdue.is_empty() {
            return Vec::new();
        }
        self.read_policy();
        let now_ms = self.store.clock().now_millis();
        let mut held = std::collections::HashMap::new();
        for (run, key, tool) in overdue {
            let Some(limits) = self.throttle.limits(&tool) else {
                continue;
            };
            if !self.throttle.has_room(&limits, (now, now_ms)) {
                let which: Vec<String> = limits.iter().map(|l| l.describe()).collect();
                let message = format!(
                    "waited {} for tool limit {} to make room; the call did not run",
                    human_ms(limit.as_millis() as u64),
                    which.join(" and ")
                );
                held.insert((run, key), message);
            }
        }
        let mut failed = Vec::new();
        self.queue.retain(
            |queued| match held.remove(&(queued.step.run_id.clone(), queued.step.key.clone())) {
                Some(message) => {
                    failed.push((queued.step.clone(), message, crate::model::Outcome::LimitExceeded));
                    false
                }
                None => true,
            },
        );
        failed
    }

    fn on_tick(&mut self) {
        let now = self.store.clock().instant();

        let silent: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.duration_since(s.last_heartbeat) > self.config.lease_ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for session_id in silent {
            let message = format!(
                "lease expired: no heartbeat for {}",
                human_ms(self.config.lease_ttl.as_millis() as u64)
            );
            if let Some(session) = self.sessions.get(&session_id) {
                warn!(
                    %session_id,
                    worker = session.name,
                    "worker silent past its lease, ending its session"
                );
                let _ = session
                    .outbound
                    .send(Outbound::Close(KernelError::Unavailable(message.clone())));
            }
            self.leave(&session_id, &message);
        }

        let mut expired = Vec::new();
        let mut abandoned = Vec::new();
        for (dispatch_id, lease) in &self.leases {
            match lease.state {
                LeaseState::Running { deadline } if now >= deadline => expired.push(dispatch_id.clone()),
                LeaseState::Cancelling { until } if now >= until => abandoned.push(dispatch_id.clone()),
                _ => {}
            }
        }
        for dispatch_id in expired {
            let until = now + self.config.cancel_grace;
            let lease = self.leases.get_mut(&dispatch_id).expect("listed above");
            lease.state = LeaseState::Cancelling { until };
            let attempt = lease.attempt;
            let outbound = self.sessions.get(&lease.session_id).map(|s| s.outbound.clone());
            let store = self.store.clone();
            tokio::spawn(async move {
                let recorded = store.time_out(dispatch_id.clone(), attempt).await;
                // The worker is told to stop only once the timeout is durable: told first, it could
                // answer with a "cancelled" error that commits before the timeout and decides the
                // call (a safe call not retried, an at_most_once call not indeterminate).
                if let Some(outbound) = outbound {
                    let _ = outbound.send(Outbound::Cancel {
                        dispatch_id: dispatch_id.clone(),
                        attempt,
                        reason: "timeout".into(),
                    });
                }
                match recorded {
                    // Queued again, at its retry's time, by the commit's effect.
                    Ok(Some(step)) if step.status == StepStatus::Pending => {
                        info!(run_id = %step.run_id, step = %step.key, tool = step.tool, %dispatch_id, "call timed out, retrying");
                    }
                    Ok(Some(step)) => {
                        info!(run_id = %step.run_id, step = %step.key, tool = step.tool, %dispatch_id, "call timed out")
                    }
                    Ok(None) => {}
                    Err(error) => warn!(%dispatch_id, %error, "cannot record a timeout"),
                }
            });
        }
        for dispatch_id in abandoned {
            debug!(
                %dispatch_id,
                "cancelled dispatch gave no answer within the grace, freeing its slot"
            );
            self.release(&dispatch_id);
        }

        let limit = self.config.schedule_to_start_timeout;
        let sessions = &self.sessions;
        let remote = &self.remote;
        let replicated = self.config.replicated;
        let mut starved = Vec::new();
        self.queue.retain(|queued| {
            let (kind, tool) = (queued.step.kind, queued.step.tool.as_str());
            let here = sessions.values().any(|s| s.offers(kind, tool));
            let elsewhere = remote.iter().any(|(_, offers)| match kind {
                StepKind::Agent => offers.agents.contains_key(tool),
                _ => offers.tools.contains_key(tool),
            });
            if replicated && !here && elsewhere {
                // Only another replica can run it now: it is theirs to claim.
                return false;
            }
            // A hosted run waits for a worker hosting its agent however long that takes.
            let offered = kind == StepKind::Agent || here;
            let waited = now.saturating_duration_since(queued.not_before.unwrap_or(queued.since).max(queued.since));
            if !offered && waited > limit {
                let message = format!(
                    "no worker offering tool '{tool}' connected within {}; the call did not run",
                    human_ms(limit.as_millis() as u64)
                );
                starved.push((queued.step.clone(), message, crate::model::Outcome::NoWorker));
                return false;
            }
            true
        });
        starved.extend(self.held_too_long(now, limit));
        for (step, message, outcome) in starved {
            let store = self.store.clone();
            tokio::spawn(async move {
                if let Err(error) = store
                    .fail_pending(
                        step.run_id.clone(),
                        step.key.clone(),
                        message,
                        ("schedule_to_start_timeout", outcome),
                    )
                    .await
                {
                    warn!(run_id = %step.run_id, step = %step.key, %error, "cannot fail a starved call");
                }
            });
        }

        self.dispatch_ready();
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::hub::Hub;
    use crate::model::{Idempotency, ToolOptions};
    use crate::store::{Durability, NewRun, PlannedCall, TurnPlan};

    fn tool(name: &str) -> ToolDef {
        let schema = serde_json::json!({"type": "object"});
        ToolDef {
            name: name.into(),
            description: String::new(),
            fingerprint: kernel_proto::canonical::tool_fingerprint(name, "", &schema, ""),
            input_schema: schema,
            version: String::new(),
            options: ToolOptions {
                idempotency: Some(Idempotency::SafeToRetry.as_str().into()),
                ..Default::default()
            },
        }
    }

    /// A call recorded as pending but never handed to the scheduler (a lost in-memory message) is
    /// found by the periodic scan and dispatched.
    #[tokio::test]
    async fn the_in_flight_scan_dispatches_a_pending_call_nobody_queued() {
        let (_dir, store, _writer, run) = store_with_run().await;
        store.schedule_turn(one_call(&run, None)).await.unwrap();

        let config = SchedulerConfig {
            scan_interval: Duration::from_millis(50),
            ..SchedulerConfig::default()
        };
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(config, store.clone(), shutdown.clone());
        let (_session, mut orders) = join_one_slot(&scheduler).await;
        let order = tokio::time::timeout(Duration::from_secs(10), orders.recv())
            .await
            .expect("dispatched")
            .unwrap();
        let Outbound::Dispatch(order) = order else {
            panic!("expected a dispatch")
        };
        assert_eq!(order.step.key, StepKey::for_call(0, 0, None));
        assert_eq!(order.attempt, 1);
        let steps = store.reads.steps(run).await.unwrap();
        assert_eq!(
            steps[0].status,
            StepStatus::Running,
            "tool:start was recorded before the dispatch was sent"
        );
        let gauges = scheduler.gauges().await.unwrap();
        assert_eq!(gauges.lost_found, 1, "the scan counts what it found: {gauges:?}");
        shutdown.cancel();
    }

    async fn store_with_run() -> (tempfile::TempDir, Store, crate::store::WriterThread, RunId) {
        let dir = tempfile::tempdir().unwrap();
        let (store, writer) = Store::open(
            &dir.path().join("k.db"),
            Durability::Normal,
            // Time stands still unless a test moves it: no lease or timeout ends by itself.
            (Hub::default(), crate::clock::Clock::manual()),
        )
        .unwrap();
        let (run, _) = store
            .create_run(NewRun {
                agent: "a".into(),
                ..crate::machine::records::new_run()
            })
            .await
            .unwrap();
        (dir, store, writer, run.id)
    }

    fn one_call(run: &RunId, start: Option<StartDispatch>) -> TurnPlan {
        TurnPlan {
            offers_approval_tool: None,
            share: None,
            run_id: run.clone(),
            turn: 0,
            calls: vec![PlannedCall {
                position: 0,
                key: StepKey::for_call(0, 0, None),
                call_id: None,
                tool_name: "t".into(),
                arguments: "{}".into(),
                sealed: None,
                tool: Some(std::sync::Arc::new(tool("t"))),
                not_offered: false,
                timeout_ms: None,
                gate: crate::store::CallGate::Run {
                    decided_by: "default:allow".into(),
                },
                unit_cost: 0.0,
                resources: Vec::new(),
                call_hash: kernel_proto::canonical::call_hash("t", &tool("t").fingerprint, &serde_json::json!({})),
                start,
            }],
            available_tools: vec!["t".into()],
            default_timeout_ms: 30_000,
            max_pending_calls: 1024,
            max_events: 1_000_000,
            fence: None,
            caller: None,
            max_concurrency: None,
        }
    }

    async fn join_one_slot(scheduler: &Scheduler) -> (SessionId, mpsc::UnboundedReceiver<Outbound>) {
        let (outbound, orders) = mpsc::unbounded_channel();
        let hello = SessionHello {
            name: "w".into(),
            tools: vec![tool("t")],
            max_concurrency: 1,
            ephemeral_tools: false,
            agents: Vec::new(),
        };
        (scheduler.join(hello, outbound).await.unwrap(), orders)
    }

    /// A call times out at its timeout on the clock, not a millisecond before; its retry goes out
    /// when its backoff ends, not before, though the timed-out attempt's worker never answers the
    /// cancel (its lease is still being cancelled) and no scan would find it.
    #[tokio::test]
    async fn a_retry_after_a_timeout_goes_out_at_its_backoff_while_the_old_attempt_is_still_cancelling() {
        let (_dir, store, _writer, run) = store_with_run().await;
        let clock = store.clock().clone();
        let mut plan = one_call(&run, None);
        let mut def = tool("t");
        def.options.retry = Some(crate::model::RetryPolicy {
            max_attempts: 2,
            initial_interval_ms: 60_000,
            backoff_coefficient: 2.0,
            max_interval_ms: 0,
        });
        plan.calls[0].tool = Some(std::sync::Arc::new(def));
        plan.calls[0].timeout_ms = Some(30_000);
        let step = scheduled(&store, plan).await;

        // The test moves the clock past a lease TTL at once; the scheduler's own ticks (in real
        // time) must not find the worker silent before its heartbeat arrives, so the lease
        // outlasts the test: only the call's timeout is under test.
        let config = SchedulerConfig {
            scan_interval: Duration::from_secs(3600),
            cancel_grace: Duration::from_secs(3600),
            lease_ttl: Duration::from_secs(3600),
            ..SchedulerConfig::default()
        };
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(config, store.clone(), shutdown.clone());
        let (outbound, mut orders) = mpsc::unbounded_channel();
        let hello = SessionHello {
            name: "w".into(),
            tools: vec![tool("t")],
            max_concurrency: 2,
            ephemeral_tools: false,
            agents: Vec::new(),
        };
        let session = scheduler.join(hello, outbound).await.unwrap();
        scheduler.enqueue(step.clone());
        let Outbound::Dispatch(first) = next_order(&mut orders).await else {
            panic!("expected the first attempt")
        };
        assert_eq!(first.attempt, 1);

        // The worker stays in touch but never answers: only the call's own timeout ends it.
        clock.advance(Duration::from_millis(29_999));
        scheduler.heartbeat(session.clone());
        scheduler.tick().await;
        assert!(orders.try_recv().is_err(), "nothing is due before the timeout");
        clock.advance(Duration::from_millis(1));
        let timed_out_at = clock.now_millis();
        scheduler.tick().await;
        let Outbound::Cancel { attempt: 1, .. } = next_order(&mut orders).await else {
            panic!("expected the timed-out attempt to be cancelled")
        };
        // Told to stop only once the timeout is durable, so an answer to the cancel cannot
        // decide the call.
        let recorded = store.reads.steps(run.clone()).await.unwrap().remove(0);
        assert!(
            recorded
                .error
                .as_deref()
                .is_some_and(|e| e.contains("timed out after 30s")),
            "the timeout is recorded first: {recorded:?}"
        );
        assert_eq!(recorded.status, StepStatus::Pending, "{recorded:?}");
        assert_eq!(
            recorded.not_before,
            Some(timed_out_at + 60_000),
            "the first backoff: {recorded:?}"
        );

        // The retry is queued, and waits out its backoff on the clock.
        queued(&scheduler, 1).await;
        clock.advance(Duration::from_millis(59_999));
        scheduler.heartbeat(session.clone());
        scheduler.tick().await;
        assert!(orders.try_recv().is_err(), "the retry waits for its backoff");
        clock.advance(Duration::from_millis(1));
        scheduler.tick().await;
        let Outbound::Dispatch(second) = next_order(&mut orders).await else {
            panic!("expected the retry")
        };
        assert_eq!((second.attempt, &second.step.key), (2, &step.key));
        assert_eq!(
            scheduler.gauges().await.unwrap().leased,
            2,
            "the old attempt keeps its slot until its worker answers or the grace ends"
        );
        shutdown.cancel();
    }

    /// The call `plan` records, waiting for a worker.
    async fn scheduled(store: &Store, plan: TurnPlan) -> StepRecord {
        let turn = store.schedule_turn(plan).await.unwrap();
        match &turn[0] {
            crate::store::CallDisposition::Scheduled(step) => step.clone(),
            other => panic!("expected scheduled, got {other:?}"),
        }
    }

    /// Waits until `count` calls are queued.
    async fn queued(scheduler: &Scheduler, count: usize) {
        e2e::eventually(&format!("{count} queued calls"), || async {
            let gauges = scheduler.gauges().await.unwrap();
            if gauges.queued == count { Ok(()) } else { Err(gauges) }
        })
        .await
    }

    /// The run's one step, once `done` says it is in the state a test waits for.
    async fn step_once(store: &Store, run: &RunId, what: &str, done: impl Fn(&StepRecord) -> bool) -> StepRecord {
        e2e::eventually(what, || async {
            let step = store.reads.steps(run.clone()).await.unwrap().remove(0);
            if done(&step) { Ok(step) } else { Err(step) }
        })
        .await
    }

    /// A worker that stops heartbeating keeps its session for exactly its lease on the clock (a
    /// heartbeat renews it), then loses it; its call runs again on another worker.
    #[tokio::test]
    async fn a_silent_worker_keeps_its_session_for_its_lease_then_its_call_runs_elsewhere() {
        let (_dir, store, _writer, run) = store_with_run().await;
        let clock = store.clock().clone();
        let step = scheduled(&store, one_call(&run, None)).await;
        let config = SchedulerConfig {
            lease_ttl: Duration::from_secs(10),
            scan_interval: Duration::from_secs(3600),
            ..SchedulerConfig::default()
        };
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(config, store.clone(), shutdown.clone());
        let (silent, mut silent_orders) = join_one_slot(&scheduler).await;
        scheduler.enqueue(step.clone());
        let Outbound::Dispatch(first) = next_order(&mut silent_orders).await else {
            panic!("expected the first attempt")
        };

        clock.advance(Duration::from_secs(9));
        scheduler.heartbeat(silent.clone());
        // The heartbeat reads the clock when the scheduler takes it; a tick is taken after it.
        scheduler.tick().await;
        clock.advance(Duration::from_secs(10));
        scheduler.tick().await;
        assert!(silent_orders.try_recv().is_err(), "a heartbeat renewed the lease");
        clock.advance(Duration::from_millis(1));
        scheduler.tick().await;
        let Outbound::Close(error) = next_order(&mut silent_orders).await else {
            panic!("expected the silent worker's session to be closed")
        };
        assert!(error.to_string().contains("no heartbeat for 10s"), "{error}");

        let lost = step_once(&store, &run, "the lost attempt recorded", |s| s.lease_losses == 1).await;
        assert_eq!(
            (lost.status, lost.attempts),
            (StepStatus::Pending, first.attempt),
            "{lost:?}"
        );
        if let Some(due) = lost.not_before {
            clock.advance(Duration::from_millis(
                due.saturating_sub(clock.now_millis()).max(0) as u64
            ));
        }
        let (_other, mut orders) = join_one_slot(&scheduler).await;
        let Outbound::Dispatch(second) = next_order(&mut orders).await else {
            panic!("expected the call again on the other worker")
        };
        assert_eq!((second.attempt, &second.step.key), (2, &step.key));
        shutdown.cancel();
    }

    /// A call whose tool no worker offers waits its schedule-to-start timeout on the clock, not a
    /// millisecond less, then fails as `no_worker` without running.
    #[tokio::test]
    async fn a_call_no_worker_offers_fails_at_its_schedule_to_start_timeout() {
        let (_dir, store, _writer, run) = store_with_run().await;
        let clock = store.clock().clone();
        let step = scheduled(&store, one_call(&run, None)).await;
        let config = SchedulerConfig {
            schedule_to_start_timeout: Duration::from_secs(30),
            scan_interval: Duration::from_secs(3600),
            ..SchedulerConfig::default()
        };
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(config, store.clone(), shutdown.clone());
        scheduler.enqueue(step.clone());
        queued(&scheduler, 1).await;

        clock.advance(Duration::from_secs(30));
        scheduler.tick().await;
        queued(&scheduler, 1).await;
        clock.advance(Duration::from_millis(1));
        scheduler.tick().await;
        queued(&scheduler, 0).await;
        let failed = step_once(&store, &run, "the starved call failed", |s| s.status.is_terminal()).await;
        assert_eq!(failed.outcome, Some(crate::model::Outcome::NoWorker), "{failed:?}");
        assert!(
            failed
                .error
                .as_deref()
                .is_some_and(|e| e.contains("connected within 30s")),
            "{failed:?}"
        );
        assert_eq!(failed.attempts, 0, "it never ran");
        shutdown.cancel();
    }

    /// A call a tool limit holds back waits in the queue, not failing, for as long as a call
    /// waits for a worker; past that, while the limit still holds it, it fails saying which limit.
    #[tokio::test]
    async fn a_call_a_tool_limit_holds_back_waits_then_fails_at_its_schedule_to_start_timeout() {
        let (dir, store, _writer, run) = store_with_run().await;
        let clock = store.clock().clone();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, "default: allow\nlimits:\n  - tools: \"t\"\n    at_once: 1\n").unwrap();
        let governance = crate::governance::Governance::load(Some(&policy), Vec::new()).unwrap();
        // The first call runs for an hour: nothing but the limit holds the second back.
        let first = scheduled(
            &store,
            TurnPlan {
                default_timeout_ms: 3_600_000,
                ..one_call(&run, None)
            },
        )
        .await;
        let mut plan = TurnPlan {
            turn: 1,
            ..one_call(&run, None)
        };
        plan.calls[0].key = StepKey::for_call(1, 0, None);
        plan.calls[0].arguments = r#"{"n":1}"#.into();
        plan.calls[0].call_hash =
            kernel_proto::canonical::call_hash("t", &tool("t").fingerprint, &serde_json::json!({"n": 1}));
        let second = scheduled(&store, plan).await;
        let config = SchedulerConfig {
            schedule_to_start_timeout: Duration::from_secs(30),
            scan_interval: Duration::from_secs(3600),
            policy: PolicySource::policy(governance),
            ..SchedulerConfig::default()
        };
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(config, store.clone(), shutdown.clone());
        let (outbound, mut orders) = mpsc::unbounded_channel();
        let hello = SessionHello {
            name: "w".into(),
            tools: vec![tool("t")],
            max_concurrency: 2,
            ephemeral_tools: false,
            agents: Vec::new(),
        };
        let session = scheduler.join(hello, outbound).await.unwrap();
        scheduler.enqueue(first);
        scheduler.enqueue(second.clone());
        let Some(Outbound::Dispatch(order)) = orders.recv().await else {
            panic!("expected a dispatch")
        };
        assert_eq!(order.step.limited_by, ["t"], "{order:?}");
        queued(&scheduler, 1).await;

        // The worker heartbeats all along, and the first call runs on: only the limit holds.
        clock.advance(Duration::from_secs(30));
        scheduler.heartbeat(session.clone());
        scheduler.tick().await;
        queued(&scheduler, 1).await;
        clock.advance(Duration::from_millis(1));
        scheduler.heartbeat(session);
        scheduler.tick().await;
        queued(&scheduler, 0).await;
        let failed = e2e::eventually("the held call failed", || async {
            let steps = store.reads.steps(run.clone()).await.unwrap();
            let step = steps.into_iter().find(|s| s.key == second.key).unwrap();
            if step.status.is_terminal() { Ok(step) } else { Err(step) }
        })
        .await;
        assert_eq!(failed.outcome, Some(crate::model::Outcome::LimitExceeded), "{failed:?}");
        assert_eq!(
            failed.error.as_deref(),
            Some("waited 30s for tool limit 't' (1 at once) to make room; the call did not run")
        );
        assert!(orders.try_recv().is_err(), "the held call never went to the worker");
        shutdown.cancel();
    }

    /// A read of the store taken before this replica's start committed shows the call still
    /// waiting; it must not cancel the lease it predates. A read that has seen the attempt and
    /// shows the call waiting again (taken over by another replica) cancels it.
    #[tokio::test]
    async fn a_read_older_than_a_lease_does_not_cancel_it() {
        let (_dir, store, _writer, run) = store_with_run().await;
        let turn = store.schedule_turn(one_call(&run, None)).await.unwrap();
        let crate::store::CallDisposition::Scheduled(before_start) = &turn[0] else {
            panic!("expected scheduled, got {:?}", turn[0]);
        };
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(SchedulerConfig::default(), store.clone(), shutdown.clone());
        let (_session, mut orders) = join_one_slot(&scheduler).await;
        scheduler.enqueue(before_start.clone());
        let Some(Outbound::Dispatch(order)) = orders.recv().await else {
            panic!("expected a dispatch")
        };
        assert_eq!((before_start.status, before_start.attempts), (StepStatus::Pending, 0));
        let reason = "settled on another kernel replica".to_owned();

        scheduler.cancel_steps(vec![before_start.clone()], reason.clone());
        let running = store.reads.steps(run.clone()).await.unwrap().remove(0);
        scheduler.cancel_steps(vec![running.clone()], reason.clone());
        scheduler.gauges().await.unwrap();
        assert!(orders.try_recv().is_err(), "neither read cancels the lease");

        let taken_over = StepRecord {
            status: StepStatus::Pending,
            ..running
        };
        scheduler.cancel_steps(vec![taken_over], reason);
        scheduler.gauges().await.unwrap();
        match orders.try_recv() {
            Ok(Outbound::Cancel {
                dispatch_id, attempt, ..
            }) => {
                assert_eq!((dispatch_id, attempt), (order.dispatch_id, 1))
            }
            other => panic!("expected the lease cancelled, got {other:?}"),
        }
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_reserved_slot_is_held_until_its_call_starts_or_it_is_given_back() {
        let (_dir, store, _writer, run) = store_with_run().await;
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(SchedulerConfig::default(), store.clone(), shutdown.clone());
        let (_session, mut orders) = join_one_slot(&scheduler).await;
        let key = StepKey::for_call(0, 0, None);
        let wanted = vec![ReserveCall {
            key: key.clone(),
            tool: "t".to_owned(),
            locks: Vec::new(),
        }];

        let first = scheduler.reserve(run.clone(), (0, None), wanted.clone()).await;
        let start = first[0].clone().expect("a free slot is reserved").start;
        assert_eq!(start.attempt, 1);
        assert!(
            scheduler.reserve(run.clone(), (0, None), wanted.clone()).await[0].is_none(),
            "the one slot is taken"
        );
        scheduler.reserved(vec![(start, None)], Written::Failed);
        let again = scheduler.reserve(run.clone(), (0, None), wanted).await;
        let start = again[0].clone().expect("a slot given back can be reserved again").start;

        // Written with its slot: the call starts in the same commit and goes to the worker.
        let turn = store.schedule_turn(one_call(&run, Some(start.clone()))).await.unwrap();
        let crate::store::CallDisposition::Started(step) = &turn[0] else {
            panic!("expected started, got {:?}", turn[0]);
        };
        scheduler.reserved(vec![(start.clone(), Some(step.clone()))], Written::Committed);
        let Some(Outbound::Dispatch(order)) = tokio::time::timeout(Duration::from_secs(10), orders.recv())
            .await
            .expect("dispatched")
        else {
            panic!("expected a dispatch")
        };
        assert_eq!(
            (order.dispatch_id.as_str(), order.attempt),
            (start.dispatch_id.as_str(), 1)
        );
        assert_eq!(scheduler.gauges().await.unwrap().leased, 1);
        shutdown.cancel();
    }

    /// Reserves the one slot of a session for the call of [`one_call`].
    async fn reserve_one(scheduler: &Scheduler, run: &RunId) -> Reservation {
        let wanted = vec![ReserveCall {
            key: StepKey::for_call(0, 0, None),
            tool: "t".to_owned(),
            locks: Vec::new(),
        }];
        let reserved = scheduler.reserve(run.clone(), (0, None), wanted).await;
        reserved[0].clone().expect("a free slot is reserved")
    }

    async fn next_order(orders: &mut mpsc::UnboundedReceiver<Outbound>) -> Outbound {
        tokio::time::timeout(Duration::from_secs(10), orders.recv())
            .await
            .expect("an order for the worker")
            .expect("the session's channel is open")
    }

    /// A scheduler with one worker of one slot, and the call of [`one_call`] recorded as started
    /// on that slot, its turn's write not yet answered.
    async fn started_on_its_slot() -> (Fixture, Reservation, StepRecord) {
        let (dir, store, writer, run) = store_with_run().await;
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(SchedulerConfig::default(), store.clone(), shutdown.clone());
        let (_, orders) = join_one_slot(&scheduler).await;
        let reservation = reserve_one(&scheduler, &run).await;
        let turn = store
            .schedule_turn(one_call(&run, Some(reservation.start.clone())))
            .await
            .unwrap();
        let crate::store::CallDisposition::Started(step) = &turn[0] else {
            panic!("expected started, got {:?}", turn[0]);
        };
        let fixture = Fixture {
            _store: (dir, writer),
            scheduler,
            orders,
            shutdown,
        };
        (fixture, reservation, step.clone())
    }

    /// [`started_on_its_slot`], and the call sent by the writer before its turn's commit: the order
    /// its worker received, with the slot it was reserved.
    async fn sent_early() -> (Fixture, StartDispatch, StepRecord, Box<DispatchOrder>) {
        let (mut f, reservation, step) = started_on_its_slot().await;
        let start = reservation.start.clone();
        f.scheduler.dispatch_early(&[reservation])(vec![step.clone()]);
        let Outbound::Dispatch(order) = next_order(&mut f.orders).await else {
            panic!("expected a dispatch")
        };
        (f, start, step, order)
    }

    struct Fixture {
        _store: (tempfile::TempDir, crate::store::WriterThread),
        scheduler: Scheduler,
        orders: mpsc::UnboundedReceiver<Outbound>,
        shutdown: CancellationToken,
    }

    /// A call sent before its start committed is not sent again when its turn's write comes back.
    #[tokio::test]
    async fn a_call_sent_before_its_start_committed_goes_out_once() {
        let (mut f, start, step, order) = sent_early().await;
        assert_eq!(
            (order.dispatch_id.as_str(), order.attempt),
            (start.dispatch_id.as_str(), 1)
        );
        f.scheduler
            .reserved(vec![(start.clone(), Some(step))], Written::Committed);
        assert_eq!(f.scheduler.gauges().await.unwrap().leased, 1, "the lease runs");
        assert!(f.orders.try_recv().is_err(), "the turn's answer sends nothing more");
        f.scheduler.settled(start.dispatch_id, 1);
        assert_eq!(f.scheduler.gauges().await.unwrap().leased, 0);
        f.shutdown.cancel();
    }

    /// A call sent before its start committed, whose turn's write then failed, is recorded nowhere:
    /// its worker is told to stop, and the slot comes back once it answers.
    #[tokio::test]
    async fn a_call_sent_before_a_commit_that_failed_is_cancelled() {
        let (mut f, start, _, _) = sent_early().await;
        f.scheduler.reserved(vec![(start.clone(), None)], Written::Failed);
        let Outbound::Cancel { dispatch_id, .. } = next_order(&mut f.orders).await else {
            panic!("expected the worker told to stop")
        };
        assert_eq!(dispatch_id, start.dispatch_id);
        assert_eq!(
            f.scheduler.gauges().await.unwrap().leased,
            1,
            "the slot is held until the worker answers"
        );
        f.scheduler.settled(dispatch_id, 1);
        assert_eq!(f.scheduler.gauges().await.unwrap().leased, 0);
        f.shutdown.cancel();
    }

    /// A turn whose write's outcome is unknown (the connection dropped as it committed) but whose
    /// start did commit: the store is asked, and the call goes to its slot's worker as attempt 1,
    /// not lost and run again (nor, were it `at_most_once`, made indeterminate).
    #[tokio::test]
    async fn a_start_that_committed_though_its_answer_was_lost_goes_to_its_worker() {
        let (mut f, reservation, _) = started_on_its_slot().await;
        let start = reservation.start.clone();
        f.scheduler.reserved(vec![(start.clone(), None)], Written::Unknown);
        let Outbound::Dispatch(order) = next_order(&mut f.orders).await else {
            panic!("expected the call sent")
        };
        assert_eq!(
            (order.dispatch_id.as_str(), order.attempt),
            (start.dispatch_id.as_str(), 1)
        );
        assert_eq!(f.scheduler.gauges().await.unwrap().leased, 1, "the lease runs");
        f.shutdown.cancel();
    }

    /// The same, for a start that did not commit: its slot comes back and nothing is sent.
    #[tokio::test]
    async fn a_start_that_did_not_commit_though_its_answer_was_lost_gives_its_slot_back() {
        let (dir, store, writer, run) = store_with_run().await;
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(SchedulerConfig::default(), store.clone(), shutdown.clone());
        let (_, mut orders) = join_one_slot(&scheduler).await;
        let reservation = reserve_one(&scheduler, &run).await;
        scheduler.reserved(vec![(reservation.start.clone(), None)], Written::Unknown);
        until_no_lease(&scheduler).await;
        assert!(orders.try_recv().is_err(), "nothing sent");
        let again = reserve_one(&scheduler, &run).await;
        assert_eq!(again.start.attempt, 1, "the slot is free for the next call");
        shutdown.cancel();
        drop((dir, writer));
    }

    /// Waits until no slot is leased.
    async fn until_no_lease(scheduler: &Scheduler) {
        for _ in 0..200 {
            if scheduler.gauges().await.unwrap().leased == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the slot was never given back");
    }

    /// A call sent before its start committed may be answered, and its slot given back, before its
    /// turn's write comes back: that answer then neither sends it again nor holds a lease.
    #[tokio::test]
    async fn a_call_settled_before_its_turn_s_write_came_back_is_done() {
        let (mut f, start, step, _) = sent_early().await;
        f.scheduler.settled(start.dispatch_id.clone(), 1);
        f.scheduler
            .reserved(vec![(start.clone(), Some(step))], Written::Committed);
        assert_eq!(f.scheduler.gauges().await.unwrap().leased, 0);
        assert!(f.orders.try_recv().is_err(), "nothing sent again");
        let run = start.run_id;
        let again = reserve_one(&f.scheduler, &run).await;
        assert_eq!(again.start.attempt, 1, "the slot is free for the next call");
        f.shutdown.cancel();
    }

    #[tokio::test]
    async fn a_slot_whose_session_left_before_the_write_loses_the_call_and_it_runs_again() {
        a_slot_whose_session_left_loses_its_call(false).await;
    }

    /// As above, for a call handed to a session already gone before its start committed.
    #[tokio::test]
    async fn a_call_sent_early_to_a_session_already_gone_is_lost_and_runs_again() {
        a_slot_whose_session_left_loses_its_call(true).await;
    }

    async fn a_slot_whose_session_left_loses_its_call(early: bool) {
        let (_dir, store, _writer, run) = store_with_run().await;
        let shutdown = CancellationToken::new();
        let scheduler = Scheduler::spawn(SchedulerConfig::default(), store.clone(), shutdown.clone());
        let (session, _orders) = join_one_slot(&scheduler).await;
        let reservation = reserve_one(&scheduler, &run).await;
        let start = reservation.start.clone();
        scheduler.leave(session, "closed its stream".into());

        let turn = store.schedule_turn(one_call(&run, Some(start.clone()))).await.unwrap();
        let crate::store::CallDisposition::Started(step) = &turn[0] else {
            panic!("expected started, got {:?}", turn[0]);
        };
        if early {
            scheduler.dispatch_early(&[reservation])(vec![step.clone()]);
        }
        scheduler.reserved(vec![(start, Some(step.clone()))], Written::Committed);

        // The start was recorded for a session that is gone: the loss is recorded and the call,
        // safe to retry, waits for the next worker.
        let lost = step_once(&store, &run, "the loss recorded", |s| s.lease_losses == 1).await;
        assert_eq!(lost.status, StepStatus::Pending, "{lost:?}");
        let (_session, mut orders) = join_one_slot(&scheduler).await;
        let Some(Outbound::Dispatch(order)) = tokio::time::timeout(Duration::from_secs(10), orders.recv())
            .await
            .expect("dispatched again")
        else {
            panic!("expected a dispatch")
        };
        assert_eq!(order.attempt, 2);
        shutdown.cancel();
    }
}
