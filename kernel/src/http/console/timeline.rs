//! A run's steps on a time axis: a bar per attempt, read from the event log, coloured by how the
//! attempt ended, after a thin bar for the wait before the first one; the wait for a person
//! (an approval or a question) as a bar of its own, whatever the answer; the backoff between a
//! failed attempt and the next; ticks along the axis and a legend that names every colour.

use std::collections::HashMap;

use kernel_proto::v1 as pb;
use maud::{Markup, html};

use super::format;

/// One attempt of a step, as its events tell it.
pub struct Attempt {
    pub number: u64,
    pub worker: String,
    pub start: i64,
    pub end: Option<i64>,
    /// `running`, `ok`, `error`, `lost`, `cancelled` or `suspended`.
    pub how: String,
}

/// Each step's attempts, by step key, from the run's events in order.
pub fn attempts(events: &[pb::Event]) -> HashMap<String, Vec<Attempt>> {
    let mut by_step: HashMap<String, Vec<Attempt>> = HashMap::new();
    for event in events {
        let Ok(payload) = serde_json::from_str::<serde_json::Value>(&event.payload_json) else {
            continue;
        };
        let Some(key) = payload.get("step_key").and_then(|k| k.as_str()) else {
            continue;
        };
        let at = format::millis(&event.at).unwrap_or(0);
        let text = |name: &str| payload.get(name).and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let attempts = by_step.entry(key.to_owned()).or_default();
        let ended = match event.r#type.as_str() {
            "tool:start" | "agent:dispatched" | "tool:resumed" | "agent:resumed" => {
                attempts.push(Attempt {
                    number: payload
                        .get("attempt")
                        .and_then(|a| a.as_u64())
                        .unwrap_or(attempts.len() as u64 + 1),
                    worker: text("worker"),
                    start: at,
                    end: None,
                    how: "running".to_owned(),
                });
                continue;
            }
            "tool:attempt_failed" => "error".to_owned(),
            "tool:lease_lost" | "agent:lease_lost" => "lost".to_owned(),
            "tool:suspended" | "agent:suspended" => "suspended".to_owned(),
            "tool:result" | "agent:result" => match text("status").as_str() {
                "" => "ok".to_owned(),
                status => status.to_owned(),
            },
            _ => continue,
        };
        if let Some(open) = attempts.iter_mut().rev().find(|a| a.end.is_none()) {
            open.end = Some(at);
            open.how = ended;
        }
    }
    by_step
}

/// A wait for a person about a step: an approval of its call, or a question it is.
pub struct PersonWait {
    from: i64,
    /// `None` while nobody has answered.
    to: Option<i64>,
    /// The approval's status (`pending`, `approved`, `rejected`, ...) and who answered.
    how: String,
    who: String,
}

/// The waits for a person, by the step each is about, from the run's approvals.
pub fn person_waits(approvals: &[pb::Approval]) -> HashMap<String, Vec<PersonWait>> {
    let mut by_step: HashMap<String, Vec<PersonWait>> = HashMap::new();
    for approval in approvals {
        let Some(from) = format::millis(&approval.requested_at) else {
            continue;
        };
        by_step.entry(approval.step_key.clone()).or_default().push(PersonWait {
            from,
            to: format::millis(&approval.answered_at),
            how: format::approval_status(approval.status),
            who: approval.decider.clone(),
        });
    }
    by_step
}

/// What each colour of the timeline means, as the page's legend says it.
pub fn legend() -> Markup {
    let items = [
        ("wait", "waiting for a worker"),
        ("person", "waiting for a person"),
        ("ok", "attempt succeeded"),
        ("error", "attempt failed"),
        ("backoff", "backoff before a retry"),
        ("lost", "worker lost"),
        ("running", "running"),
        ("suspended", "gave back its slot"),
        ("replayed", "replayed or settled without running"),
    ];
    html! {
        ul.legend aria-label="What the bars mean" {
            @for (class, text) in items { li { span class={ "swatch " (class) } {} " " (text) } }
        }
    }
}

/// Ticks along the axis: its start, quarters and end, as offsets from the run's creation.
pub fn ticks(axis: Axis) -> Markup {
    html! {
        div.ticks aria-hidden="true" {
            @for quarter in 0..=4i64 {
                @let offset = axis.length_ms() * quarter / 4;
                span.tick style={ "left:" (quarter * 25) "%" } {
                    @if quarter == 0 { "0" } @else { "+" (format::duration(offset)) }
                }
            }
        }
    }
}

