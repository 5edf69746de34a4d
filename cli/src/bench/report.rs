//! What a benchmark measured, section by section: serialized as is for `--json`, drawn as
//! tables otherwise. Absent sections are `null` in JSON and left out of the tables.

use serde::Serialize;

use super::stats::Latency;
use crate::render::table;

/// Every section's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kernel: String,
    pub workers: u32,
    /// The kernel's resident memory per open worker session; `None` without `GetStatus`.
    pub sessions: Option<super::sustained::Sessions>,
    /// This machine's floors, measured before the kernel is driven.
    pub floor: Option<super::floor::Floor>,
    pub sequential: Option<Sequential>,
    /// The same, calling a tool declared `at_most_once`.
    pub sequential_at_most_once: Option<Sequential>,
    pub throughput: Option<Vec<Throughput>>,
    pub sustained: Option<super::sustained::Sustained>,
    pub fanout: Option<Fanout>,
    pub replay: Option<Replay>,
    /// The replay section's run read from the web console (`--console`).
    pub console: Option<super::console::Console>,
    pub payload: Option<Vec<Payload>>,
    pub hosted: Option<super::hosted::Hosted>,
}

/// One call per turn, one after the other.
#[derive(Debug, Clone, Serialize)]
pub struct Sequential {
    /// The tool's declared idempotency: `safe_to_retry` or `at_most_once`.
    pub idempotency: &'static str,
    /// Commits that waited for the disk, per call; `None` without `GetStatus`.
    pub fsyncs_per_call: Option<f64>,
    /// SQL statements the store's writer ran per call; `None` without `GetStatus`.
    pub statements_per_call: Option<f64>,
    /// KiB the kernel process wrote to storage per call; `None` without `GetStatus`, or where
    /// the kernel cannot tell.
    pub disk_kib_per_call: Option<f64>,
    pub calls: u64,
    pub elapsed_s: f64,
    pub calls_per_s: f64,
    #[serde(flatten)]
    pub latency: Latency,
}

/// `concurrency` runs making one-call turns back to back, `calls` in all.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub concurrency: u32,
    pub calls: u64,
    pub elapsed_s: f64,
    pub calls_per_s: f64,
    #[serde(flatten)]
    pub latency: Latency,
}

/// Turns of `calls_per_turn` calls each; the latency is that of a whole turn.
#[derive(Debug, Clone, Serialize)]
pub struct Fanout {
    pub calls_per_turn: u32,
    pub turns: u32,
    /// Calls per second of the median turn.
    pub calls_per_s: f64,
    #[serde(flatten)]
    pub turn_latency: Latency,
}

/// A run recorded turn by turn, then every turn submitted again.
#[derive(Debug, Clone, Serialize)]
pub struct Replay {
    /// The recorded run, left in the kernel to read.
    pub run_id: String,
    pub turns: u32,
    pub calls_per_turn: u32,
    pub calls: u64,
    /// Time to record the run in the first place (every call run by a worker).
    pub record_s: f64,
    pub record_calls_per_s: f64,
    /// Time to resubmit every turn and get every result back from the log, streamed one by one
    /// (`SubmitTurn`).
    pub replay_ms: f64,
    pub replay_calls_per_s: f64,
    /// The same for another run recorded the same way, each turn's results in one answer
    /// (`CallTurn`, what the Python SDK's `call_turn` asks for).
    pub one_answer_ms: f64,
    pub one_answer_calls_per_s: f64,
    /// Results served from the log; always equal to `calls` (anything else fails the benchmark).
    pub replayed: u64,
}

/// Calls whose result (as recorded, JSON) is `bytes` long, from `concurrency` runs.
#[derive(Debug, Clone, Serialize)]
pub struct Payload {
    pub bytes: u64,
    pub calls: u64,
    pub concurrency: u32,
    pub elapsed_s: f64,
    pub calls_per_s: f64,
    /// Result bytes delivered to the agent per second, in MB (10^6 bytes).
    pub mb_per_s: f64,
    #[serde(flatten)]
    pub latency: Latency,
}

/// A latency as a person reads it: `0.412ms`, `12.3ms`, `1.25s`.
pub fn ms(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.3}ms")
    } else if value < 1000.0 {
        format!("{value:.1}ms")
    } else {
        format!("{:.2}s", value / 1000.0)
    }
}

