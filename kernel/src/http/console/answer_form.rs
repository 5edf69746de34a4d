//! The form a question's answer is given with, made from the answer's JSON Schema: one choice
//! among the schema's `enum` (a question's choices), yes or no for a boolean, a field for a string
//! or a number, and one of those for each property of an object of them. A schema beyond these
//! (nested objects, arrays, alternatives) is answered as JSON text. What the form sends is put
//! back together as the JSON the schema describes; the kernel checks it against the schema as it
//! checks any answer.

use maud::{Markup, html};
use serde_json::{Map, Value};

/// The fields a form of `schema` asks for; `None` when the schema is answered as JSON text.
pub fn of(schema: &Value) -> Option<Shape> {
    match field(schema)? {
        Field::Object(fields) => Some(Shape::Object(fields)),
        one => Some(Shape::One(one)),
    }
}

/// What a form asks for: one value, or an object's properties.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    One(Field),
    Object(Vec<Property>),
}

/// One property of an object answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Property {
    pub name: String,
    pub field: Field,
    pub required: bool,
}

/// One value a form asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    /// One of these values (strings, numbers, booleans), shown as their JSON text.
    Choice(Vec<Value>),
    Boolean,
    Text,
    Integer,
    Number,
    Object(Vec<Property>),
}

/// The prefix of an object property's form field: `field:<name>`.
const PROPERTY: &str = "field:";
/// The form field of a one-value answer.
const ONE: &str = "field";

fn field(schema: &Value) -> Option<Field> {
    // A question's choices narrow its schema: `allOf: [schema, {enum}]`, answered as the choice.
    if let Some(all) = schema.get("allOf").and_then(Value::as_array)
        && let Some(choices) = all.iter().find_map(|part| part.get("enum"))
    {
        return choice(choices);
    }
    if let Some(choices) = schema.get("enum") {
        return choice(choices);
    }
    match schema.get("type")?.as_str()? {
        "boolean" => Some(Field::Boolean),
        "string" => Some(Field::Text),
        "integer" => Some(Field::Integer),
        "number" => Some(Field::Number),
        "object" => object(schema),
        _ => None,
    }
}

fn choice(values: &Value) -> Option<Field> {
    let values = values.as_array()?;
    let scalar = |v: &Value| v.is_string() || v.is_number() || v.is_boolean();
    (!values.is_empty() && values.iter().all(scalar)).then(|| Field::Choice(values.clone()))
}

fn object(schema: &Value) -> Option<Field> {
    let properties = schema.get("properties")?.as_object()?;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields = Vec::with_capacity(properties.len());
    for (name, property) in properties {
        let field = field(property)?;
        if matches!(field, Field::Object(_)) {
            return None;
        }
        fields.push(Property {
            name: name.clone(),
            field,
            required: required.contains(&name.as_str()),
        });
    }
    Some(Field::Object(fields))
}

/// The form's inputs.
pub fn render(shape: &Shape) -> Markup {
    match shape {
        Shape::One(field) => input(ONE, "Answer", field, true),
        Shape::Object(properties) => html! {
            @for property in properties {
                (input(&format!("{PROPERTY}{}", property.name), &property.name, &property.field, property.required))
            }
        },
    }
}

/// The browser does not hold a required field back: the same form may answer as JSON instead,
/// and the kernel names what a missing field leaves out.
fn input(name: &str, label: &str, field: &Field, required: bool) -> Markup {
    html! {
        @match field {
            Field::Choice(values) => fieldset.choices {
                legend { (label) @if required { " (required)" } }
                @for value in values {
                    @let text = value.to_string();
                    label { input type="radio" name=(name) value=(text); " " (shown(value)) }
                }
            },
            Field::Boolean => fieldset.choices {
                legend { (label) @if required { " (required)" } }
                label { input type="radio" name=(name) value="true"; " yes" }
                label { input type="radio" name=(name) value="false"; " no" }
            },
            Field::Text => label { (label) @if required { " (required)" } " " input type="text" name=(name); },
            Field::Integer => label { (label) @if required { " (required)" } " " input type="number" step="1" name=(name); },
            Field::Number => label { (label) @if required { " (required)" } " " input type="number" step="any" name=(name); },
            Field::Object(_) => {},
        }
    }
}

