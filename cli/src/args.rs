//! Command-line grammar: every command, flag and argument of `kernelctl`, parsed with clap.
//!
//! Values are validated here, while parsing, so a bad address or label filter is a usage error
//! (exit 2) before any connection is attempted. The parsed [`Cli`] is handed to
//! [`crate::commands::run`], which knows nothing of how the words were spelled.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kernel_proto::v1::RunStatus;

use crate::bench::BenchArgs;

/// Where the kernel listens when neither `--addr` nor `KERNEL_ADDR` says otherwise.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// Largest page the kernel serves for `ListRuns`.
pub const MAX_RUNS_PAGE: u32 = 1000;

/// Inspect and steer a running kernel: runs, their steps and events, tools and workers.
#[derive(Debug, Parser)]
#[command(name = "kernelctl", version, propagate_version = true)]
pub struct Cli {
    /// Kernel gRPC address, `http://host:port` or `host:port` (plaintext), or `https://host:port`
    /// (TLS, needs --tls-ca).
    #[arg(
        long,
        global = true,
        env = "KERNEL_ADDR",
        default_value = DEFAULT_ADDR,
        value_name = "URL"
    )]
    pub addr: KernelAddr,

    /// CA certificate (PEM) that signed the kernel's TLS certificate; for an https:// address.
    #[arg(long, global = true, env = "KERNEL_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// API key for a kernel started with --auth-file; sent as `authorization: Bearer <key>`.
    #[arg(
        long,
        global = true,
        env = "KERNEL_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<String>,

    /// Print machine-readable JSON to stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs: start, list, show, read their event logs, fork, compare, cancel.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Tools registered with the kernel.
    #[command(subcommand)]
    Tools(ToolsCommand),
    /// Worker sessions connected to the kernel.
    #[command(subcommand)]
    Workers(WorkersCommand),
    /// Calls parked for a person's approval: list, approve, reject.
    #[command(subcommand)]
    Approvals(ApprovalsCommand),
    /// Kernel replicas sharing the database, with the shards each owns (needs admin).
    #[command(subcommand)]
    Replicas(ReplicasCommand),
    /// What the kernel holds now: sessions, queued and leased calls, live runs, memory (needs admin).
    Status,
    /// The tool limits (the policy file's, then those tools declare): each with its rate, bound, the
    /// calls running under it, the tokens left and the calls waiting for it (needs admin).
    Limits,
    /// The policy file's fair shares: the label whose value is a run's share, and each share with
    /// its weight and the calls waiting (needs admin).
    Shares,
    /// Measure the kernel: round-trip latency, throughput, replay and payload sizes.
    Bench(BenchArgs),
    /// API keys for the kernel's auth file; works offline, without a kernel.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Receipts of runs' calls, exported with `runs receipts`: check them offline.
    #[command(subcommand)]
    Receipts(ReceiptsCommand),
    /// The kernel's tools for MCP clients.
    #[command(subcommand)]
    Mcp(McpCommand),
}

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Serve the tools connected workers offer to an MCP client: on stdin and stdout, or with
    /// --listen over Streamable HTTP at /mcp, at MCP 2025-11-25 (each session's calls go in a run of
    /// its own) and 2026-07-28 (each call in a run of its own or the run its `_meta` names).
    Serve(McpServeArgs),
}

#[derive(Debug, clap::Args)]
pub struct McpServeArgs {
    /// Serve Streamable HTTP on this address (`127.0.0.1:8080`) at `/mcp` instead of stdio; a
    /// client's bearer token is the API key its calls are made with.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Offer only tools whose names match one of these globs (repeatable).
    #[arg(long, value_name = "GLOB")]
    pub allow: Vec<String>,
    /// A label on every run the bridge creates, `key=value` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_label)]
    pub label: Vec<(String, String)>,
    /// With --listen: a session that sends and receives nothing this many milliseconds is closed
    /// and its run completed, as when its client deletes it.
    #[arg(long, value_name = "MS", default_value_t = 1_800_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub session_idle_timeout_ms: u64,
    /// With --listen, when the kernel accepts an OAuth authorization server's access tokens (its
    /// auth file's `oauth:`): the URL clients reach this `/mcp` at, the `audience` of those tokens.
    /// Published as OAuth protected-resource metadata, and named in every 401.
    #[arg(long, value_name = "URL", requires_all = ["listen", "authorization_server"])]
    pub resource: Option<String>,
    /// The authorization server that issues the tokens (its issuer URL, the auth file's
    /// `oauth.issuer`), named in the metadata; with --resource.
    #[arg(long, value_name = "URL", requires = "resource")]
    pub authorization_server: Option<String>,
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("'{text}' is not key=value")),
    }
}

