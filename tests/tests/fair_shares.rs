//! Fair shares with real processes: one tenant's burst of a hundred calls queued for a tool
//! limit or for a worker's one slot, and another tenant's single call behind it. With
//! `fair_shares` the single call starts within a couple of the burst's; without them it waits
//! for the whole burst, which shows the test tells the two apart.

use std::time::Duration;

use e2e::{Kernel, KernelOptions, call, check_log};
use kernel_proto::v1 as pb;
use serde_json::json;

const BURST: usize = 100;

/// The burst's calls that may start ahead of the single one once it is recorded: the one whose
/// start was committing then, one the scheduler may hand out between the single call's record and
/// its arrival in the queue, and the burst's next one, tagged level with the single call and
/// queued earlier.
const MOST_AHEAD: usize = 3;

/// One tool call at a time, by a tool limit or by the worker's one slot.
#[derive(Clone, Copy, Debug)]
enum Scarce {
    Limit,
    WorkerSlot,
}

fn policy(scarce: Scarce, fair: bool) -> String {
    let mut policy = String::from("default: allow\n");
    if let Scarce::Limit = scarce {
        policy.push_str("limits:\n  - tools: \"sleepy\"\n    at_once: 1\n");
    }
    if fair {
        policy.push_str("fair_shares:\n  label: tenant\n");
    }
    policy
}

/// How the single call fared behind the burst.
#[derive(Debug)]
struct Starved {
    /// The burst's calls that started after the single call was recorded and before it started.
    passed_by: usize,
    /// From the single call's record to its start.
    waited: Duration,
}

/// Queues a burst of `BURST` calls of tenant `a`, then one call of tenant `b`, with one call
/// running at a time; says how many of the burst's calls started ahead of `b`'s once it was queued.
async fn burst_then_one(scarce: Scarce, fair: bool) -> Starved {
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(policy(scarce, fair)),
        ..KernelOptions::default()
    });
    let slots = match scarce {
        Scarce::Limit => "4",
        Scarce::WorkerSlot => "1",
    };
    let _worker = kernel.fault_worker_with("w1", &["--max-concurrency", slots]);
    kernel.wait_for_workers("sleepy", 1).await;
    let burst = kernel.create_labelled_run("agent-of-a", &[("tenant", "a")]).await;
    let single = kernel.create_labelled_run("agent-of-b", &[("tenant", "b")]).await;
    let calls: Vec<pb::ToolCall> = (0..BURST)
        .map(|n| call("sleepy", json!({"hold_ms": 10 + n % 3})))
        .collect();
    let burst_turn = e2e::submit_in_background(&kernel, &burst, 0, calls);
    e2e::eventually("most of the burst to queue", || async {
        let status = kernel.status().await;
        if status.queued_calls as usize >= BURST - 10 {
            Ok(())
        } else {
            Err(status.queued_calls)
        }
    })
    .await;
    if fair {
        // The kernel says which share waits: `kernelctl shares` lists the burst's share.
        let listed = kernel.kernelctl_ok(&["shares"]);
        let row: Vec<&str> = listed
            .lines()
            .find(|line| line.starts_with("a "))
            .unwrap_or_else(|| panic!("{listed}"))
            .split_whitespace()
            .collect();
        assert_eq!(row[1], "1", "{listed}");
        assert!(row[2].parse::<usize>().unwrap() >= BURST / 2, "{listed}");
        assert!(listed.starts_with("fair shares by label 'tenant'"), "{listed}");
    }
    let single_turn = e2e::submit_in_background(&kernel, &single, 0, vec![call("sleepy", json!({"hold_ms": 10}))]);
    for turn in [burst_turn, single_turn] {
        e2e::all_ok(turn, "a call that waits for its share's turn does not fail").await;
    }

    if fair {
        let shown = kernel.kernelctl_ok(&["runs", "show", &single]);
        assert!(
            shown
                .lines()
                .any(|line| line.split_whitespace().collect::<Vec<_>>() == ["share:", "b"]),
            "a call shows its run's share: {shown}"
        );
    }
    let single_log = kernel.events(&single).await;
    check_log(&single_log, false);
    let at = |log: &[pb::Event], kind: &str| -> Vec<i64> {
        log.iter().filter(|e| e.r#type == kind).map(e2e::millis).collect()
    };
    let (queued, started) = (at(&single_log, "tool:scheduled")[0], at(&single_log, "tool:start")[0]);
    let burst_log = kernel.events(&burst).await;
    check_log(&burst_log, false);
    let burst_starts = at(&burst_log, "tool:start");
    assert_eq!(burst_starts.len(), BURST, "no call of the burst was tried twice");
    // One call runs at a time and each holds its slot 10 ms or more: no two starts share a
    // millisecond, so the times order them.
    let passed_by = burst_starts.iter().filter(|t| (queued..started).contains(t)).count();
    Starved {
        passed_by,
        waited: Duration::from_millis((started - queued) as u64),
    }
}

#[tokio::test]
async fn a_tenant_s_single_call_is_not_starved_by_another_s_burst_for_a_tool_limit() {
    let fair = burst_then_one(Scarce::Limit, true).await;
    let unfair = burst_then_one(Scarce::Limit, false).await;
    eprintln!(
        "behind a burst of {BURST} for a tool limit, fair shares: {} calls passed, waited {:?}; \
         in arrival order: {} passed, waited {:?}",
        fair.passed_by, fair.waited, unfair.passed_by, unfair.waited
    );
    assert!(fair.passed_by <= MOST_AHEAD, "{fair:?}");
    assert!(
        unfair.passed_by >= BURST / 2,
        "in arrival order the burst goes first: {unfair:?}"
    );
}

#[tokio::test]
async fn a_tenant_s_single_call_is_not_starved_by_another_s_burst_for_a_worker_slot() {
    let fair = burst_then_one(Scarce::WorkerSlot, true).await;
    eprintln!(
        "behind a burst of {BURST} for a worker's one slot: {} calls passed, waited {:?}",
        fair.passed_by, fair.waited
    );
    assert!(fair.passed_by <= MOST_AHEAD, "{fair:?}");
}
