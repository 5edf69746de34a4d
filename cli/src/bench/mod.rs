//! `kernelctl bench`: how fast a running kernel records and runs tool calls, like
//! `redis-benchmark` or `pgbench` for this project.
//!
//! The command opens `W` worker sessions in this process ([`workers`]), drives runs as an agent
//! over a few HTTP/2 connections ([`driver`]), times every call, and reports each section
//! ([`report`]) as a table or JSON. Percentiles come from every recorded latency ([`stats`]);
//! [`progress`] keeps stderr informed while it runs. The command itself, which ties these
//! together, is `crate::commands::bench`.

pub mod console;
pub mod driver;
pub mod floor;
pub mod hosted;
pub mod progress;
pub mod report;
pub mod stats;
pub mod sustained;
pub mod workers;

use std::fmt;
use std::str::FromStr;

use clap::{Args, ValueEnum};
use worker_sdk::WorkerError;

use crate::error::CliError;

/// One part of the benchmark, selectable with `--sections`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Section {
    /// This machine's floors, before the kernel is driven: a 4 KiB append synced to disk, a
    /// sleeping thread woken and answering, a loopback TCP round trip.
    Floor,
    /// One call per turn, one after the other: round-trip latency, for a safe_to_retry tool and
    /// an at_most_once one.
    Sequential,
    /// Concurrent runs, each making one-call turns back to back: calls/s.
    Throughput,
    /// Concurrent runs for a set time: calls/s second by second, and the kernel's CPU, commits
    /// and memory per call.
    Sustained,
    /// One turn of many calls at once.
    Fanout,
    /// A recorded run's turns submitted again, their results streamed, and another's, each
    /// turn's in one answer: every result served from the log.
    Replay,
    /// Results of growing size: calls/s and MB/s.
    Payload,
    /// Hosted runs: local steps and tool calls live, then replayed from the start on another
    /// host after the first is lost.
    Hosted,
}

/// Flags of `kernelctl bench`. Counts left unset take their defaults, or smaller ones with
/// `--quick`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Smoke run: a few hundred calls in all and a small replay (CI); explicit flags still win.
    #[arg(long)]
    pub quick: bool,

    /// Sections to run, comma-separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',', value_name = "SECTION,...")]
    pub sections: Vec<Section>,

    /// Worker sessions opened by the benchmark; with 100 or more, the report gives the kernel's
    /// resident memory per session.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub workers: u32,

    /// Samples of each of the floor section's measures [default: 1000; --quick 100].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub floor: Option<u32>,

    /// Where the floor section measures the disk's sync (a file made there and removed): a
    /// directory on the kernel's disk.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub floor_dir: std::path::PathBuf,

    /// Calls of the sequential section, one per turn, for each of its two tools (declared
    /// safe_to_retry, then at_most_once) [default: 2000; --quick 50].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub sequential: Option<u32>,

    /// Concurrent runs of each throughput level [default: 1,16,64,256; --quick 1,16].
    #[arg(long, value_delimiter = ',', value_name = "C,...", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: Option<Vec<u32>>,

    /// Calls per throughput level, shared by its runs [default: 5000; --quick 100].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub calls: Option<u32>,

    /// How long the sustained section runs, e.g. `60s` [default: 60s; --quick 2s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub sustained_for: Option<std::time::Duration>,

    /// Concurrent runs of the sustained section.
    #[arg(long, default_value_t = 64, value_name = "C", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub sustained_concurrency: u32,

    /// Turns one run of the throughput, sustained and payload sections makes before its place
    /// goes to a new run; at most the kernel's `--max-turns-per-run` (10,000 by default).
    #[arg(long, default_value_t = 5_000, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub turns_per_run: u32,

    /// After the sustained section, wait this long with nothing running and report the kernel's
    /// resident memory then, e.g. `60s` [default: none].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub settle: Option<std::time::Duration>,

    /// Calls in the one turn of the fan-out section [default: 100; --quick 20].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub fanout: Option<u32>,

    /// Times the fan-out turn is made, each in a new turn [default: 5; --quick 2].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub fanout_turns: Option<u32>,

    /// Turns of the recorded run that the replay section resubmits [default: 100; --quick 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub replay_turns: Option<u32>,

    /// Calls per turn of that run [default: 100; --quick 20].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub replay_calls: Option<u32>,

    /// Result sizes (as recorded, JSON) of the payload section, e.g. `100,10KiB,1MiB`
    /// [default: 100,10KiB,1MiB].
    #[arg(long, value_delimiter = ',', value_name = "SIZE,...")]
    pub payloads: Option<Vec<ByteSize>>,

    /// Calls per payload size, at most 64 MiB of results each [default: 500; --quick 10].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub payload_calls: Option<u32>,

    /// Concurrent runs of the payload section.
    #[arg(long, default_value_t = 16, value_name = "C", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub payload_concurrency: u32,

    /// Local steps of the hosted section's runs [default: 1000; --quick 50].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4000))]
    pub hosted_steps: Option<u32>,

    /// Tool calls of the hosted section's runs [default: 1000; --quick 50].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4000))]
    pub hosted_calls: Option<u32>,

    /// Gives every run the benchmark makes this budget limit (repeatable, as `runs start
    /// --budget`): what a budgeted call costs beside a plain one. Set it high enough that no call
    /// passes it (`calls=1000000000`).
    #[arg(long = "budget", value_name = "LIMIT", value_parser = crate::args::parse_budget)]
    pub budget: Vec<kernel_proto::v1::BudgetLimit>,

    /// The kernel's web console (its `--http-listen`, e.g. `http://127.0.0.1:8080`): the replay
    /// section's run (10,000 steps by default) is then read from it, its first, middle and last
    /// page of steps and its live part timed; sent the `--api-key` when there is one.
    #[arg(long, value_name = "URL")]
    pub console: Option<String>,

    /// Times each console page is fetched [default: 20; --quick 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub console_rounds: Option<u32>,
}

