use super::*;
use crate::machine::records;
use crate::model::{EVENT_SCHEMA_VERSION, EventRecord, RunId};

fn event(run: &RunId, seq: u64, kind: EventType, key: Option<StepKey>) -> Published {
    Published {
        event: EventRecord {
            run_id: run.clone(),
            seq,
            kind,
            schema_version: EVENT_SCHEMA_VERSION,
            at: records::NOW,
            payload: "{}".into(),
        },
        step: key.map(|key| crate::model::StepRecord { key, ..records::step() }),
    }
}

fn call(turn: u32, position: u32) -> StepKey {
    StepKey::for_call(turn, position, None)
}

fn named(id: &str) -> StepKey {
    StepKey::for_call(0, 0, Some(id))
}

/// A view holding one run, created with the given events.
fn born(published: &[Published]) -> (LiveRuns, RunId) {
    let live = LiveRuns::default();
    let run = records::run();
    let id = run.id.clone();
    live.committed(vec![run], published);
    (live, id)
}

#[test]
fn a_turn_with_a_call_not_recorded_is_answered_from_memory_and_a_recorded_one_is_not() {
    let (live, run) = born(&[]);
    assert!(
        live.unrecorded_turn(&run, [&call(0, 0)]).is_some(),
        "nothing recorded yet"
    );
    live.committed(
        Vec::new(),
        &[
            event(&run, 4, EventType::ToolScheduled, Some(call(0, 0))),
            event(&run, 5, EventType::ToolScheduled, Some(call(0, 1))),
        ],
    );
    // Turn 0 may be a replay: only the database can say.
    assert!(live.unrecorded_turn(&run, [&call(0, 0), &call(0, 1)]).is_none());
    assert!(live.unrecorded_turn(&run, [&call(0, 1)]).is_none());
    // Any earlier turn may have been recorded by position too.
    assert!(live.unrecorded_turn(&run, [&call(0, 7)]).is_none());
    let next = live.unrecorded_turn(&run, [&call(1, 0)]).expect("turn 1 is new");
    assert_eq!(next.last_seq, 5, "the record follows the commits' events");
    // One new call is enough: the turn is not a pure replay.
    assert!(live.unrecorded_turn(&run, [&call(0, 0), &call(1, 0)]).is_some());
}

#[test]
fn named_calls_are_told_apart_by_their_ids() {
    let (live, run) = born(&[event(&records::run().id, 1, EventType::RunCreated, None)]);
    live.committed(
        Vec::new(),
        &[event(&run, 2, EventType::ToolResult, Some(named("call_a")))],
    );
    assert!(live.unrecorded_turn(&run, [&named("call_a")]).is_none());
    assert!(live.unrecorded_turn(&run, [&named("call_b")]).is_some());
    // A key of another shape is never taken for a new call.
    assert!(live.unrecorded_turn(&run, [&StepKey::agent()]).is_none());
}

#[test]
fn past_its_budget_of_ids_a_run_sends_named_turns_to_the_database() {
    let (live, run) = born(&[]);
    let many: Vec<Published> = (0..=MAX_IDS)
        .map(|n| {
            event(
                &run,
                n as u64 + 1,
                EventType::ToolScheduled,
                Some(named(&format!("c{n}"))),
            )
        })
        .collect();
    live.committed(Vec::new(), &many);
    assert!(live.unrecorded_turn(&run, [&named("never")]).is_none());
    assert!(
        live.unrecorded_turn(&run, [&call(0, 0)]).is_some(),
        "positions still known"
    );
    let bytes = live.0.lock().unwrap().bytes;
    assert!(bytes < 4096, "the forgotten ids left the budget: {bytes} bytes");
}

#[test]
fn a_run_that_ended_or_was_never_held_is_asked_of_the_database() {
    let (live, run) = born(&[]);
    live.committed(Vec::new(), &[event(&run, 4, EventType::RunCompleted, None)]);
    assert!(live.unrecorded_turn(&run, [&call(9, 0)]).is_none());
    assert_eq!(live.len(), 0);
    assert!(live.unrecorded_turn(&RunId::new(), [&call(0, 0)]).is_none());
}

#[test]
fn past_its_budget_the_runs_used_least_lately_are_forgotten() {
    let live = LiveRuns::default();
    let big = |id: RunId| RunRecord {
        id,
        input: "x".repeat(1 << 20),
        ..records::run()
    };
    let first = RunId::new();
    let second = RunId::new();
    live.committed(vec![big(first.clone()), big(second.clone())], &[]);
    // The first is used again, so the second is the one used least lately.
    assert!(live.unrecorded_turn(&first, [&call(0, 0)]).is_some());
    for _ in 0..(MAX_BYTES >> 20) {
        live.committed(vec![big(RunId::new())], &[]);
    }
    let inner = live.0.lock().unwrap();
    assert!(inner.bytes <= MAX_BYTES, "{} bytes held", inner.bytes);
    assert!(
        !inner.runs.contains_key(&second),
        "the run used least lately went first"
    );
    let held: usize = inner.runs.values().map(Live::bytes).sum();
    assert_eq!(held, inner.bytes, "the count of bytes matches what is held");
}

#[test]
fn a_commit_of_several_runs_events_updates_each_and_forgets_the_one_that_ended() {
    let live = LiveRuns::default();
    let [a, b, c] = [RunId::new(), RunId::new(), RunId::new()];
    let record = |id: &RunId| RunRecord {
        id: id.clone(),
        ..records::run()
    };
    live.committed(vec![record(&a), record(&b), record(&c)], &[]);
    live.committed(
        Vec::new(),
        &[
            event(&a, 4, EventType::ToolScheduled, Some(call(0, 0))),
            event(&b, 4, EventType::ToolScheduled, Some(call(2, 0))),
            event(&c, 4, EventType::ToolResult, Some(call(0, 0))),
            event(&a, 5, EventType::ToolStart, Some(call(0, 0))),
            event(&c, 5, EventType::RunCompleted, None),
        ],
    );
    assert_eq!(live.unrecorded_turn(&a, [&call(1, 0)]).map(|r| r.last_seq), Some(5));
    assert!(live.unrecorded_turn(&b, [&call(2, 0)]).is_none());
    assert_eq!(live.unrecorded_turn(&b, [&call(3, 0)]).map(|r| r.last_seq), Some(4));
    assert_eq!(live.len(), 2, "the run that ended is forgotten");
}
