//! A tool body asking a person mid-call (`ctx.ask`), with real processes: the fault worker's
//! `confirm` (safe to retry: it gives back its slot while it waits) and `confirm_once` (at most
//! once: it keeps its slot), answered with kernelctl; and a hosted handler asking (the fault
//! worker's `interviewer`), answered with `kernelctl runs answer` or left to its default.

use e2e::{Kernel, Watch, check_log, payload, wait_ledger};
use kernel_proto::v1 as pb;
use serde_json::{Value, json};

/// kernelctl's stderr, after checking it failed.
fn kernelctl_refused(kernel: &Kernel, args: &[&str]) -> String {
    let out = kernel.kernelctl(args);
    assert!(!out.status.success(), "kernelctl {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A new run whose one call of `tool` asks `question`, its turn submitted in the background (and
/// again after a broken stream) until its result is in.
async fn asking(kernel: &Kernel, tool: &str, question: &str) -> (String, tokio::task::JoinHandle<e2e::TurnOutcome>) {
    let run = kernel.create_run("asking").await;
    let calls = vec![e2e::call(tool, json!({ "question": question }))];
    let turn = e2e::submit_in_background(kernel, &run, 0, calls);
    (run, turn)
}

/// Answers question `id` with `answer` (JSON) as `who`, with kernelctl.
fn answer(kernel: &Kernel, id: &str, answer: &str, who: &str) -> String {
    kernel.kernelctl_ok(&["approvals", "answer", id, "--with", answer, "--as", who])
}

/// Answers with kernelctl `args` as erin once a restarted kernel takes the answer: on PostgreSQL
/// the killed kernel's replica owns the run's shard until its lease runs out, and until then the
/// answer is UNAVAILABLE; a person tries again.
async fn answer_once_back(kernel: &Kernel, args: &[&str]) {
    e2e::eventually("the restarted kernel to take the answer", || async {
        let mut all = args.to_vec();
        all.extend(["--as", "erin"]);
        let out = kernel.kernelctl(&all);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() || said.contains("already approved by erin") {
            Ok(())
        } else {
            Err(said)
        }
    })
    .await;
}

#[tokio::test]
async fn a_tool_asks_a_person_who_answers_with_kernelctl_and_the_call_returns_the_answer() {
    let kernel = Kernel::start();
    let _worker = kernel.fault_worker("asker");
    kernel.wait_for_workers("confirm", 1).await;
    let (run, turn) = asking(&kernel, "confirm", "Ship release 4.2?").await;
    let approval = kernel.question_of(&run).await;
    assert!(approval.question, "{approval:?}");
    assert_eq!(approval.message, "Ship release 4.2?");
    assert_eq!(approval.tool, "confirm");
    assert_eq!(approval.step_key, "question:t0/p0#0");
    assert_eq!(approval.approvers, ["ops"]);
    assert_eq!(approval.decided_by, "tool:confirm");
    let schema: Value = serde_json::from_str(&approval.answer_schema_json).unwrap();
    assert_eq!(schema["required"], json!(["ok"]));
    assert_eq!(
        kernel.get(&run).await.run.unwrap().status,
        pb::RunStatus::Blocked as i32,
        "the run waits for the person"
    );

    // An answer that does not meet the schema, or none, is refused and writes nothing.
    let wrong = kernelctl_refused(
        &kernel,
        &[
            "approvals",
            "answer",
            &approval.id,
            "--with",
            r#"{"ok":"yes"}"#,
            "--as",
            "alice",
        ],
    );
    assert!(wrong.contains("answer_json"), "{wrong}");
    assert!(wrong.contains("does not meet the question's schema"), "{wrong}");
    let none = kernelctl_refused(&kernel, &["approvals", "approve", &approval.id, "--as", "alice"]);
    assert!(none.contains("answer_json"), "{none}");
    assert_eq!(kernel.pending_approvals().await.len(), 1, "still waiting");

    // The body gives back its slot while it waits on a person alone.
    Watch::open(&kernel, &run, 0, false)
        .await
        .event("tool:suspended", |p| p["waiting_on"] == json!(["question:t0/p0#0"]))
        .await;
    let answered = answer(&kernel, &approval.id, r#"{"ok": true}"#, "alice");
    assert!(answered.contains("approved by alice"), "{answered}");
    let outcome = turn.await.unwrap();
    let result = &outcome.results[0];
    assert_eq!(result.outcome, pb::CallOutcome::Ok as i32, "{result:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&result.content).unwrap(),
        json!({"ok": true})
    );
    // The agent's turn heard that its call waits on a person's answer.
    let told = &outcome.interrupted;
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (
            told[0].reason.as_str(),
            told[0].step_key.as_str(),
            told[0].approval_id.as_str()
        ),
        ("human_input", "question:t0/p0#0", approval.id.as_str())
    );

    let got = kernel.get(&run).await;
    assert_eq!(
        got.run.unwrap().status,
        pb::RunStatus::Running as i32,
        "the run goes on"
    );
    let question = got
        .steps
        .iter()
        .find(|s| s.step_key == "question:t0/p0#0")
        .expect("the question's step");
    assert_eq!(question.kind, pb::StepKind::Question as i32);
    assert_eq!(question.status, pb::StepStatus::Succeeded as i32);
    assert_eq!(question.output_json, r#"{"ok":true}"#);
    let call = got.steps.iter().find(|s| s.step_key == "t0/p0").expect("the call");
    // It ran again from the start once answered, and got the recorded answer.
    assert_eq!(call.attempts, 2, "{call:?}");
    let ledger = kernel.ledger();
    let starts = ledger
        .iter()
        .filter(|l| l.tool == "confirm" && l.what == "start")
        .count();
    let answers = ledger
        .iter()
        .filter(|l| l.tool == "confirm" && l.what == "answered")
        .count();
    assert_eq!((starts, answers), (2, 1), "{ledger:?}");

    let events = kernel.events(&run).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "question:asked").count(),
        1,
        "asked once: {kinds:?}"
    );
    let answer = events
        .iter()
        .find(|e| e.r#type == "approval:answered")
        .map(payload)
        .unwrap();
    assert_eq!(answer["response"], json!({"ok": true}));
    assert_eq!(answer["decider"], "alice");
    check_log(&events, true);

    let listed: Value =
        serde_json::from_str(&kernel.kernelctl_ok(&["approvals", "list", "--run", &run, "--json"])).unwrap();
    assert_eq!(listed["approvals"], json!([]), "nothing left to answer");
    let shown: Value = serde_json::from_str(&kernel.kernelctl_ok(&["runs", "show", &run, "--json"])).unwrap();
    let steps = shown["steps"].as_array().expect("the run's steps");
    let question = steps
        .iter()
        .find(|s| s["key"] == "question:t0/p0#0")
        .unwrap_or_else(|| panic!("{shown}"));
    assert_eq!(question["kind"], "question", "{question}");
}

#[tokio::test]
async fn a_call_run_again_gets_the_recorded_answer_and_the_person_is_asked_once() {
    let kernel = Kernel::start();
    let mut worker = kernel.fault_worker("first");
    kernel.wait_for_workers("confirm", 1).await;
    let (run, turn) = asking(&kernel, "confirm", "Deploy?").await;
    let approval = kernel.question_of(&run).await;
    // No worker is left when the answer comes: the call waits for one, then its body runs again
    // and gets the answer without a second question.
    worker.kill9();
    kernel.wait_for_workers("confirm", 0).await;
    answer(&kernel, &approval.id, r#"{"ok": false}"#, "carol");
    let _second = kernel.fault_worker("second");
    let outcome = turn.await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&outcome.results[0].content).unwrap(),
        json!({"ok": false})
    );
    let events = kernel.events(&run).await;
    let asked = events.iter().filter(|e| e.r#type == "question:asked").count();
    let interrupted = events.iter().filter(|e| e.r#type == "run:interrupted").count();
    assert_eq!((asked, interrupted), (1, 1), "one question, put to a person once");
    let ledger = wait_ledger(&kernel, "the answer", |l| l.iter().any(|l| l.what == "answered")).await;
    assert_eq!(ledger.iter().filter(|l| l.what == "answered").count(), 1, "{ledger:?}");
    check_log(&events, true);
}

#[tokio::test]
async fn a_declined_question_fails_its_call_and_a_call_lost_while_asking_withdraws_its_question() {
    let kernel = Kernel::start();
    let mut worker = kernel.fault_worker("holder");
    kernel.wait_for_workers("confirm_once", 1).await;

    // Declined: the body gets an error, which fails the call with the decider's word.
    let (run, turn) = asking(&kernel, "confirm_once", "Wire the money?").await;
    let approval = kernel.question_of(&run).await;
    kernel.kernelctl_ok(&[
        "approvals",
        "reject",
        &approval.id,
        "--as",
        "bob",
        "--reason",
        "not today",
    ]);
    let result = &turn.await.unwrap().results[0];
    assert_eq!(result.outcome, pb::CallOutcome::ToolError as i32, "{result:?}");
    assert!(
        result
            .content
            .contains("the question of 'confirm_once' was declined by bob (not today)"),
        "{}",
        result.content
    );
    assert_eq!(
        kernel.get(&run).await.run.unwrap().status,
        pb::RunStatus::Running as i32
    );

    // Lost: an at_most_once call keeps its slot while it asks; its worker dies, the call settles
    // as indeterminate, and its question is withdrawn, so the run does not stay blocked.
    let (run, turn) = asking(&kernel, "confirm_once", "Wire it now?").await;
    let approval = kernel.question_of(&run).await;
    worker.kill9();
    let result = &turn.await.unwrap().results[0];
    assert_eq!(result.outcome, pb::CallOutcome::Indeterminate as i32, "{result:?}");
    let got = kernel.get(&run).await;
    assert_eq!(got.run.unwrap().status, pb::RunStatus::Running as i32, "not blocked");
    let question = got.steps.iter().find(|s| s.step_key == approval.step_key).unwrap();
    assert_eq!(question.status, pb::StepStatus::Cancelled as i32, "{question:?}");
    assert!(
        kernel.pending_approvals().await.is_empty(),
        "the question was withdrawn"
    );
    let late = kernelctl_refused(
        &kernel,
        &["approvals", "answer", &approval.id, "--with", "{}", "--as", "carol"],
    );
    assert!(late.contains("already"), "{late}");
    check_log(&kernel.events(&run).await, true);
}

/// A question open when the kernel is killed is still there after the restart, and its answer
/// reaches the call: nothing of it was held only in memory.
#[tokio::test]
async fn a_question_open_across_a_kernel_sigkill_is_answered_after_the_restart() {
    let mut kernel = Kernel::start();
    let _worker = kernel.fault_worker("asker");
    kernel.wait_for_workers("confirm", 1).await;
    let (run, turn) = asking(&kernel, "confirm", "Still there?").await;
    let approval = kernel.question_of(&run).await;
    kernel.kill9();
    kernel.restart();
    let pending = kernel.pending_approvals().await;
    assert_eq!(
        pending.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        [approval.id.as_str()],
        "the same question waits"
    );
    assert!(pending[0].question && pending[0].message == "Still there?");
    assert_eq!(
        kernel.get(&run).await.run.unwrap().status,
        pb::RunStatus::Blocked as i32
    );
    answer_once_back(
        &kernel,
        &["approvals", "answer", &approval.id, "--with", r#"{"ok": true}"#],
    )
    .await;
    let outcome = turn.await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&outcome.results[0].content).unwrap(),
        json!({"ok": true}),
        "{:?}",
        outcome.results[0]
    );
    let events = kernel.events(&run).await;
    assert_eq!(events.iter().filter(|e| e.r#type == "question:asked").count(), 1);
    check_log(&events, true);
}

#[tokio::test]
async fn a_hosted_handler_asks_a_person_answered_with_kernelctl_runs_answer_and_is_asked_once() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "1"]);
    let run = kernel.start_hosted("interviewer", json!({})).await;
    let approval = kernel.question_of(&run).await;
    assert_eq!(approval.step_key, "question:agent#0");
    assert_eq!(approval.message, "Refund or replace the order?");
    assert_eq!(approval.decided_by, "agent:interviewer");
    let schema: Value = serde_json::from_str(&approval.answer_schema_json).unwrap();
    assert_eq!(schema, json!({"enum": ["refund", "replace"]}));
    let interrupted = kernel.wait_status(&run, |s| s == pb::RunStatus::Suspended).await;
    assert_eq!(
        interrupted.suspensions, 1,
        "the handler gave back its slot while the person thinks"
    );

    // Not one of the choices: refused naming the field, nothing written.
    let events = kernel.events(&run).await.len();
    let wrong = kernelctl_refused(
        &kernel,
        &[
            "runs",
            "answer",
            &run,
            "question:agent#0",
            "--with",
            r#""both""#,
            "--as",
            "ana",
        ],
    );
    assert!(wrong.contains("answer_json"), "{wrong}");
    assert_eq!(
        kernel.events(&run).await.len(),
        events,
        "a refused answer writes nothing"
    );
    let missing = kernelctl_refused(
        &kernel,
        &[
            "runs",
            "answer",
            &run,
            "question:agent#9",
            "--with",
            r#""refund""#,
            "--as",
            "ana",
        ],
    );
    assert!(missing.contains("waiting: question:agent#0"), "{missing}");

    let answered = kernel.kernelctl_ok(&[
        "runs",
        "answer",
        &run,
        "question:agent#0",
        "--with",
        r#""refund""#,
        "--as",
        "ana",
    ]);
    assert!(answered.contains("approved by ana"), "{answered}");
    let done = kernel.finished(&run).await;
    assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output, json!({"answer": "refund"}));

    // The handler ran twice (before its suspension and after the answer) and asked once.
    let asked = kernel
        .ledger()
        .into_iter()
        .filter(|line| line.tool == "handler:ask" && line.key == run)
        .count();
    assert_eq!(asked, 2, "{:?}", kernel.ledger());
    let questions = kernel
        .events(&run)
        .await
        .iter()
        .filter(|e| e.r#type == "question:asked")
        .count();
    assert_eq!(questions, 1, "the replayed handler got the recorded answer");
    check_log(&kernel.events(&run).await, true);
}

#[tokio::test]
async fn a_handler_s_question_past_its_timeout_records_its_default_and_without_one_fails_the_ask() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let with_default = kernel
        .start_hosted("interviewer", json!({"timeout_ms": 300, "default": "replace"}))
        .await;
    let without = kernel.start_hosted("interviewer", json!({"timeout_ms": 300})).await;
    let done = kernel.finished(&with_default).await;
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output, json!({"answer": "replace"}), "{done:?}");
    let done = kernel.finished(&without).await;
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["unanswered"], "question:agent#0", "{output}");
    assert!(
        output["why"].as_str().unwrap().contains("expired unanswered"),
        "{output}"
    );

    // A default that is not one of the choices is refused as the handler asks: its run fails.
    let refused = kernel
        .start_hosted("interviewer", json!({"timeout_ms": 300, "default": "keep"}))
        .await;
    let done = kernel.finished(&refused).await;
    assert_eq!(done.status, pb::RunStatus::Failed as i32, "{done:?}");
    assert!(done.reason.contains("default_answer_json"), "{}", done.reason);
}

