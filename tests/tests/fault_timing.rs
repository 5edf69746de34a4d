//! Fault timing: how long recovery takes when real processes are killed, how fast the kernel
//! starts on a large log, and how much memory it holds for idle workers and for many runs.
//!
//! Every test is `#[ignore]`d: run them by name, one at a time (they load the machine), and read
//! the table each prints. They assert what must hold for the figure to mean anything (every call
//! came back, the log has its million events), never how long something took:
//!
//!     cargo build --workspace --bins --examples
//!     cargo test -p e2e --test e2e fault_timing:: -- --ignored --nocapture --test-threads 1
//!
//! Targets (issue 5): a killed worker's call redispatched ≤ 1 s after the kill; after a kernel
//! kill and restart with 1,000 in flight, all offered again ≤ lease TTL + 2 s; start-up on
//! 1,000,000 events ≤ 1 s; ≤ 100 KiB of kernel memory per idle worker session.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::{Kernel, KernelOptions, Process, Watch, call, payload};
use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_client::RunServiceClient;
use kernel_proto::v1::tool_call_service_client::ToolCallServiceClient;
use kernel_proto::v1::worker_service_client::WorkerServiceClient;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Long enough that no held call finishes during a measurement.
const HOLD_MS: u64 = 600_000;

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

/// Prints a titled two-column table to stdout.
fn print_table(title: &str, rows: &[(String, String)]) {
    let width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    println!("\n{title}");
    println!("{}", "-".repeat(title.chars().count()));
    for (label, value) in rows {
        println!("{label:<width$}  {value}");
    }
    println!();
}

/// Submits a turn and keeps its stream open until the task is dropped or the stream ends;
/// errors are ignored (the kernel may be killed under it).
async fn hold_turn(url: String, run_id: String, turn: u32, calls: Vec<pb::ToolCall>) {
    let Ok(mut client) = ToolCallServiceClient::connect(url).await else {
        return;
    };
    let request = pb::SubmitTurnRequest {
        run_id,
        turn,
        calls,
        offered_tools: Vec::new(),
        max_concurrency: 0,
    };
    if let Ok(response) = client.submit_turn(request).await {
        let mut stream = response.into_inner();
        while let Ok(Some(_)) = stream.message().await {}
    }
}

/// An event's commit time as the kernel stamped it.
fn event_time(event: &pb::Event) -> SystemTime {
    let at = event.at.as_ref().expect("event time");
    UNIX_EPOCH + Duration::new(at.seconds as u64, at.nanos as u32)
}

fn since(start: SystemTime, then: SystemTime) -> Duration {
    then.duration_since(start).unwrap_or_default()
}

async fn cancel_run(kernel: &Kernel, run_id: &str) {
    let request = pb::CancelRunRequest {
        run_id: run_id.into(),
        reason: "fault timing round over".into(),
    };
    kernel.runs().await.cancel_run(request).await.expect("cancel run");
}

const WORKER_KILL_ROUNDS: usize = 5;

