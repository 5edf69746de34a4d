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
    let mut app = axum::Router::new().nest_service("/mcp", service);
    if let Some(resource) = &gate.bridge.resource {
        let path = resource
            .metadata_path()
            .ok_or_else(|| format!("the resource {} is no http(s) URL without a query", resource.resource))?;
        let body = metadata(resource).to_string();
        app = app.route(
            &path,
            axum::routing::get(move || {
                let body = body.clone();
                std::future::ready(([(http::header::CONTENT_TYPE, "application/json")], body))
            }),
        );
    }
    let app = app.layer(axum::middleware::from_fn_with_state(gate, guard));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|e| e.to_string())
}

/// The bridge's OAuth protected-resource metadata (RFC 9728): the resource, the servers that issue
/// its tokens, the scopes a client asks for, and that a token travels in the header.
fn metadata(resource: &super::ProtectedResource) -> serde_json::Value {
    serde_json::json!({
        "resource": resource.resource,
        "authorization_servers": resource.authorization_servers,
        "scopes_supported": ["runs:read", "runs:write", "tools:call", "approvals:write"],
        "bearer_methods_supported": ["header"],
        "resource_name": "kernel (MCP)",
    })
}

/// How long the kernel's word that it knows a key is trusted before it is asked again.
const KNOWN_FOR: Duration = Duration::from_secs(30);

/// What checks HTTP requests' keys with the kernel, remembering what it said of each for a while.
#[derive(Clone)]
struct Gate {
    bridge: Arc<Bridge>,
    client: Arc<OnceCell<AgentClient>>,
    known: Arc<Mutex<Known>>,
}

/// What the kernel said of each key lately (`None`: no key), and when.
type Known = HashMap<Option<String>, (Instant, Access)>;

/// What the kernel said of a request's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// A key it knows that may read runs and tools (`runs:read`).
    Reads,
    /// A key it knows without `runs:read`: it may not list the tools.
    NoReads,
}

/// The scopes an MCP client's key needs to list and call tools; `approvals:write` too to answer
/// an approval. A challenge names them (RFC 6750's `scope`).
const CLIENT_SCOPES: &str = "runs:read runs:write tools:call";

impl Gate {
    /// What the kernel says of `key`: why it refuses it, or what it may do. A kernel that cannot
    /// be reached refuses nothing here: the calls fail and say so.
    async fn check(&self, key: Option<String>) -> Result<Access, String> {
        if let Some((at, access)) = self.known.lock().expect("key memory poisoned").get(&key)
            && at.elapsed() < KNOWN_FOR
        {
            return Ok(*access);
        }
        let bridge = &self.bridge;
        let Ok(client) = self.client.get_or_try_init(|| bridge.connect()).await else {
            return Ok(Access::Reads);
        };
        let client = match &key {
            Some(secret) => client.clone().api_key(secret).map_err(|error| error.to_string())?,
            None => client.clone(),
        };
        let access = match client.registered_tools().await {
            Err(AgentError::Status(status)) if status.code() == tonic::Code::Unauthenticated => {
                return Err(status.message().to_owned());
            }
            Err(AgentError::Status(status)) if status.code() == tonic::Code::PermissionDenied => Access::NoReads,
            // Another answer says nothing of the key: what it may do is the kernel's to say, call
            // by call.
            _ => Access::Reads,
        };
        let mut known = self.known.lock().expect("key memory poisoned");
        known.retain(|_, (at, _)| at.elapsed() < KNOWN_FOR);
        known.insert(key, (Instant::now(), access));
        Ok(access)
    }
}

/// In front of the MCP service: a request whose key the kernel does not know gets 401 with a
/// `WWW-Authenticate` challenge (as the MCP authorization spec asks) before any MCP processing, a
/// `tools/list` with a key that may not read the tools gets 403 `insufficient_scope`, and a
/// session's DELETE is answered 200 rather than rmcp's 202, which the official Python client
/// reports as a failed termination.
async fn guard(
    axum::extract::State(gate): axum::extract::State<Gate>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let mut request = request;
    // Only the MCP endpoint is the kernel's to guard; any other path is simply not there (404).
    let endpoint = request.uri().path().starts_with("/mcp");
    if gate.bridge.authenticate && endpoint {
        let metadata_url = gate
            .bridge
            .resource
            .as_ref()
            .and_then(super::ProtectedResource::metadata_url);
        let bearer = bearer_of(request.headers());
        let sent = bearer.is_some();
        match gate.check(bearer.or_else(|| gate.bridge.api_key.clone())).await {
            Err(why) => {
                tracing::debug!(reason = %why, "mcp request refused");
                return unauthorized(sent, &why, metadata_url.as_deref());
            }
            Ok(Access::NoReads) => {
                let (method, read) = method_of(request).await;
                if method.as_deref() == Some("tools/list") {
                    return insufficient_scope(
                        "runs:read",
                        "this key may not list the tools (it lacks runs:read)",
                        metadata_url.as_deref(),
                    );
                }
                request = read;
            }
            Ok(Access::Reads) => {}
        }
    }
    let delete = request.method() == http::Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == http::StatusCode::ACCEPTED {
        *response.status_mut() = http::StatusCode::OK;
    }
    response
}

