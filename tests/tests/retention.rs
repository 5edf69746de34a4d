//! Retention end to end: `kernelctl runs delete` and `runs prune` remove finished runs whole and
//! refuse runs in flight; `--retain-finished` does it on its own.

use e2e::{Kernel, KernelOptions, call, submit};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

async fn finished_run(kernel: &Kernel, agent: &str) -> String {
    let run = kernel.create_run(agent).await;
    submit(kernel, &run, 0, vec![call("add", json!({"a": 1, "b": 2}))])
        .await
        .unwrap();
    kernel
        .runs()
        .await
        .complete_run(pb::CompleteRunRequest {
            run_id: run.clone(),
            output_json: "3".into(),
        })
        .await
        .unwrap();
    run
}

async fn exists(kernel: &Kernel, run: &str) -> bool {
    match kernel
        .runs()
        .await
        .get_run(pb::GetRunRequest { run_id: run.into() })
        .await
    {
        Ok(_) => true,
        Err(status) if status.code() == tonic::Code::NotFound => false,
        Err(status) => panic!("{status:?}"),
    }
}

#[tokio::test]
async fn runs_delete_and_prune_remove_finished_runs_and_refuse_runs_in_flight() {
    let kernel = Kernel::start();
    let _worker = kernel.worker("w1");
    let done = finished_run(&kernel, "done").await;
    let open = kernel.create_run("open").await;
    submit(&kernel, &open, 0, vec![call("add", json!({"a": 1, "b": 1}))])
        .await
        .unwrap();

    let refused = kernel.kernelctl(&["runs", "delete", &open]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("only a finished run can be deleted"), "{stderr}");
    assert!(exists(&kernel, &open).await);

    let deleted = kernel.kernelctl(&["--json", "runs", "delete", &done]);
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    let counts: Value = serde_json::from_slice(&deleted.stdout).unwrap();
    assert_eq!(counts["runs"], 1);
    assert_eq!(counts["steps"], 1);
    assert!(counts["events"].as_u64().unwrap() >= 5, "{counts}");
    assert!(!exists(&kernel, &done).await);

    let older = finished_run(&kernel, "older").await;
    let kept = kernel.kernelctl(&["runs", "prune", "--finished-before", "1h"]);
    assert!(kept.status.success());
    assert_eq!(
        String::from_utf8_lossy(&kept.stdout).trim(),
        "deleted 0 runs (0 events, 0 steps, 0 approvals, 0 cache entries)"
    );
    assert!(exists(&kernel, &older).await, "it finished less than an hour ago");
    let pruned = kernel.kernelctl(&["runs", "prune", "--finished-before", "0s"]);
    assert!(
        String::from_utf8_lossy(&pruned.stdout).starts_with("deleted 1 run ("),
        "{pruned:?}"
    );
    assert!(!exists(&kernel, &older).await);
    assert!(exists(&kernel, &open).await, "a run in flight is never pruned");

    let usage = kernel.kernelctl(&["runs", "prune", "--finished-before", "soon"]);
    assert_eq!(usage.status.code(), Some(2), "a bad duration is a usage error");
}

#[tokio::test]
async fn retain_finished_deletes_runs_past_the_retention_by_itself() {
    let kernel = Kernel::start_with(KernelOptions {
        args: vec!["--retain-finished".into(), "1s".into()],
        ..KernelOptions::default()
    });
    kernel
        .process
        .log
        .wait_for("finished runs are deleted past the retention");
    let _worker = kernel.worker("w1");
    let run = finished_run(&kernel, "short-lived").await;
    // Checked twice per retention: the run goes within about a second and a half.
    kernel.process.log.wait_for("finished runs past the retention deleted");
    assert!(!exists(&kernel, &run).await);
}
