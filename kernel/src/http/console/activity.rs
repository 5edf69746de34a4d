//! The Tools & workers page's figures over time, from the kept samples and one taken now: each
//! tool's calls per minute, failures and latency over the window, each worker's slots in use as
//! a small chart, and the workers that were there and are gone.

use std::collections::BTreeMap;

use maud::{Markup, html};

use super::format;
use crate::http::activity::{KEPT, SAMPLE_EVERY, Sample, ToolCounts, WorkerLoad};

/// What the kept samples and the one of now say.
pub struct Window {
    samples: Vec<Sample>,
    now: Sample,
}

/// A tool's figures over the window.
#[derive(Debug, PartialEq)]
pub struct ToolFigures {
    /// Calls settled per minute, over the minute before now (or the window, when it is younger).
    pub per_minute: f64,
    pub calls: u64,
    pub failed: u64,
    /// Upper bounds of the buckets holding the median and the 99th percentile, in seconds.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    /// The histogram's last finite bound: a call past it reads as longer than that.
    pub last_bound: f64,
}

/// A worker session that the samples saw and that is no longer connected.
pub struct Gone<'a> {
    pub worker: &'a WorkerLoad,
    pub last_seen: i64,
}

impl Window {
    /// `samples`, oldest first, and `now`; `started` is when the kernel started, whose counters
    /// were all zero then, so that a window younger than the history counts from there.
    pub fn new(mut samples: Vec<Sample>, now: Sample, started: i64) -> Window {
        if samples.len() < KEPT && samples.first().is_none_or(|first| first.at > started) {
            samples.insert(
                0,
                Sample {
                    at: started,
                    tools: BTreeMap::new(),
                    workers: Vec::new(),
                },
            );
        }
        Window { samples, now }
    }

    /// How long the window spans, for the page to say.
    pub fn span_ms(&self) -> i64 {
        self.now.at - self.samples.first().map_or(self.now.at, |first| first.at)
    }

    pub fn tool(&self, tool: &str) -> ToolFigures {
        let empty = ToolCounts::default();
        let counts = |sample: &Sample| sample.tools.get(tool).cloned().unwrap_or_default();
        let now = self.now.tools.get(tool).unwrap_or(&empty);
        let oldest = self.samples.first().map(counts).unwrap_or_default();
        let minute_ago = (self.samples.iter().rev())
            .find(|sample| sample.at <= self.now.at - 60_000)
            .or(self.samples.first());
        let per_minute = minute_ago.map_or(0.0, |base| {
            let calls = now.settled.saturating_sub(counts(base).settled);
            calls as f64 * 60_000.0 / (self.now.at - base.at).max(1) as f64
        });
        let buckets = since(&now.buckets, &oldest.buckets);
        ToolFigures {
            per_minute,
            calls: now.settled.saturating_sub(oldest.settled),
            failed: now.failed.saturating_sub(oldest.failed),
            p50: quantile(&buckets, 0.50),
            p99: quantile(&buckets, 0.99),
            last_bound: (buckets.iter().rev())
                .map(|&(bound, _)| bound)
                .find(|bound| bound.is_finite())
                .unwrap_or(0.0),
        }
    }

    /// A worker session's slots in use at each sample and now, oldest first.
    pub fn slots(&self, session: &str) -> Vec<Option<&WorkerLoad>> {
        (self.samples.iter().chain([&self.now]))
            .map(|sample| sample.workers.iter().find(|worker| worker.session == session))
            .collect()
    }

    /// Sessions a sample saw that are not connected now, the most recently seen first.
    pub fn gone(&self) -> Vec<Gone<'_>> {
        let mut gone: BTreeMap<&str, Gone<'_>> = BTreeMap::new();
        for sample in &self.samples {
            for worker in &sample.workers {
                if !self.now.workers.iter().any(|now| now.session == worker.session) {
                    gone.insert(
                        &worker.session,
                        Gone {
                            worker,
                            last_seen: sample.at,
                        },
                    );
                }
            }
        }
        let mut gone: Vec<Gone<'_>> = gone.into_values().collect();
        gone.sort_by_key(|g| std::cmp::Reverse(g.last_seen));
        gone
    }
}

