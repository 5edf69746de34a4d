//! A run's page: its header, what waits for a person, its subagents, its steps on a timeline (each
//! expandable to its arguments, result and attempts), and its event log, which follows the run
//! live over server-sent events together with the progress of running calls.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use futures_util::StreamExt;
use kernel_proto::v1 as pb;
use kernel_proto::v1::run_service_server::RunService;
use maud::{Markup, html};
use serde::Deserialize;
use tokio_stream::wrappers::ReceiverStream;

use super::run_steps::{self, PageQuery, StepPage};
use super::{Section, actions, admit, approvals, format, layout, refused, request};
use crate::auth::Caller;
use crate::grpc::RunApi;
use crate::http::{Http, session};

/// Events the page shows when it opens; older ones are a `kernelctl runs events` away.
const LOG_TAIL: u64 = 200;
/// Subagent runs, and branches, the page lists.
const MAX_LISTED: u32 = 200;
/// Levels of subagents under the run the page draws.
const MAX_DEPTH: usize = 4;
/// How long the live stream gathers signals into one message, so a busy run costs the browser
/// (and the kernel) a few messages a second, not one per event.
const GATHER: Duration = Duration::from_millis(250);
const GATHER_MAX: usize = 200;

/// Everything the live part of the page shows.
struct Loaded {
    got: pb::GetRunResponse,
    /// The events from where the page's steps begin, to draw their attempts.
    events: Vec<pb::Event>,
    /// Its subagent runs and theirs, each after its parent, with its depth under this run.
    children: Vec<(pb::Run, usize)>,
    /// The branches forked from it.
    branches: Vec<pb::Run>,
    /// The page of steps shown.
    page: usize,
    /// The part of its time axis asked for.
    zoom: Option<super::timeline::Zoom>,
}

impl Loaded {
    fn run(&self) -> &pb::Run {
        self.got.run.as_ref().expect("GetRun always returns its run")
    }

    fn steps_page(&self) -> StepPage<'_> {
        StepPage::of(&self.got.steps, self.page)
    }
}

async fn load(http: &Http, caller: &Option<Caller>, id: &str, query: &PageQuery) -> Result<Loaded, tonic::Status> {
    let (page, zoom) = (query.number()?, query.zoom()?);
    let runs = RunApi(http.kernel.clone());
    let got = runs
        .get_run(request(pb::GetRunRequest { run_id: id.to_owned() }, caller))
        .await?
        .into_inner();
    let run = got.run.as_ref().expect("GetRun always returns its run");
    let shown = StepPage::of(&got.steps, page);
    let events = run_steps::events_for(&runs, caller, run, &shown).await?;
    // The page shown, a page past the last being the last.
    let page = shown.number;
    let children = descendants(&runs, caller, id).await?;
    let branches = listed(
        &runs,
        caller,
        pb::ListRunsRequest {
            forked_from_run_id: id.to_owned(),
            ..Default::default()
        },
    )
    .await?;
    Ok(Loaded {
        got,
        events,
        children,
        branches,
        page,
        zoom,
    })
}

/// The first [`MAX_LISTED`] runs `asked` finds, newest first.
async fn listed(
    runs: &RunApi,
    caller: &Option<Caller>,
    asked: pb::ListRunsRequest,
) -> Result<Vec<pb::Run>, tonic::Status> {
    let asked = pb::ListRunsRequest {
        page_size: MAX_LISTED,
        ..asked
    };
    Ok(runs.list_runs(request(asked, caller)).await?.into_inner().runs)
}

/// The subagent runs under `id`, each followed by its own, depth first, oldest first at each
/// level; at most [`MAX_LISTED`] in all and [`MAX_DEPTH`] levels down.
async fn descendants(runs: &RunApi, caller: &Option<Caller>, id: &str) -> Result<Vec<(pb::Run, usize)>, tonic::Status> {
    let mut tree: Vec<(pb::Run, usize)> = Vec::new();
    let mut pending: Vec<(String, usize)> = vec![(id.to_owned(), 0)];
    while let Some((parent, depth)) = pending.pop() {
        if depth == MAX_DEPTH || tree.len() >= MAX_LISTED as usize {
            continue;
        }
        let asked = pb::ListRunsRequest {
            parent_run_id: parent.clone(),
            ..Default::default()
        };
        let mut children = listed(runs, caller, asked).await?;
        // Listed newest first; a tree reads in the order they were started.
        children.reverse();
        let at = tree
            .iter()
            .position(|(run, _)| run.id == parent)
            .map_or(0, |index| index + 1);
        for (offset, child) in children.into_iter().enumerate() {
            pending.push((child.id.clone(), depth + 1));
            tree.insert(at + offset, (child, depth));
        }
    }
    tree.truncate(MAX_LISTED as usize);
    Ok(tree)
}

