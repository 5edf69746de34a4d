//! What a replica's commits tell the others, over `NOTIFY`: the runs they wrote (their new events
//! by sequence number), the tools and agents that gained a step waiting for a worker, and whether
//! the registry changed. It carries ids only; a listener reads the rows.
//!
//! A notice is not sent in the commit it tells of: PostgreSQL serializes every notifying commit
//! of the cluster through one lock, which would make each replica's writer wait on the others'.
//! The writer hands each committed notice to [`crate::cluster::feed`], which merges those that
//! arrive while one is on its way and sends them as one, after their commits, so a listener never
//! reads a row not yet committed. A replica killed between a commit and its notice tells nobody:
//! the others catch up from the store when its shards move ([`crate::cluster::feed::Feed`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::StepKind;
use crate::store::Published;

/// The channel every replica listens on.
pub const CHANNEL: &str = "kernel_commits";

/// PostgreSQL refuses a payload of 8,000 bytes or more; a commit that says more sends several.
const MAX_PAYLOAD: usize = 7_000;

/// One or more commits' news, as sent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    /// The replica that committed.
    #[serde(rename = "o")]
    pub origin: String,
    /// Runs written, with the first and last sequence number of their new events.
    #[serde(rename = "r", default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<(String, u64, u64)>,
    /// Tools with a call newly waiting for a worker.
    #[serde(rename = "t", default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Agents with a run's dispatch newly waiting for a worker.
    #[serde(rename = "a", default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    /// The tool or agent registry changed.
    #[serde(rename = "g", default, skip_serializing_if = "std::ops::Not::not")]
    pub registry: bool,
}

impl Notice {
    /// What one commit's events (`published`) and the steps it left waiting say, from `origin`.
    pub fn of(origin: &str, (published, waiting): (&[Published], &[(StepKind, String)]), registry: bool) -> Notice {
        let mut runs: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        let mut tools = std::collections::BTreeSet::new();
        let mut agents = std::collections::BTreeSet::new();
        for item in published {
            let range = runs
                .entry(item.event.run_id.as_str())
                .or_insert((item.event.seq, item.event.seq));
            range.0 = range.0.min(item.event.seq);
            range.1 = range.1.max(item.event.seq);
            if let Some(step) = &item.step
                && step.status == crate::model::StepStatus::Pending
            {
                match step.kind {
                    StepKind::Agent => agents.insert(step.tool.as_str()),
                    _ => tools.insert(step.tool.as_str()),
                };
            }
        }
        for (kind, name) in waiting {
            match kind {
                StepKind::Agent => agents.insert(name.as_str()),
                _ => tools.insert(name.as_str()),
            };
        }
        Notice {
            origin: origin.to_owned(),
            runs: runs
                .into_iter()
                .map(|(run, (from, to))| (run.to_owned(), from, to))
                .collect(),
            tools: tools.into_iter().map(str::to_owned).collect(),
            agents: agents.into_iter().map(str::to_owned).collect(),
            registry,
        }
    }

    /// Adds what `later` tells, from the same replica: each run's range grows to cover both.
    pub fn merge(&mut self, later: Notice) {
        let mut index: std::collections::HashMap<String, usize> = self
            .runs
            .iter()
            .enumerate()
            .map(|(at, (run, ..))| (run.clone(), at))
            .collect();
        for (run, from, to) in later.runs {
            match index.get(&run) {
                Some(&at) => {
                    let range = &mut self.runs[at];
                    range.1 = range.1.min(from);
                    range.2 = range.2.max(to);
                }
                None => {
                    index.insert(run.clone(), self.runs.len());
                    self.runs.push((run, from, to));
                }
            }
        }
        for tool in later.tools {
            if !self.tools.contains(&tool) {
                self.tools.push(tool);
            }
        }
        for agent in later.agents {
            if !self.agents.contains(&agent) {
                self.agents.push(agent);
            }
        }
        self.registry |= later.registry;
    }

    /// Whether there is nothing to tell.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.tools.is_empty() && self.agents.is_empty() && !self.registry
    }

    /// The payloads to send, each under PostgreSQL's limit: the names and flags ride in the
    /// first, the runs are spread over as many as they need.
    pub fn payloads(&self) -> Vec<String> {
        let head = Notice {
            runs: Vec::new(),
            ..self.clone()
        };
        let mut out = Vec::new();
        let mut current = head;
        let mut size = serde_json::to_string(&current).expect("a notice serializes").len();
        for run in &self.runs {
            let cost = run.0.len() + 48;
            if size + cost > MAX_PAYLOAD && !current.runs.is_empty() {
                out.push(current);
                current = Notice {
                    origin: self.origin.clone(),
                    ..Notice::default()
                };
                size = 32 + self.origin.len();
            }
            size += cost;
            current.runs.push(run.clone());
        }
        out.push(current);
        out.into_iter()
            .map(|notice| serde_json::to_string(&notice).expect("a notice serializes"))
            .collect()
    }

    /// Reads a payload another replica sent; `None` for one this build does not understand.
    pub fn parse(payload: &str) -> Option<Notice> {
        serde_json::from_str(payload).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_notice_is_split_under_the_limit_and_reads_back_whole() {
        let notice = Notice {
            origin: "replica-a".into(),
            runs: (0..400)
                .map(|n| (format!("0193a1b2-c3d4-7e5f-8a9b-{n:012}"), n, n + 3))
                .collect(),
            tools: vec!["o'brien".into()],
            agents: vec!["planner".into()],
            registry: true,
        };
        let payloads = notice.payloads();
        assert!(payloads.len() > 1, "{} payloads", payloads.len());
        let mut runs = Vec::new();
        for (index, payload) in payloads.iter().enumerate() {
            assert!(payload.len() < 8_000, "payload {index} is {} bytes", payload.len());
            let part = Notice::parse(payload).expect("parses");
            assert_eq!(part.origin, "replica-a");
            assert_eq!(part.registry, index == 0);
            runs.extend(part.runs);
        }
        assert_eq!(runs, notice.runs);
    }

    #[test]
    fn merged_notices_cover_every_range_once() {
        let mut first = Notice {
            origin: "replica-a".into(),
            runs: vec![("r1".into(), 4, 6), ("r2".into(), 1, 1)],
            tools: vec!["search".into()],
            ..Notice::default()
        };
        first.merge(Notice {
            origin: "replica-a".into(),
            runs: vec![("r1".into(), 7, 9), ("r3".into(), 2, 2)],
            tools: vec!["search".into(), "charge".into()],
            agents: vec!["planner".into()],
            registry: true,
        });
        assert_eq!(
            first.runs,
            vec![("r1".into(), 4, 9), ("r2".into(), 1, 1), ("r3".into(), 2, 2)]
        );
        assert_eq!(first.tools, vec!["search".to_owned(), "charge".to_owned()]);
        assert_eq!(first.agents, vec!["planner".to_owned()]);
        assert!(first.registry);
    }
}
