//! Properties of whole commands: random sequences of every write command, run against the
//! in-memory records ([`Memory`]) with the clock moving between them, stale and forged messages
//! among them (an earlier attempt, another session, a dispatch or run nobody issued). After
//! every command the whole state and log must keep DESIGN.md's invariants and issue 42's six
//! rules; a failing case shrinks to the few commands that break one, named in its Debug output.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;

use super::answer_approval::{self, Answer};
use super::ask_person::{self, PersonAsk};
use super::local_step::{StepGate, StepRecorded};
use super::lose_lease::LossOutcome;
use super::memory::{Memory, State};
use super::start_subagent::SubagentStart;
use super::submit_turn::RecordedTurn;
use super::suspend::SuspendReport;
use super::{
    cancel_call, create_run, delete, end_run, local_step, lose_lease, result, start, start_subagent, submit_turn,
    suspend, time_out,
};
use crate::machine::dispatch::{self, LeaseLoss, ResultReport, StartDispatch};
use crate::machine::hosted::{Fence, HostedAgent, LocalStep};
use crate::machine::question::Asked;
use crate::machine::run::{EndRun, NewRun};
use crate::machine::turn::{CallDisposition, CallGate, PlannedCall, TurnPlan};
use crate::model::{
    ApprovalGate, ApprovalId, DispatchId, Effect, ErrorKind, EventType, Idempotency, Millis, Outcome, RetryPolicy,
    RunId, RunStatus, SessionId, StepKey, StepKind, StepRecord, StepStatus, ToolDef, ToolOptions,
};

/// The tool limit the scheduler passes with every start of `fetch`, as the policy file's `limits`
/// would: one call at once, two a second.
fn fetch_limit() -> crate::machine::throttle::ToolLimit {
    crate::machine::throttle::ToolLimit {
        tools: "fetch".into(),
        per_second: Some(2.0),
        burst: Some(2),
        at_once: Some(1),
    }
}

/// The policy rule that denies tool `wipe` and every local step it is asked about.
const DENY_RULE: &str = "rule:deny-writes";
/// How long a worker's lease runs.
const LEASE_MS: Millis = 30_000;

// ---------------------------------------------------------------------------------------------
// The commands.

/// Which run a command names: one created before (by index, wrapping), or one nobody created.
#[derive(Clone, Copy, Debug)]
enum Target {
    Known(u8),
    Forged,
}

/// Who a message about a dispatch claims to be.
#[derive(Clone, Copy, Debug)]
enum Sender {
    /// The attempt holding a dispatch now (the `n`th of them, wrapping).
    Current(u8),
    /// An attempt issued before that no longer holds its step (or still does, by chance).
    Stale(u8),
    /// The attempt holding it, from another worker session.
    OtherSession(u8),
    /// A dispatch nobody issued.
    Forged,
}

/// One call of a turn: the tool (by index in [`tools`], the last unknown), the arguments and an
/// explicit call id, from small ranges so identities and hashes meet again.
#[derive(Clone, Copy, Debug)]
struct CallSpec {
    tool: u8,
    arg: u8,
    call_id: Option<u8>,
}

#[derive(Clone, Copy, Debug)]
enum Reported {
    Ok,
    Retryable,
    Fatal,
}

#[derive(Clone, Copy, Debug)]
enum How {
    Complete,
    Fail,
    Cancel,
}

#[derive(Clone, Debug)]
enum Command {
    CreateRun {
        hosted: bool,
        idempotency_key: Option<u8>,
        max_tool_calls: u8,
        /// A budget of at most so many calls and so many tenths of cost, which asks a person to
        /// raise it, or not.
        budget: Option<(u8, u8, bool)>,
    },
    /// A turn of an external run, or a hosted handler's calls at place `turn`, fenced by `fence`
    /// (which a forged sender adds to an external run's turn, too).
    Turn {
        run: Target,
        turn: u8,
        calls: Vec<CallSpec>,
        fence: Sender,
        /// The scheduler reserved a slot for each runnable call: it starts in the same write.
        reserve: bool,
    },
    /// Starts the `n`th pending step as the attempt after its last, plus `offset`.
    Start {
        step: u8,
        offset: i8,
    },
    Result {
        from: Sender,
        outcome: Reported,
    },
    LoseLease {
        from: Sender,
    },
    TimeOut {
        from: Sender,
    },
    FailPending {
        step: u8,
    },
    /// A dispatch giving back its slot to wait on some of its run's steps (by index), or on a
    /// step its run never recorded.
    Suspend {
        from: Sender,
        waiting_on: Vec<Option<u8>>,
    },
    /// A subagent, started by a hosted handler at place `seq`, or by the body of a tool call.
    Subagent {
        run: Target,
        fence: Sender,
        by_call: bool,
        seq: u8,
        occurrence: u8,
        session: Option<u8>,
        input: u8,
    },
    /// A handler's local step at place `seq`; a denied one comes with the deny rule's name.
    LocalStep {
        run: Target,
        fence: Sender,
        seq: u8,
        id: u8,
        occurrence: u8,
        ok: bool,
        denied: bool,
    },
    /// A call a tool body makes through the kernel (its `occurrence`-th).
    Call {
        from: Sender,
        occurrence: u8,
        call: CallSpec,
    },
    /// A tool body's question to a person (its `occurrence`-th), with one of two texts.
    Ask {
        from: Sender,
        occurrence: u8,
        text: u8,
    },
    Answer {
        approval: Option<u8>,
        approve: bool,
    },
    ExpireApprovals,
    CancelCall {
        step: u8,
    },
    EndRun {
        run: Target,
        how: How,
    },
    Abandon,
    Delete {
        run: Target,
    },
    Prune,
}

/// A command, after the clock moved on by `after_ms`.
#[derive(Clone, Debug)]
struct Timed {
    after_ms: u16,
    command: Command,
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![9 => any::<u8>().prop_map(Target::Known), 1 => Just(Target::Forged)]
}

fn sender() -> impl Strategy<Value = Sender> {
    prop_oneof![
        8 => any::<u8>().prop_map(Sender::Current),
        2 => any::<u8>().prop_map(Sender::Stale),
        1 => any::<u8>().prop_map(Sender::OtherSession),
        1 => Just(Sender::Forged),
    ]
}

fn call() -> impl Strategy<Value = CallSpec> {
    (0..TOOLS as u8, 0u8..2, prop::option::weighted(0.2, 0u8..2)).prop_map(|(tool, arg, call_id)| CallSpec {
        tool,
        arg,
        call_id,
    })
}

fn reported() -> impl Strategy<Value = Reported> {
    prop_oneof![3 => Just(Reported::Ok), 2 => Just(Reported::Retryable), 1 => Just(Reported::Fatal)]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        2 => (
            any::<bool>(),
            prop::option::weighted(0.3, 0u8..2),
            prop_oneof![4 => Just(0u8), 1 => 1u8..4],
            prop::option::weighted(0.6, (0u8..3, 0u8..8, any::<bool>())),
        )
            .prop_map(|(hosted, idempotency_key, max_tool_calls, budget)| Command::CreateRun {
                hosted,
                idempotency_key,
                max_tool_calls,
                budget,
            }),
        8 => (target(), 0u8..4, prop::collection::vec(call(), 1..4), sender(), any::<bool>())
            .prop_map(|(run, turn, calls, fence, reserve)| Command::Turn { run, turn, calls, fence, reserve }),
        6 => (any::<u8>(), prop_oneof![8 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)])
            .prop_map(|(step, offset)| Command::Start { step, offset }),
        5 => (sender(), reported()).prop_map(|(from, outcome)| Command::Result { from, outcome }),
        1 => sender().prop_map(|from| Command::LoseLease { from }),
        1 => sender().prop_map(|from| Command::TimeOut { from }),
        1 => any::<u8>().prop_map(|step| Command::FailPending { step }),
        2 => (sender(), prop::collection::vec(prop::option::weighted(0.9, any::<u8>()), 1..3))
            .prop_map(|(from, waiting_on)| Command::Suspend { from, waiting_on }),
        3 => (
            target(),
            sender(),
            prop::bool::weighted(0.3),
            0u8..4,
            0u8..2,
            prop::option::weighted(0.4, 0u8..2),
            0u8..2,
        )
            .prop_map(|(run, fence, by_call, seq, occurrence, session, input)| Command::Subagent {
                run,
                fence,
                by_call,
                seq,
                occurrence,
                session,
                input,
            }),
        3 => (target(), sender(), 0u8..4, 0u8..2, 0u8..2, any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(run, fence, seq, id, occurrence, ok, denied)| Command::LocalStep {
                run,
                fence,
                seq,
                id,
                occurrence,
                ok,
                denied,
            }),
        2 => (sender(), 0u8..2, 0u8..4).prop_map(|(from, occurrence, text)| Command::Ask { from, occurrence, text }),
        2 => (sender(), 0u8..2, call()).prop_map(|(from, occurrence, call)| Command::Call { from, occurrence, call }),
        2 => (prop::option::weighted(0.9, any::<u8>()), any::<bool>())
            .prop_map(|(approval, approve)| Command::Answer { approval, approve }),
        1 => Just(Command::ExpireApprovals),
        1 => any::<u8>().prop_map(|step| Command::CancelCall { step }),
        2 => (target(), prop_oneof![Just(How::Complete), Just(How::Fail), Just(How::Cancel)])
            .prop_map(|(run, how)| Command::EndRun { run, how }),
        1 => Just(Command::Abandon),
        2 => target().prop_map(|run| Command::Delete { run }),
        1 => Just(Command::Prune),
    ]
}