fn is_live(run: &pb::Run) -> bool {
    !format::run_ended(run.status)
}

/// Who looks at the page, as its forms need: whether an approval's form asks who answers (no
/// keys), and what the key may do to the run.
#[derive(Clone, Copy)]
struct Viewer {
    ask_decider: bool,
    allowed: actions::Allowed,
}

impl Viewer {
    fn of(http: &Http, headers: &HeaderMap) -> Viewer {
        Viewer {
            ask_decider: !session::required(http),
            allowed: actions::Allowed::of(http, headers),
        }
    }
}

pub async fn page(
    State(http): State<Http>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Response {
    let caller = match admit(&http, &headers, session::READ, &uri.to_string()) {
        Ok(caller) => caller,
        Err(response) => return *response,
    };
    let loaded = match load(&http, &caller, &id, &query).await {
        Ok(loaded) => loaded,
        Err(status) => return refused(status),
    };
    let run = loaded.run();
    let tail = tail(&http, &caller, run).await;
    let tail = match tail {
        Ok(tail) => tail,
        Err(status) => return refused(status),
    };
    let first_shown = tail.first().map_or(run.last_seq + 1, |e| e.seq);
    let body = html! {
        h1 { "Run " code { (run.id) } }
        div #live data-src={ "/runs/" (run.id) "/live" (run_steps::query(loaded.page, loaded.zoom)) } data-live=(is_live(run)) {
            (live(&loaded, Viewer::of(&http, &headers)))
        }
        section.events {
            h2 { "Events" }
            @if first_shown > 1 {
                p.note { "Showing events from " (first_shown) "; earlier ones: " code { "kernelctl runs events " (run.id) } }
            }
            table #events data-run=(run.id) data-next=(run.last_seq + 1) data-live=(is_live(run)) {
                thead { tr { th { "#" } th { "Time" } th { "Type" } th { "Step" } th { "Payload" } } }
                tbody { @for event in &tail { (event_row(event, step_key(event).as_deref())) } }
            }
        }
    };
    let title = format!("Run {}", format::clip(&run.id, 13));
    layout(&title, Section::Runs, caller.is_some(), body).into_response()
}

/// The run's newest events, for the log as the page opens.
async fn tail(http: &Http, caller: &Option<Caller>, run: &pb::Run) -> Result<Vec<pb::Event>, tonic::Status> {
    let from = run.last_seq.saturating_sub(LOG_TAIL - 1).max(1);
    Ok(RunApi(http.kernel.clone())
        .list_run_events(request(
            pb::ListRunEventsRequest {
                run_id: run.id.clone(),
                from_seq: from,
                page_size: LOG_TAIL as u32,
            },
            caller,
        ))
        .await?
        .into_inner()
        .events)
}

/// The part of the page the script fetches again when the run changes.
pub async fn live_part(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Response {
    let caller = match session::authorize(&http, &headers, session::READ) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.plain(),
    };
    match load(&http, &caller, &id, &query).await {
        Ok(loaded) => Html(live(&loaded, Viewer::of(&http, &headers)).into_string()).into_response(),
        Err(status) => crate::http::plain(&status),
    }
}

