//! Spans from committed events, with no I/O: a run's span once it ends, and a span per attempt of
//! each call (or hosted handler dispatch) with a child per phase of its life:
//!
//! - `scheduled`: recorded (or failed, for a retry) until due: a retry's backoff, an approval;
//! - `queued`: due until the scheduler picked a worker slot and recorded the start;
//! - `dispatched`: the start recorded until it was durable (the worker is sent it then);
//! - `run`: on the worker, until its result reached the kernel;
//! - `recorded`: the result until it was durable.
//!
//! Times an attempt saw here are kept until it settles; after a restart the step's own record
//! stands in for what was lost (a retry's scheduling then reads as its start).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::context::{TraceParent, attempt_span, phase_span, run_span, trace_id};
use crate::model::{
    ErrorKind, EventType, Millis, Outcome, RunId, RunRecord, RunStatus, StepKey, StepKind, StepRecord, StepStatus,
};
use crate::store::Published;

/// Attempts whose times are kept at once; past it, an attempt's spans are built from its record.
const MAX_ATTEMPTS_KEPT: usize = 65_536;

/// What a committed event tells the spans: cut from the event and its step on the writer
/// thread, so nothing large (arguments, results) is copied there.
#[derive(Clone, Debug)]
pub struct Mark {
    pub kind: EventType,
    pub run: RunId,
    pub at: Millis,
    /// When its batch became durable.
    pub committed: SystemTime,
    pub step: Option<StepMark>,
}

/// The facts of a step that its spans carry.
#[derive(Clone, Debug)]
pub struct StepMark {
    pub key: StepKey,
    pub kind: StepKind,
    pub tool: String,
    pub attempts: u32,
    pub status: StepStatus,
    pub outcome: Option<Outcome>,
    pub error_kind: Option<ErrorKind>,
    pub worker: Option<String>,
    pub created_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub not_before: Option<Millis>,
    pub answered_at: Option<Millis>,
    pub trace: Option<TraceParent>,
}

impl Mark {
    /// The mark of a committed event, when spans care about it.
    pub fn of(published: &Published, committed: SystemTime) -> Option<Mark> {
        let event = &published.event;
        let step = match (&published.step, run_ends(event.kind)) {
            (_, true) => None,
            (Some(step), false) if matches!(step.kind, StepKind::Tool | StepKind::Agent) && moves(event.kind) => {
                Some(StepMark::of(step))
            }
            _ => return None,
        };
        Some(Mark {
            kind: event.kind,
            run: event.run_id.clone(),
            at: event.at,
            committed,
            step,
        })
    }
}

impl StepMark {
    fn of(step: &StepRecord) -> StepMark {
        StepMark {
            key: step.key.clone(),
            kind: step.kind,
            tool: step.tool.clone(),
            attempts: step.attempts,
            status: step.status,
            outcome: step.outcome,
            error_kind: step.error_kind,
            worker: step.worker.clone(),
            created_at: step.created_at,
            started_at: step.started_at,
            finished_at: step.finished_at,
            not_before: step.not_before,
            answered_at: step.approval.as_ref().map(|approval| approval.answered_at),
            trace: step.trace,
        }
    }
}

fn run_ends(kind: EventType) -> bool {
    matches!(
        kind,
        EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled
    )
}

fn starts(kind: EventType) -> bool {
    matches!(kind, EventType::ToolStart | EventType::AgentDispatched)
}

fn ends(kind: EventType) -> bool {
    matches!(
        kind,
        EventType::ToolResult
            | EventType::ToolAttemptFailed
            | EventType::ToolLeaseLost
            | EventType::ToolSuspended
            | EventType::ToolDenied
            | EventType::AgentResult
            | EventType::AgentLeaseLost
            | EventType::AgentSuspended
    )
}

fn moves(kind: EventType) -> bool {
    starts(kind)
        || ends(kind)
        || matches!(
            kind,
            EventType::ToolScheduled | EventType::ToolResumed | EventType::AgentResumed
        )
}

