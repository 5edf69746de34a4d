//! A run's steps on its page: a timeline, one page of steps at a time, so a run of ten thousand
//! steps opens as fast as one of ten. Each step expands to what it holds, its attempts and the
//! actions the visitor may take on it.

use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_server::RunService;
use maud::{Markup, html};
use serde::Deserialize;

use super::timeline::{self, Attempt, Axis, Zoom};
use super::{actions, format, request};
use crate::auth::Caller;
use crate::grpc::RunApi;

/// Steps drawn on one page of the timeline.
pub const STEP_PAGE: usize = 200;
/// Events read to draw the page's attempts; a step whose events lie past them shows its last
/// attempt only.
const ATTEMPT_EVENTS: u32 = 5000;

/// `?page=N` of a run's page, as given.
#[derive(Deserialize, Default)]
pub struct PageQuery {
    #[serde(default)]
    page: Option<String>,
    /// The part of the time axis shown: `FROM-TO`, milliseconds from its start.
    #[serde(default)]
    zoom: Option<String>,
}

impl PageQuery {
    /// The page asked for, from 1; a page past the last shows the last.
    pub fn number(&self) -> Result<usize, tonic::Status> {
        match self.page.as_deref().map(str::trim) {
            None | Some("") => Ok(1),
            Some(text) => match text.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(tonic::Status::invalid_argument(format!(
                    "page: expected a page number from 1, got {text:?}"
                ))),
            },
        }
    }

    /// The zoom asked for, if any.
    pub fn zoom(&self) -> Result<Option<Zoom>, tonic::Status> {
        match self.zoom.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => Zoom::parse(text).map(Some).map_err(tonic::Status::invalid_argument),
        }
    }
}

/// The query of page `page` of a run's steps, zoomed to `zoom`.
pub fn query(page: usize, zoom: Option<Zoom>) -> String {
    match zoom {
        None => format!("?page={page}"),
        Some(zoom) => format!("?page={page}&zoom={}-{}", zoom.from, zoom.to),
    }
}

/// The steps one page shows, in the order the page draws them (a call a tool's body made right
/// after its caller, one level deeper), with where they sit among the run's.
pub struct StepPage<'a> {
    pub number: usize,
    pub pages: usize,
    pub total: usize,
    /// Index of the page's first step among all of them, in drawing order.
    pub first: usize,
    pub rows: Vec<(&'a pb::Step, usize)>,
}

