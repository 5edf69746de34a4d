//! Submitting a turn: the calls an agent (or a hosted handler) asks for, recorded in one write.
//!
//! In order: a hosted run's turn is fenced by its dispatch and checked against what its place in
//! the handler's order recorded (a divergence fails the run here); a branch's turn is judged by
//! the branch rule (its parent gone, the run ends); the run admits the turn ([`turn::admit`]);
//! then each call is a replay or a join of what its identity recorded, or a new call: replayed
//! from a branch's parent, refused by the branch rule (or because another call of the turn ended
//! the run), or decided ([`turn::decide`]), served from the cache, recorded and, when it starts
//! in this turn, started. A branch refusal ends the run after the turn; a gated call asks the next
//! question.

use super::ending::{end_diverged, end_tree};
use super::{Records, Result, held_step, parent_exists, parent_step, record_change};
use crate::error::KernelError;
use crate::machine::branch::{self, Blocked, Verdict};
use crate::machine::budget;
use crate::machine::dispatch;
use crate::machine::effects::Effect;
use crate::machine::hosted;
use crate::machine::run::EndRun;
use crate::machine::turn::{self, CallDisposition, Next, PlannedCall, TurnPlan};
use crate::model::{Outcome, RunRecord, StepKey, StepKind, StepRecord, StepStatus};

/// What recording a turn did: each call's disposition, and, when the turn ended its run (a
/// branch refusing an effect, or one whose parent is gone), the steps that end settled on the way,
/// to cancel on their workers.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RecordedTurn {
    pub calls: Vec<CallDisposition>,
    pub ended: Vec<StepRecord>,
    /// Why the run ended with the turn, when not for `unresumable` (a divergence, a branch's
    /// refusal): what the steps of `ended` are cancelled with.
    #[serde(with = "crate::wire::optional_reason")]
    pub ended_because: Option<crate::wire::Reason>,
    /// The run could not take the turn: why (its branch's parent is gone; the run ended with it).
    pub unresumable: Option<String>,
    /// A call the turn started was paid for by a budget, or took a tool limit's token or slot:
    /// none may go to its worker before the commit that charged it is done, or a crash could lose
    /// the charge of a call that ran, or let a burst past its limit.
    #[serde(default)]
    pub paid: bool,
}

pub fn apply<R: Records + ?Sized>(records: &mut R, plan: TurnPlan) -> Result<RecordedTurn> {
    let mut run = records.run(&plan.run_id)?;
    let recorded = plan
        .calls
        .iter()
        .map(|call| records.find_step(&run.id, &call.key))
        .collect::<Result<Vec<_>>>()?;
    if let Some(caller) = &plan.caller {
        check_caller(records, &run, &plan, caller)?;
    } else if (run.hosted || plan.fence.is_some())
        && let Some(diverged) = check_place(records, &run, &plan, &recorded)?
    {
        return Ok(diverged);
    }
    let guarded = branch::guarded(&run) && turn::adds_calls(&recorded) && !run.status.is_terminal();
    if guarded && let Some(reason) = branch::unresumable(&run, parent_exists(records, &run)?) {
        let (_, ended) = end_tree(records, &run, &EndRun::Fail { reason: reason.clone() })?;
        return Ok(RecordedTurn {
            ended,
            unresumable: Some(reason),
            ..RecordedTurn::default()
        });
    }
    let verdicts = if guarded {
        judge_calls(records, &run, &plan, &recorded)?
    } else {
        Vec::new()
    };
    let unsettled = if turn::adds_calls(&recorded) {
        // A hosted run's own dispatch runs while its handler calls; it is not a call.
        Some(
            records
                .count_active_steps(&run.id)?
                .saturating_sub(usize::from(run.hosted)),
        )
    } else {
        None
    };
    if let Some((started, event)) = turn::admit(&run, &plan, &recorded, unsettled, records.now())? {
        records.save_run(&started)?;
        records.append(&run.id, event, None)?;
        run = started;
    }
    let counted_before = run.tool_calls;
    let budget_before = run.budget.clone();
    let mut calls = Calls::new(&plan, verdicts);
    if run.budget.is_some() && turn::adds_calls(&recorded) {
        calls.ancestors = super::spend::ancestors(records, &run)?;
    }
    for (index, (call, recorded)) in plan.calls.iter().zip(recorded).enumerate() {
        let disposition = match recorded {
            Some(step) => resubmitted(records, step, call)?,
            None => new_call(records, &mut run, &plan, &mut calls, index)?,
        };
        calls.dispositions.push(disposition);
    }
    if run.tool_calls != counted_before || run.budget != budget_before {
        records.save_run(&run)?;
    }
    if let Some(refused) = calls.blocked {
        let reason = refused.run_reason(run.capture);
        let (_, ended) = end_tree(records, &run, &EndRun::Fail { reason })?;
        return Ok(RecordedTurn {
            calls: calls.dispositions,
            ended,
            unresumable: None,
            ended_because: Some("write_tool_blocked"),
            paid: run.budget != budget_before || calls.limited,
        });
    }
    if calls.gated {
        super::ask::ask_next(records, &run.id)?;
    }
    Ok(RecordedTurn {
        paid: run.budget != budget_before || calls.limited,
        calls: calls.dispositions,
        ..RecordedTurn::default()
    })
}

