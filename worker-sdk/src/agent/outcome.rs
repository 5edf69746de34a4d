//! Why a call ended as it did, for the program around the model: the model reads the call's text,
//! the agent matches on its [`Outcome`] (reconcile an indeterminate charge, tell a person their
//! refund was rejected, back off after a timeout) without parsing English.
//!
//! ```no_run
//! use worker_sdk::{AgentClient, AgentError, Call, Capture, NewRun, Outcome};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), AgentError> {
//!     let agent = AgentClient::connect("http://127.0.0.1:50051").await?;
//!     let run = agent
//!         .create_run(
//!             NewRun::new("billing", serde_json::json!({"order": 9}))
//!                 .label("env", "prod")
//!                 .idempotency_key("order-9")   // creating it again returns this run
//!                 .max_tool_calls(20)
//!                 .non_interactive()            // cannot wait for a person: gated calls are refused
//!                 .permission("billing:write")
//!                 .capture(Capture::Metadata),  // inspection shows sizes and hashes, not contents
//!         )
//!         .await?;
//!     for result in run.call_turn(0, vec![Call::new("refund", serde_json::json!({"cents": 500}))]).await? {
//!         match result.outcome {
//!             Outcome::Ok => println!("{}", result.content),
//!             Outcome::Indeterminate => println!("reconcile {} with the payment provider", result.step_key),
//!             _ => match result.rejection() {
//!                 Some(rejected) => println!("{rejected} (expired: {})", rejected.expired),
//!                 None => println!("{}: {}", result.outcome, result.content),
//!             },
//!         }
//!     }
//!     run.complete(serde_json::json!({"refunded": 500})).await?;   // the run ends; until then it is `running`
//!     Ok(())
//! }
//! ```

/// Why a settled call ended as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The tool returned a result (or the kernel's result cache had one).
    Ok,
    /// The tool returned an error, after any retries its policy allowed.
    ToolError,
    /// The arguments did not match the tool's JSON Schema; the text lists every bad field.
    InvalidArguments,
    /// No such tool (or not among the tools the turn offered).
    UnknownTool,
    /// Denied by policy; [`CallOutcome::decided_by`](crate::CallOutcome::decided_by) names the
    /// preset or rule.
    Denied,
    /// A person rejected the call; [`CallOutcome::approval`](crate::CallOutcome::approval) says
    /// who and why.
    Rejected,
    /// The call's approval expired unanswered (it counts as a rejection).
    Expired,
    /// The call ran out of time on every attempt it was allowed.
    TimedOut,
    /// An `at_most_once` call started, then its worker was lost or it timed out: the effect may or
    /// may not have happened. Reconcile with the system the tool talks to, using the idempotency
    /// key; the kernel will not run it again.
    Indeterminate,
    /// The call lost its worker 5 times (it brings down whatever runs it); never retried. A
    /// tool's own poison error is [`Outcome::ToolError`] with error kind poison.
    Poison,
    /// The call was cancelled alone (`CancelCall`), or its run was cancelled or ended while the
    /// call was in flight.
    Cancelled,
    /// The call's tool, the tool's fingerprint or the arguments differ from the call recorded at
    /// its identity.
    ReplayInputChanged,
    /// The run's `max_tool_calls` was reached; the call did not run.
    LimitExceeded,
    /// The call would have gone past a limit of its run's budget (or an ancestor's); it did not
    /// run, and the model reads which limit.
    BudgetExceeded,
    /// No worker offering the tool connected within the kernel's schedule-to-start timeout.
    NoWorker,
    /// A branch or case run refused an effect its parent never recorded (a tool neither
    /// `read_only` nor allowed); the run ended with it.
    WriteToolBlocked,
    /// An outcome this SDK does not know (a newer kernel); treat it as a failure.
    Unknown,
}

impl Outcome {
    /// Whether the tool's result is there to use.
    pub fn is_ok(self) -> bool {
        self == Outcome::Ok
    }

    /// The outcome's name, as the kernel's events and `kernelctl` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::InvalidArguments => "invalid_arguments",
            Outcome::UnknownTool => "unknown_tool",
            Outcome::Denied => "denied",
            Outcome::Rejected => "rejected",
            Outcome::Expired => "expired",
            Outcome::TimedOut => "timed_out",
            Outcome::Indeterminate => "indeterminate",
            Outcome::Poison => "poison",
            Outcome::Cancelled => "cancelled",
            Outcome::ReplayInputChanged => "replay_input_changed",
            Outcome::LimitExceeded => "limit_exceeded",
            Outcome::BudgetExceeded => "budget_exceeded",
            Outcome::NoWorker => "no_worker",
            Outcome::WriteToolBlocked => "write_tool_blocked",
            Outcome::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a gated call's approval was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalAnswer {
    /// A person let the call run.
    Approved,
    /// A person refused it.
    Rejected,
    /// Nobody answered in time.
    Expired,
}

/// The answer a gated call got: from a person, or the clock when it expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalDecision {
    /// The approval that was answered.
    pub approval_id: String,
    /// What the answer was.
    pub answer: ApprovalAnswer,
    /// Who answered: the approver's API key name (or the name given without keys), or `kernel`
    /// for an expiry.
    pub decider: String,
    /// The reason given with the answer, if any.
    pub reason: Option<String>,
}

/// A gated call that was not approved, as an error the agent can return or match on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{tool_name}' was not approved{}", match (.expired, .reason.as_deref()) {
    (true, _) => ": the approval expired unanswered".to_owned(),
    (false, Some(reason)) => format!(": {reason}"),
    (false, None) => String::new(),
})]
pub struct ToolCallRejected {
    /// The tool the model called.
    pub tool_name: String,
    /// The reason the approver gave, if any.
    pub reason: Option<String>,
    /// Nobody answered in time: the approval expired.
    pub expired: bool,
    /// Who rejected it (`kernel` for an expiry).
    pub decider: String,
}
