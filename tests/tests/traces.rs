//! OpenTelemetry traces: with `--otlp-endpoint`, a run is one trace under the agent's
//! `traceparent`, with a span per run and per call attempt and a child per phase of each attempt,
//! and a tool is handed its attempt's span; spans of a run that a restarted kernel finishes join
//! the same trace. A collector here is the OpenTelemetry project's own OTLP service.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use e2e::{Kernel, KernelOptions, WAIT, call, submit, submit_until_done, wait_ledger};
use kernel_proto::v1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::json;
use tokio::sync::Notify;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// The agent's span, as its OpenTelemetry propagator would send it.
const AGENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const AGENT_SPAN: &str = "b7ad6b7169203331";
const PHASES: [&str; 5] = ["scheduled", "queued", "dispatched", "run", "recorded"];

fn traceparent() -> String {
    format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01")
}

/// An OTLP/gRPC collector that keeps every span it is sent.
#[derive(Clone, Default)]
pub(crate) struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
    arrived: Arc<Notify>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .map(|attribute| text(attribute.value.as_ref().and_then(|value| value.value.as_ref())));
            self.services.lock().unwrap().extend(service);
            for scope in resource.scope_spans {
                self.spans.lock().unwrap().extend(scope.spans);
            }
        }
        self.arrived.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn text(value: Option<&AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(text)) => text.clone(),
        Some(AnyValue::IntValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

impl Collector {
    /// Listens on a port of its own; returns the endpoint for `--otlp-endpoint`.
    pub(crate) async fn start() -> (Collector, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the collector");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (collector, endpoint)
    }

    /// Waits until the spans received hold what `found` looks for.
    pub(crate) async fn until(&self, what: &str, found: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let arrived = self.arrived.notified();
            let spans = self.spans.lock().unwrap().clone();
            if found(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!("the collector never received {what}; it has {:#?}", names(&spans));
            }
        }
    }
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|span| span.name.as_str()).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .map(|attribute| text(attribute.value.as_ref().and_then(|value| value.value.as_ref())))
}

fn kernel_exporting_to(endpoint: &str) -> Kernel {
    Kernel::start_with(KernelOptions {
        args: vec!["--otlp-endpoint".into(), endpoint.into()],
        ..Default::default()
    })
}

/// Creates a run as `request` asks, under the agent's `traceparent`.
async fn create_traced_run(kernel: &Kernel, request: pb::CreateRunRequest) -> pb::Run {
    create_under(kernel, request, &traceparent()).await
}

/// Creates a run as `request` asks, with `traceparent` as its request metadata.
async fn create_under(kernel: &Kernel, request: pb::CreateRunRequest, traceparent: &str) -> pb::Run {
    let mut request = Request::new(request);
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    kernel
        .runs()
        .await
        .create_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

fn run_of(agent: &str) -> pb::CreateRunRequest {
    pb::CreateRunRequest {
        agent: agent.into(),
        input_json: "{}".into(),
        ..Default::default()
    }
}

/// The run's span, once the collector has it, and every span received by then.
async fn run_span(collector: &Collector, agent: &str) -> (Span, Vec<Span>) {
    let name = format!("run {agent}");
    let spans = collector
        .until(&name, |spans| spans.iter().any(|span| span.name == name))
        .await;
    let runs: Vec<&Span> = spans.iter().filter(|span| span.name == name).collect();
    assert_eq!(runs.len(), 1, "one span for the run");
    (runs[0].clone(), spans)
}

/// Checks one attempt's span: under the run's span, with its five phases in order inside it;
/// returns its `run` phase.
fn check_attempt<'a>(spans: &'a [Span], attempt: &Span, run: &Span) -> &'a Span {
    assert_eq!(
        attempt.parent_span_id, run.span_id,
        "{} sits under the run",
        attempt.name
    );
    let mut phases: Vec<&Span> = spans
        .iter()
        .filter(|span| span.parent_span_id == attempt.span_id)
        .collect();
    phases.sort_by_key(|span| {
        (
            span.start_time_unix_nano,
            PHASES.iter().position(|phase| *phase == span.name),
        )
    });
    assert_eq!(
        names(&phases.iter().map(|span| (*span).clone()).collect::<Vec<_>>()),
        PHASES
    );
    assert_eq!(phases[0].start_time_unix_nano, attempt.start_time_unix_nano);
    assert_eq!(phases[4].end_time_unix_nano, attempt.end_time_unix_nano);
    for pair in phases.windows(2) {
        assert_eq!(
            pair[0].end_time_unix_nano, pair[1].start_time_unix_nano,
            "phases follow each other"
        );
    }
    phases[3]
}

