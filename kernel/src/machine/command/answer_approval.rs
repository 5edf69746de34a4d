//! Answering an approval ([`approval::answer`]), by a person or by its expiry: approve makes the
//! call pending (its start consumes the approval; leave to pass a budget raises the limit first,
//! and the start pays under the new one), reject or an expiry settles it without running. A
//! branch waiting on a person resumes only while the record it replays is there; then the run's
//! next question is asked, or the run resumes.

use super::ending::end_tree;
use super::{Records, Result, apply_change, parent_exists, step};
use crate::error::KernelError;
use crate::machine::approval::{self, Decided};
use crate::machine::branch;
use crate::machine::budget;
use crate::machine::effects::Effect;
use crate::machine::run::EndRun;
use crate::model::{ApprovalId, ApprovalRecord, ApprovalStatus, StepRecord};

/// A person's answer to an approval.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Answer {
    /// Let the call run; for a question, the answer as canonical JSON (checked against its
    /// schema before it reaches the machine).
    Approve { given: Option<String> },
    /// Refuse the call, or decline the question.
    Reject,
}

/// What answering (or expiring) approvals changed.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Answered {
    /// The approvals answered.
    pub approvals: Vec<ApprovalRecord>,
    /// Approved steps, now pending: to dispatch.
    pub to_dispatch: Vec<StepRecord>,
    /// Steps settled because an answer ended a run (a branch whose parent is gone): to cancel.
    pub ended: Vec<StepRecord>,
}

/// Answers approval `id` as `decider` did, with an optional reason.
pub fn answer<R: Records + ?Sized>(
    records: &mut R,
    id: &ApprovalId,
    answer: Answer,
    (decider, reason): (&str, Option<&str>),
) -> Result<Answered> {
    let approval = records
        .approval(id)?
        .ok_or_else(|| KernelError::NotFound(format!("approval {id} not found")))?;
    let (status, given) = match answer {
        Answer::Approve { given } => (ApprovalStatus::Approved, given),
        Answer::Reject => (ApprovalStatus::Rejected, None),
    };
    let mut answered = Answered::default();
    settle(
        records,
        &approval,
        (status, decider, reason),
        given.as_deref(),
        &mut answered,
    )?;
    let run = records.run(&approval.run_id)?;
    if let Some(reason) = branch::unresumable(&run, parent_exists(records, &run)?) {
        let (_, ended) = end_tree(records, &run, &EndRun::Fail { reason })?;
        answered.to_dispatch.retain(|step| step.run_id != run.id);
        answered.ended.extend(ended);
        return Ok(answered);
    }
    super::ask::ask_next(records, &approval.run_id)?;
    Ok(answered)
}

/// Expires every pending approval whose time is up, asking each run's next question.
pub fn expire<R: Records + ?Sized>(records: &mut R) -> Result<Answered> {
    let mut answered = Answered::default();
    for approval in records.due_approvals()? {
        settle(
            records,
            &approval,
            (ApprovalStatus::Expired, "kernel", Some("approval timeout")),
            None,
            &mut answered,
        )?;
        super::ask::ask_next(records, &approval.run_id)?;
    }
    Ok(answered)
}

/// Records an answer to `approval` as the machine decides.
fn settle<R: Records + ?Sized>(
    records: &mut R,
    approval: &ApprovalRecord,
    answer: (ApprovalStatus, &str, Option<&str>),
    given: Option<&str>,
    answered: &mut Answered,
) -> Result<()> {
    let step = step(records, &approval.run_id, &approval.key)?;
    let change = approval::answer(approval, &step, answer, given, records.now())?;
    if let (Some(raise), Some((holder, index))) = (change.raise, budget::raised_by(&approval.decided_by)) {
        // The run holding the limit is the call's, or an ancestor in its shard.
        let mut run = records.run(&holder)?;
        budget::raise(&mut run, index, raise, answer.1).map_err(|why| KernelError::invalid("answer_json", why))?;
        records.save_run(&run)?;
    }
    records.save_approval(&change.approval)?;
    records.append(&approval.run_id, change.event, None)?;
    match change.step {
        Decided::Approved(step) => {
            records.save_step(&step)?;
            records.effect(Effect::Dispatch(Box::new(step.clone())));
            answered.to_dispatch.push(step);
        }
        Decided::Settled(settled) => {
            apply_change(records, settled)?;
        }
    }
    answered.approvals.push(change.approval);
    Ok(())
}
