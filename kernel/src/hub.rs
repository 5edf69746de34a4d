//! Live fan-out of what happens to a run: committed events (published by the store writer after
//! each commit) and ephemeral progress (published by worker sessions, never logged).
//!
//! Subscribers are agents waiting for their turn's results and event watchers. A subscriber that
//! falls behind is told it lagged and re-reads from the store, which is the truth. A run's channel
//! lives exactly as long as it has subscribers: the last one to leave drops it, so a thousand
//! finished turns leave nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::model::{RunId, StepKey};
use crate::store::Published;

/// Per-run buffer, allocated when a run gets its first subscriber; a subscriber further behind
/// than this re-reads from the store.
const CAPACITY: usize = 256;

/// An ephemeral progress update of a running call.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ProgressUpdate {
    #[serde(with = "run_id_text")]
    pub run_id: RunId,
    pub key: StepKey,
    pub position: u32,
    pub tool: String,
    pub message: String,
    pub data_json: String,
    pub current: u64,
    pub total: u64,
}

/// A run id as its text, for the progress other replicas are told of.
mod run_id_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::model::RunId;

    pub fn serialize<S: Serializer>(run: &RunId, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(run.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<RunId, D::Error> {
        let text = String::deserialize(deserializer)?;
        RunId::parse(&text, "run_id").map_err(serde::de::Error::custom)
    }
}

/// What a run's subscribers receive.
#[derive(Clone, Debug)]
pub enum Signal {
    /// The events one commit appended to the run, in order, each with the step it changed when
    /// there is one. One signal per commit, not per event: a turn of a thousand calls is one
    /// signal where it was two thousand, so a subscriber neither wakes per event nor lags behind
    /// a big commit.
    Events(Arc<Vec<Published>>),
    Progress(Arc<ProgressUpdate>),
}

/// A run's channel, the last event sequence number it carried, and the first it skipped.
struct Channel {
    sender: broadcast::Sender<Signal>,
    last_seq: u64,
    /// Events after the first it carried came with a gap before them: among replicas, a run's new
    /// owner publishes its own events while the old owner's last ones are still on their way in
    /// a commit notice. Until they arrive, a catch-up reads from here.
    gap_from: Option<u64>,
}

/// The registry of per-run channels; a cheap handle.
#[derive(Clone, Default)]
pub struct Hub {
    runs: Arc<Mutex<HashMap<RunId, Channel>>>,
    /// Where progress of this replica's workers goes for the other replicas (on PostgreSQL).
    replicas: Arc<std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<ProgressUpdate>>>,
    /// Where committed events go to become spans, with `--otlp-endpoint`.
    traces: Arc<std::sync::OnceLock<crate::traces::Sink>>,
}

impl Hub {
    /// Subscribes to a run's signals; subscribe before reading the store so nothing falls between.
    pub fn subscribe(&self, run: &RunId) -> Subscription {
        let receiver = self
            .runs
            .lock()
            .expect("hub poisoned")
            .entry(run.clone())
            .or_insert_with(|| Channel {
                sender: broadcast::channel(CAPACITY).0,
                last_seq: 0,
                gap_from: None,
            })
            .sender
            .subscribe();
        Subscription {
            receiver,
            run: run.clone(),
            hub: self.clone(),
        }
    }

    fn send(&self, run: &RunId, signal: Signal) {
        let mut runs = self.runs.lock().expect("hub poisoned");
        if let Some(channel) = runs.get_mut(run) {
            // No receiver is not an error: the last one may be leaving right now.
            let _ = channel.sender.send(signal);
        }
    }

    /// Sends each run listened to here the events `published` appended to it, as one signal.
    fn send_events(&self, published: Vec<Published>) {
        let mut by_run: HashMap<RunId, Vec<Published>> = HashMap::new();
        for item in published {
            by_run.entry(item.event.run_id.clone()).or_default().push(item);
        }
        let mut runs = self.runs.lock().expect("hub poisoned");
        for (run, events) in by_run {
            if let Some(channel) = runs.get_mut(&run) {
                let first = events.first().map_or(0, |item| item.event.seq);
                let last = events.last().map_or(0, |item| item.event.seq);
                if channel.gap_from.is_some_and(|gap| (first..=last).contains(&gap)) {
                    channel.gap_from = None;
                }
                if channel.last_seq > 0 && first > channel.last_seq + 1 && channel.gap_from.is_none() {
                    channel.gap_from = Some(channel.last_seq + 1);
                }
                channel.last_seq = channel.last_seq.max(last);
                let _ = channel.sender.send(Signal::Events(Arc::new(events)));
            }
        }
    }

    /// Runs with a live channel: a turn waiting for its results or a watcher.
    pub fn channels(&self) -> usize {
        self.runs.lock().expect("hub poisoned").len()
    }

    /// Whether someone here listens to `run`.
    pub fn listens(&self, run: &RunId) -> bool {
        self.runs.lock().expect("hub poisoned").contains_key(run)
    }

    /// The runs someone here listens to, each with the last sequence number up to which its
    /// channel carried every event since its first: a catch-up reads from the one after.
    pub fn listened(&self) -> Vec<(RunId, u64)> {
        let runs = self.runs.lock().expect("hub poisoned");
        runs.iter()
            .map(|(run, channel)| (run.clone(), channel.gap_from.map_or(channel.last_seq, |gap| gap - 1)))
            .collect()
    }

    /// Publishes events another replica committed (read back from the store), to this replica's
    /// subscribers only: waking hosted dispatches is the claiming replica's business.
    pub fn publish_remote(&self, published: Vec<Published>) {
        self.send_events(published);
    }

    /// Sends what every commit publishes to `traces` too, to be exported as spans.
    pub fn on_commit_trace(&self, traces: crate::traces::Sink) {
        let _ = self.traces.set(traces);
    }

    /// Whether commits become spans here (`--otlp-endpoint`).
    pub fn exports_traces(&self) -> bool {
        self.traces.get().is_some()
    }

    /// Publishes what a store batch committed.
    pub fn publish_committed(&self, published: Vec<Published>) {
        if let Some(traces) = self.traces.get() {
            traces.committed(&published);
        }
        self.send_events(published);
    }

    /// Sends every progress update of this replica's workers to `replicas` too, to be told to
    /// the other replicas' subscribers.
    pub fn on_progress(&self, replicas: tokio::sync::mpsc::UnboundedSender<ProgressUpdate>) {
        let _ = self.replicas.set(replicas);
    }

    /// Publishes a progress update of a worker connected here.
    pub fn publish_progress(&self, update: ProgressUpdate) {
        if let Some(replicas) = self.replicas.get() {
            let _ = replicas.send(update.clone());
        }
        self.publish_remote_progress(update);
    }

    /// Publishes a progress update another replica's worker reported, to this replica's subscribers.
    pub fn publish_remote_progress(&self, update: ProgressUpdate) {
        let run = update.run_id.clone();
        self.send(&run, Signal::Progress(Arc::new(update)));
    }
}

/// One subscriber's view of a run's signals; dropping the last one frees the run's channel.
pub struct Subscription {
    receiver: broadcast::Receiver<Signal>,
    run: RunId,
    hub: Hub,
}

impl Subscription {
    /// The next signal, or `Lagged` when this subscriber fell behind (re-read the store).
    pub async fn recv(&mut self) -> Result<Signal, broadcast::error::RecvError> {
        self.receiver.recv().await
    }

    #[cfg(test)]
    pub fn try_recv(&mut self) -> Result<Signal, broadcast::error::TryRecvError> {
        self.receiver.try_recv()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut runs = self.hub.runs.lock().expect("hub poisoned");
        // Under the lock nobody can subscribe, and this receiver keeps the channel in the map, so
        // a count of one is this subscriber alone.
        if runs
            .get(&self.run)
            .is_some_and(|channel| channel.sender.receiver_count() == 1)
        {
            runs.remove(&self.run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_subscriber_to_leave_frees_the_runs_channel() {
        let hub = Hub::default();
        let (one, two) = (RunId::new(), RunId::new());
        let first = hub.subscribe(&one);
        let second = hub.subscribe(&one);
        let other = hub.subscribe(&two);
        assert_eq!(hub.channels(), 2);
        drop(first);
        assert_eq!(hub.channels(), 2, "a subscriber is still listening to the run");
        drop(second);
        assert_eq!(hub.channels(), 1, "the run's channel left with its last subscriber");
        drop(other);
        assert_eq!(hub.channels(), 0);
    }

    fn published(run: &RunId, seq: u64) -> Published {
        Published {
            event: crate::model::EventRecord {
                run_id: run.clone(),
                seq,
                kind: crate::model::EventType::ToolScheduled,
                schema_version: 1,
                at: 0,
                payload: "{}".into(),
            },
            step: None,
        }
    }

    #[test]
    fn a_commit_reaches_each_runs_subscribers_as_one_signal_in_order() {
        let hub = Hub::default();
        let (one, two, unheard) = (RunId::new(), RunId::new(), RunId::new());
        let (mut first, mut second) = (hub.subscribe(&one), hub.subscribe(&two));
        // More events than a channel holds signals: one commit of a big turn must not lag.
        let mut commit: Vec<Published> = (1..=CAPACITY as u64 * 2).map(|seq| published(&one, seq)).collect();
        commit.insert(3, published(&two, 7));
        commit.push(published(&unheard, 1));
        hub.publish_committed(commit);
        let seqs = |subscription: &mut Subscription| match subscription.try_recv() {
            Ok(Signal::Events(events)) => events.iter().map(|item| item.event.seq).collect::<Vec<_>>(),
            other => panic!("expected the commit's events, got {other:?}"),
        };
        assert_eq!(seqs(&mut first), (1..=CAPACITY as u64 * 2).collect::<Vec<_>>());
        assert_eq!(seqs(&mut second), [7]);
        assert!(
            first.try_recv().is_err() && second.try_recv().is_err(),
            "one signal per commit"
        );
        assert_eq!(
            hub.listened()
                .into_iter()
                .find(|(run, _)| *run == one)
                .map(|(_, seq)| seq),
            Some(CAPACITY as u64 * 2)
        );
    }

    #[test]
    fn a_catch_up_reads_from_the_first_event_skipped_until_it_arrives() {
        let hub = Hub::default();
        let run = RunId::new();
        let _listening = hub.subscribe(&run);
        let caught_up_from = |hub: &Hub| hub.listened()[0].1 + 1;
        hub.publish_remote(vec![published(&run, 4), published(&run, 5)]);
        assert_eq!(caught_up_from(&hub), 6);
        // A new owner's own events, while the old owner's 6 and 7 are still on their way.
        hub.publish_committed(vec![published(&run, 8)]);
        hub.publish_committed(vec![published(&run, 9)]);
        assert_eq!(caught_up_from(&hub), 6, "a reconnected feed must read 6 and 7 again");
        hub.publish_remote(vec![published(&run, 6), published(&run, 7)]);
        assert_eq!(caught_up_from(&hub), 10);
    }

    #[tokio::test]
    async fn a_channel_made_again_after_its_subscribers_left_delivers() {
        let hub = Hub::default();
        let run = RunId::new();
        drop(hub.subscribe(&run));
        let mut again = hub.subscribe(&run);
        hub.publish_progress(ProgressUpdate {
            run_id: run.clone(),
            key: crate::model::StepKey::for_call(0, 0, None),
            position: 0,
            tool: "t".into(),
            message: "half".into(),
            data_json: String::new(),
            current: 1,
            total: 2,
        });
        match again.recv().await {
            Ok(Signal::Progress(update)) => assert_eq!(update.message, "half"),
            other => panic!("expected the progress update, got {other:?}"),
        }
    }
}