#[tokio::test]
async fn a_run_and_each_call_attempt_are_spans_of_the_agents_trace() {
    let (collector, endpoint) = Collector::start().await;
    let kernel = kernel_exporting_to(&endpoint);
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("traced", 1).await;
    // A run whose agent does not record its trace exports nothing; a traceparent that does not
    // parse is ignored, and the run has a trace of its own.
    let flags_off = format!("00-{AGENT_TRACE}-{AGENT_SPAN}-00");
    let unsampled = create_under(&kernel, run_of("unsampled-agent"), &flags_off).await;
    submit(&kernel, &unsampled.id, 0, vec![call("traced", json!({}))])
        .await
        .unwrap();
    kernel.complete(&unsampled.id).await;
    let garbled = create_under(&kernel, run_of("garbled-agent"), "00-not-a-trace-01").await;
    assert_eq!(garbled.trace_id.len(), 32);
    assert_ne!(garbled.trace_id, AGENT_TRACE);

    let run = create_traced_run(&kernel, run_of("traced-agent")).await;
    assert_eq!(run.trace_id, AGENT_TRACE, "the run names the agent's trace");

    let calls = vec![call("traced", json!({})), call("traced", json!({"succeed_on": 2}))];
    let outcome = submit(&kernel, &run.id, 0, calls).await.unwrap();
    assert_eq!(outcome.results.len(), 2);
    kernel.complete(&run.id).await;
    let (run_span, spans) = run_span(&collector, "traced-agent").await;

    let unsampled_spans = spans
        .iter()
        .filter(|span| attribute(span, "kernel.run.id") == Some(unsampled.id.clone()))
        .count();
    assert_eq!(unsampled_spans, 0, "an unsampled trace is not exported");
    let trace = hex(AGENT_TRACE);
    assert!(
        spans.iter().all(|span| span.trace_id == trace),
        "one trace: {:#?}",
        names(&spans)
    );
    assert_eq!(
        run_span.parent_span_id,
        hex(AGENT_SPAN),
        "the run sits under the agent's span"
    );
    assert_eq!(attribute(&run_span, "kernel.run.id").as_deref(), Some(run.id.as_str()));
    assert_eq!(attribute(&run_span, "kernel.run.status").as_deref(), Some("completed"));
    assert_eq!(
        collector.services.lock().unwrap().first().map(String::as_str),
        Some("kernel")
    );

    let attempts: Vec<&Span> = spans.iter().filter(|span| span.name == "tool traced").collect();
    assert_eq!(attempts.len(), 3, "one span per attempt: {:#?}", names(&spans));
    let mut handed = HashMap::new();
    for attempt in &attempts {
        let key = (
            attribute(attempt, "kernel.step.key").unwrap(),
            attribute(attempt, "kernel.attempt").unwrap(),
        );
        let phase = check_attempt(&spans, attempt, &run_span);
        handed.insert(key, phase.span_id.clone());
        if key_is(attempt, "t0/p1", "1") {
            assert_eq!(attribute(attempt, "kernel.outcome").as_deref(), Some("attempt_failed"));
            assert_eq!(attribute(attempt, "kernel.error.kind").as_deref(), Some("retryable"));
            let status = attempt.status.as_ref().map(|status| status.code);
            assert_eq!(status, Some(StatusCode::Error as i32), "a failed attempt is an error");
        } else {
            assert_eq!(attribute(attempt, "kernel.outcome").as_deref(), Some("ok"));
            assert_eq!(attribute(attempt, "kernel.worker").as_deref(), Some("w1"));
        }
    }

    // Each tool was handed the `run` phase of its own attempt, in the agent's trace.
    for result in &outcome.results {
        let attempt = result.attempts.to_string();
        let span = &handed[&(result.step_key.clone(), attempt)];
        let expected = format!("00-{AGENT_TRACE}-{}-01", to_hex(span));
        assert_eq!(result.content, expected, "call {}", result.step_key);
    }
}