fn live(loaded: &Loaded, viewer: Viewer) -> Markup {
    let run = loaded.run();
    let waiting: Vec<&pb::Approval> = loaded
        .got
        .approvals
        .iter()
        .filter(|a| a.status == pb::ApprovalStatus::Pending as i32)
        .collect();
    html! {
        (header(run, loaded.got.manifest.as_ref()))
        (actions::run_actions(run, viewer.allowed))
        @if !waiting.is_empty() {
            section.waiting {
                h2 { "Waiting for a person" }
                @for approval in waiting { (approvals::card(approval, viewer.ask_decider, false)) }
            }
        }
        @if !loaded.children.is_empty() {
            section.children {
                h2 { "Subagents" }
                ul.tree { @for (child, depth) in &loaded.children {
                    li data-run=(child.id) style=[(*depth > 0).then(|| format!("margin-left:{}px", 20 * depth))] {
                         @if *depth > 0 { span.nested { "↳ " } }
                         (format::run_link(&child.id)) " " (child.agent) " "
                         span class={ "status " (format::run_status(child.status)) } { (format::run_status(child.status)) }
                         " from step " code { (child.parent_step_key) }
                         @if !child.session_key.is_empty() { " session " code { (child.session_key) } }
                         @if child.suspensions > 0 { " · suspended " (child.suspensions) "×" } }
                } }
            }
        }
        @if !loaded.branches.is_empty() {
            section.branches {
                h2 { "Branches" }
                ul.tree { @for branch in &loaded.branches {
                    li data-run=(branch.id) { (format::run_link(&branch.id)) " "
                         span class={ "status " (format::run_status(branch.status)) } { (format::run_status(branch.status)) }
                         @if !branch.fork_at_step_key.is_empty() { " forked at " code { (branch.fork_at_step_key) } }
                         @else { " forked whole" }
                         " · " a.compare href={ "/compare?a=" (run.id) "&b=" (branch.id) } { "Compare with this run" } }
                } }
            }
        }
        (run_steps::section(
            run,
            (&loaded.steps_page(), &loaded.events, loaded.zoom),
            &loaded.got.approvals,
            (is_live(run), viewer.allowed),
        ))
    }
}

/// Each limit of the run's budget with what it has spent, one a line.
fn budget(run: &pb::Run) -> Markup {
    html! {
        ul.budget {
            @for limit in &run.budget {
                li {
                    @if !limit.tools.is_empty() { "on " code { (limit.tools) } ": " }
                    (spent(limit))
                    @if !limit.set_by.is_empty() { " " span.reason { "(" (limit.set_by) ")" } }
                }
            }
            @if run.budget_under_parent { li { "charged to its parent's budget too" } }
        }
    }
}

/// What one limit has spent of each bound it sets: `calls 3 of 10, time 12.5 s of 600.0 s`.
fn spent(limit: &pb::BudgetLimit) -> String {
    let seconds = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
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
            held => format!(" ({} held by running calls)", seconds(held)),
        };
        parts.push(format!(
            "time {} of {}{held}",
            seconds(limit.spent_time_ms),
            seconds(max)
        ));
    }
    parts.join(", ")
}

