//! A tool: the metadata the kernel and the model see, and a type-erased function that runs it.
//!
//! [`Tool`] is what a worker serves. Build one with the [`#[tool]`](crate::tool) attribute on an
//! ordinary function, or with [`wrap_tool`] / [`wrap_blocking_tool`] from a closure over JSON
//! arguments and a hand-written schema. The builder methods set the declared behaviour
//! ([`ToolOptions`]) that the kernel enforces: timeout, retries, idempotency, risk, approval.

mod finite;
pub(crate) mod stream;
pub(crate) mod wire;

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::error::ToolError;
use crate::worker::context::ToolContext;

pub use self::stream::wrap_stream_tool;

/// The future a tool's invoker returns: the result as JSON, or the error.
pub type ToolFuture = BoxFuture<'static, Result<Value, ToolError>>;

/// The type-erased function behind a [`Tool`].
pub type Invoker = Arc<dyn Fn(ToolContext, Value) -> ToolFuture + Send + Sync>;

/// Longest tool name the kernel accepts.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// What the kernel may do with a call whose worker was lost mid-call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Idempotency {
    /// Run it again with the same idempotency key (the default).
    #[default]
    SafeToRetry,
    /// Never run it twice: a started call whose worker is lost fails as indeterminate.
    AtMostOnce,
}

/// What a tool can break, for risk-based policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RiskLevel {
    /// Harmless.
    Low,
    /// Worth a look.
    Medium,
    /// Policies commonly ask a person first.
    High,
    /// Policies commonly refuse it outright.
    Critical,
}

/// Whether a tool changes the world, which decides what a branch of a recorded run may run live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Effect {
    /// Not declared; treated like a write when it matters.
    #[default]
    Unmarked,
    /// Free of side effects.
    ReadOnly,
    /// Has side effects.
    Writes,
}

/// When the kernel asks a person before the tool runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Approval {
    /// Only when the kernel's policy says so (the default).
    #[default]
    Never,
    /// Before every call.
    Always,
    /// When this CEL predicate over `args` is true, e.g. `args.cents > 10000`.
    When(String),
}

/// How often and how fast the kernel tries a failed call again. Fatal and poison errors are
/// never retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts including the first; 1 means no retry.
    pub max_attempts: u32,
    /// Wait before the first retry.
    pub initial_interval: Duration,
    /// Factor the wait grows by after each retry.
    pub backoff_coefficient: f64,
    /// Upper bound of the wait.
    pub max_interval: Duration,
}

impl RetryPolicy {
    /// `retries` retries after the first attempt, with no wait in between.
    pub fn retries(retries: u32) -> Self {
        Self {
            max_attempts: retries.saturating_add(1),
            initial_interval: Duration::ZERO,
            backoff_coefficient: 1.0,
            max_interval: Duration::ZERO,
        }
    }

    /// Up to `max_attempts` attempts, waiting `initial_interval` and doubling up to `max_interval`.
    pub fn exponential(max_attempts: u32, initial_interval: Duration, max_interval: Duration) -> Self {
        Self {
            max_attempts,
            initial_interval,
            backoff_coefficient: 2.0,
            max_interval,
        }
    }
}

/// A tool's declared behaviour and metadata; the kernel enforces it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOptions {
    /// Wall-clock cap per attempt; `None` means the kernel default (30 s).
    pub timeout: Option<Duration>,
    /// Retry policy; `None` means the kernel default.
    pub retry: Option<RetryPolicy>,
    /// What the kernel may do when the worker is lost mid-call.
    pub idempotency: Idempotency,
    /// Read-only, writes, or unmarked.
    pub effect: Effect,
    /// The team or person who answers for the tool.
    pub owner: Option<String>,
    /// What the tool can break.
    pub risk: Option<RiskLevel>,
    /// Grants the caller must hold, e.g. `billing:write`.
    pub permissions: Vec<String>,
    /// What the tool may change: a kind (`workspace`), or an instance (`repo:{repo}`, its
    /// `{name}`s filled from required arguments) that calls hold as a lock while they run.
    pub resources: Vec<String>,
    /// Secret fields, by name: top-level fields of the arguments, or of an object result, that
    /// the kernel never records, shows or exports in clear (see [`Tool::secret`]).
    pub secret: Vec<String>,
    /// Price of one call, for the run's cost account.
    pub cost_per_call: f64,
    /// Serve a recorded result for the same arguments for this long.
    pub cache_ttl: Option<Duration>,
    /// When to ask a person first.
    pub approval: Approval,
    /// How long an unanswered approval waits before it counts as rejected; `None` waits forever.
    pub approval_timeout: Option<Duration>,
    /// Runs on a blocking thread that cannot be interrupted.
    pub blocking: bool,
    /// The kernel drops null-valued optional arguments before validating, hashing and recording
    /// each call (Rebuno's null stripping).
    pub strip_nulls: bool,
    /// How fast and how many at once the tool's calls may start, counted by the kernel across
    /// every worker, run and replica; `None`: only the policy file's limits apply.
    pub limit: Option<ToolLimit>,
}

