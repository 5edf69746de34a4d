//! An entry of a tool's own cache (`ctx.cache`), written for the dispatch that asks, only while
//! that exact attempt still runs on that session: an attempt that timed out, was lost or was
//! superseded writes nothing. Its tool is the namespace, never a name a worker sends. It appends
//! no event: the cache is the tool's scratch space, not part of any run's log.

use super::{Records, Result, held_step};
use crate::error::KernelError;
use crate::store::ToolCacheSet;

pub fn set<R: Records + ?Sized>(records: &mut R, set: ToolCacheSet) -> Result<()> {
    let Some(step) = held_step(records, &set.dispatch_id, set.attempt, Some(&set.session_id))? else {
        return Err(KernelError::FailedPrecondition(format!(
            "dispatch {} attempt {} no longer runs on this session (finished, timed out or lost); \
             the cache was not written",
            set.dispatch_id, set.attempt
        )));
    };
    records.write_tool_cache(&step.tool, &set)
}
