//! `runs diff`: two runs' steps side by side, aligned by identity.
//!
//! A step's key is its identity in a run (`t<turn>/p<position>`, `id:<call id>`,
//! `step:<id>#<n>`, `subagent:<agent>#<n>`), so the same key in two runs is the same call: a
//! branch's replayed steps sit at their parent's keys. [`RunDiff::new`] is a pure function of two
//! [`RunDetail`]s; `--json` prints what it returns and [`crate::render::run_diff`] draws it.
//! Values are compared as the kernel sent them: arguments and results a run's capture level
//! withheld are compared as their placeholders (sizes and hashes at `metadata`), never guessed at.

use serde::Serialize;

use crate::view::{Json, RunDetail, RunView, StepView};

/// The outcome of a call a branch (or case run) refused: where the branch stopped.
const WRITE_TOOL_BLOCKED: &str = "write_tool_blocked";
/// `decided_by` of a branch step replaying its parent's recorded outcome.
const BRANCH_PARENT: &str = "branch:parent";
/// `decided_by` of a branch step replaying the result the fork put in place of the parent's.
const BRANCH_SET_RESULT: &str = "branch:set_result";

/// Two runs and their steps, aligned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunDiff {
    pub a: RunSummary,
    pub b: RunSummary,
    pub steps: Vec<StepDiff>,
    /// The first step a branch refused with write_tool_blocked: B's, else A's.
    pub stopped_at: Option<String>,
}

/// What the header of a diff says of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: String,
    pub agent: String,
    pub status: String,
    pub reason: Option<String>,
    /// `io`, `metadata` or `none`: how much of its arguments and results could be compared.
    pub capture: String,
    pub forked_from_run_id: Option<String>,
    pub fork_at_step_key: Option<String>,
}

impl From<&RunView> for RunSummary {
    fn from(run: &RunView) -> Self {
        Self {
            id: run.id.clone(),
            agent: run.agent.clone(),
            status: run.status.clone(),
            reason: run.reason.clone(),
            capture: run.capture.clone(),
            forked_from_run_id: run.forked_from_run_id.clone(),
            fork_at_step_key: run.fork_at_step_key.clone(),
        }
    }
}

/// One identity and what each run recorded at it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepDiff {
    pub step_key: String,
    /// The tool (or `local:`/`subagent:` name) A called there, else B's.
    pub tool: String,
    pub a: Option<StepSide>,
    pub b: Option<StepSide>,
    pub mark: Mark,
    pub differs: Vec<Difference>,
}

/// What one run recorded at a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepSide {
    pub status: String,
    pub outcome: Option<String>,
    pub arguments: Json,
    pub result: Option<Json>,
    pub error: Option<String>,
    /// [`StepView::shown_status`], for the table.
    #[serde(skip)]
    pub shown_status: String,
}

impl From<&StepView> for StepSide {
    fn from(step: &StepView) -> Self {
        Self {
            status: step.status.clone(),
            outcome: step.outcome.clone(),
            arguments: step.arguments.clone(),
            result: step.output.clone(),
            error: step.error.as_ref().map(|error| error.message.clone()),
            shown_status: step.shown_status().to_owned(),
        }
    }
}

impl StepSide {
    fn is_blocked(&self) -> bool {
        self.outcome.as_deref() == Some(WRITE_TOOL_BLOCKED)
    }
}

/// What B's step is, relative to A's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// B replays its parent's recorded outcome; nothing ran.
    Replayed,
    /// B replays the result its fork put in place of the parent's.
    Set,
    /// B ran the step itself.
    Live,
    /// B refused the step with write_tool_blocked: where the branch stopped.
    Blocked,
    OnlyInA,
    OnlyInB,
}

impl Mark {
    /// The mark in the table's words.
    pub fn words(self) -> &'static str {
        match self {
            Mark::Replayed => "replayed",
            Mark::Set => "set",
            Mark::Live => "live",
            Mark::Blocked => "blocked",
            Mark::OnlyInA => "only in A",
            Mark::OnlyInB => "only in B",
        }
    }
}

/// A part of a step the two runs recorded differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Difference {
    /// Another tool at the same identity (the kernel refuses such a replay).
    Tool,
    Arguments,
    /// The output or the error.
    Result,
    /// The status or the outcome.
    Status,
}

impl Difference {
    pub fn word(self) -> &'static str {
        match self {
            Difference::Tool => "tool",
            Difference::Arguments => "arguments",
            Difference::Result => "result",
            Difference::Status => "status",
        }
    }
}