fn header(run: &pb::Run, manifest: Option<&pb::RunManifest>) -> Markup {
    let status = format::run_status(run.status);
    html! {
        dl.header {
            dt { "Agent" } dd { (run.agent) @if run.hosted { " " span.tag { "hosted" } } }
            dt { "Status" } dd { span class={ "status " (status) } #run-status { (status) }
                @if !run.reason.is_empty() { " " span.reason { (run.reason) } } }
            dt { "Capture" } dd { (format::capture(run.capture)) }
            dt { "Calls" } dd { (run.tool_calls) @if run.max_tool_calls > 0 { " of at most " (run.max_tool_calls) } }
            dt { "Cost" } dd { (manifest.map_or(0.0, |m| m.total_cost)) }
            @if !run.budget.is_empty() || run.budget_under_parent {
                dt { "Budget" } dd #run-budget { (budget(run)) }
            }
            @if run.hosted {
                dt { "Dispatches" } dd { (run.dispatches) @if run.suspensions > 0 { ", suspended " (run.suspensions) "×" } }
            }
            dt { "Created" } dd { (format::time(&run.created_at)) }
            dt { "Updated" } dd { (format::time(&run.updated_at)) }
            @if !run.labels.is_empty() {
                dt { "Labels" } dd { @for (key, value) in &run.labels { span.label { (key) "=" (value) } " " } }
            }
            @if !run.permissions.is_empty() {
                dt { "Permissions" } dd { (run.permissions.join(", "))
                    @if !run.permissions_granted_by.is_empty() { " (granted by " (run.permissions_granted_by) ")" } }
            }
            @if !run.parent_run_id.is_empty() {
                dt { "Parent" } dd { (format::run_link(&run.parent_run_id)) " step " code { (run.parent_step_key) } }
            }
            @if !run.session_key.is_empty() { dt { "Session" } dd { code { (run.session_key) } } }
            @if !run.forked_from_run_id.is_empty() {
                dt { "Branch of" } dd { (format::run_link(&run.forked_from_run_id))
                    @if !run.fork_at_step_key.is_empty() { " at " code { (run.fork_at_step_key) } }
                    " · " a.compare href={ "/compare?a=" (run.forked_from_run_id) "&b=" (run.id) } { "Compare with it" } }
            }
            @if !run.allow.is_empty() { dt { "Allowed" } dd { (run.allow.join(", ")) } }
            @if !run.trace_id.is_empty() { dt { "Trace" } dd { code #run-trace { (run.trace_id) } } }
        }
        div.io {
            div { h3 { "Input" } (format::json(&run.input_json)) }
            div { h3 { "Output" } (format::json(&run.output_json)) }
        }
    }
}

/// The step an event is about, from its payload.
fn step_key(event: &pb::Event) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(&event.payload_json)
        .ok()?
        .get("step_key")?
        .as_str()
        .map(str::to_owned)
}

fn event_row(event: &pb::Event, step: Option<&str>) -> Markup {
    let step = step.unwrap_or_default();
    html! {
        tr data-seq=(event.seq) {
            td.num { (event.seq) }
            td { (format::time(&event.at)) }
            td { code { (event.r#type) } }
            td { code { (step) } }
            td.payload {
                // One line to scan; opened, the whole payload indented, to read and copy.
                details.payload {
                    summary { code { (format::clip(&event.payload_json, 240)) } }
                    (format::json(&event.payload_json))
                }
            }
        }
    }
}

/// Where the live stream starts.
#[derive(Deserialize)]
pub struct From {
    #[serde(default)]
    from: u64,
}

/// Server-sent events: every few hundred milliseconds while anything happened, one message with
/// the new events' rows (rendered as the page renders them) and the latest progress of each
/// running call; `end` once the run's terminal event has gone out.
pub async fn stream(
    State(http): State<Http>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(from): Query<From>,
) -> Response {
    let caller = match session::authorize(&http, &headers, session::READ) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.plain(),
    };
    let watch = pb::WatchRunEventsRequest {
        run_id: id,
        from_seq: from.from,
        include_progress: true,
    };
    let watched = match RunApi(http.kernel.clone())
        .watch_run_events(request(watch, &caller))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return crate::http::plain(&status),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(4);
    tokio::spawn(forward(watched, tx));
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn forward(
    mut watched: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<pb::WatchRunEventsResponse, tonic::Status>> + Send>,
    >,
    tx: tokio::sync::mpsc::Sender<Result<SseEvent, Infallible>>,
) {
    loop {
        let first = tokio::select! {
            item = watched.next() => item,
            _ = tx.closed() => return,
        };
        let Some(Ok(first)) = first else {
            let _ = tx.send(Ok(SseEvent::default().event("end").data("end"))).await;
            return;
        };
        let mut gathered = Gathered::default();
        gathered.add(first);
        let deadline = tokio::time::Instant::now() + GATHER;
        let mut ended = false;
        while gathered.len() < GATHER_MAX {
            match tokio::time::timeout_at(deadline, watched.next()).await {
                Ok(Some(Ok(item))) => gathered.add(item),
                Ok(_) => {
                    ended = true;
                    break;
                }
                Err(_) => break,
            }
        }
        if tx.send(Ok(SseEvent::default().data(gathered.json()))).await.is_err() {
            return;
        }
        if ended {
            let _ = tx.send(Ok(SseEvent::default().event("end").data("end"))).await;
            return;
        }
    }
}

/// What one live message carries.
#[derive(Default)]
struct Gathered {
    rows: String,
    events: usize,
    next: u64,
    progress: std::collections::BTreeMap<String, pb::Progress>,
}

impl Gathered {
    fn add(&mut self, item: pb::WatchRunEventsResponse) {
        use pb::watch_run_events_response::Item;
        match item.item {
            Some(Item::Event(event)) => {
                self.next = event.seq + 1;
                self.events += 1;
                let key = step_key(&event);
                self.rows.push_str(&event_row(&event, key.as_deref()).into_string());
                // Its result ends what the call reported.
                if let Some(key) = key
                    && event.r#type == "tool:result"
                {
                    self.progress.remove(&key);
                }
            }
            Some(Item::Progress(progress)) => {
                self.progress.insert(progress.step_key.clone(), progress);
            }
            None => {}
        }
    }

    fn len(&self) -> usize {
        self.events + self.progress.len()
    }

    fn json(&self) -> String {
        let progress: Vec<serde_json::Value> = self
            .progress
            .values()
            .map(|p| {
                serde_json::json!({
                    "step_key": p.step_key,
                    "message": p.message,
                    "current": p.current,
                    "total": p.total,
                })
            })
            .collect();
        serde_json::json!({ "rows": self.rows, "events": self.events, "next": self.next, "progress": progress })
            .to_string()
    }
}