impl<'a> StepPage<'a> {
    pub fn of(steps: &'a [pb::Step], asked: usize) -> StepPage<'a> {
        let pages = steps.len().div_ceil(STEP_PAGE).max(1);
        let number = asked.clamp(1, pages);
        let first = (number - 1) * STEP_PAGE;
        let rows = in_call_order(steps).into_iter().skip(first).take(STEP_PAGE).collect();
        StepPage {
            number,
            pages,
            total: steps.len(),
            first,
            rows,
        }
    }

    /// The whole run's time when it fits one page; a page's own span when it is one of several.
    fn axis(&self, run: &pb::Run, now: i64, live: bool) -> Axis {
        let steps: Vec<&pb::Step> = self.rows.iter().map(|(step, _)| *step).collect();
        match self.pages {
            1 => Axis::of(run, &steps, now, live),
            _ => Axis::spanning(&steps, now, live),
        }
    }

    /// When the earliest of the page's steps began, to read the events from there.
    fn began_ms(&self) -> Option<i64> {
        self.rows
            .iter()
            .filter_map(|(step, _)| format::millis(&step.created_at))
            .min()
    }
}

/// The steps as the page shows them, each with its depth.
fn in_call_order(steps: &[pb::Step]) -> Vec<(&pb::Step, usize)> {
    let keys: Vec<(&str, &str)> = (steps.iter())
        .map(|step| (step.step_key.as_str(), step.caller_step_key.as_str()))
        .collect();
    kernel_proto::nesting::nested_order(&keys)
        .into_iter()
        .map(|(index, depth)| (&steps[index], depth))
        .collect()
}

/// The run's events from where the page's steps begin: from the start on the first page, and on
/// a later one from the first event at or after its earliest step's creation, found by bisecting
/// the log (a handful of one-event reads), so a deep page draws its attempts too.
pub async fn events_for(
    runs: &RunApi,
    caller: &Option<Caller>,
    run: &pb::Run,
    page: &StepPage<'_>,
) -> Result<Vec<pb::Event>, tonic::Status> {
    let from = match (page.number, page.began_ms()) {
        (1, _) | (_, None) => 1,
        (_, Some(began)) => first_event_at(runs, caller, run, began).await?,
    };
    Ok(runs
        .list_run_events(request(
            pb::ListRunEventsRequest {
                run_id: run.id.clone(),
                from_seq: from,
                page_size: ATTEMPT_EVENTS,
            },
            caller,
        ))
        .await?
        .into_inner()
        .events)
}

/// The first sequence number whose event was appended at or after `at_ms`; events of a run are
/// appended by one writer, so their times rise with their numbers.
async fn first_event_at(
    runs: &RunApi,
    caller: &Option<Caller>,
    run: &pb::Run,
    at_ms: i64,
) -> Result<u64, tonic::Status> {
    let (mut low, mut high) = (1, run.last_seq.max(1));
    while low < high {
        let middle = low + (high - low) / 2;
        let probe = runs
            .list_run_events(request(
                pb::ListRunEventsRequest {
                    run_id: run.id.clone(),
                    from_seq: middle,
                    page_size: 1,
                },
                caller,
            ))
            .await?
            .into_inner()
            .events;
        match probe.first().and_then(|event| format::millis(&event.at)) {
            Some(at) if at < at_ms => low = middle + 1,
            _ => high = middle,
        }
    }
    Ok(low)
}

/// The steps' section: the page's steps on the run's time axis, with the way to the other pages.
pub fn section(
    run: &pb::Run,
    (page, events, zoom): (&StepPage<'_>, &[pb::Event], Option<Zoom>),
    approvals: &[pb::Approval],
    (live, allowed): (bool, actions::Allowed),
) -> Markup {
    // The console reads the kernel as a client does, over its API: "now" is the reader's.
    let now = crate::clock::Clock::wall().now_millis();
    let axis = page.axis(run, now, live).zoomed(zoom);
    let attempts = timeline::attempts(events);
    let waits = timeline::person_waits(approvals);
    let none: Vec<Attempt> = Vec::new();
    let no_wait = Vec::new();
    html! {
        section.steps {
            h2 { "Steps " span.note { (page.total) " · "
                @if page.pages > 1 { "this page spans " } @else { "axis " } (format::duration(axis.length_ms())) } }
            @if page.total == 0 { p.empty { "No steps yet." } }
            @if page.pages > 1 { (pager(&run.id, page)) }
            @if page.total > 0 { (zoom_controls(&run.id, page.number, axis)) (timeline::legend()) }
            div.timeline {
                @if page.total > 0 { div.axis { span {} span {} (timeline::ticks(axis)) span {} } }
                @for &(step, depth) in &page.rows {
                    @let tried = attempts.get(&step.step_key).unwrap_or(&none);
                    @let waited = waits.get(&step.step_key).unwrap_or(&no_wait);
                    (step_row(axis, (step, depth), (tried, waited), now, actions::step_actions(&run.id, step, allowed)))
                }
            }
            @if page.pages > 1 { (pager(&run.id, page)) }
        }
    }
}

/// Where the page's steps sit among the run's, and links to the first, previous, next and last
/// pages: plain links, so the pages read without the script and a keyboard reaches each.
fn pager(run_id: &str, page: &StepPage<'_>) -> Markup {
    let link = |number: usize, text: &str, rel: Option<&str>| {
        html! {
            @if number != page.number && (1..=page.pages).contains(&number) {
                a href={ "/runs/" (run_id) "?page=" (number) } rel=[rel] { (text) }
            } @else {
                span.off aria-disabled="true" { (text) }
            }
        }
    };
    let last = page.first + page.rows.len();
    html! {
        nav.pager aria-label="Pages of steps" {
            (link(1, "« First", None)) " "
            (link(page.number.saturating_sub(1), "‹ Previous", Some("prev"))) " "
            span.where { "Steps " (page.first + 1) "–" (last) " of " (page.total)
                " · page " (page.number) " of " (page.pages) } " "
            (link(page.number + 1, "Next ›", Some("next"))) " "
            (link(page.pages, "Last »", None))
        }
    }
}

/// Links that zoom the time axis in and out and move it earlier and later: plain links, so they
/// work without the script and from the keyboard.
fn zoom_controls(run_id: &str, page: usize, axis: Axis) -> Markup {
    let [zoom_in, zoom_out, earlier, later] = axis.moves();
    let link = |zoom: Option<Zoom>, text: &str, class: &str| {
        html! {
            @match zoom {
                Some(zoom) => a class=(class) href={ "/runs/" (run_id) (query(page, Some(zoom))) } { (text) },
                None => span.off class=(class) aria-disabled="true" { (text) },
            }
        }
    };
    html! {
        nav.zoom aria-label="Zoom the time axis" {
            "Time axis: "
            (link(zoom_in, "Zoom in", "zoom-in")) " "
            (link(zoom_out, "Zoom out", "zoom-out")) " "
            (link(earlier, "← Earlier", "earlier")) " "
            (link(later, "Later →", "later")) " "
            @if axis.is_zoomed() {
                a.whole href={ "/runs/" (run_id) (query(page, None)) } { "Whole axis" }
            }
        }
    }
}

/// A step's row: its bar on the timeline, and in its details what it holds, then `actions`.
fn step_row(
    axis: Axis,
    (step, depth): (&pb::Step, usize),
    (attempts, waits): (&[Attempt], &[timeline::PersonWait]),
    now: i64,
    actions: Markup,
) -> Markup {
    let status = format::step_status(step.status);
    let name = match step.tool.as_str() {
        "" => format::step_kind(step.kind),
        tool => tool.to_owned(),
    };
    html! {
        details.step data-key=(step.step_key) data-status=(status) {
            summary {
                span.name title=(step.step_key) style=[(depth > 0).then(|| format!("padding-left:{}px", 14 * depth))] {
                    // A call a tool's body made, under its caller.
                    @if !step.caller_step_key.is_empty() { span.nested title={ "called by " (step.caller_step_key) } { "↳ " } }
                    (name)
                }
                span class={ "status " (status) } { (status)
                    @let outcome = format::outcome(step.outcome);
                    @if !matches!(outcome.as_str(), "ok" | "unspecified") { " · " (outcome) } }
                (timeline::track(axis, step, (attempts, waits), now))
                span.progress data-progress=(step.step_key) {}
            }
            div.detail {
                (what_it_holds(step))
                h3 { "Arguments" } div.arguments { (format::json(&step.arguments_json)) }
                @if !step.output_json.is_empty() { h3 { "Result" } div.result { (format::json(&step.output_json)) } }
                @if !step.error.is_empty() { h3 { "Error" } pre.error { (step.error) } }
                @if !attempts.is_empty() { (attempts_table(attempts, now)) }
                (actions)
            }
        }
    }
}

fn what_it_holds(step: &pb::Step) -> Markup {
    html! {
        dl {
            dt { "Step" } dd { code { (step.step_key) } " · " (format::step_kind(step.kind))
                @if !step.effect.is_empty() { " · effect " (step.effect) } }
            @if !step.tool_version.is_empty() { dt { "Version" } dd { (step.tool_version) " " span.note { (format::clip(&step.tool_fingerprint, 16)) } } }
            dt { "Outcome" } dd { (format::outcome(step.outcome)) }
            dt { "Attempts" } dd { (step.attempts) @if step.max_attempts > 0 { " of " (step.max_attempts) }
                @if step.lease_losses > 0 { ", worker lost " (step.lease_losses) "×" } }
            @if !step.idempotency.is_empty() { dt { "Idempotency" } dd { (step.idempotency) " " code { (step.idempotency_key) } } }
            @if !step.worker.is_empty() { dt { "Worker" } dd { (step.worker) } }
            @if !step.decided_by.is_empty() { dt { "Decided by" } dd { (step.decided_by) } }
            @if let Some(approval) = &step.approval {
                dt { "Approval" } dd { (format::approval_status(approval.answer)) " by " (approval.decider)
                    @if !approval.reason.is_empty() { ": " (approval.reason) } }
            }
            @if step.cost > 0.0 { dt { "Cost" } dd { (step.cost) } }
            @if !step.resources.is_empty() { dt { "Resources" } dd { (step.resources.join(", ")) } }
            @if !step.caller_step_key.is_empty() { dt { "Called by" } dd { code { (step.caller_step_key) } " " span.note { "(its body's call through the kernel)" } } }
            @if !step.child_run_id.is_empty() { dt { "Child run" } dd { (format::run_link(&step.child_run_id)) } }
            @if !step.replayed_from_run_id.is_empty() { dt { "Replayed from" } dd { (format::run_link(&step.replayed_from_run_id)) } }
            dt { "Created" } dd { (format::time(&step.created_at)) }
            dt { "Finished" } dd { (format::time(&step.finished_at)) }
        }
    }
}

fn attempts_table(attempts: &[Attempt], now: i64) -> Markup {
    html! {
        h3 { "Attempts" }
        table.attempts {
            thead { tr { th { "#" } th { "Worker" } th { "Started" } th { "Took" } th { "Ended" } } }
            tbody { @for attempt in attempts {
                tr { td { (attempt.number) } td { (attempt.worker) }
                     td { (format::at_millis(attempt.start)) }
                     td { (format::duration(attempt.end.unwrap_or(now) - attempt.start)) }
                     td class={ "how " (attempt.how) } { (attempt.how) } }
            } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(n: usize) -> Vec<pb::Step> {
        (0..n)
            .map(|i| pb::Step {
                step_key: format!("t{i}/p0"),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn pages_split_the_steps_and_a_page_past_the_last_shows_the_last() {
        let all = steps(STEP_PAGE * 2 + 5);
        let first = StepPage::of(&all, 1);
        assert_eq!(
            (first.number, first.pages, first.first, first.rows.len()),
            (1, 3, 0, STEP_PAGE)
        );
        let last = StepPage::of(&all, 99);
        assert_eq!((last.number, last.first, last.rows.len()), (3, STEP_PAGE * 2, 5));
        assert_eq!(last.rows[0].0.step_key, format!("t{}/p0", STEP_PAGE * 2));
        let empty = StepPage::of(&[], 1);
        assert_eq!((empty.number, empty.pages, empty.rows.len()), (1, 1, 0));
    }

    #[test]
    fn a_page_that_is_no_number_is_refused_naming_the_field() {
        for bad in ["0", "x", "-1", "1.5"] {
            let query = PageQuery {
                page: Some(bad.to_owned()),
                zoom: None,
            };
            let status = query.number().unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().starts_with("page:"), "{}", status.message());
        }
        assert_eq!(PageQuery::default().number().unwrap(), 1);
        assert_eq!(
            PageQuery {
                page: Some("7".into()),
                zoom: None
            }
            .number()
            .unwrap(),
            7
        );
    }
}