/// A tool's own rate and concurrency limit. The kernel holds it as it holds a policy file's limit
/// on the tool's name (named `tool:<name>`): calls past it wait in the kernel's queue, up to the
/// schedule-to-start timeout, rather than fail. It sets `per_second`, `at_once` or both.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ToolLimit {
    /// Calls that may start each second, on average (a token bucket refilled at this rate).
    pub per_second: Option<f64>,
    /// Calls that may start at once after a quiet spell (the bucket's size); needs `per_second`.
    /// `None`: one second's worth, at least 1.
    pub burst: Option<u32>,
    /// Calls that may run at once.
    pub at_once: Option<u32>,
}

/// A tool definition the kernel would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolDefinitionError {
    /// The name is empty, too long, or has characters outside `[a-zA-Z0-9_-]`.
    #[error("invalid tool name '{0}': use 1 to 64 characters from [a-zA-Z0-9_-]")]
    InvalidName(String),
    /// The input schema is not a JSON object.
    #[error("tool '{0}' has an input schema that is not a JSON object")]
    InvalidSchema(String),
    /// The approval predicate is empty.
    #[error("tool '{0}' has an empty requires_approval predicate")]
    EmptyApprovalPredicate(String),
    /// Two tools of one worker share a name.
    #[error("tool '{0}' is offered twice")]
    DuplicateName(String),
    /// A result cache on a tool that is not `read_only`.
    #[error(
        "tool '{0}' has a cache_ttl but is not read_only: only a tool without side effects may have its results \
         served again from the cache"
    )]
    CacheWithoutReadOnly(String),
}

/// Checks a tool name against `[a-zA-Z0-9_-]{1,64}`.
pub fn validate_tool_name(name: &str) -> Result<(), ToolDefinitionError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_TOOL_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(ToolDefinitionError::InvalidName(name.to_owned()))
    }
}

/// A tool a worker serves: its name, description, JSON Schema, version and options, plus the
/// function that runs it. Cloning it is cheap.
///
/// ```
/// use serde_json::json;
/// use std::time::Duration;
/// use worker_sdk::{wrap_tool, Idempotency, ToolContext, ToolError};
///
/// let tool = wrap_tool(
///     "shout",
///     "Upper-cases a text.",
///     json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
///     |_ctx: ToolContext, args: serde_json::Value| async move {
///         let text = args["text"].as_str().ok_or_else(|| ToolError::fatal("text must be a string"))?;
///         Ok::<_, ToolError>(text.to_uppercase())
///     },
/// )
/// .timeout(Duration::from_secs(5))
/// .idempotency(Idempotency::SafeToRetry)
/// .version("2");
/// assert_eq!(tool.spec().name, "shout");
/// assert_eq!(tool.spec().options.unwrap().timeout_ms, 5000);
/// ```
#[derive(Clone)]
pub struct Tool {
    definition: ToolDefinition,
    invoker: Invoker,
}

/// The metadata of a [`Tool`]: everything but the function.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// The name the model and the kernel use, `[a-zA-Z0-9_-]{1,64}`.
    pub name: String,
    /// What the model reads to decide when to call the tool.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Value,
    /// Version of the tool's contract; part of its fingerprint.
    pub version: String,
    /// Declared behaviour.
    pub options: ToolOptions,
}

/// Version of a tool that does not declare one.
pub const DEFAULT_TOOL_VERSION: &str = "1";

impl Tool {
    /// A tool from its metadata and a function over JSON arguments.
    pub fn new<F>(name: impl Into<String>, description: impl Into<String>, input_schema: Value, invoker: F) -> Self
    where
        F: Fn(ToolContext, Value) -> ToolFuture + Send + Sync + 'static,
    {
        Self {
            definition: ToolDefinition {
                name: name.into(),
                description: description.into(),
                input_schema,
                version: DEFAULT_TOOL_VERSION.to_owned(),
                options: ToolOptions::default(),
            },
            invoker: Arc::new(invoker),
        }
    }

