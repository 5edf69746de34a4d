//! Kernel replicas on one PostgreSQL database. There is no leader: each replica renews a row of
//! its own in `replicas`, whose heartbeat dates every lease it holds (one write per replica per
//! heartbeat, however many calls it runs) and lists what its worker sessions offer. A replica
//! whose row goes stale past the lease TTL is dead: any live replica records the loss of its
//! leases (a `safe_to_retry` call runs again, an `at_most_once` one becomes indeterminate) through
//! the same fenced write as a lost worker, so a lease is lost once however many replicas see it.
//!
//! What one replica commits reaches the others over `NOTIFY` ([`feed`]): their subscribers read
//! the new events, their schedulers claim calls their sessions offer, their registries reload.

pub mod feed;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::KernelError;
use crate::model::{Millis, StepRecord};
use crate::registry::Registry;
use crate::scheduler::Scheduler;
use crate::store::{LeaseLoss, LossOutcome, ReplicaBeat, ReplicaRow, Store};

/// What a replica's worker sessions offer, by name with fingerprint, and the sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offers {
    pub tools: BTreeMap<String, String>,
    pub agents: BTreeMap<String, String>,
    /// The registered sessions, as `workers list` shows them.
    #[serde(default)]
    pub workers: Vec<crate::scheduler::WorkerSnapshot>,
}

/// Whether `row` renewed its leases within `ttl` of `now`.
fn alive(row: &ReplicaRow, now: Millis, ttl: Duration) -> bool {
    row.heartbeat_at >= now - ttl.as_millis() as Millis
}

/// The replicas whose rows are fresh, this one excluded.
pub async fn live_replicas(store: &Store, ttl: Duration) -> Result<Vec<ReplicaRow>, KernelError> {
    let now = store.clock().now_millis();
    Ok(store
        .reads
        .replicas()
        .await?
        .into_iter()
        .filter(|row| row.id != store.replica() && alive(row, now, ttl))
        .collect())
}

/// Renews this replica's row every heartbeat, tells the scheduler what the others offer, and
/// takes over the leases of replicas that stopped renewing theirs.
pub async fn heartbeat(store: Store, scheduler: Scheduler, registry: Registry, shutdown: CancellationToken) {
    let config = scheduler.config().clone();
    let started_at = store.clock().now_millis();
    let mut tick = tokio::time::interval(config.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Since when this replica's own beats have all landed. After an outage every row looks old:
    // no replica judges another before it has itself beaten for a whole TTL, time enough for
    // every live replica to beat again.
    let mut healthy_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match beat(&store, &scheduler, started_at).await {
            Ok(rows) => {
                let since = *healthy_since.get_or_insert_with(tokio::time::Instant::now);
                let now = store.clock().now_millis();
                let (live, dead): (Vec<ReplicaRow>, Vec<ReplicaRow>) = rows
                    .into_iter()
                    .filter(|row| row.id != store.replica())
                    .partition(|row| alive(row, now, config.lease_ttl));
                let offers: Vec<(String, Offers)> = live
                    .iter()
                    .map(|row| (row.id.clone(), serde_json::from_str(&row.offers).unwrap_or_default()))
                    .collect();
                registry.offered_elsewhere(offers.iter().flat_map(|(_, o)| o.tools.keys().cloned()).collect());
                scheduler.remote_offers(offers);
                if since.elapsed() >= config.lease_ttl {
                    for row in dead {
                        take_over(&store, row).await;
                    }
                }
            }
            Err(error) => {
                if healthy_since.take().is_some() {
                    warn!(%error, "cannot renew this replica's leases");
                }
            }
        }
    }
}

/// One renewal, then every replica's row as it stands.
async fn beat(store: &Store, scheduler: &Scheduler, started_at: Millis) -> Result<Vec<ReplicaRow>, KernelError> {
    let offers = scheduler.offers().await?;
    store
        .beat(ReplicaBeat {
            started_at,
            offers: serde_json::to_string(&offers).expect("offers serialize"),
        })
        .await?;
    store.reads.replicas().await
}

/// Records the loss of every lease a dead replica held (what may run again is queued here by the
/// commits' effects; another replica hears of it through the commit's notice), and removes the
/// dead replica's row.
async fn take_over(store: &Store, row: ReplicaRow) {
    let reason = format!("kernel replica {} stopped renewing its leases", row.id);
    match lose_all(store, row.id.clone(), &reason).await {
        Ok((requeued, indeterminate)) => {
            if !requeued.is_empty() || indeterminate > 0 {
                warn!(
                    replica = row.id,
                    requeued = requeued.len(),
                    indeterminate,
                    "took over a dead replica's leases"
                );
            }
            if let Err(error) = store.forget_replica(row.id.clone(), Some(row.heartbeat_at)).await {
                warn!(replica = row.id, %error, "cannot remove a dead replica's row");
            }
        }
        Err(error) => warn!(replica = row.id, %error, "cannot take over a dead replica's leases"),
    }
}

/// Records the loss of every lease `replica` holds: the steps to run again, and how many became
/// indeterminate.
async fn lose_all(store: &Store, replica: String, reason: &str) -> Result<(Vec<StepRecord>, usize), KernelError> {
    let held = store.reads.held_by(replica).await?;
    // A running step names its dispatch; one that does not is held by none to lose.
    let losses = held.iter().filter_map(|step| {
        let dispatch_id = step.dispatch_id.clone()?;
        Some(store.lose_lease(LeaseLoss {
            dispatch_id,
            attempt: step.attempts,
            reason: reason.to_owned(),
        }))
    });
    let mut requeued = Vec::new();
    let mut indeterminate = 0;
    // All at once, so the writer folds them into a few transactions.
    for outcome in futures_util::future::join_all(losses).await {
        match outcome? {
            LossOutcome::Requeued(step) => requeued.push(step),
            LossOutcome::Indeterminate(_) => indeterminate += 1,
            LossOutcome::NotHeld => {}
        }
    }
    Ok((requeued, indeterminate))
}

/// At a graceful stop, after the worker streams have drained: hands back the leases this replica
/// still holds, so the other replicas run them again at once instead of after a TTL, and removes
/// its row.
pub async fn hand_back(store: &Store) {
    match lose_all(store, store.replica().to_owned(), "kernel replica shut down").await {
        Ok((requeued, indeterminate)) => {
            if !requeued.is_empty() || indeterminate > 0 {
                info!(
                    requeued = requeued.len(),
                    indeterminate, "handed back the calls this replica held"
                );
            }
        }
        Err(error) => warn!(%error, "cannot hand back this replica's calls; another replica takes them over"),
    }
    if let Err(error) = store.forget_replica(store.replica().to_owned(), None).await {
        warn!(%error, "cannot remove this replica's row");
    }
}