/// A choice as a person reads it: a string without its quotes.
fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The answer the form's fields `sent` make, as JSON text; `Err` names the field that is wrong.
pub fn answer(shape: &Shape, sent: &[(String, String)]) -> Result<String, String> {
    let given = |name: &str| {
        sent.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let value = match shape {
        Shape::One(field) => value(ONE, field, given(ONE))?.unwrap_or(Value::Null),
        Shape::Object(properties) => {
            let mut object = Map::new();
            for property in properties {
                let name = format!("{PROPERTY}{}", property.name);
                if let Some(value) = value(&name, &property.field, given(&name))? {
                    object.insert(property.name.clone(), value);
                }
            }
            Value::Object(object)
        }
    };
    Ok(kernel_proto::canonical::to_canonical(&value))
}

/// The value of field `name` as `field` reads it; `None` when left empty.
fn value(name: &str, field: &Field, text: Option<&str>) -> Result<Option<Value>, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let value = match field {
        Field::Choice(_) | Field::Boolean => {
            serde_json::from_str(text).map_err(|_| format!("{name}: '{text}' is not one of the choices"))?
        }
        Field::Text => Value::String(text.to_owned()),
        Field::Integer => Value::from(
            text.parse::<i64>()
                .map_err(|_| format!("{name}: '{text}' is not a whole number"))?,
        ),
        Field::Number => {
            let number: f64 = text.parse().map_err(|_| format!("{name}: '{text}' is not a number"))?;
            serde_json::Number::from_f64(number)
                .map(Value::Number)
                .ok_or_else(|| format!("{name}: '{text}' is not a number"))?
        }
        Field::Object(_) => return Ok(None),
    };
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sent(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn choices_are_one_pick_and_come_back_as_the_value_picked() {
        let shape = of(&json!({"allOf": [{}, {"enum": ["refund", "replace"]}]})).unwrap();
        assert_eq!(
            shape,
            Shape::One(Field::Choice(vec![json!("refund"), json!("replace")]))
        );
        let page = render(&shape).into_string();
        assert!(
            page.contains(r#"type="radio" name="field" value="&quot;refund&quot;""#),
            "{page}"
        );
        assert_eq!(
            answer(&shape, &sent(&[("field", r#""replace""#)])).unwrap(),
            r#""replace""#
        );
        assert!(
            answer(&shape, &sent(&[("field", "replace")])).is_err(),
            "not JSON of a choice"
        );
    }

    #[test]
    fn an_object_of_scalars_is_a_field_each_and_comes_back_typed() {
        let schema = json!({
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "note": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["ok"],
        });
        let Some(Shape::Object(properties)) = of(&schema) else {
            panic!("an object form");
        };
        assert_eq!(properties.len(), 3);
        assert!(properties.iter().any(|p| p.name == "ok" && p.required));
        let shape = Shape::Object(properties);
        let given = sent(&[("field:ok", "true"), ("field:note", " go "), ("field:count", "")]);
        assert_eq!(answer(&shape, &given).unwrap(), r#"{"note":"go","ok":true}"#);
        let wrong = answer(&shape, &sent(&[("field:count", "two")])).unwrap_err();
        assert_eq!(wrong, "field:count: 'two' is not a whole number");
    }

    #[test]
    fn a_schema_a_form_cannot_hold_is_answered_as_json() {
        for schema in [
            json!({}),
            json!({"type": "array", "items": {"type": "string"}}),
            json!({"type": "object", "properties": {"inner": {"type": "object", "properties": {}}}}),
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
            json!({"enum": [{"nested": true}]}),
        ] {
            assert_eq!(of(&schema), None, "{schema}");
        }
    }
}
