//! Budgets with real processes: a runaway agent stopped at its budget reading why, the policy
//! file's budgets by label, a burst across a kernel SIGKILL that never passes its budget, and
//! refused budgets that write nothing.

use std::collections::BTreeSet;

use e2e::{Kernel, KernelOptions, call, check_log};
use kernel_proto::v1 as pb;
use serde_json::json;
use worker_sdk::{AgentClient, BudgetLimit, Call, NewRun, Outcome};

/// The kernel prices `sleepy` at 0.5 an attempt.
fn priced(policy: Option<&str>) -> Kernel {
    Kernel::start_with(KernelOptions {
        args: vec!["--unit-price".into(), "sleepy=0.5".into()],
        policy: policy.map(str::to_owned),
        ..KernelOptions::default()
    })
}

/// The distinct idempotency keys under which the workers started `tool`.
fn started_keys(kernel: &Kernel, tool: &str) -> BTreeSet<String> {
    kernel
        .ledger()
        .into_iter()
        .filter(|line| line.what == "start" && line.tool == tool)
        .map(|line| line.key)
        .collect()
}

#[tokio::test]
async fn a_runaway_agent_is_stopped_at_its_budget_and_the_model_reads_why() {
    let kernel = priced(None);
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent
        .create_run(
            NewRun::new("runaway", json!({}))
                .budget(BudgetLimit::calls(5))
                .budget(BudgetLimit::cost(100.0).on("sleep*")),
        )
        .await
        .unwrap();

    // The loop a model stuck on one tool makes: call, read, call again, until told to stop.
    let mut stopped = None;
    for turn in 0..20 {
        let results = run
            .call_turn(turn, vec![Call::new("sleepy", json!({"hold_ms": 1}))])
            .await
            .unwrap();
        if results[0].outcome != Outcome::Ok {
            stopped = Some((turn, results[0].clone()));
            break;
        }
    }
    let (turn, refused) = stopped.expect("the budget never stopped the loop");
    assert_eq!(turn, 5, "five calls ran, the sixth did not");
    assert_eq!(refused.outcome, Outcome::BudgetExceeded);
    assert_eq!(
        refused.content,
        format!(
            "budget exceeded: calls 6 of 5 for run {}; 'sleepy' did not run",
            run.id()
        )
    );
    assert_eq!(started_keys(&kernel, "sleepy").len(), 5, "the worker ran five calls");

    let snapshot = run.get().await.unwrap();
    let spent: Vec<(u64, f64)> = snapshot
        .run
        .budget
        .iter()
        .map(|limit| (limit.spent_calls, limit.spent_cost))
        .collect();
    assert_eq!(spent, [(5, 2.5), (5, 2.5)], "{:?}", snapshot.run.budget);
    let shown = kernel.kernelctl_ok(&["runs", "show", run.id()]);
    assert!(
        shown.contains("budget:      calls 5 of 5 (request); on 'sleep*': cost 2.50 of 100.00 (request)"),
        "{shown}"
    );
    let log = kernel.events(run.id()).await;
    check_log(&log, false);
    let last = log.last().unwrap();
    assert_eq!(last.r#type, "tool:result");
    assert_eq!(e2e::payload(last)["reason"], "budget_exceeded");
}

const POLICY: &str = r#"
default: allow
budgets:
  - labels: { team: billing }
    max_cost: 1.0
  - agents: ["batch-*"]
    tools: "sleepy"
    max_calls: 1
"#;

#[tokio::test]
async fn the_policy_s_budgets_cover_the_runs_they_match_and_a_request_can_only_tighten_them() {
    let kernel = priced(Some(POLICY));
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let agent = AgentClient::connect(kernel.url()).await.unwrap();

    // team=billing gets 1.0 of cost: two calls at 0.5, and a third is refused, though the run
    // asked for more.
    let billing = agent
        .create_run(
            NewRun::new("support", json!({}))
                .label("team", "billing")
                .budget(BudgetLimit::cost(50.0)),
        )
        .await
        .unwrap();
    let calls: Vec<Call> = (0..3).map(|n| Call::new("sleepy", json!({"hold_ms": n}))).collect();
    let outcomes: Vec<Outcome> = billing
        .call_turn(0, calls)
        .await
        .unwrap()
        .iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(outcomes, [Outcome::Ok, Outcome::Ok, Outcome::BudgetExceeded]);
    let budget = billing.get().await.unwrap().run.budget;
    let set_by: Vec<&str> = budget.iter().map(|l| l.set_by.as_str()).collect();
    assert_eq!(set_by, ["request", "policy:budgets[0]"]);

    // An agent the second budget names may call sleepy once; another tool is not counted.
    let batch = agent.create_run(NewRun::new("batch-nightly", json!({}))).await.unwrap();
    let results = batch
        .call_turn(
            0,
            vec![
                Call::new("sleepy", json!({"hold_ms": 1})),
                Call::new("lookup", json!({"q": "x", "hold_ms": 1})),
                Call::new("sleepy", json!({"hold_ms": 2})),
            ],
        )
        .await
        .unwrap();
    let outcomes: Vec<Outcome> = results.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Ok, Outcome::Ok, Outcome::BudgetExceeded]);
    assert!(
        results[2].content.contains("calls 2 of 1 on 'sleepy'"),
        "{}",
        results[2].content
    );

    // A run neither budget matches has none.
    let free = agent.create_run(NewRun::new("support", json!({}))).await.unwrap();
    assert!(free.get().await.unwrap().run.budget.is_empty());
}

