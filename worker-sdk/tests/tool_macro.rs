//! `#[tool]` end to end: the spec it announces and the calls it decodes.

use std::time::Duration;

use serde_json::{Value, json};
use worker_sdk::{Approval, Effect, ErrorKind, Idempotency, RetryPolicy, RiskLevel, ToolContext, ToolError, tool};

/// Issue a refund to a customer.
/// Amounts are in cents.
///
/// This paragraph is for people, not the model.
#[tool(
    version = "3",
    owner = "payments-team",
    risk = "high",
    permissions = ["billing:write"],
    resources = ["ledger", "email"],
    secret = ["reason"],
    timeout = 10,
    retry = 2,
    idempotency = "at_most_once",
    writes,
    cost_per_call = 0.0025,
    requires_approval = "args.cents > 10000",
    approval_timeout = 3600
)]
async fn refund(
    ctx: ToolContext,
    /// The customer to refund.
    customer_id: String,
    /// Amount in cents.
    cents: i64,
    reason: Option<String>,
) -> Result<String, ToolError> {
    if cents <= 0 {
        return Err(ToolError::fatal("cents must be positive"));
    }
    Ok(format!(
        "refunded {cents} to {customer_id} ({}) key={}",
        reason.unwrap_or_default(),
        ctx.idempotency_key()
    ))
}

/// Adds two integers.
#[tool]
async fn add(_ctx: ToolContext, a: i64, b: i64) -> Result<i64, ToolError> {
    Ok(a + b)
}

/// Counts words on a blocking thread.
#[tool(name = "word-count", read_only, cache_ttl = 1.5)]
fn word_count(text: String) -> Result<usize, ToolError> {
    Ok(text.split_whitespace().count())
}

#[derive(serde::Serialize)]
struct NotJson(std::collections::BTreeMap<(u8, u8), u8>);

/// Returns something JSON cannot hold.
#[tool(description = "Explicit description.", requires_approval = true)]
async fn broken(_ctx: &ToolContext) -> Result<NotJson, ToolError> {
    Ok(NotJson([((1, 2), 3)].into_iter().collect()))
}

/// Takes an optional value and a nested structure.
#[tool]
pub(crate) async fn nested(
    _ctx: ToolContext,
    items: Vec<Item>,
    #[serde(default)] limit: u32,
) -> Result<Value, ToolError> {
    Ok(json!({"count": items.len(), "limit": limit}))
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Item {
    #[allow(dead_code)]
    id: u64,
}

fn property<'a>(schema: &'a Value, name: &str) -> &'a Value {
    &schema["properties"][name]
}

#[test]
fn spec_carries_name_description_schema_and_options() {
    let tool = refund_tool();
    let def = tool.definition();
    assert_eq!(def.name, "refund");
    assert_eq!(def.description, "Issue a refund to a customer. Amounts are in cents.");
    assert_eq!(def.version, "3");

    let schema = &def.input_schema;
    assert_eq!(schema["type"], "object");
    assert!(
        schema.get("$schema").is_none() && schema.get("title").is_none(),
        "{schema}"
    );
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(
        property(schema, "customer_id")["description"],
        "The customer to refund."
    );
    assert_eq!(property(schema, "cents")["type"], "integer");
    assert_eq!(property(schema, "cents")["description"], "Amount in cents.");
    assert!(property(schema, "reason").is_object());
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, ["customer_id", "cents"]);

    let options = &def.options;
    assert_eq!(options.timeout, Some(Duration::from_secs(10)));
    assert_eq!(options.retry, Some(RetryPolicy::retries(2)));
    assert_eq!(options.idempotency, Idempotency::AtMostOnce);
    assert_eq!(options.effect, Effect::Writes);
    assert_eq!(options.owner.as_deref(), Some("payments-team"));
    assert_eq!(options.risk, Some(RiskLevel::High));
    assert_eq!(options.permissions, ["billing:write"]);
    assert_eq!(options.resources, ["ledger", "email"]);
    assert_eq!(options.secret, ["reason"]);
    assert_eq!(options.cost_per_call, 0.0025);
    assert_eq!(options.cache_ttl, None, "a cache needs read_only");
    assert_eq!(options.approval, Approval::When("args.cents > 10000".into()));
    assert_eq!(options.approval_timeout, Some(Duration::from_secs(3600)));
    assert!(!options.blocking);

    let spec = tool.spec();
    assert_eq!(spec.name, "refund");
    assert_eq!(spec.version, "3");
    assert_eq!(serde_json::from_str::<Value>(&spec.input_schema_json).unwrap(), *schema);
    let pb = spec.options.unwrap();
    assert_eq!(
        (pb.timeout_ms, pb.cache_ttl_ms, pb.approval_timeout_ms),
        (10_000, 0, 3_600_000)
    );
    assert_eq!(pb.retry.unwrap().max_attempts, 3);
    assert_eq!(pb.requires_approval_expr, "args.cents > 10000");
}

