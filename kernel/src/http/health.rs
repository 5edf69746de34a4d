//! `/healthz` (the process serves) and `/readyz` (it can take work: the store answers), for load
//! balancers and orchestrators; unauthenticated, like gRPC health.

use axum::extract::State;
use axum::http::StatusCode;

use super::Http;

/// 200 while the kernel serves, 503 once it drains to stop (asked to, or a task it needs ended).
pub async fn healthz(State(http): State<Http>) -> (StatusCode, &'static str) {
    if http.kernel.draining.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    (StatusCode::OK, "ok\n")
}

/// 200 when the store answers a query; 503 with the reason when it does not or the kernel is
/// draining to stop.
pub async fn readyz(State(http): State<Http>) -> (StatusCode, String) {
    if http.kernel.draining.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".to_owned());
    }
    match http.kernel.store.reads.ping().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {error}\n")),
    }
}
