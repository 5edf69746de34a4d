use schemars::JsonSchema;
use serde::Deserialize;
use worker_sdk::{CancellationToken, ToolContext, ToolError, Worker, tool};

/// One line of an order.
#[derive(Deserialize, JsonSchema)]
struct Line {
    /// Price of one unit, in cents.
    cents: u64,
    quantity: u32,
}

/// Adds up an order, in cents.
#[tool(read_only, timeout = 10)]
async fn order_total(ctx: ToolContext, lines: Vec<Line>, discount_cents: Option<u64>) -> Result<u64, ToolError> {
    ctx.progress(format!("adding {} lines", lines.len()));
    let total: u64 = lines.iter().map(|line| line.cents * u64::from(line.quantity)).sum();
    total
        .checked_sub(discount_cents.unwrap_or(0))
        .ok_or_else(|| ToolError::fatal("the discount is larger than the order"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        }
    });
    let worker = Worker::builder("http://127.0.0.1:50051")
        .name("orders")
        .tool(order_total_tool())
        .build()?;
    worker.run(shutdown).await?;
    Ok(())
}
