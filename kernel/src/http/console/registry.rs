//! Tools, hosted agents and workers: what is registered, which worker offers or hosts what, each
//! tool's calls, failures and latency over the last minutes, each worker's slots in use over
//! them, and the workers that went away; a hosted agent's run is started from here.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_server::RegistryService;
use maud::html;

use super::activity::{self, Window};
use super::{Section, admit, format, layout, refused, request};
use crate::grpc::RegistryApi;
use crate::http::{Http, session};

pub async fn page(State(http): State<Http>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let caller = match admit(&http, &headers, session::READ, &uri.to_string()) {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let api = RegistryApi(http.kernel.clone());
    let tools = match api.list_tools(request(pb::ListToolsRequest {}, &caller)).await {
        Ok(response) => response.into_inner().tools,
        Err(status) => return refused(status),
    };
    let workers = match api.list_workers(request(pb::ListWorkersRequest {}, &caller)).await {
        Ok(response) => response.into_inner().workers,
        Err(status) => return refused(status),
    };
    let agents = match api.list_agents(request(pb::ListAgentsRequest {}, &caller)).await {
        Ok(response) => response.into_inner().agents,
        Err(status) => return refused(status),
    };
    let window = match crate::http::activity::now(&http.kernel).await {
        Ok(now) => Window::new(http.activity.samples(), now, http.kernel.started_at),
        Err(error) => return refused(error.into()),
    };
    let may_start = super::actions::Allowed::of(&http, &headers).start;
    let span = format::duration(window.span_ms());
    let body = html! {
        h1 { "Tools" }
        @if tools.is_empty() { p.empty { "No tool is registered: start a worker." } }
        @else {
            p.note { "Calls, failures (" (crate::http::activity::FAILED.join(", ")) ") and latency (recording to result, as the upper bound of the "
                "histogram bucket that holds it) over the last " (span) " on this kernel, from its metrics." }
            table.tools {
                thead { tr { th { "Tool" } th { "Version" } th { "Kind" } th { "Cost" } th { "Offered by" } th { "Last seen" }
                    th.num { "Calls/min" } th.num { "Calls" } th.num { "Failed" } th.num { "p50" } th.num { "p99" } } }
                tbody { @for tool in &tools {
                    @let spec = tool.spec.clone().unwrap_or_default();
                    @let options = spec.options.clone().unwrap_or_default();
                    @let figures = window.tool(&spec.name);
                    tr data-tool=(spec.name) {
                        td { strong { (spec.name) } @if !spec.description.is_empty() { br; span.note { (format::clip(&spec.description, 120)) } } }
                        td { (spec.version) }
                        td {
                            @if options.read_only { span.tag { "read_only" } " " }
                            @if options.writes { span.tag.writes { "writes" } " " }
                            @if options.requires_approval || !options.requires_approval_expr.is_empty() { span.tag { "approval" } }
                        }
                        td.num { (options.cost_per_call) }
                        td { @if tool.workers.is_empty() { span.none { "no worker" } } @else { (tool.workers.join(", ")) } }
                        td { (format::time(&tool.last_seen_at)) }
                        td.num.per-minute { (format!("{:.1}", figures.per_minute)) }
                        td.num.calls { (figures.calls) }
                        td.num.failed { (figures.failed)
                            @if figures.calls > 0 { " " span.note { "(" (format!("{:.1}", figures.failed as f64 * 100.0 / figures.calls as f64)) "%)" } } }
                        td.num.p50 { (activity::bound(figures.p50, figures.last_bound)) }
                        td.num.p99 { (activity::bound(figures.p99, figures.last_bound)) }
                    }
                } }
            }
        }
        h1 { "Hosted agents" }
        @if agents.is_empty() { p.empty { "No hosted agent is registered: start a worker that hosts one." } }
        @else {
            table.agents {
                thead { tr { th { "Agent" } th { "Version" } th { "Hosted by" } th {} } }
                tbody { @for agent in &agents {
                    tr data-agent=(agent.name) {
                        td { strong { (agent.name) } @if !agent.description.is_empty() { br; span.note { (format::clip(&agent.description, 120)) } } }
                        td { (agent.version) }
                        td { @if agent.workers.is_empty() { span.none { "no worker" } } @else { (agent.workers.join(", ")) } }
                        td { @if may_start { a.start href={ "/agents/" (agent.name) "/start" } { "Start a run…" } } }
                    }
                } }
            }
        }
        h1 { "Workers" }
        @let gone = window.gone();
        @if workers.is_empty() { p.empty { "No worker is connected." } }
        @if !workers.is_empty() || !gone.is_empty() {
            table.workers {
                thead { tr { th { "Worker" } th { "Slots in use" } th { "Over the last " (span) } th { "Tools" } th { "Agents" } th { "Connected" } th { "Heartbeat" } } }
                tbody {
                    @for worker in &workers {
                        tr data-worker=(worker.name) {
                            td { strong { (worker.name) } @if worker.draining { " " span.tag { "draining" } } br; span.note.mono { (worker.session_id) } }
                            td.num { (worker.slots_in_use) " / " (worker.max_concurrency) }
                            td { (activity::slots_chart(&window.slots(&worker.session_id))) }
                            td { (worker.tools.join(", ")) }
                            td { (worker.agents.join(", ")) }
                            td { (format::time(&worker.connected_at)) }
                            td { (format::time(&worker.last_heartbeat_at)) }
                        }
                    }
                    // Sessions the last minutes saw that are no longer connected.
                    @for gone in &gone {
                        tr.gone data-worker=(gone.worker.name) data-gone="true" {
                            td { strong { (gone.worker.name) } " " span.tag.gone { "gone" } br; span.note.mono { (gone.worker.session) } }
                            td.num { "— / " (gone.worker.slots) }
                            td { (activity::slots_chart(&window.slots(&gone.worker.session))) }
                            td colspan="3" { "disconnected; last seen " (format::at_millis(gone.last_seen)) }
                            td { "—" }
                        }
                    }
                }
            }
        }
    };
    layout("Tools, agents & workers", Section::Registry, caller.is_some(), body).into_response()
}
