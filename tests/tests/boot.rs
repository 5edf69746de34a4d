//! What a kernel does at start: it claims its database before touching it, refuses what it
//! could only fail on later with what to do about it, and recovers what was in flight without
//! raising false alarms.

use std::process::Command;

use e2e::{
    Kernel, KernelOptions, Process, WAIT, Watch, binary, call, check_log, submit, submit_until_done, wait_ledger,
};
use kernel_proto::v1 as pb;
use serde_json::json;

/// Waits for a refused kernel to exit and returns its exit code and what it logged.
fn refused(mut process: Process) -> (i32, String) {
    let status = process
        .wait_exit(WAIT)
        .unwrap_or_else(|| panic!("the kernel did not stop; it logged:\n{}", process.log.text()));
    // stderr is read by another thread; the exit comes first.
    process.log.wait_for("kernel stopped");
    (status.code().unwrap_or(-1), process.log.text())
}

/// The easy mistake: `cargo run -p kernel` again in another terminal, same database, same port.
/// The second kernel must not run boot recovery against the live kernel's calls: it refuses
/// before it reads or writes anything, naming the file and the holder's pid.
#[tokio::test]
async fn a_second_kernel_on_a_served_database_refuses_to_start_and_changes_nothing() {
    let mut kernel = Kernel::start_on_sqlite();
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let run = kernel.create_run("one-kernel").await;
    let mut watch = Watch::open(&kernel, &run, 1, false).await;
    let turn = submit(&kernel, &run, 0, vec![call("sleepy", json!({"hold_ms": 1500}))]);
    let intruders = async {
        let start = watch.event("tool:start", |_| true).await;
        let key = start["idempotency_key"].as_str().unwrap().to_owned();
        wait_ledger(&kernel, "the call running", |l| l.iter().any(|l| l.key == key)).await;
        let before = kernel.events(&run).await.len();
        let holder = format!(
            "kernel.db is in use by another kernel (pid {})",
            kernel.process.child.id()
        );
        // Same port, then a port of its own: the database is claimed before the port is tried.
        for listen in [kernel.addr.to_string(), "127.0.0.1:0".to_owned()] {
            let (code, log) = refused(kernel.another_on_same_db(&listen));
            assert_eq!(code, 1, "{log}");
            assert!(log.contains(&holder), "listening on {listen}: {log}");
            assert!(!log.contains("listening"), "{log}");
        }
        assert_eq!(
            kernel.events(&run).await.len(),
            before,
            "the refused kernels wrote nothing"
        );
        key
    };
    let (outcome, key) = tokio::join!(turn, intruders);
    let result = &outcome.unwrap().results[0];
    assert_eq!(result.status, pb::CallStatus::Ok as i32, "{result:?}");
    assert_eq!(
        result.attempts, 1,
        "the live kernel's call was never taken for a leftover"
    );
    assert_eq!(kernel.executions(&key), 1);
    let events = kernel.events(&run).await;
    assert!(
        !events.iter().any(|e| e.r#type == "tool:lease_lost"),
        "{:?}",
        events.iter().map(|e| &e.r#type).collect::<Vec<_>>()
    );
    check_log(&events, true);

    // The lock dies with its holder, SIGKILL included.
    kernel.kill9();
    let next = kernel.another_on_same_db("127.0.0.1:0");
    next.log.wait_for("listening");
}

/// A port another process holds is refused before the database is created, with the way out.
#[tokio::test]
async fn a_port_in_use_is_refused_before_the_database_is_created() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fresh.db");
    let mut command = Command::new(binary("kernel"));
    command.arg("--listen").arg(taken.to_string()).arg("--db").arg(&db);
    let (code, log) = refused(Process::start(command, "kernel"));
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains(&format!("cannot listen on {taken}")) && log.contains("another kernel? use --listen 127.0.0.1:0"),
        "{log}"
    );
    assert!(!db.exists(), "no database was created");
}

/// A database path that is a directory, or whose folder does not exist, is refused up front.
#[tokio::test]
async fn a_database_path_the_kernel_cannot_use_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-folder").join("kernel.db");
    for (db, expected) in [
        (dir.path().to_path_buf(), "is a directory"),
        (missing, "does not exist; create it first"),
    ] {
        let mut command = Command::new(binary("kernel"));
        command.arg("--listen").arg("127.0.0.1:0").arg("--db").arg(&db);
        let (code, log) = refused(Process::start(command, "kernel"));
        assert_eq!(code, 1, "{log}");
        assert!(log.contains("--db: ") && log.contains(expected), "{log}");
    }
    assert!(!dir.path().join("no-such-folder").exists());
}

/// Boot recovery runs before the in-flight scan starts: a restart with calls in flight raises no
/// "lost track" alarm, and the scans that follow find nothing lost.
#[tokio::test]
async fn a_restart_with_calls_in_flight_raises_no_false_alarm() {
    let mut kernel = Kernel::start_with(KernelOptions {
        args: vec!["--scan-interval-ms".into(), "100".into()],
        ..KernelOptions::default()
    });
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    let run = kernel.create_run("restart").await;
    let calls: Vec<pb::ToolCall> = (0..3).map(|i| call("sleepy", json!({"hold_ms": 300 + i}))).collect();
    let agent = tokio::spawn({
        let (url, run) = (kernel.url(), run.clone());
        async move { submit_until_done(&url, &run, 0, calls).await }
    });
    wait_ledger(&kernel, "a call running", |l| l.iter().any(|l| l.what == "start")).await;
    kernel.restart();
    // On PostgreSQL the restarted kernel is a new replica: the calls its last run held are taken
    // over once that replica's row has aged past the lease TTL.
    let recovered = if kernel.on_postgres() {
        "took over a dead replica's leases"
    } else {
        "recovered calls in flight at the last stop"
    };
    kernel.process.log.wait_for(recovered);

    let outcome = agent.await.unwrap();
    assert!(
        outcome.results.iter().all(|r| r.status == pb::CallStatus::Ok as i32),
        "{:?}",
        outcome.results
    );
    // Several scans after recovery, each finding nothing.
    let status = e2e::eventually("five in-flight scans", || async {
        let status = kernel.status().await;
        if status.in_flight_scans >= 5 {
            Ok(status)
        } else {
            Err(status)
        }
    })
    .await;
    assert_eq!(status.lost_calls_found, 0, "{status:?}");
    let log = kernel.process.log.text();
    assert!(!log.contains("lost track"), "{log}");
    check_log(&kernel.events(&run).await, false);
}
