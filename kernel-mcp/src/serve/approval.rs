//! A call that waits for a person, asked of a 2026-07-28 client: the request returns
//! `input_required` with a form (approve or reject, and why) naming the approval, what it covers
//! and who may answer, and the client retries with the person's answer. The answer is the
//! kernel's like any other: made with the client's key, so it counts only where that key may
//! answer the approval, bound to the call's hash, used once, and refused once the approval
//! expired or someone else answered. An answer the kernel refuses leaves the call waiting: the
//! retry then holds its request open until the approval is answered elsewhere (`kernelctl`, the
//! console).
//!
//! `requestState` is a handle, not trusted state: it names a run, a call and an approval, and
//! everything else is read back from the log. The call must be the one the retried request makes
//! (same tool and arguments) and the approval that call's pending one before an answer is taken;
//! a handle that names anything else is refused. So a changed `requestState` can reach nothing
//! its request could not reach anyway.

use rmcp::model::{
    ElicitResult, ElicitationAction, InputRequest, InputRequests, InputRequiredResult, InputResponses, MetaObject,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use worker_sdk::proto::canonical;
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentClient, AgentError, Interruption};

use super::stateless::Place;

/// The key of the approval's form among a result's `inputRequests`.
const INPUT_KEY: &str = "approval";
/// `_meta` key of an `input_required` result: the approval asked about.
const META_APPROVAL: &str = "kernel/approval";

/// What a retry's `requestState` names.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct State {
    run: String,
    step: String,
    approval: String,
    /// Whether the client may re-issue the call (it gave an idempotency key): all it decides is
    /// whether a cut stream cancels the call.
    keyed: bool,
}

impl State {
    fn of(place: &Place, approval: &str) -> Self {
        Self {
            run: place.run.id().to_owned(),
            step: place.step_key(),
            approval: approval.to_owned(),
            keyed: place.keyed,
        }
    }

    pub(super) fn decode(text: &str) -> Result<Self, ErrorData> {
        serde_json::from_str(text).map_err(|_| {
            ErrorData::invalid_params(
                "requestState: not one this server returned (send it back unchanged)",
                None,
            )
        })
    }
}

/// Whether the request's client can show a person a form (it declared form elicitation).
pub(super) fn client_can_answer(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .and_then(|capabilities| capabilities.elicitation)
        .is_some_and(|elicitation| elicitation.form.is_some() || elicitation.url.is_none())
}

/// The `input_required` result asking the client's user about the call parked at `place`.
pub(super) async fn ask(client: &AgentClient, place: &Place, asked: &Interruption) -> InputRequiredResult {
    // Who may answer and until when are the approval's; without `runs:read` the form says less.
    let approval = client
        .list_approvals(Some(place.run.id()), pb::ApprovalStatus::Pending)
        .await
        .ok()
        .and_then(|approvals| approvals.into_iter().find(|a| a.id == asked.approval_id));
    let mut requests = InputRequests::new();
    requests.insert(INPUT_KEY.to_owned(), form(&Question::of(asked), approval.as_ref()));
    let state = serde_json::to_string(&State::of(place, &asked.approval_id)).expect("a state serializes");
    let mut meta = MetaObject::default();
    meta.insert(
        META_APPROVAL.into(),
        json!({
            "id": asked.approval_id,
            "run": place.run.id(),
            "step": place.step_key(),
            "tool": asked.tool,
            "arguments": asked.arguments,
            "reason": asked.reason,
            "rule": approval.as_ref().map(|a| a.decided_by.clone()),
            "approvers": approval.as_ref().map(|a| a.approvers.clone()),
            "expires_at": approval.as_ref().and_then(|a| a.expires_at).map(|t| t.seconds),
        }),
    );
    InputRequiredResult::new(Some(requests), Some(state)).with_meta(meta)
}

/// What a person is asked about a parked call.
pub(super) struct Question<'a> {
    pub(super) tool: &'a str,
    pub(super) arguments: &'a Value,
    pub(super) approval_id: &'a str,
    pub(super) message: &'a str,
    /// Why it waits, when the approval does not say which rule asked.
    pub(super) reason: &'a str,
}

impl<'a> Question<'a> {
    fn of(asked: &'a Interruption) -> Self {
        Self {
            tool: &asked.tool,
            arguments: &asked.arguments,
            approval_id: &asked.approval_id,
            message: &asked.message,
            reason: &asked.reason,
        }
    }
}

