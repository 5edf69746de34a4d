//! Two runs side by side, `kernelctl runs diff` in the browser: their steps aligned by identity,
//! each marked by how B got its outcome (replayed from its parent, a result the fork set, run
//! live, blocked, only in one run), with what differs highlighted and both values shown.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kernel_proto::alignment::{self, Aligned, Difference, Mark};
use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_server::RunService;
use maud::{Markup, html};
use serde::Deserialize;

use super::{Section, admit, format, layout, refused, request};
use crate::grpc::RunApi;
use crate::http::{Http, session};

/// `?a=RUN&b=RUN`.
#[derive(Deserialize)]
pub struct Pair {
    #[serde(default)]
    a: String,
    #[serde(default)]
    b: String,
}

pub async fn page(
    State(http): State<Http>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Query(pair): Query<Pair>,
) -> Response {
    let caller = match admit(&http, &headers, session::READ, &uri.to_string()) {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let runs = RunApi(http.kernel.clone());
    let mut got = Vec::with_capacity(2);
    for (field, id) in [("a", &pair.a), ("b", &pair.b)] {
        if id.trim().is_empty() {
            return refused(tonic::Status::invalid_argument(format!("{field}: missing; a run's id")));
        }
        let asked = pb::GetRunRequest {
            run_id: id.trim().to_owned(),
        };
        match runs.get_run(request(asked, &caller)).await {
            Ok(response) => got.push(response.into_inner()),
            Err(status) => {
                return refused(tonic::Status::new(
                    status.code(),
                    format!("{field}: {}", status.message()),
                ));
            }
        }
    }
    let (a, b) = (&got[0], &got[1]);
    let aligned = alignment::align(&a.steps, &b.steps);
    let body = html! {
        h1 { "Compare runs" }
        (heading(a, b, aligned.stopped_at.as_deref()))
        @if aligned.rows.is_empty() { p.empty { "No steps recorded in either run." } }
        @else {
            table.compare {
                thead { tr { th { "Step" } th { "Tool" } th { "A" } th { "B" } th { "B is" } th { "Differs in" } } }
                tbody { @for row in &aligned.rows { (step_row(row, a, b)) } }
            }
        }
    };
    layout("Compare runs", Section::Runs, caller.is_some(), body).into_response()
}

fn run_of(got: &pb::GetRunResponse) -> &pb::Run {
    got.run.as_ref().expect("GetRun always returns its run")
}

/// Which run is which, how they are related, and where a branch stopped.
fn heading(a: &pb::GetRunResponse, b: &pb::GetRunResponse, stopped_at: Option<&str>) -> Markup {
    let (a, b) = (run_of(a), run_of(b));
    let related = if b.forked_from_run_id == a.id {
        "B is a branch of A"
    } else if a.forked_from_run_id == b.id {
        "A is a branch of B"
    } else {
        "the runs are not branches of each other"
    };
    html! {
        dl.header {
            @for (name, run) in [("A", a), ("B", b)] {
                dt { (name) } dd { (format::run_link(&run.id)) " " (run.agent) " "
                    span class={ "status " (format::run_status(run.status)) } { (format::run_status(run.status)) }
                    " · capture " (format::capture(run.capture)) }
            }
        }
        p.note { (related) "; steps are aligned by their identity ("
            a href={ "/compare?a=" (b.id) "&b=" (a.id) } { "swap A and B" } ")."
            @if let Some(key) = stopped_at { " The branch stopped at " code { (key) } " (write_tool_blocked)." } }
    }
}

fn step_row(row: &Aligned, a: &pb::GetRunResponse, b: &pb::GetRunResponse) -> Markup {
    let (a_step, b_step) = (row.a.map(|i| &a.steps[i]), row.b.map(|i| &b.steps[i]));
    let step = a_step.or(b_step).expect("a row holds a step");
    let mark = mark_class(row.mark);
    html! {
        tr class={ "mark-" (mark) @if !row.differs.is_empty() { " differs" } } data-key=(step.step_key) {
            td { code { (step.step_key) } }
            td { (name(step)) }
            td { (side(a_step)) }
            td { (side(b_step)) }
            td.mark { span class={ "mark " (mark) } { (row.mark.words()) } }
            td.differs {
                @if row.differs.is_empty() { span.none { "—" } }
                @for difference in &row.differs { span.differs { (difference.word()) } " " }
                @if let (Some(a_step), Some(b_step)) = (a_step, b_step) {
                    @if !row.differs.is_empty() { (both(row, a_step, b_step)) }
                }
            }
        }
    }
}

/// What a step called: a tool's name, or a handler step's kind and name.
fn name(step: &pb::Step) -> String {
    match (format::step_kind(step.kind).as_str(), step.tool.as_str()) {
        ("tool", tool) => tool.to_owned(),
        (kind, "") => kind.to_owned(),
        (kind, tool) => format!("{kind}:{tool}"),
    }
}

fn side(step: Option<&pb::Step>) -> Markup {
    match step {
        None => html! { span.none { "—" } },
        Some(step) => html! {
            (format::step_status(step.status))
            @let outcome = format::outcome(step.outcome);
            @if !matches!(outcome.as_str(), "ok" | "unspecified") { " · " (outcome) }
        },
    }
}

/// The differing values of both runs, side by side, behind a disclosure.
fn both(row: &Aligned, a: &pb::Step, b: &pb::Step) -> Markup {
    let shown = |difference: Difference| row.differs.contains(&difference);
    html! {
        details.both {
            summary { "A and B" }
            @if shown(Difference::Tool) {
                div.pair { div { h3 { "A's tool" } (name(a)) } div { h3 { "B's tool" } (name(b)) } }
            }
            @if shown(Difference::Arguments) {
                div.pair { div { h3 { "A's arguments" } (format::json(&a.arguments_json)) }
                           div { h3 { "B's arguments" } (format::json(&b.arguments_json)) } }
            }
            @if shown(Difference::Result) {
                div.pair { div { h3 { "A's result" } (result(a)) } div { h3 { "B's result" } (result(b)) } }
            }
        }
    }
}

fn result(step: &pb::Step) -> Markup {
    html! {
        @if !step.error.is_empty() { pre.error { (step.error) } }
        @else { (format::json(&step.output_json)) }
    }
}

fn mark_class(mark: Mark) -> &'static str {
    match mark {
        Mark::Replayed => "replayed",
        Mark::Set => "set",
        Mark::Live => "live",
        Mark::Blocked => "blocked",
        Mark::OnlyInA => "only-a",
        Mark::OnlyInB => "only-b",
    }
}