/// What one attempt's spans need beyond its step's record.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    number: u32,
    scheduled: SystemTime,
    /// A retry's backoff: not before this.
    not_before: Option<Millis>,
    started: Option<SystemTime>,
    start_committed: Option<SystemTime>,
}

impl Attempt {
    /// Attempt `number`, scheduled at `scheduled` and not started yet.
    fn pending(number: u32, scheduled: SystemTime, not_before: Option<Millis>) -> Attempt {
        Attempt {
            number,
            scheduled,
            not_before,
            started: None,
            start_committed: None,
        }
    }
}

/// What a mark produced: spans to export, and a run that ended (its span needs its record).
#[derive(Debug, Default)]
pub struct Emitted {
    pub spans: Vec<SpanData>,
    pub run_ended: Option<(RunId, SystemTime)>,
}

/// The attempts in flight, by step.
#[derive(Default)]
pub struct Tracer {
    attempts: HashMap<(RunId, StepKey), Attempt>,
}

impl Tracer {
    /// Attempts whose times are held.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.attempts.len()
    }

    /// Takes in one committed event.
    pub fn on(&mut self, mark: Mark) -> Emitted {
        let Some(step) = &mark.step else {
            return Emitted {
                spans: Vec::new(),
                run_ended: run_ends(mark.kind).then(|| (mark.run.clone(), mark.committed)),
            };
        };
        let id = (mark.run.clone(), step.key.clone());
        let mut spans = Vec::new();
        match mark.kind {
            EventType::ToolScheduled if step.status.is_terminal() => {
                // Settled as it was recorded: refused, a cache hit, or replayed in a branch.
                spans.push(attempt(&mark, step, None, step.attempts.max(1)));
            }
            EventType::ToolScheduled => self.keep(id, Attempt::pending(1, time(step.created_at), step.not_before)),
            EventType::ToolResumed | EventType::AgentResumed => {
                self.keep(id, Attempt::pending(step.attempts + 1, mark.committed, None));
            }
            kind if starts(kind) => {
                let mut held = self
                    .attempts
                    .remove(&id)
                    .filter(|held| held.number == step.attempts)
                    .unwrap_or_else(|| recovered(step));
                held.started = step.started_at.map(time);
                held.start_committed = Some(mark.committed);
                self.keep(id, held);
            }
            kind if ends(kind) => {
                let held = self
                    .attempts
                    .remove(&id)
                    .filter(|held| held.number == step.attempts)
                    .or_else(|| step.started_at.is_some().then(|| recovered(step)));
                let number = held.map_or(step.attempts.max(1), |held| held.number);
                let phases = held.filter(|held| held.start_committed.is_some() && kind != EventType::ToolDenied);
                spans.push(attempt(&mark, step, held.map(|held| held.scheduled), number));
                if let Some(held) = phases {
                    spans.extend(phase_spans(&mark, step, &held));
                }
                if !step.status.is_terminal() {
                    self.keep(id, Attempt::pending(number + 1, mark.committed, step.not_before));
                }
            }
            _ => {}
        }
        Emitted { spans, run_ended: None }
    }

    fn keep(&mut self, id: (RunId, StepKey), attempt: Attempt) {
        if self.attempts.len() < MAX_ATTEMPTS_KEPT || self.attempts.contains_key(&id) {
            self.attempts.insert(id, attempt);
        }
    }
}

/// An attempt whose times were lost with a restart, read from its step's record.
fn recovered(step: &StepMark) -> Attempt {
    let started = step.started_at.map(time);
    Attempt {
        number: step.attempts.max(1),
        scheduled: match step.attempts {
            0 | 1 => time(step.created_at),
            _ => started.unwrap_or_else(|| time(step.created_at)),
        },
        not_before: None,
        started,
        start_committed: started,
    }
}

/// A timestamp of the store (milliseconds since the epoch).
pub fn time(at: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(at.max(0) as u64)
}

