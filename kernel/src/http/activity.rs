//! What the console's Tools & workers page draws over time. Every [`SAMPLE_EVERY`] it samples
//! each tool's settled calls and their durations, read from the kernel's own metrics text (what
//! a Prometheus scraper reads, so the page and a dashboard agree), and each worker session's slots
//! in use; the last [`KEPT`] samples stay in memory. Nothing here is durable: a restarted kernel
//! starts a new history, as its counters start again.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::grpc::Kernel;
use crate::scheduler::WorkerSnapshot;

/// How often a sample is taken.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples kept: ten minutes of them.
pub const KEPT: usize = 60;

/// Outcomes that say the tool or its workers failed the call, as opposed to a call that was
/// refused before it ran (denied, rejected, over a budget...) or cancelled.
pub const FAILED: &[&str] = &["tool_error", "timed_out", "indeterminate", "poison", "no_worker"];

/// A tool's counters at one moment, since the kernel started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolCounts {
    /// Calls settled, whatever their outcome.
    pub settled: u64,
    /// Of them, those whose outcome is a failure ([`FAILED`]).
    pub failed: u64,
    /// Their durations, recording to result: each bucket's upper bound in seconds and the calls
    /// at or under it (cumulative, as the histogram writes them).
    pub buckets: Vec<(f64, u64)>,
}

/// A worker session's load at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerLoad {
    pub session: String,
    pub name: String,
    pub in_use: u32,
    pub slots: u32,
}

/// One sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Wall time, milliseconds since the epoch.
    pub at: i64,
    pub tools: BTreeMap<String, ToolCounts>,
    pub workers: Vec<WorkerLoad>,
}

impl Sample {
    /// A sample of now: the metrics' text as the kernel encodes it, and its worker sessions.
    pub fn of(at: i64, metrics: &str, workers: &[WorkerSnapshot]) -> Sample {
        Sample {
            at,
            tools: tool_counts(metrics),
            workers: (workers.iter())
                .map(|worker| WorkerLoad {
                    session: worker.session_id.to_string(),
                    name: worker.name.clone(),
                    in_use: worker.slots_in_use,
                    slots: worker.max_concurrency,
                })
                .collect(),
        }
    }
}

/// The kept samples, oldest first.
#[derive(Default)]
pub struct Activity {
    samples: Mutex<VecDeque<Sample>>,
}

impl Activity {
    pub fn record(&self, sample: Sample) {
        let mut samples = self.samples.lock().expect("activity lock");
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// A copy of the kept samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().expect("activity lock").iter().cloned().collect()
    }
}

/// Samples the kernel every [`SAMPLE_EVERY`] until `shutdown`.
pub async fn sample_every(activity: std::sync::Arc<Activity>, kernel: Kernel, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match now(&kernel).await {
            Ok(sample) => activity.record(sample),
            Err(error) => tracing::debug!(%error, "activity sample skipped"),
        }
    }
}

/// A sample taken now, for the page to compare the kept ones with.
pub async fn now(kernel: &Kernel) -> Result<Sample, crate::error::KernelError> {
    let workers = kernel.scheduler.snapshot().await?;
    let at = crate::clock::Clock::wall().now_millis();
    Ok(Sample::of(at, &crate::metrics::get().encode(), &workers))
}

