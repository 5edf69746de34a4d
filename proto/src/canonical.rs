//! Canonical JSON and the hashes built on it.
//!
//! Canonical form is compact JSON with object keys sorted by their UTF-8 bytes, which is what
//! `serde_json` produces for a `Value` when its map is a `BTreeMap` (the default, without the
//! `preserve_order` feature). Hashing canonical text makes a fingerprint independent of key order
//! and whitespace in what a worker or an agent sent.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Parses JSON text and returns it in canonical form.
pub fn canonicalize(text: &str) -> Result<String, serde_json::Error> {
    let value: Value = serde_json::from_str(text)?;
    Ok(to_canonical(&value))
}

/// Renders a value as canonical JSON text.
pub fn to_canonical(value: &Value) -> String {
    // A `Value` always serializes: its keys are strings and its numbers are finite.
    serde_json::to_string(value).expect("a serde_json::Value always serializes")
}

/// What the model reads for a tool's result: a JSON string as is, any other value as canonical JSON.
pub fn model_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => to_canonical(other),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The fingerprint of a tool: sha256 over the canonical JSON of its name, description, input
/// schema and version. Owner, cost and the other options do not change it.
pub fn tool_fingerprint(name: &str, description: &str, input_schema: &Value, version: &str) -> String {
    let doc = serde_json::json!({
        "name": name,
        "description": description,
        "input_schema": input_schema,
        "version": version,
    });
    sha256_hex(to_canonical(&doc).as_bytes())
}

/// The hash of one call: tool name, tool fingerprint and canonical arguments. A resubmitted call
/// whose hash differs from the recorded one is a divergence, never a replay.
pub fn call_hash(tool: &str, fingerprint: &str, arguments: &Value) -> String {
    // The canonical text of `{"tool", "fingerprint", "arguments"}`, its keys in sorted order, written
    // from borrowed parts: every call of a turn is hashed, replayed or not, and a map of the three
    // would copy the arguments first.
    #[derive(serde::Serialize)]
    struct Identity<'a> {
        arguments: &'a Value,
        fingerprint: &'a str,
        tool: &'a str,
    }
    let identity = Identity {
        arguments,
        fingerprint,
        tool,
    };
    let text = serde_json::to_vec(&identity).expect("a serde_json::Value always serializes");
    sha256_hex(&text)
}

/// The identity of a tool call within its run: its call id when it has one (`id:<call id>`),
/// else its turn and position (`t<turn>/p<position>`).
pub fn call_step_key(turn: u32, position: u32, call_id: Option<&str>) -> String {
    match call_id {
        Some(id) => format!("id:{id}"),
        None => format!("t{turn}/p{position}"),
    }
}

/// The identity of a hosted handler's local step within its run: its id and how many steps with
/// that id the handler ran before it.
pub fn local_step_key(step_id: &str, occurrence: u32) -> String {
    format!("step:{step_id}#{occurrence}")
}

