//! Tool limits and fair shares: each limit with its rate, bound, the calls running under it on
//! every replica, its tokens and the calls waiting for it here; each share with its weight and
//! waiting calls. What `kernelctl limits` and `kernelctl shares` print, from `AdminService`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_server::AdminService;
use maud::html;

use super::{Section, admit, layout, refused, request};
use crate::grpc::AdminApi;
use crate::http::{Http, session};

pub async fn page(State(http): State<Http>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    let caller = match admit(&http, &headers, session::ADMIN, &uri.to_string()) {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let status = match AdminApi(http.kernel.clone())
        .get_status(request(pb::GetStatusRequest {}, &caller))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return refused(status),
    };
    let or_none = |value: Option<String>| value.unwrap_or_else(|| "–".to_owned());
    let body = html! {
        h1 { "Tool limits" }
        @if status.tool_limits.is_empty() {
            p.empty { "No tool limit: the policy file sets none (limits) and no tool declares one." }
        } @else {
            table.limits {
                thead { tr { th { "Tools" } th { "Rate" } th { "Burst" } th { "At once" } th { "Running" } th { "Tokens" } th { "Waiting" } } }
                tbody { @for limit in &status.tool_limits {
                    tr data-limit=(limit.tools) {
                        td { code { (limit.tools) } }
                        td.num { (or_none(limit.per_second.map(|rate| format!("{rate}/s")))) }
                        td.num { (or_none(limit.burst.map(|burst| format!("{burst:.0}")))) }
                        td.num { (or_none(limit.at_once.map(|n| n.to_string()))) }
                        td.num { (limit.running) }
                        td.num { (or_none(limit.tokens.map(|tokens| format!("{tokens:.1}")))) }
                        td.num { (limit.queued) }
                    }
                } }
            }
            p.note { "Running counts every replica's calls; waiting, this kernel's queue." }
        }
        h1 { "Fair shares" }
        @match &status.fair_shares {
            None => p.empty { "No fair shares: queued calls start in the order they came." },
            Some(shares) => {
                p { "Queued calls are served by the value of each run's label " code { (shares.label) } ", each by its weight." }
                table.shares {
                    thead { tr { th { "Share" } th { "Weight" } th { "Waiting" } } }
                    tbody { @for share in &shares.shares {
                        tr data-share=(share.value.clone().unwrap_or_default()) {
                            td { @match &share.value { Some(value) => code { (value) }, None => span.none { "(no " (shares.label) ")" } } }
                            td.num { (share.weight) }
                            td.num { (share.queued) }
                        }
                    } }
                }
            }
        }
    };
    layout("Limits", Section::Limits, caller.is_some(), body).into_response()
}
