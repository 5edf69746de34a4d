//! Human output: tables, detail blocks and event lines drawn from [`crate::view`] structs.
//!
//! Everything here is a pure function from views to text, so the layout is unit-tested without a
//! kernel. Tables use comfy-table's borderless preset with no styling at all, which reads the same
//! in a terminal, a pipe or a file. Long JSON is cut at [`JSON_CUT`] characters with `…`; `--json`
//! output never goes through this module and is never cut.

use std::borrow::Cow;
use std::time::Duration;

use comfy_table::{ContentArrangement, Table, presets};

use crate::diff::{Lineage, RunDiff, RunSummary, StepSide};
use crate::time::{Precision, UtcTime};
use crate::view::{
    ApprovalView, EventView, FairSharesView, Json, ProgressView, ReplicaView, RunDetail, RunView, StatusView, StepView,
    ToolLimitView, ToolOptionsView, ToolView, WorkerView,
};

/// Characters of JSON shown in human output before it is cut.
pub const JSON_CUT: usize = 200;
/// Characters of a tool description shown in `tools list`.
pub const DESCRIPTION_CUT: usize = 60;
/// Characters of joined tool names shown in `workers list`.
pub const TOOL_NAMES_CUT: usize = 40;
/// Hex digits of a fingerprint shown in tables.
pub const FINGERPRINT_DIGITS: usize = 12;

const NONE: &str = "-";

/// A duration as a person reads it: `850µs`, `12ms`, `1.2s`, `3m04s`, `2h05m`, `3d04h`.
pub fn duration(d: Duration) -> String {
    let millis = d.as_millis();
    let secs = d.as_secs();
    if millis == 0 {
        format!("{}µs", d.as_micros())
    } else if millis < 1_000 {
        format!("{millis}ms")
    } else if secs < 60 {
        format!("{secs}.{}s", d.subsec_millis() / 100)
    } else if secs < 3_600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3_600, secs % 3_600 / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3_600)
    }
}

fn millis(ms: u64) -> String {
    duration(Duration::from_millis(ms))
}

/// At most `max_chars` characters of `text`, then `…` when anything was cut.
pub fn truncate(text: &str, max_chars: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}…", &text[..cut])),
    }
}

/// `text` on one line: newlines, tabs and other control characters become spaces.
pub fn one_line(text: &str) -> Cow<'_, str> {
    if text.chars().any(char::is_control) {
        Cow::Owned(text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect())
    } else {
        Cow::Borrowed(text)
    }
}

/// The first [`FINGERPRINT_DIGITS`] hex digits of a fingerprint.
pub fn short_fingerprint(fingerprint: &str) -> &str {
    fingerprint
        .char_indices()
        .nth(FINGERPRINT_DIGITS)
        .map_or(fingerprint, |(cut, _)| &fingerprint[..cut])
}

/// Compact JSON cut for a table or detail line.
pub fn json_cut(json: &Json) -> String {
    truncate(&one_line(&json.compact()), JSON_CUT).into_owned()
}

/// Whether [`json_cut`] cuts `json`.
pub fn is_cut(json: &Json) -> bool {
    one_line(&json.compact()).chars().count() > JSON_CUT
}

fn time(t: Option<UtcTime>) -> String {
    t.map_or_else(|| NONE.to_owned(), |t| t.rfc3339(Precision::Seconds))
}

fn or_none(text: Option<&str>) -> &str {
    text.filter(|t| !t.is_empty()).unwrap_or(NONE)
}

