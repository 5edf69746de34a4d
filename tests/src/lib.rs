//! The end-to-end harness: spawns the real `kernel`, `demo-worker` and `kernelctl` binaries on
//! port 0, waits on what they log or on the kernel's events (never on a sleep), and checks a
//! run's whole event log against the kernel's invariants.
//!
//! Binaries are taken from the target directory the tests were built into; build them first with
//! `cargo build --workspace --bins --examples` (the test command, `tests/run.sh`, does).

pub mod load_tools;
pub mod mcp;
mod payloads;
pub mod postgres;
pub mod raw;
mod watchdog;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_client::AdminServiceClient;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use kernel_proto::v1::registry_service_client::RegistryServiceClient;
use kernel_proto::v1::run_service_client::RunServiceClient;
use kernel_proto::v1::tool_call_service_client::ToolCallServiceClient;
use serde_json::Value;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// How long any single wait may take before the test fails with what was seen.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// The one way a test waits on something it can only poll: `probe` looks once and answers
/// `Ok(value)` when what the test waits for holds, or `Err(seen)` with what it saw instead. It is
/// asked again every 20 ms for at most [`WAIT`]; then the test fails with what it waited for and
/// the last thing seen.
pub async fn eventually<T, Seen: std::fmt::Debug, Probe: std::future::Future<Output = Result<T, Seen>>>(
    what: &str,
    mut probe: impl FnMut() -> Probe,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(seen) if Instant::now() >= deadline => {
                panic!("waited {WAIT:?} for {what}; last saw: {seen:#?}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// The folder holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/debug/deps/<test binary>
    exe.parent().and_then(Path::parent).expect("target dir").to_path_buf()
}

/// The path of a built binary, failing with the command that builds it.
pub fn binary(name: &str) -> PathBuf {
    let dir = bin_dir();
    for candidate in [dir.join(name), dir.join("examples").join(name)] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "{name} is not built in {}; run `cargo build --workspace --bins --examples` first",
        dir.display()
    );
}

/// Lines a child process wrote to stderr, shared with the thread that reads them.
#[derive(Clone, Default)]
pub struct Log {
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
}

impl Log {
    /// Keeps the lines of `stream` (a child's stderr or stdout) as they come.
    pub fn follow_stream(&self, stream: impl std::io::Read + Send + 'static, echo: &'static str) {
        self.follow(stream, echo);
    }

    fn follow(&self, stream: impl std::io::Read + Send + 'static, echo: &'static str) {
        let log = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if std::env::var_os("E2E_ECHO").is_some() {
                    eprintln!("[{echo}] {line}");
                }
                let (lines, changed) = &*log.lines;
                lines.lock().unwrap().push(line);
                changed.notify_all();
            }
        });
    }

    /// Waits for a line containing `needle` after the first `skip` lines; returns its index and text.
    pub fn wait_for_after(&self, skip: usize, needle: &str) -> (usize, String) {
        let deadline = Instant::now() + WAIT;
        let (lines, changed) = &*self.lines;
        let mut guard = lines.lock().unwrap();
        loop {
            if let Some((index, line)) = guard.iter().enumerate().skip(skip).find(|(_, l)| l.contains(needle)) {
                return (index, line.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no log line with {needle:?} within {WAIT:?}; saw:\n{}",
                guard.join("\n")
            );
            guard = changed.wait_timeout(guard, left).unwrap().0;
        }
    }

    /// Waits for a line containing `needle`.
    pub fn wait_for(&self, needle: &str) -> String {
        self.wait_for_after(0, needle).1
    }

    /// How many lines so far.
    pub fn len(&self) -> usize {
        self.lines.0.lock().unwrap().len()
    }

    /// Whether no line was logged yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        self.lines.0.lock().unwrap().join("\n")
    }

    /// The last `count` lines logged.
    fn tail(&self, count: usize) -> Vec<String> {
        let lines = self.lines.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        lines[lines.len().saturating_sub(count)..].to_vec()
    }
}

/// How many of its last log lines each process of a failing test prints: a failure seen once in
/// CI is read from them.
const TAIL_ON_FAILURE: usize = 120;

/// A child process killed (SIGKILL) when dropped; it counts towards its test's time limit (see
/// `watchdog`) while it lives.
pub struct Process {
    pub child: Child,
    pub log: Log,
    /// What it is, in the lines it prints when its test fails.
    label: &'static str,
    /// The test that started it.
    test: String,
}

