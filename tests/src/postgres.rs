//! A real PostgreSQL server for the tests, in a temporary folder: `initdb` and `pg_ctl` from
//! Debian's `postgresql` package, run as the `postgres` user when the tests run as root (initdb
//! refuses root). Each server listens on 127.0.0.1 on a port of its own and trusts local
//! connections.
//!
//! Most tests take a database of their own on one server shared by the whole test process
//! ([`Postgres::database`]): started on first use, and stopped by a watcher process once the test
//! process has exited, however it exited. A test that stops or restarts the server starts one of
//! its own ([`Postgres::start`]), stopped (immediately) when dropped.
//!
//! Where PostgreSQL is not installed, both say so loudly on stderr and return `None`, and the test
//! returns early; with `KERNEL_REQUIRE_POSTGRES=1` (as `.ci/run` sets) they fail instead, so CI
//! never skips these tests.

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

/// A PostgreSQL database for one test: on a server of its own, or on the shared one.
pub struct Postgres {
    /// The test's own server; `None` for a database on the shared server.
    server: Option<Server>,
    /// The database's URL, a superuser's: `postgres://kernel@127.0.0.1:PORT/NAME`.
    pub url: String,
}

/// A running server in a temporary folder.
struct Server {
    dir: tempfile::TempDir,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
}

/// The process's shared server: the URL of its `postgres` database, or why there is none.
static SHARED: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();

impl Postgres {
    /// Starts a server of the test's own; `None` when PostgreSQL is not installed and not required.
    pub fn start(test: &str) -> Option<Postgres> {
        let server = Server::start().map_err(|message| skip(test, &message)).ok()?;
        let url = format!("postgres://kernel@127.0.0.1:{}/postgres", server.port);
        Some(Postgres {
            server: Some(server),
            url,
        })
    }

    /// A fresh database for `test` on the server shared by the test process (the suite's server
    /// when `KERNEL_TEST_POSTGRES` names one); `None` when PostgreSQL is not installed and not
    /// required.
    pub fn database(test: &str) -> Option<Postgres> {
        let shared = SHARED.get_or_init(|| match std::env::var(SUITE_SERVER) {
            Ok(url) => Ok(url),
            Err(_) => Server::start().map(Server::share),
        });
        match shared {
            Ok(server) => Some(Postgres {
                server: None,
                url: fresh_database(server),
            }),
            Err(message) => {
                skip(test, message);
                None
            }
        }
    }

    fn own(&self) -> &Server {
        self.server
            .as_ref()
            .expect("a test that stops or restarts PostgreSQL starts a server of its own (Postgres::start)")
    }

    /// Stops the server at once (`pg_ctl -m immediate`, as a crash would), then starts it again
    /// on the same port and data.
    pub fn restart(&mut self) {
        let server = self.own();
        server.stop();
        assert!(
            server.pg_start(server.port),
            "PostgreSQL did not restart: {}",
            server.log()
        );
    }

    /// Stops the server at once, as a crash would.
    pub fn stop(&self) {
        self.own().stop();
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

/// Says that `test` does not run for want of PostgreSQL, or fails it where PostgreSQL is required.
fn skip(test: &str, message: &str) {
    if std::env::var(REQUIRE).as_deref() == Ok("1") {
        panic!("{message}; {REQUIRE}=1 requires it");
    }
    // Straight to the process's stderr: the test harness captures `eprintln!` of a passing test.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {message}; `apt-get install postgresql` runs it"
    );
}

impl Server {
    /// Makes a folder, runs `initdb` and starts the server; why not, when PostgreSQL is not installed.
    fn start() -> Result<Server, String> {
        let bin = find_bin().ok_or_else(|| {
            "PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin or on PATH)".to_owned()
        })?;
        let run_as = postgres_user();
        let dir = tempfile::Builder::new()
            .prefix("kernel-pg-")
            .tempdir()
            .expect("a temporary folder");
        if let Some(user) = &run_as {
            chown_to(dir.path(), user);
        }
        let mut server = Server {
            dir,
            bin,
            run_as,
            port: 0,
        };
        server.init();
        server.launch();
        Ok(server)
    }

    /// Hands the server to a watcher process that stops it and removes its folder once this
    /// process has exited (statics are never dropped); returns its `postgres` database's URL.
    fn share(self) -> String {
        let stop = self.command_line(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = self.dir.path().display(),
        );
        #[expect(clippy::zombie_processes, reason = "the watcher outlives this process by design")]
        let _watcher = Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the shared server's watcher starts");
        let url = format!("postgres://kernel@127.0.0.1:{}/postgres", self.port);
        // The watcher stops the server and removes the folder: dropping this would do both now.
        std::mem::forget(self);
        url
    }

    /// `tool args...` as one shell command line, as the user the server runs as.
    fn command_line(&self, tool: &str, args: &[&str]) -> String {
        let program = self.bin.join(tool).display().to_string();
        let mut words: Vec<String> = match &self.run_as {
            Some(user) => vec!["runuser".into(), "-u".into(), user.clone(), "--".into(), program],
            None => vec![program],
        };
        words.extend(args.iter().map(|a| (*a).to_owned()));
        words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" ")
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
                return;
            }
            last = self.log();
        }
        panic!("PostgreSQL did not start: {last}");
    }

    fn pg_start(&self, port: u16) -> bool {
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=500",
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

    fn stop(&self) {
        let _ = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }

    /// What the server logged.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

/// A test's own server stops with it; the shared server is its watcher's.
impl Drop for Server {
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
