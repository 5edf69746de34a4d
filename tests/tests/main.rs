//! The end-to-end suite, one test binary: each module spawns the real kernel, workers and
//! kernelctl on port 0 through the shared harness (the `e2e` library), so the suite links once.
//! `cargo test -p e2e --test e2e <module>::` runs one module's tests.

mod auth;
mod bench_smoke;
mod boot;
mod branches;
mod budgets;
mod build;
mod calls;
mod cancel_call;
mod cli;
mod docs;
mod docs_run;
mod fair_shares;
mod fault_timing;
mod faults;
mod governance;
mod hosted;
mod hostile;
mod load;
mod mcp;
mod mcp_serve;
mod mcp_stateless;
mod nested_calls;
mod offers;
mod outcomes;
mod postgres;
mod protocol;
mod questions;
mod receipts;
mod replicas;
mod resources;
mod retention;
mod secrets;
mod stopping;
mod subagents;
mod tls;
mod tool_cache;
mod tool_limits;
mod traces;
