//! The kernel's Prometheus instruments, in one process-wide registry.
//!
//! Counters and histograms are fed where the facts happen: the store writer observes each commit
//! and hands every committed event to [`Metrics::committed`], which counts settled calls and times
//! their phases from the step the event changed. Gauges that describe state (runs by status,
//! approvals waiting) are not kept by counting transitions, which drifts across restarts and
//! deletions: [`http`](crate::http) sets them from the store when it is scraped, and the
//! scheduler's from what it holds.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::model::{EventType, Millis, StepKind, StepRecord};
use crate::store::Published;

/// A settled call's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub tool: String,
    pub outcome: String,
}

/// A tool's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    pub tool: String,
}

/// A settled call's fair share (its run's value of the policy's `fair_shares.label`) and tool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShareLabels {
    pub share: String,
    pub tool: String,
}

/// A tool limit's label: its `tools` glob.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: String,
}

/// A histogram of call phases, for a family to make one per label set.
type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A run status's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

/// Every instrument, registered once.
pub struct Metrics {
    registry: Registry,
    pub calls: Family<CallLabels, Counter>,
    /// What settled calls cost (every attempt at its price), by tool.
    pub cost: Family<ToolLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// Settled calls of runs with a fair share, by share and tool.
    pub share_calls: Family<ShareLabels, Counter>,
    /// What they cost, by share and tool.
    pub share_cost: Family<ShareLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// By tool: what the console's Tools page reads a tool's latency from.
    pub call_seconds: LatencyFamily<ToolLabels>,
    pub schedule_to_start_seconds: Histogram,
    pub run_seconds: Histogram,
    /// How long started calls waited in the queue for each tool limit that held them.
    pub limit_wait_seconds: LatencyFamily<LimitLabels>,
    pub commit_seconds: Histogram,
    pub batch_seconds: Histogram,
    pub batch_commands: Histogram,
    pub queued: Gauge,
    pub leased: Gauge,
    pub sessions: Gauge,
    pub runs: Family<StatusLabels, Gauge>,
    pub approvals_waiting: Gauge,
    pub shards_owned: Gauge,
    /// Writes sent to the replica owning their run's shard, and writes applied for another replica.
    pub forwarded: Counter,
    pub applied_for_others: Counter,
    /// Writer transactions committed, for `GetStatus` (Prometheus reads the count of
    /// `store_commit_seconds`).
    commits: std::sync::atomic::AtomicU64,
    /// Of those, the ones that waited for the disk.
    syncs: std::sync::atomic::AtomicU64,
    /// Statements the writer ran, transaction control included.
    statements: std::sync::atomic::AtomicU64,
}

/// Call phases range from well under a millisecond (a local tool) to minutes (a person).
fn latency_buckets() -> impl Iterator<Item = f64> {
    [
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ]
    .into_iter()
}

