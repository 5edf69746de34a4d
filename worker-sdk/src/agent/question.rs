//! A question the agent's own code puts to a person, under an id it keeps across its restarts.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use kernel_proto::canonical::to_canonical;
use kernel_proto::v1 as pb;
use serde_json::Value;

use super::{AgentError, RunHandle, kernel_went_away};

/// A question to a person from the code driving a run ([`RunHandle::ask`]); await it for the
/// answer.
#[must_use = "a question asks nothing until it is awaited"]
pub struct AgentQuestion {
    run: RunHandle,
    request: pb::AgentAskRequest,
}

/// How long an ask must have waited for its failure to count as a new outage of the kernel, not
/// one more try during the last.
const CONNECTED: Duration = Duration::from_secs(1);

impl AgentQuestion {
    pub(super) fn new(run: RunHandle, id: String, question: String) -> Self {
        let request = pb::AgentAskRequest {
            run_id: run.id().to_owned(),
            question_id: id,
            question,
            ..Default::default()
        };
        AgentQuestion { run, request }
    }

    /// The JSON Schema the answer must meet; without one any JSON is an answer.
    pub fn schema(mut self, schema: &Value) -> Self {
        self.request.answer_schema_json = to_canonical(schema);
        self
    }

    /// The answers a person picks from: the answer is one of them.
    pub fn choices<I, S>(mut self, choices: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.request.choices = choices.into_iter().map(Into::into).collect();
        self
    }

    /// The answer recorded if nobody answers within the [`timeout`](Self::timeout); it must meet
    /// the schema.
    pub fn default(mut self, answer: &Value) -> Self {
        self.request.default_answer_json = to_canonical(answer);
        self
    }

    /// Who may answer (API key names or groups); without any, any key that may answer approvals.
    pub fn approvers<I, S>(mut self, approvers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.request.approvers = approvers.into_iter().map(Into::into).collect();
        self
    }

    /// How long the question waits unanswered; then it records its default, or fails. Without
    /// it, it waits until the run ends.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.request.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        self
    }

    async fn answer(self) -> Result<Value, AgentError> {
        let client = self.run.client.clone();
        // A person may take hours: the window to reconnect opens when the kernel goes away.
        let mut gone_until = None;
        let mut backoff = Duration::from_millis(100);
        let response = loop {
            let mut calls = client.calls.clone();
            let asked_at = tokio::time::Instant::now();
            match client
                .call(calls.ask_person(client.request(self.request.clone())))
                .await
            {
                Err(error) if kernel_went_away(&error) => {
                    let now = tokio::time::Instant::now();
                    // An ask that waited a while was answered by a kernel: this is a new outage.
                    if now - asked_at >= CONNECTED {
                        gone_until = None;
                        backoff = Duration::from_millis(100);
                    }
                    let until = *gone_until.get_or_insert(now + client.reconnect);
                    if now + backoff >= until {
                        return Err(error);
                    }
                    // Asked again under the same id, the recorded question is waited on.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                outcome => break outcome?,
            }
        };
        let step = response
            .step
            .ok_or_else(|| AgentError::Protocol("AskPerson returned no step".into()))?;
        if step.status == pb::StepStatus::Succeeded as i32 {
            let text = if step.output_json.is_empty() {
                "null"
            } else {
                &step.output_json
            };
            Ok(serde_json::from_str(text)?)
        } else {
            Err(AgentError::Unanswered {
                question: step.step_key,
                message: step.error,
            })
        }
    }
}

impl IntoFuture for AgentQuestion {
    type Output = Result<Value, AgentError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.answer())
    }
}
