//! The writes of a run go to the one replica that owns the run's shard
//! ([`crate::cluster::shards`]). A replica asked for a write of a run it does not own sends it,
//! encoded, to the owner ([`Router`]), which applies it through its own store as if it had been
//! asked, and sends back the answer. On SQLite, and for a run this replica owns, nothing is
//! encoded: the write goes to this store's writer.
//!
//! What travels is the write as the store's caller made it (a turn already planned and checked
//! against the policy, a worker's result), never a half-done transaction: the owner's writer
//! decides everything again from its database, as for a write of its own.

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::{
    Answer, EndRun, Fence, LeaseLoss, LocalStep, NewRun, PersonAsk, ResultReport, StartDispatch, StepGate, Store,
    SubagentStart, SuspendReport, ToolCacheSet, TurnPlan,
};
use crate::error::KernelError;
use crate::model::{ApprovalId, DispatchId, Outcome, RunId, StepKey};

/// A write sent to the owner of its run's shard.
#[derive(Debug, Serialize, Deserialize)]
pub enum Forwarded {
    CreateRun(Box<NewRun>),
    /// A turn, without the worker slots the sender reserved (they are the sender's own).
    Turn(Box<TurnPlan>),
    Start(StartDispatch),
    Result(ResultReport),
    Suspend(SuspendReport),
    LoseLease(LeaseLoss),
    TimeOut(DispatchId, u32),
    FailPending {
        run: RunId,
        key: StepKey,
        message: String,
        #[serde(with = "crate::wire::reason")]
        reason: crate::wire::Reason,
        outcome: Outcome,
    },
    EndRun(RunId, EndRun),
    CancelCall(RunId, StepKey, String),
    AnswerApproval {
        id: ApprovalId,
        answer: Answer,
        decider: String,
        reason: Option<String>,
    },
    NoteReplays(RunId, Vec<StepKey>),
    ToolCacheSet(ToolCacheSet),
    RecordStep(RunId, Fence, Box<(LocalStep, StepGate)>),
    CheckStep(RunId, Fence, Box<(LocalStep, StepGate)>),
    StartSubagent(Box<SubagentStart>),
    AskPerson(Box<PersonAsk>),
    DeleteRun(RunId),
}

/// An encoded answer or write.
pub type Bytes = Vec<u8>;

/// What sending a write to its owner came to.
pub enum Sent {
    /// The owner's encoded answer.
    Answered(Bytes),
    /// The shard is this replica's now: apply the write here.
    Here,
}

/// Where writes go: this replica, or the owner of their shard. The cluster sets one on a store of
/// replicas; a store without one (SQLite) writes everything itself.
pub trait Router: Send + Sync + 'static {
    /// Whether this replica owns `shard` as far as it knows.
    fn here(&self, shard: u32) -> bool {
        self.epoch(shard).is_some()
    }

    /// The epoch at which this replica owns `shard`, as far as it knows.
    fn epoch(&self, shard: u32) -> Option<i64>;

    /// How many times what this replica owns has changed.
    fn generation(&self) -> u64;

    /// A shard this replica owns, to make a new run in; `None` while it owns none.
    fn home(&self) -> Option<u32>;

    /// Sends `command` to the owner of `shard`, waiting (boundedly) for one to exist and answer.
    fn send(&self, shard: u32, command: Bytes) -> Pin<Box<dyn Future<Output = Result<Sent, KernelError>> + Send>>;
}

/// Whether the replica `router` speaks for may write the run `run` (its id) itself: it owns the
/// run's shard, or there are no shards (no router: SQLite).
pub fn may_write(router: Option<&dyn Router>, run: &str) -> bool {
    router.is_none_or(|router| router.here(crate::cluster::shards::shard_of_text(run)))
}

/// A write that is this replica's to apply, or the owner's answer to it.
enum Routed<V, T> {
    Here(V),
    Done(Result<T, KernelError>),
}

/// How often a write whose shard moved under it is tried again (its owner's view of the shards
/// catches up at its next heartbeat), and the longest pause between tries.
const MOVED_TRIES: u32 = 24;
const MOVED_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

