//! Retention: finished runs are deleted on request (`AdminService.DeleteRun`, `PruneRuns`) or,
//! with `--retain-finished`, once they are older than the retention, so the log does not grow for
//! ever. A prune goes a batch of runs per transaction, so other writes go on between batches.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::KernelError;
use crate::model::Millis;
use crate::store::{Deleted, Store};

/// Runs deleted per transaction.
const BATCH: usize = 100;
/// How often `--retain-finished` looks for runs past the retention, at most; a retention shorter
/// than twice this is checked twice per retention, so no run outlives it by more than half.
const EVERY: Duration = Duration::from_secs(60);

/// Deletes every run that finished at least `min_age_ms` ago.
pub async fn prune(store: &Store, min_age_ms: u64) -> Result<Deleted, KernelError> {
    let before = store
        .clock()
        .now_millis()
        .saturating_sub(Millis::try_from(min_age_ms).unwrap_or(Millis::MAX));
    let mut deleted = Deleted::default();
    loop {
        let batch = store.prune_runs(before, BATCH).await?;
        deleted.add(batch);
        if batch.runs < BATCH as u64 {
            return Ok(deleted);
        }
    }
}

/// Deletes finished runs older than `retain` at start and then every minute (more often for a
/// retention under two minutes), until shutdown.
pub async fn retain_finished(store: Store, retain: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(EVERY.min(retain / 2).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retain_ms = u64::try_from(retain.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match prune(&store, retain_ms).await {
            Ok(deleted) if deleted.runs > 0 => info!(
                runs = deleted.runs,
                events = deleted.events,
                retain_ms,
                "finished runs past the retention deleted"
            ),
            Ok(_) => {}
            Err(error) => warn!(%error, "finished runs not pruned"),
        }
    }
}
