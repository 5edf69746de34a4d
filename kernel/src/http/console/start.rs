//! Starting a run of a hosted agent from the console: a form made from the agent's input schema
//! (as a question's answer form is; any input as JSON text besides), labels, and a confirmation
//! before the run is created, as the visitor's key, through `RunService.CreateRun`.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_server::RegistryService;
use kernel_proto::v1::run_service_server::RunService;
use maud::html;

use super::actions;
use super::form::{self, Sent};
use super::{Section, admit, answer_form, error_page, format, layout, refused, request};
use crate::auth::Caller;
use crate::grpc::{RegistryApi, RunApi};
use crate::http::Http;

/// The hosted agent `name` as the registry has it, or the page that says it has none.
async fn agent(http: &Http, caller: &Option<Caller>, name: &str) -> Result<pb::HostedAgentInfo, Response> {
    let agents = RegistryApi(http.kernel.clone())
        .list_agents(request(pb::ListAgentsRequest {}, caller))
        .await
        .map_err(refused)?
        .into_inner()
        .agents;
    agents.into_iter().find(|agent| agent.name == name).ok_or_else(|| {
        error_page(
            StatusCode::NOT_FOUND,
            &format!("no hosted agent '{name}' is registered"),
        )
    })
}

fn shape(agent: &pb::HostedAgentInfo) -> Option<answer_form::Shape> {
    let schema: serde_json::Value = serde_json::from_str(&agent.input_schema_json).unwrap_or_default();
    answer_form::of(&schema)
}

/// The visitor, if their key may start runs, and the hosted agent `name`; else the page that
/// says why not.
async fn admitted(
    http: &Http,
    headers: &HeaderMap,
    name: &str,
) -> Result<(Option<Caller>, pb::HostedAgentInfo), Response> {
    let caller = admit(http, headers, actions::CREATE_RUN, &start_path(name)).map_err(|response| *response)?;
    let agent = agent(http, &caller, name).await?;
    Ok((caller, agent))
}

/// The start page of agent `name`, where its form posts too.
fn start_path(name: &str) -> String {
    format!("/agents/{name}/start")
}

pub async fn form(State(http): State<Http>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let (caller, agent) = match admitted(&http, &headers, &name).await {
        Ok(admitted) => admitted,
        Err(response) => return response,
    };
    let fields = shape(&agent);
    let body = html! {
        h1 { "Start a run of " code { (agent.name) } }
        @if !agent.description.is_empty() { p.note { (agent.description) } }
        @if agent.workers.is_empty() { p.error { "No worker hosts it now: the run waits for one." } }
        h3 { "Its input's schema" }
        div.arguments { (format::json(&agent.input_schema_json)) }
        form.start method="post" action=(start_path(&agent.name)) {
            @if let Some(fields) = &fields {
                (answer_form::render(fields))
                details.json {
                    summary { "Or give the input as JSON" }
                    label { "Input (JSON) " textarea name="input_json" placeholder="{}" {} }
                }
            } @else {
                label { "Input (JSON) " textarea name="input_json" placeholder="{}" {} }
            }
            label { "Labels " input name="labels" placeholder="key=value, …"; }
            button type="submit" { "Start…" }
        }
    };
    layout("Start a run", Section::Registry, caller.is_some(), body).into_response()
}

pub async fn start(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(sent): Form<Vec<(String, String)>>,
) -> Response {
    let (caller, agent) = match admitted(&http, &headers, &name).await {
        Ok(admitted) => admitted,
        Err(response) => return response,
    };
    let sent = Sent::from(sent);
    let input = match (sent.get("input_json").trim(), shape(&agent)) {
        ("", Some(fields)) => match answer_form::answer(&fields, sent.fields()) {
            Ok(json) => json,
            Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
        },
        (text, _) => text.to_owned(),
    };
    let labels = match labels(sent.get("labels")) {
        Ok(labels) => labels,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
    };
    if !sent.confirmed() {
        let what = html! {
            p { "A new run of " code { (agent.name) } " starts, dispatched to a worker hosting it, with the input:" }
            div.arguments { (format::json(if input.is_empty() { "null" } else { &input })) }
        };
        let action = start_path(&name);
        return form::confirm("Start run", what, (&action, &action), (&sent, None), caller.is_some());
    }
    let message = pb::CreateRunRequest {
        agent: agent.name,
        input_json: input,
        labels,
        hosted: true,
        ..Default::default()
    };
    match RunApi(http.kernel.clone()).create_run(request(message, &caller)).await {
        Ok(response) => match response.into_inner().run {
            Some(run) => Redirect::to(&format!("/runs/{}", run.id)).into_response(),
            None => Redirect::to("/runs").into_response(),
        },
        Err(status) => refused(status),
    }
}

/// `key=value` pairs separated by commas or spaces.
fn labels(text: &str) -> Result<std::collections::HashMap<String, String>, String> {
    text.split([',', ' '])
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!("labels: '{pair}' is not key=value")),
        })
        .collect()
}