    /// The tool's metadata.
    pub fn definition(&self) -> &ToolDefinition {
        &self.definition
    }

    /// The function behind the tool.
    pub fn invoker(&self) -> &Invoker {
        &self.invoker
    }

    /// What the worker announces to the kernel, with the fingerprint computed the way the
    /// kernel checks it.
    pub fn spec(&self) -> kernel_proto::v1::ToolSpec {
        crate::tool::wire::tool_spec(&self.definition)
    }

    /// The fingerprint: sha256 over the canonical JSON of name, description, input schema and
    /// version. A change to any of them is a new contract, and replaying a recorded call against it
    /// is a divergence.
    pub fn fingerprint(&self) -> String {
        let d = &self.definition;
        kernel_proto::canonical::tool_fingerprint(&d.name, &d.description, &d.input_schema, &d.version)
    }

    /// Checks what the kernel would refuse: the name and the shape of the schema.
    pub fn validate(&self) -> Result<(), ToolDefinitionError> {
        let d = &self.definition;
        validate_tool_name(&d.name)?;
        if !d.input_schema.is_object() {
            return Err(ToolDefinitionError::InvalidSchema(d.name.clone()));
        }
        if matches!(&d.options.approval, Approval::When(expr) if expr.trim().is_empty()) {
            return Err(ToolDefinitionError::EmptyApprovalPredicate(d.name.clone()));
        }
        if d.options.cache_ttl.is_some() && d.options.effect != Effect::ReadOnly {
            return Err(ToolDefinitionError::CacheWithoutReadOnly(d.name.clone()));
        }
        Ok(())
    }

    /// Runs the tool with JSON arguments. A panic in the tool becomes a fatal error naming it.
    pub fn call(&self, ctx: ToolContext, args: Value) -> ToolFuture {
        let name = self.definition.name.clone();
        let future = (self.invoker)(ctx.with_tool_name(&name), args);
        Box::pin(async move {
            match AssertUnwindSafe(future).catch_unwind().await {
                Ok(result) => result,
                Err(panic) => Err(panicked(&name, panic.as_ref())),
            }
        })
    }

