//! What a tool call's body began through the kernel and left open when the call settled for
//! good: its questions to a person are withdrawn and the calls it made (`ctx.call`) cancelled, so
//! no run stays blocked on a question nobody waits for, and no nested call runs for a caller
//! that has gone.

use super::{Records, Result, apply_change};
use crate::machine::cancel;
use crate::machine::effects::Effect;
use crate::model::{StepKind, StepRecord};

/// Settles as cancelled what `call`, which just settled, left open: each question it asked (its
/// approval withdrawn) and each call it made (told to its worker, and what that call left open in
/// turn); then the run's next question is asked, or the run resumed. Returns the steps settled.
/// A call not yet settled for good (it will run again) keeps them, for its next attempt to find.
pub fn withdraw<R: Records + ?Sized>(records: &mut R, call: &StepRecord) -> Result<Vec<StepRecord>> {
    if call.kind != StepKind::Tool || !call.status.is_terminal() {
        return Ok(Vec::new());
    }
    let reason = format!("call {} settled ({})", call.key, call.status);
    let mut withdrawn = Vec::new();
    for open in records.open_dependents(&call.run_id, &call.key)? {
        let approval = records.open_approval_of(&call.run_id, &open.key)?;
        let change = cancel::cancel_call(&open, approval.as_ref(), &reason, records.now())?;
        if let Some(approval) = &change.withdrawn {
            records.save_approval(approval)?;
        }
        let settled = apply_change(records, change.settled)?;
        if settled.kind == StepKind::Tool {
            records.effect(Effect::Cancel {
                steps: vec![settled.clone()],
                reason: format!("call cancelled: {reason}"),
            });
            let inner = withdraw(records, &settled)?;
            withdrawn.extend(inner);
        }
        withdrawn.push(settled);
    }
    if !withdrawn.is_empty() {
        super::ask::ask_next(records, &call.run_id)?;
    }
    Ok(withdrawn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::KernelError;
    use crate::machine::command::memory::Memory;
    use crate::machine::command::spend::tests::{created, start_of, turn};
    use crate::machine::command::{cancel_call, start, submit_turn};
    use crate::machine::hosted::{self, Fence};
    use crate::machine::records::{NOW, new_run};
    use crate::machine::turn::{CallDisposition, TurnPlan};
    use crate::model::{DispatchId, RunId, RunStatus, StepKey, StepStatus};

    /// A run whose call `t0/p0` runs under dispatch `d0-1`, attempt 1.
    fn running() -> (Memory, StepRecord) {
        let mut records = Memory::new(NOW);
        let run = created(&mut records, new_run());
        submit_turn::apply(&mut records, turn(&run.id, 1)).unwrap();
        let caller = start::apply(&mut records, start_of(&run.id, 0, 1)).unwrap().unwrap();
        (records, caller)
    }

    /// The call `caller`'s body makes as its `occurrence`-th, from dispatch attempt `attempt`.
    fn nested(caller: &StepRecord, occurrence: u32, attempt: u32) -> TurnPlan {
        let mut plan = turn(&caller.run_id, 1);
        plan.turn = caller.turn;
        plan.calls[0].key = StepKey::nested_call(&caller.key, occurrence);
        plan.calls[0].position = caller.position;
        plan.calls[0].call_hash = format!("nested{occurrence}");
        plan.fence = Some(Fence {
            dispatch_id: DispatchId::from_stored("d0-1".into()),
            attempt,
        });
        plan.caller = Some(caller.key.clone());
        plan
    }

    fn recorded(records: &mut Memory, plan: TurnPlan) -> StepRecord {
        match submit_turn::apply(records, plan).unwrap().calls.remove(0) {
            CallDisposition::Scheduled(step) => step,
            other => panic!("not scheduled: {other:?}"),
        }
    }

    fn step_of(records: &Memory, run: &RunId, key: &StepKey) -> StepRecord {
        records.find_step(run, key).unwrap().unwrap()
    }

    #[test]
    fn a_body_s_call_is_recorded_under_its_caller_and_wakes_it_not_the_handler() {
        let (mut records, caller) = running();
        let call = recorded(&mut records, nested(&caller, 0, 1));
        assert_eq!(call.key.as_str(), "call:t0/p0#0");
        assert_eq!((call.turn, call.position), (caller.turn, caller.position));
        assert!(!call.hosted);
        assert_eq!(call.max_concurrency, None, "it runs within its caller's turn bound");
        assert_ne!(call.idempotency_key, caller.idempotency_key);
        assert_eq!(
            hosted::wakes(&call).collect::<Vec<_>>(),
            std::slice::from_ref(&caller.key)
        );
        assert!(hosted::may_await(&caller, &call));
        // The same call from the body again joins it; nothing new is recorded.
        match submit_turn::apply(&mut records, nested(&caller, 0, 1))
            .unwrap()
            .calls
            .remove(0)
        {
            CallDisposition::Joined(step) => assert_eq!(step.key, call.key),
            other => panic!("not joined: {other:?}"),
        }
    }

    #[test]
    fn only_the_dispatch_running_the_caller_may_call_and_a_refusal_records_nothing() {
        let (mut records, caller) = running();
        let stale = submit_turn::apply(&mut records, nested(&caller, 0, 2)).unwrap_err();
        assert!(matches!(stale, KernelError::FailedPrecondition(_)), "{stale}");
        let key = StepKey::nested_call(&caller.key, 0);
        assert!(records.find_step(&caller.run_id, &key).unwrap().is_none());
        // Another call claiming to be the caller, under the caller's own dispatch.
        let mut forged = nested(&caller, 0, 1);
        forged.caller = Some(StepKey::for_call(0, 1, None));
        assert!(submit_turn::apply(&mut records, forged).is_err());
    }

    #[test]
    fn a_blocked_run_still_takes_a_running_body_s_call() {
        let (mut records, caller) = running();
        let mut run = records.run(&caller.run_id).unwrap();
        run.status = RunStatus::Blocked;
        records.save_run(&run).unwrap();
        recorded(&mut records, nested(&caller, 0, 1));
        // An agent's new turn is refused while the run is blocked.
        let mut agent = turn(&caller.run_id, 1);
        agent.turn = 1;
        agent.calls[0].key = StepKey::for_call(1, 0, None);
        assert!(submit_turn::apply(&mut records, agent).is_err());
    }

    #[test]
    fn a_caller_settled_for_good_cancels_its_open_calls_theirs_too_and_a_retried_one_keeps_them() {
        let (mut records, caller) = running();
        let call = recorded(&mut records, nested(&caller, 0, 1));
        // The caller will run again (a retry): its next attempt joins the call.
        let mut pending = caller.clone();
        pending.status = StepStatus::Pending;
        assert!(withdraw(&mut records, &pending).unwrap().is_empty());
        assert_eq!(step_of(&records, &caller.run_id, &call.key).status, StepStatus::Pending);

        // The nested call runs and makes a call of its own.
        let mut start = start_of(&caller.run_id, 0, 1);
        start.key = call.key.clone();
        start.dispatch_id = DispatchId::from_stored("n-1".into());
        let running_call = start::apply(&mut records, start).unwrap().unwrap();
        let mut inner = nested(&running_call, 0, 1);
        inner.fence = Some(Fence {
            dispatch_id: DispatchId::from_stored("n-1".into()),
            attempt: 1,
        });
        let inner = recorded(&mut records, inner);
        assert_eq!(inner.key.caller(), Some(call.key.clone()));

        records.effects.clear();
        cancel_call::cancel(&mut records, (&caller.run_id, &caller.key), "enough").unwrap();
        for key in [&call.key, &inner.key] {
            let settled = step_of(&records, &caller.run_id, key);
            assert_eq!(settled.status, StepStatus::Cancelled, "{key}");
            assert!(settled.error.unwrap().contains("settled (cancelled)"), "{key}");
        }
        let told: Vec<StepKey> = records
            .effects
            .iter()
            .flat_map(|effect| match effect {
                Effect::Cancel { steps, .. } => steps.iter().map(|s| s.key.clone()).collect(),
                Effect::Dispatch(_) => Vec::new(),
            })
            .collect();
        for key in [&caller.key, &call.key, &inner.key] {
            assert!(told.contains(key), "{key} not cancelled on its worker: {told:?}");
        }
    }
}
