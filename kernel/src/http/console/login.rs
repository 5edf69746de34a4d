//! Entering an API key once for the browser session, and forgetting it.

use axum::extract::{Form, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::{Section, layout};
use crate::http::{Http, session};

/// Where to go once the key is in.
#[derive(Default, Deserialize)]
pub struct Next {
    #[serde(default)]
    next: String,
}

/// A path of this console to return to; anything else is the runs page.
fn back(next: &str) -> &str {
    if next.starts_with('/') && !next.starts_with("//") && !next.starts_with("/login") {
        next
    } else {
        "/runs"
    }
}

pub async fn form(State(http): State<Http>, Query(next): Query<Next>) -> Response {
    if !session::required(&http) {
        return Redirect::to(back(&next.next)).into_response();
    }
    page(StatusCode::OK, back(&next.next), None)
}

fn page(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let body = html! {
        h1 { "API key" }
        p { "This kernel requires an API key. It is kept for this browser session only." }
        @if let Some(error) = error { p.error { (error) } }
        form.login method="post" action="/login" {
            input type="hidden" name="next" value=(next);
            label { "Key " input type="password" name="key" autocomplete="off" autofocus required; }
            button type="submit" { "Enter" }
        }
    };
    (status, layout("API key", Section::None, false, body)).into_response()
}

/// The login form's fields.
#[derive(Deserialize)]
pub struct Entered {
    key: String,
    #[serde(default)]
    next: String,
}

pub async fn enter(State(http): State<Http>, Form(entered): Form<Entered>) -> Response {
    let next = back(&entered.next);
    if !session::required(&http) {
        return Redirect::to(next).into_response();
    }
    if session::check_key(&http, &entered.key).is_none() {
        return page(
            StatusCode::UNAUTHORIZED,
            next,
            Some("That key is not known to this kernel."),
        );
    }
    ([(header::SET_COOKIE, session::keep(&entered.key))], Redirect::to(next)).into_response()
}

pub async fn leave() -> Response {
    ([(header::SET_COOKIE, session::forget())], Redirect::to("/login")).into_response()
}