/// Cumulative buckets of `now` less those of `before`, bound by bound.
fn since(now: &[(f64, u64)], before: &[(f64, u64)]) -> Vec<(f64, u64)> {
    (now.iter())
        .map(|&(bound, count)| {
            let earlier = (before.iter())
                .find(|(b, _)| *b == bound)
                .map_or(0, |&(_, count)| count);
            (bound, count.saturating_sub(earlier))
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `q` of cumulative `buckets`; `None` without
/// calls.
fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).max(1);
    buckets
        .iter()
        .find(|(_, count)| *count >= rank)
        .map(|&(bound, _)| bound)
}

/// A bucket's bound as the page writes it: `≤ 5 ms`, or `> 300 s` past the last.
pub fn bound(seconds: Option<f64>, last_finite: f64) -> String {
    let written = |s: f64| match s * 1000.0 {
        ms if ms < 1.0 => format!("{ms} ms"),
        ms => format::duration(ms.round() as i64),
    };
    match seconds {
        None => "—".to_owned(),
        Some(s) if s.is_infinite() => format!("> {}", written(last_finite)),
        Some(s) => format!("≤ {}", written(s)),
    }
}

/// A worker's slots in use over the window as a bar chart, one bar a sample; a gap where the
/// session was not there. Its label says what it shows, for a reader who cannot see it.
pub fn slots_chart(loads: &[Option<&WorkerLoad>]) -> Markup {
    let slots = loads.iter().flatten().map(|w| w.slots).max().unwrap_or(0).max(1);
    let peak = loads.iter().flatten().map(|w| w.in_use).max().unwrap_or(0);
    let now = loads.last().copied().flatten().map_or(0, |w| w.in_use);
    let width = loads.len().max(1);
    let step = SAMPLE_EVERY.as_secs();
    let label = format!(
        "slots in use every {step} s over the last {}: at most {peak} of {slots}, {now} now",
        format::duration((loads.len().saturating_sub(1) as u64 * step * 1000) as i64)
    );
    html! {
        svg.slots viewBox={ "0 0 " (width * 4) " 20" } width=(width * 4) height="20" role="img" aria-label=(label) {
            title { (label) }
            rect.full x="0" y="0" width=(width * 4) height="20" {}
            @for (index, load) in loads.iter().enumerate() {
                @if let Some(load) = load {
                    @let height = (f64::from(load.in_use) / f64::from(slots) * 20.0).round().max(if load.in_use > 0 { 1.0 } else { 0.0 });
                    rect x=(index * 4) y=(20.0 - height) width="3" height=(height) {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: i64, settled: u64, failed: u64, buckets: &[(f64, u64)], workers: &[(&str, u32)]) -> Sample {
        Sample {
            at,
            tools: [(
                "add".to_owned(),
                ToolCounts {
                    settled,
                    failed,
                    buckets: buckets.to_vec(),
                },
            )]
            .into(),
            workers: (workers.iter())
                .map(|&(session, in_use)| WorkerLoad {
                    session: session.to_owned(),
                    name: format!("w-{session}"),
                    in_use,
                    slots: 4,
                })
                .collect(),
        }
    }

    #[test]
    fn a_tools_figures_are_the_windows_differences() {
        let samples = vec![
            sample(
                0,
                10,
                1,
                &[(0.005, 8), (1.0, 10), (f64::INFINITY, 10)],
                &[("a", 1), ("b", 2)],
            ),
            sample(
                50_000,
                30,
                3,
                &[(0.005, 20), (1.0, 30), (f64::INFINITY, 30)],
                &[("a", 4), ("b", 0)],
            ),
        ];
        let now = sample(
            100_000,
            110,
            13,
            &[(0.005, 20), (1.0, 108), (f64::INFINITY, 110)],
            &[("a", 2)],
        );
        let window = Window::new(samples, now, 0);
        let figures = window.tool("add");
        assert_eq!(
            figures,
            ToolFigures {
                // 100 calls since the sample a minute or more ago, 100 s ago.
                per_minute: 60.0,
                calls: 100,
                failed: 12,
                // Of the window's 100 calls, 12 took up to 5 ms and 98 up to a second.
                p50: Some(1.0),
                p99: Some(f64::INFINITY),
                last_bound: 1.0,
            }
        );
        assert_eq!(window.tool("other").p50, None);
        assert_eq!(window.span_ms(), 100_000);
        let gone = window.gone();
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].worker.session.as_str(), gone[0].last_seen), ("b", 50_000));
        let a: Vec<Option<u32>> = window.slots("a").iter().map(|w| w.map(|w| w.in_use)).collect();
        assert_eq!(a, vec![Some(1), Some(4), Some(2)]);
    }

    #[test]
    fn a_young_window_counts_from_the_kernels_start() {
        let now = sample(5_000, 7, 0, &[(0.005, 7), (f64::INFINITY, 7)], &[]);
        let window = Window::new(Vec::new(), now, 0);
        assert_eq!(window.tool("add").calls, 7);
        assert_eq!(window.tool("add").per_minute, 84.0);
        assert_eq!(window.tool("add").p99, Some(0.005));
    }

    #[test]
    fn bounds_read_as_upper_limits() {
        assert_eq!(bound(Some(0.005), 300.0), "≤ 5 ms");
        assert_eq!(bound(Some(0.0005), 300.0), "≤ 0.5 ms");
        assert_eq!(bound(Some(f64::INFINITY), 300.0), "> 5m 00s");
        assert_eq!(bound(None, 300.0), "—");
    }
}