#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// Check a file of receipts (`runs receipts RUN > FILE`) without a kernel: each receipt's
    /// hash and signature, and the chain from the first to the last. Exits 1, naming the line,
    /// at the first that fails.
    Verify {
        /// The file, one receipt a line; `-` reads stdin.
        file: PathBuf,
        /// The public key (hex) the receipts must be signed with, as the kernel that signed them
        /// prints it; without it, the key the receipts name is taken on trust.
        #[arg(long, value_name = "HEX")]
        key: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a new key: prints its secret once on stdout, and on stderr the entry to add to the
    /// kernel's auth file (which stores only the secret's SHA-256).
    Create(KeyCreateArgs),
}

/// Every scope a key may carry; `admin` implies the others.
pub const SCOPES: [&str; 6] = [
    "runs:read",
    "runs:write",
    "tools:call",
    "approvals:write",
    "workers:connect",
    "admin",
];

#[derive(Debug, Args)]
pub struct KeyCreateArgs {
    /// The key's name: recorded as the approver of what the key approves, named in refusals.
    #[arg(long)]
    pub name: String,

    /// A scope the key carries; repeat for several.
    #[arg(long = "scope", required = true, value_parser = clap::builder::PossibleValuesParser::new(SCOPES))]
    pub scopes: Vec<String>,

    /// A tool-name glob a worker holding the key may register (`refund*`, `*`); repeat for several.
    /// Required with `workers:connect`.
    #[arg(long = "tools", value_name = "GLOB")]
    pub tools: Vec<String>,

    /// A permission glob the runs this key creates may hold (`billing:*`); repeat for several.
    /// Needs `runs:write`. A key without grants creates runs without permissions.
    #[arg(long = "grants", value_name = "GLOB")]
    pub grants: Vec<String>,

