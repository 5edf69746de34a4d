//! The exporter task: marks from the writer thread in, OTLP batches out.
//!
//! The writer never waits on it: a mark that finds the channel full is dropped and counted, so
//! a collector that is slow or gone costs spans, never commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::spans::{Emitted, Mark, Tracer, run_span_of};
use crate::error::KernelError;
use crate::store::{Published, Readers};

/// Marks waiting for the exporter task; past this the writer drops them.
const MARKS_QUEUED: usize = 65_536;
/// Spans sent in one export request, at most.
const BATCH: usize = 512;
/// Spans wait at most this long to be sent.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// One export gives up after this long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// A collector that keeps failing is reported at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where the store's publisher hands committed events; a cheap handle.
#[derive(Clone)]
pub struct Sink {
    marks: mpsc::Sender<Mark>,
    dropped: Arc<AtomicU64>,
}

impl Sink {
    /// Takes what a batch committed: called on the writer thread, never blocks.
    pub fn committed(&self, published: &[Published]) {
        let committed = SystemTime::now();
        for item in published {
            let Some(mark) = Mark::of(item, committed) else {
                continue;
            };
            // The agent's sampling decision stands for its run's calls.
            if mark
                .step
                .as_ref()
                .is_some_and(|step| !super::sampled(step.trace.as_ref()))
            {
                continue;
            }
            if self.marks.try_send(mark).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The running exporter, to be finished at shutdown.
pub struct Exporting {
    finish: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Exporting {
    /// Exports what is left (the writer has stopped by now) within `bound`, then stops.
    pub async fn finish(self, bound: Duration) {
        self.finish.cancel();
        if tokio::time::timeout(bound, self.task).await.is_err() {
            warn!("trace exporter did not finish within the drain timeout");
        }
    }
}

/// Starts exporting spans to the OTLP/gRPC collector at `endpoint`; the store reads a run's
/// record through `reads` when it ends.
pub fn start(endpoint: &str, reads: Readers) -> Result<(Sink, Exporting), KernelError> {
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|error| KernelError::invalid("--otlp-endpoint", format!("{endpoint}: {error}")))?;
    exporter.set_resource(
        &opentelemetry_sdk::Resource::builder()
            .with_service_name("kernel")
            .build(),
    );
    let (marks, received) = mpsc::channel(MARKS_QUEUED);
    let dropped = Arc::new(AtomicU64::new(0));
    let finish = CancellationToken::new();
    let task = tokio::spawn(
        Task {
            exporter,
            reads,
            tracer: Tracer::default(),
            batch: Vec::new(),
            dropped: dropped.clone(),
            failing: Failing::default(),
        }
        .run(received, finish.clone()),
    );
    info!(endpoint, "exporting traces over otlp");
    Ok((Sink { marks, dropped }, Exporting { finish, task }))
}

/// Failed exports since the last warning.
#[derive(Default)]
struct Failing {
    since_warned: u64,
    warned_at: Option<Instant>,
}

struct Task {
    exporter: opentelemetry_otlp::SpanExporter,
    reads: Readers,
    tracer: Tracer,
    batch: Vec<SpanData>,
    dropped: Arc<AtomicU64>,
    failing: Failing,
}

impl Task {
    async fn run(mut self, mut marks: mpsc::Receiver<Mark>, finish: CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                mark = marks.recv() => match mark {
                    Some(mark) => self.take(mark).await,
                    None => break,
                },
                _ = tick.tick() => self.flush().await,
                _ = finish.cancelled() => {
                    while let Ok(mark) = marks.try_recv() {
                        self.take(mark).await;
                    }
                    break;
                }
            }
        }
        self.flush().await;
        let _ = self.exporter.shutdown();
    }

    async fn take(&mut self, mark: Mark) {
        let Emitted { spans, run_ended } = self.tracer.on(mark);
        self.batch.extend(spans);
        if let Some((run, ended)) = run_ended {
            match self.reads.run(run.clone()).await {
                Ok(Some(record)) if super::sampled(record.trace.as_ref()) => {
                    self.batch.push(run_span_of(&record, ended));
                }
                Ok(_) => {}
                Err(error) => warn!(run_id = %run, %error, "cannot read an ended run for its span"),
            }
        }
        if self.batch.len() >= BATCH {
            self.flush().await;
        }
    }

    async fn flush(&mut self) {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            warn!(dropped, "trace exporter fell behind; events left out of spans");
        }
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let spans = batch.len();
        if let Err(error) = self.exporter.export(batch).await {
            self.failing.since_warned += 1;
            if self.failing.warned_at.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                warn!(%error, spans, failed_exports = self.failing.since_warned, "cannot export spans");
                self.failing = Failing {
                    since_warned: 0,
                    warned_at: Some(Instant::now()),
                };
            }
        }
    }
}
