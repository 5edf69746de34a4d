//! The kernel's configuration: flags, each also read from a `KERNEL_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::scheduler::SchedulerConfig;
use crate::store::Durability;

/// A durable tool-execution kernel for AI agents.
#[derive(Clone, Debug, Parser)]
#[command(name = "kernel", version, about)]
pub struct Config {
    /// Address to serve gRPC on; port 0 picks a free port (the chosen address is logged).
    #[arg(long, env = "KERNEL_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// SQLite database file; created with its schema on first start.
    #[arg(long, env = "KERNEL_DB", default_value = "./kernel.db")]
    pub db: PathBuf,

    /// How hard each commit waits for the disk.
    #[arg(long, env = "KERNEL_DURABILITY", value_enum, default_value = "full")]
    pub durability: Durability,

    /// Milliseconds between worker heartbeats.
    #[arg(long, env = "KERNEL_HEARTBEAT_INTERVAL_MS", default_value_t = 3_000)]
    pub heartbeat_interval_ms: u64,

    /// Milliseconds a silent worker keeps its leases.
    #[arg(long, env = "KERNEL_LEASE_TTL_MS", default_value_t = 10_000)]
    pub lease_ttl_ms: u64,

    /// Milliseconds a call waits for any worker to offer its tool before it fails.
    #[arg(long, env = "KERNEL_SCHEDULE_TO_START_TIMEOUT_MS", default_value_t = 30_000)]
    pub schedule_to_start_timeout_ms: u64,

    /// Timeout in milliseconds of a call whose tool declares none.
    #[arg(long, env = "KERNEL_DEFAULT_TOOL_TIMEOUT_MS", default_value_t = 30_000)]
    pub default_tool_timeout_ms: u64,

    /// Policy file (YAML): presets and rules deciding allow, deny or ask a person. Reloaded on
    /// SIGHUP and through AdminService.ReloadPolicy. Without one, every call is allowed.
    #[arg(long, env = "KERNEL_POLICY")]
    pub policy: Option<PathBuf>,

    /// Central unit price by tool-name prefix, `PREFIX=PRICE` (repeatable, or comma-separated in
    /// the environment); applies to tools that declare no cost_per_call; the longest prefix wins.
    #[arg(long = "unit-price", env = "KERNEL_UNIT_PRICES", value_delimiter = ',', value_parser = parse_unit_price)]
    pub unit_prices: Vec<(String, f64)>,

    /// Milliseconds to wait for open streams to end on SIGINT/SIGTERM.
    #[arg(long, env = "KERNEL_DRAIN_TIMEOUT_MS", default_value_t = 5_000)]
    pub drain_timeout_ms: u64,
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
            ..SchedulerConfig::default()
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
