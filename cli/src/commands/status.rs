//! `status`: what the kernel holds in memory now, to tell an idle kernel from a leaking one.

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
