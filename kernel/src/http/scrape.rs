//! `/metrics`: the Prometheus text of [`crate::metrics`], with its gauges set from the store and
//! the scheduler at the scrape.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Http;
use super::session;
use crate::metrics::StatusLabels;
use crate::model::RunStatus;
use crate::store::StoreGauges;

/// Scrapers a second apart (or several scrapers) share one count of the store.
const STORE_GAUGES_FRESH: Duration = Duration::from_secs(1);

/// The store's last count and when it was taken.
#[derive(Default)]
pub struct Cache(Mutex<Option<(Instant, StoreGauges)>>);

impl Cache {
    fn fresh(&self) -> Option<StoreGauges> {
        let held = self.0.lock().expect("scrape cache poisoned");
        held.as_ref()
            .filter(|(at, _)| at.elapsed() < STORE_GAUGES_FRESH)
            .map(|(_, gauges)| gauges.clone())
    }

    fn keep(&self, gauges: StoreGauges) {
        *self.0.lock().expect("scrape cache poisoned") = Some((Instant::now(), gauges));
    }
}

/// Needs `runs:read` when the kernel has keys, sent as `authorization: Bearer <secret>`.
pub async fn metrics(State(http): State<Http>, headers: HeaderMap) -> Response {
    if let Err(refusal) = session::authorize(&http, &headers, session::READ) {
        return refusal.plain();
    }
    match set_gauges(&http).await {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            crate::metrics::get().encode(),
        )
            .into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, format!("metrics: {error}\n")).into_response(),
    }
}

async fn set_gauges(http: &Http) -> Result<(), crate::KernelError> {
    let metrics = crate::metrics::get();
    let scheduler = http.kernel.scheduler.gauges().await?;
    metrics.queued.set(scheduler.queued as i64);
    metrics.leased.set(scheduler.leased as i64);
    metrics.sessions.set(scheduler.sessions as i64);
    let store = match http.scrape.fresh() {
        Some(gauges) => gauges,
        None => {
            let gauges = http.kernel.store.reads.gauges().await?;
            http.scrape.keep(gauges.clone());
            gauges
        }
    };
    // Every status is written, so one whose last run went away reads 0 rather than its last count.
    for &status in RunStatus::ALL {
        let count = store
            .runs
            .iter()
            .find(|(text, _)| text == status.as_str())
            .map_or(0, |(_, count)| *count);
        metrics
            .runs
            .get_or_create(&StatusLabels {
                status: status.as_str().to_owned(),
            })
            .set(count);
    }
    metrics.approvals_waiting.set(store.approvals_waiting);
    Ok(())
}