#[tokio::test]
async fn an_agent_s_own_code_asks_a_person_across_a_kernel_sigkill_and_is_asked_once() {
    let mut kernel = Kernel::start();
    let agent = worker_sdk::AgentClient::connect(kernel.url()).await.unwrap();
    let run = agent
        .create_run(worker_sdk::NewRun::new("refunds", json!({})))
        .await
        .unwrap();
    let ask = |run: worker_sdk::RunHandle| async move {
        run.ask("refund-1", "Refund order 9 or replace it?")
            .choices(["refund", "replace"])
            .approvers(["ops"])
            .await
    };
    let waiting = tokio::spawn(ask(run.clone()));
    let approval = kernel.question_of(run.id()).await;
    assert_eq!(approval.step_key, "question:run#refund-1");
    assert_eq!(approval.decided_by, "agent:refunds");
    assert_eq!(
        kernel.get(run.id()).await.run.unwrap().status,
        pb::RunStatus::Blocked as i32
    );

    // Another question under the same id is refused; the open one stays the only one.
    let other = run.ask("refund-1", "Refund order 10?").await.unwrap_err();
    assert!(other.to_string().contains("replay_input_changed"), "{other}");

    // The kernel dies under the waiting question: the SDK asks again once it is back, which
    // waits on the recorded question, and nobody is asked twice.
    kernel.kill9();
    kernel.restart();
    answer_once_back(
        &kernel,
        &[
            "runs",
            "answer",
            run.id(),
            "question:run#refund-1",
            "--with",
            r#""replace""#,
        ],
    )
    .await;
    assert_eq!(waiting.await.unwrap().unwrap(), json!("replace"));
    assert_eq!(
        ask(run.clone()).await.unwrap(),
        json!("replace"),
        "asked again, answered at once"
    );
    let events = kernel.events(run.id()).await;
    assert_eq!(events.iter().filter(|e| e.r#type == "question:asked").count(), 1);
    assert_eq!(
        kernel.get(run.id()).await.run.unwrap().status,
        pb::RunStatus::Running as i32
    );
    check_log(&events, false);
}

#[tokio::test]
async fn a_branch_of_a_handler_replays_the_answer_its_parent_recorded_or_the_one_the_fork_puts_in_its_place() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let parent = kernel.start_hosted("interviewer", json!({})).await;
    kernel.question_of(&parent).await;
    kernel.kernelctl_ok(&[
        "runs",
        "answer",
        &parent,
        "question:agent#0",
        "--with",
        r#""refund""#,
        "--as",
        "ana",
    ]);
    assert_eq!(kernel.finished(&parent).await.status, pb::RunStatus::Completed as i32);

    let fork = |args: &[&str]| {
        let mut all = vec!["runs", "fork", parent.as_str()];
        all.extend_from_slice(args);
        kernel.kernelctl_ok(&all).trim().to_owned()
    };
    let same = fork(&[]);
    let replaced = fork(&["--set-result", r#"question:agent#0="replace""#]);
    for (branch, answer) in [(&same, "refund"), (&replaced, "replace")] {
        let done = kernel.finished(branch).await;
        assert_eq!(done.status, pb::RunStatus::Completed as i32, "{done:?}");
        let output: Value = serde_json::from_str(&done.output_json).unwrap();
        assert_eq!(output, json!({ "answer": answer }));
        let events = kernel.events(branch).await;
        assert!(
            !events
                .iter()
                .any(|e| e.r#type == "question:asked" || e.r#type == "run:interrupted"),
            "nobody was asked in the branch: {events:?}"
        );
    }
}

#[tokio::test]
async fn a_handler_asking_inside_a_local_step_gets_the_nested_operation_error_and_asks_nobody() {
    let kernel = Kernel::start();
    let _host = kernel.fault_worker_with("host", &["--agents-only"]);
    let run = kernel.start_hosted("interviewer", json!({"in_step": true})).await;
    let done = kernel.finished(&run).await;
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    let error = output["in_step"].as_str().unwrap_or_default();
    assert!(error.contains("a question to a person inside a local step"), "{output}");
    let events = kernel.events(&run).await;
    assert!(!events.iter().any(|e| e.r#type == "question:asked"), "{events:?}");
}
