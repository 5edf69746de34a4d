//! The hosted-agent section: a hosted run of `steps` local steps, one of `calls` tool calls (one
//! per turn, to `bench_noop`), and a run of both whose host is lost once everything is recorded,
//! so that another host replays the whole history from the start.
//!
//! The agent, `bench_hosted`, is hosted by worker sessions in this process. Losing a host is its
//! session task aborted: its connection drops as it would when the process is killed, and the
//! kernel sees the stream break (as for a SIGKILL, not a drain).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_client::RegistryServiceClient;
use kernel_proto::v1::run_service_client::RunServiceClient;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use worker_sdk::{Agent, AgentContext, AgentError, Call, CancellationToken, StepEffect, Tls, Worker};

use super::BenchError;
use super::progress::Progress;
use crate::client::{Access, Authed};
use crate::error::CliError;

/// The agent the section runs.
pub const AGENT: &str = "bench_hosted";

const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// What the hosted section measured.
#[derive(Debug, Clone, Serialize)]
pub struct Hosted {
    pub steps: u32,
    pub calls: u32,
    /// A hosted run of `steps` local steps, live: from create to completed.
    pub steps_live_ms: f64,
    pub step_us: f64,
    /// A hosted run of `calls` one-call turns, live.
    pub calls_live_ms: f64,
    pub call_us: f64,
    /// From the host's loss to the run dispatched again on another host (kernel clock).
    pub resume_ms: f64,
    /// From that redispatch to the run completed: the history loaded and every recorded step
    /// and call replayed, none run again.
    pub replay_ms: f64,
    /// Steps and calls the replay returned from the record.
    pub replayed: u32,
}

/// Reached once per dispatch of a held run, when its handler is past every recorded step.
#[derive(Clone, Default)]
struct Holding(Arc<Notify>);

async fn bench_hosted(ctx: AgentContext, input: Value, holding: Holding) -> Result<Value, AgentError> {
    let steps = input["steps"].as_u64().unwrap_or(0);
    let calls = input["calls"].as_u64().unwrap_or(0);
    let hold = input["hold"].as_bool().unwrap_or(false);
    let mut sum = 0u64;
    for i in 0..steps {
        sum += ctx
            .step_with("bench", StepEffect::Pure, move |_| async move { Ok::<_, String>(i) })
            .await?;
    }
    for _ in 0..calls {
        ctx.call(Call::new(super::workers::NOOP, json!({}))).await?;
    }
    if hold && ctx.attempt() == 1 {
        // The first dispatch stops here until its host is lost; the next one goes on.
        holding.0.notify_one();
        std::future::pending::<()>().await;
    }
    Ok(json!({ "sum": sum, "attempt": ctx.attempt() }))
}

/// One in-process host of `bench_hosted`.
struct Host {
    task: JoinHandle<()>,
    shutdown: CancellationToken,
}

impl Host {
    fn start(addr: &str, access: &Access, name: String, holding: &Holding) -> Result<Host, BenchError> {
        let holding = holding.clone();
        let agent = Agent::new(
            AGENT,
            "Local steps and bench_noop calls (kernelctl bench)",
            move |ctx, input: Value| bench_hosted(ctx, input, holding.clone()),
        );
        let mut builder = Worker::builder(addr).name(name).max_concurrency(4).agent(agent);
        if let Some(path) = &access.tls_ca {
            let tls = Tls::from_ca_file(path).map_err(|err| CliError::TlsCa {
                path: path.display().to_string(),
                cause: err.to_string(),
            })?;
            builder = builder.tls(tls);
        }
        if let Some(secret) = &access.api_key {
            builder = builder.api_key(secret.trim());
        }
        let worker = builder.build().map_err(BenchError::Worker)?;
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            let _ = worker.run(token).await;
        });
        Ok(Host { task, shutdown })
    }

    /// Drops the host's session without a drain, as a killed process would.
    fn lose(self) {
        self.task.abort();
    }

    fn stop(self) {
        self.shutdown.cancel();
    }
}

/// Waits until the kernel lists a session named `name`.
async fn wait_for_host(registry: &mut RegistryServiceClient<Authed>, name: &str) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let workers = registry
            .list_workers(pb::ListWorkersRequest {})
            .await?
            .into_inner()
            .workers;
        if workers.iter().any(|w| w.name == name) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Setup(format!("the hosting session {name} never opened")));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the section: `steps` local steps and `calls` tool calls.
