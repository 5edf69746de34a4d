//! `runs start|list|tree|show|events|fork|diff|cancel|delete|prune`.
//!
//! `list` pages with `page_token` until `--limit` runs (or, with `--all`, every page); `events`
//! pages `ListRunEvents` until `next_seq` is 0, or with `--follow` reads `WatchRunEvents` until the
//! kernel ends the stream after the run's terminal event, or until Ctrl-C. `diff` reads both runs
//! with `GetRun` and leaves the aligning to [`crate::diff`].

use kernel_proto::v1::watch_run_events_response::Item;
use kernel_proto::v1::{
    CancelCallRequest, CancelRunRequest, ForkRunRequest, GetRunRequest, ListRunEventsRequest, ListRunsRequest,
    RunStatus, WatchRunEventsRequest,
};
use serde::Serialize;

use super::Output;
use crate::args::{EventsArgs, ForkArgs, ListRunsArgs, MAX_RUNS_PAGE};
use crate::client::{Kernel, unary};
use crate::diff::RunDiff;
use crate::error::CliError;
use crate::render;
use crate::view::{EventView, ProgressView, RunDetail, RunView, StepView};

/// `runs list --json`.
#[derive(Serialize)]
struct RunList {
    runs: Vec<RunView>,
    /// Where the listing stopped; `null` when every matching run was printed.
    next_page_token: Option<String>,
}

/// `runs start`, `runs fork` and `runs cancel` with `--json`.
#[derive(Serialize)]
struct RunDocument {
    run: RunView,
}

/// The time `millis` before now.
fn ago(millis: u64) -> prost_types::Timestamp {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let then = now.saturating_sub(std::time::Duration::from_millis(millis));
    prost_types::Timestamp {
        seconds: then.as_secs() as i64,
        nanos: then.subsec_nanos() as i32,
    }
}

pub async fn list(kernel: &mut Kernel, out: &mut Output<'_>, args: ListRunsArgs) -> Result<(), CliError> {
    let limit = if args.all { usize::MAX } else { args.limit as usize };
    let mut request = ListRunsRequest {
        status: args.status.map_or(RunStatus::Unspecified, RunStatus::from) as i32,
        agent: args.agent.unwrap_or_default(),
        labels: args.labels.iter().map(ToString::to_string).collect(),
        page_size: 0,
        page_token: args.page_token.unwrap_or_default(),
        parent_run_id: args.parent.unwrap_or_default(),
        forked_from_run_id: args.branch_of.unwrap_or_default(),
        tool: args.tool.unwrap_or_default(),
        created_after: args.since.map(ago),
        created_before: None,
    };
    let mut runs = Vec::new();
    loop {
        let wanted = limit.saturating_sub(runs.len());
        request.page_size = u32::try_from(wanted).unwrap_or(MAX_RUNS_PAGE).min(MAX_RUNS_PAGE);
        let page = unary(kernel.runs.list_runs(request.clone())).await?;
        let empty = page.runs.is_empty();
        runs.extend(page.runs.into_iter().map(RunView::from));
        request.page_token = page.next_page_token;
        if request.page_token.is_empty() || empty || runs.len() >= limit {
            break;
        }
    }
    runs.truncate(limit);
    let next_page_token = Some(request.page_token).filter(|token| !token.is_empty());

    if out.is_json() {
        out.document(&RunList { runs, next_page_token })?;
        return Ok(());
    }
    if runs.is_empty() {
        eprintln!("no runs found");
    } else {
        out.text(&render::runs_table(&runs))?;
    }
    if next_page_token.is_some() {
        eprintln!("more runs match: raise --limit or pass --all");
    }
    Ok(())
}

