//! The tools the kernel knows: every tool a worker ever registered, loaded from the store at
//! boot and updated when a worker joins. A call to a name not here is an unknown tool.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::model::{Millis, ToolDef};

/// A known tool and when it was seen.
#[derive(Clone, Debug)]
pub struct KnownTool {
    pub def: ToolDef,
    pub first_seen_at: Millis,
    pub last_seen_at: Millis,
}

/// A cheap handle on the known tools.
#[derive(Clone, Default)]
pub struct Registry {
    tools: Arc<RwLock<BTreeMap<String, KnownTool>>>,
}

impl Registry {
    pub fn load(tools: Vec<(ToolDef, Millis, Millis)>) -> Self {
        let map = tools
            .into_iter()
            .map(|(def, first_seen_at, last_seen_at)| {
                (
                    def.name.clone(),
                    KnownTool {
                        def,
                        first_seen_at,
                        last_seen_at,
                    },
                )
            })
            .collect();
        Registry {
            tools: Arc::new(RwLock::new(map)),
        }
    }

    pub fn get(&self, name: &str) -> Option<ToolDef> {
        self.tools
            .read()
            .expect("registry poisoned")
            .get(name)
            .map(|t| t.def.clone())
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.read().expect("registry poisoned").keys().cloned().collect()
    }

    pub fn all(&self) -> Vec<KnownTool> {
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
                KnownTool {
                    def: def.clone(),
                    first_seen_at,
                    last_seen_at: now,
                },
            );
        }
    }
}