    /// A group the key's holder belongs to, which a policy rule's `approvers` may name; repeat
    /// for several.
    #[arg(long = "group", value_name = "NAME")]
    pub groups: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Start a run of an agent a worker hosts; the kernel dispatches it to such a worker.
    Start {
        /// The agent, as a worker announced it.
        agent: String,
        /// The run's input, as JSON.
        #[arg(long, default_value = "null")]
        input: String,
        /// Print the run's events until it ends; exit 1 unless it completed.
        #[arg(long, short = 'f')]
        follow: bool,
        /// A limit of the run's budget, any of `calls=N`, `cost=X` and `time=DURATION` (tool run
        /// time, `10m`), optionally on the tools a glob names: `tools=payments_*,calls=10`
        /// (repeatable). A call past it does not run.
        #[arg(long = "budget", value_name = "LIMIT", value_parser = parse_budget)]
        budget: Vec<kernel_proto::v1::BudgetLimit>,
        /// A label on the run, `key=value` (repeatable): what `runs list --label` finds it by, and
        /// what the policy's budgets and fair shares read.
        #[arg(long, value_name = "KEY=VALUE", value_parser = parse_label)]
        label: Vec<(String, String)>,
    },
    /// List runs, newest first.
    #[command(alias = "ls")]
    List(ListRunsArgs),
    /// Show a run and the subagent runs under it, with their status.
    Tree {
        /// Run id.
        id: String,
    },
    /// Show one run and every step it recorded.
    Show {
        /// Run id.
        id: String,
    },
    /// Print a run's event log, optionally following it live.
    Events(EventsArgs),
    /// Branch a recorded run; prints the branch's id.
    ///
    /// The branch is a new run that replays its parent's recorded steps up to the fork point,
    /// with a new input or some results replaced if asked. In it only reads run live: any other
    /// effect the parent never recorded is refused with write_tool_blocked, which ends the branch.
    Fork(ForkArgs),
    /// Compare two runs step by step, such as a branch and the run it was forked from.
    Diff {
        /// The first run (for a branch, usually its parent).
        a: String,
        /// The second run, whose steps are marked relative to the first's.
        b: String,
    },
    /// Cancel a run: its in-flight calls are settled first.
    Cancel {
        /// Run id.
        id: String,
        /// Why the run is cancelled; recorded in its log.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel one call in flight and leave its run going: the call ends with one result, status
    /// cancelled, that its turn reads as `cancelled: <reason>`. A settled call is refused.
    CancelCall {
        /// Run id.
        run: String,
        /// The call's step key (`t2/p0`, or `id:<call id>`), as `runs show` lists it.
        step: String,
        /// Why the call is cancelled; recorded in its result.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Print a signed receipt of each settled call of the run, one JSON object a line, in the
    /// order the calls settled: identity, tool, hashes of arguments and result, outcome, what
    /// decided it, times; chained and signed with the kernel's key. `receipts verify` checks them.
    Receipts {
        /// Run id.
        run: String,
    },
    /// Answer a question the run's code put to a person (a hosted handler's or a tool body's
    /// `ctx.ask`) with JSON that meets its schema; the code that asked gets it back.
    Answer {
        /// Run id.
        run: String,
        /// The question's step key (`question:agent#0`, `question:t2/p0#0`), as `runs show` lists
        /// it, or its approval id.
        question: String,
        /// The answer, as JSON (as `approvals answer --with`).
        #[arg(long = "with", value_name = "JSON", value_parser = parse_json)]
        answer: String,
        /// Who answers; recorded with the answer. Defaults to $USER. A kernel that requires API
        /// keys records the key's name instead.
        #[arg(long = "as", env = "USER")]
        decider: String,
        /// Why; recorded with the answer.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete a finished run with its events, steps, approvals and the cached results no other run
    /// holds (needs admin);
    /// a run in flight is refused.
    Delete {
        /// Run id.
        id: String,
    },
    /// Delete every run that finished more than DURATION ago (needs admin).
    Prune {
        /// How long ago: 30d, 12h, 90m, 3600s (or 0 for every finished run).
        #[arg(long, value_name = "DURATION", value_parser = parse_age)]
        finished_before: u64,
    },
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The run to branch from.
    pub id: String,

    /// The last of the parent's steps the branch replays, by its key (`t1/p0`, `id:<call id>`,
    /// `step:<id>#<n>`); without it, the parent's whole record.
    #[arg(long = "at", value_name = "STEP")]
    pub at_step_key: Option<String>,

    /// The branch's input, as JSON; without it, the parent's.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    pub input: Option<String>,

    /// Replay this step's recorded result as this JSON instead (repeatable; a step given twice
    /// takes the last).
    #[arg(long = "set-result", value_name = "STEP=JSON", value_parser = parse_set_result)]
    pub set_results: Vec<(String, String)>,

    /// The branch's labels, `key=value` (repeatable); without any, the parent's.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,

    /// Forking again with the same key returns the first branch.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,

    /// A limit of the branch's own budget, as for `runs start` (repeatable); without any, the
    /// parent's limits, with nothing spent.
    #[arg(long = "budget", value_name = "LIMIT", value_parser = parse_budget)]
    pub budget: Vec<kernel_proto::v1::BudgetLimit>,
}

/// A budget limit: `calls=N`, `cost=X`, `time=DURATION` and `tools=GLOB`, comma-separated, at
/// least one of the first three.
pub(crate) fn parse_budget(text: &str) -> Result<kernel_proto::v1::BudgetLimit, String> {
    let mut limit = kernel_proto::v1::BudgetLimit::default();
    for part in text.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            return Err(format!(
                "'{part}' is not key=value (calls=N, cost=X, time=DURATION, tools=GLOB)"
            ));
        };
        match key.trim() {
            "calls" => {
                let calls = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("calls '{value}' is not a whole number"))?;
                limit.max_calls = Some(calls);
            }
            "cost" => {
                let cost: f64 = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("cost '{value}' is not a number"))?;
                if !(cost.is_finite() && cost >= 0.0) {
                    return Err(format!("cost '{value}' is not a number >= 0"));
                }
                limit.max_cost = Some(cost);
            }
            "time" => limit.max_time_ms = Some(parse_millis(value.trim()).map_err(|why| format!("time {why}"))?),
            "tools" => limit.tools = value.trim().to_owned(),
            other => {
                return Err(format!("unknown key '{other}' (expected calls, cost, time or tools)"));
            }
        }
    }
    if limit.max_calls.is_none() && limit.max_cost.is_none() && limit.max_time_ms.is_none() {
        return Err(format!("'{text}' sets none of calls, cost and time"));
    }
    Ok(limit)
}