    /// Sets the name the model and the kernel use.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.definition.name = name.into();
        self
    }

    /// Sets what the model reads to decide when to call the tool.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.definition.description = description.into();
        self
    }

    /// Replaces the JSON Schema of the arguments.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.definition.input_schema = schema;
        self
    }

    /// Sets the version of the tool's contract (default `"1"`).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.definition.version = version.into();
        self
    }

    /// Replaces all options at once.
    pub fn options(mut self, options: ToolOptions) -> Self {
        self.definition.options = options;
        self
    }

    /// Caps each attempt's wall-clock time.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.definition.options.timeout = Some(timeout);
        self
    }

    /// Retries a retryable failure `retries` times, with no wait in between.
    pub fn retry(self, retries: u32) -> Self {
        self.retry_policy(RetryPolicy::retries(retries))
    }

    /// Sets the full retry policy.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.definition.options.retry = Some(policy);
        self
    }

    /// Declares what the kernel may do when the worker is lost mid-call.
    pub fn idempotency(mut self, idempotency: Idempotency) -> Self {
        self.definition.options.idempotency = idempotency;
        self
    }

    /// Declares the tool free of side effects (replaces [`Tool::writes`]).
    pub fn read_only(mut self) -> Self {
        self.definition.options.effect = Effect::ReadOnly;
        self
    }

    /// Declares that the tool has side effects (replaces [`Tool::read_only`]).
    pub fn writes(mut self) -> Self {
        self.definition.options.effect = Effect::Writes;
        self
    }

    /// Names the team or person who answers for the tool.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.definition.options.owner = Some(owner.into());
        self
    }

    /// Rates what the tool can break.
    pub fn risk(mut self, risk: RiskLevel) -> Self {
        self.definition.options.risk = Some(risk);
        self
    }

    /// Grants a caller must hold.
    pub fn permissions<I, S>(mut self, permissions: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.definition.options.permissions = permissions.into_iter().map(Into::into).collect();
        self
    }

    /// What the tool may change. A bare kind (`workspace`) is for policy and audit; a
    /// `kind:instance` entry (`repo:{repo}`, each `{name}` a required argument) is a lock: calls
    /// on the same filled-in instance never run at once anywhere in the kernel.
    pub fn resources<I, S>(mut self, resources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.definition.options.resources = resources.into_iter().map(Into::into).collect();
        self
    }

    /// Secret fields, by name: a top-level field of the arguments, or of an object result, that
    /// the kernel never records, shows or exports in clear. It records a keyed hash in the
    /// value's place (so a resubmitted call is still replayed, or refused when it changed) and
    /// hands an argument's value to the tool only in the dispatch; a result's reaches nobody (the
    /// model reads the hash). A field whose JSON Schema says `writeOnly: true` or
    /// `format: password` is secret without being named (`#[schemars(extend("writeOnly" =
    /// true))]` on a field of the arguments' type).
    pub fn secret<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.definition.options.secret = fields.into_iter().map(Into::into).collect();
        self
    }

    /// Price of one call.
    pub fn cost_per_call(mut self, cost: f64) -> Self {
        self.definition.options.cost_per_call = cost;
        self
    }

    /// Serves a recorded result for the same arguments for `ttl`.
    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.definition.options.cache_ttl = Some(ttl);
        self
    }

    /// Asks a person before every call (`true`), or only when policy says so (`false`).
    pub fn requires_approval(mut self, required: bool) -> Self {
        self.definition.options.approval = if required { Approval::Always } else { Approval::Never };
        self
    }

    /// Asks a person when the CEL predicate over `args` holds, e.g. `args.cents > 10000`.
    pub fn requires_approval_if(mut self, predicate: impl Into<String>) -> Self {
        self.definition.options.approval = Approval::When(predicate.into());
        self
    }

    /// How long an unanswered approval waits before it counts as rejected.
    pub fn approval_timeout(mut self, timeout: Duration) -> Self {
        self.definition.options.approval_timeout = Some(timeout);
        self
    }

    /// Has the kernel drop null-valued optional arguments before it validates, hashes and records
    /// each call: models fill optional fields with null, and typed parameters reject it. The
    /// record, the replay identity and the tool then all see the same arguments.
    pub fn strip_nulls(mut self) -> Self {
        self.definition.options.strip_nulls = true;
        self
    }

    /// Maps what the tool's function returns before it is sent to the kernel and recorded
    /// (Rebuno's `to_result`): the record, a replay and the model all see the mapped value. An
    /// error from `map` fails the call with it; the function's own errors pass by unmapped.
    ///
    /// Arguments have no worker-side counterpart: a worker sees a call only after the kernel has
    /// recorded its arguments, so a transform there would make the record and the tool disagree.
    /// Null stripping is the kernel's ([`Tool::strip_nulls`]); any other transform belongs in the
    /// agent, before it submits the call.
    ///
    /// ```
    /// use serde_json::{json, Value};
    /// use worker_sdk::{wrap_tool, ToolContext, ToolError};
    ///
    /// let search = wrap_tool("search", "Searches.", json!({"type": "object"}), |_ctx: ToolContext, _args: Value| async {
    ///     Ok::<_, ToolError>(json!({"hits": [{"title": "a"}, {"title": "b"}], "took_ms": 12}))
    /// })
    /// .to_result(|raw| Ok(raw["hits"].clone()));
    /// # let hits = tokio::runtime::Runtime::new().unwrap().block_on(search.call(ToolContext::for_test(), json!({})));
    /// # assert_eq!(hits.unwrap(), json!([{"title": "a"}, {"title": "b"}]));
    /// ```
    pub fn to_result<F>(mut self, map: F) -> Self
    where
        F: Fn(Value) -> Result<Value, ToolError> + Send + Sync + 'static,
    {
        let inner = Arc::clone(&self.invoker);
        let map = Arc::new(map);
        self.invoker = Arc::new(move |ctx, args| {
            let future = inner(ctx, args);
            let map = Arc::clone(&map);
            Box::pin(async move { map(future.await?) })
        });
        self
    }

    /// Declares that the tool runs on a blocking thread that cannot be interrupted.
    pub fn blocking(mut self, blocking: bool) -> Self {
        self.definition.options.blocking = blocking;
        self
    }

    /// At most `rate` calls of the tool start each second, on average, across every worker, run
    /// and kernel replica; calls past it wait in the kernel's queue ([`ToolLimit::per_second`]).
    pub fn per_second(mut self, rate: f64) -> Self {
        self.definition.options.limit.get_or_insert_default().per_second = Some(rate);
        self
    }

    /// At most `burst` calls start at once after a quiet spell; with [`Tool::per_second`].
    pub fn burst(mut self, burst: u32) -> Self {
        self.definition.options.limit.get_or_insert_default().burst = Some(burst);
        self
    }

    /// At most `calls` calls of the tool run at once, across every worker, run and kernel replica;
    /// calls past it wait in the kernel's queue ([`ToolLimit::at_once`]).
    pub fn at_once(mut self, calls: u32) -> Self {
        self.definition.options.limit.get_or_insert_default().at_once = Some(calls);
        self
    }
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("definition", &self.definition)
            .finish_non_exhaustive()
    }
}

