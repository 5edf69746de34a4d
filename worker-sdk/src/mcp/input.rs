//! A wrapped server's requests for input, put to a person through the kernel: each form it asks
//! for becomes a question of the call ([`ToolContext::ask`](crate::ToolContext::ask)), which blocks
//! the run until someone answers with `kernelctl approvals answer`, the console or an MCP client's
//! input, and the answer goes back to the server as the form's content (a decline as a decline).
//! A page the server asks the person to visit is a question too, answered with `{}` once done.
//! Answers are recorded, so a call run again answers the server's same questions without asking
//! again. What only a model or the client's own state could answer (sampling, roots) ends the call.

use rmcp::model::{ElicitRequestParams, InputRequest, InputRequests, InputResponses};
use serde_json::{Value, json};

use super::connection::McpConnection;
use crate::ToolContext;
use crate::error::ToolError;

/// The answers to the server's `requests` for input to call `name`, one person's answer to each.
pub(super) async fn answer(
    server: &McpConnection,
    name: &str,
    ctx: &ToolContext,
    requests: &InputRequests,
) -> Result<InputResponses, ToolError> {
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let InputRequest::Elicitation(elicit) = request else {
            return Err(unanswerable(server, name, request));
        };
        let response = ask(server.name(), ctx, &elicit.params).await?;
        responses.insert(key.clone(), response);
    }
    Ok(responses)
}

/// Puts one form (or page) to a person; the elicitation result the server gets.
pub(super) async fn ask(server: &str, ctx: &ToolContext, params: &ElicitRequestParams) -> Result<Value, ToolError> {
    let question = match params {
        ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } => ctx
            .ask(format!("{server} asks: {message}"))
            .schema(serde_json::to_value(requested_schema).unwrap_or_else(|_| json!({"type": "object"}))),
        ElicitRequestParams::UrlElicitationParams { message, url, .. } => ctx
            .ask(format!(
                "{server} asks: {message}\nOpen {url}, then answer {{}} once done (or decline)."
            ))
            .schema(json!({"type": "object"})),
        _ => return Ok(json!({"action": "decline"})),
    };
    // The server holds the call's request (or task) while the person answers: dropping the body to
    // free its slot would leave that behind and make the call again.
    Ok(match ctx.run_question(question.holding_slot()).await? {
        Ok(content) => match params {
            ElicitRequestParams::FormElicitationParams { .. } => json!({"action": "accept", "content": content}),
            _ => json!({"action": "accept"}),
        },
        Err(why) => {
            tracing::info!(server, reason = %why, "mcp input declined");
            json!({"action": "decline"})
        }
    })
}

/// The call's error when the server asks for what no person can give through the kernel.
fn unanswerable(server: &McpConnection, name: &str, request: &InputRequest) -> ToolError {
    let what = match request {
        InputRequest::CreateMessage(_) => "a model's answer (sampling)",
        InputRequest::ListRoots(_) => "its client's roots",
        _ => "input the kernel cannot give",
    };
    ToolError::fatal(format!(
        "MCP server '{}' asks for {what} to go on with '{name}', which a person cannot give through the kernel; the \
         call ends here",
        server.name()
    ))
}
