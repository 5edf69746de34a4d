//! `AdminService`: operations on the kernel itself.

use kernel_proto::v1 as pb;
use kernel_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};
use tracing::info;

use super::{Kernel, convert};
use crate::error::KernelError;
use crate::model::{RunId, cut};
use crate::store::Deleted;

fn deletion(deleted: Deleted) -> pb::RunDeletion {
    pb::RunDeletion {
        runs: deleted.runs,
        events: deleted.events,
        steps: deleted.steps,
        approvals: deleted.approvals,
        cache_entries: deleted.cache_entries,
    }
}

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

    async fn forget_tool(
        &self,
        request: Request<pb::ForgetToolRequest>,
    ) -> Result<Response<pb::ForgetToolResponse>, Status> {
        let name = request.into_inner().name;
        let tool = self
            .0
            .registry
            .get(&name)
            .ok_or_else(|| KernelError::NotFound(format!("tool '{}' is not registered", cut(&name, 64))))?;
        let offering = self.0.registry.offers(&name);
        if offering > 0 {
            return Err(KernelError::FailedPrecondition(format!(
                "tool '{name}' is offered by {offering} connected worker session(s); forget it once none offers it"
            ))
            .into());
        }
        self.0.store.forget_tools(vec![name.clone()]).await?;
        // A worker that joined meanwhile keeps its tool: the registry forgets only an unoffered one.
        self.0.registry.forget(std::slice::from_ref(&name));
        info!(tool = name, "tool forgotten");
        Ok(Response::new(pb::ForgetToolResponse {
            spec: Some(convert::tool_spec(&tool.def)),
        }))
    }

    async fn delete_run(
        &self,
        request: Request<pb::DeleteRunRequest>,
    ) -> Result<Response<pb::DeleteRunResponse>, Status> {
        let id = RunId::parse(&request.into_inner().run_id, "run_id")?;
        let deleted = self.0.store.delete_run(id.clone()).await?;
        info!(run_id = %id, events = deleted.events, "run deleted");
        Ok(Response::new(pb::DeleteRunResponse {
            deleted: Some(deletion(deleted)),
        }))
    }

    async fn prune_runs(
        &self,
        request: Request<pb::PruneRunsRequest>,
    ) -> Result<Response<pb::PruneRunsResponse>, Status> {
        let min_age_ms = request.into_inner().min_age_ms;
        let deleted = crate::retention::prune(&self.0.store, min_age_ms).await?;
        info!(
            runs = deleted.runs,
            events = deleted.events,
            min_age_ms,
            "finished runs pruned"
        );
        Ok(Response::new(pb::PruneRunsResponse {
            deleted: Some(deletion(deleted)),
        }))
    }

    async fn list_replicas(
        &self,
        _: Request<pb::ListReplicasRequest>,
    ) -> Result<Response<pb::ListReplicasResponse>, Status> {
        let kernel = &self.0;
        let gauges = kernel.scheduler.gauges().await?;
        let this = crate::store::ReplicaRow {
            id: kernel.store.replica().to_owned(),
            started_at: kernel.started_at,
            heartbeat_at: kernel.store.clock().now_millis(),
            offers: String::new(),
            address: kernel.address.to_string(),
        };
        let ttl = kernel.scheduler.config().lease_ttl;
        let statuses = crate::cluster::statuses(&kernel.store, ttl, this, gauges.sessions as u32).await?;
        let replicas = statuses
            .into_iter()
            .enumerate()
            .map(|(index, status)| pb::Replica {
                id: status.row.id,
                address: status.row.address,
                started_at: Some(convert::timestamp(status.row.started_at)),
                heartbeat_at: Some(convert::timestamp(status.row.heartbeat_at)),
                alive: status.alive,
                shards: status.shards,
                worker_sessions: status.worker_sessions,
                answering: index == 0,
            })
            .collect();
        Ok(Response::new(pb::ListReplicasResponse { replicas }))
    }

    async fn get_status(&self, _: Request<pb::GetStatusRequest>) -> Result<Response<pb::GetStatusResponse>, Status> {
        let gauges = self.0.scheduler.gauges().await?;
        let waits = self.0.scheduler.lock_waits().await?;
        let resource_locks = self
            .0
            .store
            .reads
            .resource_locks()
            .await?
            .into_iter()
            // A tool limit's slots are counted under its limit.
            .filter(|lock| !crate::machine::throttle::is_slot(&lock.resource))
            .map(|lock| pb::ResourceLock {
                waiting: waits.get(&lock.resource).copied().unwrap_or(0),
                resource: lock.resource,
                run_id: lock.run_id,
                step_key: lock.step_key,
                tool: lock.tool,
                attempt: lock.attempt,
                acquired_at: Some(super::convert::timestamp(lock.acquired_at)),
            })
            .collect();
        let memory = crate::memory::figures();
        Ok(Response::new(pb::GetStatusResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at: Some(super::convert::timestamp(self.0.started_at)),
            worker_sessions: gauges.sessions as u32,
            queued_calls: gauges.queued as u32,
            leased_calls: gauges.leased as u32,
            live_runs: self.0.hub.channels() as u32,
            resident_bytes: memory.resident_bytes,
            allocated_bytes: memory.allocated_bytes,
            in_flight_scans: gauges.scans,
            lost_calls_found: gauges.lost_found,
            resource_locks,
            cpu_micros: crate::memory::cpu_micros().unwrap_or(0),
            store_commits: crate::metrics::get().commits(),
            store_syncs: crate::metrics::get().syncs(),
            store_statements: crate::metrics::get().statement_count(),
            disk_write_bytes: crate::memory::disk_write_bytes().unwrap_or(0),
            log_lines_dropped: crate::logs::dropped().get(),
            writes_forwarded: crate::metrics::get().forwarded.get(),
            writes_applied_for_others: crate::metrics::get().applied_for_others.get(),
            tool_limits: self.tool_limits().await?,
            fair_shares: self.fair_shares().await?,
        }))
    }
}