/// Results of one payload size are capped at this many bytes per size.
const PAYLOAD_BUDGET: u64 = 64 << 20;

/// What one benchmark invocation runs: [`BenchArgs`] with every default resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub workers: u32,
    /// Samples of each floor, and where the sync is measured.
    pub floor: Option<(u32, std::path::PathBuf)>,
    /// Turns a run of a concurrent section makes before a new run takes its place.
    pub turns_per_run: u32,
    pub sequential: Option<u32>,
    pub throughput: Option<(Vec<u32>, u32)>,
    /// Concurrency, length and settle time of the sustained section.
    pub sustained: Option<(u32, std::time::Duration, Option<std::time::Duration>)>,
    pub fanout: Option<(u32, u32)>,
    pub replay: Option<(u32, u32)>,
    /// The console's URL and rounds, to read the replay section's run from.
    pub console: Option<(String, u32)>,
    /// Sizes with the calls each makes, and the concurrency.
    pub payload: Option<(Vec<(ByteSize, u32)>, u32)>,
    /// Local steps and tool calls of the hosted runs.
    pub hosted: Option<(u32, u32)>,
}

impl Plan {
    pub fn new(args: &BenchArgs) -> Plan {
        let quick = args.quick;
        let pick = |value: Option<u32>, full: u32, small: u32| value.unwrap_or(if quick { small } else { full });
        let wants = |section| args.sections.is_empty() || args.sections.contains(&section);
        let payload_calls = pick(args.payload_calls, 500, 10);
        let sizes = args
            .payloads
            .clone()
            .unwrap_or_else(|| vec![ByteSize(100), ByteSize(10 << 10), ByteSize(1 << 20)]);
        Plan {
            workers: args.workers,
            turns_per_run: args.turns_per_run,
            floor: wants(Section::Floor).then(|| (pick(args.floor, 1000, 100), args.floor_dir.clone())),
            sequential: wants(Section::Sequential).then(|| pick(args.sequential, 2000, 50)),
            throughput: wants(Section::Throughput).then(|| {
                let levels = args
                    .concurrency
                    .clone()
                    .unwrap_or_else(|| if quick { vec![1, 16] } else { vec![1, 16, 64, 256] });
                (levels, pick(args.calls, 5000, 100))
            }),
            sustained: wants(Section::Sustained).then(|| {
                let length = args
                    .sustained_for
                    .unwrap_or(std::time::Duration::from_secs(if quick { 2 } else { 60 }));
                (args.sustained_concurrency, length, args.settle)
            }),
            fanout: wants(Section::Fanout).then(|| (pick(args.fanout, 100, 20), pick(args.fanout_turns, 5, 2))),
            replay: wants(Section::Replay).then(|| (pick(args.replay_turns, 100, 5), pick(args.replay_calls, 100, 20))),
            console: (args.console.clone())
                .filter(|_| wants(Section::Replay))
                .map(|url| (url, pick(args.console_rounds, 20, 3))),
            payload: wants(Section::Payload).then(|| {
                let sizes = sizes
                    .into_iter()
                    .map(|size| {
                        let budget = (PAYLOAD_BUDGET / size.0.max(1)).max(1);
                        (size, u64::from(payload_calls).min(budget) as u32)
                    })
                    .collect();
                (sizes, args.payload_concurrency)
            }),
            hosted: wants(Section::Hosted)
                .then(|| (pick(args.hosted_steps, 1000, 50), pick(args.hosted_calls, 1000, 50))),
        }
    }

