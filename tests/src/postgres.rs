//! A real PostgreSQL server for the tests, in a temporary folder: `initdb` and `pg_ctl` from
//! Debian's `postgresql` package, run as the `postgres` user when the tests run as root (initdb
//! refuses root). Each server listens on 127.0.0.1 on a port of its own, trusts local connections,
//! and is stopped (immediately) when dropped.
//!
//! Where PostgreSQL is not installed, [`Postgres::start`] says so loudly on stderr and returns
//! `None`, and the test returns early; with `KERNEL_REQUIRE_POSTGRES=1` (as `.ci/run` sets) it
//! fails instead, so CI never skips these tests.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set to `1` to fail, rather than skip, a test whose PostgreSQL cannot start.
pub const REQUIRE: &str = "KERNEL_REQUIRE_POSTGRES";

/// Set to a PostgreSQL server's URL (a superuser's) to run every kernel the tests start without a
/// database of its own on a fresh database of that server: the whole suite on PostgreSQL.
pub const SUITE_SERVER: &str = "KERNEL_TEST_POSTGRES";

/// Creates a database of its own on `server` and returns its URL.
pub fn fresh_database(server: &str) -> String {
    let name = format!("kernel_test_{}", std::process::id())
        + &format!("_{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let url = server.to_owned();
    let created = name.clone();
    // A thread of its own: the caller may be on a runtime already.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|error| panic!("cannot connect to {url} ({SUITE_SERVER}): {error}"));
            tokio::spawn(connection);
            for statement in [
                format!("DROP DATABASE IF EXISTS {created}"),
                format!("CREATE DATABASE {created}"),
            ] {
                client.batch_execute(&statement).await.expect("create a test database");
            }
        })
    })
    .join()
    .expect("the database is created");
    match server.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("{SUITE_SERVER} must end with a database name: {server}"),
    }
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A running PostgreSQL server.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
    /// `postgres://kernel@127.0.0.1:PORT/postgres`.
    pub url: String,
}

impl Postgres {
    /// Starts a new server; `None` when PostgreSQL is not installed and not required.
    pub fn start(test: &str) -> Option<Postgres> {
        let Some(bin) = find_bin() else {
            let message = format!(
                "PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin or on PATH); \
                 `apt-get install postgresql` runs {test}"
            );
            if std::env::var(REQUIRE).as_deref() == Ok("1") {
                panic!("{message}; {REQUIRE}=1 requires it");
            }
            // Straight to the process's stderr: the test harness captures `eprintln!` of a passing test.
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {message}");
            return None;
        };
        let run_as = postgres_user();
        let dir = tempfile::Builder::new()
            .prefix("kernel-pg-")
            .tempdir()
            .expect("a temporary folder");
        if let Some(user) = &run_as {
            chown_to(dir.path(), user);
        }
        let mut server = Postgres {
            dir,
            bin,
            run_as,
            port: 0,
            url: String::new(),
        };
        server.init();
        server.launch();
        Some(server)
    }

    /// The folder holding the server's data and socket.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn tool(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn init(&self) {
        let output = self
            .tool("initdb")
            .arg("-D")
            .arg(self.data())
            .args([
                "-U",
                "kernel",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .output()
            .expect("initdb runs");
        assert!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Starts the server on a free port, trying another if the one chosen was taken meanwhile.
    fn launch(&mut self) {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            if self.pg_start(port) {
                self.port = port;
                self.url = format!("postgres://kernel@127.0.0.1:{port}/postgres");
                return;
            }
            last = self.log();
        }
        panic!("PostgreSQL did not start: {last}");
    }

    fn pg_start(&self, port: u16) -> bool {
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300",
            self.dir.path().display()
        );
        self.tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .output()
            .expect("pg_ctl runs")
            .status
            .success()
    }

    /// Stops the server at once (`pg_ctl -m immediate`, as a crash would), then starts it again
    /// on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        assert!(self.pg_start(self.port), "PostgreSQL did not restart: {}", self.log());
    }

    /// Stops the server at once, as a crash would.
    pub fn stop(&self) {
        let _ = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A client connection (its connection task on the current runtime).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", self.url));
        tokio::spawn(connection);
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The newest installed server's binaries: `/usr/lib/postgresql/<version>/bin`, or initdb's folder
/// on PATH.
fn find_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
}

/// The user to run PostgreSQL as: `postgres` when the tests run as root, else the tests' own.
fn postgres_user() -> Option<String> {
    let uid = id(&["-u"]);
    if uid != "0" {
        return None;
    }
    assert!(
        Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .is_ok_and(|o| o.status.success()),
        "running as root, PostgreSQL needs the 'postgres' user (Debian's postgresql package creates it)"
    );
    Some("postgres".into())
}

fn chown_to(path: &Path, user: &str) {
    let uid: u32 = id(&["-u", user]).parse().expect("a numeric uid");
    let gid: u32 = id(&["-g", user]).parse().expect("a numeric gid");
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown the server's folder");
}

fn id(args: &[&str]) -> String {
    let output = Command::new("id").args(args).output().expect("id runs");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}
