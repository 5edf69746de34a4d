//! The sustained section: concurrent runs making one-call turns for a set time, with the rate
//! second by second (so a rate that decays shows), and what the kernel spent on it, read from
//! `AdminService.GetStatus` before, during and after: CPU time and store commits per call, and
//! resident memory at its peak, at the end, and once it settled.

use std::time::{Duration, Instant};

use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_client::AdminServiceClient;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::BenchError;
use super::driver::{Agent, Budget, noop_call};
use super::progress::Progress;
use super::stats::Latency;
use crate::client::Authed;

/// The fewest worker sessions whose memory the report divides among them.
pub const SESSIONS_MEASURED: u32 = 100;

/// How often resident memory is sampled for its peak.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the sustained section measured.
#[derive(Debug, Clone, Serialize)]
pub struct Sustained {
    pub concurrency: u32,
    pub seconds: f64,
    pub calls: u64,
    pub calls_per_s: f64,
    /// Calls completed in each second, in order.
    pub per_second: Vec<u64>,
    #[serde(flatten)]
    pub latency: Latency,
    /// The kernel's side; `None` when `GetStatus` was refused (it needs a key with `admin`).
    pub kernel: Option<KernelCost>,
}

/// What the kernel process spent on the section.
#[derive(Debug, Clone, Serialize)]
pub struct KernelCost {
    /// Kernel CPU (user and system) per call, in milliseconds; `None` where it cannot tell.
    pub cpu_ms_per_call: Option<f64>,
    /// Store transactions per call.
    pub commits_per_call: f64,
    /// Of those, the ones that waited for the disk: one log fsync each on SQLite at durability
    /// `full`.
    pub fsyncs_per_call: f64,
    /// SQL statements the store's writer ran per call, transaction control included.
    pub statements_per_call: f64,
    /// KiB (1,024 bytes) the kernel process wrote to storage per call: the log, and the database
    /// as checkpoints copy the log into it; `None` where the kernel cannot tell.
    pub disk_kib_per_call: Option<f64>,
    pub rss_before_bytes: u64,
    pub rss_peak_bytes: u64,
    pub rss_end_bytes: u64,
    /// After `--settle` with nothing running, when asked for.
    pub rss_settled_bytes: Option<u64>,
    pub settle_s: Option<f64>,
}

/// The kernel's counters at one moment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Usage {
    cpu_micros: u64,
    commits: u64,
    syncs: u64,
    statements: u64,
    /// Bytes written to storage; 0 where the kernel cannot tell.
    written: u64,
    resident: u64,
}

/// What the store wrote per call over a section.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Writes {
    pub fsyncs_per_call: f64,
    pub statements_per_call: f64,
    pub disk_kib_per_call: Option<f64>,
}

/// What the kernel holds per worker session: its resident memory before and after the
/// benchmark's sessions opened (and before any call ran).
#[derive(Debug, Clone, Serialize)]
pub struct Sessions {
    pub sessions: u32,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    /// The difference over the sessions, in KiB (1,024 bytes).
    pub kib_per_session: f64,
}

impl Sessions {
    /// Resident memory now, to compare once the sessions are open.
    pub async fn before(admin: &mut AdminServiceClient<Authed>) -> Option<u64> {
        usage(admin).await.map(|usage| usage.resident)
    }

    /// The figures, from `before` and a reading now; `None` when either is missing, or for fewer
    /// than [`SESSIONS_MEASURED`] sessions, whose difference is lost in the noise of a process
    /// warming up.
    pub async fn measure(
        admin: &mut AdminServiceClient<Authed>,
        before: Option<u64>,
        sessions: u32,
    ) -> Option<Sessions> {
        if sessions < SESSIONS_MEASURED {
            return None;
        }
        let (before, after) = (before?, usage(admin).await?.resident);
        Some(Sessions {
            sessions,
            rss_before_bytes: before,
            rss_after_bytes: after,
            kib_per_session: after.saturating_sub(before) as f64 / 1024.0 / f64::from(sessions.max(1)),
        })
    }
}

impl Usage {
    /// The commits that waited for the disk, the writer's statements and the bytes written to
    /// storage, per call, from `before` to this reading.
    pub(super) fn writes_per_call(&self, before: &Usage, calls: u64) -> Writes {
        let per_call = |delta: u64| delta as f64 / calls.max(1) as f64;
        Writes {
            fsyncs_per_call: per_call(self.syncs.saturating_sub(before.syncs)),
            statements_per_call: per_call(self.statements.saturating_sub(before.statements)),
            disk_kib_per_call: (self.written > 0)
                .then(|| per_call(self.written.saturating_sub(before.written)) / 1024.0),
        }
    }
}

/// The kernel's counters now; `None` when `GetStatus` was refused.
pub(super) async fn usage(admin: &mut AdminServiceClient<Authed>) -> Option<Usage> {
    let status = admin.get_status(pb::GetStatusRequest {}).await.ok()?.into_inner();
    Some(Usage {
        cpu_micros: status.cpu_micros,
        commits: status.store_commits,
        syncs: status.store_syncs,
        statements: status.store_statements,
        written: status.disk_write_bytes,
        resident: status.resident_bytes,
    })
}

