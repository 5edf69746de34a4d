//! Secret fields of tool calls: an argument or result field a tool marks secret is never recorded,
//! shown or exported in clear. In its place the record holds `{"$secret": "hmac-sha256:<hex>"}`,
//! a hash keyed with the kernel's secret key, so the same value hashes the same: a resubmitted
//! call is still recognised (replayed, or refused as `replay_input_changed`) and the result cache
//! still keys on it, while nobody holding the database can test guesses against it. An
//! argument's value reaches the worker only in the dispatch: meanwhile it is kept sealed
//! (ChaCha20-Poly1305 under the same key, bound to its run and step), so a call survives the
//! kernel's restart, its retries and its lost leases, and the key, kept outside the database,
//! is what opens it.
//!
//! A field is secret when the arguments' JSON Schema marks it (`writeOnly: true` or
//! `format: password`, at any depth of `properties`, through local `$ref`s and `anyOf`/`oneOf`)
//! or the tool's `secret` option names it (a top-level field of the arguments, or of an object
//! result).

use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hmac::{Hmac, Mac};
use kernel_proto::canonical::to_canonical;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::model::{RunId, StepKey, StepRecord, ToolDef};

/// The key of a recorded secret's place: `{"$secret": "<keyed hash>"}`.
pub const MARK: &str = "$secret";

/// The most secret field names a tool may declare, and the longest.
const MAX_NAMES: usize = 64;
const MAX_NAME: usize = 128;

/// How deep a schema is searched for marked properties.
const MAX_DEPTH: usize = 16;

/// The kernel's secret key: one seed, from which the hash key and the sealing key derive.
pub struct SecretKey {
    hash: [u8; 32],
    seal: ChaCha20Poly1305,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl SecretKey {
    /// The key `path` holds (a 32-byte seed as 64 hex digits), or a new one written there.
    pub fn load_or_create(path: &Path) -> Result<SecretKey, String> {
        crate::key_file::seed(path, "a secret key's seed").map(|seed| SecretKey::from_seed(&seed))
    }

    pub fn from_seed(seed: &[u8; 32]) -> SecretKey {
        let derive =
            |label: &[u8]| -> [u8; 32] { Sha256::new().chain_update(label).chain_update(seed).finalize().into() };
        SecretKey {
            hash: derive(b"kernel secret fields: hash v1"),
            seal: ChaCha20Poly1305::new(&derive(b"kernel secret fields: seal v1").into()),
        }
    }

    /// What the record holds in a secret value's place.
    fn mark(&self, value: &Value) -> Value {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.hash).expect("HMAC takes any key length");
        mac.update(to_canonical(value).as_bytes());
        let hash = hex::encode(mac.finalize().into_bytes());
        Value::Object(Map::from_iter([(
            MARK.to_owned(),
            Value::String(format!("hmac-sha256:{hash}")),
        )]))
    }
}

/// Checks a tool's `secret` option: at most [`MAX_NAMES`] names of 1 to [`MAX_NAME`] printable
/// characters; `Err` names the first bad one by its index.
pub fn check_names(names: &[String]) -> Result<(), (usize, String)> {
    if names.len() > MAX_NAMES {
        return Err((MAX_NAMES, format!("{} names; at most {MAX_NAMES}", names.len())));
    }
    for (index, name) in names.iter().enumerate() {
        if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
            return Err((index, format!("must be 1 to {MAX_NAME} printable characters")));
        }
    }
    Ok(())
}

/// A step of a path to a secret field: a property of an object, or every element of an array.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Key(String),
    Each,
}

/// Where a tool's secret fields are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SecretFields {
    /// Paths into the arguments object.
    arguments: Vec<Vec<Segment>>,
    /// Top-level fields of an object result.
    results: Vec<String>,
}