pub async fn run(
    (addr, access): (&str, &Access),
    (mut runs, mut registry): (RunServiceClient<Authed>, RegistryServiceClient<Authed>),
    progress: &Progress,
    label: &str,
    (steps, calls): (u32, u32),
) -> Result<Hosted, BenchError> {
    progress.phase("hosted", 3);
    let holding = Holding::default();
    let first = format!("bench-{label}-host-a");
    let host = Host::start(addr, access, first.clone(), &holding)?;
    wait_for_host(&mut registry, &first).await?;

    let started = Instant::now();
    let run = create(&mut runs, label, json!({ "steps": steps })).await?;
    finish(&mut runs, &run).await?;
    let steps_live = started.elapsed();
    progress.add(1);

    let started = Instant::now();
    let run = create(&mut runs, label, json!({ "calls": calls })).await?;
    finish(&mut runs, &run).await?;
    let calls_live = started.elapsed();
    progress.add(1);

    let held = create(
        &mut runs,
        label,
        json!({ "steps": steps, "calls": calls, "hold": true }),
    )
    .await?;
    tokio::time::timeout(RUN_TIMEOUT, holding.0.notified())
        .await
        .map_err(|_| BenchError::Stalled(RUN_TIMEOUT.as_secs()))?;
    // The second host connects only now, so the first dispatch went to the first one.
    let second = format!("bench-{label}-host-b");
    let spare = Host::start(addr, access, second.clone(), &holding)?;
    wait_for_host(&mut registry, &second).await?;
    let lost_at = now_ms();
    host.lose();
    let run = finish(&mut runs, &held).await?;
    spare.stop();
    let output: Value = serde_json::from_str(&run.output_json).unwrap_or(Value::Null);
    if output["attempt"] != json!(2) {
        return Err(BenchError::Unexpected(format!(
            "the held run should have completed on its second dispatch: {output}"
        )));
    }
    let events = events(&mut runs, &held).await?;
    let redispatched = events
        .iter()
        .filter(|e| e.r#type == "agent:dispatched")
        .nth(1)
        .ok_or_else(|| BenchError::Unexpected("the held run was never dispatched again".into()))?;
    let completed = events
        .iter()
        .find(|e| e.r#type == "run:completed")
        .ok_or_else(|| BenchError::Unexpected("the held run has no run:completed".into()))?;
    // Everything was recorded before the host was lost: the redispatch must run nothing again.
    let rerun = events
        .iter()
        .filter(|e| e.seq > redispatched.seq && (e.r#type == "tool:start" || e.r#type == "step:result"))
        .count();
    if rerun > 0 {
        return Err(BenchError::Unexpected(format!(
            "the replay ran {rerun} recorded steps or calls again"
        )));
    }
    let resumed_at = at_ms(redispatched);
    progress.add(1);
    progress.finish(&format!(
        "{steps} steps live in {:.0}ms, replayed with {calls} calls in {}ms",
        steps_live.as_secs_f64() * 1e3,
        at_ms(completed) - resumed_at
    ));
    Ok(Hosted {
        steps,
        calls,
        steps_live_ms: steps_live.as_secs_f64() * 1e3,
        step_us: steps_live.as_secs_f64() * 1e6 / f64::from(steps.max(1)),
        calls_live_ms: calls_live.as_secs_f64() * 1e3,
        call_us: calls_live.as_secs_f64() * 1e6 / f64::from(calls.max(1)),
        resume_ms: (resumed_at - lost_at).max(0) as f64,
        replay_ms: (at_ms(completed) - resumed_at) as f64,
        replayed: steps + calls,
    })
}

async fn create(runs: &mut RunServiceClient<Authed>, label: &str, input: Value) -> Result<String, BenchError> {
    let request = pb::CreateRunRequest {
        agent: AGENT.into(),
        input_json: input.to_string(),
        labels: [("bench".to_owned(), label.to_owned())].into(),
        non_interactive: true,
        hosted: true,
        ..Default::default()
    };
    runs.create_run(request)
        .await?
        .into_inner()
        .run
        .map(|run| run.id)
        .ok_or_else(|| BenchError::Unexpected("create run answered without a run".into()))
}

/// Follows a run's log until its end; a run that did not complete fails the benchmark.
async fn finish(runs: &mut RunServiceClient<Authed>, run_id: &str) -> Result<pb::Run, BenchError> {
    let request = pb::WatchRunEventsRequest {
        run_id: run_id.to_owned(),
        from_seq: 1,
        include_progress: false,
    };
    let watch = async {
        let mut stream = runs.watch_run_events(request).await?.into_inner();
        while stream.message().await?.is_some() {}
        Ok::<_, BenchError>(())
    };
    tokio::time::timeout(RUN_TIMEOUT, watch)
        .await
        .map_err(|_| BenchError::Stalled(RUN_TIMEOUT.as_secs()))??;
    let run = runs
        .get_run(pb::GetRunRequest {
            run_id: run_id.to_owned(),
        })
        .await?
        .into_inner()
        .run
        .ok_or_else(|| BenchError::Unexpected("get run answered without a run".into()))?;
    if run.status != pb::RunStatus::Completed as i32 {
        return Err(BenchError::Unexpected(format!(
            "hosted run {run_id} did not complete: {}",
            run.reason
        )));
    }
    Ok(run)
}

async fn events(runs: &mut RunServiceClient<Authed>, run_id: &str) -> Result<Vec<pb::Event>, BenchError> {
    let mut events = Vec::new();
    let mut from_seq = 1;
    loop {
        let request = pb::ListRunEventsRequest {
            run_id: run_id.to_owned(),
            from_seq,
            page_size: 5000,
        };
        let page = runs.list_run_events(request).await?.into_inner();
        events.extend(page.events);
        if page.next_seq == 0 {
            return Ok(events);
        }
        from_seq = page.next_seq;
    }
}

/// The wall clock in milliseconds since the epoch, as the kernel stamps events.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An event's time on the kernel's clock, in milliseconds since the epoch.
fn at_ms(event: &pb::Event) -> i64 {
    event
        .at
        .as_ref()
        .map_or(0, |at| at.seconds * 1000 + i64::from(at.nanos) / 1_000_000)
}