/// The form a person answers: approve or reject, and why; for a tool's question to a person, the
/// question's own answer.
pub(super) fn form(asked: &Question<'_>, approval: Option<&pb::Approval>) -> InputRequest {
    let who = match approval.map(|a| a.approvers.as_slice()) {
        Some([]) => "any key with approvals:write".to_owned(),
        Some(approvers) => approvers.join(", "),
        None => "a key the approval's rule names".to_owned(),
    };
    if asked.reason == HUMAN_INPUT {
        let (schema, _) = answer_form(&asked.arguments["schema"]);
        let message = format!(
            "{} (asked by the tool '{}' mid-call; question {}, may be answered by {who})",
            asked.message, asked.tool, asked.approval_id
        );
        return serde_json::from_value(json!({
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": schema},
        }))
        .expect("a question's form is an elicitation request");
    }
    let rule = approval
        .map(|a| a.decided_by.as_str())
        .filter(|rule| !rule.is_empty())
        .unwrap_or(asked.reason);
    let mut message = format!(
        "Approve the call of '{}' with {}? It waits for a person (approval {}, asked by {rule}; may be answered by {who}).",
        asked.tool,
        canonical::to_canonical(asked.arguments),
        asked.approval_id,
    );
    if !asked.message.is_empty() {
        message.push(' ');
        message.push_str(asked.message);
    }
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "decision": {
                        "type": "string",
                        "title": "Decision",
                        "enum": ["approve", "reject"],
                    },
                    "reason": {"type": "string", "title": "Why"},
                },
                "required": ["decision"],
            },
        },
    }))
    .expect("the approval form is an elicitation request")
}

/// Why a run waits when a tool's body asked a person (`Interruption::reason`).
pub(super) const HUMAN_INPUT: &str = "human_input";

/// The form a question's answer is given in: its schema when that is an object's (as MCP forms
/// are), else one field `answer` holding it; and whether it was wrapped so.
fn answer_form(schema: &Value) -> (Value, bool) {
    if schema["type"] == "object" {
        (schema.clone(), false)
    } else {
        let schema = if schema.is_null() { json!({}) } else { schema.clone() };
        (
            json!({"type": "object", "properties": {"answer": schema}, "required": ["answer"]}),
            true,
        )
    }
}

/// Whether `approval` is the call `step`'s own, or a question the call's body asked.
pub(super) fn concerns(approval: &pb::Approval, step: &str) -> bool {
    approval.step_key == step
        || (approval.question
            && approval
                .step_key
                .strip_prefix("question:")
                .and_then(|rest| rest.rsplit_once('#'))
                .is_some_and(|(call, _)| call == step))
}

/// The place of the call a retry's `state` names, once the log shows it is the call the retried
/// request makes (`name` with `arguments`).
pub(super) async fn resume(
    client: &AgentClient,
    state: &State,
    name: &str,
    arguments: &Value,
) -> Result<Place, ErrorData> {
    let run = client.run(state.run.clone());
    let snapshot = run.get().await.map_err(super::results::kernel_error)?;
    let step = snapshot
        .steps
        .iter()
        .find(|step| step.step_key == state.step)
        .ok_or_else(|| ErrorData::invalid_params("requestState: names a call its run does not hold", None))?;
    if !super::results::records_call(step, name, arguments) {
        return Err(ErrorData::invalid_params(
            format!(
                "requestState: belongs to the call of '{}' recorded as {}, not to this request's tool and arguments",
                step.tool, step.step_key
            ),
            None,
        ));
    }
    Ok(Place {
        own: super::stateless::is_own(&snapshot.run),
        turn: step.turn,
        call_id: step.call_id.clone(),
        run,
        keyed: state.keyed,
    })
}

/// Gives the kernel the person's answer among a retry's `responses`; see [`answer`].
pub(super) async fn answer_retry(
    client: &AgentClient,
    state: &State,
    responses: Option<&InputResponses>,
    context: &RequestContext<RoleServer>,
) {
    if let Some(response) = responses.and_then(|r| r.get(INPUT_KEY)) {
        answer(client, &state.run, &state.step, &state.approval, response, context).await;
    }
}

/// Gives the kernel a person's `response` to the form of approval `approval_id`, made with the
/// client's key. Nothing to answer (the form was dismissed), an approval that is no longer pending
/// or not the pending one of call `step` of `run`, and an answer the kernel refuses all leave the
/// call as it stands.
pub(super) async fn answer(
    client: &AgentClient,
    run: &str,
    step: &str,
    approval_id: &str,
    response: &Value,
    context: &RequestContext<RoleServer>,
) {
    let pending = client
        .list_approvals(Some(run), pb::ApprovalStatus::Pending)
        .await
        .unwrap_or_default();
    let Some(asked) = pending.iter().find(|a| a.id == approval_id && concerns(a, step)) else {
        tracing::debug!(approval_id, "mcp answer to an approval no longer pending");
        return;
    };
    let decision = if asked.question {
        let schema: Value = serde_json::from_str(&asked.answer_schema_json).unwrap_or_default();
        answer_of(response, answer_form(&schema).1)
    } else {
        decision(response)
    };
    let Some(decision) = decision else {
        return;
    };
    let decider = context
        .client_info()
        .map(|info| format!("mcp client {}", info.name))
        .unwrap_or_else(|| "mcp client".to_owned());
    let answered = match decision {
        Decision::Approve(reason) => client.approve(approval_id, decider, reason).await,
        Decision::Answer(answer) => client.answer(approval_id, &answer, decider, "").await,
        Decision::Reject(reason) => client.reject(approval_id, decider, reason).await,
    };
    match answered {
        Ok(approval) => tracing::info!(
            approval_id = approval.id,
            decider = approval.decider,
            "approval answered over mcp"
        ),
        Err(AgentError::Status(status)) => {
            tracing::info!(approval_id, code = ?status.code(), reason = status.message(), "mcp answer refused")
        }
        Err(error) => tracing::warn!(approval_id, %error, "mcp answer not delivered"),
    }
}

