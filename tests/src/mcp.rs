//! MCP servers for the tests: the real ones `npm ci --prefix tests/mcp` installs, and `kernel-mcp`
//! wrapping them for a kernel under test.

use std::path::PathBuf;
use std::process::Command;

use crate::{Kernel, Process, binary};

/// A command `tests/mcp/package.json` installs (an MCP server, or the Node the conformance suite
/// runs on); panics, saying how to install it, when it is missing, so a test never passes without it.
pub fn npm_bin(name: &str) -> PathBuf {
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
    let mut command = Command::new(npm_bin("mcp-server-everything"));
    command.arg("streamableHttp").env("PORT", port.to_string());
    let process = Process::spawn(command, "mcp-server-everything");
    process.log.wait_for("listening on port");
    (process, format!("http://127.0.0.1:{port}/mcp"))
}

/// A kernel whose policy denies tool `fail` (the model reads `fail not allowed. reason: not today`).
pub fn kernel_denying_fail() -> Kernel {
    Kernel::start_with(crate::KernelOptions {
        policy: Some(
            "rules:\n  - id: no-failing\n    match: { tools: [fail] }\n    decision: deny\n    reason: not today\n"
                .into(),
        ),
        ..Default::default()
    })
}

impl Kernel {
    /// Starts `kernelctl mcp serve --listen` (with `args` after it) against this kernel on a free
    /// port; returns the process and its URL, `http://127.0.0.1:<port>/mcp`.
    pub fn mcp_serve_http(&self, args: &[&str]) -> (Process, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut command = Command::new(binary("kernelctl"));
        command
            .args(["--addr", &self.url(), "mcp", "serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(args);
        let process = Process::spawn(command, "kernelctl-mcp");
        process.log.wait_for("mcp server listening on");
        (process, format!("http://127.0.0.1:{port}/mcp"))
    }

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

/// The result in one of the MCP client's lines (`null` in a line of something else).
pub fn result_of(event: &serde_json::Value) -> &serde_json::Value {
    &event["result"]
}

/// The MCP client of `tests/mcp/client.py` (the official `mcp` package), run against the kernel's
/// MCP server; its JSON lines (tools, progress, results) are read as they come.
pub struct McpClient {
    pub process: Process,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl McpClient {
    /// Runs the client: `mode` `stdio` (`target` is the server's argv as JSON) or `http`
    /// (`target` is the URL, `headers` sent with every request), making `calls` in order.
    pub fn run(mode: &str, target: &str, calls: &serde_json::Value, headers: &serde_json::Value) -> McpClient {
        McpClient::run_with(mode, target, calls, headers, &[])
    }

    /// [`McpClient::run`] at MCP 2026-07-28: no session, each request with its own `_meta`; a
    /// call may carry `meta` and `answer` (`approve`, `reject`, `decline`, `cancel`: what the
    /// client's user answers a form the server asks). `env` as for [`McpClient::run_with`]
    /// (`MCP_CLIENT_NO_FORMS=1`: the client declares no elicitation).
    pub fn stateless(
        mode: &str,
        target: &str,
        calls: &serde_json::Value,
        headers: &serde_json::Value,
        env: &[(&str, &str)],
    ) -> McpClient {
        let mut env = env.to_vec();
        env.push(("MCP_CLIENT_REVISION", "2026-07-28"));
        McpClient::run_with(mode, target, calls, headers, &env)
    }

    /// [`McpClient::run`] with `env` set for the client (`MCP_CLIENT_KEEP_SESSION=1`: it leaves
    /// without deleting its HTTP session).
    pub fn run_with(
        mode: &str,
        target: &str,
        calls: &serde_json::Value,
        headers: &serde_json::Value,
        env: &[(&str, &str)],
    ) -> McpClient {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/client.py");
        let mut command = Command::new("python3");
        command
            .envs(env.iter().copied())
            .arg(script)
            .args([mode, target, &calls.to_string(), &headers.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start python3 for the MCP client: {e}"));
        let log = crate::Log::default();
        log.follow(child.stderr.take().expect("piped stderr"), "mcp-client");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let event = serde_json::from_str(&line).unwrap_or(serde_json::Value::String(line));
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        McpClient {
            process: Process::adopt(child, log, "mcp-client"),
            events,
        }
    }

    /// The client's next line; fails, with its log, if none comes in time (the `mcp` package
    /// missing included: `tests/run.sh --setup-only` installs it into target/venv).
    pub fn next(&self) -> serde_json::Value {
        self.events.recv_timeout(crate::WAIT).unwrap_or_else(|_| {
            panic!(
                "the MCP client printed nothing more; its log:\n{}",
                self.process.log.text()
            )
        })
    }

    /// Lines up to and including the first for which `found` holds.
    pub fn until(&self, found: impl Fn(&serde_json::Value) -> bool) -> Vec<serde_json::Value> {
        let mut seen = Vec::new();
        loop {
            let event = self.next();
            let done = found(&event);
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

/// The status line and headers of `body` (a JSON-RPC message) POSTed to `http://addr/mcp` with
/// `authorization`, as a client on the wire would send it.
pub fn post_head(addr: &str, authorization: Option<&str>, body: &str) -> String {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    head(
        addr,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The status line and headers of a GET of `path` at `addr`, sent without a key.
pub fn get_head(addr: &str, path: &str) -> String {
    head(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}

/// The status line and headers of the answer to `request` (raw HTTP/1.1) sent to `addr`. The head
/// comes first; an accepted request's event stream may stay open, so only that much is read.
fn head(addr: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).unwrap();
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.split("\r\n\r\n").next().unwrap_or_default().to_owned()
}
