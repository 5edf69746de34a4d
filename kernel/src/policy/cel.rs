//! CEL expressions: a rule's `when` condition over the call, and a tool's own
//! `requires_approval` predicate over its arguments.
//!
//! Both are compiled once (at policy load or tool registration) and checked for variables they
//! could never see, so a typo such as `arg.cents` is refused up front instead of failing every
//! call. Arguments reach CEL as JSON does: objects as maps, integers as `int` (or `uint` above
//! `i64`), other numbers as `double`. A missing key is an evaluation error, not false; test
//! with `has(args.x)` or `'env' in run.labels` where a key may be absent.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::objects::{Key, Map};
use cel::{Context, Env, Program, Value as CelValue};
use serde_json::Value;

use super::CallFacts;

/// The standard CEL environment, built once.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// Identifiers that name types rather than variables, e.g. in `type(args.x) == int`.
const TYPE_NAMES: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "duration",
    "dyn",
    "int",
    "list",
    "map",
    "null_type",
    "optional",
    "string",
    "timestamp",
    "type",
    "uint",
];

/// The variables a rule's `when` sees.
const CONDITION_VARIABLES: &[&str] = &["tool", "args", "run", "resources"];

/// The variables a tool's approval predicate sees.
const PREDICATE_VARIABLES: &[&str] = &["args"];

/// A tool's `requires_approval` predicate over its arguments, such as `args.cents > 10000`.
#[derive(Clone, Debug)]
pub struct Predicate {
    expr: Compiled,
}

/// Compiles a tool's approval predicate; the error says why it does not compile (syntax, an
/// empty expression, or a variable other than `args`). Call it when the tool registers, and
/// refuse the registration on error.
pub fn compile_predicate(expr: &str) -> Result<Predicate, String> {
    Ok(Predicate {
        expr: Compiled::new(expr, PREDICATE_VARIABLES)?,
    })
}

impl Predicate {
    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.expr.source
    }

    /// Evaluates the predicate over one call's arguments. An error (a missing field, a type
    /// mismatch, a result that is not a bool) means the caller must ask for approval: fail
    /// closed.
    pub fn eval(&self, args: &Value) -> Result<bool, String> {
        let mut context = Context::with_env(Arc::clone(&ENV));
        context.add_variable_from_value("args", json_to_cel(args));
        self.expr.eval(&context)
    }
}

/// A rule's `when` condition over `tool`, `args`, `run.agent` and `run.labels`.
#[derive(Clone, Debug)]
pub(crate) struct Condition {
    expr: Compiled,
}

impl Condition {
    pub(crate) fn compile(source: &str) -> Result<Self, String> {
        Ok(Condition {
            expr: Compiled::new(source, CONDITION_VARIABLES)?,
        })
    }

    pub(crate) fn eval(&self, context: &Context<'_, '_>) -> Result<bool, String> {
        self.expr.eval(context)
    }
}

/// The variables of one call as CEL sees them; built once per decision and shared by every
/// rule's condition.
pub(crate) fn call_context(call: &CallFacts<'_>) -> Context<'static, 'static> {
    let mut context = Context::with_env(Arc::clone(&ENV));
    let labels: HashMap<Key, CelValue> = call
        .run_labels
        .iter()
        .map(|(k, v)| (key(k), CelValue::from(v.as_str())))
        .collect();
    let run: HashMap<Key, CelValue> = [
        (key("agent"), CelValue::from(call.run_agent)),
        (key("labels"), map(labels)),
    ]
    .into_iter()
    .collect();
    context.add_variable_from_value("tool", CelValue::from(call.tool));
    context.add_variable_from_value("args", json_to_cel(call.args));
    context.add_variable_from_value("run", map(run));
    let resources: Vec<CelValue> = call.resources.iter().map(|r| CelValue::from(r.as_str())).collect();
    context.add_variable_from_value("resources", CelValue::List(resources.into()));
    context
}

#[derive(Clone)]
struct Compiled {
    source: Arc<str>,
    program: Arc<Program>,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The source says everything; the compiled syntax tree would only bury it.
        fmt::Debug::fmt(&self.source, f)
    }
}

