//! The application's shared values (database pools, HTTP clients, configuration) that tools
//! reach through [`ToolContext::deps`](crate::ToolContext::deps), keyed by type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// A type map of shared values; cloning it is cheap.
#[derive(Clone, Default)]
pub(crate) struct Deps {
    values: Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Deps {
    /// Registers `value` under its type, replacing an earlier value of the same type.
    pub(crate) fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        Arc::make_mut(&mut self.values).insert(TypeId::of::<T>(), Arc::new(value));
    }

    pub(crate) fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let value = self.values.get(&TypeId::of::<T>())?.clone();
        value.downcast::<T>().ok()
    }
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps").field("len", &self.values.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Root(&'static str);

    #[test]
    fn values_are_found_by_type() {
        let mut deps = Deps::default();
        deps.insert(Root("/srv"));
        deps.insert(7_u32);
        assert_eq!(*deps.get::<Root>().unwrap(), Root("/srv"));
        assert_eq!(*deps.get::<u32>().unwrap(), 7);
        assert!(deps.get::<String>().is_none());
    }

    #[test]
    fn a_clone_does_not_see_later_inserts() {
        let mut deps = Deps::default();
        let before = deps.clone();
        deps.insert(1_u8);
        assert!(before.get::<u8>().is_none());
        assert!(deps.get::<u8>().is_some());
    }
}
