//! The tools the kernel knows: every tool a worker registered and nobody forgot, loaded from the
//! store at boot and updated when a worker joins, with what a call of it is checked against (its
//! compiled JSON Schema and `requires_approval` predicate), and how many connected sessions offer
//! it now. A call to a name not here is an unknown tool; the tools offered now are the ones an
//! unknown-tool message lists.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use crate::model::{AgentDef, Millis, ToolDef};
use crate::policy::{Predicate, compile_predicate};
use crate::validation::ArgsValidator;

/// A known tool, what its calls are checked with, and when it was seen. Shared, not cloned: a
/// turn of many calls holds one reference per call, not a copy of the schema and its validator.
#[derive(Debug)]
pub struct KnownTool {
    pub def: Arc<ToolDef>,
    /// `None` only for a stored tool whose schema no longer compiles.
    pub validator: Option<ArgsValidator>,
    /// The tool's `requires_approval` predicate over `args`, compiled; `Err` when a stored
    /// expression no longer compiles, which asks a person for every call (fail closed).
    pub approval_predicate: Option<Result<Predicate, String>>,
    /// Where its secret fields are, found once ([`crate::secrets`]).
    pub secrets: crate::secrets::SecretFields,
    pub first_seen_at: Millis,
    pub last_seen_at: Millis,
}

impl KnownTool {
    pub(crate) fn new(def: ToolDef, first_seen_at: Millis, last_seen_at: Millis) -> Self {
        // Both were checked when a worker registered the tool.
        let validator = ArgsValidator::compile(&def.input_schema).ok();
        let expr = def.options.requires_approval_expr.trim();
        let approval_predicate = if expr.is_empty() {
            None
        } else {
            Some(compile_predicate(expr))
        };
        KnownTool {
            secrets: crate::secrets::SecretFields::of(&def),
            def: Arc::new(def),
            validator,
            approval_predicate,
            first_seen_at,
            last_seen_at,
        }
    }
}

/// An agent some worker hosts (or hosted), and what a run's input is checked with.
#[derive(Debug)]
pub struct KnownAgent {
    pub def: AgentDef,
    /// `None` only for a stored agent whose schema no longer compiles.
    pub validator: Option<ArgsValidator>,
}

impl KnownAgent {
    /// Checks a run's input (canonical JSON text) against the agent's schema; the error names
    /// `input_json` and every bad field.
    pub fn check_input(&self, input: &str) -> Result<(), crate::error::KernelError> {
        let Some(validator) = &self.validator else {
            return Ok(());
        };
        let value: serde_json::Value = serde_json::from_str(input).expect("canonical JSON parses");
        validator.check(&self.def.name, &value).map_err(|problems| {
            crate::error::KernelError::invalid(
                "input_json",
                problems.replacen("invalid arguments for tool", "invalid input for agent", 1),
            )
        })
    }

    /// The agent as a hosted run records it.
    pub fn hosted(&self) -> crate::machine::hosted::HostedAgent {
        crate::machine::hosted::HostedAgent {
            name: self.def.name.clone(),
            fingerprint: self.def.fingerprint.clone(),
            version: self.def.version.clone(),
        }
    }
}

#[derive(Default)]
struct Known {
    tools: BTreeMap<String, Arc<KnownTool>>,
    agents: BTreeMap<String, Arc<KnownAgent>>,
    /// Connected sessions offering each tool; a tool at zero is not in the map.
    offers: HashMap<String, usize>,
    /// Tools the other live replicas' sessions offer (as of their last heartbeats).
    elsewhere: std::collections::BTreeSet<String>,
}

/// A cheap handle on the known tools.
#[derive(Clone, Default)]
pub struct Registry {
    known: Arc<RwLock<Known>>,
}