fn rate(value: f64) -> String {
    format!("{value:.0}")
}

fn size(bytes: u64) -> String {
    super::ByteSize(bytes).to_string()
}

fn mib(bytes: u64) -> String {
    crate::render::bytes(Some(bytes))
}

/// KiB per call, or `-` where the kernel could not tell.
fn kib(per_call: Option<f64>) -> String {
    per_call.map_or_else(|| "-".into(), |n| format!("{n:.1} KiB"))
}

/// The floor section: each of this machine's floors as a row.
fn floor_table(floor: &super::floor::Floor) -> String {
    let rows = [
        ("4 KiB append + fdatasync", &floor.sync),
        ("thread woken, answers (2 wakes)", &floor.wake_round_trip),
        ("loopback TCP round trip, 64 B", &floor.tcp_round_trip),
    ];
    format!(
        "\nthis machine's floors (the sync in {})\n{}",
        floor.dir,
        table(
            &["MEASURE", "SAMPLES", "P50", "P90", "P99", "MAX"],
            rows.into_iter().map(|(name, l)| {
                vec![
                    name.to_owned(),
                    floor.samples.to_string(),
                    ms(l.p50_ms),
                    ms(l.p90_ms),
                    ms(l.p99_ms),
                    ms(l.max_ms),
                ]
            }),
        )
    )
}

/// The sustained section: its rate and latency, the rate second by second, and the kernel's cost.
fn sustained(s: &super::sustained::Sustained) -> String {
    let mut text = format!(
        "\nsustained ({} concurrent runs for {:.0}s, one-call turns back to back)\n",
        s.concurrency, s.seconds
    );
    // The last second holds only the calls in flight when time ran out.
    let whole = &s.per_second[..s.per_second.len().saturating_sub(1)];
    text.push_str(&table(
        &[
            "CALLS",
            "CALLS/S",
            "P50",
            "P99",
            "MAX",
            "SLOWEST SECOND",
            "FASTEST SECOND",
        ],
        [vec![
            s.calls.to_string(),
            rate(s.calls_per_s),
            ms(s.latency.p50_ms),
            ms(s.latency.p99_ms),
            ms(s.latency.max_ms),
            whole.iter().min().map_or_else(|| "-".into(), u64::to_string),
            whole.iter().max().map_or_else(|| "-".into(), u64::to_string),
        ]],
    ));
    let series: Vec<String> = whole.iter().map(u64::to_string).collect();
    text.push_str(&format!("calls/s by second: {}\n", series.join(" ")));
    match &s.kernel {
        Some(k) => {
            let cpu = k.cpu_ms_per_call.map_or_else(|| "-".into(), ms);
            let mut line = format!(
                "kernel: cpu {cpu}/call, {:.2} commits/call ({:.2} fsyncs), {:.1} statements/call, {} written/call; rss {} before, {} peak, {} at the end",
                k.commits_per_call,
                k.fsyncs_per_call,
                k.statements_per_call,
                kib(k.disk_kib_per_call),
                mib(k.rss_before_bytes),
                mib(k.rss_peak_bytes),
                mib(k.rss_end_bytes)
            );
            if let (Some(settled), Some(after)) = (k.rss_settled_bytes, k.settle_s) {
                line.push_str(&format!(", {} after {after:.0}s idle", mib(settled)));
            }
            text.push_str(&line);
            text.push('\n');
        }
        None => text.push_str("kernel: its figures need a key with admin (GetStatus)\n"),
    }
    text
}

