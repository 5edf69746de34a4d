//! `ctx.cache()` end to end: a tool's entries live in the kernel's store (they outlive the worker
//! and a kernel restart), are namespaced by the tool of the dispatch that asks (never by a name a
//! worker sends), expire after their TTL, and a refused request writes nothing.

use std::time::{Duration, Instant};

use e2e::raw::RawWorker;
use e2e::{Kernel, WAIT, call, check_log, submit};
use kernel_proto::v1 as pb;
use kernel_proto::v1::open_session_request::Message as In;
use kernel_proto::v1::open_session_response::Message as Out;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

/// Submits one call as its own turn and returns its content (`null` when the cache is empty).
async fn one(kernel: &Kernel, run: &str, turn: u32, tool: &str, arguments: Value) -> String {
    let outcome = submit(kernel, run, turn, vec![call(tool, arguments)]).await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.status, pb::CallStatus::Ok as i32, "{result:?}");
    result.content.clone()
}

#[tokio::test]
async fn a_tool_reads_back_what_it_kept_and_another_tool_sees_nothing() {
    let mut kernel = Kernel::start();
    let worker = kernel.fault_worker("w1");
    let run = kernel.create_run("memo").await;

    assert_eq!(one(&kernel, &run, 0, "memo", json!({"key": "rate"})).await, "null");
    assert_eq!(
        one(&kernel, &run, 1, "memo", json!({"key": "rate", "value": 42})).await,
        "42"
    );
    assert_eq!(
        one(&kernel, &run, 2, "memo", json!({"key": "rate"})).await,
        "42",
        "a later call of the tool reads the entry from the store"
    );
    assert_eq!(
        one(&kernel, &run, 3, "peek", json!({"key": "rate"})).await,
        "null",
        "another tool never sees memo's entries"
    );

    // The entry outlives the worker that wrote it, and a SIGKILLed kernel.
    drop(worker);
    let _w2 = kernel.fault_worker("w2");
    assert_eq!(one(&kernel, &run, 4, "memo", json!({"key": "rate"})).await, "42");
    kernel.restart();
    kernel.wait_for_workers("memo", 1).await;
    assert_eq!(one(&kernel, &run, 5, "memo", json!({"key": "rate"})).await, "42");
    assert_eq!(
        one(&kernel, &run, 6, "memo", json!({"key": "rate", "value": 7})).await,
        "7",
        "a set replaces"
    );

    let events = kernel.events(&run).await;
    check_log(&events, true);
    let results = events.iter().filter(|e| e.r#type == "tool:result").count();
    assert_eq!(results, 7, "one result per call; the cache itself records no events");
}

#[tokio::test]
async fn an_entry_expires_after_its_ttl() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("memo").await;

    let set_at = Instant::now();
    let kept = json!({"key": "short", "value": 5, "ttl_ms": 1000});
    assert_eq!(one(&kernel, &run, 0, "memo", kept).await, "5");
    assert_eq!(
        one(&kernel, &run, 1, "memo", json!({"key": "long", "value": 6})).await,
        "6"
    );
    // Expiry is the kernel's clock against the entry's deadline: poll until it passes.
    let mut turn = 2;
    loop {
        let found = one(&kernel, &run, turn, "memo", json!({"key": "short"})).await;
        turn += 1;
        if found == "null" {
            break;
        }
        assert_eq!(found, "5");
        assert!(set_at.elapsed() < WAIT, "the entry never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        set_at.elapsed() >= Duration::from_millis(1000),
        "expired early, after {:?}",
        set_at.elapsed()
    );
    assert_eq!(
        one(&kernel, &run, turn, "memo", json!({"key": "long"})).await,
        "6",
        "an entry without a TTL stays"
    );
}

fn get(key: &str) -> pb::cache_request::Op {
    pb::cache_request::Op::Get(pb::CacheGet { key: key.into() })
}

fn set(key: &str, value_json: &str) -> pb::cache_request::Op {
    pb::cache_request::Op::Set(pb::CacheSet {
        key: key.into(),
        value_json: value_json.into(),
        ttl_ms: 0,
    })
}

#[tokio::test]
async fn requests_are_fenced_by_a_held_dispatch_and_refusals_write_nothing() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("memo").await;
    assert_eq!(
        one(&kernel, &run, 0, "memo", json!({"key": "shared", "value": 1})).await,
        "1"
    );

    let mut raw = RawWorker::offering(&kernel, "raw_tool").await.unwrap();
    let refused = raw.cache("not-a-dispatch", 1, get("shared")).await;
    assert!(
        refused
            .error
            .starts_with("dispatch not-a-dispatch attempt 1 is not held by this session"),
        "{refused:?}"
    );

    let turn = tokio::spawn({
        let url = kernel.url();
        let run = run.clone();
        async move {
            let request = pb::SubmitTurnRequest {
                run_id: run,
                turn: 1,
                calls: vec![call("raw_tool", json!({}))],
                offered_tools: Vec::new(),
                max_concurrency: 0,
            };
            let mut client = kernel_proto::v1::tool_call_service_client::ToolCallServiceClient::connect(url)
                .await
                .unwrap();
            let mut stream = client.submit_turn(request).await.unwrap().into_inner();
            let mut results = Vec::new();
            while let Some(item) = stream.next().await {
                if let Some(pb::submit_turn_response::Item::Result(result)) = item.unwrap().item {
                    results.push(result);
                }
            }
            results
        }
    });
    let dispatch = match raw.next().await {
        Out::Dispatch(dispatch) => dispatch,
        other => panic!("expected a dispatch, got {other:?}"),
    };
    let (id, attempt) = (dispatch.dispatch_id.as_str(), dispatch.attempt);

    let stale = raw.cache(id, attempt + 1, get("shared")).await;
    assert!(stale.error.contains("is not held by this session"), "{stale:?}");
    let other = raw.cache(id, attempt, get("shared")).await;
    assert!(
        other.error.is_empty() && !other.found,
        "the namespace is the dispatch's tool: memo's entry is out of reach: {other:?}"
    );

    let refusals = [
        (set("", "1"), "key: must be 1 to 256 bytes, got 0"),
        (set(&"k".repeat(257), "1"), "key: must be 1 to 256 bytes, got 257"),
        (set("bad", "{oops"), "value_json: not valid JSON"),
        (
            set("bad", &format!("\"{}\"", "x".repeat(1 << 20))),
            "value_json: 1048578 bytes is over the limit",
        ),
    ];
    for (op, expected) in refusals {
        let answer = raw.cache(id, attempt, op).await;
        assert!(answer.error.starts_with(expected), "{expected}: {answer:?}");
    }
    let nothing = raw.cache(id, attempt, get("bad")).await;
    assert_eq!(
        (nothing.found, nothing.error.as_str()),
        (false, ""),
        "refused sets write nothing"
    );

    let kept = raw.cache(id, attempt, set("shared", r#"{"raw":true}"#)).await;
    assert_eq!(kept.error, "");
    let found = raw.cache(id, attempt, get("shared")).await;
    assert_eq!((found.found, found.value_json.as_str()), (true, r#"{"raw":true}"#));

    raw.send(In::Result(pb::DispatchResult {
        dispatch_id: id.into(),
        attempt,
        outcome: Some(pb::dispatch_result::Outcome::OutputJson("\"done\"".into())),
    }))
    .await;
    assert!(matches!(
        raw.next().await,
        Out::ResultAck(pb::ResultAck { accepted: true, .. })
    ));
    assert_eq!(turn.await.unwrap()[0].content, "done");
    let finished = raw.cache(id, attempt, get("shared")).await;
    assert!(
        finished.error.contains("is not held by this session"),
        "a settled dispatch no longer reaches the cache: {finished:?}"
    );

    assert_eq!(
        one(&kernel, &run, 2, "memo", json!({"key": "shared"})).await,
        "1",
        "raw_tool's entry under the same key is its own"
    );
}

/// `memo` declares `strip_nulls`: the nulls a model fills optional fields with are dropped before
/// the call is validated, hashed and recorded, so the record, the replay identity and the tool see
/// the same arguments, with or without the nulls.
#[tokio::test]
async fn a_tool_that_strips_nulls_records_and_replays_the_call_without_them() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("nulls").await;
    let sent = json!({"key": "rate", "value": 7, "ttl_ms": null});
    assert_eq!(one(&kernel, &run, 0, "memo", sent).await, "7");
    let steps = kernel.get(&run).await.steps;
    assert_eq!(
        steps[0].arguments_json, r#"{"key":"rate","value":7}"#,
        "recorded without the null"
    );
    // The same call without the null is the same call: replayed, not diverged.
    let again = submit(&kernel, &run, 0, vec![call("memo", json!({"key": "rate", "value": 7}))])
        .await
        .unwrap();
    assert!(again.results[0].replayed, "{:?}", again.results[0]);
    check_log(&kernel.events(&run).await, true);
}
