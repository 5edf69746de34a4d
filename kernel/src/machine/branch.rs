//! Branches and case runs: runs where only reads run live.
//!
//! A **branch** is a run forked from a recorded run (its parent) at a fork point, perhaps with a
//! new input or with one step's recorded result replaced. A **case run** is a run created with
//! allow tokens. Both answer every step the run's own record does not hold by [`judge`], each step
//! against its own declaration:
//!
//! - a step the parent recorded (at or before the fork point) with the same identity and call
//!   hash replays the parent's outcome ([`Verdict::Replay`], recorded in the branch by
//!   [`replay`], marked as taken from the parent);
//! - a `read_only` tool runs live, and so does a local step with effect `read` or `pure`; in a
//!   case run, so does a subagent (its child is a case run too) and whatever an allow token names;
//! - a subagent the parent started, but not with this input (or after the fork point), runs as a
//!   branch of the parent's child ([`Verdict::BranchOf`]);
//! - anything else is refused with `write_tool_blocked` ([`Verdict::Blocked`]), naming the tool
//!   (or `ctx.step:<id>`, `subagent:<agent>`) and a reason: `write`, `unmarked`, `step` or
//!   `effect`. The refusal ends the run ([`Blocked::run_reason`]); the kernel never invents a
//!   result.
//!
//! A branch whose parent was deleted cannot go on: it ends with `branch_unresumable` when it next
//! resumes ([`unresumable`]).

use super::events::{BlockedSubagent, Payload, Replayed, SettledStatus, StepResult, SubagentResult, ToolResult};
use super::hosted::{HostedAgent, dispatch_step};
use super::run::NewRun;
use super::{StepChange, json_or_string};
use crate::model::{
    Capture, Effect, ErrorKind, Fork, Millis, Outcome, RunId, RunRecord, StepKey, StepKind, StepRecord, StepStatus,
};

/// Who decided a step replayed from the parent, as its `decided_by` says.
pub const FROM_PARENT: &str = "branch:parent";
/// Who decided a step whose recorded result the fork replaced.
pub const SET_BY_FORK: &str = "branch:set_result";

/// Whether the branch rule applies to `run`: a branch, or a case run.
pub fn guarded(run: &RunRecord) -> bool {
    run.fork.is_some() || !run.allow.is_empty()
}

/// A step the rule judges, with what it declares.
#[derive(Clone, Copy, Debug)]
pub enum Subject<'a> {
    Tool {
        name: &'a str,
        read_only: bool,
        writes: bool,
    },
    Step {
        id: &'a str,
        effect: Effect,
        once: bool,
    },
    Subagent {
        agent: &'a str,
        session: bool,
    },
}

/// Why an effect was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockReason {
    /// A tool declared `writes`.
    Write,
    /// A tool declared neither `read_only` nor `writes`.
    Unmarked,
    /// A local step with effect `write`, or a `ctx.once`.
    Step,
    /// Any other durable effect: a subagent the parent did not start, a session step.
    Effect,
}

impl BlockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::Write => "write",
            BlockReason::Unmarked => "unmarked",
            BlockReason::Step => "step",
            BlockReason::Effect => "effect",
        }
    }
}

/// An effect the rule refused: what it was, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The tool's name, `ctx.step:<id>` or `subagent:<agent>`.
    pub subject: String,
    pub reason: BlockReason,
}

impl Blocked {
    /// What the model (or the handler) reads: the reason is withheld at capture `none`.
    pub fn message(&self, run: &RunRecord) -> String {
        let why = match (&run.fork, self.reason) {
            (Some(fork), _) => format!(
                "run {} never recorded it (with these arguments, by its fork point), and a branch runs only reads live",
                fork.of
            ),
            (None, BlockReason::Effect) => "a case run starts no session step the run did not record".to_owned(),
            (None, BlockReason::Step) => format!(
                "a case run runs only read and pure steps live (allow it with step:{})",
                self.subject.trim_start_matches("ctx.step:")
            ),
            (None, _) => format!(
                "a case run runs only read_only tools live (allow it with tool:{})",
                self.subject
            ),
        };
        format!(
            "write_tool_blocked: '{}' did not run: {why}; the run ends here ({})",
            self.subject,
            self.detail(run.capture)
        )
    }

