//! Store tests, each run against a real SQLite file and a real PostgreSQL server: each checks an
//! invariant of the event log, the same on both backends.

use std::collections::BTreeMap;

use super::*;
use crate::model::{
    ApprovalStatus, ErrorKind, EventType, Idempotency, RecordedResult, RunStatus, StepKind, StepRecord, StepStatus,
    ToolOptions,
};
use crate::store::postgres::Target;

struct Fixture {
    store: Store,
    hub: Hub,
    /// The store's clock, which moves only when a test advances it.
    clock: Clock,
    _dir: Option<tempfile::TempDir>,
    _postgres: Option<e2e::postgres::Postgres>,
    _writer: WriterThread,
}

fn open() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (hub, clock) = (Hub::default(), Clock::manual());
    let (store, writer) = Store::open(
        &dir.path().join("k.db"),
        Durability::Normal,
        (hub.clone(), clock.clone()),
    )
    .unwrap();
    Fixture {
        store,
        hub,
        clock,
        _dir: Some(dir),
        _postgres: None,
        _writer: writer,
    }
}

/// A store on a PostgreSQL database of its own, on the test process's shared server; `None`
/// (said loudly) where PostgreSQL is not installed and not required.
async fn open_postgres(test: &str) -> Option<Fixture> {
    let server = tokio::task::spawn_blocking({
        let test = test.to_owned();
        move || e2e::postgres::Postgres::database(&test)
    })
    .await
    .unwrap()?;
    let (hub, clock) = (Hub::default(), Clock::manual());
    let (store, writer) = Store::open_postgres(
        &Target::with_defaults(&server.url).unwrap(),
        (hub.clone(), clock.clone()),
    )
    .await
    .unwrap();
    Some(Fixture {
        store,
        hub,
        clock,
        _dir: None,
        _postgres: Some(server),
        _writer: writer,
    })
}

/// Runs the store test `$name(fixture)` on both backends: `$name::sqlite` and `$name::postgres`.
macro_rules! on_both_stores {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::open()).await
            }

            #[tokio::test]
            async fn postgres() {
                if let Some(fixture) = super::open_postgres(concat!("store::tests::", stringify!($name))).await {
                    super::$name(fixture).await
                }
            }
        }
    };
}

fn tool(name: &str, idempotency: Idempotency) -> ToolDef {
    let schema = serde_json::json!({"type": "object"});
    ToolDef {
        name: name.into(),
        description: "d".into(),
        fingerprint: kernel_proto::canonical::tool_fingerprint(name, "d", &schema, ""),
        input_schema: schema,
        version: String::new(),
        options: ToolOptions {
            idempotency: Some(idempotency.as_str().into()),
            ..Default::default()
        },
    }
}

fn new_run(key: Option<&str>, max_tool_calls: u32) -> NewRun {
    NewRun {
        agent: "a".into(),
        labels: BTreeMap::from([("env".to_owned(), "test".to_owned())]),
        idempotency_key: key.map(str::to_owned),
        max_tool_calls,
        ..crate::machine::records::new_run()
    }
}

fn call(turn: u32, position: u32, tool: Option<ToolDef>, name: &str, args: &str) -> PlannedCall {
    let fingerprint = tool.as_ref().map_or(String::new(), |t| t.fingerprint.clone());
    let value: serde_json::Value = serde_json::from_str(args).unwrap();
    let call_hash = kernel_proto::canonical::call_hash(name, &fingerprint, &value);
    PlannedCall {
        call_hash,
        position,
        key: StepKey::for_call(turn, position, None),
        call_id: None,
        tool_name: name.into(),
        arguments: args.into(),
        sealed: None,
        tool: tool.map(std::sync::Arc::new),
        not_offered: false,
        timeout_ms: None,
        gate: CallGate::Run {
            decided_by: "default:allow".into(),
        },
        unit_cost: 0.0,
        resources: Vec::new(),
        start: None,
    }
}

fn plan(run: &RunId, turn: u32, calls: Vec<PlannedCall>) -> TurnPlan {
    TurnPlan {
        offers_approval_tool: None,
        share: None,
        run_id: run.clone(),
        turn,
        calls,
        available_tools: vec!["add".into()],
        default_timeout_ms: 30_000,
        max_pending_calls: 1024,
        max_events: 1_000_000,
        fence: None,
        caller: None,
        max_concurrency: None,
    }
}

async fn events(store: &Store, run: &RunId) -> Vec<crate::model::EventRecord> {
    store.reads.events(run.clone(), 1, 10_000).await.unwrap()
}

fn assert_gap_free(events: &[crate::model::EventRecord]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event.seq,
            index as u64 + 1,
            "sequence numbers must have no gaps or duplicates"
        );
    }
}

async fn start(store: &Store, step: &StepRecord, dispatch: &str, attempt: u32, session: &str) -> Option<StepRecord> {
    store
        .start_dispatch(StartDispatch {
            run_id: step.run_id.clone(),
            key: step.key.clone(),
            dispatch_id: dispatch.into(),
            attempt,
            worker: "w".into(),
            session_id: session.into(),
            lease_expires_at: 0,
            replica: None,
            limits: Vec::new(),
            limit_wait_ms: 0,
        })
        .await
        .unwrap()
}

fn scheduled(disposition: &CallDisposition) -> StepRecord {
    match disposition {
        CallDisposition::Scheduled(step) => step.clone(),
        other => panic!("expected scheduled, got {other:?}"),
    }
}

/// A successful result of `dispatch`'s first attempt on session `s1`.
fn returned(dispatch: &str, output: &str) -> ResultReport {
    ResultReport {
        dispatch_id: dispatch.into(),
        attempt: 1,
        session_id: "s1".into(),
        outcome: Ok(output.into()),
        progress_count: 0,
    }
}

fn slot(run: &RunId, key: StepKey, dispatch: &str) -> StartDispatch {
    StartDispatch {
        run_id: run.clone(),
        key,
        dispatch_id: dispatch.into(),
        attempt: 1,
        worker: "w".into(),
        session_id: "s1".into(),
        lease_expires_at: 0,
        replica: None,
        limits: Vec::new(),
        limit_wait_ms: 0,
    }
}

/// A one-call turn's read for an agent, its run and the call's result if it is served from the log.
async fn results(
    f: &Fixture,
    run: &RunId,
    call: &PlannedCall,
) -> (Option<crate::model::RunRecord>, Option<Vec<RecordedResult>>) {
    let identity = vec![(call.key.clone(), call.call_hash.clone())];
    f.store.reads.turn(run.clone(), identity).await.unwrap()
}