/// A span of time, `250ms`, `30s`, `10m`, `1h` or whole seconds, in milliseconds.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("'{text}' is not a duration such as 250ms, 30s, 10m or 1h")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per))
        .ok_or_else(|| format!("'{text}' is not a duration such as 250ms, 30s, 10m or 1h"))
}

/// JSON text, checked and kept as written.
fn parse_json(text: &str) -> Result<String, String> {
    serde_json::from_str::<serde_json::Value>(text)
        .map(|_| text.to_owned())
        .map_err(|err| format!("not valid JSON: {err}"))
}

/// `STEP=JSON`, split at the first `=` (step keys hold none; JSON may).
fn parse_set_result(text: &str) -> Result<(String, String), String> {
    let Some((step, json)) = text.split_once('=') else {
        return Err(format!("expected STEP=JSON, found no '=' in '{text}'"));
    };
    let step = step.trim();
    if step.is_empty() {
        return Err(format!("expected STEP=JSON, found an empty step in '{text}'"));
    }
    Ok((step.to_owned(), parse_json(json)?))
}

/// A duration such as `30d` or `90m`, in milliseconds.
fn parse_age(text: &str) -> Result<u64, String> {
    kernel_proto::duration::parse_millis(text)
}

#[derive(Debug, Args)]
pub struct ListRunsArgs {
    /// Only runs in this status.
    #[arg(long, value_enum)]
    pub status: Option<StatusFilter>,

    /// Only runs of this agent.
    #[arg(long)]
    pub agent: Option<String>,

    /// Only runs carrying this label; repeat to require several.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<LabelFilter>,

    /// Only the subagent runs this run started.
    #[arg(long, value_name = "RUN_ID")]
    pub parent: Option<String>,

    /// Only the branches forked from this run (`runs fork`).
    #[arg(long, value_name = "RUN_ID")]
    pub branch_of: Option<String>,

    /// Only runs that made a call of this tool.
    #[arg(long)]
    pub tool: Option<String>,

    /// Only runs created within this long before now (`15m`, `24h`, `7d`).
    #[arg(long, value_name = "DURATION", value_parser = kernel_proto::duration::parse_millis)]
    pub since: Option<u64>,

    /// Most runs to print.
    #[arg(
        long,
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(1..),
        conflicts_with = "all"
    )]
    pub limit: u32,

    /// Follow every page instead of stopping at --limit.
    #[arg(long)]
    pub all: bool,

    /// Resume from a page token printed by an earlier `--json` listing.
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Run id.
    pub id: String,

    /// First sequence number to print.
    #[arg(long = "from", value_name = "SEQ", default_value_t = 1)]
    pub from_seq: u64,

    /// Keep streaming new events until the run ends (or Ctrl-C).
    #[arg(long, short = 'f')]
    pub follow: bool,

    /// With --follow, also print live progress of the run's tools (not part of the log).
    #[arg(long, requires = "follow")]
    pub progress: bool,
}

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// List every registered tool, with the workers offering it now.
    #[command(alias = "ls")]
    List,
    /// Forget a registered tool that no connected worker offers (needs admin); its recorded calls
    /// stay in their runs.
    Forget {
        /// The tool's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum WorkersCommand {
    /// List connected worker sessions.
    #[command(alias = "ls")]
    List,
}

#[derive(Debug, Subcommand)]
pub enum ReplicasCommand {
    /// List the replicas that renewed their row, the one answering first.
    #[command(alias = "ls")]
    List,
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List pending approvals.
    #[command(alias = "ls")]
    List {
        /// Only this run's approvals.
        #[arg(long)]
        run: Option<String>,
    },
    /// Let the parked call run, with exactly the arguments it showed.
    Approve(AnswerArgs),
    /// Refuse the parked call; the model is told it was not approved. For a tool's question to a
    /// person, decline to answer: the tool gets an error.
    Reject(AnswerArgs),
    /// Answer a tool's question to a person with JSON that meets the question's schema (the tool
    /// that asked gets it back), or leave for a call to pass its budget with the limit's new
    /// bounds (`--with '{"max_cost": 10}'`; the call then runs under the raised limit).
    Answer {
        #[command(flatten)]
        who: AnswerArgs,
        /// The answer, as JSON.
        #[arg(long = "with", value_name = "JSON", value_parser = parse_json)]
        answer: String,
    },
}