    /// The run's failure reason.
    pub fn run_reason(&self, capture: Capture) -> String {
        format!("write_tool_blocked: {} ({})", self.subject, self.detail(capture))
    }

    fn detail(&self, capture: Capture) -> String {
        match capture {
            Capture::None => "reason withheld: capture=none".to_owned(),
            _ => format!("reason: {}", self.reason.as_str()),
        }
    }
}

/// What the rule decides for a step the run's own record does not hold.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The parent's recorded step, to replay.
    Replay(Box<StepRecord>),
    /// Run it live.
    Live,
    /// Start the subagent as a branch of the parent's child run.
    BranchOf(RunId),
    Blocked(Blocked),
}

/// Judges a step of guarded `run` given what the parent recorded at the same identity
/// (`recorded`; `None` for a case run, or when the parent holds nothing there) and the step's call
/// hash and canonical arguments (empty and `null` for a local step, the child's input for a
/// subagent).
pub fn judge(run: &RunRecord, subject: Subject<'_>, recorded: Option<&StepRecord>, call: (&str, &str)) -> Verdict {
    if let (Some(fork), Some(step)) = (&run.fork, recorded)
        && replayable(fork, step, call)
    {
        return Verdict::Replay(Box::new(step.clone()));
    }
    let allowed = |token: String| run.allow.contains(&token);
    match subject {
        Subject::Tool {
            name,
            read_only,
            writes,
        } => {
            if (read_only && !writes) || (run.fork.is_none() && allowed(format!("tool:{name}"))) {
                Verdict::Live
            } else {
                let reason = if writes {
                    BlockReason::Write
                } else {
                    BlockReason::Unmarked
                };
                blocked(name.to_owned(), reason)
            }
        }
        Subject::Step { id, effect, once } => {
            let read = !once && matches!(effect, Effect::Read | Effect::Pure);
            if read || (run.fork.is_none() && allowed(format!("step:{id}"))) {
                Verdict::Live
            } else {
                blocked(format!("ctx.step:{id}"), BlockReason::Step)
            }
        }
        Subject::Subagent { agent, session } => match (&run.fork, recorded) {
            (None, _) if !session => Verdict::Live,
            (Some(_), Some(step)) if !session && step.kind == StepKind::Subagent => match &step.call_id {
                Some(child) => RunId::parse(child, "child_run_id")
                    .map(Verdict::BranchOf)
                    .unwrap_or_else(|_| blocked(format!("subagent:{agent}"), BlockReason::Effect)),
                None => blocked(format!("subagent:{agent}"), BlockReason::Effect),
            },
            _ => blocked(format!("subagent:{agent}"), BlockReason::Effect),
        },
    }
}

/// The case run's token that lets local step `id` run live, when it is no read and `run` holds
/// one: what allowed it.
pub fn allowed_by(run: &RunRecord, (id, effect, once): (&str, Effect, bool)) -> Option<String> {
    let read = !once && matches!(effect, Effect::Read | Effect::Pure);
    let token = format!("step:{id}");
    (!read && run.fork.is_none() && run.allow.contains(&token)).then_some(token)
}

fn blocked(subject: String, reason: BlockReason) -> Verdict {
    Verdict::Blocked(Blocked { subject, reason })
}

/// Whether the parent's step may be replayed for a call with this hash and these arguments: it
/// settled, at or before the fork point, as this very call, and was not itself a refusal.
fn replayable(fork: &Fork, step: &StepRecord, (call_hash, arguments): (&str, &str)) -> bool {
    step.status.is_terminal()
        && fork.covers(step)
        && step.call_hash == call_hash
        && step.arguments == arguments
        && !matches!(
            step.outcome(),
            Some(Outcome::WriteToolBlocked | Outcome::ReplayInputChanged)
        )
}

