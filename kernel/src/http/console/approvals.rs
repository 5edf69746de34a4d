//! The approvals page: what waits for a person, with the arguments (as the run's capture level
//! allows), the rule that asked, its message, approvers and expiry; approve or reject with a
//! reason (a question with its answer, in a form made from its schema, leave to pass a budget
//! with the new limit), answered as the key's holder through `ApprovalService`. The list follows
//! what arrives and what others answer (the script fetches it again every two seconds, unless the
//! visitor is typing in it), and an answer given here is confirmed with who answered and why.

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_server::ApprovalService;
use kernel_proto::v1::run_service_server::RunService;
use maud::{Markup, html};

use super::form::Sent;
use super::{Section, admit, answer_form, error_page, format, layout, refused, request};
use crate::grpc::{ApprovalApi, RunApi};
use crate::http::{Http, session};

/// The approval just answered here, named by the redirect that follows the answer.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Answered {
    #[serde(default)]
    answered: String,
    #[serde(default)]
    run: String,
}

pub async fn list(
    State(http): State<Http>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Query(answered): Query<Answered>,
) -> Response {
    let caller = match admit(&http, &headers, session::READ, &uri.to_string()) {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let waiting = match waiting(&http, &caller).await {
        Ok(waiting) => waiting,
        Err(status) => return refused(status),
    };
    let confirmed = match answered.answered.is_empty() {
        true => None,
        false => just_answered(&http, &caller, &answered).await,
    };
    let body = html! {
        h1 { "Approvals" }
        @if let Some(approval) = &confirmed { (confirmation(approval)) }
        section #approvals-live data-src="/approvals/live" { (waiting) }
    };
    layout("Approvals", Section::Approvals, caller.is_some(), body).into_response()
}

/// The waiting list alone, for the script that keeps the page current.
pub async fn live_part(State(http): State<Http>, headers: HeaderMap) -> Response {
    let caller = match session::authorize(&http, &headers, session::READ) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.plain(),
    };
    match waiting(&http, &caller).await {
        Ok(waiting) => Html(waiting.into_string()).into_response(),
        Err(status) => crate::http::plain(&status),
    }
}

/// Every approval that waits for an answer, each with the form that answers it.
async fn waiting(http: &Http, caller: &Option<crate::auth::Caller>) -> Result<Markup, tonic::Status> {
    let message = pb::ListApprovalsRequest {
        status: pb::ApprovalStatus::Pending as i32,
        run_id: String::new(),
    };
    let approvals = ApprovalApi(http.kernel.clone())
        .list_approvals(request(message, caller))
        .await?
        .into_inner()
        .approvals;
    let ask_decider = !session::required(http);
    Ok(html! {
        @if approvals.is_empty() {
            p.empty { "Nothing waits for an answer." }
        }
        @for approval in &approvals { (card(approval, ask_decider, true)) }
    })
}

/// The approval answered here, as its run records it now; `None` when it cannot be read.
async fn just_answered(http: &Http, caller: &Option<crate::auth::Caller>, asked: &Answered) -> Option<pb::Approval> {
    let got = RunApi(http.kernel.clone())
        .get_run(request(
            pb::GetRunRequest {
                run_id: asked.run.clone(),
            },
            caller,
        ))
        .await
        .ok()?
        .into_inner();
    got.approvals.into_iter().find(|a| a.id == asked.answered)
}

/// How an approval was answered, as a person says it (a consumed approval was approved, and its
/// call has run).
fn answer_word(approval: &pb::Approval) -> String {
    match (pb::ApprovalStatus::try_from(approval.status), approval.question) {
        (Ok(pb::ApprovalStatus::Approved | pb::ApprovalStatus::Consumed), true) => "answered".to_owned(),
        (Ok(pb::ApprovalStatus::Approved | pb::ApprovalStatus::Consumed), false) => "approved".to_owned(),
        (Ok(pb::ApprovalStatus::Rejected), true) => "declined".to_owned(),
        _ => format::approval_status(approval.status),
    }
}

/// Who answered an approval, how and why.
fn confirmation(approval: &pb::Approval) -> Markup {
    html! {
        p.answered role="status" {
            "Answered: " strong { (approval.tool) } " in run " (format::run_link(&approval.run_id))
            " was " strong { (answer_word(approval)) }
            @if !approval.decider.is_empty() { " by " strong { (approval.decider) } }
            @if !approval.reason.is_empty() { " (" (approval.reason) ")" }
            "."
        }
    }
}

