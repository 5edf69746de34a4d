//! The commit feed: one connection per replica that `LISTEN`s for the notices the other
//! replicas send after their commits ([`crate::store::postgres::notice`]), and acts on each in the
//! order they were sent. A notice names rows; the feed reads them. The feed catches up from the
//! store (every run someone here listens to is read from the last event its channel carried, and
//! waiting calls are claimed) whenever it may have missed a notice: after its connection dropped
//! and was made again, and when a shard changes owner (a replica that stopped may have committed
//! without telling).
//!
//! This replica's own notices go out on another connection ([`announce`]), merged while one is on
//! its way, so the commits of a busy writer cost one notification per round trip, not one each.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::store::postgres::{Role, Target};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::error::KernelError;
use crate::hub::Hub;
use crate::model::{EventRecord, RunId, StepKey};
use crate::registry::Registry;
use crate::scheduler::Scheduler;
use crate::store::postgres::notice::{CHANNEL, Notice};
use crate::store::{Published, Store};

/// What the feed acts on.
#[derive(Clone)]
pub struct Feed {
    pub store: Store,
    pub hub: Hub,
    pub scheduler: Scheduler,
    pub registry: Registry,
    /// Runs whose committed events could not be read (the database went away meanwhile), each
    /// with the first event not yet published: read again until they are, and meanwhile no later
    /// event of the run is published ahead of them.
    behind: Arc<Mutex<BTreeMap<RunId, u64>>>,
    /// Changes when a shard changes owner ([`crate::cluster::link::Links::moves`]); `None` once
    /// the links are gone.
    moves: Option<watch::Receiver<u64>>,
}

/// How often runs left behind are read again.
const RETRY_BEHIND: Duration = Duration::from_millis(250);

/// The channel live progress of running calls goes out on: ephemeral, as on one kernel, so it is
/// never logged, and an update that does not fit a notification goes without its data.
const PROGRESS: &str = "kernel_progress";

/// Progress from another replica's worker, as sent.
#[derive(serde::Serialize, serde::Deserialize)]
struct RemoteProgress {
    #[serde(rename = "o")]
    origin: String,
    #[serde(rename = "u")]
    update: crate::hub::ProgressUpdate,
}

/// The most events read for one run from one notice or catch-up; a subscriber further behind
/// re-reads the store itself (its channel lags).
const MAX_EVENTS: u32 = 1_000;

impl Feed {
    /// The feed of the replica `store` writes for, acting on the others' news with `hub`,
    /// `scheduler` and `registry`, and catching up whenever `moves` changes.
    pub fn new(
        store: Store,
        (hub, scheduler, registry): (Hub, Scheduler, Registry),
        moves: watch::Receiver<u64>,
    ) -> Feed {
        Feed {
            store,
            hub,
            scheduler,
            registry,
            behind: Default::default(),
            moves: Some(moves),
        }
    }

