//! The agent side of the benchmark: creates runs, submits turns over a small pool of HTTP/2
//! connections, checks every result, and times each section.
//!
//! It speaks `kernel.v1` directly rather than through `worker_sdk::AgentClient`, so the time
//! measured is the kernel's and the wire's, not an SDK's conversions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_client::AdminServiceClient;
use kernel_proto::v1::run_service_client::RunServiceClient;
use kernel_proto::v1::tool_call_service_client::ToolCallServiceClient;
use pb::submit_turn_response::Item;
use tokio::task::JoinSet;

use super::progress::Progress;
use super::report::{Fanout, Payload, Replay, Sequential, Throughput};
use super::stats::{Latency, millis};
use super::sustained::usage;
use super::workers::{NOOP, NOOP_ONCE, PAYLOAD, payload_text};
use super::{BenchError, ByteSize};
use crate::args::KernelAddr;
use crate::client::{Access, Authed, unreachable};

/// HTTP/2 connections the agent spreads its runs over.
const CONNECTIONS: usize = 4;
/// No benchmark turn should take this long; one that does means the kernel is stuck.
const TURN_TIMEOUT: Duration = Duration::from_secs(120);

/// The benchmark's agent: connections to the kernel and the label its runs carry.
#[derive(Clone)]
pub struct Agent {
    calls: Vec<ToolCallServiceClient<Authed>>,
    runs: RunServiceClient<Authed>,
    label: String,
    /// The turns a lane of [`Agent::drive`] makes in one run before it goes on in a new one: a
    /// minute of the sustained section makes more than the kernel lets one run make.
    turns_per_run: u32,
    /// The budget every run gets (`--budget`).
    budget: Vec<pb::BudgetLimit>,
}

/// What a concurrent phase measured.
pub(super) struct Sample {
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    /// Calls completed in each second of a phase of a set length, in order; empty otherwise.
    pub per_second: Vec<u64>,
}

/// How long a concurrent phase goes on.
#[derive(Clone, Copy, Debug)]
pub(super) enum Budget {
    /// Until this many calls are made, shared by the runs.
    Calls(u32),
    /// Until this long has passed; calls in flight then finish.
    For(Duration),
}

/// Completed calls counted by the second since a phase started.
struct PerSecond {
    started: Instant,
    counts: Vec<AtomicU64>,
}

