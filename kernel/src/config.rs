//! The kernel's configuration: flags, each also read from a `KERNEL_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::scheduler::SchedulerConfig;
use crate::store::{Database, Durability};

/// The kernel's commands besides serving.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum KernelCommand {
    /// Applies the database's migrations and exits, without serving: to prepare a database or an
    /// upgrade ahead of time (a serving kernel also migrates its database when it starts).
    Migrate,
}

/// A durable tool-execution kernel for AI agents.
#[derive(Clone, Debug, Parser)]
#[command(name = "kernel", version, about)]
pub struct Config {
    /// Address to serve gRPC on; port 0 picks a free port (the chosen address is logged).
    #[arg(long, env = "KERNEL_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Where other replicas and clients reach this kernel, as HOST:PORT (replicas only): listed by
    /// `kernelctl replicas list`. Defaults to the address it listens on, which is wrong when that
    /// is 0.0.0.0 or behind a NAT: give the address others dial.
    #[arg(long, env = "KERNEL_ADVERTISE")]
    pub advertise: Option<String>,

    /// Also serve the kernel's tools to MCP clients over Streamable HTTP on this address, at `/mcp`
    /// (as `kernelctl mcp serve --listen` does); a client's bearer token is its API key. Not yet
    /// with TLS on gRPC.
    #[arg(long, env = "KERNEL_MCP_LISTEN", value_name = "ADDR")]
    pub mcp_listen: Option<SocketAddr>,

    /// An MCP session of `--mcp-listen` that sends and receives nothing for this many milliseconds
    /// is closed and its run completed, as when its client deletes it.
    #[arg(
        long,
        env = "KERNEL_MCP_SESSION_IDLE_TIMEOUT_MS",
        default_value_t = 1_800_000,
        value_name = "MS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub mcp_session_idle_timeout_ms: u64,

    /// Also serve the web console, Prometheus `/metrics`, `/healthz` and `/readyz` over HTTP on
    /// this address (e.g. `127.0.0.1:8080`). With an auth file the console asks for an API key and
    /// `/metrics` needs one with `runs:read`. A non-loopback address needs an auth file or
    /// --insecure; it is plain HTTP, so put a TLS proxy in front of it beyond one machine.
    #[arg(long, env = "KERNEL_HTTP_LISTEN", value_name = "ADDR")]
    pub http_listen: Option<SocketAddr>,

    /// Export OpenTelemetry traces (a span per run and per call attempt) over OTLP/gRPC to this
    /// collector, e.g. `http://127.0.0.1:4317`. Plain gRPC only: run a collector beside the kernel
    /// to forward them further.
    #[arg(long, env = "KERNEL_OTLP_ENDPOINT", value_name = "URL", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// The database: a SQLite file (a path or `sqlite:PATH`; created with its schema on first
    /// start; one kernel per file), or `postgres://USER[:PASSWORD]@HOST:PORT/DB` (migrated at start;
    /// any number of kernels may serve it, as replicas).
    #[arg(long, env = "KERNEL_DB", default_value = "./kernel.db", global = true)]
    pub db: Database,

    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<KernelCommand>,

    /// How hard each commit waits for the disk, on SQLite. `full` syncs every commit but those that
    /// only schedule calls and start `safe_to_retry` ones. On PostgreSQL the server's
    /// `synchronous_commit` decides, and a commit that only starts `safe_to_retry` calls does not
    /// wait for it.
    #[arg(long, env = "KERNEL_DURABILITY", value_enum, default_value = "full")]
    pub durability: Durability,

    /// Milliseconds between worker heartbeats.
    #[arg(long, env = "KERNEL_HEARTBEAT_INTERVAL_MS", default_value_t = 3_000)]
    pub heartbeat_interval_ms: u64,

    /// Milliseconds a silent worker keeps its leases.
    #[arg(long, env = "KERNEL_LEASE_TTL_MS", default_value_t = 10_000)]
    pub lease_ttl_ms: u64,

