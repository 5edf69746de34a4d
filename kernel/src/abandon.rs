//! Abandoned runs: with `--abandon-runs-after-ms`, an external agent's run (one the kernel does
//! not host) pending or running that made no turn for that long fails as `abandoned`, its calls
//! in flight settled first (their workers told to stop), as a cancelled run's are. The rule is
//! the machine's ([`crate::machine::run::abandoned`]); this loop only asks the store for a batch
//! at a time and tells the scheduler what the store settled. A blocked run waits for a person and
//! is never abandoned; a hosted run's handler is the kernel's to redispatch.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::Store;

/// Runs ended per transaction, so other writes go on between batches.
const BATCH: usize = 100;
/// How often runs are looked at, at most: a limit shorter than four times this is checked four
/// times per limit, so no run outlives it by more than a quarter.
const EVERY: Duration = Duration::from_secs(30);

/// Fails the runs idle for `after` as abandoned, every so often, until shutdown (their steps are
/// cancelled on their workers by the commit's effects).
pub async fn abandon_idle_runs(store: Store, after: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(EVERY.min(after / 4).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        loop {
            let ended = match store.abandon_runs(after_ms, BATCH).await {
                Ok(ended) => ended,
                Err(error) => {
                    warn!(%error, "idle runs not abandoned");
                    break;
                }
            };
            let full = ended.len() >= BATCH;
            for (run, settled) in ended {
                info!(
                    run_id = %run.id,
                    agent = %run.agent,
                    cancelled_steps = settled.len(),
                    after_ms,
                    "run abandoned"
                );
            }
            if !full || shutdown.is_cancelled() {
                break;
            }
        }
    }
}