impl Process {
    fn spawn(mut command: Command, label: &'static str) -> Process {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot start {label}: {e}"));
        let log = Log::default();
        log.follow(child.stderr.take().expect("piped stderr"), label);
        Process::adopt(child, log, label)
    }

    /// A child started elsewhere, from now on the harness's: killed when dropped, and counted
    /// towards its test's time limit.
    pub(crate) fn adopt(child: Child, log: Log, label: &'static str) -> Process {
        let test = watchdog::started(child.id());
        Process {
            child,
            log,
            label,
            test,
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the process hangs with its connections open.
    pub fn stop(&self) {
        self.signal("STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// SIGTERM, without waiting: the kernel drains to stop.
    pub fn signal_term(&self) {
        self.signal("TERM");
    }

    /// SIGHUP: the kernel reads its policy and auth files again.
    pub fn hangup(&self) {
        self.signal("HUP");
    }

    /// SIGTERM, then waits up to `within` for the exit; returns whether it exited successfully.
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.signal("TERM");
        self.wait_exit(within)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        watchdog::ended(self.child.id(), &self.test);
        // Dropped while its test unwinds from a failure: what the process said goes with the
        // failure's report (`E2E_ECHO=1` prints every line as it comes instead).
        if std::thread::panicking() && std::env::var_os("E2E_ECHO").is_none() {
            let tail = self.log.tail(TAIL_ON_FAILURE);
            let pid = self.child.id();
            eprintln!("--- the last {} lines of {} (pid {pid}) ---", tail.len(), self.label);
            for line in tail {
                eprintln!("[{}] {line}", self.label);
            }
        }
    }
}

/// Options of a kernel under test. Leases are short so lost workers are noticed quickly.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    pub heartbeat_interval_ms: u64,
    pub lease_ttl_ms: u64,
    pub schedule_to_start_timeout_ms: u64,
    pub default_tool_timeout_ms: u64,
    /// A policy file's text, written beside the database and passed with --policy.
    pub policy: Option<String>,
    /// More flags for the kernel.
    pub args: Vec<String>,
    /// The database, when not `kernel.db` in the kernel's folder (a PostgreSQL URL).
    pub db: Option<String>,
    /// The test is about the SQLite file itself (its lock, its path): it stays on SQLite even when
    /// the suite runs on PostgreSQL ([`postgres::SUITE_SERVER`]).
    pub sqlite: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            heartbeat_interval_ms: 200,
            lease_ttl_ms: 1_500,
            schedule_to_start_timeout_ms: 10_000,
            default_tool_timeout_ms: 30_000,
            policy: None,
            args: Vec::new(),
            db: None,
            sqlite: false,
        }
    }
}

/// A running kernel on a port of its own, with a database in a temporary folder.
pub struct Kernel {
    pub process: Process,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub options: KernelOptions,
}

/// The command that starts a kernel on `dir/kernel.db` with `options`.
fn kernel_command(dir: &Path, listen: &str, options: &KernelOptions) -> Command {
    let mut command = Command::new(binary("kernel"));
    command
        .arg("--listen")
        .arg(listen)
        .arg("--db")
        .arg(
            options
                .db
                .clone()
                .unwrap_or_else(|| dir.join("kernel.db").display().to_string()),
        )
        .env(
            "KERNEL_HEARTBEAT_INTERVAL_MS",
            options.heartbeat_interval_ms.to_string(),
        )
        .env("KERNEL_LEASE_TTL_MS", options.lease_ttl_ms.to_string())
        .env(
            "KERNEL_SCHEDULE_TO_START_TIMEOUT_MS",
            options.schedule_to_start_timeout_ms.to_string(),
        )
        .env(
            "KERNEL_DEFAULT_TOOL_TIMEOUT_MS",
            options.default_tool_timeout_ms.to_string(),
        )
        .env("KERNEL_DRAIN_TIMEOUT_MS", "2000")
        .args(&options.args);
    if let Some(policy) = &options.policy {
        let path = dir.join("policy.yaml");
        std::fs::write(&path, policy).expect("write policy");
        command.arg("--policy").arg(path);
    }
    command
}

fn spawn_kernel(dir: &Path, listen: &str, options: &KernelOptions) -> (Process, SocketAddr) {
    let process = Process::spawn(kernel_command(dir, listen, options), "kernel");
    let line = process.log.wait_for("listening");
    let addr = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no addr= in {line:?}"));
    (process, addr)
}

