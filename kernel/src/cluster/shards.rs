//! Runs are spread over a fixed number of shards (256, made with the database), and each shard
//! has at most one owner replica at a time, recorded in the `shards` table with an epoch that
//! every change of owner raises. There is no leader: every replica computes, from the replicas it
//! sees alive, which one should own each shard (rendezvous hashing: the replica with the highest
//! hash of shard and replica id), takes a shard that should be its own once it is free or its
//! owner is dead, and gives back one that should be another's. A take or a give-back is a
//! compare-and-set on the epoch, so two replicas that disagree for a moment cannot both own a
//! shard, and a replica waking from a freeze finds the epochs moved on and learns what it lost.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::RunId;

/// How many shards the database was made with: its `shards` table has a row for each.
pub const SHARDS: u32 = 256;

/// The shard `run` lives in: the last byte of its id, which the kernel draws at random or sets to
/// the shard it wants (a subagent's is its parent's: [`RunId::new_in_shard`], so a run ends with
/// its children in one shard's transaction). An id the kernel did not make goes by a hash.
pub fn shard_of(run: &RunId) -> u32 {
    shard_of_text(run.as_str())
}

/// The shard an id names by its last byte (a run's, or a dispatch's or an approval's, which the
/// kernel makes in their run's shard); a hash of the text for an id not ending in two hex digits.
pub fn shard_of_text(id: &str) -> u32 {
    id.len()
        .checked_sub(2)
        .and_then(|at| id.get(at..))
        .and_then(|tail| u8::from_str_radix(tail, 16).ok())
        .map(u32::from)
        .unwrap_or_else(|| (weight(SHARDS, id) % u64::from(SHARDS)) as u32)
}

/// The shard of a run made under idempotency key `key`: a hash of the key.
pub fn shard_of_key(key: &str) -> u32 {
    (weight(SHARDS, key) % u64::from(SHARDS)) as u32
}

/// A fresh UUIDv7 whose last byte names `shard`: its other random bits are left as drawn.
pub fn new_id_in_shard(shard: u32) -> String {
    let mut id = uuid::Uuid::now_v7().hyphenated().to_string();
    id.truncate(id.len() - 2);
    id.push_str(&format!("{:02x}", shard % SHARDS));
    id
}

/// A shard's row, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRow {
    pub id: u32,
    pub owner: Option<String>,
    pub epoch: i64,
}

/// What a replica should change in the shards table: each shard with the epoch it was read at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    pub take: Vec<(u32, i64)>,
    /// Shards this replica hands to the replica that should own them (named), which learns of it
    /// at its next beat or at the first write it is sent for the shard.
    pub hand: Vec<(u32, i64, String)>,
}

impl Moves {
    pub fn is_empty(&self) -> bool {
        self.take.is_empty() && self.hand.is_empty()
    }
}

/// The replica among `replicas` that should own `shard`: the highest hash of the two. When one
/// replica joins or leaves, only the shards it wins or held change hands.
pub fn owner_of<'r>(shard: u32, replicas: &[&'r str]) -> Option<&'r str> {
    replicas
        .iter()
        .copied()
        .max_by_key(|replica| (weight(shard, replica), *replica))
}

/// A hash of `shard` and `replica` every build computes alike: FNV-1a, then a 64-bit finalizer
/// so that ids differing in their last bytes spread.
fn weight(shard: u32, replica: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in shard.to_le_bytes().iter().chain(replica.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// What `me` should change, seeing `rows`, the replicas alive (`me` among them) and those of them
/// leaving (draining to stop: alive, so their leases hold, but owning nothing once they can hand
/// it on). A shard that should be `me`'s is taken when it has no owner, or when its owner is not
/// alive and `me` may judge others (see the heartbeat's guard); one `me` owns that should be
/// another's is handed to it. A shard keeps its owner while no replica that stays is alive.
pub fn moves(
    rows: &[ShardRow],
    me: &str,
    (alive, leaving): (&BTreeSet<String>, &BTreeSet<String>),
    may_judge: bool,
) -> Moves {
    let staying: Vec<&str> = alive.difference(leaving).map(String::as_str).collect();
    let mut moves = Moves::default();
    for row in rows {
        let should = owner_of(row.id, &staying);
        match (&row.owner, should) {
            (Some(owner), Some(should)) if owner == me && should != me => {
                moves.hand.push((row.id, row.epoch, should.to_owned()))
            }
            (None, Some(should)) if should == me => moves.take.push((row.id, row.epoch)),
            (Some(owner), Some(should)) if should == me && owner != me && may_judge && !alive.contains(owner) => {
                moves.take.push((row.id, row.epoch))
            }
            _ => {}
        }
    }
    moves
}

/// The shards this replica owns, with their epochs, as it last read them, and how many times
/// that changed (the writer forgets what it remembers of runs whenever it does). Readings may
/// land out of order (the heartbeat and the links both read the table): a shard's row is taken in
/// only when its epoch is not older than the one known, and every change of owner raises the
/// epoch, so an older reading never undoes a newer one.
#[derive(Clone, Default)]
pub struct ShardMap(Arc<(Mutex<BTreeMap<u32, Known>>, AtomicU64)>);

/// What this replica last read of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    epoch: i64,
    mine: bool,
}

/// How this replica's shards changed between two readings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub gained: Vec<u32>,
    /// Shards this replica owned and no longer does (given back, or taken while it was silent).
    pub lost: Vec<u32>,
}

