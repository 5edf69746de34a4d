//! The state machine: the kernel's rules, as functions from the records a command needs to the
//! changes it makes. Nothing here does I/O or knows a store, a stream or a clock: the store loads
//! the records (by key, inside its write transaction), calls a function here with the batch's
//! time, and saves what comes back; the events it returns are appended in order and numbered by
//! the store. So every rule is written once, for every backend, and tested without a database.
//!
//! A turn's calls ([`turn`]):
//! - [`turn::admit`]: a finished run takes no call, a blocked run no new one, no run more
//!   unsettled calls than its limit; the first turn starts a pending run.
//! - [`turn::resubmitted`]: a call already recorded at its identity is replayed (settled), joined
//!   (in flight) or refused as `replay_input_changed` (another tool, fingerprint or arguments),
//!   never run again.
//! - [`turn::decide`] and [`turn::record`]: a new call over `max_tool_calls`, to an unknown tool,
//!   with invalid arguments or denied by policy is settled at once with its one terminal event and
//!   no `tool:start`; a gated one waits for a person; a cached one is served; any other is
//!   scheduled.
//!
//! The commands of one dispatch of a step ([`dispatch`]) and the invariants each upholds:
//! - [`dispatch::start`]: a step starts only while pending, and only as the attempt after its
//!   last (an attempt number is never issued twice); `tool:start` is the change the store commits
//!   before any worker is told to run.
//! - [`dispatch::held`]: every message about a dispatch is fenced by `(dispatch_id, attempt,
//!   session)`; a stale one changes nothing.
//! - [`dispatch::record_result`]: a result settles the step with its one `tool:result`, or a
//!   retryable error with attempts left puts it back to pending with its next attempt's time.
//! - [`dispatch::lose_lease`]: a lost lease requeues a `safe_to_retry` step, settles an
//!   `at_most_once` step as indeterminate, and one lost too often as poison.
//! - [`dispatch::time_out`]: a timeout retries a safe step by its policy, never a blocking one, and
//!   settles an `at_most_once` step as indeterminate (the tool started and gave no answer).
//! - [`dispatch::fail_pending`]: a step no worker took in time fails without having run.
//!
//! Approvals ([`approval`]):
//! - [`approval::ask_next`]: gated calls are asked one at a time in (turn, position) order; a run
//!   with a question open is blocked, and runs again once none waits.
//! - [`approval::answer`]: an approval is answered once; approve makes the call pending (its start
//!   consumes the approval), reject or an expiry settles it without running.
//!
//! A run's life ([`run`]):
//! - [`run::create`]: an idempotency key gives back the run that holds it, and refuses another
//!   agent or input under it.
//! - [`run::deletable`]: only a finished run may be deleted.
//! - [`run::end`]: a run ends once; completing needs every call settled, failing or cancelling
//!   settles the calls in flight and withdraws open questions first, so the terminal event is the
//!   last of the log.
//! - [`run::abandoned`]: an external agent's run pending or running with no turn for the
//!   kernel's limit fails as `abandoned` (by [`run::end`], so its calls settle first); a blocked
//!   or hosted run never is.
//!
//! Questions ([`question`]): a tool body's question to a person is a step under its call, put to a
//! person as a gated call is; the answer, checked against the question's schema, settles it and
//! wakes the call; the call settling first withdraws it.
//!
//! One call ([`cancel`]): [`cancel::cancel_call`] settles a tool call in flight as cancelled
//! (its open question withdrawn) and leaves its run going; a settled call is refused.
//!
//! Hosted runs ([`hosted`]): a run whose handler a worker hosts has its own dispatch, a step of
//! kind `agent` under every rule above; [`hosted::check_fence`] admits only the attempt holding
//! it, [`hosted::place`] checks each operation against what its place in the handler's order
//! recorded (`replay_input_changed` otherwise), [`hosted::record_local`] records a finished local
//! step, and [`hosted::finish`] ends the run with the handler's outcome.
//!
//! Branches and case runs ([`branch`]): [`branch::judge`] answers a step the run's own record does
//! not hold from the parent's record (replayed, marked so), runs reads live, and refuses any
//! other effect with `write_tool_blocked` and its reason; the refusal ends the run.
//!
//! The log ([`events`]): every event a function here returns is built from its kind's payload
//! type, one per kind, so the fields an event carries are those its type declares; the event
//! reference and the payloads' JSON Schema in `docs/reference/` are generated from those types.
//!
//! Settled steps are terminal: no function here takes a settled step anywhere else, so a late or
//! out-of-order message never reverts one.

pub mod answer;
pub mod approval;
pub mod branch;
pub mod budget;
pub mod cancel;
pub mod command;
pub mod dispatch;
pub mod durability;
pub mod effects;
pub mod events;
pub mod hosted;
pub mod question;
pub mod run;
pub mod throttle;
pub mod turn;

#[cfg(test)]
mod properties;
#[cfg(test)]
pub(crate) mod records;

use serde_json::Value;

use crate::model::{EventType, StepRecord};

/// An event to append to a run's log; the store gives it the run's next sequence number.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub kind: EventType,
    pub payload: Value,
}

/// A step as a transition leaves it, and the event that records the transition.
#[derive(Clone, Debug, PartialEq)]
pub struct StepChange {
    pub step: StepRecord,
    pub event: NewEvent,
}

/// Renders milliseconds for people: 250ms, 1.5s, 30s, 2m05s.
pub fn human_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{:.1}s", ms as f64 / 1000.0)
        }
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

/// A JSON text as a value, or as a string when it is not JSON.
pub(crate) fn json_or_string(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(human_ms(250), "250ms");
        assert_eq!(human_ms(30_000), "30s");
        assert_eq!(human_ms(1_500), "1.5s");
        assert_eq!(human_ms(125_000), "2m05s");
    }
}
