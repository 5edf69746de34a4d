//! A worker for fault injection. Each tool writes one line to a ledger file when its body starts
//! (`start <tool> <idempotency key> <attempt>`), and another when it sees a cancel, so tests can
//! count how often an effect really ran after workers or the kernel were killed.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use serde_json::{Value, json};
use tracing_subscriber::EnvFilter;
use worker_sdk::{
    Agent, AgentContext, AgentError, Call, CancellationToken, Idempotency, RetryPolicy, RiskLevel, StepEffect,
    ToolContext, ToolError, Worker, tool,
};

#[derive(Debug, Parser)]
struct Config {
    #[arg(long, env = "KERNEL_ADDR")]
    kernel: String,
    #[arg(long)]
    name: String,
    /// File the tools append their ledger lines to.
    #[arg(long)]
    ledger: PathBuf,
    #[arg(long, default_value_t = 16)]
    max_concurrency: u32,
    /// Host the agents and offer no tools.
    #[arg(long)]
    agents_only: bool,
    /// Host the agents as well as offering the tools.
    #[arg(long, conflicts_with = "agents_only")]
    with_agents: bool,
    /// `sleepy` declares its own limit: at most this many of its calls run at once.
    #[arg(long)]
    sleepy_at_once: Option<u32>,
    /// The API key the worker connects with, for a kernel with an auth file.
    #[arg(long)]
    api_key: Option<String>,
}

struct Ledger(Mutex<std::fs::File>);

/// The ledger hosted handlers write to (they have no deps).
static LEDGER: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Appends `start <step> <idempotency key> <dispatch attempt>` for a local step's closure.
fn ledger_step(step: &str, key: &str, attempt: u32) {
    let path = LEDGER.get().expect("ledger path");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("ledger file");
    file.write_all(format!("start {step} {key} {attempt}\n").as_bytes())
        .expect("ledger write");
    file.sync_data().expect("ledger sync");
}

/// A hosted agent: `calls` rounds of a local step (`prep`, holding `hold_ms`) then a `sleepy`
/// call. With `diverge`, a redispatched handler calls `sleepy` with other arguments, as a
/// handler that is not deterministic would.
async fn pipeline(ctx: AgentContext, input: Value) -> Result<Value, AgentError> {
    let rounds = input["calls"].as_u64().unwrap_or(3);
    let hold_ms = input["hold_ms"].as_u64().unwrap_or(100);
    let diverge = input["diverge"].as_bool().unwrap_or(false) && ctx.attempt() > 1;
    let mut total = 0;
    for round in 0..rounds {
        let attempt = ctx.attempt();
        let value: u64 = ctx
            .step("prep", move |info| async move {
                ledger_step("step:prep", &info.idempotency_key, attempt);
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                Ok::<_, String>(round * 10)
            })
            .await?;
        total += value;
        let hold = if diverge { hold_ms + 1 } else { hold_ms };
        let result = ctx.call(Call::new("sleepy", json!({ "hold_ms": hold }))).await?;
        if result.outcome != worker_sdk::Outcome::Ok {
            return Err(AgentError::failed(format!("sleepy failed: {}", result.content)));
        }
    }
    Ok(json!({ "rounds": rounds, "total": total }))
}

/// An agent that does what its input lists, in order, and returns what each operation gave: `{"once":
/// id}` a `ctx.once`, `{"step": id, "effect": "read"|"pure"|"write"}` a local step, `{"call": tool,
/// "args": {...}}` a tool call, `{"child": agent, "input": ...}` a subagent. It catches every
/// error and goes on (a branch's refusal must end the run all the same). Each step's closure
/// writes `start step:<id> <idempotency key> <attempt>` to the ledger.
async fn script(ctx: AgentContext, input: Value) -> Result<Value, AgentError> {
    let ops = input["ops"].as_array().cloned().unwrap_or_default();
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        let attempt = ctx.attempt();
        let outcome: Result<Value, AgentError> = if let Some(id) = op["once"].as_str() {
            let name = format!("step:{id}");
            ctx.once(id, move |info| async move {
                ledger_step(&name, &info.idempotency_key, attempt);
                Ok::<_, String>(json!({ "decided_on_attempt": attempt }))
            })
            .await
        } else if let Some(id) = op["step"].as_str() {
            let effect = match op["effect"].as_str() {
                Some("read") => StepEffect::Read,
                Some("pure") => StepEffect::Pure,
                _ => StepEffect::Write,
            };
            let name = format!("step:{id}");
            ctx.step_with(id, effect, move |info| async move {
                ledger_step(&name, &info.idempotency_key, attempt);
                Ok::<_, String>(json!({ "ran_on_attempt": attempt }))
            })
            .await
        } else if let Some(tool) = op["call"].as_str() {
            ctx.call(Call::new(tool, op["args"].clone()))
                .await
                .map(|result| json!({ "outcome": result.outcome.as_str(), "content": result.content }))
        } else if let Some(agent) = op["child"].as_str() {
            ctx.subagent(agent, op["input"].clone()).await
        } else {
            Err(AgentError::failed(format!("unknown operation {op}")))
        };
        results.push(outcome.unwrap_or_else(|error| json!({ "error": error.to_string() })));
    }
    Ok(json!({ "results": results }))
}

