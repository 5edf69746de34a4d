//! `replicas list`: the kernel replicas sharing the database, with the shards each owns.

use kernel_proto::v1::ListReplicasRequest;
use serde::Serialize;

use super::Output;
use crate::client::{Kernel, unary};
use crate::error::CliError;
use crate::render;
use crate::view::ReplicaView;

#[derive(Serialize)]
struct ReplicaList {
    replicas: Vec<ReplicaView>,
}

pub async fn list(kernel: &mut Kernel, out: &mut Output<'_>) -> Result<(), CliError> {
    let response = unary(kernel.admin.list_replicas(ListReplicasRequest {})).await?;
    let replicas: Vec<ReplicaView> = response.replicas.into_iter().map(ReplicaView::from).collect();
    if out.is_json() {
        out.document(&ReplicaList { replicas })?;
    } else {
        out.text(&render::replicas_table(&replicas))?;
    }
    Ok(())
}
