//! Tool limits with real processes: a rate and a bound on calls at once held across several
//! workers and runs, the wait shown by `runs show`, a kernel SIGKILL mid-burst that neither loses
//! the limit's state nor lets the burst through.

use e2e::{Kernel, KernelOptions, call, check_log};
use kernel_proto::v1 as pb;
use serde_json::json;

fn limited(policy: &str) -> Kernel {
    Kernel::start_with(KernelOptions {
        policy: Some(policy.to_owned()),
        ..KernelOptions::default()
    })
}

/// The most calls whose `[start, end)` spans overlap at one moment.
fn most_at_once(mut spans: Vec<(i64, i64)>) -> usize {
    let mut edges: Vec<(i64, i32)> = spans.drain(..).flat_map(|(s, e)| [(s, 1), (e, -1)]).collect();
    // An end at the moment of a start comes first: the slot was given back in that write.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        most = most.max(now);
    }
    most as usize
}

/// Each attempt's `[start, end)` in the log: from its `tool:start` to the event that ended it (its
/// result, its failure, or its worker's loss), whose write gave its slots back.
fn attempt_spans(log: &[pb::Event]) -> Vec<(i64, i64)> {
    let mut open: std::collections::HashMap<String, i64> = Default::default();
    let mut spans = Vec::new();
    for event in log {
        let key = e2e::payload(event)["step_key"].as_str().unwrap_or_default().to_owned();
        match event.r#type.as_str() {
            "tool:start" => {
                open.insert(key, e2e::millis(event));
            }
            "tool:result" | "tool:attempt_failed" | "tool:lease_lost" => {
                if let Some(start) = open.remove(&key) {
                    spans.push((start, e2e::millis(event)));
                }
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "attempts never ended: {open:?}");
    spans
}

const POLICY: &str = r#"
default: allow
limits:
  - tools: "sleep*"
    per_second: 20
    burst: 5
    at_once: 3
"#;

#[tokio::test]
async fn a_rate_and_a_bound_on_calls_at_once_hold_across_workers_and_runs_and_the_wait_shows() {
    let kernel = limited(POLICY);
    let _workers = [kernel.fault_worker("w1"), kernel.fault_worker("w2")];
    kernel.wait_for_workers("sleepy", 2).await;
    let mut ids = Vec::new();
    let mut turns = Vec::new();
    for n in 0..3 {
        let run = kernel.create_run(&format!("burst-{n}")).await;
        let calls: Vec<pb::ToolCall> = (0..20).map(|i| call("sleepy", json!({"hold_ms": 40 + i}))).collect();
        turns.push(e2e::submit_in_background(&kernel, &run, 0, calls));
        ids.push(run);
    }
    // While the burst runs, the kernel says what the limit holds: calls wait for it, and no more
    // than its bound run.
    let held = e2e::eventually("calls to wait for the limit", || async {
        let status = kernel.status().await;
        match status.tool_limits.as_slice() {
            [limit] if limit.queued > 0 => Ok(limit.clone()),
            other => Err(other.to_vec()),
        }
    })
    .await;
    assert_eq!(
        (held.tools.as_str(), held.per_second, held.burst, held.at_once),
        ("sleep*", Some(20.0), Some(5.0), Some(3))
    );
    assert!(held.running <= 3, "{held:?}");
    assert!(held.tokens.is_some_and(|t| (0.0..=5.0).contains(&t)), "{held:?}");
    let mut spans = Vec::new();
    let mut starts = Vec::new();
    let mut waited = 0;
    for (run, turn) in ids.iter().zip(turns) {
        e2e::all_ok(turn, "a limited call waits rather than fails").await;
        for step in &kernel.get(run).await.steps {
            assert_eq!(step.limited_by, ["sleep*"], "{step:?}");
            waited += usize::from(step.limit_wait_ms > 0);
        }
        let log = kernel.events(run).await;
        check_log(&log, false);
        starts.extend(log.iter().filter(|e| e.r#type == "tool:start").map(e2e::millis));
        spans.extend(attempt_spans(&log));
    }
    assert_eq!(spans.len(), 60);
    assert!(most_at_once(spans.clone()) <= 3, "more than 3 at once: {spans:?}");
    starts.sort();
    let rate = e2e::check_rate(&starts, 20.0, 5.0);
    eprintln!("60 calls at a limit of 20 a second: {rate:.1} a second after the burst");
    assert!(waited > 40, "most calls waited for room; {waited} did");

    let listed = kernel.kernelctl_ok(&["limits"]);
    let row: Vec<&str> = listed
        .lines()
        .find(|line| line.starts_with("sleep*"))
        .unwrap_or_else(|| panic!("{listed}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        (row[1], row[3], row[4], row[6]),
        ("20/s", "3", "0", "0"),
        "after the burst nothing runs or waits: {listed}"
    );

    // `runs show` says which limit a call passed and how long it waited.
    let shown = kernel.kernelctl_ok(&["runs", "show", &ids[2]]);
    assert!(
        shown
            .lines()
            .any(|line| line.trim_start().starts_with("limits:") && line.contains("'sleep*' (waited ")),
        "{shown}"
    );
}

const TIGHT: &str = r#"
default: allow
limits:
  - tools: "sleepy"
    per_second: 2
    burst: 4
    at_once: 3
"#;

#[tokio::test]
async fn a_kernel_sigkill_mid_burst_neither_loses_the_limit_s_state_nor_lets_the_burst_through() {
    let mut kernel = limited(TIGHT);
    let worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let run = kernel.create_run("burst").await;
    let calls: Vec<pb::ToolCall> = (0..10).map(|n| call("sleepy", json!({"hold_ms": 100 + n}))).collect();
    let outcome = kernel.turn_across_a_sigkill(&run, calls, worker, 4).await;
    assert!(
        outcome.results.iter().all(|r| r.outcome == pb::CallOutcome::Ok as i32),
        "{:#?}",
        outcome.results
    );

    // Every attempt's start, before the kill and after it, passed the one bucket the store kept:
    // the burst was spent before the kill, and a restart does not refill it.
    let log = kernel.events(&run).await;
    check_log(&log, false);
    let mut starts: Vec<i64> = log
        .iter()
        .filter(|e| e.r#type == "tool:start")
        .map(e2e::millis)
        .collect();
    starts.sort();
    assert!(starts.len() >= 10, "{starts:?}");
    e2e::check_rate(&starts, 2.0, 4.0);
    // Attempts that ran when the kernel was killed hold their slots until their loss is
    // recorded; no more than three attempts ever held one.
    let spans = attempt_spans(&log);
    assert!(most_at_once(spans.clone()) <= 3, "{spans:?}");
    // Every slot was given back by the write that ended its call, the lost ones' among them.
    let status = kernel.status().await;
    assert!(status.resource_locks.is_empty(), "{:?}", status.resource_locks);
    assert_eq!(status.tool_limits[0].running, 0, "{:?}", status.tool_limits);
}

/// A limit the tool declares itself (`Tool::at_once`) holds across workers as a policy's does, and
/// shows as `tool:<name>`.
#[tokio::test]
async fn a_tool_s_own_limit_holds_across_its_workers() {
    let kernel = Kernel::start();
    let _workers = [
        kernel.fault_worker_with("w1", &["--sleepy-at-once", "2"]),
        kernel.fault_worker_with("w2", &["--sleepy-at-once", "2"]),
    ];
    kernel.wait_for_workers("sleepy", 2).await;
    let run = kernel.create_run("declared").await;
    let calls: Vec<pb::ToolCall> = (0..12).map(|n| call("sleepy", json!({"hold_ms": 30 + n}))).collect();
    let turn = e2e::submit_in_background(&kernel, &run, 0, calls);
    let held = e2e::eventually("calls to wait for the tool's limit", || async {
        let status = kernel.status().await;
        match status.tool_limits.as_slice() {
            [limit] if limit.queued > 0 => Ok(limit.clone()),
            other => Err(other.to_vec()),
        }
    })
    .await;
    assert_eq!((held.tools.as_str(), held.at_once), ("tool:sleepy", Some(2)));
    e2e::all_ok(turn, "a call past the tool's limit waits rather than fails").await;
    let log = kernel.events(&run).await;
    check_log(&log, false);
    let spans = attempt_spans(&log);
    assert_eq!(spans.len(), 12);
    assert!(
        most_at_once(spans.clone()) <= 2,
        "two workers of 16 slots each ran more than 2 at once: {spans:?}"
    );
    for step in &kernel.get(&run).await.steps {
        assert_eq!(step.limited_by, ["tool:sleepy"], "{step:?}");
    }
}
