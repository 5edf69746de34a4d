//! An MCP tool as a worker [`Tool`]: its id, schema, declared behaviour from its hints, and a call
//! that goes to the server with the bare name, reports the server's progress and honours cancels.

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam, ClientRequest, ContentBlock,
    DEFAULT_MRTR_MAX_ROUNDS, InputRequiredResult, ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::McpError;
use super::connection::McpConnection;
use crate::error::ToolError;
use crate::tool::{Idempotency, MAX_TOOL_NAME_LEN, Tool, validate_tool_name};

/// A tool as an MCP server describes it (`rmcp::model::Tool`).
pub type McpTool = rmcp::model::Tool;

/// The tool id the model and the kernel see for MCP tool `name` under `prefix`: `{prefix}_{name}`,
/// or the bare name for an empty prefix, with characters outside `[a-zA-Z0-9_-]` (an MCP name may
/// have `.` or `/`) as `_`. `None` when it would be longer than the kernel allows.
pub fn mcp_tool_id(prefix: &str, name: &str) -> Option<String> {
    let joined = if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}_{name}")
    };
    let id: String = joined
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    (validate_tool_name(&id).is_ok() && id.len() <= MAX_TOOL_NAME_LEN).then_some(id)
}

/// Lists the server's tools and wraps each one ([`wrap_mcp_tool`]). A tool whose id would not be
/// valid, or would repeat another's, is left out with a warning.
pub async fn wrap_mcp_tools(server: &McpConnection, prefix: &str) -> Result<Vec<Tool>, McpError> {
    let wrapped = wrap_mcp_tools_where(server, prefix, |_| true).await?;
    Ok(wrapped.into_iter().map(|(_, tool)| tool).collect())
}

/// [`wrap_mcp_tools`] for the tools whose bare MCP name `keep` accepts, each with that name.
pub async fn wrap_mcp_tools_where(
    server: &McpConnection,
    prefix: &str,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Tool)>, McpError> {
    let mut tools: Vec<(String, Tool)> = Vec::new();
    for definition in server.list_tools().await? {
        if !keep(&definition.name) {
            continue;
        }
        let Some(tool) = wrap_mcp_tool(server, prefix, &definition) else {
            tracing::warn!(server = server.name(), tool = %definition.name, prefix, "mcp tool left out: its id would be longer than 64 characters");
            continue;
        };
        if tools.iter().any(|(_, t)| t.definition().name == tool.definition().name) {
            tracing::warn!(server = server.name(), tool = %definition.name, id = tool.definition().name, "mcp tool left out: another tool has the same id");
            continue;
        }
        tools.push((definition.name.to_string(), tool));
    }
    Ok(tools)
}

/// Wraps one MCP tool of `server` as a [`Tool`]:
/// - its id is [`mcp_tool_id`]; the server is called with the bare name;
/// - its input schema is the tool's `inputSchema`; its description the MCP description (or title);
/// - `readOnlyHint` makes it `read_only`, `destructiveHint` makes it `writes`; it is `safe_to_retry`
///   when it is read-only or `idempotentHint`, otherwise `at_most_once` (MCP's own default for a
///   tool that does not say is "may be destructive, not idempotent");
/// - `strip_nulls` is on: models fill optional fields with null, which typed MCP parameters reject;
/// - its version is `mcp.<hash of the whole MCP definition>`, so a changed definition (schema,
///   description, annotations, output schema) is a new fingerprint, and a replay of a call recorded
///   under the old one is a divergence.
///
/// The result is [`flatten_result`]; progress notifications become the call's progress, and a cancel
/// from the kernel is sent to the server as `notifications/cancelled`. If the session ends mid-call,
/// a `safe_to_retry` call fails retryably (the kernel tries it again, by its retry policy) and an
/// `at_most_once` one fatally (it may have run). Builder methods on the returned tool override any of
/// this.
pub fn wrap_mcp_tool(server: &McpConnection, prefix: &str, definition: &McpTool) -> Option<Tool> {
    let id = mcp_tool_id(prefix, &definition.name)?;
    let annotations = definition.annotations.clone().unwrap_or_default();
    let read_only = annotations.read_only_hint == Some(true);
    let idempotency = if read_only || annotations.idempotent_hint == Some(true) {
        Idempotency::SafeToRetry
    } else {
        Idempotency::AtMostOnce
    };
    let description = definition
        .description
        .as_deref()
        .map(str::to_owned)
        .or_else(|| definition.title.clone())
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| format!("{} (from MCP server {})", definition.name, server.name()));
    let schema = Value::Object((*definition.input_schema).clone());
    let bare = definition.name.to_string();
    let connection = server.clone();
    let tool = Tool::new(id, description, schema, move |ctx, args| {
        let connection = connection.clone();
        let bare = bare.clone();
        Box::pin(async move { call(&connection, &bare, idempotency, ctx, args).await })
    })
    .version(definition_version(definition))
    .idempotency(idempotency)
    .strip_nulls();
    Some(if read_only {
        tool.read_only()
    } else if annotations.destructive_hint == Some(true) {
        tool.writes()
    } else {
        tool
    })
}

