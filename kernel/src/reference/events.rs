//! The event reference, `docs/reference/events.md`, and the payloads' JSON Schema,
//! `docs/reference/events.schema.json`, both from the payload types of `machine::events`: the
//! page is rendered from the schema, so the two cannot disagree.
//!
//! The schema document describes one event as `kernelctl runs events --json` prints it: its
//! `type` picks, by an `if`/`then` per kind, the `$defs` entry its `payload` must match.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use crate::clap_reference::{cell, prose};
use crate::machine::events;
use crate::model::EventType;

/// The schema file's name, as the page links it.
pub(super) const SCHEMA_FILE: &str = "events.schema.json";

/// The schema document of every kind's payload; `comment` says how it is generated.
pub(super) fn schema_document(comment: &str) -> String {
    let kinds: Vec<&str> = EventType::ALL.iter().map(|kind| kind.as_str()).collect();
    let mut defs = Map::new();
    let mut rules = Vec::new();
    for kind in EventType::ALL {
        let mut schema = events::schema(*kind).to_value();
        if let Some(schema) = schema.as_object_mut() {
            schema.remove("$schema");
            schema.insert("title".into(), Value::String(kind.as_str().to_owned()));
            schema.insert("description".into(), Value::String(cell(kind.doc())));
        }
        defs.insert(kind.as_str().to_owned(), schema);
        rules.push(json!({
            "if": { "properties": { "type": { "const": kind.as_str() } } },
            "then": { "properties": { "payload": { "$ref": format!("#/$defs/{}", kind.as_str()) } } },
        }));
    }
    let document = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": comment,
        "title": "An event of a run's log",
        "description": "One event as `kernelctl runs events --json` prints it (the gRPC `Event` carries the same \
                        `type`, and its `payload_json` is the payload as text). Its `payload` matches the entry of \
                        `$defs` named by its `type`. Every event also carries `schema_version` (1).",
        "type": "object",
        "required": ["type", "payload"],
        "properties": {
            "type": { "description": "The event's kind.", "enum": kinds },
            "payload": { "description": "What the event records; its fields depend on its kind.", "type": "object" },
        },
        "allOf": rules,
        "$defs": defs,
    });
    let mut text = serde_json::to_string_pretty(&document).expect("a JSON value serializes");
    text.push('\n');
    text
}

