//! Tools, hosted agents and workers: what is registered, which worker offers or hosts what, and
//! the slots in use; a hosted agent's run is started from here.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_server::RegistryService;
use maud::html;

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
    let may_start = super::actions::Allowed::of(&http, &headers).start;
    let body = html! {
        h1 { "Tools" }
        @if tools.is_empty() { p.empty { "No tool is registered: start a worker." } }
        @else {
            table.tools {
                thead { tr { th { "Tool" } th { "Version" } th { "Kind" } th { "Cost" } th { "Offered by" } th { "Last seen" } } }
                tbody { @for tool in &tools {
                    @let spec = tool.spec.clone().unwrap_or_default();
                    @let options = spec.options.clone().unwrap_or_default();
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
        @if workers.is_empty() { p.empty { "No worker is connected." } }
        @else {
            table.workers {
                thead { tr { th { "Worker" } th { "Slots in use" } th { "Tools" } th { "Agents" } th { "Connected" } th { "Heartbeat" } } }
                tbody { @for worker in &workers {
                    tr data-worker=(worker.name) {
                        td { strong { (worker.name) } @if worker.draining { " " span.tag { "draining" } } br; span.note.mono { (worker.session_id) } }
                        td.num { (worker.slots_in_use) " / " (worker.max_concurrency) }
                        td { (worker.tools.join(", ")) }
                        td { (worker.agents.join(", ")) }
                        td { (format::time(&worker.connected_at)) }
                        td { (format::time(&worker.last_heartbeat_at)) }
                    }
                } }
            }
        }
    };
    layout("Tools, agents & workers", Section::Registry, caller.is_some(), body).into_response()
}
