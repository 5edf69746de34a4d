//! `workers list`: the worker sessions connected now, with their slots in use.

use kernel_proto::v1::ListWorkersRequest;
use serde::Serialize;

use super::Output;
use crate::client::{Kernel, unary};
use crate::error::CliError;
use crate::render;
use crate::view::WorkerView;

#[derive(Serialize)]
struct WorkerList {
    workers: Vec<WorkerView>,
}

pub async fn list(kernel: &mut Kernel, out: &mut Output<'_>) -> Result<(), CliError> {
    let response = unary(kernel.registry.list_workers(ListWorkersRequest {})).await?;
    let mut workers: Vec<WorkerView> = response.workers.into_iter().map(WorkerView::from).collect();
    workers.sort_by(|a, b| (&a.name, &a.session_id).cmp(&(&b.name, &b.session_id)));
    if out.is_json() {
        out.document(&WorkerList { workers })?;
    } else if workers.is_empty() {
        eprintln!("no workers connected");
    } else {
        out.text(&render::workers_table(&workers))?;
    }
    Ok(())
}
