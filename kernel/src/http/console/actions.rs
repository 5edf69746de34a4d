//! What a person does to runs from the console: cancel a run, cancel one of its calls, fork it at
//! a step (that step's result replaced, or not), and delete a finished run. Each is the `kernel.v1` method a client would call, made as the visitor's key:
//! a page offers only what the key may do, and a post the key may not make is refused as the
//! service refuses it. Each asks first: a post without `confirmed` answers with what it will do
//! and the button that does it, so nothing happens on one click and no JavaScript is needed.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_server::AdminService;
use kernel_proto::v1::run_service_server::RunService;
use kernel_proto::v1::tool_call_service_server::ToolCallService;
use maud::{Markup, html};

use super::form::{Editable, Sent, confirm};
use super::{admit, error_page, format, refused, request};
use crate::auth::Caller;
use crate::grpc::{AdminApi, RunApi, ToolCallApi};
use crate::http::{Http, session};

const CANCEL_RUN: &str = "/kernel.v1.RunService/CancelRun";
const CANCEL_CALL: &str = "/kernel.v1.ToolCallService/CancelCall";
const FORK_RUN: &str = "/kernel.v1.RunService/ForkRun";
const DELETE_RUN: &str = "/kernel.v1.AdminService/DeleteRun";
pub const CREATE_RUN: &str = "/kernel.v1.RunService/CreateRun";

/// What the visitor's key may do to runs: the forms a page offers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Allowed {
    pub cancel: bool,
    pub fork: bool,
    pub delete: bool,
    pub start: bool,
}

impl Allowed {
    pub fn of(http: &Http, headers: &HeaderMap) -> Allowed {
        let may = |path: &str| session::authorize(http, headers, path).is_ok();
        Allowed {
            cancel: may(CANCEL_RUN) && may(CANCEL_CALL),
            fork: may(FORK_RUN),
            delete: may(DELETE_RUN),
            start: may(CREATE_RUN),
        }
    }
}

/// A run's own actions, for its page: cancel it while it runs, delete it once it ended.
pub fn run_actions(run: &pb::Run, allowed: Allowed) -> Markup {
    let ended = format::run_ended(run.status);
    html! {
        @if (allowed.cancel && !ended) || (allowed.delete && ended) || allowed.fork {
            section.actions {
                h2 { "Actions" }
                @if allowed.cancel && !ended {
                    form.action.cancel-run method="post" action={ "/runs/" (run.id) "/cancel" } {
                        label { "Reason " input name="reason" placeholder="optional"; }
                        button.danger type="submit" { "Cancel run…" }
                    }
                }
                @if allowed.fork {
                    form.action.fork-run method="post" action={ "/runs/" (run.id) "/fork" } {
                        button type="submit" { "Fork the whole run…" }
                    }
                }
                @if allowed.delete && ended {
                    form.action.delete-run method="post" action={ "/runs/" (run.id) "/delete" } {
                        button.danger type="submit" { "Delete run…" }
                    }
                }
            }
        }
    }
}

/// A step's actions, inside its details: cancel a call in flight; fork the run at a settled
/// call, its result replaced when one is given.
pub fn step_actions(run_id: &str, step: &pb::Step, allowed: Allowed) -> Markup {
    let settled = format::step_settled(step.status);
    let call = step.kind == pb::StepKind::Tool as i32 || step.kind == pb::StepKind::Unspecified as i32;
    html! {
        @if allowed.cancel && call && !settled {
            form.action.cancel-call method="post" action={ "/runs/" (run_id) "/cancel-call" } {
                input type="hidden" name="key" value=(step.step_key);
                label { "Reason " input name="reason" placeholder="optional"; }
                button.danger type="submit" { "Cancel this call…" }
            }
        }
        @if allowed.fork && settled {
            form.action.fork-here method="post" action={ "/runs/" (run_id) "/fork" } {
                // Its result is replaced on the confirmation page: a text area in each of a long
                // run's steps would cost the browser more than the rest of the page.
                input type="hidden" name="at" value=(step.step_key);
                button type="submit" { "Fork here…" }
            }
        }
    }
}

/// An action posted about run `id`: by a visitor whose key may call the action's method, with
/// what they sent; the run's page is where they came from.
struct Posted {
    caller: Option<Caller>,
    sent: Sent,
    id: String,
    back: String,
}

impl Posted {
    fn admit(
        http: &Http,
        headers: &HeaderMap,
        method: &str,
        id: String,
        sent: Vec<(String, String)>,
    ) -> Result<Posted, Box<Response>> {
        let back = format!("/runs/{id}");
        let caller = admit(http, headers, method, &back)?;
        Ok(Posted {
            caller,
            sent: Sent::from(sent),
            id,
            back,
        })
    }

    /// The page asking to confirm `title` (posting again to `/runs/<id>/<action>`), unless the
    /// post confirms it already.
    fn unconfirmed(&self, title: &str, action: &str, what: impl FnOnce() -> Markup) -> Option<Response> {
        self.unconfirmed_with(title, action, || (what(), None))
    }

