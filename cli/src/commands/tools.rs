//! `tools list`: every tool the kernel knows, with the workers offering it now; `tools forget`:
//! drop one no worker offers any more.

use kernel_proto::v1::{ForgetToolRequest, ListToolsRequest};
use serde::Serialize;

use super::Output;
use crate::client::{Kernel, unary};
use crate::error::CliError;
use crate::render;
use crate::view::ToolView;

#[derive(Serialize)]
struct ToolList {
    tools: Vec<ToolView>,
}

pub async fn list(kernel: &mut Kernel, out: &mut Output<'_>) -> Result<(), CliError> {
    let response = unary(kernel.registry.list_tools(ListToolsRequest {})).await?;
    let mut tools: Vec<ToolView> = response.tools.into_iter().map(ToolView::from).collect();
    tools.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    if out.is_json() {
        out.document(&ToolList { tools })?;
    } else if tools.is_empty() {
        eprintln!("no tools registered");
    } else {
        out.text(&render::tools_table(&tools))?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Forgotten {
    forgotten: String,
}

pub async fn forget(kernel: &mut Kernel, out: &mut Output<'_>, name: String) -> Result<(), CliError> {
    unary(kernel.admin.forget_tool(ForgetToolRequest { name: name.clone() })).await?;
    if out.is_json() {
        out.document(&Forgotten { forgotten: name })?;
    } else {
        out.line(&format!("forgot {name}"))?;
    }
    Ok(())
}
