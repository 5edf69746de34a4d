//! `runs diff`: two runs' steps side by side, aligned by identity.
//!
//! A step's key is its identity in a run (`t<turn>/p<position>`, `id:<call id>`,
//! `step:<id>#<n>`, `subagent:<agent>#<n>`), so the same key in two runs is the same call: a
//! branch's replayed steps sit at their parent's keys. [`RunDiff::new`] is a pure function of two
//! [`RunDetail`]s; `--json` prints what it returns and [`crate::render::run_diff`] draws it.
//! Values are compared as the kernel sent them: arguments and results a run's capture level
//! withheld are compared as their placeholders (sizes and hashes at `metadata`), never guessed at.

pub use kernel_proto::alignment::{Difference, Mark};
use kernel_proto::v1 as pb;
use serde::Serialize;

use crate::error::CliError;
use crate::view::{Json, RunView, StepView};

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

/// Who branched from whom, as the header says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lineage {
    BranchOfA,
    BranchOfB,
    Unrelated,
}

impl RunDiff {
    /// Aligns `a`'s and `b`'s steps as [`kernel_proto::alignment::align`] does.
    pub fn new(a: &pb::GetRunResponse, b: &pb::GetRunResponse) -> Result<Self, CliError> {
        let run = |got: &pb::GetRunResponse| {
            (got.run.clone())
                .map(RunView::from)
                .ok_or(CliError::MalformedResponse("GetRun returned no run"))
        };
        let (a_run, b_run) = (run(a)?, run(b)?);
        let aligned = kernel_proto::alignment::align(&a.steps, &b.steps);
        let view = |got: &pb::GetRunResponse, index: usize| StepView::from(got.steps[index].clone());
        let steps = (aligned.rows.into_iter())
            .map(|row| {
                let (a_step, b_step) = (row.a.map(|i| view(a, i)), row.b.map(|i| view(b, i)));
                let step = a_step.as_ref().or(b_step.as_ref()).expect("a row holds a step");
                StepDiff {
                    step_key: step.key.clone(),
                    tool: tool_of(step),
                    a: a_step.as_ref().map(StepSide::from),
                    b: b_step.as_ref().map(StepSide::from),
                    mark: row.mark,
                    differs: row.differs,
                }
            })
            .collect();
        Ok(Self {
            a: RunSummary::from(&a_run),
            b: RunSummary::from(&b_run),
            steps,
            stopped_at: aligned.stopped_at,
        })
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

/// What a step called: a tool's name, or a handler step's kind and name (`local:fetch`).
fn tool_of(step: &StepView) -> String {
    match step.kind.as_str() {
        "tool" => step.tool.clone(),
        kind => format!("{kind}:{}", step.tool),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::view::tests::{sample_run, sample_step};

    fn detail(id: &str, steps: Vec<pb::Step>) -> pb::GetRunResponse {
        pb::GetRunResponse {
            run: Some(pb::Run {
                id: id.into(),
                ..sample_run()
            }),
            steps,
            ..Default::default()
        }
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
        let diff = RunDiff::new(&a, &b).unwrap();
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
            decided_by: "branch:parent".into(),
            ..sample_step(0, 0)
        };
        let set = pb::Step {
            replayed_from_run_id: "a".into(),
            decided_by: "branch:set_result".into(),
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
        branch.run.as_mut().unwrap().forked_from_run_id = "a".into();
        let diff = RunDiff::new(&parent, &branch).unwrap();
        let marks: Vec<Mark> = diff.steps.iter().map(|s| s.mark).collect();
        assert_eq!(marks, [Mark::Replayed, Mark::Set, Mark::Blocked]);
        assert_eq!(diff.steps[0].differs, []);
        assert_eq!(diff.steps[1].differs, [Difference::Result]);
        assert_eq!(diff.steps[2].differs, [Difference::Result, Difference::Status]);
        assert_eq!(diff.stopped_at.as_deref(), Some("t0/p2"));
        assert_eq!(diff.lineage(), Lineage::BranchOfA);
        assert_eq!(RunDiff::new(&branch, &parent).unwrap().lineage(), Lineage::BranchOfB);
        assert_eq!(
            RunDiff::new(&branch, &parent).unwrap().stopped_at.as_deref(),
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
        )
        .unwrap();
        assert_eq!(same.steps[0].differs, []);
        let other = RunDiff::new(
            &detail("a", vec![withheld(9, "ab")]),
            &detail("b", vec![withheld(9, "cd")]),
        )
        .unwrap();
        assert_eq!(other.steps[0].differs, [Difference::Arguments]);
    }
}
