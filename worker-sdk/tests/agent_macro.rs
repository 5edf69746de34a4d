//! `#[agent]`: the constructor it adds, and what it takes from the handler.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use worker_sdk::{AgentContext, AgentError, agent};

/// What to look up.
#[derive(Debug, Deserialize, JsonSchema)]
struct Question {
    /// The question.
    text: String,
}

#[derive(Debug, Serialize)]
struct Answer {
    text: String,
}

/// Looks a question up.
///
/// Not part of the description: only the first paragraph is.
#[agent(version = "2", max_concurrency = 4)]
async fn researcher(_ctx: AgentContext, question: Question) -> Result<Answer, AgentError> {
    Ok(Answer { text: question.text })
}

#[agent(name = "renamed", description = "Given explicitly")]
async fn quiet(_ctx: AgentContext, _input: serde_json::Value) -> Result<(), AgentError> {
    Ok(())
}

#[test]
fn the_constructor_carries_name_description_schema_version_and_bound() {
    let agent = researcher_agent();
    let definition = agent.definition();
    assert_eq!(definition.name, "researcher");
    assert_eq!(definition.description, "Looks a question up.");
    assert_eq!(definition.version, "2");
    assert_eq!(definition.max_concurrency, 4);
    assert_eq!(definition.input_schema["properties"]["text"]["type"], "string");
    assert!(agent.validate().is_ok());
    let fingerprint = definition.fingerprint();
    assert_eq!(fingerprint, researcher_agent().definition().fingerprint(), "stable");

    let renamed = quiet_agent();
    assert_eq!(renamed.definition().name, "renamed");
    assert_eq!(renamed.definition().description, "Given explicitly");
    assert_eq!(renamed.definition().version, "1");
    assert_eq!(renamed.definition().max_concurrency, 0);
}
