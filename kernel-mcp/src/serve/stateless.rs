//! Calls at MCP 2026-07-28, which has no sessions: every request stands alone, so where a call is
//! recorded comes from the request's `_meta`, and all that lasts between requests is in the
//! kernel's log. That is what lets any replica answer any request of a run, and a re-issued call
//! find the one it repeats.
//!
//! - `kernel/run` absent: the call is the only call of a run of its own, completed once the call
//!   settles. `"new"`: a new run that stays open for the client's next calls; a run id: that run.
//!   Every result says where its call is recorded (`_meta` `kernel/run` and `kernel/step`).
//! - `kernel/idempotency-key`: the call's identity. The same call re-issued with the same key
//!   (after a broken stream, or a client's crash) gets the recorded result or joins the call in
//!   flight; nothing runs twice. Without a key a client's cancel (its stream closed) cancels the
//!   call; with one, over HTTP, the call goes on and waits to be re-issued (a closed stream may be
//!   a lost connection), while over stdio a cancel cancels it.
//! - `kernel/end-run: true` completes a named run once this call settles.

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use worker_sdk::proto::canonical;
use worker_sdk::proto::v1 as pb;
use worker_sdk::{AgentClient, AgentError, Call, RunHandle, TurnItem};

use super::follow::{AtPark, Followed, cancel_call, follow};
use super::results::{META_RUN, call_refusal, from_outcome, from_step, kernel_error, placed, records_call, refused};
use super::{Bridge, approval, tasks};

/// `_meta` key of a request: the call's identity, for re-issuing it.
pub(super) const META_IDEMPOTENCY_KEY: &str = "kernel/idempotency-key";
/// `_meta` key of a request: complete the named run once this call settles.
pub(super) const META_END_RUN: &str = "kernel/end-run";
/// `_meta` key of a request that makes a run: the run's budget, one limit or a list of them.
pub(super) const META_BUDGET: &str = "kernel/budget";
/// The longest idempotency key (the kernel's limit on a call id).
const MAX_KEY: usize = 128;

/// A run's input says what it is for: `"mcp_run": "call"`, one call's own run (completed when
/// the call settles), or `"open"`, a run left open for the calls that name it.
const OWN_RUN: &str = "call";
const OPEN_RUN: &str = "open";

/// Whether `run` is one call's own run, as its input says.
pub(super) fn is_own(run: &pb::Run) -> bool {
    serde_json::from_str::<Value>(&run.input_json).is_ok_and(|input| input["mcp_run"] == OWN_RUN)
}

/// Which run a request's call goes into.
#[derive(Debug, PartialEq)]
enum RunChoice {
    /// A run of its own, completed when the call settles.
    Own,
    /// A new run, left open for the client's next calls.
    New,
    /// A run the client names.
    Named(String),
}

/// What a request's `_meta` asks of the kernel.
#[derive(Debug, PartialEq)]
struct Directives {
    run: RunChoice,
    key: Option<String>,
    end_run: bool,
    /// The budget of the run the request makes.
    budget: Vec<worker_sdk::BudgetLimit>,
}

