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
pub mod link;
pub mod shards;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::KernelError;
use crate::model::{Millis, StepRecord};
use crate::registry::Registry;
use crate::scheduler::Scheduler;
use crate::store::{LeaseLoss, LossOutcome, ReplicaBeat, ReplicaRow, Store};
use shards::ShardMap;

/// What a replica's worker sessions offer, by name with fingerprint, and the sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offers {
    pub tools: BTreeMap<String, String>,
    pub agents: BTreeMap<String, String>,
    /// The registered sessions, as `workers list` shows them.
    #[serde(default)]
    pub workers: Vec<crate::scheduler::WorkerSnapshot>,
    /// The replica drains to stop: it hands its shards to the others and takes none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
}

/// Whether `row` renewed its leases within `ttl` of `now`.
fn alive(row: &ReplicaRow, now: Millis, ttl: Duration) -> bool {
    row.heartbeat_at >= now - ttl.as_millis() as Millis
}

/// A replica as `kernelctl replicas list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub row: ReplicaRow,
    pub alive: bool,
    pub shards: u32,
    pub worker_sessions: u32,
}

/// Every replica with a row, this one first (with its own figures when it has beaten no row
/// yet, as on SQLite, where `sessions` and `started_at` stand in), each with the shards it owns.
pub async fn statuses(
    store: &Store,
    ttl: Duration,
    this: ReplicaRow,
    sessions: u32,
) -> Result<Vec<ReplicaStatus>, KernelError> {
    let now = store.clock().now_millis();
    let mut rows = store.reads.replicas().await?;
    let shards = store.reads.shards().await?;
    let position = rows.iter().position(|row| row.id == this.id);
    let me = position.map_or(this, |at| rows.remove(at));
    let mut statuses = vec![ReplicaStatus {
        alive: true,
        shards: 0,
        worker_sessions: sessions,
        row: me,
    }];
    statuses.extend(rows.into_iter().map(|row| {
        let offers: Offers = serde_json::from_str(&row.offers).unwrap_or_default();
        ReplicaStatus {
            alive: alive(&row, now, ttl),
            shards: 0,
            worker_sessions: u32::try_from(offers.workers.len()).unwrap_or(u32::MAX),
            row,
        }
    }));
    for status in &mut statuses {
        let owned = shards
            .iter()
            .filter(|s| s.owner.as_deref() == Some(&status.row.id))
            .count();
        status.shards = u32::try_from(owned).unwrap_or(u32::MAX);
    }
    Ok(statuses)
}

/// What this replica's row says of it besides its beat.
struct Me {
    started_at: Millis,
    /// Where other replicas and clients reach it.
    address: String,
    /// It drains to stop.
    leaving: bool,
}

/// Renews this replica's row every heartbeat, tells the scheduler what the others offer, takes
/// over the leases of replicas that stopped renewing theirs, and moves shards. Once `draining`,
/// it beats at once saying it leaves, and hands its shards to the replicas that stay while it
/// still answers for them (the calls its workers run finish meanwhile; their results go to the
/// shards' new owners).
pub async fn heartbeat(
    store: Store,
    (scheduler, registry): (Scheduler, Registry),
    (address, owned, links): (String, ShardMap, link::Links),
    (draining, shutdown): (CancellationToken, CancellationToken),
) {
    let config = scheduler.config().clone();
    let mut me = Me {
        started_at: store.clock().now_millis(),
        address,
        leaving: false,
    };
    let mut tick = tokio::time::interval(config.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut guard = Guard::new(config.lease_ttl);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            _ = draining.cancelled(), if !me.leaving => {
                info!("leaving: handing this replica's shards to the others");
                me.leaving = true;
            }
        }
        // Taken before the rows are read, so a row read after a pause looks no older than it is.
        let now = store.clock().now_millis();
        match beat(&store, &scheduler, &me).await {
            Ok(rows) => {
                let may_judge = guard.landed(tokio::time::Instant::now());
                let replicas = judge(&store, (&scheduler, &registry), rows.clone(), (now, me.leaving));
                // The dead replicas' shards first: the loss of each lease they held is written
                // by the owner of its run's shard, which may be this replica once they moved.
                let living = (&replicas.alive, &replicas.leaving);
                if let Some(shards) = rebalance(&store, &owned, living, may_judge).await {
                    links.learn(&shards, &rows);
                }
                if may_judge {
                    for row in replicas.dead {
                        take_over(&store, row).await;
                    }
                    take_over_orphans(&store, now).await;
                }
            }
            Err(error) => {
                if guard.failed() {
                    warn!(%error, "cannot renew this replica's leases");
                }
            }
        }
    }
}