    /// [`Posted::unconfirmed`], its page with a field still to fill in.
    fn unconfirmed_with<'a>(
        &self,
        title: &str,
        action: &str,
        what: impl FnOnce() -> (Markup, Editable<'a>),
    ) -> Option<Response> {
        (!self.sent.confirmed()).then(|| {
            let target = format!("/runs/{}/{action}", self.id);
            let (what, editable) = what();
            confirm(
                title,
                what,
                (&target, &self.back),
                (&self.sent, editable),
                self.caller.is_some(),
            )
        })
    }

    /// Where a done action goes: `to`, or the run's page.
    fn done(&self, to: Option<String>) -> Response {
        Redirect::to(to.as_deref().unwrap_or(&self.back)).into_response()
    }
}

pub async fn cancel_run(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(sent): Form<Vec<(String, String)>>,
) -> Response {
    let posted = match Posted::admit(&http, &headers, CANCEL_RUN, id, sent) {
        Ok(posted) => posted,
        Err(response) => return *response,
    };
    let id = &posted.id;
    if let Some(page) = posted.unconfirmed("Cancel run", "cancel", || {
        html! { p { "Run " code { (id) } " ends as cancelled, and its calls in flight are cancelled on their workers." } }
    }) {
        return page;
    }
    let message = pb::CancelRunRequest {
        run_id: id.clone(),
        reason: reason(&posted.sent, "cancelled from the console"),
    };
    match RunApi(http.kernel.clone())
        .cancel_run(request(message, &posted.caller))
        .await
    {
        Ok(_) => posted.done(None),
        Err(status) => refused(status),
    }
}

pub async fn cancel_call(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(sent): Form<Vec<(String, String)>>,
) -> Response {
    let posted = match Posted::admit(&http, &headers, CANCEL_CALL, id, sent) {
        Ok(posted) => posted,
        Err(response) => return *response,
    };
    let (id, key) = (&posted.id, posted.sent.get("key"));
    if key.is_empty() {
        return error_page(StatusCode::BAD_REQUEST, "key: missing; the call's step key");
    }
    if let Some(page) = posted.unconfirmed("Cancel call", "cancel-call", || {
        html! { p { "Call " code { (key) } " of run " code { (id) } " settles as cancelled (its worker is told); the run goes on." } }
    }) {
        return page;
    }
    let message = pb::CancelCallRequest {
        run_id: id.clone(),
        step_key: key.to_owned(),
        reason: reason(&posted.sent, "cancelled from the console"),
    };
    match ToolCallApi(http.kernel.clone())
        .cancel_call(request(message, &posted.caller))
        .await
    {
        Ok(_) => posted.done(None),
        Err(status) => refused(status),
    }
}

pub async fn fork(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(sent): Form<Vec<(String, String)>>,
) -> Response {
    let posted = match Posted::admit(&http, &headers, FORK_RUN, id, sent) {
        Ok(posted) => posted,
        Err(response) => return *response,
    };
    let id = &posted.id;
    let (at, result) = (posted.sent.get("at").trim(), posted.sent.get("result").trim());
    if !result.is_empty() && at.is_empty() {
        return error_page(
            StatusCode::BAD_REQUEST,
            "result: replaces the result of the step forked at; name it (at)",
        );
    }
    if let Some(page) = posted.unconfirmed_with("Fork run", "fork", || {
        let what = html! {
            p { "A new run, a branch of " code { (id) } ", replays its record "
                @if at.is_empty() { "whole" } @else { "up to and including " code { (at) } }
                "; only reads run live in it." }
        };
        let replaced = html! {
            label.result { "Replay " code { (at) } " with this result instead (JSON; leave it empty to keep the recorded one)"
                textarea name="result" rows="4" placeholder="the result the branch replays" { (result) } }
        };
        (what, (!at.is_empty()).then_some(("result", replaced)))
    }) {
        return page;
    }
    let message = pb::ForkRunRequest {
        run_id: id.clone(),
        at_step_key: at.to_owned(),
        set_results: if result.is_empty() {
            Default::default()
        } else {
            [(at.to_owned(), result.to_owned())].into()
        },
        ..Default::default()
    };
    match RunApi(http.kernel.clone())
        .fork_run(request(message, &posted.caller))
        .await
    {
        Ok(response) => posted.done(response.into_inner().run.map(|branch| format!("/runs/{}", branch.id))),
        Err(status) => refused(status),
    }
}

pub async fn delete(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(sent): Form<Vec<(String, String)>>,
) -> Response {
    let posted = match Posted::admit(&http, &headers, DELETE_RUN, id, sent) {
        Ok(posted) => posted,
        Err(response) => return *response,
    };
    let id = &posted.id;
    if let Some(page) = posted.unconfirmed("Delete run", "delete", || {
        html! { p { "Run " code { (id) } ", its steps, events and approvals are deleted for good." } }
    }) {
        return page;
    }
    let message = pb::DeleteRunRequest { run_id: id.clone() };
    match AdminApi(http.kernel.clone())
        .delete_run(request(message, &posted.caller))
        .await
    {
        Ok(_) => posted.done(Some("/runs".to_owned())),
        Err(status) => refused(status),
    }
}

fn reason(sent: &Sent, otherwise: &str) -> String {
    match sent.get("reason").trim() {
        "" => otherwise.to_owned(),
        given => given.to_owned(),
    }
}
