//! A tool call's attempt paid for by the budgets that cover its run ([`budget`]): checked and
//! charged in the write that starts it, or, when it may not start, its call settled as
//! `budget_exceeded` in that same write.

use super::{Records, Result, apply_change};
use crate::machine::budget::{self, Attempt, Exceeded};
use crate::machine::dispatch;
use crate::machine::events::SettledBy;
use crate::model::{ErrorKind, Outcome, RunRecord, StepKind, StepRecord, StepStatus};

/// The runs above `run` whose budgets cover it, nearest first (a subagent's parent, its parent's
/// parent, ...): each lives in `run`'s shard, so this write holds them all.
pub fn ancestors<R: Records + ?Sized>(records: &R, run: &RunRecord) -> Result<Vec<RunRecord>> {
    let mut chain: Vec<RunRecord> = Vec::new();
    let mut next = budget::next_account(run).cloned();
    while let Some(id) = next {
        let parent = records.run(&id)?;
        next = budget::next_account(&parent).cloned();
        chain.push(parent);
    }
    Ok(chain)
}

/// The attempt of `step` that starts next, as a budget sees it.
pub fn next_attempt(step: &StepRecord) -> Attempt<'_> {
    Attempt {
        tool: &step.tool,
        unit_cost: step.unit_cost,
        first: step.attempts == 0,
        timeout_ms: step.timeout_ms,
    }
}

/// What a start refused because its call waits for running calls to give back the time they
/// hold names as its field: the scheduler tries the start again later.
pub const WAITS_FOR_TIME: &str = "budget.max_time";

/// Gives back what the attempt of `ran` that ends now reserved of its run's budgets, and spends
/// what it ran. `ran` is the step as it was while its attempt ran.
pub fn end_attempt<R: Records + ?Sized>(records: &mut R, ran: &StepRecord) -> Result<()> {
    let ended = budget::Ended {
        tool: &ran.tool,
        timeout_ms: ran.timeout_ms,
        ran_ms: ran
            .started_at
            .map_or(0, |at| u64::try_from(records.now() - at).unwrap_or(0)),
    };
    let mut run = records.run(&ran.run_id)?;
    let chain = ancestors(records, &run)?;
    budget::settle(&mut run, ended);
    records.save_run(&run)?;
    for mut ancestor in chain {
        budget::settle(&mut ancestor, ended);
        records.save_run(&ancestor)?;
    }
    Ok(())
}

/// Checks `attempt` against `run`'s budget and its ancestors' and, when it fits, charges it to
/// each of them (`run` in place; the ancestors are saved).
pub fn charge<R: Records + ?Sized>(
    records: &mut R,
    run: &mut RunRecord,
    ancestors: &mut [RunRecord],
    attempt: Attempt<'_>,
) -> Result<std::result::Result<(), Exceeded>> {
    let accounts: Vec<&RunRecord> = std::iter::once(&*run).chain(ancestors.iter()).collect();
    if let Err(exceeded) = budget::check(&accounts, attempt) {
        return Ok(Err(exceeded));
    }
    budget::charge(run, attempt);
    for ancestor in ancestors.iter_mut() {
        budget::charge(ancestor, attempt);
        records.save_run(ancestor)?;
    }
    Ok(Ok(()))
}

/// Parks `step`, whose next attempt would pass a limit that asks a person, as a gated call: it
/// waits for the approval `gate` asks for, put to the person in turn with the run's others.
fn park<R: Records + ?Sized>(records: &mut R, step: &StepRecord, gate: crate::model::ApprovalGate) -> Result<()> {
    let mut parked = step.clone();
    parked.status = StepStatus::AwaitingApproval;
    parked.approval_gate = Some(gate);
    parked.approval = None;
    records.save_step(&parked)?;
    super::ask::ask_next(records, &step.run_id)
}

