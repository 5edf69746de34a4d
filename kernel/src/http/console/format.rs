//! How the console writes the protocol's values: enum names, times, JSON.

use kernel_proto::v1 as pb;
use maud::{Markup, html};
use prost_types::Timestamp;

/// `RUN_STATUS_AWAITING_APPROVAL` as `awaiting_approval`.
fn enum_text(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_ascii_lowercase()
}

pub fn run_status(value: i32) -> String {
    pb::RunStatus::try_from(value).map_or_else(|_| value.to_string(), |s| enum_text(s.as_str_name(), "RUN_STATUS_"))
}

pub fn step_status(value: i32) -> String {
    pb::StepStatus::try_from(value).map_or_else(|_| value.to_string(), |s| enum_text(s.as_str_name(), "STEP_STATUS_"))
}

pub fn step_kind(value: i32) -> String {
    pb::StepKind::try_from(value).map_or_else(|_| value.to_string(), |s| enum_text(s.as_str_name(), "STEP_KIND_"))
}

pub fn outcome(value: i32) -> String {
    pb::CallOutcome::try_from(value).map_or_else(|_| value.to_string(), |s| enum_text(s.as_str_name(), "CALL_OUTCOME_"))
}

pub fn approval_status(value: i32) -> String {
    pb::ApprovalStatus::try_from(value).map_or_else(
        |_| value.to_string(),
        |s| enum_text(s.as_str_name(), "APPROVAL_STATUS_"),
    )
}

pub fn capture(value: i32) -> String {
    pb::Capture::try_from(value).map_or_else(|_| value.to_string(), |s| enum_text(s.as_str_name(), "CAPTURE_"))
}

/// Whether a run with this status has ended (completed, failed or cancelled).
pub fn run_ended(value: i32) -> bool {
    matches!(
        pb::RunStatus::try_from(value),
        Ok(pb::RunStatus::Completed | pb::RunStatus::Failed | pb::RunStatus::Cancelled)
    )
}

/// Whether a step with this status has settled (succeeded, failed or cancelled).
pub fn step_settled(value: i32) -> bool {
    matches!(
        pb::StepStatus::try_from(value),
        Ok(pb::StepStatus::Succeeded | pb::StepStatus::Failed | pb::StepStatus::Cancelled)
    )
}

/// A run status from its text, for the list's filter.
pub fn parse_run_status(text: &str) -> Option<pb::RunStatus> {
    pb::RunStatus::from_str_name(&format!("RUN_STATUS_{}", text.to_ascii_uppercase()))
}

/// Milliseconds since the epoch.
pub fn millis(time: &Option<Timestamp>) -> Option<i64> {
    time.as_ref()
        .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
        .filter(|ms| *ms > 0)
}

/// A time the browser writes in its own zone; without the script, in UTC (`2026-12-07T06:11:31.685Z`).
pub fn time(time: &Option<Timestamp>) -> Markup {
    match millis(time) {
        Some(ms) => at_millis(ms),
        None => html! { span.none { "—" } },
    }
}

/// The time `ms` milliseconds after the epoch, as [`time`] writes it.
pub fn at_millis(ms: i64) -> Markup {
    let utc = Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    };
    html! { time data-ms=(ms) datetime=(utc) { (utc) } }
}

/// A duration in the unit that reads best.
pub fn duration(ms: i64) -> String {
    match ms {
        ..0 => "—".to_owned(),
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.2} s", ms as f64 / 1000.0),
        _ => format!("{}m {:02}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// JSON text indented for reading, with a button that copies it (the script makes it work);
/// text that is not JSON as it is.
pub fn json(text: &str) -> Markup {
    if text.is_empty() {
        return html! { span.none { "—" } };
    }
    let pretty = serde_json::from_str::<serde_json::Value>(text)
        .and_then(|value| serde_json::to_string_pretty(&value))
        .unwrap_or_else(|_| text.to_owned());
    html! {
        div.copyable {
            button.copy type="button" hidden title="Copy to the clipboard" { "Copy" }
            pre.json { (pretty) }
        }
    }
}

/// At most `limit` characters of `text`, cut at a character boundary.
pub fn clip(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// A run id shortened for tables, linked to its page.
pub fn run_link(id: &str) -> Markup {
    html! { a.mono href={ "/runs/" (id) } title=(id) { (clip(id, 13)) } }
}