/// A commit is an fsync or a round trip: tens of microseconds to tens of milliseconds.
fn commit_buckets() -> impl Iterator<Item = f64> {
    [
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
    ]
    .into_iter()
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kernel");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register("tool_calls", "Tool calls settled, by tool and outcome", calls.clone());
        let cost = Family::<ToolLabels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "tool_cost",
            "What settled tool calls cost, every attempt at its price (the tool's cost_per_call or --unit-price), \
             by tool; what budgets charge",
            cost.clone(),
        );
        let share_calls = Family::<ShareLabels, Counter>::default();
        registry.register(
            "tool_calls_by_share",
            "Tool calls settled, by fair share (the run's value of the policy's fair_shares.label; runs without it \
             are not counted here) and tool",
            share_calls.clone(),
        );
        let share_cost = Family::<ShareLabels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "tool_cost_by_share",
            "What settled tool calls cost, by fair share and tool: what each tenant spent",
            share_cost.clone(),
        );
        let call_seconds: LatencyFamily<ToolLabels> =
            Family::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register_with_unit(
            "tool_call_duration",
            "From a call's recording to its result, approval waits and retries included, by tool",
            Unit::Seconds,
            call_seconds.clone(),
        );
        let schedule_to_start_seconds = Histogram::new(latency_buckets());
        registry.register_with_unit(
            "tool_call_schedule_to_start",
            "From a call attempt being due to its start on a worker",
            Unit::Seconds,
            schedule_to_start_seconds.clone(),
        );
        let run_seconds = Histogram::new(latency_buckets());
        registry.register_with_unit(
            "tool_call_run",
            "From the last attempt's start on a worker to its result",
            Unit::Seconds,
            run_seconds.clone(),
        );
        let limit_wait_seconds: LatencyFamily<LimitLabels> =
            Family::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register_with_unit(
            "tool_limit_wait",
            "How long each started call waited in the queue for room under a tool limit (the policy file's \
             limits), by limit; a call that found room at once counts 0",
            Unit::Seconds,
            limit_wait_seconds.clone(),
        );
        let commit_seconds = Histogram::new(commit_buckets());
        registry.register_with_unit(
            "store_commit",
            "The store's COMMIT statement: on SQLite the WAL write and its fsync, on PostgreSQL the round trip \
             that waits for the server's WAL flush",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        let batch_seconds = Histogram::new(commit_buckets());
        registry.register_with_unit(
            "store_batch",
            "One writer transaction from BEGIN to the end of COMMIT",
            Unit::Seconds,
            batch_seconds.clone(),
        );
        let batch_commands = Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]);
        registry.register(
            "store_batch_commands",
            "Commands folded into one writer transaction",
            batch_commands.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "queued_calls",
            "Calls waiting in the scheduler's queue for a worker slot",
            queued.clone(),
        );
        let leased = Gauge::default();
        registry.register(
            "leased_calls",
            "Calls running on a worker of this replica under a lease",
            leased.clone(),
        );
        let sessions = Gauge::default();
        registry.register(
            "worker_sessions",
            "Worker sessions open on this replica",
            sessions.clone(),
        );
        let runs = Family::<StatusLabels, Gauge>::default();
        registry.register("runs", "Runs in the store, by status", runs.clone());
        let approvals_waiting = Gauge::default();
        registry.register(
            "approvals_waiting",
            "Approvals waiting for a person's answer",
            approvals_waiting.clone(),
        );
        let shards_owned = Gauge::default();
        registry.register(
            "shards_owned",
            "Shards of runs this replica owns (replicas on PostgreSQL; 0 on SQLite)",
            shards_owned.clone(),
        );
        let forwarded = Counter::default();
        registry.register(
            "writes_forwarded",
            "Writes of runs sent to the replica that owns the run's shard (replicas on PostgreSQL)",
            forwarded.clone(),
        );
        let applied_for_others = Counter::default();
        registry.register(
            "writes_applied_for_others",
            "Writes of runs this replica's shards hold that another replica received and sent here",
            applied_for_others.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log lines that could not be written (standard error closed or full); the kernel goes on without them",
            crate::logs::dropped().clone(),
        );
        Metrics {
            registry,
            calls,
            cost,
            share_calls,
            share_cost,
            call_seconds,
            schedule_to_start_seconds,
            run_seconds,
            limit_wait_seconds,
            commit_seconds,
            batch_seconds,
            batch_commands,
            queued,
            leased,
            sessions,
            runs,
            approvals_waiting,
            shards_owned,
            forwarded,
            applied_for_others,
            commits: std::sync::atomic::AtomicU64::new(0),
            syncs: std::sync::atomic::AtomicU64::new(0),
            statements: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A fresh set whose every labelled family holds one sample, so that its text shows the
    /// labels: what `docs/reference/metrics.md` is rendered from. The fields are named one by one
    /// so that a new family cannot be left out.
    #[cfg(test)]
    pub(crate) fn for_reference() -> Metrics {
        let metrics = Metrics::new();
        let Metrics {
            registry: _,
            calls,
            cost,
            share_calls,
            share_cost,
            call_seconds,
            schedule_to_start_seconds: _,
            run_seconds: _,
            limit_wait_seconds,
            commit_seconds: _,
            batch_seconds: _,
            batch_commands: _,
            queued: _,
            leased: _,
            sessions: _,
            runs,
            approvals_waiting: _,
            shards_owned: _,
            forwarded: _,
            applied_for_others: _,
            commits: _,
            syncs: _,
            statements: _,
        } = &metrics;
        drop(calls.get_or_create(&CallLabels {
            tool: String::new(),
            outcome: String::new(),
        }));
        drop(runs.get_or_create(&StatusLabels { status: String::new() }));
        drop(cost.get_or_create(&ToolLabels { tool: String::new() }));
        drop(call_seconds.get_or_create(&ToolLabels { tool: String::new() }));
        drop(limit_wait_seconds.get_or_create(&LimitLabels { limit: String::new() }));
        let share = ShareLabels {
            share: String::new(),
            tool: String::new(),
        };
        drop(share_calls.get_or_create(&share));
        drop(share_cost.get_or_create(&share));
        metrics
    }

    /// Counts and times what one committed event says about a tool call.
    pub fn committed(&self, published: &Published) {
        let Some(step) = published.step.as_ref().filter(|step| step.kind == StepKind::Tool) else {
            return;
        };
        match published.event.kind {
            EventType::ToolStart => {
                if let Some(started) = step.started_at {
                    let due = step.not_before.unwrap_or(step.created_at).max(step.created_at);
                    self.schedule_to_start_seconds.observe(seconds_between(due, started));
                }
                for limit in &step.limited_by {
                    self.limit_wait_seconds
                        .get_or_create(&LimitLabels { limit: limit.clone() })
                        .observe(step.limit_wait_ms as f64 / 1000.0);
                }
            }
            EventType::ToolResult | EventType::ToolDenied => {
                self.calls
                    .get_or_create(&CallLabels {
                        tool: step.tool.clone(),
                        outcome: step
                            .outcome()
                            .map_or("unsettled", |outcome| outcome.as_str())
                            .to_owned(),
                    })
                    .inc();
                if step.cost > 0.0 {
                    self.cost
                        .get_or_create(&ToolLabels {
                            tool: step.tool.clone(),
                        })
                        .inc_by(step.cost);
                }
                if let Some(share) = &step.share {
                    let labels = ShareLabels {
                        share: share.clone(),
                        tool: step.tool.clone(),
                    };
                    self.share_calls.get_or_create(&labels).inc();
                    if step.cost > 0.0 {
                        self.share_cost.get_or_create(&labels).inc_by(step.cost);
                    }
                }
                let finished = step.finished_at.unwrap_or(published.event.at);
                self.call_seconds
                    .get_or_create(&ToolLabels {
                        tool: step.tool.clone(),
                    })
                    .observe(seconds_between(step.created_at, finished));
                if let Some(started) = started_on_a_worker(step) {
                    self.run_seconds.observe(seconds_between(started, finished));
                }
            }
            _ => {}
        }
    }

    /// Times one writer transaction of `commands` commands, and counts it when it committed
    /// (`Some`, with whether it waited for the disk).
    pub fn batch(&self, commands: usize, commit: Duration, whole: Duration, committed: Option<bool>) {
        if let Some(synced) = committed {
            self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if synced {
                self.syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        self.batch_commands.observe(commands as f64);
        self.commit_seconds.observe(commit.as_secs_f64());
        self.batch_seconds.observe(whole.as_secs_f64());
    }

    /// Writer transactions committed since the process started.
    pub fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts statements the writer ran (transaction control included).
    pub fn statements(&self, count: u64) {
        self.statements.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    }

    /// Statements the writer ran since the process started.
    pub fn statement_count(&self) -> u64 {
        self.statements.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writer transactions that waited for the disk since the process started.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The OpenMetrics text of every instrument.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// A step replayed from elsewhere (a branch's parent, the cache) never ran here.
fn started_on_a_worker(step: &StepRecord) -> Option<Millis> {
    if step.from_run.is_some() {
        return None;
    }
    step.started_at
}

fn seconds_between(from: Millis, to: Millis) -> f64 {
    to.saturating_sub(from).max(0) as f64 / 1000.0
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's instruments.
pub fn get() -> &'static Metrics {
    &METRICS
}
