//! Branches and case runs with the real kernel, fault workers and `kernelctl`: a branch replays
//! what its parent recorded (marked so), runs reads live, and ends at the first other effect the
//! parent never recorded with `write_tool_blocked`; a case run runs what its tokens allow. The
//! ledger says which tool bodies and step closures really ran.

use e2e::{Kernel, LedgerLine, call, check_log, submit, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

/// The ledger lines of `tool`'s body starting (`push` writes `lock:<repo>` instead).
fn starts<'a>(ledger: &'a [LedgerLine], tool: &str) -> Vec<&'a LedgerLine> {
    ledger
        .iter()
        .filter(|l| l.tool == tool && (l.what == "start" || l.what.starts_with("lock:")))
        .collect()
}

/// Makes a branch with `kernelctl runs fork`, returning its id.
fn fork(kernel: &Kernel, args: &[&str]) -> String {
    let mut all = vec!["runs", "fork"];
    all.extend_from_slice(args);
    let out = kernel.kernelctl(&all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn complete(kernel: &Kernel, run: &str) {
    kernel
        .runs()
        .await
        .complete_run(pb::CompleteRunRequest {
            run_id: run.into(),
            output_json: "{}".into(),
        })
        .await
        .expect("complete");
}

fn outcome(result: &pb::CallResult) -> pb::CallOutcome {
    pb::CallOutcome::try_from(result.outcome).unwrap()
}

/// A recorded run: turn 0 asks `whoami` (read_only) and charges (at_most_once, unmarked); turn 1
/// pushes (declared `writes`).
async fn recorded_run(kernel: &Kernel, capture: pb::Capture) -> String {
    let request = pb::CreateRunRequest {
        agent: "agent".into(),
        input_json: "{}".into(),
        capture: capture as i32,
        ..Default::default()
    };
    let run = kernel
        .runs()
        .await
        .create_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
        .id;
    let turn0 = vec![call("whoami", json!({})), call("charge", json!({"hold_ms": 0}))];
    let done = submit(kernel, &run, 0, turn0).await.unwrap();
    assert!(
        done.results.iter().all(|r| outcome(r) == pb::CallOutcome::Ok),
        "{done:?}"
    );
    let turn1 = vec![call("push", json!({"repo": "a", "hold_ms": 0}))];
    submit(kernel, &run, 1, turn1).await.unwrap();
    complete(kernel, &run).await;
    run
}

#[tokio::test]
async fn a_branch_with_a_changed_result_replays_writes_runs_reads_and_ends_at_a_new_write() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    kernel.wait_for_workers("whoami", 1).await;
    let parent = recorded_run(&kernel, pb::Capture::Io).await;
    let branch = fork(&kernel, &[&parent, "--set-result", r#"t0/p0={"turn":9}"#]);

    // The recorded calls replay, the changed result in place of whoami's: nothing runs.
    let turn0 = vec![call("whoami", json!({})), call("charge", json!({"hold_ms": 0}))];
    let replayed = submit(&kernel, &branch, 0, turn0).await.unwrap();
    assert!(replayed.results.iter().all(|r| r.replayed), "{replayed:?}");
    assert_eq!(replayed.results[0].content, r#"{"turn":9}"#);
    assert_eq!(
        starts(&kernel.ledger(), "charge").len(),
        1,
        "the charge ran once, in the parent"
    );

    // A read the parent never made runs live.
    let read = submit(&kernel, &branch, 1, vec![call("whoami", json!({}))])
        .await
        .unwrap();
    let live: Value = serde_json::from_str(&read.results[0].content).unwrap();
    assert_eq!(
        (live["step_key"].as_str(), read.results[0].replayed),
        (Some("t1/p0"), false)
    );

    // A charge with other arguments was never recorded: refused as unmarked, and the branch ends.
    let write = submit(&kernel, &branch, 2, vec![call("charge", json!({"hold_ms": 1}))])
        .await
        .unwrap();
    let refused = &write.results[0];
    assert_eq!(outcome(refused), pb::CallOutcome::WriteToolBlocked);
    assert!(
        refused.content.starts_with("write_tool_blocked: 'charge'") && refused.content.contains("(reason: unmarked)"),
        "{}",
        refused.content
    );
    let ended = kernel.finished(&branch).await;
    assert_eq!(ended.status, pb::RunStatus::Failed as i32);
    assert_eq!(ended.reason, "write_tool_blocked: charge (reason: unmarked)");
    assert_eq!(ended.forked_from_run_id, parent);
    assert_eq!(
        starts(&kernel.ledger(), "charge").len(),
        1,
        "the refused charge never ran"
    );
    let late = submit(&kernel, &branch, 3, vec![call("whoami", json!({}))])
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late}");
    check_log(&kernel.events(&branch).await, true);

    // The diff lines the two runs up by identity and says what the branch did with each step.
    let diff = kernel.kernelctl(&["runs", "diff", &parent, &branch, "--json"]);
    assert!(diff.status.success(), "{}", String::from_utf8_lossy(&diff.stderr));
    let diff: Value = serde_json::from_slice(&diff.stdout).unwrap();
    let marks: Vec<(&str, &str)> = diff["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step_key"].as_str().unwrap(), s["mark"].as_str().unwrap()))
        .collect();
    assert_eq!(
        marks,
        [
            ("t0/p0", "set"),
            ("t0/p1", "replayed"),
            ("t1/p0", "live"),
            ("t2/p0", "blocked")
        ],
        "{diff}"
    );
    assert_eq!(diff["stopped_at"], "t2/p0");
    let t1 = &diff["steps"][2];
    assert!(
        t1["differs"].as_array().unwrap().iter().any(|d| d == "arguments"),
        "{t1}"
    );
    let table = kernel.kernelctl(&["runs", "diff", &parent, &branch]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("is a branch of") && table.contains("blocked") && table.contains("t2/p0"),
        "{table}"
    );
}

#[tokio::test]
async fn a_writes_tool_is_refused_live_and_capture_none_withholds_the_reason() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    kernel.wait_for_workers("push", 1).await;
    for (capture, detail) in [
        (pb::Capture::Io, "(reason: write)"),
        (pb::Capture::None, "(reason withheld: capture=none)"),
    ] {
        let parent = recorded_run(&kernel, capture).await;
        // Forked before the push: the same push is now an unrecorded write.
        let branch = fork(&kernel, &[&parent, "--at", "t0/p1"]);
        let listed = kernel.kernelctl(&["runs", "list", "--branch-of", &parent]);
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert!(listed.contains(&branch) && !listed.contains(&parent), "{listed}");
        let push = vec![call("push", json!({"repo": "a", "hold_ms": 0}))];
        let refused = submit(&kernel, &branch, 1, push).await.unwrap();
        let content = &refused.results[0].content;
        assert_eq!(outcome(&refused.results[0]), pb::CallOutcome::WriteToolBlocked);
        assert!(
            content.starts_with("write_tool_blocked: 'push'") && content.ends_with(detail),
            "{content}"
        );
        let ended = kernel.finished(&branch).await;
        assert_eq!(ended.reason, format!("write_tool_blocked: push {detail}"));
        assert!(!ended.reason.contains("write)") || capture == pb::Capture::Io);
    }
    assert_eq!(starts(&kernel.ledger(), "push").len(), 2, "only the parents pushed");
}

