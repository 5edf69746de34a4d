//! One MCP server's connection: the client session (rmcp), the routes that take its progress
//! notifications to the calls they belong to, and what it says of list changes and its end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability,
    FormElicitationCapability, Implementation, JsonObject, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    TASKS_EXTENSION_ID, UrlElicitationCapability,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, Peer, RequestContext, RoleClient, RunningService,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio::sync::watch;

use crate::worker::context::{Progress, ToolContext};

/// Why an MCP server could not be reached or answered.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The server process could not be started.
    #[error("MCP server '{server}': cannot start it: {source}")]
    Spawn {
        /// The server's name.
        server: String,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The connection or its initialization failed.
    #[error("MCP server '{server}': {message}")]
    Connect {
        /// The server's name.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// A request to the server failed.
    #[error("MCP server '{server}': {message}")]
    Request {
        /// The server's name.
        server: String,
        /// What went wrong.
        message: String,
    },
}

/// The calls waiting for progress, by the token their request carries.
type Routes = Arc<Mutex<HashMap<ProgressToken, ToolContext>>>;

/// The client side of one MCP session: receives the server's notifications.
#[derive(Clone)]
struct Handler {
    /// The server's name, as its questions to a person say it.
    server: Arc<str>,
    routes: Routes,
    changes: Arc<watch::Sender<u64>>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        // A server of 2026-07-28 may answer a call with a task, which the wrapper follows.
        let mut capabilities = ClientCapabilities::default();
        capabilities.extensions = Some([(TASKS_EXTENSION_ID.to_owned(), JsonObject::new())].into());
        // Its forms and pages are put to a person through the kernel (`ctx.ask`).
        capabilities.elicitation = Some(
            ElicitationCapability::new()
                .with_form(FormElicitationCapability::new())
                .with_url(UrlElicitationCapability::new()),
        );
        ClientConfig::new(
            capabilities,
            Implementation::new("worker-sdk", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let ctx = self
            .routes
            .lock()
            .expect("progress routes poisoned")
            .get(&params.progress_token)
            .cloned();
        if let Some(ctx) = ctx {
            ctx.progress_with(progress_of(&params));
        }
    }

    /// A 2025-11-25 server's form, asked during a call: the request names no call, so it is put to
    /// a person as a question of the one call in flight on this connection; with several in
    /// flight it cannot be told whose it is, and is declined.
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        let calls: Vec<ToolContext> = {
            let routes = self.routes.lock().expect("progress routes poisoned");
            let mut calls: Vec<ToolContext> = Vec::new();
            for ctx in routes.values() {
                if !calls
                    .iter()
                    .any(|c| c.step_key() == ctx.step_key() && c.run_id() == ctx.run_id())
                {
                    calls.push(ctx.clone());
                }
            }
            calls
        };
        let [ctx] = calls.as_slice() else {
            tracing::warn!(server = %self.server, calls = calls.len(), "mcp input declined: not one call in flight to ask for");
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        let answer = super::input::ask(&self.server, ctx, &request)
            .await
            .map_err(|error| rmcp::ErrorData::internal_error(error.to_string(), None))?;
        serde_json::from_value(answer).map_err(|error| rmcp::ErrorData::internal_error(error.to_string(), None))
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.send_modify(|n| *n += 1);
    }
}

/// An MCP progress notification as a call's progress: its message (or `progress/total`), and the
/// fraction when the server gives a total.
fn progress_of(params: &ProgressNotificationParam) -> Progress {
    let line = match (&params.message, params.total) {
        (Some(message), _) => message.clone(),
        (None, Some(total)) => format!("{}/{}", params.progress, total),
        (None, None) => format!("{}", params.progress),
    };
    let progress = Progress::new(line);
    match params.total {
        Some(total) if total >= params.progress && params.progress >= 0.0 => {
            progress.step(params.progress.round() as u64, total.round() as u64)
        }
        _ => progress,
    }
}

struct Inner {
    name: String,
    peer: Peer<RoleClient>,
    routes: Routes,
    changes: watch::Receiver<u64>,
    closed: watch::Receiver<bool>,
    stop: tokio_util::sync::CancellationToken,
    hold_lost: std::sync::atomic::AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A live session with one MCP server. Cheap to clone; the session (and a server process it
/// started) ends when the last clone, and every tool wrapped from it, is dropped.
#[derive(Clone)]
pub struct McpConnection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpConnection")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl McpConnection {
    /// Starts `command` and speaks MCP over its stdin and stdout; its stderr is inherited.
    /// `name` names the server in errors and logs.
    pub async fn stdio(name: impl Into<String>, command: tokio::process::Command) -> Result<Self, McpError> {
        let name = name.into();
        let transport = TokioChildProcess::new(command).map_err(|source| McpError::Spawn {
            server: name.clone(),
            source,
        })?;
        Self::serve(name, transport).await
    }

    /// Connects to a Streamable HTTP endpoint, sending `headers` with every request (an
    /// `Authorization` header included).
    pub async fn http(name: impl Into<String>, url: &str, headers: &HashMap<String, String>) -> Result<Self, McpError> {
        let name = name.into();
        let mut custom = HashMap::new();
        for (key, value) in headers {
            let bad = |what: &str| McpError::Connect {
                server: name.clone(),
                message: format!("header '{key}': not a valid HTTP header {what}"),
            };
            custom.insert(
                key.parse::<http::HeaderName>().map_err(|_| bad("name"))?,
                value.parse::<http::HeaderValue>().map_err(|_| bad("value"))?,
            );
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).custom_headers(custom);
        Self::serve(name, StreamableHttpClientTransport::from_config(config)).await
    }

    async fn serve<T, E, A>(name: String, transport: T) -> Result<Self, McpError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let routes = Routes::default();
        let (changes_tx, changes) = watch::channel(0);
        let handler = Handler {
            server: name.as_str().into(),
            routes: Arc::clone(&routes),
            changes: Arc::new(changes_tx),
        };
        // Either revision: `server/discover` first, and `initialize` for a server that does not
        // know it.
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
        };
        let service: RunningService<RoleClient, Handler> = handler
            .serve_with_lifecycle(transport, lifecycle)
            .await
            .map_err(|error| McpError::Connect {
                server: name.clone(),
                message: format!("cannot initialize a session: {error}"),
            })?;
        let peer = service.peer().clone();
        let revision = peer
            .peer_info()
            .map(|info| info.protocol_version.to_string())
            .unwrap_or_default();
        tracing::info!(server = name, revision, "mcp server connected");
        let (closed_tx, closed) = watch::channel(false);
        let stop = tokio_util::sync::CancellationToken::new();
        let stopping = stop.clone();
        let server = name.clone();
        tokio::spawn(async move {
            let ending = service.cancellation_token();
            tokio::select! {
                quit = service.waiting() => {
                    tracing::info!(server, reason = ?quit, "mcp server session ended");
                }
                _ = stopping.cancelled() => ending.cancel(),
            }
            let _ = closed_tx.send(true);
        });
        Ok(Self {
            inner: Arc::new(Inner {
                name,
                peer,
                routes,
                changes,
                closed,
                stop,
                hold_lost: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The name given at connection.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The server's tools, all pages.
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, McpError> {
        self.inner
            .peer
            .list_all_tools()
            .await
            .map_err(|error| McpError::Request {
                server: self.inner.name.clone(),
                message: format!("tools/list failed: {error}"),
            })
    }

    /// Changes each time the server says its tool list changed (`notifications/tools/list_changed`).
    pub fn list_changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.clone()
    }

    /// Completes when the session has ended (the server exited or closed the connection).
    pub async fn closed(&self) {
        let mut closed = self.inner.closed.clone();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// From now on, a call whose MCP session ends mid-call never answers (until the kernel cancels
    /// it) instead of failing. For a supervisor that ends the worker session as soon as the server
    /// is lost ([`McpConnection::closed`]): the kernel then treats those calls as a lost worker's,
    /// by their idempotency (a `safe_to_retry` call runs again, an `at_most_once` call is
    /// indeterminate), rather than as failures.
    pub fn hold_lost_calls(&self) {
        self.inner.hold_lost.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn holds_lost_calls(&self) -> bool {
        self.inner.hold_lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    pub(super) fn peer(&self) -> &Peer<RoleClient> {
        &self.inner.peer
    }

    /// Sends the call's progress notifications to `ctx` until the returned guard is dropped.
    pub(super) fn route_progress(&self, token: ProgressToken, ctx: ToolContext) -> RouteGuard {
        self.inner
            .routes
            .lock()
            .expect("progress routes poisoned")
            .insert(token.clone(), ctx);
        RouteGuard {
            routes: Arc::clone(&self.inner.routes),
            token,
        }
    }
}

/// Removes a call's progress route when dropped.
pub(super) struct RouteGuard {
    routes: Routes,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes
            .lock()
            .expect("progress routes poisoned")
            .remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(progress: f64, total: Option<f64>, message: Option<&str>) -> ProgressNotificationParam {
        let mut params =
            ProgressNotificationParam::new(ProgressToken(rmcp::model::NumberOrString::Number(1)), progress);
        params.total = total;
        params.message = message.map(str::to_owned);
        params
    }

    #[test]
    fn progress_keeps_the_server_s_message_and_fraction() {
        let with_message = progress_of(&params(2.0, Some(5.0), Some("step 2")));
        assert_eq!(
            (with_message.message.as_str(), with_message.current, with_message.total),
            ("step 2", Some(2), Some(5))
        );
        let bare = progress_of(&params(3.0, Some(4.0), None));
        assert_eq!(bare.message, "3/4");
        let open_ended = progress_of(&params(7.0, None, None));
        assert_eq!((open_ended.message.as_str(), open_ended.total), ("7", None));
    }
}