impl AdminApi {
    /// The policy's fair shares: each share it weighs or with calls queued here, heaviest first,
    /// then by most queued.
    async fn fair_shares(&self) -> Result<Option<pb::FairShareStatus>, KernelError> {
        let policy = self.0.governance.policy();
        let Some(config) = policy.fair_shares() else {
            return Ok(None);
        };
        let mut queued = self.0.scheduler.share_queues().await?;
        for value in config.weights.keys() {
            queued.entry(Some(value.clone())).or_default();
        }
        let mut shares: Vec<pb::ShareStatus> = queued
            .into_iter()
            .map(|(value, queued)| pb::ShareStatus {
                weight: config.weight(value.as_deref()),
                value,
                queued,
            })
            .collect();
        shares.sort_by(|a, b| {
            (b.weight.cmp(&a.weight))
                .then(b.queued.cmp(&a.queued))
                .then_with(|| a.value.cmp(&b.value))
        });
        Ok(Some(pb::FairShareStatus {
            label: config.label.clone(),
            shares,
        }))
    }

    /// The policy's tool limits, then those tools declare, with the calls each holds and the tokens in its bucket (from the
    /// database) and the calls waiting for it here.
    async fn tool_limits(&self) -> Result<Vec<pb::ToolLimitStatus>, KernelError> {
        let mut limits = self.0.governance.policy().limits();
        let mut declared: Vec<_> = (self.0.registry.all().iter())
            .filter_map(|tool| tool.def.options.limit.as_ref().map(|limit| limit.of(&tool.def.name)))
            .collect();
        declared.sort_by(|a, b| a.tools.cmp(&b.tools));
        limits.extend(declared);
        if limits.is_empty() {
            return Ok(Vec::new());
        }
        let waits = self.0.scheduler.limit_waits().await?;
        let held = self.0.store.reads.tool_limits(limits.clone()).await?;
        let now = self.0.store.clock().now_millis();
        Ok(limits
            .into_iter()
            .zip(held)
            .map(|(limit, (running, bucket))| pb::ToolLimitStatus {
                tokens: limit.per_second.map(|_| {
                    bucket
                        .unwrap_or_else(|| crate::machine::throttle::Bucket::full(&limit, now))
                        .refilled(&limit, now)
                        .tokens
                }),
                burst: limit.per_second.map(|_| limit.burst()),
                queued: waits.get(&limit.tools).copied().unwrap_or(0),
                running,
                per_second: limit.per_second,
                at_once: limit.at_once,
                tools: limit.tools,
            })
            .collect())
    }
}