    /// The most calls in flight at once in any section: each worker gets that many slots, so
    /// worker capacity never bounds a figure.
    pub fn peak_concurrency(&self) -> u32 {
        [
            self.sequential.map(|_| 1),
            self.throughput
                .as_ref()
                .and_then(|(levels, _)| levels.iter().max().copied()),
            self.sustained.map(|(concurrency, _, _)| concurrency),
            self.fanout.map(|(calls, _)| calls),
            self.replay.map(|(_, calls)| calls),
            self.payload.as_ref().map(|(_, concurrency)| *concurrency),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(1)
    }
}

/// A length of time: `250ms`, `30s`, `5m`, or whole seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    match kernel_proto::duration::parse_millis(text)? {
        0 => Err("give a positive duration".into()),
        ms => Ok(std::time::Duration::from_millis(ms)),
    }
}

/// A size in bytes, parsed from `100`, `100B`, `10KiB`, `10k`, `1MiB` or `1M` (powers of 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let raw = raw.trim();
        let digits = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
        let (number, unit) = raw.split_at(digits);
        let number: u64 = number
            .parse()
            .map_err(|_| format!("'{raw}' is not a size like 100, 10KiB or 1MiB"))?;
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            other => return Err(format!("unknown size unit '{other}' in '{raw}'; use B, KiB or MiB")),
        };
        let bytes = number
            .checked_mul(scale)
            .filter(|b| *b <= workers::MAX_PAYLOAD)
            .ok_or_else(|| format!("'{raw}' is larger than {} MiB", workers::MAX_PAYLOAD >> 20))?;
        Ok(ByteSize(bytes))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
            write!(f, "{} MiB", bytes >> 20)
        } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
            write!(f, "{} KiB", bytes >> 10)
        } else {
            write!(f, "{bytes} B")
        }
    }
}

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The kernel is unreachable, answered with an error status, or stdout failed.
    #[error(transparent)]
    Cli(#[from] CliError),

    /// A bench worker could not be built or was refused by the kernel.
    #[error("bench worker: {0}")]
    Worker(WorkerError),

    /// The workers never all connected, or one stopped early.
    #[error("{0}")]
    Setup(String),

    /// A call that should have succeeded did not.
    #[error("a {tool} call failed ({status}): {content}")]
    CallFailed {
        tool: String,
        status: String,
        content: String,
    },

    /// A turn came back with the wrong number of results, or a result that is not what was asked.
    #[error("unexpected answer from the kernel: {0}")]
    Unexpected(String),

    /// A resubmitted turn ran calls again instead of serving their recorded results.
    #[error(
        "replay failed: turn {turn} of the recorded run came back with {fresh} of {calls} results not replayed; \
         resubmitted calls must be served from the log"
    )]
    NotReplayed { turn: u32, fresh: usize, calls: usize },

    /// A turn took longer than any benchmark call should.
    #[error("a turn got no result within {0}s; is the kernel overloaded or wedged?")]
    Stalled(u64),
}

impl From<tonic::Status> for BenchError {
    fn from(status: tonic::Status) -> Self {
        BenchError::Cli(CliError::from(status))
    }
}

impl From<std::io::Error> for BenchError {
    fn from(error: std::io::Error) -> Self {
        BenchError::Cli(CliError::from(error))
    }
}

