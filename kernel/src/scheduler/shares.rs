//! Fair shares of the queue (the policy's `fair_shares`): each queued call gets a tag in virtual
//! time, and the queue is kept in tag order, so the calls that start when room opens take turns
//! between shares by weight rather than by arrival.
//!
//! A share's next call is tagged one step of `1 / weight` after the later of its share's last tag
//! and the tag of the call served last (start-time fair queuing). A share that was idle starts
//! level with the calls being served now, so it neither banks credit while idle nor waits behind
//! a burst queued before it came; a share of weight 4 moves through virtual time a quarter as fast
//! as one of weight 1, so it starts four calls for each of the other's. With no fair shares each
//! call is tagged after every tag given: the queue is in arrival order.

use std::collections::HashMap;

use crate::policy::FairShares;

/// A queued call's place: its virtual time, then its arrival among calls of equal time.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub(super) struct Tag {
    at: f64,
    seq: u64,
}

/// The shares' virtual clocks.
#[derive(Debug, Default)]
pub(super) struct Shares {
    /// The policy's fair shares; `None`: every call is of one share.
    config: Option<FairShares>,
    /// The tag of the call served last: virtual time now.
    served: f64,
    /// The last tag of each labelled share.
    last: HashMap<String, f64>,
    /// The last tag of the calls of runs without the label.
    unlabelled: f64,
    /// The latest tag given.
    highest: f64,
    seq: u64,
    /// Idle shares are forgotten when the map grows past this.
    prune_at: usize,
}

/// Below this many shares none is forgotten.
const KEEP_SHARES: usize = 64;

impl Shares {
    /// Uses `config` for calls queued from now on; tags already given stand.
    pub fn set(&mut self, config: Option<&FairShares>) {
        if self.config.as_ref() != config {
            self.config = config.cloned();
        }
    }

    /// The tag of a call of share `share` queued now.
    pub fn tag(&mut self, share: Option<&str>) -> Tag {
        self.seq += 1;
        let Some(config) = &self.config else {
            // After every tag given, shares or not: arrival order, even behind calls tagged while
            // shares were in force.
            self.highest += 1.0;
            return Tag {
                at: self.highest,
                seq: self.seq,
            };
        };
        let step = 1.0 / f64::from(config.weight(share).max(1));
        let now = self.served;
        let last = match share {
            Some(share) => {
                if !self.last.contains_key(share) {
                    self.prune();
                    self.last.insert(share.to_owned(), now);
                }
                self.last.get_mut(share).expect("the share was just remembered")
            }
            None => &mut self.unlabelled,
        };
        *last = last.max(now) + step;
        self.highest = self.highest.max(*last);
        Tag {
            at: *last,
            seq: self.seq,
        }
    }

    /// The call tagged `tag` was served: virtual time moves to it.
    pub fn served(&mut self, tag: Tag) {
        self.served = self.served.max(tag.at);
    }

    /// Forgets the shares with nothing tagged ahead of virtual time: a share that comes back starts
    /// level with now, exactly as a forgotten one does.
    fn prune(&mut self) {
        if self.last.len() < self.prune_at.max(KEEP_SHARES) {
            return;
        }
        let now = self.served;
        self.last.retain(|_, last| *last > now);
        self.last.shrink_to(self.last.len() * 2);
        self.prune_at = self.last.len() * 2;
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(weights: &[(&str, u32)]) -> Shares {
        let mut shares = Shares::default();
        shares.set(Some(&FairShares {
            label: "tenant".into(),
            weights: weights.iter().map(|(v, w)| (v.to_string(), *w)).collect(),
        }));
        shares
    }

    /// Serves `queued` (share, tag) in tag order until `count` are served; returns their shares.
    fn serve(shares: &mut Shares, queued: &mut Vec<(&'static str, Tag)>, count: usize) -> Vec<&'static str> {
        queued.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
        queued
            .drain(..count.min(queued.len()))
            .map(|(share, tag)| {
                shares.served(tag);
                share
            })
            .collect()
    }

    #[test]
    fn a_late_single_call_waits_behind_one_of_a_burst_not_all_of_it() {
        let mut shares = shares(&[]);
        let mut queued: Vec<(&str, Tag)> = (0..100).map(|_| ("a", shares.tag(Some("a")))).collect();
        assert_eq!(serve(&mut shares, &mut queued, 5), ["a"; 5]);
        queued.push(("b", shares.tag(Some("b"))));
        let next = serve(&mut shares, &mut queued, 3);
        assert!(
            next.contains(&"b"),
            "the single call starts within two of the burst's: {next:?}"
        );
    }

    #[test]
    fn weights_divide_the_starts() {
        let mut shares = shares(&[("heavy", 4)]);
        let mut queued: Vec<(&str, Tag)> = Vec::new();
        for _ in 0..200 {
            queued.push(("heavy", shares.tag(Some("heavy"))));
            queued.push(("light", shares.tag(Some("light"))));
        }
        let first = serve(&mut shares, &mut queued, 100);
        let heavy = first.iter().filter(|s| **s == "heavy").count();
        assert_eq!(heavy, 80, "four to one: {first:?}");
    }

    #[test]
    fn an_idle_share_banks_no_credit() {
        let mut shares = shares(&[]);
        let mut queued: Vec<(&str, Tag)> = Vec::new();
        // "a" runs alone for a while; "b" then brings a burst of its own.
        for _ in 0..50 {
            queued.push(("a", shares.tag(Some("a"))));
        }
        serve(&mut shares, &mut queued, 40);
        for _ in 0..50 {
            queued.push(("b", shares.tag(Some("b"))));
        }
        let next = serve(&mut shares, &mut queued, 20);
        let b = next.iter().filter(|s| **s == "b").count();
        assert!((9..=11).contains(&b), "the two take turns from now on: {next:?}");
    }

    #[test]
    fn without_shares_calls_keep_their_order() {
        let mut shares = Shares::default();
        let tags: Vec<Tag> = ["a", "b", "a", "c"].iter().map(|s| shares.tag(Some(s))).collect();
        assert!(tags.windows(2).all(|w| w[0] < w[1]), "{tags:?}");
        shares.served(tags[2]);
        assert!(shares.tag(Some("b")) > tags[3], "a call queued later is later");
    }

    #[test]
    fn idle_shares_are_forgotten() {
        let mut shares = shares(&[]);
        let names: Vec<String> = (0..1000).map(|n| format!("tenant-{n}")).collect();
        for name in &names {
            let tag = shares.tag(Some(name));
            shares.served(tag);
        }
        assert!(
            shares.remembered() <= 2 * KEEP_SHARES,
            "{} remembered",
            shares.remembered()
        );
    }
}
