//! OpenTelemetry traces of runs and their call attempts.
//!
//! An agent's W3C `traceparent` (request metadata of `CreateRun`) is kept on its run and copied to
//! each step; a dispatch hands the worker the context its tool's own spans join. With
//! `--otlp-endpoint`, the kernel exports a span per run and per call attempt, built from the
//! events the store commits, as they commit.

mod context;
mod export;
mod spans;

pub use context::{TraceParent, attempt_span, for_subagent, phase_span, run_span, trace_id};
pub use export::{Exporting, Sink, start};

use crate::model::StepRecord;

/// Whether a run under `trace` has its spans exported (when the kernel exports any): the agent's
/// sampling decision stands, and a run of its own trace is sampled.
pub fn sampled(trace: Option<&TraceParent>) -> bool {
    trace.is_none_or(TraceParent::sampled)
}

/// The `traceparent` a worker is handed with attempt `attempt` of `step`: the attempt's `run`
/// span when the kernel is `exporting` it, so the tool's spans sit inside it; else the agent's own
/// context, so they still join the agent's trace; else nothing.
pub fn handed_to_worker(step: &StepRecord, attempt: u32, exporting: bool) -> String {
    if exporting && sampled(step.trace.as_ref()) {
        let span = phase_span(&step.run_id, &step.key, attempt, "run");
        return TraceParent {
            trace_id: trace_id(&step.run_id, step.trace.as_ref()),
            span_id: span,
            flags: step
                .trace
                .map_or(kernel_proto::traceparent::SAMPLED, |trace| trace.flags),
        }
        .to_string();
    }
    step.trace.map(|trace| trace.to_string()).unwrap_or_default()
}
