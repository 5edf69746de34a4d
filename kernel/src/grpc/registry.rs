//! `RegistryService`: which tools exist and which workers are connected.

use std::collections::BTreeMap;

use kernel_proto::v1 as pb;
use kernel_proto::v1::registry_service_server::RegistryService;
use tonic::{Request, Response, Status};

use super::{Kernel, convert};

/// Implements `kernel.v1.RegistryService`.
pub struct RegistryApi(pub Kernel);

#[tonic::async_trait]
impl RegistryService for RegistryApi {
    async fn list_tools(&self, _: Request<pb::ListToolsRequest>) -> Result<Response<pb::ListToolsResponse>, Status> {
        let workers = self.0.scheduler.snapshot().await?;
        let mut offered: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for worker in &workers {
            for tool in &worker.tools {
                offered.entry(tool.as_str()).or_default().push(worker.name.clone());
            }
        }
        let tools = self
            .0
            .registry
            .all()
            .iter()
            .map(|tool| {
                let mut names = offered.get(tool.def.name.as_str()).cloned().unwrap_or_default();
                names.sort();
                names.dedup();
                convert::registered_tool(tool, names)
            })
            .collect();
        Ok(Response::new(pb::ListToolsResponse { tools }))
    }

    async fn list_workers(
        &self,
        _: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let workers = self.0.scheduler.snapshot().await?;
        Ok(Response::new(pb::ListWorkersResponse {
            workers: workers.iter().map(convert::worker).collect(),
        }))
    }

    async fn list_agents(&self, _: Request<pb::ListAgentsRequest>) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let workers = self.0.scheduler.snapshot().await?;
        let mut agents: Vec<pb::HostedAgentInfo> = self
            .0
            .registry
            .agents()
            .iter()
            .map(|agent| {
                let def = &agent.def;
                let mut hosting: Vec<String> = (workers.iter())
                    .filter(|worker| worker.agents.contains(&def.name))
                    .map(|worker| worker.name.clone())
                    .collect();
                hosting.sort();
                hosting.dedup();
                pb::HostedAgentInfo {
                    name: def.name.clone(),
                    description: def.description.clone(),
                    input_schema_json: kernel_proto::canonical::to_canonical(&def.input_schema),
                    version: def.version.clone(),
                    fingerprint: def.fingerprint.clone(),
                    workers: hosting,
                }
            })
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(pb::ListAgentsResponse { agents }))
    }
}
