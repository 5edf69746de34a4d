//! Which commits wait for the disk.
//!
//! A commit is durable against a crash of the kernel process as soon as it returns: its pages are
//! in the operating system's cache. What `--durability full` adds is a sync, so that a commit also
//! survives power loss, and that sync is most of a commit's time. Almost every command's answer
//! waits for it. A command that does nothing but schedule tool calls and start `safe_to_retry`
//! ones does not: losing it to a power cut loses calls whose results nobody has seen, which the
//! agent's next submission of the turn runs again with the same idempotency keys, the promise of
//! that mode. A turn's `safe_to_retry` calls go out even before that commit, once the write has
//! decided them ([`dispatches_before_commit`]), so a call's critical path holds one commit and one
//! sync, its result's. Nor do notes nobody is told of ([`must_sync`]). The log stays in order: a
//! later commit that syncs makes every commit before it durable too (the write-ahead log is
//! written in order, and one sync covers all of it), so a result is never durable while its start
//! is not.

use super::turn::CallDisposition;
use crate::model::{EventType, Idempotency, StepKind, StepRecord};

/// Whether a command must be durable before it is answered, given the events it appended (each
/// with the step it settled or started, if any). `notes_only` says the command writes nothing
/// anyone is told of but notes: a count of replays (the results it counts were durable before they
/// were served), or a local step's allowance for the dispatch that asked (a power cut ends that
/// dispatch, and a step recorded without its allowance is decided at its record).
pub fn must_sync<'a>(events: impl IntoIterator<Item = (EventType, Option<&'a StepRecord>)>, notes_only: bool) -> bool {
    let mut events = events.into_iter().peekable();
    if events.peek().is_none() {
        return !notes_only;
    }
    !events.all(|(kind, step)| may_defer(kind, step))
}

/// An event whose loss to a power cut, with everything committed after it, loses nothing anyone
/// was told.
fn may_defer(kind: EventType, step: Option<&StepRecord>) -> bool {
    let call = step.filter(|step| step.kind == StepKind::Tool);
    match kind {
        // A call recorded, not yet run (its event carries no step).
        EventType::RunStarted | EventType::ToolScheduled => true,
        // An `at_most_once` call may run only once its start survives anything: then a lost
        // worker means `indeterminate`, never a second run.
        EventType::ToolStart => call.is_some_and(goes_out_before_commit),
        _ => false,
    }
}

/// Whether a started call may go to its worker before its start commits: a `safe_to_retry` tool
/// call. If the commit then never happens (the kernel dies, the disk refuses it), the call is
/// recorded nowhere, its result is refused, and the agent's next submission of the turn runs it
/// again with the same idempotency key. Its result still commits after its start (one writer,
/// in order) and is durable before anyone sees it.
fn goes_out_before_commit(step: &StepRecord) -> bool {
    step.kind == StepKind::Tool && step.idempotency == Idempotency::SafeToRetry
}

/// The calls a turn's write started that may go to their workers before it commits.
pub fn dispatches_before_commit(calls: &[CallDisposition]) -> Vec<StepRecord> {
    calls
        .iter()
        .filter_map(|call| match call {
            CallDisposition::Started(step) if goes_out_before_commit(step) => Some(step.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sync(events: &[(EventType, Option<StepRecord>)]) -> bool {
        must_sync(events.iter().map(|(kind, step)| (*kind, step.as_ref())), false)
    }

    fn call(idempotency: Idempotency) -> Option<StepRecord> {
        let mut step = crate::machine::records::step();
        step.idempotency = idempotency;
        Some(step)
    }

    #[test]
    fn a_turn_that_only_schedules_and_starts_safe_calls_does_not_wait_for_the_disk() {
        let safe = [
            (EventType::RunStarted, None),
            (EventType::ToolScheduled, None),
            (EventType::ToolStart, call(Idempotency::SafeToRetry)),
            (EventType::ToolScheduled, None),
        ];
        assert!(!sync(&safe));
    }

    #[test]
    fn an_at_most_once_start_a_result_or_a_command_without_events_waits_for_the_disk() {
        let scheduled = (EventType::ToolScheduled, None);
        for other in [
            (EventType::ToolStart, call(Idempotency::AtMostOnce)),
            (EventType::ToolResult, call(Idempotency::SafeToRetry)),
            (EventType::ToolDenied, call(Idempotency::SafeToRetry)),
            (EventType::RunInterrupted, None),
            (EventType::RunCreated, None),
            (EventType::ToolStart, None),
        ] {
            assert!(sync(&[scheduled.clone(), other.clone()]), "{:?}", other.0);
        }
        assert!(sync(&[]), "a write without events (a registration) is answered durable");
        let mut agent = call(Idempotency::SafeToRetry).unwrap();
        agent.kind = StepKind::Agent;
        assert!(sync(&[(EventType::ToolStart, Some(agent))]));
    }

    #[test]
    fn notes_alone_do_not_wait_for_the_disk_but_a_note_with_an_event_does() {
        assert!(!must_sync([], true), "a count of replays, an allowance");
        let denied = crate::machine::records::step();
        assert!(must_sync([(EventType::StepResult, Some(&denied))], true));
    }
}