impl Store {
    /// Applies a write of `shard`: here, with `command` made of `value`, when this replica owns
    /// the shard (or there are no shards), else at the owner, sent as `wrap` makes it. A write
    /// refused because the shard moved under it changed nothing, and is tried again wherever the
    /// shard is then.
    pub(super) async fn write<V: Clone, T: DeserializeOwned>(
        &self,
        shard: u32,
        value: V,
        wrap: impl Fn(V) -> Forwarded,
        command: impl Fn(V, oneshot::Sender<Result<T, KernelError>>) -> super::writer::Command,
    ) -> Result<T, KernelError> {
        let mut value = value;
        let mut pause = std::time::Duration::from_millis(20);
        for _ in 0..MOVED_TRIES {
            let here = match self.route(shard, value, &wrap).await {
                Routed::Here(here) => here,
                Routed::Done(answer) => return answer,
            };
            if self.router.get().is_none() {
                return self.send(|reply| command(here, reply)).await;
            }
            value = here.clone();
            match self.send(|reply| command(here, reply)).await {
                Err(KernelError::Moved(why)) => {
                    tracing::debug!(shard, why, "shard moved under a write; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MOVED_PAUSE_MAX);
                }
                answer => return answer,
            }
        }
        Err(KernelError::Moved(format!(
            "shard {shard} kept moving: no replica owned it long enough to take the write; try again"
        )))
    }

    /// Sends `value` (as `wrap` makes it a [`Forwarded`]) to the owner of `shard` when that is
    /// another replica, and gives back its answer; otherwise gives `value` back to apply here.
    async fn route<V: Clone, T: DeserializeOwned>(
        &self,
        shard: u32,
        value: V,
        wrap: &impl Fn(V) -> Forwarded,
    ) -> Routed<V, T> {
        let Some(router) = self.router.get() else {
            return Routed::Here(value);
        };
        if router.here(shard) {
            return Routed::Here(value);
        }
        let command = encode(&wrap(value.clone()));
        match router.send(shard, command).await {
            Ok(Sent::Here) => Routed::Here(value),
            Ok(Sent::Answered(bytes)) => Routed::Done(decode::<Result<T, KernelError>>(&bytes).and_then(|r| r)),
            Err(error) => Routed::Done(Err(error)),
        }
    }

    /// Sets where writes go; once, when the cluster starts.
    pub fn set_router(&self, router: std::sync::Arc<dyn Router>) {
        let _ = self.router.set(router);
    }

    /// Whether this replica may write `run` itself: it owns the run's shard, or there are no shards.
    pub fn owns(&self, run: &RunId) -> bool {
        may_write(self.router.get().map(|router| router.as_ref()), run.as_str())
    }

    /// Applies a write another replica sent, through this store as if it had been asked here (a
    /// write whose shard moved on meanwhile goes on to the new owner); the encoded answer.
    pub async fn apply_forwarded(&self, command: Forwarded) -> Bytes {
        match command {
            Forwarded::CreateRun(new) => encode(&self.create_run_dispatching(*new).await),
            Forwarded::Turn(plan) => encode(&self.record_turn(*plan).await),
            Forwarded::Start(start) => encode(&self.start_dispatch(start).await),
            Forwarded::Result(report) => encode(&self.record_outcome(report).await),
            Forwarded::Suspend(report) => encode(&self.suspend_dispatch(report).await),
            Forwarded::LoseLease(loss) => encode(&self.lose_lease(loss).await),
            Forwarded::TimeOut(dispatch, attempt) => encode(&self.time_out(dispatch, attempt).await),
            Forwarded::FailPending {
                run,
                key,
                message,
                reason,
                outcome,
            } => encode(&self.fail_pending(run, key, message, (reason, outcome)).await),
            Forwarded::EndRun(run, end) => encode(&self.end_run(run, end).await),
            Forwarded::CancelCall(run, key, reason) => encode(&self.cancel_call(run, key, reason).await),
            Forwarded::AnswerApproval {
                id,
                answer,
                decider,
                reason,
            } => encode(&self.answer_approval(id, answer, decider, reason).await),
            Forwarded::NoteReplays(run, keys) => {
                self.note_replays(run, keys);
                encode(&Ok::<(), KernelError>(()))
            }
            Forwarded::ToolCacheSet(set) => encode(&self.tool_cache_set(set).await),
            Forwarded::RecordStep(run, fence, step) => {
                let (local, gate) = *step;
                encode(&self.record_step((run, fence), local, gate).await)
            }
            Forwarded::CheckStep(run, fence, step) => {
                let (local, gate) = *step;
                encode(&self.check_step((run, fence), local, gate).await)
            }
            Forwarded::StartSubagent(start) => encode(&self.start_subagent(*start).await),
            Forwarded::AskPerson(ask) => encode(&self.ask_person(*ask).await),
            Forwarded::DeleteRun(run) => encode(&self.delete_run(run).await),
        }
    }
}

impl Forwarded {
    /// Reads a write another replica sent.
    pub fn decode(bytes: &[u8]) -> Result<Forwarded, KernelError> {
        decode(bytes)
    }