/// A subagent: a `work` step holding `hold_ms`, then its label and the output of its session's
/// previous run; with `fail`, it fails with that text at once.
async fn child(ctx: AgentContext, input: Value) -> Result<Value, AgentError> {
    if let Some(why) = input["fail"].as_str() {
        return Err(AgentError::failed(why));
    }
    let hold_ms = input["hold_ms"].as_u64().unwrap_or(50);
    let label = input["label"].clone();
    let attempt = ctx.attempt();
    ctx.step("work", move |info| async move {
        ledger_step("step:work", &info.idempotency_key, attempt);
        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        Ok::<_, String>(())
    })
    .await?;
    let previous = ctx.session().and_then(|s| s.previous_output).unwrap_or(Value::Null);
    Ok(json!({ "label": label, "previous": previous, "run_id": ctx.run_id() }))
}

/// Asks a person whether to refund or replace, with `timeout_ms` and `default` when its input
/// gives them, and returns the answer; the ledger says each time the handler reaches the question.
/// With `in_step`, it asks inside a local step instead and returns the error it gets.
async fn interviewer(ctx: AgentContext, input: Value) -> Result<Value, AgentError> {
    ledger_step("handler:ask", ctx.run_id(), ctx.attempt());
    if input["in_step"].as_bool() == Some(true) {
        // Asking inside a local step, where nothing may wait on something durable.
        let inner = ctx.clone();
        let asked = ctx
            .step("outer", move |_| async move {
                inner.ask("Inside?").await.map(|_| ()).map_err(|e| e.to_string())
            })
            .await;
        return Ok(json!({ "in_step": asked.map_err(|e| e.to_string()).err() }));
    }
    let mut question = ctx
        .ask("Refund or replace the order?")
        .choices(["refund", "replace"])
        .approvers(["ops"]);
    if let Some(ms) = input["timeout_ms"].as_u64() {
        question = question.timeout(Duration::from_millis(ms));
    }
    if !input["default"].is_null() {
        question = question.default(input["default"].clone());
    }
    match question.await {
        Ok(answer) => Ok(json!({ "answer": answer })),
        Err(AgentError::Unanswered { question, message }) => Ok(json!({ "unanswered": question, "why": message })),
        Err(error) => Err(error),
    }
}

