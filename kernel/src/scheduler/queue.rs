//! The calls waiting for a worker slot, in order of their fair-share tags ([`super::shares`]; with
//! no fair shares, arrival order), indexed by step: under load the queue holds thousands of calls,
//! and asking whether a step is already queued must not scan them all.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::shares::{Shares, Tag};
use crate::clock::Clock;
use crate::model::{RunId, StepKey, StepRecord};
use crate::policy::FairShares;

/// Below this capacity a drained queue keeps its buffers; above it, they shrink once mostly empty,
/// so a burst of queued calls does not keep its memory after it has been served.
const KEEP_CAPACITY: usize = 256;

pub(super) struct Queued {
    pub step: StepRecord,
    pub since: Instant,
    /// A retry waits for its backoff; the time lives in the store, this is its local clock.
    pub not_before: Option<Instant>,
    /// Since when it waits for a tool limit with no room.
    pub waiting: Option<Instant>,
    /// Its place in the queue.
    tag: Tag,
}

impl Queued {
    fn new(step: StepRecord, clock: &Clock, tag: Tag) -> Self {
        let now = clock.instant();
        let not_before = step
            .not_before
            .map(|at| now + Duration::from_millis(at.saturating_sub(clock.now_millis()).max(0) as u64));
        Queued {
            step,
            since: now,
            not_before,
            waiting: None,
            tag,
        }
    }

    pub fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|at| now >= at)
    }
}

#[derive(Default)]
pub(super) struct Queue {
    items: VecDeque<Queued>,
    keys: HashSet<(RunId, StepKey)>,
    shares: Shares,
}

impl Queue {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn contains(&self, run_id: &RunId, key: &StepKey) -> bool {
        self.keys.contains(&(run_id.clone(), key.clone()))
    }

    /// Tags calls queued from now on by `shares` (`None`: one share, in arrival order).
    pub fn set_shares(&mut self, shares: Option<&FairShares>) {
        self.shares.set(shares);
    }

    /// Queues the step in its share's place unless it is queued already; the queued call, if added.
    pub fn push(&mut self, step: StepRecord, clock: &Clock) -> Option<&mut Queued> {
        if !self.keys.insert((step.run_id.clone(), step.key.clone())) {
            return None;
        }
        let tag = self.shares.tag(step.share.as_deref());
        // Tags mostly grow: only a share's first calls after a burst of another's go further in.
        let at = match self.items.back() {
            Some(last) if last.tag > tag => self.items.partition_point(|queued| queued.tag < tag),
            _ => self.items.len(),
        };
        self.items.insert(at, Queued::new(step, clock, tag));
        Some(&mut self.items[at])
    }

    pub fn get(&self, index: usize) -> &Queued {
        &self.items[index]
    }

    pub fn get_mut(&mut self, index: usize) -> &mut Queued {
        &mut self.items[index]
    }

    /// Takes the call at `index` out to start it: its share was served.
    pub fn remove(&mut self, index: usize) -> Queued {
        let queued = self.items.remove(index).expect("index in range");
        self.shares.served(queued.tag);
        self.keys.remove(&(queued.step.run_id.clone(), queued.step.key.clone()));
        self.shrink();
        queued
    }

    /// The queued calls, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.items.iter()
    }

    /// Keeps the calls `keep` approves, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&Queued) -> bool) {
        let keys = &mut self.keys;
        self.items.retain(|queued| {
            let kept = keep(queued);
            if !kept {
                keys.remove(&(queued.step.run_id.clone(), queued.step.key.clone()));
            }
            kept
        });
        self.shrink();
    }

    fn shrink(&mut self) {
        let len = self.items.len();
        if self.items.capacity() > KEEP_CAPACITY && len < self.items.capacity() / 4 {
            self.items.shrink_to(KEEP_CAPACITY.max(len * 2));
        }
        if self.keys.capacity() > KEEP_CAPACITY && len < self.keys.capacity() / 4 {
            self.keys.shrink_to(KEEP_CAPACITY.max(len * 2));
        }
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.items.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(run: &RunId, n: u32) -> StepRecord {
        StepRecord {
            run_id: run.clone(),
            key: StepKey::for_call(0, n, None),
            position: n,
            ..crate::machine::records::step()
        }
    }

    #[test]
    fn a_step_is_queued_once_until_it_leaves() {
        let run = RunId::new();
        let mut queue = Queue::default();
        assert!(queue.push(step(&run, 0), &Clock::wall()).is_some());
        assert!(
            queue.push(step(&run, 0), &Clock::wall()).is_none(),
            "a second offer of a queued step is ignored"
        );
        assert!(queue.push(step(&run, 1), &Clock::wall()).is_some());
        assert_eq!(queue.len(), 2);
        let first = queue.remove(0);
        assert_eq!(first.step.key, StepKey::for_call(0, 0, None));
        assert!(!queue.contains(&run, &first.step.key));
        assert!(
            queue.push(step(&run, 0), &Clock::wall()).is_some(),
            "a step that left may be queued again"
        );
        queue.retain(|q| q.step.key != StepKey::for_call(0, 1, None));
        assert!(!queue.contains(&run, &StepKey::for_call(0, 1, None)));
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn a_share_s_first_call_goes_in_level_with_the_calls_being_served() {
        let (a, b) = (RunId::new(), RunId::new());
        let mut queue = Queue::default();
        queue.set_shares(Some(&FairShares {
            label: "tenant".into(),
            weights: Default::default(),
        }));
        for n in 0..10 {
            queue.push(
                StepRecord {
                    share: Some("a".into()),
                    ..step(&a, n)
                },
                &Clock::wall(),
            );
        }
        for _ in 0..3 {
            queue.remove(0);
        }
        queue.push(
            StepRecord {
                share: Some("b".into()),
                ..step(&b, 0)
            },
            &Clock::wall(),
        );
        let order: Vec<&str> = queue.iter().map(|q| q.step.share.as_deref().unwrap()).collect();
        assert_eq!(order, ["a", "b", "a", "a", "a", "a", "a", "a"]);
        // Without shares, arrival order.
        queue.set_shares(None);
        queue.push(
            StepRecord {
                share: Some("c".into()),
                ..step(&b, 1)
            },
            &Clock::wall(),
        );
        assert_eq!(queue.iter().last().unwrap().step.share.as_deref(), Some("c"));
    }

    #[test]
    fn a_drained_burst_gives_its_memory_back() {
        let run = RunId::new();
        let mut queue = Queue::default();
        for n in 0..10_000 {
            queue.push(step(&run, n), &Clock::wall());
        }
        assert!(queue.capacity() >= 10_000);
        while !queue.is_empty() {
            queue.remove(0);
        }
        assert!(
            queue.capacity() <= KEEP_CAPACITY * 2,
            "capacity {} after draining",
            queue.capacity()
        );
    }
}