/// The replicas as one heartbeat judged them.
struct Judged {
    /// Alive at the beat (this one among them).
    alive: BTreeSet<String>,
    /// Alive and draining to stop (this one too, when it is).
    leaving: BTreeSet<String>,
    dead: Vec<ReplicaRow>,
}

/// Tells the scheduler and the registry what the live replicas offer; returns the replicas alive
/// at `now`, those leaving, and the dead. `leaving` says whether this replica is.
fn judge(
    store: &Store,
    (scheduler, registry): (&Scheduler, &Registry),
    rows: Vec<ReplicaRow>,
    (now, leaving): (Millis, bool),
) -> Judged {
    let ttl = scheduler.config().lease_ttl;
    let (live, dead): (Vec<ReplicaRow>, Vec<ReplicaRow>) = rows
        .into_iter()
        .filter(|row| row.id != store.replica())
        .partition(|row| alive(row, now, ttl));
    let offers: Vec<(String, Offers)> = live
        .iter()
        .map(|row| (row.id.clone(), serde_json::from_str(&row.offers).unwrap_or_default()))
        .collect();
    registry.offered_elsewhere(offers.iter().flat_map(|(_, o)| o.tools.keys().cloned()).collect());
    let me = store.replica().to_owned();
    let leaving = offers
        .iter()
        .filter(|(_, offers)| offers.leaving)
        .map(|(id, _)| id.clone())
        .chain(leaving.then(|| me.clone()))
        .collect();
    scheduler.remote_offers(offers);
    let alive = live.into_iter().map(|row| row.id).chain([me]).collect();
    Judged { alive, leaving, dead }
}

/// Takes the shards that should be this replica's and are free (or, when it may judge, whose
/// owner is dead), gives back those that should be another live replica's, and learns from the
/// table what it owns now: a shard whose epoch moved on without this replica giving it back was
/// taken while it was silent. The shards' rows as they stand after.
async fn rebalance(
    store: &Store,
    owned: &ShardMap,
    living: (&BTreeSet<String>, &BTreeSet<String>),
    may_judge: bool,
) -> Option<Vec<shards::ShardRow>> {
    let me = store.replica();
    let mut rows = match store.reads.shards().await {
        Ok(rows) => rows,
        Err(error) => {
            warn!(%error, "cannot read the shards");
            return None;
        }
    };
    let moves = shards::moves(&rows, me, living, may_judge);
    let released: BTreeSet<u32> = moves.hand.iter().map(|(id, ..)| *id).collect();
    if !moves.is_empty() {
        if let Err(error) = store.move_shards(moves, false).await {
            warn!(%error, "cannot move shards");
            return None;
        }
        rows = match store.reads.shards().await {
            Ok(rows) => rows,
            Err(error) => {
                warn!(%error, "cannot read the shards");
                return None;
            }
        };
    }
    let changed = owned.refresh(&rows, me);
    let taken_away: Vec<u32> = changed
        .lost
        .iter()
        .filter(|id| !released.contains(id))
        .copied()
        .collect();
    if !taken_away.is_empty() {
        warn!(
            shards = taken_away.len(),
            "lost shards while silent: another replica took them over"
        );
    }
    if !changed.gained.is_empty() || !released.is_empty() {
        info!(
            gained = changed.gained.len(),
            gave_back = released.len(),
            owned = owned.len(),
            "shards moved"
        );
    }
    crate::metrics::get().shards_owned.set(owned.len() as i64);
    Some(rows)
}

/// When this replica may judge the others. A row goes stale when its replica stopped, but also
/// when every replica's writes were held up together (the database restarted, a frozen replica
/// held a lock they waited for) or when this replica itself was frozen: after any of these all
/// rows look old at once. So no replica judges another before its own beats have landed, each
/// within half a TTL of the one before, for a whole TTL: time enough for every live replica to
/// beat again.
struct Guard {
    ttl: std::time::Duration,
    /// Since when this replica's beats have landed without a gap.
    steady_since: Option<tokio::time::Instant>,
    last_landed: Option<tokio::time::Instant>,
}

impl Guard {
    fn new(ttl: std::time::Duration) -> Guard {
        Guard {
            ttl,
            steady_since: None,
            last_landed: None,
        }
    }

    /// A beat landed at `at`; whether this replica may now judge the others.
    fn landed(&mut self, at: tokio::time::Instant) -> bool {
        let gap = self.last_landed.map(|last| at.saturating_duration_since(last));
        if gap.is_some_and(|gap| gap > self.ttl / 2) {
            self.steady_since = None;
        }
        self.last_landed = Some(at);
        let since = *self.steady_since.get_or_insert(at);
        at.saturating_duration_since(since) >= self.ttl
    }