#[tokio::test]
async fn a_case_run_runs_the_write_its_token_allows_and_refuses_the_others() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    kernel.wait_for_workers("push", 1).await;
    let request = pb::CreateRunRequest {
        agent: "agent".into(),
        input_json: "{}".into(),
        allow: vec!["tool:push".into()],
        ..Default::default()
    };
    let run = kernel
        .runs()
        .await
        .create_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(run.allow, ["tool:push"]);
    let pushed = submit(
        &kernel,
        &run.id,
        0,
        vec![call("push", json!({"repo": "t", "hold_ms": 0}))],
    )
    .await
    .unwrap();
    assert_eq!(outcome(&pushed.results[0]), pb::CallOutcome::Ok, "{pushed:?}");
    let charged = submit(&kernel, &run.id, 1, vec![call("charge", json!({"hold_ms": 0}))])
        .await
        .unwrap();
    assert!(
        charged.results[0].content.contains("allow it with tool:charge"),
        "{charged:?}"
    );
    assert_eq!(kernel.finished(&run.id).await.status, pb::RunStatus::Failed as i32);
    let ledger = kernel.ledger();
    assert_eq!((starts(&ledger, "push").len(), starts(&ledger, "charge").len()), (1, 0));
    let bad = pb::CreateRunRequest {
        agent: "agent".into(),
        allow: vec!["push".into()],
        ..Default::default()
    };
    let refused = kernel.runs().await.create_run(bad).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("allow[0]"), "{}", refused.message());
}

