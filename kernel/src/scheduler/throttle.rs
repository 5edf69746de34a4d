//! The scheduler's count of the tool limits ([`crate::machine::throttle`]), the policy file's and
//! those tools declare: calls running under each and each rate's tokens, as the starts it sent left them, so it tries only starts the
//! store will admit. The store's count is the truth: a start it refuses (another replica's calls,
//! or calls that ran before a restart) closes the limit here for a moment, and the call waits in
//! the queue again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::governance::Governance;
use crate::machine::throttle::{Bucket, ToolLimit};
use crate::model::Millis;
use crate::policy::Policy;

/// How long a limit stays closed here after the store refused a start this count allowed.
const REFUSED_FOR: Duration = Duration::from_millis(100);

/// Where the scheduler reads the tool limits and fair shares in force: the policy, swapped whole
/// on reload.
#[derive(Clone, Default)]
pub struct PolicySource(Option<Governance>);

impl PolicySource {
    /// The policy `governance` holds, as it is now and after each reload.
    pub fn policy(governance: Governance) -> Self {
        PolicySource(Some(governance))
    }
}

impl std::fmt::Debug for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PolicySource(policy)"
        } else {
            "PolicySource(none)"
        })
    }
}

/// One limit's count here.
struct Gate {
    limit: ToolLimit,
    running: u32,
    bucket: Option<Bucket>,
    closed_until: Option<Instant>,
}

impl Gate {
    fn new(limit: ToolLimit) -> Self {
        Gate {
            limit,
            running: 0,
            bucket: None,
            closed_until: None,
        }
    }

    fn has_room(&mut self, (now, at): (Instant, Millis)) -> bool {
        if self.closed_until.is_some_and(|until| now < until) {
            return false;
        }
        if self.limit.at_once.is_some_and(|max| self.running >= max) {
            return false;
        }
        self.limit.per_second.is_none() || self.bucket(at).take(&self.limit, at).is_ok()
    }

    fn bucket(&mut self, at: Millis) -> Bucket {
        *self.bucket.get_or_insert_with(|| Bucket::full(&self.limit, at))
    }
}

/// The limits in force, by tool, and each limit's count.
#[derive(Default)]
pub(super) struct Throttle {
    source: PolicySource,
    /// The policy the maps below were read from.
    policy: Option<Arc<Policy>>,
    by_tool: HashMap<String, Arc<[ToolLimit]>>,
    /// The limits tools declared, by tool name, as the worker that joined last announced them.
    declared: HashMap<String, ToolLimit>,
    gates: HashMap<String, Gate>,
}

impl Throttle {
    pub fn new(source: PolicySource) -> Self {
        Throttle {
            source,
            ..Throttle::default()
        }
    }

    /// Reads the policy in force, once per pass over the queue: after a reload, the limits it
    /// names from now on, each limit still named keeping its count. Returns the policy when it is
    /// not the one read last.
    pub fn refresh(&mut self) -> Option<Arc<Policy>> {
        let governance = self.source.0.as_ref()?;
        let policy = governance.policy();
        if self.policy.as_ref().is_some_and(|seen| Arc::ptr_eq(seen, &policy)) {
            return None;
        }
        self.by_tool.clear();
        let limits = policy.limits();
        let declared = &self.declared;
        self.gates
            .retain(|name, _| limits.iter().any(|l| l.tools == *name) || declared.values().any(|l| l.tools == *name));
        for limit in limits {
            self.gate(limit);
        }
        self.policy = Some(policy.clone());
        Some(policy)
    }

    /// Takes the limits the tools of a worker that joined declare: each replaces what the tool
    /// declared before (a limit that stays keeps its count), and a tool that declares none now has
    /// only the policy's.
    pub fn declare(&mut self, tools: &[crate::model::ToolDef]) {
        for tool in tools {
            let limit = tool.options.limit.as_ref().map(|limit| limit.of(&tool.name));
            if self.declared.get(&tool.name) == limit.as_ref() {
                continue;
            }
            self.by_tool.remove(&tool.name);
            if let Some(old) = self.declared.remove(&tool.name) {
                self.gates.remove(&old.tools);
            }
            if let Some(limit) = limit {
                self.declared.insert(tool.name.clone(), limit.clone());
                self.gate(limit);
            }
        }
    }

    /// Counts calls under `limit` from now on, keeping the count of a limit of the same name.
    fn gate(&mut self, limit: ToolLimit) {
        match self.gates.get_mut(&limit.tools) {
            Some(gate) => gate.limit = limit,
            None => {
                self.gates.insert(limit.tools.clone(), Gate::new(limit));
            }
        }
    }