impl PerSecond {
    fn new(started: Instant, seconds: usize) -> PerSecond {
        PerSecond {
            started,
            counts: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn add(&self) {
        let second = (self.started.elapsed().as_secs() as usize).min(self.counts.len() - 1);
        self.counts[second].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts up to the last second that saw a call.
    fn take(self) -> Vec<u64> {
        let mut counts: Vec<u64> = self.counts.into_iter().map(AtomicU64::into_inner).collect();
        while counts.last() == Some(&0) {
            counts.pop();
        }
        counts
    }
}

impl Sample {
    pub(super) fn calls_per_s(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// How a recorded turn is submitted again: its results streamed one by one (`SubmitTurn`), or
/// all in one answer (`CallTurn`).
#[derive(Clone, Copy)]
enum Resubmit {
    Streamed,
    OneAnswer,
}

/// A turn of `calls` of run `run_id`, with no offer and the run's own bound.
fn turn_request(run_id: &str, turn: u32, calls: Vec<pb::ToolCall>) -> pb::SubmitTurnRequest {
    pb::SubmitTurnRequest {
        run_id: run_id.to_owned(),
        turn,
        calls,
        offered_tools: Vec::new(),
        max_concurrency: 0,
    }
}

/// `turn`'s answer, or [`BenchError::Stalled`] if it takes longer than [`TURN_TIMEOUT`].
async fn within_a_turn<T>(turn: impl Future<Output = Result<T, BenchError>>) -> Result<T, BenchError> {
    tokio::time::timeout(TURN_TIMEOUT, turn)
        .await
        .map_err(|_| BenchError::Stalled(TURN_TIMEOUT.as_secs()))?
}

pub(super) fn noop_call() -> pb::ToolCall {
    pb::ToolCall {
        tool: NOOP.into(),
        arguments_json: "{}".into(),
        ..Default::default()
    }
}

fn payload_call(size: ByteSize) -> pb::ToolCall {
    pb::ToolCall {
        tool: PAYLOAD.into(),
        arguments_json: format!("{{\"bytes\":{}}}", size.0),
        ..Default::default()
    }
}

fn status_name(status: i32) -> String {
    pb::CallStatus::try_from(status).map_or_else(
        |_| format!("status {status}"),
        |s| s.as_str_name().trim_start_matches("CALL_STATUS_").to_lowercase(),
    )
}

/// Every result succeeded, one per call, in position order.
fn check_results(results: &[pb::CallResult], calls: usize) -> Result<(), BenchError> {
    if results.len() != calls {
        return Err(BenchError::Unexpected(format!(
            "a turn of {calls} calls came back with {} results",
            results.len()
        )));
    }
    for (index, result) in results.iter().enumerate() {
        if result.status != pb::CallStatus::Ok as i32 {
            return Err(BenchError::CallFailed {
                tool: result.tool.clone(),
                status: status_name(result.status),
                content: result.content.clone(),
            });
        }
        if result.position as usize != index {
            return Err(BenchError::Unexpected(format!(
                "result {index} of a turn carries position {}",
                result.position
            )));
        }
    }
    Ok(())
}

impl Agent {
    /// Opens the connection pool; `label` marks every run the benchmark creates (`bench=<label>`),
    /// and a run of a concurrent section gives way to a new one after `turns_per_run` turns.
    pub async fn connect(
        addr: &KernelAddr,
        access: &Access,
        label: &str,
        (turns_per_run, budget): (u32, Vec<pb::BudgetLimit>),
    ) -> Result<Agent, BenchError> {
        let api_key = access.api_key()?;
        let endpoint = access.endpoint(addr)?.tcp_nodelay(true);
        let mut channels = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            channels.push(endpoint.connect().await.map_err(|err| unreachable(addr, &err))?);
        }
        Ok(Agent {
            runs: RunServiceClient::with_interceptor(channels[0].clone(), api_key.clone()),
            calls: channels
                .into_iter()
                .map(|channel| ToolCallServiceClient::with_interceptor(channel, api_key.clone()))
                .collect(),
            label: label.to_owned(),
            turns_per_run,
            budget,
        })
    }

    async fn create_run(&self, section: &str) -> Result<String, BenchError> {
        let request = pb::CreateRunRequest {
            agent: format!("kernelctl-bench-{section}"),
            input_json: "{}".into(),
            labels: [("bench".to_owned(), self.label.clone())].into(),
            // A policy that would ask a person about a bench call denies it instead, so the
            // benchmark fails with the reason rather than waiting for an approval.
            non_interactive: true,
            budget: self.budget.clone(),
            ..Default::default()
        };
        let response = self.runs.clone().create_run(request).await?.into_inner();
        response
            .run
            .map(|run| run.id)
            .ok_or_else(|| BenchError::Unexpected("create run answered without a run".into()))
    }

    /// Creates `count` runs at once (untimed setup).
    async fn create_runs(&self, section: &str, count: u32) -> Result<Vec<String>, BenchError> {
        let mut creating = JoinSet::new();
        for _ in 0..count {
            let agent = self.clone();
            let section = section.to_owned();
            creating.spawn(async move { agent.create_run(&section).await });
        }
        let mut ids = Vec::with_capacity(count as usize);
        while let Some(created) = creating.join_next().await {
            ids.push(created.map_err(|e| BenchError::Setup(format!("run creation panicked: {e}")))??);
        }
        Ok(ids)
    }

    /// Completes run `done` and creates the one a lane goes on with (see `turns_per_run`).
    async fn next_run(&self, section: &str, done: String) -> Result<String, BenchError> {
        self.complete_runs(vec![done]).await?;
        self.create_run(section).await
    }

    /// Completes the benchmark's runs so none stays open on the kernel (untimed teardown).
    async fn complete_runs(&self, ids: Vec<String>) -> Result<(), BenchError> {
        let mut completing = JoinSet::new();
        for run_id in ids {
            let mut runs = self.runs.clone();
            completing.spawn(async move {
                let request = pb::CompleteRunRequest {
                    run_id,
                    output_json: "null".into(),
                };
                runs.complete_run(request).await.map(|_| ())
            });
        }
        while let Some(done) = completing.join_next().await {
            done.map_err(|e| BenchError::Setup(format!("run completion panicked: {e}")))??;
        }
        Ok(())
    }

    /// The client of connection `lane`.
    fn lane(&self, lane: usize) -> ToolCallServiceClient<Authed> {
        self.calls[lane % self.calls.len()].clone()
    }

    /// Submits one turn on connection `lane` and reads its stream to the end.
    async fn submit(
        &self,
        lane: usize,
        run_id: &str,
        turn: u32,
        calls: Vec<pb::ToolCall>,
    ) -> Result<Vec<pb::CallResult>, BenchError> {
        let mut client = self.lane(lane);
        let request = turn_request(run_id, turn, calls);
        within_a_turn(async {
            let mut stream = client.submit_turn(request).await?.into_inner();
            let mut results = Vec::new();
            while let Some(response) = stream.message().await? {
                if let Some(Item::Result(result)) = response.item {
                    results.push(result);
                }
            }
            Ok(results)
        })
        .await
    }

    /// Submits one turn as `CallTurn`: every result in one answer, as the Python SDK's
    /// `call_turn` asks for them.
    async fn call_turn(
        &self,
        lane: usize,
        run_id: &str,
        turn: u32,
        calls: Vec<pb::ToolCall>,
    ) -> Result<Vec<pb::CallResult>, BenchError> {
        let mut client = self.lane(lane);
        let request = pb::CallTurnRequest {
            turn: Some(turn_request(run_id, turn, calls)),
        };
        within_a_turn(async { Ok(client.call_turn(request).await?.into_inner().results) }).await
    }

    /// `n` one-call turns of a single run, one after the other, calling `NOOP` or, with
    /// `once`, `NOOP_ONCE`; `admin` counts the kernel's syncs meanwhile.
    pub async fn sequential(
        &self,
        progress: &Progress,
        (n, once): (u32, bool),
        admin: &mut AdminServiceClient<Authed>,
    ) -> Result<Sequential, BenchError> {
        let (section, idempotency) = if once {
            ("sequential at_most_once", "at_most_once")
        } else {
            ("sequential", "safe_to_retry")
        };
        progress.phase(section, u64::from(n));
        let run_id = self.create_run("sequential").await?;
        let call = pb::ToolCall {
            tool: if once { NOOP_ONCE } else { NOOP }.into(),
            ..noop_call()
        };
        let mut latencies = Vec::with_capacity(n as usize);
        let before = usage(admin).await;
        let started = Instant::now();
        for turn in 0..n {
            let sent = Instant::now();
            let results = self.submit(0, &run_id, turn, vec![call.clone()]).await?;
            latencies.push(sent.elapsed());
            check_results(&results, 1)?;
            progress.add(1);
        }
        let sample = Sample {
            elapsed: started.elapsed(),
            latencies,
            per_second: Vec::new(),
        };
        let writes = match (before, usage(admin).await) {
            (Some(before), Some(end)) => Some(end.writes_per_call(&before, u64::from(n))),
            _ => None,
        };
        self.complete_runs(vec![run_id]).await?;
        let calls_per_s = sample.calls_per_s();
        let mut latencies = sample.latencies;
        let latency = Latency::of(&mut latencies).expect("at least one call");
        progress.finish(&format!("p50 {:.3}ms, p99 {:.3}ms", latency.p50_ms, latency.p99_ms));
        Ok(Sequential {
            idempotency,
            fsyncs_per_call: writes.map(|w| w.fsyncs_per_call),
            statements_per_call: writes.map(|w| w.statements_per_call),
            disk_kib_per_call: writes.and_then(|w| w.disk_kib_per_call),
            calls: u64::from(n),
            elapsed_s: sample.elapsed.as_secs_f64(),
            calls_per_s,
            latency,
        })
    }

    /// `concurrency` runs making one-call turns of `call` back to back until `budget` is spent;
    /// each result is checked by `check`.
    pub(super) async fn drive<C>(
        &self,
        progress: &Progress,
        section: &str,
        concurrency: u32,
        budget: Budget,
        call: pb::ToolCall,
        check: C,
    ) -> Result<Sample, BenchError>
    where
        C: Fn(&pb::CallResult) -> Result<(), BenchError> + Copy + Send + 'static,
    {
        let runs = match budget {
            Budget::Calls(total) => concurrency.min(total),
            Budget::For(_) => concurrency,
        };
        let run_ids = self.create_runs(section, runs).await?;
        let claimed = Arc::new(AtomicU32::new(0));
        let started = Instant::now();
        // Only a phase of a set length is told second by second.
        let per_second = match budget {
            Budget::Calls(_) => None,
            Budget::For(length) => Some(Arc::new(PerSecond::new(started, length.as_secs() as usize + 2))),
        };
        let mut runners = JoinSet::new();
        for (lane, run_id) in run_ids.into_iter().enumerate() {
            let agent = self.clone();
            let section = section.to_owned();
            let claimed = Arc::clone(&claimed);
            let per_second = per_second.clone();
            let call = call.clone();
            let progress = progress.clone();
            let more = move || match budget {
                Budget::Calls(total) => claimed.fetch_add(1, Ordering::Relaxed) < total,
                Budget::For(length) => started.elapsed() < length,
            };
            runners.spawn(async move {
                let mut latencies = Vec::new();
                let mut run_id = run_id;
                let mut turn = 0;
                while more() {
                    if turn == agent.turns_per_run {
                        run_id = agent.next_run(&section, run_id).await?;
                        turn = 0;
                    }
                    let sent = Instant::now();
                    let results = agent.submit(lane, &run_id, turn, vec![call.clone()]).await?;
                    latencies.push(sent.elapsed());
                    if let Some(per_second) = &per_second {
                        per_second.add();
                    }
                    check_results(&results, 1)?;
                    check(&results[0])?;
                    progress.add(1);
                    turn += 1;
                }
                Ok::<_, BenchError>((latencies, run_id))
            });
        }
        let mut latencies = Vec::new();
        let mut run_ids = Vec::with_capacity(runs as usize);
        while let Some(done) = runners.join_next().await {
            let (lane, run_id) = done.map_err(|e| BenchError::Setup(format!("a bench run panicked: {e}")))??;
            latencies.extend(lane);
            run_ids.push(run_id);
        }
        let elapsed = started.elapsed();
        self.complete_runs(run_ids).await?;
        let per_second = per_second
            .map(|counts| Arc::into_inner(counts).expect("every runner has finished").take())
            .unwrap_or_default();
        Ok(Sample {
            elapsed,
            latencies,
            per_second,
        })
    }

    /// One throughput level.
    pub async fn throughput(
        &self,
        progress: &Progress,
        concurrency: u32,
        total: u32,
    ) -> Result<Throughput, BenchError> {
        progress.phase(format!("throughput, {concurrency} runs"), u64::from(total));
        let sample = self
            .drive(
                progress,
                "throughput",
                concurrency,
                Budget::Calls(total),
                noop_call(),
                |_| Ok(()),
            )
            .await?;
        let calls_per_s = sample.calls_per_s();
        let mut latencies = sample.latencies;
        let latency = Latency::of(&mut latencies).expect("at least one call");
        progress.finish(&format!("{calls_per_s:.0} calls/s, p50 {:.3}ms", latency.p50_ms));
        Ok(Throughput {
            concurrency,
            calls: latencies.len() as u64,
            elapsed_s: sample.elapsed.as_secs_f64(),
            calls_per_s,
            latency,
        })
    }

    /// `turns` turns of `calls` calls each, in one run.
    pub async fn fanout(&self, progress: &Progress, calls: u32, turns: u32) -> Result<Fanout, BenchError> {
        progress.phase(
            format!("fan-out, {calls} calls per turn"),
            u64::from(calls) * u64::from(turns),
        );
        let run_id = self.create_run("fanout").await?;
        let mut latencies = Vec::with_capacity(turns as usize);
        for turn in 0..turns {
            let batch = vec![noop_call(); calls as usize];
            let sent = Instant::now();
            let results = self.submit(0, &run_id, turn, batch).await?;
            latencies.push(sent.elapsed());
            check_results(&results, calls as usize)?;
            progress.add(u64::from(calls));
        }
        self.complete_runs(vec![run_id]).await?;
        let turn_latency = Latency::of(&mut latencies).expect("at least one turn");
        let calls_per_s = f64::from(calls) / (turn_latency.p50_ms / 1000.0).max(1e-9);
        progress.finish(&format!(
            "{calls_per_s:.0} calls/s, turn p50 {:.1}ms",
            turn_latency.p50_ms
        ));
        Ok(Fanout {
            calls_per_turn: calls,
            turns,
            calls_per_s,
            turn_latency,
        })
    }

    /// Records a run of `turns` × `calls`, then submits every turn again: each result must come
    /// back from the log.
    pub async fn replay(&self, progress: &Progress, turns: u32, calls: u32) -> Result<Replay, BenchError> {
        let total = u64::from(turns) * u64::from(calls);
        let batch = vec![noop_call(); calls as usize];
        let (run_id, record) = self.record(progress, "replay", turns, &batch).await?;
        let replay = self
            .resubmit_all(progress, &run_id, turns, &batch, Resubmit::Streamed)
            .await?;
        // A run of its own, recorded the same way, so that each way is the first to resubmit
        // its turns.
        let (one_answer_run, _) = self.record(progress, "replay-one-answer", turns, &batch).await?;
        let one_answer = self
            .resubmit_all(progress, &one_answer_run, turns, &batch, Resubmit::OneAnswer)
            .await?;
        self.complete_runs(vec![run_id.clone(), one_answer_run]).await?;
        Ok(Replay {
            run_id,
            turns,
            calls_per_turn: calls,
            calls: total,
            record_s: record.as_secs_f64(),
            record_calls_per_s: total as f64 / record.as_secs_f64().max(1e-9),
            replay_ms: millis(replay),
            replay_calls_per_s: total as f64 / replay.as_secs_f64().max(1e-9),
            one_answer_ms: millis(one_answer),
            one_answer_calls_per_s: total as f64 / one_answer.as_secs_f64().max(1e-9),
            replayed: total,
        })
    }

    /// A new run of agent `agent` made of `turns` turns of `batch`, recorded one after the
    /// other; with the time that took.
    async fn record(
        &self,
        progress: &Progress,
        agent: &str,
        turns: u32,
        batch: &[pb::ToolCall],
    ) -> Result<(String, Duration), BenchError> {
        let calls = batch.len() as u64;
        let total = u64::from(turns) * calls;
        progress.phase(format!("{agent}, recording {turns} turns of {calls} calls"), total);
        let run_id = self.create_run(agent).await?;
        let recording = Instant::now();
        for turn in 0..turns {
            let results = self.submit(0, &run_id, turn, batch.to_vec()).await?;
            check_results(&results, batch.len())?;
            if let Some(replayed) = results.iter().position(|r| r.replayed) {
                return Err(BenchError::Unexpected(format!(
                    "the first submission of turn {turn} served position {replayed} from the log; \
                     the kernel already knew this run"
                )));
            }
            progress.add(calls);
        }
        let record = recording.elapsed();
        progress.finish(&format!("{:.0} calls/s", total as f64 / record.as_secs_f64()));
        Ok((run_id, record))
    }

    /// Submits every turn of recorded run `run_id` again, `how`: the time it took, every result
    /// having come from the log.
    async fn resubmit_all(
        &self,
        progress: &Progress,
        run_id: &str,
        turns: u32,
        batch: &[pb::ToolCall],
        how: Resubmit,
    ) -> Result<Duration, BenchError> {
        let calls = batch.len() as u64;
        let total = u64::from(turns) * calls;
        let way = match how {
            Resubmit::Streamed => "streamed",
            Resubmit::OneAnswer => "in one answer",
        };
        progress.phase(
            format!("replay, resubmitting {turns} turns of {calls} calls, {way}"),
            total,
        );
        let mut took = Duration::ZERO;
        for turn in 0..turns {
            took += self.resubmit(run_id, turn, batch, how).await?;
            progress.add(calls);
        }
        progress.finish(&format!("{total} results from the log in {:.1}ms", millis(took)));
        Ok(took)
    }

    /// Submits turn `turn` of a recorded run again, `how`: the time it took, every result
    /// having come from the log.
    async fn resubmit(
        &self,
        run_id: &str,
        turn: u32,
        batch: &[pb::ToolCall],
        how: Resubmit,
    ) -> Result<Duration, BenchError> {
        let sent = Instant::now();
        let results = match how {
            Resubmit::Streamed => self.submit(0, run_id, turn, batch.to_vec()).await?,
            Resubmit::OneAnswer => self.call_turn(0, run_id, turn, batch.to_vec()).await?,
        };
        let took = sent.elapsed();
        check_results(&results, batch.len())?;
        let fresh = results.iter().filter(|r| !r.replayed).count();
        if fresh > 0 {
            return Err(BenchError::NotReplayed {
                turn,
                fresh,
                calls: results.len(),
            });
        }
        Ok(took)
    }

    /// `calls` calls whose results are `size` long, from `concurrency` runs.
    pub async fn payload(
        &self,
        progress: &Progress,
        size: ByteSize,
        calls: u32,
        concurrency: u32,
    ) -> Result<Payload, BenchError> {
        progress.phase(format!("payload {size}"), u64::from(calls));
        let expected = payload_text(size.0).len();
        let length_matches = move |result: &pb::CallResult| {
            if result.content.len() == expected {
                Ok(())
            } else {
                Err(BenchError::Unexpected(format!(
                    "a {PAYLOAD} result of {} bytes where {expected} were asked for",
                    result.content.len()
                )))
            }
        };
        let sample = self
            .drive(
                progress,
                "payload",
                concurrency,
                Budget::Calls(calls),
                payload_call(size),
                length_matches,
            )
            .await?;
        let calls_per_s = sample.calls_per_s();
        let mb_per_s = calls_per_s * size.0 as f64 / 1e6;
        let mut latencies = sample.latencies;
        let latency = Latency::of(&mut latencies).expect("at least one call");
        progress.finish(&format!("{calls_per_s:.0} calls/s, {mb_per_s:.1} MB/s"));
        Ok(Payload {
            bytes: size.0,
            calls: latencies.len() as u64,
            concurrency,
            elapsed_s: sample.elapsed.as_secs_f64(),
            calls_per_s,
            mb_per_s,
            latency,
        })
    }
}