/// The page, after its `generated_by` line.
pub(super) fn page(generated_by: String) -> String {
    let mut out = generated_by;
    out.push_str("# Event kinds\n\n");
    let _ = write!(
        out,
        "Every event of a run's log has one of these kinds (`kernelctl runs events RUN` prints them; \
         [Concepts](../concepts.md) says how a run's log is replayed). Every event carries `schema_version` (1). \
         Its payload is a JSON object: the table under each kind lists every field it may have, its JSON type, \
         whether it is always there, and what it means. A field that is not always there is left out where it \
         does not apply; only a field whose type allows `null` is ever written as `null`. The same fields, as a JSON \
         Schema, are in [`{SCHEMA_FILE}`]({SCHEMA_FILE}); the end-to-end suite checks every event it sees against \
         it.\n\n"
    );
    for kind in EventType::ALL {
        let _ = writeln!(out, "- [`{0}`](#{1})", kind.as_str(), anchor(kind.as_str()));
    }
    for kind in EventType::ALL {
        render_kind(&mut out, *kind);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// A heading's anchor as GitHub makes it: `tool:result` → `toolresult`.
fn anchor(kind: &str) -> String {
    kind.chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
        .collect()
}

/// One kind: its heading, what it records, its shapes when it has several, and its fields.
fn render_kind(out: &mut String, kind: EventType) {
    let schema = events::schema(kind).to_value();
    let _ = writeln!(out, "\n## `{}`\n\n{}\n", kind.as_str(), prose(kind.doc()));
    let shapes = shapes(&schema);
    if shapes.len() > 1 {
        out.push_str("It is written in one of these shapes, which the table's column \"present\" refers to:\n\n");
        for (number, shape) in shapes.iter().enumerate() {
            let _ = writeln!(out, "{}. {}", number + 1, prose(text(shape, "description")));
        }
        out.push('\n');
    }
    out.push_str("| field | type | present | meaning |\n|---|---|---|---|\n");
    for field in fields(&shapes) {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            field.name,
            type_of(field.schema),
            presence(field.name, &shapes),
            meaning(field.name, &shapes)
        );
    }
}

/// When a field is there: `always`, `sometimes` (where it applies), or, for a payload of several
/// shapes, in which it always is and in which sometimes.
fn presence(name: &str, shapes: &[&Value]) -> String {
    let (mut always, mut sometimes) = (Vec::new(), Vec::new());
    for (number, shape) in shapes.iter().enumerate() {
        if required(shape).contains(&name) {
            always.push((number + 1).to_string());
        } else if shape.get("properties").and_then(|p| p.get(name)).is_some() {
            sometimes.push((number + 1).to_string());
        }
    }
    if always.len() == shapes.len() {
        return "always".to_owned();
    }
    if shapes.len() == 1 {
        return "sometimes".to_owned();
    }
    let mut parts = Vec::new();
    if !always.is_empty() {
        parts.push(format!("in {}", always.join(", ")));
    }
    if !sometimes.is_empty() {
        parts.push(format!("sometimes in {}", sometimes.join(", ")));
    }
    parts.join("; ")
}

/// What a field means: as its shapes describe it, each distinct description once, prefixed by
/// the shapes that give it when they differ.
fn meaning(name: &str, shapes: &[&Value]) -> String {
    let mut meanings: Vec<(Vec<String>, &str)> = Vec::new();
    for (number, shape) in shapes.iter().enumerate() {
        let Some(field) = shape.get("properties").and_then(|p| p.get(name)) else {
            continue;
        };
        let description = text(field, "description");
        match meanings.iter_mut().find(|(_, known)| *known == description) {
            Some((numbers, _)) => numbers.push((number + 1).to_string()),
            None => meanings.push((vec![(number + 1).to_string()], description)),
        }
    }
    match meanings.as_slice() {
        [(_, only)] => cell(only),
        _ => meanings
            .iter()
            .map(|(numbers, description)| format!("({}) {}", numbers.join(", "), cell(description)))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The fields a shape always has, in the order its type declares them.
fn required(shape: &Value) -> Vec<&str> {
    shape
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The shapes of a payload: the branches of an `anyOf`, or the schema itself.
fn shapes(schema: &Value) -> Vec<&Value> {
    match schema.get("anyOf").and_then(Value::as_array) {
        Some(shapes) => shapes.iter().collect(),
        None => vec![schema],
    }
}

/// A field of a payload, as the first shape that has it describes it.
struct Field<'a> {
    name: &'a str,
    schema: &'a Value,
}

/// Every field of a payload's shapes: each shape's required fields in their declared order, then
/// the rest by name.
fn fields<'a>(shapes: &[&'a Value]) -> Vec<Field<'a>> {
    let mut names: Vec<&str> = shapes.iter().flat_map(|shape| required(shape)).collect();
    for shape in shapes {
        names.extend(
            shape
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(Map::keys)
                .map(String::as_str),
        );
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(*name));
    names
        .into_iter()
        .filter_map(|name| {
            let schema = shapes.iter().find_map(|shape| shape.get("properties")?.get(name))?;
            Some(Field { name, schema })
        })
        .collect()
}

/// A string member of a schema, empty when it has none.
fn text<'a>(schema: &'a Value, key: &str) -> &'a str {
    schema.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A field's JSON type, for people: `string`, `integer or null`, `array of string`, the values of
/// a short enum.
fn type_of(schema: &Value) -> String {
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        return any.iter().map(type_of).collect::<Vec<_>>().join(" or ");
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => return "any JSON".to_owned(),
    };
    let nullable = types.contains(&"null");
    let mut shown: Vec<String> = types
        .iter()
        .filter(|ty| **ty != "null")
        .map(|ty| match *ty {
            "array" => format!(
                "array of {}",
                schema.get("items").map_or("any JSON".to_owned(), type_of)
            ),
            "string" => string_values(schema),
            other => other.to_owned(),
        })
        .collect();
    if nullable {
        shown.push("null".to_owned());
    }
    shown.join(" or ")
}

/// A string type, with its values when it is a short enum.
fn string_values(schema: &Value) -> String {
    let values: Vec<String> = schema
        .get("enum")
        .and_then(Value::as_array)
        .map(|values| {
            values
                .iter()
                .filter_map(Value::as_str)
                .map(|v| format!("`{v}`"))
                .collect()
        })
        .unwrap_or_default();
    match values.len() {
        0 => "string".to_owned(),
        1..=4 => format!("string: {}", values.join(", ")),
        n => format!("string: one of {n} values (see the schema)"),
    }
}