/// SIGKILL the worker running a call; time until the kernel records the lease lost and until the
/// call starts again (attempt 2) on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn worker_kill_to_redispatch() {
    let kernel = Kernel::start_with(KernelOptions {
        default_tool_timeout_ms: HOLD_MS * 2,
        ..KernelOptions::default()
    });
    let mut workers: HashMap<String, Process> = HashMap::new();
    for name in ["w0", "w1"] {
        workers.insert(name.to_owned(), kernel.fault_worker(name));
    }
    let (mut to_lost, mut to_redispatch) = (Vec::new(), Vec::new());
    let mut rows = Vec::new();
    for round in 1..=WORKER_KILL_ROUNDS {
        let run_id = kernel.create_run("fault-timing").await;
        let mut watch = Watch::open(&kernel, &run_id, 1, false).await;
        let agent = tokio::spawn(hold_turn(
            kernel.url(),
            run_id.clone(),
            0,
            vec![call("sleepy", json!({"hold_ms": HOLD_MS}))],
        ));
        let first = watch.event("tool:start", |p| p["attempt"] == 1).await;
        let holder = first["worker"].as_str().expect("worker in tool:start").to_owned();
        let mut victim = workers.remove(&holder).expect("the holder is one of ours");

        let killed_wall = SystemTime::now();
        let killed = Instant::now();
        victim.kill9();
        watch.event("tool:lease_lost", |_| true).await;
        let lost_seen = killed.elapsed();
        let second = watch.event("tool:start", |p| p["attempt"] == 2).await;
        let redispatch_seen = killed.elapsed();
        let lost_at = since(
            killed_wall,
            event_time(
                watch
                    .events
                    .iter()
                    .rev()
                    .find(|e| e.r#type == "tool:lease_lost")
                    .unwrap(),
            ),
        );
        let start_at = since(killed_wall, event_time(watch.events.last().unwrap()));
        assert_ne!(second["worker"], first["worker"], "attempt 2 ran on the other worker");

        to_lost.push(lost_seen);
        to_redispatch.push(redispatch_seen);
        rows.push((
            format!("round {round}"),
            format!(
                "lease lost {} (logged at +{}), attempt 2 started {} (logged at +{})",
                ms(lost_seen),
                ms(lost_at),
                ms(redispatch_seen),
                ms(start_at)
            ),
        ));

        cancel_run(&kernel, &run_id).await;
        agent.abort();
        let name = format!("w{}", round + 1);
        workers.insert(name.clone(), kernel.fault_worker(&name));
    }
    rows.push(("median, kill → lease lost".into(), ms(median(&to_lost))));
    rows.push(("median, kill → attempt 2 started".into(), ms(median(&to_redispatch))));
    rows.push(("target".into(), "≤ 1000 ms".into()));
    print_table(
        "worker SIGKILL → call redispatched (times seen by a watcher; logged = kernel's event time)",
        &rows,
    );
}

const IN_FLIGHT_RUNS: usize = 4;
const CALLS_PER_RUN: usize = 250;

