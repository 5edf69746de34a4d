//! A server's tools as the kernel should see them: the SDK's wrapping, then what the config
//! declares of the server (approval, risk, permissions, owner, version, price, timeout, retries),
//! for the tools its allow and deny globs offer.

use worker_sdk::Tool;
use worker_sdk::mcp::{McpConnection, McpError, wrap_mcp_tools_where};

use crate::config::Server;

/// The tools `server` offers through `connection`, each declared as the config says.
pub async fn tools(server: &Server, connection: &McpConnection) -> Result<Vec<Tool>, McpError> {
    let wrapped = wrap_mcp_tools_where(connection, &server.prefix, |bare| server.offers(bare)).await?;
    Ok(wrapped
        .into_iter()
        .map(|(bare, tool)| declare(server, &bare, tool))
        .collect())
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