/// `mcp.` and the first 16 hex digits of sha256 over the MCP definition's JSON.
fn definition_version(definition: &McpTool) -> String {
    let json = serde_json::to_value(definition).unwrap_or(Value::Null);
    let digest = Sha256::digest(kernel_proto::canonical::to_canonical(&json).as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("mcp.{hex}")
}

async fn call(
    server: &McpConnection,
    name: &str,
    idempotency: Idempotency,
    ctx: crate::ToolContext,
    args: Value,
) -> Result<Value, ToolError> {
    let arguments = match args {
        Value::Object(map) => map,
        other => {
            return Err(ToolError::fatal(format!(
                "arguments must be a JSON object, got {other}"
            )));
        }
    };
    let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments.clone());
    for _ in 0..DEFAULT_MRTR_MAX_ROUNDS {
        let asked = match send(server, name, idempotency, &ctx, params).await? {
            Answered::Done(result) => return result,
            Answered::NeedsInput(asked) => asked,
        };
        let responses = super::input::answer(server, name, &ctx, &asked.input_requests.unwrap_or_default()).await?;
        if ctx.is_cancelled() {
            return Err(ToolError::fatal(format!("'{name}' was cancelled")));
        }
        params = CallToolRequestParams::new(name.to_owned())
            .with_arguments(arguments.clone())
            .with_input_responses(responses);
        if let Some(state) = asked.request_state {
            params = params.with_request_state(state);
        }
    }
    Err(ToolError::fatal(format!(
        "MCP server '{}' asked for input more than {DEFAULT_MRTR_MAX_ROUNDS} times during '{name}'; the call ends here",
        server.name()
    )))
}

/// What one `tools/call` round came to: the call's outcome, or the server's request for input.
enum Answered {
    Done(Result<Value, ToolError>),
    NeedsInput(InputRequiredResult),
}

/// Sends one `tools/call` round and waits for its answer, relaying the server's progress and a
/// kernel cancel.
async fn send(
    server: &McpConnection,
    name: &str,
    idempotency: Idempotency,
    ctx: &crate::ToolContext,
    params: CallToolRequestParams,
) -> Result<Answered, ToolError> {
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = match server
        .peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
    {
        Ok(handle) => handle,
        Err(error) => return Ok(Answered::Done(lost(server, name, idempotency, ctx, &error).await)),
    };
    let id = handle.id.clone();
    let _route = server.route_progress(handle.progress_token.clone(), ctx.clone());
    let outcome = tokio::select! {
        answer = handle.await_response() => match answer {
            Ok(ServerResult::CallToolResult(result)) => flatten_result(result),
            Ok(ServerResult::CreateTaskResult(task)) => super::task::follow(server, name, idempotency, ctx, task).await,
            Ok(ServerResult::InputRequiredResult(asked)) => return Ok(Answered::NeedsInput(asked)),
            Ok(other) => Err(ToolError::fatal(format!(
                "MCP server '{}' answered tools/call '{name}' with something else: {}",
                server.name(),
                serde_json::to_string(&other).unwrap_or_default()
            ))),
            Err(error) => lost(server, name, idempotency, ctx, &error).await,
        },
        _ = ctx.cancelled() => {
            let reason = Some("cancelled by the kernel".to_owned());
            let _ = server.peer().notify_cancelled(CancelledNotificationParam::new(Some(id), reason)).await;
            Err(ToolError::fatal(format!("'{name}' was cancelled")))
        }
    };
    Ok(Answered::Done(outcome))
}

/// A request that failed below the tool. A connection that holds lost calls never answers one
/// (its supervisor ends the worker session, and the kernel decides); otherwise [`session_error`].
pub(super) async fn lost(
    server: &McpConnection,
    name: &str,
    idempotency: Idempotency,
    ctx: &crate::ToolContext,
    error: &ServiceError,
) -> Result<Value, ToolError> {
    if server.holds_lost_calls() && !matches!(error, ServiceError::McpError(_)) {
        tracing::warn!(server = server.name(), tool = name, %error, "mcp call lost with its server; the kernel decides what becomes of it");
        ctx.cancelled().await;
        return Err(ToolError::fatal(format!("'{name}' was cancelled")));
    }
    Err(session_error(server, name, idempotency, error))
}