/// With 1,000 calls running on four workers, SIGKILL the kernel and start it again on the same
/// database: time until every call has started again (its next attempt's `tool:start`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn kernel_kill_restart_with_1000_in_flight() {
    let options = KernelOptions {
        default_tool_timeout_ms: HOLD_MS * 2,
        schedule_to_start_timeout_ms: 120_000,
        ..KernelOptions::default()
    };
    let lease_ttl = Duration::from_millis(options.lease_ttl_ms);
    let mut kernel = Kernel::start_with(options);
    let _workers: Vec<Process> = (0..4)
        .map(|i| kernel.fault_worker_with(&format!("f{i}"), &["--max-concurrency", "300"]))
        .collect();
    let total = IN_FLIGHT_RUNS * CALLS_PER_RUN;

    let mut runs = Vec::new();
    let mut agents = Vec::new();
    for _ in 0..IN_FLIGHT_RUNS {
        let run_id = kernel.create_run("fault-timing").await;
        let calls = (0..CALLS_PER_RUN)
            .map(|_| call("sleepy", json!({"hold_ms": HOLD_MS})))
            .collect();
        agents.push(tokio::spawn(hold_turn(kernel.url(), run_id.clone(), 0, calls)));
        runs.push(run_id);
    }
    let filling = Instant::now();
    let mut client = kernel.runs().await;
    loop {
        let mut running = 0;
        for run_id in &runs {
            let steps = client
                .get_run(pb::GetRunRequest { run_id: run_id.clone() })
                .await
                .expect("get run")
                .into_inner()
                .steps;
            running += steps
                .iter()
                .filter(|s| s.status == pb::StepStatus::Running as i32)
                .count();
        }
        if running == total {
            break;
        }
        assert!(
            filling.elapsed() < Duration::from_secs(300),
            "only {running} of {total} calls ever ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fill_time = filling.elapsed();

    let killed_wall = SystemTime::now();
    let killed = Instant::now();
    kernel.restart();
    let listening = killed.elapsed();

    // Every attempt-2 tool:start, by the kernel's clock, read back through watches.
    let mut watchers = JoinSet::new();
    for run_id in &runs {
        let mut watch = Watch::open(&kernel, run_id, 1, false).await;
        watchers.spawn(async move {
            let (mut scanned, mut started, mut first, mut last) = (0, 0, None, None);
            watch
                .until(|w| {
                    for event in &w.events[scanned..] {
                        if event.r#type == "tool:start" && payload(event)["attempt"].as_u64() >= Some(2) {
                            let at = event_time(event);
                            started += 1;
                            first = Some(first.map_or(at, |f: SystemTime| f.min(at)));
                            last = Some(last.map_or(at, |l: SystemTime| l.max(at)));
                        }
                    }
                    scanned = w.events.len();
                    started >= CALLS_PER_RUN
                })
                .await;
            (started, first, last)
        });
    }
    let (mut restarted, mut first, mut last) = (0, None::<SystemTime>, None::<SystemTime>);
    while let Some(done) = watchers.join_next().await {
        let (started, f, l) = done.expect("watcher");
        restarted += started;
        first = [first, f].into_iter().flatten().min();
        last = [last, l].into_iter().flatten().max();
    }
    let all_seen = killed.elapsed();
    assert_eq!(restarted, total, "every call in flight started again");
    for agent in agents {
        agent.abort();
    }

    print_table(
        "kernel SIGKILL + restart with 1,000 calls in flight (4 fault workers × 300 slots)",
        &[
            ("calls in flight at the kill".into(), total.to_string()),
            ("time to get them all running".into(), ms(fill_time)),
            ("kill → restarted kernel listening".into(), ms(listening)),
            (
                "kill → first call started again".into(),
                ms(since(killed_wall, first.expect("first"))),
            ),
            (
                "kill → all 1,000 started again".into(),
                ms(since(killed_wall, last.expect("last"))),
            ),
            ("kill → watcher saw all (upper bound)".into(), ms(all_seen)),
            ("lease TTL".into(), ms(lease_ttl)),
            (
                "target".into(),
                format!("≤ {} (lease TTL + 2 s)", ms(lease_ttl + Duration::from_secs(2))),
            ),
        ],
    );
}

const LOG_RUNS: usize = 10_000;
const EVENTS_PER_RUN: usize = 100;
const STARTS: usize = 3;

