//! The W3C trace context the kernel hands a tool or a hosted agent's handler, so spans the code
//! makes itself join the trace of the run that called it.

use std::collections::HashMap;

/// A W3C trace context: the trace a dispatch belongs to and the span its own spans go under.
///
/// When the kernel exports traces (`--otlp-endpoint`) the parent is the attempt's `run` span;
/// otherwise it is the agent's own `traceparent`, as the agent sent it.
///
/// ```
/// use worker_sdk::TraceContext;
///
/// let ctx = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
/// assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(ctx.parent_span_id(), "00f067aa0ba902b7");
/// assert!(ctx.sampled());
/// assert_eq!(ctx.carrier()["traceparent"], ctx.traceparent());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    parent: kernel_proto::traceparent::TraceParent,
    /// Its version-`00` text, which the accessors slice.
    traceparent: String,
}

impl TraceContext {
    /// Reads a `traceparent` as the W3C rules do (the kernel reads it the same way); `None` when
    /// it is not one, and the context is then ignored.
    pub fn parse(traceparent: &str) -> Option<TraceContext> {
        let parent: kernel_proto::traceparent::TraceParent = traceparent.parse().ok()?;
        Some(TraceContext {
            parent,
            traceparent: parent.to_string(),
        })
    }

    /// The `traceparent` header's text, to send on with outgoing requests.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The trace's id, 32 hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The id of the span a new span should be the child of, 16 hex digits.
    pub fn parent_span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the trace is being recorded.
    pub fn sampled(&self) -> bool {
        self.parent.sampled()
    }

    /// The context as a propagation carrier (`{"traceparent": ...}`), for an OpenTelemetry
    /// `TextMapPropagator::extract`.
    pub fn carrier(&self) -> HashMap<String, String> {
        HashMap::from([("traceparent".to_owned(), self.traceparent.clone())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_traceparent_is_a_context() {
        assert!(
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .is_some_and(|c| !c.sampled())
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }
}