    /// Milliseconds a statement on PostgreSQL may run before the server cancels it (replicas
    /// only). The other bounds on the database follow the lease TTL: a session idle inside a
    /// transaction for a TTL (at most 2 s) is ended, a lock is waited for at most two TTLs, and a
    /// connection silent for a TTL is dead.
    #[arg(long, env = "KERNEL_POSTGRES_STATEMENT_TIMEOUT_MS", default_value_t = 60_000)]
    pub postgres_statement_timeout_ms: u64,

    /// Milliseconds a call waits for any worker to offer its tool, or for a tool limit to make room,
    /// before it fails.
    #[arg(long, env = "KERNEL_SCHEDULE_TO_START_TIMEOUT_MS", default_value_t = 30_000)]
    pub schedule_to_start_timeout_ms: u64,

    /// Milliseconds between scans of the store for calls the scheduler lost track of (a safety
    /// net: boot recovery and the in-memory paths find everything else; `kernelctl status` counts
    /// what the scans found).
    #[arg(long, env = "KERNEL_SCAN_INTERVAL_MS", default_value_t = 5_000)]
    pub scan_interval_ms: u64,

    /// Delete finished runs (with their events, steps, approvals and the cached results no other
    /// run holds) once they finished this long ago, checked every minute (twice per retention
    /// under two minutes): 30d, 12h, 90m. Without it runs are kept.
    #[arg(long, env = "KERNEL_RETAIN_FINISHED", value_parser = parse_retention)]
    pub retain_finished: Option<Duration>,

    /// Fail, with reason `abandoned`, an external agent's run (not hosted) pending or running
    /// that made no turn for this many milliseconds, after settling its calls in flight as a
    /// cancel does. A blocked run (waiting for a person) is never abandoned. Off by default.
    #[arg(long, env = "KERNEL_ABANDON_RUNS_AFTER_MS", value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub abandon_runs_after_ms: Option<u64>,

    /// Timeout in milliseconds of a call whose tool declares none.
    #[arg(long, env = "KERNEL_DEFAULT_TOOL_TIMEOUT_MS", default_value_t = 30_000)]
    pub default_tool_timeout_ms: u64,

    /// Policy file (YAML): presets and rules deciding allow, deny or ask a person. Reloaded on
    /// SIGHUP and through AdminService.ReloadPolicy. Without one, every call is allowed.
    #[arg(long, env = "KERNEL_POLICY")]
    pub policy: Option<PathBuf>,

    /// Central price of one attempt by tool-name prefix, `PREFIX=PRICE` (repeatable, or
    /// comma-separated in the environment); applies to tools that declare no cost_per_call; the
    /// longest prefix wins.
    #[arg(long = "unit-price", env = "KERNEL_UNIT_PRICES", value_delimiter = ',', value_parser = parse_unit_price)]
    pub unit_prices: Vec<(String, f64)>,

    /// Certificate chain (PEM) to serve gRPC over TLS, and then only over TLS; needs --tls-key.
    #[arg(long, env = "KERNEL_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "KERNEL_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA certificates (PEM) that sign client certificates: a client presenting one is verified,
    /// and worker sessions must present one. Needs --tls-cert and --tls-key.
    #[arg(long, env = "KERNEL_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Auth file (YAML) of API keys: each a name, the SHA-256 of its secret, its scopes and, for
    /// workers, the tools it may register; and optionally (`oauth:`) an authorization server
    /// whose access tokens are accepted too. Reloaded on SIGHUP. Without one every request is
    /// allowed, and only on loopback unless --insecure.
    #[arg(long, env = "KERNEL_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,

    /// The ed25519 key the kernel signs receipts of runs' calls with (`kernelctl runs receipts`):
    /// a file holding its 32-byte seed as 64 hex digits, created with a new key when it does not
    /// exist. Without it, `<db>.receipt-key` beside a SQLite file; replicas on PostgreSQL need it,
    /// and one file shared by all, so each signs with the same key.
    #[arg(long, env = "KERNEL_RECEIPT_KEY", value_name = "FILE")]
    pub receipt_key: Option<PathBuf>,

