//! The worker session's messages: what a worker sends (hello, heartbeats, progress, results,
//! cache requests) and what the kernel sends it (welcome, dispatches, cancels, cache answers).

use std::time::Duration;

use kernel_proto::canonical::to_canonical;
use kernel_proto::v1 as pb;
use pb::open_session_request::Message as Up;
use pb::open_session_response::Message as Down;
use serde_json::Value;

use super::cache::CacheOp;
use super::context::CallInfo;
use super::session::{DispatchRef, DispatchRequest, Inbound, Outbound, RunRequest, Welcome};
use crate::error::{ToolError, error_kind_to_pb};
use crate::fields::{optional_millis, optional_text};
use crate::hosted::{HostedDispatch, agent_spec};
use crate::tool::wire::tool_spec;

/// Encodes one message of the worker's outbound stream. `Close` never reaches here: the
/// stream ends before it.
pub(crate) fn outbound(message: Outbound) -> pb::OpenSessionRequest {
    let message = match message {
        Outbound::Hello {
            worker_name,
            tools,
            agents,
            max_concurrency,
            ephemeral_tools,
        } => Up::Hello(pb::Hello {
            worker_name,
            tools: tools.iter().map(tool_spec).collect(),
            agents: agents.iter().map(agent_spec).collect(),
            max_concurrency,
            sdk_version: env!("CARGO_PKG_VERSION").to_owned(),
            ephemeral_tools,
            // Sending one message per call costs this SDK little; the kernel sends them alone.
            batches: false,
        }),
        Outbound::Heartbeat | Outbound::Close => Up::Heartbeat(pb::Heartbeat {}),
        Outbound::Drain => Up::Drain(pb::Drain {}),
        Outbound::ApprovalAnswer {
            question_id,
            required,
            error,
        } => Up::ApprovalAnswer(pb::ApprovalAnswer {
            question_id,
            required,
            error,
        }),
        Outbound::Progress { dispatch, progress } => Up::Progress(pb::DispatchProgress {
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            message: progress.message,
            data_json: progress.data.as_ref().map(to_canonical).unwrap_or_default(),
            current: progress.current.unwrap_or(0),
            total: progress.total.unwrap_or(0),
        }),
        Outbound::Result { dispatch, outcome } => Up::Result(pb::DispatchResult {
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            outcome: Some(dispatch_outcome(outcome)),
        }),
        Outbound::Suspended { dispatch, waiting_on } => Up::Result(pb::DispatchResult {
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            outcome: Some(pb::dispatch_result::Outcome::Suspended(pb::DispatchSuspended {
                waiting_on,
            })),
        }),
        Outbound::Cache {
            dispatch,
            request_id,
            op,
        } => Up::Cache(pb::CacheRequest {
            request_id,
            dispatch_id: dispatch.id,
            attempt: dispatch.attempt,
            op: Some(cache_op(op)),
        }),
    };
    pb::OpenSessionRequest { message: Some(message) }
}

fn cache_op(op: CacheOp) -> pb::cache_request::Op {
    use pb::cache_request::Op;
    match op {
        CacheOp::Get { key } => Op::Get(pb::CacheGet { key }),
        CacheOp::Set { key, value_json, ttl } => Op::Set(pb::CacheSet {
            key,
            value_json,
            ttl_ms: optional_millis(ttl),
        }),
    }
}

fn dispatch_outcome(outcome: Result<Value, ToolError>) -> pb::dispatch_result::Outcome {
    use pb::dispatch_result::Outcome;
    match outcome {
        Ok(value) => Outcome::OutputJson(to_canonical(&value)),
        Err(error) => Outcome::Error(pb::ToolFailure {
            message: error.message().to_owned(),
            kind: error_kind_to_pb(error.kind()) as i32,
        }),
    }
}

/// Decodes one message from the kernel; `None` for an empty message (a newer kernel's
/// message this SDK does not know).
pub(crate) fn inbound(message: pb::OpenSessionResponse) -> Option<Inbound> {
    Some(match message.message? {
        Down::Welcome(welcome) => Inbound::Welcome(Welcome {
            session_id: welcome.session_id,
            heartbeat_interval: Duration::from_millis(welcome.heartbeat_interval_ms),
            lease_ttl: Duration::from_millis(welcome.lease_ttl_ms),
        }),
        Down::Dispatch(dispatch) => Inbound::Dispatch(dispatch_request(dispatch)),
        Down::Dispatches(batch) => Inbound::Dispatches(batch.dispatches.into_iter().map(dispatch_request).collect()),
        Down::Run(run) => Inbound::Run(RunRequest {
            input: if run.input_json.trim().is_empty() {
                Ok(Value::Null)
            } else {
                serde_json::from_str(&run.input_json).map_err(|error| error.to_string())
            },
            dispatch: HostedDispatch {
                run_id: run.run_id,
                dispatch_id: run.dispatch_id,
                attempt: run.attempt,
                trace: crate::TraceContext::parse(&run.traceparent),
            },
            agent: run.agent,
        }),
        Down::Cancel(cancel) => Inbound::Cancel {
            dispatch: DispatchRef {
                id: cancel.dispatch_id,
                attempt: cancel.attempt,
            },
            reason: cancel.reason,
        },
        Down::ResultAck(ack) => Inbound::ResultAck {
            dispatch: DispatchRef {
                id: ack.dispatch_id,
                attempt: ack.attempt,
            },
            accepted: ack.accepted,
            reason: ack.reason,
            still_held: ack.still_held,
        },
        Down::ApprovalQuestion(question) => Inbound::ApprovalQuestion {
            question_id: question.question_id,
            tool: question.tool,
        },
        Down::Cache(answer) => Inbound::Cache {
            request_id: answer.request_id,
            reply: if !answer.error.is_empty() {
                Err(answer.error)
            } else if answer.found {
                Ok(Some(answer.value_json))
            } else {
                Ok(None)
            },
        },
    })
}