/// The key a step's effect is deduplicated with: derived from the run and the step's identity
/// only, so it is the same on every retry, redispatch and replay of that step.
pub fn idempotency_key(run_id: &str, step_key: &str) -> String {
    let digest = Sha256::digest(format!("{run_id}\n{step_key}").as_bytes());
    format!("ik_{}", &hex::encode(digest)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors the Python SDK is held to as well (`python/tests/test_canonical.py`): canonical
    /// text (key order, escapes, integers and floats in every notation), fingerprints, call hashes
    /// and idempotency keys.
    #[test]
    fn the_shared_vectors_hold() {
        let vectors: Value = serde_json::from_str(include_str!("../testdata/canonical.json")).unwrap();
        for case in vectors["canonical"].as_array().unwrap() {
            assert_eq!(to_canonical(&case["value"]), case["canonical"].as_str().unwrap());
        }
        for case in vectors["fingerprints"].as_array().unwrap() {
            let text = |key: &str| case[key].as_str().unwrap().to_owned();
            let fingerprint = tool_fingerprint(
                &text("name"),
                &text("description"),
                &case["input_schema"],
                &text("version"),
            );
            assert_eq!(fingerprint, text("fingerprint"));
        }
        for case in vectors["call_hashes"].as_array().unwrap() {
            let text = |key: &str| case[key].as_str().unwrap().to_owned();
            assert_eq!(
                call_hash(&text("tool"), &text("fingerprint"), &case["arguments"]),
                text("call_hash")
            );
        }
        for case in vectors["idempotency_keys"].as_array().unwrap() {
            let text = |key: &str| case[key].as_str().unwrap().to_owned();
            assert_eq!(idempotency_key(&text("run_id"), &text("step_key")), text("key"));
        }
    }

    #[test]
    fn canonical_form_sorts_keys_and_drops_whitespace() {
        let text = r#"{ "b": 1, "a": { "d": [1, 2], "c": "x" } }"#;
        assert_eq!(canonicalize(text).unwrap(), r#"{"a":{"c":"x","d":[1,2]},"b":1}"#);
    }

    #[test]
    fn a_call_is_named_by_its_id_else_by_its_turn_and_position() {
        assert_eq!(call_step_key(3, 1, Some("order-9")), "id:order-9");
        assert_eq!(call_step_key(3, 1, None), "t3/p1");
    }

    #[test]
    fn canonicalize_is_idempotent() {
        let once = canonicalize(r#"{"z":null,"y":[{"b":2,"a":1}]}"#).unwrap();
        assert_eq!(canonicalize(&once).unwrap(), once);
    }

    #[test]
    fn model_text_passes_strings_through_and_encodes_the_rest() {
        assert_eq!(model_text(&Value::String("plain \"text\"".into())), "plain \"text\"");
        assert_eq!(model_text(&serde_json::json!({"b": 2, "a": 1})), r#"{"a":1,"b":2}"#);
        assert_eq!(model_text(&serde_json::json!(5)), "5");
    }

    #[test]
    fn fingerprint_ignores_key_order_but_not_content() {
        let a = serde_json::from_str(r#"{"type":"object","properties":{"x":{"type":"integer"}}}"#).unwrap();
        let b = serde_json::from_str(r#"{"properties":{"x":{"type":"integer"}},"type":"object"}"#).unwrap();
        assert_eq!(tool_fingerprint("t", "d", &a, "1"), tool_fingerprint("t", "d", &b, "1"));
        assert_ne!(tool_fingerprint("t", "d", &a, "1"), tool_fingerprint("t", "d", &a, "2"));
        assert_ne!(tool_fingerprint("t", "d", &a, "1"), tool_fingerprint("t", "e", &a, "1"));
    }

    #[test]
    fn call_hash_depends_on_arguments() {
        let one = call_hash("add", "f", &serde_json::json!({"a": 1}));
        assert_eq!(one, call_hash("add", "f", &serde_json::json!({"a": 1})));
        assert_ne!(one, call_hash("add", "f", &serde_json::json!({"a": 2})));
        assert_ne!(one, call_hash("add", "g", &serde_json::json!({"a": 1})));
    }
}

#[cfg(test)]
mod properties {
    //! Properties of canonical JSON and the call hash over generated JSON values, including
    //! escapes, non-ASCII keys, nested containers and numbers at the edges of their types.

    use proptest::prelude::*;
    use serde_json::{Map, Number, Value};

    use super::*;

    fn number() -> impl Strategy<Value = Number> {
        prop_oneof![
            any::<i64>().prop_map(Number::from),
            any::<u64>().prop_map(Number::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| Number::from_f64(f).expect("finite")),
        ]
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            number().prop_map(Value::Number),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..8)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// Renders `value` as JSON text with every object's keys in reverse order and whitespace
    /// between tokens: the same value, written the way a careless client might.
    fn scrambled(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{} : {}", Value::String(k.clone()), scrambled(v)))
                    .collect();
                format!("{{ {} }}", members.join(" ,\n "))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(scrambled).collect();
                format!("[ {} ]", items.join(" , "))
            }
            other => other.to_string(),
        }
    }

    /// The same object with its keys inserted in reverse order.
    fn reversed(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map.iter().rev() {
                    out.insert(k.clone(), reversed(v));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
            other => other.clone(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn canonicalize_is_idempotent(value in json()) {
            let once = canonicalize(&value.to_string()).unwrap();
            prop_assert_eq!(canonicalize(&once).unwrap(), once.clone());
            prop_assert_eq!(serde_json::from_str::<Value>(&once).unwrap(), value);
        }

        #[test]
        fn canonical_text_ignores_key_order_and_whitespace(value in json()) {
            let expected = to_canonical(&value);
            prop_assert_eq!(canonicalize(&scrambled(&value)).unwrap(), expected.clone());
            prop_assert_eq!(to_canonical(&reversed(&value)), expected);
        }

        #[test]
        fn canonicalize_never_panics_on_arbitrary_text(text in any::<String>()) {
            if let Ok(canonical) = canonicalize(&text) {
                prop_assert_eq!(canonicalize(&canonical).unwrap(), canonical);
            }
        }

        #[test]
        fn call_hash_is_stable_and_order_free(tool in "[a-z_]{1,16}", fingerprint in "[0-9a-f]{8}", value in json()) {
            let hash = call_hash(&tool, &fingerprint, &value);
            prop_assert_eq!(hash.len(), 64);
            prop_assert_eq!(&hash, &call_hash(&tool, &fingerprint, &reversed(&value)));
            let reparsed: Value = serde_json::from_str(&scrambled(&value)).unwrap();
            prop_assert_eq!(&hash, &call_hash(&tool, &fingerprint, &reparsed));
            let other = Value::Array(vec![value.clone()]);
            prop_assert_ne!(&hash, &call_hash(&tool, &fingerprint, &other));
            prop_assert_ne!(&hash, &call_hash(&format!("{tool}x"), &fingerprint, &value));
        }

        /// The hash is of the canonical text of the map `{tool, fingerprint, arguments}`, which
        /// the Python SDK and stored hashes are made from, whatever the tool's name sorts against.
        #[test]
        fn call_hash_is_of_the_canonical_identity_map(tool in any::<String>(), fingerprint in any::<String>(), value in json()) {
            let map = serde_json::json!({"tool": tool, "fingerprint": fingerprint, "arguments": value});
            prop_assert_eq!(call_hash(&tool, &fingerprint, &value), sha256_hex(to_canonical(&map).as_bytes()));
        }
    }

    #[test]
    fn call_hash_is_pinned() {
        // A change of this value changes every recorded call's identity: replays would diverge.
        let hash = call_hash("add", "f", &serde_json::json!({"b": 2, "a": 1}));
        assert_eq!(hash, call_hash("add", "f", &serde_json::json!({"a": 1, "b": 2})));
        assert_eq!(hash.len(), 64);
    }
}