    /// A beat failed; whether it is the first since they last landed.
    fn failed(&mut self) -> bool {
        self.last_landed = None;
        self.steady_since.take().is_some()
    }
}

/// One renewal, then every replica's row as it stands.
async fn beat(store: &Store, scheduler: &Scheduler, me: &Me) -> Result<Vec<ReplicaRow>, KernelError> {
    let offers = Offers {
        leaving: me.leaving,
        ..scheduler.offers().await?
    };
    store
        .beat(ReplicaBeat {
            started_at: me.started_at,
            offers: serde_json::to_string(&offers).expect("offers serialize"),
            address: me.address.clone(),
        })
        .await?;
    store.reads.replicas().await
}

/// Records the loss of every lease a dead replica held (what may run again is queued here by the
/// commits' effects; another replica hears of it through the commit's notice), then removes its
/// row if it has not beaten since. Losses come first: a row removed with leases still held would
/// leave them to no one. A replica that comes back meanwhile was silent for a TTL: its leases
/// were lost, and its workers' answers for them are refused.
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

/// Records the loss of the leases held by replicas that have no row: a replica that removed its
/// row left them (a start it asked another replica for committed after it looked), and no replica
/// would judge it dead.
async fn take_over_orphans(store: &Store, now: Millis) {
    let held = match store.reads.orphaned_leases(now).await {
        Ok(held) => held,
        Err(error) => {
            warn!(%error, "cannot read the leases of replicas that left");
            return;
        }
    };
    if held.is_empty() {
        return;
    }
    match lose(store, held, "its kernel replica left without handing it back").await {
        Ok((requeued, indeterminate)) => warn!(
            requeued = requeued.len(),
            indeterminate, "took over the leases of replicas that left without handing them back"
        ),
        Err(error) => warn!(%error, "cannot take over the leases of replicas that left"),
    }
}

/// Records the loss of every lease `replica` holds: the steps to run again, and how many became
/// indeterminate.
async fn lose_all(store: &Store, replica: String, reason: &str) -> Result<(Vec<StepRecord>, usize), KernelError> {
    let held = store.reads.held_by(replica).await?;
    lose(store, held, reason).await
}

/// Records the loss of the leases of `held`, each fenced by its dispatch and attempt.
async fn lose(store: &Store, held: Vec<StepRecord>, reason: &str) -> Result<(Vec<StepRecord>, usize), KernelError> {
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
    let handed = match lose_all(store, store.replica().to_owned(), "kernel replica shut down").await {
        Ok((requeued, indeterminate)) => {
            if !requeued.is_empty() || indeterminate > 0 {
                info!(
                    requeued = requeued.len(),
                    indeterminate, "handed back the calls this replica held"
                );
            }
            true
        }
        Err(error) => {
            warn!(%error, "cannot hand back this replica's calls; another replica takes them over after the TTL");
            false
        }
    };
    match store.move_shards(shards::Moves::default(), true).await {
        Ok(_) => {
            crate::metrics::get().shards_owned.set(0);
        }
        Err(error) => warn!(%error, "cannot give back this replica's shards; the others take them after the TTL"),
    }
    // A row removed with leases still held would leave them to no one but the orphans' sweep:
    // kept, it goes stale and the others take them over as a dead replica's.
    if handed && let Err(error) = store.forget_replica(store.replica().to_owned(), None).await {
        warn!(%error, "cannot remove this replica's row");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::Guard;

    #[test]
    fn a_replica_judges_others_only_after_a_whole_ttl_of_steady_beats() {
        let ttl = Duration::from_millis(1_000);
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut guard = Guard::new(ttl);
        assert!(!guard.landed(at(0)));
        assert!(!guard.landed(at(400)));
        assert!(!guard.landed(at(800)));
        assert!(guard.landed(at(1_200)));
        // Frozen, or held up by the database, for more than half a TTL: every row may look old.
        assert!(!guard.landed(at(4_000)));
        assert!(!guard.landed(at(4_400)));
        assert!(!guard.landed(at(4_800)));
        assert!(guard.landed(at(5_000)));
        // A failed beat starts the wait again too.
        assert!(guard.failed());
        assert!(!guard.failed());
        assert!(!guard.landed(at(5_200)));
        assert!(!guard.landed(at(5_600)));
        assert!(!guard.landed(at(6_000)));
        assert!(guard.landed(at(6_200)));
    }
}
