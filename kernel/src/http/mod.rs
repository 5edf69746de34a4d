//! The kernel's HTTP listener (`--http-listen`): the web console, Prometheus `/metrics`, and
//! `/healthz` and `/readyz` for load balancers.
//!
//! The console reads and answers through the same `kernel.v1` service implementations gRPC
//! clients reach, called in process with the caller's key: validation, capture levels, approver
//! lists and scopes are theirs, so a page shows exactly what `kernelctl` would.

mod activity;
mod console;
mod health;
mod scrape;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::error::KernelError;
use crate::grpc::Kernel;

/// What every handler shares.
#[derive(Clone)]
pub struct Http {
    kernel: Kernel,
    /// The listener's own address: requests naming another host are refused (DNS rebinding).
    bound: SocketAddr,
    scrape: Arc<scrape::Cache>,
    /// Tools' calls and workers' slots over the last minutes, for the console.
    activity: Arc<activity::Activity>,
}

/// Binds `listen`, then returns what serves it until `shutdown`.
pub async fn serve(
    listen: SocketAddr,
    kernel: Kernel,
    shutdown: CancellationToken,
) -> Result<impl std::future::Future<Output = std::io::Result<()>> + Send + 'static, KernelError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| KernelError::Unavailable(format!("cannot listen on {listen} (--http-listen): {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| KernelError::Unavailable(e.to_string()))?;
    let activity = Arc::<activity::Activity>::default();
    tokio::spawn(activity::sample_every(
        activity.clone(),
        kernel.clone(),
        shutdown.clone(),
    ));
    let state = Http {
        kernel,
        bound,
        scrape: Arc::default(),
        activity,
    };
    let app = router(state);
    info!(addr = %bound, "http listening");
    Ok(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    })
}

fn router(state: Http) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(scrape::metrics))
        .merge(console::routes())
        .layer(middleware::from_fn_with_state(state.clone(), same_host))
        .with_state(state)
}

/// Refuses a request whose `Host` is not this listener's when it listens on loopback: a page
/// elsewhere that rebinds its own name to 127.0.0.1 must not read the console through the
/// visitor's browser. And refuses a cross-site form post, so another page cannot answer an
/// approval in the name of whoever has the console open.
async fn same_host(State(http): State<Http>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if http.bound.ip().is_loopback() && !loopback_host(headers, http.bound.port()) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this listener answers only to its loopback address\n",
        )
            .into_response();
    }
    if request.method() == axum::http::Method::POST && !same_origin(headers) {
        return (StatusCode::FORBIDDEN, "a form of another site cannot post here\n").into_response();
    }
    next.run(request).await
}

fn loopback_host(headers: &HeaderMap, port: u16) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        // HTTP/1.0 without Host: not a browser that could have been rebound.
        return true;
    };
    let name = match host.rsplit_once(':') {
        Some((name, p)) if p.parse::<u16>() == Ok(port) => name,
        Some(_) => return false,
        None => host,
    };
    matches!(name, "localhost" | "127.0.0.1" | "[::1]")
        || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// A browser names the page a post comes from (`Origin`, or at least `Sec-Fetch-Site`); a
/// client that names neither is not a browser acting for someone else.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match (text("origin"), text("host")) {
        (Some(origin), Some(host)) => origin.split_once("://").is_some_and(|(_, rest)| rest == host),
        (Some(_), None) => false,
        (None, _) => text("sec-fetch-site").is_none_or(|site| site == "same-origin" || site == "none"),
    }
}

/// A service's refusal as plain text, for the endpoints that are not pages.
fn plain(status: &tonic::Status) -> Response {
    (http_status(status), format!("{}\n", status.message())).into_response()
}

/// The HTTP answer to a `kernel.v1` status, for the console's pages and endpoints.
fn http_status(status: &tonic::Status) -> StatusCode {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn only_loopback_names_with_the_listeners_port_are_answered() {
        assert!(loopback_host(&headers(&[("host", "127.0.0.1:8080")]), 8080));
        assert!(loopback_host(&headers(&[("host", "localhost:8080")]), 8080));
        assert!(loopback_host(&headers(&[("host", "[::1]:8080")]), 8080));
        assert!(!loopback_host(&headers(&[("host", "127.0.0.1:9090")]), 8080));
        assert!(!loopback_host(&headers(&[("host", "evil.example:8080")]), 8080));
        assert!(!loopback_host(&headers(&[("host", "evil.example")]), 8080));
    }

    #[test]
    fn a_post_from_another_site_is_refused() {
        assert!(same_origin(&headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "https://evil.example"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        // curl and other clients that are not browsers.
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])));
    }
}