    /// The key the kernel keeps tools' secret fields with (a tool's `secret` option, or a schema's
    /// `writeOnly`/`format: password`): it records a keyed hash in a secret value's place and keeps
    /// an argument's value sealed until its dispatch. A file holding a 32-byte seed as 64 hex
    /// digits, created with a new key when it does not exist. Without it, `<db>.secret-key` beside a
    /// SQLite file; replicas on PostgreSQL need it, one file shared by all, or they refuse calls
    /// that carry secret values. Keep it out of the database's backups: it is what opens them.
    #[arg(long, env = "KERNEL_SECRET_KEY", value_name = "FILE")]
    pub secret_key: Option<PathBuf>,

    /// Allow --listen on a non-loopback address without --auth-file.
    #[arg(long, env = "KERNEL_INSECURE")]
    pub insecure: bool,

    /// Milliseconds a graceful stop (SIGINT/SIGTERM) drains at most: calls running on workers may
    /// finish while new turns are refused.
    #[arg(long, env = "KERNEL_DRAIN_TIMEOUT_MS", default_value_t = 5_000)]
    pub drain_timeout_ms: u64,

    /// Largest arguments of one call, in bytes of JSON text; a turn with bigger ones is refused.
    #[arg(long, env = "KERNEL_MAX_ARGUMENT_BYTES", help_heading = "Limits", default_value_t = crate::limits::MIB)]
    pub max_argument_bytes: usize,

    /// Largest result a worker may return for one call, in bytes: a bigger one fails that call
    /// (`fatal`, not retried) with an error naming the tool and the limit, and the worker's session
    /// goes on. A longer error message is cut to it.
    #[arg(long, env = "KERNEL_MAX_RESULT_BYTES", help_heading = "Limits", default_value_t = crate::limits::MIB)]
    pub max_result_bytes: usize,

    /// Most calls one turn may carry; a turn with more is refused.
    #[arg(
        long,
        env = "KERNEL_MAX_CALLS_PER_TURN",
        help_heading = "Limits",
        default_value_t = 256
    )]
    pub max_calls_per_turn: usize,

    /// Most turns per run: a turn's number must be below it.
    #[arg(
        long,
        env = "KERNEL_MAX_TURNS_PER_RUN",
        help_heading = "Limits",
        default_value_t = 10_000
    )]
    pub max_turns_per_run: u32,

    /// Most events one run's log may hold; a turn that could overflow it (at 3 events a call) is
    /// refused.
    #[arg(
        long,
        env = "KERNEL_MAX_EVENTS_PER_RUN",
        help_heading = "Limits",
        default_value_t = 1_000_000
    )]
    pub max_events_per_run: u64,

    /// Largest gRPC message the kernel decodes, in bytes; a worker session sending a bigger one
    /// ends with a status naming this flag.
    #[arg(long, env = "KERNEL_MAX_MESSAGE_BYTES", help_heading = "Limits", default_value_t = 8 * crate::limits::MIB)]
    pub max_message_bytes: usize,

    /// Most worker sessions open at once (those yet to say hello count); a new one beyond it is
    /// refused.
    #[arg(long, env = "KERNEL_MAX_SESSIONS", help_heading = "Limits", default_value_t = 1_024)]
    pub max_sessions: usize,

    /// Most calls of one run not yet settled; a turn that would leave more is refused (a call
    /// submitted again joins its first, it does not count twice).
    #[arg(
        long,
        env = "KERNEL_MAX_PENDING_CALLS_PER_RUN",
        help_heading = "Limits",
        default_value_t = 1_024
    )]
    pub max_pending_calls_per_run: usize,

    /// Progress messages per second one worker session may send; the excess is dropped (0: no limit).
    #[arg(
        long,
        env = "KERNEL_PROGRESS_PER_SECOND",
        help_heading = "Limits",
        default_value_t = 200
    )]
    pub progress_per_second: u32,

    /// Heartbeats per second one worker session may send; the excess is dropped (0: no limit).
    #[arg(
        long,
        env = "KERNEL_HEARTBEATS_PER_SECOND",
        help_heading = "Limits",
        default_value_t = 20
    )]
    pub heartbeats_per_second: u32,

    /// How long a worker that opens a session has to say hello, in milliseconds; the session holds
    /// one of `--max-sessions` places meanwhile, and is closed with `DEADLINE_EXCEEDED` after it.
    #[arg(
        long,
        env = "KERNEL_HELLO_TIMEOUT_MS",
        help_heading = "Limits",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub hello_timeout_ms: u64,
}