fn timed() -> impl Strategy<Value = Timed> {
    (prop_oneof![3 => 0u16..100, 1 => 100u16..20_000], command())
        .prop_map(|(after_ms, command)| Timed { after_ms, command })
}

/// Up to `most` commands, after two external runs and a hosted one are created.
fn commands(most: usize) -> impl Strategy<Value = Vec<Timed>> {
    prop::collection::vec(timed(), 1..most).prop_map(|commands| {
        let create = |hosted| Timed {
            after_ms: 0,
            command: Command::CreateRun {
                hosted,
                idempotency_key: None,
                max_tool_calls: 0,
                budget: None,
            },
        };
        [create(false), create(true), create(false)]
            .into_iter()
            .chain(commands)
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// The tools, and turns built as the gRPC layer builds them.

/// How many tools a call may name: the registered ones and one nobody registered.
const TOOLS: usize = 7;

/// The registered tools: a cached read, an `at_most_once` charge, a retried fetch, a refund that
/// asks a person, a deploy that locks its repository, and a wipe the policy denies.
fn tools() -> Vec<Arc<ToolDef>> {
    let retry = RetryPolicy {
        max_attempts: 3,
        initial_interval_ms: 100,
        backoff_coefficient: 2.0,
        max_interval_ms: 0,
    };
    let defs = [
        (
            "lookup",
            ToolOptions {
                read_only: true,
                cache_ttl_ms: Some(60_000),
                ..ToolOptions::default()
            },
        ),
        (
            "charge",
            ToolOptions {
                idempotency: Some("at_most_once".into()),
                retry: Some(retry.clone()),
                writes: true,
                ..ToolOptions::default()
            },
        ),
        (
            "fetch",
            ToolOptions {
                retry: Some(retry),
                ..ToolOptions::default()
            },
        ),
        (
            "refund",
            ToolOptions {
                requires_approval: true,
                approval_timeout_ms: Some(5_000),
                ..ToolOptions::default()
            },
        ),
        (
            "deploy",
            ToolOptions {
                resources: vec!["repo:{repo}".into()],
                ..ToolOptions::default()
            },
        ),
        ("wipe", ToolOptions::default()),
    ];
    defs.into_iter()
        .map(|(name, options)| {
            Arc::new(ToolDef {
                name: name.into(),
                description: String::new(),
                input_schema: json!({}),
                version: "1".into(),
                fingerprint: format!("fp-{name}"),
                options,
            })
        })
        .collect()
}

/// What validation and policy decide for a call of `tool`, as the governance would.
fn gate(tool: &ToolDef) -> CallGate {
    match tool.name.as_str() {
        "wipe" => CallGate::Deny {
            message: "wipe not allowed. reason: writes are denied".into(),
            decided_by: DENY_RULE.into(),
        },
        _ if tool.options.requires_approval => CallGate::Approve(ApprovalGate {
            timeout_ms: tool.options.approval_timeout_ms,
            approvers: vec!["ops".into()],
            message: None,
            decided_by: "tool:requires_approval".into(),
        }),
        _ => CallGate::Run {
            decided_by: "default:allow".into(),
        },
    }
}

/// Call `position` of turn `turn` as `grpc::tool_calls` plans it.
fn planned(turn: u32, position: u32, spec: CallSpec, tools: &[Arc<ToolDef>]) -> PlannedCall {
    let tool = tools.get(usize::from(spec.tool)).cloned();
    let name = tool.as_ref().map_or("ghost".to_owned(), |t| t.name.clone());
    let args = json!({ "n": spec.arg });
    let fingerprint = tool.as_ref().map_or("", |t| t.fingerprint.as_str());
    let call_id = spec.call_id.map(|id| format!("c{id}"));
    let resources = match &tool {
        Some(t) if !t.options.resources.is_empty() => vec!["repo:acme".to_owned()],
        _ => Vec::new(),
    };
    PlannedCall {
        position,
        key: StepKey::for_call(turn, position, call_id.as_deref()),
        call_id,
        call_hash: kernel_proto::canonical::call_hash(&name, fingerprint, &args),
        tool_name: name,
        arguments: kernel_proto::canonical::to_canonical(&args),
        sealed: None,
        gate: tool.as_deref().map_or(
            CallGate::Run {
                decided_by: String::new(),
            },
            gate,
        ),
        tool,
        not_offered: false,
        timeout_ms: None,
        // Every attempt costs, so the budgets of the runs that have one are spent.
        unit_cost: 0.25,
        resources,
        start: None,
    }
}

// ---------------------------------------------------------------------------------------------
// The world the commands run in.

/// The in-memory records, with what the test drivers remember: the runs created and every
/// dispatch issued.
struct World {
    memory: Memory,
    tools: Vec<Arc<ToolDef>>,
    runs: Vec<RunId>,
    /// Every attempt the scheduler started, in order: (run, step, dispatch id, attempt).
    issued: Vec<(RunId, StepKey, DispatchId, u32)>,
    /// `at_most_once` steps an attempt of which ended with its effect unknown (lost, timed out).
    unknown: BTreeSet<(RunId, StepKey)>,
    /// Each command as it reached the records, to replay against another store.
    trace: Vec<Traced>,
}

/// What a command did, as far as the properties care.
#[derive(Debug)]
enum Done {
    Changed,
    /// Refused without an error (a stale message, a step that may not start): nothing changes.
    Refused,
    Failed(crate::error::KernelError),
    /// A hosted handler diverged from its record: its run must have failed in this command.
    Diverged(RunId),
    /// A message from a dispatch that did not hold its step was heard (invariant 4).
    Heard(String),
}

impl World {
    fn new() -> Self {
        World {
            memory: Memory::new(1_000_000),
            tools: tools(),
            runs: Vec::new(),
            issued: Vec::new(),
            unknown: BTreeSet::new(),
            trace: Vec::new(),
        }
    }

    fn run_id(&self, target: Target) -> RunId {
        self.pick_run(target, |_| true)
    }

    /// The hosted run `target` names: a hosted handler's operations name their own run.
    fn hosted_run_id(&self, target: Target) -> RunId {
        let hosted = |id: &RunId| self.memory.state.runs.get(id).is_none_or(|run| run.hosted);
        self.pick_run(target, hosted)
    }

    fn pick_run(&self, target: Target, keep: impl Fn(&RunId) -> bool) -> RunId {
        let runs: Vec<RunId> = self.runs.iter().filter(|id| keep(id)).cloned().collect();
        match target {
            Target::Known(n) if !runs.is_empty() => runs[usize::from(n) % runs.len()].clone(),
            _ => RunId::parse("01a23000-0000-7000-8000-00000000dead", "run").expect("a run id"),
        }
    }

    fn steps(&self, keep: impl Fn(&StepRecord) -> bool) -> Vec<StepRecord> {
        self.memory.state.steps.values().filter(|s| keep(s)).cloned().collect()
    }

    fn nth<T: Clone>(items: &[T], n: u8) -> Option<T> {
        (!items.is_empty()).then(|| items[usize::from(n) % items.len()].clone())
    }

    /// The dispatch a message claims to come from: (dispatch id, attempt, session).
    fn sender(&self, from: Sender, keep: impl Fn(&StepRecord) -> bool) -> (DispatchId, u32, SessionId) {
        let held = self.steps(|s| s.status == StepStatus::Running && keep(s));
        let current = |n| {
            World::nth(&held, n).map(|s| {
                (
                    s.dispatch_id.clone().unwrap_or_else(|| "".into()),
                    s.attempts,
                    s.session_id.clone().unwrap_or_else(|| "".into()),
                )
            })
        };
        let forged = ("forged".into(), 1, "s1".into());
        match from {
            Sender::Current(n) => current(n).unwrap_or(forged),
            Sender::OtherSession(n) => current(n).map_or(forged, |(id, attempt, _)| (id, attempt, "s-other".into())),
            Sender::Stale(n) => {
                World::nth(&self.issued, n).map_or(forged, |(_, _, id, attempt)| (id, attempt, "s1".into()))
            }
            Sender::Forged => forged,
        }
    }

    /// The fence a hosted handler's operation carries: its run's dispatch, or what `from` claims.
    fn fence(&self, run: &RunId, from: Sender) -> Fence {
        let own = |s: &StepRecord| s.run_id == *run && s.kind == StepKind::Agent;
        let (dispatch_id, attempt, _) = match from {
            Sender::Current(_) | Sender::OtherSession(_) => self.sender(Sender::Current(0), own),
            from => self.sender(from, |_| true),
        };
        Fence { dispatch_id, attempt }
    }

    fn start_of(&mut self, run: &RunId, key: &StepKey, attempt: u32) -> StartDispatch {
        let dispatch_id = DispatchId::from(format!("d{}", self.issued.len()));
        self.issued
            .push((run.clone(), key.clone(), dispatch_id.clone(), attempt));
        StartDispatch {
            run_id: run.clone(),
            key: key.clone(),
            dispatch_id,
            attempt,
            worker: "w1".into(),
            session_id: "s1".into(),
            lease_expires_at: self.memory.now + LEASE_MS,
            replica: None,
            limits: Vec::new(),
            limit_wait_ms: 0,
        }
    }

    /// Applies `command` as the store's writer does: a command that fails is undone (its
    /// savepoint), but for the two the writer runs unguarded in a batch, which must refuse
    /// before they write (`Command::decides_before_writing` in `store::writer`). An end of a run
    /// is held to that too: its refusal (a finished run, calls in flight) comes before it ends
    /// any child.
    fn apply(&mut self, command: &Command) -> Done {
        let before = self.memory.clone();
        let traced = self.trace.len();
        let done = match self.try_apply(command) {
            Ok(done) => done,
            Err(error) => {
                if !matches!(
                    command,
                    Command::Turn { .. } | Command::Result { .. } | Command::EndRun { .. }
                ) {
                    self.memory = before.clone();
                }
                Done::Failed(error)
            }
        };
        if self.trace.len() > traced {
            self.note_created(&before.state);
        }
        done
    }

    /// Notes on the command just traced the runs and questions it created, by which a replay
    /// knows the ids another store gave them.
    fn note_created(&mut self, before: &State) {
        let after = &self.memory.state;
        let traced = self.trace.last_mut().expect("a command traced");
        traced.new_runs = after
            .runs
            .keys()
            .filter(|id| !before.runs.contains_key(*id))
            .cloned()
            .collect();
        traced.new_approvals = after
            .approvals
            .values()
            .filter(|a| !before.approvals.contains_key(&a.id))
            .map(|a| (a.id.clone(), a.run_id.clone()))
            .collect();
    }

    fn try_apply(&mut self, command: &Command) -> super::Result<Done> {
        match command.clone() {
            Command::CreateRun {
                hosted,
                idempotency_key,
                max_tool_calls,
                budget,
            } => self.create(hosted, idempotency_key, max_tool_calls, budget),
            Command::Turn {
                run,
                turn,
                calls,
                fence,
                reserve,
            } => self.turn(run, turn, calls, fence, reserve),
            Command::Start { step, offset } => self.start(step, offset),
            Command::Result { from, outcome } => self.result(from, outcome),
            Command::LoseLease { from } => self.lose_lease(from),
            Command::TimeOut { from } => self.time_out(from),
            Command::FailPending { step } => self.fail_pending(step),
            Command::Suspend { from, waiting_on } => self.suspend(from, waiting_on),
            Command::Ask { from, occurrence, text } => self.ask(from, occurrence, text),
            Command::Call { from, occurrence, call } => self.nested_call(from, occurrence, call),
            Command::Subagent {
                run,
                fence,
                by_call,
                seq,
                occurrence,
                session,
                input,
            } => self.subagent((run, fence, by_call), (seq, occurrence), session, input),
            Command::LocalStep {
                run,
                fence,
                seq,
                id,
                occurrence,
                ok,
                denied,
            } => self.local_step((run, fence), (seq, id, occurrence), (ok, denied)),
            Command::Answer { approval, approve } => self.answer(approval, approve),
            Command::ExpireApprovals => self.expire(),
            Command::CancelCall { step } => self.cancel_call(step),
            Command::EndRun { run, how } => self.end_run(run, how),
            Command::Abandon => self.abandon(),
            Command::Delete { run } => self.delete(run),
            Command::Prune => self.prune(),
        }
    }

    fn create(
        &mut self,
        hosted: bool,
        idempotency_key: Option<u8>,
        max_tool_calls: u8,
        budget: Option<(u8, u8, bool)>,
    ) -> super::Result<Done> {
        let mut new = new_run(hosted, idempotency_key.map(|k| format!("key-{k}")), max_tool_calls);
        new.budget = budget
            .map(|(calls, tenths, asks)| crate::machine::budget::Limit {
                max_calls: Some(u64::from(calls)),
                max_cost: Some(f64::from(tenths) / 10.0),
                // Room for a few attempts of the turns' 30 s timeouts, sometimes less than the calls.
                max_time_ms: Some(30_000 * u64::from(calls) + 10_000 * u64::from(tenths)),
                ask: asks.then(|| crate::machine::budget::Ask {
                    approvers: vec!["finance".into()],
                    timeout_ms: Some(5_000),
                    message: None,
                }),
                ..Default::default()
            })
            .into_iter()
            .collect();
        self.traced(Resolved::CreateRun(new.clone()));
        let (run, created, _) = create_run::apply(&mut self.memory, new)?;
        if !created {
            return Ok(Done::Refused);
        }
        self.runs.push(run.id);
        Ok(Done::Changed)
    }

    fn turn(
        &mut self,
        run: Target,
        turn: u8,
        calls: Vec<CallSpec>,
        fence: Sender,
        reserve: bool,
    ) -> super::Result<Done> {
        let run_id = self.run_id(run);
        let hosted = self.memory.state.runs.get(&run_id).is_some_and(|r| r.hosted);
        let fence = match (hosted, fence) {
            (true, from) => Some(self.fence(&run_id, from)),
            (false, Sender::Forged) => Some(self.fence(&run_id, Sender::Forged)),
            (false, _) => None,
        };
        let turn = u32::from(turn);
        let mut planned: Vec<PlannedCall> = calls
            .iter()
            .enumerate()
            .map(|(position, spec)| planned(turn, position as u32, *spec, &self.tools))
            .collect();
        // Two calls of one turn under one id are refused before the write.
        let mut ids = BTreeSet::new();
        planned.retain(|call| call.call_id.as_ref().is_none_or(|id| ids.insert(id.clone())));
        if reserve {
            // The scheduler reserves no slot for a call whose resource another holds.
            let mut locked: BTreeSet<String> = self.memory.state.locks.keys().cloned().collect();
            for call in &mut planned {
                let free = crate::resources::locks(&call.resources).all(|r| locked.insert(r.clone()));
                if free && call.tool.is_some() && matches!(call.gate, CallGate::Run { .. }) {
                    let mut start = self.start_of(&run_id, &call.key, 1);
                    // A call under a tool limit starts in the turn's write when the store has
                    // room for it (the scheduler's count may be wrong), else it is scheduled.
                    if call.tool_name == fetch_limit().tools {
                        start.limits = vec![fetch_limit()];
                    }
                    call.start = Some(start);
                }
            }
        }
        let plan = TurnPlan {
            offers_approval_tool: None,
            share: None,
            run_id: run_id.clone(),
            turn,
            calls: planned,
            available_tools: self.tools.iter().map(|t| t.name.clone()).collect(),
            default_timeout_ms: 30_000,
            max_pending_calls: 8,
            max_events: 10_000,
            fence,
            caller: None,
            max_concurrency: None,
        };
        // What the record says, whatever the command answers: a hosted handler that
        // reaches a recorded identity with another call diverged.
        let changed = hosted
            && plan.calls.iter().any(|call| {
                let recorded = self.memory.state.steps.get(&(run_id.clone(), call.key.clone()));
                recorded.is_some_and(|step| step.call_hash != call.call_hash)
            });
        self.traced(Resolved::Turn(plan.clone()));
        Ok(match turn_done(&run_id, submit_turn::apply(&mut self.memory, plan)?) {
            Done::Changed if changed => Done::Diverged(run_id),
            done => done,
        })
    }

    fn start(&mut self, step: u8, offset: i8) -> super::Result<Done> {
        let pending = self.steps(|s| s.status == StepStatus::Pending);
        let Some(step) = World::nth(&pending, step) else {
            return Ok(Done::Refused);
        };
        let attempt = (i64::from(step.attempts) + 1 + i64::from(offset)).max(1) as u32;
        let mut start = self.start_of(&step.run_id, &step.key, attempt);
        if step.tool == fetch_limit().tools {
            start.limits = vec![fetch_limit()];
        }
        self.traced(Resolved::Start(start.clone()));
        Ok(match start::apply(&mut self.memory, start)? {
            Some(_) => Done::Changed,
            // A start its budget cannot pay for settles the call instead, or parks it for a person
            // who may raise the budget: a change, not a refusal.
            None if {
                let now = &self.memory.state.steps[&(step.run_id.clone(), step.key.clone())];
                now.outcome == Some(crate::model::Outcome::BudgetExceeded) || now.status == StepStatus::AwaitingApproval
            } =>
            {
                Done::Changed
            }
            None => Done::Refused,
        })
    }

    fn result(&mut self, from: Sender, outcome: Reported) -> super::Result<Done> {
        let (dispatch_id, attempt, session_id) = self.sender(from, |_| true);
        let report = ResultReport {
            dispatch_id,
            attempt,
            session_id,
            outcome: match outcome {
                Reported::Ok => Ok("\"done\"".into()),
                Reported::Retryable => Err((ErrorKind::Retryable, "try again".into())),
                Reported::Fatal => Err((ErrorKind::Fatal, "broken".into())),
            },
            progress_count: 0,
        };
        let heard = self.heard(&report.dispatch_id, report.attempt, Some(&report.session_id));
        self.traced(Resolved::Result(report.clone()));
        Ok(match result::apply(&mut self.memory, report)? {
            Some(_) => heard,
            None => Done::Refused,
        })
    }

    fn lose_lease(&mut self, from: Sender) -> super::Result<Done> {
        let (dispatch_id, attempt, _) = self.sender(from, |_| true);
        self.note_unknown(&dispatch_id, attempt);
        let loss = LeaseLoss {
            dispatch_id,
            attempt,
            reason: "worker disconnected".into(),
        };
        let heard = self.heard(&loss.dispatch_id, loss.attempt, None);
        self.traced(Resolved::LoseLease(loss.clone()));
        Ok(match lose_lease::apply(&mut self.memory, loss)? {
            LossOutcome::NotHeld => Done::Refused,
            _ => heard,
        })
    }

    fn time_out(&mut self, from: Sender) -> super::Result<Done> {
        let (dispatch_id, attempt, _) = self.sender(from, |_| true);
        self.note_unknown(&dispatch_id, attempt);
        let heard = self.heard(&dispatch_id, attempt, None);
        self.traced(Resolved::TimeOut(dispatch_id.clone(), attempt));
        Ok(match time_out::time_out(&mut self.memory, &dispatch_id, attempt)? {
            Some(_) => heard,
            None => Done::Refused,
        })
    }

    fn fail_pending(&mut self, step: u8) -> super::Result<Done> {
        let pending = self.steps(|s| s.status == StepStatus::Pending);
        let Some(step) = World::nth(&pending, step) else {
            return Ok(Done::Refused);
        };
        let why = ("no_worker", Outcome::NoWorker);
        self.traced(Resolved::FailPending(step.run_id.clone(), step.key.clone()));
        Ok(
            match time_out::fail_pending(&mut self.memory, (&step.run_id, &step.key), "no worker took it", why)? {
                Some(_) => Done::Changed,
                None => Done::Refused,
            },
        )
    }

    fn suspend(&mut self, from: Sender, waiting_on: Vec<Option<u8>>) -> super::Result<Done> {
        let (dispatch_id, attempt, session_id) = self.sender(from, |_| true);
        let run = self
            .memory
            .state
            .steps
            .values()
            .find(|s| s.dispatch_id.as_ref() == Some(&dispatch_id));
        let siblings: Vec<StepKey> = run.map_or(Vec::new(), |held| {
            self.steps(|s| s.run_id == held.run_id && s.key != held.key)
                .into_iter()
                .map(|s| s.key)
                .collect()
        });
        let waiting_on = waiting_on
            .iter()
            .map(|n| match n.and_then(|n| World::nth(&siblings, n)) {
                Some(key) => key.as_str().to_owned(),
                None => "step:never#0".to_owned(),
            })
            .collect();
        let report = SuspendReport {
            dispatch_id,
            attempt,
            session_id,
            waiting_on,
        };
        let heard = self.heard(&report.dispatch_id, report.attempt, Some(&report.session_id));
        self.traced(Resolved::Suspend(report.clone()));
        Ok(match suspend::apply(&mut self.memory, report)? {
            Some(_) => heard,
            None => Done::Refused,
        })
    }

    fn subagent(
        &mut self,
        (run, fence, by_call): (Target, Sender, bool),
        (seq, occurrence): (u8, u8),
        session: Option<u8>,
        input: u8,
    ) -> super::Result<Done> {
        let (parent, fence) = if by_call {
            let (dispatch_id, attempt, _) = self.sender(fence, |s| s.kind == StepKind::Tool);
            let parent = self
                .memory
                .state
                .steps
                .values()
                .find(|s| s.dispatch_id.as_ref() == Some(&dispatch_id))
                .map_or_else(|| self.run_id(run), |s| s.run_id.clone());
            (parent, Fence { dispatch_id, attempt })
        } else {
            let parent = self.hosted_run_id(run);
            let fence = self.fence(&parent, fence);
            (parent, fence)
        };
        let mut child = new_run(true, None, 0);
        child.agent = "helper".into();
        child.hosted = Some(agent("helper"));
        child.input = format!("{{\"q\":{input}}}");
        child.session_key = session.map(|s| format!("session-{s}"));
        let start = SubagentStart {
            parent: parent.clone(),
            fence,
            seq: u32::from(seq),
            occurrence: u32::from(occurrence),
            child,
        };
        // A fence naming one of the run's calls in flight starts a tool body's subagent, whatever
        // the command meant; only a handler's start at a recorded place can diverge.
        let fence = &start.fence;
        let body = self.steps(|s| {
            s.kind == StepKind::Tool && s.run_id == parent && dispatch::held(s, &fence.dispatch_id, fence.attempt, None)
        });
        let key = StepKey::subagent("helper", start.occurrence);
        let recorded = self.memory.state.steps.get(&(parent.clone(), key));
        let changed = body.is_empty() && recorded.is_some_and(|step| step.arguments != start.child.input);
        self.traced(Resolved::Subagent(start.clone()));
        let (recorded, _) = start_subagent::apply(&mut self.memory, start)?;
        self.note_children();
        Ok(match recorded_done(&parent, recorded) {
            Done::Changed | Done::Refused if changed => Done::Diverged(parent),
            done => done,
        })
    }

    fn local_step(
        &mut self,
        (run, fence): (Target, Sender),
        (seq, id, occurrence): (u8, u8, u8),
        (ok, denied): (bool, bool),
    ) -> super::Result<Done> {
        let run_id = self.hosted_run_id(run);
        let fence = self.fence(&run_id, fence);
        let step_id = format!("s{id}");
        // As `grpc::hosted`: a step the policy denies is recorded as denied, whatever the
        // handler reports.
        let (outcome, decided_by) = match (denied, ok) {
            (true, _) => (Err(format!("step:{step_id} not allowed")), Some(DENY_RULE.to_owned())),
            (false, true) => (Ok("1".to_owned()), None),
            (false, false) => (Err("it broke".to_owned()), None),
        };
        let local = LocalStep {
            seq: u32::from(seq),
            step_id,
            occurrence: u32::from(occurrence),
            effect: Effect::Write,
            once: false,
            outcome,
            decided_by,
            denied,
            blocked: false,
        };
        self.traced(Resolved::LocalStep(run_id.clone(), fence.clone(), local.clone()));
        Ok(recorded_done(
            &run_id,
            local_step::record(&mut self.memory, (&run_id, &fence), local, StepGate::Unchecked)?,
        ))
    }

    /// A question from a tool body or, when the dispatch is a hosted run's own, from its handler
    /// (at a place the text picks, which may hold something else); an odd text gives a default.
    fn nested_call(&mut self, from: Sender, occurrence: u8, spec: CallSpec) -> super::Result<Done> {
        let (dispatch_id, attempt, _) = self.sender(from, |s| s.kind == StepKind::Tool);
        let caller = (self.memory.state.steps.values())
            .find(|s| s.dispatch_id.as_ref() == Some(&dispatch_id))
            .cloned();
        let (run_id, caller_key, place) = match &caller {
            Some(caller) => (
                caller.run_id.clone(),
                caller.key.clone(),
                (caller.turn, caller.position),
            ),
            None => (self.run_id(Target::Forged), StepKey::for_call(0, 0, None), (0, 0)),
        };
        let mut call = planned(place.0, place.1, spec, &self.tools);
        call.key = StepKey::nested_call(&caller_key, u32::from(occurrence));
        call.call_id = None;
        let plan = TurnPlan {
            offers_approval_tool: None,
            share: None,
            run_id: run_id.clone(),
            turn: place.0,
            calls: vec![call],
            available_tools: self.tools.iter().map(|t| t.name.clone()).collect(),
            default_timeout_ms: 30_000,
            max_pending_calls: 8,
            max_events: 10_000,
            fence: Some(Fence { dispatch_id, attempt }),
            caller: Some(caller_key),
            max_concurrency: None,
        };
        self.traced(Resolved::Turn(plan.clone()));
        let recorded = submit_turn::apply(&mut self.memory, plan)?;
        // Another call at a recorded call's place is the body's to read (replay_input_changed):
        // nothing is recorded and the run goes on, unlike a handler's divergence.
        let diverged = (recorded.calls.iter()).any(|call| matches!(call, CallDisposition::Diverged { .. }));
        Ok(if diverged { Done::Refused } else { Done::Changed })
    }

    fn ask(&mut self, from: Sender, occurrence: u8, text: u8) -> super::Result<Done> {
        let (dispatch_id, attempt, _) = self.sender(from, |s| matches!(s.kind, StepKind::Tool | StepKind::Agent));
        let run = self
            .memory
            .state
            .steps
            .values()
            .find(|s| s.dispatch_id.as_ref() == Some(&dispatch_id))
            .map_or_else(|| self.run_id(Target::Forged), |s| s.run_id.clone());
        let ask = PersonAsk {
            run: run.clone(),
            fence: Some(Fence { dispatch_id, attempt }),
            question_id: String::new(),
            seq: u32::from(text % 3),
            occurrence: u32::from(occurrence),
            asked: Asked {
                question: format!("question {text}?"),
                schema: r#"{"type":"integer"}"#.into(),
                approvers: vec!["ops".into()],
                timeout_ms: Some(5_000),
                choices: Vec::new(),
                default: (text % 2 == 1).then(|| "7".to_owned()),
            },
        };
        self.traced(Resolved::Ask(ask.clone()));
        Ok(recorded_done(&run, ask_person::apply(&mut self.memory, ask)?))
    }

    fn answer(&mut self, approval: Option<u8>, approve: bool) -> super::Result<Done> {
        let ids: Vec<ApprovalId> = self.memory.state.approvals.keys().cloned().collect();
        let id = approval
            .and_then(|n| World::nth(&ids, n))
            .unwrap_or_else(|| "forged-approval".into());
        let question = self.memory.state.approvals.get(&id).is_some_and(|a| a.is_question());
        let raising = (self.memory.state.approvals.get(&id))
            .is_some_and(|a| crate::machine::budget::raised_by(&a.decided_by).is_some());
        let answer = match (approve, question) {
            (true, _) if raising => Answer::Approve {
                given: Some(r#"{"max_calls":250,"max_cost":25.5,"max_time_ms":900000}"#.into()),
            },
            (true, true) => Answer::Approve {
                given: Some("7".into()),
            },
            (true, false) => Answer::Approve { given: None },
            (false, _) => Answer::Reject,
        };
        self.traced(Resolved::Answer(id.clone(), answer.clone()));
        answer_approval::answer(&mut self.memory, &id, answer, ("alice", None))?;
        Ok(Done::Changed)
    }

    fn expire(&mut self) -> super::Result<Done> {
        self.traced(Resolved::ExpireApprovals);
        let answered = answer_approval::expire(&mut self.memory)?;
        Ok(if answered.approvals.is_empty() {
            Done::Refused
        } else {
            Done::Changed
        })
    }

    fn cancel_call(&mut self, step: u8) -> super::Result<Done> {
        let steps = self.steps(|_| true);
        let Some(step) = World::nth(&steps, step) else {
            return Ok(Done::Refused);
        };
        self.traced(Resolved::CancelCall(step.run_id.clone(), step.key.clone()));
        cancel_call::cancel(&mut self.memory, (&step.run_id, &step.key), "the user cancelled it")?;
        Ok(Done::Changed)
    }

    fn end_run(&mut self, run: Target, how: How) -> super::Result<Done> {
        let run_id = self.run_id(run);
        let end = match how {
            How::Complete => EndRun::Complete {
                output: "\"finished\"".into(),
                settle_in_flight: false,
            },
            How::Fail => EndRun::Fail {
                reason: "the agent gave up".into(),
            },
            How::Cancel => EndRun::Cancel {
                reason: "the user cancelled it".into(),
            },
        };
        self.traced(Resolved::EndRun(run_id.clone(), end.clone()));
        end_run::end(&mut self.memory, &run_id, end)?;
        Ok(Done::Changed)
    }

    fn abandon(&mut self) -> super::Result<Done> {
        self.traced(Resolved::Abandon);
        let ended = end_run::abandon(&mut self.memory, 60_000, 10)?;
        Ok(if ended.is_empty() { Done::Refused } else { Done::Changed })
    }

    fn delete(&mut self, run: Target) -> super::Result<Done> {
        let run_id = self.run_id(run);
        self.traced(Resolved::Delete(run_id.clone()));
        delete::delete(&mut self.memory, &run_id)?;
        Ok(Done::Changed)
    }

    fn prune(&mut self) -> super::Result<Done> {
        let before = self.memory.now - 30_000;
        self.traced(Resolved::Prune(before));
        let deleted = delete::prune(&mut self.memory, before, 10)?;
        Ok(if deleted.runs == 0 {
            Done::Refused
        } else {
            Done::Changed
        })
    }

    /// What a message from `(dispatch_id, attempt)` of `session` that changed something did:
    /// [`Done::Changed`] if that attempt held a running step (on that session, when it says),
    /// [`Done::Heard`] if it held none.
    fn heard(&self, dispatch_id: &DispatchId, attempt: u32, session: Option<&SessionId>) -> Done {
        let holds = self.memory.state.steps.values().any(|step| {
            step.status == StepStatus::Running
                && step.dispatch_id.as_ref() == Some(dispatch_id)
                && step.attempts == attempt
                && session.is_none_or(|session| step.session_id.as_ref() == Some(session))
        });
        if holds {
            Done::Changed
        } else {
            Done::Heard(format!(
                "dispatch {dispatch_id} attempt {attempt} of session {session:?}"
            ))
        }
    }

    fn traced(&mut self, command: Resolved) {
        self.trace.push(Traced {
            now: self.memory.now,
            command,
            new_runs: Vec::new(),
            new_approvals: Vec::new(),
        });
    }

    /// Notes an `at_most_once` step whose running attempt is about to end with its effect unknown.
    fn note_unknown(&mut self, dispatch_id: &DispatchId, attempt: u32) {
        if let Some(step) = self.memory.state.steps.values().find(|s| {
            s.dispatch_id.as_ref() == Some(dispatch_id)
                && s.attempts == attempt
                && s.status == StepStatus::Running
                && s.idempotency == Idempotency::AtMostOnce
                && s.kind == StepKind::Tool
        }) {
            self.unknown.insert((step.run_id.clone(), step.key.clone()));
        }
    }

    /// Subagents' runs, once created, are runs later commands may name.
    fn note_children(&mut self) {
        for id in self.memory.state.runs.keys() {
            if !self.runs.contains(id) {
                self.runs.push(id.clone());
            }
        }
    }
}

fn agent(name: &str) -> HostedAgent {
    HostedAgent {
        name: name.into(),
        fingerprint: format!("fp-{name}"),
        version: "1".into(),
    }
}

/// A run as `grpc::runs` creates it (a hosted one of agent `researcher`).
fn new_run(hosted: bool, idempotency_key: Option<String>, max_tool_calls: u8) -> NewRun {
    NewRun {
        agent: if hosted { "researcher" } else { "billing" }.into(),
        idempotency_key,
        max_tool_calls: u32::from(max_tool_calls),
        hosted: hosted.then(|| agent("researcher")),
        ..crate::machine::records::new_run()
    }
}

fn turn_done(run: &RunId, recorded: RecordedTurn) -> Done {
    let diverged = recorded.ended_because == Some("replay_input_changed")
        || recorded
            .calls
            .iter()
            .any(|call| matches!(call, CallDisposition::Diverged { .. }));
    if diverged {
        Done::Diverged(run.clone())
    } else {
        Done::Changed
    }
}

fn recorded_done(run: &RunId, recorded: StepRecorded) -> Done {
    match recorded {
        StepRecorded::Diverged { .. } => Done::Diverged(run.clone()),
        StepRecorded::Replayed(_) | StepRecorded::Allowed { .. } => Done::Refused,
        _ => Done::Changed,
    }
}

// ---------------------------------------------------------------------------------------------
// The properties.

/// Events that settle a step, once.
const STEP_TERMINAL: [EventType; 5] = [
    EventType::ToolResult,
    EventType::ToolDenied,
    EventType::AgentResult,
    EventType::StepResult,
    EventType::SubagentResult,
];
const RUN_TERMINAL: [EventType; 3] = [EventType::RunCompleted, EventType::RunFailed, EventType::RunCancelled];
/// Events about a hosted run's own dispatch.
const DISPATCH_EVENTS: [EventType; 5] = [
    EventType::AgentDispatched,
    EventType::AgentSuspended,
    EventType::AgentResumed,
    EventType::AgentLeaseLost,
    EventType::AgentResult,
];

/// The step an event names: its payload's `step_key`, else the step appended with it.
fn event_step(event: &super::memory::Logged) -> Option<StepKey> {
    match event.payload["step_key"].as_str() {
        Some(key) => Some(StepKey::from_stored(key.to_owned())),
        None => event.step.clone(),
    }
}

/// Whether a refusal (or an error) changed nothing at all.
fn unchanged(before: &State, after: &State, done: &Done) -> Result<(), TestCaseError> {
    let refusal = match done {
        Done::Refused => "a refusal".to_owned(),
        Done::Failed(error) => format!("error '{error}'"),
        Done::Changed | Done::Diverged(_) | Done::Heard(_) => return Ok(()),
    };
    prop_assert!(
        before == after,
        "{} changed the records:\n{}",
        refusal,
        diff(before, after)
    );
    Ok(())
}

/// The rows that differ between two states, for a failure's message.
fn diff(before: &State, after: &State) -> String {
    let mut out = String::new();
    for (key, step) in &after.steps {
        if before.steps.get(key) != Some(step) {
            out.push_str(&format!(
                "step {}: {:?} -> {:?}\n",
                key.1,
                before.steps.get(key).map(|s| s.status),
                step.status
            ));
        }
    }
    for (id, run) in &after.runs {
        if before.runs.get(id) != Some(run) {
            out.push_str(&format!(
                "run {id}: {:?} -> {:?}\n",
                before.runs.get(id).map(|r| r.status),
                run.status
            ));
        }
    }
    for (id, log) in &after.log {
        let seen = before.log.get(id).map_or(0, Vec::len);
        for event in log.iter().skip(seen) {
            out.push_str(&format!("+ {} {}\n", event.kind, event.payload));
        }
    }
    out
}

/// Invariant 1 and 2 of the log: each run's events are 1..n, one terminal event per settled step
/// and per ended run, and nothing after a run's end.
fn log_is_whole(state: &State) -> Result<(), TestCaseError> {
    for (id, run) in &state.runs {
        let log = state.log.get(id).map_or(&[][..], Vec::as_slice);
        for (index, event) in log.iter().enumerate() {
            prop_assert_eq!(event.seq, index as u64 + 1, "run {}'s events have a gap", id);
        }
        prop_assert_eq!(run.last_seq, log.len() as u64, "run {}'s last_seq is not its log's", id);
        let ends: Vec<usize> = (0..log.len())
            .filter(|&i| RUN_TERMINAL.contains(&log[i].kind))
            .collect();
        if run.status.is_terminal() {
            prop_assert_eq!(ends.len(), 1, "ended run {} has {} terminal events", id, ends.len());
            prop_assert_eq!(
                ends[0],
                log.len() - 1,
                "run {} logged {:?} after its end",
                id,
                log.last().map(|e| e.kind)
            );
        } else {
            prop_assert!(ends.is_empty(), "run {} is {} with a terminal event", id, run.status);
        }
        let mut settles: BTreeMap<StepKey, usize> = BTreeMap::new();
        for event in log.iter().filter(|e| STEP_TERMINAL.contains(&e.kind)) {
            let key = event_step(event);
            prop_assert!(key.is_some(), "a {} of run {} names no step", event.kind, id);
            *settles.entry(key.expect("checked")).or_default() += 1;
        }
        for ((_, key), step) in state.steps.range((id.clone(), StepKey::from_stored(String::new()))..) {
            if step.run_id != *id {
                break;
            }
            let count = settles.remove(key).unwrap_or(0);
            let want = usize::from(step.status.is_terminal());
            prop_assert_eq!(
                count,
                want,
                "step {} of run {} is {} with {} terminal events",
                key,
                id,
                step.status,
                count
            );
        }
        prop_assert!(
            settles.is_empty(),
            "run {} settled steps it does not hold: {:?}",
            id,
            settles
        );
    }
    prop_assert!(
        state.log.keys().all(|id| state.runs.contains_key(id)),
        "a log outlived its run"
    );
    Ok(())
}

/// Invariant 2: a settled step never changes again (but for the count of its replays); attempt
/// numbers never go back; and each attempt started once.
fn steps_move_forward(
    before: &State,
    after: &State,
    unknown: &BTreeSet<(RunId, StepKey)>,
) -> Result<(), TestCaseError> {
    for (id, was) in &before.steps {
        let Some(now) = after.steps.get(id) else { continue };
        prop_assert!(now.attempts >= was.attempts, "step {}'s attempts went back", id.1);
        if was.status.is_terminal() {
            let mut now = now.clone();
            now.replays = was.replays;
            prop_assert!(
                &now == was,
                "settled step {} changed: {:?} -> {:?}",
                id.1,
                was.status,
                now.status
            );
        }
    }
    for (run, log) in &after.log {
        let mut started: BTreeMap<StepKey, u64> = BTreeMap::new();
        for event in log
            .iter()
            .filter(|e| matches!(e.kind, EventType::ToolStart | EventType::AgentDispatched))
        {
            let key = event_step(event).expect("a start names its step");
            let attempt = event.payload["attempt"].as_u64().expect("a start names its attempt");
            let last = started.insert(key.clone(), attempt).unwrap_or(0);
            prop_assert!(
                attempt > last,
                "step {} of run {} started attempt {} after {}",
                key,
                run,
                attempt,
                last
            );
        }
    }
    for (run, key) in unknown {
        if let Some(step) = after.steps.get(&(run.clone(), key.clone())) {
            prop_assert!(
                step.status.is_terminal(),
                "at_most_once step {} is {} after an attempt whose effect is unknown",
                key,
                step.status
            );
        }
    }
    Ok(())
}

/// Rule 1: a hosted handler's divergence failed its run in the same command.
fn divergence_fails_the_run(after: &State, done: &Done) -> Result<(), TestCaseError> {
    if let Done::Diverged(run) = done
        && let Some(run) = after.runs.get(run)
        && run.hosted
    {
        prop_assert_eq!(
            run.status,
            RunStatus::Failed,
            "hosted run {} diverged and is {}",
            run.id,
            run.status
        );
    }
    Ok(())
}

/// Rules 2 and 6: no suspended dispatch waits on a step that settled, or on a session whose
/// earlier runs all ended; a hosted run woken last is not suspended.
/// A call settled for good leaves nothing it began open: its questions are withdrawn, and the
/// calls its body made through the kernel settled (cancelled), theirs too.
fn nothing_open_under_a_settled_call(state: &State) -> Result<(), TestCaseError> {
    for step in state.steps.values().filter(|s| !s.status.is_terminal()) {
        let Some(caller) = step.key.caller().or_else(|| step.key.asking_call()) else {
            continue;
        };
        let settled = state
            .steps
            .get(&(step.run_id.clone(), caller.clone()))
            .is_some_and(|c| c.kind == StepKind::Tool && c.status.is_terminal());
        prop_assert!(
            !settled,
            "step {} of run {} is {} though its caller {} has settled",
            step.key,
            step.run_id,
            step.status,
            caller
        );
    }
    Ok(())
}

fn no_lost_wakeup(state: &State) -> Result<(), TestCaseError> {
    for step in state.steps.values().filter(|s| s.status == StepStatus::Suspended) {
        let log = state.log.get(&step.run_id).map_or(&[][..], Vec::as_slice);
        let suspension = log.iter().rev().find(|e| {
            matches!(e.kind, EventType::AgentSuspended | EventType::ToolSuspended)
                && event_step(e).as_ref() == Some(&step.key)
        });
        prop_assert!(
            suspension.is_some(),
            "step {} is suspended with no suspension event",
            step.key
        );
        let payload = &suspension.expect("checked").payload;
        if let Some(session) = payload["session"].as_str() {
            let first = state
                .runs
                .values()
                .find(|r| r.session_key.as_deref() == Some(session) && !r.status.is_terminal());
            prop_assert!(
                first.is_some_and(|r| r.id != step.run_id),
                "run {} waits on session {} with no run before it",
                step.run_id,
                session
            );
        }
        for key in payload["waiting_on"].as_array().into_iter().flatten() {
            let key = StepKey::from_stored(key.as_str().unwrap_or_default().to_owned());
            let awaited = state.steps.get(&(step.run_id.clone(), key.clone()));
            prop_assert!(
                awaited.is_none_or(|s| !s.status.is_terminal()),
                "step {} of run {} stays suspended though {} settled",
                step.key,
                step.run_id,
                key
            );
        }
    }
    for run in state.runs.values().filter(|r| r.hosted) {
        let log = state.log.get(&run.id).map_or(&[][..], Vec::as_slice);
        let last = log.iter().rev().find(|e| DISPATCH_EVENTS.contains(&e.kind));
        if last.is_some_and(|e| e.kind == EventType::AgentResumed) {
            prop_assert!(
                run.status != RunStatus::Suspended,
                "run {} resumed but reads suspended",
                run.id
            );
        }
    }
    Ok(())
}

/// Rule 4: nothing a deny rule decided ran.
fn denied_never_ran(state: &State) -> Result<(), TestCaseError> {
    for step in state.steps.values() {
        if step.decided_by.as_deref() == Some(DENY_RULE) {
            prop_assert!(
                step.status == StepStatus::Failed && step.outcome == Some(Outcome::Denied),
                "step {} decided by {} is {} ({:?})",
                step.key,
                DENY_RULE,
                step.status,
                step.outcome
            );
        }
    }
    Ok(())
}

/// Rule 5: a cached result stays while a run that stored it or was served from it remains; and
/// each such run is among its owners.
fn cache_outlives_its_runs(before: &State, after: &State) -> Result<(), TestCaseError> {
    for (hash, owner) in &before.cache_runs {
        if after.runs.contains_key(owner) && before.cache.contains_key(hash) {
            prop_assert!(
                after.cache.contains_key(hash),
                "cached result {} went while run {} that holds it remains",
                hash,
                owner
            );
        }
    }
    for step in after.steps.values() {
        if step.kind == StepKind::Tool && step.cache_ttl_ms.is_some() && step.status == StepStatus::Succeeded {
            prop_assert!(
                after
                    .cache_runs
                    .contains(&(step.call_hash.clone(), step.run_id.clone())),
                "run {} got {}'s result through the cache but does not own it",
                step.run_id,
                step.key
            );
        }
    }
    Ok(())
}

fn check(before: &State, world: &World, done: &Done) -> Result<(), TestCaseError> {
    let after = &world.memory.state;
    if let Done::Heard(sender) = done {
        prop_assert!(false, "a message from {} was heard though it held no step", sender);
    }
    unchanged(before, after, done)?;
    log_is_whole(after)?;
    steps_move_forward(before, after, &world.unknown)?;
    divergence_fails_the_run(after, done)?;
    no_lost_wakeup(after)?;
    nothing_open_under_a_settled_call(after)?;
    denied_never_ran(after)?;
    budgets_hold(after)?;
    limits_hold(after)?;
    cache_outlives_its_runs(before, after)
}

/// A tool limit holds: its slots are held exactly by the running calls whose start passed it, never
/// more than it allows at once, and its bucket holds between none and a burst of tokens.
fn limits_hold(state: &State) -> Result<(), TestCaseError> {
    let limit = fetch_limit();
    let prefix = limit.slot_prefix();
    let holders: Vec<(RunId, StepKey)> = state
        .locks
        .iter()
        .filter(|(name, _)| name.starts_with(&prefix))
        .map(|(_, lock)| (lock.run.clone(), lock.key.clone()))
        .collect();
    prop_assert!(
        holders.len() <= limit.at_once.unwrap_or(u32::MAX) as usize,
        "{} slots of {} held: {:?}",
        holders.len(),
        limit.describe(),
        holders
    );
    // Every start of the tool passes its limit, from the queue or in its turn's write.
    let running: Vec<(RunId, StepKey)> = state
        .steps
        .values()
        .filter(|s| s.status == StepStatus::Running && s.kind == StepKind::Tool && s.tool == limit.tools)
        .map(|s| (s.run_id.clone(), s.key.clone()))
        .collect();
    let mut sorted = holders.clone();
    sorted.sort();
    prop_assert_eq!(
        sorted,
        running,
        "the slots' holders are the running calls of the limited tool"
    );
    if let Some(bucket) = state.buckets.get(&limit.tools) {
        prop_assert!(
            (0.0..=limit.burst()).contains(&bucket.tokens),
            "bucket {:?} of {}",
            bucket,
            limit.describe()
        );
    }
    Ok(())
}

/// Rule 6: a budget is never passed, and what it counts is exactly what started: each call of its
/// run (and of the subagents under it) that had an attempt, each attempt at its price, and the
/// timeout of each attempt running held against its time.
fn budgets_hold(state: &State) -> Result<(), TestCaseError> {
    for run in state.runs.values() {
        let Some(budget) = &run.budget else { continue };
        prop_assert!(
            crate::machine::budget::overspent(run).is_none(),
            "run {} spent past its budget: {:?}",
            run.id,
            budget
        );
        let covered = |id: &RunId| {
            let mut at = state.runs.get(id);
            while let Some(r) = at {
                if r.id == run.id {
                    return true;
                }
                at = crate::machine::budget::next_account(r).and_then(|parent| state.runs.get(parent));
            }
            false
        };
        let started: Vec<&StepRecord> = state
            .steps
            .values()
            .filter(|s| s.kind == StepKind::Tool && s.attempts > 0 && covered(&s.run_id))
            .collect();
        let cost: f64 = started.iter().map(|s| s.unit_cost * f64::from(s.attempts)).sum();
        let held: u64 = (started.iter())
            .filter(|s| s.status == StepStatus::Running)
            .map(|s| s.timeout_ms)
            .sum();
        for limit in &budget.limits {
            prop_assert_eq!(limit.spent.reserved_ms, held, "time held by run {}", run.id);
            prop_assert_eq!(
                limit.spent.calls,
                started.len() as u64,
                "calls counted by run {}",
                run.id
            );
            prop_assert!(
                (limit.spent.cost - cost).abs() < 1e-9,
                "run {} counted cost {} for attempts costing {}",
                run.id,
                limit.spent.cost,
                cost
            );
        }
    }
    Ok(())
}

/// Runs `commands` from an empty store, checking every property after each.
fn run_all(commands: &[Timed]) -> Result<(), TestCaseError> {
    let mut world = World::new();
    for (index, timed) in commands.iter().enumerate() {
        world.memory.now += Millis::from(timed.after_ms);
        let before = world.memory.state.clone();
        let done = world.apply(&timed.command);
        world.memory.finish();
        check(&before, &world, &done).map_err(|failure| {
            TestCaseError::fail(format!("after command {index} ({:?}): {failure}", timed.command))
        })?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn whole_commands_keep_the_invariants(commands in commands(40)) {
        run_all(&commands)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Cases the properties found, kept as they shrank.

fn now(command: Command) -> Timed {
    Timed { after_ms: 0, command }
}

fn lookups(turn: u8, calls: usize) -> Command {
    Command::Turn {
        run: Target::Known(0),
        turn,
        calls: vec![
            CallSpec {
                tool: 0,
                arg: 0,
                call_id: None,
            };
            calls
        ],
        fence: Sender::Current(0),
        reserve: true,
    }
}

/// Rule 2: a tool body waits only on its own subagents, whose settle wakes it. A suspension
/// naming a sibling call (which wakes no one when it settles) left the call suspended for good.
#[test]
fn a_call_may_not_wait_on_a_step_whose_settle_would_not_wake_it() {
    let external = Command::CreateRun {
        hosted: false,
        idempotency_key: None,
        max_tool_calls: 0,
        budget: None,
    };
    let mut world = World::new();
    for command in [external, lookups(0, 2)] {
        world.apply(&command);
    }
    let before = world.memory.state.clone();
    let suspended = world.apply(&Command::Suspend {
        from: Sender::Current(0),
        waiting_on: vec![Some(0)],
    });
    assert!(matches!(suspended, Done::Failed(_)), "{suspended:?}");
    assert!(before == world.memory.state, "a refused suspension changed nothing");
    run_all(&[
        now(Command::CreateRun {
            hosted: false,
            idempotency_key: None,
            max_tool_calls: 0,
            budget: None,
        }),
        now(lookups(0, 1)),
        now(lookups(1, 2)),
        now(Command::Suspend {
            from: Sender::Current(0),
            waiting_on: vec![Some(1)],
        }),
        now(Command::Result {
            from: Sender::Current(0),
            outcome: Reported::Ok,
        }),
    ])
    .unwrap();
}

/// Two external runs and a hosted one (the second) whose handler holds its dispatch.
fn started_hosted() -> Vec<Timed> {
    let create = |hosted| {
        now(Command::CreateRun {
            hosted,
            idempotency_key: None,
            max_tool_calls: 0,
            budget: None,
        })
    };
    vec![
        create(false),
        create(true),
        create(false),
        now(Command::Start { step: 0, offset: 0 }),
    ]
}

/// Rule 1: a hosted handler that reaches a recorded place with the same identities but another
/// call there diverged; its run stayed running, and the handler could complete it.
#[test]
fn a_handler_changing_a_recorded_call_fails_its_run() {
    let call = |tool| CallSpec {
        tool,
        arg: 0,
        call_id: None,
    };
    let turn = |calls| Command::Turn {
        run: Target::Known(1),
        turn: 1,
        calls,
        fence: Sender::Current(0),
        reserve: false,
    };
    let mut commands = started_hosted();
    commands.extend([now(turn(vec![call(0), call(0)])), now(turn(vec![call(0), call(1)]))]);
    run_all(&commands).unwrap();
}

/// Rule 1: a subagent started again at its recorded place with another input diverged; it was
/// answered with the recorded child, and the run went on.
#[test]
fn a_handler_changing_a_subagents_input_fails_its_run() {
    let subagent = |input| Command::Subagent {
        run: Target::Known(0),
        fence: Sender::Current(0),
        by_call: false,
        seq: 0,
        occurrence: 0,
        session: None,
        input,
    };
    let mut commands = started_hosted();
    commands.extend([now(subagent(0)), now(subagent(1))]);
    run_all(&commands).unwrap();
}

/// Rule 5: a run deleted after another was served its cached result leaves the entry to it.
#[test]
fn deleting_a_run_leaves_the_cached_result_another_relies_on() {
    let lookup = |run| Command::Turn {
        run: Target::Known(run),
        turn: 0,
        calls: vec![CallSpec {
            tool: 0,
            arg: 0,
            call_id: None,
        }],
        fence: Sender::Current(0),
        reserve: true,
    };
    let mut commands = started_hosted();
    commands.extend([
        now(lookup(0)),
        now(Command::Result {
            from: Sender::Current(0),
            outcome: Reported::Ok,
        }),
        now(lookup(2)),
        now(Command::EndRun {
            run: Target::Known(0),
            how: How::Complete,
        }),
        now(Command::Delete { run: Target::Known(0) }),
    ]);
    run_all(&commands).unwrap();
    // The case reaches what it is about: the run that stored the entry is gone, the other owns it.
    let mut world = World::new();
    for timed in &commands {
        world.apply(&timed.command);
    }
    assert_eq!(world.memory.state.runs.len(), 2, "the first run is deleted");
    assert_eq!(world.memory.state.cache_runs.len(), 1, "the other run owns the entry");
}

// ---------------------------------------------------------------------------------------------
// Replays: the commands of a case as they reached the records, for another store to run.

/// A command with its inputs as resolved against the in-memory records.
#[derive(Clone, Debug)]
pub(crate) enum Resolved {
    CreateRun(NewRun),
    Turn(TurnPlan),
    Start(StartDispatch),
    Result(ResultReport),
    LoseLease(LeaseLoss),
    TimeOut(DispatchId, u32),
    FailPending(RunId, StepKey),
    Suspend(SuspendReport),
    Subagent(SubagentStart),
    Ask(PersonAsk),
    LocalStep(RunId, Fence, LocalStep),
    Answer(ApprovalId, Answer),
    ExpireApprovals,
    CancelCall(RunId, StepKey),
    EndRun(RunId, EndRun),
    Abandon,
    Delete(RunId),
    Prune(Millis),
}

/// A command of a case, the time it ran at, and the runs and approvals it created (in memory).
#[derive(Clone, Debug)]
pub(crate) struct Traced {
    pub now: Millis,
    pub command: Resolved,
    pub new_runs: Vec<RunId>,
    pub new_approvals: Vec<(ApprovalId, RunId)>,
}

impl Resolved {
    /// Runs the command against `records`, as the properties ran it.
    pub(crate) fn apply<R: super::Records + ?Sized>(self, records: &mut R) -> super::Result<()> {
        match self {
            Resolved::CreateRun(new) => drop(create_run::apply(records, new)?),
            Resolved::Turn(plan) => drop(submit_turn::apply(records, plan)?),
            Resolved::Start(start) => drop(start::apply(records, start)?),
            Resolved::Result(report) => drop(result::apply(records, report)?),
            Resolved::LoseLease(loss) => drop(lose_lease::apply(records, loss)?),
            Resolved::TimeOut(dispatch_id, attempt) => drop(time_out::time_out(records, &dispatch_id, attempt)?),
            Resolved::FailPending(run, key) => {
                let why = ("no_worker", Outcome::NoWorker);
                drop(time_out::fail_pending(records, (&run, &key), "no worker took it", why)?)
            }
            Resolved::Suspend(report) => drop(suspend::apply(records, report)?),
            Resolved::Subagent(start) => drop(start_subagent::apply(records, start)?),
            Resolved::Ask(ask) => drop(ask_person::apply(records, ask)?),
            Resolved::LocalStep(run, fence, local) => {
                drop(local_step::record(records, (&run, &fence), local, StepGate::Unchecked)?)
            }
            Resolved::Answer(id, answer) => drop(answer_approval::answer(records, &id, answer, ("alice", None))?),
            Resolved::ExpireApprovals => drop(answer_approval::expire(records)?),
            Resolved::CancelCall(run, key) => {
                drop(cancel_call::cancel(records, (&run, &key), "the user cancelled it")?)
            }
            Resolved::EndRun(run, end) => drop(end_run::end(records, &run, end)?),
            Resolved::Abandon => drop(end_run::abandon(records, 60_000, 10)?),
            Resolved::Delete(run) => drop(delete::delete(records, &run)?),
            Resolved::Prune(before) => drop(delete::prune(records, before, 10)?),
        }
        Ok(())
    }

    /// The command with the ids of runs and approvals as another store gave them.
    pub(crate) fn with_ids(self, run: &dyn Fn(&RunId) -> RunId, approval: &dyn Fn(&ApprovalId) -> ApprovalId) -> Self {
        match self {
            Resolved::Turn(mut plan) => {
                plan.run_id = run(&plan.run_id);
                for call in &mut plan.calls {
                    if let Some(start) = &mut call.start {
                        start.run_id = run(&start.run_id);
                    }
                }
                Resolved::Turn(plan)
            }
            Resolved::Start(mut start) => {
                start.run_id = run(&start.run_id);
                Resolved::Start(start)
            }
            Resolved::FailPending(id, key) => Resolved::FailPending(run(&id), key),
            Resolved::Subagent(mut start) => {
                start.parent = run(&start.parent);
                Resolved::Subagent(start)
            }
            Resolved::Ask(mut ask) => {
                ask.run = run(&ask.run);
                Resolved::Ask(ask)
            }
            Resolved::LocalStep(id, fence, local) => Resolved::LocalStep(run(&id), fence, local),
            Resolved::Answer(id, answer) => Resolved::Answer(approval(&id), answer),
            Resolved::CancelCall(id, key) => Resolved::CancelCall(run(&id), key),
            Resolved::EndRun(id, end) => Resolved::EndRun(run(&id), end),
            Resolved::Delete(id) => Resolved::Delete(run(&id)),
            other => other,
        }
    }
}

/// Case `seed` of the property's commands, run against the in-memory records: the records as
/// they ended, and each command as it reached them.
pub(crate) fn sample(seed: u8) -> (Memory, Vec<Traced>) {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let commands = commands(40).new_tree(&mut runner).expect("a case").current();
    let mut world = World::new();
    for timed in &commands {
        world.memory.now += Millis::from(timed.after_ms);
        world.apply(&timed.command);
        world.memory.finish();
    }
    (world.memory, world.trace)
}

/// Rule 2: a subagent waiting for its session's earlier run is dispatched once that run ends.
#[test]
fn a_sessions_next_run_goes_when_the_one_before_it_ends() {
    let subagent = |seq| Command::Subagent {
        run: Target::Known(0),
        fence: Sender::Current(0),
        by_call: false,
        seq,
        occurrence: seq,
        session: Some(0),
        input: 0,
    };
    let mut commands = started_hosted();
    commands.extend([
        now(subagent(0)),
        now(subagent(1)),
        now(Command::EndRun {
            run: Target::Known(3),
            how: How::Fail,
        }),
    ]);
    run_all(&commands).unwrap();
    let mut world = World::new();
    for timed in &commands {
        world.apply(&timed.command);
    }
    let waited = &world.runs[4];
    let log = &world.memory.state.log[waited];
    let kinds: Vec<EventType> = log.iter().map(|event| event.kind).collect();
    assert_eq!(
        kinds,
        [
            EventType::RunCreated,
            EventType::AgentSuspended,
            EventType::AgentResumed
        ],
        "the second child waited for the first, then went"
    );
}

/// Not a divergence: a subagent started under a fence that names one of the run's calls in
/// flight is that call's body's, keyed under the call, whatever the handler's place recorded.
#[test]
fn a_fence_naming_a_call_starts_that_calls_subagent() {
    let subagent = |fence, seq, input| Command::Subagent {
        run: Target::Known(0),
        fence,
        by_call: false,
        seq,
        occurrence: 0,
        session: None,
        input,
    };
    let mut calls = lookups(0, 2);
    if let Command::Turn { run, .. } = &mut calls {
        *run = Target::Known(1);
    }
    let mut commands = started_hosted();
    // The second fence is the first call's dispatch (the one issued after the handler's).
    commands.extend([
        now(subagent(Sender::Current(0), 2, 0)),
        now(calls),
        now(subagent(Sender::Stale(1), 0, 1)),
    ]);
    run_all(&commands).unwrap();
    let mut world = World::new();
    for timed in &commands {
        world.apply(&timed.command);
    }
    let under_call = StepKey::tool_subagent(&StepKey::for_call(0, 0, None), "helper", 0);
    assert!(
        world
            .memory
            .state
            .steps
            .contains_key(&(world.runs[1].clone(), under_call)),
        "the call's body started a subagent"
    );
}
