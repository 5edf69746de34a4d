//! Two runs' steps side by side, aligned by identity: what `kernelctl runs diff` prints and the
//! console's comparison page draws.
//!
//! A step's key is its identity in a run (`t<turn>/p<position>`, `id:<call id>`,
//! `step:<id>#<n>`, `subagent:<agent>#<n>`), so the same key in two runs is the same call: a
//! branch's replayed steps sit at their parent's keys. Values are compared as the kernel sent
//! them: arguments and results a run's capture level withheld are compared as their placeholders
//! (sizes and hashes at `metadata`), never guessed at.

use serde::Serialize;

use crate::v1 as pb;

/// `decided_by` of a branch step replaying its parent's recorded outcome.
const BRANCH_PARENT: &str = "branch:parent";
/// `decided_by` of a branch step replaying the result the fork put in place of the parent's.
const BRANCH_SET_RESULT: &str = "branch:set_result";

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
    /// The mark in words.
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

/// One identity: the index of the step each run recorded at it, and how they compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aligned {
    pub a: Option<usize>,
    pub b: Option<usize>,
    pub mark: Mark,
    pub differs: Vec<Difference>,
}

/// Two runs' steps aligned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alignment {
    pub rows: Vec<Aligned>,
    /// The key of the first step a branch refused with write_tool_blocked: B's, else A's.
    pub stopped_at: Option<String>,
}

/// Aligns `a`'s and `b`'s steps by key, in (turn, position) order of whichever run has the step,
/// A's first where they tie. A hosted run's own dispatch (its `agent` step) is not a call either
/// run made, so it is left out.
pub fn align(a: &[pb::Step], b: &[pb::Step]) -> Alignment {
    let calls = |steps: &[pb::Step]| -> Vec<usize> {
        (0..steps.len())
            .filter(|&index| steps[index].kind != pb::StepKind::Agent as i32 && steps[index].step_key != "agent")
            .collect()
    };
    let (a_calls, b_calls) = (calls(a), calls(b));
    let in_b = |key: &str| b_calls.iter().copied().find(|&index| b[index].step_key == key);
    let mut pairs: Vec<(Option<usize>, Option<usize>)> = (a_calls.iter())
        .map(|&index| (Some(index), in_b(&a[index].step_key)))
        .collect();
    pairs.extend(
        (b_calls.iter())
            .filter(|&&index| !a_calls.iter().any(|&other| a[other].step_key == b[index].step_key))
            .map(|&index| (None, Some(index))),
    );
    let step = |(a_index, b_index): (Option<usize>, Option<usize>)| match (a_index, b_index) {
        (Some(index), _) => &a[index],
        (None, Some(index)) => &b[index],
        (None, None) => unreachable!("a pair holds a step"),
    };
    // Stable: among steps at the same place, A's order, then B's extra ones.
    pairs.sort_by_key(|&pair| (step(pair).turn, step(pair).position));
    let rows: Vec<Aligned> = (pairs.into_iter())
        .map(|(a_index, b_index)| {
            let (a_step, b_step) = (a_index.map(|i| &a[i]), b_index.map(|i| &b[i]));
            Aligned {
                a: a_index,
                b: b_index,
                mark: mark(a_step, b_step),
                differs: match (a_step, b_step) {
                    (Some(a_step), Some(b_step)) => differences(a_step, b_step),
                    _ => Vec::new(),
                },
            }
        })
        .collect();
    let blocked_in = |steps: &[pb::Step], side: fn(&Aligned) -> Option<usize>| {
        (rows.iter())
            .filter_map(side)
            .find(|&index| is_blocked(&steps[index]))
            .map(|index| steps[index].step_key.clone())
    };
    let stopped_at = blocked_in(b, |row| row.b).or_else(|| blocked_in(a, |row| row.a));
    Alignment { rows, stopped_at }
}

