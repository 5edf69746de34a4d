//! Questions a tool body or a hosted handler puts to a person (`ctx.ask`). A question is a step of
//! its own, keyed under the call that asked (`question:<call>#<n>`, the body's n-th question; a
//! handler's is `question:agent#<n>`, at its place in the handler's order), waiting for a
//! person as a gated call does: it is put to a person by [`super::approval::ask_next`], one at a
//! time with the run's approvals, and the person's answer (checked against the question's JSON
//! Schema, and one of its choices when it offers some) settles it with that answer as its output;
//! a refusal settles it failed, and so does an expiry, unless the question gave a default answer,
//! which the expiry records instead.
//! Its settle wakes the asking call if the call gave back its slot to wait. The same call run again
//! (a retry, a redispatch) asks the same question at the same identity and gets the recorded step,
//! so a person is asked once and the answer is the one recorded.

use serde_json::Value;

use super::events::{self, Payload};
use super::{StepChange, json_or_string};
use crate::error::KernelError;
use crate::model::{ApprovalGate, Millis, StepKey, StepKind, StepRecord, StepStatus};
use crate::validation::ArgsValidator;

/// What a tool body asks.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Asked {
    /// What the person is asked.
    pub question: String,
    /// The JSON Schema the answer must meet, as canonical JSON text.
    pub schema: String,
    /// Who may answer; empty: anyone who may answer approvals.
    pub approvers: Vec<String>,
    /// How long the question waits unanswered; `None`: until the call or its run ends.
    pub timeout_ms: Option<u64>,
    /// The answers a person picks from (the schema holds them too, as an `enum`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// The answer an expiry records (canonical JSON meeting the schema); `None`: an expiry fails
    /// the question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// The step that holds question `key` of `call`'s body (or of a hosted handler, whose dispatch
/// `call` is then), at `(turn, position)`, waiting for a person, and its `question:asked` event.
/// Its arguments are the question, the schema and the choices and default, so what a person is
/// shown is what the log holds.
pub fn question_step(
    call: &StepRecord,
    (key, (turn, position)): (StepKey, (u32, u32)),
    asked: &Asked,
    now: Millis,
) -> StepChange {
    let schema: Value = serde_json::from_str(&asked.schema).unwrap_or(Value::Null);
    let mut arguments = serde_json::json!({
        "question": asked.question,
        "schema": schema,
    });
    if !asked.choices.is_empty() {
        arguments["choices"] = serde_json::json!(asked.choices);
    }
    if let Some(default) = &asked.default {
        arguments["default"] = json_or_string(default);
    }
    let arguments = kernel_proto::canonical::to_canonical(&arguments);
    let handler = call.kind == StepKind::Agent;
    let decided_by = format!("{}:{}", if handler { "agent" } else { "tool" }, call.tool);
    let step = StepRecord {
        run_id: call.run_id.clone(),
        idempotency_key: key.idempotency_key(&call.run_id),
        key,
        kind: StepKind::Question,
        effect: None,
        sealed: None,
        max_concurrency: None,
        hosted: handler,
        turn,
        position,
        call_id: None,
        tool: call.tool.clone(),
        fingerprint: call.fingerprint.clone(),
        version: call.version.clone(),
        arguments,
        // The answer is bound to the call that asked.
        call_hash: call.call_hash.clone(),
        idempotency: call.idempotency,
        timeout_ms: asked.timeout_ms.unwrap_or(0),
        status: StepStatus::AwaitingApproval,
        attempts: 0,
        output: None,
        error: None,
        error_kind: None,
        worker: None,
        session_id: None,
        replica: None,
        dispatch_id: None,
        lease_expires_at: None,
        created_at: now,
        started_at: Some(now),
        finished_at: None,
        replays: 0,
        progress_count: 0,
        retry: None,
        blocking: false,
        not_before: None,
        lease_losses: 0,
        unit_cost: 0.0,
        cost: 0.0,
        decided_by: Some(decided_by.clone()),
        approval_gate: Some(ApprovalGate {
            timeout_ms: asked.timeout_ms,
            approvers: asked.approvers.clone(),
            message: Some(asked.question.clone()),
            decided_by,
        }),
        cache_ttl_ms: None,
        outcome: None,
        approval: None,
        resources: Vec::new(),
        from_run: None,
        limited_by: Vec::new(),
        limit_wait_ms: 0,
        share: None,
        trace: call.trace,
    };
    let event = events::QuestionAsked {
        step_key: step.key.to_string(),
        call: call.key.to_string(),
        tool: call.tool.clone(),
        question: asked.question.clone(),
        schema: json_or_string(&asked.schema),
        approvers: asked.approvers.clone(),
        timeout_ms: asked.timeout_ms,
        choices: asked.choices.clone(),
        default: asked.default.as_deref().map(json_or_string),
    }
    .event();
    StepChange { step, event }
}

