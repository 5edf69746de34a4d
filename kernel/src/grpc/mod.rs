//! The gRPC boundary. Each service converts requests with [`convert`], calls the store, the
//! scheduler and the hub, and maps errors through the one `From<KernelError> for Status`. Only this
//! module imports generated types.

mod admin;
mod approvals;
pub mod convert;
mod fork;
mod hosted;
mod registry;
mod runs;
mod tool_calls;
mod workers;

use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::registry::Registry;
use crate::scheduler::Scheduler;
use crate::store::Store;

pub use admin::AdminApi;
pub use approvals::ApprovalApi;
pub use hosted::HostedApi;
pub use registry::RegistryApi;
pub use runs::RunApi;
pub use tool_calls::ToolCallApi;
pub use workers::WorkerApi;

/// What every service shares.
#[derive(Clone)]
pub struct Kernel {
    pub store: Store,
    pub hub: Hub,
    pub registry: Registry,
    pub scheduler: Scheduler,
    pub governance: crate::governance::Governance,
    /// Cancelled when the kernel stops taking new work: health says not serving, new turns and
    /// worker sessions are refused, running calls finish.
    pub draining: CancellationToken,
    /// Cancelled when every stream must end.
    pub shutdown: CancellationToken,
    /// Timeout of a call whose tool declares none.
    pub default_timeout_ms: u64,
    /// Limits on agents, workers and connections.
    pub limits: crate::limits::Limits,
    /// One permit per open worker session, `limits.max_sessions` in all.
    pub sessions: std::sync::Arc<tokio::sync::Semaphore>,
    /// When this process started serving.
    pub started_at: crate::model::Millis,
    /// Where other replicas and clients reach this kernel (`--advertise`, else its listening address).
    pub address: std::sync::Arc<str>,
    /// The API keys in force; `None` when authentication is off.
    pub keys: Option<std::sync::Arc<crate::auth::Keys>>,
    /// The key receipts are signed with; `None` on PostgreSQL without `--receipt-key`.
    pub receipt_key: Option<std::sync::Arc<ed25519_dalek::SigningKey>>,
    /// The key secret fields are hashed and sealed with; `None` on PostgreSQL without
    /// `--secret-key`, which refuses calls that carry secret values.
    pub secret_key: Option<std::sync::Arc<crate::secrets::SecretKey>>,
}

impl Kernel {
    /// Waits for a change of the run `live` follows that may settle one of its steps (any event
    /// but a step's own result, which a hosted handler's replies carry; or a lag, to read again).
    pub(crate) async fn next_change(&self, live: &mut crate::hub::Subscription) -> Result<(), crate::KernelError> {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => {
                    return Err(crate::KernelError::Unavailable("kernel shutting down".into()));
                }
                signal = live.recv() => match signal {
                    Ok(crate::hub::Signal::Events(events))
                        if events.iter().any(|item| item.event.kind != crate::model::EventType::StepResult) => return Ok(()),
                    Ok(_) => continue,
                    Err(_) => return Ok(()),
                },
            }
        }
    }

    /// Refuses new work once the kernel drains to stop; `then` says what the caller may do.
    pub(crate) fn taking_work(&self, then: &str) -> Result<(), crate::KernelError> {
        if self.draining.is_cancelled() {
            return Err(crate::KernelError::Unavailable(format!(
                "kernel draining to stop; {then} once it is back, or on another replica"
            )));
        }
        Ok(())
    }
}

/// The size of each response stream's buffer.
const STREAM_BUFFER: usize = 64;