fn is_blocked(step: &pb::Step) -> bool {
    step.outcome == pb::CallOutcome::WriteToolBlocked as i32
}

fn mark(a: Option<&pb::Step>, b: Option<&pb::Step>) -> Mark {
    match (a, b) {
        (_, None) => Mark::OnlyInA,
        (_, Some(b)) if is_blocked(b) => Mark::Blocked,
        (_, Some(b)) if b.decided_by == BRANCH_SET_RESULT => Mark::Set,
        (_, Some(b)) if !b.replayed_from_run_id.is_empty() && b.decided_by == BRANCH_PARENT => Mark::Replayed,
        (None, Some(_)) => Mark::OnlyInB,
        (Some(_), Some(_)) => Mark::Live,
    }
}

fn differences(a: &pb::Step, b: &pb::Step) -> Vec<Difference> {
    let mut differs = Vec::new();
    if a.kind != b.kind || a.tool != b.tool {
        differs.push(Difference::Tool);
    }
    if !same_json(&a.arguments_json, &b.arguments_json) {
        differs.push(Difference::Arguments);
    }
    if !same_json(&a.output_json, &b.output_json) || a.error != b.error {
        differs.push(Difference::Result);
    }
    if a.status != b.status || a.outcome != b.outcome {
        differs.push(Difference::Status);
    }
    differs
}

/// Whether two JSON texts hold the same value (text that is not JSON compares as text).
fn same_json(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(key: &str, turn: u32, position: u32) -> pb::Step {
        pb::Step {
            step_key: key.into(),
            turn,
            position,
            kind: pb::StepKind::Tool as i32,
            tool: "search".into(),
            arguments_json: r#"{"q":"x","n":1}"#.into(),
            output_json: "[1]".into(),
            ..Default::default()
        }
    }

    #[test]
    fn steps_align_by_key_in_turn_then_position_order() {
        let a = [step("t0/p0", 0, 0), step("t1/p0", 1, 0), step("id:x", 2, 0)];
        let agent = pb::Step {
            kind: pb::StepKind::Agent as i32,
            ..step("agent", 0, 0)
        };
        let b = [
            step("t0/p1", 0, 1),
            step("t1/p0", 1, 0),
            step("t0/p0", 0, 0),
            step("id:y", 1, 0),
            agent,
        ];
        let aligned = align(&a, &b);
        let rows: Vec<(Option<usize>, Option<usize>, Mark)> = aligned.rows.iter().map(|r| (r.a, r.b, r.mark)).collect();
        assert_eq!(
            rows,
            [
                (Some(0), Some(2), Mark::Live),
                (None, Some(0), Mark::OnlyInB),
                (Some(1), Some(1), Mark::Live),
                (None, Some(3), Mark::OnlyInB),
                (Some(2), None, Mark::OnlyInA),
            ]
        );
        assert!(aligned.rows.iter().all(|r| r.differs.is_empty()));
        assert_eq!(aligned.stopped_at, None);
    }

    #[test]
    fn json_is_compared_as_values_and_a_blocked_branch_says_where_it_stopped() {
        let reordered = pb::Step {
            arguments_json: r#"{"n":1,"q":"x"}"#.into(),
            ..step("t0/p0", 0, 0)
        };
        let blocked = pb::Step {
            outcome: pb::CallOutcome::WriteToolBlocked as i32,
            output_json: String::new(),
            error: "write_tool_blocked: search".into(),
            ..step("t0/p1", 0, 1)
        };
        let aligned = align(&[step("t0/p0", 0, 0), step("t0/p1", 0, 1)], &[reordered, blocked]);
        assert_eq!(aligned.rows[0].differs, []);
        assert_eq!(aligned.rows[1].mark, Mark::Blocked);
        assert_eq!(aligned.rows[1].differs, [Difference::Result, Difference::Status]);
        assert_eq!(aligned.stopped_at.as_deref(), Some("t0/p1"));
    }
}
