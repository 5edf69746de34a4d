//! The machine's floors, measured in the same sitting as the kernel's figures: what a durable
//! call's round trip is built from, and what no kernel on this machine goes below. A sequential
//! `safe_to_retry` call waits for one sync of the log, crosses loopback four times (the turn to
//! the kernel, the call to its worker, the result back, the turn's result to the agent), and
//! wakes a sleeping thread at each hand-off between the kernel's threads and the processes'.
//!
//! Measured by this process on its own machine: beside a kernel on another machine the figures
//! say nothing of it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use super::stats::Latency;

/// What one append to the log is: a page.
const APPEND: usize = 4096;
/// What one message over loopback is: about a small turn's frame.
const MESSAGE: usize = 64;

/// The floors, each over the same number of samples.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// Where the sync was measured: it should be the kernel's disk.
    pub dir: String,
    pub samples: u32,
    /// A 4 KiB append to a file, then `fdatasync` (what a commit that must be durable waits for).
    pub sync: Latency,
    /// A thread asleep on a channel is sent a message and answers on another, on which the first
    /// slept meanwhile: two wakes of a sleeping thread.
    pub wake_round_trip: Latency,
    /// 64 bytes over loopback TCP (Nagle off) and back.
    pub tcp_round_trip: Latency,
}

/// Measures each floor `samples` times, the sync in a file made (and removed) in `dir`.
pub async fn measure(dir: PathBuf, samples: u32) -> Result<Floor, BenchError> {
    tokio::task::spawn_blocking(move || measure_blocking(&dir, samples))
        .await
        .map_err(|e| BenchError::Setup(format!("the floor measurement panicked: {e}")))?
}

fn measure_blocking(dir: &Path, samples: u32) -> Result<Floor, BenchError> {
    let n = samples as usize;
    let summary = |mut taken: Vec<Duration>| Latency::of(&mut taken).expect("at least one sample");
    Ok(Floor {
        dir: dir.display().to_string(),
        samples,
        sync: summary(syncs(dir, n)?),
        wake_round_trip: summary(wakes(n)),
        tcp_round_trip: summary(round_trips(n)?),
    })
}

/// `n` appends of a page to a new file in `dir`, each synced.
fn syncs(dir: &Path, n: usize) -> Result<Vec<Duration>, BenchError> {
    let path = dir.join(format!(".kernelctl-bench-floor-{}", std::process::id()));
    let cannot = |what: &str, e: std::io::Error| {
        BenchError::Setup(format!(
            "cannot {what} {} to measure the disk's sync: {e} (choose a writable directory on the kernel's disk with --floor-dir)",
            path.display()
        ))
    };
    let mut file = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| cannot("create", e))?;
    let page = [0x5a_u8; APPEND];
    let mut taken = Vec::with_capacity(n);
    let written = (0..n).try_for_each(|_| {
        let began = Instant::now();
        file.write_all(&page)?;
        file.sync_data()?;
        taken.push(began.elapsed());
        Ok(())
    });
    drop(file);
    let removed = std::fs::remove_file(&path);
    written.map_err(|e| cannot("append to", e))?;
    removed.map_err(|e| cannot("remove", e))?;
    Ok(taken)
}

/// `n` round trips to a thread that sleeps on a channel between them.
fn wakes(n: usize) -> Vec<Duration> {
    let (ask, asked) = mpsc::channel::<()>();
    let (answer, answered) = mpsc::channel::<()>();
    let echo = std::thread::spawn(move || {
        while asked.recv().is_ok() {
            if answer.send(()).is_err() {
                break;
            }
        }
    });
    let mut taken = Vec::with_capacity(n);
    for _ in 0..n {
        let began = Instant::now();
        if ask.send(()).is_err() || answered.recv().is_err() {
            break;
        }
        taken.push(began.elapsed());
    }
    drop(ask);
    let _ = echo.join();
    taken
}

/// `n` round trips of a small message to an echoing thread over loopback TCP.
fn round_trips(n: usize) -> Result<Vec<Duration>, BenchError> {
    let setup = |e: std::io::Error| BenchError::Setup(format!("cannot measure a loopback round trip: {e}"));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(setup)?;
    let addr = listener.local_addr().map_err(setup)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut message = [0_u8; MESSAGE];
        while stream.read_exact(&mut message).is_ok() {
            stream.write_all(&message)?;
        }
        Ok(())
    });
    let mut stream = TcpStream::connect(addr).map_err(setup)?;
    stream.set_nodelay(true).map_err(setup)?;
    let mut message = [0x5a_u8; MESSAGE];
    let mut taken = Vec::with_capacity(n);
    for _ in 0..n {
        let began = Instant::now();
        stream.write_all(&message).map_err(setup)?;
        stream.read_exact(&mut message).map_err(setup)?;
        taken.push(began.elapsed());
    }
    drop(stream);
    let _ = echo.join();
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_floor_is_measured_and_the_file_is_removed() {
        let dir = std::env::temp_dir().join(format!("kernelctl-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let floor = measure(dir.clone(), 5).await.unwrap();
        assert_eq!(floor.samples, 5);
        for latency in [&floor.sync, &floor.wake_round_trip, &floor.tcp_round_trip] {
            assert!(latency.p50_ms > 0.0 && latency.p50_ms <= latency.max_ms, "{latency:?}");
        }
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "the sync's file is removed"
        );
        std::fs::remove_dir(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_directory_that_cannot_be_written_names_the_flag() {
        let missing = std::env::temp_dir().join(format!("kernelctl-floor-missing-{}", std::process::id()));
        let error = measure(missing, 3).await.unwrap_err().to_string();
        assert!(error.contains("--floor-dir"), "{error}");
        assert!(error.contains("cannot create"), "{error}");
    }
}
