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

/// Ticks along the axis: its start, quarters and end, as offsets from the unzoomed axis's start
/// (the run's creation, or the page's first step).
pub fn ticks(axis: Axis) -> Markup {
    html! {
        div.ticks aria-hidden="true" {
            @for quarter in 0..=4i64 {
                @let offset = axis.start - axis.origin + axis.length_ms() * quarter / 4;
                span.tick style={ "left:" (quarter * 25) "%" } {
                    @if offset == 0 { "0" } @else { "+" (format::duration(offset)) }
                }
            }
        }
    }
}

/// The span of time the timeline shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Axis {
    start: i64,
    end: i64,
    /// Where the whole axis starts: a zoomed one shows part of it.
    origin: i64,
    /// Where the whole axis ends.
    whole_end: i64,
}

/// A part of an axis to show: milliseconds from its start, `from < to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zoom {
    pub from: i64,
    pub to: i64,
}

impl Zoom {
    /// `FROM-TO` as the page's `?zoom=` gives it.
    pub fn parse(text: &str) -> Result<Zoom, String> {
        let refuse =
            || format!("zoom: expected FROM-TO, milliseconds from the axis's start with FROM < TO, got {text:?}");
        let (from, to) = text.trim().split_once('-').ok_or_else(refuse)?;
        let (from, to) = (
            from.parse::<i64>().map_err(|_| refuse())?,
            to.parse::<i64>().map_err(|_| refuse())?,
        );
        if from < 0 || to <= from {
            return Err(refuse());
        }
        Ok(Zoom { from, to })
    }
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
        Axis::whole(start, end)
    }

    fn whole(start: i64, end: i64) -> Axis {
        let end = end.max(start + 1);
        Axis {
            start,
            end,
            origin: start,
            whole_end: end,
        }
    }

    /// The part of the axis `zoom` names, within it.
    pub fn zoomed(self, zoom: Option<Zoom>) -> Axis {
        let Some(zoom) = zoom else {
            return self;
        };
        let start = (self.origin + zoom.from).min(self.whole_end - 1);
        Axis {
            start,
            end: (self.origin + zoom.to).clamp(start + 1, self.whole_end),
            ..self
        }
    }

    /// Whether the axis shows only part of itself.
    pub fn is_zoomed(self) -> bool {
        (self.start, self.end) != (self.origin, self.whole_end)
    }

    /// The zooms of the controls: in (the middle half), out (twice as long), earlier and later
    /// (by half the span); `None` where there is no such move.
    pub fn moves(self) -> [Option<Zoom>; 4] {
        let (from, to) = (self.start - self.origin, self.end - self.origin);
        let (span, whole) = (to - from, self.whole_end - self.origin);
        let zoom = |from: i64, to: i64| {
            let (from, to) = (from.clamp(0, whole), to.clamp(0, whole));
            (to > from && (from, to) != (self.start - self.origin, self.end - self.origin)).then_some(Zoom { from, to })
        };
        let shift = |by: i64| {
            let by = by.clamp(-from, whole - to);
            zoom(from + by, to + by)
        };
        [
            (span >= 4).then(|| zoom(from + span / 4, to - span / 4)).flatten(),
            zoom(from - span / 2, to + span / 2),
            shift(-span / 2),
            shift(span / 2),
        ]
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
        Axis::whole(start, end)
    }

    /// `left` and `width` of a bar from `from` to `to`, in percent of the axis, cut to it; never
    /// thinner than a hair, so an instant still shows. `None` for a bar wholly outside it.
    fn place(self, from: i64, to: i64) -> Option<String> {
        if to < self.start || from > self.end {
            return None;
        }
        let (from, to) = (from.max(self.start), to.min(self.end));
        let span = (self.end - self.start) as f64;
        let left = ((from - self.start) as f64 / span * 100.0).clamp(0.0, 100.0);
        let width = ((to - from).max(0) as f64 / span * 100.0).clamp(0.4, 100.0 - left.min(99.6));
        Some(format!("left:{left:.2}%;width:{width:.2}%"))
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
                @if let Some(place) = axis.place(created, waited_until) {
                    span.bar.wait style=(place) title={ "waited " (format::duration(waited_until - created)) } {}
                }
            }
            @if replayed {
                @let at = finished.unwrap_or(created);
                @let why = if step.replayed_from_run_id.is_empty() { "settled without running" } else { "replayed from the parent run: nothing ran" };
                @if let Some(place) = axis.place(at, at) { span.bar.replayed style=(place) title=(why) {} }
            }
            @for wait in waits {
                @let end = wait.to.unwrap_or(now);
                @if let Some(place) = axis.place(wait.from, end) {
                    span.bar.person style=(place)
                        title={ "waited for a person " (format::duration(end - wait.from)) ": " (wait.how) @if !wait.who.is_empty() { " by " (wait.who) } } {}
                }
            }
            @for (index, attempt) in attempts.iter().enumerate() {
                @let end = attempt.end.unwrap_or(now);
                @if let Some(place) = axis.place(attempt.start, end) {
                    span class={ "bar attempt " (attempt.how) } style=(place)
                        title={ "attempt " (attempt.number) @if !attempt.worker.is_empty() { " on " (attempt.worker) } ": " (attempt.how) ", " (format::duration(end - attempt.start)) } {}
                }
                @if let (Some(ended), Some(next)) = (attempt.end.filter(|_| attempt.how == "error"), attempts.get(index + 1)) {
                    @if let Some(place) = axis.place(ended, next.start) {
                        span.bar.backoff style=(place)
                            title={ "backoff " (format::duration(next.start - ended)) " before attempt " (next.number) } {}
                    }
                }
            }
            @if attempts.is_empty() && !replayed {
                @if let Some(started) = format::millis(&step.started_at) {
                    @let end = finished.unwrap_or(now);
                    @if let Some(place) = axis.place(started, end) {
                        span class={ "bar attempt " (bar_class(step)) } style=(place)
                            title={ "attempt " (step.attempts) ", " (format::duration(end - started)) } {}
                    }
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
        let axis = Axis::whole(0, 10_000);
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

        // Zoomed to its last second and a half: the person's wait is gone, the backoff cut.
        let zoomed = axis.zoomed(Some(Zoom { from: 6_000, to: 7_500 }));
        let html = track(zoomed, &step, (&attempts[key], &waits[key]), 10_000).into_string();
        assert!(!html.contains("bar person"), "{html}");
        assert!(
            html.contains(r#"class="bar backoff" style="left:0.00%;width:33.33%""#),
            "{html}"
        );
        let ticks = super::ticks(zoomed).into_string();
        assert!(ticks.contains("+6.00 s") && ticks.contains("+7.50 s"), "{ticks}");
    }

    #[test]
    fn zoom_moves_stay_within_the_axis() {
        let axis = Axis::whole(1_000, 11_000);
        assert!(!axis.is_zoomed());
        let [zoom_in, zoom_out, earlier, later] = axis.moves();
        assert_eq!(zoom_in, Some(Zoom { from: 2_500, to: 7_500 }));
        assert_eq!(
            (zoom_out, earlier, later),
            (None, None, None),
            "the whole axis has nowhere else to go"
        );
        let part = axis.zoomed(zoom_in);
        assert!(part.is_zoomed());
        let [_, out, earlier, later] = part.moves();
        assert_eq!(out, Some(Zoom { from: 0, to: 10_000 }));
        assert_eq!(earlier, Some(Zoom { from: 0, to: 5_000 }));
        assert_eq!(
            later,
            Some(Zoom {
                from: 5_000,
                to: 10_000
            })
        );
        // Past the end, a zoom is cut to the axis.
        let past = axis.zoomed(Some(Zoom {
            from: 9_000,
            to: 50_000,
        }));
        assert_eq!(past.moves()[3], None);
        assert_eq!(Zoom::parse("10-20"), Ok(Zoom { from: 10, to: 20 }));
        for bad in ["20-10", "x", "5", "-1-3", "1-1"] {
            assert!(Zoom::parse(bad).unwrap_err().starts_with("zoom:"), "{bad}");
        }
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
