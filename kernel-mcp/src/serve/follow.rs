//! Following one MCP call through the kernel: its turn's stream relayed to the client as
//! progress until it settles, parks for a person, or the client goes.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use rmcp::RoleServer;
use rmcp::model::ProgressNotificationParam;
use rmcp::service::RequestContext;
use worker_sdk::{AgentError, CallOutcome, Interruption, RunHandle, TurnItem};

/// How following a call ended.
pub(super) enum Followed {
    /// The call settled.
    Settled(CallOutcome),
    /// The call waits for a person (only when the follower stops there).
    Parked(Interruption),
    /// The client cancelled the request or its stream went away; the call goes on in the kernel.
    Left,
}

/// What to do when the call parks for a person.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AtPark {
    /// Return it, for the caller to ask the client.
    Stop,
    /// Say so in a progress notification and keep waiting for the answer.
    Wait,
}

/// Relays `items` (one call's turn) to the client as progress until the call settles, parks
/// (with [`AtPark::Stop`]), or the request is cancelled.
pub(super) async fn follow(
    items: impl Stream<Item = Result<TurnItem, AgentError>>,
    context: &RequestContext<RoleServer>,
    at_park: AtPark,
) -> Result<Followed, AgentError> {
    let mut items = std::pin::pin!(items);
    let mut sent = 0.0;
    loop {
        let item = tokio::select! {
            item = items.next() => item,
            _ = context.ct.cancelled() => return Ok(Followed::Left),
        };
        match item {
            Some(Ok(TurnItem::Result(outcome))) => return Ok(Followed::Settled(outcome)),
            Some(Ok(TurnItem::Progress(update))) => {
                sent += 1.0;
                let at = update.current.map_or(sent, |c| c as f64);
                notify(context, at, update.total, update.message).await;
            }
            Some(Ok(TurnItem::Interrupted(asked))) if at_park == AtPark::Stop => return Ok(Followed::Parked(asked)),
            Some(Ok(TurnItem::Interrupted(asked))) => {
                sent += 1.0;
                notify(context, sent, None, waiting_message(&asked)).await;
            }
            Some(Err(error)) => return Err(error),
            None => {
                return Err(AgentError::Protocol(
                    "the kernel ended the call's stream without a result".into(),
                ));
            }
        }
    }
}

/// What a client is told while its call waits for a person.
pub(super) fn waiting_message(asked: &Interruption) -> String {
    if asked.reason == super::approval::HUMAN_INPUT {
        return format!(
            "waiting for a person to answer the question of '{}' (question {}): {}",
            asked.tool, asked.approval_id, asked.message
        );
    }
    format!(
        "waiting for a person's approval of '{}' (approval {}){}",
        asked.tool,
        asked.approval_id,
        if asked.message.is_empty() {
            String::new()
        } else {
            format!(": {}", asked.message)
        }
    )
}

/// Sends the request's progress, when the client asked for it with a progress token.
async fn notify(context: &RequestContext<RoleServer>, at: f64, total: Option<u64>, message: String) {
    let Some(token) = context.meta.get_progress_token() else {
        return;
    };
    let mut progress = ProgressNotificationParam::new(token, at).with_message(message);
    if let Some(total) = total {
        progress = progress.with_total(total as f64);
    }
    let _ = context.peer.notify_progress(progress).await;
}

/// Cancels call `key` of `run`. A cancel that arrives while the call's turn is still being
/// recorded finds no call yet, so it tries again a few times; a call that settled meanwhile keeps
/// its result.
pub(super) async fn cancel_call(run: &RunHandle, key: &str, reason: &str) {
    for attempt in 0..40 {
        match run.cancel_call(key, reason).await {
            Ok(_) => {
                tracing::info!(run_id = run.id(), step_key = key, "mcp call cancelled");
                return;
            }
            Err(AgentError::Status(status)) if status.code() == tonic::Code::NotFound && attempt < 39 => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(AgentError::Status(status)) if status.code() == tonic::Code::FailedPrecondition => return,
            Err(error) => {
                tracing::warn!(run_id = run.id(), step_key = key, %error, "mcp call not cancelled");
                return;
            }
        }
    }
}