/// Wraps an async closure over JSON arguments as a tool.
///
/// The closure's `Ok` value is converted with `serde_json::to_value`; a value that cannot be
/// converted fails the call with a fatal error naming the tool.
pub fn wrap_tool<F, Fut, T>(name: impl Into<String>, description: impl Into<String>, input_schema: Value, f: F) -> Tool
where
    F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, ToolError>> + Send + 'static,
    T: Serialize,
{
    Tool::new(name, description, input_schema, move |ctx, args| {
        let tool = ctx.tool_name().to_owned();
        let future = f(ctx, args);
        Box::pin(async move { encode_result(&tool, future.await) })
    })
}

/// Wraps a synchronous closure over JSON arguments as a tool that runs on a blocking thread
/// (`tokio::task::spawn_blocking`), so it never stalls the runtime. The tool is marked
/// `blocking`: its thread cannot be stopped, so a late result is discarded, not interrupted.
pub fn wrap_blocking_tool<F, T>(
    name: impl Into<String>,
    description: impl Into<String>,
    input_schema: Value,
    f: F,
) -> Tool
where
    F: Fn(ToolContext, Value) -> Result<T, ToolError> + Send + Sync + 'static,
    T: Serialize + Send + 'static,
{
    let f = Arc::new(f);
    Tool::new(name, description, input_schema, move |ctx, args| {
        let f = Arc::clone(&f);
        let tool = ctx.tool_name().to_owned();
        Box::pin(run_blocking(tool, move || f(ctx, args)))
    })
    .blocking(true)
}

/// Runs a synchronous tool body on a blocking thread and encodes its result.
pub(crate) async fn run_blocking<T, E>(
    tool: String,
    body: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<Value, ToolError>
where
    T: Serialize + Send + 'static,
    E: Into<ToolError> + Send + 'static,
{
    match tokio::task::spawn_blocking(body).await {
        Ok(result) => encode_result(&tool, result),
        Err(join) if join.is_panic() => Err(panicked(&tool, join.into_panic().as_ref())),
        Err(_) => Err(ToolError::retryable(format!(
            "tool '{tool}' was stopped before it finished"
        ))),
    }
}

/// Converts a tool's return value to JSON, or fails naming the tool.
pub(crate) fn encode_result<T: Serialize, E: Into<ToolError>>(
    tool: &str,
    result: Result<T, E>,
) -> Result<Value, ToolError> {
    let value = result.map_err(Into::into)?;
    let json = serde_json::to_value(&value).map_err(|error| {
        ToolError::fatal(format!(
            "tool '{tool}' returned a result that cannot be serialized as JSON: {error}"
        ))
    })?;
    // serde_json writes NaN and the infinities as null: only a result with a null can hold one.
    if holds_null(&json) && finite::has_non_finite(&value) {
        return Err(ToolError::fatal(format!(
            "tool '{tool}' returned a result that cannot be serialized as JSON: a float that is not finite (NaN or \
             an infinity)"
        )));
    }
    Ok(json)
}

fn holds_null(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.iter().any(holds_null),
        Value::Object(fields) => fields.values().any(holds_null),
        _ => false,
    }
}

