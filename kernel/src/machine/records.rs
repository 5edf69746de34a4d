//! Records for tests of the state machine (and of the scheduler's queue): a pending step and a
//! running run, to vary per case.

use crate::model::{Capture, Idempotency, Millis, RunId, RunRecord, RunStatus, StepKey, StepRecord, StepStatus};

/// The time every transition of these tests happens at.
pub const NOW: Millis = 1_000_000;

/// A pending call of `charge`, safe to retry, with no retry policy, that never ran.
pub fn step() -> StepRecord {
    StepRecord {
        run_id: RunId::parse("01a23000-0000-7000-8000-000000000001", "run").unwrap(),
        key: StepKey::for_call(0, 0, None),
        kind: crate::model::StepKind::Tool,
        effect: None,
        sealed: None,
        max_concurrency: None,
        hosted: false,
        turn: 0,
        position: 0,
        call_id: None,
        tool: "charge".into(),
        fingerprint: "f".into(),
        version: "1".into(),
        arguments: "{}".into(),
        call_hash: "h".into(),
        idempotency_key: "ik".into(),
        idempotency: Idempotency::SafeToRetry,
        timeout_ms: 30_000,
        status: StepStatus::Pending,
        attempts: 0,
        output: None,
        error: None,
        error_kind: None,
        worker: None,
        session_id: None,
        replica: None,
        dispatch_id: None,
        lease_expires_at: None,
        created_at: NOW - 10,
        started_at: None,
        finished_at: None,
        replays: 0,
        progress_count: 0,
        retry: None,
        blocking: false,
        not_before: None,
        lease_losses: 0,
        unit_cost: 0.5,
        cost: 0.0,
        decided_by: None,
        approval_gate: None,
        cache_ttl_ms: None,
        outcome: None,
        approval: None,
        resources: Vec::new(),
        from_run: None,
        limited_by: Vec::new(),
        limit_wait_ms: 0,
        share: None,
        trace: None,
    }
}

/// A running, interactive run with no calls yet.
pub fn run() -> RunRecord {
    RunRecord {
        id: step().run_id,
        agent: "billing".into(),
        status: RunStatus::Running,
        input: "{}".into(),
        output: None,
        reason: None,
        labels: Default::default(),
        idempotency_key: None,
        max_tool_calls: 0,
        interactive: true,
        permissions: Vec::new(),
        capture: Capture::Io,
        granted_by: None,
        hosted: false,
        dispatches: 0,
        parent: None,
        session_key: None,
        suspensions: 0,
        fork: None,
        allow: Vec::new(),
        trace: None,
        max_concurrency: 0,
        tool_calls: 0,
        budget: None,
        last_seq: 3,
        created_at: NOW - 1_000,
        updated_at: NOW - 1_000,
    }
}

/// A pending approval of [`step`], asked by the tool's own flag.
pub fn approval() -> crate::model::ApprovalRecord {
    crate::model::ApprovalRecord {
        id: "ap-1".into(),
        run_id: step().run_id,
        key: step().key,
        tool: "refund".into(),
        call_hash: "h".into(),
        arguments: "{}".into(),
        status: crate::model::ApprovalStatus::Pending,
        approvers: Vec::new(),
        message: None,
        decided_by: "tool:requires_approval".into(),
        requested_at: NOW - 5,
        expires_at: None,
        answered_at: None,
        decider: None,
        reason: None,
        capture: Capture::Io,
        answer: None,
    }
}

/// A new external run of agent `billing` with no limits, as a plain `CreateRun` asks for it.
pub fn new_run() -> crate::machine::run::NewRun {
    crate::machine::run::NewRun {
        agent: "billing".into(),
        input: "{}".into(),
        labels: Default::default(),
        idempotency_key: None,
        max_tool_calls: 0,
        interactive: true,
        permissions: Vec::new(),
        granted_by: None,
        capture: Capture::Io,
        hosted: None,
        parent: None,
        session_key: None,
        max_concurrency: 0,
        fork: None,
        allow: Vec::new(),
        trace: None,
        budget: Vec::new(),
        home: None,
    }
}
