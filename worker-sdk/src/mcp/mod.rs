//! MCP servers' tools as worker tools (feature `mcp`): connect to a server over stdio or
//! Streamable HTTP with [`McpConnection`], then [`wrap_mcp_tools`] turns its tools into [`Tool`]s
//! a [`Worker`](crate::Worker) offers, beside tools of your own. Each call is then recorded,
//! governed and replayed by the kernel like any other.
//!
//! ```no_run
//! use worker_sdk::mcp::{McpConnection, wrap_mcp_tools};
//! use worker_sdk::{CancellationToken, Worker};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let mut command = tokio::process::Command::new("npx");
//! command.args(["-y", "@modelcontextprotocol/server-everything"]);
//! let server = McpConnection::stdio("everything", command).await?;
//! let tools = wrap_mcp_tools(&server, "everything").await?; // everything_echo, everything_get-sum, ...
//! let worker = Worker::builder("http://127.0.0.1:50051").name("mcp").tools(tools).build()?;
//! worker.run(CancellationToken::new()).await?;
//! # Ok(())
//! # }
//! ```

mod connection;
mod input;
mod task;
mod wrap;

pub use self::connection::{McpConnection, McpError};
pub use self::wrap::{McpTool, flatten_result, mcp_tool_id, wrap_mcp_tool, wrap_mcp_tools, wrap_mcp_tools_where};