#[test]
fn fingerprint_is_stable_and_matches_the_kernel_formula() {
    let first = refund_tool().spec().fingerprint;
    assert_eq!(first, refund_tool().spec().fingerprint);
    assert_eq!(first.len(), 64);
    let def = refund_tool().definition().clone();
    assert_eq!(
        first,
        worker_sdk::proto::canonical::tool_fingerprint(&def.name, &def.description, &def.input_schema, &def.version)
    );
    assert_ne!(first, refund_tool().version("4").spec().fingerprint);
    assert_ne!(first, add_tool().spec().fingerprint);
}

#[test]
fn defaults_and_renames() {
    let add = add_tool();
    assert_eq!(add.definition().version, "1");
    assert_eq!(add.definition().options, worker_sdk::ToolOptions::default());

    let words = word_count_tool();
    assert_eq!(words.definition().name, "word-count");
    assert_eq!(words.definition().options.effect, Effect::ReadOnly);
    assert_eq!(words.definition().options.cache_ttl, Some(Duration::from_millis(1500)));
    assert_eq!(words.spec().options.unwrap().cache_ttl_ms, 1_500);
    assert!(words.definition().options.blocking);

    let broken = broken_tool();
    assert_eq!(broken.definition().description, "Explicit description.");
    assert_eq!(broken.definition().options.approval, Approval::Always);
    assert_eq!(broken.definition().input_schema["properties"], json!({}));
}

#[tokio::test]
async fn calls_decode_arguments_and_encode_results() {
    let ctx = ToolContext::for_test();
    assert_eq!(
        add_tool().call(ctx.clone(), json!({"a": 2, "b": 3})).await.unwrap(),
        json!(5)
    );
    let text = refund_tool()
        .call(ctx.clone(), json!({"customer_id": "c1", "cents": 500}))
        .await
        .unwrap();
    assert_eq!(text, json!("refunded 500 to c1 () key=test-run/t0/p0"));
    assert_eq!(
        word_count_tool()
            .call(ctx.clone(), json!({"text": "a b  c"}))
            .await
            .unwrap(),
        json!(3)
    );
    let out = nested_tool()
        .call(ctx.clone(), json!({"items": [{"id": 1}, {"id": 2}]}))
        .await
        .unwrap();
    assert_eq!(out, json!({"count": 2, "limit": 0}));
    // The function itself is still there, as written.
    assert_eq!(add(ToolContext::for_test(), 1, 1).await.unwrap(), 2);
}

