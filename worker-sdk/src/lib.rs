//! Write tools as Rust functions, serve them to the kernel from a worker, and drive runs as an agent.
//!
//! The kernel records every tool call of an agent's run, applies policy, and hands each call to
//! a **worker** that offers the tool. This crate is both ends of that:
//!
//! - **Tools.** A [`Tool`] is a name, a description, a JSON Schema of its arguments, a version,
//!   declared behaviour ([`ToolOptions`]: timeout, retries, idempotency, risk, approval…) and a
//!   function. The [`#[tool]`](macro@tool) attribute makes one from an ordinary `async fn`
//!   (the schema comes from the parameter types, the description from the doc comment);
//!   [`wrap_tool`] and [`wrap_blocking_tool`] make one from a closure over JSON. A tool returns
//!   `Result<T, ToolError>`; the [`ErrorKind`] of a [`ToolError`] tells the kernel whether to retry.
//! - **The context.** Each call gets a [`ToolContext`]: run id, idempotency key (stable across
//!   retries, so side effects can be made to happen once), attempt, cancellation, a progress
//!   emitter, the tool's own store-backed [`cache`](ToolContext::cache) ([`ToolCache`]: get /
//!   set with a TTL, namespaced per tool), and the application's shared values ("deps") by type.
//! - **The worker.** [`Worker`] keeps one streaming session open to the kernel: it announces
//!   its tools, runs dispatched calls (at most `max_concurrency` at once), heartbeats to keep
//!   their leases, reconnects with backoff when the connection breaks, and drains on shutdown.
//! - **The agent.** [`AgentClient`] creates runs and submits each model turn's tool calls
//!   ([`RunHandle::submit_turn`]); results come back in position order once recorded, and a
//!   resubmitted turn gets the recorded results instead of running tools twice.
//! - **TLS.** For a kernel served over `https://`, both take [`Tls`] settings: the kernel's CA,
//!   optionally a client certificate (which a kernel with `--tls-client-ca` requires of workers)
//!   and a domain name override.
//!
//! The source is laid out by side: `tool/` (definitions), `worker/` (the session, the context,
//! the cache) and `agent/` (the client and its outcomes), each converting its own protocol
//! messages in its own `wire.rs`, so the agent side never imports the worker side.
//!
//! ```no_run
//! use serde_json::json;
//! use worker_sdk::{tool, AgentClient, CancellationToken, Call, NewRun, ToolContext, ToolError, Worker};
//!
//! /// Adds two integers.
//! #[tool(timeout = 5, read_only)]
//! async fn add(_ctx: ToolContext, a: i64, b: i64) -> Result<i64, ToolError> {
//!     Ok(a + b)
//! }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // A worker process serves the tool until shutdown is cancelled.
//! let shutdown = CancellationToken::new();
//! let worker = Worker::builder("127.0.0.1:50051").name("math").tool(add_tool()).build()?;
//! tokio::spawn(async move { worker.run(shutdown).await });
//!
//! // An agent process calls it through the kernel.
//! let agent = AgentClient::connect("127.0.0.1:50051").await?;
//! let run = agent.create_run(NewRun::new("calculator", json!({"goal": "add"}))).await?;
//! let results = run.call_turn(0, vec![Call::new("add", json!({"a": 2, "b": 3}))]).await?;
//! assert_eq!(results[0].content, "5");
//! run.complete(json!({"sum": 5})).await?;
//! # Ok(())
//! # }
//! ```
//!
//! `#[tool]` refuses at compile time what the kernel would refuse at registration, such as a tool
//! declared both read-only and writing, or an option it does not know:
//!
//! ```compile_fail
//! # use worker_sdk::{tool, ToolContext, ToolError};
//! /// Deletes a file.
//! #[tool(read_only, writes)] // error: a tool cannot be both `read_only` and `writes`
//! async fn delete(_ctx: ToolContext, path: String) -> Result<(), ToolError> { Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use worker_sdk::{tool, ToolContext, ToolError};
//! /// Deletes a file.
//! #[tool(retries = 3)] // error: unknown #[tool] option `retries`; expected one of: name, ...
//! async fn delete(_ctx: ToolContext, path: String) -> Result<(), ToolError> { Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use worker_sdk::{tool, ToolContext, ToolError};
//! /// Charges a card.
//! #[tool(cache_ttl = 60)] // error: `cache_ttl` needs `read_only`
//! async fn charge(_ctx: ToolContext, cents: i64) -> Result<(), ToolError> { Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use worker_sdk::{tool, ToolContext, ToolError};
//! #[tool] // error: the model would see no description of this tool: add a doc comment or `description = "..."`
//! async fn undocumented(_ctx: ToolContext) -> Result<(), ToolError> { Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use worker_sdk::{tool, ToolContext, ToolError};
//! /// Charges a card.
//! #[tool("charge", name = "bill")] // error: the tool id is given twice
//! async fn charge(_ctx: ToolContext) -> Result<(), ToolError> { Ok(()) }
//! ```
//!
//! `#[agent]` refuses a handler the model of a hosted agent cannot describe:
//!
//! ```compile_fail
//! # use worker_sdk::{agent, AgentContext, AgentError};
//! #[agent] // error: the agent has no description: add a doc comment or `description = "..."`
//! async fn silent(_ctx: AgentContext, _input: serde_json::Value) -> Result<(), AgentError> { Ok(()) }
//! ```
//!
//! ```compile_fail
//! # use worker_sdk::{agent, AgentContext, AgentError};
//! /// Not async.
//! #[agent] // error: an #[agent] handler is an async fn(AgentContext, Input) -> Result<Output, AgentError>
//! fn blocking(_ctx: AgentContext, _input: serde_json::Value) -> Result<(), AgentError> { Ok(()) }
//! ```
//!
//! Protocol messages (`kernel_proto::v1`) appear only where the SDK reports what the kernel
//! recorded ([`Tool::spec`], [`RunSnapshot`]); the crate is re-exported as [`proto`].