/// The span of time the timeline shows.
#[derive(Clone, Copy)]
pub struct Axis {
    start: i64,
    end: i64,
}

impl Axis {
    /// From the run's creation to its last recorded moment, or to `now` while it is live.
    pub fn of(run: &pb::Run, steps: &[&pb::Step], now: i64, live: bool) -> Axis {
        let start = format::millis(&run.created_at).unwrap_or(now);
        let mut end = format::millis(&run.updated_at).unwrap_or(start);
        for step in steps {
            end = end.max(format::millis(&step.finished_at).unwrap_or(0));
        }
        if live {
            end = end.max(now);
        }
        Axis {
            start,
            end: end.max(start + 1),
        }
    }

    /// From the first of `steps` to be created to the last to finish, or to `now` while one of
    /// them runs in a live run: one page of a long run's steps, drawn at a scale that shows them.
    pub fn spanning(steps: &[&pb::Step], now: i64, live: bool) -> Axis {
        let start = (steps.iter())
            .filter_map(|step| format::millis(&step.created_at))
            .min()
            .unwrap_or(now);
        let mut end = start;
        for step in steps {
            match format::millis(&step.finished_at) {
                Some(finished) => end = end.max(finished),
                None if live => end = end.max(now),
                None => {}
            }
        }
        Axis {
            start,
            end: end.max(start + 1),
        }
    }

    /// `left` and `width` of a bar from `from` to `to`, in percent of the axis; never thinner than
    /// a hair, so an instant still shows.
    fn place(self, from: i64, to: i64) -> String {
        let span = (self.end - self.start) as f64;
        let left = ((from - self.start) as f64 / span * 100.0).clamp(0.0, 100.0);
        let width = ((to - from).max(0) as f64 / span * 100.0).clamp(0.4, 100.0 - left.min(99.6));
        format!("left:{left:.2}%;width:{width:.2}%")
    }

    /// The axis's length, for its caption.
    pub fn length_ms(self) -> i64 {
        self.end - self.start
    }
}

/// A step's track: its wait, the waits for a person about it, then a bar per attempt with the
/// backoff before each retry.
pub fn track(axis: Axis, step: &pb::Step, (attempts, waits): (&[Attempt], &[PersonWait]), now: i64) -> Markup {
    let created = format::millis(&step.created_at).unwrap_or(axis.start);
    let finished = format::millis(&step.finished_at);
    let first_start = attempts
        .first()
        .map(|a| a.start)
        .or_else(|| format::millis(&step.started_at));
    let waited_until = first_start.or(finished).unwrap_or(now);
    let replayed = !step.replayed_from_run_id.is_empty() || (first_start.is_none() && finished.is_some());
    html! {
        div.track {
            @if !replayed && waited_until > created {
                span.bar.wait style=(axis.place(created, waited_until)) title={ "waited " (format::duration(waited_until - created)) } {}
            }
            @if replayed {
                @let at = finished.unwrap_or(created);
                @let why = if step.replayed_from_run_id.is_empty() { "settled without running" } else { "replayed from the parent run: nothing ran" };
                span.bar.replayed style=(axis.place(at, at)) title=(why) {}
            }
            @for wait in waits {
                @let end = wait.to.unwrap_or(now);
                span.bar.person style=(axis.place(wait.from, end))
                    title={ "waited for a person " (format::duration(end - wait.from)) ": " (wait.how) @if !wait.who.is_empty() { " by " (wait.who) } } {}
            }
            @for (index, attempt) in attempts.iter().enumerate() {
                @let end = attempt.end.unwrap_or(now);
                span class={ "bar attempt " (attempt.how) } style=(axis.place(attempt.start, end))
                    title={ "attempt " (attempt.number) @if !attempt.worker.is_empty() { " on " (attempt.worker) } ": " (attempt.how) ", " (format::duration(end - attempt.start)) } {}
                @if let (Some(ended), Some(next)) = (attempt.end.filter(|_| attempt.how == "error"), attempts.get(index + 1)) {
                    span.bar.backoff style=(axis.place(ended, next.start))
                        title={ "backoff " (format::duration(next.start - ended)) " before attempt " (next.number) } {}
                }
            }
            @if attempts.is_empty() && !replayed {
                @if let Some(started) = format::millis(&step.started_at) {
                    @let end = finished.unwrap_or(now);
                    span class={ "bar attempt " (bar_class(step)) } style=(axis.place(started, end))
                        title={ "attempt " (step.attempts) ", " (format::duration(end - started)) } {}
                }
            }
        }
    }
}

