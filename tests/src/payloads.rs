//! Every event's payload against the JSON Schema of its kind, `docs/reference/events.schema.json`,
//! which the kernel's reference test generates from its payload types: each field the payload
//! carries is one its kind declares, with a value of the declared type, and each field the kind
//! always writes is there. A kind written in several shapes (its schema's `anyOf`) is checked
//! against each until one fits.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// The schema of each kind's payload, by kind (the schema document's `$defs`).
fn schemas() -> &'static Map<String, Value> {
    static SCHEMAS: OnceLock<Map<String, Value>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/events.schema.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut document: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        match document.get_mut("$defs").map(Value::take) {
            Some(Value::Object(defs)) => defs,
            _ => panic!("{} has no $defs", path.display()),
        }
    })
}

/// Why the payload of an event of `kind` does not fit its kind's schema; `None` when it does.
pub fn misfit(kind: &str, payload: &Value) -> Option<String> {
    let Some(schema) = schemas().get(kind) else {
        return Some(format!("the kind {kind} has no schema"));
    };
    let shapes: Vec<&Value> = match schema.get("anyOf").and_then(Value::as_array) {
        Some(shapes) => shapes.iter().collect(),
        None => vec![schema],
    };
    let mut why = Vec::new();
    for (number, shape) in shapes.iter().enumerate() {
        match shape_misfit(shape, payload) {
            None => return None,
            Some(reason) if shapes.len() == 1 => why.push(reason),
            Some(reason) => why.push(format!("shape {}: {reason}", number + 1)),
        }
    }
    Some(why.join("; "))
}

/// Why `payload` is not an object of `shape`.
fn shape_misfit(shape: &Value, payload: &Value) -> Option<String> {
    let Value::Object(fields) = payload else {
        return Some("not an object".to_owned());
    };
    let empty = Map::new();
    let declared = shape.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let undeclared: Vec<&String> = fields.keys().filter(|key| !declared.contains_key(*key)).collect();
    if !undeclared.is_empty() {
        return Some(format!("carries {undeclared:?}, which its schema does not declare"));
    }
    let missing: Vec<&str> = shape
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| !fields.contains_key(*name))
        .collect();
    if !missing.is_empty() {
        return Some(format!("lacks {missing:?}, which its schema says it always has"));
    }
    fields
        .iter()
        .find_map(|(name, value)| value_misfit(&declared[name], value).map(|why| format!("{name}: {why}")))
}

/// Why `value` is not of the type (and among the values) `schema` declares.
fn value_misfit(schema: &Value, value: &Value) -> Option<String> {
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        return any
            .iter()
            .all(|branch| value_misfit(branch, value).is_some())
            .then(|| format!("{value} fits none of {any:?}"));
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    if !types.iter().any(|ty| is(ty, value)) {
        return Some(format!("{value} is not {}", types.join(" or ")));
    }
    match schema.get("enum").and_then(Value::as_array) {
        Some(values) if !values.contains(value) => Some(format!("{value} is not one of {values:?}")),
        _ => None,
    }
}

/// Whether `value` is of the JSON Schema type `ty`.
fn is(ty: &str, value: &Value) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::misfit;

    #[test]
    fn a_payload_fits_its_kind_or_says_why_not() {
        assert_eq!(misfit("run:resumed", &json!({"reason": "tool_approval"})), None);
        let extra = misfit("run:resumed", &json!({"reason": "x", "surprise": 1})).expect("an undeclared field");
        assert!(extra.contains("surprise"), "{extra}");
        let missing = misfit("run:resumed", &json!({})).expect("a missing field");
        assert!(missing.contains("reason"), "{missing}");
        let typed = misfit("run:completed", &json!({"output": 1, "cancelled_steps": "2"})).expect("a wrong type");
        assert!(typed.contains("cancelled_steps"), "{typed}");
        let value = misfit(
            "tool:lease_lost",
            &json!({
                "step_key": "t0/p0", "position": 0, "tool": "t", "attempt": 1, "dispatch_id": null, "worker": null,
                "reason": "gone", "next": "somewhere",
            }),
        )
        .expect("a value not among the kind's");
        assert!(value.contains("somewhere"), "{value}");
        assert!(misfit("no:such", &json!({})).is_some());
    }
}