impl SecretFields {
    /// The secret fields `def` declares: marked in its schema, or named by its `secret` option.
    pub fn of(def: &ToolDef) -> SecretFields {
        let mut arguments = Vec::new();
        marked(&def.input_schema, &def.input_schema, &mut Vec::new(), &mut arguments, 0);
        for name in &def.options.secret {
            let path = vec![Segment::Key(name.clone())];
            if !arguments.contains(&path) {
                arguments.push(path);
            }
        }
        SecretFields {
            arguments,
            results: def.options.secret.clone(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.arguments.is_empty() && self.results.is_empty()
    }

    /// Whether `args` holds a value (not null) in one of these fields.
    pub fn present_in(&self, args: &Value) -> bool {
        self.values_in(args).any(|value| !value.is_null())
    }

    /// Each value `args` holds in one of these fields, an array's field once per element.
    fn values_in<'a>(&'a self, args: &'a Value) -> impl Iterator<Item = &'a Value> {
        (self.arguments.iter())
            .flat_map(|path| places(args, path))
            .filter_map(|concrete| place(args, &concrete))
    }

    /// `text` with every secret value of `args` in it replaced by `<secret>`: as JSON (how a
    /// schema error quotes it) and, for a string, as its bare text.
    pub fn scrub(&self, text: &str, args: &Value) -> String {
        let mut scrubbed = text.to_owned();
        for value in self.values_in(args) {
            let mut forms = vec![to_canonical(value), value.to_string()];
            if let Some(text) = value.as_str().filter(|t| !t.is_empty()) {
                forms.push(text.to_owned());
            }
            for form in forms {
                scrubbed = scrubbed.replace(&form, "<secret>");
            }
        }
        scrubbed
    }

    /// The arguments' secret fields, dotted (`card.number`, `cards.*.number` for each element of
    /// an array), for messages.
    pub fn names(&self) -> Vec<String> {
        let segment = |segment: &Segment| match segment {
            Segment::Key(name) => name.clone(),
            Segment::Each => "*".to_owned(),
        };
        (self.arguments.iter())
            .map(|path| path.iter().map(segment).collect::<Vec<_>>().join("."))
            .collect()
    }
}

/// Collects the paths of the properties of `schema` marked secret, and of the elements of its
/// arrays (`items`), resolving local `$ref`s against `root`.
fn marked(root: &Value, schema: &Value, path: &mut Vec<Segment>, found: &mut Vec<Vec<Segment>>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let schema = resolved(root, schema);
    for alternative in ["anyOf", "oneOf", "allOf"] {
        for branch in schema[alternative].as_array().into_iter().flatten() {
            marked(root, branch, path, found, depth + 1);
        }
    }
    let inside = |segment: Segment, part: &Value, path: &mut Vec<Segment>, found: &mut Vec<Vec<Segment>>| {
        path.push(segment);
        if is_marked(root, part) {
            if !found.contains(path) {
                found.push(path.clone());
            }
        } else {
            marked(root, part, path, found, depth + 1);
        }
        path.pop();
    };
    if schema["items"].is_object() {
        inside(Segment::Each, &schema["items"], path, found);
    }
    for (name, property) in schema["properties"].as_object().into_iter().flatten() {
        inside(Segment::Key(name.clone()), property, path, found);
    }
}

/// Whether a property's schema marks it secret, itself or in one of its alternatives
/// (`Optional[SecretStr]` is `anyOf` a marked string and null).
fn is_marked(root: &Value, property: &Value) -> bool {
    let property = resolved(root, property);
    let marks = |schema: &Value| schema["writeOnly"] == Value::Bool(true) || schema["format"] == "password";
    marks(property)
        || ["anyOf", "oneOf"].iter().any(|alternative| {
            property[alternative]
                .as_array()
                .is_some_and(|branches| branches.iter().any(|b| marks(resolved(root, b))))
        })
}

/// `schema`, or what its local `$ref` (`#/$defs/Card`) points at.
fn resolved<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str().and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => root.pointer(pointer).unwrap_or(schema),
        None => schema,
    }
}

/// Arguments with their secret values taken out.
#[derive(Debug)]
pub struct Hidden {
    /// The arguments as the record holds them: each secret value present replaced by its mark.
    pub recorded: Value,
    /// What was taken out, by path (an array's element by its index), to seal for the dispatch.
    taken: Vec<(Vec<String>, Value)>,
}

impl Hidden {
    /// The values taken out, sealed for the dispatch of call `key` of `run` (hex of nonce and
    /// ciphertext).
    pub fn seal(&self, key: &SecretKey, (run, step): (&RunId, &StepKey)) -> String {
        let taken: Vec<Value> = (self.taken.iter())
            .map(|(path, value)| Value::Array(vec![Value::from(path.clone()), value.clone()]))
            .collect();
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).expect("the system has randomness");
        let aad = bound(run, step);
        let message = to_canonical(&Value::Array(taken));
        let payload = Payload {
            msg: message.as_bytes(),
            aad: aad.as_bytes(),
        };
        let sealed = key
            .seal
            .encrypt(Nonce::from_slice(&nonce), payload)
            .expect("sealing a small message cannot fail");
        hex::encode([&nonce[..], &sealed].concat())
    }
}