    /// The shard the write must be applied in, when the write names it; `None` for an answer to an
    /// approval (whose run is read) and a run made wherever its owner likes.
    pub fn shard(&self) -> Option<u32> {
        use crate::cluster::shards::shard_of;
        match self {
            Forwarded::CreateRun(new) => crate::machine::command::create_run::shard(new).or(new.home),
            Forwarded::Turn(plan) => Some(shard_of(&plan.run_id)),
            Forwarded::Start(start) => Some(shard_of(&start.run_id)),
            Forwarded::Result(report) => Some(report.dispatch_id.shard()),
            Forwarded::Suspend(report) => Some(report.dispatch_id.shard()),
            Forwarded::LoseLease(loss) => Some(loss.dispatch_id.shard()),
            Forwarded::TimeOut(dispatch, _) => Some(dispatch.shard()),
            Forwarded::ToolCacheSet(set) => Some(set.dispatch_id.shard()),
            Forwarded::FailPending { run, .. }
            | Forwarded::EndRun(run, _)
            | Forwarded::CancelCall(run, ..)
            | Forwarded::NoteReplays(run, _)
            | Forwarded::RecordStep(run, ..)
            | Forwarded::CheckStep(run, ..)
            | Forwarded::DeleteRun(run) => Some(shard_of(run)),
            Forwarded::StartSubagent(start) => Some(shard_of(&start.parent)),
            Forwarded::AskPerson(ask) => Some(shard_of(&ask.run)),
            Forwarded::AnswerApproval { .. } => None,
        }
    }
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    serde_json::to_vec(value).expect("a forwarded write or answer serializes")
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, KernelError> {
    serde_json::from_slice(bytes).map_err(|error| {
        KernelError::Unavailable(format!(
            "another replica sent what this one cannot read (a replica of another build?): {error}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::shards::{shard_of, shard_of_key};
    use crate::machine::command::submit_turn::RecordedTurn;
    use crate::model::DispatchId;

    #[test]
    fn a_write_names_the_shard_of_its_run_and_reads_back_whole() {
        let mut new = crate::machine::records::new_run();
        new.idempotency_key = Some("order-7".into());
        let sent = decode::<Forwarded>(&encode(&Forwarded::CreateRun(Box::new(new)))).unwrap();
        assert_eq!(sent.shard(), Some(shard_of_key("order-7")));
        let Forwarded::CreateRun(new) = sent else {
            panic!("{sent:?}")
        };
        assert_eq!(new.idempotency_key.as_deref(), Some("order-7"));

        // A dispatch made for a run names the run's shard, so a worker's answer goes to its owner.
        let run = RunId::new();
        let time_out = Forwarded::TimeOut(DispatchId::in_shard_of(&run), 2);
        assert_eq!(
            decode::<Forwarded>(&encode(&time_out)).unwrap().shard(),
            Some(shard_of(&run))
        );
    }

    #[test]
    fn an_answer_keeps_its_static_reasons_and_its_error_kind() {
        let turn: Result<RecordedTurn, KernelError> = Ok(RecordedTurn {
            ended_because: Some("replay_input_changed"),
            ..RecordedTurn::default()
        });
        let back: Result<RecordedTurn, KernelError> = decode(&encode(&turn)).unwrap();
        assert_eq!(back.unwrap().ended_because, Some("replay_input_changed"));
        let refused: Result<RecordedTurn, KernelError> = Err(KernelError::invalid("calls[0].arguments", "not JSON"));
        let back: Result<RecordedTurn, KernelError> = decode(&encode(&refused)).unwrap();
        let error = back.unwrap_err();
        assert!(matches!(error, KernelError::InvalidArgument { .. }), "{error:?}");
        assert_eq!(error.to_string(), "calls[0].arguments: not JSON");
    }

    #[test]
    fn what_another_build_sends_is_refused_as_unavailable() {
        let error = Forwarded::decode(br#"{"Teleport": 1}"#).unwrap_err();
        assert!(matches!(error, KernelError::Unavailable(_)), "{error:?}");
    }
}