/// A folder for a kernel's files, and `options` with the suite's PostgreSQL server's fresh
/// database when the suite runs on one and the test does not insist on SQLite.
fn suite_database(mut options: KernelOptions) -> (tempfile::TempDir, KernelOptions) {
    let dir = tempfile::tempdir().expect("temp dir");
    if options.db.is_none()
        && !options.sqlite
        && let Ok(server) = std::env::var(postgres::SUITE_SERVER)
    {
        options.db = Some(postgres::fresh_database(&server));
    }
    (dir, options)
}

/// The complete lines of a fault workers' ledger file.
pub fn read_ledger(file: &Path) -> Vec<LedgerLine> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    // A line still being written has no newline yet; it is read next time.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            LedgerLine {
                what: parts[0].into(),
                tool: parts[1].into(),
                key: parts[2].into(),
                attempt: parts[3].parse().expect("attempt"),
            }
        })
        .collect()
}

/// One line of a fault worker's ledger: what happened, in which tool, under which key and attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerLine {
    pub what: String,
    pub tool: String,
    pub key: String,
    pub attempt: u32,
}

impl Kernel {
    /// Starts a kernel with default test options.
    pub fn start() -> Kernel {
        Kernel::start_with(KernelOptions::default())
    }

    /// Starts a kernel on `kernel.db` in its folder, whatever database the suite runs on.
    pub fn start_on_sqlite() -> Kernel {
        Kernel::start_with(KernelOptions {
            sqlite: true,
            ..KernelOptions::default()
        })
    }

    /// Whether the kernel serves a PostgreSQL database (where a restarted kernel is a new replica).
    pub fn on_postgres(&self) -> bool {
        self.options.db.as_deref().is_some_and(|db| db.starts_with("postgres"))
    }

    /// Starts a kernel and waits until it listens.
    pub fn start_with(options: KernelOptions) -> Kernel {
        let (dir, options) = suite_database(options);
        let (process, addr) = spawn_kernel(dir.path(), "127.0.0.1:0", &options);
        Kernel {
            process,
            addr,
            dir,
            options,
        }
    }