/// A `kernel/budget` directive: one limit (`{"max_calls": 10, "max_cost": 5.0, "max_time_ms":
/// 600000, "tools": "pay*"}`)
/// or a list of them. Their sense (a limit that limits something, a cost >= 0, a glob that
/// compiles) is the kernel's to check.
fn budget(value: &Value) -> Result<Vec<worker_sdk::BudgetLimit>, String> {
    let limits = match value {
        Value::Array(limits) => limits.as_slice(),
        one => std::slice::from_ref(one),
    };
    limits
        .iter()
        .map(|limit| {
            let Value::Object(fields) = limit else {
                return Err("must be a limit such as {\"max_cost\": 5.0}, or a list of them".to_owned());
            };
            let mut read = worker_sdk::BudgetLimit::default();
            for (name, value) in fields {
                match (name.as_str(), value) {
                    ("max_calls", value) => {
                        read.max_calls = Some(value.as_u64().ok_or("max_calls must be a whole number >= 0")?);
                    }
                    ("max_cost", value) => read.max_cost = Some(value.as_f64().ok_or("max_cost must be a number")?),
                    ("max_time_ms", value) => {
                        let ms = value
                            .as_u64()
                            .ok_or("max_time_ms must be a whole number of milliseconds >= 0")?;
                        read.max_time = Some(std::time::Duration::from_millis(ms));
                    }
                    ("tools", Value::String(glob)) => read.tools = Some(glob.clone()),
                    ("tools", _) => return Err("tools must be a glob over tool names".to_owned()),
                    (other, _) => {
                        return Err(format!(
                            "unknown key '{other}' (expected max_calls, max_cost, max_time_ms or tools)"
                        ));
                    }
                }
            }
            Ok(read)
        })
        .collect()
}

/// Reads the kernel's keys of a request's `_meta`; a malformed one is `invalid params` naming it.
fn directives(meta: &JsonObject) -> Result<Directives, ErrorData> {
    let invalid = |key: &str, why: &str| ErrorData::invalid_params(format!("_meta.{key}: {why}"), None);
    let run = match meta.get(META_RUN) {
        None | Some(Value::Null) => RunChoice::Own,
        Some(Value::String(run)) if run == "new" => RunChoice::New,
        Some(Value::String(run)) if !run.trim().is_empty() => RunChoice::Named(run.clone()),
        Some(_) => {
            return Err(invalid(
                META_RUN,
                "must be \"new\" or the id of a run this server returned",
            ));
        }
    };
    let key = match meta.get(META_IDEMPOTENCY_KEY) {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) if !key.is_empty() && key.len() <= MAX_KEY && !key.chars().any(char::is_control) => {
            Some(key.clone())
        }
        Some(_) => {
            return Err(invalid(
                META_IDEMPOTENCY_KEY,
                &format!("must be a string of 1 to {MAX_KEY} printable characters"),
            ));
        }
    };
    let end_run = match meta.get(META_END_RUN) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(end)) => *end,
        Some(_) => return Err(invalid(META_END_RUN, "must be true or false")),
    };
    if end_run && !matches!(run, RunChoice::Named(_)) {
        return Err(invalid(
            META_END_RUN,
            "ends a run named in _meta.kernel/run; a call without one ends its own run anyway",
        ));
    }
    let budget = match meta.get(META_BUDGET) {
        None | Some(Value::Null) => Vec::new(),
        Some(_) if matches!(run, RunChoice::Named(_)) => {
            return Err(invalid(
                META_BUDGET,
                "is set when a run is made (with _meta.kernel/run \"new\", or for a call's own run), not on a run named",
            ));
        }
        Some(value) => budget(value).map_err(|why| invalid(META_BUDGET, &why))?,
    };
    Ok(Directives {
        run,
        key,
        end_run,
        budget,
    })
}

/// Where a call is recorded, and what to do with its run once it settles.
pub(super) struct Place {
    pub(super) run: RunHandle,
    pub(super) turn: u32,
    pub(super) call_id: String,
    /// The run is the call's own: completed when the call settles.
    pub(super) own: bool,
    /// The client gave the call an idempotency key: it may re-issue it.
    pub(super) keyed: bool,
}

impl Place {
    pub(super) fn step_key(&self) -> String {
        canonical::call_step_key(self.turn, 0, Some(&self.call_id))
    }

