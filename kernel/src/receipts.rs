//! Receipts of a run's settled calls ([`kernel_proto::receipt`]): made from what the store
//! recorded of each call, in the order the calls settled, chained and signed with the kernel's
//! key when exported. A receipt holds hashes of a call's arguments and result, never the values,
//! so it shows nothing the run's capture level hides.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use kernel_proto::receipt::{VERSION, sha256_hex};
use serde_json::{Value, json};

use crate::model::{RunRecord, StepKind, StepRecord};
use crate::store::Database;

/// The key receipts are signed with, read from its file: its 32-byte seed as 64 hex digits.
/// A file that does not exist is created with a new key (readable by its owner only).
pub fn load_or_create(path: &Path) -> Result<SigningKey, String> {
    crate::key_file::seed(path, "an ed25519 seed").map(|seed| SigningKey::from_bytes(&seed))
}

/// Where the key is kept when `--receipt-key` is not given: beside a SQLite file. PostgreSQL's
/// replicas must share one, so it is given to each.
pub fn default_path(db: &Database) -> Option<PathBuf> {
    crate::key_file::beside(db, ".receipt-key")
}

/// The receipts of `run`'s settled tool calls, in the order they settled, not yet chained.
pub fn of_run(run: &RunRecord, steps: &[StepRecord]) -> Vec<Value> {
    let mut settled: Vec<&StepRecord> = steps
        .iter()
        .filter(|step| step.kind == StepKind::Tool && step.status.is_terminal())
        .collect();
    settled.sort_by(|a, b| {
        (a.finished_at, a.turn, a.position, a.key.as_str()).cmp(&(b.finished_at, b.turn, b.position, b.key.as_str()))
    });
    settled
        .into_iter()
        .enumerate()
        .map(|(index, step)| receipt(run, index + 1, step))
        .collect()
}

/// One call's receipt: who and what it was, what decided it, the hashes of its arguments and of
/// its result (or error), and when.
fn receipt(run: &RunRecord, n: usize, step: &StepRecord) -> Value {
    let result = step.output.as_deref().or(step.error.as_deref()).unwrap_or_default();
    let approval = step.approval.as_ref().map(|approval| {
        json!({
            "id": approval.approval_id.to_string(),
            "answer": approval.answer.as_str(),
            "decider": approval.decider,
            "answered_at": approval.answered_at,
        })
    });
    json!({
        "v": VERSION,
        "run": run.id.to_string(),
        "agent": run.agent,
        "n": n,
        "step": step.key.as_str(),
        "tool": step.tool,
        "version": step.version,
        "fingerprint": step.fingerprint,
        "call_hash": step.call_hash,
        "idempotency_key": step.idempotency_key,
        "arguments_sha256": sha256_hex(step.arguments.as_bytes()),
        "result_sha256": sha256_hex(result.as_bytes()),
        "status": step.status.as_str(),
        "outcome": step.outcome().map(|outcome| outcome.as_str()),
        "decided_by": step.decided_by,
        "approval": approval,
        "attempts": step.attempts,
        "cost": step.cost,
        "worker": step.worker,
        "created_at": step.created_at,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
    })
}
