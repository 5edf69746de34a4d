//! The runs page: newest first, filtered by status, agent, labels, parent, a tool the run called
//! and when it was created, a page at a time; a run's id goes straight to its page.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_server::RunService;
use maud::html;
use prost_types::Timestamp;
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
    /// Only the branches forked from this run.
    #[serde(default)]
    branch_of: String,
    /// A run's id: its page.
    #[serde(default)]
    q: String,
    /// Only runs that made a call of this tool.
    #[serde(default)]
    tool: String,
    /// Only runs created within this long before now (`15m`, `24h`, `7d`).
    #[serde(default)]
    since: String,
    /// Only runs created at or after, and before, these times (UTC, as a `datetime-local` input
    /// sends them: `2026-12-07T05:00`).
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    /// The page token: runs older than this one.
    #[serde(default)]
    before: String,
}

impl Filter {
    /// The creation times asked for: `since` back from `now`, or `from` on; `to` as the end.
    fn window(&self, now: crate::model::Millis) -> Result<(Option<Timestamp>, Option<Timestamp>), String> {
        let since = match self.since.trim() {
            "" => None,
            text => {
                let ms = kernel_proto::duration::parse_millis(text).map_err(|why| format!("since: {why}"))?;
                Some(crate::grpc::convert::timestamp(now.saturating_sub(ms as i64)))
            }
        };
        let from = utc("from", &self.from)?;
        let to = utc("to", &self.to)?;
        Ok((since.or(from), to))
    }

    fn query(&self, before: &str) -> String {
        let pairs = [
            ("status", self.status.as_str()),
            ("agent", self.agent.as_str()),
            ("labels", self.labels.as_str()),
            ("parent", self.parent.as_str()),
            ("branch_of", self.branch_of.as_str()),
            ("tool", self.tool.as_str()),
            ("since", self.since.as_str()),
            ("from", self.from.as_str()),
            ("to", self.to.as_str()),
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

/// A `datetime-local` input's value (`2026-12-07T05:00`, seconds optional) read as UTC.
fn utc(field: &str, text: &str) -> Result<Option<Timestamp>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let full = if text.len() == 16 {
        format!("{text}:00Z")
    } else {
        format!("{text}Z")
    };
    full.parse::<Timestamp>()
        .map(Some)
        .map_err(|_| format!("{field}: '{text}' is not a date and time like 2026-12-07T05:00 (UTC)"))
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
    if !filter.q.trim().is_empty() {
        return match crate::model::RunId::parse(filter.q.trim(), "q") {
            Ok(id) => axum::response::Redirect::to(&format!("/runs/{id}")).into_response(),
            Err(error) => super::error_page(axum::http::StatusCode::BAD_REQUEST, &error.to_string()),
        };
    }
    let (created_after, created_before) = match filter.window(crate::clock::Clock::wall().now_millis()) {
        Ok(window) => window,
        Err(why) => return super::error_page(axum::http::StatusCode::BAD_REQUEST, &why),
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
        forked_from_run_id: filter.branch_of.trim().to_owned(),
        tool: filter.tool.trim().to_owned(),
        created_after,
        created_before,
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
            label { "Branch of " input name="branch_of" value=(filter.branch_of) placeholder="run id"; }
            label { "Tool " input name="tool" value=(filter.tool) placeholder="any call"; }
            label { "Created within "
                select name="since" {
                    option value="" { "any time" }
                    @for (value, text) in [("15m", "15 minutes"), ("1h", "an hour"), ("24h", "a day"), ("7d", "a week"), ("30d", "30 days")] {
                        option value=(value) selected[filter.since == value] { (text) }
                    }
                }
            }
            label { "From (UTC) " input type="datetime-local" name="from" value=(filter.from); }
            label { "To (UTC) " input type="datetime-local" name="to" value=(filter.to); }
            button type="submit" { "Filter" }
        }
        form.find method="get" action="/runs" {
            label { "Run id " input name="q" placeholder="01a2…" size="38"; }
            button type="submit" { "Open" }
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