/// Who branched from whom, as the header says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lineage {
    BranchOfA,
    BranchOfB,
    Unrelated,
}

impl RunDiff {
    /// Aligns `a`'s and `b`'s steps by key, in (turn, position) order of whichever run has the
    /// step, A's first where they tie. A hosted run's own dispatch (its `agent` step) is not a
    /// call either run made, so it is left out.
    pub fn new(a: &RunDetail, b: &RunDetail) -> Self {
        fn calls(detail: &RunDetail) -> Vec<&StepView> {
            detail
                .steps
                .iter()
                .filter(|step| step.kind != "agent" && step.key != "agent")
                .collect()
        }
        let (a_steps, b_steps) = (calls(a), calls(b));
        let mut pairs: Vec<(Option<&StepView>, Option<&StepView>)> = a_steps
            .iter()
            .map(|a_step| {
                (
                    Some(*a_step),
                    b_steps.iter().find(|b_step| b_step.key == a_step.key).copied(),
                )
            })
            .collect();
        pairs.extend(
            b_steps
                .iter()
                .filter(|b_step| !a_steps.iter().any(|a_step| a_step.key == b_step.key))
                .map(|b_step| (None, Some(*b_step))),
        );
        // Stable: among steps at the same place, A's order, then B's extra ones.
        pairs.sort_by_key(|(a_step, b_step)| {
            let step = a_step.or(*b_step).expect("a pair holds a step");
            (step.turn, step.position)
        });
        let steps: Vec<StepDiff> = pairs
            .into_iter()
            .map(|(a_step, b_step)| StepDiff::new(a_step, b_step))
            .collect();
        let blocked_in = |side: fn(&StepDiff) -> Option<&StepSide>| {
            steps
                .iter()
                .find(|step| side(step).is_some_and(StepSide::is_blocked))
                .map(|step| step.step_key.clone())
        };
        let stopped_at = blocked_in(|step| step.b.as_ref()).or_else(|| blocked_in(|step| step.a.as_ref()));
        Self {
            a: RunSummary::from(&a.run),
            b: RunSummary::from(&b.run),
            steps,
            stopped_at,
        }
    }

    /// Whether one run is a branch of the other.
    pub fn lineage(&self) -> Lineage {
        if self.b.forked_from_run_id.as_deref() == Some(self.a.id.as_str()) {
            Lineage::BranchOfA
        } else if self.a.forked_from_run_id.as_deref() == Some(self.b.id.as_str()) {
            Lineage::BranchOfB
        } else {
            Lineage::Unrelated
        }
    }
}

impl StepDiff {
    fn new(a: Option<&StepView>, b: Option<&StepView>) -> Self {
        let step = a.or(b).expect("a pair holds a step");
        let mark = match (a, b) {
            (_, None) => Mark::OnlyInA,
            (_, Some(b)) if b.outcome.as_deref() == Some(WRITE_TOOL_BLOCKED) => Mark::Blocked,
            (_, Some(b)) if b.decided_by.as_deref() == Some(BRANCH_SET_RESULT) => Mark::Set,
            (_, Some(b)) if b.replayed_from_run_id.is_some() && b.decided_by.as_deref() == Some(BRANCH_PARENT) => {
                Mark::Replayed
            }
            (None, Some(_)) => Mark::OnlyInB,
            (Some(_), Some(_)) => Mark::Live,
        };
        let differs = match (a, b) {
            (Some(a), Some(b)) => differences(a, b),
            _ => Vec::new(),
        };
        Self {
            step_key: step.key.clone(),
            tool: tool_of(step),
            a: a.map(StepSide::from),
            b: b.map(StepSide::from),
            mark,
            differs,
        }
    }
}

/// What a step called: a tool's name, or a handler step's kind and name (`local:fetch`).
fn tool_of(step: &StepView) -> String {
    match step.kind.as_str() {
        "tool" => step.tool.clone(),
        kind => format!("{kind}:{}", step.tool),
    }
}

fn differences(a: &StepView, b: &StepView) -> Vec<Difference> {
    let error = |step: &StepView| step.error.as_ref().map(|error| error.message.clone());
    let mut differs = Vec::new();
    if tool_of(a) != tool_of(b) {
        differs.push(Difference::Tool);
    }
    if a.arguments != b.arguments {
        differs.push(Difference::Arguments);
    }
    if a.output != b.output || error(a) != error(b) {
        differs.push(Difference::Result);
    }
    if a.status != b.status || a.outcome != b.outcome {
        differs.push(Difference::Status);
    }
    differs
}

