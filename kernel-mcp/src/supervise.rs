//! Keeps one MCP server connected and its tools offered: connects (starting the command, for a
//! stdio server), lists and declares its tools, and offers them over a worker session of its own.
//! When the server says its tools changed, the session drains (calls in flight finish) and a new
//! one offers the new list. When the server dies, its session ends at once, so the kernel handles
//! the calls in flight as calls of a lost worker, by their idempotency (a `safe_to_retry` call runs
//! again once the server is back, an `at_most_once` call is indeterminate), and the server is
//! started again with backoff. One session per server keeps one server's trouble from touching
//! another's calls.

use std::pin::pin;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use worker_sdk::mcp::{McpConnection, McpError};
use worker_sdk::{Backoff, Tool};

use crate::config::{Server, Transport};

/// A connection that lived this long was healthy: the next restart starts the backoff again.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// How the worker sessions reach the kernel.
#[derive(Clone)]
pub struct Session {
    /// `Worker::builder` with the kernel address, name prefix, TLS and API key already set.
    pub builder: std::sync::Arc<dyn Fn(&str) -> worker_sdk::WorkerBuilder + Send + Sync>,
}

/// Runs until `shutdown`: connects `server`, offers its tools, follows list changes, and
/// reconnects when the server's session ends.
pub async fn supervise(server: Server, session: Session, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    loop {
        let connected = tokio::select! {
            connected = connect(&server) => connected,
            _ = shutdown.cancelled() => return,
        };
        match connected {
            Ok(connection) => {
                connection.hold_lost_calls();
                let since = Instant::now();
                info!(server = server.name, "mcp server connected");
                if offer(&server, &connection, &session, &shutdown).await {
                    return;
                }
                if since.elapsed() >= HEALTHY_AFTER {
                    backoff.reset();
                }
                warn!(
                    server = server.name,
                    "mcp server session ended; its tools are withdrawn until it is back"
                );
            }
            Err(error) => warn!(server = server.name, %error, "cannot connect to the mcp server"),
        }
        let delay = backoff.next_delay();
        info!(
            server = server.name,
            delay_ms = delay.as_millis() as u64,
            "restarting the mcp server"
        );
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Offers the server's tools, again after every list change, until the server's session ends
/// (`false`) or shutdown (`true`).
async fn offer(server: &Server, connection: &McpConnection, session: &Session, shutdown: &CancellationToken) -> bool {
    let mut changes = connection.list_changes();
    loop {
        changes.borrow_and_update();
        let tools = match crate::declare::tools(server, connection).await {
            Ok(tools) => tools,
            Err(error) => {
                warn!(server = server.name, %error, "cannot list the mcp server's tools");
                return false;
            }
        };
        let names: Vec<&str> = tools.iter().map(|t| t.definition().name.as_str()).collect();
        info!(server = server.name, tools = ?names, "mcp tools listed");
        match run_session(server, session, tools, connection, &mut changes, shutdown).await {
            Ended::Changed => info!(server = server.name, "mcp tool list changed; registering it again"),
            Ended::Closed => return false,
            Ended::Shutdown => return true,
        }
    }
}

enum Ended {
    Changed,
    Closed,
    Shutdown,
}

/// One worker session offering `tools` (none: no session, the list is awaited).
async fn run_session(
    server: &Server,
    session: &Session,
    tools: Vec<Tool>,
    connection: &McpConnection,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    shutdown: &CancellationToken,
) -> Ended {
    if tools.is_empty() {
        warn!(
            server = server.name,
            "the mcp server offers no tools (after allow and deny)"
        );
        return idle(connection, changes, shutdown).await;
    }
    let worker = match (session.builder)(&server.name).tools(tools).build() {
        Ok(worker) => worker,
        Err(error) => {
            warn!(server = server.name, %error, "the mcp tools cannot be offered");
            return tokio::select! {
                _ = changes.changed() => Ended::Changed,
                _ = connection.closed() => Ended::Closed,
                _ = shutdown.cancelled() => Ended::Shutdown,
            };
        }
    };
    loop {
        let stop = CancellationToken::new();
        let mut running = pin!(worker.run(stop.clone()));
        tokio::select! {
            biased;
            ended = &mut running => {
                // A refused registration (another worker offers one of these names under another
                // definition) may clear once that worker goes: try again after a pause.
                if let Err(error) = ended {
                    warn!(server = server.name, %error, "worker session ended; trying again");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                    _ = connection.closed() => return Ended::Closed,
                    _ = shutdown.cancelled() => return Ended::Shutdown,
                }
            }
            // Dropping the session at once: its calls in flight can no longer be answered, and
            // the kernel decides what becomes of them when it sees the session end.
            _ = connection.closed() => return Ended::Closed,
            // The sender goes with the MCP session: an error is the session's end, not a change.
            changed = changes.changed() => {
                if changed.is_err() {
                    return Ended::Closed;
                }
                stop.cancel();
                let _ = running.await;
                return Ended::Changed;
            }
            _ = shutdown.cancelled() => {
                stop.cancel();
                let _ = running.await;
                return Ended::Shutdown;
            }
        }
    }
}

/// Waits, offering nothing, for the list to change or the session to end.
async fn idle(
    connection: &McpConnection,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    shutdown: &CancellationToken,
) -> Ended {
    tokio::select! {
        biased;
        _ = connection.closed() => Ended::Closed,
        changed = changes.changed() => if changed.is_err() { Ended::Closed } else { Ended::Changed },
        _ = shutdown.cancelled() => Ended::Shutdown,
    }
}

async fn connect(server: &Server) -> Result<McpConnection, McpError> {
    match &server.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut process = tokio::process::Command::new(command);
            process.args(args).envs(env).kill_on_drop(true);
            if let Some(cwd) = cwd {
                process.current_dir(cwd);
            }
            McpConnection::stdio(server.name.clone(), process).await
        }
        Transport::Http { url, headers } => {
            let headers = headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            McpConnection::http(server.name.clone(), url, &headers).await
        }
    }
}
