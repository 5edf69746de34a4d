//! Streaming tools: a tool whose function returns a stream reports each item but the last as
//! progress, and the last item is its result (Rewyn's async-generator tools).

use futures_util::{Stream, StreamExt};
use serde::Serialize;
use serde_json::Value;

use super::{Tool, encode_result};
use crate::error::ToolError;
use crate::worker::context::{Progress, ToolContext};

/// Drains a tool's stream: every item but the last goes out as progress (through the same
/// channel as [`ToolContext::progress`], so it is delivered live and counted alike), the last is
/// the result. An error item ends the call with that error; an empty stream is a fatal error.
pub(crate) async fn drain<S, T, E>(tool: &str, ctx: &ToolContext, stream: S) -> Result<Value, ToolError>
where
    S: Stream<Item = Result<T, E>>,
    T: Serialize,
    E: Into<ToolError>,
{
    let mut stream = std::pin::pin!(stream);
    let mut last: Option<Value> = None;
    while let Some(item) = stream.next().await {
        let value = encode_result(tool, item)?;
        if let Some(previous) = last.replace(value) {
            ctx.progress_with(progress_of(previous));
        }
    }
    last.ok_or_else(|| {
        ToolError::fatal(format!(
            "tool '{tool}' streamed no items; a streaming tool's last item is its result"
        ))
    })
}

/// A streamed item as progress: a string is the status line; anything else is the data, with its
/// JSON as the line.
fn progress_of(item: Value) -> Progress {
    match item {
        Value::String(message) => Progress::new(message),
        other => Progress::new(other.to_string()).data(other),
    }
}

/// Wraps a closure over JSON arguments that returns a stream as a tool: each item but the last is
/// the call's progress, the last is its result.
///
/// ```
/// use futures_util::stream;
/// use serde_json::json;
/// use worker_sdk::{wrap_stream_tool, ToolContext, ToolError};
///
/// let crawl = wrap_stream_tool(
///     "crawl",
///     "Crawls pages, reporting each one.",
///     json!({"type": "object", "properties": {"pages": {"type": "integer"}}, "required": ["pages"]}),
///     |_ctx: ToolContext, args: serde_json::Value| {
///         let pages = args["pages"].as_u64().unwrap_or(0);
///         let each = (1..=pages).map(|page| Ok::<_, ToolError>(format!("crawled page {page}")));
///         stream::iter(each.chain([Ok(format!("done: {pages} pages"))]))
///     },
/// );
/// assert_eq!(crawl.spec().name, "crawl");
/// ```
pub fn wrap_stream_tool<F, S, T, E>(
    name: impl Into<String>,
    description: impl Into<String>,
    input_schema: Value,
    f: F,
) -> Tool
where
    F: Fn(ToolContext, Value) -> S + Send + Sync + 'static,
    S: Stream<Item = Result<T, E>> + Send + 'static,
    T: Serialize,
    E: Into<ToolError>,
{
    Tool::new(name, description, input_schema, move |ctx, args| {
        let tool = ctx.tool_name().to_owned();
        let stream = f(ctx.clone(), args);
        Box::pin(async move { drain(&tool, &ctx, stream).await })
    })
}

#[cfg(test)]
mod tests {
    use futures_util::stream;
    use serde_json::json;

    use super::*;

    fn crawl(items: Vec<Result<Value, ToolError>>) -> Tool {
        wrap_stream_tool("crawl", "Crawls.", json!({"type": "object"}), move |_ctx, _args| {
            stream::iter(items.clone())
        })
    }

    #[tokio::test]
    async fn every_item_but_the_last_is_progress_and_the_last_is_the_result() {
        let tool = crawl(vec![
            Ok(json!("crawled page 1")),
            Ok(json!({"page": 2})),
            Ok(json!("done: 2 pages")),
        ]);
        let (ctx, mut progress) = ToolContext::for_test().with_progress_channel();
        let result = tool.call(ctx, json!({})).await.unwrap();
        assert_eq!(result, json!("done: 2 pages"));
        let first = progress.recv().await.unwrap();
        assert_eq!(first.message, "crawled page 1");
        assert_eq!(first.data, None);
        let second = progress.recv().await.unwrap();
        assert_eq!(second.message, r#"{"page":2}"#);
        assert_eq!(second.data, Some(json!({"page": 2})));
        assert!(progress.try_recv().is_err(), "the result is not also progress");
    }

    #[tokio::test]
    async fn an_error_item_ends_the_call_with_it() {
        let tool = crawl(vec![
            Ok(json!("page 1")),
            Err(ToolError::retryable("site down")),
            Ok(json!("never")),
        ]);
        let (ctx, mut progress) = ToolContext::for_test().with_progress_channel();
        let error = tool.call(ctx, json!({})).await.unwrap_err();
        assert_eq!(error.message(), "site down");
        assert!(
            progress.try_recv().is_err(),
            "the item before an error is not progress either"
        );
    }

    #[tokio::test]
    async fn an_empty_stream_is_a_fatal_error_naming_the_tool() {
        let error = crawl(Vec::new())
            .call(ToolContext::for_test(), json!({}))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Fatal);
        assert!(
            error.message().contains("tool 'crawl' streamed no items"),
            "{}",
            error.message()
        );
    }
}
