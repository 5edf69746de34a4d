//! The connection to the kernel: one HTTP/2 channel shared by the generated service clients.
//!
//! Connecting is eager, so an unreachable kernel is reported once, as
//! [`CliError::Connect`], before any command runs; a kernel that goes away later surfaces as a
//! gRPC `unavailable` status from the call that noticed.

use std::path::PathBuf;
use std::time::Duration;

use kernel_proto::v1::admin_service_client::AdminServiceClient;
use kernel_proto::v1::approval_service_client::ApprovalServiceClient;
use kernel_proto::v1::registry_service_client::RegistryServiceClient;
use kernel_proto::v1::run_service_client::RunServiceClient;
use kernel_proto::v1::tool_call_service_client::ToolCallServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

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
    pub runs: RunServiceClient<Authed>,
    pub calls: ToolCallServiceClient<Authed>,
    pub registry: RegistryServiceClient<Authed>,
    pub approvals: ApprovalServiceClient<Authed>,
    pub admin: AdminServiceClient<Authed>,
}

/// The channel under every client, adding the API key (if any) to each call.
pub type Authed = InterceptedService<Channel, ApiKey>;

/// `authorization: Bearer <key>` for every call, when `kernelctl` was given `--api-key`.
#[derive(Clone, Default)]
pub struct ApiKey(Option<MetadataValue<Ascii>>);

impl ApiKey {
    /// Checks `secret` once, before any call carries it.
    pub fn new(secret: Option<&str>) -> Result<Self, CliError> {
        let Some(secret) = secret.map(str::trim) else {
            return Ok(ApiKey(None));
        };
        let invalid = || CliError::ApiKey("must be non-empty visible ASCII without spaces".into());
        if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid());
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {secret}").parse().map_err(|_| invalid())?;
        value.set_sensitive(true);
        Ok(ApiKey(Some(value)))
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ApiKey(..)" } else { "ApiKey(None)" })
    }
}

impl Interceptor for ApiKey {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// What it takes to reach the kernel besides its address: the CA to trust for TLS and the API key
/// to send. Queries and `bench` (its agent and its workers) use the same.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub tls_ca: Option<PathBuf>,
    pub api_key: Option<String>,
}

impl Access {
    /// An endpoint for `addr`, over TLS trusting [`Access::tls_ca`] when given.
    pub fn endpoint(&self, addr: &KernelAddr) -> Result<Endpoint, CliError> {
        let endpoint = Endpoint::from_shared(addr.as_str().to_owned())
            .map_err(|err| unreachable(addr, &err))?
            .connect_timeout(CONNECT_TIMEOUT);
        let Some(path) = &self.tls_ca else {
            return Ok(endpoint);
        };
        let tls_error = |cause: String| CliError::TlsCa {
            path: path.display().to_string(),
            cause,
        };
        let ca = std::fs::read(path).map_err(|err| tls_error(err.to_string()))?;
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        endpoint.tls_config(tls).map_err(|err| tls_error(error_chain(&err)))
    }

    /// The key every call carries, checked.
    pub fn api_key(&self) -> Result<ApiKey, CliError> {
        ApiKey::new(self.api_key.as_deref())
    }
}

/// The kernel at `addr` could not be reached.
pub fn unreachable(addr: &KernelAddr, err: &(dyn std::error::Error + 'static)) -> CliError {
    CliError::Connect {
        addr: addr.to_string(),
        cause: error_chain(err),
    }
}

impl Kernel {
    /// Opens a channel to the kernel at `addr` with `access` (TLS and API key, when given).
    pub async fn connect(addr: &KernelAddr, access: &Access) -> Result<Self, CliError> {
        let api_key = access.api_key()?;
        let channel = access
            .endpoint(addr)?
            .connect()
            .await
            .map_err(|err| unreachable(addr, &err))?;
        Ok(Self {
            runs: RunServiceClient::with_interceptor(channel.clone(), api_key.clone()),
            calls: ToolCallServiceClient::with_interceptor(channel.clone(), api_key.clone()),
            approvals: ApprovalServiceClient::with_interceptor(channel.clone(), api_key.clone()),
            admin: AdminServiceClient::with_interceptor(channel.clone(), api_key.clone()),
            registry: RegistryServiceClient::with_interceptor(channel, api_key),
        })
    }
}