fn attempt(mark: &Mark, step: &StepMark, scheduled: Option<SystemTime>, number: u32) -> SpanData {
    let trace = trace_id(&mark.run, step.trace.as_ref());
    let start = scheduled.unwrap_or_else(|| time(step.created_at)).min(mark.committed);
    let what = match step.kind {
        StepKind::Agent => "agent",
        _ => "tool",
    };
    let mut attributes = vec![
        KeyValue::new("kernel.run.id", mark.run.to_string()),
        KeyValue::new("kernel.step.key", step.key.to_string()),
        KeyValue::new(format!("kernel.{what}"), step.tool.clone()),
        KeyValue::new("kernel.attempt", i64::from(number)),
        KeyValue::new("kernel.event", mark.kind.as_str().to_owned()),
    ];
    if let Some(worker) = &step.worker {
        attributes.push(KeyValue::new("kernel.worker", worker.clone()));
    }
    let ended = match (mark.kind, step.status.is_terminal()) {
        (EventType::ToolResult | EventType::AgentResult | EventType::ToolDenied, _)
        | (EventType::ToolScheduled, true) => step.outcome.map(Outcome::as_str),
        (EventType::ToolAttemptFailed, _) => Some("attempt_failed"),
        (EventType::ToolLeaseLost | EventType::AgentLeaseLost, _) => Some("lease_lost"),
        (EventType::ToolSuspended | EventType::AgentSuspended, _) => Some("suspended"),
        _ => None,
    };
    if let Some(ended) = ended {
        attributes.push(KeyValue::new("kernel.outcome", ended));
    }
    if let Some(kind) = step.error_kind.filter(|_| ended != Some("ok")) {
        attributes.push(KeyValue::new("kernel.error.kind", kind.as_str()));
    }
    let status = match ended {
        None | Some("ok" | "suspended") => Status::Unset,
        Some(ended) => Status::error(ended.to_owned()),
    };
    span(
        (trace, attempt_span(&mark.run, &step.key, number)),
        (run_span(&mark.run), false),
        format!("{what} {}", step.tool),
        (start, mark.committed),
        attributes,
        status,
    )
}

/// The five phases of a started attempt, each clamped to follow the one before: their bounds
/// come from two clocks (the writer's milliseconds and commit instants).
fn phase_spans(mark: &Mark, step: &StepMark, held: &Attempt) -> Vec<SpanData> {
    let scheduled = held.scheduled;
    let mut due = held.not_before.map_or(scheduled, time).max(scheduled);
    if held.number == 1
        && let Some(answered) = step.answered_at
    {
        due = due.max(time(answered));
    }
    let started = held.started.unwrap_or(due).max(due);
    let durable = held.start_committed.unwrap_or(started).max(started);
    let arrived = time(
        step.finished_at
            .filter(|_| step.status.is_terminal())
            .unwrap_or(mark.at),
    )
    .max(durable);
    let recorded = mark.committed.max(arrived);
    let trace = trace_id(&mark.run, step.trace.as_ref());
    let parent = attempt_span(&mark.run, &step.key, held.number);
    [
        ("scheduled", scheduled, due),
        ("queued", due, started),
        ("dispatched", started, durable),
        ("run", durable, arrived),
        ("recorded", arrived, recorded),
    ]
    .into_iter()
    .map(|(phase, from, to)| {
        let mut attributes = vec![KeyValue::new("kernel.phase", phase)];
        if phase == "run"
            && let Some(worker) = &step.worker
        {
            attributes.push(KeyValue::new("kernel.worker", worker.clone()));
        }
        span(
            (trace, phase_span(&mark.run, &step.key, held.number, phase)),
            (parent, false),
            phase.to_owned(),
            (from, to),
            attributes,
            Status::Unset,
        )
    })
    .collect()
}

