//! `kernelctl mcp serve`: the kernel's tools for MCP clients (see `kernel_mcp::serve`).

use globset::{Glob, GlobSetBuilder};
use kernel_mcp::serve::{self, Bridge};
use tokio_util::sync::CancellationToken;

use crate::args::{KernelAddr, McpServeArgs};
use crate::client::Access;

pub async fn serve(addr: &KernelAddr, access: &Access, args: McpServeArgs) -> Result<(), String> {
    let allow = if args.allow.is_empty() {
        None
    } else {
        let mut set = GlobSetBuilder::new();
        for pattern in &args.allow {
            set.add(Glob::new(pattern).map_err(|e| format!("--allow '{pattern}' is not a glob: {}", e.kind()))?);
        }
        Some(set.build().map_err(|e| e.to_string())?)
    };
    let tls = match &access.tls_ca {
        Some(ca) => Some(worker_sdk::Tls::from_ca_file(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?),
        None => None,
    };
    let bridge = Bridge {
        kernel: addr.as_str().to_owned(),
        tls,
        api_key: access.api_key.clone(),
        allow,
        labels: args.label.into_iter().collect(),
        session_idle: Some(std::time::Duration::from_millis(args.session_idle_timeout_ms)),
        // Whether the kernel has keys is the kernel's to say: each key is asked about.
        authenticate: true,
        resource: args.resource.map(|resource| serve::ProtectedResource {
            resource,
            authorization_servers: args.authorization_server.into_iter().collect(),
        }),
    };
    let Some(listen) = args.listen else {
        return serve::serve_stdio(bridge).await;
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("--listen {listen}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("mcp server listening on http://{bound}/mcp");
    let shutdown = CancellationToken::new();
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stopping.cancel();
    });
    serve::serve_http(bridge, listener, shutdown).await
}
