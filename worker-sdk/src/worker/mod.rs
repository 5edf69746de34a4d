//! The worker: serves a set of tools to the kernel over one session at a time, reconnecting
//! when the connection breaks, draining when told to stop.
//!
//! [`Worker::run`] loops over sessions (see the `session` module). A refused registration
//! ends it with an error; a broken connection is retried with exponential backoff and jitter
//! (100 ms doubling to 5 s); cancelling the shutdown token drains the open session and returns.

pub(crate) mod cache;
pub(crate) mod context;
pub(crate) mod session;
mod wire;

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::auth::ApiKey;
use crate::backoff::Backoff;
use crate::deps::Deps;
use crate::hosted::Agent;
use crate::tls::Tls;
use crate::tool::{Tool, ToolDefinitionError};
use crate::transport;
use session::{SessionEnd, SessionError};

/// Calls a worker runs at once unless told otherwise.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 8;
/// How long a draining worker waits for its calls in flight unless told otherwise.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const RECONNECT_INITIAL: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Why a worker could not be built or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A builder setting is unusable.
    #[error("invalid worker configuration: {0}")]
    Config(String),
    /// A tool definition the kernel would refuse.
    #[error(transparent)]
    Tool(#[from] ToolDefinitionError),
    /// The kernel refused the session (bad tool spec, conflicting fingerprint, denied): trying
    /// again would not help.
    #[error("kernel refused the worker session: {message}")]
    Refused {
        /// The gRPC status code the kernel answered with.
        code: tonic::Code,
        /// The kernel's explanation.
        message: String,
    },
}

/// What every session of a worker shares.
#[derive(Debug)]
pub(crate) struct WorkerConfig {
    pub(crate) endpoint: String,
    pub(crate) name: String,
    pub(crate) max_concurrency: u32,
    pub(crate) tools: BTreeMap<String, Tool>,
    pub(crate) agents: BTreeMap<String, Agent>,
    pub(crate) deps: Deps,
    pub(crate) drain_timeout: Duration,
    pub(crate) tls: Option<Tls>,
    pub(crate) api_key: Option<ApiKey>,
    pub(crate) ephemeral_tools: bool,
}

/// Configures a [`Worker`]; start with [`Worker::builder`].
#[derive(Debug)]
pub struct WorkerBuilder {
    addr: String,
    name: String,
    max_concurrency: u32,
    tools: Vec<Tool>,
    agents: Vec<Agent>,
    deps: Deps,
    drain_timeout: Duration,
    tls: Option<Tls>,
    api_key: Option<String>,
    ephemeral_tools: bool,
}

impl WorkerBuilder {
    /// The name the kernel lists the worker under (default `worker`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Calls run at once, at least 1 (default 8). The kernel never sends more.
    pub fn max_concurrency(mut self, max_concurrency: u32) -> Self {
        self.max_concurrency = max_concurrency;
        self
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Hosts an agent: the kernel sends this worker runs of it, and each run's handler runs
    /// here within the worker's slots (see [`Agent`]).
    pub fn agent(mut self, agent: Agent) -> Self {
        self.agents.push(agent);
        self
    }

    /// Adds several tools.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// Registers a value tools reach with [`ToolContext::deps`](crate::ToolContext::deps), by type;
    /// a later value of the same type replaces an earlier one.
    pub fn deps<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.deps.insert(value);
        self
    }

    /// How long shutdown waits for calls in flight before it abandons them (default 10 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Connects over TLS with these settings (see [`Tls`] for how they go with the address).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sends `secret` as `authorization: Bearer <secret>` when opening a session, for a kernel
    /// that requires API keys. The key needs `workers:connect`, and its tool globs must cover
    /// every tool this worker offers, or the kernel refuses the session.
    pub fn api_key(mut self, secret: impl Into<String>) -> Self {
        self.api_key = Some(secret.into());
        self
    }

    /// Asks the kernel to forget this worker's tools once no session offers them (for benchmarks
    /// and tests, whose tools should not stay in `tools list` or in unknown-tool messages). By
    /// default a tool stays registered after its workers leave.
    pub fn ephemeral_tools(mut self) -> Self {
        self.ephemeral_tools = true;
        self
    }

    /// Checks the configuration and every tool the way the kernel will.
    pub fn build(self) -> Result<Worker, WorkerError> {
        transport::secure_endpoint(&self.addr, self.tls.as_ref())
            .map_err(|error| WorkerError::Config(format!("kernel address '{}': {error}", self.addr)))?;
        if self.name.trim().is_empty() {
            return Err(WorkerError::Config("the worker name is empty".into()));
        }
        let api_key = self
            .api_key
            .as_deref()
            .map(ApiKey::new)
            .transpose()
            .map_err(WorkerError::Config)?;
        if self.max_concurrency == 0 {
            return Err(WorkerError::Config("max_concurrency must be at least 1".into()));
        }
        if self.tools.is_empty() && self.agents.is_empty() {
            return Err(WorkerError::Config(
                "the worker offers no tools and hosts no agents".into(),
            ));
        }
        let mut agents = BTreeMap::new();
        for agent in self.agents {
            agent.validate()?;
            let name = agent.definition().name.clone();
            if agents.insert(name.clone(), agent).is_some() {
                return Err(ToolDefinitionError::DuplicateName(name).into());
            }
        }
        let mut tools = BTreeMap::new();
        for tool in self.tools {
            tool.validate()?;
            let name = tool.definition().name.clone();
            if tools.insert(name.clone(), tool).is_some() {
                return Err(ToolDefinitionError::DuplicateName(name).into());
            }
        }
        Ok(Worker {
            config: Arc::new(WorkerConfig {
                endpoint: self.addr,
                name: self.name,
                max_concurrency: self.max_concurrency,
                tools,
                agents,
                deps: self.deps,
                drain_timeout: self.drain_timeout,
                tls: self.tls,
                api_key,
                ephemeral_tools: self.ephemeral_tools,
            }),
        })
    }
}