/// A request that failed below the tool: an error the server sent is the tool's (fatal, the model
/// reads it); a session that ended mid-call may be tried again only by a `safe_to_retry` tool.
fn session_error(server: &McpConnection, name: &str, idempotency: Idempotency, error: &ServiceError) -> ToolError {
    match error {
        ServiceError::McpError(error) => ToolError::fatal(format!(
            "MCP server '{}' refused '{name}': {}",
            server.name(),
            error.message
        )),
        other => {
            let message = format!("MCP server '{}' was lost during '{name}': {other}", server.name());
            match idempotency {
                Idempotency::SafeToRetry => ToolError::retryable(message),
                Idempotency::AtMostOnce => {
                    ToolError::fatal(format!("{message}; it is at_most_once, so it is not tried again"))
                }
            }
        }
    }
}

/// A `CallToolResult` as the recorded result: an `isError` result is a tool error whose text the
/// model reads; otherwise the structured content when there is some, else the text blocks joined
/// by newlines, else (images, audio, resources, mixed with text or not) the content blocks as JSON.
pub fn flatten_result(result: CallToolResult) -> Result<Value, ToolError> {
    let text = || -> Option<String> {
        let texts: Option<Vec<&str>> = result
            .content
            .iter()
            .map(|block| match block {
                ContentBlock::Text(text) => Some(text.text.as_str()),
                _ => None,
            })
            .collect();
        texts.map(|texts| texts.join("\n"))
    };
    if result.is_error == Some(true) {
        let message = text()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| serde_json::to_string(&result.content).unwrap_or_default());
        return Err(ToolError::fatal(message));
    }
    if let Some(structured) = result.structured_content.clone().filter(|v| !v.is_null()) {
        return Ok(structured);
    }
    if let Some(text) = text() {
        return Ok(Value::String(text));
    }
    Ok(serde_json::to_value(&result.content).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ids_are_prefixed_and_kept_to_the_kernel_s_alphabet() {
        assert_eq!(mcp_tool_id("docs", "search").as_deref(), Some("docs_search"));
        assert_eq!(mcp_tool_id("", "get-sum").as_deref(), Some("get-sum"));
        assert_eq!(mcp_tool_id("fs", "files/read.v2").as_deref(), Some("fs_files_read_v2"));
        assert_eq!(mcp_tool_id("p", &"x".repeat(63)), None);
    }

    fn definition(value: Value) -> McpTool {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_version_covers_the_whole_mcp_definition() {
        let base = json!({"name": "search", "description": "Searches.", "inputSchema": {"type": "object"}});
        let version = definition_version(&definition(base.clone()));
        assert!(
            version.starts_with("mcp.") && version.len() == "mcp.".len() + 16,
            "{version}"
        );
        assert_eq!(version, definition_version(&definition(base.clone())), "stable");
        let mut changes = Vec::new();
        for (field, value) in [
            ("description", json!("Searches the web.")),
            (
                "inputSchema",
                json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            ),
            ("annotations", json!({"readOnlyHint": true})),
            ("outputSchema", json!({"type": "object"})),
            ("title", json!("Search")),
        ] {
            let mut changed = base.clone();
            changed[field] = value;
            changes.push(definition_version(&definition(changed)));
        }
        assert!(changes.iter().all(|v| *v != version), "{changes:?}");
    }

    fn result(value: Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn results_flatten_structured_first_then_text_then_blocks() {
        let structured = result(json!({
            "content": [{"type": "text", "text": "{\"temperature\":22}"}],
            "structuredContent": {"temperature": 22}
        }));
        assert_eq!(flatten_result(structured).unwrap(), json!({"temperature": 22}));
        let text = result(json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}));
        assert_eq!(flatten_result(text).unwrap(), json!("a\nb"));
        let image = result(json!({"content": [
            {"type": "text", "text": "here"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}
        ]}));
        let blocks = flatten_result(image).unwrap();
        assert_eq!(blocks[1]["type"], "image", "{blocks}");
        assert_eq!(blocks[1]["mimeType"], "image/png");
    }

    #[test]
    fn an_error_result_is_a_fatal_tool_error_the_model_reads() {
        let failed = result(json!({"content": [{"type": "text", "text": "no such city"}], "isError": true}));
        let error = flatten_result(failed).unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Fatal);
        assert_eq!(error.message(), "no such city");
    }
}
