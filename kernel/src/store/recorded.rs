//! Which step keys a run has recorded, kept small: a run's calls by position are numbered by turn
//! and turns come in order, so the highest turn tells every later call apart; any other key is
//! kept as a 64-bit hash, up to a bound per run. It answers one question, whether a key is
//! certainly not recorded, and errs only towards "maybe": a hash collision, a key of an earlier
//! turn, or a run past its bound sends the question to the database.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::model::StepKey;

/// What a hashed key costs in a memory budget: its hash, and the set's slack.
pub const HASH_BYTES: usize = 16;

/// The keys a run recorded, as far as they can be told apart cheaply.
#[derive(Debug)]
pub struct RecordedKeys {
    /// The highest turn with a call recorded by position (`t<turn>/p<position>`).
    max_turn: Option<u32>,
    /// Hashes of every other key recorded; `None` once past the bound.
    hashed: Option<HashSet<u64>>,
    bound: usize,
}

/// A key as this set tells keys apart.
enum Kind {
    Position(u32),
    /// A call the agent named (`id:<call id>`), or (`false`) a key of another shape.
    Hashed(u64, bool),
}

impl Kind {
    fn of(key: &StepKey) -> Kind {
        match key.positional_turn() {
            Some(turn) => Kind::Position(turn),
            None => {
                let text = key.as_str();
                // A fixed hasher, so a key hashes the same in every process and every run.
                let mut hasher = DefaultHasher::new();
                text.hash(&mut hasher);
                Kind::Hashed(hasher.finish(), text.starts_with("id:"))
            }
        }
    }
}

impl RecordedKeys {
    /// No key recorded; at most `bound` keys not by position are told apart.
    pub fn new(bound: usize) -> Self {
        RecordedKeys {
            max_turn: None,
            hashed: Some(HashSet::new()),
            bound,
        }
    }

    /// Notes that a step under `key` is recorded.
    pub fn record(&mut self, key: &StepKey) {
        match Kind::of(key) {
            Kind::Position(turn) => self.max_turn = self.max_turn.max(Some(turn)),
            Kind::Hashed(hash, _) => {
                if let Some(hashed) = &mut self.hashed
                    && !hashed.contains(&hash)
                {
                    if hashed.len() >= self.bound {
                        self.hashed = None;
                    } else {
                        hashed.insert(hash);
                    }
                }
            }
        }
    }

    /// Whether no step under `key` is recorded, for certain, given that every step recorded was
    /// noted here.
    pub fn lacks(&self, key: &StepKey) -> bool {
        match Kind::of(key) {
            Kind::Position(turn) => self.max_turn.is_none_or(|max| turn > max),
            Kind::Hashed(hash, _) => self.hashed.as_ref().is_some_and(|hashed| !hashed.contains(&hash)),
        }
    }

    /// As [`RecordedKeys::lacks`], given only that every call an agent submitted was noted: a key
    /// of another shape (a hosted run's dispatch, its local steps, its subagents) may be lacking.
    pub fn lacks_call(&self, key: &StepKey) -> bool {
        match Kind::of(key) {
            Kind::Hashed(_, false) => false,
            _ => self.lacks(key),
        }
    }

    /// Roughly the memory held.
    pub fn bytes(&self) -> usize {
        self.hashed.as_ref().map_or(0, |hashed| hashed.len() * HASH_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_lacking_until_recorded_and_calls_by_position_by_turn() {
        let mut keys = RecordedKeys::new(8);
        let (first, second) = (StepKey::for_call(3, 0, None), StepKey::for_call(3, 1, None));
        let named = StepKey::for_call(0, 0, Some("call_1"));
        let local = StepKey::local("fetch", 0);
        assert!([&first, &named, &local].iter().all(|key| keys.lacks(key)));
        keys.record(&first);
        keys.record(&named);
        keys.record(&local);
        assert!(!keys.lacks(&first) && !keys.lacks(&named) && !keys.lacks(&local));
        assert!(!keys.lacks(&second), "a call of a turn recorded may be recorded");
        assert!(
            !keys.lacks(&StepKey::for_call(2, 5, None)),
            "so may one of an earlier turn"
        );
        assert!(keys.lacks(&StepKey::for_call(4, 0, None)), "a later turn's is not");
        assert!(keys.lacks(&StepKey::for_call(0, 0, Some("call_2"))));
        assert_eq!(keys.bytes(), 2 * HASH_BYTES, "calls by position cost nothing");
        let other = StepKey::local("fetch", 1);
        assert!(
            keys.lacks(&other) && !keys.lacks_call(&other),
            "only calls are ruled out as calls"
        );
        assert!(keys.lacks_call(&StepKey::for_call(0, 0, Some("call_2"))));
    }

    #[test]
    fn past_its_bound_no_hashed_key_is_known_lacking() {
        let mut keys = RecordedKeys::new(2);
        for id in ["a", "b"] {
            keys.record(&StepKey::for_call(0, 0, Some(id)));
        }
        assert!(keys.lacks(&StepKey::for_call(0, 0, Some("c"))));
        keys.record(&StepKey::for_call(0, 0, Some("c")));
        assert!(!keys.lacks(&StepKey::for_call(0, 0, Some("d"))), "past the bound: ask");
        assert_eq!(keys.bytes(), 0, "the hashes are let go");
        assert!(
            keys.lacks(&StepKey::for_call(1, 0, None)),
            "calls by position still tell"
        );
    }
}