/// Who answers an approval, and why.
#[derive(Debug, clap::Args)]
pub struct AnswerArgs {
    /// The approval's id (from `approvals list`).
    pub id: String,
    /// Who decides; recorded with the answer. Defaults to $USER. A kernel that requires API keys
    /// records the key's name instead.
    #[arg(long = "as", env = "USER")]
    pub decider: String,
    /// Why; recorded with the answer and, on a rejection, told to the model.
    #[arg(long)]
    pub reason: Option<String>,
}

/// A run status a listing can be filtered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    Pending,
    Running,
    Blocked,
    Completed,
    Failed,
    Cancelled,
}

impl From<StatusFilter> for RunStatus {
    fn from(status: StatusFilter) -> Self {
        match status {
            StatusFilter::Pending => RunStatus::Pending,
            StatusFilter::Running => RunStatus::Running,
            StatusFilter::Blocked => RunStatus::Blocked,
            StatusFilter::Completed => RunStatus::Completed,
            StatusFilter::Failed => RunStatus::Failed,
            StatusFilter::Cancelled => RunStatus::Cancelled,
        }
    }
}

/// A kernel address with a scheme, ready for tonic; parsed from `http://host:port`,
/// `https://host:port` or `host:port` (plaintext).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelAddr(String);

impl KernelAddr {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the kernel is reached over TLS.
    pub fn is_https(&self) -> bool {
        self.0.starts_with("https://")
    }
}

impl fmt::Display for KernelAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for KernelAddr {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err("the address is empty".into());
        }
        let url = match raw.split_once("://") {
            Some(("http" | "https", _)) => raw.to_owned(),
            Some((scheme, _)) => return Err(format!("unsupported scheme '{scheme}', use http:// or https://")),
            None => format!("http://{raw}"),
        };
        let uri: tonic::transport::Uri = url
            .parse()
            .map_err(|err| format!("'{raw}' is not a valid address: {err}"))?;
        if uri.host().is_none_or(str::is_empty) {
            return Err(format!("'{raw}' has no host"));
        }
        Ok(Self(url))
    }
}

impl Cli {
    /// Checks that the address and the TLS flags go together: https needs the kernel's CA, and a CA
    /// makes no sense over plaintext. `keys` never connects.
    pub fn check_tls(&self) -> Result<(), String> {
        if matches!(self.command, Command::Keys(_)) {
            return Ok(());
        }
        match (self.addr.is_https(), &self.tls_ca) {
            (true, None) => Err(format!("{} uses TLS: give the kernel's CA with --tls-ca", self.addr)),
            (false, Some(_)) => Err(format!("--tls-ca needs an https:// address, not {}", self.addr)),
            _ => Ok(()),
        }
    }

    /// The TLS CA and API key every connection of this command uses.
    pub fn access(&self) -> crate::client::Access {
        crate::client::Access {
            tls_ca: self.tls_ca.clone(),
            // `KERNEL_API_KEY=` (set but empty) means no key, as an unset variable does.
            api_key: self.api_key.clone().filter(|key| !key.trim().is_empty()),
        }
    }
}

/// One `key=value` label a run must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelFilter {
    pub key: String,
    pub value: String,
}

impl fmt::Display for LabelFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