/// A turn's calls as they are recorded, and what the branch rule said of each.
struct Calls {
    dispositions: Vec<CallDisposition>,
    verdicts: Vec<Option<Verdict>>,
    /// The first call the branch rule refused, which ends the run after the turn.
    turn_blocked: Option<Blocked>,
    blocked: Option<Blocked>,
    gated: bool,
    /// A call started under tool limits: the turn's starts wait for its commit.
    limited: bool,
    /// The runs above this one whose budgets cover its calls too (see [`super::spend`]).
    ancestors: Vec<RunRecord>,
}

impl Calls {
    fn new(plan: &TurnPlan, verdicts: Vec<Option<Verdict>>) -> Calls {
        let turn_blocked = verdicts.iter().find_map(|verdict| match verdict {
            Some(Verdict::Blocked(refused)) => Some(refused.clone()),
            _ => None,
        });
        Calls {
            dispositions: Vec::with_capacity(plan.calls.len()),
            verdicts,
            turn_blocked,
            blocked: None,
            gated: false,
            limited: false,
            ancestors: Vec::new(),
        }
    }
}

/// Fences a hosted run's turn by its dispatch and checks it against what its place recorded; a
/// divergence fails the run in this write, and every call of the turn is answered with it.
fn check_place<R: Records + ?Sized>(
    records: &mut R,
    run: &RunRecord,
    plan: &TurnPlan,
    recorded: &[Option<StepRecord>],
) -> Result<Option<RecordedTurn>> {
    let dispatch = records.find_step(&run.id, &StepKey::agent())?;
    hosted::check_fence(run, dispatch.as_ref(), plan.fence.as_ref())?;
    let keys: Vec<StepKey> = plan.calls.iter().map(|c| c.key.clone()).collect();
    let at_place = records.steps_at_place(&run.id, plan.turn)?;
    let elsewhere: Vec<StepRecord> = recorded.iter().flatten().cloned().collect();
    let divergence = match hosted::place(plan.turn, &keys, &at_place, &elsewhere) {
        Err(message) => {
            let step = at_place
                .first()
                .or(elsewhere.first())
                .cloned()
                .expect("a divergence names a recorded step");
            Some((step, message))
        }
        // The same identities at the same place, but a call whose tool or arguments changed.
        Ok(_) => {
            plan.calls
                .iter()
                .zip(recorded)
                .find_map(|(call, step)| match turn::resubmitted(step.clone()?, call) {
                    CallDisposition::Diverged { step, message } => Some((step, message)),
                    _ => None,
                })
        }
    };
    let Some((step, message)) = divergence else {
        return Ok(None);
    };
    let ended = end_diverged(records, run, &message)?;
    Ok(Some(RecordedTurn {
        calls: plan
            .calls
            .iter()
            .map(|_| CallDisposition::Diverged {
                step: step.clone(),
                message: message.clone(),
            })
            .collect(),
        ended,
        ended_because: Some("replay_input_changed"),
        ..RecordedTurn::default()
    }))
}