/// Creates a hosted run and prints its id; with `follow`, its events until it ends.
pub async fn start(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    (agent, input, budget, labels): (
        String,
        String,
        Vec<kernel_proto::v1::BudgetLimit>,
        Vec<(String, String)>,
    ),
    follow: bool,
) -> Result<(), CliError> {
    let request = kernel_proto::v1::CreateRunRequest {
        agent,
        input_json: input,
        hosted: true,
        budget,
        labels: labels.into_iter().collect(),
        ..Default::default()
    };
    let response = unary(kernel.runs.create_run(request)).await?;
    let run = RunView::from(
        response
            .run
            .ok_or(CliError::MalformedResponse("CreateRun returned no run"))?,
    );
    let id = run.id.clone();
    if !follow {
        if out.is_json() {
            out.document(&RunDocument { run })?;
        } else {
            out.line(&id)?;
        }
        return Ok(());
    }
    eprintln!("run {id} started");
    let args = EventsArgs {
        id: id.clone(),
        from_seq: 1,
        follow: true,
        progress: false,
    };
    let mut printer = EventPrinter::default();
    follow_events(kernel, out, &mut printer, args).await?;
    let response = unary(kernel.runs.get_run(GetRunRequest { run_id: id.clone() })).await?;
    let run = response
        .run
        .ok_or(CliError::MalformedResponse("GetRun returned no run"))?;
    let status = crate::view::run_status_name(run.status);
    if status == "completed" {
        eprintln!("run {id} completed");
        return Ok(());
    }
    Err(CliError::RunEnded {
        id,
        reason: if run.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", run.reason)
        },
        status,
    })
}

/// The runs under `id` (its subagents, theirs, ...), depth first, oldest child first.
pub async fn tree(kernel: &mut Kernel, out: &mut Output<'_>, id: String) -> Result<(), CliError> {
    let root = unary(kernel.runs.get_run(GetRunRequest { run_id: id })).await?;
    let root = RunView::from(root.run.ok_or(CliError::MalformedResponse("GetRun returned no run"))?);
    let mut nodes = Vec::new();
    let mut stack = vec![(0usize, root)];
    while let Some((depth, run)) = stack.pop() {
        let mut children = Vec::new();
        let mut request = ListRunsRequest {
            parent_run_id: run.id.clone(),
            page_size: MAX_RUNS_PAGE,
            ..Default::default()
        };
        loop {
            let page = unary(kernel.runs.list_runs(request.clone())).await?;
            children.extend(page.runs.into_iter().map(RunView::from));
            if page.next_page_token.is_empty() {
                break;
            }
            request.page_token = page.next_page_token;
        }
        // Listed newest first; the stack pops the oldest first.
        stack.extend(children.into_iter().map(|child| (depth + 1, child)));
        nodes.push((depth, run));
    }
    if out.is_json() {
        #[derive(serde::Serialize)]
        struct Node {
            depth: usize,
            run: RunView,
        }
        let runs: Vec<Node> = nodes.into_iter().map(|(depth, run)| Node { depth, run }).collect();
        out.document(&serde_json::json!({ "runs": runs }))?;
    } else {
        out.text(&render::run_tree(&nodes))?;
    }
    Ok(())
}

pub async fn show(kernel: &mut Kernel, out: &mut Output<'_>, id: String) -> Result<(), CliError> {
    let response = unary(kernel.runs.get_run(GetRunRequest { run_id: id })).await?;
    let detail = RunDetail::try_from(response)?;
    if out.is_json() {
        out.document(&detail)?;
    } else {
        out.text(&render::run_detail(&detail))?;
    }
    Ok(())
}

/// Makes a branch of a recorded run and prints its id.
pub async fn fork(kernel: &mut Kernel, out: &mut Output<'_>, args: ForkArgs) -> Result<(), CliError> {
    let request = ForkRunRequest {
        run_id: args.id,
        at_step_key: args.at_step_key.unwrap_or_default(),
        input_json: args.input.unwrap_or_default(),
        set_results: args.set_results.into_iter().collect(),
        labels: args.labels.into_iter().collect(),
        idempotency_key: args.idempotency_key.unwrap_or_default(),
        budget: args.budget,
    };
    let response = unary(kernel.runs.fork_run(request)).await?;
    let run = RunView::from(
        response
            .run
            .ok_or(CliError::MalformedResponse("ForkRun returned no run"))?,
    );
    if !response.created {
        eprintln!("run {} is the branch forked earlier with this idempotency key", run.id);
    }
    if out.is_json() {
        out.document(&RunDocument { run })?;
    } else {
        out.line(&run.id)?;
    }
    Ok(())
}

/// Both runs' steps side by side, aligned by step key.
pub async fn diff(kernel: &mut Kernel, out: &mut Output<'_>, (a, b): (String, String)) -> Result<(), CliError> {
    let a = unary(kernel.runs.get_run(GetRunRequest { run_id: a })).await?;
    let b = unary(kernel.runs.get_run(GetRunRequest { run_id: b })).await?;
    let diff = RunDiff::new(&a, &b)?;
    if out.is_json() {
        out.document(&diff)?;
    } else {
        out.text(&render::run_diff(&diff))?;
    }
    Ok(())
}

