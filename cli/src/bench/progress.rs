//! Progress on stderr while the benchmark runs: on a terminal one live line redrawn with `\r`
//! every tenth of a second, elsewhere (CI logs, pipes) one line when each phase starts and ends.
//!
//! The hot loops only bump an atomic counter; a single ticker task does all the drawing.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use worker_sdk::CancellationToken;

const REDRAW: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
struct Phase {
    label: String,
    total: u64,
    started: Option<Instant>,
}

#[derive(Debug)]
struct Shared {
    live: bool,
    done: AtomicU64,
    phase: Mutex<Phase>,
}

/// A cheap handle on the progress line; clones share it.
#[derive(Debug, Clone)]
pub struct Progress {
    shared: Arc<Shared>,
}

/// Stops the live line's ticker when dropped.
pub struct Ticker {
    stop: CancellationToken,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Progress {
    /// A live line when stderr is a terminal, a line per phase otherwise.
    pub fn new() -> Progress {
        Progress::with_live(std::io::stderr().is_terminal())
    }

    fn with_live(live: bool) -> Progress {
        Progress {
            shared: Arc::new(Shared {
                live,
                done: AtomicU64::new(0),
                phase: Mutex::new(Phase::default()),
            }),
        }
    }

    /// Starts redrawing the live line (a no-op off a terminal) until the ticker is dropped.
    pub fn start_ticker(&self) -> Ticker {
        let stop = CancellationToken::new();
        if self.shared.live {
            let progress = self.clone();
            let token = stop.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(REDRAW);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = ticks.tick() => progress.draw(),
                    }
                }
            });
        }
        Ticker { stop }
    }

    /// A new phase of `total` units (calls, usually); 0 for a phase that lasts a set time.
    pub fn phase(&self, label: impl Into<String>, total: u64) {
        let label = label.into();
        self.shared.done.store(0, Ordering::Relaxed);
        let mut phase = self.shared.phase.lock().expect("progress lock");
        if !self.shared.live {
            match total {
                0 => eprintln!("bench: {label}"),
                total => eprintln!("bench: {label}: {total} calls"),
            }
        }
        *phase = Phase {
            label,
            total,
            started: Some(Instant::now()),
        };
    }

    /// `n` more units done.
    pub fn add(&self, n: u64) {
        self.shared.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Ends the phase with a one-line summary that stays on screen; the live line stays blank
    /// until the next phase.
    pub fn finish(&self, summary: &str) {
        let mut phase = self.shared.phase.lock().expect("progress lock");
        let elapsed = phase.started.take().map(|s| s.elapsed()).unwrap_or_default();
        let line = format!("bench: {}: {summary} ({:.1}s)", phase.label, elapsed.as_secs_f64());
        if self.shared.live {
            eprint!("\r\x1b[2K{line}\n");
        } else {
            eprintln!("{line}");
        }
    }

    /// A note between phases (setup, teardown).
    pub fn note(&self, text: &str) {
        if self.shared.live {
            eprint!("\r\x1b[2Kbench: {text}\n");
        } else {
            eprintln!("bench: {text}");
        }
    }

    fn line(&self) -> Option<String> {
        let phase = self.shared.phase.lock().expect("progress lock");
        let started = phase.started?;
        let done = self.shared.done.load(Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let of = match phase.total {
            0 => String::new(),
            total => format!("/{total}"),
        };
        Some(format!(
            "bench: {}: {done}{of} calls, {rate:.0}/s, {secs:.1}s",
            phase.label
        ))
    }

    fn draw(&self) {
        if let Some(line) = self.line() {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K{line}");
            let _ = stderr.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_calls_of_the_current_phase() {
        let progress = Progress::with_live(false);
        assert_eq!(progress.line(), None);
        progress.phase("sequential", 10);
        progress.add(3);
        progress.add(1);
        let line = progress.line().unwrap();
        assert!(line.starts_with("bench: sequential: 4/10 calls, "), "{line}");
        progress.finish("done");
        assert_eq!(progress.line(), None, "nothing to redraw between phases");
        progress.phase("replay", 5);
        assert!(progress.line().unwrap().starts_with("bench: replay: 0/5 calls"));
    }
}
