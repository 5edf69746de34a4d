//! Resources end to end: calls on one resource instance never run at once across runs while
//! other instances do, the lock shows in `kernelctl status` and is released on every exit, runs
//! show a call's resources, and policy matches on them.

use e2e::{Kernel, KernelOptions, LedgerLine, call, submit, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::json;

fn push(repo: &str, hold_ms: u64) -> pb::ToolCall {
    call("push", json!({ "repo": repo, "hold_ms": hold_ms }))
}

/// The `lock:`/`unlock:` lines of one repository, in ledger order.
fn lines_of<'a>(ledger: &'a [LedgerLine], repo: &str) -> Vec<&'a str> {
    ledger
        .iter()
        .filter(|l| l.what == format!("lock:{repo}") || l.what == format!("unlock:{repo}"))
        .map(|l| l.what.as_str())
        .collect()
}

#[tokio::test]
async fn calls_on_one_resource_instance_never_run_at_once_while_other_instances_do() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("w1");
    let first = kernel.create_run("pusher").await;
    let second = kernel.create_run("pusher").await;
    let other = kernel.create_run("pusher").await;
    let pushing = |run: &str, repo: &str, hold_ms: u64| {
        let (url, run, call) = (kernel.url(), run.to_owned(), push(repo, hold_ms));
        tokio::spawn(async move { e2e::submit_until_done(&url, &run, 0, vec![call]).await })
    };

    let release = kernel.ledger_file().with_extension("release");
    let holding = {
        let (url, run) = (kernel.url(), first.clone());
        let hold_ms = e2e::WAIT.as_millis() as u64;
        let until = release.to_string_lossy();
        let call = call("push", json!({ "repo": "acme", "hold_ms": hold_ms, "until": until }));
        tokio::spawn(async move { e2e::submit_until_done(&url, &run, 0, vec![call]).await })
    };
    wait_ledger(&kernel, "the first push", |l| !lines_of(l, "acme").is_empty()).await;
    let waiting = pushing(&second, "acme", 10);
    let status = status_until(&kernel, |s| s.resource_locks.iter().any(|l| l.waiting == 1)).await;
    let locks: Vec<(&str, &str, &str, u32)> = status
        .resource_locks
        .iter()
        .map(|l| (l.resource.as_str(), l.run_id.as_str(), l.tool.as_str(), l.waiting))
        .collect();
    assert_eq!(
        locks,
        [("repo:acme", first.as_str(), "push", 1)],
        "only the instance is a lock"
    );
    let shown = kernel.kernelctl(&["status"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("resource locks:    1"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("repo:acme"))
        .expect("a row for the lock");
    assert!(row.contains(&first) && row.contains("push"), "{row}");

    // Another instance is not held back: it runs and ends while the first push still holds acme.
    let elsewhere = submit(&kernel, &other, 0, vec![push("other", 10)]).await.unwrap();
    assert_eq!(elsewhere.results[0].content, "pushed to other");
    let ledger = kernel.ledger();
    assert_eq!(lines_of(&ledger, "acme"), ["lock:acme"], "{ledger:?}");
    std::fs::write(&release, b"").unwrap();

    assert_eq!(waiting.await.unwrap().results[0].content, "pushed to acme");
    assert_eq!(holding.await.unwrap().results[0].content, "pushed to acme");
    let ledger = kernel.ledger();
    assert_eq!(
        lines_of(&ledger, "acme"),
        ["lock:acme", "unlock:acme", "lock:acme", "unlock:acme"],
        "one push to acme at a time: {ledger:?}"
    );
    assert!(
        kernel.status().await.resource_locks.is_empty(),
        "every lock is released"
    );
    let step = &kernel.get(&second).await.steps[0];
    assert_eq!(step.resources, ["repo:acme", "workspace"]);
    let shown = kernel.kernelctl(&["runs", "show", &second]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("resources:") && text.contains("repo:acme, workspace"),
        "{text}"
    );
}

/// Polls the kernel's status until `found` holds.
async fn status_until(kernel: &Kernel, found: impl Fn(&pb::GetStatusResponse) -> bool) -> pb::GetStatusResponse {
    e2e::eventually("the status to show it", || async {
        let status = kernel.status().await;
        if found(&status) { Ok(status) } else { Err(status) }
    })
    .await
}

#[tokio::test]
async fn a_lock_whose_worker_dies_is_released_and_the_retry_takes_it_again() {
    let kernel = Kernel::start();
    let mut doomed = kernel.fault_worker("doomed");
    let run = kernel.create_run("pusher").await;
    let turn = tokio::spawn({
        let url = kernel.url();
        let run = run.clone();
        async move { e2e::submit_until_done(&url, &run, 0, vec![push("acme", 300)]).await }
    });
    wait_ledger(&kernel, "the push", |l| !lines_of(l, "acme").is_empty()).await;
    assert_eq!(kernel.status().await.resource_locks[0].attempt, 1);
    doomed.kill9();
    let _rescue = kernel.fault_worker("rescue");
    let outcome = turn.await.unwrap();
    assert_eq!(outcome.results[0].content, "pushed to acme");
    let step = &kernel.get(&run).await.steps[0];
    assert_eq!((step.attempts, step.lease_losses), (2, 1));
    assert!(kernel.status().await.resource_locks.is_empty());
}

#[tokio::test]
async fn policy_rules_match_a_call_by_its_resources() {
    let kernel = Kernel::start_with(KernelOptions {
        policy: Some(
            r#"
rules:
  - id: prod-repos-frozen
    match: { resources: ["repo:prod-*"] }
    decision: deny
    reason: "production repositories are frozen"
  - id: no-workspace-for-interns
    match: { resources: [workspace], agents: ["intern-*"] }
    decision: deny
    reason: "interns do not write the workspace"
"#
            .into(),
        ),
        ..Default::default()
    });
    let _worker = kernel.fault_worker("w1");
    let run = kernel.create_run("pusher").await;
    let outcome = submit(&kernel, &run, 0, vec![push("prod-api", 10), push("dev-api", 10)])
        .await
        .unwrap();
    assert_eq!(
        outcome.results[0].content,
        "push not allowed. reason: production repositories are frozen"
    );
    assert_eq!(outcome.results[1].content, "pushed to dev-api");
    let intern = kernel.create_run("intern-7").await;
    let outcome = submit(&kernel, &intern, 0, vec![push("dev-api", 10)]).await.unwrap();
    assert_eq!(
        outcome.results[0].content,
        "push not allowed. reason: interns do not write the workspace"
    );
    assert_eq!(
        kernel.get(&intern).await.steps[0].decided_by,
        "rule:no-workspace-for-interns"
    );
}