#[tokio::test]
async fn a_burst_across_a_kernel_sigkill_never_passes_its_budget() {
    let mut kernel = priced(None);
    let worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let mut runs = kernel.runs().await;
    let run = runs
        .create_run(pb::CreateRunRequest {
            agent: "burst".into(),
            budget: vec![pb::BudgetLimit {
                max_calls: Some(10),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .id;
    let calls: Vec<pb::ToolCall> = (0..25).map(|n| call("sleepy", json!({"hold_ms": 300 + n}))).collect();
    let outcome = kernel.turn_across_a_sigkill(&run, calls, worker, 3).await;

    let mut by_outcome = std::collections::BTreeMap::new();
    for result in &outcome.results {
        *by_outcome.entry(result.outcome).or_insert(0) += 1;
    }
    assert_eq!(
        by_outcome,
        [
            (pb::CallOutcome::Ok as i32, 10),
            (pb::CallOutcome::BudgetExceeded as i32, 15)
        ]
        .into(),
        "{:#?}",
        outcome.results
    );
    // No call went to a worker before its charge was recorded, so none ran unpaid.
    assert!(started_keys(&kernel, "sleepy").len() <= 10, "{:?}", kernel.ledger());
    let detail = kernel
        .runs()
        .await
        .get_run(pb::GetRunRequest { run_id: run.clone() })
        .await
        .unwrap();
    let detail = detail.into_inner();
    assert_eq!(detail.run.unwrap().budget[0].spent_calls, 10);
    let started = detail.steps.iter().filter(|s| s.attempts > 0).count();
    assert_eq!(started, 10, "every call charged is a call started");
    check_log(&kernel.events(&run).await, false);
}

#[tokio::test]
async fn a_budget_that_limits_nothing_or_by_no_cost_is_refused_naming_its_field_and_makes_no_run() {
    let kernel = Kernel::start();
    let mut runs = kernel.runs().await;
    let cases = [
        (pb::BudgetLimit::default(), "budget[0]", "limits nothing"),
        (
            pb::BudgetLimit {
                max_cost: Some(-1.0),
                ..Default::default()
            },
            "budget[0].max_cost",
            "is not a cost >= 0",
        ),
        (
            pb::BudgetLimit {
                tools: "pay[".into(),
                max_calls: Some(1),
                ..Default::default()
            },
            "budget[0].tools",
            "invalid glob",
        ),
    ];
    for (limit, field, why) in cases {
        let status = runs
            .create_run(pb::CreateRunRequest {
                agent: "refused".into(),
                budget: vec![limit],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(field), "{}", status.message());
        assert!(status.message().contains(why), "{}", status.message());
    }
    let listed = runs
        .list_runs(pb::ListRunsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.runs.is_empty(),
        "a refused create wrote a run: {:?}",
        listed.runs
    );

    let refused = kernel.kernelctl(&["runs", "start", "x", "--budget", "calls=two"]);
    assert_eq!(refused.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("calls 'two' is not a whole number"));
}

const ASKING: &str = r#"
default: allow
budgets:
  - max_calls: 3
    approval: { approvers: [finance], timeout: 1h }
"#;

/// The next item of a turn's stream.
async fn next_item(
    stream: &mut (impl futures_util::Stream<Item = Result<worker_sdk::TurnItem, worker_sdk::AgentError>> + Unpin),
) -> worker_sdk::TurnItem {
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        futures_util::StreamExt::next(stream),
    )
    .await
    .expect("the turn stalled")
    .expect("the turn ended early")
    .unwrap()
}

#[tokio::test]
async fn a_budget_that_asks_waits_for_a_person_who_raises_it_or_refuses() {
    let kernel = priced(Some(ASKING));
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent.create_run(NewRun::new("asker", json!({}))).await.unwrap();
    let sleepy = |n: u64| Call::new("sleepy", json!({"hold_ms": n}));
    let done = run.call_turn(0, vec![sleepy(1), sleepy(2)]).await.unwrap();
    assert!(done.iter().all(|r| r.outcome == Outcome::Ok), "{done:?}");

    // Two more calls with one call left: both are recorded, the first starts, the second would
    // pass the limit as it starts and waits for a person instead.
    let mut turn = Box::pin(run.submit_turn(1, vec![sleepy(3), sleepy(4)]));
    let mut results = Vec::new();
    let asked = loop {
        match next_item(&mut turn).await {
            worker_sdk::TurnItem::Interrupted(asked) => break asked,
            worker_sdk::TurnItem::Result(result) => results.push(result),
            worker_sdk::TurnItem::Progress(_) => {}
        }
    };
    assert_eq!(
        (asked.reason.as_str(), asked.position),
        ("budget_exceeded", 1),
        "{asked:?}"
    );
    assert!(
        asked
            .message
            .starts_with(&format!("budget exceeded: calls 4 of 3 for run {}", run.id())),
        "{asked:?}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&kernel.kernelctl_ok(&["--json", "approvals", "list"])).unwrap();
    let approval = &listed["approvals"][0];
    assert_eq!(approval["decided_by"], format!("budget:{}#0", run.id()));
    assert!(
        approval["answer_schema"]["properties"]["max_calls"].is_object(),
        "{approval}"
    );

    // Leave without a new limit is refused, naming the answer; a raise lets the call start.
    let bare = kernel.kernelctl(&["approvals", "approve", &asked.approval_id, "--as", "finance"]);
    assert!(!bare.status.success());
    assert!(
        String::from_utf8_lossy(&bare.stderr).contains("answer_json"),
        "{bare:?}"
    );
    kernel.kernelctl_ok(&[
        "approvals",
        "answer",
        &asked.approval_id,
        "--with",
        r#"{"max_calls": 4}"#,
        "--as",
        "finance",
    ]);
    while results.len() < 2 {
        if let worker_sdk::TurnItem::Result(result) = next_item(&mut turn).await {
            results.push(result);
        }
    }
    assert!(results.iter().all(|r| r.outcome == Outcome::Ok), "{results:?}");
    let shown = kernel.kernelctl_ok(&["runs", "show", run.id()]);
    assert!(
        shown.contains("budget:      calls 4 of 4 (policy:budgets[0], raised by finance)"),
        "{shown}"
    );

    // Past the raised limit, refused: the model reads that the budget was not raised.
    let mut turn = Box::pin(run.submit_turn(2, vec![sleepy(5)]));
    let worker_sdk::TurnItem::Interrupted(asked) = next_item(&mut turn).await else {
        panic!("the fifth call did not wait for a person");
    };
    agent
        .reject(&asked.approval_id, "finance", "enough for today")
        .await
        .unwrap();
    let worker_sdk::TurnItem::Result(refused) = next_item(&mut turn).await else {
        panic!("no result after the rejection");
    };
    assert_eq!(refused.outcome, Outcome::BudgetExceeded);
    assert_eq!(
        refused.content,
        "'sleepy' did not run: its budget was passed and finance did not raise it (enough for today)"
    );
    assert_eq!(started_keys(&kernel, "sleepy").len(), 4, "the worker ran four calls");
    check_log(&kernel.events(run.id()).await, false);
}

#[tokio::test]
async fn a_time_budget_holds_each_call_s_timeout_while_it_runs_and_stops_the_loop_past_it() {
    let kernel = priced(None);
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let budget = BudgetLimit::time(std::time::Duration::from_millis(2_500));
    let run = agent
        .create_run(NewRun::new("timed", json!({})).budget(budget))
        .await
        .unwrap();
    let sleepy = |hold_ms: u64| {
        Call::new("sleepy", json!({ "hold_ms": hold_ms })).with_timeout(std::time::Duration::from_secs(1))
    };

    // Four calls of a turn, each holding its 1 s timeout of the 2.5 s: two at a time, the others
    // waiting until the first end, and all four run.
    let results = run.call_turn(0, (0..4).map(|_| sleepy(300)).collect()).await.unwrap();
    assert!(results.iter().all(|r| r.outcome == Outcome::Ok), "{results:?}");
    let steps = kernel.get(run.id()).await.steps;
    let at = |seconds: i64, nanos: i32| seconds * 1000 + i64::from(nanos) / 1_000_000;
    let spans: Vec<(i64, i64)> = steps
        .iter()
        .map(|s| {
            let (started, finished) = (s.started_at.as_ref().unwrap(), s.finished_at.as_ref().unwrap());
            (at(started.seconds, started.nanos), at(finished.seconds, finished.nanos))
        })
        .collect();
    for (start, _) in &spans {
        let running = spans.iter().filter(|(s, f)| s <= start && start < f).count();
        assert!(
            running <= 2,
            "{running} calls ran at once under 2.5 s of 1 s timeouts: {spans:?}"
        );
    }

    // The loop goes on until what it spent leaves no room for one more timeout.
    let mut stopped = None;
    for turn in 1..20 {
        let results = run.call_turn(turn, vec![sleepy(300)]).await.unwrap();
        if results[0].outcome != Outcome::Ok {
            stopped = Some(results[0].clone());
            break;
        }
    }
    let refused = stopped.expect("the time budget never stopped the loop");
    assert_eq!(refused.outcome, Outcome::BudgetExceeded);
    assert!(
        refused.content.starts_with("budget exceeded: time ")
            && refused
                .content
                .contains("with 1.00 s more for this call's timeout, of 2.50 s for run")
            && refused.content.ends_with("'sleepy' did not run"),
        "{}",
        refused.content
    );
    let shown = kernel.get(run.id()).await.run.unwrap();
    let limit = &shown.budget[0];
    assert_eq!(limit.reserved_time_ms, 0, "nothing runs, nothing is held");
    assert!(
        limit.spent_time_ms > 1_500 && limit.spent_time_ms <= 2_500,
        "spent {} ms",
        limit.spent_time_ms
    );
    let printed = kernel.kernelctl(&["runs", "show", run.id()]);
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains(" of 2.5s (request)"), "{printed}");
}