impl Compiled {
    fn new(source: &str, variables: &[&str]) -> Result<Self, String> {
        if source.trim().is_empty() {
            return Err("empty expression: it would never match; remove it or write a condition".to_owned());
        }
        let program = ENV.compile(source).map_err(|errors| match errors.errors.first() {
            Some(e) => {
                let (line, column) = e.pos;
                if source.contains('\n') {
                    format!(
                        "CEL does not compile: {} (expression line {line}, column {column})",
                        e.msg
                    )
                } else {
                    format!("CEL does not compile: {} (at column {column})", e.msg)
                }
            }
            None => format!("CEL does not compile: {errors}"),
        })?;
        if let Expr::Literal(literal) = &program.expression().expr
            && !matches!(literal, LiteralValue::Boolean(_))
        {
            return Err(
                "the expression is a constant that is not a bool; write a condition such as args.x > 1".to_owned(),
            );
        }
        let mut free = Vec::new();
        free_variables(program.expression(), &mut Vec::new(), &mut free);
        if let Some(unknown) = free
            .into_iter()
            .find(|name| !variables.contains(name) && !TYPE_NAMES.contains(name))
        {
            return Err(format!(
                "CEL refers to unknown variable '{unknown}' (available: {})",
                variables.join(", ")
            ));
        }
        Ok(Compiled {
            source: source.into(),
            program: Arc::new(program),
        })
    }

    fn eval(&self, context: &Context<'_, '_>) -> Result<bool, String> {
        match self.program.execute(context) {
            Ok(CelValue::Bool(value)) => Ok(value),
            Ok(other) => Err(format!("evaluated to a {} instead of a bool", other.type_of())),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Collects identifiers not bound by an enclosing comprehension (`x` in `l.exists(x, ...)`).
fn free_variables<'e>(expr: &'e IdedExpr, bound: &mut Vec<&'e str>, out: &mut Vec<&'e str>) {
    match &expr.expr {
        Expr::Unspecified | Expr::Literal(_) => {}
        Expr::Ident(name) => {
            // `@`-prefixed names are the accumulators macros introduce.
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                out.push(name);
            }
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                free_variables(target, bound, out);
            }
            for arg in &call.args {
                free_variables(arg, bound, out);
            }
        }
        Expr::Select(select) => free_variables(&select.operand, bound, out),
        Expr::List(list) => {
            for element in &list.elements {
                free_variables(element, bound, out);
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                entry_variables(&entry.expr, bound, out);
            }
        }
        Expr::Struct(structure) => {
            for entry in &structure.entries {
                entry_variables(&entry.expr, bound, out);
            }
        }
        Expr::Comprehension(comprehension) => {
            free_variables(&comprehension.iter_range, bound, out);
            free_variables(&comprehension.accu_init, bound, out);
            let depth = bound.len();
            bound.push(&comprehension.iter_var);
            if let Some(second) = &comprehension.iter_var2 {
                bound.push(second);
            }
            bound.push(&comprehension.accu_var);
            free_variables(&comprehension.loop_cond, bound, out);
            free_variables(&comprehension.loop_step, bound, out);
            free_variables(&comprehension.result, bound, out);
            bound.truncate(depth);
        }
    }
}

fn entry_variables<'e>(entry: &'e EntryExpr, bound: &mut Vec<&'e str>, out: &mut Vec<&'e str>) {
    match entry {
        EntryExpr::StructField(field) => free_variables(&field.value, bound, out),
        EntryExpr::MapEntry(pair) => {
            free_variables(&pair.key, bound, out);
            free_variables(&pair.value, bound, out);
        }
    }
}

fn key(text: &str) -> Key {
    Key::String(Arc::new(text.to_owned()))
}

fn map(entries: HashMap<Key, CelValue>) -> CelValue {
    CelValue::Map(Map { map: Arc::new(entries) })
}

/// JSON to CEL: integers stay integers so `args.cents > 10000` compares as `int`.
fn json_to_cel(value: &Value) -> CelValue {
    match value {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => CelValue::Int(i),
            (None, Some(u)) => CelValue::UInt(u),
            (None, None) => CelValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => CelValue::from(s.as_str()),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(json_to_cel).collect())),
        Value::Object(fields) => map(fields.iter().map(|(k, v)| (key(k), json_to_cel(v))).collect()),
    }
}