/// The branch's own record of a step it replays from its parent (`parent`), at its own place
/// `(turn, position)`: settled at once as the parent's step settled (or with the result the fork
/// put in its place), nothing run, with its one terminal event.
pub fn replay(run: &RunRecord, parent: &StepRecord, (turn, position): (u32, u32), now: Millis) -> StepChange {
    let fork = run.fork.as_ref().expect("only a branch replays its parent");
    let mut step = parent.clone();
    step.run_id = run.id.clone();
    step.idempotency_key = step.key.idempotency_key(&run.id);
    step.hosted = run.hosted;
    step.turn = turn;
    step.position = position;
    step.attempts = 0;
    step.worker = None;
    step.session_id = None;
    step.replica = None;
    step.dispatch_id = None;
    step.lease_expires_at = None;
    step.created_at = now;
    step.started_at = None;
    step.finished_at = Some(now);
    step.replays = 0;
    step.progress_count = 0;
    step.not_before = None;
    step.lease_losses = 0;
    step.cost = 0.0;
    step.approval = None;
    step.approval_gate = None;
    step.from_run = Some(fork.of.clone());
    step.decided_by = Some(FROM_PARENT.to_owned());
    if let Some(result) = fork.results.get(step.key.as_str()) {
        step.status = StepStatus::Succeeded;
        step.outcome = Some(Outcome::Ok);
        step.output = Some(result.clone());
        step.error = None;
        step.error_kind = None;
        step.decided_by = Some(SET_BY_FORK.to_owned());
    }
    let payload = Replayed {
        step_key: step.key.to_string(),
        turn,
        position,
        tool: step.tool.clone(),
        status: if step.status == StepStatus::Succeeded {
            SettledStatus::Ok
        } else {
            SettledStatus::Error
        },
        // Only a settled step is replayed, and a settled step has an outcome.
        outcome: step.outcome().unwrap_or(Outcome::ToolError),
        decided_by: step.decided_by.clone().unwrap_or_default(),
        replayed_from_run_id: fork.of.to_string(),
        output: step.output.as_deref().map(json_or_string),
        error: step.error.clone(),
    };
    let event = match step.kind {
        StepKind::Local => StepResult::Replayed(payload).event(),
        StepKind::Subagent => SubagentResult::Replayed(payload).event(),
        StepKind::Tool | StepKind::Agent | StepKind::Question => ToolResult::Replayed(payload).event(),
    };
    StepChange { step, event }
}

/// The subagent step a refused start records at place `seq`: settled at once with the refusal,
/// no child run created.
pub fn blocked_subagent(
    run: &RunRecord,
    (seq, key): (u32, StepKey),
    child: &NewRun,
    message: String,
    now: Millis,
) -> StepChange {
    let agent = HostedAgent {
        name: child.agent.clone(),
        fingerprint: String::new(),
        version: String::new(),
    };
    let mut step = dispatch_step(run, &agent, now);
    step.idempotency_key = key.idempotency_key(&run.id);
    step.key = key;
    step.kind = StepKind::Subagent;
    step.turn = seq;
    step.arguments = child.input.clone();
    step.status = StepStatus::Failed;
    step.outcome = Some(Outcome::WriteToolBlocked);
    step.error = Some(message.clone());
    step.error_kind = Some(ErrorKind::Fatal);
    step.finished_at = Some(now);
    step.decided_by = Some("branch".to_owned());
    let event = SubagentResult::Blocked(BlockedSubagent {
        step_key: step.key.to_string(),
        seq,
        agent: child.agent.clone(),
        session_key: child.session_key.clone(),
        input: json_or_string(&child.input),
        status: SettledStatus::Error,
        outcome: Outcome::WriteToolBlocked,
        error: message,
    })
    .event();
    StepChange { step, event }
}