impl ShardMap {
    /// Takes in what `rows` say `me` owns, row by row where not older than what is known.
    pub fn refresh(&self, rows: &[ShardRow], me: &str) -> Changed {
        let mut known = self.0.0.lock().expect("shard map poisoned");
        let mut changed = Changed::default();
        for row in rows {
            let now = Known {
                epoch: row.epoch,
                mine: row.owner.as_deref() == Some(me),
            };
            let before = known.get(&row.id).copied();
            if before.is_some_and(|before| before.epoch > now.epoch) {
                continue;
            }
            let was_mine = before.filter(|before| before.mine);
            match (was_mine, now.mine) {
                (None, true) => changed.gained.push(row.id),
                (Some(_), false) => changed.lost.push(row.id),
                (Some(before), true) if before.epoch != now.epoch => {
                    changed.lost.push(row.id);
                    changed.gained.push(row.id);
                }
                _ => {}
            }
            known.insert(row.id, now);
        }
        if !changed.gained.is_empty() || !changed.lost.is_empty() {
            self.0.1.fetch_add(1, Ordering::SeqCst);
        }
        changed
    }

    /// The epoch at which this replica owns `shard`, if it does.
    pub fn epoch(&self, shard: u32) -> Option<i64> {
        let known = self.0.0.lock().expect("shard map poisoned");
        known.get(&shard).filter(|known| known.mine).map(|known| known.epoch)
    }

    /// How many times what this replica owns has changed.
    pub fn generation(&self) -> u64 {
        self.0.1.load(Ordering::SeqCst)
    }

    /// Whether this replica owns `shard`.
    pub fn owns(&self, shard: u32) -> bool {
        self.epoch(shard).is_some()
    }

    /// The `n`th shard this replica owns, counting round; `None` while it owns none.
    pub fn nth(&self, n: usize) -> Option<u32> {
        let known = self.0.0.lock().expect("shard map poisoned");
        let owned = known.iter().filter(|(_, known)| known.mine).count();
        match owned {
            0 => None,
            owned => known
                .iter()
                .filter(|(_, known)| known.mine)
                .nth(n % owned)
                .map(|(id, _)| *id),
        }
    }

    /// How many shards this replica owns.
    pub fn len(&self) -> usize {
        let known = self.0.0.lock().expect("shard map poisoned");
        known.values().filter(|known| known.mine).count()
    }

