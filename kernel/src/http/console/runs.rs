//! The runs page: newest first, filtered by status, agent, labels and parent, a page at a time.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_server::RunService;
use maud::html;
use serde::Deserialize;

use super::{Section, admit, format, layout, refused, request};
use crate::grpc::RunApi;
use crate::http::{Http, session};

const PAGE: u32 = 50;

/// The filter form's fields, as the query string carries them.
#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    #[serde(default)]
    status: String,
    #[serde(default)]
    agent: String,
    /// `key=value` pairs, separated by commas or spaces; a run must carry every one.
    #[serde(default)]
    labels: String,
    #[serde(default)]
    parent: String,
    /// The page token: runs older than this one.
    #[serde(default)]
    before: String,
}

impl Filter {
    fn query(&self, before: &str) -> String {
        let pairs = [
            ("status", self.status.as_str()),
            ("agent", self.agent.as_str()),
            ("labels", self.labels.as_str()),
            ("parent", self.parent.as_str()),
            ("before", before),
        ];
        let query: Vec<String> = pairs
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| format!("{name}={}", session::urlencode(value)))
            .collect();
        format!("/runs?{}", query.join("&"))
    }
}

pub async fn list(
    State(http): State<Http>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Query(filter): Query<Filter>,
) -> Response {
    let caller = match admit(&http, &headers, session::READ, &uri.to_string()) {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let status = match filter.status.as_str() {
        "" => pb::RunStatus::Unspecified,
        text => match format::parse_run_status(text) {
            Some(status) => status,
            None => {
                return super::error_page(
                    axum::http::StatusCode::BAD_REQUEST,
                    &format!("status: unknown '{text}'"),
                );
            }
        },
    };
    let message = pb::ListRunsRequest {
        status: status as i32,
        agent: filter.agent.trim().to_owned(),
        labels: filter
            .labels
            .split([',', ' '])
            .map(str::trim)
            .filter(|pair| !pair.is_empty())
            .map(str::to_owned)
            .collect(),
        page_size: PAGE,
        page_token: filter.before.trim().to_owned(),
        parent_run_id: filter.parent.trim().to_owned(),
    };
    let listed = match RunApi(http.kernel.clone()).list_runs(request(message, &caller)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return refused(status),
    };
    layout("Runs", Section::Runs, caller.is_some(), body(&filter, &listed)).into_response()
}

fn body(filter: &Filter, listed: &pb::ListRunsResponse) -> maud::Markup {
    let statuses = [
        "pending",
        "running",
        "blocked",
        "suspended",
        "completed",
        "failed",
        "cancelled",
    ];
    html! {
        h1 { "Runs" }
        form.filters method="get" action="/runs" {
            label { "Status "
                select name="status" {
                    option value="" { "any" }
                    @for status in statuses {
                        option value=(status) selected[filter.status == status] { (status) }
                    }
                }
            }
            label { "Agent " input name="agent" value=(filter.agent) placeholder="any"; }
            label { "Labels " input name="labels" value=(filter.labels) placeholder="key=value, …"; }
            label { "Parent " input name="parent" value=(filter.parent) placeholder="run id"; }
            button type="submit" { "Filter" }
        }
        @if listed.runs.is_empty() {
            p.empty { "No runs match." }
        } @else {
            table.runs {
                thead { tr { th { "Run" } th { "Agent" } th { "Status" } th { "Calls" } th { "Labels" } th { "Parent" } th { "Created" } th { "Updated" } } }
                tbody {
                    @for run in &listed.runs {
                        tr data-run=(run.id) {
                            td { (format::run_link(&run.id)) }
                            td { (run.agent) }
                            td { span class={ "status " (format::run_status(run.status)) } { (format::run_status(run.status)) }
                                 @if !run.reason.is_empty() { " " span.reason { (format::clip(&run.reason, 60)) } } }
                            td.num { (run.tool_calls) }
                            td { @for (key, value) in &run.labels { span.label { (key) "=" (value) } " " } }
                            td { @if !run.parent_run_id.is_empty() { (format::run_link(&run.parent_run_id)) } }
                            td { (format::time(&run.created_at)) }
                            td { (format::time(&run.updated_at)) }
                        }
                    }
                }
            }
        }
        nav.pages {
            @if !filter.before.is_empty() { a href=(filter.query("")) { "← Newest" } }
            @if !listed.next_page_token.is_empty() { a href=(filter.query(&listed.next_page_token)) { "Older →" } }
        }
    }
}
