//! The kernel's tools served to MCP clients, at both revisions of the protocol on the same
//! endpoints. `tools/list` gives the tools connected workers offer (narrowed by an allow list);
//! `tools/call` records the call in a run and answers once the kernel has its result. Validation,
//! policy, approval, replay and cost are the kernel's, as for any agent: a denied or rejected
//! call is an `isError` result with the text the model reads, and the call's progress is the
//! request's progress.
//!
//! - A 2025-11-25 session (one that began with `initialize`) has one run, created at its first
//!   call and completed when the session ends ([`session`]); a call parked for a person keeps
//!   its request open, and a client's cancel cancels that one call.
//! - At 2026-07-28 there are no sessions ([`stateless`]): a call goes into a run of its own, or
//!   the run its `_meta` names, and a re-issued call with the same idempotency key runs once. A
//!   call parked for a person is asked of a client that can show a form as `input_required`
//!   ([`approval`]).
//!
//! Over stdio ([`serve_stdio`]) one process serves one client; over Streamable HTTP
//! ([`serve_http`]) the bearer token a client sends is the kernel API key its calls are made
//! with, and a request whose key the kernel does not know gets HTTP 401 before any MCP processing.

mod approval;
mod follow;
mod http;
mod results;
mod session;
mod stateless;
mod tasks;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use globset::GlobSet;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, ToolsCapability, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use worker_sdk::{AgentClient, AgentError, Tls};

pub use http::serve_http;
use results::{kernel_error, mcp_tool, refused};
use session::{EndOnDrop, Session, end_run};

/// Where the kernel is and what the served sessions may see and are labelled with.
#[derive(Clone, Debug, Default)]
pub struct Bridge {
    /// The kernel's gRPC address.
    pub kernel: String,
    /// TLS settings for an https:// kernel.
    pub tls: Option<Tls>,
    /// The API key calls are made with when the client sends none (stdio; HTTP without a bearer).
    pub api_key: Option<String>,
    /// Tool-name globs to offer; `None` offers every tool a worker offers.
    pub allow: Option<GlobSet>,
    /// Labels of every run the sessions create.
    pub labels: BTreeMap<String, String>,
    /// An HTTP session that sends and receives nothing this long is closed, and its run
    /// completed; `None`: rmcp's default (five minutes).
    pub session_idle: Option<Duration>,
    /// Over HTTP, ask the kernel about each request's key (its bearer, else `api_key`) before
    /// serving it: one the kernel does not authenticate gets HTTP 401. Off where the kernel is
    /// known to have no keys.
    pub authenticate: bool,
    /// The OAuth protected resource this endpoint is, when the kernel accepts an authorization
    /// server's access tokens: published as its metadata (RFC 9728) and named in each 401.
    pub resource: Option<ProtectedResource>,
}

/// What the bridge publishes of itself as an OAuth protected resource.
#[derive(Clone, Debug)]
pub struct ProtectedResource {
    /// The resource's identifier, the URL clients reach `/mcp` at: what the kernel's tokens must
    /// carry as `aud`.
    pub resource: String,
    /// The authorization servers that issue its tokens (their issuer URLs).
    pub authorization_servers: Vec<String>,
}

impl ProtectedResource {
    /// Where its metadata is published, by RFC 9728: `/.well-known/oauth-protected-resource`
    /// followed by the resource's path (`/mcp`); `None` when the resource is no http(s) URL
    /// without a query or fragment.
    pub fn metadata_path(&self) -> Option<String> {
        let (_, path) = self.split()?;
        Some(format!(
            "/.well-known/oauth-protected-resource{}",
            path.trim_end_matches('/')
        ))
    }

    /// The metadata's full URL, as a 401 names it.
    pub fn metadata_url(&self) -> Option<String> {
        let (origin, _) = self.split()?;
        Some(format!("{origin}{}", self.metadata_path()?))
    }

    /// The resource's origin (`https://host:port`) and path.
    fn split(&self) -> Option<(&str, &str)> {
        let url = self.resource.as_str();
        let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"))?;
        if url.contains(['?', '#']) || rest.is_empty() {
            return None;
        }
        let scheme = url.len() - rest.len();
        let end = rest.find('/').map_or(url.len(), |at| scheme + at);
        Some((&url[..end], &url[end..]))
    }
}

