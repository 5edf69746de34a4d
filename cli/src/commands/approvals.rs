//! `approvals list | approve ID | reject ID | answer ID --with JSON`: a person answers the calls
//! parked for approval, and the questions tools ask.

use kernel_proto::v1::{Approval, ApproveCallRequest, ListApprovalsRequest, RejectCallRequest};
use serde::Serialize;

use super::Output;
use crate::args::AnswerArgs;
use crate::client::{Kernel, unary};
use crate::error::CliError;
use crate::render;
use crate::view::ApprovalView;

#[derive(Serialize)]
struct ApprovalList {
    approvals: Vec<ApprovalView>,
}

#[derive(Serialize)]
struct Answered {
    approval: ApprovalView,
}

/// Pending approvals, optionally of one run.
pub async fn list(kernel: &mut Kernel, out: &mut Output<'_>, run: Option<String>) -> Result<(), CliError> {
    let request = ListApprovalsRequest {
        status: 0,
        run_id: run.unwrap_or_default(),
    };
    let response = unary(kernel.approvals.list_approvals(request)).await?;
    let approvals: Vec<ApprovalView> = response.approvals.into_iter().map(ApprovalView::from).collect();
    if out.is_json() {
        out.document(&ApprovalList { approvals })?;
    } else if approvals.is_empty() {
        eprintln!("no approvals pending");
    } else {
        out.text(&render::approvals_table(&approvals))?;
    }
    Ok(())
}

/// Approves (`approve = true`) or rejects a pending approval as `decider`.
pub async fn answer(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    id: String,
    approve: bool,
    decider: String,
    reason: Option<String>,
) -> Result<(), CliError> {
    let reason = reason.unwrap_or_default();
    let approval = if approve {
        let request = ApproveCallRequest {
            approval_id: id,
            decider,
            reason,
            answer_json: String::new(),
        };
        unary(kernel.approvals.approve_call(request)).await?.approval
    } else {
        let request = RejectCallRequest {
            approval_id: id,
            decider,
            reason,
        };
        unary(kernel.approvals.reject_call(request)).await?.approval
    };
    answered(out, approval)
}

/// Answers a tool's question to a person with `answer` (JSON).
pub async fn answer_question(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    who: AnswerArgs,
    answer: String,
) -> Result<(), CliError> {
    let request = ApproveCallRequest {
        approval_id: who.id,
        decider: who.decider,
        reason: who.reason.unwrap_or_default(),
        answer_json: answer,
    };
    let approval = unary(kernel.approvals.approve_call(request)).await?.approval;
    answered(out, approval)
}

/// Answers the question `who.id` (its step key or approval id) of run `run` with `answer`.
pub async fn answer_run_question(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    run: String,
    mut who: AnswerArgs,
    answer: String,
) -> Result<(), CliError> {
    let request = ListApprovalsRequest {
        status: 0,
        run_id: run.clone(),
    };
    let pending = unary(kernel.approvals.list_approvals(request)).await?.approvals;
    let Some(approval) = pending.iter().find(|a| a.step_key == who.id || a.id == who.id) else {
        let open: Vec<&str> = pending.iter().map(|a| a.step_key.as_str()).collect();
        let open = if open.is_empty() {
            "none".to_owned()
        } else {
            open.join(", ")
        };
        return Err(CliError::Rpc {
            code: tonic::Code::NotFound,
            message: format!(
                "run {run} has no question {} waiting for an answer (waiting: {open})",
                who.id
            ),
        });
    };
    who.id = approval.id.clone();
    answer_question(kernel, out, who, answer).await
}

/// Prints an answered approval.
fn answered(out: &mut Output<'_>, approval: Option<Approval>) -> Result<(), CliError> {
    let approval = ApprovalView::from(approval.ok_or(CliError::MalformedResponse("the kernel returned no approval"))?);
    if out.is_json() {
        out.document(&Answered { approval })?;
    } else {
        out.text(&format!(
            "{} {} by {}\n",
            approval.id,
            approval.status,
            approval.decider.as_deref().unwrap_or("?")
        ))?;
    }
    Ok(())
}
