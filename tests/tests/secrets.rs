//! Secret fields with real processes: the fault worker's `login` declares its `password` argument
//! and the `token` it returns secret. A planted password reaches the tool, and nothing the kernel
//! keeps or shows holds it: not the database (SQLite's files, or every PostgreSQL table), not the
//! API's runs and events, not `kernelctl runs show`, not the console's page, not the spans it
//! exports. A resubmitted call is still replayed by its keyed hash, and a sealed argument survives
//! a kernel SIGKILL before its dispatch.

use e2e::{Kernel, KernelOptions, call, submit};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::traces::Collector;

/// The password planted in every test: "hunter2" must appear nowhere the kernel writes or shows.
const PLANTED: &str = "hunter2-QZ7xK";
const SECRET_TEXT: &str = "hunter2";

fn login(password: &str) -> pb::ToolCall {
    call("login", json!({"user": "ada", "password": password}))
}

/// A kernel keeping its secret key in `keys`, with `args` besides.
fn kernel_with_key(keys: &tempfile::TempDir, args: &[&str]) -> Kernel {
    let key = |name: &str| keys.path().join(name).display().to_string();
    let mut all = vec![
        "--secret-key".to_owned(),
        key("secret.key"),
        "--receipt-key".to_owned(),
        key("receipt.key"),
    ];
    all.extend(args.iter().map(|arg| (*arg).to_owned()));
    Kernel::start_with(KernelOptions {
        args: all,
        ..KernelOptions::default()
    })
}

fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains(SECRET_TEXT), "{what} holds the secret:\n{text}");
}

/// What the tool returned, as the record keeps it.
fn returned(result: &pb::CallResult) -> Value {
    assert_eq!(result.outcome, pb::CallOutcome::Ok as i32, "{result:?}");
    serde_json::from_str(&result.content).unwrap()
}

/// The body of `GET path` from the kernel's HTTP listener at `addr`.
async fn http_get(addr: &str, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the console");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
}

/// Everything the kernel's database holds, as text: SQLite's file with its WAL, or every row of
/// every PostgreSQL table.
async fn database_text(kernel: &Kernel) -> String {
    match kernel.options.db.as_deref().filter(|db| db.starts_with("postgres")) {
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let tables = client
                .query(
                    "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()",
                    &[],
                )
                .await
                .unwrap();
            let mut text = String::new();
            for table in tables {
                let name: String = table.get(0);
                for row in client
                    .query(&format!("SELECT t::text FROM {name} t"), &[])
                    .await
                    .unwrap()
                {
                    text.push_str(&row.get::<_, String>(0));
                    text.push('\n');
                }
            }
            assert!(text.contains("login"), "the dump holds the calls");
            text
        }
        None => {
            let db = kernel.db_path();
            let mut bytes = Vec::new();
            for suffix in ["", "-wal", "-shm"] {
                let mut path = db.clone().into_os_string();
                path.push(suffix);
                bytes.extend(std::fs::read(path).unwrap_or_default());
            }
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }
}

