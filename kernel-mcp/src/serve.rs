//! The kernel's tools served to MCP clients. `tools/list` gives the tools connected workers offer
//! (narrowed by an allow list); `tools/call` records the call in the run of the client's MCP
//! session (created at its first call, the agent named after the client's `clientInfo`) and
//! answers once the kernel has its result. Validation, policy, approval, replay and cost are the
//! kernel's, as for any agent: a denied or rejected call is an `isError` result with the text the
//! model reads, a call parked for a person keeps the request open (progress notifications say it
//! waits for a person), the call's progress is the request's progress, and a client's cancel
//! cancels the session's run.
//!
//! Over stdio ([`serve_stdio`]) one process is one session; over Streamable HTTP ([`serve_http`])
//! each MCP session has its own run, and the bearer token a client sends is the kernel API key its
//! calls are made with.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use globset::GlobSet;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
    ToolsCapability,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentClient, AgentError, Call, CallStatus, NewRun, RunHandle, Tls, TurnItem};

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
}

/// The run a session's calls go to now, and the cancel tokens of its calls in flight: once one of
/// them is cancelled the run is being cancelled, so a call that comes after starts another run
/// (rmcp cancels the token when the client's `notifications/cancelled` arrives, before it hands
/// the client's next request on).
#[derive(Default)]
struct Current {
    cell: Arc<OnceCell<RunHandle>>,
    calls: std::collections::HashMap<u64, tokio_util::sync::CancellationToken>,
    next: u64,
}

/// Takes a call off [`Current::calls`] when it ends.
struct InFlight(Arc<Mutex<Current>>, u64);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().expect("run cell poisoned").calls.remove(&self.1);
    }
}

/// One MCP session's view of the kernel: its client and, once it made a call, its run.
#[derive(Clone)]
pub struct KernelTools {
    bridge: Arc<Bridge>,
    client: Arc<OnceCell<AgentClient>>,
    /// The session's run and the calls in flight in it.
    run: Arc<Mutex<Current>>,
    turn: Arc<AtomicU32>,
}

impl KernelTools {
    /// A new session over `bridge`.
    pub fn new(bridge: Arc<Bridge>) -> Self {
        Self {
            bridge,
            client: Arc::default(),
            run: Arc::default(),
            turn: Arc::default(),
        }
    }

    async fn client(&self, context: &RequestContext<RoleServer>) -> Result<&AgentClient, ErrorData> {
        self.client
            .get_or_try_init(|| async {
                let bridge = &self.bridge;
                let client = match &bridge.tls {
                    Some(tls) => AgentClient::connect_tls(&bridge.kernel, tls.clone()).await,
                    None => AgentClient::connect(&bridge.kernel).await,
                }
                .map_err(kernel_error)?;
                match bearer(context).or(bridge.api_key.clone()) {
                    Some(key) => client.api_key(key).map_err(kernel_error),
                    None => Ok(client),
                }
            })
            .await
    }

    /// The session's run, created at its first call (or the first after a cancel), with this call
    /// counted in flight in it.
    async fn session_run(&self, context: &RequestContext<RoleServer>) -> Result<(RunHandle, InFlight), ErrorData> {
        let (cell, in_flight) = {
            let mut current = self.run.lock().expect("run cell poisoned");
            if current.calls.values().any(|ct| ct.is_cancelled()) {
                current.cell = Arc::default();
                current.calls.clear();
            }
            let id = current.next;
            current.next += 1;
            current.calls.insert(id, context.ct.clone());
            (Arc::clone(&current.cell), InFlight(Arc::clone(&self.run), id))
        };
        let client = self.client(context).await?;
        let run = cell
            .get_or_try_init(|| async {
                let info = context.client_info();
                let (name, version) = info
                    .as_ref()
                    .map(|i| (i.name.clone(), i.version.clone()))
                    .unwrap_or_default();
                let agent = if name.trim().is_empty() {
                    "mcp-client".to_owned()
                } else {
                    name.clone()
                };
                let mut new = NewRun::new(agent, json!({"mcp_client": {"name": name, "version": version}}));
                for (key, value) in &self.bridge.labels {
                    new = new.label(key.clone(), value.clone());
                }
                client.create_run(new).await.map_err(kernel_error)
            })
            .await?;
        Ok((run.clone(), in_flight))
    }
}

