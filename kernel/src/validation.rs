//! Argument validation against a tool's JSON Schema, before policy, approval or dispatch. The
//! model gets one recoverable error that lists every bad field with its path and what was expected.

use std::sync::Arc;

use serde_json::Value;

/// A tool's compiled input schema; cheap to clone.
#[derive(Clone)]
pub struct ArgsValidator(Arc<jsonschema::Validator>);

impl std::fmt::Debug for ArgsValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArgsValidator")
    }
}

impl ArgsValidator {
    /// Compiles a schema; the error says why it is not a usable JSON Schema.
    pub fn compile(schema: &Value) -> Result<Self, String> {
        jsonschema::validator_for(schema)
            .map(|v| ArgsValidator(Arc::new(v)))
            .map_err(|e| e.to_string())
    }

    /// Checks arguments; the error names the tool and every bad field.
    pub fn check(&self, tool: &str, args: &Value) -> Result<(), String> {
        self.check_value(args)
            .map_err(|problems| format!("invalid arguments for tool '{tool}': {problems}"))
    }

    /// Checks a value; the error names every bad field (`(arguments)` for the value itself).
    pub fn check_value(&self, value: &Value) -> Result<(), String> {
        let problems: Vec<String> = self
            .0
            .iter_errors(value)
            .map(|error| {
                let path = error.instance_path().to_string();
                let field = if path.is_empty() {
                    "(arguments)".to_owned()
                } else {
                    path
                };
                format!("{field}: {error}")
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn adder() -> ArgsValidator {
        ArgsValidator::compile(&json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["a", "b"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn good_arguments_pass() {
        assert!(adder().check("add", &json!({"a": 1, "b": 2})).is_ok());
    }

    #[test]
    fn every_bad_field_is_listed_with_its_path() {
        let error = adder()
            .check("add", &json!({"a": "two", "tags": [1], "c": true}))
            .unwrap_err();
        assert!(error.starts_with("invalid arguments for tool 'add': "), "{error}");
        assert!(error.contains("/a: \"two\" is not of type \"integer\""), "{error}");
        assert!(error.contains("/tags/0: 1 is not of type \"string\""), "{error}");
        assert!(error.contains("\"b\" is a required property"), "{error}");
        assert!(error.contains("'c' was unexpected"), "{error}");
    }

    #[test]
    fn a_broken_schema_does_not_compile() {
        assert!(ArgsValidator::compile(&json!({"type": "no-such-type"})).is_err());
    }
}