/// How a step's last attempt shows when its events are past what the page read.
fn bar_class(step: &pb::Step) -> &'static str {
    match pb::StepStatus::try_from(step.status) {
        Ok(pb::StepStatus::Succeeded) => "ok",
        Ok(pb::StepStatus::Running) => "running",
        Ok(pb::StepStatus::Cancelled) => "cancelled",
        Ok(pb::StepStatus::Suspended) => "suspended",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, at_ms: i64, payload: serde_json::Value) -> pb::Event {
        pb::Event {
            r#type: kind.to_owned(),
            at: Some(prost_types::Timestamp {
                seconds: at_ms / 1000,
                nanos: ((at_ms % 1000) * 1_000_000) as i32,
            }),
            payload_json: payload.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn a_wait_for_a_person_and_a_backoff_have_bars_of_their_own() {
        let key = "t0/p0";
        let at = |ms: i64| {
            Some(prost_types::Timestamp {
                seconds: ms / 1000,
                nanos: ((ms % 1000) * 1_000_000) as i32,
            })
        };
        let approvals = [pb::Approval {
            step_key: key.into(),
            requested_at: at(1_000),
            answered_at: at(4_000),
            status: pb::ApprovalStatus::Rejected as i32,
            decider: "alice".into(),
            ..Default::default()
        }];
        let waits = person_waits(&approvals);
        let events = [
            event("tool:start", 5_000, serde_json::json!({"step_key": key, "attempt": 1})),
            event("tool:attempt_failed", 5_500, serde_json::json!({"step_key": key})),
            event("tool:start", 6_500, serde_json::json!({"step_key": key, "attempt": 2})),
            event(
                "tool:result",
                7_000,
                serde_json::json!({"step_key": key, "status": "ok"}),
            ),
        ];
        let attempts = attempts(&events);
        let step = pb::Step {
            step_key: key.into(),
            created_at: at(1_000),
            finished_at: at(7_000),
            ..Default::default()
        };
        let axis = Axis { start: 0, end: 10_000 };
        let html = track(axis, &step, (&attempts[key], &waits[key]), 10_000).into_string();
        assert!(
            html.contains(r#"class="bar person" style="left:10.00%;width:30.00%""#),
            "{html}"
        );
        assert!(html.contains("rejected by alice"), "{html}");
        assert!(
            html.contains(r#"class="bar backoff" style="left:55.00%;width:10.00%""#),
            "{html}"
        );
        assert!(html.contains("before attempt 2"), "{html}");
        let ticks = ticks(axis).into_string();
        assert!(ticks.contains("+10.00 s") && ticks.contains("+2.50 s"), "{ticks}");
    }

    #[test]
    fn each_attempt_ends_as_its_events_say() {
        let key = "t1/p0";
        let events = [
            event(
                "tool:start",
                1_000,
                serde_json::json!({"step_key": key, "attempt": 1, "worker": "a"}),
            ),
            event("tool:attempt_failed", 1_200, serde_json::json!({"step_key": key})),
            event(
                "tool:start",
                1_500,
                serde_json::json!({"step_key": key, "attempt": 2, "worker": "b"}),
            ),
            event("tool:lease_lost", 1_900, serde_json::json!({"step_key": key})),
            event(
                "tool:start",
                2_000,
                serde_json::json!({"step_key": key, "attempt": 3, "worker": "c"}),
            ),
            event(
                "tool:result",
                2_100,
                serde_json::json!({"step_key": key, "status": "ok"}),
            ),
            event(
                "tool:start",
                2_050,
                serde_json::json!({"step_key": "t1/p1", "attempt": 1}),
            ),
        ];
        let attempts = attempts(&events);
        let first = &attempts[key];
        let seen: Vec<(u64, &str, i64, Option<i64>)> = first
            .iter()
            .map(|a| (a.number, a.how.as_str(), a.start, a.end))
            .collect();
        assert_eq!(
            seen,
            [
                (1, "error", 1_000, Some(1_200)),
                (2, "lost", 1_500, Some(1_900)),
                (3, "ok", 2_000, Some(2_100))
            ]
        );
        assert_eq!(first[2].worker, "c");
        let running = &attempts["t1/p1"];
        assert_eq!(
            (running.len(), running[0].how.as_str(), running[0].end),
            (1, "running", None)
        );
    }
}