impl ServerHandler for KernelTools {
    fn get_info(&self) -> ServerConfig {
        let mut tools = ToolsCapability::default();
        tools.list_changed = Some(false);
        ServerConfig::new(ServerCapabilities::builder().enable_tools_with(tools).build())
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
        let (run, _in_flight) = self.session_run(&context).await?;
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let mut items = std::pin::pin!(run.submit_turn(turn, vec![Call::new(name, arguments)]));
        let mut sent = 0.0;
        loop {
            let item = tokio::select! {
                item = items.next() => item,
                _ = context.ct.cancelled() => {
                    // The kernel has no cancel for one call: the session's run goes, and the
                    // next call starts another.
                    let _ = run.cancel("cancelled by the MCP client").await;
                    return Ok(refused("cancelled by the client".to_owned()).into());
                }
            };
            match item {
                Some(Ok(TurnItem::Result(outcome))) => return Ok(result(outcome).into()),
                Some(Ok(TurnItem::Progress(update))) => {
                    sent += 1.0;
                    let at = update.current.map_or(sent, |c| c as f64);
                    notify(&context, at, update.total, update.message).await;
                }
                Some(Ok(TurnItem::Interrupted(asked))) => {
                    sent += 1.0;
                    let message = format!(
                        "waiting for a person's approval of '{}' (approval {}){}",
                        asked.tool,
                        asked.approval_id,
                        if asked.message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", asked.message)
                        }
                    );
                    notify(&context, sent, None, message).await;
                }
                Some(Err(error)) => return Err(kernel_error(error)),
                None => {
                    return Err(ErrorData::internal_error(
                        "the kernel ended the call's stream without a result",
                        None,
                    ));
                }
            }
        }
    }
}

/// Sends the request's progress, when the client asked for it with a progress token.
async fn notify(context: &RequestContext<RoleServer>, at: f64, total: Option<u64>, message: String) {
    let Some(token) = context.meta.get_progress_token() else {
        return;
    };
    let mut progress = ProgressNotificationParam::new(token, at).with_message(message);
    if let Some(total) = total {
        progress = progress.with_total(total as f64);
    }
    let _ = context.peer.notify_progress(progress).await;
}

/// The bearer token of the HTTP request, if the client sent one.
fn bearer(context: &RequestContext<RoleServer>) -> Option<String> {
    let parts = context.extensions.get::<http::request::Parts>()?;
    let value = parts.headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(|key| key.trim().to_owned())
}

/// A registered tool as MCP describes it: name, description, schema and its declared effect as
/// hints.
fn mcp_tool(spec: pb::ToolSpec) -> Tool {
    let schema: JsonObject = match serde_json::from_str(&spec.input_schema_json) {
        Ok(Value::Object(mut schema)) => {
            objects_for_booleans(&mut schema);
            schema
        }
        _ => JsonObject::new(),
    };
    let options = spec.options.unwrap_or_default();
    let annotations = ToolAnnotations::new()
        .read_only(options.read_only)
        .destructive(options.writes)
        .idempotent(options.read_only || options.idempotency == pb::Idempotency::SafeToRetry as i32);
    Tool::new(spec.name, spec.description, Arc::new(schema)).with_annotations(annotations)
}

/// Rewrites boolean subschemas of properties and items (`true`: anything, `false`: nothing) as
/// the object schemas they mean. JSON Schema allows both, but MCP clients read tool schemas as
/// objects: the TypeScript SDK refuses a whole `tools/list` over one `true` (found by the MCP
/// conformance suite, on a tool taking any JSON value).
fn objects_for_booleans(schema: &mut JsonObject) {
    let as_object = |value: &mut Value| match value {
        Value::Bool(true) => *value = json!({}),
        Value::Bool(false) => *value = json!({"not": {}}),
        Value::Object(inner) => objects_for_booleans(inner),
        _ => {}
    };
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.values_mut().for_each(as_object);
    }
    if let Some(items) = schema.get_mut("items") {
        as_object(items);
    }
}

/// A call's outcome as an MCP result: a success's content (and its JSON, when an object, as
/// structured content), or an error result with the text the model reads.
fn result(outcome: worker_sdk::CallOutcome) -> CallToolResult {
    if outcome.status != CallStatus::Ok {
        return refused(outcome.content);
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(outcome.content)]);
    if let Some(object @ Value::Object(_)) = outcome.output {
        result.structured_content = Some(object);
    }
    result
}

fn refused(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn kernel_error(error: AgentError) -> ErrorData {
    ErrorData::internal_error(format!("kernel: {error}"), None)
}

/// Serves one MCP session on stdin and stdout until the client closes it.
pub async fn serve_stdio(bridge: Bridge) -> Result<(), String> {
    let running = KernelTools::new(Arc::new(bridge))
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("cannot start the MCP session: {e}"))?;
    running.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Serves Streamable HTTP on `listener` at `/mcp` until `shutdown`.
pub async fn serve_http(
    bridge: Bridge,
    listener: tokio::net::TcpListener,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let bridge = Arc::new(bridge);
    let service = StreamableHttpService::new(
        move || Ok(KernelTools::new(Arc::clone(&bridge))),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token()),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boolean_subschemas_become_the_objects_they_mean() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "value": true,
                "never": false,
                "list": {"type": "array", "items": true},
                "nested": {"type": "object", "properties": {"any": true}}
            },
            "additionalProperties": false
        });
        let Value::Object(object) = &mut schema else {
            unreachable!()
        };
        objects_for_booleans(object);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "value": {},
                    "never": {"not": {}},
                    "list": {"type": "array", "items": {}},
                    "nested": {"type": "object", "properties": {"any": {}}}
                },
                "additionalProperties": false
            })
        );
    }
}
