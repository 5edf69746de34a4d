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
    let doc = serde_json::json!({
        "tool": tool,
        "fingerprint": fingerprint,
        "arguments": arguments,
    });
    sha256_hex(to_canonical(&doc).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_sorts_keys_and_drops_whitespace() {
        let text = r#"{ "b": 1, "a": { "d": [1, 2], "c": "x" } }"#;
        assert_eq!(canonicalize(text).unwrap(), r#"{"a":{"c":"x","d":[1,2]},"b":1}"#);
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
