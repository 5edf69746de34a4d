//! `--console URL`: the replay section's long run read from the web console, its pages timed as a
//! browser fetches them (the kernel's time to read the run and render the page, and the transfer
//! over loopback; not the browser's own layout).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use super::progress::Progress;
use super::stats::Latency;

/// Steps on one page of a run's timeline in the console.
const STEP_PAGE: u64 = 200;

/// One page of the run, fetched `rounds` times.
#[derive(Debug, Clone, Serialize)]
pub struct ConsolePage {
    /// What was fetched: `first page`, `middle page`, `last page`, `live part`.
    pub page: String,
    pub path: String,
    pub bytes: u64,
    #[serde(flatten)]
    pub latency: Latency,
}

/// The console's pages of a run of `steps` steps.
#[derive(Debug, Clone, Serialize)]
pub struct Console {
    pub url: String,
    pub run_id: String,
    pub steps: u64,
    pub rounds: u32,
    pub pages: Vec<ConsolePage>,
}

/// Fetches each page of `run_id` once to warm up, then `rounds` times, the pages taking turns so
/// that a slow moment of the machine falls on all of them alike.
pub async fn read(
    progress: &Progress,
    (url, api_key): (&str, Option<&str>),
    (run_id, steps): (&str, u64),
    rounds: u32,
) -> Result<Console, BenchError> {
    let url = url.trim_end_matches('/');
    let pages = steps.div_ceil(STEP_PAGE).max(1);
    let wanted = [
        ("first page", format!("/runs/{run_id}?page=1")),
        ("middle page", format!("/runs/{run_id}?page={}", pages.div_ceil(2))),
        ("last page", format!("/runs/{run_id}?page={pages}")),
        ("live part", format!("/runs/{run_id}/live?page=1")),
    ];
    // The build's reqwest brings no TLS crypto provider of its own (the tree's rustls uses
    // ring); one installed before is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| BenchError::Setup(format!("console client: {e}")))?;
    progress.phase(
        format!("console, {} pages of a {steps}-step run", wanted.len()),
        u64::from(rounds) * wanted.len() as u64,
    );
    let mut bytes = Vec::with_capacity(wanted.len());
    for (_, path) in &wanted {
        bytes.push(fetch(&client, url, path, api_key).await?.1);
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds as usize); wanted.len()];
    for _ in 0..rounds {
        for ((_, path), taken) in wanted.iter().zip(samples.iter_mut()) {
            taken.push(fetch(&client, url, path, api_key).await?.0);
            progress.add(1);
        }
    }
    let pages: Vec<ConsolePage> = (wanted.into_iter().zip(samples).zip(bytes))
        .map(|(((page, path), mut taken), bytes)| ConsolePage {
            page: page.to_owned(),
            path,
            bytes,
            latency: Latency::of(&mut taken).expect("at least one round"),
        })
        .collect();
    let first = pages[0].latency.p50_ms;
    progress.finish(&format!("first page p50 {first:.1}ms"));
    Ok(Console {
        url: url.to_owned(),
        run_id: run_id.to_owned(),
        steps,
        rounds,
        pages,
    })
}

/// One GET of `path`, whole: how long it took and how many bytes came.
async fn fetch(
    client: &reqwest::Client,
    url: &str,
    path: &str,
    api_key: Option<&str>,
) -> Result<(Duration, u64), BenchError> {
    let failed = |why: String| BenchError::Unexpected(format!("console {url}{path}: {why}"));
    let started = Instant::now();
    let mut request = client.get(format!("{url}{path}"));
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
    if !status.is_success() {
        return Err(failed(format!("answered {status}")));
    }
    Ok((started.elapsed(), body.len() as u64))
}