/// A person's answer to the approval's form.
#[derive(Debug, PartialEq)]
enum Decision {
    Approve(String),
    /// A question's answer.
    Answer(Value),
    Reject(String),
}

/// The answer in an elicitation response to a question's form (`wrapped`: in its field
/// `answer`), or a decline; a dismissed form decides nothing.
fn answer_of(response: &Value, wrapped: bool) -> Option<Decision> {
    let result: ElicitResult = serde_json::from_value(response.clone()).ok()?;
    match result.action {
        ElicitationAction::Accept => {
            let content = result.content.unwrap_or(Value::Null);
            Some(Decision::Answer(if wrapped {
                content.get("answer").cloned().unwrap_or(Value::Null)
            } else {
                content
            }))
        }
        ElicitationAction::Decline => Some(Decision::Reject("declined by the MCP client's user".to_owned())),
        _ => None,
    }
}

/// The decision in an elicitation response: accepted with `approve` or `reject`, or declined (a
/// rejection); a dismissed form (`cancel`) or one that does not parse decides nothing.
fn decision(response: &Value) -> Option<Decision> {
    let result: ElicitResult = serde_json::from_value(response.clone()).ok()?;
    let field = |name: &str| {
        result
            .content
            .as_ref()
            .and_then(|content| content.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let reason = field("reason").unwrap_or_default();
    match result.action {
        ElicitationAction::Accept => match field("decision").as_deref() {
            Some("approve") => Some(Decision::Approve(reason)),
            Some("reject") => Some(Decision::Reject(reason)),
            _ => None,
        },
        ElicitationAction::Decline => Some(Decision::Reject(if reason.is_empty() {
            "declined by the MCP client's user".to_owned()
        } else {
            reason
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> Interruption {
        Interruption {
            position: 0,
            step_key: "id:k1".into(),
            tool: "refund".into(),
            reason: "tool_approval".into(),
            approval_id: "ap1".into(),
            arguments: json!({"cents": 5}),
            message: "refunds need a person".into(),
        }
    }

    #[test]
    fn the_form_names_the_call_the_approval_and_who_may_answer() {
        let approval = pb::Approval {
            approvers: vec!["payments-oncall".into()],
            decided_by: "rule:refunds".into(),
            ..Default::default()
        };
        let asked = asked();
        let request = serde_json::to_value(form(&Question::of(&asked), Some(&approval))).unwrap();
        assert_eq!(request["method"], "elicitation/create");
        let message = request["params"]["message"].as_str().unwrap();
        for part in [
            "'refund'",
            r#"{"cents":5}"#,
            "approval ap1",
            "rule:refunds",
            "payments-oncall",
            "refunds need a person",
        ] {
            assert!(message.contains(part), "{part} in {message}");
        }
        assert_eq!(
            request["params"]["requestedSchema"]["properties"]["decision"]["enum"],
            json!(["approve", "reject"])
        );
        let anyone = serde_json::to_value(form(&Question::of(&asked), Some(&pb::Approval::default()))).unwrap();
        assert!(
            anyone["params"]["message"]
                .as_str()
                .unwrap()
                .contains("any key with approvals:write")
        );
    }

    #[test]
    fn an_answer_is_a_decision_and_a_dismissed_form_is_none() {
        let accept = |content: Value| json!({"action": "accept", "content": content});
        assert_eq!(
            decision(&accept(json!({"decision": "approve", "reason": "ok"}))),
            Some(Decision::Approve("ok".into()))
        );
        assert_eq!(
            decision(&accept(json!({"decision": "reject"}))),
            Some(Decision::Reject(String::new()))
        );
        assert_eq!(
            decision(&json!({"action": "decline"})),
            Some(Decision::Reject("declined by the MCP client's user".into()))
        );
        assert_eq!(decision(&json!({"action": "cancel"})), None);
        assert_eq!(decision(&accept(json!({"decision": "maybe"}))), None);
        assert_eq!(decision(&json!("approve")), None);
    }

    #[test]
    fn a_state_reads_back_and_a_foreign_one_is_refused() {
        let state = State {
            run: "r1".into(),
            step: "id:k1".into(),
            approval: "ap1".into(),
            keyed: true,
        };
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(State::decode(&text).unwrap(), state);
        let error = State::decode("opaque").unwrap_err();
        assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert!(error.message.starts_with("requestState:"), "{}", error.message);
    }
}
