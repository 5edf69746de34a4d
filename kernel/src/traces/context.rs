//! W3C trace context: the `traceparent` an agent sends, and the ids the kernel derives from what a
//! span describes.
//!
//! Ids are never drawn at random: a run's span id comes from its run id, an attempt's from its
//! run, step key and attempt number, so the spans of a run that a restarted kernel finishes are
//! the same spans the kernel before it started, and a tool is told its span before it is exported.

use sha2::{Digest, Sha256};

use kernel_proto::traceparent::SAMPLED;
pub use kernel_proto::traceparent::TraceParent;

use crate::model::{RunId, StepKey};

/// The first bytes of a digest of `parts`, never all zero (which W3C reserves for "none").
fn derived<const N: usize>(parts: &[&[u8]]) -> [u8; N] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u32).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut id = [0u8; N];
    id.copy_from_slice(&digest[..N]);
    if id == [0; N] {
        id[N - 1] = 1;
    }
    id
}

/// The trace a run's spans belong to: its agent's, or one of its own.
pub fn trace_id(run: &RunId, parent: Option<&TraceParent>) -> [u8; 16] {
    match parent {
        Some(parent) => parent.trace_id,
        None => derived(&[b"trace", run.as_str().as_bytes()]),
    }
}

/// A run's span.
pub fn run_span(run: &RunId) -> [u8; 8] {
    derived(&[b"run", run.as_str().as_bytes()])
}

/// One attempt of a step (a tool call, or a hosted run's handler dispatch).
pub fn attempt_span(run: &RunId, key: &StepKey, attempt: u32) -> [u8; 8] {
    derived(&[
        b"attempt",
        run.as_str().as_bytes(),
        key.as_str().as_bytes(),
        &attempt.to_be_bytes(),
    ])
}

/// A phase of an attempt (`scheduled`, `queued`, `dispatched`, `run`, `recorded`).
pub fn phase_span(run: &RunId, key: &StepKey, attempt: u32, phase: &str) -> [u8; 8] {
    derived(&[
        b"phase",
        run.as_str().as_bytes(),
        key.as_str().as_bytes(),
        &attempt.to_be_bytes(),
        phase.as_bytes(),
    ])
}

/// The context a subagent's run starts under: its parent's trace, below the parent run's span.
pub fn for_subagent(parent: &RunId, parent_trace: Option<&TraceParent>) -> TraceParent {
    TraceParent {
        trace_id: trace_id(parent, parent_trace),
        span_id: run_span(parent),
        flags: parent_trace.map_or(SAMPLED, |trace| trace.flags),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn ids_follow_from_what_the_span_describes() {
        let (run, other) = (RunId::new(), RunId::new());
        let key = StepKey::for_call(0, 0, None);
        assert_eq!(run_span(&run), run_span(&run));
        assert_ne!(run_span(&run), run_span(&other));
        assert_ne!(attempt_span(&run, &key, 1), attempt_span(&run, &key, 2));
        assert_ne!(phase_span(&run, &key, 1, "run"), phase_span(&run, &key, 1, "queued"));
        let agent: TraceParent = EXAMPLE.parse().unwrap();
        assert_eq!(trace_id(&run, Some(&agent)), agent.trace_id);
        assert_eq!(trace_id(&run, None), trace_id(&run, None));
        assert_ne!(trace_id(&run, None), trace_id(&other, None));
        let child = for_subagent(&run, Some(&agent));
        assert_eq!((child.trace_id, child.span_id), (agent.trace_id, run_span(&run)));
    }
}