/// The question and the answer's schema a question step holds, as its arguments say them.
pub fn of_step(step: &StepRecord) -> (String, Value) {
    asked_in(&step.arguments)
}

/// The answer question step `step` records if it expires unanswered (canonical JSON), if any.
pub fn default_of(step: &StepRecord) -> Option<String> {
    let arguments: Value = serde_json::from_str(&step.arguments).ok()?;
    let default = arguments.get("default")?;
    Some(kernel_proto::canonical::to_canonical(default))
}

/// The schema a question's answer must meet: `schema`, and one of `choices` when there are some.
pub fn with_choices(schema: Value, choices: &[String]) -> Value {
    if choices.is_empty() {
        return schema;
    }
    let one_of = serde_json::json!({ "enum": choices });
    match schema {
        Value::Object(fields) if fields.is_empty() => one_of,
        schema => serde_json::json!({ "allOf": [schema, one_of] }),
    }
}

/// The question and the answer's schema in a question's `arguments` (its step's, its approval's).
pub fn asked_in(arguments: &str) -> (String, Value) {
    let arguments: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    let question = arguments["question"].as_str().unwrap_or_default().to_owned();
    (question, arguments["schema"].clone())
}

/// Checks `answer` (canonical JSON) against the schema question step `step` holds; `Err` names
/// what does not fit.
pub fn check_answer(step: &StepRecord, answer: &str) -> Result<(), KernelError> {
    let (_, schema) = of_step(step);
    if schema.is_null() {
        return Ok(());
    }
    let answer: Value = serde_json::from_str(answer)
        .map_err(|e| KernelError::invalid("answer_json", format!("is not valid JSON: {e}")))?;
    let validator = ArgsValidator::compile(&schema).map_err(|e| {
        KernelError::FailedPrecondition(format!(
            "question {} holds a schema that does not compile: {e}",
            step.key
        ))
    })?;
    validator.check_value(&answer).map_err(|problems| {
        KernelError::invalid(
            "answer_json",
            format!("does not meet the question's schema: {problems}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::records::{NOW, step};
    use crate::model::EventType;

    fn asked() -> Asked {
        Asked {
            question: "Which account?".into(),
            schema: r#"{"type":"object"}"#.into(),
            approvers: vec!["ops".into()],
            timeout_ms: Some(60_000),
            choices: Vec::new(),
            default: None,
        }
    }

    #[test]
    fn a_question_is_a_step_under_its_call_waiting_for_a_person_and_waking_the_call() {
        let mut call = step();
        call.status = StepStatus::Running;
        call.resources = vec!["repo:acme".into()];
        let change = question_step(
            &call,
            (StepKey::tool_question(&call.key, 1), (call.turn, call.position)),
            &asked(),
            NOW,
        );
        let question = &change.step;
        assert_eq!(question.key.as_str(), "question:t0/p0#1");
        assert_eq!(question.key.waiter(), Some(call.key.clone()));
        assert_eq!(question.kind, StepKind::Question);
        assert_eq!(question.status, StepStatus::AwaitingApproval);
        assert!(
            question.resources.is_empty(),
            "a question holds none of its call's locks"
        );
        let gate = question.approval_gate.as_ref().unwrap();
        assert_eq!(gate.message.as_deref(), Some("Which account?"));
        assert_eq!(
            (gate.timeout_ms, gate.approvers.as_slice()),
            (Some(60_000), &["ops".to_owned()][..])
        );
        assert_eq!(gate.decided_by, "tool:charge");
        assert_eq!(
            of_step(question),
            ("Which account?".to_owned(), serde_json::json!({"type": "object"}))
        );
        assert_eq!(change.event.kind, EventType::QuestionAsked);
        assert_eq!(change.event.payload["call"], "t0/p0");
        assert_eq!(
            crate::machine::hosted::wakes(question).collect::<Vec<_>>(),
            vec![call.key.clone()],
            "its settle wakes the call that asked"
        );
    }
}