/// Each tool's settled calls and durations, from the OpenMetrics text: the samples of
/// `kernel_tool_calls_total{tool,outcome}` and `kernel_tool_call_duration_seconds_bucket{tool,le}`.
fn tool_counts(text: &str) -> BTreeMap<String, ToolCounts> {
    let mut tools: BTreeMap<String, ToolCounts> = BTreeMap::new();
    for line in text.lines() {
        let Some((name, labels, value)) = sample_line(line) else {
            continue;
        };
        let label = |key: &str| labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let Some(tool) = label("tool").filter(|tool| !tool.is_empty()) else {
            continue;
        };
        match name {
            "kernel_tool_calls_total" => {
                let counts = tools.entry(tool.to_owned()).or_default();
                let calls = value as u64;
                counts.settled += calls;
                if label("outcome").is_some_and(|outcome| FAILED.contains(&outcome)) {
                    counts.failed += calls;
                }
            }
            "kernel_tool_call_duration_seconds_bucket" => {
                let bound = match label("le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(le) => match le.parse() {
                        Ok(bound) => bound,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                let counts = tools.entry(tool.to_owned()).or_default();
                counts.buckets.push((bound, value as u64));
            }
            _ => {}
        }
    }
    for counts in tools.values_mut() {
        counts.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    tools
}

/// A sample's labels, in the order written.
type Labels = Vec<(String, String)>;

/// One sample line of the text format: its metric name, its labels, its value. Comments, and
/// lines that are not `name{labels} value` or `name value`, give `None`.
fn sample_line(line: &str) -> Option<(&str, Labels, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (name, rest) = match line.find('{') {
        Some(open) => (&line[..open], &line[open + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some((name, Vec::new(), value.trim().parse().ok()?));
        }
    };
    let (labels, rest) = labels(rest)?;
    let value = rest.trim().split(' ').next()?.parse().ok()?;
    Some((name, labels, value))
}

/// `key="value",...}` and what follows the closing brace; values unescaped (`\\`, `\"`, `\n`).
fn labels(text: &str) -> Option<(Labels, &str)> {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (at, '"') => break at,
                (_, other) => value.push(other),
            }
        };
        labels.push((key.to_owned(), value));
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP kernel_tool_calls Tool calls settled, by tool and outcome.
# TYPE kernel_tool_calls counter
kernel_tool_calls_total{tool="add",outcome="ok"} 7
kernel_tool_calls_total{tool="add",outcome="tool_error"} 2
kernel_tool_calls_total{tool="add",outcome="denied"} 1
kernel_tool_calls_total{tool="say \"hi\"",outcome="timed_out"} 1
kernel_tool_calls_total{tool="",outcome=""} 0
# TYPE kernel_tool_call_duration_seconds histogram
kernel_tool_call_duration_seconds_sum{tool="add"} 0.5
kernel_tool_call_duration_seconds_count{tool="add"} 10
kernel_tool_call_duration_seconds_bucket{le="0.005",tool="add"} 4
kernel_tool_call_duration_seconds_bucket{le="+Inf",tool="add"} 10
kernel_tool_call_duration_seconds_bucket{le="0.001",tool="add"} 1
kernel_queued_calls 3
# EOF
"#;

    #[test]
    fn tools_are_read_from_the_metrics_text() {
        let tools = tool_counts(TEXT);
        assert_eq!(tools.len(), 2, "{tools:?}");
        let add = &tools["add"];
        assert_eq!((add.settled, add.failed), (10, 2));
        assert_eq!(add.buckets, vec![(0.001, 1), (0.005, 4), (f64::INFINITY, 10)]);
        assert_eq!(tools["say \"hi\""].failed, 1);
    }

    #[test]
    fn the_kernels_own_text_is_read() {
        let metrics = crate::metrics::Metrics::for_reference();
        let text = metrics.encode();
        assert!(sample_line("kernel_queued_calls 3").is_some());
        // The reference set holds one sample of each family, under an empty tool.
        assert!(text.contains("kernel_tool_call_duration_seconds_bucket{"), "{text}");
        for line in text.lines().filter(|line| !line.starts_with('#') && !line.is_empty()) {
            assert!(sample_line(line).is_some(), "{line}");
        }
    }

    #[test]
    fn the_oldest_sample_goes_first() {
        let activity = Activity::default();
        for at in 0..(KEPT as i64 + 5) {
            activity.record(Sample {
                at,
                tools: BTreeMap::new(),
                workers: Vec::new(),
            });
        }
        let kept = activity.samples();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at, 5);
    }
}
