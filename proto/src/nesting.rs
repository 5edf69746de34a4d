//! The order a run's steps are shown in, by `kernelctl runs show` and the console alike: as the
//! run recorded them, each call a tool's body made through the kernel (`call:<caller>#<n>`)
//! right after its caller, in the body's order, one level deeper.

use std::collections::{HashMap, HashSet};

/// For steps given as `(key, caller key)` (the caller empty for a step no tool's body made), the
/// order to show them in: each step's index into `steps` and its depth under callers. A step
/// whose caller is not among `steps` stays where it is, at depth 0.
pub fn nested_order(steps: &[(&str, &str)]) -> Vec<(usize, usize)> {
    let keys: HashSet<&str> = steps.iter().map(|(key, _)| *key).collect();
    let under = |caller: &str| !caller.is_empty() && keys.contains(caller);
    let mut callees: HashMap<&str, Vec<usize>> = HashMap::new();
    for (index, (_, caller)) in steps.iter().enumerate() {
        if under(caller) {
            callees.entry(caller).or_default().push(index);
        }
    }
    // `call:<caller>#<n>`: the n-th call of the body.
    let occurrence = |index: &usize| {
        steps[*index]
            .0
            .rsplit_once('#')
            .and_then(|(_, n)| n.parse::<u64>().ok())
    };
    for calls in callees.values_mut() {
        calls.sort_by_key(occurrence);
    }
    let mut ordered = Vec::with_capacity(steps.len());
    let mut stack: Vec<(usize, usize)> = (0..steps.len())
        .rev()
        .filter(|index| !under(steps[*index].1))
        .map(|index| (index, 0))
        .collect();
    while let Some((index, depth)) = stack.pop() {
        ordered.push((index, depth));
        if let Some(calls) = callees.get(steps[index].0) {
            stack.extend(calls.iter().rev().map(|callee| (*callee, depth + 1)));
        }
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_a_body_made_follows_its_caller_in_the_body_s_order() {
        // As a store lists them: by turn, position and key, so a callee before its caller.
        let steps = [
            ("call:t0/p0#10", "t0/p0"),
            ("call:t0/p0#2", "t0/p0"),
            ("call:call:t0/p0#2#0", "call:t0/p0#2"),
            ("t0/p0", ""),
            ("t0/p1", ""),
            ("call:gone#0", "gone"),
        ];
        let shown: Vec<(&str, usize)> = nested_order(&steps)
            .into_iter()
            .map(|(index, depth)| (steps[index].0, depth))
            .collect();
        assert_eq!(
            shown,
            [
                ("t0/p0", 0),
                ("call:t0/p0#2", 1),
                ("call:call:t0/p0#2#0", 2),
                ("call:t0/p0#10", 1),
                ("t0/p1", 0),
                ("call:gone#0", 0),
            ]
        );
    }
}