    /// Listens on `target` until `shutdown`, reconnecting whenever the connection drops, and
    /// sends the notices of this replica's commits and the progress of its workers to the others.
    pub async fn run(mut self, target: Target, shutdown: CancellationToken) {
        let (progress, outgoing) = mpsc::unbounded_channel();
        self.hub.on_progress(progress);
        let origin = self.store.replica().to_owned();
        tokio::spawn(send_progress(
            Outbox::new(target.clone(), origin.clone()),
            outgoing,
            shutdown.clone(),
        ));
        let (notices, committed) = mpsc::unbounded_channel();
        self.store.announce_commits(notices);
        tokio::spawn(announce(
            Outbox::new(target.clone(), origin),
            committed,
            shutdown.clone(),
        ));
        let mut backoff = Duration::from_millis(100);
        let mut connected_before = false;
        loop {
            match listen(&target, self.store.replica()).await {
                Ok((client, mut notices)) => {
                    backoff = Duration::from_millis(100);
                    if connected_before {
                        info!("commit feed reconnected; catching up from the store");
                        self.catch_up().await;
                    }
                    connected_before = true;
                    loop {
                        let payload = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            payload = notices.recv() => payload,
                            _ = tokio::time::sleep(RETRY_BEHIND), if self.is_behind() => {
                                self.retry_behind().await;
                                continue;
                            }
                            moved = changed(&mut self.moves) => {
                                if moved {
                                    debug!("a shard changed owner; catching up from the store");
                                    self.catch_up().await;
                                } else {
                                    self.moves = None;
                                }
                                continue;
                            }
                        };
                        let Some((channel, payload)) = payload else { break };
                        if channel == PROGRESS {
                            self.progress(&payload);
                            continue;
                        }
                        match Notice::parse(&payload) {
                            Some(notice) if notice.origin != self.store.replica() => self.apply(notice).await,
                            Some(_) => {}
                            None => debug!(payload, "notice not understood, ignored"),
                        }
                    }
                    drop(client);
                    warn!("commit feed lost its connection; reconnecting");
                }
                Err(error) => warn!(%error, "commit feed cannot connect; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// Hands progress another replica's worker reported to the subscribers here.
    fn progress(&self, payload: &str) {
        match serde_json::from_str::<RemoteProgress>(payload) {
            Ok(remote) if remote.origin != self.store.replica() && self.hub.listens(&remote.update.run_id) => {
                self.hub.publish_remote_progress(remote.update)
            }
            Ok(_) => {}
            Err(error) => debug!(%error, "progress not understood, ignored"),
        }
    }

    /// Acts on one notice from another replica.
    async fn apply(&self, notice: Notice) {
        if notice.registry {
            self.reload_registry().await;
        }
        self.scheduler.claim(notice.tools, notice.agents);
        let mut runs = Vec::with_capacity(notice.runs.len());
        for (run, from, to) in notice.runs {
            let Ok(run) = RunId::parse(&run, "run") else { continue };
            if self.hub.listens(&run) {
                let count = u32::try_from(to.saturating_sub(from) + 1).unwrap_or(MAX_EVENTS);
                self.publish(&run, from, count.min(MAX_EVENTS)).await;
            }
            runs.push(run);
        }
        self.scheduler.remote_runs(runs);
    }

    /// Reads `count` events of `run` from `from` on, with the steps they changed, and publishes
    /// them to this replica's subscribers. A run already behind waits for its retry, which reads
    /// everything from its first event not published; one whose read fails falls behind.
    async fn publish(&self, run: &RunId, from: u64, count: u32) {
        if let Some(first) = self.behind.lock().expect("feed poisoned").get_mut(run) {
            *first = (*first).min(from);
            return;
        }
        if let Err(error) = self.read_and_publish(run, from, count).await {
            warn!(run_id = %run, %error, "cannot read events another replica committed; reading again");
            self.behind.lock().expect("feed poisoned").insert(run.clone(), from);
        }
    }

    async fn read_and_publish(&self, run: &RunId, from: u64, count: u32) -> Result<(), KernelError> {
        let published = read_published(&self.store, run.clone(), from, count).await?;
        self.hub.publish_remote(published);
        Ok(())
    }

    fn is_behind(&self) -> bool {
        !self.behind.lock().expect("feed poisoned").is_empty()
    }

    /// Reads again the runs left behind that someone here still listens to.
    async fn retry_behind(&self) {
        let behind = std::mem::take(&mut *self.behind.lock().expect("feed poisoned"));
        for (run, from) in behind {
            if !self.hub.listens(&run) {
                continue;
            }
            if self.read_and_publish(&run, from, MAX_EVENTS).await.is_err() {
                let mut behind = self.behind.lock().expect("feed poisoned");
                let first = behind.entry(run).or_insert(from);
                *first = (*first).min(from);
            } else {
                info!(run_id = %run, "caught up with events another replica committed");
            }
        }
    }

    /// After a gap in the feed: what each listened run committed past its channel's last event,
    /// the calls waiting for this replica's sessions, and the registry.
    async fn catch_up(&self) {
        self.reload_registry().await;
        for (run, last_seq) in self.hub.listened() {
            self.publish(&run, last_seq + 1, MAX_EVENTS).await;
        }
        if let Ok(offers) = self.scheduler.offers().await {
            self.scheduler
                .claim(offers.tools.into_keys().collect(), offers.agents.into_keys().collect());
        }
    }

    async fn reload_registry(&self) {
        let tools = self.store.reads.tools().await;
        let agents = self.store.reads.agents().await;
        match (tools, agents) {
            (Ok(tools), Ok(agents)) => self.registry.refresh(tools, &agents),
            (Err(error), _) | (_, Err(error)) => warn!(%error, "cannot reload the registry another replica changed"),
        }
    }
}

/// Events `from..from + count` of `run`, each with the step it names as the store has it now.
async fn read_published(store: &Store, run: RunId, from: u64, count: u32) -> Result<Vec<Published>, KernelError> {
    let events = store.reads.events(run.clone(), from, count).await?;
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let steps = store.reads.steps(run).await?;
    Ok(events
        .into_iter()
        .map(|event| {
            let step = step_key(&event).and_then(|key| steps.iter().find(|s| s.key == key).cloned());
            Published { event, step }
        })
        .collect())
}

/// The step an event is about, when its payload names one.
fn step_key(event: &EventRecord) -> Option<StepKey> {
    let payload: serde_json::Value = serde_json::from_str(&event.payload).ok()?;
    payload
        .get("step_key")
        .and_then(|key| key.as_str())
        .map(|key| StepKey::from_stored(key.to_owned()))
}

/// Whether a shard changed owner since last asked; `false` when the links are gone (the kernel is
/// stopping), and never ready again after that.
async fn changed(moves: &mut Option<watch::Receiver<u64>>) -> bool {
    match moves {
        Some(moves) => moves.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// A connection that sends notifications, made again when it drops.
struct Outbox {
    target: Target,
    origin: String,
    client: Option<tokio_postgres::Client>,
}

impl Outbox {
    fn new(target: Target, origin: String) -> Outbox {
        Outbox {
            target,
            origin,
            client: None,
        }
    }

    /// Sends `payloads` on `channel`, in one transaction when there are several (each
    /// notifying commit queues behind every other replica's).
    async fn notify(&mut self, channel: &str, payloads: &[String]) -> Result<(), String> {
        let describe = |e: tokio_postgres::Error| crate::store::describe_postgres_error(&e);
        if self.client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            let (client, connection) = self
                .target
                .config(Role::Feed, &self.origin)
                .connect(NoTls)
                .await
                .map_err(describe)?;
            tokio::spawn(connection);
            self.client = Some(client);
        }
        let client = self.client.as_mut().expect("connected above");
        if let [payload] = payloads {
            client
                .execute("SELECT pg_notify($1, $2)", &[&channel, payload])
                .await
                .map_err(describe)?;
            return Ok(());
        }
        let transaction = client.transaction().await.map_err(describe)?;
        for payload in payloads {
            transaction
                .execute("SELECT pg_notify($1, $2)", &[&channel, payload])
                .await
                .map_err(describe)?;
        }
        transaction.commit().await.map_err(describe)
    }
}

/// The longest a notice waits before it is sent again after a failed send.
const MAX_RESEND_AFTER: Duration = Duration::from_secs(1);

/// How long a stopping replica tries to send its last notices.
const LAST_NOTICE_WAIT: Duration = Duration::from_secs(1);

/// Sends the notices of this replica's commits, in commit order, merging all that arrived while
/// the last was on its way into one. A notice that could not be sent is sent again, merged with
/// the later ones, until it goes (a listener reading a run twice publishes nothing new).
async fn announce(mut outbox: Outbox, mut committed: mpsc::UnboundedReceiver<Notice>, shutdown: CancellationToken) {
    let mut pending: Option<Notice> = None;
    let mut resend_after = Duration::from_millis(50);
    loop {
        let mut notice = match pending.take() {
            Some(notice) => notice,
            None => tokio::select! {
                biased;
                notice = committed.recv() => match notice {
                    Some(notice) => notice,
                    None => return,
                },
                _ = shutdown.cancelled() => break,
            },
        };
        while let Ok(later) = committed.try_recv() {
            notice.merge(later);
        }
        match outbox.notify(CHANNEL, &notice.payloads()).await {
            Ok(()) => resend_after = Duration::from_millis(50),
            Err(error) => {
                debug!(%error, "cannot tell the other replicas of this one's commits; sending again");
                pending = Some(notice);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(resend_after) => {}
                }
                resend_after = (resend_after * 2).min(MAX_RESEND_AFTER);
            }
        }
    }
    // What the last commits wrote, if it can still go: the others would otherwise learn of it
    // only when this replica's shards move.
    let mut last = pending.unwrap_or_else(|| Notice {
        origin: outbox.origin.clone(),
        ..Notice::default()
    });
    while let Ok(later) = committed.try_recv() {
        last.merge(later);
    }
    if !last.is_empty() {
        let _ = tokio::time::timeout(LAST_NOTICE_WAIT, outbox.notify(CHANNEL, &last.payloads())).await;
    }
}

/// Sends the progress of this replica's workers as notifications. An update that finds no
/// connection is dropped, as progress no one listens to is on one kernel.
async fn send_progress(
    mut outbox: Outbox,
    mut updates: mpsc::UnboundedReceiver<crate::hub::ProgressUpdate>,
    shutdown: CancellationToken,
) {
    loop {
        let update = tokio::select! {
            _ = shutdown.cancelled() => return,
            update = updates.recv() => match update {
                Some(update) => update,
                None => return,
            },
        };
        let mut remote = RemoteProgress {
            origin: outbox.origin.clone(),
            update,
        };
        let mut payload = serde_json::to_string(&remote).expect("progress serializes");
        if payload.len() > 7_000 {
            remote.update.data_json = String::new();
            remote.update.message = remote.update.message.chars().take(1_000).collect();
            payload = serde_json::to_string(&remote).expect("progress serializes");
        }
        if let Err(error) = outbox.notify(PROGRESS, &[payload]).await {
            debug!(%error, "progress not sent to the other replicas");
        }
    }
}

/// Connects and listens on both channels; `(channel, payload)` arrive on the receiver until the
/// connection ends.
async fn listen(
    target: &Target,
    replica: &str,
) -> Result<(tokio_postgres::Client, mpsc::UnboundedReceiver<(String, String)>), KernelError> {
    let (client, mut connection) =
        target.config(Role::Feed, replica).connect(NoTls).await.map_err(|e| {
            KernelError::Unavailable(format!("commit feed: {}", crate::store::describe_postgres_error(&e)))
        })?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(note)) => {
                    if tx.send((note.channel().to_owned(), note.payload().to_owned())).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    debug!(%error, "commit feed connection ended");
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {PROGRESS}"))
        .await
        .map_err(|e| KernelError::Unavailable(format!("commit feed: {}", crate::store::describe_postgres_error(&e))))?;
    Ok((client, rx))
}