/// A turn's read: a settled turn is served from the log (whether or not the writer holds its run
/// in memory), a new or changed one is not, and the run comes back with its last event number.
/// Its results read alone are the results of its steps read whole.
async fn a_turn_read_serves_a_settled_turn_and_sees_every_commit(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let first = call(0, 0, Some(add.clone()), "add", r#"{"a":1}"#);
    let identity = |call: &PlannedCall| vec![(call.key.clone(), call.call_hash.clone())];
    let (found, replay) = results(&f, &run.id, &first).await;
    assert_eq!(found.map(|r| r.last_seq), Some(run.last_seq));
    assert!(replay.is_none(), "nothing is recorded yet");

    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![first.clone()]))
        .await
        .unwrap();
    let step = scheduled(&turn[0]);
    let (_, replay) = results(&f, &run.id, &first).await;
    assert!(
        replay.is_none(),
        "a call in flight is joined by the writer, not replayed"
    );
    assert!(start(&f.store, &step, "d1", 1, "s1").await.is_some());
    f.store
        .record_result(returned("d1", "3"))
        .await
        .unwrap()
        .expect("the holder's result is recorded");
    let last = events(&f.store, &run.id).await.last().unwrap().seq;

    let (found, replay) = results(&f, &run.id, &first).await;
    assert_eq!(found.map(|r| r.last_seq), Some(last));
    let replay = replay.expect("a settled turn is served from the log");
    assert_eq!(replay[0].output.as_deref(), Some("3"));
    let (_, steps) = f
        .store
        .reads
        .turn::<StepRecord>(run.id.clone(), identity(&first))
        .await
        .unwrap();
    let steps = steps.expect("served whole too");
    assert_eq!(
        steps[0].result(),
        replay[0],
        "each column of the result is read as the step's"
    );

    let changed = call(0, 0, Some(add.clone()), "add", r#"{"a":2}"#);
    let (_, replay) = results(&f, &run.id, &changed).await;
    assert!(
        replay.is_none(),
        "changed arguments go to the writer, which refuses them"
    );
    let next = call(1, 0, Some(add), "add", r#"{"a":1}"#);
    let (found, replay) = results(&f, &run.id, &next).await;
    assert!(replay.is_none(), "a new turn is not a replay");
    let found = found.expect("the run is found");
    assert_eq!((found.id, found.last_seq), (run.id, last));
    assert_eq!(
        f.store.reads.idle_in_transaction(),
        0,
        "each read's snapshot ended with it"
    );
}

/// A turn of positional calls is read as a range of its keys, which holds calls not asked for
/// (`t0/p10` lies between `t0/p1` and `t0/p2`): the turn served is exactly the calls asked, in
/// the order asked, and a call not asked for decides nothing, settled or not.
async fn a_turn_read_serves_exactly_the_calls_asked_whatever_else_its_range_holds(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let calls: Vec<PlannedCall> = (0..12)
        .map(|p| call(0, p, Some(add.clone()), "add", &format!(r#"{{"a":{p}}}"#)))
        .collect();
    let turn = f.store.schedule_turn(plan(&run.id, 0, calls.clone())).await.unwrap();
    // Every call settles but the one at position 10.
    for (p, disposition) in turn.iter().enumerate().filter(|(p, _)| *p != 10) {
        let dispatch = format!("d{p}");
        assert!(
            start(&f.store, &scheduled(disposition), &dispatch, 1, "s1")
                .await
                .is_some()
        );
        f.store
            .record_result(returned(&dispatch, &p.to_string()))
            .await
            .unwrap()
            .expect("the holder's result is recorded");
    }
    let asked = |positions: &[usize]| -> Vec<(StepKey, String)> {
        positions
            .iter()
            .map(|p| (calls[*p].key.clone(), calls[*p].call_hash.clone()))
            .collect()
    };
    // The outputs served for these identities, if the turn is served.
    let serve = |identities: Vec<(StepKey, String)>| {
        let reads = f.store.reads.clone();
        let run = run.id.clone();
        async move {
            let (_, served) = reads.turn::<RecordedResult>(run, identities).await.unwrap();
            served.map(|results| results.into_iter().map(|r| r.output.unwrap()).collect::<Vec<_>>())
        }
    };
    let served = |positions: &[usize]| serve(asked(positions));
    assert_eq!(served(&[2, 1]).await, Some(vec!["2".to_owned(), "1".to_owned()]));
    assert_eq!(
        served(&[11, 0, 3]).await,
        Some(vec!["11".to_owned(), "0".to_owned(), "3".to_owned()])
    );
    assert_eq!(served(&[9]).await, Some(vec!["9".to_owned()]));
    assert_eq!(served(&[1, 10]).await, None, "a call in flight is the writer's to join");
    let mut mixed = asked(&[1, 2]);
    mixed.push((StepKey::for_call(1, 0, None), calls[0].call_hash.clone()));
    assert_eq!(
        serve(mixed).await,
        None,
        "a call of another turn, not recorded, is not served"
    );
    let mut changed = asked(&[1, 2]);
    changed[1].1 = calls[3].call_hash.clone();
    assert_eq!(
        serve(changed).await,
        None,
        "a call asked under another identity is not served"
    );
}

/// A call keeps its run's fair share in the store, so the calls a restart finds queued are
/// served by the same shares.
async fn a_call_keeps_its_share_for_the_scheduler_after_a_restart(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let mut shared = plan(&run.id, 0, vec![call(0, 0, Some(add), "add", r#"{"a":1}"#)]);
    shared.share = Some("acme".into());
    f.store.schedule_turn(shared).await.unwrap();
    let queued = f.store.reads.in_flight_steps().await.unwrap();
    assert_eq!(
        queued.iter().map(|step| step.share.as_deref()).collect::<Vec<_>>(),
        [Some("acme")]
    );
}

async fn a_call_with_a_reserved_slot_is_scheduled_and_started_in_one_commit(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let mut live = f.hub.subscribe(&run.id);
    let add = tool("add", Idempotency::SafeToRetry);
    let mut reserved = call(0, 0, Some(add.clone()), "add", r#"{"a":1}"#);
    reserved.start = Some(slot(&run.id, reserved.key.clone(), "d1"));
    let queued = call(0, 1, Some(add.clone()), "add", r#"{"a":2}"#);
    let mut gated = call(0, 2, Some(add), "add", r#"{"a":3}"#);
    gated.gate = CallGate::Approve(crate::model::ApprovalGate {
        timeout_ms: None,
        approvers: Vec::new(),
        message: None,
        decided_by: "rule:ask".into(),
    });
    gated.start = Some(slot(&run.id, gated.key.clone(), "d3"));

    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![reserved, queued, gated]))
        .await
        .unwrap();
    let CallDisposition::Started(started) = &turn[0] else {
        panic!("expected started, got {:?}", turn[0]);
    };
    assert_eq!(started.status, StepStatus::Running);
    assert_eq!(started.dispatch_id.as_ref().map(|id| id.as_str()), Some("d1"));
    assert_eq!(started.attempts, 1);
    assert!(
        matches!(turn[1], CallDisposition::Scheduled(_)),
        "no slot: queued as before"
    );
    assert!(
        matches!(&turn[2], CallDisposition::Gated(step) if step.dispatch_id.is_none()),
        "a gated call does not start on its slot: {:?}",
        turn[2]
    );

    // tool:scheduled then tool:start, gap-free, published together by the one commit.
    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    let first: Vec<_> = log
        .iter()
        .filter(|e| e.payload.contains(&format!("\"step_key\":\"{}\"", started.key)))
        .map(|e| e.kind)
        .collect();
    assert_eq!(first, [EventType::ToolScheduled, EventType::ToolStart]);
    let mut published = Vec::new();
    while let Ok(crate::hub::Signal::Events(events)) = live.try_recv() {
        published.extend(events.iter().map(|item| item.event.seq));
    }
    // Everything after run:created (written before the subscription).
    assert_eq!(published, log.iter().skip(1).map(|e| e.seq).collect::<Vec<_>>());

    // The call is stored as it was answered, already started (written once, not inserted and
    // then updated), and the run row counts every event the command appended.
    assert_eq!(&step_again(&f, &run.id, &started.key).await, started);
    let stored = f.store.reads.run(run.id.clone()).await.unwrap().expect("run");
    assert_eq!(stored.last_seq, log.last().expect("events").seq);
    // The next command numbers its event after them.
    let queued = scheduled(&turn[1]);
    assert!(start(&f.store, &queued, "d2", 1, "s").await.is_some());
    assert_gap_free(&events(&f.store, &run.id).await);
}

/// A turn's started `safe_to_retry` calls are handed out once the write decided them and before
/// it commits (no subscriber has heard of the turn yet); an `at_most_once` one waits for the
/// commit, and a turn refused after it wrote hands out nothing.
async fn a_turn_hands_out_its_safe_started_calls_before_it_commits(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let live = f.hub.subscribe(&run.id);
    let mut safe = call(0, 0, Some(tool("add", Idempotency::SafeToRetry)), "add", r#"{"a":1}"#);
    safe.start = Some(slot(&run.id, safe.key.clone(), "d1"));
    let mut once = call(0, 1, Some(tool("charge", Idempotency::AtMostOnce)), "charge", "{}");
    once.start = Some(slot(&run.id, once.key.clone(), "d2"));
    let queued = call(0, 2, Some(tool("add", Idempotency::SafeToRetry)), "add", r#"{"a":2}"#);
    let (handed, handed_out) = std::sync::mpsc::channel();
    let early: EarlyDispatch = Box::new(move |steps| {
        let mut live = live;
        let heard = live.try_recv().is_ok();
        handed.send((steps, heard)).unwrap();
    });
    let recorded = f
        .store
        .record_turn_dispatching(plan(&run.id, 0, vec![safe, once, queued]), early)
        .await
        .unwrap();
    let (steps, heard) = handed_out.try_recv().expect("handed out before the turn was answered");
    assert!(!heard, "handed out before its commit published anything");
    let CallDisposition::Started(started) = &recorded.calls[0] else {
        panic!("expected started, got {:?}", recorded.calls[0]);
    };
    assert_eq!(steps, std::slice::from_ref(started), "only the safe call, as recorded");
    assert!(
        matches!(&recorded.calls[1], CallDisposition::Started(step) if step.dispatch_id.as_ref().map(|id| id.as_str()) == Some("d2")),
        "the at_most_once call started too, and goes out once its start is durable: {:?}",
        recorded.calls[1]
    );
    assert!(matches!(recorded.calls[2], CallDisposition::Scheduled(_)));

    let holder = locked_call(&f, "git", Idempotency::SafeToRetry, "d3").await;
    let (other, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let mut blocked = call(0, 0, Some(tool("git", Idempotency::SafeToRetry)), "git", "{}");
    blocked.resources = vec!["repo:acme".into()];
    blocked.start = Some(slot(&other.id, blocked.key.clone(), "d4"));
    let (handed, handed_out) = std::sync::mpsc::channel();
    let early: EarlyDispatch = Box::new(move |steps| handed.send(steps).unwrap());
    let refused = f
        .store
        .record_turn_dispatching(plan(&other.id, 0, vec![blocked]), early)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains(&holder.key.to_string()), "{refused}");
    assert!(handed_out.try_recv().is_err(), "a refused turn hands out nothing");
}

/// A call a budget pays for goes to its worker only once the commit that charged it is done (a
/// crash before it must not leave a call that ran unpaid), and at once then, before the turn is
/// answered: another connection sees the charge when the call is handed out.
async fn a_budgeted_turn_hands_out_its_started_calls_once_their_charge_commits(f: Fixture) {
    let budgeted = NewRun {
        budget: vec![crate::machine::budget::Limit {
            max_calls: Some(5),
            ..Default::default()
        }],
        ..new_run(None, 0)
    };
    let (run, _) = f.store.create_run(budgeted).await.unwrap();
    let mut safe = call(0, 0, Some(tool("add", Idempotency::SafeToRetry)), "add", r#"{"a":1}"#);
    safe.start = Some(slot(&run.id, safe.key.clone(), "d1"));
    let (handed, handed_out) = std::sync::mpsc::channel();
    let (reads, runtime, id) = (f.store.reads.clone(), tokio::runtime::Handle::current(), run.id.clone());
    let early: EarlyDispatch = Box::new(move |steps| {
        // On the writer's thread, outside the runtime: a read on another connection.
        let seen = runtime.block_on(reads.run(id)).unwrap().unwrap();
        handed
            .send((steps, seen.budget.unwrap().limits[0].spent.calls))
            .unwrap();
    });
    let recorded = f
        .store
        .record_turn_dispatching(plan(&run.id, 0, vec![safe]), early)
        .await
        .unwrap();
    assert!(recorded.paid);
    let CallDisposition::Started(started) = &recorded.calls[0] else {
        panic!("expected started, got {:?}", recorded.calls[0]);
    };
    let (steps, charged) = handed_out.try_recv().expect("handed out before the turn was answered");
    assert_eq!(steps, std::slice::from_ref(started));
    assert_eq!(charged, 1, "the call went out before its charge committed");
}

async fn a_repeated_create_with_the_same_key_returns_the_same_run(f: Fixture) {
    let (first, created) = f.store.create_run(new_run(Some("k1"), 0)).await.unwrap();
    let (again, created_again) = f.store.create_run(new_run(Some("k1"), 0)).await.unwrap();
    assert!(created && !created_again);
    assert_eq!(first.id, again.id);
    let mut other = new_run(Some("k1"), 0);
    other.input = "[1]".into();
    assert!(matches!(
        f.store.create_run(other).await,
        Err(KernelError::AlreadyExists(_))
    ));
    assert_eq!(events(&f.store, &first.id).await.len(), 1);
}

async fn a_runs_trace_context_is_kept_with_it_and_copied_to_its_steps(f: Fixture) {
    let trace: crate::traces::TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        .parse()
        .unwrap();
    let (run, _) = f
        .store
        .create_run(NewRun {
            trace: Some(trace),
            ..new_run(None, 0)
        })
        .await
        .unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![call(0, 0, Some(add), "add", r#"{"a":1}"#)]))
        .await
        .unwrap();
    assert_eq!(scheduled(&turn[0]).trace, Some(trace));
    let read = f.store.reads.run(run.id.clone()).await.unwrap().unwrap();
    assert_eq!(read.trace, Some(trace));
    let steps = f.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(steps[0].trace, Some(trace), "the step carries its run's trace context");
    let (plain, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    assert_eq!(f.store.reads.run(plain.id).await.unwrap().unwrap().trace, None);
}

async fn a_turns_own_steps_are_read_back_by_key(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    for turn in 0..2 {
        let calls = (0..3)
            .map(|position| call(turn, position, Some(add.clone()), "add", r#"{"a":1}"#))
            .collect();
        f.store.schedule_turn(plan(&run.id, turn, calls)).await.unwrap();
    }
    let wanted = vec![
        StepKey::for_call(1, 2, None),
        StepKey::for_call(1, 0, None),
        StepKey::for_call(7, 0, None),
    ];
    let read = f.store.reads.steps_at(run.id.clone(), wanted).await.unwrap();
    let mut keys: Vec<_> = read.iter().map(|step| step.key.clone()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [StepKey::for_call(1, 0, None), StepKey::for_call(1, 2, None)],
        "the named steps the run has, no others"
    );
}

async fn a_call_runs_through_start_and_result_with_gap_free_events(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let mut live = f.hub.subscribe(&run.id);
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![call(0, 0, Some(add), "add", r#"{"a":1}"#)]))
        .await
        .unwrap();
    let step = scheduled(&turn[0]);
    assert!(start(&f.store, &step, "d1", 1, "s1").await.is_some());
    let settled = f
        .store
        .record_result(ResultReport {
            dispatch_id: "d1".into(),
            attempt: 1,
            session_id: "s1".into(),
            outcome: Ok("3".into()),
            progress_count: 2,
        })
        .await
        .unwrap()
        .expect("the holder's result is recorded");
    assert_eq!(settled.status, StepStatus::Succeeded);
    assert_eq!(settled.progress_count, 2);

    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    let kinds: Vec<EventType> = log.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventType::RunCreated,
            EventType::RunStarted,
            EventType::ToolScheduled,
            EventType::ToolStart,
            EventType::ToolResult
        ]
    );
    // Watchers saw the same events, after their commit.
    let mut seen = Vec::new();
    while let Ok(crate::hub::Signal::Events(events)) = live.try_recv() {
        seen.extend(events.iter().map(|item| item.event.seq));
    }
    // Events are published before their writer is answered: everything after the subscription is there.
    assert_eq!(seen, vec![2, 3, 4, 5]);
}

async fn results_are_fenced_by_dispatch_attempt_and_session(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![call(0, 0, Some(add), "add", "{}")]))
        .await
        .unwrap();
    let step = scheduled(&turn[0]);
    start(&f.store, &step, "d1", 1, "s1").await.unwrap();
    let before = events(&f.store, &run.id).await.len();
    let report = |dispatch: &str, attempt: u32, session: &str| ResultReport {
        dispatch_id: dispatch.into(),
        attempt,
        session_id: session.into(),
        outcome: Ok("1".into()),
        progress_count: 0,
    };
    assert!(
        f.store.record_result(report("d1", 2, "s1")).await.unwrap().is_none(),
        "wrong attempt"
    );
    assert!(
        f.store.record_result(report("d1", 1, "s2")).await.unwrap().is_none(),
        "another session"
    );
    assert!(
        f.store.record_result(report("nope", 1, "s1")).await.unwrap().is_none(),
        "unknown dispatch"
    );
    assert_eq!(
        events(&f.store, &run.id).await.len(),
        before,
        "stale results record nothing"
    );

    // The lease is lost and the call goes to another worker: the first holder is now stale.
    let LossOutcome::Requeued(requeued) = f
        .store
        .lose_lease(LeaseLoss {
            dispatch_id: "d1".into(),
            attempt: 1,
            reason: "stream broke".into(),
        })
        .await
        .unwrap()
    else {
        panic!("safe_to_retry is requeued")
    };
    assert_eq!(requeued.status, StepStatus::Pending);
    start(&f.store, &requeued, "d2", 2, "s2").await.unwrap();
    assert!(
        f.store.record_result(report("d1", 1, "s1")).await.unwrap().is_none(),
        "late result of the lost lease"
    );
    assert!(f.store.record_result(report("d2", 2, "s2")).await.unwrap().is_some());
    assert!(
        f.store.record_result(report("d2", 2, "s2")).await.unwrap().is_none(),
        "a duplicate result records nothing"
    );
    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    assert_eq!(
        log.iter().filter(|e| e.kind == EventType::ToolResult).count(),
        1,
        "exactly one terminal event"
    );
}

async fn a_lost_at_most_once_call_is_indeterminate(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let charge = tool("charge", Idempotency::AtMostOnce);
    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![call(0, 0, Some(charge), "charge", "{}")]))
        .await
        .unwrap();
    let step = scheduled(&turn[0]);
    start(&f.store, &step, "d1", 1, "s1").await.unwrap();
    let outcome = f
        .store
        .lose_lease(LeaseLoss {
            dispatch_id: "d1".into(),
            attempt: 1,
            reason: "kernel restarted".into(),
        })
        .await
        .unwrap();
    let LossOutcome::Indeterminate(step) = outcome else {
        panic!("expected indeterminate, got {outcome:?}")
    };
    assert!(step.error.unwrap().starts_with("indeterminate:"));
}

fn with_retries(mut def: ToolDef, max_attempts: u32) -> ToolDef {
    def.options.retry = Some(crate::model::RetryPolicy {
        max_attempts,
        initial_interval_ms: 0,
        backoff_coefficient: 1.0,
        max_interval_ms: 0,
    });
    def
}

/// A timeout after `tool:start` is as uncertain as a lost worker: an at_most_once call is
/// indeterminate and not tried again, whatever its retry policy says; the policy still covers
/// errors the tool itself returned.
async fn a_timed_out_at_most_once_call_is_indeterminate_and_never_retried(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let charge = with_retries(tool("charge", Idempotency::AtMostOnce), 3);
    let turn = f
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![
                call(0, 0, Some(charge.clone()), "charge", r#"{"n":1}"#),
                call(0, 1, Some(charge), "charge", r#"{"n":2}"#),
            ],
        ))
        .await
        .unwrap();
    let (timed, erring) = (scheduled(&turn[0]), scheduled(&turn[1]));
    start(&f.store, &timed, "d1", 1, "s1").await.unwrap();
    let step = f.store.time_out("d1".into(), 1).await.unwrap().expect("held");
    assert_eq!(step.status, StepStatus::Failed, "not back to pending: {step:?}");
    assert_eq!(step.error_kind, Some(ErrorKind::Fatal));
    let error = step.error.unwrap();
    assert!(error.starts_with("indeterminate:"), "{error}");
    assert!(error.contains("timed out after 30s"), "{error}");
    assert!(
        start(&f.store, &step_again(&f, &run.id, &timed.key).await, "d2", 2, "s1")
            .await
            .is_none()
    );

    // The tool's own retryable error is its word that the effect did not happen: retried.
    start(&f.store, &erring, "d3", 1, "s1").await.unwrap();
    let retried = f
        .store
        .record_result(ResultReport {
            dispatch_id: "d3".into(),
            attempt: 1,
            session_id: "s1".into(),
            outcome: Err((ErrorKind::Retryable, "card network busy".into())),
            progress_count: 0,
        })
        .await
        .unwrap()
        .expect("held");
    assert_eq!(retried.status, StepStatus::Pending);

    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    let result = log
        .iter()
        .find(|e| e.kind == EventType::ToolResult)
        .expect("the timed-out call settled");
    let payload: serde_json::Value = serde_json::from_str(&result.payload).unwrap();
    assert_eq!(payload["reason"], "indeterminate");
    assert!(
        !log.iter().any(|e| e.kind == EventType::ToolAttemptFailed
            && e.payload.contains(&format!("\"step_key\":\"{}\"", timed.key))),
        "no retry was scheduled for the timed-out call"
    );
}

async fn step_again(f: &Fixture, run: &RunId, key: &StepKey) -> StepRecord {
    f.store
        .reads
        .steps(run.clone())
        .await
        .unwrap()
        .into_iter()
        .find(|s| &s.key == key)
        .expect("step")
}

/// A start built from a stale snapshot of a step (attempt numbers it has issued already) records
/// nothing, so no attempt number is issued twice.
async fn a_start_is_fenced_by_the_attempt_it_expects(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let sleepy = tool("sleepy", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, vec![call(0, 0, Some(sleepy), "sleepy", "{}")]))
        .await
        .unwrap();
    let stale = scheduled(&turn[0]);
    assert!(
        start(&f.store, &stale, "d0", 2, "s1").await.is_none(),
        "attempt 2 before attempt 1"
    );
    start(&f.store, &stale, "d1", 1, "s1").await.expect("attempt 1");
    let outcome = f
        .store
        .lose_lease(LeaseLoss {
            dispatch_id: "d1".into(),
            attempt: 1,
            reason: "worker left".into(),
        })
        .await
        .unwrap();
    assert!(matches!(outcome, LossOutcome::Requeued(_)), "{outcome:?}");
    // Pending again; the snapshot taken before attempt 1 would issue attempt 1 a second time.
    assert!(
        start(&f.store, &stale, "d2", 1, "s1").await.is_none(),
        "attempt 1 was issued already"
    );
    let second = start(&f.store, &stale, "d3", 2, "s1").await.expect("attempt 2");
    assert_eq!(
        (second.attempts, second.dispatch_id.as_ref().map(|id| id.as_str())),
        (2, Some("d3"))
    );
    let starts: Vec<serde_json::Value> = events(&f.store, &run.id)
        .await
        .iter()
        .filter(|e| e.kind == EventType::ToolStart)
        .map(|e| serde_json::from_str(&e.payload).unwrap())
        .collect();
    let attempts: Vec<u64> = starts.iter().map(|p| p["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [1, 2]);
}

async fn unknown_tools_are_recorded_without_start_and_count_toward_the_limit(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 2)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![
                call(0, 0, None, "weather", "{}"),
                call(0, 1, Some(add.clone()), "add", "{}"),
                call(0, 2, Some(add), "add", r#"{"a":2}"#),
            ],
        ))
        .await
        .unwrap();
    let CallDisposition::Settled(unknown) = &turn[0] else {
        panic!("unknown tool settles at once")
    };
    assert_eq!(unknown.error.as_deref(), Some("unknown tool 'weather'; available: add"));
    assert!(matches!(turn[1], CallDisposition::Scheduled(_)));
    let CallDisposition::Settled(limited) = &turn[2] else {
        panic!("the third call is past max_tool_calls")
    };
    assert!(limited.error.as_deref().unwrap().starts_with("max_tool_calls reached"));
    let log = events(&f.store, &run.id).await;
    assert!(!log.iter().any(|e| e.kind == EventType::ToolStart));
    assert_eq!(log.iter().filter(|e| e.kind == EventType::ToolResult).count(), 2);
}

async fn a_call_s_sealed_secrets_are_kept_until_it_settles_then_dropped(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let mut sealed = call(
        0,
        0,
        Some(tool("login", Idempotency::SafeToRetry)),
        "login",
        r#"{"password":{"$secret":"hmac-sha256:00"}}"#,
    );
    sealed.sealed = Some("00ff".into());
    f.store.schedule_turn(plan(&run.id, 0, vec![sealed])).await.unwrap();
    let read = f.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(read[0].sealed.as_deref(), Some("00ff"), "read back for its dispatch");
    f.store
        .cancel_call(run.id.clone(), read[0].key.clone(), "not needed".into())
        .await
        .unwrap();
    let settled = f.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(
        settled[0].sealed, None,
        "never dispatched again, so never unsealed again"
    );
}

async fn a_resubmitted_turn_replays_joins_or_diverges(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let calls = || {
        vec![
            call(0, 0, None, "weather", "{}"),
            call(0, 1, Some(add.clone()), "add", r#"{"a":1}"#),
        ]
    };
    f.store.schedule_turn(plan(&run.id, 0, calls())).await.unwrap();
    let again = f.store.schedule_turn(plan(&run.id, 0, calls())).await.unwrap();
    assert!(matches!(&again[0], CallDisposition::Replayed(s) if s.replays == 1));
    assert!(matches!(again[1], CallDisposition::Joined(_)));
    let stored = f.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(stored[0].replays, 1, "the replay is counted in the store");
    // A turn served from a read counts its replays in one write nobody waits for; the writer
    // applies commands in order, so the next answered write follows it.
    let missing = StepKey::for_call(0, 9, None);
    f.store.note_replays(
        run.id.clone(),
        vec![stored[0].key.clone(), stored[1].key.clone(), missing],
    );
    f.store.register_tools(Vec::new()).await.unwrap();
    let counted = f.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(
        counted.iter().map(|s| s.replays).collect::<Vec<_>>(),
        [2, 1],
        "each step named is counted once; a key with no step is passed over"
    );
    let changed = f
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![call(0, 1, Some(add.clone()), "add", r#"{"a":2}"#)],
        ))
        .await
        .unwrap();
    let CallDisposition::Diverged { message, .. } = &changed[0] else {
        panic!("changed arguments diverge")
    };
    assert!(message.starts_with("replay_input_changed"), "{message}");
}

async fn refused_writes_leave_nothing_behind(f: Fixture) {
    let missing = RunId::new();
    assert!(matches!(
        f.store
            .schedule_turn(plan(&missing, 0, vec![call(0, 0, None, "x", "{}")]))
            .await,
        Err(KernelError::NotFound(_))
    ));
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    f.store
        .end_run(
            run.id.clone(),
            EndRun::Complete {
                output: "1".into(),
                settle_in_flight: false,
            },
        )
        .await
        .unwrap();
    let before = events(&f.store, &run.id).await;
    let refused = f
        .store
        .schedule_turn(plan(&run.id, 1, vec![call(1, 0, None, "x", "{}")]))
        .await;
    assert!(matches!(refused, Err(KernelError::FailedPrecondition(_))));
    assert!(matches!(
        f.store
            .end_run(run.id.clone(), EndRun::Cancel { reason: "late".into() })
            .await,
        Err(KernelError::FailedPrecondition(_))
    ));
    assert_eq!(
        events(&f.store, &run.id).await,
        before,
        "a refused request writes nothing"
    );
    assert!(f.store.reads.steps(run.id.clone()).await.unwrap().is_empty());
}

async fn cancelling_settles_in_flight_steps_before_the_run(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![
                call(0, 0, Some(add.clone()), "add", "{}"),
                call(0, 1, Some(add), "add", "{}"),
            ],
        ))
        .await
        .unwrap();
    start(&f.store, &scheduled(&turn[0]), "d1", 1, "s1").await.unwrap();
    assert!(matches!(
        f.store.end_run(run.id.clone(), EndRun::Complete { output: "1".into(), settle_in_flight: false }).await,
        Err(KernelError::FailedPrecondition(m)) if m.contains("2 tool calls in flight")
    ));
    let (ended, settled) = f
        .store
        .end_run(run.id.clone(), EndRun::Cancel { reason: "user".into() })
        .await
        .unwrap();
    assert_eq!(ended.status, RunStatus::Cancelled);
    assert_eq!(settled.len(), 2);
    assert!(settled.iter().all(|s| s.status == StepStatus::Cancelled));
    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    assert_eq!(
        log.last().unwrap().kind,
        EventType::RunCancelled,
        "the run's terminal event is last"
    );
    // The cancelled call's worker answers late: nothing is recorded.
    let late = ResultReport {
        dispatch_id: "d1".into(),
        attempt: 1,
        session_id: "s1".into(),
        outcome: Ok("1".into()),
        progress_count: 0,
    };
    assert!(f.store.record_result(late).await.unwrap().is_none());
    assert_eq!(events(&f.store, &run.id).await.len(), log.len());
}

async fn one_call_is_cancelled_and_an_idle_run_is_abandoned(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![
                call(0, 0, Some(add.clone()), "add", "{}"),
                call(0, 1, Some(add), "add", "{}"),
            ],
        ))
        .await
        .unwrap();
    let first = scheduled(&turn[0]);
    start(&f.store, &first, "d1", 1, "s1").await.unwrap();
    let cancelled = f
        .store
        .cancel_call(run.id.clone(), first.key.clone(), "not needed".into())
        .await
        .unwrap();
    assert_eq!(cancelled.status, StepStatus::Cancelled);
    assert_eq!(cancelled.error.as_deref(), Some("cancelled: not needed"));
    let before = events(&f.store, &run.id).await;
    assert!(matches!(
        f.store.cancel_call(run.id.clone(), first.key.clone(), "again".into()).await,
        Err(KernelError::FailedPrecondition(m)) if m.contains("already cancelled")
    ));
    assert!(matches!(
        f.store
            .cancel_call(run.id.clone(), StepKey::for_call(7, 0, None), "x".into())
            .await,
        Err(KernelError::NotFound(_))
    ));
    assert!(matches!(
        f.store.cancel_call(RunId::new(), first.key.clone(), "x".into()).await,
        Err(KernelError::NotFound(_))
    ));
    assert!(
        f.store.record_result(returned("d1", "1")).await.unwrap().is_none(),
        "a late result is discarded"
    );
    assert_eq!(events(&f.store, &run.id).await, before, "refusals write nothing");
    let running = f.store.reads.run(run.id.clone()).await.unwrap().unwrap();
    assert_eq!(running.status, RunStatus::Running, "the run goes on");

    assert!(
        f.store.abandon_runs(60_000, 10).await.unwrap().is_empty(),
        "not idle long enough"
    );
    let abandoned = f.store.abandon_runs(0, 10).await.unwrap();
    let (ended, settled) = abandoned
        .into_iter()
        .find(|(ended, _)| ended.id == run.id)
        .expect("the idle run is abandoned");
    assert_eq!(
        (ended.status, ended.reason.as_deref()),
        (RunStatus::Failed, Some("abandoned"))
    );
    assert_eq!(settled.len(), 1, "its other call settled first");
    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    assert_eq!(log.last().unwrap().kind, EventType::RunFailed);
}

async fn concurrent_appends_keep_sequence_numbers_gap_free(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let mut tasks = Vec::new();
    for turn in 0..40 {
        let store = f.store.clone();
        let add = add.clone();
        let run = run.id.clone();
        tasks.push(tokio::spawn(async move {
            store
                .schedule_turn(plan(&run, turn, vec![call(turn, 0, Some(add), "add", "{}")]))
                .await
                .unwrap()
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let log = events(&f.store, &run.id).await;
    assert_eq!(log.len(), 1 + 1 + 40);
    assert_gap_free(&log);
}

/// A SQLite database, migrated, with one bare run in it, for tests that read it without a writer
/// (`k.db` in the directory), and a connection to it.
fn database_with_a_run() -> (tempfile::TempDir, RunId, rusqlite::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let id = RunId::new();
    let mut conn = rusqlite::Connection::open(dir.path().join("k.db")).unwrap();
    schema::migrate(&mut conn).unwrap();
    schema::insert_bare_run(&conn, id.as_str()).unwrap();
    (dir, id, conn)
}

/// A turn's read runs on the runtime's thread. When SQLite's lock is taken (recovering the log
/// after a crash, say) it must not sleep there, stalling every task on that thread: it moves to
/// a blocking thread, which waits for the lock and answers. (A database in rollback-journal mode,
/// where a writer's exclusive lock keeps readers out, stands in for the rare lock of WAL mode.)
#[tokio::test(flavor = "current_thread")]
async fn a_turn_read_that_finds_the_database_locked_waits_off_the_runtime() {
    let (dir, id, conn) = database_with_a_run();
    let path = dir.path().join("k.db");
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let locker = std::thread::spawn(move || {
        conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
        locked.send(()).unwrap();
        released.recv().unwrap();
        conn.execute_batch("COMMIT").unwrap();
    });
    is_locked.recv().unwrap();
    let reads = Readers::open(&path, None, Clock::wall()).unwrap();
    let read = tokio::spawn({
        let id = id.clone();
        let reads = reads.clone();
        async move { reads.turn::<StepRecord>(id, Vec::new()).await }
    });
    // On this one-thread runtime the timer fires on time only if the read left the thread free;
    // a read sleeping on the lock there would hold it for its whole busy timeout (seconds).
    let asleep = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let slept = asleep.elapsed();
    assert!(
        slept < reads::BUSY_WAIT / 2,
        "the runtime's thread was held for {slept:?}"
    );
    assert!(!read.is_finished(), "the read waits for the lock: {:?}", read.await);
    release.send(()).unwrap();
    let (found, _) = read.await.unwrap().unwrap();
    assert_eq!(found.map(|r| r.id), Some(id));
    locker.join().unwrap();
    assert_eq!(reads.idle_in_transaction(), 0, "the refused read's transaction ended");
}

/// A kernel left idle gives back what SQLite kept for pages: the writer frees the pooled
/// readers' page caches (through the allocator, jemalloc, which returns them to the system), and
/// the connections stay pooled and read on.
#[tokio::test(flavor = "current_thread")]
async fn pooled_readers_give_back_their_page_caches() {
    let (dir, id, conn) = database_with_a_run();
    let path = dir.path().join("k.db");
    conn.execute(
        "INSERT INTO events (id, run_id, seq, type, schema_version, at, payload, prev) \
         WITH RECURSIVE n(seq) AS (SELECT 1 UNION ALL SELECT seq + 1 FROM n WHERE seq < 500) \
         SELECT seq, ?1, seq, 'run:created', 1, 0, printf('%.*c', 2000, 'x'), NULLIF(seq - 1, 0) FROM n",
        [id.as_str()],
    )
    .unwrap();
    conn.execute(
        "UPDATE runs SET last_seq = 500, last_event = 500 WHERE id = ?1",
        [id.as_str()],
    )
    .unwrap();
    let reads = Readers::open(&path, None, Clock::wall()).unwrap();
    // A megabyte of rows read through the pool's one connection fills its page cache.
    assert_eq!(reads.events(id.clone(), 1, 1000).await.unwrap().len(), 500);
    let freed = tikv_jemalloc_ctl::thread::deallocatedp::read().unwrap();
    let before = freed.get();
    reads.release_memory();
    let released = freed.get() - before;
    assert!(released > 512 << 10, "freed {released} bytes of the reader's cache");
    assert_eq!(
        reads.events(id, 500, 10).await.unwrap().len(),
        1,
        "the connection reads on"
    );
}

#[tokio::test]
async fn the_store_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.db");
    let id = {
        let (store, writer) = Store::open(&path, Durability::Full, (Hub::default(), Clock::wall())).unwrap();
        let (run, _) = store.create_run(new_run(None, 0)).await.unwrap();
        store
            .register_tools(vec![tool("add", Idempotency::SafeToRetry)])
            .await
            .unwrap();
        drop(store);
        tokio::task::spawn_blocking(move || writer.join()).await.unwrap();
        run.id
    };
    let (store, _writer) = Store::open(&path, Durability::Full, (Hub::default(), Clock::wall())).unwrap();
    assert_eq!(store.reads.run(id).await.unwrap().unwrap().status, RunStatus::Pending);
    assert_eq!(store.reads.tools().await.unwrap().len(), 1);
}

/// A dispatch of `tool` running as `dispatch` (attempt 1) on session `s1`: the only kind of
/// caller that may write the tool's cache.
async fn running(fx: &Fixture, tool_name: &str, dispatch: &str) -> StepRecord {
    let (run, _) = fx.store.create_run(new_run(None, 0)).await.unwrap();
    let def = tool(tool_name, Idempotency::SafeToRetry);
    let turn = fx
        .store
        .schedule_turn(plan(&run.id, 0, vec![call(0, 0, Some(def), tool_name, "{}")]))
        .await
        .unwrap();
    start(&fx.store, &scheduled(&turn[0]), dispatch, 1, "s1")
        .await
        .expect("started")
}

fn cache_entry(dispatch: &str, key: &str, value: &str, expires_at: Option<i64>) -> ToolCacheSet {
    ToolCacheSet {
        dispatch_id: dispatch.into(),
        attempt: 1,
        session_id: "s1".into(),
        key: key.into(),
        value: value.into(),
        expires_at,
    }
}

async fn tool_cache_entries_are_namespaced_per_tool_and_expire(fx: Fixture) {
    let now = fx.clock.now_millis();
    running(&fx, "rates", "d-rates").await;
    let get = |tool: &str, key: &str| fx.store.reads.tool_cache_get(tool.into(), key.into());

    assert_eq!(get("rates", "eur").await.unwrap(), None);
    fx.store
        .tool_cache_set(cache_entry("d-rates", "eur", r#"{"usd":1.08}"#, None))
        .await
        .unwrap();
    assert_eq!(get("rates", "eur").await.unwrap().as_deref(), Some(r#"{"usd":1.08}"#));
    assert_eq!(
        get("weather", "eur").await.unwrap(),
        None,
        "another tool never sees the entry"
    );

    fx.store
        .tool_cache_set(cache_entry("d-rates", "eur", "1.1", Some(now + 60_000)))
        .await
        .unwrap();
    assert_eq!(
        get("rates", "eur").await.unwrap().as_deref(),
        Some("1.1"),
        "a set replaces"
    );
    fx.clock.advance(std::time::Duration::from_millis(59_999));
    assert_eq!(
        get("rates", "eur").await.unwrap().as_deref(),
        Some("1.1"),
        "an entry lives until its time"
    );
    fx.clock.advance(std::time::Duration::from_millis(1));
    assert_eq!(get("rates", "eur").await.unwrap(), None, "and not a millisecond beyond");
    let now = fx.clock.now_millis();

    fx.store
        .tool_cache_set(cache_entry("d-rates", "gbp", "0.85", Some(now - 1)))
        .await
        .unwrap();
    assert_eq!(
        get("rates", "gbp").await.unwrap(),
        None,
        "an expired entry is not found"
    );
    fx.store
        .tool_cache_set(cache_entry("d-rates", "gbp", "0.86", None))
        .await
        .unwrap();
    assert_eq!(
        get("rates", "gbp").await.unwrap().as_deref(),
        Some("0.86"),
        "and can be set again"
    );
}

/// An approval with a timeout stays pending until its deadline on the clock and expires at it,
/// settling its call; the kernel's expiry pass finds nothing due before.
async fn an_approval_expires_at_its_deadline_and_not_before(fx: Fixture) {
    let (run, _) = fx.store.create_run(new_run(None, 0)).await.unwrap();
    let mut gated = call(0, 0, Some(tool("refund", Idempotency::AtMostOnce)), "refund", "{}");
    gated.gate = CallGate::Approve(crate::model::ApprovalGate {
        timeout_ms: Some(600_000),
        approvers: vec!["finance".into()],
        message: None,
        decided_by: "rule:refunds".into(),
    });
    let asked_at = fx.clock.now_millis();
    let turn = fx.store.schedule_turn(plan(&run.id, 0, vec![gated])).await.unwrap();
    assert!(matches!(turn[0], CallDisposition::Gated(_)), "{:?}", turn[0]);
    let pending = fx
        .store
        .reads
        .approvals(ApprovalStatus::Pending, Some(run.id.clone()))
        .await
        .unwrap();
    assert_eq!(pending[0].expires_at, Some(asked_at + 600_000), "{pending:?}");

    fx.clock.advance(std::time::Duration::from_millis(599_999));
    assert!(!fx.store.reads.approvals_due(fx.clock.now_millis()).await.unwrap());
    let early = fx.store.expire_approvals().await.unwrap();
    assert!(
        early.approvals.is_empty(),
        "nothing is due a millisecond early: {early:?}"
    );

    fx.clock.advance(std::time::Duration::from_millis(1));
    assert!(fx.store.reads.approvals_due(fx.clock.now_millis()).await.unwrap());
    let expired = fx.store.expire_approvals().await.unwrap();
    assert_eq!(expired.approvals.len(), 1, "{expired:?}");
    assert_eq!(expired.approvals[0].status, ApprovalStatus::Expired);
    assert_eq!(expired.approvals[0].answered_at, Some(asked_at + 600_000));
    let step = fx.store.reads.steps(run.id.clone()).await.unwrap().remove(0);
    assert!(
        step.status.is_terminal(),
        "the call is settled without running: {step:?}"
    );
    assert_eq!(step.attempts, 0, "{step:?}");
}

async fn only_a_dispatch_still_running_on_its_session_writes_the_cache(fx: Fixture) {
    let step = running(&fx, "rates", "d1").await;
    let get = || fx.store.reads.tool_cache_get("rates".into(), "eur".into());

    let refused = [
        ToolCacheSet {
            session_id: "another-session".into(),
            ..cache_entry("d1", "eur", "1", None)
        },
        ToolCacheSet {
            attempt: 2,
            ..cache_entry("d1", "eur", "1", None)
        },
        cache_entry("never-sent", "eur", "1", None),
    ];
    for entry in refused {
        let error = fx.store.tool_cache_set(entry.clone()).await.unwrap_err();
        assert!(
            matches!(error, KernelError::FailedPrecondition(_)),
            "{entry:?}: {error:?}"
        );
        assert!(error.to_string().contains("no longer runs on this session"), "{error}");
    }
    assert_eq!(get().await.unwrap(), None, "a refused write leaves nothing");

    // Once the call settles, its dispatch can no longer write, however late its request comes.
    fx.store
        .tool_cache_set(cache_entry("d1", "eur", "1", None))
        .await
        .unwrap();
    fx.store
        .record_result(returned("d1", "null"))
        .await
        .unwrap()
        .expect("settled");
    let error = fx
        .store
        .tool_cache_set(cache_entry("d1", "eur", "2", None))
        .await
        .unwrap_err();
    assert!(matches!(error, KernelError::FailedPrecondition(_)), "{error:?}");
    assert_eq!(
        get().await.unwrap().as_deref(),
        Some("1"),
        "the late write changed nothing"
    );
    assert_eq!(step.tool, "rates");
}

async fn expired_cache_entries_are_purged_in_batches_and_live_ones_stay(fx: Fixture) {
    let now = fx.clock.now_millis();
    running(&fx, "rates", "d1").await;
    for n in 0..5 {
        let expires_at = Some(now - 1_000 + n);
        fx.store
            .tool_cache_set(cache_entry("d1", &format!("old-{n}"), "1", expires_at))
            .await
            .unwrap();
    }
    fx.store
        .tool_cache_set(cache_entry("d1", "live", "2", Some(now + 60_000)))
        .await
        .unwrap();
    fx.store
        .tool_cache_set(cache_entry("d1", "forever", "3", None))
        .await
        .unwrap();

    assert_eq!(fx.store.purge_expired(3).await.unwrap(), 3, "at most a batch per write");
    assert_eq!(fx.store.purge_expired(3).await.unwrap(), 2);
    assert_eq!(fx.store.purge_expired(3).await.unwrap(), 0);
    let get = |key: &str| fx.store.reads.tool_cache_get("rates".into(), key.into());
    assert_eq!(get("live").await.unwrap().as_deref(), Some("2"));
    assert_eq!(get("forever").await.unwrap().as_deref(), Some("3"));
}

async fn refused_tool_cache_entries_write_nothing(fx: Fixture) {
    running(&fx, "t", "d-t").await;
    let refusals = [
        (cache_entry("d-t", "", "1", None), "key: must be 1 to 256 bytes, got 0"),
        (
            cache_entry("d-t", &"k".repeat(257), "1", None),
            "key: must be 1 to 256 bytes, got 257",
        ),
        (cache_entry("d-t", "k", "{oops", None), "value_json: not valid JSON"),
        (
            cache_entry(
                "d-t",
                "k",
                &format!("\"{}\"", "x".repeat(TOOL_CACHE_MAX_VALUE_BYTES)),
                None,
            ),
            "value_json: 1048578 bytes is over the limit",
        ),
    ];
    for (entry, expected) in refusals {
        let error = fx.store.tool_cache_set(entry).await.unwrap_err();
        assert!(matches!(error, KernelError::InvalidArgument { .. }), "{error:?}");
        assert!(error.to_string().starts_with(expected), "{error}");
    }
    assert_eq!(
        fx.store.reads.tool_cache_get("t".into(), "k".into()).await.unwrap(),
        None
    );
    let error = fx
        .store
        .reads
        .tool_cache_get("t".into(), String::new())
        .await
        .unwrap_err();
    assert!(matches!(error, KernelError::InvalidArgument { .. }), "{error:?}");

    let largest = format!("\"{}\"", "x".repeat(TOOL_CACHE_MAX_VALUE_BYTES - 2));
    fx.store
        .tool_cache_set(cache_entry("d-t", &"k".repeat(256), &largest, None))
        .await
        .unwrap();
    let stored = fx
        .store
        .reads
        .tool_cache_get("t".into(), "k".repeat(256))
        .await
        .unwrap();
    assert_eq!(
        stored.map(|v| v.len()),
        Some(TOOL_CACHE_MAX_VALUE_BYTES),
        "the limits are inclusive"
    );
}

async fn the_pending_call_limit_holds_for_concurrent_turns(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = |n: u32| {
        let mut plan = plan(
            &run.id,
            n,
            vec![
                call(n, 0, Some(add.clone()), "add", "{}"),
                call(n, 1, Some(add.clone()), "add", "{}"),
            ],
        );
        plan.max_pending_calls = 3;
        plan
    };
    let (a, b) = tokio::join!(f.store.schedule_turn(turn(0)), f.store.schedule_turn(turn(1)));
    let refused = [&a, &b]
        .iter()
        .filter(|r| matches!(r, Err(KernelError::LimitExceeded { .. })))
        .count();
    assert_eq!(
        refused, 1,
        "two turns of two calls cannot both fit under a limit of three: {a:?} {b:?}"
    );
    let pending = f.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(pending.len(), 2, "the refused turn wrote nothing");
    // Resubmitting the admitted turn joins its calls: they are not counted twice.
    let admitted = if a.is_ok() { 0 } else { 1 };
    assert!(f.store.schedule_turn(turn(admitted)).await.is_ok());
}

/// Any range of a run's log reads as the same slice of the whole, whatever other runs wrote
/// between its events (on SQLite a read walks the run's events back from a marked one, see
/// `store::chain`, so ranges are taken on both sides of the marks).
async fn a_range_of_a_runs_log_is_that_slice_of_the_whole(f: Fixture) {
    let add = tool("add", Idempotency::SafeToRetry);
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(f.store.create_run(new_run(None, 0)).await.unwrap().0.id);
    }
    for turn in 0..3 {
        for run in &runs {
            let calls = (0..300)
                .map(|position| call(turn, position, Some(add.clone()), "add", "{}"))
                .collect();
            f.store.schedule_turn(plan(run, turn, calls)).await.unwrap();
        }
    }
    for run in &runs {
        let whole = events(&f.store, run).await;
        assert_gap_free(&whole);
        assert!(whole.len() > 900, "{} events", whole.len());
        assert!(whole.iter().all(|event| event.run_id == *run));
        let last = whole.len() as u64;
        for (from, limit) in [
            (0, 3),
            (1, 1),
            (1, 500),
            (200, 300),
            (255, 2),
            (256, 1),
            (257, 256),
            (500, 500),
            (last - 1, 10),
            (last, 1),
            (last + 1, 5),
            (3, 0),
        ] {
            let read = f.store.reads.events(run.clone(), from, limit).await.unwrap();
            let expected: Vec<u64> = whole
                .iter()
                .map(|event| event.seq)
                .filter(|&seq| seq >= from)
                .take(limit as usize)
                .collect();
            let seqs: Vec<u64> = read.iter().map(|event| event.seq).collect();
            assert_eq!(seqs, expected, "events of run {run} from {from}, at most {limit}");
            let same = read
                .iter()
                .zip(whole.iter().skip(expected.first().map_or(0, |&seq| seq as usize - 1)));
            for (got, want) in same {
                assert_eq!((got.kind, &got.payload), (want.kind, &want.payload));
            }
        }
    }
}

/// The events-per-run limit is checked in the write against the log's true length: of two turns
/// sent at once when the log has room for one more call, one is recorded and the other refused.
async fn concurrent_turns_cannot_both_pass_the_events_limit(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let logged = events(&f.store, &run.id).await.len() as u64;
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = |n: u32| {
        let mut turn = plan(&run.id, n, vec![call(n, 0, Some(add.clone()), "add", "{}")]);
        turn.max_events = logged + crate::limits::EVENTS_PER_CALL;
        turn
    };
    let (first, second) = tokio::join!(f.store.schedule_turn(turn(0)), f.store.schedule_turn(turn(1)));
    let refused: Vec<KernelError> = [first, second].into_iter().filter_map(Result::err).collect();
    assert_eq!(refused.len(), 1, "exactly one of the two is refused: {refused:?}");
    assert!(
        refused[0].to_string().contains("events per run (--max-events-per-run)"),
        "{}",
        refused[0]
    );
    assert_eq!(f.store.reads.steps(run.id.clone()).await.unwrap().len(), 1);
}

/// A cached result belongs to the run that stored it and to every run served from it: deleting one
/// of them leaves it to the others, and it goes with the last.
async fn a_cached_result_goes_only_with_the_last_run_it_belongs_to(f: Fixture) {
    let reader = {
        let mut def = tool("lookup", Idempotency::SafeToRetry);
        def.options.read_only = true;
        def.options.cache_ttl_ms = Some(60_000);
        def
    };
    let lookup = |run: &RunId| plan(run, 0, vec![call(0, 0, Some(reader.clone()), "lookup", r#"{"q":1}"#)]);
    let finish = |run: RunId| {
        f.store.end_run(
            run,
            EndRun::Complete {
                output: "null".into(),
                settle_in_flight: false,
            },
        )
    };
    let cached = || async {
        f.store
            .reads
            .with(|conn| conn.query_row("SELECT COUNT(*) FROM result_cache", &[], |row| row.get::<i64>(0)))
            .await
            .unwrap()
    };

    let (stored, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let step = scheduled(&f.store.schedule_turn(lookup(&stored.id)).await.unwrap()[0]);
    start(&f.store, &step, "d1", 1, "s1").await.unwrap();
    f.store.record_result(returned("d1", "42")).await.unwrap();
    let mut served = Vec::new();
    for _ in 0..2 {
        let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
        let turn = f.store.schedule_turn(lookup(&run.id)).await.unwrap();
        let CallDisposition::Settled(hit) = &turn[0] else {
            panic!("expected a cache hit, got {:?}", turn[0]);
        };
        assert_eq!(hit.output.as_deref(), Some("42"));
        served.push(run.id);
    }
    for run in [stored.id.clone(), served[0].clone(), served[1].clone()] {
        finish(run).await.unwrap();
    }

    let deleted = f.store.delete_run(stored.id).await.unwrap();
    assert_eq!(deleted.cache_entries, 0, "the runs served from it keep it");
    assert_eq!(cached().await, 1);
    let deleted = f.store.delete_run(served[0].clone()).await.unwrap();
    assert_eq!(deleted.cache_entries, 0);
    let (later, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let turn = f.store.schedule_turn(lookup(&later.id)).await.unwrap();
    assert!(
        matches!(turn[0], CallDisposition::Settled(_)),
        "still served: {:?}",
        turn[0]
    );
    finish(later.id.clone()).await.unwrap();

    assert_eq!(f.store.delete_run(served[1].clone()).await.unwrap().cache_entries, 0);
    assert_eq!(
        f.store.delete_run(later.id).await.unwrap().cache_entries,
        1,
        "the last one takes it"
    );
    assert_eq!(cached().await, 0);
}

/// Deleting a run takes everything recorded under it and nothing of other runs; a run in flight
/// is refused and keeps everything.
async fn a_finished_run_is_deleted_whole_and_a_run_in_flight_is_refused(f: Fixture) {
    let reader = {
        let mut def = tool("lookup", Idempotency::SafeToRetry);
        def.options.read_only = true;
        def.options.cache_ttl_ms = Some(60_000);
        def
    };
    let mut runs = Vec::new();
    for n in 0..2 {
        let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
        let args = format!(r#"{{"n":{n}}}"#);
        let turn = f
            .store
            .schedule_turn(plan(
                &run.id,
                0,
                vec![call(0, 0, Some(reader.clone()), "lookup", &args)],
            ))
            .await
            .unwrap();
        let step = scheduled(&turn[0]);
        let dispatch = format!("d{n}");
        start(&f.store, &step, &dispatch, 1, "s1").await.unwrap();
        f.store.record_result(returned(&dispatch, "42")).await.unwrap();
        runs.push(run.id);
    }
    let refused = f.store.delete_run(runs[0].clone()).await.unwrap_err();
    assert!(matches!(refused, KernelError::FailedPrecondition(_)), "{refused}");
    assert!(refused.to_string().contains("cancel it first"), "{refused}");
    assert!(
        !events(&f.store, &runs[0]).await.is_empty(),
        "a refused delete keeps everything"
    );

    f.store
        .end_run(
            runs[0].clone(),
            EndRun::Complete {
                output: "null".into(),
                settle_in_flight: false,
            },
        )
        .await
        .unwrap();
    let logged = events(&f.store, &runs[0]).await.len() as u64;
    let others = events(&f.store, &runs[1]).await;
    let deleted = f.store.delete_run(runs[0].clone()).await.unwrap();
    assert_eq!(
        deleted,
        Deleted {
            runs: 1,
            events: logged,
            steps: 1,
            approvals: 0,
            cache_entries: 1,
        }
    );
    assert!(f.store.reads.run(runs[0].clone()).await.unwrap().is_none());
    assert!(events(&f.store, &runs[0]).await.is_empty());
    assert!(matches!(
        f.store.delete_run(runs[0].clone()).await,
        Err(KernelError::NotFound(_))
    ));
    // The other run, its log and its cached result, are untouched.
    assert_eq!(f.store.reads.steps(runs[1].clone()).await.unwrap().len(), 1);
    assert_eq!(events(&f.store, &runs[1]).await, others);
    let still: i64 = f
        .store
        .reads
        .with(|conn| conn.query_row("SELECT COUNT(*) FROM result_cache", &[], |row| row.get(0)))
        .await
        .unwrap();
    assert_eq!(still, 1);

    // Pruning takes only finished runs older than the cut.
    f.store
        .end_run(runs[1].clone(), EndRun::Cancel { reason: "done".into() })
        .await
        .unwrap();
    let (young, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let none = f.store.prune_runs(0, 100).await.unwrap();
    assert_eq!(none.runs, 0, "nothing finished before the epoch");
    let pruned = f.store.prune_runs(f.clock.now_millis() + 1, 100).await.unwrap();
    assert_eq!(pruned.runs, 1, "the finished run goes, the pending one stays");
    assert!(f.store.reads.run(young.id).await.unwrap().is_some());
}

/// The step a local step's record wrote; any other answer fails the test.
fn recorded(answer: StepRecorded) -> crate::model::StepRecord {
    match answer {
        StepRecorded::Recorded(step) => step,
        other => panic!("recorded: {other:?}"),
    }
}

fn hosted_run() -> NewRun {
    let mut new = new_run(None, 0);
    new.agent = "researcher".into();
    new.hosted = Some(crate::store::HostedAgent {
        name: "researcher".into(),
        fingerprint: "fp".into(),
        version: "1".into(),
    });
    new
}

fn local(seq: u32, id: &str) -> crate::store::LocalStep {
    crate::store::LocalStep {
        seq,
        step_id: id.into(),
        occurrence: 0,
        effect: crate::model::Effect::Write,
        once: false,
        outcome: Ok("7".into()),
        decided_by: None,
        denied: false,
        blocked: false,
    }
}

fn fence(dispatch: &str, attempt: u32) -> crate::store::Fence {
    crate::store::Fence {
        dispatch_id: dispatch.into(),
        attempt,
    }
}

/// A hosted run is created with its dispatch pending; only the attempt holding that dispatch
/// records a step, and a refused step writes nothing.
async fn a_hosted_run_records_steps_only_from_the_attempt_holding_its_dispatch(f: Fixture) {
    let (run, _, dispatch) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    let dispatch = dispatch.expect("a hosted run's dispatch");
    assert_eq!((dispatch.kind, dispatch.status), (StepKind::Agent, StepStatus::Pending));
    let started = start(&f.store, &dispatch, "d1", 1, "s1").await.expect("dispatched");
    assert_eq!(
        f.store.reads.run(run.id.clone()).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let before = events(&f.store, &run.id).await.len();
    for stale in [fence("d1", 2), fence("d0", 1)] {
        let refused = f
            .store
            .record_step(
                (run.id.clone(), stale),
                local(0, "fetch"),
                crate::store::StepGate::Unchecked,
            )
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("no longer holds"), "{refused}");
    }
    assert_eq!(
        events(&f.store, &run.id).await.len(),
        before,
        "a refused step writes nothing"
    );
    let recorded = f
        .store
        .record_step(
            (run.id.clone(), fence("d1", 1)),
            local(0, "fetch"),
            crate::store::StepGate::Unchecked,
        )
        .await
        .unwrap();
    let StepRecorded::Recorded(step) = recorded else {
        panic!("recorded: {recorded:?}")
    };
    assert_eq!((step.kind, step.output.as_deref()), (StepKind::Local, Some("7")));
    // The same step again keeps its first outcome.
    let again = f
        .store
        .record_step(
            (run.id.clone(), fence("d1", 1)),
            local(0, "fetch"),
            crate::store::StepGate::Unchecked,
        )
        .await
        .unwrap();
    assert!(matches!(again, StepRecorded::Replayed(_)), "{again:?}");
    // A lost host: the dispatch is pending again, and the next attempt is the one that records.
    let lost = f
        .store
        .lose_lease(LeaseLoss {
            dispatch_id: "d1".into(),
            attempt: 1,
            reason: "worker gone".into(),
        })
        .await
        .unwrap();
    assert!(
        matches!(lost, LossOutcome::Requeued(ref step) if step.status == StepStatus::Pending),
        "{lost:?}"
    );
    assert!(
        f.store
            .record_step(
                (run.id.clone(), fence("d1", 1)),
                local(1, "next"),
                crate::store::StepGate::Unchecked
            )
            .await
            .is_err()
    );
    start(&f.store, &started, "d2", 2, "s2")
        .await
        .expect("dispatched again");
    assert!(
        f.store
            .record_step(
                (run.id.clone(), fence("d2", 2)),
                local(1, "next"),
                crate::store::StepGate::Unchecked
            )
            .await
            .is_ok()
    );
    assert_gap_free(&events(&f.store, &run.id).await);
}

/// A local step its handler checked before running it is recorded as that check allowed it,
/// though the policy denies it by the time it is recorded (reloaded in between): it ran, and the
/// audit must not name a deny rule for it. A step recorded without its check is decided at its
/// record (denied: recorded so, whatever it sent), and a check noted by an earlier attempt does not
/// speak for the next one.
async fn a_checked_step_is_recorded_as_its_check_allowed_it(f: Fixture) {
    use crate::model::Outcome;
    use crate::store::StepGate;
    let (run, _, dispatch) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    let dispatch = dispatch.unwrap();
    start(&f.store, &dispatch, "d1", 1, "s1").await.unwrap();
    let allowed = StepGate::Allowed {
        decided_by: "rule:steps_ok".into(),
    };
    let denied = || StepGate::Denied {
        reason: "step:fetch not allowed. reason: reloaded".into(),
        decided_by: "rule:no_steps".into(),
    };
    let checked = f
        .store
        .check_step((run.id.clone(), fence("d1", 1)), local(0, "fetch"), allowed.clone())
        .await
        .unwrap();
    assert!(
        matches!(&checked, StepRecorded::Allowed { decided_by: Some(by) } if by == "rule:steps_ok"),
        "{checked:?}"
    );
    let step = recorded(
        f.store
            .record_step((run.id.clone(), fence("d1", 1)), local(0, "fetch"), denied())
            .await
            .unwrap(),
    );
    assert_eq!(
        (step.outcome, step.output.as_deref(), step.decided_by.as_deref()),
        (Some(Outcome::Ok), Some("7"), Some("rule:steps_ok")),
        "the check made before it ran stands"
    );
    // Not checked: the record is the decision, and a denial replaces what the handler sent.
    let step = recorded(
        f.store
            .record_step((run.id.clone(), fence("d1", 1)), local(1, "pay"), denied())
            .await
            .unwrap(),
    );
    assert_eq!(
        (step.outcome, step.output, step.decided_by.as_deref()),
        (Some(Outcome::Denied), None, Some("rule:no_steps"))
    );
    // Checked by attempt 1, recorded by attempt 2 without a check of its own: decided anew.
    f.store
        .check_step((run.id.clone(), fence("d1", 1)), local(2, "send"), allowed.clone())
        .await
        .unwrap();
    f.store
        .lose_lease(LeaseLoss {
            dispatch_id: "d1".into(),
            attempt: 1,
            reason: "worker gone".into(),
        })
        .await
        .unwrap();
    let pending = f.store.reads.steps(run.id.clone()).await.unwrap();
    let pending = pending.iter().find(|s| s.kind == StepKind::Agent).unwrap();
    start(&f.store, pending, "d2", 2, "s2").await.expect("dispatched again");
    let step = recorded(
        f.store
            .record_step((run.id.clone(), fence("d2", 2)), local(2, "send"), denied())
            .await
            .unwrap(),
    );
    assert_eq!(step.outcome, Some(Outcome::Denied));
    assert_gap_free(&events(&f.store, &run.id).await);
}

/// What a command leaves to do is handed out after its commit, as data, and only for a command
/// that committed: a scheduled call and a new hosted dispatch to queue, a retry to queue again, the
/// steps an ending run settled to cancel (naming why), and nothing for a refused command.
async fn effects_are_handed_out_after_the_commit_they_follow(f: Fixture) {
    use crate::machine::effects::Effect;
    let (sink, mut handed) = tokio::sync::mpsc::unbounded_channel();
    f.store.on_effects(move |effects| {
        let _ = sink.send(effects);
    });
    let mut next = async || handed.recv().await.expect("effects handed out");
    let retrying = tool("flaky", Idempotency::SafeToRetry);
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let mut flaky = call(0, 0, Some(retrying.clone()), "flaky", "{}");
    flaky.tool = Some(std::sync::Arc::new(ToolDef {
        options: ToolOptions {
            retry: Some(crate::model::RetryPolicy {
                max_attempts: 2,
                initial_interval_ms: 0,
                backoff_coefficient: 1.0,
                max_interval_ms: 0,
            }),
            ..retrying.options.clone()
        },
        ..retrying
    }));
    f.store.record_turn(plan(&run.id, 0, vec![flaky])).await.unwrap();
    let Ok([Effect::Dispatch(scheduled)]) = <[Effect; 1]>::try_from(next().await) else {
        panic!("the scheduled call is queued")
    };
    assert_eq!(
        (scheduled.key.as_str(), scheduled.status),
        ("t0/p0", StepStatus::Pending)
    );
    let started = start(&f.store, &scheduled, "d1", 1, "s1").await.unwrap();
    let retry = f
        .store
        .record_outcome(ResultReport {
            dispatch_id: "d1".into(),
            attempt: 1,
            session_id: "s1".into(),
            outcome: Err((ErrorKind::Retryable, "busy".into())),
            progress_count: 0,
        })
        .await
        .unwrap()
        .unwrap()
        .0;
    assert_eq!(retry.status, StepStatus::Pending, "{retry:?}");
    let Ok([Effect::Dispatch(again)]) = <[Effect; 1]>::try_from(next().await) else {
        panic!("the retry is queued again")
    };
    assert_eq!((again.key.clone(), again.attempts), (started.key.clone(), 1));
    // A refused command commits nothing and hands out nothing; the next one's effects come next.
    assert!(f.store.record_turn(plan(&RunId::new(), 0, Vec::new())).await.is_err());
    let (hosted, _, _) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    let Ok([Effect::Dispatch(dispatch)]) = <[Effect; 1]>::try_from(next().await) else {
        panic!("the hosted run's dispatch is queued")
    };
    assert_eq!((dispatch.run_id.clone(), dispatch.kind), (hosted.id, StepKind::Agent));
    f.store
        .end_run(
            run.id.clone(),
            EndRun::Cancel {
                reason: "enough".into(),
            },
        )
        .await
        .unwrap();
    let Ok([Effect::Cancel { steps, reason }]) = <[Effect; 1]>::try_from(next().await) else {
        panic!("the run's call is cancelled on its worker")
    };
    assert_eq!(
        (steps.len(), steps[0].status, reason.as_str()),
        (1, StepStatus::Cancelled, "run cancelled: enough")
    );
    assert!(handed.try_recv().is_err(), "nothing else was handed out");
}

/// A handler that reaches a place recorded with another step diverged: the run fails with
/// `replay_input_changed` in that same write, its dispatch is settled, and whatever the handler
/// does next (here, returning an output as if nothing happened) changes nothing.
async fn a_divergence_fails_the_hosted_run_in_the_write_that_finds_it(f: Fixture) {
    let (run, _, dispatch) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    start(&f.store, &dispatch.unwrap(), "d1", 1, "s1").await.unwrap();
    let recorded = f
        .store
        .record_step(
            (run.id.clone(), fence("d1", 1)),
            local(0, "fetch"),
            crate::store::StepGate::Unchecked,
        )
        .await
        .unwrap();
    assert!(matches!(recorded, StepRecorded::Recorded(_)), "{recorded:?}");
    let other = f
        .store
        .record_step(
            (run.id.clone(), fence("d1", 1)),
            local(0, "pay"),
            crate::store::StepGate::Unchecked,
        )
        .await
        .unwrap();
    let StepRecorded::Diverged { message, ended } = &other else {
        panic!("another step at a recorded place diverges: {other:?}")
    };
    assert!(message.contains("step:fetch#0"), "{message}");
    assert!(
        ended
            .iter()
            .any(|s| s.key == StepKey::agent() && s.status.is_terminal()),
        "the handler's dispatch settled with the run, to cancel on its worker: {ended:?}"
    );
    let failed = f.store.reads.run(run.id.clone()).await.unwrap().unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(
        failed
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("replay_input_changed")),
        "{failed:?}"
    );
    let logged = events(&f.store, &run.id).await;
    assert_eq!(logged.last().unwrap().kind, EventType::RunFailed);

    // The handler caught the error and returns an output: nothing changes.
    let late = f.store.record_result(returned("d1", "42")).await.unwrap();
    assert!(late.is_none(), "the cancelled dispatch records nothing: {late:?}");
    assert_eq!(
        f.store.reads.run(run.id.clone()).await.unwrap().unwrap().status,
        RunStatus::Failed
    );
    assert_eq!(events(&f.store, &run.id).await.len(), logged.len());
    assert_gap_free(&logged);
}

/// A suspended handler is woken in the commit that settles what it waits on, so no wake-up is
/// lost between the two, and that commit leaves the woken dispatch to queue (its effect).
async fn a_suspended_handler_is_woken_in_the_commit_that_settles_its_call(f: Fixture) {
    use crate::machine::effects::Effect;
    let (sink, mut handed) = tokio::sync::mpsc::unbounded_channel();
    f.store.on_effects(move |effects| {
        let _ = sink.send(effects);
    });
    let (run, _, dispatch) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    start(&f.store, &dispatch.unwrap(), "d1", 1, "s1").await.unwrap();
    let mut turn = plan(
        &run.id,
        0,
        vec![call(0, 0, Some(tool("add", Idempotency::SafeToRetry)), "add", "{}")],
    );
    turn.fence = Some(fence("d1", 1));
    let call_step = scheduled(&f.store.schedule_turn(turn).await.unwrap()[0]);
    start(&f.store, &call_step, "c1", 1, "s1").await.unwrap();
    let suspend = |waiting_on: Vec<String>| crate::store::SuspendReport {
        dispatch_id: "d1".into(),
        attempt: 1,
        session_id: "s1".into(),
        waiting_on,
    };
    let suspended = f
        .store
        .suspend_dispatch(suspend(vec![call_step.key.to_string()]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(suspended.status, StepStatus::Suspended);
    assert_eq!(
        f.store.reads.run(run.id.clone()).await.unwrap().unwrap().status,
        RunStatus::Suspended
    );
    while handed.try_recv().is_ok() {}
    f.store.record_result(returned("c1", "3")).await.unwrap();
    let steps = f.store.reads.steps(run.id.clone()).await.unwrap();
    let handler = steps.iter().find(|s| s.key == StepKey::agent()).unwrap();
    assert_eq!(handler.status, StepStatus::Pending, "woken by the call's result");
    let woken = handed.try_recv().expect("the result's commit left effects");
    assert!(
        woken
            .iter()
            .any(|e| matches!(e, Effect::Dispatch(step) if step.key == StepKey::agent() && step.status == StepStatus::Pending)),
        "the woken handler is queued by the commit that woke it: {woken:?}"
    );
    let kinds: Vec<EventType> = events(&f.store, &run.id).await.iter().map(|e| e.kind).collect();
    let result = kinds.iter().position(|k| *k == EventType::ToolResult).unwrap();
    assert_eq!(kinds[result + 1], EventType::AgentResumed, "{kinds:?}");
    assert_eq!(
        f.store.reads.run(run.id.clone()).await.unwrap().unwrap().status,
        RunStatus::Running,
        "after agent:resumed the run is no longer suspended, though its handler waits for a slot"
    );
}

/// A suspension naming a settled step, an unknown one, or sent by an `at_most_once` call is refused
/// and changes nothing at all: no event, the dispatch running under the same attempt and lease,
/// the run as it was. The dispatch then settles as if it had never been sent.
async fn a_refused_suspension_writes_nothing_and_the_dispatch_keeps_its_lease(f: Fixture) {
    let (run, _, dispatch) = f.store.create_run_dispatching(hosted_run()).await.unwrap();
    start(&f.store, &dispatch.unwrap(), "d1", 1, "s1").await.unwrap();
    let mut turn = plan(
        &run.id,
        0,
        vec![
            call(0, 0, Some(tool("add", Idempotency::SafeToRetry)), "add", "{}"),
            call(0, 1, Some(tool("pay", Idempotency::AtMostOnce)), "pay", "{}"),
        ],
    );
    turn.fence = Some(fence("d1", 1));
    let scheduled_calls = f.store.schedule_turn(turn).await.unwrap();
    let (add, pay) = (scheduled(&scheduled_calls[0]), scheduled(&scheduled_calls[1]));
    start(&f.store, &add, "c1", 1, "s1").await.unwrap();
    start(&f.store, &pay, "c2", 1, "s1").await.unwrap();
    f.store.record_result(returned("c1", "3")).await.unwrap().unwrap();
    let suspend = |dispatch: &str, waiting_on: &[&str]| crate::store::SuspendReport {
        dispatch_id: dispatch.into(),
        attempt: 1,
        session_id: "s1".into(),
        waiting_on: waiting_on.iter().map(|k| (*k).to_owned()).collect(),
    };
    let before = (
        events(&f.store, &run.id).await,
        f.store.reads.steps(run.id.clone()).await.unwrap(),
        f.store.reads.run(run.id.clone()).await.unwrap().unwrap(),
    );
    let refusals = [
        (suspend("d1", &[add.key.as_str()]), "has settled (succeeded)"),
        (suspend("d1", &[pay.key.as_str(), add.key.as_str()]), "has settled"),
        (suspend("d1", &["t7/p0"]), "is not a step of run"),
        (suspend("d1", &["agent"]), "does not await"),
        (suspend("d1", &[]), "suspended.waiting_on: "),
        (suspend("c2", &["subagent:t0/p1/researcher#0"]), "at_most_once"),
    ];
    for (report, why) in refusals {
        let refused = f.store.suspend_dispatch(report.clone()).await.unwrap_err().to_string();
        assert!(refused.contains(why), "{report:?}: {refused}");
        let after = (
            events(&f.store, &run.id).await,
            f.store.reads.steps(run.id.clone()).await.unwrap(),
            f.store.reads.run(run.id.clone()).await.unwrap().unwrap(),
        );
        assert_eq!(after.0.len(), before.0.len(), "{report:?} wrote an event");
        assert_eq!(after.1, before.1, "{report:?} changed a step");
        assert_eq!(after.2.status, before.2.status);
        assert_eq!(after.2.suspensions, before.2.suspensions);
    }
    let handler = before.1.iter().find(|s| s.key == StepKey::agent()).unwrap();
    assert_eq!(
        (
            handler.status,
            handler.attempts,
            handler.dispatch_id.as_ref().map(|id| id.as_str())
        ),
        (StepStatus::Running, 1, Some("d1"))
    );
    assert!(handler.lease_expires_at.is_some(), "{handler:?}");

    // Both still hold what they held: the call's result and the handler's output are recorded.
    let paid = f
        .store
        .record_result(returned("c2", "\"paid\""))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(paid.status, StepStatus::Succeeded);
    let done = f.store.record_result(returned("d1", "1")).await.unwrap().unwrap();
    assert_eq!(done.status, StepStatus::Succeeded);
    assert_eq!(
        f.store.reads.run(run.id.clone()).await.unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert_gap_free(&events(&f.store, &run.id).await);
}

/// A call of `name` on resource instance `repo:acme` (and the bare kind `workspace`, no lock),
/// recorded as its run's first call and started as `dispatch`.
async fn locked_call(fx: &Fixture, name: &str, idempotency: Idempotency, dispatch: &str) -> StepRecord {
    let (run, _) = fx.store.create_run(new_run(None, 0)).await.unwrap();
    let mut def = tool(name, idempotency);
    def.options.retry = Some(crate::model::RetryPolicy {
        max_attempts: 3,
        initial_interval_ms: 0,
        backoff_coefficient: 1.0,
        max_interval_ms: 0,
    });
    let mut planned = call(0, 0, Some(def), name, "{}");
    planned.resources = vec!["workspace".into(), "repo:acme".into()];
    let turn = fx.store.schedule_turn(plan(&run.id, 0, vec![planned])).await.unwrap();
    start(&fx.store, &scheduled(&turn[0]), dispatch, 1, "s1")
        .await
        .expect("started")
}

async fn held(fx: &Fixture) -> Vec<(String, String)> {
    let locks = fx.store.reads.resource_locks().await.unwrap();
    locks.into_iter().map(|l| (l.resource, l.tool)).collect()
}

async fn a_resource_lock_is_held_exactly_while_its_call_runs_whatever_ends_it(fx: Fixture) {
    let report = |dispatch: &str, outcome| ResultReport {
        dispatch_id: dispatch.into(),
        attempt: 1,
        session_id: "s1".into(),
        outcome,
        progress_count: 0,
    };
    let locked = vec![("repo:acme".to_owned(), "git".to_owned())];

    // A result.
    let step = locked_call(&fx, "git", Idempotency::SafeToRetry, "d1").await;
    assert_eq!(step.resources, ["workspace", "repo:acme"]);
    assert_eq!(held(&fx).await, locked, "only the instance is a lock");
    fx.store.record_result(report("d1", Ok("1".into()))).await.unwrap();
    assert_eq!(held(&fx).await, [], "released by its result");
    // A retryable error puts it back to pending, which holds nothing.
    locked_call(&fx, "git", Idempotency::SafeToRetry, "d2").await;
    let retried = fx
        .store
        .record_result(report("d2", Err((ErrorKind::Retryable, "busy".into()))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(retried.status, StepStatus::Pending);
    assert_eq!(held(&fx).await, [], "released while it waits for its retry");
    start(&fx.store, &retried, "d2b", 2, "s1")
        .await
        .expect("the retry starts");
    assert_eq!(held(&fx).await, locked, "the next attempt takes it again");
    fx.store
        .end_run(retried.run_id.clone(), EndRun::Cancel { reason: "stop".into() })
        .await
        .unwrap();
    assert_eq!(held(&fx).await, [], "released when its run is cancelled");
    // A lost worker: requeued, or indeterminate for an at_most_once call.
    for (idempotency, dispatch) in [(Idempotency::SafeToRetry, "d3"), (Idempotency::AtMostOnce, "d4")] {
        locked_call(&fx, "git", idempotency, dispatch).await;
        fx.store
            .lose_lease(LeaseLoss {
                dispatch_id: dispatch.into(),
                attempt: 1,
                reason: "gone".into(),
            })
            .await
            .unwrap();
        assert_eq!(held(&fx).await, [], "released by the loss of {dispatch}");
    }
    // A timeout.
    locked_call(&fx, "git", Idempotency::SafeToRetry, "d5").await;
    fx.store.time_out("d5".into(), 1).await.unwrap();
    assert_eq!(held(&fx).await, [], "released by a timeout");
}

async fn a_start_on_an_instance_another_call_holds_is_refused_naming_it(fx: Fixture) {
    let holder = locked_call(&fx, "git", Idempotency::SafeToRetry, "d1").await;
    let (run, _) = fx.store.create_run(new_run(None, 0)).await.unwrap();
    let mut planned = call(0, 0, Some(tool("git", Idempotency::SafeToRetry)), "git", "{}");
    planned.resources = vec!["repo:acme".into()];
    let turn = fx.store.schedule_turn(plan(&run.id, 0, vec![planned])).await.unwrap();
    let waiting = scheduled(&turn[0]);
    let refused = fx
        .store
        .start_dispatch(slot(&run.id, waiting.key.clone(), "d2"))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains(&format!(
            "resource 'repo:acme' is held by step {} of run {}",
            holder.key, holder.run_id
        )),
        "{refused}"
    );
    let still = fx.store.reads.steps(run.id.clone()).await.unwrap();
    assert_eq!(still[0].status, StepStatus::Pending, "the refused start wrote nothing");
    fx.store.record_result(returned("d1", "1")).await.unwrap();
    fx.store
        .start_dispatch(slot(&run.id, waiting.key.clone(), "d2"))
        .await
        .unwrap()
        .expect("it starts once the lock is released");
    assert_eq!(held(&fx).await, [("repo:acme".to_owned(), "git".to_owned())]);
}

// Every test above that takes a fixture, on both backends.
/// A replica's writer leases what it starts to that replica; its row renews every lease at once;
/// a dead replica's row goes only if it did not beat again; waiting calls are found by tool.
async fn a_replica_holds_what_its_writer_starts_and_its_row_dates_its_leases(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let turn = f
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![
                call(0, 0, Some(add.clone()), "add", r#"{"a":1}"#),
                call(0, 1, Some(add), "add", r#"{"a":2}"#),
            ],
        ))
        .await
        .unwrap();
    let (first, second) = (scheduled(&turn[0]), scheduled(&turn[1]));
    assert_eq!(first.replica, None, "a waiting call has no holder");
    let started = start(&f.store, &first, "d1", 1, "s1").await.expect("starts");
    assert_eq!(started.replica.as_deref(), Some(f.store.replica()));
    let held = f.store.reads.held_by(f.store.replica().to_owned()).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, first.key);
    assert!(f.store.reads.held_by("another".into()).await.unwrap().is_empty());

    let claim = |tools: &[&str], agents: &[&str], limit: usize| {
        let tools = tools.iter().map(|t| t.to_string()).collect();
        let agents = agents.iter().map(|a| a.to_string()).collect();
        f.store.claim_pending(tools, agents, limit)
    };
    assert!(claim(&["add"], &[], 0).await.unwrap().is_empty());
    assert!(claim(&[], &["add"], 10).await.unwrap().is_empty(), "not an agent");
    assert!(claim(&["other"], &[], 10).await.unwrap().is_empty());
    let claimed = claim(&["add"], &[], 10).await.unwrap();
    assert_eq!(claimed.len(), 1, "only the waiting call: {claimed:?}");
    assert_eq!(claimed[0].key, second.key);
    f.clock
        .advance(std::time::Duration::from_millis(super::ops::CLAIM_MS as u64));
    assert!(
        claim(&["add"], &[], 10).await.unwrap().is_empty(),
        "a claimed call is left to its claimer for CLAIM_MS, its last millisecond included"
    );
    f.clock.advance(std::time::Duration::from_millis(1));
    let reclaimed = claim(&["add"], &[], 10).await.unwrap();
    assert_eq!(reclaimed.len(), 1, "a claim not acted on lapses: {reclaimed:?}");

    let beat = |offers: &str| crate::store::ReplicaBeat {
        started_at: 1,
        offers: offers.into(),
        address: "10.0.0.7:50051".into(),
    };
    f.store.beat(beat(r#"{"tools":{},"agents":{}}"#)).await.unwrap();
    let rows = f.store.reads.replicas().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, f.store.replica());
    let first_beat = rows[0].heartbeat_at;
    f.clock.advance(std::time::Duration::from_millis(5));
    f.store
        .beat(beat(r#"{"tools":{"add":"f"},"agents":{}}"#))
        .await
        .unwrap();
    let rows = f.store.reads.replicas().await.unwrap();
    assert!(rows[0].heartbeat_at > first_beat, "a beat renews the row");
    assert!(rows[0].offers.contains("add"), "and says what is offered now");
    assert_eq!(rows[0].address, "10.0.0.7:50051");
    assert!(
        !f.store
            .forget_replica(f.store.replica().to_owned(), Some(first_beat))
            .await
            .unwrap(),
        "a row that beat again since it was read stays"
    );
    assert!(
        f.store
            .forget_replica(f.store.replica().to_owned(), Some(rows[0].heartbeat_at))
            .await
            .unwrap()
    );
    assert!(f.store.reads.replicas().await.unwrap().is_empty());
}

on_both_stores!(a_call_keeps_its_share_for_the_scheduler_after_a_restart);
on_both_stores!(a_call_with_a_reserved_slot_is_scheduled_and_started_in_one_commit);
on_both_stores!(a_checked_step_is_recorded_as_its_check_allowed_it);
on_both_stores!(effects_are_handed_out_after_the_commit_they_follow);
on_both_stores!(a_turn_read_serves_a_settled_turn_and_sees_every_commit);
on_both_stores!(a_turn_read_serves_exactly_the_calls_asked_whatever_else_its_range_holds);
on_both_stores!(a_turn_hands_out_its_safe_started_calls_before_it_commits);
on_both_stores!(a_budgeted_turn_hands_out_its_started_calls_once_their_charge_commits);
on_both_stores!(a_replica_holds_what_its_writer_starts_and_its_row_dates_its_leases);
on_both_stores!(a_repeated_create_with_the_same_key_returns_the_same_run);
on_both_stores!(a_call_runs_through_start_and_result_with_gap_free_events);
on_both_stores!(a_turns_own_steps_are_read_back_by_key);
on_both_stores!(a_runs_trace_context_is_kept_with_it_and_copied_to_its_steps);
on_both_stores!(results_are_fenced_by_dispatch_attempt_and_session);
on_both_stores!(a_lost_at_most_once_call_is_indeterminate);
on_both_stores!(a_timed_out_at_most_once_call_is_indeterminate_and_never_retried);
on_both_stores!(a_start_is_fenced_by_the_attempt_it_expects);
on_both_stores!(unknown_tools_are_recorded_without_start_and_count_toward_the_limit);
on_both_stores!(a_call_s_sealed_secrets_are_kept_until_it_settles_then_dropped);
on_both_stores!(a_resubmitted_turn_replays_joins_or_diverges);
on_both_stores!(refused_writes_leave_nothing_behind);
on_both_stores!(cancelling_settles_in_flight_steps_before_the_run);
on_both_stores!(one_call_is_cancelled_and_an_idle_run_is_abandoned);
on_both_stores!(concurrent_appends_keep_sequence_numbers_gap_free);
on_both_stores!(tool_cache_entries_are_namespaced_per_tool_and_expire);
on_both_stores!(an_approval_expires_at_its_deadline_and_not_before);
on_both_stores!(a_cached_result_goes_only_with_the_last_run_it_belongs_to);
on_both_stores!(concurrent_turns_cannot_both_pass_the_events_limit);
on_both_stores!(a_divergence_fails_the_hosted_run_in_the_write_that_finds_it);
on_both_stores!(only_a_dispatch_still_running_on_its_session_writes_the_cache);
on_both_stores!(expired_cache_entries_are_purged_in_batches_and_live_ones_stay);
on_both_stores!(refused_tool_cache_entries_write_nothing);
on_both_stores!(the_pending_call_limit_holds_for_concurrent_turns);
on_both_stores!(a_finished_run_is_deleted_whole_and_a_run_in_flight_is_refused);
on_both_stores!(a_range_of_a_runs_log_is_that_slice_of_the_whole);
on_both_stores!(a_hosted_run_records_steps_only_from_the_attempt_holding_its_dispatch);
on_both_stores!(a_suspended_handler_is_woken_in_the_commit_that_settles_its_call);
on_both_stores!(a_refused_suspension_writes_nothing_and_the_dispatch_keeps_its_lease);
on_both_stores!(a_resource_lock_is_held_exactly_while_its_call_runs_whatever_ends_it);
on_both_stores!(a_start_on_an_instance_another_call_holds_is_refused_naming_it);

/// A turn refused after it wrote (its call started on a resource instance another call holds)
/// leaves nothing behind, in the database or in what the writer remembers: the same turn again
/// records its call anew.
async fn a_turn_refused_after_it_wrote_is_forgotten_whole(fx: Fixture) {
    let holder = locked_call(&fx, "git", Idempotency::SafeToRetry, "d1").await;
    let (run, _) = fx.store.create_run(new_run(None, 0)).await.unwrap();
    let planned = || {
        let mut planned = call(0, 0, Some(tool("git", Idempotency::SafeToRetry)), "git", "{}");
        planned.resources = vec!["repo:acme".into()];
        planned
    };
    let mut first = planned();
    first.start = Some(slot(&run.id, first.key.clone(), "d2"));
    let refused = fx.store.schedule_turn(plan(&run.id, 0, vec![first])).await.unwrap_err();
    assert!(
        refused.to_string().contains(&format!("is held by step {}", holder.key)),
        "{refused}"
    );
    assert!(fx.store.reads.steps(run.id.clone()).await.unwrap().is_empty());

    let again = fx.store.schedule_turn(plan(&run.id, 0, vec![planned()])).await.unwrap();
    let recorded = scheduled(&again[0]);
    assert_eq!(recorded.status, StepStatus::Pending);
    assert_eq!(step_again(&fx, &run.id, &recorded.key).await, recorded);
    assert_gap_free(&events(&fx.store, &run.id).await);
}

on_both_stores!(a_turn_refused_after_it_wrote_is_forgotten_whole);

/// Sends a store request's command without waiting for its answer, to be awaited later.
async fn queued<F: std::future::Future + Unpin>(mut request: F) -> F {
    assert!(
        futures_util::poll!(&mut request).is_pending(),
        "the writer is held: nothing is answered yet"
    );
    request
}

/// The store's writer held inside a batch: a turn whose call is handed out before its commit
/// waits there until released, so what is sent to the store meanwhile makes the next batch.
struct HeldWriter {
    release: std::sync::mpsc::Sender<()>,
    turn: tokio::task::JoinHandle<Result<RecordedTurn, KernelError>>,
}

impl HeldWriter {
    /// Holds `store`'s writer with a turn of `run` whose one call starts as `dispatch`.
    async fn hold(store: &Store, run: &RunId, mut call: PlannedCall, dispatch: &str) -> Self {
        let (entered, is_entered) = tokio::sync::oneshot::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let early: EarlyDispatch = Box::new(move |_| {
            entered.send(()).unwrap();
            released.recv().unwrap();
        });
        call.start = Some(slot(run, call.key.clone(), dispatch));
        let turn = tokio::spawn({
            let store = store.clone();
            let plan = plan(run, 0, vec![call]);
            async move { store.record_turn_dispatching(plan, early).await }
        });
        is_entered.await.unwrap();
        HeldWriter { release, turn }
    }

    /// Lets the writer go on, and waits for the holding turn to commit.
    async fn release(self) {
        self.release.send(()).unwrap();
        self.turn.await.unwrap().unwrap();
    }
}

/// Commands that share a batch refuse alone. A turn refused before it wrote (over its run's
/// limit) leaves its batch-mates' writes standing, on either store. On SQLite a turn refused after
/// it wrote (its call's resource instance is held) runs without a savepoint, so it undoes the
/// commands applied before it in the batch, which hear why; the commands after it, and the
/// refused ones, keep their own answers, and nothing of an undone command stays behind.
async fn a_batch_s_commands_keep_their_answers_when_one_fails_after_it_wrote(f: Fixture) {
    let holder = locked_call(&f, "git", Idempotency::SafeToRetry, "d1").await;
    let mut runs = Vec::new();
    for _ in 0..5 {
        runs.push(f.store.create_run(new_run(None, 0)).await.unwrap().0);
    }
    let add = || call(0, 0, Some(tool("add", Idempotency::SafeToRetry)), "add", "{}");

    // The writer is held inside a batch, so what follows is queued and applied as one batch.
    let held = HeldWriter::hold(&f.store, &runs[0].id, add(), "d2").await;

    let before = queued(Box::pin(f.store.schedule_turn(plan(&runs[1].id, 0, vec![add()])))).await;
    let mut over = plan(&runs[2].id, 0, vec![add()]);
    over.max_pending_calls = 0;
    let over_limit = queued(Box::pin(f.store.schedule_turn(over))).await;
    let mut locked = call(0, 0, Some(tool("git", Idempotency::SafeToRetry)), "git", "{}");
    locked.resources = vec!["repo:acme".into()];
    locked.start = Some(slot(&runs[3].id, locked.key.clone(), "d3"));
    let after_writing = queued(Box::pin(f.store.schedule_turn(plan(&runs[3].id, 0, vec![locked])))).await;
    let after = queued(Box::pin(f.store.schedule_turn(plan(&runs[4].id, 0, vec![add()])))).await;
    let result = queued(Box::pin(f.store.record_result(returned("d1", "{}")))).await;
    held.release().await;

    let sqlite = f._postgres.is_none();
    match before.await {
        Err(error) if sqlite => assert!(error.to_string().contains("undone with its batch"), "{error}"),
        answer => assert!(answer.is_ok(), "a savepoint keeps it on PostgreSQL: {answer:?}"),
    }
    assert!(matches!(over_limit.await, Err(KernelError::LimitExceeded { .. })));
    let refused = after_writing.await.unwrap_err();
    assert!(refused.to_string().contains(&holder.key.to_string()), "{refused}");
    assert!(matches!(
        scheduled(&after.await.unwrap()[0]).status,
        StepStatus::Pending
    ));
    assert_eq!(result.await.unwrap().unwrap().status, StepStatus::Succeeded);

    let steps = |run: usize| f.store.reads.steps(runs[run].id.clone());
    assert_eq!(
        steps(1).await.unwrap().len(),
        usize::from(!sqlite),
        "an undone turn leaves no step"
    );
    assert!(steps(2).await.unwrap().is_empty());
    assert!(steps(3).await.unwrap().is_empty());
    assert_eq!(steps(4).await.unwrap().len(), 1);
    assert_eq!(
        step_again(&f, &holder.run_id, &holder.key).await.status,
        StepStatus::Succeeded
    );
    // The writer forgot what the undone commands had told it: the runs go on without gaps.
    for run in &runs[1..] {
        let again = f.store.schedule_turn(plan(&run.id, 0, vec![add()])).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_gap_free(&events(&f.store, &run.id).await);
    }
}

on_both_stores!(a_batch_s_commands_keep_their_answers_when_one_fails_after_it_wrote);

/// Makes the database refuse, from now on, a `tool:start` event whose payload holds `marker`
/// (`None` lifts it): a write the writer cannot foresee failing, as a lock timeout or a
/// deadlock between replicas can fail one.
async fn refuse_starts_holding(f: &Fixture, marker: Option<&str>) {
    let sqlite = match marker {
        Some(marker) => format!(
            "CREATE TRIGGER refuse_start BEFORE INSERT ON events \
             WHEN NEW.type = 'tool:start' AND NEW.payload LIKE '%{marker}%' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        ),
        None => "DROP TRIGGER refuse_start".to_owned(),
    };
    let postgres = match marker {
        Some(marker) => format!(
            "CREATE FUNCTION refuse_start() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.type = 'tool:start' AND NEW.payload LIKE '%{marker}%' THEN \
                 RAISE EXCEPTION 'refused by the test'; \
               END IF; RETURN NEW; END $$; \
             CREATE TRIGGER refuse_start BEFORE INSERT ON events \
               FOR EACH ROW EXECUTE FUNCTION refuse_start()"
        ),
        None => "DROP TRIGGER refuse_start ON events; DROP FUNCTION refuse_start()".to_owned(),
    };
    let (url, dir) = (
        f._postgres.as_ref().map(|server| server.url.clone()),
        f._dir.as_ref().map(|dir| dir.path().join("k.db")),
    );
    tokio::task::spawn_blocking(move || match (url, dir) {
        (Some(url), _) => super::sql::PgConn::connect(&url.parse().unwrap())
            .unwrap()
            .batch(&postgres)
            .unwrap(),
        (None, Some(file)) => rusqlite::Connection::open(file)
            .unwrap()
            .execute_batch(&sqlite)
            .unwrap(),
        (None, None) => unreachable!("a fixture has a database"),
    })
    .await
    .unwrap();
}

/// A command of a batch whose write fails after it ended (on PostgreSQL the writes go out with
/// a later statement) takes with it the commands after it that were applied on what it wrote:
/// its run's next starts, numbered after its own event. Every answer says what the log holds,
/// the log stays gap-free, and the calls start once the database takes them.
async fn a_write_failing_after_its_command_ended_leaves_no_gap_behind(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let (holder, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let add = |p| {
        call(
            0,
            p,
            Some(tool("add", Idempotency::SafeToRetry)),
            "add",
            &format!(r#"{{"p":{p}}}"#),
        )
    };
    let turn = f
        .store
        .schedule_turn(plan(&run.id, 0, (0..3).map(add).collect()))
        .await
        .unwrap();
    let steps: Vec<StepRecord> = turn.iter().map(scheduled).collect();
    refuse_starts_holding(&f, Some("d-refused")).await;

    // The writer is held inside a batch, so the starts are queued and applied as one batch.
    let held = HeldWriter::hold(&f.store, &holder.id, add(0), "d-holder").await;
    let dispatches = ["d-refused", "d-1", "d-2"];
    let mut starts = Vec::new();
    for (step, dispatch) in steps.iter().zip(dispatches) {
        let start = slot(&run.id, step.key.clone(), dispatch);
        starts.push(queued(Box::pin(f.store.start_dispatch(start))).await);
    }
    held.release().await;

    let mut answers = Vec::new();
    for start in starts {
        answers.push(start.await);
    }
    let refused = answers[0].as_ref().unwrap_err().to_string();
    assert!(refused.contains("refused by the test"), "{refused}");
    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    for (answer, dispatch) in answers.iter().zip(dispatches) {
        let logged = log
            .iter()
            .any(|e| e.kind == EventType::ToolStart && e.payload.contains(dispatch));
        match answer {
            Ok(started) => {
                assert!(
                    started.is_some() && logged,
                    "{dispatch} started and its start is logged"
                )
            }
            Err(error) => assert!(!logged, "{dispatch} was refused ({error}) and left no start behind"),
        }
    }

    refuse_starts_holding(&f, None).await;
    for ((answer, step), dispatch) in answers.iter().zip(&steps).zip(dispatches) {
        if answer.is_err() {
            let again = f
                .store
                .start_dispatch(slot(&run.id, step.key.clone(), &format!("{dispatch}-again")));
            assert!(
                again.await.unwrap().is_some(),
                "{dispatch} starts once the database takes it"
            );
        }
    }
    let log = events(&f.store, &run.id).await;
    assert_gap_free(&log);
    assert_eq!(log.iter().filter(|e| e.kind == EventType::ToolStart).count(), 3);
}

on_both_stores!(a_write_failing_after_its_command_ended_leaves_no_gap_behind);

/// A turn's count of calls reaches the run's row in the turn's commit, in the statement that
/// writes the run's last event number: the database holds what the writer counts, and a turn
/// past `max_tool_calls` is refused by a writer that holds the run as by one that must read it.
async fn a_turn_s_count_of_calls_is_in_the_run_row_when_it_commits(f: Fixture) {
    let (run, _) = f.store.create_run(new_run(None, 3)).await.unwrap();
    let add = tool("add", Idempotency::SafeToRetry);
    let calls = |turn: u32, n: u32| {
        (0..n)
            .map(|p| call(turn, p, Some(add.clone()), "add", &format!(r#"{{"a":{p}}}"#)))
            .collect::<Vec<_>>()
    };
    f.store.schedule_turn(plan(&run.id, 0, calls(0, 2))).await.unwrap();
    let stored = f.store.reads.run(run.id.clone()).await.unwrap().unwrap();
    assert_eq!(stored.tool_calls, 2, "the row counts the turn's calls");
    assert_eq!(stored.last_seq, events(&f.store, &run.id).await.last().unwrap().seq);

    let over = f.store.schedule_turn(plan(&run.id, 1, calls(1, 2))).await.unwrap();
    let limited = over
        .iter()
        .filter(|d| matches!(d, CallDisposition::Settled(s) if s.error.as_deref().is_some_and(|e| e.starts_with("max_tool_calls"))))
        .count();
    assert_eq!(
        limited, 1,
        "the third call runs, the fourth is past the limit: {over:?}"
    );
    let stored = f.store.reads.run(run.id.clone()).await.unwrap().unwrap();
    assert_eq!(stored.tool_calls, 3, "a call refused for the limit is not counted");
    assert_eq!(stored.last_seq, events(&f.store, &run.id).await.last().unwrap().seq);
}

on_both_stores!(a_turn_s_count_of_calls_is_in_the_run_row_when_it_commits);

/// Which shards a test's replica believes it owns: a replica frozen while another took its shard
/// still believes it owns it. It reaches no other replica.
#[derive(Default)]
struct Owns {
    epochs: std::sync::Mutex<BTreeMap<u32, i64>>,
    generation: std::sync::atomic::AtomicU64,
}

impl crate::store::forward::Router for Owns {
    fn epoch(&self, shard: u32) -> Option<i64> {
        self.epochs.lock().unwrap().get(&shard).copied()
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn home(&self) -> Option<u32> {
        self.epochs.lock().unwrap().keys().next().copied()
    }

    fn send(
        &self,
        shard: u32,
        _: Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::store::forward::Sent, KernelError>> + Send>>
    {
        Box::pin(async move {
            Err(KernelError::Unavailable(format!(
                "no owner of shard {shard} answers here"
            )))
        })
    }
}

/// Two replicas' writers on one database. A replica that lost a shard while it was frozen still
/// believes it owns it, remembers its runs, and writes: the commit's fence finds the shard's epoch
/// moved on, and nothing it wrote stands. The shard's new owner starts the call.
#[tokio::test]
async fn an_owner_that_lost_its_shard_commits_nothing_in_it() {
    let Some(a) = open_postgres("store::tests::an_owner_that_lost_its_shard").await else {
        return;
    };
    let url = a._postgres.as_ref().expect("a server").url.clone();
    let (b, _b_writer) = Store::open_postgres(&Target::with_defaults(&url).unwrap(), (Hub::default(), Clock::wall()))
        .await
        .unwrap();
    let every: Vec<(u32, i64)> = (0..crate::cluster::shards::SHARDS).map(|id| (id, 0)).collect();
    let taken = a
        .store
        .move_shards(
            crate::cluster::shards::Moves {
                take: every,
                hand: Vec::new(),
            },
            false,
        )
        .await
        .unwrap();
    let owns = std::sync::Arc::new(Owns::default());
    owns.epochs.lock().unwrap().extend(taken);
    a.store.set_router(owns.clone());

    let (run, _) = a.store.create_run(new_run(None, 0)).await.unwrap();
    let turn = a
        .store
        .schedule_turn(plan(
            &run.id,
            0,
            vec![call(0, 0, Some(tool("add", Idempotency::AtMostOnce)), "add", "{}")],
        ))
        .await
        .unwrap();
    let waiting = scheduled(&turn[0]);

    // B takes the run's shard, as it would from a replica silent for a TTL.
    let shard = crate::cluster::shards::shard_of(&run.id);
    let moved = b
        .move_shards(
            crate::cluster::shards::Moves {
                take: vec![(shard, 1)],
                hand: Vec::new(),
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(moved, vec![(shard, 2)]);

    // A, unaware, starts the call: each try is refused at the commit and tried again.
    let start_on_a = || StartDispatch {
        run_id: waiting.run_id.clone(),
        key: waiting.key.clone(),
        dispatch_id: "on-a".into(),
        attempt: 1,
        worker: "w".into(),
        session_id: "sa".into(),
        lease_expires_at: 0,
        replica: None,
        limits: Vec::new(),
        limit_wait_ms: 0,
    };
    let unaware = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        a.store.start_dispatch(start_on_a()),
    )
    .await;
    assert!(unaware.is_err(), "a write in a lost shard went through: {unaware:?}");
    let stored = step_again(&a, &run.id, &waiting.key).await;
    assert_eq!(
        (stored.status, stored.attempts, stored.dispatch_id),
        (StepStatus::Pending, 0, None)
    );
    // Once A learns it lost the shard, it sends the write to the owner (none answers in this test).
    owns.epochs.lock().unwrap().remove(&shard);
    owns.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let refused = a.store.start_dispatch(start_on_a()).await.unwrap_err();
    assert!(matches!(refused, KernelError::Unavailable(_)), "{refused:?}");
    // Runs of the shards A still owns are written as before.
    let (other, _) = a.store.create_run(new_run(None, 0)).await.unwrap();
    assert_ne!(crate::cluster::shards::shard_of(&other.id), shard);

    let there = start(&b, &waiting, "on-b", 1, "sb").await.expect("started on b");
    assert_eq!(there.status, StepStatus::Running);
    let stored = step_again(&a, &run.id, &waiting.key).await;
    assert_eq!(stored.dispatch_id.as_ref().map(|id| id.as_str()), Some("on-b"));
    assert_eq!(stored.attempts, 1);

    // What A's writer remembered of the run is gone with the shard: a new turn's read sees B's
    // start, not the run as A last committed it.
    let next = call(1, 0, Some(tool("add", Idempotency::AtMostOnce)), "add", "{}");
    let (read, _) = a
        .store
        .reads
        .turn::<StepRecord>(run.id.clone(), vec![(next.key.clone(), next.call_hash.clone())])
        .await
        .unwrap();
    let on_b = b.reads.run(run.id.clone()).await.unwrap().expect("the run");
    assert_eq!(read.map(|r| r.last_seq), Some(on_b.last_seq));
}

mod branches;

on_both_stores!(a_shard_changes_owner_only_at_the_epoch_it_was_read_at);
async fn a_shard_changes_owner_only_at_the_epoch_it_was_read_at(f: Fixture) {
    use crate::cluster::shards::Moves;
    let rows = f.store.reads.shards().await.unwrap();
    assert_eq!(
        rows.len(),
        crate::cluster::shards::SHARDS as usize,
        "the shards made with the database"
    );
    assert!(rows.iter().all(|r| r.owner.is_none() && r.epoch == 0));
    let take = |shards: &[(u32, i64)]| Moves {
        take: shards.to_vec(),
        hand: Vec::new(),
    };
    let taken = f.store.move_shards(take(&[(1, 0), (2, 0)]), false).await.unwrap();
    assert_eq!(taken, vec![(1, 1), (2, 1)]);
    // Read at an epoch that has moved on: nothing changes, as for a replica waking from a freeze.
    assert!(f.store.move_shards(take(&[(1, 0)]), false).await.unwrap().is_empty());
    let given = Moves {
        take: Vec::new(),
        hand: vec![(1, 0, "next".into()), (2, 1, "next".into())],
    };
    f.store.move_shards(given, false).await.unwrap();
    let rows = f.store.reads.shards().await.unwrap();
    let me = Some(f.store.replica().to_owned());
    assert_eq!(
        (&rows[1].owner, rows[1].epoch),
        (&me, 1),
        "a stale hand-over changes nothing"
    );
    assert_eq!(
        (rows[2].owner.as_deref(), rows[2].epoch),
        (Some("next"), 2),
        "handed on, a move"
    );
    f.store.move_shards(Moves::default(), true).await.unwrap();
    let rows = f.store.reads.shards().await.unwrap();
    assert!(
        rows.iter().all(|r| r.owner.as_deref() != me.as_deref()),
        "all given back"
    );
    assert_eq!(rows[1].epoch, 2);
}

/// Among replicas a claim marks waiting calls of any shard, and their rows stay locked until its
/// batch commits. A command after it in the same batch that waited for a lock another replica
/// holds (a rate limit's bucket), while that replica waited for a claimed row (its own call's,
/// to start it), would deadlock the two: the database would end one of them after a second. A
/// batch's claims go last, after every command that may wait.
#[tokio::test]
async fn a_batch_s_claims_hold_their_rows_only_once_nothing_after_them_waits() {
    let Some(f) = open_postgres("store::tests::a_batch_s_claims_go_last").await else {
        return;
    };
    let url = f._postgres.as_ref().expect("a server").url.clone();
    let (run, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let (other, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let turn = |name: &'static str| call(0, 0, Some(tool(name, Idempotency::SafeToRetry)), name, "{}");
    let claimable = scheduled(
        &f.store
            .schedule_turn(plan(&run.id, 0, vec![turn("add")]))
            .await
            .unwrap()[0],
    );
    let limited = scheduled(
        &f.store
            .schedule_turn(plan(&other.id, 0, vec![turn("slow")]))
            .await
            .unwrap()[0],
    );

    // Another replica's transaction holds the limit's bucket, as its start of a call would.
    let (replica, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    replica
        .batch_execute(
            "BEGIN; INSERT INTO limit_buckets (name, tokens, at) VALUES ('slow', 100, 0) \
             ON CONFLICT (name) DO UPDATE SET name = excluded.name",
        )
        .await
        .unwrap();

    // The writer is held inside a batch, so the claim and the limited start share the next one,
    // the claim sent first.
    let (holder, _) = f.store.create_run(new_run(None, 0)).await.unwrap();
    let held = HeldWriter::hold(&f.store, &holder.id, turn("hold"), "d-holder").await;
    let claim = queued(Box::pin(f.store.claim_pending(vec!["add".into()], Vec::new(), 10))).await;
    let mut start = slot(&other.id, limited.key.clone(), "d-limited");
    start.limits = vec![crate::machine::throttle::ToolLimit {
        tools: "slow".into(),
        per_second: Some(1000.0),
        burst: Some(1000),
        at_once: None,
    }];
    let start = queued(Box::pin(f.store.start_dispatch(start))).await;
    held.release().await;

    // Once the writer waits for the bucket, the other replica writes its own call's row.
    let waiting =
        "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while replica.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never waited for the bucket"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let wrote = replica
        .execute(
            "UPDATE steps SET claimed_until = NULL WHERE run_id = $1 AND step_key = $2",
            &[&run.id.as_str(), &claimable.key.to_string()],
        )
        .await;
    assert!(wrote.is_ok(), "the other replica's write of its own call: {wrote:?}");
    replica.batch_execute("COMMIT").await.unwrap();

    let started = start.await.unwrap().expect("the limited call started");
    assert_eq!(started.status, StepStatus::Running);
    let claimed = claim.await.unwrap();
    assert_eq!(claimed.iter().map(|s| &s.key).collect::<Vec<_>>(), [&claimable.key]);
}
