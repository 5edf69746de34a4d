//! Support for the code `#[tool]` generates. Not a public API: it may change in any release.

pub use schemars;
pub use serde;
pub use serde_json;

use std::future::{Future, ready};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ToolError;
use crate::tool::{Tool, encode_result, run_blocking, stream};
use crate::worker::context::ToolContext;

/// Checks one argument on its own, to name the field when the arguments as a whole do not decode.
#[derive(Debug, Clone, Copy)]
pub struct FieldCheck {
    /// The argument's name.
    pub name: &'static str,
    /// Tries to decode the argument (`None` when absent) as its declared type.
    pub check: fn(Option<&Value>) -> Result<(), String>,
}

/// Decodes one argument as `T`; an absent argument decodes as `null`, which only `Option`
/// (and `Value`) accept.
pub fn check_field<T: DeserializeOwned>(value: Option<&Value>) -> Result<(), String> {
    match value {
        Some(value) => T::deserialize(value).map(drop).map_err(|error| error.to_string()),
        None => T::deserialize(&Value::Null)
            .map(drop)
            .map_err(|_| "missing field".to_owned()),
    }
}

/// The input schema of an arguments struct: an object schema without `$schema` and `title`,
/// with `properties` even when there are none (some model APIs insist on it).
pub fn input_schema<A: schemars::JsonSchema>() -> Value {
    let mut schema = schemars::SchemaGenerator::default()
        .into_root_schema_for::<A>()
        .to_value();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        object
            .entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
    }
    schema
}

/// Decodes a tool's arguments, naming the offending field when it can.
pub fn decode_args<A: DeserializeOwned>(tool: &str, args: &Value, fields: &[FieldCheck]) -> Result<A, ToolError> {
    let invalid = |detail: String| ToolError::fatal(format!("invalid arguments for tool '{tool}': {detail}"));
    // Serde would also read a struct from an array, by position; the arguments are an object.
    let Value::Object(object) = args else {
        return Err(invalid(format!("expected a JSON object, got {}", json_type(args))));
    };
    A::deserialize(args).map_err(|error| {
        let field = fields.iter().find_map(|field| {
            let detail = (field.check)(object.get(field.name)).err()?;
            Some(format!("field `{}`: {detail}", field.name))
        });
        invalid(field.unwrap_or_else(|| error.to_string()))
    })
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A tool from an async function over a typed arguments struct.
pub fn async_tool<A, F, Fut, T, E>(
    name: &'static str,
    description: &'static str,
    fields: &'static [FieldCheck],
    f: F,
) -> Tool
where
    A: DeserializeOwned + schemars::JsonSchema + Send + 'static,
    F: Fn(ToolContext, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize,
    E: Into<ToolError>,
{
    Tool::new(name, description, input_schema::<A>(), move |ctx, args| {
        let tool = ctx.tool_name().to_owned();
        match decode_args::<A>(&tool, &args, fields) {
            Ok(args) => {
                let future = f(ctx, args);
                Box::pin(async move { encode_result(&tool, future.await) })
            }
            Err(error) => Box::pin(ready(Err(error))),
        }
    })
}

/// A tool from a synchronous function over a typed arguments struct, run on a blocking thread.
pub fn blocking_tool<A, F, T, E>(
    name: &'static str,
    description: &'static str,
    fields: &'static [FieldCheck],
    f: F,
) -> Tool
where
    A: DeserializeOwned + schemars::JsonSchema + Send + 'static,
    F: Fn(ToolContext, A) -> Result<T, E> + Send + Sync + 'static,
    T: Serialize + Send + 'static,
    E: Into<ToolError> + Send + 'static,
{
    let f = std::sync::Arc::new(f);
    Tool::new(name, description, input_schema::<A>(), move |ctx, args| {
        let tool = ctx.tool_name().to_owned();
        match decode_args::<A>(&tool, &args, fields) {
            Ok(args) => {
                let f = std::sync::Arc::clone(&f);
                Box::pin(run_blocking(tool, move || f(ctx, args)))
            }
            Err(error) => Box::pin(ready(Err(error))),
        }
    })
    .blocking(true)
}

/// A tool from a function over a typed arguments struct that returns a stream: each item but the
/// last is progress, the last the result.
pub fn stream_tool<A, F, S, T, E>(
    name: &'static str,
    description: &'static str,
    fields: &'static [FieldCheck],
    f: F,
) -> Tool
where
    A: DeserializeOwned + schemars::JsonSchema + Send + 'static,
    F: Fn(ToolContext, A) -> S + Send + Sync + 'static,
    S: futures_util::Stream<Item = Result<T, E>> + Send + 'static,
    T: Serialize,
    E: Into<ToolError>,
{
    Tool::new(name, description, input_schema::<A>(), move |ctx, args| {
        let tool = ctx.tool_name().to_owned();
        match decode_args::<A>(&tool, &args, fields) {
            Ok(args) => {
                let items = f(ctx.clone(), args);
                Box::pin(async move { stream::drain(&tool, &ctx, items).await })
            }
            Err(error) => Box::pin(ready(Err(error))),
        }
    })
}