/// The reason a branch ends with when its parent is gone, or `None` while it is there (or `run`
/// is no branch).
pub fn unresumable(run: &RunRecord, parent_exists: bool) -> Option<String> {
    let fork = run.fork.as_ref()?;
    (!parent_exists).then(|| {
        format!(
            "branch_unresumable: parent_missing: run {}, whose record this branch replays, was deleted",
            fork.of
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, run, step};
    use crate::model::EventType;
    use crate::model::ForkPoint;

    fn branch() -> RunRecord {
        let mut branch = run();
        branch.id = RunId::new();
        branch.fork = Some(Fork {
            of: run().id,
            at: None,
            results: Default::default(),
        });
        branch
    }

    fn settled(key: &str, turn: u32) -> StepRecord {
        let mut recorded = step();
        recorded.key = StepKey::from_stored(key.to_owned());
        recorded.turn = turn;
        recorded.status = StepStatus::Succeeded;
        recorded.outcome = Some(Outcome::Ok);
        recorded.output = Some("\"done\"".into());
        recorded
    }

    fn tool(read_only: bool, writes: bool) -> Subject<'static> {
        Subject::Tool {
            name: "refund",
            read_only,
            writes,
        }
    }

    fn call(step: &StepRecord) -> (&str, &str) {
        (&step.call_hash, &step.arguments)
    }

    #[test]
    fn a_recorded_call_replays_and_anything_else_only_reads_run_live() {
        let recorded = settled("t0/p0", 0);
        let branch = branch();
        assert_eq!(
            judge(&branch, tool(false, true), Some(&recorded), call(&recorded)),
            Verdict::Replay(Box::new(recorded.clone()))
        );
        assert_eq!(
            judge(
                &branch,
                tool(false, true),
                Some(&recorded),
                ("other", &recorded.arguments)
            ),
            blocked("refund".into(), BlockReason::Write),
            "other arguments are another call"
        );
        assert_eq!(judge(&branch, tool(true, false), None, ("h", "{}")), Verdict::Live);
        assert_eq!(
            judge(&branch, tool(false, false), None, ("h", "{}")),
            blocked("refund".into(), BlockReason::Unmarked)
        );
        let mut running = recorded.clone();
        running.status = StepStatus::Running;
        assert_eq!(
            judge(&branch, tool(true, false), Some(&running), call(&running)),
            Verdict::Live,
            "only a settled step is a record"
        );
    }

    #[test]
    fn the_fork_point_bounds_what_replays() {
        let mut branch = branch();
        branch.fork.as_mut().unwrap().at = Some(ForkPoint {
            key: StepKey::from_stored("t1/p0".into()),
            turn: 1,
            position: 0,
        });
        let before = settled("t1/p0", 1);
        let after = settled("t2/p0", 2);
        assert!(matches!(
            judge(&branch, tool(false, true), Some(&before), call(&before)),
            Verdict::Replay(_)
        ));
        assert_eq!(
            judge(&branch, tool(false, true), Some(&after), call(&after)),
            blocked("refund".into(), BlockReason::Write)
        );
        assert_eq!(
            judge(&branch, tool(true, false), Some(&after), call(&after)),
            Verdict::Live
        );
    }

    #[test]
    fn steps_run_live_only_as_reads_and_once_never() {
        let branch = branch();
        let step = |effect, once| Subject::Step {
            id: "plan",
            effect,
            once,
        };
        assert_eq!(
            judge(&branch, step(Effect::Read, false), None, ("", "null")),
            Verdict::Live
        );
        assert_eq!(
            judge(&branch, step(Effect::Pure, false), None, ("", "null")),
            Verdict::Live
        );
        for (effect, once) in [(Effect::Write, false), (Effect::Read, true)] {
            assert_eq!(
                judge(&branch, step(effect, once), None, ("", "null")),
                blocked("ctx.step:plan".into(), BlockReason::Step)
            );
        }
        let mut recorded = settled("step:plan#0", 3);
        recorded.call_hash = String::new();
        recorded.arguments = "null".into();
        assert!(matches!(
            judge(&branch, step(Effect::Write, true), Some(&recorded), ("", "null")),
            Verdict::Replay(_)
        ));
    }

    #[test]
    fn a_case_run_allows_what_its_tokens_name_and_a_branch_never_runs_a_write() {
        let mut case = run();
        case.allow = vec!["tool:refund".into(), "step:charge".into()];
        assert!(guarded(&case) && !guarded(&run()));
        assert_eq!(judge(&case, tool(false, true), None, ("h", "{}")), Verdict::Live);
        let charge = Subject::Step {
            id: "charge",
            effect: Effect::Write,
            once: false,
        };
        assert_eq!(judge(&case, charge, None, ("", "null")), Verdict::Live);
        let other = Subject::Tool {
            name: "delete",
            read_only: false,
            writes: false,
        };
        let refused = judge(&case, other, None, ("h", "{}"));
        assert_eq!(refused, blocked("delete".into(), BlockReason::Unmarked));
        let child = Subject::Subagent {
            agent: "helper",
            session: false,
        };
        assert_eq!(
            judge(&case, child, None, ("", "null")),
            Verdict::Live,
            "subagents count as reads"
        );
        let mut tokens = branch();
        tokens.allow = case.allow.clone();
        assert_eq!(
            judge(&tokens, tool(false, true), None, ("h", "{}")),
            blocked("refund".into(), BlockReason::Write),
            "a writes tool is refused live in every branch"
        );
    }

    #[test]
    fn a_subagent_the_parent_started_runs_as_a_branch_of_its_child() {
        let branch = branch();
        let child = RunId::new();
        let mut recorded = settled("subagent:helper#0", 2);
        recorded.kind = StepKind::Subagent;
        recorded.call_hash = String::new();
        recorded.arguments = "{\"q\":1}".into();
        recorded.call_id = Some(child.to_string());
        let subject = |session| Subject::Subagent {
            agent: "helper",
            session,
        };
        assert!(matches!(
            judge(&branch, subject(false), Some(&recorded), ("", "{\"q\":1}")),
            Verdict::Replay(_)
        ));
        assert_eq!(
            judge(&branch, subject(false), Some(&recorded), ("", "{\"q\":2}")),
            Verdict::BranchOf(child)
        );
        assert_eq!(
            judge(&branch, subject(true), Some(&recorded), ("", "{\"q\":2}")),
            blocked("subagent:helper".into(), BlockReason::Effect)
        );
        assert_eq!(
            judge(&branch, subject(false), None, ("", "{}")),
            blocked("subagent:helper".into(), BlockReason::Effect)
        );
    }

    #[test]
    fn a_replay_is_marked_as_the_parent_s_and_takes_the_fork_s_result() {
        let mut branch = branch();
        let recorded = settled("t0/p0", 0);
        let change = replay(&branch, &recorded, (0, 0), NOW);
        assert_eq!(change.step.from_run.as_ref(), Some(&run().id));
        assert_eq!(
            (
                change.step.run_id.clone(),
                change.step.decided_by.as_deref(),
                change.step.attempts
            ),
            (branch.id.clone(), Some(FROM_PARENT), 0)
        );
        assert_eq!(change.event.kind, EventType::ToolResult);
        assert_ne!(change.step.idempotency_key, recorded.idempotency_key);
        branch
            .fork
            .as_mut()
            .unwrap()
            .results
            .insert("t0/p0".into(), "{\"price\":5}".into());
        let set = replay(&branch, &recorded, (0, 0), NOW);
        assert_eq!(
            (set.step.output.as_deref(), set.step.decided_by.as_deref()),
            (Some("{\"price\":5}"), Some(SET_BY_FORK))
        );
        assert_eq!(set.event.payload["output"]["price"], 5);
    }

    #[test]
    fn the_reason_is_withheld_at_capture_none() {
        let refused = Blocked {
            subject: "refund".into(),
            reason: BlockReason::Write,
        };
        let mut branch = branch();
        assert!(refused.message(&branch).contains("(reason: write)"));
        assert_eq!(
            refused.run_reason(Capture::Io),
            "write_tool_blocked: refund (reason: write)"
        );
        branch.capture = Capture::None;
        let hidden = refused.message(&branch);
        assert!(
            hidden.starts_with("write_tool_blocked: 'refund'") && !hidden.contains("write)"),
            "{hidden}"
        );
        assert!(!refused.run_reason(Capture::None).contains("reason: "));
    }

    #[test]
    fn a_branch_without_its_parent_is_unresumable() {
        let branch = branch();
        assert!(unresumable(&branch, true).is_none());
        assert!(
            unresumable(&branch, false)
                .unwrap()
                .starts_with("branch_unresumable: parent_missing")
        );
        assert!(
            unresumable(&run(), false).is_none(),
            "a run that is no branch has no parent to miss"
        );
    }
}
