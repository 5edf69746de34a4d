//! The tools the kernel knows: every tool a worker ever registered, loaded from the store at
//! boot and updated when a worker joins, with what a call of it is checked against (its compiled
//! JSON Schema and `requires_approval` predicate). A call to a name not here is an unknown tool.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::model::{Millis, ToolDef};
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
    pub first_seen_at: Millis,
    pub last_seen_at: Millis,
}

impl KnownTool {
    fn new(def: ToolDef, first_seen_at: Millis, last_seen_at: Millis) -> Self {
        // Both were checked when a worker registered the tool.
        let validator = ArgsValidator::compile(&def.input_schema).ok();
        let expr = def.options.requires_approval_expr.trim();
        let approval_predicate = if expr.is_empty() {
            None
        } else {
            Some(compile_predicate(expr))
        };
        KnownTool {
            def: Arc::new(def),
            validator,
            approval_predicate,
            first_seen_at,
            last_seen_at,
        }
    }
}

/// A cheap handle on the known tools.
#[derive(Clone, Default)]
pub struct Registry {
    tools: Arc<RwLock<BTreeMap<String, Arc<KnownTool>>>>,
}

impl Registry {
    pub fn load(tools: Vec<(ToolDef, Millis, Millis)>) -> Self {
        let map = tools
            .into_iter()
            .map(|(def, first_seen_at, last_seen_at)| {
                (
                    def.name.clone(),
                    Arc::new(KnownTool::new(def, first_seen_at, last_seen_at)),
                )
            })
            .collect();
        Registry {
            tools: Arc::new(RwLock::new(map)),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<KnownTool>> {
        self.tools.read().expect("registry poisoned").get(name).cloned()
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.read().expect("registry poisoned").keys().cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<KnownTool>> {
        self.tools
            .read()
            .expect("registry poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Records what a worker registered (the store already holds it).
    pub fn upsert(&self, defs: &[ToolDef], now: Millis) {
        let mut tools = self.tools.write().expect("registry poisoned");
        for def in defs {
            let first_seen_at = tools.get(&def.name).map(|t| t.first_seen_at).unwrap_or(now);
            tools.insert(
                def.name.clone(),
                Arc::new(KnownTool::new(def.clone(), first_seen_at, now)),
            );
        }
    }
}
