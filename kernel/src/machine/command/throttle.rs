//! A call's start passes its tools' limits ([`crate::machine::throttle`]): it takes a token of
//! each rate and a slot of each bound on calls at once, in the write that starts it. A limit that
//! has neither to give refuses the start, and the call waits in the queue for its next try.

use super::{Records, Result};
use crate::error::KernelError;
use crate::machine::dispatch::StartDispatch;
use crate::machine::throttle::{Bucket, free_slot};
use crate::model::StepRecord;

/// Takes what `start`'s limits ask of `step`'s attempt, or refuses with `LimitExceeded` naming
/// the limit, having written nothing of it.
pub fn pass<R: Records + ?Sized>(records: &mut R, step: &StepRecord, start: &StartDispatch) -> Result<()> {
    let admitted = admit(records, start)?;
    take(records, step, start, admitted)
}

/// What a start's limits have to give it: each rate's bucket after its token, each bound's free
/// slot.
pub struct Admitted {
    buckets: Vec<(String, Bucket)>,
    slots: Vec<String>,
}

/// Whether each of `start`'s limits has room for its attempt, as the store holds them now; refuses
/// with `LimitExceeded` naming the limit. Writes nothing a refusal would have to undo (a rate's
/// bucket row is made full where there was none, which is what no row means).
pub fn admit<R: Records + ?Sized>(records: &mut R, start: &StartDispatch) -> Result<Admitted> {
    let now = records.now();
    let mut admitted = Admitted {
        buckets: Vec::new(),
        slots: Vec::new(),
    };
    for limit in &start.limits {
        if limit.per_second.is_some() {
            let bucket = records.lock_bucket(&limit.tools, Bucket::full(limit, now))?;
            match bucket.take(limit, now) {
                Ok(after) => admitted.buckets.push((limit.tools.clone(), after)),
                Err(wait_ms) => {
                    return Err(refused(
                        limit.describe(),
                        format!("the next call may start in {wait_ms} ms"),
                    ));
                }
            }
        }
        if let Some(at_once) = limit.at_once {
            let prefix = limit.slot_prefix();
            let held = records.held_locks(&prefix)?;
            match free_slot(&prefix, at_once, &held) {
                Some(slot) => admitted.slots.push(slot),
                None => return Err(refused(limit.describe(), format!("{} calls run already", held.len()))),
            }
        }
    }
    Ok(admitted)
}

/// Takes what [`admit`] found for `step`'s attempt: the tokens and the slots.
pub fn take<R: Records + ?Sized>(
    records: &mut R,
    step: &StepRecord,
    start: &StartDispatch,
    admitted: Admitted,
) -> Result<()> {
    for (name, bucket) in admitted.buckets {
        records.save_bucket(&name, bucket)?;
    }
    for slot in admitted.slots {
        if let Err((run, key)) = records.take_lock(&slot, step, (&start.dispatch_id, start.attempt))? {
            return Err(KernelError::LimitExceeded {
                field: format!("limits[{slot}]"),
                message: format!("slot {slot} is held by step {key} of run {run}; the call waits in the queue"),
            });
        }
    }
    Ok(())
}