    fn submit(
        &self,
        name: &str,
        arguments: &Value,
    ) -> impl futures_util::Stream<Item = Result<TurnItem, AgentError>> + Send + 'static {
        self.run.submit_turn(
            self.turn,
            vec![Call::new(name, arguments.clone()).with_id(&self.call_id)],
        )
    }

    /// The call settled: its own run completes, and a named one when the client asked.
    async fn settled(&self, end_run: bool) {
        if self.own || end_run {
            complete(&self.run, &self.step_key()).await;
        }
    }

    /// The request ends before its call settles (it waits for a person, or the client left):
    /// its own run is completed once it settles, by a watcher that joins it.
    fn finish_later(&self, name: &str, arguments: &Value) {
        if !self.own {
            return;
        }
        let items = self.submit(name, arguments);
        let (run, key) = (self.run.clone(), self.step_key());
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut items = std::pin::pin!(items);
            while let Some(item) = items.next().await {
                match item {
                    Ok(TurnItem::Result(_)) => return complete(&run, &key).await,
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(run_id = run.id(), step_key = key, %error, "mcp call's run left open");
                        return;
                    }
                }
            }
        });
    }
}

/// Completes a call's run; one completed already (by another request) stays as it is.
pub(super) async fn complete(run: &RunHandle, step_key: &str) {
    match run.complete(json!({"mcp_call": step_key})).await {
        Ok(()) => tracing::debug!(run_id = run.id(), "mcp call's run completed"),
        Err(AgentError::Status(status)) if status.code() == tonic::Code::FailedPrecondition => {}
        Err(error) => tracing::warn!(run_id = run.id(), %error, "mcp call's run not completed"),
    }
}

/// Where a fresh request's call goes: a place to submit it, or its recorded result when the run
/// it repeats is over.
enum Placed {
    At(Box<Place>),
    Recorded(CallToolResult),
}

/// Serves one `tools/call` at 2026-07-28.
pub(super) async fn call(
    client: &AgentClient,
    bridge: &Bridge,
    bearer: Option<&str>,
    mut request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let directives = directives(&context.meta)?;
    let name = request.name.to_string();
    let arguments = Value::Object(request.arguments.take().unwrap_or_default());
    let (place, asked_before) = match &request.request_state {
        // The retry of an `input_required` result: the call it asked about, and the answer.
        Some(state) => {
            let state = approval::State::decode(state)?;
            let place = approval::resume(client, &state, &name, &arguments).await?;
            approval::answer_retry(client, &state, request.input_responses.as_ref(), context).await;
            (place, true)
        }
        None => match place(client, bridge, bearer, &directives, &name, &arguments, context).await? {
            Placed::At(place) => (*place, false),
            Placed::Recorded(result) => return Ok(result.into()),
        },
    };
    let call = Underway {
        client,
        place,
        name,
        arguments,
        context,
        takes_tasks: tasks::client_takes_tasks(context),
    };
    let followed = call.follow(asked_before).await;
    call.respond(followed, directives.end_run).await
}

/// A request's call, recorded at `place`, as the request follows it.
struct Underway<'a> {
    client: &'a AgentClient,
    place: Place,
    name: String,
    arguments: Value,
    context: &'a RequestContext<RoleServer>,
    /// The request declared the tasks extension.
    takes_tasks: bool,
}