/// A parent: `mode` `one` starts one `child`, `many` starts `n` at once, `session` starts `n` at
/// once on one session; `approval` calls `wipe` (always asked); `nested` calls a tool inside a
/// step.
async fn parent(ctx: AgentContext, input: Value) -> Result<Value, AgentError> {
    let hold_ms = input["hold_ms"].as_u64().unwrap_or(50);
    let n = input["n"].as_u64().unwrap_or(3);
    match input["mode"].as_str().unwrap_or("one") {
        "one" => {
            ctx.subagent("child", json!({"label": "only", "hold_ms": hold_ms}))
                .await
        }
        "many" | "session" => {
            let session = format!("child:{}", ctx.run_id());
            let children: Vec<_> = (0..n)
                .map(|i| {
                    let started = ctx.subagent("child", json!({"label": i, "hold_ms": hold_ms}));
                    let started = if input["mode"] == "session" {
                        started.session(session.clone())
                    } else {
                        started
                    };
                    std::future::IntoFuture::into_future(started)
                })
                .collect();
            let outputs = futures_util::future::try_join_all(children).await?;
            Ok(Value::Array(outputs))
        }
        "approval" => {
            let wiped = ctx.call(Call::new("wipe", json!({}))).await?;
            Ok(json!({ "outcome": wiped.outcome.as_str(), "content": wiped.content }))
        }
        "tools" => {
            let calls = (0..n)
                .map(|i| Call::new("delegate", json!({"label": i.to_string(), "hold_ms": hold_ms})))
                .collect();
            let results = ctx.call_turn(calls).await?;
            Ok(Value::Array(
                results
                    .into_iter()
                    .map(|r| serde_json::from_str(&r.content).unwrap_or(Value::Null))
                    .collect(),
            ))
        }
        "uneven" => {
            let calls = input["holds"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|hold| Call::new("sleepy", json!({ "hold_ms": hold })))
                .collect();
            let results = ctx.call_turn(calls).await?;
            Ok(Value::Array(
                results.into_iter().map(|r| Value::String(r.content)).collect(),
            ))
        }
        "bounded" => {
            let calls = (0..n)
                .map(|i| Call::new("push", json!({"repo": format!("r{i}"), "hold_ms": hold_ms})))
                .collect();
            let results = ctx.call_turn_bounded(calls, 1).await?;
            Ok(Value::Array(
                results.into_iter().map(|r| Value::String(r.content)).collect(),
            ))
        }
        "nested" => {
            let inner = ctx.clone();
            ctx.step("outer", move |_| async move {
                inner
                    .call(Call::new("wipe", json!({})))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .await?;
            Ok(Value::Null)
        }
        other => Err(AgentError::failed(format!("unknown mode {other}"))),
    }
}

impl Ledger {
    fn write(ctx: &ToolContext, what: &str) {
        let ledger = ctx.deps::<Ledger>().expect("ledger dependency");
        let mut file = ledger.0.lock().expect("ledger lock");
        // One write per line: several worker processes append to the same file.
        let line = format!(
            "{what} {} {} {}\n",
            ctx.tool_name(),
            ctx.idempotency_key(),
            ctx.attempt()
        );
        file.write_all(line.as_bytes()).expect("ledger write");
        file.sync_data().expect("ledger sync");
    }
}

/// Waits `hold_ms` unless cancelled; the ledger records a cancel.
async fn hold(ctx: &ToolContext, hold_ms: u64) -> Result<(), ToolError> {
    tokio::select! {
        _ = ctx.cancelled() => {
            Ledger::write(ctx, "cancelled");
            Err(ToolError::fatal("cancelled"))
        }
        _ = tokio::time::sleep(Duration::from_millis(hold_ms)) => Ok(()),
    }
}

/// Resolves once `file` exists.
async fn appears(file: &std::path::Path) {
    while !file.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Record an effect, then hold for a while. Safe to run again.
#[tool]
async fn sleepy(ctx: ToolContext, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    hold(&ctx, hold_ms).await?;
    Ok(format!("slept {hold_ms}ms"))
}

/// Record an effect that must not happen twice, then hold for a while.
#[tool(idempotency = "at_most_once")]
async fn charge(ctx: ToolContext, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    hold(&ctx, hold_ms).await?;
    Ok(format!("charged once under {}", ctx.idempotency_key()))
}

/// The trace context the kernel handed this attempt, or null; fails retryably until attempt
/// `succeed_on`.
#[tool]
async fn traced(ctx: ToolContext, succeed_on: Option<u32>) -> Result<Option<String>, ToolError> {
    if ctx.attempt() < succeed_on.unwrap_or(1) {
        return Err(ToolError::retryable(format!("attempt {} fails", ctx.attempt())));
    }
    Ok(ctx.trace_context().map(|context| context.traceparent().to_owned()))
}

/// Fail retryably until attempt `succeed_on`.
#[tool]
async fn flaky(ctx: ToolContext, succeed_on: u32) -> Result<u32, ToolError> {
    Ledger::write(&ctx, "start");
    if ctx.attempt() < succeed_on {
        return Err(ToolError::retryable(format!("attempt {} fails", ctx.attempt())));
    }
    Ok(ctx.attempt())
}

/// Sleep on a blocking thread, which no cancel can stop.
#[tool]
fn block(ctx: ToolContext, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    std::thread::sleep(Duration::from_millis(hold_ms));
    Ledger::write(&ctx, "finished");
    Ok("woke up".into())
}

/// Refund an amount in cents; big refunds need a person's approval (declared on the tool).
#[tool]
async fn refund(ctx: ToolContext, cents: i64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    Ok(format!("refunded {cents} cents"))
}

/// Delete everything; always needs a person.
#[tool]
async fn wipe(ctx: ToolContext) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    Ok("wiped".into())
}

/// Keeps `value` under `key` in this tool's cache when given (expiring after `ttl_ms` when
/// given), then returns what the cache holds under `key`. Null optional arguments are dropped by
/// the kernel before the call is recorded.
#[tool(strip_nulls)]
async fn memo(
    ctx: ToolContext,
    key: String,
    value: Option<i64>,
    ttl_ms: Option<u64>,
) -> Result<Option<i64>, ToolError> {
    let cache = ctx.cache();
    if let Some(value) = value {
        cache.set(&key, &value, ttl_ms.map(Duration::from_millis)).await?;
    }
    cache.get(&key).await
}

/// Fails with an error of `kind` (`retryable`, `fatal` or `poison`); retried by its policy.
#[tool]
async fn failing(ctx: ToolContext, kind: String) -> Result<(), ToolError> {
    Ledger::write(&ctx, "start");
    Err(match kind.as_str() {
        "fatal" => ToolError::fatal("fatal on purpose"),
        "poison" => ToolError::poison("poison on purpose"),
        _ => ToolError::retryable("retryable on purpose"),
    })
}

/// Looks `q` up, holding `hold_ms`: free of side effects, so a branch runs it live.
#[tool(read_only)]
async fn lookup(ctx: ToolContext, q: String, hold_ms: u64) -> Result<String, ToolError> {
    Ledger::write(&ctx, "start");
    hold(&ctx, hold_ms).await?;
    Ok(format!("found {q}"))
}

/// Returns what its context says of the call: turn, position, step key and attempt.
#[tool(read_only)]
async fn whoami(ctx: ToolContext) -> Result<Value, ToolError> {
    Ok(json!({
        "turn": ctx.turn(),
        "position": ctx.position(),
        "step_key": ctx.step_key(),
        "attempt": ctx.attempt(),
    }))
}

/// Starts a `child` subagent from the tool's body and returns its output (a child told to
/// `fail` fails).
#[tool]
async fn delegate(ctx: ToolContext, label: String, hold_ms: u64, fail: Option<String>) -> Result<Value, ToolError> {
    Ledger::write(&ctx, "start");
    ctx.subagent("child", json!({ "label": label, "hold_ms": hold_ms, "fail": fail }))
        .await
}

/// Asks a person `question` (the answer an object with a boolean `ok`) and returns the answer;
/// the ledger says `start` when the body starts and `answered` when it has the answer.
#[tool]
async fn confirm(ctx: ToolContext, question: String) -> Result<Value, ToolError> {
    Ledger::write(&ctx, "start");
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
    let answer = ctx.ask(question).schema(schema).approvers(["ops"]).await?;
    Ledger::write(&ctx, "answered");
    Ok(answer)
}

/// [`confirm`], at most once: it keeps its worker slot while it waits.
#[tool(idempotency = "at_most_once")]
async fn confirm_once(ctx: ToolContext, question: String) -> Result<Value, ToolError> {
    Ledger::write(&ctx, "start");
    let answer = ctx.ask(question).await?;
    Ledger::write(&ctx, "answered");
    Ok(answer)
}

/// Calls `tool` with `arguments` through the kernel from its body (`ctx.call`) and returns how
/// that call ended; the ledger says `start` when the body starts and `called` once it has the
/// outcome. Read-only itself, so a branch runs it live: each call it makes is judged on its own.
#[tool(read_only)]
async fn relay(ctx: ToolContext, tool: String, arguments: Value) -> Result<Value, ToolError> {
    Ledger::write(&ctx, "start");
    let called = ctx.call(Call::new(tool, arguments)).await?;
    Ledger::write(&ctx, "called");
    Ok(json!({
        "outcome": called.outcome.to_string(),
        "content": called.content,
        "output": called.output,
        "step_key": called.step_key,
        "replayed": called.replayed,
        "rejected_by": called.rejection().map(|rejected| rejected.decider),
    }))
}

/// Logs `user` in with `password` (a secret field, as is the `token` it returns): returns the
/// password's length, so a test sees the tool got the value the kernel kept sealed, and a token
/// made from it. The ledger says `start`.
#[tool(secret = ["password", "token"])]
async fn login(ctx: ToolContext, user: String, password: String) -> Result<Value, ToolError> {
    Ledger::write(&ctx, "start");
    Ok(json!({
        "user": user,
        "password_length": password.len(),
        "token": format!("tok-{password}"),
    }))
}

/// Pushes to a repository: the ledger says `lock:<repo>` when the body starts and `unlock:<repo>`
/// when it ends, so a test sees whether two pushes to one repository ever overlapped. With
/// `until`, it holds until that file exists (or `hold_ms` passes), so a test that inspects the
/// held lock does not race a timer on a slow machine.
#[tool(writes, resources = ["repo:{repo}", "workspace"])]
async fn push(ctx: ToolContext, repo: String, hold_ms: u64, until: Option<String>) -> Result<String, ToolError> {
    Ledger::write(&ctx, &format!("lock:{repo}"));
    let held = match until {
        Some(file) => tokio::select! {
            held = hold(&ctx, hold_ms) => held,
            () = appears(std::path::Path::new(&file)) => Ok(()),
        },
        None => hold(&ctx, hold_ms).await,
    };
    Ledger::write(&ctx, &format!("unlock:{repo}"));
    held.map(|()| format!("pushed to {repo}"))
}

/// Ends its own worker process mid-call, without a word to the kernel, as a call that crashes
/// its worker would (an exit rather than an abort, so no core file is left behind).
#[tool]
async fn crash(ctx: ToolContext) -> Result<(), ToolError> {
    Ledger::write(&ctx, "start");
    std::process::exit(70);
}

/// Returns what this tool's own cache holds under `key`; never what `memo` keeps there.
#[tool]
async fn peek(ctx: ToolContext, key: String) -> Result<Option<i64>, ToolError> {
    ctx.cache().get(&key).await
}

#[tokio::main]
async fn main() {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let ledger = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&config.ledger)
        .expect("ledger file");
    LEDGER.set(config.ledger.clone()).expect("set once");
    let builder = Worker::builder(config.kernel)
        .name(config.name)
        .max_concurrency(config.max_concurrency);
    let builder = match config.api_key {
        Some(key) => builder.api_key(key),
        None => builder,
    };
    let agents = || {
        [
            Agent::new("pipeline", "Steps and sleepy calls, for fault tests", pipeline),
            Agent::new("parent", "Starts subagents, for fault tests", parent),
            Agent::new("child", "A subagent, for fault tests", child),
            Agent::new("interviewer", "Asks a person, for question tests", interviewer),
            Agent::new(
                "script",
                "Runs the operations its input lists, for branch tests",
                script,
            ),
        ]
    };
    let builder = if config.with_agents || config.agents_only {
        agents()
            .into_iter()
            .fold(builder, |builder, agent| builder.agent(agent))
    } else {
        builder
    };
    if config.agents_only {
        let worker = builder.build().expect("worker config");
        let shutdown = CancellationToken::new();
        if let Err(error) = worker.run(shutdown).await {
            eprintln!("fault worker stopped: {error}");
            std::process::exit(1);
        }
        return;
    }
    let sleepy = match config.sleepy_at_once {
        Some(calls) => sleepy_tool().at_once(calls),
        None => sleepy_tool(),
    };
    let worker = builder
        .tool(sleepy)
        .tool(charge_tool().idempotency(Idempotency::AtMostOnce))
        .tool(flaky_tool().retry_policy(RetryPolicy::exponential(
            4,
            Duration::from_millis(400),
            Duration::from_secs(5),
        )))
        .tool(block_tool().timeout(Duration::from_millis(500)).retry(3))
        .tool(
            refund_tool()
                .writes()
                .risk(RiskLevel::High)
                .permissions(["billing:write"])
                .cost_per_call(0.25)
                .requires_approval_if("args.cents > 10000"),
        )
        .tool(wipe_tool().writes().risk(RiskLevel::Critical).requires_approval(true))
        .tool(memo_tool())
        .tool(peek_tool())
        .tool(push_tool())
        .tool(crash_tool())
        .tool(delegate_tool())
        .tool(confirm_tool())
        .tool(confirm_once_tool())
        .tool(relay_tool())
        .tool(login_tool())
        .tool(whoami_tool())
        .tool(lookup_tool())
        .tool(traced_tool().retry_policy(RetryPolicy::exponential(
            3,
            Duration::from_millis(50),
            Duration::from_millis(200),
        )))
        .tool(failing_tool().retry_policy(RetryPolicy::exponential(
            3,
            Duration::from_millis(10),
            Duration::from_millis(50),
        )))
        .deps(Ledger(Mutex::new(ledger)))
        .build()
        .expect("worker config");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    if let Err(error) = worker.run(shutdown).await {
        eprintln!("fault worker stopped: {error}");
        std::process::exit(1);
    }
}