#[tokio::test]
async fn a_secret_reaches_its_tool_and_nothing_the_kernel_keeps_shows_or_exports_holds_it() {
    let (collector, endpoint) = Collector::start().await;
    let keys = tempfile::tempdir().unwrap();
    let kernel = kernel_with_key(&keys, &["--otlp-endpoint", &endpoint, "--http-listen", "127.0.0.1:0"]);
    let listening = kernel.process.log.wait_for("http listening");
    let http = listening
        .split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .expect("the listener's address")
        .to_owned();
    let _worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("login", 1).await;
    let run = kernel.create_run("signing-in").await;

    let done = submit(&kernel, &run, 0, vec![login(PLANTED)]).await.unwrap();
    let output = returned(&done.results[0]);
    assert_eq!(
        output["password_length"],
        PLANTED.len(),
        "the tool got the value: {output}"
    );
    assert_eq!(output["user"], "ada");
    let token = output["token"]["$secret"].as_str().expect("the token's keyed hash");
    assert!(token.starts_with("hmac-sha256:"), "{token}");
    assert_hidden("the call's result", &done.results[0].content);

    // The same call again is a replay (its keyed hash matches); another password is refused.
    let again = submit(&kernel, &run, 0, vec![login(PLANTED)]).await.unwrap();
    assert!(again.results[0].replayed, "{:?}", again.results[0]);
    let other = submit(&kernel, &run, 0, vec![login("other-QZ")]).await.unwrap();
    assert_eq!(other.results[0].outcome, pb::CallOutcome::ReplayInputChanged as i32);
    assert_eq!(
        kernel.executions(&kernel_proto::canonical::idempotency_key(&run, "t0/p0")),
        1
    );
    // A call that fails validation quotes no secret either.
    let bad = call("login", json!({"user": "ada", "password": 4_111_007}));
    let refused = submit(&kernel, &run, 1, vec![bad]).await.unwrap();
    assert_eq!(refused.results[0].outcome, pb::CallOutcome::InvalidArguments as i32);
    assert!(
        !refused.results[0].content.contains("4111007"),
        "{}",
        refused.results[0].content
    );
    kernel.complete(&run).await;

    let got = kernel.get(&run).await;
    let step = got.steps.iter().find(|s| s.step_key == "t0/p0").unwrap();
    assert!(step.arguments_json.contains("$secret"), "{}", step.arguments_json);
    assert_hidden("GetRun", &format!("{got:?}"));
    assert_hidden("the run's events", &format!("{:?}", kernel.events(&run).await));
    assert_hidden(
        "kernelctl runs show",
        &kernel.kernelctl_ok(&["--json", "runs", "show", &run]),
    );
    assert_hidden("the receipts", &kernel.kernelctl_ok(&["runs", "receipts", &run]));
    assert_hidden(
        "the console's run page",
        &http_get(&http, &format!("/runs/{run}")).await,
    );
    let spans = collector
        .until("the run's spans", |spans| {
            spans.iter().any(|s| s.name.ends_with(" login")) && spans.iter().any(|s| s.name.starts_with("run "))
        })
        .await;
    assert_hidden("the exported spans", &format!("{spans:?}"));
    assert_hidden("the database", &database_text(&kernel).await);
    assert_hidden("the kernel's log", &kernel.process.log.text());
    let tools = kernel.kernelctl_ok(&["tools", "list"]);
    let line = tools.lines().find(|l| l.contains("login")).expect("login is listed");
    assert!(line.contains("secret password+token"), "{tools}");
}

#[tokio::test]
async fn a_sealed_secret_survives_a_kernel_sigkill_before_its_dispatch() {
    let keys = tempfile::tempdir().unwrap();
    let mut kernel = kernel_with_key(&keys, &[]);
    // The tool is registered, and its worker gone: the call is recorded, its password sealed,
    // and waits for a worker.
    let worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("login", 1).await;
    drop(worker);
    e2e::eventually("the worker to leave", || async {
        let status = kernel.status().await;
        if status.worker_sessions == 0 {
            Ok(())
        } else {
            Err(status)
        }
    })
    .await;
    let run = kernel.create_run("signing-in").await;
    let turn = e2e::submit_in_background(&kernel, &run, 0, vec![login(PLANTED)]);
    e2e::eventually("the call to be recorded", || async {
        let got = kernel.get(&run).await;
        if got.steps.iter().any(|s| s.step_key == "t0/p0") {
            Ok(())
        } else {
            Err(got.steps)
        }
    })
    .await;
    kernel.restart();
    let _worker = kernel.fault_worker("after-restart");
    let done = tokio::time::timeout(std::time::Duration::from_secs(90), turn)
        .await
        .expect("the turn ends")
        .unwrap();
    let output = returned(&done.results[0]);
    assert_eq!(
        output["password_length"],
        PLANTED.len(),
        "unsealed after the restart: {output}"
    );
    assert_hidden("the database", &database_text(&kernel).await);
}

#[tokio::test]
async fn without_a_secret_key_a_call_carrying_a_secret_is_refused_where_none_can_be_kept() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("tools");
    kernel.wait_for_workers("login", 1).await;
    let run = kernel.create_run("signing-in").await;
    if !kernel.on_postgres() {
        // SQLite keeps its key beside its file, made at the first start.
        let mut key = kernel.db_path().into_os_string();
        key.push(".secret-key");
        assert!(std::path::Path::new(&key).exists(), "{key:?}");
        let done = submit(&kernel, &run, 0, vec![login(PLANTED)]).await.unwrap();
        assert_eq!(returned(&done.results[0])["password_length"], PLANTED.len());
        return;
    }
    // Replicas on PostgreSQL share a key only when given one: without it, nothing is written.
    let refused = submit(&kernel, &run, 0, vec![login(PLANTED)]).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--secret-key"), "{}", refused.message());
    assert!(refused.message().contains("password"), "{}", refused.message());
    assert!(kernel.get(&run).await.steps.is_empty());
    // A call without the secret value runs.
    let without = call("login", json!({"user": "ada", "password": null}));
    let done = submit(&kernel, &run, 0, vec![without]).await.unwrap();
    assert_ne!(
        done.results[0].outcome,
        pb::CallOutcome::Ok as i32,
        "a null password is no string"
    );
}
