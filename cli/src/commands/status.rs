//! `status`: what the kernel holds in memory now, to tell an idle kernel from a leaking one; and
//! `limits`: its tool limits, part of the same answer.

use kernel_proto::v1::GetStatusRequest;

use super::Output;
use crate::client::{Kernel, unary};
use crate::error::CliError;
use crate::render;
use crate::view::StatusView;

pub async fn show(kernel: &mut Kernel, out: &mut Output<'_>) -> Result<(), CliError> {
    let status = StatusView::from(unary(kernel.admin.get_status(GetStatusRequest {})).await?);
    if out.is_json() {
        out.document(&status)?;
    } else {
        out.text(&render::status_text(&status))?;
    }
    Ok(())
}

pub async fn limits(kernel: &mut Kernel, out: &mut Output<'_>) -> Result<(), CliError> {
    let status = StatusView::from(unary(kernel.admin.get_status(GetStatusRequest {})).await?);
    if out.is_json() {
        out.document(&status.tool_limits)?;
    } else if status.tool_limits.is_empty() {
        out.text("no tool limits: the kernel's policy file sets none (`limits`)\n")?;
    } else {
        out.text(&render::limits_table(&status.tool_limits))?;
    }
    Ok(())
}
