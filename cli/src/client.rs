//! The connection to the kernel: one HTTP/2 channel shared by the generated service clients.
//!
//! Connecting is eager, so an unreachable kernel is reported once, as
//! [`CliError::Connect`], before any command runs; a kernel that goes away later surfaces as a
//! gRPC `unavailable` status from the call that noticed.

use std::time::Duration;

use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use kernel_proto::v1::registry_service_client::RegistryServiceClient;
use kernel_proto::v1::run_service_client::RunServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::args::KernelAddr;
use crate::error::{CliError, error_chain};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a unary call may take; `runs events --follow` streams without a deadline.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Awaits a unary call for at most [`CALL_TIMEOUT`], so a wedged kernel cannot hang the command;
/// dropping the call on timeout resets its HTTP/2 stream, which the kernel sees as a cancel.
pub async fn unary<T>(call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>) -> Result<T, CliError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(response) => Ok(response?.into_inner()),
        Err(_) => Err(CliError::Timeout(CALL_TIMEOUT)),
    }
}

/// Clients of the services `kernelctl` reads and steers.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub runs: RunServiceClient<Channel>,
    pub registry: RegistryServiceClient<Channel>,
    pub approvals: ApprovalServiceClient<Channel>,
}

impl Kernel {
    /// Opens a channel to the kernel at `addr`.
    pub async fn connect(addr: &KernelAddr) -> Result<Self, CliError> {
        let unreachable = |err: &(dyn std::error::Error + 'static)| CliError::Connect {
            addr: addr.to_string(),
            cause: error_chain(err),
        };
        let endpoint = Endpoint::from_shared(addr.as_str().to_owned())
            .map_err(|err| unreachable(&err))?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = endpoint.connect().await.map_err(|err| unreachable(&err))?;
        Ok(Self {
            runs: RunServiceClient::new(channel.clone()),
            approvals: ApprovalServiceClient::new(channel.clone()),
            registry: RegistryServiceClient::new(channel),
        })
    }
}