fn panicked(tool: &str, payload: &(dyn std::any::Any + Send)) -> ToolError {
    let detail = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message");
    ToolError::fatal(format!("tool '{tool}' panicked: {detail}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::ErrorKind;

    fn echo() -> Tool {
        wrap_tool(
            "echo",
            "Returns its input.",
            json!({"type": "object"}),
            |_ctx, args| async move { Ok::<_, ToolError>(args) },
        )
    }

    #[test]
    fn a_result_with_a_float_that_is_not_finite_is_an_error_naming_the_tool() {
        let error = encode_result("ratio", Ok::<_, ToolError>(vec![1.0, f64::NAN])).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Fatal);
        assert_eq!(
            error.message(),
            "tool 'ratio' returned a result that cannot be serialized as JSON: a float that is not finite (NaN or an \
             infinity)"
        );
        let infinite = encode_result("ratio", Ok::<_, ToolError>(Some(f32::INFINITY)));
        assert!(infinite.is_err());
        assert_eq!(
            encode_result("ratio", Ok::<_, ToolError>((Option::<f64>::None, 0.5))).unwrap(),
            json!([null, 0.5]),
            "a null of the result's own passes"
        );
    }

    #[test]
    fn names_follow_the_kernel_rule() {
        for good in ["a", "add", "read_file", "x-1", &"a".repeat(64)] {
            assert!(validate_tool_name(good).is_ok(), "{good}");
        }
        for bad in ["", "has space", "dot.name", "ünï", &"a".repeat(65)] {
            assert!(validate_tool_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validate_rejects_a_non_object_schema_and_an_empty_predicate() {
        assert!(echo().validate().is_ok());
        assert_eq!(
            echo().input_schema(json!(true)).validate(),
            Err(ToolDefinitionError::InvalidSchema("echo".into()))
        );
        assert!(echo().requires_approval_if(" ").validate().is_err());
        assert_eq!(
            echo().cache_ttl(Duration::from_secs(60)).validate(),
            Err(ToolDefinitionError::CacheWithoutReadOnly("echo".into()))
        );
        assert!(echo().read_only().cache_ttl(Duration::from_secs(60)).validate().is_ok());
        assert!(echo().name("bad name").validate().is_err());
    }

    #[test]
    fn fingerprint_follows_name_description_schema_and_version_only() {
        let base = echo().fingerprint();
        assert_eq!(echo().owner("team").risk(RiskLevel::High).fingerprint(), base);
        assert_ne!(echo().version("2").fingerprint(), base);
        assert_ne!(echo().description("Other.").fingerprint(), base);
        assert_eq!(echo().spec().fingerprint, base);
    }

    #[test]
    fn read_only_and_writes_replace_each_other() {
        assert_eq!(echo().read_only().writes().definition().options.effect, Effect::Writes);
        assert_eq!(
            echo().writes().read_only().definition().options.effect,
            Effect::ReadOnly
        );
    }

    #[tokio::test]
    async fn unserializable_results_fail_naming_the_tool() {
        let tool = wrap_tool(
            "bad",
            "Returns a map with non-string keys.",
            json!({"type": "object"}),
            |_ctx, _args| async {
                let mut map = BTreeMap::new();
                map.insert((1, 2), "x");
                Ok::<_, ToolError>(map)
            },
        );
        let error = tool.call(ToolContext::for_test(), json!({})).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Fatal);
        assert!(
            error
                .message()
                .starts_with("tool 'bad' returned a result that cannot be serialized as JSON: "),
            "{error}"
        );
    }

    #[tokio::test]
    async fn blocking_tools_run_off_the_runtime_and_report_panics() {
        let tool = wrap_blocking_tool("sum", "Adds.", json!({"type": "object"}), |_ctx, args| {
            let a = args["a"].as_i64().ok_or("a must be an integer")?;
            if a < 0 {
                panic!("negative");
            }
            Ok(a + 1)
        });
        assert!(tool.definition().options.blocking);
        assert_eq!(
            tool.call(ToolContext::for_test(), json!({"a": 1})).await.unwrap(),
            json!(2)
        );
        let error = tool.call(ToolContext::for_test(), json!({"a": "x"})).await.unwrap_err();
        assert_eq!(
            (error.kind(), error.message()),
            (ErrorKind::Retryable, "a must be an integer")
        );
        let error = tool.call(ToolContext::for_test(), json!({"a": -1})).await.unwrap_err();
        assert_eq!(error.message(), "tool 'sum' panicked: negative");
    }

    #[tokio::test]
    async fn async_panics_become_fatal_errors() {
        let tool = wrap_tool("boom", "Panics.", json!({"type": "object"}), |_ctx, _args| async {
            if true {
                panic!("kaboom");
            }
            Ok::<(), ToolError>(())
        });
        let error = tool.call(ToolContext::for_test(), json!({})).await.unwrap_err();
        assert_eq!(
            (error.kind(), error.message()),
            (ErrorKind::Fatal, "tool 'boom' panicked: kaboom")
        );
    }
}