pub async fn cancel(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    id: String,
    reason: Option<String>,
) -> Result<(), CliError> {
    let request = CancelRunRequest {
        run_id: id,
        reason: reason.unwrap_or_default(),
    };
    let response = unary(kernel.runs.cancel_run(request)).await?;
    let run = RunView::from(
        response
            .run
            .ok_or(CliError::MalformedResponse("CancelRun returned no run"))?,
    );
    if out.is_json() {
        out.document(&RunDocument { run })?;
    } else {
        out.line(&run.status)?;
    }
    Ok(())
}

/// `runs cancel-call` with `--json`.
#[derive(Serialize)]
struct StepDocument {
    step: StepView,
}

pub async fn cancel_call(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    run: String,
    step: String,
    reason: Option<String>,
) -> Result<(), CliError> {
    let request = CancelCallRequest {
        run_id: run,
        step_key: step,
        reason: reason.unwrap_or_default(),
    };
    let response = unary(kernel.calls.cancel_call(request)).await?;
    let step = StepView::from(
        response
            .step
            .ok_or(CliError::MalformedResponse("CancelCall returned no step"))?,
    );
    if out.is_json() {
        out.document(&StepDocument { step })?;
    } else {
        out.line(&step.status)?;
    }
    Ok(())
}

/// What `runs delete` and `runs prune` removed, for `--json`.
#[derive(Serialize)]
struct DeletionView {
    runs: u64,
    events: u64,
    steps: u64,
    approvals: u64,
    cache_entries: u64,
}

impl From<Option<kernel_proto::v1::RunDeletion>> for DeletionView {
    fn from(deleted: Option<kernel_proto::v1::RunDeletion>) -> Self {
        let d = deleted.unwrap_or_default();
        DeletionView {
            runs: d.runs,
            events: d.events,
            steps: d.steps,
            approvals: d.approvals,
            cache_entries: d.cache_entries,
        }
    }
}

fn print_deletion(out: &mut Output<'_>, deleted: DeletionView) -> Result<(), CliError> {
    if out.is_json() {
        out.document(&deleted)?;
    } else {
        let runs = if deleted.runs == 1 { "run" } else { "runs" };
        out.line(&format!(
            "deleted {} {runs} ({} events, {} steps, {} approvals, {} cache entries)",
            deleted.runs, deleted.events, deleted.steps, deleted.approvals, deleted.cache_entries
        ))?;
    }
    Ok(())
}

pub async fn delete(kernel: &mut Kernel, out: &mut Output<'_>, id: String) -> Result<(), CliError> {
    let request = kernel_proto::v1::DeleteRunRequest { run_id: id };
    let response = unary(kernel.admin.delete_run(request)).await?;
    print_deletion(out, DeletionView::from(response.deleted))
}

pub async fn prune(kernel: &mut Kernel, out: &mut Output<'_>, min_age_ms: u64) -> Result<(), CliError> {
    let request = kernel_proto::v1::PruneRunsRequest { min_age_ms };
    let response = unary(kernel.admin.prune_runs(request)).await?;
    print_deletion(out, DeletionView::from(response.deleted))
}

pub async fn events(kernel: &mut Kernel, out: &mut Output<'_>, args: EventsArgs) -> Result<(), CliError> {
    let mut printer = EventPrinter::default();
    if args.follow {
        follow_events(kernel, out, &mut printer, args).await?;
    } else {
        list_events(kernel, out, &mut printer, args).await?;
    }
    if printer.printed == 0 && !out.is_json() {
        eprintln!("no events");
    }
    if printer.cut > 0 {
        eprintln!(
            "{} payloads longer than {} characters were cut (…); --json shows them whole",
            printer.cut,
            render::JSON_CUT
        );
    }
    Ok(())
}

async fn list_events(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    printer: &mut EventPrinter,
    args: EventsArgs,
) -> Result<(), CliError> {
    let mut from_seq = args.from_seq;
    loop {
        let request = ListRunEventsRequest {
            run_id: args.id.clone(),
            from_seq,
            page_size: 0,
        };
        let page = unary(kernel.runs.list_run_events(request)).await?;
        let empty = page.events.is_empty();
        for event in page.events {
            printer.event(out, EventView::from(event))?;
        }
        // A page that does not move forward would repeat forever; the log has nothing more.
        if page.next_seq == 0 || page.next_seq <= from_seq || empty {
            return Ok(());
        }
        from_seq = page.next_seq;
    }
}

