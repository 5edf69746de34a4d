//! `ApprovalService`: a person answers the calls parked for approval.

use kernel_proto::v1 as pb;
use kernel_proto::v1::approval_service_server::ApprovalService;
use tonic::{Request, Response, Status};

use super::{Kernel, convert};
use crate::auth::Caller;
use crate::error::KernelError;
use crate::model::{ApprovalId, ApprovalRecord, RunId};
use crate::store::Answer;

/// Who answers: with API keys, the key's name (a request's `decider` cannot speak for someone
/// else); without them, the `decider` the request names.
fn decider(caller: Option<&Caller>, requested: String) -> String {
    match caller {
        Some(caller) => caller.name().to_owned(),
        None => requested,
    }
}

/// Implements `kernel.v1.ApprovalService`.
pub struct ApprovalApi(pub Kernel);

impl ApprovalApi {
    /// Records `answer` as `caller` (with keys) or as the request's `decider` (without). With keys,
    /// an approval whose rule lists approvers takes an answer only from a key named there or in a
    /// group named there; anyone else is refused and nothing is written. The list is fixed when
    /// the approval is asked, so checking it before the write cannot race a change.
    async fn answer(
        &self,
        id: String,
        answer: Answer,
        (caller, decider): (Option<Caller>, String),
        reason: String,
    ) -> Result<pb::Approval, Status> {
        if id.trim().is_empty() {
            return Err(KernelError::invalid("approval_id", "must not be empty").into());
        }
        let id = ApprovalId::parse(&id, "approval_id")?;
        let decider = self::decider(caller.as_ref(), decider);
        if decider.trim().is_empty() {
            return Err(KernelError::invalid("decider", "must say who decides").into());
        }
        // A question's answer is checked against its schema by the machine, in the write.
        let answer = match answer {
            Answer::Approve { given: Some(text) } if !text.trim().is_empty() => Answer::Approve {
                given: Some(convert::canonical_json(&text, "answer_json", "null")?),
            },
            Answer::Approve { .. } => Answer::Approve { given: None },
            Answer::Reject => Answer::Reject,
        };
        if let Some(caller) = &caller {
            caller.may_answer(&self.asked(&id).await?.approvers)?;
        }
        let reason = (!reason.trim().is_empty()).then_some(reason);
        // The approved call is queued, and an ended branch's steps cancelled, by the commit's effects.
        let answered = self.0.store.answer_approval(id, answer, decider, reason).await?;
        let approval = answered
            .approvals
            .first()
            .ok_or_else(|| KernelError::Store("answer recorded nothing".into()))?;
        Ok(convert::approval(approval))
    }
}

impl ApprovalApi {
    async fn asked(&self, id: &ApprovalId) -> Result<ApprovalRecord, KernelError> {
        self.0
            .store
            .reads
            .approval(id.clone())
            .await?
            .ok_or_else(|| KernelError::NotFound(format!("approval {id} not found")))
    }
}

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let req = request.into_inner();
        let status = convert::approval_status_filter(req.status)?;
        let run = if req.run_id.is_empty() {
            None
        } else {
            Some(RunId::parse(&req.run_id, "run_id")?)
        };
        let approvals = self.0.store.reads.approvals(status, run).await?;
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: approvals.iter().map(convert::approval).collect(),
        }))
    }

    async fn approve_call(
        &self,
        request: Request<pb::ApproveCallRequest>,
    ) -> Result<Response<pb::ApproveCallResponse>, Status> {
        let caller = request.extensions().get::<Caller>().cloned();
        let req = request.into_inner();
        let approval = self
            .answer(
                req.approval_id,
                Answer::Approve {
                    given: Some(req.answer_json),
                },
                (caller, req.decider),
                req.reason,
            )
            .await?;
        Ok(Response::new(pb::ApproveCallResponse {
            approval: Some(approval),
        }))
    }

    async fn reject_call(
        &self,
        request: Request<pb::RejectCallRequest>,
    ) -> Result<Response<pb::RejectCallResponse>, Status> {
        let caller = request.extensions().get::<Caller>().cloned();
        let req = request.into_inner();
        let approval = self
            .answer(req.approval_id, Answer::Reject, (caller, req.decider), req.reason)
            .await?;
        Ok(Response::new(pb::RejectCallResponse {
            approval: Some(approval),
        }))
    }
}