/// The largest request body read to find its JSON-RPC method.
const MAX_PEEKED_BODY: usize = 4 << 20;

/// A request's JSON-RPC method (the 2026-07-28 `Mcp-Method` header, else its body's `method`),
/// and the request to pass on, its body intact.
async fn method_of(request: axum::extract::Request) -> (Option<String>, axum::extract::Request) {
    if let Some(method) = request.headers().get("mcp-method").and_then(|v| v.to_str().ok()) {
        return (Some(method.to_owned()), request);
    }
    if request.method() != http::Method::POST {
        return (None, request);
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_PEEKED_BODY).await.unwrap_or_default();
    let method = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|message| message.get("method")?.as_str().map(str::to_owned));
    (
        method,
        axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes)),
    )
}

/// The challenge's `resource_metadata` parameter, when the bridge publishes its metadata.
fn metadata_param(url: Option<&str>) -> String {
    url.map(|url| format!(r#", resource_metadata="{url}""#))
        .unwrap_or_default()
}

/// HTTP 403 with its Bearer challenge for a key that lacks `scope`.
fn insufficient_scope(scope: &str, why: &str, metadata_url: Option<&str>) -> axum::response::Response {
    let challenge = format!(
        r#"Bearer realm="kernel"{}, error="insufficient_scope", scope="{scope}", error_description="{why}""#,
        metadata_param(metadata_url)
    );
    let mut response = axum::response::Response::new(axum::body::Body::from(format!("forbidden: {why}\n")));
    *response.status_mut() = http::StatusCode::FORBIDDEN;
    if let Ok(value) = http::HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(http::header::WWW_AUTHENTICATE, value);
    }
    response
}

/// HTTP 401 with its Bearer challenge: `invalid_token` when a key was sent and refused, and where
/// the bridge's protected-resource metadata is, when it publishes it.
fn unauthorized(sent: bool, why: &str, metadata_url: Option<&str>) -> axum::response::Response {
    let description = why.replace(['"', '\\'], "'");
    let metadata = metadata_param(metadata_url);
    let challenge = if sent {
        format!(
            r#"Bearer realm="kernel"{metadata}, scope="{CLIENT_SCOPES}", error="invalid_token", error_description="{description}""#
        )
    } else {
        format!(r#"Bearer realm="kernel"{metadata}, scope="{CLIENT_SCOPES}""#)
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

#[cfg(test)]
mod tests {
    use super::super::ProtectedResource;
    use super::*;

    fn resource(url: &str) -> ProtectedResource {
        ProtectedResource {
            resource: url.to_owned(),
            authorization_servers: vec!["https://idp.test".into()],
        }
    }

    #[test]
    fn the_metadata_is_published_under_the_resource_s_path_and_named_in_challenges() {
        let mcp = resource("https://kernel.test:8443/mcp");
        assert_eq!(
            mcp.metadata_path().as_deref(),
            Some("/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            mcp.metadata_url().as_deref(),
            Some("https://kernel.test:8443/.well-known/oauth-protected-resource/mcp")
        );
        let root = resource("http://kernel.test/");
        assert_eq!(
            root.metadata_path().as_deref(),
            Some("/.well-known/oauth-protected-resource")
        );
        for bad in ["kernel.test/mcp", "https://kernel.test/mcp?x=1", "https://"] {
            assert_eq!(resource(bad).metadata_path(), None, "{bad}");
        }
        let document = metadata(&mcp);
        assert_eq!(document["resource"], "https://kernel.test:8443/mcp");
        assert_eq!(
            document["authorization_servers"],
            serde_json::json!(["https://idp.test"])
        );
        let refused = unauthorized(false, "no key", mcp.metadata_url().as_deref());
        let challenge = refused.headers()[http::header::WWW_AUTHENTICATE].to_str().unwrap();
        assert!(
            challenge.starts_with(
                r#"Bearer realm="kernel", resource_metadata="https://kernel.test:8443/.well-known/oauth-protected-resource/mcp""#
            ),
            "{challenge}"
        );
    }
}