/// Runs `concurrency` runs for `length`, then waits `settle` (if any) for memory to come back.
pub async fn run(
    agent: &Agent,
    admin: AdminServiceClient<Authed>,
    progress: &Progress,
    (concurrency, length, settle): (u32, Duration, Option<Duration>),
) -> Result<Sustained, BenchError> {
    progress.phase(format!("sustained, {concurrency} runs for {}s", length.as_secs()), 0);
    let mut probe = admin.clone();
    let before = usage(&mut probe).await;
    let stop = CancellationToken::new();
    let peak = tokio::spawn(peak_resident(admin, stop.clone()));
    let sample = agent
        .drive(
            progress,
            "sustained",
            concurrency,
            Budget::For(length),
            noop_call(),
            |_| Ok(()),
        )
        .await;
    stop.cancel();
    let peak = peak.await.unwrap_or(0);
    let sample = sample?;
    let end = usage(&mut probe).await;
    let settled = match settle {
        Some(settle) => {
            progress.note(&format!(
                "waiting {}s for the kernel's memory to settle",
                settle.as_secs()
            ));
            tokio::time::sleep(settle).await;
            usage(&mut probe).await.map(|usage| (usage.resident, settle))
        }
        None => None,
    };
    let calls = sample.latencies.len() as u64;
    let kernel = match (before, end) {
        (Some(before), Some(end)) => Some(cost(before, end, peak, settled, calls)),
        _ => None,
    };
    let calls_per_s = sample.calls_per_s();
    let mut latencies = sample.latencies;
    let latency = Latency::of(&mut latencies).ok_or_else(|| BenchError::Unexpected("no call completed".into()))?;
    progress.finish(&format!(
        "{calls_per_s:.0} calls/s over {:.0}s",
        sample.elapsed.as_secs_f64()
    ));
    Ok(Sustained {
        concurrency,
        seconds: sample.elapsed.as_secs_f64(),
        calls,
        calls_per_s,
        per_second: sample.per_second,
        latency,
        kernel,
    })
}

fn cost(before: Usage, end: Usage, peak: u64, settled: Option<(u64, Duration)>, calls: u64) -> KernelCost {
    let per_call = |delta: u64| delta as f64 / calls.max(1) as f64;
    let Writes {
        fsyncs_per_call,
        statements_per_call,
        disk_kib_per_call,
    } = end.writes_per_call(&before, calls);
    KernelCost {
        cpu_ms_per_call: (before.cpu_micros > 0)
            .then(|| per_call(end.cpu_micros.saturating_sub(before.cpu_micros)) / 1000.0),
        commits_per_call: per_call(end.commits.saturating_sub(before.commits)),
        fsyncs_per_call,
        statements_per_call,
        disk_kib_per_call,
        rss_before_bytes: before.resident,
        rss_peak_bytes: peak.max(before.resident).max(end.resident),
        rss_end_bytes: end.resident,
        rss_settled_bytes: settled.map(|(resident, _)| resident),
        settle_s: settled.map(|(_, settle)| settle.as_secs_f64()),
    }
}

/// The highest resident size seen, sampled every second until `stop`.
async fn peak_resident(mut admin: AdminServiceClient<Authed>, stop: CancellationToken) -> u64 {
    let mut peak = 0;
    let mut next = Instant::now();
    loop {
        if let Some(now) = usage(&mut admin).await {
            peak = peak.max(now.resident);
        }
        next += SAMPLE_EVERY;
        tokio::select! {
            _ = stop.cancelled() => return peak,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_cost_is_per_call() {
        let before = Usage {
            cpu_micros: 1_000_000,
            commits: 10,
            syncs: 8,
            statements: 100,
            written: 1 << 20,
            resident: 40 << 20,
        };
        let end = Usage {
            cpu_micros: 4_000_000,
            commits: 5_010,
            syncs: 2_008,
            statements: 150_100,
            written: (1 << 20) + 10_000 * 4096,
            resident: 60 << 20,
        };
        let cost = cost(before, end, 80 << 20, Some((42 << 20, Duration::from_secs(60))), 10_000);
        assert_eq!(cost.cpu_ms_per_call, Some(0.3));
        assert_eq!(cost.commits_per_call, 0.5);
        assert_eq!(cost.fsyncs_per_call, 0.2);
        assert_eq!(cost.statements_per_call, 15.0);
        assert_eq!(cost.disk_kib_per_call, Some(4.0));
        assert_eq!(cost.rss_peak_bytes, 80 << 20);
        assert_eq!(cost.rss_settled_bytes, Some(42 << 20));
        let unknown_cpu = super::cost(
            Usage {
                cpu_micros: 0,
                ..before
            },
            end,
            0,
            None,
            10_000,
        );
        assert_eq!(unknown_cpu.cpu_ms_per_call, None);
        assert_eq!(
            unknown_cpu.rss_peak_bytes,
            60 << 20,
            "the peak is at least what was seen at the ends"
        );
    }
}