/// Follows a run's events until it ends (or Ctrl-C). When the kernel goes away meanwhile (it
/// restarts, or drains to stop), says so on stderr, reconnects with a backoff and resumes after
/// the last event printed, so nothing is printed twice or skipped.
async fn follow_events(
    kernel: &mut Kernel,
    out: &mut Output<'_>,
    printer: &mut EventPrinter,
    args: EventsArgs,
) -> Result<(), CliError> {
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut interrupt_armed = true;
    let mut from_seq = args.from_seq;
    let mut away: Option<Backoff> = None;
    loop {
        let request = WatchRunEventsRequest {
            run_id: args.id.clone(),
            from_seq,
            include_progress: args.progress,
        };
        let opened = tokio::select! {
            installed = &mut interrupt, if interrupt_armed => {
                if installed.is_ok() {
                    return Ok(());
                }
                interrupt_armed = false;
                continue;
            }
            opened = kernel.runs.watch_run_events(request) => opened,
        };
        let broke = match opened {
            Ok(stream) => {
                if away.take().is_some() {
                    eprintln!("reconnected; following from event {from_seq}");
                }
                let mut stream = stream.into_inner();
                loop {
                    let message = tokio::select! {
                        installed = &mut interrupt, if interrupt_armed => {
                            if installed.is_ok() {
                                return Ok(());
                            }
                            // No signal handler: follow until the stream ends instead.
                            interrupt_armed = false;
                            continue;
                        }
                        message = stream.message() => message,
                    };
                    match message {
                        Ok(None) => return Ok(()),
                        Ok(Some(response)) => match response.item {
                            Some(Item::Event(event)) => {
                                from_seq = event.seq + 1;
                                printer.event(out, EventView::from(event))?;
                            }
                            Some(Item::Progress(progress)) => printer.progress(out, ProgressView::from(progress))?,
                            // An item kind this client does not know yet: nothing to print.
                            None => {}
                        },
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        if !went_away(&broke) {
            return Err(broke.into());
        }
        let backoff = away.get_or_insert_with(|| {
            eprintln!(
                "the kernel went away ({}); reconnecting to follow from event {from_seq}",
                broke.message()
            );
            Backoff::default()
        });
        tokio::select! {
            installed = &mut interrupt, if interrupt_armed => {
                if installed.is_ok() {
                    return Ok(());
                }
                interrupt_armed = false;
            }
            _ = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

/// Whether a follow's error says the kernel went away (restarting, draining, unreachable) rather
/// than refused the request.
fn went_away(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown)
}

/// Waits between reconnections: 100 ms doubling to 2 s.
struct Backoff(std::time::Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(std::time::Duration::from_millis(100))
    }
}

impl Backoff {
    fn next(&mut self) -> std::time::Duration {
        let now = self.0;
        self.0 = (self.0 * 2).min(std::time::Duration::from_secs(2));
        now
    }
}

/// Prints events and progress as lines (header before the first) or as NDJSON.
#[derive(Default)]
struct EventPrinter {
    printed: usize,
    /// Payloads shown cut, to say where the whole ones are.
    cut: usize,
}

impl EventPrinter {
    fn event(&mut self, out: &mut Output<'_>, event: EventView) -> std::io::Result<()> {
        if out.is_json() {
            out.json_line(&event)?;
        } else {
            self.header(out)?;
            out.line(&render::event_line(&event))?;
            if render::is_cut(&event.payload) {
                self.cut += 1;
            }
        }
        self.printed += 1;
        Ok(())
    }

    fn progress(&mut self, out: &mut Output<'_>, progress: ProgressView) -> std::io::Result<()> {
        if out.is_json() {
            out.json_line(&progress)?;
        } else {
            self.header(out)?;
            out.line(&render::progress_line(&progress))?;
        }
        self.printed += 1;
        Ok(())
    }

    fn header(&self, out: &mut Output<'_>) -> std::io::Result<()> {
        if self.printed == 0 {
            out.line(&render::events_header())?;
        }
        Ok(())
    }
}