    /// Starts a kernel whose stderr is a pipe that the test stops reading once the kernel
    /// listens, as when `kernel 2>&1 | tee kernel.log` loses its `tee` to a Ctrl-C: every later
    /// log line meets a closed pipe. [`Kernel::process`]'s log stays empty.
    pub fn start_with_log_reader_gone(options: KernelOptions) -> Kernel {
        let (dir, options) = suite_database(options);
        let mut command = kernel_command(dir.path(), "127.0.0.1:0", &options);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start the kernel");
        let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let (found, listening) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = stderr.lines();
            for line in lines.by_ref().map_while(Result::ok) {
                if line.contains("listening") {
                    // The reader goes back with the line, to be closed by the test.
                    let _ = found.send((line, lines));
                    return;
                }
            }
        });
        let (line, reader) = listening.recv_timeout(WAIT).expect("the kernel listens");
        drop(reader);
        let addr = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("addr="))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no addr= in {line:?}"));
        Kernel {
            process: Process::adopt(child, Log::default(), "kernel"),
            addr,
            dir,
            options,
        }
    }

    /// SIGKILL: the kernel dies mid-whatever, with no chance to flush or say goodbye.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// Starts the kernel again on the same database and address, so workers find it again.
    pub fn restart(&mut self) {
        self.process.kill9();
        let (process, addr) = spawn_kernel(self.dir.path(), &self.addr.to_string(), &self.options);
        assert_eq!(addr, self.addr);
        self.process = process;
    }

    /// Submits turn 0 of `run` as an agent that survives a restart, SIGKILLs this kernel once its
    /// workers have started `started` calls, restarts it with a fresh fault worker in place of
    /// `worker`, and returns the turn once the agent has every result.
    pub async fn turn_across_a_sigkill(
        &mut self,
        run: &str,
        calls: Vec<pb::ToolCall>,
        worker: Process,
        started: usize,
    ) -> TurnOutcome {
        let turn = submit_in_background(self, run, 0, calls);
        eventually("calls to start", || async {
            let seen = self.ledger().iter().filter(|line| line.what == "start").count();
            if seen >= started { Ok(()) } else { Err(seen) }
        })
        .await;
        self.kill9();
        drop(worker);
        self.restart();
        let _worker = self.fault_worker("after-restart");
        tokio::time::timeout(Duration::from_secs(90), turn)
            .await
            .expect("the turn ends")
            .expect("the agent's task")
    }

    /// Starts another kernel process on this kernel's database, listening on `listen`, and
    /// waits for nothing: it may refuse to start.
    pub fn another_on_same_db(&self, listen: &str) -> Process {
        Process::spawn(kernel_command(self.dir.path(), listen, &self.options), "kernel-2")
    }

    /// The kernel's database file.
    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("kernel.db")
    }

    /// Starts the fault-injection worker, which records every execution in this kernel's ledger.
    pub fn fault_worker(&self, name: &str) -> Process {
        self.fault_worker_with(name, &[])
    }

    /// Starts the fault-injection worker with extra flags (e.g. `--max-concurrency 300`).
    pub fn fault_worker_with(&self, name: &str, args: &[&str]) -> Process {
        self.fault_worker_on(self, name, args)
    }

    /// Starts the fault-injection worker against `serving` (another replica on this kernel's
    /// database), writing to this kernel's ledger, so one ledger sees every replica's workers.
    pub fn fault_worker_on(&self, serving: &Kernel, name: &str, args: &[&str]) -> Process {
        let mut command = Command::new(binary("fault-worker"));
        command
            .arg("--kernel")
            .arg(serving.url())
            .arg("--name")
            .arg(name)
            .arg("--ledger")
            .arg(self.dir.path().join("ledger.txt"))
            .args(args);
        let process = Process::spawn(command, "fault-worker");
        process.log.wait_for("worker session open");
        process
    }

    /// Everything the fault workers recorded.
    pub fn ledger(&self) -> Vec<LedgerLine> {
        read_ledger(&self.ledger_file())
    }

    /// The file the fault workers append their ledger lines to, in the order things happened.
    pub fn ledger_file(&self) -> PathBuf {
        self.dir.path().join("ledger.txt")
    }

    /// How many times a call's body started, by idempotency key.
    pub fn executions(&self, key: &str) -> usize {
        self.ledger()
            .iter()
            .filter(|l| l.what == "start" && l.key == key)
            .count()
    }

    /// `http://host:port` for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Starts the example worker against this kernel and waits until its session is open.
    pub fn worker(&self, name: &str) -> Process {
        self.worker_with(name, &[])
    }

    /// Starts the example worker with extra flags.
    pub fn worker_with(&self, name: &str, args: &[&str]) -> Process {
        let mut command = Command::new(binary("demo-worker"));
        command
            .arg("--kernel")
            .arg(self.url())
            .arg("--name")
            .arg(name)
            .args(args)
            .env("RUST_LOG", "info");
        let process = Process::spawn(command, "worker");
        process.log.wait_for("worker session open");
        process
    }

    /// Runs kernelctl against this kernel.
    pub fn kernelctl(&self, args: &[&str]) -> Output {
        Command::new(binary("kernelctl"))
            .arg("--addr")
            .arg(self.url())
            .args(args)
            .output()
            .expect("kernelctl runs")
    }

    /// kernelctl's stdout against this kernel, after checking it succeeded.
    pub fn kernelctl_ok(&self, args: &[&str]) -> String {
        let out = self.kernelctl(args);
        assert!(
            out.status.success(),
            "kernelctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn runs(&self) -> RunServiceClient<Channel> {
        RunServiceClient::connect(self.url()).await.expect("connect")
    }

    /// The runs of agent `agent`, every agent's for `""`: up to 1,000, a test's worth.
    pub async fn list_runs(&self, agent: &str) -> Vec<pb::Run> {
        self.runs()
            .await
            .list_runs(pb::ListRunsRequest {
                agent: agent.into(),
                page_size: 1000,
                ..Default::default()
            })
            .await
            .expect("list runs")
            .into_inner()
            .runs
    }

    pub async fn calls(&self) -> ToolCallServiceClient<Channel> {
        ToolCallServiceClient::connect(self.url()).await.expect("connect")
    }

    pub async fn registry(&self) -> RegistryServiceClient<Channel> {
        RegistryServiceClient::connect(self.url()).await.expect("connect")
    }

    /// What the kernel holds in memory now (`AdminService.GetStatus`).
    pub async fn status(&self) -> pb::GetStatusResponse {
        AdminServiceClient::connect(self.url())
            .await
            .expect("connect")
            .get_status(pb::GetStatusRequest {})
            .await
            .expect("get status")
            .into_inner()
    }

    /// The approvals waiting for an answer (`ApprovalService.ListApprovals`), oldest first.
    pub async fn pending_approvals(&self) -> Vec<pb::Approval> {
        ApprovalServiceClient::connect(self.url())
            .await
            .expect("connect")
            .list_approvals(pb::ListApprovalsRequest::default())
            .await
            .expect("list approvals")
            .into_inner()
            .approvals
    }

    /// Waits for run `run` to put a question to a person (`run:interrupted`, `human_input`);
    /// returns the approval that holds it.
    pub async fn question_of(&self, run: &str) -> pb::Approval {
        let mut watch = Watch::open(self, run, 0, false).await;
        let interrupted = watch.event("run:interrupted", |p| p["reason"] == "human_input").await;
        let approval = self
            .pending_approvals()
            .await
            .into_iter()
            .find(|a| a.run_id == run)
            .expect("the question's approval");
        assert_eq!(interrupted["approval_id"], approval.id.as_str());
        approval
    }

    /// Waits until the kernel holds no session, queued call, lease or run channel, and returns its
    /// status then.
    pub async fn wait_idle(&self) -> pb::GetStatusResponse {
        eventually("the kernel to go idle", || async {
            let status = self.status().await;
            let idle = status.worker_sessions == 0
                && status.queued_calls == 0
                && status.leased_calls == 0
                && status.live_runs == 0;
            if idle { Ok(status) } else { Err(status) }
        })
        .await
    }

    /// Creates a run and returns its id.
    pub async fn create_run(&self, agent: &str) -> String {
        self.create_labelled_run(agent, &[]).await
    }

    /// Creates a run carrying `labels` and returns its id.
    pub async fn create_labelled_run(&self, agent: &str, labels: &[(&str, &str)]) -> String {
        let request = pb::CreateRunRequest {
            agent: agent.into(),
            input_json: "{}".into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let mut runs = self.runs().await;
        runs.create_run(request)
            .await
            .expect("create run")
            .into_inner()
            .run
            .expect("run")
            .id
    }

    /// Completes run `run` with an empty output.
    pub async fn complete(&self, run: &str) {
        self.runs()
            .await
            .complete_run(pb::CompleteRunRequest {
                run_id: run.into(),
                output_json: "{}".into(),
            })
            .await
            .expect("complete the run");
    }

    /// Creates a hosted run of `agent` (one a worker hosts) and returns its id.
    pub async fn start_hosted(&self, agent: &str, input: Value) -> String {
        let request = pb::CreateRunRequest {
            agent: agent.into(),
            input_json: input.to_string(),
            hosted: true,
            ..Default::default()
        };
        let run = self
            .runs()
            .await
            .create_run(request)
            .await
            .expect("create a hosted run")
            .into_inner()
            .run
            .expect("run");
        assert!(run.hosted, "a run of an agent a worker hosts is hosted: {run:?}");
        run.id
    }

    /// Waits until the run's status is one `done` accepts, and returns the run.
    pub async fn wait_status(&self, run: &str, done: impl Fn(pb::RunStatus) -> bool) -> pb::Run {
        eventually(&format!("run {run} to reach the status asked for"), || async {
            let got = self.get(run).await.run.expect("run");
            if done(pb::RunStatus::try_from(got.status).expect("a known status")) {
                Ok(got)
            } else {
                Err(got)
            }
        })
        .await
    }

    /// Waits until the run has ended, and returns it.
    pub async fn finished(&self, run: &str) -> pb::Run {
        self.wait_status(run, |s| {
            matches!(
                s,
                pb::RunStatus::Completed | pb::RunStatus::Failed | pb::RunStatus::Cancelled
            )
        })
        .await
    }

    /// Waits until the registry shows `count` sessions offering `tool` (or hosting an agent so named).
    pub async fn wait_for_workers(&self, tool: &str, count: usize) {
        let registry = self.registry().await;
        eventually(&format!("{count} workers offering {tool}"), || {
            let mut registry = registry.clone();
            async move {
                let workers = registry
                    .list_workers(pb::ListWorkersRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .workers;
                let offering = |w: &pb::WorkerInfo| w.tools.iter().chain(&w.agents).any(|t| t == tool);
                let found = workers.iter().filter(|w| offering(w)).count() == count;
                if found { Ok(()) } else { Err(workers) }
            }
        })
        .await
    }

    /// Every event of a run.
    pub async fn events(&self, run_id: &str) -> Vec<pb::Event> {
        self.events_as(run_id, None).await
    }

    /// Every event of a run, read with an API key.
    pub async fn events_with_key(&self, run_id: &str, key: &str) -> Vec<pb::Event> {
        self.events_as(run_id, Some(key)).await
    }

    async fn events_as(&self, run_id: &str, key: Option<&str>) -> Vec<pb::Event> {
        let mut client = self.runs().await;
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            let message = pb::ListRunEventsRequest {
                run_id: run_id.into(),
                from_seq: from,
                page_size: 1000,
            };
            let request = match key {
                Some(key) => with_key(message, key),
                None => tonic::Request::new(message),
            };
            let page = client.list_run_events(request).await.expect("list events").into_inner();
            events.extend(page.events);
            if page.next_seq == 0 {
                return events;
            }
            from = page.next_seq;
        }
    }

    /// A run and its steps.
    pub async fn get(&self, run_id: &str) -> pb::GetRunResponse {
        self.runs()
            .await
            .get_run(pb::GetRunRequest { run_id: run_id.into() })
            .await
            .expect("get run")
            .into_inner()
    }
}

/// A call to submit.
pub fn call(tool: &str, arguments: Value) -> pb::ToolCall {
    pb::ToolCall {
        tool: tool.into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    }
}

/// What a submitted turn streamed back.
#[derive(Debug, Default)]
pub struct TurnOutcome {
    pub results: Vec<pb::CallResult>,
    pub progress: Vec<pb::Progress>,
    pub interrupted: Vec<pb::Interruption>,
}

/// Waits for a turn [`submit_in_background`] submitted and checks that each call succeeded.
pub async fn all_ok(turn: tokio::task::JoinHandle<TurnOutcome>, why: &str) -> TurnOutcome {
    let outcome = tokio::time::timeout(Duration::from_secs(60), turn)
        .await
        .expect("the turn ends")
        .expect("the turn's task");
    assert!(
        outcome.results.iter().all(|r| r.outcome == pb::CallOutcome::Ok as i32),
        "{why}: {:#?}",
        outcome.results
    );
    outcome
}

/// Submits a turn and reads its whole stream.
pub async fn submit(
    kernel: &Kernel,
    run_id: &str,
    turn: u32,
    calls: Vec<pb::ToolCall>,
) -> Result<TurnOutcome, tonic::Status> {
    let request = pb::SubmitTurnRequest {
        run_id: run_id.into(),
        turn,
        calls,
        offered_tools: Vec::new(),
        max_concurrency: 0,
    };
    let mut stream = kernel.calls().await.submit_turn(request).await?.into_inner();
    let mut outcome = TurnOutcome::default();
    while let Some(item) = tokio::time::timeout(WAIT, stream.next()).await.expect("turn stalled") {
        match item?.item {
            Some(pb::submit_turn_response::Item::Result(result)) => outcome.results.push(result),
            Some(pb::submit_turn_response::Item::Progress(progress)) => outcome.progress.push(progress),
            Some(pb::submit_turn_response::Item::Interrupted(interruption)) => outcome.interrupted.push(interruption),
            None => {}
        }
    }
    Ok(outcome)
}

/// A live view of a run's events.
pub struct Watch {
    stream: tonic::Streaming<pb::WatchRunEventsResponse>,
    pub events: Vec<pb::Event>,
    pub progress: Vec<pb::Progress>,
}

impl Watch {
    pub async fn open(kernel: &Kernel, run_id: &str, from_seq: u64, include_progress: bool) -> Watch {
        let request = pb::WatchRunEventsRequest {
            run_id: run_id.into(),
            from_seq,
            include_progress,
        };
        let stream = kernel
            .runs()
            .await
            .watch_run_events(request)
            .await
            .expect("watch")
            .into_inner();
        Watch {
            stream,
            events: Vec::new(),
            progress: Vec::new(),
        }
    }

    /// Reads until `found` holds for the newest item; returns false if the stream ended first.
    pub async fn until(&mut self, mut found: impl FnMut(&Watch) -> bool) -> bool {
        loop {
            let next = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("watch stalled");
            match next {
                None => return false,
                Some(item) => match item.expect("watch item").item {
                    Some(pb::watch_run_events_response::Item::Event(event)) => self.events.push(event),
                    Some(pb::watch_run_events_response::Item::Progress(progress)) => self.progress.push(progress),
                    None => {}
                },
            }
            if found(self) {
                return true;
            }
        }
    }

    /// Waits for an event of `kind` whose payload satisfies `matches`; returns its payload.
    pub async fn event(&mut self, kind: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let seen = self.events.len();
        let mut hit = None;
        let found = self
            .until(|w| {
                hit = w.events[seen.min(w.events.len())..]
                    .iter()
                    .find(|e| e.r#type == kind && matches(&payload(e)))
                    .map(payload);
                hit.is_some()
            })
            .await;
        assert!(found, "the watch ended without a {kind} event");
        hit.expect("found")
    }
}

/// An event's payload as JSON.
pub fn payload(event: &pb::Event) -> Value {
    serde_json::from_str(&event.payload_json).expect("payload is JSON")
}

const TERMINAL_RUN_EVENTS: [&str; 3] = ["run:completed", "run:failed", "run:cancelled"];

/// Asserts that a hosted run's handler kept the one dispatch it started with: its log has one
/// `agent:dispatched` and no `agent:suspended` (a refused suspension writes nothing).
pub fn assert_kept_its_one_dispatch(events: &[pb::Event]) {
    let kinds: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert!(!kinds.contains(&"agent:suspended"), "{kinds:?}");
    let dispatched = kinds.iter().filter(|k| **k == "agent:dispatched").count();
    assert_eq!(dispatched, 1, "{kinds:?}");
}

/// When the kernel recorded `event`, in milliseconds.
pub fn millis(event: &pb::Event) -> i64 {
    let at = event.at.as_ref().expect("an event's time");
    at.seconds * 1000 + i64::from(at.nanos) / 1_000_000
}

/// Checks the token bucket's promise over every window of the start times `starts` (ms,
/// sorted): at most `rate` a second plus `burst`. Returns the rate of the whole, after the burst.
pub fn check_rate(starts: &[i64], rate: f64, burst: f64) -> f64 {
    for (i, first) in starts.iter().enumerate() {
        for (j, last) in starts.iter().enumerate().skip(i) {
            let count = (j - i + 1) as f64;
            // A millisecond either side: the kernel's times are whole milliseconds.
            let allowed = rate * ((last - first + 1) as f64) / 1000.0 + burst;
            assert!(
                count <= allowed + 1e-9,
                "{count} starts in {} ms; the limit allows {allowed:.1}: {starts:?}",
                last - first
            );
        }
    }
    let span = (starts[starts.len() - 1] - starts[0]) as f64 / 1000.0;
    (starts.len() as f64 - burst) / span
}

/// Checks a run's whole log against the invariants: gap-free sequence numbers; every payload fits
/// its kind's schema in docs/reference/events.schema.json; exactly one terminal event
/// (`tool:result` or `tool:denied`) per step, with `tool:start` before any worker result; every
/// scheduled call settled (when `settled` is set); at most one terminal run event, and it comes last.
pub fn check_log(events: &[pb::Event], settled: bool) {
    let dump = || {
        events
            .iter()
            .map(|e| format!("{} {} {}", e.seq, e.r#type, e.payload_json))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.seq, index as u64 + 1, "sequence gap or duplicate:\n{}", dump());
        assert_eq!(event.schema_version, 1);
    }
    for event in events {
        if let Some(why) = payloads::misfit(&event.r#type, &payload(event)) {
            panic!(
                "event {} ({}) does not fit its payload schema in docs/reference/events.schema.json (generated \
                 from kernel/src/machine/events.rs): {why}\n{}",
                event.seq,
                event.r#type,
                dump()
            );
        }
    }
    let mut scheduled = HashSet::new();
    let mut started: HashMap<String, u64> = HashMap::new();
    let mut results: HashMap<String, usize> = HashMap::new();
    for event in events {
        let body = payload(event);
        let key = body["step_key"].as_str().unwrap_or_default().to_owned();
        match event.r#type.as_str() {
            "tool:scheduled" => {
                assert!(scheduled.insert(key.clone()), "step {key} scheduled twice:\n{}", dump());
            }
            "tool:start" | "agent:dispatched" => {
                assert!(
                    !results.contains_key(&key),
                    "tool:start after the result of {key}:\n{}",
                    dump()
                );
                started.insert(key, body["attempt"].as_u64().unwrap());
            }
            "tool:result" | "tool:denied" | "agent:result" | "step:result" => {
                *results.entry(key.clone()).or_default() += 1;
                if body["attempts"].as_u64().unwrap_or(0) > 0
                    && body["status"] != "cancelled"
                    && body.get("reason").is_none()
                {
                    assert!(
                        started.contains_key(&key),
                        "a worker result for {key} without tool:start:\n{}",
                        dump()
                    );
                    assert_eq!(
                        started[&key],
                        body["attempts"].as_u64().unwrap(),
                        "result from a stale attempt of {key}"
                    );
                }
            }
            _ => {}
        }
    }
    for (key, count) in &results {
        assert_eq!(*count, 1, "step {key} has {count} terminal events:\n{}", dump());
    }
    if settled {
        for key in &scheduled {
            assert!(results.contains_key(key), "step {key} never settled:\n{}", dump());
        }
    }
    let terminal: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| TERMINAL_RUN_EVENTS.contains(&e.r#type.as_str()))
        .map(|(i, _)| i)
        .collect();
    assert!(terminal.len() <= 1, "several terminal run events:\n{}", dump());
    if let Some(index) = terminal.first() {
        assert_eq!(
            *index,
            events.len() - 1,
            "events after the run's terminal event:\n{}",
            dump()
        );
    }
}

/// Polls the ledger until `found` holds (the ledger is a file other processes append to).
pub async fn wait_ledger(kernel: &Kernel, what: &str, mut found: impl FnMut(&[LedgerLine]) -> bool) -> Vec<LedgerLine> {
    eventually(&format!("the ledger to show {what}"), || {
        let ledger = kernel.ledger();
        let done = found(&ledger);
        async move { if done { Ok(ledger) } else { Err(ledger) } }
    })
    .await
}

/// [`submit_until_done`] on a task of its own, for a test that acts while the turn waits.
pub fn submit_in_background(
    kernel: &Kernel,
    run_id: &str,
    turn: u32,
    calls: Vec<pb::ToolCall>,
) -> tokio::task::JoinHandle<TurnOutcome> {
    let (url, run_id) = (kernel.url(), run_id.to_owned());
    tokio::spawn(async move { submit_until_done(&url, &run_id, turn, calls).await })
}

/// Submits a turn as an agent that survives a kernel restart would: on a broken stream or an
/// unreachable kernel it submits the same turn again until it has every result.
pub async fn submit_until_done(url: &str, run_id: &str, turn: u32, calls: Vec<pb::ToolCall>) -> TurnOutcome {
    let deadline = Instant::now() + WAIT * 2;
    loop {
        let attempt = async {
            let mut client = ToolCallServiceClient::connect(url.to_owned())
                .await
                .map_err(|e| e.to_string())?;
            let request = pb::SubmitTurnRequest {
                run_id: run_id.into(),
                turn,
                calls: calls.clone(),
                offered_tools: Vec::new(),
                max_concurrency: 0,
            };
            let mut stream = client
                .submit_turn(request)
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            let mut outcome = TurnOutcome::default();
            while let Some(item) = stream.next().await {
                match item.map_err(|e| e.to_string())?.item {
                    Some(pb::submit_turn_response::Item::Result(result)) => outcome.results.push(result),
                    Some(pb::submit_turn_response::Item::Progress(progress)) => outcome.progress.push(progress),
                    Some(pb::submit_turn_response::Item::Interrupted(i)) => outcome.interrupted.push(i),
                    None => {}
                }
            }
            Ok::<_, String>(outcome)
        };
        match attempt.await {
            Ok(outcome) if outcome.results.len() == calls.len() => return outcome,
            Ok(outcome) => panic!("a turn ended with {} of {} results", outcome.results.len(), calls.len()),
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "the turn never completed; last error: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

impl Kernel {
    /// The kernel's resident memory in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> u64 {
        proc_status_kib(self.process.child.id(), "VmRSS")
    }
}

/// A `kB` field of `/proc/<pid>/status`, such as `VmRSS` or `VmHWM`.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

impl Kernel {
    /// `https://127.0.0.1:PORT` for clients of a kernel started with `--tls-cert` (the test
    /// certificates name both `localhost` and `127.0.0.1`).
    pub fn https_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }
}

impl Process {
    /// Starts any command as a child process that is killed when dropped, following its stderr;
    /// waits for nothing (a refused worker never logs its session open).
    pub fn start(command: Command, label: &'static str) -> Process {
        Process::spawn(command, label)
    }

    /// Waits up to `within` for the process to exit by itself; `None` if it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// A key as `kernelctl keys create` prints it: its secret, and its auth-file entry (a
/// `workers:connect` key may offer any tool).
pub fn create_key(name: &str, scopes: &[&str]) -> (String, String) {
    let mut command = std::process::Command::new(binary("kernelctl"));
    command.args(["keys", "create", "--name", name]);
    if scopes.contains(&"workers:connect") {
        command.args(["--tools", "*"]);
    }
    for scope in scopes {
        command.args(["--scope", scope]);
    }
    let output = command.output().expect("kernelctl runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let entry = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    (String::from_utf8(output.stdout).unwrap().trim().to_owned(), entry)
}

/// `message` as a request that sends `key` (`authorization: Bearer <key>`).
pub fn with_key<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let bearer = format!("Bearer {key}").parse().expect("a key fits in metadata");
    request.metadata_mut().insert("authorization", bearer);
    request
}
