//! Streamable HTTP in front of the MCP service: each request's key checked with the kernel (401
//! with a `WWW-Authenticate` challenge for one it does not know), and sessions for the
//! 2025-11-25 clients that open them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use worker_sdk::{AgentClient, AgentError};

use super::{Bridge, KernelTools};

/// Serves Streamable HTTP on `listener` at `/mcp` until `shutdown`.
pub async fn serve_http(
    bridge: Bridge,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let bridge = Arc::new(bridge);
    let connection: Arc<OnceCell<AgentClient>> = Arc::default();
    let mut sessions = LocalSessionManager::default();
    if let Some(idle) = bridge.session_idle {
        sessions.session_config.keep_alive = Some(idle);
    }
    let gate = Gate {
        bridge: Arc::clone(&bridge),
        client: Arc::clone(&connection),
        known: Arc::default(),
    };
    let stopping = shutdown.clone();
    let service = StreamableHttpService::new(
        move || {
            Ok(KernelTools::new(
                Arc::clone(&bridge),
                Arc::clone(&connection),
                stopping.clone(),
            ))
        },
        Arc::new(sessions),
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token()),
    );
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate, guard));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|e| e.to_string())
}

/// How long the kernel's word that it knows a key is trusted before it is asked again.
const KNOWN_FOR: Duration = Duration::from_secs(30);

/// What checks HTTP requests' keys with the kernel, remembering the keys it knows for a while.
#[derive(Clone)]
struct Gate {
    bridge: Arc<Bridge>,
    client: Arc<OnceCell<AgentClient>>,
    known: Arc<Mutex<HashMap<Option<String>, Instant>>>,
}

impl Gate {
    /// Why the kernel refuses `key` (with `bearer` whether the client sent it), or `None` when it
    /// takes it. A kernel that cannot be reached refuses nothing here: the calls fail and say so.
    async fn refusal(&self, key: Option<String>) -> Option<String> {
        if let Some(at) = self.known.lock().expect("key memory poisoned").get(&key)
            && at.elapsed() < KNOWN_FOR
        {
            return None;
        }
        let bridge = &self.bridge;
        let client = self.client.get_or_try_init(|| bridge.connect()).await.ok()?.clone();
        let client = match &key {
            Some(secret) => match client.api_key(secret) {
                Ok(client) => client,
                Err(error) => return Some(error.to_string()),
            },
            None => client,
        };
        match client.registered_tools().await {
            Err(AgentError::Status(status)) if status.code() == tonic::Code::Unauthenticated => {
                Some(status.message().to_owned())
            }
            // A key without `runs:read` is still a key the kernel knows: what it may do is the
            // kernel's to say, call by call.
            Ok(_) | Err(AgentError::Status(_)) => {
                let mut known = self.known.lock().expect("key memory poisoned");
                known.retain(|_, at| at.elapsed() < KNOWN_FOR);
                known.insert(key, Instant::now());
                None
            }
            Err(_) => None,
        }
    }
}

/// In front of the MCP service: a request whose key the kernel does not know gets 401 with a
/// `WWW-Authenticate` challenge (as the MCP authorization spec asks) before any MCP processing,
/// and a session's DELETE is answered 200 rather than rmcp's 202, which the official Python
/// client reports as a failed termination.
async fn guard(
    axum::extract::State(gate): axum::extract::State<Gate>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if gate.bridge.authenticate {
        let bearer = bearer_of(request.headers());
        let sent = bearer.is_some();
        if let Some(why) = gate.refusal(bearer.or_else(|| gate.bridge.api_key.clone())).await {
            tracing::debug!(reason = %why, "mcp request refused");
            return unauthorized(sent, &why);
        }
    }
    let delete = request.method() == http::Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == http::StatusCode::ACCEPTED {
        *response.status_mut() = http::StatusCode::OK;
    }
    response
}

/// HTTP 401 with its Bearer challenge: `invalid_token` when a key was sent and refused.
fn unauthorized(sent: bool, why: &str) -> axum::response::Response {
    let description = why.replace(['"', '\\'], "'");
    let challenge = if sent {
        format!(r#"Bearer realm="kernel", error="invalid_token", error_description="{description}""#)
    } else {
        r#"Bearer realm="kernel""#.to_owned()
    };
    let mut response = axum::response::Response::new(axum::body::Body::from(format!(
        "unauthorized: {why}; send a kernel API key as `Authorization: Bearer <key>`\n"
    )));
    *response.status_mut() = http::StatusCode::UNAUTHORIZED;
    if let Ok(value) = http::HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(http::header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The bearer token among `headers`, if there is one.
pub(super) fn bearer_of(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    value
        .strip_prefix("Bearer ")
        .map(|key| key.trim().to_owned())
        .filter(|key| !key.is_empty())
}
