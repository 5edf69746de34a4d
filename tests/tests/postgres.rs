//! The PostgreSQL store, against a real server: `kernel migrate` applies the schema once, under
//! its lock, however many replicas migrate at once; a kernel serves from it and keeps what it
//! committed across a SIGKILL. Several replicas on one database: `replicas.rs`.

use std::process::{Command, Output};

use e2e::postgres::Postgres;
use e2e::{Kernel, KernelOptions, binary, call, check_log, submit};
use serde_json::json;

/// The PostgreSQL schema's version this build writes: one per entry of `MIGRATIONS` in
/// `kernel/src/store/postgres/schema.rs`.
const SCHEMA: i64 = 14;

fn kernel(args: &[&str]) -> Output {
    Command::new(binary("kernel")).args(args).output().expect("kernel runs")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn migrate_applies_the_schema_once_and_again_finds_nothing_to_do() {
    let Some(pg) = Postgres::database("migrate_applies_the_schema_once") else {
        return;
    };
    let first = kernel(&["migrate", "--db", &pg.url]);
    assert!(first.status.success(), "{}", text(&first));
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(
        stdout.contains(&format!("schema at version {SCHEMA} (was 0)")),
        "{stdout}"
    );

    let client = pg.client().await;
    let versions: Vec<i64> = client
        .query("SELECT version FROM kernel_schema ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, (1..=SCHEMA).collect::<Vec<i64>>());
    for table in [
        "runs",
        "events",
        "steps",
        "approvals",
        "tools",
        "agents",
        "places",
        "resource_locks",
        "replicas",
    ] {
        let found: i64 = client
            .query_one(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = $1",
                &[&table],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(found, 1, "table {table}");
    }

    let again = kernel(&["migrate", "--db", &pg.url]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains(&format!("schema at version {SCHEMA} (was {SCHEMA})")),
        "{}",
        text(&again)
    );
}

#[tokio::test]
async fn replicas_migrating_at_once_apply_each_migration_once() {
    let Some(pg) = Postgres::database("replicas_migrating_at_once") else {
        return;
    };
    // Four replicas' migrations, all started before any is waited for.
    let racing: Vec<std::process::Child> = (0..4)
        .map(|_| {
            Command::new(binary("kernel"))
                .args(["--db", &pg.url, "migrate"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("kernel starts")
        })
        .collect();
    for child in racing {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", text(&output));
    }
    let client = pg.client().await;
    let rows: i64 = client
        .query_one("SELECT count(*) FROM kernel_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, SCHEMA, "one row per migration, however many replicas raced");
}

#[tokio::test]
async fn a_kernel_on_postgresql_runs_calls_and_hosted_runs_and_keeps_them_across_a_sigkill() {
    let Some(pg) = Postgres::database("a_kernel_on_postgresql_runs_calls") else {
        return;
    };
    let mut kernel = Kernel::start_with(KernelOptions {
        db: Some(pg.url.clone()),
        ..KernelOptions::default()
    });
    let _worker = kernel.worker("pg-worker");
    let run = kernel.create_run("pg-agent").await;
    let turn0 = || {
        vec![
            call("add", json!({"a": 2, "b": 3})),
            call("echo", json!({"value": "hi"})),
        ]
    };
    let outcome = submit(&kernel, &run, 0, turn0()).await.unwrap();
    let outputs: Vec<&str> = outcome.results.iter().map(|r| r.output_json.as_str()).collect();
    assert_eq!(outputs, ["5", "\"hi\""]);
    check_log(&kernel.events(&run).await, true);

    // SIGKILL: what was committed is there when the kernel comes back on the same database.
    kernel.restart();
    let again = submit(&kernel, &run, 0, turn0()).await.unwrap();
    assert!(
        again.results.iter().all(|r| r.replayed),
        "the recorded turn replays: {:?}",
        again.results
    );
    let next = submit(&kernel, &run, 1, vec![call("add", json!({"a": 40, "b": 2}))])
        .await
        .unwrap();
    assert_eq!(
        next.results[0].output_json, "42",
        "the worker reconnected and serves the new kernel"
    );
    check_log(&kernel.events(&run).await, true);

    // A hosted run, dispatched to the worker and completed through the same store.
    let hosted = kernel
        .start_hosted("note_taker", json!({"note": "from postgres"}))
        .await;
    let done = kernel.finished(&hosted).await;
    assert_eq!(done.status, kernel_proto::v1::RunStatus::Completed as i32, "{done:?}");
    assert_eq!(done.output_json, r#"{"notes":["from postgres"]}"#);

    // The rows are PostgreSQL's.
    let client = pg.client().await;
    let steps: i64 = client
        .query_one("SELECT count(*) FROM steps WHERE run_id = $1", &[&run])
        .await
        .unwrap()
        .get(0);
    assert_eq!(steps, 3);
}

#[test]
fn an_unreachable_database_fails_the_migration_naming_it_without_its_password() {
    // Nothing listens on port 1.
    let output = kernel(&["migrate", "--db", "postgres://kernel:s3cret@127.0.0.1:1/k"]);
    assert!(!output.status.success());
    let said = text(&output);
    assert!(said.contains("cannot connect to PostgreSQL"), "{said}");
    assert!(
        said.contains("postgres://kernel:***@127.0.0.1:1/k") && !said.contains("s3cret"),
        "{said}"
    );
}

#[test]
fn migrate_prepares_a_sqlite_file_and_refuses_one_a_kernel_serves() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kernel.db");
    let db = db.to_str().unwrap();
    let first = kernel(&["migrate", "--db", db]);
    assert!(
        String::from_utf8_lossy(&first.stdout).contains("schema at version"),
        "{}",
        text(&first)
    );
    let again = kernel(&["migrate", "--db", &format!("sqlite:{db}")]);
    assert!(again.status.success(), "{}", text(&again));

    let mut serving = e2e::Kernel::start_on_sqlite();
    let busy = serving.dir.path().join("kernel.db");
    let refused = kernel(&["migrate", "--db", busy.to_str().unwrap()]);
    assert!(
        !refused.status.success(),
        "a file a kernel serves is not migrated under it"
    );
    assert!(
        text(&refused).contains("in use by another kernel"),
        "{}",
        text(&refused)
    );
    serving.kill9();
}

#[test]
fn unknown_database_schemes_are_refused_at_the_flag() {
    let output = kernel(&["migrate", "--db", "mysql://h/db"]);
    assert_eq!(output.status.code(), Some(2), "a usage error");
    assert!(
        text(&output).contains("unknown database scheme 'mysql://'"),
        "{}",
        text(&output)
    );
}

/// Columns only the SQLite schema has, by design (see `kernel/src/store/chain.rs`).
const SQLITE_ONLY: [(&str, &str); 3] = [("events", "id"), ("events", "prev"), ("runs", "last_event")];

/// Every table and column of the SQLite schema, with its type and nullability, as PostgreSQL
/// spells them: a migration added to one store and not the other fails here.
#[tokio::test]
async fn both_stores_have_the_same_tables_columns_types_and_nullability() {
    let Some(pg) = Postgres::database("both_stores_have_the_same_tables") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kernel.db");
    for db in [file.to_str().unwrap(), pg.url.as_str()] {
        let output = kernel(&["migrate", "--db", db]);
        assert!(output.status.success(), "{}", text(&output));
    }

    let sqlite = rusqlite::Connection::open(&file).unwrap();
    let mut expected = std::collections::BTreeSet::new();
    let tables: Vec<String> = sqlite
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for table in tables {
        let mut columns = sqlite.prepare(&format!("PRAGMA table_info({table})")).unwrap();
        let rows = columns
            .query_map([], |row| {
                let kind: String = row.get(2)?;
                let not_null: bool = row.get(3)?;
                let primary: i64 = row.get(5)?;
                Ok((row.get::<_, String>(1)?, kind, not_null || primary > 0))
            })
            .unwrap();
        for row in rows {
            let (column, kind, not_null) = row.unwrap();
            // The links of a run's events (the row's number, its run's event before it, the run's
            // last) are SQLite's own: PostgreSQL finds a run's events by its (run, seq) key.
            if SQLITE_ONLY.contains(&(table.as_str(), column.as_str())) {
                continue;
            }
            let kind = match kind.as_str() {
                "INTEGER" => "bigint",
                "REAL" => "double precision",
                "TEXT" => "text",
                other => panic!("{table}.{column}: SQLite type {other} has no PostgreSQL mapping here"),
            };
            expected.insert((table.clone(), column, kind.to_owned(), not_null));
        }
    }

    assert!(
        expected.len() > 100,
        "the SQLite schema was read: {} columns",
        expected.len()
    );

    let client = pg.client().await;
    // The migrations table and the replicas' link key are PostgreSQL's own: only there do several
    // kernels share one database.
    let found: std::collections::BTreeSet<(String, String, String, bool)> = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable = 'NO' \
             FROM information_schema.columns WHERE table_schema = 'public' \
             AND table_name NOT IN ('kernel_schema', 'cluster')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect();
    let missing: Vec<_> = expected.difference(&found).collect();
    let extra: Vec<_> = found.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "only in SQLite: {missing:?}\nonly in PostgreSQL: {extra:?}"
    );
}

/// PostgreSQL restarted under a serving kernel: writes are refused as UNAVAILABLE while it is
/// gone, the writer reconnects (serving lock included) when it is back, and calls go on.
#[tokio::test]
async fn a_postgresql_restart_under_a_kernel_is_ridden_out() {
    let Some(mut pg) = Postgres::start("a_postgresql_restart_under_a_kernel") else {
        return;
    };
    let kernel = Kernel::start_with(KernelOptions {
        db: Some(pg.url.clone()),
        ..KernelOptions::default()
    });
    let _worker = kernel.worker("pg-worker");
    let run = kernel.create_run("pg-agent").await;
    let before = submit(&kernel, &run, 0, vec![call("add", json!({"a": 1, "b": 1}))])
        .await
        .unwrap();
    assert_eq!(before.results[0].output_json, "2");

    pg.stop();
    let refused = submit(&kernel, &run, 1, vec![call("add", json!({"a": 2, "b": 2}))]).await;
    let status = refused.expect_err("no database, no turn");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    pg.restart();
    let after = submit(&kernel, &run, 1, vec![call("add", json!({"a": 2, "b": 2}))])
        .await
        .unwrap();
    assert_eq!(after.results[0].output_json, "4", "{:?}", after.results);
    kernel.process.log.wait_for("store writer reconnected to postgresql");
    check_log(&kernel.events(&run).await, true);
}