impl FromStr for LabelFilter {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let Some((key, value)) = raw.split_once('=') else {
            return Err(format!("expected KEY=VALUE, found no '=' in '{raw}'"));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("expected KEY=VALUE, found an empty key in '{raw}'"));
        }
        Ok(Self {
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kernelctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_kernelctl_command_line_in_the_docs_parses() {
        crate::docs_commands::assert_every_command_line_parses::<Cli>("kernelctl", 20);
    }

    #[test]
    fn a_budget_limit_reads_calls_cost_time_and_tools_and_names_what_is_wrong() {
        let limit = parse_budget("tools=pay*, calls=3, time=10m").unwrap();
        assert_eq!(
            (limit.tools.as_str(), limit.max_calls, limit.max_time_ms),
            ("pay*", Some(3), Some(600_000))
        );
        assert_eq!(
            parse_budget("time=90").unwrap().max_time_ms,
            Some(90_000),
            "whole seconds"
        );
        assert_eq!(parse_budget("time=250ms").unwrap().max_time_ms, Some(250));
        assert_eq!(
            parse_budget("time=soon").unwrap_err(),
            "time 'soon' is not a duration such as 250ms, 30s, 10m or 1h"
        );
        assert_eq!(
            parse_budget("tools=pay*").unwrap_err(),
            "'tools=pay*' sets none of calls, cost and time"
        );
    }

    #[test]
    fn label_filters_split_at_the_first_equals_sign() {
        let label: LabelFilter = "team=search=v2".parse().unwrap();
        assert_eq!(label.key, "team");
        assert_eq!(label.value, "search=v2");
        assert_eq!(label.to_string(), "team=search=v2");
        let empty_value: LabelFilter = "flag=".parse().unwrap();
        assert_eq!(empty_value.value, "");
    }

    #[test]
    fn label_filters_without_a_key_or_equals_sign_are_rejected() {
        let missing = "team".parse::<LabelFilter>().unwrap_err();
        assert!(missing.contains("KEY=VALUE"), "{missing}");
        assert!(missing.contains("'team'"), "{missing}");
        assert!("=x".parse::<LabelFilter>().unwrap_err().contains("empty key"));
    }

    #[test]
    fn a_bad_label_is_a_usage_error() {
        let err = parse(&["runs", "list", "--label", "team"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("KEY=VALUE"), "{err}");
    }

    #[test]
    fn addresses_get_a_scheme_when_they_lack_one() {
        let addr: KernelAddr = "localhost:7000".parse().unwrap();
        assert_eq!(addr.as_str(), "http://localhost:7000");
        let addr: KernelAddr = "http://kernel.example:80".parse().unwrap();
        assert_eq!(addr.as_str(), "http://kernel.example:80");
        let addr: KernelAddr = " 10.0.0.1:50051 ".parse().unwrap();
        assert_eq!(addr.as_str(), "http://10.0.0.1:50051");
    }

    #[test]
    fn bad_addresses_are_rejected() {
        assert!("".parse::<KernelAddr>().is_err());
        assert!("ftp://host:1".parse::<KernelAddr>().unwrap_err().contains("scheme"));
        assert!("host name:1".parse::<KernelAddr>().is_err());
        assert!("https://k:443".parse::<KernelAddr>().unwrap().is_https());
        assert_eq!(parse(&["--addr", "", "tools", "list"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn https_and_the_tls_ca_go_together() {
        let cli = parse(&["--addr", "https://k:1", "--tls-ca", "ca.pem", "tools", "list"]).unwrap();
        assert!(cli.check_tls().is_ok());
        let cli = parse(&["--addr", "https://k:1", "tools", "list"]).unwrap();
        if cli.tls_ca.is_none() {
            assert!(cli.check_tls().unwrap_err().contains("--tls-ca"));
        }
        let cli = parse(&["--addr", "http://k:1", "--tls-ca", "ca.pem", "tools", "list"]).unwrap();
        assert!(cli.check_tls().unwrap_err().contains("https://"));
    }

    #[test]
    fn defaults_and_global_flags() {
        let cli = parse(&["runs", "list", "--json"]).unwrap();
        assert!(cli.json);
        if std::env::var_os("KERNEL_ADDR").is_none() {
            assert_eq!(cli.addr.as_str(), DEFAULT_ADDR);
        }
        let Command::Runs(RunsCommand::List(list)) = cli.command else {
            panic!("expected runs list");
        };
        assert_eq!(list.limit, 50);
        assert!(!list.all);
        assert!(list.labels.is_empty());
        assert_eq!(list.status, None);
    }

    #[test]
    fn runs_list_takes_every_filter() {
        let cli = parse(&[
            "--addr", "k:1", "runs", "list", "--status", "blocked", "--agent", "planner", "--label", "a=1", "--label",
            "b=2", "--limit", "10",
        ])
        .unwrap();
        assert_eq!(cli.addr.as_str(), "http://k:1");
        let Command::Runs(RunsCommand::List(list)) = cli.command else {
            panic!("expected runs list");
        };
        assert_eq!(list.status, Some(StatusFilter::Blocked));
        assert_eq!(RunStatus::from(StatusFilter::Blocked), RunStatus::Blocked);
        assert_eq!(list.agent.as_deref(), Some("planner"));
        let labels: Vec<String> = list.labels.iter().map(ToString::to_string).collect();
        assert_eq!(labels, ["a=1", "b=2"]);
        assert_eq!(list.limit, 10);
    }

    #[test]
    fn limit_must_be_positive_and_excludes_all() {
        assert_eq!(parse(&["runs", "list", "--limit", "0"]).unwrap_err().exit_code(), 2);
        let err = parse(&["runs", "list", "--limit", "5", "--all"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
        assert!(parse(&["runs", "list", "--all"]).is_ok());
    }

    #[test]
    fn unknown_status_is_a_usage_error() {
        let err = parse(&["runs", "list", "--status", "done"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
    }

    #[test]
    fn events_flags() {
        let cli = parse(&["runs", "events", "r1", "--from", "7", "--follow", "--progress"]).unwrap();
        let Command::Runs(RunsCommand::Events(events)) = cli.command else {
            panic!("expected runs events");
        };
        assert_eq!(events.id, "r1");
        assert_eq!(events.from_seq, 7);
        assert!(events.follow && events.progress);
        let err = parse(&["runs", "events", "r1", "--progress"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn cancel_takes_an_optional_reason() {
        let cli = parse(&["runs", "cancel", "r1", "--reason", "operator stop"]).unwrap();
        let Command::Runs(RunsCommand::Cancel { id, reason }) = cli.command else {
            panic!("expected runs cancel");
        };
        assert_eq!(id, "r1");
        assert_eq!(reason.as_deref(), Some("operator stop"));
    }

    #[test]
    fn fork_takes_every_flag() {
        let cli = parse(&[
            "runs",
            "fork",
            "r1",
            "--at",
            "t1/p0",
            "--input",
            r#"{"city": "Oslo"}"#,
            "--set-result",
            r#"t0/p1={"temp": 3}"#,
            "--set-result",
            r#"id:c="a=b""#,
            "--label",
            "case=cold",
            "--idempotency-key",
            "k1",
        ])
        .unwrap();
        let Command::Runs(RunsCommand::Fork(fork)) = cli.command else {
            panic!("expected runs fork");
        };
        assert_eq!(fork.id, "r1");
        assert_eq!(fork.at_step_key.as_deref(), Some("t1/p0"));
        assert_eq!(fork.input.as_deref(), Some(r#"{"city": "Oslo"}"#));
        let results: Vec<(&str, &str)> = fork.set_results.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(results, [("t0/p1", r#"{"temp": 3}"#), ("id:c", r#""a=b""#)]);
        assert_eq!(fork.labels, [("case".to_owned(), "cold".to_owned())]);
        assert_eq!(fork.idempotency_key.as_deref(), Some("k1"));
    }

    #[test]
    fn bad_fork_flags_are_usage_errors_naming_the_flag() {
        let cases: [(&[&str], &str, &str); 4] = [
            (&["--set-result", "t0/p1"], "--set-result", "no '='"),
            (&["--set-result", "t0/p1={oops"], "--set-result", "not valid JSON"),
            (&["--set-result", "={}"], "--set-result", "empty step"),
            (&["--input", "{oops"], "--input", "not valid JSON"),
        ];
        for (flags, flag, why) in cases {
            let argv: Vec<&str> = ["runs", "fork", "r1"].iter().chain(flags).copied().collect();
            let err = parse(&argv).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{flags:?}: {err}");
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{flags:?}: {err}");
            let text = err.to_string();
            assert!(text.contains(flag) && text.contains(why), "{flags:?}: {text}");
        }
    }

    #[test]
    fn diff_takes_two_runs() {
        let cli = parse(&["runs", "diff", "ra", "rb", "--json"]).unwrap();
        assert!(cli.json);
        let Command::Runs(RunsCommand::Diff { a, b }) = cli.command else {
            panic!("expected runs diff");
        };
        assert_eq!((a.as_str(), b.as_str()), ("ra", "rb"));
        assert_eq!(parse(&["runs", "diff", "ra"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn a_missing_run_id_is_a_usage_error() {
        assert_eq!(parse(&["runs", "show"]).unwrap_err().exit_code(), 2);
    }
}
