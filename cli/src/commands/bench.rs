//! `kernelctl bench`: opens the benchmark's worker sessions, runs each planned section against
//! the kernel, closes the sessions whatever happened, and prints the [`Report`].
//!
//! It runs on a multi-threaded runtime of its own (see `main`): agent and workers share this
//! process, and one thread would bound the figures long before the kernel does.

use crate::args::KernelAddr;
use crate::bench::driver::Agent;
use crate::bench::progress::Progress;
use crate::bench::report::Report;
use crate::bench::workers::BenchWorkers;
use crate::bench::{BenchArgs, BenchError, Plan};
use crate::client::{Access, Kernel};

use super::Output;

/// Runs the benchmark against the kernel at `addr` and writes its report to `out`. With keys, the
/// key needs `runs:write`, `tools:call` and `workers:connect` with tools `bench_*` (or `admin`).
pub async fn run(addr: &KernelAddr, access: &Access, out: &mut Output<'_>, args: BenchArgs) -> Result<(), BenchError> {
    let plan = Plan::new(&args);
    if args.console.is_some() && plan.console.is_none() {
        return Err(BenchError::Setup(
            "--console reads the replay section's run: add `replay` to --sections".to_owned(),
        ));
    }
    // Fails fast, with the usual wording, when nothing listens at `addr`.
    let kernel = Kernel::connect(addr, access).await?;
    let progress = Progress::new();
    let _ticker = progress.start_ticker();

    let label = format!("{}-{}", std::process::id(), unique_suffix());
    let agent = Agent::connect(addr, access, &label, (plan.turns_per_run, args.budget.clone())).await?;
    let mut admin = kernel.admin.clone();
    let before_sessions = crate::bench::sustained::Sessions::before(&mut admin).await;
    progress.note(&format!("opening {} worker sessions", plan.workers));
    let workers = BenchWorkers::start(
        addr.as_str(),
        access,
        kernel.registry.clone(),
        &format!("bench-{label}"),
        plan.workers,
        plan.peak_concurrency(),
    )
    .await?;
    let sessions = crate::bench::sustained::Sessions::measure(&mut admin, before_sessions, plan.workers).await;

    let measured = sections(&agent, &progress, &plan, (addr, &kernel, access)).await;
    let measured = measured.map(|report| Report { sessions, ..report });
    let measured = match (measured, plan.hosted) {
        (Ok(mut report), Some(counts)) => {
            let clients = (kernel.runs.clone(), kernel.registry.clone());
            match crate::bench::hosted::run((addr.as_str(), access), clients, &progress, &label, counts).await {
                Ok(hosted) => {
                    report.hosted = Some(hosted);
                    Ok(report)
                }
                Err(error) => Err(error),
            }
        }
        (measured, _) => measured,
    };
    progress.note("closing worker sessions");
    workers.stop().await;
    let report = measured?;

    if out.is_json() {
        out.document(&report)?;
    } else {
        out.text(&report.render())?;
    }
    Ok(())
}

async fn sections(
    agent: &Agent,
    progress: &Progress,
    plan: &Plan,
    (addr, kernel, access): (&KernelAddr, &Kernel, &Access),
) -> Result<Report, BenchError> {
    let mut report = Report {
        kernel: addr.to_string(),
        workers: plan.workers,
        sessions: None,
        floor: None,
        sequential: None,
        sequential_at_most_once: None,
        throughput: None,
        sustained: None,
        fanout: None,
        replay: None,
        console: None,
        payload: None,
        hosted: None,
    };
    if let Some((samples, dir)) = &plan.floor {
        progress.note("measuring this machine's floors");
        report.floor = Some(crate::bench::floor::measure(dir.clone(), *samples).await?);
    }
    if let Some(calls) = plan.sequential {
        let mut admin = kernel.admin.clone();
        report.sequential = Some(agent.sequential(progress, (calls, false), &mut admin).await?);
        report.sequential_at_most_once = Some(agent.sequential(progress, (calls, true), &mut admin).await?);
    }
    if let Some((levels, calls)) = &plan.throughput {
        let mut measured = Vec::with_capacity(levels.len());
        for &concurrency in levels {
            measured.push(agent.throughput(progress, concurrency, *calls).await?);
        }
        report.throughput = Some(measured);
    }
    if let Some(sustained) = plan.sustained {
        report.sustained = Some(crate::bench::sustained::run(agent, kernel.admin.clone(), progress, sustained).await?);
    }
    if let Some((calls, turns)) = plan.fanout {
        report.fanout = Some(agent.fanout(progress, calls, turns).await?);
    }
    if let Some((turns, calls)) = plan.replay {
        let replay = agent.replay(progress, turns, calls).await?;
        if let Some((url, rounds)) = &plan.console {
            let run = (replay.run_id.as_str(), replay.calls);
            let read = crate::bench::console::read(progress, (url, access.api_key.as_deref()), run, *rounds).await?;
            report.console = Some(read);
        }
        report.replay = Some(replay);
    }
    if let Some((sizes, concurrency)) = &plan.payload {
        let mut measured = Vec::with_capacity(sizes.len());
        for &(size, calls) in sizes {
            measured.push(agent.payload(progress, size, calls, *concurrency).await?);
        }
        report.payload = Some(measured);
    }
    Ok(report)
}

/// Distinguishes two benchmarks started by processes that reused a pid.
fn unique_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// [`run`] with stdout, as `main` calls it.
pub async fn main(addr: &KernelAddr, access: &Access, json: bool, args: BenchArgs) -> Result<(), BenchError> {
    let mut stdout = std::io::stdout();
    let mut out = Output::new(&mut stdout, json);
    run(addr, access, &mut out, args).await?;
    out.flush()?;
    Ok(())
}