    /// Whether this replica owns no shard.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("0193a4b2-0000-7000-8000-{i:012x}")).collect()
    }

    fn owners(replicas: &[String]) -> Vec<String> {
        let refs: Vec<&str> = replicas.iter().map(String::as_str).collect();
        (0..256).map(|s| owner_of(s, &refs).unwrap().to_owned()).collect()
    }

    #[test]
    fn three_replicas_each_get_about_a_third_of_the_shards() {
        let replicas = ids(3);
        let owners = owners(&replicas);
        for replica in &replicas {
            let n = owners.iter().filter(|o| *o == replica).count();
            assert!((60..=110).contains(&n), "{replica} owns {n} of 256");
        }
    }

    #[test]
    fn a_replica_joining_or_leaving_moves_only_the_shards_it_wins_or_held() {
        let three = ids(3);
        let before = owners(&three[..2]);
        let after = owners(&three);
        for (shard, (was, is)) in before.iter().zip(&after).enumerate() {
            assert!(was == is || is == &three[2], "shard {shard} moved from {was} to {is}");
        }
        assert!(after.iter().any(|o| o == &three[2]), "the new replica won some shards");
        // And back: the leaver's shards go, nothing else moves.
        assert_eq!(owners(&three[..2]), before);
    }

    fn row(id: u32, owner: Option<&str>, epoch: i64) -> ShardRow {
        ShardRow {
            id,
            owner: owner.map(str::to_owned),
            epoch,
        }
    }

    #[test]
    fn a_replica_takes_free_shards_and_a_dead_owners_only_when_it_may_judge() {
        let replicas = ids(2);
        let (me, other) = (replicas[0].as_str(), replicas[1].as_str());
        let alive: BTreeSet<String> = [me.to_owned()].into();
        let none = BTreeSet::new();
        let rows: Vec<ShardRow> = (0..8)
            .map(|id| row(id, if id % 2 == 0 { None } else { Some(other) }, 3))
            .collect();
        // Alone alive, every shard should be mine: the free ones are taken at once...
        let cautious = moves(&rows, me, (&alive, &none), false);
        assert_eq!(cautious.take, vec![(0, 3), (2, 3), (4, 3), (6, 3)]);
        assert!(cautious.hand.is_empty());
        // ...a dead owner's once this replica may judge.
        let judged = moves(&rows, me, (&alive, &none), true);
        assert_eq!(judged.take.len(), 8);
    }

    #[test]
    fn a_replica_gives_back_the_shards_a_live_newcomer_should_own_and_never_takes_a_live_ones() {
        let replicas = ids(2);
        let (me, newcomer) = (replicas[0].as_str(), replicas[1].as_str());
        let alive: BTreeSet<String> = replicas.iter().cloned().collect();
        let none = BTreeSet::new();
        let mine: Vec<ShardRow> = (0..256).map(|id| row(id, Some(me), 1)).collect();
        let given = moves(&mine, me, (&alive, &none), true);
        let should: Vec<u32> = (0..256)
            .filter(|s| owner_of(*s, &[me, newcomer]) == Some(newcomer))
            .collect();
        assert_eq!(given.hand.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), should);
        assert!(given.hand.iter().all(|(_, epoch, to)| *epoch == 1 && to == newcomer));
        assert!(given.take.is_empty());
        // The newcomer, seeing the shards still held by a live owner, waits for them.
        assert!(moves(&mine, newcomer, (&alive, &none), true).take.is_empty());
    }

    #[test]
    fn a_leaving_replica_hands_every_shard_to_those_that_stay_and_keeps_them_when_none_does() {
        let replicas = ids(3);
        let me = replicas[0].as_str();
        let alive: BTreeSet<String> = replicas.iter().cloned().collect();
        let leaving: BTreeSet<String> = [me.to_owned()].into();
        let mine: Vec<ShardRow> = (0..256).map(|id| row(id, Some(me), 4)).collect();
        let handed = moves(&mine, me, (&alive, &leaving), true);
        assert_eq!(handed.hand.len(), 256);
        for (shard, _, to) in &handed.hand {
            assert_eq!(Some(to.as_str()), owner_of(*shard, &[&replicas[1], &replicas[2]]));
        }
        // The others take nothing from a leaving replica that is alive: it hands them over.
        let free: BTreeSet<String> = BTreeSet::new();
        assert!(moves(&mine, &replicas[1], (&alive, &leaving), true).take.is_empty());
        assert_eq!(moves(&mine, &replicas[1], (&alive, &free), true), Moves::default());
        // The last replica leaving keeps its shards until it exits.
        let alone: BTreeSet<String> = [me.to_owned()].into();
        assert!(moves(&mine, me, (&alone, &leaving), true).is_empty());
    }

    #[test]
    fn an_older_reading_of_the_shards_never_undoes_a_newer_one() {
        let map = ShardMap::default();
        map.refresh(&[row(1, Some("me"), 4)], "me");
        // Handed on (epoch 5), then a reading taken before the hand-over lands late.
        map.refresh(&[row(1, Some("next"), 5)], "me");
        let stale = map.refresh(&[row(1, Some("me"), 4)], "me");
        assert_eq!(stale, Changed::default());
        assert!(!map.owns(1));
        // Handed back later: a newer epoch is taken in.
        map.refresh(&[row(1, Some("me"), 6)], "me");
        assert_eq!(map.epoch(1), Some(6));
    }

    #[test]
    fn runs_spread_over_the_shards_and_a_child_lands_in_its_parents() {
        let mut counts = vec![0u32; SHARDS as usize];
        for _ in 0..25_600 {
            counts[shard_of(&RunId::new()) as usize] += 1;
        }
        let (least, most) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(
            *least > 40 && *most < 180,
            "100 runs a shard on average, saw {least}..{most}"
        );
        let parent = RunId::new();
        for _ in 0..20 {
            let child = RunId::new_in_shard(shard_of(&parent));
            assert_eq!(shard_of(&child), shard_of(&parent));
            assert!(uuid::Uuid::parse_str(child.as_str()).is_ok(), "{child}");
        }
        // An id the kernel did not make still has a shard.
        assert!(shard_of_text("not-hex-zz") < SHARDS);
    }

    #[test]
    fn the_map_says_what_was_gained_and_what_was_lost() {
        let map = ShardMap::default();
        let first = [row(1, Some("me"), 1), row(2, Some("me"), 1), row(3, None, 0)];
        assert_eq!(
            map.refresh(&first, "me"),
            Changed {
                gained: vec![1, 2],
                lost: vec![]
            }
        );
        // Shard 2 was taken while this replica was silent; it got shard 3.
        let second = [row(1, Some("me"), 1), row(2, Some("other"), 2), row(3, Some("me"), 1)];
        assert_eq!(
            map.refresh(&second, "me"),
            Changed {
                gained: vec![3],
                lost: vec![2]
            }
        );
        assert_eq!(map.len(), 2);
    }
}