impl Underway<'_> {
    /// Follows the call until it settles, parks for a person (when the client can be asked, as
    /// a form or as a task, and was not asked already), or the client goes; `None` when it is
    /// still going after [`tasks::TASK_AFTER`], for a client that takes tasks.
    async fn follow(&self, asked_before: bool) -> Option<Result<Followed, AgentError>> {
        let context = self.context;
        let can_ask = !asked_before && approval::client_can_answer(context);
        let at_park = if can_ask || self.takes_tasks {
            AtPark::Stop
        } else {
            AtPark::Wait
        };
        let following = follow(self.place.submit(&self.name, &self.arguments), context, at_park);
        if !self.takes_tasks {
            return Some(following.await);
        }
        // A call that is slow becomes a task: the client polls the log instead of holding on.
        tokio::time::timeout(tasks::TASK_AFTER, following).await.ok()
    }

    /// The request's answer for how following the call ended (`None`: it is slow).
    async fn respond(
        &self,
        followed: Option<Result<Followed, AgentError>>,
        end_run: bool,
    ) -> Result<CallToolResponse, ErrorData> {
        let place = &self.place;
        let Some(followed) = followed else {
            return self.as_task().await;
        };
        match followed {
            Ok(Followed::Settled(outcome)) => {
                place.settled(end_run).await;
                Ok(placed(from_outcome(outcome), place.run.id(), &place.step_key()).into())
            }
            Ok(Followed::Parked(_)) if self.takes_tasks => self.as_task().await,
            Ok(Followed::Parked(asked)) => {
                place.finish_later(&self.name, &self.arguments);
                Ok(approval::ask(self.client, place, &asked).await.into())
            }
            // Over HTTP a closed stream is both a cancel and what a lost connection looks like, so
            // a call the client can re-issue goes on; over stdio a cancel is only ever a cancel.
            Ok(Followed::Left) if place.keyed && over_http(self.context) => {
                tracing::debug!(
                    run_id = place.run.id(),
                    step_key = place.step_key(),
                    "mcp client left; its call goes on"
                );
                place.finish_later(&self.name, &self.arguments);
                Ok(refused("the client left; the call goes on and answers its re-issue".to_owned()).into())
            }
            Ok(Followed::Left) => {
                cancel_call(&place.run, &place.step_key(), "cancelled by the MCP client").await;
                place.settled(false).await;
                Ok(refused("cancelled by the client".to_owned()).into())
            }
            Err(error) => {
                // A refused turn writes nothing, so a run made for the call holds no call: it
                // fails with the reason. (The kernel gone away is no refusal: its call may be in
                // flight.)
                if place.own && refused_outright(&error) {
                    let _ = place.run.fail(format!("the MCP call was refused: {error}")).await;
                }
                Ok(call_refusal(error)?.into())
            }
        }
    }

    /// The call, which goes on in the kernel, as a task for the client to poll.
    async fn as_task(&self) -> Result<CallToolResponse, ErrorData> {
        let place = &self.place;
        place.finish_later(&self.name, &self.arguments);
        let task = tasks::created(self.client, place.run.id(), &place.step_key()).await?;
        tracing::debug!(task_id = task.task.task_id, "mcp call returned as a task");
        Ok(CallToolResponse::Task(task))
    }
}

/// Whether the request came over Streamable HTTP (not stdio).
fn over_http(context: &RequestContext<RoleServer>) -> bool {
    context.extensions.get::<http::request::Parts>().is_some()
}

/// Whether the kernel refused a turn outright (it recorded nothing), rather than going away.
fn refused_outright(error: &AgentError) -> bool {
    match error {
        AgentError::Status(status) => matches!(
            status.code(),
            tonic::Code::InvalidArgument
                | tonic::Code::FailedPrecondition
                | tonic::Code::PermissionDenied
                | tonic::Code::ResourceExhausted
                | tonic::Code::AlreadyExists
                | tonic::Code::NotFound
        ),
        AgentError::ConcurrentCallId(_) => true,
        _ => false,
    }
}