impl Report {
    /// The human form: a heading and a table per section that ran.
    pub fn render(&self) -> String {
        let mut text = format!(
            "kernelctl bench: {} with {} worker sessions\n",
            self.kernel, self.workers
        );
        if let Some(s) = &self.sessions {
            text.push_str(&format!(
                "kernel rss {} before the sessions opened, {} after: {:.1} KiB per session\n",
                mib(s.rss_before_bytes),
                mib(s.rss_after_bytes),
                s.kib_per_session
            ));
        }
        if let Some(floor) = &self.floor {
            text.push_str(&floor_table(floor));
        }
        let sequential: Vec<&Sequential> = [&self.sequential, &self.sequential_at_most_once]
            .into_iter()
            .flatten()
            .collect();
        if !sequential.is_empty() {
            text.push_str("\nsequential round trip (one call per turn)\n");
            text.push_str(&table(
                &[
                    "TOOL",
                    "CALLS",
                    "CALLS/S",
                    "P50",
                    "P90",
                    "P99",
                    "MAX",
                    "FSYNCS/CALL",
                    "SQL/CALL",
                    "DISK/CALL",
                ],
                sequential.into_iter().map(|s| {
                    vec![
                        s.idempotency.to_owned(),
                        s.calls.to_string(),
                        rate(s.calls_per_s),
                        ms(s.latency.p50_ms),
                        ms(s.latency.p90_ms),
                        ms(s.latency.p99_ms),
                        ms(s.latency.max_ms),
                        s.fsyncs_per_call.map_or_else(|| "-".into(), |n| format!("{n:.2}")),
                        s.statements_per_call.map_or_else(|| "-".into(), |n| format!("{n:.1}")),
                        kib(s.disk_kib_per_call),
                    ]
                }),
            ));
        }
        if let Some(levels) = &self.throughput {
            text.push_str("\nthroughput (concurrent runs, one-call turns back to back)\n");
            text.push_str(&table(
                &["RUNS", "CALLS", "CALLS/S", "P50", "P99", "MAX"],
                levels.iter().map(|t| {
                    vec![
                        t.concurrency.to_string(),
                        t.calls.to_string(),
                        rate(t.calls_per_s),
                        ms(t.latency.p50_ms),
                        ms(t.latency.p99_ms),
                        ms(t.latency.max_ms),
                    ]
                }),
            ));
        }
        if let Some(s) = &self.sustained {
            text.push_str(&sustained(s));
        }
        if let Some(f) = &self.fanout {
            text.push_str("\nfan-out (all calls of one turn at once)\n");
            text.push_str(&table(
                &["CALLS/TURN", "TURNS", "CALLS/S", "TURN P50", "TURN MAX"],
                [vec![
                    f.calls_per_turn.to_string(),
                    f.turns.to_string(),
                    rate(f.calls_per_s),
                    ms(f.turn_latency.p50_ms),
                    ms(f.turn_latency.max_ms),
                ]],
            ));
        }
        if let Some(r) = &self.replay {
            text.push_str(
                "\nreplay (every turn of a recorded run submitted again, its results streamed; of another, in one answer)\n",
            );
            text.push_str(&table(
                &[
                    "TURNS",
                    "CALLS/TURN",
                    "CALLS",
                    "RECORD",
                    "REPLAY",
                    "REPLAYED/S",
                    "ONE ANSWER",
                    "REPLAYED/S",
                ],
                [vec![
                    r.turns.to_string(),
                    r.calls_per_turn.to_string(),
                    r.calls.to_string(),
                    ms(r.record_s * 1000.0),
                    ms(r.replay_ms),
                    rate(r.replay_calls_per_s),
                    ms(r.one_answer_ms),
                    rate(r.one_answer_calls_per_s),
                ]],
            ));
        }
        if let Some(c) = &self.console {
            text.push_str(&format!(
                "\nconsole ({}, a run of {} steps, each page fetched {} times)\n",
                c.url, c.steps, c.rounds
            ));
            text.push_str(&table(
                &["PAGE", "PATH", "SIZE", "P50", "P90", "MAX"],
                c.pages.iter().map(|p| {
                    vec![
                        p.page.clone(),
                        p.path.clone(),
                        format!("{:.0} KiB", p.bytes as f64 / 1024.0),
                        ms(p.latency.p50_ms),
                        ms(p.latency.p90_ms),
                        ms(p.latency.max_ms),
                    ]
                }),
            ));
        }
        if let Some(sizes) = &self.payload {
            let concurrency = sizes.first().map_or(0, |p| p.concurrency);
            text.push_str(&format!("\npayload (result size, {concurrency} concurrent runs)\n"));
            text.push_str(&table(
                &["SIZE", "CALLS", "CALLS/S", "MB/S", "P50", "P99"],
                sizes.iter().map(|p| {
                    vec![
                        size(p.bytes),
                        p.calls.to_string(),
                        rate(p.calls_per_s),
                        format!("{:.1}", p.mb_per_s),
                        ms(p.latency.p50_ms),
                        ms(p.latency.p99_ms),
                    ]
                }),
            ));
        }
        if let Some(h) = &self.hosted {
            text.push_str(
                "
hosted runs (live, then replayed from the start on another host after the first is lost)
",
            );
            text.push_str(&table(
                &[
                    "STEPS",
                    "STEPS LIVE",
                    "PER STEP",
                    "CALLS",
                    "CALLS LIVE",
                    "PER CALL",
                    "RESUME",
                    "REPLAY",
                ],
                [vec![
                    h.steps.to_string(),
                    ms(h.steps_live_ms),
                    format!("{:.0}µs", h.step_us),
                    h.calls.to_string(),
                    ms(h.calls_live_ms),
                    format!("{:.0}µs", h.call_us),
                    ms(h.resume_ms),
                    format!("{} ({} recorded)", ms(h.replay_ms), h.replayed),
                ]],
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency(p50_ms: f64) -> Latency {
        Latency {
            p50_ms,
            p90_ms: p50_ms * 2.0,
            p99_ms: p50_ms * 4.0,
            max_ms: p50_ms * 10.0,
            mean_ms: p50_ms,
        }
    }

    fn report() -> Report {
        Report {
            kernel: "http://127.0.0.1:1".into(),
            workers: 4,
            sessions: Some(super::super::sustained::Sessions {
                sessions: 4,
                rss_before_bytes: 20 << 20,
                rss_after_bytes: (20 << 20) + 200 * 1024,
                kib_per_session: 50.0,
            }),
            floor: Some(super::super::floor::Floor {
                dir: ".".into(),
                samples: 1000,
                sync: latency(0.16),
                wake_round_trip: latency(0.042),
                tcp_round_trip: latency(0.03),
            }),
            sequential: Some(Sequential {
                idempotency: "safe_to_retry",
                fsyncs_per_call: Some(1.0),
                statements_per_call: Some(14.0),
                disk_kib_per_call: Some(9.25),
                calls: 2000,
                elapsed_s: 1.0,
                calls_per_s: 2000.0,
                latency: latency(0.5),
            }),
            sequential_at_most_once: Some(Sequential {
                idempotency: "at_most_once",
                fsyncs_per_call: None,
                statements_per_call: None,
                disk_kib_per_call: None,
                calls: 2000,
                elapsed_s: 1.5,
                calls_per_s: 1333.0,
                latency: latency(0.75),
            }),
            throughput: Some(vec![Throughput {
                concurrency: 64,
                calls: 5000,
                elapsed_s: 0.5,
                calls_per_s: 10_000.0,
                latency: latency(6.0),
            }]),
            sustained: Some(super::super::sustained::Sustained {
                concurrency: 64,
                seconds: 3.0,
                calls: 9_050,
                calls_per_s: 3_016.0,
                per_second: vec![3_000, 3_100, 2_900, 50],
                latency: latency(20.0),
                kernel: Some(super::super::sustained::KernelCost {
                    cpu_ms_per_call: Some(0.31),
                    commits_per_call: 0.25,
                    fsyncs_per_call: 0.2,
                    statements_per_call: 15.0,
                    disk_kib_per_call: Some(40.5),
                    rss_before_bytes: 40 << 20,
                    rss_peak_bytes: 60 << 20,
                    rss_end_bytes: 50 << 20,
                    rss_settled_bytes: Some(41 << 20),
                    settle_s: Some(60.0),
                }),
            }),
            fanout: None,
            console: Some(super::super::console::Console {
                url: "http://127.0.0.1:2".into(),
                run_id: "01a24f86-c53f-76f4-9738-c31be175adcc".into(),
                steps: 10_000,
                rounds: 20,
                pages: vec![super::super::console::ConsolePage {
                    page: "last page".into(),
                    path: "/runs/01a24f86-c53f-76f4-9738-c31be175adcc?page=50".into(),
                    bytes: 700 << 10,
                    latency: latency(48.0),
                }],
            }),
            replay: Some(Replay {
                run_id: "01a24f86-c53f-76f4-9738-c31be175adcc".into(),
                turns: 100,
                calls_per_turn: 100,
                calls: 10_000,
                record_s: 2.5,
                record_calls_per_s: 4000.0,
                replay_ms: 150.0,
                replay_calls_per_s: 66_666.0,
                one_answer_ms: 100.0,
                one_answer_calls_per_s: 100_000.0,
                replayed: 10_000,
            }),
            payload: Some(vec![Payload {
                bytes: 1 << 20,
                calls: 64,
                concurrency: 16,
                elapsed_s: 1.0,
                calls_per_s: 64.0,
                mb_per_s: 67.1,
                latency: latency(200.0),
            }]),
            hosted: Some(super::super::hosted::Hosted {
                steps: 1000,
                calls: 1000,
                steps_live_ms: 900.0,
                step_us: 900.0,
                calls_live_ms: 1500.0,
                call_us: 1500.0,
                resume_ms: 3.0,
                replay_ms: 40.0,
                replayed: 2000,
            }),
        }
    }

    #[test]
    fn latencies_read_in_the_right_unit() {
        assert_eq!(ms(0.4123), "0.412ms");
        assert_eq!(ms(12.34), "12.3ms");
        assert_eq!(ms(1250.0), "1.25s");
    }

    #[test]
    fn tables_show_the_sections_that_ran() {
        let text = report().render();
        assert!(text.starts_with("kernelctl bench: http://127.0.0.1:1 with 4 worker sessions\n"));
        assert!(text.contains("sequential round trip"), "{text}");
        assert!(text.contains("this machine's floors (the sync in .)"), "{text}");
        assert!(
            text.contains("4 KiB append + fdatasync         1000     0.160ms  0.320ms  0.640ms  1.600ms"),
            "{text}"
        );
        assert!(
            text.contains("thread woken, answers (2 wakes)  1000     0.042ms"),
            "{text}"
        );
        assert!(
            text.contains("kernel rss 20.0 MiB before the sessions opened, 20.2 MiB after: 50.0 KiB per session"),
            "{text}"
        );
        assert!(
            text.contains("2000   2000     0.500ms  1.000ms  2.000ms  5.000ms"),
            "{text}"
        );
        assert!(text.contains("1.00         14.0      9.2 KiB"), "{text}");
        assert!(text.contains("64    5000   10000    6.000ms  24.0ms  60.0ms"), "{text}");
        assert!(!text.contains("fan-out"), "{text}");
        assert!(text.contains("sustained (64 concurrent runs for 3s"), "{text}");
        assert!(text.contains("calls/s by second: 3000 3100 2900\n"), "{text}");
        assert!(text.contains("2900            3100"), "{text}");
        assert!(
            text.contains(
                "kernel: cpu 0.310ms/call, 0.25 commits/call (0.20 fsyncs), 15.0 statements/call, 40.5 KiB written/call; rss 40.0 MiB before, 60.0 MiB peak, 50.0 MiB at \
                 the end, 41.0 MiB after 60s idle"
            ),
            "{text}"
        );
        assert!(text.contains("150.0ms"), "{text}");
        assert!(text.contains("1 MiB  64     64       67.1"), "{text}");
        assert!(text.contains("hosted runs"), "{text}");
        assert!(
            text.contains("console (http://127.0.0.1:2, a run of 10000 steps, each page fetched 20 times)"),
            "{text}"
        );
        assert!(
            text.contains("last page  /runs/01a24f86-c53f-76f4-9738-c31be175adcc?page=50  700 KiB  48.0ms"),
            "{text}"
        );
        assert!(
            text.contains("900µs") && text.contains("40.0ms (2000 recorded)"),
            "{text}"
        );
        assert!(text.lines().all(|line| line == line.trim_end()));
    }

    #[test]
    fn json_flattens_latencies_and_keeps_absent_sections_null() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["sequential"]["p50_ms"], 0.5);
        assert_eq!(json["floor"]["sync"]["p50_ms"], 0.16);
        assert_eq!(json["floor"]["wake_round_trip"]["p99_ms"], 0.168);
        assert_eq!(json["sequential"]["calls"], 2000);
        assert_eq!(json["sequential"]["disk_kib_per_call"], 9.25);
        assert_eq!(json["throughput"][0]["concurrency"], 64);
        assert_eq!(json["throughput"][0]["p99_ms"], 24.0);
        assert!(json["fanout"].is_null());
        assert_eq!(json["replay"]["replayed"], 10_000);
        assert_eq!(json["console"]["pages"][0]["p50_ms"], 48.0);
        assert_eq!(json["console"]["pages"][0]["bytes"], 700 << 10);
        assert_eq!(json["payload"][0]["mb_per_s"], 67.1);
        assert_eq!(json["sustained"]["per_second"][1], 3_100);
        assert_eq!(json["sustained"]["kernel"]["commits_per_call"], 0.25);
    }
}
