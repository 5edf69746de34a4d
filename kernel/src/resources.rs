//! The external resources a tool may change (Rebuno's `resources`), and the instances a call
//! touches.
//!
//! A tool declares resources as `kind` (`workspace`) or `kind:instance`, where the instance may
//! name the call's arguments in braces (`repo:{repo}`, `file:{owner}/{path}`). A call's resources
//! are its tool's with the braces filled from its arguments. A resource with an instance is a
//! **lock**: calls holding the same instance never run at once anywhere in the kernel (the store
//! holds the lock while the call runs). A bare kind only names what the tool changes, for policy
//! and audit.

use serde_json::Value;

/// Longest declared resource.
const MAX_RESOURCE_LEN: usize = 256;
/// Most resources one tool may declare.
pub const MAX_RESOURCES: usize = 16;
/// Longest instance an argument may fill in; a longer value is cut (a lock key stays small).
const MAX_FILLED_LEN: usize = 256;

/// Checks a tool's declared resources against its input schema: each is `kind` or
/// `kind:instance`, and every `{name}` in an instance is a required top-level argument, so every
/// valid call has a value for it. Returns the index of the offending resource and why.
pub fn validate(resources: &[String], schema: &Value) -> Result<(), (usize, String)> {
    if resources.len() > MAX_RESOURCES {
        return Err((
            MAX_RESOURCES,
            format!("{} resources; at most {MAX_RESOURCES}", resources.len()),
        ));
    }
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (index, resource) in resources.iter().enumerate() {
        check_one(resource, &required).map_err(|message| (index, message))?;
    }
    Ok(())
}

fn check_one(resource: &str, required: &[&str]) -> Result<(), String> {
    if resource.is_empty() || resource.len() > MAX_RESOURCE_LEN {
        return Err(format!(
            "'{resource}': a resource is 1 to {MAX_RESOURCE_LEN} characters"
        ));
    }
    let (kind, instance) = split(resource);
    let kind_ok = !kind.is_empty()
        && kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if !kind_ok {
        return Err(format!(
            "'{resource}': its kind '{kind}' must be non-empty, from [a-zA-Z0-9_.-]"
        ));
    }
    let Some(instance) = instance else {
        return Ok(());
    };
    if instance.is_empty() {
        return Err(format!(
            "'{resource}': nothing after ':'; write '{kind}' or '{kind}:<instance>'"
        ));
    }
    for part in parts(instance) {
        match part {
            Part::Text(text) if text.contains(['{', '}']) => {
                return Err(format!(
                    "'{resource}': an unmatched brace; an argument is written {{name}}"
                ));
            }
            Part::Arg(name) if !required.contains(&name) => {
                return Err(format!(
                    "'{resource}': {{{name}}} is not a required argument of the tool's input schema, so a call \
                     could leave it out; name a required top-level property"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A call's resources: its tool's, each instance filled from `args`.
pub fn resolve(resources: &[String], args: &Value) -> Vec<String> {
    resources.iter().map(|resource| fill(resource, args)).collect()
}

fn fill(resource: &str, args: &Value) -> String {
    let (kind, Some(instance)) = split(resource) else {
        return resource.to_owned();
    };
    let mut filled = String::with_capacity(resource.len());
    for part in parts(instance) {
        match part {
            Part::Text(text) => filled.push_str(text),
            Part::Arg(name) => {
                let value = match &args[name] {
                    Value::String(text) => text.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                filled.push_str(cut(&value, MAX_FILLED_LEN));
            }
        }
    }
    format!("{kind}:{filled}")
}

/// The resources of a call that are locks: those with an instance.
pub fn locks(resolved: &[String]) -> impl Iterator<Item = &String> {
    resolved.iter().filter(|resource| split(resource).1.is_some())
}

/// A resource's kind: what comes before the first `:`.
pub fn kind(resource: &str) -> &str {
    split(resource).0
}

fn split(resource: &str) -> (&str, Option<&str>) {
    match resource.split_once(':') {
        Some((kind, instance)) => (kind, Some(instance)),
        None => (resource, None),
    }
}

enum Part<'a> {
    Text(&'a str),
    Arg(&'a str),
}

/// An instance as literal text and `{name}` arguments; a brace without its pair stays text.
fn parts(instance: &str) -> Vec<Part<'_>> {
    let mut out = Vec::new();
    let mut rest = instance;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|at| open + at) else {
            break;
        };
        let name = &rest[open + 1..close];
        if name.is_empty() || name.contains('{') {
            break;
        }
        if open > 0 {
            out.push(Part::Text(&rest[..open]));
        }
        out.push(Part::Arg(name));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Part::Text(rest));
    }
    out
}

fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "required": ["repo", "n"], "properties": {
            "repo": {"type": "string"}, "n": {"type": "integer"}, "note": {"type": "string"}}})
    }

    fn declared(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn kinds_and_instances_over_required_arguments_are_valid() {
        let ok = declared(&[
            "workspace",
            "repo:{repo}",
            "pr:{repo}#{n}",
            "db:prod",
            "file.v2:{repo}/x",
        ]);
        assert_eq!(validate(&ok, &schema()), Ok(()));
    }

    #[test]
    fn each_bad_declaration_is_named_with_its_index() {
        let cases = [
            ("", "1 to 256 characters"),
            (":x", "its kind '' must be non-empty"),
            ("has space", "from [a-zA-Z0-9_.-]"),
            ("repo:", "nothing after ':'"),
            ("repo:{note}", "{note} is not a required argument"),
            ("repo:{missing}", "{missing} is not a required argument"),
            ("repo:{repo", "an unmatched brace"),
            ("repo:repo}", "an unmatched brace"),
        ];
        for (resource, expected) in cases {
            let list = declared(&["workspace", resource]);
            let (index, message) = validate(&list, &schema()).unwrap_err();
            assert_eq!(index, 1, "{resource}");
            assert!(message.contains(expected), "{resource}: {message}");
        }
        let many: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("r{i}")).collect();
        assert!(validate(&many, &schema()).is_err());
    }

    #[test]
    fn a_call_fills_instances_from_its_arguments_and_only_instances_lock() {
        let list = declared(&["workspace", "repo:{repo}", "pr:{repo}#{n}", "db:prod"]);
        let resolved = resolve(&list, &json!({"repo": "acme/api", "n": 7}));
        assert_eq!(resolved, ["workspace", "repo:acme/api", "pr:acme/api#7", "db:prod"]);
        let locks: Vec<&String> = locks(&resolved).collect();
        assert_eq!(locks, ["repo:acme/api", "pr:acme/api#7", "db:prod"]);
        assert_eq!(kind("pr:acme/api#7"), "pr");
        assert_eq!(kind("workspace"), "workspace");
    }

    #[test]
    fn a_long_argument_is_cut_to_keep_the_key_small() {
        let long = "é".repeat(500);
        let resolved = resolve(&declared(&["doc:{repo}"]), &json!({"repo": long}));
        assert!(resolved[0].len() <= "doc:".len() + MAX_FILLED_LEN);
        assert!(resolved[0].starts_with("doc:é"));
    }
}