impl BenchError {
    /// A reader that went away (`| head`) is not a failure of the command.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, BenchError::Cli(error) if error.is_broken_pipe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> BenchArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            bench: BenchArgs,
        }
        Wrapper::try_parse_from(std::iter::once("bench").chain(extra.iter().copied()))
            .unwrap()
            .bench
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!("100".parse::<ByteSize>(), Ok(ByteSize(100)));
        assert_eq!("100B".parse::<ByteSize>(), Ok(ByteSize(100)));
        assert_eq!("10KiB".parse::<ByteSize>(), Ok(ByteSize(10 << 10)));
        assert_eq!("10k".parse::<ByteSize>(), Ok(ByteSize(10 << 10)));
        assert_eq!("1MiB".parse::<ByteSize>(), Ok(ByteSize(1 << 20)));
        assert_eq!(" 2 M ".parse::<ByteSize>(), Ok(ByteSize(2 << 20)));
        assert!("1GiB".parse::<ByteSize>().unwrap_err().contains("unknown size unit"));
        assert!("MiB".parse::<ByteSize>().is_err());
        assert!("65MiB".parse::<ByteSize>().unwrap_err().contains("larger than 64 MiB"));
        assert_eq!(ByteSize(100).to_string(), "100 B");
        assert_eq!(ByteSize(10 << 10).to_string(), "10 KiB");
        assert_eq!(ByteSize(1 << 20).to_string(), "1 MiB");
        assert_eq!(ByteSize(1500).to_string(), "1500 B");
    }

    #[test]
    fn the_default_plan_is_the_full_benchmark() {
        let plan = Plan::new(&args(&[]));
        assert_eq!(plan.workers, 4);
        assert_eq!(plan.turns_per_run, 5_000);
        assert_eq!(plan.floor, Some((1000, std::path::PathBuf::from("."))));
        assert_eq!(plan.sequential, Some(2000));
        assert_eq!(plan.throughput, Some((vec![1, 16, 64, 256], 5000)));
        assert_eq!(plan.sustained, Some((64, std::time::Duration::from_secs(60), None)));
        assert_eq!(plan.fanout, Some((100, 5)));
        assert_eq!(plan.replay, Some((100, 100)));
        let (sizes, concurrency) = plan.payload.clone().unwrap();
        assert_eq!(concurrency, 16);
        // 1 MiB results are capped at 64 calls (64 MiB).
        assert_eq!(
            sizes,
            vec![(ByteSize(100), 500), (ByteSize(10 << 10), 500), (ByteSize(1 << 20), 64)]
        );
        assert_eq!(plan.peak_concurrency(), 256);
        assert_eq!(plan.hosted, Some((1000, 1000)));
    }

    #[test]
    fn quick_shrinks_what_flags_leave_unset() {
        let plan = Plan::new(&args(&["--quick", "--sequential", "7"]));
        assert_eq!(plan.sequential, Some(7));
        assert_eq!(plan.floor.map(|(samples, _)| samples), Some(100));
        assert_eq!(plan.throughput, Some((vec![1, 16], 100)));
        assert_eq!(plan.sustained, Some((64, std::time::Duration::from_secs(2), None)));
        assert_eq!(plan.replay, Some((5, 20)));
        assert_eq!(plan.fanout, Some((20, 2)));
        assert!(plan.payload.unwrap().0.iter().all(|(_, calls)| *calls == 10));
        assert_eq!(plan.hosted, Some((50, 50)));
    }

    #[test]
    fn sections_select_what_runs() {
        let plan = Plan::new(&args(&[
            "--sections",
            "sequential,fanout",
            "--fanout",
            "300",
            "--concurrency",
            "2,3",
        ]));
        assert_eq!(plan.sequential, Some(2000));
        assert_eq!(plan.fanout, Some((300, 5)));
        assert_eq!(plan.floor, None);
        assert_eq!(plan.throughput, None);
        assert_eq!(plan.sustained, None);
        assert_eq!(plan.replay, None);
        assert_eq!(plan.payload, None);
        assert_eq!(plan.peak_concurrency(), 300);
    }

    #[test]
    fn the_console_is_read_only_with_the_replay_section() {
        let url = "http://127.0.0.1:8080";
        let with = Plan::new(&args(&["--sections", "replay", "--console", url, "--quick"]));
        assert_eq!(with.console, Some((url.to_owned(), 3)));
        let without = Plan::new(&args(&["--sections", "sequential", "--console", url]));
        assert_eq!(without.console, None);
        assert_eq!(Plan::new(&args(&[])).console, None);
    }
}