/// A process's connection to the kernel, serving its tools.
///
/// ```no_run
/// use worker_sdk::{tool, CancellationToken, ToolContext, ToolError, Worker};
///
/// /// Adds two integers.
/// #[tool]
/// async fn add(_ctx: ToolContext, a: i64, b: i64) -> Result<i64, ToolError> {
///     Ok(a + b)
/// }
///
/// # async fn example() -> Result<(), worker_sdk::WorkerError> {
/// let worker = Worker::builder("127.0.0.1:50051").name("math").tool(add_tool()).build()?;
/// let shutdown = CancellationToken::new();
/// worker.run(shutdown).await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Worker {
    config: Arc<WorkerConfig>,
}

impl Worker {
    /// Starts configuring a worker for the kernel at `kernel_addr`
    /// (`http://127.0.0.1:50051`, or `127.0.0.1:50051`).
    pub fn builder(kernel_addr: impl Into<String>) -> WorkerBuilder {
        WorkerBuilder {
            addr: kernel_addr.into(),
            name: "worker".into(),
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            tools: Vec::new(),
            agents: Vec::new(),
            deps: Deps::default(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            tls: None,
            api_key: None,
            ephemeral_tools: false,
        }
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The tools the worker offers, by name.
    pub fn tools(&self) -> impl Iterator<Item = &Tool> {
        self.config.tools.values()
    }

    /// Serves tools until `shutdown` is cancelled, then drains and returns `Ok(())`.
    ///
    /// Reconnects after a broken connection. Returns [`WorkerError::Refused`] when the kernel
    /// refuses the registration.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        crate::logs::show_by_default();
        // Shared by every session, so calls left running by a lost session count against the limit.
        let slots = Arc::new(Semaphore::new(self.config.max_concurrency as usize));
        let mut backoff = Backoff::new(RECONNECT_INITIAL, RECONNECT_MAX);
        let mut attempt: u32 = 0;
        let mut hint: Option<String> = None;
        loop {
            match session::run(&self.config, &slots, &shutdown).await {
                Ok(SessionEnd::Stopped | SessionEnd::Drained) => {
                    info!(worker = %self.config.name, "worker stopped");
                    return Ok(());
                }
                Err(SessionError::Refused(status)) => {
                    error!(worker = %self.config.name, code = ?status.code(), error = status.message(), "kernel refused the worker session");
                    return Err(WorkerError::Refused {
                        code: status.code(),
                        message: status.message().to_owned(),
                    });
                }
                Err(SessionError::Lost { error, opened }) => {
                    if opened {
                        backoff.reset();
                        attempt = 0;
                    }
                    attempt += 1;
                    let delay = backoff.next_delay();
                    let retry_in_ms = delay.as_millis() as u64;
                    if opened {
                        warn!(worker = %self.config.name, attempt, retry_in_ms, error, "kernel session lost, reconnecting");
                    } else {
                        // The hint is looked for once per streak of failures, and repeated on each retry.
                        if attempt == 1 {
                            hint = crate::transport::diagnose(&self.config.endpoint, &error)
                                .await
                                .filter(|hint| !error.contains(hint.as_str()));
                        }
                        warn!(
                            worker = %self.config.name,
                            kernel = %self.config.endpoint,
                            attempt,
                            retry_in_ms,
                            error,
                            hint,
                            "cannot reach the kernel, reconnecting"
                        );
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => {
                            info!(worker = %self.config.name, "worker stopped");
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{ToolError, wrap_tool};

    fn noop(name: &str) -> Tool {
        wrap_tool(name, "Does nothing.", json!({"type": "object"}), |_ctx, _args| async {
            Ok::<_, ToolError>(())
        })
    }

    #[test]
    fn build_checks_what_the_kernel_would_refuse() {
        let error = |builder: WorkerBuilder| builder.build().unwrap_err().to_string();
        assert!(Worker::builder("127.0.0.1:1").tool(noop("a")).build().is_ok());
        assert_eq!(
            error(Worker::builder("127.0.0.1:1")),
            "invalid worker configuration: the worker offers no tools and hosts no agents"
        );
        assert_eq!(
            error(Worker::builder("127.0.0.1:1").tool(noop("a")).max_concurrency(0)),
            "invalid worker configuration: max_concurrency must be at least 1"
        );
        assert_eq!(
            error(Worker::builder("127.0.0.1:1").tool(noop("a")).tool(noop("a"))),
            "tool 'a' is offered twice"
        );
        assert!(error(Worker::builder("127.0.0.1:1").tool(noop("a b"))).starts_with("invalid tool name 'a b'"));
        assert!(error(Worker::builder("http://bad host").tool(noop("a"))).starts_with("invalid worker configuration"));
    }

    #[tokio::test]
    async fn shutdown_during_reconnects_returns_ok() {
        // Nothing listens on port 1: every connect fails and the worker keeps retrying.
        let worker = Worker::builder("127.0.0.1:1").tool(noop("a")).build().unwrap();
        let shutdown = CancellationToken::new();
        let stopper = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stopper.cancel();
        });
        tokio::time::timeout(Duration::from_secs(5), worker.run(shutdown))
            .await
            .expect("run returns soon after shutdown")
            .unwrap();
    }
}
