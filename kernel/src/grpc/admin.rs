//! `AdminService`: operations on the kernel itself.

use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};

use super::Kernel;

/// Implements `kernel.v1.AdminService`.
pub struct AdminApi(pub Kernel);

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn reload_policy(
        &self,
        _: Request<pb::ReloadPolicyRequest>,
    ) -> Result<Response<pb::ReloadPolicyResponse>, Status> {
        let rules = self.0.governance.reload()?;
        let path = self
            .0
            .governance
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Ok(Response::new(pb::ReloadPolicyResponse {
            path,
            rules: rules as u32,
        }))
    }
}