impl Bridge {
    /// Connects to the kernel, with no key.
    async fn connect(&self) -> Result<AgentClient, AgentError> {
        match &self.tls {
            Some(tls) => AgentClient::connect_tls(&self.kernel, tls.clone()).await,
            None => AgentClient::connect(&self.kernel).await,
        }
    }
}

/// One client's view of the kernel: a 2025-11-25 session, or the requests of 2026-07-28 clients,
/// which share nothing but the connection.
#[derive(Clone)]
pub struct KernelTools {
    bridge: Arc<Bridge>,
    /// The connection every session and request of the server shares; each request's key is
    /// put on a clone of it.
    connection: Arc<OnceCell<AgentClient>>,
    session: Arc<Session>,
    /// Ends the session's run when the last clone of the session goes.
    _end: Arc<EndOnDrop>,
}

impl KernelTools {
    /// A new session over `bridge` sharing `connection`; its run is completed when the session
    /// goes, unless `stopping` is cancelled by then.
    fn new(bridge: Arc<Bridge>, connection: Arc<OnceCell<AgentClient>>, stopping: CancellationToken) -> Self {
        let session = Arc::new(Session::default());
        Self {
            bridge,
            connection,
            _end: Arc::new(EndOnDrop {
                run: Arc::clone(&session.run),
                stopping,
            }),
            session,
        }
    }

    /// The kernel client for a request: its bearer's key, else the bridge's.
    async fn client(&self, context: &RequestContext<RoleServer>) -> Result<AgentClient, ErrorData> {
        let base = self
            .connection
            .get_or_try_init(|| self.bridge.connect())
            .await
            .map_err(kernel_error)?
            .clone();
        match bearer(context).or(self.bridge.api_key.clone()) {
            Some(key) => base.api_key(key).map_err(kernel_error),
            None => Ok(base),
        }
    }
}

/// Whether a request is of 2026-07-28 or later, which has no sessions.
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

impl ServerHandler for KernelTools {
    fn get_info(&self) -> ServerConfig {
        let mut tools = ToolsCapability::default();
        tools.list_changed = Some(false);
        let capabilities = ServerCapabilities::builder()
            .enable_tools_with(tools)
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("kernel", env!("CARGO_PKG_VERSION")))
            .with_instructions("Every call is recorded, checked against policy and may wait for a person's approval.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let registered = self
            .client(&context)
            .await?
            .registered_tools()
            .await
            .map_err(kernel_error)?;
        let tools = registered
            .into_iter()
            .filter(|tool| !tool.workers.is_empty())
            .filter_map(|tool| tool.spec)
            .filter(|spec| {
                self.bridge
                    .allow
                    .as_ref()
                    .is_none_or(|allow| allow.is_match(&spec.name))
            })
            .map(mcp_tool)
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if self.bridge.allow.as_ref().is_some_and(|allow| !allow.is_match(&name)) {
            return Ok(refused(format!("tool '{name}' is not offered here")).into());
        }
        let client = self.client(&context).await?;
        if stateless(&context) {
            let bearer = bearer(&context);
            return stateless::call(&client, &self.bridge, bearer.as_deref(), request, &context).await;
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let result = self
            .session
            .call(&client, &self.bridge, name, arguments, &context)
            .await?;
        Ok(result.into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        tasks::get(&self.client(&context).await?, &request.task_id).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let client = self.client(&context).await?;
        tasks::update(&client, &request.task_id, &request.input_responses, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        tasks::cancel(&self.client(&context).await?, &request.task_id).await
    }
}

/// The bearer token of the HTTP request, if the client sent one.
fn bearer(context: &RequestContext<RoleServer>) -> Option<String> {
    http::bearer_of(&context.extensions.get::<::http::request::Parts>()?.headers)
}

/// Serves one MCP client on stdin and stdout until it closes them; then a 2025-11-25 session's
/// run completes.
pub async fn serve_stdio(bridge: Bridge) -> Result<(), String> {
    // The session's end is awaited here (a process about to exit runs no task it spawns), so
    // the drop hook is kept from doing it too.
    let no_end_on_drop = CancellationToken::new();
    no_end_on_drop.cancel();
    let tools = KernelTools::new(Arc::new(bridge), Arc::default(), no_end_on_drop);
    let run = Arc::clone(&tools.session.run);
    let running = tools
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("cannot start the MCP session: {e}"))?;
    let waited = running.waiting().await.map_err(|e| e.to_string());
    if let Some(handle) = run.get() {
        end_run(handle.clone()).await;
    }
    waited?;
    Ok(())
}