#[tokio::test]
async fn spans_of_a_run_a_restarted_kernel_finishes_join_its_trace() {
    let (collector, endpoint) = Collector::start().await;
    let mut kernel = kernel_exporting_to(&endpoint);
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("sleepy", 1).await;
    // Through the Rust agent client this time.
    let agent = worker_sdk::AgentClient::connect(kernel.url()).await.unwrap();
    let created = agent
        .create_run(worker_sdk::NewRun::new("restarted-agent", json!({})).traceparent(traceparent()))
        .await
        .unwrap();
    let run = kernel.get(created.id()).await.run.unwrap();
    assert_eq!(run.trace_id, AGENT_TRACE);
    let refused = agent
        .create_run(worker_sdk::NewRun::new("restarted-agent", json!({})).traceparent("00-nope"))
        .await;
    assert!(refused.is_err(), "a malformed traceparent is refused before it is sent");
    let calls = vec![call("sleepy", json!({"hold_ms": 1_500}))];
    let turn = {
        let (url, run, calls) = (kernel.url(), run.id.clone(), calls.clone());
        tokio::spawn(async move { submit_until_done(&url, &run, 0, calls).await })
    };
    wait_ledger(&kernel, "sleepy to start", |ledger| {
        ledger.iter().any(|line| line.tool == "sleepy")
    })
    .await;
    kernel.restart();
    let outcome = turn.await.unwrap();
    assert_eq!(outcome.results.len(), 1);
    kernel.complete(&run.id).await;

    let (run_span, spans) = run_span(&collector, "restarted-agent").await;
    assert!(spans.iter().all(|span| span.trace_id == hex(AGENT_TRACE)));
    assert_eq!(run_span.parent_span_id, hex(AGENT_SPAN));
    let attempts: Vec<&Span> = spans.iter().filter(|span| span.name == "tool sleepy").collect();
    assert!(
        !attempts.is_empty(),
        "the call's attempts have spans: {:#?}",
        names(&spans)
    );
    for attempt in &attempts {
        assert_eq!(attempt.parent_span_id, run_span.span_id);
    }
    let settled = attempts
        .iter()
        .find(|attempt| attribute(attempt, "kernel.outcome").as_deref() == Some("ok"))
        .expect("the attempt that settled the call");
    check_attempt(&spans, settled, &run_span);
}

#[tokio::test]
async fn a_hosted_run_and_its_subagent_share_the_trace() {
    let (collector, endpoint) = Collector::start().await;
    let kernel = kernel_exporting_to(&endpoint);
    let _host = kernel.fault_worker_with("host", &["--agents-only", "--max-concurrency", "1"]);
    kernel.wait_for_workers("parent", 1).await;
    let request = pb::CreateRunRequest {
        agent: "parent".into(),
        input_json: json!({"mode": "one", "hold_ms": 20}).to_string(),
        hosted: true,
        ..Default::default()
    };
    let run = create_traced_run(&kernel, request).await;
    kernel.finished(&run.id).await;

    let spans = collector
        .until("both runs' spans", |spans| {
            ["run parent", "run child"]
                .iter()
                .all(|name| spans.iter().any(|span| span.name == *name))
        })
        .await;
    assert!(
        spans.iter().all(|span| span.trace_id == hex(AGENT_TRACE)),
        "one trace: {:#?}",
        names(&spans)
    );
    let by_name = |name: &str| spans.iter().find(|span| span.name == name).unwrap();
    let (parent, child) = (by_name("run parent"), by_name("run child"));
    assert_eq!(parent.parent_span_id, hex(AGENT_SPAN));
    assert_eq!(
        child.parent_span_id, parent.span_id,
        "the subagent's run sits under its parent's"
    );
    let dispatches: Vec<&Span> = spans.iter().filter(|span| span.name == "agent parent").collect();
    // The parent gave back the only slot while its child ran, so it was dispatched again.
    assert!(
        dispatches.len() >= 2,
        "a span per dispatch of the handler: {:#?}",
        names(&spans)
    );
    for dispatch in dispatches {
        check_attempt(&spans, dispatch, parent);
    }
    check_attempt(&spans, by_name("agent child"), child);
}

#[tokio::test]
async fn a_collector_that_is_down_costs_spans_never_calls() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kernel = kernel_exporting_to(&format!("http://127.0.0.1:{port}"));
    let _worker = kernel.fault_worker("w1");
    kernel.wait_for_workers("traced", 1).await;
    let run = create_traced_run(&kernel, run_of("unheard-agent")).await;
    let outcome = submit(&kernel, &run.id, 0, vec![call("traced", json!({}))])
        .await
        .unwrap();
    assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32, "{outcome:?}");
    kernel.complete(&run.id).await;
    kernel.process.log.wait_for("cannot export spans");
    // The kernel goes on serving.
    let again = create_traced_run(&kernel, run_of("unheard-agent")).await;
    let outcome = submit(&kernel, &again.id, 0, vec![call("traced", json!({}))])
        .await
        .unwrap();
    assert_eq!(outcome.results[0].status, pb::CallStatus::Ok as i32);
}

fn key_is(span: &Span, key: &str, attempt: &str) -> bool {
    attribute(span, "kernel.step.key").as_deref() == Some(key)
        && attribute(span, "kernel.attempt").as_deref() == Some(attempt)
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