/// Writes `LOG_RUNS` runs of `EVENTS_PER_RUN` events (one `run:created`, then 33 settled calls of
/// three events each, with their steps) straight into the kernel's database, schema as migrated.
fn fill_log(db: &std::path::Path) -> usize {
    let mut conn = rusqlite::Connection::open(db).expect("open the kernel's database");
    conn.pragma_update(None, "synchronous", "OFF").unwrap();
    let tx = conn.transaction().unwrap();
    let base = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64 - 86_400_000;
    let calls_per_run = (EVENTS_PER_RUN - 1) / 3;
    let mut events = 0;
    {
        let mut run = tx
            .prepare(
                "INSERT INTO runs (id, agent, status, input, labels, max_tool_calls, tool_calls, last_seq, \
                 created_at, updated_at) VALUES (?1, 'filler', 'running', '{}', '{}', 0, ?2, ?3, ?4, ?4)",
            )
            .unwrap();
        let mut event = tx
            .prepare(
                "INSERT INTO events (run_id, seq, type, schema_version, at, payload, prev) \
                 VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)",
            )
            .unwrap();
        // Each event names its run's event before it, and the run its last, as the kernel writes them.
        let mut last_event = tx.prepare("UPDATE runs SET last_event = ?2 WHERE id = ?1").unwrap();
        let mut step = tx
            .prepare(
                "INSERT INTO steps (run_id, step_key, turn, position, tool, fingerprint, version, arguments, \
                 call_hash, idempotency_key, idempotency, timeout_ms, status, attempts, output, worker, \
                 created_at, started_at, finished_at) VALUES (?1, ?2, ?3, 0, 'add', ?4, '1', '{\"a\":1,\"b\":2}', \
                 ?5, ?6, 'safe_to_retry', 30000, 'succeeded', 1, '3', 'filler-worker', ?7, ?7, ?7)",
            )
            .unwrap();
        let fingerprint = "f".repeat(64);
        for r in 0..LOG_RUNS {
            let run_id = format!("00000000-0000-7000-8000-{r:012}");
            let at = base + r as i64;
            run.execute(rusqlite::params![
                run_id,
                calls_per_run as i64,
                EVENTS_PER_RUN as i64,
                at
            ])
            .unwrap();
            let created = json!({"agent": "filler", "input": {}, "labels": {}, "max_tool_calls": 0}).to_string();
            let mut prev: Option<i64> = None;
            let mut append = |seq: i64, kind: &str, body: String| {
                prev = Some(
                    event
                        .insert(rusqlite::params![run_id, seq, kind, at, body, prev])
                        .unwrap(),
                );
            };
            append(1, "run:created", created);
            let mut seq = 1;
            for turn in 0..calls_per_run {
                let key = format!("t{turn}/p0");
                let idempotency_key = format!("{run_id}:{key}");
                let call_hash = format!("{:064x}", r * 1000 + turn);
                step.execute(rusqlite::params![
                    run_id,
                    key,
                    turn as i64,
                    fingerprint,
                    call_hash,
                    idempotency_key,
                    at
                ])
                .unwrap();
                let bodies = [
                    (
                        "tool:scheduled",
                        json!({"step_key": key, "position": 0, "tool": "add", "arguments": {"a": 1, "b": 2},
                               "call_hash": call_hash, "fingerprint": fingerprint}),
                    ),
                    (
                        "tool:start",
                        json!({"step_key": key, "position": 0, "tool": "add", "attempt": 1,
                               "dispatch_id": idempotency_key, "worker": "filler-worker",
                               "idempotency_key": idempotency_key, "timeout_ms": 30000}),
                    ),
                    (
                        "tool:result",
                        json!({"step_key": key, "position": 0, "tool": "add", "status": "ok",
                               "output": 3, "attempts": 1, "progress_count": 0}),
                    ),
                ];
                for (kind, body) in bodies {
                    seq += 1;
                    append(seq, kind, body.to_string());
                }
            }
            last_event.execute(rusqlite::params![run_id, prev]).unwrap();
            events += seq as usize;
        }
    }
    tx.commit().unwrap();
    // Fold the WAL into the database, as a kernel that had run for a while would have.
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE").unwrap();
    let counted: i64 = conn
        .query_row("SELECT count(*) FROM events", [], |row| row.get(0))
        .unwrap();
    assert_eq!(counted as usize, events);
    events
}

/// Restarts the kernel `STARTS` times, timing each from spawn to its `listening` line.
fn time_starts(kernel: &mut Kernel) -> Vec<Duration> {
    (0..STARTS)
        .map(|_| {
            kernel.kill9();
            let spawned = Instant::now();
            kernel.restart();
            spawned.elapsed()
        })
        .collect()
}

/// Time from spawning the kernel to its `listening` line, on an empty database and on one of
/// 1,000,000 events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn startup_on_a_million_events() {
    let mut kernel = Kernel::start();
    let empty = time_starts(&mut kernel);
    kernel.kill9();

    let db = kernel.dir.path().join("kernel.db");
    let filling = Instant::now();
    let events = fill_log(&db);
    let fill_time = filling.elapsed();
    let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);

    let full = time_starts(&mut kernel);
    // The kernel serves the log it started on.
    let page = kernel
        .runs()
        .await
        .list_runs(pb::ListRunsRequest {
            page_size: 10,
            ..Default::default()
        })
        .await
        .expect("list runs")
        .into_inner();
    assert_eq!(page.runs.len(), 10);

    let each = |times: &[Duration]| times.iter().map(|t| ms(*t)).collect::<Vec<_>>().join(", ");
    print_table(
        "kernel start-up: spawn → `listening` (page cache warm)",
        &[
            ("empty database, each start".into(), each(&empty)),
            ("empty database, median".into(), ms(median(&empty))),
            (
                "log written directly".into(),
                format!(
                    "{events} events, {LOG_RUNS} runs, {} steps, {:.0} MiB, in {}",
                    LOG_RUNS * (EVENTS_PER_RUN - 1) / 3,
                    size as f64 / f64::from(1 << 20),
                    ms(fill_time)
                ),
            ),
            ("1,000,000 events, each start".into(), each(&full)),
            ("1,000,000 events, median".into(), ms(median(&full))),
            ("target".into(), "≤ 1000 ms".into()),
        ],
    );
}

