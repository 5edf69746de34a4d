//! A server's tools as the kernel should see them: the SDK's wrapping, then what the config
//! declares of the server (approval, risk, permissions, owner, version, price, timeout, retries),
//! for the tools its allow and deny globs offer.

use worker_sdk::Tool;
use worker_sdk::mcp::{McpConnection, McpError, wrap_mcp_tool};

use crate::config::Server;

/// The tools `server` offers through `connection`, each declared as the config says.
pub async fn tools(server: &Server, connection: &McpConnection) -> Result<Vec<Tool>, McpError> {
    let mut tools: Vec<Tool> = Vec::new();
    for definition in connection.list_tools().await? {
        let bare = definition.name.to_string();
        if !server.offers(&bare) {
            continue;
        }
        let Some(tool) = wrap_mcp_tool(connection, &server.prefix, &definition) else {
            tracing::warn!(
                server = server.name,
                tool = bare,
                "mcp tool left out: its id would be longer than 64 characters"
            );
            continue;
        };
        if tools.iter().any(|t| t.definition().name == tool.definition().name) {
            tracing::warn!(
                server = server.name,
                tool = bare,
                "mcp tool left out: another tool has the same id"
            );
            continue;
        }
        tools.push(declare(server, &bare, tool));
    }
    Ok(tools)
}

/// Applies the server's declarations to one wrapped tool whose MCP name is `bare`.
pub fn declare(server: &Server, bare: &str, mut tool: Tool) -> Tool {
    if !server.strip_nulls {
        let mut options = tool.definition().options.clone();
        options.strip_nulls = false;
        tool = tool.options(options);
    }
    // The first matching entry decides, as in a policy's rules.
    if let Some(rule) = server.approvals.iter().find(|rule| rule.tools.is_match(bare)) {
        tool = match &rule.when {
            Some(predicate) => tool.requires_approval_if(predicate.clone()),
            None => tool.requires_approval(true),
        };
    }
    if let Some(risk) = server.risk {
        tool = tool.risk(risk);
    }
    if !server.permissions.is_empty() {
        tool = tool.permissions(server.permissions.clone());
    }
    if let Some(owner) = &server.owner {
        tool = tool.owner(owner.clone());
    }
    if let Some(version) = &server.version {
        // The definition's hash stays in the version: a changed MCP definition is still a new
        // fingerprint under a version the config pins.
        let hashed = tool.definition().version.clone();
        tool = tool.version(format!("{version}+{hashed}"));
    }
    if let Some(price) = server.unit_price {
        tool = tool.cost_per_call(price);
    }
    if let Some(timeout) = server.timeout {
        tool = tool.timeout(timeout);
    }
    if let Some(retries) = server.retries {
        tool = tool.retry(retries);
    }
    tool
}
