//! The stylesheet and script, compiled into the binary: nothing to build or install beside it.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

pub const STYLESHEET: &str = "/assets/console.css";
pub const SCRIPT: &str = "/assets/console.js";

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

pub async fn serve(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (CSS, "text/css; charset=utf-8"),
        "console.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    };
    // Revalidated each time, so a kernel upgrade never serves a page with the last one's script.
    (
        [(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")],
        body,
    )
        .into_response()
}