const IDLE_SESSIONS: usize = 1_000;

/// Opens one idle worker session on a connection of its own: a Hello offering one tool, then a
/// heartbeat at the kernel's interval. The session lasts until the returned stream is dropped.
async fn idle_session(url: String, index: usize) -> (tonic::Streaming<pb::OpenSessionResponse>, Channel) {
    let channel = Channel::from_shared(url).unwrap().connect().await.expect("connect");
    let schema = json!({"type": "object"});
    let description = "Does nothing.";
    let spec = pb::ToolSpec {
        name: "idle".into(),
        description: description.into(),
        input_schema_json: kernel_proto::canonical::to_canonical(&schema),
        version: "1".into(),
        fingerprint: kernel_proto::canonical::tool_fingerprint("idle", description, &schema, "1"),
        options: Some(pb::ToolOptions::default()),
    };
    let hello = pb::OpenSessionRequest {
        message: Some(pb::open_session_request::Message::Hello(pb::Hello {
            worker_name: format!("idle-{index}"),
            tools: vec![spec],
            max_concurrency: 1,
            sdk_version: "fault-timing".into(),
            ephemeral_tools: false,
            agents: Vec::new(),
            batches: false,
        })),
    };
    let heartbeat = || pb::OpenSessionRequest {
        message: Some(pb::open_session_request::Message::Heartbeat(pb::Heartbeat {})),
    };
    let mut interval = tokio::time::interval(Duration::from_secs(3));
    interval.reset();
    let outbound = tokio_stream::once(hello)
        .chain(tokio_stream::wrappers::IntervalStream::new(interval).map(move |_| heartbeat()));
    let mut inbound = WorkerServiceClient::new(channel.clone())
        .open_session(outbound)
        .await
        .expect("open session")
        .into_inner();
    let welcome = inbound.message().await.expect("welcome").expect("welcome");
    assert!(matches!(
        welcome.message,
        Some(pb::open_session_response::Message::Welcome(_))
    ));
    (inbound, channel)
}

async fn worker_count(kernel: &Kernel) -> usize {
    kernel
        .registry()
        .await
        .list_workers(pb::ListWorkersRequest {})
        .await
        .expect("list workers")
        .into_inner()
        .workers
        .len()
}

/// Settles, then reads the kernel's RSS.
async fn settled_rss(kernel: &Kernel) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    kernel.rss_kib()
}

fn kib(value: u64) -> String {
    format!("{:.1} MiB ({value} KiB)", value as f64 / 1024.0)
}