#[tokio::test]
async fn bad_arguments_are_fatal_and_name_the_field() {
    let ctx = ToolContext::for_test();
    let error = add_tool()
        .call(ctx.clone(), json!({"a": "two", "b": 3}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Fatal);
    assert_eq!(
        error.message(),
        "invalid arguments for tool 'add': field `a`: invalid type: string \"two\", expected i64"
    );

    let error = add_tool().call(ctx.clone(), json!({"a": 1})).await.unwrap_err();
    assert_eq!(
        error.message(),
        "invalid arguments for tool 'add': field `b`: missing field"
    );

    let error = add_tool()
        .call(ctx.clone(), json!({"a": 1, "b": 2, "c": 3}))
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .starts_with("invalid arguments for tool 'add': unknown field `c`"),
        "{error}"
    );

    let error = add_tool().call(ctx.clone(), json!([1, 2])).await.unwrap_err();
    assert_eq!(
        error.message(),
        "invalid arguments for tool 'add': expected a JSON object, got an array"
    );

    let error = word_count_tool()
        .call(ctx.clone(), json!({"text": 5}))
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .starts_with("invalid arguments for tool 'word-count': field `text`"),
        "{error}"
    );

    let error = refund_tool()
        .call(ctx, json!({"customer_id": "c1", "cents": -1}))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind(), error.message()),
        (ErrorKind::Fatal, "cents must be positive")
    );
}

#[tokio::test]
async fn unserializable_results_name_the_tool() {
    let error = broken_tool()
        .call(ToolContext::for_test(), json!({}))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Fatal);
    assert!(
        error
            .message()
            .starts_with("tool 'broken' returned a result that cannot be serialized as JSON: "),
        "{error}"
    );
}

/// Charges a card.
#[tool("charge", idempotency = "at_most_once")]
async fn charge_card(_ctx: ToolContext, cents: i64) -> Result<i64, ToolError> {
    Ok(cents)
}

/// Looks an order up.
#[tool("lookup_order")]
async fn find(_ctx: ToolContext, id: String) -> Result<String, ToolError> {
    Ok(id)
}

/// Pings.
#[tool()]
async fn ping(_ctx: ToolContext) -> Result<(), ToolError> {
    Ok(())
}

#[test]
fn the_tool_id_may_come_first_alone_or_with_options_and_the_bare_call_form_takes_the_fn_name() {
    let charge = charge_card_tool();
    assert_eq!(charge.definition().name, "charge");
    assert_eq!(charge.definition().options.idempotency, Idempotency::AtMostOnce);
    assert_eq!(find_tool().definition().name, "lookup_order");
    assert_eq!(ping_tool().definition().name, "ping");
    assert_eq!(ping_tool().definition().description, "Pings.");
}

/// Crawl pages, reporting each one.
#[tool(read_only)]
fn crawl(
    _ctx: ToolContext,
    /// How many pages.
    pages: u32,
) -> impl worker_sdk::Stream<Item = Result<String, ToolError>> {
    let each = (1..=pages).map(|page| Ok(format!("crawled page {page}")));
    worker_sdk::stream::iter(each.chain([Ok(format!("done: {pages} pages"))]))
}

#[tokio::test]
async fn a_function_returning_a_stream_is_a_streaming_tool_whose_last_item_is_the_result() {
    let tool = crawl_tool();
    assert_eq!(tool.spec().name, "crawl");
    assert_eq!(tool.definition().input_schema["required"], json!(["pages"]));
    assert!(
        !tool.definition().options.blocking,
        "a stream is polled, never run on a blocking thread"
    );
    let (ctx, mut progress) = ToolContext::for_test().with_progress_channel();
    let result = tool.call(ctx, json!({"pages": 3})).await.unwrap();
    assert_eq!(result, json!("done: 3 pages"));
    let mut lines = Vec::new();
    while let Ok(update) = progress.try_recv() {
        lines.push(update.message);
    }
    assert_eq!(lines, ["crawled page 1", "crawled page 2", "crawled page 3"]);
    let bad = tool
        .call(ToolContext::for_test(), json!({"pages": "x"}))
        .await
        .unwrap_err();
    assert!(bad.message().contains("field `pages`"), "{}", bad.message());
}