/// One waiting approval and the form that answers it. Without keys the form asks who answers (the
/// service needs a decider); with keys it is the key's name.
pub fn card(approval: &pb::Approval, ask_decider: bool, show_run: bool) -> Markup {
    // Leave for a call to pass its budget is answered with the limit's new bounds.
    let raise = !approval.question && !approval.answer_schema_json.is_empty();
    let schema: serde_json::Value = serde_json::from_str(&approval.answer_schema_json).unwrap_or_default();
    let form = approval.question.then(|| answer_form::of(&schema)).flatten();
    html! {
        article.approval data-approval=(approval.id) {
            header {
                strong { (approval.tool) }
                @if show_run { " in run " (format::run_link(&approval.run_id)) }
                " step " code { (approval.step_key) }
            }
            dl {
                @if !approval.message.is_empty() { dt { "Message" } dd.message { (approval.message) } }
                dt { "Asked by" } dd { (approval.decided_by) }
                @if !approval.approvers.is_empty() { dt { "Approvers" } dd { (approval.approvers.join(", ")) } }
                dt { "Requested" } dd { (format::time(&approval.requested_at)) }
                dt { "Expires" } dd { (format::time(&approval.expires_at)) }
            }
            @if approval.question {
                h3 { "The answer's schema" }
                div.arguments { (format::json(&approval.answer_schema_json)) }
            } @else {
                h3 { "Arguments" }
                div.arguments { (format::json(&approval.arguments_json)) }
            }
            @if raise {
                h3 { "The new limit's schema" }
                div.arguments { (format::json(&approval.answer_schema_json)) }
            }
            form.answer method="post" action={ "/approvals/" (approval.id) } {
                input type="hidden" name="back" value={ @if show_run { "/approvals" } @else { "/runs/" (approval.run_id) } };
                @if ask_decider {
                    label { "Your name " input name="decider" required placeholder="who answers"; }
                }
                @if let Some(form) = &form {
                    (answer_form::render(form))
                    details.json {
                        summary { "Or answer as JSON" }
                        label { "Answer (JSON) " textarea name="answer_json" placeholder="{}" {} }
                    }
                } @else if approval.question {
                    label { "Answer (JSON) " textarea name="answer_json" required placeholder="{}" {} }
                }
                @if raise {
                    label { "New limit (JSON) " textarea name="answer_json" placeholder="{\"max_cost\": 10.0}" {} }
                }
                label { "Reason " input name="reason" placeholder="optional"; }
                @if approval.question {
                    button.approve type="submit" name="decision" value="approve" { "Answer" }
                    button.reject type="submit" name="decision" value="reject" { "Decline" }
                } @else if raise {
                    button.approve type="submit" name="decision" value="approve" { "Raise and run" }
                    button.reject type="submit" name="decision" value="reject" { "Refuse" }
                } @else {
                    button.approve type="submit" name="decision" value="approve" { "Approve" }
                    button.reject type="submit" name="decision" value="reject" { "Reject" }
                }
            }
        }
    }
}

/// The answer form's fields (a question's own fields besides, read from the form as sent).
pub struct Answer {
    decision: String,
    reason: String,
    decider: String,
    back: String,
    /// A question's answer, or a budget's new limit, as JSON.
    answer_json: String,
}

pub async fn answer(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(sent): Form<Vec<(String, String)>>,
) -> Response {
    let caller = match admit(&http, &headers, session::ANSWER, "/approvals") {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let sent = Sent::from(sent);
    let mut answer = match Answer::read(&sent) {
        Ok(answer) => answer,
        Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
    };
    let api = ApprovalApi(http.kernel.clone());
    if answer.decision == "approve" && answer.answer_json.trim().is_empty() {
        match asked_with_form(&http, &id).await {
            Ok(Some(form)) => match answer_form::answer(&form, sent.fields()) {
                Ok(json) => answer.answer_json = json,
                Err(why) => return error_page(StatusCode::BAD_REQUEST, &why),
            },
            Ok(None) => {}
            Err(status) => return refused(status),
        }
    }
    let answered = match answer.decision.as_str() {
        "approve" => api
            .approve_call(request(
                pb::ApproveCallRequest {
                    approval_id: id.clone(),
                    decider: answer.decider,
                    reason: answer.reason,
                    answer_json: answer.answer_json.clone(),
                },
                &caller,
            ))
            .await
            .map(|_| ()),
        "reject" => api
            .reject_call(request(
                pb::RejectCallRequest {
                    approval_id: id.clone(),
                    decider: answer.decider,
                    reason: answer.reason,
                },
                &caller,
            ))
            .await
            .map(|_| ()),
        other => {
            return error_page(
                StatusCode::BAD_REQUEST,
                &format!("decision: '{other}' is neither approve nor reject"),
            );
        }
    };
    match answered {
        // Only a page of this console: never a redirect elsewhere.
        Ok(()) if answer.back.starts_with('/') && !answer.back.starts_with("//") && answer.back != "/approvals" => {
            Redirect::to(&answer.back).into_response()
        }
        Ok(()) => {
            let run = run_of(&http, &id).await.unwrap_or_default();
            Redirect::to(&format!(
                "/approvals?answered={}&run={}",
                session::urlencode(&id),
                session::urlencode(&run)
            ))
            .into_response()
        }
        Err(status) => refused(status),
    }
}

impl Answer {
    /// The answer's own fields among the form as sent.
    fn read(sent: &Sent) -> Result<Answer, String> {
        let given = |name: &str| sent.get(name).to_owned();
        let decision = given("decision");
        if decision.is_empty() {
            return Err("decision: missing; approve or reject".to_owned());
        }
        Ok(Answer {
            decision,
            reason: given("reason"),
            decider: given("decider"),
            back: given("back"),
            answer_json: given("answer_json"),
        })
    }
}

/// The run approval `id` belongs to.
async fn run_of(http: &Http, id: &str) -> Option<String> {
    let id = crate::model::ApprovalId::parse(id, "approval_id").ok()?;
    let approval = http.kernel.store.reads.approval(id).await.ok()??;
    Some(approval.run_id.to_string())
}

/// The form approval `id` asks its answer with, when it is a question whose schema a form holds.
async fn asked_with_form(http: &Http, id: &str) -> Result<Option<answer_form::Shape>, tonic::Status> {
    let id = crate::model::ApprovalId::parse(id, "approval_id")?;
    let Some(approval) = http.kernel.store.reads.approval(id).await? else {
        return Ok(None);
    };
    if !approval.is_question() {
        return Ok(None);
    }
    let (_, schema) = crate::machine::question::asked_in(&approval.arguments);
    Ok(answer_form::of(&schema))
}