/// A run's span, from its creation to `ended`, under its agent's span when it named one.
pub fn run_span_of(run: &RunRecord, ended: SystemTime) -> SpanData {
    let trace = trace_id(&run.id, run.trace.as_ref());
    let parent = run
        .trace
        .map_or((SpanId::INVALID.to_bytes(), false), |trace| (trace.span_id, true));
    let mut attributes = vec![
        KeyValue::new("kernel.run.id", run.id.to_string()),
        KeyValue::new("kernel.agent", run.agent.clone()),
        KeyValue::new("kernel.run.status", run.status.as_str()),
        KeyValue::new("kernel.run.tool_calls", i64::from(run.tool_calls)),
    ];
    if let Some((parent, _)) = &run.parent {
        attributes.push(KeyValue::new("kernel.run.parent", parent.to_string()));
    }
    let status = match run.status {
        RunStatus::Failed => Status::error(run.reason.clone().unwrap_or_else(|| "failed".to_owned())),
        _ => Status::Unset,
    };
    let start = time(run.created_at).min(ended);
    span(
        (trace, run_span(&run.id)),
        parent,
        format!("run {}", run.agent),
        (start, ended),
        attributes,
        status,
    )
}

fn span(
    (trace, id): ([u8; 16], [u8; 8]),
    (parent, remote): ([u8; 8], bool),
    name: String,
    (start, end): (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    status: Status,
) -> SpanData {
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace),
            SpanId::from_bytes(id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::from_bytes(parent),
        parent_span_is_remote: remote,
        span_kind: SpanKind::Internal,
        name: name.into(),
        start_time: start,
        end_time: end.max(start),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: InstrumentationScope::builder("kernel")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_800_000_000_000;

    fn step(status: StepStatus, attempts: u32) -> StepMark {
        StepMark {
            key: StepKey::for_call(0, 0, None),
            kind: StepKind::Tool,
            tool: "charge".into(),
            attempts,
            status,
            outcome: None,
            error_kind: None,
            worker: Some("w1".into()),
            created_at: T0,
            started_at: None,
            finished_at: None,
            not_before: None,
            answered_at: None,
            trace: Some(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                    .parse()
                    .unwrap(),
            ),
        }
    }

    fn mark(run: &RunId, kind: EventType, at: Millis, step: StepMark) -> Mark {
        Mark {
            kind,
            run: run.clone(),
            at,
            committed: time(at) + Duration::from_micros(300),
            step: Some(step),
        }
    }

    fn names(spans: &[SpanData]) -> Vec<&str> {
        spans.iter().map(|span| span.name.as_ref()).collect()
    }

    #[test]
    fn a_retried_call_gives_a_span_per_attempt_with_its_phases() {
        let run = RunId::new();
        let mut tracer = Tracer::default();
        let mut spans = Vec::new();
        let scheduled = step(StepStatus::Pending, 0);
        spans.extend(
            tracer
                .on(mark(&run, EventType::ToolScheduled, T0, scheduled.clone()))
                .spans,
        );
        let first = StepMark {
            status: StepStatus::Running,
            attempts: 1,
            started_at: Some(T0 + 5),
            ..scheduled.clone()
        };
        spans.extend(tracer.on(mark(&run, EventType::ToolStart, T0 + 5, first.clone())).spans);
        let failed = StepMark {
            status: StepStatus::Pending,
            error_kind: Some(ErrorKind::Retryable),
            not_before: Some(T0 + 100),
            ..first
        };
        spans.extend(
            tracer
                .on(mark(&run, EventType::ToolAttemptFailed, T0 + 20, failed.clone()))
                .spans,
        );
        assert_eq!(tracer.held(), 1, "the retry's scheduling is kept");
        let second = StepMark {
            status: StepStatus::Running,
            attempts: 2,
            started_at: Some(T0 + 110),
            ..failed
        };
        spans.extend(
            tracer
                .on(mark(&run, EventType::ToolStart, T0 + 110, second.clone()))
                .spans,
        );
        let done = StepMark {
            status: StepStatus::Succeeded,
            outcome: Some(Outcome::Ok),
            error_kind: None,
            finished_at: Some(T0 + 150),
            ..second
        };
        spans.extend(
            tracer
                .on(mark(&run, EventType::ToolResult, T0 + 150, done.clone()))
                .spans,
        );
        assert_eq!(tracer.held(), 0, "a settled call leaves nothing behind");
        let phases = ["scheduled", "queued", "dispatched", "run", "recorded"];
        let mut expected = vec!["tool charge"];
        expected.extend(phases);
        expected.push("tool charge");
        expected.extend(phases);
        assert_eq!(names(&spans), expected);

        let agent = done.trace.unwrap();
        assert!(
            spans
                .iter()
                .all(|span| span.span_context.trace_id().to_bytes() == agent.trace_id)
        );
        let (first, second) = (&spans[0], &spans[6]);
        for (attempt, number) in [(first, 1), (second, 2)] {
            assert_eq!(attempt.parent_span_id.to_bytes(), run_span(&run));
            assert_eq!(
                attempt.span_context.span_id().to_bytes(),
                attempt_span(&run, &done.key, number)
            );
        }
        assert!(
            matches!(first.status, Status::Error { .. }),
            "a failed attempt is an error"
        );
        assert_eq!(second.status, Status::Unset);
        // The retry was scheduled when the first attempt failed and due at its backoff.
        let retry = &spans[7..12];
        assert!(
            retry
                .iter()
                .all(|phase| phase.parent_span_id == second.span_context.span_id())
        );
        assert_eq!(retry[0].start_time, time(T0 + 20) + Duration::from_micros(300));
        assert_eq!(retry[0].end_time, time(T0 + 100));
        assert_eq!(retry[1].end_time, time(T0 + 110), "queued until the start was recorded");
        assert_eq!(retry[4].end_time, second.end_time, "recorded ends with the attempt");
        for window in retry.windows(2) {
            assert_eq!(window[0].end_time, window[1].start_time, "phases follow each other");
        }
    }

    #[test]
    fn an_attempt_a_restart_interrupted_is_read_from_its_record() {
        let run = RunId::new();
        let mut tracer = Tracer::default();
        let done = StepMark {
            status: StepStatus::Succeeded,
            outcome: Some(Outcome::Ok),
            attempts: 1,
            started_at: Some(T0 + 5),
            finished_at: Some(T0 + 50),
            ..step(StepStatus::Succeeded, 1)
        };
        let spans = tracer.on(mark(&run, EventType::ToolResult, T0 + 50, done)).spans;
        assert_eq!(
            names(&spans),
            ["tool charge", "scheduled", "queued", "dispatched", "run", "recorded"]
        );
        assert_eq!(spans[0].start_time, time(T0));
        assert_eq!(spans[4].start_time, time(T0 + 5));
    }

    #[test]
    fn a_call_settled_as_it_was_recorded_is_one_span() {
        let run = RunId::new();
        let mut tracer = Tracer::default();
        let refused = StepMark {
            outcome: Some(Outcome::Denied),
            ..step(StepStatus::Failed, 0)
        };
        let spans = tracer.on(mark(&run, EventType::ToolScheduled, T0, refused)).spans;
        assert_eq!(names(&spans), ["tool charge"]);
        assert_eq!(tracer.held(), 0);
    }

    #[test]
    fn a_run_that_ends_asks_for_its_span() {
        let run = RunId::new();
        let ended = Mark {
            kind: EventType::RunCompleted,
            run: run.clone(),
            at: T0,
            committed: time(T0),
            step: None,
        };
        let emitted = Tracer::default().on(ended);
        assert_eq!(emitted.run_ended.map(|(id, _)| id), Some(run.clone()));
        let mut record = crate::machine::records::run();
        record.trace = Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let span = run_span_of(&record, time(record.created_at + 10));
        assert_eq!(span.name, format!("run {}", record.agent));
        assert_eq!(span.parent_span_id.to_bytes(), record.trace.unwrap().span_id);
        assert!(span.parent_span_is_remote);
        assert_eq!(span.span_context.span_id().to_bytes(), run_span(&record.id));
    }
}