/// Fences a call a tool's body makes through the kernel: the plan's dispatch must hold `caller`,
/// a running call of this run; anything else records nothing.
fn check_caller<R: Records + ?Sized>(records: &R, run: &RunRecord, plan: &TurnPlan, caller: &StepKey) -> Result<()> {
    let held = match &plan.fence {
        Some(fence) => held_step(records, &fence.dispatch_id, fence.attempt, None)?,
        None => None,
    };
    match held {
        Some(step) if step.kind == StepKind::Tool && step.run_id == run.id && &step.key == caller => Ok(()),
        _ => Err(KernelError::FailedPrecondition(format!(
            "call {caller} of run {} is not running under this dispatch: only a running call's body calls a tool \
             through the kernel; nothing was recorded",
            run.id
        ))),
    }
}

/// Whether a new call of `plan` takes a place in its hosted run's handler order: a handler's own
/// calls do, a call a tool's body makes does not.
fn at_place(run: &RunRecord, plan: &TurnPlan) -> bool {
    run.hosted && plan.caller.is_none()
}

/// A call whose identity the run recorded already: replayed, joined or refused as diverged.
fn resubmitted<R: Records + ?Sized>(records: &mut R, step: StepRecord, call: &PlannedCall) -> Result<CallDisposition> {
    let disposition = turn::resubmitted(step, call);
    if let CallDisposition::Replayed(step) = &disposition {
        records.save_step(step)?;
    }
    Ok(disposition)
}

/// Records call `index` of the turn, new to the run.
fn new_call<R: Records + ?Sized>(
    records: &mut R,
    run: &mut RunRecord,
    plan: &TurnPlan,
    calls: &mut Calls,
    index: usize,
) -> Result<CallDisposition> {
    let call = &plan.calls[index];
    let refused;
    let call = match (calls.verdicts.get(index).cloned().flatten(), &calls.turn_blocked) {
        (Some(Verdict::Replay(parent)), _) => {
            run.tool_calls += 1;
            let mut change = branch::replay(run, &parent, (plan.turn, call.position), records.now());
            change.step.hosted &= plan.caller.is_none();
            records.insert_step(&change.step)?;
            if at_place(run, plan) {
                records.insert_place(&change.step)?;
            }
            records.append(&run.id, change.event, Some(change.step.clone()))?;
            return Ok(CallDisposition::Replayed(change.step));
        }
        (Some(Verdict::Blocked(refusal)), _) => {
            refused = branch_refusal(call, refusal.message(run), Outcome::WriteToolBlocked);
            calls.blocked = Some(refusal);
            &refused
        }
        // Another call of the turn ended the run: this one never runs.
        (_, Some(first)) => {
            let message = format!(
                "not run: the run ended at this turn's call to '{}' (write_tool_blocked)",
                first.subject
            );
            refused = branch_refusal(call, message, Outcome::Cancelled);
            &refused
        }
        _ => call,
    };
    record_call(records, run, plan, call, calls)
}