impl Registry {
    pub fn load(tools: Vec<(ToolDef, Millis, Millis)>) -> Self {
        let tools = tools
            .into_iter()
            .map(|(def, first_seen_at, last_seen_at)| {
                (
                    def.name.clone(),
                    Arc::new(KnownTool::new(def, first_seen_at, last_seen_at)),
                )
            })
            .collect();
        Registry {
            known: Arc::new(RwLock::new(Known {
                tools,
                agents: BTreeMap::new(),
                offers: HashMap::new(),
                elsewhere: Default::default(),
            })),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        self.known.read().expect("registry poisoned")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Known> {
        self.known.write().expect("registry poisoned")
    }

    /// Records agents workers offer (at boot: offered before); a newer announcement replaces an
    /// older one.
    pub fn know_agents(&self, defs: &[AgentDef]) {
        let mut known = self.write();
        for def in defs {
            let validator = ArgsValidator::compile(&def.input_schema).ok();
            known.agents.insert(
                def.name.clone(),
                Arc::new(KnownAgent {
                    def: def.clone(),
                    validator,
                }),
            );
        }
    }

    /// An agent some worker offers or offered.
    pub fn agent(&self, name: &str) -> Option<Arc<KnownAgent>> {
        self.read().agents.get(name).cloned()
    }

    /// Every agent some worker offers or offered.
    pub fn agents(&self) -> Vec<Arc<KnownAgent>> {
        self.read().agents.values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Option<Arc<KnownTool>> {
        self.read().tools.get(name).cloned()
    }

    pub fn all(&self) -> Vec<Arc<KnownTool>> {
        self.read().tools.values().cloned().collect()
    }

    /// Names of the tools some connected session offers now, here or on another replica, sorted.
    pub fn offered_names(&self) -> Vec<String> {
        let known = self.read();
        let mut names: Vec<String> = known.offers.keys().chain(&known.elsewhere).cloned().collect();
        names.sort();
        names.dedup();
        names
    }

    /// What the other live replicas' sessions offer now.
    pub fn offered_elsewhere(&self, names: std::collections::BTreeSet<String>) {
        self.write().elsewhere = names;
    }

    /// How many connected sessions offer `name` now.
    pub fn offers(&self, name: &str) -> usize {
        self.read().offers.get(name).copied().unwrap_or(0)
    }

    /// Records what a joining session registered (the store already holds it) and offers.
    pub fn join(&self, defs: &[ToolDef], now: Millis) {
        let mut known = self.write();
        for def in defs {
            let first_seen_at = known.tools.get(&def.name).map(|t| t.first_seen_at).unwrap_or(now);
            known.tools.insert(
                def.name.clone(),
                Arc::new(KnownTool::new(def.clone(), first_seen_at, now)),
            );
            *known.offers.entry(def.name.clone()).or_default() += 1;
        }
    }

    /// Takes in what other replicas registered or forgot (the store's tools and agents, read
    /// again): a tool the store no longer has is forgotten unless a session here offers it.
    pub fn refresh(&self, tools: Vec<(ToolDef, Millis, Millis)>, agents: &[AgentDef]) {
        {
            let mut known = self.write();
            let mut fresh: BTreeMap<String, Arc<KnownTool>> = tools
                .into_iter()
                .map(|(def, first_seen_at, last_seen_at)| {
                    let unchanged = known
                        .tools
                        .get(&def.name)
                        .filter(|t| t.def.fingerprint == def.fingerprint)
                        .cloned();
                    let tool = unchanged.unwrap_or_else(|| Arc::new(KnownTool::new(def, first_seen_at, last_seen_at)));
                    (tool.def.name.clone(), tool)
                })
                .collect();
            for (name, tool) in &known.tools {
                if known.offers.contains_key(name) && !fresh.contains_key(name) {
                    fresh.insert(name.clone(), tool.clone());
                }
            }
            known.tools = fresh;
        }
        self.know_agents(agents);
    }

    /// A session that offered `names` left; returns those no session offers any more.
    pub fn leave(&self, names: &[String]) -> Vec<String> {
        let mut known = self.write();
        let mut unoffered = Vec::new();
        for name in names {
            if let Some(count) = known.offers.get_mut(name) {
                *count -= 1;
                if *count == 0 {
                    known.offers.remove(name);
                    unoffered.push(name.clone());
                }
            }
        }
        unoffered
    }

    /// Forgets the tools among `names` that no session offers (the store forgot them already);
    /// returns those forgotten.
    pub fn forget(&self, names: &[String]) -> Vec<String> {
        let mut known = self.write();
        let mut forgotten = Vec::new();
        for name in names {
            if !known.offers.contains_key(name) && known.tools.remove(name).is_some() {
                forgotten.push(name.clone());
            }
        }
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(name: &str) -> ToolDef {
        let schema = serde_json::json!({"type": "object"});
        ToolDef {
            name: name.into(),
            description: String::new(),
            fingerprint: kernel_proto::canonical::tool_fingerprint(name, "", &schema, ""),
            input_schema: schema,
            version: String::new(),
            options: Default::default(),
        }
    }

    #[test]
    fn offers_follow_the_sessions_and_only_an_unoffered_tool_is_forgotten() {
        let registry = Registry::default();
        registry.join(&[def("a"), def("b")], 1);
        registry.join(&[def("b")], 2);
        assert_eq!(registry.offered_names(), ["a", "b"]);
        assert_eq!(registry.offers("b"), 2);
        assert_eq!(registry.leave(&["a".into(), "b".into()]), ["a"]);
        assert_eq!(registry.offered_names(), ["b"]);
        assert_eq!(registry.forget(&["a".into(), "b".into()]), ["a"], "b is still offered");
        assert!(registry.get("a").is_none());
        assert!(registry.get("b").is_some());
        assert_eq!(registry.get("b").unwrap().first_seen_at, 1);
        assert_eq!(registry.leave(&["b".into()]), ["b"]);
        assert!(registry.offered_names().is_empty());
    }
}