#![warn(missing_docs)]

mod agent;
mod auth;
mod backoff;
mod deps;
mod error;
mod fields;
mod hosted;
mod logs;
#[cfg(feature = "mcp")]
pub mod mcp;
mod tls;
mod tool;
mod trace;
mod transport;
mod worker;

#[doc(hidden)]
pub mod __private;

pub use agent::outcome::{ApprovalAnswer, ApprovalDecision, Outcome, ToolCallRejected};
pub use agent::{
    AgentClient, AgentError, AgentQuestion, BudgetLimit, Call, CallOutcome, CallStatus, Capture, Fork, Interruption,
    NewRun, ProgressUpdate, RunHandle, RunPage, RunQuery, RunSnapshot, TurnItem,
};
pub use backoff::Backoff;
pub use error::{ErrorKind, ToolError};
/// The stream a streaming tool returns, and the combinators that build one (from `futures-util`).
pub use futures_util::{Stream, stream};
pub use hosted::{
    Agent, AgentContext, AgentDefinition, AgentFuture, HandlerQuestion, SessionInfo, StepEffect, StepInfo, Subagent,
};
pub use kernel_proto as proto;
pub use tls::Tls;
/// The cancellation token of [`ToolContext::cancellation`] and [`Worker::run`] (from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
pub use tool::{
    Approval, DEFAULT_TOOL_VERSION, Effect, Idempotency, Invoker, MAX_TOOL_NAME_LEN, RetryPolicy, RiskLevel, Tool,
    ToolDefinition, ToolDefinitionError, ToolFuture, ToolLimit, ToolOptions, validate_tool_name, wrap_blocking_tool,
    wrap_stream_tool, wrap_tool,
};
pub use trace::TraceContext;
pub use transport::{connection_hint, diagnose};
pub use worker::cache::ToolCache;
pub use worker::context::{Progress, ToolContext, ToolSubagent};
pub use worker::{DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_CONCURRENCY, Worker, WorkerBuilder, WorkerError};
pub use worker_sdk_macros::{agent, tool};

/// The book's pages that hold ```rust blocks, so `cargo test -p worker-sdk --doc` compiles each
/// block against this crate as a reader would paste it (a fragment that cannot compile says so
/// with `rust,ignore` and a comment above it). The docs test of the e2e package checks that every
/// page with a ```rust block is listed here. Only under `cfg(doctest)`: no API docs come of it.
#[cfg(doctest)]
mod book {
    #[doc = include_str!("../../docs/getting-started/rust.md")]
    mod getting_started_rust {}
    #[doc = include_str!("../../docs/guides/budgets.md")]
    mod guides_budgets {}
    #[doc = include_str!("../../docs/guides/hosted-agents.md")]
    mod guides_hosted_agents {}
    #[doc = include_str!("../../docs/guides/limits.md")]
    mod guides_limits {}
    #[doc = include_str!("../../docs/guides/security.md")]
    mod guides_security {}
    #[doc = include_str!("../../docs/guides/writing-tools.md")]
    mod guides_writing_tools {}
    #[doc = include_str!("../../docs/reference/outcomes.md")]
    mod reference_outcomes {}
}