/// Kernel RSS before and with 1,000 idle worker sessions, each on its own connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn rss_with_1000_idle_worker_sessions() {
    let kernel = Kernel::start_with(KernelOptions {
        heartbeat_interval_ms: 3_000,
        lease_ttl_ms: 10_000,
        ..KernelOptions::default()
    });
    let before = settled_rss(&kernel).await;
    let pid = kernel.process.child.id();

    let mut opening = JoinSet::new();
    for index in 0..IDLE_SESSIONS {
        opening.spawn(idle_session(kernel.url(), index));
        if index % 50 == 49 {
            // Let the kernel keep up with the handshakes rather than time them out.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut sessions = Vec::with_capacity(IDLE_SESSIONS);
    while let Some(opened) = opening.join_next().await {
        sessions.push(opened.expect("session task"));
    }
    assert_eq!(worker_count(&kernel).await, IDLE_SESSIONS);
    let with_sessions = settled_rss(&kernel).await;
    let peak = e2e::proc_status_kib(pid, "VmHWM");
    assert_eq!(
        worker_count(&kernel).await,
        IDLE_SESSIONS,
        "the sessions stayed open while idle"
    );

    drop(sessions);
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker_count(&kernel).await > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = settled_rss(&kernel).await;

    let per_session = with_sessions.saturating_sub(before) as f64 / IDLE_SESSIONS as f64;
    print_table(
        "kernel RSS with 1,000 idle worker sessions (one connection each, heartbeat 3 s)",
        &[
            ("no sessions".into(), kib(before)),
            ("1,000 idle sessions".into(), kib(with_sessions)),
            ("peak (VmHWM)".into(), kib(peak)),
            ("per session".into(), format!("{per_session:.1} KiB")),
            ("after they closed".into(), kib(after)),
            ("target".into(), "≤ 100 KiB per idle session".into()),
        ],
    );
}

const RUNS: u32 = 10_000;
const AGENTS: usize = 32;

/// Kernel RSS before and after 10,000 runs of one call each, left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by name with --ignored --nocapture"]
async fn rss_with_10000_runs() {
    let kernel = Kernel::start();
    let shutdown = worker_sdk::CancellationToken::new();
    let worker = worker_sdk::Worker::builder(kernel.url())
        .name("rss-noop")
        .max_concurrency(64)
        .tool(worker_sdk::wrap_tool(
            "noop",
            "Does nothing.",
            json!({"type": "object"}),
            |_ctx, _args| async { Ok::<_, worker_sdk::ToolError>(Value::Null) },
        ))
        .build()
        .expect("worker");
    let serving = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    kernel.wait_for_workers("noop", 1).await;
    let before = settled_rss(&kernel).await;
    let pid = kernel.process.child.id();

    let channel = Channel::from_shared(kernel.url()).unwrap().connect().await.unwrap();
    let claimed = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let mut agents = JoinSet::new();
    for _ in 0..AGENTS {
        let mut runs = RunServiceClient::new(channel.clone());
        let mut calls = ToolCallServiceClient::new(channel.clone());
        let claimed = Arc::clone(&claimed);
        agents.spawn(async move {
            while claimed.fetch_add(1, Ordering::Relaxed) < RUNS {
                let run = runs
                    .create_run(pb::CreateRunRequest {
                        agent: "rss".into(),
                        input_json: "{}".into(),
                        ..Default::default()
                    })
                    .await
                    .expect("create run")
                    .into_inner()
                    .run
                    .expect("run");
                let request = pb::SubmitTurnRequest {
                    run_id: run.id,
                    turn: 0,
                    calls: vec![call("noop", json!({}))],
                    offered_tools: Vec::new(),
                    max_concurrency: 0,
                };
                let mut stream = calls.submit_turn(request).await.expect("submit").into_inner();
                let mut results = 0;
                while let Some(item) = stream.message().await.expect("turn") {
                    if let Some(pb::submit_turn_response::Item::Result(result)) = item.item {
                        assert_eq!(result.status, pb::CallStatus::Ok as i32, "{}", result.content);
                        results += 1;
                    }
                }
                assert_eq!(results, 1);
            }
        });
    }
    while let Some(done) = agents.join_next().await {
        done.expect("agent");
    }
    let elapsed = started.elapsed();
    let with_runs = settled_rss(&kernel).await;
    let peak = e2e::proc_status_kib(pid, "VmHWM");
    shutdown.cancel();
    let _ = serving.await;

    print_table(
        "kernel RSS with 10,000 runs (one call each, runs left open)",
        &[
            ("one worker session, no runs".into(), kib(before)),
            (
                "10,000 runs".into(),
                format!(
                    "{} (made in {}, {:.0} runs/s)",
                    kib(with_runs),
                    ms(elapsed),
                    f64::from(RUNS) / elapsed.as_secs_f64()
                ),
            ),
            ("peak (VmHWM)".into(), kib(peak)),
            (
                "per run".into(),
                format!("{:.2} KiB", with_runs.saturating_sub(before) as f64 / f64::from(RUNS)),
            ),
        ],
    );
}