/// Finds or makes the run a fresh request's call goes into.
async fn place(
    client: &AgentClient,
    bridge: &Bridge,
    bearer: Option<&str>,
    directives: &Directives,
    name: &str,
    arguments: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<Placed, ErrorData> {
    let own = directives.run == RunChoice::Own;
    let run = match &directives.run {
        RunChoice::Own | RunChoice::New => {
            let new = new_run(bridge, bearer, directives, context);
            client.create_run(new).await.map_err(kernel_error)?
        }
        RunChoice::Named(id) => client.run(id.clone()),
    };
    let place = Place {
        run,
        turn: 0,
        call_id: directives
            .key
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        own,
        keyed: directives.key.is_some(),
    };
    if place.run.created() {
        return Ok(Placed::At(Box::new(place)));
    }
    located(place, name, arguments).await
}

/// The run a call without a named run makes: its own, or one left open (`"new"`), agent the
/// client's name; with an idempotency key, one the same key finds again.
fn new_run(
    bridge: &Bridge,
    bearer: Option<&str>,
    directives: &Directives,
    context: &RequestContext<RoleServer>,
) -> worker_sdk::NewRun {
    let own = directives.run == RunChoice::Own;
    let (client_name, version) = context
        .client_info()
        .map(|info| (info.name, info.version))
        .unwrap_or_default();
    let kind = if own { OWN_RUN } else { OPEN_RUN };
    let mut new = bridge.new_run(
        &client_name,
        json!({"mcp_client": {"name": client_name, "version": version}, "mcp_run": kind}),
    );
    new.budget.extend(directives.budget.iter().cloned());
    match &directives.key {
        Some(key) => new.idempotency_key(run_key(bearer, &client_name, own, key)),
        None => new,
    }
}

/// Where a call goes in a run that was there before the request: at the turn of the call its id
/// recorded, else at the run's next turn; or, when the run is over, the call's recorded result.
async fn located(mut place: Place, name: &str, arguments: &Value) -> Result<Placed, ErrorData> {
    let snapshot = place.run.get().await.map_err(kernel_error)?;
    let step_key = place.step_key();
    let Some(step) = snapshot.steps.iter().find(|step| step.step_key == step_key) else {
        place.turn = snapshot.steps.iter().map(|step| step.turn + 1).max().unwrap_or(0);
        return Ok(Placed::At(Box::new(place)));
    };
    let finished = pb::RunStatus::try_from(snapshot.run.status).is_ok_and(|status| {
        matches!(
            status,
            pb::RunStatus::Completed | pb::RunStatus::Failed | pb::RunStatus::Cancelled
        )
    });
    match from_step(step) {
        // A finished run takes no turn, not even a replay: its record answers.
        Some(result) if finished => {
            let result = repeated(step, name, arguments).unwrap_or(result);
            Ok(Placed::Recorded(placed(result, place.run.id(), &step_key)))
        }
        _ => {
            place.turn = step.turn;
            Ok(Placed::At(Box::new(place)))
        }
    }
}

/// The refusal of a re-issued call that is not the call its key recorded, as the kernel words a
/// replay that changed.
fn repeated(step: &pb::Step, name: &str, arguments: &Value) -> Option<CallToolResult> {
    (!records_call(step, name, arguments)).then(|| {
        refused(format!(
            "replay_input_changed: the call recorded as {} is '{}' with other arguments; give a new call a new \
             idempotency key",
            step.step_key, step.tool
        ))
    })
}

/// The idempotency key of the run a keyed call makes: the client's key, scoped to the bearer
/// that sent it and the client's name, so two clients' keys never meet in one run.
fn run_key(bearer: Option<&str>, client: &str, own: bool, key: &str) -> String {
    let mut hash = Sha256::new();
    for part in [bearer.unwrap_or_default(), client, if own { "own" } else { "new" }, key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest.iter().take(16).map(|byte| format!("{byte:02x}")).collect();
    format!("mcp:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: Value) -> JsonObject {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn a_request_s_meta_names_its_run_and_its_identity() {
        assert_eq!(
            directives(&meta(json!({}))).unwrap(),
            Directives {
                run: RunChoice::Own,
                key: None,
                end_run: false,
                budget: Vec::new(),
            }
        );
        assert_eq!(
            directives(&meta(json!({"kernel/run": "new", "kernel/idempotency-key": "k1"}))).unwrap(),
            Directives {
                run: RunChoice::New,
                key: Some("k1".into()),
                end_run: false,
                budget: Vec::new(),
            }
        );
        assert_eq!(
            directives(&meta(json!({"kernel/run": "r1", "kernel/end-run": true}))).unwrap(),
            Directives {
                run: RunChoice::Named("r1".into()),
                key: None,
                end_run: true,
                budget: Vec::new(),
            }
        );
        let budgeted = directives(&meta(json!({
            "kernel/run": "new",
            "kernel/budget": [{"max_cost": 5.0}, {"tools": "pay*", "max_calls": 2}],
        })))
        .unwrap();
        assert_eq!(
            budgeted.budget,
            [
                worker_sdk::BudgetLimit::cost(5.0),
                worker_sdk::BudgetLimit::calls(2).on("pay*")
            ]
        );
        let one = directives(&meta(json!({"kernel/budget": {"max_calls": 3, "max_time_ms": 60000}}))).unwrap();
        assert_eq!(
            one.budget,
            [worker_sdk::BudgetLimit::calls(3).and_time(std::time::Duration::from_secs(60))]
        );
    }

    #[test]
    fn a_malformed_directive_is_refused_naming_its_key() {
        for (value, key) in [
            (json!({"kernel/run": 7}), "_meta.kernel/run"),
            (json!({"kernel/run": " "}), "_meta.kernel/run"),
            (json!({"kernel/idempotency-key": ""}), "_meta.kernel/idempotency-key"),
            (
                json!({"kernel/idempotency-key": "x".repeat(129)}),
                "_meta.kernel/idempotency-key",
            ),
            (
                json!({"kernel/idempotency-key": "a\nb"}),
                "_meta.kernel/idempotency-key",
            ),
            (
                json!({"kernel/end-run": "yes", "kernel/run": "r1"}),
                "_meta.kernel/end-run",
            ),
            (json!({"kernel/end-run": true}), "_meta.kernel/end-run"),
            (json!({"kernel/budget": 5}), "_meta.kernel/budget"),
            (json!({"kernel/budget": {"max_calls": -1}}), "_meta.kernel/budget"),
            (json!({"kernel/budget": {"per_day": 1}}), "_meta.kernel/budget"),
            (
                json!({"kernel/run": "r1", "kernel/budget": {"max_calls": 1}}),
                "_meta.kernel/budget",
            ),
        ] {
            let error = directives(&meta(value.clone())).unwrap_err();
            assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{value}");
            assert!(error.message.starts_with(key), "{value}: {}", error.message);
        }
    }

    #[test]
    fn a_key_s_run_belongs_to_its_bearer_and_client() {
        let key = run_key(Some("secret"), "claude", true, "k1");
        assert_eq!(key, run_key(Some("secret"), "claude", true, "k1"));
        assert!(key.starts_with("mcp:") && key.len() == 36, "{key}");
        for other in [
            run_key(Some("other"), "claude", true, "k1"),
            run_key(None, "claude", true, "k1"),
            run_key(Some("secret"), "cursor", true, "k1"),
            run_key(Some("secret"), "claude", false, "k1"),
            run_key(Some("secret"), "claude", true, "k2"),
        ] {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn a_run_s_input_says_whether_it_is_one_call_s_own() {
        let run = |input: &str| pb::Run {
            input_json: input.into(),
            ..Default::default()
        };
        assert!(is_own(&run(r#"{"mcp_client":{},"mcp_run":"call"}"#)));
        assert!(!is_own(&run(r#"{"mcp_client":{},"mcp_run":"open"}"#)));
        assert!(!is_own(&run(r#"{"mcp_session":"x"}"#)));
        assert!(!is_own(&run("")));
    }

    #[test]
    fn a_re_issue_with_other_arguments_is_refused_as_a_changed_replay() {
        let step = pb::Step {
            step_key: "id:k1".into(),
            tool: "refund".into(),
            arguments_json: r#"{"cents":5}"#.into(),
            ..Default::default()
        };
        assert!(repeated(&step, "refund", &json!({"cents": 5})).is_none());
        let changed = repeated(&step, "refund", &json!({"cents": 6})).expect("refused");
        assert_eq!(changed.is_error, Some(true));
        assert!(repeated(&step, "charge", &json!({"cents": 5})).is_some());
    }
}