/// What a sealed message is bound to: it opens only as the arguments of that very call.
fn bound(run: &RunId, step: &StepKey) -> String {
    format!("{run}\n{step}")
}

/// `args` with the secret values `fields` name taken out and marked; `None` when none is present
/// (nothing to hide: the arguments are recorded as they are). A null is no secret.
pub fn hide(args: &Value, fields: &SecretFields, key: &SecretKey) -> Option<Hidden> {
    let mut recorded = args.clone();
    let mut taken = Vec::new();
    for path in fields.arguments.iter().flat_map(|path| places(args, path)) {
        let Some(place) = place_mut(&mut recorded, &path) else {
            continue;
        };
        if place.is_null() {
            continue;
        }
        let value = std::mem::replace(place, Value::Null);
        *place = key.mark(&value);
        taken.push((path, value));
    }
    (!taken.is_empty()).then_some(Hidden { recorded, taken })
}

/// The concrete paths `path` names within `value`: each `Each` in turn every index of the array
/// there (written as its number), each key as it is; a step that finds no object or array ends
/// there, naming nothing.
fn places(value: &Value, path: &[Segment]) -> Vec<Vec<String>> {
    let Some((first, rest)) = path.split_first() else {
        return vec![Vec::new()];
    };
    let below = |step: String, inner: &Value| {
        places(inner, rest).into_iter().map(move |mut tail| {
            tail.insert(0, step.clone());
            tail
        })
    };
    match (first, value) {
        (Segment::Key(name), Value::Object(object)) => object
            .get(name)
            .map(|inner| below(name.clone(), inner).collect())
            .unwrap_or_default(),
        (Segment::Each, Value::Array(items)) => (items.iter().enumerate())
            .flat_map(|(index, inner)| below(index.to_string(), inner))
            .collect(),
        _ => Vec::new(),
    }
}

/// The value at concrete `path` within `value`: a key of an object, or the index of an array's
/// element.
fn place<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |at, step| match at {
        Value::Object(object) => object.get(step),
        Value::Array(items) => items.get(step.parse::<usize>().ok()?),
        _ => None,
    })
}

/// As [`place`], to change.
fn place_mut<'a>(value: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |at, step| match at {
        Value::Object(object) => object.get_mut(step),
        Value::Array(items) => items.get_mut(step.parse::<usize>().ok()?),
        _ => None,
    })
}

/// The arguments a worker is dispatched: the recorded ones with the sealed values put back in
/// their places, as canonical JSON. `Err` when the seal does not open (another key, or another
/// call's).
pub fn reveal(
    recorded: &str,
    sealed: &str,
    key: &SecretKey,
    (run, step): (&RunId, &StepKey),
) -> Result<String, String> {
    let bytes = hex::decode(sealed).map_err(|e| format!("the sealed arguments of call {step} are not hex: {e}"))?;
    if bytes.len() < 12 {
        return Err(format!("the sealed arguments of call {step} are too short"));
    }
    let (nonce, ciphertext) = bytes.split_at(12);
    let aad = bound(run, step);
    let opened = key
        .seal
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: aad.as_bytes(),
            },
        )
        .map_err(|_| {
            format!("the sealed arguments of call {step} do not open with this kernel's secret key (was it changed?)")
        })?;
    let taken: Vec<(Vec<String>, Value)> =
        serde_json::from_slice(&opened).map_err(|e| format!("the sealed arguments of call {step}: {e}"))?;
    let mut args: Value = serde_json::from_str(recorded).map_err(|e| format!("the arguments of call {step}: {e}"))?;
    for (path, value) in taken {
        if let Some(place) = place_mut(&mut args, &path) {
            *place = value;
        }
    }
    Ok(to_canonical(&args))
}

/// The arguments call `step` is dispatched with: its recorded ones, with its sealed secret
/// values put back (`key` is the kernel's; a call with sealed values and no key cannot run).
pub fn dispatched(step: &StepRecord, key: Option<&SecretKey>) -> Result<String, String> {
    match (&step.sealed, key) {
        (None, _) => Ok(step.arguments.clone()),
        (Some(sealed), Some(key)) => reveal(&step.arguments, sealed, key, (&step.run_id, &step.key)),
        (Some(_), None) => Err(format!(
            "call {} has sealed secret arguments and this kernel has no secret key (--secret-key)",
            step.key
        )),
    }
}