/// Records a new call as the machine decides it: settled at once, gated, or scheduled (and
/// started, when it starts in the turn that records it, written once, already started).
fn record_call<R: Records + ?Sized>(
    records: &mut R,
    run: &mut RunRecord,
    plan: &TurnPlan,
    call: &PlannedCall,
    calls: &mut Calls,
) -> Result<CallDisposition> {
    let now = records.now();
    let mut decision = turn::decide(run, call, &plan.available_tools);
    let cached = if decision.may_use_cache() {
        records.cached_result(&call.call_hash)?
    } else {
        None
    };
    // A call served from the cache runs nothing and pays nothing; one already past its run's
    // budget is refused here, before it is scheduled (its start checks again, and pays).
    if cached.is_none() && decision.runs() && run.budget.is_some() {
        let accounts: Vec<&RunRecord> = std::iter::once(&*run).chain(&calls.ancestors).collect();
        let first = budget::Attempt {
            tool: &call.tool_name,
            unit_cost: call.unit_cost,
            first: true,
            timeout_ms: turn::timeout(call, plan.default_timeout_ms),
        };
        // One that waits for running calls to give back the time they hold is scheduled.
        if let Err(exceeded) = budget::check(&accounts, first)
            && !exceeded.waits
        {
            decision.over_budget(exceeded);
        }
    }
    let looked_up = cached.is_some();
    let recorded = turn::record(
        run,
        (
            plan.turn,
            plan.default_timeout_ms,
            plan.max_concurrency,
            plan.share.as_deref(),
        ),
        call,
        decision,
        cached,
        now,
    );
    let mut step = recorded.step;
    // The calling body waits on a nested call, not the run's handler.
    step.hosted &= plan.caller.is_none();
    if looked_up && step.status == StepStatus::Succeeded {
        // Served from the cache: the entry is this run's too, and outlives any other's deletion.
        records.own_cached_result(&step)?;
    }
    let started = match (&recorded.next, &call.start) {
        (Next::Scheduled, Some(start)) => dispatch::start(&step, start, now).map(|mut change| {
            change.step.replica = Some(start.replica.clone().unwrap_or_else(|| records.replica().to_owned()));
            (change, start)
        }),
        _ => None,
    };
    // Starting at once under tool limits, it passes them here; one they have no room for (another
    // replica's calls took it) is scheduled, and waits in the queue.
    let (started, admitted) = match started {
        Some(started) if !started.1.limits.is_empty() => match super::throttle::admit(records, started.1) {
            Ok(admitted) => (Some(started), Some(admitted)),
            Err(KernelError::LimitExceeded { .. }) => (None, None),
            Err(error) => return Err(error),
        },
        started => (started, None),
    };
    // Starting at once, it pays now; one the budget cannot pay for after all is scheduled, and
    // its start settles it.
    let started = match started {
        Some(started) if run.budget.is_some() => {
            let paid = super::spend::charge(records, run, &mut calls.ancestors, super::spend::next_attempt(&step))?;
            paid.is_ok().then_some(started)
        }
        started => started,
    };
    let started = match (started, admitted) {
        (Some((mut change, start)), Some(admitted)) => {
            super::throttle::take(records, &step, start, admitted)?;
            change.step.limited_by = start.limits.iter().map(|limit| limit.tools.clone()).collect();
            change.step.limit_wait_ms = start.limit_wait_ms;
            calls.limited = true;
            Some((change, start))
        }
        (started, _) => started,
    };
    records.insert_step(started.as_ref().map_or(&step, |(change, _)| &change.step))?;
    if at_place(run, plan) {
        records.insert_place(&step)?;
    }
    Ok(match recorded.next {
        Next::Settled => {
            records.append(&run.id, recorded.event, Some(step.clone()))?;
            CallDisposition::Settled(step)
        }
        Next::Gated => {
            records.append(&run.id, recorded.event, None)?;
            calls.gated = true;
            CallDisposition::Gated(step)
        }
        Next::Scheduled => {
            records.append(&run.id, recorded.event, None)?;
            // Pending since a moment ago in this same commit, so it starts; were it not to,
            // the scheduler gives the reserved slot back and queues the call as usual.
            match started {
                Some((change, start)) => {
                    super::start::take_locks(records, &step, start)?;
                    CallDisposition::Started(record_change(records, change)?)
                }
                None => {
                    records.effect(Effect::Dispatch(Box::new(step.clone())));
                    CallDisposition::Scheduled(step)
                }
            }
        }
    })
}

/// The branch rule's word on each call of a turn of guarded `run` that its own record does not
/// hold (`None` for the others, and for calls to unknown tools, which run nothing anyway).
fn judge_calls<R: Records + ?Sized>(
    records: &R,
    run: &RunRecord,
    plan: &TurnPlan,
    recorded: &[Option<StepRecord>],
) -> Result<Vec<Option<Verdict>>> {
    plan.calls
        .iter()
        .zip(recorded)
        .map(|(call, own)| {
            let (None, Some(tool)) = (own, &call.tool) else {
                return Ok(None);
            };
            let subject = branch::Subject::Tool {
                name: &tool.name,
                read_only: tool.options.read_only,
                writes: tool.options.writes,
            };
            let parent = parent_step(records, run, &call.key)?;
            Ok(Some(branch::judge(
                run,
                subject,
                parent.as_ref(),
                (&call.call_hash, &call.arguments),
            )))
        })
        .collect()
}

/// `call` settled at once with `message`, without running.
fn branch_refusal(call: &PlannedCall, message: String, outcome: Outcome) -> PlannedCall {
    let mut refused = call.clone();
    refused.start = None;
    refused.gate = turn::CallGate::Refuse {
        message,
        reason: "write_tool_blocked",
        outcome,
    };
    refused
}
