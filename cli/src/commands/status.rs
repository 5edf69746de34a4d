//! `status`: what the kernel holds in memory now, to tell an idle kernel from a leaking one; and
//! `limits` and `shares`: its tool limits and fair shares, part of the same answer.

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
        out.text("no tool limits: the kernel's policy file sets none (`limits`) and no tool declares one\n")?;
    } else {
        out.text(&render::limits_table(&status.tool_limits))?;
    }
    Ok(())
}

pub async fn shares(kernel: &mut Kernel, out: &mut Output<'_>) -> Result<(), CliError> {
    let status = StatusView::from(unary(kernel.admin.get_status(GetStatusRequest {})).await?);
    match (&status.fair_shares, out.is_json()) {
        (shares, true) => out.document(shares)?,
        (None, false) => {
            out.text("no fair shares: the kernel's policy file sets none (`fair_shares`); queued calls start in the order they came\n")?
        }
        (Some(shares), false) => out.text(&render::shares_table(shares))?,
    }
    Ok(())
}