/// The `script` agent's output, once its run completed.
async fn results(kernel: &Kernel, run: &str) -> Vec<Value> {
    let done = kernel.finished(run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    output["results"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_hosted_branch_runs_read_and_pure_steps_and_refuses_write_steps_and_once() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let recorded = json!({"ops": [
        {"once": "plan"},
        {"step": "save", "effect": "write"},
        {"call": "whoami", "args": {}},
    ]});
    let parent = kernel.start_hosted("script", recorded).await;
    results(&kernel, &parent).await;

    let new_input = json!({"ops": [
        {"once": "plan"},
        {"step": "look", "effect": "read"},
        {"step": "sum", "effect": "pure"},
        {"step": "save", "effect": "write"},
        {"step": "mail", "effect": "write"},
        {"call": "whoami", "args": {}},
    ]});
    let branch = fork(&kernel, &[&parent, "--input", &new_input.to_string()]);
    let ended = kernel.finished(&branch).await;
    assert_eq!(ended.status, pb::RunStatus::Failed as i32, "{ended:?}");
    assert_eq!(ended.reason, "write_tool_blocked: ctx.step:mail (reason: step)");
    let ledger = kernel.ledger();
    let ran = |step: &str| starts(&ledger, &format!("step:{step}")).len();
    assert_eq!((ran("plan"), ran("save")), (1, 1), "recorded steps replay: {ledger:?}");
    assert_eq!(
        (ran("look"), ran("sum"), ran("mail")),
        (1, 1, 0),
        "reads run live, the write never"
    );
    let steps = kernel.get(&branch).await.steps;
    let step = |key: &str| {
        steps
            .iter()
            .find(|s| s.step_key == key)
            .unwrap_or_else(|| panic!("{key}: {steps:?}"))
    };
    assert_eq!(step("step:plan#0").replayed_from_run_id, parent);
    assert_eq!(step("step:save#0").decided_by, "branch:parent");
    assert_eq!(step("step:look#0").replayed_from_run_id, "");
    assert_eq!(step("step:mail#0").outcome, pb::CallOutcome::WriteToolBlocked as i32);
    assert!(
        steps.iter().all(|s| s.tool != "whoami"),
        "the handler caught the refusal, but its run had ended"
    );
    check_log(&kernel.events(&branch).await, true);

    // A ctx.once the parent never recorded is refused whatever its effect.
    let once = json!({"ops": [{"once": "other"}]});
    let branch = fork(&kernel, &[&parent, "--input", &once.to_string()]);
    let ended = kernel.finished(&branch).await;
    assert_eq!(ended.reason, "write_tool_blocked: ctx.step:other (reason: step)");
    assert_eq!(starts(&kernel.ledger(), "step:other").len(), 0);
}

#[tokio::test]
async fn a_suspended_branch_whose_parent_was_deleted_ends_unresumable() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let parent = kernel
        .start_hosted("script", json!({"ops": [{"call": "whoami", "args": {}}]}))
        .await;
    results(&kernel, &parent).await;
    let waits = json!({"ops": [{"call": "lookup", "args": {"q": "x", "hold_ms": 3000}}]});
    let branch = fork(&kernel, &[&parent, "--input", &waits.to_string()]);
    // Waiting on the live read, the handler gives back its slot.
    kernel.wait_status(&branch, |s| s == pb::RunStatus::Suspended).await;
    let deleted = kernel.kernelctl(&["runs", "delete", &parent]);
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    let ended = kernel.finished(&branch).await;
    assert_eq!(ended.status, pb::RunStatus::Failed as i32);
    assert!(
        ended.reason.starts_with("branch_unresumable: parent_missing"),
        "{}",
        ended.reason
    );
    check_log(&kernel.events(&branch).await, true);
}

#[tokio::test]
async fn a_hosted_branch_whose_worker_is_killed_replays_and_stays_a_branch() {
    let kernel = Kernel::start();
    let _tools = kernel.fault_worker("tools");
    let mut host1 = kernel.fault_worker_with("host1", &["--agents-only"]);
    let parent = kernel
        .start_hosted(
            "script",
            json!({"ops": [{"once": "plan"}, {"call": "whoami", "args": {}}]}),
        )
        .await;
    results(&kernel, &parent).await;
    let input = json!({"ops": [
        {"once": "plan"},
        {"step": "look", "effect": "read"},
        {"call": "lookup", "args": {"q": "y", "hold_ms": 1500}},
        {"step": "after", "effect": "read"},
    ]});
    let branch = fork(&kernel, &[&parent, "--input", &input.to_string()]);
    wait_ledger(&kernel, "the branch's live read", |l| !starts(l, "lookup").is_empty()).await;
    host1.kill9();
    let _host2 = kernel.fault_worker_with("host2", &["--agents-only"]);
    let done = kernel.finished(&branch).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    assert_eq!(done.forked_from_run_id, parent, "still a branch of its parent");
    assert!(done.dispatches >= 2, "dispatched again after the kill: {done:?}");
    let ledger = kernel.ledger();
    assert_eq!(
        starts(&ledger, "step:plan").len(),
        1,
        "the plan was decided once, by the parent"
    );
    assert_eq!(
        starts(&ledger, "step:look").len(),
        1,
        "the branch's own record replays after the kill"
    );
    let steps = kernel.get(&branch).await.steps;
    let plan = steps.iter().find(|s| s.step_key == "step:plan#0").unwrap();
    assert_eq!(plan.replayed_from_run_id, parent);
    check_log(&kernel.events(&branch).await, true);
}

#[tokio::test]
async fn a_branch_s_subagent_replays_runs_as_a_branch_of_the_recorded_child_or_is_refused() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let child = |label: &str| json!({"child": "child", "input": {"label": label, "hold_ms": 0}});
    let parent = kernel.start_hosted("script", json!({"ops": [child("a")]})).await;
    let recorded = results(&kernel, &parent).await;

    // The same child again replays its output; no second child runs.
    let same = fork(&kernel, &[&parent]);
    assert_eq!(results(&kernel, &same).await, recorded);
    assert_eq!(starts(&kernel.ledger(), "step:work").len(), 1);

    // With another input the child runs as a branch of the recorded one: its recorded write
    // step replays, and its output says the new label.
    let other = fork(
        &kernel,
        &[&parent, "--input", &json!({"ops": [child("b")]}).to_string()],
    );
    let output = results(&kernel, &other).await;
    assert_eq!(output[0]["label"], "b", "{output:?}");
    let grandchild = output[0]["run_id"].as_str().unwrap().to_owned();
    let recorded_child = recorded[0]["run_id"].as_str().unwrap();
    let run = kernel.get(&grandchild).await.run.unwrap();
    assert_eq!(
        (run.forked_from_run_id.as_str(), run.parent_run_id.as_str()),
        (recorded_child, other.as_str())
    );
    assert_eq!(
        starts(&kernel.ledger(), "step:work").len(),
        1,
        "the child's write step replayed"
    );

    // A subagent the parent never started is refused as an effect.
    let new_agent = json!({"ops": [{"child": "pipeline", "input": {"calls": 0}}]});
    let refused = fork(&kernel, &[&parent, "--input", &new_agent.to_string()]);
    let ended = kernel.finished(&refused).await;
    assert_eq!(ended.reason, "write_tool_blocked: subagent:pipeline (reason: effect)");
}