    /// The limits a call of `tool` passes: the policy's, as the last [`Throttle::refresh`] read
    /// them, then the tool's own. `None` for most tools, and at once when nothing sets a limit.
    pub fn limits(&mut self, tool: &str) -> Option<Arc<[ToolLimit]>> {
        if self.gates.is_empty() {
            return None;
        }
        let limits = match self.by_tool.get(tool) {
            Some(limits) => limits.clone(),
            None => {
                let mut limits = self
                    .policy
                    .as_ref()
                    .map(|policy| policy.limits_for(tool))
                    .unwrap_or_default();
                limits.extend(self.declared.get(tool).cloned());
                let limits: Arc<[ToolLimit]> = limits.into();
                self.by_tool.insert(tool.to_owned(), limits.clone());
                limits
            }
        };
        (!limits.is_empty()).then_some(limits)
    }

    /// Whether each of `limits` has room for one more start now.
    pub fn has_room(&mut self, limits: &[ToolLimit], now: (Instant, Millis)) -> bool {
        limits
            .iter()
            .all(|limit| self.gates.get_mut(&limit.tools).is_none_or(|gate| gate.has_room(now)))
    }

    /// A start under `limits` was sent to the store.
    pub fn take(&mut self, limits: &[ToolLimit], at: Millis) {
        for limit in limits {
            if let Some(gate) = self.gates.get_mut(&limit.tools) {
                gate.running += 1;
                if gate.limit.per_second.is_some() {
                    let bucket = gate.bucket(at);
                    gate.bucket = Some(bucket.take(&gate.limit, at).unwrap_or(bucket));
                }
            }
        }
    }

    /// A call that took `names` no longer runs here (it ended, or its start did not commit).
    pub fn give_back(&mut self, names: &[String]) {
        for name in names {
            if let Some(gate) = self.gates.get_mut(name) {
                gate.running = gate.running.saturating_sub(1);
            }
        }
    }

    /// The store refused a start under `names` that the count here allowed: the limits stay
    /// closed here for a moment, and their buckets are read as empty.
    pub fn refused(&mut self, names: &[String], now: (Instant, Millis)) {
        for name in names {
            if let Some(gate) = self.gates.get_mut(name) {
                gate.closed_until = Some(now.0 + REFUSED_FOR);
                if gate.limit.per_second.is_some() {
                    gate.bucket = Some(Bucket { tokens: 0.0, at: now.1 });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, limit: Option<crate::machine::throttle::DeclaredLimit>) -> crate::model::ToolDef {
        crate::model::ToolDef {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            version: String::new(),
            fingerprint: String::new(),
            options: crate::model::ToolOptions {
                limit,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_tool_s_own_limit_counts_its_calls_until_a_worker_drops_it() {
        let now = Instant::now();
        let mut throttle = Throttle::default();
        let two = crate::machine::throttle::DeclaredLimit {
            per_second: None,
            burst: None,
            at_once: Some(2),
        };
        throttle.declare(&[tool("charge", Some(two.clone())), tool("search", None)]);
        assert!(throttle.limits("search").is_none());
        let limits = throttle.limits("charge").expect("the tool's own limit");
        assert_eq!(limits[0].tools, "tool:charge");
        throttle.take(&limits, 0);
        throttle.take(&limits, 0);
        assert!(!throttle.has_room(&limits, (now, 0)));
        throttle.declare(&[tool("charge", Some(two))]);
        assert!(
            !throttle.has_room(&limits, (now, 0)),
            "the same limit again keeps its count"
        );
        throttle.declare(&[tool("charge", None)]);
        assert!(
            throttle.limits("charge").is_none(),
            "a worker that joined later declares none"
        );
    }

    fn gate(per_second: Option<f64>, at_once: Option<u32>) -> Gate {
        Gate::new(ToolLimit {
            tools: "pay_*".into(),
            per_second,
            burst: None,
            at_once,
        })
    }

    #[test]
    fn a_gate_closes_at_its_bound_and_at_its_rate_and_after_a_refusal() {
        let now = Instant::now();
        let mut throttle = Throttle::default();
        throttle.gates.insert("pay_*".into(), gate(Some(2.0), Some(3)));
        let limits = [throttle.gates["pay_*"].limit.clone()];
        assert!(throttle.has_room(&limits, (now, 0)));
        throttle.take(&limits, 0);
        throttle.take(&limits, 0);
        assert!(!throttle.has_room(&limits, (now, 0)), "two tokens a second, both taken");
        assert!(throttle.has_room(&limits, (now, 500)), "a token after 500 ms");
        throttle.take(&limits, 500);
        assert!(
            !throttle.has_room(&limits, (now, 5_000)),
            "three running: the bound holds whatever the tokens"
        );
        throttle.give_back(&["pay_*".into()]);
        assert!(throttle.has_room(&limits, (now, 5_000)));
        throttle.refused(&["pay_*".into()], (now, 5_000));
        assert!(!throttle.has_room(&limits, (now + Duration::from_millis(50), 5_050)));
        assert!(throttle.has_room(&limits, (now + REFUSED_FOR, 5_600)));
    }
}