/// A worker's result JSON text as the record keeps it: with the secret fields `fields` name
/// marked when it is an object holding some; otherwise as it came.
pub fn recorded_output(text: String, fields: &SecretFields, key: &SecretKey) -> String {
    if fields.results.is_empty() {
        return text;
    }
    let hidden = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|output| hide_result(&output, fields, key));
    hidden.map_or(text, |hidden| to_canonical(&hidden))
}

/// An object result with the secret fields `fields` name marked in place of their values;
/// `None` when it holds none.
pub fn hide_result(output: &Value, fields: &SecretFields, key: &SecretKey) -> Option<Value> {
    let object = output.as_object()?;
    if !fields
        .results
        .iter()
        .any(|name| object.get(name).is_some_and(|v| !v.is_null()))
    {
        return None;
    }
    let mut hidden = object.clone();
    for name in &fields.results {
        if let Some(value) = hidden.get_mut(name).filter(|v| !v.is_null()) {
            *value = key.mark(value);
        }
    }
    Some(Value::Object(hidden))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::ToolOptions;

    fn key() -> SecretKey {
        SecretKey::from_seed(&[7; 32])
    }

    fn tool(schema: Value, secret: &[&str]) -> ToolDef {
        ToolDef {
            name: "pay".into(),
            description: "d".into(),
            input_schema: schema,
            version: String::new(),
            fingerprint: "fp".into(),
            options: ToolOptions {
                secret: secret.iter().map(|s| (*s).to_owned()).collect(),
                ..ToolOptions::default()
            },
        }
    }

    #[test]
    fn the_schema_and_the_option_mark_fields_at_any_depth_through_refs_and_alternatives() {
        // As pydantic writes a model with a SecretStr, an Optional one and a nested model.
        let schema = json!({
            "type": "object",
            "properties": {
                "amount": {"type": "integer"},
                "api_key": {"type": "string", "format": "password", "writeOnly": true},
                "pin": {"anyOf": [{"type": "string", "format": "password", "writeOnly": true}, {"type": "null"}]},
                "card": {"$ref": "#/$defs/Card"},
                "note": {"type": "string"},
            },
            "$defs": {"Card": {"type": "object", "properties": {
                "number": {"type": "string", "writeOnly": true},
                "holder": {"type": "string"},
            }}},
        });
        let fields = SecretFields::of(&tool(schema, &["note"]));
        let mut names = fields.names();
        names.sort();
        assert_eq!(names, ["api_key", "card.number", "note", "pin"]);
        assert!(SecretFields::of(&tool(json!({"type": "object"}), &[])).is_empty());
    }

    #[test]
    fn a_hidden_value_is_marked_by_a_keyed_hash_sealed_and_revealed_only_for_its_call() {
        let schema = json!({"type": "object", "properties": {
            "api_key": {"type": "string", "writeOnly": true},
            "card": {"type": "object", "properties": {"number": {"type": "string", "format": "password"}}},
        }});
        let fields = SecretFields::of(&tool(schema, &[]));
        let args = json!({"amount": 5, "api_key": "sk-live-QZ", "card": {"number": "4111-QZ"}});
        let hidden = hide(&args, &fields, &key()).unwrap();
        let recorded = to_canonical(&hidden.recorded);
        assert!(!recorded.contains("QZ"), "{recorded}");
        assert!(
            hidden.recorded["api_key"][MARK]
                .as_str()
                .unwrap()
                .starts_with("hmac-sha256:")
        );
        assert_eq!(hidden.recorded["amount"], 5);
        // The same value marks the same under one key, and differently under another.
        let again = hide(&args, &fields, &key()).unwrap();
        assert_eq!(again.recorded, hidden.recorded);
        let other = hide(&args, &fields, &SecretKey::from_seed(&[8; 32])).unwrap();
        assert_ne!(other.recorded, hidden.recorded);

        let (run, step) = (RunId::new(), StepKey::for_call(0, 1, None));
        let sealed = hidden.seal(&key(), (&run, &step));
        assert!(!sealed.contains("QZ"));
        assert_ne!(sealed, hidden.seal(&key(), (&run, &step)), "a fresh nonce each time");
        let revealed = reveal(&recorded, &sealed, &key(), (&run, &step)).unwrap();
        assert_eq!(revealed, to_canonical(&args));
        // Another call's seal, or another key, does not open.
        let elsewhere = reveal(&recorded, &sealed, &key(), (&run, &StepKey::for_call(0, 2, None)));
        assert!(elsewhere.unwrap_err().contains("do not open"));
        assert!(reveal(&recorded, &sealed, &SecretKey::from_seed(&[8; 32]), (&run, &step)).is_err());
    }

    #[test]
    fn secrets_in_the_elements_of_arrays_are_marked_each_and_revealed_in_place() {
        // As pydantic writes `cards: list[Card]` and `pins: list[SecretStr]`.
        let schema = json!({"type": "object", "properties": {
            "cards": {"type": "array", "items": {"$ref": "#/$defs/Card"}},
            "pins": {"type": "array", "items": {"type": "string", "format": "password", "writeOnly": true}},
            "tags": {"type": "array", "items": {"type": "string"}},
        }, "$defs": {"Card": {"type": "object", "properties": {
            "number": {"type": "string", "writeOnly": true},
            "holder": {"type": "string"},
        }}}});
        let fields = SecretFields::of(&tool(schema, &[]));
        let mut names = fields.names();
        names.sort();
        assert_eq!(names, ["cards.*.number", "pins.*"]);
        let args = json!({
            "cards": [{"number": "4111-QZ", "holder": "ann"}, {"holder": "bo"}, {"number": "5500-QZ", "holder": "cy"}],
            "pins": ["12-QZ", "34-QZ"],
            "tags": ["QZ-not-secret"],
        });
        assert!(fields.present_in(&args));
        let hidden = hide(&args, &fields, &key()).unwrap();
        let recorded = to_canonical(&hidden.recorded);
        assert_eq!(recorded.matches("QZ").count(), 1, "only the tag is kept: {recorded}");
        assert!(hidden.recorded["cards"][0]["number"][MARK].is_string());
        assert_eq!(hidden.recorded["cards"][0]["holder"], "ann");
        assert!(hidden.recorded["cards"][1].get("number").is_none());
        assert!(hidden.recorded["pins"][1][MARK].is_string());
        let (run, step) = (RunId::new(), StepKey::for_call(0, 0, None));
        let sealed = hidden.seal(&key(), (&run, &step));
        assert_eq!(
            reveal(&recorded, &sealed, &key(), (&run, &step)).unwrap(),
            to_canonical(&args)
        );
        let said = r#"/cards/2/number: "5500-QZ" is too long; /pins/0: "12-QZ""#;
        assert_eq!(
            fields.scrub(said, &args),
            r#"/cards/2/number: <secret> is too long; /pins/0: <secret>"#
        );
        assert!(hide(&json!({"cards": [], "pins": null}), &fields, &key()).is_none());
    }

    #[test]
    fn arguments_without_a_secret_value_are_recorded_as_they_are() {
        let fields = SecretFields::of(&tool(json!({"type": "object"}), &["token"]));
        assert!(hide(&json!({"amount": 5}), &fields, &key()).is_none());
        assert!(hide(&json!({"token": null}), &fields, &key()).is_none());
        assert!(hide(&json!({"token": "t-QZ"}), &fields, &key()).is_some());
    }

    #[test]
    fn a_secret_result_field_is_marked_and_the_rest_kept() {
        let fields = SecretFields::of(&tool(json!({"type": "object"}), &["token"]));
        let hidden = hide_result(&json!({"token": "t-QZ", "id": 3}), &fields, &key()).unwrap();
        assert_eq!(hidden["id"], 3);
        assert!(hidden["token"][MARK].is_string());
        assert!(hide_result(&json!({"id": 3}), &fields, &key()).is_none());
        assert!(
            hide_result(&json!("t-QZ"), &fields, &key()).is_none(),
            "only an object's fields"
        );
    }

    #[test]
    fn a_message_quoting_a_secret_value_is_scrubbed() {
        let fields = SecretFields::of(&tool(json!({"type": "object"}), &["pin", "token"]));
        let args = json!({"pin": 4111, "token": "t-QZ"});
        let said = r#"/pin: 4111 is not of type "string"; /token: "t-QZ" is too short (t-QZ)"#;
        assert_eq!(
            fields.scrub(said, &args),
            r#"/pin: <secret> is not of type "string"; /token: <secret> is too short (<secret>)"#
        );
    }

    #[test]
    fn secret_names_are_checked() {
        assert!(check_names(&["token".into()]).is_ok());
        assert_eq!(check_names(&["ok".into(), String::new()]).unwrap_err().0, 1);
        assert!(check_names(&vec!["x".into(); MAX_NAMES + 1]).is_err());
    }
}
