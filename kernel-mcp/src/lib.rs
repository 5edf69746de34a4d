//! The kernel's side of MCP that other binaries share: [`serve`] serves the kernel's tools to MCP
//! clients (`kernelctl mcp serve`). The `kernel-mcp` binary, which wraps MCP servers' tools as a
//! worker, is this crate's `main.rs`.

pub mod serve;
