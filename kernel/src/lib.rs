//! The kernel: a gRPC server that records every tool call of an agent in an append-only SQLite
//! log and runs it on a worker under a heartbeated lease.
//!
//! How the parts fit, from the edge inwards:
//! - [`grpc`] converts requests (and only it knows proto types), then calls
//! - [`scheduler`], the task that owns worker sessions, the queue of calls waiting for a slot and
//!   the leases of running calls, and
//! - [`store`], SQLite behind one writer thread that commits queued writes together and publishes
//!   committed events to the [`hub`], where waiting agents and watchers pick them up. The store
//!   loads records and saves changes; [`machine`] decides them: every rule of a run, its calls,
//!   their dispatches and approvals, with no I/O.
//! - [`retention`] deletes finished runs on request or past `--retain-finished`.
//! - [`registry`] holds the tools workers have registered; [`model`] the domain types.
//! - [`auth`] stands in front of every `kernel.v1` service: with an auth file, a request passes
//!   only with an API key holding the method's scope, and handlers see the key's name.
//!
//! - [`http`] serves the web console, `/metrics` ([`metrics`]) and health on `--http-listen`.
//!
//! [`server::run`] assembles them; `main` only parses [`config::Config`] and installs logging.

pub mod abandon;
pub mod auth;
#[cfg(test)]
mod clap_reference;
pub mod clock;
pub mod cluster;
pub mod config;
#[cfg(test)]
mod docs_commands;
pub mod error;
pub mod governance;
pub mod grpc;
pub mod http;
pub mod hub;
pub mod key_file;
pub mod lifecycle;
pub mod limits;
pub mod logs;
pub mod machine;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod policy;
pub mod receipts;
#[cfg(test)]
mod reference;
pub mod registry;
pub mod resources;
pub mod retention;
pub mod scheduler;
pub mod secrets;
pub mod server;
pub mod store;
pub mod tls;
pub mod traces;
pub mod validation;
pub mod wire;

pub use config::{Config, KernelCommand};
pub use error::KernelError;