fn refused(limit: String, why: String) -> KernelError {
    KernelError::LimitExceeded {
        field: format!("limits[{limit}]"),
        message: format!("{why}; the call waits in the queue"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::command::memory::Memory;
    use crate::machine::command::spend::tests::{created, start_of, turn};
    use crate::machine::command::{result, start, submit_turn};
    use crate::machine::dispatch::ResultReport;
    use crate::machine::records::{NOW, new_run};
    use crate::machine::throttle::ToolLimit;
    use crate::model::{StepKey, StepStatus};

    /// The first attempt of `started` succeeds.
    fn succeed(records: &mut Memory, started: &StepRecord) {
        let report = ResultReport {
            dispatch_id: started.dispatch_id.clone().unwrap(),
            attempt: 1,
            session_id: "s1".into(),
            outcome: Ok("1".into()),
            progress_count: 0,
        };
        result::apply(records, report).unwrap();
    }

    fn under(limit: &ToolLimit, start: StartDispatch) -> StartDispatch {
        StartDispatch {
            limits: vec![limit.clone()],
            limit_wait_ms: 250,
            ..start
        }
    }

    #[test]
    fn a_start_past_a_bound_is_refused_and_the_slot_comes_back_with_the_result() {
        let limit = ToolLimit {
            tools: "sea*".into(),
            per_second: None,
            burst: None,
            at_once: Some(1),
        };
        let mut records = Memory::new(NOW);
        let run = created(&mut records, new_run());
        submit_turn::apply(&mut records, turn(&run.id, 2)).unwrap();
        let first = start::apply(&mut records, under(&limit, start_of(&run.id, 0, 1)))
            .unwrap()
            .expect("the first call starts");
        assert_eq!(
            (first.limited_by.as_slice(), first.limit_wait_ms),
            (&["sea*".to_owned()][..], 250)
        );
        assert_eq!(records.state.locks.keys().collect::<Vec<_>>(), ["@limit:sea*#0"]);

        let before = records.state.clone();
        let refused = start::apply(&mut records, under(&limit, start_of(&run.id, 1, 1))).unwrap_err();
        assert!(
            matches!(&refused, KernelError::LimitExceeded { field, .. } if field == "limits['sea*' (1 at once)]"),
            "{refused:?}"
        );
        assert_eq!(records.state, before, "a refused start writes nothing");

        succeed(&mut records, &first);
        assert!(records.state.locks.is_empty(), "the result gave the slot back");
        let second = start::apply(&mut records, under(&limit, start_of(&run.id, 1, 1))).unwrap();
        assert_eq!(second.map(|s| s.status), Some(StepStatus::Running));
        let key = StepKey::for_call(0, 1, None);
        assert_eq!(records.state.locks["@limit:sea*#0"].key, key);
    }

    #[test]
    fn a_start_its_budget_refuses_takes_no_slot_and_no_token() {
        let limit = ToolLimit {
            tools: "search".into(),
            per_second: Some(1.0),
            burst: Some(5),
            at_once: Some(1),
        };
        let mut records = Memory::new(NOW);
        let one_call = crate::machine::run::NewRun {
            budget: vec![crate::machine::budget::Limit {
                max_calls: Some(1),
                ..Default::default()
            }],
            ..new_run()
        };
        let run = created(&mut records, one_call);
        submit_turn::apply(&mut records, turn(&run.id, 2)).unwrap();
        let first = start::apply(&mut records, under(&limit, start_of(&run.id, 0, 1)))
            .unwrap()
            .expect("the first call starts");
        succeed(&mut records, &first);
        let tokens = records.state.buckets["search"].tokens;
        assert!(
            start::apply(&mut records, under(&limit, start_of(&run.id, 1, 1)))
                .unwrap()
                .is_none(),
            "the budget settles the second call"
        );
        assert!(records.state.locks.is_empty(), "the settled call holds no slot");
        assert_eq!(records.state.buckets["search"].tokens, tokens, "nor took a token");
    }

    #[test]
    fn a_turn_starts_its_limited_calls_in_its_own_write_while_there_is_room_and_schedules_the_rest() {
        let limit = ToolLimit {
            tools: "search".into(),
            per_second: None,
            burst: None,
            at_once: Some(1),
        };
        let mut records = Memory::new(NOW);
        let run = created(&mut records, new_run());
        let mut plan = turn(&run.id, 2);
        // The scheduler reserved both (as two replicas might have): the store admits one.
        plan.calls[0].start = Some(under(&limit, start_of(&run.id, 0, 1)));
        plan.calls[1].start = Some(under(&limit, start_of(&run.id, 1, 1)));
        let recorded = submit_turn::apply(&mut records, plan).unwrap();
        let crate::machine::turn::CallDisposition::Started(first) = &recorded.calls[0] else {
            panic!("the first call did not start: {:?}", recorded.calls[0]);
        };
        assert_eq!(first.limited_by, ["search"]);
        assert!(
            matches!(recorded.calls[1], crate::machine::turn::CallDisposition::Scheduled(_)),
            "no room for the second: it waits in the queue ({:?})",
            recorded.calls[1]
        );
        assert!(recorded.paid, "a limited start goes to its worker only once it commits");
        assert_eq!(records.state.locks.keys().collect::<Vec<_>>(), ["@limit:search#0"]);
        assert_eq!(
            records.state.locks["@limit:search#0"].key,
            StepKey::for_call(0, 0, None)
        );
    }

    #[test]
    fn a_rate_s_tokens_are_kept_between_starts_and_refill_with_time() {
        let limit = ToolLimit {
            tools: "search".into(),
            per_second: Some(1.0),
            burst: Some(1),
            at_once: None,
        };
        let mut records = Memory::new(NOW);
        let run = created(&mut records, new_run());
        submit_turn::apply(&mut records, turn(&run.id, 2)).unwrap();
        assert!(
            start::apply(&mut records, under(&limit, start_of(&run.id, 0, 1)))
                .unwrap()
                .is_some()
        );
        let refused = start::apply(&mut records, under(&limit, start_of(&run.id, 1, 1))).unwrap_err();
        assert!(
            refused.to_string().contains("the next call may start in 1000 ms"),
            "{refused}"
        );
        records.now += 1_000;
        assert!(
            start::apply(&mut records, under(&limit, start_of(&run.id, 1, 1)))
                .unwrap()
                .is_some()
        );
        assert_eq!(records.state.buckets["search"].tokens, 0.0);
    }
}
