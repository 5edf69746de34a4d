//! How protocol fields carry what the SDK's types hold: durations as milliseconds, absent text as
//! an empty string, JSON as text. Every side's conversions (tools, the worker session, the agent)
//! read and write fields through these.

use std::time::Duration;

use serde_json::Value;

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn optional_millis(duration: Option<Duration>) -> u64 {
    duration.map(millis).unwrap_or(0)
}

pub(crate) fn optional_text(text: String) -> Option<String> {
    if text.is_empty() { None } else { Some(text) }
}

pub(crate) fn optional_json(text: &str) -> Result<Option<Value>, serde_json::Error> {
    if text.trim().is_empty() {
        Ok(None)
    } else {
        serde_json::from_str(text).map(Some)
    }
}
