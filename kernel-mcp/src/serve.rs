//! The kernel's tools served to MCP clients. `tools/list` gives the tools connected workers offer
//! (narrowed by an allow list); `tools/call` records the call in the run of the client's MCP
//! session (created at its first call, the agent named after the client's `clientInfo`) and
//! answers once the kernel has its result. Validation, policy, approval, replay and cost are the
//! kernel's, as for any agent: a denied or rejected call is an `isError` result with the text the
//! model reads, a call parked for a person keeps the request open (progress notifications say it
//! waits for a person), the call's progress is the request's progress, and a client's cancel
//! cancels that one call (`ToolCallService.CancelCall`): the session's run goes on.
//!
//! Over stdio ([`serve_stdio`]) one process is one session; over Streamable HTTP ([`serve_http`])
//! each MCP session has its own run, and the bearer token a client sends is the kernel API key its
//! calls are made with; a request whose key the kernel does not know gets HTTP 401 before any MCP
//! processing. A session that ends (its client deletes it or closes stdin, or it idles past its
//! timeout) completes its run, cancelling any call still in flight first; one cut short because
//! the bridge stops leaves its run as it is.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
use tokio_util::sync::CancellationToken;
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
    /// An HTTP session that sends and receives nothing this long is closed, and its run
    /// completed; `None`: rmcp's default (five minutes).
    pub session_idle: Option<Duration>,
    /// Over HTTP, ask the kernel about each request's key (its bearer, else `api_key`) before
    /// serving it: one the kernel does not authenticate gets HTTP 401. Off where the kernel is
    /// known to have no keys.
    pub authenticate: bool,
}

/// One MCP session's view of the kernel: its client and, once it made a call, its run.
#[derive(Clone)]
pub struct KernelTools {
    bridge: Arc<Bridge>,
    client: Arc<OnceCell<AgentClient>>,
    /// The session's run, created at its first call.
    run: Arc<OnceCell<RunHandle>>,
    turn: Arc<AtomicU32>,
    /// Ends the session's run when the last clone of the session goes.
    _end: Arc<EndOnDrop>,
}

/// Completes a session's run when the session goes (its client deleted it, or it idled out),
/// unless the bridge is stopping (`stopping` cancelled) or the run was ended already.
struct EndOnDrop {
    run: Arc<OnceCell<RunHandle>>,
    stopping: CancellationToken,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if self.stopping.is_cancelled() {
            return;
        }
        if let (Some(run), Ok(runtime)) = (self.run.get(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(end_run(run.clone()));
        }
    }
}

/// Ends a session's run: each call still in flight is cancelled, then the run completes.
async fn end_run(run: RunHandle) {
    for _ in 0..3 {
        let steps = match run.get().await {
            Ok(snapshot) => snapshot.steps,
            Err(error) => {
                tracing::warn!(run_id = run.id(), %error, "the mcp session's run not ended");
                return;
            }
        };
        for step in steps.iter().filter(|s| in_flight(s.status)) {
            cancel_call(&run, &step.step_key, "the MCP session ended").await;
        }
        match run.complete(json!({"mcp_session": "ended"})).await {
            Ok(()) => {
                tracing::info!(run_id = run.id(), "mcp session ended; its run completed");
                return;
            }
            // A call came in between: settle it too.
            Err(AgentError::Status(status)) if status.message().contains("in flight") => continue,
            Err(error) => {
                tracing::warn!(run_id = run.id(), %error, "the mcp session's run not completed");
                return;
            }
        }
    }
}

fn in_flight(status: i32) -> bool {
    !matches!(
        pb::StepStatus::try_from(status),
        Ok(pb::StepStatus::Succeeded | pb::StepStatus::Failed | pb::StepStatus::Cancelled)
    )
}

/// Cancels call `key` of `run`. A cancel that arrives while the call's turn is still being
/// recorded finds no call yet, so it tries again a few times; a call that settled meanwhile keeps
/// its result.
async fn cancel_call(run: &RunHandle, key: &str, reason: &str) {
    for attempt in 0..40 {
        match run.cancel_call(key, reason).await {
            Ok(_) => {
                tracing::info!(run_id = run.id(), step_key = key, "mcp call cancelled");
                return;
            }
            Err(AgentError::Status(status)) if status.code() == tonic::Code::NotFound && attempt < 39 => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(AgentError::Status(status)) if status.code() == tonic::Code::FailedPrecondition => return,
            Err(error) => {
                tracing::warn!(run_id = run.id(), step_key = key, %error, "mcp call not cancelled");
                return;
            }
        }
    }
}

impl KernelTools {
    /// A new session over `bridge`; its run is completed when the session goes, unless
    /// `stopping` is cancelled by then.
    pub fn new(bridge: Arc<Bridge>, stopping: CancellationToken) -> Self {
        let run: Arc<OnceCell<RunHandle>> = Arc::default();
        Self {
            bridge,
            client: Arc::default(),
            _end: Arc::new(EndOnDrop {
                run: Arc::clone(&run),
                stopping,
            }),
            run,
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

    /// The session's run, created at its first call.
    async fn session_run(&self, context: &RequestContext<RoleServer>) -> Result<RunHandle, ErrorData> {
        let client = self.client(context).await?;
        let run = self
            .run
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
        Ok(run.clone())
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
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        // The call is position 0 of its own turn: its step key is known before it is recorded.
        let key = format!("t{turn}/p0");
        let run = self.session_run(&context).await?;
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let mut items = std::pin::pin!(run.submit_turn(turn, vec![Call::new(name, arguments)]));
        let mut sent = 0.0;
        loop {
            let item = tokio::select! {
                item = items.next() => item,
                _ = context.ct.cancelled() => {
                    cancel_call(&run, &key, "cancelled by the MCP client").await;
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
    bearer_of(&context.extensions.get::<http::request::Parts>()?.headers)
}

/// The bearer token among `headers`, if there is one.
fn bearer_of(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    value
        .strip_prefix("Bearer ")
        .map(|key| key.trim().to_owned())
        .filter(|key| !key.is_empty())
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

/// Serves one MCP session on stdin and stdout until the client closes it; then its run completes.
pub async fn serve_stdio(bridge: Bridge) -> Result<(), String> {
    // The session's end is awaited here (a process about to exit runs no task it spawns), so
    // the drop hook is kept from doing it too.
    let no_end_on_drop = CancellationToken::new();
    no_end_on_drop.cancel();
    let tools = KernelTools::new(Arc::new(bridge), no_end_on_drop);
    let run = Arc::clone(&tools.run);
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

/// Serves Streamable HTTP on `listener` at `/mcp` until `shutdown`.
pub async fn serve_http(
    bridge: Bridge,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    let bridge = Arc::new(bridge);
    let mut sessions = LocalSessionManager::default();
    if let Some(idle) = bridge.session_idle {
        sessions.session_config.keep_alive = Some(idle);
    }
    let gate = Gate {
        bridge: Arc::clone(&bridge),
        client: Arc::default(),
        known: Arc::default(),
    };
    let stopping = shutdown.clone();
    let service = StreamableHttpService::new(
        move || Ok(KernelTools::new(Arc::clone(&bridge), stopping.clone())),
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
        let client = self
            .client
            .get_or_try_init(|| async {
                match &bridge.tls {
                    Some(tls) => AgentClient::connect_tls(&bridge.kernel, tls.clone()).await,
                    None => AgentClient::connect(&bridge.kernel).await,
                }
            })
            .await
            .ok()?
            .clone();
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
