//! W3C trace context: the `traceparent` an agent sends, and the ids the kernel derives from what a
//! span describes.
//!
//! Ids are never drawn at random: a run's span id comes from its run id, an attempt's from its
//! run, step key and attempt number, so the spans of a run that a restarted kernel finishes are
//! the same spans the kernel before it started, and a tool is told its span before it is exported.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::model::{RunId, StepKey};

/// The `sampled` bit of a traceparent's flags.
const SAMPLED: u8 = 0x01;

/// A W3C `traceparent`: the trace a span belongs to and the span that is its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Whether the trace's caller records it; a run under an unsampled parent exports nothing.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The same trace with `span_id` as the parent, sampled as it was.
    pub fn child(&self, span_id: [u8; 8]) -> TraceParent {
        TraceParent { span_id, ..*self }
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }
}

impl FromStr for TraceParent {
    type Err = String;

    /// Parses as the W3C rules read it: version `00` is exactly four fields; a later version may
    /// add fields after the fourth, which are ignored; `ff`, upper-case hex and all-zero ids are
    /// invalid.
    fn from_str(text: &str) -> Result<TraceParent, String> {
        let invalid = || format!("{text:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)");
        let version = text.get(..2).ok_or_else(invalid)?;
        let head = match version {
            "00" if text.len() == 55 => text,
            "00" | "ff" => return Err(invalid()),
            _ if text.len() == 55 || text.as_bytes().get(55) == Some(&b'-') => &text[..55],
            _ => return Err(invalid()),
        };
        let fields: Vec<&str> = head.split('-').collect();
        let [version, trace, span, flags] = fields[..] else {
            return Err(invalid());
        };
        if ![version, trace, span, flags]
            .iter()
            .all(|field| field.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        {
            return Err(invalid());
        }
        let mut parent = TraceParent {
            trace_id: [0; 16],
            span_id: [0; 8],
            flags: 0,
        };
        let mut flag = [0u8; 1];
        hex::decode_to_slice(trace, &mut parent.trace_id).map_err(|_| invalid())?;
        hex::decode_to_slice(span, &mut parent.span_id).map_err(|_| invalid())?;
        hex::decode_to_slice(flags, &mut flag).map_err(|_| invalid())?;
        parent.flags = flag[0];
        if parent.trace_id == [0; 16] || parent.span_id == [0; 8] {
            return Err(invalid());
        }
        Ok(parent)
    }
}

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
    fn a_traceparent_reads_and_writes_the_same_text() {
        let parent: TraceParent = EXAMPLE.parse().unwrap();
        assert_eq!(hex::encode(parent.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(parent.span_id), "00f067aa0ba902b7");
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), EXAMPLE);
    }

    #[test]
    fn what_the_w3c_rules_reject_is_rejected() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert!(bad.parse::<TraceParent>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_first_four_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes-next";
        let parent: TraceParent = later.parse().unwrap();
        assert!(!parent.sampled());
        assert_eq!(hex::encode(parent.span_id), "00f067aa0ba902b7");
    }

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