fn dispatch_request(dispatch: pb::Dispatch) -> DispatchRequest {
    let arguments = if dispatch.arguments_json.trim().is_empty() {
        Ok(Value::Object(Default::default()))
    } else {
        serde_json::from_str(&dispatch.arguments_json).map_err(|error| error.to_string())
    };
    DispatchRequest {
        call: CallInfo {
            run_id: dispatch.run_id,
            call_id: optional_text(dispatch.call_id),
            step_key: dispatch.step_key,
            turn: dispatch.turn,
            position: dispatch.position,
            idempotency_key: dispatch.idempotency_key,
            attempt: dispatch.attempt,
            dispatch_id: dispatch.dispatch_id,
            timeout: (dispatch.timeout_ms > 0).then(|| Duration::from_millis(dispatch.timeout_ms)),
            trace: crate::TraceContext::parse(&dispatch.traceparent),
        },
        tool: dispatch.tool,
        arguments,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::worker::context::Progress;

    #[test]
    fn results_travel_as_canonical_json() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 2,
        };
        let request = outbound(Outbound::Result {
            dispatch,
            outcome: Ok(json!({"b": 1, "a": [1, 2]})),
        });
        let Some(Up::Result(result)) = request.message else {
            panic!("not a result")
        };
        assert_eq!(result.attempt, 2);
        assert_eq!(
            result.outcome,
            Some(pb::dispatch_result::Outcome::OutputJson(r#"{"a":[1,2],"b":1}"#.into()))
        );
    }

    #[test]
    fn errors_keep_their_kind() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 1,
        };
        let request = outbound(Outbound::Result {
            dispatch,
            outcome: Err(ToolError::poison("no")),
        });
        let Some(Up::Result(result)) = request.message else {
            panic!("not a result")
        };
        let Some(pb::dispatch_result::Outcome::Error(failure)) = result.outcome else {
            panic!("not an error")
        };
        assert_eq!(
            (failure.message.as_str(), failure.kind),
            ("no", pb::ErrorKind::Poison as i32)
        );
    }

    #[test]
    fn progress_without_a_fraction_sends_zeros() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 1,
        };
        let progress = Progress::new("working").data(json!({"z": 1, "a": 2}));
        let Some(Up::Progress(sent)) = outbound(Outbound::Progress { dispatch, progress }).message else {
            panic!("not progress")
        };
        assert_eq!((sent.current, sent.total), (0, 0));
        assert_eq!(sent.data_json, r#"{"a":2,"z":1}"#);
    }

    #[test]
    fn cache_requests_and_answers_map_one_to_one() {
        let dispatch = DispatchRef {
            id: "d".into(),
            attempt: 3,
        };
        let op = CacheOp::Set {
            key: "k".into(),
            value_json: "[1]".into(),
            ttl: None,
        };
        let Some(Up::Cache(request)) = outbound(Outbound::Cache {
            dispatch,
            request_id: 9,
            op,
        })
        .message
        else {
            panic!("not a cache request")
        };
        assert_eq!(
            (request.request_id, request.dispatch_id.as_str(), request.attempt),
            (9, "d", 3)
        );
        let Some(pb::cache_request::Op::Set(set)) = request.op else {
            panic!("not a set")
        };
        assert_eq!(set.ttl_ms, 0, "no TTL travels as 0: never expires");

        let answer = |found: bool, value_json: &str, error: &str| {
            let message = pb::OpenSessionResponse {
                message: Some(Down::Cache(pb::CacheResponse {
                    request_id: 9,
                    found,
                    value_json: value_json.into(),
                    error: error.into(),
                })),
            };
            match inbound(message) {
                Some(Inbound::Cache { request_id: 9, reply }) => reply,
                other => panic!("not a cache answer: {other:?}"),
            }
        };
        assert_eq!(answer(true, "1", ""), Ok(Some("1".into())));
        assert_eq!(answer(false, "", ""), Ok(None));
        assert_eq!(answer(false, "", "key: too long"), Err("key: too long".into()));
    }

    #[test]
    fn dispatch_arguments_default_to_an_empty_object() {
        let request = dispatch_request(pb::Dispatch {
            tool: "t".into(),
            ..Default::default()
        });
        assert_eq!(request.arguments, Ok(json!({})));
        assert!(request.call.call_id.is_none());
        assert!(request.call.timeout.is_none());
        let request = dispatch_request(pb::Dispatch {
            arguments_json: "{oops".into(),
            ..Default::default()
        });
        assert!(request.arguments.is_err());
    }
}