/// Pays for the next attempt of tool call `step`, about to start: `true` when it may start (its
/// run's budgets charged), `false` when a limit refused it and the call settled as
/// `budget_exceeded` instead, or, when the limit asks a person, waits for one to raise it. Steps
/// other than tool calls, and calls no budget covers, pay nothing.
pub fn pay_start<R: Records + ?Sized>(records: &mut R, step: &StepRecord) -> Result<bool> {
    if step.kind != StepKind::Tool || !records.budgeted(&step.run_id)? {
        return Ok(true);
    }
    let mut run = records.run(&step.run_id)?;
    let mut chain = ancestors(records, &run)?;
    match charge(records, &mut run, &mut chain, next_attempt(step))? {
        Ok(()) => {
            records.save_run(&run)?;
            Ok(true)
        }
        Err(Exceeded {
            waits: true, message, ..
        }) => Err(crate::error::KernelError::LimitExceeded {
            field: WAITS_FOR_TIME.to_owned(),
            message: format!("{message}; the call waits for running calls to end"),
        }),
        Err(Exceeded { ask: Some(gate), .. }) => {
            park(records, step, gate)?;
            Ok(false)
        }
        Err(Exceeded { message, ask: None, .. }) => {
            let change = dispatch::settle(
                step,
                (StepStatus::Failed, Outcome::BudgetExceeded),
                Err((ErrorKind::Fatal, &message)),
                0,
                SettledBy::reason("budget_exceeded"),
                records.now(),
            );
            let settled = apply_change(records, change)?;
            super::dependents::withdraw(records, &settled)?;
            Ok(false)
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::machine::budget::Limit;
    use crate::machine::command::memory::Memory;
    use crate::machine::command::{create_run, start, submit_turn};
    use crate::machine::dispatch::StartDispatch;
    use crate::machine::records::{NOW, new_run};
    use crate::machine::run::NewRun;
    use crate::machine::turn::{CallGate, PlannedCall, TurnPlan};
    use crate::model::{DispatchId, RunId, StepKey, ToolDef, ToolOptions};

    fn call(position: u32) -> PlannedCall {
        PlannedCall {
            position,
            key: StepKey::for_call(0, position, None),
            call_id: None,
            tool_name: "search".into(),
            arguments: format!(r#"{{"n":{position}}}"#),
            sealed: None,
            tool: Some(Arc::new(ToolDef {
                name: "search".into(),
                description: "d".into(),
                input_schema: serde_json::json!({"type": "object"}),
                version: "1".into(),
                fingerprint: "fp".into(),
                options: ToolOptions::default(),
            })),
            not_offered: false,
            timeout_ms: None,
            call_hash: format!("h{position}"),
            gate: CallGate::Run {
                decided_by: "default:allow".into(),
            },
            unit_cost: 0.5,
            resources: Vec::new(),
            start: None,
        }
    }

    pub(in crate::machine::command) fn turn(run: &RunId, calls: u32) -> TurnPlan {
        TurnPlan {
            offers_approval_tool: None,
            share: None,
            run_id: run.clone(),
            turn: 0,
            calls: (0..calls).map(call).collect(),
            available_tools: vec!["search".into()],
            default_timeout_ms: 30_000,
            max_pending_calls: 100,
            max_events: 10_000,
            fence: None,
            caller: None,
            max_concurrency: None,
        }
    }

    pub(in crate::machine::command) fn start_of(run: &RunId, position: u32, attempt: u32) -> StartDispatch {
        StartDispatch {
            run_id: run.clone(),
            key: StepKey::for_call(0, position, None),
            dispatch_id: DispatchId::from(format!("d{position}-{attempt}")),
            attempt,
            worker: "w1".into(),
            session_id: "s1".into(),
            lease_expires_at: NOW + 60_000,
            replica: None,
            limits: Vec::new(),
            limit_wait_ms: 0,
        }
    }

    pub(in crate::machine::command) fn created(records: &mut Memory, new: NewRun) -> RunRecord {
        create_run::apply(records, new).unwrap().0
    }

    fn limited(calls: u64) -> NewRun {
        NewRun {
            budget: vec![Limit {
                max_calls: Some(calls),
                ..Limit::default()
            }],
            ..new_run()
        }
    }

    fn spent(records: &Memory, run: &RunId) -> budget::Spent {
        records.state.runs[run].budget.as_ref().unwrap().limits[0].spent
    }

    /// What a limit counts with `calls` calls at `cost`, whose running attempts hold `reserved_ms`.
    fn running(calls: u64, cost: f64, reserved_ms: u64) -> budget::Spent {
        budget::Spent {
            calls,
            cost,
            time_ms: 0,
            reserved_ms,
        }
    }

    #[test]
    fn calls_scheduled_together_start_until_the_budget_is_spent_and_the_next_settles_instead() {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, limited(1));
        // Nothing is spent while both are recorded: both are scheduled.
        submit_turn::apply(&mut records, turn(&run.id, 2)).unwrap();
        let first = start::apply(&mut records, start_of(&run.id, 0, 1)).unwrap();
        assert!(first.is_some_and(|step| step.status == StepStatus::Running));
        assert_eq!(spent(&records, &run.id), running(1, 0.5, 30_000));

        let second = start::apply(&mut records, start_of(&run.id, 1, 1)).unwrap();
        assert_eq!(second, None, "the second call does not start");
        let settled = &records.state.steps[&(run.id.clone(), StepKey::for_call(0, 1, None))];
        assert_eq!(
            (settled.status, settled.outcome, settled.attempts),
            (StepStatus::Failed, Some(Outcome::BudgetExceeded), 0)
        );
        assert_eq!(
            settled.error.as_deref(),
            Some(format!("budget exceeded: calls 2 of 1 for run {}; 'search' did not run", run.id).as_str())
        );
        let last = records.state.log[&run.id].last().unwrap();
        assert_eq!(last.payload["outcome"], "budget_exceeded");
        assert_eq!(last.payload["reason"], "budget_exceeded", "{}", last.payload);
        assert_eq!(spent(&records, &run.id), running(1, 0.5, 30_000));
    }

    #[test]
    fn a_call_past_the_budget_is_refused_as_it_is_recorded_and_an_early_start_pays_at_once() {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, limited(1));
        let mut plan = turn(&run.id, 2);
        plan.calls[0].start = Some(start_of(&run.id, 0, 1));
        let recorded = submit_turn::apply(&mut records, plan).unwrap();
        assert!(matches!(
            recorded.calls[0],
            crate::machine::turn::CallDisposition::Started(_)
        ));
        let crate::machine::turn::CallDisposition::Settled(refused) = &recorded.calls[1] else {
            panic!("the second call was not refused: {:?}", recorded.calls[1]);
        };
        assert_eq!(refused.outcome, Some(Outcome::BudgetExceeded));
        assert_eq!(spent(&records, &run.id).calls, 1);
    }

    #[test]
    fn a_retry_pays_its_price_again_but_counts_no_new_call() {
        let mut records = Memory::new(NOW);
        let run = created(
            &mut records,
            NewRun {
                budget: vec![Limit {
                    max_calls: Some(1),
                    max_cost: Some(1.0),
                    ..Limit::default()
                }],
                ..new_run()
            },
        );
        submit_turn::apply(&mut records, turn(&run.id, 1)).unwrap();
        let key = (run.id.clone(), StepKey::for_call(0, 0, None));
        for attempt in 1..=2 {
            let step = start::apply(&mut records, start_of(&run.id, 0, attempt)).unwrap();
            assert!(step.is_some(), "attempt {attempt} starts");
            // The attempt fails; the call waits for its next one.
            let mut pending = records.state.steps[&key].clone();
            pending.status = StepStatus::Pending;
            records.save_step(&pending).unwrap();
        }
        assert_eq!(spent(&records, &run.id), running(1, 1.0, 0), "both attempts ended");
        assert_eq!(start::apply(&mut records, start_of(&run.id, 0, 3)).unwrap(), None);
        assert_eq!(records.state.steps[&key].outcome, Some(Outcome::BudgetExceeded));
        assert_eq!(records.state.steps[&key].cost, 1.0, "the two attempts that ran");
    }

    #[test]
    fn a_subagent_pays_from_its_parent_s_budget() {
        let mut records = Memory::new(NOW);
        let parent = created(&mut records, limited(1));
        let child = created(
            &mut records,
            NewRun {
                parent: Some((parent.id.clone(), StepKey::for_call(0, 0, None))),
                ..new_run()
            },
        );
        assert!(
            child
                .budget
                .as_ref()
                .is_some_and(|b| b.under_parent && b.limits.is_empty())
        );
        submit_turn::apply(&mut records, turn(&child.id, 2)).unwrap();
        assert!(start::apply(&mut records, start_of(&child.id, 0, 1)).unwrap().is_some());
        assert_eq!(spent(&records, &parent.id).calls, 1, "charged to the parent");
        assert_eq!(start::apply(&mut records, start_of(&child.id, 1, 1)).unwrap(), None);
        let refused = &records.state.steps[&(child.id.clone(), StepKey::for_call(0, 1, None))];
        assert!(
            refused
                .error
                .as_deref()
                .is_some_and(|e| e.contains(&format!("(an ancestor of run {})", child.id))),
            "{refused:?}"
        );
    }

    /// A run whose budget allows `calls` calls and asks finance to raise it.
    fn asking(calls: u64) -> NewRun {
        NewRun {
            budget: vec![Limit {
                max_calls: Some(calls),
                set_by: Some("policy:budgets[0]".into()),
                ask: Some(budget::Ask {
                    approvers: vec!["finance".into()],
                    timeout_ms: Some(60_000),
                    message: None,
                }),
                ..Limit::default()
            }],
            ..new_run()
        }
    }

    fn step_at(records: &Memory, run: &RunId, position: u32) -> StepRecord {
        records.state.steps[&(run.clone(), StepKey::for_call(0, position, None))].clone()
    }

    fn open_approval(records: &Memory) -> crate::model::ApprovalRecord {
        let open: Vec<_> = (records.state.approvals.values())
            .filter(|a| a.status == crate::model::ApprovalStatus::Pending)
            .collect();
        assert_eq!(open.len(), 1, "{open:?}");
        open[0].clone()
    }

    /// Parks the second call of a one-call budget that asks, at its start; its approval.
    fn parked(records: &mut Memory) -> (RunRecord, crate::model::ApprovalRecord) {
        let run = created(records, asking(1));
        submit_turn::apply(records, turn(&run.id, 2)).unwrap();
        assert!(start::apply(records, start_of(&run.id, 0, 1)).unwrap().is_some());
        assert_eq!(start::apply(records, start_of(&run.id, 1, 1)).unwrap(), None);
        let waiting = step_at(records, &run.id, 1);
        assert_eq!((waiting.status, waiting.attempts), (StepStatus::AwaitingApproval, 0));
        let approval = open_approval(records);
        assert_eq!(approval.key, waiting.key);
        assert_eq!(approval.decided_by, format!("budget:{}#0", run.id));
        assert_eq!(approval.approvers, ["finance"]);
        let asked = records.state.log[&run.id].last().unwrap();
        assert_eq!(asked.payload["reason"], "budget_exceeded", "{}", asked.payload);
        assert_eq!(records.state.runs[&run.id].status, crate::model::RunStatus::Blocked);
        (run, approval)
    }

    #[test]
    fn a_call_past_a_limit_that_asks_waits_and_starts_once_a_person_raises_the_limit() {
        use crate::machine::command::answer_approval::{self, Answer};
        let mut records = Memory::new(NOW);
        let (run, approval) = parked(&mut records);
        let before = records.state.clone();
        let bare = answer_approval::answer(
            &mut records,
            &approval.id,
            Answer::Approve { given: None },
            ("alice", None),
        );
        assert!(
            bare.unwrap_err().to_string().starts_with("answer_json: approval"),
            "leave to pass a budget names the new limit"
        );
        let bad = Answer::Approve {
            given: Some(r#"{"max_calls":"lots"}"#.into()),
        };
        assert!(answer_approval::answer(&mut records, &approval.id, bad, ("alice", None)).is_err());
        assert_eq!(records.state, before, "a refused answer writes nothing");

        let raise = Answer::Approve {
            given: Some(r#"{"max_calls":2}"#.into()),
        };
        let answered = answer_approval::answer(&mut records, &approval.id, raise, ("alice", None)).unwrap();
        assert_eq!(answered.to_dispatch.len(), 1);
        let limit = &records.state.runs[&run.id].budget.as_ref().unwrap().limits[0];
        assert_eq!(
            (limit.max_calls, limit.set_by.as_deref()),
            (Some(2), Some("policy:budgets[0], raised by alice"))
        );
        let started = start::apply(&mut records, start_of(&run.id, 1, 1)).unwrap();
        assert!(started.is_some_and(|step| step.status == StepStatus::Running));
        assert_eq!(spent(&records, &run.id).calls, 2);
    }

    #[test]
    fn a_raise_refused_or_expired_settles_the_call_as_budget_exceeded() {
        use crate::machine::command::answer_approval::{self, Answer};
        let mut records = Memory::new(NOW);
        let (run, approval) = parked(&mut records);
        answer_approval::answer(
            &mut records,
            &approval.id,
            Answer::Reject,
            ("bob", Some("not this month")),
        )
        .unwrap();
        let settled = step_at(&records, &run.id, 1);
        assert_eq!(
            (settled.status, settled.outcome),
            (StepStatus::Failed, Some(Outcome::BudgetExceeded))
        );
        assert!(
            settled
                .error
                .as_deref()
                .is_some_and(|e| e.contains("bob did not raise it (not this month)")),
            "{settled:?}"
        );
        assert_eq!(spent(&records, &run.id).calls, 1);

        let mut records = Memory::new(NOW);
        let (run, _) = parked(&mut records);
        records.now += 60_001;
        answer_approval::expire(&mut records).unwrap();
        assert_eq!(step_at(&records, &run.id, 1).outcome, Some(Outcome::BudgetExceeded));
    }

    #[test]
    fn a_new_call_past_a_limit_that_asks_is_recorded_waiting_for_a_person() {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, asking(0));
        let recorded = submit_turn::apply(&mut records, turn(&run.id, 1)).unwrap();
        assert!(
            matches!(recorded.calls[0], crate::machine::turn::CallDisposition::Gated(_)),
            "{:?}",
            recorded.calls[0]
        );
        assert_eq!(open_approval(&records).decided_by, format!("budget:{}#0", run.id));
    }

    fn timed(max_time_ms: u64) -> NewRun {
        NewRun {
            budget: vec![Limit {
                max_time_ms: Some(max_time_ms),
                ..Limit::default()
            }],
            ..new_run()
        }
    }

    fn succeed(records: &mut Memory, run: &RunId, position: u32) {
        let report = crate::machine::dispatch::ResultReport {
            dispatch_id: DispatchId::from(format!("d{position}-1")),
            attempt: 1,
            session_id: "s1".into(),
            outcome: Ok("1".into()),
            progress_count: 0,
        };
        assert!(
            super::super::result::apply(records, report).unwrap().is_some(),
            "{run} {position}"
        );
    }

    #[test]
    fn a_time_limit_holds_each_running_attempt_s_timeout_and_its_end_spends_what_it_ran() {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, timed(70_000));
        submit_turn::apply(&mut records, turn(&run.id, 3)).unwrap();
        for position in 0..2 {
            assert!(
                start::apply(&mut records, start_of(&run.id, position, 1))
                    .unwrap()
                    .is_some()
            );
        }
        assert_eq!(
            spent(&records, &run.id).reserved_ms,
            60_000,
            "two timeouts of 30 s held"
        );

        // A third 30 s would pass 70 s only by what the two running hold: it waits, unwritten.
        let waits = start::apply(&mut records, start_of(&run.id, 2, 1)).unwrap_err();
        assert!(
            matches!(&waits, crate::error::KernelError::LimitExceeded { field, .. } if field == WAITS_FOR_TIME),
            "{waits}"
        );
        let third = &records.state.steps[&(run.id.clone(), StepKey::for_call(0, 2, None))];
        assert_eq!((third.status, third.attempts), (StepStatus::Pending, 0));

        // The first ends after 5 s: it spends 5 s and gives back 30, and the third fits.
        records.now = NOW + 5_000;
        succeed(&mut records, &run.id, 0);
        let after = spent(&records, &run.id);
        assert_eq!((after.time_ms, after.reserved_ms), (5_000, 30_000));
        assert!(start::apply(&mut records, start_of(&run.id, 2, 1)).unwrap().is_some());
        records.now = NOW + 9_000;
        succeed(&mut records, &run.id, 1);
        succeed(&mut records, &run.id, 2);
        let after = spent(&records, &run.id);
        assert_eq!((after.time_ms, after.reserved_ms), (5_000 + 9_000 + 4_000, 0));
        assert_eq!(budget::overspent(&records.state.runs[&run.id]), None);
    }

    #[test]
    fn a_timeout_that_cannot_fit_with_nothing_held_fails_the_call_and_a_late_end_spends_only_its_timeout() {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, timed(50_000));
        submit_turn::apply(&mut records, turn(&run.id, 2)).unwrap();
        let first = start::apply(&mut records, start_of(&run.id, 0, 1)).unwrap().unwrap();
        // The kernel noticed the timeout late (it was down): the attempt spends its 30 s, no more.
        records.now = NOW + 45_000;
        let timed_out = super::super::time_out::time_out(&mut records, first.dispatch_id.as_ref().unwrap(), 1)
            .unwrap()
            .expect("the attempt times out");
        let after = spent(&records, &run.id);
        assert_eq!((after.time_ms, after.reserved_ms), (30_000, 0), "{timed_out:?}");

        // 30 s spent and nothing held: a 30 s timeout can never fit 50 s, so the call fails.
        assert_eq!(start::apply(&mut records, start_of(&run.id, 1, 1)).unwrap(), None);
        let refused = &records.state.steps[&(run.id.clone(), StepKey::for_call(0, 1, None))];
        assert_eq!(refused.outcome, Some(Outcome::BudgetExceeded));
        assert_eq!(
            refused.error.as_deref(),
            Some(
                format!(
                    "budget exceeded: time 30.00 s spent and 0.00 s held by running calls, with 30.00 s more for \
                     this call's timeout, of 50.00 s for run {}; 'search' did not run",
                    run.id
                )
                .as_str()
            )
        );
    }

    #[test]
    fn a_call_with_no_timeout_cannot_run_under_a_time_limit() {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, timed(50_000));
        let mut plan = turn(&run.id, 1);
        plan.default_timeout_ms = 0;
        let recorded = submit_turn::apply(&mut records, plan).unwrap();
        let crate::machine::turn::CallDisposition::Settled(refused) = &recorded.calls[0] else {
            panic!("the call was not refused as it was recorded: {:?}", recorded.calls[0]);
        };
        assert_eq!(refused.outcome, Some(Outcome::BudgetExceeded));
        assert!(
            refused
                .error
                .as_deref()
                .unwrap()
                .contains("time of 50.00 s and the call has no timeout"),
            "{:?}",
            refused.error
        );
    }
}
