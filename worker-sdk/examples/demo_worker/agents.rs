//! The demo's hosted agents: `trip_planner` asks a scripted "model" for a plan (once per run),
//! calls a few of the demo tools, and keeps notes through a `note_taker` subagent on a session.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use worker_sdk::{Agent, AgentContext, AgentError, Call, StepEffect, agent};

/// What a trip is planned for.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Trip {
    /// Where to.
    pub destination: String,
    /// How many days.
    pub days: u32,
}

/// A scripted stand-in for a model: its answer depends on the time it is asked, as a real
/// model's does on its sampling, which is why the handler records it with `ctx.once`.
fn scripted_model(destination: &str) -> Value {
    let asked_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    json!({
        "asked_at_ms": asked_at_ms,
        "notes": [format!("book a hotel in {destination}"), "pack light".to_owned()],
    })
}

/// Plans a trip with a model, tools and a note taker.
#[agent]
async fn trip_planner(ctx: AgentContext, trip: Trip) -> Result<Value, AgentError> {
    let destination = trip.destination.clone();
    let plan: Value = ctx
        .once("model:plan", move |_| async move {
            Ok::<_, String>(scripted_model(&destination))
        })
        .await?;
    // One turn of two calls, then a slow one (5 steps of a second: time to kill the worker).
    let turn = ctx
        .call_turn(vec![
            Call::new("add", json!({"a": trip.days, "b": 1})),
            Call::new("echo", json!({"value": {"destination": trip.destination}})),
        ])
        .await?;
    let nights: i64 = turn[0].content.parse().unwrap_or(0);
    let prepared = ctx
        .call(Call::new("slow", json!({"steps": 5, "delay_ms": 1000})))
        .await?;
    // Notes go through a subagent on a session: each note taker continues from the last one.
    let session = format!("notes:{}", ctx.run_id());
    let mut notes = Value::Null;
    for note in plan["notes"].as_array().cloned().unwrap_or_default() {
        notes = ctx
            .subagent("note_taker", json!({ "note": note }))
            .session(session.clone())
            .await?;
    }
    let summary: String = ctx
        .step_with("summarize", StepEffect::Pure, move |_| async move {
            Ok::<_, String>(format!("{} days and {nights} nights: {}", trip.days, prepared.content))
        })
        .await?;
    Ok(json!({ "summary": summary, "notes": notes["notes"], "plan_asked_at_ms": plan["asked_at_ms"] }))
}

/// One note to keep.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Note {
    /// The note.
    pub note: String,
}

/// Keeps a session's notes.
#[agent]
async fn note_taker(ctx: AgentContext, input: Note) -> Result<Value, AgentError> {
    // A session run continues from the last one that completed.
    let mut notes: Vec<Value> = ctx
        .session()
        .and_then(|session| session.previous_output)
        .and_then(|previous| previous["notes"].as_array().cloned())
        .unwrap_or_default();
    notes.push(Value::String(input.note));
    Ok(json!({ "notes": notes }))
}

/// The demo's agents.
pub fn agents() -> Vec<Agent> {
    vec![
        Agent::new(
            "trip_planner",
            "Plans a trip with a model, tools and a note taker",
            trip_planner,
        ),
        Agent::new("note_taker", "Keeps a session's notes", note_taker),
    ]
}
