//! The web console: server-rendered pages over the `kernel.v1` services, a stylesheet and a
//! little JavaScript (live event tail, progress, local times), all embedded in the binary.

mod actions;
mod activity;
mod answer_form;
mod approvals;
mod assets;
mod compare;
mod form;
mod format;
mod limits;
mod login;
mod registry;
mod run;
mod run_steps;
mod runs;
mod start;
mod timeline;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};

use super::Http;
use super::session::{self, Refusal};
use crate::auth::Caller;

pub fn routes() -> Router<Http> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/login", get(login::form).post(login::enter))
        .route("/logout", post(login::leave))
        .route("/runs", get(runs::list))
        .route("/runs/{id}", get(run::page))
        .route("/runs/{id}/live", get(run::live_part))
        .route("/runs/{id}/stream", get(run::stream))
        .route("/runs/{id}/cancel", post(actions::cancel_run))
        .route("/runs/{id}/cancel-call", post(actions::cancel_call))
        .route("/runs/{id}/fork", post(actions::fork))
        .route("/runs/{id}/delete", post(actions::delete))
        .route("/compare", get(compare::page))
        .route("/approvals", get(approvals::list))
        .route("/approvals/live", get(approvals::live_part))
        .route("/approvals/{id}", post(approvals::answer))
        .route("/registry", get(registry::page))
        .route("/agents/{name}/start", get(start::form).post(start::start))
        .route("/limits", get(limits::page))
        .route("/assets/{file}", get(assets::serve))
}

/// Which section of the navigation a page belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Runs,
    Approvals,
    Registry,
    Limits,
    None,
}

/// A `kernel.v1` request as the console's visitor makes it: with their key's caller, so the
/// service sees who asks exactly as it would over gRPC.
fn request<T>(message: T, caller: &Option<Caller>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller.clone());
    }
    request
}

/// Lets a page's visitor through when their key may call `path`; otherwise the answer to give:
/// the key form for a visitor with no (or an unknown) key, a refusal page for one whose key lacks
/// the scope.
fn admit(http: &Http, headers: &HeaderMap, path: &str, back: &str) -> Result<Option<Caller>, Box<Response>> {
    session::authorize(http, headers, path).map_err(|refusal| {
        Box::new(match refusal.wants_key() {
            true => Refusal::to_login(back),
            false => {
                let (status, message) = refusal.status_and_message();
                error_page(status, &message)
            }
        })
    })
}

/// A page for a service's refusal.
fn refused(status: tonic::Status) -> Response {
    error_page(super::http_status(&status), status.message())
}

fn error_page(status: StatusCode, message: &str) -> Response {
    let body = html! {
        h1 { (status.canonical_reason().unwrap_or("error")) }
        p.error { (message) }
        p { a href="/runs" { "Back to runs" } }
    };
    (status, layout("Error", Section::None, false, body)).into_response()
}

/// The frame every page shares; `signed_in` (a key in the browser session) offers to log out.
fn layout(title: &str, section: Section, signed_in: bool, body: Markup) -> Html<String> {
    let nav = |target: Section, href: &str, label: &str| {
        let here = section == target;
        html! { a href=(href) class=[here.then_some("active")] aria-current=[here.then_some("page")] { (label) } }
    };
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · kernel" }
                    link rel="stylesheet" href=(assets::STYLESHEET);
                    script src=(assets::SCRIPT) defer {}
                }
                body {
                    // The first stop of the Tab key: past the navigation, straight to the page.
                    a.skip href="#main" { "Skip to content" }
                    header.top {
                        a.brand href="/runs" { "kernel" }
                        nav {
                            (nav(Section::Runs, "/runs", "Runs"))
                            (nav(Section::Approvals, "/approvals", "Approvals"))
                            (nav(Section::Registry, "/registry", "Tools & workers"))
                            (nav(Section::Limits, "/limits", "Limits"))
                        }
                        @if signed_in {
                            form.logout method="post" action="/logout" { button type="submit" { "Log out" } }
                        }
                    }
                    main #main tabindex="-1" { (body) }
                }
            }
        }
        .into_string(),
    )
}
