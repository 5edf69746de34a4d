//! Branches and case runs on both stores: what the parent recorded replays (marked so), reads run
//! live, any other effect is refused with `write_tool_blocked` and ends the run, and a branch
//! whose parent is gone ends as `branch_unresumable`.

use super::*;
use crate::model::{Effect, Fork, ForkPoint, Outcome};

fn declared(name: &str, read_only: bool, writes: bool) -> ToolDef {
    let mut def = tool(name, Idempotency::SafeToRetry);
    def.options.read_only = read_only;
    def.options.writes = writes;
    def
}

fn branch_of(parent: &RunId, at: Option<(&str, u32, u32)>, results: &[(&str, &str)]) -> Fork {
    Fork {
        of: parent.clone(),
        at: at.map(|(key, turn, position)| ForkPoint {
            key: StepKey::from_stored(key.to_owned()),
            turn,
            position,
        }),
        results: results.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

/// Runs a scheduled call to its result `output` on dispatch `dispatch`.
async fn settle(f: &Fixture, step: &StepRecord, dispatch: &str, output: &str) {
    start(&f.store, step, dispatch, 1, "s1").await.expect("started");
    f.store
        .record_result(ResultReport {
            dispatch_id: dispatch.into(),
            attempt: 1,
            session_id: "s1".into(),
            outcome: Ok(output.into()),
            progress_count: 0,
        })
        .await
        .unwrap()
        .expect("recorded");
}

async fn run_now(f: &Fixture, id: &RunId) -> RunRecord {
    f.store.reads.run(id.clone()).await.unwrap().unwrap()
}

/// A finished run that looked a price up and charged a card, in one turn.
async fn recorded_parent(f: &Fixture) -> RunId {
    let (parent, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let turn = f
        .store
        .schedule_turn(plan(
            &parent.id,
            0,
            vec![
                call(0, 0, Some(declared("price", true, false)), "price", r#"{"sku":"a"}"#),
                call(0, 1, Some(declared("charge", false, true)), "charge", r#"{"cents":5}"#),
            ],
        ))
        .await
        .unwrap();
    settle(f, &scheduled(&turn[0]), "p0", "5").await;
    settle(f, &scheduled(&turn[1]), "p1", "\"charged\"").await;
    let end = EndRun::Complete {
        output: "\"done\"".into(),
        settle_in_flight: false,
    };
    f.store.end_run(parent.id.clone(), end).await.unwrap();
    parent.id
}

async fn a_branch_replays_recorded_writes_runs_reads_and_ends_at_a_new_write(f: Fixture) {
    let parent = recorded_parent(&f).await;
    let mut new = new_run(None, 0);
    new.fork = Some(branch_of(&parent, None, &[("t0/p0", "7")]));
    let (branch, _) = f.store.create_run(new).await.unwrap();

    // The recorded calls replay (the price as the fork replaced it); nothing runs.
    let turn = f
        .store
        .record_turn(plan(
            &branch.id,
            0,
            vec![
                call(0, 0, Some(declared("price", true, false)), "price", r#"{"sku":"a"}"#),
                call(0, 1, Some(declared("charge", false, true)), "charge", r#"{"cents":5}"#),
            ],
        ))
        .await
        .unwrap();
    let replayed: Vec<(Option<&str>, Option<&str>, Option<&RunId>)> = turn
        .calls
        .iter()
        .map(|call| match call {
            CallDisposition::Replayed(step) => (
                step.output.as_deref(),
                step.decided_by.as_deref(),
                step.from_run.as_ref(),
            ),
            other => panic!("replayed from the parent, got {other:?}"),
        })
        .collect();
    assert_eq!(
        replayed,
        [
            (Some("7"), Some(crate::machine::branch::SET_BY_FORK), Some(&parent)),
            (
                Some("\"charged\""),
                Some(crate::machine::branch::FROM_PARENT),
                Some(&parent)
            ),
        ]
    );

    // A read runs live; a write the parent never made (other arguments) is refused, ends the
    // branch, and the read beside it in that turn never runs.
    let turn = f
        .store
        .record_turn(plan(
            &branch.id,
            1,
            vec![call(
                1,
                0,
                Some(declared("price", true, false)),
                "price",
                r#"{"sku":"b"}"#,
            )],
        ))
        .await
        .unwrap();
    settle(&f, &scheduled(&turn.calls[0]), "b1", "9").await;
    let turn = f
        .store
        .record_turn(plan(
            &branch.id,
            2,
            vec![
                call(2, 0, Some(declared("charge", false, true)), "charge", r#"{"cents":9}"#),
                call(2, 1, Some(declared("price", true, false)), "price", r#"{"sku":"c"}"#),
            ],
        ))
        .await
        .unwrap();
    let [CallDisposition::Settled(refused), CallDisposition::Settled(skipped)] = &turn.calls[..] else {
        panic!("both settled without running: {:?}", turn.calls);
    };
    assert_eq!(refused.outcome, Some(Outcome::WriteToolBlocked));
    let error = refused.error.as_deref().unwrap();
    assert!(
        error.starts_with("write_tool_blocked: 'charge'") && error.contains("(reason: write)"),
        "{error}"
    );
    assert_eq!(skipped.outcome, Some(Outcome::Cancelled));
    assert_eq!(skipped.attempts, 0);
    let ended = run_now(&f, &branch.id).await;
    assert_eq!(
        (ended.status, ended.reason.as_deref()),
        (RunStatus::Failed, Some("write_tool_blocked: charge (reason: write)"))
    );
    // An unmarked tool is refused as `unmarked`; nothing more is taken once the branch ended.
    let late = f
        .store
        .record_turn(plan(
            &branch.id,
            3,
            vec![call(3, 0, Some(declared("note", false, false)), "note", "{}")],
        ))
        .await
        .unwrap_err();
    assert!(late.to_string().contains("is failed"), "{late}");
    let log = events(&f.store, &branch.id).await;
    assert_gap_free(&log);
    assert_eq!(
        log.last().unwrap().kind,
        EventType::RunFailed,
        "the run's end is the last word"
    );
}
on_both_stores!(a_branch_replays_recorded_writes_runs_reads_and_ends_at_a_new_write);

async fn the_fork_point_bounds_the_record_and_an_unmarked_tool_is_refused(f: Fixture) {
    let parent = recorded_parent(&f).await;
    let mut new = new_run(None, 0);
    new.capture = crate::model::Capture::None;
    new.fork = Some(branch_of(&parent, Some(("t0/p0", 0, 0)), &[]));
    let (branch, _) = f.store.create_run(new).await.unwrap();
    let turn = f
        .store
        .record_turn(plan(
            &branch.id,
            0,
            vec![
                call(0, 0, Some(declared("price", true, false)), "price", r#"{"sku":"a"}"#),
                call(0, 1, Some(declared("charge", false, false)), "charge", r#"{"cents":5}"#),
            ],
        ))
        .await
        .unwrap();
    assert!(matches!(&turn.calls[0], CallDisposition::Replayed(step) if step.from_run.is_some()));
    let CallDisposition::Settled(refused) = &turn.calls[1] else {
        panic!("the charge after the fork point is refused: {:?}", turn.calls[1]);
    };
    // Capture none withholds the reason, from the handler and from the run's reason alike.
    let error = refused.error.as_deref().unwrap();
    assert!(
        error.contains("reason withheld") && !error.contains("unmarked"),
        "{error}"
    );
    let ended = run_now(&f, &branch.id).await;
    assert_eq!(
        ended.reason.as_deref(),
        Some("write_tool_blocked: charge (reason withheld: capture=none)")
    );
}
on_both_stores!(the_fork_point_bounds_the_record_and_an_unmarked_tool_is_refused);

async fn a_case_run_runs_what_its_tokens_allow_and_nothing_else(f: Fixture) {
    let mut new = new_run(None, 0);
    new.allow = vec!["tool:charge".into()];
    let (case, _) = f.store.create_run(new).await.unwrap();
    let turn = f
        .store
        .record_turn(plan(
            &case.id,
            0,
            vec![call(0, 0, Some(declared("charge", false, true)), "charge", "{}")],
        ))
        .await
        .unwrap();
    settle(&f, &scheduled(&turn.calls[0]), "c0", "1").await;
    let turn = f
        .store
        .record_turn(plan(
            &case.id,
            1,
            vec![call(1, 0, Some(declared("refund", false, true)), "refund", "{}")],
        ))
        .await
        .unwrap();
    let CallDisposition::Settled(refused) = &turn.calls[0] else {
        panic!("refused: {:?}", turn.calls);
    };
    assert!(refused.error.as_deref().unwrap().contains("allow it with tool:refund"));
    assert_eq!(run_now(&f, &case.id).await.status, RunStatus::Failed);
}
on_both_stores!(a_case_run_runs_what_its_tokens_allow_and_nothing_else);

async fn a_branch_whose_parent_is_gone_ends_unresumable(f: Fixture) {
    let parent = recorded_parent(&f).await;
    let mut new = new_run(None, 0);
    new.fork = Some(branch_of(&parent, None, &[]));
    let (branch, _) = f.store.create_run(new).await.unwrap();
    let mut hosted = hosted_run();
    hosted.fork = Some(branch_of(&parent, None, &[]));
    let (sleeping, _, dispatch) = f.store.create_run_dispatching(hosted).await.unwrap();
    f.store.delete_run(parent.clone()).await.unwrap();

    let turn = f
        .store
        .record_turn(plan(
            &branch.id,
            0,
            vec![call(
                0,
                0,
                Some(declared("price", true, false)),
                "price",
                r#"{"sku":"a"}"#,
            )],
        ))
        .await
        .unwrap();
    let reason = turn.unresumable.expect("the turn is refused");
    assert!(reason.starts_with("branch_unresumable: parent_missing"), "{reason}");
    assert!(turn.calls.is_empty());
    assert_eq!(run_now(&f, &branch.id).await.reason.as_deref(), Some(reason.as_str()));

    // A hosted branch's handler is not dispatched again: the branch ends instead.
    assert!(start(&f.store, &dispatch.unwrap(), "d1", 1, "s1").await.is_none());
    let ended = run_now(&f, &sleeping.id).await;
    assert_eq!(ended.status, RunStatus::Failed);
    assert!(ended.reason.unwrap().starts_with("branch_unresumable: parent_missing"));
    assert_gap_free(&events(&f.store, &sleeping.id).await);
}
on_both_stores!(a_branch_whose_parent_is_gone_ends_unresumable);

async fn a_hosted_branch_replays_recorded_steps_runs_reads_and_refuses_writes(f: Fixture) {
    let (parent, _, dispatch) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    start(&f.store, &dispatch.unwrap(), "d1", 1, "s1").await.unwrap();
    let mut plan_step = local(0, "plan");
    plan_step.once = true;
    f.store
        .record_step(
            (parent.id.clone(), fence("d1", 1)),
            plan_step,
            crate::store::StepGate::Unchecked,
        )
        .await
        .unwrap();
    f.store
        .end_run(parent.id.clone(), EndRun::Cancel { reason: "done".into() })
        .await
        .unwrap();

    let mut new = hosted_run();
    new.fork = Some(branch_of(&parent.id, None, &[]));
    let (branch, _, dispatch) = f.store.create_run_dispatching(new).await.unwrap();
    start(&f.store, &dispatch.unwrap(), "b1", 1, "s1").await.unwrap();
    let check = |seq, id: &str, effect, once| {
        let mut step = local(seq, id);
        step.effect = effect;
        step.once = once;
        f.store.check_step(
            (branch.id.clone(), fence("b1", 1)),
            step,
            crate::store::StepGate::Unchecked,
        )
    };
    let StepRecorded::Recorded(replayed) = check(0, "plan", Effect::Write, true).await.unwrap() else {
        panic!("the recorded ctx.once replays");
    };
    assert_eq!(
        (replayed.output.as_deref(), replayed.from_run.as_ref()),
        (Some("7"), Some(&parent.id))
    );
    assert!(matches!(
        check(1, "lookup", Effect::Read, false).await.unwrap(),
        StepRecorded::Allowed { decided_by: None }
    ));
    let StepRecorded::Blocked { step, ended } = check(1, "pay", Effect::Write, false).await.unwrap() else {
        panic!("a new write step is refused");
    };
    assert_eq!(step.outcome, Some(Outcome::WriteToolBlocked));
    assert!(step.error.unwrap().starts_with("write_tool_blocked: 'ctx.step:pay'"));
    assert!(
        ended.iter().any(|s| s.kind == StepKind::Agent),
        "the handler's dispatch is cancelled with the run"
    );
    let ended = run_now(&f, &branch.id).await;
    assert_eq!(
        (ended.status, ended.reason.as_deref()),
        (
            RunStatus::Failed,
            Some("write_tool_blocked: ctx.step:pay (reason: step)")
        )
    );
}
on_both_stores!(a_hosted_branch_replays_recorded_steps_runs_reads_and_refuses_writes);
