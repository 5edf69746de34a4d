//! How the few values that are not plain data are written when a write travels between replicas
//! (see `store::forward`): a trace context as its `traceparent` text, a reason the kernel names
//! with a static string as that string.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Deserializer, Serializer};

/// A reason the kernel names with a static string; an alias, so that serde's derive does not take
/// its lifetime for one borrowed from the input.
pub type Reason = &'static str;

/// An optional trace context, as its W3C `traceparent` text.
pub mod traceparent {
    use super::*;
    use crate::traces::TraceParent;

    pub fn serialize<S: Serializer>(value: &Option<TraceParent>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(parent) => serializer.serialize_some(&parent.to_string()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<TraceParent>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| text.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// A reason the kernel names with a static string (`tool:refused`'s, a run's end's). Read back,
/// each distinct text is kept once for the life of the process: they are the kernel's own few.
pub mod reason {
    use super::*;

    pub fn serialize<S: Serializer>(value: &&'static str, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
        Ok(intern(String::deserialize(deserializer)?))
    }
}

/// An optional [`reason`].
pub mod optional_reason {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Option<&'static str>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(text) => serializer.serialize_some(text),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'static str>, D::Error> {
        Ok(Option::<String>::deserialize(deserializer)?.map(intern))
    }
}

/// The most distinct reasons kept; past it a reason reads back as a generic one, so a peer that
/// sends garbage cannot grow this process.
const MAX_REASONS: usize = 1_024;

fn intern(text: String) -> &'static str {
    static KEPT: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
    let mut kept = KEPT.get_or_init(Default::default).lock().expect("reasons poisoned");
    if let Some(found) = kept.get(text.as_str()) {
        return found;
    }
    if kept.len() >= MAX_REASONS {
        return "refused";
    }
    let leaked: &'static str = Box::leak(text.into_boxed_str());
    kept.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reason_reads_back_as_one_static_string() {
        let a = super::intern("unknown_tool".to_owned());
        let b = super::intern(String::from("unknown_tool"));
        assert!(std::ptr::eq(a, b));
    }
}
