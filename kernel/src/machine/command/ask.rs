//! Questions to a person, one at a time: the next gated call of a run in (turn, position) order
//! is asked once none is open; with none left, a blocked run runs again.

use super::{Records, Result};
use crate::machine::approval::{self, Ask};
use crate::model::{ApprovalId, RunId};

/// Puts the next gated call of run `run_id` to a person, or resumes the run when none waits.
pub fn ask_next<R: Records + ?Sized>(records: &mut R, run_id: &RunId) -> Result<()> {
    let open = records.open_approvals(run_id)?.len();
    let next = if open > 0 {
        None
    } else {
        records.next_awaiting_approval(run_id)?
    };
    let run = records.run(run_id)?;
    let id = ApprovalId::in_shard_of(run_id);
    match approval::ask_next(&run, open, next.as_ref(), id, records.now()) {
        Ask::Nothing => {}
        Ask::Resume { run, event } => {
            records.save_run(&run)?;
            records.append(run_id, event, None)?;
        }
        Ask::Ask(question) => {
            let approval::Question {
                approval,
                step,
                run,
                event,
            } = *question;
            records.insert_approval(&approval)?;
            if let Some(run) = run {
                records.save_run(&run)?;
            }
            records.append(run_id, event, Some(step))?;
        }
    }
    Ok(())
}