#[tokio::test]
async fn the_rust_client_lists_runs_by_branch_label_status_and_time_page_by_page() {
    use worker_sdk::{AgentClient, Fork, NewRun, RunQuery};
    let kernel = Kernel::start();
    let agent = AgentClient::connect(kernel.url()).await.unwrap();
    let started = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let shop = agent
        .create_run(NewRun::new("shop", json!({})).label("team", "billing"))
        .await
        .unwrap();
    shop.complete(json!(null)).await.unwrap();
    let idle = agent.create_run(NewRun::new("idle", json!({}))).await.unwrap();
    let branch = agent.fork_run(Fork::of(shop.id())).await.unwrap();
    let ids = |page: worker_sdk::RunPage| page.runs.into_iter().map(|run| run.id).collect::<Vec<_>>();
    let listed = |query: RunQuery| {
        let agent = &agent;
        async move { ids(agent.list_runs(query).await.unwrap()) }
    };
    assert_eq!(listed(RunQuery::new().branch_of(shop.id())).await, [branch.id()]);
    let billing = RunQuery::new()
        .label("team", "billing")
        .status(pb::RunStatus::Completed);
    assert_eq!(listed(billing).await, [shop.id()]);
    assert_eq!(listed(RunQuery::new().agent("idle")).await, [idle.id()]);
    assert!(listed(RunQuery::new().created_before(started)).await.is_empty());
    let everything = listed(RunQuery::new().created_after(started)).await;
    assert_eq!(everything, [branch.id(), idle.id(), shop.id()], "newest first");
    let first = agent.list_runs(RunQuery::new().page_size(2)).await.unwrap();
    assert!(!first.next_page_token.is_empty());
    let token = first.next_page_token.clone();
    assert_eq!(ids(first), everything[..2]);
    let rest = agent
        .list_runs(RunQuery::new().page_size(2).page_token(token))
        .await
        .unwrap();
    assert!(rest.next_page_token.is_empty());
    assert_eq!(ids(rest), everything[2..]);
    let refused = agent
        .list_runs(RunQuery::new().branch_of("not-a-run"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("forked_from_run_id"), "{refused}");
}