/// A borderless table with a header row; lines carry no trailing spaces.
pub fn table<R>(headers: &[&str], rows: R) -> String
where
    R: IntoIterator<Item = Vec<String>>,
{
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(headers.to_vec());
    for row in rows {
        table.add_row(row);
    }
    let last = headers.len().saturating_sub(1);
    for (index, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if index == last { 0 } else { 2 }));
    }
    let mut text = String::new();
    for line in table.lines() {
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// `label: value` lines with the values aligned.
fn fields(pairs: &[(&str, String)], indent: &str) -> String {
    let width = pairs.iter().map(|(label, _)| label.len() + 1).max().unwrap_or(0);
    let mut text = String::new();
    for (label, value) in pairs {
        let label = format!("{label}:");
        text.push_str(format!("{indent}{label:<width$}  {value}").trim_end());
        text.push('\n');
    }
    text
}

fn labels(run: &RunView) -> String {
    if run.labels.is_empty() {
        return NONE.to_owned();
    }
    let pairs: Vec<String> = run.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    one_line(&pairs.join(",")).into_owned()
}

/// Calls made, and the run's max_tool_calls when it has one: `5`, `5 of 20`.
fn calls(run: &RunView) -> String {
    match run.max_tool_calls {
        Some(max) => format!("{} of {max}", run.tool_calls),
        None => run.tool_calls.to_string(),
    }
}

/// `runs list`: ID, AGENT, STATUS, CALLS, CREATED, UPDATED, LABELS.
pub fn runs_table(runs: &[RunView]) -> String {
    table(
        &["ID", "AGENT", "STATUS", "CALLS", "CREATED", "UPDATED", "LABELS"],
        runs.iter().map(|run| {
            vec![
                run.id.clone(),
                one_line(&run.agent).into_owned(),
                run.status.clone(),
                calls(run),
                time(run.created_at),
                time(run.updated_at),
                labels(run),
            ]
        }),
    )
}

/// What a step is, in the TOOL column: a tool's name, or for a hosted run's other steps their
/// kind and name (`agent:triage`, `local:fetch`, `subagent:researcher`).
fn step_what(step: &StepView) -> String {
    match step.kind.as_str() {
        "tool" => step.tool.clone(),
        kind => format!("{kind}:{}", step.tool),
    }
}

fn step_version(step: &StepView) -> String {
    match &step.tool_version {
        Some(version) => one_line(version).into_owned(),
        None if step.tool_fingerprint.is_empty() => NONE.to_owned(),
        None => short_fingerprint(&step.tool_fingerprint).to_owned(),
    }
}

/// The steps in the order `runs show` prints them, each with its depth: the calls a tool's body
/// made (`ctx.call`) follow their caller, in the body's order, one level deeper.
fn nested_order(steps: &[StepView]) -> Vec<(usize, &StepView)> {
    let keys: Vec<(&str, &str)> = steps
        .iter()
        .map(|step| (step.key.as_str(), step.caller_step_key.as_deref().unwrap_or_default()))
        .collect();
    kernel_proto::nesting::nested_order(&keys)
        .into_iter()
        .map(|(index, depth)| (depth, &steps[index]))
        .collect()
}

/// A step's key as the step table shows it: under its caller, `└ call:t0/p0#0`.
fn nested_key(depth: usize, key: &str) -> String {
    match depth {
        0 => one_line(key).into_owned(),
        depth => format!("{}└ {}", "  ".repeat(depth - 1), one_line(key)),
    }
}

/// The step table of `runs show`: KEY, TOOL, VERSION, STATUS, ATTEMPTS, DURATION, WORKER, REPLAYS.
pub fn steps_table(steps: &[StepView]) -> String {
    table(
        &[
            "KEY", "TOOL", "VERSION", "STATUS", "ATTEMPTS", "DURATION", "WORKER", "REPLAYS",
        ],
        nested_order(steps).into_iter().map(|(depth, step)| {
            vec![
                nested_key(depth, &step.key),
                step_what(step),
                step_version(step),
                step.shown_status().to_owned(),
                if step.max_attempts > 1 {
                    format!("{}/{}", step.attempts, step.max_attempts)
                } else {
                    step.attempts.to_string()
                },
                step.duration().map_or_else(|| NONE.to_owned(), duration),
                or_none(step.worker.as_deref()).to_owned(),
                step.replays.to_string(),
            ]
        }),
    )
}

/// Each limit of a run's budget with what it has spent, `calls 3 of 10, cost 1.50 of 5.00
/// (request)`, one a line; `None` when no budget covers the run.
fn budget(run: &RunView) -> Option<String> {
    let mut lines: Vec<String> = run
        .budget
        .iter()
        .map(|limit| {
            let mut parts = Vec::new();
            if let Some(max) = limit.max_calls {
                parts.push(format!("calls {} of {max}", limit.spent_calls));
            }
            if let Some(max) = limit.max_cost {
                parts.push(format!("cost {:.2} of {max:.2}", limit.spent_cost));
            }
            if let Some(max) = limit.max_time_ms {
                let held = match limit.reserved_time_ms {
                    0 => String::new(),
                    held => format!(" ({} held by running calls)", millis(held)),
                };
                parts.push(format!("time {} of {}{held}", millis(limit.spent_time_ms), millis(max)));
            }
            let scope = match &limit.tools {
                Some(glob) => format!("on '{}': ", one_line(glob)),
                None => String::new(),
            };
            let by = limit.set_by.as_deref().map(|by| format!(" ({by})")).unwrap_or_default();
            format!("{scope}{}{by}", parts.join(", "))
        })
        .collect();
    if run.budget_under_parent {
        lines.push("charged to its parent's budget too".to_owned());
    }
    (!lines.is_empty()).then(|| lines.join("; "))
}

fn run_fields(run: &RunView) -> String {
    let mut pairs = vec![
        ("run", run.id.clone()),
        ("agent", one_line(&run.agent).into_owned()),
        ("status", run.status.clone()),
    ];
    if let Some(reason) = &run.reason {
        pairs.push(("reason", one_line(reason).into_owned()));
    }
    pairs.extend([
        ("created", time(run.created_at)),
        ("updated", time(run.updated_at)),
        ("labels", labels(run)),
    ]);
    let tool_calls = match run.max_tool_calls {
        Some(max) => format!("{} made, of at most {max} (max_tool_calls)", run.tool_calls),
        None => format!("{} made (no max_tool_calls limit)", run.tool_calls),
    };
    pairs.push(("tool calls", tool_calls));
    if let Some(budget) = budget(run) {
        pairs.push(("budget", budget));
    }
    if run.hosted {
        pairs.push((
            "hosted",
            format!(
                "dispatched {} times, suspended {} times (the agent step below is each dispatch of the handler)",
                run.dispatches, run.suspensions
            ),
        ));
    }
    if let Some(parent) = &run.parent_run_id {
        let step = run.parent_step_key.as_deref().unwrap_or(NONE);
        pairs.push(("parent", format!("{parent} (its step {})", one_line(step))));
    }
    if let Some(session) = &run.session_key {
        pairs.push(("session", one_line(session).into_owned()));
    }
    if let Some(trace) = &run.trace_id {
        pairs.push(("trace", one_line(trace).into_owned()));
    }
    if let Some(parent) = &run.forked_from_run_id {
        pairs.push((
            "branch",
            format!(
                "forked from {parent} at {}",
                fork_point(run.fork_at_step_key.as_deref())
            ),
        ));
    }
    if !run.fork_results.is_empty() {
        let replaced: Vec<String> = run
            .fork_results
            .iter()
            .map(|(step, result)| format!("{} = {}", one_line(step), json_cut(result)))
            .collect();
        pairs.push(("replaced results", replaced.join("; ")));
    }
    if !run.allow.is_empty() {
        pairs.push((
            "allow",
            format!(
                "{} (a case run: besides reads, only these run live)",
                one_line(&run.allow.join(", "))
            ),
        ));
    }
    if !run.permissions.is_empty() {
        let source = match &run.permissions_granted_by {
            Some(key) => format!("granted by key {}", one_line(key)),
            None => "claimed by the run: the kernel has no auth file".to_owned(),
        };
        pairs.push((
            "permissions",
            format!("{} ({source})", one_line(&run.permissions.join(", "))),
        ));
    }
    if let Some(key) = &run.idempotency_key {
        pairs.push(("idempotency key", one_line(key).into_owned()));
    }
    pairs.push(("input", json_cut(&run.input)));
    pairs.push(("output", run.output.as_ref().map_or_else(|| NONE.to_owned(), json_cut)));
    fields(&pairs, "")
}

/// Where a branch was forked: at its parent's step, or after the parent's whole record.
fn fork_point(at_step_key: Option<&str>) -> String {
    match at_step_key {
        Some(step) => one_line(step).into_owned(),
        None => "the end of its record".to_owned(),
    }
}

fn step_block(step: &StepView) -> String {
    let mut text = format!(
        "{} {} ({})\n",
        one_line(&step.key),
        step_what(step),
        step.shown_status()
    );
    let mut pairs = Vec::new();
    if let Some(caller) = &step.caller_step_key {
        pairs.push((
            "called by",
            format!("{} (its body's call through the kernel)", one_line(caller)),
        ));
    }
    if let Some(effect) = &step.effect {
        pairs.push(("effect", effect.clone()));
    }
    if let Some(child) = &step.child_run_id {
        pairs.push(("child run", child.clone()));
    }
    if !step.resources.is_empty() {
        let shown: Vec<String> = step.resources.iter().map(|r| one_line(r).into_owned()).collect();
        pairs.push(("resources", shown.join(", ")));
    }
    if !step.limited_by.is_empty() {
        let limits: Vec<String> = step.limited_by.iter().map(|l| format!("'{}'", one_line(l))).collect();
        let waited = match step.limit_wait_ms {
            0 => "started without waiting".to_owned(),
            ms => format!("waited {} for room", duration(Duration::from_millis(ms))),
        };
        pairs.push(("limits", format!("{} ({waited})", limits.join(", "))));
    }
    if let Some(share) = &step.share {
        pairs.push(("share", one_line(share).into_owned()));
    }
    if let (Some(call_id), "tool") = (&step.call_id, step.kind.as_str()) {
        pairs.push(("call id", one_line(call_id).into_owned()));
    }
    pairs.push(("arguments", json_cut(&step.arguments)));
    if let Some(output) = &step.output {
        pairs.push(("result", json_cut(output)));
    }
    if let Some(error) = &step.error {
        // The first line is the error; more lines are a trace (a Python tool's traceback), shown
        // below the fields.
        let first = error.message.lines().next().unwrap_or_default();
        let message = truncate(&one_line(first), JSON_CUT).into_owned();
        // An error kind (retryable, fatal, poison) is the tool's word on a failed attempt; a call
        // the kernel refused or a person rejected has its outcome in the status instead.
        let value = match (&error.kind, step.outcome.as_deref()) {
            (Some(kind), None | Some("tool_error")) => format!("{kind}: {message}"),
            _ => message,
        };
        // A pending step's error is the last failed attempt's; the step is waiting to retry.
        let label = if step.status == "pending" {
            "last error"
        } else {
            "error"
        };
        pairs.push((label, value));
    }
    if let Some(next) = step.next_attempt_at {
        pairs.push(("next attempt", time(Some(next))));
    }
    let attempts = match step.kind.as_str() {
        // Each attempt of a hosted run's own step is a dispatch of its handler, which replays.
        "agent" => format!("{} (each replays what the ones before recorded)", step.attempts),
        "local" | "subagent" => String::new(),
        _ if step.max_attempts > 1 => format!("{} of at most {}", step.attempts, step.max_attempts),
        _ => format!("{} (no retry)", step.attempts),
    };
    if !attempts.is_empty() {
        pairs.push((if step.kind == "agent" { "dispatches" } else { "attempts" }, attempts));
    }
    if step.lease_losses > 0 {
        pairs.push(("workers lost", step.lease_losses.to_string()));
    }
    if let Some(worker) = &step.worker {
        let holder = if step.is_running() { "held by" } else { "last worker" };
        pairs.push((holder, worker.clone()));
    }
    if matches!(step.kind.as_str(), "tool" | "agent") {
        pairs.push(("dispatch", or_none(step.dispatch_id.as_deref()).to_owned()));
    }
    if step.is_running() {
        pairs.push(("lease expires", time(step.lease_expires_at)));
    }
    if step.replays > 0 {
        pairs.push(("replayed", format!("{} times from the log", step.replays)));
    }
    if let Some(parent) = &step.replayed_from_run_id {
        let what = match step.decided_by.as_deref() {
            Some("branch:set_result") => "the result the fork put in place of its own",
            _ => "its recorded outcome",
        };
        pairs.push(("replayed from", format!("{parent} ({what}; nothing ran)")));
    }
    if let Some(decided_by) = &step.decided_by {
        pairs.push(("decided by", decided_by.clone()));
    }
    if let Some(approval) = &step.approval {
        let mut answer = format!("{} by {}", approval.answer, one_line(&approval.decider));
        if let Some(reason) = &approval.reason {
            answer.push_str(&format!(": {}", one_line(reason)));
        }
        pairs.push(("approval", answer));
    }
    if step.unit_cost > 0.0 {
        pairs.push(("cost", format!("{} ({} per attempt)", step.cost, step.unit_cost)));
    }
    if let (Some(mode), "tool") = (&step.idempotency, step.kind.as_str()) {
        pairs.push(("idempotency", mode.clone()));
    }
    if step.timeout_ms > 0 {
        pairs.push(("timeout", duration(std::time::Duration::from_millis(step.timeout_ms))));
    }
    pairs.push(("idempotency key", or_none(Some(&step.idempotency_key)).to_owned()));
    text.push_str(&fields(&pairs, "  "));
    if let Some(error) = &step.error {
        text.push_str(&trace_block(&error.message));
    }
    text
}

/// The lines of an error after its first (a traceback), indented under the step, at most the last
/// [`TRACE_LINES`]: a traceback's last frames are the ones that raised.
fn trace_block(message: &str) -> String {
    let lines: Vec<&str> = message.lines().skip(1).filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let mut block = String::from(
        "  trace:
",
    );
    if lines.len() > TRACE_LINES {
        block.push_str(&format!(
            "    ... {} lines before (--json shows them)
",
            lines.len() - TRACE_LINES
        ));
    }
    for line in &lines[lines.len().saturating_sub(TRACE_LINES)..] {
        block.push_str("    ");
        block.push_str(&one_line(line));
        block.push('\n');
    }
    block
}

/// The most trace lines `runs show` prints under a step.
const TRACE_LINES: usize = 40;

/// `runs show`: the run's fields, its step table, then one detail block per step.
pub fn run_detail(detail: &RunDetail) -> String {
    let mut text = run_fields(&detail.run);
    text.push('\n');
    if detail.steps.is_empty() {
        text.push_str("no steps recorded\n");
        return text;
    }
    text.push_str(&steps_table(&detail.steps));
    for (_, step) in nested_order(&detail.steps) {
        text.push('\n');
        text.push_str(&step_block(step));
    }
    if detail.manifest.total_cost > 0.0 {
        text.push_str(&format!("\ncost: {} in all\n", detail.manifest.total_cost));
        for (tool, cost) in &detail.manifest.cost_by_tool {
            text.push_str(&format!("  {tool}: {cost}\n"));
        }
    }
    if !detail.approvals.is_empty() {
        text.push_str("\napprovals:\n");
        text.push_str(&approvals_table(&detail.approvals));
    }
    text
}

/// `runs diff`: both runs, how they are related, then one row per step identity: KEY, TOOL, A, B,
/// MARK (what B's step is relative to A's), DIFFERS.
pub fn run_diff(diff: &RunDiff) -> String {
    let summary = |name: &str, run: &RunSummary| {
        vec![
            name.to_owned(),
            run.id.clone(),
            one_line(&run.agent).into_owned(),
            run.status.clone(),
            run.reason
                .as_deref()
                .map_or_else(|| NONE.to_owned(), |r| truncate(&one_line(r), JSON_CUT).into_owned()),
        ]
    };
    let mut text = table(
        &["", "RUN", "AGENT", "STATUS", "REASON"],
        [summary("A", &diff.a), summary("B", &diff.b)],
    );
    let mut notes = Vec::new();
    match diff.lineage() {
        Lineage::BranchOfA => notes.push(format!(
            "B is a branch of A at {}",
            fork_point(diff.b.fork_at_step_key.as_deref())
        )),
        Lineage::BranchOfB => notes.push(format!(
            "A is a branch of B at {}",
            fork_point(diff.a.fork_at_step_key.as_deref())
        )),
        Lineage::Unrelated => {}
    }
    if let Some(step) = &diff.stopped_at {
        notes.push(format!("the branch stopped at {} (write_tool_blocked)", one_line(step)));
    }
    for (name, run) in [("A", &diff.a), ("B", &diff.b)] {
        match run.capture.as_str() {
            "metadata" => notes.push(format!(
                "{name} captures metadata: its arguments and results are compared by size and hash"
            )),
            "none" => notes.push(format!(
                "{name} captures nothing: its arguments and results are withheld and compare as placeholders"
            )),
            _ => {}
        }
    }
    if !notes.is_empty() {
        text.push('\n');
        for note in notes {
            text.push_str(&note);
            text.push('\n');
        }
    }
    text.push('\n');
    if diff.steps.is_empty() {
        text.push_str("no steps recorded in either run\n");
        return text;
    }
    let side = |side: &Option<StepSide>| {
        side.as_ref()
            .map_or_else(|| NONE.to_owned(), |side| side.shown_status.clone())
    };
    text.push_str(&table(
        &["KEY", "TOOL", "A", "B", "MARK", "DIFFERS"],
        diff.steps.iter().map(|step| {
            let differs: Vec<&str> = step.differs.iter().map(|d| d.word()).collect();
            vec![
                one_line(&step.step_key).into_owned(),
                one_line(&step.tool).into_owned(),
                side(&step.a),
                side(&step.b),
                step.mark.words().to_owned(),
                if differs.is_empty() {
                    NONE.to_owned()
                } else {
                    differs.join(", ")
                },
            ]
        }),
    ));
    text
}

/// `runs tree`: each run with its status, its children indented under it.
pub fn run_tree(nodes: &[(usize, RunView)]) -> String {
    let mut text = String::new();
    for (depth, run) in nodes {
        let session = run
            .session_key
            .as_deref()
            .map(|s| format!(" session {}", one_line(s)))
            .unwrap_or_default();
        text.push_str(&format!(
            "{}{} {} {}{}\n",
            "  ".repeat(*depth),
            run.id,
            one_line(&run.agent),
            run.status,
            session
        ));
    }
    text
}

/// The table of `approvals list` and of the approvals in `runs show`.
pub fn approvals_table(approvals: &[ApprovalView]) -> String {
    table(
        &[
            "ID",
            "RUN",
            "STEP",
            "TOOL",
            "STATUS",
            "ASKED BY",
            "APPROVERS",
            "EXPIRES",
            "MESSAGE",
            "DECIDER",
            "REASON",
            "ARGUMENTS",
        ],
        approvals.iter().map(|a| {
            vec![
                a.id.clone(),
                a.run_id.clone(),
                one_line(&a.step_key).into_owned(),
                a.tool.clone(),
                a.status.clone(),
                a.decided_by.clone(),
                // Who may answer: with API keys only these key names or groups; none listed, anyone
                // with approvals:write.
                if a.approvers.is_empty() {
                    "any".to_owned()
                } else {
                    one_line(&a.approvers.join(",")).into_owned()
                },
                a.expires_at.map_or_else(|| "never".to_owned(), |t| time(Some(t))),
                a.message
                    .as_deref()
                    .map_or_else(|| NONE.to_owned(), |m| truncate(&one_line(m), 60).into_owned()),
                or_none(a.decider.as_deref()).to_owned(),
                a.reason
                    .as_deref()
                    .map_or_else(|| NONE.to_owned(), |r| one_line(r).into_owned()),
                json_cut(&a.arguments),
            ]
        }),
    )
}

const AT_WIDTH: usize = 24;
const TYPE_WIDTH: usize = 18;

/// The header line above `runs events` output.
pub fn events_header() -> String {
    format!("{:>5}  {:<AT_WIDTH$}  {:<TYPE_WIDTH$}  PAYLOAD", "SEQ", "AT", "TYPE")
}

/// One `runs events` line: `SEQ  AT  TYPE  PAYLOAD`, time to the millisecond.
pub fn event_line(event: &EventView) -> String {
    let at = event
        .at
        .map_or_else(|| NONE.to_owned(), |t| t.rfc3339(Precision::Millis));
    format!(
        "{:>5}  {at:<AT_WIDTH$}  {:<TYPE_WIDTH$}  {}",
        event.seq,
        one_line(&event.kind),
        json_cut(&event.payload)
    )
}

/// A live progress line under `runs events --follow --progress`; it has no sequence number.
pub fn progress_line(progress: &ProgressView) -> String {
    let mut body = format!(
        "{} {}: {}",
        one_line(&progress.step_key),
        progress.tool,
        one_line(&progress.message)
    );
    if progress.total > 0 {
        body.push_str(&format!(" ({}/{})", progress.current, progress.total));
    }
    if let Some(data) = &progress.data {
        body.push(' ');
        body.push_str(&json_cut(data));
    }
    let line = format!("{:>5}  {NONE:<AT_WIDTH$}  {:<TYPE_WIDTH$}  {body}", "~", "progress");
    line.trim_end().to_owned()
}

/// `tools list`: NAME, VERSION, FINGERPRINT, RISK, IDEMPOTENCY, WORKERS, DESCRIPTION.
pub fn tools_table(tools: &[ToolView]) -> String {
    table(
        &[
            "NAME",
            "VERSION",
            "FINGERPRINT",
            "OWNER",
            "RISK",
            "IDEMPOTENCY",
            "GOVERNANCE",
            "WORKERS",
            "DESCRIPTION",
        ],
        tools.iter().map(|tool| {
            let workers = if tool.workers.is_empty() {
                "none connected".to_owned()
            } else {
                tool.workers.join(", ")
            };
            vec![
                tool.name.clone(),
                or_none(tool.version.as_deref()).to_owned(),
                or_none(Some(short_fingerprint(&tool.fingerprint))).to_owned(),
                or_none(tool.options.owner.as_deref()).to_owned(),
                unspecified_as_none(&tool.options.risk),
                unspecified_as_none(&tool.options.idempotency),
                governance(&tool.options),
                one_line(&workers).into_owned(),
                truncate(one_line(&tool.description).trim(), DESCRIPTION_CUT).into_owned(),
            ]
        }),
    )
}

/// The declared effects, approval, permissions, cost and cache of a tool, in a few words.
fn governance(options: &ToolOptionsView) -> String {
    let mut parts = Vec::new();
    if options.read_only {
        parts.push("read_only".to_owned());
    }
    if options.writes {
        parts.push("writes".to_owned());
    }
    match (&options.requires_approval_expr, options.requires_approval) {
        (Some(expr), _) => parts.push(format!("approval if {}", one_line(expr))),
        (None, true) => parts.push("approval".to_owned()),
        (None, false) => {}
    }
    if !options.permissions.is_empty() {
        parts.push(format!("needs {}", options.permissions.join("+")));
    }
    if options.cost_per_call > 0.0 {
        parts.push(format!("{}/call", options.cost_per_call));
    }
    if !options.secret.is_empty() {
        parts.push(format!("secret {}", options.secret.join("+")));
    }
    if let Some(ttl) = options.cache_ttl_ms {
        parts.push(format!("cache {}", duration(Duration::from_millis(ttl))));
    }
    if parts.is_empty() {
        NONE.to_owned()
    } else {
        parts.join(", ")
    }
}

fn unspecified_as_none(name: &str) -> String {
    if name == "unspecified" { NONE } else { name }.to_owned()
}

fn worker_tools(tools: &[String]) -> String {
    if tools.is_empty() {
        return "0".to_owned();
    }
    let names = one_line(&tools.join(", ")).into_owned();
    format!("{}: {}", tools.len(), truncate(&names, TOOL_NAMES_CUT))
}

/// `workers list`: SESSION, NAME, REPLICA, SLOTS, TOOLS, AGENTS, CONNECTED, LAST HEARTBEAT,
/// DRAINING. A replica shows as the last 8 characters of its id, as its log's `replica=` ends.
pub fn workers_table(workers: &[WorkerView]) -> String {
    table(
        &[
            "SESSION",
            "NAME",
            "REPLICA",
            "SLOTS",
            "TOOLS",
            "AGENTS",
            "CONNECTED",
            "LAST HEARTBEAT",
            "DRAINING",
        ],
        workers.iter().map(|worker| {
            vec![
                worker.session_id.clone(),
                one_line(&worker.name).into_owned(),
                short_replica(&worker.replica),
                format!("{}/{}", worker.slots_in_use, worker.max_concurrency),
                worker_tools(&worker.tools),
                worker_tools(&worker.agents),
                time(worker.connected_at),
                time(worker.last_heartbeat_at),
                if worker.draining { "yes" } else { "no" }.to_owned(),
            ]
        }),
    )
}

pub fn replicas_table(replicas: &[ReplicaView]) -> String {
    table(
        &[
            "REPLICA",
            "ADDRESS",
            "ALIVE",
            "SHARDS",
            "WORKERS",
            "STARTED",
            "LAST HEARTBEAT",
        ],
        replicas.iter().map(|replica| {
            let mut id = replica.id.clone();
            if replica.answering {
                id.push_str(" (this)");
            }
            vec![
                id,
                one_line(&replica.address).into_owned(),
                if replica.alive { "yes" } else { "no" }.to_owned(),
                replica.shards.to_string(),
                replica.worker_sessions.to_string(),
                time(replica.started_at),
                time(replica.heartbeat_at),
            ]
        }),
    )
}

/// The end of a replica id, enough to tell a cluster's replicas apart.
fn short_replica(replica: &str) -> String {
    match replica.len() {
        0 => NONE.to_owned(),
        n => replica[n.saturating_sub(8)..].to_owned(),
    }
}

/// Bytes in binary units with one decimal: `812.0 KiB`, `41.3 MiB`.
/// A byte count in binary units (`40.0 MiB`); `-` when unknown.
pub fn bytes(n: Option<u64>) -> String {
    let Some(n) = n else {
        return NONE.to_owned();
    };
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < units.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

pub fn status_text(status: &StatusView) -> String {
    let mut text = fields(
        &[
            ("version", status.version.clone()),
            ("started", time(status.started_at)),
            ("worker sessions", status.worker_sessions.to_string()),
            ("queued calls", status.queued_calls.to_string()),
            ("leased calls", status.leased_calls.to_string()),
            ("live runs", status.live_runs.to_string()),
            ("resident", bytes(status.resident_bytes)),
            ("allocated", bytes(status.allocated_bytes)),
            (
                "cpu time",
                status
                    .cpu_micros
                    .map_or_else(|| NONE.to_owned(), |micros| format!("{:.2} s", micros as f64 / 1e6)),
            ),
            (
                "store commits",
                format!("{} ({} synced to disk)", status.store_commits, status.store_syncs),
            ),
            ("store statements", status.store_statements.to_string()),
            ("disk written", bytes(status.disk_write_bytes)),
            ("logs dropped", format!("{} lines", status.log_lines_dropped)),
            (
                "writes forwarded",
                format!(
                    "{} sent to owners ({} applied for others)",
                    status.writes_forwarded, status.writes_applied_for_others
                ),
            ),
            (
                "in-flight scans",
                format!(
                    "{} ({} lost calls found)",
                    status.in_flight_scans, status.lost_calls_found
                ),
            ),
            ("resource locks", status.resource_locks.len().to_string()),
            ("tool limits", status.tool_limits.len().to_string()),
        ],
        "",
    );
    if !status.resource_locks.is_empty() {
        text.push('\n');
        text.push_str(&table(
            &["RESOURCE", "HELD BY", "TOOL", "ATTEMPT", "SINCE", "WAITING"],
            status.resource_locks.iter().map(|lock| {
                vec![
                    one_line(&lock.resource).into_owned(),
                    format!("{} {}", lock.run_id, one_line(&lock.step_key)),
                    lock.tool.clone(),
                    lock.attempt.to_string(),
                    time(lock.acquired_at),
                    lock.waiting.to_string(),
                ]
            }),
        ));
    }
    if !status.tool_limits.is_empty() {
        text.push('\n');
        text.push_str(&limits_table(&status.tool_limits));
    }
    if let Some(shares) = &status.fair_shares {
        text.push('\n');
        text.push_str(&shares_table(shares));
    }
    text
}

/// The fair shares of `kernelctl shares` and `status`: a line naming the label, then SHARE,
/// WEIGHT, QUEUED; `(no <label>)` is the share of runs without the label.
pub fn shares_table(shares: &FairSharesView) -> String {
    let mut text = format!("fair shares by label '{}'\n", one_line(&shares.label));
    text.push_str(&table(
        &["SHARE", "WEIGHT", "QUEUED"],
        shares.shares.iter().map(|share| {
            vec![
                share.value.as_deref().map_or_else(
                    || format!("(no {})", one_line(&shares.label)),
                    |v| one_line(v).into_owned(),
                ),
                share.weight.to_string(),
                share.queued.to_string(),
            ]
        }),
    ));
    text
}

/// The tool limits of `kernelctl limits` and `status`: TOOLS, RATE, BURST, AT ONCE, RUNNING,
/// TOKENS, QUEUED; `-` where a limit sets no such bound.
pub fn limits_table(limits: &[ToolLimitView]) -> String {
    let number = |value: Option<f64>| value.map_or_else(|| NONE.to_owned(), |v| format!("{v:.1}"));
    table(
        &["TOOLS", "RATE", "BURST", "AT ONCE", "RUNNING", "TOKENS", "QUEUED"],
        limits.iter().map(|limit| {
            vec![
                one_line(&limit.tools).into_owned(),
                limit
                    .per_second
                    .map_or_else(|| NONE.to_owned(), |rate| format!("{rate}/s")),
                number(limit.burst),
                limit.at_once.map_or_else(|| NONE.to_owned(), |n| n.to_string()),
                limit.running.to_string(),
                number(limit.tokens),
                limit.queued.to_string(),
            ]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::tests::{sample_run, sample_step, ts};
    use kernel_proto::v1 as pb;

    #[test]
    fn durations_are_humanised() {
        assert_eq!(duration(Duration::from_micros(850)), "850µs");
        assert_eq!(duration(Duration::ZERO), "0µs");
        assert_eq!(duration(Duration::from_millis(12)), "12ms");
        assert_eq!(duration(Duration::from_millis(999)), "999ms");
        assert_eq!(duration(Duration::from_millis(1_000)), "1.0s");
        assert_eq!(duration(Duration::from_millis(1_250)), "1.2s");
        assert_eq!(duration(Duration::from_millis(59_999)), "59.9s");
        assert_eq!(duration(Duration::from_secs(60)), "1m00s");
        assert_eq!(duration(Duration::from_secs(184)), "3m04s");
        assert_eq!(duration(Duration::from_secs(3_599)), "59m59s");
        assert_eq!(duration(Duration::from_secs(3_600 * 2 + 5 * 60 + 59)), "2h05m");
        assert_eq!(duration(Duration::from_secs(86_400 * 3 + 3_600 * 4)), "3d04h");
    }

    #[test]
    fn truncation_counts_characters_not_bytes() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("exactly10!", 10), "exactly10!");
        assert_eq!(truncate("0123456789abc", 10), "0123456789…");
        assert_eq!(truncate("ééééé", 3), "ééé…");
        let long = format!(r#"{{"text":"{}"}}"#, "x".repeat(500));
        let cut = json_cut(&Json::parse(&long).unwrap());
        assert_eq!(cut.chars().count(), JSON_CUT + 1);
        assert!(cut.ends_with('…'));
        assert!(matches!(truncate("abc", 3), Cow::Borrowed(_)));
    }

    #[test]
    fn control_characters_never_break_a_line() {
        assert_eq!(one_line("a\nb\tc"), "a b c");
        assert!(matches!(one_line("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn fingerprints_are_shortened() {
        assert_eq!(short_fingerprint("0123456789abcdef"), "0123456789ab");
        assert_eq!(short_fingerprint("abc"), "abc");
    }

    #[test]
    fn tables_have_a_header_and_no_trailing_spaces() {
        let text = table(
            &["A", "LONG HEADER", "C"],
            [
                vec!["x".into(), "y".into(), "".into()],
                vec!["wide cell".into(), "z".into(), "last".into()],
            ],
        );
        assert_eq!(
            text,
            "A          LONG HEADER  C\n\
             x          y\n\
             wide cell  z            last\n"
        );
    }

    #[test]
    fn runs_table_layout() {
        let run = RunView::from(sample_run());
        let unlimited = RunView::from(pb::Run {
            id: "r2".into(),
            max_tool_calls: 0,
            labels: Default::default(),
            ..sample_run()
        });
        let text = runs_table(&[run, unlimited]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ID"), "{text}");
        assert!(lines[0].contains("LABELS"));
        assert!(lines[1].contains("running"));
        assert!(lines[1].contains(" 3 of 10 "), "{text}");
        assert!(lines[1].contains("2023-11-14T22:13:20Z"));
        assert!(lines[1].contains("2023-11-14T22:14:02Z"));
        assert!(lines[1].ends_with("env=dev,team=travel"));
        assert!(lines[2].contains("running  3  "), "no limit: just the count: {text}");
        assert!(!lines[2].contains("3/"), "{text}");
        assert!(lines[2].ends_with('-'));
    }

    #[test]
    fn a_run_s_budget_shows_each_limit_with_what_it_spent() {
        let run = RunView::from(pb::Run {
            budget: vec![
                pb::BudgetLimit {
                    max_calls: Some(10),
                    max_cost: Some(5.0),
                    set_by: "request".into(),
                    spent_calls: 3,
                    spent_cost: 1.5,
                    ..Default::default()
                },
                pb::BudgetLimit {
                    tools: "payments_*".into(),
                    max_calls: Some(4),
                    set_by: "policy:budgets[1]".into(),
                    spent_calls: 1,
                    ..Default::default()
                },
                pb::BudgetLimit {
                    max_time_ms: Some(600_000),
                    set_by: "request".into(),
                    spent_time_ms: 12_500,
                    reserved_time_ms: 30_000,
                    ..Default::default()
                },
            ],
            budget_under_parent: true,
            ..sample_run()
        });
        assert_eq!(
            budget(&run).as_deref(),
            Some(
                "calls 3 of 10, cost 1.50 of 5.00 (request); on 'payments_*': calls 1 of 4 (policy:budgets[1]); \
                 time 12.5s of 10m00s (30.0s held by running calls) (request); charged to its parent's budget too"
            )
        );
        assert!(
            run_fields(&run).contains("budget:      calls 3 of 10"),
            "{}",
            run_fields(&run)
        );
    }

    #[test]
    fn run_detail_layout() {
        let failed = pb::Step {
            status: pb::StepStatus::Failed as i32,
            output_json: String::new(),
            error: "boom\nstack".into(),
            error_kind: pb::ErrorKind::Fatal as i32,
            tool_version: "2.1.0".into(),
            ..sample_step(0, 2)
        };
        let running = pb::Step {
            status: pb::StepStatus::Running as i32,
            output_json: String::new(),
            finished_at: None,
            lease_expires_at: ts(1_700_000_030, 0),
            arguments_json: format!(r#"{{"blob":"{}"}}"#, "y".repeat(400)),
            ..sample_step(1, 0)
        };
        let detail = RunDetail::try_from(pb::GetRunResponse {
            run: Some(sample_run()),
            steps: vec![running, failed, sample_step(0, 1)],
            ..Default::default()
        })
        .unwrap();
        let text = run_detail(&detail);
        assert!(text.starts_with("run:         0192f0c1-run\n"), "{text}");
        assert!(
            text.contains("tool calls:  3 made, of at most 10 (max_tool_calls)\n"),
            "{text}"
        );
        assert!(!text.contains("budget:"), "no budget covers the run: {text}");
        assert!(text.contains(r#"input:       {"budget":300,"task":"book a flight"}"#));
        assert!(text.contains("output:      -\n"));
        assert!(!text.contains("reason:"));

        let table_start = text.find("KEY").unwrap();
        let table: Vec<&str> = text[table_start..].lines().take(4).collect();
        assert!(table[0].starts_with("KEY    TOOL    VERSION       STATUS"), "{text}");
        assert!(table[1].starts_with("t0/p1 "), "{text}");
        assert!(table[1].contains("0123456789ab"));
        assert!(table[1].contains("1.2s"));
        assert!(table[2].starts_with("t0/p2 "));
        assert!(table[2].contains("2.1.0"));
        assert!(table[3].starts_with("t1/p0 "));
        assert!(table[3].contains(" - "), "{text}");

        assert!(text.contains("\nt0/p1 search (succeeded)\n"));
        assert!(text.contains(r#"  result:           ["AF12","BA7"]"#));
        assert!(text.contains("  error:            fatal: boom\n"), "{text}");
        assert!(text.contains("  trace:\n    stack\n"), "{text}");
        assert!(text.contains("  lease expires:    2023-11-14T22:13:50Z\n"), "{text}");
        assert_eq!(text.matches("lease expires").count(), 1);
        assert!(text.contains("  idempotency key:  0192f0c1-run/t1/p0\n"));
        let blob_line = text.lines().find(|l| l.contains("blob")).unwrap();
        assert!(blob_line.ends_with('…'));
    }

    /// A call the kernel refused or a person rejected shows why in its status, with no error kind,
    /// and the approval's answer on the step; only a tool's own error reads `failed`.
    #[test]
    fn refused_and_rejected_calls_say_why() {
        let settled = |position, outcome: pb::CallOutcome, error: &str| pb::Step {
            status: pb::StepStatus::Failed as i32,
            output_json: String::new(),
            error: error.into(),
            error_kind: pb::ErrorKind::Fatal as i32,
            outcome: outcome as i32,
            ..sample_step(0, position)
        };
        let denied = settled(0, pb::CallOutcome::Denied, "wipe not allowed. reason: never");
        let rejected = pb::Step {
            approval: Some(pb::ApprovalDecision {
                approval_id: "ap-1".into(),
                answer: pb::ApprovalStatus::Rejected as i32,
                decider: "bob".into(),
                reason: "no ticket".into(),
                answered_at: None,
            }),
            ..settled(
                1,
                pb::CallOutcome::Rejected,
                "'refund' was not approved: rejected by bob",
            )
        };
        let broke = settled(2, pb::CallOutcome::ToolError, "disk full");
        let detail = RunDetail::try_from(pb::GetRunResponse {
            run: Some(sample_run()),
            steps: vec![denied, rejected, broke],
            ..Default::default()
        })
        .unwrap();
        let text = run_detail(&detail);
        assert!(text.contains("t0/p0 search (denied)\n"), "{text}");
        assert!(
            text.contains("  error:            wipe not allowed. reason: never\n"),
            "{text}"
        );
        assert!(text.contains("t0/p1 search (rejected)\n"), "{text}");
        assert!(
            text.contains("  approval:         rejected by bob: no ticket\n"),
            "{text}"
        );
        assert!(text.contains("t0/p2 search (failed)\n"), "{text}");
        assert!(text.contains("  error:            fatal: disk full\n"), "{text}");
        let table: Vec<&str> = text[text.find("KEY").unwrap()..].lines().take(4).collect();
        assert!(table[1].contains(" denied "), "{text}");
    }

    #[test]
    fn permissions_say_who_granted_them() {
        let granted = RunView::from(pb::Run {
            permissions: vec!["billing:write".into()],
            permissions_granted_by: "billing-agent".into(),
            ..sample_run()
        });
        let detail = |run: RunView| {
            run_detail(&RunDetail {
                run,
                steps: Vec::new(),
                approvals: Vec::new(),
                manifest: Default::default(),
            })
        };
        let text = detail(granted.clone());
        assert!(
            text.contains("permissions:  billing:write (granted by key billing-agent)\n"),
            "{text}"
        );
        let claimed = RunView {
            permissions_granted_by: None,
            ..granted
        };
        assert!(detail(claimed).contains("(claimed by the run: the kernel has no auth file)"));
        assert!(!detail(RunView::from(sample_run())).contains("permissions:"));
    }

    #[test]
    fn approvals_say_who_may_answer_and_until_when() {
        let approval = |approvers: Vec<String>, expires_at| {
            ApprovalView::from(pb::Approval {
                id: "ap-1".into(),
                run_id: "r1".into(),
                step_key: "t0/p0".into(),
                tool: "refund".into(),
                arguments_json: r#"{"cents":50000}"#.into(),
                status: pb::ApprovalStatus::Pending as i32,
                approvers,
                message: "check the ticket".into(),
                decided_by: "rule:big-refunds".into(),
                expires_at,
                ..Default::default()
            })
        };
        let text = approvals_table(&[
            approval(vec!["payments-oncall".into(), "bob".into()], ts(1_700_003_600, 0)),
            approval(Vec::new(), None),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("APPROVERS") && lines[0].contains("EXPIRES") && lines[0].contains("MESSAGE"));
        assert!(lines[1].contains("payments-oncall,bob"), "{text}");
        assert!(lines[1].contains("2023-11-14T23:13:20Z"), "{text}");
        assert!(lines[1].contains("check the ticket"), "{text}");
        assert!(lines[2].contains(" any ") && lines[2].contains(" never "), "{text}");
    }

    #[test]
    fn a_diff_says_what_capture_withheld() {
        let detail = |capture: pb::Capture| pb::GetRunResponse {
            run: Some(pb::Run {
                capture: capture as i32,
                ..sample_run()
            }),
            ..Default::default()
        };
        let diff = RunDiff::new(&detail(pb::Capture::Io), &detail(pb::Capture::Metadata)).unwrap();
        let text = run_diff(&diff);
        assert!(
            text.contains("\nB captures metadata: its arguments and results are compared by size and hash\n"),
            "{text}"
        );
        assert!(!text.contains("A captures"), "{text}");
        assert!(!text.contains("branch"), "unrelated runs: {text}");
        assert!(text.ends_with("\nno steps recorded in either run\n"), "{text}");
        let text = run_diff(&RunDiff::new(&detail(pb::Capture::None), &detail(pb::Capture::Io)).unwrap());
        assert!(text.contains("\nA captures nothing: "), "{text}");
    }

    #[test]
    fn a_run_without_steps_says_so() {
        let detail = RunDetail::try_from(pb::GetRunResponse {
            run: Some(sample_run()),
            steps: vec![],
            ..Default::default()
        })
        .unwrap();
        assert!(run_detail(&detail).ends_with("\nno steps recorded\n"));
    }

    #[test]
    fn event_lines_align_under_the_header() {
        let event = EventView::from(pb::Event {
            run_id: "r".into(),
            seq: 12,
            r#type: "tool:start".into(),
            schema_version: 1,
            at: ts(1_700_000_000, 7_000_000),
            payload_json: r#"{"tool": "search"}"#.into(),
        });
        let header = events_header();
        let line = event_line(&event);
        assert_eq!(
            line,
            r#"   12  2023-11-14T22:13:20.007Z  tool:start          {"tool":"search"}"#
        );
        assert_eq!(header.find("TYPE"), line.find("tool:start"));
        assert_eq!(header.find("PAYLOAD"), line.find('{'));
    }

    #[test]
    fn progress_lines_show_the_fraction() {
        let progress = ProgressView::from(pb::Progress {
            step_key: "t0/p0".into(),
            tool: "fetch".into(),
            message: "page".into(),
            current: 2,
            total: 5,
            ..Default::default()
        });
        assert!(progress_line(&progress).ends_with("progress            t0/p0 fetch: page (2/5)"));
    }

    #[test]
    fn tools_table_layout() {
        let tool = |name: &str, workers: Vec<String>| {
            ToolView::from(pb::RegisteredTool {
                spec: Some(pb::ToolSpec {
                    name: name.into(),
                    description: format!("{}\nsecond line", "d".repeat(80)),
                    version: "1.0".into(),
                    fingerprint: "fedcba9876543210".into(),
                    options: Some(pb::ToolOptions {
                        risk: pb::RiskLevel::High as i32,
                        idempotency: pb::Idempotency::AtMostOnce as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                workers,
                ..Default::default()
            })
        };
        let text = tools_table(&[
            tool("send_email", vec!["mailer".into(), "backup".into()]),
            tool("search", vec![]),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"));
        assert!(lines[1].contains("fedcba987654 "));
        assert!(lines[1].contains("high"));
        assert!(lines[1].contains("at_most_once"));
        assert!(lines[1].contains("mailer, backup"));
        assert!(lines[2].contains("none connected"));
        assert!(lines[1].ends_with(&format!("{}…", "d".repeat(DESCRIPTION_CUT))));
    }

    #[test]
    fn status_layout() {
        let status = StatusView::from(pb::GetStatusResponse {
            version: "0.1.0".into(),
            started_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            worker_sessions: 2,
            queued_calls: 0,
            leased_calls: 3,
            live_runs: 1,
            resident_bytes: 43_302_912,
            allocated_bytes: 0,
            in_flight_scans: 4,
            lost_calls_found: 0,
            cpu_micros: 1_250_000,
            store_commits: 17,
            store_syncs: 9,
            store_statements: 120,
            disk_write_bytes: 8_388_608,
            log_lines_dropped: 0,
            writes_forwarded: 0,
            writes_applied_for_others: 0,
            resource_locks: vec![pb::ResourceLock {
                resource: "repo:acme/api".into(),
                run_id: "r1".into(),
                step_key: "t0/p0".into(),
                tool: "push".into(),
                attempt: 1,
                acquired_at: None,
                waiting: 2,
            }],
            tool_limits: vec![
                pb::ToolLimitStatus {
                    tools: "payments_*".into(),
                    per_second: Some(10.0),
                    burst: Some(10.0),
                    at_once: Some(4),
                    running: 4,
                    tokens: Some(0.25),
                    queued: 7,
                },
                pb::ToolLimitStatus {
                    tools: "search".into(),
                    at_once: Some(2),
                    ..Default::default()
                },
            ],
            fair_shares: Some(pb::FairShareStatus {
                label: "tenant".into(),
                shares: vec![
                    pb::ShareStatus {
                        value: Some("acme".into()),
                        weight: 4,
                        queued: 0,
                    },
                    pb::ShareStatus {
                        value: None,
                        weight: 1,
                        queued: 12,
                    },
                ],
            }),
        });
        let text = status_text(&status);
        assert!(text.contains("resource locks:    1"), "{text}");
        assert!(text.contains("cpu time:          1.25 s"), "{text}");
        assert!(text.contains("store commits:     17 (9 synced to disk)"), "{text}");
        assert!(text.contains("store statements:  120"), "{text}");
        assert!(text.contains("disk written:      8.0 MiB"), "{text}");
        assert!(text.contains("RESOURCE"), "{text}");
        assert!(text.contains("tool limits:       2"), "{text}");
        let limits: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("TOOLS")).collect();
        assert_eq!(
            limits[1].split_whitespace().collect::<Vec<_>>(),
            ["payments_*", "10/s", "10.0", "4", "4", "0.2", "7"],
            "{text}"
        );
        assert_eq!(
            limits[2].split_whitespace().collect::<Vec<_>>(),
            ["search", NONE, NONE, "2", "0", NONE, "0"],
            "{text}"
        );
        let shares: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("fair shares")).collect();
        assert_eq!(shares[0], "fair shares by label 'tenant'", "{text}");
        assert_eq!(
            shares[1].split_whitespace().collect::<Vec<_>>(),
            ["SHARE", "WEIGHT", "QUEUED"]
        );
        assert_eq!(shares[2].split_whitespace().collect::<Vec<_>>(), ["acme", "4", "0"]);
        assert_eq!(
            shares[3].split_whitespace().collect::<Vec<_>>(),
            ["(no", "tenant)", "1", "12"]
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("repo:acme/api"))
            .expect("a row per lock");
        assert!(
            row.contains("r1 t0/p0") && row.contains("push") && row.trim_end().ends_with('2'),
            "{row}"
        );
        assert!(text.contains("worker sessions:   2"), "{text}");
        assert!(text.contains("resident:          41.3 MiB"), "{text}");
        assert!(text.contains(&format!("allocated:         {NONE}")), "{text}");
        assert!(text.contains("in-flight scans:   4 (0 lost calls found)"), "{text}");
        assert_eq!(bytes(Some(512)), "512 B");
        assert_eq!(bytes(Some(1536)), "1.5 KiB");
    }

    #[test]
    fn workers_table_layout() {
        let worker = WorkerView::from(pb::WorkerInfo {
            session_id: "s-1".into(),
            name: "py-tools".into(),
            tools: (0..10).map(|i| format!("tool_number_{i}")).collect(),
            agents: vec!["triage".into()],
            max_concurrency: 8,
            slots_in_use: 3,
            draining: true,
            connected_at: ts(1_700_000_000, 0),
            last_heartbeat_at: ts(1_700_000_100, 0),
            replica: "01a2332e-20ac-7497-83a8-b8640c6ba534".into(),
        });
        let text = workers_table(&[worker]);
        let row = text.lines().nth(1).unwrap();
        assert!(row.contains("3/8"), "{text}");
        assert!(row.contains(" 0c6ba534 "), "{text}");
        assert!(row.contains("10: tool_number_0, tool_number_1, tool_numbe…"), "{text}");
        assert!(row.contains("1: triage"), "{text}");
        assert!(row.contains("2023-11-14T22:15:00Z"));
        assert!(row.ends_with("yes"));
    }

    #[test]
    fn a_long_trace_shows_its_last_lines_and_says_how_many_went() {
        let message: String = std::iter::once("ValueError: bad".to_owned())
            .chain((1..=50).map(|n| format!("  frame {n}")))
            .collect::<Vec<_>>()
            .join("\n");
        let block = super::trace_block(&message);
        assert!(
            block.starts_with("  trace:\n    ... 10 lines before (--json shows them)\n      frame 11\n"),
            "{block}"
        );
        assert!(block.ends_with("      frame 50\n"), "{block}");
        assert_eq!(super::trace_block("one line only"), "");
    }
}