#[cfg(test)]
mod tests {
    use kernel_proto::v1 as pb;
    use serde_json::json;

    use super::*;
    use crate::view::tests::{sample_run, sample_step};

    fn detail(id: &str, steps: Vec<pb::Step>) -> RunDetail {
        RunDetail::try_from(pb::GetRunResponse {
            run: Some(pb::Run {
                id: id.into(),
                ..sample_run()
            }),
            steps,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn steps_align_by_key_in_turn_then_position_order() {
        let at = |key: &str, turn, position| pb::Step {
            step_key: key.into(),
            ..sample_step(turn, position)
        };
        let a = detail("a", vec![at("t0/p0", 0, 0), at("t1/p0", 1, 0), at("id:x", 2, 0)]);
        let b = detail(
            "b",
            vec![
                at("t0/p1", 0, 1),
                at("t1/p0", 1, 0),
                at("t0/p0", 0, 0),
                at("id:y", 1, 0),
                pb::Step {
                    kind: pb::StepKind::Agent as i32,
                    ..at("agent", 0, 0)
                },
            ],
        );
        let diff = RunDiff::new(&a, &b);
        let rows: Vec<(&str, Mark)> = diff.steps.iter().map(|s| (s.step_key.as_str(), s.mark)).collect();
        assert_eq!(
            rows,
            [
                ("t0/p0", Mark::Live),
                ("t0/p1", Mark::OnlyInB),
                ("t1/p0", Mark::Live),
                ("id:y", Mark::OnlyInB),
                ("id:x", Mark::OnlyInA),
            ]
        );
        assert!(diff.steps.iter().all(|s| s.differs.is_empty()), "{diff:?}");
        assert_eq!(diff.stopped_at, None);
        assert_eq!(diff.lineage(), Lineage::Unrelated);
    }

    #[test]
    fn a_branch_step_is_marked_by_how_it_got_its_outcome() {
        let parent = detail("a", vec![sample_step(0, 0), sample_step(0, 1), sample_step(0, 2)]);
        let replayed = pb::Step {
            replayed_from_run_id: "a".into(),
            decided_by: BRANCH_PARENT.into(),
            ..sample_step(0, 0)
        };
        let set = pb::Step {
            replayed_from_run_id: "a".into(),
            decided_by: BRANCH_SET_RESULT.into(),
            output_json: r#"["XX1"]"#.into(),
            ..sample_step(0, 1)
        };
        let blocked = pb::Step {
            status: pb::StepStatus::Failed as i32,
            outcome: pb::CallOutcome::WriteToolBlocked as i32,
            output_json: String::new(),
            error: "write_tool_blocked: search".into(),
            ..sample_step(0, 2)
        };
        let mut branch = detail("b", vec![replayed, set, blocked]);
        branch.run.forked_from_run_id = Some("a".into());
        let diff = RunDiff::new(&parent, &branch);
        let marks: Vec<Mark> = diff.steps.iter().map(|s| s.mark).collect();
        assert_eq!(marks, [Mark::Replayed, Mark::Set, Mark::Blocked]);
        assert_eq!(diff.steps[0].differs, []);
        assert_eq!(diff.steps[1].differs, [Difference::Result]);
        assert_eq!(diff.steps[2].differs, [Difference::Result, Difference::Status]);
        assert_eq!(diff.stopped_at.as_deref(), Some("t0/p2"));
        assert_eq!(diff.lineage(), Lineage::BranchOfA);
        assert_eq!(RunDiff::new(&branch, &parent).lineage(), Lineage::BranchOfB);
        assert_eq!(
            RunDiff::new(&branch, &parent).stopped_at.as_deref(),
            Some("t0/p2"),
            "the branch stopped there whichever side it is on"
        );
    }

    #[test]
    fn withheld_values_are_compared_as_sent() {
        let withheld = |bytes: u32, sha: &str| pb::Step {
            arguments_json: json!({"withheld": "capture=metadata", "bytes": bytes, "sha256": sha}).to_string(),
            ..sample_step(0, 0)
        };
        let same = RunDiff::new(
            &detail("a", vec![withheld(9, "ab")]),
            &detail("b", vec![withheld(9, "ab")]),
        );
        assert_eq!(same.steps[0].differs, []);
        let other = RunDiff::new(
            &detail("a", vec![withheld(9, "ab")]),
            &detail("b", vec![withheld(9, "cd")]),
        );
        assert_eq!(other.steps[0].differs, [Difference::Arguments]);
    }
}
