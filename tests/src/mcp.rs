//! MCP servers for the tests: the real ones `npm ci --prefix tests/mcp` installs, and `kernel-mcp`
//! wrapping them for a kernel under test.

use std::path::PathBuf;
use std::process::Command;

use crate::{Kernel, Process, binary};

/// The command of an MCP server from `tests/mcp/package.json`; panics, saying how to install it,
/// when it is missing, so a test never passes without its server.
pub fn server_bin(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("mcp/node_modules/.bin")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: install the MCP servers with `npm ci --prefix tests/mcp` (Node 20 and npm)",
        path.display()
    );
    path
}

/// `server-everything` over Streamable HTTP on a port of its own; its URL is `http://127.0.0.1:<port>/mcp`.
pub fn everything_over_http() -> (Process, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let mut command = Command::new(server_bin("mcp-server-everything"));
    command.arg("streamableHttp").env("PORT", port.to_string());
    let process = Process::spawn(command, "mcp-server-everything");
    process.log.wait_for("listening on port");
    (process, format!("http://127.0.0.1:{port}/mcp"))
}

impl Kernel {
    /// Starts `kernel-mcp` with `config` (YAML) against this kernel and waits for its first
    /// worker session.
    pub fn mcp_worker(&self, config: &str) -> Process {
        let path = self.dir.path().join("mcp.yaml");
        std::fs::write(&path, config).expect("write the mcp config");
        let mut command = Command::new(binary("kernel-mcp"));
        command
            .arg("--config")
            .arg(&path)
            .arg("--kernel")
            .arg(self.url())
            .env("RUST_LOG", "info,rmcp=warn");
        let process = Process::spawn(command, "kernel-mcp");
        process.log.wait_for("worker session open");
        process
    }
}