fn parse_retention(text: &str) -> Result<Duration, String> {
    match kernel_proto::duration::parse_millis(text)? {
        0 => Err("a retention of 0 would delete every run as it finishes; give a positive duration".into()),
        ms => Ok(Duration::from_millis(ms)),
    }
}

/// An OTLP/gRPC collector's address: `http://HOST:PORT` (the exporter speaks no TLS).
fn otlp_endpoint(text: &str) -> Result<String, String> {
    let uri: tonic::codegen::http::Uri = text
        .parse()
        .map_err(|error| format!("'{text}' is not a URL: {error}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(_)) => Ok(text.trim_end_matches('/').to_owned()),
        (Some("https"), _) => Err(format!(
            "'{text}': the exporter speaks plain gRPC only; run an OpenTelemetry Collector beside the kernel \
             (http://127.0.0.1:4317) and let it forward over TLS"
        )),
        _ => Err(format!("'{text}' is not http://HOST:PORT")),
    }
}

fn parse_unit_price(text: &str) -> Result<(String, f64), String> {
    let (prefix, price) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}' is not PREFIX=PRICE"))?;
    let price: f64 = price.trim().parse().map_err(|_| format!("'{price}' is not a price"))?;
    if !price.is_finite() || price < 0.0 {
        return Err(format!("'{price}' is not a price >= 0"));
    }
    Ok((prefix.trim().to_owned(), price))
}

impl Config {
    /// The scheduler's timing.
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms.max(10)),
            lease_ttl: Duration::from_millis(self.lease_ttl_ms.max(self.heartbeat_interval_ms * 2).max(20)),
            schedule_to_start_timeout: Duration::from_millis(self.schedule_to_start_timeout_ms),
            scan_interval: Duration::from_millis(self.scan_interval_ms.max(10)),
            ..SchedulerConfig::default()
        }
    }

    /// The bounds on every wait on PostgreSQL (replicas only).
    pub fn postgres_bounds(&self) -> crate::store::postgres::Bounds {
        crate::store::postgres::Bounds::for_lease_ttl(
            self.scheduler().lease_ttl,
            Duration::from_millis(self.postgres_statement_timeout_ms.max(1)),
        )
    }

    /// The limits on agents, workers and connections.
    pub fn limits(&self) -> crate::limits::Limits {
        crate::limits::Limits {
            max_argument_bytes: self.max_argument_bytes,
            max_result_bytes: self.max_result_bytes,
            max_calls_per_turn: self.max_calls_per_turn,
            max_turns_per_run: self.max_turns_per_run,
            max_events_per_run: self.max_events_per_run,
            max_message_bytes: self.max_message_bytes,
            max_sessions: self.max_sessions,
            max_pending_calls_per_run: self.max_pending_calls_per_run,
            progress_per_second: self.progress_per_second,
            heartbeats_per_second: self.heartbeats_per_second,
            hello_timeout: Duration::from_millis(self.hello_timeout_ms),
        }
    }

    /// A configuration for tests: port 0 and the given database.
    pub fn for_tests(db: PathBuf) -> Self {
        Config::parse_from([
            "kernel",
            "--listen",
            "127.0.0.1:0",
            "--db",
            db.to_str().expect("utf-8 path"),
        ])
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn an_otlp_endpoint_is_a_plain_grpc_address() {
        assert_eq!(
            otlp_endpoint("http://127.0.0.1:4317/"),
            Ok("http://127.0.0.1:4317".into())
        );
        let tls = otlp_endpoint("https://collector:4317").unwrap_err();
        assert!(tls.contains("plain gRPC only"), "{tls}");
        for bad in ["127.0.0.1:4317", "collector", "ftp://collector:21", "http://"] {
            assert!(otlp_endpoint(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn every_kernel_command_line_in_the_docs_parses() {
        crate::docs_commands::assert_every_command_line_parses::<Config>("kernel", 5);
    }
}
